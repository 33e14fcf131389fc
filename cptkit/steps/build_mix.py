"""build-mix: curated shards → a tokenized, packed, mixed training stream (SPEC §8).

Domains are filters on record fields (dolma-mixer style); each stage of the token budget has a
target proportion per domain (by tokens). Documents are tokenized once (a fast tokenizer, batch
encoding runs on all cores), ordered per domain (seeded shuffle, or a PPL curriculum), and
concatenated with EOS after every document into one token file per domain
(``tokens/dNNN.bin``, uint16 when the vocabulary fits, else uint32, with document offsets in
``tokens/dNNN.docs.npy``). Packing cuts each domain's tokens into fixed-length sequences; the
plan ``plan.npy`` lists (domain, sequence) for the whole budget, stage by stage. Because the
domains stay separate, ``train`` can follow the plan or draw domains with its own weights.

Outputs (all under ``--out``): ``_stream.json`` (what train reads), ``tokens/``, ``plan.npy``,
``_eval.jsonl.gz`` (held-out documents per domain, field ``domain``), ``_manifest.json``.
"""

from __future__ import annotations

import gzip
import heapq
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from cptkit.config import JobConfig, register_step
from cptkit.errors import CptkitError
from cptkit.job import MANIFEST, Job, Task
from cptkit.progress import log
from cptkit.records import Record, dumps
from cptkit.shards import atomic_write_bytes, atomic_write_json, resolve_inputs
from cptkit.text.hashing import fast_seeded_hash

STREAM = "_stream.json"
EVAL = "_eval.jsonl.gz"
CURRICULUM_ORDERS = ("none", "random", "low_to_high", "high_to_low")


@dataclass
class CurriculumConfig:
    order: str = "random"  # none (input order) | random | low_to_high | high_to_low (by PPL)
    groups: int = 10  # PPL groups (the paper: 10)
    model: str | None = None  # scoring model (path, .gguf, smollm2); needed for *_to_* orders
    domains: list[str] = field(default_factory=list)  # domains (or parents) ordered by PPL; [] = all
    max_tokens: int = 512  # tokens scored per document
    batch_size: int = 8


@dataclass
class ReplayConfig:
    """Replay: ``share`` of every stage's tokens comes from the ``domains`` (general data)."""

    share: float = 0.0  # in [0, 1]; 0 with domains set: the replay domains get no weight (no-replay arm)
    domains: list[str] = field(default_factory=list)  # names in mix.domains (or leaves); []: no replay


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
    tail_fraction: float = 0.1  # last share of the budget for an upsampling tail (recipes use it)
    unique_ids: bool = False  # a record id seen before (earlier --in first) is skipped and counted
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    domains: list[Any] = field(default_factory=list)  # {name, filter, exclude, split_by, split_weights}
    stages: list[Any] = field(default_factory=list)  # {name, fraction, weights: {domain: w}}
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)


@dataclass
class BuildMixOptions:
    batch_docs: int = 256  # documents per tokenizer batch
    dtype: str = "auto"  # auto | uint16 | uint32


@dataclass
class BuildMixJob(JobConfig):
    tokenizer: str | None = None  # tokenizer spec: HF directory, .gguf file or smollm2
    mix: MixConfig = field(default_factory=MixConfig)
    build_mix: BuildMixOptions = field(default_factory=BuildMixOptions)


register_step("build-mix", BuildMixJob)


