"""Outputs you can trust under faults (issue 10 part 2), through the CLI: changed inputs, two
writers, planted secrets, bad input, Ctrl-C. Each test asserts the exit code, the one-line
message and what is on disk afterwards."""

from __future__ import annotations

import gzip
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import read_jsonl_dir, run_main, write_jsonl

CLI = [sys.executable, "-c", "from cptkit.cli import main; main()"]


def cli(argv: list, capsys) -> tuple[int, str, str]:
    """``cptkit ARGV`` in-process: (exit code, stdout, stderr)."""
    code = run_main(argv)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def one_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def tree(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (relative path -> bytes), manifests and run state excluded."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and ".cptkit" not in p.parts and p.name != "_manifest.json"}


@pytest.fixture()
def shards(corpus_records, tmp_path) -> Path:
    """Three real-text shards, one exact duplicate across shards."""
    recs = [{k: r[k] for k in ("id", "text", "lang")} for r in corpus_records[:240]]
    recs.append({"id": "copy-of-0", "text": recs[0]["text"], "lang": recs[0]["lang"]})
    d = tmp_path / "in"
    for k in range(3):
        write_jsonl(d / f"s{k}.jsonl", recs[k::3])
    return d


def dedup(inp, out, *extra) -> list[str]:
    return ["dedup", "--in", inp, "--out", out, "-q", *extra]


PER_FILE = "shard.task_bytes=0"  # a task per input file (small files share one by default): for slices


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


# -- 1. resume keyed to inputs ---------------------------------------------------------------------
def test_finished_output_with_other_inputs_refuses(shards, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(dedup(shards, out), capsys)[0] == 0
    before = tree(out)
    code, _, err = cli(dedup(shards / "s0.jsonl", out), capsys)  # a different --in
    assert code == 2
    assert "holds a finished output of another input set" in one_error(err) and "s1.jsonl is no longer an input" in err
    assert tree(out) == before and (out / "_SUCCESS").exists()


def test_input_edited_after_finish_refuses_then_overwrite_redoes(shards, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(dedup(shards, out), capsys)[0] == 0
    before = tree(out)
    s1 = shards / "s1.jsonl"
    old_size = s1.stat().st_size
    s1.write_text("".join(s1.read_text().splitlines(keepends=True)[:10]))
    code, _, err = cli(dedup(shards, out), capsys)
    assert code == 2
    line = one_error(err)
    assert f"s1.jsonl changed (size {old_size} -> {s1.stat().st_size} bytes)" in line and "io.overwrite=true" in line
    assert tree(out) == before

    code, _, err = cli(dedup(shards, out, "io.overwrite=true"), capsys)
    assert code == 0, err
    m = json.loads((out / "_manifest.json").read_text())
    assert m["counts"]["records_in"] == 81 + 10 + 80  # the edited shard holds 10 records now
    fresh = tmp_path / "fresh"
    assert cli(dedup(shards, fresh), capsys)[0] == 0
    assert tree(out) == tree(fresh)


def test_unfinished_output_edited_input_is_redone(shards, tmp_path, capsys):
    """Slice 0 of 2 leaves an unfinished output; an input edited before the rest runs is redone."""
    out = tmp_path / "out"
    code, _, err = cli(dedup(shards, out, "shard.count=2", "shard.index=0", PER_FILE), capsys)
    assert code == 0, err
    assert not (out / "_SUCCESS").exists() and (out / ".cptkit" / "sig-00000.npy").exists()
    s0 = shards / "s0.jsonl"
    s0.write_text("".join(s0.read_text().splitlines(keepends=True)[:10]))
    code, _, err = cli(["dedup", "--in", shards, "--out", out, "shard.count=1", PER_FILE], capsys)
    assert code == 0, err
    err = " ".join(err.split())
    assert "s0.jsonl changed" in err and "redoing the whole unfinished output" in err
    assert (out / ".cptkit" / "config_hash").exists() and (out / ".cptkit" / "inputs.json").exists()
    fresh = tmp_path / "fresh"
    assert cli(dedup(shards, fresh, PER_FILE), capsys)[0] == 0
    assert tree(out) == tree(fresh)
    assert json.loads((out / "_manifest.json").read_text())["counts"]["records_in"] == 10 + 80 + 80


def test_unfinished_output_other_input_set_refuses(shards, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(dedup(shards, out, "shard.count=2", "shard.index=0", PER_FILE), capsys)[0] == 0
    other = tmp_path / "other"
    write_jsonl(other / "x.jsonl", [{"id": "x1", "text": "another input set"}])
    before = tree(out)
    code, _, err = cli(dedup(other, out, PER_FILE), capsys)
    assert code == 2
    assert "holds an unfinished run of another input set" in one_error(err) and "x.jsonl is a new input" in err
    assert tree(out) == before


def test_retrieve_index_redoes_only_the_task_whose_input_changed(tmp_path, capsys):
    """retrieve-index's tasks are independent: an edited corpus file redoes the shard that read it."""
    corpus = tmp_path / "corpus"
    words = ["alpha beta gamma", "delta epsilon", "zeta eta theta iota", "kappa lambda mu"]
    for k in range(4):
        write_jsonl(corpus / f"c{k}.jsonl", [{"id": f"c{k}-{i}", "text": f"{words[k]} doc {i}"} for i in range(20)])
    idx = tmp_path / "idx"
    args = ["retrieve-index", "--corpus", corpus, "--out", idx, "-q", "shard.count=2"]
    assert cli([*args, "shard.index=0"], capsys)[0] == 0
    marker1 = idx / ".cptkit" / "done" / "00000.json"
    assert marker1.exists()
    edited = corpus / "c0.jsonl"  # files f % 2 == 0 -> shard 0
    write_jsonl(edited, [{"id": f"c0-{i}", "text": f"changed words {i}"} for i in range(5)])
    code, _, err = cli([*args, "shard.index=0"], capsys)
    assert code == 0, err
    err = " ".join(err.split())
    assert "c0.jsonl changed" in err and "redoing the 1 task(s)" in err
    assert cli([*args, "shard.index=1"], capsys)[0] == 0
    assert (idx / "_SUCCESS").exists()
    fresh = tmp_path / "fresh"
    assert cli(["retrieve-index", "--corpus", corpus, "--out", fresh, "-q", "retrieve.shards=2"], capsys)[0] == 0
    for shard in ("shard-00000-of-00002", "shard-00001-of-00002"):
        assert (idx / shard / "docs.jsonl").read_bytes() == (fresh / shard / "docs.jsonl").read_bytes()
    assert json.loads((idx / "_manifest.json").read_text())["extra"]["docs (finished shards)"] == 5 + 60


# -- 2. one writer per output --------------------------------------------------------------------------
def test_two_concurrent_runs_one_refuses_one_valid_output(corpus_records, tmp_path):
    recs = [{k: r[k] for k in ("id", "text")} for r in corpus_records]
    inp = tmp_path / "in"
    for k in range(30):
        write_jsonl(inp / f"s{k:02d}.jsonl", recs[k::30])
    ref = tmp_path / "ref"
    subprocess.run([*CLI, *dedup(inp, ref)], check=True, timeout=300)
    out = tmp_path / "out"
    go = tmp_path / "go"
    # the second CLI process imports everything first and starts its run the moment `go` appears
    preloaded = [sys.executable, "-c", "import sys, time, pathlib; import cptkit.steps.dedup; "
                 "from cptkit.cli import main; p = pathlib.Path(sys.argv[1]); sys.argv = sys.argv[1:]\n"
                 "while not p.exists(): time.sleep(0.001)\nmain()", str(go)]
    second = subprocess.Popen([*preloaded, *map(str, dedup(inp, out))], stderr=subprocess.PIPE, text=True)
    first = subprocess.Popen([*CLI, *map(str, dedup(inp, out))], stderr=subprocess.PIPE, text=True)
    lock = out / ".cptkit" / "lock-00000-of-00001"
    deadline = time.time() + 60
    while not lock.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.001)
    assert lock.exists(), "the first run finished before the second could start"
    go.write_text("")
    second_err = second.communicate(timeout=120)[1]
    first_err = first.communicate(timeout=300)[1]
    assert first.returncode == 0, first_err
    assert second.returncode == 2, second_err
    line = one_error(second_err)
    assert f"another cptkit run is writing this output (pid {first.pid} on {socket.gethostname()}" in line
    assert (out / "_SUCCESS").exists() and not lock.exists()
    assert tree(out) == tree(ref)


def test_second_run_waits_with_lock_wait_s(shards, tmp_path, capsys):
    """io.lock_wait_s: a run waits while the holder lives, then takes the lock and runs."""
    out = tmp_path / "out"
    (out / ".cptkit").mkdir(parents=True)
    holder = subprocess.Popen(["sleep", "6"])  # outlives the imports of the run below
    threading.Thread(target=holder.wait, daemon=True).start()  # reaped at exit: then its pid is dead
    (out / ".cptkit" / "lock-00000-of-00001").write_text(
        json.dumps({"pid": holder.pid, "host": socket.gethostname(), "started": time.time(), "index": 0, "count": 1}))
    code, _, err = cli(["dedup", "--in", shards, "--out", out, "io.lock_wait_s=120"], capsys)
    assert code == 0, err
    assert f"waiting for pid {holder.pid} on {socket.gethostname()}" in " ".join(err.split())
    assert (out / "_SUCCESS").exists() and len(read_jsonl_dir(out)) == 240
    code, _, err = cli(["dedup", "--in", shards, "--out", out], capsys)
    assert code == 0 and "already complete" in err


def test_stale_lock_is_taken_over_live_foreign_lock_refuses(shards, tmp_path, capsys):
    out = tmp_path / "out"
    (out / ".cptkit").mkdir(parents=True)
    lock = out / ".cptkit" / "lock-00000-of-00001"
    lock.write_text(json.dumps({"pid": 999999, "host": "node-17.cluster", "started": 0, "index": 0, "count": 1}))
    code, _, err = cli(dedup(shards, out), capsys)
    assert code == 2
    assert "another cptkit run is writing this output (pid 999999 on node-17.cluster" in one_error(err)
    code, _, err = cli(dedup(shards, out, "io.lock_wait_s=0.3"), capsys)  # waits, then refuses
    assert code == 2 and "waiting for pid 999999" in " ".join(err.split())
    assert "error: " in err.splitlines()[-1] and "pid 999999 on node-17.cluster" in err.splitlines()[-1]
    assert lock.exists() and not (out / "_SUCCESS").exists()

    lock.write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "started": 0, "index": 0, "count": 1}))
    code, _, err = cli(dedup(shards, out), capsys)
    assert code == 0, err
    assert (out / "_SUCCESS").exists() and not lock.exists()
    assert len(read_jsonl_dir(out)) == 240


