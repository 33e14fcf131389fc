"""B0, the re-adapted base: the shipped model continued on general text until its loss levels off.

``cptkit b0 --base smollm2 --stream data/xp/b0_stream --link data/xp/b0 -- TRAIN_OVERRIDES``

The shipped SmolLM2 is an *instruct* model, quantized, then dequantized. Continued on any raw text,
its loss first falls for reasons that have nothing to do with that text: recovery from quantization,
the move from chat turns to raw documents, the formats every corpus shares. An arm measured against
the shipped model reports that fall as "no forgetting". B0 takes the fall first, on general English
that no evaluation set uses, so that every arm starts from B0 and every Δ is against it.

B0 is built once and cached by content, as the dequantized GGUF is: the key is the sha256 of the
base model's files, the stream's files, the train overrides and the library versions, under
``$CPTKIT_CACHE/b0/KEY``. It is a ``cptkit train`` output with a checkpoint every ``--save-every``
steps, so that a rerun after a crash resumes it; once finished it is kept without its checkpoints,
then sealed: :mod:`cptkit.core.cache` records every file's size and sha256, and a cached B0 that no
longer matches them, a ``model.safetensors`` cut short say, is trained again, one line saying why; a
link planted as the entry is refused. ``--link`` points at it. The levelling-off check reads the run's held-out curve: B0 *has
levelled off* when its rate of fall over the last third of its tokens, carried over one arm's tokens
(``--horizon``), is under ``--flat`` nats per token: continuing B0 for as long as an arm trains would
move its loss by less than that, half the claims' minimum effect by default. The curve, the criterion
and the verdict go to ``LINK.json`` and stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from cptkit import __version__
from cptkit.core.cache import check_or_seal, entry, seal
from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.fingerprint import content_hash
from cptkit.core.output import is_finished
from cptkit.core.records import read_jsonl
from cptkit.core.shards import atomic_write_json
from cptkit.training.metrics import eval_curves


def b0_key(base_files: str, stream: Path, overrides: list[str]) -> str:
    """The content key of B0: the base model's files, the stream's files, the train overrides and the
    versions of what trains it (cptkit, torch, transformers)."""
    import torch  # deferred: --help without torch
    import transformers

    parts = [f"cptkit {__version__}", f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    for what, path in (("base", base_files), ("stream", str(stream))):
        h = content_hash(path)
        if h is None:
            raise CptkitError(f"B0's {what} {path} does not exist")
        parts.append(h[0])
    return hashlib.sha256(json.dumps([parts, sorted(overrides)]).encode()).hexdigest()[:20]


def levelled(tokens: list[float], losses: list[float], flat: float, horizon: float) -> dict[str, Any]:
    """Whether a held-out curve has levelled off: its mean rate of fall over the last third of the tokens,
    carried over ``horizon`` tokens, is under ``flat`` nats per token. Unlike the fall over the last third
    itself, the rate does not grow with the run's length on a curve that keeps a slow steady component.
    Pure: ``tokens`` ascending, one loss per point."""
    if len(tokens) < 3:
        raise CptkitError("B0's curve has fewer than 3 held-out points: evaluate more often (train.eval_every)")
    cut = tokens[-1] - (tokens[-1] - tokens[0]) / 3
    i = max(k for k, t in enumerate(tokens) if t <= cut)
    fall = losses[i] - losses[-1]
    drift = fall / (tokens[-1] - tokens[i]) * horizon
    return {"from_tokens": tokens[i], "to_tokens": tokens[-1], "fall": fall, "horizon": horizon,
            "drift": drift, "flat": flat, "levelled": drift < flat, "first": losses[0], "last": losses[-1]}


def curve(run: Path, group: str) -> tuple[list[float], list[float]]:
    tokens, losses, _ = eval_curves(read_jsonl(run / "metrics.jsonl", missing_ok=True))
    if group not in losses:
        raise CptkitError(f"{run}/metrics.jsonl has no held-out group {group!r} (have {', '.join(losses)})")
    pts = losses[group]
    return [float(tokens[k]) for k in range(len(pts))], [float(x) for x in pts]


def train_command(base: str, stream: Path, out: Path, overrides: list[str], save_every: int) -> list[str]:
    """The ``cptkit train`` that builds B0 into ``out``: a checkpoint every ``save_every`` steps (unless
    the overrides set ``train.save_every``) and ``train.resume=true``, so that a rerun after a crash
    continues from the last one (a B0 takes hours on a cluster's base); the checkpoints go at the end.
    Neither key changes the run's identity: a rerun resumes the same run."""
    every = [] if any(o.startswith("train.save_every=") for o in overrides) else [f"train.save_every={save_every}"]
    return [sys.executable, "-m", "cptkit.cli", "train", "--in", str(stream), "--out", str(out),
            "model=hf", f"model.path={base}", *overrides, *every, "train.keep_checkpoints=false",
            "train.resume=true"]


def build(base: str, stream: Path, link: Path, overrides: list[str], flat: float, horizon: float,
          group: str, save_every: int = 32) -> dict[str, Any]:
    """Train B0 into the content-keyed cache unless it is there, link it, and check its curve."""
    from cptkit.models.lm import spec_file  # deferred: torch/transformers

    key = b0_key(spec_file(base) or base, stream, overrides)
    out = entry("b0", key)  # a link planted there is refused, never trained into
    if is_finished(out) and (why := check_or_seal(out)) is not None:
        print(f"B0 {key}: the cached {out} is damaged ({why}): training it again", file=sys.stderr)
        shutil.rmtree(out)
    if not is_finished(out):
        cmd = train_command(base, stream, out, overrides, save_every)
        print(f"B0 {key}: training into {out}", file=sys.stderr)
        if subprocess.run(cmd, check=False).returncode != 0:
            raise CptkitError(f"B0's training failed (rerun to resume): {' '.join(cmd)}")
        seal(out)  # every file's size and sha256, checked by every later use
    else:
        print(f"B0 {key}: cached at {out}", file=sys.stderr)
    tokens, losses = curve(out, group)
    info = {"key": key, "path": str(out), "base": base, "stream": str(stream), "overrides": overrides,
            "group": group, "curve": [[t, x] for t, x in zip(tokens, losses, strict=True)],
            **levelled(tokens, losses, flat, horizon)}
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(out.resolve(), target_is_directory=True)
    os.replace(tmp, link)
    atomic_write_json(link.with_suffix(".json"), info)
    return info


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit b0", description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the shipped model (smollm2, a .gguf or an HF folder)")
    p.add_argument("--stream", type=Path, required=True, help="a build-mix stream of general text")
    p.add_argument("--link", type=Path, required=True, help="the symlink to B0's train output")
    p.add_argument("--flat", type=float, default=0.01,
                   help="levelled: the last third's rate, over --horizon tokens, is under this (nats/token)")
    p.add_argument("--horizon", type=float, default=5120, help="the tokens of one arm (default 10 x 2 x 256)")
    p.add_argument("--group", default="b0", help="the stream's held-out group whose curve is checked")
    p.add_argument("--save-every", type=int, default=32,
                   help="steps between checkpoints, which a rerun after a crash resumes from (removed at the end)")
    p.add_argument("overrides", nargs="*", help="train overrides (after --)")
    a = p.parse_args(argv)
    if a.save_every < 1:
        raise CptkitError(f"--save-every: {a.save_every} is not a number of steps >= 1")
    info = build(a.base, a.stream, a.link, a.overrides, a.flat, a.horizon, a.group, a.save_every)
    verdict = "levelled off" if info["levelled"] else "NOT levelled off: train longer (B0_STEPS)"
    print(f"B0 held-out loss {info['first']:.3f} -> {info['last']:.3f} nats/token; over its last third "
          f"({info['from_tokens']:.0f} -> {info['to_tokens']:.0f} tokens) it fell {info['fall']:+.4f}, "
          f"{info['drift']:+.4f} over {info['horizon']:.0f} tokens at that rate (< {a.flat:g}: {verdict})",
          file=sys.stderr)
    return 0
