"""The generation interface shared by every backend: requests in, completions out, cached.

A *request* is a plain prompt (``str``) or a chat (``list`` of ``{"role", "content"}`` dicts).
:meth:`Generator.generate` looks every request up in the disk cache, sends the missing ones to
the backend in fixed batches, stores each finished batch, and returns completions in request
order. Each request gets its own sampling seed derived from (seed, request, params), so its
output does not depend on which other requests share its batch, and a killed run resumes from
the cache to the same output.
"""

from __future__ import annotations

import hashlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Union

from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import content_hash
from cptkit.core.progress import log
from cptkit.llm.cache import CompletionCache

Message = dict[str, str]
Request = Union[str, list[Message]]  # noqa: UP007 (runtime alias)


@dataclass(frozen=True)
class GenParams:
    """Sampling parameters of one ``generate`` call."""

    max_new_tokens: int = 256
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.95
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int = 0

    @classmethod
    def from_config(cls, llm: Any, **overrides: Any) -> GenParams:
        """Defaults from an ``llm`` config (:class:`LLMConfig` or a node of it); ``overrides`` with
        value None are ignored."""
        base = {k: getattr(llm, k) for k in ("max_new_tokens", "temperature", "top_p", "repetition_penalty", "seed")
                if getattr(llm, k, None) is not None}  # llm.max_new_tokens=None: the dataclass default
        base.update({k: v for k, v in overrides.items() if v is not None})
        if "stop" in base:
            base["stop"] = tuple(base["stop"])
        return cls(**base)

    def sampling(self) -> dict[str, Any]:
        """The parameters that shape a sample (everything but the seed)."""
        d = asdict(self)
        d.pop("seed")
        d["stop"] = list(self.stop)
        return d


class RequestRefused(CptkitError):
    """A backend refuses request ``index`` of its batch (a prompt over the context); ``generate``
    names the request by its label (its record id)."""

    def __init__(self, index: int, reason: str):
        self.index = index
        super().__init__(reason)


