"""Cluster figures (docs/cluster.md): through nginx with 1, 2 and 3 replicas
on a shared Redis store, sessions created per second and aggregate ingest
tokens per second; failover time (SIGKILL of a session's replica -> first
successful request of that session through nginx); the store's cost per
chunk (Redis vs dir, each with its fsync setting), alternated runs.

Usage: python tests/cluster/bench.py [--replicas 1,2,3] [--what scale,failover,store]"""
import argparse
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cluster_util import Nginx, Redis, replica  # noqa: E402
from failover import document, http, until_ok  # noqa: E402
from server_util import Server  # noqa: E402


def parallel(n_threads, jobs):
    """Runs the callables in jobs on n_threads threads; their results in order."""
    out = [None] * len(jobs)
    it = iter(range(len(jobs)))
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            out[i] = jobs[i]()
    ts = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def upload(url, sid, parts, final=True):
    for seq, part in enumerate(parts, 1):
        until_ok(lambda: http(url, "POST", f"/v1/sessions/{sid}/chunks?seq={seq}&final="
                              f"{'true' if final and seq == len(parts) else 'false'}", raw=part.encode(),
                              headers={"Content-Type": "text/plain", "X-Session-Id": sid}, timeout=120),
                 timeout=600, what=f"{sid} chunk {seq}")
    return until_ok(lambda: http(url, "GET", f"/v1/sessions/{sid}"), what="stats")["tokens_ingested"]


def cluster(tmp, n, threads, lease_ms=3000):
    redis = Redis(tmp / "redis").start()
    reps = [replica(tmp / f"r{i}", redis, f"r{i}", "--threads", str(threads), "--durability", "fsync",
                    lease_ms=lease_ms).start() for i in range(n)]
    nginx = Nginx(tmp / "nginx", [r.port for r in reps], read_timeout_s=60).start()
    return redis, reps, nginx


def stop_all(redis, reps, nginx):
    for r in reps:
        r.stop()
    nginx.stop()
    redis.stop()


def scale(args, tmp):
    rows = []
    for n in args.replicas:
        d = tmp / f"scale{n}"
        redis, reps, nginx = cluster(d, n, args.threads)
        try:
            t0 = time.time()
            sids = parallel(8, [lambda: until_ok(lambda: http(nginx.url, "POST", "/v1/sessions",
                                                              {"budget_tokens": 256}), what="create")["id"]
                                for _ in range(args.create)])
            create_s = time.time() - t0
            docs = [document(i, args.chunks, args.chunk_bytes) for i in range(args.ingest_sessions)]
            t0 = time.time()
            tokens = parallel(args.ingest_sessions, [lambda i=i: upload(nginx.url, sids[i], docs[i])
                                                     for i in range(args.ingest_sessions)])
            ingest_s = time.time() - t0
            rows.append({"replicas": n, "sessions_created": args.create,
                         "sessions_per_s": round(args.create / create_s, 1),
                         "ingest_sessions": args.ingest_sessions, "tokens": sum(tokens),
                         "ingest_s": round(ingest_s, 1), "tokens_per_s": round(sum(tokens) / ingest_s, 1)})
            print(json.dumps(rows[-1]), flush=True)
        finally:
            stop_all(redis, reps, nginx)
    return rows


def failover(args, tmp):
    """Idle cluster of 3: a session with its document, its replica SIGKILLed,
    time until a chunk of it is acknowledged through nginx."""
    times = []
    for k in range(args.failover_runs):
        d = tmp / f"failover{k}"
        redis, reps, nginx = cluster(d, 3, args.threads, lease_ms=args.lease_ms)
        try:
            sid = until_ok(lambda: http(nginx.url, "POST", "/v1/sessions", {"budget_tokens": 256}))["id"]
            parts = document(k, 4, 400)
            upload(nginx.url, sid, parts[:3], final=False)
            holder = redis.cli("GET", f"potserve:s:{sid}:lease").split(" ", 1)[1]
            victim = reps[int(holder[1:])]
            t0 = time.time()
            victim.kill()
            until_ok(lambda: http(nginx.url, "POST", f"/v1/sessions/{sid}/chunks?seq=4&final=true",
                                  raw=parts[3].encode(), headers={"Content-Type": "text/plain"}),
                     what="after kill")
            times.append(time.time() - t0)
            print(json.dumps({"failover_s": round(times[-1], 2), "lease_ms": args.lease_ms}), flush=True)
        finally:
            stop_all(redis, reps, nginx)
    return {"lease_ms": args.lease_ms, "runs": [round(t, 2) for t in times],
            "median_s": round(statistics.median(times), 2)}


