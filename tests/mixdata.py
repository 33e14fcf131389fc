"""Helpers for the build-mix / train tests: a real BPE tokenizer and streams built from the corpus slice."""

from __future__ import annotations

from pathlib import Path

from cptkit.core.config import compose_step

TWO_DOMAINS = ["mix.domains=[{name:en,filter:{lang:en}},{name:zh,filter:{lang:zh}}]",
               "mix.stages=[{name:main,weights:{en:1,zh:1}}]", "mix.fill=null"]


def make_tokenizer(corpus_records: list[dict], out: Path, vocab_size: int = 512) -> Path:
    """Train a byte-level BPE tokenizer on the real corpus text (once per directory)."""
    from cptkit.models.tiny import train_bpe_tokenizer

    if not (out / "tokenizer.json").exists():
        train_bpe_tokenizer([r["text"] for r in corpus_records], vocab_size=vocab_size, out_dir=out)
    return out


def build_stream(corpus_dir: Path, tok: Path, out: Path, overrides: list[str]) -> dict:
    from cptkit.steps.build_mix import run

    return run(compose_step("build-mix", [f"io.inputs=['{corpus_dir}']", f"io.output='{out}'",
                                          f"tokenizer='{tok}'", "quiet=true", *overrides]))
