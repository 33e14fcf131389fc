"""build-mix: tokenize, order and pack curated shards into a mixed training stream by domain
and stage (SPEC §8). Recipes: mix=demo|demo_cpt|synE_stage1|synE_stage2|upsample_tail.

Domains are filters on record fields (dolma-mixer style); each stage of the token budget has a
target proportion per domain (by tokens). Documents are tokenized once (a fast tokenizer, batch
encoding runs on all cores), ordered per domain (seeded shuffle, or a PPL curriculum), and
concatenated with EOS after every document into one token file per domain
(``tokens/dNNN.bin``, uint16 when the vocabulary fits, else uint32, with document offsets in
``tokens/dNNN.docs.npy``). Packing cuts each domain's tokens into fixed-length sequences; the
plan ``plan.npy`` lists (domain, sequence) for the whole budget, stage by stage. Because the
domains stay separate, ``train`` can follow the plan or draw domains with its own weights.

Replay: ``mix.replay.share`` of every stage from ``mix.replay.source``: ``pool`` (the inputs'
``mix.replay.domains``), ``self`` (the base's own samples from BOS, cached; ``mix.replay.self.*``) or a
path of records, the last two as the domain ``replay`` (docs/forgetting.md).

Outputs (all under ``--out``): ``_stream.json`` (what train reads), ``tokens/``, ``plan.npy``,
``_eval.jsonl.gz`` (held-out documents per domain, field ``domain``), ``_manifest.json``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptkit.core.config import JobConfig
from cptkit.core.errors import CptkitError
from cptkit.core.job import Hooks, Job, Task, TaskResult
from cptkit.core.run import Run
from cptkit.core.shards import InputFile, iter_records
from cptkit.core.step import step
from cptkit.mixtures.recipe import MixConfig, Router, stage_fractions
from cptkit.mixtures.stream import (
    EVAL,
    REPLAY,
    STREAM,
    DomainFiles,
    MixSettings,
    RouteStats,
    eval_bytes,
    npy_bytes,
    plan_stream,
    route_and_tokenize,
    stream_info,
    token_dtype,
    write_domains,
)
from cptkit.text.rust_tokenizer import RustTokenizer, load_rust_tokenizer


@dataclass
class BuildMixOptions:
    # documents per tokenizer batch (and at most BATCH_CHARS characters); fewer, larger calls to the Rust encoder
    batch_docs: int = 1024
    dtype: str = "auto"  # auto | uint16 | uint32


@dataclass
class BuildMixJob(JobConfig):
    tokenizer: str | None = None  # tokenizer spec: HF directory, .gguf file or smollm2
    trust_remote_code: bool = False  # let the tokenizer / mix.curriculum.model folders run their own code (auto_map)
    mix: MixConfig = field(default_factory=MixConfig)
    build_mix: BuildMixOptions = field(default_factory=BuildMixOptions)


def _load_tokenizer(spec: str | None, trust_remote_code: bool = False):
    if not spec:
        raise CptkitError("build-mix needs a tokenizer: pass tokenizer=PATH (an HF directory, .gguf or smollm2)")
    rust = load_rust_tokenizer(spec)  # a generic tokenizer.json folder: the same ids, ~4 s less start-up
    if rust is not None:
        return rust
    from cptkit.models.lm import load_tokenizer  # deferred: torch

    tok = load_tokenizer(spec, trust_remote_code)
    if not getattr(tok, "is_fast", False):
        raise CptkitError(f"tokenizer {spec}: build-mix needs a fast (Rust) tokenizer")
    if tok.eos_token_id is None:
        raise CptkitError(f"tokenizer {spec}: has no EOS token to separate documents")
    return tok


# --- the step: settings, route + tokenize, write domains, plan, write the stream ------------
def mix_settings(conf: BuildMixJob) -> MixSettings:
    """Check the recipe's stages and domain names (its settings are checked by the schema's
    ``__post_init__``): one-line errors for anything inconsistent, before any work."""
    mix = conf.mix
    stages = mix.stages  # plain dicts (list[Any] of the typed config)
    if not stages:
        raise CptkitError("mix.stages is empty: give at least one stage with weights")
    fractions = stage_fractions(stages)
    if any(f == 0 for f in fractions):  # a stage of no tokens is left out (tail_fraction=0: no tail)
        stages = [st for st, f in zip(stages, fractions, strict=True) if f > 0]
        fractions = [f for f in fractions if f > 0]
    router = Router(mix.domains)  # plain dicts: a record is routed without OmegaConf lookups
    names = [s["name"] for s in router.specs]
    for name in mix.curriculum.domains + ([mix.fill] if mix.fill else []) + mix.replay.domains:
        if name not in names and "/" not in name:
            raise CptkitError(f"mix: unknown domain {name!r}; defined: {', '.join(names)}")
    source = mix.replay.source
    if source != "pool" and REPLAY in names:
        raise CptkitError(f"mix.replay.source={source}: replays as the domain {REPLAY!r}, which mix.domains "
                          "already defines; rename that domain")
    pool = source == "pool"
    return MixSettings(mix=mix, seed=conf.seed, seq_len=mix.seq_len, budget=int(mix.budget_tokens), stages=stages,
                       fractions=fractions, cur=mix.curriculum, router=router,
                       replay_names=mix.replay.domains if pool else [REPLAY], replay_share=mix.replay.share,
                       unique=mix.unique_ids, eval_k=mix.eval_docs, batch_docs=conf.build_mix.batch_docs,
                       replay_source=source, replay_drop=[] if pool else list(mix.replay.domains))


def vocab_of(tok: Any) -> dict[str, int]:
    """A tokenizer's token → id table (a transformers tokenizer or a :class:`RustTokenizer`)."""
    return tok.backend.get_vocab(with_added_tokens=True) if isinstance(tok, RustTokenizer) else tok.get_vocab()


