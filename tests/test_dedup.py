"""cptkit dedup on real text (the demo-corpus slice) with planted exact and near duplicates."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import read_jsonl_dir, write_jsonl
from outputs import read_manifest, shard_paths

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.dedup import minhash as mh
from cptkit.dedup.cluster import DedupCounts
from cptkit.steps.dedup import run

NSHARDS = 4


def ngrams(text: str, n: int = 13) -> set:
    toks = mh.tokenize(text)
    if len(toks) < n:
        return {tuple(toks)}
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def jaccard(a: str, b: str) -> float:
    return mh.jaccard_sets(ngrams(a), ngrams(b))


def edit_span(text: str, frac: float, rng: random.Random, cjk: bool = False) -> str:
    """Replace one contiguous span of ``frac`` of the words (characters for Chinese)."""
    units = list(text) if cjk else text.split()
    k = max(1, int(len(units) * frac))
    s = rng.randrange(0, len(units) - k)
    new = ["改"] * k if cjk else [f"zz{rng.randrange(10**6)}" for _ in range(k)]
    units[s:s + k] = new
    return ("" if cjk else " ").join(units)


@pytest.fixture(scope="module")
def planted(corpus_records, tmp_path_factory) -> dict:
    """Corpus slice in 4 shards plus planted near (English and Chinese), far and exact copies."""
    rng = random.Random(0)
    shards: list[list[dict]] = [[] for _ in range(NSHARDS)]
    where = {}
    for i, r in enumerate(corpus_records):
        rec = {k: r[k] for k in ("id", "text", "source", "lang")}
        shards[i * NSHARDS // len(corpus_records)].append(rec)
        where[r["id"]] = i * NSHARDS // len(corpus_records)
    en = [r for r in corpus_records if r["lang"] == "en" and len(r["text"].split()) >= 150]
    zh = [r for r in corpus_records if r["lang"] == "zh" and len(mh.tokenize(r["text"])) >= 300]
    rng.shuffle(en)
    rng.shuffle(zh)
    near, far, exact = {}, {}, {}
    for r in en[:30]:
        near[r["id"] + "~near"] = (r["id"], edit_span(r["text"], rng.choice([0.01, 0.02, 0.03]), rng))
    for r in zh[:10]:
        near[r["id"] + "~near"] = (r["id"], edit_span(r["text"], 0.02, rng, cjk=True))
    for r in en[30:40]:
        far[r["id"] + "~far"] = (r["id"], edit_span(r["text"], 0.3, rng))
    for r in en[40:50]:
        exact[r["id"] + "~exact"] = (r["id"], "  " + r["text"].upper().replace(" ", "\n "))
    for dup_id, (orig, text) in {**near, **far, **exact}.items():
        # after the original: its own shard (end) or a later one -> many cross-shard pairs
        shard = rng.randrange(where[orig], NSHARDS)
        shards[shard].append({"id": dup_id, "text": text, "source": "planted", "lang": "x"})
    root = Path(tmp_path_factory.mktemp("dedup")) / "in"
    for k, recs in enumerate(shards):
        write_jsonl(root / f"shard{k}.jsonl.gz", recs)
    texts = {r["id"]: r["text"] for recs in shards for r in recs}
    truth = {d: jaccard(texts[o], t) for d, (o, t) in near.items()}
    return {"dir": root, "near": near, "zh": {r["id"] + "~near" for r in zh[:10]}, "far": far, "exact": exact, "texts": texts, "truth": truth,
            "cross": sum(where[o] != next(k for k, rs in enumerate(shards) if any(r["id"] == d for r in rs))
                         for d, (o, _) in near.items())}


def dedup(inp: Path, out: Path, *overrides: str) -> dict:
    """Dedup with a task per shard (small shards share a task by default): duplicates cross tasks."""
    return run(compose_step("dedup", [f"io.inputs=['{inp}']", f"io.output='{out}'", "quiet=true", "shard.task_bytes=0",
                                      *overrides]))


def removed_of(out: Path) -> dict[str, dict]:
    lines = (out / "_removed.jsonl").read_text().splitlines()
    return {r["id"]: r for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def result(planted, tmp_path_factory) -> dict:
    out = Path(tmp_path_factory.mktemp("dedup-out")) / "out"
    summary = dedup(planted["dir"], out)
    return {"out": out, "summary": summary, "removed": removed_of(out),
            "kept": [r["id"] for r in read_jsonl_dir(out)],
            "manifest": read_manifest(out)}


def test_planted_near_duplicates_found(planted, result):
    removed, truth = result["removed"], planted["truth"]
    above = [d for d, j in truth.items() if j >= 0.8]
    assert len(above) >= 35 and min(truth.values()) > 0.6  # the edits give J around the threshold
    found = [d for d in above if d in removed]
    assert len(found) >= 0.95 * len(above)
    assert all(d in removed for d in above if truth[d] >= 0.85)
    assert sum(d in planted["zh"] for d in found) >= 8  # Chinese (character shingles) too
    for d in found:
        orig = planted["near"][d][0]
        kept_orig = removed[orig]["duplicate_of"] if orig in removed else orig
        assert removed[d]["duplicate_of"] == kept_orig
        assert removed[d]["kind"] == "near"
    assert planted["cross"] >= 10  # many of these pairs span two shards


def test_distinct_documents_kept(planted, result):
    kept = set(result["kept"])
    for d in planted["far"]:
        assert d in kept, d
        assert jaccard(planted["texts"][d], planted["texts"][planted["far"][d][0]]) < 0.6
    # planted copies aside, most real documents survive; the slice's own near duplicates
    # (e.g. fortunes-zh quotes sections of the Debian Reference) go, verified in the next test
    copies = {**planted["near"], **planted["far"], **planted["exact"]}
    originals = [i for i in planted["texts"] if i not in copies]
    assert sum(i in kept for i in originals) >= 0.9 * len(originals)


def test_precision_every_removal_is_verified(planted, result):
    texts = planted["texts"]
    for rid, r in result["removed"].items():
        j = jaccard(texts[rid], texts[r["duplicate_of"]])
        if r["kind"] == "exact":
            assert r["similarity"] == pytest.approx(j, abs=1e-4) or r["similarity"] == 1.0
            continue
        assert r["similarity"] == pytest.approx(j, abs=1e-4), rid
        assert j >= 0.8, rid


def test_exact_duplicates(planted, result):
    removed = result["removed"]
    for d, (orig, _) in planted["exact"].items():
        assert removed[d]["kind"] == "exact"
        assert removed[d]["duplicate_of"] == orig
        assert removed[d]["similarity"] == 1.0


def test_counts_and_manifest(result):
    extra, removed = result["manifest"]["extra"], result["removed"]
    kinds = [r["kind"] for r in removed.values()]
    assert extra["near duplicates"] == kinds.count("near")
    assert extra["exact duplicates"] == kinds.count("exact")
    assert extra["docs out"] == len(result["kept"]) == extra["docs in"] - len(removed)
    assert result["manifest"]["counts"]["records_out"] == len(result["kept"])
    assert extra["verified pairs"] >= extra["near duplicates"] and extra["candidate pairs"] >= extra["verified pairs"]
    assert (extra["bands"], extra["rows"]) == (18, 7)
    assert extra["p_candidate_at_threshold"] == pytest.approx(0.9855, abs=1e-4)
    assert "13-grams" in extra["shingling"] and "FNV-1a" in extra["hashing"] and "PCG64(42)" in extra["hashing"]
    assert result["manifest"]["config"]["dedup"]["ngram"] == 13


def test_deterministic_bytes(planted, result, tmp_path):
    out = tmp_path / "again"
    dedup(planted["dir"], out)
    names = sorted(p.name for p in result["out"].iterdir() if p.is_file() and p.name != "_manifest.json")
    assert names == sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "_manifest.json")
    assert any(n.startswith("part-00003") for n in names)
    for n in names:
        assert (out / n).read_bytes() == (result["out"] / n).read_bytes(), n


def test_signature_cache_is_reused(planted, result, tmp_path):
    out = tmp_path / "cached"
    dedup(planted["dir"], out)
    state = out / ".cptkit"
    stamps = {p.name: p.stat().st_mtime_ns for p in state.glob("sig-*.npy")}
    assert len(stamps) == NSHARDS
    # drop everything after phase 1: the rerun must reuse the signatures and give the same output
    for p in [*shard_paths(out), *out.glob("_*"), state / "clusters.npz", *(state / "done").iterdir()]:
        p.unlink()
    dedup(planted["dir"], out)
    assert {p.name: p.stat().st_mtime_ns for p in state.glob("sig-*.npy")} == stamps
    assert (out / "_removed.jsonl").read_bytes() == (result["out"] / "_removed.jsonl").read_bytes()


def test_cached_clustering_gives_the_same_output_and_counts(planted, result, tmp_path):
    """A rerun whose clustering (``clusters.npz``, a :class:`DedupResult`) is cached writes the same
    shards, ``_removed.jsonl`` and manifest counts; the counts are the manifest's first rows."""
    out = tmp_path / "cached"
    dedup(planted["dir"], out)
    state = out / ".cptkit"
    for p in [*shard_paths(out), *out.glob("_*"), *(state / "done").iterdir()]:
        p.unlink()
    stamp = (state / "clusters.npz").stat().st_mtime_ns
    dedup(planted["dir"], out)
    assert (state / "clusters.npz").stat().st_mtime_ns == stamp
    assert (out / "_removed.jsonl").read_bytes() == (result["out"] / "_removed.jsonl").read_bytes()
    for a, b in zip(shard_paths(out), shard_paths(result["out"]), strict=True):
        assert a.read_bytes() == b.read_bytes()
    extra = read_manifest(out)["extra"]
    counts = DedupCounts.of_rows({k: extra[k] for k in list(extra)[:7]})
    assert counts.rows() == {"docs in": counts.docs_in, "docs out": counts.docs_out,
                             "exact duplicates": counts.exact_duplicates, "near duplicates": counts.near_duplicates,
                             "duplicate clusters": counts.duplicate_clusters, "candidate pairs": counts.candidate_pairs,
                             "verified pairs": counts.verified_pairs}
    assert list(extra.items())[:7] == list(result["manifest"]["extra"].items())[:7] == list(counts.rows().items())
    assert counts.docs_out == len(result["kept"]) and counts.exact_duplicates == len(planted["exact"])


