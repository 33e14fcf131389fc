"""The build-mix stream format, written and read in one place (docs/mixing.md).

A stream directory holds ``_stream.json`` (format ``cptkit-stream/1``: sequence length, token
dtype, EOS, vocabulary, tokenizer, the domain table, stages), one token file per leaf domain
(``tokens/dNNN.bin``: the domain's documents in their order, EOS after each) with document offsets
(``tokens/dNNN.docs.npy``), ``plan.npy`` ((domain, sequence) for the whole budget, stage by stage)
and ``_eval.jsonl.gz`` (held-out documents per domain).

* Writing (build-mix): :class:`DomainFiles` + :func:`route_and_tokenize` (route and tokenize),
  :func:`write_domains` (order, pack, write), :func:`plan_stream`, :func:`eval_bytes`,
  :func:`stream_info`.
* Reading (train): :class:`Stream` (per-domain packed sequences) and :class:`Sampler` (the
  domain of every sequence of a global batch, from the plan or from mixture weights; its state is
  part of a checkpoint).
"""

from __future__ import annotations

import gzip
import heapq
import itertools
import json
import math
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cptkit.core.errors import CptkitError, is_panic, quiet_panics
from cptkit.core.progress import log
from cptkit.core.records import Record, dumps
from cptkit.core.shards import atomic_write_bytes
from cptkit.mixtures.recipe import (
    Domain,
    Router,
    allocate,
    apply_replay,
    check_budget,
    curriculum_order,
    plan_counts,
    replay_leaves,
    resolve_weights,
    stage_spec_weights,
)
from cptkit.text.encode import encode_many
from cptkit.text.hashing import fast_seeded_hash

if TYPE_CHECKING:
    from cptkit.mixtures.recipe import CurriculumConfig, MixConfig

STREAM = "_stream.json"
EVAL = "_eval.jsonl.gz"
REPLAY = "replay"  # the domain of a replay source other than the pool (mix.replay.source=self or a path)
FORMAT = "cptkit-stream/1"
BATCH_CHARS = 1_000_000  # characters per tokenizer batch at most (build_mix.batch_docs documents)


