"""The resume protocol of a training run: its identity, reopening a finished run to extend it,
refusing to mix a new run into an old one's checkpoints, saving and loading checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.training.state import RunSpec, TrainState


def run_identity(config: dict) -> str:
    """The hash that names a run in its output: its config without ``train.resume`` and ``train.max_steps``
    (a finished run can be extended to more steps: same run, longer)."""
    from cptkit.core.fingerprint import config_hash

    train = {k: v for k, v in config.get("train", {}).items() if k not in ("resume", "max_steps")}
    return config_hash({**config, "train": train})


def reopen_finished(out: Path, ckdir: Path, max_steps: int, resume: bool) -> bool:
    """A finished run asked for another ``max_steps``: reopen it to extend (resume, more steps) or refuse.

    Returns True when the run is to be extended: it resumes from its final checkpoint, and its
    ``_SUCCESS`` is removed once that checkpoint has loaded."""
    from cptkit.core.output import MANIFEST, SUCCESS
    from cptkit.training.checkpoint import latest_tag, tag_step

    if not (out / SUCCESS).exists() or max_steps <= 0 or not (out / MANIFEST).exists():
        return False
    try:
        done = int(json.loads((out / MANIFEST).read_text())["extra"]["steps"])
    except (ValueError, KeyError, TypeError):
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


class Checkpointer:
    """Engine checkpoints under ``OUT/checkpoints`` (the last ``train.keep_last`` kept)."""

    def __init__(self, engine: Any, spec: RunSpec):
        self.engine, self.dir, self.rank, self.keep = engine, spec.ckdir, spec.rank, spec.tcfg.keep_last

    def save(self, state: TrainState, sampler: Any, controller: Any) -> None:
        from cptkit.training.checkpoint import prune, tag_for

        self.engine.save_checkpoint(str(self.dir), tag=tag_for(state.step),
                                    client_state=state.state_dict(sampler, controller))
        if self.rank == 0:
            prune(self.dir, self.keep)

    def load(self, engine_name: str) -> tuple[str, dict[str, Any]]:
        """The latest checkpoint's path and client state (after checking it fits this engine)."""
        from cptkit.training.checkpoint import check_resumable

        check_resumable(self.dir, engine_name)
        path, state = self.engine.load_checkpoint(str(self.dir))
        if path is None:
            raise CptkitError(f"{self.dir}: cannot load the latest checkpoint")
        return path, state


def resume(spec: RunSpec, checkpointer: Checkpointer, engine_name: str, state: TrainState, sampler: Any,
           controller: Any) -> int:
    """Load the latest checkpoint into ``state``, the sampler and the controller; returns its step."""
    path, saved = checkpointer.load(engine_name)
    state.load_state_dict(saved, sampler, controller)
    if spec.rank == 0:
        (spec.out / "_SUCCESS").unlink(missing_ok=True)  # extending a finished run: unfinished until it ends
        log.info("resumed from %s at step %d (%d tokens)", path, state.step, state.tokens)
    return state.step
