"""Pure mixture algorithms and LR schedules, checked against hand-computed numbers."""

import math

import pytest

from cptkit.mixtures.rules import (
    ScalingLawError,
    TargetEstimator,
    dbl_update,
    epoch_weights,
    fit_scaling_law,
    predict_targets,
    topic_ppl_update,
    velocities,
    velocitune_update,
    velocity,
)
from cptkit.training.schedule import lr_at, make_schedule


def test_topic_ppl_update_hand_computed():
    # Δ = (-1, +2, 0); max|Δ| = 2; δ = (-0.5, 1, 0); f = 1 + 0.4 δ = (0.8, 1.4, 1.0)
    # r·f = (0.40, 0.42, 0.20), sum 1.02
    out = topic_ppl_update({"a": 0.5, "b": 0.3, "c": 0.2}, {"a": 10, "b": 20, "c": 30},
                           {"a": 9, "b": 22, "c": 30}, alpha=0.4)
    assert out == pytest.approx({"a": 0.40 / 1.02, "b": 0.42 / 1.02, "c": 0.20 / 1.02}, abs=1e-12)
    assert out["a"] == pytest.approx(0.392157, abs=1e-6)
    assert out["b"] == pytest.approx(0.411765, abs=1e-6)
    assert sum(out.values()) == pytest.approx(1.0)


def test_topic_ppl_update_degenerate():
    p = {"x": 0.25, "y": 0.75}
    assert topic_ppl_update(p, {"x": 5, "y": 6}, {"x": 5, "y": 6}) == pytest.approx(p)
    # unnormalised proportions are normalised
    assert topic_ppl_update({"x": 1, "y": 3}, {"x": 5, "y": 6}, {"x": 5, "y": 6}) == pytest.approx(p)
    with pytest.raises(ValueError, match="'y'"):
        topic_ppl_update(p, {"x": 5}, {"x": 5, "y": 6})
    with pytest.raises(ValueError, match="'x'.*negative"):
        topic_ppl_update({"x": -0.1, "y": 1.1}, {"x": 5, "y": 6}, {"x": 5, "y": 6})
    with pytest.raises(ValueError, match="'y'.*nan"):
        topic_ppl_update(p, {"x": 5, "y": 6}, {"x": 5, "y": float("nan")})
    with pytest.raises(ValueError, match="alpha"):
        topic_ppl_update(p, {"x": 5, "y": 6}, {"x": 4, "y": 6}, alpha=1.5)


def test_velocitune_update_hand_computed():
    w = {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}
    init, target = {"a": 3.0, "b": 4.0, "c": 2.0}, {"a": 2.0, "b": 2.0, "c": 2.0}
    cur = {"a": 2.5, "b": 4.5, "c": 1.0}
    # V_a = 0.5/1 = 0.5; V_b = 2.5/2 → clamped to 1; V_c: init == target → learnt, 0
    out = velocitune_update(w, init, target, cur)
    z = math.exp(0.5) + math.e + 1.0
    assert out == pytest.approx({"a": math.exp(0.5) / z, "b": math.e / z, "c": 1 / z}, abs=1e-12)
    assert out["b"] == pytest.approx(0.506480, abs=1e-6)
    assert max(out, key=out.get) == "b"  # the slowest domain gains weight
    # ablation without target: V = l_t / l_init = (0.8333, 1.125, 0.5)
    abl = velocitune_update(w, init, None, cur, use_target=False)
    e = [math.exp(2.5 / 3), math.exp(4.5 / 4), math.exp(0.5)]
    assert list(abl.values()) == pytest.approx([x / sum(e) for x in e], abs=1e-12)


def test_velocitune_update_errors():
    w = {"a": 0.5, "b": 0.5}
    with pytest.raises(ValueError, match="'b'.*missing from target_loss"):
        velocitune_update(w, {"a": 3, "b": 3}, {"a": 2}, {"a": 2.5, "b": 2.5})
    with pytest.raises(ValueError, match="'a'.*negative"):
        velocitune_update({"a": -1, "b": 2}, {"a": 3, "b": 3}, {"a": 2, "b": 2}, {"a": 2.5, "b": 2.5})
    with pytest.raises(ValueError, match="'a'.*nan"):
        velocitune_update(w, {"a": 3, "b": 3}, {"a": 2, "b": 2}, {"a": float("nan"), "b": 2.5})