# --- writing --------------------------------------------------------------------------------
@dataclass
class MixSettings:
    """The validated recipe (the typed ``mix`` config) and the options every phase reads."""

    mix: MixConfig
    seed: int
    seq_len: int
    budget: int
    stages: list[dict]
    fractions: list[float]
    cur: CurriculumConfig
    router: Router
    replay_names: list[str]
    replay_share: float
    unique: bool
    eval_k: int
    batch_docs: int
    replay_source: str = "pool"  # pool | self | a path: the latter two are the domain REPLAY
    replay_drop: list[str] = field(default_factory=list)  # pool domains that get no weight (source not pool)

    @property
    def order(self) -> str:
        return self.cur.order


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
        self.topk: dict[str, list[tuple[np.ndarray, np.ndarray] | None]] = {}  # per emitted document, by domain
        self.vocab = len(tok)
        self.tokenize_s = 0.0
        self._ppl_domains = set(s.cur.domains)

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

    def emit(self, d: Domain, rid: str, ids: list[int], ppl: float,
             topk: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        if topk is not None or d.name in self.topk:
            self.topk.setdefault(d.name, [None] * d.docs).append(topk)
        arr = np.asarray(ids + [self.eos], dtype=self.dtype)
        d.file.write(arr.tobytes())
        d.lengths.append(len(arr))
        d.ids.append(rid)
        d.ppl.append(ppl)
        d.docs += 1
        d.tokens += len(arr)

    def encode(self, batch: list[tuple[str, Record]]) -> list[list[int]]:
        """The batch's token ids (a long text in pieces: bounded memory). Touches nothing else, so it
        may run in a thread beside the reading (the Rust tokenizer releases the GIL)."""
        t = time.perf_counter()
        # self samples keep the ids the base sampled; only the other records are tokenized
        sampled = {i: self.sampled_ids(rec) for i, (name, rec) in enumerate(batch)
                   if name == REPLAY and rec.get("token_ids") is not None}
        texts = [r["text"] for i, (_, r) in enumerate(batch) if i not in sampled]
        try:
            with quiet_panics():  # a Rust panic: one line below, not the hook's notice and backtrace too
                encoded = iter(encode_many(self.tok, texts) if texts else [])
        except BaseException as e:  # a Rust panic is no Exception
            if not is_panic(e):
                raise
            with quiet_panics():
                err = self.panic(batch, e)
            raise err from None
        enc = [sampled[i] if i in sampled else next(encoded) for i in range(len(batch))]
        self.tokenize_s += time.perf_counter() - t
        return enc

    def panic(self, batch: list[tuple[str, Record]], e: BaseException) -> CptkitError:
        """The one line for a tokenizer that panicked on ``batch``: the record it panics on (each
        encoded alone, up to the first that does) and the panic's message."""
        name = getattr(self.tok, "name_or_path", None) or "the tokenizer"
        why = (str(e).splitlines() or ["no message"])[0][:200]
        for _, rec in batch:
            try:
                encode_many(self.tok, [rec["text"]])
            except BaseException as one:
                if not is_panic(one):
                    raise
                return CptkitError(f"tokenizer {name}: panicked on record {str(rec['id'])[:100]!r}: {why}")
        return CptkitError(f"tokenizer {name}: panicked on a batch of {len(batch)} records: {why}")

    def sampled_ids(self, rec: Record) -> list[int]:
        """A replay record's own ``token_ids`` (a base's samples: decoding and encoding them again need
        not give the same ids), checked against the vocabulary."""
        ids = rec["token_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and 0 <= t < self.vocab for t in ids):
            raise CptkitError(f"mix.replay.source: record {rec['id']!r}: token_ids must be a list of token ids "
                              f"below the tokenizer's {self.vocab} (sampled with another tokenizer?)")
        return ids

    def sampled_topk(self, rec: Record, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """A replay record's ``topk_ids`` / ``topk_logprobs``: one row per token and one for the EOS."""
        if rec.get("topk_ids") is None:
            return None
        try:
            ids = np.asarray(rec["topk_ids"], dtype=np.int64)
            lp = np.asarray(rec["topk_logprobs"], dtype=np.float32)
        except (KeyError, TypeError, ValueError):
            ids = lp = np.zeros(0)
        if ids.ndim != 2 or ids.shape != lp.shape or len(ids) != n + 1 or ids.min(initial=0) < 0 \
                or ids.max(initial=0) >= self.vocab:
            raise CptkitError(f"mix.replay.source: record {rec['id']!r}: topk_ids/topk_logprobs must be "
                              f"{n + 1} rows (its {n} tokens and the EOS) of equal length, ids below {self.vocab}")
        return ids.astype(np.int32), lp

    def file(self, batch: list[tuple[str, Record]], enc: list[list[int]]) -> None:
        """File a tokenized batch: PPL scores for a curriculum, the held-out heap, the raw files."""
        ppls = [float("nan")] * len(batch)
        score = [i for i, (name, _) in enumerate(batch) if self.wants_ppl(name)]
        if score:
            from cptkit.models.scoring import document_losses  # deferred: torch

            model, stok = self.scorer
            res = document_losses(model, stok, [batch[i][1]["text"] for i in score],
                                  batch_size=self.s.cur.batch_size, max_tokens=self.s.cur.max_tokens)
            for i, (nll, n) in zip(score, res, strict=True):
                ppls[i] = math.exp(nll / n) if n else float("inf")
        eval_k, seed = self.s.eval_k, self.s.seed
        for (name, rec), ids, p in zip(batch, enc, ppls, strict=True):
            if not ids:
                continue
            d = self.leaf(name)
            rid = str(rec["id"])
            topk = self.sampled_topk(rec, len(ids)) if name == REPLAY else None
            if eval_k > 0:  # keep the eval_k docs with the smallest hash as held-out eval set
                item = (-fast_seeded_hash(seed, rid), rid, {"id": rid, "text": rec["text"], "domain": name, "_ids": ids,
                                                            "_ppl": p, "_topk": topk})
                if len(d.heldout) < eval_k:
                    heapq.heappush(d.heldout, item)  # type: ignore[arg-type]
                    continue
                if item[0] > d.heldout[0][0]:
                    item = heapq.heapreplace(d.heldout, item)  # type: ignore[arg-type]
                rec2 = item[2]
                self.emit(d, rec2["id"], rec2["_ids"], rec2["_ppl"], rec2["_topk"])
            else:
                self.emit(d, rid, ids, p, topk)

    def close(self) -> None:
        for d in self.leaves.values():
            if d.docs == 0 and d.heldout:  # a tiny domain: its eval docs must also be trained on
                log.warning("domain %s has only %d documents: they are both eval and training documents",
                            d.name, len(d.heldout))
                for _, _, rec2 in sorted(d.heldout, key=lambda t: (-t[0], t[1])):
                    self.emit(d, rec2["id"], rec2["_ids"], rec2["_ppl"], rec2["_topk"])
            d.file.close()


@dataclass
class RouteStats:
    records_in: int = 0
    unmatched: int = 0
    repeated: int = 0


def sample_per_domain(routed: Iterable[tuple[str, Record]], k: int, seed: int) -> Iterator[tuple[str, Record]]:
    """The ``k`` records of each domain with the smallest seeded id hash, in their reading order.

    The hash is the one that picks the held-out documents (the ``eval_docs`` smallest), so a
    domain's held-out set is the same with or without the cap."""
    heaps: dict[str, list[tuple[int, int, Record]]] = {}
    for n, (name, rec) in enumerate(routed):
        heap = heaps.setdefault(name, [])
        item = (-fast_seeded_hash(seed, str(rec["id"])), -n, rec)  # max-heap on (hash, position)
        if len(heap) < k:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)
    kept = sorted((-neg_n, name, rec) for name, heap in heaps.items() for _, neg_n, rec in heap)
    for _, name, rec in kept:
        yield name, rec


def route_and_tokenize(records: Any, s: MixSettings, files: DomainFiles, replay: Any = ()) -> RouteStats:
    """Route every record to its leaf domain (skipping repeated ids with ``mix.unique_ids``) and
    tokenize in batches of ``build_mix.batch_docs``; with ``mix.max_docs`` only each domain's
    sample (:func:`sample_per_domain`) is tokenized. ``replay``: the records of a replay source
    other than the pool, every one in the domain :data:`REPLAY`."""
    st = RouteStats()
    routed = itertools.chain(_route(records, s, st), ((REPLAY, rec) for rec in replay))
    if s.mix.max_docs > 0:
        routed = sample_per_domain(routed, s.mix.max_docs, s.seed)
    # Batch k is tokenized in a thread while batch k+1 is read and parsed here (the Rust tokenizer
    # releases the GIL), then filed here in reading order: the same files, the reading overlapped.
    with ThreadPoolExecutor(1, thread_name_prefix="tokenize") as pool:
        pending: tuple[list, Future] | None = None
        for batch in _batches(routed, s.batch_docs):
            ahead = (batch, pool.submit(files.encode, batch))
            if pending is not None:
                files.file(pending[0], pending[1].result())
            pending = ahead
        if pending is not None:
            files.file(pending[0], pending[1].result())
    files.close()
    if not files.leaves:
        raise CptkitError(f"build-mix: none of the {st.records_in} records matched a domain filter")
    return st


def _batches(routed: Iterable[tuple[str, Record]], n: int,
             max_chars: int = BATCH_CHARS) -> Iterator[list[tuple[str, Record]]]:
    """``routed`` in lists of ``n`` records, or fewer when their texts reach ``max_chars`` characters
    (a tokenizer's encodings take ~300 bytes a character: two batches in flight stay bounded)."""
    batch: list[tuple[str, Record]] = []
    chars = 0
    for x in routed:
        batch.append(x)
        chars += len(x[1]["text"])
        if len(batch) >= n or chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _route(records: Any, s: MixSettings, st: RouteStats) -> Iterator[tuple[str, Record]]:
    """``(leaf, record)`` for every record that matches a domain, counting into ``st``."""
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
        yield name, rec


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
            perm, groups = curriculum_order(np.asarray(d.ppl), order, s.cur.groups, rng_seed)
        elif order == "none":
            perm = np.arange(d.docs)
        else:
            perm = np.random.default_rng(rng_seed).permutation(d.docs)
        raw = np.fromfile(files.raw_path(d), dtype=files.dtype)
        fname = f"d{d.index:03d}"
        if (perm == np.arange(d.docs)).all():  # as read: the raw file is already the domain's token file
            final = raw
        else:
            final = np.concatenate([raw[starts[i]:starts[i] + lengths[i]] for i in perm]) if d.docs else raw[:0]
        atomic_write_bytes(tok_dir / f"{fname}.bin", final.tobytes())
        offsets = np.concatenate([[0], np.cumsum(lengths[perm])]).astype(np.int64)
        atomic_write_bytes(tok_dir / f"{fname}.docs.npy", npy_bytes(offsets))
        files.raw_path(d).unlink()
        topk = write_topk(files.topk.get(name), perm, lengths, tok_dir, fname)
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
            **({"topk": topk} if topk else {}),
        })
    for sd in stream_domains:
        if sd["sequences"] == 0:
            log.warning("domain %s has %d tokens, fewer than one sequence of %d", sd["name"], sd["tokens"], s.seq_len)
    return stream_domains


