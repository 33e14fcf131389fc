"""Claim ``expansion`` (v2): BM25 + RM3 on numbers worked by hand, the three query arms, member names
the aggregator reads, the topics file and the sweep's make targets, and the whole path at toy size
(a corpus, topics and round-1 queries written here; cptkit retrieve; recall at a budget; the verdict
of the pre-registered claim in conf/reproduce/claims.yaml)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

from cptkit.core.errors import CptkitError
from cptkit.eval import retrieval_relevance
from cptkit.eval.expansion_arms import ARMS_FILE, METHODS, member_name, seed_records, write_arms
from cptkit.eval.reproduce import member_config, name_items, report
from cptkit.eval.retrieval_relevance import load_topics, slug
from cptkit.eval.stats import HOLDS
from cptkit.index.base import BM25Params
from cptkit.index.bm25 import BM25Index
from cptkit.index.rm3 import RM3Params, relevance_model, rm3, rm3_queries, weighted_text
from tests.conftest import run_main, write_jsonl

ROOT = Path(__file__).resolve().parent.parent

# -- RM3 on a 3-document collection, by hand -----------------------------------------------------
# D1 and D2 are the feedback documents of the query "apple" (BM25 scores 3 and 1); D3 is not.
# With fb_docs 2, fb_terms 2, original weight 0.5 and no df filter (max_df_ratio 1):
#   D1 apple 2, banana 1, cherry 1 -> pruned to its 2 most frequent terms (ties by term): apple 2, banana 1
#   D2 date 2, banana 1 ("b_c" and "z" are not feedback terms: [a-z0-9]{2,20} only) -> date 2, banana 1
#   RM1: apple 2/3*3 = 2, banana 1/3*3 + 1/3*1 = 4/3, date 2/3*1 = 2/3; top 2 scaled: apple .6, banana .4
#   RM3: .5*{apple: 1} + .5*RM1 = apple .8, banana .2
# Had "b_c" been kept, it would sort before "banana" in D2's tie and push banana out of D2's vector.
D1 = ["apple", "banana", "apple", "cherry"]
D2 = ["banana", "date", "date", "b_c", "z"]
D3 = ["cherry", "eel"]
DF = {"apple": 1, "banana": 2, "cherry": 2, "date": 1, "eel": 1, "b_c": 1, "z": 1}
FEEDBACK = [(D1, 3.0), (D2, 1.0)]
P = RM3Params(fb_docs=2, fb_terms=2, original_query_weight=0.5, max_df_ratio=1.0)


def _close(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want), (got, want)
    for t, w in want.items():
        assert got[t] == pytest.approx(w, abs=1e-12), (t, got)


def test_rm3_by_hand():
    _close(relevance_model(FEEDBACK, DF.__getitem__, 3, P), {"apple": 2.0, "banana": 4 / 3})
    _close(rm3(["apple"], FEEDBACK, DF.__getitem__, 3, P), {"apple": 0.8, "banana": 0.2})
    # fb_docs 1: D1 alone -> RM1 apple 2/3, banana 1/3 -> RM3 apple 5/6, banana 1/6
    one = RM3Params(fb_docs=1, fb_terms=2, original_query_weight=0.5, max_df_ratio=1.0)
    _close(rm3(["apple"], FEEDBACK, DF.__getitem__, 3, one), {"apple": 5 / 6, "banana": 1 / 6})
    # original weight 1: the query alone; 0: the relevance model alone
    w1 = RM3Params(2, 2, 1.0, 1.0)
    _close(rm3(["apple"], FEEDBACK, DF.__getitem__, 3, w1), {"apple": 1.0, "banana": 0.0})
    w0 = RM3Params(2, 2, 0.0, 1.0)
    _close(rm3(["apple"], FEEDBACK, DF.__getitem__, 3, w0), {"apple": 0.6, "banana": 0.4})


def test_rm3_df_filter_by_hand():
    """max_df_ratio 0.5 of 3 documents: banana and cherry (in 2) are no feedback terms.
    D1 -> apple 2 (norm 2), D2 -> date 2 (norm 2): RM1 apple 1*3, date 1*1 -> .75, .25; RM3 apple .875, date .125."""
    p = RM3Params(fb_docs=2, fb_terms=2, original_query_weight=0.5, max_df_ratio=0.5)
    _close(rm3(["apple"], FEEDBACK, DF.__getitem__, 3, p), {"apple": 0.875, "date": 0.125})
    # Anserini's default (0.1 of 3 documents: below one document) leaves no feedback term: the query alone
    _close(rm3(["apple"], FEEDBACK, DF.__getitem__, 3, RM3Params()), {"apple": 1.0})


def test_rm3_queries_are_blocks_of_one_relevance_model():
    """Query 1 is RM3; query 2 takes the model's next fb_terms terms (date, RM1 weight 2/3, alone in
    its block: scaled to 1); a block past the model's end is the query alone."""
    qs = rm3_queries(["apple"], FEEDBACK, DF.__getitem__, 3, 3, P)
    assert len(qs) == 3
    _close(qs[0], rm3(["apple"], FEEDBACK, DF.__getitem__, 3, P))
    _close(qs[1], {"apple": 0.5, "date": 0.5})
    _close(qs[2], {"apple": 1.0})
    assert rm3_queries(["apple"], FEEDBACK, DF.__getitem__, 3, 0, P) == []


