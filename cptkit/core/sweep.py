"""``-m`` multiruns: the same step function under ``@hydra.main`` (basic or submitit launchers).

``cptkit corrupt --in qa/ --out 'qa_c{corrupt.ratio}/' -m corrupt.ratio=0.0,0.3,0.5`` runs one
member per value. Members never share an output: a ``{key}`` placeholder in ``--out`` names
it, otherwise each member writes to ``OUT/<its overrides>``. Launchers: the basic one (in
process, sequential), ``hydra/launcher=submitit_local`` and ``hydra/launcher=submitit_slurm``
(``hydra.launcher.partition=...``), where a sweep becomes a SLURM job array.
"""

from __future__ import annotations

import itertools
import sys

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from cptkit.core.config import (
    CONF_DIR,
    compose_step,
    config_group,
    finalize,
    primary_config,
    schema_of,
)
from cptkit.core.discovery import execute, step_module
from cptkit.core.errors import CptkitError
from cptkit.core.redact import install_log_redaction, redact_text

# Keys that never name a member's output: where data lives, and job-array slices.
# shard.index is left out too: the members of a job array over input shards share one output.
NOT_IN_DIRNAME = ["io.inputs", "io.output", "io.overwrite", "io.skip_bad_lines", "quiet", "sweep", "shard.index"]


def swept_keys(overrides: list[str]) -> set[str]:
    """Keys that take several values in a sweep (``a=1,2``, ``b=range(0,4)``, ``c=choice(x,y)``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    keys = {o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()}
    for o in parsed:  # +sweep=NAME: the keys of conf/sweep/NAME.yaml's sweeper params
        if o.get_key_element().lstrip("+~") in ("sweep", "hydra.sweeper.params"):
            path = CONF_DIR / "sweep" / f"{o.value()}.yaml"
            if path.exists():
                params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params") or {}
                keys |= {str(k) for k in params}
    return keys


def member_dirname(task_overrides: list[str], swept: set[str]) -> str:
    """``key=value`` of a member's swept keys (the ones that distinguish it), sorted, comma-joined."""
    parts = []
    for ov in task_overrides:
        key = ov.split("=", 1)[0].lstrip("+~")
        if key in swept and key not in NOT_IN_DIRNAME:
            parts.append(ov.lstrip("+~").replace("/", "_"))
    return ",".join(sorted(parts))


def member_output(out: str | None, override_dirname: str) -> str | None:
    """Output directory of one sweep member (placeholders are filled later by the step)."""
    if out is None or out == "-" or "{" in str(out) or not override_dirname:
        return out
    return f"{str(out).rstrip('/')}/{override_dirname}"


def check_config_files(step: str, overrides: list[str]) -> None:
    """Compose (unresolved, unrun) the configs the sweep's members read, so a config file that is
    not plain YAML (a ``!!python`` tag under ``hydra.searchpath``) is one line here, as in a single
    run, not the traceback Hydra prints: once with every sweep at its first value, and once per other
    value of a swept config group (``mix=a,b``), whose files only those members read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    base: list[str] = []
    group_values: list[tuple[int, str]] = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if not o.is_sweep_override():
            base.append(o.input_line)
            continue
        key = o.get_key_element()
        try:
            values = o.sweep_string_iterator()
            first = next(values)
        except (HydraException, StopIteration):  # glob(...): resolved by Hydra's sweeper, left out here
            continue
        base.append(f"{key}={first}")
        if config_group(key.lstrip("+~")):
            group_values += [(len(base) - 1, f"{key}={v}") for v in itertools.islice(values, 64)]
    compose_step(step, base, resolve=False)
    for i, ov in group_values:
        compose_step(step, [*base[:i], ov, *base[i + 1:]], resolve=False)


def multirun(step: str, overrides: list[str]) -> None:
    """Run ``step`` as a Hydra multirun over ``overrides`` (sweeps like ``a=1,2,3``)."""
    for ov in overrides:
        if redact_text(ov) != ov:
            raise CptkitError(f"-m: {redact_text(ov)} carries a secret, and Hydra writes a sweep's overrides to "
                              "disk (multirun.yaml, .hydra/): pass it by environment variable instead "
                              "(docs/records.md, Secrets)")
    install_log_redaction()
    config_name = primary_config(step)
    swept = swept_keys(overrides)

    @hydra.main(version_base=None, config_path=str(CONF_DIR), config_name=config_name)
    def _main(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        step_module(step)  # a member may run in a fresh process (a SLURM job): the step registers its schema
        try:
            # a plain copy without Hydra's node, typed again as the step's schema (as compose_step returns it)
            cfg = OmegaConf.merge(OmegaConf.structured(schema_of(step)), OmegaConf.to_container(cfg, resolve=False))
            cfg = finalize(cfg, step, list(hc.overrides.task))
            OmegaConf.set_struct(cfg, False)
            cfg.io.output = member_output(cfg.io.output, member_dirname(list(hc.overrides.task), swept))
            OmegaConf.set_struct(cfg, True)
            return execute(step, cfg)
        except CptkitError as e:  # one line naming the member, not Hydra's traceback; the sweep stops (exit 2)
            member = " ".join(ov for ov in hc.overrides.task if ov.split("=", 1)[0].lstrip("+~") in swept)
            print(f"error: {step} -m member {member}: {redact_text(str(e))}", file=sys.stderr)
            raise SystemExit(2) from None

    argv = sys.argv
    sys.argv = [f"cptkit-{step}", "-m", *overrides]
    check_config_files(step, overrides)
    try:
        _main()
    finally:
        sys.argv = argv
