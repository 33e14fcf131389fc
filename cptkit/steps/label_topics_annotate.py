"""label-topics-annotate: LLM zero-shot topic labels for a sample (topics.sample=N): every topic name
scored by log-likelihood, or topics.annotate_mode=generate (SPEC §5; Llama-3-SynE §4.1.1, App. B).

The sample is the ``topics.sample`` records with the smallest hash of ``(seed, id)`` over all
inputs: the same pages whatever the sharding or order. Each page's language is detected (or
taken from ``lang``); pages in a language with a taxonomy get the prompt "topic list + page"
(``prompt`` of ``conf/topics/<lang>.yaml``). Two modes (``topics.annotate_mode``):

* ``loglikelihood`` (default): every topic name is scored as the continuation of the prompt
  (lm-eval ``loglikelihood`` conventions, :func:`cptkit.models.scoring.encode_pair`); the topic with the
  highest length-normalised log-likelihood wins (:func:`cptkit.labels.topics.pick_topic`), so every
  page maps onto the taxonomy. Needs a local model (``llm.backend=transformers``).
* ``generate``: the answer is generated greedily through the ``llm`` config group (any
  backend) and mapped onto the taxonomy (:func:`cptkit.labels.topics.map_answer`) or rejected;
  rejected answers are counted and kept in ``_rejected.jsonl``.
"""

from __future__ import annotations

import copy
import heapq
import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.records import Record
from cptkit.core.run import Run
from cptkit.core.shards import read_records
from cptkit.core.step import step
from cptkit.labels.topics import (
    NORMS,
    build_prompt,
    fewshot_messages,
    map_answer,
    nearest_topics,
    pick_demos,
    pick_topic,
    truncate_tokens,
)
from cptkit.llm import load_generator
from cptkit.llm.config import LLMConfig
from cptkit.steps.label_topics import TopicsConfig, taxonomies
from cptkit.text.hashing import unit_hash
from cptkit.text.langid import record_languages

MODES = ("embedding", "loglikelihood", "generate")


@dataclass
class AnnotateConfig(TopicsConfig):
    sample: int = 5000  # pages to annotate (paper: 5,000)
    annotate_mode: str = "embedding"  # embedding (nearest topic description) | loglikelihood | generate
    embed_model: str | None = None  # embedding: a sentence-encoder folder (None: all-MiniLM-L6-v2, offline)
    embed_max_tokens: int = 256  # embedding: page tokens the encoder reads
    embed_temperature: float = 0.05  # embedding: topic_score = softmax(cosine / temperature)
    few_shot: int = 0  # loglikelihood/generate: labelled demonstrations per topic (0: zero-shot)
    few_shot_file: str | None = None  # JSONL with text, topic (and lang) to draw them from
    few_shot_chars: int = 300  # characters of each demonstration in the prompt
    max_chars: int = 2000  # characters of the page put into the prompt
    max_page_tokens: int = 256  # loglikelihood: page tokens kept in the prompt (prefill cost); 0 = all
    norm: str = "chars"  # loglikelihood: chars (lm-eval acc_norm) | tokens | none (acc)
    calibrate: bool = True  # loglikelihood: subtract each topic's log-likelihood given a content-free page
    content_free: str = "N/A"  # the content-free page of the calibration prompt
    topic_batch_size: int = 16  # loglikelihood: topic continuations per forward pass over the shared context
    max_new_tokens: int = 16
    temperature: float = 0.0  # greedy
    fuzzy_cutoff: float = 0.85  # difflib ratio for near-miss spellings

    def __post_init__(self) -> None:
        check(self.annotate_mode in MODES, "annotate_mode", self.annotate_mode, f"expected one of {', '.join(MODES)}")
        check(self.annotate_mode != "loglikelihood" or self.norm in NORMS, "norm", self.norm,
              f"expected one of {', '.join(NORMS)}")
        check(self.annotate_mode == "embedding" or self.few_shot <= 0 or self.few_shot_file not in (None, ""), "few_shot",
              self.few_shot, "needs topics.few_shot_file=FILE (JSONL records with text and topic)")


@dataclass
class LabelTopicsAnnotateJob(JobConfig):
    topics: AnnotateConfig = field(default_factory=AnnotateConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)

    def __post_init__(self) -> None:
        mode, backend = self.topics.annotate_mode, self.llm.backend
        check(mode != "loglikelihood" or backend == "transformers", "topics.annotate_mode", mode,
              f"scores topics with a local model's log-probabilities and needs llm.backend=transformers, not "
              f"{backend}; use topics.annotate_mode=generate with this backend")


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


