"""Scale-out: Hydra multirun sweeps (basic launcher and a real SLURM cluster) and job arrays."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import slurm_cluster
from conftest import read_jsonl_dir, write_jsonl
from outputs import read_manifest, shard_files, shard_paths

CLI = [sys.executable, "-c", "from cptkit.cli import main; main()"]
PER_FILE = "shard.task_bytes=0"  # a task per input shard (small shards share one by default): members split the work


def cptkit(*args: str, cwd: Path, env=None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([*CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and r.returncode != 0:
        raise AssertionError(f"cptkit {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


@pytest.fixture(scope="module")
def qa(tmp_path_factory, corpus_records) -> Path:
    """Four shards of English documentation text with numbers (what corrupt acts on)."""
    d = tmp_path_factory.mktemp("qa")
    recs = [r for r in corpus_records if r["lang"] == "en"][:80]
    recs = [{**r, "text": r["text"][:600]} for r in recs]
    for k in range(4):
        write_jsonl(d / "qa" / f"s{k}.jsonl", recs[k::4])
    return d


@pytest.fixture(scope="module")
def cluster():
    why = slurm_cluster.available()
    if why:
        pytest.skip(f"SLURM cluster: {why}")
    root = Path(tempfile.mkdtemp(prefix="cptkit-slurm-"))
    c = slurm_cluster.SlurmCluster(root).start()
    yield c
    c.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_sweep_basic_launcher_outputs_never_collide(qa):
    cptkit("corrupt", "--in", "qa", "--out", "c{corrupt.ratio}", "-q", "-m", "corrupt.ratio=0.0,0.5", cwd=qa)
    zero, half = read_jsonl_dir(qa / "c0.0"), read_jsonl_dir(qa / "c0.5")
    src = read_jsonl_dir(qa / "qa")
    assert [r["text"] for r in zero] == [r["text"] for r in src]  # ratio 0 is the identity
    changed = sum(a["text"] != b["text"] for a, b in zip(half, src, strict=True))
    assert changed > len(src) // 4
    for out, ratio in (("c0.0", "0.0"), ("c0.5", "0.5")):
        manifest = read_manifest(qa / out)
        assert f"corrupt.ratio={ratio}" in manifest["config"]["overrides"]
        assert manifest["config"]["corrupt"]["ratio"] == float(ratio)
    # Without a placeholder, members nest under OUT/<their overrides>.
    cptkit("corrupt", "--in", "qa", "--out", "nested", "-q", "-m", "corrupt.ratio=0.0,0.3", cwd=qa)
    assert sorted(p.name for p in (qa / "nested").iterdir()) == ["corrupt.ratio=0.0", "corrupt.ratio=0.3"]
    assert shard_files(qa / "nested" / "corrupt.ratio=0.0") == shard_files(qa / "c0.0")
    # --in placeholders too: each member reads its own input (here: the member of the sweep above).
    cptkit("corrupt", "--in", "c{corrupt.ratio}", "--out", "cc{corrupt.ratio}", "-q", "-m", "corrupt.ratio=0.0,0.5",
           cwd=qa)
    assert shard_files(qa / "cc0.0") == shard_files(qa / "c0.0")  # ratio 0 of c0.0, not of c0.5
    assert read_manifest(qa / "cc0.5")["config"]["io"]["inputs"] == ["c0.5"]


def test_a_failing_sweep_member_is_one_line_naming_it(qa):
    r = cptkit("corrupt", "--in", "qa", "--out", "bad{corrupt.ratio}", "-q", "-m", "corrupt.ratio=0.0,7",
               cwd=qa, check=False)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "[HYDRA]" not in ln]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert lines == [lines[0]] and lines[0].startswith("error: corrupt -m member corrupt.ratio=7"), lines


@pytest.mark.slow
def test_sweep_on_slurm_is_a_job_array_with_identical_results(qa, cluster):
    cptkit("corrupt", "--in", "qa", "--out", "s{corrupt.ratio}", "-q", "-m", "corrupt.ratio=0.0,0.5",
           "hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=10",
           "hydra.sweep.dir=sweep-slurm", cwd=qa, env=cluster.env)
    logs = list((qa / "sweep-slurm" / ".submitit").glob("*_0/*_log.out")) + \
        list((qa / "sweep-slurm" / ".submitit").glob("*/*_0_log.out"))
    assert logs, "submitit left no job-array logs"
    for ratio in ("0.0", "0.5"):
        if not (qa / f"c{ratio}").exists():
            cptkit("corrupt", "--in", "qa", "--out", f"c{ratio}", "-q", f"corrupt.ratio={ratio}", cwd=qa)
        assert shard_files(qa / f"s{ratio}") == shard_files(qa / f"c{ratio}")


@pytest.mark.slow
def test_job_array_over_input_shards_and_requeue(qa, cluster):
    """shard.index/count split the tasks; the last member writes _SUCCESS; a requeue redoes only missing tasks."""
    whole = qa / "whole"
    cptkit("corrupt", "--in", "qa", "--out", str(whole), "-q", "corrupt.ratio=0.4", PER_FILE, cwd=qa)
    arr = qa / "arr"
    script = qa / "array.sh"
    script.write_text("#!/bin/bash\nset -e\n" + " ".join([*map(str, CLI[:2]), repr(CLI[2])]) +
                      f" corrupt --in qa --out {arr} -q corrupt.ratio=0.4 {PER_FILE} shard.index=$SLURM_ARRAY_TASK_ID"
                      " shard.count=2\n")
    sub = subprocess.run(["sbatch", "--wait", "--array=0-1", f"--chdir={qa}", f"--output={qa}/arr-%a.log", str(script)],
                         env=cluster.env, capture_output=True, text=True, timeout=600)
    assert sub.returncode == 0, sub.stderr + "".join(p.read_text() for p in qa.glob("arr-*.log"))
    assert (arr / "_SUCCESS").exists()
    assert shard_files(arr) == shard_files(whole)
    # Requeue after losing one task's output: only that task runs again, with the same bytes.
    before = shard_files(arr)
    (arr / ".cptkit" / "done" / "00001.json").unlink()
    (arr / "_SUCCESS").unlink()
    for p in shard_paths(arr, task=1):
        p.unlink()
    r = cptkit("corrupt", "--in", "qa", "--out", str(arr), "corrupt.ratio=0.4", PER_FILE, "shard.index=1", "shard.count=2",
               cwd=qa)
    assert "records in" in r.stderr and (arr / "_SUCCESS").exists()
    assert shard_files(arr) == before


@pytest.mark.slow
def test_two_task_deepspeed_training_through_srun(corpus_dir, corpus_records, tmp_path, cluster):
    """`srun -n 2 cptkit train`: 2 DeepSpeed processes (gloo) from SLURM's task variables."""
    from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    stream = tmp_path / "stream"
    build_stream(corpus_dir, tok, stream, [*TWO_DOMAINS, "mix.budget_tokens=20000", "mix.seq_len=64", "mix.eval_docs=4"])
    out = tmp_path / "run"
    port = 20000 + __import__("os").getpid() % 5000
    cmd = ["srun", "-N1", "-n2", f"--chdir={tmp_path}", "--export=ALL,OMP_NUM_THREADS=1,MASTER_PORT=" + str(port),
           *CLI, "train", "--in", str(stream), "--out", str(out), "model.hidden=32", "model.layers=2",
           "model.heads=2", "train.micro_batch=2", "train.threads=1", "train.max_steps=3", "quiet=true"]
    r = subprocess.run(cmd, env=cluster.env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = read_manifest(out)
    assert manifest["extra"]["world size"] == 2
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert len(steps) == 3 and all(s["loss"] > 0 for s in steps)
    assert (out / "model" / "config.json").exists()


@pytest.mark.slow
def test_job_array_as_a_hydra_sweep_shares_one_output(qa):
    cptkit("corrupt", "--in", "qa", "--out", "arr_sweep", "-q", "corrupt.ratio=0.4", PER_FILE, "shard.count=2",
           "-m", "shard.index=0,1", cwd=qa)
    whole = qa / "whole_sweep"
    cptkit("corrupt", "--in", "qa", "--out", str(whole), "-q", "corrupt.ratio=0.4", PER_FILE, cwd=qa)
    assert (qa / "arr_sweep" / "_SUCCESS").exists()
    assert shard_files(qa / "arr_sweep") == shard_files(whole)


@pytest.mark.slow(minutes=2)
def test_a_reproduce_sweep_on_slurm_through_aggregate_to_verdict(corpus_dir, corpus_records, tmp_path, cluster):
    """`make reproduce`'s path with hydra/launcher=submitit_slurm and nothing else changed: a train
    multirun (axis x 3 seeds) as a SLURM job array, the aggregate over seeds, a verdict; a member equals
    the same run without SLURM. The planted effect: 8 steps lower the held-out loss more than 1 step."""
    import yaml
    from mixdata import TWO_DOMAINS, build_stream, make_tokenizer

    from cptkit.eval.reproduce import report
    from cptkit.eval.stats import HOLDS

    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    build_stream(corpus_dir, tok, tmp_path / "stream", [*TWO_DOMAINS, "mix.budget_tokens=20000", "mix.seq_len=64",
                                                        "mix.eval_docs=4"])
    toy = ["model.hidden=32", "model.layers=1", "model.heads=2", "train.micro_batch=2", "train.threads=1",
           "train.lr=3e-3", "train.eval_every=100", "train.eval_docs=4", "-q"]
    cptkit("train", "--in", "stream", "--out", "runs/st{train.max_steps}_s{seed}", *toy, "-m", "train.max_steps=1,8",
           "seed=0,1,2", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug",
           "hydra.launcher.timeout_min=10", "hydra.sweep.dir=sweep-slurm", cwd=tmp_path, env=cluster.env)
    assert len(list((tmp_path / "sweep-slurm" / ".submitit").glob("*"))) >= 1  # it went through SLURM
    metric = {"file": "metrics.jsonl", "event": "eval", "path": ["eval_loss", "en"], "label": "en loss"}
    c = {"id": "steps", "title": "more steps", "source": "toy", "quote": "q", "command": "cmd", "members": "runs/*",
         "axis": "train.max_steps", "seed": "seed", "metric": metric, "compare": [{"a": 8, "b": 1, "expect": -1}]}
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump([c]))
    assert report(tmp_path / "claims.yaml", tmp_path / "r.md", tmp_path) == [("steps", HOLDS)]
    assert "| 8 | 3 |" in (tmp_path / "r.md").read_text()
    cptkit("train", "--in", "stream", "--out", "plain", *toy, "train.max_steps=8", "seed=1", cwd=tmp_path)

    def last_eval(d: Path) -> dict:
        return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if '"eval"' in x][-1]["eval_loss"]

    assert last_eval(tmp_path / "plain") == last_eval(tmp_path / "runs" / "st8_s1")


