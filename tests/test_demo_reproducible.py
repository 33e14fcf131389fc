"""The demo's domain split does not depend on thread counts: the Makefile's data steps (expand-queries
on the embedded SmolLM2 with llama.cpp -> retrieve -> dedup -> quality classifier -> score-quality ->
label-topics-annotate with MiniLM -> topic classifier -> label-topics) run twice on the test corpus
slice, once on one thread everywhere and once on two, and the records of ``labelled`` (what
``mix=demo_smollm2`` takes as its domain) must have the same sha256 (docs/cpt.md, reproducibility)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_jsonl_dir

from cptkit.llm.llamacpp import cpu_kernels

ROOT = Path(__file__).resolve().parent.parent
# the data steps upstream of the domain split, in the order the Makefile runs them
STEPS = ("queries", "retrieved", "deduped", "models/quality", "scored", "topic_labels", "models/topics", "labelled")


def build_split(corpus: Path, data: Path, threads: int) -> subprocess.CompletedProcess:
    """``make DATA/labelled/_SUCCESS`` at test size with ``threads`` for llama.cpp, torch and OpenMP."""
    venv = Path(sys.executable).parent.parent
    nt = str(threads)
    env = {**os.environ, "OMP_NUM_THREADS": nt, "MKL_NUM_THREADS": nt, "OPENBLAS_NUM_THREADS": nt,
           "CPTKIT_CACHE_DIR": str(data / "cache")}
    grid = "train.tune.epoch=[5] train.tune.lr=[0.5] train.tune.char_ngrams=[[0,0]]"
    args = ["make", "--no-print-directory", f"VENV={venv}", f"-o{venv}/.installed", f"-o{venv}/bin/python",
            f"DATA={data}", f"CORPUS={corpus}", "N_SEEDS=2", "TOP_K=40", "TOPIC_SAMPLE=40",
            f"EXPAND_ARGS=expand.rounds=1 expand.questions_per_seed=1 llm.max_new_tokens=24 llm.cache=false "
            f"llm.num_threads={threads}",
            f"QUALITY_ARGS=train.max_per_class=150 train.tune.max_examples=200 {grid}",
            f"{data}/labelled/_SUCCESS"]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def records_digest(directory: Path) -> str:
    """sha256 of a step's records, each as canonical JSON, sorted by id."""
    recs = sorted(read_jsonl_dir(directory), key=lambda r: r["id"])
    lines = (json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in recs)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def data_digest(directory: Path) -> str:
    """sha256 of a step's data files (records or model files; not the manifest, README or .cptkit/,
    which name the output's own path)."""
    h = hashlib.sha256()
    files = (p for p in directory.rglob("*") if p.is_file() and ".cptkit" not in p.relative_to(directory).parts)
    for f in sorted(p for p in files if not p.name.startswith(("_", "README"))):
        h.update(f.relative_to(directory).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


@pytest.mark.slow(minutes=5)
def test_domain_split_same_on_one_and_two_threads(corpus_dir, tmp_path):
    runs = {}
    for threads in (1, 2):
        data = tmp_path / f"t{threads}"
        r = build_split(corpus_dir, data, threads)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        runs[threads] = data
    labelled = {t: records_digest(d / "labelled") for t, d in runs.items()}
    assert len(read_jsonl_dir(runs[1] / "labelled")) > 10  # the split is not empty
    differ = [s for s in STEPS if data_digest(runs[1] / s) != data_digest(runs[2] / s)]
    assert labelled[1] == labelled[2], f"labelled: {labelled}; steps that differ: {differ}"
    # MiniLM's topic_score may differ in its 6th digit on 1 and 2 torch threads (1 of 400 pages in
    # the demo); the topics, and so every step after them, may not
    assert [s for s in differ if s != "topic_labels"] == [], f"steps that differ: {differ}"
    # what can still differ between machines is named where the queries were written
    gen = [json.loads((d / "queries" / "_expand_stats.json").read_text())["generator"] for d in runs.values()]
    assert [g["threads"] for g in gen] == [1, 2] and gen[0]["cpu_kernels"] == gen[1]["cpu_kernels"] != ""


def test_cpu_kernels_names_the_features_llama_cpp_uses():
    info = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 0 | AVX512_VNNI = 0 | LLAMAFILE = 1 | OPENMP = 1 | "
    assert cpu_kernels(info) == "SSE3 AVX2 LLAMAFILE OPENMP"
    assert cpu_kernels("") == ""
