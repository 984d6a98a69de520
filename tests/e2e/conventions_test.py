#!/usr/bin/env python3
"""End-to-end tests of the conventions users bring from vLLM and llama-server (issue #19), on the real
server and the real default model:
  metrics:   /metrics passes `promtool check metrics` and parses with prometheus_client's parser: no `unknown` type, no family twice, no
             family without samples, counters named `_total` and nothing else, vLLM's names under
             `tessera:` with a `model_name` label, and the time-to-first-token histogram counting a
             long stream while it still runs;
  CORS:      a page served by another loopback origin calls the API with fetch() and an Authorization
             header, through the browser's preflight (headless Chromium through Playwright), plain and
             streamed, and reads an error; a page from an origin not allowed is refused by the browser
             and the 403 names --allowed-origins; a Host the server does not know names --allowed-host;
  models:    GET /v1/models/{id}, 404 for an unknown id (the openai SDK's retrieve());
  limits:    max_tokens at the context's limit - 1 / limit / limit + 1 (400 naming the numbers, as vLLM);
  prompts:   special-token text in raw prompts becomes the special token (llama.cpp's ids from
             tests/data/tokenizer), "parse_special": false and --no-parse-special keep it text;
  streams:   `tessera generate` keeps its statistics on stderr; SSE sends no chunk without text.
Prints "N passed, M failed" and exits non-zero on any failure.
Usage: conventions_test.py TESSERA_BINARY MODEL
"""
import functools
import http.client
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from served import case, free_port, missing_client, served, summary  # tests/e2e/served.py

BIN, MODEL = sys.argv[1], sys.argv[2]
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:  # scripts/test installs it (TEST_CLIENTS)
    missing_client(e, "pip install prometheus_client")

CHROMIUM = os.environ.get("TESSERA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
IN_CI = os.environ.get("CI") == "true"
ENGINE = ["--threads", "2", "--num-kv-blocks", "96", "--swap-space", "0.05", "--max-model-len", "1024", "--quiet"]
MODEL_ID = os.path.basename(MODEL)
srv = served([BIN, "serve", MODEL, *ENGINE], log_prefix="tessera-conventions-")

# The vLLM names users' dashboards ask for (vllm: -> tessera:), as prometheus_client names families
# (a counter's family drops `_total`).
VLLM_FAMILIES = {
    "tessera:num_requests_running": "gauge", "tessera:num_requests_waiting": "gauge",
    "tessera:num_requests_swapped": "gauge", "tessera:kv_cache_usage_perc": "gauge",
    "tessera:cpu_cache_usage_perc": "gauge",
    "tessera:time_to_first_token_seconds": "histogram", "tessera:inter_token_latency_seconds": "histogram",
    "tessera:e2e_request_latency_seconds": "histogram", "tessera:request_queue_time_seconds": "histogram",
    "tessera:request_prefill_time_seconds": "histogram", "tessera:request_decode_time_seconds": "histogram",
    "tessera:request_prompt_tokens": "histogram", "tessera:request_generation_tokens": "histogram",
    "tessera:prompt_tokens": "counter", "tessera:generation_tokens": "counter",
    "tessera:num_preemptions": "counter", "tessera:prefix_cache_queries": "counter",
    "tessera:prefix_cache_hits": "counter", "tessera:request_success": "counter",
    "tessera:kv_blocks_swapped": "counter",
}


def post(path, body, timeout=120):
    status, data, _ = srv.request("POST", path, body, timeout=timeout)
    return status, json.loads(data) if data else None


def scrape():
    status, data, r = srv.request("GET", "/metrics")
    assert status == 200 and r.getheader("Content-Type", "").startswith("text/plain"), (status, data[:200])
    return data.decode()


def families(text):
    return list(text_string_to_metric_families(text))


def sample_value(fams, family, sample_name, **labels):
    for f in fams:
        if f.name == family:
            for s in f.samples:
                if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
    raise KeyError((family, sample_name, labels))


@case
def metrics_parse_with_prometheus_client():
    post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    text = scrape()
    fams = families(text)
    names = [f.name for f in fams]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not [f.name for f in fams if f.type == "unknown"], [f.name for f in fams if f.type == "unknown"]
    assert not [f.name for f in fams if not f.samples], "a # TYPE line without samples"
    # promtool-style: one # TYPE and # HELP per family, before its samples; _total only on counters.
    typed = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
    assert len(typed) == len({n for n, _ in typed}) == len(re.findall(r"^# HELP ", text, re.M)), typed
    for name, kind in typed:
        assert name.endswith("_total") == (kind == "counter"), (name, kind)
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name), name
    by_name = {f.name: f for f in fams}
    for name, kind in VLLM_FAMILIES.items():
        assert name in by_name and by_name[name].type == kind, (name, by_name.get(name))
        assert all(s.labels.get("model_name") == MODEL_ID for s in by_name[name].samples), by_name[name].samples[:2]
    # The KV block gauges are one family each (they were samples of a `tessera_kv_blocks` family with
    # no samples of its own, `unknown` to the parser).
    for name in ("tessera_kv_blocks_capacity", "tessera_kv_blocks_used", "tessera_kv_blocks_free",
                 "tessera_kv_blocks_cached", "tessera_kv_cache_usage_perc"):
        assert by_name[name].type == "gauge" and {s.labels["pool"] for s in by_name[name].samples} == {"device", "host"}
    assert "tessera_kv_blocks" not in by_name
    # The two sets report the same quantities.
    assert sample_value(fams, "tessera:generation_tokens", "tessera:generation_tokens_total") == \
        sample_value(fams, "tessera_generation_tokens", "tessera_generation_tokens_total") > 0
    assert sample_value(fams, "tessera:request_generation_tokens", "tessera:request_generation_tokens_count") >= 1
    assert 0 <= sample_value(fams, "tessera:kv_cache_usage_perc", "tessera:kv_cache_usage_perc") <= 1


