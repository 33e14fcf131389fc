"""llama.cpp backend, batched decoding: a request's output never depends on its batch.

Several requests share one llama.cpp context (one KV stream and one sampler per sequence); these
tests compare batched runs with one-at-a-time runs on the embedded SmolLM2 GGUF, token counts and
texts, greedy and sampled. No timings here (bench/generate.py measures speed).
"""

from __future__ import annotations

import pytest

from cptkit.core.errors import CptkitError
from cptkit.llm import load_generator
from cptkit.llm.base import GenParams, RequestRefused
from tests._tiny_llm import llm_cfg

pytestmark = pytest.mark.slow

# different prompt lengths; the one-word chat ends with EOS long before max_new_tokens
PROMPTS = ["Name a prime number.",
           "What is the capital of France?",
           [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "What colour is the sky?"}],
           "Explain photosynthesis in one sentence, then say why plants need light, water and carbon dioxide.",
           "Why is the sky blue?",
           "Write a question about organic chemistry for a first-year university exam on reaction mechanisms."]


@pytest.fixture(scope="module")
def gens(smollm2):
    """The embedded SmolLM2 through llama.cpp: batch 4 (one context, 4 sequences) and batch 1."""
    from cptkit.llm.llamacpp import llamacpp_available

    assert llamacpp_available(), "llama-cpp-python is missing: make install builds it"
    four = load_generator(llm_cfg("smollm2", backend="llamacpp", batch_size=4))
    one = load_generator(llm_cfg("smollm2", backend="llamacpp", batch_size=1))
    yield four, one
    four.close()
    one.close()


def _fields(comps):
    return [(c.text, c.completion_tokens, c.prompt_tokens, c.finish_reason) for c in comps]


def test_greedy_batched_equals_one_at_a_time(gens):
    four, one = gens
    p = GenParams(max_new_tokens=24, temperature=0.0)
    seeds = [0] * len(PROMPTS)
    batched = four._generate(PROMPTS, p, seeds)  # 6 requests on 4 sequences: two slots are reused
    alone = [one._generate([r], p, [0])[0] for r in PROMPTS]
    assert _fields(batched) == _fields(alone)
    reasons = {c.finish_reason for c in batched}
    assert reasons == {"stop", "length"}, reasons  # one stops early (EOS), others run to max_new_tokens
    assert min(c.completion_tokens for c in batched) < 24
    assert len({c.prompt_tokens for c in batched}) == len(PROMPTS)  # all prompt lengths differ
    # the same through generate (cache off): its length-sorted batches, reversed order, batch size 1
    four.batch_size = 4
    assert _fields(four.generate(PROMPTS[::-1], p)[::-1]) == _fields(alone)
    four.batch_size = 1
    try:
        assert _fields(four.generate(PROMPTS, p)) == _fields(alone)  # one sequence on the 4-sequence context
    finally:
        four.batch_size = 4
    # token for token: the texts re-tokenize to the same ids (the text equality above holds them)
    assert [four.llm.tokenize(c.text.encode(), add_bos=False) for c in batched] == \
        [one.llm.tokenize(c.text.encode(), add_bos=False) for c in alone]


def test_stop_strings_batched(gens):
    four, one = gens
    p = GenParams(max_new_tokens=24, temperature=0.0, stop=("number", "."))
    batched = four._generate(PROMPTS, p, [0] * len(PROMPTS))
    alone = [one._generate([r], p, [0])[0] for r in PROMPTS]
    assert _fields(batched) == _fields(alone)
    assert all("number" not in c.text and "." not in c.text for c in batched)
    assert any(c.finish_reason == "stop" and c.completion_tokens < 24 for c in batched)


def test_sampled_batched_equals_one_at_a_time(gens):
    four, one = gens
    p = GenParams(max_new_tokens=20, temperature=0.9, top_p=0.95, repetition_penalty=1.1, seed=3)
    reqs = PROMPTS[:3] * 2
    base = [1, 1, 1, 2, 2, 2]
    batched = four.generate(reqs, p, seeds=base)
    alone = one.generate(reqs, p, seeds=base)
    assert _fields(batched) == _fields(alone)
    rev = four.generate(reqs[::-1], p, seeds=base[::-1])[::-1]
    assert _fields(rev) == _fields(batched)
    assert [c.text for c in batched[:3]] != [c.text for c in batched[3:]]  # other seeds, other samples


def test_too_long_request_in_a_batch_is_refused_by_index(smollm2):
    g = load_generator(llm_cfg("smollm2", backend="llamacpp", batch_size=4, max_model_len=256))
    try:
        reqs = ["Name a prime number.", "Why is the sky blue?", "word " * 300, "What is inflation?"]
        p = GenParams(max_new_tokens=8, temperature=0.0)
        with pytest.raises(RequestRefused) as e:
            g._generate(reqs, p, [0] * 4)
        assert e.value.index == 2 and "exceeds the context of 256 tokens (llm.max_model_len)" in str(e.value)
        with pytest.raises(CptkitError, match=r"^rec-c: a prompt of \d+ tokens \+ max_new_tokens 8 exceeds"):
            g.generate(reqs, p, labels=["rec-a", "rec-b", "rec-c", "rec-d"])
        # the context still works after a refusal, and max_new_tokens counts against the context
        assert g.generate(reqs[:2], p)[0].completion_tokens > 0
        with pytest.raises(RequestRefused, match="max_new_tokens 250 exceeds"):
            g._generate(reqs[:1], GenParams(max_new_tokens=250, temperature=0.0), [0])
    finally:
        g.close()


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_requantized_copy_is_made_once_and_batches_exactly(smollm2, tmp_path, monkeypatch, qtype):
    """llm.requantize converts the GGUF once into $CPTKIT_CACHE (a second load reuses the file), and
    llama.cpp's repacked GEMM kernels for the copy still give every request its one-at-a-time output."""
    monkeypatch.setenv("CPTKIT_CACHE", str(tmp_path))
    four = load_generator(llm_cfg("smollm2", backend="llamacpp", batch_size=4, requantize=qtype))
    [copy] = (tmp_path / "gguf-requant").glob(f"*.{qtype}-*.gguf")
    assert four.model_id.endswith(copy.name) and not list(copy.parent.glob(".*.tmp"))
    made = copy.stat().st_mtime_ns
    one = load_generator(llm_cfg("smollm2", backend="llamacpp", batch_size=1, requantize=qtype))
    try:
        assert copy.stat().st_mtime_ns == made and one.model_id == four.model_id
        p = GenParams(max_new_tokens=16, temperature=0.0)
        batched = four._generate(PROMPTS, p, [0] * len(PROMPTS))
        assert _fields(batched) == _fields([one._generate([r], p, [0])[0] for r in PROMPTS])
        assert all(c.completion_tokens > 0 for c in batched)
    finally:
        four.close()
        one.close()
    with pytest.raises(CptkitError, match=r"llm.requantize=q5_k: must be one of q8_0, q4_0"):
        load_generator(llm_cfg("smollm2", backend="llamacpp", requantize="q5_k"))
