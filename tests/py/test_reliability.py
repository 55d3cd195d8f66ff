"""Reliability regressions (issue 21): uploads that fail part-way are always
answered and leave the session usable, a client hanging up after a 202 does
not fail the session, slow headers are cut at a deadline, a full disk is a
507, and the HTTP edge answers malformed framing in the API's JSON. Raw
sockets where TCP segment boundaries or half-sent requests matter; every
test runs against a real `potserve serve` process on loopback."""
import json
import os
import re
import resource
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import SANITIZED
from server_util import Server, metric

SETTINGS = {"budget_tokens": 64, "keep_tokens": 32, "chunk_tokens": 16}


def text(n_sentences, seed=0):
    words = ["river", "bridge", "market", "archive", "harbor", "lantern", "meadow", "orchard"]
    return " ".join(f"Sentence {i + seed} speaks of the {words[(i + seed) % 8]} and the {words[(i * 3) % 8]}."
                    for i in range(n_sentences)) + "\n"


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model):
    # 4 connections per address: uploads that leak their connection lock it out quickly
    s = Server(tmp_path_factory.mktemp("rel"), "--budget-tokens", "64", "--max-connections-per-ip", "4",
               "--durability", "none").start()
    yield s
    assert s.stop() == 0


def new_session(s):
    st, body, _ = s.request("POST", "/v1/sessions", SETTINGS)
    assert st == 201, body
    return body["id"]


def upload(s, sid, data, query="", headers=None, timeout=30):
    h = {"Content-Type": "text/plain"}
    h.update(headers or {})
    return s.request("POST", f"/v1/sessions/{sid}/chunks{query}", raw=data, headers=h, timeout=timeout)


def session(s, sid):
    st, body, _ = s.request("GET", f"/v1/sessions/{sid}")
    assert st == 200, body
    return body


