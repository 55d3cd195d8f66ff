#!/usr/bin/env python3
"""Passkey retrieval through memory pots (not part of `make test`).

Builds passkey documents (a 5-digit key hidden at a relative depth inside
repetitive filler, as in the InfiniPot and FINCH evaluations), reads each one
with `potserve ingest --json` under several policies and pot budgets, and
reports exact-match accuracy and how much of the needle the pot still holds
(`--track`: share of the needle's tokens kept, over all layers and KV heads).

    .venv/bin/python tests/bench/passkey.py [--lengths 1024,4096] [--depths 0.1,0.5,0.9]
        [--policies none,infinipot,finch,streaming,truncate] [--budget 1024] [--keys 2]
        [--out build/passkey.md]

Writes a markdown table (to --out and stdout) with the command line that made it.
"""
import argparse
import json
import pathlib
import random
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = ROOT / "build" / "potserve"
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there. ")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the pass key?"


def tokens(text):
    p = subprocess.run([str(BIN), "tokenize", "-m", str(MODEL), "--no-special"], input=text.encode(),
                       capture_output=True, check=True)
    return len(p.stdout.split())


def make_doc(n_tokens, depth, key):
    """Document of about n_tokens tokens with the needle at `depth`; returns
    (text, needle token range [a, b))."""
    per = tokens(FILLER)
    reps = max(1, (n_tokens - tokens(INTRO)) // per)
    cut = int(reps * depth)
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    before = INTRO + FILLER * cut
    text = before + needle + FILLER * (reps - cut)
    a = tokens(before)
    return text, (a, a + tokens(before + needle) - a)


def run(path, policy, budget, track, extra):
    args = [str(BIN), "ingest", "-m", str(MODEL), str(path), "--policy", policy, "--budget", str(budget),
            "--question", QUESTION, "-n", "12", "--json", "--track", f"{track[0]}:{track[1]}", *extra]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--policies", default="none,infinipot,finch,streaming,truncate")
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--keys", type=int, default=2, help="random keys per cell")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "build" / "passkey.md"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lengths = [int(x) for x in a.lengths.split(",")]
    depths = [float(x) for x in a.depths.split(",")]
    policies = a.policies.split(",")
    work = ROOT / "build" / "passkey"
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for L in lengths:
        for depth in depths:
            for k in range(a.keys):
                key = rng.randint(10000, 99999)
                text, needle = make_doc(L, depth, key)
                path = work / f"doc_{L}_{depth}_{k}.txt"
                path.write_text(text)
                for policy in policies:
                    budget = L + 256 if policy == "none" else a.budget
                    if policy == "none" and budget > 8192:
                        continue  # beyond the model's window: no full-context reference
                    extra = ["--late-question"] if policy == "finch-late" else []
                    pol = "finch" if policy == "finch-late" else policy
                    t0 = time.time()
                    r = run(path, pol, budget, needle, extra)
                    rows.append({"length": L, "depth": depth, "policy": policy, "budget": budget,
                                 "hit": str(key) in r["answer"], "kept": r["tracked_kept_share"],
                                 "tps": r["ingest_tokens_per_s"], "rss": r["peak_rss_bytes"],
                                 "secs": time.time() - t0, "answer": r["answer"]})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    lines = [f"`{' '.join(sys.argv)}` — SmolLM2-135M-Instruct Q4_1, pot budget {a.budget} "
             f"(policy none: the whole document), {a.keys} keys per cell, greedy.", "",
             "| length | policy | " + " | ".join(f"acc@{d}" for d in depths) + " | needle kept | ingest tok/s | peak RSS MB |",
             "|---|---|" + "---|" * len(depths) + "---|---|---|"]
    for L in lengths:
        for policy in policies:
            cell = [r for r in rows if r["length"] == L and r["policy"] == policy]
            if not cell:
                continue
            accs = []
            for d in depths:
                c = [r for r in cell if r["depth"] == d]
                accs.append(f"{sum(r['hit'] for r in c)}/{len(c)}")
            kept = sum(r["kept"] for r in cell) / len(cell)
            tps = sorted(r["tps"] for r in cell)[len(cell) // 2]
            rss = max(r["rss"] for r in cell) / 1e6
            lines.append(f"| {L} | {policy} | " + " | ".join(accs) + f" | {kept:.2f} | {tps:.0f} | {rss:.0f} |")
    table = "\n".join(lines) + "\n"
    pathlib.Path(a.out).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
