"""Benchmark tasks as data: lm-evaluation-harness style YAML, few-shot prompts, scoring.

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

Few-shot sampling reproduces lm-eval's: one ``random.Random(fewshot_seed)`` per task, drawn
from in test-document order; ``rnd.sample(pool, n)`` (``n + 1`` minus the document itself when
the few-shot split is the test split).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import random
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from cptkit.core.errors import BadInput, CptkitError
from cptkit.eval import formats as F
from cptkit.eval.stats import mean_metrics

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


# --- loading ------------------------------------------------------------------------------------
def task_dir(ec: Any) -> str:
    """The task YAML directory of an ``eval`` config section (default: conf/eval/tasks)."""
    from cptkit.core.config import CONF_DIR

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


def hf_offline() -> bool:
    """True when the Hugging Face hub must not be contacted (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``)."""
    import os

    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host (``HF_ENDPOINT``, default huggingface.co) accepts a connection.

    Checked once per process, so an offline machine gets its one-line "no data" error at once
    instead of after ``datasets``' retries (~25 s per task, logged)."""
    import os
    from urllib.parse import urlsplit

    from cptkit.core.net import reachable

    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return reachable(url.hostname or "huggingface.co", url.port or 443, timeout)


def _data_format(task: EvalTask, split: str, p: Path) -> str:
    fmt = task.spec.get("data_format")
    if isinstance(fmt, dict):
        fmt = fmt.get(split)
    if fmt:
        return str(fmt)
    name = p.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        return "jsonl"
    return name.rsplit(".", 1)[-1] if "." in name else "dir"


def _missing(task: EvalTask, split: str, p: Path | None, why: str) -> CptkitError:
    how = str(task.spec.get("download") or "").replace("{data_dir}", str(task.data_dir)).strip()
    hub = task.spec.get("hub")
    online = f"; online, unset HF_HUB_OFFLINE to read the hub dataset {hub['path']}" if hub and hf_offline() else ""
    return F.MissingData(f"eval task {task.name}: no data for split {split!r} ({why}). "
                         f"{how or f'put the files at {p}'}{online}")


def _from_hub(task: EvalTask, split: str) -> list[dict]:
    import datasets

    hub = task.spec["hub"]
    names = hub.get("names") or [hub.get("name")]
    split_name = (hub.get("splits") or {}).get(split, split)
    docs: list[dict] = []
    for name in names:
        ds = datasets.load_dataset(hub["path"], name, split=split_name, revision=hub.get("revision"))
        docs += [dict(r) | ({"subject": name} if len(names) > 1 else {}) for r in ds]
    return docs


