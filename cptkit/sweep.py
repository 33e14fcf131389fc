"""``-m`` multiruns: the same step function under ``@hydra.main`` (basic or submitit launchers)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from cptkit.config import CONF_DIR, finalize


def multirun(step: str, overrides: list[str]) -> None:
    """Run ``step`` as a Hydra multirun over ``overrides`` (sweeps like ``a=1,2,3``)."""
    config_name = step.replace("-", "_")

    @hydra.main(version_base=None, config_path=str(CONF_DIR), config_name=config_name)
    def _main(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        from cptkit.cli import execute

        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
        cfg = finalize(cfg, step)
        out = cfg.io.output
        if out is not None and out != "-" and "{" not in str(out):
            # Members of a sweep must not share an output: nest by the member's overrides.
            hc = HydraConfig.get()
            OmegaConf.set_struct(cfg, False)
            cfg.io.output = f"{out.rstrip('/')}/{hc.job.override_dirname or hc.job.num}"
            OmegaConf.set_struct(cfg, True)
        execute(step, cfg)

    argv = sys.argv
    sys.argv = [f"cptkit-{step}", "-m", *overrides]
    try:
        _main()
    finally:
        sys.argv = argv