@pytest.mark.slow
def test_executor_slurm_submits_each_wave_as_the_job_array_of_its_members(qa, cluster):
    """`cptkit dedup executor=slurm executor.workers=3` on a real cluster: the map wave is array
    0-2, the final phase's leader 0-0, then its other members 1-2 (`--array` from the typed members'
    slices; each array after the previous, afterok); once the jobs ran, the output is the one-process run's."""
    args = ["dedup", "--in", "qa", "-q", PER_FILE]
    (qa / "xs-logs").mkdir()
    env = {**cluster.env, "SBATCH_OUTPUT": str(qa / "xs-logs" / "%A_%a.log")}  # one log per job and array task
    r = cptkit(*args, "--out", "xs", "executor=slurm", "executor.workers=3", cwd=qa, env=env)
    assert not (qa / "xs" / "_SUCCESS").exists()  # submitted, not waited for
    deadline = time.time() + 300
    while True:
        q = subprocess.run(["squeue", "-h", "-o", "%i %r"], env=env, capture_output=True, text=True, check=True).stdout
        logs = "".join(p.read_text() for p in sorted((qa / "xs-logs").glob("*.log")))
        assert "DependencyNeverSatisfied" not in q and time.time() < deadline, q + logs[-3000:]
        if not q.strip():
            break
        time.sleep(1)
    ran = sorted(tuple(p.stem.split("_")) for p in (qa / "xs-logs").glob("*.log"))
    ids = sorted({job for job, _ in ran}, key=int)
    assert len(ids) == 3, (r.stdout, r.stderr, ran)
    assert [(ids.index(job), int(task)) for job, task in ran] == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 1), (2, 2)]
    cptkit(*args, "--out", "xs-one", cwd=qa)
    assert (qa / "xs" / "_SUCCESS").exists() and shard_files(qa / "xs") == shard_files(qa / "xs-one")
