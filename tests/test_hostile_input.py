"""Hostile input (issue "Hostile input" §6), through the real CLI: a bad setting or an exhausted
resource is one line on stderr naming the key or file, exit code 2, no traceback, and no output
files left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_jsonl_dir, write_jsonl

CLI = [sys.executable, "-m", "cptkit.cli"]


def run_cli(argv: list, **kw) -> subprocess.CompletedProcess:
    """``cptkit ARGV`` in a child process (stderr captured as text)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([*CLI, *map(str, argv)], capture_output=True, text=True, env=env, timeout=600, **kw)


def one_line(r: subprocess.CompletedProcess, *names: str) -> str:
    """Assert exit 2 and a single-line error naming every one of ``names``; return it."""
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    assert len(err.splitlines()) == 1, err
    for n in names:
        assert n in err, (n, err)
    return err


def corpus(tmp_path: Path, n: int = 20) -> Path:
    write_jsonl(tmp_path / "in" / "part-0.jsonl",
                [{"id": f"d{i}", "text": f"document number {i} about cells and proteins"} for i in range(n)])
    return tmp_path / "in"


@pytest.mark.parametrize("override, key", [
    ("retrieve.epsilon=nan", "epsilon"),
    ("retrieve.epsilon=inf", "epsilon"),
    ("retrieve.k1=inf", "k1"),
    ("retrieve.tokenizer.split='(['", "tokenizer.split"),
])
def test_retrieve_settings_refused_at_compose(tmp_path, override, key):
    out = tmp_path / "out"
    r = run_cli(["retrieve-index", "--corpus", corpus(tmp_path), "--out", out, "-q", override])
    one_line(r, key)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("override, key", [
    ("mix.budget_tokens=inf", "budget_tokens"),
    ("mix.budget_tokens=nan", "budget_tokens"),
    ("mix.stages=[{name:s,weights:{all:inf}}]", "stages.s.weights.all=inf"),
])
def test_mix_budget_must_be_finite(tmp_path, override, key):
    out = tmp_path / "out"
    r = run_cli(["build-mix", "--in", corpus(tmp_path), "--out", out, "-q", "mix=demo", "mix.seq_len=128", override])
    one_line(r, key)
    assert not out.exists() or not any(out.iterdir())


def _limit_fsize() -> None:  # runs in the child: writes past 4 KiB fail with EFBIG
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_file_size_limit_is_one_line(tmp_path):
    """A write that hits RLIMIT_FSIZE (EFBIG, as ENOSPC on a full disk) is one line naming the
    resource and the file, at the step boundary."""
    big = [{"id": f"d{i}", "text": f"record {i} " + "word " * 400} for i in range(40)]
    write_jsonl(tmp_path / "in" / "part-0.jsonl", big)
    out = tmp_path / "out"
    r = run_cli(["corrupt", "--in", tmp_path / "in", "--out", out, "-q"], preexec_fn=_limit_fsize)
    err = one_line(r, "cptkit corrupt", "file size limit exceeded")
    assert str(out) in err
    assert not (out / "_SUCCESS").exists()


@pytest.mark.parametrize("line, why", [
    ('{"id": "d1", "text": "x", "n": ' + "7" * 5000 + "}", "digits"),
    ('{"id": "d1", "text": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"id": "d1", "text": "x", "score": NaN}', "NaN is not JSON"),
    ('{"id": "d1", "text": "x", "score": -Infinity}', "-Infinity is not JSON"),
])
def test_hostile_record_is_named_by_file_and_line(tmp_path, line, why):
    """A record Python's json cannot or should not read is refused as ``file:line: reason``
    (NaN and Infinity are refused, not written back as invalid JSON)."""
    src = tmp_path / "in" / "part-0.jsonl"
    src.parent.mkdir()
    src.write_text('{"id": "d0", "text": "fine"}\n' + line + "\n")
    out = tmp_path / "out"
    r = run_cli(["dedup", "--in", src.parent, "--out", out, "-q"])
    one_line(r, f"{src}:2", why)
    assert not out.exists() or not any(p for p in out.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".gz"))


@pytest.mark.parametrize("override, key", [
    ("model.hidden=0", "hidden"),
    ("model.heads=5", "heads"),
    ("model.kv_heads=3", "kv_heads"),
])
def test_model_shape_refused_at_compose(tmp_path, override, key):
    out = tmp_path / "out"
    r = run_cli(["train", "--in", corpus(tmp_path), "--out", out, "-q", override])
    one_line(r, key)
    assert not out.exists() or not any(out.iterdir())


