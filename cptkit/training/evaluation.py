"""Held-out evaluation during training: a dynamic mixture's eval-and-update points, the
``train.eval_every`` points of the forgetting curves (per-domain losses and few-shot tasks, before
step 1 and after the last: :func:`evaluate_point`; each lands in ``metrics.jsonl`` as ``eval_loss``,
nats per token, and ``eval_tasks``, ``acc_norm`` / ``exact_match`` in [0, 1], with ``eval_tokens``,
the training tokens seen when it was measured), and the Velocitune proxy's checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cptkit.core.cache import entry
from cptkit.core.config import CONF_DIR
from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import cache_path, content_hash
from cptkit.core.progress import log
from cptkit.core.shards import atomic_write_bytes, iter_records, resolve_inputs
from cptkit.eval import runner, task_data, tasks
from cptkit.mixtures.controller import domain_eval
from cptkit.models.lm import spec_file
from cptkit.models.scoring import group_losses
from cptkit.training.state import RunSpec


def init_eval_key(spec: RunSpec, records: list[dict]) -> str | None:
    """What the untrained model's held-out losses depend on, hashed: the model file, the tokenizer,
    the held-out records, the loss settings, and the arithmetic (dtype, device, threads, library
    versions). None (no reuse) for a seeded tiny model, a run on several processes, or
    ``CPTKIT_INIT_EVAL_CACHE=0``."""
    import torch
    import transformers

    conf = spec.conf
    if conf.model.name != "hf" or spec.world != 1 or os.environ.get("CPTKIT_INIT_EVAL_CACHE", "1") == "0":
        return None
    model, tok = (content_hash(spec_file(p)) for p in (conf.model.path, conf.tokenizer or spec.stream.tokenizer_spec()))
    if model is None or tok is None:  # a hub id, not a file: nothing to key on
        return None
    key = {"model": model, "tokenizer": tok, "attn": conf.model.attn_implementation,
           "records": hashlib.sha256(json.dumps(records, sort_keys=True, ensure_ascii=False).encode()).hexdigest(),
           "seq_len": spec.seq_len, "max_tokens": int(spec.tcfg.eval_max_tokens), "precision": spec.tcfg.precision,
           "kernels": spec.tcfg.kernels, "cuda": torch.cuda.is_available(),  # another device, other arithmetic
           "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def load_eval_tasks(names: list[str], task_dir: str | None = None, data_dir: str = "~/.cache/cptkit/eval") -> list:
    """The ``cptkit evaluate`` task definitions named in ``train.eval_tasks`` (data loaded now: fails fast)."""
    d = task_dir or str(Path(CONF_DIR) / "eval" / "tasks")
    out = []
    for n in names:
        t = tasks.load_task(str(n), d, os.path.expanduser(data_dir))
        task_data.load_docs(t, t.spec["test_split"])
        out.append(t)
    return out


def evaluate_point(model, tokenizer, records: list[dict], tcfg: Any, seq_len: int, tasks: list,
                   cache: Any = None) -> dict[str, Any]:
    """``{"eval_loss": {domain: loss}, "eval_tasks": {task: score}}`` of the model now (eval mode, no grad;
    ``cache``: an :class:`~cptkit.training.evaluation.InitEvalCache`, for the untrained model only)."""
    was_training = model.training
    model.eval()
    try:
        def compute() -> dict[str, dict[str, float]]:
            return group_losses(model, tokenizer, records, group_by="domain",
                                max_docs_per_group=int(tcfg.eval_docs) or None,  # 0: all, as domain_eval
                                max_length=seq_len, max_tokens=int(tcfg.eval_max_tokens))

        res = cache.group_losses(compute, int(tcfg.eval_docs) or None) if cache is not None else compute()
        out: dict[str, Any] = {"eval_loss": {d: float(v["loss"]) for d, v in res.items()}}
        if tasks:
            scores = {}
            for t in tasks:
                m, _ = runner.run_task(model, tokenizer, t, num_fewshot=tcfg.eval_tasks_shots,
                                  limit=int(tcfg.eval_tasks_limit) or None, max_length=seq_len)
                scores[t.name] = float(headline_score(m))
            out["eval_tasks"] = scores
    finally:
        model.train(was_training)
    return out


def headline_score(metrics: dict[str, Any]) -> float:
    """A task's headline score: acc_norm (multiple choice) or exact_match (generative)."""
    for k in ("acc_norm", "exact_match", "acc"):
        if k in metrics:
            return float(metrics[k])
    raise CptkitError(f"task metrics without acc_norm/exact_match: {sorted(metrics)}")


