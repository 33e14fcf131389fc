"""`cptkit plan`: the D-CPT Law fitted to train runs planted from a known law, and its refusals.

Planted runs are real run folders: real build-mix streams at several replay shares (their manifests
give each run's domain share), and a train run's `_manifest.json`, `metrics.jsonl` (written by
`MetricsLog`, as `train` writes it) and `_SUCCESS`, with held-out losses drawn from a known law plus
seeded noise (relative σ = 1e-4)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_main
from mixdata import build_stream, make_tokenizer

from cptkit.core.shards import atomic_write_bytes, atomic_write_json
from cptkit.mixtures.law import Law, LawError, cmr, fit_law

CPT_DOMAINS = ["mix.domains=[{name:domain,filter:{source:python-docs}},{name:general,filter:{}}]",
               "mix.stages=[{name:cpt,weights:{domain:1}}]", "mix.fill=null", "mix.replay.domains=[general]",
               "mix.budget_tokens=8192", "mix.seq_len=64"]
# the planted laws: the domain loss falls with tokens and domain share; the general loss rises with both
DOMAIN = Law(E=2.0, A=0, alpha=0, B=8.0, beta=0.45, eta=0.6, C=0.15, gamma=0.5, eps=0.1)
GENERAL = Law(E=3.5, A=0, alpha=0, B=-2.0, beta=0.3, eta=1.0, C=-0.2, gamma=0.5, eps=0.1)
GENERAL_BASE, DOMAIN_BASE = 3.02, 2.9  # the losses before step 1
REPLAY = [0.0, 0.15, 0.3, 0.5, 0.7, 0.9]  # the grid: domain shares ~1, 0.85, 0.7, 0.5, 0.3, 0.1
STEP_TOKENS, EVERY, POINTS = 256, 8, 8  # eval points at 2048, 4096, ... 16,384 tokens
TARGET = 4 * STEP_TOKENS * EVERY * POINTS
HELD_OUT = 0.6  # a replay share not in the grid: domain share ~0.4
# E, B, β, η are held to 10%; the r-term's C, γ, ε to 25%: its curvature is seen at six shares only and
# its three constants trade off against each other within the noise (measured over seeds 0-3: ≤ 20%)
TIGHT, LOOSE = 0.10, 0.25


@pytest.fixture(scope="module")
def streams(tmp_path_factory, corpus_dir, corpus_records) -> dict[float, Path]:
    base = tmp_path_factory.mktemp("plan-streams")
    tok = make_tokenizer(corpus_records, base / "tok")
    out = {}
    for share in [*REPLAY, HELD_OUT]:
        d = base / f"s{share}"
        build_stream(corpus_dir, tok, d, [*CPT_DOMAINS, f"mix.replay.share={share}"])
        out[share] = d
    return out


def true_ratio(stream: Path) -> float:
    """1 - the realised replay share the stream records in its own _stream.json."""
    meta = json.loads((stream / "_stream.json").read_text())
    return 1.0 - meta["replay"]["realised_share"]


def plant_run(run: Path, stream: Path, seed: int, laws: dict[str, Law], points: int = POINTS,
              bases: dict[str, float] | None = None, every: int = EVERY) -> None:
    """A finished train run on ``stream`` whose eval losses follow ``laws`` (plus seeded noise)."""
    from cptkit.mixtures.stream import Stream
    from cptkit.training.card import stream_record
    from cptkit.training.config import TrainJob
    from cptkit.training.metrics import MetricsLog
    from cptkit.training.monitor import Monitor
    from cptkit.training.state import RunSpec, TrainState

    run.mkdir(parents=True)
    st = Stream(stream)
    conf = TrainJob()
    spec = RunSpec(conf, st, False, False, 0, 1, run, None)
    log = MetricsLog(spec, Monitor(run, conf.train, None, points * every, 0, None), None)
    rng = np.random.default_rng(seed)
    r = true_ratio(stream)
    bases = bases or {"domain": DOMAIN_BASE, "general": GENERAL_BASE}
    for k in range(points + 1):
        step = k * every
        tokens = step * STEP_TOKENS
        if tokens == 0:
            losses = dict(bases)
        else:
            losses = {g: float(law(tokens, r) * np.exp(rng.normal(0, 1e-4))) for g, law in laws.items()}
        state = TrainState(step=step, tokens=tokens)
        if k < points:  # the loop's eval points ride on the step's row; the last is its own line
            log.step(step, {"step": step, "tokens": tokens, "loss": 3.0, "eval_loss": losses, "eval_tokens": tokens})
        else:
            log.eval_point(state, {"eval_loss": losses})
    log.close(TrainState(step=points * every, tokens=points * every * STEP_TOKENS), None)
    atomic_write_json(run / "_manifest.json", {"step": "train", "data": stream_record(stream, st.meta)})
    atomic_write_bytes(run / "_SUCCESS", b"")


@pytest.fixture(scope="module")
def grid(tmp_path_factory, streams) -> Path:
    """Six domain shares x two seeds, eight eval points each. The folders are named against their
    ratios on purpose: the ratio must come from the stream's manifest."""
    runs = tmp_path_factory.mktemp("plan-runs")
    for i, share in enumerate(REPLAY):
        for seed in (0, 1):
            plant_run(runs / f"r{REPLAY[-1 - i]}_s{seed}", streams[share], 10 * i + seed,
                      {"domain": DOMAIN, "general": GENERAL})
    return runs


