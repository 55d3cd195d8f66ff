"""The Redis session store, leases and fencing, against a real redis-server
and real replicas on loopback (cluster_util.py): a session survives its
replica's SIGKILL (another takes it over from the store), a paused replica's
late write is refused by the fencing token, a session held by a live replica
is answered 421 naming it and handed over when idle. The failover under
load through nginx is tests/cluster/failover.py (make test-cluster)."""
import json
import pathlib
import random
import signal
import string
import threading
import time

import pytest

from cluster_util import Redis, RedisProxy, SlowUpload, have_cluster_tools, replica
from conftest import FAULTFS, SANITIZED
from server_util import Server, metric

pytestmark = pytest.mark.skipif(not have_cluster_tools(), reason="redis-server/nginx not installed (make deps)")

DOC = ("The lighthouse keeper wrote in his log every night. " * 40).strip()
PARTS = [DOC[i:i + 400] for i in range(0, len(DOC), 400)]


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path / "redis").start()
    yield r
    r.stop()


def put(srv, sid, seq, text, final=False):
    return srv.request("POST", f"/v1/sessions/{sid}/chunks?seq={seq}&final={'true' if final else 'false'}",
                       raw=text.encode(), headers={"Content-Type": "text/plain"})


def until(fn, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def slowest_while(srv, thread, timeout=10):
    """The slowest GET /v1/models on srv while thread runs (then joined): how
    long the replica's loop held its other requests."""
    slowest, t0 = 0, time.time()
    while thread.is_alive() and time.time() - t0 < timeout:
        t1 = time.time()
        assert srv.request("GET", "/v1/models")[0] == 200
        slowest = max(slowest, time.time() - t1)
        time.sleep(0.1)
    thread.join()
    return slowest


def get_ready(srv, sid):
    """GET the session on srv, retrying while it is being taken over (409/421)."""
    def attempt():
        st, body, _ = srv.request("GET", f"/v1/sessions/{sid}")
        if st in (409, 421):
            return None
        assert st == 200, body
        return body if body["status"] == "ready" else None
    return until(attempt, what=f"{sid} ready on {srv.url}")


def answer(srv, sid):
    st, body, _ = srv.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "What did the keeper do every night?"}],
        "max_tokens": 12, "temperature": 0}, headers={"X-Session-Id": sid})
    assert st == 200, body
    return body["choices"][0]["message"]["content"]


def pot(body):
    return {k: body[k] for k in ("tokens_ingested", "tokens_in_pot", "compressions", "bytes_received",
                                 "last_seq", "final")}


def test_single_node_equals_redis_store_and_survives_sigkill(tmp_path, redis):
    """The same document through the dir store and the Redis store gives the
    same pot and answer; after SIGKILL of its replica, another replica takes
    the session over from Redis (snapshot + log) with nothing lost."""
    ref = replica(tmp_path / "ref", redis, "ref").start()
    ref.flags[ref.flags.index("--store") + 1] = "dir"
    ref.stop()
    ref.start()
    a = replica(tmp_path / "a", redis, "a", "--snapshot-bytes", "1K").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        sid_ref = ref.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        st, created, _ = a.request("POST", "/v1/sessions", {"budget_tokens": 96})
        assert st == 201, created
        sid = created["id"]
        assert redis.cli("HGET", f"potserve:s:{sid}:meta", "last_seq") == "0"
        for i, part in enumerate(PARTS, 1):
            assert put(ref, sid_ref, i, part, i == len(PARTS))[0] == 200
        half = len(PARTS) // 2
        for i, part in enumerate(PARTS[:half], 1):
            def upload():
                s, body, _ = put(a, sid, i, part)
                return s == 200 and body
            until(upload, what=f"chunk {i} on a")
        assert redis.cli("LLEN", f"potserve:s:{sid}:log") == str(half)
        # snapshot_bytes 1K: saved (after the answer, on the engine thread) and put into Redis
        until(lambda: redis.cli("EXISTS", f"potserve:s:{sid}:snap") == "1", what="the snapshot in Redis")
        a.kill()  # SIGKILL: its lease runs out after lease_ms
        t0 = time.time()
        for i in range(half + 1, len(PARTS) + 1):
            def upload():
                s, body, _ = put(b, sid, i, PARTS[i - 1], i == len(PARTS))
                assert s in (200, 409, 421), body
                return s == 200 and body
            until(upload, what=f"chunk {i} on b")
            if i == half + 1:
                print(f"\nfailover (SIGKILL -> first chunk accepted on b): {time.time() - t0:.2f} s")
        # a replayed chunk is recognised as a duplicate by the new owner
        s, body, _ = put(b, sid, half, PARTS[half - 1])
        assert s == 200 and body.get("duplicate") is True, body
        got, want = get_ready(b, sid), get_ready(ref, sid_ref)
        assert pot(got) == pot(want)
        assert answer(b, sid) == answer(ref, sid_ref)
        assert metric(b, "potserve_store_takeovers_total") == 1
        assert any(sid in line and "from its snapshot" in line for line in b.log_lines), b.log_lines
        assert b.stop() == 0 and ref.stop() == 0  # clean exits (ASan builds: no leak, no error)
    finally:
        a.kill()
        b.stop()
        ref.stop()


def test_deleted_session_is_gone_for_every_replica(tmp_path, redis):
    """DELETE on the replica holding the session removes its meta from Redis
    before the 200, so another replica (or this one after a SIGKILL) cannot
    take the session over again, even while an acknowledged chunk's ingest
    still holds its files (its other keys expire, should it die then)."""
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1 on a")  # 409 while a takes it up
        long = (DOC + " ") * 12  # seconds of ingest after its 202: the files stay that long
        st, body, _ = a.request("POST", f"/v1/sessions/{sid}/chunks?seq=2&wait=false", raw=long.encode(),
                                headers={"Content-Type": "text/plain"})
        assert st == 202, body
        st, body, _ = a.request("DELETE", f"/v1/sessions/{sid}")
        assert st == 200, body
        assert redis.cli("EXISTS", f"potserve:s:{sid}:meta") == "0"
        pttl = int(redis.cli("PTTL", f"potserve:s:{sid}:log"))
        assert pttl == -2 or 0 < pttl <= 3600_000, pttl  # gone (the ingest ended), or within the hour at worst
        a.kill()  # while the ingest still holds the files: the deletion holds
        st, body, _ = b.request("GET", f"/v1/sessions/{sid}")
        assert st == 404, body
    finally:
        a.kill()
        b.stop()


def test_paused_owner_is_fenced(tmp_path, redis):
    """A replica paused (SIGSTOP) in the middle of an upload loses its lease;
    another takes the session over; when the paused one wakes, its commit is
    refused by the lease's token (421) and the store holds only the new
    owner's chunk 2. (failover.py covers the case where the new owner has
    appended before, refused by the token and the log length both.)"""
    a = replica(tmp_path / "a", redis, "a", lease_ms=600).start()
    b = replica(tmp_path / "b", redis, "b", lease_ms=600).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1 on a")
        late = "stale text from the paused replica " * 20
        up = SlowUpload(a.port, sid, 2, late, first=100)
        time.sleep(0.5)
        a.proc.send_signal(signal.SIGSTOP)
        try:  # b takes the session over (appending nothing: only the lease's token can refuse a)
            get_ready(b, sid)
        finally:
            a.proc.send_signal(signal.SIGCONT)
        status, body = up.finish()
        assert status == 421, body
        assert body["error"]["code"] == "session_moved"
        assert metric(a, "potserve_store_fenced_writes_total") == 1
        assert redis.cli("LLEN", f"potserve:s:{sid}:log") == "1"
        until(lambda: put(b, sid, 2, PARTS[1])[0] == 200, what="chunk 2 on b")
        assert redis.cli("LLEN", f"potserve:s:{sid}:log") == "2"
        log = redis.cli("LRANGE", f"potserve:s:{sid}:log", "1", "1", raw=True)
        assert PARTS[1].encode() in log and b"stale text" not in log
        assert a.stop() == 0 and b.stop() == 0
    finally:
        a.proc.send_signal(signal.SIGCONT)
        a.stop()
        b.stop()


def test_live_owner_answers_421_then_hands_over(tmp_path, redis):
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1 on a")
        st, body, hdrs = b.request("GET", f"/v1/sessions/{sid}")
        assert st == 421, body
        assert body["error"]["code"] == "session_elsewhere" and "replica a" in body["error"]["message"]
        assert hdrs.get("Retry-After") == "1"
        assert hdrs.get("x-should-retry") == "true"  # OpenAI's clients retry a 421 only with it
        got = get_ready(b, sid)  # a hands it over at its next lease renewal
        assert got["last_seq"] == 1
        assert metric(a, "potserve_store_handoffs_total") == 1
        # the handed-over session's local scratch directory goes with it (one stayed per session)
        until(lambda: not list((tmp_path / "a" / "cache").iterdir()), what="a's scratch directories gone")
        # another key's request never reveals the session, held or not
        assert b.request("GET", "/v1/sessions/sess_doesnotexist1")[0] == 404
        assert a.stop() == 0 and b.stop() == 0
    finally:
        a.stop()
        b.stop()


