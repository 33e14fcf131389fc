"""Task templates with lm-eval's semantics, rendered in Jinja's immutable sandbox: a document's
question, choices, target, gold index and the answer a shot shows."""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Iterator
from typing import Any

from cptkit.core.errors import BadInput, CptkitError
from cptkit.eval.task_data import load_docs
from cptkit.eval.tasks import MC, EvalTask

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


def list_literal(v: Any) -> Any:
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
    return list_literal(v)


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



def gold_texts(task: EvalTask, doc: dict) -> list[str]:
    """The references of a generative item (``doc_to_gold``, default ``doc_to_target``): one, or a list (any matches)."""
    v = list_literal(render(task.spec.get("doc_to_gold", task.spec["doc_to_target"]), doc))
    return [str(x) for x in v] if isinstance(v, (list, tuple)) and v else [str(v)]
