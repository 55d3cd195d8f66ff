#!/usr/bin/env python3
"""Prefill and decode speed of potserve against llama.cpp's own llama-bench and
llama-cpp-python, per model file, side by side (not part of `make test`).

    make bench-kquant          (builds llama-bench and llama-quantize first: make llama-bench;
                                llama-cpp-python's package on those libraries: make llama-python)
    .venv/bin/python tests/bench/bench_kquant.py [--runs 5] [--threads 2] [--models A,B] [--no-python]

Models (default): SmolLM2-135M Q4_1 (the default model), Qwen2.5-Coder-1.5B
Q4_K_M (its Q4_K / Q6_K tensors) and two copies of it that llama-quantize
--allow-requantize makes from that file when missing (build/bench/): Q6_K (every
matrix Q6_K) and Q5_K_M (Q5_K with Q6_K); Q3_K_M and Q2_K copies too when --models
names them (build/bench/qwen2.5-coder-1.5b-instruct-q3_k_m.gguf, -q2_k.gguf). Requantising a Q4_K_M file does not
make a better model, but the same tensor shapes in the other formats, which is
what a speed test needs.

Per model and round, the three engines run in turn, the order rotating each
round (a warm-up round first, not counted):
  potserve       `potserve generate -v`: prefill of 512 tokens (-n 1); decode
                 of 128 tokens after a 16-token prompt (its tok/s line);
  llama-bench    `llama-bench -p 512 -n 128 -r 1` (pp512, tg128 at context 0),
                 the same thread count, its defaults otherwise (weight
                 repacking on; built without AMX, see the Makefile);
                 OMP_WAIT_POLICY=PASSIVE unless --llama-omp default;
  llama-cpp-python  tests/bench/llama_worker.py (f16 KV, n_batch 512) with the
                 same token ids as potserve (skipped with --no-python); `make
                 bench-kquant` runs it on the libraries of `make llama-bench`
                 (LLAMA_CPP_LIB_PATH, `make llama-python`); on CPUs
                 with AMX without ggml's extra buffer types (its AMX path faults
                 here, tests/reference/lcpp.py), so without weight repacking.
The tables give medians of --runs rounds and the ratios potserve / engine;
decode also as a share of the memory-bandwidth bound: the bytes a decoded token
reads (every weight matrix once; token_embd only when it is also the output
matrix, i.e. the file has no output.weight: otherwise a token reads one row of
it) at membw.c's streaming-read bandwidth with the same threads (`vread`:
vector loads; measured at the start and the end, the higher one). The copy
bandwidth is printed too; it counts bytes read and written, so it is no read
rate. The load average is printed per round: the
machine may be shared. Writes build/bench/kquant.md and kquant.json.
"""
import argparse
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import bench_text  # noqa: E402

OUTDIR = ROOT / "build" / "bench"
LLAMA_BIN = ROOT / "build" / "llama-build" / "bin"
QWEN = ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DEFAULT_MODELS = [ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf", QWEN,
                  OUTDIR / "qwen2.5-coder-1.5b-instruct-q6_k.gguf", OUTDIR / "qwen2.5-coder-1.5b-instruct-q5_k_m.gguf"]