def test_weighted_text_is_the_weighted_query_for_bm25():
    assert weighted_text({"banana": 0.2, "apple": 0.8}, resolution=10) == " ".join(["apple"] * 8 + ["banana"] * 2)
    assert weighted_text({"apple": 0.996, "eel": 0.004}) == " ".join(["apple"] * 100)  # 0.4 repetitions: dropped
    with pytest.raises(CptkitError, match="resolution"):
        weighted_text({"apple": 1.0}, resolution=0)
    # the index adds a term's score once per occurrence: the text scores as 8*apple + 2*banana
    idx = BM25Index.build([D1, D2, D3], BM25Params())
    res = idx.search([weighted_text({"apple": 0.8, "banana": 0.2}, 10).split()], 3)
    apple, banana = idx.get_scores(["apple"]), idx.get_scores(["banana"])
    for d, s in res.hits(0):
        assert s == pytest.approx(8 * apple[d] + 2 * banana[d], rel=1e-6)


def test_rm3_params_are_checked():
    for bad in ({"fb_docs": 0}, {"fb_terms": 0}, {"original_query_weight": 1.5}, {"max_df_ratio": 0.0}):
        with pytest.raises(CptkitError, match="rm3"):
            RM3Params(**bad)


# -- the aggregator reads method and keyword from a member's name ----------------------------------
def test_member_config_from_the_directory_name(tmp_path):
    d = tmp_path / member_name("rm3", "text-processing")
    assert d.name == "method=rm3,keyword=text-processing"
    assert name_items(d) == {"method": "rm3", "keyword": "text-processing"}
    assert name_items(tmp_path / "rp0.2_s1") == {}
    assert name_items(tmp_path / "share=0.2,seed=3") == {"share": 0.2, "seed": 3}
    config = {"retrieve": {"top_k": 400}, "seed": 0}
    assert member_config(d, "method", config) == "rm3" and member_config(d, "keyword", config) == "text-processing"
    assert member_config(d, "retrieve.top_k", config) == 400
    assert member_config(tmp_path / "method=x,seed=5", "seed", config) == 0  # the config wins over the name
    with pytest.raises(KeyError):
        member_config(d, "arm", config)


# -- the topics file, and the sweep's make targets ------------------------------------------------
def test_topics_v2_file():
    topics = load_topics(ROOT / "conf" / "reproduce" / "topics_v2.yaml")
    assert len(topics) >= 30
    assert len({t.slug for t in topics}) == len(topics) and all(re.fullmatch(r"[a-z0-9-]+", t.slug) for t in topics)
    pkgs = {"python3.11-doc", "maxima-doc"}
    for t in topics:  # each set: one publisher's pages, by url (never by what was retrieved)
        assert t.source and t.labels.relevant
        for rule in t.labels.relevant:
            fields = dict(rule)
            assert set(fields["meta.package"]) <= pkgs and fields["url"], t.keyword
    inte = next(t for t in topics if t.keyword == "integration")
    page = "https://maxima.sourceforge.io/docs/manual/maxima_98.html#index-integrate"
    assert inte.labels({"url": page, "meta": {"package": "maxima-doc"}})
    assert not inte.labels({"url": page, "meta": {"package": "dict-gcide"}})
    text = next(t for t in topics if t.keyword == "text processing")
    py = "https://docs.python.org/3.11/library/"
    assert text.labels({"url": py + "re.html#re.sub", "meta": {"package": "python3.11-doc"}})
    assert not text.labels({"url": py + "readline.htm", "meta": {"package": "python3.11-doc"}})
    assert not text.labels({"url": py + "socket.html", "meta": {"package": "python3.11-doc"}})


