"""A trained Llama-family model written as GGUF, so llama.cpp and ``cptkit serve-llm`` can run it.

The tensor names come from gguf-py's own HF → GGUF map; query and key projections are permuted
from Hugging Face's rotate-half layout to GGML's interleaved RoPE layout, as llama.cpp's
``convert_hf_to_gguf.py`` does (transformers undoes the same permutation when it loads a GGUF).
The tokenizer is written from the model directory's ``tokenizer.json`` (byte-level BPE), or its
metadata is copied verbatim from a source GGUF (``tokenizer_from``: the checkpoint the model was
continued from, e.g. the shipped SmolLM2), which keeps llama.cpp's pre-tokenizer name exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cptkit.core.errors import CptkitError
from cptkit.core.shards import atomic_path
from cptkit.models.remote_code import remote_code_kwargs

DTYPES = ("f32", "f16", "q8_0")
ARCHES = ("LlamaForCausalLM", "MistralForCausalLM")


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half row order → GGML's interleaved pairs, per head (llama.cpp's ``permute``)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(state: dict[str, Any], config: Any) -> list[tuple[str, np.ndarray]]:
    """``(gguf name, float32 array)`` for every weight of a Llama state dict (tied head left out)."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    out = []
    for hf_name, t in state.items():
        if hf_name == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
            continue
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise CptkitError(f"export-gguf: no GGUF name for tensor {hf_name!r} (architecture {config.architectures})")
        a = t.detach().to("cpu").float().numpy()
        if hf_name.endswith("q_proj.weight"):
            a = permute_qk(a, config.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            a = permute_qk(a, kv_heads)
        out.append((name, a))
    return out


def bpe_vocab(model_dir: Path) -> tuple[list[str], list[int], list[str], dict[str, Any]]:
    """Tokens (by id), token types, merges and special ids from a byte-level BPE ``tokenizer.json``."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise CptkitError(f"export-gguf: {path} is missing: pass tokenizer_from=FILE.gguf to copy the tokenizer")
    tj = json.loads(path.read_text(encoding="utf-8"))
    model = tj.get("model", {})
    if model.get("type") != "BPE":
        raise CptkitError(f"export-gguf: {path}: a {model.get('type')} tokenizer; only byte-level BPE is written")
    vocab = dict(model["vocab"])
    special = {a["content"] for a in tj.get("added_tokens", []) if a.get("special")}
    for a in tj.get("added_tokens", []):
        vocab.setdefault(a["content"], a["id"])
    tokens = [""] * (max(vocab.values()) + 1)
    for tok, i in vocab.items():
        tokens[i] = tok
    types = [3 if t in special else 1 for t in tokens]  # 3: control, 1: normal (gguf.TokenType)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    cfg_path = model_dir / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    return tokens, types, merges, tcfg


def write_tokenizer(w: Any, model_dir: Path, tokenizer_from: Path | None, config: Any) -> None:
    """The tokenizer metadata: copied from a GGUF, or built from the directory's tokenizer.json."""
    if tokenizer_from is not None:
        import gguf

        reader = gguf.GGUFReader(str(tokenizer_from))
        for key, f in reader.fields.items():
            if key.startswith("tokenizer."):
                vtype = f.types[0]
                sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
                w.add_key_value(key, f.contents(), vtype, sub_type=sub)
        return
    tokens, types, merges, tcfg = bpe_vocab(model_dir)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    index = {t: i for i, t in enumerate(tokens)}
    for key, add in (("bos_token", w.add_bos_token_id), ("eos_token", w.add_eos_token_id),
                     ("pad_token", w.add_pad_token_id), ("unk_token", w.add_unk_token_id)):
        tok = tcfg.get(key)
        tok = tok.get("content") if isinstance(tok, dict) else tok
        if tok in index:
            add(index[tok])
    w.add_add_bos_token(False)
    if tcfg.get("chat_template"):
        w.add_chat_template(tcfg["chat_template"])


def export_gguf(model_dir: str | Path, out: str | Path, dtype: str = "f16",
                tokenizer_from: str | Path | None = None, name: str | None = None,
                trust_remote_code: bool = False) -> Path:
    """Write the HF model in ``model_dir`` (a Llama-family causal LM) as one GGUF file ``out``; a folder
    that ships its own code (``auto_map``) is refused unless ``trust_remote_code``.

    ``dtype``: f32 (exact), f16, or q8_0 (2-D weights whose rows are a multiple of 32; norms stay f32). The file appears
    atomically: a crash leaves no partial ``out``."""
    import gguf
    from transformers import AutoConfig, AutoModelForCausalLM

    if dtype not in DTYPES:
        raise CptkitError(f"export-gguf: dtype={dtype}: must be one of {', '.join(DTYPES)}")
    model_dir, out = Path(model_dir), Path(out)
    kw = remote_code_kwargs(model_dir, trust_remote_code, "trust_remote_code")
    config = AutoConfig.from_pretrained(model_dir, **kw)
    if not set(config.architectures or []) & set(ARCHES):
        raise CptkitError(f"export-gguf: {model_dir}: architecture {config.architectures}; "
                          f"only {', '.join(ARCHES)} are written")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32", **kw)
    tensors = gguf_tensors(model.state_dict(), config)
    with atomic_path(out) as tmp:
        _write(gguf.GGUFWriter(str(tmp), "llama"), config, model_dir, tensors, dtype, name, tokenizer_from)
    return out


def _write(w: Any, config: Any, model_dir: Path, tensors: list[tuple[str, np.ndarray]], dtype: str,
           name: str | None, tokenizer_from: str | Path | None) -> None:
    """Write the GGUF file of ``w`` (a ``gguf.GGUFWriter``): metadata, tokenizer, tensors."""
    import gguf

    try:
        w.add_name(name or model_dir.resolve().name)
        w.add_context_length(int(config.max_position_embeddings))
        w.add_embedding_length(int(config.hidden_size))
        w.add_block_count(int(config.num_hidden_layers))
        w.add_feed_forward_length(int(config.intermediate_size))
        w.add_head_count(int(config.num_attention_heads))
        w.add_head_count_kv(int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads))
        w.add_rope_freq_base(float(getattr(config, "rope_theta", None) or _rope_theta(config)))
        w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
        w.add_vocab_size(int(config.vocab_size))
        w.add_rope_dimension_count(int(config.hidden_size // config.num_attention_heads))
        ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[dtype]
        w.add_file_type(int(ftype))
        write_tokenizer(w, model_dir, Path(tokenizer_from) if tokenizer_from else None, config)
        for tname, a in tensors:
            add_tensor(w, tname, a, dtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def _rope_theta(config: Any) -> float:
    """RoPE base of a transformers 5 config (``rope_parameters``) or 10000 (Llama's default)."""
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", 10000.0))


def add_tensor(w: Any, name: str, a: np.ndarray, dtype: str) -> None:
    """One tensor in the requested type; 1-D tensors (norms, biases) always stay f32, and a row
    length that is not a multiple of Q8_0's block of 32 falls back to f16 (as llama.cpp's converter)."""
    import gguf

    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
    if dtype == "q8_0" and a.shape[-1] % block:
        dtype = "f16"
    if a.ndim == 1 or dtype == "f32":
        w.add_tensor(name, a.astype(np.float32))
    elif dtype == "f16":
        w.add_tensor(name, a.astype(np.float16))
    else:
        q = gguf.quants.quantize(a.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
