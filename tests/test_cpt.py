"""Continual pre-training: replay in build-mix, forgetting curves, base → CPT arms → evaluate."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mixdata import build_stream, make_tokenizer

from cptkit.core.errors import CptkitError
from cptkit.mixtures.recipe import apply_replay

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
    # the same records twice (a copy of the corpus: the reader drops a path given twice): with
    # unique_ids every id counts once (the first input wins), and the reader's id check stands aside
    import shutil

    from cptkit.mixtures.stream import Stream

    copy = tmp_path / "copy"
    shutil.copytree(corpus_dir, copy, ignore=shutil.ignore_patterns("_*", ".cptkit"))
    res = build_stream(corpus_dir, tok, tmp_path / "s", [*CPT_DOMAINS, "mix.replay.share=0.25", "mix.unique_ids=true",
                                                           f"io.inputs=['{corpus_dir}','{copy}']",
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


# --- base → CPT arms → evaluate, at toy size ---------------------------------------------------
TOY = ["model.hidden=48", "model.layers=2", "model.heads=2", "train.micro_batch=8", "train.threads=1",
       "train.lr=3e-3", "train.warmup=3", "train.precision=fp32", "quiet=true"]
# domain: Python documentation; general: the other English text (GCIDE entries, Maxima manual)
TOY_MIX = ["mix.domains=[{name:domain,filter:{source:python-docs}},{name:general,filter:{lang:en}}]",
           "mix.stages=[{name:cpt,weights:{domain:1}}]", "mix.fill=null", "mix.replay.domains=[general]",
           "mix.budget_tokens=30720", "mix.seq_len=64", "mix.eval_docs=12"]


def _train(stream, out, *ov):
    from cptkit.core.config import compose_step
    from cptkit.steps.train import run

    return run(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", *TOY, *ov]))


def _ppl(model, stream, out) -> dict[str, float]:
    from cptkit.core.config import compose_step
    from cptkit.steps.evaluate import run

    run(compose_step("evaluate", [f"eval.model='{model}'", f"io.inputs=['{stream}/_eval.jsonl.gz']",
                                  f"io.output='{out}'", "eval.ppl.group_by=domain", "eval.ppl.max_length=64", "eval.ppl.max_tokens=256",
                                  "quiet=true"]))
    groups = json.loads((out / "_results.json").read_text())["perplexity"]["groups"]
    return {g: v["loss"] for g, v in groups.items()}


@pytest.fixture(scope="module")
def cpt_streams(corpus_dir, tok, tmp_path_factory):
    base = tmp_path_factory.mktemp("cpt_streams")
    build_stream(corpus_dir, tok, base / "r0", [*TOY_MIX, "mix.replay.share=0"])
    build_stream(corpus_dir, tok, base / "r25", [*TOY_MIX, "mix.replay.share=0.25"])
    return base / "r0", base / "r25"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_cpt_chain_gains_the_domain_and_replay_limits_forgetting(cpt_streams, tmp_path, seed):
    r0, r25 = cpt_streams
    # 1) base: a tiny Llama learns the general text only (static weights on the replay domain)
    _train(r0, tmp_path / "base", f"seed={seed}", f"model.seed={seed}", "train.max_steps=120",
           "train.weights={general:1}")
    base_model = tmp_path / "base" / "model"
    # 2) CPT from the base: no replay vs 25% replay, both following their stream's plan (60 steps)
    for arm, stream in (("noreplay", r0), ("replay", r25)):
        _train(stream, tmp_path / arm, f"seed={seed}", "model=hf", f"model.path='{base_model}'",
               "train.mixture=staged", "train.eval_every=20", "train.eval_docs=12")
    # 3) evaluate every model on the same held-out documents
    loss = {name: _ppl(m, r0, tmp_path / f"eval_{name}") for name, m in
            (("base", base_model), ("noreplay", tmp_path / "noreplay" / "model"),
             ("replay", tmp_path / "replay" / "model"))}
    gain = {a: loss["base"]["domain"] - loss[a]["domain"] for a in ("noreplay", "replay")}
    forget = {a: loss[a]["general"] - loss["base"]["general"] for a in ("noreplay", "replay")}
    assert gain["noreplay"] > 0.3 and gain["replay"] > 0.3, (loss, seed)  # nats/token: the domain is learnt
    assert forget["noreplay"] > 0.1, (loss, seed)  # the domain shift makes the base forget general text
    assert forget["replay"] < 0.6 * forget["noreplay"], (loss, seed)  # replay keeps most of it
    # the curves in metrics.jsonl start at the base (tokens 0) and end at the evaluated model
    from cptkit.core.records import read_jsonl
    from cptkit.training.metrics import eval_curves

    tokens, curves, _ = eval_curves(read_jsonl(tmp_path / "noreplay" / "metrics.jsonl"))
    assert tokens[0] == 0 and tokens[-1] == 30720 and len(tokens) == 4  # steps 0, 20, 40 and the end (60)
    assert curves["general"][0] == pytest.approx(loss["base"]["general"], abs=0.05)
    assert curves["domain"][-1] == pytest.approx(loss["noreplay"]["domain"], abs=0.05)
    assert curves["general"][-1] > curves["general"][0] and curves["domain"][-1] < curves["domain"][0]
    png = tmp_path / "noreplay" / "curves.png"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_eval_tasks_at_every_eval_point(corpus_dir, corpus_records, tok, tmp_path):
    """train.eval_tasks scores a few-shot task (here a 4-way continuation task from the corpus) at each point."""
    from conftest import write_jsonl

    from cptkit.core.config import compose_step
    from cptkit.core.records import read_jsonl
    from cptkit.steps.train import run
    from cptkit.training.metrics import eval_curves

    docs = [r for r in corpus_records if r["lang"] == "en"][:8]
    items = [{"id": str(i), "q": d["text"][:60], "choices": [x["text"][60:90] for x in docs[i:i + 4]], "label": 0}
             for i, d in enumerate(docs[:4])]
    write_jsonl(tmp_path / "cont" / "test.jsonl", items)
    task = tmp_path / "cont.yaml"
    task.write_text(f"task: cont\noutput_type: multiple_choice\ndata_files:\n  test: '{tmp_path}/cont/test.jsonl'\n"
                    "test_split: test\ndoc_to_text: '{{q}}'\ndoc_to_choice: choices\ndoc_to_target: label\n")
    build_stream(corpus_dir, tok, tmp_path / "s", [*CPT_DOMAINS, "mix.replay.share=0.5", "mix.budget_tokens=4096",
                                                     "mix.seq_len=64", "mix.eval_docs=2"])
    out = tmp_path / "run"
    run(compose_step("train", [f"io.inputs=['{tmp_path / 's'}']", f"io.output='{out}'", "model.hidden=32",
                               "model.heads=2", "train.micro_batch=4", "train.max_steps=4", "train.eval_every=2",
                               f"train.eval_tasks=['{task}']", "train.eval_tasks_limit=3", "train.threads=1",
                               "train.precision=fp32", "quiet=true"]))
    rows = read_jsonl(out / "metrics.jsonl")
    tokens, losses, scores = eval_curves(rows)
    assert tokens == [0, 512, 1024] and set(losses) == {"domain", "general"}  # before step 1, after 2, after 4
    assert len(scores["cont"]) == 3 and all(s in (0.0, 1 / 3, 2 / 3, 1.0) for s in scores["cont"])
    assert rows[-1]["event"] == "eval" and rows[-1]["step"] == 4
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_extra_adds_forgetting_curves_keyed_by_its_content(corpus_dir, corpus_records, tok, tmp_path):
    """train.eval_extra: a probe file's documents are scored at every eval point as their own group,
    its content keys the run (changed probe, refused rerun), and a probe posing as a stream domain is refused."""
    from conftest import write_jsonl

    from cptkit.core.config import compose_step
    from cptkit.core.records import read_jsonl
    from cptkit.steps.train import run
    from cptkit.training.metrics import eval_curves

    probe = tmp_path / "probe.jsonl"
    texts = [r["text"][:200] for r in corpus_records if r["lang"] == "en"][-3:]
    write_jsonl(probe, [{"id": f"p{i}", "text": t, "domain": "probe"} for i, t in enumerate(texts)])
    build_stream(corpus_dir, tok, tmp_path / "s", [*CPT_DOMAINS, "mix.budget_tokens=4096", "mix.seq_len=64",
                                                     "mix.eval_docs=2"])

    def train(out, extra):
        run(compose_step("train", [f"io.inputs=['{tmp_path / 's'}']", f"io.output='{out}'", "model.hidden=32",
                                   "model.heads=2", "train.micro_batch=4", "train.max_steps=2", "train.eval_every=1",
                                   f"train.eval_extra=['{extra}']", "train.threads=1", "train.precision=fp32",
                                   "quiet=true"]))

    train(tmp_path / "run", probe)
    tokens, losses, _ = eval_curves(read_jsonl(tmp_path / "run" / "metrics.jsonl"))
    assert tokens == [0, 256, 512] and set(losses) == {"domain", "general", "probe"}
    assert all(v > 0 for v in losses["probe"]) and losses["probe"] != losses["general"]
    write_jsonl(probe, [{"id": "p0", "text": texts[0] + " changed", "domain": "probe"}])
    with pytest.raises(CptkitError, match=r"probe.jsonl changed"):  # the same output, another probe: never silently kept
        train(tmp_path / "run", probe)
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, [{"id": "x1", "text": "some text", "domain": "general"}])
    with pytest.raises(CptkitError, match=r"bad.jsonl: record 'x1'.*domain 'general' is one of the stream's"):
        train(tmp_path / "run2", bad)


def test_a_staged_run_shorter_than_its_plan_reports_the_shares_it_read(cpt_streams, tmp_path):
    """2 steps of 8 sequences read the first 16 of the 25% replay stream's 480: the run's manifest
    says what shares those held against its nominal 25%, as plan_read computes them from the plan."""
    from cptkit.mixtures.stages import plan_read, run_stages
    from cptkit.mixtures.stream import Stream

    _, r25 = cpt_streams
    out = _train(r25, tmp_path / "short", "train.mixture=staged", "train.max_steps=2")
    st = Stream(r25)
    doms = list(st.domains)
    want = plan_read(st.plan[:, 0], doms, run_stages(st.meta["stages"], doms, len(st.plan), 16), 16)
    assert want["nominal"]["general"] == pytest.approx(0.25, abs=0.01) and want["planned"] == 480
    w = want["worst"]
    assert want["read"][w] == pytest.approx(float(np.mean(st.plan[:16, 0] == doms.index(w))))  # the first 16 rows
    assert out["extra"]["plan read"] == (f"16 of the stream's 480 planned sequences; largest gap: {w} "
                                f"{want['read'][w]:.0%} read vs {want['nominal'][w]:.0%} nominal")
    manifest = json.loads((tmp_path / "short" / "_manifest.json").read_text())
    assert "plan read" in json.dumps(manifest)