def load_docs(task: EvalTask, split: str) -> list[dict]:
    """The documents of one split: local files in the dataset's own format, else the hub (when online).

    Missing data is an error naming what to download and where to put it (the task's
    ``download`` line); nothing is ever substituted.
    """
    if split in task.docs:
        return task.docs[split]
    p = task.data_path(split)
    if p is not None and not p.exists() and task.spec.get("builder"):
        from cptkit.eval.build_tasks import build

        build(str(task.spec["builder"]), task.data_dir)
    opts = dict(task.spec.get("format_options") or {})
    if p is not None and p.exists():
        fmt = _data_format(task, split, p)
        if fmt in F.READERS:
            try:
                docs = F.read(fmt, p, split, opts)
            except F.MissingData as e:
                raise _missing(task, split, p, str(e)) from None
        else:
            import datasets

            if p.is_dir():
                ds = datasets.load_from_disk(str(p))
                ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
            else:
                if fmt not in ("csv", "parquet", "arrow"):
                    raise CptkitError(f"eval task {task.name}: cannot read {p} (set data_format: one of "
                                      f"{', '.join(F.READERS)}, or use .jsonl, .json, .csv, .parquet)")
                ds = datasets.load_dataset(fmt, data_files={split: str(p)}, split=split)
            docs = [dict(r) for r in ds]
    elif task.spec.get("hub") and not hf_offline():
        if not hub_reachable():
            raise _missing(task, split, p, f"not at {p}, and the hub ({task.spec['hub']['path']}) is unreachable")
        try:
            docs = _from_hub(task, split)
        except Exception as e:  # noqa: BLE001 - any hub failure is a user-facing "no data"
            raise _missing(task, split, p, f"not at {p}, and the hub dataset {task.spec['hub']['path']} failed: "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    else:
        raise _missing(task, split, p, f"not at {p}" if p is not None else "no data_files entry")
    if not docs:
        raise CptkitError(f"eval task {task.name}: split {split!r} is empty ({p})")
    if p is not None and p.exists():
        task.sources[split] = str(p)
    else:
        hub = task.spec["hub"]
        task.sources[split] = f"hub:{hub['path']}@{hub.get('revision') or 'unpinned'}"
    task.docs[split] = docs
    return docs


# --- templates (lm-eval semantics) --------------------------------------------------------------
_ENV = None


TEMPLATE_KEYS = ("doc_to_text", "doc_to_choice", "doc_to_target", "doc_to_gold", "description")


class TemplateError(CptkitError):
    """A task template that does not render: a missing field, bad syntax, or an attribute the sandbox refuses."""


def _jinja():
    """The template environment: Jinja's immutable sandbox, so a shared task file cannot reach
    Python internals (``cycler.__init__.__globals__``...) or mutate the documents."""
    global _ENV
    if _ENV is None:  # jinja2 is imported on first use, not for --help
        from jinja2 import StrictUndefined
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        _ENV = ImmutableSandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)
        _ENV.filters["regex_replace"] = lambda s, pat, rep: re.sub(pat, rep, s)
    return _ENV


def render(template: Any, doc: dict) -> Any:
    """A field name gives ``doc[field]``; a string is a Jinja2 template (sandboxed); a list is rendered itemwise."""
    if isinstance(template, list):
        return [render(t, doc) for t in template]
    if isinstance(template, int):
        return template
    if isinstance(template, str) and template in doc:
        return doc[template]
    from jinja2.exceptions import SecurityError  # loaded by _jinja() already: a dictionary lookup

    try:
        return _jinja().from_string(str(template)).render(**doc)
    except SecurityError as e:
        raise TemplateError(f"template {str(template)[:60]!r} refused by the template sandbox: {e}") from None
    except Exception as e:  # noqa: BLE001 - jinja raises many types; report as bad task data
        raise TemplateError(f"template {str(template)[:60]!r}: {e}") from None


@contextlib.contextmanager
def naming_file(task: EvalTask) -> Iterator[None]:
    """Report a template error inside the block as one line naming the task file."""
    try:
        yield
    except TemplateError as e:
        raise BadInput(str(task.path), None, str(e)) from None


def check_templates(task: EvalTask) -> None:
    """Render the task's templates on its first test document, so a template the sandbox refuses
    (or one naming a missing field) fails before any model is loaded, naming the task file."""
    docs = load_docs(task, task.spec["test_split"])
    if not docs:
        return
    with naming_file(task):
        for key in TEMPLATE_KEYS:
            t = task.spec.get(key)
            for part in (t.values() if isinstance(t, dict) else [t] if t is not None else []):
                render(part, docs[0])


def doc_to_text(task: EvalTask, doc: dict) -> str:
    """The question; with ``multiple_inputs`` the gold choice's context (what a shot shows)."""
    if task.spec.get("multiple_inputs"):
        choices = doc_to_choice(task, doc)
        return choices[gold_index(task, doc, choices)]
    return str(render(task.spec["doc_to_text"], doc))


def doc_to_choice(task: EvalTask, doc: dict) -> list[str]:
    t = task.spec["doc_to_choice"]
    if isinstance(t, dict):
        return [str(render(v, doc)) for v in t.values()]
    v = render(t, doc)
    if isinstance(v, str):
        v = ast.literal_eval(v)
    return [str(c) for c in v]