T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def med(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def requantized(path):
    """Makes build/bench/qwen...-q6_k / -q5_k_m / -q3_k_m / -q2_k.gguf from the Q4_K_M file with llama-quantize."""
    kind = {"q6_k": "Q6_K", "q5_k_m": "Q5_K_M", "q3_k_m": "Q3_K_M", "q2_k": "Q2_K"}[path.stem.rsplit("-", 1)[1]]
    quant = LLAMA_BIN / "llama-quantize"
    if not quant.exists():
        sys.exit(f"{quant} is missing: run make llama-bench")
    log(f"making {path.name}: llama-quantize --allow-requantize {QWEN.name} {kind}")
    tmp = path.with_suffix(".tmp")
    subprocess.run([str(quant), "--allow-requantize", str(QWEN), str(tmp), kind, "2"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp.rename(path)


def decode_bytes(model):
    import bench_cpu
    import gguf
    return bench_cpu.decode_weight_bytes(gguf.GGUFReader(str(model)))


def tensor_types(model):
    import gguf
    seen = {}
    for t in gguf.GGUFReader(str(model)).tensors:
        if len(t.shape) > 1:
            seen[t.tensor_type.name] = seen.get(t.tensor_type.name, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(seen.items(), key=lambda kv: -kv[1]))


def membw(threads):
    exe = OUTDIR / "membw"
    if not exe.exists():
        subprocess.run(["make", "--no-print-directory", "-s", "build/bench/membw"], cwd=ROOT, check=True)
    p = subprocess.run([str(exe), "512", str(threads), "10"], capture_output=True, text=True, check=True)
    r = json.loads(p.stdout)
    return r["vread_gbs"], r["copy_gbs"]


def ps_tokens(binary, model, n):
    text = bench_text.document(n * 8)
    p = subprocess.run([str(binary), "tokenize", "-m", str(model), "--no-special"], input=text.encode(),
                       capture_output=True, check=True)
    ids = [int(x) for x in p.stdout.split()]
    assert len(ids) >= n, (len(ids), n)
    return ids[:n]


def ps_run(binary, model, ids, n, threads):
    import bench_cpu
    bench_cpu.BIN = binary
    r = bench_cpu.ps_generate(model, ids, n, threads)
    return r["prefill_tps"], r["decode_tps"], r["n_gen"]


def potserve(binary, model, prompt512, prompt16, args):
    pp, _, _ = ps_run(binary, model, prompt512, 1, args.threads)
    _, tg, n_gen = ps_run(binary, model, prompt16, args.decode_tokens, args.threads)
    if n_gen < args.decode_tokens:
        log(f"  note: potserve stopped after {n_gen} of {args.decode_tokens} tokens")
    return {"pp512": pp, "tg": tg}


def llama_env(args):
    """OMP_WAIT_POLICY=PASSIVE unless --llama-omp default (bench_cpu.py says why)."""
    env = dict(os.environ)
    if "amx_int8" in open("/proc/cpuinfo").read():
        env["POTSERVE_LLAMA_NO_EXTRA_BUFTS"] = "1"  # llama_worker.py: its AMX path faults here
    if args.llama_omp == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        env.pop("OMP_WAIT_POLICY", None)
    return env


def llama_bench(model, args):
    cmd = [str(LLAMA_BIN / "llama-bench"), "-m", str(model), "-t", str(args.threads), "-p", "512",
           "-n", str(args.decode_tokens), "-r", "1", "-o", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=llama_env(args))
    if p.returncode:
        raise RuntimeError(f"llama-bench failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    out = {}
    for r in json.loads(p.stdout):
        out["pp512" if r["n_prompt"] else "tg"] = float(r["avg_ts"])
    return out


def python_worker(model, args):
    from bench_cpu import LlamaWorker
    os.environ.update(llama_env(args))  # the worker inherits the AMX switch
    return LlamaWorker(model, 1024, args.threads, omp=args.llama_omp)


def python_run(w, prompt512, prompt16, args):
    pp = w.gen(prompt512, 1)["prefill_tps"]
    tg = w.gen(prompt16, args.decode_tokens)["decode_tps"]
    return {"pp512": pp, "tg": tg}


def bench_one(binary, model, args, bw):
    prompt = ps_tokens(binary, model, 512)
    prompt512, prompt16 = prompt, prompt[:16]
    engines = ["potserve", "llama-bench"] + ([] if args.no_python else ["llama-cpp-python"])
    worker = None if args.no_python else python_worker(model, args)
    runs = {e: [] for e in engines}
    try:
        for i in range(args.warmup + args.runs):
            order = engines[i % len(engines):] + engines[:i % len(engines)]
            log(f"{model.name}: {'warm-up' if i < args.warmup else f'round {i - args.warmup + 1}/{args.runs}'} "
                f"order {', '.join(order)} (load {os.getloadavg()[0]:.1f})")
            for e in order:
                if e == "potserve":
                    r = potserve(binary, model, prompt512, prompt16, args)
                elif e == "llama-bench":
                    r = llama_bench(model, args)
                else:
                    r = python_run(worker, prompt512, prompt16, args)
                r["load"] = os.getloadavg()[0]
                if i >= args.warmup:
                    runs[e].append(r)
    finally:
        if worker:
            worker.close()
    meds = {e: {k: med([r[k] for r in runs[e]]) for k in ("pp512", "tg")} for e in engines}
    wb = decode_bytes(model)
    return {"path": str(model.relative_to(ROOT)) if model.is_relative_to(ROOT) else str(model),
            "types": tensor_types(model), "decode_bytes": wb, "runs": runs, "medians": meds,
            "decode_bound_tps": bw * 1e9 / wb}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(str(m) for m in DEFAULT_MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--no-python", action="store_true", help="skip llama-cpp-python")
    ap.add_argument("--llama-omp", choices=["passive", "default"], default="passive",
                    help="OMP_WAIT_POLICY for llama.cpp: passive (sleeps at barriers, fair on a shared "
                         "machine) or default (spins: llama.cpp's faster setting on an idle one)")
    ap.add_argument("--out", default=str(OUTDIR / "kquant.md"))
    args = ap.parse_args()
    OUTDIR.mkdir(parents=True, exist_ok=True)
    if not (LLAMA_BIN / "llama-bench").exists():
        sys.exit(f"{LLAMA_BIN / 'llama-bench'} is missing: run make llama-bench")
    binary = OUTDIR / "potserve-kquant"  # a copy: a concurrent make may relink build/potserve
    subprocess.run(["cp", str(ROOT / "build" / "potserve"), str(binary)], check=True)
    models = [pathlib.Path(m).resolve() for m in args.models.split(",") if m]  # relative to the cwd; compared with OUTDIR below
    for m in models:
        if not m.exists() and m.parent == OUTDIR and m.name.startswith("qwen2.5-coder-1.5b-instruct-q"):
            requantized(m)
    (bw0, copy0) = membw(args.threads)
    log(f"membw ({args.threads} threads): read {bw0:.1f}, copy {copy0:.1f} GB/s; load {os.getloadavg()}")
    results = {"args": vars(args), "load_start": os.getloadavg(), "models": {}}
    for m in models:
        results["models"][m.name] = bench_one(binary, m, args, bw0)
    (bw1, copy1) = membw(args.threads)
    bw = max(bw0, bw1)
    results.update(membw_vread_gbs=[bw0, bw1], membw_copy_gbs=[copy0, copy1], load_end=os.getloadavg())
    engines = ["llama-bench"] + ([] if args.no_python else ["llama-cpp-python"])
    lines = [f"# potserve vs llama.cpp: prefill 512 / decode {args.decode_tokens} tokens, {args.threads} threads",
             "", f"`{' '.join(shlex.quote(a) for a in sys.argv)}`; medians of {args.runs} rounds, engines "
             f"alternated; load average {results['load_start'][0]:.1f} at the start, {results['load_end'][0]:.1f} "
             f"at the end; membw streaming read {bw0:.1f} / {bw1:.1f} GB/s, copy (read + written) {copy0:.1f} / "
             f"{copy1:.1f} GB/s (start / end); bound = the higher read rate / the bytes a decoded token reads.", "",
             "| model | tensors | measure | potserve | " + " | ".join(engines) + " | "
             + " | ".join(f"vs {e}" for e in engines) + " | % of bandwidth bound |",
             "|---|---|---|---:|" + "---:|" * (2 * len(engines) + 1)]
    for name, r in results["models"].items():
        r["decode_bound_tps"] = bw * 1e9 / r["decode_bytes"]
        for k, label in (("pp512", "prefill 512 tok/s"), ("tg", f"decode {args.decode_tokens} tok/s")):
            p = r["medians"]["potserve"][k]
            vals = [r["medians"][e][k] for e in engines]
            bound = f"{100 * p / r['decode_bound_tps']:.0f} %" if k == "tg" else ""
            lines.append(f"| {name} | {r['types']} | {label} | {p:.1f} | " + " | ".join(f"{v:.1f}" for v in vals)
                         + " | " + " | ".join(f"{p / v:.2f}x" for v in vals) + f" | {bound} |")
    pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    pathlib.Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
