"""Effects over seeds: mean ± SE, bootstrap interval, the verdict rule, the seeded CPT table."""

from __future__ import annotations

import math

import pytest

from cptkit.eval.stats import (
    CONTRADICTS,
    HOLDS,
    INCONCLUSIVE,
    NOT_TESTABLE,
    Comparison,
    bootstrap_ci,
    claim_verdict,
    decide,
    doc_se,
    hierarchical_bootstrap,
    holm,
    mean_se,
    min_detectable_effect,
    min_detectable_margin,
    paired_t,
    t_cdf,
    t_ppf,
)


def test_mean_se_by_hand():
    # 1, 2, 3, 6: mean 3, sample variance (4 + 1 + 0 + 9) / 3 = 14/3, SE = sqrt(14/3 / 4) = 1.0801
    m, se = mean_se([1, 2, 3, 6])
    assert m == 3 and se == pytest.approx(math.sqrt(14 / 12))
    assert math.isnan(mean_se([5.0])[1])


def test_student_t_against_the_table():
    # two-sided 95% critical values of Student's t (any statistics table)
    for df, crit in [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)]:
        assert t_ppf(0.975, df) == pytest.approx(crit, abs=1e-3)
    assert t_cdf(2.0, 3) == pytest.approx(0.93034, abs=1e-5) and t_cdf(0.0, 5) == pytest.approx(0.5)


def planted(n: int, mean: float, se: float) -> list[float]:
    """n values with exactly this mean and standard error (symmetric around the mean)."""
    sd = se * math.sqrt(n)
    z = [(i - (n - 1) / 2) for i in range(n)]
    scale = sd / math.sqrt(sum(x * x for x in z) / (n - 1))
    return [mean + scale * x for x in z]


def test_three_seeds_at_three_standard_errors_is_inconclusive():
    # mean/SE = 3 passed the old "mean ± 2 SE" rule; with 2 df the 95% interval needs 4.30 SE
    d = planted(3, 0.3, 0.1)
    assert mean_se(d) == pytest.approx((0.3, 0.1))
    e = paired_t(d, expect=+1)
    assert e.verdict == INCONCLUSIVE and 0.05 < e.p < 0.2 and e.lo < 0 < e.hi
    assert "paired t, 2 df" in e.sentence()


def test_an_effect_planted_at_five_standard_errors_with_five_seeds_holds():
    d = planted(5, -0.5, 0.1)
    e = paired_t(d, expect=-1, min_effect=0.02)
    assert e.verdict == HOLDS and e.p < 0.01
    assert (e.lo, e.hi) == pytest.approx((-0.5 - 2.776445 * 0.1, -0.5 + 2.776445 * 0.1), abs=1e-5)
    assert paired_t(d, expect=+1).verdict == CONTRADICTS
    # significant, but smaller than the minimum effect fixed in advance: not a "holds"
    small = paired_t(planted(5, -0.01, 0.001), expect=-1, min_effect=0.02)
    assert small.verdict == INCONCLUSIVE and "minimum effect" in small.reason


def test_holm_orders_and_adjusts_like_the_textbook():
    # Holm (1979): sorted p (0.005, 0.01, 0.03, 0.04) x (4, 3, 2, 1) = (0.02, 0.03, 0.06, 0.04) -> monotone 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, math.nan, 0.01]) == pytest.approx([0.5, math.nan, 0.02], nan_ok=True)
    # a family: the second comparison alone would hold (p ~ 0.03) but not after Holm over three
    c = Comparison(metric="m", a="x", b="y", expect=+1)
    alone = paired_t(planted(5, 0.1, 0.035), expect=+1)
    assert alone.verdict == HOLDS and 0.02 < alone.p < 0.05
    fam = decide([(c, planted(5, 1.0, 0.05)), (c, planted(5, 0.1, 0.035)), (c, planted(5, 0.0, 0.1))])
    assert [e.verdict for e in fam] == [HOLDS, INCONCLUSIVE, INCONCLUSIVE]
    assert fam[1].p == pytest.approx(min(1.0, 2 * alone.p)) and "Holm over 3" in fam[1].test


