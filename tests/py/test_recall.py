"""Recall (server/recall.c, engine/recall.h): `"recall": true` on a request
over a session, or the session setting `recall`, puts the passages of the
session's logged document that share the question's words before the
question, answered over the session's own pot. Against a real server on
loopback with the re-read tests' document (test_reread.py): a pass key the
512-entry pot lost is found with recall, within the server's recall_bytes;
the session's pot is not touched; streamed answers say what was recalled; a
question that shares no word with the document is answered without passages."""
import json
import time
import urllib.request

import pytest

from server_util import Server
from test_reread import KEY, QUESTION, ask, natural_document, session_with

RECALL_BYTES = 2048  # the servers' recall_bytes: half the default, so the setting is seen to hold


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model):
    s = Server(tmp_path_factory.mktemp("data"), "--budget-tokens", "512", "--recall-bytes", RECALL_BYTES)
    s.start()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def lost(srv):
    """A session whose question-agnostic pot lost the pass key (as in test_reread), and its plain answer."""
    up = session_with(srv, natural_document(1, 10000), budget_tokens=512, keep_tokens=256)
    assert up["compressions"] > 0 and up["recall"] is False
    st, plain, _ = ask(srv, up["id"])
    assert st == 200 and KEY not in plain["choices"][0]["message"]["content"] and "recall" not in plain
    return up, plain


