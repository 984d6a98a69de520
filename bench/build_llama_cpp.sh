#!/usr/bin/env bash
# Builds llama.cpp's own C++ tools -- llama-server (continuous batching, --parallel N), llama-bench,
# llama-batched-bench, llama-cli, llama-quantize -- from the llama.cpp sources vendored in the pinned
# llama-cpp-python sdist (fetched with `pip download`, SHA-256 checked), and leaves the vendored tree's
# Python tools (convert_hf_to_gguf.py, gguf-py) beside them. The peer of bench/compare and the oracle
# of the model-parity fixtures (scripts/make_model_fixtures.py).
#
#   bench/build_llama_cpp.sh [DIR]     prints DIR (default: $TESSERA_PEERS or ~/.cache/tessera/peers/llama.cpp-<pin>)
#
# Idempotent: an existing build of the same pin on the same CPU is reused. AMX is off: llama.cpp's AMX kernels crashed
# on these VMs (bench/requirements.txt), so the ISA flags are set one by one from /proc/cpuinfo instead
# of -march=native.
set -euo pipefail
PIN=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
DIR=${1:-${TESSERA_PEERS:-$HOME/.cache/tessera/peers}/llama.cpp-$PIN}
JOBS=${JOBS:-2}
TOOLS=(llama-server llama-bench llama-batched-bench llama-cli llama-quantize)

say() { printf '[llama.cpp] %s\n' "$*" >&2; }
built() { for t in "${TOOLS[@]}"; do [ -x "$DIR/build/bin/$t" ] || return 1; done; }

# A build is reused on the CPU it was made for (the ISA flags below follow the CPU; a home directory
# can move between machines of different kinds).
CPU_STAMP="$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)"
if built && [ -f "$DIR/src/convert_hf_to_gguf.py" ] && [ "$(cat "$DIR/build/cpu-stamp" 2>/dev/null)" = "$CPU_STAMP" ]; then
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
# Each ISA flag on where this CPU has the instructions (/proc/cpuinfo), AMX always off. Fixed flags built
# AVX-VNNI code that an AVX-512 CPU without AVX-VNNI (AMD Zen 4) stopped on with an illegal instruction.
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
isa() {  # isa GGML_OPTION cpuinfo-flag
  case "$cpu_flags" in *" $2 "*) echo "-D$1=ON" ;; *) echo "-D$1=OFF" ;; esac
}
ISA_FLAGS=("$(isa GGML_AVX avx)" "$(isa GGML_AVX2 avx2)" "$(isa GGML_FMA fma)" "$(isa GGML_F16C f16c)"
  "$(isa GGML_BMI2 bmi2)" "$(isa GGML_AVX_VNNI avx_vnni)" "$(isa GGML_AVX512 avx512f)"
  "$(isa GGML_AVX512_VBMI avx512vbmi)" "$(isa GGML_AVX512_VNNI avx512_vnni)" "$(isa GGML_AVX512_BF16 avx512_bf16)")
say "building ${TOOLS[*]} with -j$JOBS (several minutes on 2 cores): ${ISA_FLAGS[*]}"
cmake -S "$DIR/src" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON \
  -DGGML_NATIVE=OFF "${ISA_FLAGS[@]}" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF >/dev/null
cmake --build "$DIR/build" -j"$JOBS" --target "${TOOLS[@]}" >/dev/null
built || { say "build finished without every tool"; exit 1; }
echo "$CPU_STAMP" >"$DIR/build/cpu-stamp"
echo "$DIR"