def test_tost_accepts_an_equivalence_and_rejects_a_real_effect():
    eq = Comparison(metric="m", a="x", b="y", kind="equivalence", margin=0.02)
    same = planted(5, 0.002, 0.003)
    [e] = decide([(eq, same)])
    assert e.verdict == HOLDS and -0.02 < e.lo and e.hi < 0.02 and "TOST ±0.02" in e.sentence()
    [real] = decide([(eq, planted(5, 0.2, 0.01))])
    assert real.verdict == CONTRADICTS
    [wide] = decide([(eq, planted(5, 0.0, 0.05))])  # too noisy to show equivalence: no claim either way
    assert wide.verdict == INCONCLUSIVE


def test_not_testable_with_one_seed_or_a_measure_that_cannot_move():
    assert paired_t([-0.3], expect=-1).verdict == NOT_TESTABLE
    clamped = paired_t([0.0, 0.0, 0.0, 0.0, 0.0], expect=-1)
    assert clamped.verdict == NOT_TESTABLE and "did not move" in clamped.sentence()
    # the same non-zero difference on every seed is not untestable: it is certain
    assert paired_t([-0.1] * 5, expect=-1).verdict == HOLDS
    assert claim_verdict([clamped]) == NOT_TESTABLE
    # one comparison untestable: the claim cannot hold as a whole
    assert claim_verdict([clamped, paired_t(planted(5, 1, 0.1), 1)]) == INCONCLUSIVE
    assert claim_verdict([paired_t(planted(5, 1, 0.1), 1)] * 2) == HOLDS
    assert claim_verdict([paired_t(planted(5, 1, 0.1), 1), paired_t(planted(5, 1, 0.1), -1)]) == CONTRADICTS


def test_a_significant_effect_whose_interval_straddles_the_minimum_is_inconclusive():
    # the v2 replay reading: +0.0221 ± 0.0037 over 5 seeds, minimum effect 0.02. p ~ 0.004, and the point
    # clears 0.02, but the 95% interval [+0.012, +0.032] does not: a direction, not a size
    d = planted(5, 0.0221, 0.0037)
    for expect, old in ((+1, HOLDS), (-1, CONTRADICTS)):
        e = paired_t(d, expect=expect, min_effect=0.02)
        assert e.p < 0.01 and e.lo < 0.02 < e.hi and abs(e.mean) > 0.02  # the old rule said `old`
        assert e.verdict == INCONCLUSIVE != old and "does not clear the minimum effect" in e.reason
        assert e.mde > 0.02 and "minimum detectable effect" in e.sentence()
    # the same estimate with a tight interval clears it both ways
    tight = planted(5, 0.0221, 0.0002)
    assert paired_t(tight, expect=+1, min_effect=0.02).verdict == HOLDS
    assert paired_t(tight, expect=-1, min_effect=0.02).verdict == CONTRADICTS
    # and through a family: Holm's p, then the interval
    c = Comparison(metric="m", a="x", b="y", expect=-1, min_effect=0.02)
    [e] = decide([(c, d)])
    assert e.verdict == INCONCLUSIVE and not math.isnan(e.mde)


def test_a_failed_tost_contradicts_only_through_holm():
    # alone: nonzero (p ~ 0.04 against 0) with its interval beyond the margin, so "contradicts"
    eq = Comparison(metric="m", a="x", b="y", kind="equivalence", margin=0.001)
    d = planted(5, 0.1, 0.0343)
    [alone] = decide([(eq, d)])
    assert alone.verdict == CONTRADICTS and "p = 0.04" in alone.reason
    # in a family of three whose other members are null, Holm triples that p: inconclusive
    null = Comparison(metric="m", a="x", b="y", expect=+1)
    fam = decide([(eq, d), (null, planted(5, 0.01, 0.02)), (null, planted(5, -0.01, 0.03))])
    assert fam[0].verdict == INCONCLUSIVE and fam[0].p > 0.05
    assert not math.isnan(fam[0].mde) and "minimum detectable margin" in fam[0].sentence()
    # a nonzero estimate whose interval reaches back inside the margin does not contradict it either
    [inside] = decide([(Comparison(metric="m", a="x", b="y", kind="equivalence", margin=0.05), d)])
    assert inside.verdict == INCONCLUSIVE


