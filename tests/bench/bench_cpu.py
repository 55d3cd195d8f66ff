#!/usr/bin/env python3
"""Side-by-side CPU benchmark of potserve and llama.cpp (not part of `make test`).

    make bench-cpu          (installs llama-cpp-python as `make test-reference` does, then runs this)
    .venv/bin/python tests/bench/bench_cpu.py [--runs 5] [--threads 2] [--quick] [...]

Both engines read the same GGUF file with the same thread count and the same
token ids (real English text from bench_text.py, tokenized once; the two
tokenizers are checked to agree). llama.cpp is llama-cpp-python in a worker
process (llama_worker.py): f16 KV, flash attention off, n_batch = n_ubatch =
512. Each measure is run alternately (A/B, then B/A), a warm-up round first,
and the medians of --runs runs are compared; ratio = potserve / llama.cpp
(above 1: potserve is faster; for memory, below 1: potserve uses less).

 1. prefill tokens/s of 512- and 2048-token prompts;
 2. decode tokens/s at context 128 and 2048 (64 greedy tokens after the prompt;
    both count the tokens sampled after the prefill over the time from the end
    of the prefill to the last one, as `potserve generate -v` does);
    1 and 2 for the default model (Q4_1) and for a Q8_0 copy made by make_q8_0.py;
 3. an 8K-token document: llama.cpp's full prefill (n_ctx 8192) against
    `potserve ingest` through a pot of --budget entries (tokens/s, peak RSS,
    compressions, share of time compressing);
 4. potserve alone: ingest tokens/s and peak RSS for 8K, 32K and 128K-token
    documents (128K/8K speed ratio, RSS growth);
 5. aggregate decode tokens/s of 1, 4, 8 and 16 concurrent sequences:
    potserve through tests/bench/bench_batch.c where it builds (else through
    the HTTP server), llama.cpp with one llama_decode of all sequences a step;
 6. the physical bound: streaming-read bandwidth (membw.c's vread) against
    the bytes one decoded token reads (weights + f16 KV at that context).

llama.cpp runs with OMP_WAIT_POLICY=PASSIVE unless --llama-omp default: its
OpenMP threads otherwise spin at every barrier, and on a machine shared with
other jobs a spinning thread that holds a core while its partner is descheduled
makes llama.cpp 10-100x slower and its timings meaningless (potserve's pool
blocks on condition variables). The --omp-check section measures that effect.

Writes build/bench/cpu.md (the tables, machine facts and command line),
cpu.json (every run) and cpu.png (ratios; only when matplotlib imports).
"""
import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import resource
import select
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import bench_text  # noqa: E402

BUILT = ROOT / "build" / "potserve"
OUTDIR = ROOT / "build" / "bench"
BIN = OUTDIR / "potserve"  # a copy of build/potserve taken at the start: others may rebuild it meanwhile
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
T0 = time.monotonic()
BATCH_TOPICS = ["the ocean", "mountains", "a busy city", "the history of bread", "volcanoes", "honeybees",
                "the moon landing", "jazz music", "winter forests", "old libraries", "trains", "deserts",
                "the printing press", "coral reefs", "chess", "thunderstorms"]  # as in bench_batch.c


def log(msg):
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rel(p):
    p = pathlib.Path(os.path.abspath(p))
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


# --- potserve ----------------------------------------------------------------------------------

GEN_RE = re.compile(r"prompt: (\d+) tokens, ([\d.]+) tok/s; generated: (\d+) tokens, ([\d.]+) tok/s")


