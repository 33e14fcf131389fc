"""Hostile programs through the real OS sandbox of cptkit.eval.code_exec: every escape attempt is blocked."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cptkit.core.errors import CptkitError
from cptkit.eval import code_exec as X
from cptkit.eval import runner, task_data, tasks
from tests._eval_model import FIXTURES, TASK_DIR

pytestmark = pytest.mark.skipif(X.sandbox_problem() is not None,
                                reason=f"OS sandbox unavailable here: {X.sandbox_problem()}")


def run(code: str, **kw) -> X.ExecResult:
    r = X.run_program(code, **kw)
    assert r.network == "netns"  # it really went through the OS sandbox
    return r


@pytest.fixture
def outside(tmp_path_factory) -> Path:
    """A host directory outside the sandbox's work dir, holding a secret file."""
    d = tmp_path_factory.mktemp("outside")
    (d / "secret.txt").write_text("TOPSECRET")
    return d


def test_honest_program_passes_and_may_use_its_work_dir():
    r = run("import json, math, collections, tempfile\n"
            "open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n"
            "with tempfile.TemporaryFile() as f:\n    f.write(b'x')\n"
            "assert math.isqrt(17) == 4\n")
    assert r.status == "passed", r.stderr_tail


def test_posix_system_and_posix_spawn_blocked(outside):
    marker = outside / "system.txt"
    r = run(f"import posix\nrc = posix.system('echo pwned > {marker}')\nassert rc == 0\n")
    assert r.status == "failed" and not marker.exists()
    marker2 = outside / "spawn.txt"
    r = run(f"import posix\npid = posix.posix_spawn('/bin/sh', ['sh', '-c', 'echo x > {marker2}'], {{}})\n"
            "_, st = posix.waitpid(pid, 0)\nassert st == 0\n")
    assert r.status == "failed" and not marker2.exists()


def test_filei_o_outside_work_dir_write_and_read(outside):
    target = outside / "written.txt"
    r = run(f"import io\nf = io.FileIO({str(target)!r}, 'w')\nf.write(b'pwned')\nf.close()\n")
    assert r.status == "failed" and not target.exists()
    r = run(f"import io, sys\nsys.stderr.write('GOT ' + io.FileIO({str(outside / 'secret.txt')!r}).read().decode())\n")
    assert r.status == "failed" and "GOT TOPSECRET" not in r.stderr_tail


def test_reading_etc_passwd_and_home_blocked():
    r = run("import sys\nsys.stderr.write('GOT ' + open('/etc/passwd').read())\n")
    assert r.status == "failed" and "GOT root:" not in r.stderr_tail
    home = Path.home()
    files = sorted(f for f in home.iterdir() if f.is_file() and os.access(f, os.R_OK))
    if not files:
        pytest.skip(f"no readable file in {home} to try")
    r = run(f"import sys\nsys.stderr.write('GOT %d' % len(open({str(files[0])!r}, 'rb').read()))\n")
    assert r.status == "failed" and "GOT " not in r.stderr_tail.replace("'GOT %d'", "")
    # listing HOME shows at most the path down to the Python install that is bound in, never the rest
    bound = {Path(p).relative_to(home).parts[0] for p in X._binds() if Path(p).is_relative_to(home)}
    r = run(f"import os, sys\nsys.stderr.write('NAMES ' + ' '.join(os.listdir({str(home)!r})))\n")
    seen = set(r.stderr_tail.split("NAMES ", 1)[1].split()) if "NAMES " in r.stderr_tail else set()
    assert seen <= bound and set(os.listdir(home)) - bound


def test_unix_socket_connect_blocked(outside):
    path = str(outside / "s.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(0.5)
    try:
        r = run(f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})\ns.sendall(b'hi')\n")
        assert r.status == "failed"
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()


def test_tcp_connect_to_localhost_blocked():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    try:
        r = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n")
        assert r.status == "failed"
        with pytest.raises(TimeoutError):
            srv.accept()
    finally:
        srv.close()


