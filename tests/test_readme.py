"""Every per-step example of the README runs as written, on a toy ``make demo``'s data.

The ``data/`` the examples read is made by the Makefile's own demo targets at toy sizes (Make
variables below; a tiny random Llama with SmolLM2's tokenizer as the base model the CPT part continues,
2 steps per arm) on the demo-corpus slice, as far as the examples read it (:data:`README_INPUTS`);
then each README command runs from a directory
laid out like the repository root (``examples/``, ``data/``, a fresh ``out/``), with the
embedded SmolLM2 as the LLM. Only these overrides are added to the commands as written, to keep
them small: :func:`toy_overrides`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_commands import Command, ok, readme_commands, run_commands, table

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

TOY_MAKE = {
    "N_SEEDS": "2",
    "EXPAND_ARGS": "expand.rounds=1 expand.questions_per_seed=1 llm.max_new_tokens=64 llm.num_threads=1",  # 32: SmolLM2 may finish no question
    "TOP_K": "60",
    "TOPIC_SAMPLE": "80",
    "QUALITY_ARGS": "train.max_per_class=10000 train.tune.max_examples=1000 train.tune.epoch=[20] train.tune.word_ngrams=[2]",
    "SYNTH_ARGS": "synth.mode=code synth.code.num_problems=2 synth.code.demos=2 synth.code.discipline=mathematics "
                  "synth.trim_truncated=true llm.max_new_tokens=48 llm.num_threads=1",
    "MIX": "mix=demo_smollm2 mix.seq_len=64 mix.eval_docs=4",
    "STEP_TOKENS": "128",  # TRAIN_ARGS' micro_batch 2 x MIX's seq_len 64: a stream per arm of CPT_STEPS x 128 tokens
    "CPT_STEPS": "2",
    "TRAIN_ARGS": "train.micro_batch=2 train.lr=1e-4 train.threads=1 train.precision=fp32 train.keep_checkpoints=false "
                  "train.eval_every=1 "
                  "train.eval_docs=2 train.eval_max_tokens=64 'train.eval_extra=[$(XP)/probe.jsonl,$(OUTSIDE)]'",
    "EVAL_ARGS": "eval.tasks=[gcide_defs] eval.limit=8 eval.shots=0 eval.ppl.group_by=domain eval.ppl.max_length=64 "
                 "eval.ppl.max_tokens=64 eval.ppl.max_docs_per_group=4",
    "CPT_TASK": "gcide_defs",  # as EVAL_ARGS (wordnet_defs fetches dict-gcide to build itself)
    "B0_MIX": "mix=b0 mix.budget_tokens=4096 mix.seq_len=64 mix.eval_docs=4 mix.max_docs=400",
    "B0_ARGS": "train.micro_batch=2 train.lr=1e-4 train.threads=1 train.precision=fp32 train.eval_every=1 "
               "train.eval_docs=2 train.eval_max_tokens=64 train.max_steps=3 seed=0",
    "PROBE_DOCS": "4",
    "XP_PROBE_DOCS": "4",
    "HELDOUT_DOCS": "4",
    "PROBE_TOKENS": "16",
}

# The make targets whose outputs the README's commands read (data/...): the data steps, the seed-0
# streams, B0's evaluation on seed 0, the replay arm and its evaluation.
README_INPUTS = ("labelled", "qa_c30", "xp/stream_r0_s0", "xp/stream_rp_s0", "xp/eval/b0_s0", "xp/eval/replay_s0")


def toy_overrides(c: Command) -> list[str]:
    """What the test adds to a README command: LLM output lengths, sample counts, model and
    stream sizes. Everything else (inputs, outputs, the README's own overrides) is as written."""
    args = " ".join(c.argv)
    step = c.step
    extra: list[str] = []
    if step == "demo-corpus":
        extra = ["corpus.limit_per_source=150"]  # the slice data/corpus already holds
    elif step in ("expand-queries", "synthesize-qa"):
        # one llama.cpp thread: another test runs beside this one, and llama.cpp's threads spin-wait
        extra = ["llm.max_new_tokens=32", "llm.num_threads=1"]
    elif step == "score-quality-train":
        extra = ["train.tune.epoch=[20]", "train.tune.word_ngrams=[2]"]  # a 2-point grid, not 8
    elif step == "label-topics-annotate" and "loglikelihood" not in args:
        extra = ["topics.sample=80"]  # as TOY_MAKE's TOPIC_SAMPLE
    elif step == "label-topics-annotate":
        extra = ["topics.sample=1", "topics.few_shot_chars=100", "topics.max_page_tokens=48"]  # prompts ~3x shorter
    elif step == "build-mix" and "mix=demo_cpt" in args:
        extra = ["mix.budget_tokens=16384", "mix.seq_len=64", "mix.eval_docs=4"]
    elif step == "build-mix" and "mix=upsample_tail" in args:  # its epochs need ~350k tokens of the slice
        extra = ["mix.budget_tokens=5e5", "mix.seq_len=64", "mix.eval_docs=4"]
    elif step == "train":
        extra = ["train.micro_batch=2", "train.threads=1", "train.eval_docs=4"]
        if "model=hf" not in args:
            extra += ["model.hidden=32", "model.layers=1", "model.heads=2"]
        else:  # SmolLM2: a twentieth of the steps (20 -> 1, then extended to 40 -> 2, so resume still extends)
            steps = re.search(r"train\.max_steps=(\d+)", args)
            if steps:
                extra.append(f"train.max_steps={max(1, int(steps.group(1)) // 20)}")
    elif step == "evaluate" and "eval.suite" not in args:
        # 64 tokens a document as well as a window: the Chinese documents are ~2k tokens each (130 s otherwise)
        extra = ["eval.limit=8", "eval.shots=1", "eval.ppl.max_docs_per_group=4", "eval.ppl.max_length=64",
                 "eval.ppl.max_tokens=64"]
    return extra


def tiny_base(directory: Path) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer, as the base model the toy CPT part continues (B0,
    its probe, the replay arm, their evaluations): the README's commands read those outputs, whatever
    model made them, and the streams stay SmolLM2's (TOKENIZER=smollm2) for its commands that train it."""
    from cptkit.models.lm import load_tokenizer
    from cptkit.models.tiny import tiny_llama

    tok = load_tokenizer("smollm2")
    tiny_llama(tok, hidden=64, layers=2, heads=4, max_position=2048).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@pytest.mark.slow(minutes=10)
def test_readme_examples_run_as_written(tmp_path: Path, corpus_dir: Path, smollm2: str) -> None:
    root = tmp_path / "repo"
    data = root / "data"
    data.mkdir(parents=True)
    (root / "examples").symlink_to(REPO / "examples")
    shutil.copytree(corpus_dir, data / "corpus")
    base = tiny_base(tmp_path / "tiny_base")
    # VENV named on the line: one inherited from an outer `make test VENV=...` (MAKEFLAGS) would
    # otherwise make $(VENV)/.installed, re-pointing that venv's editable install at this checkout
    make = ["make", "-j2", "-C", str(REPO), f"VENV={BIN.parent}", f"-o{BIN.parent}/.installed",
            f"-o{BIN}/python", f"BIN={BIN}", f"DATA={data}",
            f"BASE_MODEL={base}", "TOKENIZER=smollm2", *(f"{k}={v}" for k, v in TOY_MAKE.items())]
    # the whole demo graph is sound (a dry run); then only what the README's commands read is made: the
    # other three arms, their evaluations and the table run in tests/test_cpt_design.py (same recipes)
    dry = subprocess.run([*make, "-n", "pipeline"], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "cptkit cpt-report " in dry.stdout, dry.stdout[-3000:] + dry.stderr[-3000:]
    r = subprocess.run([*make, *(f"{data}/{t}/_SUCCESS" for t in README_INPUTS)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    commands = readme_commands()
    assert len(commands) >= 20 and {c.step for c in commands} >= {
        "expand-queries", "retrieve", "dedup", "score-quality", "label-topics", "synthesize-qa", "corrupt",
        "build-mix", "train", "evaluate"}
    for c in commands:
        c.extra = toy_overrides(c)
    results = run_commands(commands, root, cptkit=[str(BIN / "cptkit")], timeout=900)
    failed = [r for r in results if not ok(r)]
    assert not failed, table(results) + "".join(f"\n$ {r.command.text}\n{r.stderr[-1500:]}" for r in failed)
    # every command that names an output finished it
    for c in commands:
        if "--out" in c.argv and not c.expect_failure:
            out = root / c.argv[c.argv.index("--out") + 1]
            assert (out / "_SUCCESS").exists(), f"{c.text}: no {out}/_SUCCESS"
