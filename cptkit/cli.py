"""The ``cptkit`` command line: one thin Typer command per step.

Each command maps its options onto config keys, composes ``conf/<step>.yaml`` with the
trailing Hydra overrides (``key=value``, ``+key=value``) and calls ``cptkit.steps.<step>.run``.
With ``-m`` the same step function runs under ``@hydra.main`` as a multirun (sweeps, SLURM).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from typer.core import TyperCommand

from cptkit.errors import CptkitError
from cptkit.steps import execute, step_module

__all__ = ["app", "execute", "main", "step_module", "MODULES"]


class StepCommand(TyperCommand):
    """A command whose listing shows its whole description and whose ``--help`` ends with the
    step's config keys, defaults and help (generated from the typed schema)."""

    def get_short_help_str(self, limit: int = 45) -> str:
        return " ".join((self.short_help or self.help or "").split())

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        super().format_epilog(ctx, formatter)
        if self.name in MODULES:
            from cptkit.cli_help import config_help

            formatter.write("\n" + config_help(self.name))


def command(name: str, **kw: Any):
    """``app.command`` with :class:`StepCommand` (full descriptions, config keys in --help)."""
    return app.command(name, cls=StepCommand, **kw)


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

In = Annotated[list[str] | None, typer.Option("--in", "-i", metavar="PATH", help="Input: file, directory of shards, glob, or - (stdin). Repeatable.")]
Out = Annotated[str | None, typer.Option("--out", "-o", metavar="PATH", help="Output directory (or - for stdout). {key} placeholders are filled from the config.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar, no summary table.")]
Cfg = Annotated[str | None, typer.Option("--cfg", "-c", metavar="job|hydra|all", help="Print the config (job: the step's, hydra: Hydra's, all: both) and exit; secrets are redacted. Add --resolve to resolve ${...} interpolations; --info prints the config search path and defaults list instead.")]
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


def invoke(ctx: typer.Context, step: str, overrides: list[str], show_cfg: str | None = None) -> None:
    """Compose the step's config from option-derived and trailing overrides and run it."""
    extra = list(ctx.args)
    resolve = "--resolve" in extra
    info = "--info" in extra
    extra = [a for a in extra if a not in ("--resolve", "--info")]
    unknown = [a for a in extra if a.startswith("--") and "=" not in a]
    if unknown:
        raise CptkitError(f"unknown option {unknown[0]} for 'cptkit {step}' (see cptkit {step} --help)")
    step_module(step)  # registers the schema
    from cptkit.executor import split_executor_args

    executor, extra = split_executor_args(extra)
    if "-m" in extra or "--multirun" in extra:
        from cptkit.sweep import multirun

        multirun(step, overrides + [a for a in extra if a not in ("-m", "--multirun")])
        return
    from cptkit.config import compose_step

    if info:
        sys.stdout.write(hydra_info(step, overrides + extra))
        return
    if show_cfg is not None:
        sys.stdout.write(show_config(step, overrides + extra, show_cfg, resolve))
        return
    cfg = compose_step(step, overrides + extra)
    if executor.kind == "ray":
        from cptkit.executor import run_ray

        run_ray(step, overrides + extra, cfg, executor)
        return
    execute(step, cfg)


def show_config(step: str, overrides: list[str], which: str, resolve: bool) -> str:
    """``--cfg job|hydra|all`` as YAML, secrets redacted (``--resolve``: interpolations resolved)."""
    from cptkit.config import compose_step
    from cptkit.redact import redact

    if which not in ("job", "hydra", "all"):
        raise CptkitError(f"--cfg {which!r}: use job, hydra or all")
    compose_step(step, overrides)  # validates: a bad value fails here as it would in a run
    if which == "job":
        cfg = compose_step(step, overrides, resolve=resolve)
    else:
        cfg = compose_step(step, overrides, hydra_node=True, resolve=False)
        if which == "hydra":
            cfg = OmegaConf.masked_copy(cfg, ["hydra"])
    try:
        container = OmegaConf.to_container(cfg, resolve=resolve)
    except OmegaConfBaseException:  # hydra.* values only a running Hydra app fills (job.num, ...)
        container = OmegaConf.to_container(cfg, resolve=False)
    return OmegaConf.to_yaml(OmegaConf.create(redact(container)))