def test_the_power_figures_match_a_planted_design():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    n, se, delta = 5, 0.01, 0.02
    sd = se * math.sqrt(n)
    crit95, crit90 = t_ppf(0.975, n - 1), t_ppf(0.95, n - 1)
    # a directional claim: at the minimum detectable effect, 80% of designs clear delta with their interval
    mde = min_detectable_effect(se, n, delta)
    assert 0.02 + 3.0 * se < mde < 0.02 + 5.0 * se  # the normal-theory 2.776 + 0.941 = 3.72 SE, a bit more
    x = rng.normal(mde, sd, size=(40_000, n))
    m, s = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
    assert (m - crit95 * s >= delta).mean() == pytest.approx(0.80, abs=0.01)
    assert (m - crit95 * s >= delta + 0.3 * se * 2).mean() < 0.75  # not flat: a smaller effect has less power
    # an equivalence at a true difference of 0: the margin that 80% of designs show
    mdm = min_detectable_margin(se, n)
    x = rng.normal(0.0, sd, size=(40_000, n))
    m, s = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
    assert ((m - crit90 * s > -mdm) & (m + crit90 * s < mdm)).mean() == pytest.approx(0.80, abs=0.01)
    # Holm's strictest step asks for more
    assert min_detectable_effect(se, n, delta, alpha=0.05 / 4) > mde


def test_hierarchical_bootstrap_and_document_error():
    docs = [[0.1, 0.2, 0.3, 0.2], [0.2, 0.3, 0.4, 0.3], [0.0, 0.1, 0.2, 0.1]]
    lo, hi = hierarchical_bootstrap(docs, seed=1)
    assert (lo, hi) == hierarchical_bootstrap(docs, seed=1) and lo < 0.2 < hi
    # per-seed doc SEs sqrt(0.02/3/4) each: pooled sqrt(3 * 0.02/12) / 3
    assert doc_se(docs) == pytest.approx(math.sqrt(3 * 0.02 / 12) / 3)


def test_bootstrap_interval_is_deterministic_and_covers_the_mean():
    xs = [0.1, 0.3, 0.2, 0.5, 0.4, 0.2, 0.3]
    lo, hi = bootstrap_ci(xs, seed=3)
    assert (lo, hi) == bootstrap_ci(xs, seed=3) and lo < sum(xs) / len(xs) < hi
    assert bootstrap_ci([2.0, 2.0, 2.0]) == (2.0, 2.0)


def _seed(domain: float, probe: float, outside: float, task: float, docs: int = 4) -> dict:
    # every document of a group at the group's loss, shifted by a per-document offset that cancels
    offs = [(i - (docs - 1) / 2) / 100 for i in range(docs)]
    vals = {"domain": domain, "probe": probe, "outside": outside}
    return {**vals, "task": task, "docs": {g: [v + o for o in offs] for g, v in vals.items()}}


