#!/usr/bin/env bash
# Gemma 3 270M (GGUF Q4_K_M, models/gemma-3-270m-q4_k_m.gguf) side by side: Tessera vs llama.cpp's own
# C++ tools built from the pinned sources (bench/build_llama_cpp.sh), on the same file and threads.
#
#   bench/gemma_vs_llama_bench.sh [--threads N] [--prompt-tokens P] [--gen-tokens G] [--repeats R]
#                                 [--tessera PATH] [--no-serve] [--num-prompts K] [--concurrency C]
#                                 [--out-dir DIR]
#
# 1. Single stream: `tessera bench latency` (prompt of P tokens in one batch, then G greedy tokens) vs
#    `llama-bench -p P -n G` (pp P and tg G, the same two numbers: prompt tokens/s and decode tokens/s).
#    Each tool reports its best (Tessera) / mean (llama-bench) of R runs; the runs alternate tools so
#    that a machine getting busier does not favour one side.
# 2. Serving (unless --no-serve): `tessera serve` and `llama-server --parallel C --cont-batching`, one
#    after the other on loopback, each driven by bench/serve_client.py with the same random workload
#    (K prompts, fixed input/output lengths, ignore_eos, --max-concurrency C): output tokens/s, TTFT,
#    TPOT. Both servers get N threads.
# Prints a markdown table and writes the raw JSON into DIR (default /tmp/tessera_bench/gemma). Run it on a
# quiet machine: the numbers go into docs/benchmarks.md (target: Tessera >= 1.0x on both single-stream
# numbers). Nothing here is a test; nothing asserts timings.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

THREADS=2
PROMPT=512
GEN=128
REPEATS=3
TESSERA=""
SERVE=1
NUM_PROMPTS=64
CONCURRENCY=8
OUT=/tmp/tessera_bench/gemma
while (($#)); do
  case "$1" in
    --threads) THREADS=$2; shift ;;
    --prompt-tokens) PROMPT=$2; shift ;;
    --gen-tokens) GEN=$2; shift ;;
    --repeats) REPEATS=$2; shift ;;
    --tessera) TESSERA=$2; shift ;;
    --no-serve) SERVE=0 ;;
    --num-prompts) NUM_PROMPTS=$2; shift ;;
    --concurrency) CONCURRENCY=$2; shift ;;
    --out-dir) OUT=$2; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gemma_vs_llama_bench: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
say() { printf '\033[1m[gemma-bench]\033[0m %s\n' "$*" >&2; }

# ---- inputs: the model (sha256-checked by setup), llama.cpp's tools, a release build of Tessera ----------
scripts/setup --deps-only --models gemma3-270m
MODEL=$ROOT/models/gemma-3-270m-q4_k_m.gguf
PEERS=$(bench/build_llama_cpp.sh)
LLAMA_BENCH=$PEERS/build/bin/llama-bench
LLAMA_SERVER=$PEERS/build/bin/llama-server
if [ -z "$TESSERA" ]; then
  TESSERA=$ROOT/build-release/bin/tessera
  if [ ! -x "$TESSERA" ]; then
    say "building Tessera (Release) into build-release/"
    cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DTESSERA_BUILD_TESTS=OFF >/dev/null
    cmake --build build-release -j"${JOBS:-2}" --target tessera
  fi
fi
say "model $MODEL, $THREADS threads, prompt $PROMPT, generate $GEN, $REPEATS repeats"

# ---- 1. single stream -----------------------------------------------------------------------------------
: >"$OUT/tessera_latency.jsonl"
: >"$OUT/llama_bench.jsonl"
for ((r = 1; r <= REPEATS; r++)); do
  say "round $r/$REPEATS: tessera bench latency"
  "$TESSERA" bench latency --model "$MODEL" --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --threads "$THREADS" \
    --repeats 1 | tail -n 1 >>"$OUT/tessera_latency.jsonl"
  say "round $r/$REPEATS: llama-bench"
  # -r 1 per round (the rounds repeat); -o jsonl: one object per test (pp, then tg).
  "$LLAMA_BENCH" -m "$MODEL" -p "$PROMPT" -n "$GEN" -t "$THREADS" -r 1 -o jsonl >>"$OUT/llama_bench.jsonl"
done