def extra_records(paths: list[str], taken: set[str]) -> list[dict]:
    """``train.eval_extra``'s records (files or cptkit output directories of JSONL), each with a ``text``
    and a ``domain`` that is not one of the stream's (a probe scored as "domain" would mix two groups)."""
    out: list[dict] = []
    for p in paths:
        for rec in iter_records(resolve_inputs([str(p)])):
            dom, text = rec.get("domain"), rec.get("text")
            where = f"{p}: record {rec.get('id', '?')!r}"
            if not isinstance(text, str) or not isinstance(dom, str) or not dom:
                raise CptkitError(f"train.eval_extra {where}: needs a string 'text' and a non-empty 'domain'")
            if dom in taken:
                raise CptkitError(f"train.eval_extra {where}: domain {dom!r} is one of the stream's; "
                                  "give the extra documents a domain of their own")
            out.append({"id": rec.get("id"), "text": text, "domain": dom})
    return out


class InitEvalCache:
    """The untrained model's per-domain held-out losses, computed once for every run that starts from
    the same model on the same held-out records (the arms of an experiment, a sweep): at step 0 each
    arm would compute the same numbers again. ``$CPTKIT_CACHE/init_eval/<key>-<docs>.json``."""

    def __init__(self, key: str | None):
        self.dir = cache_path().parent / "init_eval" if key else None
        self.key = key

    def group_losses(self, compute: Any, max_docs: int | None) -> dict[str, dict[str, float]]:
        """``compute()`` (:func:`cptkit.models.scoring.group_losses` of the untrained model on
        ``max_docs`` per domain), or its saved result."""
        if self.dir is None:
            return compute()
        f = entry("init_eval", f"{self.key}-{max_docs or 0}.json")  # a link planted there is refused
        try:
            res = json.loads(f.read_text())
            log.info("held-out losses of the untrained model: reused %s", f)
            return res
        except (OSError, ValueError):
            pass
        res = compute()
        try:
            atomic_write_bytes(f, json.dumps(res).encode())  # NaN kept: a one-document SE; Python reads it back
        except OSError as e:
            log.warning("cannot save the untrained model's held-out losses to %s (%s)", self.dir, e)
        return res


class EvalPoints:
    """The eval documents and tasks of a run, shared by the callbacks that evaluate: the mixture's
    updates, the ``train.eval_every`` points and the Velocitune proxy's checkpoints."""

    def __init__(self, spec: RunSpec, controller: Any):
        tcfg, stream = spec.tcfg, spec.stream
        self.tcfg, self.seq_len = tcfg, spec.seq_len
        self.records = stream.eval_records()
        self.tasks = load_eval_tasks(tcfg.eval_tasks) if tcfg.eval_every and tcfg.eval_tasks else []
        self.init_cache = InitEvalCache(init_eval_key(spec, self.records) if self.records else None)
        # the eval points also score train.eval_extra (a probe, outside text); the mixture and the proxy never do
        extra = extra_records(tcfg.eval_extra, set(stream.domains))
        self.point_records = self.records + extra
        self.point_cache = InitEvalCache(init_eval_key(spec, self.point_records)) if extra else self.init_cache
        if controller.dynamic or spec.proxy or tcfg.eval_every > 0:
            have = {r["domain"] for r in self.records}
            missing = [d for d in stream.domains if d not in have]
            if missing:
                raise CptkitError(f"{stream.path}: no held-out eval documents for domain {missing[0]!r} "
                                  "(rebuild the stream with mix.eval_docs > 0)")

    def losses(self, model: Any, tokenizer: Any, docs: int | None,
               initial: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """Per-domain held-out loss and its standard error over documents (``initial``: of the
        untrained model, reused from :class:`InitEvalCache`)."""
        cache = self.init_cache if initial else None
        return domain_eval(model, tokenizer, self.records, docs, self.tcfg.eval_max_tokens, self.seq_len, cache=cache)

    def point(self, model: Any, tokenizer: Any, initial: bool = False) -> dict[str, Any]:
        """An ``eval_every`` point: per-domain losses and the few-shot tasks."""
        return evaluate_point(model, tokenizer, self.point_records, self.tcfg, self.seq_len, self.tasks,
                              cache=self.point_cache if initial else None)
