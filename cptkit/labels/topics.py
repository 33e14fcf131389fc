"""Topic taxonomies (config, per language), the annotation prompt and answer mapping (pure).

A taxonomy is a YAML file (``conf/topics/<lang>.yaml``): ``topics`` (the labels), optional
``aliases`` (other answers → a label) and ``prompt`` (with ``{topics}`` and ``{page}``).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cptkit.core.errors import CptkitError
from cptkit.text.hashing import unit_hash

DEFAULT_PROMPT = (
    "I am categorizing a series of articles according to the following topics. Next, I will give you an "
    "article, please select only one topic that the article is the most related to:\n[Topics]:\n{topics}\n"
    "[Article]: {page}\nPlease only return the most related topic:\n"
)


@dataclass
class Taxonomy:
    language: str
    topics: list[str]
    aliases: dict[str, str] = field(default_factory=dict)
    prompt: str = DEFAULT_PROMPT
    descriptions: dict[str, str] = field(default_factory=dict)  # topic -> text the embedding annotator embeds

    def description(self, topic: str) -> str:
        """What the embedding annotator compares pages with: the topic's description, else its name."""
        return self.descriptions.get(topic) or topic


def taxonomy_path(lang: str, spec: str | None, conf_dir: Path) -> Path:
    return Path(spec) if spec else conf_dir / "topics" / f"{lang}.yaml"


def load_taxonomy(path: str | Path) -> Taxonomy:
    """Read and check a taxonomy file (unique topics, aliases pointing at topics)."""
    path = Path(path)
    if not path.exists():
        raise CptkitError(f"{path}: no such taxonomy file")
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise CptkitError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("topics"), list) or len(data["topics"]) < 2:
        raise CptkitError(f"{path}: needs a 'topics' list with at least 2 entries")
    topics = [str(t) for t in data["topics"]]
    if len(set(topics)) != len(topics):
        raise CptkitError(f"{path}: duplicate topics")
    aliases = {str(k).lower(): str(v) for k, v in (data.get("aliases") or {}).items()}
    bad = sorted(v for v in aliases.values() if v not in topics)
    if bad:
        raise CptkitError(f"{path}: alias target {bad[0]!r} is not a topic")
    prompt = str(data.get("prompt") or DEFAULT_PROMPT)
    if "{page}" not in prompt or "{topics}" not in prompt:
        raise CptkitError(f"{path}: the prompt needs {{topics}} and {{page}} placeholders")
    desc = {str(k): str(v) for k, v in (data.get("descriptions") or {}).items()}
    unknown = sorted(k for k in desc if k not in topics)
    if unknown:
        raise CptkitError(f"{path}: description for {unknown[0]!r}, which is not a topic")
    return Taxonomy(str(data.get("language", path.stem)), topics, aliases, prompt, desc)


def build_prompt(tax: Taxonomy, page: str, max_chars: int = 2000) -> str:
    """The zero-shot annotation prompt (Llama-3-SynE App. B): topic list + the page."""
    return tax.prompt.replace("{topics}", "\n".join(tax.topics)).replace("{page}", page[:max_chars].strip())


_STRIP = re.compile(r"^[\s\"'`*#>\-:.\d)(\[\]]+|[\s\"'`*.。!,，:;]+$")


def _norm(s: str) -> str:
    s = re.sub(r"^(topic|the most related topic|answer|主题|答案)\s*[:：]\s*", "", s.strip(), flags=re.I)
    return _STRIP.sub("", s).strip().lower()