def hydra_info(step: str, overrides: list[str]) -> str:
    """``--info``: where the config comes from (search path, defaults list, overrides)."""
    from cptkit.config import CONF_DIR, compose_step
    from cptkit.redact import redact_text

    cfg = compose_step(step, overrides, hydra_node=True, resolve=False)
    name = step.replace("-", "_")
    lines = [f"cptkit {step}", f"config: {CONF_DIR / (name + '.yaml')}", "config search path:",
             f"  file://{CONF_DIR}", "  pkg://hydra.conf (Hydra's own defaults)", "defaults list:",
             f"  _schema_{name} (the dataclass schema, cptkit.steps.{MODULES[step]})"]
    lines += [f"  {group}: {choice}" for group, choice in cfg.hydra.runtime.choices.items()
              if not str(group).startswith("hydra/")]
    lines += [f"  {name} (conf/{name}.yaml)", "overrides:"]
    lines += [f"  {redact_text(o)}" for o in overrides] or ["  (none)"]
    return "\n".join(lines) + "\n"


def register(step: str, module: str):
    MODULES[step] = module


def _print_version(value: bool) -> None:
    if value:
        from cptkit import __version__

        typer.echo(f"cptkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", "-V", help="Print the version and exit.",
                                          callback=_print_version, is_eager=True)] = False,
) -> None:
    """Composable steps for continual pre-training."""


# --- steps, in pipeline order (the order of `cptkit --help`) -------------------------------
Files = Annotated[list[str] | None, typer.Option(metavar="PATH", help="JSONL file, directory or glob. Repeatable.")]
Corpus = Annotated[list[str] | None, typer.Option("--corpus", "--in", "-i", metavar="PATH", help="Corpus shards to index (file, directory, glob); --in and -i name it as in every other step. Repeatable.")]
Model = Annotated[str | None, typer.Option("--model", metavar="MODEL", help="HF model dir, .gguf file, or smollm2.")]


def data_step(name: str, module: str, help: str) -> None:
    """Register the usual command: --in/--out/--quiet/--cfg/--skip-bad-lines + overrides."""
    register(name, module)

    def run_step(ctx: typer.Context, inputs: In = None, out: Out = None, quiet: Quiet = False,
                cfg: Cfg = None, skip_bad: SkipBad = False) -> None:
        invoke(ctx, name, io_overrides(inputs, out, quiet, skip_bad), cfg)

    run_step.__name__ = run_step.__qualname__ = name.replace("-", "_")
    command(name, context_settings=CTX, help=help)(run_step)


def _list(key: str, values: list[str]) -> str:
    return f"{key}=[" + ",".join(_q(v) for v in values) + "]"


register("demo-corpus", "demo_corpus")


@command("demo-corpus", context_settings=CTX,
             help="Build the real-text demo corpus (English + Chinese Debian docs) as JSONL shards; "
             "packages come from apt-get download into corpus.cache_dir.")
def demo_corpus(ctx: typer.Context, out: Out = None, quiet: Quiet = False, cfg: Cfg = None) -> None:
    invoke(ctx, "demo-corpus", io_overrides(None, out, quiet), cfg)


data_step("expand-queries", "expand_queries",
          "LLM query expansion: Question Extension + Thought Generation over expand.rounds, "
          "cleaning and MinHash near-dup removal each round; llm=transformers|openai|vllm (SPEC §1).")

register("retrieve-index", "retrieve_index")


@command("retrieve-index", context_settings=CTX,
             help="Build BM25 index shards (shard.index=I shard.count=N per array job, or retrieve.shards=N); "
             "retrieve --index DIR then searches all shards with global statistics (docs/retrieve.md).")
def retrieve_index(ctx: typer.Context, corpus: Corpus = None, out: Out = None, quiet: Quiet = False,
                   cfg: Cfg = None, skip_bad: SkipBad = False) -> None:
    invoke(ctx, "retrieve-index", io_overrides(corpus, out, quiet, skip_bad), cfg)


