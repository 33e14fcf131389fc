"""The forgetting probe: a model's own samples, seeded, on which the model itself is the best scorer."""

from __future__ import annotations

import json
import subprocess
import sys

from _eval_model import make_tiny

from cptkit.eval.probe import probe_records, sample_texts
from cptkit.models import tiny


def test_probe_is_seeded_and_follows_its_writer(tmp_path):
    import torch

    _, tok, model = make_tiny(tmp_path / "writer", seed=11)
    a = sample_texts(model, tok, docs=24, tokens=24, seed=3, batch=8)
    assert a == sample_texts(model, tok, docs=24, tokens=24, seed=3, batch=8)
    assert a != sample_texts(model, tok, docs=24, tokens=24, seed=4, batch=8)
    recs = probe_records(a)
    assert {r["domain"] for r in recs} == {"probe"} and len({r["id"] for r in recs}) == len(recs) >= 20
    # the samples follow the writer's distribution: make one token all but certain, and it fills the texts
    target = tok.convert_tokens_to_ids(tok.tokenize(" the"))[0]
    biased = tiny.tiny_llama(tok, hidden=64, layers=2, heads=4, max_position=2048, seed=11)
    with torch.no_grad():
        biased.lm_head.weight.zero_()
    logits_bias = torch.zeros(len(tok))
    logits_bias[target] = 50.0
    biased.lm_head.register_forward_hook(lambda _m, _i, out: out + logits_bias)
    texts = sample_texts(biased, tok, docs=4, tokens=10, seed=0, batch=4)
    assert all(t.split() == ["the"] * 10 for t in texts), texts


def test_probe_command_writes_records_and_refuses_bad_sizes(tmp_path):
    d, _, _ = make_tiny(tmp_path / "m")
    out = tmp_path / "probe.jsonl"
    cmd = [sys.executable, "-m", "cptkit.cli", "probe", "--model", str(d), "--out", str(out), "--tokens", "8"]
    r = subprocess.run([*cmd, "--docs", "5"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 5 and all(x["text"] for x in rows)
    r = subprocess.run([*cmd, "--docs", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == "error: --docs and --tokens must be positive"
