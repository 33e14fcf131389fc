"""Benchmark `evaluate` against lm-evaluation-harness on CPU, same model, same data, same run.

* perplexity: tokens/s of ``cptkit.models.scoring.document_losses`` vs lm-eval ``HFLM.loglikelihood_rolling``
  on real documents (Debian copyright files), with the total NLL of both;
* multiple choice: items/s of ``cptkit.eval.runner.run_task`` vs ``lm_eval.simple_evaluate`` on
  the real ``gcide_defs`` task (word -> definition, 4 choices, 5 shots), with acc/acc_norm of both.

The model is a seeded random Llama (hidden 256, 4 layers) with a byte-level BPE tokenizer trained
on the same real text, saved to disk so both libraries load the same checkpoint. Wall time is the
measure; process CPU time is shown too (the load average is recorded: on a shared machine the
wall-clock ratio moves with the other jobs). A workload under 2x gets a torch.profiler table of
where cptkit's time goes.

    nice python bench/evaluate.py [--docs 100] [--items 60] [--repeat 2] [--threads 2]

Each side runs ``--repeat`` times, alternating (cptkit, lm-eval, cptkit, ...), and its fastest run
counts: on a shared machine a slow run measures the other jobs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def real_texts(n: int) -> list[str]:
    out = []
    for f in sorted(glob.glob("/usr/share/doc/*/copyright")):
        t = Path(f).read_text(errors="replace").strip()
        if len(t) > 400:
            out.append(t[:4000])
        if len(out) == n:
            break
    return out


def timed(fn: Callable[[], object]) -> tuple[object, float, float]:
    """``(result, wall seconds, process CPU seconds)``."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def alternate(ours: Callable[[], object], theirs: Callable[[], object], repeat: int):
    """Run ``ours`` and ``theirs`` alternately ``repeat`` times each: ``(ours, theirs)``, each as
    ``(last result, fastest wall seconds, CPU seconds of that run)``."""
    best: list[tuple[object, float, float] | None] = [None, None]
    for _ in range(repeat):
        for k, fn in enumerate((ours, theirs)):
            out, wall, cpu = timed(fn)
            if best[k] is None or wall < best[k][1]:
                best[k] = (out, wall, cpu)
    return best[0], best[1]