python3 - "$OUT" "$PROMPT" "$GEN" "$THREADS" <<'PY'
import json, sys
from pathlib import Path
out, prompt, gen, threads = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tess = [json.loads(l) for l in (out / "tessera_latency.jsonl").read_text().splitlines() if l.strip()]
llama = [json.loads(l) for l in (out / "llama_bench.jsonl").read_text().splitlines() if l.strip()]
t_pp = max(r["prompt_tps"] for r in tess)
t_tg = max(r["decode_tps"] for r in tess)
l_pp = max(r["avg_ts"] for r in llama if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0)
l_tg = max(r["avg_ts"] for r in llama if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0)
summary = {"threads": threads, "prompt_tokens": prompt, "gen_tokens": gen,
           "tessera": {"prompt_tps": t_pp, "decode_tps": t_tg}, "llama_cpp": {"prompt_tps": l_pp, "decode_tps": l_tg}}
(out / "latency_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(f"\n### Gemma 3 270M Q4_K_M, single stream, {threads} threads (best of the rounds)\n")
print("| | Tessera | llama.cpp (llama-bench) | Tessera / llama.cpp |")
print("|---|---|---|---|")
print(f"| prompt tok/s (pp{prompt}) | {t_pp:.1f} | {l_pp:.1f} | {t_pp / l_pp:.2f}x |")
print(f"| decode tok/s (tg{gen}) | {t_tg:.1f} | {l_tg:.1f} | {t_tg / l_tg:.2f}x |")
PY

[ "$SERVE" = 1 ] || exit 0

# ---- 2. serving -------------------------------------------------------------------------------------------
PORT_T=18731
PORT_L=18732
server_pid=""
stop_server() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null; server_pid=""; }
trap stop_server EXIT
wait_ready() {  # $1: base URL
  for _ in $(seq 1 300); do
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/v1/models', timeout=2)" "$1" \
      2>/dev/null && return 0
    sleep 1
  done
  echo "gemma_vs_llama_bench: server at $1 did not come up" >&2
  return 1
}
client() {  # $1: base URL, $2: output JSON
  python3 bench/serve_client.py --base-url "$1" --model "$(basename "$MODEL")" --dataset-name random \
    --random-input-len 256 --random-output-len 128 --random-range-ratio 0 --num-prompts "$NUM_PROMPTS" \
    --max-concurrency "$CONCURRENCY" --seed 1 --output "$2"
}

say "serving: tessera serve (--threads $THREADS), $NUM_PROMPTS prompts at concurrency $CONCURRENCY"
"$TESSERA" serve "$MODEL" --host 127.0.0.1 --port "$PORT_T" --threads "$THREADS" >"$OUT/tessera_serve.log" 2>&1 &
server_pid=$!
wait_ready "http://127.0.0.1:$PORT_T"
client "http://127.0.0.1:$PORT_T" "$OUT/serve_tessera.json"
stop_server

say "serving: llama-server (--parallel $CONCURRENCY --cont-batching, -t $THREADS)"
# One KV slot of 512 + 128 positions (rounded up) per parallel request.
"$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT_L" -t "$THREADS" -tb "$THREADS" \
  --parallel "$CONCURRENCY" --cont-batching -c $((CONCURRENCY * 1024)) >"$OUT/llama_server.log" 2>&1 &
server_pid=$!
wait_ready "http://127.0.0.1:$PORT_L"
client "http://127.0.0.1:$PORT_L" "$OUT/serve_llama_server.json"
stop_server

python3 - "$OUT" "$CONCURRENCY" <<'PY'
import json, sys
from pathlib import Path
out, conc = Path(sys.argv[1]), sys.argv[2]
t = json.loads((out / "serve_tessera.json").read_text())
l = json.loads((out / "serve_llama_server.json").read_text())
rows = [("output tok/s", lambda d: d["output_throughput"]), ("mean TTFT ms", lambda d: d["ttft_ms"]["mean"]),
        ("median TPOT ms", lambda d: d["tpot_ms"]["median"]), ("failed requests", lambda d: d["failed"])]
print(f"\n### Gemma 3 270M Q4_K_M, serving (random 256 in / 128 out, concurrency {conc})\n")
print("| | Tessera | llama-server | Tessera / llama-server |")
print("|---|---|---|---|")
for name, get in rows:
    a, b = get(t), get(l)
    print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f}x |" if b else f"| {name} | {a:.1f} | {b:.1f} | |")
PY
