#!/usr/bin/env python3
"""End-to-end tests of `tessera serve` on the real default model.

Starts the real server on a free loopback port with a small KV pool, then drives it with the official
`openai` client (completions and chat, streaming and not, n > 1, stop, logprobs), the `websockets`
client (/v1/ws, /v1/events), and raw HTTP for a table of bad inputs that must each get their status
and error message. Streams are closed at random points and the KV pool must come back fully free.
Prints "N passed, M failed" and exits non-zero on any failure.
Usage: server_test.py TESSERA_BINARY MODEL
"""
import asyncio
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

from served import case, free_port, missing_client, served, summary  # tests/e2e/served.py

BIN, MODEL = sys.argv[1], sys.argv[2]
try:
    import openai
    import websockets
except ImportError as e:  # the lead's scripts/setup installs them
    missing_client(e, "pip install openai websockets")

ENGINE = ["--threads", "2", "--num-kv-blocks", "96", "--swap-space", "0.05", "--max-model-len", "1024", "--quiet"]


class server(served):
    def __init__(self, *extra):
        super().__init__([BIN, "serve", MODEL, *ENGINE, *extra])

    def raw(self, data, timeout=10, until_close=False):
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            out = b""
            try:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                    if b"\r\n\r\n" in out and not until_close:
                        head, _, rest = out.partition(b"\r\n\r\n")
                        m = re.search(rb"content-length: *(\d+)", head, re.I)
                        if m and len(rest) >= int(m.group(1)):
                            break
            except socket.timeout:
                pass
        return out

    def wait_log(self, ready, timeout=10):
        """The log once ready(log) holds (lines are written by the server's logging thread)."""
        deadline = time.time() + timeout
        while True:
            log = self.log()
            if ready(log) or time.time() > deadline:
                return log
            time.sleep(0.05)

    def json_log(self, ready=lambda records: True):
        def records_of(log):
            return [json.loads(ln) for ln in log.splitlines() if ln.startswith("{")]
        return records_of(self.wait_log(lambda log: ready(records_of(log))))


srv = server()
client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0, timeout=120)
MODEL_ID = os.path.basename(MODEL)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@case
def models_lists_the_served_model():
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL_ID], ids


@case
def completion_greedy_stream_equals_non_stream():
    r = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=12, temperature=0)
    text = r.choices[0].text
    assert text and r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0, r
    assert r.choices[0].finish_reason in ("stop", "length"), r
    timings = r.model_extra.get("timings")
    assert timings and timings["first_token_seconds"] > 0 and "queue_seconds" in timings, r.model_extra
    chunks = list(client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=12,
                                            temperature=0, stream=True))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == text, (streamed, text)
    token_chunks = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    # At most one token per chunk, and never a chunk without text (a token whose text is held back, or
    # EOS, goes with the next chunk or none).
    assert 0 < len(token_chunks) <= r.usage.completion_tokens, (len(token_chunks), r.usage)
    assert all(c.choices[0].text for c in token_chunks), [c.choices[0].text for c in token_chunks]
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


@case
def chat_greedy_answers_and_streams_the_same():
    r = client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    # Oracle: the offline CLI (llm_engine directly, no actors, no server) renders and decodes the same.
    cli = subprocess.run([BIN, "generate", "--model", MODEL, *ENGINE, "--chat", "--temperature", "0", "--max-tokens", "24",
                          "--prompt", CHAT[0]["content"]], capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and cli.stdout.rstrip("\n") == text, (cli.stdout, text, cli.stderr)
    assert r.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content, chunks[0]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text, (streamed, text)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == r.usage.completion_tokens, chunks[-1]
    assert not chunks[-1].choices


@case
def n_greater_than_one_gives_n_choices():
    r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=1.0, n=3, seed=5)
    assert sorted(c.index for c in r.choices) == [0, 1, 2], r
    assert r.usage.completion_tokens <= 3 * 8 and len({c.text for c in r.choices}) > 1, r  # sampled: they differ
    chunks = list(client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=1.0,
                                            n=3, seed=5, stream=True))
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1, 2}, finished


@case
def stop_string_ends_the_text_before_it():
    full = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4, 5,", max_tokens=24, temperature=0).choices[0].text
    assert " 8" in full, full
    r = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4, 5,", max_tokens=24, temperature=0, stop=[" 8"])
    assert r.choices[0].finish_reason == "stop", r
    assert r.choices[0].text == full[: full.index(" 8")], (r.choices[0].text, full)


@case
def logprobs_completions_and_chat():
    r = client.completions.create(model=MODEL_ID, prompt="Hello", max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == r.usage.completion_tokens == len(lp.token_logprobs), lp
    assert all(x <= 0 for x in lp.token_logprobs), lp.token_logprobs
    assert all(len(t) == 3 for t in lp.top_logprobs), lp.top_logprobs
    # Greedy: the chosen token is the most likely one.
    assert all(abs(max(t.values()) - x) < 1e-4 for t, x in zip(lp.top_logprobs, lp.token_logprobs)), lp
    c = client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == c.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content), content


@case
def tokenize_detokenize_round_trip():
    status, data, _ = srv.request("POST", "/tokenize", {"prompt": "Hello world", "add_special_tokens": False})
    assert status == 200, data
    tokens = json.loads(data)["tokens"]
    assert tokens and json.loads(data)["count"] == len(tokens)
    status, data, _ = srv.request("POST", "/detokenize", {"tokens": tokens})
    assert status == 200 and json.loads(data)["prompt"] == "Hello world", data
    # Chat: the same ids the engine counts as prompt tokens.
    status, data, _ = srv.request("POST", "/tokenize", {"messages": CHAT})
    assert status == 200, data
    r = client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=1)
    assert json.loads(data)["count"] == r.usage.prompt_tokens, (data, r.usage)


