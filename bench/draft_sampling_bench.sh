#!/usr/bin/env bash
# Sampled requests with a draft model (issue 18, docs/speculative.md#sampled-drafts-min1-pq): drafts
# drawn from the draft model's own distribution and verified with min(1, p/q) (--draft-sampling sample,
# the default) against argmax drafts (--draft-sampling argmax, accepted with probability p(argmax q)),
# and plain decoding, side by side in one run, single stream, on the input-grounded and ShareGPT-like
# workloads with every request sampled at TEMPERATURE (seeded per request, so each mode serves the same
# requests). Prints per mode the output tokens/s, the draft tokens proposed and accepted, then the
# speed-ups. Timings: run it on a quiet machine.
#
#   bench/draft_sampling_bench.sh [TESSERA] [NUM_REQUESTS] [THREADS] [MODEL] [DRAFT] [K] [TEMPERATURE]
#     defaults: build/bin/tessera 16 2 models/SmolLM2-135M-Instruct.Q4_1.gguf (MODEL) 4 0.8
#
# The default pair is the model drafting for itself: each draft token then costs what a target token
# costs, so speculation cannot pay here whatever is accepted (the draft model is as large as the
# target); what the run compares is how many drafts each rule accepts, and the speed that buys with
# the same draft cost. ignore_eos: every mode generates each request's max_tokens (the texts differ:
# the modes draw differently, with the same distribution).
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA=${1:-build/bin/tessera}
NUM=${2:-16}
THREADS=${3:-2}
MODEL=${4:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
DRAFT=${5:-$MODEL}
K=${6:-4}
TEMPERATURE=${7:-0.8}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for workload in grounded sharegpt_like; do
  # The workload's requests, each sampled at TEMPERATURE with a seed of its own.
  python3 - "bench/workloads/$workload.jsonl" "$tmp/$workload.jsonl" "$TEMPERATURE" "$NUM" <<'PY'
import json, sys
src, dst, temperature, num = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
with open(src) as f, open(dst, "w") as out:
    lines = [l for l in f if l.strip()]
    for i, line in enumerate(lines[:num] if num > 0 else lines):
        r = json.loads(line)
        r.update(temperature=temperature, top_p=0.95, seed=1000 + i, ignore_eos=True)
        out.write(json.dumps(r) + "\n")
PY
  declare -A tps=()
  for mode in off argmax sample; do
    spec=()
    [ "$mode" != off ] && spec=(--speculative draft --draft-model "$DRAFT" --num-speculative-tokens "$K" --draft-sampling "$mode")
    out=$("$TESSERA" bench throughput --model "$MODEL" --threads "$THREADS" --workload "$tmp/$workload.jsonl" \
      --max-num-seqs 1 "${spec[@]}" --quiet)
    tps[$mode]=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["output_tps"])' "$out")
    python3 - "$out" "$workload" "$mode" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
drafts, acc = d.get("spec_draft_tokens", 0), d.get("spec_accepted_tokens", 0)
rate = "%.2f" % (acc / drafts) if drafts else "-"
print("%-14s drafts %-7s: %8.1f output tok/s, %d requests, %d tokens, %d steps, drafts %d accepted %d (rate %s)"
      % (sys.argv[2], sys.argv[3], d["output_tps"], d["requests"], d["output_tokens"], d["steps"], drafts, acc, rate))
PY
  done
  python3 -c 'import sys; t = [float(x) for x in sys.argv[2:]]; print("%-14s speed-up sample/argmax: %.2fx, argmax/off: %.2fx, sample/off: %.2fx" % (sys.argv[1], t[2] / t[1], t[1] / t[0], t[2] / t[0]))' \
    "$workload" "${tps[off]}" "${tps[argmax]}" "${tps[sample]}"
  unset tps
done
