"""Benchmark: cptkit train against a plain PyTorch loop on CPU (and, with --overhead, packing + overhead).

    python bench/train.py [--repeats 3] [--corpus DIR]              # train vs plain loop (section train_cpu)
    python bench/train.py --overhead [--steps 20] [--hidden 256]    # packing + data/mixture overhead (section train)

* **train vs plain loop** (issue 15): the same Llama (random init, SmolLM2's 49,152-token
  vocabulary), the same shapes, threads and precision, trained by ``cptkit train`` (a
  subprocess, as a user runs it) and by the ten-line loop a user would write (``--plain-worker``:
  AdamW, clipping, ``torch.autocast`` for bf16), in interleaved repeats. Reported: median
  seconds per optimizer step after two warm-up steps (cptkit: ``metrics.jsonl``; the loop: its
  own timer around the same work) and the whole process wall time.

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
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from _report import table, write_section  # noqa: E402

from cptkit.core.config import compose_step  # noqa: E402


def corpus() -> Path:
    demo = ROOT / "data" / "corpus"
    if (demo / "_SUCCESS").exists():
        return demo
    from conftest import build_corpus_slice

    return build_corpus_slice()


def hf_pack(records: list[dict], tok_dir: Path, seq_len: int) -> tuple[int, float]:
    """The peer: datasets map(tokenize) + group_texts, as in transformers' run_clm.py (tokenizer load
    included, as in cptkit's timing)."""
    from datasets import Dataset, disable_progress_bars
    from transformers import AutoTokenizer

    disable_progress_bars()
    t = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    eos = tok.eos_token_id
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


def hf_pack_files(src: Path, tok_dir: Path, seq_len: int, work: Path) -> tuple[int, float]:
    """The peer end to end, as a user runs it on files: load the tokenizer, load_dataset("json") on
    the same shards (a fresh cache), map(tokenize) + group_texts, save_to_disk."""
    from datasets import disable_progress_bars, load_dataset
    from transformers import AutoTokenizer

    disable_progress_bars()
    shutil.rmtree(work, ignore_errors=True)
    t = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    eos = tok.eos_token_id
    files = sorted(str(p) for p in src.glob("part-*.jsonl*"))
    ds = load_dataset("json", data_files=files, split="train", cache_dir=str(work / "cache"))
    ds = ds.map(lambda b: {"input_ids": [x + [eos] for x in tok(b["text"], add_special_tokens=False)["input_ids"]]},
                batched=True, remove_columns=ds.column_names)

    def group(b):
        flat = [t for x in b["input_ids"] for t in x]
        n = len(flat) // seq_len * seq_len
        return {"input_ids": [flat[i:i + seq_len] for i in range(0, n, seq_len)]}

    ds = ds.map(group, batched=True, batch_size=1000)
    ds.save_to_disk(str(work / "packed"))
    n_tok = len(ds) * seq_len
    return n_tok, time.perf_counter() - t


def plain_worker(args: argparse.Namespace) -> None:
    """The baseline: the loop a user writes around transformers, on the stream's first domain's tokens."""
    import json

    import numpy as np
    import torch

    from cptkit.models.lm import load_tokenizer, tiny_llama

    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    meta = json.loads((Path(args.stream) / "_stream.json").read_text())
    tokens = np.memmap(Path(args.stream) / meta["domains"][0]["file"], dtype=meta["dtype"], mode="r")
    seq = int(meta["seq_len"])
    tok = load_tokenizer(args.tokenizer)
    model = tiny_llama(tok, hidden=args.hidden, layers=args.layers, heads=args.heads, max_position=seq).train()
    model.config.use_cache = False
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)
    times, cpu = [], []
    for step in range(args.steps):
        t, c = time.perf_counter(), time.process_time()
        lo = step * args.micro_batch * seq
        x = torch.from_numpy(np.asarray(tokens[lo:lo + args.micro_batch * seq], dtype=np.int64)).view(-1, seq)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    model.save_pretrained(args.save)
    print(json.dumps({"seconds": times, "cpu_seconds": cpu, "wall": time.perf_counter() - t_start}))


