"""Every `train` output's model/ has a model card that huggingface_hub parses: front matter (base_model,
library_name, tags) and a body with the stream (as the manifest records it), the final evaluation and
the config. Two tiny real runs: one from scratch, one continuing the first one's saved model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

from cptkit.core.config import compose_step
from cptkit.core.fingerprint import fingerprint_path
from cptkit.training.card import base_model
from cptkit.training.config import ModelConfig

COMMON = ["model.hidden=32", "model.layers=2", "model.heads=2", "train.micro_batch=4", "train.threads=1",
          "train.lr=3e-3", "train.warmup=1", "quiet=true"]


@pytest.fixture(scope="module")
def stream(corpus_dir, corpus_records, tmp_path_factory):
    base = tmp_path_factory.mktemp("card")
    tok = make_tokenizer(corpus_records, base / "tok")
    build_stream(corpus_dir, tok, base / "stream", [*TWO_DOMAINS, "mix.budget_tokens=20000", "mix.seq_len=64",
                                                    "mix.eval_docs=4"])
    return base / "stream"


def train(stream: Path, out: Path, *overrides: str) -> None:
    from cptkit.steps.train import run

    run(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", *COMMON, *overrides]))


def test_the_card_parses_and_says_what_the_run_did(stream, tmp_path):
    train(stream, tmp_path / "scratch", "train.max_steps=2")
    scratch = ModelCard.load(tmp_path / "scratch" / "model" / "README.md")
    assert scratch.data.library_name == "transformers" and scratch.data.base_model is None  # nothing to continue
    assert {"cptkit", "continual-pretraining"} <= set(scratch.data.tags)
    assert "No held-out evaluation ran during training" in scratch.text

    base = tmp_path / "scratch" / "model"
    out = tmp_path / "cpt"
    train(stream, out, "model=hf", f"model.path={base}", "train.max_steps=3", "train.eval_every=3")
    card = ModelCard.load(out / "model" / "README.md")
    assert card.data.base_model == str(base) and card.data.library_name == "transformers"
    assert card.data.tags == ["cptkit", "continual-pretraining", "text-generation"]
    man = json.loads((out / "_manifest.json").read_text())
    # the stream, as the manifest records it: path, sha256 (the run's own fingerprint of it), tokens per domain
    data = man["data"]
    assert data["sha256"] == fingerprint_path(stream)["sha256"] and data["stream"] == str(stream)
    meta = json.loads((stream / "_stream.json").read_text())
    assert {d: v["tokens"] for d, v in data["domains"].items()} == {d["name"]: d["tokens"] for d in meta["domains"]}
    assert f"sha256 `{data['sha256']}`" in card.text
    for d, v in data["domains"].items():
        assert f"| {d} | {v['docs']} | {v['tokens']} | {v['planned_tokens']} |" in card.text
    # the evaluation table: before training and after the last step, as metrics.jsonl has them
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if "eval_loss" in x]
    first, last = evals[0]["eval_loss"], evals[-1]["eval_loss"]
    assert evals[-1]["event"] == "eval" and evals[-1]["step"] == 3
    for d in ("en", "zh"):
        assert re.search(rf"\| {d} \| {first[d]:.4f} \| {last[d]:.4f} \| [0-9.]+ \|", card.text), card.text
    assert f"| steps | {man['extra']['steps']} |" in card.text
    # the config block is the manifest's config
    block = card.text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert yaml.safe_load(block) == man["config"]
    # the card does not get in the way of loading the model
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out / "model").config.hidden_size == 32


def test_base_model_names_the_hub_model_of_the_embedded_gguf():
    assert base_model(ModelConfig(name="hf", path="smollm2")) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model(ModelConfig(name="hf", path="/models/x")) == "/models/x"
    assert base_model(ModelConfig(name="tiny_llama")) is None
