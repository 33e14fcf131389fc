"""What a causal LM computes on text: document losses (perplexity) and lm-evaluation-harness's
requests (log-likelihoods, greedy generation). The one code path for every number a model
produces in cptkit: ``evaluate`` and the mixture controllers of ``train`` both call
:func:`group_losses`, so their per-domain losses agree.

* ``document_losses`` / ``group_losses``: token-weighted negative log-likelihood of documents,
  per document and per group (domain, topic, lang, source...).
* ``loglikelihood`` / ``generate_until``: the requests of lm-evaluation-harness, with its
  tokenization conventions (see docs/evaluate.md, "Tokenization boundaries").

Document scoring convention: a document's tokens are ``tokenizer.encode(text,
add_special_tokens=False)``; the first token is predicted from ``prefix_token_id`` (BOS, or EOS
when the tokenizer has no BOS), as in lm-eval's ``loglikelihood_rolling``. Long documents are
cut into consecutive windows of ``max_length`` predicted tokens; each later window is
conditioned on the last token of the previous one, so every token is scored exactly once.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from cptkit.core.errors import CptkitError
from cptkit.text.encode import encode_long

DEFAULT_MAX_LENGTH = 2048  # lm-eval's default when neither config nor tokenizer gives one
TOKENIZER_INFINITY = 1000000000000000019884624838656  # transformers' model_max_length for "no limit"


def prefix_token_id(tokenizer) -> int:
    """The token that conditions an empty context: BOS, else EOS (lm-eval's ``prefix_token_id``)."""
    tid = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if tid is None:
        raise CptkitError("tokenizer has neither a BOS nor an EOS token to condition the first token on")
    return int(tid)


def model_max_length(model, tokenizer=None, default: int = DEFAULT_MAX_LENGTH) -> int:
    """Context length as lm-eval resolves it: config ``n_positions``/``max_position_embeddings``/``n_ctx``."""
    cfg = getattr(model, "config", None)
    cfg = getattr(cfg, "text_config", None) or cfg
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        v = getattr(cfg, attr, None)
        if v is not None:
            return int(v)
    mml = getattr(tokenizer, "model_max_length", None)
    if mml is not None and mml != TOKENIZER_INFINITY:
        return int(mml)
    return default


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


# --- batched forward passes ---------------------------------------------------------------------
def _batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths``, longest first (ties: first index), in batches of ``batch_size``:
    rows of similar length share a batch, so right padding stays small. (Smaller batches to cut
    the padding further measured slower on CPU than the padding they save.)"""
    order = sorted(range(len(lengths)), key=lambda k: (-lengths[k], k))
    return [order[b:b + batch_size] for b in range(0, len(order), batch_size)]


def _forward_params(model) -> frozenset[str]:
    return _forward_params_of(type(model))


@functools.cache
def _forward_params_of(cls: type) -> frozenset[str]:
    """The forward's parameter names, read once per model class (not once per batch)."""
    return frozenset(inspect.signature(cls.forward).parameters)


def _logits_at(model, keep: torch.Tensor, **inputs: Any) -> torch.Tensor:
    """Float32 logits at the ``True`` positions of ``keep`` (batch × length), row-major: ``(keep.sum(), vocab)``.

    The LM head runs on those positions only, where the model takes a boolean ``logits_to_keep``
    (transformers ≥ 5); otherwise on every position, then indexed.
    """
    if "logits_to_keep" in _forward_params(model) and _bool_logits_to_keep():
        logits = model(**inputs, logits_to_keep=keep).logits
        if logits.dim() == 2:
            return logits.float()
        return logits[keep].float()  # a model that ignores the mask form
    return model(**inputs).logits[keep].float()


def _row_sums(values: torch.Tensor, rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """Float64 sum of ``values`` per row id."""
    return torch.zeros(n_rows, dtype=torch.float64, device=values.device).index_add_(0, rows, values.double())


def _row_ids(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))


@functools.cache
def _bool_logits_to_keep() -> bool:
    try:
        from transformers.modeling_utils import slice_logits_to_keep  # noqa: F401 - boolean masks since 5.x
    except ImportError:
        return False
    return True


# --- document losses (perplexity) ---------------------------------------------------------------
def _windows(ids: list[int], prefix: int, max_length: int) -> list[tuple[list[int], int]]:
    """Split a document into ``(input+target tokens, n_scored)``: each window predicts ≤ max_length."""
    out = []
    for start in range(0, len(ids), max_length):
        ctx = prefix if start == 0 else ids[start - 1]
        chunk = ids[start:start + max_length]
        out.append(([ctx] + chunk, len(chunk)))
    return out


@torch.no_grad()
def document_losses(model, tokenizer, texts: Sequence[str], batch_size: int = 8, max_length: int = 1024,
                    max_tokens: int | None = None) -> list[tuple[float, int]]:
    """Per document ``(sum of token NLL in nats, number of scored tokens)``.

    Token-weighted: a group's loss is ``sum(nll) / sum(tokens)``. Batched with right padding
    (windows sorted by length, see :func:`_batches`), no attention mask (causal attention never
    sees the padding of a right-padded row), logits and NLL on the scored positions only, no
    gradients. ``max_tokens`` caps the tokens scored per document.
    Empty documents give ``(0.0, 0)``.
    """
    if max_length < 1:
        raise CptkitError(f"max_length={max_length}: must be ≥ 1")
    prefix = prefix_token_id(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else prefix
    device = _device(model)
    items: list[tuple[int, list[int], int]] = []  # (doc index, tokens, n_scored)
    for i, text in enumerate(texts):
        ids = encode_long(tokenizer, text)  # a long text in pieces: bounded memory, the same ids
        if max_tokens is not None:
            ids = ids[:max_tokens]
        for seq, n in _windows(ids, prefix, max_length):
            items.append((i, seq, n))
    sums = [0.0] * len(texts)
    counts = [0] * len(texts)
    for idx in _batches([len(seq) - 1 for _, seq, _ in items], batch_size):
        batch = [items[k] for k in idx]
        width = len(batch[0][1]) - 1
        inp = torch.full((len(batch), width), pad, dtype=torch.long)
        keep = torch.zeros((len(batch), width), dtype=torch.bool)
        for r, (_, seq, _) in enumerate(batch):
            inp[r, :len(seq) - 1] = torch.tensor(seq[:-1])
            keep[r, :len(seq) - 1] = True
        # right padding: causal attention keeps every real position exact without a mask
        logits = _logits_at(model, keep.to(device), input_ids=inp.to(device))
        target = torch.tensor([t for _, seq, _ in batch for t in seq[1:]], device=logits.device)
        nll = torch.logsumexp(logits, dim=-1) - logits.gather(1, target[:, None])[:, 0]
        per_row = _row_sums(nll, _row_ids([len(seq) - 1 for _, seq, _ in batch], logits.device), len(batch)).tolist()
        for r, (doc, _, n) in enumerate(batch):
            sums[doc] += per_row[r]
            counts[doc] += n
    return list(zip(sums, counts, strict=True))


def weighted_loss_se(losses: list[tuple[float, int]]) -> float:
    """Standard error of the token-weighted mean loss L = Σs_i / Σn_i over documents (s_i: summed
    NLL, n_i: tokens), documents as the sampling unit (ratio estimator, delta method):
    SE = sqrt(k/(k−1) · Σ(s_i − n_i·L)²) / Σn_i. NaN for fewer than two scored documents."""
    docs = [(s, n) for s, n in losses if n > 0]
    k, tokens = len(docs), sum(n for _, n in docs)
    if k < 2:
        return float("nan")
    mean = sum(s for s, _ in docs) / tokens
    return math.sqrt(k / (k - 1) * sum((s - n * mean) ** 2 for s, n in docs)) / tokens


def group_losses(model, tokenizer, records: Iterable[dict], group_by: str | None,
                 max_docs_per_group: int | None = None, batch_size: int = 8, max_length: int = 1024,
                 text_field: str = "text", max_tokens: int | None = None,
                 per_doc: bool = False) -> dict[str, dict[str, Any]]:
    """Token-weighted loss and perplexity per group: ``{group: {loss, se, ppl, tokens, docs}}``
    (``se``: :func:`weighted_loss_se`, the sampling error of ``loss`` over the group's documents);
    ``per_doc`` adds ``doc_nll``, each document's ``[summed NLL, tokens]`` in input order, for paired
    per-document differences between models scored on the same documents.

    ``group_by`` names a record field (``domain``, ``topic``, ``lang``, ``source``, any field);
    ``None`` or ``""`` puts every record in the group ``all``. The first ``max_docs_per_group``
    records of each group (input order) are scored. Groups are returned sorted by name.
    A record without the field or without text raises ``CptkitError`` naming its id.
    """
    texts: dict[str, list[str]] = {}
    for n, rec in enumerate(records):
        rid = rec.get("id", f"#{n}")
        if group_by:
            if group_by not in rec or rec[group_by] is None:
                raise CptkitError(f"record {rid}: no field {group_by!r} to group by")
            g = rec[group_by]
            g = "+".join(map(str, g)) if isinstance(g, list) else str(g)
        else:
            g = "all"
        text = rec.get(text_field)
        if not isinstance(text, str):
            raise CptkitError(f"record {rid}: no string field {text_field!r}")
        bucket = texts.setdefault(g, [])
        if max_docs_per_group is None or len(bucket) < max_docs_per_group:
            bucket.append(text)
    out: dict[str, dict[str, Any]] = {}
    for g in sorted(texts):
        losses = document_losses(model, tokenizer, texts[g], batch_size=batch_size, max_length=max_length,
                                 max_tokens=max_tokens)
        nll = sum(s for s, _ in losses)
        tokens = sum(c for _, c in losses)
        loss = nll / tokens if tokens else float("nan")
        out[g] = {"loss": loss, "se": weighted_loss_se(losses), "ppl": math.exp(loss) if tokens else float("nan"),
                  "tokens": tokens, "docs": len(texts[g])}
        if per_doc:
            out[g]["doc_nll"] = [[round(s, 6), n] for s, n in losses]
    return out


# --- lm-eval style requests ---------------------------------------------------------------------
def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Tokenize ``(context, continuation)`` exactly as lm-evaluation-harness does for causal LMs.

    Trailing whitespace of the context moves to the continuation; the whole string is encoded
    and split at the length of the encoded context (so merges across the boundary are kept);
    ``encode`` uses the tokenizer's default special tokens. An empty context is replaced by
    ``prefix_token_id``.
    """
    if context == "":
        cont = tokenizer.encode(continuation, add_special_tokens=False)
        pre = prefix_token_id(tokenizer)
        return ([pre], cont) if not cont or cont[0] != pre else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]

    def enc(s: str) -> list[int]:
        bos = tokenizer.bos_token
        kw = {"add_special_tokens": False} if bos and s.startswith(bos) else {}
        return tokenizer.encode(s, **kw)

    whole = enc(context + continuation)
    ctx = enc(context)
    return ctx, whole[len(ctx):]


@torch.inference_mode()
def loglikelihood(model, tokenizer, requests: Sequence[tuple[str, str]], batch_size: int = 8,
                  max_length: int | None = None) -> list[tuple[float, bool]]:
    """``(sum log p(continuation | context), continuation is the greedy decode)`` per request.

    Matches lm-eval's ``HFLM.loglikelihood``: tokenization by :func:`encode_pair`, inputs
    left-truncated to ``max_length + 1`` tokens, right padding, float32 log-softmax. Requests
    with the same context tokens (the choices of a multiple-choice item) run the context once
    and score their continuations from its KV cache (:func:`_score_shared`); a request alone
    with its context, or cut by ``max_length``, runs whole (:func:`_score_plain`). Both give
    the same numbers, up to float rounding (≤ 1e-4), and compute logits at the scored positions
    only. A context or continuation without tokens, or a continuation over ``max_length``
    tokens, raises ``CptkitError``.
    """
    max_length = max_length or model_max_length(model, tokenizer)
    encoded = [encode_pair(tokenizer, c, x) for c, x in requests]
    for (c, x), (ctx, cont) in zip(requests, encoded, strict=True):
        if not ctx:
            raise CptkitError(f"context {c!r} has no tokens")
        if not cont:
            raise CptkitError(f"continuation {x!r} after context ending {c[-40:]!r} has no tokens")
        if len(cont) > max_length:
            raise CptkitError(f"continuation {x[:40]!r} has {len(cont)} tokens, over max_length={max_length}")
    groups, alone = _context_groups(encoded, min(max_length, _attention_window(model)), _caches(model))
    res: list[tuple[float, bool]] = [(0.0, False)] * len(encoded)
    for i, r in zip(alone, _score_plain(model, [encoded[i] for i in alone], batch_size, max_length), strict=True):
        res[i] = r
    scored = _score_shared(model, [(encoded[m[0]][0], [encoded[i][1] for i in m]) for m in groups], batch_size)
    for members, rs in zip(groups, scored, strict=True):
        for i, r in zip(members, rs, strict=True):
            res[i] = r
    return res


def _context_groups(encoded: Sequence[tuple[list[int], list[int]]], limit: int,
                    share: bool = True) -> tuple[list[list[int]], list[int]]:
    """``(groups, alone)``: indices of requests with the same context tokens (≥ 2 of them, each
    context + continuation ≤ ``limit + 1`` tokens so nothing is truncated), and the indices of
    every other request."""
    by_ctx: dict[tuple[int, ...], list[int]] = {}
    alone: list[int] = []
    for i, (ctx, cont) in enumerate(encoded):
        if share and ctx and len(ctx) + len(cont) <= limit + 1:
            by_ctx.setdefault(tuple(ctx), []).append(i)
        else:
            alone.append(i)
    groups = [m for m in by_ctx.values() if len(m) > 1]
    alone += [m[0] for m in by_ctx.values() if len(m) == 1]
    return groups, sorted(alone)


def _caches(model) -> bool:
    """Whether the model's forward takes a KV cache (``cache``, or ``past_key_values`` before transformers 5)."""
    return bool({"cache", "past_key_values"} & _forward_params(model))


def _attention_window(model) -> int:
    """The model's sliding attention window, if any (a KV cache past it drops keys): an upper bound
    on the tokens :func:`_score_shared` may cache; a large number otherwise."""
    cfg = getattr(model, "config", None)
    cfg = getattr(cfg, "text_config", None) or cfg
    window = getattr(cfg, "sliding_window", None)
    return int(window) if isinstance(window, int) and window > 0 else TOKENIZER_INFINITY


def _score_plain(model, pairs: Sequence[tuple[list[int], list[int]]], batch_size: int,
                 max_length: int) -> list[tuple[float, bool]]:
    """Score each ``(context, continuation)`` on its own, lm-eval style: the last ``max_length``
    tokens of context + continuation (without the last token) in, right padding, no mask."""
    device = _device(model)
    seqs = [(ctx + cont)[-(max_length + 1):][:-1] for ctx, cont in pairs]
    res: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
    for idx in _batches([len(s) for s in seqs], batch_size):
        inp = torch.zeros((len(idx), len(seqs[idx[0]])), dtype=torch.long)
        keep = torch.zeros(inp.shape, dtype=torch.bool)
        for r, i in enumerate(idx):
            n = len(seqs[i])
            inp[r, :n] = torch.tensor(seqs[i])
            keep[r, n - len(pairs[i][1]):n] = True
        logits = _logits_at(model, keep.to(device), input_ids=inp.to(device))
        for i, r in zip(idx, _continuation_scores(logits, [pairs[i][1] for i in idx]), strict=True):
            res[i] = r
    return res


def _score_shared(model, groups: Sequence[tuple[list[int], list[list[int]]]],
                  batch_size: int) -> list[list[tuple[float, bool]]]:
    """Score ``(context, [continuations])`` groups, the context run once per group.

    Batches of ``batch_size`` contexts run whole (right-padded, no mask) into a KV cache; the
    logits at each context's last token score the first token of its continuations. Then
    batches of ``batch_size`` continuations run ``continuation[:-1]`` on their group's rows of
    the cache (:func:`_score_rest`). Nothing is truncated here: :func:`_context_groups` sends
    those requests to :func:`_score_plain`."""
    out: list[list[tuple[float, bool]]] = [[] for _ in groups]
    for gidx in _batches([len(groups[g][0]) for g in range(len(groups))], batch_size):
        batch = [groups[g] for g in gidx]
        cache, last = _run_contexts(model, [ctx for ctx, _ in batch])
        members = [(r, j) for r, (_, conts) in enumerate(batch) for j in range(len(conts))]
        first = _continuation_scores(last[torch.tensor([r for r, _ in members], device=last.device)],
                                     [batch[r][1][j][:1] for r, j in members])
        rest = _score_rest(model, cache, batch, [m for m in members if len(batch[m[0]][1][m[1]]) > 1], batch_size)
        for (r, j), (ll, greedy) in zip(members, first, strict=True):
            more, more_greedy = rest.get((r, j), (0.0, True))
            out[gidx[r]].append((ll + more, greedy and more_greedy))
    return out


def _run_contexts(model, contexts: Sequence[list[int]]):
    """Run ``contexts`` (right-padded, no mask): ``(KV cache, float32 logits at each context's last token)``."""
    from transformers import DynamicCache  # deferred: heavy

    device = _device(model)
    inp = torch.zeros((len(contexts), max(len(c) for c in contexts)), dtype=torch.long)
    keep = torch.zeros(inp.shape, dtype=torch.bool)
    for r, ctx in enumerate(contexts):
        inp[r, :len(ctx)] = torch.tensor(ctx)
        keep[r, len(ctx) - 1] = True
    cache = DynamicCache()
    logits = _logits_at(model, keep.to(device), input_ids=inp.to(device), use_cache=True,
                        **{_cache_kwarg(model): cache})
    return cache, logits


def _score_rest(model, cache, batch: Sequence[tuple[list[int], list[list[int]]]], members: Sequence[tuple[int, int]],
                batch_size: int) -> dict[tuple[int, int], tuple[float, bool]]:
    """``{(row, j): (sum log p, all greedy)}`` of the tokens after the first of continuation ``j`` of
    context ``row`` of ``batch``, from ``cache`` (that batch's contexts): ``continuation[:-1]`` in,
    attention mask over the row's context then the continuation, positions after the context."""
    device = _device(model)
    ctx_len = torch.tensor([len(ctx) for ctx, _ in batch], device=device)
    ctx_mask = torch.arange(int(ctx_len.max()), device=device)[None, :] < ctx_len[:, None]
    out: dict[tuple[int, int], tuple[float, bool]] = {}
    for midx in _batches([len(batch[r][1][j]) - 1 for r, j in members], batch_size):
        chunk = [members[m] for m in midx]
        conts = [batch[r][1][j] for r, j in chunk]
        rows = torch.tensor([r for r, _ in chunk], device=device)
        inp = torch.zeros((len(chunk), len(conts[0]) - 1), dtype=torch.long)
        keep = torch.zeros(inp.shape, dtype=torch.bool)
        for k, cont in enumerate(conts):
            inp[k, :len(cont) - 1] = torch.tensor(cont[:-1])
            keep[k, :len(cont) - 1] = True
        keep = keep.to(device)
        logits = _logits_at(model, keep, input_ids=inp.to(device), use_cache=True,
                            attention_mask=torch.cat([ctx_mask[rows], keep], dim=1).long(),
                            position_ids=ctx_len[rows][:, None] + torch.arange(inp.shape[1], device=device),
                            **{_cache_kwarg(model): _cache_rows(cache, rows)})
        out.update(zip(chunk, _continuation_scores(logits, [c[1:] for c in conts]), strict=True))
    return out


def _cache_kwarg(model) -> str:
    """The forward's name for the KV cache: ``cache`` (transformers ≥ 5) or ``past_key_values``."""
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def _cache_rows(cache, rows: torch.Tensor):
    """A new cache holding ``rows`` of ``cache`` (a row may repeat); ``cache`` is left as it was."""
    new = copy.copy(cache)
    if hasattr(cache, "layers"):  # transformers ≥ 4.56: one object per layer
        new.layers = [copy.copy(layer) for layer in cache.layers]
    else:
        new.key_cache, new.value_cache = list(cache.key_cache), list(cache.value_cache)
    new.batch_select_indices(rows)
    return new


def _continuation_scores(logits: torch.Tensor, conts: Sequence[list[int]]) -> list[tuple[float, bool]]:
    """``(sum log p, all greedy)`` per continuation from the float32 logits of its tokens' positions
    (rows of ``logits`` in the order of ``conts``' tokens)."""
    target = torch.tensor([t for c in conts for t in c], device=logits.device)
    logp = F.log_softmax(logits, dim=-1)
    rows = _row_ids([len(c) for c in conts], logits.device)
    lls = _row_sums(logp.gather(1, target[:, None])[:, 0], rows, len(conts)).tolist()
    misses = _row_sums((logp.argmax(dim=-1) != target).double(), rows, len(conts)).tolist()
    return [(ll, miss == 0) for ll, miss in zip(lls, misses, strict=True)]


@torch.no_grad()
def generate_until(model, tokenizer, contexts: Sequence[str], until: Sequence[str] = (), max_gen_toks: int = 256,
                   batch_size: int = 4, max_length: int | None = None, temperature: float = 0.0,
                   top_p: float = 1.0, seed: int = 0) -> list[str]:
    """Greedy (``temperature == 0``) or sampled continuation of each context, cut at the first of ``until`` (and at EOS).

    Contexts are left-padded and left-truncated to ``max_length - max_gen_toks`` tokens, as
    lm-eval's ``generate_until`` does. Sampling draws from ``torch.manual_seed(seed + batch index)``.
    """
    max_length = max_length or model_max_length(model, tokenizer)
    device = _device(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else prefix_token_id(tokenizer)
    stops = [s for s in until if s]
    eos_text = tokenizer.decode([tokenizer.eos_token_id]) if tokenizer.eos_token_id is not None else None
    if eos_text and eos_text not in stops:
        stops.append(eos_text)
    keep = max(max_length - max_gen_toks, 1)
    out: list[str] = [""] * len(contexts)
    order = sorted(range(len(contexts)), key=lambda i: (-len(contexts[i]), i))
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        enc = [tokenizer.encode(contexts[i])[-keep:] for i in idx]
        width = max(len(e) for e in enc)
        inp = torch.full((len(enc), width), pad, dtype=torch.long)
        mask = torch.zeros((len(enc), width), dtype=torch.long)
        for r, e in enumerate(enc):
            inp[r, width - len(e):] = torch.tensor(e)
            mask[r, width - len(e):] = 1
        sample = {"do_sample": False}
        if temperature > 0:
            torch.manual_seed(seed + b)
            sample = {"do_sample": True, "temperature": float(temperature), "top_p": float(top_p), "top_k": 0}
        gen = model.generate(input_ids=inp.to(device), attention_mask=mask.to(device), **sample,
                             max_new_tokens=max_gen_toks, pad_token_id=pad, stop_strings=stops or None,
                             tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id)
        for r, i in enumerate(idx):
            # special tokens (a generated <pad>, padding after EOS) are dropped, as lm-eval's tok_decode does
            text = tokenizer.decode(gen[r, width:].tolist(), skip_special_tokens=True)
            for s in stops:
                if s in text:
                    text = text.split(s)[0]
            out[i] = text
    return out
