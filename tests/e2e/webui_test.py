#!/usr/bin/env python3
"""End-to-end test of the web UI in real headless Chromium against a real `tessera serve`.

Starts the server on a free loopback port with a tiny KV pool (so the dashboard's load forces
preemption) and drives both pages with Playwright:
  chat:      a prompt streams in over time (many distinct lengths, not at once), per-message stats
             show, Stop cancels a long generation on the server, Regenerate starts a new one,
             markup in the prompt stays text, the page fits a phone-width screen;
  dashboard: the KV mosaic fills while synthetic load runs and is empty once it has finished, a
             preemption event appears in the timeline, hovering a tile describes the block, clicking
             a request shows its lifecycle;
  rich chat: marked + DOMPurify + highlight.js in the page (a table with alignment, nested lists,
             hljs tokens, markup in the answer shown as text and never run, safe links), the Copy
             button read back from the clipboard, a question edited and re-sent (twice, the second
             cancelling the first's generation) answered by the real model; the same page without the
             /vendor/ libraries on its fallback renderer and plain charts;
  speculative: a server with a draft model: the share of drafts accepted, tokens per verification and
             the draft model's KV pool (filling under load, empty after);
  default pool: a second server with the default 2,912-block KV pool under 16 streams: the held view
             shows every request's tiles in its colour (canvas pixels), the charts have clock-labelled
             time axes, unit titles and tooltips, TTFT points appear while requests run, the layout has
             no dead areas at 1280x800, 1920x1080 and 390x844, and the dashboard says idle afterwards;
  API docs:  /docs shows every operation of /openapi.json in order with its fields (a request body's
             allOf parts merged, linked to its schema), Try it on GET /v1/models shows the model, the
             page fits a phone-width screen, and with --api-key it asks for the key;
  restart:   the server is restarted with an API key: the pages reconnect by themselves and show the
             API-key banner until the key is entered.
Screenshots go to OUT_DIR (chat.png, chat-edit.png, dashboard.png, dashboard-phone.png, and
chat-stream.png, chat_phone.png, dashboard-small-pool.png, dashboard-1920.png, dashboard-speculative.png,
docs.png).
Prints "N passed, M failed" and exits non-zero on any failure; exits 77 (skipped) when Playwright or
Chromium is missing outside CI.
Usage: webui_test.py TESSERA_BINARY MODEL OUT_DIR
"""
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

