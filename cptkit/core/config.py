"""Configuration: dataclass schemas in Hydra's ConfigStore, YAML defaults in ``conf/``.

Every step has a primary config ``conf/<step>.yaml`` whose defaults list starts with the
step's structured schema (``_schema_<step>``), so a mistyped key fails with Hydra's
"Could not override 'x.y'" naming the key. Steps receive a resolved ``DictConfig``; the same
function runs under the compose API (a single run) and under ``@hydra.main`` (``-m`` sweeps).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cptkit.core.errors import CptkitError
from cptkit.core.redact import redact, redact_text
from cptkit.core.registry import Registry
from cptkit.core.warc import EXTRACTORS

__all__ = ["redact", "redact_text", "check", "compose_step", "finalize", "register_step", "validate"]


def _conf_dir() -> Path:
    """``$CPTKIT_CONF_DIR``, else the configs inside an installed wheel, else the checkout's ``conf/``."""
    if os.environ.get("CPTKIT_CONF_DIR"):
        return Path(os.environ["CPTKIT_CONF_DIR"])
    package = Path(__file__).resolve().parent.parent  # cptkit/
    packaged = package / "conf"
    return packaged if packaged.is_dir() else package.parent / "conf"


CONF_DIR = _conf_dir()


class ConfigValueError(ValueError):
    """An invalid config value, raised by a schema's ``__post_init__`` (see :func:`check`)."""


def check(ok: bool, key: str, value: Any, why: str) -> None:
    """Raise :class:`ConfigValueError` ``key=value: why`` unless ``ok`` (for ``__post_init__``)."""
    if not ok:
        raise ConfigValueError(f"{key}={value}: {why}")


OVERSIZE = ("error", "skip", "truncate")


@dataclass
class IOConfig:
    """Where a step reads and writes. Set by ``--in``/``--out``; overridable as ``io.*``."""

    inputs: list[str] = field(default_factory=list)  # --in: files, directories, globs, - (stdin); parquet, save_to_disk
    output: str | None = None  # --out: a directory, or - (stdout); {key} placeholders filled from the config
    skip_bad_lines: bool = False  # count and skip malformed lines instead of failing
    allow_partial: bool = False  # read a step's output directory that has no _SUCCESS (partial shards)
    overwrite: bool = False  # replace an existing output (finished, or of another config or input set)
    lock_wait_s: float = 0.0  # another run holds --out: 0 refuses at once, >0 waits up to this many seconds
    unique_ids: bool = True  # a record id read twice in one run is an error (file:line)
    max_record_chars: int = 5_000_000  # longest record text read (bounds memory); 0: no limit
    oversize: str = "error"  # a longer record: error | skip (counted as bad) | truncate (its text)
    html_extractor: str = "resiliparse"  # the HTML of WARC response records: resiliparse | trafilatura

    def __post_init__(self) -> None:
        check(self.lock_wait_s >= 0, "lock_wait_s", self.lock_wait_s, "must be >= 0 seconds")
        check(self.max_record_chars >= 0, "max_record_chars", self.max_record_chars, "must be >= 0 (0: no limit)")
        check(self.oversize in OVERSIZE, "oversize", self.oversize, f"must be one of {', '.join(OVERSIZE)}")
        check(self.html_extractor in EXTRACTORS, "html_extractor", self.html_extractor,
              f"must be one of {', '.join(EXTRACTORS)}")

    def limits(self) -> dict[str, Any]:
        """The record-size limit (and the HTML extractor of WARC archives) as ``read_records``/``iter_records``
        keywords: every reader applies them."""
        return {"max_chars": self.max_record_chars, "oversize": self.oversize, "html_extractor": self.html_extractor}


