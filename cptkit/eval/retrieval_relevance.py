"""Precision and recall of a retrieved set against relevance labels that do not come from the retriever.

``cptkit retrieval-relevance --retrieved DIR [--retrieved DIR ...] --corpus DIR
--labels conf/reproduce/relevance_stem.yaml [--budget B]`` writes ``DIR/_relevance.json`` into each
``cptkit retrieve`` output (atomically; the corpus is read once for all of them).

``--topics conf/reproduce/topics_v2.yaml --topic KEYWORD`` (one ``--topic`` per ``--retrieved``, in
order) scores each retrieve output against its own topic's rules instead of one ``--labels`` file
(:func:`load_topics`; the corpus is still read once).

Labels are rules on where a corpus record was published (``source``, ``meta.package``, its ``url``:
see conf/reproduce/relevance_stem.yaml), fixed before a sweep is run. For one retrieved set:

- ``precision`` = relevant retrieved / retrieved, ``recall`` = relevant retrieved / relevant in
  the corpus, with the counts and ``base_rate`` = relevant / all corpus documents (the precision of
  retrieving at random);
- a percentile bootstrap 95% interval over the retrieved documents (resampled with replacement,
  seeded): for precision, and for recall (the corpus total held fixed, so it is precision's
  interval times retrieved / relevant).

Two views of each retrieve output: ``all``, the union of every query's top-k (``retrieve.top_k``,
the paper's protocol: more queries retrieve more documents), and with ``--budget B`` ``budget``, a
fixed number of documents for every member: the first B distinct documents when the hits of
``_run.tsv`` are taken round-robin by rank (every query's rank-1 hit in query order, then every
rank-2 hit, ...). A member whose queries find fewer than B documents keeps what it has
(``filled: false``).

Each file also records the config of the queries it retrieved with (the ``_manifest.json`` of the
``--queries`` step output named in the retrieve manifest), so a claim of
:mod:`cptkit.eval.reproduce` can read an axis such as ``expand.rounds`` from it
(``config: {file: _relevance.json, path: [queries, config]}``).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.output import is_finished
from cptkit.core.shards import atomic_write_json, iter_records, resolve_inputs
from cptkit.eval.stats import bootstrap_ci

RELEVANCE = "_relevance.json"
RUN_FILE = "_run.tsv"


@dataclass(frozen=True)
class Labels:
    """Relevance rules: a record is relevant when any rule matches it; a rule matches when every
    (dotted) field it names matches one of its glob patterns."""

    name: str
    relevant: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...]
    description: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "labels") -> Labels:
        rules = d.get("relevant") if isinstance(d, dict) else None
        if not isinstance(rules, list) or not rules:
            raise CptkitError(f"{where}: needs `relevant:`, a non-empty list of rules ({{field: [glob, ...]}})")
        out = []
        for i, rule in enumerate(rules):
            if not isinstance(rule, dict) or not rule:
                raise CptkitError(f"{where}: relevant[{i}] must map fields to glob patterns")
            fields = []
            for key, pats in rule.items():
                pats = [pats] if isinstance(pats, str) else pats
                if not isinstance(pats, list) or not pats or not all(isinstance(p, str) for p in pats):
                    raise CptkitError(f"{where}: relevant[{i}].{key} must be a glob or a list of globs")
                fields.append((str(key), tuple(pats)))
            out.append(tuple(fields))
        return cls(name=str(d.get("name", "relevant")), relevant=tuple(out), description=str(d.get("description", "")))

    @classmethod
    def load(cls, path: Path) -> Labels:
        import yaml

        try:
            return cls.from_dict(yaml.safe_load(Path(path).read_text(encoding="utf-8")), str(path))
        except (OSError, yaml.YAMLError) as e:
            raise CptkitError(f"{path}: {e}") from None

    def __call__(self, rec: dict[str, Any]) -> bool:
        return any(all(_matches(_field(rec, key), pats) for key, pats in rule) for rule in self.relevant)


def slug(keyword: str) -> str:
    """``keyword`` in lower case, every run of characters other than a-z and 0-9 one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", keyword.lower()).strip("-")


@dataclass(frozen=True)
class Topic:
    """A keyword and its relevant set (one replicate of a claim whose ``seed`` is the keyword)."""

    keyword: str
    slug: str
    labels: Labels
    source: str = ""

    @property
    def seed_id(self) -> str:
        return f"kw-{self.slug}"


