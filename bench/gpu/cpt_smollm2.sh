#!/usr/bin/env bash
# The CPT experiment of `make cpt-experiment` (three arms x three seeds, README "Continual
# pre-training") on a GPU: a SmolLM2-360M (or any Llama-family HF directory) continued with
# DeepSpeed ZeRO-2 in bf16, from weights on local disk (nothing is downloaded).
#
#   bash bench/gpu/cpt_smollm2.sh /models/SmolLM2-360M            # the experiment, GPU-sized
#   TOY=1 bash bench/gpu/cpt_smollm2.sh /tmp/tiny-llama            # the same path on CPU, toy size
#   BUDGET=2e6 STEPS=32 bash bench/gpu/cpt_smollm2.sh DIR           # smaller: tokens and steps per arm
# MAKE_ARGS passes make options (-j9, -o data/labelled/_SUCCESS, VENV=...): bench/gpu/lease.sh.
#
# Writes $XP/cpt.md (the table with mean ± SE over seeds) and $XP/cpt-curves.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: cpt_smollm2.sh MODEL_DIR}
DATA=${DATA:-data}
XP=${XP:-$DATA/xp_gpu}
if [ "${TOY:-0}" = 1 ]; then   # CPU, fp32, a handful of steps: proves the path, measures nothing
  STEPS=4
  TRAIN="train.micro_batch=2 train.lr=1e-4 train.warmup=0 train.threads=2 train.precision=fp32 \
train.eval_every=2 train.eval_docs=2 train.eval_max_tokens=64"
  MIX="mix=demo_smollm2 mix.budget_tokens=4096 mix.seq_len=64 mix.eval_docs=2"
  EVAL="eval.tasks=[] eval.ppl.group_by=domain eval.ppl.max_length=64 eval.ppl.max_tokens=64 eval.ppl.max_docs_per_group=2"
else                          # one GPU: ZeRO-2 bf16, 2k-token sequences, BUDGET tokens per arm
  BUDGET=${BUDGET:-2e7}; STEPS=${STEPS:-300}; MICRO=${MICRO:-8}; ACCUM=${ACCUM:-4}
  TRAIN="deepspeed=zero2 train.precision=bf16 train.micro_batch=$MICRO \
train.grad_accum=$ACCUM train.lr=${LR:-2e-5} train.warmup=0.05 train.eval_every=$(( STEPS / 6 )) \
train.eval_docs=${EVAL_DOCS:-64} train.eval_max_tokens=2048"
  MIX="mix=demo_smollm2 mix.budget_tokens=$BUDGET mix.seq_len=2048 mix.eval_docs=64"
  EVAL="eval.tasks=[gcide_defs] eval.limit=500 eval.shots=0 eval.ppl.group_by=domain eval.ppl.max_length=2048 \
eval.ppl.max_tokens=2048 eval.ppl.max_docs_per_group=64 eval.batch_size=16"
fi
make cpt-experiment ${MAKE_ARGS:-} DATA="$DATA" XP="$XP" BASE_MODEL="$MODEL" \
  CPT_STEPS="$STEPS" TRAIN_ARGS="$TRAIN" MIX="$MIX" EVAL_ARGS="$EVAL"
