"""Held-out clean/corrupted sentence pairs from real domain text, for :mod:`cptkit.eval.margin`.

Two commands, used by ``make reproduce-corruption-v2`` (mk/reproduce_v2_b0.mk):

``cptkit pairs split --in DIR --out DIR --seed S --heldout-docs N --train-chars C``
    The domain documents (``--lang`` records with a ``--require`` field: the CPT mix's domain), in the
    order of a hash of ``(seed, id)``: the first ``N`` are held out (``heldout.jsonl``), the next ones up
    to ``C`` characters are the training text (``train.jsonl``); no document is in both. A document
    longer than ``--max-doc-chars`` keeps its beginning (cut at whitespace). ``_split.json`` (written
    last) lists the ids and counts.

``cptkit pairs make --clean heldout.jsonl --corrupted DIR --out pairs.jsonl --n 200 --seed S``
    ``DIR`` is ``cptkit corrupt``'s output for the held-out documents: the same ids, each with the edits
    it made (``corruption.edits``: type, replacement, spans in the original text). Each document's
    replacements are recovered from its edits and checked to rebuild the corrupted text exactly (a
    document that does not is skipped and counted). Every sentence holding at least one edit gives a pair
    ``{id, doc, clean, corrupted, types}`` (the sentence as written and with its edits; whitespace runs
    made single spaces in both); sentences of fewer than ``--min-words`` words or with fewer than 3
    alphabetic words (code, tables) are left out. ``--n`` pairs are drawn with the seed; fewer is an
    error, not a smaller sample.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.shards import atomic_write_bytes, atomic_write_json, read_records, resolve_inputs
from cptkit.synthetic.corruption import match_case, pluralize
from cptkit.text.hashing import seeded_hash

PARAGRAPH = re.compile(r"\n[ \t]*\n")
SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s)")
WORD = re.compile(r"[A-Za-z]{2,}")


def read_all(specs: Sequence[str]) -> list[dict[str, Any]]:
    return [r for inp in resolve_inputs(list(specs)) for r in read_records(inp)]


def jsonl_bytes(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


# --- split -----------------------------------------------------------------------------------------
def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters cut after the last whitespace (hard cut without one)."""
    if limit <= 0 or len(text) <= limit:
        return text
    space = max(text.rfind(" ", 0, limit), text.rfind("\n", 0, limit))
    return text[:space if space > limit // 2 else limit]


def split_domain(records: Sequence[dict[str, Any]], seed: int, heldout_docs: int, train_chars: int,
                 lang: str = "en", require: str = "topic", max_doc_chars: int = 8000
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(held-out, training)`` documents: the domain's records (``lang``, ``''``: any; with a field
    ``require``, ``''``: any) by ``seeded_hash(seed, id)``; the first ``heldout_docs`` held out, the next
    ones until ``train_chars`` characters for training (``0``: all the others)."""
    domain = [r for r in records if (not lang or r.get("lang") == lang) and (not require or r.get(require) is not None)]
    ids = [str(r["id"]) for r in domain]
    if len(set(ids)) != len(ids):
        raise CptkitError("split: a document id occurs twice in the domain")
    order = sorted(domain, key=lambda r: (seeded_hash(seed, str(r["id"])), str(r["id"])))
    if len(order) <= heldout_docs:
        raise CptkitError(f"split: {len(order)} domain documents ({lang}, with {require!r}): none left to train "
                          f"on after {heldout_docs} held out")
    held = [{**r, "text": cut(r["text"], max_doc_chars)} for r in order[:heldout_docs]]
    train, chars = [], 0
    for r in order[heldout_docs:]:
        if 0 < train_chars <= chars:
            break
        train.append({**r, "text": cut(r["text"], max_doc_chars)})
        chars += len(train[-1]["text"])
    if chars < train_chars:
        raise CptkitError(f"split: the domain holds {chars} characters after the held-out documents, "
                          f"fewer than --train-chars {train_chars}")
    return held, train


# --- pairs -----------------------------------------------------------------------------------------
def sentence_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each sentence: paragraphs cut at sentence ends (., !, ? before whitespace);
    surrounding whitespace excluded."""
    spans: list[tuple[int, int]] = []

    def add(a: int, b: int) -> None:
        piece = text[a:b]
        lead = len(piece) - len(piece.lstrip())
        a, b = a + lead, a + len(piece.rstrip())
        if b > a:
            spans.append((a, b))

    start = 0
    bounds = [(m.start(), m.end()) for m in PARAGRAPH.finditer(text)] + [(len(text), len(text))]
    for para_end, next_start in bounds:
        a = start
        for m in SENTENCE_END.finditer(text, start, para_end):
            add(a, m.end())
            a = m.end()
        add(a, para_end)
        start = next_start
    return spans


def replacements(original: str, corrupted: str, edits: Sequence[dict[str, Any]]) -> list[tuple[int, int, str]] | None:
    """The ``(start, end, new text)`` of every edited span of ``original``, recovered from the edits
    (a noun's replacement may be inflected and is case-matched, as :mod:`cptkit.synthetic.corruption`
    writes it) so that applying them gives ``corrupted`` exactly; None when they do not."""
    spans = sorted((s, e, ed) for ed in edits for s, e in ed["spans"])
    out: list[tuple[int, int, str]] = []
    p = q = 0  # positions in corrupted and original
    for i, (s, e, ed) in enumerate(spans):
        if s < q or corrupted[p:p + s - q] != original[q:s]:
            return None
        p += s - q
        old = original[s:e]
        if ed["type"] == "number":
            options = [ed["to"]]
        elif ed["type"] == "noun":
            options = [match_case(pluralize(ed["to"]), old), match_case(ed["to"], old)]
        else:
            options = [match_case(ed["to"], old)]
        after = original[e:spans[i + 1][0] if i + 1 < len(spans) else len(original)]
        new = next((o for o in options if corrupted.startswith(o + after, p)), None)
        if new is None:
            return None
        out.append((s, e, new))
        p, q = p + len(new), e
    return out if corrupted[p:] == original[q:] else None


def apply(text: str, offset: int, repl: Sequence[tuple[int, int, str]]) -> str:
    """``text`` (which starts at ``offset`` of its document) with the replacements inside it."""
    pieces, pos = [], 0
    for s, e, new in repl:
        pieces += [text[pos:s - offset], new]
        pos = e - offset
    return "".join(pieces + [text[pos:]])


def doc_pairs(doc_id: str, original: str, repl: Sequence[tuple[int, int, str]], types: dict[tuple[int, int], str],
              min_words: int = 5, max_chars: int = 400) -> list[dict[str, Any]]:
    """The pairs of one document: each sentence that holds an edit, as written and edited."""
    out = []
    for k, (a, b) in enumerate(sentence_spans(original)):
        inside = [(s, e, n) for s, e, n in repl if a <= s and e <= b]
        if not inside:
            continue
        clean, bad = " ".join(original[a:b].split()), " ".join(apply(original[a:b], a, inside).split())
        if clean == bad or len(clean) > max_chars or len(clean.split()) < min_words or len(WORD.findall(clean)) < 3:
            continue
        out.append({"id": f"{doc_id}#{k}", "doc": doc_id, "clean": clean, "corrupted": bad,
                    "types": sorted({types[(s, e)] for s, e, _ in inside})})
    return out


def make_pairs(clean_docs: Sequence[dict[str, Any]], corrupted_docs: Sequence[dict[str, Any]], n: int, seed: int,
               min_words: int = 5, field: str = "text") -> tuple[list[dict[str, Any]], Counter]:
    """``n`` pairs drawn with ``seed`` from every held-out document's edited sentences, and counts."""
    by_id = {str(r["id"]): r for r in corrupted_docs}
    stats: Counter = Counter()
    candidates: list[dict[str, Any]] = []
    for doc in sorted(clean_docs, key=lambda r: str(r["id"])):
        rid = str(doc["id"])
        stats["documents"] += 1
        bad = by_id.get(rid)
        if bad is None:
            raise CptkitError(f"document {rid!r} is missing from the corrupted documents")
        edits = [e for e in (bad.get("corruption") or {}).get("edits", []) if e.get("field", field) == field]
        repl = replacements(doc[field], bad[field], edits)
        if repl is None:
            stats["documents whose edits do not rebuild the corrupted text (skipped)"] += 1
            continue
        types = {(s, e): ed["type"] for ed in edits for s, e in ed["spans"]}
        found = doc_pairs(rid, doc[field], repl, types, min_words)
        stats["documents with a pair"] += bool(found)
        candidates += found
    stats["candidate pairs"] = len(candidates)
    if len(candidates) < n:
        raise CptkitError(f"{len(candidates)} sentence pairs from {stats['documents']} held-out documents, fewer "
                          f"than the {n} asked: hold out more documents or corrupt at a higher ratio")
    rng = random.Random(seeded_hash(seed, "pairs"))
    drawn = sorted(rng.sample(range(len(candidates)), n))
    pairs = [candidates[i] for i in drawn]
    for p in pairs:
        for t in p["types"]:
            stats[f"pairs with a {t} edit"] += 1
    return pairs, stats


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit pairs", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="held-out and training documents of the domain, disjoint, by the seed")
    s.add_argument("--in", dest="inputs", action="append", required=True, help="domain records (files, folders)")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--seed", type=int, required=True)
    s.add_argument("--heldout-docs", type=int, default=64)
    s.add_argument("--train-chars", type=int, required=True,
                   help="characters of training text (about 4 per token; 0: every document not held out)")
    s.add_argument("--max-doc-chars", type=int, default=8000)
    s.add_argument("--lang", default="en", help="the domain's language ('': any)")
    s.add_argument("--require", default="topic", help="a field every domain record has ('': none)")
    m = sub.add_parser("make", help="sentence pairs from held-out documents and their corrupted copies")
    m.add_argument("--clean", required=True, help="the held-out documents (split's heldout.jsonl)")
    m.add_argument("--corrupted", required=True, help="cptkit corrupt's output for them")
    m.add_argument("--out", type=Path, required=True, help="the pairs (JSONL)")
    m.add_argument("--n", type=int, default=200)
    m.add_argument("--seed", type=int, required=True)
    m.add_argument("--min-words", type=int, default=5)
    a = p.parse_args(argv)
    if a.cmd == "split":
        held, train = split_domain(read_all(a.inputs), a.seed, a.heldout_docs, a.train_chars, a.lang, a.require,
                                   a.max_doc_chars)
        a.out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(a.out / "heldout.jsonl", jsonl_bytes(held))
        atomic_write_bytes(a.out / "train.jsonl", jsonl_bytes(train))
        atomic_write_json(a.out / "_split.json", {
            "seed": a.seed, "heldout": [r["id"] for r in held], "train": [r["id"] for r in train],
            "train_chars": sum(len(r["text"]) for r in train)})
        print(f"{a.out}: {len(held)} held-out and {len(train)} training documents", file=sys.stderr)
    else:
        if a.n < 1:
            raise CptkitError("--n must be >= 1")
        pairs, stats = make_pairs(read_all([a.clean]), read_all([a.corrupted]), a.n, a.seed, a.min_words)
        atomic_write_bytes(a.out, jsonl_bytes(pairs))
        print(f"{a.out}: " + ", ".join(f"{k} {v}" for k, v in stats.items()), file=sys.stderr)
    return 0
