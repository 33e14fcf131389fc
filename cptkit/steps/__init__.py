"""One module per step; each exposes ``run(cfg) -> dict`` and registers its config schema.

The module of step ``name`` is ``cptkit.steps.<name with - as _>``; :func:`execute` is the one
code path that runs a step on a composed config (single runs from the CLI and sweep members).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def step_module(step: str) -> ModuleType:
    """Import (and so register the schema of) the module of ``step``."""
    return importlib.import_module(f"cptkit.steps.{step.replace('-', '_')}")


def execute(step: str, cfg: Any) -> Any:
    """Fill ``{key}`` placeholders of ``--out`` and run ``step`` on the composed ``cfg``."""
    from omegaconf import OmegaConf

    from cptkit.config import format_path

    OmegaConf.set_struct(cfg, False)
    cfg.io.output = format_path(cfg.io.output, cfg)
    OmegaConf.set_struct(cfg, True)
    return step_module(step).run(cfg)
