"""BM25 backends and tokenization: parity with rank_bm25, formulas by hand, CJK, save/load."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _retrieve_data import chinese_paragraphs, english_paragraphs
from rank_bm25 import BM25Okapi

from cptkit.index.base import BM25Params, idf_lucene, idf_okapi, topk_dense
from cptkit.index.bm25 import BM25Index
from cptkit.index.rank_bm25_backend import RankBM25Searcher
from cptkit.text.tokenize import Tokenizer


@pytest.fixture(scope="module")
def real():
    """~700 real paragraphs (English Python docs + Chinese Debian Reference), tokenized."""
    texts = english_paragraphs(600) + chinese_paragraphs(100)
    tok = Tokenizer()
    toks = [tok(t) for t in texts]
    # Queries: word windows from every 23rd paragraph (both languages), some with unknown words.
    queries = [t[i % 5: i % 5 + 4 + i % 9] for i, t in enumerate(toks[::23])] + [["zzzunknown", "python"], []]
    return texts, toks, queries


# --- tokenization ------------------------------------------------------------------------

def test_tokenizer_default_rules():
    tok = Tokenizer()
    assert tok("Hello, WORLD! foo_bar 3.14 Ünïcode-ß") == ["hello", "world", "foo_bar", "3", "14", "ünïcode", "ß"]
    assert tok("the The THE") == ["the"] * 3  # no stopwords, no stemming
    assert tok("running runs") == ["running", "runs"]
    assert Tokenizer({"stopwords": ["The"], "min_length": 2})("The cat a dog") == ["cat", "dog"]
    assert Tokenizer({"lowercase": False})("Foo bar") == ["Foo", "bar"]


def test_tokenizer_cjk_bigrams():
    tok = Tokenizer()
    assert tok("机器学习") == ["机器", "器学", "学习"]
    assert tok("我") == ["我"]  # a one-character run stays a unigram
    assert tok("python教程很好。Debian系统") == ["python", "教程", "程很", "很好", "debian", "系统"]
    assert Tokenizer({"cjk_unigrams": True})("学习") == ["学习", "学", "习"]
    assert Tokenizer({"cjk": "unigram"})("学习") == ["学", "习"]
    assert Tokenizer({"cjk": "none"})("机器学习 ok") == ["机器学习", "ok"]
    assert tok("ひらがなカタカナ한국어") == ["ひら", "らが", "がな", "なカ", "カタ", "タカ", "カナ", "ナ한", "한국", "국어"]


def test_cjk_text_is_searchable():
    zh = chinese_paragraphs(100)
    tok = Tokenizer()
    toks = [tok(t) for t in zh]
    assert all(toks), "no Chinese paragraph may tokenize to nothing"
    index = BM25Index.build(toks)
    # A 4-character phrase taken from paragraph 37 retrieves it first.
    target = 37
    run = next(w for w in zh[target].split() if len(w) >= 6 and all("\u4e00" <= c <= "\u9fff" for c in w[:6]))
    res = index.search([tok(run[:6])], 5)
    assert target in res.docs[0, :res.counts[0]].tolist()
    assert res.scores[0, 0] > 0


# --- formulas -----------------------------------------------------------------------------

def test_default_k1_per_idf_variant():
    """lucene: Elasticsearch's BM25 defaults (k1 1.2, b 0.75); okapi: rank_bm25.BM25Okapi's (k1 1.5, b 0.75)."""
    assert BM25Params().as_dict() == {"k1": 1.2, "b": 0.75, "idf": "lucene", "epsilon": 0.25}
    assert BM25Params(idf="okapi").as_dict() == {"k1": 1.5, "b": 0.75, "idf": "okapi", "epsilon": 0.25}
    assert BM25Params(k1=0.9, idf="okapi").k1 == 0.9


def test_lucene_formula_by_hand():
    """Three documents, scores worked out by hand with Elasticsearch's defaults k1=1.2, b=0.75."""
    docs = [["a", "b", "a"], ["b", "c"], ["c", "c", "c", "d"]]
    index = BM25Index.build(docs, BM25Params(idf="lucene"), dtype="float64")
    assert index.params.k1 == 1.2
    avgdl = 9 / 3
    idf_a = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))  # a in 1 doc: log(1 + 2.5/1.5) = 0.98083
    idf_b = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # b in 2 docs: log(1.6) = 0.47000
    idf_c = idf_b
    assert idf_a == pytest.approx(0.9808292530117262)
    assert idf_b == pytest.approx(0.47000362924573563)

    def w(tf, dl):
        return tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl / avgdl))

    s = index.get_scores(["a", "c"])
    assert s[0] == pytest.approx(idf_a * w(2, 3), abs=1e-12)  # 0.98083 * 4.4 / 3.2 = 0.98083 * 1.375 = 1.34864
    assert s[0] == pytest.approx(1.3486402228911236)
    assert s[1] == pytest.approx(idf_c * w(1, 2), abs=1e-12)
    assert s[2] == pytest.approx(idf_c * w(3, 4), abs=1e-12)
    np.testing.assert_allclose(index.idf(), idf_lucene(np.array([1, 2, 2, 1]), 3))
    # Ranking: doc 0 (a twice) > doc 2 (c three times, long) > doc 1.
    res = index.search([["a", "c"]], 10)
    assert res.docs[0, :3].tolist() == [0, 2, 1] and res.counts[0] == 3


