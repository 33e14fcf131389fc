"""Write the CHAMP competition-math problems (PyPI ``champ-dataset``, MIT) as a seed problem set.

    pip install champ-dataset
    python examples/champ_problems.py examples/champ_problems.jsonl
    cptkit synthesize-qa --in examples/champ_problems.jsonl --out math_qa/ synth.mode=code \
        synth.code.discipline="competition mathematics"

Each line: ``id``, ``text`` (= ``problem``), ``problem``, ``solution`` (its steps), ``answer``,
``category``. Problems are sorted by id, so the file is reproducible.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def champ_records() -> list[dict]:
    spec = importlib.util.find_spec("champ_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("champ-dataset is not installed: pip install champ-dataset")
    data = json.loads((Path(list(spec.submodule_search_locations)[0]) / "dataset_files" / "v0.json").read_text())
    out = []
    for pid in sorted(data["problems"]):
        p = data["problems"][pid]
        steps = " ".join(s["_text"] for s in (p.get("solution") or {}).get("steps", []))
        out.append({"id": pid, "text": p["_text"], "problem": p["_text"], "solution": steps,
                    "answer": p.get("_answer") or p.get("answer"), "category": p.get("category")})
    return out


def main(path: str) -> None:
    recs = champ_records()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(recs)} problems -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/champ_problems.jsonl")
