#!/usr/bin/env python3
"""End-to-end tests of the OpenAI / vLLM API surface beyond plain chat (issue #19), on the real server
and the real default model:
  batches:  /v1/completions' "prompt" as a list of strings or of token-id lists: choices prompt-major
            then n (each prompt's choices are what that prompt alone gives at temperature 0), usage
            summed, streamed and not, through the official openai client too; bad shapes are 400s
            naming the prompt; a client that leaves a streamed batch frees every prompt's KV blocks;
  echo:     each choice's text begins with its prompt (text or decoded token ids), streamed and not;
  echo lp:  echo with logprobs covers the prompt's tokens (first null) through the openai client, streamed
            and not, against a float64 numpy reference (tests/data/prompt_logprobs); max_tokens 0 is the
            prompt alone (no cached prefix taken); vLLM's prompt_logprobs field in completions and chat;
  kwargs:   chat_template_kwargs reach the Jinja context (a --chat-template-file that reads them), over
            --chat-template-kwargs, the server's default; a bad default is a usage error (exit 2);
  names:    --served-model-name a b / repeated --alias: /v1/models lists every name, a request for any
            is served, responses report the first;
  truncate: truncate_prompt_tokens (vLLM's) keeps a prompt's last N tokens, -1 what fits; with
            --allow-truncation that is the default, without it a too-long prompt stays a 400;
  responses: /v1/responses through the openai client: the text, usage and status of the chat completion
            of the same conversation (instructions + input), streamed as typed events in OpenAI's order
            whose deltas join to the final text; tools, stored ids and non-text input are 400s naming
            the field; a client that leaves a streamed response frees its KV blocks;
  embed:    /v1/embeddings through the openai client (float, and base64 as the SDK asks by default: the
            same numbers), list and token-id inputs, agreement with the reference mean-pooled vectors
            (tests/data/embeddings), the same vector for the same input (a cached prefix changes nothing)
            and while chat requests run, --pooling last, 400s for bad inputs, every KV block freed;
  openapi:  /openapi.json (OpenAPI 3.1, valid) lists exactly the routes server/router.cpp serves;
  startup:  the port is bound before the model loads (a port in use: exit 5, naming host:port and
            --port), a model that cannot be loaded exits 4, usage errors 2; the default model is found
            from any directory (./models, $TESSERA_MODELS, the user's data dir, the checkout's models/).
Prints "N passed, M failed" and exits non-zero on any failure.
Usage: api_surface_test.py TESSERA_BINARY MODEL
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

from served import case, served, summary, parse_metrics  # tests/e2e/served.py

BIN, MODEL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])  # some cases run from other dirs
ENGINE = ["--threads", "2", "--num-kv-blocks", "96", "--swap-space", "0.05", "--max-model-len", "1024", "--quiet"]

# A ChatML template that reads two kwargs: `enable_thinking` (as Qwen3's does) and `persona`.
TEMPLATE = (
    "{%- if persona is defined %}<|im_start|>system\nYou are {{ persona }}.<|im_end|>\n{% endif -%}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif -%}{% endif -%}")


def rendered(messages, persona=None, enable_thinking=None):
    """What TEMPLATE renders, written out in Python: the test's independent expectation."""
    out = f"<|im_start|>system\nYou are {persona}.<|im_end|>\n" if persona is not None else ""
    for m in messages:
        out += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
    out += "<|im_start|>assistant\n"
    if enable_thinking is False:
        out += "<think>\n\n</think>\n\n"
    return out


template_file = tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False)
template_file.write(TEMPLATE)
template_file.close()
srv = served([BIN, "serve", MODEL, *ENGINE, "--chat-template-file", template_file.name,
              "--chat-template-kwargs", '{"persona": "a pirate"}', "--served-model-name", "first-name", "second/name"],
             log_prefix="tessera-api-surface-")


def post(path, body, timeout=120):
    status, data, _ = srv.request("POST", path, body, timeout=timeout)
    return status, json.loads(data) if data else None


def complete(**body):
    status, out = post("/v1/completions", {"max_tokens": 6, "temperature": 0, **body})
    assert status == 200, (status, out)
    return out