def build_stream(src: Path, out: Path, tok_dir: Path, seq: int, budget: int, env: dict[str, str]) -> Path:
    """A one-domain (``lang:en``) stream of ``seq``-token sequences, packed by ``cptkit build-mix``."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "build-mix", "--in", str(src), "--out", str(out),
                        f"tokenizer={tok_dir}", "-q", "mix.domains=[{name:en,filter:{lang:en}}]",
                        "mix.stages=[{name:main,weights:{en:1}}]", "mix.fill=null",
                        f"mix.budget_tokens={budget}", f"mix.seq_len={seq}", "mix.eval_docs=2"],
                       env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr[-2000:])
    return out


def _median_step(seconds: list[float]) -> float:
    import statistics

    return statistics.median(seconds[2:] if len(seconds) > 4 else seconds)


def train_vs_plain(args: argparse.Namespace) -> None:
    """cptkit train and the plain loop, interleaved; writes the train_cpu section."""
    import json
    import subprocess

    from cptkit.models.lm import load_tokenizer
    from cptkit.training.engine import cpu_has_bf16, resolve_precision

    src = Path(args.corpus) if args.corpus else corpus()
    work = Path(tempfile.mkdtemp(prefix="cptkit-bench-train-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    auto = resolve_precision("auto")
    configs = [  # name, hidden, layers, heads, micro batch, seq len, steps, precisions
        ("tiny Llama (issue 15)", 32, 1, 2, 4, 128, args.tiny_steps, ["fp32", "bf16"]),
        ("demo model (make demo)", 128, 2, 4, 8, 256, args.demo_steps, [auto]),
    ]
    rows = []
    load_seen: list[float] = []
    try:
        tok_dir = work / "tok"
        load_tokenizer("smollm2").save_pretrained(str(tok_dir))
        streams = {seq: build_stream(src, work / f"stream{seq}", tok_dir, seq, 300_000, env)
                   for seq in sorted({c[5] for c in configs})}
        for name, hidden, layers, heads, micro, seq, steps, precs in configs:
            for prec in precs:
                res: dict[str, list] = {"cptkit": [], "plain": []}
                for rep in range(args.repeats):
                    order = ["cptkit", "plain"] if rep % 2 == 0 else ["plain", "cptkit"]
                    for who in order:
                        out = work / f"run-{who}-{hidden}-{prec}-{rep}"
                        t = time.perf_counter()
                        if who == "cptkit":
                            cmd = [sys.executable, "-m", "cptkit.cli", "train", "--in", str(streams[seq]), "--out",
                                   str(out), f"model.hidden={hidden}", f"model.layers={layers}",
                                   f"model.heads={heads}", f"train.micro_batch={micro}", f"train.max_steps={steps}",
                                   f"train.threads={args.threads}", f"train.precision={prec}", "-q"]
                        else:
                            cmd = [sys.executable, str(Path(__file__).resolve()), "--plain-worker", "--stream",
                                   str(streams[seq]), "--tokenizer", str(tok_dir), "--hidden", str(hidden),
                                   "--layers", str(layers), "--heads", str(heads), "--micro-batch", str(micro),
                                   "--steps", str(steps), "--threads", str(args.threads), "--precision", prec,
                                   "--save", str(out)]
                        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                        wall = time.perf_counter() - t
                        load_seen.append(os.getloadavg()[0])
                        if r.returncode:
                            raise SystemExit(f"{who}: {r.stderr[-3000:]}")
                        if who == "cptkit":
                            recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
                            recs = [x for x in recs if "seconds" in x]
                            secs, cpus = [x["seconds"] for x in recs], [x["cpu_seconds"] for x in recs]
                            engine = json.loads((out / "_manifest.json").read_text())["extra"]["engine"]
                        else:
                            got = json.loads(r.stdout.strip().splitlines()[-1])
                            secs, cpus = got["seconds"], got["cpu_seconds"]
                        res[who].append((_median_step(secs), wall, _median_step(cpus)))
                        print(f"{name} {prec} rep {rep} {who}: {_median_step(secs) * 1000:.0f} ms/step, "
                              f"{_median_step(cpus) * 1000:.0f} CPU ms/step, wall {wall:.1f} s, "
                              f"load {os.getloadavg()[0]:.1f}", flush=True)
                tok_step = micro * seq
                c_step = sorted(x[0] for x in res["cptkit"])[len(res["cptkit"]) // 2]
                p_step = sorted(x[0] for x in res["plain"])[len(res["plain"]) // 2]
                c_wall = sorted(x[1] for x in res["cptkit"])[len(res["cptkit"]) // 2]
                p_wall = sorted(x[1] for x in res["plain"])[len(res["plain"]) // 2]
                c_cpu = sorted(x[2] for x in res["cptkit"])[len(res["cptkit"]) // 2]
                p_cpu = sorted(x[2] for x in res["plain"])[len(res["plain"]) // 2]
                rows.append([name, f"{micro} × {seq}", prec, engine, f"{c_step * 1000:,.0f}", f"{p_step * 1000:,.0f}",
                             f"{tok_step / c_step:,.0f}", f"{tok_step / p_step:,.0f}", f"{p_step / c_step:.2f}",
                             f"{c_cpu * 1000:,.0f}", f"{p_cpu * 1000:,.0f}", f"{p_cpu / c_cpu:.2f}",
                             f"{c_wall:.1f}", f"{p_wall:.1f}"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    loads = (min(load_seen), max(load_seen)) if load_seen else (0.0, 0.0)
    body = (
        "CPU only. On a GPU (a 1.07B Llama, ZeRO-2 bf16, tokens/s and MFU against HF Trainer + DeepSpeed): "
        "section \"train on one GPU\" below (bench/gpu/train_mfu.py).\n\n"
        f"Both sides: same model (random Llama, vocabulary 49,152 = SmolLM2's tokenizer), shapes, "
        f"{args.threads} torch threads and precision; AdamW (0.9, 0.95), clipping 1.0; {args.repeats} interleaved "
        "repeats, the median repeat shown. *ms/step*: median optimizer step after two warm-up steps (cptkit: "
        "`metrics.jsonl`, which times data draw, forward, backward, step and loss sync; the loop: the same work). "
        "*wall*: the whole process (imports, tokenizer, model, training, saving; cptkit also writes checkpoints, "
        "metrics, TensorBoard and plots). *CPU ms/step*: process CPU time per step (all threads), which other "
        "processes on a shared machine do not inflate the way they inflate wall time; *speed ratio* = plain / "
        f"cptkit time (1.00 = parity; the goal is ≥ 0.90). Load average during the run: {loads[0]:.1f} to "
        f"{loads[1]:.1f} on {os.cpu_count()} cores.\n\n"
        + table(["model", "batch × seq", "precision", "cptkit engine", "cptkit ms/step", "plain ms/step",
                 "cptkit tokens/s", "plain tokens/s", "speed ratio (wall)", "cptkit CPU ms/step",
                 "plain CPU ms/step", "speed ratio (CPU)", "cptkit wall s", "plain wall s"], rows)
        + f"\n\nThis CPU {'has' if cpu_has_bf16() else 'lacks'} native bf16 (AVX512-BF16/AMX in /proc/cpuinfo), "
        f"so `train.precision=auto` chose **{auto}** here; on an AVX2-only CPU it chooses fp32 (bf16 is emulated "
        "there), on GPU bf16. One CPU process runs the torch engine (`train.engine=auto`): DeepSpeed's ZeRO has "
        "nothing to shard across one process and its bf16 optimizer adds copies; gradient checkpointing is off "
        "below 1e8 parameters (`train.gradient_checkpointing=auto`), as it only recomputes on tiny models."
    )
    cmd = "python bench/train.py " + " ".join(a for a in sys.argv[1:])
    write_section("train_cpu", "train on CPU: cptkit train vs a plain PyTorch loop", cmd.strip(), body)
    print(body)


def overhead(args: argparse.Namespace) -> None:
    """Packing throughput (build-mix vs datasets) and the data/mixture share of a train step; the train section."""
    from conftest import read_jsonl_dir
    from mixdata import TWO_DOMAINS, make_tokenizer

    from cptkit.steps import build_mix, train

    src = Path(args.corpus) if args.corpus else corpus()
    records = read_jsonl_dir(src)
    work = Path(tempfile.mkdtemp(prefix="cptkit-bench-train-"))
    try:
        tok_dir = make_tokenizer(records, work / "tok", vocab_size=2048)
        # packing: cptkit build-mix vs datasets map + group_texts
        rows_pack = []
        best_c = best_h = best_f = 0.0
        n_c = n_h = n_f = 0
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
            n_h, dh = hf_pack(records, tok_dir, args.seq_len)
            best_h = max(best_h, n_h / dh)
            n_f, df = hf_pack_files(src, tok_dir, args.seq_len, work / "hf")
            best_f = max(best_f, n_f / df)
        rows_pack.append(["cptkit build-mix: read shards, tokenize, shuffle, pack, plan, write", n_c, best_c,
                          best_c / best_h, best_c / best_f])
        rows_pack.append(["datasets map(tokenize) + group_texts, in memory (records already parsed)", n_h, best_h,
                          1.0, best_h / best_f])
        rows_pack.append(["load_dataset(json) + map(tokenize) + group_texts + save_to_disk", n_f, best_f,
                          best_f / best_h, 1.0])
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
        "CPU only. On a GPU (a 1.07B Llama, ZeRO-2 bf16, tokens/s and MFU against HF Trainer + DeepSpeed): "
        "section \"train on one GPU\" below (bench/gpu/train_mfu.py).\n\n"
        f"**Packing** ({src.name}: {len(records):,} documents, {sum(len(r['text']) for r in records):,} characters; "
        f"byte-level BPE 2048, sequences of {args.seq_len}; best of 3 interleaved repeats):\n\n"
        + table(["packer", "tokens", "tokens/s", "× in-memory peer", "× file peer"], rows_pack)
        + "\n\nThe in-memory peer starts from parsed records and writes nothing; the file peer and cptkit "
        "read the same JSONL.gz shards and write their packed output. Both tokenize with the same fast "
        "tokenizer in batches (its Rust threads); every timing includes loading the tokenizer."
        + f"\n\n**Training step overhead** (Llama hidden {args.hidden}, {args.layers} layers, micro-batch "
        f"{args.micro_batch} × {args.seq_len} tokens, train's default engine and precision on CPU, {args.steps} steps; "
        "target: data loader + mixture < 5% of step time):\n\n"
        + table(["mixture", "tokens/s", "ms/step", "data loader %", "mixture eval+update %"], rows_train)
        + "\n\nThe Velocitune share is the cost of its per-domain eval (held-out docs, every m steps); "
        "it scales with eval docs / m, not with the data path."
    )
    cmd = "python bench/train.py " + " ".join(sys.argv[1:])
    write_section("train", "train: packing throughput and data/mixture overhead (CPU)", cmd.strip(), body)
    print(body)



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--overhead", action="store_true", help="the packing + data/mixture overhead section instead")
    ap.add_argument("--plain-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stream")
    ap.add_argument("--tokenizer")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--save")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tiny-steps", type=int, default=20)
    ap.add_argument("--demo-steps", type=int, default=8)
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--interval", type=int, default=10)
    args = ap.parse_args()
    if args.plain_worker:
        return plain_worker(args)
    if not args.overhead:
        return train_vs_plain(args)
    return overhead(args)


if __name__ == "__main__":
    main()
