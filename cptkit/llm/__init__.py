"""Text generation for cptkit steps: one batched, cached interface over several backends.

    from cptkit.llm import load_generator, GenParams
    gen = load_generator(cfg.llm)                      # the `llm` config group
    outs = gen.generate(["prompt", [{"role": "user", "content": "hi"}]],
                        gen.params(max_new_tokens=64))
    outs[0].text, outs[0].completion_tokens, outs[0].finish_reason
    gen.stats.as_dict()                                # token counts, tokens/s -> manifest

Backends (``llm.backend``): ``transformers`` (default; embedded SmolLM2 on CPU), ``openai``
(any OpenAI-compatible server), ``vllm`` (offline engine). See docs/llm.md.
"""

from __future__ import annotations

from typing import Any

from cptkit.errors import CptkitError
from cptkit.llm.base import Completion, Generator, GenParams, GenStats, Request
from cptkit.llm.config import LLMConfig

__all__ = ["Completion", "GenParams", "GenStats", "Generator", "LLMConfig", "Request", "load_generator", "BACKENDS"]

BACKENDS = ("transformers", "openai", "vllm")


def load_generator(llm: Any) -> Generator:
    """Build the generator that ``llm`` (a config node of :class:`LLMConfig`) describes."""
    backend = str(llm.backend)
    if backend == "transformers":
        from cptkit.llm.hf import TransformersGenerator

        return TransformersGenerator(llm)
    if backend == "openai":
        from cptkit.llm.openai_http import OpenAIGenerator

        return OpenAIGenerator(llm)
    if backend == "vllm":
        from cptkit.llm.vllm_engine import VLLMGenerator

        return VLLMGenerator(llm)
    raise CptkitError(f"llm.backend={backend}: expected one of {', '.join(BACKENDS)}")