def wait_ready(s, sid, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        now = session(s, sid)
        if now["status"] != "ingesting":
            return now
        time.sleep(0.1)
    raise AssertionError(f"session {sid} still ingesting after {timeout} s")


def raw_request(port, head, segments, timeout=15, gap=0.3):
    """Sends head, then each segment as its own TCP segment (a pause between,
    TCP_NODELAY); returns (status, parsed body or bytes, seconds)."""
    c = socket.create_connection(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.settimeout(timeout)
    t0 = time.time()
    c.sendall(head)
    for seg in segments:
        time.sleep(gap)
        c.sendall(seg)
    out = b""
    try:
        while b"\r\n\r\n" not in out or len(out.split(b"\r\n\r\n", 1)[1]) < content_length(out):
            k = c.recv(65536)
            if not k:
                break
            out += k
    except socket.timeout:
        pass
    finally:
        c.close()
    took = time.time() - t0
    if not out:
        return None, b"", took
    status = int(out.split(b" ", 2)[1])
    body = out.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in out else b""
    try:
        return status, json.loads(body), took
    except ValueError:
        return status, body, took


def content_length(out):
    for line in out.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 1 << 30


def chunk_head(port, sid, n, query=""):
    return (f"POST /v1/sessions/{sid}/chunks{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {n}\r\n\r\n").encode()


# ---- item 1: a failing chunk is always answered, and the session stays usable -----------------------

def test_incomplete_utf8_at_the_end_is_answered(srv):
    sid = new_session(srv)
    st, body, _ = upload(srv, sid, b"abc \xe2\x82", timeout=10)
    assert st == 400 and body["error"]["code"] == "invalid_utf8", body
    assert wait_ready(srv, sid, 10)["status"] == "ready"
    st, body, _ = upload(srv, sid, b"Hello world. ", timeout=30)
    assert st == 200 and body["last_seq"] == 1, body


def test_a_chunk_refused_while_its_body_is_read_is_answered_at_once(srv):
    """docs/api.md: a failed chunk is answered as soon as its body has been
    read. It used to wait for libmicrohttpd's next timer (1.0 s each time):
    the answer was queued on a connection suspended in the same handler."""
    sid = new_session(srv)
    for body in (b"bad \xff byte", "abc\u20ac".encode()[:-1]):
        took = []
        for _ in range(3):
            st, answer, t = raw_request(srv.port, chunk_head(srv.port, sid, len(body)) + body, [])
            assert st == 400 and answer["error"]["code"] == "invalid_utf8", answer
            took.append(t)
        assert sorted(took)[1] < 0.5, took  # the median: 1.0 s before
    # longer than a piece (16 KiB): pieces already on their way to the log hold the
    # answer back, and the connection must wait for it (a first version of the fix
    # answered from outside the handler on a live connection: nothing came)
    body = ("Zürich 日本語 " * 1500).encode() + "🙂".encode()[:3]
    st, answer, t = raw_request(srv.port, chunk_head(srv.port, sid, len(body)) + body, [])
    assert st == 400 and answer["error"]["code"] == "invalid_utf8", (st, answer, t)
    assert wait_ready(srv, sid, 30)["last_seq"] == 0


def test_wait_false_chunk_the_pot_cannot_take_is_answered_as_the_log_holds_it(tmp_path, fixtures):
    """A ?wait=false chunk that policy none cannot fit: if its failure comes
    before the commit, 422 and nothing kept; once committed, the chunk is
    durable, so 202, and the session fails as an acknowledged chunk's ingest
    does. It used to answer 422 and keep the chunk (the session then failed,
    also after a restart, for a chunk the client was told was refused)."""
    # the tiny model fails the ingest quickly, while the commit still syncs: the window
    s = Server(tmp_path / "d", "--model", fixtures / "tiny_llama.gguf", "--budget-tokens", "64", "--threads", "1").start()
    try:
        outcomes = []
        for _ in range(3):
            st, sess, _ = s.request("POST", "/v1/sessions", {"budget_tokens": 64, "policy": "none"})
            sid = sess["id"]
            assert upload(s, sid, b"A short start. ")[0] == 200
            st, body, _ = upload(s, sid, b"word " * 200, "?wait=false")
            now = wait_ready(s, sid)
            time.sleep(0.5)  # an acknowledged ingest runs on after its 202
            now = session(s, sid)
            if st == 422:
                assert body["error"]["code"] == "document_too_long"
                assert (now["status"], now["last_seq"], now["bytes_received"]) == ("ready", 1, 15), now
            else:
                assert st == 202, body
                assert (now["status"], now["last_seq"]) == ("failed", 2) and "does not fit" in now["error"], now
            outcomes.append((sid, st, now))
        s.stop()
        s.start()
        for sid, st, before in outcomes:  # the restart keeps what the answers said, and says it alike
            after = wait_ready(s, sid)
            for k in ("status", "last_seq", "bytes_received", "tokens_ingested"):
                assert after[k] == before[k], (k, before, after)
            if st == 202:  # the engine's reason, not the log file's path (it was "restore failed: chunk log /tmp/...")
                assert "does not fit" in after["error"] and "/" not in after["error"], after
    finally:
        s.kill()


def test_delete_during_an_acknowledged_ingest_is_durable_and_stops_it(tmp_path):
    """DELETE answered 200 while a ?wait=false chunk is still ingested: the
    files stayed until the ingest ended, so a crash (or a stop) in between
    brought the session back after the restart; and the engine went on
    reading the deleted session's queued chunks."""
    s = Server(tmp_path / "d", "--budget-tokens", "64").start()
    try:
        sid = new_session(s)
        st, body, _ = upload(s, sid, text(300).encode(), "?wait=false", timeout=60)  # ~7K tokens: seconds
        assert st == 202, body
        assert session(s, sid)["tokens_ingested"] < 7000, "the ingest ended before the DELETE: lengthen it"
        st, body, _ = s.request("DELETE", f"/v1/sessions/{sid}")
        assert st == 200, body
        def ingested():
            return int(re.search(r"^potserve_tokens_ingested_total (\d+)", s.request("GET", "/metrics")[1], re.M).group(1))
        time.sleep(1)  # the engine chunk under way ends
        before = ingested()
        time.sleep(1.5)
        assert ingested() == before, "the deleted session's chunk is still being read"
        s.kill()
        s.start()
        assert s.request("GET", f"/v1/sessions/{sid}")[0] == 404
        assert os.listdir(tmp_path / "d" / "sessions") == []  # what the DELETE left went at the start
    finally:
        s.kill()


def test_acknowledged_chunks_waiting_for_the_engine_are_bounded(tmp_path):
    """?wait=false answered 202 to every upload, however far the engine was
    behind (8000 small chunks: 8000 x 202 in 7 s, RSS 115 -> 246 MiB). Beyond
    8 acknowledged chunks still being ingested, an upload waits for its own
    ingest (200): back-pressure, with nothing refused."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--durability", "none").start()
    try:
        sid = new_session(s)
        piece = text(8).encode()
        got = [upload(s, sid, piece, "?wait=false")[0] for _ in range(14)]
        assert set(got) == {200, 202} and got[:8] == [202] * 8, got
        assert wait_ready(s, sid)["last_seq"] == 14
    finally:
        assert s.stop() == 0


def test_a_large_chunk_without_waiting_is_acknowledged_once_durable(tmp_path):
    """?wait=false on a chunk larger than the 128 KiB an upload reads ahead of the engine: its 202
    came only once the engine was within 128 KiB of its end (a 400 KB chunk: after 70 s of a 98 s
    ingest). Now the upload reads on within upload_buffer_bytes (all uploads together), so the 202
    comes once the chunk is in the log, long before its ingest ends; with upload_buffer_bytes 0
    the old bound holds."""
    doc = text(3600).encode()[:144 * 1024]  # past the 128 KiB read-ahead by ~4K tokens
    took, seen = {}, {}
    for knob in ("64M", "0"):
        s = Server(tmp_path / knob, "--durability", "none", "--upload-buffer-bytes", knob).start()
        try:
            st, made, _ = s.request("POST", "/v1/sessions", {})  # (the default pot: a faster ingest)
            sid = made["id"]
            t0 = time.time()
            st, body, _ = upload(s, sid, doc, "?wait=false", timeout=300)
            took[knob] = time.time() - t0
            assert st == 202 and body["bytes_received"] == len(doc), body
            seen[knob] = session(s, sid)
        finally:
            s.kill()
    assert seen["64M"]["status"] == "ingesting", seen["64M"]
    assert seen["64M"]["tokens_ingested"] < seen["0"]["tokens_ingested"] / 2, seen
    assert took["64M"] < took["0"] / 5, took


def test_bad_byte_in_a_later_segment_is_answered(srv):
    sid = new_session(srv)
    first, bad = b"Hello world. ", b"\xff"
    st, body, took = raw_request(srv.port, chunk_head(srv.port, sid, len(first) + len(bad)) + first, [bad])
    assert st == 400 and body["error"]["code"] == "invalid_utf8", (st, body, took)
    # and a valid character cut across two segments is fine
    st, body, _ = raw_request(srv.port, chunk_head(srv.port, sid, 8) + b"caf\xc3", [b"\xa9 ok."])
    assert st == 200 and body["bytes_received"] == 8, body


def test_failed_uploads_do_not_leak_connections(srv):
    """Four bad uploads with --max-connections-per-ip 4 used to leave four
    connections in CLOSE-WAIT, and the address could not reach /health."""
    sid = new_session(srv)
    for _ in range(4):
        st, body, _ = upload(srv, sid, b"abc \xe2\x82", timeout=10)
        assert st == 400, body
    time.sleep(0.3)  # the server notices the closes
    st, body, _ = srv.request("GET", "/health", timeout=5)
    assert st == 200, body
    st, body, _ = upload(srv, sid, b"Still usable. ", timeout=30)
    assert st == 200, body


def test_small_failed_chunk_leaves_the_pot_untouched(srv):
    """A failed chunk whose bytes never reached the engine needs no re-read
    of the document: the session is ready as soon as the error is answered."""
    sid = new_session(srv)
    st, a, _ = upload(srv, sid, text(40).encode(), timeout=120)  # ~1K tokens: seconds to re-read
    assert st == 200, a
    st, body, _ = upload(srv, sid, b"tail \xc3\x28", timeout=10)
    assert st == 400
    now = session(srv, sid)
    assert now["status"] == "ready", now
    assert (now["tokens_ingested"], now["tokens_in_pot"], now["last_seq"]) == \
        (a["tokens_ingested"], a["tokens_in_pot"], 1)


# ---- item 2: after the 202 the client may hang up --------------------------------------------------

def test_hangup_after_202_does_not_fail_the_session(srv):
    sid = new_session(srv)
    doc = text(40).encode()  # seconds of ingest after the answer
    c = socket.create_connection(("127.0.0.1", srv.port))
    c.settimeout(30)
    c.sendall(chunk_head(srv.port, sid, len(doc), "?wait=false") + doc)
    got = b""
    while b"\r\n\r\n" not in got:
        got += c.recv(4096)
    assert got.startswith(b"HTTP/1.1 202"), got
    c.close()  # while the chunk is still being ingested
    mid = session(srv, sid)
    now = wait_ready(srv, sid, 120)
    deadline = time.time() + 120
    while now["tokens_ingested"] == mid["tokens_ingested"] and time.time() < deadline:
        time.sleep(0.2)  # (the session is ready for uploads before its ingest ends)
        now = session(srv, sid)
    assert now["status"] == "ready" and "error" not in now, now
    assert mid["tokens_ingested"] < now["tokens_ingested"], "the ingest ended before the hang-up: lengthen doc"
    st, body, _ = upload(srv, sid, b"More text. ", timeout=60)
    assert st == 200 and body["last_seq"] == 2, body


def test_session_during_an_acknowledged_ingest(srv):
    """While a ?wait=false chunk is still ingested the session says so: status
    "ingesting" and bytes_received counting the acknowledged chunk (it said
    "ready" and left the chunk out); a chunk queued behind it counts its own
    tokens only (it counted the earlier chunk's)."""
    doc = text(40).encode()
    waited = new_session(srv)
    want = [upload(srv, waited, doc)[1]["chunk"]["tokens"], upload(srv, waited, b"And more. ")[1]["chunk"]["tokens"]]
    sid = new_session(srv)
    st, body, _ = upload(srv, sid, doc, "?wait=false")
    assert st == 202 and body["bytes_received"] == len(doc), body
    now = session(srv, sid)
    assert now["tokens_ingested"] < want[0], "the ingest ended before the GET: lengthen doc"
    assert (now["status"], now["bytes_received"], now["last_seq"]) == ("ingesting", len(doc), 1), now
    st, body, _ = upload(srv, sid, b"And more. ")  # queued behind the first chunk's ingest
    assert st == 200 and body["chunk"]["tokens"] == want[1], (body, want)
    assert wait_ready(srv, sid)["bytes_received"] == len(doc) + len(b"And more. ")


# ---- item 3: slow headers ----------------------------------------------------------------------

def test_slow_headers_are_cut_at_the_idle_timeout(tmp_path):
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--idle-timeout", "3", "--connection-timeout", "6").start()
    try:
        c = socket.create_connection(("127.0.0.1", s.port))
        c.settimeout(0.5)
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
        t0, cut = time.time(), None
        for i in range(len(head)):  # one byte every half second, for up to 50 s
            try:
                c.send(head[i:i + 1])
                if c.recv(1) == b"":
                    cut = time.time() - t0
                    break
            except socket.timeout:
                continue
            except OSError:
                cut = time.time() - t0
                break
        c.close()
        print(f"slow header sender cut after {cut} s (idle_timeout 3 s)")
        assert cut is not None and 2.5 < cut < 5.0, cut
        st, body, _ = s.request("GET", "/health")
        assert st == 200
    finally:
        assert s.stop() == 0


def test_connection_timeout_ends_a_kept_alive_connection_between_requests(tmp_path):
    """With connections kept alive, connection_timeout cut a connection in the middle of the
    request it carried: a completion's answer never came (logged 499 though the server closed),
    a stream stopped without [DONE], and the OpenAI client silently ran the request again. The
    age now ends a connection between requests; a request that starts past it is its last
    (Connection: close); a body still trickling in after connection_timeout is still cut."""
    import http.client
    s = Server(tmp_path / "d", "--threads", "1", "--connection-timeout", "3", "--idle-timeout", "30").start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        opened = time.time()
        conn.request("GET", "/health")
        conn.getresponse().read()
        time.sleep(2)
        body = json.dumps({"prompt": "Count: 1, 2, 3,", "max_tokens": 1500, "temperature": 0})
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        assert resp.status == 200 and answer["usage"]["completion_tokens"] == 1500, answer  # whole
        assert time.time() - opened > 4.2, "the answer ended before the connection's age: lengthen it"
        time.sleep(2)
        assert conn.sock.recv(1) == b""  # then closed, idle and past its age
        # a request that starts past the age is answered, and ends the connection
        raw = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        time.sleep(3.3)  # (the sweep runs once a second: a request may still slip in)
        try:
            raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            got = raw.recv(4096)
            assert got == b"" or (got.startswith(b"HTTP/1.1 200") and b"Connection: close" in got), got
        except OSError:
            pass
        raw.close()
        # a body that trickles in for longer than connection_timeout is cut
        slow = socket.create_connection(("127.0.0.1", s.port), timeout=1)
        slow.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n")
        t0, cut = time.time(), None
        while time.time() - t0 < 15 and cut is None:
            try:
                slow.send(b" ")
                if slow.recv(1) == b"":
                    cut = time.time() - t0
            except socket.timeout:
                pass
            except OSError:
                cut = time.time() - t0
            time.sleep(0.4)
        assert cut is not None and 2.5 < cut < 6, cut
    finally:
        s.stop()


def next_access_log_line(srv, route, seen, timeout=60):
    """The first access-log line of route after the `seen` there were (waiting for it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        lines = [json.loads(l) for l in list(srv.log_lines) if l.startswith("{") and f'"route":"{route}"' in l]
        if len(lines) > seen:
            return lines[seen]
        time.sleep(0.05)
    raise AssertionError(f"no new access-log line for {route}")


def log_count(srv, route):
    """Access-log lines of route so far, once no more come for 0.3 s (a line is written just
    after its answer is sent: one answered a moment ago may not be there yet)."""
    count = lambda: sum(1 for l in list(srv.log_lines) if l.startswith("{") and f'"route":"{route}"' in l)
    n = count()
    while True:
        time.sleep(0.3)
        if count() == n:
            return n
        n = count()


@pytest.mark.parametrize("stream", [False, True])
def test_a_half_closed_client_never_gets_a_cut_answer_labelled_whole(srv, stream):
    """A client that sends a whole request and then shuts its writing side (recv cannot tell
    that from leaving) had its generation stopped, and got the few tokens made so far as a 200
    with finish_reason "stop". It now gets 499 client_closed, saying the answer was stopped.
    Streamed, it got an empty delta with finish_reason "stop" and [DONE], logged 200: now an
    error event client_closed, logged 499."""
    body = json.dumps({"prompt": "Count: 1, 2, 3,", "max_tokens": 200, "temperature": 0, "stream": stream}).encode()
    for _ in range(3):
        seen = log_count(srv, "/v1/completions")
        c = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        c.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := c.recv(65536):
            got += chunk
        c.close()
        head, _, rest = got.partition(b"\r\n\r\n")
        if stream:
            assert b'"finish_reason":"stop"' not in rest and b'"finish_reason":"length"' not in rest, got[:600]
            assert got == b"" or b"client_closed" in rest, got[:600]
        else:
            assert got == b"" or (head.startswith(b"HTTP/1.1 499") and b"client_closed" in rest), got[:300]
        assert next_access_log_line(srv, "/v1/completions", seen)["status"] == 499


def test_a_client_that_leaves_during_a_long_prefill_stops_it(srv):
    """A prompt of ~7K tokens (the window holds it: no pot) was prefilled to its end after its
    client left, 48 s on one thread, and the requests behind it waited: the generation's cancel
    was seen only when text came. The engine now looks at it every step of the prefill."""
    prompt = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()[:20000]
    body = json.dumps({"messages": [{"role": "user", "content": prompt + "\n\nSummarize."}], "max_tokens": 8}).encode()
    t0 = time.time()
    st, whole, _ = srv.request("POST", "/v1/chat/completions", json.loads(body))
    full_s = time.time() - t0  # the whole prefill, the client staying
    assert st == 200 and whole["usage"]["prompt_tokens"] > 4000, whole["usage"]
    for how in ("close", "half-close"):  # (a prompt of its own each: a prompt-cache hit has no prefill)
        body = json.dumps({"messages": [{"role": "user", "content": f"{how}: {prompt}\n\nSummarize."}],
                           "max_tokens": 8}).encode()
        seen = log_count(srv, "/v1/chat/completions")
        c = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.1 * full_s)
        c.shutdown(socket.SHUT_WR) if how == "half-close" else c.close()
        left = time.time()
        line = next_access_log_line(srv, "/v1/chat/completions", seen, timeout=2 * full_s + 30)
        stopped_s = time.time() - left
        c.close()
        print(f"{how}: 499 {stopped_s:.1f} s after leaving, whole prefill {full_s:.1f} s")
        assert line["status"] == 499, line
        assert stopped_s < 0.5 * full_s, f"{how}: 499 {stopped_s:.1f} s after leaving; the whole prefill takes {full_s:.1f} s"


# ---- item 4 ---------------------------------------------------------------------------------------

def limit_file_size(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_full_disk_answers_507_and_the_session_recovers(tmp_path):
    """A file size limit stands in for a full disk (EFBIG, like ENOSPC): the
    multi-piece chunk that hits it is answered 507 at once, and the session
    takes the next chunk."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", preexec_fn=limit_file_size(96 * 1024)).start()
    try:
        sid = new_session(s)
        st, a, _ = upload(s, sid, text(30).encode(), timeout=120)
        assert st == 200, a
        t0 = time.time()
        st, body, _ = upload(s, sid, text(2000, seed=7).encode(), timeout=60)  # ~150 KB: past the limit
        print(f"full disk answered {st} after {time.time() - t0:.1f} s")
        assert st == 507 and body["error"]["code"] == "insufficient_storage", body
        now = wait_ready(s, sid, 120)
        assert now["status"] == "ready" and now["last_seq"] == 1, now
        assert now["tokens_ingested"] == a["tokens_ingested"]
        st, body, _ = upload(s, sid, b"A short sentence. ", timeout=60)
        assert st == 200 and body["last_seq"] == 2, body
    finally:
        assert s.stop() == 0


def test_a_session_the_full_disk_cannot_hold_is_a_507(tmp_path):
    """Creating a session on a full disk (a file size limit stands in: EFBIG)
    was a 500 storage_error where an upload's is a 507; now both are 507."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", preexec_fn=limit_file_size(64)).start()
    try:
        st, body, _ = s.request("POST", "/v1/sessions", SETTINGS)
        assert st == 507 and body["error"]["code"] == "insufficient_storage", body
    finally:
        assert s.stop() == 0


def test_more_sessions_than_the_soft_open_files_limit(tmp_path):
    """Every session keeps its log open: under a soft limit of 64 descriptors (1,024 is common)
    the 50th or so session was a 500 "Too many open files"; the server raises its soft limit to
    the hard one at start, so a hundred sessions are made and read."""
    def soft_64():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    s = Server(tmp_path / "d", "--budget-tokens", "16", "--max-sessions-per-key", "200",
               preexec_fn=soft_64).start()
    try:
        for i in range(100):
            st, body, _ = s.request("POST", "/v1/sessions", {})
            assert st == 201, (i, body)
            st, body, _ = upload(s, body["id"], f"Session {i} was read. ".encode(), timeout=60)
            assert st == 200, (i, body)
        assert "open files limit raised from 64 to" in s.wait_log("open files limit")
    finally:
        assert s.stop() == 0


def test_full_disk_at_a_chunks_first_write_leaves_the_session_taking_chunks(tmp_path):
    """The chunk's first write into the log fails (the disk is full): 507, and
    then every later chunk was refused, 500 "chunk 2 is already open", until a
    restart (the failed chunk was never closed in the log)."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", preexec_fn=limit_file_size(8 * 1024)).start()
    try:
        sid = new_session(s)
        st, a, _ = upload(s, sid, text(20).encode(), timeout=120)  # ~1.5 KB
        assert st == 200, a
        def upload_when_idle(data):  # 409 session_busy while the pot is put back as it was before a failed chunk
            deadline = time.time() + 60
            while True:
                st, body, _ = upload(s, sid, data, timeout=60)
                if st != 409 or body["error"]["code"] != "session_busy" or time.time() > deadline:
                    return st, body
                time.sleep(0.2)
        for attempt in range(2):
            st, body = upload_when_idle(text(300, seed=7).encode())  # ~22 KB: its first piece fails
            assert st == 507 and body["error"]["code"] == "insufficient_storage", (attempt, body)
        st, body = upload_when_idle(b"A short sentence. ")
        assert st == 200 and body["last_seq"] == 2, body
    finally:
        assert s.stop() == 0


def test_chunk_seq_is_a_strict_positive_integer(srv):
    sid = new_session(srv)
    for bad in ["-1", "18446744073709551615", "99999999999999999999", "+1", "1x", "0", ""]:
        st, body, _ = upload(srv, sid, b"x ", headers={"X-Chunk-Seq": bad})
        assert st == 400 and body["error"]["param"] == "seq", (bad, st, body)
    st, body, _ = upload(srv, sid, b"x ", query="?seq=-1")
    assert st == 400, body
    st, body, _ = upload(srv, sid, b"x ", query="?seq=2", headers={"X-Chunk-Seq": "1"})
    assert st == 400 and "disagree" in body["error"]["message"], body
    st, body, _ = upload(srv, sid, b"x ", query="?seq=1", headers={"X-Chunk-Seq": "1"})
    assert st == 200 and body["last_seq"] == 1, body


def test_json_chunk_fields_override_the_query(srv):
    sid = new_session(srv)
    path = f"/v1/sessions/{sid}/chunks"
    st, body, _ = srv.request("POST", path + "?final=true", {"text": "A first part. ", "seq": 1, "final": False})
    assert st == 200 and body["last_seq"] == 1 and body["final"] is False, body
    st, body, _ = srv.request("POST", path + "?final=false", {"text": "The end. ", "seq": 2, "final": True})
    assert st == 200 and body["last_seq"] == 2 and body["final"] is True, body
    st, body, _ = srv.request("POST", path, {"text": "More. ", "seq": 3})
    assert st == 409 and body["error"]["code"] == "document_final", body


def chunk_read_in_part(s, sid, body, missing):
    """A chunk announced `missing` bytes longer than body, body sent: its socket, once the
    server is reading it (its first pieces in the pot)."""
    up = socket.create_connection(("127.0.0.1", s.port))
    up.sendall(f"POST /v1/sessions/{sid}/chunks HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
               f"Content-Length: {len(body) + missing}\r\n\r\n".encode() + body)
    deadline = time.time() + 30
    while time.time() < deadline and s.request("GET", f"/v1/sessions/{sid}")[1]["status"] != "ingesting":
        time.sleep(0.05)
    time.sleep(1)  # (its first pieces read into the pot)
    return up


def test_a_question_waits_for_a_chunk_whose_text_is_in_the_pot(tmp_path):
    """A question over a session while a large chunk arrives (its first pieces already in the pot)
    waits for the chunk's acknowledgement, or for the pot put back when it fails: it answered from
    the part received, text that was never acknowledged and that its client then took back."""
    s = Server(tmp_path / "d", "--budget-tokens", "1024").start()
    try:
        st, sess, _ = s.request("POST", "/v1/sessions", {})
        sid = sess["id"]
        first = "The secret password is BLUE-FALCON. " * 3 + "\n"
        assert s.request("POST", f"/v1/sessions/{sid}/chunks", raw=first.encode(),
                         headers={"Content-Type": "text/plain"})[0] == 200
        q = {"session": sid, "messages": [{"role": "user", "content": "What is the secret password?"}],
             "max_tokens": 12, "temperature": 0}
        st, before, _ = s.request("POST", "/v1/chat/completions", q)
        second = ("Update: the secret password has been changed to RED-TIGER-77. Forget the old one. " * 500).encode()
        up = chunk_read_in_part(s, sid, second, 20000)  # 20 KB never come
        got = {}
        asking = threading.Thread(target=lambda: got.update(a=s.request("POST", "/v1/chat/completions", q)))
        asking.start()
        asking.join(2)
        assert asking.is_alive()  # it waits for the chunk
        up.close()  # the client takes the chunk back: never acknowledged
        asking.join(30)
        st, during, _ = got["a"]
        assert st == 200 and during["usage"]["prompt_tokens"] == before["usage"]["prompt_tokens"], during
        assert during["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
    finally:
        assert s.stop() == 0


def test_a_question_waits_for_a_chunk_no_longer_than_its_request_timeout(tmp_path):
    """The wait for the chunk's acknowledgement (above) had no end of its own: an upload trickling
    its body kept a question waiting as long as its connection lived. It ends at request_timeout,
    a 503 as any answer's that finds no turn; the upload goes on."""
    s = Server(tmp_path / "d", "--budget-tokens", "1024", "--request-timeout", "2").start()
    try:
        sid = s.request("POST", "/v1/sessions", {})[1]["id"]
        up = chunk_read_in_part(s, sid, ("A sentence about rivers and their bridges. " * 400).encode(), 10)
        t0 = time.time()
        st, b, h = s.request("POST", "/v1/chat/completions", {
            "session": sid, "messages": [{"role": "user", "content": "Rivers?"}], "max_tokens": 4})
        took = time.time() - t0
        assert st == 503 and b["error"]["code"] == "request_timeout" and "Retry-After" in h, (st, b)
        assert "chunk" in b["error"]["message"] and took < 6, (took, b)
        up.sendall(b" The end.\n")  # the upload was never disturbed
        up.settimeout(60)
        assert up.recv(100).startswith(b"HTTP/1.1 200")
        up.close()
    finally:
        assert s.stop() == 0


def test_chunk_content_types_and_fields(srv):
    """An empty Content-Type is none (it was a 415 "not "); a charset other
    than UTF-8 is refused (it was read as UTF-8); a JSON chunk without text
    names the missing field (it said invalid_type)."""
    sid = new_session(srv)
    path = f"/v1/sessions/{sid}/chunks"
    st, body, _ = srv.request("POST", path + "?seq=1", raw=b"Plain words. ", headers={"Content-Type": ""})
    assert st == 200 and body["last_seq"] == 1, body
    st, body, _ = srv.request("POST", path + "?seq=2", raw="caf\xe9 ".encode("latin-1"),
                              headers={"Content-Type": "text/plain; charset=latin-1"})
    assert st == 415 and "UTF-8" in body["error"]["message"], body
    st, body, _ = srv.request("POST", path + "?seq=2", raw="café ".encode(),
                              headers={"Content-Type": "text/plain; charset=UTF-8"})
    assert st == 200 and body["last_seq"] == 2, body
    # a type is the whole first token: these were taken as text/plain, JSON and UTF-8
    for ct in ("text/plainx", "application/jsonl", "text/plain; charset=utf-8x", "text/plain;charset=utf8mb4"):
        st, body, _ = srv.request("POST", path + "?seq=3", raw=b"x", headers={"Content-Type": ct})
        assert st == 415 and body["error"]["code"] == "unsupported_media_type", (ct, body)
    for ct in ("TEXT/PLAIN;charset=\"utf-8\"", "text/plain ; charset=us-ascii"):
        assert srv.request("POST", path + "?seq=3", raw=b"x", headers={"Content-Type": ct})[0] == 200, ct
    st, body, _ = srv.request("POST", path, {"txt": "x", "seq": 4})
    assert st == 400 and body["error"]["code"] == "missing_field" and body["error"]["param"] == "text", body


def test_json_chunk_resends_and_seq_disagreements(srv):
    """A JSON chunk sent again is a duplicate whether its seq is in the body,
    the header or the query (with the seq in the header, the JSON text used to
    be compared with the raw body: 409 seq_conflict), also after the final
    chunk; a body seq that disagrees with the header's or query's is a 400,
    as header and query disagreeing are (it was 409 seq_gap)."""
    sid = new_session(srv)
    path = f"/v1/sessions/{sid}/chunks"
    assert srv.request("POST", path, {"text": "A first part. "})[0] == 200
    st, body, _ = srv.request("POST", path, {"text": "A first part. "}, headers={"X-Chunk-Seq": "1"})
    assert st == 200 and body["duplicate"] is True, body
    st, body, h = srv.request("POST", path + "?seq=1", {"text": "Other bytes. "})
    assert st == 409 and body["error"]["code"] == "seq_conflict" and h.get("x-should-retry") == "false", (body, h)
    st, body, _ = srv.request("POST", path + "?seq=2", {"text": "More. ", "seq": 3})
    assert st == 400 and body["error"]["param"] == "seq", body
    assert srv.request("POST", path, {"text": "The end. ", "seq": 2, "final": True})[0] == 200
    for extra in ({"seq": 2}, {}):
        st, body, _ = srv.request("POST", path, {"text": "The end. ", "final": True, **extra},
                                  headers={} if extra else {"X-Chunk-Seq": "2"})
        assert st == 200 and body["duplicate"] is True and body["last_seq"] == 2, body
    st, body, _ = srv.request("POST", path, {"text": "The end. ", "seq": 2})  # (it was final)
    assert st == 409 and body["error"]["param"] == "final", body


def test_a_busy_session_says_when_to_retry(tmp_path):
    """409 session_busy is a wait (an upload, a restore, a re-read holding the log): it carries
    Retry-After, and not the x-should-retry: false of the 409s retrying cannot mend. Only some
    of its answers carried Retry-After; the rest then said not to retry at all."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--threads", "1").start()
    try:
        sid = new_session(s)
        long = threading.Thread(target=lambda: upload(s, sid, text(300).encode(), timeout=120))  # seconds
        long.start()
        deadline = time.time() + 30
        while session(s, sid)["status"] != "ingesting" and time.time() < deadline:
            time.sleep(0.05)
        for method, path, raw in (("POST", f"/v1/sessions/{sid}/chunks", b"More. "),
                                  ("DELETE", f"/v1/sessions/{sid}", None)):
            st, body, h = s.request(method, path, raw=raw, headers={"Content-Type": "text/plain"})
            assert st == 409 and body["error"]["code"] == "session_busy", (method, st, body)
            assert h.get("Retry-After") == "1" and "x-should-retry" not in h, (method, h)
        long.join(120)
    finally:
        s.stop()


def test_429s_carry_retry_after(tmp_path):
    # room for one pot of 64 (about 1.5 MB) beside what the server holds, not for a second one
    # (without paging: an idle session's pot would go to its snapshot for the others, test_paging.py)
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--max-sessions-per-key", "1",
               "--pot-memory-limit", "3M", "--page-out-idle", "false").start()
    try:
        # a pot larger than the limit itself never fits: not a 429 to retry for ever
        st, body, h = s.request("POST", "/v1/sessions", {"budget_tokens": 2048})
        assert st == 422 and body["error"]["code"] == "pot_too_large", body
        assert body["error"]["param"] == "budget_tokens" and "Retry-After" not in h, (body, h)
        st, sess, _ = s.request("POST", "/v1/sessions", {"ttl_seconds": 30})
        assert st == 201, sess
        st, body, h = s.request("POST", "/v1/sessions", {})
        assert st == 429 and body["error"]["code"] == "too_many_sessions", body
        assert 1 <= int(h["Retry-After"]) <= 32, h  # when the session with the TTL is gone (its second, the sweep)
        # a question's own pot (a re-read's, a prompt beyond the window's) finds no room either
        st, body, _ = upload(s, sess["id"], b"The river ran north past the mill. " * 4, query="?wait=true")
        assert st == 200, body
        question = [{"role": "user", "content": "Where did the river run?"}]
        st, body, h = s.request("POST", "/v1/chat/completions",
                                {"session": sess["id"], "reread": True, "max_tokens": 4, "messages": question})
        assert st == 429 and body["error"]["code"] == "insufficient_memory", body
        assert 1 <= int(h["Retry-After"]) <= 5, h
        long_prompt = "The river ran north past the mill. " * 1500  # beyond the 8K window: read through a pot
        st, body, h = s.request("POST", "/v1/chat/completions",
                                {"max_tokens": 4, "messages": [{"role": "user", "content": long_prompt},
                                                               {"role": "user", "content": "Where did the river run?"}]})
        assert st == 429 and body["error"]["code"] == "insufficient_memory", body
        assert 1 <= int(h["Retry-After"]) <= 5, h
    finally:
        assert s.stop() == 0


def test_framing_errors_are_json_and_immediate(srv):
    port, sid = srv.port, new_session(srv)
    cases = {
        "disagreeing Content-Length": (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                       b"Content-Length: 2\r\nContent-Length: 20\r\n\r\n{}", 400),
        "Transfer-Encoding gzip": (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc", 400),
        "Transfer-Encoding and Content-Length": (b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                                                 b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        "huge Content-Length": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Content-Length: 9223372036854775807\r\n\r\n{", 413),
        "huge upload Content-Length": (f"POST /v1/sessions/{sid}/chunks HTTP/1.1\r\nHost: x\r\n".encode() +
                                       b"Content-Length: 9223372036854775807\r\n\r\nabc", 413),
        "headers beyond max_header_bytes": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
    }
    for name, (req, want) in cases.items():
        st, body, took = raw_request(port, req, [], timeout=4)
        assert st == want, (name, st, body, took)
        assert isinstance(body, dict) and body["error"]["message"], (name, body)
        assert took < 2, (name, took)


@pytest.mark.parametrize("length", ["0", "00"])
def test_an_expect_100_continue_without_a_body_is_refused_and_stalls_nothing(tmp_path, length):
    """`Expect: 100-continue` with `Content-Length: 0` and bytes after it (found by fuzzing a
    replica): libmicrohttpd sent 100 Continue, then lost the request and asked to be run again at
    once until the connection's idle_timeout; the loop ran it again and again within one pass of
    its timers, so for 30 s nothing else of the loop's ran (the engine's events, the pool's
    answers, lease renewals: a cluster dropped its sessions). Now the request is refused at once
    (a client must not expect a 100 without a body, RFC 9110) and MHD is never run again in the
    pass that ran it."""
    s = Server(tmp_path / "d", "--idle-timeout", "12").start()
    try:
        bad = socket.create_connection(("127.0.0.1", s.port))
        bad.settimeout(10)
        bad.sendall(b"OPTIONS /v1/sessions/ HTTP/1.1\r\nHost: x\r\nContent-Length: " + length.encode() +
                    b"\r\nExpect: 100-continue\r\n\r\nxyz")  # ("00" is 0 to libmicrohttpd: found by review)
        time.sleep(0.3)
        t0 = time.time()  # a question needs the engine's events, which only the loop delivers
        st, body, _ = s.request("POST", "/v1/chat/completions", {
            "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}, timeout=30)
        assert st == 200, body
        assert time.time() - t0 < 5, time.time() - t0
        reply = bad.recv(65536)
        assert reply.startswith(b"HTTP/1.1 400"), reply
        assert b"100-continue" in reply, reply
        bad.close()
    finally:
        assert s.stop() == 0


def test_a_framing_error_with_expect_100_continue_is_answered_at_once(tmp_path):
    """Two Content-Length headers that disagree ("0" and "abc") with Expect: 100-continue and
    bytes after the headers (found by fuzzing a replica): the 400 was kept for the request's next
    call, which never came (libmicrohttpd had sent 100 Continue and lost the request): no answer
    until the idle timeout. Every framing error is now answered at the first call."""
    s = Server(tmp_path / "d", "--idle-timeout", "12").start()
    try:
        bad = socket.create_connection(("127.0.0.1", s.port))
        bad.settimeout(5)
        bad.sendall(b"DELETE /v1/sessions/sess_x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                    b"Expect: 100-continue\r\nContent-Length: abc\r\nConnection: close\r\n\r\nxyz")
        reply = bad.recv(65536)
        assert reply.startswith(b"HTTP/1.1 400") and b"invalid_framing" in reply, reply
        bad.close()
    finally:
        assert s.stop() == 0


def server_cpu_seconds(s):
    fields = open(f"/proc/{s.proc.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_connection_libmicrohttpd_cannot_read_on_does_not_spin_a_core(tmp_path):
    """A chunk-size line longer than libmicrohttpd's buffer (found by review): MHD 0.9.75 neither
    reads that connection again nor closes it, and asks to be run at once until its idle timeout;
    the loop ran it every iteration, one core at 100 % for 30 s per connection, answers slowed
    threefold. Now, after 20 ms of such asking with no progress, MHD runs every 5 ms."""
    s = Server(tmp_path / "d", "--idle-timeout", "4").start()  # (MHD closes it then; a drain waits for it)
    try:
        stuck = socket.create_connection(("127.0.0.1", s.port))
        stuck.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n2;" + b"e" * 90000)
        time.sleep(0.5)
        before = server_cpu_seconds(s)
        time.sleep(2)
        used = server_cpu_seconds(s) - before
        assert used < 0.4, f"{used:.2f} s of CPU in 2 s with the stuck connection open"
        assert metric(s, "potserve_mhd_stuck_total") >= 1
        st, body, _ = s.request("POST", "/tokenize", {"content": "hello"})
        assert st == 200, body
        stuck.close()
    finally:
        assert s.stop() == 0


# ---- found by reviewing uploads (docs/reliability.md, "Found by reviewing uploads") ----

def counts(body):
    return body["last_seq"], body["tokens_ingested"], body["tokens_in_pot"], body["compressions"]


def test_a_client_that_leaves_in_the_middle_of_a_chunk_frees_its_session_at_once(tmp_path):
    """A chunk's connection was not read while the engine was more than 128 KiB behind, so the
    client's hang-up (its FIN, queued behind the bytes it had sent) was seen only once every one
    of those bytes had been read into the pot: the session answered 409 session_busy for a
    minute (here) while text to be thrown away was read. Now uploads read ahead within
    upload_buffer_bytes, so the hang-up is seen at once."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--threads", "1").start()
    try:
        sid = new_session(s)
        st, first, _ = upload(s, sid, b"First chunk of text. " * 50)
        assert st == 200, first
        body = b"".join(b"Sentence %d about foxes. " % i for i in range(20000))  # 540 KB
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(f"POST /v1/sessions/{sid}/chunks HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:len(body) // 2])
        time.sleep(1.0)
        c.close()
        t0 = time.time()
        now = wait_ready(s, sid, timeout=120)
        assert time.time() - t0 < 5, f"busy {time.time() - t0:.1f} s after its client left"
        assert counts(now) == counts(first)
        st, body2, _ = upload(s, sid, b"A second chunk. ")
        assert st == 200 and body2["last_seq"] == 2, body2
    finally:
        assert s.stop() == 0


def test_an_acknowledged_chunk_holds_no_copy_of_the_pot_while_it_is_read(tmp_path):
    """The copy of the pot from before a chunk (put back if the chunk fails before its commit)
    was held until an acknowledged (?wait=false) chunk's ingest ended, though after the commit it
    can never be used: two pots counted for one session, and a new session refused 429 at a limit
    of two pots."""
    pot = 6289920  # a budget-256 pot of the default model
    s = Server(tmp_path / "d", "--budget-tokens", "256", "--pot-memory-limit", str(2 * pot + 1000),
               "--prompt-cache-bytes", "0", "--page-out-idle", "false", "--threads", "1").start()
    try:
        st, b, _ = s.request("POST", "/v1/sessions", {"budget_tokens": 256})
        sid = b["id"]
        assert b["memory_bytes"] == pot
        body = b"".join(b"Sentence %d about foxes and dogs and the weather today. " % i for i in range(600))
        st, b, _ = upload(s, sid, body, query="?wait=false")
        assert st == 202, b
        assert session(s, sid)["status"] == "ingesting"
        assert metric(s, "potserve_pot_memory_bytes") == pot
        st, b, _ = s.request("POST", "/v1/sessions", {"budget_tokens": 256})
        assert st == 201, b
        wait_ready(s, sid, timeout=300)
    finally:
        assert s.stop() == 0


def test_connection_timeout_counts_no_time_the_server_held_an_upload(tmp_path):
    """connection_timeout cuts a body still arriving after it (a client trickling bytes for
    ever); an upload the server itself held back while the engine read it counted that time, so
    a long chunk was cut, unanswered and not kept, however fast its client sent it."""
    s = Server(tmp_path / "d", "--threads", "1", "--connection-timeout", "1", "--upload-buffer-bytes", "0",
               "--shutdown-grace", "1").start()
    try:
        st, b, _ = s.request("POST", "/v1/sessions", {})
        sid = b["id"]
        # 150 KB: 128 KiB of pieces wait for the engine, the rest is read once one of them is
        # read into the pot (seconds); acknowledged (202) once durable, the ingest going on
        body = b"".join(b"Sentence %d about foxes. " % i for i in range(5500))
        t0 = time.time()
        st, b, _ = upload(s, sid, body, query="?wait=false", timeout=300)
        assert st == 202 and b["last_seq"] == 1, b
        print(f"a chunk held back {time.time() - t0:.1f} s, answered")
    finally:
        assert s.stop() == 0


def test_a_stop_waits_for_acknowledged_chunks_no_longer_than_its_grace(tmp_path):
    """Acknowledged (?wait=false) chunks still being read when a SIGTERM's drain ended had the
    stop's snapshot queued behind them, and the stop waited for all of them (38 s, past
    shutdown_grace's 30). Now the drain waits for them within its grace, then leaves them to the
    next start, which reads them from the log: nothing acknowledged is lost."""
    d = tmp_path / "d"
    flags = ("--budget-tokens", "256", "--threads", "1", "--shutdown-grace", "2")
    s = Server(d, *flags).start()
    try:
        sid = new_session(s)
        chunks = [b"".join(b"Chunk %d sentence %d about foxes. " % (k, i) for i in range(500)) for k in range(3)]
        for chunk in chunks:
            st, b, _ = upload(s, sid, chunk, query="?wait=false")
            assert st == 202, b
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0
        took = time.time() - t0
    finally:
        s.stop()
    assert took < 8, f"the stop took {took:.1f} s with a grace of 2"
    print(f"stopped in {took:.1f} s")
    s = Server(d, *flags).start()
    ref = Server(tmp_path / "ref", *flags).start()
    try:
        rid, sent = new_session(ref), []

        def reference():  # (read beside the restarted server's replay: each has one thread)
            sent.extend(upload(ref, rid, chunk, timeout=300)[0] for chunk in chunks)
        th = threading.Thread(target=reference)
        th.start()
        now = wait_ready(s, sid, timeout=300)
        th.join()
        assert sent == [200] * len(chunks), sent
        assert counts(now) == counts(session(ref, rid))
    finally:
        assert s.stop() == 0
        assert ref.stop() == 0


def test_health_answers_503_while_draining(tmp_path):
    s = Server(tmp_path / "d", "--budget-tokens", "64").start()
    try:
        st, sess, _ = s.request("POST", "/v1/sessions", SETTINGS)
        # a half-sent upload keeps the drain open
        hold = socket.create_connection(("127.0.0.1", s.port))
        hold.sendall(chunk_head(s.port, sess["id"], 100) + b"part of the body ")
        time.sleep(0.3)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        st, body, h = s.request("GET", "/health", timeout=5)
        assert st == 503 and body == {"status": "draining"}, (st, body)
        assert h.get("Connection") == "close"
        st, body, _ = s.request("POST", "/v1/sessions", SETTINGS, timeout=5)
        assert st == 503 and body["error"]["code"] == "shutting_down", body
        hold.close()
        assert s.proc.wait(30) == 0
    finally:
        s.kill()


def test_drain_ends_after_shutdown_grace(tmp_path):
    """An upload whose client went quiet holds a drain only for shutdown_grace:
    the server then exits 0, the half-sent chunk unacknowledged and absent,
    the acknowledged one intact after a restart."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--shutdown-grace", "2").start()
    try:
        st, sess, _ = s.request("POST", "/v1/sessions", SETTINGS)
        st, ack, _ = s.request("POST", f"/v1/sessions/{sess['id']}/chunks", raw=b"The first chunk. ",
                               headers={"Content-Type": "text/plain"})
        assert st == 200, ack
        hold = socket.create_connection(("127.0.0.1", s.port))
        hold.sendall(chunk_head(s.port, sess["id"], 100) + b"part of the body ")
        time.sleep(0.3)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(30) == 0
        took = time.monotonic() - t0
        assert 1.5 < took < 10, took  # the grace, then the housekeeping tick
        hold.close()
        s.start()
        st, got, _ = s.request("GET", f"/v1/sessions/{sess['id']}")
        assert st == 200 and got["bytes_received"] == len(b"The first chunk. "), got
    finally:
        s.kill()


def test_upload_still_ingesting_at_the_drain_end_is_a_503(tmp_path):
    """A whole chunk whose ingest the drain's grace cuts short is not kept and
    is answered 503 shutting_down (retry elsewhere), not 500 (it was 500
    ingest_failed "shutting down")."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--shutdown-grace", "1").start()
    try:
        sid = new_session(s)
        body = text(300).encode()  # ~7K tokens: longer than the grace
        c = socket.create_connection(("127.0.0.1", s.port))
        c.settimeout(60)
        c.sendall(chunk_head(s.port, sid, len(body)) + body)
        time.sleep(0.5)
        s.proc.send_signal(signal.SIGTERM)
        got = b""
        while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
            k = c.recv(65536)
            if not k:
                break
            got += k
        assert got.startswith(b"HTTP/1.1 503") and b'"shutting_down"' in got, got
        assert s.proc.wait(30) == 0
        s.start()
        assert session(s, sid)["last_seq"] == 0
    finally:
        s.kill()


