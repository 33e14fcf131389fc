"""merge: merge a continued model back into its base (linear/WiSE-FT, TIES, DARE), no training

``cptkit merge --base B0 --model runs/noreplay/model --out merged/ merge.method=linear
merge.alpha=0.5``; a sweep: ``--out 'merged/a{merge.alpha}' -m merge.alpha=0.25,0.5,0.75``.
``merge.alpha`` is the weight of ``--model`` against ``--base``, tensor for tensor (0: the base,
1: the model); ``merge.density`` is the share TIES keeps, ``merge.drop`` DARE's drop rate (its
drops are drawn from ``seed``). The formulas: :mod:`cptkit.models.merge`, docs/forgetting.md.

Both parents load through cptkit's loader (an HF folder, a ``.gguf`` file or ``smollm2``; a folder
that would run its own code is refused); parents of another architecture or vocabulary are refused
in one line. The output is an HF model folder (safetensors, config, the model's tokenizer) with a
model card (``README.md``) naming both parents (paths, sha256) and the method; its identity is keyed
to both parents' contents, so a changed parent makes a finished output refuse.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import fingerprint_path
from cptkit.core.job import Job, Task, TaskResult
from cptkit.core.progress import log, setup_logging
from cptkit.core.run import Run
from cptkit.core.shards import atomic_write_bytes, staged
from cptkit.core.step import QUIET, Option, step
from cptkit.models.remote_code import remote_code_kwargs
from cptkit.training.card import HUB_IDS

METHODS = ("linear", "ties", "dare")  # cptkit.models.merge.METHODS (not imported here: torch)
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class MergeConfig:
    base: str | None = None  # --base: the model continued from (HF folder, .gguf or smollm2)
    model: str | None = None  # --model: the continued model (HF folder, .gguf or smollm2)
    method: str = "linear"  # linear (WiSE-FT) | ties | dare
    alpha: float = 0.5  # weight of --model against --base, in [0, 1] (0: the base, 1: the model)
    density: float = 0.2  # ties: share of the task vector's entries kept, by magnitude (the paper's top 20%)
    drop: float = 0.5  # dare: probability that a task-vector entry is dropped; the rest scale by 1/(1-drop)
    dtype: str = "float32"  # the merged weights' dtype (the merge computes in float32)

    def __post_init__(self) -> None:
        check(self.method in METHODS, "method", self.method, f"must be one of {', '.join(METHODS)}")
        check(0.0 <= self.alpha <= 1.0, "alpha", self.alpha, "must be in [0, 1]")
        check(0.0 < self.density <= 1.0, "density", self.density, "must be in (0, 1]")
        check(0.0 <= self.drop < 1.0, "drop", self.drop, "must be in [0, 1)")
        check(self.dtype in DTYPES, "dtype", self.dtype, f"must be one of {', '.join(DTYPES)}")


@dataclass
class MergeJob(JobConfig):
    merge: MergeConfig = field(default_factory=MergeConfig)


BASE = Option(("--base",), "merge.base", "The base model (HF folder, .gguf file or smollm2).")
MODEL = Option(("--model",), "merge.model", "The continued model to merge back into --base.")
OUT_DIR = Option(("--out", "-o"), "io.output",
                 "The merged model's folder. {key} placeholders are filled from the config.")


def params(m: MergeConfig) -> dict[str, Any]:
    """The merge's parameters as the card and the summary show them (only those its method reads)."""
    p: dict[str, Any] = {"method": m.method, "alpha": m.alpha}
    if m.method == "ties":
        p["density"] = m.density
    if m.method == "dare":
        p["drop"] = m.drop
    return p


def model_card(conf: MergeJob, parents: dict[str, dict], merged: int) -> str:
    """``README.md`` of the merged folder: Hub front matter, the method and both parents (as
    given, resolved, and their content sha256). Nothing in it depends on the clock: a rerun writes the same card."""
    import yaml

    m = conf.merge
    p = params(m) | ({"seed": conf.seed} if m.method == "dare" else {})
    formula = {"linear": "(1 - alpha) * base + alpha * model (WiSE-FT, Wortsman et al. 2022)",
               "ties": "base + alpha * trim(model - base, density), signs elected (TIES, Yadav et al. 2023)",
               "dare": "base + alpha * drop(model - base, p=drop) / (1 - drop) (DARE, Yu et al. 2023)"}[m.method]
    front = {"base_model": [HUB_IDS.get(str(s), str(s)) for s in (m.base, m.model)], "base_model_relation": "merge",
             "library_name": "transformers", "tags": ["cptkit", "merge", m.method]}
    rows = "".join(f"| {role} | `{fp['spec']}` | `{fp['path']}` | `{fp.get('sha256')}` | {fp.get('size')} |\n"
                   for role, fp in parents.items())
    settings = " ".join(f"merge.{k}={v}" for k, v in p.items() if k != "seed") + (
        f" seed={conf.seed}" if "seed" in p else "")
    return ("---\n" + yaml.safe_dump(front, sort_keys=False) + "---\n\n"
            f"# Merged model: {m.method}, alpha = {m.alpha}\n\n"
            f"Made by `cptkit merge` from two parents, tensor for tensor, without training: {formula}.\n\n"
            "| parent | spec | path | sha256 (content) | bytes |\n|---|---|---|---|---:|\n" + rows + "\n"
            "| parameter | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in p.items())
            + f"| dtype | {m.dtype} |\n| parameters merged | {merged:,} |\n\n"
            f"Reproduce: `cptkit merge --base {m.base} --model {m.model} --out OUT {settings}`\n")


