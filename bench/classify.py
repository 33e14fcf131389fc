"""Benchmark: documents/s of the score-quality / label-topics classifiers and of corrupt.

    python bench/classify.py [--docs 20000] [--bert-docs 512] [--corrupt-docs 300]

* fastText scoring (cptkit's tokenisation + ``predict(k=-1)`` on lists), one process, vs the
  peer baseline: the ``fasttext`` package called one document at a time on raw text.
* MiniLM (BERT backbone) scoring with torch on 2 threads, batch 32, 128 tokens.
* Language ID (lid.176) and corruption (spaCy tagger + WordNet) on real English text.
Texts: python3.11-doc sections (tests/classify_realtext.py). Writes its section of
docs/benchmarks.md through bench/_report.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _report import table, write_section  # noqa: E402
from classify_realtext import fortunes_en, python_docs  # noqa: E402

from cptkit.classify import TrainParams, load_classifier, save_classifier, train_classifier  # noqa: E402


def rate(fn, n: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return n / best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--bert-docs", type=int, default=512)
    ap.add_argument("--corrupt-docs", type=int, default=300)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(2)
    pos, neg = python_docs(1000), fortunes_en(1000)
    recs = pos + neg
    ids, texts = [r["id"] for r in recs], [r["text"] for r in recs]
    labels = ["hq"] * len(pos) + ["lq"] * len(neg)
    docs = (texts * (args.docs // len(texts) + 1))[:args.docs]
    mean_chars = sum(map(len, docs)) / len(docs)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        res = train_classifier(ids, texts, labels, TrainParams(), seed=0)
        save_classifier(res, Path(tmp) / "ft", TrainParams(), 0)
        clf = load_classifier(Path(tmp) / "ft")
        batch = 512
        ft = rate(lambda: [clf.predict_proba(docs[i:i + batch]) for i in range(0, len(docs), batch)], len(docs))
        model = clf.model  # the raw fasttext model: the peer way, one raw document at a time
        raw = [d.replace("\n", " ") for d in docs]
        peer = rate(lambda: [model.predict(d, k=-1) for d in raw], len(docs))
        rows.append(["fastText quality (cptkit, batches of 512)", len(docs), f"{ft:,.0f}", f"{ft / peer:.2f}x vs peer"])
        rows.append(["fastText predict(doc) one at a time, raw text (peer)", len(docs), f"{peer:,.0f}", "1.00x"])

        from cptkit.text.langid import detect

        lid = rate(lambda: detect(docs), len(docs))
        rows.append(["language ID (lid.176, batched)", len(docs), f"{lid:,.0f}", ""])

        bp = TrainParams(backend="minilm", heldout=0.2)
        bp.minilm.epochs = 1
        bp.minilm.max_length = 128
        sub = list(range(0, len(ids), 10))
        bres = train_classifier([ids[i] for i in sub], [texts[i] for i in sub], [labels[i] for i in sub], bp, seed=0)
        bdocs = docs[:args.bert_docs]
        bert = rate(lambda: bres.classifier.predict_proba(bdocs), len(bdocs), repeat=1)
        rows.append(["MiniLM-L6 (BERT) quality, 2 threads, batch 32, 128 tokens", len(bdocs), f"{bert:,.1f}",
                     f"fastText is {ft / bert:,.0f}x faster"])

    from omegaconf import OmegaConf

    from cptkit.steps.corrupt import CorruptConfig, Corrupter

    cdocs = [{"id": r["id"], "text": r["text"], "lang": "en"} for r in python_docs(args.corrupt_docs)]
    cor = Corrupter(OmegaConf.structured(CorruptConfig(ratio=0.3)))
    from collections import Counter

    cor.corrupt_batch(cdocs[:8], Counter())  # load spaCy + WordNet outside the timing
    stats: Counter = Counter()
    cr = rate(lambda: list(cor.map(iter(cdocs), stats)), len(cdocs), repeat=1)
    realised = stats["changed"] / max(stats["candidates"], 1)
    rows.append([f"corrupt ratio 0.3 (spaCy sm + WordNet; realised {realised:.3f})", len(cdocs), f"{cr:,.1f}", ""])

    body = (f"Documents: python3.11-doc sections and fortunes, mean {mean_chars:,.0f} characters. "
            "One process; torch limited to 2 threads. Peer: the same fastText model called "
            "per document on raw text (the usual `model.predict(text)` loop).\n\n"
            + table(["what", "docs", "docs/s", "ratio"], rows))
    print(body)
    write_section("classify", "Classifiers (score-quality, label-topics) and corrupt throughput",
                  "python bench/classify.py", body)


if __name__ == "__main__":
    main()
