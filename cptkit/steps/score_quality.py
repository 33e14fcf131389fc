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

A threshold on one model's scores does not transfer to another model (Retrieve-from-CC's 0.8 cut
is on its BERT scorer's scale), so a filter can state the fraction it keeps instead:
``quality.keep_fraction=0.3`` scores a seeded sample of ``calibration_docs`` records drawn from
every input (the same sample in every shard job), sets ``min_score`` to the score that keeps 30%
of that sample (:func:`keep_threshold`), and records it in the manifest; a different threshold is
a different config, so a changed input that moves it never leaves stale shards behind.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.core.records import Record
from cptkit.core.run import Run
from cptkit.core.shards import STDIO, iter_records, resolve_inputs
from cptkit.core.step import MapStep, step
from cptkit.labels.classifiers import expected_value, load_classifier, numeric_labels


@dataclass
class ScorerConfig:
    model: str | None = None  # classifier directory
    field: str = ""  # output field
    min_score: float | None = None  # drop records scoring below this (None: keep all)
    keep_fraction: float | None = None  # or: the min_score that keeps this fraction of a sample of the input
    positive: str | None = None  # quality only: the class whose probability is the score

    def __post_init__(self) -> None:
        f = self.keep_fraction
        check(f is None or 0 < f <= 1, "keep_fraction", f, "must be in (0, 1]")
        check(f is None or self.min_score is None, "keep_fraction", f, "set min_score or keep_fraction, not both")


@dataclass
class ScoreQualityJob(JobConfig):
    quality: ScorerConfig = field(default_factory=lambda: ScorerConfig(field="quality"))
    edu: ScorerConfig = field(default_factory=lambda: ScorerConfig(field="edu_score"))
    batch_size: int = 512  # documents per classifier call
    calibration_docs: int = 10000  # keep_fraction: records sampled (by seeded id hash) to set the threshold

    def __post_init__(self) -> None:
        check(self.calibration_docs > 0, "calibration_docs", self.calibration_docs, "must be positive")


def keep_threshold(scores: np.ndarray, fraction: float) -> float:
    """The score a record needs (``score >= t``) so that ``ceil(fraction · n)`` of ``scores`` are kept:
    the ``ceil(fraction · n)``-th highest (ties at it are all kept, so a few more may pass)."""
    if len(scores) == 0:
        raise CptkitError("keep_fraction: no records to calibrate on")
    k = max(1, math.ceil(fraction * len(scores) - 1e-9))
    return float(np.sort(np.asarray(scores, dtype=float))[::-1][k - 1])


def calibration_sample(inputs: list, n: int, seed: int, **read_kw) -> list[Record]:
    """The ``n`` records of all ``inputs`` with the smallest seeded hash of their id: the same
    sample whatever the order of files or records, and in every shard job."""
    def key(rec: Record) -> bytes:
        return hashlib.blake2b(f"{seed}\x00{rec['id']}".encode(), digest_size=8).digest()

    return [r for _, r in heapq.nsmallest(n, ((key(r), r) for r in iter_records(inputs, **read_kw)),
                                           key=lambda kr: kr[0])]


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
            for key in ("min_score", "keep_fraction"):
                if getattr(sc, key) is not None and not sc.model:
                    raise CptkitError(f"{kind}.{key} is set but {kind}.model is not")
        self.calibration: dict[str, str] = {}
        to_calibrate = [s for s in self.scorers if getattr(c, s.kind).keep_fraction is not None]
        if to_calibrate:
            self.calibrate(to_calibrate)

    def calibrate(self, scorers: list[Scorer]) -> None:
        """Set each scorer's ``min_score`` from its ``keep_fraction`` on a sample of every input."""
        c: ScoreQualityJob = self.conf
        inputs = resolve_inputs(list(self.ctx.io.inputs))
        if any(f.path == STDIO for f in inputs):
            raise CptkitError("keep_fraction reads the input twice (a sample, then everything): give files, not stdin (-)")
        sample = calibration_sample(inputs, c.calibration_docs, c.seed, skip_bad=c.io.skip_bad_lines,
                                    **c.io.limits())
        texts = [r["text"] for r in sample]
        for s in scorers:
            frac = getattr(c, s.kind).keep_fraction
            s.min_score = keep_threshold(np.round(s.score(texts), 6), frac)
            self.ctx = self.ctx.recording(f"{s.kind}.min_score", s.min_score)
            self.calibration[f"{s.field} threshold"] = (f"{s.min_score:.6f} (keeps {frac:.0%} of "
                                                        f"{len(texts):,} sampled records)")
            log.info("%s.keep_fraction=%s: min_score=%.6f on %d sampled records", s.kind, frac, s.min_score, len(texts))

    def process(self, batch: list[Record], stats: Counter[str]) -> list[Record]:
        return score_batch(batch, self.scorers, stats)

    def reads(self) -> list[str | None]:
        return [self.conf.quality.model, self.conf.edu.model]

    def summary(self, total: Counter[str]) -> dict:
        rows: dict = {f"{s.field} model": getattr(self.conf, s.kind).model for s in self.scorers}
        rows |= self.calibration
        rows |= {f"dropped ({s.field} < {s.min_score})": 0 for s in self.scorers if s.min_score is not None}
        return rows | dict(total)


@step("score-quality", ScoreQualityJob, order=70)
def run(conf: ScoreQualityJob, ctx: Run) -> dict:
    return ScoreQuality(conf, ctx).run()
