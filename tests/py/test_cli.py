"""The command line as a user meets it: --help everywhere, info, tokenize,
generate (deterministic greedy and seeded sampling), and hostile model files
answered with one error line and a non-zero exit, never a crash."""
import os
import re
import shutil
import subprocess

import pytest
from pathlib import Path

from conftest import BIN, FIXTURES, run

COMMANDS = ["generate", "tokenize", "info", "logits"]


def test_top_level_help():
    p = run("--help", check=True)
    for c in COMMANDS:
        assert c.encode() in p.stdout
    assert run().returncode == 2
    assert run("frobnicate").returncode == 2


def test_version_names_the_build():
    # the git revision the binary was built from ("unknown" outside a clone)
    for arg in ("--version", "version"):
        p = run(arg, check=True)
        assert p.stdout.startswith(b"potserve ") and len(p.stdout.split()) == 2, p.stdout
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists() and BIN.resolve().is_relative_to(root) and shutil.which("git"):
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert head[:12] in run("--version").stdout.decode()


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help(cmd):
    p = run(cmd, "--help", check=True)
    assert b"usage: potserve " + cmd.encode() in p.stdout
    assert b"--model" in p.stdout
    bad = run(cmd, "--no-such-flag")
    assert bad.returncode == 2 and b"unknown option" in bad.stderr


def test_info_describes_default_model(model):
    out = run("info", "-m", model, check=True).stdout.decode()
    assert "architecture:    llama" in out
    assert "quantization:    Q4_1" in out
    assert "context length:  8192" in out
    assert "chat template:   chatml" in out
    assert "vocabulary:      49152 (gpt2)" in out
    params = int(out.split("parameters:")[1].split()[0])
    assert 130e6 < params < 140e6


def test_tokenize_prints_ids(model):
    p = run("tokenize", "-m", model, input=b"Hello world", check=True)
    assert p.stdout.decode().split() == ["19556", "905"]
    p = run("tokenize", "-m", model, "--parse-special", input=b"<|im_start|>user", check=True)
    assert p.stdout.decode().split()[0] == "1"
    bad = run("tokenize", "-m", model, input=b"\xff\xfe")
    assert bad.returncode == 1 and b"UTF-8" in bad.stderr


def test_generate_greedy_is_deterministic(model):
    args = ("generate", "-m", model, "--chat", "-p", "What is the capital of France?", "-n", "24")
    a = run(*args, check=True).stdout
    b = run(*args, check=True).stdout
    assert a == b and len(a.strip()) > 0


def test_generate_seeded_sampling(model):
    base = ("generate", "-m", model, "-p", "Once upon a time", "-n", "20", "--temp", "1.0", "--top-p", "0.95")
    a = run(*base, "--seed", "7", check=True).stdout
    b = run(*base, "--seed", "7", check=True).stdout
    c = run(*base, "--seed", "8", check=True).stdout
    assert a == b
    assert a != c


def test_generate_stop_string(model):
    p = run("generate", "-m", model, "-p", "1, 2, 3, 4, 5,", "-n", "30", "--stop", "9", check=True)
    assert b"9" not in p.stdout and b"8" in p.stdout


def test_generate_rejects_bad_flags(model):
    for args in (["--temp", "abc"], ["--top-p", "2"], ["-n", "0"], ["--seed", "-1"]):
        p = run("generate", "-m", model, "-p", "x", *args)
        assert p.returncode == 2, args
        assert p.stderr.count(b"\n") == 1, p.stderr
    # flags that modify another one were silently ignored without it
    for args, other in ((["--system", "Be brief."], b"--chat"), (["--recycle-keep", "8"], b"--recycle-stride"),
                        (["--recycle-pool", "3"], b"--recycle-stride")):
        p = run("generate", "-m", model, "-p", "x", *args)
        assert p.returncode == 2 and p.stderr == b"potserve generate: " + args[0].encode() + b" needs " + other + b"\n"
    p = run("generate", "-m", model, "-p", "x", "--chat-template", "nosuch")
    assert p.returncode == 1 and b"chatml" in p.stderr


@pytest.mark.parametrize("cmd", ["generate", "logits"])
def test_prompt_as_text_or_ids_not_both(model, cmd):
    for args in ([], ["-p", "x", "--tokens", "1 2"]):
        p = run(cmd, "-m", model, *args)
        assert p.returncode == 2, args
        assert p.stderr == f"potserve {cmd}: give exactly one of -p PROMPT and --tokens IDS\n".encode()
    for ids in ("1,2,", "1,,2", ",1", "1;2"):  # ("1,2," was taken as 1,2)
        p = run(cmd, "-m", model, "--tokens", ids)
        assert p.returncode == 1 and b"--tokens: not a list of token ids" in p.stderr, (ids, p.stderr)