def test_array_member_conflicts_with_a_whole_run(shards, tmp_path, capsys):
    out = tmp_path / "out"
    (out / ".cptkit").mkdir(parents=True)
    (out / ".cptkit" / "lock-00001-of-00002").write_text(
        json.dumps({"pid": os.getppid(), "host": socket.gethostname(), "started": 0, "index": 1, "count": 2}))
    code, _, err = cli(dedup(shards, out), capsys)
    assert code == 2 and f"pid {os.getppid()}" in one_error(err)


# -- 3. secrets ------------------------------------------------------------------------------------------
SECRETS = {"redis": "Rp4ssw0rd-redis", "es": "Es-s3cret-pw", "env": "sk-env-0123456789", "llm": "sk-cli-9876543210"}


def test_planted_secrets_are_never_written_or_printed(shards, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRETS["env"])
    printed = []
    out = tmp_path / "dd"
    code, so, se = cli(["dedup", "--in", shards, "--out", out, f"dedup.redis_url=redis://:{SECRETS['redis']}@127.0.0.1:1/0",
                        f"dedup.redis_namespace=ns-{SECRETS['env']}"], capsys)
    assert code == 0, se
    printed += [so, se]
    m = json.loads((out / "_manifest.json").read_text())
    assert "redis://:<redacted>@127.0.0.1:1/0" in json.dumps(m["config"])
    assert any("<redacted>" in o for o in m["config"]["overrides"])

    qdir = tmp_path / "q.jsonl"
    write_jsonl(qdir, [{"id": "q1", "text": "python list"}])
    rout = tmp_path / "rt"
    code, so, se = cli(["retrieve", "--queries", qdir, "--corpus", shards, "--out", rout, "retrieve.top_k=3",
                        f"retrieve.es.url=http://elastic:{SECRETS['es']}@localhost:9200"], capsys)
    assert code == 0, se
    printed += [so, se]

    code, so, se = cli(["dedup", "--cfg", "job", f"dedup.redis_url=redis://u:{SECRETS['redis']}@h/0"], capsys)
    assert code == 0 and "redis://u:<redacted>@h/0" in so
    printed += [so, se]
    code, so, se = cli(["dedup", "--in", shards, "--out", tmp_path / "x", f"llm.api_key={SECRETS['llm']}"], capsys)
    assert code == 2 and "unknown config key llm.api_key" in one_error(se)
    printed += [so, se]
    code, so, se = cli(["dedup", "--in", shards, "--out", tmp_path / "x", f"+llm.api_key={SECRETS['llm']}"], capsys)
    assert code == 2
    printed += [so, se]
    code, so, se = cli(["evaluate", "--cfg", "job", f"+eval.hf_token={SECRETS['llm']}"], capsys)
    assert code == 2 and "unknown config key eval.hf_token for evaluate" in one_error(se)
    printed += [so, se]
    assert not (tmp_path / "x").exists()

    code, so, se = cli(["dedup", "--in", shards, "--out", tmp_path / "sw", "-m", "dedup.ngram=5,7",
                        f"dedup.redis_url=redis://:{SECRETS['redis']}@h/0"], capsys)
    assert code == 2 and "-m: dedup.redis_url=redis://:<redacted>@h/0 carries a secret" in one_error(se)
    assert not (tmp_path / "sw").exists() and not Path("multirun").exists()
    printed += [so, se]

    written = [p for d in (out, rout) for p in d.rglob("*") if p.is_file()]
    assert any(p.name == "_manifest.json" for p in written) and any(p.suffix == ".npy" for p in written)
    for p in written:
        data = p.read_bytes()
        if p.name.endswith(".gz"):
            data = gzip.decompress(data)
        for s in SECRETS.values():
            assert s.encode() not in data, (p, s)
    for text in printed:
        for s in SECRETS.values():
            assert s not in text


