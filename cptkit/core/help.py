"""``cptkit STEP --help``: the step's config keys with their defaults and one-line help.

Generated from the typed schema: values from the composed default config (the dataclass
defaults with ``conf/<step>.yaml`` on top), one-line help from the comment after each
dataclass field (``ngram: int = 13  # words per shingle``).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tokenize
from functools import cache
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from cptkit.core.config import compose_step
from cptkit.core.discovery import step_module

HIDDEN = {"step", "overrides"}  # filled in by cptkit itself


@cache
def field_comments(cls: type) -> dict[str, str]:
    """``{field: comment}`` from the trailing ``# comments`` of a dataclass's field lines."""
    try:
        src = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    current = None
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4 and tok.string in names:
            current = (tok.string, tok.start[0])
        elif tok.type == tokenize.COMMENT and current and tok.start[0] == current[1]:
            out[current[0]] = tok.string.lstrip("#").strip()
    for base in cls.__mro__[1:]:
        if dataclasses.is_dataclass(base):
            for k, v in field_comments(base).items():
                out.setdefault(k, v)
    return out


def _show(value: Any) -> str:
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)


def config_rows(cfg: DictConfig) -> list[tuple[str, str, str]]:
    """(key, default, help) for every leaf key of a composed step config, in schema order."""
    rows: list[tuple[str, str, str]] = []

    def walk(node: DictConfig, prefix: str) -> None:
        cls = OmegaConf.get_type(node)
        notes = field_comments(cls) if dataclasses.is_dataclass(cls) else {}
        for key in node.keys():
            if not prefix and key in HIDDEN:
                continue
            child = node._get_node(key)
            name = f"{prefix}{key}"
            typed = dataclasses.is_dataclass(OmegaConf.get_type(child)) if isinstance(child, DictConfig) else False
            if isinstance(child, DictConfig) and not child._is_none() and (typed or len(child) <= 12):
                if typed or len(child):
                    walk(child, name + ".")
                    continue
            rows.append((name, _show(node[key]), notes.get(str(key), "")))

    walk(cfg, "")
    return rows


def config_help(step: str) -> str:
    """The text block listing ``step``'s config keys (for ``cptkit STEP --help``)."""
    step_module(step)
    cfg = compose_step(step)
    rows = config_rows(cfg)
    width = min(max(len(k) + len(v) + 1 for k, v, _ in rows), 48)
    lines = [f"Config keys (KEY=VALUE after the options; defaults from the schema and conf/{step.replace('-', '_')}.yaml):"]
    for key, value, note in rows:
        kv = f"{key}={value}"
        lines.append(f"  {kv:<{width}}  {note}".rstrip() if len(kv) <= width else f"  {kv}\n  {'':<{width}}  {note}".rstrip())
    return "\n".join(lines) + "\n"