def test_text_field_that_no_document_has_is_refused(tmp_path):
    """``retrieve.text_field=nope`` used to index every document as empty and exit 0."""
    inp = corpus(tmp_path)
    out = tmp_path / "idx"
    r = run_cli(["retrieve-index", "--corpus", inp, "--out", out, "-q", "retrieve.text_field=nope"])
    one_line(r, "retrieve.text_field='nope'", str((inp / "part-0.jsonl").resolve()))
    assert not any(p.name.startswith("docs") for p in tmp_path.rglob("*"))


def test_unfinished_step_output_is_refused_unless_allowed(tmp_path):
    """A reader pointed at a step's output without ``_SUCCESS`` (running, or died) stops with one
    line; ``--allow-partial`` reads it anyway."""
    first = tmp_path / "dedup"
    assert run_cli(["dedup", "--in", corpus(tmp_path), "--out", first, "-q"]).returncode == 0
    (first / "_SUCCESS").unlink()
    out = tmp_path / "out"
    r = run_cli(["corrupt", "--in", first, "--out", out, "-q"])
    one_line(r, str(first), "_SUCCESS", "--allow-partial")
    assert not out.exists() or not any(out.iterdir())
    r = run_cli(["corrupt", "--in", first, "--out", out, "-q", "--allow-partial"])
    assert r.returncode == 0, r.stderr
    assert (out / "_SUCCESS").exists()


def test_text_chunks_cover_the_text_within_the_size():
    from cptkit.synthetic.corruption import text_chunks

    text = ("alpha beta gamma\ndelta " * 300) + "x" * 2500
    pieces = text_chunks(text, 1000)
    assert "".join(p for _, p in pieces) == text
    assert all(len(p) <= 1000 for _, p in pieces)
    assert [o for o, _ in pieces] == [sum(len(p) for _, p in pieces[:i]) for i in range(len(pieces))]
    assert all(p.endswith((" ", "\n")) for _, p in pieces[:6])  # word boundaries while there are spaces
    assert text_chunks("short text", 1000) == [(0, "short text")]


def _peak_rss_mib(argv: list) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cptkit ARGV`` in a fresh child and return it with the child's peak RSS (MiB)."""
    code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024); sys.exit(r.returncode)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code, *CLI, *map(str, argv)], capture_output=True, text=True,
                       env=env, timeout=300)
    return r, float(r.stdout.strip().splitlines()[-1])


def test_corrupt_memory_is_bounded_on_a_large_record(tmp_path):
    """One 1M-character record: spaCy sees bounded pieces, so the child's peak RSS stays far
    under what tagging it as one document took (about 3 GB per 1M characters before)."""
    words = "The 3 big cells and 17 small proteins were measured in 2019 by a careful team . "
    text = words * (1_000_000 // len(words))
    write_jsonl(tmp_path / "in" / "part-0.jsonl", [{"id": "big", "text": text, "lang": "en"}])
    out = tmp_path / "out"
    r, peak = _peak_rss_mib(["corrupt", "--in", tmp_path / "in", "--out", out, "-q"])
    assert r.returncode == 0, r.stderr
    [rec] = read_jsonl_dir(out)
    assert rec["corruption"]["changed"] > 0 and len(rec["text"]) > 990_000
    assert peak < 1024, peak  # MiB; the whole-document code took about 3 GB here


class _Planted:
    """Unpickling this runs ``touch MARK``: what a hostile pytorch_model.bin would do."""

    def __init__(self, mark: Path):
        self.mark = mark

    def __reduce__(self):
        return (os.system, (f"touch {self.mark}",))


def test_pickled_model_with_code_is_refused_in_one_line(tmp_path):
    """A pytorch_model.bin that holds more than tensors: refused (one line, exit 2), nothing run, nothing written."""
    import shutil

    import torch
    from _tiny_llm import cached_tiny_model
    from safetensors.torch import load_file

    model = tmp_path / "m"
    shutil.copytree(cached_tiny_model(), model)
    weights = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    mark = tmp_path / "PWNED"
    torch.save({**weights, "payload": _Planted(mark)}, model / "pytorch_model.bin")
    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "hello world"}])
    r = run_cli(["evaluate", "--model", model, "--in", tmp_path / "in.jsonl", "--out", tmp_path / "ev",
                 "eval.tasks=[]", "-q"])
    assert "objects other than tensors" in one_line(r, str(model))
    assert not mark.exists() and not (tmp_path / "ev").exists()


