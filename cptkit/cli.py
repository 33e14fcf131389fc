"""The ``cptkit`` command line: one command per step, generated from the step's declaration.

A step's command maps its declared options onto config keys (:class:`cptkit.core.step.Option`),
composes ``conf/<step>.yaml`` with the trailing Hydra overrides (``key=value``, ``+key=value``)
and runs the step (:func:`cptkit.core.discovery.execute`). With ``-m`` the same step runs under
``@hydra.main`` as a multirun (sweeps, SLURM).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Annotated, Any

import click
import typer
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from typer.core import TyperCommand, TyperGroup

from cptkit import __version__
from cptkit.core.discovery import declaration, execute, ordered, step_help, step_module, step_names
from cptkit.core.errors import CptkitError, print_error
from cptkit.core.signals import interrupted_exit_code, interrupted_message

__all__ = ["app", "execute", "main", "step_module"]


class StepCommand(TyperCommand):
    """A step's command: its ``--help`` ends with the step's config keys, defaults and help
    (generated from the typed schema)."""

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        super().format_epilog(ctx, formatter)
        from cptkit.core.help import config_help  # deferred: hydra, omegaconf

        formatter.write("\n" + config_help(self.name))


# The commands that run a module's own ``main(argv)``: name -> (module, one-line help). The module's
# argparse parses the words after the name (its ``--help`` too), as before; nothing is imported
# until the command runs.
MODULE_COMMANDS: dict[str, tuple[str, str]] = {
    "convert-model": ("cptkit.models.convert", "Make a model spec loadable now (a GGUF dequantized once) and print its folder."),
    "expansion-arms": ("cptkit.eval.expansion_arms", "Claim expansion's query sets: keyword seeds, then round 0, round 1 and RM3 queries per topic."),
    "retrieval-relevance": ("cptkit.eval.retrieval_relevance", "Precision and recall of retrieve outputs against relevance labels (writes DIR/_relevance.json)."),
    "score-quality-train-report": ("cptkit.steps.score_quality_train", "Print a score-quality-train output's held-out accuracy, macro-F1 and AUC."),
    "label-topics-report": ("cptkit.steps.label_topics", "Print the topic distribution of a label-topics output (from its manifest)."),
    "qa-heldout": ("cptkit.eval.qa_heldout", "Claim synthetic_share's answers group: solutions of QA pairs from held-out seed problems."),
    "pairs": ("cptkit.eval.pairs", "Held-out clean/corrupted sentence pairs from domain text, for margin (split, make)."),
    "base-text": ("cptkit.training.base_text", "B0's re-adaptation text in disjoint parts (split), and per-seed samples of a part (sample)."),
    "b0": ("cptkit.training.b0", "Build B0, the re-adapted base (cached by content), until its held-out loss levels off."),
    "probe": ("cptkit.eval.probe", "The forgetting probe: texts a model samples itself, as a JSONL file."),
    "self-samples": ("cptkit.models.self_samples", "Texts a base samples from BOS, for self replay (mix.replay.source=FILE)."),
    "build-tasks": ("cptkit.eval.build_tasks", "Build cptkit's own benchmark tasks' data (gcide_defs, wordnet_defs, champ_math, ...)."),
    "margin": ("cptkit.eval.margin", "The preference margin: log p(clean) - log p(corrupted) of held-out sentence pairs."),
    "cpt-report": ("cptkit.training.report", "The CPT result table: every arm against B0 per seed, and the pre-registered claims."),
    "reproduce-report": ("cptkit.eval.reproduce", "The papers' claims against sweep outputs: tables, plots and verdicts as markdown."),
}

# The place of the commands that are not steps among the steps' declared ``order``s.
COMMAND_ORDER = {"convert-model": 12, "expansion-arms": 25, "retrieval-relevance": 45,
                 "score-quality-train-report": 61, "label-topics-report": 101, "qa-heldout": 115,
                 "pairs": 121, "base-text": 127, "b0": 142, "probe": 146, "self-samples": 147, "build-tasks": 148,
                 "margin": 155, "evaluate-compare": 165, "cpt-report": 166, "reproduce-report": 170}


class ModuleCommand(click.Command):
    """A command that hands every word after its name, unparsed, to its module's ``main(argv)``
    (the module's own argparse: arguments, ``--help`` and exit codes as they were)."""

    def __init__(self, name: str, module: str, help: str) -> None:
        super().__init__(name, help=help, short_help=help, add_help_option=False)
        self.module = module

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["argv"] = list(args)
        return []

    def invoke(self, ctx: click.Context) -> None:
        main = importlib.import_module(self.module).main
        rc = main(ctx.meta["argv"])
        if rc:
            raise typer.Exit(rc)


class Commands(TyperGroup):
    """The command group: the Typer commands below plus one generated command per step module,
    built only when that step is invoked or asked for ``--help`` (so ``cptkit --help`` imports no
    step)."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        names = set(super().list_commands(ctx)) | set(step_names()) | set(MODULE_COMMANDS)
        return ordered(sorted(names), COMMAND_ORDER)

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is None and cmd_name in MODULE_COMMANDS:
            cmd = ModuleCommand(cmd_name, *MODULE_COMMANDS[cmd_name])
        elif cmd is None and cmd_name in step_names():
            cmd = step_command(cmd_name)
        return cmd

    def format_commands(self, ctx: typer.Context, formatter: Any) -> None:
        rows, steps = [], set(step_names())
        for name in self.list_commands(ctx):
            if name in steps:
                rows.append((name, step_help(name)))
            elif name in MODULE_COMMANDS:
                rows.append((name, MODULE_COMMANDS[name][1]))
            elif (cmd := super().get_command(ctx, name)) is not None and not cmd.hidden:
                rows.append((name, " ".join((cmd.short_help or cmd.help or "").split())))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


CTX = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="cptkit",
    cls=Commands,
    help="Composable steps for continual pre-training. Each step reads and writes sharded JSONL; "
    "trailing KEY=VALUE words are Hydra overrides ('cptkit STEP --help' lists a step's keys).",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

Cfg = Annotated[str | None, typer.Option("--cfg", "-c", metavar="job|hydra|all", help="Print the config (job: the step's, hydra: Hydra's, all: both) and exit; secrets are redacted. Add --resolve to resolve ${...} interpolations; --info prints the config search path and defaults list instead.")]


def step_command(name: str) -> Any:
    """The command of step ``name``, generated from its declaration (:func:`cptkit.core.step.step`):
    each declared option sets its config key, ``--cfg`` prints the config, trailing words are
    Hydra overrides."""
    decl = declaration(name)
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("ctx", kw, annotation=typer.Context)]
    for o in decl.options:
        if o.flag:
            params.append(inspect.Parameter(o.dest, kw, default=False,
                                            annotation=Annotated[bool, typer.Option(*o.flags, help=o.help)]))
        else:
            kind = list[str] | None if o.multiple else str | None
            info = typer.Option(*o.flags, metavar=o.metavar, help=o.help)
            params.append(inspect.Parameter(o.dest, kw, default=None, annotation=Annotated[kind, info]))
    params.append(inspect.Parameter("show_cfg", kw, default=None, annotation=Cfg))

    def command(ctx: typer.Context, show_cfg: str | None = None, **values: Any) -> None:
        overrides = [ov for o in decl.options if (ov := o.override(values[o.dest])) is not None]
        invoke(ctx, name, overrides, show_cfg)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    one = typer.Typer(rich_markup_mode=None, add_completion=False)
    one.command(name, cls=StepCommand, context_settings=CTX, help=step_help(name))(command)
    return typer.main.get_command(one)


def invoke(ctx: typer.Context, step: str, overrides: list[str], show_cfg: str | None = None) -> None:
    """Compose the step's config from option-derived and trailing overrides and run it."""
    extra = [a for a in ctx.args if not a.startswith("--local_rank")]  # the deepspeed launcher adds it
    resolve = "--resolve" in extra
    info = "--info" in extra
    extra = [a for a in extra if a not in ("--resolve", "--info")]
    unknown = [a for a in extra if a.startswith("--") and "=" not in a]
    if unknown:
        raise CptkitError(f"unknown option {unknown[0]} for 'cptkit {step}' (see cptkit {step} --help)")
    from cptkit.core.executor import split_executor_args  # deferred: hydra

    executor, extra = split_executor_args(extra)
    if "-m" in extra or "--multirun" in extra:
        from cptkit.core.sweep import multirun  # deferred: hydra

        multirun(step, overrides + [a for a in extra if a not in ("-m", "--multirun")])
        return
    from cptkit.core.config import compose_step  # deferred: hydra

    if info:
        sys.stdout.write(hydra_info(step, overrides + extra))
        return
    if show_cfg is not None:
        sys.stdout.write(show_config(step, overrides + extra, show_cfg, resolve))
        return
    cfg = compose_step(step, overrides + extra)
    if executor.kind != "local" or executor.workers:
        from cptkit.core.executor import run_executor  # deferred: hydra

        run_executor(declaration(step), overrides + extra, cfg, executor)
        return
    execute(step, cfg)


def show_config(step: str, overrides: list[str], which: str, resolve: bool) -> str:
    """``--cfg job|hydra|all`` as YAML, secrets redacted (``--resolve``: interpolations resolved)."""
    from cptkit.core.config import compose_step  # deferred: hydra
    from cptkit.core.redact import redact  # deferred: logging, regexes

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
    from cptkit.core.config import (  # deferred: hydra (these two: not for `cptkit --help`)
        CONF_DIR,
        compose_step,
    )
    from cptkit.core.redact import redact_text  # deferred: logging, regexes

    cfg = compose_step(step, overrides, hydra_node=True, resolve=False)
    name = step.replace("-", "_")
    lines = [f"cptkit {step}", f"config: {CONF_DIR / (name + '.yaml')}", "config search path:",
             f"  file://{CONF_DIR}", "  pkg://hydra.conf (Hydra's own defaults)", "defaults list:",
             f"  _schema_{name} (the dataclass schema, cptkit.steps.{name})"]
    lines += [f"  {group}: {choice}" for group, choice in cfg.hydra.runtime.choices.items()
              if not str(group).startswith("hydra/")]
    if (CONF_DIR / f"{name}.yaml").exists():
        lines.append(f"  {name} (conf/{name}.yaml)")
    lines.append("overrides:")
    lines += [f"  {redact_text(o)}" for o in overrides] or ["  (none)"]
    return "\n".join(lines) + "\n"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"cptkit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", "-V", help="Print the version and exit.",
                                          callback=_print_version, is_eager=True)] = False,
) -> None:
    """Composable steps for continual pre-training."""