BIN, MODEL, OUT_DIR = sys.argv[1], sys.argv[2], sys.argv[3]
CHROMIUM = os.environ.get("TESSERA_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
IN_CI = os.environ.get("CI") == "true"


def skip(why):
    if IN_CI:
        print(f"FAIL: {why} (CI must run the browser test; scripts/setup and scripts/test install it)")
        sys.exit(1)
    print(f"SKIP: {why}")
    sys.exit(77)


try:
    from playwright.sync_api import sync_playwright
except ImportError:
    skip("Playwright for Python is not installed (pip install playwright)")
if not os.path.exists(CHROMIUM):
    skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")

# 40 blocks of 16 tokens: eight 64+160-token requests need ~120, so the scheduler must preempt.
ENGINE = ["--threads", "2", "--num-kv-blocks", "40", "--swap-space", "0.01", "--max-model-len", "1024", "--quiet"]
results = []


def check(name, ok, detail=""):
    results.append((name, bool(ok)))
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port, *extra, engine=ENGINE):
    proc = subprocess.Popen([BIN, "serve", MODEL, "--port", str(port), *engine, *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited: " + proc.stderr.read().decode(errors="replace"))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become healthy")


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def http_get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read(), r


def wait_for(fn, timeout, interval=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(interval)
    return None


def static_routes(port):
    status, body, r = http_get(port, "/")
    check("GET / serves the chat page", status == 200 and b'id="messages"' in body and
          r.getheader("Content-Type", "").startswith("text/html"), status)
    status, body, _ = http_get(port, "/dashboard")
    check("GET /dashboard serves the dashboard", status == 200 and b'id="mosaic"' in body, status)
    status, _, r = http_get(port, "/js/chat.js")
    check("JS modules are served as JavaScript", status == 200 and "javascript" in r.getheader("Content-Type", ""))
    # Debian's browser libraries at /vendor/ (server/vendor_libraries.cpp), and nothing else there.
    for name, marker in [("marked.js", b"marked"), ("purify.js", b"DOMPurify"), ("highlight.js", b"hljs"),
                         ("chart.js", b"Chart.js")]:
        status, body, r = http_get(port, "/vendor/" + name)
        check(f"/vendor/{name} serves the Debian library as JavaScript", status == 200 and marker in body[:4000] and
              "javascript" in r.getheader("Content-Type", "") and r.getheader("X-Content-Type-Options") == "nosniff",
              (status, body[:80]))
    for bad in ["/vendor/other.js", "/vendor/../js/chat.js", "/vendor/Marked.js", "/vendor/marked.js.map"]:
        status, _, _ = http_get(port, bad)
        check(f"{bad} is not served", status == 404, status)
    for bad in ["/../CMakeLists.txt", "/js/../../README.md", "/%2e%2e/CMakeLists.txt", "/.git/config",
                "/README.md", "/js//chat.js", "/js/chat.js%00.html"]:
        status, _, _ = http_get(port, bad)
        check(f"{bad} is not served", status == 404, status)


def chat_tests(page, port):
    page.goto(f"http://127.0.0.1:{port}/")
    check("chat connects", wait_for(lambda: page.get_attribute("#conn-state", "data-state") == "ok", 20))
    page.click("#toggle-settings")
    page.fill("#set-max_tokens", "96")
    page.fill("#set-temperature", "0")
    page.dispatch_event("#set-max_tokens", "change")
    page.dispatch_event("#set-temperature", "change")
    page.click("#toggle-settings")

    # 1. Streamed text grows over time.
    page.fill("#prompt", "Write a short story about a <b>brave</b> dragon and a knight.")
    page.keyboard.press("Enter")
    lengths = []
    deadline = time.time() + 60
    while time.time() < deadline:
        state = page.evaluate("""() => {
            const m = [...document.querySelectorAll('.message.assistant')].pop();
            return m ? [m.querySelector('.body').textContent.length, m.classList.contains('streaming')] : [0, true];
        }""")
        lengths.append(state[0])
        if not state[1]:
            break
        time.sleep(0.03)
    distinct = sorted(set(lengths))
    check("streamed text grows over time (many distinct lengths)", len(distinct) >= 5 and lengths[-1] > 20,
          f"distinct lengths {distinct[:20]}")
    check("text only grows while streaming", all(b >= a for a, b in zip(lengths, lengths[1:])), lengths[:40])
    stats = page.inner_text(".message.assistant .stats")
    check("message shows TTFT, tokens/s, token count and finish reason",
          all(s in stats for s in ("TTFT", "tok/s", "tokens", "finish: ")), stats)
    user_html = page.inner_html(".message.user .body")
    check("markup in a prompt stays text", "<b>" not in user_html and "&lt;b&gt;" in user_html, user_html)

    # 2. Stop cancels on the server.
    page.click("#toggle-settings")
    # 700: the conversation so far plus max_tokens must fit --max-model-len 1024 (else a 400, as vLLM).
    page.fill("#set-max_tokens", "700")
    page.dispatch_event("#set-max_tokens", "change")
    page.click("#toggle-settings")
    page.fill("#prompt", "Count from 1 to 500, one number per line.")
    page.click("#send")
    grew = wait_for(lambda: page.evaluate(
        "() => [...document.querySelectorAll('.message.assistant')].pop().querySelector('.body').textContent.length") > 15, 30)
    check("second generation streams", grew)
    page.click("#stop")
    stopped = wait_for(lambda: page.evaluate(
        "() => !document.querySelector('.message.assistant.streaming')"), 15)
    last_stats = page.evaluate("() => [...document.querySelectorAll('.message.assistant .stats')].pop().textContent")
    check("Stop ends the generation with finish reason abort", stopped and "finish: abort" in last_stats, last_stats)
    idle = wait_for(lambda: b"\ntessera_num_requests_running 0\n" in http_get(port, "/metrics")[1], 30, 0.2)
    check("the server stopped generating (no request running)", idle)

    # 3. Regenerate replaces the last answer with a new generation.
    n_before = page.evaluate("() => document.querySelectorAll('.message.assistant').length")
    page.click("#regenerate")
    started = wait_for(lambda: page.evaluate("() => !!document.querySelector('.message.assistant.streaming')"), 10)
    n_after = page.evaluate("() => document.querySelectorAll('.message.assistant').length")
    check("Regenerate streams a new answer in place of the last", started and n_after == n_before, (n_before, n_after))
    wait_for(lambda: page.evaluate(
        "() => [...document.querySelectorAll('.message.assistant')].pop().querySelector('.body').textContent.length") > 30, 20)
    page.screenshot(path=os.path.join(OUT_DIR, "chat-stream.png"))
    page.keyboard.press("Escape")  # Escape stops too
    check("Escape stops the generation", wait_for(lambda: page.evaluate(
        "() => !document.querySelector('.message.assistant.streaming')"), 15))
    check("conversations are kept in localStorage",
          "dragon" in page.evaluate("() => localStorage.getItem('tessera.conversations') || ''"))

    # 4. Two conversations stream at the same time over the one socket.
    page.click("#toggle-settings")
    page.fill("#set-max_tokens", "160")
    page.dispatch_event("#set-max_tokens", "change")
    page.click("#toggle-settings")
    page.fill("#prompt", "Name three rivers and describe them.")
    page.keyboard.press("Enter")
    page.click("#new-chat")
    page.fill("#prompt", "Name three mountains and describe them.")
    page.keyboard.press("Enter")
    both = wait_for(lambda: page.evaluate(
        "() => [...document.querySelectorAll('.conv-open')].filter(b => b.textContent.endsWith('●')).length") == 2, 10, 0.02)
    check("two conversations stream at once", both)
    done = wait_for(lambda: page.evaluate(
        "() => ![...document.querySelectorAll('.conv-open')].some(b => b.textContent.endsWith('●'))"), 180, 0.2)
    finals = page.evaluate("""() => JSON.parse(localStorage.getItem('tessera.conversations')).slice(0, 2)
        .map(c => { const m = c.messages[c.messages.length - 1]; return [m.finishReason, m.content.length]; })""")
    check("both finish with their own answers", done and all(f in ("stop", "length") and n > 0 for f, n in finals), finals)


def phone_test(browser, port):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    page = ctx.new_page()
    page.goto(f"http://127.0.0.1:{port}/")
    wait_for(lambda: page.get_attribute("#conn-state", "data-state") == "ok", 20)
    overflow = page.evaluate("() => document.documentElement.scrollWidth")
    check("chat fits a phone-width screen", overflow <= 390, overflow)
    page.screenshot(path=os.path.join(OUT_DIR, "chat_phone.png"))
    page.goto(f"http://127.0.0.1:{port}/dashboard")
    wait_for(lambda: page.get_attribute("#conn-state", "data-state") == "ok", 20)
    overflow = page.evaluate("() => document.documentElement.scrollWidth")
    check("dashboard fits a phone-width screen", overflow <= 390, overflow)
    ctx.close()


def dashboard_tests(page, port):
    page.goto(f"http://127.0.0.1:{port}/dashboard")
    check("dashboard connects", wait_for(lambda: page.get_attribute("#conn-state", "data-state") == "ok", 20))
    got_view = wait_for(lambda: page.evaluate("() => window.tesseraDashboard.view.step >= 0"), 15)
    check("a block view arrives", got_view)
    total = page.evaluate("() => window.tesseraDashboard.view.device.size")
    check("the mosaic has one tile per device block", total == 40, total)
    check("without speculative decoding its gauges stay hidden",
          not page.is_visible("#spec-gauge") and not page.is_visible("#draft-gauge"))
    check("the mosaic is empty while idle",
          wait_for(lambda: page.evaluate("() => window.tesseraDashboard.view.device.numUsed()") == 0, 30, 0.2))

    page.fill("#load-n", "8")
    page.fill("#load-prompt", "64")
    page.fill("#load-max", "160")
    page.click("#load-form button[type=submit]")
    max_used = 0
    preempted = False
    shot = False
    deadline = time.time() + 240  # generous: a loaded CI machine may decode at a few tokens/s
    while time.time() < deadline:
        used = page.evaluate("() => window.tesseraDashboard.view.device.numUsed()")
        max_used = max(max_used, used)
        preempted = preempted or page.query_selector(".ev-preempted_swap, .ev-preempted_recompute") is not None
        if preempted and used > 20 and not shot:
            # Select a request that holds blocks: its lifecycle shows and its tiles are highlighted.
            owner = page.evaluate("""() => { const p = window.tesseraDashboard.view.device;
                for (let i = 0; i < p.size; i++) if (p.ref[i] > 0) return p.owner[i]; return null; }""")
            if owner is not None:
                # Clicked from inside the page: the table is rebuilt as messages arrive.
                clicked = page.evaluate("""(o) => { const b = document.querySelector(
                    `#requests .req-link[aria-label="Select request ${o}"]`); if (b) b.click(); return !!b; }""", owner)
                if clicked:
                    time.sleep(0.3)
                    check("selecting a request shows its lifecycle", page.is_visible("#lifecycle") and
                          page.query_selector("#lifecycle-bar .seg") is not None)
                    # Hover the first tile of the device pool.
                    box = page.query_selector("#mosaic").bounding_box()
                    page.mouse.move(box["x"] + 4, box["y"] + 22)
                    time.sleep(0.2)
                    tip = page.inner_text("#block-info")
                    check("hovering a tile describes the block", "device block 0" in tip, tip)
                    page.screenshot(path=os.path.join(OUT_DIR, "dashboard-small-pool.png"))
                    shot = True
        done = page.evaluate("() => (document.getElementById('load-status').textContent || '')")
        if "0 running, 8 done" in done and preempted and shot:
            break
        time.sleep(0.1)
    check("the mosaic fills while requests run", max_used >= 20, max_used)
    check("a preemption event appears with a tiny KV pool", preempted)
    check("dashboard screenshot taken under load", shot)
    status = page.inner_text("#load-status")
    check("all synthetic requests finish", "0 running, 8 done" in status, status)
    emptied = wait_for(lambda: page.evaluate("() => window.tesseraDashboard.view.device.numUsed()") == 0, 60, 0.2)
    check("the mosaic is empty once the requests finished", emptied,
          page.evaluate("() => window.tesseraDashboard.view.device.numUsed()"))
    # A structured-output request is marked "constrained" in the request table while it runs.
    def constrained_request():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=240)
        c.request("POST", "/v1/completions", json.dumps({
            "prompt": "Spell a long word:", "max_tokens": 120, "temperature": 0,
            "structured_outputs": {"regex": "[a-z]{100,120}"}}), {"Content-Type": "application/json"})
        return c.getresponse().status
    worker = threading.Thread(target=lambda: statuses.append(constrained_request()))
    statuses = []
    worker.start()
    marked = wait_for(lambda: page.query_selector("#requests .mark-constrained") is not None, 120, 0.05)
    worker.join()
    check("a constrained request is marked in the request table", marked and statuses == [200], statuses)
    kinds = page.evaluate("() => window.tesseraDashboard.model.timeline.map(e => e.kind)")
    check("the timeline shows admissions and finishes", "admitted" in kinds and "finished" in kinds, set(kinds))
    # Lifecycles come from the engine's events: arrival (queued) first, then admission, the first token
    # and the finish (preemptions and re-admissions in between).
    lives = page.evaluate("""() => [...window.tesseraDashboard.model.requests.values()]
        .filter(r => r.state === 'finished').map(r => [r.id, r.events.map(e => e.kind)])""")

    def well_ordered(k):
        return (k[0] == "queued" and k.count("queued") == 1 and k.count("first_token") >= 1 and k[-1] == "finished"
                and "admitted" in k and k.index("admitted") < k.index("first_token"))
    complete = [rid for rid, k in lives if well_ordered(k)]
    check("finished requests' lifecycles run queued, admitted, first token, ..., finished",
          len(complete) >= 8 and all(well_ordered(k) for _, k in lives if "queued" in k), lives[:4])
    if complete:
        page.evaluate("""(o) => { const b = document.querySelector(
            `#requests .req-link[aria-label="Select request ${o}"]`); if (b && !b.classList.contains('selected')) b.click(); }""",
            complete[-1])
        shown = wait_for(lambda: page.query_selector("#lifecycle-bar .seg-queued") is not None and
                         page.query_selector("#lifecycle-bar .mark-first_token") is not None, 5)
        check("a finished request's lifecycle bar shows its queue time and first token", shown and
              "first token" in page.inner_text("#lifecycle-legend"), page.inner_text("#lifecycle-legend"))

    # Keyboard: the mosaic takes focus and the arrow keys walk the blocks.
    page.focus("#mosaic")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    cols = page.evaluate("() => window.tesseraDashboard.mosaic().layout.cols")
    info = page.inner_text("#block-info")
    check("arrow keys move through the mosaic's blocks", info.startswith("device block ") and
          int(info.split()[2].rstrip(":")) in (2 + cols, 2 + cols - 1, 2 + cols + 1, 39), info)

    # A 10,000-block device pool and a 2,000-block swap pool: the canvas mosaic stays cheap to draw
    # (median of 5 full redraws; a generous guard, not a benchmark) and hit-testing still works.
    ms = page.evaluate("""() => { const d = window.tesseraDashboard; const runs = [];
        for (let r = 0; r < 500; r++) runs.push(r * 20, 20, r % 4 ? r : 0, r % 4 ? 1 + (r % 7 === 0) : 0, 1 + r % 16, r % 5 === 0 ? 1 : 0);
        d.view.apply({step: 1e9, full: true, device: {total: 10000, blocks: 10000, runs},
                      host: {total: 2000, blocks: 2000, runs: [0, 2000, 3, 1, 16, 0]}});
        const times = []; for (let i = 0; i < 5; i++) times.push(d.redrawMosaic());
        return times.sort((a, b) => a - b)[2]; }""")
    print(f"     12,000-block mosaic redraw: {ms:.1f} ms", flush=True)
    check("a 12,000-block mosaic redraws in well under a frame budget (< 250 ms guard)", ms < 250, ms)
    box = page.query_selector("#mosaic").bounding_box()
    page.mouse.move(box["x"] + 1, box["y"] + box["height"] - 2)
    time.sleep(0.2)
    tip = page.inner_text("#block-info")
    check("hovering the big mosaic's last row finds a swap block", "swap (host) block" in tip, tip)

# An answer as a model writes one: a table (aligned columns), nested lists, a fenced code block, and
# markup that must stay text (a script, an image with a handler, a javascript: link).
RICH_CODE = 'def greet(name: str) -> str:\n    # say hello\n    return f"Hello, {name}!"'
RICH_ANSWER = ("Here is a comparison:\n\n| Model | Parameters | Context |\n|:------|-----------:|:-------:|\n"
               "| SmolLM2 | 135M | 8k |\n| Gemma 3 | 270M | 32k |\n\nSteps:\n1. Load the model\n   - from GGUF\n"
               "     - quantized\n2. Serve it\n\n```python\n" + RICH_CODE + "\n```\n\n"
               "Raw HTML stays text: <script>window.hacked = 1</script> <img src=x onerror=\"window.hacked = 2\">\n"
               "[bad link](javascript:window.hacked=3) and [the docs](https://example.com/docs)\n")
RICH_CONVERSATION = [{"id": "rich", "title": "Tables and code", "created": 1, "messages": [
    {"role": "user", "content": "Compare two small models in a table and show a Python example."},
    {"role": "assistant", "content": RICH_ANSWER, "numTokens": 160, "firstT": 0.08, "lastT": 1.9,
     "finishReason": "stop"}]}]
CHAT_SETTINGS = {"system": "You are a helpful assistant.", "temperature": 0, "top_p": 1, "top_k": 0,
                 "max_tokens": 96, "seed": 1}


def seed_conversation(page, port):
    page.goto(f"http://127.0.0.1:{port}/")
    page.evaluate("([c, s]) => { localStorage.setItem('tessera.conversations', JSON.stringify(c));"
                  " localStorage.setItem('tessera.settings', JSON.stringify(s)); }", [RICH_CONVERSATION, CHAT_SETTINGS])
    page.reload()
    wait_for(lambda: page.get_attribute("#conn-state", "data-state") == "ok", 20)


def last_answer_done(page):
    return page.evaluate("() => { const m = [...document.querySelectorAll('.message.assistant')].pop();"
                         " return !!m && !m.classList.contains('streaming') && m.querySelector('.stats').textContent.includes('finish'); }")


def rich_chat_tests(browser, port):
    """marked + DOMPurify + highlight.js in the real page; the copy button; editing and re-sending."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, device_scale_factor=1,
                              permissions=["clipboard-read", "clipboard-write"])
    errors = []
    page = ctx.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    seed_conversation(page, port)
    check("the chat renders with marked + DOMPurify + highlight.js",
          page.evaluate("() => document.body.dataset.markdown") == "marked+highlight",
          page.evaluate("() => document.body.dataset.markdown"))
    table = page.evaluate("""() => { const t = document.querySelector('.message.assistant .body table');
        return t && { head: [...t.querySelectorAll('thead th')].map(c => c.textContent),
                      rows: [...t.querySelectorAll('tbody tr')].map(r => [...r.cells].map(c => c.textContent)),
                      align: [...t.querySelectorAll('thead th')].map(c => c.getAttribute('align')) }; }""")
    check("a Markdown table becomes a table with its header, cells and column alignment", table == {
        "head": ["Model", "Parameters", "Context"], "rows": [["SmolLM2", "135M", "8k"], ["Gemma 3", "270M", "32k"]],
        "align": ["left", "right", "center"]}, table)
    nested = page.evaluate("() => [...document.querySelectorAll('.message.assistant ol > li > ul > li > ul > li')]"
                           ".map(e => e.textContent)")
    check("nested lists nest (ol > ul > ul)", nested == ["quantized"], nested)
    code = page.evaluate("""() => { const c = document.querySelector('.message.assistant .code-block pre code');
        const spans = (cls) => [...c.querySelectorAll('span.' + cls)].map(s => s.textContent);
        return c && { lang: c.closest('.code-block').querySelector('.code-lang').textContent, hljs: c.classList.contains('hljs'),
                      keyword: spans('hljs-keyword'), string: spans('hljs-string'), comment: spans('hljs-comment'),
                      text: c.textContent }; }""")
    check("code is highlighted: hljs keyword, string and comment tokens", code and code["lang"] == "python" and
          code["hljs"] and {"def", "return"} <= set(code["keyword"]) and any("Hello" in x for x in code["string"]) and
          any("say hello" in x for x in code["comment"]), code)
    check("highlighting keeps the code's text exactly", code and code["text"].rstrip("\n") == RICH_CODE, code)
    safety = page.evaluate("""() => { const b = document.querySelector('.message.assistant .body');
        return { pwned: window.hacked ?? null, scripts: b.querySelectorAll('script, img, iframe, style').length,
                 text: b.textContent, links: [...b.querySelectorAll('a')].map(a => [a.textContent, a.getAttribute('href'), a.rel]),
                 handlers: [...b.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length }; }""")
    check("<script> and <img onerror> in model output show as text and never run", safety["pwned"] is None and
          safety["scripts"] == 0 and safety["handlers"] == 0 and "<script>window.hacked = 1</script>" in safety["text"] and
          '<img src=x onerror="window.hacked = 2">' in safety["text"], safety)
    check("links keep http(s) targets only (javascript: is dropped, its words kept)",
          safety["links"] == [["the docs", "https://example.com/docs", "noopener noreferrer nofollow"]] and
          "bad link" in safety["text"], safety["links"])
    page.click(".message.assistant .copy-code")
    copied = wait_for(lambda: page.inner_text(".message.assistant .copy-code") == "Copied", 5)
    clip = page.evaluate("() => navigator.clipboard.readText()")
    check("the copy button puts the code on the clipboard", copied and clip.rstrip("\n") == RICH_CODE, clip)
    page.mouse.move(0, 0)
    page.screenshot(path=os.path.join(OUT_DIR, "chat.png"))

    # Edit the question and send it again: the old answer (and everything after it) is replaced by the
    # real model's new answer. A second edit while that one streams cancels it on the server.
    page.click(".message.user .edit-message")
    check("Edit opens the message in a text box", page.is_visible(".message.user .edit-form textarea") and
          page.input_value(".message.user .edit-form textarea") == RICH_CONVERSATION[0]["messages"][0]["content"])
    page.fill(".message.user .edit-form textarea", "Count from one to forty in words.")
    page.keyboard.press("Enter")
    streaming = wait_for(lambda: page.evaluate(
        "() => { const m = document.querySelector('.message.assistant.streaming'); return m && m.querySelector('.body').textContent.length > 3; }"), 30)
    check("the edited message is sent and a new answer streams", streaming)
    page.click(".message.user .edit-message")
    page.fill(".message.user .edit-form textarea", "Write a Python function that returns the square of a number.")
    page.keyboard.press("Enter")
    done = wait_for(lambda: last_answer_done(page), 120, 0.1)
    conv = page.evaluate("() => JSON.parse(localStorage.getItem('tessera.conversations'))[0].messages"
                         ".map(m => [m.role, m.content, !!m.edited, m.finishReason || null])")
    check("re-sending replaced the conversation after the edited message", done and len(conv) == 2 and
          conv[0] == ["user", "Write a Python function that returns the square of a number.", True, None] and
          conv[1][0] == "assistant" and conv[1][1] and conv[1][1] != RICH_ANSWER and conv[1][3] in ("stop", "length"),
          conv)
    shown = page.evaluate("() => [...document.querySelectorAll('.message')].map(m => m.querySelector('.role-name').textContent)")
    check("the page shows the edited question and one new answer, no table left",
          shown == ["You (edited)", "Assistant"] and page.query_selector(".message table") is None, shown)
    idle = wait_for(lambda: b"\ntessera_num_requests_running 0\n" in http_get(port, "/metrics")[1], 30, 0.2)
    check("the generation the second edit replaced was cancelled on the server", idle)
    answer = conv[1][1] if len(conv) == 2 else ""
    if "```" in answer:
        hl = page.evaluate("() => document.querySelectorAll('.message.assistant .code-block code.hljs span[class^=hljs-]').length")
        check("the model's own code answer is highlighted", hl > 0, hl)
    print(f"     the model's answer to the edit: {answer[:120]!r}", flush=True)
    page.screenshot(path=os.path.join(OUT_DIR, "chat-edit.png"))
    check("no JavaScript errors on the rich chat page", not errors, errors[:5])
    ctx.close()


def fallback_tests(browser, port):
    """Without the /vendor/ libraries (packages missing) the pages still work with their own renderers."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
    ctx.route("**/vendor/**", lambda route: route.abort())
    errors = []
    page = ctx.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    seed_conversation(page, port)
    got = page.evaluate("""() => { const b = document.querySelector('.message.assistant .body');
        return { renderer: document.body.dataset.markdown, code: !!b.querySelector('.code-block pre code'),
                 copy: !!b.querySelector('.code-block .copy-code'), scripts: b.querySelectorAll('script, img').length,
                 text: b.textContent, pwned: window.hacked ?? null }; }""")
    check("without marked/DOMPurify the chat falls back to its built-in renderer", got["renderer"] == "builtin" and
          got["code"] and got["copy"] and got["scripts"] == 0 and got["pwned"] is None and
          "<script>window.hacked = 1</script>" in got["text"], got)
    page.goto(f"http://127.0.0.1:{port}/dashboard")
    plain = wait_for(lambda: page.evaluate("() => document.body.dataset.charts"), 10)
    check("without Chart.js the dashboard draws its plain charts", plain == "plain", plain)
    check("no JavaScript errors without the libraries", not errors, errors[:5])
    ctx.close()


DEFAULT_POOL_ENGINE = ["--threads", "2", "--max-model-len", "1024", "--quiet"]  # the default 1 GiB KV pool
UNITS = {"tps": "tokens/s", "batch": "sequences", "ttft": "s", "itl": "ms"}


def layout_report(page):
    """Where the dashboard's cards lie: rows of cards, whether each row spans the width with equal
    heights, how much of the area they cover, horizontal overflow."""
    return page.evaluate("""() => {
        const main = document.querySelector('main.dash'), cs = getComputedStyle(main), mr = main.getBoundingClientRect();
        const left = mr.left + parseFloat(cs.paddingLeft), right = mr.right - parseFloat(cs.paddingRight);
        const cards = [...main.children].filter(e => e.offsetParent).map(e => { const r = e.getBoundingClientRect();
            return { name: e.getAttribute('aria-label'), top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left, right: r.right }; });
        const rows = [];
        for (const c of cards.sort((a, b) => a.top - b.top || a.left - b.left)) {
            const row = rows.find(r => Math.abs(r[0].top - c.top) < 3);
            if (row) row.push(c); else rows.push([c]);
        }
        const top = Math.min(...cards.map(c => c.top)), bottom = Math.max(...cards.map(c => c.bottom));
        const area = cards.reduce((a, c) => a + (c.right - c.left) * (c.bottom - c.top), 0);
        return { rows: rows.map(r => ({ names: r.map(c => c.name), heights: r.map(c => Math.round(c.bottom - c.top)),
                   spans: Math.abs(r[0].left - left) < 3 && Math.abs(r[r.length - 1].right - right) < 3,
                   even: r.every(c => Math.abs(c.bottom - r[0].bottom) < 3) })),
                 coverage: area / ((right - left) * (bottom - top)),
                 overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
                 mosaicFill: (() => { const w = document.querySelector('.mosaic-wrap'), c = document.getElementById('mosaic');
                                      return c.offsetHeight / Math.max(1, w.clientHeight); })() };
    }""")


def check_layout(page, what, columns):
    r = layout_report(page)
    rows_ok = all(row["spans"] and row["even"] and len(row["names"]) == columns for row in r["rows"])
    check(f"dashboard at {what}: every row of cards spans the width with equal heights (no dead areas)",
          rows_ok and r["coverage"] > 0.9 and r["overflow"] <= 0, r)
    return r


MOSAIC_PIXELS = """() => {
    const d = window.tesseraDashboard; d.redrawMosaic();
    const m = d.mosaic(), pool = d.view.device, L = m.layout, dpr = devicePixelRatio || 1;
    const ctx = document.getElementById('mosaic').getContext('2d');
    const ids = m.shown.device ? [...m.shown.device] : [...Array(pool.size).keys()];
    const owners = new Map();
    ids.forEach((id, k) => { if (pool.ref[id] > 0 && !owners.has(pool.owner[id])) owners.set(pool.owner[id], k); });
    const tiles = [...owners].map(([owner, k]) => {
        const x = (k % L.cols) * L.pitch + L.size / 2, y = L.deviceTop + Math.floor(k / L.cols) * L.pitch + L.size - 1.5;
        return { owner, blocks: pool.blocksOf(owner).length, px: [...ctx.getImageData(Math.floor(x * dpr), Math.floor(y * dpr), 1, 1).data].slice(0, 3) };
    });
    return { view: m.view, size: L.size, total: pool.size, tiles, running: (d.model.latest || {}).num_running || 0,
             segments: document.querySelectorAll('#usage-bar .useg[data-request]').length };
}"""


def hsl_rgb(h, s, l):
    import colorsys
    return [round(c * 255) for c in colorsys.hls_to_rgb(h / 360, l, s)]


def mosaic_shows_each_request(page, what, at_least):
    m = page.evaluate(MOSAIC_PIXELS)
    # A held tile's lower part is drawn in its request's colour (blocks.js: ownerHue, hsl(h 70% 52%)).
    wrong = [t for t in m["tiles"] if any(abs(a - b) > 12 for a, b in zip(t["px"], hsl_rgb(round((t["owner"] * 137.508) % 360), 0.7, 0.52)))]
    check(f"{what}: the default pool ({m['total']} blocks) shows each running request's blocks as tiles of its colour",
          m["total"] > 2000 and m["view"] == "held" and m["size"] >= 10 and len(m["tiles"]) >= at_least and not wrong and
          m["segments"] >= at_least, {**m, "tiles": m["tiles"][:4], "wrong": wrong[:4]})
    return m


def chart_report(page):
    return page.evaluate("""() => Object.fromEntries(Object.entries(window.tesseraDashboard.charts).map(([k, c]) => {
        const ch = c.chart; return [k, { x: ch.scales.x.ticks.map(t => t.label), xTitle: ch.options.scales.x.title.text,
            yTitle: ch.options.scales.y.title.text, yTicks: ch.scales.y.ticks.length, points: ch.data.datasets.map(d => d.data.length),
            width: Math.round(ch.chartArea.right - ch.chartArea.left), height: Math.round(ch.chartArea.bottom - ch.chartArea.top) }]; }))""")


def speculative_dashboard(browser):
    """A server speculating with a draft model (the model as its own draft): the dashboard shows the
    share of draft tokens accepted and the draft model's KV pool, which empties when the load ends."""
    import re
    port = free_port()
    # 160 blocks (and so a draft pool of 160): room for a load long enough to span a few /metrics
    # scrapes (every 2 s): the model accepting its own drafts finished 4 x 96 tokens within one scrape,
    # and the gauge then read 0 throughout.
    engine = list(ENGINE)
    engine[engine.index("--num-kv-blocks") + 1] = "160"
    proc = start_server(port, "--speculative", "draft", "-md", MODEL, "--draft-max", "4", engine=engine)
    try:
        page = browser.new_context(viewport={"width": 1280, "height": 800}, device_scale_factor=1).new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{port}/dashboard")
        wait_for(lambda: page.evaluate("() => window.tesseraDashboard.view.step >= 0"), 20)
        check("before any step the speculative gauges stay hidden",
              not page.is_visible("#spec-gauge") and not page.is_visible("#draft-gauge"))
        page.fill("#load-n", "4")
        page.fill("#load-prompt", "32")
        page.fill("#load-max", "400")
        page.click("#load-form button[type=submit]")
        busy = wait_for(lambda: re.match(r"([1-9]\d*)/160$", page.inner_text("#g-draft-text")), 60, 0.2)
        check("the draft model's KV pool fills while requests speculate", busy, page.inner_text("#g-draft-text"))
        rate = wait_for(lambda: re.match(r"(\d+)% · (\d+\.\d+) tokens/step", page.inner_text("#g-spec-text")), 60)
        # The model drafting for itself: nearly every draft token is accepted, several tokens a step.
        check("the dashboard shows the share of drafts accepted and tokens per verification",
              rate and int(rate.group(1)) >= 50 and float(rate.group(2)) > 1.5, page.inner_text("#g-spec-text"))
        # The request table marks each request's drafts (accepted/verified) as a badge inside its cell.
        # Badge and cell measured in one evaluation: the table re-renders while the load runs, and a
        # badge found by one call can be gone from the page by the next.
        found = wait_for(lambda: page.evaluate("""() => {
            const e = document.querySelector('#requests .mark-speculative');
            if (!e) return null;
            const b = e.getBoundingClientRect(), c = e.closest('td').getBoundingClientRect();
            return {box: [b.x, b.y, b.width, b.height], cell: [c.x, c.y, c.width, c.height], text: e.textContent};
        }"""), 30)
        box, cell = (found["box"], found["cell"]) if found else (None, None)
        check("each request's draft badge sits inside its table cell",
              found and box[2] > 0 and box[0] >= cell[0] and box[1] >= cell[1] and box[0] + box[2] <= cell[0] + cell[2] + 1
              and box[1] + box[3] <= cell[1] + cell[3] + 1 and re.match(r"spec \d+/\d+$", found["text"].strip()),
              found)
        check("the draft model's KV pool is empty once the load has finished",
              wait_for(lambda: page.inner_text("#g-draft-text") == "0/160", 240, 0.5), page.inner_text("#g-draft-text"))
        page.screenshot(path=os.path.join(OUT_DIR, "dashboard-speculative.png"))
        check("no JavaScript errors on the speculative dashboard", not errors, errors[:5])
    finally:
        stop_server(proc)


def default_pool_dashboard(browser):
    """The dashboard on the default KV pool (thousands of blocks) under 16 streams: the held view with
    every request visible, charts with axes, units, time labels and tooltips, TTFT while requests run,
    idle afterwards, and the layout at 1280x800, 1920x1080 and phone width."""
    import re
    port = free_port()
    proc = start_server(port, engine=DEFAULT_POOL_ENGINE)
    try:
        ctx = browser.new_context(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
        errors = []
        page = ctx.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{port}/dashboard")
        wait_for(lambda: page.evaluate("() => window.tesseraDashboard.view.step >= 0"), 20)
        check("Chart.js draws the dashboard's charts", page.evaluate("() => document.body.dataset.charts") == "chart.js")
        check("idle before any load: the dashboard says idle",
              wait_for(lambda: page.inner_text("#engine-state") == "idle" and page.inner_text("#v-tps") == "idle", 10),
              page.inner_text("#engine-state"))
        # The phone-width page watches from the start too (it sees every request's arrival).
        phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1).new_page()
        phone.on("pageerror", lambda e: errors.append(str(e)))
        phone.goto(f"http://127.0.0.1:{port}/dashboard")
        wait_for(lambda: phone.evaluate("() => window.tesseraDashboard.view.step >= 0"), 20)
        page.fill("#load-n", "16")
        page.fill("#load-prompt", "64")
        page.fill("#load-max", "192")
        page.click("#load-form button[type=submit]")
        page.mouse.move(0, 0)
        # TTFT points appear while the requests still run (the first_token events, not their ends).
        ttft_live = wait_for(lambda: page.evaluate("""() => { const d = window.tesseraDashboard;
            const pts = d.charts.ttft.chart.data.datasets[0].data.length;
            const finished = [...d.model.requests.values()].filter(r => r.endedAt !== null).length;
            return pts >= 8 && finished === 0 && (d.model.latest || {}).num_running >= 8 ? pts : 0; }"""), 120, 0.1)
        check("the TTFT chart fills while the requests run", ttft_live, ttft_live)
        full = wait_for(lambda: page.evaluate(MOSAIC_PIXELS)["segments"] >= 16, 60, 0.1)
        check("16 streams hold blocks at once", full)
        mosaic_shows_each_request(page, "1280x800", 16)
        check("the mosaic fills its card", layout_report(page)["mosaicFill"] > 0.6, layout_report(page)["mosaicFill"])
        time.sleep(1.2)  # one more chart redraw with the newest points
        charts = chart_report(page)
        clock = re.compile(r"^\d\d:\d\d:\d\d$")
        check("charts have time axes with clock labels, y axes titled with their units, and data",
              all(len(c["x"]) >= 2 and all(clock.match(x) for x in c["x"]) and c["xTitle"] == "time" and
                  c["yTitle"] == UNITS[k] and c["yTicks"] >= 2 and c["width"] > 100 and c["height"] > 60
                  for k, c in charts.items()) and charts["tps"]["points"][0] > 0 and charts["batch"]["points"][0] > 0, charts)
        # A tooltip on the newest TTFT point: its time, value with unit, and request.
        # The chart redraws twice a second and its time axis moves with the clock, so the point can move
        # a pixel or two between reading its place and the pointer arriving: up to three tries.
        def hover_newest_ttft_point():
            at = page.evaluate("""() => { const ch = window.tesseraDashboard.charts.ttft.chart, meta = ch.getDatasetMeta(0);
                const el = meta.data[meta.data.length - 1], r = ch.canvas.getBoundingClientRect();
                return el ? { x: r.left + el.x, y: r.top + el.y } : null; }""")
            if not at:
                return None
            page.mouse.move(at["x"], at["y"])
            return wait_for(lambda: page.evaluate("""() => { const t = window.tesseraDashboard.charts.ttft.chart.tooltip;
                return t && t.opacity > 0 ? { title: t.title, body: t.body.flatMap(b => b.lines) } : null; }"""), 3)

        def per_request_tooltip(tip):
            return bool(tip and clock.match(tip["title"][0]) and
                        any(re.search(r"per request: [\d.]+ s \(request #\d+\)", line) for line in tip["body"]))

        tip = None
        for _ in range(3):
            tip = hover_newest_ttft_point()
            if per_request_tooltip(tip):
                break
            page.mouse.move(0, 0)
        check("hovering a TTFT point shows a tooltip with time, seconds and the request", per_request_tooltip(tip), tip)
        page.mouse.move(0, 0)
        check_layout(page, "1280x800", 2)
        page.screenshot(path=os.path.join(OUT_DIR, "dashboard.png"), full_page=True)
        page.set_viewport_size({"width": 1920, "height": 1080})
        time.sleep(0.6)
        check_layout(page, "1920x1080", 2)
        mosaic_shows_each_request(page, "1920x1080", 8)
        page.screenshot(path=os.path.join(OUT_DIR, "dashboard-1920.png"), full_page=True)
        page.set_viewport_size({"width": 1280, "height": 800})

        got = wait_for(lambda: phone.evaluate(MOSAIC_PIXELS)["segments"] >= 8, 20)
        check_layout(phone, "390x844 (phone)", 1)
        if got:
            mosaic_shows_each_request(phone, "390x844", 8)
        phone.screenshot(path=os.path.join(OUT_DIR, "dashboard-phone.png"), full_page=True)
        phone.context.close()

        done = wait_for(lambda: "0 running, 16 done" in page.inner_text("#load-status"), 300, 0.2)
        check("the 16 streams finish", done, page.inner_text("#load-status"))
        idle = wait_for(lambda: page.inner_text("#engine-state") == "idle" and page.inner_text("#v-tps") == "idle" and
                        page.evaluate("() => window.tesseraDashboard.model.series.tokensPerSecond.last()") == 0, 10, 0.2)
        check("idle afterwards: the dashboard says idle and the rate drops to 0, not the last busy value", idle,
              [page.inner_text("#engine-state"), page.inner_text("#v-tps")])
        check("no JavaScript errors on the default-pool dashboard", not errors, errors[:5])
        ctx.close()
    finally:
        stop_server(proc)


def docs_tests(browser, port):
    """The API docs page (/docs) renders every operation of /openapi.json with its fields, and a GET
    route can be tried in place."""
    status, body, _ = http_get(port, "/openapi.json")
    doc = json.loads(body)
    operations = [(m, p) for p, item in doc["paths"].items() for m in item if m in ("get", "post", "put", "patch", "delete")]
    status, body, _ = http_get(port, "/docs")
    check("GET /docs serves the API docs page", status == 200 and b'id="api-routes"' in body, status)
    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{port}/docs")
    loaded = wait_for(lambda: page.get_attribute("body", "data-loaded") == "true", 20)
    check("the docs page loads /openapi.json", loaded)
    shown = page.evaluate("() => [...document.querySelectorAll('.api-route')].map(s => [s.dataset.method, s.dataset.path])")
    check("the docs page shows every operation of /openapi.json, in order", [tuple(x) for x in shown] == operations,
          (len(shown), len(operations)))
    fields = page.evaluate("""() => [...document.querySelectorAll('section[data-path="/v1/completions"] .api-fields tbody tr')]
        .map(tr => [tr.cells[0].textContent.trim(), tr.cells[1].textContent.trim()])""")
    names = dict(fields)
    check("/v1/completions lists its own and its sampling fields, the required ones marked",
          names.get("prompt *", "").startswith("string") and "max_tokens" in names and "temperature" in names and
          "echo" in names, fields[:6])
    linked = page.evaluate("""() => { const a = document.querySelector('section[data-path="/v1/completions"] h4 a');
        return a ? [a.textContent, !!document.getElementById(a.getAttribute('href').slice(1))] : null; }""")
    check("the request body links to its schema on the page", linked == ["CompletionRequest", True], linked)
    page.screenshot(path=os.path.join(OUT_DIR, "docs.png"))
    models = json.loads(http_get(port, "/v1/models")[1])["data"][0]["id"]
    page.click('section[data-path="/v1/models"][data-method="get"] button.api-try')
    out_sel = 'section[data-path="/v1/models"][data-method="get"] pre.api-try-out'
    tried = wait_for(lambda: page.get_attribute(out_sel, "data-status") == "200" and models in page.inner_text(out_sel), 10)
    check("Try it on GET /v1/models shows the served model", tried, page.inner_text(out_sel)[:200])
    page.set_viewport_size({"width": 390, "height": 844})
    time.sleep(0.3)
    overflow = page.evaluate("() => document.documentElement.scrollWidth")
    check("the docs page fits a phone-width screen", overflow <= 390, overflow)
    check("no JavaScript errors on the docs page", not errors, errors[:5])
    ctx.close()


def docs_need_the_key(browser, port):
    """With --api-key, the docs page asks for the key (a fresh browser: none stored) and then loads."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    page.goto(f"http://127.0.0.1:{port}/docs")
    check("without a key the docs page shows the API-key banner", wait_for(lambda: page.is_visible("#auth-banner"), 10))
    page.fill("#auth-key", "sekrit")
    page.click("#auth-form button")
    check("with the key it loads the routes", wait_for(lambda: page.get_attribute("body", "data-loaded") == "true", 10) and
          not page.is_visible("#auth-banner"))
    ctx.close()


def restart_with_key(pages, port, proc):
    stop_server(proc)
    lost = all(wait_for(lambda p=p: p.get_attribute("#conn-state", "data-state") != "ok", 15) for p in pages)
    check("pages notice the server went away", lost)
    proc = start_server(port, "--api-key", "sekrit")
    banner = all(wait_for(lambda p=p: p.is_visible("#auth-banner"), 30) for p in pages)
    check("pages reconnect and show the API-key banner", banner)
    page = pages[0]
    page.fill("#auth-key", "wrong")
    page.click("#auth-form button")
    time.sleep(1)
    check("a wrong key keeps the banner", page.is_visible("#auth-banner") and "rejected" in page.inner_text("#auth-message"),
          page.inner_text("#auth-message"))
    for p in pages:
        p.fill("#auth-key", "sekrit")
        p.click("#auth-form button")
    ok = all(wait_for(lambda p=p: p.get_attribute("#conn-state", "data-state") == "ok", 20) for p in pages)
    check("the right key connects both pages", ok and not any(p.is_visible("#auth-banner") for p in pages))
    status, _, _ = http_get(port, "/")
    check("the UI's own files need no key", status == 200, status)
    status, _, _ = http_get(port, "/v1/models")
    check("the API still needs the key", status == 401, status)
    # The dashboard streams again after authenticating on its socket.
    seen = pages[1].evaluate("() => window.tesseraDashboard.stats.numMessages")
    pages[0].fill("#prompt", "Say hi.")
    pages[0].keyboard.press("Enter")
    check("the chat works with the key", wait_for(lambda: pages[0].evaluate(
        "() => !document.querySelector('.message.assistant.streaming') && "
        "[...document.querySelectorAll('.message.assistant .stats')].pop().textContent.includes('finish')"), 30))
    check("the dashboard receives events after authenticating", wait_for(
        lambda: pages[1].evaluate("() => window.tesseraDashboard.stats.numMessages") > seen, 10))
    return proc


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    port = free_port()
    proc = start_server(port)
    t0 = time.time()
    try:
        static_routes(port)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            ctx = browser.new_context(viewport={"width": 1280, "height": 800}, device_scale_factor=1)
            errors = []
            chat = ctx.new_page()
            chat.on("pageerror", lambda e: errors.append(str(e)))
            chat_tests(chat, port)
            dash = ctx.new_page()
            dash.on("pageerror", lambda e: errors.append(str(e)))
            dashboard_tests(dash, port)
            phone_test(browser, port)
            rich_chat_tests(browser, port)
            fallback_tests(browser, port)
            docs_tests(browser, port)
            default_pool_dashboard(browser)
            speculative_dashboard(browser)
            proc = restart_with_key([chat, dash], port, proc)
            docs_need_the_key(browser, port)
            check("no JavaScript errors on the pages", not errors, errors[:5])
            browser.close()
    finally:
        stop_server(proc)
    failed = [n for n, ok in results if not ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed ({time.time() - t0:.0f} s)")
    if failed:
        print("failed: " + "; ".join(failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
