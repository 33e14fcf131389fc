"""Training checkpoints: the files (safe loading, the ``latest`` tag, the plain-torch engine's files)
and the resume protocol (a run's identity, reopening a finished run to extend it, refusing to mix a
new run into an old one's checkpoints, saving and resuming).

Every checkpoint file is read with ``torch.load(weights_only=True)``: tensors, containers and
numbers only, plus the three DeepSpeed classes its ZeRO optimizer state holds (allow-listed in
:func:`safe_globals`). A planted pickle that would run code is refused with one line; nothing
in it is executed. DeepSpeed's own loader (``weights_only=False``) is replaced on every engine
by :func:`guard_deepspeed`. The ``latest`` file may only name a ``stepNNNNNNNN`` directory
inside the checkpoint folder.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import config_hash
from cptkit.core.output import is_finished, read_manifest
from cptkit.core.progress import log
from cptkit.training.state import (
    Engine,
    EngineKind,
    RunSpec,
    Stateful,
    TrainState,
    client_state,
    restore,
)

TAG_RE = re.compile(r"step\d{8}")
TORCH_STATE = "cptkit_state.pt"  # the plain-torch engine's file inside a tag directory


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def safe_globals() -> list[Any]:
    """Classes allowed in a checkpoint besides tensors and plain containers (DeepSpeed ZeRO state)."""
    out: list[Any] = []
    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        out += [LossScaler, ZeroStageEnum, fragment_address]
    except ImportError:  # pragma: no cover - deepspeed is a dependency
        pass
    return out


def _reason(e: BaseException) -> str:
    msg = str(e)
    m = re.search(r"GLOBAL ([A-Za-z_][\w.]*)", msg)
    if m:
        return f"it holds {m.group(1)}, which is not plain tensor data (a pickle that can run code)"
    lines = [x.strip() for x in msg.splitlines() if x.strip()]
    return lines[-1] if lines else type(e).__name__


def safe_load(path: str | Path, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` with the DeepSpeed allow-list; refusals are one line."""
    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(str(path), map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CptkitError(f"{path}: checkpoint file is missing") from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, AttributeError) as e:
        raise CptkitError(f"{path}: refusing to load this checkpoint: {_reason(e)}") from None


def guard_deepspeed(engine: Any) -> None:
    """Make a DeepSpeed engine read its checkpoint files through :func:`safe_load`."""
    ce = getattr(engine, "checkpoint_engine", None)
    if ce is not None:
        ce.load = lambda path, map_location=None: safe_load(path, map_location or "cpu")


def latest_tag(ckdir: Path) -> str | None:
    """The tag named by ``ckdir/latest`` (validated: ``stepNNNNNNNN``, a directory inside ``ckdir``)."""
    p = ckdir / "latest"
    if not p.exists():
        return None
    tag = p.read_text(errors="replace").strip()
    if not TAG_RE.fullmatch(tag):
        raise CptkitError(f"{p}: names {tag[:60]!r}, not a checkpoint tag (stepNNNNNNNN)")
    if not (ckdir / tag).is_dir():
        raise CptkitError(f"{p}: names {tag}, but {ckdir / tag} does not exist")
    return tag


def tag_step(tag: str) -> int:
    return int(tag[4:])


def write_latest(ckdir: Path, tag: str) -> None:
    tmp = ckdir / f".latest.tmp-{os.getpid()}"
    try:
        tmp.write_text(tag)
        os.replace(tmp, ckdir / "latest")
    finally:
        tmp.unlink(missing_ok=True)


class _Sink:
    """The file ``torch.save`` writes through, keeping the ``OSError`` of a failed write: torch
    reports a full disk as ``RuntimeError: ... unexpected pos``, which names no cause."""

    def __init__(self, f: Any):
        self.f, self.error = f, None

    def write(self, b: Any) -> int:
        try:
            return self.f.write(b)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _torch_save(state: dict[str, Any], path: Path, name: Path) -> None:
    """``torch.save(state, path)``; a write that fails (disk full, quota) is that ``OSError``, naming ``name``."""
    with open(path, "wb") as f:
        sink = _Sink(f)
        try:
            torch.save(state, sink)  # type: ignore[arg-type]
        except RuntimeError:
            if sink.error is None:
                raise
            raise OSError(sink.error.errno, sink.error.strerror, str(name)) from None


def remove_tmps(ckdir: Path) -> None:
    """Remove the temporary checkpoints and ``latest`` files of runs that died writing them (the
    output's lock is held: no other writer is at work)."""
    for t in ckdir.glob(".*.tmp-*"):
        shutil.rmtree(t, ignore_errors=True) if t.is_dir() and not t.is_symlink() else t.unlink(missing_ok=True)


