"""The import graph keeps the layout honest: infrastructure and algorithms never import steps or
the CLI; a step imports another step only when it is that step's sibling command
(``label-topics-train`` → ``label-topics``), and never a private name of another module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "cptkit"


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(module, imported names, line)`` for every ``import``/``from`` in ``path`` (nested ones too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts)


def test_infrastructure_and_algorithms_import_no_step_and_no_cli():
    bad = []
    for p in files():
        me = module_name(p)
        if me.startswith("cptkit.steps") or me in ("cptkit.cli", "cptkit.__main__"):
            continue
        for mod, names, line in imports(p):
            targets = [mod] + [f"{mod}.{n}" for n in names]
            if any(t in ("cptkit.cli", "cptkit.steps") or t.startswith("cptkit.steps.") for t in targets):
                bad.append(f"{p.relative_to(PKG.parent)}:{line} imports {mod} {names}")
    assert not bad, "\n".join(bad)


def test_a_step_imports_only_its_own_family_and_no_private_names():
    bad = []
    for p in files():
        me = module_name(p)
        for mod, names, line in imports(p):
            where = f"{p.relative_to(PKG.parent)}:{line}"
            if mod.startswith("cptkit.") and mod != me:
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private:
                    bad.append(f"{where} imports private {private} from {mod}")
            if me.startswith("cptkit.steps.") and mod.startswith("cptkit.steps."):
                mine, other = me.rsplit(".", 1)[1], mod.rsplit(".", 1)[1]
                if not mine.startswith(other + "_"):
                    bad.append(f"{where}: step {mine} imports step {other} (not its sibling command)")
            if me.startswith("cptkit.steps.") and mod == "cptkit.cli":
                bad.append(f"{where}: a step imports the CLI")
    assert not bad, "\n".join(bad)


def test_the_rules_catch_a_violation(tmp_path):
    """The checker itself: a planted private cross-module import and an upward import are found."""
    f = tmp_path / "x.py"
    f.write_text("from cptkit.steps.retrieve import _params\nimport cptkit.cli\n")
    found = imports(f)
    assert ("cptkit.steps.retrieve", ["_params"], 1) in found and ("cptkit.cli", [], 2) in found


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Module -> the cptkit modules it imports (at any depth: a lazy import is still a dependency)."""
    mods = {module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for p in paths:
        me, deps = module_name(p), set()
        for mod, names, _ in imports(p):
            targets = [t for t in [mod, *(f"{mod}.{n}" for n in names)] if t in mods]
            deps |= {t for t in targets if t != me and not me.startswith(t + ".")}  # not its own package
        graph[me] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                found.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    """No two modules depend on each other, directly or around a loop (the CLI and the sweep once did)."""
    assert cycles(import_graph(files())) == []


def test_the_cycle_check_finds_a_planted_cycle(tmp_path):
    graph = import_graph(files())
    graph["cptkit.core.job"] = graph["cptkit.core.job"] | {"cptkit.cli"}  # cli -> steps -> ... -> job -> cli
    found = cycles(graph)
    assert found and any("cptkit.cli" in c and "cptkit.core.job" in c for c in found)


LONG_FUNCTION_EXEMPT: tuple[str, ...] = ()


def test_no_function_over_80_lines():
    long = []
    for p in files():
        rel = p.relative_to(PKG.parent).as_posix()
        if rel.startswith(LONG_FUNCTION_EXEMPT):
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{rel}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, "\n".join(long)


# The floors, lowest first (docs/architecture.md, "The floors"): a module imports only from its own
# floor or below, at module top and inside functions alike. Imports under ``if TYPE_CHECKING:``
# (annotations only, never run) are exempt. The package ``cptkit`` itself (``__version__``) is on no floor.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("text",),
    ("models",),
    ("index", "dedup", "labels", "llm", "synthetic", "mixtures", "demo"),
    ("eval",),
    ("training",),
    ("steps",),
    ("cli", "__main__"),
)


