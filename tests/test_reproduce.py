"""make reproduce's path at toy size: a Hydra multirun → aggregate over seeds → a verdict by a fixed rule."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cptkit.core.errors import CptkitError
from cptkit.eval.reproduce import report
from cptkit.eval.stats import CONTRADICTS, HOLDS, INCONCLUSIVE, NOT_TESTABLE

ROOT = Path(__file__).resolve().parent.parent


def claim(**kw) -> dict:
    base = {"id": "c", "title": "t", "source": "paper Fig. 1", "quote": "q", "command": "cmd", "members": "m/*",
            "axis": "x.value", "seed": "x.seed", "metric": {"file": "_results.json", "path": ["score"], "label": "score"}}
    return {**base, **kw}


def plant(root: Path, values: dict[float, list[float]]) -> None:
    """Finished member outputs with a planted metric: one per (axis value, seed)."""
    for x, scores in values.items():
        for s, v in enumerate(scores):
            d = root / "m" / f"x{x}_s{s}"
            d.mkdir(parents=True)
            (d / "_manifest.json").write_text(json.dumps({"config": {"x": {"value": x, "seed": s}}}))
            (d / "_results.json").write_text(json.dumps({"score": v}))
            (d / "_SUCCESS").write_text("")


@pytest.mark.parametrize("values,compare,want", [
    # 0.2 beats 0.1 on every seed by ~0.1 (SE 0.006), 0.4 falls below 0.3 by ~0.1: the claim holds
    ({0.1: [0.50, 0.52, 0.51], 0.2: [0.61, 0.62, 0.60], 0.3: [0.60, 0.61, 0.62], 0.4: [0.50, 0.52, 0.51]},
     [{"a": 0.2, "b": 0.1, "expect": 1}, {"a": 0.4, "b": 0.3, "expect": -1}], HOLDS),
    # the decline at 0.4 is within noise: one comparison holds, the other is inconclusive
    ({0.1: [0.50, 0.52, 0.51], 0.2: [0.61, 0.62, 0.60], 0.3: [0.60, 0.61, 0.62], 0.4: [0.65, 0.56, 0.60]},
     [{"a": 0.2, "b": 0.1, "expect": 1}, {"a": 0.4, "b": 0.3, "expect": -1}], INCONCLUSIVE),
    # 0.2 is clearly worse than 0.1: the paper's direction is contradicted
    ({0.1: [0.60, 0.62, 0.61], 0.2: [0.50, 0.52, 0.51]}, [{"a": 0.2, "b": 0.1, "expect": 1}], CONTRADICTS),
])
def test_verdict_rule_on_planted_members(tmp_path, values, compare, want):
    plant(tmp_path, values)
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([claim(compare=compare, scale="a planted toy, 3 seeds")]))
    out = tmp_path / "docs" / "repro.md"
    assert report(tmp_path / "claims.yaml", out) == [("c", want)]
    text = out.read_text()
    # every verdict names its scale and the machine
    assert f"**Verdict: {want}** (at a planted toy, 3 seeds; {os.cpu_count()} CPU cores, no GPU)." in text
    assert "| c | " + want + " |" in text
    assert (tmp_path / "docs" / "repro" / "c.png").stat().st_size > 1000  # the plot, mean ± SE


def test_axis_from_another_file_and_report_columns(tmp_path):
    """The axis and seed may live in a file other than the member's manifest (an upstream step's
    config recorded by the metric's writer); a metric that no comparison names is a column without a verdict."""
    for x, recalls in {0: [0.10, 0.11, 0.12], 2: [0.20, 0.22, 0.21]}.items():
        for s, v in enumerate(recalls):
            d = tmp_path / "m" / f"r{x}_s{s}"
            d.mkdir(parents=True)
            (d / "_manifest.json").write_text(json.dumps({"config": {"retrieve": {"top_k": 5}}}))  # no axis here
            (d / "_rel.json").write_text(json.dumps({"queries": {"config": {"expand": {"rounds": x}, "seed": s}},
                                                     "recall": v, "precision": 0.5 - v}))
            (d / "_SUCCESS").write_text("")
    c = claim(axis="expand.rounds", seed="seed", metric={"file": "_rel.json", "path": ["recall"], "label": "recall"},
              config={"file": "_rel.json", "path": ["queries", "config"]},
              metrics={"precision": {"file": "_rel.json", "path": ["precision"], "label": "precision"}},
              compare=[{"a": 2, "b": 0, "expect": 1}])
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([c]))
    assert report(tmp_path / "claims.yaml", tmp_path / "r.md") == [("c", HOLDS)]
    text = (tmp_path / "r.md").read_text()
    assert "| expand.rounds | seeds | recall (mean ± SE) | precision (mean ± SE) |\n|---|---|---|---|" in text
    assert "| 0 | 3 | 0.1100 ± 0.0058 | 0.3900 ± 0.0058 |" in text and "| 2 | 3 | 0.2100 ± 0.0058 |" in text
    # without `config` the axis is looked up in the manifest, which lacks it: the error names it
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([{**c, "config": None}]))
    with pytest.raises(CptkitError, match=r"no 'expand' for claim c \(axis expand.rounds"):
        report(tmp_path / "claims.yaml", tmp_path / "r.md")


