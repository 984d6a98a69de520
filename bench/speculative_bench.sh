#!/usr/bin/env bash
# Single-stream decode with and without n-gram speculative decoding (issue 18, docs/speculative.md), side
# by side in one run: the input-grounded workload (bench/workloads/grounded.jsonl: quote / edit /
# summarise a given text, where prompt lookup drafts are mostly right) and the ShareGPT-like one
# (bench/workloads/sharegpt_like.jsonl, where they mostly are not). Issue 18's targets: >= 1.8x on the
# grounded workload, >= 0.97x (no slowdown) on ShareGPT-like. Timings: run it on a quiet machine.
#
#   bench/speculative_bench.sh [TESSERA] [NUM_REQUESTS] [THREADS] [MODEL] [K]
#     defaults: build/bin/tessera 0 (all) 2 models/SmolLM2-135M-Instruct.Q4_1.gguf 4
#
# Each run is `tessera bench throughput --max-num-seqs 1`: the requests are served one at a time, so its
# output_tps is single-stream decode (plus the prompts' prefill, the same in both modes); greedy,
# ignore_eos, so both modes generate exactly the same tokens. Prints one line per workload and mode,
# then the speed-up; the acceptance rate comes from the engine's counters.
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA=${1:-build/bin/tessera}
NUM=${2:-0}
THREADS=${3:-2}
MODEL=${4:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
K=${5:-4}
for workload in grounded sharegpt_like; do
  declare -A tps=()
  for mode in off ngram; do
    out=$("$TESSERA" bench throughput --model "$MODEL" --threads "$THREADS" --workload "bench/workloads/$workload.jsonl" \
      --num-requests "$NUM" --max-num-seqs 1 --speculative "$mode" --num-speculative-tokens "$K" --quiet)
    tps[$mode]=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["output_tps"])' "$out")
    python3 - "$out" "$workload" "$mode" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
drafts, acc = d.get("spec_draft_tokens", 0), d.get("spec_accepted_tokens", 0)
rate = "%.2f" % (acc / drafts) if drafts else "-"
print("%-14s speculative %-6s: %8.1f output tok/s, %d requests, %d tokens, %d steps, drafts %d accepted %d (rate %s)"
      % (sys.argv[2], sys.argv[3], d["output_tps"], d["requests"], d["output_tokens"], d["steps"], drafts, acc, rate))
PY
  done
  python3 -c 'import sys; print("%-14s speed-up ngram/off: %.2fx" % (sys.argv[1], float(sys.argv[3]) / float(sys.argv[2])))' \
    "$workload" "${tps[off]}" "${tps[ngram]}"
  unset tps
done
