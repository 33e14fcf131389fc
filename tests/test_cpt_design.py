"""The CPT design end to end at toy size, on the CPU: bench/gpu/cpt_smollm2.sh TOY=1 runs `make
cpt-experiment`: B0 (re-adapted, cached by content, its levelling-off check), the probe it writes,
the four arms from B0, every model on the same documents, and the claims decided from the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _eval_model import make_tiny
from conftest import write_jsonl

from cptkit.training.b0 import levelled

ROOT = Path(__file__).resolve().parent.parent


def _marked(d: Path, records: list[dict]) -> None:
    write_jsonl(d / "part-00000.jsonl", records)
    (d / "_SUCCESS").write_text("")


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
    assert len(tokens) >= 3 and {k: b0[k] for k in levelled(tokens, losses, 0.02)} == levelled(tokens, losses, 0.02)
    probe = [json.loads(x) for x in (xp / "probe.jsonl").read_text().splitlines()]
    assert len(probe) == 4 and {p["domain"] for p in probe} == {"probe"}
    # every arm started from B0: its manifest names B0's model, and the token-matched arm ran 0.8 x the steps
    for arm, steps in (("noreplay", 4), ("replay", 4), ("noreplay_tm", 3), ("neutral", 4)):
        man = json.loads((xp / "runs" / f"{arm}_s1" / "_manifest.json").read_text())
        assert man["config"]["model"]["path"] == str(xp / "b0" / "model")
        assert man["config"]["train"]["max_steps"] == steps
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
