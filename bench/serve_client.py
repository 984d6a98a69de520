#!/usr/bin/env python3
"""Serving benchmark client for any OpenAI-compatible server (Tessera, llama.cpp, vLLM).

Replays a workload against /v1/completions (or /v1/chat/completions) with streaming, and reports
what vLLM's `vllm bench serve` reports, with the same definitions:

  TTFT   time from sending the request to the first chunk that carries generated text
  ITL    gaps between consecutive text chunks, pooled over all requests (per chunk, not per token)
  TPOT   per request (E2E - TTFT) / (output_tokens - 1), only for requests with > 1 output token
  E2E    time from sending the request to its last text chunk
  request / output / total token throughput over the wall time D from the first request sent to
  the last one finished

Output tokens come from the server's usage (stream_options.include_usage) when it sends one, else
from the number of text chunks. Prompt tokens come from usage, else from the workload.

Arrivals: --request-rate inf releases every request at t=0; a finite rate draws gamma-distributed
gaps (shape --burstiness; 1 = exponential = a Poisson process), seeded. --max-concurrency caps the
requests in flight; a request waiting for a slot has not been sent yet, so that wait is not in its
TTFT (as in vLLM).

Workloads: `random` (seeded prompt/output lengths around --random-input-len/--random-output-len
with --random-range-ratio, prompts of random common words cut to the length with a tokenizer when
one is available) and `sharegpt` (a JSONL file of {"prompt", "max_tokens"}, e.g.
bench/workloads/sharegpt_like.jsonl). Every request asks for exactly its output length
(ignore_eos and min_tokens, unless --no-ignore-eos).

Standard library only (asyncio streams speaking HTTP/1.1), so it runs anywhere Python 3.9+ does.

Example:
  python3 bench/serve_client.py --base-url http://127.0.0.1:8000 --dataset-name sharegpt \\
      --num-prompts 64 --max-concurrency 16 --output /tmp/serve.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_WORKLOAD = BENCH_DIR / "workloads" / "sharegpt_like.jsonl"
DEFAULT_TOKENIZER = BENCH_DIR.parent / "models" / "SmolLM2-135M-Instruct-hf" / "tokenizer.json"

# Words for synthetic prompts: common English words, each one token in most BPE vocabularies.
WORDS = ("the of and to in is that it was for on are as with his they at be this from have or by one had "
         "not but what all were when we there can an your which their said if do will each about how up out "
         "them then she many some so these would other into has more her two like him see time could no make "
         "than first been its who now people my made over did down only way find use may water long little "
         "very after words called just where most know get through back much before go good new write our "
         "used me man too any day same right look think also around another came come work three word must "
         "because does part even place well such here take why things help put years different away again "
         "off went old number great tell men say small every found still between name should home big give "
         "air line set own under read last never us left end along while might next sound below saw something "
         "thought both few those always looked show large often together asked house world going want school "
         "important until form food keep children feet land side without boy once animals life enough took "
         "sometimes four head above kind began almost live page got earth need far hand high year mother light "
         "parts country father let night following picture being study second eyes soon times story boys since "
         "white days ever paper hard near sentence better best across during today others however sure means "
         "knew try told young miles sun ways thing whole hear example heard several change answer room sea "
         "against top turned learn point city play toward five using himself usually").split()


@dataclass
class RequestSpec:
    prompt: str
    prompt_len: int | None  # tokens, when the workload knows them
    output_len: int


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    output_tokens_from_usage: bool = False
    ttft: float = 0.0
    latency: float = 0.0                               # E2E: send -> last text chunk
    itl: list[float] = field(default_factory=list)     # gaps between text chunks
    send_time: float = 0.0                             # seconds since the benchmark started
    num_chunks: int = 0


# ---- workloads ---------------------------------------------------------------------------------

def load_tokenizer(path: str | None):
    """A `tokenizers` tokenizer for exact synthetic prompt lengths, or None (then lengths are in words)."""
    candidate = Path(path) if path else DEFAULT_TOKENIZER
    if path == "none" or not candidate.exists():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    return Tokenizer.from_file(str(candidate))


def random_workload(num: int, input_len: int, output_len: int, range_ratio: float, seed: int,
                    tokenizer) -> list[RequestSpec]:
    """Lengths uniform in [len * (1 - ratio), len * (1 + ratio)], as vLLM's random dataset."""
    rng = random.Random(seed)
    specs = []
    for i in range(num):
        n_in = max(1, rng.randint(int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio))))
        n_out = max(1, rng.randint(int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio))))
        # A per-request number first so that no two prompts share a prefix (prefix caches would skew TTFT).
        words = [str(i)] + [rng.choice(WORDS) for _ in range(n_in + 8)]
        text = " ".join(words)
        if tokenizer is not None:
            ids = tokenizer.encode(text, add_special_tokens=False).ids[:n_in]
            text = tokenizer.decode(ids)
            prompt_len = len(tokenizer.encode(text, add_special_tokens=False).ids)
        else:
            text = " ".join(words[:n_in])
            prompt_len = None
        specs.append(RequestSpec(text, prompt_len, n_out))
    return specs