def _list_literal(v: Any) -> Any:
    """lm-eval's reading of a rendered target: text ``[...]`` that parses as a Python literal is that value."""
    s = v.strip() if isinstance(v, str) else ""
    if len(s) >= 2 and s[0] == "[" and s[-1] == "]":
        try:
            return ast.literal_eval(s)
        except (SyntaxError, ValueError):
            pass
    return v


def doc_to_target(task: EvalTask, doc: dict) -> Any:
    """The target: an index (multiple choice), a text, or a list of texts (a rendered list literal, as lm-eval)."""
    v = render(task.spec["doc_to_target"], doc)
    if isinstance(v, str) and task.output_type == MC and v.strip().isdigit() and not task.spec.get("multiple_inputs"):
        return int(v.strip())
    return _list_literal(v)


def gold_index(task: EvalTask, doc: dict, choices: list[str]) -> int:
    """The index of the correct choice (target is an index or the choice text; with ``multiple_inputs``
    ``doc_to_text`` is the index)."""
    if task.spec.get("multiple_inputs"):
        t = render(task.spec["doc_to_text"], doc)
        t = int(t) if isinstance(t, str) and t.strip().isdigit() else t
    else:
        t = doc_to_target(task, doc)
    if isinstance(t, bool) or not isinstance(t, (int, str)):
        raise CptkitError(f"eval task {task.name}: target {t!r} is neither an index nor a choice")
    if isinstance(t, int):
        if not 0 <= t < len(choices):
            raise CptkitError(f"eval task {task.name}: target index {t} out of range for {len(choices)} choices")
        return t
    if t not in choices:
        raise CptkitError(f"eval task {task.name}: target {t!r} is not among the choices")
    return choices.index(t)


def answer_text(task: EvalTask, doc: dict) -> str:
    """The answer as shown after a few-shot example."""
    if task.spec.get("multiple_inputs"):
        return str(render(task.spec["doc_to_target"], doc))
    t = doc_to_target(task, doc)
    if task.output_type == MC and isinstance(t, int):
        return doc_to_choice(task, doc)[t]
    if isinstance(t, list):
        return str(t[0])
    return str(t)


# --- prompts ------------------------------------------------------------------------------------
def sample_fewshot(task: EvalTask, rnd: random.Random, n: int, doc: dict, same_split: bool,
                   pool: list[dict]) -> list[dict]:
    """lm-eval's ``ContextSampler.sample`` / ``FirstNSampler.sample``."""
    if n <= 0:
        return []
    if task.get("fewshot_sampler", "default") == "first_n":
        cand = [x for x in pool if x != doc] if same_split else pool
        if n > len(cand):
            raise CptkitError(f"eval task {task.name}: {n} shots requested, {len(cand)} few-shot documents")
        return cand[:n]
    if (n + 1 if same_split else n) > len(pool):
        raise CptkitError(f"eval task {task.name}: {n} shots requested, {len(pool)} few-shot documents")
    if not same_split:
        return rnd.sample(pool, n)
    res = [x for x in rnd.sample(pool, n + 1) if x != doc][:n]
    if len(res) < n:
        res = rnd.sample([x for x in pool if x != doc], n)
    return res


def build_context(task: EvalTask, doc: dict, shots: list[dict]) -> str:
    """description + shots (``q + target_delimiter + answer + fewshot_delimiter``) + the question.

    Shots are rendered with ``is_fewshot`` and ``few_shot`` set (lm-eval's MBPP and Minerva
    templates show the solution for shots and score the test list / final answer otherwise).
    """
    tdel = task.get("target_delimiter", " ")
    fdel = task.get("fewshot_delimiter", "\n\n")
    parts = []
    desc = str(render(task.spec["description"], doc)) if task.spec.get("description") else ""
    if desc:  # lm-eval: an empty rendered description adds nothing
        parts.append(desc + fdel)
    for s in shots:
        s = {**s, "is_fewshot": True, "few_shot": "1"}
        a = answer_text(task, s)
        q = doc_to_text(task, s)
        parts.append(q + (tdel if a != "" else "") + a + fdel)
    parts.append(doc_to_text(task, doc))
    return "".join(parts)


