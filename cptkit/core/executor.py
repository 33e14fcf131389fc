"""Run a step's slices as waves: ``executor.workers=N`` (local processes), ``executor=ray``, ``executor=slurm``.

A step already splits its work into tasks and runs the slice ``shard.index`` of ``shard.count``
(docs/scaleout.md). An executor launches ``N`` slices in *waves*: every member of a wave runs at
once, and a wave starts when the previous one has finished. Most steps are one wave of ``N``
slices; a multi-phase step declares its phases (``@step(..., phases=...)``,
:class:`cptkit.core.step.Phase`), one wave each, a leader phase as two (slice 0, then the
others). Each member composes the same config with its ``shard.*`` (and phase) overrides and
calls the same step function as a local run, so the output is the local run's, byte for byte
(``tests/test_ray.py``, ``tests/test_step.py``). Locally the members are forked processes
(:mod:`cptkit.core.workers`); on Ray, Ray tasks; on SLURM, one job array per wave, each
depending on the previous one (``sbatch --dependency=afterok``), submitted and not waited for.

The work is typed: :meth:`cptkit.core.step.Step.plan` gives the :class:`~cptkit.core.step.Wave` s, each
a tuple of :class:`~cptkit.core.step.Member` s (slice ``index`` of ``count`` running a
:class:`~cptkit.core.step.Phase`); a member renders its own overrides for its process. An executor
is a class behind one small interface, :class:`Executor` (``run(decl, overrides, cfg)``), like
datatrove's ``PipelineExecutor``: :class:`WaveExecutor` runs the waves one after the other and
waits for each (its subclasses only say how to run one wave's members at once: :class:`LocalExecutor`,
:class:`RayExecutor`), :class:`SlurmExecutor` submits them and returns. ``executor=NAME`` picks the
class registered as NAME in :data:`EXECUTORS`, or a plugin ``package.module:Class``.

Executor settings are words of the command line, not config keys (like ``hydra/launcher=``):
they are not part of a run's identity, its config hash or its manifest.

* ``executor=local`` (default), ``executor=ray``, ``executor=slurm`` (or a registered name, or ``package.module:Class``)
* ``executor.workers=N``: slices per wave (local default: 1, the step in this process; Ray: the
  cluster's CPU count; SLURM: needed)
* ``executor.address=HOST:PORT`` or ``auto``: an existing cluster (default: ``$RAY_ADDRESS``,
  else a local cluster started for this run and stopped at its end)
* ``executor.num_cpus=C``: CPUs each member reserves (default 1)

A cluster that does not answer, or stops answering mid-run, fails the run in one line naming its
address (``GCS_GRACE`` seconds after it went away) instead of leaving the run waiting forever.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cptkit.core import remote
from cptkit.core.config import compose_step
from cptkit.core.discovery import execute, step_module
from cptkit.core.errors import CptkitError, print_error
from cptkit.core.net import reachable
from cptkit.core.progress import log, print_summary, setup_logging
from cptkit.core.registry import Registry
from cptkit.core.step import Member, Step, Wave
from cptkit.core.workers import in_workers

KEYS = ("workers", "address", "num_cpus")
GCS_GRACE = 10.0  # seconds a cluster's control store may stay unreachable before the run fails
POLL = 1.0  # seconds between two looks at the cluster


@dataclass
class ExecutorSpec:
    """The ``executor=`` and ``executor.KEY=`` words of a command line."""

    kind: str = "local"
    workers: int = 0
    address: str | None = None
    num_cpus: float = 1.0


def split_executor_args(words: list[str]) -> tuple[ExecutorSpec, list[str]]:
    """Take the ``executor=...`` and ``executor.KEY=...`` words out of the overrides."""
    spec, rest = ExecutorSpec(), []
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not (key == "executor" or key.startswith("executor.")):
            rest.append(word)
            continue
        if key == "executor":
            if value not in EXECUTORS and ":" not in value:
                raise CptkitError(f"executor={value!r}: must be one of {', '.join(EXECUTORS)} "
                                  "(or package.module:Class)")
            EXECUTORS.get(value)  # a plugin is imported and checked now, before any work
            spec.kind = value
            continue
        name = key.removeprefix("executor.")
        if name not in KEYS:
            raise CptkitError(f"unknown executor option {key!r} (known: {', '.join('executor.' + k for k in KEYS)})")
        try:
            if name == "workers":
                spec.workers = int(value)
                if spec.workers < 1:
                    raise ValueError
            elif name == "num_cpus":
                spec.num_cpus = float(value)
                if spec.num_cpus <= 0:
                    raise ValueError
            else:
                spec.address = value
        except ValueError:
            raise CptkitError(f"{key}={value!r}: must be a positive number") from None
    return spec, rest


@dataclass
class Outcome:
    """What one member's run gave: the step's result (its numbers and strings), or its error's text."""

    member: Member
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def run_member(step: str, overrides: list[str], member: Member) -> Outcome:
    """One member, in a worker process, a Ray worker or this process: the same code path as
    ``cptkit STEP`` with the run's ``overrides`` and the member's own (errors come back as text)."""
    step_module(step)
    try:
        result = execute(step, compose_step(step, [*overrides, *member.overrides()]))
    except CptkitError as e:
        return Outcome(member, error=str(e))
    return Outcome(member, {k: v for k, v in (result or {}).items() if isinstance(v, int | float | str)})


