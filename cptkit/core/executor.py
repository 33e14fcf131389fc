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

Executor settings are words of the command line, not config keys (like ``hydra/launcher=``):
they are not part of a run's identity, its config hash or its manifest.

* ``executor=local`` (default), ``executor=ray`` or ``executor=slurm``
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cptkit.core import remote
from cptkit.core.config import compose_step
from cptkit.core.discovery import execute, step_module
from cptkit.core.errors import CptkitError, print_error
from cptkit.core.net import reachable
from cptkit.core.progress import log, print_summary, setup_logging
from cptkit.core.step import Step
from cptkit.core.workers import in_workers

KEYS = ("workers", "address", "num_cpus")
GCS_GRACE = 10.0  # seconds a cluster's control store may stay unreachable before the run fails
POLL = 1.0  # seconds between two looks at the cluster


@dataclass
class ExecutorSpec:
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
            if value not in ("local", "ray", "slurm"):
                raise CptkitError(f"executor={value!r}: must be local, ray or slurm")
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


def _member(step: str, overrides: list[str]) -> dict[str, Any]:
    """One slice, in a worker process or a Ray worker: the same code path as ``cptkit STEP`` (errors come back as text)."""
    step_module(step)
    try:
        result = execute(step, compose_step(step, overrides))
    except CptkitError as e:
        return {"error": str(e)}
    return {"result": {k: v for k, v in (result or {}).items() if isinstance(v, int | float | str)}}


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


def run_waves(decl: Step, overrides: list[str], cfg: Any, n: int, where: str,
              launch: Callable[[int, list[list[str]]], list[dict[str, Any]]]) -> dict[str, Any]:
    """Run ``decl``'s waves over ``n`` slices, ``launch(wave, members)`` running each wave's
    members (their full overrides) at once; check the output is finished, print the summary, and
    return the last member's result."""
    plan = decl.plan(cfg, n)
    t0, last = time.time(), {}
    for w, members in enumerate(plan):
        log.info("%s: wave %d/%d, %d members", where, w + 1, len(plan), len(members))
        outcomes = launch(w, [overrides + ["quiet=true"] + m for m in members])
        for m, o in zip(members, outcomes, strict=True):
            if "error" in o:
                raise CptkitError(f"{where} member {' '.join(m)}: {o['error']}")
        last = outcomes[-1]["result"]
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


def run_executor(decl: Step, overrides: list[str], cfg: Any, spec: ExecutorSpec) -> dict[str, Any]:
    """Run ``decl`` with ``spec``: local worker processes, Ray, or SLURM job arrays."""
    setup_logging(bool(cfg.get("quiet", False)))
    _need_out(cfg, spec.kind)
    if spec.kind == "ray":
        return run_ray(decl, overrides, cfg, spec)
    if spec.kind == "slurm":
        return submit_slurm(decl, overrides, cfg, spec)
    n = spec.workers or 1

    def launch(w: int, members: list[list[str]]) -> list[dict[str, Any]]:
        got = dict(in_workers(n, range(len(members)), lambda k: _member(decl.name, members[k])))
        return [got[k] for k in range(len(members))]

    return run_waves(decl, overrides, cfg, n, "local", launch)


def submit_slurm(decl: Step, overrides: list[str], cfg: Any, spec: ExecutorSpec) -> dict[str, Any]:
    """Submit ``decl``'s waves as SLURM job arrays, each depending on the previous one
    (``--dependency=afterok``); returns the job ids. Set sbatch's options (partition, time, ...)
    by its ``SBATCH_*`` environment variables; the jobs run in this directory with this environment."""
    if not spec.workers:
        raise CptkitError("executor=slurm needs executor.workers=N: the slices of each job array")
    n, ids = spec.workers, []
    for w, members in enumerate(decl.plan(cfg, n)):
        first, last = (int(m[0].partition("=")[2]) for m in (members[0], members[-1]))
        words = [sys.executable, "-m", "cptkit", decl.name, *overrides, "quiet=true", *members[0][1:]]
        cmd = f"{shlex.join(words)} shard.index=$SLURM_ARRAY_TASK_ID"
        argv = ["sbatch", "--parsable", f"--array={first}-{last}", f"--job-name=cptkit-{decl.name}-{w + 1}"]
        argv += [f"--dependency=afterok:{ids[-1]}"] if ids else []
        try:
            done = subprocess.run([*argv, "--wrap", cmd], capture_output=True, text=True, check=False)
        except FileNotFoundError:
            raise CptkitError("executor=slurm needs sbatch on PATH (a SLURM login node)") from None
        if done.returncode != 0:
            raise CptkitError(f"sbatch (wave {w + 1}) failed: {(done.stderr or done.stdout).strip()[:300]}")
        ids.append(done.stdout.strip().split(";")[0])
        log.info("slurm: wave %d submitted as job array %s (slices %d-%d)", w + 1, ids[-1], first, last)
    print_summary(f"cptkit {decl.name} on slurm", {"executor": "slurm", "members per wave": n, "waves": len(ids),
                                                    "jobs": " ".join(ids)}, bool(cfg.get("quiet", False)))
    return {"jobs": ids}


def run_ray(decl: Step, overrides: list[str], cfg: Any, spec: ExecutorSpec) -> dict[str, Any]:
    """Run ``decl`` as waves of Ray tasks; returns the last member's result."""
    try:
        import ray  # heavy, and optional: only for executor=ray
    except ImportError:
        raise CptkitError("executor=ray needs Ray: pip install 'ray>=2.9'") from None
    address = spec.address or os.environ.get("RAY_ADDRESS")
    if address and address != "auto" and not address.startswith("ray://") and not answers(address):
        raise CptkitError(f"executor.address={address}: no Ray cluster answers there")
    started = not ray.is_initialized()
    if started:
        # Workers import cptkit from the same place as this process.
        env = {"env_vars": {k: os.environ[k] for k in ("PYTHONPATH", "CPTKIT_CONF_DIR") if k in os.environ}}
        ray.init(address=address, runtime_env=env, log_to_driver=False, include_dashboard=False,
                 logging_level="ERROR", **({} if address else {"num_cpus": spec.workers or None}))
    watch = ClusterWatch(ray.get_runtime_context().gcs_address, address or "the local cluster")
    watch.start()
    try:
        n = spec.workers or max(1, int(ray.cluster_resources().get("CPU", 1) // spec.num_cpus))
        remote = ray.remote(num_cpus=spec.num_cpus, max_retries=0)(_member)

        def launch(w: int, members: list[list[str]]) -> list[dict[str, Any]]:
            try:
                return ray.get([remote.remote(decl.name, m) for m in members])
            except ray.exceptions.RayError as e:  # a member's exception, a dead node or worker
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise CptkitError(f"ray wave {w + 1} on {watch.name}: {type(cause).__name__}: {str(cause).splitlines()[0]}") from None

        return run_waves(decl, overrides, cfg, n, "ray", launch)
    finally:
        watch.stop()
        if started:
            ray.shutdown()
