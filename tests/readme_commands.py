"""The README's per-step examples as commands: parse them, run them as written, time them.

    python tests/readme_commands.py [--root DIR] [--only STEP ...]

runs every command of the README's "One example per step" block from DIR (default: the repository
root, where ``make demo`` left ``data/``) and prints a Markdown table of exit codes and wall times.
``tests/test_readme.py`` runs the same commands on a toy ``data/`` with a few added overrides.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## One example per step"
# A command whose comment says so is documented to stop with a one-line error (offline here).
EXPECTED_FAILURE = "missing data: one line"


@dataclass
class Command:
    argv: list[str]
    text: str
    background: bool = False
    expect_failure: bool = False
    extra: list[str] = field(default_factory=list)

    @property
    def step(self) -> str:
        return self.argv[1] if self.argv and self.argv[0] == "cptkit" else self.argv[0]


def readme_commands(readme: Path = README) -> list[Command]:
    """The shell commands of the first ``bash`` block under :data:`SECTION`, one per logical line."""
    text = readme.read_text(encoding="utf-8")
    start = text.index(SECTION)
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    if block is None:
        raise ValueError(f"{readme}: no bash block under {SECTION!r}")
    commands, pending = [], ""
    for raw in block.group(1).splitlines():
        line = pending + raw
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        background = argv[-1] == "&"
        if background:
            argv = argv[:-1]
        commands.append(Command(argv, " ".join(line.split()), background, EXPECTED_FAILURE in line))
    return commands


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"background command exited with {proc.returncode} before port {port} opened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"port {port} did not open in {timeout:.0f} s")


@dataclass
class Result:
    command: Command
    returncode: int
    seconds: float
    stderr: str


def run_commands(commands: list[Command], root: Path, cptkit: list[str] | None = None,
                 env: dict[str, str] | None = None, timeout: float = 3600) -> list[Result]:
    """Run ``commands`` in order from ``root``; background ones are stopped at the end."""
    exe = cptkit or [shutil.which("cptkit", path=str(Path(sys.executable).parent)) or "cptkit"]
    background: list[subprocess.Popen] = []
    results = []
    try:
        for c in commands:
            argv = [*exe, *c.argv[1:]] if c.argv[0] == "cptkit" else list(c.argv)
            argv += c.extra
            t0 = time.perf_counter()
            if c.background:
                proc = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
                background.append(proc)
                port = next((int(a.split("=", 1)[1]) for a in c.argv if a.startswith("serve.port=")), None)
                if port is not None:
                    _wait_for_port(port, proc, timeout=300)
                results.append(Result(c, 0, time.perf_counter() - t0, ""))
                continue
            r = subprocess.run(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, timeout=timeout)
            results.append(Result(c, r.returncode, time.perf_counter() - t0, r.stderr))
    finally:
        for proc in background:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return results


def ok(r: Result) -> bool:
    """Exit 0, or, for a command documented to fail offline, a non-zero exit with a one-line error."""
    if r.command.expect_failure:
        lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith(("INFO", "WARNING"))]
        return r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr
    return r.returncode == 0


def table(results: list[Result]) -> str:
    rows = ["| command | exit | wall time |", "|---|---|---|"]
    for r in results:
        mark = "" if ok(r) else " **FAILED**"
        note = " (expected: one-line error)" if r.command.expect_failure and ok(r) else ""
        rows.append(f"| `{r.command.text}` | {r.returncode}{note}{mark} | {r.seconds:.1f} s |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=README.parent)
    ap.add_argument("--only", nargs="*", help="run only these steps (e.g. dedup train)")
    args = ap.parse_args()
    commands = [c for c in readme_commands() if not args.only or c.step in args.only]
    results = run_commands(commands, args.root, env=dict(os.environ))
    print(table(results))
    for r in results:
        if not ok(r):
            print(f"\n$ {r.command.text}\n{r.stderr[-2000:]}", file=sys.stderr)
    return 0 if all(map(ok, results)) else 1


if __name__ == "__main__":
    sys.exit(main())
