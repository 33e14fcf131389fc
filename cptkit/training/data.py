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
from cptkit.steps.build_mix import load_stream


class Stream:
    """Memory-mapped token files of a build-mix output."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = load_stream(self.path)
        self.seq_len = int(self.meta["seq_len"])
        self.eos = int(self.meta["eos_token_id"])
        self.domains: list[str] = [d["name"] for d in self.meta["domains"]]
        self.index = {n: i for i, n in enumerate(self.domains)}
        self.parents = {d["name"]: d["parent"] for d in self.meta["domains"]}
        self.tokens = [np.memmap(self.path / d["file"], dtype=self.meta["dtype"], mode="r")
                       if d["tokens"] else np.zeros(0, dtype=self.meta["dtype"]) for d in self.meta["domains"]]
        self.sequences = [int(d["sequences"]) for d in self.meta["domains"]]
        self.plan = np.load(self.path / self.meta["plan"], mmap_mode="r")

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
        p = self.path / self.meta["eval"]
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

    def draw(self, n: int, weights: dict[str, float] | None) -> list[tuple[int, int]]:
        """The next ``n`` (domain, sequence index) pairs: from the plan when ``weights`` is None."""
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
