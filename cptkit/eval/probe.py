"""The forgetting probe: texts a model writes itself, so that its own loss on them is the reference.

``cptkit probe --model data/xp/b0/model --out data/xp/probe.jsonl --docs 64 --tokens 128``
samples ``--docs`` documents of ``--tokens`` tokens from the model by ancestral sampling (temperature
1, no top-k or top-p: the model's own distribution), each started from its BOS token alone, in
batches, with every random draw from ``--seed``. Records: ``{id, text, domain: "probe", lang}``.

Why it measures forgetting where learning cannot help: a continued model can only lower its loss on
these texts by moving *toward* the distribution that wrote them, which is where it started; any
training on other text moves it away or leaves it. So ``arm − B0`` on the probe is ≥ 0 up to
sampling noise, and a rise is forgetting, not a change of format or domain.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.shards import atomic_write_bytes
from cptkit.models.self_samples import sample_from_bos


def probe_seed(seed: int, start: int) -> int:
    """The torch seed of the probe's batch that begins at sample ``start`` (self replay hashes its own:
    :func:`cptkit.models.self_samples.batch_seed`, so the two never share a draw)."""
    return seed * 1_000_003 + start


def sample_texts(model: Any, tokenizer: Any, docs: int, tokens: int, seed: int, batch: int = 16) -> list[str]:
    """``docs`` texts of up to ``tokens`` new tokens each, sampled at temperature 1 from BOS (the one
    sampler, :func:`cptkit.models.self_samples.sample_from_bos`, with the probe's batch seeds)."""
    return [s["text"] for s in sample_from_bos(model, tokenizer, docs, tokens, seed, batch=batch, seeds=probe_seed)]


def probe_records(texts: list[str], lang: str = "en") -> list[dict[str, str]]:
    """Records for ``evaluate --in`` (``eval.ppl.group_by=domain``); empty samples are dropped."""
    return [{"id": f"probe-{i:04d}", "text": t, "domain": "probe", "lang": lang} for i, t in enumerate(texts) if t]


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit probe", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the model that writes the probe (HF folder, .gguf or smollm2)")
    p.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    p.add_argument("--docs", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    if a.docs < 1 or a.tokens < 1:
        raise CptkitError("--docs and --tokens must be positive")
    import torch  # deferred: --help without torch

    from cptkit.models.lm import (  # deferred: torch
        load_causal_lm,
        load_tokenizer,
    )

    if a.threads:
        torch.set_num_threads(a.threads)
    tok = load_tokenizer(a.model)
    model = load_causal_lm(a.model)
    recs = probe_records(sample_texts(model, tok, a.docs, a.tokens, a.seed))
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode()
    atomic_write_bytes(a.out, data)
    print(f"{a.out}: {len(recs)} probe documents from {a.model} (seed {a.seed}, sha256 "
          f"{hashlib.sha256(data).hexdigest()[:12]})", file=sys.stderr)
    return 0
