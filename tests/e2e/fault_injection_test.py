#!/usr/bin/env python3
"""End-to-end: `tessera serve` on the real model with injected engine faults (TESSERA_FAULT_INJECTION).

One server per plan (actors/fault_injection.hpp); after each, the pools are reported free on /metrics:
  * stalls only: steps stall for 300 ms at random; every SSE, WebSocket and plain request completes,
    the greedy stream equals the greedy non-streaming answer, /health stays 200, the pool ends free;
  * a stall then a throw at a fixed step while an SSE stream, a WebSocket generation and a plain
    request run: the SSE stream ends with its finish chunks, an OpenAI-shaped error event and
    [DONE]; the WebSocket final says error; the plain request gets a 500 with an OpenAI error body;
    /health answers 503 and keeps answering (the process stays up), new requests get 503, the pools
    are reported free, and SIGTERM still ends the process cleanly;
  * an allocation that fails (std::bad_alloc out of a step) in the middle of parallel requests: each
    ends with an OpenAI-shaped error (500, or the SSE error event) that names it, /health says 503;
  * every tokenizer actor dies on the prompt it encodes: text requests fail with an error naming the
    tokenizer, token-id prompts (which need no tokenizer) succeed, /health stays 200;
  * tokenizer actors die on a third of the prompts under parallel load: the dead ones are replaced
    (tessera_tokenizer_restarts_total), the prompts they held are encoded again, every request
    completes, and the answers equal those of a server without faults (greedy);
  * a full host swap pool (swap preemption, a pool of a few blocks, a device pool too small for the
    load): the preemptions that do not fit fall back to recompute, every request completes with the
    answer of a server with room (greedy), /health stays 200.
Usage: fault_injection_test.py TESSERA_BINARY MODEL
"""
import asyncio
import http.client
import json
import os
import sys
import threading
import time

BIN, MODEL = sys.argv[1], sys.argv[2]
import websockets  # scripts/test installs it: a missing module is a failure, not a skip

from served import case, served, summary  # tests/e2e/served.py

BASE = ["--threads", "2", "--max-model-len", "1024", "--quiet"]
ENGINE = [*BASE, "--num-kv-blocks", "96", "--swap-space", "0.05"]


