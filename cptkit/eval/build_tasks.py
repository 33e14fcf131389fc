"""Build the small real benchmark tasks shipped with cptkit from data written by others.

* ``gcide_defs`` (multiple choice): a word from the GNU Collaborative International Dictionary
  of English (Debian ``dict-gcide``, Webster 1913 + additions, GPL) and four definitions of
  words of the same part of speech; pick the word's own. 500 test items, 50 for few-shot.
* ``wordnet_defs`` (multiple choice): the same task from WordNet 3.0 (Debian ``wordnet-base``,
  WordNet licence, BSD-like): a word's first-sense gloss among the glosses of three other words
  of the same part of speech. 500 test items, 50 for few-shot.
* ``champ_math`` (generative): the CHAMP competition problems (PyPI ``champ-dataset``, MIT)
  whose final answer is a number, with their step-by-step solutions for few-shot examples.
* ``simple_arithmetic``: MosaicML's synthetic Gauntlet task (1000 expressions of up to 3
  operations on numbers of up to 3 digits, answered with the order of operations), generated
  from a seed; the tasks ``simple_arithmetic_{withspaces,nospaces}`` print the same problems.

All are deterministic (sorted candidates, a fixed seed). The data is not shipped in the
repository (licences); it is built into ``data_dir`` on first use or by::

    cptkit build-tasks [--data-dir DIR] [gcide_defs wordnet_defs champ_math simple_arithmetic]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from cptkit.core.errors import BadInput, CptkitError
from cptkit.core.progress import log
from cptkit.core.shards import atomic_write_bytes
from cptkit.demo.sources.base import deb_version, extract_deb, fetch_deb
from cptkit.eval.contamination import BenchmarkIndex, ngram_hashes

GCIDE_DEB = "dict-gcide"
GCIDE_FILES = ("usr/share/dictd/gcide.index", "usr/share/dictd/gcide.dict.dz")
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
POS = {"n.": "noun", "v. t.": "verb", "v. i.": "verb", "a.": "adjective", "adv.": "adverb"}


def _b64(s: str) -> int:
    v = 0
    for ch in s:
        v = v * 64 + _B64.index(ch)
    return v


def gcide_files(cache: Path) -> tuple[Path, Path]:
    """The dictd index and data of dict-gcide: installed, or fetched with ``apt-get download``."""
    installed = [Path("/") / f for f in GCIDE_FILES]
    if all(p.exists() for p in installed):
        return installed[0], installed[1]
    local = [cache / "dict-gcide" / f for f in GCIDE_FILES]
    if all(p.exists() for p in local):
        return local[0], local[1]
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise CptkitError("gcide_defs needs the Debian package dict-gcide (apt-get install dict-gcide)")
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(["apt-get", "download", GCIDE_DEB], cwd=tmp, capture_output=True, text=True)
        debs = list(Path(tmp).glob("dict-gcide_*.deb"))
        if r.returncode != 0 or not debs:
            raise CptkitError(f"apt-get download dict-gcide failed: {(r.stderr or r.stdout).strip()[-200:]}")
        r = subprocess.run(["dpkg", "-x", str(debs[0]), str(Path(tmp) / "x")], capture_output=True, text=True)
        if r.returncode != 0:
            raise CptkitError(f"dpkg -x {debs[0].name} failed: {r.stderr.strip()[-200:]}")
        cache.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(cache / "dict-gcide", ignore_errors=True)
        shutil.move(str(Path(tmp) / "x"), str(cache / "dict-gcide"))
    return local[0], local[1]


_HEAD = re.compile(r"^(?P<word>[A-Z][a-z]+) \\[^\\]+\\, (?P<pos>n\.|a\.|adv\.|v\. t\.|v\. i\.)\s*")


def _strip_brackets(s: str) -> str:
    """Drop a leading ``[...]`` etymology (nested brackets allowed)."""
    s = s.lstrip()
    if not s.startswith("["):
        return s
    depth = 0
    for i, ch in enumerate(s):
        depth += ch == "["
        depth -= ch == "]"
        if depth == 0:
            return s[i + 1:].lstrip()
    return ""


def parse_gcide_entry(word: str, block: str) -> tuple[str, str] | None:
    """``(part of speech, first definition)`` of a headword's own entry, or None if unusable."""
    flat = " ".join(block.split())
    m = _HEAD.match(flat)
    if not m or m.group("word") != word:
        return None
    body = _strip_brackets(flat[m.end():])
    body = re.sub(r"^\(?[a-z]\)\s*", "", body)
    body = re.sub(r"^1\.\s*", "", body)
    body = re.split(r"\[1913 Webster\]|\[Webster|\[PJC\]|\[WordNet|\s2\.\s", body)[0]
    body = re.sub(r"--[A-Z][\w. ]*$", "", body.strip())
    body = re.sub(r"^\((?:[A-Z][a-z]*\.?\s?)+\)\s*", "", body)  # (Zool.) (Law) labels
    body = re.sub(r"^\([a-z]\)\s*", "", body)
    body = body.replace("{", "").replace("}", "")
    body = re.split(r";|\. |\.$", body)[0].strip().rstrip(",:")
    if not 15 <= len(body) <= 110 or "?" in body or "[" in body or "\\" in body:
        return None
    low = body.lower()
    if word.lower()[:5] in low or low.startswith(("see ", "same as", "obs", "pl.", "of ", "imp.", "p. p.")):
        return None
    if not re.fullmatch(r"[A-Za-z ,'()\-]+", body):
        return None
    return POS[m.group("pos")], body[0].upper() + body[1:]


