"""Peak memory of every cptkit step on one huge record (issue #22 §3, "Bounded memory on any record").

Each step is run through the real CLI (the ``cptkit STEP ...`` command line) in a fresh child
process, once per record size:

* ``small``    - a normal record (one Python documentation page, about 4,000 characters): the baseline;
* ``1M``       - one record of 1,000,000 characters;
* ``5M``       - one record of 5,000,000 characters: the largest the reader accepts by default
  (``io.max_record_chars``), so the one the 1 GiB target is about;
* ``50MB``     - one record of about 50 MB of UTF-8 (50,000,000 characters), over the reader's
  default ``io.max_record_chars=5,000,000``: it must be refused (non-zero exit, one line naming
  ``file:line``, no output shard and no ``_SUCCESS`` left);
* ``50MB trunc`` - the same file with ``io.oversize=truncate``: the record is cut to the limit
  (5,000,000 characters) after the whole 50 MB line was read and parsed.

The big texts are real prose: the reStructuredText sources of the Python 3.11 documentation (the
demo corpus's ``python3.11-doc`` package, or ``--text-dir``), one Chinese paragraph (gettext
translations of ``/usr/share/locale/zh_CN``) after every tenth English paragraph, repeated until
the size is reached.

Memory: **peak RSS** is ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a small wrapper process that
only starts the step (the largest resident set of the step's process or of any child it waited
for: the largest single process, not their sum);
**tree peak** is the largest sum of RSS over the process tree, sampled with psutil every 50 ms
(can miss a peak shorter than that). The target is a peak RSS under 1 GiB for any record that fits
the reader's limit. Wall time includes the interpreter start and imports (several seconds).

Settings are the tests' small ones: the LLM steps (expand-queries, synthesize-qa) use the tests'
tiny random chat model (``tests/_tiny_llm.py``, 64 hidden, built once, no download), 16 new tokens;
retrieve builds its index from a corpus of 300 documentation pages plus the record, then runs 4
queries; score-quality and label-topics use classifiers trained here on the normal corpus;
build-mix tokenizes with a 512-token BPE trained here and packs 64-token sequences; train runs
``model=tiny_llama`` (32 hidden, 2 layers) for 2 steps on the stream build-mix made of the record;
evaluate scores the record's perplexity (``eval.ppl.max_length=256``, every token) with a tiny
model trained here.
"""

from __future__ import annotations

import argparse
import gettext
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import table, write_section  # noqa: E402

PY_DOC = Path("~/.cache/cptkit/debs/extracted/python3.11-doc_3.11.2-6+deb12u9_all/usr/share/doc/python3.11/html/_sources")
ZH_MO = Path("/usr/share/locale/zh_CN/LC_MESSAGES")
LICENSES = Path("/usr/share/common-licenses")
LIMIT = 5_000_000  # io.max_record_chars default
CASES = {"small": (0, []), "1M": (1_000_000, []), "5M": (LIMIT, []), "50MB": (50_000_000, []),
         "50MB trunc": (50_000_000, ["io.oversize=truncate"])}
STEPS = ["expand-queries", "retrieve", "dedup", "score-quality", "label-topics", "synthesize-qa", "corrupt",
         "build-mix", "train", "evaluate"]


# -- real text -------------------------------------------------------------------------------
def english_pages(text_dir: Path) -> list[tuple[str, str]]:
    """(relative path, text) of every documentation source, sorted by path."""
    pages = sorted(text_dir.expanduser().rglob("*.txt"))
    if not pages:
        raise SystemExit(f"no *.txt under {text_dir} (cptkit demo-corpus fetches python3.11-doc; or --text-dir DIR)")
    return [(str(p.relative_to(text_dir.expanduser())), p.read_text(errors="replace")) for p in pages]


def chinese_paragraphs() -> list[str]:
    """Paragraphs of real Chinese: the zh_CN gettext translations on this machine, 20 messages each."""
    msgs: list[str] = []
    for mo in sorted(ZH_MO.glob("*.mo")):
        try:
            with mo.open("rb") as fh:
                cat = gettext.GNUTranslations(fh)._catalog  # noqa: SLF001
        except Exception:  # noqa: BLE001 - an unreadable catalog is skipped
            continue
        msgs += [v.strip() for k, v in cat.items() if k and isinstance(v, str) and len(v.strip()) > 8]
    return ["".join(msgs[i:i + 20]) for i in range(0, len(msgs), 20)]