def test_cpt_table_pairs_each_arm_with_b0_of_its_seed_and_decides_the_claims(tmp_path):
    from cptkit.training.report import claims_reading, load_claims, seeded_table

    claims_file = tmp_path / "claims.yaml"
    claims_file.write_text("""
alpha: 0.05
claims:
  - {id: gain, text: domain falls, compare: {metric: domain, a: noreplay, b: b0, expect: -1, min_effect: 0.02}}
  - id: forgetting
    text: probe rises
    compare: {metric: probe, a: noreplay, b: b0, expect: 1, min_effect: 0.02}
    equivalence_margin: 0.02
  - {id: neutral, text: no change, compare: {metric: outside, a: neutral, b: b0, kind: equivalence, margin: 0.02}}
""")
    claims = load_claims(claims_file)
    b0 = [_seed(2.0 + s / 10, 3.0 + s / 10, 3.5, 40.0 + s) for s in range(5)]
    noise = [0.004, -0.003, 0.001, -0.002, 0.0]
    runs = {"b0": b0,
            # a gain of 0.5 nats on every seed (± a little): holds; the probe moves by ~0: no forgetting shown
            "noreplay": [_seed(b["domain"] - 0.5 + e, b["probe"] + e, b["outside"], b["task"]) for b, e in zip(b0, noise, strict=True)],
            "neutral": [_seed(b["domain"], b["probe"], b["outside"] + e, b["task"]) for b, e in zip(b0, noise, strict=True)]}
    groups = {"domain": "domain Δ", "probe": "probe Δ", "outside": "outside Δ"}
    t = seeded_table(runs, groups, "wordnet_defs", shipped=[_seed(2.5, 3.6, 3.9, 30.0)] * 5).splitlines()
    assert t[0] == ("| model | seeds | domain Δ (nats/token) | probe Δ (nats/token) | outside Δ (nats/token) | "
                    "wordnet_defs (points) |")
    assert t[2].startswith("| shipped model (not the baseline) | 5 | 2.500 ± 0.000 | 3.600 ± 0.000 |")
    assert t[3] == "| b0 | 5 | 2.200 ± 0.071 | 3.200 ± 0.071 | 3.500 ± 0.000 | 42.000 ± 0.707 |"
    assert t[4].startswith("| noreplay − b0 | 5 | -0.500 ± 0.001 (docs ± 0.000) |")
    r = claims_reading(runs, claims, "claims.yaml")
    gain, forg, tost_line, neutral = r.splitlines()[2:6]
    assert gain.startswith("- **gain**: domain falls. noreplay − b0 on domain (expected −, minimum effect 0.02): -0.500 ±")
    assert gain.endswith("(paired t, 4 df, Holm over 3): holds.")
    assert forg.endswith(": inconclusive.") and "TOST ±0.02" in tost_line and tost_line.endswith(": holds.")
    assert neutral.endswith("(TOST ±0.02, 4 df, Holm over 3): holds.")
    one = {n: v[:1] for n, v in runs.items()}
    r1 = claims_reading(one, claims, "claims.yaml")
    assert r1.count("not testable here (one seed: no error bar)") == 3 and "illustration, not evidence" in r1
    with pytest.raises(Exception, match="2 seeds, b0 has 5"):
        seeded_table({**runs, "neutral": runs["neutral"][:2]}, groups, None)
    bad = tmp_path / "bad.yaml"
    bad.write_text("claims:\n  - {id: x, text: y, compare: {metric: m, a: p, b: q, kind: equivalence}}\n")
    with pytest.raises(Exception, match="bad.yaml: claim x: an equivalence needs a positive margin"):
        load_claims(bad)


def test_curves_over_seeds_are_mean_and_shaded_error(tmp_path):
    """An arm given as one run per seed is drawn as its mean ± SE; seeds measured at different
    token counts cannot be averaged and say so."""
    import json
    from pathlib import Path

    from cptkit.core.errors import CptkitError
    from cptkit.training.plots import overlay_curves

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


def test_b0_parts_merge_into_one_evaluation_and_overlaps_are_refused(tmp_path):
    """B0 is scored per seed on its held-out sample and once on the probe, the outside text and the
    task: ``DIR+DIR`` joins the parts, and a group scored in both parts is an error."""
    import json

    from cptkit.core.errors import CptkitError
    from cptkit.training.report import _load_named, seed_numbers

    def out(name, groups, tasks):
        d = tmp_path / name
        d.mkdir()
        (d / "_results.json").write_text(json.dumps({
            "perplexity": {"groups": {g: {"loss": v, "doc_nll": [[v * 10, 10]]} for g, v in groups.items()}},
            "tasks": {t: {"metrics": {"acc_norm": a}} for t, a in tasks.items()}}))
        return str(d)

    s0, s1 = out("s0", {"domain": 2.0}, {}), out("s1", {"domain": 2.5}, {})
    fixed = out("fixed", {"probe": 3.0, "outside": 3.5}, {"wordnet_defs": 0.44})
    named = _load_named([f"b0={s0}+{fixed},{s1}+{fixed}"])
    seeds = [seed_numbers(r, ["domain", "probe", "outside"], "wordnet_defs") for r in named["b0"]]
    assert [(s["domain"], s["probe"], s["outside"], s["task"]) for s in seeds] == [(2.0, 3.0, 3.5, 44.0), (2.5, 3.0, 3.5, 44.0)]
    assert seeds[1]["docs"] == {"domain": [2.5], "probe": [3.0], "outside": [3.5]}
    both = out("both", {"probe": 3.1}, {})
    with pytest.raises(CptkitError, match="perplexity group 'probe' is also in"):
        _load_named([f"b0={fixed}+{both}"])
