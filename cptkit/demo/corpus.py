"""The demo corpus: real English and Chinese documentation text from Debian packages.

Each source is one Debian documentation package, fetched with ``apt-get download`` into a
cache directory and unpacked with ``dpkg -x`` (no root, nothing installed). A parser turns
the package's files into records ``{id, text, source, url, lang, meta}`` in a fixed order:

===================  =======================  ====  =========================================
source               package                  lang  unit
===================  =======================  ====  =========================================
python-docs          python3.11-doc           en    reST section or top-level object
maxima-docs          maxima-doc               en    HTML section or function definition
gcide                dict-gcide               en    dictionary entry (short ones merged)
manpages-zh          manpages-zh              zh    man page section (zh_CN)
debian-reference-zh  debian-reference-zh-cn   zh    numbered section of the plain-text book
fortunes-zh          fortunes-zh              zh    one fortune (poems, quotes)
===================  =======================  ====  =========================================

The text transformations are pure functions of strings (tested directly); only
:func:`~cptkit.demo.sources.base.fetch_deb`, :func:`~cptkit.demo.sources.base.extract_deb` and
:func:`~cptkit.demo.sources.manpages_zh.render_man` touch the system.

This module is the table of sources (one parser module each in :mod:`cptkit.demo.sources`, what
they share in :mod:`cptkit.demo.sources.base`) and how a source's records are finished.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from cptkit.core.errors import CptkitError
from cptkit.core.records import Record
from cptkit.demo.sources.base import Source, cjk_share, content_hash, split_long
from cptkit.demo.sources.debian_reference_zh import debian_reference_zh_records
from cptkit.demo.sources.fortunes_zh import fortunes_zh_records
from cptkit.demo.sources.gcide import gcide_records
from cptkit.demo.sources.manpages_zh import manpages_zh_records
from cptkit.demo.sources.maxima_docs import maxima_docs_records
from cptkit.demo.sources.python_docs import python_docs_records

SOURCES: dict[str, Source] = {s.name: s for s in [
    Source("python-docs", "python3.11-doc", "en", python_docs_records),
    Source("maxima-docs", "maxima-doc", "en", maxima_docs_records),
    Source("gcide", "dict-gcide", "en", gcide_records),
    Source("manpages-zh", "manpages-zh", "zh", manpages_zh_records),
    Source("debian-reference-zh", "debian-reference-zh-cn", "zh", debian_reference_zh_records),
    Source("fortunes-zh", "fortunes-zh", "zh", fortunes_zh_records, min_chars=10, merges=False),
]}


def source_records(name: str, root: Path, *, min_chars: int | None = None, max_chars: int = 0,
                   man_renderer: str = "auto", sources: dict[str, Source] | None = None) -> Iterator[Record]:
    """The records of source ``name`` (of ``sources``, default :data:`SOURCES`) from its unpacked
    package at ``root``, ids unique.

    A record of a Chinese source with (almost) no Chinese in it gets ``lang: en``.
    Documents longer than ``max_chars`` are split at paragraph breaks into ``<id>~pN`` parts.
    """
    sources = SOURCES if sources is None else sources
    if name not in sources:
        raise CptkitError(f"unknown corpus source {name!r}; known: {', '.join(sources)}")
    src = sources[name]
    mc = src.min_chars if min_chars is None or not src.merges else min_chars
    gen = src.parse(root, mc, renderer=man_renderer) if name == "manpages-zh" else src.parse(root, mc)
    seen: set[str] = set()
    for rec in gen:
        if src.lang == "zh" and cjk_share(rec["text"]) < 0.05:
            rec["lang"] = "en"  # an untranslated section of a Chinese man page
        parts = split_long(rec["text"], max_chars)
        for k, part in enumerate(parts, 1):
            r = dict(rec, text=part) if len(parts) == 1 else dict(rec, id=f"{rec['id']}~p{k}", text=part)
            if r["id"] in seen:
                r["id"] = f"{r['id']}~{content_hash(part, 8)}"
            seen.add(r["id"])
            yield r
