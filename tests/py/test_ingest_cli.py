"""`potserve ingest` as a user runs it: a real file through a pot, the JSON
report, streaming from stdin, and clear errors for bad settings and files."""
import json

from conftest import run

DOC = ("The lighthouse keeper counted the ships that passed each night. In March there were seventeen. "
       "The pass key is 4711. ") * 40


def ingest(model, path, *args, input=None):
    return run("ingest", "-m", model, path, *args, input=input)


def test_ingest_reports_and_answers(model, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    p = ingest(model, doc, "--budget", "256", "--chunk", "64", "--question", "What is the pass key?",
               "-n", "8", "--json", "--track", "10:20")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["tokens_read"] > 600 and r["compressions"] >= 2
    assert r["tokens_in_pot"] <= r["budget_tokens"] == 256
    assert r["bytes_read"] == len(DOC.encode())
    assert 0 <= r["compress_share"] < 1 and r["ingest_tokens_per_s"] > 0
    assert r["pot_bytes"] > 0 and r["peak_rss_bytes"] > 0
    assert len(r["tracked_kept_share_by_layer"]) == 30 and 0 <= r["tracked_kept_share"] <= 1
    assert isinstance(r["answer"], str) and r["answer_tokens"] >= 1


def test_ingest_from_stdin_equals_file(model, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    args = ("--budget", "256", "--chunk", "64", "--question", "What is the pass key?", "-n", "8", "--json")
    a = json.loads(ingest(model, doc, *args).stdout)
    b = json.loads(ingest(model, "-", *args, input=DOC.encode()).stdout)
    for k in ("answer", "tokens_read", "compressions", "tokens_in_pot"):
        assert a[k] == b[k], k


def test_ingest_every_policy_and_schedule_runs(fixtures, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC[:1500])
    for policy in ("infinipot", "finch", "snapkv", "streaming", "h2o", "truncate", "cascade"):
        for schedule in ("fixed", "imdc"):
            p = ingest(fixtures / "tiny_llama.gguf", doc, "--budget", "160", "--keep", "80", "--chunk", "32",
                       "--policy", policy, "--schedule", schedule, "--question", "key?", "-n", "4", "--json")
            assert p.returncode == 0, (policy, schedule, p.stderr)
            r = json.loads(p.stdout)
            assert r["compressions"] >= 1 and r["tokens_in_pot"] <= 160, (policy, schedule)
    p = ingest(fixtures / "tiny_llama.gguf", doc, "--budget", "160", "--policy", "finch", "--late-question",
               "--finch-keep", "40", "--question", "key?", "-n", "4", "--json")
    assert p.returncode == 0, p.stderr


def test_ingest_errors_are_one_line(model, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine text \xff\xfe broken")
    cases = [
        ((doc, "--budget", "100000"), "budget_tokens"),
        ((doc, "--budget", "256", "--keep", "300"), "keep_tokens"),
        ((doc, "--policy", "magic"), "policy"),
        ((doc, "--schedule", "weekly"), "schedule"),
        ((doc, "--budget", "128", "--policy", "none"), "does not fit"),
        ((tmp_path / "missing.txt",), "cannot open"),
        ((bad,), "UTF-8"),
        ((doc, "--track", "9:3"), "--track"),
        ((doc, "--nuc-share", "2"), "--nuc-share"),
        ((doc, "--pool-width", "4"), "pool_width"),
        # flags that modify another one were silently ignored without it
        ((doc, "-n", "8"), "--n-predict needs --question"),
        ((doc, "--policy", "finch", "--late-question"), "--late-question needs --question"),
        ((doc, "--late-question", "--question", "q?"), "--late-question is a stage of --policy finch"),
    ]
    for args, needle in cases:
        p = ingest(model, *args)
        assert p.returncode in (1, 2), (args, p.returncode)
        err = p.stderr.decode()
        assert err.count("\n") == 1 and needle in err, (args, err)
    p = run("ingest", "-m", model)
    assert p.returncode == 2 and b"FILE is required" in p.stderr


def test_ingest_infinipot_ablation_flags(fixtures, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC[:1500])
    for flags in (["--no-catalyst"], ["--no-reset-positions"], ["--no-catalyst", "--no-reset-positions"],
                  ["--whole-words"], ["--whole-words", "--policy", "finch"]):
        p = ingest(fixtures / "tiny_llama.gguf", doc, "--budget", "160", "--chunk", "32", "--nuc-share", "0",
                   *flags, "--question", "key?", "-n", "4", "--json")
        assert p.returncode == 0, (flags, p.stderr)
        assert json.loads(p.stdout)["compressions"] >= 1
    p = ingest(fixtures / "tiny_llama.gguf", doc, "--budget", "160", "--policy", "snapkv", "--no-catalyst")
    assert p.returncode != 0 and b"no_catalyst" in p.stderr


def test_ingest_progress_lines(fixtures, tmp_path):
    """--progress: JSON lines on stderr while reading, the last one at the
    whole document; a bad count is a usage error."""
    model = fixtures / "tiny_llama.gguf"
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC * 20)  # > 64 KB: several reads, several lines
    p = ingest(model, doc, "--budget", "160", "--keep", "80", "--chunk", "32", "--progress", "1000", "--json")
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stderr.decode().splitlines() if x.startswith("{")]
    final = json.loads(p.stdout)
    assert len(lines) >= 2
    assert [x["tokens_read"] for x in lines] == sorted(x["tokens_read"] for x in lines)
    assert lines[-1]["tokens_read"] == final["tokens_read"]
    assert all(x["rss_bytes"] > 0 and x["tokens_in_pot"] <= 160 and x["seconds"] >= 0 for x in lines)
    for bad in ("0", "-5", "12x"):
        p = ingest(model, doc, "--progress", bad)
        assert p.returncode == 2 and b"--progress" in p.stderr
