"""``-m`` multiruns: the same step function under ``@hydra.main`` (basic or submitit launchers).

``cptkit corrupt --in qa/ --out 'qa_c{corrupt.ratio}/' -m corrupt.ratio=0.0,0.3,0.5`` runs one
member per value. Members never share an output: a ``{key}`` placeholder in ``--out`` names
it, otherwise each member writes to ``OUT/<its overrides>``. Launchers: the basic one (in
process, sequential), ``hydra/launcher=submitit_local`` and ``hydra/launcher=submitit_slurm``
(``hydra.launcher.partition=...``), where a sweep becomes a SLURM job array.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from cptkit.config import CONF_DIR, finalize

# Keys that say where data lives, not what the member computes.
NOT_IN_DIRNAME = ["io.inputs", "io.output", "io.overwrite", "io.skip_bad_lines", "quiet", "sweep"]


def member_output(out: str | None, override_dirname: str, num: int) -> str | None:
    """Output directory of one sweep member (placeholders are filled later by the step)."""
    if out is None or out == "-" or "{" in str(out):
        return out
    return f"{str(out).rstrip('/')}/{override_dirname or num}"


def multirun(step: str, overrides: list[str]) -> None:
    """Run ``step`` as a Hydra multirun over ``overrides`` (sweeps like ``a=1,2,3``)."""
    config_name = step.replace("-", "_")

    @hydra.main(version_base=None, config_path=str(CONF_DIR), config_name=config_name)
    def _main(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        from cptkit.cli import execute

        hc = HydraConfig.get()
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
        cfg = finalize(cfg, step, list(hc.overrides.task))
        OmegaConf.set_struct(cfg, False)
        cfg.io.output = member_output(cfg.io.output, hc.job.override_dirname, hc.job.num)
        OmegaConf.set_struct(cfg, True)
        return execute(step, cfg)

    exclude = "hydra.job.config.override_dirname.exclude_keys=[" + ",".join(NOT_IN_DIRNAME) + "]"
    argv = sys.argv
    sys.argv = [f"cptkit-{step}", "-m", exclude, *overrides]
    try:
        _main()
    finally:
        sys.argv = argv