# --- pure helpers ---------------------------------------------------------------------------
def field_value(rec: Record, key: str) -> Any:
    """A record field by dotted path (``meta.topic``); a plain key also looks inside ``meta``."""
    cur: Any = rec
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            cur = None
            break
        cur = cur[part]
    if cur is None and "." not in key and isinstance(rec.get("meta"), dict):
        cur = rec["meta"].get(key)
    return cur


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
    """Stage fractions of the budget; at most one stage may omit its fraction (the remainder)."""
    given = [s.get("fraction") for s in stages]
    open_ = [i for i, f in enumerate(given) if f is None]
    if len(open_) > 1:
        raise CptkitError("mix.stages: at most one stage may leave out its fraction")
    fixed = sum(float(f) for f in given if f is not None)
    if any(f is not None and not 0 < float(f) <= 1 for f in given):
        raise CptkitError(f"mix.stages: fractions must be in (0, 1], got {given}")
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
    the stage's ``fill`` domain (default ``mix.fill``) the rest (:func:`cptkit.mixing.epoch_weights`).
    Epochs count over ``epochs_of: budget`` (default: the whole ``mix.budget_tokens``, as the
    paper's Table 2 counts them over the 1T run) or ``stage`` (the stage's own tokens).
    """
    from cptkit.mixing import epoch_weights

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
        if w < 0 or math.isnan(w):
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


# --- the step -------------------------------------------------------------------------------
def _load_tokenizer(spec: str | None):
    if not spec:
        raise CptkitError("build-mix needs a tokenizer: pass tokenizer=PATH (an HF directory, .gguf or smollm2)")
    from cptkit.lm import load_tokenizer

    tok = load_tokenizer(str(spec))
    if not getattr(tok, "is_fast", False):
        raise CptkitError(f"tokenizer {spec}: build-mix needs a fast (Rust) tokenizer")
    if tok.eos_token_id is None:
        raise CptkitError(f"tokenizer {spec}: has no EOS token to separate documents")
    return tok


# --- the step: settings, route + tokenize, write domains, plan, write the stream ------------
@dataclass
class MixSettings:
    """The validated recipe (``cfg.mix`` as plain data) and the options every phase reads."""

    mix: dict
    seed: int
    seq_len: int
    budget: int
    stages: list[dict]
    fractions: list[float]
    cur: dict
    router: Router
    replay_names: list[str]
    replay_share: float
    unique: bool
    eval_k: int
    batch_docs: int

    @property
    def order(self) -> str:
        return str(self.cur["order"])


def mix_settings(cfg: DictConfig) -> MixSettings:
    """Read and check the recipe: one-line errors for anything inconsistent, before any work."""
    mix = OmegaConf.to_container(cfg.mix, resolve=True)
    assert isinstance(mix, dict)
    seq_len = int(mix["seq_len"])
    if seq_len < 2:
        raise CptkitError(f"mix.seq_len={seq_len}: must be ≥ 2")
    budget = int(float(mix["budget_tokens"]))
    if budget < seq_len:
        raise CptkitError(f"mix.budget_tokens={budget} is smaller than one sequence (mix.seq_len={seq_len})")
    stages = list(mix["stages"] or [])
    if not stages:
        raise CptkitError("mix.stages is empty: give at least one stage with weights")
    fractions = stage_fractions(stages)
    cur = mix["curriculum"]
    if cur["order"] not in CURRICULUM_ORDERS:
        raise CptkitError(f"mix.curriculum.order={cur['order']!r}: use one of {', '.join(CURRICULUM_ORDERS)}")
    router = Router([OmegaConf.to_container(s, resolve=True) if OmegaConf.is_config(s) else s
                     for s in mix["domains"]])  # plain dicts: a record is routed without OmegaConf lookups
    names = [s["name"] for s in router.specs]
    replay_cfg = mix.get("replay") or {}
    replay_names = [str(n) for n in replay_cfg.get("domains") or []]
    replay_share = float(replay_cfg.get("share") or 0.0)
    if replay_share and not replay_names:
        raise CptkitError(f"mix.replay.share={replay_share:g} needs mix.replay.domains (the general domains to replay)")
    for name in list(cur.get("domains") or []) + ([mix["fill"]] if mix.get("fill") else []) + replay_names:
        if name not in names and "/" not in name:
            raise CptkitError(f"mix: unknown domain {name!r}; defined: {', '.join(names)}")
    return MixSettings(mix=mix, seed=int(cfg.seed), seq_len=seq_len, budget=budget, stages=stages,
                       fractions=fractions, cur=cur, router=router, replay_names=replay_names,
                       replay_share=replay_share, unique=bool(mix.get("unique_ids")), eval_k=int(mix["eval_docs"]),
                       batch_docs=int(cfg.build_mix.batch_docs))


def token_dtype(setting: str, vocab: int) -> np.dtype:
    """``build_mix.dtype`` (auto: uint16 when the vocabulary fits) for a vocabulary of ``vocab``."""
    name = "uint16" if setting == "auto" and vocab <= 65535 else "uint32" if setting == "auto" else setting
    if name not in ("uint16", "uint32") or (name == "uint16" and vocab > 65535):
        raise CptkitError(f"build_mix.dtype={setting}: use auto, uint16 (vocab ≤ 65535) or uint32 (vocab {vocab})")
    return np.dtype(name)


class DomainFiles:
    """Route + tokenize: every routed record's tokens (and EOS) are appended to its leaf domain's raw
    file; per domain the ``eval_k`` documents with the smallest id hash are held out instead."""

    def __init__(self, s: MixSettings, tmp_dir: Path, tok: Any, dtype: np.dtype, scorer: Any = None):
        self.s, self.tmp_dir, self.tok, self.dtype, self.scorer = s, tmp_dir, tok, dtype, scorer
        self.eos = int(tok.eos_token_id)
        self.leaves: dict[str, Domain] = {}
        self.tokenize_s = 0.0
        self._ppl_domains = set(s.cur.get("domains") or [])

    def wants_ppl(self, leaf: str) -> bool:
        """Whether ``leaf`` is ordered by the curriculum's perplexity."""
        pd = self._ppl_domains
        return self.scorer is not None and (not pd or leaf in pd or leaf.split("/", 1)[0] in pd)

    def raw_path(self, d: Domain) -> Path:
        return self.tmp_dir / f"{d.index:03d}.raw"  # by index: leaf names may sanitise alike

    def leaf(self, name: str) -> Domain:
        if name not in self.leaves:
            d = Domain(name, name.split("/", 1)[0], len(self.leaves))
            d.file = open(self.raw_path(d), "wb")  # noqa: SIM115
            self.leaves[name] = d
        return self.leaves[name]

    def emit(self, d: Domain, rid: str, ids: list[int], ppl: float) -> None:
        arr = np.asarray(ids + [self.eos], dtype=self.dtype)
        d.file.write(arr.tobytes())
        d.lengths.append(len(arr))
        d.ids.append(rid)
        d.ppl.append(ppl)
        d.docs += 1
        d.tokens += len(arr)

    def add(self, batch: list[tuple[str, Record]]) -> None:
        """Tokenize a batch of ``(leaf, record)`` (and score it for a PPL curriculum); file the tokens."""
        if not batch:
            return
        t = time.time()
        enc = self.tok([r["text"] for _, r in batch], add_special_tokens=False, return_attention_mask=False)["input_ids"]
        self.tokenize_s += time.time() - t
        ppls = [float("nan")] * len(batch)
        score = [i for i, (name, _) in enumerate(batch) if self.wants_ppl(name)]
        if score:
            from cptkit.lm import document_losses

            model, stok = self.scorer
            res = document_losses(model, stok, [batch[i][1]["text"] for i in score],
                                  batch_size=int(self.s.cur["batch_size"]), max_tokens=int(self.s.cur["max_tokens"]))
            for i, (nll, n) in zip(score, res, strict=True):
                ppls[i] = math.exp(nll / n) if n else float("inf")
        eval_k, seed = self.s.eval_k, self.s.seed
        for (name, rec), ids, p in zip(batch, enc, ppls, strict=True):
            if not ids:
                continue
            d = self.leaf(name)
            rid = str(rec["id"])
            if eval_k > 0:  # keep the eval_k docs with the smallest hash as held-out eval set
                item = (-fast_seeded_hash(seed, rid), rid, {"id": rid, "text": rec["text"], "domain": name, "_ids": ids, "_ppl": p})
                if len(d.heldout) < eval_k:
                    heapq.heappush(d.heldout, item)  # type: ignore[arg-type]
                    continue
                if item[0] > d.heldout[0][0]:
                    item = heapq.heapreplace(d.heldout, item)  # type: ignore[arg-type]
                rec2 = item[2]
                self.emit(d, rec2["id"], rec2["_ids"], rec2["_ppl"])
            else:
                self.emit(d, rid, ids, p)

    def close(self) -> None:
        for d in self.leaves.values():
            if d.docs == 0 and d.heldout:  # a tiny domain: its eval docs must also be trained on
                log.warning("domain %s has only %d documents: they are both eval and training documents",
                            d.name, len(d.heldout))
                for _, _, rec2 in sorted(d.heldout, key=lambda t: (-t[0], t[1])):
                    self.emit(d, rec2["id"], rec2["_ids"], rec2["_ppl"])
            d.file.close()