def test_missing_members_name_the_command(tmp_path):
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([claim(command="cptkit corrupt -m ...")]))
    with pytest.raises(CptkitError, match=r"no sweep member matches .*run `cptkit corrupt -m \.\.\.`"):
        report(tmp_path / "claims.yaml", tmp_path / "r.md")


@pytest.mark.slow
def test_a_real_multirun_through_aggregate_to_verdict(tmp_path, corpus_records):
    """cptkit corrupt -m over ratio × seed (the basic launcher), then the report: a higher corruption
    ratio changes more of the text on every seed (holds), and 0.3 vs 0.3 has nothing to claim."""
    recs = [r for r in corpus_records if r["lang"] == "en"][:40]
    (tmp_path / "qa").mkdir()
    (tmp_path / "qa" / "a.jsonl").write_text("".join(json.dumps({**r, "text": r["text"][:500]}) + "\n" for r in recs))
    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "corrupt", "--in", "qa", "--out",
                        "runs/c{corrupt.ratio}_s{corrupt.seed}", "-q", "-m", "corrupt.ratio=0.0,0.3,0.6",
                        "corrupt.seed=1,2,3"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    metric = {"file": "_manifest.json", "path": ["extra", "realised ratio"], "label": "realised ratio"}
    claims = [claim(id="more", members="runs/*", axis="corrupt.ratio", seed="corrupt.seed", metric=metric,
                    compare=[{"a": 0.6, "b": 0.3, "expect": 1}, {"a": 0.3, "b": 0.0, "expect": 1}]),
              claim(id="less", members="runs/*", axis="corrupt.ratio", seed="corrupt.seed", metric=metric,
                    compare=[{"a": 0.6, "b": 0.3, "expect": -1}])]
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump(claims))
    got = report(tmp_path / "claims.yaml", tmp_path / "repro.md")
    assert got == [("more", HOLDS), ("less", CONTRADICTS)]
    assert "| 0.6 | 3 | 0.5" in (tmp_path / "repro.md").read_text()  # realised ≈ target (0.5996 here), 3 seeds


def write_run(d: Path, config: dict, evals: list[dict], inputs: list[str] | None = None) -> None:
    """A finished train-like member: its config and a metrics.jsonl with step lines and eval events."""
    d.mkdir(parents=True)
    (d / "_manifest.json").write_text(json.dumps({"config": {**config, "io": {"inputs": inputs or []}}}))
    # as train writes it: the evals before a step ride on that step's line, the one after the last is an event
    lines = [{"step": 10 * i + 1, "loss": 9.0, "eval_loss": e} for i, e in enumerate(evals[:-1])]
    lines += [{"step": 10 * len(evals), "event": "eval", "eval_loss": evals[-1]}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "_SUCCESS").write_text("")


