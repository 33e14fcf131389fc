"""Training, saving and loading text classifiers, whatever their backend: fastText (default), a
MiniLM/BERT fine-tune, frozen MiniLM sentence embeddings (with word n-gram TF-IDF) under a
multinomial logistic regression, an ensemble of any of them, or a backend of your own
(:mod:`cptkit.labels.backends`).

Used by ``score-quality`` (quality and educational value) and ``label-topics``. A trained
classifier is a directory holding ``classifier.json`` (backend, labels, metrics, parameters)
and the backend's weights (``model.bin`` for fastText, ``hf/`` for transformers, ``embed.npz`` and
``vocab.json`` for the embedding head, ``members/<i>-<backend>/`` classifier folders for an ensemble).

* :func:`train_classifier` splits the examples into train/held-out by a hash of
  ``(seed, id)``, trains, and returns the classifier with held-out metrics.
* :func:`load_classifier` gives an object with ``labels`` and ``predict_proba(texts)``.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import cptkit.labels.backends  # noqa: F401  (registers the built-in backends)
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
from cptkit.labels.backends.fasttext import load_fasttext_file
from cptkit.labels.config import TrainParams
from cptkit.labels.metrics import evaluate, roc_auc
from cptkit.text.hashing import unit_hash

METRICS_JSON = "metrics.json"  # held-out metrics, per-class F1, majority baseline and the tuning trials


def split_heldout(ids: list[str], fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of held-out examples: ``unit_hash(seed, "heldout/" + id) < fraction``.

    The salt keeps the split independent of other hash-of-id choices, such as the annotation
    sample (the records with the smallest ``unit_hash(seed, id)``), which would all land in it.
    """
    return np.array([unit_hash(seed, "heldout/" + i) < fraction for i in ids], dtype=bool)


@dataclass
class TrainResult:
    classifier: Any
    metrics: dict[str, Any]
    counts: dict[str, int]


def train_classifier(ids: list[str], texts: list[str], labels: list[str], params: TrainParams,
                     seed: int, progress: Any = None) -> TrainResult:
    """Train on the non-held-out examples and measure on the held-out ones.

    Classes are the sorted distinct labels. Needs ≥ 2 classes; with ``heldout`` > 0 the
    held-out set must not be empty.
    """
    BACKENDS.get(params.backend)  # an unknown name (or a plugin that does not load) fails before any work
    classes = sorted(set(labels))
    if len(classes) < 2:
        raise CptkitError(f"need at least 2 classes to train a classifier, got {classes}")
    held = split_heldout(ids, params.heldout, seed)
    if params.heldout > 0 and not held.any():
        raise CptkitError(f"held-out split is empty ({len(ids)} examples, heldout={params.heldout})")
    if held.all():
        raise CptkitError(f"training split is empty ({len(ids)} examples, heldout={params.heldout})")
    tr = [i for i in range(len(ids)) if not held[i]]
    te = [i for i in range(len(ids)) if held[i]]
    if params.max_per_class:
        by: dict[str, list[int]] = {}
        for i in sorted(tr, key=lambda i: unit_hash(seed + 1, ids[i])):
            by.setdefault(labels[i], []).append(i)
        tr = sorted(i for lst in by.values() for i in lst[:params.max_per_class])
    ex = Examples(texts=[texts[i] for i in tr], labels=[labels[i] for i in tr], ids=[ids[i] for i in tr],
                  classes=classes, tokens={c: re.sub(r"\s+", "_", c) for c in classes})
    clf = train_backend(params.backend, ex, params, seed, progress)
    metrics: dict[str, Any] = {}
    if te:
        probs = clf.predict_proba([texts[i] for i in te])
        pred = [classes[j] for j in probs.argmax(axis=1)]
        metrics = evaluate([labels[i] for i in te], pred, classes)
        if len(classes) == 2:  # binary: how well the probability separates the held-out classes
            # (the same number for either class: the two probabilities sum to 1)
            metrics["auc"] = round(roc_auc(probs[:, 1], [labels[i] == classes[1] for i in te]), 6)
    counts = {"train": len(tr), "heldout": len(te)}
    counts |= {f"train[{c}]": sum(1 for lab in ex.labels if lab == c) for c in classes}
    return TrainResult(clf, metrics, counts)


def save_classifier(result: TrainResult, directory: str | Path, params: TrainParams, seed: int,
                    extra: dict[str, Any] | None = None) -> None:
    """Write the weights and ``classifier.json`` (written last: its presence marks a model)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    result.classifier.save(directory)
    info = {**result.classifier.info, "seed": seed, "params": asdict(params), "counts": result.counts,
            "metrics": result.metrics, **(extra or {})}
    atomic_write_json(directory / METRICS_JSON, {"metrics": result.metrics, "counts": result.counts,
                                                 "tuning": result.classifier.info.get("tuning"),
                                                 "fasttext": result.classifier.info.get("fasttext"),
                                                 "embed": result.classifier.info.get("embed")})
    atomic_write_json(directory / CLASSIFIER_JSON, info)


def load_classifier(directory: str | Path, plugins: Collection[str] = ()) -> ClassifierBackend:
    """Load a classifier directory written by :func:`save_classifier` (by the backend its
    ``classifier.json`` names: a registered one, or one of ``plugins``, the backend plugins the
    command line allows), or a bare fastText model file (:func:`load_fasttext_file`)."""
    directory = Path(directory)
    if directory.is_file():
        return load_fasttext_file(directory)
    return load_directory(directory, plugins)
