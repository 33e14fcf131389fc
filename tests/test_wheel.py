"""cptkit installs from a wheel: conf/ ships inside it and a step runs outside the repository.

The wheel is built from this checkout and installed with ``--no-deps`` into a fresh venv whose
dependencies come from the test's own interpreter (a ``.pth`` line, so nothing is downloaded and
the editable install of the checkout is not on the path). The step then runs from a directory
outside the repository, so it can only find its configs inside the installed package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, read_jsonl_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    # Build from a copy without build/ (setuptools reuses build/lib, which can hold deleted files).
    src = tmp_path_factory.mktemp("src") / "cptkit"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "data", "*.egg-info",
                                                             "__pycache__", "tests", "bench", "docs", ".*cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, capture_output=True)
    (whl,) = dist.glob("cptkit-*.whl")
    return whl


def test_wheel_ships_every_config(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.removeprefix("cptkit/conf/") for n in names if n.startswith("cptkit/conf/")}
    in_repo = {str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml")}
    assert in_repo and shipped == in_repo


def test_wheel_in_fresh_venv_runs_dedup(wheel: Path, corpus_dir: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # Dependencies from this interpreter's site-packages (a plain path line: its .pth files, the
    # editable install of this checkout among them, are not processed).
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--ignore-installed", str(wheel)],
                   check=True, capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CPTKIT_CONF_DIR")}
    where = subprocess.run([str(py), "-c", "import cptkit.core.config as c; print(c.CONF_DIR)"], cwd=work, env=env,
                           check=True, capture_output=True, text=True).stdout.strip()
    assert Path(where).is_relative_to(site), where
    out = work / "deduped"
    res = subprocess.run([str(venv / "bin" / "cptkit"), "dedup", "--in", str(corpus_dir), "--out", str(out), "--quiet"],
                         cwd=work, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    kept = read_jsonl_dir(out)
    assert 0 < len(kept) <= len(read_jsonl_dir(corpus_dir))
    assert (out / "_SUCCESS").exists()