def topic_loglikelihoods(model, tokenizer, context: str, topics: list[str], batch_size: int = 16,
                         max_length: int | None = None) -> list[tuple[float, int]]:
    """``(sum log p(topic | context), topic tokens)`` for each topic, in order.

    The numbers of :func:`cptkit.models.scoring.loglikelihood` on ``[(context, t) for t in topics]``
    (lm-eval tokenization via :func:`cptkit.models.scoring.encode_pair`: the context is encoded alone, so it
    is the same token sequence for every topic), but the shared context is run through the model
    once and its KV cache is reused by batches of ``batch_size`` continuations (right-padded).
    """
    import torch
    import torch.nn.functional as F

    from cptkit.models.scoring import encode_pair, model_max_length  # deferred: torch

    pairs = [encode_pair(tokenizer, context, t) for t in topics]
    ctx = pairs[0][0]
    conts = [cont for _, cont in pairs]
    for t, cont in zip(topics, conts, strict=True):
        if not cont:
            raise CptkitError(f"topic {t!r} has no tokens after the prompt")
    limit = max_length or model_max_length(model, tokenizer)
    need = len(ctx) + max(len(c) for c in conts) - 1
    if need > limit:
        raise CptkitError(f"annotation prompt of {len(ctx)} tokens + topic exceeds the model's {limit} tokens; "
                          "lower topics.max_page_tokens")
    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ctx], device=device), use_cache=True)
        first = F.log_softmax(out.logits[0, -1].float(), dim=-1)
        lls = [float(first[c[0]]) for c in conts]
        rest = [i for i, c in enumerate(conts) if len(c) > 1]
        for b in range(0, len(rest), max(batch_size, 1)):
            idx = rest[b:b + max(batch_size, 1)]
            width = max(len(conts[i]) - 1 for i in idx)
            inp = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                inp[r, :len(conts[i]) - 1] = torch.tensor(conts[i][:-1])
            cache = copy.deepcopy(out.past_key_values)
            cache.batch_repeat_interleave(len(idx))
            logp = F.log_softmax(model(input_ids=inp.to(device), past_key_values=cache, use_cache=True).logits.float(),
                                 dim=-1)
            for r, i in enumerate(idx):
                target = torch.tensor(conts[i][1:], device=logp.device)
                lls[i] += float(logp[r, :len(target)].gather(1, target[:, None]).sum())
    return [(ll, len(c)) for ll, c in zip(lls, conts, strict=True)]


def load_demos(conf: LabelTopicsAnnotateJob, taxes: dict, ctx: Run) -> dict[str, list[tuple[str, str]]]:
    """Few-shot demonstrations per language (``topics.few_shot`` per topic from ``topics.few_shot_file``,
    read under the run's settings ``ctx``)."""
    a = conf.topics
    k = a.few_shot
    if k <= 0 or not a.few_shot_file:  # few_shot > 0 without a file is refused by AnnotateConfig
        return {}
    examples: dict[str, list[tuple[str, str, str]]] = {}
    recs = [r for inp in ctx.resolve_inputs([a.few_shot_file]) for r in read_records(inp)]
    langs = record_languages(recs, a.lang_field, a.redetect)
    for rec, lang in zip(recs, langs, strict=True):
        if lang not in taxes:
            continue
        if rec.get("topic") not in taxes[lang].topics:
            raise CptkitError(f"{a.few_shot_file}: record {rec['id']!r} has topic {rec.get('topic')!r}, "
                              f"not a topic of the {lang} taxonomy")
        examples.setdefault(lang, []).append((rec["id"], rec["text"], rec["topic"]))
    return {lang: pick_demos(ex, taxes[lang].topics, k, conf.seed) for lang, ex in examples.items()}


def annotate_embedding(todo: list[tuple[Record, str]], taxes: dict, conf: LabelTopicsAnnotateJob, job: Job,
                       stats: Counter) -> list[Record]:
    """Embed pages and topic descriptions with a sentence encoder; each page gets the nearest topic."""
    from cptkit.labels.encoder import SentenceEncoder  # deferred: numpy

    a = conf.topics
    enc = SentenceEncoder(a.embed_model, max_length=a.embed_max_tokens)
    labelled = []
    advance = job.add_bar("annotate", len(todo))
    for lang in sorted({lang for _, lang in todo}):
        tax = taxes[lang]
        tvecs = enc.encode([tax.description(t) for t in tax.topics])
        recs = [rec for rec, la in todo if la == lang]
        pvecs = enc.encode([rec["text"][:a.max_chars] for rec in recs], progress=advance)
        best, probs = nearest_topics(pvecs, tvecs, a.embed_temperature)
        for rec, b, pr in zip(recs, best, probs, strict=True):
            stats[f"{lang} mapped"] += 1
            stats[f"{lang}: {tax.topics[b]}"] += 1
            labelled.append({**rec, a.lang_field: lang, "topic": tax.topics[b], "topic_score": round(pr[b], 6),
                             "topic_annotator": a.embed_model or "all-MiniLM-L6-v2",
                             "topic_annotate_mode": "embedding"})
    order = {rec["id"]: i for i, (rec, _) in enumerate(todo)}
    return sorted(labelled, key=lambda r: order[r["id"]])


