"""Benchmark: every topic annotator mode and the trained classifiers on real, source-labelled text.

    python bench/annotate.py [--per-topic 40] [--llm-per-topic 3] [--skip-llm]

Labelled set: GCIDE dictionary senses whose subject label ("(Zool.)", "(Law)", ...) names one of
the 11 English topics (tests/classify_realtext.py ``gcide_topics``; labels removed from the text).
Per topic, every 5th sense (by position) is the evaluation set, the rest the training set of
the classifiers and the pool of few-shot demonstrations. LLM modes (SmolLM2-135M, CPU) run on
the first ``--llm-per-topic`` evaluation senses of each topic; the embedding annotator and the
classifiers are reported on that subset too. Writes the ``annotate`` section of docs/benchmarks.md
and prints the table for docs/classifiers.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _report import table, write_section  # noqa: E402
from classify_realtext import GCIDE_TOPICS  # noqa: E402
from topic_classifiers import gcide_split  # noqa: E402

from cptkit.labels.classifiers import train_classifier  # noqa: E402
from cptkit.labels.config import FastTextParams, TrainParams, TuneParams  # noqa: E402
from cptkit.labels.metrics import evaluate  # noqa: E402

TOPICS = list(GCIDE_TOPICS)


def write(path: Path, recs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    return path


def scores(gold: list[str], pred: list[str]) -> tuple[float, float, dict[str, float]]:
    m = evaluate(gold, pred, TOPICS)
    per = {t: m["per_class"][t]["recall"] for t in TOPICS if m["per_class"][t]["support"]}
    return m["accuracy"], m["macro_f1"], per


def annotate(mode: str, inp: Path, out: Path, extra: list[str]) -> tuple[dict[str, str], float]:
    from cptkit.core.config import compose_step
    from cptkit.steps.label_topics_annotate import run

    n = sum(1 for _ in inp.open())
    run(compose_step("label-topics-annotate", [f"io.inputs=[{inp}]", f"io.output={out}", f"topics.sample={n}",
                                               f"topics.annotate_mode={mode}", "topics.languages=[en]", "quiet=true",
                                               "llm.cache=false", "llm.device=cpu", *extra]))
    man = json.loads((out / "_manifest.json").read_text())
    import gzip

    got = {}
    for f in sorted(out.glob("part-*.jsonl*")):
        opener = gzip.open if f.name.endswith(".gz") else open
        for line in opener(f, "rt"):
            r = json.loads(line)
            got[r["id"]] = r["topic"]
    timing = next(iter(man["results"].values()))["extra"]["timing"] if "results" in man else None
    rate = timing["pages_per_s"] if timing else man["extra"].get("annotate pages/s")
    return got, float(rate or 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-topic", type=int, default=40)
    ap.add_argument("--llm-per-topic", type=int, default=3)
    ap.add_argument("--skip-llm", action="store_true")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    tr, ev = gcide_split(args.per_topic)
    small = [r for t in TOPICS for r in [x for x in ev if x["topic"] == t][:args.llm_per_topic]]
    gold = {r["id"]: r["topic"] for r in ev}
    rows: list[list] = []
    per_topic: dict[str, dict[str, float]] = {}

    def add(name: str, subset: list[dict], pred: dict[str, str], rate: float) -> None:
        ids = [r["id"] for r in subset]
        acc, f1, per = scores([gold[i] for i in ids], [pred.get(i) or "Others" for i in ids])
        rows.append([name, len(ids), f"{acc:.3f}", f"{f1:.3f}", f"{rate:,.3f}" if rate < 10 else f"{rate:,.1f}"])
        per_topic[f"{name} (n={len(ids)})"] = per
        print(rows[-1], flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        write(d / "eval.jsonl", [{k: r[k] for k in ("id", "text", "lang")} for r in ev])
        write(d / "small.jsonl", [{k: r[k] for k in ("id", "text", "lang")} for r in small])
        write(d / "demos.jsonl", tr)
        pred, rate = annotate("embedding", d / "eval.jsonl", d / "emb", [])
        add("annotate: embedding (all-MiniLM-L6-v2, topic descriptions)", ev, pred, rate)
        add("annotate: embedding (all-MiniLM-L6-v2, topic descriptions)", small, pred, rate)
        names = ["+topics.taxonomy.en=" + str(write_names(d))]
        pred, rate = annotate("embedding", d / "eval.jsonl", d / "emb_names", names)
        add("annotate: embedding, topic names only", ev, pred, rate)
        for name, p in (("classifier: fastText fixed (epoch 25, lr 0.3), trained on the rest",
                         TrainParams(heldout=0.0, tune=TuneParams(mode="off"), fasttext=FastTextParams(epoch=25, lr=0.3))),
                        ("classifier: fastText tuned (train.tune.mode=grid), trained on the rest", TrainParams(heldout=0.0))):
            res = train_classifier([r["id"] for r in tr], [r["text"] for r in tr], [r["topic"] for r in tr], p, 0)
            t0 = time.perf_counter()
            probs = res.classifier.predict_proba([r["text"] for r in ev])
            secs = time.perf_counter() - t0
            pred = {r["id"]: res.classifier.labels[j] for r, j in zip(ev, probs.argmax(axis=1), strict=True)}
            add(name, ev, pred, len(ev) / secs)
            add(name, small, pred, len(ev) / secs)
        if not args.skip_llm:
            for name, mode, extra in (
                    ("annotate: loglikelihood zero-shot (SmolLM2-135M, calibrated)", "loglikelihood", []),
                    ("annotate: loglikelihood 1-shot per topic (SmolLM2-135M, calibrated)", "loglikelihood",
                     ["topics.few_shot=1", f"topics.few_shot_file={d / 'demos.jsonl'}", "topics.few_shot_chars=200"]),
                    ("annotate: generate (SmolLM2-135M, greedy, 16 tokens)", "generate", [])):
                pred, rate = annotate(mode, d / "small.jsonl", d / f"{mode}_{len(extra)}", extra)
                add(name, small, pred, rate)
    chance = 1 / len(TOPICS)
    body = (f"Labelled set: GCIDE dictionary senses, subject label → one of the {len(TOPICS)} English topics "
            f"(`gcide_topics` in tests/classify_realtext.py; labels removed from the text). Evaluation: "
            f"{args.per_topic} senses per topic (n={len(ev)}); LLM modes on the first {args.llm_per_topic} per topic "
            f"(n={len(small)}). Classifiers train on the other {len(tr)} senses. Chance: accuracy {chance:.3f}. "
            "docs/s: annotators over the step's annotation loop (model load excluded for LLM modes, encoder "
            "load included for embedding); classifiers: predict_proba on the evaluation set.\n\n"
            + table(["mode", "n", "accuracy", "macro-F1", "docs/s"], rows)
            + "\n\nPer-topic accuracy (recall):\n\n"
            + table(["mode"] + [t.split()[0] for t in TOPICS],
                    [[k] + [f"{v.get(t, float('nan')):.2f}" for t in TOPICS] for k, v in per_topic.items()]))
    print(body)
    write_section("annotate", "Topic annotators and classifiers on source-labelled text",
                  f"python bench/annotate.py --per-topic {args.per_topic} --llm-per-topic {args.llm_per_topic}"
                  + (" --skip-llm" if args.skip_llm else ""), body)


def write_names(d: Path) -> Path:
    """The English taxonomy without descriptions (embedding of the topic names alone)."""
    import yaml

    from cptkit.core.config import CONF_DIR

    data = yaml.safe_load((CONF_DIR / "topics" / "en.yaml").read_text())
    data.pop("descriptions", None)
    p = d / "en_names.yaml"
    p.write_text(yaml.safe_dump(data, allow_unicode=True))
    return p


if __name__ == "__main__":
    main()