def test_outputs_load_with_datasets(result, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    files = [str(p) for p in shard_paths(result["out"], ".jsonl.gz")]
    ds = datasets.load_dataset("json", data_files=files, split="train", cache_dir=str(tmp_path))
    assert ds.num_rows == len(result["kept"]) and ds["id"] == result["kept"]
    rm = datasets.load_dataset("json", data_files=str(result["out"] / "_removed.jsonl"), split="train",
                               cache_dir=str(tmp_path))
    assert rm.num_rows == len(result["removed"])
    assert set(rm.column_names) == {"id", "duplicate_of", "kind", "similarity"}


def test_estimate_verification_and_explicit_banding(planted, result, tmp_path):
    out = tmp_path / "est"
    dedup(planted["dir"], out, "dedup.verify=estimate", "dedup.bands=16", "dedup.rows=8")
    m = read_manifest(out)["extra"]
    assert (m["bands"], m["rows"]) == (16, 8) and m["verify"].startswith("estimate")
    assert m["p_candidate_at_threshold"] == pytest.approx(0.9470, abs=1e-4)
    removed = removed_of(out)
    strong = [d for d, j in planted["truth"].items() if j >= 0.9]
    assert all(d in removed for d in strong)
    # estimated similarities agree with the exact ones within the MinHash error
    for d in strong:
        assert abs(removed[d]["similarity"] - planted["truth"][d]) < 0.15


def test_threshold_changes_what_is_removed(planted, tmp_path):
    out = tmp_path / "t95"
    dedup(planted["dir"], out, "dedup.threshold=0.95")
    removed = removed_of(out)
    for d, j in planted["truth"].items():
        if j < 0.95:
            assert d not in removed
    assert all(r["similarity"] >= 0.95 for r in removed.values() if r["kind"] == "near")


def test_short_documents_are_one_shingle(tmp_path):
    recs = [{"id": "a", "text": "pip install the package"}, {"id": "b", "text": "Pip install, the package!"},
            {"id": "c", "text": "pip install another package"}, {"id": "d", "text": "pip install the package"}]
    write_jsonl(tmp_path / "in.jsonl", recs)
    dedup(tmp_path / "in.jsonl", tmp_path / "out")
    removed = removed_of(tmp_path / "out")
    assert removed["d"]["kind"] == "exact"  # same text
    assert removed["b"] == {"id": "b", "duplicate_of": "a", "kind": "near", "similarity": 1.0}
    assert "c" not in removed


@pytest.mark.parametrize("override, needle", [
    ("dedup.bands=20", "dedup.bands=20"),
    ("dedup.verify=maybe", "dedup.verify"),
    ("dedup.tokenizer=bpe", "dedup.tokenizer"),
    ("dedup.threshold=1.5", "dedup.threshold"),
])
def test_bad_config(planted, tmp_path, override, needle):
    extra = [override, "dedup.rows=8"] if "bands" in override else [override]
    with pytest.raises(CptkitError, match=needle.replace(".", r"\.")):
        dedup(planted["dir"], tmp_path / "o", *extra)
    assert not (tmp_path / "o").exists()


def test_empty_text_documents(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "..."}, {"id": "b", "text": "!!"},
                                        {"id": "c", "text": "real words here"}])
    dedup(tmp_path / "in.jsonl", tmp_path / "out")
    assert removed_of(tmp_path / "out") == {"b": {"id": "b", "duplicate_of": "a", "kind": "near", "similarity": 1.0}}
    assert [r["id"] for r in read_jsonl_dir(tmp_path / "out")] == ["a", "c"]


