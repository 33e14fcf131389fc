"""Local generation with llama.cpp (PyPI ``llama-cpp-python``) on a GGUF file: the embedded
SmolLM2-135M-Instruct or any ``.gguf`` model. On CPU it is many times faster than the
transformers backend on the same file (docs/benchmarks.md, generate).

* Chat requests go through the GGUF's own chat template (``tokenizer.chat_template``, rendered
  with jinja2 the way transformers renders it); plain prompts with ``llm.chat=false`` are fed raw.
* Sampling is cptkit's: temperature, then top-p (the order transformers and vLLM use), then a
  draw from llama.cpp's RNG seeded with the request's own seed; temperature 0 is greedy. top-k
  and min-p (llama.cpp's defaults 40 and 0.05) are off. ``repetition_penalty`` maps to llama.cpp's
  repeat penalty over the generated tokens.
* Requests are decoded together: up to ``llm.batch_size`` sequences share one llama.cpp context
  (low-level API: ``llama_decode`` on a multi-sequence batch), one KV stream per sequence
  (``kv_unified=false``) and one sampler chain each. The prompts waiting for free slots are
  prefilled together (one batch of up to ``PREFILL_CHUNK`` tokens of several sequences), then every
  decode step advances all live sequences by one token; a finished sequence's KV is removed and
  its slot goes to the next request. ``llm.batch_size=1`` is the same code with one sequence.
  A sequence's attention reads only its own stream and every matmul row is computed alone, so a
  request's output does not depend on its batch, the order of requests or the thread count
  (greedy and seeded samples are tested identical batched and one at a time).
* ``llm.requantize=q8_0`` (or ``q4_0``) converts the GGUF once with llama.cpp's own quantizer and
  generates from the copy (cached under ``$CPTKIT_CACHE/gguf-requant``, keyed by the source's
  sha256, the type and the llama-cpp-python version). llama.cpp repacks these formats for its CPU
  GEMM kernels, so batched decoding pays off far more than on Q4_1, the embedded SmolLM2's format
  (docs/benchmarks.md, generate). The copy's outputs are its own, not the source's.
* Generation stops at an end-of-generation token (``finish_reason="stop"``), at a stop string
  (cut from the text, ``stop``) or after ``max_new_tokens`` (``length``).
* ``generate_live`` (``serve-llm``): the same decoding, handing each request's text to its sink after
  every token (streamed to the client) and retiring a request whose client hung up before the next
  decode step.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cptkit.core.cache import entry
from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import content_hash, remove_dead_tmps
from cptkit.core.progress import log
from cptkit.llm.base import (
    Completion,
    Generator,
    GenParams,
    Request,
    RequestRefused,
    TextSink,
    apply_stop,
)

INSTALL_HINT = "pip install -c constraints.txt llama-cpp-python==0.3.36 (make install builds it once)"
PREFILL_CHUNK = 512  # prompt tokens per llama_decode (llama-cpp-python's default n_batch)
FLASH_ATTN = -1  # LLAMA_FLASH_ATTN_TYPE_AUTO, llama.cpp's (and llama-bench's) default


@dataclass
class DecodeProfile:
    """Where generation time goes (seconds, summed over ``_generate`` calls; bench/generate.py reads it)."""

    calls: int = 0
    total_s: float = 0.0  # wall time of _generate (tokenizing, prefill, decode, sampling, bookkeeping)
    prefill_s: float = 0.0  # llama_decode of prompts
    prefill_tokens: int = 0
    decode_s: float = 0.0  # llama_decode of the one-token-per-sequence steps
    decode_steps: int = 0
    decode_tokens: int = 0  # sequences advanced, summed over steps
    sample_s: float = 0.0  # sampling, EOG/stop checks, retiring sequences (Python + llama.cpp samplers)


class _Seq:
    """One request in flight: its sequence id (KV stream) in the shared context, its sampler, its tokens."""

    __slots__ = ("k", "seq", "sampler", "pos", "tok", "n", "out", "reason")

    def __init__(self, k: int, seq: int, sampler: Any, pos: int):
        self.k, self.seq, self.sampler, self.pos = k, seq, sampler, pos
        self.tok, self.n, self.out, self.reason = -1, 0, [], "length"


class _Batch:
    """One ``_generate`` call: its prompts and parameters, the requests waiting for a slot, the free
    slots (sequence ids), the results, and serve-llm's text sinks and cancel checks (or None)."""

    def __init__(self, prompts: list[list[int]], params: GenParams, seeds: list[int],
                 on_text: Sequence[TextSink | None] | None = None,
                 cancelled: Sequence[Callable[[], bool]] | None = None):
        self.prompts, self.params, self.seeds = prompts, params, seeds
        self.on_text, self.cancelled = on_text, cancelled
        self.pending = deque(range(len(prompts)))
        self.results: list[Completion | None] = [None] * len(prompts)
        self.free: list[int] = []
        self.mem: Any = None


