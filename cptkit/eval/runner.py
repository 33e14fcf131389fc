"""Scoring a task on a model: the requests it sends (log-likelihoods, generations), each item's
score (acc/acc_norm, exact match, programs' pass@k, CmdGen's metrics) and the task's metrics,
overall and on clean vs contaminated items."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.eval.answers import answers_match, extract, mc_predictions
from cptkit.eval.cmdgen import aggregate, score_cmdgen
from cptkit.eval.code_exec import pass_at_k, run_program
from cptkit.eval.fewshot import contexts
from cptkit.eval.stats import mean_metrics
from cptkit.eval.task_data import load_docs
from cptkit.eval.tasks import LL, MC, EvalTask
from cptkit.eval.templates import (
    answer_text,
    doc_to_choice,
    doc_to_text,
    gold_index,
    gold_texts,
    render,
)


def limited(docs: list[dict], limit: int | None, sample_seed: int | None = None) -> list[dict]:
    """``limit`` test items: the first ``limit``, or with ``sample_seed`` that many drawn at random
    (seeded, in their file order), so that each seed of an experiment scores its own sample."""
    if not limit or limit >= len(docs):
        return list(docs)
    if sample_seed is None:
        return docs[:limit]
    import random

    return [docs[i] for i in sorted(random.Random(sample_seed).sample(range(len(docs)), limit))]


def run_task(model, tokenizer, task: EvalTask, num_fewshot: int | None = None, limit: int | None = None,
             seed: int = 1234, batch_size: int = 8, max_gen_toks: int | None = None,
             max_length: int | None = None, on_batch=None,
             allow_unsandboxed: bool = False, sample_seed: int | None = None) -> tuple[dict[str, Any], list[dict]]:
    """Score ``task``: ``(metrics, per-item records)``. Metrics: acc/acc_norm, acc (loglikelihood) or
    exact_match, with stderr. ``limit`` items: the first ones, or with ``sample_seed`` a seeded draw
    (:func:`limited`)."""
    from cptkit.models import scoring  # deferred: imports torch

    shots = int(task.get("num_fewshot", 0)) if num_fewshot is None else int(num_fewshot)
    test = load_docs(task, task.spec["test_split"])
    docs = limited(test, limit, sample_seed)
    ctxs = contexts(task, docs, shots, seed)
    items: list[dict] = []
    tdel = task.get("target_delimiter", " ")

    def score(reqs: list[tuple[str, str]]) -> list[tuple[float, bool]]:
        out: list[tuple[float, bool]] = []
        for b in range(0, len(reqs), batch_size * 8):
            out += scoring.loglikelihood(model, tokenizer, reqs[b:b + batch_size * 8], batch_size=batch_size,
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
            outs += scoring.generate_until(model, tokenizer, reps[b:b + batch_size], until=until, max_gen_toks=mgt,
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
            out[part] = aggregate(sel)
        else:
            out[part] = mean_metrics(sel, names) | {"n": len(sel)}
    return out
