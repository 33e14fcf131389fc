"""A byte-level BPE tokenizer trained on texts with the Rust ``tokenizers`` library alone, saved as a
folder that both ``build-mix tokenizer=DIR`` (:mod:`cptkit.text.rust_tokenizer`) and transformers'
``AutoTokenizer`` read (the generic ``PreTrainedTokenizerFast`` over ``tokenizer.json``).

GPT-2's scheme: the ByteLevel pre-tokenizer (its regex split, no prefix space) over all 256 byte
symbols, so any text, Chinese included, encodes without ``<unk>``; the special tokens ``<unk> <s>
</s> <pad>`` take ids 0-3 (``</s>`` ends every document in a build-mix stream). Training is
deterministic: the same texts in the same order give the same ``tokenizer.json`` bytes (merges
of equal count are ordered by the pair itself, not by hash order).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")


def train_byte_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Any:
    """A ``tokenizers.Tokenizer``: byte-level BPE with :data:`SPECIALS`, at most ``vocab_size`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # deferred: heavy

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer_folder(tok: Any, out_dir: str | Path, max_length: int = 1_000_000_000) -> list[str]:
    """Write ``tok`` as an HF tokenizer folder: ``tokenizer.json`` and a ``tokenizer_config.json`` naming
    the generic class and the special tokens; returns the file names written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    unk, bos, eos, pad = SPECIALS
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": True} for t in SPECIALS}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added, "unk_token": unk,
              "bos_token": bos, "eos_token": eos, "pad_token": pad, "model_max_length": max_length,
              "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return ["tokenizer.json", "tokenizer_config.json"]
