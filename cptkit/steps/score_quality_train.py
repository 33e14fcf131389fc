"""score-quality-train: train a quality classifier from --positives/--negatives (or --in with
train.label_field=FIELD); prints held-out accuracy/F1 (SPEC §4).

Two ways to give examples:

* ``--positives hq.jsonl --negatives web.jsonl``: a binary classifier with classes
  ``train.positive_label`` / ``train.negative_label``; ``score-quality`` writes P(positive).
* ``--in labelled/ train.label_field=edu``: one class per distinct value of that field
  (e.g. 0/1/2 for the educational-value scorer, whose score is the expected class value).

The output directory is the model (``classifier.json`` + weights) with the usual
``_manifest.json``; held-out accuracy, macro-F1 and the confusion table are printed and stored.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from cptkit.core.config import JobConfig
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.progress import log
from cptkit.core.run import Run
from cptkit.core.shards import InputFile
from cptkit.core.step import IN, OUT, QUIET, SKIP_BAD, Option, step
from cptkit.labels.classifiers import save_classifier, train_classifier
from cptkit.labels.config import TrainParams
from cptkit.labels.report import check_quality, params_of, report, tuning_rows


@dataclass
class QualityTrainParams(TrainParams):
    positives: list[str] = field(default_factory=list)  # high-quality examples (JSONL shards)
    negatives: list[str] = field(default_factory=list)  # low-quality examples
    positive_label: str = "hq"
    negative_label: str = "lq"
    label_field: str | None = None  # with --in: the record field holding the class


@dataclass
class ScoreQualityTrainJob(JobConfig):
    train: QualityTrainParams = field(default_factory=QualityTrainParams)


POSITIVES = Option(("--positives",), "train.positives", "JSONL file, directory or glob. Repeatable.",
                   multiple=True)
NEGATIVES = Option(("--negatives",), "train.negatives", "JSONL file, directory or glob. Repeatable.",
                   multiple=True)


@step("score-quality-train", ScoreQualityTrainJob, options=(POSITIVES, NEGATIVES, IN, OUT, QUIET, SKIP_BAD), order=60)
def run(conf: ScoreQualityTrainJob, ctx: Run) -> dict:
    t = conf.train
    if t.positives or t.negatives:
        if not (t.positives and t.negatives):
            raise CptkitError("give both --positives and --negatives (or --in with train.label_field=FIELD)")
        if conf.io.inputs:
            raise CptkitError("--in is for train.label_field mode; with --positives/--negatives leave it out")
        groups: list[tuple[InputFile, str | None]] = (
            [(f, t.positive_label) for f in ctx.resolve_inputs(t.positives)]
            + [(f, t.negative_label) for f in ctx.resolve_inputs(t.negatives)])
    else:
        if not t.label_field:
            raise CptkitError("score-quality-train needs --positives/--negatives, or --in with train.label_field=FIELD")
        groups = [(f, None) for f in ctx.resolve_inputs()]
    label_field = t.label_field or ""
    inputs = [f for f, _ in groups]
    with Job(ctx, inputs=inputs, tasks=[Task(0, inputs)]) as job:
        extra: dict = {}
        for task in job.pending():
            t0 = time.time()
            ids, texts, labels = [], [], []
            seen: set[str] = set()
            for inp, label in groups:
                for rec in job.read(Task(task.index, [inp])):
                    if label is None:
                        v = rec.get(label_field)
                        if v is None or isinstance(v, (dict, list)):
                            raise CptkitError(f"{inp.name}: record {rec['id']!r} has no scalar field {label_field!r}")
                        lab = str(v)
                    else:
                        lab = label
                    if rec["id"] in seen:
                        raise CptkitError(f"{inp.name}: record id {rec['id']!r} appears twice in the training data")
                    seen.add(rec["id"])
                    ids.append(rec["id"])
                    texts.append(rec["text"])
                    labels.append(lab)
            params = params_of(t)
            log.info("training %s on %d examples", params.backend, len(ids))
            res = train_classifier(ids, texts, labels, params, conf.seed)
            title = "quality" if t.positives else label_field
            check_quality(res.metrics, title, params.min_f1)
            info = {"positive": t.positive_label} if t.positives else {}
            save_classifier(res, job.out, params, conf.seed, extra=info)
            extra = {"classes": ",".join(res.classifier.labels), **res.counts,
                     **report(res.metrics, title, conf.quiet), **tuning_rows(res.classifier, title)}
            job.complete(task, None, seconds=time.time() - t0, metrics=res.metrics)
        if not extra:  # resumed after completion
            import json

            info = json.loads(job.file("classifier.json").read_text()) if job.file("classifier.json").exists() else {}
            extra = {"classes": ",".join(info.get("labels", []))}
        return job.finish(extra=extra)


def main(argv: list[str] | None = None) -> int:
    """``cptkit score-quality-train-report DIR``: print the held-out scores of a score-quality-train
    output, read from its ``metrics.json``."""
    p = argparse.ArgumentParser(prog="cptkit score-quality-train-report", description=main.__doc__.splitlines()[0])
    p.add_argument("output", type=Path, help="a score-quality-train output directory (the model)")
    path = p.parse_args(argv).output / "metrics.json"
    if not path.is_file():
        raise CptkitError(f"{path}: no such file (not a finished score-quality-train output)")
    m = json.loads(path.read_text())["metrics"]
    print(f"quality classifier, held-out n={m['n']}: accuracy {m['accuracy']:.4f} (majority class "
          f"{m['majority_accuracy']:.4f}), macro-F1 {m['macro_f1']:.4f}, AUC positive vs negative "
          f"{m.get('auc', float('nan')):.4f}")
    return 0
