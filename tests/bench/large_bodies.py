"""How long large JSON bodies hold the server's event loop: while BODIES requests of MB megabytes
each are sent at once, a probe asks GET /health every 10 ms over one kept-alive connection; the
loop answers it, so the probe's slowest answers are the loop's longest stalls (lease renewals in a
cluster wait the same way: docs/cluster.md, "Limits"). Alternated rounds, one fresh server each,
medians over the rounds.
Usage: .venv/bin/python tests/bench/large_bodies.py [rounds] [--bin PATH]... [--route R] [--mb MB] [--bodies N]
       [--lease-ms MS]
R: input_tokens (POST /v1/responses/input_tokens, the default), responses (POST /v1/responses
with max_output_tokens 1), chat (the same on /v1/chat/completions): all three refused as longer
than the window once tokenized; tokenize (POST /tokenize), detokenize (POST /detokenize, token
ids spread over SmolLM2's vocabulary), completions (POST /v1/completions with those ids as the
prompt, refused as longer than the window), or chunk (a JSON chunk,
{"text": ...}, each to a session of its own with ?wait=false: answered once durable). Each --bin is a potserve binary to compare
(default: POTSERVE_BIN or build/potserve). The text is the Jargon File
(/usr/share/doc/jargon-text/jargon.txt.gz), cut to MB megabytes, so that no two bodies' parses
share their work with a cache. With --lease-ms the server is a replica with a Redis store of its
own (redis-server, started here) holding one session's lease of MS milliseconds, and the lease's
lowest remaining time (PTTL, read every 20 ms) is reported: at or below 0 it lapsed."""
import gzip
import http.client
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def option(name, default, many=False):
    found = []
    while name in sys.argv:
        at = sys.argv.index(name)
        found.append(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    return found if many else (found[-1] if found else default)


BINS = option("--bin", None, many=True) or [os.environ.get("POTSERVE_BIN", str(ROOT / "build/potserve"))]
ROUTE = option("--route", "input_tokens")
MB = float(option("--mb", "8"))
BODIES = int(option("--bodies", "6"))
LEASE_MS = option("--lease-ms", None)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
os.environ["POTSERVE_BIN"] = BINS[0]  # (server_util reads it at import; each Server below names its own)
sys.path.insert(0, str(ROOT / "tests/py"))
import server_util  # noqa: E402
from cluster_util import Redis  # noqa: E402

JARGON = gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", errors="replace").read()


def body(i):
    n = int(MB * 1e6)
    text = (JARGON * (n // len(JARGON) + 2))[i * 997:][:n]  # (each body starts elsewhere)
    path, payload = {
        "input_tokens": ("/v1/responses/input_tokens", {"model": "x", "input": text}),
        "responses": ("/v1/responses", {"model": "x", "input": text, "max_output_tokens": 1}),
        "chat": ("/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": text}],
                                          "max_tokens": 1}),
        "tokenize": ("/tokenize", {"content": text}),
        "detokenize": ("/detokenize", {"tokens": [(i + k * 7919) % 49152 for k in range(n // 6)]}),
        "completions": ("/v1/completions", {"model": "x", "prompt": [(i + k * 7919) % 49152 for k in range(n // 6)],
                                            "max_tokens": 1}),
        "chunk": ("/v1/sessions/{sid}/chunks?wait=false", {"text": text}),
    }[ROUTE]
    return path, json.dumps(payload).encode()


def post(port, path, data, out):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t = time.time()
    c.request("POST", path, data, {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    out.append((r.status, time.time() - t))
    c.close()


def pttl(port, key):
    """The key's PTTL, asked over a socket of its own (RESP)."""
    import socket
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(f"*2\r\n$4\r\nPTTL\r\n${len(key)}\r\n{key}\r\n".encode())
        return int(c.recv(64).split(b"\r\n")[0][1:])


def one_round(binary, payloads):
    server_util.BIN = pathlib.Path(binary)
    with tempfile.TemporaryDirectory() as d:
        redis, flags, lowest = None, [], []
        if LEASE_MS:
            redis = Redis(pathlib.Path(d) / "redis").start()
            flags = ["--store", redis.url, "--replica-name", "a", "--lease-ms", LEASE_MS]
        s = server_util.Server(pathlib.Path(d) / "data", "--max_body_bytes", str(int(MB * 1e6) + (1 << 20)),
                               *flags).start()
        try:
            if redis:  # a session whose lease this replica holds (its first chunk takes it)
                sid = s.request("POST", "/v1/sessions", {})[1]["id"]
                for _ in range(50):  # (409 session_busy until this replica has taken it over)
                    st, answer, _ = s.request("POST", f"/v1/sessions/{sid}/chunks", raw=b"Hello.",
                                              headers={"Content-Type": "text/plain"})
                    if st != 409:
                        break
                    time.sleep(0.1)
                assert st == 200, answer
                key = f"potserve:s:{sid}:lease"
                watching = threading.Event()

                def watch():
                    while not watching.is_set():
                        lowest.append(pttl(redis.port, key))
                        time.sleep(0.02)
                w = threading.Thread(target=watch)
                w.start()
            probe = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            lat, done, answers = [], threading.Event(), []

            def probing():
                while not done.is_set():
                    t = time.time()
                    probe.request("GET", "/health")
                    probe.getresponse().read()
                    lat.append(time.time() - t)
                    time.sleep(0.01)
            p = threading.Thread(target=probing)
            p.start()
            time.sleep(0.2)
            paths = [path.format(sid=s.request("POST", "/v1/sessions", {})[1]["id"]) if "{sid}" in path else path
                     for path, _ in payloads]
            senders = [threading.Thread(target=post, args=(s.port, path, data, answers))
                       for path, (_, data) in zip(paths, payloads)]
            t0 = time.time()
            for t in senders:
                t.start()
            for t in senders:
                t.join()
            wall = time.time() - t0
            done.set()
            p.join()
            if redis:
                time.sleep(0.5)
                watching.set()
                w.join()
        finally:
            s.kill()  # (a chunk's ingest would run on for minutes)
            if redis:
                redis.stop()
    lat.sort()
    dropped = any("dropping it here" in line for line in s.log_lines)
    return {"max": lat[-1], "p99": lat[int(0.99 * (len(lat) - 1))], "median": statistics.median(lat),
            "wall": wall, "statuses": sorted({a[0] for a in answers}),
            "lease": f", lease PTTL lowest {min(lowest)} ms{' (dropped)' if dropped else ''}" if lowest else ""}


def main():
    payloads = [body(i) for i in range(BODIES)]
    print(f"{BODIES} bodies of {len(payloads[0][1]) / 1e6:.1f} MB at once to {payloads[0][0]}, {ROUNDS} rounds")
    rows = {b: [] for b in BINS}
    for k in range(ROUNDS):
        for b in (BINS if k % 2 == 0 else BINS[::-1]):
            rows[b].append(one_round(b, payloads))
            r = rows[b][-1]
            print(f"  round {k} {b}: /health max {r['max'] * 1e3:.0f} ms, p99 {r['p99'] * 1e3:.0f} ms, "
                  f"bodies answered {r['statuses']} in {r['wall']:.2f} s{r['lease']}", flush=True)
    print("binary | /health slowest (median of rounds) | 99th percentile | median | bodies' wall time")
    for b in BINS:
        m = lambda key: statistics.median(r[key] for r in rows[b])  # noqa: E731
        print(f"{b} | {m('max') * 1e3:.0f} ms | {m('p99') * 1e3:.0f} ms | {m('median') * 1e3:.1f} ms | {m('wall'):.2f} s")


if __name__ == "__main__":
    main()
