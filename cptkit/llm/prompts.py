"""Prompts as configuration: ``conf/prompts/*.yaml`` files of this schema (docs/prompts.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cptkit.core.config import check as check_value
from cptkit.core.errors import CptkitError


@dataclass
class PromptConfig:
    """One prompt: a template with ``{placeholder}`` fields and its generation settings."""

    name: str = ""
    system: str | None = None  # optional system message (chat models)
    template: str = ""
    max_new_tokens: int = 256
    temperature: float | None = None  # None: llm.temperature


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def placeholders(template: str) -> set[str]:
    return set(_FIELD.findall(template))


def render(prompt: Any, **fields: str) -> str | list[dict[str, str]]:
    """Fill ``{name}`` placeholders of ``prompt.template`` (other braces, e.g. LaTeX, stay).

    Returns a plain string, or chat messages when the prompt has a system message.
    """
    text = _FIELD.sub(lambda m: str(fields[m.group(1)]) if m.group(1) in fields else m.group(0), str(prompt.template))
    if getattr(prompt, "system", None):
        return [{"role": "system", "content": str(prompt.system)}, {"role": "user", "content": text}]
    return text


def max_new_tokens(prompt: Any, llm: Any) -> int:
    """The token limit for ``prompt``: ``llm.max_new_tokens`` when set (the command line wins),
    else the prompt file's ``max_new_tokens``."""
    v = llm.get("max_new_tokens") if hasattr(llm, "get") else getattr(llm, "max_new_tokens", None)
    return int(v) if v is not None else int(prompt.max_new_tokens)


def lacking(prompt: Any, required: set[str]) -> str:
    """The required placeholders ``prompt.template`` does not use, as ``{a}, {b}`` ('' when none)."""
    missing = required - placeholders(str(prompt.template))
    return ", ".join("{" + m + "}" for m in sorted(missing))


def check(prompt: Any, required: set[str], where: str) -> None:
    """A prompt must use every required placeholder (else the model never sees the input)."""
    missing = lacking(prompt, required)
    if missing:
        raise CptkitError(f"{where}: prompt {getattr(prompt, 'name', None) or ''!r} lacks placeholder(s) {missing}")


def check_prompt(prompt: PromptConfig, required: set[str], key: str) -> None:
    """:func:`check` for a schema's ``__post_init__``: ``key='name': lacks placeholder(s) {a}``
    (:func:`cptkit.core.config.check`'s form). The schema's bare default (no prompt file chosen, as
    when the schema is stored) is not checked: every step's YAML picks a prompt file."""
    if prompt == PromptConfig():
        return
    missing = lacking(prompt, required)
    check_value(not missing, key, repr(prompt.name), f"the template lacks placeholder(s) {missing}")