def test_several_metrics_last_eval_reductions_and_input_axis(tmp_path):
    """A replay-like sweep: the axis lives in the input stream's config, the metrics are the last eval's
    losses; a worst-topic metric reduces over keys with a prefix; the verdict needs every comparison."""
    for share, general in ((0.0, [3.30, 3.32, 3.31]), (0.2, [3.10, 3.12, 3.09])):
        for s in range(3):
            stream = tmp_path / "streams" / f"rp{share}_s{s}"
            stream.mkdir(parents=True)
            (stream / "_manifest.json").write_text(json.dumps({"config": {"mix": {"replay": {"share": share}}}}))
            first = {"general": 3.0, "domain/a": 4.0, "domain/b": 4.0}
            last = {"general": general[s], "domain/a": 2.0 + s / 100, "domain/b": 2.5 + share}
            write_run(tmp_path / "replay" / f"rp{share}_s{s}", {"seed": s}, [first, last], [str(stream)])
    metrics = {"general": {"file": "metrics.jsonl", "event": "eval", "path": ["eval_loss", "general"]},
               "worst": {"file": "metrics.jsonl", "event": "eval", "path": ["eval_loss"], "reduce": "max",
                         "prefix": "domain/"}}
    c = claim(members="replay/*", axis="input:mix.replay.share", seed="seed", metric=None, metrics=metrics,
              frontier=["worst", "general"],
              compare=[{"metric": "general", "a": 0.2, "b": 0.0, "expect": -1},
                       {"metric": "worst", "a": 0.2, "b": 0.0, "expect": 1}])
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([c]))
    out = tmp_path / "docs" / "r.md"
    assert report(tmp_path / "claims.yaml", out, tmp_path) == [("c", HOLDS)]
    text = out.read_text()
    # general 0.2 − 0.0: −0.20, −0.20, −0.22 by seed; worst topic = domain/b: 2.5 vs 2.7 (+0.2 on every seed)
    assert "| general(0.2) − general(0.0) | decides | < 0 | -0.2067 ± 0.0067 |" in text
    assert "| worst(0.2) − worst(0.0) | decides | > 0 | +0.2000 ± 0.0000 |" in text
    assert "| 0.2 | 3 | 3.1033 ± 0.0088 | 2.7000 ± 0.0000 |" in text
    # the step lines of metrics.jsonl are not evals; a metric asking for an absent event names it
    c["metrics"]["general"]["event"] = "final"
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([c]))
    with pytest.raises(CptkitError, match="event 'final' in metrics.jsonl"):
        report(tmp_path / "claims.yaml", out, tmp_path)


def test_velocity_spread_from_first_and_last_eval_and_a_dirname_axis(tmp_path):
    """V = (l_t − l_target) / (l_init − l_target) per domain (Velocitune Eq. 2): arm 'even' brings both
    domains half way (V = 0.5, 0.5: spread 0), arm 'uneven' one all the way and one not at all (1, 0)."""
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "_velocitune_targets.json").write_text(json.dumps({"targets": {"a": 2.0, "b": 1.0}}))
    for arm, last in (("even", {"a": 3.0, "b": 2.0}), ("uneven", {"a": 2.0, "b": 3.0})):
        for s in range(3):
            jitter = s / 1000
            write_run(tmp_path / "runs" / f"{arm}_s{s}", {}, [{"a": 4.0, "b": 3.0},
                                                             {"a": last["a"] + jitter, "b": last["b"]}])
    spec = {"file": "metrics.jsonl", "event": "eval", "path": ["eval_loss"], "reduce": "velocity_spread",
            "targets": "proxy/_velocitune_targets.json"}
    c = claim(members="runs/*", axis="dir:^([a-z]+)_s", seed="dir:_s([0-9]+)$", metric=spec,
              compare=[{"a": "even", "b": "uneven", "expect": -1}])
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([c]))
    out = tmp_path / "r.md"
    assert report(tmp_path / "claims.yaml", out, tmp_path) == [("c", HOLDS)]
    # even: V = (0.5, 0.5) → spread 0 (+0.0005 jitter·2/2); uneven: V = (0, 1) → spread 1
    assert "| even | 3 | 0.0005 ± 0.0003 |" in out.read_text()
    assert "| uneven | 3 | 0.9995 ± 0.0003 |" in out.read_text()


