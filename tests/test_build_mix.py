"""build-mix: domain filters, stages, caps, curriculum, token files and the plan, on real text."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from mixdata import build_stream, make_tokenizer

from cptkit.core.errors import CptkitError
from cptkit.mixtures.recipe import allocate, curriculum_order, matches, plan_counts, stage_fractions


def test_filters_and_allocation():
    rec = {"id": "a", "text": "x", "lang": "zh", "source": "fortunes-zh", "meta": {"topic": "Law", "q": 0.9}}
    assert matches(rec, {"lang": "zh", "source": ["fortunes-zh", "manpages-zh"]})
    assert matches(rec, {"topic": "Law", "meta.q": {"min": 0.8}})  # plain keys also look in meta
    assert not matches(rec, {"meta.q": {"min": 0.95}})
    assert not matches(rec, {"lang": "zh"}, exclude={"source": "fortunes-zh"})
    assert matches(rec, {"discipline": {"exists": False}}) and not matches(rec, {"discipline": {"exists": True}})
    assert allocate(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert allocate(100, {"zh": 1, "en": 7, "syn": 2}) == {"zh": 10, "en": 70, "syn": 20}
    assert stage_fractions([{"name": "main"}, {"name": "tail", "fraction": 0.2}]) == pytest.approx([0.8, 0.2])
    assert stage_fractions([{"name": "main"}, {"name": "tail", "fraction": 0.0}]) == [1.0, 0.0]  # no tail: left out
    with pytest.raises(CptkitError, match=r"in \[0, 1\]"):
        stage_fractions([{"name": "main"}, {"name": "tail", "fraction": -0.1}])
    with pytest.raises(CptkitError, match="sum to 1.5"):
        stage_fractions([{"fraction": 0.5}, {"fraction": 1.0}])


def test_epoch_cap_moves_excess_to_fill():
    # 'small' has 10 sequences and is asked for 50 (5 epochs) with a cap of 2 epochs: 20 stay,
    # 30 go to the fill domain 'web' in the same stage.
    counts, capped = plan_counts([100], [{"small": 0.5, "web": 0.5}], {"small": 10, "web": 1000}, 2.0, ["web"])
    assert counts == [{"small": 20, "web": 80}] and capped == {"small": True}
    # two stages: the cap is spread over the stages in proportion to their demand
    counts, _ = plan_counts([60, 40], [{"small": 0.5, "web": 0.5}, {"small": 1.0}], {"small": 10, "web": 1000},
                            2.0, ["web"])
    assert counts[0]["small"] + counts[1]["small"] == 20
    assert counts[1]["web"] == 40 - counts[1]["small"]
    with pytest.raises(CptkitError, match="small.*mix.max_epochs"):
        plan_counts([100], [{"small": 0.5, "web": 0.5}], {"small": 10, "web": 1000}, 2.0, [])


def test_curriculum_order_groups():
    ppl = np.array([5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0, 10.0])
    order, starts = curriculum_order(ppl, "low_to_high", 5, seed=0)
    assert starts == [0, 2, 4, 6, 8]
    groups = [sorted(ppl[order[s:s + 2]].tolist()) for s in starts]
    assert groups == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    order, _ = curriculum_order(ppl, "high_to_low", 5, seed=0)
    assert sorted(ppl[order[:2]].tolist()) == [9, 10]


@pytest.fixture(scope="module")
def tok(corpus_records, tmp_path_factory):
    return make_tokenizer(corpus_records, tmp_path_factory.mktemp("tok"))


def test_demo_stream_tokens_plan_and_determinism(corpus_dir, corpus_records, tok, tmp_path):
    from transformers import AutoTokenizer

    ov = ["mix=demo", "mix.budget_tokens=60000", "mix.seq_len=128", "mix.eval_docs=4", "seed=3"]
    res = build_stream(corpus_dir, tok, tmp_path / "s1", ov)
    s = res["stream"]
    assert s["dtype"] == "uint16" and s["seq_len"] == 128
    names = [d["name"] for d in s["domains"]]
    t = AutoTokenizer.from_pretrained(str(tok))
    by_domain: dict[str, list[dict]] = {}
    for r in corpus_records:
        by_domain.setdefault(f"{r['lang']}/{r['source']}", []).append(r)
    assert set(names) == set(by_domain) >= {"en/python-docs", "en/maxima-docs", "en/gcide", "zh/manpages-zh",
                                            "zh/debian-reference-zh", "zh/fortunes-zh"}
    evals = [json.loads(x) for x in gzip.open(tmp_path / "s1" / "_eval.jsonl.gz", "rt")]
    for d in s["domains"]:
        toks = np.fromfile(tmp_path / "s1" / d["file"], dtype=np.uint16)
        offs = np.load(tmp_path / "s1" / d["docs_file"])
        held = {e["id"] for e in evals if e["domain"] == d["name"]}
        n = len(by_domain[d["name"]])
        assert len(held) == min(4, n) == d["eval_docs"]
        # a domain with no more than eval_docs documents trains on its eval documents too
        recs = [r for r in by_domain[d["name"]] if r["id"] not in held or n <= 4]
        # every training document is there once, tokenized, followed by EOS
        assert d["docs"] == len(recs) == len(offs) - 1
        assert int((toks == s["eos_token_id"]).sum()) == d["docs"]
        assert len(toks) == d["tokens"] == sum(len(t.encode(r["text"], add_special_tokens=False)) + 1 for r in recs)
        first = toks[offs[0]:offs[1] - 1].tolist()
        assert t.decode(first) in {r["text"] for r in recs}
        assert d["sequences"] == d["tokens"] // 128
        if d["sequences"] == 0:
            assert d["name"] not in s["stages"][0]["sequences"]
    # the plan: 60000 // 128 = 468 sequences; ZH:EN = 1:4, split by source in proportion to tokens
    plan = np.load(tmp_path / "s1" / "plan.npy")
    assert len(plan) == 468 == s["total_sequences"]
    zh = sum(int((plan[:, 0] == i).sum()) for i, n in enumerate(names) if n.startswith("zh/"))
    assert abs(zh - 468 * 0.2) < 1  # largest-remainder rounding per leaf domain
    st = s["stages"][0]
    for i, n in enumerate(names):
        assert int((plan[:, 0] == i).sum()) == st["sequences"].get(n, 0)
        assert plan[plan[:, 0] == i, 1].max() < s["domains"][i]["sequences"]
    manifest = json.loads((tmp_path / "s1" / "_manifest.json").read_text())
    assert manifest["stream"]["stages"][0]["tokens"] == st["tokens"]
    # deterministic: a second build is byte-identical, in batches of 3 documents too (one batch is
    # tokenized in a thread while the next is read: they are filed in reading order)
    build_stream(corpus_dir, tok, tmp_path / "s2", [*ov, "build_mix.batch_docs=3"])
    for f in ["plan.npy", "_eval.jsonl.gz"] + [d["file"] for d in s["domains"]] + [d["docs_file"] for d in s["domains"]]:
        assert (tmp_path / "s1" / f).read_bytes() == (tmp_path / "s2" / f).read_bytes()
    # another seed shuffles differently
    build_stream(corpus_dir, tok, tmp_path / "s3", [*ov[:-1], "seed=4"])
    assert (tmp_path / "s1" / "plan.npy").read_bytes() != (tmp_path / "s3" / "plan.npy").read_bytes()


def test_upsampling_tail_and_caps(corpus_dir, tok, tmp_path):
    ov = ["mix=upsample_tail", "mix.tail_fraction=0.2", "mix.budget_tokens=1e6", "mix.seq_len=128"]
    s = build_stream(corpus_dir, tok, tmp_path / "up", [*ov, "mix.max_epochs=4"])["stream"]
    main, tail = s["stages"]
    n = s["total_sequences"]
    assert tail["end"] == n and tail["end"] - tail["start"] == round(n * 0.2)
    assert "web" in main["sequences"] and "web" not in tail["sequences"]
    plan = np.load(tmp_path / "up" / "plan.npy")
    web = [d["name"] for d in s["domains"]].index("web")
    assert not (plan[tail["start"]:, 0] == web).any()
    assert tail["sequences"]["code"] == round((n - tail["start"]) * 0.35)
    # the base mix asks code for 1 epoch (Table 2's epochs) before the tail, and the tail for 35% more; a
    # cap of 0.7 epochs holds it at 0.7 and moves the excess to the fill domain, which may pass its data
    # more often as long as the stream as a whole stays within 0.7 passes (5e5 of the input's 717k tokens)
    s = build_stream(corpus_dir, tok, tmp_path / "cap", [*ov[:2], "mix.budget_tokens=5e5", ov[3],
                                                         "mix.max_epochs=0.7"])["stream"]
    dom = {d["name"]: d for d in s["domains"]}
    for d in s["domains"]:
        if d["name"] != "web":
            assert d["epochs"] <= 0.7 + 1e-9
    assert dom["code"]["capped"] and not dom["web"]["capped"] and dom["web"]["epochs"] > 0.7
    assert dom["code"]["planned_tokens"] == int(0.7 * dom["code"]["sequences"]) * 128
    # 1e6 tokens at no more than 0.3 passes over the input (717k tokens) cannot be: refused with the numbers
    with pytest.raises(CptkitError, match=r"budget_tokens=1,000,000 cannot be reached.*max_epochs=0\.3 passes"):
        build_stream(corpus_dir, tok, tmp_path / "over", [*ov, "mix.max_epochs=0.3"])
    assert not (tmp_path / "over").exists()


def test_ppl_curriculum(corpus_dir, tok, tmp_path):
    from transformers import AutoTokenizer

    from cptkit.models.tiny import tiny_llama

    model_dir = tmp_path / "scorer"
    tiny_llama(AutoTokenizer.from_pretrained(str(tok)), hidden=32, layers=1, heads=2, seed=1).save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(str(tok)).save_pretrained(model_dir)
    ov = ["mix=demo", "mix.budget_tokens=20000", "mix.seq_len=128", "mix.curriculum.order=low_to_high",
          f"mix.curriculum.model='{model_dir}'", "mix.curriculum.domains=[zh]", "mix.curriculum.max_tokens=64"]
    s = build_stream(corpus_dir, tok, tmp_path / "cur", ov)["stream"]
    for d in s["domains"]:
        c = d["curriculum"]
        if d["parent"] == "zh":
            assert c["order"] == "low_to_high" and len(c["group_starts"]) == 10
            assert c["group_ppl"] == sorted(c["group_ppl"]) and c["group_ppl"][0] < c["group_ppl"][-1]
        else:
            assert c["order"] == "random" and c["group_starts"] == []


def test_bad_recipe_is_one_line_error(corpus_dir, tok, tmp_path):
    out = tmp_path / "bad"
    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "build-mix", "--in", str(corpus_dir), "--out", str(out),
                        f"tokenizer={tok}", "mix=demo", "mix.stages=[{name:main,weights:{zh:1,nope:2}}]"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "unknown domain 'nope'" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_split_by_values_that_sanitise_alike_stay_apart(corpus_records, tok, tmp_path):
    """``split_by`` values "a b", "a_b" and "a/b" would share one file name once sanitised: each
    leaf domain still gets exactly its own documents' tokens."""
    from conftest import write_jsonl
    from transformers import AutoTokenizer

    groups = ["a b", "a_b", "a/b"]
    recs = [{**r, "grp": groups[i % 3]} for i, r in enumerate(corpus_records[:90])]
    write_jsonl(tmp_path / "in" / "part.jsonl", recs)
    res = build_stream(tmp_path / "in", tok, tmp_path / "out", [
        "mix.domains=[{name:g,split_by:grp}]", "mix.stages=[{name:s,weights:{g:1}}]", "mix.fill=null",
        "mix.eval_docs=0", "mix.curriculum.order=none", "mix.budget_tokens=20000", "mix.seq_len=64"])
    doms = {d["name"]: d for d in res["stream"]["domains"]}
    assert sorted(doms) == sorted(f"g/{g}" for g in groups)
    t = AutoTokenizer.from_pretrained(str(tok))
    for g in groups:
        d = doms[f"g/{g}"]
        want = [tid for r in recs if r["grp"] == g
                for tid in t(r["text"], add_special_tokens=False)["input_ids"] + [t.eos_token_id]]
        got = np.fromfile(tmp_path / "out" / d["file"], dtype=res["stream"]["dtype"]).tolist()
        assert d["docs"] == 30 and got == want


