#!/usr/bin/env bash
# Byte-identity of step outputs between a git ref and the working tree, on the demo's data.
#
#   bash scripts/compare_outputs.sh REF [DATA]      (DATA: a `make demo` data/ dir, default data)
#
# Runs, with the code of REF and with the working tree: score-quality (with and without
# quality.min_score), label-topics, corrupt (ratio 0.3 and 0), build-mix (demo_cpt, demo_cpt
# without replay, upsample_tail, a split_by recipe) and train (tiny Llama: static, 3+3 steps
# resumed, Velocitune). Then compares every data file byte for byte, and manifests, metrics and
# weight logs as JSON without their timing fields. Exit 1 on any difference.
set -euo pipefail
REF=${1:?usage: compare_outputs.sh REF [DATA]}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=$(cd "${2:-$ROOT/data}" && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cptkit-compare-XXXX")
trap 'git -C "$ROOT" worktree remove --force "$WORK/ref" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git -C "$ROOT" worktree add --detach "$WORK/ref" "$REF" >/dev/null

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
  $c build-mix --in "$DATA/labelled" --out "$out/mix_tail" mix=upsample_tail tokenizer=smollm2 -q
  $c build-mix --in "$DATA/labelled" --out "$out/mix_split" mix=demo tokenizer=smollm2 \
    'mix.domains=[{name:t,split_by:topic}]' 'mix.stages=[{name:s,weights:{t:1}}]' mix.fill=null mix.budget_tokens=200000 -q
  local tr="model=tiny_llama train.micro_batch=2 train.threads=2 train.plot=false -q"
  $c train --in "$out/mix_tail" --out "$out/train_static" $tr train.max_steps=6 train.save_every=3 train.eval_every=3
  $c train --in "$out/mix_tail" --out "$out/train_resumed" $tr train.max_steps=3 train.save_every=3 train.eval_every=3
  $c train --in "$out/mix_tail" --out "$out/train_resumed" $tr train.max_steps=6 train.save_every=3 train.eval_every=3 train.resume=true
  $c train --in "$out/mix_cpt" --out "$out/train_velo" $tr train.max_steps=6 train.mixture=velocitune \
    train.velocitune.interval_steps=2 'train.velocitune.targets={domain:3.0,general:3.0,synthetic:3.0}'
}

echo "running $REF ..." >&2
(run "$WORK/ref" "$WORK/a")
echo "running the working tree ..." >&2
(run "$ROOT" "$WORK/b")
"$PY" - "$WORK/a" "$WORK/b" <<'EOF'
import json, sys
from pathlib import Path

a, b = Path(sys.argv[1]), Path(sys.argv[2])
TIMING = {"seconds", "cpu_seconds", "tokens_per_s", "timings", "run s", "data loader s", "mixture eval+update s",
          "tokens/s", "records/s", "read+tokenize s", "tokenize tokens/s", "data+mixture share of step time",
          "seconds_last_run", "started", "finished", "seconds_tasks"}

def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in TIMING and not k.endswith(" s")}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x

def text(p):  # the two output roots differ: compare paths under them as "OUT"
    return p.read_text().replace(str(a), "OUT").replace(str(b), "OUT")

def jsonl(p):
    return [strip(json.loads(line)) for line in text(p).splitlines() if line.strip()]

same = diff = 0
for fa in sorted(p for p in a.rglob("*") if p.is_file()):
    rel = fa.relative_to(a)
    if rel.parts[1:2] in (("checkpoints",), ("tensorboard",), (".cptkit",)) or rel.name in ("config.json",):
        continue
    fb = b / rel
    if not fb.exists():
        print(f"missing in the working tree: {rel}")
        diff += 1
        continue
    if rel.name == "_manifest.json":
        ma, mb = (strip(json.loads(text(f))) for f in (fa, fb))
        for m in (ma, mb):
            m.pop("config", None), m.pop("version", None)
        ok = ma == mb
    elif rel.suffix == ".jsonl" and rel.parent.name.startswith("train_"):
        ok = jsonl(fa) == jsonl(fb)
    else:
        ok = fa.read_bytes() == fb.read_bytes()
    same += ok
    diff += not ok
    if not ok:
        print(f"DIFFERENT: {rel}")
print(f"{same} files identical, {diff} different")
sys.exit(1 if diff else 0)
EOF