def floor_of(module: str) -> int | None:
    """The floor of ``cptkit.X...`` (None: the package ``cptkit`` itself, or not cptkit)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "cptkit":
        return None
    return next((i for i, names in enumerate(FLOORS) if parts[1] in names), None)


def runtime_imports(path: Path) -> list[tuple[str, list[str], int]]:
    """:func:`imports` without those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {n.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
                   for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Import | ast.ImportFrom)}
    return [imp for imp in imports(path) if imp[2] not in typing_only]


def climbing_imports(paths: list[Path], read=runtime_imports) -> list[str]:
    """``file:line: A (floor a) imports B (floor b)`` for every import of a higher floor (``read``:
    which imports count; :func:`imports` counts those for annotations too)."""
    bad = []
    for p in paths:
        me = module_name(p)
        mine = floor_of(me)
        for mod, names, line in read(p):
            targets = [mod] + ([f"{mod}.{n}" for n in names] if mod == "cptkit" else [])
            for t in targets:
                theirs = floor_of(t)
                if mine is not None and theirs is not None and theirs > mine:
                    bad.append(f"{p.relative_to(PKG.parent)}:{line}: {me} (floor {mine}) imports {t} (floor {theirs})")
    return bad


def test_every_package_is_on_a_floor():
    packages = sorted({module_name(p).split(".")[1] for p in files() if module_name(p).count(".") >= 1})
    assert [p for p in packages if floor_of(f"cptkit.{p}") is None] == []


def test_no_import_climbs_a_floor():
    """core never imports steps (step discovery is core's, by name), mixtures never imports training, ..."""
    assert climbing_imports(files()) == [], "\n".join(climbing_imports(files()))


def test_the_floor_check_finds_a_climbing_import(tmp_path):
    pkg = tmp_path / "cptkit" / "core"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cptkit.training import loop\n"
                              "def f():\n    from cptkit.steps import dedup\n    import cptkit.core.records\n")
    global PKG
    saved, PKG = PKG, tmp_path / "cptkit"
    try:
        found = climbing_imports([pkg / "x.py"])
    finally:
        PKG = saved
    assert found == ["cptkit/core/x.py:5: cptkit.core.x (floor 0) imports cptkit.steps (floor 6)"]


# Packages that own their config take no type from a higher floor, not even for annotations: the
# mixtures build from their own MixtureOptions (mixtures/options.py), never from training's TrainOptions.
OWN_TYPES = ("mixtures", "dedup")  # dedup: DedupConfig in dedup/config.py


def annotation_climbs(paths: list[Path]) -> list[str]:
    """:func:`climbing_imports` of the modules of :data:`OWN_TYPES`, ``if TYPE_CHECKING:`` ones included."""
    return climbing_imports([p for p in paths if module_name(p).split(".")[1:2] in [[o] for o in OWN_TYPES]],
                            read=imports)


def test_a_package_that_owns_its_config_imports_no_higher_type():
    """mixtures/ never names training, not even for an annotation (its config is MixtureOptions)."""
    assert annotation_climbs(files()) == [], "\n".join(annotation_climbs(files()))


