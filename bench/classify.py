"""Benchmark: documents/s of the score-quality / label-topics classifiers and of corrupt.

    python bench/classify.py [--docs 20000] [--bert-docs 512] [--corrupt-docs 300]
    python bench/classify.py --e2e-only [--e2e-docs 20000] [--repeats 3]

* End to end (section ``classify_e2e``): ``score-quality`` and ``label-topics`` over JSONL.gz
  shards of the demo corpus (read, score, write), against the ten-line loop a user would write
  (``gzip.open`` + ``json`` + ``model.predict(text)`` per document + write), same model and
  documents, interleaved repeats (best of each); plus where cptkit's time goes.

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

from cptkit.labels.classifiers import load_classifier, save_classifier, train_classifier  # noqa: E402
from cptkit.labels.config import TrainParams  # noqa: E402


def rate(fn, n: int, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return n / best


BASELINE = """
import gzip, json, sys, fasttext
model = fasttext.load_model(sys.argv[1])
for src, dst in zip(sys.argv[2::2], sys.argv[3::2]):
    with gzip.open(src, "rt") as f, gzip.open(dst, "wt") as out:
        for line in f:
            rec = json.loads(line)
            labels, probs = model.predict(rec["text"].replace("\\n", " "), k=-1)
            rec["score"] = dict(zip(labels, probs.tolist()))
            out.write(json.dumps(rec, ensure_ascii=False) + "\\n")
"""


def baseline_loop(model_bin: str, pairs: list[tuple[Path, Path]]) -> None:
    """The user's ten lines (BASELINE), run in this process."""
    import gzip
    import json

    import fasttext

    model = fasttext.load_model(model_bin)
    for src, dst in pairs:
        with gzip.open(src, "rt") as f, gzip.open(dst, "wt") as out:
            for line in f:
                rec = json.loads(line)
                labels, probs = model.predict(rec["text"].replace("\n", " "), k=-1)
                rec["score"] = dict(zip(labels, probs.tolist(), strict=True))
                out.write(json.dumps(rec, ensure_ascii=False) + "\n")