def stream(path, body):
    """The events of a streamed response (the JSON chunks, without [DONE])."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", path, body=json.dumps({**body, "stream": True}), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, (r.status, r.read()[:300])
    events = [json.loads(ln[6:]) for ln in r.read().decode().splitlines() if ln.startswith("data: {")]
    c.close()
    return events


def tokens_of(text):
    status, out = post("/tokenize", {"prompt": text})
    assert status == 200, out
    return out["count"]


# ---- prompt batches ---------------------------------------------------------------------------------

PROMPTS = ["The capital of France is", "One, two, three,", "Water boils at"]


@case
def a_batch_of_text_prompts_is_prompt_major_with_summed_usage():
    alone = [complete(prompt=p, n=2) for p in PROMPTS]
    batch = complete(prompt=PROMPTS, n=2)
    assert [c["index"] for c in batch["choices"]] == list(range(6)), batch["choices"]
    for p, one in enumerate(alone):
        for i in range(2):
            got, want = batch["choices"][p * 2 + i], one["choices"][i]
            assert got["text"] == want["text"] and got["finish_reason"] == want["finish_reason"], (p, i, got, want)
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert batch["usage"][key] == sum(a["usage"][key] for a in alone), (key, batch["usage"])
    assert batch["usage"]["prompt_tokens"] == sum(tokens_of(p) for p in PROMPTS), batch["usage"]
    # Different prompts give different continuations: the choices really are each prompt's.
    assert len({c["text"] for c in batch["choices"][::2]}) == 3, batch["choices"]


@case
def a_batch_of_token_id_prompts_and_a_one_prompt_list():
    ids = [post("/tokenize", {"prompt": p})[1]["tokens"] for p in PROMPTS[:2]]
    batch = complete(prompt=ids)
    for p in range(2):
        assert batch["choices"][p]["text"] == complete(prompt=PROMPTS[p])["choices"][0]["text"], batch
    assert batch["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1]), batch["usage"]
    # A list of one string or of one id list is one prompt, as before.
    assert len(complete(prompt=[PROMPTS[0]])["choices"]) == 1
    assert len(complete(prompt=[ids[0]])["choices"]) == 1


@case
def a_streamed_batch_covers_every_choice():
    events = stream("/v1/completions", {"prompt": PROMPTS, "n": 2, "max_tokens": 5, "temperature": 0,
                                        "stream_options": {"include_usage": True}})
    texts, finished = {}, set()
    for e in events:
        for ch in e["choices"]:
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
            if ch.get("finish_reason"):
                finished.add(ch["index"])
    whole = complete(prompt=PROMPTS, n=2, max_tokens=5)
    assert finished == set(range(6)), finished
    assert [texts[i] for i in range(6)] == [c["text"] for c in whole["choices"]], (texts, whole["choices"])
    assert events[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"], events[-1]


def openai_client():
    import openai
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0)


@case
def batches_through_the_openai_client():
    try:
        import openai
    except ImportError:
        print("  (openai not installed: skipped)")
        return
    client = openai_client()
    r = client.completions.create(model="first-name", prompt=PROMPTS[:2], max_tokens=4, temperature=0, n=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3] and r.model == "first-name", r
    assert r.usage.prompt_tokens == tokens_of(PROMPTS[0]) + tokens_of(PROMPTS[1]), r.usage
    r = client.completions.create(model="second/name", prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True)
    assert r.choices[0].text.startswith(PROMPTS[0]) and r.model == "first-name", r
    try:
        client.completions.create(model="first-name", prompt=["ok", 7], max_tokens=2)
        raise AssertionError("no error for a mixed batch")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "prompt[1]" in str(e), e


@case
def bad_batch_shapes_are_400s_naming_the_prompt():
    for body, says in (({"prompt": ["a", 5]}, "'prompt[1]' must be a string"),
                       ({"prompt": [[1, 2], "x"]}, "'prompt[1]' must be an array of token ids"),
                       ({"prompt": ["a", ""]}, "'prompt[1]' must not be empty"),
                       ({"prompt": [[1], []]}, "'prompt[1]' must not be empty"),
                       ({"prompt": [[1], [10**9]]}, "outside the vocabulary"),
                       ({"prompt": {"a": 1}}, "'prompt' must be a string, an array of strings"),
                       ({"prompt": ["x"] * 257}, "more than this server's limit")):
        status, out = post("/v1/completions", {**body, "max_tokens": 2})
        assert status == 400 and says in out["error"]["message"], (body, status, out)
        assert out["error"]["param"].startswith("prompt") and out["error"]["type"] == "invalid_request_error", out
    # A batch with one prompt beyond the context fails as a whole and names that prompt.
    status, out = post("/v1/completions", {"prompt": ["short", "word " * 2000], "max_tokens": 2})
    assert status == 400 and "prompt[1]" in out["error"]["message"], (status, out)
    assert srv.alive() and complete(prompt="still alive")["choices"][0]["text"]


def gauge(name):
    """The sum of a gauge's samples (every pool, every label set)."""
    return sum(v for k, v in srv.metrics().items() if k == name or k.startswith(name + "{"))


