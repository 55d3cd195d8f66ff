#!/usr/bin/env python3
"""`potserve serve --backend cuda` end to end without a GPU: the server built
with the CUDA backend running on the emulator (make cuda-emu-build), on the
tiny synthetic GGUF. Admission control lowers a pot memory limit above the
device's to the device's. A session ingests a document through a compressing pot
(pots on the device, compaction there), six questions decode at once (batched
decode, decode graphs), the server stops with SIGTERM (snapshots synced from
the device) and restarts from them, and the same greedy question gives the
same answer. Not part of `make test` (about half a minute here).

    python3 tests/cuda/serve_smoke.py BIN MODEL
"""
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request


def start(binary, model, data):
    # a pot memory limit far above the device's: admission control lowers it to the device's
    p = subprocess.Popen([binary, "serve", "--backend", "cuda", "--model", model, "--port", "0",
                          "--data-dir", data, "--pot-memory-limit", "1000000G"], stderr=subprocess.PIPE, text=True)
    port, lowered = None, False
    for line in p.stderr:
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        port = port or (m and int(m.group(1)))
        lowered |= "pot_memory_limit lowered" in line
        if "ready" in line:
            break
    assert lowered, "pot_memory_limit was not lowered to the device's memory"
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    return p, f"http://127.0.0.1:{port}"


def call(url, path, body=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method="POST" if data is not None else "GET")
    req.add_header("Content-Type", "text/plain" if raw is not None else "application/json")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def ask(url, sid, question, out, i):
    out[i] = call(url, "/v1/chat/completions", {
        "model": "x", "session": sid, "max_tokens": 10, "temperature": 0,
        "messages": [{"role": "user", "content": question}]})["choices"][0]["message"]["content"]


def main(binary, model):
    data = tempfile.mkdtemp(prefix="potserve-cuda-smoke-")
    try:
        p, url = start(binary, model, data)
        sid = call(url, "/v1/sessions", {"budget_tokens": 128, "keep_tokens": 64, "chunk_tokens": 32})["id"]
        rng = random.Random(1)
        words = "the harbour lamp keeper wrote of storms and ships that passed north in winter light".split()
        doc = " ".join(rng.choice(words) for _ in range(600)) + " The password is BLUE-42. " + \
              " ".join(rng.choice(words) for _ in range(200))
        s = call(url, f"/v1/sessions/{sid}/chunks?final=true", raw=doc.encode())
        assert s["compressions"] >= 5 and s["tokens_in_pot"] <= 128, s
        answers = [None] * 6
        threads = [threading.Thread(target=ask, args=(url, sid, f"What is the password ({i})?", answers, i))
                   for i in range(6)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert all(isinstance(a, str) and a for a in answers), answers
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
        p, url = start(binary, model, data)
        again = [None]
        ask(url, sid, "What is the password (0)?", again, 0)
        assert again[0] == answers[0], (again[0], answers[0])
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
        print(f"cuda serve smoke: {s['compressions']} compressions, 6 concurrent answers, "
              f"the same answer after a restart from the snapshot: ok")
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
