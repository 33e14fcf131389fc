"""Benchmark: build-mix packing throughput and train's data-loader + mixture overhead on CPU.

    python bench/train.py [--steps 20] [--hidden 256] [--layers 4] [--seq-len 256]

* Packing: tokenize + order + pack the demo-corpus slice into fixed-length sequences with
  ``cptkit build-mix`` (tokens/s), against the peer baseline in the same run: Hugging Face
  ``datasets`` ``map(tokenize, batched=True)`` + ``group_texts`` (the run_clm.py recipe),
  same tokenizer, same documents.
* Training: a Llama (hidden/layers as given, random init) trained with DeepSpeed ZeRO-2 bf16
  on CPU; the share of step wall time spent drawing and assembling batches (sampler) and,
  for Velocitune, in per-domain eval + weight updates (every ``interval`` steps).
Writes its section of docs/benchmarks.md through bench/_report.py.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _report import table, write_section  # noqa: E402

from cptkit.config import compose_step  # noqa: E402


def corpus() -> Path:
    demo = ROOT / "data" / "corpus"
    if (demo / "_SUCCESS").exists():
        return demo
    from conftest import build_corpus_slice

    return build_corpus_slice()


def hf_pack(records: list[dict], tok, seq_len: int) -> tuple[int, float]:
    """The peer: datasets map(tokenize) + group_texts, as in transformers' run_clm.py."""
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    eos = tok.eos_token_id
    t = time.perf_counter()
    ds = Dataset.from_list([{"text": r["text"]} for r in records])
    ds = ds.map(lambda b: {"input_ids": [x + [eos] for x in tok(b["text"], add_special_tokens=False)["input_ids"]]},
                batched=True, remove_columns=["text"])

    def group(b):
        flat = [t for x in b["input_ids"] for t in x]
        n = len(flat) // seq_len * seq_len
        return {"input_ids": [flat[i:i + seq_len] for i in range(0, n, seq_len)]}

    ds = ds.map(group, batched=True, batch_size=1000)
    n_tok = sum(len(x) for x in ds["input_ids"])
    return n_tok, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--interval", type=int, default=10)
    args = ap.parse_args()

    from conftest import read_jsonl_dir
    from mixdata import TWO_DOMAINS, make_tokenizer

    from cptkit.steps import build_mix, train

    src = corpus()
    records = read_jsonl_dir(src)
    work = Path(tempfile.mkdtemp(prefix="cptkit-bench-train-"))
    try:
        tok_dir = make_tokenizer(records, work / "tok", vocab_size=2048)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tok_dir))
        # packing: cptkit build-mix vs datasets map + group_texts
        rows_pack = []
        best_c = best_h = 0.0
        n_c = n_h = 0
        for k in range(3):
            out = work / f"stream{k}"
            t = time.perf_counter()
            res = build_mix.run(compose_step("build-mix", [f"io.inputs=['{src}']", f"io.output='{out}'",
                                                           f"tokenizer='{tok_dir}'", "quiet=true", *TWO_DOMAINS,
                                                           "mix.budget_tokens=400000", f"mix.seq_len={args.seq_len}",
                                                           "mix.eval_docs=4"]))
            dt = time.perf_counter() - t
            n_c = sum(d["tokens"] for d in res["stream"]["domains"])
            best_c = max(best_c, n_c / dt)
            n_h, dh = hf_pack(records, tok, args.seq_len)
            best_h = max(best_h, n_h / dh)
        rows_pack.append(["cptkit build-mix (tokenize, shuffle, pack, plan, write)", n_c, best_c, best_c / best_h])
        rows_pack.append(["datasets map(tokenize) + group_texts (peer)", n_h, best_h, 1.0])
        stream = work / "stream0"

        rows_train = []
        common = [f"io.inputs=['{stream}']", "quiet=true", f"model.hidden={args.hidden}",
                  f"model.layers={args.layers}", f"model.heads={max(1, args.hidden // 64)}",
                  f"train.micro_batch={args.micro_batch}", f"train.max_steps={args.steps}", "train.threads=2"]
        runs = [("static", ["train.mixture=static"]),
                ("staged (plan)", ["train.mixture=staged"]),
                (f"velocitune (eval every {args.interval} steps)",
                 ["train.mixture=velocitune", f"train.velocitune.interval_steps={args.interval}",
                  "train.velocitune.targets={en:3.0,zh:3.0}"])]
        for name, ov in runs:
            out = work / f"run-{name.split()[0]}"
            res = train.run(compose_step("train", [*common, f"io.output='{out}'", *ov]))
            ex = res["extra"]
            rows_train.append([name, ex["tokens/s"], ex["run s"] / args.steps * 1000,
                               100 * ex["data loader s"] / ex["run s"], 100 * ex["mixture eval+update s"] / ex["run s"]])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    body = (
        "No GPU was lent to the session that wrote this section: CPU only (tokens/s and MFU of a 0.5–1B "
        "model against an HF Trainer run were not measured).\n\n"
        "**Packing** (demo-corpus slice, byte-level BPE 2048, sequences of "
        f"{args.seq_len}; best of 3):\n\n"
        + table(["packer", "tokens", "tokens/s", "× peer"], rows_pack)
        + f"\n\n**Training step overhead** (Llama hidden {args.hidden}, {args.layers} layers, micro-batch "
        f"{args.micro_batch} × {args.seq_len} tokens, DeepSpeed ZeRO-2 bf16 on CPU, {args.steps} steps; "
        "target: data loader + mixture < 5% of step time):\n\n"
        + table(["mixture", "tokens/s", "ms/step", "data loader %", "mixture eval+update %"], rows_train)
        + "\n\nThe Velocitune share is the cost of its per-domain eval (held-out docs, every m steps); "
        "it scales with eval docs / m, not with the data path."
    )
    cmd = "python bench/train.py " + " ".join(sys.argv[1:])
    write_section("train", "train: packing throughput and data/mixture overhead (CPU)", cmd.strip(), body)
    print(body)


if __name__ == "__main__":
    main()