def test_non_finite_numbers_are_written_as_valid_json(tmp_path):
    """A one-document perplexity has no standard error: _results.json says null, not NaN."""
    import json

    from _tiny_llm import cached_tiny_model

    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "hello world"}])
    r = run_cli(["evaluate", "--model", cached_tiny_model(), "--in", tmp_path / "in.jsonl", "--out", tmp_path / "ev",
                 "eval.tasks=[]", "-q"])
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "ev" / "_results.json").read_text()
    res = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in _results.json"))
    assert res["perplexity"]["groups"]["all"]["se"] is None and res["perplexity"]["groups"]["all"]["docs"] == 1


def test_prompt_over_the_model_context_is_refused_in_one_line(tmp_path):
    """A seed longer than the model's context is refused before the model sees it (one line, exit 2,
    nothing written), as llama.cpp refuses it: fed whole, a 1M-character seed took minutes and
    several GB in the tiny model's attention."""
    from _tiny_llm import TEXTS, cached_tiny_model

    text = " ".join(TEXTS * 40)  # about 50,000 characters: well over the tiny model's 4,096 positions
    write_jsonl(tmp_path / "seeds.jsonl", [{"id": "s0", "text": text + " Why?"},
                                           {"id": "s1", "text": "What is the capital of France?"}])
    out = tmp_path / "q"
    r = run_cli(["expand-queries", "--in", tmp_path / "seeds.jsonl", "--out", out, "-q", "llm=transformers",
                 f"llm.model={cached_tiny_model()}", "llm.device=cpu", "llm.num_threads=1", "llm.cache=false",
                 "llm.max_new_tokens=16", "expand.rounds=1", "expand.questions_per_seed=1"])
    one_line(r, "record 's0'", "exceeds the context of 4096 tokens", "llm.max_model_len")
    assert "'s1'" not in r.stderr  # the refusal names the seed that is too long, not its batch-mates
    assert not out.exists() or not any(p for p in out.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".gz"))


def _with_long_record(tmp_path: Path) -> tuple[Path, list[dict]]:
    """A shard whose third line is over io.max_record_chars=2000 (as a 50 MB record is over the default)."""
    words = "The reader refuses a record whose text is longer than the limit it was given . "
    recs = [{"id": "a", "text": "cells and proteins " * 20}, {"id": "b", "text": "stars and planets " * 20},
            {"id": "long", "text": words * 40},  # 3,160 characters: its first 2,000 are not a duplicate
            {"id": "a2", "text": "cells and proteins " * 20},
            {"id": "long2", "text": (words * 40)[:2000] + "Quite another story about ships and harbours . " * 30}]
    return write_jsonl(tmp_path / "in" / "part-0.jsonl", recs).parent, recs


def test_retrieve_index_applies_the_record_size_limit(tmp_path):
    """retrieve built its index from every corpus record, however long (a 50 MB one took 1.5 GB):
    now the reader's limit applies as in every step."""
    inp, _ = _with_long_record(tmp_path)
    write_jsonl(tmp_path / "q.jsonl", [{"id": "q0", "text": "cells"}, {"id": "q1", "text": "reader limit"}])
    out = tmp_path / "out"
    r = run_cli(["retrieve", "--queries", tmp_path / "q.jsonl", "--corpus", inp, "--out", out, "-q",
                 "io.max_record_chars=2000"])
    one_line(r, f"{inp / 'part-0.jsonl'}:3", "io.max_record_chars=2,000")
    assert not out.exists() or not any(p for p in out.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".gz"))
    r = run_cli(["retrieve", "--queries", tmp_path / "q.jsonl", "--corpus", inp, "--out", out, "-q",
                 "io.max_record_chars=2000", "io.oversize=truncate", "retrieve.top_k=10", "io.overwrite=true"])
    assert r.returncode == 0, r.stderr
    got = {rec["id"]: rec for rec in read_jsonl_dir(out)}
    assert len(got["long"]["text"]) == 2000 and {"a", "a2", "long2"} <= set(got)


