"""serve-llm: one client must not hurt the others (hostile input v5, issue 53, cases 1-6).

Real `cptkit serve-llm` subprocesses on the tiny model, on loopback: a tokenizer that panics (a Rust
panic is no ``Exception``), an over-context prompt batched with another client's request, 10,000 stop
strings, 400 half-sent requests (slowloris), ``Infinity`` and 200,000 ``[``, and a chunked body.
"""

from __future__ import annotations

import http.client
import json
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests._tiny_llm import cached_tiny_model
from tests.test_hostile_serve import post

ROOT = Path(__file__).resolve().parent.parent
PANIC = "a" * 40 + "!"  # with the pre-tokenizer Split (a+)+b: catastrophic backtracking, and the Rust tokenizer panics


def start(tmp: Path, model: Path, *args: str) -> tuple[subprocess.Popen, tuple[str, int], Path]:
    """A `cptkit serve-llm` on ``model``: (process, (host, port), its stderr log)."""
    ready, err = tmp / "url", tmp / "stderr.log"
    proc = subprocess.Popen([sys.executable, "-m", "cptkit.cli", "serve-llm", f"llm.model={model}", "llm.device=cpu",
                             "llm.num_threads=1", "serve.port=0", f"serve.ready_file={ready}", "quiet=true", *args],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err.open("w"))
    for _ in range(1200):
        if ready.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    if not ready.exists():
        proc.kill()
        raise AssertionError(err.read_text())
    url = urlsplit(ready.read_text())
    return proc, (url.hostname, url.port), err


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def health(server) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(*server, timeout=30)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    out = resp.status, json.loads(resp.read())
    conn.close()
    return out


