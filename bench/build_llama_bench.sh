#!/usr/bin/env bash
# Build llama.cpp's own `llama-bench` from the llama.cpp that llama-cpp-python vendors, so
# bench/generate.py can compare cptkit's generation with llama.cpp's native numbers on the same
# code. CPU only, native flags (as pip builds llama-cpp-python), Release; only the llama-bench
# target. Idempotent: an existing binary is reused (prints its path and exits).
#
#   bench/build_llama_bench.sh            # -> $CPTKIT_CACHE/llama-bench/<version>/bin/llama-bench
#   LLAMA_CPP_PYTHON=0.3.36 JOBS=2 bench/build_llama_bench.sh
#
# Needs cmake >= 3.21, a C++17 compiler and pip (downloads the sdist from PyPI once).
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON:-0.3.36}"
JOBS="${JOBS:-2}"
CACHE="${CPTKIT_CACHE:-$HOME/.cache/cptkit}"
ROOT="$CACHE/llama-bench/$VERSION"
BIN="$ROOT/build/bin/llama-bench"
PYTHON="${PYTHON:-python3}"
CMAKE="${CMAKE:-$(command -v cmake || echo /usr/bin/cmake)}"

if [ -x "$BIN" ]; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$ROOT"
SDIST="$ROOT/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$ROOT" >&2
fi
SRC="$ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -d "$SRC" ] || tar xzf "$SDIST" -C "$ROOT"
"$CMAKE" -S "$SRC" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF >&2
"$CMAKE" --build "$ROOT/build" --config Release --target llama-bench -j "$JOBS" >&2
echo "$BIN"
