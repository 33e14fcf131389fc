"""expand-queries: LLM query expansion: Question Extension + Thought Generation over expand.rounds,
cleaning and MinHash near-dup removal each round; llm=transformers|openai|vllm (SPEC §1;
Retrieve-from-CC §3.2, App. E).

Round r expands the *frontier*: the seeds in round 1, then everything generated and kept in
round r-1 — questions, answers and chains of thought (§3.2: "the generated data is stored in a
seed information pool for the next iteration", after both Question Extension and Thought
Generation; ``expand.next_round_kinds`` narrows it); ``expand.rounds=0`` writes the seeds alone
as queries, the baseline of expansion (no LLM is loaded). Each item gets ``questions_per_seed`` new
questions (keyword seeds use cptkit's keyword prompt, everything else App. E's Question Extension
prompt), each new question gets an answer and a chain of thought (App. E's Thought Generation
prompt). After every generation stage the outputs are cleaned (incomplete / non-natural-language
/ too short ... dropped and counted) and near-duplicates of anything already in the pool are
removed with MinHash-LSH (cptkit.dedup.minhash, verified Jaccard). Seeds, questions, answers and
thoughts are all written as queries; generated records carry ``meta.generator`` (prompt, model,
sampling parameters, seed).

One global task (the pool is global); resume comes from the LLM cache: a killed run reruns
without regenerating and writes the same output.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.progress import log
from cptkit.core.records import Record
from cptkit.core.run import Run
from cptkit.core.step import step
from cptkit.llm import load_generator
from cptkit.llm.config import LLMConfig
from cptkit.llm.prompts import PromptConfig, check_prompt, max_new_tokens, render
from cptkit.synthetic.qa import clean_text, parse_question, parse_thought

GENERATED_KINDS = ("question", "answer", "thought")


@dataclass
class CleanConfig:
    """Post-processing of generated text (see cptkit.synthetic.qa.clean_text)."""

    min_words: int = 3
    max_words: int = 400
    min_alpha_ratio: float = 0.6
    min_unique_ratio: float = 0.3
    trim_truncated: bool = True  # keep the complete sentences of a truncated output


@dataclass
class QueryDedupConfig:
    """MinHash-LSH near-duplicate removal of the query pool (cptkit.dedup.minhash)."""

    enabled: bool = True
    threshold: float = 0.8
    num_perm: int = 128
    ngram: int = 3  # word n-grams; queries are short (13-grams would reduce to exact matching)
    target_recall: float = 0.95
    seed: int = 42


@dataclass
class ExpandConfig:
    rounds: int = 2  # 0: the seeds alone are the queries (no LLM is loaded)
    questions_per_seed: int = 2  # new questions per frontier item and round (distinct sample seeds)
    thoughts: bool = True  # Thought Generation: answer + chain of thought per new question
    max_frontier: int = 0  # expand at most this many items per round (seeded sample; 0 = all)
    # kinds of the round's kept output that form the next round's frontier (paper §3.2: all three)
    next_round_kinds: list[str] = field(default_factory=lambda: ["question", "answer", "thought"])
    domain_fields: list[str] = field(default_factory=lambda: ["domain", "category"])
    question_prompt: PromptConfig = field(default_factory=PromptConfig)
    keyword_prompt: PromptConfig = field(default_factory=PromptConfig)
    thought_prompt: PromptConfig = field(default_factory=PromptConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    dedup: QueryDedupConfig = field(default_factory=QueryDedupConfig)

    def __post_init__(self) -> None:
        check(self.rounds >= 0, "rounds", self.rounds, "must be >= 0")
        check(self.questions_per_seed >= 1, "questions_per_seed", self.questions_per_seed, "must be >= 1")
        bad = sorted(set(self.next_round_kinds) - set(GENERATED_KINDS))
        check(not bad, "next_round_kinds", self.next_round_kinds, f"{bad} not among {list(GENERATED_KINDS)}")
        check_prompt(self.question_prompt, {"question"}, "question_prompt")
        check_prompt(self.keyword_prompt, {"keyword"}, "keyword_prompt")
        check_prompt(self.thought_prompt, {"question"}, "thought_prompt")


@dataclass
class ExpandQueriesJob(JobConfig):
    llm: LLMConfig = field(default_factory=LLMConfig)
    expand: ExpandConfig = field(default_factory=ExpandConfig)


def seed_type(rec: Record) -> str:
    """``keyword`` or ``question``: the record's ``seed_type`` field, else guessed from its text."""
    st = rec.get("seed_type")
    if st in ("keyword", "question"):
        return st
    text = str(rec["text"]).strip()
    return "question" if text.endswith(("?", "？")) or len(text.split()) > 6 else "keyword"