def together(server, *bodies: dict) -> list[tuple[int, dict]]:
    """POST the bodies at once, each from its own client (thread); their (status, answer)s in order."""
    out: list = [None] * len(bodies)

    def one(i: int) -> None:
        try:
            out[i] = post(server, bodies[i])
        except Exception as e:  # noqa: BLE001 - reported as the answer
            out[i] = (None, repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The tiny model, default limits."""
    proc, addr, err = start(tmp_path_factory.mktemp("srv"), cached_tiny_model(), "serve.batch_wait_ms=5")
    yield addr, err
    stop(proc)


def panic_model(directory: Path) -> Path:
    """The tiny model with a pre-tokenizer ``Split`` on ``(a+)+b`` before its own."""
    shutil.copytree(cached_tiny_model(), directory)
    path = directory / "tokenizer.json"
    tok = json.loads(path.read_text())
    split = {"type": "Split", "pattern": {"Regex": "(a+)+b"}, "behavior": "Isolated", "invert": False}
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, tok["pre_tokenizer"]]}
    path.write_text(json.dumps(tok))
    return directory


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """The panicking tokenizer, a context of 64 tokens, and batches of exactly two requests (a batch waits
    for its second), so two clients' requests sent together share one batch."""
    tmp = tmp_path_factory.mktemp("pairs")
    proc, addr, err = start(tmp, panic_model(tmp / "model"), "llm.max_model_len=64", "serve.max_batch=2",
                            "serve.batch_wait_ms=600000")
    yield addr
    stop(proc)


def test_the_panic_model_really_panics_in_the_installed_tokenizers(tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(panic_model(tmp_path / "m") / "tokenizer.json"))
    assert tok.encode("Paris is").ids
    with pytest.raises(BaseException) as e:  # noqa: PT011 - a pyo3 PanicException, no Exception subclass
        tok.encode(PANIC)
    assert type(e.value).__name__ == "PanicException" and not isinstance(e.value, Exception)


# 1. a tokenizer panic fails its request alone; the worker survives and /health tells the truth
def test_a_tokenizer_panic_fails_its_request_and_the_server_goes_on(pairs):
    victim = {"prompt": "Paris is", "max_tokens": 3, "seed": 1}
    (status, body), (vstatus, vbody) = together(pairs, {**victim, "prompt": PANIC}, victim)
    assert status == 500 and body["error"]["message"].startswith("PanicException"), body
    assert vstatus == 200 and 1 <= vbody["usage"]["completion_tokens"] <= 3, vbody  # its batch-mate is answered
    code, h = health(pairs)
    assert code == 200 and h["status"] == "ok" and h["failed"] >= 1
    for status, body in together(pairs, victim, {**victim, "seed": 2}):  # later requests are served
        assert status == 200, body


# 2. an over-context prompt in the same batch as another client's request: refused alone
def test_an_over_context_prompt_is_refused_alone(pairs):
    _, before = health(pairs)
    victim = {"prompt": "Paris is", "max_tokens": 3, "seed": 1}
    (status, body), (vstatus, vbody) = together(pairs, {**victim, "prompt": "Paris is a city. " * 30}, victim)
    assert status == 400 and "exceeds the context of 64 tokens" in body["error"]["message"], body
    assert vstatus == 200 and 1 <= vbody["usage"]["completion_tokens"] <= 3, vbody
    _, after = health(pairs)
    assert after["refused"] == before["refused"] + 1 and after["batches"] > before["batches"]


# 3. stop strings are bounded in count and length
def test_stop_strings_are_bounded(server):
    addr, _ = server
    base = {"prompt": "Paris is", "max_tokens": 4, "seed": 1}
    status, body = post(addr, {**base, "stop": [f"{i:05d}" + "x" * 45 for i in range(10_000)]})
    assert (status, body["error"]["message"]) == (400, "10,000 stop strings are over the limit of 16 (serve.max_stop)")
    status, body = post(addr, {**base, "stop": ["y" * 257]})
    assert (status, body["error"]["message"]) == (
        400, "a stop string of 257 characters is over the limit of 256 (serve.max_stop_chars)")
    status, body = post(addr, {**base, "stop": [{"not": "a string"}]})
    assert (status, body["error"]["message"]) == (400, "stop must be a string or a list of strings")
    status, body = post(addr, {**base, "stop": [f"{i:02d}" + "z" * 254 for i in range(16)]})  # at the limits
    assert status == 200 and body["usage"]["completion_tokens"] <= 4


# 4. slowloris: half-sent requests are closed after serve.read_timeout_s; over serve.max_connections, 503 at once
def outcomes(socks: list[socket.socket], seconds: float) -> list[bytes | str]:
    """Each socket's bytes until the server closed it, "reset", or "open" when still open after ``seconds``."""
    got: dict[socket.socket, bytes | str] = {s: b"" for s in socks}
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + seconds
    while sel.get_map() and (left := deadline - time.monotonic()) > 0:
        for key, _ in sel.select(min(left, 1.0)):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data, got[s] = b"", "reset"
            if data:
                got[s] += data
            else:
                sel.unregister(s)
    for key in list(sel.get_map().values()):
        got[key.fileobj] = "open"
    return [got[s] for s in socks]


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    proc, addr, err = start(tmp_path_factory.mktemp("slow"), cached_tiny_model(), "serve.read_timeout_s=3",
                            "serve.max_connections=16", "serve.batch_wait_ms=5")
    yield addr
    stop(proc)


def test_half_sent_requests_are_closed_and_connections_are_capped(slow):
    socks = []
    for _ in range(400):
        s = socket.create_connection(slow, timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n")  # half a head
        socks.append(s)
    got = outcomes(socks, 90)
    for s in socks:
        s.close()
    assert "open" not in got, f"{got.count('open')} of 400 half-sent requests still open"
    busy = [g for g in got if isinstance(g, bytes) and g.startswith(b"HTTP/1.1 503")]
    assert busy and b"serve.max_connections=16" in busy[0]
    assert got.count(b"") >= 1  # those the server took: closed once serve.read_timeout_s was up
    # a body that stops short: 408 once the time is up
    s = socket.create_connection(slow, timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{\"prompt\": ")
    [late] = outcomes([s], 90)
    s.close()
    assert isinstance(late, bytes) and late.startswith(b"HTTP/1.1 408") and b"serve.read_timeout_s" in late, late
    status, body = post(slow, {"prompt": "Paris is", "max_tokens": 3, "seed": 1})  # and the server serves
    assert status == 200, body


# 5. Infinity, NaN and deep nesting: 400, no traceback
@pytest.mark.parametrize("raw", [b'{"prompt": "Paris is", "max_tokens": Infinity}',
                                 b'{"prompt": "Paris is", "n": Infinity}',
                                 b'{"prompt": "Paris is", "seed": -Infinity}',
                                 b'{"prompt": "Paris is", "seed": NaN}',
                                 b'{"prompt": "Paris is", "max_tokens": 1e999}',
                                 b'{"prompt": "Paris is", "seed": 1e300}',
                                 b'{"prompt": "Paris is", "temperature": 1e999}',
                                 b"[" * 200_000,
                                 b'{"prompt": "Paris is", "x": ' + b"[" * 100 + b"]" * 100 + b"}"])
def test_infinity_and_deep_nesting_are_400_without_a_traceback(server, raw):
    addr, err = server
    status, body = post(addr, raw)
    assert status == 400, body
    assert body["error"]["message"].startswith(("the body is not JSON", "the body nests", "max_tokens must be",
                                                "seed=", "temperature must be")), body
    assert "Traceback" not in err.read_text()
    assert post(addr, {"prompt": "Paris is", "max_tokens": 2, "seed": 1})[0] == 200


# 6. chunked bodies are read as chunks, never as a second request
def test_a_chunked_body_is_read_and_never_answered_as_a_second_request(server):
    addr, _ = server
    data = json.dumps({"prompt": "Paris is", "max_tokens": 3, "seed": 1}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + 7]), data[i:i + 7]) for i in range(0, len(data), 7))
    s = socket.create_connection(addr, timeout=120)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n"
              # the next request on the same connection
              + b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    f = s.makefile("rb")
    answers = []
    for _ in range(2):  # two answers on one connection, each (status, JSON body of its Content-Length)
        status = int(f.readline().split()[1])
        head = dict(line.decode().split(": ", 1) for line in iter(f.readline, b"\r\n"))
        answers.append((status, json.loads(f.read(int(head["Content-Length"])))))
    s.close()
    (status, body), (mstatus, models) = answers
    assert status == 200 and body["usage"]["completion_tokens"] <= 3, body
    assert mstatus == 200 and models["object"] == "list"
    # any other transfer coding: 501; a chunked body over serve.max_body_bytes: 413; both headers: 400
    status, body = post(addr, b"{}", {"Transfer-Encoding": "gzip, chunked"})
    assert status == 501 and "only chunked" in body["error"]["message"]
    big = b"%x\r\n%s\r\n" % (2**20 + 1, b" " * (2**20 + 1)) + b"0\r\n\r\n"
    status, body = post(addr, big, {"Transfer-Encoding": "chunked"})
    assert status == 413 and "over the limit of 1,048,576 bytes" in body["error"]["message"]
    status, body = post(addr, chunked + b"0\r\n\r\n", {"Transfer-Encoding": "chunked", "Content-Length": "5"})
    assert (status, body["error"]["message"]) == (400, "both Transfer-Encoding and Content-Length are set")