class server(served):
    def __init__(self, plan, extra=(), engine=ENGINE):
        env = dict(os.environ)
        env.pop("TESSERA_FAULT_INJECTION", None)
        if plan:
            env["TESSERA_FAULT_INJECTION"] = plan
        super().__init__([BIN, "serve", MODEL, *engine, *extra], log_prefix="tessera-fault-", env=env)
        assert ("fault injection enabled" in self.log()) == bool(plan), self.log()

    def request(self, method, path, body=None, timeout=120):  # (status, body bytes)
        return super().request(method, path, body, timeout=timeout)[:2]

    def sse(self, path, body, timeout=120):
        """(status, list of data payloads) of a streaming request, read to the end."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request("POST", path, body=json.dumps(dict(body, stream=True)), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read().decode()
        c.close()
        if r.status != 200:
            return r.status, [raw]
        return r.status, [e[len("data: "):] for e in raw.split("\n\n") if e.startswith("data: ")]

    def stop(self, expect_clean=True):
        super().stop(expect_clean)


def wait_pools_free(srv, timeout=15):
    deadline, m = time.time() + timeout, {}
    while time.time() < deadline:
        m = srv.metrics()
        if (m['tessera_kv_blocks_used{pool="device"}'] == 0 and m['tessera_kv_blocks_used{pool="host"}'] == 0
                and m["tessera_num_streams_open"] == 0):
            return m
        time.sleep(0.2)
    raise AssertionError({k: v for k, v in m.items() if "kv_blocks_used" in k or "streams_open" in k})


def openai_error(payload):
    """The error object of an OpenAI-shaped error body / event: {"error": {"message", "type", "param", "code"}}."""
    e = json.loads(payload)["error"]
    assert isinstance(e, dict) and e["message"] and e["type"] and "param" in e and "code" in e, e
    return e


async def ws_generation(port, request, timeout=120):
    """The messages of one /v1/ws generation, through its final."""
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/ws") as ws:
        await ws.send(json.dumps({"type": "start", "id": "g", "request": request}))
        out = []
        while True:
            m = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            out.append(m)
            if m["type"] in ("final", "error"):
                return out


def in_thread(fn, *args):
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except Exception as e:  # noqa: BLE001
            box["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, box


def result_of(t, box, timeout=120):
    t.join(timeout)
    assert not t.is_alive(), "a request hangs"
    if "error" in box:
        raise box["error"]
    return box["value"]


CHAT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def stalls_delay_steps_but_every_request_completes():
    srv = server("seed=3,rate=0.3,kinds=stall,stall_ms=300")
    try:
        body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
        sse = in_thread(srv.sse, "/v1/completions", body)
        ws = in_thread(lambda: asyncio.run(ws_generation(srv.port, {"messages": CHAT, "max_tokens": 10})))
        status, plain = srv.request("POST", "/v1/completions", body)
        assert status == 200, plain
        status, events = result_of(*sse)
        assert status == 200 and events[-1] == "[DONE]", events
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("error" in c for c in chunks), chunks
        text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        assert text == json.loads(plain)["choices"][0]["text"], (text, plain)
        final = result_of(*ws)[-1]
        assert final["type"] == "final" and final["finish_reason"] in ("stop", "length"), final
        assert srv.request("GET", "/health")[0] == 200
        m = wait_pools_free(srv)
        assert m["tessera_failed_steps_total"] == 0 and m["tessera_healthy"] == 1, m
        assert "fault injection" not in srv.log().split("fault injection enabled", 1)[1], srv.log()
    finally:
        srv.stop()


def an_executor_failure_ends_streams_with_an_openai_error_and_health_turns_503():
    # Calls 1-10 run (prefill and the first tokens of the three requests), call 11 stalls 2 s and throws.
    srv = server("seed=1,rate=1,kinds=stall_throw,stall_ms=2000,after=10")
    try:
        long = {"max_tokens": 400, "ignore_eos": True, "temperature": 0.8, "seed": 4}
        sse = in_thread(srv.sse, "/v1/completions", dict(long, prompt="Once upon a time"))
        ws = in_thread(lambda: asyncio.run(ws_generation(srv.port, dict(long, messages=CHAT))))
        plain = in_thread(srv.request, "POST", "/v1/chat/completions", dict(long, messages=CHAT))

        status, events = result_of(*sse)
        assert status == 200, events
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        errors = [c for c in chunks if "error" in c]
        assert len(errors) == 1, chunks[-3:]
        e = openai_error(json.dumps(errors[0]))
        assert "fault injection: stall_throw" in e["message"], e
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")]
        assert finishes == ["error"], finishes
        assert any(c.get("choices") and c["choices"][0].get("text") for c in chunks), "tokens streamed before the failure"

        final = result_of(*ws)[-1]
        assert final["type"] == "final" and final["finish_reason"] == "error", final
        assert "fault injection" in final["error"], final

        status, body = result_of(*plain)
        assert status == 500, (status, body)
        assert "fault injection" in openai_error(body)["message"]

        for _ in range(3):  # the process stays up and keeps saying so
            status, body = srv.request("GET", "/health")
            assert status == 503, (status, body)
            assert "fault injection" in openai_error(body)["message"]
            time.sleep(0.5)
        assert srv.proc.poll() is None, "the server process exited"
        status, body = srv.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert status == 503, (status, body)
        openai_error(body)
        m = wait_pools_free(srv)
        assert m["tessera_healthy"] == 0 and m["tessera_failed_steps_total"] >= 1, m
    finally:
        srv.stop()


def a_tokenizer_death_fails_only_its_request_and_the_server_stays_healthy():
    srv = server("seed=5,tokenizer_exit=1")
    try:
        status, body = srv.request("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4}, timeout=60)
        assert status == 500, (status, body)  # the server's failure, not the client's
        assert "tokenizer" in openai_error(body)["message"], body
        print(f"  a text prompt whose tokenizer actor died: HTTP {status}: {openai_error(body)['message']}")
        status, body = srv.request("POST", "/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 4}, timeout=60)
        assert status == 200, (status, body)
        assert json.loads(body)["usage"]["completion_tokens"] == 4, body
        assert srv.request("GET", "/health")[0] == 200
        m = wait_pools_free(srv)
        assert m["tessera_healthy"] == 1, m
    finally:
        srv.stop()


def a_failed_allocation_ends_the_requests_with_an_openai_error():
    # Step 12 throws std::bad_alloc while two completions and an SSE stream decode.
    srv = server("at=12,kinds=bad_alloc")
    try:
        long = {"max_tokens": 300, "ignore_eos": True, "temperature": 0.8, "seed": 9}
        plains = [in_thread(srv.request, "POST", "/v1/completions", dict(long, prompt=p))
                  for p in ("The river", "In the morning")]
        status, events = srv.sse("/v1/chat/completions", dict(long, messages=CHAT))
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        errors = [json.loads(e) for e in events[:-1] if "error" in json.loads(e)]
        assert len(errors) == 1 and "bad_alloc" in openai_error(json.dumps(errors[0]))["message"], events[-3:]
        for t in plains:
            status, body = result_of(*t)
            assert status == 500, (status, body)
            assert "bad_alloc" in openai_error(body)["message"], body
        status, body = srv.request("GET", "/health")
        assert status == 503 and "bad_alloc" in openai_error(body)["message"], (status, body)
        m = wait_pools_free(srv)
        assert m["tessera_failed_steps_total"] == 1 and m["tessera_engine_steps_total"] >= 12, m
    finally:
        srv.stop()


def greedy_answers(srv, prompts, max_tokens, allow_error=None, ignore_eos=False):
    """The texts of parallel greedy completions of `prompts` (chat and plain alternately), all 200;
    where allow_error(status, body) holds for a failed one, its (status, error message) instead."""
    def one(i, p):
        if i % 2:
            status, body = srv.request("POST", "/v1/chat/completions",
                                       {"messages": [{"role": "user", "content": p}], "max_tokens": max_tokens,
                                        "temperature": 0, "ignore_eos": ignore_eos})
            if status != 200 and allow_error and allow_error(status, body):
                return status, openai_error(body)["message"]
            assert status == 200, (status, body)
            return json.loads(body)["choices"][0]["message"]["content"]
        status, body = srv.request("POST", "/v1/completions", {"prompt": p, "max_tokens": max_tokens, "temperature": 0,
                                                                 "ignore_eos": ignore_eos})
        if status != 200 and allow_error and allow_error(status, body):
            return status, openai_error(body)["message"]
        assert status == 200, (status, body)
        return json.loads(body)["choices"][0]["text"]
    threads = [in_thread(one, i, p) for i, p in enumerate(prompts)]
    return [result_of(*t) for t in threads]


PROMPTS = [f"Tell me fact number {i} about {w}." for i, w in
           enumerate(["whales", "the moon", "copper", "rivers", "owls", "glass", "tea", "volcanoes", "bread", "ice",
                      "maps", "bees"])]


def tokenizer_deaths_under_load_are_recovered_from():
    # tokenizer_exit=0.3: the plan poisons about a third of the prompts (keyed on their content): each
    # kills every tokenizer actor that encodes it. 12 requests at once: the ones queued
    # behind a poisoned one when its actor dies are bounced and must be encoded again.
    reference = server("")
    try:
        expected = greedy_answers(reference, PROMPTS, 16)
    finally:
        reference.stop()
    srv = server("seed=11,tokenizer_exit=0.3")
    try:
        got = greedy_answers(srv, PROMPTS, 16, allow_error=lambda status, body: status == 500 and
                             "tokenizer actor died while encoding this prompt" in openai_error(body)["message"])
        failed = [i for i, g in enumerate(got) if isinstance(g, tuple)]
        assert 0 < len(failed) < len(PROMPTS) / 2, got  # the seed poisons some, not most
        wrong = [(i, g, expected[i]) for i, g in enumerate(got) if i not in failed and g != expected[i]]
        assert not wrong, wrong
        m = wait_pools_free(srv)
        assert m["tessera_tokenizer_restarts_total"] == 2 * len(failed), (m["tessera_tokenizer_restarts_total"], failed)
        assert m["tessera_healthy"] == 1 and srv.request("GET", "/health")[0] == 200
        assert m['tessera_request_success_total{finished_reason="error"}'] == len(failed), m
        print(f"  poisoned prompts {failed}: each killed 2 tokenizer actors and failed with a 500; the other "
              f"{len(PROMPTS) - len(failed)} completed with the fault-free server's answers")
    finally:
        srv.stop()


def a_full_swap_pool_falls_back_to_recompute():
    # 40 device blocks of 16 tokens for 12 parallel requests of ~25 + 120 tokens (ignore_eos): constant
    # preemption.
    small = ["--num-kv-blocks", "40", "--preemption-mode", "swap", "--max-num-seqs", "12"]
    prompts = PROMPTS
    roomy = server("", ["--preemption-mode", "swap"], engine=BASE)
    try:
        expected = greedy_answers(roomy, prompts, 120, ignore_eos=True)
    finally:
        roomy.stop()
    # --swap-space 0.005 GiB: a host pool of 14 blocks (fp16 KV, the default), room for a few
    # swapped-out requests, not all.
    srv = server("", [*small, "--swap-space", "0.005"], engine=BASE)
    try:
        got = greedy_answers(srv, prompts, 120, ignore_eos=True)
        assert got == expected, [(g, e) for g, e in zip(got, expected) if g != e]
        m = wait_pools_free(srv)
        recompute = m['tessera_num_preemptions_total{mode="recompute"}']
        swap = m['tessera_num_preemptions_total{mode="swap"}']
        assert swap > 0 and recompute > 0, (swap, recompute)  # some swaps fit, the full pool forced the rest
        assert 0 < m['tessera_kv_blocks_capacity{pool="host"}'] < 16, m['tessera_kv_blocks_capacity{pool="host"}']
        assert m["tessera_healthy"] == 1 and srv.request("GET", "/health")[0] == 200
        host_blocks = int(m['tessera_kv_blocks_capacity{pool="host"}'])
        print(f"  host pool {host_blocks} blocks: {int(swap)} swap and "
              f"{int(recompute)} recompute preemptions, all {len(prompts)} requests equal the roomy server's")
    finally:
        srv.stop()


def main():
    for fn in (stalls_delay_steps_but_every_request_completes,
               an_executor_failure_ends_streams_with_an_openai_error_and_health_turns_503,
               a_failed_allocation_ends_the_requests_with_an_openai_error,
               a_tokenizer_death_fails_only_its_request_and_the_server_stays_healthy,
               tokenizer_deaths_under_load_are_recovered_from,
               a_full_swap_pool_falls_back_to_recompute):
        case(fn)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
