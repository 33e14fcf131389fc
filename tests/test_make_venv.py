"""A caller's ``make -o VENV/.installed`` (tests share one venv) must hold in the Makefile's sub-makes too.

GNU make hands variables down to a recursive ``$(MAKE)`` but not ``-o``: a sub-make then saw the
stamp older than pyproject.toml and reinstalled the venv from the calling checkout (``pip install -e``),
which re-pointed a shared venv at a temporary worktree.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("target", ["demo", "plan-experiment"])
def test_sub_makes_keep_the_callers_made_venv(tmp_path, target):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/usr/bin/true")
    stamp = venv / ".installed"
    stamp.touch()
    os.utime(stamp, (0, 0))  # older than pyproject.toml: out of date to a make without -o
    r = subprocess.run(["make", "-n", "--no-print-directory", target, f"VENV={venv}", "-o", str(stamp),
                        f"DATA={tmp_path}/data", f"PLAN_PREREG={tmp_path}/prediction.yaml"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 2), r.stderr[-2000:]
    assert "pip install" not in r.stdout, r.stdout[-3000:]
    assert "cptkit" in r.stdout  # the sub-make ran (dry) and printed its recipes


def test_tests_that_run_make_name_the_venv_they_hold_made():
    """A test's ``make -o .venv/.installed`` under ``make test VENV=/shared`` inherits VENV through
    MAKEFLAGS, so its ``-o`` names another file and make reinstalls /shared from the test's checkout
    (this re-pointed the shared venv once). Every test that tells make the venv is made must name
    VENV on the same line."""
    bad = []
    for path in sorted(set((ROOT / "tests").glob("test_*.py")) - {Path(__file__).resolve()}):
        text = path.read_text()
        if ".installed" in text and '"make"' in text:
            if '"-o", ".venv/.installed"' in text or "VENV=" not in text:
                bad.append(path.name)
    assert not bad, f"tests that hold the venv made without naming VENV: {bad}"