def map_answer(answer: str, tax: Taxonomy, cutoff: float = 0.85) -> str | None:
    """Map an annotator's answer onto a topic, or None (rejected).

    Tried in order on the first non-empty line: exact topic (case-insensitive, stripped of
    quotes, numbering and punctuation), alias, exactly one topic named inside the answer,
    exactly one alias inside it, then a close spelling (difflib ratio ≥ ``cutoff``).
    """
    lines = [ln for ln in answer.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    a = _norm(lines[0])
    lower = {t.lower(): t for t in tax.topics}
    if a in lower:
        return lower[a]
    if a in tax.aliases:
        return tax.aliases[a]
    inside = sorted({t for lt, t in lower.items() if lt in a})
    if len(inside) == 1:
        return inside[0]
    if not inside:
        by_alias = sorted({t for al, t in tax.aliases.items() if re.search(rf"(?<!\w){re.escape(al)}(?!\w)", a)
                           or (not al.isascii() and al in a)})
        if len(by_alias) == 1:
            return by_alias[0]
    close = difflib.get_close_matches(a, list(lower), n=1, cutoff=cutoff)
    return lower[close[0]] if close else None


NORMS = ("chars", "tokens", "none")


def pick_topic(topics: list[str], lls: list[float], n_tokens: list[int], norm: str = "chars",
               baseline: list[float] | None = None) -> tuple[int, list[float]]:
    """Argmax topic and the softmax over the topics of their scores (loglikelihood annotation).

    ``lls`` are ``log p(topic | prompt)`` summed over the topic's tokens. With ``baseline``
    (``log p(topic | same prompt, content-free page)``) the score starts from ``lls - baseline``
    (contextual calibration, Zhao et al. 2021: removes the model's prior for a topic, e.g. for
    the first one listed). It is then divided by the topic's length in characters (``chars``:
    lm-eval's ``acc_norm``), in tokens (``tokens``), or not at all (``none``: lm-eval's ``acc``;
    uncalibrated, the softmax is the model's probability of each topic restricted to the
    taxonomy). Ties go to the first topic. Returns ``(index, probabilities)``.
    """
    if norm not in NORMS:
        raise CptkitError(f"topics.norm={norm}: expected one of {', '.join(NORMS)}")
    if not topics or len(topics) != len(lls) or len(lls) != len(n_tokens):
        raise CptkitError("pick_topic: topics, log-likelihoods and token counts differ in length")
    if baseline is not None:
        if len(baseline) != len(lls):
            raise CptkitError("pick_topic: the calibration baseline has a different number of topics")
        lls = [ll - b for ll, b in zip(lls, baseline, strict=True)]
    if norm == "chars":
        scores = [ll / max(len(t), 1) for t, ll in zip(topics, lls, strict=True)]
    elif norm == "tokens":
        scores = [ll / max(n, 1) for ll, n in zip(lls, n_tokens, strict=True)]
    else:
        scores = list(lls)
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    top = scores[best]
    exps = [math.exp(s - top) for s in scores]
    z = sum(exps)
    return best, [e / z for e in exps]


def truncate_tokens(tokenizer: Any, text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` that is at most ``max_tokens`` tokens (cut at a token boundary)."""
    if max_tokens <= 0:
        return text
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:  # slow (Python) tokenizers have no offsets: decode the kept ids
        ids = tokenizer.encode(text, add_special_tokens=False)
        return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])
    if len(enc["input_ids"]) <= max_tokens:
        return text
    return text[:enc["offset_mapping"][max_tokens - 1][1]]


def nearest_topics(pages: Any, topics: Any, temperature: float = 0.05) -> tuple[list[int], list[list[float]]]:
    """Zero-shot labels from unit vectors: each page's most similar topic (cosine; ties: the first)
    and ``softmax(cos / temperature)`` over the topics as its probabilities."""
    import numpy as np

    sims = np.asarray(pages, dtype=np.float64) @ np.asarray(topics, dtype=np.float64).T
    if temperature <= 0:
        raise CptkitError(f"topics.embed_temperature={temperature}: must be > 0")
    z = (sims - sims.max(axis=1, keepdims=True)) / temperature
    probs = np.exp(z)
    probs /= probs.sum(axis=1, keepdims=True)
    return [int(i) for i in sims.argmax(axis=1)], probs.tolist()


def fewshot_messages(tax: Taxonomy, demos: list[tuple[str, str]], page: str, max_chars: int = 2000,
                     demo_chars: int = 300) -> list[dict[str, str]]:
    """A few-shot chat: for each ``(text, topic)`` demonstration the App. B prompt as a user turn and
    the topic as the assistant's answer, then the prompt for ``page``."""
    msgs: list[dict[str, str]] = []
    for text, topic in demos:
        msgs += [{"role": "user", "content": build_prompt(tax, text, demo_chars)}, {"role": "assistant", "content": topic}]
    return msgs + [{"role": "user", "content": build_prompt(tax, page, max_chars)}]


def pick_demos(examples: list[tuple[str, str, str]], topics: list[str], k: int, seed: int) -> list[tuple[str, str]]:
    """``k`` demonstrations per topic from ``(id, text, topic)`` examples: the smallest hash of
    ``(seed, id)`` per topic, then interleaved round-robin in taxonomy order (no topic last in bulk)."""
    by: dict[str, list[tuple[float, str, str]]] = {t: [] for t in topics}
    for i, text, topic in examples:
        if topic in by:
            by[topic].append((unit_hash(seed, "demo/" + i), i, text))
    chosen = {t: [x[2] for x in sorted(v)[:k]] for t, v in by.items()}
    return [(chosen[t][r], t) for r in range(k) for t in topics if r < len(chosen[t])]
