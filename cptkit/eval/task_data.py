"""The documents of a task's split: local files in the dataset's own format (:mod:`cptkit.eval.formats`),
else the Hugging Face hub when it is reachable; missing data is one line saying what to download."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from urllib.parse import urlsplit

from cptkit.core.errors import CptkitError
from cptkit.core.net import reachable
from cptkit.eval import formats as F
from cptkit.eval.build_tasks import build
from cptkit.eval.tasks import EvalTask


def hf_offline() -> bool:
    """True when the Hugging Face hub must not be contacted (``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``)."""
    return any(os.environ.get(k, "").lower() in ("1", "true", "yes", "on") for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub's host (``HF_ENDPOINT``, default huggingface.co) accepts a connection.

    Checked once per process, so an offline machine gets its one-line "no data" error at once
    instead of after ``datasets``' retries (~25 s per task, logged)."""
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return reachable(url.hostname or "huggingface.co", url.port or 443, timeout)


def _data_format(task: EvalTask, split: str, p: Path) -> str:
    fmt = task.spec.get("data_format")
    if isinstance(fmt, dict):
        fmt = fmt.get(split)
    if fmt:
        return str(fmt)
    name = p.name.removesuffix(".gz")
    if name.endswith(".jsonl"):
        return "jsonl"
    return name.rsplit(".", 1)[-1] if "." in name else "dir"


def _missing(task: EvalTask, split: str, p: Path | None, why: str) -> CptkitError:
    how = str(task.spec.get("download") or "").replace("{data_dir}", str(task.data_dir)).strip()
    hub = task.spec.get("hub")
    online = f"; online, unset HF_HUB_OFFLINE to read the hub dataset {hub['path']}" if hub and hf_offline() else ""
    return F.MissingData(f"eval task {task.name}: no data for split {split!r} ({why}). "
                         f"{how or f'put the files at {p}'}{online}")


def _from_hub(task: EvalTask, split: str) -> list[dict]:
    import datasets  # deferred: heavy

    hub = task.spec["hub"]
    names = hub.get("names") or [hub.get("name")]
    split_name = (hub.get("splits") or {}).get(split, split)
    docs: list[dict] = []
    for name in names:
        ds = datasets.load_dataset(hub["path"], name, split=split_name, revision=hub.get("revision"))
        docs += [dict(r) | ({"subject": name} if len(names) > 1 else {}) for r in ds]
    return docs


def load_docs(task: EvalTask, split: str) -> list[dict]:
    """The documents of one split: local files in the dataset's own format, else the hub (when online).

    Missing data is an error naming what to download and where to put it (the task's
    ``download`` line); nothing is ever substituted.
    """
    if split in task.docs:
        return task.docs[split]
    p = task.data_path(split)
    if p is not None and not p.exists() and task.spec.get("builder"):
        build(str(task.spec["builder"]), task.data_dir)
    opts = dict(task.spec.get("format_options") or {})
    if p is not None and p.exists():
        fmt = _data_format(task, split, p)
        if fmt in F.READERS:
            try:
                docs = F.read(fmt, p, split, opts)
            except F.MissingData as e:
                raise _missing(task, split, p, str(e)) from None
        else:
            import datasets  # deferred: heavy

            if p.is_dir():
                ds = datasets.load_from_disk(str(p))
                ds = ds[split] if isinstance(ds, datasets.DatasetDict) else ds
            else:
                if fmt not in ("csv", "parquet", "arrow"):
                    raise CptkitError(f"eval task {task.name}: cannot read {p} (set data_format: one of "
                                      f"{', '.join(F.READERS)}, or use .jsonl, .json, .csv, .parquet)")
                ds = datasets.load_dataset(fmt, data_files={split: str(p)}, split=split)
            docs = [dict(r) for r in ds]
    elif task.spec.get("hub") and not hf_offline():
        if not hub_reachable():
            raise _missing(task, split, p, f"not at {p}, and the hub ({task.spec['hub']['path']}) is unreachable")
        try:
            docs = _from_hub(task, split)
        except Exception as e:  # noqa: BLE001 - any hub failure is a user-facing "no data"
            raise _missing(task, split, p, f"not at {p}, and the hub dataset {task.spec['hub']['path']} failed: "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    else:
        raise _missing(task, split, p, f"not at {p}" if p is not None else "no data_files entry")
    if not docs:
        raise CptkitError(f"eval task {task.name}: split {split!r} is empty ({p})")
    if p is not None and p.exists():
        task.sources[split] = str(p)
    else:
        hub = task.spec["hub"]
        task.sources[split] = f"hub:{hub['path']}@{hub.get('revision') or 'unpinned'}"
    task.docs[split] = docs
    return docs