@pytest.mark.parametrize("oversize, kept", [
    ("skip", ["a", "b"]),  # a2 is a's duplicate; the long texts are skipped
    ("truncate", ["a", "b", "long"]),  # cut to 2,000 characters, long2 is long's duplicate (whole, it is not)
])
def test_dedup_reads_long_records_as_the_other_steps_do(tmp_path, oversize, kept):
    """dedup's signature phase read every text whole, whatever io.max_record_chars said: a 50 MB
    record was shingled (1.4 GB) before the writer refused it, a truncated one was compared on its
    whole text, and a skipped one shifted the rows of the records after it."""
    inp, _ = _with_long_record(tmp_path)
    out = tmp_path / "out"
    r = run_cli(["dedup", "--in", inp, "--out", out, "-q", "io.max_record_chars=2000"])
    one_line(r, f"{inp / 'part-0.jsonl'}:3", "io.max_record_chars=2,000")
    assert not out.exists() or not any(p for p in out.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".gz"))
    r = run_cli(["dedup", "--in", inp, "--out", out, "-q", "io.max_record_chars=2000", f"io.oversize={oversize}",
                 "io.overwrite=true"])
    assert r.returncode == 0, r.stderr
    got = read_jsonl_dir(out)
    assert [rec["id"] for rec in got] == kept
    assert all(len(rec["text"]) <= 2000 for rec in got)


def _mixed_text(n: int) -> str:
    """Real-looking prose of ``n`` characters: English paragraphs, double spaces, code, Chinese."""
    parts = ["The tokenizer reads the  whole text;  it keeps offsets,\tmasks and strings for every token.\n",
             "def f(x):\n    return x ** 2  # squared\n\n", "蛋白质和细胞在二〇一九年被测量。结果，细胞更小！\n",
             "Numbers like 3.14159 and 2,718 stay whole... (parentheses) [brackets] \"quotes\"\n\n"]
    block = "".join(parts)
    return (block * (n // len(block) + 1))[:n]


@pytest.mark.parametrize("pre", ["bytelevel", "metaspace"])
def test_long_text_is_tokenized_in_pieces_with_the_same_ids(tmp_path, pre):
    """encode_long cuts only where the ids do not change (checked around each cut), so a long text
    gives the whole text's ids, with byte-level BPE and with a SentencePiece-style Metaspace."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from cptkit.models.tiny import train_bpe_tokenizer
    from cptkit.text.encode import encode_long, encode_many

    text = _mixed_text(60_000)
    if pre == "bytelevel":
        tok = train_bpe_tokenizer([text[:20_000]], vocab_size=400)
    else:
        raw = Tokenizer(models.BPE(unk_token="<unk>"))
        raw.pre_tokenizer = pre_tokenizers.Metaspace()
        raw.train_from_iterator([text[:20_000]], trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"]))
        tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>")
    whole = tok(text, add_special_tokens=False)["input_ids"]
    assert encode_long(tok, text, chunk=1000) == whole
    assert encode_long(tok, text[:900], chunk=1000) == tok(text[:900], add_special_tokens=False)["input_ids"]
    # a batch of short and long texts: each text's own ids, in order
    batch = [text[:900], text, text[900:1500]]
    assert encode_many(tok, batch, chunk=1000) == [tok(x, add_special_tokens=False)["input_ids"] for x in batch]


def test_build_mix_memory_is_bounded_on_a_record_at_the_limit(tmp_path):
    """A record of 5,000,000 characters (io.max_record_chars): build-mix tokenizes it in pieces, so
    its peak RSS stays under 1 GiB (one whole-text Encoding took 1.17 GB)."""
    import numpy as np

    from cptkit.models.tiny import train_bpe_tokenizer

    text = _mixed_text(5_000_000)
    tok = train_bpe_tokenizer([text[:50_000]], vocab_size=512, out_dir=tmp_path / "tok")
    write_jsonl(tmp_path / "in" / "part-0.jsonl", [{"id": "big", "text": text, "lang": "en"}])
    out = tmp_path / "stream"
    r, peak = _peak_rss_mib(["build-mix", "--in", tmp_path / "in", "--out", out, "-q", f"tokenizer={tmp_path / 'tok'}",
                             "mix.domains=[{name:en,filter:{lang:en}}]", "mix.stages=[{name:main,weights:{en:1}}]",
                             "mix.fill=en", "mix.seq_len=64", "mix.eval_docs=0", "mix.budget_tokens=1e5"])
    assert r.returncode == 0, r.stderr
    [bin_file] = (out / "tokens").glob("*.bin")
    ids = np.fromfile(bin_file, dtype=np.uint16)
    assert ids[-1] == tok.eos_token_id and tok.decode(ids[:-1].tolist()) == text  # every piece, in order
    assert peak < 1024, peak  # MiB; one whole-text Encoding took 1.17 GB here
