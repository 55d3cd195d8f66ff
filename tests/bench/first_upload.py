"""How long a new session's first chunk takes in a cluster: a session is made through replica a,
its first chunk (2 KB, ?wait=false) sent with curl -T through replica b, which takes it over;
a 409 is retried after its Retry-After (1 s), as a client would. Two replicas share a Redis
started here; binaries alternated by round, medians.
Usage: .venv/bin/python tests/bench/first_upload.py [rounds] [--bin PATH]...  (default 3 rounds,
five sessions a round; --bin: potserve binaries to compare, default build/potserve)"""
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/py"))
import server_util  # noqa: E402
from cluster_util import Redis, replica  # noqa: E402

BINS = []
while "--bin" in sys.argv:
    at = sys.argv.index("--bin")
    BINS.append(sys.argv[at + 1])
    del sys.argv[at:at + 2]
BINS = BINS or [str(ROOT / "build/potserve")]
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def one_round(binary, times):
    server_util.BIN = pathlib.Path(binary)
    with tempfile.TemporaryDirectory() as d:
        d = pathlib.Path(d)
        redis = Redis(d / "redis").start()
        a, b = replica(d / "a", redis, "a").start(), replica(d / "b", redis, "b").start()
        try:
            chunk = d / "chunk.txt"
            chunk.write_text("The lighthouse keeper wrote in his log every night. " * 40)
            for _ in range(5):
                sid = a.request("POST", "/v1/sessions", {})[1]["id"]
                t0, tries = time.time(), 0
                while True:
                    tries += 1
                    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-T", str(chunk),
                                          "-H", "Content-Type: text/plain",
                                          f"{b.url}/v1/sessions/{sid}/chunks?wait=false"],
                                         capture_output=True, text=True, timeout=60)
                    if out.stdout == "202":
                        break
                    assert out.stdout == "409", out.stdout
                    time.sleep(1.0)  # (its Retry-After)
                times.append((time.time() - t0, tries))
                assert b.request("DELETE", f"/v1/sessions/{sid}")[0] == 200
        finally:
            a.kill()
            b.kill()
            redis.stop()


def main():
    rows = {b: [] for b in BINS}
    for k in range(ROUNDS):
        for b in (BINS if k % 2 == 0 else BINS[::-1]):
            one_round(b, rows[b])
    for b in BINS:
        print(f"{b}: create to 202 median {statistics.median(t for t, _ in rows[b]):.3f} s, "
              f"requests {sorted(n for _, n in rows[b])}")


if __name__ == "__main__":
    main()
