"""serve-llm: serve a local model (llm=transformers|vllm) as an OpenAI-compatible HTTP API
(/v1/chat/completions, /v1/completions, /v1/models) with request batching (cptkit.llm.serve)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from cptkit.core.config import JobConfig, check
from cptkit.core.progress import setup_logging
from cptkit.core.run import Run
from cptkit.core.step import QUIET, step
from cptkit.llm import load_generator
from cptkit.llm.config import LLMConfig
from cptkit.llm.serve import LOCAL_HOSTS, Limits, serve


@dataclass
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0 = any free port (see ready_file)
    model_name: str | None = None  # the name clients send; default: the model id
    max_batch: int = 8
    batch_wait_ms: float = 20.0
    ready_file: str | None = None  # write the base URL here once listening
    max_body_bytes: int = 2**20  # larger request bodies get 413 without being read
    max_prompt_chars: int = 65536  # longer prompts (all messages together) get 413
    max_tokens_cap: int = 2048  # a request's max_tokens above it gets 400
    slice_tokens: int = 16  # tokens a batch runs before queued requests get their turn (transformers)
    max_n: int = 16  # choices per request (the body's n) above it get 400
    allowed_hosts: list[str] = field(default_factory=list)  # Host/Origin names accepted besides localhost and host
    max_stop: int = 16  # stop strings per request above it get 400
    max_stop_chars: int = 256  # a longer stop string gets 400
    read_timeout_s: float = 10.0  # a request's head and body must arrive within it; a client reading nothing as long is dropped
    max_connections: int = 256  # connections open at once; more get 503 at once

    def __post_init__(self) -> None:
        check(self.max_body_bytes >= 1024, "max_body_bytes", self.max_body_bytes, "must be at least 1024")
        check(self.max_batch >= 1, "max_batch", self.max_batch, "must be >= 1")
        check(self.max_prompt_chars >= 1, "max_prompt_chars", self.max_prompt_chars, "must be >= 1")
        check(self.max_tokens_cap >= 1, "max_tokens_cap", self.max_tokens_cap, "must be >= 1")
        check(self.slice_tokens >= 1, "slice_tokens", self.slice_tokens, "must be >= 1")
        check(self.max_n >= 1, "max_n", self.max_n, "must be >= 1")
        check(self.max_stop >= 0, "max_stop", self.max_stop, "must be >= 0")
        check(self.max_stop_chars >= 1, "max_stop_chars", self.max_stop_chars, "must be >= 1")
        check(self.read_timeout_s > 0, "read_timeout_s", self.read_timeout_s, "must be > 0")
        check(self.max_connections >= 1, "max_connections", self.max_connections, "must be >= 1")

    def limits(self) -> Limits:
        """The per-request limits the server enforces."""
        return Limits(max_body_bytes=self.max_body_bytes, max_prompt_chars=self.max_prompt_chars,
                      max_tokens_cap=self.max_tokens_cap, slice_tokens=self.slice_tokens, max_n=self.max_n,
                      allowed_hosts=(*LOCAL_HOSTS, *self.allowed_hosts), max_stop=self.max_stop,
                      max_stop_chars=self.max_stop_chars, read_timeout_s=self.read_timeout_s,
                      max_connections=self.max_connections)


@dataclass
class ServeLLMJob(JobConfig):
    llm: LLMConfig = field(default_factory=LLMConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)

    def __post_init__(self) -> None:
        check(self.llm.backend != "openai", "llm.backend", self.llm.backend,
              "serve-llm serves a local backend: use llm=auto, llm=llamacpp, llm=transformers or llm=vllm")


@step("serve-llm", ServeLLMJob, options=(QUIET,), order=180)
def run(conf: ServeLLMJob, ctx: Run) -> None:
    setup_logging(conf.quiet)
    llm = dataclasses.replace(conf.llm, cache=False, chat=False)  # plain prompts stay raw for /completions
    gen = load_generator(llm)
    s = conf.serve
    serve(gen, s.host, s.port, model_name=s.model_name, max_batch=s.max_batch, batch_wait_ms=s.batch_wait_ms,
          default_max_tokens=gen.params().max_new_tokens, ready_file=s.ready_file, limits=s.limits())