def answers(address: str) -> bool:
    """Whether something accepts TCP connections at ``HOST:PORT`` (a Ray cluster's GCS)."""
    host, _, port = address.rpartition(":")
    return port.isdigit() and reachable(host.strip("[]") or "127.0.0.1", int(port))


class ClusterWatch(threading.Thread):
    """Fails the run once the cluster's GCS at ``gcs`` stays unreachable for ``grace`` seconds: one line
    naming ``name`` (the address the user gave) and exit 2. Ray's own calls block for a minute or for
    ever when a cluster dies under them (``ray.get``, a task's first submission, ``cluster_resources``),
    so the watch runs beside them; the driver writes no data (the members do, each shard atomically),
    so exiting leaves nothing half-written."""

    def __init__(self, gcs: str, name: str, grace: float = GCS_GRACE):
        super().__init__(daemon=True, name="ray-cluster-watch")
        self.gcs, self.name, self.grace, self.stopped = gcs, name, grace, threading.Event()

    def run(self) -> None:
        down_since = None
        while not self.stopped.wait(POLL):
            if answers(self.gcs):
                down_since = None
                continue
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since >= self.grace and not self.stopped.is_set():
                print_error(CptkitError(f"ray cluster at {self.name} stopped answering "
                                        f"({self.grace:.0f} s without its GCS at {self.gcs})"))
                os._exit(CptkitError.exit_code)

    def stop(self) -> None:
        self.stopped.set()


def _need_out(cfg: Any, kind: str) -> None:
    if str(cfg.io.output) in ("-", "", "None"):
        raise CptkitError(f"executor={kind} needs --out DIR (the members share one output directory)")


def run_waves(decl: Step, cfg: Any, n: int, where: str, launch: Callable[[Wave], list[Outcome]]) -> dict[str, Any]:
    """Run ``decl``'s waves over ``n`` slices, ``launch(wave)`` running each wave's members at once;
    check the output is finished, print the summary, and return the last member's result."""
    plan = decl.plan(cfg, n)
    t0, last = time.time(), {}
    for wave in plan:
        log.info("%s: wave %d/%d, %d members", where, wave.number, len(plan), len(wave.members))
        outcomes = launch(wave)
        for m, o in zip(wave.members, outcomes, strict=True):
            if o.error is not None:
                raise CptkitError(f"{where} member {' '.join(m.overrides())}: {o.error}")
        last = outcomes[-1].result
    out = str(cfg.io.output)
    if remote.output_file(out, "_SUCCESS") is None and "{" not in out:
        raise CptkitError(f"{where}: every wave ran but {cfg.io.output} has no _SUCCESS")
    rows: dict[str, Any] = {"executor": where, "members per wave": n, "waves": len(plan)}
    manifest = remote.output_file(out, "_manifest.json")
    if manifest is not None:
        rows |= {k.replace("_", " "): v for k, v in json.loads(manifest)["counts"].items()}
    rows["seconds"] = time.time() - t0
    print_summary(f"cptkit {decl.name} on {where}", rows, bool(cfg.get("quiet", False)))
    return last