@app.command("evaluate-compare", help="Side-by-side table of evaluate outputs (first = baseline) with deltas.")
def evaluate_compare(
    runs: Annotated[list[str], typer.Argument(help="evaluate output dirs (or _results.json files); NAME=DIR to label.")],
    out: Annotated[str | None, typer.Option("--out", "-o", metavar="PATH", help="Also write the table: .md (markdown) or .json.")] = None,
    metric: Annotated[str | None, typer.Option("--metric", help="acc | acc_norm | exact_match (default: acc_norm, else exact_match).")] = None,
    curves: Annotated[str | None, typer.Option("--curves", metavar="PNG", help="Overlay the runs' per-domain eval-loss curves (their train metrics.jsonl) in one PNG.")] = None,
) -> None:
    import json
    from pathlib import Path

    from cptkit.core.output import check_output_file  # deferred: the output protocol
    from cptkit.core.shards import atomic_write_bytes  # deferred: json and the shard writer
    from cptkit.eval.compare import (  # deferred: eval/ (not on `cptkit --help`)
        compare_table,
        load_results,
        print_compare,
        to_markdown,
    )

    for path, option in ((out, "--out"), (curves, "--curves")):
        if path:
            check_output_file(path, option)
    loaded = {}
    for r in runs:
        name, _, path = r.partition("=") if "=" in r and not Path(r).exists() else (r, "", r)
        loaded[name] = load_results(path)
    header, rows = compare_table(loaded, metric)
    print_compare(header, rows)
    if curves:
        from cptkit.training.metrics import run_dir_of  # deferred: matplotlib, only for --curves
        from cptkit.training.plots import overlay_curves  # deferred: training/, matplotlib

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


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit code 2 (secrets
    masked); Ctrl-C says what was kept and exits 130, SIGTERM during a run the same and exits 143."""
    try:
        app()
    except CptkitError as e:
        print_error(e)
        sys.exit(e.exit_code)
    except SystemExit as e:
        if e.code == 130:  # Typer turns Ctrl-C (KeyboardInterrupt, and a run's SIGTERM: Terminated) into exit 130
            sys.exit(_interrupted())
        raise
    except KeyboardInterrupt:
        sys.exit(_interrupted())
    except Exception:  # a crash: its traceback, secrets masked (a message may quote a header or a URL)
        import traceback

        from cptkit.core.redact import redact_text  # deferred: logging (not for `cptkit --help`)

        sys.stderr.write(redact_text(traceback.format_exc()))
        sys.exit(1)


def _interrupted() -> int:
    """Say what an interrupted run kept; its exit status (130 for Ctrl-C, 143 for SIGTERM)."""
    from cptkit.core.progress import console  # deferred: rich

    console.print(interrupted_message(), soft_wrap=True, markup=False, highlight=False)
    return interrupted_exit_code()


if __name__ == "__main__":
    main()
