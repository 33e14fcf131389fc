"""A trained model a user can use: it reloads to the same loss, exports to GGUF, and llama.cpp runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

from cptkit.core.config import compose_step
from cptkit.models import lm, scoring
from cptkit.models.gguf import permute_qk

HAS_LLAMACPP = importlib.util.find_spec("llama_cpp") is not None
TOY = ["model.hidden=48", "model.layers=2", "model.heads=4", "model.kv_heads=2", "train.micro_batch=4",
       "train.threads=1", "train.lr=3e-3", "train.warmup=2", "train.precision=fp32", "quiet=true"]


def train(stream: Path, out: Path, *overrides: str) -> dict:
    from cptkit.steps.train import run

    return run(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", *overrides]))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cptkit.cli", *args], capture_output=True, text=True)


def eval_records(stream: Path) -> list[dict]:
    from cptkit.mixtures.stream import Stream

    return Stream(stream).eval_records()


@pytest.fixture(scope="module")
def trained(corpus_dir, corpus_records, tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("export")
    tok = make_tokenizer(corpus_records, base / "tok")
    stream = base / "stream"
    build_stream(corpus_dir, tok, stream, [*TWO_DOMAINS, "mix.budget_tokens=20000", "mix.seq_len=64",
                                           "mix.eval_docs=4"])
    train(stream, base / "run", *TOY, "train.max_steps=12", "train.eval_every=6", "train.eval_docs=4")
    return stream, base / "run"


def test_permute_qk_matches_llama_cpp_layout():
    # one head of dim 4: HF rows (r0 r1 | r2 r3) are rotate-half pairs (r0,r2), (r1,r3); GGML wants them adjacent
    w = np.arange(8, dtype=np.float32).reshape(4, 2)
    assert permute_qk(w, 1)[:, 0].tolist() == [0, 4, 2, 6]
    # two heads permute independently
    w2 = np.arange(8, dtype=np.float32).reshape(8, 1)
    assert permute_qk(w2, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_saved_model_reloads_to_the_logged_loss(trained):
    """train → save → from_pretrained: the held-out loss equals the one logged at the last step (1e-5)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stream, run = trained
    last = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"eval_loss"' in x][-1]
    model = AutoModelForCausalLM.from_pretrained(run / "model")
    tok = AutoTokenizer.from_pretrained(run / "model")
    res = scoring.group_losses(model, tok, eval_records(stream), group_by="domain", max_docs_per_group=4,
                               max_length=64, max_tokens=256)
    got = {d: v["loss"] for d, v in res.items()}
    assert got.keys() == last["eval_loss"].keys()
    for d, loss in last["eval_loss"].items():
        assert got[d] == pytest.approx(loss, abs=1e-5), (d, got[d], loss)


