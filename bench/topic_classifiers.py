"""Benchmark: every topic-classifier candidate trained on the same GCIDE split, scored on its held-out part.

    python bench/topic_classifiers.py [--per-topic 20] [--skip-minilm] [--pages 200]

The split is bench/annotate.py's: GCIDE dictionary senses labelled by their subject ("(Zool.)",
"(Law)", ...; tests/classify_realtext.py ``gcide_topics``, labels removed from the text),
``5 × --per-topic`` per topic; every 5th sense of each topic is held out, the classifiers train on
the rest (``train.heldout=0``: any choice of settings happens on a validation part of the training
senses). Per candidate: held-out accuracy and macro-F1, training seconds (encoder load included),
and inference docs/s of ``predict_proba`` on the held-out senses and on ``--pages`` longer real
pages (Python documentation chunks, 300-1500 characters). ``fastText + embed`` averages the two
models' probabilities (no training of its own). Writes the ``topic_classifiers`` section of
docs/benchmarks.md and prints the table for docs/classifiers.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _report import table, write_section  # noqa: E402
from classify_realtext import GCIDE_TOPICS, gcide_topics, python_docs  # noqa: E402

from cptkit.labels.classifiers import train_classifier  # noqa: E402
from cptkit.labels.config import EmbedParams, TrainParams  # noqa: E402
from cptkit.labels.metrics import evaluate, majority_macro_f1  # noqa: E402

TOPICS = list(GCIDE_TOPICS)


def gcide_split(per_topic: int) -> tuple[list[dict], list[dict]]:
    """(training senses, held-out senses): ``5 × per_topic`` per topic, every 5th held out."""
    by: dict[str, list[dict]] = {}
    for r in gcide_topics(5 * per_topic):
        by.setdefault(r["topic"], []).append({**r, "lang": "en"})
    train = [r for t in TOPICS for i, r in enumerate(by[t]) if i % 5 != 0]
    heldout = [r for t in TOPICS for i, r in enumerate(by[t]) if i % 5 == 0]
    return train, heldout


def docs_per_s(clf, texts: list[str]) -> float:
    t0 = time.perf_counter()
    clf.predict_proba(texts)
    return len(texts) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-topic", type=int, default=20, help="held-out senses per topic (4× as many train)")
    ap.add_argument("--skip-minilm", action="store_true", help="skip the fine-tuned encoder (minutes on 2 cores)")
    ap.add_argument("--pages", type=int, default=200, help="longer real pages timed for inference docs/s")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    tr, ev = gcide_split(args.per_topic)
    pages = [r["text"] for r in python_docs(args.pages)]
    gold = [r["topic"] for r in ev]
    support = np.array([gold.count(t) for t in TOPICS], dtype=float)
    rows: list[list] = [["majority class", f"{support.max() / len(gold):.3f}", f"{majority_macro_f1(support):.3f}",
                         "", "", ""]]
    probs: dict[str, np.ndarray] = {}
    candidates = [
        ("fastText, `train.tune.mode=grid` (16 candidates)", TrainParams(heldout=0.0)),
        ("`embed`, embedding only (`train.embed.ngram_weight=0`)", TrainParams(backend="embed", heldout=0.0,
                                                                                 embed=EmbedParams(ngram_weight=0.0))),
        ("`embed` (embedding ⊕ word 1-2-gram TF-IDF)", TrainParams(backend="embed", heldout=0.0)),
    ]
    if not args.skip_minilm:
        candidates.append(("`minilm` fine-tuned (3 epochs, lr 5e-5, 128 tokens)", TrainParams(backend="minilm", heldout=0.0)))
    labels: list[str] = []
    for name, p in candidates:
        t0 = time.perf_counter()
        res = train_classifier([r["id"] for r in tr], [r["text"] for r in tr], [r["topic"] for r in tr], p, 0)
        secs = time.perf_counter() - t0
        clf, labels = res.classifier, res.classifier.labels
        t0 = time.perf_counter()
        probs[name] = clf.predict_proba([r["text"] for r in ev])
        rate = len(ev) / (time.perf_counter() - t0)
        m = evaluate(gold, [labels[j] for j in probs[name].argmax(axis=1)], labels)
        rows.append([name, f"{m['accuracy']:.3f}", f"{m['macro_f1']:.3f}", f"{secs:.0f}", f"{rate:,.0f}",
                     f"{docs_per_s(clf, pages):,.0f}"])
        print(rows[-1], flush=True)
    ft, emb = candidates[0][0], candidates[2][0]
    avg = (probs[ft] + probs[emb]) / 2
    m = evaluate(gold, [labels[j] for j in avg.argmax(axis=1)], labels)
    rows.append(["fastText + `embed`, probabilities averaged", f"{m['accuracy']:.3f}", f"{m['macro_f1']:.3f}",
                 "(both)", "(both)", "(both)"])
    print(rows[-1], flush=True)
    body = (f"GCIDE topic senses, {len(TOPICS)} topics: {len(tr)} for training, {len(ev)} held out "
            f"({args.per_topic} per topic). Inference: `predict_proba` on the held-out senses (~190 characters) and "
            f"on {len(pages)} Python-documentation pages (300-1500 characters), {args.threads} torch threads.\n\n"
            + table(["classifier", "held-out accuracy", "macro-F1", "train s", "docs/s (senses)", "docs/s (pages)"],
                    rows))
    print(body)
    write_section("topic_classifiers", "Topic classifiers on one GCIDE split",
                  f"python bench/topic_classifiers.py --per-topic {args.per_topic} --pages {args.pages}"
                  + (" --skip-minilm" if args.skip_minilm else ""), body)


if __name__ == "__main__":
    main()
