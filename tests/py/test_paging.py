"""Paging: at pot_memory_limit, idle sessions' pots go to their snapshots and
are read back when a request needs them (docs/api.md, "Pot memory").

Each test runs a server whose pot_memory_limit holds two pots of budget 256
(6.3 MB each on the default model) and checks that paging is invisible but
for the wait: the answers, logprobs and counts of a paged session are those
of the same document on a server with room for everything."""
import socket
import time

import pytest

from server_util import Server, background_ended, metric, openai_client

# two pots of budget 256 fit, three do not (6,289,920 bytes each on SmolLM2-135M)
TIGHT = ["--budget-tokens", "256", "--prompt-cache-bytes", "0", "--pot-memory-limit", "14M", "--threads", "2"]
ROOMY = ["--budget-tokens", "256", "--prompt-cache-bytes", "0", "--pot-memory-limit", "256M", "--threads", "2"]


def licence_text(part, n=1800):
    """Natural prose no one here wrote: a slice of the GPL's text (every Debian has it)."""
    with open("/usr/share/common-licenses/GPL-3") as f:
        words = f.read().split()
    start = part * 600
    return " ".join(words[start:start + n // 6])


def document(i):
    return (f"{licence_text(i)}\n\nThe locker code of document {i} is {4100 + 37 * i}.\n"
            f"{licence_text(i + 4, 600)}\n")


def new_session(s):
    st, body, _ = s.request("POST", "/v1/sessions", {})
    assert st == 201, body
    return body["id"]


def upload(s, sid, text, final=True):
    st, body, _ = s.request("POST", f"/v1/sessions/{sid}/chunks" + ("?final=true" if final else ""),
                            raw=text.encode(), headers={"Content-Type": "text/plain"})
    assert st == 200, body
    return body


def ask(s, sid, i):
    st, body, _ = s.request("POST", "/v1/chat/completions", {
        "model": "m", "session": sid, "temperature": 0, "max_tokens": 12, "logprobs": True,
        "messages": [{"role": "user", "content": f"What is the locker code of document {i}?"}]})
    assert st == 200, body
    c = body["choices"][0]
    return c["message"]["content"], [t["logprob"] for t in c["logprobs"]["content"]]


def info(s, sid):
    st, body, _ = s.request("GET", f"/v1/sessions/{sid}")
    assert st == 200, body
    return body


def counts(body):
    return {k: body[k] for k in ("bytes_received", "tokens_ingested", "tokens_in_pot", "compressions",
                                 "last_seq", "final")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Documents 0-3 on a server with room for all of them: what paging must not change."""
    s = Server(tmp_path_factory.mktemp("roomy"), *ROOMY).start()
    try:
        out = {}
        for i in range(4):
            sid = new_session(s)
            upload(s, sid, document(i))
            out[i] = (ask(s, sid, i), counts(info(s, sid)))
        yield out
    finally:
        assert s.stop() == 0


def test_idle_pots_page_out_for_room_and_answer_as_before(tmp_path, reference):
    s = Server(tmp_path / "d", *TIGHT).start()
    try:
        ids = {}
        for i in range(2):
            ids[i] = new_session(s)
            upload(s, ids[i], document(i))
        assert ask(s, ids[0], 0) == reference[0][0]  # 0 is now the more recently used
        assert metric(s, "potserve_page_outs_total") == 0
        ids[2] = new_session(s)  # no room for a third pot: the least recently used idle one goes
        line = s.wait_log("paged out")
        assert ids[1] in line, line
        assert info(s, ids[1])["status"] == "stored" and info(s, ids[0])["status"] == "ready"
        assert counts(info(s, ids[1])) == reference[1][1]  # what the session knows stays known
        assert metric(s, "potserve_sessions_paged_out") == 1
        assert metric(s, "potserve_pot_memory_bytes") <= 14 << 20
        upload(s, ids[2], document(2))
        ids[3] = new_session(s)
        upload(s, ids[3], document(3))
        # every question finds its pot read back, and answers as the roomy server did
        for i in (1, 2, 0, 3, 1):
            assert ask(s, ids[i], i) == reference[i][0], i
            if i == 1:
                assert "from its snapshot" in s.wait_log(f"session {ids[1]}: paged in")
            assert counts(info(s, ids[i])) == reference[i][1], i
            assert metric(s, "potserve_pot_memory_bytes") <= 14 << 20
        assert metric(s, "potserve_page_ins_total") >= 4
        assert sum(info(s, sid)["status"] == "stored" for sid in ids.values()) == 2
        # a paged session is deleted without being read back, and its memory was not counted
        paged = next(sid for sid in ids.values() if info(s, sid)["status"] == "stored")
        ins, memory = metric(s, "potserve_page_ins_total"), metric(s, "potserve_pot_memory_bytes")
        assert s.request("DELETE", f"/v1/sessions/{paged}")[0] == 200
        assert metric(s, "potserve_page_ins_total") == ins
        assert metric(s, "potserve_pot_memory_bytes") == memory
        assert s.request("GET", f"/v1/sessions/{paged}")[0] == 404
    finally:
        assert s.stop() == 0


class HalfUpload:
    """An upload held open half sent (a raw socket): its session is busy until finish()."""

    def __init__(self, s, sid, text):
        self.body = text.encode()
        self.sock = socket.create_connection(("127.0.0.1", s.port))
        self.sock.sendall((f"POST /v1/sessions/{sid}/chunks?final=true HTTP/1.1\r\nHost: x\r\n"
                           f"Content-Type: text/plain\r\nContent-Length: {len(self.body)}\r\n\r\n").encode()
                          + self.body[:100])
        deadline = time.time() + 30
        while info(s, sid)["status"] != "ingesting":
            assert time.time() < deadline
            time.sleep(0.05)

    def finish(self):
        self.sock.sendall(self.body[100:])
        self.sock.settimeout(120)
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += self.sock.recv(65536)
        self.sock.close()
        assert reply.startswith(b"HTTP/1.1 200"), reply


def test_an_unfinished_document_pages_out_and_goes_on(tmp_path, reference):
    """A document still being uploaded, idle between chunks, pages out with its snapshot saved first
    (its log had grown past it) and reads on from there: the same pot as read in one go. (Pots
    whose snapshot is current page out before it: here the other pot is busy.)"""
    s = Server(tmp_path / "d", *TIGHT, "--snapshot-bytes", "1G", "--snapshot-seconds", "0").start()
    try:
        doc = document(3)
        cut = doc.index("The locker code")
        sid = new_session(s)
        upload(s, sid, doc[:cut], final=False)
        held = HalfUpload(s, new_session(s), document(0))
        other = new_session(s)  # its room is the unfinished document's pot
        line = s.wait_log(f"session {sid} paged out")
        assert "saved first" in line, line
        assert info(s, sid)["status"] == "stored"
        held.finish()
        upload(s, sid, doc[cut:])  # read back, then the rest
        assert counts(info(s, sid)) == dict(reference[3][1], last_seq=2)
        assert ask(s, sid, 3) == reference[3][0]
        assert s.request("DELETE", f"/v1/sessions/{other}")[0] == 200
    finally:
        assert s.stop() == 0


def test_a_pot_in_use_is_never_paged_out(tmp_path, reference):
    """A session receiving an upload keeps its pot however many sessions come after it: each new
    one pages out the one before it."""
    s = Server(tmp_path / "d", *TIGHT).start()
    try:
        busy = new_session(s)
        held = HalfUpload(s, busy, document(0))
        made = [new_session(s) for _ in range(3)]
        assert info(s, busy)["status"] == "ingesting"
        assert [info(s, sid)["status"] for sid in made] == ["stored", "stored", "ready"]
        held.finish()
        assert ask(s, busy, 0) == reference[0][0]
    finally:
        assert s.stop() == 0


def test_without_paging_a_full_server_says_429(tmp_path):
    s = Server(tmp_path / "d", *TIGHT, "--page-out-idle", "false").start()
    try:
        new_session(s), new_session(s)
        st, body, h = s.request("POST", "/v1/sessions", {})
        assert st == 429 and body["error"]["code"] == "insufficient_memory", body
        assert metric(s, "potserve_page_outs_total") == 0
    finally:
        assert s.stop() == 0


def test_an_uploads_copy_of_its_pot_gives_its_room_up(tmp_path):
    """An upload keeps a copy of its pot from before its chunk (a failure puts it back) when there is
    room: that copy took the room a second session needed, and the create was a 429 until the
    upload ended. The copy is dropped for room now (a failure would re-read the log instead)."""
    s = Server(tmp_path / "d", *TIGHT, "--page-out-idle", "false").start()
    try:
        a = new_session(s)
        body = (document(1) * 16).encode()
        up = socket.create_connection(("127.0.0.1", s.port))
        up.sendall(f"POST /v1/sessions/{a}/chunks HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:len(body) // 2])
        deadline = time.time() + 30  # its pieces in the pot, and the copy of it taken
        while metric(s, "potserve_pot_memory_bytes") < 2 * 6289920 and time.time() < deadline:
            time.sleep(0.05)
        assert metric(s, "potserve_pot_memory_bytes") == 2 * 6289920
        deadline = time.time() + 20
        while True:  # (a 429 while the copy is still being made: it is dropped once it is there)
            st, b, _ = s.request("POST", "/v1/sessions", {})
            if st != 429 or time.time() > deadline:
                break
            time.sleep(0.1)
        assert st == 201, b
        up.close()  # the chunk fails: without its copy the pot is read again from the log (empty here)
        deadline = time.time() + 60
        while (info(s, a)["status"] != "ready" or info(s, a)["bytes_received"]) and time.time() < deadline:
            time.sleep(0.1)
        assert (info(s, a)["status"], info(s, a)["bytes_received"], info(s, a)["tokens_ingested"]) == ("ready", 0, 0)
    finally:
        assert s.stop() == 0


def test_a_restart_with_more_sessions_than_fit_reads_them_within_the_limit(tmp_path, reference):
    """At start every session is read again (from its snapshot), one at a time: those read first
    page out for the later ones, so the limit holds from the start, and all answer as before."""
    s = Server(tmp_path / "d", *ROOMY).start()
    ids = {}
    try:
        for i in range(4):
            ids[i] = new_session(s)
            upload(s, ids[i], document(i))
    finally:
        assert s.stop() == 0
    s = Server(tmp_path / "d", *TIGHT).start()
    try:
        for i in range(4):
            s.wait_log(f"session {ids[i]}: restored")
        assert metric(s, "potserve_pot_memory_bytes") <= 14 << 20
        assert metric(s, "potserve_sessions_paged_out") == 2
        for i in (0, 3, 2, 1):
            assert ask(s, ids[i], i) == reference[i][0], i
            assert counts(info(s, ids[i])) == reference[i][1], i
    finally:
        assert s.stop() == 0


def test_openai_clients_reach_paged_files_without_retrying(tmp_path, reference):
    """Files (OpenAI's Files API) are sessions and page alike: the official client, with no retries
    allowed, lists them processed and asks about each (chat, a stream, Responses, a background
    response) while only two pots fit, and gets the roomy server's answers."""
    s = Server(tmp_path / "d", *TIGHT).start()
    client = openai_client(s)
    try:
        files = {}
        for i in range(4):
            p = tmp_path / f"doc{i}.txt"
            p.write_text(document(i))
            with open(p, "rb") as f:
                files[i] = client.files.create(file=f, purpose="user_data")
            files[i] = client.files.wait_for_processing(files[i].id, poll_interval=0.2, max_wait_seconds=120)
        assert metric(s, "potserve_sessions_paged_out") == 2
        assert {f.status for f in client.files.list()} == {"processed"}

        def question(i):
            return [{"role": "user", "content": [{"type": "file", "file": {"file_id": files[i].id}},
                                                 {"type": "text", "text": f"What is the locker code of document {i}?"}]}]
        for i in (0, 1):  # paged out by 2 and 3
            c = client.chat.completions.create(model="m", temperature=0, max_tokens=12, messages=question(i))
            assert c.choices[0].message.content == reference[i][0][0], i
        stream = client.chat.completions.create(model="m", temperature=0, max_tokens=12, messages=question(2),
                                                stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == reference[2][0][0]
        assert info(s, files[3].session)["status"] == "stored"
        bg = client.responses.create(model="m", temperature=0, max_output_tokens=12, background=True, input=[
            {"role": "user", "content": [{"type": "input_file", "file_id": files[3].id},
                                         {"type": "input_text", "text": "What is the locker code of document 3?"}]}])
        assert background_ended(client, bg.id)[0].output_text == reference[3][0][0]
        assert client.files.content(files[0].id).text == document(0)  # its log, not its pot
        for f in files.values():
            client.files.delete(f.id)
    finally:
        assert s.stop() == 0
