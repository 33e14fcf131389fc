"""Hostile input v4 (§4, §5): what a sandboxed program can leave in the host's memory, through the
real OS sandbox of cptkit.eval.code_exec: its stderr (kept to the first and last KEEP bytes), System
V shared memory (freed with the program's IPC namespace) and the hostname (its own UTS namespace)."""

from __future__ import annotations

import ctypes
import json
import os
import random
import socket
import subprocess
import sys

import pytest

from cptkit.eval import code_exec as X

pytestmark = pytest.mark.skipif(X.sandbox_problem() is not None,
                                reason=f"OS sandbox unavailable here: {X.sandbox_problem()}")

_LIBC = ctypes.CDLL(None, use_errno=True)
_SHMGET = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmget.restype = ctypes.c_int\n"


def _host_shm_keys() -> set[int]:
    """Keys of the System V shared memory segments of the host's IPC namespace."""
    rows = open("/proc/sysvipc/shm").read().splitlines()[1:]
    return {int(r.split()[0]) for r in rows}


def _remove_host_shm(key: int) -> None:
    """Free a segment the old sandbox left behind on the host (so a failing run cleans up after itself)."""
    shmid = _LIBC.shmget(ctypes.c_int(key), ctypes.c_size_t(0), 0)
    if shmid >= 0:
        _LIBC.shmctl(shmid, 0, None)  # IPC_RMID


def test_a_flood_of_stderr_keeps_the_host_bounded():
    """200 MB on stderr under memory_mb=256 raised the host's peak memory by ~600 MiB (communicate()
    kept it all, then decoded it); now the first and last KEEP bytes are kept, the rest drained."""
    code = "import os\nb = b'E' * (1 << 20)\nos.write(2, b'FIRST\\n')\nfor _ in range(200):\n    os.write(2, b)\n" \
           "os.write(2, b'\\nLAST')\n"
    # in a child process, so that its peak RSS measures this call alone
    prog = ("import json, resource\nfrom cptkit.eval.code_exec import run_program\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            f"r = run_program({code!r}, memory_mb=256, timeout=60)\n"
            "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
            "print(json.dumps({'status': r.status, 'grew_kib': grew, 'kept': getattr(r, 'stderr', r.stderr_tail)}))\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["grew_kib"] < 64 << 10, f"host peak RSS grew by {got['grew_kib'] >> 10} MiB"
    kept = got["kept"]
    assert got["status"] == "passed" and kept.startswith("FIRST\n") and kept.endswith("\nLAST")
    assert len(kept.encode()) <= 2 * X.KEEP + 100
    dropped = 200 * (1 << 20) + len("FIRST\n\nLAST") - 2 * X.KEEP
    assert f"\n[cptkit: {dropped:,} bytes of output dropped here]\n" in kept


def test_stderr_kept_whole_when_small_and_timeout_still_returns():
    r = X.run_program("import sys\nsys.stderr.write('x' * 1000 + 'END')\n")
    assert r.stderr == "x" * 1000 + "END" and r.stderr_tail == r.stderr[-500:] and "dropped" not in r.stderr
    # a program that keeps writing and never ends: the call still returns at the timeout
    r = X.run_program("import os\nwhile True:\n    os.write(2, b'y' * 65536)\n", timeout=2)
    assert r.status == "timeout" and "bytes of output dropped here" in r.stderr
    assert len(r.stderr.encode()) <= 2 * X.KEEP + 100


def test_system_v_shared_memory_dies_with_the_program():
    """64 MB of shmget segments (no IPC_RMID) stayed in the host's memory after the sandbox exited."""
    key = random.randrange(1 << 20, 1 << 30)
    code = _SHMGET + (f"shmid = libc.shmget({key}, 64 << 20, 0o1600)\n"  # IPC_CREAT | 0600
                      "assert shmid >= 0, ctypes.get_errno()\n"
                      "addr = ctypes.CDLL(None).shmat\naddr.restype = ctypes.c_void_p\n"
                      "p = addr(shmid, None, 0)\nctypes.memset(p, 1, 64 << 20)\n")
    try:
        r = X.run_program(code, memory_mb=512)
        assert r.status == "passed", r.stderr_tail
        assert key not in _host_shm_keys()
    finally:
        _remove_host_shm(key)


def test_system_v_shared_memory_capped_at_memory_mb():
    """Segments are not in RLIMIT_AS once detached; the IPC namespace's shmall caps them at memory_mb."""
    key = random.randrange(1 << 20, 1 << 30)
    code = _SHMGET + ("import sys\nmade = 0\n"
                      "for i in range(8):\n"
                      f"    if libc.shmget({key} + i, 64 << 20, 0o1600) < 0:\n"
                      "        break\n"
                      "    made += 1\n"
                      "sys.exit(10 + made)\n")
    try:
        r = X.run_program(code, memory_mb=256)
        assert r.returncode == 10 + 4, r.stderr_tail  # 4 x 64 MiB = 256 MiB, the fifth refused (ENOSPC)
    finally:
        for i in range(8):
            _remove_host_shm(key + i)


def test_hostname_is_the_sandbox_own():
    host = socket.gethostname()
    host_uts, host_ipc = os.readlink("/proc/self/ns/uts"), os.readlink("/proc/self/ns/ipc")
    code = ("import os, socket, sys\n"
            "sys.stderr.write(' '.join([socket.gethostname(), os.readlink('/proc/self/ns/uts'),"
            " os.readlink('/proc/self/ns/ipc')]) + '\\n')\n"
            "socket.sethostname('pwned')\n")
    r = X.run_program(code)  # sethostname: EPERM as the unprivileged uid, or its own UTS namespace's
    name, uts, ipc = r.stderr_tail.splitlines()[0].split()
    assert name == "sandbox" and uts != host_uts and ipc != host_ipc
    assert socket.gethostname() == host


def test_guarded_fallback_keeps_stderr_bounded_too():
    code = "import sys\nsys.stderr.write('z' * (1 << 20))\n"
    r = X.run_guarded(code, timeout=20)
    assert r.status == "passed" and len(r.stderr.encode()) <= 2 * X.KEEP + 100 and "bytes of output dropped" in r.stderr
