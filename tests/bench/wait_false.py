"""How soon ?wait=false acknowledges a chunk larger than the 128 KiB an upload reads ahead of the
engine: the 202's latency and when the chunk's ingest ends, with upload_buffer_bytes at its default
(64M: the chunk is read into the log at once) and at 0 (the old bound: the 202 comes once the engine
is within 128 KiB of the chunk's end). One server each, the default model and pot, durability none.
Usage: .venv/bin/python tests/bench/wait_false.py [KiB ...] (default 144 400)."""
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
from server_util import Server  # noqa: E402


def text(n_sentences):
    words = ["river", "bridge", "market", "archive", "harbor", "lantern", "meadow", "orchard"]
    return " ".join(f"Sentence {i} speaks of the {words[i % 8]} and the {words[(i * 3) % 8]}."
                    for i in range(n_sentences)) + "\n"


tmp = pathlib.Path(tempfile.mkdtemp())
for kib in [int(a) for a in sys.argv[1:]] or [144, 400]:
    doc = text(kib * 20).encode()[:kib * 1024]
    for knob in ("64M", "0"):
        s = Server(tmp / f"{kib}_{knob}", "--durability", "none", "--upload-buffer-bytes", knob).start()
        try:
            sid = s.request("POST", "/v1/sessions", {})[1]["id"]
            t0 = time.time()
            st, body, _ = s.request("POST", f"/v1/sessions/{sid}/chunks?wait=false", raw=doc,
                                    headers={"Content-Type": "text/plain"}, timeout=3600)
            acked = time.time() - t0
            assert st == 202, body
            while (now := s.request("GET", f"/v1/sessions/{sid}")[1])["status"] != "ready":
                time.sleep(0.05)
            print(f"{kib} KiB, upload_buffer_bytes {knob}: 202 after {acked:.3f} s, ingest ended after "
                  f"{time.time() - t0:.1f} s ({now['tokens_ingested']} tokens)", flush=True)
        finally:
            s.kill()
