"""A small OpenAI-compatible HTTP server over a local backend (``cptkit serve-llm``).

Serves ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` from the
standard library's threading HTTP server. Concurrent requests are gathered for up to
``batch_wait_ms`` into one batch of at most ``max_batch`` (requests with the same sampling
parameters share a batch), so many clients get batched generation. The body's ``seed`` is the
request's sampling seed, so a request gives the same text here as through the in-process backend
with the same seed; ``n`` > 1 choices are n requests, choice 0 with that seed and choice i with
one derived from it (:func:`choice_seeds`).

``stream: true`` answers with server-sent events in OpenAI's (and vLLM's) format: ``data: {chunk}``
events of ``object`` ``chat.completion.chunk`` (the first of each choice carrying
``delta: {"role": "assistant", "content": ""}``) or ``text_completion``, the last of each choice
carrying its ``finish_reason``, ``stream_options: {"include_usage": true}`` adding a chunk with
``choices: []`` and the ``usage``, and ``data: [DONE]`` at the end. Text is sent as tokens are
generated (llama.cpp and transformers report each token; other backends send the whole text at
the end), held back only where a stop string may still cut it (:class:`~cptkit.llm.base.TextDeltas`),
so the pieces add up to the non-streamed text.

Hostile clients cannot stall it (:class:`Limits`): a body over ``max_body_bytes`` gets 413 before
it is read (a chunked body once it passes the limit), a prompt over ``max_prompt_chars`` 413,
``max_tokens`` over ``max_tokens_cap``, a body that is not a JSON object (``Infinity``, ``NaN`` and
nesting deeper than ``MAX_JSON_DEPTH`` included), or more than ``max_stop`` stop strings or one over
``max_stop_chars`` 400, a ``Host`` or ``Origin`` outside ``allowed_hosts`` 403 (DNS rebinding,
cross-origin pages), ``n`` over ``max_n`` 400; a request (head and body) must arrive within
``read_timeout_s``, and at most ``max_connections`` are open at once (others get 503 at once); a
client that hangs up (also mid-stream) cancels its generation, and the :class:`Batcher` interleaves
requests in token slices so none waits for a long one to finish. One request's failure stays its own:
a prompt over the model's context is refused alone (400) and a batch that fails (a tokenizer panic
included) is rerun one request at a time, so the others of its batch are still answered.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import re
import select
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.core.shards import atomic_write_bytes
from cptkit.llm.base import (
    Completion,
    Generator,
    GenParams,
    Request,
    RequestRefused,
    TextDeltas,
    normalize_request,
)

MAX_BODY_BYTES = 2**20
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
MAX_JSON_DEPTH = 64  # nesting of a request body's arrays and objects; deeper: 400 (no RecursionError)
_FATAL = (KeyboardInterrupt, SystemExit)  # what may end the batcher; anything else fails one request


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (serve-llm's ``serve.*`` keys)."""

    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies: 413 before they are read
    max_prompt_chars: int = 65536  # longer prompts (all messages together): 413
    max_tokens_cap: int = 2048  # max_tokens above it: 400
    slice_tokens: int = 16  # tokens per turn of the round-robin scheduler (transformers backend)
    max_n: int = 16  # choices per request (n) above it: 400
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS  # Host header names accepted (DNS rebinding): others get 403
    max_stop: int = 16  # stop strings per request above it: 400
    max_stop_chars: int = 256  # a longer stop string: 400
    read_timeout_s: float = 10.0  # a request's head and body must arrive within it (else closed; 408 for a body)
    max_connections: int = 256  # open connections above it get 503 at once


@dataclass
class _Pending:
    """One choice of one request, from the queue to its completion."""

    request: Request
    params: GenParams
    seed: int
    live: bool = False  # a streaming client: the backend reports the text as it grows (grow)
    changed: threading.Event = field(default_factory=threading.Event)  # new text or the end (shared by the n choices)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    state: Any = None  # the backend's Partial between slices
    text: str = ""  # the raw text generated so far (live requests)
    result: Completion | None = None
    error: str | None = None
    code: int = 500  # the HTTP status of ``error``: 400 for a request the backend refuses

    def grow(self, text: str) -> None:
        self.text = text
        self.changed.set()

    def finish(self, result: Completion | None = None, error: str | None = None, code: int = 500) -> None:
        self.result, self.error, self.code = result, error, code
        self.done.set()
        self.changed.set()


