"""The fastText backend (``train.backend=fasttext``, the default): the document line it reads, the
settings search (grid or autotune) and bit-reproducible training in a fresh process, and bare
fastText model files trained elsewhere."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.labels.backends.base import BACKENDS, TOKENIZER, ClassifierBackend, Examples
from cptkit.labels.config import FastTextParams, TrainParams, TuneParams
from cptkit.labels.metrics import evaluate
from cptkit.text.fasttext_model import load_fasttext
from cptkit.text.hashing import unit_hash
from cptkit.text.tokenize import word_tokenizer

# The line tokenizers (cptkit.text.tokenize presets): CJK ideographs become one token each
# (fastText splits on whitespace only). Version 1: models trained before tokenizer 2.
_LINE_TOKENS = word_tokenizer("fasttext")
_LINE_TOKENS_V1 = word_tokenizer("fasttext_v1")
TUNE_MODES = ("grid", "autotune", "off")


def tune_grid(t: TuneParams) -> list[dict[str, Any]]:
    """The grid's candidate settings, cheapest first (fewer epochs, no character n-grams, lower lr)."""
    return [{"epoch": int(e), "lr": float(lr), "word_ngrams": int(w), "minn": int(mn[0]), "maxn": int(mn[1])}
            for mn in t.char_ngrams for e in sorted(t.epoch) for w in sorted(t.word_ngrams) for lr in sorted(t.lr)]


def fasttext_line(text: str, max_chars: int = 4000) -> str:
    """Normalise a document into one fastText input line: lowercase; tokens are runs of letters and
    digits, each punctuation mark, each CJK ideograph; joined by single spaces.

    ASCII text (most documents) takes an ASCII-only pattern that gives the same tokens ~1.7x faster."""
    return " ".join(_LINE_TOKENS(text[:max_chars]))


def fasttext_line_v1(text: str, max_chars: int = 4000) -> str:
    """The tokenizer of classifiers saved without a ``tokenizer`` version (digits split from letters)."""
    return " ".join(_LINE_TOKENS_V1(text[:max_chars]))


def raw_line(text: str) -> str:
    """A document as a bare fastText model file is given it: the whole text, stripped, its newlines
    made spaces (fastText predicts one line; it splits on whitespace itself). What datatrove's
    ``FastTextClassifierFilter`` passes to ``predict``."""
    return text.strip().replace("\n", " ")


def _ft_args(p: dict[str, Any]) -> dict[str, Any]:
    return {"epoch": p["epoch"], "lr": p["lr"], "wordNgrams": p["word_ngrams"], "dim": p["dim"],
            "minCount": p["min_count"], "bucket": p["bucket"], "minn": p["minn"], "maxn": p["maxn"],
            "thread": p["thread"]}


def _ft_train(fasttext: Any, path: str, args: dict[str, Any], seed: int, **extra: Any) -> Any:
    lr = args["lr"]
    for attempt in range(4):  # fastText diverges ("Encountered NaN") when lr is too high
        try:
            return fasttext.train_supervised(input=path, seed=seed, verbose=0, loss="softmax", **{**args, "lr": lr},
                                             **extra)
        except RuntimeError as e:
            if "NaN" not in str(e) or attempt == 3:
                raise
            lr /= 2


def _ft_macro_f1(model: Any, path: str) -> float:
    gold, lines = [], []
    with open(path, encoding="utf-8") as f:
        for ln in f:
            lab, _, text = ln.rstrip("\n").partition(" ")
            gold.append(lab)
            lines.append(text)
    pred = [labs[0] if labs else "" for labs in model.predict(lines, k=1)[0]]
    labels = sorted(set(gold) | set(pred))
    return evaluate(gold, pred, labels)["macro_f1"]


M_PERTURB = -6  # glibc mallopt: fill every allocation with the complement of a byte (255: zeros)


def zero_filled_allocations() -> bool:
    """From now on, glibc's malloc returns zero-filled memory in this process; False off glibc.

    fastText 0.9.2 with ``thread=1`` initialises only the first tenth of its input matrix
    (``DenseMatrix::uniform`` fills block 0 of 10) and trains from whatever malloc returned for the
    rest: zero pages for a large matrix (default dim and bucket) in a fresh process, but the bytes
    of freed allocations for a small one (dim=8, bucket=1000) or for the second training in a
    process (the settings grid): another model on every run, at times NaN. Zero-filled allocations
    give every training the zeros a fresh large matrix gets, so its bytes depend on its data,
    settings and seed only.
    """
    import ctypes  # deferred: only the training process needs it

    try:
        return bool(ctypes.CDLL(None).mallopt(M_PERTURB, 255))
    except (OSError, AttributeError):
        return False


