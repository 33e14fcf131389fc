"""Common Crawl input: WARC and WET archives as ``--in`` (cptkit/core/warc.py).

The archives are written here with warcio, holding real pages: Debian's HTML documentation under
/usr/share/doc (pydoc's HTML of stdlib modules where a machine has none).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
from pathlib import Path

import pytest
from conftest import read_jsonl_dir, run_main, write_jsonl

from cptkit.core.errors import BadInput
from cptkit.core.shards import ReadStats, read_records, resolve_inputs
from cptkit.core.warc import extract_html

warcio = pytest.importorskip("warcio")  # the dev extra: writes the test archives
from warcio.statusandheaders import StatusAndHeaders  # noqa: E402
from warcio.warcwriter import WARCWriter  # noqa: E402


def real_pages(n: int = 6) -> list[tuple[str, bytes]]:
    """``n`` real HTML pages with text: Debian's documentation, else pydoc's pages of stdlib modules."""
    files = sorted(f for f in glob.glob("/usr/share/doc/**/*.html", recursive=True)
                   if os.path.isfile(f) and os.path.getsize(f) > 4096)
    out = []
    for f in files:
        body = Path(f).read_bytes()
        if len(extract_html(body.decode("utf-8", "replace"))) > 200:
            out.append(("http://localhost" + f, body))
        if len(out) == n:
            return out
    import pydoc

    for mod in ("json", "gzip", "textwrap", "shlex", "csv", "glob", "fnmatch", "string")[: n - len(out)]:
        m = __import__(mod)
        out.append((f"http://localhost/pydoc/{mod}.html", pydoc.HTMLDoc().page(mod, pydoc.HTMLDoc().document(m)).encode()))
    return out


def write_warc(path: Path, pages: list[tuple[str, bytes]], extra: bool = True) -> list[str]:
    """A Common Crawl-like WARC: warcinfo, then a request and a response per page; with ``extra`` an
    image response and a redirect too. Returns the response records' ids, in order."""
    ids = []
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        w.write_record(w.create_warcinfo_record(path.name, {"software": "cptkit tests"}))
        for url, body in pages:
            req = StatusAndHeaders("GET / HTTP/1.1", [("Host", "localhost")], is_http_request=True)
            w.write_record(w.create_warc_record(url, "request", payload=io.BytesIO(b""), http_headers=req))
            resp = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
            rec = w.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=resp)
            ids.append(rec.rec_headers.get_header("WARC-Record-ID"))
            w.write_record(rec)
        if extra:
            png = StatusAndHeaders("200 OK", [("Content-Type", "image/png")], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record("http://localhost/a.png", "response",
                                                payload=io.BytesIO(b"\x89PNG\r\n"), http_headers=png))
            moved = StatusAndHeaders("301 Moved Permanently", [("Content-Type", "text/html"), ("Location", "/")],
                                     protocol="HTTP/1.1")
            w.write_record(w.create_warc_record("http://localhost/old", "response",
                                                payload=io.BytesIO(b"<html><body>Moved here</body></html>"),
                                                http_headers=moved))
    return ids


def write_wet(path: Path, pages: list[tuple[str, bytes]]) -> list[tuple[str, str, str]]:
    """A WET file: warcinfo, then a conversion record per page (its text extracted here). Returns
    (id, url, text) of each conversion record."""
    out = []
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        w.write_record(w.create_warcinfo_record(path.name, {"software": "cptkit tests"}))
        for url, body in pages:
            text = extract_html(body.decode("utf-8", "replace"))
            rec = w.create_warc_record(url, "conversion", payload=io.BytesIO(text.encode()),
                                       warc_headers_dict={"Content-Type": "text/plain",
                                                          "WARC-Identified-Content-Language": "eng"})
            out.append((rec.rec_headers.get_header("WARC-Record-ID"), url, text))
            w.write_record(rec)
    return out


@pytest.fixture(scope="module")
def pages() -> list[tuple[str, bytes]]:
    return real_pages()


