"""The preference margin: how much more a model believes a held-out sentence than its corrupted copy.

``cptkit margin --model M --pairs P --out DIR [--meta ratio=0.3 --meta seed=1]``

``P`` holds pairs ``{id, clean, corrupted, types}`` (:mod:`cptkit.eval.pairs`: held-out domain
sentences and the same sentences after ``cptkit corrupt``). Each pair's margin is
``log p(clean) − log p(corrupted)`` in nats, each sentence scored alone by
:func:`cptkit.models.scoring.document_losses` (first token predicted from BOS, every token once).
``DIR/_margin.json`` holds ``mean_margin``, its standard error over pairs and every pair's margin;
``DIR/_manifest.json`` the run's config (the model, the pairs' sha256, ``--meta`` labels such as a
claim's axis and seed) and ``DIR/_SUCCESS`` marks it finished, as a step's output would.

**Summed, not averaged, log-probabilities.** The log-probability of a sentence is the sum of its
tokens' log-probabilities: the model's probability of the whole string, the thing a preference
between two strings is about. A per-token mean is not a probability of either string: it would favour
a corruption that spells its change with more, individually predictable tokens (a rare word in
pieces) and penalise one that uses fewer.

**Unequal lengths.** A replacement can change the token count ("equal" → "unequal", one noun for
another). Those pairs stay in ``mean_margin``: the string that needs more tokens pays for them, which is
part of its probability. They are counted (``unequal_length``), and ``equal_length`` gives the
mean margin over the pairs whose two sentences have the same number of tokens, so a length effect
can be told apart. Models compared on the same pairs share every pair's length difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cptkit import __version__
from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.output import write_manifest, writing
from cptkit.core.records import read_jsonl
from cptkit.core.shards import atomic_write_json
from cptkit.eval.stats import mean_se

MARGIN = "_margin.json"


def read_pairs(path: Path) -> list[dict[str, Any]]:
    """The pairs of ``path`` (JSONL), each checked: a string ``clean`` and ``corrupted`` that differ."""
    if not path.is_file():
        raise CptkitError(f"{path}: no such file")
    pairs = read_jsonl(path)
    if not pairs:
        raise CptkitError(f"{path}: no pairs")
    for n, p in enumerate(pairs, 1):
        clean, bad = p.get("clean"), p.get("corrupted")
        if not isinstance(clean, str) or not isinstance(bad, str) or not clean.strip() or not bad.strip():
            raise CptkitError(f"{path}:{n}: a pair needs non-empty string fields 'clean' and 'corrupted'")
        if clean == bad:
            raise CptkitError(f"{path}:{n}: 'clean' and 'corrupted' are the same text: not a pair")
    return pairs


def summary(margins: Sequence[float]) -> dict[str, Any]:
    """``{mean, se, n}`` of some margins (``se`` NaN for one, everything NaN for none)."""
    if not margins:
        return {"mean": math.nan, "se": math.nan, "n": 0}
    mean, se = mean_se(list(margins))
    return {"mean": mean, "se": se, "n": len(margins)}


def pair_margins(model: Any, tokenizer: Any, pairs: Sequence[dict[str, Any]], batch_size: int = 16) -> list[dict[str, Any]]:
    """Per pair: ``logp_clean``, ``logp_corrupted`` (summed token log-probabilities, nats), their token
    counts and ``margin`` = ``logp_clean − logp_corrupted``."""
    from cptkit.models.scoring import document_losses  # deferred: torch

    texts = [t for p in pairs for t in (p["clean"], p["corrupted"])]
    scored = document_losses(model, tokenizer, texts, batch_size=batch_size, max_length=1024)
    out = []
    for i, p in enumerate(pairs):
        (nll_c, n_c), (nll_x, n_x) = scored[2 * i], scored[2 * i + 1]
        if n_c == 0 or n_x == 0:
            raise CptkitError(f"pair {p.get('id', i)}: a sentence has no tokens")
        out.append({"id": p.get("id", str(i)), "types": p.get("types", []), "margin": nll_x - nll_c,
                    "logp_clean": -nll_c, "logp_corrupted": -nll_x, "tokens_clean": n_c, "tokens_corrupted": n_x})
    return out


def margin_report(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``_margin.json``'s numbers from :func:`pair_margins`' rows: the mean margin and its SE over all
    pairs, over the equal-length pairs, and per corruption type a pair holds."""
    allm = summary([r["margin"] for r in rows])
    equal = summary([r["margin"] for r in rows if r["tokens_clean"] == r["tokens_corrupted"]])
    types = sorted({t for r in rows for t in r["types"]})
    return {"mean_margin": allm["mean"], "se": allm["se"], "pairs": allm["n"],
            "unequal_length": allm["n"] - equal["n"], "equal_length": equal,
            "by_type": {t: summary([r["margin"] for r in rows if t in r["types"]]) for t in types},
            "per_pair": list(rows)}


