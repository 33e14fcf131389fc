"""Self samples: texts a base model writes from its BOS token alone, at temperature 1, for replay
(``mix.replay.source=self``; docs/forgetting.md).

Training on samples of the base approximates KL(base ‖ new) without the base's pretraining data
(Bansal & Sanghavi 2025, arXiv 2505.13811). :func:`sample_from_bos` is the forgetting probe's
sampler (:mod:`cptkit.eval.probe`: ancestral sampling from BOS, the first token never EOS, one
torch seed per batch of 16) in a loop of its own that can also keep, for every position of a
sample (its tokens and the EOS after them), the base's top-k next-token log-probabilities at
temperature 1: the targets of teacher-free distillation (``train.distill``). Its batch seeds come
from a namespace of their own (:func:`batch_seed`: sha256 of ``("self-replay", seed, start)``), so
at any seed its samples are not the probe's.

:func:`cached_samples` generates once per (model content, seed, count, settings, versions) into
``$CPTKIT_CACHE/self-replay/KEY.jsonl.gz``, as B0 is cached. Records: ``{id, text, domain: "replay",
token_ids}``, plus ``topk_ids`` / ``topk_logprobs`` (one row per token and one for the EOS) with
``topk > 0``.

``cptkit self-samples --model M --out FILE [--docs N --max-tokens T --seed S --topk K]``
writes the same records to a file of one's own (``mix.replay.source=FILE``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.fingerprint import cache_path, content_hash
from cptkit.core.progress import log
from cptkit.core.shards import atomic_write_bytes

NAMESPACE = "self-replay"  # the probe seeds batch b with seed * 1_000_003 + b (eval/probe.py); these are hashed
BATCH = 16  # rows sampled together: part of what a sample is (its batch shares one torch seed)
FORMAT = 1  # bump when the sampler's output changes (a cache key part)


def batch_seed(seed: int, start: int) -> int:
    """The torch seed of the batch of samples that begins at sample ``start``."""
    blob = json.dumps([NAMESPACE, int(seed), int(start)]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") & (2**63 - 1)


def sample_from_bos(model: Any, tokenizer: Any, docs: int, max_tokens: int, seed: int, topk: int = 0,
                    temperature: float = 1.0, batch: int = BATCH, seeds: Any = batch_seed) -> list[dict[str, Any]]:
    """``docs`` samples of up to ``max_tokens`` tokens each, drawn from BOS alone at ``temperature``
    (no top-k or top-p; the first token is never EOS), every batch from its own torch seed
    ``seeds(seed, start)`` (the global RNG is restored afterwards).

    Each is ``{"token_ids": [...], "text": str}`` (the EOS that ended it not included) and, with
    ``topk > 0``, ``topk_ids`` / ``topk_logprobs``: ``len(token_ids) + 1`` rows of the ``topk`` most
    likely next tokens and their log-probabilities at temperature 1, the row ``i`` being the base's
    distribution over token ``i`` given BOS and the tokens before it (the last row: the EOS's)."""
    import torch  # deferred: --help without torch

    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else bos
    if bos is None:
        raise CptkitError("the tokenizer has neither a BOS nor an EOS token to start sampling from")
    params = inspect.signature(type(model).forward).parameters
    kw = "cache" if "cache" in params else "past_key_values"  # the KV cache's name (transformers ≥ 5: cache)
    device = next(model.parameters()).device
    out: list[dict[str, Any]] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for start in range(0, docs, batch):
            n = min(batch, docs - start)
            torch.manual_seed(seeds(seed, start))
            ids = torch.full((n, 1), bos, dtype=torch.long, device=device)
            past = None
            alive = [True] * n
            toks: list[list[int]] = [[] for _ in range(n)]
            k_ids: list[list[list[int]]] = [[] for _ in range(n)]
            k_lp: list[list[list[float]]] = [[] for _ in range(n)]
            for step in range(max_tokens + 1):
                o = model(input_ids=ids, use_cache=True, **({kw: past} if past is not None else {}))
                past = getattr(o, kw if kw == "cache" else "past_key_values")
                logits = o.logits[:, -1, :].float().cpu()
                if topk:
                    lp, ix = torch.log_softmax(logits, dim=-1).topk(min(topk, logits.shape[-1]), dim=-1)
                    for r in range(n):
                        if alive[r]:
                            k_ids[r].append(ix[r].tolist())
                            k_lp[r].append(lp[r].tolist())
                if step == max_tokens:
                    break
                scores = logits / temperature
                if step == 0:
                    scores[:, eos] = float("-inf")  # min_new_tokens=1, as the probe samples
                nxt = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
                for r in range(n):
                    if alive[r]:
                        t = int(nxt[r])
                        if t == eos:
                            alive[r] = False
                        else:
                            toks[r].append(t)
                if not any(alive):
                    break
                nxt = torch.where(torch.tensor(alive), nxt, torch.full_like(nxt, eos))
                ids = nxt.view(n, 1).to(device)
            for r in range(n):
                rec: dict[str, Any] = {"token_ids": toks[r],
                                       "text": tokenizer.decode(toks[r], skip_special_tokens=True).strip()}
                if topk:
                    rec["topk_ids"], rec["topk_logprobs"] = k_ids[r], k_lp[r]
                out.append(rec)
    return out


def replay_records(samples: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Records of ``samples`` for build-mix (empty texts dropped; ids name the seed and the index)."""
    return [{"id": f"self-{seed}-{i:06d}", "domain": "replay", **s} for i, s in enumerate(samples) if s["text"]]


def samples_key(model_spec: str, seed: int, docs: int, max_tokens: int, topk: int, temperature: float) -> str:
    """The cache key of a set of self samples: the base's content, the seed, the count, the sampling
    settings, the batch and the versions of what samples (cptkit's sampler format, torch, transformers)."""
    import torch  # deferred: --help without torch
    import transformers  # deferred: heavy

    from cptkit.models.lm import spec_file  # deferred: torch

    h = content_hash(spec_file(model_spec) or model_spec)
    if h is None:
        raise CptkitError(f"mix.replay.self.model={model_spec}: no such model")
    parts = [h[0], int(seed), int(docs), int(max_tokens), int(topk), float(temperature), BATCH, FORMAT,
             torch.__version__, transformers.__version__]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def write_records(path: Path, recs: list[dict[str, Any]]) -> bytes:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()
    atomic_write_bytes(path, gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return data


def generate(model_spec: str, docs: int, max_tokens: int, seed: int, topk: int, temperature: float,
             trust_remote_code: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Load the base, sample; the records and what it cost (tokens, seconds)."""
    import time

    from cptkit.models.lm import load_causal_lm, load_tokenizer  # deferred: torch

    tok = load_tokenizer(model_spec, trust_remote_code)
    model = load_causal_lm(model_spec, device="auto", trust_remote_code=trust_remote_code)
    t0 = time.perf_counter()
    samples = sample_from_bos(model, tok, docs, max_tokens, seed, topk, temperature)
    secs = time.perf_counter() - t0
    n_tok = sum(len(s["token_ids"]) for s in samples)
    return replay_records(samples, seed), {"tokens": n_tok, "seconds": secs, "tokens_per_s": n_tok / secs if secs else 0}


def cached_samples(model_spec: str, docs: int, max_tokens: int, seed: int, topk: int = 0,
                   temperature: float = 1.0, trust_remote_code: bool = False) -> Path:
    """The file of self samples for these settings, generated into the cache unless it is there."""
    key = samples_key(model_spec, seed, docs, max_tokens, topk, temperature)
    path = cache_path().parent / "self-replay" / f"{key}.jsonl.gz"
    if path.exists():
        log.info("self samples %s: cached at %s", key, path)
        return path
    log.info("self samples %s: sampling %d documents of up to %d tokens from %s", key, docs, max_tokens, model_spec)
    recs, cost = generate(model_spec, docs, max_tokens, seed, topk, temperature, trust_remote_code)
    if not recs:
        raise CptkitError(f"mix.replay.self: {model_spec} wrote no non-empty sample in {docs} tries")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_records(path, recs)
    log.info("self samples %s: %d documents, %d tokens in %.1f s (%.1f tokens/s)", key, len(recs), cost["tokens"],
             cost["seconds"], cost["tokens_per_s"])
    return path


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit self-samples", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the base (HF folder, .gguf or smollm2)")
    p.add_argument("--out", type=Path, required=True, help="the JSONL(.gz) file to write")
    p.add_argument("--docs", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--topk", type=int, default=0, help="keep each position's top-k log-probs (0: none)")
    p.add_argument("--temperature", type=float, default=1.0)
    a = p.parse_args(argv)
    if a.docs < 1 or a.max_tokens < 1 or a.topk < 0 or not a.temperature > 0:
        raise CptkitError("--docs and --max-tokens must be positive, --topk ≥ 0 and --temperature > 0")
    recs, cost = generate(a.model, a.docs, a.max_tokens, a.seed, a.topk, a.temperature)
    data = write_records(a.out, recs)
    print(f"{a.out}: {len(recs)} self samples from {a.model} (seed {a.seed}, {cost['tokens']} tokens, "
          f"{cost['tokens_per_s']:.1f} tokens/s, sha256 {hashlib.sha256(data).hexdigest()[:12]})", file=sys.stderr)
    return 0