def test_graceful_stop_gives_leases_up(tmp_path, redis):
    """SIGTERM: the last snapshot goes to Redis and the lease is released, so
    another replica takes the session at once instead of after lease_ms."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=60000).start()
    b = replica(tmp_path / "b", redis, "b", lease_ms=60000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0], final=True)[0] == 200, what="chunk 1 on a")
        assert redis.cli("EXISTS", f"potserve:s:{sid}:lease") == "1"
        assert a.stop() == 0
        assert redis.cli("EXISTS", f"potserve:s:{sid}:lease") == "0"
        assert redis.cli("EXISTS", f"potserve:s:{sid}:snap") == "1"
        t0 = time.time()
        assert get_ready(b, sid)["final"] is True
        assert time.time() - t0 < 10  # not the 60 s lease
        assert b.stop() == 0
        # a's scratch directory of the lease it gave up stayed (one per session and stop, for good):
        # a start clears what an earlier process left
        assert list((tmp_path / "a" / "cache").iterdir())
        a.start()
        assert not list((tmp_path / "a" / "cache").iterdir())
        assert a.stop() == 0
    finally:
        a.stop()
        b.stop()


def test_nginx_routes_each_session_to_one_replica(tmp_path, redis):
    """docker/nginx-cluster.conf's key: the id in the path, else X-Session-Id
    (the path's when both are sent).
    Requests of a session, by either, all reach one replica: it is taken over
    once and never handed over."""
    from cluster_util import Nginx
    reps = [replica(tmp_path / f"r{i}", redis, f"r{i}").start() for i in range(3)]
    nginx = Nginx(tmp_path / "nginx", [r.port for r in reps]).start()
    proxy = Server(tmp_path / "unused")
    proxy.port = nginx.port
    try:
        sids = [proxy.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"] for _ in range(4)]
        for sid in sids:
            get_ready(proxy, sid)
            for i in range(1, 4):
                assert put(proxy, sid, i, PARTS[i - 1])[0] == 200
            for _ in range(2):
                st, body, _ = proxy.request("POST", "/v1/completions", {"prompt": "The keeper", "max_tokens": 1},
                                            headers={"X-Session-Id": sid})
                assert st == 200, body
            # the path's id routes, whatever session a client's header still names
            for _ in range(6):
                other = "sess_" + "".join(random.choice(string.ascii_letters) for _ in range(24))
                st, body, _ = proxy.request("GET", f"/v1/sessions/{sid}", headers={"X-Session-Id": other})
                assert st == 200, body
        takeovers = sum(metric(r, "potserve_store_takeovers_total") for r in reps)
        handoffs = sum(metric(r, "potserve_store_handoffs_total") for r in reps)
        assert (takeovers, handoffs) == (len(sids), 0)
        for r in reps:
            assert r.stop() == 0
        # no replica left: nginx's own 502 is potserve's JSON error, to be retried
        st, body, headers = proxy.request("POST", f"/v1/sessions/{sids[0]}/chunks?seq=4", raw=b"more",
                                          headers={"Content-Type": "text/plain"})
        assert st == 502 and body["error"]["code"] == "replica_unavailable", body
        assert body["error"]["type"] == "unavailable_error" and headers.get("Retry-After") == "1", headers
    finally:
        nginx.stop()
        for r in reps:
            r.stop()


def test_nginx_answers_a_replica_that_does_not_answer_in_time_with_a_json_504(tmp_path, redis):
    """nginx's own 504 (no answer within proxy_read_timeout) was an HTML page; it is
    potserve's JSON error with Retry-After, as its 502 is (the test above)."""
    from cluster_util import Nginx
    rep = replica(tmp_path / "r", redis, "r").start()
    nginx = Nginx(tmp_path / "nginx", [rep.port], read_timeout_s=1).start()
    proxy = Server(tmp_path / "unused")
    proxy.port = nginx.port
    try:
        assert proxy.request("GET", "/v1/models")[0] == 200
        rep.proc.send_signal(signal.SIGSTOP)  # its socket still takes the connection; nothing answers
        st, body, headers = proxy.request("GET", "/v1/models", timeout=30)
        assert st == 504 and body["error"]["code"] == "replica_timeout", body
        assert body["error"]["type"] == "unavailable_error" and headers.get("Retry-After") == "1", headers
    finally:
        rep.proc.send_signal(signal.SIGCONT)
        nginx.stop()
        rep.stop()


def test_bad_store_spec_is_refused(tmp_path):
    from conftest import run
    for spec, why in (("mysql://x", "neither dir nor redis"), ("redis://127.0.0.1:1/0", "redis 127.0.0.1:1")):
        p = run("serve", "--store", spec, "--data-dir", tmp_path, "--port", "0")
        assert p.returncode != 0 and why in p.stderr.decode(), p.stderr


def text_of(srv, sid):
    """The session's whole document (final: every token read), read back through /text."""
    st, body, _ = srv.request("GET", f"/v1/sessions/{sid}/text?start=0&end=8192")
    assert st == 200, body
    assert body["end"] == body["tokens_ingested"]  # the documents here are shorter than one request
    return "".join(span["text"] for span in body["spans"])


def test_a_redis_restart_costs_no_request(tmp_path, redis):
    """After Redis restarts (AOF: nothing lost), each thread's connection is
    stale; the first command on it failed (a chunk 500, a create 503), now it
    is sent again on a new connection."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=3000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1 on a")
        redis.stop()
        redis.start()
        assert put(a, sid, 2, PARTS[1], final=True)[0] == 200
        for _ in range(6):  # the thread pool's threads, each with its own connection
            st, body, _ = a.request("POST", "/v1/sessions", {"budget_tokens": 96})
            assert st == 201 and body["status"] == "ready", body  # it said "ingesting"
        assert text_of(a, sid) == PARTS[0] + PARTS[1]
        assert a.stop() == 0
    finally:
        a.stop()


def test_a_chunk_or_delete_redis_cannot_take_is_a_503_to_retry(tmp_path, redis):
    """Redis down (connection refused) or loading: a chunk's commit and a
    delete were 500 storage_error without Retry-After, though nothing was
    written. Now 503 store_unavailable with Retry-After, and the same seq goes
    through once Redis is back."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=20000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1 on a")
        redis.stop()
        try:
            st, body, hdrs = put(a, sid, 2, PARTS[1])
            assert st == 503 and body["error"]["code"] == "store_unavailable", body
            assert hdrs.get("Retry-After") == "1"
            def delete():  # (409 while the pot is put back as it was before the failed chunk)
                got = a.request("DELETE", f"/v1/sessions/{sid}")
                return None if got[0] == 409 else got
            st, body, hdrs = until(delete, what="the delete past session_busy")
            assert st == 503 and body["error"]["code"] == "store_unavailable", body
            assert hdrs.get("Retry-After") == "1"
        finally:
            redis.start()
        st, body, _ = put(a, sid, 2, PARTS[1])
        assert st == 200 and body["last_seq"] == 2 and not body.get("duplicate"), body
        assert a.request("DELETE", f"/v1/sessions/{sid}")[0] == 200
        assert a.stop() == 0
    finally:
        a.stop()


def test_a_delete_waiting_for_redis_holds_up_no_other_request(tmp_path, redis):
    """DELETE marks the session deleted in Redis before its 200: that was asked
    on the loop, so a stalled Redis held every request 2 s. Now from the
    thread pool; the delete ends with an error to retry, and then succeeds."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=20000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1 on a")
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            results = {}
            deleter = threading.Thread(target=lambda: results.update(d=a.request("DELETE", f"/v1/sessions/{sid}")))
            deleter.start()
            time.sleep(0.2)
            assert slowest_while(a, deleter) < 0.5
            st, body, _ = results["d"]
            assert st in (500, 503) and body["error"]["code"] in ("storage_error", "store_unavailable"), body
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert until(lambda: a.request("DELETE", f"/v1/sessions/{sid}")[0] in (200, 404), what="the delete")
        assert a.request("GET", f"/v1/sessions/{sid}")[0] == 404
        assert a.stop() == 0
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        a.stop()


def test_a_takeover_redis_stops_answering_is_let_go_not_failed(tmp_path, redis):
    """Redis stalls while a replica replays a session it took over: the replay
    stops, the lease is released, and the next request takes the session
    over again; it was failed for good under a lease the replica kept."""
    a = replica(tmp_path / "a", redis, "a", "--snapshot-bytes", "1G", lease_ms=800).start()
    b = replica(tmp_path / "b", redis, "b", "--threads", "1", lease_ms=12000).start()  # outlasts the stall
    parts = [f"Entry {i}: the keeper noted the wind from the {['north', 'east', 'south', 'west'][i % 4]}, "
             f"the swell at {i % 7 + 1} feet and the lamp lit at {18 + i % 3} o'clock. " * 4 for i in range(48)]
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        for i, part in enumerate(parts, 1):
            until(lambda: put(a, sid, i, part, final=i == len(parts))[0] == 200, what=f"chunk {i} on a")
        a.kill()
        until(lambda: b.request("GET", f"/v1/sessions/{sid}")[0] == 409, what="b taking the session over")
        # b's next reads get no answer: the snapshot's (if it is still to come) and the log's after it,
        # each given up after 2 s; the lease is then given back from the thread pool, where it held
        # b's loop (every request) for another 2 s
        redis.proc.send_signal(signal.SIGSTOP)
        stall = threading.Thread(target=time.sleep, args=(6,))
        stall.start()
        assert slowest_while(b, stall) < 0.5
        redis.proc.send_signal(signal.SIGCONT)
        got = get_ready(b, sid)
        assert got["last_seq"] == len(parts) and got["status"] == "ready"
        assert text_of(b, sid) == "".join(parts)
        b.wait_log("takeover stopped, the store did not answer", timeout=1)
        assert b.stop() == 0
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        a.kill()
        b.stop()


def test_a_replica_cut_off_from_redis_stops_serving_when_its_lease_lapses(tmp_path, redis):
    """Without an answered renewal for the lease's length another replica may
    hold the session: this one stops serving it (it answered from its stale
    pot, 200, for as long as Redis was away) and says so in its log."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=1200).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1 on a")
        t_stop = time.time()
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            # renewals wait for Redis on the thread pool: the loop (and every request) did, 2 s at a time
            slowest = 0
            while time.time() - t_stop < 2.5:
                t0 = time.time()
                assert a.request("GET", "/v1/models")[0] == 200
                slowest = max(slowest, time.time() - t0)
                time.sleep(0.1)
            assert slowest < 0.5, slowest
            st, body, hdrs = a.request("GET", f"/v1/sessions/{sid}")
            assert st == 503 and body["error"]["code"] == "store_unavailable", body
            assert hdrs.get("Retry-After") == "1"
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert get_ready(a, sid)["last_seq"] == 1
        a.wait_log("the store does not answer lease renewals", timeout=1)
        a.wait_log("the store answers lease renewals again", timeout=5)
        assert a.stop() == 0
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        a.stop()


