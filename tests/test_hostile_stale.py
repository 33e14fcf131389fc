"""No stale output, whatever changed (issue "Hostile input" §2): a model, a topic model, a tokenizer
or ``model.path`` replaced in place, or an input edited to the same size with its mtime restored,
is seen on rerun: a finished output refuses with one line naming what changed, ``io.overwrite=true``
redoes it. Content digests are cached by inode, size, mtime and ctime: an unchanged file is not re-read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from classify_realtext import fortunes_en, maxima_docs, python_docs
from conftest import read_jsonl_dir, run_main, write_jsonl
from mixdata import TWO_DOMAINS, make_tokenizer


@pytest.fixture(autouse=True)
def hash_cache(tmp_path, monkeypatch) -> Path:
    """Each test its own digest cache (``$CPTKIT_CACHE``), so that the cache file is its own."""
    monkeypatch.setenv("CPTKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "hashes.json"


def cli(argv: list, capsys=None) -> tuple[int, str]:
    """``cptkit ARGV`` in-process through the console entry point: (exit code, stderr)."""
    if capsys is not None:
        capsys.readouterr()
    code = run_main(argv)
    return code, capsys.readouterr().err if capsys is not None else ""


def refused(code: int, err: str, *words: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def replace_dir(dst: Path, src: Path) -> None:
    """Replace ``dst``'s contents in place by ``src``'s (same path, other model)."""
    shutil.rmtree(dst)
    shutil.copytree(src, dst)


def edit_same_size_same_mtime(path: Path) -> None:
    """Change one byte of a text field, keeping the size and restoring the modification time."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    i = data.index(b'"text": "') + len(b'"text": "')
    data[i] = ord("Z") if data[i] != ord("Z") else ord("Y")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def train_quality(tmp: Path, name: str, pos: list[dict], neg: list[dict]) -> Path:
    p, n, out = write_jsonl(tmp / f"{name}-pos.jsonl", pos), write_jsonl(tmp / f"{name}-neg.jsonl", neg), tmp / name
    assert cli(["score-quality-train", "--positives", p, "--negatives", n, "--out", out, "-q"])[0] == 0
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two quality models: python docs good (a) and fortunes good (b)."""
    tmp = tmp_path_factory.mktemp("quality")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CPTKIT_CACHE", str(tmp / "cache"))
        good, bad = python_docs(60) + maxima_docs(30), fortunes_en(90)
        return train_quality(tmp, "qa", good, bad), train_quality(tmp, "qb", bad, good)


@pytest.fixture()
def quality(models, tmp_path):
    """The two quality models and a probe set of this test's own (it may be edited)."""
    probe = [{"id": f"p{i}", "text": r["text"]} for i, r in enumerate(python_docs(200)[1::20] + fortunes_en(200)[1::20])]
    write_jsonl(tmp_path / "probe" / "p.jsonl", probe)
    return *models, tmp_path / "probe"


def test_quality_model_replaced_in_place(quality, tmp_path, capsys):
    a, b, probe = quality
    model, out = tmp_path / "model", tmp_path / "scored"
    shutil.copytree(a, model)
    argv = ["score-quality", "--in", probe, "--out", out, "-q", f"quality.model={model}"]
    assert cli(argv, capsys)[0] == 0
    before = {r["id"]: r["quality"] for r in read_jsonl_dir(out)}
    replace_dir(model, b)
    refused(*cli(argv, capsys), "model", "changed", "io.overwrite=true")
    assert {r["id"]: r["quality"] for r in read_jsonl_dir(out)} == before  # refused: nothing touched
    assert cli([*argv, "io.overwrite=true"], capsys)[0] == 0
    after = {r["id"]: r["quality"] for r in read_jsonl_dir(out)}
    assert after.keys() == before.keys() and all(abs(after[k] - (1 - before[k])) < 0.5 for k in before)
    assert cli(argv, capsys)[0] == 0  # unchanged since: reused


def test_input_edited_keeping_size_and_mtime(quality, tmp_path, capsys):
    a, _, probe = quality
    out = tmp_path / "scored"
    argv = ["score-quality", "--in", probe, "--out", out, "-q", f"quality.model={a}"]
    assert cli(argv, capsys)[0] == 0
    edit_same_size_same_mtime(probe / "p.jsonl")
    refused(*cli(argv, capsys), "p.jsonl changed (its contents differ", "io.overwrite=true")
    # an unfinished run whose input changed the same way redoes the task that read it
    (out / "_SUCCESS").unlink()
    (out / "_manifest.json").unlink()
    edit_same_size_same_mtime(probe / "p.jsonl")
    code, err = cli(argv, capsys)
    assert code == 0 and "p.jsonl changed" in err and "redoing the 1 task(s)" in err, err
    first = json.loads((probe / "p.jsonl").read_text().splitlines()[0])
    assert read_jsonl_dir(out)[0]["text"] == first["text"]  # the output holds the edited text