def big_text(pages: list[tuple[str, str]], zh: list[str], n_chars: int) -> str:
    """``n_chars`` characters: the English pages' paragraphs with a Chinese one after every tenth, repeated."""
    paras = [p for _, t in pages for p in t.split("\n\n") if p.strip()]
    parts, size, i = [], 0, 0
    while size < n_chars:
        p = paras[i % len(paras)] + "\n\n"
        if zh and i % 10 == 9:
            p += zh[(i // 10) % len(zh)] + "\n\n"
        parts.append(p)
        size += len(p)
        i += 1
    return "".join(parts)[:n_chars]


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


# -- measuring -------------------------------------------------------------------------------
# A small wrapper process starts the step and reports its children's ru_maxrss: a child forked
# from this (large) process would inherit its RSS into ru_maxrss, which survives exec.
WRAPPER = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[2:]); "
           "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
           "sys.exit(r.returncode)")


def measure(argv: list[str], timeout: float, log: Path) -> dict:
    """Run ``cptkit ARGV`` in a fresh child; its exit code, peak RSS (ru_maxrss), tree peak (psutil), wall."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rss_file = log.with_suffix(".maxrss")
    rss_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as err:
        p = psutil.Popen([sys.executable, "-c", WRAPPER, str(rss_file), sys.executable, "-m", "cptkit.cli", *argv],
                         stdout=err, stderr=err, env=env, start_new_session=True)
        tree_peak, timed_out = 0, False
        while p.poll() is None:
            try:  # the step and its descendants, not the wrapper
                tree_peak = max(tree_peak, sum(q.memory_info().rss for q in p.children(recursive=True)))
            except psutil.Error:
                pass
            if time.perf_counter() - t0 > timeout and not timed_out:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
            time.sleep(0.05)
    wall = time.perf_counter() - t0
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    peak = int(rss_file.read_text()) / 1024 if rss_file.exists() else float("nan")
    return {"rc": p.returncode, "peak_mib": peak, "tree_mib": tree_peak / 2**20, "wall_s": wall,
            "timed_out": timed_out, "stderr_lines": len(lines), "last": lines[-1] if lines else ""}


def output_files(out: Path) -> list[str]:
    """Files a refused run left under ``out`` (shards, _SUCCESS, manifests)."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) if out.exists() else []


# -- setup -----------------------------------------------------------------------------------
def setup(work: Path, pages: list[tuple[str, str]], zh: list[str], timeout: float) -> dict:
    """The normal corpus and the models the steps need (built once under ``work/setup``)."""
    s = work / "setup"
    done = s / "done.json"
    if done.exists():
        return json.loads(done.read_text())
    shutil.rmtree(s, ignore_errors=True)
    s.mkdir(parents=True)
    docs = [{"id": f"py{i}", "text": t[:8000], "lang": "en", "source": "python-doc",
             "url": f"https://docs.python.org/3.11/{rel.removesuffix('.rst.txt')}.html"}
            for i, (rel, t) in enumerate(pages[:300]) if len(t) > 400]
    zh_docs = [{"id": f"zh{i}", "text": p, "lang": "zh", "source": "gettext-zh", "url": f"file://{ZH_MO}"}
               for i, p in enumerate(zh[:80])]
    lic = [{"id": f"lic{i}", "text": c, "lang": "en", "source": "licenses", "url": "file:///usr/share/common-licenses"}
           for i, c in enumerate(c for f in sorted(LICENSES.iterdir()) if f.is_file()
                                 for c in f.read_text(errors="replace").split("\n\n") if len(c) > 300)]
    write_jsonl(s / "corpus" / "part-0.jsonl", docs)
    write_jsonl(s / "quality" / "pos.jsonl", docs)
    write_jsonl(s / "quality" / "neg.jsonl", lic[:len(docs)])
    write_jsonl(s / "labels" / "l.jsonl",
                [{**d, "topic": "Computer Science and Engineering"} for d in docs]
                + [{**d, "topic": "Others"} for d in lic]
                + [{**d, "topic": "Computer Science and Engineering" if i % 2 else "Others"} for i, d in enumerate(zh_docs)])
    write_jsonl(s / "queries.jsonl", [{"id": f"q{i}", "text": q} for i, q in enumerate(
        ["how do I read a file line by line", "dictionary comprehension syntax", "asyncio event loop tasks",
         "unicode strings and bytes encoding"])])
    from cptkit.models.tiny import train_bpe_tokenizer

    train_bpe_tokenizer([d["text"] for d in docs + zh_docs], vocab_size=512, out_dir=s / "tok")
    from tests._tiny_llm import cached_tiny_model

    res = {"corpus": str(s / "corpus"), "queries": str(s / "queries.jsonl"), "tok": str(s / "tok"),
           "quality": str(s / "models" / "quality"), "topics": str(s / "models" / "topics"),
           "llm": str(cached_tiny_model()), "lm": str(s / "lm" / "model")}
    for argv in (["score-quality-train", "--positives", s / "quality" / "pos.jsonl", "--negatives",
                  s / "quality" / "neg.jsonl", "--out", res["quality"], "-q"],
                 ["label-topics-train", "--in", s / "labels", "--out", res["topics"], "-q"],
                 ["build-mix", "--in", s / "corpus", "--out", s / "stream", "-q", *mix_args(res["tok"], 200_000)],
                 ["train", "--in", s / "stream", "--out", s / "lm", "-q", *TRAIN]):
        r = measure([str(a) for a in argv], timeout, s / "setup.log")
        if r["rc"] != 0:
            raise SystemExit(f"setup failed: {' '.join(map(str, argv))}\n{(s / 'setup.log').read_text()[-3000:]}")
    done.write_text(json.dumps(res))
    return res