def replay_inputs(conf: BuildMixJob, ctx: Run, tok: Any) -> tuple[list[InputFile], str | None]:
    """The record files of ``mix.replay.source`` (none for ``pool``; ``self``: the cached samples of
    the base, generated on first use, refused unless the base's tokenizer is ``tok``: the samples are
    packed as the ids the base drew) and the path that keys the output (the base for ``self``)."""
    rp = conf.mix.replay
    if rp.source == "pool":
        return [], None
    if rp.source == "self":
        from cptkit.models.lm import check_model, load_tokenizer, spec_file  # deferred: torch
        from cptkit.models.self_samples import cached_samples  # deferred: torch

        sc = rp.self
        check_model(sc.model, conf.trust_remote_code)
        if vocab_of(load_tokenizer(str(sc.model), conf.trust_remote_code)) != vocab_of(tok):
            raise CptkitError(f"mix.replay.self.model={sc.model}: its tokenizer is not tokenizer={conf.tokenizer} "
                              "(self samples are packed as the ids the base drew); build the stream with the base's "
                              "tokenizer")
        path = cached_samples(str(sc.model), sc.docs, sc.max_tokens, sc.seed, sc.topk, sc.temperature,
                              conf.trust_remote_code)
        return ctx.resolve_inputs([str(path)]), spec_file(sc.model)
    if not Path(rp.source).exists():
        raise CptkitError(f"mix.replay.source={rp.source}: no such file or folder (use pool, self or a path of records)")
    return ctx.resolve_inputs([rp.source]), rp.source


