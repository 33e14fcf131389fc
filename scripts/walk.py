"""The files a cptkit command passes through, and the jumps between them (issue 55's walks).

    python scripts/walk.py --at core/shards.py:ShardWriter.write_line -- dedup --in DIR --out OUT
    python scripts/walk.py --at training/checkpoint.py:save -- train --in STREAM --out OUT ... train.max_steps=1

Runs the command in this process under a profile hook and counts, over the functions of ``cptkit/``
that run (module bodies, i.e. imports, left out):

* **files**: the distinct source files whose functions ran (calls an import makes, such as a
  registration, left out);
* **jumps**: the distinct cross-file calls, as caller function -> callee function (a reader follows
  each once, there and back; a call made a thousand times in a loop is one jump). A cptkit function
  called back through a library (a torch hook, a Typer callback) counts from the last cptkit frame.

``--at FILE:FUNCTION`` (repeatable): the *path*, what a reader follows from the command to that
point: the cptkit frames on the stack when FUNCTION is first called. The path's files are the union
over the ``--at`` points, its jumps the file changes along each stack (a change is counted once).
``--files`` lists the files with the functions that ran in each, in the order first entered.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import cptkit

ROOT = Path(cptkit.__file__).resolve().parent


def main(argv: list[str]) -> int:
    show = "--files" in argv
    head, args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else ([], argv)
    at = {head[i + 1] for i, a in enumerate(head) if a == "--at"}
    stacks: dict[str, list[tuple[str, str]]] = {}
    order: dict[str, set[str]] = {}
    edges: set[tuple[str, str, str, str]] = set()
    root = str(ROOT) + "/"

    def ours(code) -> str | None:
        f = code.co_filename
        return f[len(root):] if f.startswith(root) else None

    def name(code) -> str:
        return code.co_qualname.split(".<locals>")[0]  # a comprehension or lambda: its function

    def hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        here = ours(code)
        if here is None or code.co_name == "<module>" or "__module__" in frame.f_locals:
            return  # a library's, a module's body or a class body
        caller = frame.f_back
        while caller is not None and ours(caller.f_code) is None:
            caller = caller.f_back
        if caller is not None and caller.f_code.co_name == "<module>":
            return  # run by an import (a registration): not on the command's path
        order.setdefault(here, set()).add(name(code))
        point = f"{here}:{name(code)}"
        if point in at and point not in stacks:
            path, f = [], frame
            while f is not None:
                if ours(f.f_code) is not None and f.f_code.co_name != "<module>":
                    path.append((ours(f.f_code), name(f.f_code)))
                f = f.f_back
            stacks[point] = path[::-1]
        if caller is not None and ours(caller.f_code) != here:
            edges.add((ours(caller.f_code), name(caller.f_code), here, name(code)))

    from cptkit.cli import app

    sys.setprofile(hook)
    threading.setprofile(hook)
    try:
        app(args, standalone_mode=False)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    print(f"cptkit {args[0]}: {len(order)} files, {len(edges)} jumps (distinct cross-file calls) ran")
    for point in sorted(at - set(stacks)):
        print(f"  --at {point}: never called")
    if stacks:
        files = {f for path in stacks.values() for f, _ in path}
        jumps = {(a, b) for path in stacks.values() for a, b in zip(path, path[1:], strict=False) if a[0] != b[0]}
        print(f"the path to {', '.join(sorted(stacks))}: {len(files)} files, {len(jumps)} jumps")
        for point, path in stacks.items():
            print(f"  {point}: " + " -> ".join(f"{f}:{fn}" for f, fn in path))
    if show:
        for f, fns in order.items():
            print(f"  {f}: {', '.join(sorted(fns))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
