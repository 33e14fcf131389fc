"""Text generation for cptkit steps: one batched, cached interface over several backends.

    from cptkit.llm import load_generator, GenParams
    gen = load_generator(cfg.llm)                      # the `llm` config group
    outs = gen.generate(["prompt", [{"role": "user", "content": "hi"}]],
                        gen.params(max_new_tokens=64))
    outs[0].text, outs[0].completion_tokens, outs[0].finish_reason
    gen.stats.as_dict()                                # token counts, tokens/s -> manifest

Backends (``llm.backend``): ``auto`` (default: ``llamacpp`` for a GGUF model on CPU when
llama-cpp-python is installed, else ``transformers``), ``llamacpp``, ``transformers``, ``openai``
(any OpenAI-compatible server), ``vllm`` (offline engine), or your own
``package.module:Class`` (a :class:`Generator` subclass). See docs/llm.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.llm.base import Completion, Generator, GenParams, GenStats, Request
from cptkit.llm.config import LLMConfig

__all__ = ["Completion", "GenParams", "GenStats", "Generator", "LLMConfig", "Request", "load_generator", "BACKENDS",
           "choose_local_backend"]

BACKENDS = ("auto", "llamacpp", "transformers", "openai", "vllm")


def choose_local_backend(llm: Any, llamacpp_installed: bool, cuda: bool) -> tuple[str, str]:
    """What ``llm.backend=auto`` runs: ``(backend, why)``.

    llama.cpp when it is installed, the model is a GGUF file (the embedded SmolLM2 is one) and
    generation runs on CPU; transformers otherwise (a model directory, a GPU, no llama-cpp-python).
    """
    from cptkit.llm.llamacpp import gguf_path

    device = str(getattr(llm, "device", "auto"))
    if gguf_path(str(llm.model), getattr(llm, "gguf_file", None)) is None:
        return "transformers", f"llm.model={llm.model} is not a GGUF file"
    if device.startswith("cuda") or (device == "auto" and cuda):
        return "transformers", "a CUDA device is used"
    if not llamacpp_installed:
        return "transformers", "llama-cpp-python is not installed (make install builds it)"
    return "llamacpp", "GGUF model on CPU and llama-cpp-python is installed"


def _llamacpp(llm: Any) -> Generator:
    from cptkit.llm.llamacpp import LlamaCppGenerator

    return LlamaCppGenerator(llm)


def _transformers(llm: Any) -> Generator:
    from cptkit.llm.hf import TransformersGenerator

    return TransformersGenerator(llm)


def _openai(llm: Any) -> Generator:
    from cptkit.llm.openai_http import OpenAIGenerator

    return OpenAIGenerator(llm)


def _vllm(llm: Any) -> Generator:
    from cptkit.llm.vllm_engine import VLLMGenerator

    return VLLMGenerator(llm)


# backend name -> factory(llm config) -> Generator; each imports its engine only when chosen
FACTORIES: dict[str, Callable[[Any], Generator]] = {
    "llamacpp": _llamacpp, "transformers": _transformers, "openai": _openai, "vllm": _vllm}


def plugin_factory(backend: str) -> Callable[[Any], Generator]:
    """``llm.backend=package.module:Class``: a :class:`Generator` subclass from your own code."""
    import importlib

    mod, _, name = backend.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as e:
        raise CptkitError(f"llm.backend={backend}: cannot import {name} from {mod} ({e})") from None
    if not (isinstance(factory, type) and issubclass(factory, Generator)):
        raise CptkitError(f"llm.backend={backend}: {name} is not a cptkit.llm.Generator subclass")
    return factory


def load_generator(llm: Any) -> Generator:
    """Build the generator that ``llm`` (an :class:`LLMConfig`, or a config node of it) describes."""
    backend = str(llm.backend)
    if backend == "auto":
        from cptkit.core.progress import log
        from cptkit.llm.llamacpp import llamacpp_available

        cuda = False
        if str(getattr(llm, "device", "auto")) == "auto":
            import torch

            cuda = torch.cuda.is_available()
        backend, why = choose_local_backend(llm, llamacpp_available(), cuda)
        log.info("llm.backend=auto: %s (%s)", backend, why)
    if ":" in backend:
        return plugin_factory(backend)(llm)
    if backend not in FACTORIES:
        raise CptkitError(f"llm.backend={backend}: expected one of {', '.join(BACKENDS)} or package.module:Class")
    return FACTORIES[backend](llm)
