"""Model folders never run their own code unless asked.

A Hugging Face folder may ship Python files (``modeling_*.py``, ``tokenization_*.py``) that its
``config.json`` or ``tokenizer_config.json`` names in ``auto_map``; transformers imports them only
with ``trust_remote_code=True``, and with the argument left out it asks on stdin, so a piped
``y`` runs a shared folder's code on the host. cptkit passes an explicit ``trust_remote_code`` to
every ``from_pretrained`` and, unless the step's setting opts in, refuses such a folder before
transformers reads it: one line naming the folder, the reason and the setting, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError

__all__ = ["needs_remote_code", "remote_code_kwargs"]

_MAX_JSON = 16 * 2**20  # a config file larger than this is not read here (transformers reports it)


def _json(path: Path) -> dict[str, Any] | None:
    try:
        if not path.is_file() or path.stat().st_size > _MAX_JSON:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # unreadable: transformers' own error names it
    return data if isinstance(data, dict) else None


def _known_model_type(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING,  # heavy: only when a folder is checked
    )

    return model_type in CONFIG_MAPPING


def needs_remote_code(folder: str | Path) -> str | None:
    """Why loading ``folder`` would run code from it (None when it would not, or it is no folder):
    an ``auto_map`` in ``config.json`` or ``tokenizer_config.json``, or a ``model_type`` that
    transformers does not know (its classes could only come from the folder)."""
    p = Path(folder)
    if not p.is_dir():
        return None
    for name in ("config.json", "tokenizer_config.json"):
        data = _json(p / name)
        if data is None:
            continue
        auto_map = data.get("auto_map")
        if auto_map:
            classes = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else "its tokenizer"
            return f"{name} names code shipped in the folder (auto_map: {classes})"
        model_type = data.get("model_type")
        if name == "config.json" and isinstance(model_type, str) and not _known_model_type(model_type):
            return f"config.json has model_type {model_type!r}, which transformers does not know"
    return None


def remote_code_kwargs(folder: str | Path, trust: bool = False, setting: str | None = None) -> dict[str, Any]:
    """``{"trust_remote_code": trust}`` for ``from_pretrained`` of ``folder``; without ``trust``,
    a folder that would run its own code is refused with one line naming it and ``setting`` (the
    key that opts in; None where nothing does)."""
    if not trust:
        why = needs_remote_code(folder)
        if why:
            unless = f"unless {setting}=true" if setting else "here"
            raise CptkitError(f"model folder {folder}: {why}; cptkit does not run a model folder's code {unless}")
    return {"trust_remote_code": bool(trust)}