def contexts(task: EvalTask, docs: list[dict], num_fewshot: int, seed: int) -> list[str]:
    """Few-shot contexts for ``docs`` in order, sampled as lm-eval does.

    With ``fewshot_group: FIELD`` (MMLU's subject, BBH's task) shots come only from documents
    with the test document's value, each group with its own ``random.Random(seed)``: lm-eval's
    per-subtask tasks.
    """
    if num_fewshot <= 0:
        return [build_context(task, d, []) for d in docs]
    fs_split = task.get("fewshot_split") or task.spec["test_split"]
    pool = load_docs(task, fs_split)
    same = fs_split == task.spec["test_split"]
    group = task.spec.get("fewshot_group")
    if not group:
        rnd = random.Random(seed)
        return [build_context(task, d, sample_fewshot(task, rnd, num_fewshot, d, same, pool)) for d in docs]
    pools: dict[Any, list[dict]] = {}
    for x in pool:
        pools.setdefault(x.get(group), []).append(x)
    rnds: dict[Any, random.Random] = {}
    out = []
    for d in docs:
        g = d.get(group)
        if g not in pools:
            raise CptkitError(f"eval task {task.name}: no few-shot documents with {group}={g!r} in split {fs_split!r}")
        rnd = rnds.setdefault(g, random.Random(seed))
        out.append(build_context(task, d, sample_fewshot(task, rnd, num_fewshot, d, same, pools[g])))
    return out


# --- metrics ------------------------------------------------------------------------------------
def mc_predictions(lls: list[float], choices: list[str]) -> tuple[int, int]:
    """``(argmax LL, argmax LL / len(choice))``: lm-eval's ``acc`` and ``acc_norm`` predictions.

    Ties go to the first choice (``numpy.argmax``); the length is in characters of the choice
    without the target delimiter.
    """
    def argmax(xs: list[float]) -> int:
        best = 0
        for i, x in enumerate(xs):
            if x > xs[best]:
                best = i
        return best

    return argmax(lls), argmax([ll / float(len(c)) for ll, c in zip(lls, choices, strict=True)])


