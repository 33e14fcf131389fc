"""score-quality: score documents with trained classifiers: quality=P(high quality), edu_score in
[0,2]; filter only with quality.min_score / edu.min_score (SPEC §4).

Two scorers, each optional (at least one is required):

* ``quality.model``: a binary classifier (``score-quality-train --positives --negatives``);
  writes ``quality`` = P(positive class).
* ``edu.model``: a classifier with numeric classes (e.g. 0/1/2, trained with
  ``score-quality-train --in labelled/ train.label_field=edu``); writes ``edu_score`` =
  Σ_c P(c)·c, in [0, 2] for classes 0/1/2.

Scores are fields. A record is dropped only when ``quality.min_score`` / ``edu.min_score`` is
set and its score is below it, so a threshold can be swept over one scored output.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from cptkit.core.config import JobConfig
from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.core.run import Run
from cptkit.core.step import MapStep, step
from cptkit.labels.classifiers import expected_value, load_classifier, numeric_labels


@dataclass
class ScorerConfig:
    model: str | None = None  # classifier directory
    field: str = ""  # output field
    min_score: float | None = None  # drop records scoring below this (None: keep all)
    positive: str | None = None  # quality only: the class whose probability is the score


@dataclass
class ScoreQualityJob(JobConfig):
    quality: ScorerConfig = field(default_factory=lambda: ScorerConfig(field="quality"))
    edu: ScorerConfig = field(default_factory=lambda: ScorerConfig(field="edu_score"))
    batch_size: int = 512  # documents per classifier call


class Scorer:
    """One configured scorer: a loaded classifier and how its probabilities become a score."""

    def __init__(self, kind: str, cfg: ScorerConfig):
        self.kind, self.field, self.min_score = kind, cfg.field, cfg.min_score
        self.clf = load_classifier(cfg.model)
        labels = self.clf.labels
        if kind == "quality":
            pos = cfg.positive or self.clf.info.get("positive")
            if pos is None:
                if len(labels) != 2:
                    raise CptkitError(f"quality.model={cfg.model}: {len(labels)} classes; set quality.positive")
                pos = labels[-1]
            if pos not in labels:
                raise CptkitError(f"quality.positive={pos!r} is not a class of {cfg.model} ({labels})")
            self.col = labels.index(pos)
        elif not numeric_labels(labels):
            raise CptkitError(f"edu.model={cfg.model}: classes {labels} are not numeric (need e.g. 0/1/2)")

    def score(self, texts: list[str]) -> np.ndarray:
        probs = self.clf.predict_proba(texts)
        if self.kind == "quality":
            return probs[:, self.col]
        return expected_value(probs, self.clf.labels)


def score_batch(batch: list[Record], scorers: list[Scorer], stats: Counter[str]) -> list[Record]:
    """Add every scorer's field to each record; keep those not below a set threshold (drops counted)."""
    texts = [r["text"] for r in batch]
    scores = [s.score(texts) for s in scorers]
    kept = []
    for i, rec in enumerate(batch):
        keep = True
        for s, sc in zip(scorers, scores, strict=True):
            v = round(float(sc[i]), 6)
            rec[s.field] = v
            if s.min_score is not None and v < s.min_score:
                keep = False
                stats[f"dropped ({s.field} < {s.min_score})"] += 1
        if keep:
            kept.append(rec)
    return kept


class ScoreQuality(MapStep):
    """Score (and optionally filter) every input shard."""

    stats_key = "dropped"

    def setup(self) -> None:
        c: ScoreQualityJob = self.conf
        self.scorers = [Scorer(kind, sc) for kind, sc in (("quality", c.quality), ("edu", c.edu)) if sc.model]
        if not self.scorers:
            raise CptkitError("score-quality needs quality.model=DIR and/or edu.model=DIR "
                              "(train one with cptkit score-quality-train)")
        for kind, sc in (("quality", c.quality), ("edu", c.edu)):
            if sc.min_score is not None and not sc.model:
                raise CptkitError(f"{kind}.min_score is set but {kind}.model is not")

    def process(self, batch: list[Record], stats: Counter[str]) -> list[Record]:
        return score_batch(batch, self.scorers, stats)

    def reads(self) -> list[str | None]:
        return [self.conf.quality.model, self.conf.edu.model]

    def summary(self, total: Counter[str]) -> dict:
        rows: dict = {f"{s.field} model": getattr(self.conf, s.kind).model for s in self.scorers}
        rows |= {f"dropped ({s.field} < {s.min_score})": 0 for s in self.scorers if s.min_score is not None}
        return rows | dict(total)


@step("score-quality", ScoreQualityJob, order=70)
def run(conf: ScoreQualityJob, ctx: Run) -> dict:
    return ScoreQuality(conf, ctx).run()
