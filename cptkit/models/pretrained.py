"""Loading a pretrained Hugging Face model to continue its pre-training.

A GGUF checkpoint (``model.path=smollm2`` or ``FILE.gguf``) loads from its dequantized cache
(:mod:`cptkit.models.gguf_cache`), an ordinary model; loaded in place instead, it keeps a GGUF
quantizer that makes ``save_pretrained`` refuse to write it, and :func:`plain_model` rebuilds it
as an ordinary model of the same class with the dequantized weights, so training, checkpoints and
``save_pretrained`` work as for any HF model.
"""

from __future__ import annotations

from cptkit.models.gguf_cache import plain_model
from cptkit.models.lm import load_causal_lm

__all__ = ["load_pretrained", "plain_model"]


def load_pretrained(spec: str, trust_remote_code: bool = False):
    """A trainable float32 causal LM from an HF directory, a ``.gguf`` file or ``smollm2`` (dequantized);
    a folder that ships its own code only with ``trust_remote_code``."""
    return plain_model(load_causal_lm(str(spec), dtype="float32", trust_remote_code=trust_remote_code))