def test_dbl_update_hand_computed():
    w, tgt = {"a": 0.5, "b": 0.5}, {"a": 2.0, "b": 2.0}
    cur = {"a": 3.0, "b": 1.5}
    # clip: Δ = (1, 0) → softmax(log .5 + Δ) = (e, 1)/(e + 1) = (0.731059, 0.268941)
    out = dbl_update(w, tgt, cur, eta=1.0, smoothing=0.0)
    assert out["a"] == pytest.approx(math.e / (math.e + 1), abs=1e-12)
    smooth = dbl_update(w, tgt, cur)  # c = 1e-4: (1 - c) w + c / 2
    assert smooth["a"] == pytest.approx((1 - 1e-4) * math.e / (math.e + 1) + 0.5e-4, abs=1e-12)
    # no clip: Δ = (1, -0.5)
    nc = dbl_update(w, tgt, cur, smoothing=0.0, clip=False)
    assert nc["a"] == pytest.approx(math.e / (math.e + math.exp(-0.5)), abs=1e-12)
    assert nc["a"] == pytest.approx(0.817574, abs=1e-6)
    with pytest.raises(ValueError, match="'b'"):
        dbl_update(w, {"a": 2.0}, cur)
    assert sum(dbl_update({"a": 0.0, "b": 1.0}, tgt, cur, smoothing=0.0).values()) == pytest.approx(1.0)


def test_fit_scaling_law_recovers_parameters():
    E, B, beta = 1.8, 50.0, 0.3
    toks = [1e6 * 2 ** k for k in range(10)]
    law = fit_scaling_law(toks, [E + B / t ** beta for t in toks])
    assert law.E == pytest.approx(E, rel=1e-4)
    assert law.B == pytest.approx(B, rel=1e-3)
    assert law.beta == pytest.approx(beta, rel=1e-4)
    assert law.predict(1e10) == pytest.approx(E + B / 1e10 ** beta, rel=1e-6)
    with pytest.raises(ValueError):
        fit_scaling_law([1, 2], [3, 2])


def test_predict_targets_and_convergence():
    laws = {"x": (1.5, 30.0, 0.35), "y": (2.2, 12.0, 0.25)}
    ckpts = [(t, {d: e + b / t ** be for d, (e, b, be) in laws.items()}) for t in (1e5, 2e5, 4e5, 8e5, 1.6e6)]
    targets, fitted, change = predict_targets(ckpts, budget_tokens=1e8)
    assert targets["x"] == pytest.approx(1.5 + 30 / 1e8 ** 0.35, rel=1e-5)
    assert targets["y"] == pytest.approx(2.2 + 12 / 1e8 ** 0.25, rel=1e-5)
    assert change < 1e-4


def test_velocity_is_algorithm_1_literally():
    # ℓ_init < ℓ_target: the ratio is still Clamp{0, (ℓ_t − ℓ_target)/(ℓ_init − ℓ_target), 1}
    assert velocity(2.0, 3.0, 2.5) == pytest.approx(0.5)  # (−0.5)/(−1.0)
    assert velocity(2.0, 3.0, 1.5) == 1.0  # 1.5 → clamped to 1
    assert velocity(2.0, 3.0, 3.5) == 0.0  # −0.5 → clamped to 0
    # ℓ_init = ℓ_target (the only undefined case): 1 while above the target, else 0
    assert (velocity(2.0, 2.0, 2.5), velocity(2.0, 2.0, 2.0), velocity(2.0, 2.0, 1.5)) == (1.0, 0.0, 0.0)
    # the usual case ℓ_init > ℓ_target: (2.5 − 2)/(3 − 2) = 0.5
    assert velocity(3.0, 2.0, 2.5) == pytest.approx(0.5)
    # the optional "learnt" guard: ℓ_init ≤ ℓ_target → 0
    assert velocity(2.0, 3.0, 2.5, learnt_guard=True) == 0.0 and velocity(2.0, 2.0, 2.5, learnt_guard=True) == 0.0
    assert velocity(3.0, 2.0, 2.5, learnt_guard=True) == pytest.approx(0.5)
    # in the update: V = (0.5, 0.25) → w ∝ (e^0.5, e^0.25) = (0.562177, 0.437823)
    w, init, tgt, cur = {"a": 0.5, "b": 0.5}, {"a": 2.0, "b": 3.0}, {"a": 3.0, "b": 2.0}, {"a": 2.5, "b": 2.25}
    assert velocities(init, tgt, cur) == pytest.approx({"a": 0.5, "b": 0.25})
    out = velocitune_update(w, init, tgt, cur)
    assert out["a"] == pytest.approx(math.exp(0.5) / (math.exp(0.5) + math.exp(0.25)), abs=1e-12)
    assert out["a"] == pytest.approx(0.562177, abs=1e-6)
    # with the guard, a (ℓ_init < ℓ_target) counts as learnt: V = (0, 0.25) → a = 1/(1 + e^0.25) = 0.437823
    assert velocitune_update(w, init, tgt, cur, learnt_guard=True)["a"] == pytest.approx(0.437823, abs=1e-6)