def test_sigterm_during_a_restore_exits_within_the_grace(tmp_path):
    """SIGTERM while the server restores a session at start: the replay is
    abandoned at its next engine chunk and the server exits within
    shutdown_grace (it waited for the whole replay: 23-26 s with a grace of
    3-5 s); the log is untouched, so the next start restores it whole."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--shutdown-grace", "2").start()
    try:
        sid = new_session(s)
        doc = text(1200).encode()  # ~28K tokens: a restore of many seconds
        st, body, _ = upload(s, sid, doc, "?wait=false", timeout=120)
        assert st == 202, body
        s.kill()
        s.start(ready=False)  # listening (its signal handlers set right after), not yet ready
        time.sleep(2)  # loading: the restore is under way
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(30) == 0
        took = time.monotonic() - t0
        assert took < 2 + 4, took  # the grace, the housekeeping tick, one engine chunk
        s.start(timeout=300)  # healthy once the restore of ~28K tokens is done (ASan on a busy machine: minutes)
        now = wait_ready(s, sid, 300)
        assert (now["status"], now["last_seq"], now["bytes_received"]) == ("ready", 1, len(doc)), now
    finally:
        s.kill()


def test_curl_T_uploads_with_put(srv, tmp_path):
    """`curl -T file` sends PUT: the chunks route takes it like POST."""
    sid = new_session(srv)
    f = tmp_path / "doc.txt"
    f.write_text(text(10))
    out = subprocess.run(["curl", "-sS", "-T", str(f), "-H", "Transfer-Encoding: chunked", "-H",
                          "Content-Type: text/plain", f"{srv.url}/v1/sessions/{sid}/chunks?final=true"],
                         capture_output=True, timeout=120, check=True)
    body = json.loads(out.stdout)
    assert body["bytes_received"] == f.stat().st_size and body["final"] is True, body


# ---- request_timeout holds for the whole request ------------------------------------------------

@pytest.mark.heavy  # a 7K-token ingest: over 10 minutes under TSan on a shared machine
def test_request_timeout_covers_the_wait_behind_an_ingest(tmp_path):
    """A question over a session waits on the engine thread for the session's
    earlier chunks. The deadline used to be checked only per generated token,
    so a question queued behind a long ingest ran past request_timeout (in the
    fuzzer, until shutdown). Now a question with no token by its deadline is a
    503 request_timeout with Retry-After, at the deadline, and the session is
    unharmed."""
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--request-timeout", "2").start()
    try:
        sid = new_session(s)
        st, body, _ = upload(s, sid, text(300).encode(), "?wait=false", timeout=60)  # ~7K tokens: long
        assert st == 202, body
        ask = {"session": sid, "messages": [{"role": "user", "content": "Which river?"}], "max_tokens": 4}
        t0 = time.time()
        st, body, hdrs = s.request("POST", "/v1/chat/completions", ask, timeout=120)
        took = time.time() - t0
        assert st == 503 and body["error"]["code"] == "request_timeout", (st, body, took)
        assert int(hdrs["Retry-After"]) >= 1, hdrs
        assert took < 2 + 8, took  # the deadline and one engine chunk, with slack for a shared machine
        # streamed: the error arrives as an event of the stream, then [DONE]. A second long
        # chunk first: on a fast machine the first may be ingested by now
        st, body, _ = upload(s, sid, text(300, seed=300).encode(), "?wait=false", timeout=60)
        assert st == 202, body
        t0 = time.time()
        st, events, _ = s.request("POST", "/v1/chat/completions", dict(ask, stream=True), timeout=120)
        took = time.time() - t0
        assert st == 200 and took < 2 + 8, (st, took)
        assert '"request_timeout"' in events and events.rstrip().endswith("data: [DONE]"), events
        mid = session(s, sid)["tokens_ingested"]
        st, body, _ = upload(s, sid, b"The end. ", timeout=600)  # queued behind the long ingest
        assert st == 200, body
        assert mid < body["tokens_ingested"], "the ingest ended before the questions came back: lengthen it"
        now = session(s, sid)  # unharmed by the questions that timed out
        assert now["status"] == "ready" and "error" not in now and now["last_seq"] == 3, now
    finally:
        assert s.stop() == 0


# ---- a failed chunk puts back the pot it found --------------------------------------------------

def test_failed_chunk_puts_back_the_pre_chunk_pot(tmp_path):
    """A chunk whose first pieces were read into the pot before a later piece
    failed (invalid UTF-8) used to rebuild the pot by re-reading the session's
    log (no snapshot yet: all of it), so the session stayed busy for as long as
    the document took to ingest. The upload now keeps a copy of the document as
    it stood before the chunk and puts it back: ready within a small fraction of
    that time, with the same statistics and the same greedy answer."""
    s = Server(tmp_path / "d", "--budget-tokens", "64").start()
    try:
        sid = new_session(s)
        # ~4.5K tokens (~1.1K under a sanitizer, where a re-read is as slow as 4.5K here)
        st, first, _ = upload(s, sid, text(50 if SANITIZED else 200).encode(), timeout=600)
        assert st == 200, first
        read_s = first["chunk"]["ms"] / 1e3
        ask = {"session": sid, "messages": [{"role": "user", "content": "Which river?"}], "max_tokens": 12,
               "temperature": 0}
        st, before, _ = s.request("POST", "/v1/chat/completions", ask, timeout=300)
        assert st == 200, before
        stats = {k: first[k] for k in ("tokens_ingested", "tokens_in_pot", "compressions", "bytes_received")}
        # 40 KB of good text (three 16 KiB pieces: the first two go to the engine), then a bad byte later
        good = text(600, seed=7).encode()[:40000]
        st, body, _ = raw_request(s.port, chunk_head(s.port, sid, len(good) + 1) + good, [b"\xff"], timeout=120,
                                  gap=3)
        assert st == 400 and body["error"]["code"] == "invalid_utf8", body
        t0 = time.time()
        now = wait_ready(s, sid, 600)
        back_s = time.time() - t0
        assert now["status"] == "ready" and "error" not in now, now
        assert {k: now[k] for k in stats} == stats, (now, stats)
        assert now["last_seq"] == 1, now
        assert back_s < max(1.0, read_s / 4), (back_s, read_s)  # a re-read takes about read_s
        assert any("back as it was before the chunk" in line for line in s.log_lines), s.log_lines[-5:]
        st, after, _ = s.request("POST", "/v1/chat/completions", ask, timeout=300)
        assert st == 200 and after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
        # and the session reads on as if the failed chunk had never come
        st, body, _ = upload(s, sid, b"More about the harbor. ", timeout=300)
        assert st == 200 and body["last_seq"] == 2, body
        print(f"document read in {read_s:.1f} s; pot back {back_s:.2f} s after the failed chunk's answer")
    finally:
        assert s.stop() == 0


def test_request_timeout_0_is_no_limit_and_budget_errors_say_the_largest(tmp_path, fixtures):
    """A default budget beyond the model's window is lowered at start (sessions
    made with it were all refused). request_timeout 0 was accepted, then every
    generation was a 503 at once;
    it is no limit now, as connection_timeout 0 is. A budget that passes the
    window check but not with the policy's scoring rows said only "304 tokens
    exceed the model's context"; it now says the largest budget that fits."""
    s = Server(tmp_path / "d", "--model", fixtures / "tiny_llama.gguf", "--request-timeout", "0").start()
    try:
        # the default budget (2048) is larger than this model's window (256): lowered at start, not
        # offered as a default every session made with it would be refused for
        assert any("budget_tokens lowered from 2048 to 128" in line for line in s.log_lines), s.log_lines
        st, body, _ = s.request("POST", "/v1/sessions", {})
        assert st == 201 and body["budget_tokens"] == 128, body
        st, body, _ = s.request("POST", "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
        assert st == 200, body
        st, body, _ = s.request("POST", "/v1/sessions", {"budget_tokens": 256})
        assert st == 422 and "budget_tokens can be at most" in body["error"]["message"], body
        most = int(body["error"]["message"].rsplit("at most ", 1)[1].split()[0])
        assert s.request("POST", "/v1/sessions", {"budget_tokens": most})[0] == 201
        assert s.request("POST", "/v1/sessions", {"budget_tokens": most + 1})[0] == 422
        # rows that fit no budget are named as the field they came from (a catalyst was called "question")
        for settings, param in (({"catalyst": "word " * 400}, "catalyst"),
                                ({"policy": "finch", "question": "word " * 400}, "question")):
            st, body, _ = s.request("POST", "/v1/sessions", settings)
            assert st == 422 and body["error"]["param"] == param, (settings, body)
    finally:
        assert s.stop() == 0


def test_settings_too_long_for_any_window_are_refused_untokenized(srv):
    """A system prompt, catalyst or question of megabytes was tokenized whole on the engine thread
    before its 422 (15 MB: 6.7 s, every other session's work waiting); one longer than its room
    can hold at the longest token's bytes is refused at once now."""
    big = "word " * 1_000_000  # 5 MB
    for settings, param in (({"system": big}, "keep_tokens"), ({"catalyst": big}, "catalyst"),
                            ({"policy": "finch", "question": big}, "question")):
        t = time.time()
        st, body, _ = srv.request("POST", "/v1/sessions", settings)
        assert st == 422 and body["error"]["param"] == param, (param, body)
        assert "bytes are more tokens than" in body["error"]["message"], body
        print(f"{param}: 422 in {time.time() - t:.2f} s")


def test_budget_below_twice_the_pinned_prefix_names_keep_tokens(srv):
    """Budgets 16-49 on the default model passed the documented range and were
    refused naming "system" (no system prompt was sent) with no param."""
    st, body, _ = srv.request("POST", "/v1/sessions", {"budget_tokens": 30})
    assert st == 422 and body["error"]["param"] == "keep_tokens", body
    assert "pinned prefix (24 tokens" in body["error"]["message"], body
    assert srv.request("POST", "/v1/sessions", {"budget_tokens": 50})[0] == 201


def test_429_right_after_a_delete_says_retry_in_a_second(tmp_path):
    """The pot of a session deleted a moment ago is freed on the engine thread
    a little later (0.1 s here): a session created in between got 429 with
    Retry-After 60 (the next expiry, or a minute) for memory about to free."""
    s = Server(tmp_path / "d", "--pot-memory-limit", "4M", "--prompt-cache-bytes", "0", "--threads", "1").start()
    try:
        a, b = (s.request("POST", "/v1/sessions", {"budget_tokens": 64})[1]["id"] for _ in range(2))
        assert upload(s, a, text(60).encode(), "?final=true")[0] == 200
        assert s.request("DELETE", f"/v1/sessions/{b}")[0] == 200
        st, body, hdrs = s.request("POST", "/v1/sessions", {"budget_tokens": 64})
        assert st == 201 or (st == 429 and hdrs["Retry-After"] == "1"), (st, body, hdrs)
    finally:
        assert s.stop() == 0


@pytest.mark.heavy  # 16 answers over a 2048-token pot: minutes under a sanitizer
def test_answers_take_turns_and_their_memory_is_bounded(tmp_path):
    """Each answer decodes in its own copy of its pot, which pot_memory_limit does not count: 32
    concurrent questions over one budget-2048 session took 1.6 GB (a probe). At most max_answers
    sequences decode at once now; the others wait their turn, in order, and are all answered."""
    import concurrent.futures
    import threading
    s = Server(tmp_path / "d", "--max-answers", "2", "--durability", "none", "--threads", "1").start()
    try:
        st, sess, _ = s.request("POST", "/v1/sessions", {"budget_tokens": 2048})
        assert st == 201, sess
        st, up, _ = upload(s, sess["id"], text(400).encode(), "?final=true", timeout=300)
        assert st == 200, up
        pid = s.proc.pid

        def rss_mb():
            with open(f"/proc/{pid}/status") as f:
                return int(next(x for x in f if x.startswith("VmRSS")).split()[1]) / 1024
        base_rss = rss_mb()
        peak = {"running": 0, "waiting": 0, "rss": 0}
        done = threading.Event()

        def watch():
            while not done.is_set():
                st, m, _ = s.request("GET", "/metrics")
                got = {k: float(line.split()[1]) for line in m.splitlines() for k in ("running", "waiting")
                       if line.startswith(f"potserve_answers_{k} ")}
                for k in ("running", "waiting"):
                    peak[k] = max(peak[k], got[k])
                peak["rss"] = max(peak["rss"], rss_mb() - base_rss)
                time.sleep(0.05)

        def ask(i):
            st, body, _ = s.request("POST", "/v1/chat/completions", {
                "session": sess["id"], "max_tokens": 12, "temperature": 0,
                "messages": [{"role": "user", "content": f"Question {i}: which places are named?"}]}, timeout=600)
            return st, body
        w = threading.Thread(target=watch)
        w.start()
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(ask, range(10)))
        done.set()
        w.join()
        assert [st for st, _ in answers] == [200] * 10, answers
        assert all(b["usage"]["completion_tokens"] > 0 for _, b in answers)
        assert peak["running"] <= 2 and peak["waiting"] >= 5, peak
        assert SANITIZED or peak["rss"] < 400, peak  # 16 copies at once took 1.27 GB (a sanitizer's shadow adds)
        # one request asking for more answers than max_answers could not be bounded: a 400 (it ran alone:
        # a probe's n=16 over an 8,000-token prompt took 4.7 GB)
        st, body, _ = s.request("POST", "/v1/completions", {"prompt": "The river", "n": 3, "max_tokens": 2})
        assert st == 400 and body["error"]["param"] == "n" and "max_answers (2)" in body["error"]["message"], body
        st, m, _ = s.request("GET", "/metrics")
        assert "potserve_answers_running 0" in m and "potserve_answers_waiting 0" in m
    finally:
        s.stop()


