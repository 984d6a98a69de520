#!/usr/bin/env bash
# Single-stream decode with and without speculative decoding (issue 18, docs/speculative.md) — n-gram
# prompt lookup as chains and as token trees (--ngram-branches BRANCHES) and a draft model
# (--speculative draft --draft-model DRAFT) — side by side in one run: the input-grounded workload (bench/workloads/grounded.jsonl: quote / edit /
# summarise a given text, where prompt lookup drafts are mostly right) and the ShareGPT-like one
# (bench/workloads/sharegpt_like.jsonl, where they mostly are not). Issue 18's targets: >= 1.8x on the
# grounded workload, >= 0.97x (no slowdown) on ShareGPT-like. Timings: run it on a quiet machine.
#
#   bench/speculative_bench.sh [TESSERA] [NUM_REQUESTS] [THREADS] [MODEL] [K] [DRAFT] [BRANCHES]
#     defaults: build/bin/tessera 0 (all) 2 models/SmolLM2-135M-Instruct.Q4_1.gguf 4
#               models/SmolLM2-135M-Instruct.Q4_1.gguf (DRAFT "none": no draft-model run; "layers:N":
#               the model's own first N layers, --draft-layers N)
#               4 (BRANCHES 1: no token-tree run)
#   The pair the draft model is for: MODEL=models/SmolLM2-135M-Instruct-hf (float) with the Q4_1 draft,
#   e.g. bench/speculative_bench.sh build/bin/tessera 0 2 models/SmolLM2-135M-Instruct-hf 4
#
# The draft model's KV pool is its own (--draft-num-kv-blocks 0: sized like the target's).
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
DRAFT=${6:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
BRANCHES=${7:-4}
MODES=(off ngram)
[ "$BRANCHES" -gt 1 ] && MODES+=(tree)
[ "$DRAFT" != none ] && MODES+=(draft)
for workload in grounded sharegpt_like; do
  declare -A tps=()
  for mode in "${MODES[@]}"; do
    extra=()
    spec=$mode
    if [ "$mode" = draft ]; then
      if [[ $DRAFT == layers:* ]]; then extra=(--draft-layers "${DRAFT#layers:}"); else extra=(--draft-model "$DRAFT"); fi
    fi
    [ "$mode" = tree ] && spec=ngram && extra=(--ngram-branches "$BRANCHES")
    out=$("$TESSERA" bench throughput --model "$MODEL" --threads "$THREADS" --workload "bench/workloads/$workload.jsonl" \
      --num-requests "$NUM" --max-num-seqs 1 --speculative "$spec" --num-speculative-tokens "$K" "${extra[@]}" --quiet)
    tps[$mode]=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["output_tps"])' "$out")
    python3 - "$out" "$workload" "$mode" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
drafts, acc = d.get("spec_draft_tokens", 0), d.get("spec_accepted_tokens", 0)
rate = "%.2f" % (acc / drafts) if drafts else "-"
branch = d.get("spec_tree_branch_tokens", 0)
print("%-14s speculative %-6s: %8.1f output tok/s, %d requests, %d tokens, %d steps, drafts %d accepted %d (rate %s)%s"
      % (sys.argv[2], sys.argv[3], d["output_tps"], d["requests"], d["output_tokens"], d["steps"], drafts, acc, rate,
         ", %d from other branches" % branch if sys.argv[3] == "tree" else ""))
PY
  done
  for mode in "${MODES[@]:1}"; do
    python3 -c 'import sys; print("%-14s speed-up %s/off: %.2fx" % (sys.argv[1], sys.argv[2], float(sys.argv[4]) / float(sys.argv[3])))' \
      "$workload" "$mode" "${tps[off]}" "${tps[$mode]}"
  done
  unset tps
done