def test_partial_report_names_the_claims_not_run(tmp_path):
    plant(tmp_path, {0.1: [0.5, 0.52, 0.51], 0.2: [0.61, 0.62, 0.60]})
    done = claim(compare=[{"a": 0.2, "b": 0.1, "expect": 1}])
    missing = claim(id="later", members="nothing/*", command="make reproduce-later")
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([done, missing]))
    with pytest.raises(CptkitError, match="no sweep member matches"):
        report(tmp_path / "claims.yaml", tmp_path / "r.md")
    assert report(tmp_path / "claims.yaml", tmp_path / "r.md", partial=True) == [("c", HOLDS), ("later", "not run yet")]
    assert "**not run yet:** claim later: no sweep member matches" in (tmp_path / "r.md").read_text()


def test_a_reading_shows_only_beside_the_numbers_it_was_written_for(tmp_path):
    """--readings: prose written after a run, keyed by the digest of the members it read; a changed member
    hides it (the section says so), and a malformed file is one error naming it."""
    from cptkit.eval.reproduce import load_claims, measure, measured_digest

    plant(tmp_path, {0.1: [0.5, 0.52, 0.51], 0.2: [0.61, 0.62, 0.60]})
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([claim(compare=[{"a": 0.2, "b": 0.1, "expect": 1}])]))
    (c,) = load_claims(tmp_path / "claims.yaml")
    digest = measured_digest(measure(c, tmp_path))
    notes = tmp_path / "readings.yaml"
    notes.write_text(yaml.safe_dump({"c": {"measured": digest, "text": "0.2 wins on every seed."}}))
    seen: dict[str, str] = {}
    report(tmp_path / "claims.yaml", tmp_path / "r.md", readings=notes, digests=seen)
    assert seen == {"c": digest}  # what the CLI prints beside each verdict, from the report's own reading
    assert "**Reading** (written after the run, readings.yaml). 0.2 wins on every seed." in (tmp_path / "r.md").read_text()
    (tmp_path / "m" / "x0.2_s1" / "_results.json").write_text(json.dumps({"score": 0.7}))  # a member rerun
    assert measured_digest(measure(c, tmp_path)) != digest
    report(tmp_path / "claims.yaml", tmp_path / "r.md", readings=notes)
    text = (tmp_path / "r.md").read_text()
    assert "0.2 wins" not in text and f"was written for other numbers (measured {digest}" in text
    notes.write_text("c: [not, a, mapping]\n")
    with pytest.raises(CptkitError, match=r"readings.yaml: expected claim id"):
        report(tmp_path / "claims.yaml", tmp_path / "r.md", readings=notes)


