"""label-topics-annotate: an LLM labels a sample of pages zero-shot (Llama-3-SynE §4.1.1, App. B).

The sample is the ``topics.sample`` records with the smallest hash of ``(seed, id)`` over all
inputs: the same pages whatever the sharding or order. Each page's language is detected (or
taken from ``lang``); pages in a language with a taxonomy get the prompt "topic list + page"
(``prompt`` of ``conf/topics/<lang>.yaml``), generated greedily through the ``llm`` config group
(``cptkit.llm``). Answers are mapped onto the taxonomy (:func:`cptkit.topics.map_answer`) or
rejected; rejected answers are counted and kept in ``_rejected.jsonl``.
"""

from __future__ import annotations

import heapq
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from omegaconf import DictConfig

from cptkit.classify import unit_hash
from cptkit.config import JobConfig, register_step
from cptkit.job import Job, Task
from cptkit.llm.config import LLMConfig
from cptkit.records import Record
from cptkit.shards import atomic_write_bytes, resolve_inputs
from cptkit.steps.label_topics import TopicsConfig, languages_of, taxonomies
from cptkit.topics import build_prompt, map_answer


@dataclass
class AnnotateConfig(TopicsConfig):
    sample: int = 5000  # pages to annotate (paper: 5,000)
    max_chars: int = 2000  # characters of the page put into the prompt
    max_new_tokens: int = 16
    temperature: float = 0.0  # greedy
    fuzzy_cutoff: float = 0.85  # difflib ratio for near-miss spellings


@dataclass
class LabelTopicsAnnotateJob(JobConfig):
    topics: AnnotateConfig = field(default_factory=AnnotateConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)


register_step("label-topics-annotate", LabelTopicsAnnotateJob)


def bottom_k(records: Iterable[Record], k: int, seed: int) -> list[Record]:
    """The ``k`` records with the smallest ``unit_hash(seed, id)``, in that order (order-free sample)."""
    heap: list[tuple[float, str, Record]] = []  # max-heap on the hash: keeps the k smallest
    for rec in records:
        item = (-unit_hash(seed, rec["id"]), rec["id"], rec)
        if len(heap) < k:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)
    return [rec for _, _, rec in sorted(heap, key=lambda x: (-x[0], x[1]))]


def run(cfg: DictConfig) -> dict:
    from cptkit.llm import load_generator

    taxes = taxonomies(cfg)
    a = cfg.topics
    inputs = resolve_inputs(list(cfg.io.inputs))
    with Job(cfg, inputs=inputs, tasks=[Task(0, inputs)]) as job:
        extra: dict = {}
        for task in job.pending():
            t0 = time.time()
            sample = bottom_k(job.read(task), int(a.sample), int(cfg.seed))
            langs = languages_of(sample, str(cfg.topics.lang_field), bool(cfg.topics.redetect))
            todo = [(rec, lang) for rec, lang in zip(sample, langs, strict=True) if lang in taxes]
            stats: Counter = Counter(sampled=len(sample), **{"no taxonomy for language": len(sample) - len(todo)})
            gen = load_generator(cfg.llm)
            prompts = [build_prompt(taxes[lang], rec["text"], int(a.max_chars)) for rec, lang in todo]
            advance = job.add_bar("annotate", len(prompts))
            outs = gen.generate(prompts, gen.params(max_new_tokens=int(a.max_new_tokens),
                                                    temperature=float(a.temperature)), progress=advance)
            rejected = []
            with job.writer(task) as w:
                for (rec, lang), out in zip(todo, outs, strict=True):
                    topic = map_answer(out.text, taxes[lang], float(a.fuzzy_cutoff))
                    if topic is None:
                        stats[f"{lang} rejected"] += 1
                        rejected.append({"id": rec["id"], "lang": lang, "answer": out.text})
                        continue
                    stats[f"{lang} mapped"] += 1
                    w.write({**rec, str(cfg.topics.lang_field): lang, "topic": topic,
                             "topic_answer": out.text.strip(), "topic_annotator": str(cfg.llm.model)})
            atomic_write_bytes(job.out / "_rejected.jsonl",
                               "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejected).encode())
            job.complete(task, w, seconds=time.time() - t0, annotate=dict(stats), llm=gen.stats.as_dict())
            extra = dict(stats)
        return job.finish(extra=extra)
