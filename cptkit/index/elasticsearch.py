"""The Elasticsearch / OpenSearch backend over plain HTTP (urllib; no client library).

The paper's engine, for corpora beyond one machine. Documents are indexed with the *cptkit
tokens* joined by spaces in a ``whitespace``-analyzed field, so both engines see the same terms
(no analyzer drift), under a custom ``BM25`` similarity with the configured ``k1``/``b`` set in
the index settings. The original record is kept unindexed (``enabled: false``) next to its
corpus position ``pos`` (the document ``_id``, so a retried bulk request is idempotent).

A query is a ``bool``/``should`` of ``term`` queries, one per distinct query token with
``boost`` = its count (a repeated token counts once per occurrence, as in cptkit), sorted by
``_score`` then ``pos`` (cptkit's tie order), ``size`` = k; batches go through ``_msearch``.
Lucene's BM25 drops the constant ``(k1 + 1)`` and IDF is Lucene's, so scores are reported
× ``(k1 + 1)`` to be on cptkit's ``idf=lucene`` scale (Lucene also quantizes document lengths
to one byte, so scores differ slightly from an exact implementation).

The request bodies are pure functions (:func:`index_body`, :func:`bulk_body`,
:func:`search_body`, :func:`msearch_body`) tested without a server.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.core.records import Record
from cptkit.index.base import BM25Params, Searcher, SearchResult
from cptkit.text.tokenize import Tokenizer

SIMILARITY = "cptkit_bm25"
TOKENS = "tokens"


@dataclass
class EsConfig:
    """Where the server is and how to talk to it (``retrieve.es.*``)."""

    url: str = "http://localhost:9200"  # may carry user:password@ (basic auth)
    index: str = "cptkit-bm25"
    recreate: bool = False  # drop and rebuild an existing index (else: reuse if built from the same corpus)
    bulk_docs: int = 1000  # documents per _bulk request
    msearch_batch: int = 64  # queries per _msearch request
    retries: int = 5  # per request, on connection errors, 429 and 5xx (exponential backoff)
    backoff_s: float = 0.5
    timeout_s: float = 60.0
    shards: int = 1  # index.number_of_shards
    replicas: int = 0  # index.number_of_replicas


# --- request bodies (pure) -----------------------------------------------------------------

def index_body(params: BM25Params, meta: dict[str, Any], shards: int = 1, replicas: int = 0) -> dict[str, Any]:
    """Settings and mappings of a new index: BM25 similarity with k1/b, whitespace tokens, stored record."""
    if params.idf != "lucene":
        raise CptkitError("retrieve.backend=elasticsearch scores with Lucene's IDF: set retrieve.idf=lucene")
    return {
        "settings": {
            "index": {
                "number_of_shards": shards,
                "number_of_replicas": replicas,
                "similarity": {SIMILARITY: {"type": "BM25", "k1": params.k1, "b": params.b}},
            }
        },
        "mappings": {
            "_meta": {"cptkit": meta},
            "dynamic": False,
            "properties": {
                TOKENS: {"type": "text", "analyzer": "whitespace", "similarity": SIMILARITY,
                         "norms": True, "index_options": "freqs"},
                "pos": {"type": "long"},
                "rec": {"type": "object", "enabled": False},
            },
        },
    }


def bulk_body(index: str, docs: Iterable[tuple[int, Record, list[str]]]) -> bytes:
    """``_bulk`` NDJSON: an ``index`` action per (position, record, tokens), ``_id`` = position."""
    lines = []
    for pos, rec, tokens in docs:
        lines.append(json.dumps({"index": {"_index": index, "_id": str(pos)}}))
        lines.append(json.dumps({"pos": pos, TOKENS: " ".join(tokens), "rec": rec}, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""


def search_body(tokens: list[str], k: int) -> dict[str, Any]:
    """One query: distinct tokens as ``term`` clauses boosted by their count; ties by corpus position."""
    counts: dict[str, int] = {}
    for t in tokens:
        counts[t] = counts.get(t, 0) + 1
    should = [{"term": {TOKENS: {"value": t, "boost": c}}} if c > 1 else {"term": {TOKENS: t}}
              for t, c in counts.items()]
    return {
        "size": k,
        "query": {"bool": {"should": should}} if should else {"match_none": {}},
        "sort": [{"_score": {"order": "desc"}}, {"pos": {"order": "asc"}}],
        "track_scores": True,
        "track_total_hits": False,
        "_source": ["pos", "rec"],
    }


def msearch_body(index: str, queries: list[list[str]], k: int) -> bytes:
    """``_msearch`` NDJSON: a header and a body per query."""
    lines = []
    for q in queries:
        lines.append(json.dumps({"index": index}))
        lines.append(json.dumps(search_body(q, k), ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode("utf-8")


def parse_msearch(resp: dict[str, Any], k1: float) -> list[list[tuple[int, float, Record]]]:
    """Hits per query: (position, score on cptkit's scale, record); a failed query raises."""
    out = []
    for i, r in enumerate(resp.get("responses", [])):
        if "error" in r:
            raise CptkitError(f"elasticsearch: query {i} of the batch failed: {_reason(r['error'])}")
        out.append([(int(h["_source"]["pos"]), float(h["_score"]) * (k1 + 1.0), h["_source"]["rec"])
                    for h in r["hits"]["hits"]])
    return out


def _reason(err: Any) -> str:
    if isinstance(err, dict):
        root = (err.get("root_cause") or [err])[0]
        return f"{root.get('type', 'error')}: {root.get('reason', err)}"
    return str(err)


# --- HTTP ----------------------------------------------------------------------------------

class EsClient:
    """Minimal JSON/NDJSON over HTTP with retries; raises :class:`CptkitError` with one line."""

    def __init__(self, cfg: EsConfig):
        self.cfg = cfg
        u = urllib.parse.urlsplit(cfg.url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise CptkitError(f"retrieve.es.url must be http(s)://host:port, got {cfg.url!r}")
        self.base = urllib.parse.urlunsplit((u.scheme, u.hostname + (f":{u.port}" if u.port else ""), u.path, "", ""))
        self.headers = {}
        if u.username:
            cred = f"{urllib.parse.unquote(u.username)}:{urllib.parse.unquote(u.password or '')}"
            self.headers["Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()

    def request(self, method: str, path: str, body: Any = None, ndjson: bool = False,
                ok404: bool = False) -> dict[str, Any] | None:
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = "application/x-ndjson" if ndjson else "application/json"
        url = f"{self.base}/{path.lstrip('/')}"
        last = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                time.sleep(self.cfg.backoff_s * 2 ** (attempt - 1))
            req = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as r:
                    raw = r.read()
                    return json.loads(raw) if raw else {}
            except urllib.error.HTTPError as e:
                text = e.read().decode("utf-8", "replace")
                if e.code == 404 and ok404:
                    return None
                if e.code == 429 or e.code >= 500:
                    last = f"HTTP {e.code}"
                    continue
                try:
                    reason = _reason(json.loads(text).get("error", text))
                except ValueError:
                    reason = text[:300]
                raise CptkitError(f"elasticsearch {method} {url}: HTTP {e.code}: {reason}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                last = str(getattr(e, "reason", e))
        raise CptkitError(f"elasticsearch at {self.base} is unreachable or failing after {self.cfg.retries + 1} "
                          f"attempts ({last}); start a server or set retrieve.es.url")


# --- the index -----------------------------------------------------------------------------

class _HitStore:
    """Records returned by searches, by corpus position (the step reads them back for output)."""

    def __init__(self) -> None:
        self.recs: dict[int, Record] = {}

    def record(self, i: int) -> Record:
        return dict(self.recs[int(i)])

    def close(self) -> None:
        self.recs.clear()


class EsSearcher(Searcher):
    def __init__(self, index: EsIndex):
        self.index, self.params, self.n_docs = index, index.params, int(index.meta["docs"])

    def search(self, queries: list[list[str]], k: int) -> SearchResult:
        k = max(int(k), 1)
        idx, cfg = self.index, self.index.cfg
        docs = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.zeros((len(queries), k), dtype=np.float64)
        counts = np.zeros(len(queries), dtype=np.int64)
        for start in range(0, len(queries), max(cfg.msearch_batch, 1)):
            batch = queries[start:start + cfg.msearch_batch]
            resp = idx.client.request("POST", f"{cfg.index}/_msearch", msearch_body(cfg.index, batch, k), ndjson=True)
            for j, hits in enumerate(parse_msearch(resp or {}, self.params.k1)):
                for r, (pos, score, rec) in enumerate(hits[:k]):
                    docs[start + j, r], scores[start + j, r] = pos, score
                    idx.docs.recs[pos] = rec
                counts[start + j] = min(len(hits), k)
        return SearchResult(docs, scores, counts)

    def get_scores(self, query: list[str]) -> np.ndarray:
        res = self.search([query], self.n_docs)
        out = np.zeros(self.n_docs, dtype=np.float64)
        n = int(res.counts[0])
        out[res.docs[0, :n]] = res.scores[0, :n]
        return out


class EsIndex:
    """An Elasticsearch/OpenSearch index with the surface the retrieve step uses (like ``OpenIndex``)."""

    def __init__(self, cfg: EsConfig, tokenizer: Tokenizer, params: BM25Params, text_field: str = "text"):
        self.cfg, self.tokenizer, self.params, self.text_field = cfg, tokenizer, params, text_field
        self.client = EsClient(cfg)
        self.dir = f"{self.client.base}/{cfg.index}"
        self.docs = _HitStore()
        self.meta: dict[str, Any] = {}
        index_body(params, {})  # validates the IDF before any request

    def _wanted(self, sources: list[dict] | None) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer.config(), "k1": self.params.k1, "b": self.params.b,
                "text_field": self.text_field, "sources": sources}

    def ready(self, sources: list[dict] | None) -> bool:
        """Whether a finished index with this config (and these sources, if given) exists; refreshes meta."""
        got = self.client.request("GET", f"{self.cfg.index}/_mapping", ok404=True)
        if got is None:
            return False
        m = (next(iter(got.values()), {}).get("mappings", {}).get("_meta", {}) or {}).get("cptkit", {})
        if not m.get("finished") or self.cfg.recreate:
            return False
        want = self._wanted(sources)
        for key in ("tokenizer", "k1", "b", "text_field") + (("sources",) if sources is not None else ()):
            if m.get(key) != want[key]:
                raise CptkitError(f"elasticsearch index {self.cfg.index!r} was built with another {key} "
                                  f"({m.get(key)!r}); set retrieve.es.recreate=true or another retrieve.es.index")
        self._load_meta(m)
        return True

    def _load_meta(self, m: dict[str, Any]) -> None:
        stats = self.client.request("GET", f"{self.cfg.index}/_stats/docs,store") or {}
        total = stats.get("indices", {}).get(self.cfg.index, {}).get("primaries", {})
        self.meta = {"docs": int(m.get("docs", 0)), "terms": None, "postings": None, "avgdl": m.get("avgdl"),
                     "size_bytes": int(total.get("store", {}).get("size_in_bytes", 0)), "dtype": "elasticsearch",
                     "tokenizer": self.tokenizer.config(), "sources": m.get("sources", [])}

    def build(self, records: Iterable[Record], sources: list[dict],
              on_record: Callable[[], None] | None = None) -> None:
        """(Re)create the index and bulk-index ``records`` in corpus order; mark it finished last."""
        self.client.request("DELETE", self.cfg.index, ok404=True)
        meta = {**self._wanted(sources), "finished": False}
        self.client.request("PUT", self.cfg.index, index_body(self.params, meta, self.cfg.shards, self.cfg.replicas))
        n, total_len = 0, 0
        for chunk in _chunks(self._docs(records, on_record), max(self.cfg.bulk_docs, 1)):
            self._bulk(chunk)
            n += len(chunk)
            total_len += sum(len(t) for _, _, t in chunk)
        if n == 0:
            raise CptkitError("the corpus holds no documents")
        self.client.request("POST", f"{self.cfg.index}/_refresh")
        meta.update({"finished": True, "docs": n, "avgdl": total_len / n})
        self.client.request("PUT", f"{self.cfg.index}/_mapping", {"_meta": {"cptkit": meta}})
        self._load_meta(meta)

    def _docs(self, records: Iterable[Record], on_record: Callable[[], None] | None
              ) -> Iterator[tuple[int, Record, list[str]]]:
        for pos, rec in enumerate(records):
            text = rec.get(self.text_field)
            yield pos, rec, (self.tokenizer(text) if isinstance(text, str) else [])
            if on_record is not None:
                on_record()

    def _bulk(self, chunk: list[tuple[int, Record, list[str]]]) -> None:
        """One ``_bulk`` request; items rejected with 429 are resent (with backoff), others raise."""
        todo = chunk
        for attempt in range(self.cfg.retries + 1):
            resp = self.client.request("POST", "_bulk", bulk_body(self.cfg.index, todo), ndjson=True) or {}
            if not resp.get("errors"):
                return
            retry = []
            for item, doc in zip(resp.get("items", []), todo, strict=False):
                r = next(iter(item.values()))
                if r.get("status", 200) == 429:
                    retry.append(doc)
                elif r.get("error"):
                    raise CptkitError(f"elasticsearch bulk: document at corpus position {doc[0]} "
                                      f"(id {doc[1].get('id')!r}) rejected: {_reason(r['error'])}")
            if not retry:
                return
            todo = retry
            log.warning("elasticsearch bulk: %d documents rejected with 429; retrying", len(retry))
            time.sleep(self.cfg.backoff_s * 2 ** attempt)
        raise CptkitError(f"elasticsearch bulk: {len(todo)} documents still rejected after {self.cfg.retries} retries")

    @property
    def n_docs(self) -> int:
        return int(self.meta.get("docs", 0))

    def searcher(self, backend: str = "elasticsearch", params: BM25Params | None = None) -> Searcher:
        if params is not None and params != self.params:
            raise CptkitError("the elasticsearch index was built with other BM25 parameters")
        return EsSearcher(self)

    def close(self) -> None:
        self.docs.close()


def _chunks(it: Iterable[Any], n: int) -> Iterator[list[Any]]:
    buf: list[Any] = []
    for x in it:
        buf.append(x)
        if len(buf) == n:
            yield buf
            buf = []
    if buf:
        yield buf
