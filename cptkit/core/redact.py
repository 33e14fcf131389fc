"""Secrets out of everything cptkit writes or prints, from one place.

A value is secret when its key is named like one (``api_key``, ``token``, ``password``,
``secret``, ``hf_token``, ...), when it is a URL's userinfo (``redis://:PW@host``,
``http://user:PW@host``, ``https://TOKEN@host``) or a URL query parameter named like one
(``?api_key=``, ``&sig=``), or when it is the value of an environment variable named like one
(``AWS_SECRET_ACCESS_KEY``, ``GITHUB_TOKEN``; and the variable ``llm.api_key_env`` names).
Every such value is remembered and then masked BY VALUE wherever it appears, whatever the key or
text around it (a resolved ``${oc.env:...}``, a server's error echoing a header).
:func:`redact` masks them in configs, manifests, markers and results (``atomic_write_json``
applies it to every JSON file cptkit writes); :func:`redact_text` masks them in free text
(override lists, log lines, error messages).
Secrets are best passed by environment variable (:data:`SECRET_ENV`), never on the command line.
"""

from __future__ import annotations

import functools
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
# scheme://user:password@host  or  scheme://:password@host  (password up to the last @ of the authority); one
# slash too: a URL passed where a path is expected comes back from pathlib as scheme:/user:password@host
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://?)(?P<user>[^:/@\s'\"]*):(?P<pw>[^/\s'\"]*)@")
# scheme://TOKEN@host: a user name alone is how tokens ride in URLs (https://ghp_...@github.com)
_URL_USER = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://?)(?P<user>[^:/@\s'\"<>]+)@")
# ?api_key=V / &sig=V / &X-Amz-Signature=V: query parameters named like a secret
_URL_QUERY = re.compile(r"(?P<key>[?&][\w.-]*?(?:key|token|sig|signature|secret|password|passwd|auth|credential)"
                        r"[\w.-]*=)(?P<val>[^&#\s'\"<>]+)", re.IGNORECASE)
# key=value / key: value / "key": "value" for secret key names, in text (not an already masked value)
_KV = re.compile(r"(?P<key>[\w.+~-]*?(?:api[_-]?key|apikey|token|password|passwd|secret|credentials?))"
                 r"(?P<sep>\s*[=:]\s*|\"\s*:\s*\"|'\s*:\s*')(?!<redacted>)(?P<val>[^\s,'\"\]}]+)", re.IGNORECASE)
# a file position after a name (``token:12:`` in ``data/token:12: malformed JSON``): a line (and column), no value
_POSITION = re.compile(r"\d+(?::\d+)?:")
# an environment variable whose value is a secret: a name part KEY, TOKEN, SECRET, PASSWORD... (not PWD: the cwd)
_ENV_PART = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "PAT"}

_seen: set[str] = set()


@functools.lru_cache(maxsize=4096)  # the same few keys, in every marker and fingerprint
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


def is_secret_env(name: str) -> bool:
    """True for environment variable names that hold a secret (``AWS_SECRET_ACCESS_KEY``, ``HF_TOKEN``)."""
    return name in SECRET_ENV or bool(_ENV_PART & set(re.split(r"[_\W]+", name.upper())))


def remember_env(name: str | None) -> None:
    """Mask the value of the environment variable ``name`` (e.g. the one ``llm.api_key_env`` names)."""
    if name:
        remember(os.environ.get(str(name)))


def _env_secrets() -> None:
    for name, value in os.environ.items():
        if is_secret_env(name) and len(value) >= 8:
            remember(value)


def redact_url(url: str) -> str:
    """``scheme://user:PW@host`` -> ``scheme://user:<redacted>@host``; ``scheme://TOKEN@host`` ->
    ``scheme://<redacted>@host``; ``?api_key=V`` -> ``?api_key=<redacted>``."""
    def pw(m: re.Match) -> str:
        if m.group("pw") and m.group("pw") != MASK:
            remember(m.group("pw"))
            return f"{m.group('scheme')}{m.group('user')}:{MASK}@"
        return m.group(0)

    def user(m: re.Match) -> str:
        if m.group("user") == MASK:
            return m.group(0)
        remember(m.group("user"))
        return f"{m.group('scheme')}{MASK}@"

    def query(m: re.Match) -> str:
        if not _plausible(m.group("val")):
            return m.group(0)
        remember(m.group("val"))
        return f"{m.group('key')}{MASK}"

    return _URL_QUERY.sub(query, _URL_USER.sub(user, _URL_USERINFO.sub(pw, url)))


def redact_text(text: str) -> str:
    """Mask URL passwords, ``secret_key=value`` pairs and every remembered secret in ``text``."""
    if not text:
        return text
    _env_secrets()
    return _mask(text)


def _mask(text: str) -> str:
    if not text:
        return text
    if ":" not in text and "=" not in text:  # no URL, no key=value (a path, a digest): remembered values only
        return mask_known(text)
    text = redact_url(text)

    def kv(m: re.Match) -> str:
        if not _plausible(m.group("val")) or _POSITION.fullmatch(m.group("val")):
            return m.group(0)
        remember(m.group("val"))
        return f"{m.group('key')}{m.group('sep')}{MASK}"

    return _replace_seen(_KV.sub(kv, text))


def mask_known(text: str) -> str:
    """``text`` with every remembered secret value masked, and nothing else changed (for records:
    data such as ``token: x`` in a document stays as it is)."""
    for s in tuple(_seen):  # a snapshot: other threads may remember more meanwhile
        if s in text:
            return _replace_seen(text)
    return text


def _replace_seen(text: str) -> str:
    for s in sorted(_seen, key=len, reverse=True):
        if s in text:
            text = text.replace(s, MASK)
    return text


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, strings) with secret keys' values, URL secrets and every
    remembered secret value masked."""
    _env_secrets()
    return _redact(obj)


def _redact(obj: Any) -> Any:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if is_secret_key(k) and _plausible(v):
                remember(v)
                out[k] = MASK
            else:
                out[_mask(k) if isinstance(k, str) else k] = _redact(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [_redact(v) for v in obj]
    if isinstance(obj, str):
        return _mask(obj)
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
