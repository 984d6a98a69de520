#!/usr/bin/env bash
# The batch size above which speculative decoding stops paying (issue 18, docs/speculative.md:
# --speculative-max-batch): offline throughput with and without n-gram speculation at N concurrent
# sequences, N = 1 2 4 8 16, side by side in one run, on the input-grounded workload (where drafts are
# mostly right) and the ShareGPT-like one (where they mostly are not). Speculation is forced on at every
# N (--speculative-max-batch 65536) so that each pair measures what it costs or gains at that N; the
# default is the largest N at which it still pays on both. Timings: run it on a quiet machine.
#
#   bench/speculative_threshold.sh [TESSERA] [THREADS] [MODEL] [K] [SIZES] [WORKLOADS]
#     defaults: build/bin/tessera 2 models/SmolLM2-135M-Instruct.Q4_1.gguf 4 "1 2 4 8 16"
#               "grounded sharegpt_like"
#
# Each run is `tessera bench throughput --max-num-seqs N` over the workload's first 2N requests (all 27
# of the grounded one at N = 16), greedy, ignore_eos: both modes generate the same tokens. Prints one line per workload
# and N: output tok/s off and on, and the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA=${1:-build/bin/tessera}
THREADS=${2:-2}
MODEL=${3:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
K=${4:-4}
SIZES=${5:-1 2 4 8 16}
WORKLOADS=${6:-grounded sharegpt_like}
tps() {
  "$TESSERA" bench throughput --model "$MODEL" --threads "$THREADS" --workload "bench/workloads/$1.jsonl" \
    --num-requests "$2" --max-num-seqs "$3" --speculative "$4" --num-speculative-tokens "$K" \
    --speculative-max-batch 65536 --quiet | python3 -c 'import json,sys; print(json.load(sys.stdin)["output_tps"])'
}
for workload in $WORKLOADS; do
  for n in $SIZES; do
    off=$(tps "$workload" $((2 * n)) "$n" off)
    on=$(tps "$workload" $((2 * n)) "$n" ngram)
    python3 -c 'import sys; w, n, a, b = sys.argv[1:]; print("%-14s N=%-3s off %8.1f tok/s  ngram %8.1f tok/s  ngram/off %.2fx" % (w, n, float(a), float(b), float(b) / float(a)))' \
      "$workload" "$n" "$off" "$on"
  done
done
