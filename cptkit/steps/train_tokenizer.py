"""train-tokenizer: train a byte-level BPE tokenizer on records' text (Rust ``tokenizers``), written as a
folder that ``build-mix tokenizer=DIR`` and ``train`` read.

The ``tokenizer.vocab_size`` tokens (special ``<unk> <s> </s> <pad>`` included) are learnt from the
``text`` of every input record in input order, or of the ``tokenizer.max_docs`` records with the smallest
seeded id hash (``seed``); the same inputs and config give the same ``tokenizer.json`` bytes
(:mod:`cptkit.text.bpe`). Like any step output, it is redone when an input or the config changes.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task, TaskResult
from cptkit.core.run import Run
from cptkit.core.step import step
from cptkit.text.bpe import save_tokenizer_folder, train_byte_bpe
from cptkit.text.hashing import fast_seeded_hash


@dataclass
class TokenizerConfig:
    vocab_size: int = 8192  # tokens in all: 256 bytes, 4 special tokens and the merges
    min_frequency: int = 2  # a pair merged fewer times than this is never merged
    max_docs: int = 0  # learn from the max_docs records with the smallest seeded id hash (0: every record)
    field: str = "text"  # the record field learnt from

    def __post_init__(self) -> None:
        check(self.vocab_size >= 300, "vocab_size", self.vocab_size, "must be >= 300 (256 bytes, 4 special tokens)")
        check(self.min_frequency >= 1, "min_frequency", self.min_frequency, "must be >= 1")
        check(self.max_docs >= 0, "max_docs", self.max_docs, "must be >= 0 (0: every record)")


@dataclass
class TrainTokenizerJob(JobConfig):
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)


@step("train-tokenizer", TrainTokenizerJob, order=125)
def run(conf: TrainTokenizerJob, ctx: Run) -> dict:
    c = conf.tokenizer
    inputs = ctx.resolve_inputs()
    with Job(ctx, inputs=inputs, tasks=[Task(0, inputs)]) as job:
        extra: dict = {}
        for task in job.pending():
            t0 = time.time()
            kept: list[tuple[int, int, str]] = []  # (-hash, position, text): a max-heap of the smallest hashes
            n = 0
            for n, rec in enumerate(job.read(task), 1):
                text = rec.get(c.field)
                if not isinstance(text, str):
                    raise CptkitError(f"record {rec['id']!r}: no string field {c.field!r} to learn from")
                item = (-fast_seeded_hash(conf.seed, str(rec["id"])), n, text)
                if not c.max_docs or len(kept) < c.max_docs:
                    heapq.heappush(kept, item)
                elif item > kept[0]:
                    heapq.heapreplace(kept, item)
            if not kept:
                raise CptkitError("train-tokenizer: the input holds no records")
            texts = [t for _, _, t in sorted(kept, key=lambda k: k[1])]  # input order
            tok = train_byte_bpe(texts, c.vocab_size, c.min_frequency)
            files = save_tokenizer_folder(tok, job.out)
            extra = {"records read": n, "records learnt from": len(texts), "vocabulary": tok.get_vocab_size()}
            job.complete(task, result=TaskResult(files=files), seconds=time.time() - t0, **extra)
        return job.finish(extra=extra)