_NUM = re.compile(r"-?[$]?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def last_number(text: str) -> str | None:
    """The last number in ``text`` (GSM8K's flexible extraction): commas, ``$`` and a trailing dot dropped."""
    found = _NUM.findall(text)
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "").rstrip(".")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``), braces balanced."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    i = text.find("{", idx)
    if i < 0:
        m = re.match(r"\\boxed ([^\s$]+)", text[idx:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


def normalize_math(s: str) -> str:
    """Light MATH-style normalization: spaces, ``\\left``/``\\right``, ``dfrac``, ``$``, units of degrees."""
    s = s.strip().strip("$").rstrip(".")
    for a, b in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("dfrac", "frac"), ("tfrac", "frac"),
                 ("^\\circ", ""), ("^{\\circ}", ""), ("\\$", ""), ("\\%", ""), ("%", ""), (" ", "")):
        s = s.replace(a, b)
    m = re.fullmatch(r"\\frac\{?(-?\d+)\}?\{?(\d+)\}?", s)
    if m:
        s = f"{m.group(1)}/{m.group(2)}"
    return s


def normalize_squad(s: str) -> str:
    """SQuAD's official answer normalisation (also TriviaQA's): lower case, no punctuation, no articles."""
    s = "".join(ch for ch in s.lower() if ch not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def extract(text: str, method: str | None) -> str | None:
    """Answer extraction: ``last_number`` | ``boxed`` | ``minerva`` | ``squad`` | ``regex:<pattern>`` (group 1) | ``none``.

    ``minerva``: the ``Final Answer: The final answer is X. I hope it is correct.`` line of the
    Minerva prompt (Lewkowycz et al. 2022), normalised like ``boxed``. ``squad``: the text
    normalised by :func:`normalize_squad`.
    """
    if not method or method == "none":
        return text.strip()
    if method == "squad":
        return normalize_squad(text)
    if method == "last_number":
        return last_number(text)
    if method == "boxed":
        b = last_boxed(text)
        return normalize_math(b) if b is not None else None
    if method == "minerva":
        m = re.findall(r"Final Answer: The final answer is(.*?)\. I hope it is correct\.", text)
        return normalize_math(m[-1]) if m else None
    if method.startswith("regex:"):
        m = re.findall(method[len("regex:"):], text)
        if not m:
            return None
        last = m[-1]
        return (last[0] if isinstance(last, tuple) else last).strip()
    raise CptkitError(f"answer extraction {method!r}: use last_number, boxed, minerva, squad, regex:<pattern> or none")


def answers_match(pred: str | None, gold: str | None) -> bool:
    """Exact match after extraction; numbers compare by value (``72.0 == 72``, ``1/2 == 0.5``)."""
    if pred is None or gold is None:
        return False
    if pred == gold:
        return True
    try:
        return Fraction(pred) == Fraction(gold)
    except (ValueError, ZeroDivisionError):
        return False


# --- running a task -----------------------------------------------------------------------------
def run_task(model, tokenizer, task: EvalTask, num_fewshot: int | None = None, limit: int | None = None,
             seed: int = 1234, batch_size: int = 8, max_gen_toks: int | None = None,
             max_length: int | None = None, on_batch=None,
             allow_unsandboxed: bool = False) -> tuple[dict[str, Any], list[dict]]:
    """Score ``task``: ``(metrics, per-item records)``. Metrics: acc/acc_norm, acc (loglikelihood) or
    exact_match, with stderr."""
    from cptkit.models import lm

    shots = int(task.get("num_fewshot", 0)) if num_fewshot is None else int(num_fewshot)
    test = load_docs(task, task.spec["test_split"])
    docs = test[:limit] if limit else test
    ctxs = contexts(task, docs, shots, seed)
    items: list[dict] = []
    tdel = task.get("target_delimiter", " ")

    def score(reqs: list[tuple[str, str]]) -> list[tuple[float, bool]]:
        out: list[tuple[float, bool]] = []
        for b in range(0, len(reqs), batch_size * 8):
            out += lm.loglikelihood(model, tokenizer, reqs[b:b + batch_size * 8], batch_size=batch_size,
                                    max_length=max_length)
            if on_batch:
                on_batch(len(reqs[b:b + batch_size * 8]))
        return out

    if task.output_type == MC:
        items = _score_choices(task, docs, ctxs, score)
        metrics = mean_metrics(items, ["acc", "acc_norm"])
    elif task.output_type == LL:
        targets = [tdel + answer_text(task, d) for d in docs]
        for i, (d, t, (ll, greedy)) in enumerate(zip(docs, targets, score(list(zip(ctxs, targets, strict=True))),
                                                     strict=True)):
            items.append({"doc": i, "id": item_id(task, d, i), "gold": t, "ll": ll, "acc": float(greedy)})
        metrics = mean_metrics(items, ["acc"])
    else:
        gk = dict(task.get("generation_kwargs", {}))
        until = list(gk.get("until", [task.get("fewshot_delimiter", "\n\n")]))
        mgt = int(max_gen_toks or gk.get("max_gen_toks", 256))
        ce = dict(task.spec.get("code_eval") or {})
        n_samples = int(ce.get("n", 1)) if ce else 1
        temperature = float(ce.get("temperature", 0.0)) if n_samples > 1 else 0.0
        reps = [c for c in ctxs for _ in range(n_samples)]
        outs: list[str] = []
        for b in range(0, len(reps), batch_size):
            outs += lm.generate_until(model, tokenizer, reps[b:b + batch_size], until=until, max_gen_toks=mgt,
                                      batch_size=batch_size, max_length=max_length, temperature=temperature,
                                      top_p=float(ce.get("top_p", 1.0)), seed=seed + b)
            if on_batch:
                on_batch(len(reps[b:b + batch_size]) / n_samples)
        items, metrics = _score_generations(task, docs, outs, ce, n_samples, allow_unsandboxed)
    metrics |= {"n": len(items), "num_fewshot": shots}
    for it, d in zip(items, docs, strict=True):
        it["question"] = doc_to_text(task, d)
    return metrics, items


def _score_choices(task: EvalTask, docs: list[dict], ctxs: list[str], score: Any) -> list[dict]:
    """Multiple choice: one log-likelihood request per choice (``multiple_inputs``: one context per choice and
    the shared continuation, lm-eval's partial scoring); acc and acc_norm per item."""
    tdel = task.get("target_delimiter", " ")
    reqs, spans = [], []
    for d, c in zip(docs, ctxs, strict=True):
        choices = doc_to_choice(task, d)
        gold = gold_index(task, d, choices)
        if task.spec.get("multiple_inputs"):  # the shots (c ends with the gold choice), then each choice
            cont = tdel + answer_text(task, d)
            shots_ctx = c[:len(c) - len(choices[gold])]
            pairs, lens = [(shots_ctx + ch, cont) for ch in choices], [cont] * len(choices)
        else:
            pairs, lens = [(c, tdel + ch) for ch in choices], choices
        spans.append((len(reqs), lens, gold))
        reqs += pairs
    lls = score(reqs)
    items = []
    for i, (d, (start, lens, gold)) in enumerate(zip(docs, spans, strict=True)):
        ll = [x for x, _ in lls[start:start + len(lens)]]
        pred, pred_norm = mc_predictions(ll, lens)
        items.append({"doc": i, "id": item_id(task, d, i), "gold": gold, "pred": pred, "pred_norm": pred_norm,
                      "acc": float(pred == gold), "acc_norm": float(pred_norm == gold), "lls": ll})
    return items


def _score_generations(task: EvalTask, docs: list[dict], outs: list[str], ce: dict[str, Any], n_samples: int,
                       allow_unsandboxed: bool) -> tuple[list[dict], dict[str, Any]]:
    """Generative items: shell commands run and compared (``cmd_eval``), programs run (``code_eval``: pass@k),
    or the extracted answer matched against the references (exact_match)."""
    if task.spec.get("cmd_eval") is not None:
        from cptkit.eval.cmdgen import aggregate, score_cmdgen

        gold_t = task.spec.get("doc_to_gold", task.spec["doc_to_target"])  # raw: `[ "$x" ]` is a command, no list
        golds = [str(render(gold_t, d)).strip() for d in docs]
        items = score_cmdgen(golds, [item_id(task, d, i) for i, d in enumerate(docs)], outs,
                             dict(task.spec.get("cmd_eval") or {}))
        return items, aggregate(items)
    if ce:
        items = score_code(task, docs, [outs[i * n_samples:(i + 1) * n_samples] for i in range(len(docs))], ce,
                           allow_unsandboxed=allow_unsandboxed)
        return items, mean_metrics(items, [f"pass@{k}" for k in code_ks(ce, n_samples)])
    items = []
    for i, (d, out) in enumerate(zip(docs, outs, strict=True)):
        golds = [extract(g, task.spec.get("gold_extraction")) for g in gold_texts(task, d)]
        pred = extract(out, task.spec.get("answer_extraction"))
        items.append({"doc": i, "id": item_id(task, d, i), "gold": golds[0] if len(golds) == 1 else golds,
                      "pred": pred, "output": out, "exact_match": float(any(answers_match(pred, g) for g in golds))})
    return items, mean_metrics(items, ["exact_match"])


def gold_texts(task: EvalTask, doc: dict) -> list[str]:
    """The references of a generative item (``doc_to_gold``, default ``doc_to_target``): one, or a list (any matches)."""
    v = _list_literal(render(task.spec.get("doc_to_gold", task.spec["doc_to_target"]), doc))
    return [str(x) for x in v] if isinstance(v, (list, tuple)) and v else [str(v)]


def item_id(task: EvalTask, doc: dict, i: int) -> str:
    """An item's id: its ``id_field`` value, else its position in the test split."""
    f = task.spec.get("id_field")
    return str(doc.get(f, i)) if f else str(i)


def code_ks(ce: dict, n_samples: int) -> list[int]:
    ks = [int(k) for k in (ce.get("k") or [1])]
    bad = [k for k in ks if k > n_samples]
    if bad:
        raise CptkitError(f"code_eval: pass@{bad[0]} needs n >= {bad[0]} samples per problem (n={n_samples})")
    return ks


def score_code(task: EvalTask, docs: list[dict], completions: list[list[str]], ce: dict,
               allow_unsandboxed: bool = False) -> list[dict]:
    """Run every completion's program (``code_eval.program``, Jinja2 with ``completion``) in the sandbox."""
    from concurrent.futures import ThreadPoolExecutor

    from cptkit.eval.code_exec import pass_at_k, run_program

    n = len(completions[0]) if completions else 1
    ks = code_ks(ce, n)
    progs = [[str(render(ce["program"], {**d, "completion": c})) for c in cs] for d, cs in zip(docs, completions, strict=True)]
    flat = [p for ps in progs for p in ps]

    def one(prog: str) -> tuple[str, str]:  # (status, network): the kept stderr (<= 128 kB each) is not needed
        r = run_program(prog, timeout=float(ce.get("timeout", 10)), memory_mb=int(ce.get("memory_mb", 1024)),
                        max_file_mb=int(ce.get("max_file_mb", 1)), allow_unsandboxed=allow_unsandboxed)
        return r.status, r.network

    with ThreadPoolExecutor(max_workers=int(ce.get("workers", 2))) as ex:
        res = list(ex.map(one, flat))
    items = []
    for i, (d, cs) in enumerate(zip(docs, completions, strict=True)):
        rs = res[i * n:(i + 1) * n]
        c = sum(status == "passed" for status, _ in rs)
        it = {"doc": i, "id": item_id(task, d, i), "n": n, "correct": c, "status": [status for status, _ in rs],
              "output": cs[0] if n == 1 else cs, "network": rs[0][1] if rs else None}
        for k in ks:
            it[f"pass@{k}"] = pass_at_k(n, c, k)
        items.append(it)
    return items


def metric_names(items: list[dict]) -> list[str]:
    """The per-item metrics present (acc, acc_norm, exact_match, pass@k)."""
    if not items:
        return []
    return [k for k in items[0] if k in ("acc", "acc_norm", "exact_match") or k.startswith("pass@")]


def split_metrics(items: list[dict], hit_ids: set[str]) -> dict[str, dict[str, float]]:
    """Metrics on the clean and on the contaminated items (ids in ``hit_ids``), each with its n."""
    names = metric_names(items)
    out = {}
    for part, sel in (("clean", [it for it in items if it["id"] not in hit_ids]),
                      ("contaminated", [it for it in items if it["id"] in hit_ids])):
        if items and "cmd_sim" in items[0]:  # CmdGen: output_sim and sr over the executable items
            from cptkit.eval.cmdgen import aggregate

            out[part] = aggregate(sel)
        else:
            out[part] = mean_metrics(sel, names) | {"n": len(sel)}
    return out