class QueryPool:
    """The growing query pool with incremental MinHash signatures for near-duplicate removal."""

    def __init__(self, cfg: QueryDedupConfig):
        self.cfg = cfg
        self.records: list[Record] = []
        self.enabled = cfg.enabled
        if self.enabled:
            from cptkit.dedup.minhash import Shingler, lsh_params  # deferred: numba

            self.sh = Shingler(ngram=cfg.ngram, num_perm=cfg.num_perm, seed=cfg.seed)
            self.bands, self.rows = lsh_params(cfg.threshold, cfg.num_perm, cfg.target_recall)
            self.sig = np.empty((0, cfg.num_perm), dtype=np.uint32)
            self.sets: list[np.ndarray] = []

    def seed(self, records: list[Record]) -> None:
        """Add the seeds unconditionally (they are the user's input, never dropped)."""
        self.records += records
        if self.enabled and records:
            texts = [r["text"] for r in records]
            self.sig = np.vstack([self.sig, self.sh.signatures(texts)])
            self.sets += self.sh.shingle_sets(texts)

    def add(self, candidates: list[Record]) -> tuple[list[Record], int]:
        """Add candidates that are not near-duplicates of the pool (or of earlier candidates)."""
        if not candidates:
            return [], 0
        if not self.enabled:
            self.records += candidates
            return candidates, 0
        from cptkit.dedup.minhash import (  # deferred: numba
            band_keys,
            candidate_pairs,
            jaccard_sorted,
            union_find_roots,
        )

        texts = [r["text"] for r in candidates]
        sig = np.vstack([self.sig, self.sh.signatures(texts)])
        sets = self.sets + self.sh.shingle_sets(texts)
        n_old = len(self.records)
        pairs = candidate_pairs(band_keys(sig, self.bands, self.rows, self.cfg.seed))
        if len(pairs):
            pairs = pairs[pairs[:, 1] >= n_old]  # pairs among old records were resolved before
            ok = [jaccard_sorted(sets[i], sets[j]) >= self.cfg.threshold for i, j in pairs]
            pairs = pairs[np.asarray(ok, dtype=bool)] if len(pairs) else pairs
        roots = union_find_roots(len(sets), pairs)
        keep = [k for k in range(len(candidates)) if roots[n_old + k] == n_old + k]
        kept = [candidates[k] for k in keep]
        idx = list(range(n_old)) + [n_old + k for k in keep]
        self.sig = sig[idx]
        self.sets = [sets[i] for i in idx]
        self.records += kept
        return kept, len(candidates) - len(kept)


@step("expand-queries", ExpandQueriesJob, order=20)
def run(conf: ExpandQueriesJob, ctx: Run) -> dict[str, Any]:
    inputs = ctx.resolve_inputs()
    task = Task(0, inputs)
    with Job(ctx, inputs=inputs, tasks=[task]) as job:
        for t in job.pending():
            t0 = time.time()
            records, stats = expand(conf, job, t)
            with job.writer(t) as w:
                for rec in records:
                    w.write(rec)
            job.complete(t, w, seconds=time.time() - t0, **stats)
        done = job.all_results().get(task.name, {}).get("extra", {}) if not job.stdout else stats
        if not job.stdout and done and not job.is_finished:
            job.write_json("_expand_stats.json", done)
        job.finish(extra=summary_rows(done))
        return {"output": str(job.out), **done}


def summary_rows(st: dict[str, Any]) -> dict[str, Any]:
    """Flat rows for the summary table and the manifest's ``extra`` (details: _expand_stats.json)."""
    if not st:
        return {}
    rows: dict[str, Any] = {"model": st["generator"]["model"]} if st["generator"] else {}
    rows["rounds"] = st["rounds"]
    rows |= {f"{k}s": v for k, v in st["kept"].items()}
    rows |= {f"dropped {k}": v for k, v in st["dropped"].items()}
    llm = st["llm"]
    if llm is None:  # rounds=0: no LLM
        return rows
    rows |= {"llm requests": llm["requests"], "llm cache hits": llm["cache_hits"],
             "llm prompt tokens": llm["prompt_tokens"], "llm completion tokens": llm["completion_tokens"],
             "llm generated tokens": llm["generated_tokens"], "llm tokens/s": llm["tokens_per_s"]}
    return rows


