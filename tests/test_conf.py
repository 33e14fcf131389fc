"""Every shipped config composes: each step's conf/<step>.yaml and each sweep in conf/sweep/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cptkit.cli import MODULES, step_module
from cptkit.config import CONF_DIR, compose_step
from cptkit.errors import CptkitError

SWEEPS = {  # sweep -> (step, extra overrides it is meant to be used with)
    "corrupt_ratio": ("corrupt", []),
    "synthetic_ratio": ("build-mix", ["mix=synE_synthetic"]),
    "upsample_duration": ("build-mix", ["mix=upsample_tail"]),
    "ppl_curriculum": ("build-mix", ["mix=demo"]),
    "mixture_controller": ("train", []),
    "topic_alpha": ("train", ["train.mixture=topic_ppl"]),
    "learning_rate": ("train", ["recipe=synE_cpt"]),
}


@pytest.mark.parametrize("step", sorted(MODULES))
def test_every_step_config_composes(step):
    step_module(step)
    cfg = compose_step(step, ["io.output=/tmp/x"])
    assert cfg.step == step and cfg.io.output == "/tmp/x"
    with pytest.raises(CptkitError, match="no_such_key"):
        compose_step(step, ["no_such_key.x=1"])


def test_every_sweep_is_listed():
    assert sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml")) == sorted(SWEEPS)


@pytest.mark.parametrize("sweep", sorted(SWEEPS))
def test_sweep_values_compose(sweep):
    step, extra = SWEEPS[sweep]
    step_module(step)
    params = yaml.safe_load(Path(CONF_DIR / "sweep" / f"{sweep}.yaml").read_text())["hydra"]["sweeper"]["params"]
    for key, values in params.items():
        for value in str(values).split(","):
            cfg = compose_step(step, [*extra, f"{key}={value}", f"+sweep={sweep}"])
            got = cfg
            for part in key.split("."):
                got = got[int(part)] if part.isdigit() else got[part]
            assert str(got) == value.strip() or float(got) == float(value)


def test_every_step_module_has_a_command():
    """cptkit/steps/<m>.py <-> a registered command (the CLI and the steps stay in sync)."""
    steps_dir = Path(__file__).resolve().parent.parent / "cptkit" / "steps"
    modules = {p.stem for p in steps_dir.glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(MODULES.values())


@pytest.mark.parametrize("step", sorted(MODULES))
def test_every_step_help_lists_its_config_keys(step):
    """`cptkit STEP --help` ends with every config key of the composed default config."""
    from omegaconf import OmegaConf

    from cptkit.cli_help import config_help

    text = config_help(step)
    cfg = compose_step(step)
    leaves = {k for k in _leaf_keys(OmegaConf.to_container(cfg, resolve=True)) if k not in ("step", "overrides")}
    listed = {ln.split("=", 1)[0].strip() for ln in text.splitlines()[1:] if "=" in ln and ln.startswith("  ") and not ln.startswith("   ")}
    assert listed and all(any(leaf == k or leaf.startswith(k + ".") for k in listed) for leaf in leaves), \
        sorted(leaves - listed)
    assert "shard.max_records=0" in text and "io.max_record_chars=5000000" in text


def _leaf_keys(obj, prefix: str = "") -> list[str]:
    if isinstance(obj, dict) and obj:
        return [k for key, v in obj.items() for k in _leaf_keys(v, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


# A step's YAML may set a shared dataclass's field differently on purpose; each such key is listed.
INTENDED = {
    ("demo-corpus", "shard.max_bytes"): "demo shards roll over at 64 MiB (the shared default is 256 MiB)",
    ("label-topics-train", "train.fasttext.epoch"): "topic classifiers: the fallback fit when tuning is off",
    ("label-topics-train", "train.fasttext.lr"): "topic classifiers: the fallback fit when tuning is off",
}


def _leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


@pytest.mark.parametrize("step", sorted(MODULES))
def test_yaml_defaults_agree_with_the_dataclass(step):
    """conf/<step>.yaml repeats a default only with the dataclass's value (they had drifted:
    train.lr 1e-5 vs 1e-4), unless the difference is listed in INTENDED."""
    from omegaconf import DictConfig, OmegaConf

    from cptkit.config import schema_of

    step_module(step)
    schema = schema_of(step)
    assert schema is not None, f"{step} registers no schema"
    ref = OmegaConf.structured(schema)
    raw = yaml.safe_load((CONF_DIR / f"{step.replace('-', '_')}.yaml").read_text()) or {}
    raw.pop("defaults", None)
    drift = []
    for key, value in _leaves(raw):
        node = OmegaConf.select(ref, key, throw_on_missing=False)
        if isinstance(node, DictConfig) or node is None or (isinstance(value, str) and "${" in value):
            continue  # open dicts, fields without a default, env interpolations
        default = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
        same = default == value or (isinstance(value, (int, float)) and isinstance(default, (int, float))
                                    and float(default) == float(value))
        if not same and (step, key) not in INTENDED:
            drift.append(f"{key}: yaml {value!r}, dataclass {default!r}")
    assert not drift, f"conf/{step}.yaml disagrees with its dataclass: " + "; ".join(drift)