def _fasttext_worker(path: str, job: dict[str, Any]) -> None:
    """Train (after choosing settings on a validation file when ``job`` has a grid); save ``path.bin``.

    Writes ``path.json``: the chosen settings and every trial with its validation macro-F1.
    """
    if not zero_filled_allocations():
        log.warning("fastText training here may differ from run to run: malloc cannot be made to zero-fill "
                    "(glibc's mallopt is missing), and fastText reads memory it never initialised")
    import fasttext  # deferred: a compiled extension, imported in the training process only

    seed, base = job["seed"], job["params"]
    trials: list[dict[str, Any]] = []
    chosen = dict(base)
    if job.get("grid"):
        for cand in job["grid"]:
            p = {**base, **cand}
            try:
                model = _ft_train(fasttext, job["tune_train"], _ft_args(p), seed)
            except RuntimeError as e:  # diverged even at a lower lr: this candidate loses
                trials.append({**cand, "macro_f1": -1.0, "error": str(e)})
                continue
            trials.append({**cand, "macro_f1": round(_ft_macro_f1(model, job["tune_valid"]), 6)})
        # best first (ties: earliest, i.e. cheapest); should the final fit of a setting (on more data
        # than its trial) diverge even at a lower lr, the next best one is trained
        order = sorted(range(len(trials)), key=lambda i: (-trials[i]["macro_f1"], i))
        for rank, i in enumerate(order):
            chosen = {**base, **job["grid"][i]}
            try:
                model = _ft_train(fasttext, path, _ft_args(chosen), seed)
                break
            except RuntimeError as e:
                if "NaN" not in str(e) or rank == len(order) - 1:
                    raise
                trials[i]["final_fit_error"] = str(e)
    elif job.get("autotune_seconds"):
        model = fasttext.train_supervised(input=job["tune_train"], autotuneValidationFile=job["tune_valid"],
                                          autotuneDuration=int(job["autotune_seconds"]), seed=seed, verbose=0,
                                          loss="softmax")
        chosen = {**base, "epoch": model.epoch, "lr": model.lr, "word_ngrams": model.wordNgrams, "dim": model.dim,
                  "min_count": model.minCount, "bucket": model.bucket, "minn": model.minn, "maxn": model.maxn}
        model = _ft_train(fasttext, path, _ft_args(chosen), seed)
    else:
        model = _ft_train(fasttext, path, _ft_args(base), seed)
    model.save_model(path + ".bin")
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump({"chosen": chosen, "trials": trials}, f)