def test_scaling_law_E_is_never_negative_and_bad_fits_are_errors():
    # L = −0.5 + 10/D^0.1 is fitted exactly without a constraint (E = −0.5); with E ≥ 0 the fit has E = 0
    toks = [1e3 * 4 ** k for k in range(6)]
    ys = [-0.5 + 10 / t ** 0.1 for t in toks]
    law = fit_scaling_law(toks, ys)
    assert law.E == 0.0 and law.B > 0 and law.beta > 0.1  # a steeper power law replaces the negative offset
    assert law.predict(1e12) > 0
    with pytest.raises(ScalingLawError, match="loss at 4000 tokens is nan"):
        fit_scaling_law([1e3, 4e3, 1.6e4], [3.0, float("nan"), 2.0])
    with pytest.raises(ScalingLawError, match="is -1"):
        fit_scaling_law([1e3, 4e3, 1.6e4], [3.0, 2.0, -1.0])
    with pytest.raises(ScalingLawError, match="domain 'zh': scaling-law fit failed"):
        predict_targets([(1e3, {"en": 3.0, "zh": 3.0}), (4e3, {"en": 2.0, "zh": 2.0}),
                         (1.6e4, {"en": 1.5, "zh": -1.0})], 1e6)


def test_sigma_stopping_on_a_synthetic_loss_curve():
    # L(D) = 2 + 100/√D: at the checkpoints D = 1e4, 4e4, 1.6e5, 6.4e5 the losses are 3.0, 2.5, 2.25,
    # 2.125, and the target at the real run's 1e6 tokens is 2 + 100/1000 = 2.1.
    curve = [(1e4, 3.0), (4e4, 2.5), (1.6e5, 2.25), (6.4e5, 2.125)]
    est = TargetEstimator(budget_tokens=1e6, sigma=1e-3)
    stops = [est.add(t, {"d": v}) for t, v in curve]
    # no previous checkpoint set before the 4th; at the 4th both sets predict 2.1: moved < σ → stop
    assert stops == [False, False, False, True]
    assert est.targets["d"] == pytest.approx(2.1, abs=1e-4) and est.history[0][0] == 4
    # the same curve whose 4th loss falls off the law (2.0 instead of 2.125): the prediction moves
    # by more than σ between the sets {1..3} (still 2.1) and {1..4}, so collection continues
    est = TargetEstimator(budget_tokens=1e6, sigma=1e-3)
    stops = [est.add(t, {"d": v}) for t, v in [*curve[:3], (6.4e5, 2.0)]]
    assert stops == [False, False, False, False] and est.change > 1e-3
    # then points that follow the new fit make the prediction settle
    law = est.laws["d"]
    assert est.add(2.56e6, {"d": law.predict(2.56e6)}) is True


def test_epoch_weights_reproduce_domain_upsampling_table_2():
    # Table 2 (1T tokens): small CC 367.0B at 0.5 epochs (734B of data), domain 71.7B at 0.5 (143.4B),
    # code 217.8B at 1 epoch (217.8B); large CC fills the rest: 1 − 0.367 − 0.0717 − 0.2178 = 0.3435
    sizes = {"small_cc": 734e9, "domain": 143.4e9, "code": 217.8e9, "large_cc": 2321e9}
    w = epoch_weights({"small_cc": 0.5, "domain": 0.5, "code": 1.0}, sizes, 1e12, fill="large_cc")
    assert w == pytest.approx({"small_cc": 0.367, "domain": 0.0717, "code": 0.2178, "large_cc": 0.3435}, abs=1e-12)
    # large CC is then seen 343.5B / 2321B = 0.148 times, as in the table
    assert w["large_cc"] * 1e12 / sizes["large_cc"] == pytest.approx(0.148, abs=5e-4)
    with pytest.raises(ValueError, match="more than the budget"):
        epoch_weights({"small_cc": 2.0}, sizes, 1e12, fill="large_cc")
    with pytest.raises(ValueError, match="'nope'"):
        epoch_weights({"nope": 1.0}, sizes, 1e12, fill="large_cc")


