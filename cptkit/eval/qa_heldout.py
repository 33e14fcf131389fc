"""The ``answers`` group of claim synthetic_share: solutions of QA pairs written from held-out seed problems.

``cptkit qa-heldout --in QA_DIR --out answers.jsonl [--limit N]``

``QA_DIR`` is ``cptkit synthesize-qa``'s output for seed problems that no training stream's QA came
from. Each record becomes ``{id, text: its solution, domain: "answers"}``, for ``cptkit evaluate
eval.ppl.group_by=domain``: the group's loss is the loss on the answer's tokens. They are scored
without their problem before them (evaluate scores documents whole); every arm is scored on the same
records, so the comparison between arms is paired all the same.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.shards import atomic_write_bytes, read_records, resolve_inputs


def answer_records(qa: list[dict], limit: int = 0) -> list[dict[str, str]]:
    """``{id, text, domain: answers}`` per QA record with a non-empty ``solution``, sorted by id."""
    out = [{"id": str(r["id"]), "text": r["solution"].strip(), "domain": "answers"}
           for r in sorted(qa, key=lambda r: str(r["id"])) if isinstance(r.get("solution"), str) and r["solution"].strip()]
    return out[:limit] if limit > 0 else out


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit qa-heldout", description=__doc__.splitlines()[0])
    p.add_argument("--in", dest="inputs", action="append", required=True, help="synthesize-qa output(s)")
    p.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    p.add_argument("--limit", type=int, default=0, help="at most this many records (0: all)")
    a = p.parse_args(argv)
    recs = answer_records([r for inp in resolve_inputs(a.inputs) for r in read_records(inp)], a.limit)
    if not recs:
        raise CptkitError(f"{', '.join(a.inputs)}: no QA record with a solution")
    atomic_write_bytes(a.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs).encode())
    print(f"{a.out}: {len(recs)} answers", file=sys.stderr)
    return 0
