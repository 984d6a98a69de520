#!/usr/bin/env python3
"""Soak test of `tessera serve`: a long, mixed, abusive load on a small KV pool, with pass/fail criteria.

Starts the real server on the real model with a KV pool far too small for the load (constant
preemption: swaps while the small swap pool has room, recompute when it is full) and runs
--concurrency client streams for --duration: SSE and /v1/ws, chat and completions, some n > 1, some
with logprobs, one in ten with a long prompt, and --disconnect-rate of them cut at a random point
(before the response, after the headers, or after a random number of chunks; half with a TCP reset)
or, on /v1/ws, cancelled in-band. Every few seconds it samples
/metrics and the server's RSS; at regular idle moments it stops starting requests, lets everything
in flight end, and checks that the server holds no stream and no KV block.

SIGHUP: `tessera serve` has no reload behaviour (it handles SIGINT/SIGTERM only, and SIGHUP keeps its
default action, which ends the process), so no SIGHUP is sent.

Criteria (any violation: exit status 1):
  no_5xx              no 5xx response, SSE error event, WebSocket error >= 500 or error final seen by
                      a client, and the server's tessera_http_responses_total{code="5xx"} stays 0
  no_client_errors    every stream not cut on purpose ends properly ([DONE] / final, a finish reason of
                      stop or length), no 4xx, no timeout (--request-timeout)
  no_leaked_blocks    at every idle check and at the end: 0 open streams, 0 used device and host blocks
  flat_rss            after --warmup, the median RSS of the last quarter of the samples is at most
                      --max-rss-growth (fraction) above the median of the first quarter
  healthy_throughout  every /metrics sample answers and says tessera_healthy 1; the process stays up
  progress            every latency window after warm-up completes at least one request (no stall)
  clean_shutdown      SIGTERM at the end: the server exits with status 0 within 60 s
  latency_growth      only with --max-latency-growth F > 0: p50 ITL of the last quarter of the run at
                      most F times that of the first quarter after warm-up (off by default: on a
                      shared machine latency measures the neighbours)

Report (in --out): soak_report.json (configuration, criteria, samples, idle checks, latency windows),
soak_summary.txt (also printed), soak_plot.png when matplotlib is installed, server.log.

Usage: soak.py [--binary build/bin/tessera] [--model MODEL] [--duration 20m] [--out DIR] [...]
Driven by `scripts/test --soak` (20 minutes) and `scripts/soak.sh --hours N`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from serve_client import WORDS, HttpError, body_pieces, percentile, read_headers  # noqa: E402

try:
    import websockets
except ImportError:  # scripts/test installs it
    websockets = None


def parse_duration(text: str) -> float:
    """'90', '90s', '20m', '4h' -> seconds."""
    text = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:], None)
    value = float(text[:-1] if scale else text)
    if value <= 0:
        raise argparse.ArgumentTypeError("a duration must be > 0")
    return value * (scale or 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one request -------------------------------------------------------------------------------

@dataclass
class Spec:
    transport: str        # sse | ws
    endpoint: str         # chat | completions
    n: int
    logprobs: bool
    max_tokens: int
    prompt: str
    seed: int
    cut: str              # none | before_response | after_headers | chunks | cancel (WebSocket only)
    cut_after: int = 0    # chunks (deltas) before the cut
    reset: bool = False   # cut with a TCP reset (SO_LINGER 0) / a dropped transport instead of a close


@dataclass
class Record:
    transport: str
    endpoint: str
    n: int
    logprobs: bool
    cut: str
    start: float = 0.0            # seconds since the run began
    outcome: str = ""             # ok | cut | cancelled | error
    error: str = ""
    status: int = 0               # HTTP status (SSE) or the WebSocket error's status
    five_xx: bool = False
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    seconds: float = 0.0


def make_spec(rng: random.Random, disconnect_rate: float) -> Spec:
    n = rng.choices([1, 2, 3], weights=[80, 15, 5])[0]
    # One in ten prompts is long (a few hundred tokens: long prefills, many blocks at once) with a
    # short answer, so prompt + answer stays within the default --max-model-len 512.
    long_prompt = rng.random() < 0.1
    max_tokens = rng.randint(8, 32) if long_prompt else rng.randint(8, 96)
    words = [rng.choice(WORDS) for _ in range(rng.randint(100, 180) if long_prompt else rng.randint(5, 60))]
    spec = Spec(transport=rng.choice(["sse", "ws"]), endpoint=rng.choice(["chat", "completions"]), n=n,
                logprobs=rng.random() < 0.25, max_tokens=max_tokens, prompt=" ".join(words),
                seed=rng.randint(0, 1 << 30), cut="none")
    if rng.random() < disconnect_rate:
        # A WebSocket generation may also be cancelled in-band ({"type": "cancel"}): the socket stays
        # open and the final must say abort (or stop/length, when it finished first).
        kinds, weights = ["before_response", "after_headers", "chunks"], [15, 10, 75]
        if spec.transport == "ws":
            kinds, weights = kinds + ["cancel"], weights + [40]
        spec.cut = rng.choices(kinds, weights=weights)[0]
        spec.cut_after = rng.randint(1, max(1, max_tokens * n - 1))
        spec.reset = rng.random() < 0.5
    return spec


def request_body(spec: Spec, model: str) -> dict:
    body = {"model": model, "max_tokens": spec.max_tokens, "temperature": 0.8, "seed": spec.seed, "n": spec.n}
    if spec.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
        if spec.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 2
    else:
        body["prompt"] = spec.prompt
        if spec.logprobs:
            body["logprobs"] = 2
    return body


def chunk_has_text(payload: dict) -> bool:
    for c in payload.get("choices") or []:
        delta = c.get("delta") or {}
        if c.get("text") or delta.get("content"):
            return True
    return False


def note_chunk(rec: Record, t0: float, last: list[float]) -> None:
    now = time.perf_counter()
    if rec.ttft is None:
        rec.ttft = now - t0
    else:
        rec.itl.append(now - last[0])
    last[0] = now
    rec.chunks += 1


def hard_close(writer, reset: bool) -> None:
    if reset:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def run_sse(spec: Spec, rec: Record, port: int, model: str) -> None:
    body = dict(request_body(spec, model), stream=True)
    payload = json.dumps(body).encode()
    path = "/v1/chat/completions" if spec.endpoint == "chat" else "/v1/completions"
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    t0 = time.perf_counter()
    try:
        writer.write(head + payload)
        await writer.drain()
        if spec.cut == "before_response":
            await asyncio.sleep(random.uniform(0, 0.5))
            rec.outcome = "cut"
            return hard_close(writer, spec.reset)
        status, headers = await read_headers(reader)
        rec.status = status
        if status != 200:
            text = b"".join([p async for p in body_pieces(reader, headers)]).decode(errors="replace")
            rec.five_xx = status >= 500
            raise HttpError(f"HTTP {status}: {text[:200]}")
        if spec.cut == "after_headers":
            rec.outcome = "cut"
            return hard_close(writer, spec.reset)
        buffer, last, done = b"", [t0], False
        async for piece in body_pieces(reader, headers):
            buffer += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        continue
                    message = json.loads(data)
                    if "error" in message and not message.get("choices"):
                        rec.five_xx = True  # the server's engine_error event (a 500 on a stream)
                        raise HttpError(f"error event: {json.dumps(message['error'])[:200]}")
                    for c in message.get("choices") or []:
                        if c.get("finish_reason"):
                            rec.finish_reasons.append(c["finish_reason"])
                    if chunk_has_text(message):
                        note_chunk(rec, t0, last)
                        if spec.cut == "chunks" and rec.chunks >= spec.cut_after:
                            rec.outcome = "cut"
                            return hard_close(writer, spec.reset)
        if spec.cut == "chunks":  # the stream ended before the chosen cut: a normal end
            spec.cut = "none"
        if not done:
            raise HttpError("stream ended without data: [DONE]")
        bad = [r for r in rec.finish_reasons if r not in ("stop", "length")]
        if bad or len(rec.finish_reasons) != spec.n:
            raise HttpError(f"finish reasons {rec.finish_reasons} for n={spec.n}")
        rec.outcome = "ok"
    finally:
        writer.close()


async def run_ws(spec: Spec, rec: Record, port: int, model: str, timeout: float) -> None:
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/ws", max_size=None, open_timeout=60, ping_interval=None,
                                  close_timeout=5)
    t0 = time.perf_counter()
    try:
        await ws.send(json.dumps({"type": "start", "id": "g", "endpoint": spec.endpoint,
                                  "request": request_body(spec, model)}))
        if spec.cut == "before_response":
            await asyncio.sleep(random.uniform(0, 0.5))
            rec.outcome = "cut"
            return await ws_cut(ws, spec.reset)
        last, cancelled = [t0], False
        while True:
            m = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            kind = m.get("type")
            if kind == "started":
                if spec.cut == "after_headers":
                    rec.outcome = "cut"
                    return await ws_cut(ws, spec.reset)
            elif kind == "delta":
                if m.get("text"):
                    note_chunk(rec, t0, last)
                    if spec.cut == "chunks" and rec.chunks >= spec.cut_after:
                        rec.outcome = "cut"
                        return await ws_cut(ws, spec.reset)
                    if spec.cut == "cancel" and not cancelled and rec.chunks >= spec.cut_after:
                        cancelled = True
                        await ws.send(json.dumps({"type": "cancel", "id": "g"}))
            elif kind == "final":
                rec.finish_reasons = [c.get("finish_reason") for c in m.get("choices", [])]
                if m.get("finish_reason") == "error":
                    rec.five_xx = True
                    raise HttpError(f"error final: {m.get('error', '')[:200]}")
                if cancelled:
                    if m.get("finish_reason") not in ("abort", "stop", "length"):
                        raise HttpError(f"final after a cancel: finish_reason {m.get('finish_reason')}")
                    rec.outcome = "cancelled"
                    return
                if spec.cut == "cancel":  # it ended before the chosen cancel: a normal end
                    spec.cut = "none"
                if spec.cut == "chunks":
                    spec.cut = "none"
                bad = [r for r in rec.finish_reasons if r not in ("stop", "length")]
                if bad or len(rec.finish_reasons) != spec.n:
                    raise HttpError(f"finish reasons {rec.finish_reasons} for n={spec.n}")
                rec.outcome = "ok"
                return
            elif kind == "error":
                rec.status = int(m.get("status", 0))
                rec.five_xx = rec.status >= 500
                raise HttpError(f"ws error {rec.status}: {json.dumps(m.get('error'))[:200]}")
    finally:
        if rec.outcome != "cut":
            await ws.close()


async def ws_cut(ws, reset: bool) -> None:
    transport = getattr(ws, "transport", None)
    if reset and transport is not None:
        transport.abort()  # no close frame: the server learns it from the socket
    else:
        await ws.close()


async def run_one(spec: Spec, rec: Record, args, model: str) -> None:
    t0 = time.perf_counter()
    try:
        coro = run_sse(spec, rec, args.port, model) if spec.transport == "sse" else \
            run_ws(spec, rec, args.port, model, args.request_timeout)
        await asyncio.wait_for(coro, args.request_timeout)
    except asyncio.TimeoutError:
        rec.outcome, rec.error = "error", f"timeout after {args.request_timeout} s"
    except (OSError, HttpError, ValueError, asyncio.IncompleteReadError) as e:
        rec.outcome, rec.error = "error", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - websockets' own errors (ConnectionClosed, InvalidStatus, ...)
        rec.outcome, rec.error = "error", f"{type(e).__name__}: {e}"
    rec.cut = spec.cut
    rec.seconds = time.perf_counter() - t0


# ---- the server and its metrics ----------------------------------------------------------------

async def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            status, headers = await read_headers(reader)
            return status, b"".join([p async for p in body_pieces(reader, headers)])
        finally:
            writer.close()
    return await asyncio.wait_for(go(), timeout)


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                pass
    return values


KV_DEVICE_USED = 'tessera_kv_blocks_used{pool="device"}'
KV_HOST_USED = 'tessera_kv_blocks_used{pool="host"}'
HTTP_5XX = 'tessera_http_responses_total{code="5xx"}'
GAUGES = {"streams_open": "tessera_num_streams_open", "running": "tessera_num_requests_running",
          "waiting": "tessera_num_requests_waiting", "swapped": "tessera_num_requests_swapped",
          "queued": "tessera_num_requests_queued", "device_used": KV_DEVICE_USED, "host_used": KV_HOST_USED,
          "healthy": "tessera_healthy", "http_5xx": HTTP_5XX,
          "preempt_swap": 'tessera_num_preemptions_total{mode="swap"}',
          "preempt_recompute": 'tessera_num_preemptions_total{mode="recompute"}',
          "aborted": 'tessera_request_success_total{finished_reason="abort"}',
          "generated_tokens": "tessera_generation_tokens_total"}


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Soak:
    def __init__(self, args):
        self.args = args
        self.t_start = 0.0
        self.records: list[Record] = []
        self.samples: list[dict] = []
        self.idle_checks: list[dict] = []
        self.in_flight = 0
        self.running = asyncio.Event()  # cleared while an idle check waits for quiet
        self.running.set()
        self.stop = False
        self.model = "default"
        self.proc = None

    def now(self) -> float:
        return time.perf_counter() - self.t_start

    async def metrics(self) -> dict[str, float] | None:
        try:
            status, body = await http_get(self.args.port, "/metrics")
            return parse_metrics(body.decode()) if status == 200 else None
        except (OSError, HttpError, ValueError, asyncio.TimeoutError):
            return None

    async def worker(self, index: int) -> None:
        rng = random.Random(self.args.seed * 100003 + index)
        while not self.stop:
            await self.running.wait()
            if self.stop:
                break
            spec = make_spec(rng, self.args.disconnect_rate)
            rec = Record(spec.transport, spec.endpoint, spec.n, spec.logprobs, spec.cut, start=self.now())
            self.in_flight += 1
            try:
                await run_one(spec, rec, self.args, self.model)
            finally:
                self.in_flight -= 1
            self.records.append(rec)
            if rec.outcome == "error" and len([r for r in self.records if r.outcome == "error"]) <= 5:
                print(f"  [{self.now():7.1f} s] request error: {rec.transport} {rec.endpoint} n={rec.n}: {rec.error}",
                      flush=True)

    async def sampler(self) -> None:
        while not self.stop:
            m = await self.metrics()
            s = {"t": self.now(), "rss": rss_bytes(self.proc.pid), "alive": self.proc.poll() is None,
                 "in_flight": self.in_flight, "ok": m is not None}
            if m:
                s.update({k: m.get(v) for k, v in GAUGES.items()})
            self.samples.append(s)
            await asyncio.sleep(self.args.sample_every)

    async def idle_check(self, label: str) -> dict:
        """Stops new requests, waits for quiet, checks that nothing is held; resumes."""
        self.running.clear()
        t0 = time.perf_counter()
        check = {"t": self.now(), "label": label, "ok": False}
        deadline = t0 + self.args.request_timeout + 30
        while self.in_flight > 0 and time.perf_counter() < deadline:
            await asyncio.sleep(0.1)
        check["clients_quiet_after_s"] = time.perf_counter() - t0
        # Streams a client cut may still be open until the server notices (its next write); then the
        # engine aborts them at its next step and publishes the pools.
        m, deadline = None, time.perf_counter() + 60
        while time.perf_counter() < deadline:
            m = await self.metrics()
            if m and all(m.get(GAUGES[k], 1) == 0 for k in ("streams_open", "running", "waiting", "swapped", "queued",
                                                            "device_used", "host_used")):
                break
            await asyncio.sleep(0.25)
        check["server_idle_after_s"] = time.perf_counter() - t0
        if m:
            check.update({k: m.get(v) for k, v in GAUGES.items()})
        check["ok"] = bool(m) and self.in_flight == 0 and all(
            check.get(k) == 0 for k in ("streams_open", "device_used", "host_used"))
        self.idle_checks.append(check)
        print(f"  [{self.now():7.1f} s] idle check ({label}): {'ok' if check['ok'] else 'FAILED'}: "
              f"streams {check.get('streams_open')}, device blocks used {check.get('device_used')}, host blocks used "
              f"{check.get('host_used')} (quiet after {check['server_idle_after_s']:.1f} s)", flush=True)
        self.running.set()
        return check

    def start_server(self) -> None:
        a = self.args
        a.port = a.port or free_port()
        cmd = [a.binary, "serve", a.model, "--port", str(a.port), "--threads", str(a.threads),
               "--num-kv-blocks", str(a.num_kv_blocks), "--swap-space", str(a.swap_space),
               "--max-model-len", str(a.max_model_len), "--max-num-seqs", str(a.max_num_seqs),
               "--log-level", "warn", "--no-access-log", "--quiet", *a.server_arg]
        self.log_path = a.out / "server.log"
        self.log_file = open(self.log_path, "wb")
        env = dict(os.environ)
        env.pop("TESSERA_FAULT_INJECTION", None)  # a soak measures the real server
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log_file, env=env)
        self.command = cmd
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"soak: the server exited at start ({self.proc.returncode}); see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", a.port), timeout=2) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise SystemExit("soak: the server did not become healthy within 300 s")

    def stop_server(self) -> dict:
        if self.proc.poll() is not None:
            return {"exit_status": self.proc.returncode, "seconds": 0.0, "was_running": False}
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
            return {"exit_status": status, "seconds": time.perf_counter() - t0, "was_running": True, "killed": True}
        self.log_file.close()
        return {"exit_status": status, "seconds": time.perf_counter() - t0, "was_running": True}

    async def run(self) -> dict:
        a = self.args
        try:
            status, body = await http_get(a.port, "/v1/models")
            self.model = json.loads(body)["data"][0]["id"] if status == 200 else "default"
        except (OSError, HttpError, ValueError, KeyError, IndexError, asyncio.TimeoutError):
            pass
        self.t_start = time.perf_counter()
        tasks = [asyncio.create_task(self.worker(i)) for i in range(a.concurrency)]
        sampler = asyncio.create_task(self.sampler())
        next_idle = a.idle_every
        while self.now() < a.duration:
            await asyncio.sleep(min(1.0, max(0.0, a.duration - self.now())))
            if self.proc.poll() is not None:
                print(f"  [{self.now():7.1f} s] the server process died ({self.proc.returncode})", flush=True)
                break
            if self.now() >= next_idle and a.duration - self.now() > a.idle_every / 2:
                await self.idle_check(f"periodic {len(self.idle_checks) + 1}")
                next_idle = self.now() + a.idle_every
        # The end: no new requests; the ones in flight finish (bounded by their timeout).
        final = await self.idle_check("final")
        self.stop = True
        self.running.set()
        await asyncio.wait(tasks, timeout=a.request_timeout + 30)
        await asyncio.sleep(0)  # let the sampler take its last sample
        sampler.cancel()
        return final


# ---- the report ---------------------------------------------------------------------------------

def quantiles(values: list[float]) -> dict:
    ms = [v * 1000.0 for v in values]
    return {"count": len(ms), "p50_ms": percentile(ms, 50) if ms else None, "p99_ms": percentile(ms, 99) if ms else None}


def latency_windows(records: list[Record], duration: float, width: float) -> list[dict]:
    windows = []
    t = 0.0
    while t < duration:
        rs = [r for r in records if t <= r.start < t + width]
        windows.append({"start_s": t, "end_s": min(t + width, duration), "requests": len(rs),
                        "completed": sum(r.outcome == "ok" for r in rs), "cut": sum(r.outcome == "cut" for r in rs),
                        "errors": sum(r.outcome == "error" for r in rs),
                        "ttft": quantiles([r.ttft for r in rs if r.ttft is not None]),
                        "itl": quantiles([g for r in rs for g in r.itl])})
        t += width
    return windows


def evaluate(soak: Soak, shutdown: dict, final_check: dict) -> tuple[dict, dict]:
    a, records, samples = soak.args, soak.records, soak.samples
    errors = [r for r in records if r.outcome == "error"]
    client_5xx = [r for r in records if r.five_xx]
    last = next((s for s in reversed(samples) if s.get("ok")), {})
    server_5xx = last.get("http_5xx")
    criteria = {}
    criteria["no_5xx"] = {"ok": not client_5xx and server_5xx == 0, "client_5xx": len(client_5xx),
                          "server_5xx_counter": server_5xx,
                          "examples": sorted({r.error for r in client_5xx})[:5]}
    non_5xx = [r for r in errors if not r.five_xx]
    criteria["no_client_errors"] = {"ok": not non_5xx, "errors": len(non_5xx),
                                    "examples": sorted({r.error for r in non_5xx})[:5]}
    bad_checks = [c for c in soak.idle_checks if not c["ok"]]
    criteria["no_leaked_blocks"] = {"ok": not bad_checks and bool(soak.idle_checks) and final_check["ok"],
                                    "idle_checks": len(soak.idle_checks), "failed": bad_checks[:5]}
    after = [s for s in samples if s["t"] >= a.warmup and s.get("rss")]
    rss = {"ok": False, "samples": len(after), "max_growth": a.max_rss_growth}
    if len(after) >= 8:
        q = len(after) // 4
        first = statistics.median(s["rss"] for s in after[:q])
        last_q = statistics.median(s["rss"] for s in after[-q:])
        growth = (last_q - first) / first
        rss.update({"ok": growth <= a.max_rss_growth, "first_quarter_median_mib": first / 2**20,
                    "last_quarter_median_mib": last_q / 2**20, "growth": growth,
                    "min_mib": min(s["rss"] for s in after) / 2**20, "max_mib": max(s["rss"] for s in after) / 2**20})
    else:
        rss["error"] = f"only {len(after)} samples after the {a.warmup:.0f} s warm-up (need 8)"
    criteria["flat_rss"] = rss
    unhealthy = [s for s in samples if not s.get("ok") or s.get("healthy") != 1 or not s.get("alive")]
    criteria["healthy_throughout"] = {"ok": not unhealthy and shutdown.get("was_running", False),
                                      "bad_samples": len(unhealthy), "first_bad": unhealthy[:3]}
    windows = latency_windows(records, a.duration, a.window)
    stalled = [w for w in windows if w["start_s"] >= a.warmup and w["end_s"] - w["start_s"] >= a.window / 2
               and w["completed"] == 0]
    criteria["progress"] = {"ok": not stalled, "windows_without_completions": [w["start_s"] for w in stalled]}
    criteria["clean_shutdown"] = {"ok": shutdown.get("exit_status") == 0 and not shutdown.get("killed"), **shutdown}
    if a.max_latency_growth > 0:
        span = a.duration - a.warmup
        first = [g for r in records if a.warmup <= r.start < a.warmup + span / 4 for g in r.itl]
        last_itl = [g for r in records if r.start >= a.duration - span / 4 for g in r.itl]
        p_first, p_last = percentile(first, 50), percentile(last_itl, 50)
        criteria["latency_growth"] = {"ok": bool(first and last_itl) and p_last <= a.max_latency_growth * p_first,
                                      "first_quarter_p50_itl_ms": p_first * 1000, "last_quarter_p50_itl_ms": p_last * 1000,
                                      "max_growth": a.max_latency_growth}
    by = lambda key: {k: sum(getattr(r, key) == k for r in records) for k in sorted({getattr(r, key) for r in records})}
    totals = {"requests": len(records), "completed": sum(r.outcome == "ok" for r in records),
              "cut": sum(r.outcome == "cut" for r in records), "cancelled": sum(r.outcome == "cancelled" for r in records),
              "errors": len(errors),
              "by_transport": by("transport"), "by_endpoint": by("endpoint"), "by_n": by("n"),
              "with_logprobs": sum(r.logprobs for r in records), "by_cut": by("cut"),
              "ttft": quantiles([r.ttft for r in records if r.ttft is not None]),
              "itl": quantiles([g for r in records for g in r.itl]),
              "server": {k: last.get(k) for k in ("preempt_swap", "preempt_recompute", "aborted", "generated_tokens")},
              "windows": windows}
    return criteria, totals


def summary_text(soak: Soak, criteria: dict, totals: dict) -> str:
    a = soak.args
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    lines = [f"Tessera soak: {a.duration:.0f} s, {a.concurrency} concurrent streams, {a.disconnect_rate:.0%} cut by the "
             f"client; KV pool {a.num_kv_blocks} blocks, swap {a.swap_space} GiB; model {Path(a.model).name}",
             f"requests: {totals['requests']} started, {totals['completed']} completed, {totals['cut']} cut, {totals['cancelled']} cancelled, "
             f"{totals['errors']} errors; transports {totals['by_transport']}, endpoints {totals['by_endpoint']}, "
             f"n {totals['by_n']}, {totals['with_logprobs']} with logprobs",
             f"server: preemptions swap {fmt(totals['server']['preempt_swap'])} / recompute "
             f"{fmt(totals['server']['preempt_recompute'])}, aborted {fmt(totals['server']['aborted'])}, generated tokens "
             f"{fmt(totals['server']['generated_tokens'])}",
             "SIGHUP: not sent (tessera serve has no reload behaviour; SIGHUP's default action would end it)"]
    rss = criteria["flat_rss"]
    if "growth" in rss:
        lines.append(f"RSS after warm-up ({a.warmup:.0f} s): first quarter median {rss['first_quarter_median_mib']:.1f} MiB, "
                     f"last quarter {rss['last_quarter_median_mib']:.1f} MiB ({rss['growth']:+.2%}, limit "
                     f"{a.max_rss_growth:+.0%}); range {rss['min_mib']:.1f}-{rss['max_mib']:.1f} MiB")
    lines.append(f"idle checks: {len(soak.idle_checks)}, " + ", ".join(
        f"{c['label']} at {c['t']:.0f} s {'ok' if c['ok'] else 'LEAK'} (device {fmt(c.get('device_used'))}, host "
        f"{fmt(c.get('host_used'))}, streams {fmt(c.get('streams_open'))})" for c in soak.idle_checks))
    lines.append(f"latency over the whole run: TTFT p50 {fmt(totals['ttft']['p50_ms'])} ms p99 {fmt(totals['ttft']['p99_ms'])} "
                 f"ms; ITL p50 {fmt(totals['itl']['p50_ms'])} ms p99 {fmt(totals['itl']['p99_ms'])} ms")
    lines.append("  window (s)     reqs  done   cut  err   TTFT p50/p99 (ms)    ITL p50/p99 (ms)")
    for w in totals["windows"]:
        lines.append(f"  {w['start_s']:6.0f}-{w['end_s']:<6.0f} {w['requests']:5d} {w['completed']:5d} {w['cut']:5d} "
                     f"{w['errors']:4d}   {fmt(w['ttft']['p50_ms']):>8}/{fmt(w['ttft']['p99_ms']):<9}   "
                     f"{fmt(w['itl']['p50_ms']):>7}/{fmt(w['itl']['p99_ms']):<8}")
    for name, c in criteria.items():
        detail = {k: v for k, v in c.items() if k not in ("ok", "failed", "first_bad") and v not in (None, [], {})}
        lines.append(f"{'PASS' if c['ok'] else 'FAIL'} {name}: {json.dumps(detail, default=str)[:300]}")
    lines.append("RESULT: " + ("PASS" if all(c["ok"] for c in criteria.values()) else "FAIL"))
    return "\n".join(lines)


def plot(soak: Soak, totals: dict, path: Path) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot (matplotlib is not installed)"
    s = [x for x in soak.samples if x.get("ok")]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    axes[0].plot([x["t"] for x in s if x.get("rss")], [x["rss"] / 2**20 for x in s if x.get("rss")])
    axes[0].set_ylabel("RSS (MiB)")
    axes[1].plot([x["t"] for x in s], [x["device_used"] for x in s], label="device blocks used")
    axes[1].plot([x["t"] for x in s], [x["host_used"] for x in s], label="host blocks used")
    axes[1].plot([x["t"] for x in s], [x["streams_open"] for x in s], label="open streams")
    axes[1].legend()
    w = totals["windows"]
    mid = [(x["start_s"] + x["end_s"]) / 2 for x in w]
    for key, style in (("ttft", "-"), ("itl", "--")):
        for q in ("p50_ms", "p99_ms"):
            axes[2].plot(mid, [x[key][q] for x in w], style, label=f"{key.upper()} {q[:3]}")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("ms")
    axes[2].set_xlabel("seconds")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path)
    return f"plot: {path}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default=str(ROOT / "build" / "bin" / "tessera"))
    p.add_argument("--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--duration", type=parse_duration, default=parse_duration("20m"), help="e.g. 150s, 20m, 4h")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--disconnect-rate", type=float, default=0.3)
    p.add_argument("--num-kv-blocks", type=int, default=64, help="device KV pool (small: constant preemption)")
    p.add_argument("--swap-space", type=float, default=0.01, help="host swap pool in GiB (small: it fills up)")
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="the server's compute threads (0: all cores)")
    p.add_argument("--server-arg", action="append", default=[], help="extra argument for tessera serve (repeatable)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup", type=parse_duration, default=None,
                   help="excluded from the RSS and progress criteria (default: 15%% of the run, 20 s to 10 min)")
    p.add_argument("--sample-every", type=float, default=3.0, help="seconds between /metrics + RSS samples")
    p.add_argument("--idle-every", type=parse_duration, default=None,
                   help="seconds between idle checks (default: a fifth of the run, 60 s to 15 min)")
    p.add_argument("--window", type=parse_duration, default=None,
                   help="latency window (default: a tenth of the run, 30 s to 10 min)")
    p.add_argument("--max-rss-growth", type=float, default=0.10, help="flat RSS: fraction (default 0.10)")
    p.add_argument("--max-latency-growth", type=float, default=0.0, help="factor; 0: no latency criterion")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=None, help="report directory (default build/soak-<time>)")
    a = p.parse_args(argv)
    a.warmup = a.warmup if a.warmup is not None else min(600.0, max(20.0, 0.15 * a.duration))
    a.idle_every = a.idle_every if a.idle_every is not None else min(900.0, max(60.0, a.duration / 5))
    a.window = a.window if a.window is not None else min(600.0, max(30.0, a.duration / 10))
    a.out = a.out or ROOT / "build" / time.strftime("soak-%Y%m%d-%H%M%S")
    a.out.mkdir(parents=True, exist_ok=True)
    if websockets is None:
        print("soak: the websockets package is missing (pip install websockets)", file=sys.stderr)
        return 2
    for f, what in ((a.binary, "--binary"), (a.model, "--model")):
        if not Path(f).exists():
            print(f"soak: {what} {f} does not exist", file=sys.stderr)
            return 2

    soak = Soak(a)
    soak.start_server()
    print(f"soak: {soak.command[0]} serve on port {a.port}, pid {soak.proc.pid}; {a.duration:.0f} s, report in {a.out}",
          flush=True)
    try:
        final_check = asyncio.run(soak.run())
    finally:
        shutdown = soak.stop_server()
    criteria, totals = evaluate(soak, shutdown, final_check)
    text = summary_text(soak, criteria, totals)
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": soak.command,
              "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
              "passed": all(c["ok"] for c in criteria.values()), "criteria": criteria, "totals": totals,
              "idle_checks": soak.idle_checks, "samples": soak.samples,
              "sighup": "not sent: tessera serve has no reload behaviour",
              "errors": [asdict(r) for r in soak.records if r.outcome == "error"][:50]}
    (a.out / "soak_report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (a.out / "soak_summary.txt").write_text(text + "\n")
    print(text)
    print(plot(soak, totals, a.out / "soak_plot.png"))
    print(f"report: {a.out / 'soak_report.json'}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
