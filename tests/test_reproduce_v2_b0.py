"""The v2 B0 claims at toy size (mk/reproduce_v2_b0.mk, bench/gpu/reproduce.sh), on one tree built once
for the file: the GPU script's whole path in --toy mode; then the corruption claim through make from the
domain split to the aggregator's verdict (two seeds), with a tiny Llama standing in for B0; what the
aggregator and the config hash do with the labels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from _eval_model import make_tiny
from conftest import read_jsonl_dir, write_jsonl

from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import config_hash
from cptkit.eval.reproduce import load_claims, measure, report
from cptkit.eval.stats import NOT_TESTABLE, VERDICTS
from cptkit.training.config import TrainJob

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.executable).parent.parent
TOY_TRAIN = ("train.micro_batch=2 train.lr=1e-4 train.warmup=0 train.threads=1 train.precision=fp32 "
             "train.eval_docs=2 train.eval_max_tokens=32 train.plot=false train.tensorboard=false")


def _marked(d: Path, records: list[dict]) -> None:
    write_jsonl(d / "part-00000.jsonl", records)
    (d / "_SUCCESS").write_text("")


def _b0(tmp_path: Path, xp: Path) -> Path:
    """A tiny Llama where make expects B0 (its b0.json stands for the levelling-off check)."""
    model, _, _ = make_tiny(xp / "b0" / "model")
    (xp / "b0.json").write_text("{}")
    return model


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "CPTKIT_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}


def test_arm_label_keeps_old_identities_and_counts_when_set():
    cfg = {"step": "evaluate", "seed": 1, "eval": {"tasks": []}}
    assert config_hash(cfg) != config_hash({**cfg, "arm": "rp0.2"})  # unset, it is not recorded (test_run_context)
    # one label for every step: train's is JobConfig's (mk/reproduce_v2_small.mk's arms), not a key of its own
    assert "arm" in {f.name for f in fields(TrainJob)} and "arm" not in TrainJob.__annotations__


def test_a_claim_that_needs_a_gpu_is_decided_when_made_on_one(tmp_path):
    for arm, vals in {"a": [1.0, 1.1, 1.2], "b": [2.0, 2.2, 2.1]}.items():
        for s, v in enumerate(vals):
            d = tmp_path / "m" / f"{arm}_s{s}"
            d.mkdir(parents=True)
            (d / "_manifest.json").write_text(json.dumps({"config": {"arm": arm, "seed": s}}))
            (d / "_r.json").write_text(json.dumps({"loss": v}))
            (d / "_SUCCESS").write_text("")
    claims = [{"id": "c", "title": "t", "source": "s", "quote": "q", "command": "c", "members": "m/*", "axis": "arm",
               "seed": "seed", "metrics": {"loss": {"file": "_r.json", "path": ["loss"]}},
               "primary": {"metric": "loss", "a": "a", "b": "b", "expect": -1, "min_effect": 0.5},
               "not_testable": "needs a GPU: too big for 2 cores"}]
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump(claims))
    assert report(tmp_path / "claims.yaml", tmp_path / "r.md") == [("c", NOT_TESTABLE)]
    assert report(tmp_path / "claims.yaml", tmp_path / "r.md", gpu=True) == [("c", "holds")]


# The sizes bench/gpu/reproduce.sh --toy gives make: the corruption sweep below runs on the tree the script
# left with the same ones, so that the script's members are the sweep's (make finds them finished).
TOY_SIZES = [f"TRAIN_ARGS={TOY_TRAIN}", "CPT_STEPS=2", "V2_CORRUPT_STEPS=2", "STEP_TOKENS=128",
             "V2_CORRUPT_MIX=mix=corrupt_v2 mix.seq_len=64", "V2_HELDOUT_DOCS=6", "V2_PAIRS=10", "V2_PAIR_RATIO=1.0",
             "V2_MARGIN_ARGS=--threads 1"]
SEEDS = ["0", "1"]  # the corruption sweep's: two, so that the claim is decided (1 df)


@pytest.fixture(scope="module")
def toy_tree(tmp_path_factory, corpus_records) -> dict:
    """One toy tree for the file's make tests (built once): a tiny Llama where make expects B0, the domain,
    the corpus, CHAMP-style problems and a probe; bench/gpu/reproduce.sh --toy on it (seed 0, one arm per
    claim: its members and report kept as the script left them); then `make reproduce-corruption-v2` on the
    same tree at ratios 0 and 0.7 for seeds 0 and 1 (seed 0's split, pairs and 0.7 member are the script's)."""
    tmp = tmp_path_factory.mktemp("v2b0")
    data = tmp / "data"
    repro, xp = data / "repro_gpu", data / "repro_gpu" / "xp"
    model = _b0(tmp, xp)
    (xp / "probe.jsonl").write_text("".join(json.dumps({"id": f"probe-{i}", "text": t, "domain": "probe"}) + "\n"
                                            for i, t in enumerate(["the license is free", "see the manual page"])))
    en = [r for r in corpus_records if r["lang"] == "en" and r["source"] in ("python-docs", "maxima-docs")]
    zh = [r for r in corpus_records if r["lang"] == "zh"]
    _marked(data / "labelled", [{**r, "topic": "t"} for r in en[:60]])
    _marked(data / "corpus", en[:120] + zh[:20])
    write_jsonl(data / "champ.jsonl", [{"id": f"p{i}", "text": f"Find x if {i}x + 1 = {2 * i + 1}.",
                                         "problem": f"Find x if {i}x + 1 = {2 * i + 1}.",
                                         "solution": f"Subtract 1 and divide by {i}: x = 2."} for i in range(1, 13)])
    given = [f"{VENV}/.installed", f"{data}/labelled/_SUCCESS", f"{data}/corpus/_SUCCESS", f"{xp}/b0.json",
             f"{xp}/probe.jsonl", f"{data}/champ.jsonl"]
    env = {**_env(tmp), "DATA": str(data), "PYTHON": sys.executable,
           "MAKE_ARGS": " ".join(f"-o {p}" for p in given) + f" VENV={VENV} TOKENIZER={model} --no-print-directory"}
    script = subprocess.run(["bash", "bench/gpu/reproduce.sh", "--toy", str(model)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=3600)
    v2 = repro / "v2"
    after_script = {p.parent.relative_to(v2).as_posix() for p in v2.glob("*/*/_SUCCESS") if "_work" not in p.parts[-3]}
    gpu_md = (v2 / "gpu.md").read_text() if (v2 / "gpu.md").exists() else ""
    sweep = None
    if script.returncode == 0:
        args = ["make", "--no-print-directory", "reproduce-corruption-v2", f"VENV={VENV}", *(f"-o{p}" for p in given),
                f"DATA={data}", f"REPRO={repro}", f"XP={xp}", f"TOKENIZER={model}", f"REPRO_V2_SEEDS={','.join(SEEDS)}",
                "V2_RATIOS=0.0 0.7", *TOY_SIZES]
        sweep = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    return {"data": data, "repro": repro, "xp": xp, "script": script, "after_script": after_script, "gpu_md": gpu_md,
            "sweep": sweep}


def _ok(r: subprocess.CompletedProcess | None) -> None:
    assert r is not None and r.returncode == 0, "" if r is None else r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.slow(minutes=3)
def test_corruption_claim_through_make_to_a_verdict(toy_tree, tmp_path):
    _ok(toy_tree["script"])
    _ok(toy_tree["sweep"])
    repro, xp = toy_tree["repro"], toy_tree["xp"]
    work = repro / "v2" / "corruption_work"
    splits = {}
    for s in SEEDS:
        split = json.loads((work / f"split_s{s}" / "_split.json").read_text())
        assert split["heldout"] and split["train"] and not set(split["heldout"]) & set(split["train"])
        splits[s] = split
        pairs = [json.loads(x) for x in (work / f"pairs_s{s}.jsonl").read_text().splitlines()]
        assert len(pairs) == 10 and all(p["clean"] != p["corrupted"] and p["doc"] in split["heldout"] for p in pairs)
        train = {x["id"]: x["text"] for x in map(json.loads, (work / f"split_s{s}" / "train.jsonl").read_text().splitlines())}
        clean = {x["id"]: x["text"] for x in read_jsonl_dir(work / f"text_c0.0_s{s}")}
        bad = {x["id"]: x["text"] for x in read_jsonl_dir(work / f"text_c0.7_s{s}")}
        assert clean == train and bad.keys() == train.keys() and bad != train  # ratio 0: the same text, uncorrupted
        man = json.loads((work / f"text_c0.7_s{s}" / "_manifest.json").read_text())
        assert man["config"]["corrupt"]["seed"] == int(s) and man["config"]["corrupt"]["ratio"] == 0.7
        run = json.loads((work / "runs" / f"c0.7_s{s}" / "_manifest.json").read_text())
        assert run["config"]["model"]["path"] == str(xp / "b0" / "model") and run["config"]["train"]["max_steps"] == 2
    assert splits["0"]["heldout"] != splits["1"]["heldout"]  # a seed redraws the held-out documents
    members = {p.parent.name for p in (repro / "v2" / "corruption").glob("*/_SUCCESS")}
    assert members == {f"c{c}_s{s}" for c in ("0.0", "0.7") for s in SEEDS}  # REPRO_V2_SEEDS as a Hydra list
    # the aggregator reads the members with the claims' axis and seed; its paired differences are the margins'
    claims = {c.id: c for c in load_claims(ROOT / "conf/reproduce/claims.yaml")}
    margin = {(c, s): json.loads((repro / "v2" / "corruption" / f"c{c}_s{s}" / "_margin.json").read_text())["mean_margin"]
              for c in ("0.0", "0.7") for s in SEEDS}
    m = measure(claims["corruption_high"], repro)
    assert m.primary == pytest.approx([margin[("0.0", s)] - margin[("0.7", s)] for s in SEEDS])
    with pytest.raises(CptkitError, match=r"no member with axis value 0.3 \(have \[0.0, 0.7\]\)"):
        measure(claims["corruption_low"], repro)  # ratio 0.3 is not in this toy sweep
    verdicts = dict(report(ROOT / "conf/reproduce/claims.yaml", tmp_path / "v2.md", repro, partial=True))
    assert verdicts["corruption_high"] in VERDICTS and verdicts["corruption_high"] != NOT_TESTABLE  # 2 seeds: decided
    text = (tmp_path / "v2.md").read_text()
    assert "| margin(0.0) − margin(0.7) | primary | > 0.05 |" in text and "paired t, 1 df" in text
    assert verdicts["corruption_low"] == verdicts["replay"] == "not run yet"
    assert verdicts["synthetic_share"] == NOT_TESTABLE  # its toy member is there; it still needs a GPU


@pytest.mark.slow(minutes=3)
def test_gpu_script_toy_mode_runs_every_claim_path(toy_tree):
    _ok(toy_tree["script"])
    v2 = toy_tree["repro"] / "v2"
    # one arm per claim
    assert toy_tree["after_script"] == {"corruption/c0.7_s0", "replay/rp0.2_s0", "synthetic_share/syn0.2_s0"}
    pairs = [json.loads(x) for x in (v2 / "corruption_work" / "pairs_s0.jsonl").read_text().splitlines()]
    assert len(pairs) == 10 and all(p["clean"] != p["corrupted"] for p in pairs)
    res = json.loads((v2 / "synthetic_share" / "syn0.2_s0" / "_results.json").read_text())
    assert {"answers", "probe"} <= set(res["perplexity"]["groups"])
    rp = json.loads((v2 / "replay" / "rp0.2_s0" / "_results.json").read_text())
    assert set(rp["perplexity"]["groups"]) == {"domain", "probe"}  # eval.ppl.groups: what the claim reads
    man = json.loads((v2 / "replay" / "rp0.2_s0" / "_manifest.json").read_text())
    assert man["config"]["arm"] == "rp0.2" and man["config"]["seed"] == 0
    stream = json.loads((v2 / "replay_work" / "streams" / "rp0.2_s0" / "_manifest.json").read_text())
    assert stream["config"]["mix"]["replay"]["share"] == 0.2
    text = toy_tree["gpu_md"]
    # the aggregator read every member with its claim's axis; one arm per claim decides nothing
    assert f"| synthetic_share | {NOT_TESTABLE} |" in text  # no GPU here: still "needs a GPU"
    for cid in ("corruption_low", "corruption_high", "replay"):
        assert f"| {cid} | not run yet |" in text, text[:2000]
    assert "no member with axis value 0.3 (have [0.7])" in text
    assert "no member with axis value tm0.2 (have ['rp0.2'])" in text


def _replay_plan(tmp_path: Path, extra: list[str]) -> tuple[dict[str, str], list[str]]:
    """`make -n reproduce-replay-v2` for seed 0 with the CPT section's inputs taken as made and old:
    each arm's evaluated model, and the --out of every run make would train."""
    data, xp = tmp_path / "data", tmp_path / "data" / "xp"
    old = [f"{data}/{d}/_SUCCESS" for d in ("labelled", "corpus", "outside")] + [
        f"{xp}/stream_{s}_s0/_SUCCESS" for s in ("r0", "rp", "tm", "gen")] + [f"{xp}/b0.json", f"{xp}/probe.jsonl"]
    r = subprocess.run(["make", "-n", "--no-print-directory", "reproduce-replay-v2", f"VENV={VENV}",
                        f"-o{VENV}/.installed", *(f"-o{p}" for p in old), f"DATA={data}", f"XP={xp}",
                        f"REPRO={tmp_path / 'repro'}", "REPRO_V2_SEEDS=0", *extra],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    models, trained = {}, []
    for line in r.stdout.splitlines():
        words = line.split()
        if "evaluate" in words and "--model" in words:
            arm = next(w for w in words if w.startswith("arm="))[4:]
            models[arm] = str(Path(words[words.index("--model") + 1]).relative_to(tmp_path))
        if "train" in words and "--out" in words:
            trained.append(str(Path(words[words.index("--out") + 1]).relative_to(tmp_path)))
    return models, trained


def test_replay_sweep_evaluates_the_cpt_sections_runs_when_they_are_made(tmp_path):
    """rp0.0, rp0.2, tm0.2 and neutral are the CPT section's noreplay, replay, noreplay_tm and neutral
    runs (same stream, seed, steps): finished, they are evaluated, not trained again; absent, or at
    another REPLAY share (whose arms are other runs), the sweep trains its own."""
    own = {a: f"repro/v2/replay_work/runs/{a}_s0/model" for a in ("rp0.0", "rp0.1", "rp0.2", "rp0.3", "tm0.2", "neutral")}
    models, trained = _replay_plan(tmp_path, [])
    assert models == own and sorted(trained) == sorted(m.removesuffix("/model") for m in own.values())
    for arm in ("noreplay", "replay", "noreplay_tm", "neutral"):
        (tmp_path / "data" / "xp" / "runs" / f"{arm}_s0").mkdir(parents=True)
        (tmp_path / "data" / "xp" / "runs" / f"{arm}_s0" / "_SUCCESS").write_text("")
    models, trained = _replay_plan(tmp_path, [])
    cpt = {"rp0.0": "noreplay", "rp0.2": "replay", "tm0.2": "noreplay_tm", "neutral": "neutral"}
    assert models == {**own, **{a: f"data/xp/runs/{c}_s0/model" for a, c in cpt.items()}}
    assert sorted(trained) == ["repro/v2/replay_work/runs/rp0.1_s0", "repro/v2/replay_work/runs/rp0.3_s0"]
    models, _ = _replay_plan(tmp_path, ["REPLAY=0.3"])  # the CPT replay arm replays 30%: not rp0.2
    assert models["rp0.2"] == own["rp0.2"] and models["rp0.0"] == "data/xp/runs/noreplay_s0/model"