def test_sample_per_domain_by_hand():
    from cptkit.mixtures.stream import sample_per_domain
    from cptkit.text.hashing import fast_seeded_hash

    recs = [("a" if i % 3 else "b", {"id": f"r{i}", "text": "x"}) for i in range(30)]
    got = list(sample_per_domain(recs, 4, seed=7))
    for dom in ("a", "b"):
        ids = [r["id"] for r in (rec for _, rec in recs) if (("a" if int(r["id"][1:]) % 3 else "b") == dom)]
        want = set(sorted(ids, key=lambda x: fast_seeded_hash(7, x))[:4])
        assert {r["id"] for d, r in got if d == dom} == want
    positions = [int(r["id"][1:]) for _, r in got]
    assert positions == sorted(positions)  # reading order kept
    assert list(sample_per_domain(recs, 100, seed=7)) == recs  # a cap above the size keeps everything


def test_max_docs_samples_each_domain_and_keeps_the_held_out_set(corpus_dir, corpus_records, tok, tmp_path):
    ov = ["mix=demo", "mix.budget_tokens=20000", "mix.seq_len=128", "mix.eval_docs=4", "seed=3"]
    full = build_stream(corpus_dir, tok, tmp_path / "full", ov)["stream"]
    capped = build_stream(corpus_dir, tok, tmp_path / "cap", [*ov, "mix.max_docs=10"])["stream"]
    sizes = {d["name"]: d["docs"] + d["eval_docs"] for d in full["domains"]}
    for d in capped["domains"]:
        assert d["docs"] + d["eval_docs"] == min(10, sizes[d["name"]])
    evals = [gzip.open(tmp_path / s / "_eval.jsonl.gz", "rt").read() for s in ("full", "cap")]
    assert evals[0] == evals[1]  # the held-out documents are the same with the cap
    with pytest.raises(CptkitError, match="max_docs=3: must exceed eval_docs=4"):
        build_stream(corpus_dir, tok, tmp_path / "bad", [*ov, "mix.max_docs=3"])


def test_batches_close_at_a_count_or_at_a_character_budget():
    from cptkit.mixtures.stream import _batches

    routed = [("d", {"id": str(i), "text": "x" * n}) for i, n in enumerate([5, 5, 5, 20, 1, 1, 1])]
    sizes = [[len(r["text"]) for _, r in b] for b in _batches(routed, 3, max_chars=12)]
    assert sizes == [[5, 5, 5], [20], [1, 1, 1]]  # 3 records; 20 characters alone; the rest
    assert [len(b) for b in _batches(routed, 10, max_chars=1000)] == [7] and list(_batches([], 3)) == []
