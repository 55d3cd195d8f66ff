"""A document uploaded as a file (POST /v1/files, the official openai client's multipart form)
against the same bytes uploaded to a session made by hand (POST /v1/sessions, then one chunk with
?wait=false, the raw path): when each is acknowledged and when its pot has been read, on one
server, the two alternated, medians over the rounds. The text is Debian's licence texts (nobody
here wrote them), concatenated and cut to the size asked.
Usage: .venv/bin/python tests/bench/files.py [rounds] [KiB] (default 3 rounds of 128 KiB)."""
import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
from server_util import Server, openai_client  # noqa: E402

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
kib = int(sys.argv[2]) if len(sys.argv) > 2 else 128
licences = sorted(pathlib.Path("/usr/share/common-licenses").glob("*"))
text = "".join(p.read_text(errors="ignore") for p in licences if p.is_file())
doc = text.encode()[: kib * 1024].decode(errors="ignore").encode()
tmp = pathlib.Path(tempfile.mkdtemp())
path = tmp / "doc.txt"
path.write_bytes(doc)

s = Server(tmp / "data", "--durability", "none").start()
client = openai_client(s)
times = {"file": [], "session": []}
try:
    for r in range(rounds):
        for how in (("file", "session") if r % 2 == 0 else ("session", "file")):
            t0 = time.time()
            if how == "file":
                with open(path, "rb") as f:
                    obj = client.files.create(file=f, purpose="user_data")
                acked = time.time() - t0
                obj = client.files.wait_for_processing(obj.id, poll_interval=0.05, max_wait_seconds=3600)
                done = time.time() - t0
                sid = obj.session
                client.files.delete(obj.id)
            else:
                sid = s.request("POST", "/v1/sessions", {})[1]["id"]
                st, body, _ = s.request("POST", f"/v1/sessions/{sid}/chunks?wait=false&final=true", raw=doc,
                                        headers={"Content-Type": "text/plain"}, timeout=3600)
                assert st == 202, body
                acked = time.time() - t0
                while s.request("GET", f"/v1/sessions/{sid}")[1]["status"] != "ready":
                    time.sleep(0.05)
                done = time.time() - t0
                s.request("DELETE", f"/v1/sessions/{sid}")
            times[how].append((acked, done))
            print(f"round {r} {how}: acknowledged after {acked:.3f} s, read after {done:.1f} s", flush=True)
finally:
    s.stop()

for how, t in times.items():
    print(f"{how}: median acknowledged {statistics.median(a for a, _ in t):.3f} s, "
          f"read {statistics.median(d for _, d in t):.1f} s ({len(doc)} bytes, {rounds} rounds)")
f_done = statistics.median(d for _, d in times["file"])
s_done = statistics.median(d for _, d in times["session"])
print(f"file / session time to read: {f_done / s_done:.3f}")