def leave_a_stream_and_expect_every_block_freed(path, body, marker):
    """Starts a streamed request on a raw socket, closes it once `marker` has arrived (the request is
    running), and waits (boundedly) for the engine to have no running request and no used KV block."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    got = b""
    while marker not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    assert gauge("tessera_num_requests_running") > 0
    s.close()
    deadline = time.time() + 30
    while time.time() < deadline and (gauge("tessera_num_requests_running") > 0 or gauge("tessera_kv_blocks_used") > 0):
        time.sleep(0.1)
    assert gauge("tessera_num_requests_running") == 0 and gauge("tessera_kv_blocks_used") == 0, srv.metrics()


@case
def a_client_that_leaves_a_streamed_batch_frees_every_prompts_blocks():
    body = json.dumps({"prompt": PROMPTS, "n": 2, "max_tokens": 500, "ignore_eos": True, "stream": True})
    leave_a_stream_and_expect_every_block_freed("/v1/completions", body, b"data: {")


# ---- echo -------------------------------------------------------------------------------------------

@case
def echo_prepends_the_prompt():
    plain = complete(prompt=PROMPTS[0])["choices"][0]["text"]
    echoed = complete(prompt=PROMPTS[0], echo=True)
    assert echoed["choices"][0]["text"] == PROMPTS[0] + plain, echoed
    ids = post("/tokenize", {"prompt": PROMPTS[1]})[1]["tokens"]
    decoded = post("/detokenize", {"tokens": ids})[1]["prompt"]
    echoed = complete(prompt=[ids, ids], echo=True, n=2)
    plain = complete(prompt=ids)["choices"][0]["text"]
    assert [c["text"] for c in echoed["choices"]] == [decoded + plain] * 4, echoed
    events = stream("/v1/completions", {"prompt": PROMPTS[:2], "echo": True, "max_tokens": 6, "temperature": 0})
    texts = {}
    for e in events:
        for ch in e["choices"]:
            texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
    for p in range(2):
        assert texts[p] == PROMPTS[p] + complete(prompt=PROMPTS[p])["choices"][0]["text"], texts


# ---- echo with logprobs, prompt_logprobs ---------------------------------------------------------------

# The reference: every prompt position's log-softmax from a float64 numpy forward pass over the GGUF's
# dequantized weights (scripts/make_prompt_logprob_fixtures.py, tests/data/prompt_logprobs). The server
# runs the Q4_1 weights, so the bounds are tests/cpu/prompt_logprobs_parity_test.cpp's for that path
# (measured there: mean |error| <= 0.12, max <= 1.01; an off-by-one position scores a mean of 2.1).
PROMPT_LP_FIXTURE = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                                "prompt_logprobs", "smollm_prompt_logprobs.json")))
Q4_1_MEAN_LOGPROB_ERROR, Q4_1_MAX_LOGPROB_ERROR = 0.2, 1.5


def agrees_with_reference(token_logprobs, ref):
    """token_logprobs: the prompt's entries (first one null) against the reference's positions."""
    assert len(token_logprobs) == len(ref["ids"]), (len(token_logprobs), len(ref["ids"]))
    assert token_logprobs[0] is None, token_logprobs[:2]
    errors = [abs(got - want["logprob"]) for got, want in zip(token_logprobs[1:], ref["positions"])]
    mean, worst = sum(errors) / len(errors), max(errors)
    assert mean < Q4_1_MEAN_LOGPROB_ERROR and worst < Q4_1_MAX_LOGPROB_ERROR, (ref["name"], mean, worst)
    return mean, worst


@case
def echo_with_logprobs_covers_the_prompt_through_the_openai_client():
    try:
        client = openai_client()
    except ImportError:
        print("  (openai not installed: skipped)")
        return
    ref = PROMPT_LP_FIXTURE["prompts"][0]  # "short": 8 tokens
    text, P = ref["text"], len(ref["ids"])
    plain = client.completions.create(model="first-name", prompt=text, max_tokens=4, temperature=0, logprobs=2)
    echoed = client.completions.create(model="first-name", prompt=text, max_tokens=4, temperature=0, logprobs=2,
                                       echo=True)
    c, lp = echoed.choices[0], echoed.choices[0].logprobs
    assert c.text == text + plain.choices[0].text, (c.text, plain.choices[0].text)
    assert echoed.usage.prompt_tokens == P and echoed.usage.completion_tokens == 4, echoed.usage
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == P + 4, lp
    assert "".join(lp.tokens[:P]) == text, lp.tokens[:P]
    assert lp.top_logprobs[0] is None, lp.top_logprobs[:2]
    mean, worst = agrees_with_reference(lp.token_logprobs[:P], ref)
    print(f"  short prompt (Q4_1) against the float64 reference: mean |error| {mean:.3f}, max {worst:.3f}")
    # The generated part is what the request without echo reports.
    assert lp.tokens[P:] == plain.choices[0].logprobs.tokens, (lp.tokens[P:], plain.choices[0].logprobs.tokens)
    assert all(abs(a - b) < 1e-5 for a, b in zip(lp.token_logprobs[P:], plain.choices[0].logprobs.token_logprobs))
    # Each top_logprobs: the 2 most likely tokens, plus the token itself when it is not one of them.
    for tok, top in zip(lp.tokens[1:], lp.top_logprobs[1:]):
        assert tok in top and 2 <= len(top) <= 3, (tok, top)
    offsets = lp.text_offset
    assert offsets[0] == 0 and all(offsets[i + 1] == offsets[i] + len(lp.tokens[i].encode()) for i in range(P + 3)), offsets


@case
def echo_with_logprobs_streams_the_prompt_first():
    ref = PROMPT_LP_FIXTURE["prompts"][2]  # "chat": 37 tokens, special tokens parsed
    body = {"prompt": ref["text"], "echo": True, "logprobs": 1, "max_tokens": 5, "temperature": 0}
    whole = complete(**body)["choices"][0]
    events = stream("/v1/completions", body)
    chunks = [ch for e in events for ch in e["choices"] if ch["logprobs"]]
    first = chunks[0]["logprobs"]
    assert first["token_logprobs"][0] is None and len(first["tokens"]) >= len(ref["ids"]), first["tokens"][:3]
    assert chunks[0]["text"].startswith(ref["text"]), chunks[0]["text"][:60]
    joined = {k: [x for ch in chunks for x in ch["logprobs"][k]] for k in ("tokens", "token_logprobs", "text_offset")}
    for k in joined:
        assert joined[k] == whole["logprobs"][k], (k, joined[k][:5], whole["logprobs"][k][:5])
    assert "".join(ch["text"] for e in events for ch in e["choices"]) == whole["text"]
    agrees_with_reference(whole["logprobs"]["token_logprobs"][:len(ref["ids"])], ref)


@case
def max_tokens_zero_with_echo_answers_the_prompt_alone():
    ref = PROMPT_LP_FIXTURE["prompts"][1]  # "long": 520 tokens
    out = complete(prompt=ref["ids"], echo=True, logprobs=0, max_tokens=0, n=2)
    assert out["usage"]["completion_tokens"] == 0 and out["usage"]["prompt_tokens"] == 520, out["usage"]
    decoded = post("/detokenize", {"tokens": ref["ids"]})[1]["prompt"]
    for c in out["choices"]:
        assert c["text"] == decoded and c["finish_reason"] == "length", (c["text"][:40], c["finish_reason"])
        assert len(c["logprobs"]["tokens"]) == 520, len(c["logprobs"]["tokens"])
    mean, worst = agrees_with_reference(out["choices"][0]["logprobs"]["token_logprobs"], ref)
    print(f"  long prompt (Q4_1) against the float64 reference: mean |error| {mean:.3f}, max {worst:.3f}")
    assert out["choices"][0]["logprobs"] == out["choices"][1]["logprobs"]
    # Again, with the prompt's blocks in the prefix cache: scored afresh (no cached prefix), the same numbers.
    again = complete(prompt=ref["ids"], echo=True, logprobs=0, max_tokens=0)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, again["usage"]
    assert again["choices"][0]["logprobs"]["token_logprobs"] == out["choices"][0]["logprobs"]["token_logprobs"]
    # Streamed: one chunk with the prompt and its logprobs, then the finish.
    events = stream("/v1/completions", {"prompt": PROMPT_LP_FIXTURE["prompts"][0]["text"], "echo": True,
                                        "logprobs": 0, "max_tokens": 0})
    texts = [ch["text"] for e in events for ch in e["choices"] if ch["text"]]
    assert texts == [PROMPT_LP_FIXTURE["prompts"][0]["text"]], texts
    assert [ch["finish_reason"] for e in events for ch in e["choices"] if ch["finish_reason"]] == ["length"]
    # Echo alone with max_tokens 0: the text, nothing computed beyond the prompt.
    plain = complete(prompt="Hello there", echo=True, max_tokens=0)["choices"][0]
    assert plain["text"] == "Hello there" and plain["logprobs"] is None, plain
    for body, param in [({"prompt": "x", "max_tokens": 0}, "max_tokens"),
                        ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
                        ({"prompt": "x", "echo": True, "max_tokens": -1}, "max_tokens")]:
        status, err = post("/v1/completions", body)
        assert status == 400 and err["error"]["param"] == param, (body, status, err)


@case
def prompt_logprobs_as_vllm_answers_them():
    ref = PROMPT_LP_FIXTURE["prompts"][0]
    out = complete(prompt=ref["ids"], prompt_logprobs=2, max_tokens=2)
    pl = out["choices"][0]["prompt_logprobs"]
    assert out["choices"][0]["logprobs"] is None, out["choices"][0]
    assert len(pl) == len(ref["ids"]) and pl[0] is None, pl[:2]
    got = []
    for i, (position, want) in enumerate(zip(pl[1:], ref["positions"]), start=1):
        entry = position[str(ref["ids"][i])]
        assert entry["rank"] >= 1 and isinstance(entry["decoded_token"], str), entry
        got.append(entry["logprob"])
        assert 2 <= len(position) <= 3 and {e["rank"] for k, e in position.items() if k != str(ref["ids"][i])} <= {1, 2}
    agrees_with_reference([None, *got], ref)
    # Chat: once per response, over the rendered prompt.
    status, chat = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2,
                                                 "prompt_logprobs": 0})
    assert status == 200, chat
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"] and chat["prompt_logprobs"][0] is None
    assert all(len(p) == 1 for p in chat["prompt_logprobs"][1:]), chat["prompt_logprobs"][1:3]


# ---- chat_template_kwargs ---------------------------------------------------------------------------

MSGS = [{"role": "user", "content": "Say hi"}]


def chat_prompt_tokens(**extra):
    status, out = post("/v1/chat/completions", {"messages": MSGS, "max_tokens": 1, **extra})
    assert status == 200, out
    return out["usage"]["prompt_tokens"]


@case
def chat_template_kwargs_reach_the_template_over_the_servers_default():
    # The server's default persona is in every prompt...
    assert chat_prompt_tokens() == tokens_of(rendered(MSGS, persona="a pirate"))
    # ...a request adds a variable, or overrides the default key by key.
    assert chat_prompt_tokens(chat_template_kwargs={"enable_thinking": False}) == \
        tokens_of(rendered(MSGS, persona="a pirate", enable_thinking=False))
    assert chat_prompt_tokens(chat_template_kwargs={"persona": "a very polite assistant from Lyon"}) == \
        tokens_of(rendered(MSGS, persona="a very polite assistant from Lyon"))
    assert tokens_of(rendered(MSGS, persona="a very polite assistant from Lyon")) != \
        tokens_of(rendered(MSGS, persona="a pirate"))
    for kwargs in ([1], "x", {"messages": []}, {"add_generation_prompt": False}):
        status, out = post("/v1/chat/completions", {"messages": MSGS, "chat_template_kwargs": kwargs})
        assert status == 400 and out["error"]["param"] == "chat_template_kwargs", (kwargs, out)


@case
def a_bad_chat_template_kwargs_default_is_a_usage_error():
    for bad in ("[1]", "{not json", '{"messages": 1}'):
        r = subprocess.run([BIN, "serve", MODEL, *ENGINE, "--chat-template-kwargs", bad, "--port", "0"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "--chat-template-kwargs" in r.stderr, (bad, r.returncode, r.stderr[-500:])


# ---- several served model names ---------------------------------------------------------------------

@case
def every_served_name_is_listed_and_accepted_and_the_first_reported():
    status, data = srv.request("GET", "/v1/models")[:2]
    assert status == 200 and [m["id"] for m in json.loads(data)["data"]] == ["first-name", "second/name"], data
    for name in ("first-name", "second/name"):
        status, data = srv.request("GET", "/v1/models/" + name.replace("/", "%2F"))[:2]
        assert status == 200 and json.loads(data)["id"] == name, data
        for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": MSGS})):
            status, out = post(path, {**body, "model": name, "max_tokens": 2})
            assert status == 200 and out["model"] == "first-name", (name, out)
    status, out = post("/v1/completions", {"prompt": "Hi", "model": "third", "max_tokens": 2})
    assert status == 404 and "'first-name', 'second/name'" in out["error"]["message"], out
    # llama-server's habit: --alias repeated.
    other = served([BIN, "serve", MODEL, *ENGINE, "--alias", "a1", "--alias", "a2"], log_prefix="tessera-api-alias-")
    try:
        status, data = other.request("GET", "/v1/models")[:2]
        assert [m["id"] for m in json.loads(data)["data"]] == ["a1", "a2"], data
        status, data = other.request("POST", "/v1/completions", {"prompt": "Hi", "model": "a2", "max_tokens": 2})[:2]
        assert status == 200 and json.loads(data)["model"] == "a1", data
    finally:
        other.stop(expect_clean=True)


# ---- truncation ---------------------------------------------------------------------------------------

LONG = "word " * 2000  # ~2000 tokens: beyond the 1024-token context


@case
def truncate_prompt_tokens_keeps_the_last_tokens():
    n_long = tokens_of(LONG)
    assert n_long > 1024, n_long
    status, out = post("/v1/completions", {"prompt": LONG, "max_tokens": 2})
    assert status == 400, out  # the default stays a 400
    for keep in (1, 100, 1022, 1023):
        out = complete(prompt=LONG, max_tokens=1, truncate_prompt_tokens=keep)
        assert out["usage"]["prompt_tokens"] == keep, (keep, out["usage"])
    status, out = post("/v1/completions", {"prompt": LONG, "max_tokens": 1, "truncate_prompt_tokens": 1025})
    assert status == 400 and out["error"]["param"] == "truncate_prompt_tokens", out
    assert "1025" in out["error"]["message"] and "1024" in out["error"]["message"], out
    # A shorter prompt is untouched; the kept tokens are the prompt's last ones.
    assert complete(prompt="Hello there", truncate_prompt_tokens=500)["usage"]["prompt_tokens"] == tokens_of("Hello there")
    tail_ids = post("/tokenize", {"prompt": PROMPTS[0]})[1]["tokens"]
    cut = complete(prompt=[7, 8, 9, *tail_ids], truncate_prompt_tokens=len(tail_ids))
    assert cut["choices"][0]["text"] == complete(prompt=tail_ids)["choices"][0]["text"], cut
    # -1: what fits with max_tokens (limit - max_tokens prompt tokens), a batch's prompts each.
    out = complete(prompt=[LONG, "Hi"], max_tokens=24, truncate_prompt_tokens=-1)
    assert out["usage"]["prompt_tokens"] == 1000 + tokens_of("Hi"), out["usage"]
    for bad in (0, -2, "5"):
        status, out = post("/v1/completions", {"prompt": "x", "truncate_prompt_tokens": bad})
        assert status == 400 and out["error"]["param"] == "truncate_prompt_tokens", (bad, out)
    status, out = post("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 4,
                                                "truncate_prompt_tokens": 64})
    assert status == 200 and out["usage"]["prompt_tokens"] == 64, out


@case
def allow_truncation_makes_too_long_prompts_keep_what_fits():
    other = served([BIN, "serve", MODEL, *ENGINE, "--allow-truncation"], log_prefix="tessera-api-trunc-")
    try:
        def ask(**body):
            status, data = other.request("POST", "/v1/completions", {"prompt": LONG, **body})[:2]
            return status, json.loads(data)
        status, out = ask(max_tokens=24)
        assert status == 200 and out["usage"]["prompt_tokens"] == 1000, out
        status, out = ask()  # the default max_tokens ends at the context: all but one position
        assert status == 200 and out["usage"]["prompt_tokens"] == 1023, out
        status, out = ask(max_tokens=4, truncate_prompt_tokens=50)  # the request's own value wins
        assert status == 200 and out["usage"]["prompt_tokens"] == 50, out
        status, out = ask(max_tokens=1024)  # no prompt token would fit: still the 400 of a too-long prompt
        assert status == 400 and "more than max_model_len" in out["error"]["message"], out
    finally:
        other.stop(expect_clean=True)


# ---- /v1/responses ---------------------------------------------------------------------------------

ASK = {"instructions": "Answer in one word.", "input": "Name a colour of the sky.", "max_output_tokens": 12,
       "temperature": 0}
ASK_AS_CHAT = {"messages": [{"role": "system", "content": ASK["instructions"]}, {"role": "user", "content": ASK["input"]}],
               "max_tokens": 12, "temperature": 0}


@case
def responses_answer_what_the_chat_path_answers():
    client = openai_client()
    r = client.responses.create(model="second/name", store=True, metadata={"run": "e2e"}, **ASK)
    chat = client.chat.completions.create(model="first-name", **ASK_AS_CHAT)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "first-name", r
    assert r.output_text and r.output_text == chat.choices[0].message.content, (r.output_text, chat)
    assert r.store is False and r.metadata == {"run": "e2e"} and r.instructions == ASK["instructions"], r
    if chat.choices[0].finish_reason == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", r
    else:
        assert r.status == "completed" and r.incomplete_details is None, r
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_"), msg
    assert [(c.type, c.annotations) for c in msg.content] == [("output_text", [])], msg
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (
        chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens), (r.usage, chat.usage)
    # The same conversation as message items with text parts, and a cut by max_output_tokens.
    items = [{"role": "system", "content": ASK["instructions"]},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK["input"]}]}]
    again = client.responses.create(input=items, max_output_tokens=12, temperature=0)
    assert again.output_text == r.output_text, (again.output_text, r.output_text)
    cut = client.responses.create(input="Count from one to twenty.", max_output_tokens=3, temperature=0)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens", cut
    assert cut.usage.output_tokens == 3 and cut.output[0].status == "incomplete", cut


@case
def streamed_responses_send_typed_events_in_order():
    client = openai_client()
    events = list(client.responses.create(stream=True, **ASK))
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    opening = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    closing = ["response.output_text.done", "response.content_part.done", "response.output_item.done",
               "response.completed" if final.status == "completed" else "response.incomplete"]
    assert deltas and types == opening + ["response.output_text.delta"] * len(deltas) + closing, types
    assert [e.sequence_number for e in events] == list(range(len(events))), events
    text = "".join(d.delta for d in deltas)
    whole = client.responses.create(**ASK)
    assert text == events[-4].text == final.output_text == whole.output_text, (text, whole.output_text)
    assert all(d.item_id == final.output[0].id for d in deltas), final
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens,
                                                                       whole.usage.output_tokens), (final, whole)
    # On the wire: every data line follows an `event:` line naming its type, and there is no [DONE].
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/responses", body=json.dumps({**ASK, "stream": True}),
              headers={"Content-Type": "application/json"})
    resp = c.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream", resp.status
    blocks = [b for b in resp.read().decode().split("\n\n") if b.strip()]
    c.close()
    for b in blocks:
        event, data = b.split("\n")
        assert event.startswith("event: ") and data.startswith("data: "), b
        assert json.loads(data[6:])["type"] == event[7:], b
    assert len(blocks) == len(events) and "[DONE]" not in "".join(blocks), blocks[-1]


@case
def responses_outside_the_plain_text_subset_are_400s_naming_the_field():
    import openai
    client = openai_client()
    for kwargs, param in (({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}, "tools"),
                          ({"previous_response_id": "resp_123"}, "previous_response_id"),
                          ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                           "input[0].content[0].type"),
                          ({"max_output_tokens": 0}, "max_output_tokens")):
        try:
            client.responses.create(**{**ASK, **kwargs})
            raise AssertionError(f"no error for {kwargs}")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and e.body["param"] == param, (kwargs, e.body)
    status, out = post("/v1/responses", {**ASK, "model": "no-such-model"})
    assert status == 404 and out["error"]["code"] == "model_not_found", out
    # A conversation beyond the context is refused before any output, streamed or not, as on the chat path.
    for stream in (False, True):
        status, out = post("/v1/responses", {"input": "word " * 1100, "max_output_tokens": 4, "stream": stream})
        assert status == 400 and "max_model_len" in out["error"]["message"], (stream, status, out)
    status, out = post("/v1/responses", {"input": "word " * 1100, "max_output_tokens": 4, "truncation": "auto"})
    assert status == 200 and out["usage"]["input_tokens"] <= 1024 - 4, out


@case
def a_client_that_leaves_a_streamed_response_frees_its_blocks():
    body = json.dumps({"input": "Tell a long story.", "max_output_tokens": 500, "stream": True})
    leave_a_stream_and_expect_every_block_freed("/v1/responses", body, b"response.output_text.delta")


# ---- /openapi.json ----------------------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def router_routes():
    """(path, method) of every route server/router.cpp's table serves, plus GET /v1/models/{id}."""
    import re
    text = open(os.path.join(ROOT, "server", "router.cpp")).read()
    table = re.search(r"constexpr route_entry routes\[\] = \{(.*?)\n\};", text, re.S).group(1)
    routes = {(path, verb) for path, verb in re.findall(r'\{"([^"]+)", http::verb::(\w+), route::\w+\}', table)}
    assert len(routes) == table.count("route::"), table
    assert 'k_model_prefix = "/v1/models/"' in text
    return routes | {("/v1/models/{model}", "get")}