@case
def metrics_pass_promtool():
    # promtool (Prometheus' own tool, Debian's prometheus package; scripts/setup --test-deps) parses the
    # exposition with the server's parser and lints it: names, units, _total on counters only, HELP text.
    promtool = shutil.which("promtool")
    if promtool is None:
        assert os.environ.get("CI") != "true", "promtool is missing (scripts/setup --test-deps installs it)"
        print("  (skipped: no promtool)")
        return
    post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    text = scrape()
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    # Its one objection is to vLLM's own names: the `tessera:` set carries vLLM's `vllm:` names (a colon,
    # which promtool reserves for recording rules) so that dashboards built for vLLM work; vLLM's own
    # /metrics draws the same line. Tessera's own names (tessera_*) pass every lint.
    problems = [l for l in (p.stdout + p.stderr).splitlines() if l.strip()]
    assert p.returncode in (0, 3) and "error while linting" not in p.stdout + p.stderr, (p.returncode, problems[:10])
    colon = [l for l in problems if re.fullmatch(r"tessera:\S+ metric names should not contain ':'", l)]
    objected = {re.sub(r"_total$", "", l.split()[0]) for l in colon}  # promtool names a counter with _total
    assert problems == colon and objected == set(VLLM_FAMILIES), (set(problems) - set(colon), objected ^ set(VLLM_FAMILIES))
    # It does check: a counter without HELP and a gauge named like a counter are named.
    bad = text + "# TYPE tessera_no_help_total counter\ntessera_no_help_total 1\n" + \
        "# HELP tessera_odd gauge\n# TYPE tessera_odd counter\ntessera_odd 1\n"
    p = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    said = p.stdout + p.stderr
    assert "tessera_no_help_total no help text" in said and 'tessera_odd counter metrics should have "_total"' in said, said


@case
def ttft_is_observed_while_a_long_stream_runs():
    def ttft_count():
        return sample_value(families(scrape()), "tessera:time_to_first_token_seconds",
                            "tessera:time_to_first_token_seconds_count")

    before = ttft_count()
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once upon a time", "max_tokens": 600,
                                                           "ignore_eos": True, "stream": True}),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    line = r.fp.readline()
    while not line.startswith(b"data: {"):  # the first token's chunk
        line = r.fp.readline()
    running, count = None, None
    deadline = time.time() + 30
    while time.time() < deadline:
        fams = families(scrape())
        running = sample_value(fams, "tessera:num_requests_running", "tessera:num_requests_running")
        count = sample_value(fams, "tessera:time_to_first_token_seconds", "tessera:time_to_first_token_seconds_count")
        if count == before + 1:
            break
        time.sleep(0.05)
    c.close()  # ends the stream (the server aborts it)
    assert count == before + 1 and running == 1, (before, count, running)



