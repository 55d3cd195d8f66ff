"""Re-reading a session's document for a late question (server/reread.c):
`"reread": true` on a chat request, or the session setting `reread`, reads
the document again from the session's chunk log through a FINCH pot guided
by the question and answers from it. Against a real server on loopback: a
pass key the session's question-agnostic pot lost is found after a re-read;
a re-read pot that holds the whole document answers exactly as the full
document does; streamed re-reads report progress as SSE comments."""
import json
import sys
import time
import urllib.request

import pytest

from conftest import ROOT
from server_util import Server, metric

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
    # "--recall false": the plain answers come from the pot alone (test_recall.py has the default)
    s = Server(tmp_path_factory.mktemp("data"), "--budget-tokens", "512", "--recall", "false")
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
    reread_before = metric(srv, "potserve_tokens_reread_total")
    st, rr, _ = ask(srv, up["id"], reread=True)
    assert st == 200, rr
    assert metric(srv, "potserve_tokens_reread_total") - reread_before == rr["reread"]["tokens"]
    assert rr["choices"][0]["message"]["content"].strip().startswith(f"The pass key is {KEY}")
    assert rr["reread"]["tokens"] == up["tokens_ingested"] and rr["reread"]["bytes"] == up["bytes_received"]
    assert rr["reread"]["seconds"] > 0
    # the re-read pot was the question's own: the session's pot is unchanged
    st, again, _ = ask(srv, up["id"])
    assert again["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    st, sess, _ = srv.request("GET", f"/v1/sessions/{up['id']}")
    assert sess["tokens_in_pot"] == up["tokens_in_pot"]


def test_a_background_response_rereads_while_its_client_polls(srv):
    """A late question's re-read takes as long as the upload did (minutes on a CPU for long
    documents): asked as a background response over the Responses API, it is queued at once and
    polled, and ends with the answer and the "reread" object a waiting client would have had."""
    import time
    from server_util import background_ended, openai_client
    up = session_with(srv, natural_document(1, 10000), budget_tokens=512, keep_tokens=256)
    client = openai_client(srv)
    t0 = time.time()
    queued = client.responses.create(model="x", input=QUESTION, max_output_tokens=12, temperature=0, background=True,
                                     extra_body={"session": up["id"], "reread": True})
    assert queued.status == "queued" and time.time() - t0 < 5
    got, seen = background_ended(client, queued.id, limit_s=600)
    assert "in_progress" in seen and got.status in ("completed", "incomplete"), (seen, got)
    assert got.output_text.strip().startswith(f"The pass key is {KEY}"), got.output_text
    assert got.model_extra["reread"]["tokens"] == up["tokens_ingested"]


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
    chunks = [json.loads(x[6:]) for x in raw.split("\n\n") if x.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.strip().startswith(f"The pass key is {KEY}")
    # the first chunk carries the "reread" object a non-streamed answer has; no other chunk does
    rr = chunks[0]["reread"]
    assert rr["bytes"] == up["bytes_received"] and rr["tokens"] == up["tokens_ingested"] and rr["pots"] >= 1, rr
    assert f"{rr['tokens']} tokens" in comments[-1] and not any("reread" in c for c in chunks[1:]), comments
    assert raw.rstrip().endswith("data: [DONE]")


def test_a_reread_whose_client_left_stops(srv):
    # a non-streamed re-read went on to the end of the document (the pot's memory held, the engine
    # busy) after its client left; then to the end of the piece of the log it was reading (16 KiB:
    # a minute of a 1.5B model on CPU). It stops within an engine chunk of the server noticing now.
    # A streamed one whose client left was logged 200 (its stream had ended with the error event).
    # (A non-streamed client leaving: test_a_shared_pass_reads_on_for_its_last_client_and_stops_when_it_leaves.)
    import socket
    import time
    from test_openai_compat import metric
    doc = natural_document(3, 32000)
    t0 = time.time()
    up = session_with(srv, doc, budget_tokens=512, keep_tokens=256)
    upload_s = time.time() - t0  # about what a whole re-read takes
    piece_tokens = up["tokens_ingested"] * 16384 / len(doc.encode())  # server/reread.c's REREAD_PIECE
    base, reread_before = metric(srv, "potserve_pot_memory_bytes"), metric(srv, "potserve_tokens_reread_total")
    body = json.dumps({"model": "x", "max_tokens": 12, "temperature": 0, "session": up["id"], "reread": True,
                       "stream": True, "messages": [{"role": "user", "content": QUESTION}]}).encode()
    with socket.create_connection(("127.0.0.1", srv.port)) as c:
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.time() + 30
        while metric(srv, "potserve_pot_memory_bytes") <= base:  # the re-read pot is taken
            assert time.time() < deadline
            time.sleep(0.05)
    left = time.time()
    while metric(srv, "potserve_pot_memory_bytes") > base:
        assert time.time() - left < 0.6 * upload_s, "the re-read went on after its client left"
        time.sleep(0.05)
    reread = metric(srv, "potserve_tokens_reread_total") - reread_before
    assert reread < 0.5 * piece_tokens, f"{reread:.0f} tokens re-read after the client left (a piece: {piece_tokens:.0f})"
    while True:  # its access-log line
        lines = [json.loads(l) for l in srv.log_lines if l.startswith("{") and up["id"] in l]
        asked = [l for l in lines if l["route"] == "/v1/chat/completions"]
        if asked:
            break
        assert time.time() - left < 30
        time.sleep(0.05)
    assert asked[0]["status"] == 499, asked


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


def test_a_question_too_long_to_re_read_with_is_a_400(tmp_path, fixtures):
    """A question whose rows alone pass the model's window cannot score a
    re-read: the request's fault, 400 reread_failed saying so (it was a 500
    "budget_tokens can be at most -211"), streamed as the error event."""
    s = Server(tmp_path, "--model", fixtures / "tiny_llama.gguf", "--budget-tokens", "64").start()
    try:
        sid = s.request("POST", "/v1/sessions", {})[1]["id"]
        st, _, _ = s.request("POST", f"/v1/sessions/{sid}/chunks?final=true", raw=b"A short document. " * 20,
                             headers={"Content-Type": "text/plain"})
        assert st == 200
        ask = {"session": sid, "reread": True, "max_tokens": 4,
               "messages": [{"role": "user", "content": "Which code is it? " * 15}]}  # ~210 tokens + 64 > 256
        st, body, _ = s.request("POST", "/v1/chat/completions", ask)
        assert st == 400 and body["error"]["code"] == "reread_failed", (st, body)
        assert "exceed the model's context" in body["error"]["message"] and "at most -" not in body["error"]["message"], body
        st, events, _ = s.request("POST", "/v1/chat/completions", dict(ask, stream=True))
        assert st == 200 and '"reread_failed"' in events and events.rstrip().endswith("data: [DONE]"), events
        # a question longer than the window by itself is refused before any re-read, streamed or not
        ask["messages"][0]["content"] = "Which code is it? " * 80  # ~1,100 tokens > 256
        for stream in (False, True):
            st, body, _ = s.request("POST", "/v1/chat/completions", dict(ask, stream=stream))
            assert st == 400 and body["error"]["code"] == "context_length_exceeded", (st, body)
    finally:
        assert s.stop() == 0


# ---- questions waiting for the same session share one pass over the log ----------------

CODE = "4417"
CODE_QUESTION = "What is the door code? Answer with the number only."


def two_needle_document():
    """The pass-key document with a door code at a quarter of its depth (which
    SmolLM2 answers from a pot scored by this question alone, not from its full
    attention nor from a pot scored by both questions' rows: "5417")."""
    doc = natural_document(1, 10000).split("\n\n")
    doc.insert(len(doc) // 4, f"The door code is {CODE}. Remember it. {CODE} is the door code.")
    return "\n\n".join(doc)


def ask_together(srv, sid, questions, **extra):
    """The questions sent at once (each on its own connection); their answers in order."""
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
        futs = [pool.submit(srv.request, "POST", "/v1/chat/completions",
                            {"model": "x", "max_tokens": 12, "temperature": 0, "session": sid, "reread": True,
                             "messages": [{"role": "user", "content": q}], **extra}) for q in questions]
        out = [f.result() for f in futs]
    assert all(st == 200 for st, _, _ in out), out
    return [body for _, body, _ in out]


def shared_server(tmp_path_factory, share):
    # a gather window far longer than two requests on loopback take to arrive, so they always meet
    s = Server(tmp_path_factory.mktemp(f"share_{share}"), "--budget-tokens", "512", "--reread-share", share,
               "--reread-gather-ms", "1000", "--recall", "false")
    s.start()
    return s


def test_shared_pass_one_pot_for_all_rows(tmp_path_factory, model):
    """share "rows": two questions arriving together are read in one pass into
    one pot scored by both questions' rows; both find the pass key, which the
    session's own pot lost. (The same question twice: SmolLM2 in a 512-entry
    pot scored by two different questions' rows finds one of their facts, not
    both; docs/results/longdoc.md measures what that costs.)"""
    srv = shared_server(tmp_path_factory, "rows")
    try:
        up = session_with(srv, two_needle_document(), budget_tokens=512, keep_tokens=256)
        assert up["compressions"] > 0
        st, plain, _ = ask(srv, up["id"])
        assert st == 200 and KEY not in plain["choices"][0]["message"]["content"]
        key, again = ask_together(srv, up["id"], [QUESTION, QUESTION])
        assert key["reread"]["pass"] == again["reread"]["pass"]
        assert key["reread"]["questions"] == again["reread"]["questions"] == 2
        assert key["reread"]["pots"] == again["reread"]["pots"] == 1
        assert key["reread"]["tokens"] == again["reread"]["tokens"] == up["tokens_ingested"]
        assert KEY in key["choices"][0]["message"]["content"], key
        assert again["choices"][0]["message"]["content"] == key["choices"][0]["message"]["content"]
        # a later question starts a pass of its own
        st, alone, _ = ask(srv, up["id"], reread=True)
        assert alone["reread"]["pass"] != key["reread"]["pass"] and alone["reread"]["questions"] == 1
    finally:
        assert srv.stop() == 0


def test_shared_pass_one_pot_per_question(tmp_path_factory, model):
    """share "pots": two questions arriving together share one read of the log
    but each gets a pot scored by its own rows, so each answer (tokens and
    log-probabilities) is the one a re-read for it alone gives."""
    srv = shared_server(tmp_path_factory, "pots")
    try:
        up = session_with(srv, two_needle_document(), budget_tokens=512, keep_tokens=256)
        lp = {"logprobs": True, "top_logprobs": 2}
        st, plain, _ = ask(srv, up["id"])
        assert st == 200 and KEY not in plain["choices"][0]["message"]["content"]
        both = ask_together(srv, up["id"], [QUESTION, CODE_QUESTION], **lp)
        assert both[0]["reread"]["pass"] == both[1]["reread"]["pass"]
        assert both[0]["reread"]["pots"] == both[1]["reread"]["pots"] == 2
        assert KEY in both[0]["choices"][0]["message"]["content"], both[0]
        assert CODE in both[1]["choices"][0]["message"]["content"], both[1]
        for q, shared in zip([QUESTION, CODE_QUESTION], both):
            (solo,) = ask_together(srv, up["id"], [q], **lp)
            assert solo["reread"]["pass"] != shared["reread"]["pass"] and solo["reread"]["questions"] == 1
            assert solo["reread"]["tokens"] == shared["reread"]["tokens"] == up["tokens_ingested"]
            a, b = solo["choices"][0], shared["choices"][0]
            assert a["message"]["content"] == b["message"]["content"]
            for x, y in zip(a["logprobs"]["content"], b["logprobs"]["content"]):
                assert x["token"] == y["token"] and abs(x["logprob"] - y["logprob"]) < 1e-3
    finally:
        assert srv.stop() == 0


def test_a_question_after_an_acknowledged_chunk_does_not_join_a_pass_without_it(tmp_path_factory, model):
    """share "pots": a question joins a pass already reading its copy of the log only while no
    chunk was acknowledged since that copy was read; a question sent after a 200 for a new chunk
    joined such a pass and was answered from the document without that chunk."""
    srv = Server(tmp_path_factory.mktemp("late_chunk"), "--budget-tokens", "512", "--reread-share", "pots",
                 "--reread-gather-ms", "50", "--recall", "false").start()
    try:
        st, sess, _ = srv.request("POST", "/v1/sessions", {})
        sid = sess["id"]
        h = {"Content-Type": "text/plain; charset=utf-8"}
        assert srv.request("POST", f"/v1/sessions/{sid}/chunks", raw=natural_document(11, 24000).encode(),
                           headers=h)[0] == 200
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(ask, srv, sid, reread=True)
            time.sleep(0.5)  # its pass gathered (50 ms) and read the log
            deadline = time.time() + 60
            while True:  # 409 while the pass gathers and reads the log; taken once it feeds its pot
                st, up, _ = srv.request("POST", f"/v1/sessions/{sid}/chunks", raw=b"\n\nThe door code is 4417.\n",
                                        headers=h)
                if st == 200 or time.time() > deadline:
                    break
                time.sleep(0.02)
            assert st == 200, up
            st, later, _ = ask(srv, sid, reread=True)
            st0, earlier, _ = first.result()
        assert st == st0 == 200, (later, earlier)
        assert later["reread"]["bytes"] == up["bytes_received"], (later, earlier)  # (it was the first's copy's)
        if earlier["reread"]["bytes"] < up["bytes_received"]:  # (else the first began after the chunk: no race)
            assert later["reread"]["pass"] != earlier["reread"]["pass"]
    finally:
        assert srv.stop() == 0


def test_a_shared_pass_reads_on_for_its_last_client_and_stops_when_it_leaves(tmp_path_factory, model):
    """share "rows": one pot read for two questions. It read on to the end of its
    16 KiB piece of the log after both clients had left (a minute of a 1.5B model
    on CPU); now it reads on while one of them is there and stops within an
    engine chunk of the server noticing the last one gone. The first client
    asks without streaming: the server sees it leave only by looking."""
    import socket
    import time
    srv = shared_server(tmp_path_factory, "rows")
    try:
        doc = natural_document(4, 56000)
        up = session_with(srv, doc, budget_tokens=512, keep_tokens=256)
        piece = 16384  # server/reread.c's REREAD_PIECE
        tokens_per_byte = up["tokens_ingested"] / len(doc.encode())
        reread_before = metric(srv, "potserve_tokens_reread_total")
        clients = [socket.create_connection(("127.0.0.1", srv.port), timeout=120) for _ in range(2)]
        for c, stream in zip(clients, (False, True)):
            body = json.dumps({"model": "x", "max_tokens": 12, "temperature": 0, "session": up["id"], "reread": True,
                               "stream": stream, "messages": [{"role": "user", "content": QUESTION}]}).encode()
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

        def read_until(c, progress):
            got = b""
            while progress not in got:
                more = c.recv(65536)
                assert more, got
                got += more
            return got

        read_until(clients[1], b": reread %d/" % piece)
        clients[0].close()  # one leaves: the pass reads on for the other
        read_until(clients[1], b": reread %d/" % (2 * piece))
        clients[1].close()
        deadline = time.time() + 120
        while metric(srv, "potserve_tokens_reread_total") == reread_before:  # counted when the pot ends
            assert time.time() < deadline
            time.sleep(0.05)
        reread = metric(srv, "potserve_tokens_reread_total") - reread_before
        bound = (2 * piece + piece / 2) * tokens_per_byte
        print(f"{reread:.0f} tokens re-read; the last client left at {2 * piece * tokens_per_byte:.0f}, bound {bound:.0f}")
        assert reread < bound, f"{reread:.0f} tokens re-read; the last client left at {2 * piece * tokens_per_byte:.0f}"
        statuses = []
        while len(statuses) < 2:
            statuses = [json.loads(l)["status"] for l in srv.log_lines
                        if l.startswith("{") and up["id"] in l and "/v1/chat/completions" in l]
            assert time.time() < deadline
            time.sleep(0.05)
        assert statuses == [499, 499]
    finally:
        assert srv.stop() == 0


def test_share_setting_rejects_unknown_values(tmp_path):
    import subprocess
    from conftest import BIN
    r = subprocess.run([str(BIN), "serve", "--reread-share", "both", "--port", "0", "--data-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "reread_share" in r.stderr.replace("-", "_")


def test_whole_words_reaches_the_reread_and_survives_a_restart(tmp_path, model):
    """`whole_words` is a session setting the re-read inherits, on by default
    for the re-read ("question"): three sessions over the same document. The
    default one and the one with `true` re-read to the same pot (the same
    answer and log-probabilities); the one with `false` to another (they
    differ); all three find the key. After a restart the sessions still show
    their settings and the `false` one re-reads as before."""
    srv = Server(tmp_path / "d", "--budget-tokens", "512", "--recall", "false").start()
    lp = {"logprobs": True, "top_logprobs": 2, "reread": True}
    doc = natural_document(1, 10000)
    logprobs = lambda r: [t["logprob"] for t in r["choices"][0]["logprobs"]["content"]]  # noqa: E731
    content = lambda r: r["choices"][0]["message"]["content"]  # noqa: E731
    try:
        default = session_with(srv, doc, budget_tokens=512, keep_tokens=256)
        words = session_with(srv, doc, budget_tokens=512, keep_tokens=256, whole_words=True)
        plain = session_with(srv, doc, budget_tokens=512, keep_tokens=256, whole_words=False)
        assert default["whole_words"] == "question" and words["whole_words"] is True
        assert plain["whole_words"] is False
        answers = {}
        for name, sess in (("default", default), ("words", words), ("plain", plain)):
            st, answers[name], _ = ask(srv, sess["id"], **lp)
            assert st == 200 and "reread" in answers[name] and KEY in content(answers[name]), answers[name]
        a, b, c = answers["default"], answers["words"], answers["plain"]
        assert content(a) == content(b)
        assert max(abs(x - y) for x, y in zip(logprobs(a), logprobs(b))) < 1e-3
        assert max(abs(x - y) for x, y in zip(logprobs(a), logprobs(c))) > 1e-3
    finally:
        assert srv.stop() == 0
    srv.start()
    try:
        for sess, shown in ((default, "question"), (words, True), (plain, False)):
            st, now, _ = srv.request("GET", f"/v1/sessions/{sess['id']}")
            assert st == 200 and now["whole_words"] == shown and type(now["whole_words"]) is type(shown), now
        st, again, _ = ask(srv, plain["id"], **lp)
        assert st == 200 and content(again) == content(c)
        assert max(abs(x - y) for x, y in zip(logprobs(c), logprobs(again))) < 1e-3
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("policy,question,default_keeps_words", [("finch", QUESTION, True), ("infinipot", None, False)])
def test_whole_words_default_keeps_words_where_a_question_guides(srv, policy, question, default_keeps_words):
    """The default "question" keeps whole words in a session's own pot only
    when a question guides it (`finch` with its question up front), where the
    re-read's measurements apply: such a session's default pot answers as one
    with `true` and unlike one with `false`; a question-agnostic pot's default
    answers as `false` and unlike `true`. Three sessions a policy over the same
    document, each answered from its pot (no re-read)."""
    doc = natural_document(2, 10000)
    settings = {"budget_tokens": 512, "keep_tokens": 256, "policy": policy}
    if question:
        settings["question"] = question
    logprobs = {}
    for name, ww in (("default", None), ("on", True), ("off", False)):
        up = session_with(srv, doc, **settings, **({} if ww is None else {"whole_words": ww}))
        assert up["compressions"] > 0 and up["whole_words"] == ("question" if ww is None else ww), up
        st, r, _ = ask(srv, up["id"], logprobs=True)
        assert st == 200 and "reread" not in r, r
        logprobs[name] = [t["logprob"] for t in r["choices"][0]["logprobs"]["content"]]
    same, other = ("on", "off") if default_keeps_words else ("off", "on")
    assert max(abs(x - y) for x, y in zip(logprobs["default"], logprobs[same])) < 1e-3
    assert max(abs(x - y) for x, y in zip(logprobs["default"], logprobs[other])) > 1e-3


def test_a_stop_during_a_reread_answers_503_and_ends_the_stream_whole(tmp_path):
    """SIGTERM while re-reads ran, past shutdown_grace: a plain question got 500 reread_failed
    ("shutting down"), and a streamed one that error and then a connection closed before the
    chunked body's end (clients raise "Response ended prematurely"). Now both say 503
    shutting_down, and the stream ends whole."""
    import signal
    import threading
    import time

    import requests
    s = Server(tmp_path / "d", "--threads", "1", "--budget-tokens", "256", "--recall", "false",
               "--shutdown-grace", "1").start()
    try:
        up = session_with(s, natural_document(2, 24000), budget_tokens=256)  # a re-read of several seconds
        got = {}

        def plain():
            got["plain"] = s.request("POST", "/v1/chat/completions", {
                "max_tokens": 4, "session": up["id"], "reread": True,
                "messages": [{"role": "user", "content": QUESTION}]}, timeout=120)

        def streamed():
            with requests.post(s.url + "/v1/chat/completions", stream=True, timeout=120, json={
                    "max_tokens": 4, "session": up["id"], "reread": True, "stream": True,
                    "messages": [{"role": "user", "content": QUESTION}]}) as r:
                got["stream"] = b"".join(r.iter_content(None))  # a broken chunked ending raises here

        threads = [threading.Thread(target=plain), threading.Thread(target=streamed)]
        for t in threads:
            t.start()
        time.sleep(1.5)  # both re-reads under way (the pass reads for seconds)
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0
        for t in threads:
            t.join(30)
        st, body, _ = got["plain"]
        assert st == 503 and body["error"]["code"] == "shutting_down", (st, body)
        events = [json.loads(line[6:]) for line in got["stream"].decode().splitlines()
                  if line.startswith("data: {")]
        assert events and events[-1]["error"]["code"] == "shutting_down", got["stream"][-400:]
        assert got["stream"].rstrip().endswith(b"data: [DONE]"), got["stream"][-200:]
    finally:
        s.kill()
