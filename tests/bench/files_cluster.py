"""OpenAI's Files API across two replicas sharing a local Redis (AOF, appendfsync always, as in
the cluster tests): what listing and retrieving cost when the answering replica reads the store
(every replica lists from Redis; a file another replica holds is retrieved from Redis) against
the replica that holds the file (answered from memory). N files of Debian licence text (nobody
here wrote it; pots of 64 tokens, so that all fit in a's memory) are uploaded to replica a; then GET /v1/files on a and b, and GET /v1/files/{id}
on a (held) and b (from the store), alternated, medians over the rounds.
Usage: .venv/bin/python tests/bench/files_cluster.py [files] [rounds] (default 50 files, 30 rounds; a key holds at most 64 sessions by default)."""
import json
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
from cluster_util import Redis, replica  # noqa: E402
from server_util import openai_client  # noqa: E402

n_files = int(sys.argv[1]) if len(sys.argv) > 1 else 50
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 30
text = pathlib.Path("/usr/share/common-licenses/GPL-3").read_text()
tmp = pathlib.Path(tempfile.mkdtemp())
redis = Redis(tmp / "redis").start()
a = replica(tmp / "a", redis, "a").start()
b = replica(tmp / "b", redis, "b").start()
try:
    on_a, on_b = openai_client(a), openai_client(b)
    ids = []
    for i in range(n_files):
        p = tmp / f"f{i}.txt"
        p.write_text(text[i * 200:(i + 1) * 200])
        with open(p, "rb") as fh:
            ids.append(on_a.files.create(file=fh, purpose="user_data",  # (small pots: a's memory holds them all)
                                         extra_body={"settings": json.dumps({"budget_tokens": 64})}).id)
    last = on_b.files.wait_for_processing(ids[-1], poll_interval=0.1)
    assert last.status == "processed"
    times = {"list on a": [], "list on b": [], "retrieve on a (held)": [], "retrieve on b (store)": []}
    for r in range(rounds):
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for what in order:
            client = on_a if what.endswith("on a") or "on a " in what else on_b
            t0 = time.perf_counter()
            if what.startswith("list"):
                got = len(client.files.list(limit=10000).data)
                assert got == n_files, got
            else:
                assert client.files.retrieve(ids[r % n_files]).status == "processed"
            times[what].append(time.perf_counter() - t0)
    print(f"{n_files} files, {rounds} rounds, medians:")
    for what, v in times.items():
        print(f"  {what}: {statistics.median(v) * 1e3:.1f} ms")
finally:
    a.stop()
    b.stop()
    redis.stop()
