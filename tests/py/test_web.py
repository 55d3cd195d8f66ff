"""The web page at / in a real browser (Debian's Chromium driven by
Playwright), against a real server; and the endpoints the page added
(GET /v1/server, GET /v1/sessions/{id}/text) over plain HTTP.

The long-document part (260 KiB in six chunks, a reload mid-upload) runs on
the tiny fixture model, whose ingest is fast enough for `make test`; the pass
key is asked of the default model over a shorter document through the same
page. Also on the tiny model: a dropped file and pasted text reach the server whole, a wrong key is asked
again, the server's error messages show on the page, and what a probe of the page found stays fixed
(uploads at odd chunk limits and in two tabs, refused files, chat's labels and markdown, focus).
Screenshots go to build/web/."""
import contextlib
import json
import os
import re
import signal
import time

import pytest

from conftest import FIXTURES, ROOT
from server_util import Server

CHROMIUM = os.environ.get("POTSERVE_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "build" / "web"
KEY = "web-test-key"
# the tiny server's max_chunk_bytes: the page cuts uploads no larger (its own size is 64 KiB), so
# six chunks take a 260 KiB document
TINY_CHUNK_BYTES = 48 * 1024
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there. ")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is 71432. Remember it. 71432 is the pass key. "
# the region shown holds the key's first token (the column may start right at it)
HAS_KEY = "() => /(is |^\\s?)7/.test(document.getElementById('region-text').textContent)"


def passkey_doc(n_bytes, depth=0.4):
    reps = (n_bytes - len(INTRO) - len(NEEDLE)) // len(FILLER)
    cut = int(reps * depth)
    before = INTRO + FILLER * cut
    return before + NEEDLE + FILLER * (reps - cut), before


def auth(key=KEY):
    return {"Authorization": f"Bearer {key}"}


def get(srv, path, key=KEY):
    st, body, _ = srv.request("GET", path, headers=auth(key))
    assert st == 200, body
    return body


def chunk_count(data, chunk=TINY_CHUNK_BYTES):
    """Chunks the page cuts data into: `chunk` bytes each, moved back to a UTF-8 boundary."""
    n, off = 0, 0
    while off < len(data):
        end = min(len(data), off + chunk)
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end -= 1
        off, n = end, n + 1
    return n


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright missing: `make pytest` installs it")
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} missing: `make pytest` installs Debian's chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def open_page(browser, srv, width=1280, height=860, context=None):
    """A new tab on the page: in a new browser context (its own storage), or in `context` (shared)."""
    ctx = context or browser.new_context(viewport={"width": width, "height": height})
    page = ctx.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    # the browser logs every 4xx (the key prompt's 401, a busy session's 409): those are expected
    page.on("console", lambda m: page.errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
    page.refused = []  # the answers that were not 2xx: what a wait that times out tells
    page.on("response", lambda r: page.refused.append(f"{r.request.method} {r.url} {r.status}") if r.status >= 300 else None)
    page.goto(srv.url + "/")
    return page


def wait_shown(page, selector, timeout=30000):
    """wait_for_selector that, timing out, says what the page said and which requests it was refused."""
    try:
        return page.wait_for_selector(selector, timeout=timeout)
    except Exception as e:
        said = page.eval_on_selector_all(".msg", "els => els.map(e => e.textContent)")
        raise AssertionError(f"{selector} not shown: {e}; the page said {said}; refused: {page.refused}; "
                             f"sessions listed: {page.eval_on_selector_all('#sessions li', 'ls => ls.map(l => l.dataset.id)')}")


def enter_key(page, key=KEY):
    page.wait_for_selector("#key-dialog[open]", timeout=10000)
    page.fill("#key-input", key)
    page.press("#key-input", "Enter")
    page.wait_for_selector("#model:not(:empty)", timeout=10000)


def upload_through_page(page, path, budget=None):
    page.click("#tab-doc")
    page.set_input_files("#file", str(path))
    if budget:
        page.fill("#set-budget", str(budget))
    page.click("#start")
    page.wait_for_selector("#upload:not([hidden])", timeout=10000)


def wait_done(page, timeout_s):
    page.wait_for_selector('#upload[data-done="true"]', timeout=timeout_s * 1000)
    assert page.get_attribute("#upload-bar", "aria-valuenow") == "100"
    assert page.evaluate("document.getElementById('upload-fill').style.width") == "100%"


def ask(page, session_id, question, max_tokens, reread=False):
    page.click("#tab-chat")
    page.select_option("#chat-over", session_id)
    page.set_checked("#chat-reread", reread)
    if not page.is_visible("#chat-max"):
        page.click(".chat-settings summary")
    page.fill("#chat-max", str(max_tokens))
    page.fill("#chat-temp", "0")
    # counts the repaints of the answer while it streams in (and the re-read's progress notes)
    page.evaluate("""() => {
        window.paints = [];
        window.progress = [];
        new MutationObserver(() => {
            const b = document.querySelector('.turn.assistant:last-child .body');
            if (b) window.paints.push(b.textContent.length);
            const p = b && b.querySelector('.reread-progress');
            if (p) window.progress.push(p.textContent);
        }).observe(document.getElementById('chat-log'), {subtree: true, childList: true, characterData: true});
    }""")
    page.fill("#chat-input", question)
    with page.expect_response("**/v1/chat/completions", timeout=300000) as resp:
        page.press("#chat-input", "Enter")
    page.wait_for_selector('.turn.assistant[data-done="true"]', timeout=300000)
    answer = page.inner_text(".turn.assistant:last-child .body")
    paints = page.evaluate("window.paints")
    r = resp.value
    assert r.headers["content-type"].startswith("text/event-stream")
    deltas = []
    for line in r.text().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            ch = json.loads(line[6:])["choices"]
            if ch and ch[0]["delta"].get("content"):
                deltas.append(ch[0]["delta"]["content"])
    return answer, paints, deltas


def map_pixels(page):
    """The colour at the centre of every cell of the drawn map: [layer][bin] -> [r, g, b]."""
    return page.evaluate("""() => {
        const c = document.getElementById('map'), g = c.getContext('2d');
        const bins = +c.dataset.bins, layers = +c.dataset.layers, out = [];
        for (let l = 0; l < layers; l++) {
            const row = [];
            for (let b = 0; b < bins; b++) {
                const x = Math.floor((b + 0.5) * c.width / bins), y = Math.floor((l + 0.5) * c.height / layers);
                row.push(Array.from(g.getImageData(x, y, 1, 1).data.slice(0, 3)));
            }
            out.push(row);
        }
        return out;
    }""")


def bin_range(b, bins, n):
    """Token range of bin b: the server puts token i in bin i * bins // n."""
    return -(-b * n // bins), -(-(b + 1) * n // bins)


# ---- the long document on the tiny model --------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory, fixtures):
    # the later --model and --threads win over the ones server_util passes; one thread: the tiny
    # model's matrices are too small to share (an AVX2 machine ingested 501K tokens in 32 s on one
    # thread, 54 s on two)
    s = Server(tmp_path_factory.mktemp("web"), "--model", FIXTURES / "tiny_llama.gguf", "--api-key", KEY,
               "--budget-tokens", "128", "--threads", "1", "--max-chunk-bytes", str(TINY_CHUNK_BYTES))
    s.start()
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def big_doc(tmp_path_factory):
    text, before = passkey_doc(260 * 1024)
    path = tmp_path_factory.mktemp("doc") / "passkey-260k.txt"
    path.write_text(text)
    return path, text, before


def test_page_long_upload_reload_resume_chat_and_map(browser, tiny, big_doc):
    path, text, before = big_doc
    data = text.encode()
    n_chunks = chunk_count(data)
    assert n_chunks == 6
    page = open_page(browser, tiny)
    enter_key(page)  # the server has keys: the page asks for one

    # 1. an uninterrupted upload: the bar moves and reaches the end
    upload_through_page(page, path)
    seen = set()
    deadline = time.time() + 600
    while time.time() < deadline and page.get_attribute("#upload", "data-done") != "true":
        seen.add(page.inner_text("#up-tokens"))
        time.sleep(0.2)
    wait_done(page, 5)
    assert len(seen) >= 3, f"the progress never moved: {seen}"
    sessions = get(tiny, "/v1/sessions")["data"]
    assert len(sessions) == 1
    first = sessions[0]
    assert first["final"] and first["bytes_received"] == len(data) and first["last_seq"] == n_chunks
    assert first["metadata"]["title"] == path.name
    assert page.inner_text("#up-tokens") == f"{first['tokens_ingested']:,}"
    assert page.inner_text("#up-comp") == f"{first['compressions']:,}"

    # 2. the pass key question: the answer streams in
    answer, _, deltas = ask(page, first["id"], "What is the pass key?", 24)
    assert answer.strip() and len(deltas) >= 3  # streamed: one event per piece
    assert " ".join(answer.split()) == " ".join("".join(deltas).split())
    # ... and re-read for the question: its progress shows while the document is read again
    assert not page.is_disabled("#chat-reread")
    with page.expect_request("**/v1/chat/completions") as sent:
        answer, _, _ = ask(page, first["id"], "What is the pass key?", 8, reread=True)
    assert sent.value.post_data_json["reread"] is True
    progress = [int(re.search(r"(\d+) %", p).group(1)) for p in page.evaluate("window.progress")]
    assert len(set(progress)) >= 2 and progress == sorted(progress) and progress[-1] == 100, progress
    note = page.inner_text(".turn.assistant:last-child .foot")
    assert f"re-read {first['tokens_ingested']:,} tokens in" in note, note
    page.set_checked("#chat-reread", False)

    # 3. the same document again, with the network gone for a while after the first chunk and the
    # page reloaded after the second: nothing lost
    upload_through_page(page, path)

    def second_session(min_seq):
        deadline = time.time() + 600
        while time.time() < deadline:
            ids = [s["id"] for s in get(tiny, "/v1/sessions")["data"] if s["id"] != first["id"]]
            s = get(tiny, f"/v1/sessions/{ids[0]}") if ids else None
            if s and s["last_seq"] >= min_seq:
                return s
            time.sleep(0.2)
        raise AssertionError("the second upload did not move")

    second = second_session(1)
    page.context.set_offline(True)
    page.wait_for_function("() => document.getElementById('upload-note').textContent.includes('retrying')",
                           timeout=60000)
    time.sleep(2)
    page.context.set_offline(False)
    second = second_session(2)
    assert not second["final"], "the upload ended before the reload"
    page.reload()  # the key stays (sessionStorage); the upload carries on by itself
    page.wait_for_selector("#upload[data-resumed-after]", timeout=60000)
    assert int(page.get_attribute("#upload", "data-resumed-after")) >= 2
    wait_done(page, 600)
    assert not page.is_visible("#key-dialog")
    after = get(tiny, f"/v1/sessions/{second['id']}")
    for k in ("bytes_received", "tokens_ingested", "tokens_in_pot", "compressions", "last_seq", "final"):
        assert after[k] == first[k], (k, after[k], first[k])
    r1 = get(tiny, f"/v1/sessions/{first['id']}/retention?bins=64")
    r2 = get(tiny, f"/v1/sessions/{second['id']}/retention?bins=64")
    assert r1["layers"] == r2["layers"] and r1["coverage"] == r2["coverage"]

    # 4. the retention map is drawn from the API's numbers
    page.click(f'#sessions li[data-id="{first["id"]}"] .pick')
    page.click("#tab-map")
    wait_shown(page, "#map:not([hidden])[data-bins]")
    bins = int(page.get_attribute("#map", "data-bins"))
    ret = get(tiny, f"/v1/sessions/{first['id']}/retention?bins={bins}")
    n = ret["tokens_ingested"]
    assert n == first["tokens_ingested"]
    assert page.inner_text("#map-coverage") == f"{ret['coverage'] * 100:.2f} %"
    pixels = map_pixels(page)
    assert len(pixels) == len(ret["layers"]) and len(pixels[0]) == bins
    values = [[row["kept_per_bin"][b] / (bin_range(b, bins, n)[1] - bin_range(b, bins, n)[0])
               for b in range(bins)] for row in ret["layers"]]
    want = page.evaluate("(vs) => vs.map((row) => row.map((v) => window.potserve.colorFor(v)))", values)
    assert pixels == want
    assert len({tuple(p) for row in pixels for p in row}) > 3  # not one flat colour

    # 5. the column holding the pass key shows its text, as the API gives it
    key_at = len(get_tokens(tiny, before + "The pass key is 7")) - 1  # the key's first token
    col = key_at * bins // n
    box = page.locator("#map").bounding_box()
    page.mouse.click(box["x"] + (col + 0.5) * box["width"] / bins, box["y"] + box["height"] / 2)
    page.wait_for_function(HAS_KEY, timeout=60000)
    start, end = bin_range(col, bins, n)
    t = get(tiny, f"/v1/sessions/{first['id']}/text?start={start}&end={end}")
    assert page.inner_text("#region-title").startswith(f"Tokens {start:,}")
    assert page.evaluate("document.getElementById('region-text').textContent") == "".join(s["text"] for s in t["spans"])
    assert "".join(s["text"] for s in t["spans"]) in text

    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "tiny-map-desktop.png"), full_page=True)
    assert not page.errors, page.errors



