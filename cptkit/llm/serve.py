"""A small OpenAI-compatible HTTP server over a local backend (``cptkit serve-llm``).

Serves ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (no
streaming, ``n=1``) from the standard library's threading HTTP server. Concurrent requests are
gathered for up to ``batch_wait_ms`` into one batch of at most ``max_batch`` (requests with the
same sampling parameters share a batch), so many clients get batched generation. The body's
``seed`` is the request's sampling seed, so a request gives the same text here as through the
in-process backend with the same seed.

Hostile clients cannot stall it (:class:`Limits`): a body over ``max_body_bytes`` gets 413 before
it is read, a prompt over ``max_prompt_chars`` 413, ``max_tokens`` over ``max_tokens_cap`` or a
body that is not a JSON object 400, a ``Host`` or ``Origin`` outside ``allowed_hosts`` 403 (DNS
rebinding, cross-origin pages); a client that hangs up cancels its generation, and the
:class:`Batcher` interleaves requests in token slices so none waits for a long one to finish.
"""

from __future__ import annotations

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
from cptkit.llm.base import Completion, Generator, GenParams, Request, normalize_request

MAX_BODY_BYTES = 2**20
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server (serve-llm's ``serve.*`` keys)."""

    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies: 413 before they are read
    max_prompt_chars: int = 65536  # longer prompts (all messages together): 413
    max_tokens_cap: int = 2048  # max_tokens above it: 400
    slice_tokens: int = 16  # tokens per turn of the round-robin scheduler (transformers backend)
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS  # Host header names accepted (DNS rebinding): others get 403


@dataclass
class _Pending:
    request: Request
    params: GenParams
    seed: int
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    state: Any = None  # the backend's Partial between slices
    result: Completion | None = None
    error: str | None = None

    def finish(self, result: Completion | None = None, error: str | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class Batcher:
    """Schedules concurrent requests onto one generator (one worker thread), fairly.

    Requests with the same sampling parameters share a batch of at most
    ``max_batch``. With a backend that can continue a request (``generate_slice``: transformers),
    each batch runs at most ``slice_tokens`` tokens, then its unfinished requests go to the back of
    the queue: round-robin, so a short request waits at most one slice of each request ahead of it,
    never for a long one to finish. Other backends run each batch to the end (bounded by the
    server's ``max_tokens_cap``). A cancelled request (its client hung up) is dropped before its
    next batch, and within a slice at the next token.
    """

    def __init__(self, gen: Generator, max_batch: int = 8, wait_ms: float = 20.0, slice_tokens: int = 16):
        self.gen, self.max_batch, self.wait = gen, max(1, max_batch), wait_ms / 1000.0
        self.slice_tokens = max(1, slice_tokens)
        self.sliced = callable(getattr(gen, "generate_slice", None))
        self.q: deque[_Pending] = deque()
        self.cv = threading.Condition()
        self.batches = self.requests = self.cancelled = 0
        threading.Thread(target=self._loop, daemon=True, name="cptkit-batcher").start()

    def submit(self, request: Request, params: GenParams, seed: int,
               gone: Callable[[], bool] = lambda: False) -> Completion | None:
        """The completion; None when ``gone()`` turned true first (the request is cancelled)."""
        p = _Pending(request, params, seed)
        self._put(p)
        while not p.done.wait(0.05):
            if gone():
                p.cancel.set()
                return None
        if p.error is not None:
            raise RuntimeError(p.error)
        return p.result

    def stats(self) -> dict[str, int]:
        with self.cv:
            return {"batches": self.batches, "requests": self.requests, "cancelled": self.cancelled,
                    "queued": len(self.q)}

    def _put(self, p: _Pending) -> None:
        with self.cv:
            self.q.append(p)
            self.cv.notify()

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
        reqs, seeds = [p.request for p in group], [p.seed for p in group]
        if not self.sliced:
            outs = self.gen._generate(reqs, group[0].params, seeds)
            for p, c in zip(group, outs, strict=True):
                self.requests += 1
                p.finish(c)
            return
        left = min(p.params.max_new_tokens - (len(p.state.new) if p.state else 0) for p in group)
        outs = self.gen.generate_slice(reqs, group[0].params, seeds, [p.state for p in group],
                                       min(self.slice_tokens, left), [p.cancel.is_set for p in group])
        for p, o in zip(group, outs, strict=True):
            if p.cancel.is_set():  # stopped within the slice
                self.cancelled += 1
                p.finish(error="cancelled")
            elif isinstance(o, Completion):
                self.requests += 1
                p.finish(o)
            else:
                p.state = o
                self._put(p)


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


def _reply(model_name: str, chat: bool, c: Completion) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": c.finish_reason}
    if chat:
        choice["message"] = {"role": "assistant", "content": c.text}
    else:
        choice["text"] = c.text
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model_name, "choices": [choice],
            "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                      "total_tokens": c.prompt_tokens + c.completion_tokens}}


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

    def _parse(self, path: str) -> tuple[Request, GenParams, int]:
        body = self._body()
        try:
            if body.get("stream"):
                raise ValueError("stream=true is not supported")
            if _int(body, "n", 1) != 1:
                raise ValueError("only n=1 is supported")
            params, seed = _params(body, self.default_max, self.limits.max_tokens_cap)
            request = _request(path, body)
        except (ValueError, TypeError, CptkitError) as e:
            raise _Refused(400, str(e)) from None
        if (n := _prompt_chars(request)) > self.limits.max_prompt_chars:
            raise _Refused(413, f"a prompt of {n:,} characters is over the limit of "
                                f"{self.limits.max_prompt_chars:,} (serve.max_prompt_chars)")
        return request, params, seed

    def do_POST(self) -> None:  # noqa: N802
        if (why := self._foreign()) is not None:
            self.close_connection = True
            return self._error(403, why)
        path = self.path.rstrip("/").removeprefix("/v1")
        if path not in ("/chat/completions", "/completions"):
            self.close_connection = True
            return self._error(404, f"no route {self.path}")
        try:
            request, params, seed = self._parse(path)
        except _Refused as e:
            return self._error(e.code, str(e))
        try:
            c = self.batcher.submit(request, params, seed, self._gone)
        except RuntimeError as e:
            return self._error(500, str(e))
        if c is None:  # the client hung up: its generation was cancelled
            self.close_connection = True
            return None
        self._send(200, _reply(self.model_name, path == "/chat/completions", c))


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

        from cptkit.core.shards import atomic_write_bytes

        atomic_write_bytes(Path(ready_file), url.encode())
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
