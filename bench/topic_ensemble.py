"""The topic-classifier ensemble (``train.backend=ensemble``, embed + minilm) on bench/topic_classifiers.py's split.

    python bench/topic_ensemble.py [--epochs 3] [--lr 5e-5]

Trains ``embed`` and ``minilm`` on the 880 training senses (``train.heldout=0``), then scores each and
their probability average (what ``train.backend=ensemble`` computes: its members train on the same
examples with the same seed) on two sets: the 220 held-out senses of the split, and a development set
of other GCIDE senses (``gcide_topics(100, offset=100)``, less any text in the split), where the
choice between the three is made. Prints accuracy and macro-F1 per set and the training seconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from classify_realtext import gcide_topics  # noqa: E402
from topic_classifiers import gcide_split  # noqa: E402

from cptkit.labels.classifiers import train_classifier  # noqa: E402
from cptkit.labels.config import MiniLMParams, TrainParams  # noqa: E402
from cptkit.labels.metrics import evaluate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=5e-5)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    tr, ev = gcide_split(20)
    seen = {r["text"] for r in tr + ev}
    dev = [r for r in gcide_topics(100, offset=100) if r["text"] not in seen]
    probs, labels = {}, []
    for name, p in [("embed", TrainParams(backend="embed", heldout=0.0)),
                    ("minilm", TrainParams(backend="minilm", heldout=0.0,
                                           minilm=MiniLMParams(epochs=args.epochs, lr=args.lr)))]:
        t0 = time.perf_counter()
        clf = train_classifier([r["id"] for r in tr], [r["text"] for r in tr], [r["topic"] for r in tr], p, 0).classifier
        print(f"{name}: trained in {time.perf_counter() - t0:.0f} s", flush=True)
        labels = clf.labels
        probs[name] = {s: clf.predict_proba([r["text"] for r in rows]) for s, rows in (("dev", dev), ("heldout", ev))}
    probs["ensemble"] = {s: (probs["embed"][s] + probs["minilm"][s]) / 2 for s in ("dev", "heldout")}
    for split, rows in (("dev", dev), ("heldout", ev)):
        gold = [r["topic"] for r in rows]
        for name in ("embed", "minilm", "ensemble"):
            m = evaluate(gold, [labels[j] for j in probs[name][split].argmax(axis=1)], labels)
            print(f"{split} ({len(rows)}) {name}: accuracy {m['accuracy']:.3f} macro-F1 {m['macro_f1']:.3f}")


if __name__ == "__main__":
    main()