def expand(conf: ExpandQueriesJob, job: Job, task: Task) -> tuple[list[Record], dict[str, Any]]:
    """Run all rounds; returns the query records in pool order and the statistics."""
    ex = conf.expand
    seeds = list(job.read(task))
    ids = [r["id"] for r in seeds]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CptkitError(f"{task.inputs[0].name}: seed id {dup!r} appears more than once")
    gen = load_generator(conf.llm) if ex.rounds else None  # rounds=0: the seeds alone are the queries
    pool = QueryPool(ex.dedup)
    dropped: dict[str, int] = {}
    kept = {"seed": 0, "question": 0, "answer": 0, "thought": 0}
    per_round = []

    def domain_of(rec: Record) -> str:
        return next((str(rec[f]) for f in ex.domain_fields if rec.get(f)), "general")

    seed_recs = []
    for s in seeds:
        st = seed_type(s)
        seed_recs.append({**s, "kind": "seed", "seed_type": st, "parent": None, "round": 0,
                          "domain": domain_of(s), "seed_id": s["id"]})
    pool.seed(seed_recs)
    kept["seed"] = len(seed_recs)
    frontier = list(seed_recs)
    rng = random.Random(conf.seed)
    next_kinds = set(ex.next_round_kinds)
    for rnd in range(1, ex.rounds + 1):
        if ex.max_frontier and len(frontier) > ex.max_frontier:
            frontier = [frontier[i] for i in sorted(rng.sample(range(len(frontier)), ex.max_frontier))]
        if not frontier:
            log.info("round %d: nothing left to expand", rnd)
            break
        new_q, n_reqs = extend_questions(conf, gen, pool, frontier, rnd, job, dropped)
        new_t = generate_thoughts(conf, gen, pool, new_q, rnd, job, dropped) if ex.thoughts and new_q else []
        kept["question"] += len(new_q)
        n_ans = sum(r["kind"] == "answer" for r in new_t)
        n_cot = len(new_t) - n_ans
        kept["answer"] += n_ans
        kept["thought"] += n_cot
        expanded = [item["kind"] for item in frontier]
        frontier = [r for r in new_q + new_t if r["kind"] in next_kinds]
        per_round.append({"round": rnd, "expanded": len(expanded),
                          "expanded_by_kind": {kd: expanded.count(kd) for kd in ("seed", *GENERATED_KINDS)},
                          "question_requests": n_reqs, "questions": len(new_q), "answers": n_ans,
                          "thoughts": n_cot, "pool": len(pool.records), "next_frontier": len(frontier)})
        log.info("round %d: %d questions, %d answers, %d thoughts kept; pool %d", rnd, len(new_q), n_ans, n_cot,
                 len(pool.records))
    stats = {"rounds": len(per_round), "per_round": per_round, "kept": kept, "dropped": dict(sorted(dropped.items())),
             "generator": gen.describe() if gen else None, "llm": gen.stats.as_dict() if gen else None,
             "dedup": {"bands": pool.bands, "rows": pool.rows} if pool.enabled else None,
             "next_round_kinds": [kd for kd in GENERATED_KINDS if kd in next_kinds],
             "prompts": {n: getattr(ex, n).name for n in ("question_prompt", "keyword_prompt", "thought_prompt")}}
    if gen:
        gen.close()
    return pool.records, stats


def _drop(dropped: dict[str, int], reason: str | None, n: int = 1) -> None:
    if reason:
        dropped[reason] = dropped.get(reason, 0) + n


