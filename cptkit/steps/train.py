"""train: train a causal LM on a build-mix stream with DeepSpeed (ZeRO-2, bf16) and a static,
staged or dynamic domain mixture (SPEC §9): train.mixture=static|staged|topic_ppl|velocitune|dbl.

Any transformers causal LM (``model=hf model.path=DIR|FILE.gguf|smollm2``) or a tiny random
Llama (``model=tiny_llama``); DeepSpeed ZeRO (stage 2 by default, ``conf/deepspeed/``), bf16,
AdamW β = (0.9, 0.95), weight decay, gradient clipping, gradient checkpointing, SDPA; a
Warmup-Stable-Decay LR schedule; mixture controllers chosen by ``train.mixture``.

``train.distill.kl=λ`` adds λ·KL(base ‖ model) on the replay (or all) tokens: a frozen teacher, or the
stream's stored top-k log-probs (docs/forgetting.md).

Outputs under ``--out``: ``metrics.jsonl`` (one line per step: loss, LR, tokens/s, weights),
``weights.jsonl`` and ``weights.png`` (the weight trajectory), ``avg_weights.json`` and
``mix_reweighted.yaml`` (the time-averaged weights as a static mixture), ``checkpoints/``
(DeepSpeed checkpoints with data position, mixture state and RNG), ``model/`` (the final
model and tokenizer, ``from_pretrained``-loadable, and its model card ``README.md``),
``_velocitune_targets.json`` (proxy mode).
"""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from pathlib import Path

import torch

from cptkit.core.errors import CptkitError
from cptkit.core.job import Hooks, Job, Task
from cptkit.core.run import Run
from cptkit.core.step import IN, OUT, QUIET, step
from cptkit.mixtures.factory import weights_file
from cptkit.mixtures.stream import Stream
from cptkit.models.lm import check_model, spec_file
from cptkit.training.card import stream_record
from cptkit.training.checkpoint import branch_file, reopen_finished, run_identity
from cptkit.training.config import TrainJob
from cptkit.training.engine import init_distributed
from cptkit.training.kernels import check_kernels
from cptkit.training.loop import train
from cptkit.training.state import RunSpec


@step("train", TrainJob, options=(IN, OUT, QUIET), order=140)
def run(conf: TrainJob, ctx: Run) -> dict:

    tcfg = conf.train
    if len(conf.io.inputs) != 1:
        raise CptkitError("train: pass exactly one --in: a build-mix stream directory")
    if conf.io.output in (None, "-"):
        raise CptkitError("train: pass --out DIR for checkpoints, metrics and the final model")
    check_kernels(tcfg.kernels)  # train.kernels=liger without CUDA or liger_kernel: one line, nothing written
    stream = Stream(conf.io.inputs[0])
    if tcfg.distill.kl > 0 and tcfg.distill.on == "replay" and not stream.replay_domains():
        raise CptkitError(f"train.distill.on=replay: the stream {stream.path} has no replay domains (mix.replay); "
                          "use train.distill.on=all or a stream built with replay")
    # a folder that would run its own code, a bad GGUF file: one line before anything is written
    check_model(conf.model.path if conf.model.name == "hf" else None, conf.trust_remote_code)
    check_model(conf.tokenizer or stream.tokenizer_spec(), conf.trust_remote_code)
    if tcfg.distill.kl > 0:
        check_model(tcfg.distill.teacher, conf.trust_remote_code)
    proxy = tcfg.velocitune.proxy
    resume = tcfg.resume
    ctx = ctx.recording("train.resume", False)  # resuming does not change what the run computes
    ctx = ctx.without("train.keep_checkpoints")  # nor does dropping the checkpoints at the end
    if tcfg.threads > 0:
        torch.set_num_threads(tcfg.threads)

    rank, world = init_distributed(tcfg.backend)
    out = Path(conf.io.output)  # type: ignore[arg-type]  # not None: checked above
    ckdir = out / "checkpoints"
    job, extend = None, False
    if rank == 0:  # one process owns the output: its manifest, _SUCCESS and the run's identity

        reads = [conf.io.inputs[0], spec_file(conf.model.path), spec_file(conf.tokenizer or stream.tokenizer_spec()),
                 tcfg.velocitune.targets_file, *tcfg.eval_extra,  # what the run read keys it
                 spec_file(tcfg.distill.teacher) if tcfg.distill.kl > 0 else None,
                 str(weights_file(tcfg.weights_from)) if tcfg.weights_from else None,
                 str(branch_file(tcfg.branch_from)) if tcfg.branch_from else None]
        data = {"data": stream_record(conf.io.inputs[0], stream.meta)}  # the model card shows the same
        # finished: the model is what is read, so the checkpoints go (unless train.keep_checkpoints)
        drop = None if tcfg.keep_checkpoints else (lambda _job: shutil.rmtree(ckdir, ignore_errors=True))
        job = Job(ctx, tasks=[Task(0, [], name="train")], needs_inputs=False, reads=reads,
                  hooks=Hooks(manifest_extra=lambda: data, after_success=drop), identity=run_identity(ctx.record))
        extend = reopen_finished(out, ckdir, tcfg.max_steps, resume)
    with job if job is not None else nullcontext():
        if job is not None and extend:
            job.reopen()
        torch.distributed.barrier()
        return train(RunSpec(conf, stream, proxy, resume, rank, world, out, job))
