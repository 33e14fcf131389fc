"""Common Crawl's own files as records: WARC (``*.warc.gz``) and WET (``*.wet.gz``, ``*.warc.wet.gz``).

Read with FastWARC (Resiliparse's reader: 4.5-7.2x warcio's speed on the same archives,
``bench/warc.py``) over Python's gzip, whose end-of-stream check turns a truncated archive into an
error instead of a silent early end. One record per usable archive record:

* ``id``: the ``WARC-Record-ID``; ``url``: the ``WARC-Target-URI``; ``meta``: ``date`` (``WARC-Date``),
  ``content_type`` and, in WET files, ``languages`` (``WARC-Identified-Content-Language``).
* A WET ``conversion`` record's text is used as is.
* A WARC ``response`` record with an HTML payload (``text/html``, ``application/xhtml+xml``) and a 2xx
  status goes through an HTML extractor, ``io.html_extractor``: ``resiliparse`` (default: DCLM's;
  main content, about 20x trafilatura's speed for 0.54 of the page's paragraphs against 0.60,
  ``bench/warc.py``) or ``trafilatura`` (FineWeb's).
* Everything else (``warcinfo``, ``request``, ``metadata`` records, other content types, other
  statuses, pages with no text) is skipped and counted by reason in :attr:`ReadStats.skipped`.

A truncated or corrupt archive is :class:`BadInput` naming the file and the (decompressed) byte
offset of the record it stopped in, unless ``skip_bad``: then the rest of that file is skipped and
counted as one bad record.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import IO, Any

from cptkit.core.errors import BadInput, CptkitError

WARC_SUFFIXES = (".warc.gz", ".wet.gz")  # (".warc.wet.gz" ends in ".wet.gz")
EXTRACTORS = ("resiliparse", "trafilatura")
HTML_TYPES = ("text/html", "application/xhtml+xml")


def is_warc(path: str) -> bool:
    """Whether ``path`` names a WARC or WET archive."""
    return path.endswith(WARC_SUFFIXES)


def _decode(body: bytes, charset: str | None) -> str:
    """An HTML payload as text: its declared charset, else the one Resiliparse detects."""
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    if charset:
        try:
            return body.decode(charset)
        except (LookupError, UnicodeDecodeError):
            pass
    return bytes_to_str(body, detect_encoding(body))


def extract_html(html: str, extractor: str = "resiliparse") -> str:
    """The main text of an HTML page with ``extractor`` (``resiliparse`` or ``trafilatura``); '' if none."""
    if extractor == "resiliparse":
        from resiliparse.extract.html2text import extract_plain_text

        return extract_plain_text(html, main_content=True).strip()
    if extractor == "trafilatura":
        import trafilatura

        return (trafilatura.extract(html, include_comments=False) or "").strip()
    raise CptkitError(f"io.html_extractor={extractor}: must be one of {', '.join(EXTRACTORS)}")


def warc_records(fh: IO[bytes], name: str, *, skipped: dict[str, int], extractor: str = "resiliparse",
                 skip_bad: bool = False) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """``(offset, record)`` of every usable record of the gzip-compressed archive ``fh`` (``offset``:
    the record's byte offset in the decompressed archive), or ``(offset, reason)`` for an archive
    record that cannot be one (no ``WARC-Record-ID``). Skipped records are counted in ``skipped``.
    A truncated archive raises :class:`BadInput` (``skip_bad``: yields ``(offset, reason)`` and stops)."""
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    stream = gzip.GzipFile(fileobj=fh, mode="rb")
    it = iter(ArchiveIterator(stream, parse_http=True, stream_detect=False))
    offset, rid = 0, None
    seen, inside = 0, False
    while True:
        try:
            inside = False
            rec = next(it, None)
            if rec is None:
                break
            offset, rid, inside = rec.stream_pos, rec.record_id, True
            seen += 1
            kind = rec.record_type
            if kind == WarcRecordType.conversion:
                ctype = (rec.headers.get("Content-Type") or "text/plain").split(";")[0].strip()
                text = rec.reader.read().decode("utf-8", "replace").strip()
            elif kind == WarcRecordType.response:
                ctype = (rec.http_content_type or "").split(";")[0].strip().lower()
                if ctype not in HTML_TYPES:
                    rec.reader.consume()
                    _count(skipped, f"content type {ctype or 'none'}")
                    continue
                status = rec.http_headers.status_code if rec.is_http_parsed else None
                if status is not None and not 200 <= status < 300:
                    rec.reader.consume()
                    _count(skipped, f"http status {status}")
                    continue
                text = extract_html(_decode(rec.reader.read(), rec.http_charset), extractor)
            else:
                rec.reader.consume()
                _count(skipped, f"{str(kind).rsplit('.', 1)[-1].lower()} records")
                continue
        except (EOFError, OSError, zlib.error, ValueError) as e:
            where = f"{'in' if inside else 'after'} the record at byte {offset} ({rid})" if seen else "in its first record"
            reason = f"truncated or corrupt archive {where}: {e}"
            if not skip_bad:
                raise BadInput(name, None, reason) from None
            yield offset, reason
            return
        if not text:
            _count(skipped, "no text")
            continue
        if not rid:
            yield offset, f"record at byte {offset} has no WARC-Record-ID"
            continue
        meta: dict[str, Any] = {"date": rec.headers.get("WARC-Date"), "content_type": ctype}
        langs = rec.headers.get("WARC-Identified-Content-Language")
        if langs:
            meta["languages"] = langs
        out: dict[str, Any] = {"id": rid, "text": text}
        url = rec.headers.get("WARC-Target-URI")
        if url:
            out["url"] = url
        out["meta"] = meta
        yield offset, out
    if seen == 0:
        raise BadInput(name, None, "input is empty (no WARC records)")


def _count(skipped: dict[str, int], reason: str) -> None:
    skipped[reason] = skipped.get(reason, 0) + 1