@case
def openapi_json_describes_exactly_the_routes_served():
    status, data, r = srv.request("GET", "/openapi.json")
    assert status == 200 and r.getheader("Content-Type", "").startswith("application/json"), (status, data[:200])
    doc = json.loads(data)
    assert doc["openapi"].startswith("3.1") and doc == json.load(open(os.path.join(ROOT, "server", "openapi.json")))
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    served_routes = router_routes()
    assert documented == served_routes, ("documented, not served:", documented - served_routes,
                                         "served, not documented:", served_routes - documented)
    # And the live server answers every documented operation (no 404 / 405).
    for path, method in sorted(documented):
        concrete = path.replace("{model}", "second%2Fname")
        status = srv.request(method.upper(), concrete, {} if method == "post" else None)[0]
        assert status not in (404, 405), (method, path, status)
    try:
        from openapi_spec_validator import validate
    except ImportError:
        print("  (openapi-spec-validator not installed: the document's schema is not checked)")
        return
    validate(doc)


# ---- embeddings -------------------------------------------------------------------------------------

EMBED_FIXTURE = json.load(open(os.path.join(ROOT, "tests", "data", "embeddings", "smollm_embeddings.json")))
HIDDEN = EMBED_FIXTURE["hidden_size"]
# The reference vectors (scripts/make_embedding_fixtures.py: a numpy forward over the GGUF's dequantized
# weights, checked against transformers' logits) and the bound the Q4_1 serving path keeps to them,
# as tests/cpu/embedding_parity_test.cpp measures it.
Q4_1_MIN_COSINE = 0.995


