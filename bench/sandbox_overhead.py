"""Per-program wall time: the old Python-level guard vs the OS sandbox of cptkit.eval.code_exec.

    PYTHONPATH=. python bench/sandbox_overhead.py [--n 20]

Runs the HumanEval/MBPP fixture programs (canonical solutions) n times through each, alternating,
and prints the median seconds per program of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

from cptkit.eval import code_exec as X
from cptkit.eval import task_data, tasks, templates
from tests._eval_model import FIXTURES, TASK_DIR


def programs() -> list[str]:
    out = []
    for name, field in (("humaneval", "canonical_solution"), ("mbpp", "code")):
        task = tasks.load_task(name, TASK_DIR, FIXTURES)
        for d in task_data.load_docs(task, "test"):
            out.append(str(templates.render(task.spec["code_eval"]["program"], {**d, "completion": d[field]})))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    n = ap.parse_args().n
    progs = programs()
    assert X.sandbox_problem() is None, X.sandbox_problem()
    times: dict[str, list[float]] = {"guard": [], "sandbox": []}
    for _ in range(n):
        for p in progs:
            for name, fn in (("guard", X.run_guarded), ("sandbox", X.run_sandboxed)):
                t = time.perf_counter()
                assert fn(p).status == "passed"
                times[name].append(time.perf_counter() - t)
    g, s = statistics.median(times["guard"]), statistics.median(times["sandbox"])
    print(f"programs={len(progs)} runs={n} guard_median_s={g:.4f} sandbox_median_s={s:.4f} ratio={s / g:.2f}")


if __name__ == "__main__":
    main()
