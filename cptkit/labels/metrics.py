"""Classifier metrics and scores, pure functions: accuracy, macro-F1, the majority baseline, ROC AUC,
the confusion table and the expected value of numeric classes."""

from __future__ import annotations

from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError


def evaluate(gold: list[str], pred: list[str], labels: list[str]) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class P/R/F1, the confusion matrix and the majority baseline.

    ``confusion[i][j]`` counts gold ``labels[i]`` predicted as ``labels[j]``. The majority
    baseline predicts the most frequent gold class of the evaluated set for everything.
    """
    idx = {lab: i for i, lab in enumerate(labels)}
    n = len(labels)
    conf = np.zeros((n, n), dtype=np.int64)
    for g, p in zip(gold, pred, strict=True):
        conf[idx[g], idx[p]] += 1
    total = int(conf.sum())
    tp = np.diag(conf).astype(float)
    support = conf.sum(axis=1).astype(float)
    predicted = conf.sum(axis=0).astype(float)
    prec = np.divide(tp, predicted, out=np.zeros(n), where=predicted > 0)
    rec = np.divide(tp, support, out=np.zeros(n), where=support > 0)
    f1 = np.divide(2 * prec * rec, prec + rec, out=np.zeros(n), where=(prec + rec) > 0)
    present = support > 0
    return {
        "n": total,
        "accuracy": float(tp.sum() / total) if total else 0.0,
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "majority_accuracy": float(support.max() / total) if total else 0.0,
        "majority_macro_f1": majority_macro_f1(support),
        "per_class": {lab: {"precision": float(prec[i]), "recall": float(rec[i]), "f1": float(f1[i]),
                            "support": int(support[i])} for i, lab in enumerate(labels)},
        "labels": list(labels),
        "confusion": conf.tolist(),
    }


def roc_auc(scores: Any, positive: Any) -> float:
    """Area under the ROC curve: P(score of a random positive > score of a random negative), ties
    counting one half (the Mann-Whitney U statistic / (n_pos · n_neg)). NaN without both classes."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if not n_pos or not n_neg:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def majority_macro_f1(support: np.ndarray) -> float:
    """Macro-F1 of predicting the most frequent class for everything: its F1 is 2s/(1+s) for its
    share s (precision s, recall 1), every other present class scores 0."""
    support = np.asarray(support, dtype=float)
    total, present = support.sum(), int((support > 0).sum())
    if not total:
        return 0.0
    s = support.max() / total
    return float(2 * s / (1 + s) / present)


def no_better_than_majority(metrics: dict[str, Any]) -> bool:
    """True when the held-out accuracy or macro-F1 does not beat the majority-class predictor."""
    return (metrics["accuracy"] <= metrics["majority_accuracy"] + 1e-9
            or metrics["macro_f1"] <= metrics.get("majority_macro_f1", 0.0) + 1e-9)


def confusion_text(metrics: dict[str, Any]) -> str:
    """The confusion matrix as an aligned text table (rows gold, columns predicted)."""
    labels = metrics["labels"]
    short = [lab[:12] for lab in labels]
    w = max([len(s) for s in short] + [6])
    lines = ["gold \\ pred".ljust(w) + " " + " ".join(s.rjust(w) for s in short)]
    for s, row in zip(short, metrics["confusion"], strict=True):
        lines.append(s.ljust(w) + " " + " ".join(str(v).rjust(w) for v in row))
    return "\n".join(lines)


def expected_value(probs: np.ndarray, labels: list[str]) -> np.ndarray:
    """Σ_c p(c)·value(c) for numeric class labels (educational value: classes 0, 1, 2)."""
    try:
        values = np.array([float(lab) for lab in labels])
    except ValueError:
        raise CptkitError(f"expected value needs numeric class labels, got {labels}") from None
    return probs @ values


def numeric_labels(labels: list[str]) -> bool:
    try:
        [float(lab) for lab in labels]
    except ValueError:
        return False
    return True
