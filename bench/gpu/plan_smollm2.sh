#!/usr/bin/env bash
# `make plan-experiment` (mk/plan.mk, docs/plan.md) on one GPU: the same grid (5 replay shares x 2 seeds
# from B0, 8 eval points each), the same pre-registered prediction at 4x the grid's tokens and the unseen
# replay share PLAN_HELD, the same check against the two naive baselines, at >= 1M tokens per grid run:
# ZeRO-2 bf16, 2k-token sequences, 16 steps of 8 x 4 x 2048 tokens = 1.05M tokens per grid run, 4.2M per
# held-out run.
#
#   bash bench/gpu/plan_smollm2.sh smollm2        # B0, the grid, the prediction, its commit, held-out, check
#   STEPS=32 bash bench/gpu/plan_smollm2.sh DIR    # 2.1M tokens per grid run
# MAKE_ARGS passes make options (-j2, VENV=...): bench/gpu/lease.sh.
#
# The prediction (PLAN_PREREG, default conf/plan/prediction_gpu.yaml) is committed by this script, in the
# checkout it runs in, after the grid and before the first held-out run: bring that commit (or the file and
# `git log -1 -- $PLAN_PREREG`) back with the results. Writes $XP/plan/check/check.md and $XP/plan/fit/.
# Not run yet: no GPU was lent when it was written (docs/plan.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:?usage: plan_smollm2.sh MODEL (smollm2, a .gguf or an HF directory)}
DATA=${DATA:-data}
XP=${XP:-$DATA/xp_gpu}
PREREG=${PLAN_PREREG:-conf/plan/prediction_gpu.yaml}
STEPS=${STEPS:-16}; MICRO=${MICRO:-8}; ACCUM=${ACCUM:-4}; B0_STEPS=${B0_STEPS:-8}
EVERY=$(( STEPS / 8 ))
TRAIN="deepspeed=zero2 train.precision=bf16 train.keep_checkpoints=false train.micro_batch=$MICRO \
train.grad_accum=$ACCUM train.lr=${LR:-2e-5} train.warmup=0.05 train.eval_docs=64 train.eval_max_tokens=2048 \
train.mixture=staged"
B0="deepspeed=zero2 train.precision=bf16 train.micro_batch=$MICRO train.grad_accum=$ACCUM train.lr=${LR:-2e-5} \
train.warmup=0.05 train.eval_every=2 train.eval_docs=64 train.eval_max_tokens=2048 train.max_steps=$B0_STEPS seed=0"
B0_MIX="mix=b0 mix.seq_len=2048 mix.budget_tokens=6e5 mix.max_epochs=2 mix.eval_docs=64"
MIX="mix=demo_smollm2 mix.seq_len=2048 mix.eval_docs=64"
ARGS=(DATA="$DATA" XP="$XP" BASE_MODEL="$MODEL" B0_STEPS="$B0_STEPS" B0_ARGS="$B0" B0_MIX="$B0_MIX" MIX="$MIX"
      STEP_TOKENS=$(( MICRO * ACCUM * 2048 )) PLAN_STEPS="$STEPS" PLAN_EVERY="$EVERY" PLAN_TRAIN_ARGS="$TRAIN"
      PLAN_PREREG="$PREREG")
# shellcheck disable=SC2086
make plan-predict ${MAKE_ARGS:-} "${ARGS[@]}"
if ! { git ls-files --error-unmatch "$PREREG" >/dev/null 2>&1 && git diff --quiet HEAD -- "$PREREG"; }; then
  git add "$PREREG"
  git -c user.name="${GIT_AUTHOR_NAME:-cptkit plan}" -c user.email="${GIT_AUTHOR_EMAIL:-plan@localhost}" \
    commit -q -m "plan: pre-registered prediction of the GPU plan-experiment ($PREREG), before its held-out runs" \
    -- "$PREREG"
fi
# shellcheck disable=SC2086
make plan-experiment ${MAKE_ARGS:-} "${ARGS[@]}"
