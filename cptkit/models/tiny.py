"""Tiny real models for tests and ``model=tiny_llama``: a byte-level BPE tokenizer trained on the
given texts and a randomly initialised (seeded) ``LlamaForCausalLM`` sized for it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from cptkit.models.scoring import TOKENIZER_INFINITY


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 512, out_dir: str | Path | None = None,
                        min_frequency: int = 2):
    """Train a byte-level BPE tokenizer (special tokens ``<unk> <s> </s> <pad>``) on ``texts``.

    Returns a ``PreTrainedTokenizerFast`` (no special tokens are added by ``encode``); saved to
    ``out_dir`` when given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # deferred: heavy
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=TOKENIZER_INFINITY)
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def tiny_llama(tokenizer, hidden: int = 64, layers: int = 2, heads: int = 4, intermediate: int | None = None,
               max_position: int = 512, seed: int = 0, kv_heads: int | None = None, tie_embeddings: bool = False):
    """A randomly initialised ``LlamaForCausalLM`` sized for ``tokenizer`` (deterministic in ``seed``);
    ``tie_embeddings``: the output layer is the input embedding matrix."""
    from transformers import LlamaConfig, LlamaForCausalLM  # deferred: heavy

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_position, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=tie_embeddings,
    )
    gen = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(gen)
    return model.eval()
