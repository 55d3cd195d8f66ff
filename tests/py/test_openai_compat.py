"""OpenAI-compatibility details against a real server: the official `openai`
client's exception classes for the new 400s, system_fingerprint, CORS
preflight and headers, and cancellation of a non-streamed generation whose
client disconnects. Structured outputs (response_format) are tested in
test_structured.py."""
import json
import re
import socket
import time

import openai
import pytest

from server_util import Server

KEY = "compat-key-0123456789"
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model):
    s = Server(tmp_path_factory.mktemp("data"), "--api-key", KEY, "--cors-origins",
               f"{ORIGIN}, https://other.example")
    s.start()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def auth(**extra):
    return dict({"Authorization": f"Bearer {KEY}"}, **extra)


def metric(srv, name):
    st, text, _ = srv.request("GET", "/metrics", headers=auth())
    assert st == 200
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1))


def test_max_tokens_zero_or_negative_is_a_400_naming_the_field(client):
    msgs = [{"role": "user", "content": "Hi"}]
    for field in ("max_tokens", "max_completion_tokens"):
        for v in (0, -3):
            with pytest.raises(openai.BadRequestError) as ei:
                client.chat.completions.create(model="x", messages=msgs, **{field: v})
            assert ei.value.body["param"] == field, ei.value.body
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model="x", prompt="Hi", max_tokens=0)
    assert ei.value.body["param"] == "max_tokens"


def test_system_fingerprint_on_completions_and_chunks(client):
    msgs = [{"role": "user", "content": "Say hi"}]
    a = client.chat.completions.create(model="x", messages=msgs, max_tokens=3, temperature=0)
    assert re.fullmatch(r"fp_[0-9a-f]{12}", a.system_fingerprint)
    b = client.completions.create(model="x", prompt="Hello", max_tokens=3, temperature=0)
    assert b.system_fingerprint == a.system_fingerprint
    chunks = list(client.chat.completions.create(model="x", messages=msgs, max_tokens=3, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks and all(c.system_fingerprint == a.system_fingerprint for c in chunks)


def test_request_timeout_finishes_with_length(tmp_path):
    s = Server(tmp_path, "--request-timeout", "1")
    s.start()
    try:
        st, body, _ = s.request("POST", "/v1/completions",
                                {"prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0,
                                 "logit_bias": {"2": -100, "0": -100}})
        assert st == 200, body
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] < 4000
    finally:
        s.stop()


def test_cors_preflight_before_auth(srv):
    h = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
         "Access-Control-Request-Headers": "authorization, content-type"}
    st, _, hdrs = srv.request("OPTIONS", "/v1/chat/completions", headers=h)
    assert st == 204
    assert hdrs["Access-Control-Allow-Origin"] == ORIGIN
    assert "POST" in hdrs["Access-Control-Allow-Methods"]
    allowed = {x.strip().lower() for x in hdrs["Access-Control-Allow-Headers"].split(",")}
    assert {"authorization", "content-type", "x-session-id", "x-chunk-seq"} <= allowed
    # an origin that is not listed gets no permission
    st, _, hdrs = srv.request("OPTIONS", "/v1/chat/completions", headers=dict(h, Origin="https://evil.example"))
    assert "Access-Control-Allow-Origin" not in hdrs


def test_cors_headers_on_answers_errors_and_streams(srv):
    o = {"Origin": ORIGIN}
    st, _, hdrs = srv.request("GET", "/v1/models", headers=auth(**o))
    assert st == 200 and hdrs["Access-Control-Allow-Origin"] == ORIGIN
    st, _, hdrs = srv.request("GET", "/v1/models", headers=o)  # no key: 401, still readable
    assert st == 401 and hdrs["Access-Control-Allow-Origin"] == ORIGIN
    st, _, hdrs = srv.request("POST", "/v1/chat/completions", {"messages": []}, auth(**o))
    assert st == 400 and hdrs["Access-Control-Allow-Origin"] == ORIGIN
    st, text, hdrs = srv.request("POST", "/v1/completions",
                                 {"prompt": "Hi", "max_tokens": 2, "stream": True}, auth(**o))
    assert st == 200 and "[DONE]" in text and hdrs["Access-Control-Allow-Origin"] == ORIGIN
    st, _, hdrs = srv.request("GET", "/v1/models", headers=auth())  # no Origin: no CORS headers
    assert "Access-Control-Allow-Origin" not in hdrs


def test_cors_off_by_default(tmp_path):
    s = Server(tmp_path)
    s.start()
    try:
        st, _, hdrs = s.request("OPTIONS", "/v1/models", headers={"Origin": ORIGIN})
        assert st == 405 and "Access-Control-Allow-Origin" not in hdrs
    finally:
        s.stop()


def test_non_streamed_generation_stops_when_the_client_leaves(srv, client):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "temperature": 0,
                       "logit_bias": {"2": -100, "0": -100}}).encode()
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
           f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    steps0 = metric(srv, "potserve_decode_steps_total")
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall(req)
    time.sleep(1.0)
    assert metric(srv, "potserve_active_generations") == 1
    assert metric(srv, "potserve_decode_steps_total") > steps0  # it is generating
    sock.close()
    deadline = time.time() + 10
    while metric(srv, "potserve_active_generations") and time.time() < deadline:
        time.sleep(0.1)
    assert metric(srv, "potserve_active_generations") == 0
    stopped = metric(srv, "potserve_decode_steps_total")
    time.sleep(1.0)
    assert metric(srv, "potserve_decode_steps_total") == stopped
    assert stopped - steps0 < 500  # far from the 3000 asked for
    # the engine is free for the next request
    r = client.completions.create(model="x", prompt="Hello", max_tokens=3, temperature=0)
    assert r.choices[0].text