def load_topics(path: Path) -> list[Topic]:
    """The topics of a topics file (conf/reproduce/topics_v2.yaml: ``topics: [{keyword, source,
    relevant: [rules]}]``, each topic's rules as a labels file's); slugs must differ."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise CptkitError(f"{path}: {e}") from None
    items = doc.get("topics") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise CptkitError(f"{path}: needs `topics:`, a non-empty list of {{keyword, relevant}}")
    topics: list[Topic] = []
    seen: dict[str, str] = {}
    for i, t in enumerate(items):
        kw = t.get("keyword") if isinstance(t, dict) else None
        if not isinstance(kw, str) or not slug(kw):
            raise CptkitError(f"{path}: topics[{i}] needs a `keyword` with a letter or digit")
        if slug(kw) in seen:
            raise CptkitError(f"{path}: keywords {seen[slug(kw)]!r} and {kw!r} have the same slug {slug(kw)!r}")
        seen[slug(kw)] = kw
        labels = Labels.from_dict({**t, "name": kw}, f"{path}: topic {kw!r}")
        topics.append(Topic(kw, slug(kw), labels, str(t.get("source", ""))))
    return topics


def _field(rec: dict[str, Any], key: str) -> Any:
    obj: Any = rec
    for k in key.split("."):
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


def _matches(value: Any, patterns: Sequence[str]) -> bool:
    return isinstance(value, str) and any(fnmatch.fnmatchcase(value, p) for p in patterns)


def relevance(flags: Sequence[bool], relevant_in_corpus: int, corpus_docs: int, level: float = 0.95,
              resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Precision, recall, counts and bootstrap intervals of one retrieved set.

    ``flags``: one per retrieved document, whether it is relevant. ``relevant_in_corpus``: the
    number of relevant documents in the whole corpus (``corpus_docs`` documents)."""
    n, k = len(flags), sum(bool(f) for f in flags)
    if relevant_in_corpus < k:
        raise CptkitError(f"{k} relevant documents retrieved but only {relevant_in_corpus} in the corpus: "
                          "the retrieved set is not from this corpus")
    p_lo, p_hi = bootstrap_ci([1.0] * k + [0.0] * (n - k), level, resamples, seed) if n else (math.nan, math.nan)
    recall = k / relevant_in_corpus if relevant_in_corpus else math.nan
    scale = n / relevant_in_corpus if relevant_in_corpus else math.nan
    return {"retrieved": n, "relevant_retrieved": k, "relevant_in_corpus": relevant_in_corpus,
            "corpus_docs": corpus_docs, "precision": k / n if n else math.nan, "recall": recall,
            "base_rate": relevant_in_corpus / corpus_docs if corpus_docs else math.nan,
            "precision_ci": [p_lo, p_hi], "recall_ci": [p_lo * scale, p_hi * scale],
            "ci": {"method": "percentile bootstrap over the retrieved documents", "level": level,
                   "resamples": resamples, "seed": seed}}


def round_robin(hits: Iterable[tuple[str, str, int]], budget: int) -> list[str]:
    """The first ``budget`` distinct documents of ``(query_id, doc_id, rank)`` hits taken round-robin
    by rank: every query's rank-1 hit (queries in order of first appearance), then rank 2, ..."""
    order: dict[str, int] = {}
    rows = []
    for q, d, r in hits:
        rows.append((int(r), order.setdefault(q, len(order)), d))
    rows.sort(key=lambda t: (t[0], t[1]))
    picked: dict[str, None] = {}
    for _, _, d in rows:
        if len(picked) >= budget:
            break
        picked.setdefault(d, None)
    return list(picked)


def read_run(path: Path) -> list[tuple[str, str, int]]:
    """``(query_id, doc_id, rank)`` rows of a retrieve ``_run.tsv`` (tsv or trec columns)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 4:
                rows.append((parts[0], parts[1], int(parts[2])))
                continue
            parts = line.split()
            if len(parts) != 6:
                raise CptkitError(f"{path}: not a retrieve run file (line {line[:80]!r})")
            rows.append((parts[0], parts[2], int(parts[3])))
    return rows


def corpus_labels(corpus: Sequence[str], labels: Labels) -> tuple[int, int, Counter]:
    """(documents, relevant documents, relevant per meta.package) of the corpus."""
    n, per = corpus_labels_many(corpus, {labels.name: labels})
    return n, sum(per[labels.name].values()), per[labels.name]


def corpus_labels_many(corpus: Sequence[str], labels: dict[str, Labels]) -> tuple[int, dict[str, Counter]]:
    """(documents, {name: relevant per meta.package}) of the corpus for several label sets, read once."""
    n, per = 0, {k: Counter() for k in labels}
    for rec in iter_records(resolve_inputs(list(corpus))):
        n += 1
        for k, lab in labels.items():
            if lab(rec):
                per[k][str(_field(rec, "meta.package") or rec.get("source"))] += 1
    return n, per


def _queries_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The paths of the retrieve run's ``--queries`` and, when they name one step output, its config."""
    specs = (manifest.get("config", {}).get("retrieve", {}) or {}).get("queries") or []
    specs = [specs] if isinstance(specs, str) else [str(s) for s in specs]
    config = None
    if len(specs) == 1 and (Path(specs[0]) / "_manifest.json").is_file():
        config = json.loads((Path(specs[0]) / "_manifest.json").read_text())["config"]
    return {"paths": [str(Path(s).resolve()) for s in specs], "config": config}