def test_a_claim_declared_not_testable_without_members_says_why_rather_than_not_run(tmp_path):
    """The GPU's claim on a CPU (no members here): not testable, with its reason, partial or not; with --gpu
    its members are needed like any claim's."""
    plant(tmp_path, {0.1: [0.5, 0.52, 0.51], 0.2: [0.61, 0.62, 0.60]})
    done = claim(compare=[{"a": 0.2, "b": 0.1, "expect": 1}])
    gpu = claim(id="big", members="gpu/*", not_testable="needs a GPU: too big for 2 cores")
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([done, gpu]))
    want = [("c", HOLDS), ("big", NOT_TESTABLE)]
    assert report(tmp_path / "claims.yaml", tmp_path / "r.md") == want
    assert report(tmp_path / "claims.yaml", tmp_path / "r.md", partial=True) == want
    text = (tmp_path / "r.md").read_text()
    assert f"| big | {NOT_TESTABLE} |" in text and "Written with `--partial`" not in text
    assert f"**Verdict: {NOT_TESTABLE}** (needs a GPU: too big for 2 cores); no member matches" in text
    with pytest.raises(CptkitError, match="no sweep member matches"):
        report(tmp_path / "claims.yaml", tmp_path / "r.md", gpu=True)
    assert report(tmp_path / "claims.yaml", tmp_path / "r.md", partial=True, gpu=True) == [("c", HOLDS),
                                                                                          ("big", "not run yet")]


def test_dotted_indexes_lists():
    from cptkit.eval.reproduce import dotted

    assert dotted({"mix": {"stages": [{"weights": {"synthetic": 1.25}}]}}, "mix.stages.0.weights.synthetic") == 1.25
    with pytest.raises(KeyError):
        dotted({"mix": {"stages": [1]}}, "mix.stages.3")


def test_v2_rule_primary_comparisons_holm_tost_contrast_and_not_testable(tmp_path):
    """Every verdict of the v2 rule on planted members: a primary effect that holds only with enough seeds,
    Holm over the report's claims, a peak as a concave contrast, TOST for "no effect", secondary
    comparisons that never decide, and the two ways a claim is not testable."""
    noise = [0.004, -0.003, 0.001, -0.002, 0.0]

    def sweep(name: str, means: dict[float, float]) -> dict[float, list[float]]:
        # each axis value its own noise, so that the paired differences have a spread
        return {x: [m + e * (1 + 3 * k) * (-1) ** (s * k) for s, e in enumerate(noise)]
                for k, (x, m) in enumerate(means.items())}

    claims = []
    for cid, means, extra in [
        # a peak at 0.2: 2·m(0.2) − m(0.1) − m(0.4) = +0.2 on every seed (± noise): holds
        ("peak", {0.1: 0.5, 0.2: 0.6, 0.4: 0.5}, {"primary": {"contrast": {0.2: 2, 0.1: -1, 0.4: -1}, "expect": 1,
                                                             "min_effect": 0.02},
                                                 "compare": [{"a": 0.4, "b": 0.1, "expect": 1}]}),
        # 0.3 ≈ 0.0 within ±0.02 (TOST) holds; the same data as an effect would be inconclusive
        ("tost", {0.0: 0.5, 0.3: 0.501}, {"primary": {"a": 0.3, "b": 0.0, "kind": "equivalence", "margin": 0.02}}),
        # clamped: zero on every seed in both arms
        ("clamped", {0.0: 1.0, 1.0: 1.0}, {"primary": {"a": 1.0, "b": 0.0, "expect": -1}}),
        # declared: the CPU cannot run a meaningful design
        ("gpu", {0.0: 1.0, 1.0: 2.0}, {"primary": {"a": 1.0, "b": 0.0, "expect": 1},
                                       "not_testable": "needs a GPU: bench/gpu/reproduce.sh"}),
        # below the minimum effect, though significant: inconclusive
        ("small", {0.0: 0.5, 1.0: 0.51}, {"primary": {"a": 1.0, "b": 0.0, "expect": 1, "min_effect": 0.05}}),
    ]:
        values = sweep(cid, means)
        if cid == "clamped":
            values = {x: [1.0] * 5 for x in means}
        for x, scores in values.items():
            for s, v in enumerate(scores):
                d = tmp_path / cid / f"x{x}_s{s}"
                d.mkdir(parents=True)
                (d / "_manifest.json").write_text(json.dumps({"config": {"x": {"value": x, "seed": s}}}))
                (d / "_results.json").write_text(json.dumps({"score": v}))
                (d / "_SUCCESS").write_text("")
        claims.append(claim(id=cid, members=f"{cid}/*", control="the control", could_fail="because", **extra))
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump(claims, sort_keys=False))
    got = dict(report(tmp_path / "claims.yaml", tmp_path / "r.md"))
    assert got == {"peak": HOLDS, "tost": HOLDS, "clamped": NOT_TESTABLE, "gpu": NOT_TESTABLE, "small": INCONCLUSIVE}
    text = (tmp_path / "r.md").read_text()
    assert "| 2·score(0.2) − score(0.1) − score(0.4) | primary | > 0.02 |" in text
    # neither the declared-untestable claim nor the clamped one (no p) is among the comparisons Holm adjusts
    assert "paired t, 4 df, Holm over 3" in text
    assert "| score(0.4) − score(0.1) | secondary | > 0 |" in text  # shown, never the verdict
    assert "| claim | verdict |" in text and "| gpu | not testable here |" in text
    assert "TOST ±0.02, 4 df, Holm over 3 | holds" in text
    assert "**Verdict: not testable here** (needs a GPU: bench/gpu/reproduce.sh)." in text
    assert "**Control:** the control" in text and "**Why the measure could have failed:** because" in text
    assert "does not clear the minimum effect 0.05" in text and "minimum detectable effect" in text


