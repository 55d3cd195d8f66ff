"""Smoke run of the long-document evaluation (tests/bench/longdoc): one short
passkey document per policy through the harness, which must run, write a
table and per-trial results that parse, and, with no compression (policy
none, the pot holds the whole 1K document), find every key: the default model
does at 2K-8K (docs/results/longdoc.md), so a miss here means the harness broke."""
import json
import os
import re
import subprocess
import sys

from conftest import BIN, ROOT

RUN = ROOT / "tests" / "bench" / "longdoc" / "run.py"


def test_longdoc_harness_smoke(model, tmp_path):
    assert (ROOT / "build" / "longdoc_bench").exists(), "build/longdoc_bench missing: run `make longdoc`"
    p = subprocess.run([sys.executable, str(RUN), "-m", str(model), "--haystacks", "filler", "--lengths", "1024",
                        "--depths", "0.5", "--keys", "2", "--policies", "none,infinipot", "--budgets", "256",
                        "--threads", "2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "POTSERVE_BIN": str(BIN)})
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for r in rows:
        assert r["length"] == 1024 and r["depth"] == 0.5 and len(r["key"]) == 5
        assert 0 <= r["kept"] <= 1 and r["tps"] > 0 and r["peak_rss_bytes"] > 0
        assert r["needle_b"] > r["needle_a"] > 0
    none = [r for r in rows if r["policy"] == "none"]
    assert all(r["hit"] and r["kept"] == 1.0 for r in none), none
    inf = [r for r in rows if r["policy"] == "infinipot"]
    assert all(r["compressions"] >= 1 for r in inf)
    table = (tmp_path / "results.md").read_text()
    cells = [line for line in table.splitlines() if re.match(r"\| filler \| (none|infinipot) \|", line)]
    assert len(cells) == 2
    assert re.search(r"\| 2/2 \(100 %, \d+–100\) \|", cells[[c.split("|")[2].strip() for c in cells].index("none")])


def test_longdoc_tasks_harness_smoke(model, tmp_path):
    """--tasks: three documents (one per rotation) of the natural TEST split,
    five questions each, through policy none and a 256-entry infinipot pot:
    one row per question with its task, depth, answer and needle share
    (answers of at most 16 tokens: room for a pass key). With --pots the
    pots are kept, and a second run over them reads no document and answers
    every question exactly as the first."""
    def run(policies, out, answer_tokens=16):
        p = subprocess.run([sys.executable, str(RUN), "-m", str(model), "--tasks", "--splits", "test",
                            "--lengths", "1024", "--trials", "1", "--policies", policies, "--budgets", "256",
                            "--threads", "2", "--answer-tokens", str(answer_tokens), "--pots", str(tmp_path / "pots"),
                            "--out", str(out)],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "POTSERVE_BIN": str(BIN)})
        assert p.returncode == 0, p.stderr[-2000:]
        assert "reading the document again" not in p.stderr
        return [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines()]
    rows = run("none,infinipot", tmp_path)
    assert not any(r.get("pot_loaded") for r in rows)
    assert len(list((tmp_path / "pots").glob("*/*.pot"))) == 6  # three documents, two policies
    again = run("infinipot", tmp_path / "again")
    assert len(again) == 15 and all(r["pot_loaded"] for r in again)
    assert all(isinstance(r["answer_cut"], bool) for r in rows + again)
    # --answer-tokens 2 stops every answer: each is marked cut and is the start of its 16-token
    # answer (greedy decoding: the limit changes nothing else); the report counts its cut misses
    short = run("infinipot", tmp_path / "short", answer_tokens=2)
    assert all(r["answer_cut"] for r in short), short
    assert all(q["answer"].startswith(r["answer"]) for r, q in zip(short, again)), (short, again)
    assert sum(not q["answer_cut"] for q in again) > 0, again  # 16 tokens: some answers end
    line = next(x for x in (tmp_path / "short" / "tasks.md").read_text().splitlines() if "| infinipot |" in x)
    assert line.rstrip(" |").split("|")[-1].strip() == str(sum(not r["hit"] for r in short)), line
    # a damaged pot or needle file is read again, not trusted: same answers, not loaded
    pot = next((tmp_path / "pots").glob("*/test_1024_0_0.b256.pot"))
    pot.write_bytes(pot.read_bytes()[:1000] + b"garbage")
    next((tmp_path / "pots").glob("*/test_1024_0_1.b256.needles")).write_text("3 x\n")
    p = subprocess.run([sys.executable, str(RUN), "-m", str(model), "--tasks", "--splits", "test", "--lengths", "1024",
                        "--trials", "1", "--policies", "infinipot", "--budgets", "256", "--threads", "2",
                        "--answer-tokens", "16", "--pots", str(tmp_path / "pots"), "--out", str(tmp_path / "damaged")],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "POTSERVE_BIN": str(BIN)})
    assert p.returncode == 0, p.stderr[-2000:]
    damaged = [json.loads(x) for x in (tmp_path / "damaged" / "tasks.jsonl").read_text().splitlines()]
    assert sum(not r.get("pot_loaded") for r in damaged) == 10  # those two documents' questions
    assert "reading the document again" in p.stderr  # the damaged pot, named
    assert [r["answer"] for r in damaged] == [r["answer"] for r in again]
    # --rotations: only the third document of the trial (its saved pot, so no read), asked with
    # recall and, --also-without-recall, without it over the same pot: those rows are the
    # plain policy's and answer as the run without recall did
    p = subprocess.run([sys.executable, str(RUN), "-m", str(model), "--tasks", "--splits", "test", "--lengths", "1024",
                        "--trials", "1", "--rotations", "2", "--policies", "infinipot-recall-bestlast",
                        "--also-without-recall", "--ask", "single,fact", "--budgets", "256", "--threads", "2",
                        "--answer-tokens", "16",
                        "--pots", str(tmp_path / "pots"), "--out", str(tmp_path / "third")],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "POTSERVE_BIN": str(BIN)})
    assert p.returncode == 0, p.stderr[-2000:]
    third = [json.loads(x) for x in (tmp_path / "third" / "tasks.jsonl").read_text().splitlines()]
    assert len(third) == 4 and {r["rotation"] for r in third} == {2} and all(r["pot_loaded"] for r in third), third
    plain = [r for r in third if r["policy"] == "infinipot"]
    recalled = [r for r in third if r["policy"] == "infinipot-recall-bestlast"]
    assert len(plain) == len(recalled) == 2 and all("recall_passages" in r and "recall_passages" not in q
                                                    for r, q in zip(recalled, plain)), third
    assert [r["answer"] for r in plain] == [r["answer"] for r in again if r["rotation"] == 2 and
                                            r["task"] in ("single", "fact")]
    for bad in ("5", "x", "1,,2"):  # a clear error, nothing run
        p = subprocess.run([sys.executable, str(RUN), "-m", str(model), "--tasks", "--rotations", bad,
                            "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "--rotations" in p.stderr and not (tmp_path / "bad").exists(), p.stderr
    # --winners' uneven-budget lines: with the whole budget to the score, unpooled, the
    # per-head allocation is the pot's own choice, so its share is what the pot kept
    line = (tmp_path / "again" / "work" / "docs.jsonl").read_text().splitlines()[0]
    (tmp_path / "one.jsonl").write_text(line + "\n")
    p = subprocess.run([str(ROOT / "build" / "longdoc_bench"), "-m", str(model), "-t", "2", "--docs",
                        str(tmp_path / "one.jsonl"), "--policy", "infinipot", "--budget", "256", "--keep", "128",
                        "-n", "1", "--winners", "--nuc-share", "0", "--pool-width", "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    won = [x.split() for x in p.stderr.splitlines() if x.startswith("winners ")]
    alloc = [x.split() for x in p.stderr.splitlines() if x.startswith("budgets ")]
    assert len(won) == len(alloc) > 0, p.stderr[-2000:]
    for w, b in zip(won, alloc):
        assert (w[2], w[4]) == (b[2], b[4]), (w, b)  # the same compression and needle
        assert abs((1 - float(w[14])) - float(b[9])) <= 0.01, (w, b)
        assert all(0 <= float(b[k]) <= 1 for k in (9, 11, 13)), b
    # --attend: instead of answers, each asked question's rank of every needle's window (attend.py)
    p = subprocess.run([str(ROOT / "build" / "longdoc_bench"), "-m", str(model), "-t", "2", "--docs",
                        str(tmp_path / "one.jsonl"), "--policy", "infinipot", "--budget", "256", "--keep", "128",
                        "--attend", "64"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and not p.stdout, p.stderr[-2000:]
    att = [x.split() for x in p.stderr.splitlines() if x.startswith("attend ")]
    for bad in ("0", "x"):  # a usage error, nothing read
        q = subprocess.run([str(ROOT / "build" / "longdoc_bench"), "-m", str(model), "--docs", str(tmp_path / "one.jsonl"),
                            "--attend", bad], capture_output=True, text=True, timeout=60)
        assert q.returncode == 2 and "--attend" in q.stderr, q.stderr
    plan = json.loads(line)
    assert len(att) == sum(1 for q in plan["questions"] if q) * len(plan["needles"]), p.stderr[-2000:]
    for w in att:
        windows = int(w[4])
        assert w[5::2] == ["needle", "sum", "max", "mean"] and all(0 <= int(r) < windows for r in w[8::2]), w
    first = {(r["trial"], r["rotation"], r["q"]): r for r in rows if r["policy"] == "infinipot"}
    for r in again:
        old = first[(r["trial"], r["rotation"], r["q"])]
        assert (r["answer"], r["kept"], r["tokens_read"], r["compressions"]) == \
            (old["answer"], old["kept"], old["tokens_read"], old["compressions"])
    assert len(rows) == 2 * 15
    for pol in ("none", "infinipot"):
        cell = [r for r in rows if r["policy"] == pol]
        assert {(r["task"], r["depth"]) for r in cell} == {(t, d) for t in ("single", "multikey", "multivalue",
                                                                             "vartrack", "fact")
                                                           for d in (0.1, 0.5, 0.9)}
        assert all(0 <= r["kept_needle"] <= 1 and len(r["kept_layers_needle"]) == 30 for r in cell)
    assert all(r["kept_needle"] == 1.0 and r["compressions"] == 0 for r in rows if r["policy"] == "none")
    assert all(r["compressions"] >= 1 for r in rows if r["policy"] == "infinipot")
    # the 135M model reads a pass key from a 1K document it holds whole
    assert any(r["hit"] for r in rows if r["policy"] == "none" and r["task"] == "single")
    assert "| test | none | document | 1024 |" in (tmp_path / "tasks.md").read_text()


def test_notes_screen_scoring():
    """notes_screen.py counts a needle as carried by the notes only when every
    number, VAR name, key word and city of it is written there, and cuts a
    document into chunks that cover it exactly."""
    import random
    sys.path.insert(0, str(ROOT / "tests" / "bench" / "longdoc"))
    import notes_screen
    import tasks
    rng = random.Random(7)
    for kind in tasks.TASKS:
        task = tasks.make_task(kind, rng)
        for needle in task["needles"]:
            words = notes_screen.salient(needle)
            assert words, needle
            assert notes_screen.carried(needle, "notes: " + " ; ".join(words))
            assert notes_screen.carried(needle, needle)
            for w in words:  # each word is needed, and only as a whole word
                assert not notes_screen.carried(needle, needle.replace(w, "x" + w + "9"))
    fact = "Ada Lovelace moved to Lisbon many years ago and still lives there."
    assert notes_screen.salient(fact) == ["Lovelace", "Lisbon"]
    assert notes_screen.salient("VAR ABCDE = VAR FGHIJ.") == ["ABCDE", "FGHIJ"]
    assert notes_screen.salient("The special magic number for walnut is 90644.") == ["90644", "walnut"]
    text = b"".join(b"paragraph %d " % i * 40 + b"\n\n" for i in range(50))
    parts = notes_screen.chunks(text, 1000)
    assert parts[0][0] == 0 and parts[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert all(e - s <= 1000 for s, e in parts)


def test_capacity_classes():
    """capacity.py takes the needles out of a built document byte-exactly
    (none left in the haystack, no haystack text lost) and sorts sentences
    into the fact classes it counts."""
    import random
    sys.path.insert(0, str(ROOT / "tests" / "bench" / "longdoc"))
    import capacity
    import tasks
    paras = [f"Paragraph {i} says the mirror carries version {i}.{i + 1} of “dpkg”. It is ordinary."
             for i in range(400)]
    plan = [tasks.make_task(k, random.Random(3)) for k in tasks.TASKS]
    text, needles = tasks.build_document(paras, 0.25, 4000, plan, 1)
    hay, needle_texts = capacity.haystack_and_needles(text, needles)
    assert sorted(needle_texts) == sorted(n for t in plan for n in t["needles"])
    assert not any(n in "\n\n".join(hay) for n in needle_texts)
    assert sum(len(p) for p in hay) + sum(len(n) for n in needle_texts) == len(text.replace("\n\n", ""))
    assert capacity.kinds("It is ordinary.") == set()
    assert capacity.kinds("Paragraph 3 says the mirror carries version 3.4 of dpkg.") == set()  # first word
    assert capacity.kinds("The mirror carries version 3.4 of “Debian”.") == {"name"}
    assert capacity.kinds("the mirror holds 68980 packages") == {"number", "long number"}
    assert capacity.kinds("Packages moved in 1996 to the Debian archive.") == {"number", "name"}
    assert capacity.sentences("One. Two!\nThree? Four") == ["One.", "Two!", "Three?", "Four"]


def test_capacity_rows_garbage(tmp_path):
    """capacity.py --rows answers a file that is not run.py rows with a clear
    error naming it, not a traceback."""
    script = ROOT / "tests" / "bench" / "longdoc" / "capacity.py"
    for name, text in (("junk.jsonl", "garbage\n"), ("other.jsonl", '{"a": 1}\n'), ("list.jsonl", "[1, 2]\n")):
        (tmp_path / name).write_text(text)
        p = subprocess.run([sys.executable, str(script), "--rows", str(tmp_path / name)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and f"{name}: not run.py --tasks rows" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, str(script), "--rows", str(tmp_path / "missing.jsonl")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "missing.jsonl: not run.py --tasks rows" in p.stderr