def test_an_answer_waiting_its_turn_says_so_and_gives_it_up_when_its_client_leaves(tmp_path):
    import threading
    s = Server(tmp_path / "d", "--max-answers", "1", "--durability", "none", "--threads", "1").start()
    try:
        long_ask = {"max_tokens": 600, "temperature": 1.0, "seed": 1, "messages": [
            {"role": "user", "content": "Write a very long story about rivers, bridges and markets."}]}
        first = []
        t = threading.Thread(target=lambda: first.append(s.request("POST", "/v1/chat/completions", long_ask,
                                                                  timeout=300)))
        t.start()
        until = time.time() + 30
        while "potserve_answers_running 1" not in s.request("GET", "/metrics")[1]:
            assert time.time() < until
            time.sleep(0.05)
        waiting = []
        for stream in (True, False):
            body = json.dumps(dict(long_ask, stream=stream, max_tokens=4)).encode()
            c = socket.create_connection(("127.0.0.1", s.port))
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            waiting.append(c)
        got = b""
        while b": waiting for a turn (max_answers)" not in got:  # the streamed one says why it waits
            got += waiting[0].recv(4096)
        assert "potserve_answers_waiting 2" in s.request("GET", "/metrics")[1]
        for c in waiting:
            c.close()
        while "potserve_answers_waiting 0" not in s.request("GET", "/metrics")[1]:
            assert time.time() < until, "the waiting answers kept their place after their clients left"
            time.sleep(0.1)
        assert "potserve_answers_running 1" in s.request("GET", "/metrics")[1]  # the first still answers
        t.join()
        assert first[0][0] == 200, first
        # logged and counted as clients that left (499), not as the server's 503s or as answered 200s
        def posts():
            return [json.loads(line) for line in list(s.log_lines) if line.startswith('{"method":"POST"')]
        while len(posts()) < 3 and time.time() < until + 30:  # (the log is read from its pipe)
            time.sleep(0.05)
        assert [x["status"] for x in posts() if x["status"] != 200] == [499, 499], posts()
    finally:
        s.stop()


