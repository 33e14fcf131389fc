#!/usr/bin/env bash
# What `bench/gpu/lease.sh vllm` needs on a lent GPU machine that has torch 2.11 + CUDA and no network,
# packed here (PyPI reachable) into .dev/part_* pieces that fit the device tool's 64 MiB per call:
#   vllm.tar.xz   vLLM 0.25.1 (the last release built for torch 2.11) without what a dense model on a
#                 Hopper GPU never loads: FlashAttention 2 (FA3 is used on sm90), the MoE kernels, the
#                 vendored DeepGEMM / FMHA sources and the Rust front end (251 MB wheel -> ~70 MB; its
#                 third_party/pynvml.py is kept: the CUDA platform is detected through it). FlashInfer is
#                 not carried: lease.sh sets VLLM_USE_FLASHINFER_SAMPLER=0 (PyTorch top-p/top-k sampling)
#   deps.tar.xz   the packages vLLM imports that the device image lacks (found by importing vLLM's engine,
#                 worker and model modules with only the image's packages on the path), versions as pip
#                 resolves them for vLLM 0.25.1; xgrammar without its static library
#   lcpp.tar.xz   this checkout's llama-cpp-python build (.venv), for the llama.cpp rows on the GPU machine's CPUs
#   cdeps.tar.xz  cptkit's own imports for expand-queries missing there (hydra-core, omegaconf, antlr4, diskcache)
#   the embedded SmolLM2-135M-Instruct GGUF
#
#   bash bench/gpu/vllm_payload.sh [PIECE_MB]    # then: one `lease.sh stash` call per piece but the last,
#                                                #       `lease.sh vllm` with the last (.dev/ holds one piece per call)
set -euo pipefail
cd "$(dirname "$0")/../.."
PIECE=${1:-58}
W=${VLLM_PAYLOAD_WORK:-/tmp/vllm_payload}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$W/whl" "$W/pack" .dev
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp)
for n in 17 24 26 27 28 31 34 35; do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
DEPS="annotated-types==0.8.0 cachetools==8.0.2 cbor2==6.3.0 fastapi==0.136.3 httpcore2==2.16.2 httpx2==2.16.2
llguidance==1.7.6 msgspec==0.22.0 openai==3.57.0 openai-harmony==0.0.8 partial-json-parser==0.2.1.1.post7
pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 sniffio==1.3.1 starlette==1.10.0 truststore==0.10.5
apache-tvm-ffi==0.1.9 typing-inspection==0.4.5 xgrammar==0.2.5.post1 pyzmq==27.3.0 setproctitle==1.3.8
depyf==0.20.0 astor==0.8.1 dill==0.4.1 gguf==0.19.0"
for p in vllm==0.25.1 $DEPS; do
  python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$W/whl" "$p" 2>&1 | grep -v WARNING || true
done
rm -rf "$W/vllm" "$W/deps" && mkdir -p "$W/vllm" "$W/deps"
unzip -q "$W"/whl/vllm-0.25.1-*.whl -d "$W/vllm" -x 'vllm/third_party/deep_gemm/*' 'vllm/third_party/fmha_sm100/*' \
  'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' \
  'vllm/_moe_C_stable_libtorch.abi3.so' 'vllm/vllm-rs'
for w in "$W"/whl/*.whl; do case $w in */vllm-*) ;; *) unzip -q -o "$w" -d "$W/deps" ;; esac; done
rm -f "$W"/deps/xgrammar/lib/*.a
tar cf - -C "$W/vllm" . | xz -T0 -6 >"$W/pack/vllm.tar.xz"
tar cf - -C "$W/deps" . | xz -T0 -6 >"$W/pack/deps.tar.xz"
SP=$($PY -c "import llama_cpp, os; print(os.path.dirname(os.path.dirname(llama_cpp.__file__)))")
tar cf - -C "$SP" --exclude=__pycache__ llama_cpp | xz -T0 -6 >"$W/pack/lcpp.tar.xz"
rm -rf "$W/cdeps" && python3 -m pip install -q --no-deps --target "$W/cdeps" hydra-core==1.3.8 omegaconf==2.3.1 \
  antlr4-python3-runtime==4.9.3 diskcache==5.6.3 2>&1 | grep -v WARNING || true
tar cf - -C "$W/cdeps" . | xz -T0 -6 >"$W/pack/cdeps.tar.xz"
cp "$($PY -c "from cptkit.llm.hf import embedded_model_path; print(embedded_model_path())")" "$W/pack/"
rm -f .dev/part_*
tar cf - -C "$W/pack" . | split -b "${PIECE}M" - .dev/part_
ls -la "$W/pack" .dev/part_*
