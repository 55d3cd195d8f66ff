"""Sliding-window layers through the HTTP API, on the tiny gemma3 fixture
(build/fixtures/tiny_gemma3.gguf: window 4, five sliding layers and one
global): a session's sliding layers keep rings (`ring_entries`, counted in
`memory_bytes`), `/retention` shows them as the last window - 1 positions
beside the global layer's policy-chosen entries, and a keep below the window
is refused with the API's error shape. A real server process on loopback."""
import pytest

from conftest import FIXTURES
from server_util import Server

KEY = "test-key-sliding-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
WINDOW = 4


@pytest.fixture(scope="module")
def srv(tmp_path_factory, fixtures):
    # the later --model wins over the default one server_util passes
    s = Server(tmp_path_factory.mktemp("swa"), "--model", FIXTURES / "tiny_gemma3.gguf", "--api-key", KEY)
    s.start()
    yield s
    assert s.stop() == 0


def document():
    return " ".join(f"The keeper of light {i} wrote {i * 7} lines in the log that night." for i in range(12))


def test_sliding_layers_keep_rings_and_retention_shows_their_window(srv):
    settings = {"budget_tokens": 48, "keep_tokens": 20, "chunk_tokens": 12, "policy": "infinipot"}
    st, sess, _ = srv.request("POST", "/v1/sessions", settings, AUTH)
    assert st == 201, sess
    sid = sess["id"]
    st, up, _ = srv.request("POST", f"/v1/sessions/{sid}/chunks?final=true", raw=document().encode(),
                            headers=dict(AUTH, **{"Content-Type": "text/plain; charset=utf-8"}))
    assert st == 200, up
    assert up["compressions"] >= 2 and up["tokens_ingested"] > 100
    st, sess, _ = srv.request("GET", f"/v1/sessions/{sid}", headers=AUTH)
    # a ring holds window - 1 entries plus one chunk (and its scoring rows): far below the budget
    assert WINDOW - 1 + 12 <= sess["ring_entries"] < 48 + 100
    st, ret, _ = srv.request("GET", f"/v1/sessions/{sid}/retention?bins=8", headers=AUTH)
    assert st == 200, ret
    kinds = [layer["attention"] for layer in ret["layers"]]
    assert kinds.count("sliding") == 5 and kinds.count("global") == 1
    n = ret["tokens_ingested"]
    for layer in ret["layers"]:
        kept = sum(layer["kept_per_bin"])
        if layer["attention"] == "sliding":
            assert layer["window"] == WINDOW
            # the last window - 1 document positions, all in the last bin
            assert kept == WINDOW - 1 and layer["kept_per_bin"][-1] == WINDOW - 1
        else:
            assert "window" not in layer
            assert WINDOW - 1 < kept <= 48 and kept < n  # what the policy kept, within the budget


def test_keep_below_the_window_is_refused(srv):
    st, body, _ = srv.request("POST", "/v1/sessions", {"budget_tokens": 48, "keep_tokens": 2}, AUTH)
    assert st == 422, body
    assert "sliding window - 1 (3)" in body["error"]["message"]