class Failed(RuntimeError):
    """A request that was not completed: ``code`` is its HTTP status (400 refused, 500 failed, 503 the
    generation worker has stopped)."""

    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code


def choice_seeds(seed: int, n: int) -> list[int]:
    """The sampling seeds of a request's ``n`` choices: ``seed`` for choice 0 (so ``n=1`` is unchanged),
    and for choice i a distinct 31-bit seed derived from (``seed``, i)."""
    seeds = [seed]
    for i in range(1, n):
        k = i
        while (s := int.from_bytes(hashlib.sha256(f"{seed}/{k}".encode()).digest()[:4], "little") & 0x7FFFFFFF) in seeds:
            k += n  # a collision (about 1 in 10^8 per pair): the next derived value
        seeds.append(s)
    return seeds


class Batcher:
    """Schedules concurrent requests onto one generator (one worker thread), fairly.

    Requests with the same sampling parameters share a batch of at most
    ``max_batch``. With a backend that can continue a request (``generate_slice``: transformers),
    each batch runs at most ``slice_tokens`` tokens, then its unfinished requests go to the back of
    the queue: round-robin, so a short request waits at most one slice of each request ahead of it,
    never for a long one to finish. Other backends run each batch to the end (bounded by the
    server's ``max_tokens_cap``) through ``generate_live``. A cancelled request (its client hung up)
    is dropped before its next batch, and within a batch at the next token (transformers, llama.cpp).
    """

    def __init__(self, gen: Generator, max_batch: int = 8, wait_ms: float = 20.0, slice_tokens: int = 16):
        self.gen, self.max_batch, self.wait = gen, max(1, max_batch), wait_ms / 1000.0
        self.slice_tokens = max(1, slice_tokens)
        self.sliced = callable(getattr(gen, "generate_slice", None))
        self.q: deque[_Pending] = deque()
        self.cv = threading.Condition()
        self.batches = self.requests = self.cancelled = self.refused = self.failed = 0
        self.stopped: str | None = None  # why the worker thread ended (it should not): /health says so
        self.thread = threading.Thread(target=self._main, daemon=True, name="cptkit-batcher")
        self.thread.start()

    @property
    def alive(self) -> bool:
        """Whether the worker thread still takes requests."""
        return self.stopped is None and self.thread.is_alive()

    def stopped_error(self) -> Failed:
        """The error of a request once the worker has stopped."""
        return Failed(503, f"the generation worker has stopped ({self.stopped or 'unknown reason'})")

    def submit(self, request: Request, params: GenParams, seeds: list[int], live: bool = False) -> list[_Pending]:
        """Queue one choice per seed (sharing one ``changed`` event); ``live``: report text as it grows.
        :class:`Failed` (503) when the worker has stopped."""
        changed = threading.Event()
        got = [_Pending(request, params, s, live=live, changed=changed) for s in seeds]
        with self.cv:
            if not self.alive:
                raise self.stopped_error()
            self.q.extend(got)
            self.cv.notify()
        return got

    def gather(self, got: list[_Pending], gone: Callable[[], bool] = lambda: False) -> list[Completion] | None:
        """Every choice's completion; None (all cancelled) when ``gone()`` turns true first; :class:`Failed`
        when a choice failed or the worker stopped."""
        while not all(p.done.is_set() for p in got):
            got[0].changed.wait(0.05)
            got[0].changed.clear()
            if gone():
                self.cancel(got)
                return None
            if not self.alive:
                raise self.stopped_error()
        for p in got:
            if p.error is not None:
                raise Failed(p.code, p.error)
        return [p.result for p in got]  # type: ignore[misc]

    @staticmethod
    def cancel(got: list[_Pending]) -> None:
        for p in got:
            p.cancel.set()

    def stats(self) -> dict[str, int]:
        with self.cv:
            return {"batches": self.batches, "requests": self.requests, "cancelled": self.cancelled,
                    "refused": self.refused, "failed": self.failed, "queued": len(self.q)}

    def _take(self) -> list[_Pending]:
        """The next batch: the queue's head and the next requests with its parameters, after up to ``wait``."""
        with self.cv:
            while not self.q:
                self.cv.wait()
            deadline = time.monotonic() + (self.wait if self.q[0].state is None else 0.0)  # a new batch gathers
            while len(self.q) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                self.cv.wait(left)
            key = self.q[0].params
            got = [p for p in self.q if p.params == key][:self.max_batch]
            for p in got:
                self.q.remove(p)
            return got

    def _main(self) -> None:
        """The worker: :meth:`_loop` until the process ends. Should it end first, every queued request
        fails with 503, as do later ones, and ``alive`` (``/health``) turns false."""
        try:
            self._loop()
        except BaseException as e:  # recorded and logged; the thread ends here
            self.stopped = f"{type(e).__name__}: {e}"
            log.error("the generation worker stopped: %s", self.stopped)
        finally:
            self.stopped = self.stopped or "it returned"
            with self.cv:
                left, self.q = list(self.q), deque()
            for p in left:
                p.finish(error=str(self.stopped_error()), code=503)

    def _loop(self) -> None:
        while True:
            got = self._take()
            live = [p for p in got if not p.cancel.is_set()]
            for p in got:
                if p.cancel.is_set():
                    self.cancelled += 1
                    p.finish(error="cancelled")
            if live:
                self._run_isolated(live)
                self.batches += 1

    def _run_isolated(self, group: list[_Pending]) -> None:
        """Run ``group``; a request the backend refuses (over the context) gets its 400 alone and the
        others run on; when the batch fails otherwise (any error, a Rust panic of the tokenizer, which is
        no ``Exception``, included), each request is rerun alone, so only the one that fails gets its error."""
        try:
            self._run(group)
        except RequestRefused as e:
            if not 0 <= e.index < len(group):
                raise
            bad = group[e.index]
            self.refused += 1
            bad.finish(error=str(e), code=400)
            if rest := [p for p in group if p is not bad]:
                self._run_isolated(rest)
        except BaseException as e:
            if isinstance(e, _FATAL):
                raise
            if len(group) > 1:
                for p in group:
                    self._run_isolated([p])
                return
            self.failed += 1
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
            log.error("a request failed (%s)", msg, exc_info=log.isEnabledFor(logging.DEBUG))
            group[0].finish(error=msg)

    def _run(self, group: list[_Pending]) -> None:
        reqs, seeds, params = [p.request for p in group], [p.seed for p in group], group[0].params
        sinks = [p.grow if p.live else None for p in group]
        cancels = [p.cancel.is_set for p in group]
        if not self.sliced:
            outs = self.gen.generate_live(reqs, params, seeds, sinks, cancels)
        else:
            left = min(p.params.max_new_tokens - (len(p.state.new) if p.state else 0) for p in group)
            outs = self.gen.generate_slice(reqs, params, seeds, [p.state for p in group],  # type: ignore[attr-defined]
                                           min(self.slice_tokens, left), cancels, sinks)
        for p, o in zip(group, outs, strict=True):
            if p.cancel.is_set():  # stopped within the batch
                self.cancelled += 1
                p.finish(error="cancelled")
            elif isinstance(o, Completion):
                self.requests += 1
                p.finish(o)
            else:
                p.state = o
                with self.cv:
                    self.q.append(p)
                    self.cv.notify()