def test_a_prompt_read_through_a_temporary_pot_stops_when_its_client_leaves(tmp_path):
    """A sessionless prompt beyond the window is read through a temporary pot: after its client left
    the engine read on to the end (a probe: 416 s of a core for one request, logged 200); then it
    stopped but answered 500 overflow_failed ("the document's ingest was cancelled")."""
    s = Server(tmp_path / "d", "--durability", "none", "--threads", "1").start()
    try:
        text = " ".join(f"w{i % 997}" for i in range(20000))
        body = json.dumps({"max_tokens": 4, "messages": [{"role": "user", "content": text},
                                                         {"role": "user", "content": "Summarize."}]}).encode()
        with socket.create_connection(("127.0.0.1", s.port)) as c:
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            time.sleep(1.5)
        left = time.time()
        # the sweep (each second) sees the client gone; the read ends at its next chunk, then the answer
        line = next_access_log_line(s, "/v1/chat/completions", 0, timeout=120)
        print(f"{line['status']} {time.time() - left:.1f} s after the client left")
        assert line["status"] == 499, line

        def cpu_s():
            with open(f"/proc/{s.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        before = cpu_s()
        time.sleep(3)
        assert cpu_s() - before < 0.5, "the temporary pot was still being read"
        assert s.request("GET", "/health")[0] == 200
    finally:
        s.stop()


@pytest.mark.heavy  # 6 MB through an instrumented tokenizer
def test_tokenizing_megabytes_does_not_stop_the_server(tmp_path):
    """Prompts and /tokenize bodies were tokenized on the loop: 16 MB held every connection (and
    /health) for 15-25 s (a probe). Megabytes are tokenized on the thread pool now, and a
    question too long for any pot is refused there."""
    import threading
    s = Server(tmp_path / "d", "--durability", "none", "--threads", "1").start()
    try:
        big = "a" * (6 << 20)
        jobs = [("/tokenize", {"content": " " * (6 << 20)}, 200),
                ("/v1/chat/completions", {"overflow": "error", "max_tokens": 2,
                                          "messages": [{"role": "user", "content": big}]}, 400),
                # (without "overflow": "error" the question was tokenized again on the loop, for a temporary pot)
                ("/v1/chat/completions", {"max_tokens": 2, "messages": [{"role": "user", "content": big}]}, 400)]
        for path, body, want in jobs:
            out = []
            t = threading.Thread(target=lambda: out.append(s.request("POST", path, body, timeout=300)[0]))
            t0 = time.time()
            t.start()
            slowest = 0
            while t.is_alive():
                h0 = time.time()
                assert s.request("GET", "/health", timeout=60)[0] == 200
                slowest = max(slowest, time.time() - h0)
                time.sleep(0.1)
            t.join()
            assert out == [want], (path, out)
            assert time.time() - t0 > 1 and slowest < 0.5, (path, time.time() - t0, slowest)
    finally:
        s.stop()


def test_parsing_megabytes_of_json_does_not_stop_the_server(tmp_path):
    """JSON bodies were parsed on the loop, a Responses body up to four times and its answer's
    JSON made there too: six 9 MB bodies at once held /health (and, in a cluster, lease renewals)
    for 0.3-1.3 s (tests/bench/large_bodies.py). Each body is parsed once now, off the loop when
    large, and /tokenize's and /detokenize's work and answers are made there too (five such
    bodies at once: /health's slowest answer 0.31 s on a quiet machine and 1.08 s beside another
    test before, 0.03 s now)."""
    import threading
    s = Server(tmp_path / "d", "--durability", "none", "--max_body_bytes", str(32 << 20)).start()
    try:
        # (about 12 MB of JSON: two million values; a quarter under the sanitizers, whose loop is not timed)
        n = 500_000 if SANITIZED else 2_000_000
        ids = [(k * 7919) % 49152 for k in range(n)]
        words = " ".join(str(k) for k in range(n * 3 // 4))
        # (the routes whose work on a large body is all off the loop now; a prompt's token ids are
        # still checked there, and a chunk's text taken there: tests/bench/large_bodies.py)
        jobs = [("/detokenize", {"tokens": ids}, 200),
                ("/detokenize", {"tokens": ids[::-1]}, 200),
                ("/tokenize", {"content": "x", "ignored": ids}, 200),
                ("/v1/responses/input_tokens", {"model": "x", "input": [{"role": "user", "content": words}]}, 400),
                ("/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": words}]}, 400)]
        sid = s.request("POST", "/v1/sessions", {})[1]["id"]
        bodies = [(path.format(sid=sid), json.dumps(body).encode(), want) for path, body, want in jobs]
        out, slowest = [], 0
        senders = [threading.Thread(target=lambda p=p, b=b: out.append((p, s.request("POST", p, raw=b, timeout=300,
                                                                                        headers={"Content-Type": "application/json"})[0])))
                   for p, b, _ in bodies]
        for t in senders:
            t.start()
        while any(t.is_alive() for t in senders):
            h0 = time.time()
            assert s.request("GET", "/health", timeout=60)[0] == 200
            slowest = max(slowest, time.time() - h0)
            time.sleep(0.01)
        assert sorted(out) == sorted((p, want) for p, _, want in bodies)
        assert SANITIZED or slowest < 0.2, slowest  # (0.31-1.08 s before, 0.03 s after, here)
    finally:
        s.kill()  # (the chunk's ingest would take minutes)


