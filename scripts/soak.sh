#!/usr/bin/env bash
# Long soak of `tessera serve` (tests/e2e/soak.py): a real server on the real model with a small KV
# pool under 64 mixed streams (SSE and WebSocket, chat and completions, n > 1, logprobs) of which 30%
# are cut at random points; /metrics and RSS sampled, idle-moment leak checks, a JSON + text report.
# Exits non-zero when a criterion fails (5xx, client errors, leaked blocks, RSS growth, health,
# progress, clean shutdown; see the script's --help).
#
#   scripts/soak.sh --hours 4                 # default build dir: build (tessera target built first)
#   scripts/soak.sh --minutes 3 -- --concurrency 32 --max-rss-growth 0.05
#   BUILD_DIR=build-test scripts/soak.sh --hours 1
#
# Everything after `--` goes to soak.py unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
BUILD_DIR=${BUILD_DIR:-build}
duration=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hours) duration="$(awk "BEGIN { print $2 * 3600 }")s"; shift 2 ;;
    --minutes) duration="$(awk "BEGIN { print $2 * 60 }")s"; shift 2 ;;
    --seconds) duration="$2s"; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
duration=${duration:-4h}

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$JOBS" --target tessera
out="$BUILD_DIR/soak-$(date +%Y%m%d-%H%M%S)"
exec python3 tests/e2e/soak.py --binary "$BUILD_DIR/bin/tessera" --duration "$duration" --out "$out" "$@"