def test_okapi_idf_floor_matches_rank_bm25_definition():
    df = np.array([1, 2, 3, 3])  # N = 4: terms in 3 of 4 docs get a negative raw IDF
    raw = np.log(4 - df + 0.5) - np.log(df + 0.5)
    assert raw[2] < 0
    got = idf_okapi(df, 4, 0.25)
    assert got[2] == got[3] == pytest.approx(0.25 * raw.mean())
    assert got[0] == pytest.approx(math.log(3.5 / 1.5))


# --- parity with rank_bm25 ----------------------------------------------------------------

def test_okapi_scores_equal_rank_bm25(real):
    _, toks, queries = real
    ref = BM25Okapi(toks)
    ours64 = BM25Index.build(toks, BM25Params(idf="okapi"), dtype="float64")
    ours32 = ours64.with_params(BM25Params(idf="okapi"))
    ours32 = BM25Index(ours64.vocab, ours64.indptr, ours64.post_doc, ours64.post_tf, None, ours64.doc_len,
                       BM25Params(idf="okapi"), "float32")
    for q in queries:
        expected = ref.get_scores(q)
        np.testing.assert_allclose(ours64.get_scores(q), expected, rtol=0, atol=1e-6)
        np.testing.assert_allclose(ours32.get_scores(q), expected, rtol=1e-6, atol=1e-9)
    assert max(np.abs(ours64.get_scores(q) - ref.get_scores(q)).max() for q in queries) < 1e-9


def test_okapi_topk_equals_rank_bm25(real):
    _, toks, queries = real
    ours = BM25Index.build(toks, BM25Params(idf="okapi"), dtype="float64")
    ref = RankBM25Searcher(toks, BM25Params(idf="okapi"))
    a, b = ours.search(queries, 50), ref.search(queries, 50)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.docs, b.docs)
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)
    assert a.counts[-1] == 0 and a.counts[-2] > 0  # empty query: no hits; unknown word ignored


def test_lucene_matches_reference_backend_and_bm25s(real):
    import bm25s

    _, toks, queries = real
    ours = BM25Index.build(toks, BM25Params(idf="lucene"), dtype="float64")
    ref = RankBM25Searcher(toks, BM25Params(idf="lucene"))
    for q in queries[:10]:
        np.testing.assert_allclose(ours.get_scores(q), ref.get_scores(q), atol=1e-9)
    # bm25s (method lucene) omits the constant (k1 + 1); with unique query terms scores are ours / 2.2
    # (bm25s' own default is k1 = 1.5: pass Elasticsearch's 1.2, cptkit's lucene default)
    model = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    model.index(bm25s.tokenization.Tokenized(ids=[[ours.vocab[t] for t in d] for d in toks],
                                             vocab=dict(ours.vocab)), show_progress=False)
    for q in queries[:10]:
        uq = list(dict.fromkeys(q))
        ids = [ours.vocab[t] for t in uq if t in ours.vocab]
        if ids:
            theirs = model.get_scores(ids)
            np.testing.assert_allclose(ours.get_scores(uq) / 2.2, theirs, rtol=1e-5, atol=1e-6)


def test_ties_broken_by_document_index():
    docs = [["x", "y"], ["y", "x"], ["x", "y"], ["z"], ["x", "y"]]
    index = BM25Index.build(docs)
    res = index.search([["x"]], 3)
    assert res.docs[0].tolist() == [0, 1, 2]
    assert res.scores[0, 0] == res.scores[0, 2]
    d, s = topk_dense(index.get_scores(["x"]), np.array([1, 1, 1, 0, 1], bool), 3)
    assert d.tolist() == [0, 1, 2]