def _int(body: dict[str, Any], key: str, default: int) -> int:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(f"{key} must be an integer, got {json.dumps(v)[:40]}")  # 1e999 (inf) included
    return int(v)


def _float(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise ValueError(f"{key} must be a number in {lo:g}..{hi:g}, got {json.dumps(v)[:40]}")
    return float(v)


def _stops(body: dict[str, Any], limits: Limits) -> tuple[str, ...]:
    """The body's ``stop`` (a string or a list of strings), at most ``max_stop`` of at most ``max_stop_chars``."""
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(x, str) for x in stop):
        raise ValueError("stop must be a string or a list of strings")
    if len(stop) > limits.max_stop:
        raise ValueError(f"{len(stop):,} stop strings are over the limit of {limits.max_stop} (serve.max_stop)")
    if (long := max(map(len, stop), default=0)) > limits.max_stop_chars:
        raise ValueError(f"a stop string of {long:,} characters is over the limit of {limits.max_stop_chars} "
                         f"(serve.max_stop_chars)")
    return tuple(x for x in stop if x)


def _params(body: dict[str, Any], default_max: int, limits: Limits) -> tuple[GenParams, int]:
    """Sampling parameters and seed of a request body; ValueError (400) for bad or over-the-cap values."""
    cap = limits.max_tokens_cap
    key = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
    max_new = _int(body, key, min(default_max, cap))
    if not 1 <= max_new <= cap:
        raise ValueError(f"{key}={max_new} is outside 1..{cap} (serve.max_tokens_cap)")
    params = GenParams(max_new_tokens=max_new, temperature=_float(body, "temperature", 1.0, 0.0, 100.0),
                       top_p=_float(body, "top_p", 1.0, 0.0, 1.0),
                       repetition_penalty=_float(body, "repetition_penalty", 1.0, 0.01, 100.0),
                       stop=_stops(body, limits))
    seed = _int(body, "seed", 0)
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"seed={seed} is not a 64-bit integer")
    return params, seed


