"""synthesize-qa: LLM QA synthesis: scientific [Problem]/[Solution] pairs from seed documents
selected by URL domain per discipline, or synth.mode=code in-context expansion of a problem set
(SPEC §6; Llama-3-SynE §4.2, App. A, D).

* ``synth.mode=scientific``: a seed document belongs to a discipline through its explicit
  ``discipline`` field or its URL's host (longest match in ``synth.domains``); a snippet of it
  fills the [Problem]/[Solution] prompt; outputs are parsed, and rejected (counted per reason)
  when truncated, malformed, or outside the solution length band: the prompt asks for "around
  250–350 words" (§4.2.1), an instruction, so the band is that range widened by
  ``synth.length_tolerance`` (default 0.5: 125–525 words).
  One task per input shard (resumable per shard; completions cached per request).
* ``synth.mode=code``: in-context expansion of a seed problem set (LeetCode in the paper):
  ``synth.code.demos`` random seed problems → a new problem → its solution; one global task.

Each output: ``problem``, ``solution``, ``text`` (problem + blank line + solution: the training
text), ``discipline``, ``seed_id``, ``model``, ``gen`` (generation parameters) and
``meta.generator`` (prompt id, model, temperature, top_p, max_new_tokens, seed). No record kept:
a loud warning with the rejection reasons, or exit 2 below ``synth.min_records``.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
from cptkit.synthetic.qa import (
    count_words,
    discipline_of,
    normalize_space,
    parse_problem,
    parse_problem_solution,
    parse_solution,
    sample_demos,
    snippet,
    trim_to_sentence,
)

if TYPE_CHECKING:
    from cptkit.llm.base import GenParams

def norm_discipline(name: Any) -> str:
    return str(name).strip().lower().replace(" ", "_").replace("-", "_")


@dataclass
class SnippetConfig:
    max_words: int = 400  # snippet budget (whole paragraphs where possible)
    min_words: int = 40  # seed documents shorter than this are skipped (counted: short_seed)
    position: str = "start"  # start | random (a seeded random starting paragraph)
    per_doc: int = 1  # snippets per seed document (position=random draws different ones)


@dataclass
class CodeConfig:
    num_problems: int = 100  # new problems to synthesize
    demos: int = 3  # random seed problems shown per new problem
    problem_field: str = "problem"  # seed field holding the problem (falls back to text)
    discipline: str = "programming"  # {discipline} in the code prompts, and the output's discipline
    min_problem_words: int = 10
    min_solution_words: int = 20
    max_solution_words: int = 0  # 0 = no upper bound


@dataclass
class SynthConfig:
    mode: str = "scientific"  # scientific | code
    disciplines: list[str] = field(default_factory=list)  # restrict to these ([] = all in domains)
    domains: dict[str, list[str]] = field(default_factory=dict)  # discipline -> URL domains
    discipline_field: str = "discipline"  # an explicit field wins over the URL
    samples_per_snippet: int = 1
    max_docs_per_shard: int = 0  # seed documents used per input shard, first in input order (0: all)
    min_problem_words: int = 8
    min_solution_words: int = 250  # the length the prompt asks for ("around 250-350 words", §4.2.1) ...
    max_solution_words: int = 350  # 0 = no upper bound
    length_tolerance: float = 0.5  # ... is an instruction, not a filter: keep [min·(1−t), max·(1+t)]
    trim_truncated: bool = False  # an output cut by max_new_tokens keeps its complete sentences (else: rejected)
    min_records: int = 0  # fail (exit 2) when fewer QA pairs are kept; 0 = only warn when none is
    snippet: SnippetConfig = field(default_factory=SnippetConfig)
    code: CodeConfig = field(default_factory=CodeConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    problem_prompt: PromptConfig = field(default_factory=PromptConfig)
    solution_prompt: PromptConfig = field(default_factory=PromptConfig)

    def __post_init__(self) -> None:
        """The settings of the chosen mode (the other mode's are not used)."""
        check(self.mode in ("scientific", "code"), "mode", self.mode, "expected scientific or code")
        if self.mode == "scientific":
            check_prompt(self.prompt, {"snippet"}, "prompt")
            domains = [norm_discipline(k) for k in self.domains]
            for d in map(norm_discipline, self.disciplines):
                check(d in domains, "disciplines", self.disciplines,
                      f"{d!r} has no domain list in synth.domains (known: {', '.join(domains)})")
            check(self.snippet.position in ("start", "random"), "snippet.position", self.snippet.position,
                  "expected start or random")
            check(self.length_tolerance >= 0, "length_tolerance", self.length_tolerance, "must be >= 0")
        else:
            check_prompt(self.problem_prompt, {"demos"}, "problem_prompt")
            check_prompt(self.solution_prompt, {"problem"}, "solution_prompt")
            check(self.code.num_problems >= 0, "code.num_problems", self.code.num_problems, "must be >= 0")
            check(self.code.demos >= 1, "code.demos", self.code.demos, "must be >= 1")


@dataclass
class SynthesizeQAJob(JobConfig):
    llm: LLMConfig = field(default_factory=LLMConfig)
    synth: SynthConfig = field(default_factory=SynthConfig)




def _stable_int(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def _gen_params(gen: Any, prompt: PromptConfig, llm: LLMConfig) -> GenParams:
    return gen.params(max_new_tokens=max_new_tokens(prompt, llm), temperature=prompt.temperature)


def _gen_record(params: GenParams) -> dict[str, Any]:
    return {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "repetition_penalty": params.repetition_penalty, "seed": params.seed}


def length_band(lo: int, hi: int, tolerance: float) -> tuple[int, int]:
    """Accepted solution words for a prompt asking for ``lo``–``hi`` words: ``[⌊lo·(1−t)⌋, ⌈hi·(1+t)⌉]``
    (``hi`` = 0: no upper bound). Llama-3-SynE §4.2.1 asks for "around 250-350 words"; its own
    App. A example has 357, kept with any tolerance ≥ 0.02."""
    if tolerance < 0:
        raise CptkitError(f"synth.length_tolerance={tolerance}: must be >= 0")
    return math.floor(round(lo * (1 - tolerance), 6)), (math.ceil(round(hi * (1 + tolerance), 6)) if hi else 0)


@step("synthesize-qa", SynthesizeQAJob, order=110)
def run(conf: SynthesizeQAJob, ctx: Run) -> dict[str, Any]:
    sy = conf.synth
    mode = sy.mode
    inputs = ctx.resolve_inputs()
    if mode == "scientific":
        domains = {norm_discipline(k): list(v) for k, v in sy.domains.items()}
        active = [norm_discipline(d) for d in sy.disciplines] or list(domains)
        job_kw: dict[str, Any] = {"inputs": inputs}
    else:
        job_kw = {"inputs": inputs, "tasks": [Task(0, inputs)]}
    with Job(ctx, **job_kw) as job:
        gen = None
        task_stats: dict[str, dict[str, Any]] = {}
        for task in job.pending():
            if gen is None:
                gen = load_generator(conf.llm)
            t0 = time.time()
            before = gen.stats.as_dict()
            with job.writer(task) as w:
                if mode == "scientific":
                    stats = scientific_task(conf, job, task, gen, domains, set(active), w.write)
                else:
                    stats = code_task(conf, job, task, gen, w.write)
            after = gen.stats.as_dict()
            stats["llm"] = {k: after[k] - before[k] for k in after if k != "tokens_per_s"}
            task_stats[task.name] = stats
            job.complete(task, w, seconds=time.time() - t0, **stats)
        if gen is not None:
            gen.close()
        results = job.all_results() if not job.stdout else {k: {"extra": v} for k, v in task_stats.items()}
        total = aggregate([r.get("extra", {}) for r in results.values()])
        if not job.stdout and results and not job.is_finished:
            job.write_json("_synth_stats.json", total)
        rows = summary_rows(total, gen.model_id if gen is not None else None)
        check_kept(total, sy.min_records)
        job.finish(extra=rows)
        return {"output": str(job.out), **total}


def check_kept(total: dict[str, Any], min_records: int) -> None:
    """Warn loudly when no QA pair was kept (with the reasons); fail below ``synth.min_records``."""
    kept = int(total.get("kept", 0))
    why = ", ".join(f"{k} {v}" for k, v in {**total.get("rejected", {}), **total.get("skipped", {})}.items()) or "no prompts"
    if min_records and kept < min_records:
        raise CptkitError(f"synthesize-qa kept {kept} QA pairs, fewer than synth.min_records={min_records} ({why})")
    if not kept:
        log.warning("synthesize-qa kept 0 QA pairs of %d prompts: %s. Loosen synth.length_tolerance / "
                    "synth.min_solution_words, raise llm.max_new_tokens, or use a stronger llm.model; "
                    "set synth.min_records=1 to fail instead", total.get("prompts", 0), why)


def aggregate(extras: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the per-task counters (nested dicts of numbers)."""

    def add(dst: dict[str, Any], src: dict[str, Any]) -> None:
        for k, v in src.items():
            if isinstance(v, dict):
                add(dst.setdefault(k, {}), v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and k != "seconds":
                dst[k] = dst.get(k, 0) + v
            elif k not in dst:
                dst[k] = v

    out: dict[str, Any] = {}
    for e in extras:
        add(out, e)
    llm = out.get("llm", {})
    if llm:
        llm["tokens_per_s"] = round(llm["generated_tokens"] / llm["generation_seconds"], 3) if llm.get("generation_seconds") else 0.0
    out["rejected"] = dict(sorted(out.get("rejected", {}).items()))
    return out


def summary_rows(st: dict[str, Any], model: str | None) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    if model:
        rows["model"] = model
    prompts, kept = st.get("prompts", 0), st.get("kept", 0)
    rows |= {"seed documents used": st.get("seeds_used", 0), "prompts": prompts, "QA pairs kept": kept,
             "acceptance rate": round(kept / prompts, 4) if prompts else 0.0}
    rows |= {f"per discipline: {k}": v for k, v in sorted(st.get("per_discipline", {}).items())}
    rows |= {f"skipped {k}": v for k, v in sorted(st.get("skipped", {}).items())}
    rows |= {f"rejected {k}": v for k, v in st.get("rejected", {}).items()}
    llm = st.get("llm", {})
    if llm:
        rows |= {"llm requests": llm["requests"], "llm cache hits": llm["cache_hits"],
                 "llm prompt tokens": llm["prompt_tokens"], "llm completion tokens": llm["completion_tokens"],
                 "llm generated tokens": llm["generated_tokens"], "llm tokens/s": llm["tokens_per_s"]}
    return rows


def _bump(d: dict[str, int], key: str, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n


def scientific_task(conf: SynthesizeQAJob, job: Job, task: Task, gen: Any, domains: dict[str, list[str]],
                    active: set[str], write: Any) -> dict[str, Any]:
    """Select seed documents of one shard, build prompts, generate, parse and filter."""
    sy, sn = conf.synth, conf.synth.snippet
    skipped: dict[str, int] = {}
    jobs: list[tuple[Record, str, str, int, int]] = []
    field_name = sy.discipline_field
    used: set[str] = set()
    for rec in job.read(task):
        explicit = rec.get(field_name)
        disc = norm_discipline(explicit) if explicit else discipline_of(rec.get("url"), domains)
        if disc is None:
            _bump(skipped, "no_discipline")
            continue
        if disc not in active:
            _bump(skipped, "other_discipline" if disc in domains else "unknown_discipline")
            continue
        if count_words(rec["text"]) < sn.min_words:
            _bump(skipped, "short_seed")
            continue
        if sy.max_docs_per_shard and len(used) >= sy.max_docs_per_shard:
            _bump(skipped, "over_max_docs")
            continue
        used.add(rec["id"])
        for s in range(sn.per_doc):
            rng = random.Random(_stable_int(conf.seed, rec["id"], s)) if sn.position == "random" else None
            snip = snippet(str(rec["text"]), sn.max_words, rng)
            for j in range(sy.samples_per_snippet):
                jobs.append((rec, disc, snip, s, j))
    params = _gen_params(gen, sy.prompt, conf.llm)
    reqs = [render(sy.prompt, discipline=disc.replace("_", " "), snippet=snip) for _, disc, snip, _, _ in jobs]
    outs = gen.generate(reqs, params, seeds=[params.seed * 1_000_003 + j for *_, j in jobs],
                        progress=job.add_bar(f"{task.name}: QA", len(reqs)))
    rejected: dict[str, int] = {}
    per_disc: dict[str, int] = {}
    kept = 0
    lo, hi = length_band(sy.min_solution_words, sy.max_solution_words, sy.length_tolerance)
    for (rec, disc, snip, s, j), c in zip(jobs, outs, strict=True):
        text, finish = untruncate(c.text, c.finish_reason, sy.trim_truncated)
        reason, qa = judge_qa(text, finish, sy.min_problem_words, lo, hi)
        if reason:
            _bump(rejected, reason)
            continue
        problem, solution = qa  # type: ignore[misc]
        write({"id": f"{rec['id']}.qa{s}{j}", "text": f"{problem}\n\n{solution}", "problem": problem,
               "solution": solution, "discipline": disc, "seed_id": rec["id"], "url": rec.get("url"),
               "snippet": snip, "model": gen.model_id, "gen": _gen_record(params) | {"sample": j},
               "source": "synthesize-qa", "meta": {"generator": gen.provenance(sy.prompt.name, params)}})
        kept += 1
        _bump(per_disc, disc)
    return {"seeds_used": len({j[0]["id"] for j in jobs}), "prompts": len(jobs), "kept": kept,
            "per_discipline": per_disc, "skipped": skipped, "rejected": rejected}


def untruncate(text: str, finish_reason: str, trim: bool) -> tuple[str, str]:
    """With ``trim``, an output cut by the token limit becomes its complete sentences (``stop``);
    with none left, or without ``trim``, it stays ``length`` (rejected as truncated)."""
    if finish_reason != "length" or not trim:
        return text, finish_reason
    cut = trim_to_sentence(text)
    return (cut, "stop") if cut else (text, "length")


def judge_qa(text: str, finish_reason: str, min_problem: int, lo: int, hi: int) -> tuple[str | None, tuple[str, str] | None]:
    """Accept or reject one generation: truncated, malformed, short_problem, too_short, too_long."""
    if finish_reason == "length":
        return "truncated", None
    qa = parse_problem_solution(text)
    if qa is None:
        return "malformed", None
    problem, solution = qa
    if count_words(problem) < min_problem:
        return "short_problem", None
    n = count_words(solution)
    if n < lo:
        return "too_short", None
    if hi and n > hi:
        return "too_long", None
    return None, qa


def code_task(conf: SynthesizeQAJob, job: Job, task: Task, gen: Any, write: Any) -> dict[str, Any]:
    """In-context expansion: random demonstrations → new problem → solution."""
    sy, cc = conf.synth, conf.synth.code
    seeds = [(r["id"], normalize_space(str(r.get(cc.problem_field) or r["text"]))) for r in job.read(task)]
    if not seeds:
        raise CptkitError("synth.mode=code: the seed problem set is empty")
    n, k = cc.num_problems, cc.demos
    disc = cc.discipline
    demo_sets = [sample_demos(len(seeds), k, random.Random(_stable_int(conf.seed, "demos", i))) for i in range(n)]
    preqs = [render(sy.problem_prompt, discipline=disc,
                    demos="\n\n".join(f"[Problem {m + 1}]\n{seeds[d][1]}" for m, d in enumerate(ds))) for ds in demo_sets]
    pparams = _gen_params(gen, sy.problem_prompt, conf.llm)
    pouts = gen.generate(preqs, pparams, seeds=[pparams.seed * 1_000_003 + i for i in range(n)],
                         progress=job.add_bar("new problems", n))
    rejected: dict[str, int] = {}
    seen = {p.lower() for _, p in seeds}
    problems: list[tuple[int, str]] = []
    trim = sy.trim_truncated
    for i, c in enumerate(pouts):
        text, finish = untruncate(c.text, c.finish_reason, trim)
        prob = parse_problem(text)
        if finish == "length":
            _bump(rejected, "truncated_problem")
        elif count_words(prob) < cc.min_problem_words:
            _bump(rejected, "malformed_problem")
        elif prob.lower() in seen:
            _bump(rejected, "duplicate_problem")
        else:
            seen.add(prob.lower())
            problems.append((i, prob))
    sparams = _gen_params(gen, sy.solution_prompt, conf.llm)
    clo, chi = cc.min_solution_words, cc.max_solution_words  # hard bounds: the code prompt names no length
    souts = gen.generate([render(sy.solution_prompt, discipline=disc, problem=p) for _, p in problems], sparams,
                         progress=job.add_bar("solutions", len(problems)))
    kept = 0
    for (i, prob), c in zip(problems, souts, strict=True):
        text, finish = untruncate(c.text, c.finish_reason, trim)
        sol = parse_solution(text)
        nw = count_words(sol)
        if finish == "length":
            _bump(rejected, "truncated")
        elif nw < clo:
            _bump(rejected, "too_short")
        elif chi and nw > chi:
            _bump(rejected, "too_long")
        else:
            demo_ids = [seeds[d][0] for d in demo_sets[i]]
            write({"id": f"code-{i:06d}", "text": f"{prob}\n\n{sol}", "problem": prob, "solution": sol,
                   "discipline": disc, "seed_id": demo_ids[0], "demo_ids": demo_ids, "model": gen.model_id,
                   "gen": {"problem": _gen_record(pparams), "solution": _gen_record(sparams)},
                   "source": "synthesize-qa",
                   "meta": {"generator": gen.provenance(sy.solution_prompt.name, sparams),
                            "problem_generator": gen.provenance(sy.problem_prompt.name, pparams)}})
            kept += 1
    return {"seeds_used": len(seeds), "prompts": n, "kept": kept, "per_discipline": {disc: kept},
            "skipped": {}, "rejected": rejected}