def test_the_type_floor_check_finds_an_annotation_import(tmp_path):
    pkg = tmp_path / "cptkit" / "mixtures"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("from typing import TYPE_CHECKING\nfrom cptkit.core.errors import CptkitError\n"
                              "if TYPE_CHECKING:\n    from cptkit.training.config import TrainOptions\n")
    (pkg.parent / "core").mkdir()
    (pkg.parent / "core" / "y.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                              "    from cptkit.training import loop\n")  # not a config owner
    global PKG
    saved, PKG = PKG, tmp_path / "cptkit"
    try:
        found = annotation_climbs([pkg / "x.py", pkg.parent / "core" / "y.py"])
    finally:
        PKG = saved
    assert found == ["cptkit/mixtures/x.py:4: cptkit.mixtures.x (floor 3) imports cptkit.training.config (floor 5)"]


def test_docs_list_the_floors_of_the_test():
    """docs/architecture.md's "The floors" names the same floors, in the same order."""
    import re

    text = (PKG.parent / "docs" / "architecture.md").read_text()
    section = text.split("### The floors", 1)[1].split("###", 1)[0]
    listed = [tuple(re.findall(r"`([^`]+)`", line)) for line in section.splitlines() if re.match(r"\d+\. ", line)]
    assert listed == list(FLOORS)


DEFERRED = "# deferred: "  # the one form: "# deferred: torch" names the heavy thing the import keeps off --help


def unexplained_in_function_imports(path: Path) -> list[int]:
    """The lines of the imports of cptkit modules inside a function of ``path`` whose line carries no
    ``# deferred: <heavy thing>`` comment (the first line of a parenthesised import)."""
    text = path.read_text()
    lines = text.splitlines()
    found: set[int] = set()
    for fn in ast.walk(ast.parse(text, str(path))):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").split(".")[0] == "cptkit"
            else:
                ours = isinstance(node, ast.Import) and any(a.name.split(".")[0] == "cptkit" for a in node.names)
            comment = lines[node.lineno - 1].partition(DEFERRED)[2].strip() if ours else ""
            if ours and not comment:
                found.add(node.lineno)
    return sorted(found)


def test_an_import_inside_a_function_says_which_heavy_dependency_it_defers():
    """Imports of cptkit modules sit at module top, so the graph is visible; one stays inside a function
    only to keep a heavy dependency (torch, numpy, rich, ...) off ``cptkit --help`` and light modules,
    and says so: ``# deferred: torch``."""
    bad = []
    for p in files():
        rel = p.relative_to(PKG.parent).as_posix()
        bad += [f"{rel}:{line}: import inside a function without '{DEFERRED}<heavy thing>' (move it to the "
                f"module top)" for line in unexplained_in_function_imports(p)]
    assert not bad, "\n".join(bad)


def test_the_deferred_import_check_catches_an_unexplained_one(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import json\nfrom cptkit.core.errors import CptkitError\n\n\ndef f():\n"
                 "    import torch\n    from cptkit.models.lm import spec_file  # deferred: torch\n"
                 "    from cptkit.core.shards import (\n        resolve_inputs,\n    )\n"
                 "    def g():\n        import cptkit.eval.stats\n        from . import sibling  # deferred:\n")
    assert unexplained_in_function_imports(f) == [8, 12, 13]


ROOT = PKG.parent
# Where the commands a user or a Makefile runs are written down.
COMMAND_FILES = ("Makefile", "mk/*.mk", "README.md", "docs/*.md", "bench/gpu/*.sh")
# A module run as a program: ``python -m cptkit.X`` / ``$(BIN)/python -m cptkit`` / ``${PYTHON:-python3} -m
# cptkit``. Launchers that need a module (``torchrun -m cptkit.cli``, ``deepspeed --module``) are not programs.
MODULE_RUN = re.compile(r"(python[0-9.]*|\$\{PYTHON[^}]*\})\s+-m\s+cptkit\b")
# The one allowed: the line that writes a ``cptkit`` wrapper script (bench/gpu/lease.sh, no venv there).
WRAPPER = re.compile(r">\s*\S*/bin/cptkit\b")


def module_runs(path: Path) -> list[str]:
    """``file:line: text`` of each line of ``path`` that runs a cptkit module with ``python -m``."""
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n}: {line.strip()}"
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if MODULE_RUN.search(line) and not WRAPPER.search(line)]


def test_every_command_in_make_docs_and_scripts_is_a_cptkit_subcommand():
    """No ``python -m cptkit...`` in the Makefile, mk/, the README, docs/ or bench/gpu/: each command is
    ``cptkit NAME`` (``$(CPTKIT) NAME`` in make), listed in ``cptkit --help``."""
    paths = [p for pattern in COMMAND_FILES for p in sorted(ROOT.glob(pattern))]
    assert len(paths) > 20
    bad = [hit for p in paths for hit in module_runs(p)]
    assert not bad, "\n".join(bad)


