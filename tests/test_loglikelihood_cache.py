"""loglikelihood with a shared context: the context of requests that share it runs once and its
KV cache scores every continuation; the numbers are those of each request run on its own.

A tiny real Llama (seeded) with a byte-level BPE trained on real text (Debian copyright files).
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cptkit.models import scoring
from cptkit.models.tiny import tiny_llama, train_bpe_tokenizer


@pytest.fixture(scope="module")
def tiny():
    texts = []
    for f in sorted(glob.glob("/usr/share/doc/*/copyright")):
        t = Path(f).read_text(errors="replace").strip()
        if len(t) > 400:
            texts.append(t[:3000])
        if len(texts) == 80:
            break
    assert len(texts) >= 40, "needs Debian copyright files under /usr/share/doc"
    tok = train_bpe_tokenizer(texts, vocab_size=600)
    model = tiny_llama(tok, hidden=64, layers=2, heads=4, max_position=1024, seed=5)
    return tok, model, texts


def reference(model, tok, context: str, continuation: str, max_length: int) -> tuple[float, bool]:
    """One request alone, lm-eval's way: the last max_length + 1 tokens, minus the last, in one row."""
    ctx, cont = scoring.encode_pair(tok, context, continuation)
    seq = (ctx + cont)[-(max_length + 1):][:-1]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([seq])).logits[0].float(), dim=-1)[len(seq) - len(cont):]
    target = torch.tensor(cont)
    return float(logp.gather(1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())


def greedy_text(model, tok, context: str, n: int) -> str:
    """The model's greedy continuation of ``context``, ``n`` tokens, as text."""
    ids = tok.encode(context)
    out = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids + out])).logits[0, -1].argmax())
            out.append(nxt)
    return tok.decode(out)


def requests(model, tok, texts) -> list[tuple[str, str]]:
    """Shared contexts of different lengths (one cut by max_length=96), continuations of 1 to ~20
    tokens, some the greedy decode, a context used once, an empty context."""
    contexts = ["Permission is hereby granted, free of charge, to any person",
                "Copyright:",
                texts[7][:400] + "\n\nLicense:",
                texts[11][:900]]  # over 96 tokens: truncated, scored whole
    conts = [" GPL", "s", " of this software and associated documentation files (the \"Software\")", "\n", " MIT license"]
    reqs = [(c, x) for c in contexts for x in conts]
    reqs += [(c, greedy_text(model, tok, c, 3)) for c in contexts[:3]]
    return reqs + [("Files: *", " debian/*"), ("", "License")]


def test_shared_context_scores_equal_each_request_alone(tiny):
    tok, model, texts = tiny
    reqs = requests(model, tok, texts)
    refs = {ml: [reference(model, tok, c, x, ml) for c, x in reqs] for ml in (96, 1024)}
    assert any(g for _, g in refs[1024]), "no greedy continuation: the flags are not tested"
    encoded = [scoring.encode_pair(tok, c, x) for c, x in reqs]
    for ml in (96, 1024):
        groups, alone = scoring._context_groups(encoded, ml)
        assert len(groups) >= (2 if ml == 96 else 4) and alone  # the cached path and the whole path both run
        lengths = {len(encoded[i][1]) for m in groups for i in m}
        assert 1 in lengths and max(lengths) > 10  # one-token continuations (no second pass) and long ones
        if ml == 96:
            assert any(len(encoded[i][0]) > 96 for i in alone)  # the long context is cut: scored whole
        for bs in (1, 3, 16):
            got = scoring.loglikelihood(model, tok, reqs, batch_size=bs, max_length=ml)
            for (c, x), (ll, greedy), (ref_ll, ref_greedy) in zip(reqs, got, refs[ml], strict=True):
                assert ll == pytest.approx(ref_ll, abs=1e-4), (c[:30], x, bs, ml)
                assert greedy == ref_greedy, (c[:30], x, bs, ml)


def test_cached_scores_equal_uncached_scores(tiny):
    """The cached path against the whole-request path of the same module, on the same groups."""
    tok, model, texts = tiny
    reqs = requests(model, tok, texts)
    encoded = [scoring.encode_pair(tok, c, x) for c, x in reqs]
    groups, _ = scoring._context_groups(encoded, 1024)
    for bs in (1, 5):
        shared = scoring._score_shared(model, [(encoded[m[0]][0], [encoded[i][1] for i in m]) for m in groups], bs)
        for members, scores in zip(groups, shared, strict=True):
            whole = scoring._score_plain(model, [encoded[i] for i in members], bs, 1024)
            for (ll, greedy), (ref_ll, ref_greedy) in zip(scores, whole, strict=True):
                assert ll == pytest.approx(ref_ll, abs=1e-4) and greedy == ref_greedy


def test_context_groups_keep_truncated_and_single_requests_whole():
    enc = [([1, 2, 3], [4]), ([1, 2, 3], [5, 6]), ([1, 2, 3], [7] * 8), ([9], [4]), ([9], [5]), ([8, 8], [1])]
    groups, alone = scoring._context_groups(enc, limit=5)
    assert groups == [[0, 1], [3, 4]]  # request 2 would be cut at 5 + 1 tokens; [8, 8] is alone
    assert alone == [2, 5]
    assert scoring._context_groups(enc, limit=5, share=False) == ([], [0, 1, 2, 3, 4, 5])


def test_batches_cover_every_row_longest_first():
    lengths = [1000, 990, 500, 480, 470, 30, 10, 12, 1000, 3]
    batches = scoring._batches(lengths, batch_size=3)
    assert [[lengths[i] for i in b] for b in batches] == [[1000, 1000, 990], [500, 480, 470], [30, 12, 10], [3]]
    assert batches[0] == [0, 8, 1]  # ties: first index first