# ---- the endpoints the page added, over plain HTTP ------------------------------------------------

def test_page_files_headers_and_no_key_needed(tiny):
    for path, ctype in (("/", "text/html"), ("/app.js", "text/javascript"), ("/style.css", "text/css"),
                        ("/favicon.svg", "image/svg+xml")):
        st, body, h = tiny.request("GET", path)  # no key: the page asks for one itself
        assert st == 200 and h["Content-Type"].startswith(ctype), (path, h)
        assert "script-src 'self'" in h["Content-Security-Policy"] and "unsafe-inline" not in h["Content-Security-Policy"]
        assert h["X-Content-Type-Options"] == "nosniff" and h["Cache-Control"] == "no-cache"
        st, _, h2 = tiny.request("GET", path, headers={"If-None-Match": h["ETag"]})
        # RFC 9110 8.6: a 304's Content-Length, if any, is the 200's (it said 0, which a cache may store)
        assert st == 304 and h2["ETag"] == h["ETag"] and h2["Content-Length"] == h["Content-Length"], (h, h2)
    with open(ROOT / "server" / "web" / "app.js", encoding="utf-8") as f:
        assert tiny.request("GET", "/app.js")[1] == f.read()  # the file as it is, compiled in
    st, html, _ = tiny.request("GET", "/")
    assert "<script" in html and "<script>" not in html  # no inline script
    assert tiny.request("POST", "/", raw=b"x")[0] == 405
    assert tiny.request("GET", "/v1/server")[0] == 401  # the API still needs the key