@pytest.mark.parametrize("seeds", ["0,1", "0 1"])  # REPRO_V2_SEEDS as a Hydra list or as make words
def test_make_reproduce_runs_the_v2_sweeps_the_cpu_can_then_one_report(tmp_path, seeds):
    """make -n reproduce: every v2 sweep of conf/reproduce/claims.yaml that 2 CPU cores run (expansion's 96
    members, the small model's multiruns, corruption and replay per arm and seed), not the GPU's, none of v1;
    then one report, docs/reproductions.md, from claims.yaml. make reproduce-v1 writes docs/reproductions_v1.md."""
    def plan(target: str) -> str:
        # --no-print-directory: under `make test` this make is a sub-make, which prints "Leaving directory"
        out = subprocess.run(["make", "-n", "--no-print-directory", target, f"DATA={tmp_path}", f"REPRO={tmp_path}/r",
                              f"REPRO_V2_SEEDS={seeds}"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return re.sub(r"\\\n\s*", " ", out)  # one command a line

    out, v2 = plan("reproduce"), f"{tmp_path}/r/v2"
    assert len(set(re.findall(rf"--out '{v2}/expansion/(method=[^']+)'", out))) == 96
    small = re.findall(rf"--out '{v2}/(\w+)/\{{(?:train.mixture|arm)\}}_s\{{seed\}}'.* -m seed=0,1 ", out)
    assert sorted(small) == ["topic_ppl"] * 2 + ["upsampling"] * 3 + ["velocitune"] * 2
    members = set(re.findall(rf"--out {v2}/((?:corruption|replay)/\S+)", out))
    assert members == {f"corruption/c{c}_s{s}" for c in ("0.0", "0.3", "0.7") for s in (0, 1)} | {
        f"replay/{a}_s{s}" for a in ("rp0.0", "rp0.1", "rp0.2", "rp0.3", "tm0.2", "neutral") for s in (0, 1)}
    assert "synthetic" not in out and "claims_v1" not in out and f"{tmp_path}/r/.done" not in out
    last = out.strip().splitlines()[-1]
    assert last.endswith(f"cptkit reproduce-report conf/reproduce/claims.yaml --root {tmp_path}/r --outputs {v2} "
                         "--out docs/reproductions.md --preamble conf/reproduce/preamble.md "
                         "--readings conf/reproduce/readings.yaml")  # the readings, written after a run
    v1 = plan("reproduce-v1")
    assert "cptkit reproduce-report conf/reproduce/claims_v1.yaml" in v1 and "--out docs/reproductions_v1.md" in v1
    assert f"{v2}/" not in v1