def store_cost(args, tmp):
    """Per-chunk latency of small chunks straight to one server (no nginx),
    alternated rounds: the Redis store vs the dir store with the same promise
    (appendfsync always / --durability fsync) and without syncs
    (appendfsync everysec / --durability none)."""
    redis = Redis(tmp / "store-redis").start()
    kinds = [("dir", "fsync"), ("redis", "always"), ("dir", "none"), ("redis", "everysec")]
    lat = {f"{k}/{d}": [] for k, d in kinds}
    try:
        for rnd in range(args.store_rounds):
            for kind, dur in kinds:
                flags = ["--threads", str(args.threads), "--access-log", "false"]
                if kind == "redis":
                    redis.cli("CONFIG", "SET", "appendfsync", dur)
                    flags += ["--store", redis.url, "--replica-name", f"b{rnd}{dur}"]
                else:
                    flags += ["--durability", dur]
                srv = Server(tmp / f"store-{kind}-{dur}-{rnd}", *flags).start()
                try:
                    sid = srv.request("POST", "/v1/sessions", {"budget_tokens": 256})[1]["id"]
                    if kind == "redis":  # the first request takes it over
                        def ready():
                            st, body, _ = srv.request("GET", f"/v1/sessions/{sid}")
                            return (200, body) if st == 200 and body["status"] == "ready" else (409, body)
                        until_ok(ready)
                    for seq in range(1, args.store_chunks + 1):
                        t0 = time.perf_counter()
                        st, body, _ = srv.request("POST", f"/v1/sessions/{sid}/chunks?seq={seq}", raw=b"word ",
                                                  headers={"Content-Type": "text/plain"})
                        assert st == 200, body
                        lat[f"{kind}/{dur}"].append(time.perf_counter() - t0)
                finally:
                    srv.stop()
    finally:
        redis.stop()
    med = {k: statistics.median(v) * 1e3 for k, v in lat.items()}
    return {"chunks_per_store": len(lat["dir/fsync"]), "chunk_bytes": 5,
            "median_ms": {k: round(v, 3) for k, v in med.items()},
            "redis_minus_dir_ms_synced": round(med["redis/always"] - med["dir/fsync"], 3),
            "redis_minus_dir_ms_unsynced": round(med["redis/everysec"] - med["dir/none"], 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", default="1,2,3")
    ap.add_argument("--what", default="scale,failover,store")
    ap.add_argument("--threads", type=int, default=1, help="compute threads of each replica")
    ap.add_argument("--create", type=int, default=60)
    ap.add_argument("--ingest-sessions", type=int, default=6)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--chunk-bytes", type=int, default=2000)
    ap.add_argument("--failover-runs", type=int, default=3)
    ap.add_argument("--lease-ms", type=int, default=3000)
    ap.add_argument("--store-rounds", type=int, default=3)
    ap.add_argument("--store-chunks", type=int, default=100)
    args = ap.parse_args()
    args.replicas = [int(x) for x in args.replicas.split(",")]
    what = args.what.split(",")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="potserve-bench-"))
    out = {}
    try:
        if "scale" in what:
            out["scale"] = scale(args, tmp)
        if "failover" in what:
            out["failover"] = failover(args, tmp)
        if "store" in what:
            out["store"] = store_cost(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
