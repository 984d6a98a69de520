"""A `tessera serve` process for the end-to-end suites: started on a free loopback port with its log
in a file, waited on until /health answers 200, stopped with SIGTERM. Each suite subclasses `served`
with its own request helpers (the health probe goes through the subclass's `request`)."""

import os
import socket
import subprocess
import tempfile
import time


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

    def request(self, method, path, body=None):  # overridden by each suite
        raise NotImplementedError

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
