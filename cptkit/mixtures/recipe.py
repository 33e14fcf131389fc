"""A mixture recipe as pure functions: which domain a record belongs to, how a stage's weights
become sequence counts (epoch caps, fill, replay), and curriculum orders (SPEC §8).

No I/O here: :mod:`cptkit.mixtures.stream` writes and reads streams with these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cptkit.core.config import check
from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.core.records import Record, field_value
from cptkit.core.run import later_key
from cptkit.mixtures.rules import epoch_weights

CURRICULUM_ORDERS = ("none", "random", "low_to_high", "high_to_low")


def _cond(value: Any, want: Any) -> bool:
    if isinstance(want, dict) and "exists" in want:
        return (value is not None) == bool(want["exists"])
    if value is None:
        return False
    if isinstance(want, dict):
        try:
            v = float(value)
        except (TypeError, ValueError):
            return False
        return (want.get("min") is None or v >= float(want["min"])) and \
               (want.get("max") is None or v <= float(want["max"]))
    options = want if isinstance(want, list) else [want]
    values = value if isinstance(value, list) else [value]
    return any(str(v) == str(o) for v in values for o in options)


def matches(rec: Record, include: dict | None, exclude: dict | None = None) -> bool:
    """All ``include`` conditions hold and no ``exclude`` condition holds.

    A condition is ``field: value``, ``field: [any, of]``, ``field: {min: x, max: y}`` or
    ``field: {exists: true}``.
    """
    for key, want in (include or {}).items():
        if not _cond(field_value(rec, key), want):
            return False
    return not any(_cond(field_value(rec, key), want) for key, want in (exclude or {}).items())


def allocate(total: int, weights: dict[str, float]) -> dict[str, int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder)."""
    s = sum(weights.values())
    if total <= 0 or s <= 0:
        return {k: 0 for k in weights}
    exact = {k: total * w / s for k, w in weights.items()}
    out = {k: int(math.floor(v)) for k, v in exact.items()}
    rest = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), list(exact).index(k)))[:rest]:
        out[k] += 1
    return out


def stage_fractions(stages: list[dict]) -> list[float]:
    """Stage fractions of the budget; at most one stage may omit its fraction (the remainder). A
    fraction of 0 is allowed (the stage is left out: an upsampling tail of 0% is the no-tail baseline)."""
    given = [s.get("fraction") for s in stages]
    open_ = [i for i, f in enumerate(given) if f is None]
    if len(open_) > 1:
        raise CptkitError("mix.stages: at most one stage may leave out its fraction")
    fixed = sum(float(f) for f in given if f is not None)
    if any(f is not None and not 0 <= float(f) <= 1 for f in given):
        raise CptkitError(f"mix.stages: fractions must be in [0, 1], got {given}")
    if open_:
        if fixed >= 1:
            raise CptkitError(f"mix.stages: the given fractions sum to {fixed:g}, nothing left for stage "
                              f"{stages[open_[0]].get('name')!r}")
        given[open_[0]] = 1.0 - fixed
    elif abs(fixed - 1.0) > 1e-6:
        raise CptkitError(f"mix.stages: fractions sum to {fixed:g}, not 1")
    return [float(f) for f in given]


def stage_spec_weights(stage: dict, leaves: dict[str, Any], budget: float, fraction: float,
                       default_fill: str | None, index: int = 0) -> dict[str, float]:
    """A stage's weights by domain name: its ``weights``, or computed from ``epochs`` per domain.

    ``epochs: {domain: e}`` (domain upsampling §3.1): domain i gets e_i passes over its tokens,
    the stage's ``fill`` domain (default ``mix.fill``) the rest (:func:`cptkit.mixtures.rules.epoch_weights`).
    Epochs count over ``epochs_of: budget`` (default: the whole ``mix.budget_tokens``, as the
    paper's Table 2 counts them over the 1T run) or ``stage`` (the stage's own tokens).
    """
    name = str(stage.get("name", index))
    epochs = stage.get("epochs")
    if not epochs:
        return dict(stage.get("weights") or {})
    if stage.get("weights"):
        raise CptkitError(f"mix stage {name!r}: give weights or epochs, not both")
    fill = stage.get("fill") or default_fill
    if not fill:
        raise CptkitError(f"mix stage {name!r}: epochs need a fill domain (stage fill or mix.fill) for the rest")
    of = str(stage.get("epochs_of", "budget"))
    if of not in ("budget", "stage"):
        raise CptkitError(f"mix stage {name!r}: epochs_of={of!r}: use budget or stage")
    ref = budget * (fraction if of == "stage" else 1.0)
    sizes = {k: float(sum(d.tokens for d in leaves.values() if d.name == k or d.parent == k))
             for k in [*epochs, fill]}
    try:
        return epoch_weights({str(k): float(v) for k, v in epochs.items()}, sizes, ref, str(fill))
    except ValueError as e:
        raise CptkitError(f"mix stage {name!r}: {e}") from None