def mix_args(tok: str, chars: int) -> list[str]:
    """One English domain; a budget of about a quarter of the text's characters (under one pass)."""
    return [f"tokenizer={tok}", "mix=demo", "mix.domains=[{name:en,filter:{lang:en}}]",
            "mix.stages=[{name:main,weights:{en:1}}]", "mix.fill=en", "mix.seq_len=64", "mix.eval_docs=0",
            f"mix.budget_tokens={max(2000, chars // 4)}"]


TRAIN = ["model=tiny_llama", "model.hidden=32", "model.layers=2", "model.heads=2", "train.micro_batch=4",
         "train.threads=1", "train.lr=3e-3", "train.warmup=1", "train.max_steps=2"]
LLM = ["llm=transformers", "llm.device=cpu", "llm.num_threads=1", "llm.cache=false", "llm.max_new_tokens=16",
       "llm.temperature=1.0", "llm.top_p=1.0", "llm.batch_size=1"]


def step_argv(step: str, inp: Path, out: Path, env: dict, case_dir: Path, chars: int) -> list[str] | None:
    """The CLI words for ``step`` on the record file ``inp`` (None: needs an input that was not made)."""
    base = ["--out", str(out), "-q"]
    if step == "expand-queries":
        return [step, "--in", str(inp), *base, *LLM, f"llm.model={env['llm']}", "expand.rounds=1",
                "expand.questions_per_seed=1"]
    if step == "retrieve":
        return [step, "--queries", env["queries"], "--corpus", env["corpus"], "--corpus", str(inp.parent),
                *base, "retrieve.top_k=10"]
    if step in ("dedup", "corrupt"):
        return [step, "--in", str(inp), *base]
    if step == "score-quality":
        return [step, "--in", str(inp), *base, f"quality.model={env['quality']}"]
    if step == "label-topics":
        return [step, "--in", str(inp), *base, f"topics.model={env['topics']}"]
    if step == "synthesize-qa":
        return [step, "--in", str(inp), *base, *LLM, f"llm.model={env['llm']}", "synth.min_solution_words=1",
                "synth.max_solution_words=1000"]
    if step == "build-mix":
        return [step, "--in", str(inp), *base, *mix_args(env["tok"], min(chars, LIMIT))]
    if step == "train":
        stream = case_dir / "build-mix"
        return [step, "--in", str(stream), *base, *TRAIN] if (stream / "_SUCCESS").exists() else None
    if step == "evaluate":
        return [step, "--model", env["lm"], "--in", str(inp), *base, "eval.ppl.max_length=256"]
    raise ValueError(step)


