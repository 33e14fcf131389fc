"""The ``cptkit`` command line: one thin Typer command per step.

Each command maps its options onto config keys, composes ``conf/<step>.yaml`` with the
trailing Hydra overrides (``key=value``, ``+key=value``) and calls ``cptkit.steps.<step>.run``.
With ``-m`` the same step function runs under ``@hydra.main`` as a multirun (sweeps, SLURM).
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Any

import typer
from omegaconf import OmegaConf

from cptkit.errors import CptkitError

CTX = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="cptkit",
    help="Composable steps for continual pre-training. Each step reads and writes sharded JSONL; "
    "trailing KEY=VALUE words are Hydra overrides (see conf/<step>.yaml).",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

# Step name -> module under cptkit/steps (imported lazily so --help stays fast).
MODULES: dict[str, str] = {}

In = Annotated[list[str] | None, typer.Option("--in", "-i", help="Input: file, directory of shards, glob, or - (stdin). Repeatable.")]
Out = Annotated[str | None, typer.Option("--out", "-o", help="Output directory (or - for stdout). {key} placeholders are filled from the config.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar, no summary table.")]
Cfg = Annotated[str | None, typer.Option("--cfg", help="'job': print the resolved config and exit.")]
SkipBad = Annotated[bool, typer.Option("--skip-bad-lines", help="Skip and count malformed input lines instead of failing.")]


def _q(value: str) -> str:
    """Quote a value for Hydra's override grammar."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def io_overrides(inputs: list[str] | None = None, out: str | None = None, quiet: bool = False,
                 skip_bad: bool = False) -> list[str]:
    ov = []
    if inputs:
        ov.append("io.inputs=[" + ",".join(_q(i) for i in inputs) + "]")
    if out is not None:
        ov.append(f"io.output={_q(out)}")
    if quiet:
        ov.append("quiet=true")
    if skip_bad:
        ov.append("io.skip_bad_lines=true")
    return ov


def step_module(step: str):
    return importlib.import_module(f"cptkit.steps.{MODULES[step]}")


def execute(step: str, cfg) -> Any:
    """Run a step on a composed config (the code path shared by single runs and sweeps)."""
    from cptkit.config import format_path

    OmegaConf.set_struct(cfg, False)
    cfg.io.output = format_path(cfg.io.output, cfg)
    OmegaConf.set_struct(cfg, True)
    return step_module(step).run(cfg)


def invoke(ctx: typer.Context, step: str, overrides: list[str], show_cfg: str | None = None) -> None:
    """Compose the step's config from option-derived and trailing overrides and run it."""
    extra = list(ctx.args)
    unknown = [a for a in extra if a.startswith("--") and "=" not in a]
    if unknown:
        raise CptkitError(f"unknown option {unknown[0]} for 'cptkit {step}' (see cptkit {step} --help)")
    step_module(step)  # registers the schema
    if "-m" in extra or "--multirun" in extra:
        from cptkit.sweep import multirun

        multirun(step, overrides + [a for a in extra if a not in ("-m", "--multirun")])
        return
    from cptkit.config import compose_step

    cfg = compose_step(step, overrides + extra)
    if show_cfg is not None:
        if show_cfg != "job":
            raise CptkitError(f"--cfg {show_cfg!r}: only 'job' is supported")
        sys.stdout.write(OmegaConf.to_yaml(cfg))
        return
    execute(step, cfg)


def register(step: str, module: str):
    MODULES[step] = module


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        from cptkit import __version__

        typer.echo(__version__)
        raise typer.Exit()


# --- steps ---------------------------------------------------------------------------------
# Each command: map its own options to overrides, then invoke(). Keep them thin.

# (steps are added below by their modules' authors, one block each)


# --- score-quality / label-topics / corrupt (issue 4) ---
register("score-quality", "score_quality")
register("score-quality-train", "score_quality_train")
Files = Annotated[list[str] | None, typer.Option(help="JSONL file, directory or glob. Repeatable.")]


@app.command("score-quality", context_settings=CTX,
             help="Score documents with trained classifiers: quality=P(high quality), edu_score in [0,2]; "
             "filter only with quality.min_score / edu.min_score (SPEC §4).")
def score_quality(ctx: typer.Context, inputs: In = None, out: Out = None, quiet: Quiet = False,
                  cfg: Cfg = None, skip_bad: SkipBad = False) -> None:
    invoke(ctx, "score-quality", io_overrides(inputs, out, quiet, skip_bad), cfg)


@app.command("score-quality-train", context_settings=CTX,
             help="Train a quality classifier from --positives/--negatives (or --in with "
             "train.label_field=FIELD); prints held-out accuracy/F1 (SPEC §4).")
def score_quality_train(ctx: typer.Context, positives: Files = None, negatives: Files = None,
                        inputs: In = None, out: Out = None, quiet: Quiet = False, cfg: Cfg = None,
                        skip_bad: SkipBad = False) -> None:
    ov = io_overrides(inputs, out, quiet, skip_bad)
    if positives:
        ov.append("train.positives=[" + ",".join(_q(p) for p in positives) + "]")
    if negatives:
        ov.append("train.negatives=[" + ",".join(_q(p) for p in negatives) + "]")
    invoke(ctx, "score-quality-train", ov, cfg)
# --- end issue 4 ---


register("dedup", "dedup")


@app.command("dedup", context_settings=CTX,
             help="Remove exact and MinHash-LSH near-duplicates across all shards (SPEC §3).")
def dedup(ctx: typer.Context, inputs: In = None, out: Out = None, quiet: Quiet = False,
          cfg: Cfg = None, skip_bad: SkipBad = False) -> None:
    invoke(ctx, "dedup", io_overrides(inputs, out, quiet, skip_bad), cfg)


register("retrieve", "retrieve")


@app.command("retrieve", context_settings=CTX,
             help="BM25 top-k documents for many queries; output: their union with hits, plus _run.tsv (SPEC §2).")
def retrieve(
    ctx: typer.Context,
    queries: Annotated[list[str] | None, typer.Option("--queries", help="Query records (their `text` is searched). Repeatable.")] = None,
    corpus: Annotated[list[str] | None, typer.Option("--corpus", "-i", help="Corpus shards to index (file, directory, glob). Repeatable.")] = None,
    index: Annotated[str | None, typer.Option("--index", help="Index directory: reused if finished, else built there from --corpus.")] = None,
    out: Out = None,
    quiet: Quiet = False,
    cfg: Cfg = None,
    skip_bad: SkipBad = False,
) -> None:
    overrides = io_overrides(corpus, out, quiet, skip_bad)
    if queries:
        overrides.append("retrieve.queries=[" + ",".join(_q(x) for x in queries) + "]")
    if index is not None:
        overrides.append(f"retrieve.index={_q(index)}")
    invoke(ctx, "retrieve", overrides, cfg)


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit code 2."""
    try:
        app()
    except CptkitError as e:
        from rich.text import Text

        from cptkit.progress import console

        console.print(Text.assemble(("error: ", "bold red"), str(e)), soft_wrap=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