def test_a_takeover_answers_every_request_alike(tmp_path, redis):
    """While a replica replayed a session it took over, only the request that started the takeover
    heard 409 session_busy with Retry-After: every other one got a 409 without it (OpenAI's clients
    gave up at once), saying an upload was under way, and GET said "ingesting"."""
    long_doc = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()[:24000]  # seconds to replay
    a = replica(tmp_path / "a", redis, "a", "--threads", "1").start()
    b = replica(tmp_path / "b", redis, "b", "--threads", "1").start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 256})[1]["id"]
        until(lambda: put(a, sid, 1, long_doc)[0] == 200, timeout=120, what="the document on a")
        a.kill()  # no snapshot: b replays the log
        time.sleep(1.2)  # a's lease lapses
        st, body, hdrs = b.request("GET", f"/v1/sessions/{sid}")  # starts the takeover
        assert st == 409 and hdrs.get("Retry-After") == "1", (st, body)
        asks = {"GET": ("GET", f"/v1/sessions/{sid}", None), "text": ("GET", f"/v1/sessions/{sid}/text?start=0&end=8", None),
                "chunk": ("POST", f"/v1/sessions/{sid}/chunks?seq=2", None),
                "chat": ("POST", "/v1/chat/completions", {"session": sid, "max_tokens": 2,
                                                          "messages": [{"role": "user", "content": "Hi?"}]}),
                "DELETE": ("DELETE", f"/v1/sessions/{sid}", None)}
        seen, replaying = set(), True
        while replaying:
            listed = {x["id"]: x["status"] for x in b.request("GET", "/v1/sessions")[1]["data"]}
            for name, (method, path, body) in asks.items():
                extra = {"raw": b"More. ", "headers": {"Content-Type": "text/plain"}} if name == "chunk" else {}
                st, got, hdrs = b.request(method, path, body, **extra)
                if st == 200 and seen:  # the replay ended (a DELETE then deletes it)
                    replaying, ended_by = False, name
                    break
                assert st == 409 and got["error"]["code"] == "session_busy", (name, st, got)
                assert hdrs.get("Retry-After") == "1" and "restored" in got["error"]["message"], (name, got, hdrs)
                assert listed.get(sid) == "restoring", listed
                seen.add(name)
        assert len(seen) == len(asks), f"the replay ended before every kind of request was asked ({seen}): lengthen it"
        if ended_by != "DELETE":
            assert get_ready(b, sid)["bytes_received"] >= len(long_doc.encode())
        assert b.stop() == 0
    finally:
        a.kill()
        b.stop()


def test_a_session_that_expired_with_its_replica_down_is_gone_not_taken_over(tmp_path, redis):
    """A session whose time ran out while its replica was down (or stalled) was taken over by the
    next replica asked and read again, answering 409s, before a 404; its keys stayed in Redis."""
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        short = a.request("POST", "/v1/sessions", {"budget_tokens": 96, "ttl_seconds": 2})[1]
        until(lambda: put(a, short["id"], 1, PARTS[0])[0] == 200, what="the short-lived one on a")
        a.kill()
        until(lambda: time.time() > short["expires_at"] + 1.2, what="its expiry and a's lease")
        for method, path in (("GET", f"/v1/sessions/{short['id']}"), ("GET", f"/v1/sessions/{short['id']}/text"),
                             ("POST", f"/v1/sessions/{short['id']}/chunks?seq=2")):
            st, body, _ = b.request(method, path, raw=b"x" if method == "POST" else None,
                                    headers={"Content-Type": "text/plain"})
            assert st == 404 and body["error"]["code"] == "session_not_found", (path, st, body)
        assert not redis.cli("KEYS", f"potserve:s:{short['id']}:*"), "its keys stayed in Redis"
        assert metric(b, "potserve_store_takeovers_total") == 0
        assert b.stop() == 0
    finally:
        a.kill()
        b.stop()


def test_a_stopping_replica_writes_its_snapshots_under_lease(tmp_path, redis):
    """SIGTERM queued every session's snapshot on the engine and stopped the loop, so leases were
    no longer renewed: snapshots still being written once a lease lapsed (a busy engine, large
    pots) were refused FENCED, and the next owner replayed the whole log. The loop now runs on
    until the last snapshot is written. Each snapshot on its way (data_dir/cache) is held 400 ms
    by tests/fault/faultfs.c, so the stop's 8 take over 3 s, well past the 1 s lease: without
    renewals they fail on any machine, and a renewal that comes a few hundred ms late on a
    loaded one fails nothing (a 300 ms lease did: make test on 2 busy cores)."""
    slow = {} if SANITIZED else {  # (ASan must come first in a process: the sanitized run goes without)
        "LD_PRELOAD": str(FAULTFS), "FAULT_DIR": str((tmp_path / "a").resolve()), "FAULT_CLASS": "rename",
        "FAULT_AT": "1", "FAULT_STICKY": "1", "FAULT_MODE": "delay", "FAULT_DELAY_MS": "400"}
    a = replica(tmp_path / "a", redis, "a", "--snapshot-seconds", "0", "--snapshot-bytes", "1G", env=slow).start()
    try:
        ids = []
        for i in range(8):
            ids.append(a.request("POST", "/v1/sessions", {})[1]["id"])
            until(lambda: put(a, ids[-1], 1, DOC)[0] == 200, what="a chunk")
        assert not [sid for sid in ids if redis.cli("STRLEN", f"potserve:s:{sid}:snap") not in ("", "0")]
        t0 = time.time()
        assert a.stop() == 0, "\n".join(a.log_lines[-60:])
        assert SANITIZED or time.time() - t0 > 3, "the snapshots were not held: is faultfs.so preloaded?"
        assert not [line for line in a.log_lines if "snapshot failed" in line], a.log_lines
        sizes = [int(redis.cli("STRLEN", f"potserve:s:{sid}:snap") or 0) for sid in ids]
        assert all(n > 0 for n in sizes), sizes
    finally:
        a.stop()


def test_a_new_sessions_first_request_waits_for_its_takeover(tmp_path, redis):
    """A session made through one replica is taken over by the first that is asked for it; that
    request was answered 409 session_busy while the (empty) log was replayed, so a first upload
    with curl, which does not retry a 409, failed. A new session's first request to a session
    route now waits for the takeover (moments) and is answered as if the session had been there:
    an upload with curl -T (a small file, and one of 2 MB that curl sends with Expect:
    100-continue), a GET, and questions (chat, completions, responses) naming it by header or
    body."""
    import subprocess
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        small, large = tmp_path / "small.txt", tmp_path / "large.txt"
        small.write_text(DOC)
        large.write_text((DOC + "\n") * ((2 << 20) // len(DOC)) + DOC)
        for doc in (small, large):
            sid = a.request("POST", "/v1/sessions", {})[1]["id"]
            out = subprocess.run(["curl", "-sS", "--fail-with-body", "-T", str(doc), "-H", "Content-Type: text/plain",
                                  f"{b.url}/v1/sessions/{sid}/chunks?wait=false"], capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0, (out.stdout, out.stderr)
            took = json.loads(out.stdout)
            assert took["chunk"]["seq"] == 1 and took["chunk"]["bytes"] == doc.stat().st_size, took
            b.wait_log(f"took session {sid} over")
            assert b.request("DELETE", f"/v1/sessions/{sid}")[0] == 200  # (its ingest would take minutes)
        sid = a.request("POST", "/v1/sessions", {})[1]["id"]
        st, body, _ = b.request("GET", f"/v1/sessions/{sid}")
        assert st == 200 and body["status"] == "ready" and body["last_seq"] == 0, body
        ask = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        for path, body, headers in [("/v1/chat/completions", ask, "header"), ("/v1/chat/completions", ask, "body"),
                                    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, "header"),
                                    ("/v1/responses", {"model": "x", "input": "Hi", "max_output_tokens": 16}, "body")]:
            sid = a.request("POST", "/v1/sessions", {})[1]["id"]
            named = {"headers": {"X-Session-Id": sid}} if headers == "header" else {}
            st, got, _ = b.request("POST", path, body if named else dict(body, session=sid), **named)
            assert st == 200 and got["session"] == sid, (path, headers, st, got)
        sid = a.request("POST", "/v1/sessions", {})[1]["id"]  # (a body that is wrong: answered once it is taken)
        st, got, _ = b.request("POST", "/v1/chat/completions", dict(ask, temperature=9), headers={"X-Session-Id": sid})
        assert st == 400 and got["error"]["param"] == "temperature", got
    finally:
        a.stop()
        b.stop()


def test_large_bodies_let_no_lease_lapse(tmp_path, redis):
    """Six 8 MB bodies at once held the loop up to 1.3 s (each parsed there, a Responses body up
    to four times) and filled libuv's pool (each tokenized there for seconds), so renewals, which
    need both, came too late and a lease of 1 s lapsed (tests/bench/large_bodies.py --lease-ms
    1000: in every run). Bodies are parsed once, off the loop, and such work takes at most half of
    the pool: the renewals come every lease_ms / 3."""
    import json
    import urllib.request
    a = replica(tmp_path / "a", redis, "a", "--durability", "none", lease_ms=1000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {})[1]["id"]
        until(lambda: put(a, sid, 1, DOC)[0] == 200, what="a chunk (the lease taken)")
        text = "".join(f"Line {k}: the quick brown fox jumps over the lazy dog. " for k in range(150_000))  # 8 MB
        bodies = [json.dumps({"model": "x", "input": f"{i} {text}"}).encode() for i in range(6)]
        answers, lowest, work = [], [], []

        def send(body):
            req = urllib.request.Request(a.url + "/v1/responses/input_tokens", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                answers.append(urllib.request.urlopen(req, timeout=120).status)
            except urllib.error.HTTPError as e:
                answers.append(e.code)
        senders = [threading.Thread(target=send, args=(b,)) for b in bodies]
        for t in senders:
            t.start()
        while any(t.is_alive() for t in senders):
            lowest.append(int(redis.cli("PTTL", f"potserve:s:{sid}:lease")))
            work.append((metric(a, "potserve_input_work_running"), metric(a, "potserve_input_work_waiting")))
            time.sleep(0.02)
        assert answers == [400] * 6  # (longer than the window, once tokenized)
        assert min(lowest) > 0, sorted(lowest)[:5]  # (-2: the lease gone)
        assert max(r for r, _ in work) == 2 and max(w for _, w in work) >= 2, work  # (half of libuv's 4 threads)
        assert (metric(a, "potserve_input_work_running"), metric(a, "potserve_input_work_waiting")) == (0, 0)
        assert not [line for line in a.log_lines if "dropping it here" in line]
        assert get_ready(a, sid)["last_seq"] == 1
    finally:
        a.stop()


def test_a_takeover_waiting_for_redis_holds_up_no_other_request(tmp_path, redis):
    """A takeover asks Redis for the session's meta, its lease and its log:
    with Redis stalled, each question waited 2 s on the loop, and every
    request of every client with it. Now they are asked from the thread pool;
    a second request for the same session meanwhile is told to retry (409),
    and the takeover ends with a clear 503 and succeeds once Redis answers."""
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0], final=True)[0] == 200, what="chunk 1 on a")
        assert a.stop() == 0  # its lease released: free for b to take
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            results = {}
            asker = threading.Thread(target=lambda: results.update(first=b.request("GET", f"/v1/sessions/{sid}")))
            asker.start()
            time.sleep(0.3)
            st, body, hdrs = b.request("GET", f"/v1/sessions/{sid}")
            assert st == 409 and body["error"]["code"] == "session_busy", body
            assert hdrs.get("Retry-After") == "1"
            assert slowest_while(b, asker) < 0.5
            st, body, hdrs = results["first"]
            assert st == 503 and body["error"]["code"] == "store_unavailable", body
            assert hdrs.get("Retry-After") == "1"
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert get_ready(b, sid)["last_seq"] == 1
        assert text_of(b, sid) == PARTS[0]
        assert metric(b, "potserve_store_takeovers_total") == 1
        assert b.stop() == 0
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        a.stop()
        b.stop()