def curriculum_order(ppl: np.ndarray, order: str, groups: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """Document order for a PPL curriculum and the group boundaries (start offsets).

    Documents are sorted by PPL, cut into ``groups`` groups of (nearly) equal size, the groups
    ordered low → high (or high → low), and documents shuffled within each group (seeded).
    """
    n = len(ppl)
    rng = np.random.default_rng(seed)
    ranked = np.argsort(ppl, kind="stable")
    bounds = [round(n * g / groups) for g in range(groups + 1)]
    parts = [rng.permutation(ranked[bounds[g]:bounds[g + 1]]) for g in range(groups)]
    if order == "high_to_low":
        parts = parts[::-1]
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]]).tolist()
    return (np.concatenate(parts) if parts else ranked), starts


# --- the domain table -----------------------------------------------------------------------
@dataclass
class Domain:
    name: str
    parent: str
    index: int
    docs: int = 0
    tokens: int = 0
    file: Any = None
    lengths: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    ppl: list[float] = field(default_factory=list)
    heldout: list[tuple[int, str, Record]] = field(default_factory=list)  # max-heap by -hash


class Router:
    """Assigns records to (leaf) domains: the first matching domain, split by a field if asked."""

    def __init__(self, specs: list[dict]):
        if not specs:
            raise CptkitError("mix.domains is empty: define at least one domain")
        self.specs = specs
        names = [str(s.get("name") or "") for s in specs]
        for n in names:
            if not n:
                raise CptkitError("mix.domains: every domain needs a name")
        if len(set(names)) != len(names):
            raise CptkitError(f"mix.domains: duplicate domain names in {names}")

    def route(self, rec: Record) -> str | None:
        for spec in self.specs:
            if matches(rec, spec.get("filter"), spec.get("exclude")):
                by = spec.get("split_by")
                if not by:
                    return spec["name"]
                v = field_value(rec, by)
                return f"{spec['name']}/{v if v is not None else 'other'}"
        return None


def resolve_weights(weights: dict[str, float], leaves: dict[str, Domain], specs: list[dict],
                    stage: str, empty: str = "error") -> dict[str, float]:
    """Stage weights over leaf domains: a parent's weight is split by ``split_weights`` or tokens.

    A weighted domain that matched no document is an error, or with ``empty="drop"`` is left out
    of the stage (the other weights keep their ratios).
    """
    by_parent: dict[str, list[Domain]] = {}
    for d in leaves.values():
        by_parent.setdefault(d.parent, []).append(d)
    spec_of = {s["name"]: s for s in specs}
    out: dict[str, float] = {}
    for key, w in weights.items():
        w = float(w)
        if w < 0 or not math.isfinite(w):
            raise CptkitError(f"mix stage {stage!r}: weight of {key!r} is {w}")
        if key in leaves and leaves[key].parent == key:
            out[key] = out.get(key, 0.0) + w
        elif key in leaves:
            out[key] = out.get(key, 0.0) + w
        elif key in by_parent:
            kids = by_parent[key]
            split = (spec_of.get(key) or {}).get("split_weights") or {}
            if split:
                share = {d.name: float(split.get(d.name.split("/", 1)[1], 0.0)) for d in kids}
            else:
                share = {d.name: float(d.tokens) for d in kids}
            tot = sum(share.values())
            if tot <= 0:
                raise CptkitError(f"mix stage {stage!r}: domain {key!r} has weight {w:g} but its parts have none")
            for name, s in share.items():
                out[name] = out.get(name, 0.0) + w * s / tot
        elif key in spec_of:
            if w > 0 and empty == "drop":
                log.warning("mix stage %r: domain %r matched no documents; its weight %g is dropped", stage, key, w)
            elif w > 0:
                raise CptkitError(f"mix stage {stage!r}: domain {key!r} has weight {w:g} but no documents "
                                  "matched its filter")
        else:
            raise CptkitError(f"mix stage {stage!r}: unknown domain {key!r}; defined: "
                              f"{', '.join(s['name'] for s in specs)}")
    if sum(out.values()) <= 0:
        raise CptkitError(f"mix stage {stage!r}: all weights are 0")
    return out