def embed(**body):
    status, out = post("/v1/embeddings", {"model": "first-name", **body})
    assert status == 200, (status, out)
    return out


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (sum(x * x for x in a) * sum(y * y for y in b)) ** 0.5


@case
def embeddings_through_the_openai_client_float_and_base64():
    try:
        client = openai_client()
    except ImportError:
        print("  (openai not installed: skipped)")
        return
    text = EMBED_FIXTURE["inputs"][0]["text"]
    as_float = client.embeddings.create(model="first-name", input=text, encoding_format="float")
    as_base64 = client.embeddings.create(model="second/name", input=text, encoding_format="base64")
    default = client.embeddings.create(model="first-name", input=text)  # the SDK asks for base64 itself
    v = as_float.data[0].embedding
    assert len(v) == HIDDEN and abs(sum(x * x for x in v) - 1) < 1e-4, (len(v), sum(x * x for x in v))
    # Asked for explicitly, base64 comes back as the string; asked for by the SDK itself, it is decoded.
    import base64
    import struct
    assert list(struct.unpack(f"<{HIDDEN}f", base64.b64decode(as_base64.data[0].embedding))) == v
    assert default.data[0].embedding == v
    assert as_float.object == "list" and as_float.data[0].object == "embedding" and as_float.data[0].index == 0
    assert as_float.model == "first-name" and as_float.usage.prompt_tokens == tokens_of(text), as_float.usage
    assert as_float.usage.total_tokens == as_float.usage.prompt_tokens
    # base64 on the wire is the float32 little-endian bytes.
    raw = embed(input=text, encoding_format="base64")["data"][0]["embedding"]
    assert list(struct.unpack(f"<{HIDDEN}f", base64.b64decode(raw))) == v


