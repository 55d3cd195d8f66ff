"""What keeping /v1/responses in Redis costs a request, against keeping them in memory: one
server of each on this machine (the default model, one output token), rounds alternated; medians
of POST (stored), GET /v1/responses/{id}, and a POST continuing it (previous_response_id).
Usage: .venv/bin/python tests/bench/stored_responses.py (needs redis-server: make deps)."""
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
from cluster_util import Redis, replica  # noqa: E402
from server_util import Server, openai_client  # noqa: E402

tmp = pathlib.Path(tempfile.mkdtemp())
redis = Redis(tmp / "redis").start()
mem = Server(tmp / "mem", "--access-log", "false").start()
red = replica(tmp / "red", redis, "r").start()
res = {"memory": {"create": [], "get": [], "chain": []}, "redis": {"create": [], "get": [], "chain": []}}
try:
    for rnd in range(6):
        for name, srv in (("memory", mem), ("redis", red)) if rnd % 2 == 0 else (("redis", red), ("memory", mem)):
            c = openai_client(srv)
            for i in range(10):
                t = time.perf_counter()
                r = c.responses.create(model="x", input=f"Hi {i}", max_output_tokens=1)
                res[name]["create"].append(time.perf_counter() - t)
                t = time.perf_counter()
                c.responses.retrieve(r.id)
                res[name]["get"].append(time.perf_counter() - t)
                t = time.perf_counter()
                c.responses.create(model="x", previous_response_id=r.id, input="Go on.", max_output_tokens=1)
                res[name]["chain"].append(time.perf_counter() - t)
finally:
    mem.stop()
    red.stop()
    redis.stop()
for name in res:
    print(name, {k: f"median {statistics.median(v)*1e3:.2f} ms (n={len(v)})" for k, v in res[name].items()})
