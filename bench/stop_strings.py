"""CPU and memory of a request's stop strings on SmolLM2's 49k-vocabulary tokenizer: transformers'
``stop_strings`` (StopStringCriteria: one vocabulary × stop-length table per set of stop strings, kept in
an LRU of 8) against cptkit's RowStop (decode each row's last tokens after every token and search).

    python bench/stop_strings.py
"""

from __future__ import annotations

import resource
import time

import torch
from transformers import AutoTokenizer
from transformers.generation.stopping_criteria import StopStringCriteria

from cptkit.llm.hf import RowStop, embedded_model_path


def main() -> None:
    path = embedded_model_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = torch.randint(0, len(tok), (8, 2048), generator=torch.Generator().manual_seed(0))
    print(f"vocabulary {len(tok):,}; one step = 8 rows of 2048 tokens")
    for n, length in [(4, 32), (16, 256)]:
        stops = [chr(ord("a") + i) * length for i in range(n)]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.process_time()
        hf = StopStringCriteria(tok, stops)
        build = time.process_time() - t
        t = time.process_time()
        hf(ids, None)
        step = time.process_time() - t
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024
        print(f"{n} x {length} chars: transformers table {hf.embedding_vec.numel() * 4 / 2**20:,.0f} MiB, "
              f"built in {build:.2f} CPU-s, one step {step * 1000:.1f} ms, peak RSS +{grown:,.0f} MiB")
        ours = RowStop(stops, [0] * 8, lambda x: tok.decode(x, skip_special_tokens=True))
        t = time.process_time()
        ours(ids, None)
        print(f"{n} x {length} chars: RowStop, no table, one step {(time.process_time() - t) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