def test_the_module_run_check_finds_a_planted_one(tmp_path):
    f = tmp_path / "x.mk"
    f.write_text("a:\n\t$(CPTKIT) probe --out $@\nb:\n\t$(BIN)/python -m cptkit.eval.probe --out $@\n"
                 "c:\n\t${PYTHON:-python3} -m cptkit.eval.reproduce x\nd:\n\tpython -m cptkit train\n"
                 "printf 'exec python3 -m cptkit \"$@\"' >/tmp/v/bin/cptkit\n"
                 "torchrun --nproc_per_node 8 -m cptkit.cli train\n")
    assert [h.split(":")[1] for h in module_runs(f)] == ["4", "6", "8"]


def test_every_cptkit_word_in_make_is_a_command():
    """``$(CPTKIT) NAME`` in the Makefile and mk/ names a command of ``cptkit --help``."""
    import click
    import typer

    from cptkit.cli import app

    group = typer.main.get_group(app)
    names = set(group.list_commands(click.Context(group)))
    used = {(p.name, m) for p in [ROOT / "Makefile", *sorted(ROOT.glob("mk/*.mk"))]
            for m in re.findall(r"\$\(CPTKIT\) ([a-z][a-z0-9-]*)", p.read_text(encoding="utf-8"))}
    assert {"probe", "margin", "b0", "cpt-report", "reproduce-report"} <= {m for _, m in used}
    assert not [u for u in used if u[1] not in names | PENDING]


PENDING: set[str] = set()  # commands a make file may name before they land (none now)


def test_only_the_cli_has_a_program_entry_point():
    """A module of its own ``if __name__ == "__main__"`` is a command outside ``cptkit --help``: only
    the CLI (cli.py, __main__.py) has one; a module's ``main(argv)`` is a ``cptkit`` subcommand."""
    mains = [p.relative_to(PKG.parent).as_posix() for p in files()
             if '\nif __name__ == "__main__":' in p.read_text(encoding="utf-8")]
    assert mains == ["cptkit/__main__.py", "cptkit/cli.py"]


def test_tests_read_outputs_through_one_module():
    """A test reads a step's shards, records and manifest with tests/outputs.py: no test spells the
    shard names in a glob of its own or defines its own copy of a reader."""
    import outputs

    tests = sorted(p for p in (ROOT / "tests").glob("*.py") if p.name != "outputs.py")
    mine = {n for n in vars(outputs) if callable(vars(outputs)[n]) and not n[0].isupper()} - {"Path", "Any"}
    bad = []
    for p in tests:
        text = p.read_text(encoding="utf-8")
        bad += [f"{p.name}:{n}: globs the shard names" for n, line in enumerate(text.splitlines(), 1)
                if re.search(r"""glob\(\s*f?["']part-""", line)]
        bad += [f"{p.name}:{node.lineno}: defines {node.name} (tests/outputs.py has it)"
                for node in ast.parse(text).body if isinstance(node, ast.FunctionDef) and node.name in mine]
    assert not bad, "\n".join(bad)


# -- one owner of every output (core/job.py, core/output.py) --------------------------------
OWNED_NAMES = ("SUCCESS", "STATE_DIR")  # core.output's names of what the output protocol owns
# Files outside core/ that may still touch an output's owned files by hand, each with why (keep short;
# none today: a folder handed whole to a library writer, `save_classifier(res, job.out)`, is not caught)
OWNER_ALLOWED: dict[str, str] = {}


