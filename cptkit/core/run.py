"""What the framework hands a step beside its typed config: the run's infrastructure settings.

A step receives two things, each built once by :meth:`cptkit.core.step.Step.__call__`: its typed
config (the validated dataclass: what the step computes) and a :class:`Run` (where it reads and
writes, which slice of a job array it is, and the resolved config that the manifest records and
resume keys hash). Neither is mutated: a step that records a setting differently (a masked URL, a
key that does not change the result) asks for a changed copy with :meth:`Run.recording`.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from cptkit.core.config import IOConfig, ShardConfig, format_path, to_dict
from cptkit.core.redact import redact
from cptkit.core.shards import InputFile, resolve_inputs


@dataclass(frozen=True)
class OneOf:
    """Several values that each mean "not used" (a key whose default changed form, e.g. ``[]`` to null)."""

    values: tuple[Any, ...]


#: Keys added after outputs were recorded without them, each with the value that means "not used" (or a
#: :class:`OneOf` them): at that value the recorded config (manifest, resume keys, model card) leaves the key
#: out, so outputs written before it existed keep their identity. One table for every step; a key a step
#: does not have is skipped. The frame's own keys are here; a step's keys are declared with
#: :func:`later_key` by the module that defines their config section.
LATER_KEYS: dict[str, Any] = {
    "arm": None,  # JobConfig.arm: a sweep member's label
    "io.html_extractor": "resiliparse",  # IOConfig.html_extractor: how WARC archives' HTML is read
}


def later_key(key: str, unused: Any) -> None:
    """Declare ``key`` (dotted, from the config's root) a key added after outputs were recorded without it,
    with the value (or :class:`OneOf` the values) that means "not used" (:data:`LATER_KEYS`). Called at
    import by the module that defines the key's config dataclass, so every step that has the key has
    declared it before :meth:`Run.of` records a config. Declaring a key again with another value is an error."""
    if key in LATER_KEYS and LATER_KEYS[key] != unused:
        raise ValueError(f"later key {key!r} is declared twice: unused {LATER_KEYS[key]!r} and {unused!r}")
    LATER_KEYS[key] = unused


@dataclass(frozen=True)
class Run:
    """Infrastructure of one step run: step name, I/O, slice, verbosity and the recorded config."""

    step: str
    io: IOConfig
    shard: ShardConfig
    quiet: bool
    record: dict[str, Any]  # the resolved config, secrets redacted: the manifest and the resume keys

    @classmethod
    def of(cls, cfg: DictConfig) -> Run:
        record = redact(to_dict(cfg))
        for key, unused in LATER_KEYS.items():
            *parents, leaf = key.split(".")
            node = _node(record, parents)
            if isinstance(node, dict) and leaf in node and _unused(node[leaf], unused):
                del node[leaf]
        return cls(step=str(cfg.step), io=OmegaConf.to_object(cfg.io), shard=OmegaConf.to_object(cfg.shard),
                   quiet=bool(cfg.get("quiet", False)), record=record)

    def recording(self, key: str, value: Any) -> Run:
        """A copy whose recorded config has ``key`` (dotted) set to ``value``; an ``io.*`` key
        changes the I/O settings the run uses too."""
        record = copy.deepcopy(self.record)
        *parents, leaf = key.split(".")
        node = record
        for p in parents:
            node = node[p]
        node[leaf] = value
        io = dataclasses.replace(self.io, **{leaf: value}) if parents == ["io"] else self.io
        return dataclasses.replace(self, io=io, record=redact(record))

    def resolve_inputs(self, specs: list[str] | str | None = None) -> list[InputFile]:
        """The input shards of ``specs`` (default: ``--in``) under this run's settings: a step's
        output without ``_SUCCESS`` is read only with ``io.allow_partial``."""
        specs = list(self.io.inputs) if specs is None else specs
        return resolve_inputs(specs, allow_partial=self.io.allow_partial)

    def without(self, key: str) -> Run:
        """A copy whose recorded config leaves ``key`` (dotted) out: a setting at its default that the
        manifest, the resume keys and the model card have never shown."""
        record = copy.deepcopy(self.record)
        *parents, leaf = key.split(".")
        node = record
        for p in parents:
            node = node.get(p, {})
        node.pop(leaf, None)
        return dataclasses.replace(self, record=record)


def _unused(value: Any, unused: Any) -> bool:
    return value in unused.values if isinstance(unused, OneOf) else value == unused


def _node(record: dict[str, Any], parents: list[str]) -> Any:
    """``record``'s sub-mapping at ``parents`` (None where there is none)."""
    node: Any = record
    for p in parents:
        node = node.get(p) if isinstance(node, dict) else None
    return node


def with_paths(cfg: DictConfig) -> DictConfig:
    """A copy of ``cfg`` whose ``--out`` and ``--in`` have their ``{key}`` placeholders filled from the
    config: a sweep's members read and write their own directories (``--in 'stream_s{seed}'``)."""
    out = format_path(cfg.io.output, cfg)
    inputs = [format_path(p, cfg) for p in cfg.io.inputs]
    if out == cfg.io.output and inputs == list(cfg.io.inputs):
        return cfg
    return OmegaConf.merge(cfg, {"io": {"output": out, "inputs": inputs}})  # type: ignore[return-value]