# --- the executors ----------------------------------------------------------------------------


class Executor(ABC):
    """Runs a step's slices somewhere: built from the command line's ``executor.*`` words (``spec``);
    ``self.name`` is the ``executor=`` word, used in log lines, errors and the summary."""

    def __init__(self, spec: ExecutorSpec) -> None:
        self.spec, self.name = spec, spec.kind

    @abstractmethod
    def run(self, decl: Step, overrides: list[str], cfg: Any) -> dict[str, Any]:
        """Run (or submit) every wave of ``decl.plan(cfg, n)``; ``overrides``: the run's own, which
        composed ``cfg``. Returns the last member's result (or what was submitted)."""


class WaveExecutor(Executor):
    """Runs the waves one after the other and waits for each: a subclass says how to run one wave's
    members at once (:meth:`launch`) and, if not ``executor.workers`` (default 1), how many slices
    a wave has (:meth:`slices`)."""

    def slices(self) -> int:
        return self.spec.workers or 1

    @abstractmethod
    def launch(self, step: str, overrides: list[str], wave: Wave) -> list[Outcome]:
        """Run every member of ``wave`` at once (each ``run_member(step, overrides, member)``, or
        the same in another process); their outcomes, in member order."""

    def run(self, decl: Step, overrides: list[str], cfg: Any) -> dict[str, Any]:
        member_overrides = [*overrides, "quiet=true"]
        return run_waves(decl, cfg, self.slices(), self.name,
                         lambda wave: self.launch(decl.name, member_overrides, wave))


# every executor by its ``executor=`` name; a plugin is ``executor=package.module:Class``
EXECUTORS: Registry[type[Executor]] = Registry("executor", base=Executor)


@EXECUTORS.register("local")
class LocalExecutor(WaveExecutor):
    """A wave's members as forked processes on this machine (:mod:`cptkit.core.workers`)."""

    def launch(self, step: str, overrides: list[str], wave: Wave) -> list[Outcome]:
        members = wave.members
        got = dict(in_workers(self.slices(), range(len(members)), lambda k: run_member(step, overrides, members[k])))
        return [got[k] for k in range(len(members))]


