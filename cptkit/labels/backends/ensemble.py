"""The ensemble backend (``train.backend=ensemble``): the backends of ``train.ensemble_members``
trained on the same examples, a document's class probabilities their mean; saved as one classifier
folder per member (``members/<i>-<backend>/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.shards import atomic_write_json
from cptkit.labels.backends.base import (
    BACKENDS,
    CLASSIFIER_JSON,
    ClassifierBackend,
    Examples,
    load_directory,
    train_backend,
)
from cptkit.labels.config import TrainParams


@BACKENDS.register("ensemble")
class EnsembleClassifier(ClassifierBackend):
    """Several backends trained on the same examples; a document's class probabilities are their mean."""

    def __init__(self, members: list[Any], labels: list[str], info: dict[str, Any]):
        if not members:
            raise CptkitError("train.ensemble_members is empty: name at least one backend")
        self.members, self.labels, self.info = members, labels, info

    @classmethod
    def fit(cls, ex: Examples, params: TrainParams, seed: int, progress: Any = None) -> EnsembleClassifier:
        for name in params.ensemble_members:
            if name == "ensemble" or (name not in BACKENDS and ":" not in name):
                known = ", ".join(b for b in BACKENDS.names() if b != "ensemble")
                raise CptkitError(f"train.ensemble_members: {name!r} is not a backend ({known})")
        members = [train_backend(name, ex, params, seed, progress) for name in params.ensemble_members]
        return cls(members, ex.classes, {"backend": "ensemble", "members": [m.info["backend"] for m in members]})

    @classmethod
    def load(cls, directory: Path, info: dict[str, Any]) -> EnsembleClassifier:
        folders = sorted((directory / "members").iterdir(), key=lambda d: int(d.name.split("-", 1)[0]))
        return cls([load_directory(d) for d in folders], list(info["labels"]), info)

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        return np.mean([m.predict_proba(texts) for m in self.members], axis=0)

    def save(self, directory: Path) -> None:
        for i, m in enumerate(self.members):
            d = directory / "members" / f"{i}-{m.info['backend']}"
            d.mkdir(parents=True, exist_ok=True)
            m.save(d)
            atomic_write_json(d / CLASSIFIER_JSON, m.info)