@dataclass
class ShardConfig:
    """Output sharding and the slice of the inputs this process handles (job arrays)."""

    index: int = 0  # this process handles tasks t with t % count == index
    count: int = 1  # processes in the job array
    max_bytes: int = 256 * 2**20  # roll over to a new output shard past this many bytes (0: no limit)
    max_records: int = 0  # ... or this many records (0: no limit)
    compression: str = "gz"  # gz | zst | none
    task_bytes: int = 64 * 2**20  # a task reads consecutive input files up to this many bytes (0: one per file)

    def __post_init__(self) -> None:
        check(self.task_bytes >= 0, "task_bytes", self.task_bytes, "must be >= 0 (0: one task per input file)")
        check(self.count >= 1, "count", self.count, "must be >= 1 (processes in the job array)")
        check(0 <= self.index < self.count, "index", self.index, f"must be in [0, shard.count={self.count})")
        check(self.max_bytes >= 0, "max_bytes", self.max_bytes, "must be >= 0 (0: no limit)")
        check(self.max_records >= 0, "max_records", self.max_records, "must be >= 0 (0: no limit)")
        check(self.compression in ("gz", "zst", "none"), "compression", self.compression, "must be gz, zst or none")


@dataclass
class JobConfig:
    """Fields every step shares."""

    step: str = ""
    seed: int = 0  # every random choice of the step derives from it
    arm: str | None = None  # the experiment arm this output is (a claim's axis: make reproduce); a label, changes nothing
    overrides: list[str] = field(default_factory=list)  # filled in: the command-line overrides
    quiet: bool = False  # no progress bar, no summary table
    io: IOConfig = field(default_factory=IOConfig)
    shard: ShardConfig = field(default_factory=ShardConfig)


SCHEMAS: Registry[type] = Registry("schema")  # step name -> its root config dataclass (register_step)


def register_step(name: str, schema: type) -> None:
    """Register a step's root schema as ``_schema_<name>`` for ``conf/<name>.yaml`` to extend."""
    SCHEMAS.register(name, schema)
    ConfigStore.instance().store(name=f"_schema_{name.replace('-', '_')}", node=schema)


def primary_config(name: str) -> str:
    """The config Hydra composes for step ``name``: ``conf/<name>.yaml``, or the step's schema
    alone when it has no YAML (all its defaults are in its dataclass)."""
    stem = name.replace("-", "_")
    if (CONF_DIR / f"{stem}.yaml").exists():
        return stem
    if name not in SCHEMAS:
        raise CptkitError(f"no config for step {name!r}: neither a declared schema nor {CONF_DIR / (stem + '.yaml')}")
    return f"_schema_{stem}"


def compose_step(name: str, overrides: list[str] | None = None, *, hydra_node: bool = False,
                 resolve: bool = True) -> DictConfig:
    """Compose ``conf/<name>.yaml`` with command-line overrides into a resolved, validated config.

    ``hydra_node`` keeps Hydra's own ``hydra:`` node (``--cfg hydra|all``); ``resolve=False``
    leaves interpolations as written (``--cfg job`` without ``--resolve``)."""
    config_name = primary_config(name)
    overrides = list(overrides or [])
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None, job_name=name.replace("-", "_")):
            cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=hydra_node)
    except (HydraException, OmegaConfBaseException) as e:
        raise CptkitError(redact_text(explain(e, name))) from None
    except yaml.YAMLError as e:  # a config file (conf/ or hydra.searchpath) that is not plain YAML
        raise CptkitError(redact_text(yaml_problem(e))) from None
    check_additions(name, overrides)
    if hydra_node or not resolve:
        return cfg
    return finalize(cfg, name, overrides)


def yaml_problem(e: yaml.YAMLError) -> str:
    """One line naming the config file and line of a YAML error; a ``!!python/...`` tag (never
    constructed: Hydra loads configs safely) is named as such."""
    mark = getattr(e, "problem_mark", None)
    where = f"{mark.name}:{mark.line + 1}" if mark is not None else "a config file"
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    tag = re.search(r"tag '(?:tag:yaml\.org,2002:)?([^']+)'", problem)
    if tag and tag.group(1).startswith("python/"):
        return f"{where}: the YAML tag !!{tag.group(1)} is refused: configs are plain YAML (no Python objects)"
    return f"{where}: not valid YAML: {problem}"


def schema_of(name: str) -> type | None:
    """The root dataclass a step registered (None before its module is imported)."""
    return SCHEMAS.find(name)


def config_group(key: str) -> bool:
    """Whether override key ``key`` selects a config group (``mix``, ``hydra/launcher``...), not a value."""
    return key.startswith("hydra") or (CONF_DIR / key.replace(".", "/")).is_dir()


