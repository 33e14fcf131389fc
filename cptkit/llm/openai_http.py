"""Any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, ``cptkit serve-llm``) over HTTP.

Chat requests (and plain prompts when ``llm.chat``) go to ``/chat/completions``; plain prompts
with ``llm.chat=false`` go to ``/completions``. Requests run concurrently in a thread pool
(``llm.concurrency``), each with a timeout and retries with exponential backoff on connection
errors, timeouts, 429 and 5xx. The API key is read from the environment variable *named* by
``llm.api_key_env``; it is never logged nor written anywhere (its value is registered with
``cptkit.core.redact``, so even a server's error that echoes it back is masked). A user name in
``llm.base_url`` (``https://TOKEN@host/v1``, ``https://user:PW@host/v1``) is sent as HTTP basic
auth, not in the address; a query (``?api-version=...``) is kept after each route's path.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.core.redact import redact_text, remember
from cptkit.llm.base import Completion, Generator, GenParams, Request, apply_stop

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


class OpenAIGenerator(Generator):
    backend = "openai"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self.base_url, self._query, self._basic = _split_url(str(cfg.base_url))
        self.shown = redact_text(str(cfg.base_url).rstrip("/"))  # what errors and the manifest name
        self.timeout = float(cfg.timeout_s)
        self.retries = int(cfg.max_retries)
        self.backoff = float(cfg.backoff_s)
        self.concurrency = max(1, int(cfg.concurrency))
        self.batch_size = max(self.batch_size, 4 * self.concurrency)  # cache commit granularity
        self._key = os.environ.get(str(cfg.api_key_env)) if cfg.api_key_env else None
        remember(self._key)
        models = self._models()  # one probe before any concurrent traffic: an unreachable server fails here, once
        if not self.model_id:
            if not models:
                raise CptkitError(f"llm.base_url={self.shown}: /models lists no model; set llm.model")
            self.model_id = models[0]

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self._key:
            h["Authorization"] = f"Bearer {self._key}"
        elif self._basic:
            h["Authorization"] = f"Basic {self._basic}"
        return h

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One HTTP call with retries; user errors name the URL, never the key."""
        url = f"{self.base_url}{path}{self._query}"
        data = json.dumps(body).encode() if body is not None else None
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            req = urllib.request.Request(url, data=data, headers=self._headers(), method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as e:
                detail = redact_text(e.read().decode("utf-8", "replace")[:300])
                if e.code not in RETRY_STATUS:
                    raise CptkitError(f"llm.base_url={self.shown}: {method} {path} failed with HTTP {e.code}: {detail}") from None
                last = f"HTTP {e.code}: {detail}"
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                last = str(getattr(e, "reason", e))
            except json.JSONDecodeError:
                raise CptkitError(f"llm.base_url={self.shown}: {path} did not return JSON") from None
            log.warning("llm request to %s failed (%s); try %d of %d", url, last, attempt + 1, self.retries + 1)
        raise CptkitError(f"llm.base_url={self.shown}: server unreachable or failing after "
                          f"{self.retries + 1} tries ({last}); is an OpenAI-compatible server running there?")

    def _models(self) -> list[str]:
        """Model ids listed by ``GET /models`` ([] when the server has no such route)."""
        try:
            data = self._call("GET", "/models").get("data") or []
        except CptkitError as e:
            if "HTTP 404" in str(e) or "HTTP 405" in str(e):
                return []
            raise
        return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]

    def _one(self, request: Request, params: GenParams, seed: int) -> Completion:
        body: dict[str, Any] = {"model": self.model_id, "max_tokens": int(params.max_new_tokens),
                                "temperature": float(params.temperature), "top_p": float(params.top_p), "seed": int(seed)}
        if params.stop:
            body["stop"] = list(params.stop)
        if params.repetition_penalty != 1.0:
            body["repetition_penalty"] = float(params.repetition_penalty)
        if isinstance(request, str) and not self.chat:
            body["prompt"] = request
            resp = self._call("POST", "/completions", body)
        else:
            msgs = request if isinstance(request, list) else (
                ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": request}])
            body["messages"] = msgs
            resp = self._call("POST", "/chat/completions", body)
        try:
            choice = resp["choices"][0]
            text = choice["message"]["content"] if "message" in choice else choice["text"]
        except (KeyError, IndexError, TypeError):
            raise CptkitError(f"llm.base_url={self.shown}: unexpected response {str(resp)[:200]}") from None
        usage = resp.get("usage") or {}
        text, cut = apply_stop(text or "", params.stop)
        reason = choice.get("finish_reason") or "stop"
        return Completion(text=text.strip(), prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          completion_tokens=int(usage.get("completion_tokens", 0)),
                          finish_reason="stop" if cut else ("length" if reason == "length" else "stop"))

    def _generate(self, requests: list[Request], params: GenParams, seeds: list[int]) -> list[Completion]:
        if len(requests) == 1:
            return [self._one(requests[0], params, seeds[0])]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(lambda rs: self._one(rs[0], params, rs[1]), zip(requests, seeds, strict=True)))

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"base_url": self.shown}


def _split_url(url: str) -> tuple[str, str, str | None]:
    """(base URL without user info or query, ``?query`` or "", base64 ``user:password`` or None)."""
    parts = urlsplit(url.rstrip("/"))
    basic = None
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        user, _, pw = userinfo.partition(":")
        for v in (user, pw):
            remember(unquote(v))
        basic = base64.b64encode(f"{unquote(user)}:{unquote(pw)}".encode()).decode()
        parts = parts._replace(netloc=host)
    query = f"?{parts.query}" if parts.query else ""
    return urlunsplit(parts._replace(query="", fragment="")).rstrip("/"), query, basic