def test_stop_strings_end_a_row_at_the_token_that_completes_them():
    """The linear stop-string check (RowStop) ends a row at the first token whose text completes a stop
    string, in one run and across time slices of 2 tokens, and no vocabulary × stop-length table is built
    or kept (transformers' ``stop_strings`` keep up to 8, 777 MiB each for 16 × 256 characters on a 49k
    vocabulary: bench/stop_strings.py)."""
    from transformers.generation.stopping_criteria import STOP_STRING_EMBEDDING_CACHE

    from cptkit.llm import load_generator
    from cptkit.llm.base import Completion, apply_stop
    from cptkit.llm.hf import RowSampler
    from tests._tiny_llm import llm_cfg

    STOP_STRING_EMBEDDING_CACHE.clear()  # process-wide: evaluate's generation (models/scoring.py) may have filled it
    gen = load_generator(llm_cfg(cached_tiny_model(), chat=False))
    prompt, params = "Psychology studies", gen.params(max_new_tokens=24, temperature=0.0)
    ids = gen._run([gen._prompt_ids(prompt)], params, RowSampler([0], 0.0, 1.0, gen.device), 24)[0]
    ids = ids[:gen._cut(ids)[0]]
    texts = [gen._text(ids[:k]) for k in range(len(ids) + 1)]
    # a stop string that the 6th token or a later one completes, spanning two tokens
    k = next(k for k in range(6, len(ids)) if len(texts[k - 1]) - len(texts[k - 2]) >= 2 and len(texts[k]) > len(texts[k - 1]))
    stop = texts[k - 1][-2:] + texts[k][len(texts[k - 1]):][:1]
    first = next(j for j in range(len(ids) + 1) if stop in texts[j])
    stopped = replace(params, stop=(stop,))
    want = (apply_stop(texts[-1], [stop])[0].strip(), first, "stop")
    [one] = gen._generate([prompt], stopped, [0])
    assert (one.text, one.completion_tokens, one.finish_reason) == want
    state, turns = None, 0
    while not isinstance(state, Completion):
        [state] = gen.generate_slice([prompt], stopped, [0], [state], 2)
        turns += 1
    assert (state.text, state.completion_tokens, state.finish_reason) == want and turns > 2
    assert not STOP_STRING_EMBEDDING_CACHE


def test_health_is_503_and_requests_fail_at_once_when_the_worker_stops():
    """Should the generation worker thread ever end (here SystemExit inside the real backend, which it does
    not catch), /health answers 503 with the reason, the waiting request and later ones get 503: none hangs."""
    from cptkit.llm import load_generator
    from cptkit.llm.serve import Batcher, Limits, Server, make_handler
    from tests._tiny_llm import llm_cfg

    gen = load_generator(llm_cfg(cached_tiny_model(), chat=False))
    real, calls = gen.generate_slice, []

    def slice_then_exit(*args, **kwargs):  # the second batch ends the worker thread
        calls.append(1)
        if len(calls) > 1:
            raise SystemExit("stopped by the test")
        return real(*args, **kwargs)

    gen.generate_slice = slice_then_exit
    batcher = Batcher(gen, max_batch=1, wait_ms=0)
    httpd = Server(("127.0.0.1", 0), make_handler(batcher, "m", 8, Limits()), 8)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    addr = ("127.0.0.1", httpd.server_address[1])
    try:
        assert post(addr, {"prompt": "Paris is", "max_tokens": 2, "seed": 1})[0] == 200
        assert health(addr)[0] == 200
        status, body = post(addr, {"prompt": "Paris is", "max_tokens": 2, "seed": 1})
        assert (status, body["error"]["message"]) == (
            503, "the generation worker has stopped (SystemExit: stopped by the test)")
        code, h = health(addr)
        assert code == 503 and h["status"] == "error" and "SystemExit: stopped by the test" in h["error"]
        assert post(addr, {"prompt": "Paris is", "max_tokens": 2, "seed": 1})[0] == 503
    finally:
        httpd.shutdown()
        httpd.server_close()
