"""The classifier backend interface and its registry: what every backend implements, how a run's
backend (``train.backend``: a registered name or ``package.module:Class``) is trained, and how a
classifier directory is loaded back by the backend named in its ``classifier.json``."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
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


def load_directory(directory: Path) -> ClassifierBackend:
    """The classifier saved in ``directory``, loaded by the backend its ``classifier.json`` names."""
    meta = directory / CLASSIFIER_JSON
    if not meta.exists():
        raise CptkitError(f"{directory}: not a classifier (no {CLASSIFIER_JSON}); train one with "
                          "cptkit score-quality-train or cptkit label-topics-train")
    info = json.loads(meta.read_text())
    backend = BACKENDS.find(info["backend"])
    if backend is None and ":" not in info["backend"]:
        raise CptkitError(f"{meta}: unknown backend {info['backend']!r}")
    return (backend or BACKENDS.get(info["backend"])).load(directory, info)