def llamacpp_available() -> bool:
    """Whether ``llama_cpp`` can be imported (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def gguf_path(model: str, gguf_file: str | None) -> Path | None:
    """The GGUF file ``llm.model`` / ``llm.gguf_file`` name, or None when it is not a GGUF model."""
    from cptkit.llm.hf import EMBEDDED, embedded_model_path  # deferred: torch

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


# llama.cpp's ftype for each llm.requantize value (llama.h: LLAMA_FTYPE_MOSTLY_*)
REQUANTIZE = {"q8_0": 7, "q4_0": 2}


def requantized(path: Path, qtype: str, threads: int) -> Path:
    """``path`` converted once to ``qtype`` by llama.cpp's quantizer (``llama_model_quantize``), kept in
    ``$CPTKIT_CACHE/gguf-requant/<stem>.<qtype>-<key>.gguf``; written under a temporary name and
    renamed, so a killed conversion leaves no file that looks finished."""
    import ctypes

    import llama_cpp
    from llama_cpp._utils import suppress_stdout_stderr

    if qtype not in REQUANTIZE:
        raise CptkitError(f"llm.requantize={qtype}: must be one of {', '.join(REQUANTIZE)} (or null)")
    sha, _ = content_hash(path) or ("", 0)
    key = hashlib.sha256(f"{sha}\0{qtype}\0{llama_cpp.__version__}".encode()).hexdigest()[:16]
    out = entry("gguf-requant", f"{path.stem}.{qtype}-{key}.gguf")  # a link planted there is refused
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_tmps(out)  # a conversion killed before its rename
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = REQUANTIZE[qtype], True, threads
    log.info("llm.requantize=%s: converting %s once (llama.cpp quantizer) -> %s", qtype, path.name, out)
    try:
        with suppress_stdout_stderr(disable=False):  # a line per tensor on stderr, from C
            rc = llama_cpp.llama_model_quantize(str(path).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise CptkitError(f"llm.requantize={qtype}: llama.cpp cannot convert {path}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def default_threads() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_kernels(system_info: str) -> str:
    """The CPU features llama.cpp was built with and uses, from ``llama_print_system_info()``
    (``"CPU : AVX2 = 1 | AVX512 = 0 | ..."`` -> ``"AVX2"``): outputs depend on them (the vector width
    sets the order of float sums), so two machines with different ones may write different text."""
    on = []
    for part in system_info.split("|"):
        name, _, value = part.rpartition("=")
        name = name.split(":")[-1].strip()
        if name and value.strip() == "1":
            on.append(name)
    return " ".join(on)


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
        import llama_cpp

        threads = int(getattr(cfg, "num_threads", 0) or 0) or default_threads()
        if getattr(cfg, "requantize", None):
            path = requantized(path, str(cfg.requantize), threads)
        log.info("loading %s with llama.cpp (%d threads)", path, threads)
        self._ctx, self._ctx_shape, self._batch = None, (0, 0), None
        try:  # Llama: model, tokenizer, metadata; its own small context is unused (generation has its own)
            self.llm = Llama(model_path=str(path), n_ctx=256, n_batch=256, n_threads=threads,
                             n_threads_batch=threads, seed=0, verbose=False)
        except (ValueError, RuntimeError) as e:
            raise CptkitError(f"llm.model={cfg.model}: llama.cpp cannot load {path} ({str(e).splitlines()[0]})") from None
        atexit.register(self._free)
        self.model_id = f"{path.parent.name}/{path.name}"
        self.key_model(path)
        n_ctx = int(getattr(cfg, "max_model_len", 0) or 0) or self.llm._model.n_ctx_train()
        self.n_ctx = -(-n_ctx // 256) * 256  # per request; llama.cpp pads contexts to 256
        self.max_seqs = int(llama_cpp.llama_max_parallel_sequences())
        self.profile = DecodeProfile()
        self.threads = threads
        self.version = str(llama_cpp.__version__)
        self.kernels = cpu_kernels(llama_cpp.llama_print_system_info().decode(errors="replace"))
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

    # -- the shared context ------------------------------------------------------------------
    def _context(self, n_seq: int, need: int) -> Any:
        """The llama.cpp context for ``n_seq`` sequences of up to ``need`` tokens each: one KV stream
        per sequence (``kv_unified=false``), grown (recreated) when a batch needs more."""
        import llama_cpp

        cap = min(self.n_ctx, max(512, 1 << max(0, need - 1).bit_length()))  # a multiple of 256
        have_seq, have_cap = self._ctx_shape
        if self._ctx is not None and have_seq >= n_seq and have_cap >= cap:
            return self._ctx
        self._free_ctx()
        n_seq, cap = max(n_seq, have_seq), max(cap, have_cap)
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = cap * n_seq
        p.n_batch = p.n_ubatch = PREFILL_CHUNK
        p.n_seq_max = n_seq
        p.n_threads = p.n_threads_batch = self.threads
        p.kv_unified = False  # each sequence its own stream: its attention never sees another's cells
        p.flash_attn_type = FLASH_ATTN
        p.no_perf = True
        ctx = llama_cpp.llama_init_from_model(self.llm._model.model, p)
        if not ctx:
            raise CptkitError(f"llm.model={self.cfg.model}: llama.cpp cannot create a context of {n_seq} x {cap} "
                              "tokens (lower llm.batch_size or llm.max_model_len)")
        self._ctx, self._ctx_shape = ctx, (n_seq, cap)
        self._batch = llama_cpp.llama_batch_init(max(PREFILL_CHUNK, n_seq), 0, 1)
        for i in range(max(PREFILL_CHUNK, n_seq)):
            self._batch.n_seq_id[i] = 1  # every token belongs to one sequence
        return ctx

    def _free_ctx(self) -> None:
        import llama_cpp

        ctx, self._ctx = getattr(self, "_ctx", None), None
        if ctx is not None:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(ctx)

    def _prefill(self, ctx: Any, prompts: list[list[int]], seqs: list[int]) -> Iterator[tuple[int, int]]:
        """Decode ``prompts`` into their sequences' KV streams, together, in batches of up to
        ``PREFILL_CHUNK`` tokens (a prompt may span two). Right after the decode that computed a
        prompt's last token, yields (the prompt's number, that token's index in the batch): its
        logits are readable there until the next decode."""
        import llama_cpp

        b = self._batch
        flat = [(j, i, t) for j, prompt in enumerate(prompts) for i, t in enumerate(prompt)]
        for start in range(0, len(flat), PREFILL_CHUNK):
            chunk = flat[start:start + PREFILL_CHUNK]
            ends = []
            for n, (j, i, t) in enumerate(chunk):
                last = i == len(prompts[j]) - 1
                b.token[n], b.pos[n], b.logits[n] = t, i, last
                b.seq_id[n][0] = seqs[j]
                if last:
                    ends.append((j, n))
            b.n_tokens = len(chunk)
            if (rc := llama_cpp.llama_decode(ctx, b)) != 0:
                raise CptkitError(f"llama_decode returned {rc} on {len(prompts)} prompts of {len(flat)} tokens")
            yield from ends

    def _prompts(self, requests: list[Request], max_new: int) -> list[list[int]]:
        """Each request's prompt tokens; refused before anything is generated when one does not fit
        the context (the caller names request k)."""
        prompts = []
        for k, r in enumerate(requests):
            prompt = self.tokens(r)
            if len(prompt) + max_new > self.n_ctx:
                raise RequestRefused(k, f"a prompt of {len(prompt)} tokens + max_new_tokens {max_new} exceeds the "
                                        f"context of {self.n_ctx} tokens (llm.max_model_len)")
            prompts.append(prompt)
        return prompts

    def _generate(self, requests: list[Request], params: GenParams, seeds: list[int]) -> list[Completion]:
        """Decode up to ``batch_size`` requests at once on one context, one sequence (KV stream and
        sampler) each; a finished sequence frees its slot for the next request."""
        return self._decode_all(_Batch(self._prompts(requests, int(params.max_new_tokens)), params, seeds))

    def generate_live(self, requests: list[Request], params: GenParams, seeds: list[int],
                      on_text: Sequence[TextSink | None], cancelled: Sequence[Callable[[], bool]]) -> list[Completion]:
        """:meth:`_generate` reporting each request's text after every token (``on_text[i]``), and
        retiring a request before the next decode step once ``cancelled[i]()`` (serve-llm's streaming)."""
        batch = _Batch(self._prompts(requests, int(params.max_new_tokens)), params, seeds, on_text, cancelled)
        return self._decode_all(batch)

    def _decode_all(self, run: _Batch) -> list[Completion]:
        import llama_cpp

        t_start = time.perf_counter()
        prompts, max_new = run.prompts, int(run.params.max_new_tokens)
        if max_new <= 0:
            return [Completion(text="", prompt_tokens=len(p), completion_tokens=0, finish_reason="length")
                    for p in prompts]
        n_slots = max(1, min(self.batch_size, len(prompts), self.max_seqs))
        ctx = self._context(n_slots, max(map(len, prompts)) + max_new)
        run.mem = llama_cpp.llama_get_memory(ctx)
        llama_cpp.llama_memory_clear(run.mem, True)
        run.free = list(range(n_slots))[::-1]
        sample, decode = llama_cpp.llama_sampler_sample, llama_cpp.llama_decode
        b = self._batch
        b_tok, b_pos, b_logits, b_seq = b.token, b.pos, b.logits, b.seq_id
        active: list[_Seq] = []
        prof, clock = self.profile, time.perf_counter
        while run.pending or active:
            if run.pending and run.free:  # admit: the waiting prompts, prefilled together, then their first tokens
                active += self._admit(ctx, run)
            if run.cancelled is not None:  # a client hung up: its sequence goes now
                active = [s for s in active if not (run.cancelled[s.k]() and self._retire(run, s))]
            if not active:
                continue
            for i, s in enumerate(active):  # one token of every live sequence, one decode
                b_tok[i], b_pos[i], b_logits[i], b_seq[i][0] = s.tok, s.pos, 1, s.seq
                s.pos += 1
            b.n_tokens = n = len(active)
            t0 = clock()
            if (rc := decode(ctx, b)) != 0:
                raise CptkitError(f"llama_decode returned {rc} on a batch of {n} sequences")
            t1 = clock()
            active = [s for i, s in enumerate(active) if not self._take(run, s, sample(s.sampler.sampler, ctx, i))]
            prof.decode_s += t1 - t0
            prof.sample_s += clock() - t1
            prof.decode_steps += 1
            prof.decode_tokens += n
        prof.calls += 1
        prof.total_s += clock() - t_start
        return run.results  # type: ignore[return-value]

    def _admit(self, ctx: Any, run: _Batch) -> list[_Seq]:
        """Give free slots to waiting requests, prefill their prompts together and take each one's
        first token; the admitted sequences still generating."""
        import llama_cpp

        admitted: list[_Seq] = []
        while run.pending and run.free:
            k = run.pending.popleft()
            if run.cancelled is not None and run.cancelled[k]():  # hung up before its turn
                run.results[k] = Completion(text="", prompt_tokens=len(run.prompts[k]), finish_reason="stop")
                continue
            admitted.append(_Seq(k, run.free.pop(), self._sampler(run.params, run.seeds[k]), len(run.prompts[k])))
        live: list[_Seq] = []
        prof, clock = self.profile, time.perf_counter
        t0, sampling = clock(), 0.0
        for j, last in self._prefill(ctx, [run.prompts[a.k] for a in admitted], [a.seq for a in admitted]):
            t1 = clock()
            if not self._take(run, admitted[j], llama_cpp.llama_sampler_sample(admitted[j].sampler.sampler, ctx, last)):
                live.append(admitted[j])
            sampling += clock() - t1
        prof.prefill_s += clock() - t0 - sampling
        prof.sample_s += sampling
        prof.prefill_tokens += sum(len(run.prompts[a.k]) for a in admitted)
        return live

    def _take(self, run: _Batch, s: _Seq, tok: int) -> bool:
        """Take sampled token ``tok``; True when ``s`` is finished (then retired, its result set)."""
        import llama_cpp

        s.n += 1
        stop = run.params.stop
        if llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, tok):
            s.reason = "stop"
        else:
            s.out.append(tok)
            sink = run.on_text[s.k] if run.on_text is not None else None
            text = self._decode(s.out) if stop or sink is not None else ""
            if stop and apply_stop(text, stop)[1]:
                s.reason = "stop"
            elif s.n < run.params.max_new_tokens:
                if sink is not None:
                    sink(text)
                s.tok = tok
                return False
        return self._retire(run, s)

    def _retire(self, run: _Batch, s: _Seq) -> bool:
        """Set ``s``'s completion (what it generated so far) and free its KV stream and slot; True."""
        import llama_cpp

        text, cut = apply_stop(self._decode(s.out), run.params.stop)
        run.results[s.k] = Completion(text=text.strip(), prompt_tokens=len(run.prompts[s.k]), completion_tokens=s.n,
                                      finish_reason="stop" if cut else s.reason)
        llama_cpp.llama_memory_seq_rm(run.mem, s.seq, -1, -1)
        run.free.append(s.seq)
        return True

    def _decode(self, ids: list[int]) -> str:
        return self.llm.detokenize(ids, special=False).decode("utf-8", errors="replace")

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"device": "cpu", "threads": self.threads, "n_ctx": self.n_ctx,
                                     "llama_cpp": self.version, "cpu_kernels": self.kernels}

    def close(self) -> None:
        super().close()
        self._free()

    def _free(self) -> None:
        """Free the model now: llama-cpp-python's own ``__del__`` fails when it runs at interpreter exit."""
        self._free_ctx()
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.close()
