#!/usr/bin/env python3
"""Offline serving throughput: Tessera vs llama.cpp (continuous batching) vs HF transformers.

All requests of the workload (bench/workloads/sharegpt_like.jsonl, lines
{"id", "prompt", "max_tokens"}) arrive at t=0; every request generates exactly
max_tokens tokens greedily (ignore_eos). Prompts are raw text, tokenized without
BOS and without a chat template.

Engines:
  (a) HF transformers, fp32 weights dequantized from the GGUF, generate() one request at
      a time. On a small CPU this is slow, so only the first --hf-requests requests run
      and the rates are those of that subset (labelled "subset" in the table).
  (b) llama.cpp via llama-cpp-python's C API with --parallel sequences in one unified
      KV cache: each step batches one decode token per running sequence plus prompt
      chunks of newly admitted ones (up to n_batch tokens), like llama-server's
      continuous batching. (llama-cpp-python's own server serializes requests, so it
      would not measure batching.)
  (c) Tessera:  tessera bench throughput --model M --workload FILE --num-requests K --threads N
      printing {"requests", "elapsed_s", "requests_per_s", "output_tps", "total_tps",
      "kv_waste", "preemptions"}.

Example:
    python3 bench/compare_throughput.py --num-requests 50 --parallel 8 --hf-requests 4
    python3 bench/compare_throughput.py --skip-tessera --skip-hf
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_runners import (DEFAULT_MODEL, DEFAULT_TESSERA, LlamaCpp, Stopwatch,  # noqa: E402
                          load_hf_model, run_tessera, write_report)

DEFAULT_WORKLOAD = Path(__file__).resolve().parent / "workloads" / "sharegpt_like.jsonl"


@dataclass
class Request:
    request_id: int
    prompt_ids: list[int]
    max_tokens: int
    output_ids: list[int] = field(default_factory=list)
    num_prefilled: int = 0


def load_workload(path: Path, count: int) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if count > len(lines):
        raise SystemExit(f"--num-requests {count} exceeds the {len(lines)} requests in {path}")
    return lines[:count]


def rates(num_requests: int, prompt_tokens: int, output_tokens: int, seconds: float) -> dict:
    return {
        "requests": num_requests,
        "elapsed_s": seconds,
        "requests_per_s": num_requests / seconds,
        "output_tps": output_tokens / seconds,
        "total_tps": (prompt_tokens + output_tokens) / seconds,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
    }


def run_llama_cpp(engine: LlamaCpp, requests: list[Request], parallel: int) -> dict:
    """Continuous batching over `parallel` sequence slots; returns throughput numbers."""
    engine.clear()
    waiting = deque(requests)
    running: dict[int, Request] = {}  # seq_id -> request
    free_slots = list(range(parallel - 1, -1, -1))
    num_steps = 0
    with Stopwatch() as clock:
        while waiting or running:
            while waiting and free_slots:
                running[free_slots.pop()] = waiting.popleft()
            entries, sample_from = [], []  # sample_from: (batch index, seq_id)
            # Decode tokens first: one per sequence that finished its prompt.
            for seq_id, request in running.items():
                if request.num_prefilled == len(request.prompt_ids):
                    position = len(request.prompt_ids) + len(request.output_ids) - 1
                    sample_from.append((len(entries), seq_id))
                    entries.append((request.output_ids[-1], position, seq_id, True))
            # Then prompt chunks with whatever batch space is left.
            for seq_id, request in running.items():
                remaining = len(request.prompt_ids) - request.num_prefilled
                budget = engine.n_batch - len(entries)
                if remaining == 0 or budget == 0:
                    continue
                take = min(remaining, budget)
                for offset in range(take):
                    position = request.num_prefilled + offset
                    last = position == len(request.prompt_ids) - 1
                    if last:
                        sample_from.append((len(entries), seq_id))
                    entries.append((request.prompt_ids[position], position, seq_id, last))
                request.num_prefilled += take
            engine.decode(entries)
            num_steps += 1
            for batch_index, seq_id in sample_from:
                request = running[seq_id]
                request.output_ids.append(engine.argmax(batch_index))
                if len(request.output_ids) == request.max_tokens:
                    engine.remove_sequence(seq_id)
                    del running[seq_id]
                    free_slots.append(seq_id)
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    output_tokens = sum(len(r.output_ids) for r in requests)
    result = rates(len(requests), prompt_tokens, output_tokens, clock.seconds)
    result["decode_calls"] = num_steps
    result["parallel"] = parallel
    result["outputs"] = {r.request_id: r.output_ids for r in requests}
    return result


def run_hf(model_path: Path, requests: list[Request], threads: int) -> dict:
    import torch
    hf_model = load_hf_model(model_path, threads)
    with torch.no_grad():
        hf_model.generate(torch.tensor([requests[0].prompt_ids[:8]]), max_new_tokens=2, do_sample=False)  # warm-up
        per_request = []
        with Stopwatch() as clock:
            for request in requests:
                start = time.perf_counter()
                output = hf_model.generate(
                    torch.tensor([request.prompt_ids]), attention_mask=torch.ones(1, len(request.prompt_ids), dtype=torch.long),
                    max_new_tokens=request.max_tokens, min_new_tokens=request.max_tokens, do_sample=False,
                    pad_token_id=2)
                request.output_ids = output[0, len(request.prompt_ids):].tolist()
                per_request.append(time.perf_counter() - start)
    prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    output_tokens = sum(len(r.output_ids) for r in requests)
    result = rates(len(requests), prompt_tokens, output_tokens, clock.seconds)
    result["per_request_s"] = per_request
    result["outputs"] = {r.request_id: r.output_ids for r in requests}
    return result


def fmt_row(name: str, result: dict | None, note: str = "") -> str:
    if not result:
        return f"| {name} | n/a | n/a | n/a | n/a | n/a | {note} |"
    return (f"| {name} | {result['requests']} | {result['elapsed_s']:.1f} | {result['requests_per_s']:.3f} | "
            f"{result['output_tps']:.1f} | {result['total_tps']:.1f} | {note} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--tessera", type=Path, default=DEFAULT_TESSERA)
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--num-requests", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=8, help="llama.cpp sequence slots")
    parser.add_argument("--n-batch", type=int, default=512, help="llama.cpp tokens per llama_decode")
    parser.add_argument("--hf-requests", type=int, default=4, help="requests run through transformers (subset)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the Tessera run")
    parser.add_argument("--skip-tessera", action="store_true")
    parser.add_argument("--skip-llama-cpp", action="store_true")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tessera_bench/throughput.json"))
    args = parser.parse_args()

    workload = load_workload(args.workload, args.num_requests)
    results: dict[str, dict | None] = {"llama_cpp": None, "hf": None, "tessera": None}
    errors: list[str] = []

    # Token ids come from llama.cpp's tokenizer for both peers so they do identical work.
    tokenizer_engine = None
    if not (args.skip_llama_cpp and args.skip_hf):
        tokenizer_engine = LlamaCpp(args.model, n_threads=args.threads, n_ctx=512, n_batch=args.n_batch)
        tokenized = [tokenizer_engine.tokenize(item["prompt"]) for item in workload]
        max_len = max(len(ids) + item["max_tokens"] for ids, item in zip(tokenized, workload))
        tokenizer_engine.close()

    if not args.skip_tessera:
        try:
            results["tessera"] = run_tessera(args.tessera, [
                "bench", "throughput", "--model", str(args.model), "--workload", str(args.workload),
                "--num-requests", str(args.num_requests), "--threads", str(args.threads)],
                timeout_s=args.timeout).data
            print("tessera: " + json.dumps(results["tessera"]), file=sys.stderr)
        except (OSError, RuntimeError, ValueError) as exc:
            errors.append(f"tessera: {exc}")
            print(f"warning: {exc}", file=sys.stderr)

    if not args.skip_llama_cpp:
        engine = LlamaCpp(args.model, n_threads=args.threads, n_ctx=args.parallel * max_len,
                          n_batch=args.n_batch, n_seq_max=args.parallel)
        warm = [Request(-1, tokenized[0][:16], 2)]
        run_llama_cpp(engine, warm, 1)  # page in the weights
        requests = [Request(item["id"], ids, item["max_tokens"]) for item, ids in zip(workload, tokenized)]
        results["llama_cpp"] = run_llama_cpp(engine, requests, args.parallel)
        engine.close()
        print("llama.cpp: " + json.dumps({k: v for k, v in results["llama_cpp"].items() if k != "outputs"}),
              file=sys.stderr)

    if not args.skip_hf and args.hf_requests > 0:
        subset = [Request(item["id"], ids, item["max_tokens"])
                  for item, ids in list(zip(workload, tokenized))[:args.hf_requests]]
        results["hf"] = run_hf(args.model, subset, args.threads)
        # Sequential generation time is dominated by decode steps, so scale the subset's
        # time by output tokens to estimate the whole workload.
        all_output = sum(item["max_tokens"] for item in workload)
        estimate = results["hf"]["elapsed_s"] * all_output / results["hf"]["output_tokens"]
        results["hf"]["extrapolated_elapsed_s_all_requests"] = estimate
        results["hf"]["extrapolated_requests_per_s_all_requests"] = len(workload) / estimate
        print("transformers: " + json.dumps({k: v for k, v in results["hf"].items()
                                              if k not in ("per_request_s", "outputs")}), file=sys.stderr)

    if results["hf"] and results["llama_cpp"]:
        # Sanity check of the batched llama.cpp loop: greedy outputs should match transformers'
        # for a good stretch (they drift apart only at near-ties, see tests/data/logits/README.md).
        prefixes = []
        for request_id, hf_ids in results["hf"]["outputs"].items():
            cpp_ids = results["llama_cpp"]["outputs"][request_id]
            same = next((i for i, (a, b) in enumerate(zip(hf_ids, cpp_ids)) if a != b), min(len(hf_ids), len(cpp_ids)))
            prefixes.append(f"{same}/{len(hf_ids)}")
        print("greedy agreement llama.cpp vs transformers (common prefix / tokens): " + ", ".join(prefixes))

    print(f"\nThroughput, {args.model.name}, {args.threads} threads, workload {args.workload.name} "
          f"(first {args.num_requests} requests, all arriving at t=0, ignore_eos)\n")
    print("| engine | requests | elapsed s | requests/s | output tok/s | total tok/s | note |")
    print("|---|---|---|---|---|---|---|")
    tessera = results["tessera"]
    tessera_note = (f"kv_waste {tessera.get('kv_waste', float('nan')):.3f}, preemptions {tessera.get('preemptions')}"
                    if tessera else "not run")
    print(fmt_row("Tessera", tessera, tessera_note))
    print(fmt_row("llama.cpp", results["llama_cpp"],
                  f"continuous batching, {args.parallel} slots" if results["llama_cpp"] else "not run"))
    print(fmt_row("HF transformers fp32", results["hf"],
                  f"sequential; SUBSET of the first {args.hf_requests} requests; all {args.num_requests} would take "
                  f"~{results['hf']['extrapolated_elapsed_s_all_requests']:.0f} s "
                  f"(~{results['hf']['extrapolated_requests_per_s_all_requests']:.3f} req/s), extrapolated by output tokens"
                  if results["hf"] else "not run"))
    if tessera:
        for peer, label in (("llama_cpp", "llama.cpp"), ("hf", "transformers")):
            if results[peer]:
                print(f"\nTessera / {label}: requests/s {tessera['requests_per_s'] / results[peer]['requests_per_s']:.2f}x, "
                      f"output tok/s {tessera['output_tps'] / results[peer]['output_tps']:.2f}x, "
                      f"total tok/s {tessera['total_tps'] / results[peer]['total_tps']:.2f}x")

    write_report(args.out, "throughput", args, results=results, errors=errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