def test_model_output_is_never_parsed_as_html(browser, tiny):
    """Whatever a model writes, the page builds its markdown into elements around text nodes: HTML
    stays text, no script runs, and a link keeps only an http(s) target. The answer is a stream
    the test writes (through the browser's request routing), so it can say anything."""
    hostile = ("<img src=x onerror=\"window.pwned=1\"> <script>window.pwned=2</script> "
               "[go](javascript:window.pwned=3) [docs](https://example.com/a) **bold** `<b>code</b>`")
    events = "".join(f"data: {json.dumps(c)}\n\n" for c in (
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
        {"choices": [{"index": 0, "delta": {"content": hostile[:40]}}]},
        {"choices": [{"index": 0, "delta": {"content": hostile[40:]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})) + "data: [DONE]\n\n"
    page = open_page(browser, tiny)
    enter_key(page)
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=events))
    ask_without_session(page, "Say something.")
    body = ".turn.assistant:last-child .body"
    assert page.evaluate("window.pwned") is None
    assert page.locator(f"{body} img, {body} script, {body} b").count() == 0
    text = page.inner_text(body)
    assert '<img src=x onerror="window.pwned=1">' in text and "<script>" in text and "<b>code</b>" in text
    hrefs = page.eval_on_selector_all(f"{body} a", "as => as.map(a => a.getAttribute('href'))")
    assert hrefs == ["https://example.com/a"], hrefs
    assert page.inner_text(f"{body} strong") == "bold"
    assert not page.errors, page.errors
    page.context.close()


def test_page_cuts_chunks_between_characters(browser, tiny, tmp_path):
    """A document of two-, three- and four-byte characters whose chunk size falls inside one: the
    page moves each cut back to a character's start (the server refuses a chunk that is not UTF-8),
    and the session holds every byte."""
    unit = "Grüße — 漢字とテスト 🙂 ".encode()
    data = unit * (2 * TINY_CHUNK_BYTES // len(unit) + 3)
    while not all(data[k * TINY_CHUNK_BYTES] & 0xC0 == 0x80 for k in (1, 2)):
        data = b"x" + data  # until both cuts fall inside a character
    path = tmp_path / "utf8-cuts.txt"
    path.write_bytes(data)
    page = open_page(browser, tiny)
    enter_key(page)
    upload_through_page(page, path)
    wait_done(page, 300)
    mine = [x for x in get(tiny, "/v1/sessions")["data"] if x["metadata"].get("title") == path.name]
    assert len(mine) == 1, mine
    assert mine[0]["final"] and mine[0]["bytes_received"] == len(data), mine[0]
    assert mine[0]["last_seq"] == chunk_count(data) == 3, mine[0]
    assert not page.errors, page.errors
    page.context.close()


def session_text(srv, sid):
    """The whole document of a session as the server holds it (its text endpoint, 8192 tokens a call)."""
    n = get(srv, f"/v1/sessions/{sid}")["tokens_ingested"]
    return "".join(sp["text"] for start in range(0, n, 8192)
                   for sp in get(srv, f"/v1/sessions/{sid}/text?start={start}&end={start + 8192}")["spans"])


def session_titled(srv, name):
    mine = [x for x in get(srv, "/v1/sessions")["data"] if x["metadata"].get("title") == name]
    assert len(mine) == 1, mine
    return mine[0]


def test_pasted_and_dropped_documents_reach_the_server_whole(browser, tiny):
    """A file dropped on the drop zone (dragenter, dragover, drop with a DataTransfer holding a File,
    dispatched as a browser does) and text pasted into the paste box (a real Ctrl+V: the trusted paste
    event carries the clipboard, which the browser inserts) each become a session holding every byte,
    read back through the session's text endpoint."""
    line = "Zeile {:04d}: Grüße —\tnaïve 漢字 🙂  two  spaces, 0x{:x}.\n"
    dropped = "".join(line.format(i, i * 7919) for i in range(1200))  # two chunks
    data = dropped.encode()
    assert chunk_count(data) == 2
    # a textarea turns CR LF into LF as it takes a paste: the pasted document has LF only
    rows = "".join(f"Row {i}\tvalue {i * i}\tnote ünïcödé ✓\n" for i in range(600))
    pasted = "  Pasted report: quarterly numbers\n\n" + rows + "\n  trailing blank line and spaces  \n\n"
    page = open_page(browser, tiny)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=tiny.url)
    enter_key(page)

    # the drop: the page must take it (cancel dragover) and use the File the DataTransfer holds
    accepted = page.evaluate("""(text) => {
        const dt = new DataTransfer();
        dt.items.add(new File([text], 'dropped-notes.txt', {type: 'text/plain'}));
        const zone = document.getElementById('drop'), fire = (type) => {
            const ev = new DragEvent(type, {dataTransfer: dt, bubbles: true, cancelable: true});
            zone.dispatchEvent(ev);
            return ev.defaultPrevented;
        };
        fire('dragenter');
        const over = fire('dragover');
        fire('drop');
        return over;
    }""", dropped)
    assert accepted, "the drop zone did not accept the drag (dragover not cancelled)"
    assert page.inner_text("#drop-text").startswith("dropped-notes.txt")
    page.click("#start")
    page.wait_for_selector("#upload:not([hidden])", timeout=10000)
    wait_done(page, 120)
    s = session_titled(tiny, "dropped-notes.txt")
    assert s["final"] and s["bytes_received"] == len(data) and s["last_seq"] == 2, s
    assert s["metadata"]["bytes"] == len(data)
    assert session_text(tiny, s["id"]) == dropped

    # the paste: the clipboard holds the text, Ctrl+V in the paste box
    page.evaluate("(t) => navigator.clipboard.writeText(t)", pasted)
    page.evaluate("""() => document.getElementById('paste').addEventListener('paste',
        (ev) => { window.pasteEvent = {trusted: ev.isTrusted,
                                       length: ev.clipboardData.getData('text/plain').length}; })""")
    page.click("#paste-box summary")
    page.focus("#paste")
    page.keyboard.press("Control+V")
    assert page.evaluate("window.pasteEvent") == {"trusted": True, "length": len(pasted)}
    assert page.input_value("#paste") == pasted, "the paste box did not take the paste"
    page.click("#start")
    page.wait_for_function("(t) => document.getElementById('upload-title').textContent === t",
                           arg="Read Pasted report: quarterly numbers", timeout=30000)
    wait_done(page, 5)
    s = session_titled(tiny, "Pasted report: quarterly numbers")  # its first line, trimmed
    assert s["final"] and s["bytes_received"] == len(pasted.encode()) and s["last_seq"] == 1, s
    assert session_text(tiny, s["id"]) == pasted
    assert page.input_value("#paste") == ""  # emptied once the session took it
    assert not page.errors, page.errors
    page.context.close()


def test_a_wrong_key_is_asked_again_then_the_right_one_works(browser, tiny):
    """With keys on the server, the page asks for one (its key dialog); a key the server refuses
    brings the dialog back saying so, and the right key then loads the page."""
    page = open_page(browser, tiny)
    sent = []
    page.on("response", lambda r: sent.append((r.request.headers.get("authorization"), r.status))
            if r.url.endswith("/v1/server") else None)
    page.wait_for_selector("#key-dialog[open]", timeout=10000)
    assert page.is_hidden("#key-error")  # the first time: no complaint
    page.fill("#key-input", "not-the-key")
    with page.expect_response("**/v1/server") as refused:
        page.press("#key-input", "Enter")
    assert refused.value.status == 401
    page.wait_for_selector("#key-dialog[open] #key-error:not([hidden])", timeout=10000)
    assert page.inner_text("#key-error") == "The server refused that key."
    assert page.is_visible("#key-error") and page.inner_text("#model") == ""
    page.keyboard.press("Escape")  # the dialog stays until a key is given
    assert page.is_visible("#key-dialog")
    enter_key(page)
    assert page.inner_text("#model") == "tiny_llama"
    assert sent[-2:] == [("Bearer not-the-key", 401), (f"Bearer {KEY}", 200)], sent
    assert not page.is_visible("#key-dialog")
    assert page.evaluate("sessionStorage.getItem('potserve.key')") == KEY
    page.wait_for_function("() => document.getElementById('sessions').children.length > 0 || "
                           "!document.getElementById('sessions-empty').hidden", timeout=10000)
    assert page.is_visible("#key-button")
    assert not page.errors, page.errors
    page.context.close()


def error_message(response):
    """The server's error message in a response: a JSON error, or an SSE `error` event."""
    text = response.text()
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        ev = text.split("event: error\ndata: ", 1)[1].split("\n", 1)[0]
        return json.loads(ev)["error"]["message"]
    return json.loads(text)["error"]["message"]


def shown(page, text):
    """The page's message holding text, asserted visible (an alert, not an info note)."""
    msg = page.locator("#messages .msg[role=alert]", has_text=text)
    msg.wait_for(state="visible", timeout=10000)
    return msg.locator("span").inner_text()


def test_server_error_messages_reach_the_page(browser, tiny, tmp_path):
    """Errors the server answers are shown on the page with the server's own message: a session's
    settings it refuses (422), and an upload it fails midway (policy `none` over a document longer than
    the budget: the chunk's `error` event), whose session, left empty, the page removes."""
    page = open_page(browser, tiny)
    enter_key(page)
    page.click("#tab-doc")

    # 422 at creation: keep must be less than the budget
    doc = tmp_path / "too-long-for-none.txt"
    doc.write_text("A short note. " * 40)
    page.set_input_files("#file", str(doc))
    page.fill("#set-budget", "64")
    page.fill("#set-keep", "64")
    with page.expect_response(lambda r: r.url.endswith("/v1/sessions") and r.request.method == "POST") as r:
        page.click("#start")
    assert r.value.status == 422
    msg = error_message(r.value)
    assert shown(page, msg) == f"Could not start: {msg}"

    # an upload the server fails midway: policy none, a document longer than its pot
    page.fill("#set-keep", "")
    page.fill("#set-budget", "")
    page.select_option("#set-policy", "none")
    with page.expect_response("**/chunks*", timeout=60000) as r:
        page.click("#start")
    msg = error_message(r.value)
    assert "does not fit" in msg, msg
    said = f"{msg} (the empty session was removed)"  # the chunk was undone: the session had nothing
    assert shown(page, msg) == f"Upload of {doc.name} stopped: {said}"
    page.wait_for_function("(m) => document.getElementById('upload-note').textContent === 'Stopped: ' + m",
                           arg=said, timeout=10000)
    assert page.is_visible("#upload-note")
    assert not [x for x in get(tiny, "/v1/sessions")["data"] if x["metadata"].get("title") == doc.name]
    assert page.errors == [], page.errors
    page.context.close()


def test_server_defaults(tiny):
    d = get(tiny, "/v1/server")
    assert d["object"] == "server" and d["model"] == "tiny_llama" and d["context_length"] == 256
    assert d["session_defaults"] == {"budget_tokens": 128, "keep_tokens": 64, "policy": "infinipot",
                                     "schedule": "fixed"}
    assert "infinipot" in d["policies"] and "none" in d["policies"] and d["schedules"] == ["fixed", "imdc"]
    # what a session made with no settings gets
    st, s, _ = tiny.request("POST", "/v1/sessions", {}, auth())
    assert st == 201 and s["budget_tokens"] == 128 and s["keep_tokens"] == 64 and s["policy"] == "infinipot"
    tiny.request("DELETE", f"/v1/sessions/{s['id']}", headers=auth())


def test_session_text_maps_tokens_back_to_the_document(tiny):
    words = "river café naïve 東京 résumé 🌍 the of mountain quietly sings".split()
    doc = " ".join(words[(i * 7 + i // 3) % len(words)] for i in range(2500)) + "\n"
    st, s, _ = tiny.request("POST", "/v1/sessions", {}, auth())
    sid = s["id"]
    half = len(doc.encode()) // 2
    while (doc.encode()[half] & 0xC0) == 0x80:
        half -= 1
    for seq, part, final in ((1, doc.encode()[:half], False), (2, doc.encode()[half:], True)):
        st, r, _ = tiny.request("POST", f"/v1/sessions/{sid}/chunks?seq={seq}" + ("&final=true" if final else ""),
                                raw=part, headers=dict(auth(), **{"Content-Type": "text/plain"}))
        assert st == 200, r
    n = r["tokens_ingested"]
    assert n == len(get_tokens(tiny, doc))
    # consecutive ranges of odd sizes give back the document exactly
    text, step, start = [], 997, 0
    while start < n:
        t = get(tiny, f"/v1/sessions/{sid}/text?start={start}&end={start + step}")
        assert t["object"] == "session.text" and t["start"] == start and t["end"] == min(n, start + step)
        assert t["tokens_ingested"] == n and t["heads"] == 2 * 2
        text += [sp["text"] for sp in t["spans"]]
        assert all(0 <= sp["kept"] <= t["heads"] for sp in t["spans"])
        start = t["end"]
    assert "".join(text) == doc
    # the kept counts agree with the retention histogram, bin by bin
    ret = get(tiny, f"/v1/sessions/{sid}/retention?bins=8")
    held = 0
    for b in range(8):
        lo, hi = bin_range(b, 8, n)
        t = get(tiny, f"/v1/sessions/{sid}/text?start={lo}&end={hi}")
        assert sum(sp["tokens"] for sp in t["spans"]) == hi - lo
        pairs = sum(l["kept_per_bin"][b] for l in ret["layers"]) * 2  # the histogram is per KV head
        assert round(pairs) == sum(sp["kept"] * sp["tokens"] for sp in t["spans"]), b
        held += round(pairs)
    assert held > 0
    # errors name the field; another key cannot read it
    for q, field in (("", "start"), ("?start=x", "start"), ("?start=5&end=2", "end"),
                     ("?start=0&end=9000", "end"), ("?start=-1", "start")):
        st, e, _ = tiny.request("GET", f"/v1/sessions/{sid}/text{q}", headers=auth())
        assert st == 400 and e["error"]["param"] == field, (q, e)
    assert get(tiny, f"/v1/sessions/{sid}/text?start={n + 10}")["spans"] == []
    assert tiny.request("GET", f"/v1/sessions/{sid}/text?start=0", headers=auth("nope"))[0] == 401
    tiny.request("DELETE", f"/v1/sessions/{sid}", headers=auth())


# ---- what a probe of the page found ---------------------------------------------------------------

@contextlib.contextmanager
def own_tiny_server(data_dir, *flags):
    """A tiny-model server of the test's own, without keys, for settings the shared one lacks."""
    s = Server(data_dir, "--model", FIXTURES / "tiny_llama.gguf", "--threads", "1", *flags)
    s.start()
    try:
        yield s
    except BaseException:
        s.kill()
        raise
    assert s.stop() == 0


def chunk_posts(page):
    """The chunk uploads the page sends from now on (their URLs)."""
    sent = []
    page.on("request", lambda r: sent.append(r.url) if "/chunks" in r.url else None)
    return sent


def note_is(page, pattern, timeout_s=10):
    """Waits for the upload note to match the regular expression; returns the note."""
    page.wait_for_function("(p) => new RegExp(p).test(document.getElementById('upload-note').textContent)",
                           arg=pattern, timeout=timeout_s * 1000)
    return page.inner_text("#upload-note")


def filler_file(path, n_bytes):
    """A file of about n_bytes of FILLER at path: (its text, path)."""
    text = FILLER * (n_bytes // len(FILLER))
    path.write_text(text)
    return text, path


def record_upload_notes(page):
    """From now on, every text the upload note shows is kept in window.notes."""
    page.evaluate("""() => {
        window.notes = [];
        new MutationObserver(() => window.notes.push(document.getElementById('upload-note').textContent))
            .observe(document.getElementById('upload-note'), {childList: true, subtree: true, characterData: true});
    }""")


def ask_without_session(page, question, timeout=30000):
    """Asks question in Chat with no session and waits for the answer to end."""
    page.click("#tab-chat")
    page.select_option("#chat-over", "")
    page.fill("#chat-input", question)
    page.press("#chat-input", "Enter")
    page.wait_for_selector('.turn.assistant[data-done="true"]', timeout=timeout)


def answer_events(content, finish="stop", usage=None):
    """A streamed chat answer, as the server sends it, for the browser's request routing."""
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": content}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}]
    if usage:
        chunks.append({"choices": [], "usage": usage})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def route_answers(page, answers):
    """Answers the page's questions with the streams in `answers`, first to last."""
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=answers.pop(0)))


def latin1_file(tmp_path, name):
    path = tmp_path / name
    path.write_bytes("Café crème, naïve façade: a note saved as Latin-1.\n".encode("latin-1"))
    return path


def test_a_chunk_limit_too_small_for_a_character_stops_and_names_it(browser, tmp_path):
    """A server whose max_chunk_bytes (2) cannot hold one of the document's characters: the page stops
    with an error naming the limit, instead of cutting an empty chunk (which the server takes, and the
    upload never moves on) or, at the document's start, half a character. What fits goes up first."""
    with own_tiny_server(tmp_path / "data", "--max-chunk-bytes", "2") as srv:
        page = open_page(browser, srv)
        page.wait_for_selector("#model:not(:empty)", timeout=10000)
        sent = chunk_posts(page)
        for name, text, at in (("emoji.txt", "ab🙂 cd", 2), ("kanji.txt", "漢字 ok", 0)):
            del sent[:]
            path = tmp_path / name
            path.write_text(text, encoding="utf-8")
            upload_through_page(page, path)
            note = note_is(page, "^Stopped")
            assert ("the server takes chunks of at most 2 bytes (its max_chunk_bytes), too few for the "
                    f"character at byte {at} of this document") in note, note
            time.sleep(0.5)  # nothing more goes up
            assert len(sent) == at // 2, sent  # "ab", or nothing
            page.click("#upload-cancel")  # "Close"
            mine = [x for x in srv.request("GET", "/v1/sessions")[1]["data"] if x["metadata"]["title"] == name]
            if at:
                assert len(mine) == 1 and mine[0]["bytes_received"] == 2 and mine[0]["last_seq"] == 1, mine
            else:
                assert mine == []  # it took nothing: the page removed it
        assert not page.errors, page.errors
        page.context.close()


def test_a_second_tab_leaves_an_upload_to_the_first_and_takes_over_when_it_closes(browser, tiny, tmp_path):
    """Tabs of a browser share the record of an unfinished upload (localStorage, IndexedDB): a second
    tab opened while the first uploads shows that upload as the other tab's, sends nothing and offers
    no Cancel (which would drop the first tab's record) or Delete, and carries the upload on once the
    first tab is closed."""
    text, path = filler_file(tmp_path / "two-tabs.txt", 5 * TINY_CHUNK_BYTES)
    data = text.encode()
    first = open_page(browser, tiny)
    enter_key(first)
    upload_through_page(first, path)
    note_is(first, "^Chunk 1 stored", 60)
    second = open_page(browser, tiny, context=first.context)
    sent = chunk_posts(second)
    enter_key(second)  # the key is kept per tab
    note = note_is(second, "^Another tab of this browser is sending this document")
    assert second.inner_text("#upload-title") == f"Reading {path.name} in another tab", note
    assert second.is_hidden("#upload-cancel")
    sid = second.evaluate("localStorage.getItem('potserve.upload')")
    assert second.is_disabled(f'#sessions li[data-id="{sid}"] .del')
    time.sleep(1)
    assert sent == [], sent  # only the first tab sends
    assert not get(tiny, f"/v1/sessions/{sid}")["final"], "the upload ended before the second tab was checked"
    first.close()  # mid-chunk: the server undoes that chunk, and the second tab goes on from the last one
    wait_done(second, 120)
    assert sent, "the second tab did not take over"
    s = get(tiny, f"/v1/sessions/{sid}")
    assert s["final"] and s["bytes_received"] == len(data), s
    assert s["tokens_ingested"] == len(get_tokens(tiny, text))
    assert second.evaluate("localStorage.getItem('potserve.upload')") is None
    assert not second.errors, second.errors
    second.context.close()


def test_a_new_upload_does_not_show_the_last_ones_note(browser, tiny, tmp_path):
    """The note under the progress bar is the running upload's: the last upload's "Stopped: …" goes as
    soon as the next one starts, not when its first chunk is stored."""
    page = open_page(browser, tiny)
    enter_key(page)
    upload_through_page(page, latin1_file(tmp_path, "stopped-first.txt"))
    note_is(page, "^Stopped")
    page.evaluate("""() => {
        window.notes = [];
        const title = document.getElementById('upload-title');
        new MutationObserver(() => window.notes.push([title.textContent,
                                                      document.getElementById('upload-note').textContent]))
            .observe(title, {childList: true, subtree: true, characterData: true});
    }""")
    good = tmp_path / "read-next.txt"
    good.write_text("A plain note in UTF-8.\n" * 40)
    upload_through_page(page, good)
    wait_done(page, 60)
    notes = [n for t, n in page.evaluate("window.notes") if t == f"Reading {good.name}"]
    assert notes and notes[0] == "", page.evaluate("window.notes")
    assert not page.errors, page.errors
    page.context.close()


def test_a_file_that_is_not_utf8_leaves_no_empty_session_and_says_to_save_it_as_utf8(browser, tiny, tmp_path):
    """A Latin-1 file: the server refuses its first chunk (invalid_utf8, nothing kept); the page removes
    the session it made for it, and says to save the file as UTF-8. The session takes no DELETE while the
    server undoes the refused chunk (409 session_busy, here the first DELETE's answer): the page asks again."""
    page = open_page(browser, tiny)
    enter_key(page)
    busy = []

    def delete(route):
        if route.request.method != "DELETE" or busy:
            return route.continue_()
        busy.append(route.request.url)
        route.fulfill(status=409, headers={"Content-Type": "application/json"}, body=json.dumps(
            {"error": {"message": "the session is ingesting an upload; retry when it ends", "type": "conflict_error",
                       "param": None, "code": "session_busy"}}))
    page.route("**/v1/sessions/sess_*", delete)
    path = latin1_file(tmp_path, "latin1-notes.txt")
    upload_through_page(page, path)
    note = note_is(page, "^Stopped")
    assert note.endswith("(the empty session was removed). This page reads UTF-8 text only: "
                         "save the file as UTF-8 and read it again"), note
    assert shown(page, "save the file as UTF-8") == f"Upload of {path.name} stopped: {note[len('Stopped: '):]}"
    assert busy and not [x for x in get(tiny, "/v1/sessions")["data"] if x["metadata"].get("title") == path.name]
    page.wait_for_function("(n) => ![...document.querySelectorAll('#sessions .name')].some((e) => e.textContent === n)",
                           arg=path.name, timeout=5000)
    assert page.evaluate("localStorage.getItem('potserve.upload')") is None  # nothing left to resume
    assert page.inner_text("#upload-cancel") == "Close"
    assert not page.errors, page.errors
    page.context.close()


def test_a_server_restarted_with_a_smaller_chunk_limit_gets_smaller_chunks(browser, tmp_path):
    """The server restarts mid-upload with a smaller max_chunk_bytes (64 KiB, then 16 KiB): the page's
    next chunk is refused (413 chunk_too_large), and it goes on in chunks of the new limit to the end,
    instead of stopping with the session half read."""
    text, path = filler_file(tmp_path / "limit-lowered.txt", 200 * 1024)
    data = text.encode()
    with own_tiny_server(tmp_path / "data", "--max-chunk-bytes", "65536") as srv:
        page = open_page(browser, srv)
        page.wait_for_selector("#model:not(:empty)", timeout=10000)
        record_upload_notes(page)
        upload_through_page(page, path)
        note_is(page, "^Chunk 1 stored", 60)
        assert srv.stop() == 0
        srv.flags += ["--port", str(srv.port), "--max-chunk-bytes", "16384"]  # the later flags win
        srv.start()
        wait_done(page, 120)
        s = srv.request("GET", "/v1/sessions")[1]["data"][0]
        assert s["final"] and s["bytes_received"] == len(data), s
        assert s["last_seq"] > chunk_count(data, 65536), s  # the rest went in smaller chunks
        assert s["tokens_ingested"] == len(srv.request("POST", "/tokenize", {"content": text})[1]["tokens"])
        notes = page.evaluate("window.notes")
        assert "The server now takes chunks of at most 16 KiB; going on in chunks of that size." in notes, notes
        assert not any(n.startswith("Stopped") for n in notes), notes
        assert not page.errors, page.errors
        page.context.close()


def test_an_upload_stopped_by_a_server_error_keeps_its_file_and_goes_on_later(browser, tiny, tmp_path):
    """A server error (here a full disk, 507, on the second chunk) stops an upload, but the session can
    still take the rest: the page keeps the file, says so, and the page opened again finishes the upload."""
    text, path = filler_file(tmp_path / "disk-full-once.txt", 3 * TINY_CHUNK_BYTES // 2)
    data = text.encode()
    assert chunk_count(data) == 2
    page = open_page(browser, tiny)
    enter_key(page)
    posts = []

    def chunks(route):
        posts.append(route.request.url)
        if len(posts) < 2:
            return route.continue_()
        route.fulfill(status=507, headers={"Content-Type": "application/json"}, body=json.dumps(
            {"error": {"message": "the disk is full", "type": "server_error", "param": None,
                       "code": "insufficient_storage"}}))
    page.route("**/chunks*", chunks)
    upload_through_page(page, path)
    note = note_is(page, "^Stopped", 60)
    assert note == "Stopped: the disk is full. The file is kept: the upload goes on when this page is opened again"
    assert page.inner_text("#upload-cancel") == "Cancel"  # which would forget the file
    sid = page.evaluate("localStorage.getItem('potserve.upload')")
    s = get(tiny, f"/v1/sessions/{sid}")
    assert s["metadata"]["title"] == path.name and s["last_seq"] == 1 and not s["final"], s
    page.unroute("**/chunks*")
    page.reload()
    page.wait_for_selector('#upload[data-resumed-after="1"]', timeout=30000)
    wait_done(page, 60)
    s = get(tiny, f"/v1/sessions/{sid}")
    assert s["final"] and s["bytes_received"] == len(data) and s["last_seq"] == 2, s
    assert not page.errors, page.errors
    page.context.close()


def test_a_server_stopped_while_a_chunk_streams_keeps_the_upload_and_goes_on(browser, tmp_path):
    """SIGTERM while a chunk's progress streams: its answer (200, already sent) ends with an `error` event
    whose object says status 503 (shutting_down, the chunk not kept). That is a failure to retry, not a
    refusal: the page keeps the file and retries, and once a server runs again on the same data and port
    the upload ends whole, instead of stopping for good with the file dropped."""
    text, path = filler_file(tmp_path / "server-restarted.txt", 400 * 1024)
    data = text.encode()
    with own_tiny_server(tmp_path / "data", "--shutdown-grace", "0") as srv:
        page = open_page(browser, srv)
        page.wait_for_selector("#model:not(:empty)", timeout=10000)
        answers = []
        page.on("response", lambda r: answers.append(r) if "/chunks" in r.url else None)
        record_upload_notes(page)
        upload_through_page(page, path)
        note_is(page, "^Chunk 1 stored", 60)
        stored = int(page.inner_text("#up-tokens").split()[0].replace(",", ""))
        # the second chunk's progress shows: its answer streams
        page.wait_for_function("(n) => +document.getElementById('up-tokens').textContent.split(' ')[0]"
                               ".replace(/\\D/g, '') > n", arg=stored, timeout=60000, polling=20)
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(60) == 0
        second = [r for r in answers if r.request.headers.get("x-chunk-seq") == "2"][0]
        assert second.status == 200 and '"status":503' in second.text(), second.text()[-400:]
        note_is(page, "retrying", 20)
        assert page.evaluate("localStorage.getItem('potserve.upload')"), "the file was dropped"
        srv.flags += ["--port", str(srv.port)]
        srv.start()
        wait_done(page, 300)
        s = srv.request("GET", "/v1/sessions")[1]["data"]
        assert len(s) == 1 and s[0]["final"] and s[0]["bytes_received"] == len(data), s
        assert s[0]["tokens_ingested"] == len(srv.request("POST", "/tokenize", {"content": text})[1]["tokens"])
        notes = page.evaluate("window.notes")
        assert not any(n.startswith("Stopped") for n in notes), notes
        assert not page.errors, page.errors
        page.context.close()


def page_opened_while_the_api_is_down(browser, srv):
    """A tab loaded while every /v1 route answers 503 shutting_down (a server draining before a restart),
    the API back once the page has said so."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    ctx.route("**/v1/**", lambda route: route.fulfill(
        status=503, headers={"Content-Type": "application/json", "Retry-After": "1"}, body=json.dumps(
            {"error": {"message": "the server is shutting down", "type": "unavailable_error", "param": None,
                       "code": "shutting_down"}})))
    page = open_page(browser, srv, context=ctx)
    assert shown(page, "Cannot reach") == "Cannot reach the server: the server is shutting down"
    ctx.unroute("**/v1/**")
    return page


def test_a_page_opened_while_the_server_was_unavailable_works_once_it_is_back(browser, tiny):
    """The page fetches the server's settings (GET /v1/server) it could not get at its start before it
    needs them: "Read document" and a question work once the server answers again (they threw on the
    missing settings: "Cannot read properties of null"), without waiting for the next poll."""
    page = page_opened_while_the_api_is_down(browser, tiny)
    page.click("#tab-chat")
    page.fill("#chat-input", "Say hello.")
    with page.expect_request("**/v1/chat/completions", timeout=30000) as sent:
        page.press("#chat-input", "Enter")
        enter_key(page)  # asked for at the first request that reaches the server
    page.wait_for_selector('.turn.assistant[data-done="true"]', timeout=30000)
    assert sent.value.post_data_json["model"] == "tiny_llama"
    assert page.inner_text(".turn.assistant .body").strip() and page.locator(".turn.failed").count() == 0
    assert not page.errors, page.errors
    page.context.close()

    page = page_opened_while_the_api_is_down(browser, tiny)
    page.click("#paste-box summary")
    page.fill("#paste", "A note read once the server is back.\n")
    page.click("#start")
    enter_key(page)
    wait_done(page, 60)
    assert page.inner_text("#model") == "tiny_llama"
    assert session_titled(tiny, "A note read once the server is back.")["final"]
    assert not page.errors, page.errors
    page.context.close()


def test_a_page_says_when_the_server_stops_answering_and_when_it_is_back(browser, tmp_path):
    """Requests that get no answer at all (a stopped server, a network gone: the browser's bare "Failed
    to fetch") say so in words, and a page whose polls go unanswered says so until one is answered again
    (before, a question showed "Failed to fetch" and the polls failed silently)."""
    with own_tiny_server(tmp_path / "data") as srv:
        ctx = browser.new_context(viewport={"width": 1280, "height": 860})
        page = open_page(browser, srv, context=ctx)
        page.wait_for_selector("#model:not(:empty)", timeout=10000)
        ctx.route("**/v1/**", lambda route: route.abort())  # (no answer, as from a stopped server)
        page.click("#tab-chat")
        page.fill("#chat-input", "Say hello.")
        page.press("#chat-input", "Enter")
        assert shown(page, "The answer failed").startswith("The answer failed: No answer from the server: it is "
                                                           "stopped or out of reach")
        lost = page.locator("#messages .msg[role=alert]", has_text="Trying again every 10 s")
        lost.wait_for(state="visible", timeout=15000)  # (the next poll)
        assert lost.locator("span").inner_text().startswith("No answer from the server")
        ctx.unroute("**/v1/**")
        lost.wait_for(state="detached", timeout=15000)  # the next poll is answered
        assert not page.errors, page.errors
        ctx.close()
        ctx = browser.new_context(viewport={"width": 1280, "height": 860})  # a page opened meanwhile
        ctx.route("**/v1/**", lambda route: route.abort())
        page = open_page(browser, srv, context=ctx)
        assert shown(page, "No answer").startswith("No answer from the server: it is stopped or out of reach (")
        ctx.close()


def test_long_names_without_break_points_stay_inside_the_page(browser, tmp_path):
    """File names and session titles without a break point (a 31-character name with underscores, one of
    220 characters, a 3000-character title set through the API) wrap or are cut with an ellipsis, in the
    session list, the document's card, the upload's card (its Cancel stays inside it) and the messages: the
    page never scrolls sideways, at 375 px nor at 1280 px."""
    with own_tiny_server(tmp_path / "data") as srv:
        st, s, _ = srv.request("POST", "/v1/sessions", {"metadata": {"title": "Quarterly" + "Q" * 2991}})
        assert st == 201, s
        names = ["Annual_Report_2024_Final_v3.txt", "Minutes_" + "m" * 208 + ".txt"]
        for width in (375, 1280):
            page = open_page(browser, srv, width=width, height=800)
            page.wait_for_selector("#model:not(:empty)", timeout=10000)

            def fits(what):
                wide = page.evaluate("document.documentElement.scrollWidth")
                assert wide <= width, f"{what}: the page is {wide} px wide at {width} px"

            page.click(f'#sessions li[data-id="{s["id"]}"] .pick')
            fits("the long title")
            for name in names:
                path = tmp_path / name
                path.write_text("Some text.\n" * 10)
                page.set_input_files("#file", str(path))
                fits(f"{name} chosen")  # in the drop zone
                page.click("#start")
                page.wait_for_selector(f'#upload[data-done="true"] #upload-title:text-is("Read {name}")', timeout=60000)
                page.locator("#messages .msg", has_text=f"Finished reading {name}").wait_for(state="visible")
                fits(name)
                card, cancel = page.locator("#upload").bounding_box(), page.locator("#upload-cancel").bounding_box()
                assert cancel["x"] + cancel["width"] <= card["x"] + card["width"], (name, cancel, card)
            path = latin1_file(tmp_path, "Latin1_" + "l" * 200 + ".txt")
            upload_through_page(page, path)
            shown(page, "save the file as UTF-8")
            fits("the alert")
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / f"long-names-{width}.png"), full_page=True)
            assert not page.errors, page.errors
            page.context.close()


def test_the_map_of_a_session_that_goes_away_goes_with_it(browser, tiny):
    """The Memory map, its numbers and the stretch of text shown are the selected session's: when it is
    deleted with the page's ×, or behind the page's back (as when it expires) and the list is refreshed,
    they go with it (the map stayed: the CSS display of #map overrode its hidden attribute)."""
    page = open_page(browser, tiny)
    enter_key(page)
    page.on("dialog", lambda d: d.accept())  # the page's "Delete …?"
    page.click("#tab-map")
    for how in ("with the page's x", "elsewhere"):
        st, s, _ = tiny.request("POST", "/v1/sessions", {"metadata": {"title": f"mapped, deleted {how}"}}, auth())
        sid = s["id"]
        st, _, _ = tiny.request("POST", f"/v1/sessions/{sid}/chunks?seq=1&final=true", raw=(FILLER * 20).encode(),
                                headers=dict(auth(), **{"Content-Type": "text/plain"}))
        assert st == 200
        page.click("#map-refresh")  # the list learns of the session
        page.click(f'#sessions li[data-id="{sid}"] .pick')
        wait_shown(page, "#map:not([hidden])[data-bins]")
        box = page.locator("#map").bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function("() => document.getElementById('region-text').textContent.length > 0", timeout=30000)
        if how == "elsewhere":
            assert tiny.request("DELETE", f"/v1/sessions/{sid}", headers=auth())[0] == 200
            page.click("#map-refresh")
        else:
            page.click(f'#sessions li[data-id="{sid}"] .del')
        page.wait_for_selector(f'#sessions li[data-id="{sid}"]', state="detached", timeout=10000)
        page.wait_for_timeout(300)  # a map or text still on its way would show by now
        assert page.is_hidden("#map") and page.is_hidden("#region"), how
        assert page.inner_text("#map-stats") == "" and page.is_visible("#map-empty"), how
    assert not page.errors, page.errors
    page.context.close()


def test_deleting_the_session_being_uploaded_ends_the_upload_first(browser, tmp_path):
    """The list's × on the session this tab is uploading into: its chunk held the session, and the
    page showed the server's 409 session_busy, the session left in place. The upload is cancelled
    first, then the session deleted, asked again while the server reads the chunk whose body it had
    whole (seconds with this model)."""
    _, path = filler_file(tmp_path / "deleted-while-read.txt", 3 * 1024 * 1024)
    with own_tiny_server(tmp_path / "data") as srv:
        page = open_page(browser, srv)
        page.wait_for_selector("#model:not(:empty)", timeout=10000)
        upload_through_page(page, path)
        page.wait_for_selector("#sessions li[data-id]", timeout=10000)
        sid = page.get_attribute("#sessions li[data-id]", "data-id")
        deadline = time.time() + 60  # the server is reading it
        while srv.request("GET", f"/v1/sessions/{sid}")[1]["tokens_ingested"] == 0 and time.time() < deadline:
            time.sleep(0.1)
        assert page.is_visible("#upload") and page.get_attribute("#upload", "data-done") != "true"
        page.on("dialog", lambda d: d.accept())
        page.click(f'#sessions li[data-id="{sid}"] .del')
        page.locator("#messages .msg", has_text="Deleted").wait_for(timeout=120000)
        page.wait_for_selector(f'#sessions li[data-id="{sid}"]', state="detached", timeout=10000)
        assert srv.request("GET", f"/v1/sessions/{sid}")[0] == 404
        assert page.is_hidden("#upload") and not page.locator("#messages .msg[role=alert]").count()
        assert not page.errors, page.errors
        page.context.close()


def test_an_uploads_progress_moves_from_the_start_of_each_chunk(browser, tmp_path):
    """The server streams a chunk's progress once it has read the chunk's body, and it reads at most
    128 KiB ahead of the engine: the page's 256 KiB chunks showed no progress for the first half of each
    ("0 of ~…", no speed, no time left). Its chunks of 64 KiB are read at once: the tokens read never
    stand still for long."""
    text, path = filler_file(tmp_path / "progress-from-the-start.txt", 600 * 1024)
    with own_tiny_server(tmp_path / "data") as srv:  # its max_chunk_bytes: far above the page's size
        page = open_page(browser, srv)
        page.wait_for_selector("#model:not(:empty)", timeout=10000)
        page.evaluate("""() => {
            const tokens = document.getElementById('up-tokens');
            window.ticks = [];
            new MutationObserver(() => {
                const t = tokens.textContent.split(' ')[0];
                if (!window.ticks.length || window.ticks[window.ticks.length - 1][1] !== t)
                    window.ticks.push([performance.now(), t]);
            }).observe(tokens, {childList: true, subtree: true, characterData: true});
        }""")
        upload_through_page(page, path)
        wait_done(page, 600)
        ticks = page.evaluate("window.ticks")
        times = [t for t, _ in ticks]
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert len(ticks) > 10 and max(gaps) < 0.12 * (times[-1] - times[0]), ticks
        s = srv.request("GET", "/v1/sessions")[1]["data"][0]
        assert s["final"] and s["bytes_received"] == len(text.encode()), s
        assert not page.errors, page.errors
        page.context.close()


def answer_by_hand(page):
    """The page's next answers come from a stream the test writes as it goes (the browser's request
    routing only gives whole bodies): window.feed(text) sends a piece of the answer, window.finish() its
    finish_reason and [DONE], window.cut() breaks the connection, window.end() closes it; Stop aborts it."""
    page.evaluate("""() => {
        const real = window.fetch, enc = new TextEncoder();
        window.fetch = (url, init) => {
            if (!String(url).endsWith('/v1/chat/completions')) return real(url, init);
            const body = new ReadableStream({start(c) {
                init.signal.addEventListener('abort', () => c.error(new DOMException('stopped', 'AbortError')));
                const send = (d) => c.enqueue(enc.encode('data: ' + (typeof d === 'string' ? d : JSON.stringify(d)) + '\\n\\n'));
                window.feed = (text) => send({choices: [{index: 0, delta: {content: text}}]});
                window.finish = () => { send({choices: [{index: 0, delta: {}, finish_reason: 'stop'}]}); send('[DONE]'); c.close(); };
                window.cut = () => c.error(new TypeError('network error'));
                window.end = () => c.close();
            }});
            return Promise.resolve(new Response(body, {status: 200, headers: {'Content-Type': 'text/event-stream'}}));
        };
    }""")


def chat_by_hand(browser, tiny):
    """A page on the chat tab, asking without a session, whose answers the test writes (answer_by_hand)."""
    page = open_page(browser, tiny)
    enter_key(page)
    answer_by_hand(page)
    page.click("#tab-chat")
    page.select_option("#chat-over", "")
    return page


def ask_by_hand(page, question):
    """Asks question; returns once its answer's stream is open for window.feed."""
    page.fill("#chat-input", question)
    page.press("#chat-input", "Enter")
    page.wait_for_function("() => window.feed")


def test_a_streaming_answer_is_followed_only_while_the_reader_is_at_the_end(browser, tiny):
    """While an answer streams in, the conversation scrolls along with it only while it is scrolled to
    its end: a reader who scrolled up to read is left there (every frame scrolled the answer into view)."""
    page = chat_by_hand(browser, tiny)
    ask_by_hand(page, "Tell a long story.")
    at_end = "() => { const l = document.getElementById('chat-log'); return l.scrollHeight - l.scrollTop - l.clientHeight < 2; }"

    def feed(lines, start):
        page.evaluate("([n, k]) => { for (let i = 0; i < n; i++) window.feed('Line ' + (k + i) + ' of the story.\\n\\n'); }",
                      [lines, start])
        page.wait_for_timeout(200)  # a few frames: painted

    feed(60, 0)
    assert page.evaluate("document.getElementById('chat-log').scrollHeight > 2 * document.getElementById('chat-log').clientHeight")
    assert page.evaluate(at_end)  # followed
    page.evaluate("document.getElementById('chat-log').scrollTop = 100")  # the reader scrolls up
    feed(20, 60)
    assert page.evaluate("document.getElementById('chat-log').scrollTop") == 100  # left where it was
    page.evaluate("() => { const l = document.getElementById('chat-log'); l.scrollTop = l.scrollHeight; }")
    feed(20, 80)
    assert page.evaluate(at_end)  # back at the end: followed again
    page.evaluate("window.finish()")
    page.wait_for_selector('.turn.assistant[data-done="true"]', timeout=10000)
    assert not page.errors, page.errors
    page.context.close()


def test_an_answer_cut_off_by_a_lost_connection_says_so(browser, tiny):
    """An answer whose stream breaks (the connection lost) or ends without its finish_reason is marked
    "interrupted", as Stop marks "stopped", not shown as if complete; it stays in the conversation."""
    page = chat_by_hand(browser, tiny)
    for i, how in enumerate(("cut", "end")):
        ask_by_hand(page, f"Question {i}.")
        page.evaluate("() => { window.feed('The first half of'); window.feed(' an answer'); }")
        page.wait_for_selector(".turn.assistant:last-child .body p")  # read (an error drops what is not)
        page.evaluate("(how) => { window[how](); window.feed = null; }", how)
        last = ".turn.assistant:last-child"
        page.wait_for_selector(f'{last}[data-done="true"]', timeout=10000)
        assert page.inner_text(f"{last} .body") == "The first half of an answer", how
        assert page.inner_text(f"{last} .foot span") == "interrupted", how
        assert page.locator(f"{last}.interrupted").count() == 1
    shown(page, "The answer failed: the connection closed before the answer ended")
    assert not page.errors, page.errors
    page.context.close()



def test_messages_let_clicks_through_and_go_by_themselves(browser, tiny, tmp_path):
    """The page's messages cover no control for good: clicks go through them (one over the upload card's
    Close took its clicks), but for their own ×, and they go by themselves (an error after 20 s); each is
    still an alert for screen readers."""
    for width, height in ((1280, 860), (375, 700)):
        ctx = browser.new_context(viewport={"width": width, "height": height})
        ctx.clock.install()  # the page's timers, to be moved on
        page = open_page(browser, tiny, context=ctx)
        enter_key(page)
        path = latin1_file(tmp_path, "not-utf8-under-a-message.txt")
        for i in range(2):
            upload_through_page(page, path)
            page.locator("#messages .msg[role=alert]", has_text="save the file as UTF-8").nth(i).wait_for(timeout=10000)
            through = page.evaluate("""() => [...document.querySelectorAll('#messages .msg span')].map((s) => {
                const r = s.getBoundingClientRect();
                return !document.getElementById('messages').contains(
                    document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2));
            })""")
            assert through and all(through), (width, through)
            page.click("#upload-cancel", timeout=5000)  # "Close", wherever the messages are
            assert page.is_hidden("#upload")
        n = page.locator("#messages .msg[role=alert]").count()
        page.locator("#messages .msg[role=alert] button").first.click()  # its × takes clicks
        assert page.locator("#messages .msg[role=alert]").count() == n - 1
        ctx.clock.run_for(21000)
        assert page.locator("#messages .msg").count() == 0, width
        assert not page.errors, page.errors
        ctx.close()



def test_chat_turns_show_what_they_hold(browser, tiny):
    """A question keeps its line breaks (Shift+Enter), a link's label its markdown, and an answer that
    failed offers nothing to copy (its Copy copied "")."""
    page = open_page(browser, tiny)
    enter_key(page)
    route_answers(page, [answer_events("See [the **API** docs](https://example.com/api).")])
    page.click("#tab-chat")
    page.select_option("#chat-over", "")
    page.click("#chat-input")
    page.keyboard.type("First line")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("second line")
    page.keyboard.press("Enter")
    page.wait_for_selector('.turn.assistant[data-done="true"]', timeout=10000)
    assert page.inner_text(".turn.user .body") == "First line\nsecond line"
    assert page.inner_text(".turn.assistant .body a strong") == "API"
    assert page.inner_text(".turn.assistant .body a") == "the API docs"
    page.unroute("**/v1/chat/completions")
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=500, headers={"Content-Type": "application/json"}, body=json.dumps(
            {"error": {"message": "the model failed", "type": "server_error", "param": None, "code": None}})))
    page.fill("#chat-input", "Again?")
    page.press("#chat-input", "Enter")
    page.wait_for_selector('.turn.assistant.failed[data-done="true"]', timeout=10000)
    assert page.locator(".turn.assistant.failed .foot button").count() == 0
    assert page.locator(".turn.assistant:not(.failed) .foot button", has_text="Copy").count() == 1
    assert not page.errors, page.errors
    page.context.close()


def test_stop_and_delete_leave_the_focus_on_a_control(browser, tiny):
    """Stop (disabled once the answer ends) hands the focus to the question box, and deleting a session
    from the keyboard to the list's next one, not to the page's body; and a title that is not a string
    shows as the session's id (it showed "[object Object]")."""
    st, s, _ = tiny.request("POST", "/v1/sessions", {"metadata": {"title": {"text": "not a string"}}}, auth())
    sid = s["id"]
    page = chat_by_hand(browser, tiny)
    ask_by_hand(page, "Tell a long story.")
    page.evaluate("window.feed('Once upon a time')")
    page.focus("#chat-stop")
    page.keyboard.press("Enter")
    page.wait_for_selector('.turn.assistant[data-done="true"]', timeout=10000)
    assert page.inner_text(".turn.assistant .foot span") == "stopped"
    assert page.evaluate("document.activeElement.id") == "chat-input"

    assert page.inner_text(f'#sessions li[data-id="{sid}"] .name') == sid
    page.on("dialog", lambda d: d.accept())
    page.focus(f'#sessions li[data-id="{sid}"] .del')
    page.keyboard.press("Enter")
    page.wait_for_selector(f'#sessions li[data-id="{sid}"]', state="detached", timeout=10000)
    assert page.evaluate("document.activeElement.closest('#sessions-pane') !== null"), \
        page.evaluate("document.activeElement.outerHTML.slice(0, 80)")
    assert not page.errors, page.errors
    page.context.close()


def test_documents_are_read_one_at_a_time_and_as_utf8_text(browser, tiny, tmp_path):
    """Three files dropped at once: the page says only the first is read. A file chosen with text in the
    paste box: the file is read, and the pasted text stays (it was emptied without a word). A UTF-16 file
    without a byte order mark (valid UTF-8 to the server: its NUL bytes are characters) is refused before
    any session is made, as a file that is not UTF-8 is."""
    page = open_page(browser, tiny)
    enter_key(page)
    page.evaluate("""() => {
        const dt = new DataTransfer();
        for (const n of ['one.txt', 'two.txt', 'three.txt']) dt.items.add(new File(['Text of ' + n], n, {type: 'text/plain'}));
        document.getElementById('drop').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
    }""")
    note = page.locator("#messages .msg", has_text="3 files").inner_text(timeout=5000)
    assert "only the first, one.txt, is read" in note, note
    assert page.inner_text("#drop-text").startswith("one.txt")

    page.click("#paste-box summary")
    page.fill("#paste", "Pasted text, to read next.\n")
    page.click("#start")
    wait_done(page, 60)
    assert session_titled(tiny, "one.txt")["final"]
    assert page.input_value("#paste") == "Pasted text, to read next.\n"
    page.locator("#messages .msg", has_text="the pasted text stays").wait_for(timeout=5000)

    path = tmp_path / "utf16-no-bom.txt"
    path.write_bytes("A note saved as UTF-16, little-endian, without a BOM.\n".encode("utf-16-le"))
    sent = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)
    page.fill("#paste", "")
    page.set_input_files("#file", str(path))
    page.click("#start")
    assert shown(page, "save the file as UTF-8") == (
        f"Not read: {path.name} holds NUL bytes (a binary file, or UTF-16). This page reads UTF-8 text only: "
        "save the file as UTF-8 and read it again.")
    assert sent == [], sent
    assert not page.errors, page.errors
    page.context.close()



def test_an_answer_cut_short_is_not_said_to_be_cut_at_max_tokens(browser, tiny):
    """finish_reason "length" also ends an answer the model's window or the server's request_timeout
    cut: with fewer tokens than max_tokens the foot says so, at max_tokens it says "cut at max tokens"."""
    usage = lambda n: {"prompt_tokens": 9, "completion_tokens": n, "total_tokens": 9 + n}  # noqa: E731
    page = open_page(browser, tiny)
    enter_key(page)
    route_answers(page, [answer_events("Once upon a time", "length", usage(7)),
                         answer_events("Once upon a time", "length", usage(64))])
    page.click("#tab-chat")
    page.select_option("#chat-over", "")
    page.click(".chat-settings summary")
    page.fill("#chat-max", "64")
    for label in ("cut short by the model's window or the server's time limit · 7 tokens",
                  "cut at max tokens · 64 tokens"):
        page.fill("#chat-input", "Tell a long story.")
        page.press("#chat-input", "Enter")
        page.wait_for_selector('.turn.assistant:last-child[data-done="true"]', timeout=10000)
        assert page.inner_text(".turn.assistant:last-child .foot span") == label
    assert not page.errors, page.errors
    page.context.close()


def test_markdown_underscores_inside_words_stay_text(browser, tiny):
    """CommonMark's rule for `_`: it opens or closes emphasis only at a word's edge, so names like
    max_chunk_bytes keep their underscores; `_word_` and `*word*` are still italics."""
    page = open_page(browser, tiny)
    enter_key(page)
    route_answers(page, [answer_events("Set max_chunk_bytes and budget_tokens; snake_case_names stay. "
                                       "An _emphasis_ here (_this one_), and *that*.")])
    ask_without_session(page, "Which settings?", timeout=10000)
    body = ".turn.assistant .body"
    assert page.inner_text(body) == ("Set max_chunk_bytes and budget_tokens; snake_case_names stay. "
                                     "An emphasis here (this one), and that.")
    assert page.locator(f"{body} em").all_inner_texts() == ["emphasis", "this one", "that"]
    # asterisks next to a space on their inner side are not emphasis (they vanished: "2 3 4 = 24",
    # "Delete .tmp and .log files", "x 2 + y 2"); bold may hold italics; a numbered list split by
    # code goes on from its item's number (each piece said "1.")
    route_answers(page, [answer_events("Compute 2 * 3 * 4 = 24. Delete *.tmp and *.log files. "
                                       "Python: x ** 2 + y ** 2. And **bold *nested* text**.\n\n"
                                       "1. Install it:\n```\napt-get install x\n```\n2. Run it:\n```\nx\n```\n3. Done.")])
    page.fill("#chat-input", "More?")
    page.press("#chat-input", "Enter")
    page.wait_for_selector('.turn.assistant:nth-of-type(4)[data-done="true"]', timeout=10000)
    last = ".turn.assistant:last-child .body"
    assert page.inner_text(f"{last} p").startswith("Compute 2 * 3 * 4 = 24. Delete *.tmp and *.log files. "
                                                 "Python: x ** 2 + y ** 2. And bold nested text.")
    assert page.locator(f"{last} strong").all_inner_texts() == ["bold nested text"]
    assert page.locator(f"{last} strong em").all_inner_texts() == ["nested"]
    assert [page.evaluate("(n) => n.start", h) for h in page.locator(f"{last} ol").element_handles()] == [1, 2, 3]
    assert not page.errors, page.errors
    page.context.close()


def test_ask_over_keeps_its_choice_and_a_conversation_stays_with_its_document(browser, tiny):
    """"Ask over" set to plain chat took the document picked in the list at the next list refresh,
    and the next question went there with the plain chat's history; an answer still streaming when
    "New conversation" was clicked joined the new conversation (and Send stayed off until it ended)."""
    st, s, _ = tiny.request("POST", "/v1/sessions", {"metadata": {"title": "doc one"}}, auth())
    st, _, _ = tiny.request("POST", f"/v1/sessions/{s['id']}/chunks?seq=1", raw=b"The sky is green today.\n",
                            headers=dict(auth(), **{"Content-Type": "text/plain"}))
    page = open_page(browser, tiny)
    enter_key(page)
    sent = []
    page.route("**/v1/chat/completions", lambda route: (sent.append(json.loads(route.request.post_data)),
                                                        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"},
                                                                      body=answer_events("Fine."))))
    ask_without_session(page, "Hello?", timeout=10000)
    page.click("#sessions .pick")  # (the list is drawn again)
    assert page.eval_on_selector("#chat-over", "s => s.value") == ""
    page.fill("#chat-input", "And now?")
    page.press("#chat-input", "Enter")
    page.wait_for_selector('.turn.assistant:nth-of-type(4)[data-done="true"]', timeout=10000)
    assert "session" not in sent[-1] and [m["role"] for m in sent[-1]["messages"]] == ["user", "assistant", "user"]
    # an answer that has not ended when a new conversation begins is stopped, and is not the new one's
    page.unroute("**/v1/chat/completions")
    page.route("**/v1/chat/completions", lambda route: None)  # (never answered)
    page.fill("#chat-input", "A long one?")
    page.press("#chat-input", "Enter")
    page.wait_for_selector("#chat-stop:not([disabled])", timeout=10000)
    page.click("#chat-clear")
    page.wait_for_selector("#chat-send:not([disabled])", timeout=10000)
    page.unroute("**/v1/chat/completions")
    page.route("**/v1/chat/completions", lambda route: (sent.append(json.loads(route.request.post_data)),
                                                        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"},
                                                                      body=answer_events("New."))))
    page.fill("#chat-input", "First of the new one?")
    page.press("#chat-input", "Enter")
    page.wait_for_selector('.turn.assistant[data-done="true"]', timeout=10000)
    assert page.locator(".turn").count() == 2 and [m["content"] for m in sent[-1]["messages"]] == ["First of the new one?"]
    assert not page.errors, page.errors
    page.context.close()


def test_a_question_over_a_gone_session_says_so_and_leaves_the_conversation(browser, tiny):
    """A session deleted (or expired) behind the page's back: the question over it answers 404
    session_not_found; the page says the session is gone, drops it from its list at once, and the
    question without an answer is not part of the conversation the next question sends."""
    st, s, _ = tiny.request("POST", "/v1/sessions", {"metadata": {"title": "soon gone"}}, auth())
    sid = s["id"]
    st, _, _ = tiny.request("POST", f"/v1/sessions/{sid}/chunks?seq=1&final=true", raw=b"The sky is green today.\n",
                            headers=dict(auth(), **{"Content-Type": "text/plain"}))
    assert st == 200
    page = open_page(browser, tiny)
    enter_key(page)
    page.click("#tab-chat")
    page.select_option("#chat-over", sid)
    page.click(".chat-settings summary")
    page.fill("#chat-max", "4")
    st, _, _ = tiny.request("DELETE", f"/v1/sessions/{sid}", headers=auth())
    assert st == 200, st
    page.fill("#chat-input", "What colour is the sky?")
    with page.expect_response("**/v1/chat/completions") as r:
        page.press("#chat-input", "Enter")
    assert r.value.status == 404 and json.loads(r.value.text())["error"]["code"] == "session_not_found"
    gone = 'the session "soon gone" is gone (it expired or was deleted)'
    assert shown(page, "is gone") == f"No answer: {gone}. Ask over another document, or without one."
    # the list is refreshed now, not at its next poll (every 10 s)
    page.wait_for_function("""(id) => !document.querySelector(`#sessions li[data-id="${id}"]`) &&
        ![...document.getElementById('chat-over').options].some((o) => o.value === id)""", arg=sid, timeout=3000)
    assert page.input_value("#chat-over") == ""
    assert page.inner_text(".turn.assistant:last-child .body") == f"No answer: {gone}."
    page.fill("#chat-input", "Say hello.")
    with page.expect_request("**/v1/chat/completions") as sent:
        page.press("#chat-input", "Enter")
    page.wait_for_selector('.turn.assistant:last-child[data-done="true"]', timeout=30000)
    assert sent.value.post_data_json["messages"] == [{"role": "user", "content": "Say hello."}]
    assert "session" not in sent.value.post_data_json
    assert not page.errors, page.errors
    page.context.close()


def test_the_paste_box_is_labelled_and_read_document_moves_the_focus(browser, tiny):
    """The paste box has a label; "Read document" pressed from the keyboard puts the focus on the
    upload's progress (the button is disabled while the session is made, which drops its focus), and
    back on the button when the server refuses the settings."""
    page = open_page(browser, tiny)
    enter_key(page)
    page.click("#paste-box summary")
    assert page.get_by_label("Document text").get_attribute("id") == "paste"
    page.fill("#paste", "A short note, read from the keyboard.\n")
    page.focus("#start")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.activeElement.id === 'upload'", timeout=10000)
    wait_done(page, 60)
    assert page.evaluate("document.activeElement.id") == "upload"
    page.fill("#paste", "Another note.\n")
    page.fill("#set-budget", "64")
    page.fill("#set-keep", "64")  # keep must be less than the budget: 422
    page.focus("#start")
    page.keyboard.press("Enter")
    shown(page, "Could not start")
    assert page.evaluate("document.activeElement.id") == "start"
    assert not page.errors, page.errors
    page.context.close()


def test_the_done_note_tells_the_documents_tokens_from_the_pinned_prefix(browser, tiny):
    """The pot holds the pinned prefix (the chat template's start, the system prompt) besides the
    document: the note at the end of an upload counts the document's tokens in the pot, and the pinned
    ones apart, never "the pot holds more of them than were read"."""
    text = "Alice has a red bicycle. Bob owns a blue car."
    page = open_page(browser, tiny)
    enter_key(page)
    page.click("#paste-box summary")
    page.fill("#paste", text)
    page.click("#start")
    wait_done(page, 60)
    note = page.inner_text("#upload-note")
    m = re.fullmatch(r"Done: (\d+) tokens read in .+; the pot keeps (\d+) of them, beside (\d+) pinned tokens "
                     r"\(the chat template's start and the system prompt\)\.", note)
    assert m, note
    read, kept, pinned = map(int, m.groups())
    s = session_titled(tiny, text[:40])
    assert s["compressions"] == 0 and read == kept == s["tokens_ingested"], (note, s)
    assert pinned > 0 and kept + pinned == s["tokens_in_pot"], (note, s)
    assert not page.errors, page.errors
    page.context.close()


# ---- the pass key on the default model, and the screenshots ------------------------------------------

@pytest.fixture(scope="module")
def real(tmp_path_factory, model):
    s = Server(tmp_path_factory.mktemp("web-real"))
    s.start()
    yield s
    assert s.stop() == 0


@pytest.mark.heavy
def test_page_pass_key_answer_and_screenshots(browser, real, tmp_path):
    text, before = passkey_doc(12 * 1024, depth=0.4)
    path = tmp_path / "passkey-12k.txt"
    path.write_text(text)
    page = open_page(browser, real)
    page.wait_for_selector("#model:not(:empty)", timeout=30000)  # no keys: no prompt
    assert not page.is_visible("#key-dialog")
    upload_through_page(page, path, budget=512)
    wait_done(page, 900)
    s = get(real, "/v1/sessions")["data"][0]
    assert s["budget_tokens"] == 512 and s["final"] and s["compressions"] > 0
    answer, paints, deltas = ask(page, s["id"], "What is the pass key?", 24)
    assert "71432" in answer, answer
    # the pot dropped text, so the server recalled passages (its default), and the page says so
    note = page.inner_text(".turn.assistant:last-child .foot")
    assert re.search(r"with \d+ passages? of the document", note), note
    # ... and shows them on request: each passage as the document has it, the key's last (best last)
    last = ".turn.assistant:last-child"
    assert page.is_hidden(f"{last} .passages")
    page.click(f"{last} .foot button:has-text('Passages')")
    shown = page.locator(f"{last} .passages blockquote").all_inner_texts()
    assert len(shown) == int(re.search(r"with (\d+) passage", note).group(1)), shown
    assert "71432" in shown[-1] and all(p.strip() in text for p in shown), shown
    where = page.locator(f"{last} .passages li > div").all_inner_texts()
    a, b = (int(x.replace(",", "")) for x in re.findall(r"[\d,]+", where[-1]))
    assert text.encode()[a:b].decode().strip() == shown[-1].strip(), (where, shown)
    assert page.get_attribute(f"{last} .foot button[aria-expanded]", "aria-expanded") == "true"
    lengths = [n for n in paints if n]
    assert len(set(lengths)) >= 2 and lengths == sorted(lengths), paints  # painted as it streamed
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "chat-desktop.png"))
    page.click("#upload-cancel")  # "Close" once done
    assert page.is_hidden("#upload")
    page.evaluate("() => document.getElementById('messages').replaceChildren()")
    page.click("#tab-map")
    wait_shown(page, "#map:not([hidden])[data-bins]", 60000)
    bins = int(page.get_attribute("#map", "data-bins"))
    key_at = len(get_tokens(real, before + "The pass key is 7")) - 1  # the key's first token
    col = key_at * bins // s["tokens_ingested"]
    page.focus("#map")  # the keyboard reaches the needle's column too
    page.keyboard.press("Home")
    for _ in range(col):
        page.keyboard.press("ArrowRight")
    try:
        page.wait_for_function(HAS_KEY, timeout=60000)
    finally:
        page.screenshot(path=str(SHOTS / "map-desktop.png"))
    page.set_viewport_size({"width": 360, "height": 780})
    page.wait_for_timeout(800)
    assert page.evaluate("document.documentElement.scrollWidth") <= 360  # nothing runs off the side
    page.screenshot(path=str(SHOTS / "map-360.png"), full_page=True)
    page.click("#tab-chat")
    page.screenshot(path=str(SHOTS / "chat-360.png"), full_page=True)
    assert not page.errors, page.errors


def get_tokens(srv, text, key=KEY):
    st, body, _ = srv.request("POST", "/tokenize", {"content": text}, auth(key))
    assert st == 200, body
    return body["tokens"]
