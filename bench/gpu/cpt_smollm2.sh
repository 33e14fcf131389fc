#!/usr/bin/env bash
# The CPT experiment of `make cpt-experiment` (B0, then the noreplay, replay, token-matched and
# neutral arms x five seeds; conf/cpt/claims.yaml decides the claims) on one GPU: SmolLM2-135M
# (the shipped GGUF, dequantized; or any Llama-family HF directory) re-adapted to B0, then continued
# with DeepSpeed ZeRO-2 in bf16, at >= 1M tokens per arm, from weights on local disk.
#
#   bash bench/gpu/cpt_smollm2.sh smollm2                           # the experiment, GPU-sized
#   TOY=1 bash bench/gpu/cpt_smollm2.sh /tmp/tiny-llama             # the same path on CPU, toy size
#   STEPS=32 bash bench/gpu/cpt_smollm2.sh DIR                       # 2M tokens per arm
# MAKE_ARGS passes make options (-j2, -o data/labelled/_SUCCESS, VENV=...): bench/gpu/lease.sh.
#
# Writes $XP/cpt.md (the table and the claims) and $XP/cpt-curves.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: cpt_smollm2.sh MODEL (smollm2, a .gguf or an HF directory)}
DATA=${DATA:-data}
XP=${XP:-$DATA/xp_gpu}
SEEDS=${SEEDS:-0 1 2 3 4}
EXTRA="train.eval_extra=[$XP/probe.jsonl,$DATA/outside]"  # the forgetting curves: the probe and the outside text
if [ "${TOY:-0}" = 1 ]; then   # CPU, fp32, a handful of steps: proves the path, measures nothing
  STEPS=4; B0_STEPS=6  # one torch thread: the tests run it beside another test (pytest -n 2)
  TRAIN="train.micro_batch=2 train.lr=1e-4 train.warmup=0 train.threads=1 train.precision=fp32 train.keep_checkpoints=false \
train.eval_every=2 train.eval_docs=2 train.eval_max_tokens=64"
  B0="$TRAIN train.max_steps=$B0_STEPS seed=0"
  TRAIN="$TRAIN $EXTRA"
  MIX="mix=demo_smollm2 mix.seq_len=64 mix.eval_docs=4"
  EVAL="eval.tasks=[] eval.ppl.group_by=domain eval.ppl.max_length=64 eval.ppl.max_tokens=64 eval.ppl.max_docs_per_group=4"
  B0_MIX="mix=b0 mix.budget_tokens=2048 mix.seq_len=64 mix.eval_docs=4"
  PROBE="PROBE_DOCS=4 PROBE_TOKENS=16 CPT_TASK= STEP_TOKENS=128"  # each arm's stream: its steps x 2 x 64 tokens
else                          # one GPU: ZeRO-2 bf16, 2k-token sequences, 16 x 8 x 4 x 2048 = 1.05M tokens per arm
  STEPS=${STEPS:-16}; MICRO=${MICRO:-8}; ACCUM=${ACCUM:-4}; B0_STEPS=${B0_STEPS:-8}
  TRAIN="deepspeed=zero2 train.precision=bf16 train.keep_checkpoints=false train.micro_batch=$MICRO \
train.grad_accum=$ACCUM train.lr=${LR:-2e-5} train.warmup=0.05 train.eval_every=$(( STEPS / 4 )) \
train.eval_docs=64 train.eval_max_tokens=2048"
  B0="${TRAIN/train.eval_every=$(( STEPS / 4 ))/train.eval_every=2} train.max_steps=$B0_STEPS seed=0"
  TRAIN="$TRAIN $EXTRA"
  B0_MIX="mix=b0 mix.seq_len=2048 mix.budget_tokens=6e5 mix.max_epochs=2 mix.eval_docs=64"  # 8 steps: 0.5M tokens
  MIX="mix=demo_smollm2 mix.seq_len=2048 mix.eval_docs=64"  # each arm's stream: its steps x STEP_TOKENS (Makefile)
  EVAL="eval.tasks=[wordnet_defs] eval.limit=500 eval.shots=0 eval.ppl.group_by=domain eval.ppl.max_length=2048 \
eval.ppl.max_tokens=2048 eval.ppl.max_docs_per_group=64 eval.batch_size=16"
  PROBE="PROBE_DOCS=64 PROBE_TOKENS=512 STEP_TOKENS=$(( MICRO * ACCUM * 2048 ))"
fi
# shellcheck disable=SC2086
make cpt-experiment ${MAKE_ARGS:-} DATA="$DATA" XP="$XP" BASE_MODEL="$MODEL" XP_SEEDS="$SEEDS" \
  CPT_STEPS="$STEPS" B0_STEPS="$B0_STEPS" TRAIN_ARGS="$TRAIN" B0_ARGS="$B0" B0_MIX="$B0_MIX" MIX="$MIX" EVAL_ARGS="$EVAL" $PROBE
