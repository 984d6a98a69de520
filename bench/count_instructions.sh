#!/usr/bin/env bash
# Instructions per multiply-accumulate of the CPU matmul kernels, counted by valgrind (callgrind), which
# does not depend on the machine's load: the measure we compare kernels by on a shared machine.
# valgrind has no AVX-512 / AVX-VNNI, so only the scalar and avx2 tables can be counted.
#
#   bench/count_instructions.sh [BENCH_BINARY] [TABLE] [TYPES] [ROWS] [COLS]
#     defaults: build/bin/bench_cpu_kernels avx2 "F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K" 64 4096
#
# Prints per type and layout (stored: matmul_q on the rows as stored; packed: matmul_packed) the
# instructions per MAC of one decode-shaped (1 token) and one prefill-shaped (64 tokens) call, counting
# only inside the matmul functions (--toggle-collect).
set -euo pipefail
BIN=${1:-build/bin/bench_cpu_kernels}
TABLE=${2:-avx2}
TYPES=${3:-"F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K Q4_K Q5_K Q6_K"}
ROWS=${4:-64}
COLS=${5:-4096}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
count() {  # type shape layout -> instructions of one call
  # The tables' entry points only: --toggle-collect toggles at every matching function, so a nested
  # match (matmul_q_simd -> matmul_q_typed<..>) would switch collection off again.
  valgrind --tool=callgrind --callgrind-out-file="$tmp/out" --toggle-collect='*matmul_q_simd*' \
    --toggle-collect='*matmul_packed_v<*' --toggle-collect='*matmul_f32_simd*' --toggle-collect='*matmul_q_scalar*' \
    --toggle-collect='*matmul_packed_scalar*' --toggle-collect='*matmul_f32_scalar*' \
    "$BIN" --types --rows "$ROWS" --cols "$COLS" --kernels "$TABLE" --only "$1" --shape "$2" --layout "$3" \
    --working-set 1 --count --roofline-gbs 1 >/dev/null 2>"$tmp/err"
  grep -o 'Collected : [0-9]*' "$tmp/err" | awk '{print $3}'
}
printf '%-5s %-7s %14s %14s\n' type layout "decode ins/MAC" "prefill ins/MAC"
for t in $TYPES; do
  layouts="stored packed"
  case $t in F32|F16|BF16) layouts=stored ;; esac
  for l in $layouts; do
    d=$(count "$t" decode "$l")
    p=$(count "$t" prefill "$l")
    awk -v t="$t" -v l="$l" -v d="$d" -v p="$p" -v r="$ROWS" -v c="$COLS" \
      'BEGIN { printf "%-5s %-7s %14.3f %14.3f\n", t, l, d / (r * c), p / (64 * r * c) }'
  done
done
