"""Every shipped config composes: each step's conf/<step>.yaml and each sweep in conf/sweep/."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cptkit.core.config import CONF_DIR, compose_step
from cptkit.core.discovery import step_module, step_names
from cptkit.core.errors import CptkitError

SWEEPS = {  # sweep -> (step, extra overrides it is meant to be used with)
    "corrupt_ratio": ("corrupt", []),
    "synthetic_ratio": ("build-mix", ["mix=synE_synthetic"]),
    "upsample_duration": ("build-mix", ["mix=upsample_tail"]),
    "ppl_curriculum": ("build-mix", ["mix=demo"]),
    "mixture_controller": ("train", []),
    "topic_alpha": ("train", ["train.mixture=topic_ppl"]),
    "learning_rate": ("train", ["recipe=synE_cpt"]),
}


@pytest.mark.parametrize("step", step_names())
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


@pytest.mark.parametrize("step", step_names())
def test_every_step_help_lists_its_config_keys(step):
    """`cptkit STEP --help` ends with every config key of the composed default config."""
    from omegaconf import OmegaConf

    from cptkit.core.help import config_help

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


# conf/<step>.yaml holds only what differs from the step's dataclass (`cptkit STEP --help` lists
# every key with its default). Each value it sets on purpose differently is listed with its reason.
INTENDED = {
    ("demo-corpus", "shard.max_bytes"): "demo shards roll over at 64 MiB (the shared default is 256 MiB)",
    ("label-topics-train", "train.fasttext.epoch"): "topic classifiers: the fallback fit when tuning is off",
    ("label-topics-train", "train.fasttext.lr"): "topic classifiers: the fallback fit when tuning is off",
}


def _leaves(d: dict, prefix: str = ""):
    """(dotted key, value) of every value a YAML mapping sets; an empty mapping is a value."""
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _same(default, value) -> bool:
    numbers = (int, float)
    return default == value or (isinstance(value, numbers) and isinstance(default, numbers)
                                and not isinstance(value, bool) and float(default) == float(value))


def yaml_problems(step: str, text: str) -> list[str]:
    """What is wrong with ``text`` as conf/<step>.yaml: a key repeating the dataclass default, a
    value differing from it without an INTENDED entry, an INTENDED entry the file does not set.
    Allowed: the defaults list (schema, group choices, _self_), interpolations (${oc.env:...}),
    entries of open dict fields (synth.domains.*) and the INTENDED differences."""
    import dataclasses

    from omegaconf import DictConfig, OmegaConf

    from cptkit.core.config import schema_of

    step_module(step)
    schema = schema_of(step)
    assert schema is not None, f"{step} registers no schema"
    ref = OmegaConf.structured(schema)
    name = f"conf/{step.replace('-', '_')}.yaml"
    raw = yaml.safe_load(text) or {}
    problems = []
    defaults = raw.pop("defaults", None) or []
    if not defaults or defaults[0] != f"_schema_{step.replace('-', '_')}" or "_self_" not in defaults:
        problems.append(f"{name}: the defaults list must start with _schema_{step.replace('-', '_')} and hold _self_")
    seen = set()
    for key, value in _leaves(raw):
        node, parts, open_entry = ref, key.split("."), False  # open_entry: nothing to compare
        for i, part in enumerate(parts):
            if not dataclasses.is_dataclass(OmegaConf.get_type(node)):
                open_entry = True  # below a dict/Any field: its entries are the YAML's to set
                break
            if part not in node:
                problems.append(f"{name}: {key} is not a key of the step's schema")
                open_entry = True
                break
            parent, node = node, node._get_node(part)
            if i < len(parts) - 1 and not isinstance(node, DictConfig):
                problems.append(f"{name}: {key}: {'.'.join(parts[:i + 1])} is not a section")
                open_entry = True
                break
        if open_entry:
            continue
        default = OmegaConf.to_container(parent, resolve=False)[parts[-1]]
        if _same(default, value):
            problems.append(f"{name}: {key}: {value!r} repeats the dataclass default; delete it "
                            f"(`cptkit {step} --help` shows defaults)")
        elif isinstance(value, str) and "${" in value:
            continue  # an interpolation / env-var setting (${oc.env:...})
        elif (step, key) not in INTENDED:
            problems.append(f"{name}: {key}: {value!r} differs from the dataclass default {default!r}; "
                            "list it with its reason in tests/test_conf.py INTENDED (or change the dataclass)")
        seen.add(key)
    problems += [f"{name}: INTENDED lists {key}, which the file does not set differently"
                 for s, key in INTENDED if s == step and key not in seen]
    return problems


@pytest.mark.parametrize("step", [s for s in step_names() if (CONF_DIR / f"{s.replace('-', '_')}.yaml").exists()])
def test_yaml_holds_only_differences_from_the_dataclass(step):
    """conf/<step>.yaml repeats no default (repeats had drifted: train.lr 1e-5 vs 1e-4); what it
    sets differently is listed in INTENDED."""
    problems = yaml_problems(step, (CONF_DIR / f"{step.replace('-', '_')}.yaml").read_text())
    assert not problems, "\n".join(problems)


def test_a_yaml_repeating_a_default_fails():
    head = "defaults:\n  - _schema_build_mix\n  - mix: demo\n  - _self_\n"
    assert yaml_problems("build-mix", head) == []
    for body, key in [("tokenizer: null\n", "tokenizer"), ("seed: 0\n", "seed"),
                      ("build_mix:\n  batch_docs: 256.0\n", "build_mix.batch_docs"),
                      ("shard:\n  max_bytes: 1024\n", "shard.max_bytes")]:
        problems = yaml_problems("build-mix", head + body)
        assert len(problems) == 1 and problems[0].startswith(f"conf/build_mix.yaml: {key}: "), problems
    assert "repeats the dataclass default" in yaml_problems("build-mix", head + "seed: 0\n")[0]
    assert "INTENDED" in yaml_problems("build-mix", head + "shard:\n  max_bytes: 1024\n")[0]
    ok = "tokenizer: ${oc.env:TOK,smollm2}\n"  # an interpolation is not a default repeated
    assert yaml_problems("build-mix", head + ok) == []
    synth = "defaults:\n  - _schema_synthesize_qa\n  - _self_\nsynth:\n  domains:\n    physics: [aps.org]\n"
    assert yaml_problems("synthesize-qa", synth) == []  # an open dict's entries
    assert yaml_problems("synthesize-qa", synth + "  mode: scientific\n")[0].startswith(
        "conf/synthesize_qa.yaml: synth.mode: ")
    topics = "defaults:\n  - _schema_label_topics_train\n  - _self_\n"
    assert len(yaml_problems("label-topics-train", topics)) == 2  # INTENDED keys no longer set
