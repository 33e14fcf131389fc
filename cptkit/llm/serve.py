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
it is read, a prompt over ``max_prompt_chars`` 413, ``max_tokens`` over ``max_tokens_cap`` or a
body that is not a JSON object 400, a ``Host`` or ``Origin`` outside ``allowed_hosts`` 403 (DNS
rebinding, cross-origin pages), ``n`` over ``max_n`` 400; a client that hangs up (also mid-stream)
cancels its generation, and the :class:`Batcher` interleaves requests in token slices so none waits
for a long one to finish.
"""

from __future__ import annotations

import hashlib
import json
import select
import socket
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
from cptkit.llm.base import Completion, Generator, GenParams, Request, TextDeltas, normalize_request

MAX_BODY_BYTES = 2**20
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (serve-llm's ``serve.*`` keys)."""

    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies: 413 before they are read
    max_prompt_chars: int = 65536  # longer prompts (all messages together): 413
    max_tokens_cap: int = 2048  # max_tokens above it: 400
    slice_tokens: int = 16  # tokens per turn of the round-robin scheduler (transformers backend)
    max_n: int = 16  # choices per request (n) above it: 400
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS  # Host header names accepted (DNS rebinding): others get 403


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

    def grow(self, text: str) -> None:
        self.text = text
        self.changed.set()

    def finish(self, result: Completion | None = None, error: str | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()
        self.changed.set()


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
        self.batches = self.requests = self.cancelled = 0
        threading.Thread(target=self._loop, daemon=True, name="cptkit-batcher").start()

    def submit(self, request: Request, params: GenParams, seeds: list[int], live: bool = False) -> list[_Pending]:
        """Queue one choice per seed (sharing one ``changed`` event); ``live``: report text as it grows."""
        changed = threading.Event()
        got = [_Pending(request, params, s, live=live, changed=changed) for s in seeds]
        with self.cv:
            self.q.extend(got)
            self.cv.notify()
        return got

    def gather(self, got: list[_Pending], gone: Callable[[], bool] = lambda: False) -> list[Completion] | None:
        """Every choice's completion; None (all cancelled) when ``gone()`` turns true first."""
        while not all(p.done.is_set() for p in got):
            got[0].changed.wait(0.05)
            got[0].changed.clear()
            if gone():
                self.cancel(got)
                return None
        for p in got:
            if p.error is not None:
                raise RuntimeError(p.error)
        return [p.result for p in got]  # type: ignore[misc]

    @staticmethod
    def cancel(got: list[_Pending]) -> None:
        for p in got:
            p.cancel.set()

    def stats(self) -> dict[str, int]:
        with self.cv:
            return {"batches": self.batches, "requests": self.requests, "cancelled": self.cancelled,
                    "queued": len(self.q)}

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

    def _loop(self) -> None:
        while True:
            got = self._take()
            live = [p for p in got if not p.cancel.is_set()]
            for p in got:
                if p.cancel.is_set():
                    self.cancelled += 1
                    p.finish(error="cancelled")
            if not live:
                continue
            try:
                self._run(live)
            except Exception as e:  # report to every waiting client, keep serving
                log.exception("generation failed")
                for p in live:
                    p.finish(error=f"{type(e).__name__}: {e}")
            self.batches += 1

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
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise ValueError(f"{key} must be an integer, got {json.dumps(v)[:40]}")
    return int(v)


def _params(body: dict[str, Any], default_max: int, cap: int) -> tuple[GenParams, int]:
    """Sampling parameters and seed of a request body; ValueError (400) for bad or over-the-cap values."""
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
    key = "max_tokens" if body.get("max_tokens") is not None else "max_completion_tokens"
    max_new = _int(body, key, min(default_max, cap))
    if not 1 <= max_new <= cap:
        raise ValueError(f"{key}={max_new} is outside 1..{cap} (serve.max_tokens_cap)")
    params = GenParams(max_new_tokens=max_new, temperature=float(body.get("temperature", 1.0)),
                       top_p=float(body.get("top_p", 1.0)),
                       repetition_penalty=float(body.get("repetition_penalty", 1.0)), stop=stop)
    return params, _int(body, "seed", 0)


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


class _Refused(Exception):
    def __init__(self, code: int, msg: str):
        super().__init__(msg)
        self.code = code


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
        if (why := self._foreign()) is not None:
            return self._error(403, why)
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._send(200, {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "cptkit"}]})
        elif self.path.rstrip("/") == "/health":
            self._send(200, {"status": "ok"} | self.batcher.stats())
        else:
            self._error(404, f"no route {self.path}")

    def _body(self) -> dict[str, Any]:
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
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as e:
            raise _Refused(400, f"the body is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise _Refused(400, f"the body must be a JSON object, got {type(body).__name__}")
        return body

    def _parse(self, path: str) -> _Ask:
        body = self._body()
        try:
            params, seed = _params(body, self.default_max, self.limits.max_tokens_cap)
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
        got = self.batcher.submit(ask.request, ask.params, choice_seeds(ask.seed, ask.n), live=ask.stream)
        if ask.stream:
            return self._stream(chat, got, ask.usage)
        try:
            comps = self.batcher.gather(got, self._gone)
        except RuntimeError as e:
            return self._error(500, str(e))
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
        todo, failed = set(range(len(got))), None
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
                for i in sorted(todo):
                    p = got[i]
                    if (failed := p.error) is not None:
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
                self._event({"error": {"message": failed, "type": "server_error", "code": 500}})
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
        httpd = ThreadingHTTPServer((host, port), make_handler(batcher, name, default_max_tokens, limits))
    except OSError as e:
        raise CptkitError(f"serve-llm: cannot listen on {host}:{port} ({e.strerror})") from None
    httpd.daemon_threads = True
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