def test_recall_auto_answers_from_the_pot_when_redis_does_not_answer(tmp_path, redis):
    """The passages come from the log in Redis: with Redis stalled, a question
    with the default recall ("auto") was a 500 recall_failed, though the
    replica holds the session's pot. It is answered from the pot alone;
    `"recall": true` still says it failed."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=15000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        for i, part in enumerate(PARTS, 1):
            until(lambda: put(a, sid, i, part, i == len(PARTS))[0] == 200, what=f"chunk {i}")
        assert get_ready(a, sid)["compressions"] > 0  # the pot dropped text: "auto" recalls
        ask = {"messages": [{"role": "user", "content": "What did the keeper do every night?"}], "max_tokens": 8,
               "temperature": 0}
        st, body, _ = a.request("POST", "/v1/chat/completions", ask, headers={"X-Session-Id": sid})
        assert st == 200 and "recall" in body, body
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            st, body, _ = a.request("POST", "/v1/chat/completions", ask, headers={"X-Session-Id": sid})
            assert st == 200 and "recall" not in body and body["choices"][0]["message"]["content"], body
            st, events, _ = a.request("POST", "/v1/chat/completions", dict(ask, stream=True),
                                      headers={"X-Session-Id": sid})
            assert st == 200 and ": recall failed" in events and '"content"' in events, events
            assert events.rstrip().endswith("data: [DONE]"), events
            st, body, _ = a.request("POST", "/v1/chat/completions", dict(ask, recall=True),
                                    headers={"X-Session-Id": sid})
            assert st == 500 and body["error"]["code"] == "recall_failed", body
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        a.wait_log("recall failed", timeout=1)
        assert a.stop() == 0
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        a.stop()


def test_a_commit_redis_does_not_answer_is_given_up_and_a_resend_is_a_duplicate(tmp_path, redis):
    """Redis stalls past the commit's timeout and then runs it: the chunk was
    answered 500 though committed, and the replica's view lagged the store.
    Now: 421 saying the chunk may be committed, the replica gives the session
    up, and the same chunk re-sent with its seq is a duplicate."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=10000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1 on a")
        up = SlowUpload(a.port, sid, 2, PARTS[1], final=True, first=100)
        time.sleep(0.3)
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            status, body = up.finish()
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert status == 421 and body["error"]["code"] == "session_moved", body
        assert "may have been made" in body["error"]["message"]
        def resend():
            st, b2, _ = put(a, sid, 2, PARTS[1], final=True)
            return b2 if st == 200 else None
        again = until(resend, what="chunk 2 re-sent")
        assert again["duplicate"] is True and again["last_seq"] == 2
        assert text_of(a, sid) == PARTS[0] + PARTS[1]
        assert a.stop() == 0
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        a.stop()


def test_redis_url_with_a_password(tmp_path, redis):
    from conftest import run
    redis.cli("CONFIG", "SET", "requirepass", "s3cret@:/x")  # what a URL's own separators are
    url = f"redis://:s3cret@:/x@127.0.0.1:{redis.port}/0"
    a = Server(tmp_path / "a", "--store", url, "--replica-name", "a", "--access-log", "false").start()
    try:
        st, body, _ = a.request("POST", "/v1/sessions", {"budget_tokens": 96})
        assert st == 201, body
        assert a.stop() == 0
        assert not any("s3cret" in line for line in a.log_lines)  # the log names the store without it
        a.wait_log(f"sessions in redis://(password)@127.0.0.1:{redis.port}/0", timeout=1)
    finally:
        a.stop()
    for spec, why in ((f"redis://:wrong@127.0.0.1:{redis.port}/0", "AUTH failed"),
                      (f"redis://127.0.0.1:{redis.port}/0", "NOAUTH"),
                      (f"redis://127.0.0.1:{redis.port}/ 1", "bad db"),
                      (f"redis://:@127.0.0.1:{redis.port}/0", "empty password")):
        p = run("serve", "--store", spec, "--data-dir", tmp_path / "b", "--port", "0")
        err = p.stderr.decode()
        assert p.returncode != 0 and why in err and "wrong" not in err, err