def test_schedule_phases_and_decay_types():
    # the paper's CPT recipe: 1e-7 → 1e-5 linear warmup, then constant
    s = make_schedule(1e-5, 100, warmup=10, init_lr=1e-7)
    assert s.lr(0) == pytest.approx(1e-7)
    assert s.lr(5) == pytest.approx(1e-7 + (1e-5 - 1e-7) * 0.5)
    assert s.lr(10) == s.lr(99) == pytest.approx(1e-5)
    # fractions: warmup 0.1 → 10 steps, decay 0.2 → last 20 steps (starting at step 80)
    kw = dict(peak_lr=1.0, total_steps=100, warmup=0.1, decay=0.2, min_lr_ratio=0.1)
    assert lr_at(50, **kw) == 1.0
    assert lr_at(90, decay_type="linear", **kw) == pytest.approx(1.0 - 0.9 * 0.5)
    assert lr_at(90, decay_type="cosine", **kw) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(85, decay_type="1-sqrt", **kw) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(90, decay_type="exponential", **kw) == pytest.approx(0.1 ** 0.5)
    assert lr_at(100, decay_type="cosine", **kw) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="decay_type"):
        make_schedule(1.0, 10, decay_type="step")
    with pytest.raises(ValueError, match="exceed"):
        make_schedule(1.0, 10, warmup=8, decay=5)


def test_weighted_loss_se_hand_computed():
    from cptkit.models.scoring import weighted_loss_se

    # docs (summed NLL, tokens) = (2, 1), (6, 2), (3, 1): L = 11/4 = 2.75; s − n·L = −0.75, 0.5, 0.25;
    # squares 0.5625 + 0.25 + 0.0625 = 0.875; × k/(k−1) = 1.5 → 1.3125; sqrt = 1.145644; / 4 tokens = 0.286411
    assert weighted_loss_se([(2.0, 1), (6.0, 2), (3.0, 1)]) == pytest.approx(0.286411, abs=1e-6)
    assert weighted_loss_se([(2.0, 1), (4.0, 2)]) == 0.0  # every doc at the mean
    assert math.isnan(weighted_loss_se([(2.0, 1), (5.0, 0)]))  # one scored doc: no SE


def test_plan_read_finds_a_prefix_that_misses_its_shares():
    """A staged run reads the plan's rows in order: a prefix of a randomly interleaved plan, or of a
    plan whose last stage is a tail, holds other shares than its stages give it."""
    from cptkit.mixtures.stages import RunStage, plan_read

    doms = ["domain", "zh", "general"]
    plan = [2, 2, 2, 2, 1, 0, 0, 0, 0, 0] + [0, 0, 0, 0, 0, 0, 0, 1, 1, 1]  # 12 domain, 4 zh, 4 general
    one = [RunStage("cpt", 0, 10, {"domain": 0.6, "zh": 0.2, "general": 0.2})]
    r = plan_read(plan, doms, one, 10)  # the first 10 rows: 5 domain, 1 zh, 4 general
    assert r["read"] == pytest.approx({"domain": 0.5, "zh": 0.1, "general": 0.4})
    assert r["nominal"] == pytest.approx({"domain": 0.6, "zh": 0.2, "general": 0.2})
    assert r["worst"] == "general" and r["gap"] == pytest.approx(0.2) and r["planned"] == 20
    whole = plan_read(plan, doms, [RunStage("cpt", 0, 20, {"domain": 0.6, "zh": 0.2, "general": 0.2})], 20)
    assert whole["gap"] == pytest.approx(0.0)  # the whole plan holds its shares exactly
    # main (domain only) then a tail (general only); a run of half the plan never reaches the tail
    tail_plan = [0] * 16 + [2] * 4
    stages = [RunStage("main", 0, 8, {"domain": 1.0, "zh": 0.0, "general": 0.0}),
              RunStage("tail", 8, 10, {"domain": 0.0, "zh": 0.0, "general": 1.0})]
    half = plan_read(tail_plan, doms, stages, 10)
    assert half["read"]["general"] == 0.0 and half["nominal"]["general"] == pytest.approx(0.2)
    assert half["gap"] == pytest.approx(0.2)
    # a run longer than the plan wraps round it
    assert plan_read([0, 2], doms, [RunStage("cpt", 0, 3, {"domain": 0.5, "zh": 0.0, "general": 0.5})], 3)["read"] \
        == pytest.approx({"domain": 2 / 3, "zh": 0.0, "general": 1 / 3})
