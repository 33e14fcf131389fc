"""Recipes as the papers ran them: stage following in train, controllers within a stage, the
synE_cpt one-run recipe, epochs-based base mixes, the sweeps' numbers (issue 11)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import read_jsonl_dir, write_jsonl
from mixdata import build_stream, make_tokenizer
from outputs import read_jsonl, read_manifest

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.mixtures.stages import RunStage, StageMixture, run_stages, segments

COMMON = ["model.hidden=32", "model.layers=2", "model.heads=2", "train.micro_batch=8", "train.threads=1",
          "quiet=true"]
TAIL_DOMAINS = ("mix.domains=[{name:web,filter:{source:gcide}},{name:domain,filter:{source:[python-docs,"
                "maxima-docs]}},{name:zh,filter:{lang:zh}}]")


def train(stream: Path, out: Path, *overrides: str) -> dict:
    from cptkit.steps.train import run

    return run(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", *COMMON, *overrides]))


def sequence_stages(metrics: list[dict]) -> list[tuple[int, int, str, dict[str, int]]]:
    """(first sequence, end, stage, domain counts) of every logged draw segment, in run order."""
    out, pos = [], 0
    for m in metrics:
        for seg in m["draws"]:
            n = sum(seg["counts"].values())
            out.append((pos, pos + n, seg["stage"], seg["counts"]))
            pos += n
    return out


@pytest.fixture(scope="module")
def tok(corpus_records, tmp_path_factory):
    return make_tokenizer(corpus_records, tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def scorer(tok, tmp_path_factory):
    """A tiny random Llama on the test tokenizer: the PPL-curriculum scoring model."""
    from transformers import AutoTokenizer

    from cptkit.models.tiny import tiny_llama

    d = tmp_path_factory.mktemp("scorer")
    t = AutoTokenizer.from_pretrained(str(tok))
    tiny_llama(t, hidden=32, layers=1, heads=2, seed=1).save_pretrained(d)
    t.save_pretrained(d)
    return d


# --- pure stage logic -------------------------------------------------------------------------
def test_run_stages_and_segments_hand_numbers():
    meta = [{"name": "main", "start": 0, "end": 140, "weights": {"web": 0.6, "domain": 0.2, "zh": 0.2}},
            {"name": "tail", "start": 140, "end": 200, "weights": {"domain": 0.5, "zh": 0.5}}]
    doms = ["web", "domain", "zh"]
    st = run_stages(meta, doms, 200, 200)  # the stream's own length: the plan's boundary, 140
    assert [(s.name, s.start, s.end) for s in st] == [("main", 0, 140), ("tail", 140, 200)]
    assert st[1].weights == {"web": 0.0, "domain": 0.5, "zh": 0.5} and st[1].domains == ["domain", "zh"]
    # a run of 100 sequences keeps the shares: the tail is its last 30 (round(140/200·100) = 70)
    assert [(s.start, s.end) for s in run_stages(meta, doms, 200, 100)] == [(0, 70), (70, 100)]
    # a batch of 8 from sequence 136 straddles the boundary: 4 from main, 4 from the tail
    assert segments(st, 136, 8) == [(0, 4), (1, 4)]
    assert segments(st, 0, 8) == [(0, 8)] and segments(st, 196, 8) == [(1, 8)]  # past the end: last stage
    with pytest.raises(CptkitError, match="unknown domain 'code'"):
        run_stages([{"name": "x", "end": 10, "weights": {"code": 1.0}}], doms, 10, 10)


def test_dynamic_controllers_act_within_the_stage_domain_set():
    from cptkit.mixtures.controller import DBL, TopicPPL, Velocitune

    doms = ["web", "domain", "zh"]
    main = RunStage("main", 0, 100, {"web": 0.6, "domain": 0.2, "zh": 0.2})
    tail = RunStage("tail", 100, 140, {"web": 0.0, "domain": 0.5, "zh": 0.5})
    # DBL in the tail: Δ = (·, 1, 0) over {domain, zh} only; softmax(log .5 + Δ) = (e, 1)/(e + 1), then
    # smoothing c/n with n = 2 stage domains; web stays exactly 0
    dbl = DBL(doms, main.weights, {"web": 1.0, "domain": 2.0, "zh": 2.0}, 1, 1.0, 0.1, True)
    mix = StageMixture([main, tail], dbl)
    assert list(mix.segments(96, 8)) == [(main, 4, main.weights, False), (tail, 4, tail.weights, True)]
    assert dbl.active == ["domain", "zh"]
    mix.update(1, 0, {"web": 9.0, "domain": 3.0, "zh": 1.5})
    a = math.e / (math.e + 1)
    assert dbl.weights == pytest.approx({"web": 0.0, "domain": 0.9 * a + 0.05, "zh": 0.9 * (1 - a) + 0.05})
    # Velocitune: ℓ_init once before step 0 on the full held-out set (init_eval_docs=0: all), then the
    # subset; in the tail it restarts uniform over the tail's domains
    vt = Velocitune(doms, {d: 1 / 3 for d in doms}, {"web": 2.0, "domain": 2.0, "zh": 2.0}, 10,
                    init_eval_docs=0, eval_docs=2)
    mix = StageMixture([main, tail], vt, controller_stages=["tail"],
                       init_weights=lambda st: {d: (1.0 if d in st.domains else 0.0) for d in doms})
    assert mix.wants_eval(0, 0) and mix.eval_docs(0, 8) == 0  # ℓ_init although main is static
    mix.update(0, 0, {"web": 4.0, "domain": 4.0, "zh": 3.0})
    assert mix.eval_docs(10, 8) == 2 and not mix.wants_eval(10, 0)  # main: no updates
    assert mix.weights == main.weights
    list(mix.segments(100, 4))
    assert mix.weights == {"web": 0.0, "domain": 0.5, "zh": 0.5} and mix.wants_eval(10, 0)
    # V_domain = (3 − 2)/(4 − 2) = 0.5, V_zh = (2.5 − 2)/(3 − 2) = 0.5 → unchanged; then domain slower
    mix.update(20, 0, {"web": 9.0, "domain": 3.5, "zh": 2.5})
    z = math.exp(0.75) + math.exp(0.5)
    assert vt.weights == pytest.approx({"web": 0.0, "domain": math.exp(0.75) / z, "zh": math.exp(0.5) / z})
    # a stage that starts exactly at a step is entered before that step's evaluation
    tp = TopicPPL(doms, {d: 1 / 3 for d in doms}, {"web": "en", "domain": "en", "zh": "zh"}, round_tokens=10,
                  alpha=0.4)
    mix = StageMixture([main, tail], tp, controller_stages=["tail"])
    assert mix.begin_step(96) is None and not mix.wants_eval(12, 0)  # main: static, no rounds
    assert mix.begin_step(100) == "tail" and mix.wants_eval(13, 0) and tp.active == ["domain", "zh"]
    assert mix.begin_step(104) is None
    # topic_ppl: a parent's mass is kept, the update only among the stage's domains
    tp = TopicPPL(["en/a", "en/b", "zh/c"], {"en/a": 0.4, "en/b": 0.4, "zh/c": 0.2},
                  {"en/a": "en", "en/b": "en", "zh/c": "zh"}, round_tokens=10, alpha=0.4)
    tp.enter_stage(["en/a", "en/b"], {"en/a": 0.5, "en/b": 0.5, "zh/c": 0.2})
    assert tp.weights == {"en/a": 0.5, "en/b": 0.5, "zh/c": 0.0}
    tp.update(0, 0, {"en/a": math.log(10), "en/b": math.log(20), "zh/c": math.log(5)})
    tp.update(1, 10, {"en/a": math.log(12), "en/b": math.log(18), "zh/c": math.log(50)})
    assert tp.weights == pytest.approx({"en/a": 0.7, "en/b": 0.3, "zh/c": 0.0})  # f = (1.4, 0.6)


# --- train follows the stream ------------------------------------------------------------------
def test_upsampling_tail_is_followed_by_default(corpus_dir, tok, tmp_path):
    # 200 sequences: main 140 (web 0.6, domain 0.2, zh 0.2), then the tail's 60 (no web)
    s = build_stream(corpus_dir, tok, tmp_path / "stream", [
        TAIL_DOMAINS, "mix.fill=null", "mix.budget_tokens=12800", "mix.seq_len=64", "mix.eval_docs=2",
        "mix.stages=[{name:main,weights:{web:0.6,domain:0.2,zh:0.2}},"
        "{name:tail,fraction:0.3,weights:{domain:0.5,zh:0.5}}]"])["stream"]
    assert [(x["name"], x["start"], x["end"]) for x in s["stages"]] == [("main", 0, 140), ("tail", 140, 200)]
    out = tmp_path / "run"
    train(tmp_path / "stream", out, "train.lr=1e-3", "train.warmup=2")  # default settings: 25 steps of 8
    m = read_jsonl(out / "metrics.jsonl")
    assert len(m) == 25
    segs = sequence_stages(m)
    assert segs[-1][1] == 200
    tail = [x for x in segs if x[0] >= 140]
    # the last 30% of the sequences (140..199) are the tail's, drawn from its mixture only
    assert tail and sum(x[1] - x[0] for x in tail) == 60
    assert all(x[2] == "tail" and set(x[3]) <= {"domain", "zh"} for x in tail)
    assert all(x[2] == "main" for x in segs if x[1] <= 140)
    assert sum(x[3].get("web", 0) for x in segs if x[2] == "main") > 40  # web is 60% of the main stage
    # step 18 (sequences 136..143) straddles the boundary: 4 + 4
    assert [(x["stage"], sum(x["counts"].values())) for x in m[17]["draws"]] == [("main", 4), ("tail", 4)]
    assert m[-1]["weights"] == {"web": 0.0, "domain": 0.5, "zh": 0.5}
    events = [(w["step"], w["stage"]) for w in read_jsonl(out / "weights.jsonl") if w.get("event") == "stage"]
    assert events == [(17, "tail")]


def test_shipped_upsample_tail_recipe_scaled_to_a_short_run(corpus_dir, tok, tmp_path):
    # mix=upsample_tail as shipped (Table 2 epochs, Table 4 tail of 10%) trained for 20 steps of 8: the
    # stages keep their shares of the run, so its last 16 sequences are the tail's, without web
    s = build_stream(corpus_dir, tok, tmp_path / "stream", ["mix=upsample_tail", "mix.budget_tokens=1e6",
                                                             "mix.seq_len=128", "mix.eval_docs=2"])["stream"]
    main, tail = s["stages"]
    assert tail["start"] == s["total_sequences"] - round(0.1 * s["total_sequences"])
    out = tmp_path / "run"
    train(tmp_path / "stream", out, "recipe=upsample_tail", "train.max_steps=20", "train.lr=1e-3", "train.warmup=2")
    # the paper's training setup (Table 1, §2): LionW, inverse-sqrt LR with a cooldown over the last 10%
    lrs = [r["lr"] for r in read_jsonl(out / "metrics.jsonl")]
    assert lrs[5] == pytest.approx(1e-3 * math.sqrt(2 / 5)) and lrs[-1] < lrs[17] < lrs[5]
    assert read_manifest(out)["extra"]["optimizer"] == "lion"
    segs = sequence_stages(read_jsonl(out / "metrics.jsonl"))
    boundary = round(tail["start"] / s["total_sequences"] * 160)
    assert boundary == 144 and segs[-1][1] == 160
    assert all(x[2] == "tail" and "web" not in x[3] for x in segs if x[0] >= boundary)
    assert all(x[2] == "main" for x in segs if x[1] <= boundary)
    assert sum(x[3].get("web", 0) for x in segs if x[2] == "main") > 0


def synthetic_qa(corpus_dir: Path, out: Path, n: int = 60) -> Path:
    """QA-shaped records with a `discipline` field (as synthesize-qa writes) from real manual text."""
    docs = [r for r in read_jsonl_dir(corpus_dir) if r["source"] == "python-docs"][:n]
    recs = [{"id": f"qa-{r['id']}", "text": f"[Problem] {r['text'][:300]}\n[Solution] {r['text'][300:900]}",
             "lang": "en", "source": "synthetic", "discipline": "computer_science"} for r in docs]
    write_jsonl(out / "part-00000.jsonl", recs)
    return out


def test_synE_cpt_two_stages_in_one_run(corpus_dir, tok, scorer, tmp_path):
    import numpy as np

    from cptkit.mixtures.stream import Sampler, Stream
    from cptkit.steps.build_mix import run as build_mix

    qa = synthetic_qa(corpus_dir, tmp_path / "qa")
    # mix=synE_cpt as shipped, on the slice: languages split by source (the slice has no topics), the
    # Chinese PPL curriculum scored by a tiny model, 400 sequences: stage 2 is the last 7.5% (30)
    s = build_mix(compose_step("build-mix", [
        f"io.inputs=['{corpus_dir}','{qa}']", f"io.output='{tmp_path / 'stream'}'", f"tokenizer='{tok}'",
        "quiet=true", "mix=synE_cpt", "mix.budget_tokens=25600", "mix.seq_len=64", "mix.eval_docs=2",
        f"mix.curriculum.model='{scorer}'", "mix.curriculum.max_tokens=64",
        "mix.domains=[{name:synthetic,filter:{discipline:{exists:true}}},"
        "{name:zh,filter:{lang:zh},split_by:source},{name:en,filter:{lang:en},split_by:source}]"]))["stream"]
    assert [(x["name"], x["start"], x["end"], x["curriculum"]) for x in s["stages"]] == \
        [("stage1", 0, 370, True), ("stage2", 370, 400, False)]
    # §4.1.2: Chinese in 10 PPL groups, low → high; English and synthetic keep a random order
    for d in s["domains"]:
        cur = d["curriculum"]
        assert cur["order"] == ("low_to_high" if d["parent"] == "zh" else "random")
        if d["parent"] == "zh":
            ppl = [g for g in cur["group_ppl"] if g is not None]
            assert len(cur["group_starts"]) == 10 and ppl == sorted(ppl)
    # stage 1 reads each Chinese domain in curriculum order (0, 1, 2, ...); stage 2 samples at random (§4.2)
    plan = np.load(tmp_path / "stream" / "plan.npy")
    zh_idx = [i for i, d in enumerate(s["domains"]) if d["parent"] == "zh"]
    for i in zh_idx:
        first = plan[:370][plan[:370, 0] == i, 1].tolist()
        assert first == list(range(len(first)))
    later = [r[1] for r in plan[370:].tolist() if r[0] in zh_idx]
    assert later and later != list(range(len(later)))
    sp = Sampler(Stream(tmp_path / "stream"), seed=0)
    w = {d["name"]: (1.0 if d["name"] == s["domains"][zh_idx[0]]["name"] else 0.0) for d in s["domains"]}
    assert [k for _, k in sp.draw(5, w)] == [0, 1, 2, 3, 4]
    rand = [k for _, k in sp.draw(20, w, ordered=False)]
    assert rand != list(range(5, 25)) and [k for _, k in sp.draw(2, w)] == [5, 6]  # the order resumes
    out = tmp_path / "run"
    train(tmp_path / "stream", out, "recipe=synE_cpt")  # 50 steps of 8 sequences = 25600 tokens
    m = read_jsonl(out / "metrics.jsonl")
    segs = sequence_stages(m)
    zh = {d["name"] for d in s["domains"] if d["parent"] == "zh"}
    assert all(x[2] == "stage1" and "synthetic" not in x[3] for x in segs if x[1] <= 370)
    st2 = [x for x in segs if x[0] >= 370]
    assert sum(x[1] - x[0] for x in st2) == 30 and all(x[2] == "stage2" for x in st2)
    # stage 2 samples its static 1:7:2 mixture (no topic adjustment there, §4.2)
    w2 = m[-1]["weights"]
    assert w2["synthetic"] == pytest.approx(0.2, abs=1e-6)
    assert sum(v for d, v in w2.items() if d in zh) == pytest.approx(0.1, abs=1e-5)
    # one run: one warmup (10% of 50 steps) and one constant LR across the stage switch
    lrs = [x["lr"] for x in m]
    assert lrs[0] == pytest.approx(1e-7) and lrs[4] < 1e-5 and all(v == pytest.approx(1e-5) for v in lrs[5:])
    # topic-PPL rounds of 0.4 × 25600 tokens = 10240 tokens (20 steps): evaluations at steps 0, 20, 40,
    # all in stage 1, and every update keeps ZH:EN = 1:4 (topics move within their language)
    ups = [w for w in read_jsonl(out / "weights.jsonl") if w.get("event") == "update"]
    assert [u["step"] for u in ups] == [0, 20, 40] and all("ppl" in u for u in ups)
    # each topic's loss comes with its standard error over the held-out docs (2 per domain here)
    assert all(u["eval_loss_se"].keys() == u["eval_loss"].keys() for u in ups)
    assert all(v is None or v >= 0 for u in ups for v in u["eval_loss_se"].values())
    assert any(v and v > 0 for v in ups[0]["eval_loss_se"].values())
    for u in ups:
        assert sum(v for d, v in u["weights"].items() if d in zh) == pytest.approx(0.2, abs=1e-9)
    assert ups[-1]["weights"] != ups[0]["weights"]  # the rule moved the topics
    assert [(w["step"], w["stage"]) for w in read_jsonl(out / "weights.jsonl") if w.get("event") == "stage"] == \
        [(46, "stage2")]


# --- build-mix: base mix from epochs per source -----------------------------------------------
def test_epochs_base_mix_in_build_mix(corpus_dir, tok, tmp_path):
    s = build_stream(corpus_dir, tok, tmp_path / "s", [
        TAIL_DOMAINS, "mix.fill=web", "mix.budget_tokens=64000", "mix.seq_len=64", "mix.eval_docs=2",
        "mix.max_epochs=50",
        "mix.stages=[{name:main,epochs:{domain:0.1,zh:0.05}},{name:tail,fraction:0.1,weights:{domain:1}}]"])["stream"]
    toks = {d["name"]: d["tokens"] for d in s["domains"]}
    w = s["stages"][0]["weights"]
    # w_i = e_i · tokens_i / budget; web fills the rest
    assert w["domain"] == pytest.approx(0.1 * toks["domain"] / 64000, rel=1e-12)
    assert w["zh"] == pytest.approx(0.05 * toks["zh"] / 64000, rel=1e-12)
    assert w["web"] == pytest.approx(1 - w["domain"] - w["zh"], rel=1e-12)
    with pytest.raises(CptkitError, match="stage 'main'.*more than the budget"):
        build_stream(corpus_dir, tok, tmp_path / "s2", [
            TAIL_DOMAINS, "mix.fill=web", "mix.budget_tokens=6400", "mix.seq_len=64",
            "mix.stages=[{name:main,epochs:{domain:1.0}}]"])
    assert not (tmp_path / "s2" / "_stream.json").exists()


# --- the sweeps' numbers ----------------------------------------------------------------------
def test_sweeps_reproduce_the_papers_numbers():
    import yaml

    from cptkit.core.config import CONF_DIR
    from cptkit.core.discovery import step_module

    step_module("build-mix"), step_module("train")  # register the steps' config schemas

    # App. G: synthetic share 0.1..0.4 while ZH:EN stays 1:4
    vals = yaml.safe_load((CONF_DIR / "sweep" / "synthetic_ratio.yaml").read_text())["hydra"]["sweeper"]["params"]
    for v, share in zip(str(vals["mix.stages.0.weights.synthetic"]).split(","), (0.1, 0.2, 0.3, 0.4), strict=True):
        cfg = compose_step("build-mix", ["mix=synE_synthetic", f"mix.stages.0.weights.synthetic={v}",
                                         "+sweep=synthetic_ratio"])
        w = cfg.mix.stages[0].weights
        assert w.synthetic / (w.zh + w.en + w.synthetic) == pytest.approx(share, abs=1e-6)
        assert w.en / w.zh == 4
    # Velocitune §3.1: the static member of the controller sweep is token-proportional
    cfg = compose_step("train", ["train.mixture=static", "+sweep=mixture_controller"])
    assert cfg.train.weights == "tokens"
    # recipe=synE_cpt: topic-PPL rounds of 40B per 100B tokens, only in stage 1
    cfg = compose_step("train", ["recipe=synE_cpt"])
    assert cfg.train.mixture == "topic_ppl" and cfg.train.topic_ppl.round_fraction == 0.4
    assert list(cfg.train.controller_stages) == ["stage1"] and cfg.train.topic_ppl.alpha == 0.4
    mix = compose_step("build-mix", ["mix=synE_cpt", "tokenizer=smollm2"]).mix
    assert [st.name for st in mix.stages] == ["stage1", "stage2"]
    assert mix.curriculum.order == "low_to_high" and list(mix.curriculum.domains) == ["zh"]
    assert mix.curriculum.model == "smollm2"  # the base model scores the PPL


def test_targets_file_is_checked_against_the_run(tmp_path):
    from omegaconf import OmegaConf

    from cptkit.mixtures.velocitune import ProxyRun, load_targets_file

    p = tmp_path / "_velocitune_targets.json"
    p.write_text(json.dumps({"targets": {"en": 3.1, "zh": 3.4}, "budget_tokens": 4096.0, "converged": True,
                             "sigma": 0.01, "change": 0.004}))
    assert load_targets_file(p, 4096, ["en", "zh"], False, False) == {"en": 3.1, "zh": 3.4}
    with pytest.raises(CptkitError, match="extrapolated to 4096.0 tokens but this run trains 8192"):
        load_targets_file(p, 8192, ["en", "zh"], False, False)
    assert load_targets_file(p, 8192, ["en", "zh"], True, False)["en"] == 3.1  # overridden
    with pytest.raises(CptkitError, match="no target for domain 'code'"):
        load_targets_file(p, 4096, ["en", "zh", "code"], False, False)
    p.write_text(json.dumps({"targets": {"en": 3.1}, "budget_tokens": 4096.0, "converged": False, "sigma": 0.01,
                             "change": 0.03}))
    with pytest.raises(CptkitError, match="before the targets moved less than sigma=0.01"):
        load_targets_file(p, 4096, ["en"], False, False)
    assert load_targets_file(p, 4096, ["en"], False, True) == {"en": 3.1}
    # the proxy's plan: 80 real steps, a checkpoint every 5% (4 steps), at most 60% (48 steps)
    vcfg = OmegaConf.create({"proxy_fraction": 0.6, "proxy_every": 0.05, "proxy_min_checkpoints": 4,
                             "sigma": 0.01, "init_eval_docs": 0})
    pr = ProxyRun(vcfg, 80, 512)
    assert (pr.every, pr.max_steps, pr.budget) == (4, 48, 80 * 512)
    assert [s for s in range(1, 49) if pr.is_checkpoint(s)] == list(range(4, 49, 4))
    with pytest.raises(CptkitError, match="only 3 checkpoints"):
        ProxyRun(OmegaConf.merge(vcfg, {"proxy_every": 16}), 80, 512)