def test_redaction_rules():
    from cptkit.core.redact import redact, redact_text

    cfg = {"llm": {"api_key": "sk-abc", "api_key_env": "OPENAI_API_KEY", "max_new_tokens": 5},
           "eval": {"hf_token": "hf_xyz", "tokenizer": "smollm2"}, "db": {"password": None},
           "url": "http://user:pw1234@host:9200/x", "overrides": ["+eval.hf_token=hf_xyz123", "a=1"]}
    got = redact(cfg)
    assert got["llm"] == {"api_key": "<redacted>", "api_key_env": "OPENAI_API_KEY", "max_new_tokens": 5}
    assert got["eval"] == {"hf_token": "<redacted>", "tokenizer": "smollm2"} and got["db"] == {"password": None}
    assert got["url"] == "http://user:<redacted>@host:9200/x"
    assert got["overrides"] == ["+eval.hf_token=<redacted>", "a=1"]
    assert redact_text("connect redis://:pw5678@h:6379/0 failed; pw5678 again") == \
        "connect redis://:<redacted>@h:6379/0 failed; <redacted> again"
    # flags and numbers under secret-like names are not secrets, and are never masked elsewhere
    assert redact({"use_auth_token": True, "token": "true", "max_token": 5}) == \
        {"use_auth_token": True, "token": "true", "max_token": 5}
    assert redact_text("hf.token=true lowercase: true") == "hf.token=true lowercase: true"


