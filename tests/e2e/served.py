"""What the end-to-end suites share: a `tessera serve` process (started on a free loopback port with its
log in a file, waited on until /health answers 200, stopped with SIGTERM; each suite subclasses `served`
with its own request helpers, and the health probe and /metrics go through the subclass's `request`),
the Prometheus text parser, and the case runner that reports "N passed, M failed"."""

import http.client
import json
import os
import socket
import subprocess
import tempfile
import time

results = []  # (case name, the exception it raised or None), in the order the cases ran


def missing_client(error, hint):
    """A suite whose Python client is not installed: a skip (exit 77, ctest's SKIP_RETURN_CODE), never a
    pass; under CI=true, where scripts/test has installed every client, a failure."""
    print(f"SKIP: {error} ({hint})")
    raise SystemExit(1 if os.environ.get("CI") == "true" else 77)


def case(fn):
    """Runs fn now (as a decorator) and records the outcome; a failure is reported and the suite goes on."""
    t0 = time.time()
    try:
        fn()
        results.append((fn.__name__, None))
        print(f"PASS {fn.__name__} ({time.time() - t0:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 - report every failure and go on
        results.append((fn.__name__, e))
        print(f"FAIL {fn.__name__}: {e!r}", flush=True)
    return fn


def summary():
    """Prints "N passed, M failed"; the exit status for the suite (1 on any failure)."""
    failed = [name for name, e in results if e is not None]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


def parse_metrics(text):
    """Prometheus text exposition -> {'name{labels}': value} (comments and blank lines skipped)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class served:
    def __init__(self, argv, log_prefix="tessera-serve-", env=None, ready_timeout=180):
        """argv: the command without --port (added here). Raises if the process exits or is not
        healthy within ready_timeout seconds, with its log in the message."""
        self.port = free_port()
        # stderr (the log) goes to a file: a pipe nobody reads would fill up and block the server.
        self.log_file = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=self.log_file, env=env)
        deadline = time.time() + ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.log())
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not become healthy")

    def request(self, method, path, body=None, headers=None, timeout=120):
        """One request on its own connection, a dict or list body sent as JSON: (status, body bytes,
        the http.client response). Suites that speak raw sockets override it."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json", **(headers or {})}
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data, r

    def metrics(self):
        status, data = self.request("GET", "/metrics")[:2]
        assert status == 200, (status, data[:200])
        return parse_metrics(data.decode())

    def log(self):
        with open(self.log_file.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def alive(self):
        return self.proc.poll() is None

    def stop(self, expect_clean=False):
        """SIGTERM, then SIGKILL after 30 s. expect_clean: a kill or a non-zero exit status fails."""
        self.proc.terminate()
        try:
            status = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.log_file.close()
            if expect_clean:
                raise AssertionError("the server did not exit within 30 s of SIGTERM")
            os.unlink(self.log_file.name)
            return
        self.log_file.close()
        if expect_clean:
            assert status == 0, f"exit status {status}: {self.log()[-2000:]}"
        os.unlink(self.log_file.name)
