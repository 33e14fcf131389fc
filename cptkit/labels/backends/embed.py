"""The embedding backend (``train.backend=embed``): frozen sentence embeddings ⊕ word n-gram TF-IDF
under a multinomial logistic regression, its regularisation chosen on a validation part."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.labels.backends.base import BACKENDS, TOKENIZER, ClassifierBackend, Examples
from cptkit.labels.config import EmbedParams, TrainParams
from cptkit.labels.encoder import SentenceEncoder
from cptkit.labels.metrics import evaluate
from cptkit.text.hashing import unit_hash
from cptkit.text.tokenize import word_tokenizer

_LINE_TOKENS = word_tokenizer("fasttext")  # fastText's document tokens (cptkit.text.tokenize preset)


def word_ngrams(text: str, max_chars: int = 4000) -> list[str]:
    """Word unigrams and bigrams of a document, on fastText's tokens (lowercased, punctuation split)."""
    toks = _LINE_TOKENS(text[:max_chars])
    return toks + [f"{a} {b}" for a, b in zip(toks, toks[1:], strict=False)]


def ngram_vocabulary(docs: list[list[str]], max_terms: int) -> tuple[list[str], np.ndarray]:
    """The ``max_terms`` n-grams in most documents (ties: alphabetical) and their smoothed IDF,
    ``ln((1 + n) / (1 + df)) + 1`` (scikit-learn's ``smooth_idf``)."""
    df = Counter(t for d in docs for t in set(d))
    terms = sorted(df, key=lambda t: (-df[t], t))[:max_terms] if max_terms else sorted(df)
    idf = np.log((1 + len(docs)) / (1 + np.array([df[t] for t in terms], dtype=np.float64))) + 1
    return terms, idf


def tfidf_matrix(docs: list[list[str]], index: dict[str, int], idf: np.ndarray) -> Any:
    """Rows of unit length: sublinear term frequency (1 + ln tf) × IDF over the vocabulary ``index``
    (a ``scipy.sparse.csr_matrix``; unknown n-grams are ignored, an empty row stays zero)."""
    import scipy.sparse as sp  # deferred: scipy loads in ~0.2 s

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
    import scipy.sparse as sp  # deferred: scipy loads in ~0.2 s

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
    from scipy.optimize import minimize  # deferred: scipy loads in ~0.2 s

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


@BACKENDS.register("embed")
class EmbedClassifier(ClassifierBackend):
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
    def fit(cls, ex: Examples, params: TrainParams, seed: int, progress: Any = None) -> EmbedClassifier:
        return cls.train(ex.texts, ex.labels, ex.classes, params.embed, seed, params.max_chars,
                         params.tune.validation, ex.ids, progress)

    @classmethod
    def load(cls, directory: Path, info: dict[str, Any]) -> EmbedClassifier:
        arrays = np.load(directory / "embed.npz")
        terms = json.loads((directory / "vocab.json").read_text())
        return cls(arrays["w"], arrays["b"], terms, arrays["idf"], list(info["labels"]), info)

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

