"""Failover under load (make test-cluster): redis-server (AOF, appendfsync
always), three potserve replicas on a shared Redis store, nginx routing by
session id (docker/nginx-cluster.conf), all on loopback, no containers.

SESSIONS sessions upload their documents through nginx in numbered chunks,
retrying every refusal (409 busy, 421 elsewhere, 502/503/504, a dropped
connection) with the same seq. Meanwhile one replica is killed (SIGKILL) and
another paused (SIGSTOP) while it is in the middle of an upload of its own,
then woken (SIGCONT) after another replica has taken that session over.

Asserted: every session finishes; every acknowledged chunk is in the store
exactly once, in order, with its bytes (0 lost, 0 duplicated); each
session's pot statistics and greedy answer equal a single-node run (the dir
store, no cluster) of the same document; the paused replica's late writes
are refused (counted from its metrics, at least the one it was caught in).
Prints the figures.

Usage: python tests/cluster/failover.py [--sessions N] [--chunks N]"""
import argparse
import json
import pathlib
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
from cluster_util import Nginx, Redis, SlowUpload, redis_command, replica, store_chunks  # noqa: E402
from server_util import Server, metric  # noqa: E402

WORDS = ("harbor lantern keeper storm ledger winter copper signal north tide ferry cargo "
         "granite whistle orchard meadow falcon ember violet canyon river atlas beacon summit").split()
QUESTION = "What is the document about? Answer in a few words."
BUDGET = 96
LEASE_MS = 1500
RETRYABLE = {409, 421, 429, 502, 503, 504}


def document(i, n_chunks, chunk_bytes):
    rng = random.Random(1000 + i)
    text = ""
    while len(text) < n_chunks * chunk_bytes:
        text += " ".join(rng.choice(WORDS) for _ in range(12)) + ". "
    return [text[k * chunk_bytes:(k + 1) * chunk_bytes] for k in range(n_chunks)]


def http(url, method, path, body=None, raw=None, headers=None, timeout=60):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json"} if body is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(url + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode("latin-1")
    except OSError as e:  # reset, refused, timed out
        return 0, str(e)


