"""Benchmark `evaluate` against lm-evaluation-harness on CPU, same model, same data, same run.

* perplexity: tokens/s of ``cptkit.models.lm.document_losses`` vs lm-eval ``HFLM.loglikelihood_rolling``
  on real documents (Debian copyright files), with the total NLL of both;
* multiple choice: items/s of ``cptkit.eval.tasks.run_task`` vs ``lm_eval.simple_evaluate`` on
  the real ``gcide_defs`` task (word -> definition, 4 choices, 5 shots), with acc/acc_norm of both.

The model is a seeded random Llama (hidden 256, 4 layers) with a byte-level BPE tokenizer trained
on the same real text, saved to disk so both libraries load the same checkpoint.

    nice python bench/evaluate.py [--docs 200] [--items 100] [--threads 2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=100)
    ap.add_argument("--items", type=int, default=60)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import torch
    from lm_eval import simple_evaluate
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from bench._report import table, write_section
    from cptkit.eval import tasks as T
    from cptkit.eval.build_tasks import build
    from cptkit.models import lm

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-evaluate-"))
    texts = real_texts(args.docs)
    tok = lm.train_bpe_tokenizer(texts, vocab_size=2000)
    model = lm.tiny_llama(tok, hidden=256, layers=4, heads=4, max_position=2048, seed=0)
    mdir = tmp / "model"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    n_params = model.num_parameters()

    # --- perplexity ---
    t = time.perf_counter()
    ours = lm.document_losses(model, tok, texts, batch_size=args.batch_size, max_length=2048)
    t_ours = time.perf_counter() - t
    tokens = sum(n for _, n in ours)
    hf = HFLM(pretrained=str(mdir), device="cpu", batch_size=args.batch_size, dtype="float32")
    reqs = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(x,), idx=i) for i, x in enumerate(texts)]
    t = time.perf_counter()
    theirs = hf.loglikelihood_rolling(reqs, disable_tqdm=True)
    t_theirs = time.perf_counter() - t
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
    task = T.load_task(str(own / "task.yaml"), own, own)
    t = time.perf_counter()
    m_ours, _ = T.run_task(model, tok, task, seed=1234, batch_size=args.batch_size)
    mc_ours = time.perf_counter() - t
    t = time.perf_counter()
    res = simple_evaluate(model=hf, tasks=["bench_gcide"], task_manager=TaskManager(include_path=str(tmp)),
                          fewshot_random_seed=1234, batch_size=args.batch_size)
    mc_theirs = time.perf_counter() - t
    r = res["results"]["bench_gcide"]

    rows = [
        ["perplexity (tokens/s)", f"{tokens / t_ours:,.0f}", f"{tokens / t_theirs:,.0f}", t_theirs / t_ours,
         f"NLL {nll_ours:,.1f} vs {nll_theirs:,.1f}"],
        [f"multiple choice, {args.shots}-shot (items/s)", f"{args.items / mc_ours:.2f}", f"{args.items / mc_theirs:.2f}",
         mc_theirs / mc_ours,
         f"acc {m_ours['acc']:.3f} vs {r['acc,none']:.3f}; acc_norm {m_ours['acc_norm']:.3f} vs {r['acc_norm,none']:.3f}"],
    ]
    body = (f"Random Llama ({n_params / 1e6:.1f} M parameters, BPE vocab {len(tok)}) on {tokens:,} tokens of "
            f"{len(texts)} real documents and {args.items} `gcide_defs` items; batch size {args.batch_size}, "
            f"{args.threads} torch threads; lm-eval {__import__('lm_eval').__version__}. Ratio = cptkit speed / lm-eval speed.\n\n"
            + table(["workload", "cptkit", "lm-eval", "ratio", "same numbers?"], rows))
    print(body)
    print(json.dumps({"tokens": tokens, "t_ours": t_ours, "t_theirs": t_theirs, "mc_ours": mc_ours,
                      "mc_theirs": mc_theirs, "ours": m_ours, "theirs": r}, default=str)[:2000])
    if not args.no_write:
        write_section("evaluate", "evaluate: perplexity and multiple choice vs lm-evaluation-harness (CPU)",
                      "nice python bench/evaluate.py", body)


if __name__ == "__main__":
    main()
