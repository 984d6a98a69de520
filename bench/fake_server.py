#!/usr/bin/env python3
"""A fake OpenAI-compatible streaming server with known timings, to validate bench/serve_client.py.

POST /v1/completions and /v1/chat/completions (stream true) answer with Server-Sent Events over
chunked HTTP/1.1: the first token chunk --ttft-ms after the request was read, then one token chunk
every --itl-ms, max_tokens chunks in all (each chunk's text is one word), then a finish chunk, a
usage chunk when stream_options.include_usage is set (unless --no-usage), and data: [DONE].
Token times are scheduled against the request's arrival (first + k * itl), so a late wake-up does not
shift the tokens after it. Every --fail-every-th request (1-based) gets HTTP 500 instead.

GET /v1/models answers a model list; GET /stats answers what was served so far:
{"requests", "failed", "completion_tokens", "prompt_chars"} and the timings the server actually
produced (sums in ms over the streamed requests: "ttft_ms_sum" first token after arrival,
"e2e_ms_sum" last token after arrival, "tpot_ms_sum" each request's mean gap, with
"timed_requests" and "tpot_count"; "itl_ms_sum" over every gap, with "itl_count"). On a loaded
machine the event loop wakes late, so these, not the injected values, are what a client must measure.

Usage: fake_server.py --port 0 [--ttft-ms 150] [--itl-ms 25] [--no-usage] [--fail-every N]
The bound port is printed on stdout as "PORT <n>" once the server listens.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

stats = {"requests": 0, "failed": 0, "completion_tokens": 0, "prompt_chars": 0, "timed_requests": 0,
         "ttft_ms_sum": 0.0, "e2e_ms_sum": 0.0, "tpot_ms_sum": 0.0, "tpot_count": 0, "itl_ms_sum": 0.0,
         "itl_count": 0}


def http_head(status: str, content_type: str, extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra}Connection: close\r\n\r\n").encode()


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(obj) -> bytes:
    return chunked(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n")


def record_timings(arrival: float, sent: list) -> None:
    if not sent:
        return
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    stats["timed_requests"] += 1
    stats["ttft_ms_sum"] += (sent[0] - arrival) * 1000.0
    stats["e2e_ms_sum"] += (sent[-1] - arrival) * 1000.0
    stats["itl_ms_sum"] += sum(gaps) * 1000.0
    stats["itl_count"] += len(gaps)
    if gaps:
        stats["tpot_ms_sum"] += sum(gaps) / len(gaps) * 1000.0
        stats["tpot_count"] += 1


async def stream_completion(writer, body: dict, chat: bool, args) -> None:
    arrival = time.perf_counter()
    max_tokens = int(body.get("max_tokens") or 16)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and not args.no_usage
    prompt = json.dumps(body.get("messages")) if chat else str(body.get("prompt", ""))
    prompt_tokens = len(prompt.split())
    kind = "chat.completion.chunk" if chat else "text_completion"
    writer.write(http_head("200 OK", "text/event-stream", "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n"))
    await writer.drain()

    def choice(text: str | None, finish: str | None):
        if chat:
            return {"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}
        return {"index": 0, "text": text or "", "finish_reason": finish}

    sent = []
    for k in range(max_tokens):
        due = arrival + (args.ttft_ms + k * args.itl_ms) / 1000.0
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        writer.write(sse({"id": "cmpl-fake", "object": kind, "model": "fake", "choices": [choice(f" w{k}", None)]}))
        await writer.drain()
        sent.append(time.perf_counter())
    record_timings(arrival, sent)
    writer.write(sse({"id": "cmpl-fake", "object": kind, "model": "fake", "choices": [choice(None, "length")]}))
    if include_usage:
        writer.write(sse({"id": "cmpl-fake", "object": kind, "model": "fake", "choices": [],
                          "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                                    "total_tokens": prompt_tokens + max_tokens}}))
    writer.write(sse(b"[DONE]"))
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    stats["completion_tokens"] += max_tokens
    stats["prompt_chars"] += len(prompt)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, args) -> None:
    try:
        request_line = (await reader.readline()).decode("latin-1").split()
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if len(request_line) < 2:
            return
        method, path = request_line[0], request_line[1]
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        if method == "GET" and path in ("/v1/models", "/stats", "/health"):
            payload = json.dumps(stats if path == "/stats" else {"object": "list", "data": [{"id": "fake"}]}).encode()
            writer.write(http_head("200 OK", "application/json", f"Content-Length: {len(payload)}\r\n") + payload)
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            stats["requests"] += 1
            if args.fail_every and stats["requests"] % args.fail_every == 0:
                stats["failed"] += 1
                payload = b'{"error": {"message": "injected failure", "type": "server_error"}}'
                writer.write(http_head("500 Internal Server Error", "application/json",
                                       f"Content-Length: {len(payload)}\r\n") + payload)
            else:
                await stream_completion(writer, json.loads(body), path.endswith("chat/completions"), args)
        else:
            payload = b'{"error": {"message": "not found"}}'
            writer.write(http_head("404 Not Found", "application/json", f"Content-Length: {len(payload)}\r\n") + payload)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def main() -> None:
    p = argparse.ArgumentParser(description="fake OpenAI-compatible streaming server with injected delays")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=150.0)
    p.add_argument("--itl-ms", type=float, default=25.0)
    p.add_argument("--no-usage", action="store_true", help="never send a usage chunk")
    p.add_argument("--fail-every", type=int, default=0, help="every N-th request gets HTTP 500")
    args = p.parse_args()
    server = await asyncio.start_server(lambda r, w: handle(r, w, args), args.host, args.port, backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