def test_a_large_body_is_refused_or_taken_as_a_small_one(srv):
    """Bodies over 64 KB are parsed off the loop (above): the same answers as small ones, for
    JSON that is broken, not an object, or blank, on every JSON route."""
    pad = " " * (100 << 10)
    h = {"Content-Type": "application/json"}
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/responses/input_tokens",
                 "/v1/conversations", "/tokenize", "/detokenize", "/v1/sessions"]:
        for body, code in [(b'{"a": "' + b"x" * (100 << 10), "invalid_json"), (b"[1, 2]" + pad.encode(), "invalid_json"),
                           (b'{"a": "\\u0000"}' + pad.encode(), "unsupported_value")]:
            small = srv.request("POST", path, raw=body.strip(), headers=h)
            large = srv.request("POST", path, raw=body, headers=h)
            assert large[0] == small[0] and large[1]["error"]["code"] == small[1]["error"]["code"], (path, small, large)
            assert large[0] == 400 and large[1]["error"]["code"] == code or path == "/v1/sessions", (path, large)
    st, made, _ = srv.request("POST", "/v1/sessions", raw=pad.encode(), headers=h)  # blank: every default
    assert st == 201 and made["budget_tokens"] > 0, made
    assert srv.request("DELETE", f"/v1/sessions/{made['id']}")[0] == 200
    st, conv, _ = srv.request("POST", "/v1/conversations", raw=pad.encode(), headers=h)
    assert st == 400 and conv["error"]["code"] == "invalid_json", conv  # (only an empty body is {})