def _train_fasttext_isolated(path: str, job: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Train in a fresh process, whose allocations :func:`zero_filled_allocations` fills with zeros
    (in this process it would slow every allocation). Returns the model path and the tuning record."""
    import multiprocessing as mp  # deferred: only training spawns

    proc = mp.get_context("spawn").Process(target=_fasttext_worker, args=(path, job))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"fastText training failed (exit code {proc.exitcode}); see the error above")
    with open(path + ".json", encoding="utf-8") as f:
        return path + ".bin", json.load(f)


@BACKENDS.register("fasttext")
class FastTextClassifier(ClassifierBackend):
    """A fastText supervised model; probabilities for every class, columns in ``labels`` order."""

    def __init__(self, model: Any, labels: list[str], info: dict[str, Any]):
        self.model, self.labels, self.info = model, labels, info
        self.max_chars = int(info.get("max_chars", 4000))
        self._col = {f"__label__{lab}": i for i, lab in enumerate(labels)}
        self.raw = info.get("tokenizer") == "raw"  # a bare model file (:func:`load_fasttext_file`)
        if self.raw:
            self._line = lambda text, _max_chars: raw_line(text)
        else:
            self._line = fasttext_line if int(info.get("tokenizer", 1)) >= 2 else fasttext_line_v1

    @classmethod
    def fit(cls, ex: Examples, params: TrainParams, seed: int, progress: Any = None) -> FastTextClassifier:
        clf = cls.train(ex.texts, [ex.tokens[lab] for lab in ex.labels], [ex.tokens[c] for c in ex.classes],
                        params.fasttext, seed, params.max_chars, params.tune, ex.ids)
        clf.labels = ex.classes
        return clf

    @classmethod
    def load(cls, directory: Path, info: dict[str, Any]) -> FastTextClassifier:
        labels = list(info["labels"])
        clf = cls(load_fasttext(directory / "model.bin"), list(info.get("label_tokens", labels)), info)
        clf.labels = labels
        return clf

    @classmethod
    def train(cls, texts: list[str], labels: list[str], classes: list[str], p: FastTextParams,
              seed: int, max_chars: int, tune: TuneParams | None = None,
              tune_ids: list[str] | None = None) -> FastTextClassifier:
        """Train on ``texts``; with ``tune`` (mode grid/autotune) choose the settings first on a
        validation part (``unit_hash(seed, "tune/" + id) < tune.validation``) of these examples."""
        tmp = tempfile.mkdtemp(prefix="cptkit-ft-")
        path = os.path.join(tmp, "train.txt")
        lines = [f"__label__{lab} {fasttext_line(t, max_chars)}\n" for t, lab in zip(texts, labels, strict=True)]
        job: dict[str, Any] = {"seed": seed, "params": asdict(p)}
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(lines)
            if tune is not None and tune.mode != "off":
                if tune.mode not in TUNE_MODES:
                    raise CptkitError(f"train.tune.mode={tune.mode!r}: choose one of {', '.join(TUNE_MODES)}")
                ids = tune_ids or [str(i) for i in range(len(texts))]
                order = sorted(range(len(ids)), key=lambda i: unit_hash(seed, "tune-sample/" + ids[i]))
                keep = order[:tune.max_examples] if tune.max_examples else order
                valid = [i for i in keep if unit_hash(seed, "tune/" + ids[i]) < tune.validation]
                fit = sorted(set(keep) - set(valid))
                if valid and fit and len({labels[i] for i in fit}) >= 2:
                    job["tune_train"], job["tune_valid"] = path + ".fit", path + ".valid"
                    for name, idx in ((job["tune_train"], fit), (job["tune_valid"], sorted(valid))):
                        with open(name, "w", encoding="utf-8") as f:
                            f.writelines(lines[i] for i in idx)
                    if tune.mode == "grid":
                        job["grid"] = tune_grid(tune)
                    else:
                        job["autotune_seconds"] = tune.autotune_seconds
            bin_path, record = _train_fasttext_isolated(path, job)
            model = load_fasttext(bin_path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        info: dict[str, Any] = {"backend": "fasttext", "tokenizer": TOKENIZER, "max_chars": max_chars,
                                "fasttext": record["chosen"]}
        if job.get("grid") or job.get("autotune_seconds"):
            info["tuning"] = {"mode": tune.mode, "validation_examples": len(valid), "fit_examples": len(fit),  # type: ignore[union-attr]
                              "trials": record["trials"]}
        return cls(model, classes, info)

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), len(self.labels)), dtype=np.float64)
        if not texts:
            return out
        lines = [self._line(t, self.max_chars) for t in texts]
        all_labels, all_probs = self.model.predict(lines, k=-1)
        for i, (labs, probs) in enumerate(zip(all_labels, all_probs, strict=True)):
            for lab, pr in zip(labs, probs, strict=True):
                j = self._col.get(lab)
                if j is not None:
                    out[i, j] = pr
        if self.raw:  # fastText's own probabilities, as every other user of the file sees them
            return out
        # fastText adds 1e-5 to every probability: renormalise so rows sum to 1 exactly
        out = np.clip(out, 0.0, None)
        sums = out.sum(axis=1, keepdims=True)
        return np.divide(out, sums, out=np.full_like(out, 1.0 / len(self.labels)), where=sums > 0)

    def save(self, directory: Path) -> None:
        self.model.save_model(str(directory / "model.bin"))


def load_fasttext_file(path: Path) -> FastTextClassifier:
    """A bare fastText supervised model file (``.bin`` or ``.ftz``, trained outside cptkit): its
    classes are its ``__label__`` labels in the file's order; each document goes to fastText as
    :func:`raw_line` (no cptkit tokenization) and the scores are fastText's own probabilities (not
    renormalised), so a threshold chosen on them elsewhere (datatrove's ``FastTextClassifierFilter``
    reads the same numbers) keeps the same documents."""
    model = load_fasttext(path)
    labels = [lab.removeprefix("__label__") for lab in model.get_labels()]
    return FastTextClassifier(model, labels, {"backend": "fasttext", "tokenizer": "raw", "labels": labels,
                                              "file": str(path)})


