"""Benchmark tasks as data: the task file (lm-evaluation-harness style YAML) and its checks.

A task file ``conf/eval/tasks/<name>.yaml`` uses a subset of lm-eval's task keys, with the same
meaning (see docs/evaluate.md): ``task``, ``version``, ``output_type`` (``multiple_choice`` |
``generate_until`` | ``loglikelihood``), ``data_files`` (split -> local file; ``{data_dir}`` is
filled in), ``hub`` (``{path, name}``, used when no local file exists), ``test_split``, ``fewshot_split``,
``num_fewshot``, ``fewshot_sampler`` (``default`` | ``first_n``), ``doc_to_text``,
``doc_to_choice``, ``doc_to_target``, ``target_delimiter``, ``fewshot_delimiter``,
``description``, ``metric_list``, ``generation_kwargs`` (``until``, ``max_gen_toks``),
``multiple_inputs`` (lm-eval's partial scoring, Winograd/Winogrande: ``doc_to_choice`` gives one
context per choice, ``doc_to_target`` the continuation they share, ``doc_to_text`` the gold
index); and the cptkit additions ``doc_to_gold`` (the reference for generative scoring, default
``doc_to_target``), ``answer_extraction`` / ``gold_extraction`` (``last_number`` | ``boxed`` |
``minerva`` | ``squad`` | ``regex:<pattern>`` | ``none``), ``doc_to_decontamination_query`` (lm-eval's key: the text
matched by ``evaluate-contamination``; default question + answer) and ``builder`` (a :mod:`cptkit.eval.build_tasks` builder that
writes missing local data), ``code_eval`` (run generated programs: pass@k) and ``cmd_eval`` (run
generated shell commands: CmdGen's six metrics, :mod:`cptkit.eval.cmdgen`).

``loglikelihood`` scores ``acc``: whether ``target_delimiter + doc_to_target`` is the model's
greedy continuation of the context (lm-eval's ``lambada_openai`` acc; the Gauntlet's
"language modeling" accuracy). A ``doc_to_target`` that renders a list literal is a list of
targets (lm-eval): shots show the first, ``generate_until`` matches any.

A task's documents are fetched by :mod:`cptkit.eval.task_data`, its templates rendered by
:mod:`cptkit.eval.templates`, its few-shot prompts built by :mod:`cptkit.eval.fewshot`, and its
items scored by :mod:`cptkit.eval.runner` (answers extracted and compared by
:mod:`cptkit.eval.answers`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cptkit.core.config import CONF_DIR
from cptkit.core.errors import BadInput, CptkitError

MC = "multiple_choice"
GEN = "generate_until"
LL = "loglikelihood"
KNOWN_KEYS = {
    "task", "version", "about", "output_type", "data_files", "hub", "builder", "test_split", "fewshot_split",
    "num_fewshot", "fewshot_sampler", "doc_to_text", "doc_to_choice", "doc_to_target", "doc_to_gold",
    "target_delimiter", "fewshot_delimiter", "description", "metric_list", "generation_kwargs",
    "answer_extraction", "gold_extraction", "id_field", "doc_to_decontamination_query", "should_decontaminate",
    "data_format", "format_options", "download", "fewshot_group", "code_eval", "cmd_eval", "multiple_inputs",
}


@dataclass
class EvalTask:
    """A loaded task definition (the YAML as a dict plus where it came from)."""

    name: str
    spec: dict[str, Any]
    path: Path
    data_dir: Path
    docs: dict[str, list[dict]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # split -> where its documents came from

    @property
    def output_type(self) -> str:
        return self.spec["output_type"]

    @property
    def version(self) -> Any:
        return self.spec.get("version", 0)

    def get(self, key: str, default: Any = None) -> Any:
        v = self.spec.get(key)
        return default if v is None else v

    def data_path(self, split: str) -> Path | None:
        files = self.spec.get("data_files") or {}
        if split not in files:
            return None
        p = Path(str(files[split]).replace("{data_dir}", str(self.data_dir))).expanduser()
        return p if p.is_absolute() else (self.path.parent / p)

    def hash(self) -> str:
        """sha256 of the YAML and of the local data it reads, files or whole folders (first 16 hex digits)."""
        h = hashlib.sha256(self.path.read_bytes())
        for split in sorted(self.spec.get("data_files") or {}):
            p = self.data_path(split)
            if p is None or not p.exists():
                continue
            h.update(split.encode())
            files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
            for f in files:
                h.update(str(f.relative_to(p)).encode() if f != p else b"")
                h.update(hashlib.sha256(f.read_bytes()).digest())
        return h.hexdigest()[:16]


def task_dir(ec: Any) -> str:
    """The task YAML directory of an ``eval`` config section (default: conf/eval/tasks)."""
    return str(ec.task_dir or CONF_DIR / "eval" / "tasks")


def load_task(name: str, task_dir: str | Path, data_dir: str | Path) -> EvalTask:
    """Read ``<task_dir>/<name>.yaml`` (or a path to a YAML file) and validate its keys."""
    path = Path(name) if str(name).endswith((".yaml", ".yml")) else Path(task_dir) / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in Path(task_dir).glob("*.yaml")) if Path(task_dir).is_dir() else []
        raise CptkitError(f"eval task {name!r}: no {path} (tasks in {task_dir}: {', '.join(have) or 'none'})")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise BadInput(str(path), getattr(getattr(e, "problem_mark", None), "line", -1) + 1, "bad YAML") from None
    if not isinstance(spec, dict):
        raise BadInput(str(path), None, "a task file must be a YAML mapping")
    unknown = sorted(set(spec) - KNOWN_KEYS)
    if unknown:
        raise BadInput(str(path), None, f"unknown task keys: {', '.join(unknown)}")
    for key in ("output_type", "doc_to_text", "doc_to_target", "test_split"):
        if key not in spec:
            raise BadInput(str(path), None, f"missing key {key!r}")
    if spec["output_type"] not in (MC, GEN, LL):
        raise BadInput(str(path), None, f"output_type {spec['output_type']!r}: use {MC}, {GEN} or {LL}")
    if spec["output_type"] == MC and "doc_to_choice" not in spec:
        raise BadInput(str(path), None, "a multiple_choice task needs doc_to_choice")
    spec.setdefault("task", path.stem)
    return EvalTask(name=str(spec["task"]), spec=spec, path=path, data_dir=Path(str(data_dir)).expanduser().absolute())
