"""label-topics: detect the language, then label topic/topic_score with that language's classifier
(topics.model=DIR; SPEC §5, Llama-3-SynE §4.1.1).

Writes ``lang`` (kept when present unless ``topics.redetect``; else lid.176), ``topic`` (a label
of that language's taxonomy) and ``topic_score`` (its probability). Records in a language
without a classifier under ``topics.model`` get ``topic: null`` and are counted.
Sibling commands: ``label-topics-annotate`` (LLM zero-shot labels) and ``label-topics-train``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cptkit.core.config import CONF_DIR, JobConfig
from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.core.run import Run, later_key
from cptkit.core.step import MapStep, step
from cptkit.labels.backends.base import CLASSIFIER_JSON
from cptkit.labels.classifiers import load_classifier
from cptkit.labels.topics import Taxonomy, load_taxonomy, taxonomy_path
from cptkit.text.langid import record_languages


@dataclass
class TopicsConfig:
    model: str | None = None  # directory with one classifier per language: <model>/<lang>/
    languages: list[str] = field(default_factory=lambda: ["en", "zh"])
    taxonomy: dict[str, str] = field(default_factory=dict)  # lang -> YAML (default conf/topics/<lang>.yaml)
    lang_field: str = "lang"
    redetect: bool = False  # detect the language even when the record has one
    batch_size: int = 512
    plugins: list[str] = field(default_factory=list)  # backend plugins (package.module:Class) the models may name


@dataclass
class LabelTopicsJob(JobConfig):
    topics: TopicsConfig = field(default_factory=TopicsConfig)


# added after outputs were recorded without it (label-topics, -train, -annotate): left out of the record when []
later_key("topics.plugins", [])


def taxonomies(conf: Any) -> dict[str, Taxonomy]:
    """The taxonomy of each of ``conf.topics.languages``."""
    return {lang: load_taxonomy(taxonomy_path(lang, conf.topics.taxonomy.get(lang), CONF_DIR))
            for lang in conf.topics.languages}


def load_models(conf: Any) -> dict[str, Any]:
    if not conf.topics.model:
        raise CptkitError("label-topics needs topics.model=DIR (train one with cptkit label-topics-train)")
    root = Path(str(conf.topics.model))
    if not root.is_dir():
        raise CptkitError(f"topics.model={root}: no such directory")
    taxes = taxonomies(conf)
    models = {}
    for lang in conf.topics.languages:
        if (root / lang / CLASSIFIER_JSON).exists():
            clf = load_classifier(root / lang, [str(p) for p in conf.topics.plugins])
            unknown = [lab for lab in clf.labels if lab not in taxes[lang].topics]
            if unknown:
                raise CptkitError(f"{root / lang}: class {unknown[0]!r} is not in the {lang} taxonomy")
            models[lang] = clf
    if not models:
        raise CptkitError(f"{root}: holds no classifier for any of {list(conf.topics.languages)} "
                          "(expected <dir>/<lang>/classifier.json)")
    return models


def label_batch(batch: list[Record], models: dict[str, Any], conf: Any, stats: Counter) -> list[Record]:
    lang_field = conf.topics.lang_field
    langs = record_languages(batch, lang_field, bool(conf.topics.redetect))
    for rec, lang in zip(batch, langs, strict=True):
        rec[lang_field] = lang
        rec["topic"], rec["topic_score"] = None, None
    for lang, clf in models.items():
        idx = [i for i, la in enumerate(langs) if la == lang]
        if not idx:
            continue
        probs = clf.predict_proba([batch[i]["text"] for i in idx])
        for i, row in zip(idx, probs, strict=True):
            j = int(row.argmax())
            batch[i]["topic"], batch[i]["topic_score"] = clf.labels[j], round(float(row[j]), 6)
            stats[f"{lang}: {clf.labels[j]}"] += 1
    for lang in langs:
        stats["labelled" if lang in models else "no classifier for language"] += 1
    return batch


class LabelTopics(MapStep):
    """Language, then that language's topic classifier, for every record."""

    stats_key = "topics"

    batch_key = "topics.batch_size"

    def setup(self) -> None:
        self.models = load_models(self.conf)

    def process(self, batch: list[Record], stats: Counter) -> list[Record]:
        return label_batch(batch, self.models, self.conf, stats)

    def reads(self) -> list[Any]:
        taxes = [taxonomy_path(lang, self.conf.topics.taxonomy.get(lang), CONF_DIR) for lang in self.conf.topics.languages]
        return [self.conf.topics.model, *taxes]

    def summary(self, total: Counter) -> dict[str, Any]:
        rows = {"labelled": total.pop("labelled", 0),
                "no classifier for language": total.pop("no classifier for language", 0)}
        return rows | dict(sorted(total.items()))


@step("label-topics", LabelTopicsJob, order=100)
def run(conf: LabelTopicsJob, ctx: Run) -> dict:
    return LabelTopics(conf, ctx).run()


def distribution(extra: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
    """Per language, ``(topic, records)`` from a label-topics manifest's ``extra``, most frequent first."""
    out: dict[str, list[tuple[str, int]]] = {}
    for key, n in extra.items():
        lang, sep, topic = key.partition(": ")
        if sep and isinstance(n, int) and " " not in lang:
            out.setdefault(lang, []).append((topic, n))
    return {lang: sorted(v, key=lambda x: (-x[1], x[0])) for lang, v in sorted(out.items())}


def distribution_text(extra: dict[str, Any], max_share: float = 0.6) -> str:
    """The topic distribution as text, with a warning line for a topic above ``max_share`` of a language."""
    lines = []
    for lang, rows in distribution(extra).items():
        total = sum(n for _, n in rows)
        lines.append(f"{lang}: {total} records")
        for topic, n in rows:
            lines.append(f"  {topic:<40} {n:>7} {n / total:7.1%}")
        if rows and rows[0][1] / total > max_share:
            lines.append(f"  warning: {rows[0][0]!r} holds {rows[0][1] / total:.0%} of {lang} (> {max_share:.0%})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``cptkit label-topics-report DIR``: print the topic distribution of a label-topics output,
    read from its ``_manifest.json``."""
    p = argparse.ArgumentParser(prog="cptkit label-topics-report", description=main.__doc__.splitlines()[0])
    p.add_argument("output", type=Path, help="a label-topics output directory")
    manifest = p.parse_args(argv).output / "_manifest.json"
    if not manifest.is_file():
        raise CptkitError(f"{manifest}: no such file (not a finished label-topics output)")
    print(distribution_text(json.loads(manifest.read_text())["extra"]))
    return 0
