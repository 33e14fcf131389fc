"""Answers, pure functions: the multiple-choice predictions (acc, acc_norm), extraction of a
generated answer (last number, boxed, Minerva, SQuAD, regex) and comparison with the reference."""

from __future__ import annotations

import re
import string
from fractions import Fraction

from cptkit.core.errors import CptkitError


def mc_predictions(lls: list[float], choices: list[str]) -> tuple[int, int]:
    """``(argmax LL, argmax LL / len(choice))``: lm-eval's ``acc`` and ``acc_norm`` predictions.

    Ties go to the first choice (``numpy.argmax``); the length is in characters of the choice
    without the target delimiter.
    """
    def argmax(xs: list[float]) -> int:
        best = 0
        for i, x in enumerate(xs):
            if x > xs[best]:
                best = i
        return best

    return argmax(lls), argmax([ll / float(len(c)) for ll, c in zip(lls, choices, strict=True)])


_NUM = re.compile(r"-?[$]?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def last_number(text: str) -> str | None:
    """The last number in ``text`` (GSM8K's flexible extraction): commas, ``$`` and a trailing dot dropped."""
    found = _NUM.findall(text)
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "").rstrip(".")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``), braces balanced."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    i = text.find("{", idx)
    if i < 0:
        m = re.match(r"\\boxed ([^\s$]+)", text[idx:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def normalize_math(s: str) -> str:
    """Light MATH-style normalization: spaces, ``\\left``/``\\right``, ``dfrac``, ``$``, units of degrees."""
    s = s.strip().strip("$").rstrip(".")
    for a, b in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("dfrac", "frac"), ("tfrac", "frac"),
                 ("^\\circ", ""), ("^{\\circ}", ""), ("\\$", ""), ("\\%", ""), ("%", ""), (" ", "")):
        s = s.replace(a, b)
    m = re.fullmatch(r"\\frac\{?(-?\d+)\}?\{?(\d+)\}?", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    return s


def normalize_squad(s: str) -> str:
    """SQuAD's official answer normalisation (also TriviaQA's): lower case, no punctuation, no articles."""
    s = "".join(ch for ch in s.lower() if ch not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def extract(text: str, method: str | None) -> str | None:
    """Answer extraction: ``last_number`` | ``boxed`` | ``minerva`` | ``squad`` | ``regex:<pattern>`` (group 1) | ``none``.

    ``minerva``: the ``Final Answer: The final answer is X. I hope it is correct.`` line of the
    Minerva prompt (Lewkowycz et al. 2022), normalised like ``boxed``. ``squad``: the text
    normalised by :func:`normalize_squad`.
    """
    if not method or method == "none":
        return text.strip()
    if method == "squad":
        return normalize_squad(text)
    if method == "last_number":
        return last_number(text)
    if method == "boxed":
        b = last_boxed(text)
        return normalize_math(b) if b is not None else None
    if method == "minerva":
        m = re.findall(r"Final Answer: The final answer is(.*?)\. I hope it is correct\.", text)
        return normalize_math(m[-1]) if m else None
    if method.startswith("regex:"):
        m = re.findall(method[len("regex:"):], text)
        if not m:
            return None
        last = m[-1]
        return (last[0] if isinstance(last, tuple) else last).strip()
    raise CptkitError(f"answer extraction {method!r}: use last_number, boxed, minerva, squad, regex:<pattern> or none")


def answers_match(pred: str | None, gold: str | None) -> bool:
    """Exact match after extraction; numbers compare by value (``72.0 == 72``, ``1/2 == 0.5``)."""
    if pred is None or gold is None:
        return False
    if pred == gold:
        return True
    try:
        return Fraction(pred) == Fraction(gold)
    except (ValueError, ZeroDivisionError):
        return False
