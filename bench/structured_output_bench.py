#!/usr/bin/env python3
"""Structured-output benchmark against a running OpenAI-compatible server (Tessera, vLLM, ...).

In one run, against the same server:

  1. compile time per schema: each schema of a set is sent once "cold" (first time the server sees
     it) and once "warm" (from the compile cache) with max_tokens 1; the difference of the two times
     to first token is the compile time as a client sees it;
  2. throughput and inter-token latency: --concurrency (default 32) JSON-schema-constrained chat
     requests at once, then as many unconstrained ones at once (streaming; output tokens/s over the
     phase's wall time, ITL p50/p99 pooled over all requests, TTFT p50). A constrained request ends
     when its JSON is complete; unconstrained request i then asks for exactly as many tokens as
     constrained request i generated (max_tokens = that count, ignore_eos), so both phases run the
     same batch shape step by step and the difference is the cost of the constraint alone.
     Against Tessera the report adds the server's grammar counters (/metrics): masks computed and the
     time steps still waited for them after the forward pass.

The report is printed and, with --output, written as JSON. Numbers depend on the machine: record them
in docs/benchmarks.md only from a quiet machine, with the command line.

Standard library only. Example:
  build/bin/tessera serve models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8000 &
  python3 bench/structured_output_bench.py --base-url http://127.0.0.1:8000 --concurrency 32
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import statistics
import sys
import time
from urllib.parse import urlsplit

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 20},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    "active": {"type": "boolean"}},
    "required": ["name", "age", "city", "tags", "active"], "additionalProperties": False}


def compile_schemas(n: int, salt: str) -> list[dict]:
    """n distinct schemas of growing size (a property name carries the salt, so each run's are new)."""
    out = []
    for i in range(n):
        props = {f"{salt}_f{j}": ({"type": "integer", "minimum": 0, "maximum": 100 + j} if j % 3 == 0 else
                                  {"enum": [f"v{j}a", f"v{j}b"]} if j % 3 == 1 else
                                  {"type": "string", "maxLength": 8 + j})
                 for j in range(2 + 2 * i)}
        out.append({"type": "object", "properties": props, "required": list(props)})
    return out


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def stream_chat(base: str, body: dict, timeout: float) -> dict:
    """One streamed chat completion: chunk arrival times and the usage."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True,
                 "stream_options": {"include_usage": True}}), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    times, tokens, text = [], 0, ""
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for c in chunk.get("choices", []):
            piece = (c.get("delta") or {}).get("content")
            if piece:
                times.append(time.perf_counter() - t0)
                text += piece
    conn.close()
    return {"times": times, "tokens": tokens or len(times), "text": text, "end": time.perf_counter() - t0}


def phase(base: str, n: int, body_of, timeout: float) -> dict:
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(lambda i: stream_chat(base, body_of(i), timeout), range(n)))
    wall = time.perf_counter() - start
    itl = [b - a for r in results for a, b in zip(r["times"], r["times"][1:])]
    ttft = [r["times"][0] for r in results if r["times"]]
    tokens = sum(r["tokens"] for r in results)
    return {"requests": n, "output_tokens": tokens, "wall_s": wall, "output_tokens_per_s": tokens / wall,
            "itl_p50_ms": 1e3 * percentile(itl, 50), "itl_p99_ms": 1e3 * percentile(itl, 99),
            "ttft_p50_ms": 1e3 * percentile(ttft, 50), "texts": [r["text"] for r in results],
            "per_request_tokens": [r["tokens"] for r in results]}


def grammar_counters(base: str):
    """Tessera's (masks computed, seconds waited for masks) from /metrics; None elsewhere."""
    u = urlsplit(base)
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except (OSError, http.client.HTTPException):
        return None
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = value
    try:
        return (float(values["tessera_grammar_masks_total"]), float(values["tessera_grammar_mask_wait_seconds_total"]))
    except (KeyError, ValueError):
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--compile-schemas", type=int, default=8, help="schemas timed cold vs warm (0: skip)")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--output", default=None, help="write the report as JSON here")
    args = p.parse_args(argv)
    base = args.base_url.rstrip("/")
    messages = [{"role": "user", "content": "Describe a person (name, age, city, tags, active) as JSON."}]

    report = {"compile": []}
    salt = f"s{int(time.time() * 1000) % 10**8}"
    for i, schema in enumerate(compile_schemas(args.compile_schemas, salt)):
        body = {"messages": messages, "max_tokens": 1, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": f"c{i}", "schema": schema}}}
        cold = stream_chat(base, body, args.timeout)["end"]
        warm = stream_chat(base, body, args.timeout)["end"]
        entry = {"properties": len(schema["properties"]), "schema_bytes": len(json.dumps(schema)),
                 "cold_ms": 1e3 * cold, "warm_ms": 1e3 * warm, "compile_ms": 1e3 * (cold - warm)}
        report["compile"].append(entry)
        print(f"schema {i}: {entry['properties']:2d} properties, {entry['schema_bytes']:5d} B: "
              f"cold {entry['cold_ms']:.1f} ms, warm {entry['warm_ms']:.1f} ms -> compile ~{entry['compile_ms']:.1f} ms")

    base_body = {"messages": messages, "max_tokens": args.max_tokens, "temperature": 0.7}
    before = grammar_counters(base)
    constrained = phase(base, args.concurrency, lambda i: {
        **base_body, "seed": i,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}}, args.timeout)
    after = grammar_counters(base)
    lengths = constrained["per_request_tokens"]
    free = phase(base, args.concurrency, lambda i: {
        **base_body, "seed": i, "max_tokens": max(1, lengths[i]), "ignore_eos": True}, args.timeout)
    valid = 0
    for t in constrained["texts"]:
        try:
            json.loads(t)
            valid += 1
        except ValueError:
            pass
    for name, r in (("unconstrained", free), ("json_schema", constrained)):
        print(f"{name:>13}: {r['requests']} requests, {r['output_tokens']} tokens in {r['wall_s']:.2f} s = "
              f"{r['output_tokens_per_s']:.1f} tok/s; ITL p50 {r['itl_p50_ms']:.1f} ms p99 {r['itl_p99_ms']:.1f} ms; "
              f"TTFT p50 {r['ttft_p50_ms']:.1f} ms")
    print(f"json_schema outputs that parse: {valid}/{len(constrained['texts'])} (a request cut at --max-tokens "
          f"does not)")
    if free["output_tokens_per_s"] > 0:
        cost = 100 * (1 - constrained["output_tokens_per_s"] / free["output_tokens_per_s"])
        print(f"throughput cost of the constraint: {cost:.1f}% (target: at most 5%)")
        report["throughput_cost_percent"] = cost
    if before is not None and after is not None:
        masks = after[0] - before[0]
        wait = after[1] - before[1]
        print(f"server: {masks:.0f} grammar masks, steps waited {1e3 * wait:.1f} ms for them in all "
              f"({1e6 * wait / masks if masks else 0:.1f} us per mask)")
        report["server_grammar_masks"] = masks
        report["server_mask_wait_s"] = wait
    for r in (free, constrained):
        r.pop("texts")
        r.pop("per_request_tokens")
    report.update({"unconstrained": free, "json_schema": constrained, "json_valid": valid,
                   "concurrency": args.concurrency, "max_tokens": args.max_tokens})
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
