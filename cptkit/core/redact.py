"""Secrets out of everything cptkit writes or prints, from one place.

A value is secret when its key is named like one (``api_key``, ``token``, ``password``,
``secret``, ``hf_token``, ...) or when it is the password in a URL's userinfo
(``redis://:PW@host``, ``http://user:PW@host``). :func:`redact` masks them in configs,
manifests and results; :func:`redact_text` masks them in free text (override lists, log
lines, error messages), including any secret value seen before in this process.
Secrets are best passed by environment variable (:data:`SECRET_ENV`), never on the command line.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

MASK = "<redacted>"
# Environment variables cptkit reads secrets from (docs/records.md "Secrets").
SECRET_ENV = ("CPTKIT_LLM_API_KEY", "OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY",
              "CPTKIT_REDIS_PASSWORD", "CPTKIT_ES_PASSWORD")

_KEY = re.compile(r"(?:^|[._-])(?:api[_-]?key|apikey|token|access[_-]?token|auth[_-]?token|hf[_-]?token|"
                  r"password|passwd|pwd|secret|secret[_-]?key|client[_-]?secret|credentials?)$", re.IGNORECASE)
_BARE_KEY = re.compile(r"^(?:api[_-]?key|apikey|token|password|passwd|pwd|secret|credentials?)$", re.IGNORECASE)
# scheme://user:password@host  or  scheme://:password@host  (password up to the last @ of the authority)
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/@\s'\"]*):(?P<pw>[^/\s'\"]*)@")
# key=value / key: value / "key": "value" for secret key names, in text
_KV = re.compile(r"(?P<key>[\w.+~-]*?(?:api[_-]?key|apikey|token|password|passwd|secret|credentials?))"
                 r"(?P<sep>\s*[=:]\s*|\"\s*:\s*\"|'\s*:\s*')(?P<val>[^\s,'\"\]}]+)", re.IGNORECASE)

_seen: set[str] = set()


def is_secret_key(key: Any) -> bool:
    """True for keys that name a secret (``llm.api_key``, ``hf_token``, ``password``...)."""
    k = str(key).lstrip("+~")
    return bool(_KEY.search(k) or _BARE_KEY.match(k.rsplit(".", 1)[-1]))


_NOT_SECRET = re.compile(r"^(?:true|false|null|none|[-+]?\d+(?:\.\d*)?|\$\{.*\}|<redacted>)$", re.IGNORECASE)


def _plausible(value: Any) -> bool:
    """A string that can be a secret (not a flag, a number, an interpolation or already masked)."""
    return isinstance(value, str) and bool(value) and not _NOT_SECRET.match(value)


def remember(value: Any) -> None:
    """Mask ``value`` wherever it appears in later text (plausible secrets of 6+ characters)."""
    if _plausible(value) and len(value) >= 6:
        _seen.add(value)


def _env_secrets() -> None:
    for name in SECRET_ENV:
        remember(os.environ.get(name))


def redact_url(url: str) -> str:
    """``scheme://user:PW@host`` -> ``scheme://user:<redacted>@host``."""
    def sub(m: re.Match) -> str:
        if m.group("pw") and m.group("pw") != MASK:
            remember(m.group("pw"))
            return f"{m.group('scheme')}{m.group('user')}:{MASK}@"
        return m.group(0)

    return _URL_USERINFO.sub(sub, url)


def redact_text(text: str) -> str:
    """Mask URL passwords, ``secret_key=value`` pairs and every remembered secret in ``text``."""
    if not text:
        return text
    _env_secrets()
    text = redact_url(text)

    def kv(m: re.Match) -> str:
        if not _plausible(m.group("val")):
            return m.group(0)
        remember(m.group("val"))
        return f"{m.group('key')}{m.group('sep')}{MASK}"

    text = _KV.sub(kv, text)
    for s in sorted(_seen, key=len, reverse=True):
        if s in text:
            text = text.replace(s, MASK)
    return text


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, strings) with secret keys' values and URL passwords masked."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if is_secret_key(k) and _plausible(v):
                remember(v)
                out[k] = MASK
            else:
                out[k] = redact(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def _scrub(record: logging.LogRecord) -> logging.LogRecord:
    try:
        msg = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record is logged as is
        return record
    clean = redact_text(msg)
    if clean != msg:
        record.msg, record.args = clean, None
    return record


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets in every record's rendered message."""

    def filter(self, record: logging.LogRecord) -> bool:
        _scrub(record)
        return True


def install_log_redaction() -> None:
    """Mask secrets in every log record of every logger (Hydra's launcher lines included), once."""
    old = logging.getLogRecordFactory()
    if getattr(old, "_cptkit_redacts", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return _scrub(old(*args, **kwargs))

    factory._cptkit_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
