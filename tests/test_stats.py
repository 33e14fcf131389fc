"""Effects over seeds: mean ± SE, bootstrap interval, the verdict rule, the seeded CPT table."""

from __future__ import annotations

import math

import pytest

from cptkit.eval.stats import CONTRADICTS, HOLDS, INCONCLUSIVE, bootstrap_ci, effect, mean_se


def test_mean_se_by_hand():
    # 1, 2, 3, 6: mean 3, sample variance (4 + 1 + 0 + 9) / 3 = 14/3, SE = sqrt(14/3 / 4) = 1.0801
    m, se = mean_se([1, 2, 3, 6])
    assert m == 3 and se == pytest.approx(math.sqrt(14 / 12))
    assert math.isnan(mean_se([5.0])[1])


def test_verdict_rule_on_planted_numbers():
    # mean -0.2, SE 0.01: interval [-0.22, -0.18] excludes 0 on the expected (negative) side
    assert effect([-0.21, -0.2, -0.19], expect=-1).verdict == HOLDS
    assert effect([-0.21, -0.2, -0.19], expect=+1).verdict == CONTRADICTS
    # mean 0.0033, SE 0.1 > |mean|: nothing can be said
    assert effect([-0.1, 0.11, 0.0], expect=-1).verdict == INCONCLUSIVE
    assert effect([-0.3], expect=-1).verdict == INCONCLUSIVE  # one seed: no error bar, no claim
    e = effect([1.0, 2.0, 3.0], expect=1)
    assert (e.mean, e.se, e.lo, e.hi) == pytest.approx((2.0, 1 / math.sqrt(3), 2 - 2 / math.sqrt(3), 2 + 2 / math.sqrt(3)))
    assert e.text() == "+2.000 ± 0.577"


def test_bootstrap_interval_is_deterministic_and_covers_the_mean():
    xs = [0.1, 0.3, 0.2, 0.5, 0.4, 0.2, 0.3]
    lo, hi = bootstrap_ci(xs, seed=3)
    assert (lo, hi) == bootstrap_ci(xs, seed=3) and lo < sum(xs) / len(xs) < hi
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)


def test_seeded_cpt_table_pairs_each_arm_with_the_base_of_its_seed():
    from cptkit.training.report import seeded_reading, seeded_table

    def seed(d, zh, g, t):
        return {"domain": d, "zh": zh, "general": g, "task": t}

    runs = {"base": [seed(2.0, 4.0, 3.0, 40.0), seed(2.2, 4.2, 3.2, 42.0), seed(2.1, 4.1, 3.1, 41.0)],
            # no replay: domain −0.5 on every seed; general +0.10, +0.12, +0.08 (forgetting)
            "noreplay": [seed(1.5, 3.9, 3.10, 38.0), seed(1.7, 4.1, 3.32, 39.0), seed(1.6, 4.0, 3.18, 40.0)],
            # replay: domain −0.45; general +0.01, −0.01, +0.03: no forgetting that holds
            "replay": [seed(1.55, 3.9, 3.01, 40.0), seed(1.75, 4.1, 3.19, 42.0), seed(1.65, 4.0, 3.13, 41.0)]}
    groups = {"domain": "domain Δ", "zh": "language Δ", "general": "general Δ (forgetting)"}
    t = seeded_table(runs, groups, "gcide_defs").splitlines()
    assert t[0] == ("| model | seeds | domain Δ (nats/token) | language Δ (nats/token) | "
                    "general Δ (forgetting) (nats/token) | gcide_defs (points) |")
    assert t[2] == "| base | 3 | 2.100 ± 0.058 | 4.100 ± 0.058 | 3.100 ± 0.058 | 41.000 ± 0.577 |"
    assert t[3].startswith("| noreplay − base | 3 | -0.500 ± 0.000 | -0.100 ± 0.000 | +0.100 ± 0.012 |")
    r = seeded_reading(runs, "domain", "general", "noreplay", "replay")
    assert r.startswith("noreplay: domain -0.500 ± 0.000 nats (a gain), general +0.100 ± 0.012 (forgetting); "
                        "replay: domain -0.450 ± 0.000 nats (a gain), general +0.010 ± 0.012 (inconclusive at this scale)")
    # paired per seed: −0.09, −0.13, −0.05: mean −0.090, SE 0.023, interval [−0.136, −0.044]
    assert "replay − noreplay on general text: -0.090 ± 0.023 nats (less forgetting: holds)" in r
    fell = {**runs, "replay": [seed(1.55, 3.9, 2.9, 40.0), seed(1.75, 4.1, 3.0, 42.0), seed(1.65, 4.0, 2.95, 41.0)]}
    assert "general -0.150 ± 0.029 (no forgetting: the general loss fell)" in seeded_reading(
        fell, "domain", "general", "noreplay", "replay")
    with pytest.raises(Exception, match="2 seeds, the base has 3"):
        seeded_table({**runs, "replay": runs["replay"][:2]}, groups, None)
    # one seed (make demo): the same units, no error bar, and nothing is claimed to hold
    one = {n: v[:1] for n, v in runs.items()}
    t1 = seeded_table(one, groups, "gcide_defs").splitlines()
    assert t1[2] == "| base | 1 | 2.000 | 4.000 | 3.000 | 40.000 |"
    assert t1[3] == "| noreplay − base | 1 | -0.500 | -0.100 | +0.100 | -2.000 |"
    r1 = seeded_reading(one, "domain", "general", "noreplay", "replay")
    assert "noreplay: domain -0.500 ± n/a nats (inconclusive" in r1 and "holds" not in r1.split(". One seed")[0]
    assert r1.endswith("One seed has no standard error, so no difference can hold yet: run three seeds "
                       "(make cpt-experiment).")


def test_curves_over_seeds_are_mean_and_shaded_error(tmp_path):
    """An arm given as one run per seed is drawn as its mean ± SE; seeds measured at different
    token counts cannot be averaged and say so."""
    import json
    from pathlib import Path

    from cptkit.core.errors import CptkitError
    from cptkit.training.metrics import overlay_curves

    def run(name: str, losses: list[float], tokens: tuple[int, ...] = (0, 100, 200)) -> Path:
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": i, "tokens": t, "eval_tokens": t, "eval_loss": {"domain": x, "general": 3.0 + x / 10}}
                for i, (t, x) in enumerate(zip(tokens, losses, strict=True))]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return d

    arms = {"noreplay": [run(f"a{s}", [3.0, 2.5 - s / 10, 2.2]) for s in range(3)],
            "replay": [run(f"b{s}", [3.0, 2.7, 2.4 + s / 10]) for s in range(3)]}
    assert overlay_curves(arms, tmp_path / "curves.png") is None
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    arms["replay"].append(run("b9", [3.0, 2.7], tokens=(0, 150)))
    with pytest.raises(CptkitError, match="different token counts"):
        overlay_curves(arms, tmp_path / "bad.png")
