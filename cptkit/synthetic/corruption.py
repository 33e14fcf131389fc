"""Controlled corruption of synthetic text (Llama-3-SynE §5.2, App. H): pure functions.

Three transformations, applied to *units* of a text:

* ``number``: EACH OCCURRENCE of a number (``\\d+([.,]\\d+)*``, also inside tokens such as
  ``H2O``) is a unit of its own and gets its own random number of the same form (same digits
  count per run, same separators, no new leading zero), always different from the original.
  This is App. H's example: of the four 2s in "chlorine (Cl2) ... 2Na + Cl2 ==2NaCl" the last
  three become 6, 3 and 8 and the first stays — neither "one replacement for every 2" nor
  "every occurrence of a drawn number" can produce that.
* ``noun``: a distinct common-noun lemma (POS ``NN``/``NNS``, alphabetic) occurring at least
  ``noun_min_count`` times in the text, that WordNet knows → a random co-hyponym: a hyponym
  of one of the hypernyms of its first sense (chlorine → chemical element → neon).
* ``adj``: a distinct adjective lemma (POS ``JJ``, alphabetic) occurring at least
  ``adj_min_count`` times with a WordNet antonym → a random antonym (equal → unequal).

"Frequent" (App. H: "frequently occurring nouns/adjectives") is a minimum count inside the
text, ``noun_min_count`` and ``adj_min_count`` (default 2 each).

The *candidates* of a text are all such units. With ratio ``r`` and ``n`` candidates, ``k =
floor(r·n + u)`` units (``u`` uniform in [0, 1) from the record's generator, so E[k] = r·n exactly)
are drawn uniformly without replacement. Every occurrence of a drawn noun or adjective gets the
same replacement (one lemma, inflection and case kept: chlorine → oxygen everywhere in App. H);
a number unit is one occurrence. The realised ratio is changed units / candidate units. ``r = 0``
never changes anything. Randomness comes only from the ``random.Random`` passed in (the
step seeds it from ``(seed, record id)``), and every candidate list is sorted, so output does
not depend on process, hash seed or batch.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cptkit.text.wordnet import antonyms, cohyponyms

NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
KINDS = ("number", "noun", "adj")
TAGS = frozenset({"NN", "NNS", "JJ"})  # the Penn tags candidate_units takes nouns and adjectives from


@dataclass(frozen=True, slots=True)
class Token:
    """A POS-tagged word of the text (from spaCy): character offsets, tag, lemma."""

    start: int
    end: int
    tag: str  # Penn tag: NN, NNS, JJ, ...
    lemma: str


def text_chunks(text: str, size: int) -> list[tuple[int, str]]:
    """``text`` as consecutive ``(offset, piece)`` of at most ``size`` characters, each cut after
    the last whitespace of its second half (a hard cut when there is none), so a tagger sees
    bounded documents and words stay whole. A text of at most ``size`` characters is one piece."""
    out: list[tuple[int, str]] = []
    start = 0
    while len(text) - start > size:
        end = start + size
        cut = max(text.rfind(" ", start + size // 2, end), text.rfind("\n", start + size // 2, end))
        end = cut + 1 if cut >= 0 else end
        out.append((start, text[start:end]))
        start = end
    out.append((start, text[start:]))
    return out


@dataclass
class Unit:
    kind: str
    key: str  # the number string (one occurrence), or the lowercased lemma (all its occurrences)
    spans: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, tag)


@dataclass
class Lexicon:
    """Where replacements come from: ``nouns(lemma)`` co-hyponyms, ``antonyms(lemma)``; sorted lists."""

    nouns: Callable[[str], list[str]]
    antonyms: Callable[[str], list[str]]


def random_number_like(s: str, rng: random.Random) -> str:
    """A random number with the form of ``s``: digit runs keep their length, separators stay.

    A run's first digit is drawn from 1–9 when the original was non-zero and the run has
    more than one digit (no new leading zeros). The result differs from ``s``.
    """

    def draw() -> str:
        out = []
        for run in re.split(r"(\D+)", s):
            if not run or not run[0].isdigit():
                out.append(run)
                continue
            digits = [str(rng.randrange(10)) for _ in run]
            if len(run) > 1 and run[0] != "0":
                digits[0] = str(rng.randrange(1, 10))
            out.append("".join(digits))
        return "".join(out)

    for _ in range(8):
        new = draw()
        if new != s:
            return new
    # still equal (e.g. a single digit drawn twice): bump the last digit by 1..9
    i = max(j for j, ch in enumerate(s) if ch.isdigit())
    bump = (int(s[i]) + rng.randrange(1, 10)) % 10
    return s[:i] + str(bump) + s[i + 1:]


def match_case(new: str, old: str) -> str:
    if len(old) > 1 and old.isupper():
        return new.upper()
    if old[:1].isupper():
        return new[:1].upper() + new[1:]
    return new


def pluralize(noun: str) -> str:
    """English plural of the last word of ``noun`` (regular rules; good enough for a corruption)."""
    head, _, last = noun.rpartition(" ")
    if re.search(r"(s|x|z|ch|sh)$", last):
        last += "es"
    elif re.search(r"[^aeiou]y$", last):
        last = last[:-1] + "ies"
    else:
        last += "s"
    return f"{head} {last}" if head else last


def candidate_units(text: str, tokens: list[Token] | None, lexicon: Lexicon | None,
                    noun_min_count: int = 2, adj_min_count: int = 2) -> list[Unit]:
    """The candidate units of ``text``: numbers (one unit per occurrence, in text order), then
    nouns and adjectives (one unit per lemma, sorted by lemma). ``tokens=None``: numbers only."""
    numbers = [Unit("number", m.group(), [(m.start(), m.end(), "CD")]) for m in NUMBER.finditer(text)]
    units: dict[tuple[str, str], Unit] = {}
    if tokens and lexicon is not None:
        words: dict[tuple[str, str], Unit] = {}
        for t in tokens:
            word = text[t.start:t.end]
            if not word.isalpha() or not t.lemma.isalpha():
                continue
            if t.tag in ("NN", "NNS"):
                kind = "noun"
            elif t.tag == "JJ":
                kind = "adj"
            else:
                continue
            key = t.lemma.lower()
            words.setdefault((kind, key), Unit(kind, key)).spans.append((t.start, t.end, t.tag))
        for (kind, key), u in words.items():
            need = noun_min_count if kind == "noun" else adj_min_count
            if len(u.spans) < need:
                continue
            options = lexicon.nouns(key) if kind == "noun" else lexicon.antonyms(key)
            if options:
                units[(kind, key)] = u
    return numbers + [units[k] for k in sorted(units, key=lambda k: (KINDS.index(k[0]), k[1]))]


def choose_count(n: int, ratio: float, rng: random.Random) -> int:
    """k = floor(ratio·n + u), u ~ U[0, 1): unbiased rounding (E[k] = ratio·n), 0 when ratio is 0."""
    if ratio <= 0 or n == 0:
        return 0
    return min(n, math.floor(ratio * n + rng.random()))


def corrupt_text(text: str, ratio: float, rng: random.Random, tokens: list[Token] | None = None,
                 lexicon: Lexicon | None = None, noun_min_count: int = 2,
                 adj_min_count: int = 2) -> tuple[str, dict[str, Any]]:
    """Corrupt ``text``; return the new text and a report ``{candidates, changed, edits, ...}``.

    Each edit: ``{"type", "from", "to", "count", "spans": [[start, end], ...]}`` with offsets in
    the original text; ``to`` is the replacement (the lemma for nouns, before inflection). The
    report also counts occurrences (``candidate_occurrences``, ``changed_occurrences``).
    """
    units = candidate_units(text, tokens, lexicon, noun_min_count, adj_min_count)
    k = choose_count(len(units), ratio, rng)
    chosen = sorted(rng.sample(range(len(units)), k)) if k else []
    edits, repl = [], []
    for i in chosen:
        u = units[i]
        if u.kind == "number":  # one occurrence, its own draw (App. H: 2 -> 6, 3, 8)
            new = random_number_like(u.key, rng)
            repl.append((u.spans[0][0], u.spans[0][1], new))
        else:
            assert lexicon is not None
            new = rng.choice(lexicon.nouns(u.key) if u.kind == "noun" else lexicon.antonyms(u.key))
            for start, end, tag in u.spans:
                out = pluralize(new) if u.kind == "noun" and tag == "NNS" else new
                repl.append((start, end, match_case(out, text[start:end])))
        edits.append({"type": u.kind, "from": u.key, "to": new, "count": len(u.spans),
                      "spans": [[s, e] for s, e, _ in u.spans]})
    pieces, pos = [], 0
    for start, end, new in sorted(repl):
        pieces += [text[pos:start], new]
        pos = end
    pieces.append(text[pos:])
    by_type = {kind: sum(1 for u in units if u.kind == kind) for kind in KINDS}
    report = {"candidates": len(units), "changed": len(chosen), "candidates_by_type": by_type,
              "candidate_occurrences": sum(len(u.spans) for u in units),
              "changed_occurrences": sum(e["count"] for e in edits), "edits": edits}
    return "".join(pieces), report


def wordnet_lexicon(wn: Any, cache_size: int = 100_000) -> Lexicon:
    """A :class:`Lexicon` over an nltk WordNet reader (memoised; lists sorted)."""
    import functools

    @functools.lru_cache(maxsize=cache_size)
    def nouns(lemma: str) -> list[str]:
        return sorted({name for _, name in cohyponyms(wn, lemma)})

    @functools.lru_cache(maxsize=cache_size)
    def ants(lemma: str) -> list[str]:
        return antonyms(wn, lemma)

    return Lexicon(nouns, ants)
