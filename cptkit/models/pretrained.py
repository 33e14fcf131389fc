"""Loading a pretrained Hugging Face model to continue its pre-training.

A GGUF checkpoint (``model.path=smollm2`` or ``FILE.gguf``) is dequantized by transformers on
load, but the model keeps a GGUF quantizer that makes ``save_pretrained`` refuse to write it.
:func:`plain_model` rebuilds it as an ordinary model of the same class with the dequantized
weights, so training, checkpoints and ``save_pretrained`` work as for any HF model.
"""

from __future__ import annotations

import copy

import torch

from cptkit.core.errors import CptkitError


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


def load_pretrained(spec: str):
    """A trainable float32 causal LM from an HF directory, a ``.gguf`` file or ``smollm2`` (dequantized)."""
    from cptkit.models.lm import load_causal_lm

    return plain_model(load_causal_lm(str(spec), dtype="float32"))