def test_stored_responses_are_every_replicas(tmp_path, redis):
    """With the Redis store a stored /v1/responses answer is in Redis before the client has it, so
    a chain whose requests reach other replicas goes on (previous_response_id, item_reference,
    GET, input_items, DELETE, conversations), other keys still do not see it, and the entries of
    all replicas together stay within response_store_bytes (the least recently used dropped first)."""
    import openai
    from server_util import openai_client
    keys = tmp_path / "keys"
    keys.write_text("key-one-0123456789 one\nkey-two-0123456789 two\n")
    flags = ("--api-keys-file", keys, "--response-store-bytes", "12K")
    a = replica(tmp_path / "a", redis, "a", *flags).start()
    b = replica(tmp_path / "b", redis, "b", *flags).start()
    try:
        on_a, on_b = (openai_client(s, "key-one-0123456789") for s in (a, b))
        first = on_a.responses.create(model="x", input="My name is Ada. Say hi.", max_output_tokens=12, temperature=0)
        assert first.store is True and redis.cli("EXISTS", f"potserve:r:{first.id}") == "1"
        second = on_b.responses.create(model="x", previous_response_id=first.id, input="What is my name?",
                                       max_output_tokens=12, temperature=0)
        whole = on_a.responses.create(model="x", max_output_tokens=12, temperature=0, store=False, input=[
            {"role": "user", "content": "My name is Ada. Say hi."}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"}])
        assert (second.usage.input_tokens, second.output_text) == (whole.usage.input_tokens, whole.output_text)
        assert on_b.responses.retrieve(first.id).output_text == first.output_text
        assert [i.id for i in on_a.responses.input_items.list(second.id)][1] == first.output[0].id
        by_ref = on_b.responses.create(model="x", max_output_tokens=12, temperature=0, input=[
            {"role": "user", "content": "My name is Ada. Say hi."}, {"type": "item_reference", "id": first.output[0].id},
            {"role": "user", "content": "What is my name?"}])
        assert by_ref.usage.input_tokens == whole.usage.input_tokens
        two = openai_client(b, "key-two-0123456789")
        with pytest.raises(openai.NotFoundError):
            two.responses.retrieve(first.id)
        st, body, _ = b.request("DELETE", f"/v1/responses/{first.id}", headers={"Authorization": "Bearer key-one-0123456789"})
        assert st == 200 and body["deleted"] is True
        with pytest.raises(openai.NotFoundError):
            on_a.responses.retrieve(first.id)
        assert redis.cli("EXISTS", f"potserve:r:{first.id}") == "0"
        assert redis.cli("HGET", "potserve:r:item", first.output[0].id) in ("", by_ref.id)  # (by_ref lists it too)
        # a conversation made on one replica goes on on the other, and its items follow
        conv = on_a.conversations.create(items=[{"role": "user", "content": "My name is Ada."}])
        asked = on_b.responses.create(model="x", conversation=conv.id, input="What is my name?", max_output_tokens=8)
        assert [i.id for i in on_a.conversations.items.list(conv.id, order="asc")][1:] == \
            [on_b.conversations.items.list(conv.id, order="asc").data[1].id, asked.output[0].id]
        assert on_b.conversations.delete(conv.id).deleted
        with pytest.raises(openai.NotFoundError):
            on_a.conversations.retrieve(conv.id)
        # both replicas' entries share the budget: the oldest go, the total stays within it
        made = [(on_a if i % 2 else on_b).responses.create(model="x", input=f"Count to {i}.", max_output_tokens=4)
                for i in range(16)]
        total = int(redis.cli("GET", "potserve:r:bytes"))
        sizes = [int(redis.cli("STRLEN", f"potserve:r:{k}")) for k in redis.cli("ZRANGE", "potserve:r:lru", 0, -1).split()]
        assert total == sum(sizes) <= 12 * 1024, (total, sizes)
        kept = [redis.cli("EXISTS", f"potserve:r:{r.id}") == "1" for r in made]
        assert kept[-1] and not kept[0] and kept == sorted(kept), kept  # the newest kept, the oldest gone
        # Redis down: what needs it is a 503 to retry, not a 404
        redis.stop()
        with pytest.raises(openai.InternalServerError) as ei:
            on_b.responses.retrieve(made[-1].id)
        assert ei.value.status_code == 503 and ei.value.body["code"] == "store_unavailable"
        st, body, _ = a.request("POST", "/v1/responses", {"input": "Hi", "max_output_tokens": 2},
                                headers={"Authorization": "Bearer key-one-0123456789"})
        assert st == 200 and body["store"] is False, body  # answered, and says it was not kept
    finally:
        a.stop()
        b.stop()


def test_a_conversation_added_to_from_two_replicas_at_once_keeps_every_item(tmp_path, redis):
    """Items added to one conversation through both replicas at the same moment are all kept: an
    addition is written only while Redis still holds the conversation as it was read, else read
    again (without that check, one replica's write replaced what the other had just added)."""
    from server_util import openai_client
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        clients = [openai_client(s) for s in (a, b)]
        conv = clients[0].conversations.create(items=[{"role": "user", "content": "start"}])
        errors = []

        def add(n, client):
            try:
                for k in range(12):
                    client.conversations.items.create(conv.id, items=[{"role": "user", "content": f"w{n} i{k}"}])
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(repr(e))

        workers = [threading.Thread(target=add, args=(n, clients[n % 2])) for n in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors, errors
        texts = [i.content[0].text for i in clients[1].conversations.items.list(conv.id, order="asc", limit=100)]
        assert len(texts) == 1 + 4 * 12, len(texts)
        for n in range(4):  # each writer's items, in the order it added them
            assert [t for t in texts if t.startswith(f"w{n} ")] == [f"w{n} i{k}" for k in range(12)]
    finally:
        a.stop()
        b.stop()


def test_a_background_response_is_polled_and_cancelled_through_any_replica(tmp_path, redis):
    """A background response made on one replica is polled on the other (queued until its answer
    is in Redis, then that answer); cancelled through the replica not running it, it stays
    cancelled, and the running replica stops generating it at its next run-mark renewal (its
    answer, had it ended, would not replace the cancel)."""
    from server_util import background_ended, background_running, openai_client
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        on_a, on_b = (openai_client(s) for s in (a, b))
        ask = dict(model="x", input="Name three colours.", max_output_tokens=16, temperature=0)
        made = on_a.responses.create(background=True, **ask)
        got, _ = background_ended(on_b, made.id)
        assert got.output_text == on_b.responses.create(**ask).output_text
        assert redis.cli("EXISTS", f"potserve:r:{made.id}:run") == "0"  # its answer's write took the mark
        # streamed on a: b, without its events, streams it again from the stored answer once it ended
        # (one running on a: b's stream waits for its end)
        running = on_a.responses.create(background=True, model="x", input="Count from 1 to 3000, separated by commas.",
                                        max_output_tokens=200, temperature=0)
        waited = list(on_b.responses.retrieve(running.id, stream=True))
        assert waited[-1].response.model_dump() == on_b.responses.retrieve(running.id).model_dump()
        assert waited[-1].type == "response.incomplete"
        events = list(on_a.responses.create(background=True, stream=True, **ask))
        replay = list(on_b.responses.retrieve(events[0].response.id, stream=True))
        assert replay[-1].response.model_dump() == events[-1].response.model_dump()
        assert "".join(e.delta for e in replay if e.type == "response.output_text.delta") == got.output_text
        long = background_running(on_a)  # 3,000 tokens: a minute or more here
        assert redis.cli("EXISTS", f"potserve:r:{long.id}:run") == "1"
        assert on_b.responses.cancel(long.id).status == "cancelled"
        t0 = time.time()
        while metric(a, "potserve_answers_running") != 0:  # stopped on a within a renewal (lease_ms/3)
            assert time.time() - t0 < 5, "the replica running it never stopped"
            time.sleep(0.1)
        a.wait_log("was cancelled through another replica", timeout=5)
        time.sleep(0.5)
        for client in (on_a, on_b):
            kept = client.responses.retrieve(long.id)
            assert kept.status == "cancelled" and kept.output == [], kept
    finally:
        a.stop()
        b.stop()


def test_health_and_metrics_say_whether_the_store_answers(tmp_path, redis):
    """A replica's /health and /metrics say whether Redis answers (asked with the lease renewals,
    or a PING when it holds no session): "store": "unavailable" and potserve_store_up 0 while it
    does not, "ok" and 1 again once it does. /health stays 200 (a probe failing on every replica
    at once would restart them all, and none starts without Redis: docs/cluster.md)."""
    a = replica(tmp_path / "a", redis, "a").start()

    def state():
        st, body, _ = a.request("GET", "/health")
        assert st == 200 and body["status"] == "ok", body
        return body["store"], metric(a, "potserve_store_up")

    try:
        assert state() == ("ok", 1)
        redis.stop()
        t0 = time.time()
        while state() != ("unavailable", 0):
            assert time.time() - t0 < 10, "the store's outage never showed"
            time.sleep(0.1)
        redis.start()
        t0 = time.time()
        while state() != ("ok", 1):
            assert time.time() - t0 < 10, "the store's return never showed"
            time.sleep(0.1)
    finally:
        a.stop()


def test_a_background_response_a_stopping_replica_cannot_finish_ends_failed(tmp_path, redis):
    """A replica stopped (SIGTERM) while its background response runs past shutdown_grace stops
    it and stores it as failed, with what it had generated and an error saying to ask again,
    before it exits: it was left queued in Redis, and its client polled for ever."""
    from server_util import background_running, openai_client
    a = replica(tmp_path / "a", redis, "a", "--shutdown-grace", "1").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        on_a, on_b = openai_client(a), openai_client(b)
        long = background_running(on_a)
        assert a.stop(timeout=90) == 0
        ended = on_b.responses.retrieve(long.id)
        assert ended.status == "failed" and ended.error.code == "server_error", ended
        assert "ask again" in ended.error.message and ended.output_text, ended
    finally:
        a.stop()
        b.stop()


def test_a_background_response_whose_replica_dies_ends_failed(tmp_path, redis):
    """A replica killed (SIGKILL) while its background response runs can store nothing; its run
    mark lapses after lease_ms, and a poll through another replica then finds the response
    unfinished with no replica running it and stores it as failed (before, it stayed queued in
    Redis and its client polled for ever). A response still running is not failed by polls; a
    stream of it through the other replica, waiting for its end, ends with response.failed."""
    from server_util import background_running, openai_client
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        on_a, on_b = openai_client(a), openai_client(b)
        long = background_running(on_a)
        time.sleep(2.5)  # beyond lease_ms (1 s): renewed meanwhile, so still running for b
        assert on_b.responses.retrieve(long.id).status == "queued"
        waiting = []  # a stream of it through b waits for its end (it has no events there)
        follower = threading.Thread(target=lambda: waiting.extend(on_b.responses.retrieve(long.id, stream=True)))
        follower.start()
        time.sleep(1)
        assert metric(b, "potserve_background_streams_waiting") == 1 and metric(a, "potserve_background_running") == 1
        a.kill()
        t0 = time.time()
        follower.join(timeout=15)  # (no poll meanwhile: the stream finds the runner gone itself)
        assert not follower.is_alive() and waiting[-1].type == "response.failed", waiting[-1:]
        assert "ask again" in waiting[-1].response.error.message and metric(b, "potserve_background_streams_waiting") == 0
        assert 0.5 < time.time() - t0, "failed before its run mark could lapse"
        assert redis.cli("GET", f"potserve:r:{long.id}").count('"queued"') == 1  # (a stream stores nothing)
        t0 = time.time()
        while (got := on_b.responses.retrieve(long.id)).status == "queued":
            assert time.time() - t0 < 10, "no poll found its runner gone"
            time.sleep(0.2)
        assert got.status == "failed" and got.error.code == "server_error" and "ask again" in got.error.message, got
        assert on_b.responses.retrieve(long.id).status == "failed"  # stored so
        assert redis.cli("GET", f"potserve:r:{long.id}").count('"failed"') == 1
    finally:
        a.stop()
        b.stop()


def test_a_streamed_background_response_is_followed_live_through_any_replica(tmp_path, redis):
    """A streamed background response's events are shipped to Redis as they are written, so a
    stream of it through the replica not running it gets the same events with the same numbers
    while they are generated (not the stored answer's replay once it has ended); a resume there
    with starting_after continues the asking client's numbering; the events count in the
    stored responses' bytes and go with the response; a stream of events whose last ones never
    came (the answer stored) ends with the answer's end after a grace; a follower whose runner
    dies ends with response.failed numbered after the last event it had."""
    from server_util import openai_client
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        on_a, on_b = openai_client(a), openai_client(b)
        ask = dict(model="x", input="Count from 1 to 3000, separated by commas.", temperature=0)
        asked = on_a.responses.create(background=True, stream=True, max_output_tokens=300, **ask)
        first = next(iter(asked))
        rid = first.response.id
        followed = []  # (arrival time, event) through b, from the start
        follower = threading.Thread(
            target=lambda: followed.extend((time.time(), e) for e in on_b.responses.retrieve(rid, stream=True)))
        follower.start()
        timed = [(time.time(), first)] + [(time.time(), e) for e in asked]  # the asking client, through a
        events = [e for _, e in timed]
        follower.join(timeout=30)
        assert not follower.is_alive()
        dump = lambda evs: [e.model_dump() for e in evs]
        assert dump(e for _, e in followed) == dump(events)  # the same events, numbered alike
        spread = lambda timed: (lambda ts: ts[-1] - ts[0])([t for t, e in timed if e.type == "response.output_text.delta"])
        assert spread(followed) > 0.5 * spread(timed), "b's stream was not live"  # (a replay: all at once)
        # a resume through b after event N: the rest of the asking client's events
        n = events[len(events) // 2].sequence_number
        resumed = list(on_b.responses.retrieve(rid, stream=True, starting_after=n))
        assert dump(resumed) == dump(events[n + 1:])
        assert redis.cli("EXISTS", f"potserve:r:{rid}:events:end") == "1"
        size = lambda k: int(redis.cli("STRLEN", k))
        keys = [k for k in redis.cli("KEYS", "potserve:r:resp_*").split() if not k.endswith((":items", ":end"))]
        assert int(redis.cli("GET", "potserve:r:bytes")) == sum(size(k) for k in keys)  # events counted
        # its last events lost after its answer was stored (a replica dying between the two writes):
        # a stream through b ends after a grace (5 s) with the stored answer's end, numbered on
        whole = redis.cli("GET", f"potserve:r:{rid}:events", raw=True)[:-1]  # (less redis-cli's newline)
        cut = whole.index(b"event: response.output_text.done")
        redis.cli("SET", f"potserve:r:{rid}:events", whole[:cut].decode())
        redis.cli("DEL", f"potserve:r:{rid}:events:end")
        t0 = time.time()
        short = list(on_b.responses.retrieve(rid, stream=True))
        assert 4.5 < time.time() - t0 < 15
        ends = [e for e in events if e.type.startswith("response.output_text.done")]
        assert dump(short[:-1]) == dump(events[:ends[0].sequence_number])
        assert short[-1].type == events[-1].type and short[-1].sequence_number == ends[0].sequence_number
        assert short[-1].response.model_dump() == events[-1].response.model_dump()
        redis.cli("SET", f"potserve:r:{rid}:events", whole.decode())
        on_b.responses.delete(rid)
        assert redis.cli("EXISTS", f"potserve:r:{rid}:events") == "0"
        assert int(redis.cli("GET", "potserve:r:bytes")) == sum(size(k) for k in keys if rid not in k)
        # its runner killed while b follows it: response.failed, numbered on
        long = on_a.responses.create(background=True, stream=True, max_output_tokens=3000, **ask)
        lid = next(iter(long)).response.id
        seen = []
        follower = threading.Thread(target=lambda: seen.extend(on_b.responses.retrieve(lid, stream=True)))
        follower.start()
        t0 = time.time()
        while sum(e.type == "response.output_text.delta" for e in list(seen)) < 20:
            assert time.time() - t0 < 30, "b's stream got no text"
            time.sleep(0.05)
        assert metric(b, "potserve_background_streams_waiting") == 1  # (following Redis's copy)
        a.kill()
        follower.join(timeout=15)
        assert not follower.is_alive() and seen[-1].type == "response.failed", seen[-1:]
        assert [e.sequence_number for e in seen] == list(range(len(seen)))
        assert "ask again" in seen[-1].response.error.message
        until(lambda: metric(b, "potserve_background_streams_waiting") == 0, what="b's stream gone")
    finally:
        a.stop()
        b.stop()


def test_a_redis_restart_costs_a_streamed_background_response_no_event(tmp_path, redis):
    """Redis restarting while a streamed background response runs: the appends of its events
    the store did not take are tried again (each at the offset it was meant for, so one whose
    answer was lost is not appended twice), and a stream of it through the other replica,
    which cannot read meanwhile, gets every event of the asking client's, in order."""
    from server_util import openai_client
    a = replica(tmp_path / "a", redis, "a", lease_ms=5000).start()
    b = replica(tmp_path / "b", redis, "b", lease_ms=5000).start()
    try:
        on_a, on_b = openai_client(a), openai_client(b)
        asked = on_a.responses.create(background=True, stream=True, model="x", temperature=0, max_output_tokens=1500,
                                      input="Count from 1 to 3000, separated by commas.")
        events = [next(iter(asked))]
        asker = threading.Thread(target=lambda: events.extend(asked))
        asker.start()
        followed = []
        follower = threading.Thread(
            target=lambda: followed.extend(on_b.responses.retrieve(events[0].response.id, stream=True)))
        follower.start()
        until(lambda: sum(e.type == "response.output_text.delta" for e in list(followed)) > 20, what="b's text")
        redis.stop()
        time.sleep(1.5)
        redis.start()
        asker.join(timeout=60)
        follower.join(timeout=60)
        assert not asker.is_alive() and not follower.is_alive()
        assert events[-1].type in ("response.completed", "response.incomplete"), events[-1]
        assert [e.model_dump() for e in followed] == [e.model_dump() for e in events]
        a.wait_log("the store did not take its events", timeout=1)
    finally:
        a.stop()
        b.stop()


FILE_TEXT = pathlib.Path("/usr/share/common-licenses/Apache-2.0").read_text()[:3000]
FILE_SETTINGS = {"budget_tokens": 256}


def file_question(client, fid, **kw):
    return client.chat.completions.create(model="x", max_tokens=8, temperature=0, messages=[{"role": "user", "content": [
        {"type": "file", "file": {"file_id": fid}}, {"type": "text", "text": "What is this text about?"}]}],
        **kw).choices[0].message.content


def upload_file(client, tmp_path, text=FILE_TEXT):
    p = tmp_path / "notes.txt"
    p.write_text(text)
    with open(p, "rb") as fh:
        return client.files.create(file=fh, purpose="user_data", extra_body={"settings": json.dumps(FILE_SETTINGS)})


def test_a_file_is_every_replicas(tmp_path, redis):
    """OpenAI's Files API with --store redis (it answered 501): the replica a file is uploaded to
    takes its new session and reads it; any replica lists it and retrieves it from the store
    (status "processed" once the reader's snapshot is there), a question or its content takes it
    over as any session is, nginx routes /v1/files/file-{id} as session sess_{id}, another key sees
    nothing, and a delete leaves nothing in Redis. The answers (chat, and Responses' input_file
    on the replica it is taken back to) are the ones a single server gives."""
    import openai
    from cluster_util import Nginx
    from server_util import openai_client
    keys = tmp_path / "keys"
    keys.write_text("key-one-0123456789 one\nkey-two-0123456789 two\n")
    a = replica(tmp_path / "a", redis, "a", "--api-keys-file", keys).start()
    b = replica(tmp_path / "b", redis, "b", "--api-keys-file", keys).start()
    nginx = Nginx(tmp_path / "nginx", [a.port, b.port]).start()
    single = Server(tmp_path / "single").start()
    try:
        on_a, on_b = (openai_client(s, "key-one-0123456789") for s in (a, b))
        f = upload_file(on_a, tmp_path)
        assert f.bytes == len(FILE_TEXT.encode()) and f.filename == "notes.txt"
        a.wait_log(f"took session {f.session} over")
        g = on_b.files.wait_for_processing(f.id, poll_interval=0.2, max_wait_seconds=120)  # b: from the store
        assert (g.status, g.bytes, g.created_at, g.filename, g.purpose) == ("processed", f.bytes, f.created_at,
                                                                           "notes.txt", "user_data")
        assert on_a.files.retrieve(f.id).to_dict() == g.to_dict()  # held here, read there: alike
        assert [x.to_dict() for x in on_b.files.list()] == [g.to_dict()]
        assert [x.id for x in on_a.files.list(purpose="user_data")] == [f.id] and not on_a.files.list(purpose="batch").data
        other = openai_client(b, "key-two-0123456789")
        assert not other.files.list().data
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(f.id)
        s1 = openai_client(single)
        f1 = s1.files.wait_for_processing(upload_file(s1, tmp_path).id, poll_interval=0.2)
        expected = file_question(s1, f1.id)

        def responses_question(client, fid):
            return client.responses.create(model="x", max_output_tokens=16, temperature=0, input=[{"role": "user", "content": [
                {"type": "input_file", "file_id": fid}, {"type": "input_text", "text": "What is this text about?"}]}]).output_text
        expected_responses = responses_question(s1, f1.id)
        # asked on b: taken over from a (421 until a hands it over, then 409 while b loads it: the client retries)
        retrying = openai.OpenAI(base_url=b.url + "/v1", api_key="key-one-0123456789", max_retries=10, timeout=120)
        assert file_question(retrying, f.id) == expected
        # and through the Responses API on a: taken back from b
        back = openai.OpenAI(base_url=a.url + "/v1", api_key="key-one-0123456789", max_retries=10, timeout=120)
        assert responses_question(back, f.id) == expected_responses

        def moves():  # (the logs: /metrics wants a key here)
            return sum(1 for r in (a, b) for line in r.log_lines
                       if f"took session {f.session} over" in line or f"handing session {f.session} over" in line)
        assert moves() >= 5  # taken by a for the upload, handed over to b, and back to a
        # through nginx: the file's routes reach one replica, the question too with X-Session-Id
        via = openai.OpenAI(base_url=nginx.url + "/v1", api_key="key-one-0123456789", max_retries=10, timeout=120)
        assert via.files.content(f.id).text == FILE_TEXT
        moved = moves()
        for _ in range(4):
            assert via.files.content(f.id).text == FILE_TEXT
            assert via.files.retrieve(f.id).status == "processed"
        assert file_question(via, f.id, extra_headers={"X-Session-Id": f.session}) == expected
        assert moves() == moved, "the file's requests went to more than one replica"
        assert via.files.delete(f.id).deleted
        for c in (on_a, on_b):
            assert not c.files.list().data
            with pytest.raises(openai.NotFoundError):
                c.files.retrieve(f.id)
        assert redis.cli("EXISTS", f"potserve:s:{f.session}:meta") == "0"
        assert [redis.cli("SCARD", k) for k in redis.cli("KEYS", "potserve:owner:*").split()] in ([], ["0"])
        for r in (a, b):
            assert r.stop() == 0
    finally:
        nginx.stop()
        single.stop()
        a.stop()
        b.stop()


def test_a_file_whose_replica_died_while_reading_it_is_not_listed_and_goes(tmp_path, redis):
    """A file upload cut by its replica's death leaves its session in Redis with a log that never
    ended: it is no file (not listed, 404), and once it has been unleased for ten minutes since its
    creation a listing removes it. (Its creation is moved back in the store rather than waited for.)"""
    import socket
    from server_util import openai_client
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        on_b = openai_client(b)
        boundary = "pOtSeRvEbOuNdArY"
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nuser_data\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"cut.txt\"\r\n\r\n").encode()
        s = socket.create_connection(("127.0.0.1", a.port))
        s.sendall(f"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
                  f"Content-Length: 9000000\r\n\r\n".encode() + head + FILE_TEXT.encode())
        line = a.wait_log("took session ")
        sid = line.split("took session ")[1].split()[0]
        assert not on_b.files.list().data  # being read: not a file yet
        a.kill()
        s.close()
        until(lambda: redis.cli("EXISTS", f"potserve:s:{sid}:lease") == "0", what="a's lease to lapse")
        assert not on_b.files.list().data
        st, body, _ = b.request("GET", f"/v1/files/file-{sid[5:]}")
        assert st == 404 and body["error"]["code"] == "file_not_found", body
        files = redis.cli("KEYS", "potserve:owner:*").split()
        assert redis.cli("SMEMBERS", files[0]) == sid  # kept while it may still be a new file's
        meta = json.loads(redis.cli("HGET", f"potserve:s:{sid}:meta", "json"))
        meta["created"] -= 601
        redis.cli("HSET", f"potserve:s:{sid}:meta", "json", json.dumps(meta))
        assert not on_b.files.list().data
        assert redis.cli("KEYS", f"potserve:s:{sid}:*") == "" and redis.cli("SCARD", files[0]) == "0"
        assert b.stop() == 0
    finally:
        a.kill()
        b.stop()


def test_every_replica_lists_every_session_of_its_key(tmp_path, redis):
    """GET /v1/sessions listed only the sessions the answering replica held, so the page through
    nginx showed a different list at each poll. Every replica now lists all of a key's sessions
    from Redis: those it holds as before, the others as their meta says, "status": "stored"."""
    import jsonschema
    api = json.loads((pathlib.Path(__file__).resolve().parents[2] / "api" / "openapi.json").read_text())
    keys = tmp_path / "keys"
    keys.write_text("key-one-0123456789 one\nkey-two-0123456789 two\n")
    one, two = ({"Authorization": f"Bearer key-{k}-0123456789"} for k in ("one", "two"))
    a = replica(tmp_path / "a", redis, "a", "--api-keys-file", keys).start()
    b = replica(tmp_path / "b", redis, "b", "--api-keys-file", keys).start()
    try:
        sids = {}
        for name, rep in (("a", a), ("b", b)):
            sid = rep.request("POST", "/v1/sessions", {"budget_tokens": 96, "ttl_seconds": 3600, "reread": True,
                                                       "recall": False, "metadata": {"t": name}},
                              headers=one)[1]["id"]
            st, body, _ = rep.request("POST", f"/v1/sessions/{sid}/chunks?seq=1", raw=PARTS[0].encode(),
                                      headers=dict(one, **{"Content-Type": "text/plain"}))
            assert st == 200, body
            sids[name] = sid
        for rep, mine, other in ((a, "a", "b"), (b, "b", "a")):
            st, body, _ = rep.request("GET", "/v1/sessions", headers=one)
            assert st == 200 and sorted(s["id"] for s in body["data"]) == sorted(sids.values()), body
            got = {s["id"]: s for s in body["data"]}
            held, stored = got[sids[mine]], got[sids[other]]
            assert held["status"] == "ready" and held["tokens_ingested"] > 0
            assert stored["status"] == "stored" and "tokens_ingested" not in stored, stored
            # every field but what only the pot knows, as the replica holding it shows it (made alike, a
            # chunk each, but their titles): whole_words and chunk_tokens (defaults), reread and recall
            # were missing when not set, and settings a session does not show (nuc_share) were listed
            pot_only = {"status", "tokens_ingested", "tokens_in_pot", "compressions", "memory_bytes", "pinned_tokens",
                        "ring_entries", "id", "created", "metadata", "expires_at"}
            assert {k: v for k, v in stored.items() if k not in pot_only} == \
                {k: v for k, v in held.items() if k not in pot_only}, (stored, held)
            assert stored["metadata"] == {"t": other} and stored["reread"] is True and stored["recall"] is False
            assert (stored["bytes_received"], stored["last_seq"], stored["final"]) == (len(PARTS[0]), 1, False)
            assert stored["expires_at"] == stored["created"] + 3600
            for one_of in body["data"]:  # both kinds keep api/openapi.json's Session
                jsonschema.validate(one_of, {"$ref": "#/components/schemas/Session", "components": api["components"]})
        assert b.request("GET", "/v1/sessions", headers=two)[1]["data"] == []
        assert b.request("DELETE", f"/v1/sessions/{sids['b']}", headers=one)[0] == 200
        assert [s["id"] for s in a.request("GET", "/v1/sessions", headers=one)[1]["data"]] == [sids["a"]]
        assert a.stop() == 0 and b.stop() == 0
    finally:
        a.stop()
        b.stop()


def test_a_paged_out_session_is_read_back_from_redis_and_handed_over(tmp_path, redis):
    """Paging in a cluster (docs/api.md, "Pot memory and paging"): a replica whose memory holds two
    pots pages the least recently used out to its snapshot in Redis, reads it back from there for a
    question, and hands a paged-out session over as any idle one, its memory counted once."""
    tight = ("--budget-tokens", "256", "--prompt-cache-bytes", "0", "--pot-memory-limit", "14M")
    a = replica(tmp_path / "a", redis, "a", *tight).start()
    b = replica(tmp_path / "b", redis, "b", *tight).start()
    try:
        ids = []
        for i in range(2):
            ids.append(a.request("POST", "/v1/sessions", {})[1]["id"])
            until(lambda: put(a, ids[i], 1, PARTS[i], final=True)[0] == 200, what=f"session {i} on a")
        said = [answer(a, sid) for sid in ids]  # 0 is the least recently used now
        ids.append(a.request("POST", "/v1/sessions", {})[1]["id"])
        until(lambda: put(a, ids[2], 1, PARTS[2], final=True)[0] == 200, what="session 2 on a")
        assert a.request("GET", f"/v1/sessions/{ids[0]}")[1]["status"] == "stored"
        assert answer(a, ids[0]) == said[0]  # read back from Redis's snapshot; 1 goes out for it
        assert a.request("GET", f"/v1/sessions/{ids[1]}")[1]["status"] == "stored"
        until(lambda: b.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "What did the keeper do every night?"}],
            "max_tokens": 12, "temperature": 0}, headers={"X-Session-Id": ids[1]})[0] == 200, what="1 on b (a 421 until a hands it over)")
        assert answer(b, ids[1]) == said[1]
        assert metric(a, "potserve_store_handoffs_total") == 1
        assert metric(a, "potserve_sessions") == 2 and metric(a, "potserve_sessions_paged_out") == 0
        assert metric(a, "potserve_pot_memory_bytes") == 2 * a.request("GET", f"/v1/sessions/{ids[0]}")[1]["memory_bytes"]
        assert a.stop() == 0 and b.stop() == 0
    finally:
        a.stop()
        b.stop()


