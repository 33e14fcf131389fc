"""HumanEval/MBPP: pass@k (Chen et al. 2021's unbiased estimator) and the sandboxed execution of programs."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cptkit.eval import runner, task_data, tasks
from cptkit.eval.code_exec import pass_at_k, pass_at_k_exact, run_program
from tests._eval_model import FIXTURES, TASK_DIR


def test_pass_at_k_hand_numbers():
    # 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)              # 1 - 7/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)               # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)               # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(3, 1, 2) == pytest.approx(2 / 3)             # 1 - C(2,2)/C(3,2) = 1 - 1/3
    assert pass_at_k(20, 0, 10) == 0.0 and pass_at_k(20, 20, 10) == 1.0
    assert pass_at_k(5, 4, 2) == 1.0                              # n - c < k: every k-subset has a pass
    # the product form stays exact where the binomials are huge
    assert pass_at_k(200, 37, 100) == pytest.approx(pass_at_k_exact(200, 37, 100), rel=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError, match="pass@10 needs at least 10 samples"):
        pass_at_k(5, 1, 10)


def test_sandbox_runs_correct_wrong_looping_and_escaping_programs(tmp_path):
    assert run_program("def f(x):\n    return x + 1\nassert f(1) == 2\n").status == "passed"
    wrong = run_program("def f(x):\n    return x - 1\nassert f(1) == 2\n")
    assert wrong.status == "failed" and "AssertionError" in wrong.stderr_tail
    assert run_program("while True:\n    pass\n", timeout=2).status == "timeout"
    target = Path("/tmp") / f"cptkit-escape-{uuid.uuid4().hex}.txt"
    esc = run_program(f"open({str(target)!r}, 'w').write('pwned')\n")
    # /tmp is absent in the sandbox's root, or read-only where the Python install or venv lives under it
    assert esc.status == "failed" and not target.exists()
    assert "FileNotFoundError" in esc.stderr_tail or "Read-only file system" in esc.stderr_tail, esc.stderr_tail
    esc2 = run_program(f"import os\nfd = os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\n")
    assert esc2.status == "failed" and not target.exists()
    sys_ok = run_program(f"import os\nassert os.system('touch {target}') == 0\n")
    assert sys_ok.status == "failed" and not target.exists()  # the shell runs, but only inside the sandbox
    inside = run_program("open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n")
    assert inside.status == "passed"
    big = run_program("open('big.bin', 'wb').write(b'x' * (8 << 20))\n", max_file_mb=1)
    assert big.status == "failed" and "File too large" in big.stderr_tail
    assert run_program("x = bytearray(2 << 30)\n", memory_mb=512).status == "failed"
    net = run_program("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)\n")
    assert net.status == "failed" and net.network in ("netns", "socket-disabled")


def test_score_code_humaneval_and_mbpp_pass_at_k():
    he = tasks.load_task("humaneval", TASK_DIR, FIXTURES)
    docs = task_data.load_docs(he, "test")
    ce = dict(he.spec["code_eval"]) | {"timeout": 3}
    add_ok, even_ok = docs[0]["canonical_solution"], docs[1]["canonical_solution"]
    items = runner.score_code(he, docs, [[add_ok], ["    return n % 2 == 1\n"]], ce)
    assert [it["pass@1"] for it in items] == [1.0, 0.0] and [it["id"] for it in items] == ["HumanEval/0", "HumanEval/1"]
    # 3 samples each: correct / wrong / infinite loop, and one that writes outside its directory
    escape = "    open('/tmp/cptkit-he-escape.txt', 'w').write('x')\n    return n % 2 == 0\n"
    samples = [[add_ok, "    return a - b\n", "    while True:\n        pass\n"],
               [even_ok, escape, even_ok]]
    items = runner.score_code(he, docs, samples, ce | {"k": [1, 2]})
    assert items[0]["status"] == ["passed", "failed", "timeout"] and items[1]["status"] == ["passed", "failed", "passed"]
    assert items[0]["pass@1"] == pytest.approx(1 / 3) and items[0]["pass@2"] == pytest.approx(2 / 3)
    assert items[1]["pass@1"] == pytest.approx(2 / 3) and items[1]["pass@2"] == 1.0
    assert not Path("/tmp/cptkit-he-escape.txt").exists()
    mb = tasks.load_task("mbpp", TASK_DIR, FIXTURES)
    mdocs = task_data.load_docs(mb, "test")
    got = runner.score_code(mb, mdocs, [[d["code"]] for d in mdocs] + [], dict(mb.spec["code_eval"]))
    assert [it["pass@1"] for it in got] == [1.0, 1.0]
    got = runner.score_code(mb, mdocs, [["def square(x):\n  return x + x"], ["def rev(s):\n  return s"]], dict(mb.spec["code_eval"]))
    assert [it["pass@1"] for it in got] == [0.0, 0.0]
