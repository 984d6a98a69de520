#!/usr/bin/env python3
"""What a server build costs per streamed token: two `tessera` binaries, same model, same flags.

For each round, in interleaved order (baseline first in even rounds, candidate first in odd ones, so
that a machine that warms up or slows down over time does not favour either), each binary is started
as `BIN serve MODEL --port P [--server-args]`, waited for on /health, warmed up with a few requests,
and measured with the serving client `tessera bench serve` uses (bench/serve_client.py: streamed
/v1/completions, fixed prompt and output lengths, ignore_eos) at each --concurrency. Around every
measured run the server process's CPU time (utime + stime of /proc/PID/stat, all its threads) is
read, so the report has, per binary and concurrency (median over the rounds):

  ITL p50 / p99    inter-token latency as the client sees it (ms)
  output tok/s     generated tokens per second of wall time
  CPU ms/token     server CPU time per generated token (ms of CPU-seconds)

and the candidate / baseline ratio of each. Use a quiet machine; --quick is a smoke check only.

Example:
  python3 bench/streaming_overhead.py --baseline /tmp/tessera-main --candidate build/bin/tessera \\
      --model models/SmolLM2-135M-Instruct.Q4_1.gguf --server-args "--threads 2" --json /tmp/overhead.json
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
CLIENT = BENCH_DIR / "serve_client.py"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (every thread), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        stat = f.read()
    # The command name (field 2) is in parentheses and may hold spaces: fields are counted after it.
    fields = stat[stat.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


class server:
    def __init__(self, binary: str, model: str, extra: list[str], timeout: float):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix="tessera-overhead-", suffix=".log", delete=False)
        # stderr to a file: a pipe nobody reads would fill up and stall the server.
        self.proc = subprocess.Popen([binary, "serve", model, "--port", str(self.port), *extra],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        self.base_url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{binary} exited with {self.proc.returncode}:\n{self.log_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.time() > deadline:
                self.stop()
                raise SystemExit(f"{binary} not healthy after {timeout} s")
            time.sleep(0.2)

    def log_text(self) -> str:
        return Path(self.log.name).read_text(encoding="utf-8", errors="replace")

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def run_client(args, base_url: str, concurrency: int, num_prompts: int, seed: int) -> dict:
    with tempfile.NamedTemporaryFile(prefix="tessera-overhead-", suffix=".json", delete=False) as out:
        path = out.name
    cmd = [sys.executable, str(CLIENT), "--base-url", base_url, "--dataset-name", "random",
           "--num-prompts", str(num_prompts), "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len), "--random-range-ratio", "0",
           "--max-concurrency", str(concurrency), "--seed", str(seed), "--tokenizer", args.tokenizer,
           "--percentiles", "50,99", "--quiet", "--output", path]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"serve_client failed ({done.returncode}):\n{done.stderr[-2000:]}")
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    finally:
        os.unlink(path)
    if report["failed"]:
        raise SystemExit(f"{report['failed']} requests failed against {base_url}: {report['errors']}")
    return report


def measure(args, label: str, binary: str, round_index: int) -> list[dict]:
    srv = server(binary, args.model, shlex.split(args.server_args), args.ready_timeout)
    rows = []
    try:
        # Warm-up, not measured: weights faulted in, buffers sized, the first requests' costs paid.
        run_client(args, srv.base_url, 1, args.num_warmups, seed=10_000 + round_index)
        for c in args.concurrency:
            # Same prompts for both binaries in a round (the seed), different ones across rounds.
            seed = 1000 * round_index + c
            before = srv.cpu()
            report = run_client(args, srv.base_url, c, args.num_prompts, seed)
            cpu = srv.cpu() - before
            tokens = report["total_output_tokens"]
            rows.append({"binary": label, "round": round_index, "concurrency": c,
                         "itl_p50_ms": report["itl_ms"]["p50"], "itl_p99_ms": report["itl_ms"]["p99"],
                         "output_tok_s": report["output_throughput"], "server_cpu_s": cpu,
                         "output_tokens": tokens,
                         "cpu_ms_per_token": 1000.0 * cpu / tokens if tokens else float("nan"),
                         "duration_s": report["duration_s"]})
            print(f"  round {round_index} {label:<9} c={c:<3} ITL p50 {rows[-1]['itl_p50_ms']:7.2f} ms  "
                  f"{rows[-1]['output_tok_s']:8.1f} tok/s  {rows[-1]['cpu_ms_per_token']:7.3f} CPU ms/token",
                  file=sys.stderr, flush=True)
    finally:
        srv.stop()
    return rows


METRICS = [("itl_p50_ms", "ITL p50 (ms)"), ("itl_p99_ms", "ITL p99 (ms)"), ("output_tok_s", "output tok/s"),
           ("cpu_ms_per_token", "server CPU ms/token")]


def report_table(rows: list[dict], concurrency: list[int], num_rounds: int) -> str:
    lines = [f"median of {num_rounds} round(s)", "",
             "| concurrency | metric | baseline | candidate | candidate / baseline |", "|---|---|---|---|---|"]
    for c in concurrency:
        for key, title in METRICS:
            med = {}
            for label in ("baseline", "candidate"):
                values = [r[key] for r in rows if r["binary"] == label and r["concurrency"] == c]
                med[label] = statistics.median(values)
            ratio = med["candidate"] / med["baseline"] if med["baseline"] else float("nan")
            lines.append(f"| {c} | {title} | {med['baseline']:.3f} | {med['candidate']:.3f} | {ratio:.3f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--baseline", required=True, help="the tessera binary to compare against")
    p.add_argument("--candidate", required=True, help="the tessera binary under test")
    p.add_argument("--model", required=True, help="model path given to both servers")
    p.add_argument("--server-args", default="", help="extra `serve` flags, the same for both (one string)")
    p.add_argument("--concurrency", default="1,32", help="comma-separated --max-concurrency values (default %(default)s)")
    p.add_argument("--num-prompts", type=int, default=64, help="requests per measured run (default %(default)s)")
    p.add_argument("--input-len", type=int, default=64, help="prompt length, words or tokens (default %(default)s)")
    p.add_argument("--output-len", type=int, default=128, help="generated tokens per request (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per binary (default %(default)s)")
    p.add_argument("--num-warmups", type=int, default=4, help="requests before each server's first run")
    p.add_argument("--tokenizer", default="none",
                   help="serve_client --tokenizer: 'none' counts prompt words (default), or a tokenizer.json")
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for /health")
    p.add_argument("--quick", action="store_true", help="smoke check: 1 round, 8 prompts of 16 tokens")
    p.add_argument("--json", type=Path, help="write every run and the table here")
    args = p.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.quick:
        args.rounds, args.num_prompts, args.output_len, args.input_len, args.num_warmups = 1, 8, 16, 16, 1
    for path in (args.baseline, args.candidate):
        if not os.access(path, os.X_OK):
            p.error(f"{path} is not an executable")
    if args.rounds < 1 or args.num_prompts < 1 or args.num_warmups < 1 or not args.concurrency:
        p.error("--rounds, --num-prompts, --num-warmups and --concurrency must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    rows: list[dict] = []
    for r in range(args.rounds):
        order = [("baseline", args.baseline), ("candidate", args.candidate)]
        if r % 2:
            order.reverse()
        for label, binary in order:
            rows.extend(measure(args, label, binary, r))
    table = report_table(rows, args.concurrency, args.rounds)
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"baseline": args.baseline, "candidate": args.candidate, "model": args.model,
                                         "server_args": args.server_args, "num_prompts": args.num_prompts,
                                         "input_len": args.input_len, "output_len": args.output_len,
                                         "rounds": args.rounds, "runs": rows, "table": table}, indent=2) + "\n",
                             encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