def sharegpt_workload(path: Path, num: int, offset: int, max_output_len: int, tokenizer) -> list[RequestSpec]:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if offset + num > len(lines):
        raise SystemExit(f"--dataset-offset {offset} + --num-prompts {num} exceed the {len(lines)} requests in {path}")
    specs = []
    for entry in lines[offset:offset + num]:
        prompt = entry["prompt"]
        prompt_len = entry.get("prompt_tokens")
        if prompt_len is None and tokenizer is not None:
            prompt_len = len(tokenizer.encode(prompt, add_special_tokens=False).ids)
        output_len = int(entry["max_tokens"])
        if max_output_len:
            output_len = min(output_len, max_output_len)
        specs.append(RequestSpec(prompt, prompt_len, output_len))
    return specs


def arrival_delays(num: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Send times (s after start). Gamma gaps with mean 1/rate; shape 1 = Poisson arrivals."""
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed + 1)
    theta = 1.0 / (rate * burstiness)
    t, out = 0.0, []
    for _ in range(num):
        out.append(t)
        t += rng.gammavariate(burstiness, theta)
    return out


# ---- HTTP/1.1 + SSE over asyncio streams -------------------------------------------------------

class HttpError(Exception):
    pass


async def read_headers(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    if not status_line:
        raise HttpError("connection closed before a response")
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise HttpError(f"bad status line {status_line[:80]!r}")
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def body_pieces(reader: asyncio.StreamReader, headers: dict[str, str]):
    """Yields the body as it arrives: chunked, Content-Length, or until the server closes."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                return
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readline()  # CRLF after each chunk
            yield data
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            data = await reader.read(min(remaining, 65536))
            if not data:
                return
            remaining -= len(data)
            yield data
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


def chunk_text(payload: dict, chat: bool) -> str | None:
    """The generated text of an SSE chunk, or None when it carries no choice (usage-only)."""
    choices = payload.get("choices")
    if not choices:
        return None
    choice = choices[0]
    if chat:
        delta = choice.get("delta") or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


async def send_request(args, spec: RequestSpec, t0: float) -> RequestResult:
    url = urlsplit(args.base_url)
    host, port = url.hostname or "127.0.0.1", url.port or (443 if url.scheme == "https" else 80)
    chat = args.endpoint.endswith("/chat/completions")
    body = {"model": args.model, "max_tokens": spec.output_len, "temperature": args.temperature,
            "stream": True}
    if not args.no_usage:
        body["stream_options"] = {"include_usage": True}
    if not args.no_ignore_eos:
        # ignore_eos: vLLM and Tessera; min_tokens: vLLM, Tessera and llama-cpp-python's server.
        body["ignore_eos"] = True
        body["min_tokens"] = spec.output_len
    if chat:
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    payload = json.dumps(body).encode()
    head = (f"POST {url.path.rstrip('/')}{args.endpoint} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {len(payload)}\r\n"
            + (f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else "")
            + "Connection: close\r\n\r\n").encode()

    result = RequestResult(prompt_len=spec.prompt_len or 0)
    writer = None
    start = time.perf_counter()
    result.send_time = start - t0
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
        writer.write(head + payload)
        await writer.drain()
        status, headers = await read_headers(reader)
        if status != 200:
            text = b"".join([p async for p in body_pieces(reader, headers)]).decode(errors="replace")
            raise HttpError(f"HTTP {status}: {text[:300]}")
        buffer = b""
        last = start
        usage = None
        done = False
        async for piece in body_pieces(reader, headers):
            now = time.perf_counter()
            buffer += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue  # comments (": ping"), event names, ids
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    message = json.loads(data)
                    if "error" in message and not message.get("choices"):
                        raise HttpError(f"error event: {json.dumps(message['error'])[:300]}")
                    if message.get("usage"):
                        usage = message["usage"]
                    text = chunk_text(message, chat)
                    if not text:
                        continue  # usage-only, role-only or finish-only chunk: no token arrived
                    if result.num_chunks == 0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    result.num_chunks += 1
        if not done and not args.allow_no_done:
            raise HttpError("stream ended without data: [DONE]")
        if result.num_chunks == 0:
            raise HttpError("no generated text in the stream")
        result.latency = last - start
        if usage and usage.get("completion_tokens") is not None:
            result.output_tokens = int(usage["completion_tokens"])
            result.output_tokens_from_usage = True
        else:
            result.output_tokens = result.num_chunks
        if usage and usage.get("prompt_tokens") is not None:
            result.prompt_len = int(usage["prompt_tokens"])
        result.success = True
    except (OSError, HttpError, ValueError, asyncio.IncompleteReadError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
    return result


# ---- the run -----------------------------------------------------------------------------------

async def run_benchmark(args, specs: list[RequestSpec]) -> tuple[list[RequestResult], float]:
    delays = arrival_delays(len(specs), args.request_rate, args.burstiness, args.seed)
    semaphore = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    t0 = time.perf_counter()

    async def one(spec: RequestSpec, delay: float) -> RequestResult:
        wait = t0 + delay - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        if semaphore is None:
            return await asyncio.wait_for(send_request(args, spec, t0), args.request_timeout)
        async with semaphore:
            return await asyncio.wait_for(send_request(args, spec, t0), args.request_timeout)

    async def guarded(spec, delay):
        try:
            return await one(spec, delay)
        except asyncio.TimeoutError:
            return RequestResult(error=f"timeout after {args.request_timeout} s", prompt_len=spec.prompt_len or 0)

    results = await asyncio.gather(*(guarded(s, d) for s, d in zip(specs, delays)))
    return list(results), time.perf_counter() - t0


async def get_models(args) -> list[str]:
    """GET /v1/models: the ids the server serves (raises OSError/HttpError when it does not answer)."""
    url = urlsplit(args.base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write((f"GET {url.path.rstrip('/')}/v1/models HTTP/1.1\r\nHost: {host}:{port}\r\n"
                      + (f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else "")
                      + "Connection: close\r\n\r\n").encode())
        await writer.drain()
        status, headers = await read_headers(reader)
        body = b"".join([p async for p in body_pieces(reader, headers)])
        if status != 200:
            raise HttpError(f"GET /v1/models: HTTP {status}")
        return [m.get("id", "") for m in json.loads(body).get("data", [])]
    finally:
        writer.close()


async def wait_ready(args) -> None:
    """Polls GET /v1/models until the server answers (for servers still loading)."""
    deadline = time.time() + args.ready_timeout
    while True:
        try:
            await get_models(args)
            return
        except (OSError, HttpError, ValueError):
            pass
        if time.time() > deadline:
            raise SystemExit(f"server at {args.base_url} not ready after {args.ready_timeout} s")
        await asyncio.sleep(0.5)


def percentile(values: list[float], p: float) -> float:
    """numpy.percentile's default (linear interpolation between closest ranks)."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values_s: list[float], percentiles: list[float]) -> dict:
    """Milliseconds: mean, median, std and the asked percentiles."""
    ms = [v * 1000.0 for v in values_s]
    out = {"mean": sum(ms) / len(ms) if ms else 0.0, "median": percentile(ms, 50)}
    mean = out["mean"]
    out["std"] = math.sqrt(sum((v - mean) ** 2 for v in ms) / len(ms)) if ms else 0.0
    for p in percentiles:
        out[f"p{p:g}"] = percentile(ms, p)
    return out


def compute_metrics(results: list[RequestResult], duration: float, percentiles: list[float]) -> dict:
    ok = [r for r in results if r.success]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_len for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    itls = [gap for r in ok for gap in r.itl]
    return {
        "duration_s": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "output_tokens_from_usage": all(r.output_tokens_from_usage for r in ok) if ok else False,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": output_tokens / duration if duration else 0.0,
        "total_token_throughput": (prompt_tokens + output_tokens) / duration if duration else 0.0,
        "ttft_ms": summary([r.ttft for r in ok], percentiles),
        "tpot_ms": summary(tpots, percentiles),
        "itl_ms": summary(itls, percentiles),
        "e2el_ms": summary([r.latency for r in ok], percentiles),
        "errors": sorted({r.error for r in results if not r.success})[:10],
    }


def print_report(m: dict, args) -> None:
    """The same layout as vLLM's `bench serve` summary."""
    line = "=" * 50
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    rows = [("Successful requests:", m["completed"]), ("Failed requests:", m["failed"]),
            ("Maximum request concurrency:", args.max_concurrency or "inf"),
            ("Request rate configured (RPS):", args.request_rate),
            ("Benchmark duration (s):", f"{m['duration_s']:.2f}"),
            ("Total input tokens:", m["total_input_tokens"]),
            ("Total generated tokens:", m["total_output_tokens"]),
            ("Request throughput (req/s):", f"{m['request_throughput']:.2f}"),
            ("Output token throughput (tok/s):", f"{m['output_throughput']:.2f}"),
            ("Total Token throughput (tok/s):", f"{m['total_token_throughput']:.2f}")]
    for name, value in rows:
        print(f"{name:<40}{value!s:<10}")
    titles = {"ttft_ms": ("Time to First Token", "TTFT"), "tpot_ms": ("Time per Output Token (excl. 1st token)", "TPOT"),
              "itl_ms": ("Inter-token Latency", "ITL"), "e2el_ms": ("End-to-end Latency", "E2EL")}
    for key, (title, short) in titles.items():
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        print(f"{'Mean ' + short + ' (ms):':<40}{m[key]['mean']:<10.2f}")
        print(f"{'Median ' + short + ' (ms):':<40}{m[key]['median']:<10.2f}")
        for p in args.percentiles:
            print(f"{'P' + format(p, 'g') + ' ' + short + ' (ms):':<40}{m[key][f'p{p:g}']:<10.2f}")
    print(line)
    for error in m["errors"]:
        print(f"error: {error}", file=sys.stderr)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root (default %(default)s)")
    p.add_argument("--endpoint", default="/v1/completions", help="/v1/completions or /v1/chat/completions")
    p.add_argument("--model", default=None, help="the request's model field (default: the first of GET /v1/models)")
    p.add_argument("--api-key", default="", help="sent as a Bearer token")
    p.add_argument("--dataset-name", choices=["random", "sharegpt"], default="sharegpt")
    p.add_argument("--dataset-path", type=Path, default=DEFAULT_WORKLOAD, help="JSONL for sharegpt")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--dataset-offset", type=int, default=0,
                   help="sharegpt: skip this many requests (runs on disjoint prompts do not hit prefix caches)")
    p.add_argument("--max-output-len", type=int, default=0, help="sharegpt: cap every request's max_tokens (0: no cap)")
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer.json for exact synthetic prompt lengths ('none': count words)")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s; inf: all at t=0")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1: Poisson)")
    p.add_argument("--max-concurrency", type=int, default=0, help="requests in flight at most (0: no cap)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS")
    p.add_argument("--no-usage", action="store_true", help="do not ask for stream_options.include_usage")
    p.add_argument("--allow-no-done", action="store_true", help="accept streams that end without [DONE]")
    p.add_argument("--num-warmups", type=int, default=0, help="requests sent (and dropped) before the run")
    p.add_argument("--ready-timeout", type=float, default=0.0, help="wait this long for GET /v1/models first")
    p.add_argument("--request-timeout", type=float, default=1800.0)
    p.add_argument("--percentiles", default="90,99", help="comma-separated (default %(default)s)")
    p.add_argument("--label", default="", help="stored in the JSON (e.g. the engine's name)")
    p.add_argument("--output", type=Path, help="write the results as JSON here")
    p.add_argument("--save-detailed", action="store_true", help="include every request's timings in the JSON")
    p.add_argument("--quiet", action="store_true", help="no report on stdout")
    args = p.parse_args(argv)
    args.percentiles = [float(x) for x in args.percentiles.split(",") if x.strip()]
    if args.request_rate <= 0:
        p.error("--request-rate must be > 0 (inf for all at once)")
    if args.burstiness <= 0:
        p.error("--burstiness must be > 0")
    if args.num_prompts < 1:
        p.error("--num-prompts must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    if args.dataset_name == "random":
        specs = random_workload(args.num_prompts, args.random_input_len, args.random_output_len,
                                args.random_range_ratio, args.seed, tokenizer)
    else:
        specs = sharegpt_workload(args.dataset_path, args.num_prompts, args.dataset_offset,
                                  args.max_output_len, tokenizer)

    async def go():
        if args.ready_timeout > 0:
            await wait_ready(args)
        if args.model is None:  # as vLLM's client: the server's (first) model
            try:
                models = await get_models(args)
            except (OSError, HttpError, ValueError) as e:
                raise SystemExit(f"cannot list the models at {args.base_url} ({e}); pass --model")
            args.model = models[0] if models else "default"
        if args.num_warmups:
            warm = await asyncio.gather(*(send_request(args, s, time.perf_counter())
                                          for s in specs[:args.num_warmups]))
            bad = [w.error for w in warm if not w.success]
            if bad:
                print(f"warning: warm-up failed: {bad[0]}", file=sys.stderr)
        return await run_benchmark(args, specs)

    results, duration = asyncio.run(go())
    metrics = compute_metrics(results, duration, args.percentiles)
    if not args.quiet:
        print_report(metrics, args)
    if args.output:
        report = {"label": args.label, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "base_url": args.base_url, "endpoint": args.endpoint, "dataset_name": args.dataset_name,
                  "num_prompts": args.num_prompts,
                  "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
                  "burstiness": args.burstiness, "max_concurrency": args.max_concurrency, "seed": args.seed,
                  **metrics}
        if args.save_detailed:
            report["requests"] = [
                {**{k: v for k, v in asdict(r).items()}, "requested_output_len": s.output_len}
                for r, s in zip(results, specs)]
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if metrics["completed"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