def test_thread_counts_and_empty_stops_are_usage_errors(model):
    """Like every other bad flag: exit 2 (a bad --threads exited 1, and --stop "" was taken)."""
    for cmd, args in (("generate", ["-p", "hi", "-t", "0"]), ("generate", ["-p", "hi", "-t", "abc"]),
                      ("tokenize", ["-t", "2000"]), ("generate", ["-p", "hi", "--stop", ""])):
        p = run(cmd, "-m", model, *args, input=b"")
        assert p.returncode == 2 and (b"--threads" in p.stderr or b"--stop" in p.stderr), (cmd, args, p.stderr)


def test_ingest_says_why_it_cannot_read(model, tmp_path):
    p = run("ingest", "-m", model, tmp_path)
    assert p.returncode == 1 and p.stderr.endswith(b"failed: Is a directory\n"), p.stderr


def test_backend_flag(model):
    p = run("generate", "-m", model, "-p", "1, 2,", "-n", "2", "--backend", "cpu", check=True)
    assert p.stdout.strip()
    p = run("generate", "-m", model, "-p", "x", "--backend", "nosuch")
    assert p.returncode == 1 and b"unknown backend 'nosuch' (cpu, cuda)" in p.stderr
    p = run("ingest", "-m", model, "/dev/null", "--backend", "cuda")
    assert p.returncode == 1 and b"not built into this binary" in p.stderr


def test_tiny_models_of_every_type_generate(fixtures):
    for f in sorted(FIXTURES.glob("tiny_*.gguf")):
        p = run("generate", "-m", f, "-p", "hello", "-n", "8", "--print-ids")
        assert p.returncode == 0, (f.name, p.stderr)
        assert len(p.stdout.split()) >= 1, f.name


# ---- hostile files ----------------------------------------------------------------

def expect_clean_failure(path, needle):
    for cmd in ("info", "tokenize"):
        p = run(cmd, "-m", path, input=b"hi")
        assert p.returncode == 1, (cmd, p.returncode, p.stderr)  # not a signal
        err = p.stderr.decode()
        assert err.count("\n") == 1, err
        assert needle in err, err


def test_missing_and_non_gguf_files(tmp_path):
    expect_clean_failure(tmp_path / "nope.gguf", "cannot open")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a model at all" * 10)
    expect_clean_failure(junk, "bad magic")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    expect_clean_failure(empty, "truncated")