def ps_generate(model, tokens, n, threads):
    cmd = [str(BIN), "generate", "-m", str(model), "--tokens", ",".join(map(str, tokens)), "-n", str(n),
           "-t", str(threads), "-v", "--print-ids"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = GEN_RE.search(p.stderr)
    if p.returncode or not m:
        raise RuntimeError(f"potserve generate failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return {"n_prompt": int(m[1]), "prefill_tps": float(m[2]), "n_gen": int(m[3]), "decode_tps": float(m[4]),
            "ids": [int(x) for x in p.stdout.split()]}


def ps_ingest(model, path, budget, threads):
    """`potserve ingest --json`, plus the process's CPU seconds (user + system,
    model loading included: about 0.4 s) and tokens per CPU second, which a
    shared machine's load disturbs much less than tokens per wall second."""
    cmd = [str(BIN), "ingest", "-m", str(model), str(path), "--budget", str(budget), "--json", "-t", str(threads)]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        raise RuntimeError(f"potserve ingest failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    out = json.loads(p.stdout)
    out["cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    out["tokens_per_cpu_s"] = out["tokens_read"] / out["cpu_s"] if out["cpu_s"] > 0 else float("nan")
    return out


def snapshot_binary():
    """Copies build/potserve to build/bench/potserve once it is complete and
    has not changed for a few seconds (a concurrent `make` may be linking it)."""
    import shutil
    for _ in range(60):
        try:
            st = BUILT.stat()
            if time.time() - st.st_mtime > 5 and os.access(BUILT, os.X_OK):
                shutil.copy2(BUILT, BIN)
                if BUILT.stat().st_mtime == st.st_mtime and subprocess.run(
                        [str(BIN), "--help"], capture_output=True).returncode == 0:
                    return
        except OSError:
            pass
        time.sleep(5)
    sys.exit(f"{rel(BUILT)} is missing or keeps changing: run make first")


# --- llama.cpp (worker process) ----------------------------------------------------------------

class LlamaWorker:
    def __init__(self, model, n_ctx, threads, n_seq_max=1, omp="passive"):
        env = dict(os.environ)
        if omp == "passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        else:
            env.pop("OMP_WAIT_POLICY", None)
        self.p = subprocess.Popen([sys.executable, str(HERE / "llama_worker.py"), str(model), str(n_ctx),
                                   str(threads), str(n_seq_max)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.info = self._read(600)

    def _read(self, timeout=None):
        if timeout is not None:
            ready, _, _ = select.select([self.p.stdout], [], [], timeout)
            if not ready:
                self.kill()
                raise TimeoutError(f"llama.cpp worker: no answer in {timeout} s")
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError("llama.cpp worker died")
        return json.loads(line)

    def req(self, obj, timeout=None):
        self.p.stdin.write(json.dumps(obj) + "\n")
        self.p.stdin.flush()
        return self._read(timeout)

    def gen(self, tokens, n, timeout=None):
        r = self.req({"op": "gen", "tokens": list(tokens), "n": n}, timeout)
        r["prefill_tps"] = r["n_prompt"] / r["prompt_s"]
        r["decode_tps"] = r["n_gen"] / r["decode_s"] if r["n_gen"] else float("nan")
        return r

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.write('{"op": "quit"}\n')
                self.p.stdin.flush()
                self.p.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


# --- machine facts -------------------------------------------------------------------------------

def machine_facts(threads):
    cpu = {}
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k in ("model name", "cpu family", "model", "stepping", "flags", "cpu MHz") and k not in cpu:
                cpu[k] = v
    except OSError:
        pass
    flags = set(cpu.get("flags", "").split())
    simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vnni", "avx_vnni") if f in flags]

    def read(path):
        try:
            return open(path).read().strip()
        except OSError:
            return "?"
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1048576:.1f} GiB"
    except OSError:
        pass
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True)
    import llama_cpp
    sysinfo = llama_cpp.llama_print_system_info()
    return {
        "cpu": f"{cpu.get('model name', '?')} (family {cpu.get('cpu family', '?')}, model {cpu.get('model', '?')}, "
               f"stepping {cpu.get('stepping', '?')})",
        "simd": " ".join(simd),
        "l3": read("/sys/devices/system/cpu/cpu0/cache/index3/size"),
        "cpus_online": os.cpu_count(),
        "threads": threads,
        "memory": mem,
        "kernel": platform.release(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "potserve": (git.stdout.strip() or "?") + (" + uncommitted changes" if dirty.stdout.strip() else ""),
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_system_info": (sysinfo.decode() if isinstance(sysinfo, bytes) else str(sysinfo)).strip(),
        "load_start": os.getloadavg(),
    }


# --- the measures ------------------------------------------------------------------------------

def alternate(i, a, b):
    """Runs a then b on even rounds, b then a on odd ones."""
    if i % 2 == 0:
        return a(), b()
    rb = b()
    return a(), rb


def bench_model(tag, model, prompts, args, results):
    """Measures 1 and 2 for one model; returns its medians."""
    T = args.threads
    n_ctx = max(len(p) for p in prompts.values()) + args.decode_tokens + 256
    w = LlamaWorker(model, n_ctx, T, omp=args.llama_omp)
    cases = [("prefill512", prompts[512], 1), ("ctx128", prompts[128], args.decode_tokens),
             ("ctx2048", prompts[2048], args.decode_tokens)]
    runs = {c: {"potserve": [], "llama": []} for c, _, _ in cases}
    check = {}
    try:
        for i in range(args.warmup + args.runs):
            warm = i < args.warmup
            log(f"{tag}: {'warm-up' if warm else f'run {i - args.warmup + 1}/{args.runs}'} "
                f"(load {os.getloadavg()[0]:.1f})")
            for name, toks, n in cases:
                ps, ll = alternate(i, lambda: ps_generate(model, toks, n, T), lambda: w.gen(toks, n))
                if name == "ctx128" and not check:
                    check = {"potserve": ps["ids"], "llama": ll["ids"]}
                if ps["n_gen"] < n:
                    log(f"  note: potserve stopped after {ps['n_gen']} of {n} tokens ({name})")
                if not warm:
                    for eng, r in (("potserve", ps), ("llama", ll)):
                        runs[name][eng].append({k: v for k, v in r.items() if k != "ids"})
    finally:
        w.close()
    out = {}
    for eng in ("potserve", "llama"):
        out[eng] = {
            "prefill512": med([r["prefill_tps"] for r in runs["prefill512"][eng]]),
            "prefill2048": med([r["prefill_tps"] for r in runs["ctx2048"][eng]]),
            "decode128": med([r["decode_tps"] for r in runs["ctx128"][eng]]),
            "decode2048": med([r["decode_tps"] for r in runs["ctx2048"][eng]]),
        }
    results["models"][tag] = {"path": rel(model), "runs": runs, "medians": out, "greedy_check": check}
    return out


def omp_check(model, prompt, args, results):
    """llama.cpp's decode at context 128 with its default OpenMP wait policy (spinning)."""
    w = LlamaWorker(model, len(prompt) + args.decode_tokens + 256, args.threads, omp="default")
    rates = []
    try:
        for i in range(3):
            log(f"OMP check: run {i + 1}/3 (load {os.getloadavg()[0]:.1f})")
            try:
                rates.append(w.gen(prompt, args.decode_tokens, timeout=args.omp_timeout)["decode_tps"])
            except TimeoutError:
                rates.append(None)
                log(f"  timed out after {args.omp_timeout} s")
                break
    finally:
        w.close()
    results["omp_check"] = {"decode128_tps": rates, "timeout_s": args.omp_timeout}
    return rates


def bench_document(model, docs, ids, args, results):
    """Measure 3: the 8K document."""
    T, n = args.threads, args.doc_tokens
    path = docs[n]
    w = LlamaWorker(model, max(n, 512), T, omp=args.llama_omp)
    ps_runs, ll_runs = [], []
    try:
        log("8K document: warm-up (potserve ingest of a 2K document, llama.cpp prefill of 512 tokens)")
        ps_ingest(model, docs["warm"], args.budget, T)
        w.gen(ids[:512], 0)
        for i in range(args.doc_runs):
            log(f"8K document: run {i + 1}/{args.doc_runs} (load {os.getloadavg()[0]:.1f})")
            ps, ll = alternate(i, lambda: ps_ingest(model, path, args.budget, T), lambda: w.gen(ids[:n], 0))
            ps_runs.append(ps)
            ll_runs.append({k: v for k, v in ll.items() if k != "ids"})
        rss = w.req({"op": "rss"})
        rss["base_rss"] = w.info.get("base_rss", 0)
    finally:
        w.close()
    out = {
        "potserve_tps": med([r["ingest_tokens_per_s"] for r in ps_runs]),
        "llama_tps": med([r["prefill_tps"] for r in ll_runs]),
        "potserve_rss": med([r["peak_rss_bytes"] for r in ps_runs]),
        "llama_rss": rss["vm_hwm"],
        "llama_base_rss": rss["base_rss"],
        "compressions": med([r["compressions"] for r in ps_runs]),
        "compress_share": med([r["compress_share"] for r in ps_runs]),
        "tokens_read": ps_runs[0]["tokens_read"],
        "llama_tokens": min(n, len(ids)),
    }
    results["document"] = {"potserve_runs": ps_runs, "llama_runs": ll_runs, "llama_rss": rss, "medians": out,
                           "budget": args.budget}
    return out


def bench_long(model, docs, args, results, doc8k):
    """Measure 4: potserve ingest of 8K, 32K and 128K-token documents."""
    T, B = args.threads, args.long_budget
    sizes = [args.doc_tokens] + args.long_docs
    per = {}
    if doc8k is not None and B == args.budget:
        per[args.doc_tokens] = {"runs": results["document"]["potserve_runs"], "reused": True}
    for n in sizes:
        if n in per:
            continue
        k = args.doc_runs if n == args.doc_tokens else args.long_runs
        runs = []
        for i in range(k):
            log(f"ingest {n // 1024}K (budget {B}): run {i + 1}/{k} (load {os.getloadavg()[0]:.1f})")
            runs.append(ps_ingest(model, docs[n], B, T))
        per[n] = {"runs": runs, "reused": False}
    out = {}
    for n in sizes:
        rs = per[n]["runs"]
        out[n] = {"tps": med([r["ingest_tokens_per_s"] for r in rs]), "rss": med([r["peak_rss_bytes"] for r in rs]),
                  "tpc": med([r.get("tokens_per_cpu_s", float("nan")) for r in rs]),
                  "runs": len(rs), "tokens_read": rs[0]["tokens_read"],
                  "compressions": med([r["compressions"] for r in rs]),
                  "compress_share": med([r["compress_share"] for r in rs])}
    results["long"] = {"budget": B, "per_size": {str(n): per[n] for n in sizes}, "medians": {str(n): out[n] for n in sizes}}
    return out


BATCH_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|")


def potserve_batch_c(model, T):
    """tests/bench/bench_batch.c through its Makefile rule; None where it is not there or does not build."""
    mk = (ROOT / "Makefile").read_text()
    if not (HERE / "bench_batch.c").exists() or "bench_batch:" not in mk:
        return None, "tests/bench/bench_batch.c or its Makefile rule is missing"
    b = subprocess.run(["make", "--no-print-directory", "-s", "build/bench_batch"], cwd=ROOT,
                       capture_output=True, text=True)
    if b.returncode:
        return None, "make build/bench_batch failed: " + (b.stderr.strip().splitlines() or ["?"])[-1]

    def run():
        p = subprocess.run([str(ROOT / "build" / "bench_batch"), str(model), str(T)], cwd=ROOT,
                           capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"bench_batch failed: {p.stderr.strip()[-300:]}")
        rows = {int(m[1]): float(m[4]) for m in map(BATCH_ROW.match, p.stdout.splitlines()) if m}
        return rows, p.stdout
    return run, None


def potserve_batch_http(model, T, counts, n_tokens):
    """Aggregate decode through `potserve serve`: N concurrent /v1/completions."""
    def run():
        with tempfile.TemporaryDirectory() as data:
            p = subprocess.Popen([str(BIN), "serve", "--model", str(model), "--port", "0", "--threads", str(T),
                                  "--data-dir", data, "--durability", "none", "--access-log", "false"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                port = None
                deadline = time.monotonic() + 120
                while port is None and time.monotonic() < deadline:
                    line = p.stderr.readline()
                    if not line:
                        break
                    m = re.search(r"listening on http://[\d.]+:(\d+)", line)
                    if m:
                        port = int(m[1])
                if port is None:
                    raise RuntimeError("potserve serve did not start")
                threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
                url = f"http://127.0.0.1:{port}/v1/completions"
                rows, lines = {}, ["| sequences | tokens | wall s | tokens/s | vs 1 |", "|---:|---:|---:|---:|---:|"]
                for n in counts:
                    got = [0] * n
                    errs = []

                    def one(i):
                        body = json.dumps({"prompt": f"Here is a long essay about {BATCH_TOPICS[i]}.\n\n",
                                           "max_tokens": n_tokens, "temperature": 0}).encode()
                        try:
                            rq = urllib.request.Request(url, body, {"Content-Type": "application/json"})
                            with urllib.request.urlopen(rq, timeout=600) as r:
                                got[i] = json.load(r)["usage"]["completion_tokens"]
                        except Exception as e:  # noqa: BLE001
                            errs.append(str(e))
                    ths = [threading.Thread(target=one, args=(i,)) for i in range(n)]
                    t0 = time.perf_counter()
                    for t in ths:
                        t.start()
                    for t in ths:
                        t.join()
                    dt = time.perf_counter() - t0
                    if errs:
                        raise RuntimeError("HTTP batch: " + errs[0])
                    rows[n] = sum(got) / dt
                    lines.append(f"| {n} | {sum(got)} | {dt:.2f} | {rows[n]:.1f} | {rows[n] / rows[counts[0]]:.2f}x |")
                return rows, "\n".join(lines) + "\n"
            finally:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    return run


def bench_batch(model, vocab, args, results):
    """Measure 5: aggregate decode with 1, 4, 8, 16 sequences."""
    T, counts, n_tok = args.threads, [1, 4, 8, 16], 64
    how = "bench_batch.c"
    run_ps, why = (None, "--batch http") if args.batch == "http" else potserve_batch_c(model, T)
    if run_ps is None:
        log(f"batch: not through bench_batch.c ({why}); through the HTTP server")
        how = f"HTTP server (/v1/completions; bench_batch.c not used: {why})"
        run_ps = potserve_batch_http(model, T, counts, n_tok)
    prompts = [vocab.tokenize(f"Here is a long essay about {t}.\n\n".encode(), add_bos=False) for t in BATCH_TOPICS]
    w = LlamaWorker(model, 256 * 16, T, n_seq_max=16, omp=args.llama_omp)
    ps_rounds, ll_rounds, texts = [], [], []
    try:
        for i in range(args.batch_rounds):
            log(f"batch: round {i + 1}/{args.batch_rounds} (load {os.getloadavg()[0]:.1f})")

            def ll():
                return {n: (lambda r: r["n_gen"] / r["decode_s"])(w.req({"op": "batch", "prompts": prompts[:n],
                                                                          "n": n_tok}))
                        for n in counts}
            (ps, text), lr = alternate(i, run_ps, ll)
            ps_rounds.append(ps)
            ll_rounds.append(lr)
            texts.append(text)
    finally:
        w.close()
    out = {"how": how, "potserve": {n: med([r[n] for r in ps_rounds if n in r]) for n in counts},
           "llama": {n: med([r[n] for r in ll_rounds]) for n in counts}, "table": texts[-1]}
    results["batch"] = {"how": how, "potserve_rounds": ps_rounds, "llama_rounds": ll_rounds, "tables": texts,
                        "medians": {e: {str(k): v for k, v in out[e].items()} for e in ("potserve", "llama")}}
    return out


def model_shape(model):
    import gguf
    r = gguf.GGUFReader(str(model))
    arch = r.get_field("general.architecture").contents()

    def get(key):
        f = r.get_field(f"{arch}.{key}")
        return f.contents() if f else None
    n_head = get("attention.head_count")
    head_dim = get("attention.key_length") or get("embedding_length") // n_head
    return {"weight_bytes": decode_weight_bytes(r), "n_layer": get("block_count"),
            "n_head_kv": get("attention.head_count_kv") or n_head, "head_dim": head_dim}


def decode_weight_bytes(reader):
    """Bytes of weights one decoded token reads (a gguf.GGUFReader's file):
    every tensor, less token_embd when an output.weight exists (then a token
    gathers one embedding row; tied, the embedding is the output matrix)."""
    ts = {t.name: int(t.n_bytes) for t in reader.tensors}
    return sum(ts.values()) - (ts.get("token_embd.weight", 0) if "output.weight" in ts else 0)


def membw(threads):
    exe = OUTDIR / "membw"
    src = HERE / "membw.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run([os.environ.get("CC", "gcc"), "-O2", "-std=c11", "-D_GNU_SOURCE", "-pthread", str(src),
                        "-o", str(exe)], check=True)
    out = {}
    for t in sorted({1, threads}):
        p = subprocess.run([str(exe), "256", str(t), "10"], capture_output=True, text=True, check=True)
        out[t] = json.loads(p.stdout)
    try:
        import numpy as np
        a = np.ones(256 << 20, dtype=np.uint8)
        b = np.empty_like(a)
        best = 1e30
        for _ in range(10):
            t0 = time.perf_counter()
            np.copyto(b, a)
            best = min(best, time.perf_counter() - t0)
        out["numpy_copy_gbs"] = 2 * a.nbytes / best / 1e9
    except ImportError:
        pass
    return out


# --- output ------------------------------------------------------------------------------------

def fmt(x, digits=1):
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    return f"{x:,.{digits}f}"


def ratio(a, b, digits=2):
    if a is None or b is None or not b or a != a or b != b:
        return "—"
    return f"{a / b:.{digits}f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--q8", default=str(OUTDIR / "SmolLM2-135M-Instruct.Q8_0.gguf"),
                    help="the Q8_0 copy of --model (made when missing)")
    ap.add_argument("--no-q8", action="store_true", help="skip the second model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5, help="measured runs of 1-2 (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--doc-tokens", type=int, default=8192, help="the document of measure 3")
    ap.add_argument("--doc-runs", type=int, default=5)
    ap.add_argument("--budget", type=int, default=2048, help="pot budget of measure 3")
    ap.add_argument("--long-budget", type=int, default=None, help="pot budget of measure 4 (default --budget)")
    ap.add_argument("--long-docs", default="32768,131072", help="document sizes of measure 4 besides the 8K one")
    ap.add_argument("--long-runs", type=int, default=1)
    ap.add_argument("--batch", choices=["auto", "http", "skip"], default="auto")
    ap.add_argument("--batch-rounds", type=int, default=3)
    ap.add_argument("--llama-omp", choices=["passive", "default"], default="passive",
                    help="OMP_WAIT_POLICY for llama.cpp (see the top of this file)")
    ap.add_argument("--no-omp-check", dest="omp_check", action="store_false")
    ap.add_argument("--omp-timeout", type=int, default=60)
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: 12,3,4,5,6")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1 run, no warm-up, 2K/4K documents, no Q8_0, no OMP check")
    ap.add_argument("--out", default=str(OUTDIR / "cpu.md"))
    args = ap.parse_args()
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    if args.quick:
        args.runs, args.warmup, args.doc_runs, args.long_runs, args.batch_rounds = 1, 0, 1, 1, 1
        args.doc_tokens, args.long_docs, args.no_q8, args.omp_check = 2048, "4096", True, False
    args.long_docs = [int(x) for x in args.long_docs.split(",") if x]
    args.long_budget = args.long_budget or args.budget
    skip = set(args.skip.split(",")) - {""}
    OUTDIR.mkdir(parents=True, exist_ok=True)
    snapshot_binary()
    model = pathlib.Path(args.model)

    import llama_cpp
    facts = machine_facts(args.threads)
    log(f"{facts['cpu']}, {facts['cpus_online']} CPUs online, {args.threads} threads; load {facts['load_start']}")
    results = {"facts": facts, "args": vars(args), "models": {}}

    # the text, tokenized once; the two tokenizers must agree
    vocab = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    n_max = max([args.doc_tokens, 2048, *args.long_docs]) + 64
    text = bench_text.document(int(n_max * 5.2))
    ids = vocab.tokenize(text.encode(), add_bos=False, special=False)
    assert len(ids) >= n_max, (len(ids), n_max)
    sample = text[:40000]
    pt = subprocess.run([str(BIN), "tokenize", "-m", str(model), "--no-special"], input=sample.encode(),
                        capture_output=True, check=True)
    agree = [int(x) for x in pt.stdout.split()] == vocab.tokenize(sample.encode(), add_bos=False, special=False)
    results["tokenizers_agree"] = agree
    if not agree:
        log("warning: potserve and llama.cpp tokenize the text differently; llama.cpp's ids are used")
    prompts = {n: ids[:n] for n in (128, 512, 2048)}
    docs = {"warm": OUTDIR / "doc_warm.txt"}
    docs["warm"].write_text(vocab.detokenize(ids[:2048]).decode("utf-8", "replace"))
    for n in [args.doc_tokens, *args.long_docs]:
        docs[n] = OUTDIR / f"doc_{n}.txt"
        docs[n].write_text(vocab.detokenize(ids[:n]).decode("utf-8", "replace"))

    rows, chart = [], []   # (measure, potserve, llama.cpp, ratio); (label, ratio)
    notes = []
    med_models = {}
    # 1-2
    if "12" not in skip:
        models = [("Q4_1", model)]
        if not args.no_q8:
            q8 = pathlib.Path(args.q8)
            if not q8.exists():
                log(f"making {rel(q8)}")
                subprocess.run([sys.executable, str(HERE / "make_q8_0.py"), str(model), str(q8)], check=True)
            models.append(("Q8_0", q8))
        for tag, path in models:
            m = bench_model(tag, path, prompts, args, results)
            med_models[tag] = (path, m)
            for key, label in (("prefill512", "prefill, 512-token prompt"), ("prefill2048", "prefill, 2048-token prompt"),
                               ("decode128", "decode at context 128"), ("decode2048", "decode at context 2048")):
                a, b = m["potserve"][key], m["llama"][key]
                rows.append((f"{tag}: {label} (tok/s)", fmt(a), fmt(b), ratio(a, b)))
                chart.append((f"{tag} {label.replace(', ', ' ').replace('-token prompt', '')}", a / b if b else 0))
            chk = results["models"][tag]["greedy_check"]
            same = next((i for i, (x, y) in enumerate(zip(chk["potserve"], chk["llama"])) if x != y),
                        min(len(chk["potserve"]), len(chk["llama"])))
            chk["same_leading_tokens"] = same
            chk["potserve_text"] = vocab.detokenize(chk["potserve"]).decode("utf-8", "replace")
            chk["llama_text"] = vocab.detokenize(chk["llama"]).decode("utf-8", "replace")
        if args.omp_check:
            rates = omp_check(model, prompts[128], args, results)
            ok = [r for r in rates if r is not None]
            base = med_models["Q4_1"][1]["llama"]["decode128"]
            notes.append(f"llama.cpp with its default OpenMP wait policy (threads spin at barriers), Q4_1 decode at "
                         f"context 128: runs {', '.join(fmt(r) if r is not None else f'>{args.omp_timeout} s (stopped)' for r in rates)} "
                         f"tok/s (median {fmt(med(ok))}) against {fmt(base)} tok/s with OMP_WAIT_POLICY=PASSIVE.")
    # 3
    doc = None
    if "3" not in skip:
        doc = bench_document(model, docs, ids, args, results)
        k = f"{args.doc_tokens // 1024}K"
        rows.append((f"{k} document: potserve ingest (pot {args.budget}) vs llama.cpp full prefill "
                     f"(n_ctx {max(args.doc_tokens, 512)}) (tok/s)", fmt(doc["potserve_tps"]), fmt(doc["llama_tps"]),
                     ratio(doc["potserve_tps"], doc["llama_tps"])))
        chart.append((f"{k} doc ingest vs prefill", doc["potserve_tps"] / doc["llama_tps"]))
        rows.append((f"{k} document: peak RSS (MB; llama.cpp's includes {doc['llama_base_rss'] / 1e6:.0f} MB of Python "
                     "and libraries before the model)", fmt(doc["potserve_rss"] / 1e6, 0), fmt(doc["llama_rss"] / 1e6, 0),
                     ratio(doc["potserve_rss"], doc["llama_rss"])))
        rows.append((f"{k} document: compressions / share of ingest time compressing", 
                     f"{doc['compressions']:.0f} / {100 * doc['compress_share']:.1f}%", "—", "—"))
    # 4
    if "4" not in skip:
        lg = bench_long(model, docs, args, results, doc)
        sizes = [args.doc_tokens] + args.long_docs
        base = lg[args.doc_tokens]
        for n in sizes:
            r = lg[n]
            rows.append((f"potserve ingest, {n // 1024}K-token document, pot {args.long_budget}: tok/s, tok per CPU-s, "
                         f"peak RSS ({r['runs']} run{'s' if r['runs'] > 1 else ''})",
                         f"{fmt(r['tps'])}, {fmt(r['tpc'])}, {fmt(r['rss'] / 1e6, 0)} MB", "—",
                         "—" if n == args.doc_tokens else f"vs {args.doc_tokens // 1024}K: speed {r['tps'] / base['tps']:.2f}x, "
                         f"per CPU-s {r['tpc'] / base['tpc']:.2f}x, RSS {100 * (r['rss'] / base['rss'] - 1):+.1f}%"))
        last = sizes[-1]
        chart.append((f"ingest {last // 1024}K / {args.doc_tokens // 1024}K", lg[last]["tps"] / base["tps"]))
    # 5
    batch = None
    if "5" not in skip and args.batch != "skip":
        batch = bench_batch(model, vocab, args, results)
        p1, l1 = batch["potserve"].get(1), batch["llama"].get(1)
        for n in (1, 4, 8, 16):
            a, b = batch["potserve"].get(n), batch["llama"].get(n)
            rows.append((f"Q4_1: aggregate decode, {n} sequence{'s' if n > 1 else ''} (tok/s; in brackets: vs 1 stream)",
                         f"{fmt(a)} ({ratio(a, p1)})", f"{fmt(b)} ({ratio(b, l1)})", ratio(a, b)))
            chart.append((f"batch {n} seqs", a / b if a and b else 0))
    # 6
    bw = None
    if "6" not in skip:
        log("memory bandwidth")
        bw = membw(args.threads)
        read = max(bw[t]["vread_gbs"] for t in bw if isinstance(t, int))
        results["membw"] = {str(k): v for k, v in bw.items()}
        rows.append(("memory bandwidth: best streaming read of 256 MB (GB/s; table below)", fmt(read), "", ""))
        for tag, (path, m) in med_models.items():
            sh = model_shape(path)
            for ctx, key in ((128, "decode128"), (2048, "decode2048")):
                avg_ctx = ctx + args.decode_tokens / 2
                kv = sh["n_layer"] * 2 * sh["n_head_kv"] * sh["head_dim"] * avg_ctx * 2
                per_tok = sh["weight_bytes"] + kv
                bound = read * 1e9 / per_tok
                a, b = m["potserve"][key], m["llama"][key]
                rows.append((f"{tag}: decode at context {ctx}, % of the bandwidth bound ({per_tok / 1e6:.1f} MB a token "
                             f"= {sh['weight_bytes'] / 1e6:.1f} weights + {kv / 1e6:.1f} KV; bound {bound:.0f} tok/s)",
                             f"{100 * a / bound:.0f}%", f"{100 * b / bound:.0f}%", ratio(a, b)))
                results.setdefault("bound", {})[f"{tag}@{ctx}"] = {"bytes_per_token": per_tok, "bound_tps": bound,
                                                                   "weight_bytes": sh["weight_bytes"], "kv_bytes": kv}

    facts["load_end"] = os.getloadavg()
    facts["elapsed_min"] = (time.monotonic() - T0) / 60
    # --- report
    L = ["# potserve vs llama.cpp on the CPU", "",
         f"- machine: {facts['cpu']}, {facts['cpus_online']} CPUs online, L3 {facts['l3']}, {facts['memory']}, "
         f"Linux {facts['kernel']}; SIMD: {facts['simd']}",
         f"- threads: {args.threads} for both engines; date: {facts['date']}; "
         f"load average at start {', '.join(f'{x:.1f}' for x in facts['load_start'])}, "
         f"at end {', '.join(f'{x:.1f}' for x in facts['load_end'])}; took {facts['elapsed_min']:.0f} min",
         f"- potserve {facts['potserve']}; llama-cpp-python {facts['llama_cpp_python']} "
         f"(f16 KV, flash attention off, n_batch = n_ubatch = 512, "
         f"OMP_WAIT_POLICY={'PASSIVE' if args.llama_omp == 'passive' else 'unset'})",
         f"- command: `{' '.join([rel(sys.executable), 'tests/bench/bench_cpu.py', argv]).strip()}`",
         f"- model: {rel(model)}" + ("" if args.no_q8 or "12" in skip else f"; second type: {rel(args.q8)} "
                                      "(made by tests/bench/make_q8_0.py)"),
         "- " + "; ".join([x for x in (
             "12" not in skip and f"measures 1-2: medians of {args.runs} alternated A/B runs after {args.warmup} "
                                  "warm-up round(s)",
             "3" not in skip and f"measure 3: median of {args.doc_runs} alternated runs after a short warm-up",
             "4" not in skip and f"measure 4: {args.long_runs} run(s) of each document longer than "
                                 f"{args.doc_tokens // 1024}K, median of {args.doc_runs} for {args.doc_tokens // 1024}K",
             "5" not in skip and args.batch != "skip" and f"measure 5: medians of {args.batch_rounds} alternated rounds",
             f"tokenizers agree: {'yes' if agree else 'NO'}") if x]),
         "- ratio = potserve / llama.cpp (speed: above 1 = potserve faster; memory: below 1 = potserve smaller)", "",
         "| measure | potserve | llama.cpp | ratio |", "|---|---:|---:|---:|"]
    L += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    if batch:
        L += ["", f"Measure 5, potserve through {batch['how']} (last round):", "", batch["table"].rstrip()]
    if bw:
        L += ["", "Memory bandwidth (best of 10 passes over 256 MB; GB/s = 1e9 bytes/s):", "",
              "| threads | streaming read (vector loads) | read (words) | copy (read + written) |",
              "|---:|---:|---:|---:|"]
        L += [f"| {t} | {bw[t]['vread_gbs']:.1f} | {bw[t]['read_gbs']:.1f} | {bw[t]['copy_gbs']:.1f} |"
              for t in bw if isinstance(t, int)]
        if "numpy_copy_gbs" in bw:
            L += [f"| numpy copy (1) | | | {bw['numpy_copy_gbs']:.1f} |"]
        L += ["", "Bytes a decoded token reads: every weight once (the GGUF tensor data, less token_embd when the "
              "output matrix is a separate tensor; tied, the embedding is read once as the output matrix) plus the "
              "f16 KV of the context (n_layer x 2 x n_head_kv x head_dim x context x 2 bytes) at the mean context of "
              f"the {args.decode_tokens} decoded tokens; bound = the best streaming read above / those bytes (a "
              "copy's rate counts the bytes it writes too, so it is no read rate)."]
    if results["models"]:
        L += ["", "Greedy check (decode at context 128, first run): tokens both engines chose alike from the start:"]
        for tag, r in results["models"].items():
            c = r["greedy_check"]
            L += [f"- {tag}: {c['same_leading_tokens']} of {len(c['potserve'])}; potserve: "
                  f"{json.dumps(c['potserve_text'][:160])}; llama.cpp: {json.dumps(c['llama_text'][:160])}"]
    if notes:
        L += ["", "Notes:"] + [f"- {n}" for n in notes]
    md = "\n".join(L) + "\n"
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    print(md)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 0.35 * len(chart) + 1.5))
        labels = [c[0] for c in chart][::-1]
        vals = [c[1] for c in chart][::-1]
        ax.barh(labels, vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("potserve / llama.cpp (ingest rows: potserve / potserve)")
        ax.set_title(f"potserve vs llama.cpp, {args.threads} threads, {facts['date']}", fontsize=10)
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=110)
        log(f"wrote {rel(out)}, {rel(out.with_suffix('.json'))}, {rel(out.with_suffix('.png'))}")
    except ImportError:
        log(f"wrote {rel(out)}, {rel(out.with_suffix('.json'))} (no matplotlib: no chart)")


if __name__ == "__main__":
    main()
