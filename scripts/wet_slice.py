"""Write a small stand-in for a Common Crawl WET slice, offline: the HTML pages of Debian's
documentation (/usr/share/doc) as WET conversion records (their text from Resiliparse), in
``--files`` archives named like Common Crawl's (``CC-MAIN-...-0000I.warc.wet.gz``); ``--copies``
pages appear twice (as crawls repeat pages), under another URL.

    python scripts/wet_slice.py --out cc/ --files 2 --pages 200
"""

from __future__ import annotations

import argparse
import glob
import io
import os
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--copies", type=int, default=20)
    a = ap.parse_args()
    from resiliparse.extract.html2text import extract_plain_text
    from warcio.warcwriter import WARCWriter

    paths = sorted(f for f in glob.glob("/usr/share/doc/**/*.html", recursive=True)
                   if os.path.isfile(f) and os.path.getsize(f) > 2048)[: a.pages]
    if not paths:
        raise SystemExit("no HTML under /usr/share/doc")
    pages = [(f"http://localhost{p}", extract_plain_text(Path(p).read_bytes().decode("utf-8", "replace"),
                                                          main_content=False)) for p in paths]
    pages += [(url + "?copy", text) for url, text in pages[: a.copies]]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(a.files):
        name = out / f"CC-MAIN-20261207000000-20261207010000-{i:05d}.warc.wet.gz"
        with open(name, "wb") as f:
            w = WARCWriter(f, gzip=True)
            w.write_record(w.create_warcinfo_record(name.name, {"software": "cptkit scripts/wet_slice.py"}))
            for url, text in pages[i:: a.files]:
                if text.strip():
                    w.write_record(w.create_warc_record(url, "conversion", payload=io.BytesIO(text.encode()),
                                                        warc_headers_dict={"Content-Type": "text/plain"}))
        print(name)


if __name__ == "__main__":
    main()
