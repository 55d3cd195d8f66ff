"""What paging costs a question: the same sessions on two servers side by side, one whose
pot_memory_limit holds all of them ("roomy") and one that holds two pots fewer than there are
sessions ("tight"), asked in turn round-robin, so that on the tight one every question finds its
pot paged out (the least recently used pot is always the next one asked: the worst case) and
waits for it to be read back from its snapshot. Documents: Debian's licence texts (nobody here
wrote them), one per session, at the server's default budget (2,048). The answers must be the
same on both; the medians of question latency per server, and the tight server's page-ins
(count, mean wait from /metrics), are printed.
Usage: .venv/bin/python tests/bench/paging.py [sessions] [rounds] [kbytes] [cold] (default 4
sessions, 5 rounds, 12 KB documents; "cold": the page cache is dropped before every question, on
both servers, so that each page-in reads its snapshot from the disk: needs root)."""
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "py"))
from server_util import Server  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
kbytes = int(sys.argv[3]) if len(sys.argv) > 3 else 12
cold = len(sys.argv) > 4 and sys.argv[4] == "cold"
lic = pathlib.Path("/usr/share/common-licenses")
corpus = " ".join(p.read_text(errors="replace") for p in sorted(lic.iterdir()) if p.is_file()).split()
docs = [" ".join(corpus[i * kbytes * 180:(i + 1) * kbytes * 180])[:kbytes * 1000] for i in range(n)]
assert all(len(d) == kbytes * 1000 for d in docs), "not enough licence text for these documents"
tmp = pathlib.Path(tempfile.mkdtemp())
common = ["--prompt-cache-bytes", "0", "--threads", "2"]


def metric(s, name):
    text = urllib.request.urlopen(s.url + "/metrics", timeout=30).read().decode()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def fill(s):
    ids = []
    for d in docs:
        st, body, _ = s.request("POST", "/v1/sessions", {})
        assert st == 201, body
        ids.append(body["id"])
        st, body, _ = s.request("POST", f"/v1/sessions/{ids[-1]}/chunks?final=true", raw=d.encode(),
                                headers={"Content-Type": "text/plain"})
        assert st == 200, body
    return ids


def drop_page_cache():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def ask(s, sid):
    if cold:
        drop_page_cache()
    t0 = time.perf_counter()
    st, body, _ = s.request("POST", "/v1/chat/completions", {
        "model": "m", "session": sid, "temperature": 0, "max_tokens": 8,
        "messages": [{"role": "user", "content": "Who may copy this work?"}]})
    assert st == 200, body
    return time.perf_counter() - t0, body["choices"][0]["message"]["content"]


roomy = Server(tmp / "roomy", *common, "--pot-memory-limit", "4G").start()
tight = None
try:
    st, probe, _ = roomy.request("POST", "/v1/sessions", {})
    pot = probe["memory_bytes"]
    roomy.request("DELETE", f"/v1/sessions/{probe['id']}")
    limit = (n - 2) * pot + pot // 2
    tight = Server(tmp / "tight", *common, "--pot-memory-limit", str(limit)).start()
    ids = {"roomy": fill(roomy), "tight": fill(tight)}
    servers = {"roomy": roomy, "tight": tight}
    ins0 = metric(tight, "potserve_page_ins_total")
    wait0 = metric(tight, "potserve_page_in_seconds_total")
    times = {"roomy": [], "tight": []}
    for r in range(rounds):
        for i in range(n):
            answers = {}
            for name in (("roomy", "tight") if (r + i) % 2 == 0 else ("tight", "roomy")):
                dt, answers[name] = ask(servers[name], ids[name][i])
                times[name].append(dt)
            assert answers["roomy"] == answers["tight"], answers
    ins = metric(tight, "potserve_page_ins_total") - ins0
    wait = metric(tight, "potserve_page_in_seconds_total") - wait0
    snaps = sorted(p.stat().st_size for p in (tmp / "tight").rglob("pot.snap"))
    print(f"{n} sessions of {kbytes} KB, pots of {pot / 2**20:.1f} MiB, tight limit {limit / 2**20:.1f} MiB "
          f"({n - 2} pots), {rounds} rounds{', page cache dropped before each question' if cold else ''}; snapshots {snaps[0] / 2**20:.1f}-{snaps[-1] / 2**20:.1f} MiB")
    for name, v in times.items():
        print(f"  {name}: question median {statistics.median(v) * 1e3:.0f} ms (n={len(v)})")
    print(f"  tight: {ins:.0f} page-ins, mean wait {wait / max(ins, 1) * 1e3:.0f} ms; answers equal on both")
finally:
    roomy.stop()
    if tight:
        tight.stop()
