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


def test_a_tests_make_does_not_inherit_the_callers_make_variables():
    """Under ``make test VENV=/shared`` (how CI and a shared venv run the suite), MAKEFLAGS carried VENV
    into every make a test ran, and test_readme's ``-o .venv/.installed`` then missed: make reinstalled
    /shared from the test's checkout. conftest drops make's variables; a test's make, run with the
    environment the tests pass on, sees none of them."""
    from conftest import MAKE_VARS

    r = subprocess.run(["make", "-s", "-f", "-", "show"], input="show:\n\t@echo \"[$(VENV)]\"\n",
                       env={**os.environ}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    assert not set(MAKE_VARS) & set(os.environ)
