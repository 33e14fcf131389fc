"""demo-corpus: build the real-text demo corpus (English + Chinese Debian docs) as JSONL shards;
packages come from apt-get download into corpus.cache_dir.

One task per source (resumable; a finished source is skipped on rerun). Each package is
fetched with ``apt-get download`` into ``corpus.cache_dir`` and unpacked with ``dpkg -x``;
parsing lives in :mod:`cptkit.demo.corpus`. The manifest names each package's version.

``corpus.sources`` also takes the sources outside the demo corpus (:mod:`cptkit.demo.outside`,
never built by default): ``fortunes-en`` (the B0 re-adaptation text) and ``anarchism`` (held-out
English with ``domain: outside``), e.g. ``cptkit demo-corpus --out b0/ corpus.sources=[fortunes-en]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cptkit.core.config import JobConfig, check
from cptkit.core.job import Job, Task
from cptkit.core.progress import log
from cptkit.core.run import Run
from cptkit.core.step import OUT, QUIET, step
from cptkit.demo.corpus import SOURCES, source_records
from cptkit.demo.outside import OUTSIDE_SOURCES
from cptkit.demo.sources.base import DEFAULT_CACHE, cache_dir, deb_version, extract_deb, fetch_deb

# the demo's sources first, so their task indexes (and shard names) never move
ALL_SOURCES = SOURCES | OUTSIDE_SOURCES


@dataclass
class CorpusConfig:
    sources: list[str] = field(default_factory=lambda: list(SOURCES))  # or outside ones: fortunes-en, anarchism
    limit_per_source: int = 0  # keep the first N records of each source (0: all)
    min_chars: int = 200  # shorter sections/entries are merged into a neighbour
    max_chars: int = 20000  # longer documents are split at paragraph breaks (0: never)
    man_renderer: str = "auto"  # auto | man (man -l + col -bx) | strip (built-in roff stripper)
    cache_dir: str = DEFAULT_CACHE  # where .deb files are kept; $CPTKIT_DEB_CACHE overrides

    def __post_init__(self) -> None:
        check(self.limit_per_source >= 0, "limit_per_source", self.limit_per_source, "must be >= 0 (0: all)")
        for s in self.sources:
            check(s in ALL_SOURCES, "sources", self.sources, f"unknown source {s!r}; known: {', '.join(ALL_SOURCES)}")
        check(len(set(self.sources)) == len(self.sources), "sources", self.sources, "a source is listed twice")


@dataclass
class DemoCorpusJob(JobConfig):
    corpus: CorpusConfig = field(default_factory=CorpusConfig)


def source_tasks(sources: list[str]) -> list[Task]:
    """One task per source, indexed by the source's fixed position (stable shard names); ``sources``
    are known and distinct (:class:`CorpusConfig` checks them)."""
    order = list(ALL_SOURCES)
    return [Task(order.index(s), [], name=f"{order.index(s):05d}") for s in sorted(sources, key=order.index)]


@step("demo-corpus", DemoCorpusJob, options=(OUT, QUIET), order=10)
def run(conf: DemoCorpusJob, ctx: Run) -> dict:
    """Write each configured source's records into ``part-TTTTT-KKKK.jsonl.gz`` shards."""
    c = conf.corpus
    limit = c.limit_per_source
    names = list(ALL_SOURCES)
    tasks = source_tasks(c.sources)
    cache = cache_dir(c.cache_dir)
    with Job(ctx, needs_inputs=False, tasks=tasks) as job:
        for task in job.pending():
            name = names[task.index]
            t0 = time.time()
            package = ALL_SOURCES[name].package
            deb = fetch_deb(package, cache)
            root = extract_deb(deb, cache)
            advance = job.add_bar(name, limit or None)
            chars = 0
            with job.writer(task) as w:
                for k, rec in enumerate(source_records(name, root, min_chars=c.min_chars, max_chars=c.max_chars,
                                                       man_renderer=c.man_renderer, sources=ALL_SOURCES)):
                    if limit and k >= limit:
                        break
                    w.write(rec)
                    chars += len(rec["text"])
                    advance(1)
            log.info("%s: %d records, %d chars in %.1fs", name, w.records, chars, time.time() - t0)
            job.complete(task, w, source=name, package=f"{package} {deb_version(deb)}", chars=chars,
                         seconds=round(time.time() - t0, 3))
        done = job.all_results()
        extra: dict = {}
        for task in tasks:
            r = done.get(task.name) or {}
            extra[f"docs {names[task.index]}"] = r.get("records_out", 0)
            extra[f"package {names[task.index]}"] = (r.get("extra") or {}).get("package", "")
        extra["chars"] = sum(int((r.get("extra") or {}).get("chars", 0)) for r in done.values())
        return job.finish(extra=extra)
