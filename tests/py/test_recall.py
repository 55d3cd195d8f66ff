"""Recall (server/recall.c, engine/recall.h): `"recall": true` on a request
over a session, or the session setting `recall`, puts the passages of the
session's logged document that share the question's words before the
question, answered over the session's own pot. Against a real server on
loopback with the re-read tests' document: a pass key the 512-entry pot lost
is found with recall, in milliseconds of search instead of a re-read; the
session's pot is not touched; streamed answers say what was recalled."""
import json
import urllib.request

import pytest

from server_util import Server
from test_reread import KEY, QUESTION, ask, natural_document, session_with


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model):
    s = Server(tmp_path_factory.mktemp("data"), "--budget-tokens", "512")
    s.start()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def lost(srv):
    """A session whose question-agnostic pot lost the pass key."""
    up = session_with(srv, natural_document(1, 10000), budget_tokens=512, keep_tokens=256)
    assert up["compressions"] > 0 and up["recall"] is False
    st, plain, _ = ask(srv, up["id"])
    assert st == 200 and KEY not in plain["choices"][0]["message"]["content"] and "recall" not in plain
    return up, plain


def test_recall_finds_what_the_pot_lost(srv, lost):
    up, plain = lost
    st, rc, _ = ask(srv, up["id"], recall=True)
    assert st == 200, rc
    assert KEY in rc["choices"][0]["message"]["content"]
    r = rc["recall"]
    assert r["passages"] >= 1 and r["candidates"] > r["passages"]
    assert 0 < r["bytes"] <= 4096 + 2 * (r["passages"] - 1)  # recall_bytes, and the blank lines between
    assert r["document_bytes"] == up["bytes_received"] and 0 < r["seconds"] < 30 and r["log_seconds"] >= 0
    # the passages were read as prompt, after the same pot
    assert rc["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 100
    # the session's pot is not changed by a recall
    st, again, _ = ask(srv, up["id"])
    assert again["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    st, sess, _ = srv.request("GET", f"/v1/sessions/{up['id']}")
    assert sess["tokens_in_pot"] == up["tokens_in_pot"]
    # /v1/completions: the prompt is the question
    st, c, _ = srv.request("POST", "/v1/completions", {"model": "x", "max_tokens": 20, "temperature": 0,
                                                       "session": up["id"], "prompt": QUESTION, "recall": True})
    assert st == 200 and c["recall"]["passages"] >= 1 and KEY in c["choices"][0]["text"], c


def test_session_setting_override_and_stream(srv):
    up = session_with(srv, natural_document(1, 10000), budget_tokens=512, keep_tokens=256, recall=True)
    assert up["recall"] is True
    st, sess, _ = srv.request("GET", f"/v1/sessions/{up['id']}")
    assert sess["recall"] is True
    st, off, _ = ask(srv, up["id"], recall=False)  # the request overrides the session
    assert st == 200 and "recall" not in off and KEY not in off["choices"][0]["message"]["content"]
    body = {"model": "x", "max_tokens": 12, "temperature": 0, "session": up["id"], "stream": True,
            "messages": [{"role": "user", "content": QUESTION}]}
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read().decode()
    comments = [x for x in raw.split("\n\n") if x.startswith(": recall")]
    assert comments[0] == ": recall started" and len(comments) == 2, comments
    words = comments[1].split()
    assert words[:2] == [":", "recall"] and int(words[2]) >= 1 and words[3] == "passages", comments
    text = "".join(json.loads(x[6:])["choices"][0]["delta"].get("content") or ""
                   for x in raw.split("\n\n") if x.startswith("data: {"))
    assert KEY in text
    assert raw.rstrip().endswith("data: [DONE]")


def test_question_sharing_no_word(srv, lost):
    up, _ = lost
    body = {"model": "x", "max_tokens": 4, "temperature": 0, "session": up["id"], "recall": True,
            "messages": [{"role": "user", "content": "Qzxv wplk?"}]}
    st, rc, _ = srv.request("POST", "/v1/chat/completions", body)
    assert st == 200 and rc["recall"]["passages"] == 0 and rc["recall"]["bytes"] == 0, rc


def test_recall_errors(srv, lost):
    up, _ = lost
    body = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    st, e, _ = srv.request("POST", "/v1/chat/completions", dict(body, recall=True))
    assert st == 400 and e["error"]["param"] == "recall"  # no session
    st, e, _ = srv.request("POST", "/v1/chat/completions", dict(body, session=up["id"], recall="yes"))
    assert st == 400 and e["error"]["code"] == "invalid_type" and e["error"]["param"] == "recall"
    st, e, _ = srv.request("POST", "/v1/chat/completions", dict(body, session=up["id"], recall=True, reread=True))
    assert st == 400 and e["error"]["param"] == "recall" and "exclude" in e["error"]["message"]
    st, e, _ = srv.request("POST", "/v1/chat/completions", dict(body, session="nope", recall=True))
    assert st == 404
    st, e, _ = srv.request("POST", "/v1/chat/completions",
                           dict(body, session=up["id"], recall=True, messages=[{"role": "system", "content": "x"}]))
    assert st == 400 and "question" in e["error"]["message"]
    st, e, _ = srv.request("POST", "/v1/sessions", {"recall": 1})
    assert st == 400 and e["error"]["param"] == "recall"
    # the session still answers
    st, ok, _ = ask(srv, up["id"], recall=True)
    assert st == 200
