"""Reading a build-mix stream during training: per-domain packed sequences and the sampler.

The sampler draws the domain of every sequence of a global batch, either from the stream's
plan (``staged``: stages, upsampling tail and curriculum exactly as built) or from the current
mixture weights (every other controller), and takes the next sequence of that domain (each
domain cycles through its own sequences in stream order, so a PPL curriculum is kept). All
ranks make the same draws and each takes its slice, so data order does not depend on the
number of processes' timing. Its state (position, per-domain cursors, RNG) is part of a
checkpoint.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.errors import CptkitError

STREAM = "_stream.json"
FORMAT = "cptkit-stream/1"
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
