"""A short run of the HTTP/JSON fuzzer (tests/fuzz/http_fuzz.py; `make fuzz`
runs it for FUZZ_SECONDS) against a real server, and regression tests for
what the harness found (issue 21's bugs included, fixed since)."""
import json
import socket
import subprocess
import sys

import pytest

from conftest import BIN, ROOT, run
from server_util import Server

SECONDS = 25


@pytest.fixture(scope="module")
def fuzz_run(tmp_path_factory, fixtures):
    # the tiny fixture model: HTTP and JSON handling are under test; with it the
    # run makes about 2,000 requests in its seconds, with the default model ~500
    out = tmp_path_factory.mktemp("fuzz") / "result.json"
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz" / "http_fuzz.py"), "--bin", str(BIN),
                        "--model", str(fixtures / "tiny_llama.gguf"), "--seconds", str(SECONDS), "--seed", "21",
                        "--json-out", str(out)],
                       capture_output=True, text=True, timeout=SECONDS + 300)
    print(p.stdout[-4000:], p.stderr[-2000:])
    assert out.exists(), p.stderr
    return p.returncode, json.loads(out.read_text())


def test_http_fuzz_finds_nothing_new(fuzz_run):
    """No crash, no hang past the timeouts, no undocumented 5xx, JSON errors,
    /health always answered, SIGTERM exits 0 -- apart from known bugs."""
    rc, res = fuzz_run
    assert res["executions"] >= 100, res
    assert set(res["by_generator"]) == {"grammar", "json", "upload", "files", "session"}, res["by_generator"]
    assert res["health_polls"] > 0
    assert not res["new"], json.dumps(res["new"], indent=1)
    assert rc == 0


@pytest.fixture(scope="module")
def fuzz_replica_run(tmp_path_factory, fixtures):
    """The same against a replica whose store is a local Redis (--redis): the shared store's
    paths (takeovers, lease renewals, files and lists read from Redis). Its first run found the
    loop held for idle_timeout (docs/reliability.md). This server has no API key (--keyless):
    requests come with this machine's Host names and other sites' names and pages, and another
    site's is never answered with success (the keyed run above covers keys)."""
    from cluster_util import have_cluster_tools
    if not have_cluster_tools():
        pytest.skip("redis-server not installed (make deps)")
    out = tmp_path_factory.mktemp("fuzz-replica") / "result.json"
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz" / "http_fuzz.py"), "--bin", str(BIN),
                        "--model", str(fixtures / "tiny_llama.gguf"), "--seconds", "20", "--seed", "22", "--redis", "--keyless",
                        "--json-out", str(out)],
                       capture_output=True, text=True, timeout=20 + 300)
    print(p.stdout[-4000:], p.stderr[-2000:])
    assert out.exists(), p.stderr
    return p.returncode, json.loads(out.read_text())


def test_http_fuzz_of_a_replica_finds_nothing_new(fuzz_replica_run):
    rc, res = fuzz_replica_run
    assert res["executions"] >= 100, res
    assert res["loop_lag_max_s"] is not None and res["loop_lag_max_s"] < 1.5, res.get("loop_lag_max_s")
    sites = res["sites"]  # both kinds sent, and both answered (403s, and successes for this machine's)
    assert sites["other_site"].get("403", 0) >= 20 and any(k.isdigit() and int(k) < 300 for k in sites["own_site"]), sites
    assert not res["new"], json.dumps(res["new"], indent=1)
    assert rc == 0


@pytest.mark.xfail(reason="libmicrohttpd 0.9.75 answers framing it cannot parse (bad chunked encoding, a "
                          "non-numeric Content-Length, a chunk size past 2^64) itself with a built-in HTML 400/413 page "
                          "(mhd_html_malformed_request; no hook lets the server send JSON; see KNOWN in "
                          "tests/fuzz/http_fuzz.py)",
                   strict=False)
def test_http_fuzz_known_bugs_are_gone(fuzz_run):
    rc, res = fuzz_run
    assert not res["known"], json.dumps(res["known"], indent=1)


def test_startup_errors_exit_with_status_1(tmp_path, model):
    """A bad setting found after the loop was set up (a short key in the keys
    file, unusable data_dir, missing model) is a message and exit status 1, not
    a crash in the shutdown path (it used to stop a libuv handle that was never
    started). (A short --api-key is refused earlier, with the other settings: exit 2.)"""
    keys = tmp_path / "keys"
    keys.write_text("short\n")
    for flags in (["--api-keys-file", str(keys)], ["--data-dir", "/proc/no/such/dir"],
                  ["--model", str(tmp_path / "missing.gguf")]):
        p = run("serve", "--model", model, "--port", "0", "--data-dir", tmp_path / "d", *flags, timeout=120)
        assert p.returncode == 1, (flags, p.returncode, p.stderr.decode()[-500:])
        assert b"potserve serve:" in p.stderr


