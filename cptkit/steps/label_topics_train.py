"""label-topics-train: train one topic classifier per language from labelled records; prints
held-out accuracy, macro-F1 and the confusion table (SPEC §5).

Input: records with ``topic`` (a label of the language's taxonomy, e.g. from
``label-topics-annotate``) and ``lang`` (detected when missing). Output: ``<out>/<lang>/`` per
language with at least two topics, each a classifier directory (fastText by default,
``train.backend=minilm`` for the BERT option, ``train.backend=embed`` for frozen MiniLM
embeddings under a logistic-regression head, ``train.backend=ensemble`` for their average) with held-out accuracy, macro-F1 and the
confusion table (printed, in ``classifier.json`` and in the manifest).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cptkit.core.config import JobConfig
from cptkit.core.errors import CptkitError
from cptkit.core.job import Job, Task
from cptkit.core.progress import log
from cptkit.core.run import Run
from cptkit.core.step import step
from cptkit.labels.classifiers import save_classifier, train_classifier
from cptkit.labels.config import TrainParams
from cptkit.labels.report import check_quality, params_of, report, tuning_rows
from cptkit.steps.label_topics import TopicsConfig, taxonomies
from cptkit.text.langid import record_languages


@dataclass
class TopicTrainParams(TrainParams):
    label_field: str = "topic"


@dataclass
class LabelTopicsTrainJob(JobConfig):
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    train: TopicTrainParams = field(default_factory=TopicTrainParams)


MIN_EXAMPLES = 10  # fewer labelled records in a language: no classifier for it (too few to split)

@step("label-topics-train", LabelTopicsTrainJob, order=90)
def run(conf: LabelTopicsTrainJob, ctx: Run) -> dict:
    taxes = taxonomies(conf)
    label_field = conf.train.label_field
    inputs = ctx.resolve_inputs()
    with Job(ctx, inputs=inputs, tasks=[Task(0, inputs)]) as job:
        extra: dict = {}
        for task in job.pending():
            t0 = time.time()
            recs = []
            for rec in job.read(task):
                topic = rec.get(label_field)
                if not isinstance(topic, str):
                    raise CptkitError(f"record {rec['id']!r}: no string field {label_field!r} (label it first)")
                recs.append(rec)
            langs = record_languages(recs, conf.topics.lang_field, conf.topics.redetect)
            all_metrics = {}
            trained: list = []
            for lang in conf.topics.languages:
                sel = [r for r, la in zip(recs, langs, strict=True) if la == lang]
                for r in sel:
                    if r[label_field] not in taxes[lang].topics:
                        raise CptkitError(f"record {r['id']!r}: topic {r[label_field]!r} is not in the {lang} taxonomy")
                if len({r[label_field] for r in sel}) < 2 or len(sel) < MIN_EXAMPLES:
                    log.warning("%s: %d labelled records in %d topics (need %d+ in 2+); no classifier trained",
                                lang, len(sel), len({r[label_field] for r in sel}), MIN_EXAMPLES)
                    continue
                params: TrainParams = params_of(conf.train)
                res = train_classifier([r["id"] for r in sel], [r["text"] for r in sel],
                                       [r[label_field] for r in sel], params, conf.seed)
                check_quality(res.metrics, lang, params.min_f1)
                trained.append((lang, res, params))
                all_metrics[lang] = res.metrics
                extra[f"{lang} examples"] = len(sel)
                extra |= report(res.metrics, lang, conf.quiet) | tuning_rows(res.classifier, lang)
            if not all_metrics:
                raise CptkitError(f"no language in {conf.topics.languages} has labelled records in 2+ topics")
            for lang, res, params in trained:  # written once every language passed train.min_f1
                save_classifier(res, job.file(lang), params, conf.seed,
                                extra={"language": lang, "taxonomy": taxes[lang].topics})
            job.complete(task, None, seconds=time.time() - t0, metrics=all_metrics)
        return job.finish(extra=extra)