def write_topk(docs: list[tuple[np.ndarray, np.ndarray] | None] | None, perm: np.ndarray, lengths: np.ndarray,
               tok_dir: Path, fname: str) -> dict[str, Any] | None:
    """A domain's stored top-k log-probs (self samples) in its token order: ``tokens/NAME.topk_ids.npy``
    and ``.topk_lp.npy``, one row per token; a document without them gets rows of NaN (no target)."""
    if not docs or all(x is None for x in docs):
        return None
    k = max(x[0].shape[1] for x in docs if x is not None)
    ids, lps = [], []
    for i in perm:
        x = docs[i]
        n = int(lengths[i])
        a = np.zeros((n, k), dtype=np.int32)
        b = np.full((n, k), np.nan, dtype=np.float32)
        if x is not None:
            a[:, :x[0].shape[1]], b[:, :x[1].shape[1]] = x[0], x[1]
            b[:, x[1].shape[1]:] = -np.inf  # a shorter k: the missing entries have no mass
        ids.append(a)
        lps.append(b)
    out = {"k": int(k), "ids": f"tokens/{fname}.topk_ids.npy", "logprobs": f"tokens/{fname}.topk_lp.npy"}
    atomic_write_bytes(tok_dir / f"{fname}.topk_ids.npy", npy_bytes(np.concatenate(ids)))
    atomic_write_bytes(tok_dir / f"{fname}.topk_lp.npy", npy_bytes(np.concatenate(lps)))
    return out


