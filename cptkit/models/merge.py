"""Merging a continued model back into its base, tensor by tensor: no training.

``alpha`` is the weight of the continued model M against its base B (0: B, 1: M). Each tensor is
merged by mergekit's in-memory API (``mergekit.merge_methods.merge_tensors``, mergekit 0.1.5:
github:arcee-ai/mergekit, ``mergekit/merge_methods/generalized_task_arithmetic.py`` and
``mergekit/sparsify.py``), with these parameters:

* ``linear`` (WiSE-FT, Wortsman et al. 2022): mergekit ``linear``, weights ``1 - alpha`` and
  ``alpha``, not normalized: ``(1 - alpha) * B + alpha * M``, exactly B at alpha = 0 and exactly M
  at alpha = 1.
* ``ties`` (Yadav et al. 2023): mergekit ``ties`` with ``lambda = alpha``: the task vector
  ``tau = M - B`` keeps its ``density`` share of largest magnitudes (trim), an entry keeps the task
  vectors whose sign is the sign of their sum (elect; with one continued model, every kept entry)
  and their weighted mean (disjoint merge): ``B + alpha * tau_m``.
* ``dare`` (Yu et al. 2023): mergekit ``dare_linear`` with keep rate ``density = 1 - drop``, no
  L1 rescaling and weight ``alpha / (1 - drop)``: every entry of ``tau`` is dropped with probability
  ``drop`` and the rest scaled by ``1 / (1 - drop)`` as in the paper (mergekit's default rescales
  the kept entries to the delta's L1 norm instead: the same in expectation), ``B + alpha * tau'``.
  The drops come from torch's generator seeded by the run's seed and the tensor's name (mergekit
  draws from the global generator, forked here), so a merge is reproducible and independent of the
  order the tensors are visited in.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from cptkit.core.errors import CptkitError

__all__ = ["ARCH_KEYS", "METHODS", "check_configs", "check_parents", "check_vocab", "merge_into", "merge_tensor",
           "method_parameters", "tensor_seed"]

METHODS = ("linear", "ties", "dare")


def method_parameters(method: str, alpha: float, density: float = 1.0, drop: float = 0.0) -> tuple[str, dict[str, Any]]:
    """mergekit's method name and parameters for ``method`` at ``alpha`` (inputs: ``base``, ``model``)."""
    if method == "linear":
        return "linear", {"weight": {"base": 1.0 - alpha, "model": alpha}, "normalize": False}
    if method == "ties":
        return "ties", {"weight": {"model": 1.0}, "density": {"model": density}, "lambda": alpha}
    if method == "dare":
        return "dare_linear", {"weight": {"model": alpha / (1.0 - drop)}, "density": {"model": 1.0 - drop},
                               "rescale": False}
    raise ValueError(f"unknown merge method {method!r}: one of {', '.join(METHODS)}")


def tensor_seed(seed: int, name: str) -> int:
    """The seed of one tensor's DARE drops: from the run's seed and the tensor's name."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def merge_tensor(name: str, base: torch.Tensor, model: torch.Tensor, method: str, alpha: float,
                 density: float = 1.0, drop: float = 0.0, seed: int = 0) -> torch.Tensor:
    """One merged tensor, computed in float32 by mergekit, returned in ``model``'s dtype. A tensor that
    is not floating point (an index buffer) is the model's."""
    from mergekit.merge_methods import merge_tensors  # deferred: pydantic, its method registry

    if not model.is_floating_point():
        return model
    mk_method, params = method_parameters(method, alpha, density, drop)
    with torch.random.fork_rng(devices=[]):  # DARE's drops: mergekit draws from the global generator
        torch.manual_seed(tensor_seed(seed, name))
        out = merge_tensors([base, model], mk_method, parameters=params, ids=("base", "model"), base_index=0,
                            name=name, dtype=torch.float32)
    return out.to(model.dtype)


def _named_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A model's persistent tensors by name, each storage once (a tied output layer is its embedding)."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        key = hash((t.data_ptr(), tuple(t.shape), tuple(t.stride()))) if t.numel() else id(t)
        if key not in seen:
            seen.add(key)
            out[name] = t
    return out


# config keys that two mergeable parents share: the architecture and every size a tensor shape follows
ARCH_KEYS = ("model_type", "architectures", "tie_word_embeddings", "vocab_size", "hidden_size", "intermediate_size",
             "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")


def _different(what: str, base_name: str, model_name: str) -> CptkitError:
    return CptkitError(f"merge: {base_name} and {model_name} are different architectures: {what}")


def check_configs(base: dict[str, Any], model: dict[str, Any], base_name: str = "base",
                  model_name: str = "model") -> None:
    """Refuse (one line) parents whose ``config.json`` differ in a key of :data:`ARCH_KEYS`."""
    for key in ARCH_KEYS:
        if base.get(key) != model.get(key):
            raise _different(f"config {key} {base.get(key)!r} vs {model.get(key)!r}", base_name, model_name)


def check_vocab(base: dict[str, int], model: dict[str, int], base_name: str = "base",
                model_name: str = "model") -> None:
    """Refuse (one line) parents whose tokenizers map tokens to other ids."""
    if base != model:
        diff = sorted(set(base.items()) ^ set(model.items()))[0][0]
        raise CptkitError(f"merge: {base_name} and {model_name} have different tokenizer vocabularies "
                          f"({len(base)} vs {len(model)} tokens; token {diff!r} is id {base.get(diff)} vs "
                          f"{model.get(diff)})")


def check_parents(base: torch.nn.Module, model: torch.nn.Module, base_name: str = "base",
                  model_name: str = "model") -> None:
    """Refuse (one line) loaded parents that cannot be merged tensor for tensor: another config
    (:func:`check_configs`), another tensor set, or another shape."""
    check_configs(base.config.to_dict(), model.config.to_dict(), base_name, model_name)
    bt, mt = _named_tensors(base), _named_tensors(model)
    if sorted(bt) != sorted(mt):
        only = sorted(set(bt) ^ set(mt))[0]
        raise _different(f"tensor {only} is only in {base_name if only in bt else model_name}", base_name, model_name)
    for name, t in bt.items():
        if t.shape != mt[name].shape:
            raise _different(f"tensor {name} has shape {list(t.shape)} vs {list(mt[name].shape)}", base_name,
                             model_name)


@torch.no_grad()
def merge_into(base: torch.nn.Module, model: torch.nn.Module, method: str, alpha: float, density: float = 1.0,
               drop: float = 0.0, seed: int = 0) -> int:
    """Replace every tensor of ``model`` by its merge with ``base``'s (:func:`merge_tensor`), in place;
    returns the number of parameters merged. Check the pair with :func:`check_parents` first."""
    bt = _named_tensors(base)
    n = 0
    for name, t in _named_tensors(model).items():
        t.copy_(merge_tensor(name, bt[name].detach(), t.detach(), method, alpha, density, drop, seed))
        n += t.numel()
    return n
