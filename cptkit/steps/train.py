"""train: continual pre-training on a build-mix stream with DeepSpeed (SPEC §9).

Any transformers causal LM (``model=hf model.path=DIR|FILE.gguf|smollm2``) or a tiny random
Llama (``model=tiny_llama``); DeepSpeed ZeRO (stage 2 by default, ``conf/deepspeed/``), bf16,
AdamW β = (0.9, 0.95), weight decay, gradient clipping, gradient checkpointing, SDPA; a
Warmup-Stable-Decay LR schedule; mixture controllers chosen by ``train.mixture``.

Outputs under ``--out``: ``metrics.jsonl`` (one line per step: loss, LR, tokens/s, weights),
``weights.jsonl`` and ``weights.png`` (the weight trajectory), ``avg_weights.json`` and
``mix_reweighted.yaml`` (the time-averaged weights as a static mixture), ``checkpoints/``
(DeepSpeed checkpoints with data position, mixture state and RNG), ``model/`` (the final
model and tokenizer, ``from_pretrained``-loadable), ``_velocitune_targets.json`` (proxy mode).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from cptkit.config import JobConfig, register_step
from cptkit.errors import CptkitError
from cptkit.progress import log
from cptkit.shards import atomic_write_bytes, atomic_write_json


@dataclass
class ModelConfig:
    name: str = "tiny_llama"  # tiny_llama (random, seeded) | hf (model.path)
    path: str | None = None  # HF directory, .gguf file or smollm2 (name=hf)
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int | None = None
    intermediate: int | None = None
    max_position: int = 0  # 0: the stream's seq_len
    seed: int = 0
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2 (GPU)


@dataclass
class TopicPPLConfig:
    round_tokens: float = 1e5  # R: tokens per adjustment round
    alpha: float = 0.4
    within_parent: bool = True  # adjust topics within their parent (language), keeping its share


@dataclass
class VelocituneConfig:
    interval_steps: int = 150  # m
    use_target: bool = True  # false: the ablation V = l_t / l_init
    targets: Any = None  # target loss per domain {domain: loss}
    targets_file: str | None = None  # _velocitune_targets.json of a proxy run
    proxy: bool = False  # run the proxy: train on proxy_fraction with default weights, fit, write targets
    proxy_fraction: float = 0.5
    proxy_checkpoints: int = 6
    sigma: float = 0.01  # converged when the prediction moves less than this between checkpoint sets


@dataclass
class DBLConfig:
    interval_steps: int = 150
    eta: float = 1.0
    smoothing: float = 1e-4
    clip: bool = True


@dataclass
class TrainOptions:
    mixture: str = "static"  # static | staged | topic_ppl | velocitune | dbl
    weights: Any = None  # static weights {domain: w}, "stream" (stage 1), "tokens"; null: stream
    init_weights: Any = None  # dynamic start: {domain: w}, uniform, stream, tokens; null: per method
    micro_batch: int = 4
    grad_accum: int = 1
    budget_tokens: float = 0.0  # 0: the stream's planned tokens
    max_steps: int = 0  # 0: from the budget
    lr: float = 1e-5  # peak
    init_lr: float = 1e-7
    warmup: float = 0.0  # steps (≥ 1) or fraction (< 1)
    decay: float = 0.0  # steps or fraction at the end; 0: constant after warmup
    decay_type: str = "linear"  # linear | cosine | 1-sqrt | exponential
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    grad_clip: float = 1.0
    precision: str = "bf16"  # bf16 | fp32 (| fp16 on GPU)
    zero_stage: int = 2
    gradient_checkpointing: bool = True
    deepspeed_config: str | None = None  # a JSON/YAML file merged over conf/deepspeed
    save_every: int = 0  # optimizer steps between checkpoints (0: only at the end)
    keep_last: int = 2
    resume: bool = False
    save_initial: bool = False  # also save the model before training as OUT/model_init (HF format)
    eval_docs: int = 8  # held-out docs per domain used for eval losses
    eval_max_tokens: int = 256
    eval_every: int = 0  # log per-domain eval losses every N steps (0: off)
    threads: int = 0  # torch CPU threads (0: torch's default)
    plot: bool = True
    tensorboard: bool = False
    backend: str = "auto"  # gloo on CPU, nccl on GPU
    topic_ppl: TopicPPLConfig = field(default_factory=TopicPPLConfig)
    velocitune: VelocituneConfig = field(default_factory=VelocituneConfig)
    dbl: DBLConfig = field(default_factory=DBLConfig)


@dataclass
class TrainJob(JobConfig):
    tokenizer: str | None = None  # default: the stream's tokenizer
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainOptions = field(default_factory=TrainOptions)
    deepspeed: Any = field(default_factory=dict)


register_step("train", TrainJob)


# --- pieces ---------------------------------------------------------------------------------
def build_model(mcfg: Any, tokenizer, seq_len: int):
    from cptkit import lm

    if mcfg.name == "tiny_llama":
        model = lm.tiny_llama(tokenizer, hidden=int(mcfg.hidden), layers=int(mcfg.layers), heads=int(mcfg.heads),
                              intermediate=mcfg.intermediate, max_position=int(mcfg.max_position or seq_len),
                              seed=int(mcfg.seed), kv_heads=mcfg.kv_heads)
    elif mcfg.name == "hf":
        if not mcfg.path:
            raise CptkitError("model=hf needs model.path (an HF directory, a .gguf file or smollm2)")
        model = lm.load_causal_lm(str(mcfg.path), dtype="float32")
    else:
        raise CptkitError(f"model.name={mcfg.name!r}: use tiny_llama or hf")
    try:
        model.set_attn_implementation(str(mcfg.attn_implementation))
    except (AttributeError, ValueError, ImportError) as e:
        log.warning("attention %s unavailable (%s); using the model's default", mcfg.attn_implementation, e)
    model.config.use_cache = False
    return model


def resolve_weights(spec: Any, stream, default: str) -> dict[str, float]:
    """Weights from config: a dict, or one of uniform / stream / tokens."""
    spec = default if spec is None else spec
    if isinstance(spec, str):
        if spec == "uniform":
            return {d: 1.0 / len(stream.domains) for d in stream.domains}
        if spec == "stream":
            return stream.stage_weights(0)
        if spec == "tokens":
            return stream.token_weights()
        raise CptkitError(f"weights {spec!r}: give a mapping or one of uniform, stream, tokens")
    w = dict(spec)
    unknown = [k for k in w if k not in stream.index]
    if unknown:
        raise CptkitError(f"weights: unknown domain {unknown[0]!r}; the stream has {', '.join(stream.domains)}")
    return {d: float(w.get(d, 0.0)) for d in stream.domains}


def load_targets(vcfg: Any) -> dict[str, float]:
    targets = {str(k): float(v) for k, v in (vcfg.targets or {}).items()}
    if vcfg.targets_file:
        p = Path(str(vcfg.targets_file))
        if not p.exists():
            raise CptkitError(f"train.velocitune.targets_file={p}: no such file (run with train.velocitune.proxy=true)")
        targets = {**json.loads(p.read_text())["targets"], **targets}
    return targets


def make_controller(tcfg: Any, stream, proxy: bool):
    from cptkit.training import mixture as mx

    kind = "static" if proxy else str(tcfg.mixture)
    if kind not in mx.MIXTURES:
        raise CptkitError(f"train.mixture={kind!r}: use one of {', '.join(mx.MIXTURES)}")
    if proxy:
        return mx.Controller(stream.domains, resolve_weights(tcfg.init_weights, stream, "tokens"))
    if kind == "static":
        return mx.Controller(stream.domains, resolve_weights(tcfg.weights, stream, "stream"))
    if kind == "staged":
        return mx.Staged(stream.domains)
    if kind == "topic_ppl":
        return mx.TopicPPL(stream.domains, resolve_weights(tcfg.init_weights, stream, "stream"), stream.parents,
                           float(tcfg.topic_ppl.round_tokens), float(tcfg.topic_ppl.alpha),
                           bool(tcfg.topic_ppl.within_parent))
    targets = load_targets(tcfg.velocitune)
    if kind == "velocitune":
        return mx.Velocitune(stream.domains, resolve_weights(tcfg.init_weights, stream, "uniform"), targets,
                             int(tcfg.velocitune.interval_steps), bool(tcfg.velocitune.use_target))
    return mx.DBL(stream.domains, resolve_weights(tcfg.init_weights, stream, "stream"), targets,
                  int(tcfg.dbl.interval_steps), float(tcfg.dbl.eta), float(tcfg.dbl.smoothing), bool(tcfg.dbl.clip))


def eval_losses(model, tokenizer, records: list[dict], tcfg: Any, seq_len: int) -> dict[str, float]:
    """Per-domain token-weighted eval loss on the stream's held-out documents."""
    from cptkit.lm import group_losses

    was_training = model.training
    model.eval()
    try:
        res = group_losses(model, tokenizer, records, group_by="domain", max_docs_per_group=int(tcfg.eval_docs),
                           max_length=seq_len, max_tokens=int(tcfg.eval_max_tokens))
    finally:
        model.train(was_training)
    return {d: float(v["loss"]) for d, v in res.items()}