@dataclass
class Plan:
    """Which sequence of which domain the trainer reads at each position, stage by stage."""

    rows: np.ndarray  # (sequences, 2): domain index, sequence index in the domain's order
    stages: list[dict]
    fill: list[str]
    replay: list[str]
    replay_tokens: int
    epochs: dict[str, float]


def replay_weights(stage_w: list[dict[str, float]], leaves: dict[str, Domain], s: MixSettings
                   ) -> tuple[list[str], list[dict[str, float]]]:
    """The replay leaves and each stage's weights with them at ``mix.replay.share``; a source other than
    the pool also takes the pool's ``mix.replay.domains`` out of the stages (as at share 0)."""
    replay = replay_leaves(s.replay_names, leaves)
    if s.replay_names and not replay:
        if s.replay_source == "pool":
            raise CptkitError(f"mix.replay.domains={s.replay_names}: no documents matched these domains")
        raise CptkitError(f"mix.replay.source={s.replay_source}: no replay documents (every record empty?)")
    tokens = {n: d.tokens for n, d in leaves.items()}
    names = [str(st.get("name", i)) for i, st in enumerate(s.stages)]
    dropped = replay_leaves(s.replay_drop, leaves)
    if dropped:
        stage_w = [apply_replay(w, dropped, 0.0, tokens, names[i]) for i, w in enumerate(stage_w)]
    if s.replay_names:
        stage_w = [apply_replay(w, replay, s.replay_share, tokens, names[i]) for i, w in enumerate(stage_w)]
    return replay, stage_w


