"""Benchmark: cptkit train against a plain PyTorch loop on CPU (and, with --overhead, packing + overhead).

    python bench/train.py [--repeats 3] [--corpus DIR]              # train vs plain loop (section train_cpu)
    python bench/train.py --overhead [--steps 20] [--hidden 256]    # packing + data/mixture overhead (section train)
    python bench/train.py --smollm2 [--seq-len 1024] [--micro-batch 1] [--steps 6] [--repeats 3] [--threads 2]
                                                                    # SmolLM2-135M vs HF Trainer (train_cpu_smollm2)

* **train vs plain loop** (issue 15): the same Llama (random init, SmolLM2's 49,152-token
  vocabulary), the same shapes, threads and precision, trained by ``cptkit train`` (a
  subprocess, as a user runs it) and by the ten-line loop a user would write (``--plain-worker``:
  AdamW, clipping, ``torch.autocast`` for bf16), in interleaved repeats. Reported: median
  seconds per optimizer step after two warm-up steps (cptkit: ``metrics.jsonl``; the loop: its
  own timer around the same work) and the whole process wall time.

* **SmolLM2-135M vs HF Trainer** (``--smollm2``): a CPT step of the real model (fp32, CPU) by
  ``cptkit train model=hf model.path=smollm2`` and by ``transformers.Trainer`` (``--hf-worker``) on the
  same weights and the same stream sequences, interleaved; median ms/step, tokens/s, CPU ms/step and
  CPU utilisation = (6·N + 12·L·d·s) × tokens/s ÷ the fp32 matmul peak measured in the same run.
  Each cptkit run writes ~2 GB (the model and a checkpoint with Adam moments) under $TMPDIR, removed
  after the run; point TMPDIR at a roomy disk (or /dev/shm) where /tmp is short.

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

    from cptkit.models.lm import load_tokenizer
    from cptkit.models.tiny import tiny_llama

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


def step_records(out: Path) -> list[dict]:
    """A cptkit train run's per-step records (metrics.jsonl lines that time a step)."""
    from cptkit.core.records import read_jsonl

    return [x for x in read_jsonl(out / "metrics.jsonl", missing_ok=True) if "seconds" in x]


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
                            recs = step_records(out)
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