@case
def embeddings_agree_with_the_reference_for_text_lists_and_token_ids():
    refs = EMBED_FIXTURE["inputs"]
    out = embed(input=[r["text"] for r in refs])
    assert [d["index"] for d in out["data"]] == list(range(len(refs))), out["data"]
    assert out["usage"]["prompt_tokens"] == sum(len(r["ids"]) for r in refs), out["usage"]
    for r, d in zip(refs, out["data"]):
        c = cosine(d["embedding"], r["mean"])
        assert c > Q4_1_MIN_COSINE, (r["text"][:30], c)
    # The same inputs as token ids (one list, and a batch of lists) give the same vectors.
    one = embed(input=refs[1]["ids"])["data"][0]["embedding"]
    assert max(abs(a - b) for a, b in zip(one, out["data"][1]["embedding"])) < 1e-5
    batch = embed(input=[r["ids"] for r in refs[:2]])["data"]
    assert max(abs(a - b) for a, b in zip(batch[1]["embedding"], one)) < 1e-5
    # Each input is its own vector: different inputs, different directions.
    assert cosine(out["data"][0]["embedding"], out["data"][1]["embedding"]) < 0.99


@case
def the_same_input_gives_the_same_vector_with_its_prefix_cached_and_beside_chats():
    import threading
    text = EMBED_FIXTURE["inputs"][1]["text"]  # 520 tokens: 32 full blocks of 16
    first = embed(input=text)["data"][0]["embedding"]
    # A generation of the same prompt finds the embedding's blocks in the prefix cache (which the
    # embedding's own second run must not use: it needs every token's hidden state).
    cached = complete(prompt=text, max_tokens=2)["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 256, cached
    again = embed(input=text)["data"][0]["embedding"]
    assert max(abs(a - b) for a, b in zip(first, again)) < 1e-5, "a cached prefix changed the vector"
    # Beside running chat requests (batched in the same steps).
    results = []

    def chat():
        status, out = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to twenty."}],
                                                    "max_tokens": 48, "ignore_eos": True})
        results.append(status)

    threads = [threading.Thread(target=chat) for _ in range(2)]
    for t in threads:
        t.start()
    beside = [embed(input=[text, EMBED_FIXTURE["inputs"][0]["text"]])["data"] for _ in range(2)]
    for t in threads:
        t.join()
    assert results == [200, 200], results
    for b in beside:
        assert max(abs(a - c) for a, c in zip(b[0]["embedding"], first)) < 1e-5
    deadline = time.time() + 10
    while time.time() < deadline and gauge("tessera_kv_blocks_used") > 0:
        time.sleep(0.05)
    assert gauge("tessera_kv_blocks_used") == 0 and gauge("tessera_num_requests_running") == 0, srv.metrics()