# ---- /v1/models/{id} --------------------------------------------------------------------------------

@case
def model_by_id_and_unknown_id_404():
    status, body = srv.request("GET", "/v1/models/" + MODEL_ID)[:2]
    model = json.loads(body)
    assert status == 200 and model["id"] == MODEL_ID and model["object"] == "model", body
    assert model["max_model_len"] == 1024 and model == json.loads(srv.request("GET", "/v1/models")[1])["data"][0], body
    status, body = srv.request("GET", "/v1/models/no-such-model")[:2]
    err = json.loads(body)["error"]
    assert status == 404 and err["code"] == "model_not_found" and err["type"] == "not_found_error", body
    assert "no-such-model" in err["message"] and err["param"] == "model", body
    try:
        import openai
    except ImportError:
        return
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="unused", max_retries=0)
    assert client.models.retrieve(MODEL_ID).id == MODEL_ID
    try:
        client.models.retrieve("no-such-model")
        raise AssertionError("no error for an unknown model")
    except openai.NotFoundError as e:
        assert e.status_code == 404


# ---- max_tokens that cannot fit the context -----------------------------------------------------------

@case
def max_tokens_beyond_the_context_is_400_at_the_limit_plus_one():
    prompt = "The capital of France is"
    n = json.loads(srv.request("POST", "/tokenize", {"prompt": prompt})[1])["count"]
    limit = 1024  # --max-model-len
    for kind, body in (("completions", {"prompt": prompt}),
                       ("chat", {"messages": [{"role": "user", "content": prompt}]})):
        if kind == "chat":
            n = json.loads(srv.request("POST", "/tokenize", body)[1])["count"]
        path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
        for max_tokens, ok in ((limit - n - 1, True), (limit - n, True), (limit - n + 1, False)):
            # max_tokens is what is checked; stop after 2 tokens so that the accepted ones finish at once.
            stream = max_tokens % 2 == 0  # streamed and not: the same check, before the first chunk
            status, data, _ = srv.request("POST", path, {**body, "max_tokens": max_tokens, "temperature": 0,
                                                          "stop": [" "], "stream": stream})
            if ok:
                assert status == 200 and (b"data: [DONE]" in data if stream else json.loads(data)["choices"]), \
                    (kind, max_tokens, status, data[:300])
                continue
            out = json.loads(data)
            err = out["error"]
            assert status == 400 and err["param"] == "max_tokens" and err["code"] == "context_length_exceeded", out
            for number in (str(limit), str(n + max_tokens), f"{n} in the prompt", f"{max_tokens} in the completion"):
                assert number in err["message"], (number, err["message"])
    # Without max_tokens the output ends at the context instead (finish_reason length), as in vLLM.
    # A prompt of limit - 5 tokens: the default max_tokens (16) does not fit, and is not an error.
    k = limit - 5
    while True:
        long_prompt = "x" + " x" * (k - 1)
        count = post("/tokenize", {"prompt": long_prompt})[1]["count"]
        if count == limit - 5:
            break
        k += limit - 5 - count
    status, out = post("/v1/completions", {"prompt": long_prompt, "ignore_eos": True, "temperature": 0})
    assert status == 200 and out["choices"][0]["finish_reason"] == "length", out
    assert out["usage"]["prompt_tokens"] == limit - 5 and out["usage"]["completion_tokens"] <= 5, out["usage"]


# ---- special-token text in raw prompts -----------------------------------------------------------------

def parity_cases():
    """llama.cpp's token ids for the default model (tests/data/tokenizer/smollm_parity.jsonl): the
    inputs with special-token spellings, both with parse_special and without, that JSON can carry."""
    import base64
    path = os.path.join(os.path.dirname(__file__), "..", "data", "tokenizer", "smollm_parity.jsonl")
    out = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            try:
                text = base64.b64decode(d["text_b64"]).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if "<|" in text or "<repo_name>" in text:
                out.append((text, d["special"], d["ids"]))
    return out


