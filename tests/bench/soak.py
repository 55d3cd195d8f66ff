#!/usr/bin/env python3
"""Soak test of `potserve serve` on loopback: many clients at once, each in a
loop creating a session, uploading a document in chunks (some with
?wait=false, some with progress events), asking about it, and deleting it,
with random disconnects mid-upload and mid-answer. Bounded in time (at most
10 minutes). Reports errors by kind, RSS over time (start, after warm-up,
end, and the growth after warm-up), open file descriptors, threads and TCP
connections of the server before and after (after the clients are gone and
the idle timeout has passed), and the sessions left behind.

Not part of `make test`: `make soak SOAK_SECONDS=300`. Exit status 1 when a
check fails: the server died or answered an undocumented 5xx, a request hung
past the timeouts, RSS grew more than --max-growth-mb after warm-up, or file
descriptors / connections / sessions leaked."""
import argparse
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

IDLE_TIMEOUT = 5


def proc_status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def n_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def n_connections(port):
    """ESTABLISHED/CLOSE_WAIT TCP sockets whose local port is the server's."""
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    lport = int(parts[1].split(":")[1], 16)
                    if lport == port and parts[3] in ("01", "08"):  # ESTABLISHED, CLOSE_WAIT
                        n += 1
        except OSError:
            pass
    return n


