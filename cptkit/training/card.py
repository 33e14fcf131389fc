"""The model card of a trained model (``OUT/model/README.md``): YAML front matter the Hugging Face
Hub reads (``base_model``, ``library_name``, ``tags``; ``huggingface_hub.ModelCard.load`` parses it)
and a body with the data stream (path, sha256, per-domain tokens, as ``_manifest.json`` records them
under ``data``), the final held-out evaluation and the cptkit config. Nothing in it depends on the
clock or the machine, so a rerun writes the same card."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from cptkit import __version__
from cptkit.core.fingerprint import fingerprint_path
from cptkit.core.records import read_jsonl
from cptkit.core.shards import atomic_write_bytes

CARD = "README.md"
# the run's numbers the card shows (the manifest's ``extra`` keys that do not depend on the clock)
RUN_ROWS = ("steps", "tokens", "final loss", "mixture", "world size", "engine", "optimizer", "zero stage",
            "precision", "gradient checkpointing", "kernels", "compile")
TAGS = ["cptkit", "continual-pretraining", "text-generation"]
# what a model spec names on the Hub, where cptkit knows it (the embedded GGUF is a quantized copy of this model)
HUB_IDS = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def stream_record(path: str | Path, meta: dict[str, Any]) -> dict[str, Any]:
    """What a run trained on: the build-mix stream's path, size and sha256, sequence length, tokenizer,
    budget, and per domain its documents, tokens, sequences and the tokens the plan draws from it."""
    fp = fingerprint_path(path)
    return {"stream": str(Path(path).resolve()), "sha256": fp.get("sha256"), "bytes": fp.get("size"),
            "seq_len": int(meta["seq_len"]), "tokenizer": meta.get("tokenizer"),
            "budget_tokens": meta.get("budget_tokens"), "total_sequences": meta.get("total_sequences"),
            "domains": {d["name"]: {k: d.get(k) for k in ("docs", "tokens", "sequences", "planned_tokens")}
                        for d in meta["domains"]},
            "stages": [{"name": s["name"], "weights": s.get("weights"), "tokens": s.get("tokens")}
                       for s in meta.get("stages") or []]}


def base_model(model: Any) -> str | None:
    """The card's ``base_model``: the Hub id of an embedded model, ``model.path`` as given for any other
    pretrained model, None for a model trained from scratch (``model=tiny_llama``)."""
    if getattr(model, "name", "hf") != "hf" or not getattr(model, "path", None):
        return None
    return HUB_IDS.get(str(model.path), str(model.path))


def eval_points(metrics_file: Path) -> list[dict[str, Any]]:
    """The run's held-out evaluations, in order, from ``metrics.jsonl``: the ``train.eval_every`` points
    (before the first step, every N steps, after the last) and a dynamic mixture's measurements; each
    with ``eval_tokens``, the training tokens seen when it was measured."""
    if not metrics_file.exists():
        return []
    rows = read_jsonl(metrics_file)
    return [r for r in rows if r.get("eval_loss")]


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MARKDOWN = re.compile(r"([\\`*_\[\]|~#])")  # marks that act inside a line (a name never starts one)


def _visible(text: Any) -> str:
    """``text`` on one line: a control character (a newline) as its escape (``\\n``, ``\\x1b``)."""
    def esc(m: re.Match) -> str:
        c = m.group(0)
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c, f"\\x{ord(c):02x}")

    return _CONTROL.sub(esc, str(text))


def md(text: Any) -> str:
    """``text`` (a name from the run: a domain, a stage, the output folder) as literal Markdown text on
    one line: HTML (``<script>``) shown, not run; Markdown's marks (a code fence, ``|`` in a table,
    ``#``) escaped; control characters as their escapes."""
    return _MARKDOWN.sub(r"\\\1", html.escape(_visible(text), quote=False))


def code(text: Any) -> str:
    """``text`` as a Markdown code span on one line, whatever backticks it holds (CommonMark: a fence
    longer than its longest run of them)."""
    text = _visible(text)
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def fenced(text: str, info: str = "") -> str:
    """``text`` as a fenced code block that no line of it closes (CommonMark: a fence longer than any
    run of backticks it holds)."""
    fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}{info}\n{text}{'' if text.endswith(chr(10)) else chr(10)}{fence}\n"


def _num(v: float | None) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"


def _when(point: dict[str, Any]) -> str:
    tokens = int(point.get("eval_tokens", point.get("tokens", 0)))
    return "at the start" if tokens == 0 else f"after {tokens:,} tokens"