def plan_stream(stream_domains: list[dict], leaves: dict[str, Domain], s: MixSettings) -> Plan:
    """Sequences per stage and domain (weights, replay, fill, ``max_epochs`` caps), interleaved at
    random per stage from ``(seed, stage)``; sets each domain's epochs and planned tokens."""
    mix, seq_len, stages, fractions = s.mix, s.seq_len, s.stages, s.fractions
    available = {sd["name"]: sd["sequences"] for sd in stream_domains}
    check_budget(s.budget, seq_len, available, mix.max_epochs)
    total_seqs = s.budget // seq_len
    stage_seqs = allocate(total_seqs, {str(i): f for i, f in enumerate(fractions)})
    stage_w = [resolve_weights(stage_spec_weights(st, leaves, s.budget, fractions[i], mix.fill, i), leaves,
                               s.router.specs, str(st.get("name", i)), mix.empty_domains)
               for i, st in enumerate(stages)]
    replay, stage_w = replay_weights(stage_w, leaves, s)
    for i, w in enumerate(stage_w):
        empty = [k for k, v in w.items() if v > 0 and available[k] == 0]
        if empty:
            raise CptkitError(f"mix stage {stages[i].get('name', i)!r}: domain {empty[0]!r} has weight but "
                              f"fewer than {seq_len} tokens")
    fill = []
    if mix.fill:
        fill = [n for n in available if n == mix.fill or n.split("/", 1)[0] == mix.fill]
        if not fill:
            raise CptkitError(f"mix.fill={mix.fill!r}: no documents matched that domain")
    counts, capped = plan_counts([stage_seqs[str(i)] for i in range(len(stages))], stage_w, available,
                                 mix.max_epochs, fill)
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
        if epochs[k] > mix.max_epochs:
            log.warning("fill domain %s is repeated %.2f times (above mix.max_epochs=%g)", k, epochs[k],
                        mix.max_epochs)
    return Plan(rows=plan.astype(np.int64), stages=stage_info, fill=fill, replay=replay,
                replay_tokens=sum(cursor[k] for k in replay) * seq_len, epochs=epochs)


def eval_bytes(stream_domains: list[dict], leaves: dict[str, Domain]) -> bytes:
    """The held-out documents of every domain as JSONL.gz (fixed mtime: same bytes every run)."""
    lines = []
    for sd in stream_domains:
        for _, _, rec in sorted(leaves[sd["name"]].heldout, key=lambda t: (-t[0], t[1])):
            lines.append(dumps({k: v for k, v in rec.items() if not k.startswith("_")}))
    return gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)


def stream_info(s: MixSettings, tokenizer: str | None, tok: Any, dtype: np.dtype, stream_domains: list[dict],
                plan: Plan, read: RouteStats) -> dict:
    """``_stream.json``: what the trainer needs to read the stream (format cptkit-stream/1)."""
    n_seqs = int(len(plan.rows))
    stream = {
        "format": "cptkit-stream/1", "seq_len": s.seq_len, "dtype": dtype.name, "eos_token_id": int(tok.eos_token_id),
        "vocab_size": len(tok), "tokenizer": tokenizer_ref(tokenizer), "mix": s.mix.name or "",
        "budget_tokens": s.budget, "total_sequences": n_seqs, "plan": "plan.npy", "eval": EVAL,
        "domains": stream_domains, "stages": plan.stages, "fill": plan.fill, "max_epochs": s.mix.max_epochs,
        "seed": s.seed,
    }
    if s.replay_names:
        stream["replay"] = {
            "share": s.replay_share, "domains": plan.replay, "tokens": plan.replay_tokens,
            **({"source": s.replay_source} if s.replay_source != "pool" else {}),
            "realised_share": plan.replay_tokens / max(n_seqs * s.seq_len, 1),
            "epochs": {k: round(plan.epochs[k], 4) for k in plan.replay},
        }
    if s.unique:
        stream["repeated_ids_skipped"] = read.repeated
    return stream


