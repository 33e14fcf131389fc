"""Remedies for forgetting (docs/forgetting.md): replay sources (a path, the base's own samples) in
build-mix, and distillation to the base in train (teacher forward and stored top-k)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.models import tiny

COMMON = ["model.hidden=32", "model.layers=1", "model.heads=2", "train.micro_batch=4", "train.threads=1",
          "train.lr=3e-3", "train.warmup=2", "train.precision=fp32", "quiet=true"]
MIX = [*TWO_DOMAINS, "mix.seq_len=32", "mix.eval_docs=2", "mix.budget_tokens=12000"]


@pytest.fixture(scope="module")
def base(corpus_records, tmp_path_factory) -> Path:
    """A tiny Llama saved with its tokenizer (vocabulary 512): the base that writes self samples."""
    d = tmp_path_factory.mktemp("remedies") / "base"
    tok = make_tokenizer(corpus_records, d)
    from transformers import AutoTokenizer

    model = tiny.tiny_llama(AutoTokenizer.from_pretrained(d), hidden=32, layers=1, heads=2, max_position=256, seed=5)
    model.save_pretrained(d)
    return tok


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cptkit-cache")


def load(d: Path):
    from cptkit.models.lm import load_causal_lm, load_tokenizer

    return load_causal_lm(str(d)), load_tokenizer(str(d))


def train(stream: Path, out: Path, *overrides: str) -> dict:
    from cptkit.steps.train import run

    return run(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", *COMMON, *overrides]))


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def extra(out: Path) -> dict:
    return json.loads((out / "_manifest.json").read_text())["extra"]


def steps(out: Path) -> list[dict]:
    return [r for r in metrics(out) if "loss" in r]


# --- self samples -------------------------------------------------------------------------------
def test_self_samples_are_seeded_and_disjoint_from_the_probe(base):
    from cptkit.eval.probe import sample_texts
    from cptkit.models.self_samples import batch_seed, sample_from_bos

    model, tok = load(base)
    a = sample_from_bos(model, tok, docs=20, max_tokens=12, seed=3)
    assert a == sample_from_bos(model, tok, docs=20, max_tokens=12, seed=3)
    assert [s["text"] for s in a] != [s["text"] for s in sample_from_bos(model, tok, docs=20, max_tokens=12, seed=4)]
    # the one sampler (the probe's too) draws what transformers' ancestral sampling draws from BOS with the
    # same seed: the probe files written before it (with model.generate) stay the same texts ...
    probe = sample_texts(model, tok, docs=20, tokens=12, seed=3)
    ref = []
    for start in range(0, 20, 16):
        torch.manual_seed(3 * 1_000_003 + start)
        ids = torch.full((min(16, 20 - start), 1), tok.bos_token_id, dtype=torch.long)
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                 top_k=0, top_p=1.0, max_new_tokens=12, min_new_tokens=1, pad_token_id=tok.eos_token_id)
        ref += [tok.decode(row[1:], skip_special_tokens=True).strip() for row in gen.tolist()]
    assert probe == ref
    # ... and its own seed namespace makes them other texts at every seed
    for seed in (0, 3):
        own = {s["text"] for s in sample_from_bos(model, tok, docs=20, max_tokens=12, seed=seed)}
        assert not own & set(sample_texts(model, tok, docs=20, tokens=12, seed=seed))
        assert {batch_seed(seed, b) for b in range(0, 20, 16)}.isdisjoint({seed * 1_000_003 + b for b in range(0, 20, 16)})


def test_stored_topk_is_the_bases_distribution_from_bos(base):
    from cptkit.models.self_samples import sample_from_bos

    model, tok = load(base)
    vocab = len(tok)
    for s in sample_from_bos(model, tok, docs=3, max_tokens=10, seed=0, topk=vocab):
        ids = [tok.bos_token_id, *s["token_ids"]]
        assert len(s["topk_ids"]) == len(s["token_ids"]) + 1  # a row per token and one for the EOS after them
        with torch.no_grad():
            ref = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        got = torch.full_like(ref, float("nan"))
        got.scatter_(1, torch.tensor(s["topk_ids"]), torch.tensor(s["topk_logprobs"]))
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_self_samples_are_cached_by_the_bases_content(base, cache, monkeypatch):
    from cptkit.models import self_samples

    monkeypatch.setenv("CPTKIT_CACHE", str(cache))
    p = self_samples.cached_samples(str(base), docs=6, max_tokens=8, seed=1, topk=2)
    recs = [json.loads(x) for x in gzip.decompress(p.read_bytes()).decode().splitlines()]
    assert p.parent == cache / "self-replay" and len(recs) >= 5 and {r["domain"] for r in recs} == {"replay"}
    assert all(len(r["topk_ids"][0]) == 2 for r in recs)
    calls = []
    real = self_samples.generate
    monkeypatch.setattr(self_samples, "generate", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert self_samples.cached_samples(str(base), docs=6, max_tokens=8, seed=1, topk=2) == p and not calls
    assert self_samples.cached_samples(str(base), docs=6, max_tokens=8, seed=2, topk=2) != p and len(calls) == 1


# --- replay sources in build-mix ----------------------------------------------------------------
def test_a_path_source_replays_its_records_at_the_share(corpus_dir, base, tmp_path):
    recs = [{"id": f"r{i}", "text": f"replayed text number {i}: " + "the old knowledge kept. " * 6} for i in range(60)]
    src = tmp_path / "replay.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = build_stream(corpus_dir, base, tmp_path / "s", [*MIX, f"mix.replay.source={src}", "mix.replay.share=0.25",
                                                          "mix.replay.domains=[zh]"])
    st = res["stream"]
    doms = {d["name"]: d for d in st["domains"]}
    assert doms["replay"]["docs"] == 60 - 2 and st["replay"]["domains"] == ["replay"] and st["replay"]["source"] == str(src)
    assert st["stages"][0]["weights"] == {"en": 0.75, "replay": 0.25}  # zh, the pool's replay domain, is replaced
    plan = np.load(tmp_path / "s" / "plan.npy")
    assert (plan[:, 0] == list(doms).index("replay")).mean() == pytest.approx(0.25, abs=1 / len(plan))
    toks = np.fromfile(tmp_path / "s" / doms["replay"]["file"], dtype=st["dtype"])
    from transformers import AutoTokenizer

    assert "the old knowledge kept" in AutoTokenizer.from_pretrained(base).decode(toks[:60].tolist())
    with pytest.raises(CptkitError, match="no such file or folder"):
        build_stream(corpus_dir, base, tmp_path / "s2", [*MIX, f"mix.replay.source={tmp_path}/none", "mix.replay.share=0.2"])


@pytest.fixture(scope="module")
def self_stream(corpus_dir, base, cache, tmp_path_factory) -> Path:
    """A stream with 25% replay of the base's own samples, each token's whole distribution stored."""
    out = tmp_path_factory.mktemp("selfstream") / "s"
    mp = pytest.MonkeyPatch()
    mp.setenv("CPTKIT_CACHE", str(cache))
    try:
        build_stream(corpus_dir, base, out, [*MIX, "mix.replay.source=self", f"mix.replay.self.model={base}",
                                             "mix.replay.self.docs=48", "mix.replay.self.max_tokens=24",
                                             "mix.replay.self.topk=512", "mix.replay.share=0.25"])
    finally:
        mp.undo()
    return out


def test_self_replay_needs_the_bases_tokenizer(corpus_dir, corpus_records, base, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CPTKIT_CACHE", str(cache))
    other = make_tokenizer(corpus_records, tmp_path / "other", vocab_size=600)
    with pytest.raises(CptkitError, match="its tokenizer is not tokenizer="):
        build_stream(corpus_dir, other, tmp_path / "s", [*MIX, "mix.replay.source=self", f"mix.replay.self.model={base}",
                                                         "mix.replay.share=0.2"])
    assert not (tmp_path / "s").exists()


def test_self_replay_stream_keeps_the_sampled_ids_and_their_topk(self_stream, base):
    from cptkit.mixtures.stream import Stream

    s = Stream(self_stream)
    r = s.index["replay"]
    assert s.meta["replay"]["source"] == "self" and s.topk[r] is not None and s.topk[s.index["en"]] is None
    toks, (ids, lp) = np.asarray(s.tokens[r]), s.topk[r]
    assert ids.shape == (len(toks), 512) and np.isfinite(lp[:, 0]).all()
    # row i is the distribution token i was drawn from: with k = vocabulary every token has its log-prob
    model, tok = load(base)
    ends = np.flatnonzero(toks == s.eos)
    doc = toks[ends[0] + 1:ends[1] + 1].astype(np.int64)  # one whole sample and its EOS
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=torch.tensor([[tok.bos_token_id, *doc[:-1]]])).logits[0], -1)
    rows = slice(ends[0] + 1, ends[1] + 1)
    got = np.take_along_axis(lp[rows], np.argsort(ids[rows], axis=1), axis=1)
    np.testing.assert_allclose(got, ref.numpy(), atol=1e-5)


# --- distillation in train ----------------------------------------------------------------------
def test_topk_kl_at_full_k_is_the_full_kl():
    from cptkit.training.distill import kl_full, kl_topk

    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 40, generator=g), torch.randn(2, 5, 40, generator=g) * 3
    lp, ids = torch.log_softmax(teacher, -1).topk(40, dim=-1)
    torch.testing.assert_close(kl_topk(student, ids, lp), kl_full(student, teacher))
    assert (kl_full(teacher, teacher).abs() < 1e-6).all()
    # a shorter k renormalises both over the teacher's most likely ids: an approximation, exact for a
    # teacher whose mass lies there
    lp8, ids8 = torch.log_softmax(teacher, -1).topk(8, dim=-1)
    assert (kl_topk(student, ids8, lp8) >= 0).all()
    peaked = teacher.clone()
    peaked[..., 8:] = -1e4  # no mass beyond the first 8 ids
    lp8, ids8 = torch.log_softmax(peaked, -1).topk(8, dim=-1)
    assert kl_topk(student, ids8, lp8).shape == (2, 5)


def test_kl_zero_is_a_plain_run_to_the_last_bit(self_stream, tmp_path):
    train(self_stream, tmp_path / "plain", "train.max_steps=4")
    train(self_stream, tmp_path / "kl0", "train.max_steps=4", "train.distill.kl=0", "train.distill.on=all")
    assert [r["loss"] for r in steps(tmp_path / "plain")] == [r["loss"] for r in steps(tmp_path / "kl0")]
    assert all("distill_kl" not in r for r in steps(tmp_path / "kl0"))
    a = (tmp_path / "plain" / "model" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "kl0" / "model" / "model.safetensors").read_bytes()


def test_distillation_to_the_starting_model_logs_its_term_and_holds_the_model(self_stream, tmp_path):
    ov = ["train.max_steps=10", "train.lr=2e-2", "train.distill.on=all"]
    train(self_stream, tmp_path / "weak", *ov, "train.distill.kl=1e-6")
    train(self_stream, tmp_path / "kl", *ov, "train.distill.kl=3")
    weak, strong = steps(tmp_path / "weak"), steps(tmp_path / "kl")
    assert strong[0]["distill_kl"] == 0.0  # the teacher is the model the run starts from
    assert all(r["distill_kl"] > 0 for r in strong[2:])
    assert strong[-1]["distill_kl"] < weak[-1]["distill_kl"] / 2  # the term holds the student near its base
    assert extra(tmp_path / "kl")["distill"] == "kl=3 on all, teacher"
    assert [r["loss"] for r in weak] != [r["loss"] for r in strong]


def test_distillation_on_replay_with_stored_topk_needs_no_teacher(self_stream, tmp_path, monkeypatch):
    from cptkit.training import loop

    monkeypatch.setattr(loop, "build_teacher", lambda *a: pytest.fail("a teacher was loaded"))
    train(self_stream, tmp_path / "topk", "train.max_steps=4", "train.distill.kl=1")
    assert extra(tmp_path / "topk")["distill"] == "kl=1 on replay, topk"
    rows = steps(tmp_path / "topk")
    assert any(r["distill_kl"] > 0 for r in rows)  # a step whose batch holds no replay row logs 0


def test_distillation_resumes_to_the_same_losses(self_stream, tmp_path):
    ov = ["train.distill.kl=0.5", "train.distill.on=all", "train.save_every=2"]
    train(self_stream, tmp_path / "ref", "train.max_steps=6", *ov)
    train(self_stream, tmp_path / "cut", "train.max_steps=3", *ov)
    train(self_stream, tmp_path / "cut", "train.max_steps=6", "train.resume=true", *ov)
    ref, got = steps(tmp_path / "ref"), steps(tmp_path / "cut")
    assert [r["step"] for r in got] == list(range(1, 7))
    assert [(r["loss"], r["distill_kl"]) for r in got] == [(r["loss"], r["distill_kl"]) for r in ref]


@pytest.mark.slow
def test_distillation_under_deepspeed_zero2(self_stream, tmp_path):
    ov = ["train.engine=deepspeed", "train.zero_stage=2", "train.distill.kl=0.5", "train.distill.on=all"]
    train(self_stream, tmp_path / "ref", "train.max_steps=4", *ov)
    train(self_stream, tmp_path / "cut", "train.max_steps=2", *ov)
    train(self_stream, tmp_path / "cut", "train.max_steps=4", "train.resume=true", *ov)
    ref, got = steps(tmp_path / "ref"), steps(tmp_path / "cut")
    assert ref[0]["distill_kl"] == 0.0 and ref[-1]["distill_kl"] > 0
    assert [(r["loss"], r["distill_kl"]) for r in got] == [(r["loss"], r["distill_kl"]) for r in ref]
    assert extra(tmp_path / "ref")["zero stage"] == 2 and extra(tmp_path / "ref")["engine"] == "deepspeed"


def test_distillation_refusals(self_stream, corpus_dir, corpus_records, base, tmp_path):
    plain = tmp_path / "plain"
    build_stream(corpus_dir, base, plain, MIX)
    with pytest.raises(CptkitError, match="no replay domains"):
        train(plain, tmp_path / "r", "train.max_steps=1", "train.distill.kl=1")
    assert not (tmp_path / "r").exists()  # refused before anything is written
    with pytest.raises(CptkitError, match="model .*nowhere: not a directory"):
        train(self_stream, tmp_path / "r4", "train.max_steps=1", "train.distill.kl=1", f"train.distill.teacher={tmp_path}/nowhere")
    assert not (tmp_path / "r4").exists()
    other = tmp_path / "other"
    tok = make_tokenizer(corpus_records, other, vocab_size=600)
    from transformers import AutoTokenizer

    tiny.tiny_llama(AutoTokenizer.from_pretrained(tok), hidden=16, layers=1, heads=2).save_pretrained(other)
    with pytest.raises(CptkitError, match="the teacher must share the model's vocabulary"):
        train(self_stream, tmp_path / "r5", "train.max_steps=1", "train.distill.kl=1", f"train.distill.teacher={other}")
    small = tmp_path / "small"
    tiny.tiny_llama(AutoTokenizer.from_pretrained(make_tokenizer(corpus_records, small, vocab_size=300)),
                    hidden=16, layers=1, heads=2).save_pretrained(small)
    with pytest.raises(CptkitError, match="train.distill.teacher=.*small: model has 300 embeddings"):
        train(self_stream, tmp_path / "r6", "train.max_steps=1", "train.distill.kl=1", f"train.distill.teacher={small}")
    assert not (tmp_path / "r5").exists() and not (tmp_path / "r6").exists()
    with pytest.raises(CptkitError, match="train.distill.on=some: use one of replay, all"):
        train(plain, tmp_path / "r2", "train.max_steps=1", "train.distill.kl=1", "train.distill.on=some")
    with pytest.raises(CptkitError, match="train.kernels=liger: train.distill needs the model's logits"):
        train(plain, tmp_path / "r3", "train.max_steps=1", "train.distill.kl=1", "train.kernels=liger")


def test_the_remedies_keys_at_their_defaults_leave_old_outputs_identity(tmp_path):
    """Outputs written before these keys existed keep their config hash: at their unused values they are
    not in the record (core/run.py: LATER_KEYS); set, they are."""
    from cptkit.core.discovery import step_module
    from cptkit.core.run import Run

    io = [f"io.inputs=[{tmp_path}]", f"io.output={tmp_path / 'o'}"]
    for name in ("train", "build-mix"):
        step_module(name)
    train_rec = Run.of(compose_step("train", [*io, "model=tiny_llama"])).record
    mix_rec = Run.of(compose_step("build-mix", io)).record
    assert "distill" not in train_rec["train"] and {"source", "self"}.isdisjoint(mix_rec["mix"]["replay"])
    assert Run.of(compose_step("train", [*io, "train.distill.kl=1"])).record["train"]["distill"]["kl"] == 1
    mix_self = Run.of(compose_step("build-mix", [*io, "mix.replay.source=self", "mix.replay.self.model=m"])).record
    assert mix_self["mix"]["replay"]["source"] == "self" and mix_self["mix"]["replay"]["self"]["model"] == "m"


def test_self_samples_command_writes_replay_records(base, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "samples.jsonl"
    cmd = [sys.executable, "-m", "cptkit", "self-samples", "--model", str(base), "--out", str(out)]
    r = subprocess.run([*cmd, "--docs", "4", "--max-tokens", "6", "--topk", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows and all(len(x["topk_ids"]) == len(x["token_ids"]) + 1 and x["domain"] == "replay" for x in rows)
    r = subprocess.run([*cmd, "--docs", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --docs and --max-tokens must be positive")