def check_budget(budget: int, seq_len: int, available: dict[str, int], max_epochs: float) -> None:
    """Refuse a budget the input cannot fill: ``budget // seq_len`` sequences from
    ``sum(available)`` whole sequences, each drawn at most ``max_epochs`` times (a fill domain
    may take more than its own share of passes, but the stream as a whole may not)."""
    have = sum(available.values())
    reach = math.floor(max_epochs * have)
    if budget // seq_len > reach:
        raise CptkitError(
            f"mix.budget_tokens={budget:,} cannot be reached: the input holds {have * seq_len:,} tokens in whole "
            f"sequences of mix.seq_len={seq_len}, and mix.max_epochs={max_epochs:g} passes over them give at most "
            f"{reach * seq_len:,} tokens; lower mix.budget_tokens or raise mix.max_epochs")


def plan_counts(stage_seqs: list[int], stage_weights: list[dict[str, float]], available: dict[str, int],
                max_epochs: float, fill: list[str]) -> tuple[list[dict[str, int]], dict[str, bool]]:
    """Sequences per stage and domain, capping each domain at ``max_epochs`` passes.

    A capped domain's excess moves, in the same stage, to the ``fill`` domains (by their
    weights there, else by their sizes); fill domains are exempt from the cap. Without a fill
    domain, a cap violation is an error.
    """
    counts = [allocate(n, w) for n, w in zip(stage_seqs, stage_weights, strict=True)]
    capped: dict[str, bool] = {}
    for d, avail in available.items():
        demand = sum(c.get(d, 0) for c in counts)
        limit = math.floor(max_epochs * avail)
        if d in fill or demand <= limit:
            continue
        if not fill:
            raise CptkitError(f"domain {d!r} would be repeated {demand / max(avail, 1):.2f} times "
                              f"(> mix.max_epochs={max_epochs:g}); set mix.fill to a large domain or raise "
                              "mix.max_epochs")
        capped[d] = True
        keep = allocate(limit, {i: c.get(d, 0) for i, c in enumerate(counts)})
        for i, c in enumerate(counts):
            excess = c.get(d, 0) - keep[i]
            c[d] = keep[i]
            fw = {f: stage_weights[i].get(f, 0.0) for f in fill}
            if sum(fw.values()) <= 0:
                fw = {f: float(available[f]) for f in fill}
            for f, extra in allocate(excess, fw).items():
                c[f] = c.get(f, 0) + extra
    return counts, capped


def replay_leaves(names: list[str], leaves: dict[str, Domain]) -> list[str]:
    """The leaf domains named (directly or by their parent) in ``mix.replay.domains``."""
    return [n for n, d in leaves.items() if n in names or d.parent in names]


def apply_replay(weights: dict[str, float], replay: list[str], share: float, tokens: dict[str, int],
                 stage: str) -> dict[str, float]:
    """Stage weights (summing to 1) where the ``replay`` domains take exactly ``share`` of the mass.

    The other domains keep their ratios in ``1 - share``. The replay share is split among the
    replay domains by their weights in the stage when it names any of them, else by their tokens.
    ``share = 0`` removes the replay domains from the stage (the no-replay arm of an ablation).
    """
    if not 0.0 <= share <= 1.0:
        raise CptkitError(f"mix.replay.share={share:g}: must be in [0, 1]")
    rest = {k: v for k, v in weights.items() if k not in replay and v > 0}
    named = {k: weights.get(k, 0.0) for k in replay}
    if sum(named.values()) <= 0:
        named = {k: float(tokens.get(k, 0)) for k in replay}
    if share > 0 and sum(named.values()) <= 0:
        raise CptkitError(f"mix stage {stage!r}: mix.replay.share={share:g} but the replay domains "
                          f"{', '.join(replay) or '(none)'} have no tokens")
    if share < 1 and sum(rest.values()) <= 0:
        raise CptkitError(f"mix stage {stage!r}: only replay domains have weight; with mix.replay.share={share:g} "
                          "the stage needs other domains")
    out: dict[str, float] = {}
    rs = sum(rest.values())
    for k, v in rest.items():
        out[k] = (1.0 - share) * v / rs
    ns = sum(named.values())
    if share > 0:
        for k, v in named.items():
            if v > 0:
                out[k] = share * v / ns
    return out


# --- the recipe's config (conf/mix/<name>.yaml) ----------------------------------------------


@dataclass
class CurriculumConfig:
    order: str = "random"  # none (input order) | random | low_to_high | high_to_low (by PPL)
    groups: int = 10  # PPL groups (the paper: 10)
    model: str | None = None  # scoring model (path, .gguf, smollm2); needed for *_to_* orders
    domains: list[str] = field(default_factory=list)  # domains (or parents) ordered by PPL; [] = all
    max_tokens: int = 512  # tokens scored per document
    batch_size: int = 8

    def __post_init__(self) -> None:
        check(self.order in CURRICULUM_ORDERS, "order", self.order, f"use one of {', '.join(CURRICULUM_ORDERS)}")