def evaluate(retrieved: Path, labels: Labels, corpus_docs: int, relevant_in_corpus: int,
             budget: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The content of ``retrieved/_relevance.json`` (reads the retrieve output, writes nothing)."""
    man_path = retrieved / "_manifest.json"
    if not is_finished(retrieved) or not man_path.is_file():
        raise CptkitError(f"{retrieved}: not a finished retrieve output (no _SUCCESS/_manifest.json)")
    manifest = json.loads(man_path.read_text())
    if manifest.get("step") != "retrieve":
        raise CptkitError(f"{retrieved}: the output of `cptkit {manifest.get('step')}`, not of `cptkit retrieve`")
    flag: dict[str, bool] = {}
    packages: Counter = Counter()
    for rec in iter_records(resolve_inputs([str(retrieved)])):
        flag[str(rec["id"])] = labels(rec)
        packages[str(_field(rec, "meta.package") or rec.get("source"))] += 1
    out: dict[str, Any] = {
        "labels": labels.name,
        "queries": _queries_of(manifest),
        "top_k": manifest.get("config", {}).get("retrieve", {}).get("top_k"),
        "queries_searched": manifest.get("extra", {}).get("queries"),
        "all": relevance(list(flag.values()), relevant_in_corpus, corpus_docs, seed=seed),
        "retrieved_by_package": dict(packages.most_common()),
    }
    if budget is not None:
        ids = round_robin(read_run(retrieved / RUN_FILE), budget)
        missing = [d for d in ids if d not in flag]
        if missing:
            raise CptkitError(f"{retrieved}/{RUN_FILE}: document {missing[0]!r} is not among the retrieved records")
        out["budget"] = {"docs": budget, "filled": len(ids) == budget,
                         **relevance([flag[d] for d in ids], relevant_in_corpus, corpus_docs, seed=seed)}
    return out


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit retrieval-relevance", description=__doc__.splitlines()[0])
    p.add_argument("--retrieved", type=Path, action="append", required=True,
                   help="a finished `cptkit retrieve` output (repeatable); its _relevance.json is written")
    p.add_argument("--corpus", action="append", required=True,
                   help="the corpus retrieved from (file, directory, glob; repeatable): the relevant total")
    p.add_argument("--labels", type=Path, default=None, help="the relevance rules (YAML)")
    p.add_argument("--topics", type=Path, default=None,
                   help="instead of --labels: a topics file (conf/reproduce/topics_v2.yaml), each topic its own rules")
    p.add_argument("--topic", action="append", default=[],
                   help="with --topics: the keyword (or its slug) of each --retrieved, in the same order")
    p.add_argument("--budget", type=int, default=None,
                   help="also score the first B documents taken round-robin by rank (a fixed budget)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--out", type=Path, default=None,
                   help=f"where to write (one --retrieved only; default: DIR/{RELEVANCE})")
    a = p.parse_args(argv)
    if a.out and len(a.retrieved) > 1:
        raise CptkitError("--out takes one --retrieved")
    if a.budget is not None and a.budget < 1:
        raise CptkitError(f"--budget {a.budget}: must be >= 1")
    if (a.labels is None) == (a.topics is None):
        raise CptkitError("give --labels FILE, or --topics FILE with a --topic per --retrieved")
    rules_file = a.labels or a.topics
    if a.topics is not None:
        if len(a.topic) != len(a.retrieved):
            raise CptkitError(f"--topics: {len(a.topic)} --topic for {len(a.retrieved)} --retrieved (one each)")
        known = {k: t.labels for t in load_topics(a.topics) for k in (t.keyword, t.slug)}
        unknown = [t for t in a.topic if t not in known]
        if unknown:
            raise CptkitError(f"--topic {unknown[0]!r} is not a keyword of {a.topics}")
        wanted = {known[t].name: known[t] for t in a.topic}
        names = [known[t].name for t in a.topic]
    else:
        labels = Labels.load(a.labels)
        wanted, names = {labels.name: labels}, [labels.name] * len(a.retrieved)
    n, per = corpus_labels_many(a.corpus, wanted)
    digest = hashlib.sha256(rules_file.read_bytes()).hexdigest()[:16]
    for d, name in zip(a.retrieved, names, strict=True):
        rel = sum(per[name].values())
        res = evaluate(d, wanted[name], n, rel, a.budget, a.seed)
        res["labels"] = {"name": name, "file": str(rules_file), "sha256": digest,
                         "relevant_by_package": dict(per[name].most_common())}
        atomic_write_json(a.out or d / RELEVANCE, res)
        view = res.get("budget", res["all"])
        print(f"{d}: precision {view['precision']:.4f} recall {view['recall']:.4f} "
              f"({view['relevant_retrieved']}/{view['retrieved']} retrieved, {rel} relevant in the corpus)")
    return 0