def _hostname(value: str) -> str:
    """``host``, ``host:port``, ``[::1]:port`` -> the host name, lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _prompt_chars(request: Request) -> int:
    return len(request) if isinstance(request, str) else sum(len(m["content"]) for m in request)


def _request(path: str, body: dict[str, Any]) -> Request:
    if path == "/chat/completions":
        return normalize_request(body.get("messages"))
    prompt = body.get("prompt")
    prompt = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt
    if not isinstance(prompt, str):
        raise ValueError("prompt must be a string")
    return prompt


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """(``stream``, ``stream_options.include_usage``) of a request body; ValueError (400) for bad values."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ValueError(f"stream must be true or false, got {json.dumps(stream)[:40]}")
    opts = body.get("stream_options")
    if opts is None:
        return bool(stream), False
    if not stream:
        raise ValueError("stream_options is only allowed with stream=true")
    usage = opts.get("include_usage", False) if isinstance(opts, dict) else None
    if not isinstance(usage, bool):
        raise ValueError(f"stream_options must be {{\"include_usage\": true|false}}, got {json.dumps(opts)[:60]}")
    return True, usage


@dataclass(frozen=True)
class _Ask:
    """What one POST asks for."""

    request: Request
    params: GenParams
    seed: int
    n: int = 1
    stream: bool = False
    usage: bool = False  # stream_options.include_usage: a last chunk with the usage


def _head(model_name: str, chat: bool, stream: bool) -> dict[str, Any]:
    """The fields every response (or chunk of one) starts with."""
    kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", "object": kind,
            "created": int(time.time()), "model": model_name}


def _usage(comps: list[Completion]) -> dict[str, int]:
    """One prompt, ``len(comps)`` choices: the prompt's tokens once, every choice's completion tokens."""
    prompt, completion = comps[0].prompt_tokens, sum(c.completion_tokens for c in comps)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _reply(model_name: str, chat: bool, comps: list[Completion]) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(comps):
        choice: dict[str, Any] = {"index": i, "finish_reason": c.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": c.text}
        else:
            choice["text"] = c.text
        choices.append(choice)
    return _head(model_name, chat, False) | {"choices": choices, "usage": _usage(comps)}


def _chunk_choice(chat: bool, i: int, piece: str, reason: str | None) -> dict[str, Any]:
    if chat:
        return {"index": i, "delta": {"content": piece}, "logprobs": None, "finish_reason": reason}
    return {"index": i, "text": piece, "logprobs": None, "finish_reason": reason}


_CHUNK = re.compile(rb"([0-9A-Fa-f]{1,8})[ \t]*(?:;[^\r\n]*)?\r?\n")  # chunk size [; extensions] CRLF


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\Z)', re.DOTALL)  # a JSON string (or an unclosed one)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def _depth(raw: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in a JSON text, strings skipped; linear time, no recursion."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot be deeper than the limit
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(1 if c in b"[{" else -1 for c in brackets), default=0)


