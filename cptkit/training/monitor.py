"""What a training run shows while it runs: progress bar, log lines, TensorBoard, W&B.

* The progress bar carries the last loss and LR. When stderr is not a terminal (a batch job,
  a pipe) one log line is printed every ``train.log_every`` steps (default: every ~10%).
* TensorBoard (``OUT/tensorboard``, on by default): every numeric field of a metrics row:
  loss, lr, tokens_per_s, seconds, ``weights/<domain>``, ``eval_loss/<domain>``...
* W&B (``train.wandb=auto``): only when ``wandb`` is installed and configured through its own
  environment (``WANDB_PROJECT``, ``WANDB_MODE``, ``WANDB_API_KEY``); never required. The key
  stays in the environment: nothing of it is written by cptkit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.job import Job
from cptkit.core.progress import console, log
from cptkit.training.config import TrainOptions

WANDB_ENV = ("WANDB_PROJECT", "WANDB_MODE", "WANDB_API_KEY")


def flatten(rec: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a metrics row as ``a/b`` keys (bools and the step counter left out)."""
    out: dict[str, float] = {}
    for k, v in rec.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and key != "step":
            out[key] = float(v)
    return out


def wandb_wanted(setting: Any) -> bool:
    """``train.wandb``: false, true (wandb must be installed), or auto (installed and configured)."""
    s = str(setting).lower()
    if s == "false":
        return False
    try:
        import wandb  # noqa: F401
    except ImportError:
        if s == "true":
            raise CptkitError("train.wandb=true but wandb is not installed (pip install wandb)") from None
        return False
    if s == "true":
        return True
    if s != "auto":
        raise CptkitError(f"train.wandb={setting!r}: use auto, true or false")
    return any(os.environ.get(k) for k in WANDB_ENV)


class Monitor:
    """Per-step reporting of a training run on rank 0 (a no-op elsewhere)."""

    def __init__(self, out: Path, tcfg: TrainOptions, job: Job | None, total_steps: int, start_step: int, config: dict | None):
        self.job = job
        self.total = total_steps
        self.active = job is not None
        self.tb = self.wandb = None
        self.bar = None
        every = tcfg.log_every
        self.every = every or max(1, total_steps // 10)
        self.lines = self.active and not console.is_terminal and not job.quiet
        if not self.active:
            return
        self.bar = job.progress.add_task("train", total=total_steps, completed=start_step)
        if tcfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tensorboard"), purge_step=start_step + 1 if start_step else None)
            except ImportError:
                log.warning("train.tensorboard=true but tensorboard is not installed (pip install tensorboard)")
        if wandb_wanted(tcfg.wandb):
            import wandb

            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "cptkit"), name=out.name,
                                    dir=str(out), config=config or {}, resume="allow",
                                    id=os.environ.get("WANDB_RUN_ID"))

    def step(self, step: int, rec: dict[str, Any]) -> None:
        """Report one optimizer step's metrics row (``loss``, ``lr``, ``tokens_per_s``, ...)."""
        if not self.active:
            return
        loss, lr = rec.get("loss"), rec.get("lr")
        desc = "train" if loss is None else f"train loss {loss:.4f} lr {lr:.2e}"
        self.job.progress.update(self.bar, advance=1, description=desc)
        if self.lines and (step % self.every == 0 or step == self.total):
            log.info("step %d/%d  loss %.4f  lr %.3g  %.0f tokens/s", step, self.total, loss, lr,
                     rec.get("tokens_per_s", 0.0))
        self.scalars(step, rec)

    def scalars(self, step: int, rec: dict[str, Any]) -> None:
        """Send a row's numeric fields (e.g. eval points between steps) to TensorBoard / W&B."""
        if not self.active:
            return
        flat = flatten(rec)
        if self.tb is not None:
            for k, v in flat.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(flat, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