def test_two_workers_give_the_same_bytes(planted, result, tmp_path):
    """dedup.workers=2 (forked processes per shard: signatures, re-read, writing) = one process."""
    out = tmp_path / "w2"
    summary = dedup(planted["dir"], out, "dedup.workers=2")
    names = sorted(p.name for p in result["out"].iterdir() if p.is_file() and p.name != "_manifest.json")
    assert names == sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "_manifest.json")
    for n in names:
        assert (out / n).read_bytes() == (result["out"] / n).read_bytes(), n
    m = read_manifest(out)
    assert m["counts"] == result["manifest"]["counts"] and m["config_hash"] == result["manifest"]["config_hash"]
    assert m["files"] == result["manifest"]["files"]
    assert summary["records_in"] == result["summary"]["records_in"]


def test_two_workers_skip_bad_lines_and_report_errors(tmp_path):
    recs = [{"id": f"d{i}", "text": f"document number {i} with some words in it"} for i in range(6)]
    recs.append({"id": "copy", "text": recs[1]["text"]})
    for k in range(3):
        write_jsonl(tmp_path / "in" / f"s{k}.jsonl", recs[k * 2:(k + 1) * 2] + ([recs[6]] if k == 2 else []))
    with open(tmp_path / "in" / "s1.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(CptkitError, match=r"s1\.jsonl:3: malformed JSON"):
        dedup(tmp_path / "in", tmp_path / "o", "dedup.workers=2")
    outs = []
    for w in (1, 2):
        out = tmp_path / f"skip{w}"
        dedup(tmp_path / "in", out, "io.skip_bad_lines=true", f"dedup.workers={w}")
        outs.append([(p.name, p.read_bytes()) for p in sorted(out.iterdir()) if p.is_file() and p.name != "_manifest.json"])
        assert removed_of(out) == {"copy": {"id": "copy", "duplicate_of": "d1", "kind": "exact", "similarity": 1.0}}
    assert outs[0] == outs[1]
