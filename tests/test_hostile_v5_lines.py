"""Hostile input v5 (issue 53, cases 14-23), through the real CLI: what gave a traceback is one line
naming the input, exit 2, with nothing left behind (a checkpoint of another model shape, a bad GGUF to
copy a tokenizer from, a tokenizer that panics, a suite file that is no suite, an ``--out`` that
cannot be written); names from the run are escaped in the model card; a file named like a secret
keeps its line numbers in errors."""

from __future__ import annotations

import hashlib
import html
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tmpfs, write_jsonl
from mixdata import TWO_DOMAINS, make_tokenizer

CLI = [sys.executable, "-m", "cptkit.cli"]
ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.hidden=32", "model.layers=2", "model.heads=2", "train.micro_batch=4", "train.threads=1",
        "train.lr=3e-3", "train.warmup=1", "-q"]
# names a mix may give its domains and stages: HTML, a code fence, table and heading marks
SCRIPT = "<script>alert(1)</script>"
FENCE = "zh\n``` |x| #"
STAGE = "main\n```"
FOLDER = "run <img src=x onerror=alert(1)> ``` # [x](y) |&"


def run_cli(argv: list, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``cptkit ARGV`` in a child (a Rust panic's notice and backtrace, if printed, land in its stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUST_BACKTRACE": "1"}
    return subprocess.run([*CLI, *map(str, argv)], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=cwd)


def one_line(r: subprocess.CompletedProcess, *names: str) -> str:
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, err[-3000:]
    for n in names:
        assert n in err, (n, err)
    return err


def shown(name: str) -> str:
    """``name`` as the rendered card shows it: as text on one line (a newline as ``\\n``)."""
    return html.escape(name.replace("\n", "\\n"), quote=False)


def tree(d: Path) -> dict[str, str]:
    """Every file under ``d`` (hidden ones too) with the sha256 of its bytes: what a failed run must leave as it was."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("v5lines")


@pytest.fixture(scope="module")
def tok(corpus_records, base) -> Path:
    return make_tokenizer(corpus_records, base / "tok")


@pytest.fixture(scope="module")
def stream(corpus_dir, tok, base) -> Path:
    """A stream whose domain and stage names hold HTML, a code fence and Markdown marks."""
    from cptkit.core.config import compose_step
    from cptkit.steps.build_mix import run

    out = base / "stream"
    cfg = compose_step("build-mix", [f"io.inputs=['{corpus_dir}']", f"io.output='{out}'", f"tokenizer='{tok}'",
                                     "quiet=true", *TWO_DOMAINS, "mix.budget_tokens=20000", "mix.seq_len=64",
                                     "mix.eval_docs=4"])
    # names Hydra's override grammar cannot spell (a newline), set on the composed config
    cfg.mix.domains[0].name, cfg.mix.domains[1].name = SCRIPT, FENCE
    cfg.mix.stages = [{"name": STAGE, "weights": {SCRIPT: 1, FENCE: 1}}]
    run(cfg)
    return out


@pytest.fixture(scope="module")
def trained(stream, base) -> Path:
    """A finished tiny run (2 steps, evaluated) in a folder whose name holds HTML and Markdown marks."""
    out = base / FOLDER
    r = run_cli(["train", "--in", stream, "--out", out, *TINY, "train.max_steps=2", "train.eval_every=2"])
    assert r.returncode == 0, r.stderr[-3000:]
    return out


# --- 21, 22: the model card ---------------------------------------------------------------------
def test_card_shows_names_as_text(trained):
    """Domain, stage and folder names are text in the rendered card: no HTML element, no code block
    left open (every section heading still renders), the names shown as they are."""
    from markdown_it import MarkdownIt

    card = (trained / "model" / "README.md").read_text()
    body = card.split("---\n", 2)[2]  # after the front matter
    page = MarkdownIt("commonmark").enable("table").render(body)
    assert "<script>" not in page and "<img" not in page, page
    assert f"<h1>{html.escape(FOLDER, quote=False)}</h1>" in page, page.splitlines()[0]
    for section in ("Training data", "Training", "Evaluation", "cptkit config"):
        assert f"<h2>{section}</h2>" in page, section
    for name in (SCRIPT, FENCE):  # the data table and the evaluation table
        assert page.count(f"<td>{shown(name)}</td>") == 2, (name, page)
    assert f"Mixture stages: {shown(STAGE)}: " in page, page
    assert page.count("<pre>") == 1  # the config block alone


# --- 14: a checkpoint of another model shape ----------------------------------------------------
def test_resume_from_checkpoint_of_another_shape_is_one_line(stream, trained, tmp_path):
    other = tmp_path / "other"
    r = run_cli(["train", "--in", stream, "--out", other, *TINY, "model.hidden=48", "train.max_steps=2"])
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(other / "checkpoints", run / "checkpoints")  # step 2 of a hidden=48 model
    before = tree(run)
    r = run_cli(["train", "--in", stream, "--out", run, *TINY, "train.max_steps=4", "train.eval_every=2",
                 "train.resume=true"])
    one_line(r, str(run / "checkpoints"), "does not fit this model", "size mismatch")
    assert tree(run) == before


# --- 15, 20: export-gguf ------------------------------------------------------------------------
def test_export_gguf_tokenizer_from_a_bad_gguf_is_one_line(trained, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)  # the magic, then a table that cannot be
    out = tmp_path / "out" / "m.gguf"
    r = run_cli(["export-gguf", "--model", trained / "model", "-o", out, f"export.tokenizer_from={bad}"])
    one_line(r, str(bad), "not a readable GGUF")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_export_gguf_onto_a_directory_is_one_line_and_leaves_nothing(trained, tmp_path):
    target = tmp_path / "exists"
    (target / "keep").mkdir(parents=True)
    r = run_cli(["export-gguf", "--model", trained / "model", "-o", target, "export.dtype=f32"])
    one_line(r, str(target), "directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]  # no temporary file beside it
    assert [p.name for p in target.iterdir()] == ["keep"]


def test_atomic_path_leaves_nothing_when_the_writer_fails(tmp_path):
    from cptkit.core.shards import atomic_path

    with pytest.raises(RuntimeError), atomic_path(tmp_path / "f.bin") as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("the writer failed")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError), atomic_path(tmp_path / "d") as tmp:
        tmp.write_bytes(b"whole")  # complete, but the rename onto a directory fails
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


# --- 16: a tokenizer that panics --------------------------------------------------------------
def test_tokenizer_panic_in_build_mix_is_one_line(tok, tmp_path):
    """A ``Split`` pre-tokenizer of ``(a+)+b`` makes the Rust tokenizer panic (onig's retry limit) on
    40 ``a`` and a ``!``: one line naming the tokenizer and the record, nothing in the output."""
    from tokenizers import Tokenizer

    bad = tmp_path / "tok"
    shutil.copytree(tok, bad)
    spec = json.loads((bad / "tokenizer.json").read_text())
    split = {"type": "Split", "pattern": {"Regex": "(a+)+b"}, "behavior": "Isolated", "invert": False}
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, spec["pre_tokenizer"]]}
    (bad / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(BaseException, match="retry-limit"):  # the installed tokenizers does panic on it
        Tokenizer.from_file(str(bad / "tokenizer.json")).encode("a" * 40 + "!")
    data = write_jsonl(tmp_path / "in" / "part-0.jsonl",
                       [{"id": f"d{i}", "lang": "en", "text": f"plain text number {i}"} for i in range(20)]
                       + [{"id": "evil", "lang": "en", "text": "a" * 40 + "!"}])
    out = tmp_path / "stream"
    r = run_cli(["build-mix", "--in", data.parent, "--out", out, f"tokenizer={bad}", "-q",
                 "mix.domains=[{name:en,filter:{lang:en}}]", "mix.stages=[{name:main,weights:{en:1}}]",
                 "mix.fill=null", "mix.budget_tokens=200", "mix.seq_len=16", "mix.eval_docs=0"])
    one_line(r, str(bad), "'evil'", "panicked")
    assert not out.exists()


# --- 17: a suite file that is not a suite -----------------------------------------------------
def test_compare_with_a_suite_file_that_is_not_one_is_one_line(tmp_path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"suite": {"file": "/etc/passwd"}, "tasks": {}}))
    r = run_cli(["evaluate-compare", tmp_path / "a.json", tmp_path / "b.json"], timeout=60)
    one_line(r, "/etc/passwd", "not an evaluate suite")
    (tmp_path / "c.json").write_text("[1, 2]")  # JSON, but no results object
    one_line(run_cli(["evaluate-compare", tmp_path / "c.json"], timeout=60), str(tmp_path / "c.json"))


# --- 18, 19: an --out that cannot be written ----------------------------------------------------
@pytest.fixture
def data(tmp_path) -> Path:
    return write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "hello world"}])


@pytest.fixture
def read_only(tmp_path):
    """A read-only tmpfs at ``tmp_path/ro``; skipped, saying why, where it cannot be mounted."""
    with tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        yield ro


def test_out_on_a_read_only_file_system_is_one_line(data, read_only, trained):
    one_line(run_cli(["corrupt", "--in", data, "--out", read_only / "out", "-q"], timeout=60),
             f"--out {read_only / 'out'}", "read-only file system")
    one_line(run_cli(["corrupt", "--in", data, "--out", read_only, "-q"], timeout=60),  # OUT itself exists there
             f"--out {read_only}", "read-only file system")
    one_line(run_cli(["export-gguf", "--model", trained / "model", "-o", read_only / "m.gguf"]),
             str(read_only / "m.gguf"), "read-only file system")
    for f in ("a", "b"):
        (read_only.parent / f"{f}.json").write_text(json.dumps({"tasks": {}}))
    one_line(run_cli(["evaluate-compare", read_only.parent / "a.json", read_only.parent / "b.json", "--out",
                      read_only / "t.md"], timeout=60), str(read_only / "t.md"), "read-only file system")


def test_out_below_an_existing_file_is_one_line(data, tmp_path, trained):
    blocker = tmp_path / "afile"
    blocker.write_text("not a directory\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    for out, argv in ((blocker / "sub" / "out", ["corrupt", "--in", data, "-q"]),
                      (blocker / "m.gguf", ["export-gguf", "--model", trained / "model"]),
                      (blocker / "t.md", ["evaluate-compare", data])):
        one_line(run_cli([*argv, "--out", out]), f"--out {out}", f"{blocker} is a file, not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == before and blocker.read_text() == "not a directory\n"


# --- 23: a file named like a secret -----------------------------------------------------------
@pytest.mark.parametrize("name", ["token", "data.secret", "my-password"])
def test_a_file_named_like_a_secret_keeps_its_line_number(tmp_path, name):
    from cptkit.core.redact import redact_text

    bad = tmp_path / name
    bad.write_text('{"id": "a", "text": "fine"}\n{"id": "b",\n')
    err = one_line(run_cli(["corrupt", "--in", bad, "--out", tmp_path / "out", "-q"], timeout=60))
    assert f"{bad}:2: malformed JSON" in err and "<redacted>" not in err, err
    assert not (tmp_path / "out").exists()
    # values stay masked: a secret after such a name, or one made of digits and a colon in between
    assert redact_text("token: s3cr3t-value-42") == "token: <redacted>"
    assert redact_text(f"{bad}:7:5: bad line") == f"{bad}:7:5: bad line"
    assert redact_text("password=1234:abcd9") == "password=<redacted>"
