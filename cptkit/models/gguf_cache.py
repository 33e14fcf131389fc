"""A GGUF checkpoint converted once, then loaded as an ordinary Hugging Face folder.

transformers parses and dequantizes a GGUF file on every ``from_pretrained(gguf_file=...)``, the
tokenizer and the config each parsing it again: for SmolLM2-135M that is ~35 s per process on
two cores, paid by every ``train``, ``evaluate`` and ``build-mix`` that names ``smollm2``. The first
load writes the result (fp32 safetensors of the dequantized weights, the config without its
quantizer, the tokenizer, the generation config) to
``$CPTKIT_CACHE/gguf/<stem>-<key>`` (default ``~/.cache/cptkit``), ``<key>`` hashing the GGUF's
sha256 with the transformers version that converted it; later loads read that folder in about a
second. The weights are the dequantized values themselves, so a model loads bit-identical either
way. ``CPTKIT_GGUF_CACHE=0`` turns the cache off.

An entry is sealed when written (:mod:`cptkit.core.cache`: every file's size and sha256, recorded
last) and checked against that record on every use: a file cut short or changed since is damage,
and the entry is converted again from the GGUF (one warning line) instead of failing to load with an
error that blames the healthy GGUF. A link planted as the entry is refused.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
from pathlib import Path

import torch

from cptkit.core.cache import check_or_seal, entry, seal
from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import cache as hash_cache
from cptkit.core.fingerprint import content_hash
from cptkit.core.progress import log

DONE = ".cptkit-converted"  # written last: a folder without it is an interrupted conversion


def plain_model(model):
    """The same model without its quantizer: same class, same config (less quantization), same weights."""
    if getattr(model, "hf_quantizer", None) is None and not getattr(model.config, "quantization_config", None):
        return model
    cfg = copy.deepcopy(model.config)
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    state = {k: v.detach().to(torch.float32) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    with torch.device("meta"):
        plain = type(model)(cfg)
    missing, unexpected = plain.load_state_dict(state, strict=False, assign=True)
    if getattr(cfg, "tie_word_embeddings", False):
        plain.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise CptkitError(f"cannot rebuild {type(model).__name__} from its dequantized weights: "
                          f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, buf in plain.named_buffers():  # non-persistent buffers (rotary inv_freq) are not in state_dict
        if buf.device.type == "meta":
            src = dict(model.named_buffers())[name]
            parent = plain.get_submodule(name.rsplit(".", 1)[0]) if "." in name else plain
            parent.register_buffer(name.rsplit(".", 1)[-1], src.detach().clone(), persistent=False)
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain.eval()


def enabled() -> bool:
    return os.environ.get("CPTKIT_GGUF_CACHE", "1") != "0"


def cache_dir(gguf_path: Path) -> Path:
    """Where the conversion of ``gguf_path`` lives: keyed by its content and the converter."""
    import transformers

    sha, _ = content_hash(gguf_path) or ("", 0)
    hash_cache().save()
    key = hashlib.sha256(f"{sha}\0transformers {transformers.__version__}".encode()).hexdigest()[:16]
    return entry("gguf", f"{gguf_path.stem}-{key}")


def converted(directory: str, gguf: str) -> str:
    """The HF folder holding ``directory/gguf`` dequantized, converting it on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest = cache_dir(Path(directory) / gguf)
    if (dest / DONE).exists():
        why = check_or_seal(dest)
        if why is None:
            return str(dest)
        log.warning("%s: damaged GGUF cache entry (%s): converting %s again", dest, why, gguf)
        shutil.rmtree(dest, ignore_errors=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf, trust_remote_code=False)
    model = plain_model(AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf, dtype=torch.float32,
                                                             trust_remote_code=False))
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    (tmp / DONE).write_text(f"{Path(directory) / gguf}\n")
    seal(tmp)  # last: the sizes and hashes every later use checks
    try:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
    except OSError:  # another process finished the same conversion first: use its folder
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / DONE).exists():
            raise
        why = check_or_seal(dest)
        if why is not None:
            raise CptkitError(f"{dest}: damaged GGUF cache entry ({why}); remove it to convert {gguf} again") from None
    return str(dest)