def iter_gcide(index: Path, data: Path) -> Iterator[tuple[str, str, str]]:
    """``(word, part of speech, definition)`` for usable single-word entries, in index order."""
    raw = gzip.open(data).read()
    seen: set[str] = set()
    for line in index.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or not re.fullmatch(r"[A-Z][a-z]{3,13}", parts[0]) or parts[0] in seen:
            continue
        seen.add(parts[0])
        block = raw[_b64(parts[1]):_b64(parts[1]) + _b64(parts[2])].decode("utf-8", "replace")
        got = parse_gcide_entry(parts[0], block)
        if got:
            yield parts[0].lower(), got[0], got[1]


def build_gcide_defs(out_dir: Path, n_test: int = 500, n_fewshot: int = 50, seed: int = 20250101) -> dict:
    """Write ``gcide_defs/{test,validation}.jsonl``: word → 4 same-POS definitions, one correct."""
    index, data = gcide_files(out_dir / "_cache")
    entries = sorted(iter_gcide(index, data))
    by_pos: dict[str, list[tuple[str, str, str]]] = {}
    for e in entries:
        by_pos.setdefault(e[1], []).append(e)
    rnd = random.Random(seed)
    picked = rnd.sample(entries, n_test + n_fewshot)
    rows = []
    for k, (word, pos, definition) in enumerate(picked):
        pool = by_pos[pos]
        wrong: list[str] = []
        while len(wrong) < 3:
            w, _, d = pool[rnd.randrange(len(pool))]
            if w != word and d != definition and d not in wrong:
                wrong.append(d)
        label = rnd.randrange(4)
        choices = wrong[:label] + [definition] + wrong[label:]
        rows.append({"id": f"gcide-{k:04d}", "word": word, "pos": pos, "choices": choices, "label": label})
    return _write(out_dir / "gcide_defs", {"test": rows[:n_test], "validation": rows[n_test:]},
                  {"source": "dict-gcide (GNU Collaborative International Dictionary of English), GPL-3.0+",
                   "candidates": len(entries), "seed": seed})


WORDNET_DEB = "wordnet-base"
WORDNET_DIR = "usr/share/wordnet"
WORDNET_POS = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}