# -- 4. every user error: one line, exit 2, nothing left behind ------------------------------------------
def test_lone_surrogate_is_one_line_and_skippable(shards, tmp_path, capsys):
    bad = shards / "s2.jsonl"
    lines = bad.read_bytes().splitlines(keepends=True)
    lines[4] = b'{"id": "sur", "text": "broken \\ud800 text"}\n'
    bad.write_bytes(b"".join(lines))
    out = tmp_path / "out"
    code, _, err = cli(dedup(shards, out), capsys)
    assert code == 2
    assert "s2.jsonl:5: record 'sur': lone surrogate \\ud800 is not valid Unicode" in one_error(err)
    assert not out.exists()
    code, _, err = cli(dedup(shards, out, "--skip-bad-lines"), capsys)
    assert code == 0, err
    m = json.loads((out / "_manifest.json").read_text())
    assert m["counts"]["bad_lines_skipped"] == 1 and "sur" not in {r["id"] for r in read_jsonl_dir(out)}


def test_out_naming_a_file(shards, tmp_path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("mine")
    code, _, err = cli(dedup(shards, f), capsys)
    assert code == 2 and "is an existing file, not a directory" in one_error(err)
    assert f.read_text() == "mine"


def test_existing_empty_out_is_left_empty_after_bad_input(shards, tmp_path, capsys):
    (shards / "s2.jsonl").write_bytes((shards / "s2.jsonl").read_bytes() + b"not json\n")
    out = tmp_path / "out"
    out.mkdir()
    code, _, err = cli(["retrieve-index", "--corpus", shards, "--out", out, "-q", "retrieve.shards=3"], capsys)
    assert code == 2 and "s2.jsonl:81: malformed JSON" in one_error(err)
    assert out.is_dir() and list(out.iterdir()) == []


def test_overwrite_starts_over(shards, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli(dedup(shards, out, "shard.count=2", "shard.index=0", PER_FILE), capsys)[0] == 0
    code, _, err = cli(dedup(shards, out, "dedup.ngram=5", PER_FILE), capsys)
    assert code == 2 and "holds an unfinished run of another config" in one_error(err)
    code, _, err = cli(dedup(shards, out, "dedup.ngram=5", "io.overwrite=true", PER_FILE), capsys)
    assert code == 0, err
    started = json.loads((out / "_manifest.json").read_text())["timings"]["started"]
    code, _, err = cli(dedup(shards, out, "dedup.ngram=5", "io.overwrite=true", PER_FILE), capsys)
    assert code == 0, err
    assert json.loads((out / "_manifest.json").read_text())["timings"]["started"] > started  # redone
    assert len(read_jsonl_dir(out)) == 240


@pytest.mark.parametrize("override, message", [
    ("shard.max_records=-1", "shard.max_records=-1: must be >= 0 (0: no limit)"),
    ("shard.count=0", "shard.count=0: must be >= 1"),
    ("retrieve.top_k=99999999999", "retrieve.top_k=99999999999: must be in [1, 10,000,000]"),
    ("retrieve.batch_size=0", "retrieve.batch_size=0: must be >= 1"),
    ("io.oversize=cut", "io.oversize=cut: must be one of error, skip, truncate"),
    ("retrieve.top_k=many", "retrieve.top_k=many: expected an integer, got str 'many'"),
    ("+retrieve.topk=5", "unknown config key retrieve.topk for retrieve (did you mean retrieve.top_k?)"),
    ("retrieve.topk=5", "unknown config key retrieve.topk for retrieve (did you mean retrieve.top_k?)"),
])
def test_config_values_validated_with_why(override, message, tmp_path, capsys):
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q", "text": "x"}])
    out = tmp_path / "out"
    code, _, err = cli(["retrieve", "--queries", q, "--corpus", q, "--out", out, override], capsys)
    assert code == 2
    line = one_error(err)
    assert message in line and "+retrieve" not in line
    assert not out.exists()


def test_duplicate_ids_rejected_with_both_places(shards, tmp_path, capsys):
    s2 = shards / "s2.jsonl"
    lines = s2.read_text().splitlines(keepends=True)
    first_id = json.loads((shards / "s0.jsonl").read_text().splitlines()[2])["id"]
    rec = json.loads(lines[6])
    rec["id"] = first_id
    lines[6] = json.dumps(rec) + "\n"
    s2.write_text("".join(lines))
    out = tmp_path / "out"
    code, _, err = cli(dedup(shards, out), capsys)
    assert code == 2
    line = one_error(err)
    assert f"s2.jsonl:7: duplicate id {first_id!r} (first at " in line and "s0.jsonl:3)" in line
    assert not out.exists()
    code, _, err = cli(dedup(shards, out, "io.unique_ids=false"), capsys)
    assert code == 0, err


def test_duplicate_query_ids_rejected(tmp_path, capsys):
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q1", "text": "alpha"}, {"id": "q2", "text": "beta"},
                                           {"id": "q1", "text": "gamma"}])
    c = write_jsonl(tmp_path / "c.jsonl", [{"id": "d1", "text": "alpha beta"}])
    code, _, err = cli(["retrieve", "--queries", q, "--corpus", c, "--out", tmp_path / "o"], capsys)
    assert code == 2 and "q.jsonl:3: duplicate id 'q1'" in one_error(err)
    assert not (tmp_path / "o").exists()