def plot_weights(path: Path, out: Path) -> str | None:
    """Plot the weight trajectory (JSONL) as a PNG; returns a note when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: weights.png skipped (pip install matplotlib)"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for d in rows[0]["weights"]:
        ax.plot([r["tokens"] for r in rows], [r["weights"][d] for r in rows], drawstyle="steps-post", label=d)
    ax.set_xlabel("tokens")
    ax.set_ylabel("domain weight")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, out)
    return None


def _truncate_jsonl(path: Path, max_step: int) -> None:
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= max_step]
    atomic_write_bytes(path, ("\n".join(keep) + "\n").encode() if keep else b"")


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def _set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])


# --- the step -------------------------------------------------------------------------------
def run(cfg: DictConfig) -> dict:
    from cptkit.job import Job, Task
    from cptkit.training.data import Stream
    from cptkit.training.engine import init_distributed

    tcfg = cfg.train
    if len(cfg.io.inputs) != 1:
        raise CptkitError("train: pass exactly one --in: a build-mix stream directory")
    if cfg.io.output in (None, "-"):
        raise CptkitError("train: pass --out DIR for checkpoints, metrics and the final model")
    stream = Stream(str(cfg.io.inputs[0]))
    seq_len = stream.seq_len
    proxy = bool(tcfg.velocitune.proxy)
    resume = bool(tcfg.resume)
    # `resume` does not change what the run computes: keep it out of the config hash
    OmegaConf.set_struct(cfg, False)
    cfg.train.resume = False
    OmegaConf.set_struct(cfg, True)
    if tcfg.precision not in ("bf16", "fp32", "fp16"):
        raise CptkitError(f"train.precision={tcfg.precision!r}: use bf16, fp32 or fp16 (GPU)")
    if int(tcfg.threads) > 0:
        torch.set_num_threads(int(tcfg.threads))

    rank, world = init_distributed(str(tcfg.backend))
    out = Path(str(cfg.io.output))
    ckdir = out / "checkpoints"
    job = None
    if rank == 0:
        job = Job(cfg, tasks=[Task(0, [], name="train")], needs_inputs=False)
        job.__enter__()
    torch.distributed.barrier()
    try:
        result = _train(cfg, tcfg, stream, seq_len, proxy, resume, rank, world, out, ckdir, job)
    except BaseException as e:
        if job is not None:
            job.__exit__(type(e), e, e.__traceback__)
        raise
    if job is not None:
        job.__exit__(None, None, None)
    return result


def _train(cfg, tcfg, stream, seq_len, proxy, resume, rank, world, out, ckdir, job) -> dict:
    import deepspeed

    from cptkit.job import TaskResult
    from cptkit.lm import load_tokenizer
    from cptkit.mixing import normalize, predict_targets
    from cptkit.training.data import Sampler
    from cptkit.training.engine import deepspeed_config, param_groups
    from cptkit.training.schedule import make_schedule, torch_scheduler

    if job is not None and job.already_done:
        return job.finish()
    has_ckpt = (ckdir / "latest").exists()
    if has_ckpt and not resume:
        raise CptkitError(f"{out}: holds checkpoints of an unfinished run; pass train.resume=true to continue "
                          "it or io.overwrite=true to start over")
    if resume and not has_ckpt:
        log.warning("train.resume=true but %s has no checkpoint: starting from step 0", ckdir)
    tok_spec = cfg.tokenizer or stream.meta.get("tokenizer")
    tokenizer = load_tokenizer(str(tok_spec))
    if len(tokenizer) < int(stream.meta["vocab_size"]):
        raise CptkitError(f"tokenizer {tok_spec} has {len(tokenizer)} tokens, the stream was built with "
                          f"{stream.meta['vocab_size']}")

    micro, accum = int(tcfg.micro_batch), int(tcfg.grad_accum)
    global_seqs = micro * accum * world
    budget = float(tcfg.budget_tokens) or float(stream.meta["total_sequences"] * seq_len)
    total_steps = int(tcfg.max_steps) or max(1, math.ceil(budget / (global_seqs * seq_len)))
    full_budget = total_steps * global_seqs * seq_len
    vcfg = tcfg.velocitune
    proxy_points: list[int] = []
    if proxy:
        total_steps = max(int(vcfg.proxy_checkpoints), round(total_steps * float(vcfg.proxy_fraction)))
        n = int(vcfg.proxy_checkpoints)
        if n < 3:
            raise CptkitError("train.velocitune.proxy_checkpoints must be ≥ 3 for a scaling-law fit")
        proxy_points = sorted({max(1, round(total_steps * (k + 1) / n)) for k in range(n)})
    schedule = make_schedule(float(tcfg.lr), total_steps, warmup=tcfg.warmup, decay=tcfg.decay,
                             init_lr=float(tcfg.init_lr), decay_type=str(tcfg.decay_type),
                             min_lr_ratio=float(tcfg.min_lr_ratio))

    controller = make_controller(tcfg, stream, proxy)
    eval_recs = stream.eval_records()
    needs_eval = controller.dynamic or proxy or int(tcfg.eval_every) > 0
    if needs_eval:
        have = {r["domain"] for r in eval_recs}
        missing = [d for d in stream.domains if d not in have]
        if missing:
            raise CptkitError(f"{stream.path}: no held-out eval documents for domain {missing[0]!r} "
                              "(rebuild the stream with mix.eval_docs > 0)")

    torch.manual_seed(int(cfg.seed))
    model = build_model(cfg.model, tokenizer, seq_len)
    if model.get_input_embeddings().num_embeddings < int(stream.meta["vocab_size"]):
        raise CptkitError(f"model has {model.get_input_embeddings().num_embeddings} embeddings, fewer than the "
                          f"stream's vocabulary ({stream.meta['vocab_size']})")
    if tcfg.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.x
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if tcfg.save_initial and rank == 0 and not (out / "model_init").exists():
        # The "base" of a from-scratch demo run, for evaluate-compare against the trained model.
        tmp = out / ".model_init.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, out / "model_init")
    model.train()
    base = OmegaConf.to_container(cfg.deepspeed, resolve=True) or {}
    if tcfg.deepspeed_config:
        p = Path(str(tcfg.deepspeed_config))
        if not p.exists():
            raise CptkitError(f"train.deepspeed_config={p}: no such file")
        extra = json.loads(p.read_text()) if p.suffix == ".json" else OmegaConf.to_container(OmegaConf.load(p))
        base = {**base, **extra}  # type: ignore[dict-item]
    ds_cfg = deepspeed_config(base, micro_batch=micro, grad_accum=accum, world=world, lr=float(tcfg.lr),
                              betas=(float(tcfg.betas[0]), float(tcfg.betas[1])), eps=float(tcfg.eps),
                              weight_decay=float(tcfg.weight_decay), grad_clip=float(tcfg.grad_clip),
                              precision=str(tcfg.precision), zero_stage=int(tcfg.zero_stage))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups(model, float(tcfg.weight_decay)),
                                           config=ds_cfg, lr_scheduler=lambda opt: torch_scheduler(opt, schedule))
    sampler = Sampler(stream, int(cfg.seed))

    step, tokens, weight_sum, elapsed = 0, 0, dict.fromkeys(stream.domains, 0.0), 0.0
    proxy_log: list[tuple[float, dict[str, float]]] = []
    if resume and has_ckpt:
        path, state = engine.load_checkpoint(str(ckdir))
        if path is None:
            raise CptkitError(f"{ckdir}: cannot load the latest checkpoint")
        step, tokens, elapsed = int(state["step"]), int(state["tokens"]), float(state["elapsed"])
        weight_sum = state["weight_sum"]
        proxy_log = [tuple(x) for x in state.get("proxy_log", [])]  # type: ignore[misc]
        sampler.load_state_dict(state["sampler"])
        controller.load_state_dict(state["controller"])
        _set_rng_state(state["rng"])
        if rank == 0:
            log.info("resumed from %s at step %d (%d tokens)", path, step, tokens)
            for name in ("metrics.jsonl", "weights.jsonl"):
                _truncate_jsonl(out / name, step)
    elif rank == 0:
        for name in ("metrics.jsonl", "weights.jsonl"):
            (out / name).unlink(missing_ok=True)

    tb = None
    if rank == 0 and tcfg.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(str(out / "tensorboard"))
        except ImportError:
            log.warning("train.tensorboard=true but tensorboard is not installed (pip install tensorboard)")
    advance = job.add_bar("train steps", total_steps) if job is not None else (lambda n=1: None)
    if job is not None and step:
        advance(step)
    metrics_f = open(out / "metrics.jsonl", "a") if rank == 0 else None  # noqa: SIM115
    weights_f = open(out / "weights.jsonl", "a") if rank == 0 else None  # noqa: SIM115

    def log_weights(info: dict[str, Any]) -> None:
        if weights_f is not None:
            w = controller.weights
            weights_f.write(json.dumps({"step": step, "tokens": tokens, "weights": w, **info}) + "\n")
            weights_f.flush()

    def save() -> None:
        state = {"step": step, "tokens": tokens, "elapsed": elapsed, "weight_sum": weight_sum,
                 "sampler": sampler.state_dict(), "controller": controller.state_dict(), "rng": _rng_state(),
                 "proxy_log": proxy_log}
        engine.save_checkpoint(str(ckdir), tag=f"step{step:08d}", client_state=state)
        if rank == 0 and int(tcfg.keep_last) > 0:
            tags = sorted(p for p in ckdir.glob("step*") if p.is_dir())
            for old in tags[:-int(tcfg.keep_last)]:
                shutil.rmtree(old, ignore_errors=True)

    if step == 0 and controller.weights is not None:
        log_weights({"event": "init"})
    loss_hist: list[float] = []
    data_s = mix_s = 0.0
    t_run = time.time()
    while step < total_steps:
        t0 = time.time()
        info: dict[str, Any] = {}
        if controller.dynamic and controller.wants_eval(step, tokens):
            te = time.time()
            losses = eval_losses(engine.module, tokenizer, eval_recs, tcfg, seq_len)
            upd = controller.update(step, tokens, losses)
            info = {"eval_loss": losses, **upd}
            log_weights({"event": "update", **info})
            mix_s += time.time() - te
        elif tcfg.eval_every and step % int(tcfg.eval_every) == 0:
            info = {"eval_loss": eval_losses(engine.module, tokenizer, eval_recs, tcfg, seq_len)}
        td = time.time()
        pairs = sampler.draw(global_seqs, controller.weights)
        data = sampler.batch(pairs)
        data_s += time.time() - td
        step_loss = 0.0
        for j in range(accum):
            lo = (j * world + rank) * micro
            x = torch.from_numpy(data[lo:lo + micro])
            outp = engine(input_ids=x, labels=x)
            engine.backward(outp.loss)
            engine.step()
            step_loss += float(outp.loss.detach().float()) / accum
        loss_t = torch.tensor([step_loss], dtype=torch.float64)
        if world > 1:
            torch.distributed.all_reduce(loss_t)
            loss_t /= world
        lr_used = schedule.lr(step)
        step += 1
        tokens += global_seqs * seq_len
        w_now = controller.weights
        if w_now is None:
            counts = np.bincount([d for d, _ in pairs], minlength=len(stream.domains))
            w_now = {d: float(counts[i]) / len(pairs) for i, d in enumerate(stream.domains)}
        for d in stream.domains:
            weight_sum[d] += w_now[d]
        dt = time.time() - t0
        elapsed += dt
        loss_hist.append(float(loss_t.item()))
        if metrics_f is not None:
            rec = {"step": step, "tokens": tokens, "loss": float(loss_t.item()), "lr": lr_used,
                   "tokens_per_s": global_seqs * seq_len / dt if dt > 0 else 0.0, "seconds": dt,
                   "weights": {d: round(v, 6) for d, v in w_now.items()}, **info}
            metrics_f.write(json.dumps(rec) + "\n")
            metrics_f.flush()
            if tb is not None:
                tb.add_scalar("loss", rec["loss"], step)
                tb.add_scalar("lr", lr_used, step)
                for d, v in w_now.items():
                    tb.add_scalar(f"weight/{d}", v, step)
        if proxy and step in proxy_points:
            losses = eval_losses(engine.module, tokenizer, eval_recs, tcfg, seq_len)
            proxy_log.append((float(tokens), losses))
        advance(1)
        if (int(tcfg.save_every) and step % int(tcfg.save_every) == 0) or step == total_steps:
            save()
    run_s = time.time() - t_run
    if metrics_f is not None:
        metrics_f.close()
    if weights_f is not None:
        weights_f.close()
    if tb is not None:
        tb.close()

    extra: dict[str, Any] = {"steps": step, "tokens": tokens, "world size": world,
                             "final loss": loss_hist[-1] if loss_hist else float("nan"),
                             "tokens/s": (len(loss_hist) * global_seqs * seq_len / run_s) if run_s > 0 else 0.0,
                             "data+mixture share of step time": (data_s + mix_s) / run_s if run_s > 0 else 0.0,
                             "data loader s": data_s, "mixture eval+update s": mix_s, "run s": run_s,
                             "mixture": "proxy" if proxy else str(tcfg.mixture)}
    if rank == 0:
        avg = normalize(weight_sum) if sum(weight_sum.values()) > 0 else {}
        atomic_write_json(out / "avg_weights.json", {"weights": avg, "steps": step})
        recipe = {"name": f"reweighted_{out.name}", "stages": [{"name": "reweighted", "weights": avg}]}
        atomic_write_bytes(out / "mix_reweighted.yaml",
                           ("# time-averaged weights of this run; use: train.mixture=static "
                            "train.weights=<these weights>, or as a mix stage\n"
                            + OmegaConf.to_yaml(OmegaConf.create(recipe))).encode())
        if tcfg.plot and (out / "weights.jsonl").exists():
            note = plot_weights(out / "weights.jsonl", out / "weights.png")
            if note:
                log.warning(note)
        if proxy:
            targets, laws, change = predict_targets(proxy_log, budget_tokens=full_budget, sigma=float(vcfg.sigma))
            atomic_write_json(out / "_velocitune_targets.json", {
                "targets": targets, "budget_tokens": full_budget, "change": change,
                "converged": bool(change < float(vcfg.sigma)), "sigma": float(vcfg.sigma),
                "laws": {d: {"E": law.E, "B": law.B, "beta": law.beta, "rmse": law.rmse} for d, law in laws.items()},
                "checkpoints": [{"tokens": t, "losses": v} for t, v in proxy_log]})
            if not change < float(vcfg.sigma):
                log.warning("velocitune proxy: the predicted targets still moved by %.4g (> sigma %.4g); "
                            "consider a larger train.velocitune.proxy_fraction", change, float(vcfg.sigma))
            extra["velocitune targets"] = json.dumps({d: round(v, 4) for d, v in targets.items()})
        model_dir = out / "model"
        tmp = out / ".model.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        engine.module.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        shutil.rmtree(model_dir, ignore_errors=True)
        os.replace(tmp, model_dir)
    torch.distributed.barrier()
    if job is not None:
        job.results.setdefault(job.tasks[0].name, TaskResult()).files += [
            "model", "metrics.jsonl", "weights.jsonl", "avg_weights.json"]
        job.complete(job.tasks[0], seconds=elapsed)
        return job.finish(extra=extra) | {"losses": loss_hist}
    return {"losses": loss_hist, **extra}