def test_the_sweep_targets(tmp_path):
    """make -n: 96 members named method=M,keyword=SLUG (make's slugs are the module's), each retrieved
    with its own query file and scored against its own keyword; the report decides the claims file."""
    topics = load_topics(ROOT / "conf" / "reproduce" / "topics_v2.yaml")
    out = subprocess.run(["make", "-n", "reproduce-expansion-v2", f"DATA={tmp_path}", f"REPRO={tmp_path}/r"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    members = re.findall(r"--out '[^']*/v2/expansion/([^']+)'", out)
    want = [member_name(m, t.slug) for m in METHODS for t in topics]
    assert members == want
    for m in want:
        assert f"--queries '{tmp_path}/r/v2/expansion_work/queries/{m}.jsonl'" in out
    scored = re.findall(r"--retrieved '[^']*/v2/expansion/([^']+)' --topic (\S+)", out)
    assert scored == [(m, m.split("keyword=")[1]) for m in want]
    assert "--budget 400" in out and "retrieve.top_k=400" in out
    assert "expand.rounds=1" in out and "llm.num_threads=1" in out and "seed=0 llm.seed=0" in out
    assert "--fb-docs 10 --fb-terms 10 --original-query-weight 0.5" in out
    assert "cptkit reproduce-report conf/reproduce/claims.yaml" in out


def test_retrieval_relevance_topics_arguments(tmp_path, capsys):
    topics = tmp_path / "t.yaml"
    topics.write_text(json.dumps({"topics": [{"keyword": "Alpha Beta", "relevant": [{"meta.package": "a"}]}]}))
    assert slug("Alpha  Beta!") == "alpha-beta"
    base = ["--retrieved", str(tmp_path), "--corpus", str(tmp_path)]
    assert retrieval_relevance.main(base + ["--topics", str(topics)]) == 2  # no --topic
    assert retrieval_relevance.main(base + ["--topics", str(topics), "--topic", "gamma"]) == 2
    assert retrieval_relevance.main(base + ["--labels", str(topics), "--topics", str(topics), "--topic", "x"]) == 2
    err = capsys.readouterr().err
    assert "0 --topic for 1 --retrieved" in err and "--topic 'gamma' is not a keyword" in err
    assert "give --labels FILE" in err
    dup = tmp_path / "d.yaml"
    dup.write_text(json.dumps({"topics": [{"keyword": "a b", "relevant": [{"x": "y"}]},
                                          {"keyword": "a-b", "relevant": [{"x": "y"}]}]}))
    with pytest.raises(CptkitError, match="same slug 'a-b'"):
        load_topics(dup)


# -- the whole path at toy size --------------------------------------------------------------------
# Four topics. Each has 4 relevant documents (package rel-KW): one names the keyword, three only its
# subject word KWsyn; and 4 short off-topic pages that name the keyword (package junk). The keyword
# alone ranks the short junk pages first; RM3's feedback is those pages, so it expands with their
# words; the round-1 queries written here ask about KWsyn (a good expansion) or about the junk
# words (an expansion that drifted off topic).
KEYWORDS = ["alpha", "bravo", "charlie", "delta"]


def _toy_corpus() -> list[dict]:
    recs = []
    for kw in KEYWORDS:
        recs.append({"id": f"{kw}-r0", "text": f"{kw} guide {kw}syn basics", "meta": {"package": f"rel-{kw}"}})
        for i in (1, 2, 3):
            recs.append({"id": f"{kw}-r{i}", "text": f"{kw}syn {kw}syn{i} handbook chapter {i}",
                         "meta": {"package": f"rel-{kw}"}})
        for i in (1, 2, 3, 4):
            recs.append({"id": f"{kw}-j{i}", "text": f"{kw} {kw}junk{i}", "meta": {"package": "junk"}})
    return recs


def _round1(good: bool) -> list[dict]:
    recs = []
    for kw in KEYWORDS:
        sid = f"kw-{kw}"
        words = [f"{kw}syn", f"{kw}syn1 {kw}syn handbook", f"{kw}syn2 chapter {kw}syn3"] if good else \
            [f"{kw}junk1", f"{kw}junk2 {kw}", f"{kw}junk3 {kw}junk4"]
        recs.append({"id": sid, "text": kw, "kind": "seed", "round": 0, "seed_id": sid})
        for kind, text in zip(("question", "answer", "thought"), words, strict=True):
            recs.append({"id": f"{sid}-{kind}", "text": f"What is {text}?" if kind == "question" else text,
                         "kind": kind, "round": 1, "seed_id": sid})
    return recs


def _sweep(tmp_path: Path, good: bool) -> tuple[list[tuple[str, str]], dict]:
    """The sweep's path by hand: arms, one retrieve per member, recall at budget 3, the claims file's verdict."""
    corpus = tmp_path / "corpus" / "part-00000.jsonl.gz"
    write_jsonl(corpus, _toy_corpus())
    topics_file = tmp_path / "topics.yaml"
    topics_file.write_text(json.dumps({"topics": [{"keyword": kw, "relevant": [{"meta.package": f"rel-{kw}"}]}
                                                  for kw in KEYWORDS]}))
    topics = load_topics(topics_file)
    assert [r["id"] for r in seed_records(topics)] == [f"kw-{kw}" for kw in KEYWORDS]
    write_jsonl(tmp_path / "round1.jsonl", _round1(good))
    index = tmp_path / "index"
    assert run_main(["retrieve", "--queries", tmp_path / "round1.jsonl", "--corpus", corpus.parent, "--index", index,
                     "--out", tmp_path / "index_build", "-q"]) == 0
    qdir = tmp_path / "queries"
    arms = write_arms(topics, _round1(good), index, qdir)
    members = tmp_path / "repro" / "v2" / "expansion"
    args = []
    for m in METHODS:
        for t in topics:
            name = member_name(m, t.slug)
            assert run_main(["retrieve", "--queries", qdir / f"{name}.jsonl", "--corpus", corpus.parent,
                             "--index", index, "--out", members / name, "retrieve.top_k=3", "-q"]) == 0
            args += ["--retrieved", str(members / name), "--topic", t.keyword]
    assert retrieval_relevance.main(["--corpus", str(corpus.parent), "--topics", str(topics_file),
                                     "--budget", "3", *args]) == 0
    verdicts = report(ROOT / "conf" / "reproduce" / "claims.yaml", tmp_path / "report.md", tmp_path / "repro",
                      header="toy", partial=True)
    recall = {name.name: json.loads((name / "_relevance.json").read_text())["budget"] for name in members.iterdir()}
    return verdicts, {"arms": arms, "recall": recall}


def test_whole_path_at_toy_size(tmp_path):
    verdicts, got = _sweep(tmp_path / "good", good=True)
    arms, recall = got["arms"], got["recall"]
    for kw in KEYWORDS:
        t = arms["topics"][kw]
        assert t["queries"] == {"round0": 1, "round1": 4, "rm3": 4}  # equal numbers of queries: the control
        assert t["round1_kinds"] == ["seed", "question", "answer", "thought"]
        # RM3's feedback is the keyword's top pages: the junk pages (rel-KW's words are in 4 of 32 documents:
        # above Anserini's 10% df, no feedback terms), so block 1 is the junk words, and blocks 2-3 are empty
        assert t["rm3_terms"][0] == [kw] + [f"{kw}junk{i}" for i in (1, 2, 3, 4)]
        assert t["rm3_terms"][1:] == [[kw], [kw]]
        r = {m: recall[member_name(m, kw)] for m in METHODS}
        assert all(v["retrieved"] == 3 and v["filled"] and v["relevant_in_corpus"] == 4 for v in r.values())
        assert r["round0"]["recall"] == 0.0 and r["rm3"]["recall"] == 0.0 and r["round1"]["recall"] == 0.5
    queries = [json.loads(x) for x in (tmp_path / "good" / "queries" / f"{member_name('rm3', 'alpha')}.jsonl")
               .read_text().splitlines()]
    assert [q["id"] for q in queries] == ["kw-alpha", "kw-alpha-rm3-1", "kw-alpha-rm3-2", "kw-alpha-rm3-3"]
    assert math.isclose(sum(queries[1]["terms"].values()), 1.0) and queries[1]["terms"]["alpha"] == 0.5
    assert json.loads((tmp_path / "good" / "queries" / ARMS_FILE).read_text())["rm3"]["fb_docs"] == 10
    assert dict(verdicts)["expansion"] == HOLDS
    md = (tmp_path / "good" / "report.md").read_text()
    assert "| round1 | 4 | 0.5000 ± 0.0000 |" in md and "| rm3 | 4 | 0.0000 ± 0.0000 |" in md
    # round-1 queries that drifted to the junk pages find nothing either: the claim does not hold
    verdicts, got = _sweep(tmp_path / "bad", good=False)
    assert all(got["recall"][member_name("round1", kw)]["recall"] == 0.0 for kw in KEYWORDS)
    assert dict(verdicts)["expansion"] != HOLDS