@dataclass
class Completion:
    """One generated continuation and its token counts."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # stop (EOS or a stop string) | length (max_new_tokens reached)
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "finish_reason": self.finish_reason}


@dataclass
class GenStats:
    """Counters for the step summary and manifest."""

    requests: int = 0
    cache_hits: int = 0
    generated: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0  # of all returned completions (cached ones included)
    generated_tokens: int = 0  # completion tokens actually generated in this run
    generation_seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"tokens_per_s": round(self.tokens_per_s, 3)}

    def rows(self) -> dict[str, Any]:
        """Summary-table rows."""
        return {"llm requests": self.requests, "llm cache hits": self.cache_hits,
                "llm prompt tokens": self.prompt_tokens, "llm completion tokens": self.completion_tokens,
                "llm generated tokens/s": self.tokens_per_s}


def normalize_request(req: Any) -> Request:
    """Validate a request: a string, or a list of {"role", "content"} messages."""
    if isinstance(req, str):
        return req
    if isinstance(req, (list, tuple)) and req and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in req):
        return [{"role": m["role"], "content": m["content"]} for m in req]
    raise CptkitError(f"an LLM request must be a string or a list of {{role, content}} messages, got {str(req)[:80]!r}")


def request_seed(base_seed: int, request: Request, params: GenParams) -> int:
    """The sampling seed of one request: independent of batch composition and backend."""
    blob = json.dumps([base_seed, request, params.sampling()], sort_keys=True, ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(blob.encode()).digest()[:4], "little") & 0x7FFFFFFF


def cache_key(model_id: str, request: Request, params: GenParams, seed: int, chat: bool, system: str | None,
              backend: str = "transformers") -> str:
    """sha256 of everything that determines a completion.

    The backend is part of the key except for ``transformers`` (whose keys predate it): the same
    GGUF file gives other samples through llama.cpp than through transformers.
    """
    d: dict[str, Any] = {"model": model_id, "request": request, "params": params.sampling(), "seed": seed,
                         "chat": chat, "system": system}
    if backend != "transformers":
        d["backend"] = backend
    blob = json.dumps(d, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def apply_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` at the earliest stop string; return (text, whether it was cut)."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def settled_prefix(text: str, stop: Sequence[str]) -> str:
    """The part of ``text`` (a generation so far) that more tokens cannot change: cut at the earliest
    stop string, and short of any tail that may still begin one (``"…###"`` with stop ``"####"``) or
    that is an incomplete UTF-8 character (U+FFFD, which the next token's bytes may complete)."""
    cut, _ = apply_stop(text, stop)
    hold = max((k for s in stop if s for k in range(min(len(s) - 1, len(text)), 0, -1)
                if text.endswith(s[:k])), default=0)  # the longest tail that is a stop string's head
    return cut[:len(text) - hold].rstrip("\ufffd")


class TextDeltas:
    """A completion's text in pieces while it is generated (``serve-llm``'s streaming). The pieces add up
    to the finished :attr:`Completion.text` (cut at the first stop string, stripped): no piece holds text a
    stop string may still cut, nor leading or trailing whitespace that the final strip drops."""

    def __init__(self, stop: Sequence[str]):
        self.stop = tuple(s for s in stop if s)
        self.sent = ""

    def update(self, raw: str) -> str:
        """The new piece, given the raw text generated so far ("" when nothing new is settled)."""
        return self._to(settled_prefix(raw, self.stop).strip())

    def finish(self, text: str) -> str:
        """The last piece, given the finished completion's text."""
        return self._to(text)

    def _to(self, text: str) -> str:
        if not text.startswith(self.sent):  # a decoder revised settled text (never for llama.cpp): wait
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece


TextSink = Callable[[str], None]  # receives a request's raw text so far, after each token


class Generator(ABC):
    """Base class: caching, batching and statistics. Backends implement :meth:`_generate`."""

    backend = "base"

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.chat = bool(cfg.chat)
        self.system = cfg.system if getattr(cfg, "system", None) else None
        self.batch_size = max(1, int(cfg.batch_size))
        self.cache = CompletionCache(str(cfg.cache_dir)) if cfg.cache else None
        self.stats = GenStats()
        self.model_id = str(cfg.model)
        self.model_key = ""  # the model's content in the completion cache's key (key_model); "" = model_id alone
        if getattr(cfg, "requantize", None) and self.backend != "llamacpp":
            log.warning("llm.requantize=%s is for the llamacpp backend: ignored by %s", cfg.requantize, self.backend)

    def key_model(self, path: str | Path) -> None:
        """Key cached completions by the content of the model at ``path`` (a file or a folder) as well as
        its name: a model retrained, re-quantized or swapped in place under the same name must not be
        served the old model's completions. sha256 once per file version (``core.fingerprint``'s cache)."""
        digest = content_hash(path)
        self.model_key = digest[0][:16] if digest else ""

    # -- subclass API -----------------------------------------------------------------------
    @abstractmethod
    def _generate(self, requests: list[Request], params: GenParams, seeds: list[int]) -> list[Completion]:
        """Generate one batch (no cache). ``seeds[i]`` is request i's sampling seed."""

    def generate_live(self, requests: list[Request], params: GenParams, seeds: list[int],
                      on_text: Sequence[TextSink | None], cancelled: Sequence[Callable[[], bool]]) -> list[Completion]:
        """One batch like :meth:`_generate` (no cache), for ``serve-llm``: ``on_text[i]`` (when not None)
        gets request i's raw text so far as it grows, and request i may stop early once ``cancelled[i]()``
        (its client hung up; its completion is then partial). A backend that can report tokens as it
        generates overrides this (llama.cpp); by default the batch runs to its end and no text is
        reported before it (a streaming client gets the whole text in one piece)."""
        return self._generate(requests, params, seeds)

    def params(self, **overrides: Any) -> GenParams:
        """Default parameters from the config, with overrides."""
        return GenParams.from_config(self.cfg, **overrides)

    # -- public API -------------------------------------------------------------------------
    def generate(self, requests: Sequence[Request], params: GenParams | None = None, *,
                 seeds: Sequence[int] | None = None,
                 progress: Callable[[int], None] | None = None,
                 labels: Sequence[str] | None = None) -> list[Completion]:
        """Complete every request (cached ones from disk), in order.

        ``seeds`` optionally gives each request its own base seed (e.g. to draw several samples
        of one prompt); by default all use ``params.seed``. ``labels`` names each request (its
        record id) in a backend's ``RequestRefused`` (a prompt over the context).
        """
        params = params or self.params()
        reqs = [normalize_request(r) for r in requests]
        base = list(seeds) if seeds is not None else [params.seed] * len(reqs)
        if len(base) != len(reqs):
            raise ValueError("seeds must have one entry per request")
        row_seeds = [request_seed(s, r, params) for s, r in zip(base, reqs, strict=True)]
        model = f"{self.model_id}@{self.model_key}" if self.model_key else self.model_id
        keys = [cache_key(model, r, params, s, self.chat, self.system, self.backend)
                for r, s in zip(reqs, row_seeds, strict=True)]
        out: list[Completion | None] = [None] * len(reqs)
        if self.cache is not None:
            for i, hit in enumerate(self.cache.get_many(keys)):
                if hit is not None:
                    out[i] = Completion(**hit, cached=True)
        hits = sum(c is not None for c in out)
        if progress and hits:
            progress(hits)
        # fixed batches over the whole call (sorted by length), so a resumed run forms the same batches
        order = sorted(range(len(reqs)), key=lambda i: len(json.dumps(reqs[i], ensure_ascii=False)))
        for start in range(0, len(order), self.batch_size):
            todo = [i for i in order[start:start + self.batch_size] if out[i] is None]
            if not todo:
                continue
            t0 = time.perf_counter()
            try:
                comps = self._generate([reqs[i] for i in todo], params, [row_seeds[i] for i in todo])
            except RequestRefused as e:
                if not labels:
                    raise
                raise CptkitError(f"{labels[todo[e.index]]}: {e}") from None
            self.stats.generation_seconds += time.perf_counter() - t0
            for i, c in zip(todo, comps, strict=True):
                out[i] = c
                self.stats.generated += 1
                self.stats.generated_tokens += c.completion_tokens
            if self.cache is not None:
                self.cache.put_many([(keys[i], out[i].to_json()) for i in todo])  # type: ignore[union-attr]
            if progress:
                progress(len(todo))
        done: list[Completion] = out  # type: ignore[assignment]
        self.stats.requests += len(done)
        self.stats.cache_hits += hits
        self.stats.prompt_tokens += sum(c.prompt_tokens for c in done)
        self.stats.completion_tokens += sum(c.completion_tokens for c in done)
        return done

    def provenance(self, prompt: str, params: GenParams, seed: int | None = None) -> dict[str, Any]:
        """``meta.generator`` of a record this generator wrote, the same fields for every step: prompt id,
        model, backend, sampling settings and the base seed of its request (``params.seed`` unless given;
        with the rendered prompt it determines the sample: :func:`request_seed`)."""
        return {"prompt": prompt, "model": self.model_id, "backend": self.backend, "temperature": params.temperature,
                "top_p": params.top_p, "max_new_tokens": params.max_new_tokens,
                "seed": params.seed if seed is None else seed}

    def describe(self) -> dict[str, Any]:
        """What to record in a manifest (never secrets)."""
        return {"backend": self.backend, "model": self.model_id}

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