@pytest.fixture(scope="module")
def planned(grid, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plan-out") / "plan"
    assert run_main(["plan", "--in", f"{grid}/*/", "--out", out, f"plan.target_tokens={TARGET}",
                     "plan.max_forgetting=0.05", "plan.forgetting_measure=general", "plan.bootstrap=40",
                     "-q"]) == 0
    assert (out / "plan.png").stat().st_size > 10_000 and (out / "_SUCCESS").exists()
    assert "Recommended domain share" in (out / "plan.md").read_text()
    return json.loads((out / "plan.json").read_text())


def test_ratio_comes_from_the_stream_manifest(planned, streams):
    want = sorted(round(true_ratio(streams[s]), 6) for s in REPLAY for _ in (0, 1))
    got = sorted(round(r["ratio"], 6) for r in planned["runs"])
    assert got == want
    assert {r["replay_share"] for r in planned["runs"]} == set(REPLAY)


@pytest.mark.parametrize("group,law", [("domain", DOMAIN), ("general", GENERAL)])
def test_fit_recovers_the_planted_constants(planned, group, law):
    fit = planned["fits"][group]
    for k in ("E", "B", "beta", "eta", "C", "gamma", "eps"):
        want, got = getattr(law, k), fit["constants"][k]
        tol = TIGHT if k in ("E", "B", "beta", "eta") else LOOSE
        assert abs(got - want) <= tol * abs(want), (group, k, got, want)
    assert fit["constants"]["A"] == 0  # one model size: the N term is folded into E
    assert fit["rmse"] < 0.002


def test_recommended_ratio_meets_the_constraint_on_the_planted_law(planned):
    r = planned["recommended_ratio"]
    true_cmr = cmr(lambda rr: GENERAL(TARGET, rr), GENERAL_BASE, 0.05)
    assert true_cmr is not None and 0.05 < true_cmr < 0.5
    assert float(GENERAL(TARGET, r)) - GENERAL_BASE <= 0.05 + 0.005  # forgets no more than allowed
    assert abs(r - true_cmr) <= 0.03  # and is not needlessly cautious: the domain loss falls with r
    pred = planned["predicted"]
    assert abs(pred["domain"]["loss"] - float(DOMAIN(TARGET, r))) < 0.01
    lo, hi = pred["general"]["forgetting_interval"]
    assert lo <= pred["general"]["forgetting"] <= hi
    assert planned["cmr"]["curve"][-1]["tokens"] == pytest.approx(TARGET)
    cmrs = [p["cmr"] for p in planned["cmr"]["curve"]]
    assert all(a >= b for a, b in zip(cmrs, cmrs[1:], strict=False))  # more tokens, more forgetting: CMR falls


def test_target_domain_loss_picks_the_least_forgetting_share(grid, tmp_path):
    target = float(DOMAIN(TARGET, 0.5))
    assert run_main(["plan", "--in", f"{grid}/*/", "--out", tmp_path / "p", f"plan.target_tokens={TARGET}",
                     f"plan.target_domain_loss={target}", "plan.bootstrap=0", "-q"]) == 0
    ans = json.loads((tmp_path / "p" / "plan.json").read_text())
    # the planted domain loss falls with r and the general loss rises: the answer is the share reaching it
    assert abs(ans["recommended_ratio"] - 0.5) <= 0.03
    # a domain loss no share reaches: no recommendation, the reason, and still the fits and the CMR curve
    assert run_main(["plan", "--in", f"{grid}/*/", "--out", tmp_path / "none", f"plan.target_tokens={TARGET}",
                     "plan.target_domain_loss=1.0", "plan.bootstrap=0", "-q"]) == 0
    ans = json.loads((tmp_path / "none" / "plan.json").read_text())
    assert ans["recommended_ratio"] is None and ans["predicted"] is None
    assert ans["why"].startswith("no domain share reaches the domain loss 1") and len(ans["cmr"]["curve"]) == 12


def test_several_model_sizes_fit_the_n_term():
    law = Law(E=1.8, A=40.0, alpha=0.3, B=8.0, beta=0.45, eta=0.6, C=0.15, gamma=0.5, eps=0.1)
    D = 2048.0 * np.arange(1, 9)
    rows = [(d, r, n) for n in (1e6, 4e6, 1.6e7) for r in (0.1, 0.3, 0.5, 0.7, 0.9) for d in D]
    Ds, rs, Ns = (np.array(c) for c in zip(*rows, strict=True))
    fit = fit_law(Ds, rs, law(Ds, rs, Ns), Ns)
    assert abs(fit.law.A - 40.0) < 0.4 and abs(fit.law.alpha - 0.3) < 0.003
    one = fit_law(Ds[Ns == 1e6], rs[Ns == 1e6], law(Ds, rs, Ns)[Ns == 1e6], Ns[Ns == 1e6])
    assert one.law.A == 0 and abs(one.law.E - (1.8 + 40.0 / 1e6 ** 0.3)) < 0.02  # folded into E


def test_a_runaway_fit_names_its_constant():
    D = 2048.0 * np.arange(1, 9)
    rows = [(d, r) for r in (0.1, 0.3, 0.5, 0.7, 0.9) for d in D]
    Ds, rs = (np.array(c) for c in zip(*rows, strict=True))
    ys = 2 + 3 * rs * np.exp(-Ds / 3000) + 0.1 * (1 - rs)  # an exponential, not a power law, in D
    with pytest.raises(LawError, match="did not converge: constant E ran to 0"):
        fit_law(Ds, rs, ys)


def one_line_error(capsys, argv) -> str:
    assert run_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_too_few_ratios(grid, tmp_path, capsys):
    msg = one_line_error(capsys, ["plan", "--in", f"{grid}/r0.9_s*/", "--in", f"{grid}/r0.7_s*/",
                                  "--in", f"{grid}/r0.5_s*/", "--out", tmp_path / "p", "plan.target_tokens=1e5"])
    assert "3 distinct domain shares" in msg and "needs ≥ 4" in msg
    assert not (tmp_path / "p").exists()


def test_too_few_eval_points(streams, tmp_path, capsys):
    for i, share in enumerate(REPLAY[:4]):
        plant_run(tmp_path / "runs" / f"x{i}", streams[share], i, {"domain": DOMAIN, "general": GENERAL}, points=3)
    msg = one_line_error(capsys, ["plan", "--in", f"{tmp_path}/runs/*/", "--out", tmp_path / "p",
                                  "plan.target_tokens=1e5"])
    assert "metrics.jsonl: 3 eval points after step 0; the law needs ≥ 4" in msg
    assert not (tmp_path / "p").exists()


def test_a_missing_measure_and_a_fit_that_does_not_converge(streams, tmp_path, capsys):
    msg = one_line_error(capsys, ["plan", "--in", f"{tmp_path}/none*/", "--out", tmp_path / "p",
                                  "plan.target_tokens=1e5"])
    assert "matches no run directory" in msg
    flat = Law(E=2.0, A=0, alpha=0, B=0.0, beta=0.5, eta=1.0, C=0.0, gamma=0.5, eps=0.1)
    for i, share in enumerate(REPLAY):
        plant_run(tmp_path / "runs" / f"x{i}", streams[share], i, {"domain": DOMAIN, "outside": flat},
                  bases={"domain": DOMAIN_BASE, "outside": 2.0})
    msg = one_line_error(capsys, ["plan", "--in", f"{tmp_path}/runs/*/", "--out", tmp_path / "p",
                                  "plan.target_tokens=1e5"])
    assert "no eval loss for 'general'" in msg and "groups: domain, outside" in msg
    # an exponential in D (not the law's power): the fit of the named measure refuses, naming the constant;
    # a measure the answer does not use is left out with its reason
    steep = {"domain": DOMAIN, "general": GENERAL, "outside": DOMAIN}
    for i, share in enumerate(REPLAY):
        run = tmp_path / "steep" / f"x{i}"
        plant_run(run, streams[share], i, steep, bases={"domain": DOMAIN_BASE, "general": GENERAL_BASE, "outside": 2.5})
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        r = true_ratio(streams[share])
        for row in rows:
            t = row.get("eval_tokens", 0)
            if t:
                row["eval_loss"]["outside"] = 2 + 3 * r * float(np.exp(-t / 3000)) + 0.1 * (1 - r)
        atomic_write_bytes(run / "metrics.jsonl", "".join(json.dumps(x) + "\n" for x in rows).encode())
    msg = one_line_error(capsys, ["plan", "--in", f"{tmp_path}/steep/*/", "--out", tmp_path / "q",
                                  "plan.target_tokens=1e5", "plan.forgetting_measure=outside"])
    assert "the law of 'outside'" in msg and "constant E ran to 0" in msg
    assert not (tmp_path / "q").exists()
    assert run_main(["plan", "--in", f"{tmp_path}/steep/*/", "--out", tmp_path / "q", "plan.target_tokens=1e5",
                     "plan.bootstrap=0", "-q"]) == 0
    ans = json.loads((tmp_path / "q" / "plan.json").read_text())
    assert list(ans["fits"]) == ["domain", "general"] and "E ran to 0" in ans["not_fitted"]["outside"]


def test_not_a_train_run(streams, tmp_path, capsys):
    msg = one_line_error(capsys, ["plan", "--in", str(streams[0.0]), "--out", tmp_path / "p",
                                  "plan.target_tokens=1e5"])
    assert "not train" in msg or "metrics.jsonl" in msg


def test_prediction_then_check_against_the_baselines(grid, streams, tmp_path):
    """The pre-registration flow: predict at a share not in the grid and 4x its tokens, then score
    held-out runs there. Runs that follow the planted law: the law beats both baselines; runs that
    stopped moving after the grid's tokens: the last observed loss wins, and the check says so."""
    import yaml

    ratio = round(true_ratio(streams[HELD_OUT]), 4)
    assert run_main(["plan", "--in", f"{grid}/*/", "--out", tmp_path / "fit", f"plan.target_tokens={TARGET}",
                     f"plan.predict_ratios=[{ratio}]", "plan.bootstrap=20", "-q"]) == 0
    pred = yaml.safe_load((tmp_path / "fit" / "prediction.yaml").read_text())
    assert pred["predictions"][0]["ratio"] == ratio and len(pred["grid"]) == 12
    assert abs(pred["predictions"][0]["domain"]["loss"] - float(DOMAIN(TARGET, ratio))) < 0.01
    laws = {"domain": DOMAIN, "general": GENERAL}
    for seed in (0, 1):
        plant_run(tmp_path / "held" / f"h{seed}", streams[HELD_OUT], 100 + seed, laws, every=4 * EVERY)
    assert run_main(["plan-check", "--in", f"{tmp_path}/held/*/", "--out", tmp_path / "check",
                     f"plan_check.prediction={tmp_path / 'fit' / 'prediction.yaml'}", "-q"]) == 0
    res = json.loads((tmp_path / "check" / "check.json").read_text())
    assert res["useful"] and len(res["rows"]) == 2
    for row in res["rows"]:
        assert row["tokens"] == TARGET and row["abs_error"]["law"] < 0.01
        assert row["abs_error"]["last observed"] > 0.01 and row["abs_error"]["log-linear"] > row["abs_error"]["law"]
    # held-out runs whose losses froze at the grid's last tokens: the law (which extrapolates) loses
    frozen = {g: Law(E=float(law(TARGET / 4, ratio)), A=0, alpha=0, B=0, beta=0.5, eta=1, C=0, gamma=0.5, eps=0.1)
              for g, law in laws.items()}
    for seed in (0, 1):
        plant_run(tmp_path / "frozen" / f"h{seed}", streams[HELD_OUT], 200 + seed, frozen, every=4 * EVERY)
    assert run_main(["plan-check", "--in", f"{tmp_path}/frozen/*/", "--out", tmp_path / "check2",
                     f"plan_check.prediction={tmp_path / 'fit' / 'prediction.yaml'}", "-q"]) == 0
    res = json.loads((tmp_path / "check2" / "check.json").read_text())
    assert not res["useful"] and "not shown useful" in (tmp_path / "check2" / "check.md").read_text()


def test_plan_experiment_design_on_makes_plan(tmp_path):
    """`make plan-experiment`'s members, read from make's plan (-n): >= 5 replay shares x 2 seeds, 8 eval
    points each, the held-out runs at 4x the grid's tokens and a share not in the grid, trained only after
    the prediction is committed."""
    import re
    import subprocess

    root = Path(__file__).resolve().parent.parent
    data = tmp_path / "data"
    px = data / "xp" / "plan"
    out = subprocess.run(["make", "-n", "plan-predict", f"{px}/check/_SUCCESS", f"DATA={data}", f"PLAN_PREREG={tmp_path}/p.yaml"],
                         cwd=root, capture_output=True, text=True, check=True).stdout.replace("\\\n", " ")
    lines = out.splitlines()
    train = [x for x in lines if " train model=hf" in x and str(px) in x]
    grid = [x for x in train if "/grid/" in x]
    held = [x for x in train if "/heldout/" in x]
    shares = {m for x in lines if f"{px}/stream_" in x for m in re.findall(r"mix\.replay\.share=(\S+)", x)}
    assert len(shares) >= 5 and len(grid) == 2 * len(shares)
    assert {re.search(r" seed=(\d+)", x).group(1) for x in grid} == {"0", "1"}
    steps = {int(re.search(r"max_steps=(\d+)", x).group(1)) for x in grid}
    every = {int(re.search(r"eval_every=(\d+)", x).group(1)) for x in grid}
    assert len(steps) == len(every) == 1 and steps.pop() // every.pop() >= 8
    grid_steps = int(re.search(r"max_steps=(\d+)", grid[0]).group(1))
    assert len(held) == 2 and all(int(re.search(r"max_steps=(\d+)", x).group(1)) >= 4 * grid_steps for x in held)
    held_share = {m for x in lines if f"{px}/hstream_" in x for m in re.findall(r"mix\.replay\.share=(\S+)", x)}
    assert len(held_share) == 1 and not held_share & shares
    # the prediction is checked for (and its commit) before a held-out run trains, whichever is asked for
    member = re.search(r"--out (\S+/heldout/\S+)", held[0]).group(1)
    alone = subprocess.run(["make", "-n", f"{member}/_SUCCESS", f"DATA={data}", f"PLAN_PREREG={tmp_path}/p.yaml"],
                           cwd=root, capture_output=True, text=True, check=True).stdout.splitlines()
    check_at = next(i for i, x in enumerate(alone) if f"{tmp_path}/p.yaml" in x and "test -f" in x)
    assert check_at < next(i for i, x in enumerate(alone) if " train model=hf" in x and "/heldout/" in x)
    fit = next(x for x in lines if " plan --in" in x)
    assert f"plan.target_tokens={4 * grid_steps * 512}" in fit
    assert f"plan.predict_ratios=[{1 - float(held_share.pop()):g}]" in fit
    # an uncommitted prediction stops make before the held-out runs: one line, exit 2
    (tmp_path / "p.yaml").write_text("predictions: []\n")
    res = subprocess.run(["make", "--no-print-directory", "plan-prereg-check", f"PLAN_PREREG={tmp_path}/p.yaml"],
                         cwd=root, capture_output=True, text=True)
    assert res.returncode == 2 and "not committed: commit the prediction before the held-out runs train" in res.stderr


def test_plan_experiment_through_make_on_planted_runs(streams, tmp_path):
    """`make plan-predict`, the pre-registration gate and `make plan-experiment` run for real on planted
    grid and held-out members (make is told their upstream is done with -o: B0, the data, the venv):
    the prediction is copied, the held-out step is refused until the copy is committed, then checked."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parent.parent
    data = tmp_path / "data"
    px = data / "xp" / "plan"
    laws = {"domain": DOMAIN, "general": GENERAL}
    for share in REPLAY:
        for seed in (0, 1):
            shutil.copytree(streams[share], px / f"stream_rp{share}_s{seed}")
    for seed in (0, 1):
        shutil.copytree(streams[HELD_OUT], px / f"hstream_rp{HELD_OUT}_s{seed}")
    for i, share in enumerate(REPLAY):  # the runs after their streams: make sees them up to date
        for seed in (0, 1):
            plant_run(px / "grid" / f"rp{share}_s{seed}", px / f"stream_rp{share}_s{seed}", 10 * i + seed, laws)
    for seed in (0, 1):
        plant_run(px / "heldout" / f"rp{HELD_OUT}_s{seed}", px / f"hstream_rp{HELD_OUT}_s{seed}", 100 + seed, laws,
                  every=4 * EVERY)
    reg = tmp_path / "reg"
    reg.mkdir()
    subprocess.run(["git", "init", "-q", str(reg)], check=True)
    prereg = reg / "prediction.yaml"
    bin_dir = Path(sys.executable).parent
    args = [f"DATA={data}", f"VENV={bin_dir.parent}", f"PLAN_PREREG={prereg}", f"PLAN_REPLAY={' '.join(map(str, REPLAY))}",
            f"PLAN_HELD={HELD_OUT}", f"PLAN_STEPS={EVERY * POINTS}", f"STEP_TOKENS={STEP_TOKENS}",
            "PLAN_FIT_ARGS=plan.bootstrap=20", "-o", f"{data}/xp/b0.json", "-o", f"{data}/labelled/_SUCCESS",
            "-o", f"{data}/corpus/_SUCCESS", "-o", f"{bin_dir.parent}/.installed"]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def make(*goals: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "--no-print-directory", *goals, *args], cwd=root, env=env,
                              capture_output=True, text=True)

    first = make("plan-experiment")
    assert first.returncode == 2, first.stdout + first.stderr
    assert "not committed: commit the prediction before the held-out runs train" in first.stderr
    assert f"wrote {prereg}: commit it" in first.stdout and not (px / "check").exists()
    pred = prereg.read_text()
    assert pred.startswith("# cptkit plan's pre-registered prediction") and "ratio: 0.4" in pred
    subprocess.run(["git", "-C", str(reg), "add", "prediction.yaml"], check=True)
    subprocess.run(["git", "-C", str(reg), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "p"],
                   check=True)
    second = make("plan-experiment")
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"{prereg} exists: kept" in second.stdout and " train " not in second.stdout  # nothing retrained
    assert "the law beat both baselines on every held-out loss" in second.stdout
    res = json.loads((px / "check" / "check.json").read_text())
    assert res["useful"] and {r["loss"] for r in res["rows"]} == {"domain", "general"}


def test_a_refit_that_sends_E_off_to_infinity_gets_a_law_error_not_an_overflow():
    """Real numbers: a bootstrap resample of `make cpt-experiment`'s runs (3 domain shares) whose refit,
    from the full fit's constants, drove log E past exp's range: `cptkit plan` died with a traceback
    (OverflowError). log E now ends at 10× the largest loss, and a fit that runs E there is refused."""
    d = json.loads((Path(__file__).parent / "fixtures" / "plan_overflow_resample.json").read_text())
    fit = fit_law(d["D"], d["r"], d["y"], start=Law(**d["start"]), strict=False)  # an OverflowError before
    assert 0 < fit.law.E < min(d["y"]) and fit.rmse < 0.3  # bounded, the refit finds a floor under the losses


def test_a_negative_predicted_loss_is_flagged():
    """`cptkit plan` forced onto the experiment's 3 shares predicted a probe loss of −2.26 nats with an
    interval from −9.6 and said nothing; such a prediction is now a warning, in the log and plan.md."""
    from cptkit.steps.plan import implausible, report_md

    ok = {"domain": {"loss": 1.98, "interval": [0.40, 3.55]}}
    assert implausible(ok) == [] and implausible(None) == []
    bad = {**ok, "probe": {"loss": -2.2578, "interval": [-9.5977, 5.9931]},
           "heldout": {"loss": 3.2291, "interval": [-4.8171, 9.1274]}}
    got = implausible(bad)
    assert len(got) == 2 and "'probe' predicts a loss of -2.26 nats" in got[0] and "'heldout'" in got[1]
    ans = {"runs": [{"ratio": 0.0}], "target_tokens": 4e4, "extrapolation": 4.0, "constraint": {"max_forgetting": 0.05},
           "recommended_ratio": 0.005, "why": "w", "predicted": None, "warnings": got, "level": 0.9,
           "cmr": {"measure": "heldout", "tolerance": 0.05, "curve": []}, "fits": {}}
    assert report_md(ans).count("**Warning:** the law of") == 2
