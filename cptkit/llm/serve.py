"""A small OpenAI-compatible HTTP server over a local backend (``cptkit serve-llm``).

Serves ``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions`` (no
streaming, ``n=1``) from the standard library's threading HTTP server. Concurrent requests are
gathered for up to ``batch_wait_ms`` into one batch of at most ``max_batch`` (requests with the
same sampling parameters share a batch), so many clients get batched generation. The body's
``seed`` is the request's sampling seed, so a request gives the same text here as through the
in-process backend with the same seed. A request body over ``max_body_bytes`` (default 16 MiB)
is refused with 413 before it is read.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.llm.base import Completion, Generator, GenParams, Request, normalize_request

MAX_BODY_BYTES = 16 * 2**20


@dataclass
class _Pending:
    request: Request
    params: GenParams
    seed: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Completion | None = None
    error: str | None = None


class Batcher:
    """Collects concurrent requests into batches for one generator (one worker thread)."""

    def __init__(self, gen: Generator, max_batch: int = 8, wait_ms: float = 20.0):
        self.gen, self.max_batch, self.wait = gen, max(1, max_batch), wait_ms / 1000.0
        self.q: queue.Queue[_Pending] = queue.Queue()
        self.batches = 0
        self.requests = 0
        threading.Thread(target=self._loop, daemon=True, name="cptkit-batcher").start()

    def submit(self, request: Request, params: GenParams, seed: int) -> Completion:
        p = _Pending(request, params, seed)
        self.q.put(p)
        p.done.wait()
        if p.error is not None:
            raise RuntimeError(p.error)
        assert p.result is not None
        return p.result

    def _loop(self) -> None:
        while True:
            got = [self.q.get()]
            deadline = time.monotonic() + self.wait
            while len(got) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    got.append(self.q.get(timeout=left))
                except queue.Empty:
                    break
            groups: dict[GenParams, list[_Pending]] = {}
            for p in got:
                groups.setdefault(p.params, []).append(p)
            for params, group in groups.items():
                try:
                    outs = self.gen._generate([p.request for p in group], params, [p.seed for p in group])
                    for p, c in zip(group, outs, strict=True):
                        p.result = c
                except Exception as e:  # report to every waiting client, keep serving
                    log.exception("generation failed")
                    for p in group:
                        p.error = f"{type(e).__name__}: {e}"
                self.batches += 1
                self.requests += len(group)
                for p in group:
                    p.done.set()


def _params(body: dict[str, Any], default_max: int) -> tuple[GenParams, int]:
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
    params = GenParams(max_new_tokens=int(body.get("max_tokens") or body.get("max_completion_tokens") or default_max),
                       temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                       repetition_penalty=float(body.get("repetition_penalty", 1.0)), stop=stop)
    return params, int(body.get("seed") or 0)


def make_handler(batcher: Batcher, model_name: str, default_max: int,
                 max_body: int = MAX_BODY_BYTES) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

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

        def do_GET(self) -> None:  # noqa: N802
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "cptkit"}]})
            elif self.path.rstrip("/") == "/health":
                self._send(200, {"status": "ok", "batches": batcher.batches, "requests": batcher.requests})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.rstrip("/").removeprefix("/v1")
            if path not in ("/chat/completions", "/completions"):
                return self._error(404, f"no route {self.path}")
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > max_body:
                self.close_connection = True  # the body is not read: the connection cannot be reused
                if length < 0:
                    return self._error(400, "invalid Content-Length")
                return self._error(413, f"request body of {length:,} bytes is over the limit of {max_body:,} bytes")
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if body.get("stream"):
                    return self._error(400, "stream=true is not supported")
                if int(body.get("n") or 1) != 1:
                    return self._error(400, "only n=1 is supported")
                params, seed = _params(body, default_max)
                if path == "/chat/completions":
                    request = normalize_request(body.get("messages"))
                else:
                    prompt = body.get("prompt")
                    prompt = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt
                    if not isinstance(prompt, str):
                        return self._error(400, "prompt must be a string")
                    request = prompt
            except (ValueError, TypeError, CptkitError) as e:
                return self._error(400, str(e))
            try:
                c = batcher.submit(request, params, seed)
            except RuntimeError as e:
                return self._error(500, str(e))
            chat = path == "/chat/completions"
            choice: dict[str, Any] = {"index": 0, "finish_reason": c.finish_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
            self._send(200, {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": model_name, "choices": [choice],
                             "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                                       "total_tokens": c.prompt_tokens + c.completion_tokens}})

    return Handler


def serve(gen: Generator, host: str = "127.0.0.1", port: int = 8000, *, model_name: str | None = None,
          max_batch: int = 8, batch_wait_ms: float = 20.0, default_max_tokens: int = 256,
          ready_file: str | None = None, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Serve ``gen`` until interrupted. ``port=0`` picks a free port; the URL goes to the log
    and, when given, to ``ready_file`` (written once the socket listens)."""
    batcher = Batcher(gen, max_batch, batch_wait_ms)
    name = model_name or gen.model_id
    try:
        httpd = ThreadingHTTPServer((host, port), make_handler(batcher, name, default_max_tokens, max_body_bytes))
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
