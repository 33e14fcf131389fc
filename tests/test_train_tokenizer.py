"""train-tokenizer: a byte-level BPE tokenizer learnt from a corpus, the same bytes from the same inputs,
read by build-mix (without transformers) and by transformers alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_jsonl

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.steps.train_tokenizer import run
from cptkit.text.rust_tokenizer import load_rust_tokenizer

TEXTS = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "数字 and 汉字 on the mat",
         "def f(x): return x + 1", "the mat, the log and the cat"]


def learn(inp: Path, out: Path, *overrides: str) -> dict:
    return run(compose_step("train-tokenizer", [f"io.inputs=[{inp}]", f"io.output={out}", "quiet=true",
                                                "tokenizer.vocab_size=300", *overrides]))


def test_the_same_corpus_gives_the_same_tokenizer_bytes_that_build_mix_and_transformers_read(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(TEXTS * 5)])
    learn(corpus, tmp_path / "a")
    learn(corpus, tmp_path / "b")
    a = (tmp_path / "a" / "tokenizer.json").read_bytes()
    assert a == (tmp_path / "b" / "tokenizer.json").read_bytes() and (tmp_path / "a" / "_SUCCESS").exists()
    vocab = json.loads(a)["model"]["vocab"]
    assert len(vocab) == 300 and [vocab[t] for t in ("<unk>", "<s>", "</s>", "<pad>")] == [0, 1, 2, 3]
    rust = load_rust_tokenizer(str(tmp_path / "a"))  # what build-mix uses: no fallback to transformers
    assert rust is not None and rust.eos_token_id == 2 and len(rust) == 300
    from cptkit.models.lm import load_tokenizer  # what train uses

    hf = load_tokenizer(str(tmp_path / "a"))
    text = "the cat sat on 汉字"  # byte-level: Chinese encodes without <unk>
    ids = rust(text)["input_ids"]
    assert ids == hf(text, add_special_tokens=False)["input_ids"] and 0 not in ids and hf.decode(ids) == text
    manifest = json.loads((tmp_path / "a" / "_manifest.json").read_text())
    assert manifest["extra"]["records learnt from"] == 30


def test_max_docs_learns_from_a_seeded_sample_and_a_record_without_the_field_is_refused(tmp_path):
    recs = [{"id": f"d{i}", "text": t + f" number{i % 7}"} for i, t in enumerate(TEXTS * 6)]
    corpus = write_jsonl(tmp_path / "c.jsonl", recs)
    learn(corpus, tmp_path / "s0", "tokenizer.max_docs=8", "seed=0")
    learn(corpus, tmp_path / "s1", "tokenizer.max_docs=8", "seed=1")
    extra = json.loads((tmp_path / "s0" / "_manifest.json").read_text())["extra"]
    assert extra["records read"] == 36 and extra["records learnt from"] == 8
    merges = [json.loads((tmp_path / s / "tokenizer.json").read_text())["model"]["merges"] for s in ("s0", "s1")]
    assert merges[0] != merges[1]  # another seed, another sample
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "x", "text": "a text", "title": None}])
    with pytest.raises(CptkitError, match="record 'x': no string field 'title'"):
        learn(bad, tmp_path / "bad", "tokenizer.field=title")