@dataclass
class RouteStats:
    records_in: int = 0
    unmatched: int = 0
    repeated: int = 0


def route_and_tokenize(records: Any, s: MixSettings, files: DomainFiles) -> RouteStats:
    """Route every record to its leaf domain (skipping repeated ids with ``mix.unique_ids``) and
    tokenize in batches of ``build_mix.batch_docs``."""
    st = RouteStats()
    batch: list[tuple[str, Record]] = []
    seen_ids: set[str] = set()
    for rec in records:
        st.records_in += 1
        if s.unique:
            rid = str(rec["id"])
            if rid in seen_ids:
                st.repeated += 1
                continue
            seen_ids.add(rid)
        name = s.router.route(rec)
        if name is None:
            st.unmatched += 1
            continue
        batch.append((name, rec))
        if len(batch) >= s.batch_docs:
            files.add(batch)
            batch = []
    files.add(batch)
    files.close()
    if not files.leaves:
        raise CptkitError(f"build-mix: none of the {st.records_in} records matched a domain filter")
    return st


def write_domains(files: DomainFiles, s: MixSettings, tok_dir: Path) -> list[dict]:
    """Order each domain's documents (curriculum, shuffle or as read) and write its token file and
    document offsets; returns the stream's domain table."""
    order = s.order
    stream_domains = []
    for name in sorted(files.leaves, key=lambda n: files.leaves[n].index):
        d = files.leaves[name]
        lengths = np.asarray(d.lengths, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        rng_seed = fast_seeded_hash(s.seed, name) % 2**32
        groups: list[int] = []
        if files.wants_ppl(name) and d.docs:
            perm, groups = curriculum_order(np.asarray(d.ppl), order, int(s.cur["groups"]), rng_seed)
        elif order == "none":
            perm = np.arange(d.docs)
        else:
            perm = np.random.default_rng(rng_seed).permutation(d.docs)
        raw = np.fromfile(files.raw_path(d), dtype=files.dtype)
        fname = f"d{d.index:03d}"
        final = np.concatenate([raw[starts[i]:starts[i] + lengths[i]] for i in perm]) if d.docs else raw[:0]
        atomic_write_bytes(tok_dir / f"{fname}.bin", final.tobytes())
        offsets = np.concatenate([[0], np.cumsum(lengths[perm])]).astype(np.int64)
        atomic_write_bytes(tok_dir / f"{fname}.docs.npy", _npy_bytes(offsets))
        files.raw_path(d).unlink()
        ppl_sorted = np.asarray(d.ppl)[perm] if d.docs else np.asarray([])
        group_ppl = []
        if groups:
            bounds = groups + [d.docs]
            group_ppl = [float(np.exp(np.mean(np.log(ppl_sorted[a:b])))) if b > a else None
                         for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        stream_domains.append({
            "name": name, "parent": d.parent, "file": f"tokens/{fname}.bin",
            "docs_file": f"tokens/{fname}.docs.npy", "docs": d.docs, "tokens": int(d.tokens),
            "sequences": int(d.tokens // s.seq_len), "eval_docs": len(d.heldout),
            "curriculum": {"order": order if files.wants_ppl(name) else ("random" if order != "none" else "none"),
                           "group_starts": groups, "group_ppl": group_ppl},
        })
    for sd in stream_domains:
        if sd["sequences"] == 0:
            log.warning("domain %s has %d tokens, fewer than one sequence of %d", sd["name"], sd["tokens"], s.seq_len)
    return stream_domains


@dataclass
class Plan:
    """Which sequence of which domain the trainer reads at each position, stage by stage."""

    rows: np.ndarray  # (sequences, 2): domain index, sequence index in the domain's order
    stages: list[dict]
    fill: list[str]
    replay: list[str]
    replay_tokens: int
    epochs: dict[str, float]


def plan_stream(stream_domains: list[dict], leaves: dict[str, Domain], s: MixSettings) -> Plan:
    """Sequences per stage and domain (weights, replay, fill, ``max_epochs`` caps), interleaved at
    random per stage from ``(seed, stage)``; sets each domain's epochs and planned tokens."""
    mix, seq_len, stages, fractions = s.mix, s.seq_len, s.stages, s.fractions
    available = {sd["name"]: sd["sequences"] for sd in stream_domains}
    total_seqs = s.budget // seq_len
    stage_seqs = allocate(total_seqs, {str(i): f for i, f in enumerate(fractions)})
    stage_w = [resolve_weights(stage_spec_weights(st, leaves, s.budget, fractions[i], mix.get("fill"), i), leaves,
                               s.router.specs, str(st.get("name", i)), str(mix.get("empty_domains", "error")))
               for i, st in enumerate(stages)]
    replay = replay_leaves(s.replay_names, leaves)
    if s.replay_names and not replay:
        raise CptkitError(f"mix.replay.domains={s.replay_names}: no documents matched these domains")
    if s.replay_names:
        leaf_tokens = {n: d.tokens for n, d in leaves.items()}
        stage_w = [apply_replay(w, replay, s.replay_share, leaf_tokens, str(stages[i].get("name", i)))
                   for i, w in enumerate(stage_w)]
    for i, w in enumerate(stage_w):
        empty = [k for k, v in w.items() if v > 0 and available[k] == 0]
        if empty:
            raise CptkitError(f"mix stage {stages[i].get('name', i)!r}: domain {empty[0]!r} has weight but "
                              f"fewer than {seq_len} tokens")
    fill = []
    if mix.get("fill"):
        fill = [n for n in available if n == mix["fill"] or n.split("/", 1)[0] == mix["fill"]]
        if not fill:
            raise CptkitError(f"mix.fill={mix['fill']!r}: no documents matched that domain")
    counts, capped = plan_counts([stage_seqs[str(i)] for i in range(len(stages))], stage_w, available,
                                 float(mix["max_epochs"]), fill)
    index = {sd["name"]: i for i, sd in enumerate(stream_domains)}
    cursor = dict.fromkeys(available, 0)  # next sequence in each domain's (curriculum) order
    drawn = dict.fromkeys(available, 0)
    ppl_ordered = {d["name"]: d["curriculum"]["order"] in ("low_to_high", "high_to_low") for d in stream_domains}
    rows = []
    stage_info = []
    start = 0
    for i, (st, c) in enumerate(zip(stages, counts, strict=True)):
        labels = np.concatenate([np.full(n, index[k], dtype=np.int32) for k, n in c.items() if n > 0]
                                or [np.zeros(0, dtype=np.int32)])
        labels = np.random.default_rng([s.seed, i]).permutation(labels)
        # `curriculum: false` on a stage: its PPL-ordered domains are sampled at random (Llama-3-SynE
        # §4.2: stage 2 no longer uses the curriculum); other domains keep their order
        ordered = st.get("curriculum", True) is not False
        pick = np.random.default_rng([s.seed, i, 1])
        seqs = np.empty(len(labels), dtype=np.int64)
        for k, dom in enumerate(labels):
            name = stream_domains[dom]["name"]
            if not ordered and ppl_ordered[name]:
                seqs[k] = int(pick.integers(available[name]))
            else:
                seqs[k] = cursor[name] % available[name]
                cursor[name] += 1
            drawn[name] += 1
        rows.append(np.stack([labels.astype(np.int64), seqs], axis=1))
        n = int(len(labels))
        tot_w = sum(stage_w[i].values())
        stage_info.append({
            "name": str(st.get("name", f"stage{i}")), "fraction": fractions[i], "start": start, "end": start + n,
            "weights": {k: v / tot_w for k, v in stage_w[i].items()},
            "sequences": {k: v for k, v in c.items() if v}, "tokens": {k: v * seq_len for k, v in c.items() if v},
            "curriculum": ordered,
        })
        start += n
    plan = np.concatenate(rows) if rows else np.zeros((0, 2), dtype=np.int64)
    epochs = {k: (drawn[k] / available[k] if available[k] else 0.0) for k in available}
    for sd in stream_domains:
        sd["epochs"] = round(epochs[sd["name"]], 4)
        sd["capped"] = bool(capped.get(sd["name"]))
        sd["planned_tokens"] = drawn[sd["name"]] * seq_len
    for k in fill:
        if epochs[k] > float(mix["max_epochs"]):
            log.warning("fill domain %s is repeated %.2f times (above mix.max_epochs=%g)", k, epochs[k],
                        float(mix["max_epochs"]))
    return Plan(rows=plan.astype(np.int64), stages=stage_info, fill=fill, replay=replay,
                replay_tokens=sum(cursor[k] for k in replay) * seq_len, epochs=epochs)


def eval_bytes(stream_domains: list[dict], leaves: dict[str, Domain]) -> bytes:
    """The held-out documents of every domain as JSONL.gz (fixed mtime: same bytes every run)."""
    lines = []
    for sd in stream_domains:
        for _, _, rec in sorted(leaves[sd["name"]].heldout, key=lambda t: (-t[0], t[1])):
            lines.append(dumps({k: v for k, v in rec.items() if not k.startswith("_")}))
    return gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)


def run(cfg: DictConfig) -> dict:
    s = mix_settings(cfg)
    specs_in = list(cfg.io.inputs) or list(s.mix.get("sources") or [])
    if not specs_in:
        raise CptkitError("build-mix: no input: pass --in PATH or list mix.sources in the recipe")
    inputs = resolve_inputs(specs_in)
    tok = _load_tokenizer(cfg.tokenizer)
    dtype = token_dtype(str(cfg.build_mix.dtype), len(tok))
    scorer = None
    if s.order in ("low_to_high", "high_to_low"):
        if not s.cur.get("model"):
            raise CptkitError(f"mix.curriculum.order={s.order} needs mix.curriculum.model (the PPL scoring model)")
        from cptkit.lm import load_causal_lm, load_tokenizer

        scorer = (load_causal_lm(str(s.cur["model"])), load_tokenizer(str(s.cur["model"])))
    task = Task(0, inputs, name="mix")
    if s.unique:
        # mix.unique_ids: a repeated id is expected (a retrieved page and its corpus copy) and the
        # mix keeps the first one, so the reader's duplicate-id check would refuse the very case.
        cfg.io.unique_ids = False
    with Job(cfg, tasks=[task], needs_inputs=False) as job:
        if not job.pending():
            return job.finish()
        t0 = time.time()
        tmp_dir, tok_dir = job.out / ".cptkit" / "tmp", job.out / "tokens"
        for d in (tmp_dir, tok_dir):
            d.mkdir(parents=True, exist_ok=True)
        files = DomainFiles(s, tmp_dir, tok, dtype, scorer)
        read = route_and_tokenize(job.read(task), s, files)
        read_s = time.time() - t0
        stream_domains = write_domains(files, s, tok_dir)
        plan = plan_stream(stream_domains, files.leaves, s)
        atomic_write_bytes(job.out / "plan.npy", _npy_bytes(plan.rows))
        atomic_write_bytes(job.out / EVAL, eval_bytes(stream_domains, files.leaves))
        stream = stream_info(s, cfg, tok, dtype, stream_domains, plan, read)
        atomic_write_json(job.out / STREAM, stream)
        tmp_dir.rmdir()
        res = job.results[task.name]
        res.records_out = sum(sd["docs"] for sd in stream_domains)
        res.files += [sd["file"] for sd in stream_domains] + ["plan.npy", STREAM, EVAL]
        job.complete(task, seconds=time.time() - t0)
        result = job.finish(extra=summary(stream, read, files.tokenize_s, read_s))
        manifest = json.loads((job.out / MANIFEST).read_text())
        manifest["stream"] = {k: v for k, v in stream.items() if k != "domains"} | {"domains": stream_domains}
        atomic_write_json(job.out / MANIFEST, manifest)
        return result | {"stream": stream}


def stream_info(s: MixSettings, cfg: DictConfig, tok: Any, dtype: np.dtype, stream_domains: list[dict], plan: Plan,
                read: RouteStats) -> dict:
    """``_stream.json``: what the trainer needs to read the stream (format cptkit-stream/1)."""
    n_seqs = int(len(plan.rows))
    stream = {
        "format": "cptkit-stream/1", "seq_len": s.seq_len, "dtype": dtype.name, "eos_token_id": int(tok.eos_token_id),
        "vocab_size": len(tok), "tokenizer": _tokenizer_ref(cfg.tokenizer), "mix": s.mix.get("name") or "",
        "budget_tokens": s.budget, "total_sequences": n_seqs, "plan": "plan.npy", "eval": EVAL,
        "domains": stream_domains, "stages": plan.stages, "fill": plan.fill, "max_epochs": float(s.mix["max_epochs"]),
        "seed": s.seed,
    }
    if s.replay_names:
        stream["replay"] = {
            "share": s.replay_share, "domains": plan.replay, "tokens": plan.replay_tokens,
            "realised_share": plan.replay_tokens / max(n_seqs * s.seq_len, 1),
            "epochs": {k: round(plan.epochs[k], 4) for k in plan.replay},
        }
    if s.unique:
        stream["repeated_ids_skipped"] = read.repeated
    return stream


def summary(stream: dict, read: RouteStats, tokenize_s: float, read_s: float) -> dict[str, Any]:
    """The summary-table and manifest rows of a build-mix run."""
    domains = stream["domains"]
    tokens_total = sum(sd["tokens"] for sd in domains)
    extra: dict[str, Any] = {
        "domains": len(domains), "unmatched records": read.unmatched,
        **({"repeated ids skipped": read.repeated} if "repeated_ids_skipped" in stream else {}),
        **({"replay tokens": stream["replay"]["tokens"],
            "replay share": round(stream["replay"]["realised_share"], 4)} if "replay" in stream else {}),
        "tokens tokenized": tokens_total, "tokens in stream": stream["total_sequences"] * stream["seq_len"],
        "tokenize tokens/s": tokens_total / tokenize_s if tokenize_s else 0.0,
        "read+tokenize s": read_s,
    }
    for sd in domains:
        extra[f"epochs {sd['name']}"] = sd["epochs"]
    for st in stream["stages"]:
        extra[f"stage {st['name']} tokens"] = (st["end"] - st["start"]) * stream["seq_len"]
    return extra


def _npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _tokenizer_ref(spec: str | None) -> str:
    """The tokenizer as the stream records it: an absolute path when it is one (train may run elsewhere)."""
    p = Path(str(spec))
    return str(p.resolve()) if p.exists() else str(spec)


def load_stream(path: str | Path) -> dict:
    """Read a stream's ``_stream.json`` (raises CptkitError when ``path`` is not a stream)."""
    p = Path(path) / STREAM
    if not p.exists():
        raise CptkitError(f"{path}: not a build-mix stream (no {STREAM}); run cptkit build-mix first")
    return json.loads(p.read_text())


