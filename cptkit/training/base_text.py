"""B0's re-adaptation text in disjoint parts, and the per-seed samples drawn from a part.

``cptkit base-text split --in data/b0_text --out data/xp/b0_split`` puts every
record of the B0 text in exactly one of three parts, by a seeded hash of its id (so a record's part
does not depend on the others, nor on their order):

* ``train``: what B0's stream reads (B0 trains on nothing else);
* ``heldout``: held-out base text, the forgetting measure: text of B0's own source that it never
  trained on (``domain: heldout``, for ``evaluate``'s per-domain groups);
* ``replay``: the base-text replay source of the ``replay_b0text`` arm, disjoint from both.

``cptkit base-text sample --in data/xp/b0_split/heldout --out data/xp/heldout_s3
--docs 32 --seed 3`` draws one seed's documents of a part (the ``docs`` records whose seeded hash is
smallest), so that which texts measure forgetting is part of the seed-to-seed variance.

Each output is a folder ``part-00000.jsonl`` + ``_SUCCESS``, written atomically; a split writes its
three parts, then ``_split.json`` (counts, shares, seed) and its own ``_SUCCESS`` last.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from cptkit.core.errors import CptkitError, cli_main
from cptkit.core.output import writing
from cptkit.core.records import Record
from cptkit.core.shards import atomic_write_bytes, atomic_write_json, iter_records, resolve_inputs
from cptkit.text.hashing import fast_seeded_hash

PARTS = ("train", "heldout", "replay")
_SCALE = 2**64


def _unit(seed: int, rid: str) -> float:
    """A record id's seeded position in [0, 1)."""
    return (fast_seeded_hash(seed, rid) % _SCALE) / _SCALE


def part_of(rid: str, heldout: float, replay: float, seed: int) -> str:
    """The part of a record id: ``heldout`` below ``heldout``, ``replay`` in the next ``replay``, else ``train``."""
    u = _unit(seed, rid)
    return "heldout" if u < heldout else "replay" if u < heldout + replay else "train"


def split_records(records: Iterable[Record], heldout: float, replay: float, seed: int) -> dict[str, list[Record]]:
    """Every record in exactly one part (ids must be unique: a repeated id names the record)."""
    if not (0 < heldout and 0 < replay and heldout + replay < 1):
        raise CptkitError(f"--heldout {heldout} and --replay {replay}: each must be > 0 and together < 1")
    out: dict[str, list[Record]] = {p: [] for p in PARTS}
    seen: set[str] = set()
    for r in records:
        rid = str(r.get("id", ""))
        if not rid:
            raise CptkitError(f"a record without an id (text {str(r.get('text', ''))[:40]!r}): ids decide the split")
        if rid in seen:
            raise CptkitError(f"record id {rid!r} occurs twice: the split needs unique ids")
        seen.add(rid)
        p = part_of(rid, heldout, replay, seed)
        out[p].append({**r, "domain": "heldout"} if p == "heldout" else r)
    return out


def sample_records(records: Iterable[Record], docs: int, seed: int) -> list[Record]:
    """The ``docs`` records with the smallest seeded hash of their id, in that order."""
    if docs < 1:
        raise CptkitError(f"--docs {docs}: must be >= 1")
    ranked = sorted(records, key=lambda r: (_unit(seed, str(r["id"])), str(r["id"])))
    if len(ranked) < docs:
        raise CptkitError(f"asked for {docs} documents, the input has {len(ranked)}")
    return ranked[:docs]


def _read(path: Path) -> list[Record]:
    if not path.exists():
        raise CptkitError(f"{path}: does not exist")
    return list(iter_records(resolve_inputs([str(path)])))


def _write_part(out: Path, records: list[Record]) -> None:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    with writing(out):  # _SUCCESS last
        atomic_write_bytes(out / "part-00000.jsonl", data)


@cli_main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cptkit base-text", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="the B0 text in three disjoint parts: train, heldout, replay")
    s.add_argument("--in", dest="inp", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--heldout", type=float, default=0.1, help="share of records held out (the measure)")
    s.add_argument("--replay", type=float, default=0.1, help="share of records in the replay source")
    s.add_argument("--seed", type=int, default=0)
    d = sub.add_parser("sample", help="one seed's documents of a part")
    d.add_argument("--in", dest="inp", type=Path, required=True)
    d.add_argument("--out", type=Path, required=True)
    d.add_argument("--docs", type=int, required=True)
    d.add_argument("--seed", type=int, required=True)
    a = p.parse_args(argv)
    recs = _read(a.inp)
    if a.cmd == "split":
        parts = split_records(recs, a.heldout, a.replay, a.seed)
        empty = [k for k, v in parts.items() if not v]
        if empty:
            raise CptkitError(f"{a.inp}: {len(recs)} records leave the {empty[0]} part empty: give more text or a larger share")
        with writing(a.out):  # _SUCCESS last
            for k in PARTS:
                _write_part(a.out / k, parts[k])
            atomic_write_json(a.out / "_split.json", {"input": str(a.inp), "seed": a.seed, "heldout": a.heldout,
                                                       "replay": a.replay, "records": {k: len(v) for k, v in parts.items()}})
        print(f"{a.out}: " + ", ".join(f"{k} {len(v)}" for k, v in parts.items()) + f" records (seed {a.seed})",
              file=sys.stderr)
    else:
        _write_part(a.out, sample_records(recs, a.docs, a.seed))
        print(f"{a.out}: {a.docs} of {len(recs)} records of {a.inp} (seed {a.seed})", file=sys.stderr)
    return 0