def test_sse_upload_refused_before_its_stream_gets_a_json_error(tmp_path):
    """An upload asking for progress events (Accept: text/event-stream) that is
    refused at the end of its body (invalid UTF-8) gets its 400 as JSON; it used
    to get no answer at all (the error went into an event stream never begun)."""
    s = Server(tmp_path / "data", "--budget-tokens", "64").start()
    try:
        for body in (b"\x80", b"valid text then \xff"):
            st, ses, _ = s.request("POST", "/v1/sessions", {})  # a new one: the last is rebuilt after the 400
            c = socket.create_connection(("127.0.0.1", s.port), timeout=20)
            c.sendall((f"POST /v1/sessions/{ses['id']}/chunks HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
                       f"Content-Type: text/plain\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode()
                      + body)
            resp = b""
            while True:
                d = c.recv(65536)
                if not d:
                    break
                resp += d
            c.close()
            head, _, payload = resp.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), resp[:300]
            assert json.loads(payload)["error"]["code"] == "invalid_utf8"
        st, after, _ = s.request("GET", f"/v1/sessions/{ses['id']}")
        assert after["last_seq"] == 0 and after["bytes_received"] == 0, after
        assert s.stop() == 0
    finally:
        s.kill()


def test_schemathesis_findings_stay_fixed(tmp_path):
    """What Schemathesis and the fuzzer found, one request each: an empty final
    chunk (was 500), top_p 0 (was 503), a body of NULs (created a session),
    405 without Allow, a misspelt ?wait (was taken as false)."""
    s = Server(tmp_path / "data", "--budget-tokens", "64").start()
    try:
        st, ses, _ = s.request("POST", "/v1/sessions", {})
        sid = ses["id"]
        st, body, _ = s.request("POST", f"/v1/sessions/{sid}/chunks", raw=b"Some text.",
                                headers={"Content-Type": "text/plain"})
        assert st == 200, body
        st, body, _ = s.request("POST", f"/v1/sessions/{sid}/chunks?final=true", raw=b"",
                                headers={"Content-Type": "text/plain"})
        assert st == 200 and body["final"] is True and body["last_seq"] == 2, body
        st, body, _ = s.request("POST", "/v1/completions", {"prompt": "The", "max_tokens": 2, "top_p": 0})
        assert st == 200, body
        st, body, _ = s.request("POST", "/v1/sessions", raw=b"\x00\x00", headers={"Content-Type": "application/json"})
        assert st == 400 and body["error"]["code"] == "invalid_json", body
        # valid JSON holding \u0000 (text from a PDF): said plainly (it leaked "JSON_ALLOW_NUL", a library flag)
        st, body, _ = s.request("POST", "/v1/chat/completions",
                                raw=b'{"messages":[{"role":"user","content":"a\\u0000b"}],"max_tokens":1}',
                                headers={"Content-Type": "application/json"})
        assert st == 400 and body["error"]["code"] == "unsupported_value", body
        assert "NUL" in body["error"]["message"] and "ALLOW" not in body["error"]["message"], body
        for method, path, allow in (("PUT", f"/v1/sessions/{sid}", "GET, HEAD, DELETE"), ("GET", f"/v1/sessions/{sid}/chunks", "POST, PUT"),
                                    ("DELETE", "/v1/sessions", "GET, HEAD, POST"), ("POST", "/health", "GET, HEAD")):
            st, body, hdrs = s.request(method, path)
            assert st == 405 and hdrs.get("Allow") == allow, (method, path, st, hdrs)
        st, body, _ = s.request("GET", f"/v1/sessions/{sid}/nothing")
        assert st == 404, body
        st, ses2, _ = s.request("POST", "/v1/sessions", {})
        st, body, _ = s.request("POST", f"/v1/sessions/{ses2['id']}/chunks?wait=ture", raw=b"x",
                                headers={"Content-Type": "text/plain"})
        assert st == 400 and body["error"]["param"] == "wait", body
        st, after, _ = s.request("GET", f"/v1/sessions/{ses2['id']}")
        assert after["last_seq"] == 0, after
        assert s.stop() == 0
    finally:
        s.kill()


def test_pinned_prefix_longer_than_the_pot_keeps_is_422(tmp_path, fixtures):
    """Schemathesis, once the tiny model served it: a chat request whose tools'
    definitions alone pass the 256-token window goes to a temporary pot, whose
    pinned prefix (template + tools) cannot be shorter than what a compression
    keeps (32 of 64): that is the request's doing, 422 as at session creation,
    not a 500."""
    s = Server(tmp_path / "data", "--model", fixtures / "tiny_llama.gguf", "--budget-tokens", "64").start()
    try:
        tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 8,
                                                   "parameters": {}}} for i in range(4)]
        st, body, _ = s.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hello"}], "tools": tools, "max_tokens": 2})
        assert st == 422 and body["error"]["code"] == "overflow_failed", (st, body)
        assert "pinned prefix" in body["error"]["message"] and "keep_tokens 32" in body["error"]["message"], body
        st, body, _ = s.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2})
        assert st == 200, body  # the server is fine after it
        assert s.stop() == 0
    finally:
        s.kill()
