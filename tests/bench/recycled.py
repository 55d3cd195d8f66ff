"""Recycled attention's decode speed against full attention (the Recycled
Attention paper; docs/methods.md, "Recycled attention").

For each prompt length, one prompt of English prose (tests/bench/bench_text.py)
cut to that many tokens; `potserve generate` greedily decodes 256 tokens with
full attention, with recycled attention (a full step every S, the K entries
each KV head attended to most in between, scores max-pooled over 7 slots) and
the same without pooling, interleaved run by run. Reports the median decode
tokens/s of each, its ratio to full attention, and how many generated tokens
equal full attention's before the first difference (the answer quality of
recycled attention is measured on needles by longdoc/run.py's `+ra` policies).

    .venv/bin/python tests/bench/recycled.py [--lengths 2048,4096,7936] [--runs 3]
        [--stride 16] [--keep 1024] [--threads 2] [--out build/recycled]
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
import bench_text  # noqa: E402

POTSERVE = ROOT / "build" / "potserve"


def prompt_ids(model, n):
    text = bench_text.document(n * 6)
    p = subprocess.run([str(POTSERVE), "tokenize", "-m", model, "--no-special"], input=text.encode(),
                       capture_output=True, check=True)
    ids = p.stdout.split()
    if len(ids) < n:
        raise SystemExit(f"the prose gave {len(ids)} tokens, fewer than {n}")
    return ",".join(x.decode() for x in ids[:n])


def decode(model, ids, threads, n_predict, extra):
    p = subprocess.run([str(POTSERVE), "generate", "-m", model, "--tokens", ids, "-n", str(n_predict),
                        "--print-ids", "-v", "-t", str(threads)] + extra, capture_output=True, text=True, check=True)
    m = re.search(r"generated: (\d+) tokens, ([\d.]+) tok/s", p.stderr)
    return p.stdout.split(), float(m.group(2))


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--lengths", default="2048,4096,7936")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--stride", type=int, default=16)
    ap.add_argument("--keep", type=int, default=1024)
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "build" / "recycled"))
    a = ap.parse_args()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ra = ["--recycle-stride", str(a.stride), "--recycle-keep", str(a.keep)]
    variants = {"full": [], "recycled (pool 7)": ra + ["--recycle-pool", "7"],
                "recycled (no pool)": ra + ["--recycle-pool", "1"]}
    rows = []
    for L in [int(x) for x in a.lengths.split(",")]:
        ids = prompt_ids(a.model, L)
        tps = {v: [] for v in variants}
        toks = {}
        for run in range(a.runs):
            for v, extra in variants.items():  # interleaved: drift hits every variant alike
                toks[v], t = decode(a.model, ids, a.threads, a.n_predict, extra)
                tps[v].append(t)
                print(f"{L} run {run} {v}: {t:.1f} tok/s", file=sys.stderr, flush=True)
        full = statistics.median(tps["full"])
        for v in variants:
            med = statistics.median(tps[v])
            rows.append({"prompt_tokens": L, "variant": v, "tok_s": tps[v], "median_tok_s": med,
                         "ratio": med / full, "same_prefix": common_prefix(toks[v], toks["full"]),
                         "generated": len(toks[v])})
    with open(out / "recycled.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    lines = [f"`{' '.join(sys.argv)}` (S = {a.stride}, K = {a.keep}, {a.n_predict} greedy tokens, {a.threads} "
             f"threads, {a.runs} interleaved runs)", "",
             "| prompt tokens | decoding | decode tok/s (median) | runs | vs full | tokens equal to full's |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['prompt_tokens']} | {r['variant']} | {r['median_tok_s']:.1f} | "
                     f"{', '.join(f'{x:.1f}' for x in r['tok_s'])} | {r['ratio']:.2f}x | "
                     f"{r['same_prefix']}/{r['generated']} |")
    text = "\n".join(lines) + "\n"
    (out / "recycled.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