def test_text_without_spaces_is_read_as_it_arrives(tmp_path, fixtures):
    """A pre-token is held back until the text after it settles it, and a chunk
    with no space is one pre-token: 50 MB of one letter held 3 GB of the
    server's memory, acknowledged yet unread (`tokens_ingested` 0, questions
    saw none of it), and rebuilt so at every restart. Runs of one class are
    cut every TOK_RUN_CUT bytes (engine/tokenizer.h): read as they arrive."""
    s = Server(tmp_path / "d", "--model", fixtures / "tiny_llama.gguf", "--budget-tokens", "64",
               "--threads", "1").start()
    try:
        for run in (b"q" * 12_000, b" " * 12_000, "語".encode() * 4_000):  # each past TOK_RUN_CUT twice
            sid = new_session(s)
            st, body, _ = upload(s, sid, run, "?seq=1")
            assert st == 200, body
            got = wait_ready(s, sid)
            assert got["tokens_ingested"] > 0, got  # (was 0: the whole chunk held back)
            st, kept, _ = s.request("GET", f"/v1/sessions/{sid}/text?start=0&end=64")
            read = "".join(span["text"] for span in kept["spans"])
            assert st == 200 and read and set(read) == set(run.decode()), (st, kept)
        s.kill()  # restored from the log, the same tokens
        s.start()
        got2 = wait_ready(s, sid)
        assert got2["tokens_ingested"] == got["tokens_ingested"], (got, got2)
    finally:
        s.stop()


def test_a_read_only_data_dir_refuses_to_start(tmp_path):
    """On a read-only mount the server said "ready", answered the sessions it
    could not open 404 (as if deleted) and every create 500. It refuses to start."""
    from conftest import run
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)")
    try:
        (mnt / "sessions").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        p = run("serve", "--data-dir", mnt, "--port", "0", timeout=60)
        assert p.returncode == 1 and b"is not writable: Read-only file system" in p.stderr, p.stderr
    finally:
        subprocess.run(["umount", str(mnt)])


def test_a_data_dir_whose_sessions_is_a_file_refuses_to_start(tmp_path):
    """DATA_DIR/sessions a regular file: the server said ready and every session made was a 500."""
    from conftest import run
    (tmp_path / "sessions").write_text("not a directory")
    p = run("serve", "--data-dir", tmp_path, "--port", "0", timeout=60)
    assert p.returncode == 1 and b"is not a directory" in p.stderr, p.stderr


def test_a_second_server_on_a_data_dir_in_use_refuses_to_start(tmp_path):
    """A second server on a running one's data directory listed its sessions as failed ("already
    open elsewhere"), could delete them, and the first one's next chunk was a 500. It refuses to
    start now; once the first is gone (even killed) the directory is free."""
    from conftest import run
    a = Server(tmp_path / "d").start()
    try:
        p = run("serve", "--data-dir", tmp_path / "d", "--port", "0", timeout=60)
        assert p.returncode == 1 and b"in use by another potserve" in p.stderr, p.stderr
    finally:
        a.kill()
    b = Server(tmp_path / "d").start()
    assert b.stop() == 0


def test_a_chunk_after_the_data_dir_was_deleted_is_not_acknowledged(tmp_path):
    """The data directory removed under a running server (an operator's
    mistake): chunks were still acknowledged 200, into files no restart would
    find. The commit sees its log unlinked: 500, nothing acknowledged."""
    import shutil
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--threads", "1").start()
    try:
        sid = new_session(s)
        st, body, _ = upload(s, sid, text(5).encode(), "?seq=1")
        assert st == 200, body
        shutil.rmtree(tmp_path / "d")
        st, body, _ = upload(s, sid, text(5, seed=3).encode(), "?seq=2")
        assert st == 500 and body["error"]["code"] == "storage_error" and "was removed" in body["error"]["message"], body
    finally:
        s.stop()


def test_a_session_whose_log_cannot_be_opened_at_start_is_failed_not_gone(tmp_path):
    """A session whose chunk log cannot be opened at start (here a directory
    stands in its place) was skipped: 404 to its owner, as if deleted. It is
    listed as failed, with why, and can be deleted."""
    import shutil
    s = Server(tmp_path / "d", "--budget-tokens", "64", "--threads", "1").start()
    try:
        sid = new_session(s)
        assert upload(s, sid, text(5).encode(), "?seq=1")[0] == 200
        assert s.stop() == 0
        log = tmp_path / "d" / "sessions" / sid / "chunks.log"
        log.unlink()
        log.mkdir()
        s.start()
        got = session(s, sid)
        assert got["status"] == "failed" and "Is a directory" in got["error"], got
        assert upload(s, sid, b"more. ", "?seq=2")[0] == 409
        for method, path, body in (("GET", f"/v1/sessions/{sid}/text?start=0", None),
                                   ("GET", f"/v1/sessions/{sid}/retention", None),
                                   ("POST", "/v1/chat/completions", {"session": sid, "max_tokens": 2,
                                                                     "messages": [{"role": "user", "content": "Hi?"}]})):
            st, body, h = s.request(method, path, body)
            assert st == 409 and body["error"]["code"] == "session_failed", (path, body)
            assert h.get("x-should-retry") == "false", h  # retrying cannot mend it
        # OpenAI's clients retry every 409 unless told not to: the question was sent 3 times
        import openai
        def asked():  # access-log lines of questions, once they stop coming (read from stderr by a thread)
            count = -1
            while count != (now := sum('"/v1/chat/completions"' in line for line in s.log_lines)):
                count = now
                time.sleep(0.3)
            return count
        before = asked()
        with pytest.raises(openai.ConflictError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=2).chat.completions.create(
                model="x", messages=[{"role": "user", "content": "Hi?"}], max_tokens=2, extra_body={"session": sid})
        assert asked() - before == 1, asked() - before
        assert s.request("DELETE", f"/v1/sessions/{sid}")[0] == 200
        assert s.request("GET", f"/v1/sessions/{sid}")[0] == 404
        assert s.stop() == 0
        shutil.rmtree(log, ignore_errors=True)
        s.start()
        assert s.request("GET", f"/v1/sessions/{sid}")[0] == 404  # the deletion held
    finally:
        s.stop()