def output_violations(path: Path) -> list[str]:
    """Where ``path`` writes into an output past :mod:`cptkit.core`: ``job.out / ...``, the literal
    ``_SUCCESS`` or state directory ``.cptkit`` (docstrings and messages aside), or core's names of them."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            v = n.value
            if v == "_SUCCESS" or v.endswith("/_SUCCESS") or v == ".cptkit" or v.startswith(".cptkit/"):
                bad.append(f"{n.lineno}: the literal {v!r}")
        elif (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and isinstance(n.left, ast.Attribute)
              and n.left.attr == "out" and isinstance(n.left.value, ast.Name) and n.left.value.id == "job"):
            bad.append(f"{n.lineno}: job.out / ...")
        elif isinstance(n, ast.ImportFrom) and n.module == "cptkit.core.output":
            bad += [f"{n.lineno}: imports {a.name}" for a in n.names if a.name in OWNED_NAMES]
    return sorted(bad, key=lambda b: int(b.split(":")[0]))


def test_every_output_file_is_written_through_core():
    bad = []
    for p in files():
        rel = p.relative_to(PKG.parent).as_posix()
        if rel.startswith("cptkit/core/") or rel in OWNER_ALLOWED:
            continue
        bad += [f"{rel}:{v} (use Job.file/write_bytes/write_json/state_path, Hooks, core.output.writing)"
                for v in output_violations(p)]
    assert not bad, "\n".join(bad)
    assert all((PKG.parent / rel).is_file() for rel in OWNER_ALLOWED), "an allowed file is gone: drop it"


def test_the_owner_check_finds_planted_violations(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('"""Writes ``_SUCCESS`` (a docstring may say so)."""\n'
                 "from cptkit.core.output import STATE_DIR\n"
                 "def run(job):\n"
                 '    (job.out / "_removed.jsonl").write_text("")\n'
                 '    (job.out.parent / "_SUCCESS").touch()\n'
                 '    return job.output.path / ".cptkit/tmp", f"no _SUCCESS in {job}"\n')
    assert output_violations(f) == ["2: imports STATE_DIR", "4: job.out / ...", "5: the literal '_SUCCESS'",
                                    "6: the literal '.cptkit/tmp'"]


# -- core/ names no step's keys (core/run.py: later_key; each owner declares its own) ---------------
def step_sections() -> set[str]:
    """The config sections of every step (``train``, ``mix``, ``dedup``, ...): its schema's dataclass
    fields beyond the frame's own (``io``, ``shard``, ...)."""
    import dataclasses

    from cptkit.core.config import JobConfig
    from cptkit.core.discovery import declaration, step_names

    frame = {f.name for f in dataclasses.fields(JobConfig)}
    found = set()
    for name in step_names():
        for f in dataclasses.fields(declaration(name).schema):
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(value) and f.name not in frame:
                found.add(f.name)
    return found


def step_key_violations(path: Path, sections: set[str]) -> list[str]:
    """``line: what`` for each step key ``path`` names outside its docstrings: a dotted string starting
    with a step's section (``"train.weights_from"``, ``f"mix.{k}"``) or a subscript by a section's name."""
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    alternatives = "|".join(sorted(map(re.escape, sections)))
    dotted = re.compile(rf"^({alternatives})\.")
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs and dotted.match(n.value):
            bad.append(f"{n.lineno}: the key {n.value!r}")
        elif (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and n.slice.value in sections):
            bad.append(f"{n.lineno}: [{n.slice.value!r}]")
    return sorted(bad, key=lambda b: int(b.split(":")[0]))


def test_core_names_no_step_key():
    """A step's keys are declared where its config lives (``later_key`` at import), never listed in core/."""
    sections = step_sections()
    assert {"train", "mix", "dedup", "quality", "edu", "topics", "retrieve"} <= sections
    bad = [f"{p.relative_to(PKG.parent)}:{v}" for p in sorted((PKG / "core").glob("*.py"))
           for v in step_key_violations(p, sections)]
    assert not bad, "\n".join(bad)


def test_the_step_key_check_finds_planted_ones(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('"""Mentions ``train.weights_from`` (a docstring may)."""\n'
                 'LATER = {"arm": None, "io.html_extractor": "x", "train.weights_from": None}\n'
                 'def g(cfg, k):\n    return cfg["dedup"], f"mix.{k}", cfg["io"], "model.safetensors"\n')
    assert sorted(step_key_violations(f, {"train", "mix", "dedup", "model"})) == [
        "2: the key 'train.weights_from'", "4: ['dedup']", "4: the key 'mix.'", "4: the key 'model.safetensors'"]
