"""What the forgetting remedies cost on the CPU: self-sample generation and distillation to the base.

    python bench/distill.py [--model smollm2] [--docs 8] [--max-tokens 32] [--topk 16] [--seq-len 128]
                            [--micro-batch 1] [--steps 6] [--threads 1]

* **Self samples** (``mix.replay.source=self``): :func:`cptkit.models.self_samples.sample_from_bos` on the
  base (transformers, fp32, KV cache, batches of 16 rows), without and with the top-k log-probs kept;
  generated tokens per second.
* **Distillation** (``train.distill``): ``cptkit train model=hf model.path=MODEL`` on one stream (the
  samples as the main domain and, at ``mix.replay.share=0.5``, as the replay domain with their top-k),
  three runs in the same process: plain (λ = 0), teacher forward on every token (``train.distill.on=all``,
  a frozen copy of the base) and stored top-k on the replay tokens (no teacher). Median step time after
  the first step; training tokens per second.

The machine is shared: the load average (``uptime``) before and after is printed beside the numbers. On a
loaded CPU, keep ``--threads 1``: two torch threads competing with other processes spin-wait, and a
SmolLM2 forward measured here took 4.4 s with 2 threads against 0.34 s with 1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import table, write_section  # noqa: E402


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.split("load average:")[-1].strip()


def generation(model_spec: str, docs: int, max_tokens: int, topk: int) -> tuple[list[list], list[dict]]:
    from cptkit.models.lm import load_causal_lm, load_tokenizer
    from cptkit.models.self_samples import replay_records, sample_from_bos

    tok, model = load_tokenizer(model_spec), load_causal_lm(model_spec)
    rows, recs = [], []
    for k in (0, topk):
        t = time.perf_counter()
        s = sample_from_bos(model, tok, docs, max_tokens, seed=0, topk=k)
        secs = time.perf_counter() - t
        n = sum(len(x["token_ids"]) for x in s)
        rows.append([f"top-k {k}" if k else "texts only", docs, n, f"{secs:.1f}", f"{n / secs:.1f}"])
        recs = replay_records(s, 0)
    return rows, recs


def train_runs(model_spec: str, recs: list[dict], seq_len: int, micro: int, steps: int, threads: int,
               work: Path) -> list[list]:
    from cptkit.core.config import compose_step
    from cptkit.steps.build_mix import run as build_mix
    from cptkit.steps.train import run as train

    src = work / "samples.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    main = work / "main.jsonl"
    main.write_text("".join(json.dumps({"id": f"m{r['id']}", "text": r["text"]}) + "\n" for r in recs))
    stream = work / "stream"
    tokens = seq_len * micro * steps
    build_mix(compose_step("build-mix", [f"io.inputs=['{main}']", f"io.output='{stream}'", f"tokenizer={model_spec}",
                                         "mix.domains=[{name:main,filter:{}}]", "mix.stages=[{name:s,weights:{main:1}}]", "mix.fill=null",
                                         f"mix.seq_len={seq_len}", f"mix.budget_tokens={tokens}", "mix.eval_docs=0",
                                         "mix.max_epochs=100", f"mix.replay.source={src}", "mix.replay.share=0.5",
                                         "quiet=true"]))
    arms = {"plain (λ = 0)": [], "teacher forward, on=all": ["train.distill.kl=1", "train.distill.on=all"],
            "stored top-k, on=replay": ["train.distill.kl=1", "train.distill.on=replay"]}
    rows, plain = [], None
    for name, ov in arms.items():
        out = work / name.split()[0]
        train(compose_step("train", [f"io.inputs=['{stream}']", f"io.output='{out}'", "model=hf",
                                     f"model.path={model_spec}", "train.precision=fp32", f"train.micro_batch={micro}",
                                     f"train.max_steps={steps}", "train.eval_every=0", "train.plot=false",
                                     "train.tensorboard=false", "train.keep_checkpoints=false", f"train.threads={threads}",
                                     "quiet=true", *ov]))
        m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        m = [r for r in m if "loss" in r]
        step_s = statistics.median(r["seconds"] for r in m[1:])
        cpu_s = statistics.median(r["cpu_seconds"] for r in m[1:])
        plain = plain or cpu_s
        kl = [r["distill_kl"] for r in m if r.get("distill_kl")]  # steps with a selected row (step 1: student = teacher)
        rows.append([name, f"{micro} × {seq_len}", f"{1000 * step_s:,.0f}", f"{micro * seq_len / step_s:.1f}",
                     f"{1000 * cpu_s:,.0f}", f"{micro * seq_len / cpu_s:.1f}", f"{cpu_s / plain:.2f}", f"{statistics.mean(kl):.4f} ({len(kl)})" if kl else "–"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--topk", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dry-run", action="store_true", help="print, do not write docs/benchmarks.md")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    before, t0 = load(), time.time()
    gen_rows, recs = generation(a.model, a.docs, a.max_tokens, a.topk)
    with tempfile.TemporaryDirectory() as work:
        train_rows = train_runs(a.model, recs, a.seq_len, a.micro_batch, a.steps, a.threads, Path(work))
    after, wall = load(), time.time() - t0
    body = (f"Base: `{a.model}` (fp32, {a.threads} torch threads). Load average before / after: {before} / {after} "
            f"(the CPU is shared with other work: compare rows of one run, not runs). Whole run {wall:.0f} s.\n\n"
            "**Self samples** from BOS at temperature 1 (`sample_from_bos`, transformers with a KV cache):\n\n"
            + table(["kept", "documents", "tokens", "s", "tokens/s"], gen_rows)
            + f"\n\n**Distillation** (`cptkit train`, torch engine, fp32, {a.steps} steps, median step after the "
            "first; the stream's sequences half main text, half replayed samples with their top-k):\n\n"
            + table(["run", "batch × seq", "ms/step", "tokens/s", "CPU ms/step", "tokens per CPU s", "CPU × plain",
                     "mean distill_kl (steps)"], train_rows)
            + "\n\n*ms/step*, *CPU ms/step*: medians over the steps after the first, wall and process CPU time "
            "(`metrics.jsonl`'s `seconds`, `cpu_seconds`); on a shared CPU the wall time follows the other load, "
            "the CPU time much less, so *CPU × plain* is the cost to read. "
            "*mean distill_kl*: over the steps that logged a non-zero term (a step whose batch holds no "
            "replay row logs 0, and so does step 1 of a teacher run, whose student is its teacher). "
            "Read: the teacher forward adds one forward pass of the base per micro-batch (no backward), and the "
            "full-vocabulary KL over every position; the stored top-k adds only a gather and a k-wide softmax, "
            "and no teacher in memory. Generation pays one forward per new token for the whole batch.")
    print(body)
    if not a.dry_run:
        write_section("distill", "Forgetting remedies on CPU: self samples and distillation to the base",
                      " ".join(["python bench/distill.py", *sys.argv[1:]]), body)


if __name__ == "__main__":
    main()
