"""How fast streamed tokens reach their clients, one server binary against another on the same
requests: the time to the first token, the gap between tokens (median and 99th percentile) and
the server's CPU seconds per generated token, with 1 and with several clients streaming at once.
Every token's wake goes through the event loop (the engine thread resumes the connection, the loop
runs libmicrohttpd), so this is what a change to that path must not slow down. The two servers
run side by side and are asked in alternated rounds; the answers must be equal.
Usage: .venv/bin/python tests/bench/stream_latency.py BIN_A BIN_B [rounds] [clients]
(default 5 rounds, 4 clients in the concurrent case; each stream asks for 128 tokens of an
explanation of a Jargon File entry, text no one here wrote)."""
import gzip
import http.client
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
import server_util  # noqa: E402

bins = sys.argv[1:3]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
clients = int(sys.argv[4]) if len(sys.argv) > 4 else 4
jargon = gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", errors="replace").read()
entries = [e.strip() for e in jargon.split("\n\n") if 400 < len(e.strip()) < 1200][100:100 + clients]
tmp = pathlib.Path(tempfile.mkdtemp())


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks of 1/100 s


def stream(s, entry, out):
    """One streamed chat answer: the arrival times of its content deltas, and its text."""
    body = json.dumps({"model": "x", "max_tokens": 128, "temperature": 0, "stream": True,
                       "messages": [{"role": "user", "content": "Explain this passage:\n\n" + entry}]})
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=300)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    times, text = [], []
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
        if delta:
            times.append(time.perf_counter() - t0)
            text.append(delta)
    c.close()
    out.append((times, "".join(text)))


def round_of(s, n):
    out = []
    threads = [threading.Thread(target=stream, args=(s, entries[i], out)) for i in range(n)]
    cpu = cpu_seconds(s.proc.pid)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, cpu_seconds(s.proc.pid) - cpu


servers = []
for i, b in enumerate(bins):
    server_util.BIN = b
    servers.append(server_util.Server(tmp / f"d{i}", "--prompt-cache-bytes", "0").start())
try:
    for n in (1, clients):
        stats = {b: {"first": [], "gaps": [], "cpu": [], "tokens": 0} for b in bins}
        answers = {}
        for rnd in range(rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for s in order:
                b = bins[servers.index(s)]
                out, cpu = round_of(s, n)
                st = stats[b]
                for times, text in out:
                    st["first"].append(times[0])
                    st["gaps"] += [y - x for x, y in zip(times, times[1:])]
                    st["tokens"] += len(times)
                    answers.setdefault(b, set()).add(text)
                st["cpu"].append(cpu)
        assert answers[bins[0]] == answers[bins[1]], "the two servers answered differently"
        print(f"\n{n} client(s) streaming at once, {rounds} rounds, medians over all streams:")
        print("| binary | first token ms | gap median ms | gap p99 ms | server CPU ms per token |")
        print("|---|---|---|---|---|")
        for b in bins:
            st = stats[b]
            gaps = sorted(st["gaps"])
            print(f"| {b} | {statistics.median(st['first']) * 1e3:.1f} | {statistics.median(gaps) * 1e3:.2f} | "
                  f"{gaps[int(0.99 * (len(gaps) - 1))] * 1e3:.2f} | {sum(st['cpu']) / st['tokens'] * 1e3:.2f} |")
    for b, s in zip(bins, servers):  # (None: a binary without this metric)
        print(f"{b}: potserve_mhd_stuck_total {server_util.metric(s, 'potserve_mhd_stuck_total')}")
finally:
    for s in servers:
        s.stop()
