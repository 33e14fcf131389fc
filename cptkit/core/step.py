"""The shape of a step: one module in ``cptkit/steps/``, one declaration, the framework does the rest.

A step module's docstring starts with ``name: what it does`` (the command's help), defines its
typed config (a :class:`cptkit.core.config.JobConfig` dataclass validated in ``__post_init__``) and
declares its work with :func:`step`::

    @step("score-quality", ScoreQualityJob, order=70)  # options: DATA (--in --out -q --skip-bad-lines)
    def run(conf: ScoreQualityJob, ctx: Run) -> dict:
        return ScoreQuality(conf, ctx).run()

The framework composes the config (Hydra + the dataclass schema), validates it once, converts it
once and hands the step two read-only objects: ``conf``, the typed config (what the step
computes), and ``ctx``, a :class:`cptkit.core.run.Run` (where it reads and writes, its slice of a
job array, and the config the manifest records). The declaration returns a :class:`Step`; calling
it with a composed config runs the step (``run(compose_step("score-quality", overrides))``).

From that declaration come the Typer command ``cptkit score-quality`` (options mapped onto config
keys, ``--cfg``, ``--help`` listing every config key), the Hydra schema ``_schema_score_quality``
that ``conf/score_quality.yaml`` extends, and the runner used by single runs, multiruns and job
arrays (:func:`cptkit.core.discovery.execute`). Adding a step takes one file; ``order`` places it in
``cptkit --help`` (pipeline order; a step without one is listed last, by name).

Most steps map records to records (score, label, corrupt, filter). Their work is one subclass of
:class:`MapStep`::

    class ScoreQuality(MapStep):
        stats_key = "dropped"
        batch_key = "batch_size"          # where the batch size is in the typed config

        def setup(self):                  # self.conf: the typed ScoreQualityJob, self.ctx: the Run
            self.scorers = [...]          # load models once, fail early on bad settings

        def process(self, batch, stats):  # a list of records -> the records to write
            ...
            stats["dropped (quality < 0.5)"] += 1
            return kept

        def summary(self, total):         # merged stats of every task -> summary/manifest rows
            return dict(total)

:meth:`MapStep.run` owns everything else, the same for every step: the tasks of this process's
slice and their resume markers (:class:`cptkit.core.job.Job`), batching, per-task stats and timing
stored in each task's marker, their merge across tasks, earlier runs and other processes (like
datatrove's ``Stats``), the summary table and the manifest.
"""

from __future__ import annotations

import functools
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from cptkit.core.config import register_step
from cptkit.core.job import Hooks, Job
from cptkit.core.records import Record
from cptkit.core.registry import Registry
from cptkit.core.run import Run, with_paths

Stats = Counter  # str -> int counters of one task; merged by addition


def map_batches(records: Iterable[Record], batch_size: int,
                fn: Callable[[list[Record], Stats], Iterable[Record]], stats: Stats) -> Iterator[Record]:
    """Apply ``fn`` to consecutive batches of ``batch_size`` records (the last may be shorter)."""
    batch: list[Record] = []
    for rec in records:
        batch.append(rec)
        if len(batch) >= batch_size:
            yield from fn(batch, stats)
            batch = []
    if batch:
        yield from fn(batch, stats)


class MapStep(ABC):
    """A step that maps batches of records to records; subclasses implement :meth:`process`."""

    stats_key: ClassVar[str] = "stats"  # key of the task stats in each completion marker
    batch_key: ClassVar[str] = "batch_size"  # dotted path of the batch size in the typed config

    def __init__(self, conf: Any, ctx: Run, batch_size: int | None = None) -> None:
        self.conf: Any = conf  # the step's typed config dataclass
        self.ctx = ctx  # what Job reads: I/O, slice, the recorded config
        self.batch_size = int(batch_size or functools.reduce(getattr, self.batch_key.split("."), self.conf))
        self.setup()

    def setup(self) -> None:
        """Load models and check settings once, before any task runs (``self.conf`` is set)."""
        return None

    @abstractmethod
    def process(self, batch: list[Record], stats: Stats) -> Iterable[Record]:
        """The records to write for ``batch`` (changed in place or new), counting into ``stats``."""

    def summary(self, total: Stats) -> dict[str, Any]:
        """Summary-table and manifest rows from the stats of every finished task."""
        return dict(sorted(total.items()))

    def hooks(self) -> Hooks | None:
        """The :class:`cptkit.core.job.Hooks` of this step's Job (none by default)."""
        return None

    def reads(self) -> list[Any]:
        """Files and directories the step reads besides its inputs (models): they key the output too."""
        return []

    def run(self) -> dict[str, Any]:
        """Run every pending task of this process's slice; finish the output when all are done."""
        with Job(self.ctx, hooks=self.hooks(), reads=self.reads()) as job:
            total = job.run_map(lambda recs, stats: map_batches(recs, self.batch_size, self.process, stats),
                                self.stats_key)
            return job.finish(extra=self.summary(total))


