"""Held-out evaluation during training: a dynamic mixture's eval-and-update points, the
``train.eval_every`` points (per-domain losses and few-shot tasks, before step 1 and after the
last), and the Velocitune proxy's checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.training.state import RunSpec, TrainState


def init_eval_key(spec: RunSpec, records: list[dict]) -> str | None:
    """What the untrained model's held-out losses depend on, hashed: the model file, the tokenizer,
    the held-out records, the loss settings, and the arithmetic (dtype, device, threads, library
    versions). None (no reuse) for a seeded tiny model, a run on several processes, or
    ``CPTKIT_INIT_EVAL_CACHE=0``."""
    import torch
    import transformers

    from cptkit.core.fingerprint import content_hash
    from cptkit.models.lm import spec_file

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


class InitEvalCache:
    """The untrained model's per-domain held-out losses, computed once for every run that starts from
    the same model on the same held-out records (the arms of an experiment, a sweep): at step 0 each
    arm would compute the same numbers again. ``$CPTKIT_CACHE/init_eval/<key>-<docs>.json``."""

    def __init__(self, key: str | None):
        from cptkit.core.fingerprint import cache_path

        self.dir = cache_path().parent / "init_eval" if key else None
        self.key = key

    def group_losses(self, compute: Any, max_docs: int | None) -> dict[str, dict[str, float]]:
        """``compute()`` (:func:`cptkit.models.scoring.group_losses` of the untrained model on
        ``max_docs`` per domain), or its saved result."""
        from cptkit.core.shards import atomic_write_bytes

        if self.dir is None:
            return compute()
        f = self.dir / f"{self.key}-{max_docs or 0}.json"
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
    """The eval documents and tasks of a run and when to use them (``mix_s``: time spent on the mixture)."""

    def __init__(self, spec: RunSpec, controller: Any):
        from cptkit.training.metrics import load_eval_tasks

        tcfg, stream = spec.tcfg, spec.stream
        self.tcfg, self.seq_len = tcfg, spec.seq_len
        self.records = stream.eval_records()
        self.tasks = load_eval_tasks(tcfg.eval_tasks) if tcfg.eval_every and tcfg.eval_tasks else []
        self.mix_s = 0.0
        self.init_cache = InitEvalCache(init_eval_key(spec, self.records) if self.records else None)
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
        from cptkit.mixtures.controller import domain_eval

        cache = self.init_cache if initial else None
        return domain_eval(model, tokenizer, self.records, docs, self.tcfg.eval_max_tokens, self.seq_len, cache=cache)

    def point(self, model: Any, tokenizer: Any, initial: bool = False) -> dict[str, Any]:
        """An ``eval_every`` point: per-domain losses and the few-shot tasks."""
        from cptkit.training.metrics import evaluate_point

        return evaluate_point(model, tokenizer, self.records, self.tcfg, self.seq_len, self.tasks,
                              cache=self.init_cache if initial else None)

    def before_step(self, model: Any, tokenizer: Any, controller: Any, state: TrainState,
                    on_update: Any) -> dict[str, Any]:
        """The eval of this step, if any: the controller's update (``on_update(info)``) or an
        ``eval_every`` point. Returns what the step's metrics line records of it."""
        tcfg = self.tcfg
        if controller.dynamic and controller.wants_eval(state.step, state.tokens):
            te = time.time()
            losses, ses = self.losses(model, tokenizer, controller.eval_docs(state.step, tcfg.eval_docs),
                                      initial=state.step == 0)
            info = {"eval_loss": losses, "eval_loss_se": ses, "eval_tokens": state.tokens,
                    **controller.update(state.step, state.tokens, losses)}
            on_update(info)
            self.mix_s += time.time() - te
            return info
        if tcfg.eval_every and state.step % tcfg.eval_every == 0:
            return {**self.point(model, tokenizer, initial=state.step == 0), "eval_tokens": state.tokens}
        return {}

    def proxy_checkpoint(self, model: Any, tokenizer: Any, proxy_run: Any, state: TrainState) -> bool:
        """A Velocitune proxy checkpoint after this step, if due; True once its targets settled."""
        if proxy_run is None or not proxy_run.is_checkpoint(state.step):
            return False
        losses, _ = self.losses(model, tokenizer, proxy_run.eval_docs)
        state.proxy_log.append((float(state.tokens), losses))
        return bool(proxy_run.add(state.tokens, losses))