def streamed_upload(s, sid, data, on_progress=None, seq=1):
    """A chunk sent with Accept: text/event-stream: the events as (name, data) pairs; on_progress
    runs once, at the first progress event."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    conn.request("POST", f"/v1/sessions/{sid}/chunks?seq={seq}", body=data,
                 headers={"Content-Type": "text/plain", "Accept": "text/event-stream"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    events, name = [], None
    for raw in resp:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[6:])))
            if name == "progress" and on_progress:
                on_progress()
                on_progress = None
    conn.close()
    return events


def test_a_streamed_chunks_error_event_says_its_status(tmp_path):
    """Once a chunk's progress streams, its 200 is sent: a failure comes as an `error` event, which
    said nothing of its kind, so the web page took a server stopping (to retry) for a refusal of the
    file (dropped). The error object carries the status the answer would have had."""
    s = Server(tmp_path / "d", "--threads", "1", "--shutdown-grace", "1", "--budget-tokens", "64").start()
    try:
        st, body, _ = s.request("POST", "/v1/sessions", {"policy": "none", "budget_tokens": 64})
        events = streamed_upload(s, body["id"], text(40).encode())
        assert events[-1][0] == "error", events
        err = events[-1][1]["error"]
        assert err["status"] == 422 and err["code"] == "document_too_long" and "retry_after" not in err, err
        sid = new_session(s)
        # under 128 KiB, the body is read at once and its progress streams while the engine reads it
        events = streamed_upload(s, sid, text(1500).encode(), on_progress=lambda: s.proc.send_signal(signal.SIGTERM))
        assert events[-1][0] == "error", events
        err = events[-1][1]["error"]
        assert err["status"] == 503 and err["retry_after"] == 1, err
        assert s.proc.wait(60) == 0
        s.start()
        assert session(s, sid)["last_seq"] == 0  # not kept: the same seq is taken again
        assert upload(s, sid, text(20).encode(), query="?seq=1")[0] == 200
    finally:
        s.stop()


def test_a_session_expires_on_time_however_busy_and_across_restarts(tmp_path):
    """ttl_seconds: a session whose questions kept coming was never swept (it skipped sessions
    answering), and was served up to 19 s past expires_at; a 429's Retry-After came a second too
    soon; a session whose time passed while the server was down was replayed at start (the server
    answering 503 meanwhile) and only then dropped."""
    s = Server(tmp_path / "d", "--threads", "1", "--budget-tokens", "64", "--max-sessions-per-key", "1").start()
    try:
        st, sess, _ = s.request("POST", "/v1/sessions", {"ttl_seconds": 3})
        sid, expires = sess["id"], sess["expires_at"]
        assert st == 201 and expires == sess["created"] + 3, sess
        assert upload(s, sid, text(10).encode())[0] == 200
        st, body, h = s.request("POST", "/v1/sessions", {})
        assert st == 429 and body["error"]["code"] == "too_many_sessions", body
        retry_at = time.time() + int(h["Retry-After"])
        answered = []  # (time the answer came, status)

        def ask():
            while time.time() < expires + 4:
                st, _, _ = s.request("POST", "/v1/completions", {"session": sid, "prompt": "The river", "max_tokens": 12})
                answered.append((time.time(), st))
        askers = [threading.Thread(target=ask) for _ in range(2)]
        for t in askers:
            t.start()
        for t in askers:
            t.join()
        served_after = [at - expires for at, st in answered if st == 200 and at > expires + 1]
        under_way = 30 if SANITIZED else 2.5  # the last answers under way end (a sanitizer's pace)
        assert not served_after or max(served_after) < under_way, served_after
        st, _, _ = s.request("POST", "/v1/completions", {"session": sid, "prompt": "The river", "max_tokens": 2})
        assert st == 404 and s.request("GET", f"/v1/sessions/{sid}")[0] == 404, answered[-4:]
        time.sleep(max(0, retry_at - time.time()))
        st, sess, _ = s.request("POST", "/v1/sessions", {"ttl_seconds": 2})  # room again when Retry-After said
        assert st == 201, sess
        sid = sess["id"]
        assert upload(s, sid, text(600).encode(), timeout=120)[0] == 200  # not final: no snapshot
        s.kill()
        time.sleep(max(0, sess["expires_at"] + 1.1 - time.time()))
        s.start()
        s.wait_log(f"session {sid} expired", timeout=5)
        assert not [line for line in s.log_lines if sid in line and "restored" in line], s.log_lines
        assert s.request("GET", f"/v1/sessions/{sid}")[0] == 404
        gone_by = time.time() + 5  # its files go from the thread pool
        while os.path.exists(os.path.join(s.data_dir, "sessions", sid)) and time.time() < gone_by:
            time.sleep(0.05)
        assert not os.path.exists(os.path.join(s.data_dir, "sessions", sid))
    finally:
        s.stop()


def test_a_limit_that_holds_no_default_session_says_so(tmp_path):
    """pot_memory_limit below one pot of the default budget started silently, and every create and
    every prompt beyond the window got a 429 with Retry-After, retried for ever."""
    s = Server(tmp_path / "d", "--pot-memory-limit", "20M").start()
    try:
        s.wait_log("holds no session of the default budget_tokens 2048", timeout=5)
        st, body, h = s.request("POST", "/v1/sessions", {})
        assert st == 422 and body["error"]["code"] == "pot_too_large" and "Retry-After" not in h, body
        long_prompt = "The river ran north past the mill. " * 1500  # beyond the 8K window: read through a pot
        st, body, h = s.request("POST", "/v1/chat/completions", {
            "max_tokens": 4, "messages": [{"role": "user", "content": long_prompt}, {"role": "user", "content": "Where?"}]})
        assert st == 422 and body["error"]["code"] == "pot_too_large" and body["error"]["param"] == "messages", body
        st, body, _ = s.request("POST", "/v1/sessions", {"budget_tokens": 256})  # one that fits
        assert st == 201, body
    finally:
        assert s.stop() == 0


def test_a_client_gone_before_its_body_frees_its_request_at_once(tmp_path):
    """Headers and the start of a body, then the client closes at once: MHD (woken only at epoll
    edges) missed the hang-up that came with the data, and each such request held its connection
    slot until idle_timeout (30 s). A client that sends its whole body and then shuts its side
    (half-close) still gets its answer."""
    srv = Server(tmp_path / "d", "--budget-tokens", "64").start()
    try:
        gone_before_the_body(srv)
    finally:
        assert srv.stop() == 0


def gone_before_the_body(srv):
    def open_requests():
        text = srv.request("GET", "/metrics")[1]
        return int(float(re.search(r"^potserve_open_requests (\S+)", text, re.M).group(1)))
    base = open_requests()
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", srv.port)) as c:
            c.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{")
    deadline = time.time() + 5
    while open_requests() > base and time.time() < deadline:
        time.sleep(0.2)
    assert open_requests() == base
    body = json.dumps(SETTINGS).encode()
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as c:
        c.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        c.shutdown(socket.SHUT_WR)
        assert c.recv(100).startswith(b"HTTP/1.1 201"), "a half-closed request was not answered"


def test_sessions_answer_as_soon_as_their_own_restore_ends(tmp_path):
    """After a crash every session is read again from its log. The whole server answered 503
    `loading` until the last of them was (75-183 s in a soak of 20 small sessions): now restores run
    one at a time, each session answers once its own ends (503 `loading` with Retry-After before),
    and everything else is served meanwhile; /health still says loading until the last."""
    s = Server(tmp_path / "d", "--threads", "1", "--budget-tokens", "256", "--snapshot-seconds", "0").start()
    ids = []
    for i in range(3):  # ~10 KB each: seconds of replay each
        ids.append(new_session(s))
        assert upload(s, ids[-1], text(140, seed=i * 1000).encode(), timeout=120)[0] == 200
    before = [session(s, sid) for sid in ids]
    s.kill()  # no snapshots: every log is replayed whole
    try:
        s.start(ready=False)
        seen = set()  # (health, session statuses) as they came
        while True:
            health = s.request("GET", "/health")[0]
            assert s.request("GET", "/v1/models")[0] == 200  # served from the start
            answers = [s.request("GET", f"/v1/sessions/{sid}") for sid in ids]
            for st, body, h in answers:
                assert st == 200 or (st == 503 and body["error"]["code"] == "loading" and h["Retry-After"] == "2"), body
            seen.add((health, tuple(st for st, _, _ in answers)))
            if health == 200:
                break
            time.sleep(0.2)
        assert any(h == 503 and 200 in sts and 503 in sts for h, sts in seen), seen  # some before others
        for sid, was in zip(ids, before):
            now = session(s, sid)
            assert now["status"] == "ready", now
            assert (now["bytes_received"], now["tokens_ingested"], now["tokens_in_pot"]) == \
                (was["bytes_received"], was["tokens_ingested"], was["tokens_in_pot"]), (was, now)
    finally:
        s.stop()


@pytest.mark.heavy
def test_work_submitted_during_a_long_restore_is_not_held_behind_it(tmp_path):
    """A session's replay after a crash was one engine task: a new session, an upload or a
    question submitted meanwhile waited for the whole replay (up to a minute's reading and more
    without a snapshot). The log is now fed a piece at a time, and the engine interleaves the
    pieces with other work: another session is made, fed and answered while the long one is
    still being read, and the long one comes back exactly as it was."""
    s = Server(tmp_path / "d", "--threads", "1", "--budget-tokens", "256", "--snapshot-seconds", "0").start()
    try:
        long_id = new_session(s)
        assert upload(s, long_id, text(450).encode(), timeout=300)[0] == 200  # ~10K tokens: 10-20 s of reading
        before = session(s, long_id)
        probe = {"session": long_id, "messages": [{"role": "user", "content": "Which sentence speaks of the meadow?"}],
                 "max_tokens": 12, "temperature": 0}
        st, answer_before, _ = s.request("POST", "/v1/chat/completions", probe, timeout=300)
        assert st == 200, answer_before
        s.kill()  # no snapshot: its whole log is read again
        s.start(ready=False)
        assert s.request("GET", f"/v1/sessions/{long_id}")[0] == 503  # still being read
        t0 = time.time()
        other = new_session(s)
        assert upload(s, other, b"The lantern stands by the orchard gate.", timeout=300)[0] == 200
        st, body, _ = s.request("POST", "/v1/chat/completions", {
            "session": other, "messages": [{"role": "user", "content": "Where is the lantern?"}],
            "max_tokens": 4}, timeout=300)
        took = time.time() - t0
        assert st == 200, body
        st, body, _ = s.request("GET", f"/v1/sessions/{long_id}")
        assert st == 503 and body["error"]["code"] == "loading", \
            f"the other session's work ({took:.1f} s) waited for the whole replay"
        s.wait_log(f"session {long_id}: restored", timeout=600)
        now = session(s, long_id)
        assert (now["status"], now["bytes_received"], now["tokens_ingested"], now["tokens_in_pot"]) == \
            ("ready", before["bytes_received"], before["tokens_ingested"], before["tokens_in_pot"]), (before, now)
        st, answer_after, _ = s.request("POST", "/v1/chat/completions", probe, timeout=300)
        assert st == 200 and answer_after["choices"][0]["message"]["content"] == \
            answer_before["choices"][0]["message"]["content"], (answer_before, answer_after)  # the same pot
    finally:
        s.stop()


def test_a_snapshot_after_so_much_reading_bounds_a_replay(tmp_path):
    """Snapshots came only every snapshot_bytes (4 MiB: about a million tokens, many minutes of
    reading on a CPU), so a crash could leave that much to read again at the next start. A pot is
    also saved once snapshot_seconds of reading have passed since the last: the restart after a
    SIGKILL reads from that snapshot, not the whole log."""
    s = Server(tmp_path / "d", "--threads", "1", "--snapshot-bytes", "1G", "--snapshot-seconds", "1").start()
    try:
        sid = new_session(s)
        for seq in (1, 2, 3):  # each chunk a second or more of reading, one thread
            assert upload(s, sid, text(60, seed=seq * 100).encode(), timeout=120)[0] == 200
        before = session(s, sid)
        snap = os.path.join(s.data_dir, "sessions", sid, "pot.snap")
        deadline = time.time() + 10
        while not os.path.exists(snap) and time.time() < deadline:
            time.sleep(0.1)
        assert os.path.exists(snap), "no snapshot after seconds of reading"
        s.kill()
        s.start()
        s.wait_log(f"session {sid}: restored")
        assert "from its snapshot" in s.wait_log(f"session {sid}: restored")
        now = session(s, sid)
        assert (now["bytes_received"], now["tokens_ingested"], now["tokens_in_pot"]) == \
            (before["bytes_received"], before["tokens_ingested"], before["tokens_in_pot"]), (before, now)
    finally:
        s.stop()
