"""The model and tokenizer a training run starts from: a tiny random Llama or a pretrained model,
checked against the stream's vocabulary; optionally saved untrained as ``OUT/model_init``."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING, Any

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.models import tiny
from cptkit.models.lm import load_tokenizer
from cptkit.models.pretrained import load_pretrained
from cptkit.training.state import RunSpec

if TYPE_CHECKING:
    from cptkit.training.config import ModelConfig


def build_model(mcfg: ModelConfig, tokenizer: Any, seq_len: int, trust_remote_code: bool = False) -> Any:
    """The model ``model.name`` names: a seeded tiny Llama sized to the tokenizer, or ``model.path`` loaded
    (a folder that ships its own code only with ``trust_remote_code``)."""

    if mcfg.name == "tiny_llama":
        model = tiny.tiny_llama(tokenizer, hidden=mcfg.hidden, layers=mcfg.layers, heads=mcfg.heads,
                                intermediate=mcfg.intermediate, max_position=mcfg.max_position or seq_len,
                                seed=mcfg.seed, kv_heads=mcfg.kv_heads,
                                tie_embeddings=mcfg.tie_embeddings)
    else:  # hf (ModelConfig allows no other name)
        if not mcfg.path:
            raise CptkitError("model=hf needs model.path (an HF directory, a .gguf file or smollm2)")

        model = load_pretrained(mcfg.path, trust_remote_code)  # a GGUF file is dequantized into a plain, saveable model
    try:
        model.set_attn_implementation(mcfg.attn_implementation)
    except (AttributeError, ValueError, ImportError) as e:
        log.warning("attention %s unavailable (%s); using the model's default", mcfg.attn_implementation, e)
    model.config.use_cache = False
    return model


def build_teacher(spec: RunSpec, tokenizer: Any, path: str | None) -> Any:
    """``train.distill``'s frozen teacher: the model at ``path``, or (None) the model this run starts from,
    built again as the student was (the global RNG left as it was)."""
    import torch  # deferred: the module is imported by steps that never train

    conf = spec.conf
    with torch.random.fork_rng(devices=[]):
        if path:
            model = load_pretrained(path, conf.trust_remote_code)
        else:
            model = build_model(conf.model, tokenizer, spec.seq_len, conf.trust_remote_code)
    try:
        check_vocab(model, spec.stream)
    except CptkitError as e:
        raise CptkitError(f"train.distill.teacher={path}: {e}") from None
    return model


def load_run_tokenizer(spec: RunSpec) -> Any:
    """``tokenizer`` (default: the stream's), refused when smaller than the stream's vocabulary."""

    stream = spec.stream
    tok_spec = spec.conf.tokenizer or stream.tokenizer_spec()
    tokenizer = load_tokenizer(tok_spec, spec.conf.trust_remote_code)
    if len(tokenizer) < int(stream.meta["vocab_size"]):
        raise CptkitError(f"tokenizer {tok_spec} has {len(tokenizer)} tokens, the stream was built with "
                          f"{stream.meta['vocab_size']}")
    return tokenizer


def check_vocab(model: Any, stream: Any) -> None:
    if model.get_input_embeddings().num_embeddings < int(stream.meta["vocab_size"]):
        raise CptkitError(f"model has {model.get_input_embeddings().num_embeddings} embeddings, fewer than the "
                          f"stream's vocabulary ({stream.meta['vocab_size']})")


def save_initial(spec: RunSpec, model: Any, tokenizer: Any) -> None:
    """``OUT/model_init``: the "base" of a from-scratch demo run, for evaluate-compare against the trained model."""
    out = spec.out
    if spec.tcfg.save_initial and spec.rank == 0 and not (out / "model_init").exists():
        tmp = out / ".model_init.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, out / "model_init")