def test_recall_finds_what_the_pot_lost(srv, lost):
    up, plain = lost
    st, rc, _ = ask(srv, up["id"], recall=True)
    assert st == 200, rc
    assert KEY in rc["choices"][0]["message"]["content"], rc
    r = rc["recall"]
    assert r["passages"] >= 1 and r["candidates"] > r["passages"], r
    # the needle's paragraph at least, within the budget (many paragraphs share "the", "is", "what")
    assert len(f"The pass key is {KEY}. Remember it. {KEY} is the pass key.") <= r["bytes"] <= RECALL_BYTES, r
    assert r["document_bytes"] == up["bytes_received"] and 0 < r["seconds"] < 60 and 0 <= r["log_seconds"] <= r["seconds"]
    # the passages were read as prompt, after the same pot
    assert rc["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 100
    assert rc["usage"]["prompt_tokens_details"]["cached_tokens"] == plain["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the session's pot is not changed by a recall: the plain answer is the same as before it
    st, again, _ = ask(srv, up["id"])
    assert st == 200 and "recall" not in again
    assert again["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert again["usage"] == plain["usage"]
    st, sess, _ = srv.request("GET", f"/v1/sessions/{up['id']}")
    assert sess["tokens_in_pot"] == up["tokens_in_pot"]
    # /v1/completions: the prompt is the question
    st, c, _ = srv.request("POST", "/v1/completions", {"model": "x", "max_tokens": 20, "temperature": 0,
                                                       "session": up["id"], "prompt": QUESTION, "recall": True})
    assert st == 200 and c["recall"]["passages"] >= 1 and KEY in c["choices"][0]["text"], c


def stream(srv, body):
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read().decode()


def test_session_setting_override_and_stream(srv):
    up = session_with(srv, natural_document(1, 10000), budget_tokens=512, keep_tokens=256, recall=True)
    assert up["recall"] is True and up["reread"] is False
    st, off, _ = ask(srv, up["id"], recall=False)  # the request overrides the session
    assert st == 200 and "recall" not in off and KEY not in off["choices"][0]["message"]["content"]
    # no "recall" field: the session's setting; streamed
    raw = stream(srv, {"model": "x", "max_tokens": 12, "temperature": 0, "session": up["id"], "stream": True,
                       "messages": [{"role": "user", "content": QUESTION}]})
    events = raw.split("\n\n")
    comments = [x for x in events if x.startswith(": recall")]
    assert comments[0] == ": recall started" and len(comments) == 2, comments
    words = comments[1].split()  # ": recall P passages (B bytes) in S s"
    assert words[:2] == [":", "recall"] and int(words[2]) >= 1 and words[3] == "passages", comments
    assert 0 < int(words[4].lstrip("(")) <= RECALL_BYTES and words[5] == "bytes)" and words[-1] == "s", comments
    first_data = next(i for i, x in enumerate(events) if x.startswith("data: "))
    assert events.index(comments[1]) < first_data  # before the first chunk
    text = "".join(json.loads(x[6:])["choices"][0]["delta"].get("content") or ""
                   for x in events if x.startswith("data: {"))
    assert KEY in text, raw
    assert raw.rstrip().endswith("data: [DONE]")


def test_question_sharing_no_word(srv, lost):
    up, _ = lost
    body = {"model": "x", "max_tokens": 4, "temperature": 0, "session": up["id"], "recall": True,
            "messages": [{"role": "user", "content": "Qzxv wplk?"}]}
    st, rc, _ = srv.request("POST", "/v1/chat/completions", body)
    assert st == 200 and rc["recall"]["passages"] == 0 and rc["recall"]["bytes"] == 0, rc
    assert rc["recall"]["candidates"] > 0 and rc["choices"][0]["message"]["content"], rc


def test_recall_errors(srv, lost):
    up, _ = lost
    body = {"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    chat = "/v1/chat/completions"
    st, e, _ = srv.request("POST", chat, dict(body, recall=True))  # no session
    assert st == 400 and e["error"]["code"] == "invalid_value" and e["error"]["param"] == "recall", e
    st, e, _ = srv.request("POST", "/v1/completions", {"prompt": "hi", "recall": True})
    assert st == 400 and e["error"]["param"] == "recall", e
    st, e, _ = srv.request("POST", chat, dict(body, session=up["id"], recall="yes"))  # as every boolean field
    assert st == 400 and e["error"]["code"] == "invalid_type" and e["error"]["param"] == "recall", e
    st, e, _ = srv.request("POST", chat, dict(body, session=up["id"], recall=True, reread=True))
    assert st == 400 and e["error"]["param"] == "recall" and "exclude" in e["error"]["message"], e
    st, e, _ = srv.request("POST", chat, dict(body, session="sess_nope", recall=True))
    assert st == 404 and e["error"]["code"] == "session_not_found", e
    st, e, _ = srv.request("POST", chat, dict(body, session=up["id"], recall=True,
                                              messages=[{"role": "system", "content": "x"}]))
    assert st == 400 and e["error"]["param"] == "messages" and "question" in e["error"]["message"], e
    # the session settings
    st, e, _ = srv.request("POST", "/v1/sessions", {"recall": 1})
    assert st == 400 and e["error"]["param"] == "recall", e
    st, e, _ = srv.request("POST", "/v1/sessions", {"recall": True, "reread": True})
    assert st == 400 and e["error"]["param"] == "recall" and "exclude" in e["error"]["message"], e
    # a session that re-reads by default: a request's recall must turn the re-read off
    st, rr, _ = srv.request("POST", "/v1/sessions", {"reread": True})
    assert st == 201 and rr["reread"] is True and rr["recall"] is False
    st, e, _ = srv.request("POST", chat, dict(body, session=rr["id"], recall=True))
    assert st == 400 and e["error"]["param"] == "recall" and "exclude" in e["error"]["message"], e
    st, ok, _ = srv.request("POST", chat, dict(body, session=rr["id"], recall=True, reread=False))
    assert st == 200 and ok["recall"]["passages"] == 0 and "reread" not in ok, ok  # an empty document
    # the session still answers after them
    st, ok, _ = ask(srv, up["id"], recall=True, max_tokens=1)
    assert st == 200 and ok["recall"]["passages"] >= 1


def test_setting_survives_a_restart(tmp_path, model):
    """The session setting is kept with the session's other settings: after a
    restart the restored session still recalls by default."""
    s = Server(tmp_path, "--budget-tokens", "512")
    s.start()
    try:
        up = session_with(s, natural_document(3, 1500), recall=True)
        assert s.stop() == 0
        s.start()
        deadline = time.time() + 120
        while True:  # the restore reads the document into the pot again
            st, sess, _ = s.request("GET", f"/v1/sessions/{up['id']}")
            if st != 200 or sess["status"] != "ingesting" or time.time() > deadline:
                break
            time.sleep(0.2)
        assert st == 200 and sess["status"] == "ready" and sess["recall"] is True, sess
        st, a, _ = ask(s, up["id"], max_tokens=1)
        assert st == 200 and a["recall"]["candidates"] > 0 and a["recall"]["document_bytes"] == up["bytes_received"], a
        assert s.stop() == 0
    finally:
        s.kill()
