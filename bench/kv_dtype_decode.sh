#!/usr/bin/env bash
# Decode at a long context for each CPU KV-cache dtype (issue 17: at 4k context, fp16 KV >= 1.5x the
# fp32 KV), and llama.cpp's llama-bench at the same depth with its f16 and f32 caches, in one run on the
# same model and threads. Timings: run it on a quiet machine (llama.cpp's threads poll for work).
#
#   bench/kv_dtype_decode.sh [TESSERA] [CONTEXT] [THREADS] [MODEL]
#     defaults: build/bin/tessera 4096 2 models/SmolLM2-135M-Instruct.Q4_1.gguf
#
# Prints one line per engine and dtype: prompt tok/s (a CONTEXT-token prefill) and decode tok/s of 64
# tokens after it (Tessera: `tessera bench latency`, best of 3; llama.cpp: `llama-bench -p 0 -n 64 -d CONTEXT`,
# which times decode after a CONTEXT-token prefill).
set -euo pipefail
cd "$(dirname "$0")/.."
TESSERA=${1:-build/bin/tessera}
CTX=${2:-4096}
THREADS=${3:-2}
MODEL=${4:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
for dtype in fp32 fp16 bf16 int8; do
  # 2 GiB of KV holds a 4k-token fp32 sequence several times over (46 KB per token on this model).
  out=$("$TESSERA" bench latency --model "$MODEL" --threads "$THREADS" --prompt-tokens "$CTX" --gen-tokens 64 \
    --repeats 3 --kv-cache-dtype "$dtype" --kv-cache-memory 2 --max-model-len $((CTX + 128)) --quiet)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("tessera   kv %-5s context %s: prompt %8.1f tok/s, decode %7.1f tok/s" % (sys.argv[2], sys.argv[3], d.get("prompt_tps", 0), d.get("decode_tps", 0)))' "$out" "$dtype" "$CTX"
done
BIN=$(bench/build_llama_cpp.sh)/build/bin
# llama-bench takes f16, bf16 and quantized cache types (-ctk), not f32.
for ctk in f16; do
  "$BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 0 -n 64 -d "$CTX" -ctk "$ctk" -ctv "$ctk" -fa off -r 3 -o csv 2>/dev/null |
    python3 -c 'import csv,sys; rows=list(csv.DictReader(sys.stdin)); [print("llama.cpp kv %-5s context %s: decode %7.1f tok/s" % (sys.argv[1], r["n_depth"], float(r["avg_ts"]))) for r in rows]' "$ctk"
done