TIGHT = ("--budget-tokens", "256", "--prompt-cache-bytes", "0", "--pot-memory-limit", "14M")  # two pots fit
ASK = {"messages": [{"role": "user", "content": "What did the keeper do every night?"}], "max_tokens": 12,
       "temperature": 0}


def two_pots(srv):
    """Two sessions read whole on srv: its memory is full."""
    ids = []
    for i in range(2):
        ids.append(srv.request("POST", "/v1/sessions", {})[1]["id"])
        until(lambda: put(srv, ids[i], 1, PARTS[i], final=True)[0] == 200, what=f"session {i}")
    return ids


def test_a_question_that_takes_its_session_over_in_its_own_lookup_is_answered(tmp_path, redis):
    """/v1/responses continuing a stored response names its session only through it, so the
    question's own lookup takes the session over (not the route's first step); the question
    waited for that takeover and then ran on a session it had not been given: the replica died
    (SIGSEGV). Found by review."""
    a = replica(tmp_path / "a", redis, "a").start()
    b = None
    try:
        sid = a.request("POST", "/v1/sessions", {})[1]["id"]  # empty: its takeover makes the request wait
        st, first, _ = a.request("POST", "/v1/responses", {"input": "Say hi.", "max_output_tokens": 4, "session": sid})
        assert st == 200, first
        assert a.stop() == 0  # its leases are given up
        b = replica(tmp_path / "b", redis, "b").start()
        st, body, _ = b.request("POST", "/v1/responses", {"input": "Again.", "max_output_tokens": 4,
                                                         "previous_response_id": first["id"]}, timeout=60)
        assert st == 200 and body["output"][0]["content"][0]["text"], body
        assert metric(b, "potserve_store_takeovers_total") == 1
        assert b.stop() == 0
    finally:
        a.stop()
        if b:
            b.stop()