def _json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object: strict JSON (no ``Infinity``/``NaN``), at most ``MAX_JSON_DEPTH``
    deep (a body of 200,000 ``[`` is a 400, not a RecursionError); :class:`_Refused` (400) otherwise."""
    if (d := _depth(raw)) > MAX_JSON_DEPTH:
        raise _Refused(400, f"the body nests {d:,} levels deep, over the limit of {MAX_JSON_DEPTH}")
    try:
        body = json.loads(raw or b"{}", parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise _Refused(400, f"the body is not JSON ({str(e)[:200]})") from None
    if not isinstance(body, dict):
        raise _Refused(400, f"the body must be a JSON object, got {type(body).__name__}")
    return body


class _Refused(Exception):
    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code


class _Clock(io.RawIOBase):
    """A connection's reads, under a deadline (``start``): every read waits at most until it, then
    TimeoutError, so a client that sends a request a byte at a time cannot hold a thread past it."""

    def __init__(self, sock: socket.socket):
        self.sock, self.deadline = sock, None

    def readable(self) -> bool:
        return True

    def start(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def stop(self, write_timeout: float) -> None:
        """The request is read: reads wait without a deadline, and a send waits at most ``write_timeout``
        for a client that reads nothing."""
        self.deadline = None
        self.sock.settimeout(write_timeout)

    def readinto(self, b: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time (serve.read_timeout_s)")
            self.sock.settimeout(left)
        return self.sock.recv_into(b)


class _Handler(BaseHTTPRequestHandler):
    """The routes; :func:`make_handler` binds the server's batcher, model name and limits."""

    protocol_version = "HTTP/1.1"
    batcher: Batcher
    model_name: str
    default_max: int
    limits: Limits
    allowed: frozenset[str]
    unread_body = False  # a body refused by its Content-Length is never read: drained on close (finish)

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one debug line per request
        log.debug("%s " + fmt, self.address_string(), *args)

    def setup(self) -> None:
        super().setup()
        self.clock = _Clock(self.connection)
        self.rfile = io.BufferedReader(self.clock)

    def handle_one_request(self) -> None:
        """One request, its head and body within ``read_timeout_s`` (also the wait for it on a kept-alive
        connection): a client that takes longer is closed (the stdlib handler catches the TimeoutError)."""
        self.clock.start(self.limits.read_timeout_s)
        super().handle_one_request()

    def _send(self, code: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, msg: str) -> None:
        self._send(code, {"error": {"message": msg, "type": "invalid_request_error" if code < 500 else "server_error"}})

    def finish(self) -> None:
        super().finish()
        if self.unread_body:
            self._drain()

    def _drain(self, seconds: float = 2.0) -> None:
        """Lingering close: read and drop what the client still sends of a refused body (at most
        ``seconds`` and 8 × ``max_body_bytes``). Closing a socket with unread data resets it, and a client
        still sending would get a broken pipe instead of the 413 it was sent."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            deadline, left = time.monotonic() + seconds, 8 * self.limits.max_body_bytes
            while left > 0 and (wait := deadline - time.monotonic()) > 0:
                self.connection.settimeout(wait)
                chunk = self.connection.recv(min(left, 1 << 16))
                if not chunk:
                    return
                left -= len(chunk)
        except OSError:  # the client went first, or the time is up
            return

    def _foreign(self) -> str | None:
        """Why this request may come from a web page (DNS rebinding, cross-origin): None if it does not."""
        host = self.headers.get("Host")
        if host is None or _hostname(host) not in self.allowed:
            return f"Host {host!r} is not served (serve.allowed_hosts)"
        origin = self.headers.get("Origin")
        if origin is not None and (urlsplit(origin).hostname or "").lower() not in self.allowed:
            return f"Origin {origin!r} is not allowed (serve.allowed_hosts)"
        return None

    def _gone(self) -> bool:
        """Whether the client closed its connection (readable with no data)."""
        try:
            if not select.select([self.connection], [], [], 0)[0]:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_GET(self) -> None:  # noqa: N802
        self.clock.stop(self.limits.read_timeout_s)
        if (why := self._foreign()) is not None:
            return self._error(403, why)
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "cptkit"}]})
        elif self.path.rstrip("/") == "/health":  # 503 once the generation worker has stopped
            if self.batcher.alive:
                self._send(200, {"status": "ok"} | self.batcher.stats())
            else:
                self._send(503, {"status": "error", "error": str(self.batcher.stopped_error())} | self.batcher.stats())
        else:
            self._error(404, f"no route {self.path}")

    def _body(self) -> dict[str, Any]:
        """The request's JSON object, read within ``read_timeout_s`` (a ``Content-Length`` or a chunked
        body); :class:`_Refused` for anything else."""
        try:
            raw = self._raw_body()
        except TimeoutError:
            self.close_connection = True
            raise _Refused(408, f"the request body did not arrive within {self.limits.read_timeout_s:g} s "
                                f"(serve.read_timeout_s)") from None
        finally:
            self.clock.stop(self.limits.read_timeout_s)
        return _json_object(raw)

    def _raw_body(self) -> bytes:
        te = self.headers.get_all("Transfer-Encoding") or []
        if te:  # the body's length is the chunks': never read it as the next request
            self.close_connection = self.unread_body = True  # kept only once the chunked body is read to its end
            if self.headers.get("Content-Length") is not None:
                raise _Refused(400, "both Transfer-Encoding and Content-Length are set")
            if [v.strip().lower() for v in ",".join(te).split(",")] != ["chunked"]:
                raise _Refused(501, f"Transfer-Encoding {', '.join(te)!r} is not supported (only chunked)")
            raw = self._chunked()
            self.close_connection = self.unread_body = False
            return raw
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > self.limits.max_body_bytes:
            self.close_connection = self.unread_body = True  # the body is not read: no reuse of the connection
            if length < 0:
                raise _Refused(400, "invalid Content-Length")
            raise _Refused(413, f"request body of {length:,} bytes is over the limit of "
                                f"{self.limits.max_body_bytes:,} bytes")
        return self.rfile.read(length)

    def _chunked(self) -> bytes:
        """A ``Transfer-Encoding: chunked`` body (RFC 9112 7.1), at most ``max_body_bytes`` of data."""
        out = bytearray()
        while True:
            line = self.rfile.readline(1024)
            m = _CHUNK.fullmatch(line)
            if m is None:
                raise _Refused(400, "a malformed chunk in a chunked body")
            size = int(m[1], 16)
            if size == 0:
                break
            if len(out) + size > self.limits.max_body_bytes:
                raise _Refused(413, f"a chunked request body over the limit of {self.limits.max_body_bytes:,} bytes")
            data = self.rfile.read(size)
            if len(data) < size or self.rfile.readline(3) not in (b"\r\n", b"\n"):
                raise _Refused(400, "a chunked body cut short or with a malformed chunk")
            out += data
        for _ in range(64):  # trailer fields, dropped, up to the empty line
            line = self.rfile.readline(8192)
            if line in (b"\r\n", b"\n"):
                return bytes(out)
            if not line.endswith(b"\n"):
                break
        raise _Refused(400, "a chunked body without its final empty line")

    def _parse(self, path: str) -> _Ask:
        body = self._body()
        try:
            params, seed = _params(body, self.default_max, self.limits)
            n = _int(body, "n", 1)
            if not 1 <= n <= self.limits.max_n:
                raise ValueError(f"n={n} is outside 1..{self.limits.max_n} (serve.max_n)")
            stream, usage = _stream_flags(body)
            request = _request(path, body)
        except (ValueError, TypeError, CptkitError) as e:
            raise _Refused(400, str(e)) from None
        if (chars := _prompt_chars(request)) > self.limits.max_prompt_chars:
            raise _Refused(413, f"a prompt of {chars:,} characters is over the limit of "
                                f"{self.limits.max_prompt_chars:,} (serve.max_prompt_chars)")
        return _Ask(request, params, seed, n, stream, usage)

    def do_POST(self) -> None:  # noqa: N802
        if (why := self._foreign()) is not None:
            self.close_connection = True
            return self._error(403, why)
        path = self.path.rstrip("/").removeprefix("/v1")
        if path not in ("/chat/completions", "/completions"):
            self.close_connection = True
            return self._error(404, f"no route {self.path}")
        try:
            ask = self._parse(path)
        except _Refused as e:
            return self._error(e.code, str(e))
        chat = path == "/chat/completions"
        try:
            got = self.batcher.submit(ask.request, ask.params, choice_seeds(ask.seed, ask.n), live=ask.stream)
            if ask.stream:
                return self._stream(chat, got, ask.usage)
            comps = self.batcher.gather(got, self._gone)
        except Failed as e:
            return self._error(e.code, str(e))
        if comps is None:  # the client hung up: its generation was cancelled
            self.close_connection = True
            return None
        self._send(200, _reply(self.model_name, chat, comps))

    def _event(self, data: dict[str, Any] | str) -> None:
        """One server-sent event, as one chunk of the chunked body."""
        raw = f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))

    def _stream(self, chat: bool, got: list[_Pending], usage: bool) -> None:
        """Answer with server-sent events while the choices are generated (the module docstring says
        which); a client that hangs up, even between two events, cancels every choice."""
        head = _head(self.model_name, chat, True)
        tail = {"usage": None} if usage else {}  # OpenAI: with include_usage, every other chunk has usage: null
        deltas = [TextDeltas(p.params.stop) for p in got]
        todo, failed, code = set(range(len(got))), None, 500
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(len(got) if chat else 0):  # a chat choice opens with its role
                self._event(head | {"choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]} | tail)
            while todo and failed is None:
                got[0].changed.wait(0.05)
                got[0].changed.clear()
                if self._gone():
                    raise ConnectionResetError("the client hung up")
                if not self.batcher.alive:
                    failed, code = str(self.batcher.stopped_error()), 503
                    break
                for i in sorted(todo):
                    p = got[i]
                    if (failed := p.error) is not None:
                        code = p.code
                        break
                    if p.done.is_set():
                        todo.discard(i)
                        piece, reason = deltas[i].finish(p.result.text), p.result.finish_reason  # type: ignore[union-attr]
                    elif not (piece := deltas[i].update(p.text)):
                        continue
                    else:
                        reason = None
                    self._event(head | {"choices": [_chunk_choice(chat, i, piece, reason)]} | tail)
            if failed is not None:
                self.batcher.cancel(got)
                kind = "invalid_request_error" if code < 500 else "server_error"
                self._event({"error": {"message": failed, "type": kind, "code": code}})
            elif usage:
                self._event(head | {"choices": [], "usage": _usage([p.result for p in got])})  # type: ignore[misc]
            self._event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client hung up: BrokenPipeError, ConnectionResetError, or noticed above
            self.batcher.cancel(got)
            self.close_connection = True


def make_handler(batcher: Batcher, model_name: str, default_max: int,
                 limits: Limits = Limits()) -> type[BaseHTTPRequestHandler]:  # noqa: B008 - frozen
    """A request handler class serving ``batcher`` under ``limits``."""
    allowed = frozenset(h.lower().strip("[]") for h in limits.allowed_hosts)
    return type("Handler", (_Handler,), {"batcher": batcher, "model_name": model_name, "default_max": default_max,
                                         "limits": limits, "allowed": allowed})


class Server(ThreadingHTTPServer):
    """The threading HTTP server with a cap: at most ``max_connections`` connections are served at once
    (one thread each); one over the cap gets 503 at once and is closed, without a thread."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # the listen backlog (the stdlib's 5 drops connections of a burst)

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int):
        self.max_connections = max_connections
        self.slots = threading.BoundedSemaphore(max(1, max_connections))
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            return self._busy(request)
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started (RuntimeError: can't start new thread)
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def _busy(self, sock: socket.socket) -> None:
        """503 to a connection over the cap, without blocking the accept loop."""
        data = json.dumps({"error": {"message": f"the server has serve.max_connections={self.max_connections} "
                                                "connections open; retry later", "type": "server_error"}}).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: "
                f"{len(data)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
        try:
            sock.setblocking(False)
            sock.send(head + data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(1 << 16):  # what the client sent already: closing on unread data would reset
                pass
        except OSError:  # nothing more to read now, or the client is gone
            pass
        sock.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line for a connection the client broke; the traceback only at DEBUG."""
        e = sys.exc_info()[1]
        if isinstance(e, OSError):
            log.debug("connection from %s: %s", client_address, e)
        else:
            log.error("a request from %s failed (%s: %s)", client_address, type(e).__name__, e,
                      exc_info=log.isEnabledFor(logging.DEBUG))


def serve(gen: Generator, host: str = "127.0.0.1", port: int = 8000, *, model_name: str | None = None,
          max_batch: int = 8, batch_wait_ms: float = 20.0, default_max_tokens: int = 256,
          ready_file: str | None = None, limits: Limits = Limits()) -> None:  # noqa: B008 - frozen
    """Serve ``gen`` until interrupted. ``port=0`` picks a free port; the URL goes to the log
    and, when given, to ``ready_file`` (written once the socket listens). The bound ``host`` is
    added to ``limits.allowed_hosts``."""
    batcher = Batcher(gen, max_batch, batch_wait_ms, limits.slice_tokens)
    name = model_name or gen.model_id
    limits = replace(limits, allowed_hosts=(*limits.allowed_hosts, host))
    try:
        httpd = Server((host, port), make_handler(batcher, name, default_max_tokens, limits), limits.max_connections)
    except OSError as e:
        raise CptkitError(f"serve-llm: cannot listen on {host}:{port} ({e.strerror})") from None
    url = f"http://{host}:{httpd.server_address[1]}/v1"
    log.warning("serving %s at %s (max_batch=%d)", name, url, max_batch)
    if ready_file:
        from pathlib import Path

        atomic_write_bytes(Path(ready_file), url.encode())
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