def prune(ckdir: Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` tag directories (0: keep all)."""
    if keep_last <= 0:
        return
    tags = sorted(p for p in ckdir.glob("step*") if p.is_dir() and TAG_RE.fullmatch(p.name))
    for old in tags[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def save_torch(ckdir: Path, tag: str, state: dict[str, Any]) -> Path:
    """Write ``state`` as ``ckdir/tag/cptkit_state.pt`` (complete or absent), then point ``latest`` at it."""
    final = ckdir / tag
    tmp = ckdir / f".{tag}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        _torch_save(state, tmp / TORCH_STATE, final / TORCH_STATE)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves nothing behind
    write_latest(ckdir, tag)
    return final


def load_torch(ckdir: Path, tag: str) -> dict[str, Any]:
    path = ckdir / tag / TORCH_STATE
    if not path.exists():
        if any((ckdir / tag).glob("*model_states.pt")):
            raise CptkitError(f"{ckdir / tag}: a DeepSpeed checkpoint; resume it with train.engine=deepspeed")
        raise CptkitError(f"{path}: checkpoint file is missing")
    state = safe_load(path)
    if not isinstance(state, dict) or not {"module", "optimizer", "client_state"} <= set(state):
        raise CptkitError(f"{path}: not a cptkit checkpoint (module/optimizer/client_state missing)")
    return state


def check_resumable(ckdir: Path, engine_kind: EngineKind) -> str:
    """The validated latest tag of ``ckdir``, refusing a checkpoint written by the other engine."""
    tag = latest_tag(ckdir)
    if tag is None:
        raise CptkitError(f"{ckdir}: no 'latest' checkpoint to resume from")
    is_torch = (ckdir / tag / TORCH_STATE).exists()
    if engine_kind is EngineKind.DEEPSPEED and is_torch:
        raise CptkitError(f"{ckdir / tag}: written by the torch engine; resume it with train.engine=torch")
    if engine_kind is EngineKind.TORCH and not is_torch and any((ckdir / tag).glob("*model_states.pt")):
        raise CptkitError(f"{ckdir / tag}: a DeepSpeed checkpoint; resume it with train.engine=deepspeed")
    return tag


def branch_file(run_dir: str | Path) -> Path:
    """The checkpoint a branch starts from: the last one of the run in ``run_dir`` (torch engine)."""
    ckdir = Path(run_dir) / "checkpoints"
    tag = latest_tag(ckdir) if ckdir.is_dir() else None
    if tag is None:
        if is_finished(Path(run_dir)):  # finished, its checkpoints dropped (train.keep_checkpoints=false)
            raise CptkitError(f"train.branch_from={run_dir}: the run finished without its checkpoints "
                              "(train.keep_checkpoints=false): train the trunk again with keep_checkpoints=true")
        raise CptkitError(f"train.branch_from={run_dir}: no checkpoint there (is the trunk run finished?)")
    path = ckdir / tag / TORCH_STATE
    if not path.exists():
        raise CptkitError(f"train.branch_from={run_dir}: {ckdir / tag} is not a torch-engine checkpoint "
                          "(branch from a run trained with train.engine=torch)")
    return path


def branch(engine: Engine, engine_kind: EngineKind, path: Path) -> tuple[int, dict[str, Any]]:
    """Start ``engine`` from another run's checkpoint ``path``: its weights and the optimizer's state per
    parameter (AdamW's moments and step counts, so no re-warming of the moments), while this run keeps its
    own hyper-parameters and schedule. Returns the checkpoint's step and its client state (the sampler's)."""
    if engine_kind is not EngineKind.TORCH:
        raise CptkitError("train.branch_from needs the torch engine (train.engine=torch)")
    state = load_torch(path.parent.parent, path.parent.name)
    optimizer = engine.optimizer  # type: ignore[attr-defined]  # the torch engine's
    try:
        engine.module.load_state_dict(state["module"])
        mine = optimizer.state_dict()
        theirs = state["optimizer"]
        if [len(g["params"]) for g in theirs["param_groups"]] != [len(g["params"]) for g in mine["param_groups"]]:
            raise ValueError("its optimizer has other parameter groups")
        optimizer.load_state_dict({"state": theirs["state"], "param_groups": mine["param_groups"]})
    except (RuntimeError, ValueError, KeyError) as e:
        raise CptkitError(f"train.branch_from: {path} does not fit this model: {misfit(e)}") from None
    return int(state.get("global_steps", 0)), state["client_state"]


def misfit(e: BaseException) -> str:
    """Why a checkpoint does not load into this model, in one line: the first parameter it names
    (``size mismatch for model.embed_tokens.weight: ...``), not torch's list of every one."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    named = [x for x in lines if x.startswith(("size mismatch", "Missing key", "Unexpected key"))]
    why = (named or lines or [type(e).__name__])[0]
    return why[:300] + (f" (and {len(named) - 1} more)" if len(named) > 1 else "")


def same_stream(run_dir: str | Path, stream: str | Path) -> bool:
    """Whether the run in ``run_dir`` trained on ``stream`` (by its manifest): a branch then continues
    its data order instead of drawing the stream's first sequences again."""
    try:
        inputs = read_manifest(Path(run_dir))["config"]["io"]["inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(inputs) and os.path.realpath(inputs[0]) == os.path.realpath(stream)


# --- the resume protocol ----------------------------------------------------------------------
def run_identity(config: dict) -> str:
    """The hash that names a run in its output: its config without ``train.resume`` and ``train.max_steps``
    (a finished run can be extended to more steps: same run, longer)."""
    train = {k: v for k, v in config.get("train", {}).items() if k not in ("resume", "max_steps")}
    return config_hash({**config, "train": train})


def reopen_finished(out: Path, ckdir: Path, max_steps: int, resume: bool) -> bool:
    """A finished run asked for another ``max_steps``: reopen it to extend (resume, more steps) or refuse.

    Returns True when the run is to be extended: it resumes from its final checkpoint, and its
    ``_SUCCESS`` is removed once that checkpoint has loaded."""
    if not is_finished(out) or max_steps <= 0:
        return False
    try:
        done = int(read_manifest(out)["extra"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if max_steps == done:
        return False
    if max_steps < done:
        raise CptkitError(f"{out}: finished at step {done}; train.max_steps={max_steps} would shorten it "
                          "(io.overwrite=true starts over)")
    if not resume:
        raise CptkitError(f"{out}: finished at step {done}; pass train.resume=true to extend it to "
                          f"train.max_steps={max_steps}, or io.overwrite=true to start over")
    tag = latest_tag(ckdir)
    if tag is None or tag_step(tag) != done:
        raise CptkitError(f"{out}: finished at step {done} but {ckdir} holds no checkpoint of that step to extend")
    log.info("extending %s from step %d to %d", out, done, max_steps)
    return True


def prepare_checkpoints(spec: RunSpec) -> bool:
    """Whether there is a checkpoint to resume from; refuses to mix a new run into an old one."""
    if spec.rank == 0 and spec.ckdir.is_dir():
        remove_tmps(spec.ckdir)  # of a run killed (or out of disk) while it saved
    has_ckpt = (spec.ckdir / "latest").exists()
    if has_ckpt and not spec.resume and spec.conf.io.overwrite:  # start over, as the error below suggests
        if spec.rank == 0:
            shutil.rmtree(spec.ckdir)
        has_ckpt = False
    if has_ckpt and not spec.resume:
        raise CptkitError(f"{spec.out}: holds checkpoints of an unfinished run; pass train.resume=true to continue "
                          "it or io.overwrite=true to start over")
    if spec.resume and not has_ckpt:
        log.warning("train.resume=true but %s has no checkpoint: starting from step 0", spec.ckdir)
    return has_ckpt


def save(spec: RunSpec, engine: Engine, state: TrainState, sampler: Stateful, callbacks: dict[str, Stateful]) -> None:
    """The engine's checkpoint of this step under ``OUT/checkpoints`` (the last ``train.keep_last`` kept),
    holding the run's state, the sampler's and every callback's (:func:`~cptkit.training.state.client_state`)."""
    engine.save_checkpoint(str(spec.ckdir), tag=tag_for(state.step), client_state=client_state(state, sampler, callbacks))
    if spec.rank == 0:
        prune(spec.ckdir, spec.tcfg.keep_last)


def resume(spec: RunSpec, engine: Engine, engine_kind: EngineKind, state: TrainState, sampler: Stateful,
           callbacks: dict[str, Stateful]) -> int:
    """Load the latest checkpoint (after checking it fits this engine) into ``state``, the sampler and
    the callbacks; returns its step."""
    check_resumable(spec.ckdir, engine_kind)
    try:
        path, saved = engine.load_checkpoint(str(spec.ckdir))
    except (RuntimeError, ValueError, KeyError) as e:  # another model's weights (shapes, names), optimizer
        raise CptkitError(f"{spec.ckdir}: its latest checkpoint does not fit this model ({misfit(e)}); "
                          "pass io.overwrite=true to start over, or choose another --out") from None
    if path is None or saved is None:
        raise CptkitError(f"{spec.ckdir}: cannot load the latest checkpoint")
    restore(saved, state, sampler, callbacks)
    if spec.job is not None:  # rank 0
        spec.job.unfinish()  # extending a finished run: unfinished until it ends
        log.info("resumed from %s at step %d (%d tokens)", path, state.step, state.tokens)
    return state.step
