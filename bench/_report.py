"""Write a benchmark's results into its own section of docs/benchmarks.md."""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path

import psutil

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEach section is written by the script named in it; rerun the command to refresh it.\n"


def machine() -> str:
    return f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"


def table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def write_section(name: str, title: str, command: str, body: str, machine_line: str | None = None) -> None:
    """Replace (or append) the ``<!-- bench:name -->`` section of docs/benchmarks.md."""
    text = DOC.read_text() if DOC.exists() else HEADER
    section = (f"<!-- bench:{name} -->\n## {title}\n\n"
               f"Command: `{command}`  \nMachine: {machine_line or machine()}; run {time.strftime('%Y-%m-%d')}.\n\n"
               f"{body.strip()}\n<!-- /bench:{name} -->")
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
