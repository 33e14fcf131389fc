#!/usr/bin/env bash
# The CPT experiment v3 of `make cpt-experiment` (B0, then the arms noreplay, replay, noreplay_tm, neutral,
# replay_b0text, self, self_kl and the merge-back of noreplay at three alphas x five seeds;
# conf/cpt/claims_v3.yaml decides the claims, cpt-pareto.png draws domain gain against forgetting) on
# one GPU: SmolLM2-135M (the shipped GGUF, dequantized; or any Llama-family HF directory) re-adapted to
# B0, then continued with DeepSpeed ZeRO-2 in bf16, at >= 1M tokens per arm, from weights on local disk.
#
#   bash bench/gpu/cpt_smollm2.sh smollm2                           # the experiment, GPU-sized
#   TOY=1 bash bench/gpu/cpt_smollm2.sh /tmp/tiny-llama             # the same path on CPU, toy size
#   STEPS=32 bash bench/gpu/cpt_smollm2.sh DIR                       # 2M tokens per arm
# MAKE_ARGS passes make options (-j3, -o data/labelled/_SUCCESS, VENV=...): bench/gpu/lease.sh.
# Not yet run at v3 (docs/cpt.md, "v3 on a GPU"): its time is an estimate.
#
# Writes $XP/cpt.md (the table and the claims), $XP/cpt-curves.png and $XP/cpt-pareto.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: cpt_smollm2.sh MODEL (smollm2, a .gguf or an HF directory)}
DATA=${DATA:-data}
XP=${XP:-$DATA/xp_gpu}
SEEDS=${SEEDS:-0 1 2 3 4}
if [ "${TOY:-0}" = 1 ]; then   # CPU, fp32, a handful of steps: proves the path, measures nothing
  STEPS=4; B0_STEPS=6  # one torch thread: the tests run it beside another test (pytest -n 2)
  TRAIN="train.micro_batch=2 train.lr=1e-4 train.warmup=0 train.threads=1 train.precision=fp32 train.keep_checkpoints=false \
train.eval_every=1 train.eval_docs=2 train.eval_max_tokens=64"
  B0="$TRAIN train.max_steps=$B0_STEPS seed=0"
  MIX="mix=demo_smollm2 mix.seq_len=64 mix.eval_docs=4"
  TASKS="eval.data_dir=$PWD/tests/fixtures/eval"  # COPA's 3 offline items: 2 drawn per seed
  EVAL="eval.tasks=[copa] eval.limit=2 $TASKS eval.ppl.group_by=domain eval.ppl.max_length=64 eval.ppl.max_tokens=64 \
eval.ppl.max_docs_per_group=4"
  B0_MIX="mix=b0 mix.budget_tokens=2048 mix.seq_len=64 mix.eval_docs=4"
  SIZES=(PROBE_DOCS=4 XP_PROBE_DOCS=4 PROBE_TOKENS=16 HELDOUT_DOCS=4 SELF_DOCS=12 SELF_TOKENS=16 CPT_TASK=copa
         "CONTAM_ARGS=$TASKS" STEP_TOKENS=128 "XP_MACHINE=toy size on the CPU")  # each arm's stream: steps x 2 x 64 tokens
else                          # one GPU: ZeRO-2 bf16, 2k-token sequences, 16 x 8 x 4 x 2048 = 1.05M tokens per arm
  STEPS=${STEPS:-16}; MICRO=${MICRO:-8}; ACCUM=${ACCUM:-4}; B0_STEPS=${B0_STEPS:-8}
  TRAIN="deepspeed=zero2 train.precision=bf16 train.keep_checkpoints=false train.micro_batch=$MICRO \
train.grad_accum=$ACCUM train.lr=${LR:-2e-5} train.warmup=0.05 train.eval_every=$(( STEPS / 4 )) \
train.eval_docs=64 train.eval_max_tokens=2048"   # 5 points: before step 1 and every quarter
  B0="${TRAIN/train.eval_every=$(( STEPS / 4 ))/train.eval_every=2} train.max_steps=$B0_STEPS seed=0"
  B0_MIX="mix=b0 mix.seq_len=2048 mix.budget_tokens=6e5 mix.max_epochs=2 mix.eval_docs=64"  # 8 steps: 0.5M tokens
  MIX="mix=demo_smollm2 mix.seq_len=2048 mix.eval_docs=64"  # each arm's stream: its steps x STEP_TOKENS (Makefile)
  EVAL="eval.tasks=[wordnet_defs] eval.limit=200 eval.shots=0 eval.ppl.group_by=domain eval.ppl.max_length=2048 \
eval.ppl.max_tokens=2048 eval.ppl.max_docs_per_group=64 eval.batch_size=16"
  # self replay: 20% of 1.05M tokens = 210k tokens of B0's samples, 256 texts of 1,024 tokens (262k)
  SIZES=(PROBE_DOCS=64 XP_PROBE_DOCS=64 PROBE_TOKENS=512 HELDOUT_DOCS=64 SELF_DOCS=256 SELF_TOKENS=1024
         STEP_TOKENS=$(( MICRO * ACCUM * 2048 )) "XP_MACHINE=one GPU (${GPU_NAME:-H100}), ZeRO-2 bf16")
fi
# shellcheck disable=SC2086
make cpt-experiment ${MAKE_ARGS:-} DATA="$DATA" XP="$XP" BASE_MODEL="$MODEL" XP_SEEDS="$SEEDS" \
  CPT_STEPS="$STEPS" B0_STEPS="$B0_STEPS" TRAIN_ARGS="$TRAIN" B0_ARGS="$B0" B0_MIX="$B0_MIX" MIX="$MIX" EVAL_ARGS="$EVAL" \
  "${SIZES[@]}"