@case
def metrics_exposes_the_engine():
    m = srv.metrics()
    for name in ['tessera_kv_blocks_capacity{pool="device"}', "tessera_num_requests_running",
                 'tessera_request_success_total{finished_reason="stop"}', "tessera_generation_tokens_total",
                 "tessera_time_to_first_token_seconds_count", 'tessera_num_preemptions_total{mode="swap"}',
                 "tessera_prefix_cache_hit_rate", "tessera_e2e_request_latency_seconds_count",
                 'tessera_request_success_total{finished_reason="length"}', 'tessera_request_success_total{finished_reason="abort"}',
                 "tessera_num_requests_waiting", "tessera_num_requests_swapped", 'tessera_kv_blocks_capacity{pool="host"}',
                 'tessera_kv_cache_usage_perc{pool="device"}', 'tessera_kv_cache_usage_perc{pool="host"}',
                 'tessera_num_preemptions_total{mode="recompute"}', 'tessera_kv_blocks_swapped_total{direction="in"}',
                 'tessera_kv_blocks_swapped_total{direction="out"}', "tessera_prompt_tokens_total",
                 "tessera_inter_token_latency_seconds_count", 'tessera_requests_rejected_total{status="429"}',
                 "tessera_kv_blocks_window_freed_total"]:
        assert name in m, name
    # SmolLM2 has no sliding window: nothing is freed early.
    assert m["tessera_kv_blocks_window_freed_total"] == 0
    assert m["tessera_generation_tokens_total"] > 0 and m["tessera_time_to_first_token_seconds_count"] > 0
    assert m["tessera_inter_token_latency_seconds_count"] > 0 and m["tessera_prompt_tokens_total"] > 0
    assert m['tessera_kv_blocks_capacity{pool="host"}'] > 0  # --swap-space 0.05 gives a small host pool
    # The KV cache's dtype (the CPU default fp16) and block bytes; /v1/models says the same.
    info = [k for k in m if k.startswith('tessera_kv_cache_info{dtype="fp16",block_bytes="')]
    assert len(info) == 1 and m[info[0]] == 1 and int(info[0].split('block_bytes="')[1].split('"')[0]) > 0, info
    status, data, _ = srv.request("GET", "/v1/models")
    assert status == 200 and json.loads(data)["data"][0]["kv_cache_dtype"] == "fp16", data
    # Stall-free batching (docs/engine.md#the-prefill-share): the default 100 ms target, the last step's
    # prefill budget and the step cost model's prediction against the measured step (values are
    # timings: only their presence and sign are checked).
    assert m["tessera_target_itl_seconds"] == 0.1, m["tessera_target_itl_seconds"]
    assert m["tessera_step_prefill_budget_tokens"] >= 1
    assert m["tessera_step_time_measured_seconds"] > 0 and m["tessera_step_time_predicted_seconds"] > 0
    assert m["tessera_step_time_prediction_error"] >= 0 and m["tessera_steps_prefill_limited_total"] >= 0
    for term in ("base", "decode_token", "prefill_token", "attention_mpos"):
        assert m[f'tessera_step_cost_model_seconds{{term="{term}"}}'] >= 0, term


TIMING_KEYS = {"queue_seconds", "prefill_seconds", "first_token_seconds", "total_seconds", "decode_tokens_per_second",
               "num_preemptions", "num_swaps", "num_cached_prompt_tokens", "num_draft_tokens",
               "num_accepted_draft_tokens"}


@case
def timings_in_bodies_headers_and_stream_ends():
    raw = client.completions.with_raw_response.create(model=MODEL_ID, prompt="Tell me a story:", max_tokens=8,
                                                      temperature=0, extra_body={"ignore_eos": True})
    r = raw.parse()
    t = r.model_extra["timings"]
    assert set(t) == TIMING_KEYS, t
    assert 0 <= t["queue_seconds"] <= t["first_token_seconds"] <= t["total_seconds"], t
    assert t["prefill_seconds"] >= 0 and t["decode_tokens_per_second"] > 0 and t["num_preemptions"] == 0, t
    for key, value in t.items():  # each member also as a header: queue_seconds -> X-Tessera-Queue-Seconds
        header = "x-tessera-" + key.replace("_", "-")
        assert abs(float(raw.headers[header]) - value) < 1e-6, (header, raw.headers.get(header), value)
    assert raw.headers["x-request-id"] == r.id, (raw.headers, r.id)
    # Streams: the chunk that closes the (last) choice carries timings; chat with usage too.
    chunks = list(client.completions.create(model=MODEL_ID, prompt="Tell me a story:", max_tokens=8, temperature=0,
                                            stream=True))
    timed = [c for c in chunks if (c.model_extra or {}).get("timings")]
    assert len(timed) == 1 and timed[0].choices[0].finish_reason == "length", chunks[-1]
    assert set(timed[0].model_extra["timings"]) == TIMING_KEYS
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=6, temperature=0, n=2,
                                                 stream=True, stream_options={"include_usage": True}))
    timed = [c for c in chunks if (c.model_extra or {}).get("timings")]
    assert len(timed) == 1 and timed[0].choices[0].finish_reason, chunks
    token_chunks = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens >= len(token_chunks), (chunks[-1], len(token_chunks))
    assert all(c.choices[0].delta.content for c in token_chunks), token_chunks


