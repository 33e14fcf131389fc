"""serve-llm under hostile clients: a real `cptkit serve-llm` subprocess on the tiny model, on a real port.

Each test asserts the HTTP status and the answer: over-the-cap max_tokens (400), a 1 MB prompt
(413 at once), a body that is JSON but not an object (400), a foreign Host or Origin (403),
a client that hangs up (its generation is cancelled), and a short request that is answered while
a long one is still being generated (round-robin slices).
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests._tiny_llm import cached_tiny_model

ROOT = Path(__file__).resolve().parent.parent
CAP = 400
SLICE = 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(host, port) of `cptkit serve-llm` with max_tokens_cap=CAP and slices of SLICE tokens."""
    ready = tmp_path_factory.mktemp("srv") / "url"
    proc = subprocess.Popen([sys.executable, "-m", "cptkit.cli", "serve-llm", f"llm.model={cached_tiny_model()}",
                             "llm.device=cpu", "llm.num_threads=1", "serve.port=0", f"serve.ready_file={ready}",
                             f"serve.max_tokens_cap={CAP}", f"serve.slice_tokens={SLICE}", "serve.batch_wait_ms=5",
                             "serve.allowed_hosts=[cptkit.test]", "quiet=true"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "server did not start"
        url = urlsplit(ready.read_text())
        yield url.hostname, url.port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def post(server, body: bytes | dict, headers: dict[str, str] | None = None, path: str = "/v1/completions"):
    """(status, parsed JSON answer) of one POST on a fresh connection."""
    conn = http.client.HTTPConnection(*server, timeout=120)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


def health(server) -> dict:
    conn = http.client.HTTPConnection(*server, timeout=30)
    conn.request("GET", "/health")
    out = json.loads(conn.getresponse().read())
    conn.close()
    return out


def test_max_tokens_over_the_cap_is_400_and_a_normal_request_still_runs(server):
    status, body = post(server, {"prompt": "Paris is", "max_tokens": 100_000_000})
    assert status == 400
    assert body["error"]["message"] == f"max_tokens=100000000 is outside 1..{CAP} (serve.max_tokens_cap)"
    status, body = post(server, {"prompt": "Paris is", "max_tokens": "many"})
    assert (status, body["error"]["message"]) == (400, 'max_tokens must be an integer, got "many"')
    status, body = post(server, {"prompt": "Paris is", "max_tokens": 3, "seed": 1})
    assert status == 200 and 1 <= body["usage"]["completion_tokens"] <= 3


def test_a_1mb_prompt_is_413_at_once(server):
    prompt = "word " * 200_000  # 1,000,000 characters
    status, body = post(server, {"prompt": prompt, "max_tokens": 3})
    assert status == 413
    assert body["error"]["message"] == "a prompt of 1,000,000 characters is over the limit of 65,536 (serve.max_prompt_chars)"
    # a 4 MiB body, refused by its Content-Length before it is read: the client, still sending, must get the
    # 413 (the server drains what it sends before closing) and not a broken pipe or a reset
    status, body = post(server, {"messages": [{"role": "user", "content": "x" * 2**22}]},
                        path="/v1/chat/completions")
    assert status == 413 and "over the limit of 1,048,576 bytes" in body["error"]["message"]


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"3", b"null", b"{not json"])
def test_a_body_that_is_not_a_json_object_is_400(server, raw):
    status, body = post(server, raw)
    assert status == 400
    assert body["error"]["message"].startswith(("the body must be a JSON object", "the body is not JSON"))


@pytest.mark.parametrize(("headers", "status"), [
    ({"Host": "evil.example:8000"}, 403),  # DNS rebinding: a page on evil.example resolved to 127.0.0.1
    ({"Origin": "http://evil.example"}, 403),  # a cross-origin browser request
    ({"Origin": "null"}, 403),
    ({"Host": "localhost:1234", "Origin": "http://localhost:1234"}, 200),
    ({"Host": "[::1]:1234"}, 200),
    ({"Host": "cptkit.test", "Origin": "https://cptkit.test"}, 200),  # serve.allowed_hosts
])
def test_host_and_origin_are_checked(server, headers, status):
    got, body = post(server, {"prompt": "Paris is", "max_tokens": 2, "seed": 1}, headers)
    assert got == status, body
    if status == 403:
        assert "is not" in body["error"]["message"] and "serve.allowed_hosts" in body["error"]["message"]
    conn = http.client.HTTPConnection(*server, timeout=30)
    conn.request("GET", "/v1/models", headers=headers)
    assert conn.getresponse().status == status
    conn.close()


def _open(server, body: dict) -> socket.socket:
    """A raw connection that sent one request and has not read the answer."""
    s = socket.create_connection(server, timeout=120)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _wait_for(cond, what: str) -> None:
    for _ in range(1200):
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


# A raw prompt and seed for which the tiny model runs to the cap: many slices.
LONG = {"prompt": "Psychology studies", "max_tokens": CAP, "temperature": 3.0, "seed": 15}


def test_a_client_that_hangs_up_cancels_its_generation(server):
    before, batches = health(server)["cancelled"], health(server)["batches"]
    s = _open(server, LONG)
    _wait_for(lambda: health(server)["batches"] > batches, "the request's first slice")
    s.close()
    _wait_for(lambda: health(server)["cancelled"] > before, "the cancellation")
    h = health(server)
    assert h["cancelled"] == before + 1
    status, body = post(server, {"prompt": "Paris is", "max_tokens": 2, "seed": 1})
    assert status == 200  # the server keeps serving


def test_a_short_request_is_answered_while_a_long_one_runs(server):
    batches = health(server)["batches"]
    long_sock = _open(server, LONG)
    _wait_for(lambda: health(server)["batches"] > batches, "the long request's first slice")
    status, body = post(server, {"prompt": "Paris is", "max_tokens": 3, "seed": 1})
    assert status == 200 and body["usage"]["completion_tokens"] <= 3
    # the short one is answered; the long one has not been: it is still being generated
    assert not select.select([long_sock], [], [], 0)[0]
    resp = http.client.HTTPResponse(long_sock)
    resp.begin()
    long_body = json.loads(resp.read())
    long_sock.close()
    assert resp.status == 200
    assert long_body["usage"]["completion_tokens"] > 2 * SLICE  # it needed several slices


def test_slices_add_up_to_the_unsliced_sample():
    """The scheduler's slices continue each row's token ids and sampler state: same text as one run."""
    from cptkit.llm import load_generator
    from cptkit.llm.base import Completion
    from tests._tiny_llm import llm_cfg

    gen = load_generator(llm_cfg(cached_tiny_model(), chat=False))
    params = gen.params(max_new_tokens=40, temperature=3.0)
    prompts, seeds = ["Psychology studies", "Paris is"], [11, 12]
    whole = gen._generate(prompts, params, seeds)
    states: list = [None, None]
    done: list = [None, None]
    turns = 0
    while None in done:
        todo = [i for i in range(2) if done[i] is None]
        outs = gen.generate_slice([prompts[i] for i in todo], params, [seeds[i] for i in todo],
                                  [states[i] for i in todo], SLICE)
        for i, o in zip(todo, outs, strict=True):
            if isinstance(o, Completion):
                done[i] = o
            else:
                states[i] = o
        turns += 1
    assert turns > 2
    assert [(c.text, c.completion_tokens, c.finish_reason) for c in done] == \
        [(c.text, c.completion_tokens, c.finish_reason) for c in whole]
