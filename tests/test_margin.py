"""The preference margin and its pairs: summed log-probabilities against a direct torch computation,
pairs rebuilt exactly from corrupt's edits, the split disjoint, the output read by the aggregator."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _eval_model import make_tiny
from test_corrupt import LEX, toks

from cptkit.core.errors import CptkitError
from cptkit.eval import margin, pairs
from cptkit.eval.reproduce import Claim, member_point
from cptkit.synthetic.corruption import corrupt_text

ROOT = Path(__file__).resolve().parent.parent


def direct_logp(model, tok, text: str) -> tuple[float, int]:
    """log p(text) summed over its tokens, the first predicted from BOS: plain torch, no batching."""
    import torch

    ids = tok.encode(text, add_special_tokens=False)
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    inp = torch.tensor([[bos] + ids[:-1]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=inp).logits[0].double(), dim=-1)
    return float(logp[torch.arange(len(ids)), torch.tensor(ids)].sum()), len(ids)


def test_margin_is_the_summed_log_probability_difference(tmp_path):
    _, tok, model = make_tiny(tmp_path / "m")
    rows = [{"id": "a", "clean": "The copyright holder is 2 people.", "corrupted": "The copyright holder is 7 people.",
             "types": ["number"]},
            {"id": "b", "clean": "Permission is granted to copy this file.",
             "corrupted": "Permission is denied to copy this specific file.", "types": ["adj"]},
            {"id": "c", "clean": "See the license for more details.",
             "corrupted": "See the licence for fewer details.", "types": ["noun", "adj"]}]
    got = margin.pair_margins(model, tok, rows, batch_size=2)  # batched, padded: must not change a number
    for r, g in zip(rows, got, strict=True):
        lc, nc = direct_logp(model, tok, r["clean"])
        lx, nx = direct_logp(model, tok, r["corrupted"])
        assert (g["tokens_clean"], g["tokens_corrupted"]) == (nc, nx)
        assert g["logp_clean"] == pytest.approx(lc, abs=1e-4) and g["logp_corrupted"] == pytest.approx(lx, abs=1e-4)
        assert g["margin"] == pytest.approx(lc - lx, abs=2e-4)
    assert got[1]["tokens_clean"] != got[1]["tokens_corrupted"]  # an unequal-length pair is kept and counted
    rep = margin.margin_report(got)
    ms = [lc - lx for lc, lx in ((direct_logp(model, tok, r["clean"])[0], direct_logp(model, tok, r["corrupted"])[0])
                                 for r in rows)]
    mean = sum(ms) / 3
    se = (sum((m - mean) ** 2 for m in ms) / 2 / 3) ** 0.5
    assert rep["mean_margin"] == pytest.approx(mean, abs=2e-4) and rep["se"] == pytest.approx(se, abs=2e-4)
    equal = [g["margin"] for g in got if g["tokens_clean"] == g["tokens_corrupted"]]
    assert rep["unequal_length"] == 3 - len(equal) and rep["equal_length"]["n"] == len(equal)
    assert rep["by_type"]["adj"]["n"] == 2 and rep["by_type"]["number"]["n"] == 1


def test_margin_command_writes_a_member_the_aggregator_reads(tmp_path):
    d, _, _ = make_tiny(tmp_path / "m")
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps({"id": str(i), "clean": f"There are {i} files in the archive.",
                                     "corrupted": f"There are {i + 3} files in the archive.", "types": ["number"]}) + "\n"
                         for i in range(4)))
    out = tmp_path / "v2" / "corruption" / "c0.3_s1"
    cmd = [sys.executable, "-m", "cptkit.cli", "margin", "--model", str(d), "--pairs", str(p), "--out", str(out)]
    r = subprocess.run([*cmd, "--meta", "ratio=0.3", "--meta", "seed=1", "--threads", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "_margin.json").read_text())
    assert res["pairs"] == 4 and len(res["per_pair"]) == 4
    claim = Claim(id="c", title="t", source="s", quote="q", command="c", members="v2/corruption/*", axis="ratio",
                  seed="seed", metrics={"margin": {"file": "_margin.json", "path": ["mean_margin"]}})
    x, s, v = member_point(out, claim)
    assert (x, s) == (0.3, 1) and v["margin"] == pytest.approx(res["mean_margin"])
    # a pair that is no pair, and a seed label the model's own run contradicts, are refused
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x", "clean": "Same text here.", "corrupted": "Same text here."}) + "\n")
    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "margin", "--model", str(d), "--pairs", str(bad),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and "the same text" in r.stderr
    run_dir = tmp_path / "run"
    (run_dir / "model").mkdir(parents=True)
    (run_dir / "_manifest.json").write_text(json.dumps({"config": {"seed": 2}}))
    with pytest.raises(CptkitError, match="trained with seed=2"):
        margin.check_seed(str(run_dir / "model"), {"seed": 1})


DOC = ("Chlorine and chlorine: 2 tanks of equal size hold 17 L. These tanks are equal in volume and weight.\n\n"
       "The valve opens at 3 bar. Short line. Tanks of chlorine must be stored cool, and they are equal.")
TAGS = {"Chlorine": ("NN", "chlorine"), "chlorine": ("NN", "chlorine"), "tanks": ("NNS", "tank"),
        "Tanks": ("NNS", "tank"), "equal": ("JJ", "equal")}


def corrupted_record(doc_id: str, text: str, seed: int, ratio: float = 1.0) -> dict:
    new, rep = corrupt_text(text, ratio, random.Random(seed), toks(text, TAGS), LEX)
    return {"id": doc_id, "text": new, "corruption": {"edits": [{"field": "text", **e} for e in rep["edits"]]}}


def test_pairs_rebuild_the_corrupted_text_and_hold_every_edited_sentence():
    for seed in range(20):
        bad = corrupted_record("d", DOC, seed)
        repl = pairs.replacements(DOC, bad["text"], bad["corruption"]["edits"])
        assert repl is not None and pairs.apply(DOC, 0, repl) == bad["text"], seed
        # a corrupted text that the edits do not explain is refused, not paired
        assert pairs.replacements(DOC, bad["text"] + "x", bad["corruption"]["edits"]) is None
    spans = pairs.sentence_spans(DOC)
    assert [DOC[a:b] for a, b in spans][:2] == ["Chlorine and chlorine: 2 tanks of equal size hold 17 L.",
                                                "These tanks are equal in volume and weight."]
    got, stats = pairs.make_pairs([{"id": "d", "text": DOC}], [corrupted_record("d", DOC, 3)], n=4, seed=0)
    assert stats["candidate pairs"] == 4  # every sentence but "Short line." (no edit, 2 words)
    assert all(p["clean"] != p["corrupted"] and p["doc"] == "d" for p in got)
    first = next(p for p in got if p["id"] == "d#0")
    assert re.fullmatch(r"(Neon|Oxygen) and (neon|oxygen): \d boxes of unequal size hold \d\d L\.", first["corrupted"])
    assert first["types"] == ["adj", "noun", "number"]
    with pytest.raises(CptkitError, match="4 sentence pairs .* fewer than the 5 asked"):
        pairs.make_pairs([{"id": "d", "text": DOC}], [corrupted_record("d", DOC, 3)], n=5, seed=0)


def test_pairs_are_drawn_with_the_seed_and_split_is_disjoint():
    docs = [{"id": f"d{i}", "text": DOC.replace("17", str(20 + i)), "lang": "en", "topic": "t"} for i in range(12)]
    bad = [corrupted_record(d["id"], d["text"], 7) for d in docs]
    a, _ = pairs.make_pairs(docs, bad, n=10, seed=0)
    assert a == pairs.make_pairs(docs, bad, n=10, seed=0)[0] and a != pairs.make_pairs(docs, bad, n=10, seed=1)[0]
    recs = docs + [{"id": "zh", "text": "中文", "lang": "zh", "topic": "t"}, {"id": "x", "text": DOC, "lang": "en"}]
    held, train = pairs.split_domain(recs, seed=0, heldout_docs=4, train_chars=500)
    assert len(held) == 4 and not {r["id"] for r in held} & {r["id"] for r in train}
    assert {r["id"] for r in held + train} <= {d["id"] for d in docs}  # the domain only: English with a topic
    held1, _ = pairs.split_domain(recs, seed=1, heldout_docs=4, train_chars=500)
    assert held1 != held
    with pytest.raises(CptkitError, match="fewer than --train-chars"):
        pairs.split_domain(recs, seed=0, heldout_docs=4, train_chars=10**6)