@case
def raw_prompts_parse_special_tokens_like_llama_cpp():
    cases = parity_cases()
    assert sum(1 for _, special, _ in cases if special) >= 20, len(cases)
    for text, special, ids in cases:
        status, out = post("/tokenize", {"prompt": text, "add_special_tokens": False, "parse_special": special})
        assert status == 200 and out["tokens"] == ids, (text, special, out, ids)
    # The default parses them: a hand-written ChatML prompt is the tokens its template would give.
    chatml = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = post("/tokenize", {"prompt": chatml})[1]["tokens"]
    # 10 tokens, as llama-server gives (28 as plain text).
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1 and len(ids) == 10, ids
    assert post("/tokenize", {"prompt": chatml, "parse_special": False})[1]["count"] > 20
    status, out = post("/v1/completions", {"prompt": chatml, "max_tokens": 1, "temperature": 0})
    assert status == 200 and out["usage"]["prompt_tokens"] == len(ids), out
    status, out = post("/v1/completions", {"prompt": chatml, "max_tokens": 1, "parse_special": False})
    assert status == 200 and out["usage"]["prompt_tokens"] > 20, out
    status, out = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "parse_special": False})
    assert status == 400 and out["error"]["param"] == "parse_special", out
    # The CLI: the prompt's token count is in its statistics.
    for flags, expect in (([], len(ids)), (["--no-parse-special"], None)):
        r = subprocess.run([BIN, "generate", "--model", MODEL, "--threads", "2", "--max-tokens", "1", "--temperature", "0",
                            "--prompt", chatml, *flags], capture_output=True, text=True, timeout=300)
        m = re.search(r"prompt: (\d+) tokens", r.stderr)
        assert r.returncode == 0 and m, r.stderr
        assert int(m.group(1)) == expect if expect else int(m.group(1)) > 20, (flags, r.stderr)


# ---- output streams --------------------------------------------------------------------------------

@case
def generate_prints_text_on_stdout_and_statistics_on_stderr():
    argv = [BIN, "generate", "--model", MODEL, "--threads", "2", "--max-tokens", "8", "--temperature", "0",
            "--prompt", "The capital of France is"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip(), r
    assert "prompt:" not in r.stdout and "loaded" not in r.stdout, r.stdout
    assert re.search(r"^prompt: \d+ tokens", r.stderr, re.M), r.stderr
    # Both on one pipe (2>&1): the text's last line ends before the statistics begin.
    both = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300).stdout
    assert r.stdout in both and re.search(r"^prompt: \d+ tokens", both, re.M), both


