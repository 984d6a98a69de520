#!/usr/bin/env python3
"""Speculative decoding against llama.cpp's own (issue 18, docs/speculative.md): single-stream decode
through each server's OpenAI API, with and without a draft model, Tessera and llama.cpp's C++
`llama-server` (built from the llama-cpp-python sdist's vendored sources by bench/build_llama_cpp.sh)
side by side in one run, on the input-grounded workload and the ShareGPT-like one.

Both servers get the same model file, the same draft file (`-md`, llama-server's own flag, which Tessera
accepts too), the same draft length K (Tessera `--draft-max K`, llama-server `--spec-draft-n-max K`),
threads, prompts, greedy sampling and `ignore_eos` output lengths; each request runs alone
(`--max-concurrency 1`), so the output rate is single-stream decode plus the prompts' prefill. N-gram
prompt lookup too: Tessera's (suffixes of 4 down to 1 tokens, K drafted) against llama-server's
`--spec-type ngram-simple` (a 4-token lookup, `--spec-ngram-simple-size-n 4`, K drafted,
`--spec-ngram-simple-size-m K`). The table shows each engine's speed-up over itself without
speculation and the two engines against each other; the token counts from `usage` must agree between
them, or the run says so.

    bench/speculative_peer.py [--tessera build/bin/tessera] [--model M] [--draft D] [--k 4] [--num-prompts 8]

llama-server's threads spin for work (`--poll 50`, its default): run on a quiet machine.
"""
import argparse
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# bench/compare's server process and client runner (a script without a .py suffix).
compare = importlib.machinery.SourceFileLoader("compare", str(BENCH / "compare")).load_module()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tessera", type=Path, default=REPO / "build" / "bin" / "tessera")
    p.add_argument("--llama-server", type=Path, help="default: built or reused by bench/build_llama_cpp.sh")
    p.add_argument("--model", type=Path, default=REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--draft", type=Path, help="the draft model file (default: --model, as its own draft)")
    p.add_argument("--k", type=int, default=4, help="draft tokens per step (--draft-max)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--workloads", default="grounded,sharegpt_like")
    p.add_argument("--out-dir", type=Path, default=REPO / "build" / "speculative_peer")
    args = p.parse_args()
    args.draft = args.draft or args.model
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.llama_server is None:
        built = subprocess.run(["bash", str(BENCH / "build_llama_cpp.sh")], capture_output=True, text=True, check=True)
        args.llama_server = Path(built.stdout.strip().splitlines()[-1]) / "build" / "bin" / "llama-server"
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)

    def tessera(mode: str, port: int) -> list:
        command = [str(args.tessera), "serve", str(args.model), "--port", str(port), "--threads", str(args.threads),
                   "--max-num-seqs", "1", "--quiet"]
        if mode == "draft":
            command += ["--speculative", "draft", "-md", str(args.draft), "--draft-max", str(args.k)]
        elif mode == "ngram":
            command += ["--speculative", "ngram", "--num-speculative-tokens", str(args.k)]
        return command

    def llama(mode: str, port: int) -> list:
        command = [str(args.llama_server), "--model", str(args.model), "--host", "127.0.0.1", "--port", str(port),
                   "--threads", str(args.threads), "--threads-batch", str(args.threads), "--parallel", "1",
                   "--ctx-size", "4096", "--poll", "50", "--no-webui", "--flash-attn", "off"]
        if mode == "draft":
            command += ["--spec-type", "draft-simple", "-md", str(args.draft), "--spec-draft-n-max", str(args.k),
                        "--spec-draft-n-min", "0", "--threads-draft", str(args.threads)]
        elif mode == "ngram":
            command += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m",
                        str(args.k)]
        return command

    modes = ["off", "draft", "ngram"]
    runs = {"tessera": tessera, "llama_server": llama}
    results = {}
    for workload in args.workloads.split(","):
        args.workload = BENCH / "workloads" / f"{workload}.jsonl"
        for engine, command in runs.items():
            for mode in modes:
                name = f"{engine}_{mode}_{workload}"
                port = compare.free_port()
                server = compare.Server(name, command(mode, port), port, args.out_dir / f"{name}.log")
                try:
                    # One request first, not measured and not one of the measured prompts (no prefix-cache
                    # hit): a server's first request pays for page faults.
                    compare.run_client(args, server, args.out_dir / f"{name}_warmup.json", 1, args.num_prompts,
                                       concurrency=1)
                    results[name] = compare.run_client(args, server, args.out_dir / f"{name}.json", args.num_prompts,
                                                       0, concurrency=1)
                finally:
                    server.stop()
    print()
    print("| workload | engine | off tok/s | draft model tok/s | draft / off | n-gram tok/s | n-gram / off |")
    print("|---|---|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        tps = {e: {m: results[f"{e}_{m}_{workload}"]["output_throughput"] for m in modes} for e in runs}
        for engine, t in tps.items():
            print(f"| {workload} | {engine} | {t['off']:.1f} | {t['draft']:.1f} | {t['draft'] / t['off']:.2f}x "
                  f"| {t['ngram']:.1f} | {t['ngram'] / t['off']:.2f}x |")
        vs = {m: tps["tessera"][m] / tps["llama_server"][m] for m in modes}
        tokens = {e: {results[f"{e}_{m}_{workload}"]["total_output_tokens"] for m in modes} for e in runs}
        same = "same" if len(tokens["tessera"] | tokens["llama_server"]) == 1 else f"DIFFERENT ({tokens})"
        print(f"| {workload} | tessera / llama-server | {vs['off']:.2f}x | {vs['draft']:.2f}x | | {vs['ngram']:.2f}x "
              f"| output tokens {same} |")
    (args.out_dir / "summary.json").write_text(json.dumps(results, indent=1))
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}; details in {args.out_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
