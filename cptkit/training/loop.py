"""The training loop: set a run up (tokenizer, schedule, mixture, model, engine, callbacks, resume),
step it to its end (draw a batch by the mixture, one optimizer step) and write its outputs. What
happens around each step (evaluations, weight events, metrics, the proxy's stop, checkpoints) is
done by callbacks (:mod:`cptkit.training.callbacks`). Every random choice is seeded: a resumed run
continues to byte-identical files."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from cptkit.core.errors import CptkitError
from cptkit.core.output import TaskResult
from cptkit.core.progress import log
from cptkit.core.redact import redact
from cptkit.mixtures.factory import make_controller
from cptkit.mixtures.stages import draw_batch, plan_read
from cptkit.mixtures.stream import Sampler
from cptkit.mixtures.velocitune import ProxyRun
from cptkit.training.callbacks import Callback, arrange, load_callbacks
from cptkit.training.callbacks.checkpointer import CheckpointerCallback
from cptkit.training.callbacks.evaluator import EvaluatorCallback
from cptkit.training.callbacks.metrics import MetricsCallback
from cptkit.training.callbacks.mixture import MixtureCallback
from cptkit.training.callbacks.proxy import ProxyStopCallback
from cptkit.training.checkpoint import branch, branch_file, prepare_checkpoints, resume, same_stream
from cptkit.training.config import callback_specs
from cptkit.training.distill import Distiller
from cptkit.training.engine import make_engine
from cptkit.training.evaluation import EvalPoints
from cptkit.training.metrics import MetricsLog
from cptkit.training.model import (
    build_model,
    build_teacher,
    check_vocab,
    load_run_tokenizer,
    save_initial,
)
from cptkit.training.monitor import Monitor
from cptkit.training.outputs import write_outputs
from cptkit.training.schedule import Schedule, make_schedule
from cptkit.training.state import Engine, RunSpec, Stateful, TrainState


def plan_steps(spec: RunSpec) -> tuple[int, int, int, Schedule]:
    """(sequences per optimizer step, steps, the run's tokens, the LR schedule: the one source of the
    learning rate, from ``train.lr``)."""
    tcfg, stream, seq_len = spec.tcfg, spec.stream, spec.seq_len
    global_seqs = tcfg.micro_batch * tcfg.grad_accum * spec.world
    budget = tcfg.budget_tokens or float(stream.meta["total_sequences"] * seq_len)
    total_steps = tcfg.max_steps or max(1, math.ceil(budget / (global_seqs * seq_len)))
    try:
        schedule = make_schedule(tcfg.lr, total_steps, warmup=tcfg.warmup, decay=tcfg.decay, init_lr=tcfg.init_lr,
                                 decay_type=tcfg.decay_type, min_lr_ratio=tcfg.min_lr_ratio, kind=tcfg.schedule)
    except ValueError as e:
        raise CptkitError(f"train schedule ({total_steps} steps): {e}") from None
    return global_seqs, total_steps, total_steps * global_seqs * seq_len, schedule


PLAN_GAP = 0.05  # a staged run's largest share gap (read vs nominal) that is warned about


class Trainer:
    """One process's share of a run, set up by the constructor and stepped by :meth:`run`; what
    :class:`~cptkit.training.callbacks.Callback` s see of it is :class:`~cptkit.training.callbacks.Loop`."""

    def __init__(self, spec: RunSpec, has_ckpt: bool):
        conf, tcfg, stream = spec.conf, spec.tcfg, spec.stream
        specs = callback_specs(tcfg.callbacks)
        user_callbacks = load_callbacks(specs)  # a bad name or argument fails before any work
        self.spec = spec
        self.tokenizer = load_run_tokenizer(spec)
        self.global_seqs, self._total_steps, full_budget, schedule = plan_steps(spec)
        self.mixture = make_controller(tcfg.mixture_options(), stream, spec.proxy, self.total_steps * self.global_seqs,
                                       full_budget)
        self.proxy_run: ProxyRun | None = None
        self._stop_reason: str | None = None
        self._before_update = False  # in a step's pre_step (or on_stage): its update has not run yet
        if spec.proxy:  # the proxy follows the real run's schedule and stops early (Velocitune App. B)
            self.proxy_run = ProxyRun(tcfg.velocitune, self.total_steps, self.global_seqs * spec.seq_len)
            self._total_steps = self.proxy_run.max_steps
        self.plan_note = self._plan_read(stream)
        self.evals = EvalPoints(spec, self.mixture)
        torch.manual_seed(conf.seed)
        random.seed(conf.seed)  # its state is checkpointed too: the same bytes on every run of a seed
        np.random.seed(conf.seed % 2**32)  # and numpy's global generator's (training/state.py rng_state)
        model = build_model(conf.model, self.tokenizer, spec.seq_len, conf.trust_remote_code)
        check_vocab(model, stream)
        save_initial(spec, model, self.tokenizer)
        self.engine: Engine
        self.engine, self.engine_kind, self.engine_info = make_engine(
            model, tcfg, deepspeed_base=conf.deepspeed or {}, world=spec.world, schedule=schedule)
        self.distiller: Distiller | None = None
        if tcfg.distill.kl > 0:  # train.distill: a frozen teacher (or the stream's stored top-k) beside the student
            self.distiller = Distiller(spec, lambda path: build_teacher(spec, self.tokenizer, path))
            self.distiller.attach(self.engine)
            self.engine_info["distill"] = f"kl={tcfg.distill.kl:g} on {tcfg.distill.on}, {self.distiller.mode}"
        self.sampler = Sampler(stream, conf.seed)
        if tcfg.branch_from:  # a WSD decay branch: the trunk's weights and AdamW state (a resume below wins)
            at, saved = branch(self.engine, self.engine_kind, branch_file(tcfg.branch_from))
            self.engine_info["branched at step"] = at
            if same_stream(tcfg.branch_from, stream.path):  # its data order goes on: no sequence seen twice
                self.sampler.load_state_dict({**saved["sampler"], "position": 0})
        self.state = TrainState(weight_sum=dict.fromkeys(stream.domains, 0.0))
        proxy = [ProxyStopCallback(self.proxy_run)] if self.proxy_run is not None else []
        builtin: list[Callback] = [MixtureCallback(), EvaluatorCallback(), MetricsCallback(), *proxy,
                                   CheckpointerCallback()]
        self.callbacks = arrange(builtin, user_callbacks, specs)
        for cb in self.callbacks:
            cb.attach(self)
        self._info: dict[str, Any] = {}
        self.losses: list[float] = []
        self.w_now: dict[str, float] | None = None
        self.data_s = self.mix_s = 0.0
        self.log = self._open_log(has_ckpt)

    @property
    def total_steps(self) -> int:
        """The step the run ends after: planned, or lowered by :meth:`request_stop`."""
        return self._total_steps

    @property
    def step_metrics(self) -> Mapping[str, Any]:
        return MappingProxyType(self._info)

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def add_metrics(self, values: Mapping[str, Any]) -> None:
        """Add ``values`` to this step's metrics row (callbacks' ``pre_step``)."""
        self._info.update(values)

    def add_mixture_seconds(self, seconds: float) -> None:
        self.mix_s += seconds

    def request_stop(self, reason: str) -> None:
        """End the run after the current step (asked in ``pre_step``: the step about to run; in
        ``post_step``: the one just done, and later callbacks, the checkpointer among them, see it as
        the last; in ``pre_train``: before any further step)."""
        last = self.state.step + (1 if self._before_update else 0)
        if self._stop_reason is None:
            log.info("training stops at step %d: %s", last, reason)
        self._stop_reason = reason
        self._total_steps = min(self._total_steps, last)

    def callback_states(self) -> dict[str, Stateful]:
        return {cb.key: cb for cb in self.callbacks}

    def _plan_read(self, stream: Any) -> str | None:
        """A ``staged`` run that reads other than exactly its stream's plan: the largest share gap, warned
        when above :data:`PLAN_GAP` and kept for the manifest (None when the run reads the whole plan)."""
        n_run = self.total_steps * self.global_seqs
        if not self.mixture.exact_plan or n_run == len(stream.plan):
            return None
        r = plan_read(stream.plan[:, 0], list(stream.domains), self.mixture.stages, n_run)
        w = r["worst"]
        note = (f"{n_run} of the stream's {r['planned']} planned sequences; largest gap: {w} "
                f"{r['read'][w]:.0%} read vs {r['nominal'][w]:.0%} nominal")
        if r["gap"] > PLAN_GAP:
            log.warning("train.mixture=staged reads %s: the plan is interleaved at random over its whole length; "
                        "plan the stream for this run (mix.budget_tokens=%d)", note, n_run * self.spec.seq_len)
        return note

    def _open_log(self, has_ckpt: bool) -> MetricsLog:
        """Resume (when asked and possible: every callback's state too), then open the metrics from the
        resumed step on."""
        spec, state = self.spec, self.state
        resumed_at = None
        if spec.resume and has_ckpt:
            resumed_at = resume(spec, self.engine, self.engine_kind, state, self.sampler,
                                self.callback_states())
        job = spec.job
        return MetricsLog(spec, Monitor(spec.out, spec.tcfg, job, self.total_steps, state.step,
                                        redact(job.config) if job is not None else None), resumed_at)

    def _each(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(*args)

    def step(self) -> None:
        """One optimizer step: the callbacks' pre_step (stage, evaluations), a batch by the mixture, the
        update, then their post_step (metrics, proxy stop, checkpoint)."""
        spec, state, stream = self.spec, self.state, self.spec.stream
        step_tokens = self.global_seqs * spec.seq_len
        t0, c0 = time.time(), time.process_time()
        self._info = {}
        self._before_update = True
        self._each("pre_step")
        td = time.time()
        pairs, mix_info = draw_batch(self.mixture, self.sampler, self.global_seqs, stream.domains,
                                     lambda name: self._each("on_stage", name))
        data = self.sampler.batch(pairs)
        self.data_s += time.time() - td
        lr_used = float(self.engine.get_lr()[0])  # this step's LR (cptkit's schedule or a user DeepSpeed scheduler)
        loss = optimizer_step(self.engine, data, spec.tcfg.micro_batch, spec.tcfg.grad_accum, spec.rank, spec.world,
                              self.distiller, pairs)
        if self.distiller is not None:
            self._info["distill_kl"] = self.distiller.take(spec.world)  # the term's own line in metrics.jsonl
        state.step += 1
        self._before_update = False
        state.tokens += step_tokens
        self.w_now = w_now = mix_info.pop("weights_used")
        for d in stream.domains:
            state.weight_sum[d] += w_now[d]
        dt, dc = time.time() - t0, time.process_time() - c0
        state.elapsed += dt
        self.losses.append(loss)
        self._each("post_step", {"step": state.step, "tokens": state.tokens, "loss": loss, "lr": lr_used,
                                 "tokens_per_s": step_tokens / dt if dt > 0 else 0.0, "seconds": dt,
                                 "cpu_seconds": dc, "weights": {d: round(v, 6) for d, v in w_now.items()},
                                 **mix_info, **self._info})

    def run(self) -> dict[str, Any]:
        """Step to the end, write the outputs; the run's numbers for the manifest. When anything here
        raises, every callback's ``on_error`` sees it before it propagates; ``close`` runs always."""
        try:
            extra = self._run()
        except BaseException as e:
            for cb in self.callbacks:
                try:
                    cb.on_error(e)
                except Exception as inner:  # the run's own error is the one to report
                    log.warning("%s.on_error raised %s: %s", cb.key, type(inner).__name__, inner)
            self._close(failed=True)
            raise
        self._close(failed=False)
        return extra

    def _close(self, failed: bool) -> None:
        """Every callback's ``close``, each one even if an earlier one raised; the first such error is
        raised after all of them, unless the run ``failed`` already (its own error is the one to report)."""
        first: Exception | None = None
        for cb in self.callbacks:
            try:
                cb.close()
            except Exception as e:
                log.warning("%s.close raised %s: %s", cb.key, type(e).__name__, e)
                first = first or e
        if first is not None and not failed:
            raise first

    def _run(self) -> dict[str, Any]:
        spec, state = self.spec, self.state
        self._each("pre_train")
        t_run = time.time()
        while state.step < self.total_steps:
            self.step()
        run_s = time.time() - t_run
        self._each("post_train")
        self.log.close(state, self.w_now if self.losses else None)
        step_tokens = self.global_seqs * spec.seq_len
        mix_s = self.mix_s
        extra: dict[str, Any] = {
            "steps": state.step, "tokens": state.tokens, "world size": spec.world,
            "final loss": self.losses[-1] if self.losses else float("nan"),
            "tokens/s": (len(self.losses) * step_tokens / run_s) if run_s > 0 else 0.0,
            "data+mixture share of step time": (self.data_s + mix_s) / run_s if run_s > 0 else 0.0,
            "data loader s": self.data_s, "mixture eval+update s": mix_s, "run s": run_s,
            "mixture": "proxy" if spec.proxy else spec.tcfg.mixture, **self.engine_info}
        if self.plan_note:
            extra["plan read"] = self.plan_note
        write_outputs(spec, self.engine, self.tokenizer, state, self.proxy_run, extra)
        return extra


def train(spec: RunSpec) -> dict:
    """Train (or resume, or find finished) the run ``spec`` names; rank 0 completes its Job."""
    job = spec.job
    if job is not None and job.is_finished:
        return job.finish()
    trainer = Trainer(spec, prepare_checkpoints(spec))
    extra = trainer.run()
    torch.distributed.barrier()
    if job is not None:
        files = ["model", "metrics.jsonl", "weights.jsonl", "avg_weights.json"]
        job.complete(job.tasks[0], result=TaskResult(files=files), seconds=trainer.state.elapsed)
        return job.finish(extra=extra) | {"losses": trainer.losses}
    return {"losses": trainer.losses, **extra}


def optimizer_step(engine: Engine, data: np.ndarray, micro: int, accum: int, rank: int, world: int,
                   distill: Distiller | None = None, pairs: list[tuple[int, int]] | None = None) -> float:
    """One optimizer step over ``accum`` micro-batches of this rank's rows; the loss (CE) averaged over
    micro-batches and ranks. With ``distill`` (and the batch's (domain, sequence) ``pairs``) each
    micro-batch's objective is CE + λ·KL on its selected tokens (:mod:`cptkit.training.distill`)."""
    step_loss = 0.0
    device = getattr(engine, "device", None) or next(engine.module.parameters()).device
    for j in range(accum):
        lo = (j * world + rank) * micro
        x = torch.from_numpy(data[lo:lo + micro]).to(device, non_blocking=True)
        outp = engine(input_ids=x, labels=x)
        objective = outp.loss
        if distill is not None and pairs is not None:
            kl = distill.term(outp.logits, x, pairs[lo:lo + micro])
            if kl is not None:
                objective = objective + distill.kl * kl
        engine.backward(objective)
        engine.step()
        step_loss += float(outp.loss.detach().float()) / accum
    loss_t = torch.tensor([step_loss], dtype=torch.float64, device=device)  # NCCL reduces GPU tensors only
    if world > 1:
        torch.distributed.all_reduce(loss_t)
        loss_t /= world
    return float(loss_t.item())