@case
def sampling_fields_take_effect():
    # logit_bias: +100 on one token makes it the only choice; -100 on the greedy token removes it.
    tok = json.loads(srv.request("POST", "/tokenize", {"prompt": " banana", "add_special_tokens": False})[1])["tokens"]
    assert len(tok) == 1, tok
    r = client.completions.create(model=MODEL_ID, prompt="Hello", max_tokens=3, temperature=0.7, seed=3,
                                  logit_bias={str(tok[0]): 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].text == " banana" * 3, r.choices[0].text
    greedy = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=1, temperature=0,
                                       logprobs=1)
    first = json.loads(srv.request("POST", "/tokenize", {"prompt": greedy.choices[0].text,
                                                         "add_special_tokens": False})[1])["tokens"]
    banned = client.completions.create(model=MODEL_ID, prompt="The capital of France is", max_tokens=1, temperature=0,
                                       logit_bias={str(first[0]): -100})
    assert banned.choices[0].text != greedy.choices[0].text, (banned.choices[0].text, greedy.choices[0].text)
    # seed: same seed, same sample; top_k=1 is greedy whatever the temperature.
    a, b = (client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=1.2, seed=77)
            for _ in range(2))
    assert a.choices[0].text == b.choices[0].text, (a.choices[0].text, b.choices[0].text)
    g = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=0)
    k1 = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=1.5,
                                   extra_body={"top_k": 1})
    assert k1.choices[0].text == g.choices[0].text, (k1.choices[0].text, g.choices[0].text)
    # top_p and min_p that keep only the most likely token are greedy too.
    for kwargs in [{"top_p": 1e-6}, {"extra_body": {"min_p": 1.0}}]:
        r = client.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=12, temperature=1.5,
                                      seed=9, **kwargs)
        assert r.choices[0].text == g.choices[0].text, (kwargs, r.choices[0].text, g.choices[0].text)
    # ignore_eos + max_tokens: exactly max_tokens; min_tokens; stop_token_ids; include_stop_str_in_output;
    # priority and user are accepted.
    r = client.chat.completions.create(model=MODEL_ID, messages=CHAT, max_tokens=40, temperature=0,
                                       extra_body={"ignore_eos": True, "priority": -1}, user="tester")
    assert r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length", r.usage
    stop_id = json.loads(srv.request("POST", "/tokenize", {"prompt": " 4", "add_special_tokens": False})[1])["tokens"]
    r = client.completions.create(model=MODEL_ID, prompt="1, 2, 3,", max_tokens=10, temperature=0,
                                  extra_body={"stop_token_ids": stop_id})
    assert r.choices[0].finish_reason == "stop" and "4" not in r.choices[0].text, r.choices[0]
    r = client.completions.create(model=MODEL_ID, prompt="1, 2, 3,", max_tokens=10, temperature=0, stop=[" 5"],
                                  extra_body={"include_stop_str_in_output": True})
    assert r.choices[0].text.endswith(" 5"), r.choices[0].text
    # presence/frequency penalties change a repetitive greedy continuation.
    plain = client.completions.create(model=MODEL_ID, prompt="a a a a a a a a", max_tokens=8, temperature=0)
    penal = client.completions.create(model=MODEL_ID, prompt="a a a a a a a a", max_tokens=8, temperature=0,
                                      frequency_penalty=2.0, presence_penalty=2.0)
    assert plain.choices[0].text != penal.choices[0].text, (plain.choices[0].text, penal.choices[0].text)
    rep = client.completions.create(model=MODEL_ID, prompt="a a a a a a a a", max_tokens=8, temperature=0,
                                    extra_body={"repetition_penalty": 2.0})
    assert plain.choices[0].text != rep.choices[0].text, (plain.choices[0].text, rep.choices[0].text)