def test_a_page_in_redis_does_not_answer_leaves_the_session_paged_out(tmp_path, redis):
    """A page-in that Redis does not answer failed the session for good (409 session_failed, its
    pot's memory counted until it was deleted); the session is whole in Redis, so now the question
    is a 503 to retry, the session stays paged out, and it answers once Redis is back."""
    a = replica(tmp_path / "a", redis, "a", *TIGHT, lease_ms=20000).start()
    try:
        ids = two_pots(a)
        said = answer(a, ids[0])  # 1 is the least recently used
        ids.append(a.request("POST", "/v1/sessions", {})[1]["id"])
        until(lambda: put(a, ids[2], 1, PARTS[2], final=True)[0] == 200, what="session 2")
        assert a.request("GET", f"/v1/sessions/{ids[0]}")[1]["status"] == "ready"
        assert a.request("GET", f"/v1/sessions/{ids[1]}")[1]["status"] == "stored"
        memory = metric(a, "potserve_pot_memory_bytes")
        redis.stop()
        st, body, h = a.request("POST", "/v1/chat/completions", ASK, headers={"X-Session-Id": ids[1]})
        assert st == 503 and body["error"]["code"] == "store_unavailable", body
        assert h.get("Retry-After") == "1"
        assert a.request("GET", f"/v1/sessions/{ids[1]}")[1]["status"] == "stored"
        # another pot went out to make room for it; the failed one's is not counted
        pot_bytes = a.request("GET", f"/v1/sessions/{ids[1]}")[1]["memory_bytes"]
        assert metric(a, "potserve_pot_memory_bytes") == memory - pot_bytes
        assert metric(a, "potserve_sessions_paged_out") == 2
        assert metric(a, "potserve_page_in_failures_total") == 1 and metric(a, "potserve_page_ins_total") == 0
        redis.start()
        until(lambda: a.request("POST", "/v1/chat/completions", ASK, headers={"X-Session-Id": ids[1]})[0] == 200,
              what="the question once Redis is back")
        assert a.request("GET", f"/v1/sessions/{ids[1]}")[1]["status"] == "ready"
        assert answer(a, ids[0]) == said
    finally:
        a.stop()


def test_creating_a_session_in_a_cluster_pages_nothing_out(tmp_path, redis):
    """A replica writes a new session to Redis only (the replica its requests reach takes it
    over): it paged one of its own idle pots out for it, for nothing."""
    a = replica(tmp_path / "a", redis, "a", *TIGHT).start()
    try:
        ids = two_pots(a)
        st, body, _ = a.request("POST", "/v1/sessions", {})
        assert st == 201, body
        assert metric(a, "potserve_page_outs_total") == 0
        assert [a.request("GET", f"/v1/sessions/{i}")[1]["status"] for i in ids] == ["ready", "ready"]
    finally:
        a.stop()


