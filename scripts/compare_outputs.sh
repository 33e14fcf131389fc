#!/usr/bin/env bash
# Byte-identity of step outputs between a git ref and the working tree, on the demo's data.
#
#   bash scripts/compare_outputs.sh REF [DATA]      (DATA: a `make demo` data/ dir, default data)
#
# Runs, with the code of REF and with the working tree: score-quality (with and without
# quality.min_score), label-topics, corrupt (ratio 0.3 and 0), build-mix (demo_cpt, demo_cpt
# without replay, upsample_tail, a split_by recipe), train (tiny Llama: static, 3+3 steps
# resumed, Velocitune), dedup of the corpus (in memory and cluster=mapreduce), retrieve-index (2
# shards) + retrieve of the demo's queries, score-quality-train and label-topics-train (small
# tuning grids), evaluate-contamination (gcide_defs, flag), evaluate (perplexity per domain and
# gcide_defs on the tiny trained model) and, with the embedded SmolLM2 (llama.cpp, one thread,
# no completion cache), expand-queries, synthesize-qa (code mode) and label-topics-annotate
# (embedding mode); SKIP_LLM=1 leaves those three out. Then compares every data file byte for
# byte, and manifests, results, statistics, metrics and weight logs as JSON without their timing
# fields. Exit 1 on any difference.
set -euo pipefail
REF=${1:?usage: compare_outputs.sh REF [DATA]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=$(cd "${2:-$ROOT/data}" && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cptkit-compare-XXXX")
trap 'git -C "$ROOT" worktree remove --force "$WORK/ref" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git -C "$ROOT" worktree add --detach "$WORK/ref" "$REF" >/dev/null

# Every step is run below, or named here with why not: a step this script does not know fails it.
NOT_RUN="demo-corpus serve-llm export-gguf merge plan plan-check"  # demo-corpus made $DATA (make demo);
                                             # serve-llm is a server; export-gguf: not compared here yet
                                             # (tests/test_export.py); merge: not compared here yet (tests/test_merge.py);
                                             # plan, plan-check: read finished train runs (tests/test_plan.py)
covered=$(grep -oE '[$]c [a-z][a-z-]*' "$0" | awk '{print $2}' | sort -u)
missing=$(PYTHONPATH=$ROOT "$PY" -c 'from cptkit.core.discovery import step_names; print("\n".join(step_names()))' \
  | grep -vxF -f <(printf '%s\n' $covered $NOT_RUN) || true)
if [ -n "$missing" ]; then
  echo "compare_outputs.sh: step(s) neither run nor in NOT_RUN: $(echo $missing)" >&2
  exit 1
fi

run() {  # run CODE_DIR OUT_DIR
  local code=$1 out=$2
  mkdir -p "$out"
  cd "$DATA/.."
  export PYTHONPATH=$code
  local c="$PY -m cptkit.cli"
  $c score-quality --in "$DATA/deduped" --out "$out/scored" quality.model="$DATA/models/quality" -q
  $c score-quality --in "$DATA/deduped" --out "$out/scored_min" quality.model="$DATA/models/quality" quality.min_score=0.5 -q
  $c label-topics --in "$out/scored" --out "$out/labelled" topics.model="$DATA/models/topics" -q
  $c corrupt --in "$DATA/qa" --out "$out/qa_c30" corrupt.ratio=0.3 -q
  $c corrupt --in "$DATA/qa" --out "$out/qa_c0" corrupt.ratio=0 -q
  local mixin=(--in "$DATA/labelled" --in "$DATA/qa" --in "$DATA/corpus")
  $c build-mix "${mixin[@]}" --out "$out/mix_cpt" mix=demo_cpt tokenizer=smollm2 -q
  $c build-mix "${mixin[@]}" --out "$out/mix_noreplay" mix=demo_cpt tokenizer=smollm2 mix.replay.share=0 -q
  $c build-mix --in "$DATA/corpus" --out "$out/mix_tail" mix=upsample_tail tokenizer=smollm2 mix.budget_tokens=6e6 -q
  $c build-mix --in "$DATA/labelled" --out "$out/mix_split" mix=demo tokenizer=smollm2 \
    'mix.domains=[{name:t,split_by:topic}]' 'mix.stages=[{name:s,weights:{t:1}}]' mix.fill=null mix.budget_tokens=200000 mix.seq_len=128 -q
  local tr="model=tiny_llama train.micro_batch=2 train.threads=2 train.plot=false -q"
  $c train --in "$out/mix_tail" --out "$out/train_static" $tr train.max_steps=6 train.save_every=3 train.eval_every=3
  $c train --in "$out/mix_tail" --out "$out/train_resumed" $tr train.max_steps=3 train.save_every=3 train.eval_every=3
  $c train --in "$out/mix_tail" --out "$out/train_resumed" $tr train.max_steps=6 train.save_every=3 train.eval_every=3 train.resume=true
  $c train --in "$out/mix_cpt" --out "$out/train_velo" $tr train.max_steps=6 train.mixture=velocitune \
    train.velocitune.interval_steps=2 'train.velocitune.targets={domain:3.0,general:3.0,synthetic:3.0}'
  $c dedup --in "$DATA/corpus" --out "$out/dedup" -q
  $c dedup --in "$DATA/corpus" --out "$out/dedup_mr" dedup.cluster=mapreduce dedup.partitions=4 -q
  $c retrieve-index --corpus "$DATA/corpus" --out "$out/index" retrieve.shards=2 -q
  # paths under $out that are part of a config (retrieve.index, eval.model) are given relative to it:
  # the config hash in the manifest covers them, and the two runs' $out differ
  (cd "$out" && $c retrieve --queries "$DATA/queries" --index index --out retrieved retrieve.top_k=200 -q)
  local grid=("train.tune.lr=[0.5]" "train.tune.char_ngrams=[[0,0]]")  # 2 candidates (word_ngrams 1, 2)
  $c score-quality-train --positives "$DATA/corpus/part-0000[01]-*" --negatives "$DATA/corpus/part-00002-*" \
    --out "$out/quality" train.max_per_class=1500 "train.tune.epoch=[10]" "${grid[@]}" -q
  $c label-topics-train --in "$DATA/topic_labels" --out "$out/topics" "train.tune.epoch=[20]" "${grid[@]}" -q
  $c evaluate-contamination --in "$DATA/deduped" --out "$out/contam" "eval.tasks=[gcide_defs]" eval.action=flag -q
  (cd "$out" && $c evaluate --model train_static/model --in "$DATA/xp/stream_r0_s0/_eval.jsonl.gz" --out eval \
    eval.ppl.group_by=domain eval.ppl.max_docs_per_group=8 eval.ppl.max_length=128 eval.ppl.max_tokens=128 \
    "eval.tasks=[gcide_defs]" eval.limit=20 eval.shots=0 -q)
  if [ "${SKIP_LLM:-0}" != 1 ]; then  # the Makefile demo's model, deterministic on one thread
    local llm="llm.model=smollm2 llm.num_threads=1 llm.cache=false llm.max_new_tokens=64"
    $c expand-queries --in "$DATA/seeds.jsonl" --out "$out/queries" expand.rounds=1 expand.questions_per_seed=1 $llm -q
    $c synthesize-qa --in "$DATA/champ.jsonl" --out "$out/qa" synth.mode=code synth.code.num_problems=2 \
      synth.code.demos=1 synth.code.discipline=mathematics synth.code.min_problem_words=8 \
      synth.code.min_solution_words=15 synth.code.max_solution_words=200 synth.trim_truncated=true $llm -q
    $c label-topics-annotate --in "$DATA/scored" --out "$out/topic_labels" topics.sample=24 -q
  fi
}

echo "running $REF ..." >&2
(run "$WORK/ref" "$WORK/a")
echo "running the working tree ..." >&2
(run "$ROOT" "$WORK/b")
"$PY" - "$WORK/a" "$WORK/b" "$WORK/ref" "$ROOT" <<'EOF'
import json, sys
from pathlib import Path

a, b = Path(sys.argv[1]), Path(sys.argv[2])
code = sys.argv[3:5]  # the two code trees (paths of conf/ files in results)
TIMING = {"seconds", "cpu_seconds", "tokens_per_s", "timings", "run s", "data loader s", "mixture eval+update s",
          "tokens/s", "records/s", "read+tokenize s", "tokenize tokens/s", "data+mixture share of step time",
          "seconds_last_run", "started", "finished", "seconds_tasks", "build_seconds", "generation_seconds"}
# JSON files holding timings or output paths besides their results: compared without them
# what lm-eval's results file says about the run itself (when, how long, on which machine)
LM_EVAL_RUN = ("date", "start_time", "end_time", "total_evaluation_time_seconds", "pretty_env_info",
               "transformers_version", "upper_git_hash", "git_hash")
JSON = {"_manifest.json", "_results.json", "index.json", "_expand_stats.json", "_synth_stats.json"}

def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in TIMING and not k.endswith((" s", "/s"))}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x

def text(p):  # the two output roots differ: compare paths under them as "OUT" (and the code trees as "CODE")
    t = p.read_text().replace(str(a), "OUT").replace(str(b), "OUT")
    return t.replace(code[0], "CODE").replace(code[1], "CODE")

def paths(x, y, at=""):  # the key paths where two JSON values differ (at most 5 printed)
    if isinstance(x, dict) and isinstance(y, dict):
        return [q for k in sorted(set(x) | set(y)) for q in paths(x.get(k), y.get(k), f"{at}.{k}")]
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return [q for i, (u, v) in enumerate(zip(x, y)) for q in paths(u, v, f"{at}[{i}]")]
    return [] if x == y else [f"{at or '.'}: {json.dumps(x)[:80]} != {json.dumps(y)[:80]}"]

def jsonl(p):
    return [strip(json.loads(line)) for line in text(p).splitlines() if line.strip()]

same = diff = 0
for fa in sorted(p for p in a.rglob("*") if p.is_file()):
    rel = fa.relative_to(a)
    if rel.parts[1:2] in (("checkpoints",), ("tensorboard",), (".cptkit",)) or rel.name in ("config.json",):
        continue
    fb = b / rel
    if rel.parent.name == "_lm_eval" and rel.name.startswith("results_"):  # lm-eval names it by the time
        fb = next(iter(sorted(fb.parent.glob("results_*.json"))), fb)
        ma, mb = (strip(json.loads(text(f))) for f in (fa, fb))
        for m in (ma, mb):
            for k in LM_EVAL_RUN:
                m.pop(k, None)
        ok = ma == mb
        same += ok
        diff += not ok
        if not ok:
            print(f"DIFFERENT: {rel}" + "".join(f"\n    {w}" for w in paths(ma, mb)[:5]))
        continue
    if not fb.exists():
        print(f"missing in the working tree: {rel}")
        diff += 1
        continue
    if rel.name in JSON:
        ma, mb = (strip(json.loads(text(f))) for f in (fa, fb))
        for m in (ma, mb):
            m.pop("config", None), m.pop("version", None)
        ok = ma == mb
        why = paths(ma, mb)[:5]
    elif rel.name == "README.md":  # data and model cards name their output directory
        ok = text(fa) == text(fb)
        why = []
    elif rel.suffix == ".jsonl" and rel.parent.name.startswith("train_"):
        ok = jsonl(fa) == jsonl(fb)
        why = []
    else:
        ok = fa.read_bytes() == fb.read_bytes()
        why = []
    same += ok
    diff += not ok
    if not ok:
        print(f"DIFFERENT: {rel}" + "".join(f"\n    {w}" for w in why))
for fb in sorted(p for p in b.rglob("*") if p.is_file()):
    rel = fb.relative_to(b)
    if rel.parent.name == "_lm_eval" and any((a / rel).parent.glob("results_*.json")):
        continue  # paired with the reference's results file above
    if not (a / rel).exists() and rel.parts[1:2] not in (("checkpoints",), ("tensorboard",), (".cptkit",)):
        print(f"only in the working tree: {rel}")
        diff += 1
print(f"{same} files identical, {diff} different")
sys.exit(1 if diff else 0)
EOF
