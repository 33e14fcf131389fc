"""Distillation to the base (``train.distill``; docs/forgetting.md): the step's loss is
CE + λ · KL(teacher ‖ student), the KL per token averaged over the selected tokens of each micro-batch
(``on=replay``: the rows of the stream's replay domains; ``all``: every row), at every position that
predicts a next token in the sequence.

Two teachers, one term:

* **teacher forward**: a frozen copy of the model the run starts from (or ``train.distill.teacher``),
  in the student's precision, runs on the same batch; KL over the whole vocabulary
  (:func:`kl_full`).
* **stored top-k** (no teacher at training time): the stream's replay holds the base's top-k
  log-probabilities for each token of its self samples (``mix.replay.self.topk``); KL between the
  teacher's and the student's distributions both renormalised over those k ids (:func:`kl_topk`).
  At k = vocabulary size and the same context this is :func:`kl_full` exactly. The stored
  distributions are those of each sample's own prefix from BOS (what its tokens were drawn from),
  while the teacher forward sees the packed sequence (a sample cut where the sequence starts, the
  previous sample before it); the two agree where the packed context is the sample's own.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log


def kl_full(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) per position over the whole vocabulary, in fp32 (shape: the logits' minus the last)."""
    t = torch.log_softmax(teacher_logits.float(), dim=-1)
    s = torch.log_softmax(student_logits.float(), dim=-1)
    return (t.exp() * (t - s)).sum(-1)


def kl_topk(student_logits: torch.Tensor, ids: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """KL(teacher ‖ student) per position over the teacher's top-k ids (``ids``, ``logprobs``: [..., k]),
    both distributions renormalised over them; a ``-inf`` log-prob is an id without mass."""
    t = torch.log_softmax(logprobs.float(), dim=-1)
    s = torch.log_softmax(student_logits.float().gather(-1, ids), dim=-1)
    p = t.exp()
    return torch.where(p > 0, p * (t - s), torch.zeros_like(p)).sum(-1)


class Distiller:
    """The run's distillation term: which rows it covers, its teacher (a frozen model, or the stream's
    stored top-k), and the KL of each micro-batch. Holds no state across steps: a resumed run rebuilds
    it from the same model and files."""

    def __init__(self, spec: Any, build_teacher: Any):
        dcfg = spec.tcfg.distill
        stream = spec.stream
        self.kl = float(dcfg.kl)
        self.on = dcfg.on
        self.stream = stream
        self.replay = set(stream.replay_domains())  # the train step refused on=replay without any
        stored = self.replay and all(stream.topk[d] is not None for d in self.replay)
        self.mode = "topk" if self.on == "replay" and stored and not dcfg.teacher else "teacher"
        self.teacher = None if self.mode == "topk" else build_teacher(dcfg.teacher)
        if self.teacher is not None:
            self.teacher.eval()
            for p in self.teacher.parameters():
                p.requires_grad_(False)
        self.kl_sum = 0.0
        self.tokens = 0
        log.info("train.distill: λ=%g on %s tokens, %s", self.kl, self.on,
                 "stored top-k log-probs (no teacher forward)" if self.mode == "topk"
                 else f"teacher {dcfg.teacher or 'the starting model'}")

    def attach(self, engine: Any) -> None:
        """Put the teacher beside the student: its device and precision (autocast as the torch engine's)."""
        self.engine = engine
        if self.teacher is not None:
            theirs, ours = (m.get_output_embeddings().weight.shape[0] for m in (self.teacher, engine.module))
            if theirs != ours:
                raise CptkitError(f"train.distill.teacher: its output has {theirs} logits, the model's {ours}: "
                                  "the teacher must share the model's vocabulary")
            p = next(engine.module.parameters())
            self.teacher.to(device=p.device, dtype=p.dtype)

    def rows(self, pairs: list[tuple[int, int]]) -> list[bool]:
        return [self.on == "all" or d in self.replay for d, _ in pairs]

    def term(self, logits: torch.Tensor, x: torch.Tensor, pairs: list[tuple[int, int]]) -> torch.Tensor | None:
        """The mean KL over this micro-batch's selected tokens (None when it has none); adds to the step's log."""
        sel = torch.tensor(self.rows(pairs), device=logits.device)
        if not bool(sel.any()):
            return None
        student = logits[:, :-1]
        if self.mode == "teacher":
            autocast = getattr(self.engine, "_autocast", False)
            ctx = torch.autocast(self.engine.device, dtype=self.engine._dtype) if autocast else nullcontext()
            with torch.no_grad(), ctx:
                teacher = self.teacher(input_ids=x).logits[:, :-1]  # type: ignore[misc]
            per = kl_full(student, teacher)
            mask = sel[:, None].expand_as(per)
        else:
            ids, lp, has = self.stored(pairs, logits.device)
            per = kl_topk(student, ids[:, 1:], lp[:, 1:])
            mask = sel[:, None] & has[:, 1:]
        n = int(mask.sum())
        if n == 0:
            return None
        total = (per * mask).sum()
        self.kl_sum += float(total.detach())
        self.tokens += n
        return total / n

    def stored(self, pairs: list[tuple[int, int]], device: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's stored top-k (ids, log-probs) and which positions have them (a NaN row has none;
        such rows are given a harmless uniform target, masked out)."""
        k = max(self.stream.topk[d][0].shape[1] for d in self.replay)  # type: ignore[index]
        L = self.stream.seq_len
        ids = np.zeros((len(pairs), L, k), dtype=np.int64)
        lp = np.full((len(pairs), L, k), np.nan, dtype=np.float32)
        for r, (d, s) in enumerate(pairs):
            got = self.stream.sequence_topk(d, s) if d in self.replay else None
            if got is not None:
                kk = got[0].shape[1]
                ids[r, :, :kk], lp[r, :, :kk] = got
                lp[r, :, kk:] = -np.inf
        has = np.isfinite(lp[:, :, 0])
        lp[~has] = 0.0
        return (torch.from_numpy(ids).to(device), torch.from_numpy(lp).to(device),
                torch.from_numpy(has).to(device))

    def take(self, world: int) -> float:
        """The step's mean KL per selected token (over every rank), and reset for the next step."""
        t = torch.tensor([self.kl_sum, float(self.tokens)], dtype=torch.float64,
                         device=getattr(self.engine, "device", None) or "cpu")
        if world > 1:
            torch.distributed.all_reduce(t)
        self.kl_sum, self.tokens = 0.0, 0
        return float(t[0] / t[1]) if t[1] > 0 else 0.0