@dataclass
class SelfReplayConfig:
    """``mix.replay.source=self``: texts the base samples from BOS (:mod:`cptkit.models.self_samples`)."""

    model: str | None = None  # the base (HF folder, .gguf or smollm2); required with source=self
    docs: int = 256  # samples drawn (empty ones are dropped)
    max_tokens: int = 256  # tokens per sample at most
    seed: int = 0  # batch seeds hashed from ("self-replay", seed, start): never the probe's
    topk: int = 0  # 0: no log-probs; k > 0: each position's top-k log-probs (teacher-free train.distill)
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for key in ("docs", "max_tokens"):
            check(getattr(self, key) >= 1, key, getattr(self, key), "must be ≥ 1")
        check(self.topk >= 0, "topk", self.topk, "must be ≥ 0 (0: store no log-probs)")
        check(self.temperature > 0 and math.isfinite(self.temperature), "temperature", self.temperature, "must be > 0")


@dataclass
class ReplayConfig:
    """Replay: ``share`` of every stage's tokens comes from the ``source``: ``pool`` (the ``domains``
    of the inputs), ``self`` (the base's own samples) or a path (any records), the last two as one
    domain named ``replay`` (the pool's ``domains`` then get no weight)."""

    share: float = 0.0  # in [0, 1]; 0 with domains set: the replay domains get no weight (no-replay arm)
    domains: list[str] = field(default_factory=list)  # names in mix.domains (or leaves); []: no replay
    source: str = "pool"  # pool | self | a file or folder of records
    self: SelfReplayConfig = field(default_factory=SelfReplayConfig)

    def __post_init__(self) -> None:
        check(bool(self.source), "source", self.source, "use pool, self or a path of records")
        check(self.share == 0 or self.source != "pool" or len(self.domains) > 0, "share", f"{self.share:g}",
              "needs mix.replay.domains (the general domains to replay)")
        check(self.source != "self" or bool(self.self.model), "self.model", self.self.model,
              "mix.replay.source=self needs the base model that writes the samples")


# keys added after build-mix outputs were recorded without them: left out of the record at these values
later_key("mix.replay.source", "pool")
later_key("mix.replay.self", {"model": None, "docs": 256, "max_tokens": 256, "seed": 0, "topk": 0, "temperature": 1.0})


@dataclass
class MixConfig:
    """A mix recipe (``conf/mix/<name>.yaml``)."""

    name: str = ""
    sources: list[str] = field(default_factory=list)  # input shards when --in is not given
    budget_tokens: float = 1e6  # tokens in the stream (all stages)
    seq_len: int = 512  # tokens per packed sequence
    max_epochs: float = 4.0  # cap on passes over a domain; the excess goes to `fill`
    fill: str | None = None  # domain (or parent) that absorbs capped demand
    empty_domains: str = "error"  # a weighted domain without documents: error | drop (from its stages)
    eval_docs: int = 8  # held-out documents per domain for per-domain eval losses
    max_docs: int = 0  # per leaf domain: only the max_docs docs with the smallest seeded id hash (0: all)
    tail_fraction: float = 0.1  # last share of the budget for an upsampling tail (recipes use it)
    unique_ids: bool = False  # a record id seen before (earlier --in first) is skipped and counted
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    domains: list[Any] = field(default_factory=list)  # {name, filter, exclude, split_by, split_weights}
    stages: list[Any] = field(default_factory=list)  # {name, fraction, weights: {domain: w}}
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

    def __post_init__(self) -> None:
        check(self.seq_len >= 2, "seq_len", self.seq_len, "must be ≥ 2")
        check(self.max_docs >= 0, "max_docs", self.max_docs, "must be ≥ 0 (0: every document)")
        check(self.max_docs == 0 or self.max_docs > self.eval_docs, "max_docs", self.max_docs,
              f"must exceed eval_docs={self.eval_docs}, or leave no training documents")
        check(math.isfinite(self.budget_tokens), "budget_tokens", f"{self.budget_tokens:g}",
              "must be a finite number of tokens")
        check(self.budget_tokens >= self.seq_len, "budget_tokens", f"{self.budget_tokens:g}",
              f"is smaller than one sequence (mix.seq_len={self.seq_len})")
        for stage in self.stages:
            weights = stage.get("weights") if isinstance(stage, Mapping) else None
            for key, w in (weights or {}).items():
                ok = isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w >= 0
                check(ok, f"stages.{stage.get('name', '?')}.weights.{key}", w, "must be a finite number ≥ 0")