def test_setsid_child_dies_at_timeout(tmp_path):
    # A double-forked, setsid grandchild execs sleep under a unique argv[0]; the host's ps must not find it.
    tag = f"cptkit-orphan-{uuid.uuid4().hex}"
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            f"        os.execv('/bin/sleep', ['{tag}', '60'])\n"
            "    os._exit(0)\n"
            "time.sleep(60)\n")
    t0 = time.monotonic()
    r = run(code, timeout=2)
    assert r.status == "timeout" and time.monotonic() - t0 < 30  # not when the sleeps end (60 s)

    def alive() -> list[str]:
        out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        return [ln for ln in out.splitlines() if tag in ln]
    deadline = time.monotonic() + 5
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive()


def test_timeout_returns_while_the_program_sleeps():
    # The launcher's change of uid cleared --kill-child's parent-death signal: killing unshare left the
    # sleeping program alive and the host waiting for it (a program sleeping forever hung the evaluation).
    t0 = time.monotonic()
    r = run("import time\ntime.sleep(600)\n", timeout=2)
    assert r.status == "timeout" and time.monotonic() - t0 < 30


def test_orphan_cannot_leave_a_marker_after_timeout(outside):
    marker = outside / "late.txt"
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    time.sleep(3)\n"
            f"    open({str(marker)!r}, 'w').write('alive')\n"
            "    os._exit(0)\n"
            "time.sleep(60)\n")
    assert run(code, timeout=1).status == "timeout"
    time.sleep(4)
    assert not marker.exists()


def test_fork_bomb_bounded():
    code = ("import os\nn = 0\n"
            "try:\n"
            "    while True:\n"
            "        if os.fork() == 0:\n"
            "            import time; time.sleep(30); os._exit(0)\n"
            "        n += 1\n"
            "except OSError:\n"
            "    pass\n"
            "assert n < 100, n\n"
            "raise SystemExit(3)\n")
    r = run(code, timeout=10)
    assert r.returncode == 3, r.stderr_tail  # fork failed (RLIMIT_NPROC) before 100 children


def test_memory_bomb_and_huge_file_bounded():
    r = run("x = bytearray(4 << 30)\n", memory_mb=512)
    assert r.status == "failed" and "MemoryError" in r.stderr_tail
    r = run("open('big.bin', 'wb').write(b'x' * (8 << 20))\n", max_file_mb=1)
    assert r.status == "failed" and "File too large" in r.stderr_tail


def test_humaneval_mbpp_pass_at_k_unchanged():
    he = tasks.load_task("humaneval", TASK_DIR, FIXTURES)
    docs = task_data.load_docs(he, "test")
    ce = dict(he.spec["code_eval"]) | {"timeout": 5, "k": [1, 2]}
    ok0, ok1 = docs[0]["canonical_solution"], docs[1]["canonical_solution"]
    items = runner.score_code(he, docs, [[ok0, "    return a - b\n"], [ok1, ok1]], ce)
    assert [it["correct"] for it in items] == [1, 2] and items[0]["pass@1"] == pytest.approx(0.5)
    mb = tasks.load_task("mbpp", TASK_DIR, FIXTURES)
    mdocs = task_data.load_docs(mb, "test")
    got = runner.score_code(mb, mdocs, [[d["code"]] for d in mdocs], dict(mb.spec["code_eval"]))
    assert [it["pass@1"] for it in got] == [1.0, 1.0] and {it["network"] for it in got} == {"netns"}


def test_refuses_when_sandbox_unavailable(tmp_path):
    """CPTKIT_UNSHARE names the unshare binary the real probe runs; a binary that cannot create the
    namespaces makes the probe fail for real."""
    fake = tmp_path / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "CPTKIT_UNSHARE": str(fake), "PYTHONPATH": os.getcwd()}
    prog = ("from cptkit.eval.code_exec import run_program\n"
            "import sys\nr = run_program('pass', allow_unsandboxed=len(sys.argv) > 1)\nprint(r.status, r.network)\n")
    p = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True)
    assert p.returncode != 0 and "code sandbox unavailable (unshare: unshare failed: Operation not permitted)" \
        in p.stderr and "eval.code.allow_unsandboxed=true" in p.stderr
    p = subprocess.run([sys.executable, "-c", prog, "allow"], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.split()[0] == "passed", p.stderr
    with pytest.raises(CptkitError):
        os.environ["CPTKIT_UNSHARE"] = str(fake)
        try:
            X.require_sandbox(False)
        finally:
            del os.environ["CPTKIT_UNSHARE"]
