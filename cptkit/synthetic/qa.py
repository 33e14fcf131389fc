"""Pure functions for LLM-written data: parsing, cleaning, snippets, discipline matching.

Used by ``expand-queries`` (Retrieve-from-CC §3.2, App. E) and ``synthesize-qa``
(Llama-3-SynE §4.2, App. A). Nothing here calls a model, so every rule is unit-testable.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from cptkit.text.tokenize import word_tokenizer

# -- words and sentences -------------------------------------------------------------------
_WORD = word_tokenizer("synthesis").regex  # the synthesis preset: apostrophes join words
_SENT_END = re.compile(r"[.!?。！？…](?:[\"'”’)\]]*)(?=\s|$)|[。！？]")
_MARKER = re.compile(r"#{2,}\s*[^#\n]{0,40}?\s*#{2,}")
_WS = re.compile(r"[ \t\r\f\v]+")


def words(text: str) -> list[str]:
    """Word tokens: runs of word characters (joined by apostrophes), and each CJK character on its own."""
    return _WORD.findall(text)


def count_words(text: str) -> int:
    return len(words(text))


def normalize_space(text: str) -> str:
    """Collapse runs of spaces, keep paragraph breaks (at most one blank line)."""
    lines = [_WS.sub(" ", ln).strip() for ln in text.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def trim_to_sentence(text: str) -> str:
    """Cut ``text`` after its last complete sentence ("" when it has none)."""
    ends = [m.end() for m in _SENT_END.finditer(text)]
    return text[:ends[-1]].strip() if ends else ""


def clean_text(text: str, finish_reason: str = "stop", *, min_words: int = 3, max_words: int = 0,
               min_alpha_ratio: float = 0.6, min_unique_ratio: float = 0.3,
               trim_truncated: bool = True) -> tuple[str, str | None]:
    """Clean one generated text; returns ``(text, None)`` or ``("", reason)``.

    Reasons: ``empty``; ``incomplete`` (cut by the token limit with no complete sentence, or
    with ``trim_truncated`` off); ``too_short`` / ``too_long`` (word counts); ``non_language``
    (letters are less than ``min_alpha_ratio`` of the non-space characters: code, tables, symbol
    soup); ``repetitive`` (distinct words below ``min_unique_ratio`` of ≥ 8 words).
    """
    text = normalize_space(_MARKER.sub(" ", text or ""))
    if not text:
        return "", "empty"
    if finish_reason == "length":
        text = trim_to_sentence(text) if trim_truncated else ""
        if not text:
            return "", "incomplete"
    ws = words(text)
    if len(ws) < min_words:
        return "", "too_short"
    if max_words and len(ws) > max_words:
        return "", "too_long"
    chars = [c for c in text if not c.isspace()]
    if sum(c.isalpha() for c in chars) < min_alpha_ratio * len(chars):
        return "", "non_language"
    if len(ws) >= 8 and len({w.lower() for w in ws}) < min_unique_ratio * len(ws):
        return "", "repetitive"
    return text, None


# -- Retrieve-from-CC App. E outputs ----------------------------------------------------------
_CREATED = re.compile(r"#{2,}\s*created\s+question\s*#{2,}", re.I)
_ANSWER = re.compile(r"#{2,}\s*answer\s*#{2,}", re.I)
_COT = re.compile(r"#{2,}\s*(?:cot|chain[ -]of[ -]thoughts?)\s*#{2,}", re.I)
_ANY_MARK = re.compile(r"#{2,}\s*[A-Za-z][A-Za-z ]{0,30}#{2,}")
_LEAD = re.compile(r"^\s*(?:\*\*)?(?:new |created )?(?:question|answer|q|a)\s*\d*\s*[:：.)-]\s*(?:\*\*)?\s*", re.I)


def _after(text: str, pattern: re.Pattern) -> str | None:
    ms = list(pattern.finditer(text))
    return text[ms[-1].end():] if ms else None


def _until_marker(text: str) -> str:
    m = _ANY_MARK.search(text)
    return text[:m.start()] if m else text


def parse_question(text: str) -> str:
    """The created question of a Question Extension output (App. E, ``###Created Question###``).

    Takes the text after the last marker (or all of it), up to the next ``###...###`` marker,
    drops a leading "Question:" label, and keeps the first paragraph.
    """
    body = _after(text, _CREATED)
    body = _until_marker(body if body is not None else text).strip()
    body = _LEAD.sub("", body, count=1).strip().split("\n\n")[0].strip()
    return body.strip('"“”').strip()


def parse_thought(text: str) -> tuple[str, str]:
    """``(answer, chain_of_thought)`` of a Thought Generation output (``###Answer###`` then ``###COT###``).

    Missing markers: without ``###COT###`` the chain of thought is ""; without ``###Answer###``
    the answer is the text before ``###COT###`` (or the whole output).
    """
    a, c = _ANSWER.search(text), _COT.search(text)
    if c is not None:
        cot = _until_marker(text[c.end():])
        answer = text[a.end():c.start()] if a is not None and a.end() <= c.start() else (
            _until_marker(text[a.end():]) if a is not None else text[:c.start()])
    else:
        cot = ""
        answer = _until_marker(text[a.end():]) if a is not None else text
    return _LEAD.sub("", answer.strip(), count=1).strip(), cot.strip()


# -- Llama-3-SynE App. A outputs ----------------------------------------------------------------
_PROBLEM = re.compile(r"(?:\*\*|#+\s*)?\[\s*problem\s*\](?:\*\*)?\s*:?(?:\*\*)?", re.I)
_SOLUTION = re.compile(r"(?:\*\*|#+\s*)?\[\s*solution\s*\](?:\*\*)?\s*:?(?:\*\*)?", re.I)


def parse_problem_solution(text: str) -> tuple[str, str] | None:
    """``(problem, solution)`` from ``[Problem] ... [Solution] ...``; None when malformed.

    The first ``[Solution]`` marker splits the text; the problem is what follows the last
    ``[Problem]`` marker before it (or all text before it). Both parts must be non-empty.
    """
    s = _SOLUTION.search(text)
    if s is None:
        return None
    head, solution = text[:s.start()], text[s.end():]
    p = list(_PROBLEM.finditer(head))
    problem = head[p[-1].end():] if p else head
    problem, solution = normalize_space(problem), normalize_space(_PROBLEM.split(solution)[0])
    if not problem or not solution:
        return None
    return problem, solution


def parse_problem(text: str) -> str:
    """A new problem written after ``[Problem]`` (code mode step 1), up to any ``[Solution]``."""
    s = _SOLUTION.search(text)
    head = text[:s.start()] if s else text
    p = list(_PROBLEM.finditer(head))
    return normalize_space(head[p[-1].end():] if p else head)


def parse_solution(text: str) -> str:
    """The solution after ``[Solution]`` (or the whole text when the marker is missing)."""
    ms = list(_SOLUTION.finditer(text))
    return normalize_space(text[ms[0].end():] if ms else text)


# -- seed documents --------------------------------------------------------------------------
def url_host(url: str | None) -> str:
    """Lower-case host name of ``url`` without a leading ``www.`` ("" when there is none)."""
    if not url:
        return ""
    try:
        host = urlsplit(url if "//" in url else "//" + url).hostname or ""
    except ValueError:
        return ""
    return host.lower().removeprefix("www.")


def discipline_of(url: str | None, domains: Mapping[str, Sequence[str]]) -> str | None:
    """The discipline whose domain list matches ``url``'s host (longest matching domain wins).

    A listed domain matches itself and its subdomains: ``stackexchange.com`` matches
    ``math.stackexchange.com``; ``math.stackexchange.com`` is more specific and wins over it.
    """
    host = url_host(url)
    if not host:
        return None
    best, best_len = None, -1
    for disc, doms in domains.items():
        for d in doms:
            d = str(d).lower().removeprefix("www.")
            if (host == d or host.endswith("." + d)) and len(d) > best_len:
                best, best_len = disc, len(d)
    return best


def snippet(text: str, max_words: int, rng: random.Random | None = None) -> str:
    """A snippet of at most ``max_words`` words made of whole paragraphs where possible.

    Starts at the first paragraph, or at a random one when ``rng`` is given; a paragraph longer
    than the budget is cut after its last complete sentence within it (or hard at the budget).
    """
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    if not paras:
        return ""
    start = rng.randrange(len(paras)) if rng is not None else 0
    out: list[str] = []
    used = 0
    for p in paras[start:]:
        n = count_words(p)
        if used + n <= max_words:
            out.append(p)
            used += n
            continue
        if not out:  # the first paragraph alone is too long: cut it
            out.append(cut_words(p, max_words))
        break
    return "\n\n".join(out)


def cut_words(text: str, max_words: int) -> str:
    """The longest prefix of ``text`` with ≤ ``max_words`` words, ending a sentence when one does."""
    ms = list(_WORD.finditer(text))
    if len(ms) <= max_words:
        return text
    prefix = text[:ms[max_words - 1].end()] if max_words > 0 else ""
    return trim_to_sentence(prefix) or prefix


def sample_demos(pool_size: int, k: int, rng: random.Random) -> list[int]:
    """``k`` distinct demonstration indices (all when the pool is smaller), in drawn order."""
    return rng.sample(range(pool_size), min(k, pool_size))