# -- main ------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/cptkit-peak-rss"))
    ap.add_argument("--text-dir", type=Path, default=PY_DOC)
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--before", type=Path, help="an earlier run's WORK/results.json: its peaks as a column")
    args = ap.parse_args()
    steps, cases = args.steps.split(","), args.cases.split(",")
    work = args.work.resolve()
    pages, zh = english_pages(args.text_dir), chinese_paragraphs()
    env = setup(work, pages, zh, args.timeout)
    results_file = work / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    small = min(pages, key=lambda p: abs(len(p[1]) - 4000))
    for case in cases:
        n_chars, extra = CASES[case]
        cdir = work / case.replace(" ", "_")
        inp = cdir / "in" / "part-0.jsonl"
        if not inp.exists():
            text = small[1] if not n_chars else big_text(pages, zh, n_chars)
            rec = {"id": "big" if n_chars else "small", "text": text, "lang": "en", "source": "python-doc",
                   "url": "https://docs.python.org/3.11/library/big.html"}
            write_jsonl(inp, [rec])
        size = inp.stat().st_size
        for step in steps:
            out = cdir / step
            shutil.rmtree(out, ignore_errors=True)
            argv = step_argv(step, inp, out, env, cdir, n_chars or len(small[1]))
            key = f"{step}|{case}"
            if argv is None:
                results[key] = {"skipped": "no build-mix stream for this record"}
                print(f"{step:15s} {case:10s} skipped (no stream)", flush=True)
                continue
            r = measure([*argv, *extra], args.timeout, cdir / f"{step}.log")
            r["left"] = output_files(out) if r["rc"] != 0 else []
            r["bytes"], r["chars"], r["argv"] = size, n_chars or len(small[1]), argv + extra
            results[key] = r
            results_file.write_text(json.dumps(results, indent=1))
            print(f"{step:15s} {case:10s} rc={r['rc']} peak={r['peak_mib']:.0f} MiB tree={r['tree_mib']:.0f} MiB "
                  f"wall={r['wall_s']:.1f}s {r['last'][:160] if r['rc'] else ''}", flush=True)
    before = json.loads(args.before.read_text()) if args.before else {}
    report(results, work, args.no_write, before, " ".join(["python bench/peak_rss.py", *sys.argv[1:]]))


def outcome(r: dict, case: str, work: Path) -> str:
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    if r["timed_out"]:
        return "killed: over --timeout"
    if r["rc"] == 0:
        return f"truncated to {LIMIT:,} chars" if "trunc" in case and r["chars"] > LIMIT else "ok"
    one = "one line" if r["stderr_lines"] == 1 else f"{r['stderr_lines']} lines"
    left = f"; left {', '.join(r['left'])}" if r["left"] else "; nothing written"
    return f"refused (exit {r['rc']}, {one}{left}): `{r['last'].replace(str(work), 'WORK')[:220]}`"


def report(results: dict, work: Path, no_write: bool, before: dict, command: str) -> None:
    rows = []
    for step in STEPS:
        base = results.get(f"{step}|small", {})
        for case in CASES:
            r = results.get(f"{step}|{case}")
            if r is None:
                continue
            b = before.get(f"{step}|{case}", {})
            was = "" if not before else (f"{b['peak_mib']:,.0f}" if b.get("peak_mib") == b.get("peak_mib") and "peak_mib" in b
                                         else f"killed, tree {b['tree_mib']:,.0f}" if b.get("timed_out") else "")
            if "skipped" in r:
                rows.append([step, case, "", "", "", "", outcome(r, case, work)] + ([was] if before else []))
                continue
            delta = f"{r['peak_mib'] - base['peak_mib']:+,.0f}" if "peak_mib" in base and case != "small" else ""
            flag = " **over 1 GiB**" if r["peak_mib"] > 1024 and r["rc"] == 0 else ""
            rows.append([step, case, f"{r['peak_mib']:,.0f}{flag}", delta, f"{r['tree_mib']:,.0f}",
                         f"{r['wall_s']:.1f}", outcome(r, case, work)] + ([was] if before else []))
    tbl = table(["step", "record", "peak RSS MiB", "vs small", "tree peak MiB", "wall s", "outcome"]
                + (["peak before MiB"] if before else []), rows)
    print(tbl)
    if no_write:
        return
    over = [f"{k.replace('|', ' on ')} ({r['peak_mib']:,.0f} MiB)" for k, r in results.items()
            if r.get("rc") == 0 and r.get("peak_mib", 0) > 1024]
    fits = [k for k in over if k.split(" on ")[1].split(" (")[0] in ("small", "1M", "5M")]
    body = (__doc__.split("\n", 2)[2].strip() + "\n\n" + tbl + "\n\n"
            + (f"Over 1 GiB: {'; '.join(over)}. " if over else "No step went over 1 GiB. ")
            + ("Of these, a record that fits the limit: " + "; ".join(fits) + ".\n\n" if fits
               else "None of them on a record that fits the reader's limit.\n\n")
            + ("*peak before*: the same run from `--before` (an earlier commit's results); outcomes that differed "
               "then: " + "; ".join(f"{k.replace('|', ' on ')}: "
                                   + ("killed at the time limit" if b.get("timed_out") else f"exit {b['rc']}")
                                   for k, b in before.items() if "rc" in b and k in results
                                   and b["rc"] != results[k].get("rc")) + ".\n\n" if before else "")
            + "Record sizes: small = one page of the Python docs; the 50MB file is "
            f"{results.get('dedup|50MB', {}).get('bytes', 0) / 1e6:,.1f} MB of JSONL. WORK is `--work`.\n")
    write_section("peak_rss", "Peak memory on one huge record (every step)", command, body)


if __name__ == "__main__":
    main()
