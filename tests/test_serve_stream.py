"""serve-llm speaks to the official `openai` client: streaming (server-sent events), n > 1, stop strings
in a stream, usage in the last chunk, and a client that hangs up mid-stream. A real `cptkit serve-llm`
subprocess on the tiny model (transformers backend, token-by-token text through a per-row stopping
criterion); the slow test at the end streams the shipped SmolLM2 GGUF through llama.cpp."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from cptkit.llm.base import TextDeltas, apply_stop, settled_prefix
from cptkit.llm.serve import choice_seeds
from tests._tiny_llm import cached_tiny_model

ROOT = Path(__file__).resolve().parent.parent
# A chat prompt the tiny model answers at length (greedy), and a raw prompt it continues
CHAT = [{"role": "user", "content": "Answer: What is the capital of France?"}]
RAW = "The capital of France is"
# sampled at temperature 3 from seed 15, the tiny model runs to max_tokens (tests/test_hostile_serve.py)
LONG = {"prompt": "Psychology studies", "max_tokens": 400, "temperature": 3.0, "seed": 15}


def start_server(tmp: Path, *args: str) -> tuple[subprocess.Popen, str]:
    ready = tmp / "url"
    proc = subprocess.Popen([sys.executable, "-m", "cptkit.cli", "serve-llm", "llm.num_threads=1", "serve.port=0",
                             f"serve.ready_file={ready}", "quiet=true", *args],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(900):
        if ready.exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    if not ready.exists():
        err = proc.stderr.read() if proc.poll() is not None else "server did not start"  # type: ignore[union-attr]
        proc.terminate()
        raise AssertionError(err)
    return proc, ready.read_text()


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    proc, base = start_server(tmp_path_factory.mktemp("srv"), f"llm.model={cached_tiny_model()}", "llm.device=cpu",
                              "serve.slice_tokens=4", "serve.batch_wait_ms=5", "serve.max_n=4")
    yield base
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


def health(url: str) -> dict:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/health")
    out = json.loads(conn.getresponse().read())
    conn.close()
    return out


def collect(stream) -> tuple[list, dict[int, list[str]], dict[int, str]]:
    """(all chunks, each choice's text pieces in order, each choice's finish_reason)."""
    chunks, pieces, reasons = [], {}, {}
    for ch in stream:
        chunks.append(ch)
        for c in ch.choices:
            piece = c.delta.content if hasattr(c, "delta") else c.text
            if piece:
                pieces.setdefault(c.index, []).append(piece)
            if c.finish_reason is not None:
                assert c.index not in reasons, "a choice finished twice"
                reasons[c.index] = c.finish_reason
    return chunks, pieces, reasons


# -- the text a stream may send ---------------------------------------------------------------------

def test_settled_text_never_runs_past_a_stop_string():
    assert settled_prefix("Hello ##", ["###"]) == "Hello "  # "##" may become "###"
    assert settled_prefix("Hello #x", ["###"]) == "Hello #x"
    assert settled_prefix("Hello ### more", ["###"]) == "Hello "
    assert settled_prefix("caf\ufffd", []) == "caf"  # half a UTF-8 character: wait for its other bytes
    # a stop string spanning three pieces: nothing of it is ever sent, and the pieces add up to the cut text
    d = TextDeltas(["END!"])
    sent = [d.update(raw) for raw in [" Paris", " Paris E", " Paris EN", " Paris END", " Paris END!"]]
    assert sent == ["Paris", "", "", "", ""]
    assert d.finish(apply_stop(" Paris END!", ["END!"])[0].strip()) == ""
    # trailing whitespace waits: the finished text is stripped
    d = TextDeltas([])
    assert [d.update(" a "), d.update(" a b  "), d.finish("a b")] == ["a", " b", ""]


def test_choice_seeds_are_distinct_deterministic_and_keep_choice_zero():
    s = choice_seeds(7, 16)
    assert s[0] == 7 and len(set(s)) == 16 and s == choice_seeds(7, 16)
    assert choice_seeds(7, 3) == s[:3] and choice_seeds(8, 3)[1:] != s[1:3]
    assert all(0 <= x < 2**31 for x in s)


# -- the wire format ----------------------------------------------------------------------------------

def test_raw_events_are_openai_server_sent_events(url):
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    body = {"messages": CHAT, "max_tokens": 12, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    raw = resp.read().decode()  # http.client undoes the chunked transfer encoding
    conn.close()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    first, *content, last = chunks
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert all(c["usage"] is None for c in chunks[:-1])  # OpenAI: every other chunk has usage: null
    assert content[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] <= 12


# -- the openai client --------------------------------------------------------------------------------

def test_chat_stream_adds_up_to_the_plain_answer_with_usage_last(client):
    plain = client.chat.completions.create(model="m", messages=CHAT, max_tokens=24, temperature=0)
    stream = client.chat.completions.create(model="m", messages=CHAT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks, pieces, reasons = collect(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert "".join(pieces[0]) == plain.choices[0].message.content != ""
    assert len(pieces[0]) > 3  # token by token, not one piece at the end
    assert reasons == {0: plain.choices[0].finish_reason}
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream_adds_up_to_the_plain_text(client):
    plain = client.completions.create(model="m", prompt=RAW, max_tokens=20, temperature=0)
    chunks, pieces, reasons = collect(client.completions.create(model="m", prompt=RAW, max_tokens=20, temperature=0,
                                                                stream=True))
    assert {c.object for c in chunks} == {"text_completion"}
    assert "".join(pieces[0]) == plain.choices[0].text != ""
    assert reasons == {0: plain.choices[0].finish_reason}
    assert all(c.usage is None for c in chunks)  # no usage chunk unless asked


def test_n_choices_plain_and_streamed(client, url):
    greedy = client.chat.completions.create(model="m", messages=CHAT, max_tokens=10, temperature=0, n=2)
    assert [c.index for c in greedy.choices] == [0, 1]
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    kw = {"model": "m", "prompt": RAW, "max_tokens": 10, "temperature": 2.0, "seed": 5}
    one = client.completions.create(**kw)
    three = client.completions.create(**kw, n=3)
    texts = [c.text for c in three.choices]
    assert texts[0] == one.choices[0].text  # choice 0 samples with the request's seed, as n=1 does
    assert len(set(texts)) == 3  # the others with their own seeds
    assert [c.text for c in client.completions.create(**kw, n=3).choices] == texts  # deterministic
    assert three.usage.prompt_tokens == one.usage.prompt_tokens  # one prompt, three choices' tokens
    assert three.usage.completion_tokens > one.usage.completion_tokens
    _, pieces, reasons = collect(client.completions.create(**kw, n=3, stream=True))
    assert ["".join(pieces.get(i, [])) for i in range(3)] == texts
    assert reasons == {i: c.finish_reason for i, c in enumerate(three.choices)}
    with pytest.raises(openai.BadRequestError, match=r"n=5 is outside 1\.\.4 \(serve\.max_n\)"):
        client.completions.create(**kw, n=5)
    with pytest.raises(openai.BadRequestError, match="stream_options is only allowed with stream=true"):
        client.completions.create(**kw, stream_options={"include_usage": True})


def test_stop_strings_hold_in_a_stream_even_across_pieces(client):
    kw = {"model": "m", "messages": CHAT, "max_tokens": 24, "temperature": 0}
    _, pieces, _ = collect(client.chat.completions.create(**kw, stream=True))
    full = "".join(pieces[0])
    # a stop string made of the end of one piece and the start of the next: it spans two chunks
    i = next(i for i in range(1, len(pieces[0]) - 1) if len(pieces[0][i].strip()) >= 2)
    stop = pieces[0][i][-2:] + pieces[0][i + 1][:2]
    want = apply_stop(full, [stop])[0].strip()
    assert stop in full and len(want) < len(full)
    plain = client.chat.completions.create(**kw, stop=[stop])
    _, spieces, reasons = collect(client.chat.completions.create(**kw, stop=[stop], stream=True))
    streamed = "".join(spieces.get(0, []))
    assert streamed == plain.choices[0].message.content == want
    assert reasons == {0: "stop"} and stop not in streamed


def test_a_client_that_hangs_up_mid_stream_stops_its_generation(client, url):
    before = health(url)
    stream = client.completions.create(model="m", **LONG, stream=True)
    got = 0
    for ch in stream:
        got += sum(bool(c.text) for c in ch.choices)
        if got >= 3:
            break
    stream.close()  # hang up after three pieces of a 400-token generation
    for _ in range(600):
        if health(url)["cancelled"] > before["cancelled"]:
            break
        time.sleep(0.05)
    h = health(url)
    assert h["cancelled"] == before["cancelled"] + 1 and h["requests"] == before["requests"]
    # the server goes on serving, streamed and plain
    _, pieces, reasons = collect(client.completions.create(model="m", prompt=RAW, max_tokens=6, temperature=0,
                                                           stream=True))
    assert reasons[0] in ("stop", "length") and pieces
    assert client.completions.create(model="m", prompt=RAW, max_tokens=6, temperature=0).choices[0].text


@pytest.mark.slow
def test_stream_smollm2_through_llamacpp(smollm2, tmp_path):
    """The shipped GGUF through llama.cpp: tokens stream as they are decoded; the pieces add up to the
    plain answer; a hang-up mid-stream cancels, and the next request is served."""
    from cptkit.llm.llamacpp import llamacpp_available

    assert llamacpp_available(), "llama-cpp-python is missing: make install builds it"
    proc, base = start_server(tmp_path, "llm=llamacpp")
    try:
        client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        plain = client.chat.completions.create(model="m", messages=msgs, max_tokens=24, temperature=0)
        chunks, pieces, reasons = collect(client.chat.completions.create(
            model="m", messages=msgs, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}))
        assert "".join(pieces[0]) == plain.choices[0].message.content and len(pieces[0]) > 3
        assert reasons == {0: plain.choices[0].finish_reason} and chunks[-1].usage == plain.usage
        before = health(base)["cancelled"]
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Write a long story."}],
                                                max_tokens=400, temperature=0, stream=True)
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
        for _ in range(600):
            if health(base)["cancelled"] > before:
                break
            time.sleep(0.05)
        assert health(base)["cancelled"] == before + 1
        assert client.chat.completions.create(model="m", messages=msgs, max_tokens=24, temperature=0) \
            .choices[0].message.content == plain.choices[0].message.content
    finally:
        proc.terminate()
        proc.wait(timeout=30)