class Soak:
    def __init__(self, a):
        self.a = a
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = {}
        self.samples = []
        self.stop = threading.Event()

    def count(self, what, n=1):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def error(self, kind, detail):
        with self.lock:
            e = self.errors.setdefault(kind, [0, detail[:300]])
            e[0] += 1

    # ---- HTTP -------------------------------------------------------------------------

    def call(self, method, path, body=None, raw=None, headers=None, timeout=None):
        timeout = timeout or self.a.timeout
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            h = {"Content-Type": "application/json"} if body is not None else {}
            h.update(headers or {})
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            text = r.read()
            self.count(f"status_{r.status}")
            if r.status >= 500 and r.status not in (503, 507):
                self.error(f"status_{r.status}", f"{method} {path}: {text[:200]!r}")
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text
        except socket.timeout:
            self.error("hang", f"{method} {path}: no answer in {timeout} s")
            return None, None
        except OSError as e:
            self.error("connection_error", f"{method} {path}: {e!r}")
            return None, None
        finally:
            c.close()

    def cut_off(self, path, body, headers):
        """Sends part of a request, or all of it and leaves before the answer."""
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n" + \
                "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            data = head.encode() + body
            s.sendall(data[:random.randrange(len(head), len(data) + 1)])
            time.sleep(random.choice([0, 0.05, 0.3]))
            s.close()
            self.count("disconnects")
        except OSError as e:
            self.error("connection_error", f"cut_off {path}: {e!r}")

    # ---- one client -------------------------------------------------------------------------

    def client(self, i):
        rng = random.Random(self.a.seed * 100 + i)
        words = "the river bridge market town year archive north south password harbor".split()
        while not self.stop.is_set():
            st, ses = self.call("POST", "/v1/sessions", {"budget_tokens": rng.choice([64, 128, 256]),
                                                         "policy": rng.choice(["infinipot", "streaming", "h2o"])})
            if st != 201:
                self.count("create_refused")
                time.sleep(0.5)
                continue
            sid = ses["id"]
            self.count("sessions")
            seq = 0
            for _ in range(rng.randrange(1, 5)):
                if self.stop.is_set():
                    break
                text = " ".join(rng.choice(words) for _ in range(rng.randrange(20, 300))).encode()
                path = f"/v1/sessions/{sid}/chunks"
                hdrs = {"Content-Type": "text/plain; charset=utf-8"}
                if rng.random() < self.a.disconnect_rate:
                    self.cut_off(path + f"?seq={seq + 1}", text, hdrs)
                    time.sleep(0.2)
                    st, cur = self.call("GET", f"/v1/sessions/{sid}")
                    if st == 200:
                        seq = cur["last_seq"]  # the cut chunk may or may not have landed
                    continue
                q = f"?seq={seq + 1}"
                if rng.random() < 0.2:
                    q += "&wait=false"
                if rng.random() < 0.15:
                    hdrs["Accept"] = "text/event-stream"
                st, body = self.call("POST", path + q, raw=text, headers=hdrs)
                if st in (200, 202):
                    seq += 1
                    self.count("chunks")
                    self.count("bytes", len(text))
                elif st == 409:
                    self.count("chunk_conflict")  # busy (wait=false ingest) or failed session
                    time.sleep(0.3)
            if rng.random() < self.a.disconnect_rate:
                self.cut_off("/v1/chat/completions", json.dumps({
                    "messages": [{"role": "user", "content": "What is it about?"}], "max_tokens": 16,
                    "session": sid, "stream": True}).encode(), {"Content-Type": "application/json"})
            else:
                st, body = self.call("POST", "/v1/chat/completions", {
                    "messages": [{"role": "user", "content": "What is the document about?"}],
                    "max_tokens": rng.choice([4, 8, 16]), "temperature": 0, "session": sid,
                    "stream": rng.random() < 0.3})
                if st == 200:
                    self.count("answers")
            for _ in range(20):  # a session ingesting a wait=false chunk is busy for a while
                st, _ = self.call("DELETE", f"/v1/sessions/{sid}")
                if st != 409:
                    break
                time.sleep(0.3)
            if st == 200:
                self.count("deleted")

    # ---- the run -----------------------------------------------------------------------------

    def sample(self, t0):
        pid = self.proc.pid
        s = {"t": round(time.time() - t0, 1), "rss_kb": proc_status(pid, "VmRSS"), "fds": n_fds(pid),
             "threads": proc_status(pid, "Threads"), "connections": n_connections(self.port)}
        self.samples.append(s)
        return s

    def run(self):
        a = self.a
        tmp = tempfile.mkdtemp(prefix="potserve-soak-")
        log = open(os.path.join(tmp, "server.log"), "wb")
        self.proc = subprocess.Popen([a.bin, "serve", "--model", a.model, "--port", "0", "--data-dir",
                                      os.path.join(tmp, "data"), "--threads", str(a.threads),
                                      "--idle-timeout", str(IDLE_TIMEOUT), "--request-timeout", "60",
                                      "--access-log", "false", "--max-sessions-per-key", "1000"],
                                     stdout=subprocess.DEVNULL, stderr=log)
        for _ in range(600):
            with open(log.name, "rb") as f:
                m = re.search(rb"listening on http://[\d.]+:(\d+)", f.read())
            if m:
                break
            time.sleep(0.2)
        self.port = int(m.group(1))
        while self.call("GET", "/health", timeout=10)[0] != 200:
            time.sleep(0.2)
        t0 = time.time()
        before = self.sample(t0)
        threads = [threading.Thread(target=self.client, args=(i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        warm = None
        while time.time() - t0 < a.seconds and self.proc.poll() is None:
            time.sleep(a.sample_every)
            s = self.sample(t0)
            if warm is None and s["t"] >= a.seconds * a.warmup:
                warm = s
            print(f"  t={s['t']:6.1f}s rss {s['rss_kb'] / 1024:7.1f} MiB  fds {s['fds']:4d}  threads "
                  f"{s['threads']:3d}  connections {s['connections']:3d}  chunks {self.counts.get('chunks', 0)}",
                  flush=True)
        self.stop.set()
        for t in threads:
            t.join(300)
        died = self.proc.poll()
        time.sleep(IDLE_TIMEOUT + 2)  # idle connections closed by the server
        # sessions whose delete met a busy session (its last chunk still ingesting) go now
        st, listed = self.call("GET", "/v1/sessions") if died is None else (None, None)
        stragglers = [x["id"] for x in listed["data"]] if isinstance(listed, dict) else []
        deadline = time.time() + 120
        while stragglers and time.time() < deadline:
            stragglers = [sid for sid in stragglers if self.call("DELETE", f"/v1/sessions/{sid}")[0] == 409]
            time.sleep(1)
        after = self.sample(t0) if died is None else {}
        st, listed = self.call("GET", "/v1/sessions") if died is None else (None, None)
        left = len(listed["data"]) if isinstance(listed, dict) else None
        rc = None
        if died is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(60)
        log.close()
        end = self.samples[-2] if len(self.samples) > 1 else before
        growth_mb = (end["rss_kb"] - warm["rss_kb"]) / 1024 if warm else None
        checks = {
            "server_alive": died is None,
            "sigterm_exit_0": rc == 0,
            "no_undocumented_5xx_or_hang": not any(k.startswith("status_5") or k == "hang" for k in self.errors),
            "rss_flat_after_warmup": growth_mb is not None and growth_mb <= a.max_growth_mb,
            "fds_back": bool(after) and after["fds"] <= before["fds"],
            "no_session_left": left == 0,
            "connections_closed": bool(after) and after["connections"] == 0,
            # libuv's pool starts its threads on first use: bounded by the warm-up count
            "threads_bounded": bool(after) and warm is not None and after["threads"] <= warm["threads"],
        }
        result = {"seconds": a.seconds, "clients": a.clients, "seed": a.seed, "counts": self.counts,
                  "errors": self.errors, "before": before, "warm": warm, "end": end, "after": after,
                  "rss_growth_after_warmup_mb": growth_mb, "sessions_left": left, "checks": checks,
                  "samples": self.samples, "server_log": log.name}
        print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=1))
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump(result, f, indent=1)
        return all(checks.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="build/potserve")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300,
                    help="seconds a request may take: the one engine thread serves every client in turn")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--disconnect-rate", type=float, default=0.1)
    ap.add_argument("--warmup", type=float, default=0.25, help="fraction of the run before the warm-up sample")
    ap.add_argument("--sample-every", type=float, default=10)
    ap.add_argument("--max-growth-mb", type=float, default=16)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    a.seconds = min(a.seconds, 600)
    sys.exit(0 if Soak(a).run() else 1)


if __name__ == "__main__":
    main()
