"""The CPT design end to end at toy size, on the CPU: bench/gpu/cpt_smollm2.sh TOY=1 runs `make
cpt-experiment`: B0 (re-adapted, cached by content, its levelling-off check), the probe it writes,
the four arms from B0, every model on the same documents, and the claims decided from the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from _eval_model import make_tiny
from conftest import write_jsonl

from cptkit.training.b0 import levelled

ROOT = Path(__file__).resolve().parent.parent


def _plan_counts(stream: Path) -> dict[str, int]:
    """Sequences per domain in a stream's whole plan (what ``train.mixture=staged`` draws, in order)."""
    from cptkit.mixtures.stream import Stream

    st = Stream(stream)
    return dict(Counter(st.domains[int(d)] for d in st.plan[:, 0]))


def _marked(d: Path, records: list[dict]) -> None:
    write_jsonl(d / "part-00000.jsonl", records)
    (d / "_SUCCESS").write_text("")


# B0's held-out curve on 2 CPU cores, 96 steps of 4 x 256 tokens (docs/cpt.md, 2026-11-28): tokens, loss
B0_RUN1 = [(0, 4.555), (8192, 4.3564), (16384, 4.1409), (24576, 4.0834), (32768, 4.0265), (40960, 3.9985),
           (49152, 3.9836), (57344, 3.9628), (65536, 3.9573), (73728, 3.9423), (81920, 3.9286), (90112, 3.9163),
           (98304, 3.9084)]


def test_levelled_reads_the_rate_over_the_last_third_carried_over_one_arm():
    t, x = [float(a) for a, _ in B0_RUN1], [b for _, b in B0_RUN1]
    full = levelled(t, x, 0.01, 5120)  # last third: 65,536 -> 98,304, fell 0.0489
    assert full["from_tokens"] == 65536 and full["fall"] == pytest.approx(0.0489)
    assert full["drift"] == pytest.approx(0.0489 / 32768 * 5120) and full["levelled"]
    at64 = levelled(t[:9], x[:9], 0.01, 5120)  # 40,960 -> 65,536: 0.0412 over 24,576 tokens
    assert at64["drift"] == pytest.approx(0.0412 / 24576 * 5120) and at64["levelled"]
    at48 = levelled(t[:7], x[:7], 0.01, 5120)  # 32,768 -> 49,152: 0.0429 over 16,384 tokens, 0.0134 per arm
    assert at48["drift"] == pytest.approx(0.0429 / 16384 * 5120) and not at48["levelled"]
    # a steady slope gives the same verdict at every length (the fall over the last third would grow)
    line = [4.0 - 1e-6 * k * 8192 for k in range(40)]
    grid = [k * 8192.0 for k in range(40)]
    drifts = [levelled(grid[:n], line[:n], 0.01, 5120)["drift"] for n in (10, 25, 40)]
    assert drifts == pytest.approx([1e-6 * 5120] * 3)
    with pytest.raises(Exception, match="fewer than 3"):
        levelled(t[:2], x[:2], 0.01, 5120)


@pytest.mark.slow(minutes=8)
def test_cpt_design_at_toy_size_through_make(corpus_records, tmp_path):
    model, _, _ = make_tiny(tmp_path / "tiny")
    data = tmp_path / "data"
    en = [r for r in corpus_records if r["lang"] == "en"]
    zh = [r for r in corpus_records if r["lang"] == "zh"]
    _marked(data / "labelled", [{**r, "topic": "t"} for r in en[:60]])
    _marked(data / "corpus", en[:200] + zh[:40])
    _marked(data / "b0_text", [{**r, "id": f"b0-{i}"} for i, r in enumerate(en[200:300])])
    _marked(data / "outside", [{"id": f"o-{i}", "text": r["text"], "domain": "outside"} for i, r in enumerate(en[300:310])])
    venv = Path(sys.executable).parent.parent
    old = [f"-o {data}/{d}/_SUCCESS" for d in ("labelled", "corpus", "b0_text", "outside")]
    env = {**os.environ, "TOY": "1", "DATA": str(data), "XP": str(data / "xp"), "SEEDS": "0 1",
           "CPTKIT_CACHE": str(tmp_path / "cache"),
           "MAKE_ARGS": " ".join([*old, f"VENV={venv}", f"-o {venv}/.installed", "--no-print-directory"])}
    r = subprocess.run(["bash", "bench/gpu/cpt_smollm2.sh", str(model)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    xp = data / "xp"
    b0 = json.loads((xp / "b0.json").read_text())
    assert (xp / "b0").is_symlink() and Path(b0["path"]).parent == tmp_path / "cache" / "b0"
    # the levelling-off verdict is the pure function's on the recorded curve
    tokens, losses = [t for t, _ in b0["curve"]], [x for _, x in b0["curve"]]
    assert len(tokens) >= 3 and {k: b0[k] for k in levelled(tokens, losses, 0.01, 512)} == levelled(tokens, losses, 0.01, 512)
    probe = [json.loads(x) for x in (xp / "probe.jsonl").read_text().splitlines()]
    assert len(probe) == 4 and {p["domain"] for p in probe} == {"probe"}
    # every arm started from B0: its manifest names B0's model, and the token-matched arm ran 0.8 x the steps
    for arm, steps in (("noreplay", 4), ("replay", 4), ("noreplay_tm", 3), ("neutral", 4)):
        man = json.loads((xp / "runs" / f"{arm}_s1" / "_manifest.json").read_text())
        assert man["config"]["model"]["path"] == str(xp / "b0" / "model")
        assert man["config"]["train"]["max_steps"] == steps
        assert "plan read" not in json.dumps(man)  # it read its stream's whole plan: no share gap to report
    # each arm's stream is planned for exactly what the arm trains (4 or 3 steps of 2 sequences), so the
    # shares hold over it: the replay arm replays 20% (1.6 of 8 sequences, rounded), and the token-matched
    # arm trains on the replay arm's domain and Chinese sequences, in fewer steps
    for s in (0, 1):
        drawn = {k: _plan_counts(xp / f"stream_{k}_s{s}") for k in ("r0", "rp", "tm", "gen")}
        assert [sum(drawn[k].values()) for k in ("r0", "rp", "tm", "gen")] == [8, 8, 6, 8], drawn
        assert drawn["rp"]["general"] == 2 and drawn["r0"].get("general", 0) == 0, drawn
        assert {k: drawn["tm"].get(k, 0) for k in ("domain", "zh")} == {k: drawn["rp"][k] for k in ("domain", "zh")}
        assert set(drawn["gen"]) == {"general"}
    res = json.loads((xp / "eval" / "neutral_s0" / "_results.json").read_text())
    assert {"domain", "zh", "general", "probe", "outside"} <= set(res["perplexity"]["groups"])
    table = (xp / "cpt.md").read_text()
    assert "| b0 | 2 |" in table and "| noreplay_tm − b0 | 2 |" in table and "(not the baseline)" in table
    for claim in ("domain_gain", "forgetting", "replay", "neutral"):
        assert f"- **{claim}**:" in table
    # two seeds: every claim is testable (1 df) and decided over the family of four
    assert table.count("Holm over 4") == 4 and "not testable here" not in table
    # B0 is cached by content: a second experiment dir links the same B0 without training it again
    r2 = subprocess.run([sys.executable, "-m", "cptkit.training.b0", "--base", str(model), "--stream",
                         str(xp / "b0_stream"), "--link", str(tmp_path / "again"), "--",
                         *b0["overrides"]], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r2.returncode == 0 and "cached at" in r2.stderr, r2.stderr[-2000:]
    assert (tmp_path / "again").resolve() == Path(b0["path"]).resolve()
