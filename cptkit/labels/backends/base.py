"""The classifier backend interface and its registry: what every backend implements, how a run's
backend (``train.backend``: a registered name or ``package.module:Class``) is trained, and how a
classifier directory is loaded back by the backend named in its ``classifier.json``.

A classifier folder is data: the backend its ``classifier.json`` names must be a registered one,
or a plugin that the command line or config allows (``quality.plugins``, ``topics.plugins``); a
folder never makes cptkit import a module of its choosing."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Collection
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.registry import Registry
from cptkit.labels.config import TrainParams

CLASSIFIER_JSON = "classifier.json"
# The version of the document tokenizer (cptkit.text.tokenize's "fasttext" preset) stored in
# classifier.json. Version 1: models trained before tokenizer 2 (digits split from letters).
TOKENIZER = 2


@dataclass
class Examples:
    """The training split that every backend of a run sees: texts with their labels and ids, the
    sorted classes, and each class as one whitespace-free token (fastText's ``__label__`` form)."""

    texts: list[str]
    labels: list[str]
    ids: list[str]
    classes: list[str]
    tokens: dict[str, str]


class ClassifierBackend(ABC):
    """A trained classifier of one backend: ``labels`` (the classes, in column order), ``info``
    (what ``classifier.json`` records; ``info["backend"]`` names the backend that loads it back)."""

    labels: list[str]
    info: dict[str, Any]

    @classmethod
    @abstractmethod
    def fit(cls, ex: Examples, params: TrainParams, seed: int, progress: Any = None) -> ClassifierBackend:
        """Train on ``ex`` with the run's ``train.*`` settings; ``progress(n)`` counts examples done."""

    @classmethod
    @abstractmethod
    def load(cls, directory: Path, info: dict[str, Any]) -> ClassifierBackend:
        """The classifier that :meth:`save` wrote into ``directory`` (``info``: its ``classifier.json``)."""

    @abstractmethod
    def predict_proba(self, texts: list[str]) -> np.ndarray:
        """Class probabilities, one row per text, columns in ``labels`` order."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write the weights into ``directory`` (``classifier.json`` is written by the caller)."""


BACKENDS: Registry[type[ClassifierBackend]] = Registry("train.backend", base=ClassifierBackend)


def train_backend(name: str, ex: Examples, params: TrainParams, seed: int, progress: Any = None) -> ClassifierBackend:
    """The backend ``name`` trained on ``ex``; its ``info`` names the backend and the classes."""
    clf = BACKENDS.get(name).fit(ex, params, seed, progress)
    clf.info["backend"] = name  # what load_directory looks up (a plugin's package.module:Class too)
    clf.info.update({"labels": ex.classes, "label_tokens": [ex.tokens[c] for c in ex.classes]})
    return clf


_PLUGINS: ContextVar[frozenset[str]] = ContextVar("classifier_plugins", default=frozenset())


def load_directory(directory: Path, plugins: Collection[str] | None = None) -> ClassifierBackend:
    """The classifier saved in ``directory``, loaded by the backend its ``classifier.json`` names: a
    registered one, or a plugin (``package.module:Class``) listed in ``plugins`` (what the command
    line or config allows; None: what the enclosing load allowed, for an ensemble's members)."""
    meta = directory / CLASSIFIER_JSON
    if not meta.exists():
        raise CptkitError(f"{directory}: not a classifier (no {CLASSIFIER_JSON}); train one with "
                          "cptkit score-quality-train or cptkit label-topics-train")
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError) as e:
        raise CptkitError(f"{meta}: cannot read: {e}") from None
    name = info.get("backend") if isinstance(info, dict) else None
    if not isinstance(name, str):
        raise CptkitError(f"{meta}: names no backend (a string 'backend' is missing)")
    allowed = _PLUGINS.get() if plugins is None else frozenset(plugins)
    backend = BACKENDS.find(name)
    if backend is None:
        if name not in allowed:
            known = ", ".join(BACKENDS.names())
            hint = ("; a model folder cannot choose code to import: allow that plugin on the command line "
                    f"(quality.plugins=[{name}], edu.plugins or topics.plugins)" if ":" in name else "")
            raise CptkitError(f"{meta}: backend {name[:200]!r} is not a registered one ({known}){hint}")
        backend = BACKENDS.get(name)
    token = _PLUGINS.set(allowed)
    try:
        return backend.load(directory, info)
    finally:
        _PLUGINS.reset(token)
