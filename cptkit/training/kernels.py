"""``train.kernels``: the model's kernels. ``none`` (default) trains the model as transformers builds it;
``liger`` patches the model instance with Liger-Kernel's Triton kernels (RoPE, RMSNorm, SwiGLU and the
fused linear + cross-entropy) before the engine is built. CUDA only.

The training loss is the model's own forward with ``labels`` either way (``loop.optimizer_step``): the
fused forward computes the same mean token NLL over the same shifted positions (labels padded with
-100 and shifted by one, as transformers' ``ForCausalLMLoss``) without materialising the
vocabulary-wide logits. Calls without ``labels`` (held-out evaluation's logits at boolean
``logits_to_keep`` positions, which Liger's forward does not take) keep the model class's forward.
"""

from __future__ import annotations

from typing import Any

import torch

from cptkit.core.errors import CptkitError

KERNELS = ("none", "liger")


def check_kernels(kernels: str) -> None:
    """Refuse, in one line, a ``train.kernels`` this process cannot run (before anything is written)."""
    if kernels == "none":  # else liger: TrainOptions refused any other name
        return
    if not torch.cuda.is_available():
        raise CptkitError("train.kernels=liger needs a CUDA GPU (Liger-Kernel's kernels are Triton); "
                          "use train.kernels=none here")
    try:
        import liger_kernel.transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001 - not installed, no triton, a transformers it refuses
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CptkitError(f"train.kernels=liger: liger_kernel is not importable ({why}); "
                          "pip install liger-kernel, or use train.kernels=none") from None


def apply_kernels(model: Any, kernels: str) -> str:
    """Patch ``model`` in place with ``kernels``; returns what the manifest records."""
    check_kernels(kernels)
    if kernels == "none":
        return "none"
    from liger_kernel.transformers import _apply_liger_kernel_to_instance
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    model_type = getattr(model.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise CptkitError(f"train.kernels=liger: Liger-Kernel has no kernels for model type {model_type!r}; "
                          "use train.kernels=none")
    model.__dict__.pop("forward", None)
    _apply_liger_kernel_to_instance(model=model, rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True)
    fused = model.__dict__.pop("forward", None)  # the instance patch: MethodType(lce_forward, model)
    if fused is None:
        raise CptkitError(f"train.kernels=liger: Liger-Kernel has no fused linear cross-entropy for model type "
                          f"{model_type!r}; use train.kernels=none")
    route_labels(model, fused)
    return "liger"


def route_labels(model: Any, fused: Any) -> None:
    """``model(..., labels=...)`` runs ``fused`` (the loss without the full logits, in training mode);
    every other call runs the model class's own forward."""
    plain = type(model).forward.__get__(model, type(model))

    def forward(*args: Any, labels: Any = None, **kw: Any) -> Any:
        if labels is not None:
            return fused(*args, labels=labels, **kw)
        return plain(*args, **kw)

    model.forward = forward
