"""What the classifier-training steps share (score-quality-train, label-topics-train): their
training parameters from the config, the quality gate on held-out scores, and the summary rows."""

from __future__ import annotations

import copy

from cptkit.core.errors import CptkitError
from cptkit.core.progress import console, log
from cptkit.labels.config import TrainParams
from cptkit.labels.metrics import confusion_text, no_better_than_majority


def params_of(train: TrainParams, cls: type = TrainParams) -> TrainParams:
    """The TrainParams part of a step's typed ``train`` config (a TrainParams subclass), as its own copy."""
    keep = {k: copy.deepcopy(getattr(train, k)) for k in ("backend", "heldout", "max_per_class", "max_chars", "min_f1",
                                                          "tune", "fasttext", "minilm", "embed", "ensemble_members")}
    return cls(**keep)


def check_quality(metrics: dict, title: str, min_f1: float) -> None:
    """Warn when the held-out scores do not beat the majority class; fail below ``train.min_f1``."""
    if not metrics:
        return
    if no_better_than_majority(metrics):
        log.warning("%s: the classifier is no better than always answering the majority class (held-out "
                    "accuracy %.4f vs %.4f, macro-F1 %.4f vs %.4f): label more examples or check the labels",
                    title, metrics["accuracy"], metrics["majority_accuracy"], metrics["macro_f1"],
                    metrics["majority_macro_f1"])
    if min_f1 and metrics["macro_f1"] < min_f1:
        raise CptkitError(f"{title}: held-out macro-F1 {metrics['macro_f1']:.4f} is below train.min_f1={min_f1} "
                          f"(majority class {metrics['majority_macro_f1']:.4f}); no model written")


def report(metrics: dict, title: str, quiet: bool) -> dict:
    """Log held-out metrics and the confusion table; return the summary rows."""
    if not metrics:
        return {}
    if not quiet:
        console.print(f"[bold]{title}[/bold] held-out confusion (rows gold, columns predicted):")
        console.print(confusion_text(metrics), markup=False, highlight=False)
    log.info("%s held-out: accuracy %.4f, macro-F1 %.4f (majority class %.4f / %.4f, n=%d)", title,
             metrics["accuracy"], metrics["macro_f1"], metrics["majority_accuracy"], metrics["majority_macro_f1"],
             metrics["n"])
    rows = {f"{title} held-out n": metrics["n"], f"{title} accuracy": metrics["accuracy"],
            f"{title} macro-F1": metrics["macro_f1"], f"{title} majority-class accuracy": metrics["majority_accuracy"],
            f"{title} majority-class macro-F1": metrics["majority_macro_f1"]}
    rows |= {f"{title} F1 [{c}]": round(v["f1"], 4) for c, v in metrics["per_class"].items() if v["support"]}
    if "auc" in metrics:
        rows[f"{title} held-out AUC (positive vs negative)"] = metrics["auc"]
    return rows


def tuning_rows(clf, title: str) -> dict:
    """The chosen fastText (or embedding-head) settings and how many candidates were tried, for the summary
    (an ensemble's, member by member)."""
    if clf.info.get("backend") == "ensemble":
        rows = {f"{title} ensemble": " + ".join(clf.info["members"]) + ", probabilities averaged"}
        for m in clf.members:
            rows |= tuning_rows(m, f"{title} [{m.info['backend']}]")
        return rows
    ft, em, tun = clf.info.get("fasttext"), clf.info.get("embed"), clf.info.get("tuning")
    if ft:
        chosen = f"epoch {ft['epoch']}, lr {ft['lr']:g}, wordNgrams {ft['word_ngrams']}, minn/maxn {ft['minn']}/{ft['maxn']}"
        rows = {f"{title} fastText settings": chosen}
    elif em:
        rows = {f"{title} embedding head": f"C {em['c']:g}, n-gram weight {em['ngram_weight']:g}, "
                                           f"{em['terms']} n-grams, max_length {em['max_length']}"}
    else:
        return {}
    if tun:
        best = max((t["macro_f1"] for t in tun["trials"]), default=None)
        rows[f"{title} tuning"] = (f"{tun['mode']}: {len(tun['trials'])} candidates on {tun['validation_examples']} "
                                   f"validation examples, best macro-F1 {best}")
    return rows