register("retrieve", "retrieve")


@command("retrieve", context_settings=CTX,
             help="BM25 top-k documents for many queries; output: their union with hits, plus _run.tsv (SPEC §2).")
def retrieve(
    ctx: typer.Context,
    queries: Annotated[list[str] | None, typer.Option("--queries", metavar="PATH", help="Query records (their `text` is searched). Repeatable.")] = None,
    corpus: Corpus = None,
    index: Annotated[str | None, typer.Option("--index", metavar="PATH", help="Index directory: reused if finished, else built there from --corpus.")] = None,
    out: Out = None,
    quiet: Quiet = False,
    cfg: Cfg = None,
    skip_bad: SkipBad = False,
) -> None:
    overrides = io_overrides(corpus, out, quiet, skip_bad)
    if queries:
        overrides.append(_list("retrieve.queries", queries))
    if index is not None:
        overrides.append(f"retrieve.index={_q(index)}")
    invoke(ctx, "retrieve", overrides, cfg)


data_step("dedup", "dedup", "Remove exact and MinHash-LSH near-duplicates across all shards (SPEC §3).")

register("score-quality-train", "score_quality_train")


@command("score-quality-train", context_settings=CTX,
             help="Train a quality classifier from --positives/--negatives (or --in with "
             "train.label_field=FIELD); prints held-out accuracy/F1 (SPEC §4).")
def score_quality_train(ctx: typer.Context, positives: Files = None, negatives: Files = None,
                        inputs: In = None, out: Out = None, quiet: Quiet = False, cfg: Cfg = None,
                        skip_bad: SkipBad = False) -> None:
    ov = io_overrides(inputs, out, quiet, skip_bad)
    if positives:
        ov.append(_list("train.positives", positives))
    if negatives:
        ov.append(_list("train.negatives", negatives))
    invoke(ctx, "score-quality-train", ov, cfg)


data_step("score-quality", "score_quality",
          "Score documents with trained classifiers: quality=P(high quality), edu_score in [0,2]; "
          "filter only with quality.min_score / edu.min_score (SPEC §4).")
data_step("label-topics-annotate", "label_topics_annotate",
          "LLM zero-shot topic labels for a sample (topics.sample=N): every topic name scored by "
          "log-likelihood, or topics.annotate_mode=generate (SPEC §5).")
data_step("label-topics-train", "label_topics_train",
          "Train one topic classifier per language from labelled records; prints held-out "
          "accuracy, macro-F1 and the confusion table (SPEC §5).")
data_step("label-topics", "label_topics",
          "Detect the language, then label topic/topic_score with that language's classifier "
          "(topics.model=DIR; SPEC §5).")
data_step("synthesize-qa", "synthesize_qa",
          "LLM QA synthesis: scientific [Problem]/[Solution] pairs from seed documents selected by "
          "URL domain per discipline, or synth.mode=code in-context expansion of a problem set (SPEC §6).")
data_step("corrupt", "corrupt",
          "Degrade synthetic data at corrupt.ratio: numbers, frequent nouns (co-hyponyms), "
          "adjectives (antonyms); edits listed per record (SPEC §7, docs/corrupt.md).")
data_step("build-mix", "build_mix",
          "Tokenize, order and pack curated shards into a mixed training stream by domain "
          "and stage (SPEC §8). Recipes: mix=demo|demo_cpt|synE_stage1|synE_stage2|upsample_tail.")

register("train", "train")


@command("train", context_settings=CTX,
             help="Train a causal LM on a build-mix stream with DeepSpeed (ZeRO-2, bf16) and a static, "
             "staged or dynamic domain mixture (SPEC §9): train.mixture=static|staged|topic_ppl|velocitune|dbl.")
def train(ctx: typer.Context, inputs: In = None, out: Out = None, quiet: Quiet = False,
          cfg: Cfg = None) -> None:
    ctx.args[:] = [a for a in ctx.args if not a.startswith("--local_rank")]  # the deepspeed launcher adds it
    invoke(ctx, "train", io_overrides(inputs, out, quiet), cfg)


register("evaluate", "evaluate")