def wordnet_dir(cache: Path) -> tuple[Path, str]:
    """WordNet's database directory and where it came from: the installed ``wordnet-base``, else
    the package fetched with ``apt-get download`` into ``cache`` and unpacked there."""
    installed = Path("/") / WORDNET_DIR
    if (installed / "data.noun").exists():
        return installed, f"{WORDNET_DEB} (installed, {installed})"
    deb = fetch_deb(WORDNET_DEB, cache)
    base = extract_deb(deb, cache) / WORDNET_DIR
    if not (base / "data.noun").exists():
        raise CptkitError(f"{deb}: holds no {WORDNET_DIR}/data.noun")
    return base, f"{WORDNET_DEB} {deb_version(deb)}"


def wordnet_glosses(path: Path) -> dict[int, tuple[list[str], str]]:
    """``{offset: (words, gloss)}`` of a WordNet ``data.POS`` file (licence header skipped)."""
    out: dict[int, tuple[list[str], str]] = {}
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if line.startswith("  ") or not line.strip():
                continue
            head, sep, gloss = line.partition(" | ")
            fields = head.split()
            try:
                count = int(fields[3], 16)
                words = [re.sub(r"\(\w+\)$", "", fields[4 + 2 * k]) for k in range(count)]  # galore(ip)
                out[int(fields[0])] = (words, gloss.strip() if sep else "")
            except (IndexError, ValueError):
                raise BadInput(str(path), n, "not a WordNet data line (offset lex_filenum ss_type w_cnt word...)") from None
    return out


def wordnet_definition(word: str, gloss: str) -> str | None:
    """The first definition of a gloss (before its examples), or None when unusable as a choice."""
    body = re.sub(r"^\([a-z ]+\)\s*", "", gloss.split(";")[0].strip()).rstrip(".,:")  # (biology) labels
    if not 15 <= len(body) <= 110 or not re.fullmatch(r"[A-Za-z ,'()\-]+", body) or word[:5] in body.lower():
        return None
    return body[0].upper() + body[1:]


WordNetEntry = tuple[str, str, str, frozenset[int], int]  # word, pos, definition, its senses, offset


