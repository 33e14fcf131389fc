"""Continual pre-training: replay in build-mix, forgetting curves, base → CPT arms → evaluate."""

from __future__ import annotations

import json

import pytest
from mixdata import build_stream, make_tokenizer

from cptkit.errors import CptkitError
from cptkit.steps.build_mix import apply_replay

# the "domain" is Python documentation, "general" everything else of the corpus slice
CPT_DOMAINS = ["mix.domains=[{name:domain,filter:{source:python-docs}},{name:general,filter:{}}]",
               "mix.stages=[{name:cpt,weights:{domain:1}}]", "mix.fill=null", "mix.replay.domains=[general]"]


def test_apply_replay_takes_exactly_the_share():
    # domain and synthetic keep their 1:1 ratio in 1 - 0.2; the unnamed replay domain takes 0.2
    w = apply_replay({"domain": 2.0, "synthetic": 2.0}, ["general"], 0.2, {"general": 100}, "s")
    assert w == pytest.approx({"domain": 0.4, "synthetic": 0.4, "general": 0.2})
    # two replay leaves named by the stage: split 1:3; unnamed: split by tokens 30:10
    w = apply_replay({"d": 1.0, "g/a": 1.0, "g/b": 3.0}, ["g/a", "g/b"], 0.2, {"g/a": 30, "g/b": 10}, "s")
    assert w == pytest.approx({"d": 0.8, "g/a": 0.05, "g/b": 0.15})
    w = apply_replay({"d": 1.0}, ["g/a", "g/b"], 0.2, {"g/a": 30, "g/b": 10}, "s")
    assert w == pytest.approx({"d": 0.8, "g/a": 0.15, "g/b": 0.05})
    # share 0: the no-replay arm, replay domains leave the stage even when it names them
    assert apply_replay({"d": 3.0, "g": 1.0}, ["g"], 0.0, {"g": 5}, "s") == {"d": 1.0}
    with pytest.raises(CptkitError, match=r"replay.share=1.5"):
        apply_replay({"d": 1.0}, ["g"], 1.5, {"g": 5}, "s")
    with pytest.raises(CptkitError, match="only replay domains"):
        apply_replay({"g": 1.0}, ["g"], 0.5, {"g": 5}, "s")


@pytest.fixture(scope="module")
def tok(corpus_records, tmp_path_factory):
    return make_tokenizer(corpus_records, tmp_path_factory.mktemp("cpt") / "tok")


def test_replay_share_in_the_stream_and_manifest(corpus_dir, tok, tmp_path):
    from cptkit.training.data import Stream

    # the same records twice: with unique_ids every id counts once (the first input wins)
    res = build_stream(corpus_dir, tok, tmp_path / "s", [*CPT_DOMAINS, "mix.replay.share=0.25", "mix.unique_ids=true",
                                                           f"io.inputs=['{corpus_dir}','{corpus_dir}']",
                                                           "mix.budget_tokens=64000", "mix.seq_len=64"])
    st = res["stream"]
    n_docs = sum(d["docs"] + d["eval_docs"] for d in st["domains"])
    assert st["repeated_ids_skipped"] == n_docs == 900  # 6 sources × 150 records, each read twice
    assert st["stages"][0]["weights"] == pytest.approx({"domain": 0.75, "general": 0.25})
    rp = st["replay"]
    assert rp["domains"] == ["general"] and rp["share"] == 0.25
    assert rp["tokens"] == st["stages"][0]["tokens"]["general"] == 250 * 64  # 1000 sequences × 0.25
    assert rp["realised_share"] == pytest.approx(0.25)
    general = next(d for d in st["domains"] if d["name"] == "general")
    assert rp["epochs"]["general"] == pytest.approx(250 / general["sequences"], abs=1e-4)
    man = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert man["extra"]["replay tokens"] == 16000 and man["extra"]["replay share"] == 0.25
    plan = Stream(tmp_path / "s").plan
    assert int((plan[:, 0] == 1).sum()) == 250  # domain index 1 = general: 250 of the 1000 sequences
    # share 0: same domains and held-out documents, no general sequence in the plan
    res0 = build_stream(corpus_dir, tok, tmp_path / "s0", [*CPT_DOMAINS, "mix.replay.share=0",
                                                             "mix.budget_tokens=64000", "mix.seq_len=64"])
    assert res0["stream"]["replay"]["tokens"] == 0
    assert Stream(tmp_path / "s0").eval_records() == Stream(tmp_path / "s").eval_records()
    with pytest.raises(CptkitError, match="unknown domain 'webtext'"):
        build_stream(corpus_dir, tok, tmp_path / "bad", [*CPT_DOMAINS, "mix.replay.domains=[webtext]",
                                                          "mix.replay.share=0.2"])