@command("evaluate", context_settings=CTX,
             help="Perplexity per group on held-out shards (--in, eval.ppl.group_by=FIELD) and few-shot "
             "benchmarks (eval.tasks=[...], conf/eval/tasks/*.yaml) scored as lm-evaluation-harness does (SPEC §10).")
def evaluate(ctx: typer.Context, model: Model = None, inputs: In = None, out: Out = None, quiet: Quiet = False,
             cfg: Cfg = None, skip_bad: SkipBad = False) -> None:
    overrides = io_overrides(inputs, out, quiet, skip_bad)
    if model is not None:
        overrides.append(f"eval.model={_q(model)}")
    invoke(ctx, "evaluate", overrides, cfg)


data_step("evaluate-contamination", "evaluate_contamination",
          "Share of documents with an n-gram overlap (eval.ngram=8) with benchmarks' test items, "
          "share of test items hit; eval.action=none|flag|drop (SPEC §10, Retrieve-Pile Table 6).")


@command("evaluate-compare", help="Side-by-side table of evaluate outputs (first = baseline) with deltas.")
def evaluate_compare(
    runs: Annotated[list[str], typer.Argument(help="evaluate output dirs (or _results.json files); NAME=DIR to label.")],
    out: Annotated[str | None, typer.Option("--out", "-o", metavar="PATH", help="Also write the table: .md (markdown) or .json.")] = None,
    metric: Annotated[str | None, typer.Option("--metric", help="acc | acc_norm | exact_match (default: acc_norm, else exact_match).")] = None,
    curves: Annotated[str | None, typer.Option("--curves", metavar="PNG", help="Overlay the runs' per-domain eval-loss curves (their train metrics.jsonl) in one PNG.")] = None,
) -> None:
    import json
    from pathlib import Path

    from cptkit.eval.compare import compare_table, load_results, print_compare, to_markdown
    from cptkit.shards import atomic_write_bytes

    loaded = {}
    for r in runs:
        name, _, path = r.partition("=") if "=" in r and not Path(r).exists() else (r, "", r)
        loaded[name] = load_results(path)
    header, rows = compare_table(loaded, metric)
    print_compare(header, rows)
    if curves:
        from cptkit.training.metrics import overlay_curves, run_dir_of

        dirs = {n: d for n, r in loaded.items() if (d := run_dir_of(r)) is not None}
        if not dirs:
            raise CptkitError("--curves: no run has a training metrics.jsonl next to its evaluated model")
        note = overlay_curves(dirs, Path(curves))
        if note:
            print(note, file=sys.stderr)
    md = to_markdown(header, rows)
    if out:
        body = json.dumps({"header": header, "rows": rows}, indent=1) if out.endswith(".json") else md
        atomic_write_bytes(Path(out), body.encode())
    else:
        sys.stdout.write(md)


register("serve-llm", "serve_llm")


@command("serve-llm", context_settings=CTX,
             help="Serve a local model (llm=transformers|vllm) as an OpenAI-compatible HTTP API "
             "(/v1/chat/completions, /v1/completions, /v1/models) with request batching.")
def serve_llm(ctx: typer.Context, quiet: Quiet = False, cfg: Cfg = None) -> None:
    invoke(ctx, "serve-llm", io_overrides(None, None, quiet), cfg)


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit code 2 (secrets
    masked); Ctrl-C says what was kept and exits 130."""
    try:
        app()
    except CptkitError as e:
        from rich.text import Text

        from cptkit.progress import console
        from cptkit.redact import redact_text

        console.print(Text.assemble(("error: ", "bold red"), redact_text(str(e).replace("\n", " "))), soft_wrap=True)
        sys.exit(e.exit_code)
    except SystemExit as e:
        if e.code == 130:  # Typer turns Ctrl-C (KeyboardInterrupt) into exit 130
            _interrupted()
        raise
    except KeyboardInterrupt:
        _interrupted()
        sys.exit(130)


def _interrupted() -> None:
    from cptkit.job import interrupted_message
    from cptkit.progress import console

    console.print(interrupted_message(), soft_wrap=True, markup=False, highlight=False)


if __name__ == "__main__":
    main()
