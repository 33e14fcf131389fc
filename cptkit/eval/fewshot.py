"""Few-shot prompts: shots sampled as lm-eval samples them and joined into each test document's context.

Few-shot sampling reproduces lm-eval's: one ``random.Random(fewshot_seed)`` per task, drawn
from in test-document order; ``rnd.sample(pool, n)`` (``n + 1`` minus the document itself when
the few-shot split is the test split).
"""

from __future__ import annotations

import random
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.eval.task_data import load_docs
from cptkit.eval.tasks import EvalTask
from cptkit.eval.templates import answer_text, doc_to_text, render


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
