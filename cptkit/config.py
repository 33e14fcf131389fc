"""Configuration: dataclass schemas in Hydra's ConfigStore, YAML defaults in ``conf/``.

Every step has a primary config ``conf/<step>.yaml`` whose defaults list starts with the
step's structured schema (``_schema_<step>``), so a mistyped key fails with Hydra's
"Could not override 'x.y'" naming the key. Steps receive a resolved ``DictConfig``; the same
function runs under the compose API (a single run) and under ``@hydra.main`` (``-m`` sweeps).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cptkit.errors import CptkitError


def _conf_dir() -> Path:
    """``$CPTKIT_CONF_DIR``, else the configs inside an installed wheel, else the checkout's ``conf/``."""
    if os.environ.get("CPTKIT_CONF_DIR"):
        return Path(os.environ["CPTKIT_CONF_DIR"])
    packaged = Path(__file__).resolve().parent / "conf"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "conf"


CONF_DIR = _conf_dir()


@dataclass
class IOConfig:
    """Where a step reads and writes. Set by ``--in``/``--out``; overridable as ``io.*``."""

    inputs: list[str] = field(default_factory=list)
    output: str | None = None
    skip_bad_lines: bool = False  # count and skip malformed lines instead of failing
    overwrite: bool = False  # delete an existing finished output instead of refusing


@dataclass
class ShardConfig:
    """Output sharding and the slice of the inputs this process handles (job arrays)."""

    index: int = 0  # this process handles tasks t with t % count == index
    count: int = 1
    max_bytes: int = 256 * 2**20  # roll over to a new output shard past this many bytes
    max_records: int = 0  # ... or this many records (0: no limit)
    compression: str = "gz"  # gz | zst | none


@dataclass
class JobConfig:
    """Fields every step shares."""

    step: str = ""
    seed: int = 0
    overrides: list[str] = field(default_factory=list)  # filled in: the command-line overrides
    quiet: bool = False
    io: IOConfig = field(default_factory=IOConfig)
    shard: ShardConfig = field(default_factory=ShardConfig)


_SCHEMAS: dict[str, type] = {}


def register_step(name: str, schema: type) -> None:
    """Register a step's root schema as ``_schema_<name>`` for ``conf/<name>.yaml`` to extend."""
    _SCHEMAS[name] = schema
    ConfigStore.instance().store(name=f"_schema_{name.replace('-', '_')}", node=schema)


def compose_step(name: str, overrides: list[str] | None = None) -> DictConfig:
    """Compose ``conf/<name>.yaml`` with command-line overrides into a resolved config."""
    config_name = name.replace("-", "_")
    if not (CONF_DIR / f"{config_name}.yaml").exists():
        raise CptkitError(f"no config for step {name!r}: {CONF_DIR / (config_name + '.yaml')} is missing")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name=config_name):
            cfg = compose(config_name=config_name, overrides=list(overrides or []))
    except (HydraException, OmegaConfBaseException) as e:
        raise CptkitError(one_line(_message(e))) from None
    return finalize(cfg, name, list(overrides or []))


def _message(e: BaseException) -> str:
    """The first non-empty message along an exception's cause chain."""
    while e is not None:
        if str(e).strip():
            return str(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return "invalid configuration"


def finalize(cfg: DictConfig, name: str, overrides: list[str] | None = None) -> DictConfig:
    """Resolve interpolations and fill ``step``; errors become one-line user errors."""
    try:
        OmegaConf.set_struct(cfg, False)
        cfg.step = name
        if overrides is not None:
            cfg.overrides = [o for o in overrides if not o.startswith(("io.", "quiet="))]
        OmegaConf.resolve(cfg)
        OmegaConf.set_struct(cfg, True)
    except OmegaConfBaseException as e:
        raise CptkitError(one_line(_message(e))) from None
    return cfg


def one_line(msg: str) -> str:
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("full_key", "object_type", "reference_type"))]
    return " ".join(keep[:3]) if keep else msg


_FIELD = re.compile(r"\{([A-Za-z_][\w.]*)\}")


def format_path(template: str | None, cfg: DictConfig) -> str | None:
    """Fill ``{dotted.key}`` placeholders from the config: ``qa_c{corrupt.ratio}/``."""
    if template is None:
        return None

    def sub(m: re.Match) -> str:
        value = OmegaConf.select(cfg, m.group(1), default=None)
        if value is None:
            raise CptkitError(f"--out {template!r}: no config key {m.group(1)!r}")
        return str(value)

    return _FIELD.sub(sub, template)


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def redact(obj: Any) -> Any:
    """Drop secrets (keys named like api_key/token/password) before writing a manifest."""
    if isinstance(obj, dict):
        return {k: ("<redacted>" if re.search(r"(api_key|secret|password|token)$", str(k)) and v else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj
