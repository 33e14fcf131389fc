"""retrieve: BM25 top-k documents for many queries; output: their union with hits, plus _run.tsv
(SPEC §2).

Two phases: build an index from the corpus shards once (``--corpus``; into ``--index DIR`` or
``OUT/_index``), then search it with every query record's ``text``. Output: each retrieved
document once, in corpus order, with all its fields and ``hits: [{query_id, rank, score}]``
(sorted by query order), plus ``OUT/_run.tsv`` (``query_id  doc_id  rank  score``, by query
then rank; ``retrieve.run_format=trec``: TREC's six columns ``qid Q0 docid rank score tag``).
Ties: score descending, then corpus order. See docs/retrieve.md.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.core import remote
from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.progress import log
from cptkit.core.records import Record, plain_id_problem
from cptkit.core.run import Run
from cptkit.core.shards import InputFile, iter_records
from cptkit.core.step import OUT, QUIET, SKIP_BAD, Option, step
from cptkit.index.base import IDF_VARIANTS, BM25Params, bm25_params, bm25_tokenizer
from cptkit.index.elasticsearch import EsConfig, EsIndex
from cptkit.index.sharded import OpenShardedIndex, is_sharded
from cptkit.index.store import BACKENDS, OpenIndex, build_index, is_finished
from cptkit.text.tokenize import TokenizerConfig

CJK_MODES = ("bigram", "unigram", "none")  # retrieve.tokenizer.cjk (cptkit.text.tokenize.Tokenizer)

RUN_FILE = "_run.tsv"
MAX_TOP_K = 10_000_000
INDEX_SUBDIR = "_index"


@dataclass
class RetrieveConfig:
    queries: Any = None  # query file(s): path, directory, glob or a list of them (--queries)
    index: str | None = None  # index directory (--index); default OUT/_index
    top_k: int = 1000
    k1: float | None = None  # None: the IDF variant's default (lucene 1.2 = Elasticsearch, okapi 1.5 = rank-bm25)
    b: float = 0.75
    idf: str = "lucene"  # lucene | okapi (= rank_bm25.BM25Okapi)
    epsilon: float = 0.25  # okapi: negative IDFs become epsilon * mean IDF
    backend: str = "bm25"  # bm25 (fast, numba, mmap) | rank_bm25 (reference) | elasticsearch
    shards: int = 0  # retrieve-index: index shards to build (0: shard.count)
    threads: int = 1  # sharded index: shards searched in parallel
    dtype: str = "float32"  # stored posting scores: float32 | float64
    batch_size: int = 256  # queries per search call
    text_field: str = "text"  # document field indexed
    query_field: str = "text"  # query field searched
    run_format: str = "tsv"  # _run.tsv columns: tsv (query_id doc_id rank score) | trec (qid Q0 docid rank score tag)
    run_tag: str = "cptkit-bm25"  # trec: the run name in the sixth column
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    es: EsConfig = field(default_factory=EsConfig)

    def __post_init__(self) -> None:
        check(1 <= self.top_k <= MAX_TOP_K, "top_k", self.top_k,
              f"must be in [1, {MAX_TOP_K:,}] (documents per query; the paper uses 1000)")
        check(self.backend in (*BACKENDS, "elasticsearch"), "backend", self.backend,
              f"must be one of {', '.join((*BACKENDS, 'elasticsearch'))}")
        check(self.dtype in ("float32", "float64"), "dtype", self.dtype, "must be float32 or float64")
        check(self.idf in IDF_VARIANTS, "idf", self.idf, f"must be one of {', '.join(IDF_VARIANTS)}")
        check(self.k1 is None or self.k1 >= 0, "k1", self.k1, "must be >= 0 (null: the idf variant's default)")
        check(0.0 <= self.b <= 1.0, "b", self.b, "must be in [0, 1]")
        check(self.k1 is None or math.isfinite(self.k1), "k1", self.k1, "must be finite")
        check(math.isfinite(self.epsilon) and self.epsilon >= 0, "epsilon", self.epsilon,
              "must be a finite number >= 0 (okapi: negative IDFs become epsilon * mean IDF)")
        check(_compiles(self.tokenizer.split), "tokenizer.split", repr(self.tokenizer.split),
              "is not a valid regular expression")
        check(self.backend != "elasticsearch" or self.idf == "lucene", "idf", self.idf,
              "retrieve.backend=elasticsearch scores with Lucene's IDF: set retrieve.idf=lucene")
        check(self.tokenizer.cjk in CJK_MODES, "tokenizer.cjk", self.tokenizer.cjk,
              f"must be one of {', '.join(CJK_MODES)}")
        check(self.shards >= 0, "shards", self.shards, "must be >= 0 (0: shard.count)")
        check(self.threads >= 1, "threads", self.threads, "must be >= 1")
        check(self.batch_size >= 1, "batch_size", self.batch_size, "must be >= 1 (queries per search call)")
        check(self.run_format in ("tsv", "trec"), "run_format", self.run_format, "must be tsv or trec")
        check(self.run_tag != "" and not any(c.isspace() for c in self.run_tag), "run_tag", repr(self.run_tag),
              "must be one word (TREC's run name column)")


def _compiles(pattern: str) -> bool:
    """Whether ``pattern`` is a valid regular expression (checked at compose time)."""
    try:
        re.compile(pattern)
    except (re.error, TypeError, RecursionError, OverflowError):
        return False
    return True


@dataclass
class RetrieveJob(JobConfig):
    retrieve: RetrieveConfig = field(default_factory=RetrieveConfig)


def _specs(value: Any) -> list[str]:
    """``retrieve.queries`` (one spec or a list of them: the field is ``Any``) as a list of specs."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _sources(inputs: list[InputFile]) -> list[dict]:
    return [{"path": f.path if remote.is_url(f.path) else str(Path(f.path).resolve()), "size": f.size} for f in inputs]


def _same_sources(meta: dict, corpus: list[InputFile]) -> bool:
    return [{"path": s["path"], "size": s["size"]} for s in meta.get("sources", [])] == _sources(corpus)


_TREC_UNSAFE = re.compile(r"[\s%]")


def trec_id(rid: str) -> str:
    """An id as one column of a space-separated TREC run: whitespace and ``%`` percent-encoded (UTF-8),
    so ``gcide/A 1`` is ``gcide/A%201``; an id without either is written as it is."""
    return _TREC_UNSAFE.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), rid)


def _corpus_records(job: Job, corpus: list[InputFile], skip_bad: bool) -> Iterator[Record]:
    """The corpus records to index; an id that could not be a ``_run.tsv`` column is a bad line."""
    return iter_records(corpus, skip_bad=skip_bad, plain_ids=True, **job.ctx.io.limits())


def _open_or_build(job: Job, rc: RetrieveConfig, corpus: list[InputFile], skip_bad: bool) -> tuple[Any, float]:
    """The index to search: reuse a finished one, or build it from ``corpus``. Returns (index, build s)."""
    if rc.backend == "elasticsearch":
        return _open_es(job, rc, corpus, skip_bad)
    if job.stdout and not rc.index:
        raise CptkitError("with --out - pass --index DIR (the index cannot live in the output)")
    # an index in a store is copied here first: its arrays are memory-mapped
    index_dir = (remote.local_copy(rc.index) if remote.is_url(rc.index) else Path(rc.index)) if rc.index \
        else job.file(INDEX_SUBDIR)
    tokenizer, params = bm25_tokenizer(rc), bm25_params(rc)
    build_s = 0.0
    if is_sharded(index_dir):
        log.info("opening the sharded index at %s (merging term statistics)", index_dir)
        idx: Any = OpenShardedIndex(index_dir, threads=rc.threads)
        if corpus and not _same_sources(idx.meta, corpus):
            raise CptkitError(f"{index_dir}: these index shards were built from other corpus files than --corpus; "
                              "drop --corpus to reuse them, or pass another --index")
    elif is_finished(index_dir):
        log.info("reusing the index at %s", index_dir)
        idx = OpenIndex(index_dir)
        if corpus and not _same_sources(idx.meta, corpus):
            raise CptkitError(f"{index_dir}: this index was built from other corpus files than --corpus; "
                              "drop --corpus to reuse it, or pass another --index")
    else:
        if not corpus:
            raise CptkitError(f"no finished index at {index_dir} and no --corpus to build one from")
        log.info("building the index from %d corpus file(s) into %s", len(corpus), index_dir)
        advance = job.add_bar("index build (docs)", None)
        t0 = time.time()
        build_index(_corpus_records(job, corpus, skip_bad), index_dir, tokenizer, params,
                    dtype=rc.dtype, text_field=rc.text_field, sources=_sources(corpus), on_record=advance)
        build_s = time.time() - t0
        idx = OpenIndex(index_dir)
    if idx.meta["tokenizer"] != tokenizer.config():
        raise CptkitError(f"{index_dir}: index tokenizer {idx.meta['tokenizer']} differs from "
                          f"retrieve.tokenizer {tokenizer.config()}; rebuild the index or match the config")
    return idx, build_s


def _open_es(job: Job, rc: RetrieveConfig, corpus: list[InputFile], skip_bad: bool) -> tuple[EsIndex, float]:
    """The Elasticsearch/OpenSearch index: reuse it, or bulk-index ``corpus`` into it."""
    tokenizer, params = bm25_tokenizer(rc), bm25_params(rc)
    idx = EsIndex(rc.es, tokenizer, params, text_field=rc.text_field)
    t0 = time.time()
    if idx.ready(_sources(corpus) if corpus else None):
        log.info("reusing the elasticsearch index %s at %s", idx.cfg.index, idx.cfg.url)
        return idx, 0.0
    if not corpus:
        raise CptkitError(f"no finished elasticsearch index {idx.cfg.index!r} at {idx.cfg.url} and no --corpus "
                          "to build one from")
    log.info("bulk-indexing %d corpus file(s) into %s/%s", len(corpus), idx.cfg.url, idx.cfg.index)
    advance = job.add_bar("index build (docs)", None)
    idx.build(_corpus_records(job, corpus, skip_bad), _sources(corpus), on_record=advance)
    return idx, time.time() - t0


CORPUS = Option(("--corpus", "--in", "-i"), "io.inputs", "Corpus shards to index (file, directory, glob); "
                "--in and -i name it as in every other step. Repeatable.", multiple=True)
QUERIES = Option(("--queries",), "retrieve.queries", "Query records (their `text` is searched). Repeatable.",
                 multiple=True)
INDEX = Option(("--index",), "retrieve.index", "Index directory: reused if finished, else built there from --corpus.")


@step("retrieve", RetrieveJob, options=(QUERIES, CORPUS, INDEX, OUT, QUIET, SKIP_BAD), order=40)
def run(conf: RetrieveJob, ctx: Run) -> dict:
    """Build or reuse the index, search every query, write the union of hits and the run file."""
    rc = conf.retrieve
    q_specs = _specs(rc.queries)
    if not q_specs:
        raise CptkitError("no queries given: pass --queries FILE (or retrieve.queries=FILE)")
    q_inputs = ctx.resolve_inputs(q_specs)
    corpus = ctx.resolve_inputs() if conf.io.inputs else []
    params = bm25_params(rc)
    with Job(ctx, inputs=q_inputs + corpus, tasks=[Task(0, q_inputs)]) as job:
        extra: dict[str, Any] = {}
        for task in job.pending():
            qfield = rc.query_field
            qids, qtexts = [], []
            for rec in job.read(task, plain_ids=True):  # query ids go to _run.tsv
                text = rec.get(qfield)
                if not isinstance(text, str):
                    raise CptkitError(f"query {rec['id']!r}: field {qfield!r} is missing or not a string")
                qids.append(rec["id"])
                qtexts.append(text)
            idx, build_s = _open_or_build(job, rc, corpus, conf.io.skip_bad_lines)
            try:
                extra = _search_and_write(job, task, idx, rc, params, qids, qtexts, build_s)
            finally:
                idx.close()
        return job.finish(extra=extra)


def _search_and_write(job: Job, task: Task, idx: Any, rc: RetrieveConfig, params: BM25Params,
                      qids: list[str], qtexts: list[str], build_s: float) -> dict[str, Any]:
    t0 = time.time()
    searcher = idx.searcher(rc.backend, params)
    # more than the index holds would only allocate empty result slots
    k, bs = max(1, min(rc.top_k, int(idx.meta.get("docs") or rc.top_k))), rc.batch_size
    advance = job.add_bar("search (queries)", len(qtexts))
    parts_q, parts_r, parts_d, parts_s = [], [], [], []
    for start in range(0, len(qtexts), bs):
        batch = qtexts[start:start + bs]
        res = searcher.search([idx.tokenizer(t) for t in batch], k)
        valid = res.docs >= 0
        q, r = np.nonzero(valid)
        parts_q.append((q + start).astype(np.int32))
        parts_r.append(r.astype(np.int32))
        parts_d.append(res.docs[valid].astype(np.int64))
        parts_s.append(res.scores[valid])
        advance(len(batch))
    search_s = time.time() - t0
    def cat(xs: list[np.ndarray], dt: type) -> np.ndarray:
        return np.concatenate(xs) if xs else np.zeros(0, dt)

    hq, hr, hd, hs = cat(parts_q, np.int32), cat(parts_r, np.int32), cat(parts_d, np.int64), cat(parts_s, np.float64)

    # The union, in corpus order; each document's hits in query order.
    order = np.lexsort((hr, hq, hd))
    doc_ids: dict[int, str] = {}
    with job.writer(task) as w:
        i, n = 0, order.size
        while i < n:
            d = int(hd[order[i]])
            j = i
            while j < n and hd[order[j]] == d:
                j += 1
            rec = idx.docs.record(d)
            doc_ids[d] = str(rec["id"])
            why = plain_id_problem(doc_ids[d])  # an index built before ids were checked, or by another tool
            if why is not None:
                raise CptkitError(f"{idx.dir}: document {d}: {why}; rebuild the index from corrected records")
            rec["hits"] = [{"query_id": qids[int(hq[o])], "rank": int(hr[o]) + 1, "score": round(float(hs[o]), 6)}
                           for o in order[i:j]]
            w.write(rec)
            i = j
    run_path = job.file(RUN_FILE)
    if not job.stdout:
        tmp = run_path.with_name(f".{RUN_FILE}.tmp-{os.getpid()}")
        with open(tmp, "w", encoding="utf-8") as fh:
            trec, tag = rc.run_format == "trec", rc.run_tag
            for q, r, d, s in zip(hq.tolist(), hr.tolist(), hd.tolist(), hs.tolist(), strict=True):
                if trec:
                    fh.write(f"{trec_id(qids[q])} Q0 {trec_id(doc_ids[d])} {r + 1} {s:.6f} {tag}\n")
                else:
                    fh.write(f"{qids[q]}\t{doc_ids[d]}\t{r + 1}\t{s:.6f}\n")
        os.replace(tmp, run_path)
    job.complete(task, w, seconds=time.time() - t0)
    m = idx.meta
    return {
        "queries": len(qtexts),
        "docs retrieved": len(doc_ids),
        "hits": int(hd.size),
        "queries/s": len(qtexts) / search_s if search_s > 0 else 0.0,
        "index build s": build_s,
        "index reused": build_s == 0.0,
        "index dir": rc.index if remote.is_url(rc.index) else str(idx.dir),
        "index shards": m.get("shards", 1),
        "index docs": m["docs"],
        "index terms": m["terms"],
        "index postings": m["postings"],
        "index avgdl": m["avgdl"],
        "index MiB": m["size_bytes"] / 2**20,
        "index dtype": m["dtype"],
        "k1": params.k1,
        "b": params.b,
        "idf": params.idf,
        "epsilon": params.epsilon,
        "backend": rc.backend,
        "top_k": rc.top_k,
        "tokenizer": m["tokenizer"],
    }