def extend_questions(conf: ExpandQueriesJob, gen: Any, pool: QueryPool, frontier: list[Record], rnd: int, job: Job,
                     dropped: dict[str, int]) -> tuple[list[Record], int]:
    """Question Extension of round ``rnd``: ``questions_per_seed`` new questions per frontier item,
    cleaned and near-deduplicated into ``pool``. Returns the kept questions and the request count."""
    ex, cl = conf.expand, dataclasses.asdict(conf.expand.clean)
    reqs, parents, seeds_ = [], [], []
    for item in frontier:
        is_kw = item["kind"] == "seed" and item["seed_type"] == "keyword"
        prompt = ex.keyword_prompt if is_kw else ex.question_prompt
        text = render(prompt, keyword=item["text"], question=item["text"], domain=item["domain"])
        for j in range(ex.questions_per_seed):
            reqs.append(text)
            parents.append((item, j, prompt))
            seeds_.append(conf.llm.seed * 1_000_003 + j)
    outs, used = _generate_grouped(gen, reqs, [p[2] for p in parents], seeds_,
                                   job.add_bar(f"round {rnd}: questions", len(reqs)), conf.llm,
                                   labels=[f"record {p[0]['id']!r}" for p in parents])
    cands = []
    for (item, j, prompt), c, par, sd in zip(parents, outs, used, seeds_, strict=True):
        q, why = clean_text(parse_question(c.text), c.finish_reason, **cl)
        if why:
            _drop(dropped, why)
            continue
        cands.append({"id": f"{item['id']}.r{rnd}q{j}", "text": q, "kind": "question", "parent": item["id"],
                      "round": rnd, "domain": item["domain"], "seed_id": item["seed_id"],
                      "meta": {"generator": gen.provenance(prompt.name, par, sd)}})
    new_q, n_dup = pool.add(cands)
    _drop(dropped, "near_duplicate" if n_dup else None, n_dup)
    return new_q, len(reqs)


def generate_thoughts(conf: ExpandQueriesJob, gen: Any, pool: QueryPool, new_q: list[Record], rnd: int, job: Job,
                      dropped: dict[str, int]) -> list[Record]:
    """Thought Generation of round ``rnd``: an answer and a chain of thought per new question,
    cleaned and near-deduplicated into ``pool``. Returns the kept answer / thought records."""
    ex, cl = conf.expand, dataclasses.asdict(conf.expand.clean)
    treqs = [render(ex.thought_prompt, question=q["text"], domain=q["domain"]) for q in new_q]
    tseeds = [conf.llm.seed] * len(treqs)
    touts, tused = _generate_grouped(gen, treqs, [ex.thought_prompt] * len(treqs), tseeds,
                                     job.add_bar(f"round {rnd}: thoughts", len(treqs)), conf.llm,
                                     labels=[f"record {q['id']!r}" for q in new_q])
    tc = []
    for q, c, par, sd in zip(new_q, touts, tused, tseeds, strict=True):
        answer, cot = parse_thought(c.text)
        # the answer precedes the chain of thought: it is complete unless nothing follows it
        a_reason = "stop" if cot or c.finish_reason == "stop" else c.finish_reason
        meta = {"generator": gen.provenance(ex.thought_prompt.name, par, sd)}
        for kind, text, fr in (("answer", answer, a_reason), ("thought", cot, c.finish_reason)):
            if kind == "thought" and not text:
                _drop(dropped, "no_thought")
                continue
            t, why = clean_text(text, fr, **cl)
            if why:
                _drop(dropped, why)
                continue
            tc.append({"id": f"{q['id']}.{kind[0]}", "text": t, "kind": kind, "parent": q["id"], "round": rnd,
                       "domain": q["domain"], "seed_id": q["seed_id"], "meta": meta})
    new_t, n_dup = pool.add(tc)
    _drop(dropped, "near_duplicate" if n_dup else None, n_dup)
    return new_t


def _generate_grouped(gen: Any, reqs: list, prompts: list[PromptConfig], seeds: list[int], advance: Any,
                      llm: LLMConfig | None = None, labels: list[str] | None = None) -> tuple[list, list]:
    """Generate requests whose prompts may differ in max_new_tokens / temperature, in order
    (``llm.max_new_tokens``, when set, wins over every prompt's own value).

    Returns the completions and the ``GenParams`` each was generated with.
    """
    out: list = [None] * len(reqs)
    used: list = [None] * len(reqs)
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault((max_new_tokens(p, llm or {}), p.temperature), []).append(i)
    for (mx, temp), idx in groups.items():
        params = gen.params(max_new_tokens=mx, temperature=temp)
        for i, c in zip(idx, gen.generate([reqs[i] for i in idx], params, seeds=[seeds[i] for i in idx],
                                          progress=advance, labels=labels and [labels[i] for i in idx]),
                        strict=True):
            out[i] = c
            used[i] = params
    return out, used
