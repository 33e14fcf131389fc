"""The end of a training run on rank 0: the time-averaged weights (also as a static recipe), the
plots, the Velocitune proxy's targets and the final model (``from_pretrained``-loadable, with its
model card: :mod:`cptkit.training.card`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from cptkit.core.progress import log
from cptkit.core.records import read_jsonl
from cptkit.mixtures.rules import normalize
from cptkit.mixtures.velocitune import ProxyRun
from cptkit.training.card import base_model, stream_record, write_model_card
from cptkit.training.engine import full_state_dict
from cptkit.training.plots import plot_curves, plot_loss, save_figure
from cptkit.training.state import Engine, RunSpec, TrainState


def plot_weights(path: Path, out: Path) -> str | None:
    """Plot the weight trajectory (JSONL) as a PNG; returns a note when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: weights.png skipped (pip install matplotlib)"
    rows = read_jsonl(path)
    rows = [r for r in rows if r.get("weights")]  # a staged run follows its plan: its stage events carry none
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for d in rows[0]["weights"]:
        ax.plot([r["tokens"] for r in rows], [r["weights"][d] for r in rows], drawstyle="steps-post", label=d)
    ax.set_xlabel("tokens")
    ax.set_ylabel("domain weight")
    save_figure(fig, out)
    return None



def write_outputs(spec: RunSpec, engine: Engine, tokenizer: Any, state: TrainState, proxy_run: ProxyRun | None,
                  extra: dict[str, Any]) -> None:
    """Rank 0's end of run: time-averaged weights (and as a recipe), plots, the proxy's targets, the model."""
    out, tcfg = spec.out, spec.tcfg
    final_sd = full_state_dict(engine)  # ZeRO-3: gathered from every rank (collective); else None
    job = spec.job  # rank 0's: it owns the output
    if job is None:
        return
    avg = normalize(state.weight_sum) if sum(state.weight_sum.values()) > 0 else {}
    job.write_json("avg_weights.json", {"weights": avg, "steps": state.step})
    recipe = {"name": f"reweighted_{out.name}", "stages": [{"name": "reweighted", "weights": avg}]}
    job.write_bytes("mix_reweighted.yaml",
                    ("# time-averaged weights of this run; use: train.mixture=static "
                     "train.weights=<these weights>, or as a mix stage\n"
                     + OmegaConf.to_yaml(OmegaConf.create(recipe))).encode())
    plots = []
    if tcfg.plot and (out / "weights.jsonl").exists():
        plots.append(lambda: plot_weights(out / "weights.jsonl", out / "weights.png"))
    if tcfg.plot:
        plots.append(lambda: plot_loss(out / "metrics.jsonl", out / "loss.png"))
    if tcfg.plot and tcfg.eval_every:
        plots.append(lambda: plot_curves(out, out / "curves.png"))
    for plot in plots:
        note = plot()
        if note:
            log.warning(note)
    if proxy_run is not None:
        res = proxy_run.result(spec.stream.domains, str(spec.stream.path), state.step)
        job.write_json("_velocitune_targets.json", res)
        if not res["converged"]:
            log.warning("velocitune proxy: stopped at proxy_fraction (%d steps) with the targets still moving "
                        "by %.4g (>= sigma %.4g): a run using them needs train.velocitune.allow_unconverged=true",
                        state.step, res["change"] if res["change"] is not None else float("inf"), res["sigma"])
        extra["velocitune targets"] = json.dumps({d: round(v, 4) for d, v in res["targets"].items()})
        extra["velocitune proxy steps"] = state.step
    model_dir, tmp = out / "model", out / ".model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    engine.module.save_pretrained(str(tmp), state_dict=final_sd)
    tokenizer.save_pretrained(str(tmp))
    write_model_card(tmp, job.config,
                     stream_record(spec.conf.io.inputs[0], spec.stream.meta), extra, out / "metrics.jsonl",
                     base_model(spec.conf.model))
    shutil.rmtree(model_dir, ignore_errors=True)
    os.replace(tmp, model_dir)
