#!/usr/bin/env bash
# Builds llama.cpp's own C++ tools -- llama-server (continuous batching, --parallel N), llama-bench,
# llama-batched-bench, llama-cli, llama-quantize -- from the llama.cpp sources vendored in the pinned
# llama-cpp-python sdist (fetched with `pip download`, SHA-256 checked), and leaves the vendored tree's
# Python tools (convert_hf_to_gguf.py, gguf-py) beside them. The peer of bench/compare and the oracle
# of the model-parity fixtures (scripts/make_model_fixtures.py).
#
#   bench/build_llama_cpp.sh [DIR]     prints DIR (default: $TESSERA_PEERS or ~/.cache/tessera/peers/llama.cpp-<pin>)
#
# Idempotent: an existing build of the same pin is reused. AMX is off: llama.cpp's AMX kernels crashed
# on these VMs (bench/requirements.txt), so the ISA flags are explicit instead of -march=native.
set -euo pipefail
PIN=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
DIR=${1:-${TESSERA_PEERS:-$HOME/.cache/tessera/peers}/llama.cpp-$PIN}
JOBS=${JOBS:-2}
TOOLS=(llama-server llama-bench llama-batched-bench llama-cli llama-quantize)

say() { printf '[llama.cpp] %s\n' "$*" >&2; }
built() { for t in "${TOOLS[@]}"; do [ -x "$DIR/build/bin/$t" ] || return 1; done; }

if built && [ -f "$DIR/src/convert_hf_to_gguf.py" ]; then
  echo "$DIR"
  exit 0
fi
mkdir -p "$DIR"
sdist=$DIR/llama_cpp_python-$PIN.tar.gz
if ! echo "$SHA256  $sdist" | sha256sum --check --status 2>/dev/null; then
  say "fetching llama-cpp-python==$PIN (sdist) with pip download"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    --dest "$DIR" "llama-cpp-python==$PIN"
  echo "$SHA256  $sdist" | sha256sum --check --status || { say "sha256 mismatch for $sdist"; exit 1; }
fi
if [ ! -f "$DIR/src/CMakeLists.txt" ]; then
  rm -rf "$DIR/src" "$DIR/unpack"
  mkdir -p "$DIR/unpack"
  tar xzf "$sdist" -C "$DIR/unpack"
  mv "$DIR/unpack/llama_cpp_python-$PIN/vendor/llama.cpp" "$DIR/src"
  rm -rf "$DIR/unpack"
fi
say "building ${TOOLS[*]} with -j$JOBS (several minutes on 2 cores)"
cmake -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >/dev/null
cmake --build "$DIR/build" -j"$JOBS" --target "${TOOLS[@]}" >/dev/null
built || { say "build finished without every tool"; exit 1; }
echo "$DIR"