@case
def bad_embedding_requests_are_400s_naming_the_field():
    for body, param, says in (({"input": ""}, "input", "'input' must not be empty"),
                              ({"input": []}, "input", "'input' must not be empty"),
                              ({"input": [[1], []]}, "input", "'input[1]' must not be empty"),
                              ({"input": 5}, "input", "'input' must be a string, an array of strings"),
                              ({"input": ["a", 5]}, "input", "'input[1]' must be a string"),
                              ({"input": [1, "a"]}, "input", "must be an integer"),
                              ({"input": [10**9]}, "input", "outside the vocabulary"),
                              ({}, "input", "'input' is required"),
                              ({"input": "x", "encoding_format": "hex"}, "encoding_format", "'float' or 'base64'"),
                              ({"input": "x", "dimensions": 64}, "dimensions", f"must be {HIDDEN}"),
                              ({"input": "x", "stream": True}, "stream", "not a recognized request field")):
        status, out = post("/v1/embeddings", body)
        assert status == 400 and says in out["error"]["message"], (body, status, out)
        assert out["error"]["param"].startswith(param) and out["error"]["type"] == "invalid_request_error", out
    # Longer than the context (--max-model-len 1024): the engine refuses it, a 400 naming the input.
    status, out = post("/v1/embeddings", {"input": [1] * 1025})
    assert status == 400 and out["error"]["param"] == "input", (status, out)
    assert "1024" in out["error"]["message"], out
    status, out = post("/v1/embeddings", {"input": "x", "dimensions": HIDDEN, "user": "u", "model": "nope"})
    assert status == 404 and out["error"]["param"] == "model", (status, out)
    assert len(embed(input="x", dimensions=HIDDEN)["data"][0]["embedding"]) == HIDDEN
    assert srv.alive() and gauge("tessera_kv_blocks_used") == 0, srv.metrics()


@case
def pooling_last_takes_the_last_tokens_hidden_state():
    other = served([BIN, "serve", MODEL, *ENGINE, "--pooling", "last"], log_prefix="tessera-api-pooling-")
    try:
        refs = EMBED_FIXTURE["inputs"]
        status, data, _ = other.request("POST", "/v1/embeddings", {"input": [r["text"] for r in refs]})
        assert status == 200, data[:300]
        got = [d["embedding"] for d in json.loads(data)["data"]]
        for r, v in zip(refs, got):
            assert cosine(v, r["last"]) > Q4_1_MIN_COSINE and cosine(v, r["last"]) > cosine(v, r["mean"]), r["text"][:30]
    finally:
        other.stop(expect_clean=True)
    r = subprocess.run([BIN, "serve", MODEL, "--pooling", "max"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--pooling" in r.stderr, (r.returncode, r.stderr[-500:])


# ---- startup and exit statuses ----------------------------------------------------------------------

def run_tessera(args, cwd=None, env=None, timeout=120):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})


