#!/usr/bin/env bash
# Single-stream CPU figures of issue 17 in one run: Tessera against its roofline (bench/roofline.cpp:
# decode tok/s over the bandwidth limit, prefill over the int8 peak) and against llama.cpp's
# `llama-bench` on the same file and threads (prefill of P tokens, decode of G tokens after them), and optionally
# against an earlier Tessera build (--baseline), rounds alternating so that a machine getting busier
# favours no side.
#
#   bench/cpu_roofline.sh [--tessera PATH] [--baseline PATH] [--model M | --wide] [--threads N] [--rounds R]
#                         [--prompt-tokens P] [--gen-tokens G] [--out-dir DIR]
#     defaults: build-bench/bin/tessera, no baseline, models/SmolLM2-135M-Instruct.Q4_1.gguf, 2 threads,
#               3 rounds, P = 512, G = 128, /tmp/tessera_bench/cpu_roofline
#     --wide: the model is bench/make_wide_gguf.py's file (SmolLM2-1.7B's shape, random weights, 1.1 GB
#             read per token), written first if missing: a size no last-level cache holds, so decode's
#             fraction of the bandwidth limit is one of DRAM bandwidth on every machine (a 260 MiB L3
#             holds SmolLM2-135M's weights).
#
# `roofline` is taken from next to --tessera and also drives the baseline (so both are accounted the
# same way: fp16 KV, Tessera's default). llama-bench is built by bench/build_llama_cpp.sh. Prints a
# markdown table of medians (and min / max) per quantity; raw JSON lines in DIR. Run it on a quiet
# machine (check the load average): nothing here asserts timings.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TESSERA=$ROOT/build-bench/bin/tessera
BASELINE=
MODEL=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
THREADS=2
ROUNDS=3
PROMPT=512
GEN=128
OUT=/tmp/tessera_bench/cpu_roofline
WIDE=
while (($#)); do
  case "$1" in
    --tessera) TESSERA=$2; shift ;;
    --baseline) BASELINE=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --wide) MODEL=/tmp/tessera_bench/smollm2-1.7b-shape.Q4_1.gguf; WIDE=1 ;;
    --threads) THREADS=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --prompt-tokens) PROMPT=$2; shift ;;
    --gen-tokens) GEN=$2; shift ;;
    --out-dir) OUT=$2; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "cpu_roofline: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
ROOFLINE=$(dirname "$TESSERA")/roofline
for f in "$TESSERA" "$ROOFLINE"; do
  [ -x "$f" ] || { echo "cpu_roofline: no $f (build the tessera and roofline targets)" >&2; exit 2; }
done
if [ -n "$WIDE" ] && [ ! -s "$MODEL" ]; then
  if ! python3 -c "import gguf, numpy" 2>/dev/null; then  # the versions bench/requirements.txt pins
    pins=$(grep -E '^(gguf|numpy)==' bench/requirements.txt | cut -d' ' -f1)
    # shellcheck disable=SC2086  # one argument per pin
    python3 -m pip install --quiet --disable-pip-version-check $pins 2>/dev/null ||
      python3 -m pip install --quiet --disable-pip-version-check --break-system-packages $pins
  fi
  python3 bench/make_wide_gguf.py --out "$MODEL" >/dev/null
fi
LLAMA_BENCH=$(bench/build_llama_cpp.sh)/build/bin/llama-bench
mkdir -p "$OUT"
: >"$OUT/runs.jsonl"
say() { printf '\033[1m[cpu-roofline]\033[0m %s\n' "$*" >&2; }
say "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

roofline_of() {  # $1: label, $2: tessera binary
  local json=$OUT/roofline-$1.json
  "$ROOFLINE" --model "$MODEL" --threads "$THREADS" --tessera "$2" --prompt-tokens "$PROMPT" \
    --gen-tokens "$GEN" --repeats 3 --kv-cache-dtype fp16 --json "$json" >/dev/null
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['label']=sys.argv[2]; print(json.dumps(d))" \
    "$json" "$1" >>"$OUT/runs.jsonl"
}

for r in $(seq "$ROUNDS"); do
  say "round $r/$ROUNDS: Tessera (roofline)"
  roofline_of tessera "$TESSERA"
  if [ -n "$BASELINE" ]; then
    say "round $r/$ROUNDS: baseline Tessera (roofline)"
    roofline_of baseline "$BASELINE"
  fi
  say "round $r/$ROUNDS: llama-bench"
  # Prefill of P tokens; decode of G tokens after a P-token prompt (-d: the depth Tessera decodes at).
  { "$LLAMA_BENCH" -m "$MODEL" -p "$PROMPT" -n 0 -t "$THREADS" -r 3 -o jsonl 2>/dev/null
    "$LLAMA_BENCH" -m "$MODEL" -p 0 -n "$GEN" -d "$PROMPT" -t "$THREADS" -r 3 -o jsonl 2>/dev/null; } |
    python3 -c "
import json, sys
for line in sys.stdin:
    if line.strip():
        d = json.loads(line)
        d['label'] = 'llama-bench'
        print(json.dumps(d))" >>"$OUT/runs.jsonl"
done
say "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$OUT/runs.jsonl" "$BASELINE" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def of(label, key):
    return [r[key] for r in runs if r["label"] == label and key in r]
def stat(xs, fmt="{:.1f}"):
    if not xs:
        return "-"
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}..{fmt.format(max(xs))})"
llama_pp = [r["avg_ts"] for r in runs if r["label"] == "llama-bench" and r.get("n_prompt", 0) > 0]
llama_tg = [r["avg_ts"] for r in runs if r["label"] == "llama-bench" and r.get("n_gen", 0) > 0]
labels = ["tessera"] + (["baseline"] if sys.argv[2] else [])
print("| quantity, median (min..max) of the rounds | " + " | ".join(labels) + " | llama-bench |")
print("|---|" + "---|" * (len(labels) + 1))
rows = [("prefill tok/s", "prefill_tps", "{:.0f}", llama_pp),
        ("decode tok/s", "decode_tps", "{:.1f}", llama_tg),
        ("decode / bandwidth limit (model-sized set)", "decode_fraction_model_set", "{:.2f}", None),
        ("decode / bandwidth limit (DRAM set)", "decode_fraction_dram", "{:.2f}", None),
        ("prefill / int8 peak", "prefill_fraction_int8", "{:.3f}", None),
        ("bandwidth, model-sized set, read GB/s", None, "{:.1f}", None)]
for name, key, fmt, peer in rows:
    cells = []
    for label in labels:
        xs = of(label, key) if key else [r["bandwidth_model_set"]["read_gbs"] for r in runs if r["label"] == label]
        cells.append(stat(xs, fmt))
    print(f"| {name} | " + " | ".join(cells) + f" | {stat(peer, fmt) if peer else ''} |")
t_pp, t_tg = of("tessera", "prefill_tps"), of("tessera", "decode_tps")
if llama_pp and t_pp:
    print(f"\nTessera / llama-bench (medians): prefill {statistics.median(t_pp) / statistics.median(llama_pp):.2f}x, "
          f"decode {statistics.median(t_tg) / statistics.median(llama_tg):.2f}x")
if sys.argv[2]:
    b_tg = of("baseline", "decode_tps")
    print(f"Tessera / baseline decode (medians): {statistics.median(t_tg) / statistics.median(b_tg):.2f}x")
EOF