def profile_table(fn: Callable[[], object], rows: int = 8) -> str:
    """Top operators by self CPU time of one run of ``fn`` (torch.profiler), as a markdown table."""
    from torch.profiler import ProfilerActivity, profile

    from bench._report import table

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in ops) or 1
    return table(["operator", "self CPU share", "calls"],
                 [[f"`{e.key}`", f"{100 * e.self_cpu_time_total / total:.1f} %", e.count] for e in ops[:rows]])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=100)
    ap.add_argument("--items", type=int, default=60)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import torch
    from lm_eval import simple_evaluate
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from bench._report import table, write_section
    from cptkit.eval import runner, tasks
    from cptkit.eval.build_tasks import build
    from cptkit.models import scoring, tiny

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-evaluate-"))
    texts = real_texts(args.docs)
    tok = tiny.train_bpe_tokenizer(texts, vocab_size=2000)
    model = tiny.tiny_llama(tok, hidden=256, layers=4, heads=4, max_position=2048, seed=0)
    mdir = tmp / "model"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    n_params = model.num_parameters()

    load_before = os.getloadavg()
    # --- perplexity ---
    hf = HFLM(pretrained=str(mdir), device="cpu", batch_size=args.batch_size, dtype="float32")
    reqs = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(x,), idx=i) for i, x in enumerate(texts)]
    (ours, t_ours, c_ours), (theirs, t_theirs, c_theirs) = alternate(
        lambda: scoring.document_losses(model, tok, texts, batch_size=args.batch_size, max_length=2048),
        lambda: hf.loglikelihood_rolling(reqs, disable_tqdm=True), args.repeat)
    tokens = sum(n for _, n in ours)
    nll_ours, nll_theirs = sum(s for s, _ in ours), -sum(theirs)

    # --- multiple choice ---
    data = tmp / "data"
    build("gcide_defs", data)
    test = tmp / "test.jsonl"
    test.write_text("".join((data / "gcide_defs/test.jsonl").read_text().splitlines(True)[: args.items]))
    val = data / "gcide_defs/validation.jsonl"
    (tmp / "lm_eval_task.yaml").write_text(
        f"task: bench_gcide\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {test}\n    validation: {val}\n"
        "output_type: multiple_choice\ntest_split: test\nfewshot_split: validation\n"
        'doc_to_text: "Word: {{word}} ({{pos}})\\nDefinition:"\ndoc_to_choice: choices\ndoc_to_target: label\n'
        f"num_fewshot: {args.shots}\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    own = Path(tempfile.mkdtemp(prefix="bench-evaluate-cptkit-"))  # outside lm-eval's include_path
    (own / "task.yaml").write_text(
        f"task: bench_gcide\noutput_type: multiple_choice\ndata_files: {{test: {test}, validation: {val}}}\n"
        f"test_split: test\nfewshot_split: validation\nnum_fewshot: {args.shots}\n"
        'doc_to_text: "Word: {{word}} ({{pos}})\\nDefinition:"\ndoc_to_choice: choices\ndoc_to_target: label\n')
    task = tasks.load_task(str(own / "task.yaml"), own, own)
    ((m_ours, _), mc_ours, mcc_ours), (res, mc_theirs, mcc_theirs) = alternate(
        lambda: runner.run_task(model, tok, task, seed=1234, batch_size=args.batch_size),
        lambda: simple_evaluate(model=hf, tasks=["bench_gcide"], task_manager=TaskManager(include_path=str(tmp)),
                                fewshot_random_seed=1234, batch_size=args.batch_size), args.repeat)
    r = res["results"]["bench_gcide"]
    load_after = os.getloadavg()
    same_mc = m_ours["acc"] == r["acc,none"] and m_ours["acc_norm"] == r["acc_norm,none"]

    rows = [
        ["perplexity (tokens/s)", f"{tokens / t_ours:,.0f}", f"{tokens / t_theirs:,.0f}", t_theirs / t_ours,
         c_theirs / c_ours, f"NLL {nll_ours:,.1f} vs {nll_theirs:,.1f}"],
        [f"multiple choice, {args.shots}-shot (items/s)", f"{args.items / mc_ours:.2f}", f"{args.items / mc_theirs:.2f}",
         mc_theirs / mc_ours, mcc_theirs / mcc_ours,
         f"acc {m_ours['acc']:.3f} vs {r['acc,none']:.3f}; acc_norm {m_ours['acc_norm']:.3f} vs "
         f"{r['acc_norm,none']:.3f} ({'identical' if same_mc else 'DIFFERENT'})"],
    ]
    body = (f"Random Llama ({n_params / 1e6:.1f} M parameters, BPE vocab {len(tok)}) on {tokens:,} tokens of "
            f"{len(texts)} real documents and {args.items} `gcide_defs` items; batch size {args.batch_size}, "
            f"{args.threads} torch threads; lm-eval {__import__('lm_eval').__version__}; fastest of {args.repeat} "
            "alternating runs per side. Ratio = cptkit speed / lm-eval "
            "speed in wall time; CPU ratio = the same in process CPU time (of those runs). Load average (1/5/15 min) "
            f"{'/'.join(f'{x:.1f}' for x in load_before)} before, {'/'.join(f'{x:.1f}' for x in load_after)} after, "
            f"on {os.cpu_count()} cores"
            + (": a loaded machine, the wall-clock ratios move by tens of percent between runs"
               if max(load_before[0], load_after[0]) > os.cpu_count() else " (a quiet machine)")
            + ".\n\n"
            + table(["workload", "cptkit", "lm-eval", "ratio", "CPU ratio", "same numbers?"], rows))
    if t_theirs / t_ours < 2:
        few = texts[:min(len(texts), 2 * args.batch_size)]
        body += ("\n\nPerplexity under 2x: where cptkit's time goes (torch.profiler, `document_losses` on "
                 f"{len(few)} of the documents):\n\n"
                 + profile_table(lambda: scoring.document_losses(model, tok, few, batch_size=args.batch_size,
                                                                 max_length=2048))
                 + "\n\nThe scoring itself (logsumexp and gather at the scored positions) is the `exp`/`log`/`amax` "
                 "rows at most; the rest is the model's forward, token for token the forward lm-eval runs: the "
                 "matmuls (`mm`), the unfused elementwise ops of RMSNorm, RoPE and SiLU (`mul`, `cat`, `add`, `pow`, "
                 "`neg`, `silu`) and causal attention. What cptkit saves is lm-eval's padding (it batches windows in "
                 "input order), its attention over padding and its float32 log-softmax over every position. A 2x "
                 "needs a cheaper forward: fused elementwise kernels (`torch.compile`, a fused RMSNorm/RoPE), or "
                 "lower precision, which changes the scores.")
    if mc_theirs / mc_ours < 2:
        body += ("\n\nMultiple choice under 2x: where cptkit's time goes (torch.profiler, `run_task` on 8 items):\n\n"
                 + profile_table(lambda: runner.run_task(model, tok, task, seed=1234, batch_size=args.batch_size, limit=8))
                 + "\n\nEach item's context runs once and its choices run on its KV cache: the forward over "
                 "context + choices is what is left, the same operators as the perplexity forward.")
    print(body)
    print(json.dumps({"tokens": tokens, "t_ours": t_ours, "t_theirs": t_theirs, "mc_ours": mc_ours,
                      "mc_theirs": mc_theirs, "ours": m_ours, "theirs": r}, default=str)[:2000])
    if not args.no_write:
        write_section("evaluate", "evaluate: perplexity and multiple choice vs lm-evaluation-harness (CPU)",
                      "nice python bench/evaluate.py " + " ".join(sys.argv[1:]), body)


if __name__ == "__main__":
    main()