@EXECUTORS.register("ray")
class RayExecutor(WaveExecutor):
    """A wave's members as Ray tasks, on the cluster at ``executor.address`` (or one started for the
    run); the run fails in one line when that cluster stops answering (:class:`ClusterWatch`)."""

    def run(self, decl: Step, overrides: list[str], cfg: Any) -> dict[str, Any]:
        try:
            import ray  # heavy, and optional: only for executor=ray
        except ImportError:
            raise CptkitError("executor=ray needs Ray: pip install 'ray>=2.9'") from None
        spec = self.spec
        address = spec.address or os.environ.get("RAY_ADDRESS")
        if address and address != "auto" and not address.startswith("ray://") and not answers(address):
            raise CptkitError(f"executor.address={address}: no Ray cluster answers there")
        started = not ray.is_initialized()
        if started:
            # Workers import cptkit from the same place as this process.
            env = {"env_vars": {k: os.environ[k] for k in ("PYTHONPATH", "CPTKIT_CONF_DIR") if k in os.environ}}
            ray.init(address=address, runtime_env=env, log_to_driver=False, include_dashboard=False,
                     logging_level="ERROR", **({} if address else {"num_cpus": spec.workers or None}))
        self.ray = ray
        self.watch = ClusterWatch(ray.get_runtime_context().gcs_address, address or "the local cluster")
        self.watch.start()
        try:
            self.remote = ray.remote(num_cpus=spec.num_cpus, max_retries=0)(run_member)
            return super().run(decl, overrides, cfg)
        finally:
            self.watch.stop()
            if started:
                ray.shutdown()

    def slices(self) -> int:
        """``executor.workers``, else as many as the cluster's CPUs hold (``executor.num_cpus`` each)."""
        return self.spec.workers or max(1, int(self.ray.cluster_resources().get("CPU", 1) // self.spec.num_cpus))

    def launch(self, step: str, overrides: list[str], wave: Wave) -> list[Outcome]:
        try:
            return self.ray.get([self.remote.remote(step, overrides, m) for m in wave.members])
        except self.ray.exceptions.RayError as e:  # a member's exception, a dead node or worker
            cause = e.cause if getattr(e, "cause", None) is not None else e
            raise CptkitError(f"ray wave {wave.number} on {self.watch.name}: {type(cause).__name__}: "
                              f"{str(cause).splitlines()[0]}") from None


@EXECUTORS.register("slurm")
class SlurmExecutor(Executor):
    """Each wave as one SLURM job array (``--array=FIRST-LAST`` of its members' slices), each
    depending on the previous one (``--dependency=afterok``): submitted, not waited for. Set
    sbatch's options (partition, time, ...) by its ``SBATCH_*`` environment variables; the jobs run
    in this directory with this environment."""

    def run(self, decl: Step, overrides: list[str], cfg: Any) -> dict[str, Any]:
        """Submit every wave; returns the job ids."""
        if not self.spec.workers:
            raise CptkitError("executor=slurm needs executor.workers=N: the slices of each job array")
        n, ids = self.spec.workers, []
        for wave in decl.plan(cfg, n):
            ids.append(self.submit(decl.name, overrides, wave, ids[-1] if ids else None))
            log.info("slurm: wave %d submitted as job array %s (slices %d-%d)", wave.number, ids[-1], wave.first,
                     wave.last)
        print_summary(f"cptkit {decl.name} on slurm", {"executor": "slurm", "members per wave": n, "waves": len(ids),
                                                        "jobs": " ".join(ids)}, bool(cfg.get("quiet", False)))
        return {"jobs": ids}

    def submit(self, step: str, overrides: list[str], wave: Wave, after: str | None) -> str:
        """Submit ``wave`` as one job array (after job ``after`` succeeded); its job id. Every array
        task runs the members' shared overrides with its own ``shard.index``."""
        words = [sys.executable, "-m", "cptkit", step, *overrides, "quiet=true", *wave.members[0].shared()]
        cmd = f"{shlex.join(words)} shard.index=$SLURM_ARRAY_TASK_ID"
        argv = ["sbatch", "--parsable", f"--array={wave.first}-{wave.last}", f"--job-name=cptkit-{step}-{wave.number}"]
        argv += [f"--dependency=afterok:{after}"] if after else []
        try:
            done = subprocess.run([*argv, "--wrap", cmd], capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise CptkitError("executor=slurm needs sbatch on PATH (a SLURM login node)") from None
        if done.returncode != 0:
            raise CptkitError(f"sbatch (wave {wave.number}) failed: {(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout.strip().split(";")[0]


def run_executor(decl: Step, overrides: list[str], cfg: Any, spec: ExecutorSpec) -> dict[str, Any]:
    """Run ``decl`` with the executor ``spec`` names (local worker processes, Ray, SLURM job arrays, a plugin)."""
    setup_logging(bool(cfg.get("quiet", False)))
    _need_out(cfg, spec.kind)
    return EXECUTORS.get(spec.kind)(spec).run(decl, overrides, cfg)
