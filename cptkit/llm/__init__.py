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
from cptkit.core.progress import log
from cptkit.core.registry import Registry
from cptkit.llm.base import Completion, Generator, GenParams, GenStats, Request
from cptkit.llm.config import LLMConfig
from cptkit.llm.llamacpp import LlamaCppGenerator, gguf_path, llamacpp_available
from cptkit.llm.openai_http import OpenAIGenerator

__all__ = ["Completion", "GenParams", "GenStats", "Generator", "LLMConfig", "Request", "load_generator", "BACKENDS",
           "GENERATORS", "choose_local_backend"]

# llm.backend name -> factory(llm config) -> Generator; each factory imports its engine only when
# chosen. A plugin ``package.module:Class`` is a Generator subclass, built the same way: Class(llm).
GENERATORS: Registry[Callable[[Any], Generator]] = Registry("llm.backend", base=Generator)


def choose_local_backend(llm: Any, llamacpp_installed: bool, cuda: bool) -> tuple[str, str]:
    """What ``llm.backend=auto`` runs: ``(backend, why)``.

    llama.cpp when it is installed, the model is a GGUF file (the embedded SmolLM2 is one) and
    generation runs on CPU; transformers otherwise (a model directory, a GPU, no llama-cpp-python).
    """
    device = str(getattr(llm, "device", "auto"))
    if gguf_path(str(llm.model), getattr(llm, "gguf_file", None)) is None:
        return "transformers", f"llm.model={llm.model} is not a GGUF file"
    if device.startswith("cuda") or (device == "auto" and cuda):
        return "transformers", "a CUDA device is used"
    if not llamacpp_installed:
        return "transformers", "llama-cpp-python is not installed (make install builds it)"
    return "llamacpp", "GGUF model on CPU and llama-cpp-python is installed"


# the factories defer their engines' imports (llama_cpp, transformers, vllm, ...): chosen at run time
@GENERATORS.register("llamacpp")
def _llamacpp(llm: Any) -> Generator:

    return LlamaCppGenerator(llm)


@GENERATORS.register("transformers")
def _transformers(llm: Any) -> Generator:
    from cptkit.llm.hf import TransformersGenerator  # deferred: numpy, tokenizers, torch

    return TransformersGenerator(llm)


@GENERATORS.register("openai")
def _openai(llm: Any) -> Generator:

    return OpenAIGenerator(llm)


@GENERATORS.register("vllm")
def _vllm(llm: Any) -> Generator:
    from cptkit.llm.vllm_engine import VLLMGenerator  # deferred: numpy, tokenizers, torch

    return VLLMGenerator(llm)


BACKENDS = ("auto", *GENERATORS.names())  # every llm.backend name (or package.module:Class)


def load_generator(llm: Any) -> Generator:
    """Build the generator that ``llm`` (an :class:`LLMConfig`, or a config node of it) describes."""
    backend = str(llm.backend)
    if backend == "auto":
        cuda = False
        if str(getattr(llm, "device", "auto")) == "auto":
            import torch  # deferred: torch, only to ask for a GPU

            cuda = torch.cuda.is_available()
        backend, why = choose_local_backend(llm, llamacpp_available(), cuda)
        log.info("llm.backend=auto: %s (%s)", backend, why)
    if ":" not in backend and backend not in GENERATORS:
        raise CptkitError(f"llm.backend={backend}: expected one of {', '.join(BACKENDS)} or package.module:Class")
    return GENERATORS.get(backend)(llm)