@case
def a_port_in_use_is_reported_before_the_model_loads_with_its_own_status():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        r = run_tessera(["serve", MODEL, *ENGINE, "--port", str(port)])
        assert r.returncode == 5, (r.returncode, r.stderr[-800:])
        assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "--port" in r.stderr, r.stderr
        assert ".cpp" not in r.stderr and "/app/" not in r.stderr, r.stderr  # no source paths
        # A model that does not exist is never reached: the port is checked first.
        r = run_tessera(["serve", "/nonexistent/model.gguf", "--port", str(port)])
        assert r.returncode == 5 and "cannot load model" not in r.stderr, (r.returncode, r.stderr[-800:])


@case
def exit_statuses_tell_usage_model_and_port_failures_apart():
    r = run_tessera(["serve", "/nonexistent/model.gguf", "--port", "0"])
    assert r.returncode == 4 and "/nonexistent/model.gguf" in r.stderr, (r.returncode, r.stderr[-500:])
    for args in (["serve", "--port", "abc"], ["serve", "--no-such-flag"], ["no-such-command"], []):
        r = run_tessera(args)
        assert r.returncode == 2, (args, r.returncode, r.stderr[-300:])
    assert run_tessera(["--help"]).returncode == 0 and run_tessera(["serve", "--help"]).returncode == 0
    r = run_tessera(["serve", MODEL, "--host", "192.0.2.1", "--port", "0"])  # TEST-NET-1: not this host's
    assert r.returncode == 5 and "--host" in r.stderr, (r.returncode, r.stderr[-500:])


@case
def the_default_model_is_found_from_any_directory():
    env = {"TESSERA_MODEL": "", "TESSERA_MODELS": "", "XDG_DATA_HOME": ""}
    # From / (no models/ there): the user's data dir, else the checkout scripts/setup filled.
    r = run_tessera(["inspect"], cwd="/", env=env)
    assert r.returncode == 0 and "SmolLM2-135M-Instruct.Q4_1.gguf" in r.stdout, (r.returncode, r.stderr[-500:])
    with tempfile.TemporaryDirectory() as d:
        for sub in ("cwd/models", "mine", "data/tessera/models"):
            os.makedirs(os.path.join(d, sub))
        name = "SmolLM2-135M-Instruct.Q4_1.gguf"

        def where(**extra):
            r = run_tessera(["inspect"], cwd=os.path.join(d, "cwd"), env={**env, **extra})
            assert r.returncode == 0, r.stderr[-500:]
            return r.stdout.splitlines()[0]

        os.symlink(os.path.abspath(MODEL), os.path.join(d, "data/tessera/models", name))
        assert os.path.join(d, "data/tessera/models", name) in where(XDG_DATA_HOME=os.path.join(d, "data"))
        os.symlink(os.path.abspath(MODEL), os.path.join(d, "mine", name))
        assert os.path.join(d, "mine", name) in where(TESSERA_MODELS=os.path.join(d, "mine"),
                                                      XDG_DATA_HOME=os.path.join(d, "data"))
        os.symlink(os.path.abspath(MODEL), os.path.join(d, "cwd/models", name))
        assert os.path.join(d, "cwd/models", name) in where(TESSERA_MODELS=os.path.join(d, "mine"))


# ---- logging --------------------------------------------------------------------------------------

def json_lines(text):
    """Every line of a --log-format json stderr as an object; an AssertionError names the first that is not."""
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
        assert isinstance(obj, dict) and {"time", "level", "msg"} <= obj.keys(), line
        out.append(obj)
    return out


@case
def json_logs_are_one_object_per_line_and_client_errors_are_info():
    # Without --quiet: the loader's summary and warnings are lines too.
    engine = [a for a in ENGINE if a != "--quiet"]
    other = served([BIN, "serve", MODEL, *engine, "--log-format", "json"], log_prefix="tessera-api-json-")
    try:
        assert other.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})[0] == 200
        assert other.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": "x"})[0] == 400
        assert other.request("POST", "/v1/completions", {"prompt": "word " * 2000, "max_tokens": 2})[0] == 400
        assert other.request("GET", "/no/such/route")[0] == 404
    finally:
        other.proc.terminate()
        status = other.proc.wait(timeout=30)
    text = other.log()
    other.log_file.close()
    os.unlink(other.log_file.name)
    assert status == 0, text[-1000:]
    lines = json_lines(text)
    msgs = [l["msg"] for l in lines]
    assert any(m.startswith("loaded ") for m in msgs) and any("serving" in m for m in msgs), msgs[:10]
    assert any(m == "stopped" for m in msgs), msgs[-5:]
    access = [l for l in lines if "status" in l and l.get("path") != "/health"]  # served() polls /health
    assert sorted(l["status"] for l in access) == [200, 400, 400, 404], access
    assert all(l["level"] == "info" for l in access), access
    # The refused prompt's own line (the engine said why) is info too: nothing the client did is an error.
    assert not [l for l in lines if l["level"] in ("error", "critical")], [l for l in lines if l["level"] != "info"]
    # A startup failure is a JSON line as well.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        r = run_tessera(["serve", MODEL, *ENGINE, "--log-format", "json", "--port", str(taken.getsockname()[1])])
    failure = json_lines(r.stderr)
    assert r.returncode == 5 and failure and failure[-1]["level"] == "critical", r.stderr
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as bad:
        bad.write("[server]\nport = \"x\"\n")
        bad.flush()
        r = run_tessera(["serve", MODEL, "--log-format", "json", "--config", bad.name])
        assert r.returncode == 2 and "server.port" in json_lines(r.stderr)[-1]["msg"], r.stderr


srv.stop(expect_clean=True)
os.unlink(template_file.name)
sys.exit(summary())