def test_gguf_export_loads_with_the_same_logits(trained, tmp_path):
    """export-gguf (f32) → transformers reads the GGUF back: the same logits; f16/q8_0 stay close."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stream, run = trained
    out = tmp_path / "m.gguf"
    r = cli("export-gguf", "--model", str(run / "model"), "--out", str(out), "export.dtype=f32", "-q")
    assert r.returncode == 0, r.stderr
    model = AutoModelForCausalLM.from_pretrained(run / "model")
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(run / "model")
    ids = torch.tensor([tok.encode(eval_records(stream)[0]["text"])[:48]])
    with torch.no_grad():
        a, b = model(ids).logits, back(ids).logits
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    gtok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)  # the tokenizer travels in the file
    assert gtok.encode("def main(): return 42") == tok.encode("def main(): return 42")
    for dtype, tol in (("f16", 0.05), ("q8_0", 0.5)):
        q = tmp_path / f"m-{dtype}.gguf"
        assert cli("export-gguf", "--model", str(run / "model"), "--out", str(q), f"export.dtype={dtype}", "-q").returncode == 0
        assert q.stat().st_size < out.stat().st_size
        back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=q.name, dtype=torch.float32)
        with torch.no_grad():
            assert (back(ids).logits - a).abs().max() < tol, dtype


@pytest.mark.skipif(not HAS_LLAMACPP, reason="llama-cpp-python not installed (make install builds it)")
def test_llama_cpp_runs_the_export_with_the_same_logits(trained, tmp_path):
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stream, run = trained
    out = tmp_path / "m.gguf"
    assert cli("export-gguf", "--model", str(run / "model"), "--out", str(out), "export.dtype=f32", "-q").returncode == 0
    tok = AutoTokenizer.from_pretrained(run / "model")
    text = eval_records(stream)[0]["text"]
    ids = tok.encode(text)[:32]
    llm = Llama(model_path=str(out), n_ctx=64, logits_all=True, verbose=False, seed=0, n_threads=1)
    assert llm.tokenize(text.encode(), add_bos=False, special=False)[:16] == ids[:16]  # same tokenizer
    llm.eval(ids)
    got = np.array(llm.scores[: len(ids)])
    model = AutoModelForCausalLM.from_pretrained(run / "model")
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(got - want).max() < 1e-3, np.abs(got - want).max()  # RoPE layout and weights agree
    assert llm.create_completion(text[:40], max_tokens=8, temperature=0.0)["choices"][0]["text"] is not None


@pytest.mark.slow(minutes=2)
def test_smollm2_continued_learns_the_text_still_generates_and_exports(corpus_dir, smollm2, tmp_path):
    """SmolLM2-135M as shipped, continued 6 steps on Python documentation: the loss on the trained text
    falls, the model still writes English, and its GGUF (tokenizer copied from the shipped file) loads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stream = tmp_path / "stream"
    build_stream(corpus_dir, "smollm2", stream, ["mix.domains=[{name:en,filter:{source:python-docs}}]",
                                                 "mix.stages=[{name:main,weights:{en:1}}]", "mix.fill=null",
                                                 "mix.budget_tokens=1536", "mix.seq_len=128", "mix.eval_docs=2"])
    from cptkit.mixtures.stream import Stream

    s = Stream(stream)
    first = s.sequence(int(s.plan[0, 0]), int(s.plan[0, 1]))  # a sequence of the plan: trained on
    out = tmp_path / "run"
    train(stream, out, "model=hf", "model.path=smollm2", "train.max_steps=6", "train.micro_batch=2",
          "train.lr=1e-4", "train.warmup=0", "train.precision=fp32", "train.save_initial=true", "quiet=true")
    tok = AutoTokenizer.from_pretrained(out / "model")
    ids = torch.tensor([first.tolist()])
    init = AutoModelForCausalLM.from_pretrained(out / "model_init")
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    with torch.no_grad():
        before = init(ids, labels=ids).loss.item()
        after = model(ids, labels=ids).loss.item()
    assert after < before - 0.05, (before, after)  # it learned the text it was trained on
    gen = scoring.generate_until(model, tok, ["The capital of France is"], max_gen_toks=8, max_length=128)
    assert any(c.isalpha() for c in gen[0]), gen  # and still writes words
    gguf = tmp_path / "cpt.gguf"
    r = cli("export-gguf", "--model", str(out / "model"), "--out", str(gguf), "export.dtype=f16",
            "export.tokenizer_from=smollm2", "-q")
    assert r.returncode == 0, r.stderr
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        assert abs(back(ids, labels=ids).loss.item() - after) < 0.01  # f16: the trained model, not the start


def test_gguf_cache_loads_bit_identical_and_follows_the_file(trained, tmp_path, monkeypatch):
    """A GGUF loaded through cptkit is converted once into $CPTKIT_CACHE/gguf: the cached folder gives
    the same tokens and bit-identical weights as dequantizing in place, and a changed file gets a new entry."""
    from cptkit.models import gguf_cache

    stream, run = trained
    q = tmp_path / "m.gguf"
    assert cli("export-gguf", "--model", str(run / "model"), "--out", str(q), "export.dtype=q8_0", "-q").returncode == 0
    monkeypatch.setenv("CPTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CPTKIT_GGUF_CACHE", "0")
    direct, dtok = lm.load_causal_lm(str(q)), lm.load_tokenizer(str(q))
    assert not (tmp_path / "cache" / "gguf").exists()
    monkeypatch.setenv("CPTKIT_GGUF_CACHE", "1")
    cached, ctok = lm.load_causal_lm(str(q)), lm.load_tokenizer(str(q))
    [entry] = (tmp_path / "cache" / "gguf").iterdir()
    assert (entry / gguf_cache.DONE).exists() and lm.resolve_loadable(str(q)) == (str(entry), None)
    assert getattr(cached, "hf_quantizer", None) is None  # an ordinary model: save_pretrained works
    a, b = direct.state_dict(), cached.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    text = eval_records(stream)[0]["text"]
    assert ctok.encode(text) == dtok.encode(text) and ctok.pad_token_id == dtok.pad_token_id
    f16 = tmp_path / "f16.gguf"
    assert cli("export-gguf", "--model", str(run / "model"), "--out", str(f16), "export.dtype=f16", "-q").returncode == 0
    f16.replace(q)  # the same path, other weights: a new cache entry, never the stale one
    assert lm.resolve_loadable(str(q))[0] != str(entry)
    assert len(list((tmp_path / "cache" / "gguf").iterdir())) == 2
    # `cptkit convert-model SPEC` (make demo's base-model): converts, prints the folder
    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "convert-model", str(q)], capture_output=True, text=True,
                       env={**os.environ, "CPTKIT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0 and r.stdout.strip() == lm.resolve_loadable(str(q))[0], r.stderr[-500:]
    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "convert-model", str(tmp_path / "none.gguf")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
