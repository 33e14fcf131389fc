"""The v2 designs of topic_ppl, velocitune and upsampling (mk/reproduce_v2_small.mk): the pure functions
they rest on, on numbers worked by hand; a WSD branch off a trunk's checkpoint; and one claim through
the whole make path at toy size (tokenizer, base, streams, members, the aggregator's verdict)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cptkit.core.errors import CptkitError
from cptkit.mixtures.rules import plan_average, static_from_average
from cptkit.training.checkpoint import branch, same_stream
from cptkit.training.engine import TorchEngine, param_groups
from cptkit.training.schedule import make_schedule
from cptkit.training.state import EngineKind

ROOT = Path(__file__).resolve().parent.parent


def test_static_from_average_is_the_run_s_averaged_weights_normalised_over_the_same_domains():
    # an avg_weights.json as written, then summing to 0.5 (hand-edited): 0.1/0.5, 0.3/0.5, 0.1/0.5
    got = static_from_average({"b": 0.3, "a": 0.1, "c": 0.1}, ["a", "b", "c"])
    assert list(got) == ["a", "b", "c"] and got == pytest.approx({"a": 0.2, "b": 0.6, "c": 0.2})
    with pytest.raises(ValueError, match="'c': missing from the averaged weights"):
        static_from_average({"a": 0.5, "b": 0.5}, ["a", "b", "c"])
    with pytest.raises(ValueError, match="'d': in the averaged weights but not among"):
        static_from_average({"a": 0.5, "b": 0.5, "d": 0.1}, ["a", "b"])
    with pytest.raises(ValueError, match="negative"):
        static_from_average({"a": 1.2, "b": -0.2}, ["a", "b"])


def test_plan_average_spreads_each_stage_s_tokens_over_the_run():
    main = {"web": 0.85, "domain": 0.05, "code": 0.05, "small_web": 0.05}
    tail = {"domain": 0.35, "code": 0.35, "small_web": 0.3}
    # 0.8·main + 0.2·tail: web 0.68; domain and code 0.04 + 0.07 = 0.11; small web 0.04 + 0.06 = 0.10
    assert plan_average([(320, main), (80, tail)]) == pytest.approx(
        {"web": 0.68, "domain": 0.11, "code": 0.11, "small_web": 0.10})
    # weights are normalised per stage first: {x: 2, y: 2} is {x: 0.5, y: 0.5}; half the run each
    assert plan_average([(50, {"x": 2, "y": 2}), (50, {"x": 1})]) == pytest.approx({"x": 0.75, "y": 0.25})
    with pytest.raises(ValueError, match="no stage has sequences"):
        plan_average([(0, {"x": 1})])


def tiny_engine(seed: int, lr: float = 1e-2, warmup: int = 0, decay: int = 0, steps: int = 10,
                hidden: int = 16) -> TorchEngine:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16))
    model.config.use_cache = False
    schedule = make_schedule(lr, steps, warmup=warmup, decay=decay)
    return TorchEngine(model, param_groups(model, 0.1), schedule=schedule, betas=(0.9, 0.95), eps=1e-8,
                       grad_clip=1.0, precision="fp32", grad_accum=1)


def test_a_branch_starts_from_the_trunk_s_weights_and_adam_state_on_its_own_schedule(tmp_path):
    trunk = tiny_engine(0, warmup=2, steps=10)
    x = torch.randint(0, 50, (2, 8))
    for _ in range(3):
        trunk.backward(trunk(input_ids=x, labels=x).loss)
        trunk.step()
    trunk.save_checkpoint(str(tmp_path / "trunk" / "checkpoints"), "step00000003", {"sampler": {"cursor": [3]}})
    ckpt = tmp_path / "trunk" / "checkpoints" / "step00000003" / "cptkit_state.pt"

    tail = tiny_engine(1, lr=1e-2, decay=4, steps=4)  # another init; decays from the peak at once
    at, saved = branch(tail, EngineKind.TORCH, ckpt)
    assert at == 3 and saved["sampler"] == {"cursor": [3]}
    for (name, a), b in zip(trunk.module.state_dict().items(), tail.module.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    t_state, b_state = trunk.optimizer.state_dict()["state"], tail.optimizer.state_dict()["state"]
    assert t_state.keys() == b_state.keys() and all(
        torch.equal(t_state[k]["exp_avg_sq"], b_state[k]["exp_avg_sq"]) and float(b_state[k]["step"]) == 3
        for k in t_state)
    # the branch's own schedule and hyper-parameters: lr(0) = the peak of a decay over all its steps
    assert tail.get_lr() == [pytest.approx(1e-2)] * 2
    assert [g["weight_decay"] for g in tail.optimizer.param_groups] == [0.1, 0.0]
    tail.backward(tail(input_ids=x, labels=x).loss)
    tail.step()
    assert tail.get_lr() == [pytest.approx(1e-2 * 3 / 4)] * 2

    with pytest.raises(CptkitError, match="does not fit this model"):
        branch(tiny_engine(2, hidden=32), EngineKind.TORCH, ckpt)
    with pytest.raises(CptkitError, match="needs the torch engine"):
        branch(tail, EngineKind.DEEPSPEED, ckpt)


def test_same_stream_reads_the_trunk_s_manifest(tmp_path):
    run = tmp_path / "trunk"
    run.mkdir()
    (tmp_path / "s0").mkdir()
    assert not same_stream(run, tmp_path / "s0")  # no manifest: an unknown stream
    (run / "_manifest.json").write_text(json.dumps({"config": {"io": {"inputs": [str(tmp_path / "s0")]}}}))
    assert same_stream(run, tmp_path / "s0") and not same_stream(run, tmp_path / "s1")


TOY = {  # make variables: every size of the v2 sweeps cut to a toy (a 1-layer model of hidden 32)
    "REPRO_V2_SEEDS": "0,1,2", "REPRO_V2_STEPS": "10", "REPRO_V2_BASE_STEPS": "6", "REPRO_V2_VOCAB": "400",
    "REPRO_V2_EVAL_DOCS": "4", "REPRO_V2_VT_DOCS": "2", "REPRO_V2_THREADS": "1",
    "REPRO_V2_MODEL": "model=tiny_llama model.hidden=32 model.layers=1 model.heads=2 model.tie_embeddings=true",
}


def toy_corpus(corpus_records: list[dict], out: Path, per_source: int = 30) -> None:
    """The first ``per_source`` records of each demo source, 1,500 characters at most (a finished step output)."""
    out.mkdir(parents=True)
    seen: dict[str, int] = {}
    with (out / "part-00000.jsonl").open("w") as f:
        for r in corpus_records:
            if seen.get(r["source"], 0) < per_source:
                seen[r["source"]] = seen.get(r["source"], 0) + 1
                f.write(json.dumps({**r, "text": r["text"][:1500]}, ensure_ascii=False) + "\n")
    (out / "_SUCCESS").write_text("")


@pytest.fixture(scope="module")
def toy_make(tmp_path_factory, corpus_records) -> tuple[Path, list[str], dict[str, str]]:
    """A toy corpus under REPRO, and the make command (toy sizes) and environment that run the v2 targets on it:
    the tests share the tokenizer and the base, whichever test builds them first."""
    tmp = tmp_path_factory.mktemp("v2")
    repro = tmp / "repro"
    toy_corpus(corpus_records, repro / "corpus")
    env = {**os.environ, "CPTKIT_CACHE_DIR": str(tmp / "cache"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    venv = Path(sys.executable).parent.parent  # named: an inherited VENV (MAKEFLAGS) must not be reinstalled
    make = ["make", "--no-print-directory", "-C", str(ROOT), f"VENV={venv}", f"-o{venv}/.installed",
            f"-o{venv}/bin/python", f"BIN={venv}/bin", f"REPRO={repro}", *(f"{k}={v}" for k, v in TOY.items())]
    return repro, make, env


def claim_report(claim_id: str, repro: Path, tmp: Path) -> tuple[str, str]:
    """The pre-registered claim of conf/reproduce/claims.yaml, aggregated over REPRO: its verdict and report."""
    from cptkit.eval.reproduce import report

    claims = [c for c in yaml.safe_load((ROOT / "conf/reproduce/claims.yaml").read_text()) if c["id"] == claim_id]
    (tmp / "claims.yaml").write_text(yaml.safe_dump(claims))
    ((got, verdict),) = report(tmp / "claims.yaml", tmp / "r.md", repro)
    assert got == claim_id
    return verdict, (tmp / "r.md").read_text()


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.slow(minutes=3)
def test_topic_ppl_through_make_to_a_verdict(toy_make, tmp_path):
    """make reproduce-topic_ppl-v2 at toy size: the tokenizer learnt from the corpus, the base from scratch,
    a stream per seed, topic_ppl then static_avg at that run's own averaged weights, then the pre-registered
    claim of conf/reproduce/claims.yaml read by the aggregator to a verdict."""
    from cptkit.eval.reproduce import Claim, collect
    from cptkit.eval.stats import CONTRADICTS, HOLDS, INCONCLUSIVE

    repro, make, env = toy_make
    r = subprocess.run([*make, "reproduce-topic_ppl-v2"], env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    v2 = repro / "v2"
    assert json.loads((v2 / "tokenizer" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert json.loads((v2 / "base" / "model" / "config.json").read_text())["vocab_size"] == 400
    assert json.loads((v2 / "streams" / "topics_s0" / "_stream.json").read_text())["tokenizer"] == str(v2 / "tokenizer")
    for s in range(3):
        # static_avg trained at exactly the controller's time-averaged weights, as its first weights event says
        avg = json.loads((v2 / "topic_ppl" / f"topic_ppl_s{s}" / "avg_weights.json").read_text())["weights"]
        first = lines(v2 / "topic_ppl" / f"static_avg_s{s}" / "weights.jsonl")[0]
        assert first["weights"] == pytest.approx(avg) and len(avg) == 6
        updates = [x for x in lines(v2 / "topic_ppl" / f"topic_ppl_s{s}" / "weights.jsonl") if x["event"] == "update"]
        assert len(updates) == 10  # 10 rounds of 1 step: the first measures, 9 adjust
    # a rerun has nothing to do: every output is keyed and finished
    assert subprocess.run([*make, "-q", "reproduce-topic_ppl-v2"], env=env).returncode == 0

    verdict, text = claim_report("topic_ppl", repro, tmp_path)
    assert verdict in (HOLDS, CONTRADICTS, INCONCLUSIVE)
    assert "| static_avg | 3 |" in text and "| topic_ppl | 3 |" in text and "worst(topic_ppl) − worst(static_avg)" in text
    claim = Claim(**yaml.safe_load((tmp_path / "claims.yaml").read_text())[0])
    worst = max(lines(v2 / "topic_ppl" / "static_avg_s1" / "metrics.jsonl")[-1]["eval_loss"].values())
    assert collect(claim, repro)["static_avg"][1]["worst"] == pytest.approx(worst)


@pytest.mark.slow(minutes=3)
def test_upsampling_branches_through_make_to_a_verdict(toy_make, tmp_path):
    """make reproduce-upsampling-v2 at toy size: a constant-LR trunk per seed, tail0.2 branching off its last
    checkpoint on the same stream (its data order going on), uniform and throughout as whole runs with the same
    LR at every step; the claim's domains (`domain`, `web`) are the stream's; the aggregator's verdict."""
    from cptkit.eval.stats import CONTRADICTS, HOLDS, INCONCLUSIVE
    from cptkit.training.checkpoint import latest_tag, load_torch

    repro, make, env = toy_make
    r = subprocess.run([*make, "reproduce-upsampling-v2"], env=env, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    up = repro / "v2" / "upsampling"
    for s in range(3):
        tail, uniform, whole = (lines(up / f"{a}_s{s}" / "metrics.jsonl") for a in ("tail0.2", "uniform", "throughout"))
        assert json.loads((up / f"tail0.2_s{s}" / "_manifest.json").read_text())["extra"]["branched at step"] == 8
        # the tail's 2 steps run at the LR of a whole run's last 2 (warmup 1, decay over the last 2: 1e-3, 5e-4)
        lrs = [[x["lr"] for x in m if "lr" in x] for m in (tail, uniform, whole)]
        assert lrs[0] == lrs[1][-2:] == lrs[2][-2:] == pytest.approx([1e-3, 5e-4])
        assert [x["weights"] for x in uniform if "weights" in x][0] == pytest.approx(
            {"domain": 0.11, "web": 0.68, "code": 0.11, "small_web": 0.10})  # 0.8 main + 0.2 tail
        assert {"domain", "web"} <= set(tail[-1]["eval_loss"]) and tail[-1]["event"] == "eval"
        # the tail's sequences follow the trunk's in each domain's order: its cursor = the trunk's + its draws
        trunk_dir, tail_dir = repro / "v2" / "upsampling_trunk" / f"trunk_s{s}" / "checkpoints", up / f"tail0.2_s{s}" / "checkpoints"
        c0, c1 = (load_torch(d, latest_tag(d))["client_state"]["sampler"]["cursor"] for d in (trunk_dir, tail_dir))
        domains = json.loads((repro / "v2" / "streams" / f"du_s{s}" / "_stream.json").read_text())["domains"]
        drawn = {d["name"]: 0 for d in domains}
        for x in tail:
            for seg in x.get("draws", []):
                for d, n in seg["counts"].items():
                    drawn[d] += n
        assert c1 == [c + drawn[d["name"]] for c, d in zip(c0, domains, strict=True)] and sum(drawn.values()) == 8

    verdict, text = claim_report("upsampling", repro, tmp_path)
    assert verdict in (HOLDS, CONTRADICTS, INCONCLUSIVE)
    for arm in ("tail0.2", "uniform", "throughout"):
        assert f"| {arm} | 3 |" in text
    assert "domain(tail0.2) − domain(uniform)" in text and "general(throughout) − general(tail0.2)" in text