def hf_worker(args: argparse.Namespace) -> None:
    """The peer for ``--smollm2``: HF ``Trainer`` on the same weights and stream blocks, fp32 on the CPU; prints
    one JSON line: each step's wall and CPU seconds (step end to step end), loss and tokens."""
    import json

    import numpy as np
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from cptkit.models.lm import SMOLLM2
    from cptkit.models.pretrained import load_pretrained

    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    meta = json.loads((Path(args.stream) / "_stream.json").read_text())
    tokens = np.memmap(Path(args.stream) / meta["domains"][0]["file"], dtype=meta["dtype"], mode="r")
    seq = int(meta["seq_len"])
    n_blocks = len(tokens) // seq
    model = load_pretrained(SMOLLM2).train()  # what model.path=smollm2 loads: the GGUF dequantized to fp32
    model.set_attn_implementation("sdpa")
    model.config.use_cache = False  # as cptkit's model: no KV cache built in training forwards
    marks: list[float] = []
    cpus: list[float] = []
    losses: list[float] = []
    toks: list[int] = []

    class Blocks(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return args.steps * args.micro_batch

        def __getitem__(self, i: int) -> dict:
            k = i % n_blocks  # the stream's k-th sequence, wrapping as cptkit's sampler does
            ids = torch.from_numpy(np.asarray(tokens[k * seq:(k + 1) * seq], dtype=np.int64))
            return {"input_ids": ids, "labels": ids.clone()}

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **kw) -> None:
            marks.append(time.perf_counter())
            cpus.append(time.process_time())

        on_step_end = on_train_begin

    class Recording(Trainer):
        def compute_loss(self, model: torch.nn.Module, inputs: dict, *a: object, **kw: object) -> object:
            out = super().compute_loss(model, inputs, *a, **kw)
            losses.append(float((out[0] if isinstance(out, tuple) else out).detach()))
            toks.append(int(inputs["input_ids"].numel()))
            return out

    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=1,
            max_steps=args.steps, learning_rate=1e-4, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
            adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler_type="constant_with_warmup",
            warmup_steps=round(0.05 * args.steps), use_cpu=True, train_sampling_strategy="sequential",
            dataloader_num_workers=0, save_strategy="no", logging_steps=10**6, report_to=[], disable_tqdm=True,
            torch_compile=args.compile)
        trainer = Recording(model=model, args=targs, train_dataset=Blocks(), callbacks=[Clock()])
        trainer.train()
    cfg = model.config
    print(json.dumps({
        "seconds": [b - a for a, b in zip(marks, marks[1:], strict=False)],
        "cpu_seconds": [b - a for a, b in zip(cpus, cpus[1:], strict=False)],
        "losses": losses, "tokens": toks, "threads": torch.get_num_threads(),
        "optimizer": f"{getattr(targs.optim, 'value', targs.optim)} (fused={trainer.optimizer.defaults.get('fused')})"
                     + (", torch_compile=True" if args.compile else ""),
        "params": sum(p.numel() for p in model.parameters()), "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size, "wall": time.perf_counter() - t_start}))


def cpu_matmul_peak(threads: int, n: int = 2048, reps: int = 5) -> float:
    """fp32 FLOP/s of an n³ ``torch.mm`` on this CPU with ``threads`` torch threads, best of ``reps``."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    torch.set_num_threads(prev)
    return 2.0 * n**3 / best


def _smollm2_run(who: str, stream: Path, out: Path, args: argparse.Namespace, env: dict[str, str]) -> dict:
    """One process of one side (``cptkit`` or ``hf``): step and CPU seconds, losses, tokens per step, wall, info."""
    import json
    import subprocess

    if who == "cptkit":
        cmd = [sys.executable, "-m", "cptkit.cli", "train", "--in", str(stream), "--out", str(out), "model=hf",
               "model.path=smollm2", f"train.micro_batch={args.micro_batch}", f"train.max_steps={args.steps}",
               f"train.threads={args.threads}", "train.precision=fp32", "train.eval_every=0", "-q"]
        cmd += ["train.compile=true"] if args.compile else []
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--hf-worker", "--stream", str(stream),
               "--micro-batch", str(args.micro_batch), "--steps", str(args.steps), "--threads", str(args.threads)]
        cmd += ["--compile"] if args.compile else []
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"{who}: {r.stderr[-3000:]}")
    if who == "hf":
        got = json.loads(r.stdout.strip().splitlines()[-1])
        got["info"] = f"{got['optimizer']}, {got['threads']} torch threads"
    else:
        recs = step_records(out)
        ex = json.loads((out / "_manifest.json").read_text())["extra"]
        cum = [0] + [x["tokens"] for x in recs]
        got = {"seconds": [x["seconds"] for x in recs], "cpu_seconds": [x["cpu_seconds"] for x in recs],
               "losses": [x["loss"] for x in recs], "tokens": [b - a for a, b in zip(cum, cum[1:], strict=False)],
               "info": f"{ex['engine']} engine, {ex['optimizer']}, {ex['precision']}, "
                       f"gradient checkpointing {ex['gradient checkpointing']}, compile {ex.get('compile', 'off')}"}
        shutil.rmtree(out, ignore_errors=True)  # model + checkpoint with Adam moments: ~2 GB, one run at a time
    got["wall"] = wall
    return got


def smollm2_vs_hf(args: argparse.Namespace) -> None:
    """``cptkit train`` and HF ``Trainer`` on SmolLM2-135M, interleaved; writes the train_cpu_smollm2 section."""
    from cptkit.models.lm import load_tokenizer

    src = Path(args.corpus) if args.corpus else corpus()
    work = Path(tempfile.mkdtemp(prefix="cptkit-bench-smollm2-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res: dict[str, list[dict]] = {"cptkit": [], "hf": []}
    loads: list[float] = [os.getloadavg()[0]]
    peak = cpu_matmul_peak(args.threads)
    try:
        tok_dir = work / "tok"
        load_tokenizer("smollm2").save_pretrained(str(tok_dir))
        need = args.steps * args.micro_batch * args.seq_len
        stream = build_stream(src, work / "stream", tok_dir, args.seq_len, max(300_000, 2 * need), env)
        for rep in range(args.repeats):
            for who in ["cptkit", "hf"] if rep % 2 == 0 else ["hf", "cptkit"]:
                got = _smollm2_run(who, stream, work / f"run-{who}-{rep}", args, env)
                res[who].append(got)
                loads.append(os.getloadavg()[0])
                print(f"rep {rep} {who}: {_median_step(got['seconds']) * 1000:,.0f} ms/step "
                      f"(steps {', '.join(f'{x:.1f}' for x in got['seconds'])} s), "
                      f"{_median_step(got['cpu_seconds']) * 1000:,.0f} CPU ms/step, wall {got['wall']:.1f} s, "
                      f"tokens/step {sorted(set(got['tokens']))}, losses {[round(x, 5) for x in got['losses']]}, "
                      f"load {loads[-1]:.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peak = max(peak, cpu_matmul_peak(args.threads))
    print(f"fp32 matmul peak ({args.threads} threads): {peak / 1e9:,.1f} GFLOP/s", flush=True)
    body = _smollm2_body(args, res, peak, loads)
    cmd = "python bench/train.py " + " ".join(sys.argv[1:])
    if args.compile:  # its own section: the eager comparison stays
        write_section("train_cpu_smollm2_compile", "CPT step of SmolLM2-135M on CPU, both compiled: cptkit train "
                      "(train.compile=true) vs HF Trainer (torch_compile=True)", cmd, body)
    else:
        write_section("train_cpu_smollm2", "CPT step of SmolLM2-135M on CPU: cptkit train vs HF Trainer", cmd, body)
    print(body)


def _smollm2_body(args: argparse.Namespace, res: dict[str, list[dict]], peak: float, loads: list[float]) -> str:
    """The section's text: the table (median repeat per side), the same-work check and the columns explained."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from train_mfu import flops_per_token

    from cptkit.training.engine import cpu_has_bf16

    def med(who: str, key: str) -> float:
        xs = sorted(_median_step(g[key]) if key != "wall" else g[key] for g in res[who])
        return xs[len(xs) // 2]

    hf0 = res["hf"][0]
    fpt = flops_per_token(hf0["params"], hf0["layers"], hf0["hidden"], args.seq_len)
    step_tok = args.micro_batch * args.seq_len
    step = {w: med(w, "seconds") for w in res}
    rows = []
    for who, name in (("cptkit", "cptkit train"), ("hf", "HF Trainer")):
        tps = step_tok / step[who]
        rows.append([name, f"{args.micro_batch} × {args.seq_len}", f"{step[who] * 1000:,.0f}", f"{tps:,.1f}",
                     f"{med(who, 'cpu_seconds') * 1000:,.0f}", f"{fpt * tps / 1e9:,.1f}",
                     f"{100 * fpt * tps / peak:.1f}%", f"{step['hf'] / step[who]:.2f}",
                     f"{med('hf', 'cpu_seconds') / med(who, 'cpu_seconds'):.2f}", f"{med(who, 'wall'):.0f}",
                     res[who][0]["info"]])
    toks = {w: sorted({t for g in res[w] for t in g["tokens"]}) for w in res}
    first = {w: [g["losses"][0] for g in res[w]] for w in res}
    d0 = max(abs(a - b) for a in first["cptkit"] for b in first["hf"])
    dall = max(abs(a - b) for c in res["cptkit"] for h in res["hf"] for a, b in zip(c["losses"], h["losses"], strict=True))
    same = toks["cptkit"] == toks["hf"] == [step_tok] and d0 <= 1e-4
    ratio = step["hf"] / step["cptkit"]
    util = {w: 100 * fpt * step_tok / step[w] / peak for w in step}
    return (
        f"SmolLM2-135M ({hf0['params'] / 1e6:.1f}M parameters: `model.path=smollm2`, the SmolLM2-135M-Instruct "
        "GGUF dequantized to fp32, loaded by the same function on both sides), continued pre-training on a "
        f"`cptkit build-mix` stream of {args.seq_len}-token sequences (demo corpus, English, SmolLM2's "
        f"tokenizer), micro-batch {args.micro_batch}, fp32, {args.threads} torch threads, {args.steps} optimizer "
        f"steps per process, {args.repeats} interleaved repeat(s) (the median repeat shown). cptkit: `cptkit train "
        f"model=hf model.path=smollm2 train.precision=fp32 train.eval_every=0`, its other defaults (wsd schedule "
        f"with 5% warmup, `train.engine=auto`, `train.gradient_checkpointing=auto`: see the *run* column). HF: "
        "`Trainer` with AdamW (0.9, 0.95, ε 1e-8, weight decay 0.1, none on norms), lr 1e-4 after cptkit's "
        "warm-up steps (`constant_with_warmup`), clipping 1.0, `use_cpu`, `dataloader_num_workers=0`, "
        "`save_strategy=\"no\"`, `report_to=[]`, the stream's sequences in order "
        "(`train_sampling_strategy=\"sequential\"`). Both step torch's fused AdamW kernel (the Trainer's default "
        "`adamw_torch_fused`; cptkit's `train.optimizer=adamw`).\n\n"
        + table(["trainer", "batch × seq", "ms/step", "tokens/s", "CPU ms/step", "GFLOP/s", "CPU utilisation",
                 "speed ratio (wall)", "speed ratio (CPU)", "process wall s", "run"], rows)
        + f"\n\n**Same work**: tokens per step {toks['cptkit']} (cptkit) and {toks['hf']} (HF); first-step loss "
        f"{first['cptkit'][0]:.6f} (cptkit) and {first['hf'][0]:.6f} (HF), largest difference over the repeats "
        f"{d0:.1e}, over every step {dall:.1e}: "
        + ("the two sides train on the same tokens from the same weights. " if same else
           "**the two sides do not do the same work** (tokens or first loss differ): the ratio is not comparable. ")
        + f"**Target** (speed ratio ≥ 1.2): {'reached' if ratio >= 1.2 else 'not reached'} ({ratio:.2f}). "
        f"Both sides run at {min(util.values()):.0f}–{max(util.values()):.0f}% of the measured fp32 matmul peak: "
        "the step is the model's own matmuls, the same on both sides, so a 1.2× at the same precision needs less "
        "arithmetic per token, not less overhead (bf16, which this CPU "
        f"{'has natively' if cpu_has_bf16() else 'lacks'}, would speed both sides alike).\n\n"
        "*ms/step*: median optimizer step after two warm-up steps (cptkit: `metrics.jsonl`, which times data "
        "draw, forward, backward, clipping, AdamW step and loss sync, not its per-step log lines; HF: a callback "
        "timing step end to step end, which includes the Trainer's own per-step work). *tokens/s*: micro-batch × "
        "sequence ÷ ms/step. *CPU ms/step*: process CPU time per step, all threads. *GFLOP/s*: "
        "(6·N + 12·L·d·s) FLOPs per token (PaLM App. B) × tokens/s. *CPU utilisation*: GFLOP/s ÷ the fp32 "
        f"matmul peak measured here, {peak / 1e9:,.1f} GFLOP/s (a 2048³ `torch.mm` on {args.threads} threads, "
        "best of 5, before and after the runs). *speed ratio* = HF ÷ cptkit (wall time, CPU time; above 1: "
        "cptkit faster). *process wall*: the whole process (imports, dequantizing the GGUF, training; cptkit "
        "also saves the model and a resumable checkpoint, TensorBoard and plots). Load average during the "
        f"run: {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} cores."
    )


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
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M: cptkit train vs HF Trainer instead")
    ap.add_argument("--compile", action="store_true", help="--smollm2 with torch.compile on both sides")
    ap.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=None, help="20 (--overhead), 6 (--smollm2)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=None, help="256 (--overhead), 1024 (--smollm2)")
    ap.add_argument("--micro-batch", type=int, default=None, help="4 (--overhead), 1 (--smollm2)")
    ap.add_argument("--interval", type=int, default=10)
    args = ap.parse_args()
    for key, overhead, smol in (("steps", 20, 6), ("seq_len", 256, 1024), ("micro_batch", 4, 1)):
        if getattr(args, key) is None:
            setattr(args, key, smol if args.smollm2 or args.hf_worker else overhead)
    if args.plain_worker:
        return plain_worker(args)
    if args.hf_worker:
        return hf_worker(args)
    if args.smollm2:
        return smollm2_vs_hf(args)
    if not args.overhead:
        return train_vs_plain(args)
    return overhead(args)


if __name__ == "__main__":
    main()
