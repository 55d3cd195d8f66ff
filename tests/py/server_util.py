"""A real `build/potserve serve` process on a free loopback port, for the
server tests: start, wait for /health, stop (SIGTERM or SIGKILL), restart on
the same data directory."""
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

from conftest import BIN, MODEL


class Server:
    def __init__(self, data_dir, *flags, env=None, preexec_fn=None):
        self.preexec_fn = preexec_fn  # runs in the child before exec (e.g. resource limits)
        self.data_dir = str(data_dir)
        self.flags = [str(f) for f in flags]
        self.env = dict(os.environ, **(env or {}))
        self.proc = None
        self.port = None
        self.log_lines = []

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout=120, ready=True):
        """Starts the server; returns once /health says ready, or with ready=False once it listens."""
        cmd = [str(BIN), "serve", "--model", str(MODEL), "--port", "0", "--data-dir", self.data_dir,
               "--threads", "2", *self.flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
                                     preexec_fn=self.preexec_fn)
        got_port = threading.Event()

        def read_stderr():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.log_lines.append(line)
                m = re.search(r"listening on http://[\d.]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    got_port.set()
        threading.Thread(target=read_stderr, daemon=True).start()
        if not got_port.wait(timeout):
            self.kill()
            raise AssertionError("server did not start:\n" + "\n".join(self.log_lines))
        if not ready:
            return self
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError("server exited:\n" + "\n".join(self.log_lines))
            time.sleep(0.1)
        raise AssertionError("server never became healthy")

    def wait_log(self, text, timeout=60):
        """The first stderr line holding text, waiting for it: a restore logs
        its end on the event loop, which may come after /health answers."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for line in list(self.log_lines):
                if text in line:
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no log line with {text!r} in {timeout} s:\n" + "\n".join(self.log_lines))

    def stop(self, timeout=60):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
            if rc:  # why, for the failing test's captured output (a sanitizer's report, an exit's last words)
                time.sleep(0.2)  # (the stderr reader's last lines)
                print("\n".join([line for line in self.log_lines if not line.startswith("{")][-80:]))
            return rc
        return self.proc.returncode if self.proc else None

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def request(self, method, path, body=None, headers=None, raw=None, timeout=300):
        """Returns (status, parsed JSON or text, headers)."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text, hdrs = r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            status, text, hdrs = e.code, e.read().decode(), dict(e.headers)
        try:
            return status, json.loads(text), hdrs
        except ValueError:
            return status, text, hdrs

    def rss_kb(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def metric(server, name, headers=None):
    """One sample of the server's /metrics (None when it reports no such line); headers: a key's."""
    st, text, _ = server.request("GET", "/metrics", headers=headers, timeout=30)
    assert st == 200, text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def serve(tmp_path_factory, *flags):
    """Yields a started server on a fresh data directory (a fixture's body); checks a clean exit."""
    s = Server(tmp_path_factory.mktemp("data"), *flags)
    s.start()
    yield s
    assert s.stop() == 0


def openai_client(server, key="none"):
    import openai
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=300)


def background_ended(client, rid, limit_s=120):
    """A background response once it has ended (neither queued nor in_progress), and the
    statuses polling saw."""
    seen, t0 = [], time.time()
    while time.time() - t0 < limit_s:
        r = client.responses.retrieve(rid)
        seen.append(r.status)
        if r.status not in ("queued", "in_progress"):
            return r, seen
        time.sleep(0.05)
    raise AssertionError(f"{rid} still {seen[-1]} after {limit_s} s")


def background_running(client):
    """A background response that decodes for a while (a count to 3,000), once it runs."""
    long = client.responses.create(model="x", input="Count from 1 to 3000, separated by commas.", background=True,
                                   max_output_tokens=3000, temperature=0)
    t0 = time.time()
    while client.responses.retrieve(long.id).status != "in_progress":
        assert time.time() - t0 < 60, "the background response never ran"
        time.sleep(0.05)
    return long
