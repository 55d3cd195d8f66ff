"""Recall (server/recall.c, engine/recall.h): `"recall": true` on a request
over a session, or the session setting `recall`, puts the passages of the
session's logged document that share the question's words before the
question, answered over the session's own pot. By default ("auto") a
question recalls once the session's pot has dropped some of its document.
Against a real server on loopback with the re-read tests' document
(test_reread.py): a pass key the 512-entry pot lost is found with recall,
within the server's recall_bytes; the session's pot is not touched; streamed
answers say what was recalled; a question that shares no word with the
document is answered without passages; questions arriving together share one
read of the log."""
import json
import threading
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
    assert up["compressions"] > 0 and up["recall"] == "auto"  # the server's default
    st, plain, _ = ask(srv, up["id"], recall=False)
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
    st, again, _ = ask(srv, up["id"], recall=False)
    assert st == 200 and "recall" not in again
    assert again["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert again["usage"] == plain["usage"]
    st, sess, _ = srv.request("GET", f"/v1/sessions/{up['id']}")
    assert sess["tokens_in_pot"] == up["tokens_in_pot"]
    # /v1/completions: the prompt is the question
    st, c, _ = srv.request("POST", "/v1/completions", {"model": "x", "max_tokens": 20, "temperature": 0,
                                                       "session": up["id"], "prompt": QUESTION, "recall": True})
    assert st == 200 and c["recall"]["passages"] >= 1 and KEY in c["choices"][0]["text"], c
    # /v1/responses: the last user message of the input; the response object says what was recalled
    st, rsp, _ = srv.request("POST", "/v1/responses", {"model": "x", "max_output_tokens": 20, "temperature": 0,
                                                       "session": up["id"], "input": QUESTION, "recall": True})
    assert st == 200 and rsp["recall"]["spans"] == rc["recall"]["spans"], rsp
    assert KEY in rsp["output"][0]["content"][0]["text"], rsp
    st, rsp, _ = srv.request("POST", "/v1/responses", {"model": "x", "max_output_tokens": 1, "session": up["id"],
                                                       "input": QUESTION, "recall": False})
    assert st == 200 and "recall" not in rsp, rsp


def test_spans_say_where_the_passages_are_in_the_servers_order(srv, lost, tmp_path):
    """`recall.spans`: each passage's [start, end) in the logged document, in the
    order they were put before the question. The server's default (best last)
    ends with the best-ranked passage, the one with the key; a server set to
    `--recall-order document` gives the same passages by their place in the
    document, and so the same prompt length."""
    up, _ = lost
    doc = natural_document(1, 10000).encode()
    st, best, _ = ask(srv, up["id"], recall=True, max_tokens=1)
    assert st == 200, best
    spans = best["recall"]["spans"]
    assert len(spans) == best["recall"]["passages"] >= 3, best
    assert all(0 <= a < b <= len(doc) for a, b in spans), spans
    assert sum(b - a for a, b in spans) == best["recall"]["bytes"], best
    assert KEY.encode() in doc[spans[-1][0]:spans[-1][1]], spans  # nearest the question
    assert best["recall"]["texts"] == [doc[a:b].decode() for a, b in spans], best  # and what each says
    assert spans != sorted(spans), spans  # so the two orders differ here
    other = Server(tmp_path, "--budget-tokens", "512", "--recall-bytes", RECALL_BYTES, "--recall-order", "document")
    other.start()
    try:
        up2 = session_with(other, doc.decode(), budget_tokens=512, keep_tokens=256)
        st, by_place, _ = ask(other, up2["id"], recall=True, max_tokens=1)
        assert st == 200, by_place
        assert by_place["recall"]["spans"] == sorted(spans), (by_place["recall"], spans)
        # the same passages and separators, in another order: the tokens differ at their joins only
        diff = by_place["usage"]["prompt_tokens"] - best["usage"]["prompt_tokens"]
        assert abs(diff) <= 2 * len(spans), (by_place["usage"], best["usage"])
        assert other.stop() == 0
    finally:
        other.kill()
    # a question that shares no word with the document: no passage, no span
    st, none, _ = srv.request("POST", "/v1/chat/completions", {
        "model": "x", "max_tokens": 1, "session": up["id"], "recall": True,
        "messages": [{"role": "user", "content": "Zyxwvut qqqqq?"}]})
    assert st == 200 and none["recall"]["passages"] == 0 and none["recall"]["spans"] == [], none
    assert none["recall"]["texts"] == [], none
    # characters beyond ASCII come whole; a NUL byte of the document is put before the question as a space
    raw = "Mount points are listed in fstab.\n\nThe door code is 4711\0 for the \u00e9tage \u20ac \U0001F600.\n\nBye.".encode()
    odd_up = session_with(srv, raw.decode())
    st, odd, _ = srv.request("POST", "/v1/chat/completions", {
        "model": "x", "max_tokens": 1, "session": odd_up["id"], "recall": True,
        "messages": [{"role": "user", "content": "What is the door code?"}]})
    assert st == 200, odd
    (a, b), = [sp for sp in odd["recall"]["spans"] if b"door" in raw[sp[0]:sp[1]]]
    assert raw[a:b] == "The door code is 4711\0 for the \u00e9tage \u20ac \U0001F600.".encode(), (a, b)
    assert raw[a:b].replace(b"\0", b" ").decode() in odd["recall"]["texts"], odd["recall"]


def test_auto_recalls_once_the_pot_dropped_text(srv, lost):
    """The default: a pot that dropped some of its document gets passages, one
    that holds all of it answers as before (as full attention would)."""
    up, plain = lost
    st, auto, _ = ask(srv, up["id"])  # no "recall": the session's "auto"
    assert st == 200 and auto["recall"]["passages"] >= 1 and KEY in auto["choices"][0]["message"]["content"], auto
    whole = session_with(srv, natural_document(1, 1200))  # about 300 tokens in a 512-entry pot
    assert whole["compressions"] == 0 and whole["tokens_in_pot"] >= whole["tokens_ingested"], whole
    st, a, _ = ask(srv, whole["id"])
    st2, off, _ = ask(srv, whole["id"], recall=False)
    assert st == st2 == 200 and "recall" not in a and a["choices"] == off["choices"] and a["usage"] == off["usage"], a
    st, forced, _ = ask(srv, whole["id"], recall=True)  # true recalls even then
    assert st == 200 and forced["recall"]["candidates"] > 0, forced
    # a session set to false, asked with "auto"; "auto" without a session has nothing to search
    off_session = session_with(srv, natural_document(1, 10000), budget_tokens=512, keep_tokens=256, recall=False)
    assert off_session["recall"] is False
    st, a, _ = ask(srv, off_session["id"])
    assert st == 200 and "recall" not in a, a
    st, a, _ = ask(srv, off_session["id"], recall="auto")
    assert st == 200 and a["recall"]["passages"] >= 1, a
    st, a, _ = srv.request("POST", "/v1/chat/completions", {"model": "x", "max_tokens": 1, "recall": "auto",
                                                            "messages": [{"role": "user", "content": "hi"}]})
    assert st == 200 and "recall" not in a, a


def test_questions_at_once_share_the_read(srv, lost):
    """Recalls that arrive while another reads the log wait for that read
    instead of failing with session_busy."""
    up, _ = lost
    out = [None] * 8

    def one(i):
        out[i] = ask(srv, up["id"], recall=True, max_tokens=1)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(out))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(st == 200 and r["recall"]["passages"] >= 1 for st, r, _ in out), [r for _, r, _ in out]
    assert len({r["recall"]["bytes"] for _, r, _ in out}) == 1


