#!/usr/bin/env bash
# Assembles build-gpu-pack/: what scripts/gpu-check.sh needs on a GPU machine that has the CUDA 13
# toolkit and driver but none of Tessera's other dependencies (Boost, CAF, simdjson, xxHash, toml++,
# GoogleTest), small enough for a device call's 64 MiB carry limit:
#   tools.tar.xz, unpacked by gpu-check.sh into
#     bin/   the GPU test executables, gpu_attention_bench, gpu_sampling_bench, gpu_gemv_bench, gpu_quantized_gemv_bench and
#            `tessera`, stripped
#     lib/   the shared libraries they load that are not glibc, libstdc++/libgcc or CUDA (from ldd);
#            gpu-check.sh puts this folder on LD_LIBRARY_PATH
#   models/  the default model cut to its first $TESSERA_PACK_LAYERS (default 4) layers, or fewer when
#            the carry would not fit: real weights and tokenizer, fewer layers (the whole file is
#            94 MiB; its embedding alone ~30 MiB)
# bench/models, bench/workloads and tests/data (the tiny per-architecture fixtures, ~21 MiB) travel with
# the working tree, so they are not copied; the tree counts against the 64 MiB too.
# The folder matches .gitignore's /build*/: name it in the device call's `carry`.
#
# Usage: scripts/gpu-pack.sh [BUILD_DIR]   (default build-gpu, configured with -DTESSERA_CUDA=on; with
#        -DTESSERA_CUDA_ARCHITECTURES=90-real the executables carry sm_90 code without PTX: 15 MiB of
#        tools instead of 21, since each test binary has its own copy of the kernels)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu}
pack=$root/build-gpu-pack
layers=${TESSERA_PACK_LAYERS:-4}
model=${TESSERA_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}

grep -q '^TESSERA_CUDA_ARCHITECTURES' "$build/CMakeCache.txt" 2>/dev/null ||
  { echo "gpu-pack: $build is not a configured build (cmake -S . -B $build -DTESSERA_CUDA=on)" >&2; exit 1; }
targets=(gpu_kernels_test gpu_prefill_attention_test gpu_sampling_test gpu_cuda_executor_test gpu_gemv_test gpu_mma_test
         gpu_fp8_kv_test gpu_quantized_gemm_test gpu_overlapped_steps_test gpu_attention_bench gpu_sampling_bench gpu_gemv_bench gpu_quantized_gemv_bench tessera)
echo "gpu-pack: building ${targets[*]} in $build"
cmake -S "$root" -B "$build" >/dev/null  # re-configure: a test file added since makes a new target
cmake --build "$build" -j"${TESSERA_JOBS:-2}" --target "${targets[@]}"

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib" "$pack/models"
cp "$build/tests/gpu_kernels_test" "$build/tests/gpu_prefill_attention_test" "$build/tests/gpu_sampling_test" \
  "$build/tests/gpu_cuda_executor_test" "$build/tests/gpu_gemv_test" "$build/tests/gpu_mma_test" \
  "$build/tests/gpu_fp8_kv_test" "$build/tests/gpu_quantized_gemm_test" "$build/tests/gpu_overlapped_steps_test" \
  "$build/bin/gpu_attention_bench" "$build/bin/gpu_sampling_bench" "$build/bin/gpu_gemv_bench" "$build/bin/gpu_quantized_gemv_bench" "$build/bin/tessera" \
  "$pack/bin/"
strip --strip-all "$pack"/bin/*

# Shared libraries to carry: everything ldd resolves except the C/C++ runtime (present everywhere)
# and CUDA's own (the device machine's toolkit provides the matching ones).
for exe in "$pack"/bin/*; do
  ldd "$exe" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnvidia*) ;;
    *) cp -L "$lib" "$pack/lib/" ;;
  esac
done
strip --strip-unneeded "$pack"/lib/*.so* 2>/dev/null || true

# Executables and libraries compress about 3x (the model, quantized, does not): one archive, which
# gpu-check.sh unpacks on the device machine.
tar -C "$pack" -cJf "$pack/tools.tar.xz" bin lib
rm -rf "$pack/bin" "$pack/lib"

# What the model may take: 64 MiB less the working tree (tracked and untracked files git does not
# ignore: what the device call copies), the archive and a 1 MiB margin.
tree_bytes=$(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
budget=$((64 * 1024 * 1024 - tree_bytes - $(stat -c %s "$pack/tools.tar.xz") - 1024 * 1024))
echo "gpu-pack: working tree $((tree_bytes / 1024 / 1024)) MiB; $((budget / 1024 / 1024)) MiB left for the model"

# The real model, its first layers (at most $layers, as many as the budget allows; llama.block_count
# rewritten), through gguf-py.
python3 - "$model" "$pack/models" "$layers" "$budget" <<'PY'
import sys
import gguf
src, out_dir, most, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
r = gguf.GGUFReader(src)
arch = r.fields["general.architecture"].contents()
def kept(name, keep):
    return not name.startswith("blk.") or int(name.split(".")[1]) < keep
import os
def size(keep):  # tensor bytes
    return sum(int(t.data.nbytes) for t in r.tensors if kept(t.name, keep))
# The metadata (mostly the tokenizer) and alignment on top, at most the source file's.
meta = os.path.getsize(src) - size(1 << 30)
keep = most
while keep > 1 and size(keep) + meta > budget:
    keep -= 1
if size(keep) + meta > budget:
    # The embedding alone is most of a layer's cut; with the tiny fixtures of tests/data in the tree
    # (~21 MiB) and the tools, even one layer is over the carry limit: the pack goes without the
    # model, and the real-model parity tests on the device skip (the fixtures still run).
    print(f"gpu-pack: even 1 layer ({(size(1) + meta) >> 20} MiB) is over the {budget >> 20} MiB left: "
          "no model in the pack (the real-model device tests will skip)", file=sys.stderr)
    sys.exit(0)
print(f"gpu-pack: model cut to {keep} layers (~{(size(keep) + meta) >> 20} MiB)")
dst = f"{out_dir}/default-{keep}layers.gguf"
w = gguf.GGUFWriter(dst, arch)
for f in r.fields.values():
    if f.name.startswith("GGUF.") or f.name == "general.architecture":
        continue
    t = f.types[0]
    value = keep if f.name == f"{arch}.block_count" else f.contents()
    sub = f.types[-1] if t == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(f.name, value, t, sub_type=sub)
tensors = [t for t in r.tensors if kept(t.name, keep)]
for t in tensors:
    w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
for t in tensors:
    w.write_tensor_data(t.data)
w.close()
PY

du -sh "$pack"/* | sed 's/^/gpu-pack: /'
total=$(du -sm "$pack" | cut -f1)
echo "gpu-pack: $pack is ${total} MiB, the working tree $((tree_bytes / 1024 / 1024)) MiB (a device call carries at most 64 MiB in all)"
[ $((total + tree_bytes / 1024 / 1024)) -lt 64 ] || echo "gpu-pack: WARNING: too large to carry" >&2