@step("merge", MergeJob, options=(BASE, MODEL, OUT_DIR, QUIET), order=142)
def run(conf: MergeJob, ctx: Run) -> dict:
    setup_logging(conf.quiet)  # before transformers is imported: its progress bars stay off
    from cptkit.models.lm import check_gguf, resolve_spec, spec_file  # deferred: torch

    m = conf.merge
    for role, spec in (("--base", m.base), ("--model", m.model)):
        if not spec:
            raise CptkitError(f"merge: {role} is required (an HF model folder, a .gguf file or smollm2)")
        # not a model, or a folder that would run its own code (never, here): refused before --out is made
        folder, gguf = resolve_spec(spec)
        if gguf is None:
            remote_code_kwargs(folder, False)
        else:
            check_gguf(Path(folder) / gguf)
    if not ctx.io.output or str(ctx.io.output) == "-":
        raise CptkitError("merge: --out DIR is required (a folder for the merged model, not stdout)")
    reads = [spec_file(m.base), spec_file(m.model)]
    with Job(ctx, tasks=[Task(0, [], name="merge")], needs_inputs=False, reads=reads) as job:
        for task in job.pending():
            t0 = time.time()
            parents = {role: {"spec": spec, **fingerprint_path(str(spec_file(spec)))}
                       for role, spec in (("base", m.base), ("model", m.model))}
            files, merged = _merge(conf, job.out, parents)
            job.complete(task, result=TaskResult(files=files), seconds=time.time() - t0, parameters=merged)
        merged = int(job.all_results().get("merge", {}).get("extra", {}).get("parameters", 0))
        return job.finish(extra={**params(m), **({"seed": conf.seed} if m.method == "dare" else {}),
                                 "parameters merged": merged})


def _merge(conf: MergeJob, out: Path, parents: dict[str, dict]) -> tuple[list[str], int]:
    """Load both parents, check them, merge into the model's weights, write the folder; (files, parameters)."""
    import torch  # deferred: heavy

    from cptkit.models.lm import load_tokenizer  # deferred: torch
    from cptkit.models.merge import (  # deferred: torch
        check_configs,
        check_parents,
        check_vocab,
        merge_into,
    )
    from cptkit.models.pretrained import load_pretrained  # deferred: torch, transformers

    m = conf.merge
    names = (f"--base {m.base}", f"--model {m.model}")
    configs = [_config(str(spec)) for spec in (m.base, m.model)]
    if None not in configs:  # refused before any weights load (a GGUF's config is read as it loads)
        check_configs(*configs, *names)
    tok = load_tokenizer(str(m.model))
    check_vocab(load_tokenizer(str(m.base)).get_vocab(), tok.get_vocab(), *names)
    base, model = load_pretrained(str(m.base)), load_pretrained(str(m.model))
    check_parents(base, model, *names)
    t0 = time.time()
    merged = merge_into(base, model, m.method, m.alpha, m.density, m.drop, conf.seed)
    log.info("merge: %s alpha=%s over %s parameters in %.1f s", m.method, m.alpha, f"{merged:,}", time.time() - t0)
    del base
    model = model.to(getattr(torch, m.dtype))
    with staged(out) as tmp:
        model.save_pretrained(str(tmp))
        _copy_tokenizer(str(m.model), tok, tmp)
        files = sorted(f.name for f in tmp.iterdir())
    atomic_write_bytes(out / "README.md", model_card(conf, parents, merged).encode())
    return [*files, "README.md"], merged


def _config(spec: str) -> dict | None:
    """A parent's ``config.json`` (None for a GGUF file read in place)."""
    from cptkit.models.lm import resolve_loadable  # deferred: torch

    folder, gguf = resolve_loadable(spec)
    try:
        return None if gguf else json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CptkitError(f"merge: model {spec}: cannot read config.json: {e}") from None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "added_tokens.json", "chat_template.jinja", "chat_template.json")


def _copy_tokenizer(spec: str, tok: Any, tmp: Path) -> None:
    """The model's tokenizer files, byte for byte (a GGUF without a converted folder: saved from its tokenizer)."""
    from cptkit.models.lm import resolve_loadable  # deferred: torch

    folder, gguf = resolve_loadable(spec)
    found = [Path(folder) / n for n in TOKENIZER_FILES if (Path(folder) / n).is_file()] if gguf is None else []
    if not found:
        tok.save_pretrained(str(tmp))
        return
    for f in found:
        shutil.copyfile(f, tmp / f.name)
