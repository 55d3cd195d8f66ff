"""What streaming a background response costs against a plain stream of the same request: the
time to its first text delta and to its end (medians of alternated rounds, one server), the bytes
its event log keeps per generated token, and how far behind the asking client a second client
following it (GET ?stream=true) receives each text delta.
Usage: .venv/bin/python tests/bench/background_stream.py [rounds] [--jargon] [--redis] [--followers N]
(default 7 rounds; the input is a counting prompt written here, or with --jargon "Explain this
passage:" and a passage of the Jargon File, /usr/share/doc/jargon-text/jargon.txt.gz, text no one
here wrote; with --redis two replicas share a Redis store: the asking client's replica ships the
events there, and the followers read them through the other replica; --followers: how many follow
each response at once, 1 by default, with the asking client's time to the end beside them)."""
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
from server_util import Server, openai_client  # noqa: E402

REDIS = "--redis" in sys.argv
if REDIS:
    sys.argv.remove("--redis")
FOLLOWERS = 1
if "--followers" in sys.argv:
    at = sys.argv.index("--followers")
    FOLLOWERS = int(sys.argv[at + 1])
    del sys.argv[at:at + 2]

ASK = dict(model="x", input="Count from 1 to 3000, separated by commas.", max_output_tokens=200, temperature=0)
if "--jargon" in sys.argv:
    sys.argv.remove("--jargon")
    import gzip
    text = gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", errors="replace").read()
    entry = text[text.index("hackers love to take various words"):][:1200]  # (its passage on verbing, as written)
    ASK["input"] = "Explain this passage:\n" + entry


def timed(events):
    """(seconds to the first text delta, seconds to the end, the events, each one's arrival: time.time())."""
    t0, first, got, times = time.time(), None, [], []
    for e in events:
        now = time.time()
        if first is None and e.type == "response.output_text.delta":
            first = now - t0
        got.append(e)
        times.append(now)
    return first, time.time() - t0, got, times


work = pathlib.Path(tempfile.mkdtemp())
if REDIS:
    from cluster_util import Redis, replica
    redis = Redis(work / "redis").start()
    s, other = (replica(work / n, redis, n, "--durability", "none").start() for n in ("a", "b"))
else:
    s = other = Server(work, "--durability", "none").start()
try:
    client, follower_client = openai_client(s), openai_client(other)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    plain, background, log_bytes, lag = [], [], [], []
    for i in range(rounds):
        for kind in (("plain", "background") if i % 2 == 0 else ("background", "plain")):
            first, total, got, _ = timed(client.responses.create(stream=True, background=kind == "background", **ASK))
            (plain if kind == "plain" else background).append((first, total))
            if kind == "background":
                rid = got[0].response.id
                st, text, _ = s.request("GET", f"/v1/responses/{rid}?stream=true")  # its kept log, whole
                tokens = got[-1].response.usage.output_tokens
                log_bytes.append(len(text.encode()) / tokens)
    # followers beside the asking client: each event's arrival there less its arrival at the asker,
    # for the events generated after a follower had caught up (its first events are the log so far)
    followed_end = []
    for _ in range(rounds):
        it = iter(client.responses.create(stream=True, background=True, **ASK))
        t0 = time.time()  # (as timed() counts: from the stream's headers)
        rid, follower = next(it).response.id, {}
        ths = [threading.Thread(target=lambda k=k: follower.update(
            {k: timed(follower_client.responses.retrieve(rid, stream=True))})) for k in range(FOLLOWERS)]
        for th in ths:
            th.start()
        _, _, got, times = timed(it)
        followed_end.append(time.time() - t0)
        for th in ths:
            th.join()
        for _, _, fgot, ftimes in follower.values():
            caught_up = ftimes[0] + 0.05
            f_at = {e.sequence_number: t for e, t in zip(fgot, ftimes)}
            lag.extend(f_at[e.sequence_number] - t for e, t in zip(got, times)
                       if t > caught_up and e.sequence_number in f_at)
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    print(f"{rounds} rounds alternated, max_output_tokens {ASK['max_output_tokens']}"
          f"{', two replicas sharing Redis (the follower through the other one)' if REDIS else ''}:")
    print(f"  plain stream:      first delta {med(plain, 0) * 1e3:.1f} ms, end {med(plain, 1):.3f} s")
    print(f"  background stream: first delta {med(background, 0) * 1e3:.1f} ms, end {med(background, 1):.3f} s")
    print(f"  event log: {statistics.median(log_bytes):.0f} bytes per generated token (median)")
    print(f"  {FOLLOWERS} follower(s): the asker's end {statistics.median(followed_end):.3f} s; a follower's lag behind "
          f"the asker, per event once caught up: median {statistics.median(lag) * 1e3:.2f} ms, "
          f"95th percentile {sorted(lag)[int(len(lag) * 0.95)] * 1e3:.2f} ms")
finally:
    s.kill()
    if REDIS:
        other.kill()
        redis.stop()