def npy_bytes(arr: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def tokenizer_ref(spec: str | None) -> str:
    """The tokenizer as the stream records it: an absolute path when it is one (train may run elsewhere)."""
    p = Path(str(spec))
    return str(p.resolve()) if p.exists() else str(spec)


# --- reading --------------------------------------------------------------------------------
_DOMAIN_KEYS = ("name", "parent", "tokens", "sequences")
_KEYS = ("seq_len", "dtype", "eos_token_id", "vocab_size", "domains", "plan", "total_sequences")


def read_stream_meta(path: Path) -> dict[str, Any]:
    """Read and check a stream's ``_stream.json``: valid JSON, the keys train needs, sane values."""
    p = path / STREAM
    if not p.is_file():
        raise CptkitError(f"{path}: not a build-mix stream (no {STREAM}); run cptkit build-mix first")
    try:
        meta = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CptkitError(f"{p}: malformed JSON ({e}); rebuild the stream with cptkit build-mix") from None
    if not isinstance(meta, dict):
        raise CptkitError(f"{p}: malformed stream description (a JSON object expected)")
    missing = [k for k in _KEYS if k not in meta]
    if missing:
        raise CptkitError(f"{p}: malformed stream description: no {missing[0]!r}")
    fmt = meta.get("format", FORMAT)
    if fmt != FORMAT:
        raise CptkitError(f"{p}: format {fmt!r} is not {FORMAT!r}")
    try:
        if int(meta["seq_len"]) < 2 or int(meta["vocab_size"]) < 1:
            raise ValueError("seq_len < 2 or vocab_size < 1")
        if np.dtype(meta["dtype"]).kind not in "ui":
            raise ValueError(f"dtype {meta['dtype']!r} is not an integer type")
        int(meta["eos_token_id"])
        if not isinstance(meta["domains"], list) or not meta["domains"]:
            raise ValueError("no domains")
        for i, d in enumerate(meta["domains"]):
            if not isinstance(d, dict) or any(k not in d for k in _DOMAIN_KEYS) or (int(d["tokens"]) and "file" not in d):
                raise ValueError(f"domain #{i} lacks one of {', '.join(_DOMAIN_KEYS)}, file")
            if int(d["tokens"]) < 0:
                raise ValueError(f"domain {d['name']!r} has a negative token count")
    except (TypeError, ValueError) as e:
        raise CptkitError(f"{p}: malformed stream description: {e}") from None
    return meta


class Stream:
    """Memory-mapped token files of a build-mix output, validated on open (one-line errors)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = read_stream_meta(self.path)
        meta, where = self.meta, self.path / STREAM
        self.seq_len = int(meta["seq_len"])
        self.eos = int(meta["eos_token_id"])
        self.domains: list[str] = [d["name"] for d in meta["domains"]]
        self.index = {n: i for i, n in enumerate(self.domains)}
        self.parents = {d["name"]: d["parent"] for d in meta["domains"]}
        itemsize = np.dtype(meta["dtype"]).itemsize
        self.tokens = []
        for d in meta["domains"]:
            n_tok = int(d["tokens"])
            if not n_tok:
                self.tokens.append(np.zeros(0, dtype=meta["dtype"]))
                continue
            f = self.inside(d["file"], f"domain {d['name']!r} file")
            if not f.is_file():
                raise CptkitError(f"{f}: token file of domain {d['name']!r} is missing ({where} lists it)")
            size = f.stat().st_size
            if size != n_tok * itemsize:
                raise CptkitError(f"{f}: {size:,} bytes, but {where} says {n_tok:,} {meta['dtype']} tokens "
                                  f"({n_tok * itemsize:,} bytes): truncated or replaced; rebuild the stream")
            self.tokens.append(np.memmap(f, dtype=meta["dtype"], mode="r"))
        self.topk: list[tuple[np.ndarray, np.ndarray] | None] = [self._topk(d, toks) for d, toks
                                                                   in zip(meta["domains"], self.tokens, strict=True)]
        self.sequences = [int(d["sequences"]) for d in meta["domains"]]
        for d, n, toks in zip(self.domains, self.sequences, self.tokens, strict=True):
            if n < 0 or n * self.seq_len > len(toks):
                raise CptkitError(f"{where}: domain {d!r} claims {n} sequences of {self.seq_len} tokens, "
                                  f"more than its {len(toks):,} tokens")
        plan = self.inside(meta["plan"], "plan")
        if not plan.is_file():
            raise CptkitError(f"{plan}: the stream's plan is missing; rebuild the stream with cptkit build-mix")
        try:
            self.plan = np.load(plan, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise CptkitError(f"{plan}: not a readable plan ({str(e).splitlines()[0]})") from None
        if self.plan.ndim != 2 or (len(self.plan) and self.plan.shape[1] != 2):
            raise CptkitError(f"{plan}: expected (sequences, 2) domain/sequence pairs, got shape {self.plan.shape}")
        if len(self.plan):
            dom = np.asarray(self.plan[:, 0])
            if dom.min() < 0 or dom.max() >= len(self.domains):
                raise CptkitError(f"{plan}: domain index out of range (the stream has {len(self.domains)} domains)")

    def _topk(self, d: dict[str, Any], toks: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """A domain's stored top-k log-probs (ids, log-probs), memory-mapped and checked: one row per token."""
        info = d.get("topk")
        if not info:
            return None
        arrays = []
        for key in ("ids", "logprobs"):
            f = self.inside(info.get(key) if isinstance(info, dict) else None, f"domain {d['name']!r} topk {key}")
            try:
                arrays.append(np.load(f, mmap_mode="r", allow_pickle=False))
            except (ValueError, OSError, EOFError) as e:
                raise CptkitError(f"{f}: not a readable top-k file ({str(e).splitlines()[0]}); rebuild the stream") from None
        ids, lp = arrays
        if ids.ndim != 2 or ids.shape != lp.shape or len(ids) != len(toks):
            raise CptkitError(f"{self.path / STREAM}: domain {d['name']!r}: its top-k files hold {ids.shape} and "
                              f"{lp.shape}, not one row per token ({len(toks):,}); rebuild the stream")
        return ids, lp

    def sequence_topk(self, domain: int, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The stored top-k (ids, log-probs) of sequence ``k`` of ``domain`` (rows as :meth:`sequence`'s
        tokens), or None when the domain has none."""
        tk = self.topk[domain]
        if tk is None:
            return None
        k %= self.sequences[domain]
        sl = slice(k * self.seq_len, (k + 1) * self.seq_len)
        return np.asarray(tk[0][sl], dtype=np.int64), np.asarray(tk[1][sl], dtype=np.float32)

    def replay_domains(self) -> list[int]:
        """The indices of the stream's replay domains (``_stream.json``'s ``replay``)."""
        names = (self.meta.get("replay") or {}).get("domains") or []
        return [self.index[n] for n in names if n in self.index]

    def inside(self, rel: Any, what: str) -> Path:
        """``rel`` resolved inside the stream directory; paths that leave it are refused."""
        if not isinstance(rel, str) or not rel:
            raise CptkitError(f"{self.path / STREAM}: {what} must be a relative path, got {rel!r}")
        root = self.path.resolve()
        p = (root / rel).resolve()
        if Path(rel).is_absolute() or not p.is_relative_to(root):
            raise CptkitError(f"{self.path / STREAM}: {what} {rel!r} points outside the stream directory")
        return p

    def tokenizer_spec(self) -> str:
        """The stream's tokenizer: a name (smollm2) or a path, resolved against the current directory,
        then the stream's; a relative path found in neither is an error naming both."""
        spec = self.meta.get("tokenizer")
        if not spec or spec == "None":
            raise CptkitError(f"{self.path / STREAM}: records no tokenizer; pass tokenizer=PATH")
        spec = str(spec)
        p = Path(spec)
        if p.is_absolute():
            return spec
        for cand in (p, self.path / p):
            if cand.exists():
                return str(cand.resolve())
        if "/" not in spec and not spec.endswith(".gguf"):
            return spec  # a name such as smollm2
        raise CptkitError(f"{self.path / STREAM}: tokenizer {spec!r} is a relative path found neither from "
                          f"{Path.cwd()} nor from the stream; pass tokenizer=PATH")

    def sequence(self, domain: int, k: int) -> np.ndarray:
        n = self.sequences[domain]
        if n == 0:
            raise CptkitError(f"{self.path}: domain {self.domains[domain]!r} has no full sequence to sample")
        k %= n
        return np.asarray(self.tokens[domain][k * self.seq_len:(k + 1) * self.seq_len], dtype=np.int64)

    def stage_weights(self, stage: int = 0) -> dict[str, float]:
        w = self.meta["stages"][stage]["weights"]
        return {d: float(w.get(d, 0.0)) for d in self.domains}

    def token_weights(self) -> dict[str, float]:
        tot = sum(d["tokens"] for d in self.meta["domains"])
        return {d["name"]: d["tokens"] / tot for d in self.meta["domains"]}

    def eval_records(self) -> list[dict[str, Any]]:
        p = self.inside(self.meta["eval"], "eval")
        if not p.exists():
            return []
        with gzip.open(p, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]


class Sampler:
    """Deterministic global-batch sampler over a :class:`Stream`; ``state_dict`` for resume."""

    def __init__(self, stream: Stream, seed: int):
        self.stream = stream
        self.rng = np.random.default_rng(seed)
        self.position = 0  # sequences drawn so far (plan position)
        self.cursor = [0] * len(stream.domains)
        self.drawn = [0] * len(stream.domains)
        self.ppl_ordered = [(d.get("curriculum") or {}).get("order") in ("low_to_high", "high_to_low")
                            for d in stream.meta["domains"]]

    def draw(self, n: int, weights: dict[str, float] | None, ordered: bool = True) -> list[tuple[int, int]]:
        """The next ``n`` (domain, sequence index) pairs: from the plan when ``weights`` is None.

        ``ordered=False`` (a stage without curriculum): PPL-ordered domains give a random sequence
        instead of their next one (seeded; their position is kept for a later ordered stage).
        """
        out = []
        if weights is None:
            plan = self.stream.plan
            if len(plan) == 0:
                raise CptkitError(f"{self.stream.path}: the stream's plan is empty")
            for i in range(n):
                d, k = plan[(self.position + i) % len(plan)]
                out.append((int(d), int(k)))
        else:
            p = np.asarray([weights.get(d, 0.0) for d in self.stream.domains], dtype=np.float64)
            p = np.where(np.asarray(self.stream.sequences) > 0, p, 0.0)
            if p.sum() <= 0:
                raise CptkitError("mixture weights put no mass on a domain with sequences")
            doms = self.rng.choice(len(p), size=n, p=p / p.sum())
            for d in doms:
                if not ordered and self.ppl_ordered[d]:
                    out.append((int(d), int(self.rng.integers(max(self.stream.sequences[d], 1)))))
                    continue
                out.append((int(d), self.cursor[d]))
                self.cursor[d] += 1
        for d, _ in out:
            self.drawn[d] += 1
        self.position += n
        return out

    def batch(self, pairs: list[tuple[int, int]]) -> np.ndarray:
        return np.stack([self.stream.sequence(d, k) for d, k in pairs])

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "cursor": list(self.cursor), "drawn": list(self.drawn),
                "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])
        self.cursor = [int(c) for c in state["cursor"]]
        self.drawn = [int(c) for c in state["drawn"]]
        self.rng.bit_generator.state = state["rng"]
