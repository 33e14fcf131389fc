"""Local generation with llama.cpp (PyPI ``llama-cpp-python``) on a GGUF file: the embedded
SmolLM2-135M-Instruct or any ``.gguf`` model. On CPU it is many times faster than the
transformers backend on the same file (docs/benchmarks.md, generate).

* Chat requests go through the GGUF's own chat template (``tokenizer.chat_template``, rendered
  with jinja2 the way transformers renders it); plain prompts with ``llm.chat=false`` are fed raw.
* Sampling is cptkit's: temperature, then top-p (the order transformers and vLLM use), then a
  draw from llama.cpp's RNG seeded with the request's own seed; temperature 0 is greedy. top-k
  and min-p (llama.cpp's defaults 40 and 0.05) are off. ``repetition_penalty`` maps to llama.cpp's
  repeat penalty over the generated tokens.
* Requests run one after another on one context (llama.cpp's high-level API has no multi-sequence
  batch); the state is reset before each, so a request's output never depends on its batch or
  on the request before it.
* Generation stops at an end-of-generation token (``finish_reason="stop"``), at a stop string
  (cut from the text, ``stop``) or after ``max_new_tokens`` (``length``).
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.llm.base import Completion, Generator, GenParams, Request, RequestRefused, apply_stop

INSTALL_HINT = "pip install -c constraints.txt llama-cpp-python==0.3.36 (make install builds it once)"


def llamacpp_available() -> bool:
    """Whether ``llama_cpp`` can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def gguf_path(model: str, gguf_file: str | None) -> Path | None:
    """The GGUF file ``llm.model`` / ``llm.gguf_file`` name, or None when it is not a GGUF model."""
    from cptkit.llm.hf import EMBEDDED, embedded_model_path

    if model in EMBEDDED:
        return embedded_model_path(model)
    p = Path(model).expanduser()
    if p.suffix == ".gguf":
        if not p.exists():
            raise CptkitError(f"llm.model={model}: no such file")
        return p
    if gguf_file:
        f = p / gguf_file
        if not f.exists():
            raise CptkitError(f"llm.model={model} llm.gguf_file={gguf_file}: no such file")
        return f
    return None


def default_threads() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class LlamaCppGenerator(Generator):
    backend = "llamacpp"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        path = gguf_path(str(cfg.model), getattr(cfg, "gguf_file", None))
        if path is None:
            raise CptkitError(f"llm.backend=llamacpp needs a GGUF model file: llm.model={cfg.model} is not one "
                              "(use llm.backend=transformers for a model directory)")
        try:
            from llama_cpp import Llama
        except ImportError:
            raise CptkitError(f"llm.backend=llamacpp needs llama-cpp-python: {INSTALL_HINT}") from None
        if str(getattr(cfg, "device", "auto")).startswith("cuda"):
            raise CptkitError(f"llm.device={cfg.device}: the llamacpp backend runs on CPU here; "
                              "use llm.backend=transformers or vllm on a GPU")
        threads = int(getattr(cfg, "num_threads", 0) or 0) or default_threads()
        n_ctx = int(getattr(cfg, "max_model_len", 0) or 0)  # 0: the model's training context
        log.info("loading %s with llama.cpp (%d threads)", path, threads)
        try:
            self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                             seed=0, verbose=False)
        except (ValueError, RuntimeError) as e:
            raise CptkitError(f"llm.model={cfg.model}: llama.cpp cannot load {path} ({str(e).splitlines()[0]})") from None
        atexit.register(self._free)
        self.model_id = f"{path.parent.name}/{path.name}"
        self.n_ctx = self.llm.n_ctx()
        self.threads = threads
        self.formatter = None  # renders chat messages (also with llm.chat=false, e.g. serve-llm's /chat/completions)
        template = self.llm.metadata.get("tokenizer.chat_template")
        if self.chat and not template:
            raise CptkitError(f"llm.model={cfg.model}: the GGUF file has no chat template; set llm.chat=false")
        if template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            model = self.llm._model
            self.formatter = Jinja2ChatFormatter(template, eos_token=model.token_get_text(model.token_eos()),
                                                 bos_token=model.token_get_text(model.token_bos()))

    def render(self, request: Request) -> str:
        """The exact text fed to the model for ``request``."""
        if isinstance(request, str) and not self.chat:
            return request
        msgs = request if isinstance(request, list) else (
            ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": request}])
        if self.formatter is None:
            raise CptkitError(f"llm.model={self.cfg.model}: chat messages need a model with a chat template")
        return self.formatter(messages=msgs).prompt

    def tokens(self, request: Request) -> list[int]:
        """Prompt token ids: chat-rendered text holds its special tokens; raw prompts get BOS if the model adds one."""
        raw = isinstance(request, str) and not self.chat
        return self.llm.tokenize(self.render(request).encode("utf-8"), add_bos=raw, special=True)

    def _sampler(self, params: GenParams, seed: int) -> Any:
        from llama_cpp._internals import LlamaSampler

        s = LlamaSampler()
        if float(params.repetition_penalty) != 1.0:
            s.add_penalties(n_vocab=self.llm.n_vocab(), penalty_last_n=-1, penalty_repeat=float(params.repetition_penalty),
                            penalty_freq=0.0, penalty_present=0.0)
        if float(params.temperature) <= 0:
            s.add_greedy()
            return s
        s.add_temp(float(params.temperature))
        if float(params.top_p) < 1.0:
            s.add_top_p(float(params.top_p), 1)
        s.add_dist(int(seed) & 0xFFFFFFFF)
        return s

    def _one(self, request: Request, params: GenParams, seed: int) -> Completion:
        import llama_cpp

        prompt = self.tokens(request)
        max_new = int(params.max_new_tokens)
        if len(prompt) + max_new > self.n_ctx:
            raise CptkitError(f"a prompt of {len(prompt)} tokens + max_new_tokens {max_new} exceeds the context of "
                              f"{self.n_ctx} tokens (llm.max_model_len)")
        llm = self.llm
        vocab = llm._model.vocab
        sampler = self._sampler(params, seed)
        llm.reset()
        llm.eval(prompt)
        out: list[int] = []
        reason = "length"
        n = 0
        while n < max_new:
            tok = sampler.sample(llm._ctx, -1)  # samples from the last logits and accepts the token
            n += 1
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                reason = "stop"
                break
            out.append(tok)
            if params.stop and apply_stop(self._decode(out), params.stop)[1]:
                reason = "stop"
                break
            if n < max_new:
                llm.eval([tok])
        text, cut = apply_stop(self._decode(out), params.stop)
        return Completion(text=text.strip(), prompt_tokens=len(prompt), completion_tokens=n,
                          finish_reason="stop" if cut else reason)

    def _decode(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids, special=False).decode("utf-8", errors="replace")

    def _generate(self, requests: list[Request], params: GenParams, seeds: list[int]) -> list[Completion]:
        out = []
        for k, (r, s) in enumerate(zip(requests, seeds, strict=True)):
            try:
                out.append(self._one(r, params, s))
            except CptkitError as e:  # the caller names the request (Generator.generate's labels)
                raise RequestRefused(k, str(e)) from None
        return out

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"device": "cpu", "threads": self.threads, "n_ctx": self.n_ctx}

    def close(self) -> None:
        super().close()
        self._free()

    def _free(self) -> None:
        """Free the model now: llama-cpp-python's own ``__del__`` fails when it runs at interpreter exit."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.close()