def test_pots_page_out_while_a_lease_renewal_round_waits_for_redis(tmp_path, redis):
    """A renewal round holds every session while Redis answers it, which made every pot look
    busy: while Redis stalled, a request that needed room got 429 though the pots were idle."""
    a = replica(tmp_path / "a", redis, "a", *TIGHT, lease_ms=6000).start()
    try:
        two_pots(a)
        emb = {"model": "m", "input": ["word " * 300]}  # a temporary pot of its own
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(2.2)  # a renewal round (every lease_ms / 3) is out, waiting for Redis
            st, body, _ = a.request("POST", "/v1/embeddings", emb)
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert st == 200, str(body)[:300]
        assert metric(a, "potserve_page_outs_total") == 1
    finally:
        a.stop()


def test_a_question_to_a_paged_session_being_deleted_is_a_409_not_a_page_in(tmp_path, redis):
    """While a paged-out session's deletion waited for Redis, a question read its pot back, and
    the page-in's end marked the session no longer busy under the deletion (an upload could then
    be taken by a session whose deletion was answered 200). Now the question waits its turn."""
    a = replica(tmp_path / "a", redis, "a", *TIGHT, lease_ms=20000).start()
    try:
        ids = two_pots(a)
        ids.append(a.request("POST", "/v1/sessions", {})[1]["id"])
        until(lambda: put(a, ids[2], 1, PARTS[2], final=True)[0] == 200, what="session 2")
        paged = next(i for i in ids if a.request("GET", f"/v1/sessions/{i}")[1]["status"] == "stored")
        deleted = {}
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            t = threading.Thread(target=lambda: deleted.update(st=a.request("DELETE", f"/v1/sessions/{paged}")[0]))
            t.start()
            time.sleep(0.5)  # the deletion waits for Redis
            st, body, _ = a.request("POST", "/v1/chat/completions", ASK, headers={"X-Session-Id": paged})
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        t.join()
        assert st == 409 and body["error"]["code"] == "session_busy", body
        assert metric(a, "potserve_page_ins_total") == 0
        assert deleted["st"] in (200, 503), deleted
        if deleted["st"] == 503:  # Redis stopped for longer than a command waits: the client retries
            until(lambda: a.request("DELETE", f"/v1/sessions/{paged}")[0] == 200, what="the deletion")
        assert a.request("POST", "/v1/chat/completions", ASK, headers={"X-Session-Id": paged})[0] == 404
    finally:
        a.stop()


# ---- found by reviewing the store (docs/reliability.md, "Found by reviewing the store") ----

def test_a_deletion_redis_runs_late_is_a_503_and_no_chunk_is_acknowledged_after_it(tmp_path, redis):
    """A DELETE whose answer Redis did not send in time was a 500, the session went on here, Redis
    then ran the deletion, and the next chunk was answered 200 into a session no replica could
    find again: an acknowledged chunk lost. Now the deletion is a 503 to retry (it runs twice
    alike), and a commit into a deleted session is refused."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=4000).start()
    b = replica(tmp_path / "b", redis, "b", lease_ms=4000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1")
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            st, body, h = a.request("DELETE", f"/v1/sessions/{sid}")
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert st == 503 and body["error"]["code"] == "store_unavailable" and h.get("Retry-After"), (st, body)
        time.sleep(0.5)  # Redis has run the deletion it was sent
        st, body, _ = put(a, sid, 2, PARTS[1])
        assert st == 404 and body["error"]["code"] == "session_not_found", (st, body)
        assert redis.cli("LLEN", f"potserve:s:{sid}:log") == "1"
        assert a.request("DELETE", f"/v1/sessions/{sid}")[0] == 404  # the client's retry: it is gone
        assert b.request("GET", f"/v1/sessions/{sid}")[0] == 404
    finally:
        a.stop()
        b.stop()


def test_a_redis_restart_lets_no_lease_lapse(tmp_path, redis):
    """Lease renewals are pipelined; a pipeline on a connection Redis closed (a restart) was not
    sent again, as single commands are, so each pool thread's next round failed once and the
    rounds in a row on different threads let the lease lapse: the session was dropped and taken
    over again (409 session_busy meanwhile, an upload under way refused)."""
    a = replica(tmp_path / "a", redis, "a", lease_ms=3000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1")
        time.sleep(6)  # every pool thread has renewed once: each holds a connection
        redis.stop()
        redis.start()
        time.sleep(6)
        st, body, _ = a.request("GET", f"/v1/sessions/{sid}")
        assert st == 200 and body["status"] == "ready", (st, body)
        assert not [line for line in a.log_lines if "dropping it here" in line]
    finally:
        a.stop()


def test_a_rebuild_redis_does_not_answer_lets_the_session_go_not_fail(tmp_path, redis):
    """A chunk Redis did not take is a 503 to retry; its pieces had reached the pot, and with no
    room for a copy from before it the pot is read again from Redis. When Redis did not answer
    that either, the session was failed for good (every retry 409 session_failed) though Redis
    held it whole. Now it is let go, and the retry takes it over again and succeeds."""
    one_pot = ("--budget-tokens", "256", "--prompt-cache-bytes", "0", "--pot-memory-limit", "10M")
    a = replica(tmp_path / "a", redis, "a", *one_pot, lease_ms=20000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1")
        redis.stop()
        st, body, _ = put(a, sid, 2, PARTS[1])
        assert st == 503, (st, body)
        time.sleep(1.5)  # the rebuild has failed to read Redis
        redis.start()
        until(lambda: put(a, sid, 2, PARTS[1])[0] == 200, what="chunk 2 once Redis is back")
        assert redis.cli("LLEN", f"potserve:s:{sid}:log") == "2"
        assert a.request("GET", f"/v1/sessions/{sid}")[1]["last_seq"] == 2
    finally:
        a.stop()


def test_a_takeover_whose_log_read_gets_no_answer_is_a_503(tmp_path, redis):
    """The log's index read of a takeover unanswered (the meta and lease were): a 500 with no
    Retry-After, where a Redis that does not answer is a 503 to retry everywhere else."""
    px = RedisProxy(redis)
    a = replica(tmp_path / "a", px, "a", lease_ms=3000).start()
    b = replica(tmp_path / "b", px, "b", lease_ms=3000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1")
        a.kill()
        time.sleep(3.5)  # its lease lapses
        px.stall = f"potserve:s:{sid}:idx".encode()
        st, body, h = b.request("GET", f"/v1/sessions/{sid}")
        assert px.hits == ["stall"]
        assert st == 503 and body["error"]["code"] == "store_unavailable" and h.get("Retry-After"), (st, body)
        until(lambda: b.request("GET", f"/v1/sessions/{sid}")[0] == 200, what="the retry")
    finally:
        a.kill()
        b.stop()


def test_a_commit_redis_ran_but_did_not_answer_is_never_a_503_not_taken(tmp_path, redis):
    """A commit Redis ran whose answer was lost with the connection (Redis died), sent again on
    a new connection that Redis, starting, answered LOADING: that said "not run", so the chunk
    was a 503 "the store did not take the chunk" while Redis held it (a client re-sending it
    without a seq appended it twice). Now it is the 421 that says it may have been committed:
    re-send with its seq, answered as a duplicate."""
    px = RedisProxy(redis, loading_s=1.0)
    a = replica(tmp_path / "a", px, "a", lease_ms=20000, env={"UV_THREADPOOL_SIZE": "1"}).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1")
        px.cut = b"CONFLICT"  # (the commit script's text)
        st, body, _ = put(a, sid, 2, PARTS[1])
        assert "cut" in px.hits and redis.cli("LLEN", f"potserve:s:{sid}:log") == "2"
        assert st == 421 and body["error"]["code"] == "session_moved", (st, body)
        time.sleep(1.2)  # Redis "loaded"
        until(lambda: put(a, sid, 2, PARTS[1])[0] in (200, 409), what="chunk 2 re-sent with its seq")
        assert redis.cli("LLEN", f"potserve:s:{sid}:log") == "2"
    finally:
        a.stop()


def test_reading_a_sessions_text_while_redis_is_down_is_a_503(tmp_path, redis):
    a = replica(tmp_path / "a", redis, "a", lease_ms=20000).start()
    try:
        sid = a.request("POST", "/v1/sessions", {"budget_tokens": 96})[1]["id"]
        until(lambda: put(a, sid, 1, PARTS[0])[0] == 200, what="chunk 1")
        redis.stop()
        st, body, h = a.request("GET", f"/v1/sessions/{sid}/text?start=0&end=50")
        redis.start()
        assert st == 503 and body["error"]["code"] == "store_unavailable" and h.get("Retry-After"), (st, body)
        assert a.request("GET", f"/v1/sessions/{sid}/text?start=0&end=50")[0] == 200
    finally:
        a.stop()


def test_a_streamed_background_response_cancelled_through_another_replica_ends_cancelled(tmp_path, redis):
    """Cancelled through the replica not running it, the asking client's stream ended with
    response.failed ("replaced through another replica"), its events in Redis too, while every
    retrieve said cancelled. Now it ends as a cancel on one server does, and its conversation gets
    no turn of it. Found by review."""
    from server_util import openai_client
    a = replica(tmp_path / "a", redis, "a").start()
    b = replica(tmp_path / "b", redis, "b").start()
    try:
        on_a, on_b = (openai_client(s) for s in (a, b))
        conv = on_a.conversations.create()
        stream = iter(on_a.responses.create(model="x", input="Count from 1 to 3000, separated by commas.",
                                            background=True, stream=True, conversation=conv.id,
                                            max_output_tokens=3000, temperature=0))
        rid = next(stream).response.id
        time.sleep(0.5)
        assert on_b.responses.cancel(rid).status == "cancelled"
        events = list(stream)
        assert events[-1].type != "response.failed" and events[-1].response.status == "cancelled", events[-1]
        replay = list(on_b.responses.retrieve(rid, stream=True))
        assert replay[-1].type == events[-1].type
        assert on_a.responses.retrieve(rid).status == on_b.responses.retrieve(rid).status == "cancelled"
        time.sleep(0.5)
        assert on_b.conversations.items.list(conv.id).data == []
    finally:
        a.stop()
        b.stop()
