"""Does ``torch.compile`` pay for a CPT step on the CPU? SmolLM2-135M, eager against compiled, same steps.

    python bench/train_compile.py [--seq-len 1024] [--steps 6] [--repeats 3] [--threads 2]

Each run is a fresh process: ``load_pretrained("smollm2")`` (the embedded GGUF dequantized to fp32), fused
AdamW, clipping 1.0, micro-batch 1, the same random token sequences; *compiled* wraps the model in
``torch.compile`` (inductor, default mode, static shapes). The step time is the median step after two
warm-up steps (the first compiled step pays the compilation, reported apart). Modes alternate, repeats
interleaved; the loss of every step is compared between the modes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import table, write_section  # noqa: E402
from bench.train import _median_step  # noqa: E402


def worker(mode: str, seq: int, steps: int, threads: int) -> None:
    import torch

    from cptkit.models.pretrained import load_pretrained

    torch.set_num_threads(threads)
    model = load_pretrained("smollm2")
    model.config.use_cache = False
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    fwd = torch.compile(model, dynamic=False) if mode == "compiled" else model
    g = torch.Generator().manual_seed(0)
    times, losses = [], []
    for _ in range(steps):
        x = torch.randint(0, model.config.vocab_size, (1, seq), generator=g)
        t = time.perf_counter()
        out = fwd(input_ids=x, labels=x)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        times.append(time.perf_counter() - t)
    print(json.dumps({"mode": mode, "times": times, "losses": losses}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true", help="print, do not write docs/benchmarks.md")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.seq_len, a.steps, a.threads)
    runs: dict[str, list[dict]] = {"eager": [], "compiled": []}
    for rep in range(a.repeats):
        for mode in (("eager", "compiled") if rep % 2 == 0 else ("compiled", "eager")):
            with tempfile.TemporaryDirectory() as cache:  # a cold inductor cache: what a user's first run pays
                r = subprocess.run([sys.executable, __file__, "--worker", mode, "--seq-len", str(a.seq_len), "--steps",
                                    str(a.steps), "--threads", str(a.threads)], capture_output=True, text=True,
                                   check=True, env=os.environ | {"TORCHINDUCTOR_CACHE_DIR": cache})
            runs[mode].append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(rep, mode, [round(t, 2) for t in runs[mode][-1]["times"]], file=sys.stderr)
    per = {m: [_median_step(r["times"]) for r in rs] for m, rs in runs.items()}  # one per process
    med = {m: statistics.mean(v) for m, v in per.items()}
    se = {m: statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan") for m, v in per.items()}
    first = {m: statistics.median(r["times"][0] for r in rs) for m, rs in runs.items()}
    sp = med["eager"] / med["compiled"]
    sp_se = sp * ((se["eager"] / med["eager"]) ** 2 + (se["compiled"] / med["compiled"]) ** 2) ** 0.5
    dloss = max(abs(x - y) for e, c in zip(runs["eager"], runs["compiled"], strict=True)
                for x, y in zip(e["losses"], c["losses"], strict=True))
    rows = [[m, f"1 × {a.seq_len}", f"{1000 * med[m]:,.0f} ± {1000 * se[m]:,.0f}", f"{a.seq_len / med[m]:.1f}",
             f"{first[m]:.1f}", "1" if m == "eager" else f"{sp:.3f} ± {sp_se:.3f}"] for m in ("eager", "compiled")]
    body = (table(["model", "batch × seq", "ms/step (mean ± SE over processes)", "tokens/s", "first step s",
                   "speed-up vs eager"], rows)
            + f"\n\nSmolLM2-135M (fp32, {a.threads} torch threads), fused AdamW, clipping 1.0; median step after two "
            f"warm-up steps of {a.steps} in each of {a.repeats} interleaved fresh processes per mode (each compiled one with a "
            f"cold inductor cache, as a first run has). Largest loss "
            f"difference between the modes over every step: {dloss:.1e}. ")
    extra = first["compiled"] - first["eager"]  # what compiling costs, paid once
    saved = med["eager"] - med["compiled"]  # what each later step saves
    if sp - 2 * sp_se > 1.0:
        body += (f"Read: compiled is {sp:.2f} ± {sp_se:.2f}× eager per step; its first step costs {extra:.0f} s more, "
                 f"repaid after about {extra / saved:.0f} steps, so `train.compile=true` pays on CPU runs longer than "
                 "that. The step is mostly matmuls, which inductor leaves to the same GEMM library; the gain is "
                 "the fused elementwise work around them (RMSNorm, RoPE, SiLU·mul, the loss).")
    else:
        body += (f"Read: compiled is {sp:.2f} ± {sp_se:.2f}× eager, no gain beyond twice its error: the step is the "
                 "model's matmuls, which inductor leaves to the same GEMM library.")
    print(body)
    if not a.dry_run:
        write_section("train_compile", "torch.compile for a CPT step on CPU (SmolLM2-135M)",
                      " ".join(["python bench/train_compile.py", *sys.argv[1:]]), body)


if __name__ == "__main__":
    main()