@case
def sse_never_sends_a_chunk_without_text():
    # EOS forced by logit_bias and generated past (ignore_eos): its text is dropped (special), so each
    # such token used to become a chunk with empty text.
    eos = post("/tokenize", {"prompt": "<|im_end|>", "add_special_tokens": False})[1]["tokens"]
    assert len(eos) == 1, eos
    for path, body in (("/v1/completions", {"prompt": "Hello"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]})):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        c.request("POST", path, body=json.dumps({**body, "max_tokens": 6, "ignore_eos": True, "stream": True,
                                                 "logit_bias": {str(eos[0]): 100},
                                                 "stream_options": {"include_usage": True}}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        events = [json.loads(ln[6:]) for ln in r.read().decode().splitlines()
                  if ln.startswith("data: {")]
        c.close()
        assert events and events[-1]["usage"]["completion_tokens"] == 6, events[-1:]
        for e in events:
            for ch in e["choices"]:
                if ch.get("finish_reason"):
                    continue
                text = ch["text"] if "text" in ch else ch["delta"].get("content")
                assert text, (path, e)


# ---- CORS -----------------------------------------------------------------------------------------

KEY = "cors-key"
PAGE = "<!doctype html><title>another origin</title><p>a page on another origin</p>"


def page_server():
    """A static page on its own loopback port (its own origin); returns (origin, server)."""
    root = tempfile.mkdtemp(prefix="tessera-cors-page-")
    with open(os.path.join(root, "index.html"), "w") as f:
        f.write(PAGE)
    class quiet_handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(quiet_handler, directory=root)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_port}", httpd


# fetch() from the page: a JSON body and an Authorization header make the browser send a preflight first.
CALL_API = """async ([url, key, body]) => {
  try {
    const r = await fetch(url, {method: 'POST', headers: {'Authorization': 'Bearer ' + key,
                                'Content-Type': 'application/json'}, body: JSON.stringify(body)});
    return {status: r.status, text: await r.text(), requestId: r.headers.get('X-Request-Id')};
  } catch (e) {
    return {error: String(e)};
  }
}"""


def cors_in_a_browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright)"
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    allowed, allowed_httpd = page_server()
    refused, refused_httpd = page_server()
    api = served([BIN, "serve", MODEL, *ENGINE, "--api-key", KEY, "--allowed-origins", allowed + ",http://other.example"],
                 log_prefix="tessera-cors-")
    base = f"http://127.0.0.1:{api.port}"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page()
            preflights = []
            page.on("request", lambda req: preflights.append(req.url) if req.method == "OPTIONS" else None)
            page.goto(allowed + "/index.html")
            body = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
            r = page.evaluate(CALL_API, [base + "/v1/completions", KEY, body])
            assert r.get("status") == 200 and json.loads(r["text"])["choices"][0]["text"], r
            assert r["requestId"], r  # an exposed header the page can read
            # A stream: the SSE response carries the CORS headers too.
            r = page.evaluate(CALL_API, [base + "/v1/completions", KEY, {**body, "stream": True}])
            assert r.get("status") == 200 and "data: [DONE]" in r["text"], r
            # An error is readable by the page (its status and OpenAI-shaped body), not a CORS failure.
            r = page.evaluate(CALL_API, [base + "/v1/completions", KEY, {"prompt": "x", "max_tokens": -1}])
            assert r.get("status") == 400 and "error" in json.loads(r["text"]), r
            r = page.evaluate(CALL_API, [base + "/v1/completions", "wrong-key", body])
            assert r.get("status") == 401, r
            # Chromium may answer repeated preflights from its cache; the first one went to the server.
            assert any("/v1/completions" in u for u in preflights) or "OPTIONS /v1/completions" in api.log(), preflights
            # Another origin: the server refuses it (403, no Access-Control-Allow-Origin) and the browser
            # hides the answer from the page.
            page.goto(refused + "/index.html")
            r = page.evaluate(CALL_API, [base + "/v1/completions", KEY, body])
            assert "error" in r and "Failed to fetch" in r["error"], r
            browser.close()
        # The same exchanges on the wire.
        status, data, res = api.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": allowed, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert status == 204 and res.getheader("Access-Control-Allow-Origin") == allowed, (status, res.getheaders())
        assert "Authorization" in res.getheader("Access-Control-Allow-Headers"), res.getheaders()
        assert "POST" in res.getheader("Access-Control-Allow-Methods"), res.getheaders()
        status, data, res = api.request("GET", "/v1/models", headers={"Origin": allowed})
        assert status == 401 and res.getheader("Access-Control-Allow-Origin") == allowed, (status, res.getheaders())
        status, data, res = api.request("OPTIONS", "/v1/completions", headers={
            "Origin": refused, "Access-Control-Request-Method": "POST"})
        assert status == 403 and res.getheader("Access-Control-Allow-Origin") is None, (status, res.getheaders())
        assert "--allowed-origins" in json.loads(data)["error"]["message"], data
        status, data, res = api.request("GET", "/v1/models", headers={"Host": "llm.lan:%d" % api.port,
                                                                       "Authorization": "Bearer " + KEY})
        assert status == 403 and "--allowed-host llm.lan" in json.loads(data)["error"]["message"], data
    finally:
        api.stop()
        allowed_httpd.shutdown()
        refused_httpd.shutdown()
    return None


@case
def cors_page_on_another_origin_calls_the_api_through_preflight():
    skipped = cors_in_a_browser()
    if skipped:
        assert not IN_CI, skipped + " (CI must run the browser test)"
        print(f"SKIP cors_page_on_another_origin_calls_the_api_through_preflight: {skipped}")


srv.stop()
sys.exit(summary())