def eval_table(points: list[dict[str, Any]]) -> str:
    """Markdown tables of the last evaluation point (held-out loss per domain, and few-shot task scores),
    beside the first one when there are two (before/after continued pre-training: the forgetting)."""
    if not points:
        return ("No held-out evaluation ran during training (`train.eval_every=0` and a static mixture). "
                "Score the model with `cptkit evaluate --model PATH/model`.\n")
    first, last = points[0], points[-1]
    cols = [first, last] if len(points) > 1 else [last]
    text = ("| held-out domain | " + " | ".join(f"loss {_when(p)}" for p in cols) + f" | ppl {_when(last)} |\n"
            + "|---|" + "---:|" * (len(cols) + 1) + "\n")
    for d, v in last["eval_loss"].items():
        ppl = math.exp(v) if v is not None and v < 700 else float("nan")
        text += f"| {md(d)} | " + " | ".join(_num(p["eval_loss"].get(d)) for p in cols) + f" | {_num(ppl)} |\n"
    if last.get("eval_tasks"):
        text += ("\n| task | " + " | ".join(f"score {_when(p)}" for p in cols) + " |\n|---|"
                 + "---:|" * len(cols) + "\n")
        text += "".join(f"| {md(t)} | " + " | ".join(_num((p.get("eval_tasks") or {}).get(t)) for p in cols) + " |\n"
                        for t in last["eval_tasks"])
    return text + ("\nLoss: mean negative log-likelihood per token (nats) on the stream's held-out documents; "
                   "task scores: acc_norm or exact_match (`train.eval_tasks`).\n")


def data_table(data: dict[str, Any]) -> str:
    rows = "".join(f"| {md(d)} | {v.get('docs')} | {v.get('tokens')} | {v.get('planned_tokens')} |\n"
                   for d, v in data["domains"].items())
    stages = "; ".join(f"{md(s['name'])}: {md(json.dumps(s['weights'], ensure_ascii=False))}" for s in data["stages"])
    return (f"Stream {code(data['stream'])} (`cptkit build-mix` output; sha256 `{data['sha256']}`, {data['bytes']} bytes), "
            f"sequences of {data['seq_len']} tokens, tokenizer {code(data['tokenizer'])}. Mixture stages: {stages}.\n\n"
            "| domain | documents | tokens in the stream | tokens in the stream's plan |\n|---|---:|---:|---:|\n" + rows)


def model_card(config: dict[str, Any], data: dict[str, Any], run: dict[str, Any], points: list[dict[str, Any]],
               base: str | None) -> str:
    """The card's text: front matter, then data, training, evaluation and config sections."""
    meta: dict[str, Any] = {"base_model": base} if base else {}
    meta |= {"library_name": "transformers", "pipeline_tag": "text-generation", "tags": TAGS}
    origin = (f"Continued pre-training of {code(base)}" if base else
              f"A {code(config.get('model', {}).get('name'))} model trained from random initialisation")
    training = "".join(f"| {md(k)} | {md(v)} |\n" for k, v in run.items())
    config_yaml = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    return ("---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n\n"
            f"# {md(Path(str(config.get('io', {}).get('output') or 'model')).name)}\n\n"
            f"{origin} with cptkit {__version__} (`cptkit train`). "
            "Load it with `transformers.AutoModelForCausalLM.from_pretrained(\"PATH/model\")`; the run's "
            "`_manifest.json`, `metrics.jsonl` and plots are one folder up.\n\n"
            f"## Training data\n\n{data_table(data)}\n"
            f"## Training\n\n| | |\n|---|---|\n{training}\n"
            f"## Evaluation\n\n{eval_table(points)}\n"
            "## cptkit config\n\nThe resolved config of the run (`cptkit train ...`; rerun it with the same "
            "stream to reproduce this model):\n\n"
            f"{fenced(config_yaml, 'yaml')}")


def write_model_card(model_dir: Path, config: dict[str, Any], data: dict[str, Any], extra: dict[str, Any],
                     metrics_file: Path, base: str | None) -> None:
    """Write ``model_dir/README.md`` (see :func:`model_card`); ``extra``: the run's manifest numbers."""
    run = {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in extra.items() if k in RUN_ROWS}
    text = model_card(config, data, run, eval_points(metrics_file), base)
    atomic_write_bytes(model_dir / CARD, text.encode("utf-8"))
