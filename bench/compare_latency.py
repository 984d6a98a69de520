#!/usr/bin/env python3
"""Single-request latency: Tessera vs llama.cpp, side by side in one run.

For each repeat (alternating which engine goes first, to spread out thermal and
noisy-neighbour effects) both engines
  1. evaluate a `--prompt-tokens` prompt in one batch  -> prompt tokens/s
  2. generate `--gen-tokens` tokens one at a time (greedy) -> decode tokens/s
     (the first token comes from the prompt's logits, so decode speed is measured
     over the other gen_tokens - 1 steps, as Tessera does)
llama.cpp runs in-process through llama-cpp-python's C API (n_ctx 2048, one
llama_decode over the whole prompt, then one llama_decode per token; the wall
clock includes the argmax). Tessera runs as
  tessera bench latency --model M --prompt-tokens P --gen-tokens G --threads N
(with --repeats 1) which prints one JSON line {"prompt_tokens", "prompt_tps",
"gen_tokens", "decode_tps"}; its prompt_tps is prompt tokens over the time to the first
generated token, measured the same way here for llama.cpp.

Prints a markdown table (median over repeats, min-max in brackets) and writes
all runs as JSON.

Example:
    python3 bench/compare_latency.py --threads 2 --repeats 3
    python3 bench/compare_latency.py --skip-tessera      # peers only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_runners import (DEFAULT_MODEL, DEFAULT_TESSERA, LlamaCpp, Stopwatch,  # noqa: E402
                          run_tessera, write_report)

PROSE = ("Large language model serving systems batch requests from many users to keep the hardware "
         "busy. Each request first processes its prompt, which is compute bound, and then generates "
         "tokens one at a time, which is bound by memory bandwidth because every step reads all of "
         "the weights and the key-value cache of the sequence. ")


def llama_cpp_prompt(engine: LlamaCpp, num_tokens: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < num_tokens:
        ids += engine.tokenize(PROSE)
    return ids[:num_tokens]


def run_llama_cpp_once(engine: LlamaCpp, prompt: list[int], gen_tokens: int) -> dict:
    engine.clear()
    engine.lib.llama_perf_context_reset(engine.ctx)
    entries = [(token, position, 0, position == len(prompt) - 1) for position, token in enumerate(prompt)]
    with Stopwatch() as prefill:
        for start in range(0, len(entries), engine.n_batch):
            chunk = entries[start:start + engine.n_batch]
            engine.decode(chunk)
        next_token = engine.argmax(len(chunk) - 1)
    # The first generated token comes from the prompt's logits; like Tessera's
    # `bench latency`, decode speed is the remaining gen_tokens - 1 steps.
    position = len(prompt)
    with Stopwatch() as decode:
        for _ in range(gen_tokens - 1):
            engine.decode([(next_token, position, 0, True)])
            next_token = engine.argmax(0)
            position += 1
    perf = engine.perf()
    return {
        "prompt_tokens": len(prompt),
        "prompt_tps": len(prompt) / prefill.seconds,
        "gen_tokens": gen_tokens,
        "decode_tps": (gen_tokens - 1) / decode.seconds,
        # llama.cpp's own counters (exclude Python overhead), for reference.
        "internal_prompt_tps": perf["n_p_eval"] / perf["t_p_eval_ms"] * 1e3 if perf["t_p_eval_ms"] else None,
        "internal_decode_tps": perf["n_eval"] / perf["t_eval_ms"] * 1e3 if perf["t_eval_ms"] else None,
    }


def run_tessera_once(args) -> dict:
    result = run_tessera(args.tessera, [
        "bench", "latency", "--model", str(args.model), "--prompt-tokens", str(args.prompt_tokens),
        "--gen-tokens", str(args.gen_tokens), "--threads", str(args.threads), "--repeats", "1"],
        timeout_s=args.timeout)
    return result.data


def summarize(runs: list[dict], key: str) -> dict | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(summary: dict | None) -> str:
    if summary is None:
        return "n/a"
    return f"{summary['median']:.1f} ({summary['min']:.1f}-{summary['max']:.1f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--tessera", type=Path, default=DEFAULT_TESSERA, help="path of the tessera binary")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per Tessera run")
    parser.add_argument("--skip-tessera", action="store_true")
    parser.add_argument("--skip-llama-cpp", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tessera_bench/latency.json"))
    args = parser.parse_args()
    if args.prompt_tokens + args.gen_tokens > args.n_ctx:
        parser.error("--prompt-tokens + --gen-tokens must fit in --n-ctx")

    engine = prompt = None
    if not args.skip_llama_cpp:
        engine = LlamaCpp(args.model, n_threads=args.threads, n_ctx=args.n_ctx, n_batch=512)
        prompt = llama_cpp_prompt(engine, args.prompt_tokens)
        run_llama_cpp_once(engine, prompt[:32], 4)  # warm-up: page in the weights

    runs: dict[str, list[dict]] = {"llama_cpp": [], "tessera": []}
    errors: list[str] = []
    for repeat in range(args.repeats):
        order = ["llama_cpp", "tessera"] if repeat % 2 == 0 else ["tessera", "llama_cpp"]
        for name in order:
            if name == "llama_cpp" and engine is not None:
                runs[name].append(run_llama_cpp_once(engine, prompt, args.gen_tokens))
            elif name == "tessera" and not args.skip_tessera:
                try:
                    runs[name].append(run_tessera_once(args))
                except (OSError, RuntimeError, ValueError) as exc:
                    errors.append(f"tessera: {exc}")
                    print(f"warning: {exc}", file=sys.stderr)
                    args.skip_tessera = True
            if runs[name]:
                print(f"repeat {repeat} {name}: " + json.dumps(runs[name][-1]), file=sys.stderr)
    if engine is not None:
        engine.close()

    table = {}
    for metric in ("prompt_tps", "decode_tps"):
        table[metric] = {name: summarize(runs[name], metric) for name in runs}
    print(f"\nLatency, {args.model.name}, {args.threads} threads, prompt {args.prompt_tokens} tokens, "
          f"{args.gen_tokens} generated tokens, {args.repeats} repeats: median (min-max)\n")
    print("| metric | llama.cpp | Tessera | Tessera / llama.cpp |")
    print("|---|---|---|---|")
    for metric, label in (("prompt_tps", f"prompt tokens/s ({args.prompt_tokens})"),
                          ("decode_tps", f"decode tokens/s ({args.gen_tokens})")):
        peer, ours = table[metric]["llama_cpp"], table[metric]["tessera"]
        ratio = f"{ours['median'] / peer['median']:.2f}x" if peer and ours else "n/a"
        print(f"| {label} | {fmt(peer)} | {fmt(ours)} | {ratio} |")
    internal = {k: summarize(runs["llama_cpp"], k) for k in ("internal_prompt_tps", "internal_decode_tps")}
    if internal["internal_prompt_tps"]:
        print(f"\nllama.cpp internal counters: prompt {fmt(internal['internal_prompt_tps'])} tok/s, "
              f"decode {fmt(internal['internal_decode_tps'])} tok/s")

    write_report(args.out, "latency", args, runs=runs, summary=table, errors=errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