@step("build-mix", BuildMixJob, order=130)
def run(conf: BuildMixJob, ctx: Run) -> dict:
    s = mix_settings(conf)
    specs_in = conf.io.inputs or s.mix.sources
    if not specs_in:
        raise CptkitError("build-mix: no input: pass --in PATH or list mix.sources in the recipe")
    inputs = ctx.resolve_inputs(specs_in)
    tok = _load_tokenizer(conf.tokenizer, conf.trust_remote_code)
    dtype = token_dtype(conf.build_mix.dtype, len(tok))
    replay_in, replay_read = replay_inputs(conf, ctx, tok)
    scorer = None
    if s.order in ("low_to_high", "high_to_low"):
        # checked here, not in CurriculumConfig: a recipe's model is often ${tokenizer}, so a missing
        # tokenizer is reported first (above) as what to pass
        if not s.cur.model:
            raise CptkitError(f"mix.curriculum.order={s.order} needs mix.curriculum.model (the PPL scoring model)")
        from cptkit.models.lm import load_causal_lm, load_tokenizer  # deferred: torch

        trust = conf.trust_remote_code
        scorer = (load_causal_lm(s.cur.model, trust_remote_code=trust), load_tokenizer(s.cur.model, trust))
    if isinstance(tok, RustTokenizer) and not s.cur.model:  # a folder is its own path: torch stays unimported
        reads = [conf.tokenizer, None, replay_read]
    else:
        from cptkit.models.lm import spec_file  # deferred: torch

        reads = [spec_file(conf.tokenizer), spec_file(s.cur.model), replay_read]
    task = Task(0, inputs, name="mix")
    if s.unique:
        # mix.unique_ids: a repeated id is expected (a retrieved page and its corpus copy) and the
        # mix keeps the first one, so the reader's duplicate-id check would refuse the very case.
        ctx = ctx.recording("io.unique_ids", False)
    streamed: dict[str, Any] = {}  # the stream's manifest entry, once written (Hooks.manifest_extra)
    hooks = Hooks(manifest_extra=lambda: {"stream": streamed} if streamed else {})
    with Job(ctx, tasks=[task], needs_inputs=False, hooks=hooks, reads=reads) as job:
        if not job.pending():
            return job.finish()
        t0 = time.time()
        tmp_dir, tok_dir = job.state_path("tmp"), job.file("tokens")
        for d in (tmp_dir, tok_dir):
            d.mkdir(parents=True, exist_ok=True)
        files = DomainFiles(s, tmp_dir, tok, dtype, scorer)
        replayed = iter_records(replay_in, skip_bad=ctx.io.skip_bad_lines, **ctx.io.limits())
        read = route_and_tokenize(job.read(task), s, files, replayed)
        read_s = time.time() - t0
        stream_domains = write_domains(files, s, tok_dir)
        plan = plan_stream(stream_domains, files.leaves, s)
        job.write_bytes("plan.npy", npy_bytes(plan.rows))
        job.write_bytes(EVAL, eval_bytes(stream_domains, files.leaves))
        stream = stream_info(s, conf.tokenizer, tok, dtype, stream_domains, plan, read)
        job.write_json(STREAM, stream)
        tmp_dir.rmdir()
        topk_files = [sd["topk"][k] for sd in stream_domains if "topk" in sd for k in ("ids", "logprobs")]
        wrote = TaskResult(records_out=sum(sd["docs"] for sd in stream_domains),
                           files=[sd["file"] for sd in stream_domains] + topk_files + ["plan.npy", STREAM, EVAL])
        job.complete(task, result=wrote, seconds=time.time() - t0)
        streamed.update({k: v for k, v in stream.items() if k != "domains"} | {"domains": stream_domains})
        result = job.finish(extra=summary(stream, read, files.tokenize_s, read_s))
        return result | {"stream": stream}


def summary(stream: dict, read: RouteStats, tokenize_s: float, read_s: float) -> dict[str, Any]:
    """The summary-table and manifest rows of a build-mix run."""
    domains = stream["domains"]
    tokens_total = sum(sd["tokens"] for sd in domains)
    extra: dict[str, Any] = {
        "domains": len(domains), "unmatched records": read.unmatched,
        **({"repeated ids skipped": read.repeated} if "repeated_ids_skipped" in stream else {}),
        **({"replay tokens": stream["replay"]["tokens"],
            "replay share": round(stream["replay"]["realised_share"], 4)} if "replay" in stream else {}),
        "tokens tokenized": tokens_total, "tokens in stream": stream["total_sequences"] * stream["seq_len"],
        "tokenize tokens/s": tokens_total / tokenize_s if tokenize_s else 0.0,
        "read+tokenize s": read_s,
    }
    for sd in domains:
        extra[f"epochs {sd['name']}"] = sd["epochs"]
    for st in stream["stages"]:
        extra[f"stage {st['name']} tokens"] = (st["end"] - st["start"]) * stream["seq_len"]
    return extra