def test_stale_index_build_dirs_are_removed(tmp_path, capsys):
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q1", "text": "alpha"}])
    c = write_jsonl(tmp_path / "c.jsonl", [{"id": "d1", "text": "alpha beta"}, {"id": "d2", "text": "gamma"}])
    out = tmp_path / "o"
    stale = out / f"._index.building-{dead_pid()}"
    (stale / "docs.jsonl").parent.mkdir(parents=True)
    (stale / "docs.jsonl").write_text("half written")
    (out / ".cptkit").mkdir()  # what the killed run left: an unfinished output
    code, _, err = cli(["retrieve", "--queries", q, "--corpus", c, "--out", out, "-q"], capsys)
    assert code == 0, err
    assert not stale.exists() and not list(out.glob("._index.building-*"))
    assert (out / "_index" / "index.json").exists()


@pytest.mark.slow
def test_sigint_says_what_was_kept_and_resumes(corpus_records, tmp_path):
    recs = [{k: r[k] for k in ("id", "text")} for r in corpus_records]
    inp = tmp_path / "in"
    for k in range(40):
        write_jsonl(inp / f"s{k:02d}.jsonl.gz", recs[k::40])
    args = ["dedup", "--in", str(inp), "-q", "shard.max_records=3", PER_FILE]
    ref = tmp_path / "ref"
    subprocess.run([*CLI, *args, "--out", str(ref)], check=True, timeout=300)
    out = tmp_path / "out"
    # a background job of a non-interactive shell (nohup make test &) inherits SIGINT ignored: undo that
    proc = subprocess.Popen([*CLI, *args, "--out", str(out)], stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    done = out / ".cptkit" / "done"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if done.exists() and any(done.glob("*.json")):
            os.kill(proc.pid, signal.SIGINT)
            break
        time.sleep(0.002)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    kept = len(list(done.glob("*.json")))
    assert last == f"interrupted: {kept} of 40 tasks of {out} are finished and kept; rerun the same command to resume"
    assert 1 <= kept < 40 and not (out / "_SUCCESS").exists() and not list(out.glob(".*.tmp-*"))
    assert not (out / ".cptkit" / "lock-00000-of-00001").exists()
    subprocess.run([*CLI, *args, "--out", str(out)], check=True, timeout=300)
    assert tree(out) == tree(ref)


def test_record_size_limit(tmp_path, capsys):
    recs = [{"id": f"r{i}", "text": f"short text {i}"} for i in range(5)]
    recs[2] = {"id": "big", "text": "x" * 2000}
    recs[3] = {"id": "huge", "text": "y " * 100_000}
    f = write_jsonl(tmp_path / "in.jsonl", recs)
    out = tmp_path / "o"
    code, _, err = cli(["dedup", "--in", f, "--out", out, "-q", "io.max_record_chars=1000"], capsys)
    assert code == 2
    assert "in.jsonl:3: record 'big': text of 2,000 characters is over io.max_record_chars=1,000" in one_error(err)
    assert not out.exists()
    code, _, err = cli(["dedup", "--in", f, "--out", out, "-q", "io.max_record_chars=10000", "io.oversize=error"], capsys)
    assert code == 2 and "in.jsonl:4: line is over 185,536 bytes" in one_error(err)  # never read whole
    code, _, err = cli(["dedup", "--in", f, "--out", out, "-q", "io.max_record_chars=1000", "io.oversize=skip"], capsys)
    assert code == 0, err
    assert [r["id"] for r in read_jsonl_dir(out)] == ["r0", "r1", "r4"]
    out2 = tmp_path / "o2"
    code, _, err = cli(["dedup", "--in", f, "--out", out2, "-q", "io.max_record_chars=1000", "io.oversize=truncate"],
                       capsys)
    assert code == 0, err
    got = {r["id"]: r["text"] for r in read_jsonl_dir(out2)}
    assert got["big"] == "x" * 1000 and got["huge"] == ("y " * 500)


# -- 5. issue 16: CLI and interop ----------------------------------------------------------------------------
def test_version_help_and_step_config_keys(capsys):
    from cptkit import __version__

    code, out, _ = cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"cptkit {__version__}"
    code, out, _ = cli(["--help"], capsys)
    commands = out[out.index("Commands:"):]
    assert code == 0 and not any(ln.rstrip().endswith("...") for ln in commands.splitlines()) and "near-duplicates across all input shards (SPEC §3)" in " ".join(out.split())
    code, out, _ = cli(["dedup", "--help"], capsys)
    assert code == 0
    keys = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ") and "=" in ln.split()[0]}
    assert "words per shingle" in keys["dedup.ngram=13"]
    assert "io.max_record_chars=5000000" in keys and "shard.max_records=0" in keys
    code, out, _ = cli(["retrieve", "--help"], capsys)
    assert "retrieve.run_format=tsv" in out and "retrieve.top_k=1000" in out


def test_cfg_hydra_all_info_resolve(capsys):
    code, out, _ = cli(["dedup", "--cfg", "hydra"], capsys)
    assert code == 0 and out.startswith("hydra:\n") and "\ndedup:" not in out
    code, out, _ = cli(["dedup", "--cfg", "all", "dedup.ngram=7"], capsys)
    assert code == 0 and "hydra:\n" in out and "  ngram: 7\n" in out
    code, out, _ = cli(["dedup", "--cfg", "job", "--resolve"], capsys)
    assert code == 0 and "  ngram: 13\n" in out and "hydra" not in out
    code, out, _ = cli(["build-mix", "--info", "mix=demo"], capsys)
    assert code == 0 and "defaults list:" in out and "  mix: demo" in out and "  mix=demo" in out
    code, _, err = cli(["dedup", "--cfg", "nope"], capsys)
    assert code == 2 and "use job, hydra or all" in one_error(err)


def test_parquet_and_save_to_disk_inputs(shards, tmp_path, capsys):
    import datasets

    datasets.disable_progress_bars()  # the fixtures' own writes must not print to the captured stderr
    recs = [r for k in range(3) for r in read_jsonl_dir(shards / f"s{k}.jsonl")]
    pq = tmp_path / "in.parquet"
    datasets.Dataset.from_list(recs).to_parquet(str(pq))
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(recs).save_to_disk(str(saved))
    flat = tmp_path / "flat.jsonl"
    write_jsonl(flat, recs)
    outs = {}
    for name, src in (("jsonl", flat), ("parquet", pq), ("saved", saved)):
        outs[name] = tmp_path / f"out-{name}"
        code, _, err = cli(dedup(src, outs[name]), capsys)
        assert code == 0, (name, err)
    assert read_jsonl_dir(outs["parquet"]) == read_jsonl_dir(outs["jsonl"]) == read_jsonl_dir(outs["saved"])
    assert len(read_jsonl_dir(outs["jsonl"])) == 240

    import datetime

    typed = tmp_path / "typed.parquet"  # columns JSON has no type for are written as strings
    datasets.Dataset.from_list([{"id": "a", "text": "x", "when": datetime.datetime(2024, 1, 2)}]).to_parquet(str(typed))
    code, _, err = cli(dedup(typed, tmp_path / "o-typed"), capsys)
    assert code == 0, err
    assert read_jsonl_dir(tmp_path / "o-typed") == [{"id": "a", "text": "x", "when": "2024-01-02 00:00:00"}]

    bad = tmp_path / "bad.parquet"
    datasets.Dataset.from_list([{"id": "a", "text": "x"}, {"id": "b", "text": None}]).to_parquet(str(bad))
    code, _, err = cli(dedup(bad, tmp_path / "o-bad"), capsys)
    assert code == 2 and "bad.parquet:2: record 'b' has no 'text'" in one_error(err)


def test_output_loads_with_load_dataset(shards, tmp_path, capsys):
    import datasets

    out = tmp_path / "out"
    assert cli(dedup(shards, out), capsys)[0] == 0
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds["id"] == [r["id"] for r in read_jsonl_dir(out)] and len(ds) == 240


def test_metadata_alias(tmp_path, capsys):
    from cptkit.core.records import field_value, meta

    rec = {"id": "a", "text": "t", "metadata": {"topic": "math", "src": {"site": "x"}}}
    assert meta(rec) == rec["metadata"] and field_value(rec, "meta.topic") == "math"
    assert field_value(rec, "topic") == "math" and field_value(rec, "metadata.src.site") == "x"
    assert field_value({"id": "b", "text": "t", "meta": {"topic": "bio"}}, "topic") == "bio"
    f = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "t", "metadata": {"k": 1}},
                                            {"id": "b", "text": "u", "metadata": "not an object"}])
    code, _, err = cli(dedup(f, tmp_path / "o"), capsys)
    assert code == 2 and "in.jsonl:2: record 'b': 'metadata' must be an object, got str" in one_error(err)