@pytest.mark.parametrize("name", ["CC-MAIN-x.warc.wet.gz", "x.wet.gz"])
def test_a_wet_conversion_record_is_a_record_as_is(tmp_path, pages, name):
    wet = tmp_path / name
    want = write_wet(wet, pages)
    st = ReadStats()
    recs = list(read_records(resolve_inputs(str(wet))[0], stats=st))
    assert [(r["id"], r["url"], r["text"]) for r in recs] == want
    assert all(r["id"].startswith("<urn:uuid:") for r in recs)
    assert recs[0]["meta"]["content_type"] == "text/plain" and recs[0]["meta"]["languages"] == "eng"
    assert recs[0]["meta"]["date"][:2] == "20"  # WARC-Date, ISO 8601
    assert st.skipped == {"warcinfo records": 1}


def test_a_warc_response_goes_through_the_extractor_and_others_are_counted(tmp_path, pages):
    warc = tmp_path / "CC-MAIN-x.warc.gz"
    ids = write_warc(warc, pages)
    st = ReadStats()
    recs = list(read_records(str(warc), stats=st))
    assert [r["id"] for r in recs] == ids
    assert [r["url"] for r in recs] == [u for u, _ in pages]
    for rec, (_, body) in zip(recs, pages, strict=True):
        assert rec["text"] == extract_html(body.decode("utf-8"), "resiliparse")  # the extractor's text, no markup
        assert "<" not in rec["text"][:200] and len(rec["text"]) > 200
        assert rec["meta"]["content_type"] == "text/html"
    assert st.skipped == {"warcinfo records": 1, "request records": len(pages), "content type image/png": 1,
                          "http status 301": 1}
    tra = list(read_records(str(warc), html_extractor="trafilatura"))
    assert [r["id"] for r in tra] == ids and tra[0]["text"] != recs[0]["text"]


def test_a_truncated_archive_is_one_line_naming_the_file_and_offset(tmp_path, pages):
    warc = tmp_path / "x.warc.gz"
    write_warc(warc, pages, extra=False)
    cut = tmp_path / "cut.warc.gz"
    data = warc.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(BadInput) as e:
        list(read_records(str(cut)))
    msg = str(e.value)
    assert msg.startswith(f"{cut}: truncated or corrupt archive ") and "record at byte " in msg and "\n" not in msg
    st = ReadStats()
    partial = list(read_records(str(cut), skip_bad=True, stats=st))
    assert 0 < len(partial) < len(pages) and st.bad == 1
    # no gzip stream at all, and an archive with no record
    (tmp_path / "junk.wet.gz").write_bytes(gzip.compress(b"not a warc\r\n", mtime=0)[:-4])
    with pytest.raises(BadInput, match="junk.wet.gz: truncated or corrupt archive in its first record"):
        list(read_records(str(tmp_path / "junk.wet.gz")))


def test_dedup_reads_wet_and_warc_and_counts_what_it_skipped(tmp_path, pages, capsys):
    """A step reads a directory of archives as it reads the same records as JSONL (a page twice is
    removed), and counts the archive records it skipped in the manifest."""
    d = tmp_path / "cc"
    d.mkdir()
    write_warc(d / "a.warc.gz", pages[:3])
    wet = write_wet(d / "b.warc.wet.gz", pages[3:] + pages[3:4])  # one page twice
    as_jsonl = [r for f in sorted(d.iterdir()) for r in read_records(str(f))]
    write_jsonl(tmp_path / "jsonl" / "x.jsonl", as_jsonl)
    for src, out in ((d, tmp_path / "out"), (tmp_path / "jsonl", tmp_path / "out_jsonl")):
        assert run_main(["dedup", "--in", src, "--out", out, "--quiet"]) == 0, capsys.readouterr()
    recs = read_jsonl_dir(tmp_path / "out")
    assert recs == read_jsonl_dir(tmp_path / "out_jsonl")
    assert wet[-1][0] not in {r["id"] for r in recs} and len(recs) < len(as_jsonl)
    counts = json.loads((tmp_path / "out" / "_manifest.json").read_text())["counts"]
    assert counts["records_in"] == len(pages) + 1
    assert counts["records_skipped"] == {"content type image/png": 1, "http status 301": 1,
                                         "request records": 3, "warcinfo records": 2}


def test_a_bad_extractor_name_is_one_line(tmp_path, pages, capsys):
    write_wet(tmp_path / "x.wet.gz", pages[:1])
    rc = run_main(["dedup", "--in", tmp_path / "x.wet.gz", "--out", tmp_path / "o", "io.html_extractor=bs4"])
    assert rc == 2 and "html_extractor=bs4: must be one of resiliparse, trafilatura" in capsys.readouterr().err