def iter_wordnet(wn: Path) -> Iterator[WordNetEntry]:
    """``(word, part of speech, definition, offsets of all its senses, offset of the first)`` for
    single-word lowercase lemmas whose most frequent sense (the index's first) is usable; one word
    per synset (the first in the synset's own order that qualifies)."""
    for suffix, pos in WORDNET_POS.items():
        synsets = wordnet_glosses(wn / f"data.{suffix}")
        taken: set[int] = set()
        index = wn / f"index.{suffix}"
        for n, line in enumerate(index.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if line.startswith("  ") or not line.strip():
                continue
            fields = line.split()
            try:
                senses = int(fields[2])
                offsets = [int(x) for x in fields[len(fields) - senses:]]
            except (IndexError, ValueError):
                raise BadInput(str(index), n, "not a WordNet index line (lemma pos synset_cnt ... offsets)") from None
            word, first = fields[0], offsets[0]
            if not re.fullmatch(r"[a-z]{4,14}", word) or first in taken or first not in synsets:
                continue
            words, gloss = synsets[first]
            if word not in words:  # a proper noun (Paris) or another spelling in the synset
                continue
            definition = wordnet_definition(word, gloss)
            if definition:
                taken.add(first)
                yield word, pos, definition, frozenset(offsets), first


def gcide_words(raw: bytes) -> bytes:
    """dict-gcide's text (``gcide.dict.dz``, read) as lower-case ASCII words between single spaces."""
    return b" " + re.sub(rb"[^a-z0-9]+", b" ", raw.lower()) + b" "


def phrase_in(words: bytes, phrase: str) -> bool:
    """Whether ``phrase``'s words occur in a row in ``words`` (:func:`gcide_words`), case and punctuation aside."""
    return f" {' '.join(re.findall(r'[a-z0-9]+', phrase.lower()))} ".encode() in words


def shared_ngrams(texts: list[str], raw: bytes, n: int = 8) -> set[int]:
    """Indexes of ``texts`` sharing a word ``n``-gram with dict-gcide's entries (``raw``), by the rule
    of ``evaluate-contamination`` (:mod:`cptkit.eval.contamination`)."""
    index = BenchmarkIndex.build("wordnet", texts, n)
    hit: set[int] = set()
    for entry in re.split(r"\n\s*\n", raw.decode("utf-8", errors="replace")):
        hit |= index.match(ngram_hashes(entry, n))
    return hit


def wordnet_rows(entries: list[WordNetEntry], n: int, seed: int,
                 excluded: Callable[[str], bool] = lambda _d: False) -> tuple[list[dict], int]:
    """``n`` multiple-choice rows drawn from ``entries`` (sorted) with ``random.Random(seed)``,
    skipping entries whose definition is ``excluded``, and how many were skipped. The three wrong
    choices are definitions of other words of the same part of speech, never of a sense of the word."""
    by_pos: dict[str, list[WordNetEntry]] = {}
    for e in entries:
        by_pos.setdefault(e[1], []).append(e)
    n_defs = {pos: len({e[2] for e in pool}) for pos, pool in by_pos.items()}
    rnd = random.Random(seed)
    picked: list[WordNetEntry] = []
    skipped = 0
    for i in rnd.sample(range(len(entries)), len(entries)):
        if len(picked) == n:
            break
        if excluded(entries[i][2]):
            skipped += 1
        elif n_defs[entries[i][1]] - len(entries[i][3]) - 1 >= 3:  # 3 wrong choices can be drawn
            picked.append(entries[i])
    if len(picked) < n:
        raise CptkitError(f"only {len(picked)} usable WordNet entries, fewer than {n}")
    rows = []
    for k, (word, pos, definition, senses, _) in enumerate(picked):
        pool = by_pos[pos]
        wrong: list[str] = []
        while len(wrong) < 3:
            _, _, d, _, offset = pool[rnd.randrange(len(pool))]
            if offset not in senses and d != definition and d not in wrong:
                wrong.append(d)
        label = rnd.randrange(4)
        choices = wrong[:label] + [definition] + wrong[label:]
        rows.append({"id": f"wordnet-{k:04d}", "word": word, "pos": pos, "choices": choices, "label": label})
    return rows, skipped


def build_wordnet_defs(out_dir: Path, n_test: int = 500, n_fewshot: int = 50, seed: int = 20250102,
                       wordnet: Path | None = None, gcide_data: Path | None = None) -> dict:
    """Write ``wordnet_defs/{test,validation}.jsonl``: word → its first-sense WordNet gloss among 4
    of the same part of speech. dict-gcide holds WordNet 1.5 senses and the demo corpus holds
    dict-gcide, so a gloss that shares an 8-gram with it, or is in it word for word, is never a
    correct answer. ``wordnet`` (a database directory) and ``gcide_data`` default to the Debian packages'."""
    wn, origin = (wordnet, str(wordnet)) if wordnet is not None else wordnet_dir(out_dir / "_cache")
    entries = sorted(iter_wordnet(wn))
    raw = gzip.open(gcide_data or gcide_files(out_dir / "_cache")[1]).read()
    in_gcide = {entries[i][2] for i in shared_ngrams([e[2] for e in entries], raw)}
    gcide = gcide_words(raw)
    rows, skipped = wordnet_rows(entries, n_test + n_fewshot, seed, lambda d: d in in_gcide or phrase_in(gcide, d))
    return _write(out_dir / "wordnet_defs", {"test": rows[:n_test], "validation": rows[n_test:]},
                  {"source": f"WordNet 3.0 ({origin}), WordNet licence (BSD-like)", "candidates": len(entries),
                   "candidates_sharing_an_8gram_with_gcide": len(in_gcide), "skipped_in_gcide": skipped,
                   "seed": seed})


def build_champ_math(out_dir: Path, n_fewshot: int = 8, seed: int = 7) -> dict:
    """Write ``champ_math/{test,train}.jsonl``: CHAMP problems with a numeric final answer."""
    spec = importlib.util.find_spec("champ_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise CptkitError("champ_math needs the package champ-dataset: pip install champ-dataset")
    src = Path(list(spec.submodule_search_locations)[0]) / "dataset_files" / "v0.json"
    problems = json.loads(src.read_text())["problems"]
    rows = []
    for pid in sorted(problems):
        p = problems[pid]
        ans = p["_answer"].strip()
        m = re.fullmatch(r"(-?\d+(?:\.\d+)?(?:/\d+)?)", ans) or re.search(r"equivalently (-?\d+(?:/\d+)?)$", ans)
        if not m:
            continue
        steps = " ".join(s["_text"].strip() for s in p["solution"]["steps"])
        rows.append({"id": pid, "category": p["category"], "problem": p["_text"].strip(),
                     "solution": f"{steps} The answer is {m.group(1)}.", "answer": m.group(1)})
    rnd = random.Random(seed)
    shot_ids = set(rnd.sample([r["id"] for r in rows], n_fewshot))
    return _write(out_dir / "champ_math", {"test": [r for r in rows if r["id"] not in shot_ids],
                                           "train": [r for r in rows if r["id"] in shot_ids]},
                  {"source": "champ-dataset 1.0.0 (CHAMP, MIT)", "seed": seed})


def arithmetic_value(tokens: list[str]) -> int:
    """The value of ``a op b op ...`` (``+ - *``, integers), ``*`` before ``+``/``-``."""
    terms, sign, prod = [], 1, int(tokens[0])
    for op, x in zip(tokens[1::2], tokens[2::2], strict=True):
        if op == "*":
            prod *= int(x)
            continue
        terms.append(sign * prod)
        sign, prod = (1 if op == "+" else -1), int(x)
    return sum(terms) + sign * prod


def build_simple_arithmetic(out_dir: Path, n: int = 1000, seed: int = 20230601) -> dict:
    """Write ``simple_arithmetic/test.jsonl``: ``n`` expressions of 1-3 operations (``+ - *``) on numbers
    of 1-3 digits (tokens, answer). Shots come from the same file (never the item itself), as in the Gauntlet."""
    rnd = random.Random(seed)

    def number() -> str:
        digits = rnd.randint(1, 3)
        return str(rnd.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1))

    rows = []
    for k in range(n):
        tokens = [number()]
        for _ in range(rnd.randint(1, 3)):
            tokens += [rnd.choice("+-*"), number()]
        rows.append({"id": f"arith-{k:04d}", "tokens": tokens, "answer": str(arithmetic_value(tokens))})
    return _write(out_dir / "simple_arithmetic", {"test": rows},
                  {"source": "generated by cptkit (MosaicML Gauntlet's simple arithmetic recipe)", "seed": seed})


def _write(d: Path, splits: dict[str, list[dict]], about: dict) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        atomic_write_bytes(d / f"{split}.jsonl", body.encode())
    info = about | {"splits": {k: len(v) for k, v in splits.items()}}
    atomic_write_bytes(d / "about.json", (json.dumps(info, indent=1) + "\n").encode())
    return info


BUILDERS = {"gcide_defs": build_gcide_defs, "wordnet_defs": build_wordnet_defs, "champ_math": build_champ_math, "simple_arithmetic": build_simple_arithmetic}


def build(name: str, data_dir: str | Path) -> dict:
    """Build one task's data under ``data_dir``."""
    if name not in BUILDERS:
        raise CptkitError(f"no task builder {name!r} (have: {', '.join(BUILDERS)})")

    log.info("building eval task data %s in %s", name, data_dir)
    return BUILDERS[name](Path(data_dir).expanduser())


def main(argv: list[str] | None = None) -> None:
    import os

    ap = argparse.ArgumentParser(prog="cptkit build-tasks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=os.environ.get("CPTKIT_EVAL_DATA", "~/.cache/cptkit/eval"))
    ap.add_argument("tasks", nargs="*", default=list(BUILDERS))
    args = ap.parse_args(argv)
    for t in args.tasks:
        print(t, json.dumps(build(t, args.data_dir)))
