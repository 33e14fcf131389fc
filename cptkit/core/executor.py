"""Run a step's shard tasks on a Ray cluster: ``cptkit STEP ... executor=ray executor.workers=N``.

A step already splits its work into tasks and runs the slice ``shard.index`` of ``shard.count``
(docs/scaleout.md); a SLURM job array launches one process per slice. The Ray executor launches
the same slices as Ray tasks instead, in *waves*: every member of a wave runs at once, and a wave
starts when the previous one has finished. Most steps are one wave of ``N`` slices; dedup's
phases are several (map, reduce, then the final phase with slice 0 first, so that it computes the
clustering once and the other slices reuse it). Each member composes the same config with its
``shard.*`` overrides and calls the same step function as a local run, so the output is the
local run's, byte for byte (``tests/test_ray.py``).

Executor settings are words of the command line, not config keys (like ``hydra/launcher=``):
they are not part of a run's identity, its config hash or its manifest.

* ``executor=local`` (default) or ``executor=ray``
* ``executor.workers=N``: slices per wave (default: the cluster's CPU count)
* ``executor.address=HOST:PORT`` or ``auto``: an existing cluster (default: ``$RAY_ADDRESS``,
  else a local cluster started for this run and stopped at its end)
* ``executor.num_cpus=C``: CPUs each member reserves (default 1)

A cluster that does not answer, or stops answering mid-run, fails the run in one line naming its
address (``GCS_GRACE`` seconds after it went away) instead of leaving the run waiting forever.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cptkit.core.config import compose_step
from cptkit.core.discovery import execute, step_module
from cptkit.core.errors import CptkitError, print_error
from cptkit.core.net import reachable
from cptkit.core.progress import log, print_summary, setup_logging

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
            if value not in ("local", "ray"):
                raise CptkitError(f"executor={value!r}: must be local or ray")
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


def waves(step: str, cfg: Any, n: int) -> list[list[list[str]]]:
    """The members (their extra overrides) of each wave, in order."""
    def slices(extra: list[str], indices: range) -> list[list[str]]:
        return [[f"shard.index={i}", f"shard.count={n}", *extra] for i in indices]

    if step == "dedup":
        plan = [slices(["dedup.phase=map"], range(n))]
        if str(cfg.dedup.cluster) != "memory":
            plan.append(slices(["dedup.phase=reduce"], range(n)))
        plan.append(slices(["dedup.phase=final"], range(1)))
        if n > 1:
            plan.append(slices(["dedup.phase=final"], range(1, n)))
        return plan
    return [slices([], range(n))]


def _member(step: str, overrides: list[str]) -> dict[str, Any]:
    """One slice, in a Ray worker: the same code path as ``cptkit STEP`` (errors come back as text)."""
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


def run_ray(step: str, overrides: list[str], cfg: Any, spec: ExecutorSpec) -> dict[str, Any]:
    """Run ``step`` as waves of Ray tasks; returns the last member's result."""
    try:
        import ray
    except ImportError:
        raise CptkitError("executor=ray needs Ray: pip install 'ray>=2.9'") from None
    setup_logging(bool(cfg.get("quiet", False)))

    if str(cfg.io.output) in ("-", "", "None"):
        raise CptkitError("executor=ray needs --out DIR (the members share one output directory)")
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
        plan = waves(step, cfg, n)
        t0, last = time.time(), {}
        for w, members in enumerate(plan):
            log.info("ray: wave %d/%d, %d members", w + 1, len(plan), len(members))
            try:
                outcomes = ray.get([remote.remote(step, overrides + ["quiet=true"] + m) for m in members])
            except ray.exceptions.RayError as e:  # a member's exception, a dead node or worker
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise CptkitError(f"ray wave {w + 1} on {watch.name}: {type(cause).__name__}: {str(cause).splitlines()[0]}") from None
            for m, o in zip(members, outcomes, strict=True):
                if "error" in o:
                    raise CptkitError(f"ray member {' '.join(m)}: {o['error']}")
            last = outcomes[-1]["result"]
        if not (Path(str(cfg.io.output)) / "_SUCCESS").exists() and "{" not in str(cfg.io.output):
            raise CptkitError(f"ray: every wave ran but {cfg.io.output} has no _SUCCESS")
        rows: dict[str, Any] = {"executor": "ray", "members per wave": n, "waves": len(plan)}
        manifest = Path(str(cfg.io.output)) / "_manifest.json"
        if manifest.exists():
            rows |= {k.replace("_", " "): v for k, v in json.loads(manifest.read_text())["counts"].items()}
        rows["seconds"] = time.time() - t0
        print_summary(f"cptkit {step} on ray", rows, bool(cfg.get("quiet", False)))
        return last
    finally:
        watch.stop()
        if started:
            ray.shutdown()