def stream(srv, body):
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read().decode()


def test_reread_with_recall(srv, lost):
    """A re-read with recall ("auto", the session's, since its pot dropped text;
    or true): the question is asked over the re-read's pot with the passages
    before it (both objects in the answer; the passages after the same pot as
    the re-read alone, so the same cached tokens). Streamed, the comments come
    in order."""
    up, _ = lost
    st, alone, _ = ask(srv, up["id"], reread=True, recall=False)
    assert st == 200 and "reread" in alone and "recall" not in alone, alone
    st, both, _ = ask(srv, up["id"], reread=True)  # recall "auto", the session's
    assert st == 200 and both["reread"]["tokens"] == alone["reread"]["tokens"], both
    assert both["recall"]["passages"] >= 1 and KEY in both["choices"][0]["message"]["content"], both
    cached = lambda a: a["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached(both) == cached(alone) and both["usage"]["prompt_tokens"] > alone["usage"]["prompt_tokens"] + 100
    text = stream(srv, {"model": "x", "max_tokens": 12, "temperature": 0, "session": up["id"], "stream": True,
                        "reread": True, "recall": True, "messages": [{"role": "user", "content": QUESTION}]})
    at = [text.index(c) for c in (": reread started", ": reread done", ": recall started", ": recall ", "data: ")]
    assert at == sorted(at) and text.rstrip().endswith("data: [DONE]") and "\0" not in text, text[:2000]
    assert KEY in "".join(json.loads(x[6:])["choices"][0]["delta"].get("content") or ""
                          for x in text.splitlines() if x.startswith("data: {")), text[-2000:]


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
    # the first chunk carries the "recall" object of a non-streamed answer, no other chunk does
    chunks = [json.loads(x[6:]) for x in events if x.startswith("data: {")]
    rc = chunks[0]["recall"]
    assert rc["passages"] == int(words[2]) == len(rc["spans"]) == len(rc["texts"]), rc
    assert not any("recall" in c for c in chunks[1:]), chunks
    st, whole, _ = ask(srv, up["id"], max_tokens=1)
    assert st == 200 and (whole["recall"]["spans"], whole["recall"]["texts"]) == (rc["spans"], rc["texts"]), whole
    # the official client keeps it as an extra field of the chunk
    from openai import OpenAI
    client = OpenAI(base_url=srv.url + "/v1", api_key="unused")
    got = list(client.chat.completions.create(model="x", max_tokens=1, stream=True, extra_body={"session": up["id"]},
                                              messages=[{"role": "user", "content": QUESTION}]))
    assert got[0].model_extra["recall"]["spans"] == rc["spans"], got[0]
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
    st, e, _ = srv.request("POST", chat, dict(body, session="sess_nope", recall=True))
    assert st == 404 and e["error"]["code"] == "session_not_found", e
    # /v1/responses checks them as chat does
    for bad, param in (({"recall": "yes"}, "recall"), ({"reread": 1}, "reread"), ({"recall": True}, "recall")):
        st, e, _ = srv.request("POST", "/v1/responses", {"model": "x", "input": "hi", "max_output_tokens": 1, **bad})
        assert st == 400 and e["error"]["param"] == param, (bad, e)
    st, e, _ = srv.request("POST", chat, dict(body, session=up["id"], recall=True,
                                              messages=[{"role": "system", "content": "x"}]))
    assert st == 400 and e["error"]["param"] == "messages" and "question" in e["error"]["message"], e
    # the session settings
    st, e, _ = srv.request("POST", "/v1/sessions", {"recall": 1})
    assert st == 400 and e["error"]["param"] == "recall", e
    st, both, _ = srv.request("POST", "/v1/sessions", {"recall": True, "reread": True})
    assert st == 201 and both["recall"] is True and both["reread"] is True, both
    # a session that re-reads by default: a request's recall true recalls after the re-read
    st, rr, _ = srv.request("POST", "/v1/sessions", {"reread": True})
    assert st == 201 and rr["reread"] is True and rr["recall"] == "auto"
    st, ok, _ = srv.request("POST", chat, dict(body, session=rr["id"], recall=True))
    assert st == 200 and ok["recall"]["passages"] == 0 and "reread" in ok, ok  # an empty document
    st, ok, _ = srv.request("POST", chat, dict(body, session=rr["id"], recall=True, reread=False))
    assert st == 200 and ok["recall"]["passages"] == 0 and "reread" not in ok, ok  # an empty document
    # the session still answers after them
    st, ok, _ = ask(srv, up["id"], recall=True, max_tokens=1)
    assert st == 200 and ok["recall"]["passages"] >= 1


def test_setting_survives_a_restart(tmp_path, model):
    """The session setting is kept with the session's other settings: after a
    restart the restored session still recalls by default."""
    s = Server(tmp_path, "--budget-tokens", "512", "--recall", "false")
    s.start()
    try:
        up = session_with(s, natural_document(3, 1500), recall=True)
        plain = session_with(s, natural_document(1, 4000))  # the server's default, here false
        assert plain["recall"] is False and plain["compressions"] > 0, plain
        st, a, _ = ask(s, plain["id"], max_tokens=1)
        assert st == 200 and "recall" not in a, a
        auto = session_with(s, natural_document(1, 4000), recall="auto")
        rr = session_with(s, natural_document(1, 4000), reread=True)
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
        for sid, want in ((auto["id"], "auto"), (plain["id"], False)):  # restored the same way
            while True:
                st, sess, _ = s.request("GET", f"/v1/sessions/{sid}")
                if st != 200 or sess["status"] != "ingesting" or time.time() > deadline:
                    break
                time.sleep(0.2)
            assert st == 200 and sess["recall"] == want, sess
        st, a, _ = ask(s, auto["id"], max_tokens=1)
        assert st == 200 and a["recall"]["passages"] >= 1, a
        assert s.stop() == 0
        # the server's default turned on: sessions without a setting follow it; one that re-reads
        # by default re-reads and recalls
        s.flags[s.flags.index("false")] = "true"
        s.start()
        for sid in (plain["id"], rr["id"]):
            while True:
                st, sess, _ = s.request("GET", f"/v1/sessions/{sid}")
                if st != 200 or sess["status"] != "ingesting" or time.time() > deadline + 120:
                    break
                time.sleep(0.2)
        assert st == 200 and sess["reread"] is True, sess
        st, sess, _ = s.request("GET", f"/v1/sessions/{plain['id']}")
        assert st == 200 and sess["recall"] is True, sess
        st, a, _ = ask(s, rr["id"], max_tokens=1)
        assert st == 200 and "reread" in a and a["recall"]["passages"] >= 1, a
        st, a, _ = ask(s, plain["id"], max_tokens=1)
        assert st == 200 and a["recall"]["passages"] >= 1, a
        assert s.stop() == 0
    finally:
        s.kill()


def test_passages_fit_the_window(tmp_path, fixtures):
    """A model whose window cannot hold recall_bytes of passages after the pot
    (the tiny fixture model) gets fewer passages, never a prompt that does not fit."""
    s = Server(tmp_path, "--model", fixtures / "tiny_llama.gguf", "--budget-tokens", "64")
    s.start()
    try:
        st, info, _ = s.request("GET", "/v1/models")
        n_ctx = info["data"][0]["meta"]["context_length"]
        # short paragraphs, so that some fit in what the tiny window leaves
        text = "\n\n".join(f"Filler line number {i} is here." for i in range(300))
        text += "\n\nThe pass key is 71432.\n\n" + text
        up = session_with(s, text)
        assert up["compressions"] > 0 and n_ctx < 4096 // 2, (up, n_ctx)
        for max_tokens in (8, None):
            body = {"model": "x", "temperature": 0, "session": up["id"], "recall": True,
                    "messages": [{"role": "user", "content": "What is the pass key?"}]}
            if max_tokens:
                body["max_tokens"] = max_tokens
            st, a, _ = s.request("POST", "/v1/chat/completions", body)
            # 8 answer tokens leave room for a passage or two (the model reads about a token a byte)
            assert st == 200 and a["recall"]["passages"] >= (1 if max_tokens else 0), a
            assert a["recall"]["bytes"] < 4096 and a["recall"]["candidates"] == 601, a
            room = n_ctx - up["tokens_in_pot"]
            assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == up["tokens_in_pot"], a  # the pot
            # the passages leave the answer max_tokens, or half the room the pot leaves
            assert a["usage"]["prompt_tokens"] + min(max_tokens or room // 2, room // 2) <= n_ctx, (a, room)
        assert s.stop() == 0
    finally:
        s.kill()