def test_params_rescored_without_rebuild(real):
    _, toks, queries = real
    base = BM25Index.build(toks, BM25Params(), dtype="float64")
    other = BM25Params(k1=0.9, b=0.4, idf="okapi")
    fresh = BM25Index.build(toks, other, dtype="float64")
    np.testing.assert_allclose(base.with_params(other).post_score, fresh.post_score)


def test_save_load_mmap_equal(real, tmp_path):
    _, toks, queries = real
    index = BM25Index.build(toks)
    index.save(tmp_path / "idx")
    loaded = BM25Index.load(tmp_path / "idx", mmap=True)
    assert isinstance(loaded.post_score, np.memmap) and isinstance(loaded.post_doc, np.memmap)
    assert loaded.vocab == index.vocab and loaded.params == index.params
    for name in ("indptr", "post_doc", "post_tf", "post_score", "doc_len"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(index, name))
    a, b = index.search(queries, 100), loaded.search(queries, 100)
    np.testing.assert_array_equal(a.docs, b.docs)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.counts.sum() > 100


@pytest.mark.parametrize("k", [1, 7, 100, 1000, 5000])
def test_partial_selection_equals_full_sort_with_many_ties(k):
    """The kernel's top-k (buffered quickselect) equals sorting every matched document, ties by index.

    9,000 documents of equal length over a 6-word vocabulary give long runs of exactly equal
    scores; common-word queries take the dense path (candidate buffer compacted many times),
    rare-word ones the sparse path.
    """
    rng = np.random.default_rng(3)
    vocab = ["a", "b", "c", "d", "e", "f"]
    probs = [0.5, 0.3, 0.1, 0.075, 0.017, 0.008]
    docs = [list(rng.choice(vocab, size=4, p=probs)) for _ in range(9000)]
    index = BM25Index.build(docs, BM25Params(), dtype="float64")
    queries = [["a"], ["a", "b"], ["b", "c", "d"], ["f"], ["e", "f"], ["d", "f", "c", "e"], ["zz"]]
    res = index.search(queries, k)
    dense = [q for q in queries if index.df[index.term_ids(q)].sum() * 8 >= index.n_docs]
    assert len(dense) == 4  # dense and sparse paths are both exercised (3 sparse queries)
    for qi, q in enumerate(queries):
        matched = np.zeros(index.n_docs, bool)
        for t in index.term_ids(q):
            matched[index.post_doc[index.indptr[t]:index.indptr[t + 1]]] = True
        d, s = topk_dense(index.get_scores(q), matched, k)
        n = int(res.counts[qi])
        assert n == d.size == min(k, int(matched.sum()))
        np.testing.assert_array_equal(res.docs[qi, :n], d)
        np.testing.assert_array_equal(res.scores[qi, :n], s)
        assert (res.docs[qi, n:] == -1).all()
    assert len(np.unique(res.scores[0, :res.counts[0]])) < res.counts[0] / 2 or k < 10  # ties abound


def test_repeated_query_terms_count_per_occurrence(real):
    """A term repeated in the query is scored once per occurrence (weight = count), as rank_bm25."""
    _, toks, _ = real
    index = BM25Index.build(toks, BM25Params(idf="okapi"), dtype="float64")
    ref = RankBM25Searcher(toks, BM25Params(idf="okapi"))
    q = ["python", "the", "file", "the", "python", "python"]
    a, b = index.search([q], 30), ref.search([q], 30)
    np.testing.assert_array_equal(a.docs, b.docs)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-12)
    single = index.search([["python", "the", "file"]], 30)
    assert a.scores[0, 0] > single.scores[0, 0] * 1.5


# --- the blocked kernel against the unblocked reference ----------------------------------

