"""The commands that are not steps but run a module's ``main(argv)`` (the probe, the margin, the
reports, B0, ...): listed by ``cptkit --help`` without importing them, each ``--help`` its module's
own, and every word after the name handed on as it was typed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from cptkit import cli
from cptkit.cli import MODULE_COMMANDS, app


def test_cptkit_help_lists_every_module_command_without_importing_it():
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom cptkit.cli import MODULE_COMMANDS, app\n"
            "r = CliRunner().invoke(app, ['--help'])\nprint(r.output)\n"
            "print('IMPORTED', [m for m, _ in MODULE_COMMANDS.values() if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    listing, imported = out.rsplit("IMPORTED", 1)
    assert imported.strip() == "[]"
    for name, (_, help_) in MODULE_COMMANDS.items():
        assert f"  {name} " in listing and help_.split()[0] in listing
    # pipeline order: B0 after train, the probe after B0, the reports last
    assert listing.index("  train ") < listing.index("  b0 ") < listing.index("  probe ") \
        < listing.index("  evaluate-compare ") < listing.index("  cpt-report ") < listing.index("  reproduce-report ")


@pytest.mark.parametrize("name", sorted(MODULE_COMMANDS))
def test_each_module_command_help_through_the_real_cli(name):
    r = subprocess.run([sys.executable, "-m", "cptkit", name, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: cptkit {name}"), r.stdout[:300]


def test_words_after_the_name_reach_main_verbatim_and_its_status_is_the_exit_code(tmp_path, monkeypatch):
    """Options the CLI does not know, ``--help`` and ``--`` are the module's: nothing is parsed on the way."""
    (tmp_path / "echo_argv.py").write_text(
        "import json\n\ndef main(argv):\n    print(json.dumps(argv))\n    return 3 if '--fail' in argv else 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.MODULE_COMMANDS, "echo-argv", ("echo_argv", "Echo."))
    words = ["--out", "x", "--help", "--", "train.max_steps=2", "-m", "--unknown=1"]
    r = CliRunner().invoke(app, ["echo-argv", *words])
    assert r.exit_code == 0 and json.loads(r.output) == words
    r = CliRunner().invoke(app, ["echo-argv", "--fail"])
    assert r.exit_code == 3


def test_a_bad_argument_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "cptkit", "label-topics-report", str(tmp_path / "none")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and str(tmp_path / "none") in r.stderr
