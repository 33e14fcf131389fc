"""Finding the steps and running one: the step registry, read from the step modules' files.

The step ``name`` lives in ``cptkit/steps/<name with - as _>.py``. The steps are found from the
file names, and a step's one-line help is its module docstring's first paragraph, so the CLI lists
every step without importing any (``cptkit --help`` stays fast); a step's module is imported only
when it runs or shows its own ``--help``, and importing it declares the step in the registry
:data:`cptkit.core.step.STEPS` (:func:`cptkit.core.step.step`). :func:`execute` is the one code path that runs a step on a
composed config (single runs from the CLI, sweep members, job arrays, Ray members).

Core names no step and imports none: the step package is found by name (:data:`STEP_PACKAGE`),
and a plugin directory appended to its ``__path__`` adds steps.
"""

from __future__ import annotations

import ast
import errno
import importlib
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from cptkit.core.errors import PLACE_ERRNOS, CptkitError, is_panic

if TYPE_CHECKING:
    from cptkit.core.step import Step

STEP_PACKAGE = "cptkit.steps"  # where step modules live (one module per step)


def step_files() -> dict[str, Path]:
    """Every step and its module file (``build_mix.py`` -> ``build-mix``), sorted by name.
    Searches the step package's ``__path__``, so a plugin directory appended to it adds steps."""
    found: dict[str, Path] = {}
    for d in importlib.import_module(STEP_PACKAGE).__path__:
        for p in sorted(Path(d).glob("*.py")):
            if not p.stem.startswith("_"):
                found.setdefault(p.stem.replace("_", "-"), p)
    return dict(sorted(found.items()))


def step_names() -> list[str]:
    return list(step_files())


@cache
def step_order(step: str) -> float | None:
    """The ``order=`` of the step's ``@step(...)`` declaration, read from the source (nothing
    imported); None when it gives none."""
    tree = ast.parse(step_files()[step].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "step":
            for kw in node.keywords:
                if kw.arg == "order" and isinstance(kw.value, ast.Constant):
                    return float(kw.value.value)
    return None


def ordered(names: list[str], orders: dict[str, float] | None = None) -> list[str]:
    """``names`` in pipeline order: by each step's declared ``order`` (or ``orders[name]`` for a
    command that is not a step), then the rest by name."""
    orders = orders or {}
    steps = set(step_names())

    def key(n: str) -> tuple[int, float, str]:
        o = orders.get(n, step_order(n) if n in steps else None)
        return (0, o, n) if o is not None else (1, 0.0, n)

    return sorted(names, key=key)


@cache
def step_help(step: str) -> str:
    """The step's help: its module docstring's first paragraph without the ``name:`` prefix,
    read from the source (nothing imported)."""
    doc = ast.get_docstring(ast.parse(step_files()[step].read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    head, sep, rest = first.partition(": ")
    text = rest if sep and head.strip("`").removeprefix("cptkit ") == step else first
    return text[:1].upper() + text[1:]


def step_module(step: str) -> ModuleType:
    """Import (and so declare and register the schema of) the module of ``step``."""
    return importlib.import_module(f"{STEP_PACKAGE}.{step.replace('-', '_')}")


def declaration(step: str) -> Step:
    """The :class:`cptkit.core.step.Step` that the module of ``step`` declares."""
    from cptkit.core.step import STEPS  # deferred: hydra and omegaconf

    step_module(step)
    decl = STEPS.find(step)
    if decl is None:
        raise CptkitError(f"cptkit/steps/{step.replace('-', '_')}.py declares no step {step!r} (@step({step!r}, ...))")
    return decl


RESOURCE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                   errno.EFBIG: "file size limit exceeded"}


def resource_error(step: str, exc: BaseException, output: Any = None) -> CptkitError | None:
    """The one-line :class:`CptkitError` for a resource that ran out while ``step`` ran (disk full,
    quota, file size limit, memory), or None when ``exc`` is not one. ``output``: the step's
    output directory, named when the error does not carry a file name (a failed ``write``)."""
    if isinstance(exc, MemoryError):
        return CptkitError(f"cptkit {step}: out of memory (lower the batch size or the record size limit)")
    if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
        target = exc.filename or output
        where = f" writing {target}" if target else ""
        return CptkitError(f"cptkit {step}: {RESOURCE_ERRNOS[exc.errno]}{where}")
    return None


def place_error(step: str, exc: BaseException) -> CptkitError | None:
    """The one-line :class:`CptkitError` for a file or directory that cannot be used as ``step`` asked
    (a read-only file system, a file where a directory is needed or the reverse, no permission),
    naming it; None when ``exc`` is not one or names no file."""
    if isinstance(exc, OSError) and exc.errno in PLACE_ERRNOS and exc.filename is not None:
        return CptkitError(f"cptkit {step}: {exc.filename}: {PLACE_ERRNOS[exc.errno]}")
    return None


def panic_error(step: str, exc: BaseException) -> CptkitError | None:
    """The one-line :class:`CptkitError` for a panic of a Rust library (pyo3's ``PanicException``, a
    ``BaseException``) that no step caught closer to its input; None for anything else."""
    if not is_panic(exc):
        return None
    why = str(exc).splitlines()[0][:200] if str(exc) else "no message"
    return CptkitError(f"cptkit {step}: a Rust library (tokenizers, ...) panicked on its input: {why}")


def _output(cfg: Any) -> Any:
    """The composed config's ``io.output`` (None when it has none)."""
    try:
        return cfg.io.output
    except Exception:  # noqa: BLE001 - a config without io (or unresolvable): name no place
        return None


def execute(step: str, cfg: Any) -> Any:
    """Run ``step`` on the composed ``cfg`` (its declaration fills ``--out`` and converts it once).
    A resource that runs out (ENOSPC, EDQUOT, EFBIG, MemoryError), a place that cannot be written or
    read (:data:`PLACE_ERRNOS`) and a Rust library's panic become one line naming it."""
    try:
        return declaration(step)(cfg)
    except (OSError, MemoryError) as e:
        err = resource_error(step, e, _output(cfg)) or place_error(step, e)
        if err is None:
            raise
        raise err from None
    except BaseException as e:
        err = panic_error(step, e)
        if err is None:
            raise
        raise err from None