# --- the declaration: one decorator per step module ---------------------------------------


@dataclass(frozen=True)
class Option:
    """A command-line option of a step and the config key it sets (``--queries F`` ->
    ``retrieve.queries=[F]``). ``multiple``: repeatable, sets a list; ``flag``: a switch, sets true."""

    flags: tuple[str, ...]
    key: str
    help: str
    multiple: bool = False
    flag: bool = False
    metavar: str = "PATH"

    @property
    def dest(self) -> str:
        return self.key.replace(".", "__")

    def override(self, value: Any) -> str | None:
        """The Hydra override for the option's parsed value (None: not given)."""
        if self.flag:
            return f"{self.key}=true" if value else None
        if self.multiple:
            return f"{self.key}=[" + ",".join(quote(v) for v in value) + "]" if value else None
        return None if value is None else f"{self.key}={quote(value)}"


def quote(value: Any) -> str:
    """A value quoted for Hydra's override grammar."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


IN = Option(("--in", "-i"), "io.inputs", "Input: file, directory of shards, glob, or - (stdin). Repeatable.",
            multiple=True)
OUT = Option(("--out", "-o"), "io.output",
             "Output directory (or - for stdout). {key} placeholders are filled from the config.")
QUIET = Option(("--quiet", "-q"), "quiet", "No progress bar, no summary table.", flag=True)
SKIP_BAD = Option(("--skip-bad-lines",), "io.skip_bad_lines", "Skip and count malformed input lines instead of failing.",
                  flag=True)
ALLOW_PARTIAL = Option(("--allow-partial",), "io.allow_partial",
                       "Read an input step output that has no _SUCCESS (its shards may be partial).", flag=True)
DATA = (IN, OUT, QUIET, SKIP_BAD, ALLOW_PARTIAL)  # the options of a step that maps input shards to output shards


Setting = str | int | float | bool | None  # a config value a phase sets


def render(key: str, value: Setting) -> str:
    """The Hydra override setting ``key`` to ``value``: ``true``/``null`` for a bool/None; a string
    stays a string (quoted unless it is a plain word that Hydra would not read as another type)."""
    if value is None or isinstance(value, bool):
        text = "null" if value is None else str(value).lower()
    elif isinstance(value, str):
        plain = re.fullmatch(r"[A-Za-z_][\w.\-/]*", value) and value.lower() not in ("true", "false", "null", "nan", "inf")
        text = value if plain else quote(value)
    else:
        text = repr(value)
    return f"{key}={text}"


@dataclass(frozen=True)
class Phase:
    """One phase of a multi-phase step, run as a wave: every slice (``shard.index`` of
    ``shard.count``) runs it with the config values ``settings`` (``{"dedup.phase": "map"}``), and
    the next phase starts once all have finished. ``leader``: slice 0 runs it first, alone (it
    computes what the others then reuse)."""

    name: str
    settings: Mapping[str, Setting] = field(default_factory=dict)
    leader: bool = False

    def overrides(self) -> list[str]:
        """The phase's settings as Hydra overrides, in their order."""
        return [render(k, v) for k, v in self.settings.items()]

    def __hash__(self) -> int:  # frozen, and hashable though ``settings`` is a dict
        return hash((self.name, tuple(self.settings.items()), self.leader))