def _assert_same(a, b):
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.docs, b.docs)
    np.testing.assert_array_equal(a.scores, b.scores)  # bitwise: same float sums in the same order


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocked_kernel_equals_reference_on_real_text(real, dtype):
    """Docs and scores identical to the unblocked kernel for every block size (several blocks, boundaries
    inside every term's postings), scan chunk, query group, dense-column threshold (none, the default
    N/8, every term up to DENSE_MAX_TERMS) and k, dense and sparse queries, repeated query terms."""
    _, toks, queries = real
    index = BM25Index.build(toks, BM25Params(), dtype=dtype)
    by_df = [t for t, _ in sorted(index.vocab.items(), key=lambda x: -index.df[x[1]])]
    common, rare = by_df[:40], by_df[-40:]
    queries = queries + [common[i:i + 3 + i % 7] for i in range(0, 30, 2)]  # dense path, many ties
    queries += [rare[i:i + 1 + i % 4] for i in range(0, 40, 4)]  # sparse path
    queries += [["the", "python", "the", "file", "python", "the"], common[:5] * 2]  # repeated terms: w > 1
    n_dense = sum(index.df[index.term_ids(q)].sum() * 8 >= index.n_docs for q in queries)
    assert 10 < n_dense < len(queries) - 8  # both paths exercised
    for k in (1, 10, 1000, index.n_docs + 5):
        ref = index.search(queries, k, reference=True)
        for block, chunk, group, dense in ((7, 1, 1, None), (7, 64, 5, 1), (64, 8, 64, 10**9), (333, 64, 1, 20),
                                           (1 << 15, 64, 64, None), (index.n_docs, 3, 2, 1)):
            _assert_same(index.search(queries, k, block=block, chunk=chunk, group=group, dense_min_df=dense), ref)
    assert (ref.counts == np.minimum(ref.counts, index.n_docs)).all() and ref.counts.max() > 500
    dense_col, cols = index.dense_columns(1)
    assert (dense_col >= 0).sum() == cols.shape[0] == 32 and cols.dtype == index.post_score.dtype
    assert 0 < (index.dense_columns(-(-index.n_docs // 8))[0] >= 0).sum() < 32


@pytest.mark.parametrize("k", [1, 7, 100, 1000, 5000])
def test_blocked_kernel_equals_reference_with_many_ties(k):
    """Long runs of exactly equal scores across block and chunk boundaries; the candidate buffer fills
    (and is cut back to k) inside blocks."""
    rng = np.random.default_rng(5)
    vocab = ["a", "b", "c", "d", "e", "f"]
    docs = [list(rng.choice(vocab, size=4, p=[0.5, 0.3, 0.1, 0.075, 0.017, 0.008])) for _ in range(9000)]
    for dtype in ("float32", "float64"):
        index = BM25Index.build(docs, BM25Params(), dtype=dtype)
        queries = [["a"], ["a", "b"], ["b", "c", "d"], ["f"], ["e", "f"], ["d", "f", "c", "e"], ["zz"], ["a", "a", "c"]]
        ref = index.search(queries, k, reference=True)
        for block, group, dense in ((7, 1, None), (100, 3, 1), (4096, 64, 10**9), (1 << 15, 2, 500)):
            _assert_same(index.search(queries, k, block=block, group=group, dense_min_df=dense), ref)


def test_blocked_kernel_with_nonpositive_idf():
    """Okapi IDF <= 0 for terms in most documents: such queries take the sparse path, still identical."""
    docs = [["a", "b"], ["a"], ["a", "c"], ["a", "b", "c"], ["d"]] * 40
    index = BM25Index.build(docs, BM25Params(idf="okapi", epsilon=0.0), dtype="float64")
    assert (index.idf() <= 0).any()
    queries = [["a"], ["a", "b"], ["b", "c"], ["d"], ["c", "c", "d"]]
    for k in (1, 3, 50, 500):
        ref = index.search(queries, k, reference=True)
        for block in (7, 64, 1000):
            _assert_same(index.search(queries, k, block=block), ref)


def test_postings_equal_counter_construction(real):
    """The two-pass postings build equals Counter per document plus a stable argsort by term."""
    from collections import Counter

    _, toks, _ = real
    index = BM25Index.build(toks)
    vocab: dict[str, int] = {}
    terms, tfs, docs = [], [], []
    for d, t in enumerate(toks):
        for w, c in Counter(t).items():
            terms.append(vocab.setdefault(w, len(vocab)))
            tfs.append(c)
            docs.append(d)
    order = np.argsort(np.array(terms), kind="stable")
    assert list(index.vocab) == list(vocab)
    np.testing.assert_array_equal(index.indptr, np.concatenate([[0], np.cumsum(np.bincount(terms))]))
    assert index.post_doc.dtype == np.int32 and index.post_tf.dtype == np.int32 and index.indptr.dtype == np.int64
    np.testing.assert_array_equal(index.post_doc, np.array(docs)[order])
    np.testing.assert_array_equal(index.post_tf, np.array(tfs)[order])
    np.testing.assert_array_equal(index.doc_len, [len(t) for t in toks])