# ---- bad inputs: (method, path, body, headers, status, message substring) ---------------------------
C, CH = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
BAD = [
    ("POST", C, "{", {}, 400, "malformed JSON"),
    ("POST", C, "", {}, 400, "malformed JSON"),
    ("POST", C, "[1,2]", {}, 400, "JSON object"),
    ("POST", C, "null", {}, 400, "JSON object"),
    ("POST", C, {"max_tokens": 4}, {}, 400, "'prompt' is required"),
    ("POST", C, {"prompt": 5}, {}, 400, "prompt"),
    ("POST", C, {"prompt": ""}, {}, 400, "must not be empty"),
    ("POST", C, {"prompt": []}, {}, 400, "must not be empty"),
    ("POST", C, {"prompt": ["a", 5]}, {}, 400, "prompt[1]"),
    ("POST", C, {"prompt": ["a", ""]}, {}, 400, "prompt[1]' must not be empty"),
    ("POST", C, {"prompt": [1, 2, 49152]}, {}, 400, "outside the vocabulary"),
    ("POST", C, {"prompt": [-5]}, {}, 400, "outside the vocabulary"),
    ("POST", C, {"prompt": "x", "max_tokens": 0}, {}, 400, "max_tokens"),
    ("POST", C, {"prompt": "x", "max_tokens": -1}, {}, 400, "max_tokens"),
    ("POST", C, {"prompt": "x", "max_tokens": "10"}, {}, 400, "must be an integer"),
    ("POST", C, {"prompt": "x", "max_tokens": 10**12}, {}, 400, "max_tokens"),
    ("POST", C, {"prompt": "x", "temperature": -0.5}, {}, 400, "temperature"),
    ("POST", C, {"prompt": "x", "temperature": "hot"}, {}, 400, "must be a number"),
    ("POST", C, {"prompt": "x", "top_p": 1.5}, {}, 400, "top_p"),
    ("POST", C, {"prompt": "x", "top_p": 0}, {}, 400, "top_p"),
    ("POST", C, {"prompt": "x", "top_k": -2}, {}, 400, "top_k"),
    ("POST", C, {"prompt": "x", "min_p": 2}, {}, 400, "min_p"),
    ("POST", C, {"prompt": "x", "n": 0}, {}, 400, "'n'"),
    ("POST", C, {"prompt": "x", "n": 1000}, {}, 400, "'n'"),
    ("POST", C, {"prompt": "x", "presence_penalty": 3}, {}, 400, "presence_penalty"),
    ("POST", C, {"prompt": "x", "frequency_penalty": -3}, {}, 400, "frequency_penalty"),
    ("POST", C, {"prompt": "x", "repetition_penalty": 0}, {}, 400, "repetition_penalty"),
    ("POST", C, {"prompt": "x", "logprobs": 50}, {}, 400, "logprobs"),
    ("POST", C, {"prompt": "x", "logprobs": True}, {}, 400, "logprobs"),
    ("POST", C, {"prompt": "x", "logit_bias": {"99999999": 1}}, {}, 400, "logit_bias"),
    ("POST", C, {"prompt": "x", "logit_bias": {"1": 500}}, {}, 400, "logit_bias"),
    ("POST", C, {"prompt": "x", "logit_bias": [1]}, {}, 400, "logit_bias"),
    ("POST", C, {"prompt": "x", "stop": 7}, {}, 400, "stop"),
    ("POST", C, {"prompt": "x", "stop": ["s"] * 17}, {}, 400, "stop"),
    ("POST", C, {"prompt": "x", "stop": ["y" * 300]}, {}, 400, "stop"),
    ("POST", C, {"prompt": "x", "stop_token_ids": [1 << 40]}, {}, 400, "stop_token_ids"),
    ("POST", C, {"prompt": "x", "stream": "yes"}, {}, 400, "must be a boolean"),
    ("POST", C, {"prompt": "x", "stream_options": {"include_usage": True}}, {}, 400, "stream_options"),
    ("POST", C, {"prompt": "x", "seed": "abc"}, {}, 400, "seed"),
    ("POST", C, {"prompt": "x", "best_of": 3}, {}, 400, "best_of"),
    ("POST", C, {"prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 0, "stream": True, "stream_options": 5}, {}, 400, "stream_options"),
    ("POST", C, {"prompt": "x", "echo": "yes"}, {}, 400, "echo"),
    ("POST", C, {"prompt": "x", "wat": 1}, {}, 400, "wat"),
    ("POST", C, {"prompt": "x", "model": "gpt-4"}, {}, 404, "does not exist"),
    ("POST", C, {"prompt": "word " * 2000, "max_tokens": 4}, {}, 400, "more than max_model_len"),
    ("POST", C, {"prompt": "word " * 2000, "max_tokens": 4, "stream": True}, {}, 400, "more than max_model_len"),
    ("POST", CH, {"messages": [{"role": "user", "content": "word " * 2000}]}, {}, 400, "more than max_model_len"),
    ("POST", C, {"prompt": "x", "min_tokens": 10, "max_tokens": 2}, {}, 400, "min_tokens"),
    ("POST", CH, {"messages": []}, {}, 400, "messages"),
    ("POST", CH, {"messages": "hello"}, {}, 400, "messages"),
    ("POST", CH, {"messages": [{"role": "user"}]}, {}, 400, "messages.content"),
    ("POST", CH, {"messages": [{"content": "x"}]}, {}, 400, "messages.role"),
    ("POST", CH, {"messages": [{"role": "alien", "content": "x"}]}, {}, 400, "messages.role"),
    ("POST", CH, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, {}, 400, "messages.content"),
    ("POST", CH, {"prompt": "x"}, {}, 400, "prompt"),
    ("POST", CH, {"messages": MSG, "chat_template": "{{ 7*7 }}"}, {}, 400, "chat templates are refused"),
    ("POST", CH, {"messages": MSG, "chat_template_kwargs": [1]}, {}, 400, "chat_template_kwargs"),
    ("POST", CH, {"messages": MSG, "chat_template_kwargs": {"messages": []}}, {}, 400, "chat_template_kwargs"),
    ("POST", C, {"prompt": "x", "chat_template": "{{ 7*7 }}"}, {}, 400, "chat templates are refused"),
    ("POST", C, {"prompt": "x", "logit_bias": {"abc": 1}}, {}, 400, "logit_bias"),
    ("POST", C, {"prompt": "x", "logit_bias": {"-1": 1}}, {}, 400, "logit_bias"),
    ("POST", C, {"prompt": "x", "stop_token_ids": [-3]}, {}, 400, "stop_token_ids"),
    ("POST", C, {"prompt": "x", "priority": 10**9}, {}, 400, "priority"),
    ("POST", C, {"prompt": "x", "n": "2"}, {}, 400, "must be an integer"),
    ("POST", C, {"prompt": [[1, 2], []]}, {}, 400, "prompt[1]' must not be empty"),
    ("POST", C, {"prompt": [[1, 2], "x"]}, {}, 400, "prompt[1]"),
    ("POST", C, {"prompt": ["x"] * 257}, {}, 400, "more than this server's limit"),
    ("POST", CH, {"messages": MSG, "tools": [{"type": "function"}]}, {}, 400, "tools"),
    ("POST", CH, {"messages": MSG, "top_logprobs": 2}, {}, 400, "top_logprobs"),
    ("POST", CH, {"messages": MSG, "logprobs": True, "top_logprobs": 99}, {}, 400, "top_logprobs"),
    ("POST", CH, {"messages": MSG, "max_completion_tokens": 0}, {}, 400, "max_completion_tokens"),
    ("GET", C, None, {}, 405, "not allowed"),
    ("DELETE", CH, None, {}, 405, "not allowed"),
    ("POST", "/v1/models", "{}", {}, 405, "not allowed"),
    ("GET", "/v1/nothing", None, {}, 404, "no route"),
    ("POST", "/", None, {}, 404, "no route"),  # GET / is the web UI
    ("POST", "/tokenize", {"prompt": 3}, {}, 400, "prompt"),
    ("POST", "/tokenize", {}, {}, 400, "prompt"),
    ("POST", "/detokenize", {"tokens": [1, 999999]}, {}, 400, "outside the vocabulary"),
    ("POST", "/detokenize", {"tokens": "abc"}, {}, 400, "tokens"),
    ("GET", "/v1/ws", None, {}, 400, "WebSocket"),
    ("GET", "/health", None, {"Host": "evil.example"}, 403, "Host"),
    ("POST", C, {"prompt": "x"}, {"Origin": "http://evil.example"}, 403, "Origin"),
]


@case
def bad_inputs_get_status_and_message():
    failures = []
    for method, path, body, headers, status, part in BAD:
        try:
            got, data, _ = srv.request(method, path, body, headers)
            err = json.loads(data)["error"]
            assert {"message", "type", "param", "code"} <= set(err), err
            ok = got == status and part.lower() in err["message"].lower()
        except Exception as e:  # noqa: BLE001
            ok, got, data = False, repr(e), b""
        if not ok:
            failures.append((method, path, str(body)[:60], status, part, got, data[:200]))
    print(f"  {len(BAD) - len(failures)}/{len(BAD)} bad inputs answered as expected")
    assert not failures, failures


@case
def mutated_bodies_never_crash_or_5xx():
    rng = random.Random(99)
    seeds = [json.dumps({"prompt": "Hi", "max_tokens": 3, "temperature": 0.5, "stop": ["x"], "logprobs": 1}),
             json.dumps({"messages": MSG, "max_tokens": 3, "top_logprobs": 1, "logprobs": True, "n": 2})]
    junk = ['null', '-1', '1e309', '"\\ud800"', '[]', '{}', '""', 'true', '9' * 30, '"\u0000"', '-0.0', '[[[[1]]]]']
    bad = []
    for i in range(300):
        path = C if i % 2 == 0 else CH
        body = seeds[i % 2]
        op = rng.randrange(4)
        if op == 0:  # drop a slice
            a = rng.randrange(len(body)); body = body[:a] + body[a + rng.randint(1, 8):]
        elif op == 1:  # insert a random byte
            a = rng.randrange(len(body)); body = body[:a] + chr(rng.randrange(1, 256)) + body[a:]
        else:  # replace a value with junk
            vals = [m.start() for m in re.finditer(r": ", body)]
            a = rng.choice(vals) + 2
            end = min([body.find(c, a) for c in ",}" if body.find(c, a) >= 0] or [len(body)])
            body = body[:a] + rng.choice(junk) + body[end:]
        try:
            status, data, _ = srv.request("POST", path, body.encode("utf-8", "surrogatepass"))
        except Exception as e:  # noqa: BLE001
            bad.append((body, repr(e)))
            continue
        if status >= 500 or status not in (200, 400, 404, 429):
            bad.append((body, status, data[:200]))
        elif status != 200 and "error" not in json.loads(data):
            bad.append((body, status, data[:200]))
    assert not bad, bad[:5]
    assert srv.request("GET", "/health")[0] == 200


@case
def raw_http_errors():
    r = srv.raw(b"GARBAGE\r\n\r\n")
    assert r.startswith(b"HTTP/1.1 400"), r[:100]
    r = srv.raw(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
    assert r.startswith(b"HTTP/1.1 431"), r[:100]
    r = srv.raw(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999\r\n\r\n")
    assert r.startswith(b"HTTP/1.1 413"), r[:100]
    # Keep-alive: two requests on one connection.
    r = srv.raw(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
               until_close=True)
    assert r.count(b"HTTP/1.1 200") == 2, r


@case
def http10_stream_is_unchunked_and_closed():
    body = json.dumps({"prompt": "Hi", "max_tokens": 4, "stream": True, "temperature": 0}).encode()
    r = srv.raw(b"POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body, timeout=60, until_close=True)
    head, _, rest = r.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head
    assert b"chunked" not in head.lower() and rest.startswith(b"data: {") and rest.endswith(b"data: [DONE]\n\n"), r


@case
def healthy_after_bad_inputs():
    assert srv.request("GET", "/health")[0] == 200
    r = client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1


def wait_kv_free(timeout=15):
    deadline = time.time() + timeout
    m = {}
    while time.time() < deadline:
        m = srv.metrics()
        if (m['tessera_kv_blocks_used{pool="device"}'] == 0 and m['tessera_kv_blocks_used{pool="host"}'] == 0
                and m["tessera_num_streams_open"] == 0 and m["tessera_num_requests_running"] == 0
                and m["tessera_num_requests_waiting"] == 0 and m["tessera_num_requests_queued"] == 0):
            return m
        time.sleep(0.2)
    raise AssertionError({k: v for k, v in m.items() if "kv_blocks" in k or "num_" in k})


def http_cut(i):
    """One request on a raw socket, closed at a random point: a stream after 0..5000 bytes (0: while
    queued or in prefill), half of the mid-stream ones with a TCP reset; a non-streaming one while it runs."""
    rng = random.Random(1000 + i)
    stream = i % 7 != 6
    body = json.dumps({"prompt": f"Story number {i}:", "max_tokens": 400, "ignore_eos": True, "stream": stream,
                       "temperature": 0.8, "seed": i}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    if stream:
        want = rng.choice([0, rng.randint(1, 800), rng.randint(800, 5000)])
        got = b""
        while len(got) < want:
            chunk = s.recv(min(4096, want - len(got)))
            assert chunk, "server closed a stream early"
            got += chunk
        assert b"[DONE]" not in got, "a stream finished before it was cut"
        if want > 0 and rng.random() < 0.5:  # reset instead of FIN (the request surely reached the server)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    else:
        time.sleep(rng.uniform(0.0, 0.6))
    s.close()


async def ws_cut(j, limit):
    """Two generations on one socket, cut after 0..40 deltas by a close handshake or a dropped transport."""
    rng = random.Random(2000 + j)
    async with limit:
        ws = await websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/ws")
        for g in "ab":
            await ws.send(json.dumps({"type": "start", "id": g, "request": {
                "prompt": f"Tale {j}{g}:", "max_tokens": 400, "ignore_eos": True, "temperature": 0.8, "seed": j}}))
        started, deltas, want = 0, 0, rng.randint(0, 40)
        while started < 2 or deltas < want:
            m = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert m["type"] in ("started", "delta"), m
            started += m["type"] == "started"
            deltas += m["type"] == "delta"
        transport = getattr(ws, "transport", None)
        if j % 2 and transport is not None:
            transport.abort()  # no close frame, no FIN handshake: the server finds out from the socket
        else:
            await ws.close()


async def ws_cuts(n):
    limit = asyncio.Semaphore(4)
    await asyncio.gather(*(ws_cut(j, limit) for j in range(n)))


def abort_lines():
    return srv.log().count("finish=abort")


@case
def disconnects_free_the_kv_pool():
    import concurrent.futures
    num_http, num_ws_sockets = 70, 20  # 60 SSE streams + 10 non-streaming; 40 WebSocket generations
    before = srv.metrics()
    log_before = abort_lines()
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        ws_done = pool.submit(lambda: asyncio.run(ws_cuts(num_ws_sockets)))
        list(pool.map(http_cut, range(num_http)))
        ws_done.result()
    m = wait_kv_free(timeout=30)
    total = num_http + 2 * num_ws_sockets
    submitted = m["tessera_requests_submitted_total"] - before["tessera_requests_submitted_total"]
    key = 'tessera_request_success_total{finished_reason="abort"}'
    aborted = m[key] - before[key]
    assert submitted == total and aborted == total, (submitted, aborted, total)
    assert m['tessera_kv_blocks_free{pool="device"}'] + m['tessera_kv_blocks_cached{pool="device"}'] >= \
        m['tessera_kv_blocks_capacity{pool="device"}'], m
    deadline = time.time() + 5
    while abort_lines() - log_before < total and time.time() < deadline:
        time.sleep(0.1)
    assert abort_lines() - log_before == total, (abort_lines() - log_before, total)  # one access line each
    print(f"  {total} requests cut in {time.time() - t0:.1f} s; KV pool free again")
    assert srv.request("GET", "/health")[0] == 200


async def ws_generations():
    async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/ws") as ws:
        await ws.send(json.dumps({"type": "start", "id": "a", "endpoint": "completions",
                                  "request": {"prompt": "Count: 1, 2,", "max_tokens": 8, "temperature": 0}}))
        await ws.send(json.dumps({"type": "start", "id": "b",
                                  "request": {"messages": MSG, "max_tokens": 300, "ignore_eos": True}}))
        await ws.send(json.dumps({"type": "bogus"}))
        finals, deltas, errors, cancelled = {}, {"a": [], "b": []}, [], False
        while len(finals) < 2:
            m = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if m["type"] == "delta":
                deltas[m["id"]].append(m)
                if m["id"] == "b" and len(deltas["b"]) == 3 and not cancelled:
                    await ws.send(json.dumps({"type": "cancel", "id": "b"}))
                    cancelled = True
            elif m["type"] == "final":
                finals[m["id"]] = m
            elif m["type"] == "error":
                errors.append(m)
        assert finals["a"]["finish_reason"] in ("stop", "length") and finals["a"]["usage"]["completion_tokens"] == sum(
            len(d["token_ids"]) for d in deltas["a"]), finals["a"]
        assert finals["b"]["finish_reason"] == "abort", finals["b"]
        assert errors and errors[0]["status"] == 400, errors
        assert all("t" in d and d["token_ids"] for d in deltas["a"]), deltas["a"]
        ref = client.completions.create(model=MODEL_ID, prompt="Count: 1, 2,", max_tokens=8, temperature=0)
        assert "".join(d["text"] for d in deltas["a"]) == ref.choices[0].text


@case
def websocket_start_cancel_final():
    asyncio.run(ws_generations())
    wait_kv_free()


async def ws_events():
    async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/events") as ws:
        task = asyncio.get_running_loop().run_in_executor(
            None, lambda: client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=16, temperature=0))
        m = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert m["type"] == "events" and "device" in m, m
        await task


@case
def websocket_events_stream():
    asyncio.run(ws_events())


async def ws_lifecycle():
    # A /v1/ws generation names its engine request, and /v1/events tells that request's whole life in
    # order: queued, admitted, first token, finished. Its inter-token latencies land in /metrics.
    itl_before = srv.metrics()["tessera_inter_token_latency_seconds_count"]
    async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/events") as events, \
            websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/ws") as ws:
        await ws.send(json.dumps({"type": "start", "id": "life", "endpoint": "completions",
                                  "request": {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0,
                                              "ignore_eos": True}}))
        engine_ids, token_deltas, final = [], 0, None
        while final is None:
            m = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert m["type"] in ("started", "delta", "final"), m
            if m["type"] == "started":
                assert m["request_id"].startswith("ws-"), m
            if "engine_request_id" in m:
                engine_ids.append(m["engine_request_id"])
            if m["type"] == "delta":
                token_deltas += bool(m["token_ids"])
            if m["type"] == "final":
                final = m
        assert final["finish_reason"] == "length", final
        # Once on the first delta, and on the final.
        assert len(engine_ids) == 2 and engine_ids[0] == engine_ids[1] and engine_ids[0] > 0, engine_ids
        kinds = []
        deadline = time.time() + 30
        while "finished" not in kinds and time.time() < deadline:
            m = json.loads(await asyncio.wait_for(events.recv(), 30))
            for e in m.get("events", []):
                if e["request"] == engine_ids[0]:
                    assert e.get("age", 0) >= 0, e
                    kinds.append(e["kind"])
        assert kinds == ["queued", "admitted", "first_token", "finished"], kinds
    itl = srv.metrics()["tessera_inter_token_latency_seconds_count"] - itl_before
    assert itl == token_deltas - 1 and token_deltas >= 2, (itl, token_deltas)


@case
def websocket_names_its_engine_request_and_events_tell_its_lifecycle():
    asyncio.run(ws_lifecycle())
    wait_kv_free()


async def ws_bad_origin():
    try:
        async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/ws", origin="http://evil.example"):
            raise AssertionError("evil origin accepted")
    except websockets.exceptions.InvalidStatus as e:
        assert e.response.status_code == 403, e
    except websockets.exceptions.InvalidStatusCode as e:  # older websockets
        assert e.status_code == 403, e


@case
def websocket_origin_checked():
    asyncio.run(ws_bad_origin())


async def ws_limits():
    async with websockets.connect(f"ws://127.0.0.1:{srv.port}/v1/ws", max_size=None) as ws:
        await ws.send("{not json")
        m = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert m["type"] == "error" and m["status"] == 400, m
        await ws.send(json.dumps({"type": "start", "id": "x", "request": {"prompt": "x", "n": 99}}))
        m = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert m["type"] == "error" and m["status"] == 400 and m["id"] == "x" and "'n'" in m["error"]["message"], m
        await ws.send(json.dumps({"type": "cancel", "id": "nothing"}))
        m = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert m["type"] == "error" and m["status"] == 404, m
        await ws.send("x" * (65 * 1024))  # over the 64 KiB message limit: closed with 1009
        try:
            await asyncio.wait_for(ws.recv(), 10)
            raise AssertionError("oversized message accepted")
        except websockets.exceptions.ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd is not None else None
            assert code == 1009, e


@case
def websocket_bad_messages_and_size_limit():
    asyncio.run(ws_limits())
    assert srv.request("GET", "/health")[0] == 200


@case
def log_has_startup_and_one_access_line_per_request():
    log = srv.wait_log(lambda text: "serving " in text)
    for needed in ["model " + MODEL_ID, "executor cpu:", "compute threads", "KV pool 96 blocks x 16 tokens",
                   f"serving {MODEL_ID} on http://127.0.0.1:{srv.port}"]:
        assert needed in log, (needed, log[:2000])
    raw = client.completions.with_raw_response.create(model=MODEL_ID, prompt="Hi", max_tokens=3, temperature=0)
    rid = raw.headers["x-request-id"]
    # The bad-input table already asked for /v1/nothing: wait for one more such line (and this
    # request's), since a separate logging thread writes the lines after the responses are sent.
    nothing_before = srv.log().count('"GET /v1/nothing"')
    status, _, _ = srv.request("GET", "/v1/nothing?q=1")
    assert status == 404
    lines = srv.wait_log(lambda text: text.count('"GET /v1/nothing"') > nothing_before
                         and f"id={rid}" in text).splitlines()
    mine = [ln for ln in lines if f"id={rid}" in ln]
    assert len(mine) == 1, mine
    assert re.search(r'access: 127\.0\.0\.1:\d+ "POST /v1/completions" 200 \d+\.\d{3}s id=' + re.escape(rid) +
                     r" prompt_tokens=\d+ completion_tokens=3 finish=length$", mine[0]), mine[0]
    assert any(re.search(r'"GET /v1/nothing" 404 .* id=-$', ln) for ln in lines), lines[-5:]
    # The bad-input table above: every one of its requests got its line with its status.
    assert sum(1 for ln in lines if '" 400 ' in ln) >= sum(1 for b in BAD if b[4] == 400), "missing 400 lines"


srv.stop()

# ---- a server configured by a TOML file, with an API key ----------------------------------------------
# The file sets the key, the queue limit, short timeouts, the model name, JSON logs, log level "off" and a
# port; the command line overrides the port (the harness picks a free one) and the log level.
KEY = "s3cret-key"
CONFIG_PORT = free_port()
config_file = tempfile.NamedTemporaryFile("w", prefix="tessera-", suffix=".toml", delete=False)
config_file.write(f"""# test config
[server]
port = {CONFIG_PORT}
api_key = "{KEY}"
max_waiting = 2
served_model_name = "from-config"
request_timeout = 2
ws_idle_timeout = 2

[logging]
log_format = "json"
log_level = "off"
""")
config_file.close()


@case
def bad_config_files_are_refused_naming_the_key():
    for text, expected in [("[server]\nprot = 1\n", "unknown key 'server.prot'"),
                           ("[server]\nport = \"8000\"\n", "'server.port' must be an integer, not a string"),
                           ("[engine]\nmax_num_seqs = 0\n", "'engine.max_num_seqs'"),
                           ("[server\n", ":1:")]:
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(text)
        try:
            r = subprocess.run([BIN, "serve", MODEL, "--config", f.name], capture_output=True, text=True, timeout=60)
        finally:
            os.unlink(f.name)
        assert r.returncode == 2 and expected in r.stderr and f.name in r.stderr, (text, r.returncode, r.stderr)


keyed = server("--config", config_file.name, "--log-level", "info")
MODEL_ID = "from-config"


@case
def config_file_values_apply_and_flags_override():
    # port: the command line's (the harness connects there); the file's port stays closed.
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", CONFIG_PORT)) != 0, "the file's port won over --port"
    status, data, _ = keyed.request("GET", "/v1/models", headers={"Authorization": "Bearer " + KEY})
    assert status == 200 and [m["id"] for m in json.loads(data)["data"]] == ["from-config"], data
    # log_format from the file (json), log_level from the command line (info beats the file's "off").
    records = keyed.json_log(lambda rs: any(r.get("path") == "/v1/models" for r in rs))
    assert any(r["logger"] == "tessera" and "serving from-config" in r["msg"] for r in records), records[:5]
    access = [r for r in records if r["logger"] == "access" and r.get("path") == "/v1/models"]
    assert access and access[-1]["status"] == 200 and access[-1]["method"] == "GET", records[-3:]
    assert all(set(r) >= {"time", "level", "logger", "msg"} for r in records), records[:3]


@case
def api_key_required_everywhere_but_health():
    assert keyed.request("GET", "/health")[0] == 200
    for method, path, body in [("GET", "/v1/models", None), ("GET", "/metrics", None),
                               ("POST", C, {"prompt": "x"}), ("POST", CH, {"messages": MSG}),
                               ("POST", "/tokenize", {"prompt": "x"}), ("POST", "/detokenize", {"tokens": [1]})]:
        for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}]:
            status, data, _ = keyed.request(method, path, body, headers)
            assert status == 401 and json.loads(data)["error"]["type"] == "authentication_error", (path, headers, data)
    c = openai.OpenAI(base_url=f"http://127.0.0.1:{keyed.port}/v1", api_key=KEY, max_retries=0)
    r = c.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2)
    assert r.usage.completion_tokens >= 1
    records = keyed.json_log(lambda rs: any(x.get("request_id") == r.id for x in rs))
    line = [x for x in records if x.get("request_id") == r.id]
    assert len(line) == 1 and line[0]["completion_tokens"] == r.usage.completion_tokens, line
    assert line[0]["prompt_tokens"] == r.usage.prompt_tokens and line[0]["duration_seconds"] > 0, line
    bad = openai.OpenAI(base_url=f"http://127.0.0.1:{keyed.port}/v1", api_key="nope", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("wrong key accepted")
    except openai.AuthenticationError:
        pass


@case
def overload_gets_429_then_recovers():
    import concurrent.futures
    auth = {"Authorization": "Bearer " + KEY}
    body = {"prompt": "Hello there", "max_tokens": 32, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        statuses = list(pool.map(lambda _: keyed.request("POST", C, body, auth), range(24)))
    codes = sorted(st for st, _, _ in statuses)
    assert codes[0] == 200 and codes[-1] == 429 and set(codes) <= {200, 429}, codes
    err = json.loads(next(d for st, d, _ in statuses if st == 429))["error"]
    assert err["type"] == "rate_limit_error", err
    assert keyed.request("POST", C, body, auth)[0] == 200


async def ws_auth():
    url = f"ws://127.0.0.1:{keyed.port}/v1/ws"
    async with websockets.connect(url, additional_headers={"Authorization": "Bearer " + KEY}) as ws:  # key in the upgrade
        await ws.send(json.dumps({"type": "start", "id": "h", "request": {"prompt": "Hi", "max_tokens": 2}}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "started"
    async with websockets.connect(url, additional_headers={"Authorization": "Bearer wrong"}) as ws:
        await ws.send(json.dumps({"type": "start", "id": "w", "request": {"prompt": "Hi", "max_tokens": 2}}))
        m = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert m["type"] == "error" and m["status"] == 401, m
    async with websockets.connect(url) as ws:  # no key: the first message must authenticate
        await ws.send(json.dumps({"type": "start", "id": "x", "request": {"prompt": "Hi", "max_tokens": 2}}))
        m = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert m["type"] == "error" and m["status"] == 401, m
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "auth", "api_key": KEY}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "auth_ok"
        await ws.send(json.dumps({"type": "start", "id": "x", "request": {"prompt": "Hi", "max_tokens": 2}}))
        while True:
            m = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if m["type"] == "final":
                break


@case
def websocket_auth_by_first_message():
    asyncio.run(ws_auth())


@case
def slow_and_half_open_connections_are_dropped():
    # request_timeout = 2 (from the file): a client that never finishes its headers is disconnected.
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        assert s.recv(4096) == b"", "slow request not dropped"
    assert time.time() - t0 < 15
    # ws_idle_timeout = 2: a WebSocket peer that never answers the server's pings is disconnected.
    t0 = time.time()
    with socket.create_connection(("127.0.0.1", keyed.port), timeout=30) as s:
        s.sendall(b"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        assert data.startswith(b"HTTP/1.1 101"), data[:100]
    assert time.time() - t0 < 20, time.time() - t0
    assert keyed.request("GET", "/health")[0] == 200


keyed.stop()
os.unlink(config_file.name)


@case
def sigterm_finishes_short_requests_and_aborts_long_ones_with_a_final_chunk():
    # --shutdown-timeout 6: a request that ends within the grace period completes normally, a longer
    # one gets its final chunk (finish_reason "abort") and [DONE], a WebSocket generation its "final";
    # the process exits soon after. (5 s, not less: on a machine loaded to ~2 tokens/s the short
    # request must still end inside the grace period; 1000 tokens for the long ones, which a quiet
    # machine makes at ~160 tokens/s: 900 could finish inside 6 s.)
    grace = server("--shutdown-timeout", "5")

    def open_stream(max_tokens):
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                           "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", grace.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return s

    def read_all(s):
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk

    async def ws_final_after_sigterm():
        # A /v1/ws generation running at SIGTERM also gets its final message before the socket closes.
        async with websockets.connect(f"ws://127.0.0.1:{grace.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "start", "id": "w",
                                      "request": {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True}}))
            while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] != "delta":
                pass
            grace.proc.terminate()
            try:
                while True:
                    m = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if m["type"] == "final":
                        return m
            except websockets.exceptions.ConnectionClosed:
                return None

    short, long_ = open_stream(8), open_stream(1000)
    time.sleep(0.5)
    t0 = time.time()
    ws_final = asyncio.run(ws_final_after_sigterm())
    short_data, long_data = read_all(short), read_all(long_)
    short.close()
    long_.close()
    grace.proc.wait(timeout=20)
    elapsed = time.time() - t0
    log = grace.log()
    grace.log_file.close()
    os.unlink(grace.log_file.name)
    assert b'"finish_reason":"length"' in short_data and b"data: [DONE]" in short_data, short_data[-300:]
    assert b'"finish_reason":"abort"' in long_data and b"data: [DONE]" in long_data, long_data[-300:]
    assert ws_final is not None and ws_final["finish_reason"] == "abort", ws_final
    assert grace.proc.returncode == 0, (grace.proc.returncode, log[-2000:])
    assert elapsed < 30, elapsed

sys.exit(summary())