def test_retrieve_trec_run_file(tmp_path, capsys):
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q1", "text": "alpha"}, {"id": "q2", "text": "gamma delta"}])
    c = write_jsonl(tmp_path / "c.jsonl", [{"id": "d1", "text": "alpha beta"}, {"id": "d2", "text": "gamma"},
                                           {"id": "d3", "text": "delta alpha"}])
    out = tmp_path / "o"
    code, _, err = cli(["retrieve", "--queries", q, "--corpus", c, "--out", out, "-q", "retrieve.run_format=trec",
                        "retrieve.run_tag=bm25run"], capsys)
    assert code == 0, err
    rows = [ln.split(" ") for ln in (out / "_run.tsv").read_text().splitlines()]
    assert [r[:4] for r in rows] == [["q1", "Q0", "d1", "1"], ["q1", "Q0", "d3", "2"], ["q2", "Q0", "d2", "1"],
                                     ["q2", "Q0", "d3", "2"]]
    assert all(len(r) == 6 and r[5] == "bm25run" for r in rows)
    assert float(rows[0][4]) >= float(rows[1][4])


def test_progress_logged_when_stderr_is_not_a_terminal(shards, tmp_path):
    env = {**os.environ, "CPTKIT_PROGRESS_INTERVAL": "0"}
    proc = subprocess.run([*CLI, "dedup", "--in", str(shards), "--out", str(tmp_path / "o")], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert any(ln.split("INFO")[-1].strip().startswith("signatures:") and "elapsed" in ln
               for ln in proc.stderr.splitlines()), proc.stderr


@pytest.mark.slow
def test_sigkill_then_edited_input_rerun_equals_a_fresh_run(corpus_records, tmp_path):
    """Kill after the first finished task, shrink one input shard, rerun: the output is that of
    the edited inputs (not 'resumed' with stale shards of the old content)."""
    recs = [{k: r[k] for k in ("id", "text")} for r in corpus_records]
    inp = tmp_path / "in"
    for k in range(40):
        write_jsonl(inp / f"s{k:02d}.jsonl.gz", recs[k::40])
    args = ["dedup", "--in", str(inp), "-q", "shard.max_records=3", PER_FILE]
    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, *args, "--out", str(out)])
    done = out / ".cptkit" / "done"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if done.exists() and any(done.glob("*.json")):
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    write_jsonl(inp / "s00.jsonl.gz", recs[0::40][:3])  # task 00000 is done: its shards are stale now
    rerun = subprocess.run([*CLI, *args, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "s00.jsonl.gz changed" in " ".join(rerun.stderr.split())
    fresh = tmp_path / "fresh"
    subprocess.run([*CLI, *args, "--out", str(fresh)], check=True, timeout=300)
    assert tree(out) == tree(fresh)
    assert json.loads((out / "_manifest.json").read_text())["counts"]["records_in"] == len(recs) - len(recs[0::40]) + 3


def test_out_inside_in_directory_is_not_read_back(shards, tmp_path, capsys):
    out = shards / "dedup"  # --out inside the --in directory
    assert cli(dedup(shards, out), capsys)[0] == 0
    code, _, err = cli(["dedup", "--in", shards, "--out", out], capsys)  # its own shards are not inputs
    assert code == 0 and "already complete" in err
    assert json.loads((out / "_manifest.json").read_text())["counts"]["records_in"] == 241


def test_in_and_i_name_the_corpus_of_retrieve(tmp_path, capsys):
    """-i/--in mean the step's input everywhere; for retrieve and retrieve-index that is the corpus."""
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q1", "text": "alpha"}])
    c = write_jsonl(tmp_path / "c.jsonl", [{"id": "d1", "text": "alpha beta"}, {"id": "d2", "text": "gamma"}])
    bm25 = ["retrieve.k1=1.5", "retrieve.b=0.75", "retrieve.idf=lucene"]
    code, _, err = cli(["retrieve", "--queries", q, "-i", c, "--out", tmp_path / "a", "-q", *bm25], capsys)
    assert code == 0, err
    code, _, err = cli(["retrieve", "--queries", q, "--in", c, "--out", tmp_path / "b", "-q", *bm25], capsys)
    assert code == 0, err
    # by hand: idf = ln(1 + (2 - 1 + 0.5) / (1 + 0.5)) = ln 2; tf 1, |d1| = 2, avgdl = 1.5
    score = math.log(2) * (1.5 + 1) / (1 + 1.5 * (1 - 0.75 + 0.75 * 2 / 1.5))
    assert (tmp_path / "a" / "_run.tsv").read_text() == (tmp_path / "b" / "_run.tsv").read_text() == f"q1\td1\t1\t{score:.6f}\n"


@pytest.mark.parametrize("args, message", [
    (["corrupt", "--in", "{q}", "--out", "{out}", "corrupt.batch_size=0"], "corrupt.batch_size=0: must be >= 1"),
    (["corrupt", "--in", "{q}", "--out", "{out}", "corrupt.ratio=1.5"], "corrupt.ratio=1.5: must be in [0, 1]"),
    (["evaluate", "--model", "smollm2", "--in", "{q}", "--out", "{out}", "eval.batch_size=0"],
     "eval.batch_size=0: must be >= 1"),
    (["evaluate", "--model", "smollm2", "--in", "{q}", "--out", "{out}", "eval.engine=harness"],
     "eval.engine=harness: must be cptkit or lm_eval"),
])
def test_step_values_validated_before_any_work(args, message, tmp_path, capsys):
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q", "text": "x"}])
    out = tmp_path / "out"
    code, _, err = cli([str(a).format(q=q, out=out) for a in args], capsys)
    assert code == 2
    assert message in one_error(err)
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["dedup", "dedup.ngram=0"], "dedup.ngram=0: must be >= 1"),
    (["dedup", "dedup.phase=reduce"], "dedup.phase=reduce: needs dedup.cluster=mapreduce or redis"),
    (["dedup", "dedup.bands=20", "dedup.rows=8"], "dedup.bands=20: bands x rows = 20 x 8 must be >= 1 each and use "
                                                  "at most num_perm=128"),
    (["retrieve", "retrieve.b=1.5"], "retrieve.b=1.5: must be in [0, 1]"),
    (["retrieve-index", "retrieve.tokenizer.cjk=trigram"], "retrieve.tokenizer.cjk=trigram: must be one of bigram"),
    (["expand-queries", "expand.rounds=-1"], "expand.rounds=-1: must be >= 0"),
    (["expand-queries", "expand.thought_prompt.template=x"],
     "expand.thought_prompt='retrieve_from_cc_thought_generation': the template lacks placeholder(s) {question}"),
    (["synthesize-qa", "synth.mode=code", "synth.code.demos=0"], "synth.code.demos=0: must be >= 1"),
    (["synthesize-qa", "synth.snippet.position=end"], "synth.snippet.position=end: expected start or random"),
    (["demo-corpus", "corpus.limit_per_source=-1"], "corpus.limit_per_source=-1: must be >= 0"),
    (["serve-llm", "llm=openai"], "llm.backend=openai: serve-llm serves a local backend"),
])
def test_typed_config_values_fail_at_compose_also_for_cfg_job(args, message, capsys):
    """A step's __post_init__ checks run when the config is composed: --cfg job fails the same way."""
    code, out, err = cli([args[0], "--cfg", "job", *args[1:]], capsys)
    assert code == 2 and not out
    assert message in one_error(err)