def until_ok(fn, timeout=180, what="request"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st, body = fn()
        if st == 200 or st == 201:
            return body
        if st and st not in RETRYABLE:
            raise AssertionError(f"{what}: {st} {body}")
        time.sleep(0.15)
    raise AssertionError(f"{what}: timed out")


class Uploader(threading.Thread):
    """One session's document, chunk after chunk through nginx, each retried until acknowledged."""

    def __init__(self, proxy, sid, parts, stats):
        super().__init__(daemon=True)
        self.proxy, self.sid, self.parts, self.stats = proxy, sid, parts, stats
        self.acked = []       # (seq, time, duplicate)
        self.error = None

    def run(self):
        try:
            for seq, part in enumerate(self.parts, 1):
                final = seq == len(self.parts)
                while True:
                    st, body = http(self.proxy, "POST",
                                    f"/v1/sessions/{self.sid}/chunks?seq={seq}&final={'true' if final else 'false'}",
                                    raw=part.encode(), headers={"Content-Type": "text/plain",
                                                                "X-Session-Id": self.sid}, timeout=60)
                    with self.stats["lock"]:
                        self.stats["responses"][st] = self.stats["responses"].get(st, 0) + 1
                    if st == 200:
                        self.acked.append((seq, time.time(), bool(body.get("duplicate"))))
                        break
                    if st and st not in RETRYABLE:
                        raise AssertionError(f"{self.sid} chunk {seq}: {st} {body}")
                    time.sleep(0.1)
        except Exception as e:  # reported by the main thread
            self.error = e


def lease_holder(redis, sid):
    v = redis_command(redis.port, "GET", f"potserve:s:{sid}:lease")
    return v.decode().split(" ", 1)[1] if v else None


def reference(tmp, docs, threads):
    """Pot statistics and greedy answers of a single node (dir store)."""
    srv = Server(tmp / "single", "--threads", str(threads), "--access-log", "false").start()
    out = []
    try:
        for parts in docs:
            sid = srv.request("POST", "/v1/sessions", {"budget_tokens": BUDGET})[1]["id"]
            for seq, part in enumerate(parts, 1):
                st, body, _ = srv.request("POST", f"/v1/sessions/{sid}/chunks?seq={seq}&final="
                                          f"{'true' if seq == len(parts) else 'false'}", raw=part.encode(),
                                          headers={"Content-Type": "text/plain"})
                assert st == 200, body
            stats = pot_stats(srv.request("GET", f"/v1/sessions/{sid}")[1])
            st, ans, _ = srv.request("POST", "/v1/chat/completions", {
                "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8, "temperature": 0},
                headers={"X-Session-Id": sid})
            assert st == 200, ans
            out.append((stats, ans["choices"][0]["message"]["content"]))
    finally:
        srv.stop()
    return out


def pot_stats(body):
    return {k: body[k] for k in ("tokens_ingested", "tokens_in_pot", "compressions", "bytes_received",
                                 "last_seq", "final")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--chunk-bytes", type=int, default=240)
    ap.add_argument("--documents", type=int, default=4, help="distinct documents (sessions share them)")
    ap.add_argument("--threads", type=int, default=1, help="compute threads of each replica")
    args = ap.parse_args()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="potserve-cluster-"))
    docs = [document(i, args.chunks, args.chunk_bytes) for i in range(args.documents)]
    t_start = time.time()
    ref = reference(tmp, docs, args.threads)
    print(f"single-node reference: {len(docs)} documents in {time.time() - t_start:.1f} s")

    redis = Redis(tmp / "redis").start()
    names = ["r1", "r2", "r3"]
    # idle_timeout past the pause: the paused replica keeps the half-sent upload of the probe open
    reps = [replica(tmp / n, redis, n, "--threads", str(args.threads), "--idle-timeout", "600", lease_ms=LEASE_MS).start()
            for n in names]
    nginx = Nginx(tmp / "nginx", [r.port for r in reps], read_timeout_s=5).start()
    by_name = dict(zip(names, reps))
    stats = {"lock": threading.Lock(), "responses": {}}
    try:
        sids = [until_ok(lambda: http(nginx.url, "POST", "/v1/sessions", {"budget_tokens": BUDGET}),
                         what="create")["id"] for _ in range(args.sessions)]
        # the probe: a session whose owner will be paused in the middle of an upload
        probe = until_ok(lambda: http(nginx.url, "POST", "/v1/sessions", {"budget_tokens": BUDGET}),
                         what="create probe")["id"]
        probe_parts = document(99, 2, args.chunk_bytes)
        until_ok(lambda: http(nginx.url, "POST", f"/v1/sessions/{probe}/chunks?seq=1", raw=probe_parts[0].encode(),
                              headers={"Content-Type": "text/plain"}), what="probe chunk 1")
        paused_name = lease_holder(redis, probe)
        killed_name = next(n for n in names if n != paused_name)
        paused, killed = by_name[paused_name], by_name[killed_name]

        workers = [Uploader(nginx.url, sid, docs[i % len(docs)], stats) for i, sid in enumerate(sids)]
        t0 = time.time()
        for w in workers:
            w.start()
        total = args.sessions * args.chunks

        def acked():
            return sum(len(w.acked) for w in workers)
        while acked() < total // 4:
            time.sleep(0.05)
        owned_by_killed = {sid for sid in sids if lease_holder(redis, sid) == killed_name}
        t_kill = time.time()
        killed.kill()  # SIGKILL
        print(f"SIGKILL {killed_name} at {acked()}/{total} chunks acknowledged "
              f"({len(owned_by_killed)} sessions held there)")

        # the paused owner is caught with half a chunk of the probe read
        late = "stale words the paused replica must never append " * 6
        up = SlowUpload(paused.port, probe, 2, late, final=True)
        time.sleep(0.3)
        paused.proc.send_signal(signal.SIGSTOP)
        t_pause = time.time()
        print(f"SIGSTOP {paused_name} at {acked()}/{total} chunks acknowledged")
        # meanwhile another replica takes the probe over and appends its real chunk 2
        until_ok(lambda: http(nginx.url, "POST", f"/v1/sessions/{probe}/chunks?seq=2&final=true",
                              raw=probe_parts[1].encode(), headers={"Content-Type": "text/plain"}),
                 what="probe chunk 2 elsewhere")
        probe_moved_s = time.time() - t_pause
        paused.proc.send_signal(signal.SIGCONT)
        late_status, late_body = up.finish()
        print(f"SIGCONT {paused_name} after {time.time() - t_pause:.1f} s; its late chunk: {late_status} {late_body}")

        for w in workers:
            w.join(600)
        elapsed = time.time() - t0
        errors = [w.error for w in workers if w.error or w.is_alive()]
        assert not errors, errors
        moved = [t for w in workers if w.sid in owned_by_killed for (_, t, _) in w.acked if t > t_kill]
        failover_s = min(moved) - t_kill if moved else None

        # 0 lost, 0 duplicated: the store holds every acknowledged chunk once, in order, with its bytes
        lost = duplicated = 0
        for i, w in enumerate(workers):
            parts = docs[i % len(docs)]
            chunks = store_chunks(redis.port, w.sid)
            seqs = [c[0] for c in chunks]
            duplicated += len(seqs) - len(set(seqs))
            stored = {c[0]: c[2] for c in chunks}
            for seq, _, _ in w.acked:
                if stored.get(seq) != parts[seq - 1].encode():
                    lost += 1
            assert seqs == list(range(1, len(parts) + 1)), (w.sid, seqs)
            assert [c[1] for c in chunks] == [0] * (len(parts) - 1) + [1]
        probe_chunks = store_chunks(redis.port, probe)
        assert [c[2] for c in probe_chunks] == [p.encode() for p in probe_parts], "the paused replica's write landed"

        # every session's pot and greedy answer equal the single node's
        mismatched = 0
        for i, w in enumerate(workers):
            want_stats, want_answer = ref[i % len(docs)]
            got = until_ok(lambda: http(nginx.url, "GET", f"/v1/sessions/{w.sid}"), what="session")
            st, ans = 0, None
            deadline = time.time() + 120
            while time.time() < deadline:
                st, ans = http(nginx.url, "POST", "/v1/chat/completions", {
                    "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8, "temperature": 0},
                    headers={"X-Session-Id": w.sid})
                if st == 200 or (st and st not in RETRYABLE):
                    break
                time.sleep(0.15)
            assert st == 200, (st, ans)
            got_answer = ans["choices"][0]["message"]["content"]
            if pot_stats(got) != want_stats or got_answer != want_answer:
                mismatched += 1
                print(f"MISMATCH {w.sid}: {pot_stats(got)} {got_answer!r} vs {want_stats} {want_answer!r}")
                for n, r in by_name.items():  # what each replica said of it, for the diagnosis
                    for line in r.log_lines:
                        if w.sid in line:
                            print(f"  {n}: {line}")
        fenced = metric(paused, "potserve_store_fenced_writes_total")
        takeovers = {n: metric(r, "potserve_store_takeovers_total") for n, r in by_name.items() if r is not killed}
        handoffs = {n: metric(r, "potserve_store_handoffs_total") for n, r in by_name.items() if r is not killed}
        acks = sum(len(w.acked) for w in workers)
        dups = sum(d for w in workers for (_, _, d) in w.acked)
        tokens = sum(ref[i % len(docs)][0]["tokens_ingested"] for i in range(len(workers)))
        print(json.dumps({
            "sessions": args.sessions, "chunks_per_session": args.chunks, "chunk_bytes": args.chunk_bytes,
            "replicas": 3, "lease_ms": LEASE_MS, "killed": killed_name, "paused": paused_name,
            "upload_seconds": round(elapsed, 1), "tokens_ingested": tokens,
            "chunks_acknowledged": acks, "acknowledged_as_duplicate_of_a_retry": dups,
            "responses_by_status": {str(k): v for k, v in sorted(stats["responses"].items())},
            "acknowledged_chunks_lost": lost, "chunks_duplicated_in_store": duplicated,
            "sessions_differing_from_single_node": mismatched,
            "failover_seconds_kill_to_first_ack_of_a_moved_session": failover_s and round(failover_s, 2),
            "probe_moved_seconds_after_pause": round(probe_moved_s, 2),
            "paused_replica_late_writes_refused": fenced, "late_chunk_status": late_status,
            "takeovers": takeovers, "handoffs": handoffs}, indent=1))
        assert lost == 0 and duplicated == 0 and mismatched == 0, (lost, duplicated, mismatched)
        assert late_status == 421 and fenced >= 1, (late_status, late_body, fenced)
        print("failover test: OK")
    finally:
        for r in reps:
            if r.proc and r.proc.poll() is None:
                r.proc.send_signal(signal.SIGCONT)
                r.stop()
        nginx.stop()
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