def test_truncated_real_model(model, tmp_path):
    data = model.read_bytes()
    for cut in (10, 100, 5000, 1_000_000, len(data) // 2, len(data) - 1):
        t = tmp_path / f"cut{cut}.gguf"
        t.write_bytes(data[:cut])
        p = run("info", "-m", t)
        assert p.returncode == 1, (cut, p.stderr)
        assert p.stderr.count(b"\n") == 1


def test_unknown_architecture_and_missing_tokenizer(tmp_path, fixtures):
    import gguf
    import numpy as np

    def write(path, arch, with_tokenizer):
        w = gguf.GGUFWriter(str(path), arch)
        w.add_block_count(1)
        if with_tokenizer:
            w.add_tokenizer_model("gpt2")
            w.add_token_list(["a", "b"])
        w.add_tensor("token_embd.weight", np.zeros((2, 8), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write(tmp_path / "mamba.gguf", "mamba", True)
    expect_clean_failure(tmp_path / "mamba.gguf", "architecture 'mamba' is not supported")
    write(tmp_path / "notok.gguf", "llama", False)
    p = run("info", "-m", tmp_path / "notok.gguf")
    assert p.returncode == 1 and p.stderr.count(b"\n") == 1


def test_a_model_that_is_a_fifo_is_refused_at_once(tmp_path):
    """--model naming a FIFO (bash's <(...)) blocked in open() for ever."""
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    p = run("info", "-m", fifo, timeout=30)
    assert p.returncode == 1 and b"not a regular file" in p.stderr, p.stderr


def test_corrupted_tiny_model_bytes(fixtures, tmp_path):
    """Every single-byte corruption in the header region either loads or fails
    with one line; none crashes (exit code by signal would be negative)."""
    src = (fixtures / "tiny_llama.gguf").read_bytes()
    header_end = min(len(src), 4096)
    t = tmp_path / "c.gguf"
    for i in range(0, header_end, 37):
        d = bytearray(src)
        d[i] ^= 0xA5
        t.write_bytes(bytes(d))
        p = run("info", "-m", t)
        assert p.returncode in (0, 1), (i, p.returncode, p.stderr[-300:])
        if p.returncode == 1:
            assert p.stderr.count(b"\n") == 1, (i, p.stderr[-300:])


def test_recycled_attention(model):
    """Stride 1 is full attention; a recycled set as large as the context is too;
    a small set still generates (its quality is measured in tests/bench), and
    its choice depends on the pooling of the full step's scores (7 by default,
    1: none); an even width is refused."""
    base = ("generate", "-m", model, "-p", "Once upon a time, in a small village by the sea,", "-n", "24", "--print-ids")
    full = run(*base, check=True).stdout
    assert run(*base, "--recycle-stride", "1", "--recycle-keep", "4", check=True).stdout == full
    assert run(*base, "--recycle-stride", "4", "--recycle-keep", "64", check=True).stdout == full
    small = run(*base, "--recycle-stride", "4", "--recycle-keep", "8", check=True).stdout
    assert len(small.split()) == 24
    unpooled = run(*base, "--recycle-stride", "4", "--recycle-keep", "8", "--recycle-pool", "1", check=True).stdout
    assert len(unpooled.split()) == 24 and unpooled != small
    assert run(*base, "--recycle-stride", "4", "--recycle-keep", "8", "--recycle-pool", "7", check=True).stdout == small
    even = run(*base, "--recycle-stride", "4", "--recycle-keep", "8", "--recycle-pool", "4")
    assert even.returncode == 2 and b"--recycle-pool must be odd" in even.stderr
    bad = run(*base, "--recycle-stride", "4")
    assert bad.returncode == 2 and b"--recycle-keep" in bad.stderr


def test_lost_output_and_unreadable_input_are_failures(fixtures, tmp_path):
    """Output that does not reach stdout (a full disk) and stdin that cannot be
    read (a directory, a closed descriptor) fail with one line and status 1;
    they exited 0, the output lost or the input taken as empty."""
    tiny = fixtures / "tiny_llama.gguf"
    for args, stdin in ((["tokenize", "-m", tiny], b"hello world " * 2000), (["info", "-m", tiny], b"")):
        with open("/dev/full", "wb") as full:
            p = subprocess.run([str(BIN), *map(str, args)], input=stdin, stdout=full, stderr=subprocess.PIPE, timeout=120)
        assert p.returncode == 1 and b"writing the output failed" in p.stderr, (args, p.returncode, p.stderr)
    for args in (["tokenize", "-m", tiny], ["recall", "-q", "x"]):
        d = os.open(tmp_path, os.O_RDONLY)  # a directory: read() fails with EISDIR
        try:
            p = subprocess.run([str(BIN), *map(str, args)], stdin=d, capture_output=True, timeout=120)
        finally:
            os.close(d)
        assert p.returncode == 1 and b"cannot read stdin" in p.stderr, (args, p.returncode, p.stderr)


def test_recall_bytes_is_the_servers_range():
    for bad in ("0", "-1", "1048577", "99999999999999999999", "12x"):
        p = run("recall", "-q", "x", "--bytes", bad, input=b"some text")
        assert p.returncode == 2 and b"[1, 1048576]" in p.stderr, (bad, p.stderr)
    assert run("recall", "-q", "some", "--bytes", "1048576", input=b"some text").returncode == 0
    # the bytes it reports are the passages' own, as the server's "bytes" (it counted the blank lines too)
    doc = "\n\n".join(f"Paragraph {i} tells of the lighthouse and the keeper {i}." for i in range(40)).encode()
    p = run("recall", "-q", "Who kept the lighthouse?", "--bytes", "300", input=doc)
    passages = p.stdout.decode().rsplit("\n\nWho kept the lighthouse?", 1)[0].split("\n\n")[1:]  # after the heading
    said = re.search(r"(\d+) of \d+ passages, (\d+) bytes", p.stderr.decode())
    assert said and int(said[1]) == len(passages) > 1, (p.stderr, passages)
    assert int(said[2]) == sum(len(x.encode()) for x in passages) <= 300, (p.stderr, passages)


def test_serve_refuses_a_header_limit_it_cannot_honour(fixtures, tmp_path):
    """A header limit that would give every connection gigabytes (4G took
    2.1 GB for one request, 16G stopped the server answering) stops the start
    with one line; it used to start."""
    tiny = fixtures / "tiny_llama.gguf"
    p = run("serve", "--model", tiny, "--port", "0", "--data-dir", tmp_path / "d", "--max-header-bytes", "2M", timeout=60)
    assert p.returncode == 2 and b"max-header-bytes" in p.stderr, p.stderr