def end_to_end(n_docs: int, repeats: int) -> str:
    """score-quality / label-topics end to end vs the baseline loop; returns the section body."""
    import gzip
    import json
    import shutil

    from cptkit.core.config import compose_step
    from cptkit.labels.backends.fasttext import fasttext_line
    from cptkit.labels.topics import load_taxonomy
    from cptkit.steps import label_topics, score_quality

    corpus = Path("/work/data/corpus")
    shards = sorted(corpus.glob("part-0000[0-2]-*.jsonl.gz"))  # English: Python docs, Maxima docs, GCIDE
    recs: list[dict] = []
    for k, sh in enumerate(shards):  # a third from each source, the last (GCIDE, 75k entries) fills up
        quota = n_docs // len(shards) + 1 if k < len(shards) - 1 else n_docs - len(recs)
        with gzip.open(sh, "rt") as f:
            recs += [json.loads(x) for _, x in zip(range(quota), f, strict=False)]
    recs = recs[:n_docs]
    rows, body = [], []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        inp = d / "in"
        inp.mkdir()
        half = len(recs) // 2
        for i, part in enumerate((recs[:half], recs[half:])):
            with gzip.open(inp / f"part-{i:05d}.jsonl.gz", "wt") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
        # models: quality = Python/Maxima docs vs dictionary entries; topics = 3 topics by source
        tp = TrainParams()
        tp.tune.mode = "off"
        ids, texts = [r["id"] for r in recs[::10]], [r["text"] for r in recs[::10]]
        qlab = ["lq" if r["url"].startswith("gcide") else "hq" for r in recs[::10]]
        save_classifier(train_classifier(ids, texts, qlab, tp, 0), d / "quality", tp, 0, extra={"positive": "hq"})
        tax = load_taxonomy(Path(__file__).resolve().parent.parent / "conf" / "topics" / "en.yaml")
        src_topic = {"docs.python.org": tax.topics[1], "maxima.sourceforge.io": tax.topics[0]}
        tlab = [next((t for k, t in src_topic.items() if k in r["url"]), "Others") for r in recs[::10]]
        save_classifier(train_classifier(ids, texts, tlab, tp, 0), d / "topics" / "en", tp, 0)
        files = sorted(inp.glob("*.jsonl.gz"))
        runs = {
            "cptkit score-quality": lambda o: score_quality.run(compose_step("score-quality", [
                f"io.inputs=[{inp}]", f"io.output={o}", f"quality.model={d / 'quality'}", "quiet=true"])),
            "cptkit label-topics": lambda o: label_topics.run(compose_step("label-topics", [
                f"io.inputs=[{inp}]", f"io.output={o}", f"topics.model={d / 'topics'}", "topics.languages=[en]",
                "quiet=true"])),
            "baseline: gzip+json loop, model.predict(text) per doc (quality model)": lambda o: baseline_loop(
                str(d / "quality" / "model.bin"), [(f, Path(str(o) + f.name)) for f in files]),
            "baseline: same loop, topic model": lambda o: baseline_loop(
                str(d / "topics" / "en" / "model.bin"), [(f, Path(str(o) + f.name)) for f in files]),
        }
        best = {k: float("inf") for k in runs}
        for r in range(repeats):  # interleaved: each repeat runs every contender once
            for k, fn in runs.items():
                out = d / f"out{r}"
                t = time.perf_counter()
                fn(out)
                best[k] = min(best[k], time.perf_counter() - t)
                shutil.rmtree(out, ignore_errors=True)
                for f in d.glob(f"out{r}part-*"):
                    f.unlink()
        base_q, base_t = best[list(runs)[2]], best[list(runs)[3]]
        for k, secs in best.items():
            ref = base_t if "topic" in k else base_q
            rows.append([k, len(recs), f"{len(recs) / secs:,.0f}", f"{ref / secs:.2f}x"])
        # where cptkit's time goes, on the same documents
        import fasttext

        m = fasttext.load_model(str(d / "quality" / "model.bin"))
        lines_in = [json.dumps(r, ensure_ascii=False) for r in recs]
        parts = {}
        t = time.perf_counter()
        docs = [json.loads(x) for x in lines_in]
        parts["json.loads"] = time.perf_counter() - t
        t = time.perf_counter()
        lines = [fasttext_line(r["text"]) for r in docs]
        parts["tokenise (fasttext_line)"] = time.perf_counter() - t
        t = time.perf_counter()
        m.predict(lines, k=-1)
        parts["predict(list of lines, k=-1)"] = time.perf_counter() - t
        t = time.perf_counter()
        for ln in lines:
            m.predict(ln, k=-1)
        parts["predict(line) one at a time"] = time.perf_counter() - t
        t = time.perf_counter()
        raw = [r["text"].replace("\n", " ") for r in docs]
        for x in raw:
            m.predict(x, k=-1)
        parts["predict(raw text) one at a time (the baseline's)"] = time.perf_counter() - t
        t = time.perf_counter()
        enc = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in docs).encode()
        parts["json.dumps"] = time.perf_counter() - t
        t = time.perf_counter()
        gzip.compress(enc, compresslevel=6)
        parts["gzip level 6 (cptkit's writer)"] = time.perf_counter() - t
        t = time.perf_counter()
        gzip.compress(enc)
        parts["gzip level 9 (gzip.open's default, the baseline's)"] = time.perf_counter() - t
        # the fixed cost of a run: the same commands on a one-document input
        one = d / "one"
        one.mkdir()
        with gzip.open(one / "part-00000.jsonl.gz", "wt") as f:
            f.write(json.dumps(recs[0], ensure_ascii=False) + "\n")
        for name, fn in (("cptkit score-quality on 1 document (Hydra compose, model load, lock, markers, manifest)",
                          lambda o: score_quality.run(compose_step("score-quality", [
                              f"io.inputs=[{one}]", f"io.output={o}", f"quality.model={d / 'quality'}",
                              "quiet=true"]))),
                         ("baseline loop on 1 document (model load)", lambda o: baseline_loop(
                             str(d / "quality" / "model.bin"), [(one / "part-00000.jsonl.gz", Path(str(o) + ".gz"))]))):
            secs = []
            for r in range(3):
                o = d / f"one-out{r}"
                t = time.perf_counter()
                fn(o)
                secs.append(time.perf_counter() - t)
            parts[name] = min(secs)
    body.append(f"{len(recs):,} documents of the demo corpus (Python docs, Maxima docs, GCIDE entries; mean "
                f"{sum(len(r['text']) for r in recs) / len(recs):,.0f} characters) in 2 JSONL.gz shards; best of "
                f"{repeats} interleaved repeats; one process. The baseline is this loop (BASELINE in "
                "bench/classify.py):\n\n```python" + BASELINE.replace("\\\\n", "\\n") + "```\n")
    body.append(table(["what", "docs", "docs/s", "vs baseline"], rows))
    body.append("\ncptkit's shard writer hands 256 KiB chunks to a background thread that compresses them (zlib "
                "releases the GIL), so gzip overlaps tokenising and predicting; the bytes are those of a line-by-line "
                "write. A run also has a fixed cost (last two rows below), which a small input does not amortise.\n")
    body.append("\nWhere the time goes (seconds for all documents, measured separately):\n")
    body.append(table(["part", "seconds"], [[k, f"{v:.3f}"] for k, v in parts.items()]))
    return "\n".join(body)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--e2e-only", action="store_true")
    ap.add_argument("--e2e-docs", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--docs", type=int, default=20000)
    ap.add_argument("--bert-docs", type=int, default=512)
    ap.add_argument("--corrupt-docs", type=int, default=300)
    args = ap.parse_args()
    e2e = end_to_end(args.e2e_docs, args.repeats)
    print(e2e)
    write_section("classify_e2e", "score-quality and label-topics end to end vs a raw fastText loop",
                  f"python bench/classify.py --e2e-only --e2e-docs {args.e2e_docs} --repeats {args.repeats}", e2e)
    if args.e2e_only:
        return

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


    from cptkit.core.step import map_batches
    from cptkit.steps.corrupt import CorruptConfig, Corrupter

    cdocs = [{"id": r["id"], "text": r["text"], "lang": "en"} for r in python_docs(args.corrupt_docs)]
    cor = Corrupter(CorruptConfig(ratio=0.3))
    from collections import Counter

    cor.corrupt_batch(cdocs[:8], Counter())  # load spaCy + WordNet outside the timing
    stats: Counter = Counter()
    cr = rate(lambda: list(map_batches(cdocs, 64, cor.corrupt_batch, stats)), len(cdocs), repeat=1)
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