def parse_meta(items: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` labels, each value read as YAML (``0.3`` a number, ``rp0.2`` a string)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or key in ("model", "pairs", "pairs_sha256", "batch_size"):
            raise CptkitError(f"--meta {item!r}: give KEY=VALUE with a key other than the run's own settings")
        out[key] = yaml.safe_load(value)
    return out


def check_seed(model: str, meta: dict[str, Any]) -> None:
    """A ``seed`` label must be the seed the model was trained with, when its run says so."""
    man = Path(model).parent / "_manifest.json"
    if "seed" not in meta or not man.is_file():
        return
    try:
        trained = json.loads(man.read_text())["config"]["seed"]
    except (KeyError, TypeError, ValueError):
        return
    if trained != meta["seed"]:
        raise CptkitError(f"--meta seed={meta['seed']}: the model {model} was trained with seed={trained}")


def run(model_spec: str, pairs_path: Path, out: Path, meta: dict[str, Any], batch_size: int = 16,
        device: str = "auto", threads: int = 0) -> dict[str, Any]:
    """Score every pair with the model, write ``_margin.json``, ``_manifest.json`` and ``_SUCCESS``."""
    import torch  # deferred: --help without torch

    from cptkit.models.lm import load_causal_lm, load_tokenizer  # deferred: torch

    started = time.time()
    pairs = read_pairs(pairs_path)
    check_seed(model_spec, meta)
    if threads:
        torch.set_num_threads(threads)
    tok = load_tokenizer(model_spec)
    model = load_causal_lm(model_spec, device=device)
    report = margin_report(pair_margins(model, tok, pairs, batch_size))
    with writing(out):  # _SUCCESS last
        atomic_write_json(out / MARGIN, report, indent=1)
        config = {"model": model_spec, "pairs": str(pairs_path),
                  "pairs_sha256": hashlib.sha256(pairs_path.read_bytes()).hexdigest(), "batch_size": batch_size, **meta}
        finished = time.time()
        write_manifest(out, {
            "step": "margin", "cptkit": __version__, "config": config,
            "extra": {k: v for k, v in report.items() if k != "per_pair"},
            "timings": {"started": started, "finished": finished, "seconds_last_run": finished - started}})
    return report


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit margin", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the model (HF folder, .gguf or smollm2)")
    p.add_argument("--pairs", type=Path, required=True, help="JSONL of {id, clean, corrupted} (cptkit.eval.pairs)")
    p.add_argument("--out", type=Path, required=True, help="the output folder (_margin.json, _manifest.json)")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                   help="a label recorded in the manifest's config (a claim's axis and seed: ratio=0.3, seed=1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto", help="auto (the GPU when there is one) | cpu | cuda")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args(argv)
    if a.batch_size < 1:
        raise CptkitError("--batch-size must be >= 1")
    rep = run(a.model, a.pairs, a.out, parse_meta(a.meta), a.batch_size, a.device, a.threads)
    print(f"{a.out}: mean margin {rep['mean_margin']:+.4f} ± {rep['se']:.4f} nats over {rep['pairs']} pairs "
          f"({rep['unequal_length']} of unequal length)", file=sys.stderr)
    return 0