def annotate_generate(gen, todo: list[tuple[Record, str]], taxes: dict, conf: LabelTopicsAnnotateJob, job: Job,
                      stats: Counter) -> tuple[list[Record], list[dict]]:
    """Generate an answer per page and map it onto the taxonomy: (labelled records, rejected answers)."""
    a = conf.topics
    demos = load_demos(conf, taxes, job.ctx)
    prompts = [fewshot_messages(taxes[lang], demos[lang], rec["text"], a.max_chars, a.few_shot_chars)
               if demos.get(lang) else build_prompt(taxes[lang], rec["text"], a.max_chars) for rec, lang in todo]
    advance = job.add_bar("annotate", len(prompts))
    outs = gen.generate(prompts, gen.params(max_new_tokens=a.max_new_tokens, temperature=a.temperature),
                        progress=advance)
    labelled, rejected = [], []
    for (rec, lang), out in zip(todo, outs, strict=True):
        topic = map_answer(out.text, taxes[lang], a.fuzzy_cutoff)
        if topic is None:
            stats[f"{lang} rejected"] += 1
            rejected.append({"id": rec["id"], "lang": lang, "answer": out.text})
            continue
        stats[f"{lang} mapped"] += 1
        labelled.append({**rec, a.lang_field: lang, "topic": topic, "topic_answer": out.text.strip(),
                         "topic_annotator": conf.llm.model, "topic_annotate_mode": "generate"})
    return labelled, rejected


def annotate_loglikelihood(gen, todo: list[tuple[Record, str]], taxes: dict, conf: LabelTopicsAnnotateJob, job: Job,
                           stats: Counter) -> list[Record]:
    """Score every topic of the page's taxonomy as the prompt's continuation; argmax (normalised)."""
    a = conf.topics
    bs = a.topic_batch_size
    demos = load_demos(conf, taxes, job.ctx)

    def request(lang: str, page: str):
        if demos.get(lang):
            return fewshot_messages(taxes[lang], demos[lang], page, a.max_chars, a.few_shot_chars)
        return build_prompt(taxes[lang], page, a.max_chars)

    baselines: dict[str, list[float] | None] = {}
    for lang in sorted({lang for _, lang in todo}):
        baselines[lang] = None if not a.calibrate else [ll for ll, _ in topic_loglikelihoods(
            gen.model, gen.tok, gen.render(request(lang, a.content_free)), taxes[lang].topics, bs)]
    advance = job.add_bar("annotate", len(todo))
    labelled = []
    for rec, lang in todo:
        tax = taxes[lang]
        page = truncate_tokens(gen.tok, rec["text"][:a.max_chars], a.max_page_tokens)
        context = gen.render(request(lang, page))
        scored = topic_loglikelihoods(gen.model, gen.tok, context, tax.topics, batch_size=bs)
        best, probs = pick_topic(tax.topics, [ll for ll, _ in scored], [n for _, n in scored], a.norm,
                                 baselines[lang])
        stats[f"{lang} mapped"] += 1
        stats[f"{lang}: {tax.topics[best]}"] += 1
        labelled.append({**rec, a.lang_field: lang, "topic": tax.topics[best], "topic_score": round(probs[best], 6),
                         "topic_annotator": conf.llm.model, "topic_annotate_mode": "loglikelihood"})
        advance(1)
    return labelled


@step("label-topics-annotate", LabelTopicsAnnotateJob, order=80)
def run(conf: LabelTopicsAnnotateJob, ctx: Run) -> dict:
    a = conf.topics
    mode = a.annotate_mode  # with an llm backend that supports it (LabelTopicsAnnotateJob)
    taxes = taxonomies(conf)
    inputs = ctx.resolve_inputs()
    with Job(ctx, inputs=inputs, tasks=[Task(0, inputs)]) as job:
        extra: dict = {}
        for task in job.pending():
            t0 = time.time()
            sample = bottom_k(job.read(task), a.sample, conf.seed)
            langs = record_languages(sample, a.lang_field, a.redetect)
            todo = [(rec, lang) for rec, lang in zip(sample, langs, strict=True) if lang in taxes]
            stats: Counter = Counter(sampled=len(sample), **{"no taxonomy for language": len(sample) - len(todo)})
            gen = load_generator(conf.llm) if mode != "embedding" else None
            t1 = time.time()
            if mode == "embedding":
                labelled, rejected = annotate_embedding(todo, taxes, conf, job, stats), []
            elif mode == "generate":
                labelled, rejected = annotate_generate(gen, todo, taxes, conf, job, stats)
            else:
                labelled, rejected = annotate_loglikelihood(gen, todo, taxes, conf, job, stats), []
            secs = time.time() - t1
            with job.writer(task) as w:
                for rec in labelled:
                    w.write(rec)
            job.write_bytes("_rejected.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejected).encode())
            timing = {"mode": mode, "pages": len(todo), "seconds": round(secs, 3), "few_shot": a.few_shot,
                      **({"norm": a.norm, "calibrate": a.calibrate} if mode == "loglikelihood" else {}),
                      "pages_per_s": round(len(todo) / secs, 3) if secs > 0 else None}
            job.complete(task, w, seconds=time.time() - t0, annotate=dict(stats), timing=timing,
                         llm=gen.stats.as_dict() if gen is not None else {})
            extra = {"annotate mode": mode} | dict(stats) | {"annotate pages/s": timing["pages_per_s"]}
        return job.finish(extra=extra)