def check_additions(name: str, overrides: list[str]) -> None:
    """``+key=value`` may only add a key the step's schema declares (or one under an open ``dict``
    field): a mistyped key is an error instead of a silently ignored setting."""
    schema = SCHEMAS.find(name)
    if schema is None:
        return
    root = OmegaConf.structured(schema)
    for ov in overrides:
        if not ov.startswith("+") or "=" not in ov:
            continue
        key = ov.lstrip("+").split("=", 1)[0]
        if config_group(key):
            continue
        node: Any = root
        parts = key.split(".")
        for i, part in enumerate(parts):
            if not isinstance(node, DictConfig):
                break  # below an Any-typed field
            if part in node:
                node = node._get_node(part)
                continue
            if not dataclasses.is_dataclass(OmegaConf.get_type(node)):
                break  # an open dict field: any key may be added
            where = ".".join(parts[:i])
            raise CptkitError(redact_text(_unknown(name, key, [f"{where}.{k}" if where else str(k) for k in node])))


def _unknown(step: str, key: str, siblings: list[str]) -> str:
    near = difflib.get_close_matches(key, siblings, n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"unknown config key {key} for {step}{hint}; 'cptkit {step} --help' lists the keys"


_TYPES = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}


def explain(e: BaseException, step: str) -> str:
    """One line saying what is wrong with an override, and why."""
    msg = _message(e)
    m = re.search(r"Could not override '([^']+)'", msg)
    if m:
        key = m.group(1)
        siblings: list[str] = []
        schema = SCHEMAS.find(step)
        if schema is not None:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            root = OmegaConf.structured(schema)
            node = OmegaConf.select(root, parent) if parent else root
            if isinstance(node, DictConfig):
                siblings = [f"{parent}.{k}" if parent else str(k) for k in node]
        return _unknown(step, key, siblings)
    cause: BaseException | None = e
    while cause is not None and "full_key:" not in str(cause):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        text = str(cause)
        key = re.search(r"full_key: (\S+)", text).group(1)  # type: ignore[union-attr]
        conv = re.search(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", text)
        if conv:
            want = _TYPES.get(conv.group(3), conv.group(3))
            return f"{key}={conv.group(1)}: expected {want}, got {conv.group(2)} {conv.group(1)!r}"
        return f"{key}: {one_line(text.split(chr(10))[0])}"
    return one_line(msg)


def _message(e: BaseException) -> str:
    """The first non-empty message along an exception's cause chain."""
    while e is not None:
        if str(e).strip():
            return str(e)
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return "invalid configuration"


def finalize(cfg: DictConfig, name: str, overrides: list[str] | None = None) -> DictConfig:
    """Resolve interpolations, fill ``step`` and validate; errors become one-line user errors."""
    try:
        OmegaConf.set_struct(cfg, False)
        cfg.step = name
        if overrides is not None:
            cfg.overrides = [redact_text(o) for o in overrides if not o.startswith(("io.", "quiet="))]
        OmegaConf.resolve(cfg)
        OmegaConf.set_struct(cfg, True)
    except OmegaConfBaseException as e:
        raise CptkitError(redact_text(one_line(_message(e)))) from None
    validate(cfg)
    return cfg


def validate(cfg: DictConfig) -> None:
    """Run every typed schema's ``__post_init__`` (innermost first) on ``cfg``'s values.

    A :class:`ConfigValueError` ``key=value: why`` becomes ``section.key=value: why``."""

    def walk(node: DictConfig, prefix: str) -> None:
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, f"{prefix}{key}.")
        if not dataclasses.is_dataclass(OmegaConf.get_type(node)):
            return
        try:
            OmegaConf.to_object(node)
        except ConfigValueError as e:
            raise CptkitError(redact_text(f"{prefix}{e}")) from None
        except (ValueError, TypeError) as e:
            raise CptkitError(redact_text(f"{prefix.rstrip('.') or 'config'}: {e}")) from None
        except OmegaConfBaseException:
            return  # a mandatory value (???) the step fills in itself

    walk(cfg, "")


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
            raise CptkitError(f"{template!r}: no config key {m.group(1)!r} to fill {{{m.group(1)}}}")
        return str(value)

    return _FIELD.sub(sub, template)


def to_dict(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
