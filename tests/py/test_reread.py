"""Re-reading a session's document for a late question (server/reread.c):
`"reread": true` on a chat request, or the session setting `reread`, reads
the document again from the session's chunk log through a FINCH pot guided
by the question and answers from it. Against a real server on loopback: a
pass key the session's question-agnostic pot lost is found after a re-read;
a re-read pot that holds the whole document answers exactly as the full
document does; streamed re-reads report progress as SSE comments."""
import json
import sys
import urllib.request

import pytest

from conftest import ROOT
from server_util import Server

sys.path.insert(0, str(ROOT / "tests" / "bench" / "longdoc"))
import corpus  # noqa: E402

KEY = "583921"
QUESTION = "What is the pass key? Answer with the number only."


def natural_document(seed, chars, needle=True):
    """Shuffled paragraphs of the bench's TEST split (none repeated), a pass
    key in the middle."""
    paras = corpus.shuffled(corpus.load_units(), "test", seed)
    doc = []
    for p in paras:
        if sum(len(x) for x in doc) >= chars:
            break
        doc.append(p)
    if needle:
        doc.insert(len(doc) // 2, f"The pass key is {KEY}. Remember it. {KEY} is the pass key.")
    return "\n\n".join(doc) + "\n"


@pytest.fixture(scope="module")
def srv(tmp_path_factory, model):
    s = Server(tmp_path_factory.mktemp("data"), "--budget-tokens", "512")
    s.start()
    yield s
    assert s.stop() == 0


def session_with(srv, text, **settings):
    st, sess, _ = srv.request("POST", "/v1/sessions", settings)
    assert st == 201, sess
    st, up, _ = srv.request("POST", f"/v1/sessions/{sess['id']}/chunks?final=true", raw=text.encode(),
                            headers={"Content-Type": "text/plain; charset=utf-8"})
    assert st == 200, up
    return up


def ask(srv, sid, **extra):
    body = {"model": "x", "max_tokens": 12, "temperature": 0, "session": sid,
            "messages": [{"role": "user", "content": QUESTION}], **extra}
    return srv.request("POST", "/v1/chat/completions", body)


def test_reread_finds_what_the_pot_lost(srv):
    # about 2.7K tokens through a 512-entry pot: the catalyst pot drops the key
    up = session_with(srv, natural_document(1, 10000), budget_tokens=512, keep_tokens=256)
    assert up["compressions"] > 0 and up["reread"] is False
    st, plain, _ = ask(srv, up["id"])
    assert st == 200 and KEY not in plain["choices"][0]["message"]["content"] and "reread" not in plain
    st, rr, _ = ask(srv, up["id"], reread=True)
    assert st == 200, rr
    assert rr["choices"][0]["message"]["content"].strip().startswith(f"The pass key is {KEY}")
    assert rr["reread"]["tokens"] == up["tokens_ingested"] and rr["reread"]["bytes"] == up["bytes_received"]
    assert rr["reread"]["seconds"] > 0
    # the re-read pot was the question's own: the session's pot is unchanged
    st, again, _ = ask(srv, up["id"])
    assert again["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    st, sess, _ = srv.request("GET", f"/v1/sessions/{up['id']}")
    assert sess["tokens_in_pot"] == up["tokens_in_pot"]


def test_session_setting_and_streamed_progress(srv):
    up = session_with(srv, natural_document(1, 10000), budget_tokens=512, keep_tokens=256, reread=True)
    assert up["reread"] is True
    st, off, _ = ask(srv, up["id"], reread=False)  # the request overrides the session
    assert st == 200 and "reread" not in off and KEY not in off["choices"][0]["message"]["content"]
    body = {"model": "x", "max_tokens": 12, "temperature": 0, "session": up["id"], "stream": True,
            "messages": [{"role": "user", "content": QUESTION}]}
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read().decode()
    assert "\x00" not in raw
    comments = [x for x in raw.split("\n\n") if x.startswith(": reread")]
    assert comments[0] == ": reread started" and comments[-1].startswith(": reread done: ")
    done = [int(c.split()[2].split("/")[0]) for c in comments[1:-1]]
    assert done and done == sorted(done) and done[-1] == up["bytes_received"]
    text = "".join(json.loads(x[6:])["choices"][0]["delta"].get("content") or ""
                   for x in raw.split("\n\n") if x.startswith("data: {"))
    assert text.strip().startswith(f"The pass key is {KEY}")
    assert raw.rstrip().endswith("data: [DONE]")


def test_reread_with_room_for_everything_is_full_attention(srv):
    """A pot that holds the whole document never compresses: the re-read
    answer has the same tokens and log-probabilities as the session's own
    full-attention pot (policy none) over the same text."""
    up = session_with(srv, natural_document(2, 3000), policy="none", budget_tokens=2048)
    assert up["compressions"] == 0
    lp = {"logprobs": True, "top_logprobs": 3, "max_tokens": 8}
    st, full, _ = ask(srv, up["id"], **lp)
    st2, rr, _ = ask(srv, up["id"], reread=True, **lp)
    assert st == st2 == 200 and "reread" in rr
    assert rr["choices"][0]["message"]["content"] == full["choices"][0]["message"]["content"]
    for a, b in zip(full["choices"][0]["logprobs"]["content"], rr["choices"][0]["logprobs"]["content"]):
        assert a["token"] == b["token"] and abs(a["logprob"] - b["logprob"]) < 1e-3
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]


def test_reread_errors(srv):
    body = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    st, e, _ = srv.request("POST", "/v1/chat/completions", dict(body, reread=True))
    assert st == 400 and e["error"]["param"] == "reread"
    st, e, _ = srv.request("POST", "/v1/chat/completions", dict(body, reread="yes"))
    assert st == 400 and e["error"]["type"] == "invalid_request_error" or e["error"]["code"] == "invalid_type"
    st, e, _ = srv.request("POST", "/v1/sessions", {"reread": 1})
    assert st == 400 and e["error"]["param"] == "reread"