@dataclass(frozen=True)
class Member:
    """One unit of an executor's work: slice ``index`` of ``count`` running ``phase``."""

    index: int
    count: int
    phase: Phase

    def shared(self) -> list[str]:
        """The overrides every member of this member's wave has: its slice count and phase."""
        return [f"shard.count={self.count}", *self.phase.overrides()]

    def overrides(self) -> list[str]:
        """What the member's process adds to the run's overrides (its slice, then :meth:`shared`)."""
        return [f"shard.index={self.index}", *self.shared()]


@dataclass(frozen=True)
class Wave:
    """Members that run at once; the next wave starts when every one has finished. Its members are
    consecutive slices (``first`` to ``last``) of one phase; ``number``: its place in the plan, from 1."""

    number: int
    phase: Phase
    members: tuple[Member, ...]

    @property
    def first(self) -> int:
        return self.members[0].index

    @property
    def last(self) -> int:
        return self.members[-1].index


def waves(phases: list[Phase], n: int) -> list[Wave]:
    """The waves of ``phases`` over ``n`` slices, in order (a leader phase is two: slice 0, then the others)."""
    plan: list[Wave] = []

    def wave(ph: Phase, indices: range) -> Wave:
        return Wave(len(plan) + 1, ph, tuple(Member(i, n, ph) for i in indices))

    for ph in phases:
        if ph.leader:
            plan.append(wave(ph, range(1)))
            if n > 1:
                plan.append(wave(ph, range(1, n)))
        else:
            plan.append(wave(ph, range(n)))
    return plan


@dataclass(frozen=True)
class Step:
    """A step as declared by :func:`step`: everything the CLI, Hydra and sweeps need. Calling it
    with a composed config runs it (the one code path of single runs, sweeps, arrays and Ray)."""

    name: str
    schema: type  # the root config dataclass (a JobConfig), stored as Hydra schema ``_schema_<name>``
    body: Callable[[Any, Run], Any]  # the work, on the typed config and the run's infrastructure
    options: tuple[Option, ...] = DATA  # command-line options (``--cfg`` and ``--help`` are added)
    order: float | None = None  # place in ``cptkit --help`` (None: after the ordered steps, by name)
    phases: Callable[[Any], list[Phase]] | None = None  # the phases of a scaled-out run (None: one)

    def plan(self, cfg: Any, n: int) -> list[Wave]:
        """The waves of a run over ``n`` slices, from the composed ``cfg``."""
        return waves(self.phases(cfg) if self.phases is not None else [Phase(self.name)], n)

    def __call__(self, cfg: DictConfig) -> Any:
        """Fill ``--out``/``--in`` placeholders, convert the composed ``cfg`` once, run the body."""
        cfg = with_paths(cfg)
        return self.body(OmegaConf.to_object(cfg), Run.of(cfg))


# every declared step by name, filled as step modules are imported (cptkit.core.discovery.step_module);
# a name declared by two modules is an error naming both
STEPS: Registry[Step] = Registry("step", origin=lambda s: s.body.__module__)


def step(name: str, schema: type, options: tuple[Option, ...] = DATA, order: float | None = None,
         phases: Callable[[Any], list[Phase]] | None = None) -> Callable[[Callable[[Any, Run], Any]], Step]:
    """Declare the decorated ``run(conf, ctx)`` as step ``name``: its config schema (registered for
    ``conf/<name>.yaml`` to extend) and its command-line options. The Typer command, its
    ``--help`` (the module docstring's first paragraph, then every config key), multiruns and
    the runner are generated from this one declaration. A name declared by two modules is an
    error at import. ``order`` places the command in ``cptkit --help`` (pipeline order; a literal
    number, read from the source without importing the module: :func:`cptkit.core.discovery.step_order`).
    ``phases(cfg)``: a multi-phase step's :class:`Phase` list, which executors run as waves
    (``executor.workers=N`` locally, ``executor=ray``, ``executor=slurm``); a plain run (one
    process) runs its body once, and the body handles every phase it can."""

    def declare(body: Callable[[Any, Run], Any]) -> Step:
        decl = STEPS.register(name, Step(name, schema, body, tuple(options), order, phases))
        register_step(name, schema)
        return decl

    return declare