def test_topic_model_replaced_in_place(tmp_path, capsys):
    def train(name: str, fortune_topic: str) -> Path:
        recs = ([{**r, "topic": "Computer Science and Engineering", "lang": "en"} for r in python_docs(40)]
                + [{**r, "topic": fortune_topic, "lang": "en"} for r in fortunes_en(40)])
        write_jsonl(tmp_path / name / "labels.jsonl", recs)
        code, err = cli(["label-topics-train", "--in", tmp_path / name, "--out", tmp_path / f"{name}-model", "-q"], capsys)
        assert code == 0, err
        return tmp_path / f"{name}-model"

    a, b = train("ta", "Others"), train("tb", "Philosophy and Logic")
    model, out = tmp_path / "topics", tmp_path / "labelled"
    shutil.copytree(a, model)
    write_jsonl(tmp_path / "in" / "p.jsonl", [{"id": f"f{i}", "text": r["text"], "lang": "en"}
                                              for i, r in enumerate(fortunes_en(200)[1::20])])
    argv = ["label-topics", "--in", tmp_path / "in", "--out", out, "-q", f"topics.model={model}"]
    assert cli(argv, capsys)[0] == 0
    assert "Others" in {r["topic"] for r in read_jsonl_dir(out)}
    replace_dir(model, b)
    refused(*cli(argv, capsys), "topics", "changed")
    assert cli([*argv, "io.overwrite=true"], capsys)[0] == 0
    topics = {r["topic"] for r in read_jsonl_dir(out)}
    assert "Philosophy and Logic" in topics and "Others" not in topics


def test_tokenizer_replaced_in_place(corpus_dir, corpus_records, tmp_path, capsys):
    tok = make_tokenizer(corpus_records, tmp_path / "tok", vocab_size=300)
    other = make_tokenizer(corpus_records[::2], tmp_path / "tok2", vocab_size=400)
    out = tmp_path / "stream"
    argv = ["build-mix", "--in", corpus_dir, "--out", out, "-q", f"tokenizer={tok}", *TWO_DOMAINS,
            "mix.budget_tokens=4000", "mix.seq_len=32", "mix.eval_docs=2"]
    assert cli(argv, capsys)[0] == 0
    replace_dir(tok, other)
    refused(*cli(argv, capsys), "tok changed (size", "io.overwrite=true")
    assert cli([*argv, "io.overwrite=true"], capsys)[0] == 0
    assert json.loads((out / "_stream.json").read_text())["vocab_size"] == 400


def tiny_model(tok: Path, out: Path, seed: int) -> Path:
    from cptkit.models.lm import load_tokenizer
    from cptkit.models.tiny import tiny_llama

    t = load_tokenizer(str(tok))
    tiny_llama(t, hidden=32, layers=1, heads=2, seed=seed).save_pretrained(out)
    t.save_pretrained(out)
    return out


def test_model_path_replaced_in_place_evaluate(corpus_records, tmp_path, capsys):
    tok = make_tokenizer(corpus_records, tmp_path / "tok", vocab_size=300)
    model = tiny_model(tok, tmp_path / "model", seed=0)
    other = tiny_model(tok, tmp_path / "other", seed=1)
    write_jsonl(tmp_path / "heldout" / "h.jsonl", [{"id": r["id"], "text": r["text"]} for r in corpus_records[:8]])
    out = tmp_path / "ev"
    argv = ["evaluate", "--model", model, "--in", tmp_path / "heldout", "--out", out, "-q",
            "eval.ppl.max_length=64", "eval.batch_size=4"]
    assert cli(argv, capsys)[0] == 0
    before = json.loads((out / "_results.json").read_text())["perplexity"]["all"]["loss"]
    replace_dir(model, other)
    refused(*cli(argv, capsys), "model", "changed", "io.overwrite=true")
    assert cli([*argv, "io.overwrite=true"], capsys)[0] == 0
    assert json.loads((out / "_results.json").read_text())["perplexity"]["all"]["loss"] != before


def test_digests_are_cached_by_inode_size_mtime_ctime(quality, tmp_path, hash_cache, capsys):
    a, _, _ = quality
    big = tmp_path / "big" / "b.jsonl"
    write_jsonl(big, [{"id": f"b{i}", "text": f"row {i} " + "word " * 200} for i in range(2000)])  # ~2 MB
    key = str(big.resolve())

    def run(out: str) -> dict:
        assert cli(["score-quality", "--in", big.parent, "--out", tmp_path / out, "-q", f"quality.model={a}"],
                   capsys)[0] == 0
        return {f["path"]: f for f in json.loads((tmp_path / out / ".cptkit" / "inputs.json").read_text())}

    first = run("o1")
    entry = json.loads(hash_cache.read_text())[key]
    st = big.stat()
    assert entry["sha256"] == hashlib.sha256(big.read_bytes()).hexdigest() == first[key]["sha256"]
    assert entry["stat"] == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    # plant a digest in the cache: a run that re-read the file would record the real one
    cached = json.loads(hash_cache.read_text())
    cached[key]["sha256"] = "f" * 64
    hash_cache.write_text(json.dumps(cached))
    from cptkit.core import fingerprint

    fingerprint._CACHES.clear()  # a new process: the cache comes from the file
    assert run("o2")[key]["sha256"] == "f" * 64
    # a write that keeps size and mtime changes ctime: the cached digest is not trusted
    edit_same_size_same_mtime(big)
    fingerprint._CACHES.clear()
    assert run("o3")[key]["sha256"] == hashlib.sha256(big.read_bytes()).hexdigest()


