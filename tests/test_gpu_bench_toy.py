"""The GPU benchmarks at toy size on the CPU (``--toy``): their whole path works before a GPU is lent
(issue "Speed v3": keep the scripts tested). bench/gpu/train_mfu.py trains the toy Llama on a real
build-mix stream with ``cptkit train`` and the HF Trainer; bench/gpu/generate_gpu.py generates with
every CPU backend and runs expand-queries. No speed is asserted (toy size on a CPU measures nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mixdata import build_stream, make_tokenizer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_train_mfu_toy_runs_both_trainers_on_cpu(corpus_dir: Path, corpus_records: list[dict], tmp_path: Path):
    tok = make_tokenizer(corpus_records, tmp_path / "tok")
    build_stream(corpus_dir, tok, tmp_path / "stream", ["mix.seq_len=64", "mix.budget_tokens=8192", "mix.eval_docs=2"])
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "bench/gpu/train_mfu.py", "--stream", str(tmp_path / "stream"), "--out",
                        str(out), "--toy", "--steps", "5", "--warmup", "1", "--micro-batch", "2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads((out / "train_mfu.json").read_text())
    assert res["gpu"] == "cpu" and len(res["rows"]) == 1
    row = res["rows"][0]
    assert row["shape"] == "toy" and row["seq"] == 64 and row["micro_batch"] == 2
    for who in ("cptkit", "hf"):
        assert "error" not in row[who], (who, row[who], r.stdout[-2000:], r.stderr[-3000:])
        assert row[who]["ms_step"] > 0 and row[who]["tokens_s"] > 0 and row[who]["mfu_sheet"] is None


def test_generate_gpu_toy_runs_every_cpu_method_and_the_step(smollm2: str, tmp_path: Path):
    """bench/gpu/generate_gpu.py --toy: the transformers and llama.cpp rows and an expand-queries step run
    produce tokens on the CPU (vLLM, GPU only, is left out), and the report renders every row."""
    from cptkit.models.gguf_cache import converted

    gguf = Path(smollm2)
    hf = converted(str(gguf.parent), gguf.name)
    out = tmp_path / "gen"
    r = subprocess.run([sys.executable, "bench/gpu/generate_gpu.py", "--toy", "--model", hf, "--gguf", smollm2,
                        "--out", str(out), "--methods", "vllm,transformers,llamacpp", "--prompts", "2",
                        "--cpu-max-prompts", "2", "--max-new-tokens", "4", "--threads", "1",
                        "--step-methods", "llamacpp", "--step-tokens", "4", "--step-seeds", "2"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads((out / "generate_gpu.json").read_text())
    assert [row["method"] for row in res["rows"]] == ["transformers", "llamacpp"], res["rows"]
    for row in res["rows"]:
        assert "error" not in row, row
        (run,) = row["runs"]
        assert run["prompts"] == 2 and 0 < run["tokens"] <= 8 and run["tokens_s"] > 0 and len(run["texts"]) == 2
    (step,) = res["step"]
    assert "error" not in step, step
    assert step["llm"]["requests"] == 4 and step["llm"]["generated_tokens"] > 0  # 2 seeds, 2 requests each (all 20: 40)
    throughput, steps = r.stdout.split("The step, end to end")  # the report: both tables, every row
    assert "| transformers | 2 |" in throughput and "| llamacpp | 2 |" in throughput
    assert "| llamacpp | " in steps and "failed" not in steps
