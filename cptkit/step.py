"""The shape of a record-mapping step: declare the batch work, the framework runs the rest.

Most steps map records to records (score, label, corrupt, filter). Such a step is one subclass of
:class:`MapStep`::

    class ScoreQuality(MapStep):
        name = "score-quality"
        stats_key = "dropped"

        batch_key = "batch_size"      # where the batch size is in the typed config

        def setup(self):                  # self.conf: the typed ScoreQualityJob
            self.scorers = [...]          # load models once, fail early on bad settings

        def process(self, batch, stats):  # a list of records -> the records to write
            ...
            stats["dropped (quality < 0.5)"] += 1
            return kept

        def summary(self, total):         # merged stats of every task -> summary/manifest rows
            return dict(total)

:meth:`MapStep.run` owns everything else, the same for every step: the tasks of this process's
slice and their resume markers (:class:`cptkit.job.Job`), batching, per-task stats and timing
stored in each task's marker, their merge across tasks, earlier runs and other processes (like
datatrove's ``Stats``), the summary table and the manifest.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from cptkit.job import Job
from cptkit.records import Record

Stats = Counter  # str -> int counters of one task; merged by addition


def map_batches(records: Iterable[Record], batch_size: int,
                fn: Callable[[list[Record], Stats], Iterable[Record]], stats: Stats) -> Iterator[Record]:
    """Apply ``fn`` to consecutive batches of ``batch_size`` records (the last may be shorter)."""
    batch: list[Record] = []
    for rec in records:
        batch.append(rec)
        if len(batch) >= batch_size:
            yield from fn(batch, stats)
            batch = []
    if batch:
        yield from fn(batch, stats)


class MapStep(ABC):
    """A step that maps batches of records to records; subclasses implement :meth:`process`."""

    name: ClassVar[str]
    stats_key: ClassVar[str] = "stats"  # key of the task stats in each completion marker
    batch_key: ClassVar[str] = "batch_size"  # dotted path of the batch size in the typed config

    def __init__(self, cfg: DictConfig, batch_size: int | None = None) -> None:
        self.cfg = cfg  # what Job reads (io, shard, hashing of the run)
        self.conf: Any = OmegaConf.to_object(cfg)  # the step's typed config dataclass, validated once
        self.batch_size = int(batch_size or functools.reduce(getattr, self.batch_key.split("."), self.conf))
        self.setup()

    def setup(self) -> None:
        """Load models and check settings once, before any task runs (``self.conf`` is set)."""
        return None

    @abstractmethod
    def process(self, batch: list[Record], stats: Stats) -> Iterable[Record]:
        """The records to write for ``batch`` (changed in place or new), counting into ``stats``."""

    def summary(self, total: Stats) -> dict[str, Any]:
        """Summary-table and manifest rows from the stats of every finished task."""
        return dict(sorted(total.items()))

    def run(self) -> dict[str, Any]:
        """Run every pending task of this process's slice; finish the output when all are done."""
        with Job(self.cfg) as job:
            total = job.run_map(lambda recs, stats: map_batches(recs, self.batch_size, self.process, stats),
                                self.stats_key)
            return job.finish(extra=self.summary(total))
