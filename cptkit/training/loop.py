"""The training loop: set a run up (tokenizer, schedule, mixture, model, engine, resume), step it
to its end (draw a batch by the mixture, one optimizer step, metrics, checkpoints) and write its
outputs. Every random choice is seeded: a resumed run continues to byte-identical files."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from cptkit.core.errors import CptkitError
from cptkit.core.redact import redact
from cptkit.training.checkpointing import Checkpointer, prepare_checkpoints, resume
from cptkit.training.evaluation import EvalPoints
from cptkit.training.metricslog import MetricsLog
from cptkit.training.state import RunSpec, TrainState


def plan_steps(spec: RunSpec) -> tuple[int, int, int, Any]:
    """(sequences per optimizer step, steps, the run's tokens, the LR schedule)."""
    from cptkit.training.schedule import make_schedule

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


class Trainer:
    """One process's share of a run, set up by the constructor and stepped by :meth:`run`."""

    def __init__(self, spec: RunSpec, has_ckpt: bool):
        from cptkit.mixtures.factory import make_controller
        from cptkit.mixtures.stream import Sampler
        from cptkit.training.engine import make_engine
        from cptkit.training.model import build_model, check_vocab, load_run_tokenizer, save_initial

        conf, tcfg, stream = spec.conf, spec.tcfg, spec.stream
        self.spec = spec
        self.tokenizer = load_run_tokenizer(spec)
        self.global_seqs, self.total_steps, full_budget, schedule = plan_steps(spec)
        self.controller = make_controller(tcfg, stream, spec.proxy, self.total_steps * self.global_seqs, full_budget)
        self.proxy_run = None
        if spec.proxy:  # the proxy follows the real run's schedule and stops early (Velocitune App. B)
            from cptkit.mixtures.velocitune import ProxyRun

            self.proxy_run = ProxyRun(tcfg.velocitune, self.total_steps, self.global_seqs * spec.seq_len)
            self.total_steps = self.proxy_run.max_steps
        self.evals = EvalPoints(spec, self.controller)
        torch.manual_seed(conf.seed)
        model = build_model(conf.model, self.tokenizer, spec.seq_len, conf.trust_remote_code)
        check_vocab(model, stream)
        save_initial(spec, model, self.tokenizer)
        self.engine, self.engine_info = make_engine(model, tcfg, deepspeed_base=conf.deepspeed or {},
                                                    world=spec.world, schedule=schedule)
        self.sampler = Sampler(stream, conf.seed)
        self.checkpointer = Checkpointer(self.engine, spec)
        self.state = TrainState(weight_sum=dict.fromkeys(stream.domains, 0.0))
        self.mlog = self._open_log(has_ckpt)
        self.losses: list[float] = []
        self.w_now: dict[str, float] | None = None
        self.data_s = 0.0

    def _open_log(self, has_ckpt: bool) -> MetricsLog:
        """Resume (when asked and possible), then open the metrics from the resumed step on."""
        from cptkit.training.runlog import RunLog

        spec, state, controller = self.spec, self.state, self.controller
        resumed_at = None
        if spec.resume and has_ckpt:
            resumed_at = resume(spec, self.checkpointer, self.engine_info["engine"], state, self.sampler, controller)
        for t_ck, l_ck in state.proxy_log if self.proxy_run is not None else []:
            self.proxy_run.add(t_ck, l_ck)
        job = spec.job
        mlog = MetricsLog(spec, RunLog(spec.out, spec.tcfg, job, self.total_steps, state.step,
                                       redact(job.config) if job is not None else None), resumed_at)
        if state.step == 0 and controller.weights is not None:
            mlog.weights_event(state, controller.weights, {"event": "init"})
        return mlog

    def step(self) -> None:
        """One optimizer step: the step's eval (if due), a batch by the mixture, metrics, a checkpoint."""
        from cptkit.mixtures.stages import draw_batch

        spec, state, controller, mlog, stream = self.spec, self.state, self.controller, self.mlog, self.spec.stream
        step_tokens = self.global_seqs * spec.seq_len
        t0, c0 = time.time(), time.process_time()
        entered = controller.begin_step(self.sampler.position)  # a stage starting with this step
        if entered:
            mlog.weights_event(state, controller.weights, {"event": "stage", "stage": entered})
        info = self.evals.before_step(self.engine.module, self.tokenizer, controller, state,
                                      lambda i: mlog.weights_event(state, controller.weights, {"event": "update", **i}))
        td = time.time()
        pairs, mix_info = draw_batch(controller, self.sampler, self.global_seqs, stream.domains,
                                     lambda name: mlog.weights_event(state, controller.weights,
                                                                     {"event": "stage", "stage": name}))
        data = self.sampler.batch(pairs)
        self.data_s += time.time() - td
        lr_used = float(self.engine.get_lr()[0])  # this step's LR (cptkit's schedule or a user DeepSpeed scheduler)
        loss = optimizer_step(self.engine, data, spec.tcfg.micro_batch, spec.tcfg.grad_accum, spec.rank, spec.world)
        state.step += 1
        state.tokens += step_tokens
        self.w_now = w_now = mix_info.pop("weights_used")
        for d in stream.domains:
            state.weight_sum[d] += w_now[d]
        dt, dc = time.time() - t0, time.process_time() - c0
        state.elapsed += dt
        self.losses.append(loss)
        mlog.step(state.step, {"step": state.step, "tokens": state.tokens, "loss": loss, "lr": lr_used,
                               "tokens_per_s": step_tokens / dt if dt > 0 else 0.0, "seconds": dt,
                               "cpu_seconds": dc, "weights": {d: round(v, 6) for d, v in w_now.items()},
                               **mix_info, **info})
        if self.evals.proxy_checkpoint(self.engine.module, self.tokenizer, self.proxy_run, state):
            self.total_steps = state.step  # the targets settled: stop the proxy here
        save_every = spec.tcfg.save_every
        if (save_every and state.step % save_every == 0) or state.step == self.total_steps:
            self.checkpointer.save(state, self.sampler, controller)

    def run(self) -> dict[str, Any]:
        """Step to the end, write the outputs; the run's numbers for the manifest."""
        from cptkit.training.outputs import write_outputs

        spec, state = self.spec, self.state
        t_run = time.time()
        while state.step < self.total_steps:
            self.step()
        run_s = time.time() - t_run
        if self.mlog.metrics is not None and spec.tcfg.eval_every:  # the end point of the forgetting curves
            self.mlog.eval_point(state, self.evals.point(self.engine.module, self.tokenizer))
        self.mlog.close(state, self.w_now if self.losses else None)
        step_tokens = self.global_seqs * spec.seq_len
        mix_s = self.evals.mix_s
        extra: dict[str, Any] = {
            "steps": state.step, "tokens": state.tokens, "world size": spec.world,
            "final loss": self.losses[-1] if self.losses else float("nan"),
            "tokens/s": (len(self.losses) * step_tokens / run_s) if run_s > 0 else 0.0,
            "data+mixture share of step time": (self.data_s + mix_s) / run_s if run_s > 0 else 0.0,
            "data loader s": self.data_s, "mixture eval+update s": mix_s, "run s": run_s,
            "mixture": "proxy" if spec.proxy else spec.tcfg.mixture, **self.engine_info}
        write_outputs(spec, self.engine, self.tokenizer, state, self.proxy_run, extra)
        return extra


def train(spec: RunSpec) -> dict:
    """Train (or resume, or find finished) the run ``spec`` names; rank 0 completes its Job."""
    from cptkit.core.job import TaskResult

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


def optimizer_step(engine: Any, data: np.ndarray, micro: int, accum: int, rank: int, world: int) -> float:
    """One optimizer step over ``accum`` micro-batches of this rank's rows; the loss averaged over
    micro-batches and ranks."""
    step_loss = 0.0
    device = getattr(engine, "device", None) or next(engine.module.parameters()).device
    for j in range(accum):
        lo = (j * world + rank) * micro
        x = torch.from_numpy(data[lo:lo + micro]).to(device, non_blocking=True)
        outp = engine(input_ids=x, labels=x)
        engine.backward(outp.loss)
        engine.step()
        step_loss += float(outp.loss.detach().float()) / accum
    loss_t = torch.tensor([step_loss], dtype=torch.float64, device=device)  # NCCL reduces GPU tensors only
    if world > 1:
        torch.distributed.all_reduce(loss_t)
        loss_t /= world
    return float(loss_t.item())