def test_model_path_replaced_in_place_train(corpus_dir, corpus_records, tmp_path, capsys):
    tok = make_tokenizer(corpus_records, tmp_path / "tok", vocab_size=300)
    stream, run = tmp_path / "stream", tmp_path / "run"
    assert cli(["build-mix", "--in", corpus_dir, "--out", stream, "-q", f"tokenizer={tok}", *TWO_DOMAINS,
                "mix.budget_tokens=4000", "mix.seq_len=32", "mix.eval_docs=2"], capsys)[0] == 0
    model = tiny_model(tok, tmp_path / "model", seed=0)
    other = tiny_model(tok, tmp_path / "other", seed=1)
    argv = ["train", "--in", stream, "--out", run, "-q", "model=hf", f"model.path={model}", "train.max_steps=2",
            "train.micro_batch=2", "train.threads=1", "train.plot=false", "train.tensorboard=false"]
    assert cli(argv, capsys)[0] == 0
    first = (run / "metrics.jsonl").read_text()
    replace_dir(model, other)
    refused(*cli(argv, capsys), "model changed", "io.overwrite=true")
    assert (run / "metrics.jsonl").read_text() == first
    assert cli([*argv, "io.overwrite=true"], capsys)[0] == 0
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["loss"] != json.loads(first.splitlines()[0])["loss"]


def test_directory_digest_covers_names_and_bytes_not_run_records(tmp_path):
    from cptkit.core.fingerprint import content_hash

    d = tmp_path / "model"
    (d / "sub").mkdir(parents=True)
    (d / "a.bin").write_bytes(b"abc")
    (d / "sub" / "b.json").write_text("{}")
    sha, size = content_hash(d)
    expect = hashlib.sha256(f"a.bin\0{hashlib.sha256(b'abc').hexdigest()}\n"
                            f"sub/b.json\0{hashlib.sha256(b'{}').hexdigest()}\n".encode()).hexdigest()
    assert (sha, size) == (expect, 5)
    (d / "_manifest.json").write_text('{"timings": 1}')  # run records and state: not the model
    (d / ".cptkit").mkdir()
    (d / ".cptkit" / "lock").write_text("1")
    assert content_hash(d) == (expect, 5)
    (d / "a.bin").rename(d / "c.bin")  # same bytes, another name: another model
    assert content_hash(d)[0] != expect
    assert content_hash(tmp_path / "missing") is None


def test_a_writer_killed_mid_write_leaves_no_temporary_file_for_good(hash_cache, tmp_path):
    """A process killed while saving the digest cache left ``.hashes.json.<pid>.tmp`` behind for good;
    the next save deletes the files of dead processes and keeps those of live ones."""
    import subprocess

    from cptkit.core.fingerprint import HashCache

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    hash_cache.parent.mkdir(parents=True)
    stale, live = (hash_cache.with_name(f".hashes.json.{p}.tmp") for p in (dead, os.getppid()))
    for t in (stale, live):
        t.write_text("{")
    f = tmp_path / "data.txt"
    f.write_text("x")
    c = HashCache(hash_cache)
    c.file_sha256(f)
    c.save()
    assert not stale.exists() and live.exists() and str(f) in json.loads(hash_cache.read_text())


def test_llm_replaced_in_place_is_not_served_its_old_completions(smollm2, tmp_path):
    """The completion cache is keyed by the model's content, not only its name: a GGUF swapped in place
    under the same path generates anew instead of returning the old model's cached completions."""
    from cptkit.llm import load_generator
    from cptkit.llm.base import GenParams
    from cptkit.llm.llamacpp import gguf_path, requantized
    from tests._tiny_llm import llm_cfg

    src = gguf_path("smollm2", None)
    model = tmp_path / "model.gguf"
    shutil.copyfile(src, model)
    greedy, prompts = GenParams(max_new_tokens=12, temperature=0.0), ["Name a prime number.", "Why is the sky blue?"]

    def run() -> tuple[list[str], int]:
        g = load_generator(llm_cfg(str(model), tmp_path / "completions", backend="llamacpp"))
        try:
            return [c.text for c in g.generate(prompts, greedy)], g.stats.cache_hits
        finally:
            g.close()

    first, hits = run()
    assert hits == 0 and run() == (first, 2)  # a rerun is served from the cache
    shutil.copyfile(requantized(src, "q4_0", 1), model)  # same path and name, other weights
    swapped, hits = run()
    assert hits == 0 and swapped != first
    assert run() == (swapped, 2)
