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
  restart:   the server is restarted with an API key: the pages reconnect by themselves and show the
             API-key banner until the key is entered.
Screenshots (1280x800) go to OUT_DIR (chat.png, dashboard.png, chat_phone.png).
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


def start_server(port, *extra):
    proc = subprocess.Popen([BIN, "serve", MODEL, "--port", str(port), *ENGINE, *extra],
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
    page.screenshot(path=os.path.join(OUT_DIR, "chat.png"))
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
                    page.screenshot(path=os.path.join(OUT_DIR, "dashboard.png"))
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
    cols = page.evaluate("() => Math.floor(document.getElementById('mosaic').clientWidth / 29)")
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
            proc = restart_with_key([chat, dash], port, proc)
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
