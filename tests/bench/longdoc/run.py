#!/usr/bin/env python3
"""Long-document evaluation: passkey retrieval through memory pots (docs/results/longdoc.md).

Builds needle-in-a-haystack documents (a 5-digit key at a relative depth in
repetitive filler or in natural English prose), runs them through
build/longdoc_bench (tests/bench/longdoc/longdoc.c), which reads each haystack
once per policy and forks the pot just before each needle for every key, and
reports exact-match accuracy with a Wilson 95 % interval, the share of the
needle's tokens still in the pot, ingest tokens/s and peak RSS, as a markdown
table and a PNG heatmap (accuracy by length x depth, one panel per policy).

    .venv/bin/python tests/bench/longdoc/run.py -m MODEL [--haystacks filler,text]
        [--lengths 2048,4096,8192,16384,32768,65536,131072] [--depths 0.1,0.5,0.9]
        [--keys 20] [--policies none,infinipot,infinipot-w1,-nuc,-nuc-cap,-nuc-cap-reset,
        finch,finch-w1,finch-late,finch-late-w1,snapkv,h2o,cascade,streaming,truncate]
        [--budgets 1024,2048,4096]
        [--threads N] [--backend cpu|cuda] [--out build/longdoc]

The defaults are the whole grid of docs/results/longdoc.md (far beyond a 2-core machine; pick
cells with the flags). Results accumulate in OUT/results.jsonl (one line per
trial); `--report` only redraws the table and heatmap from it.

Policies: the pot policies by name, `finch-late` (FINCH with the question
arriving after the document), `-w1` variants of infinipot, finch and
finch-late (no pooling: each token chosen on its own score, as in the
papers; the defaults max-pool scores over 15 slots), and InfiniPot's
ablation ladder as in the InfiniPot paper's Table 4, all without pooling:
`infinipot-w1` (the paper's full method), `-nuc` (no
novelty-under-compression), `-nuc-cap` (no NuC, and the chunk's own last
rows score instead of the catalyst), `-nuc-cap-reset` (also no context-reset
positions: entries keep their document positions). `infinipot-sym` names
the rows measured with the default up to commit c619bdb, when NuC's spans
were centred on their surprising token (now 3 slots before it, 11 after; not
runnable at this commit: check out c619bdb). A `+ra` suffix answers with
recycled attention (`none+ra`, `infinipot+ra`; `+ra-w1` without pooling).
`none`
reads the whole document without compression (the full-attention ceiling); a
length beyond the model's window is clipped to what fits, and noted.
"""
import argparse
import collections
import json
import math
import os
import pathlib
import random
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "bench"))
import bench_text  # noqa: E402  (natural prose, generated in the repo)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import corpus  # noqa: E402  (non-repetitive haystacks from Debian packages)
import tasks  # noqa: E402  (the five RULER-style tasks)

BIN = ROOT / "build" / "longdoc_bench"
POTSERVE = pathlib.Path(os.environ.get("POTSERVE_BIN", ROOT / "build" / "potserve"))  # tokenize, info, memory runs
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there. ")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
# Chosen after trying formats with policy none at 2K (docs/results/longdoc.md): the plain
# question alone makes the 135M model answer with filler at depths 0.1/0.5.
QUESTION = "What is the pass key? Answer with the number only."
# `-w1`: the papers' per-token choice (no pooling of scores; the default
# max-pools infinipot's and finch's scores over 15 slots). The ladder below
# is the InfiniPot paper's, so it is measured without pooling too.
W1 = ["--pool-width", "1"]
FACTS_CATALYST = "List every name, place, number, code and value that this section states."
ABLATIONS = {
    "infinipot-w1": ["--policy", "infinipot"] + W1,
    "-nuc": ["--policy", "infinipot", "--nuc-share", "0"] + W1,
    "-nuc-cap": ["--policy", "infinipot", "--nuc-share", "0", "--no-catalyst"] + W1,
    "-nuc-cap-reset": ["--policy", "infinipot", "--nuc-share", "0", "--no-catalyst", "--no-reset-positions"] + W1,
    "finch-w1": ["--policy", "finch"] + W1,
    "finch-late": ["--policy", "finch", "--late-question"],
    "finch-late-w1": ["--policy", "finch", "--late-question"] + W1,
    # question-agnostic candidates of issue 22: a catalyst asking for the
    # kind of facts questions ask about (names, places, numbers, codes), and
    # the default's NuC/CaP mix moved towards CaP or NuC
    "infinipot-facts": ["--policy", "infinipot", "--catalyst", FACTS_CATALYST],
    # two catalysts at once: the default's request and the facts one (their rows' attention summed)
    "infinipot-cat2": ["--policy", "infinipot", "--catalyst",
                       "Summarize the critical points highlighted in this section. " + FACTS_CATALYST],
    "infinipot-nuc0.25": ["--policy", "infinipot", "--nuc-share", "0.25"],
    "infinipot-nuc0.75": ["--policy", "infinipot", "--nuc-share", "0.75"],
    "infinipot-nuc0": ["--policy", "infinipot", "--nuc-share", "0"],
    # score memory: an entry's CaP score is the best any compression gave it;
    # shared: every layer and head keeps the same entries (scores summed)
    "infinipot-mem": ["--policy", "infinipot", "--score-memory", "1"],
    "infinipot-shared": ["--policy", "infinipot", "--shared-selection", "1"],
    "infinipot-rel": ["--policy", "infinipot", "--nuc-relative", "1"],
    "infinipot-kvzip": ["--policy", "infinipot", "--reconstruct", "1"],
    "infinipot-kvzip-nuc0": ["--policy", "infinipot", "--reconstruct", "1", "--nuc-share", "0"],
    # KVzip's own combination: each entry's max over the repeating rows and the group's heads
    "infinipot-kvzipmax-nuc0": ["--policy", "infinipot", "--reconstruct", "1", "--row-max", "1", "--score-max", "1",
                                "--nuc-share", "0"],
    "infinipot-regions16": ["--policy", "infinipot", "--nuc-regions", "16"],
    "infinipot-w7": ["--policy", "infinipot", "--pool-width", "7"],
    "infinipot-shared-mem": ["--policy", "infinipot", "--shared-selection", "1", "--score-memory", "1"],
    # KeyDiff's key-distinctiveness score in CaP's place (with NuC), and alone
    "infinipot-keydiff": ["--policy", "infinipot", "--key-diff", "1"],
    "infinipot-keydiff-nuc0": ["--policy", "infinipot", "--key-diff", "1", "--nuc-share", "0"],
    # SnapKV's observation rows (the chunk's last 32) scoring with the catalyst
    "infinipot-observe": ["--policy", "infinipot", "--observe-rows", "1"],
    # the default pot, each question asked with the passages that share its
    # words (the server's "recall", at its default recall_bytes)
    "infinipot-recall": ["--policy", "infinipot", "--recall", "4096"],
    # the same passages, the best nearest the question (a chain from its start)
    "infinipot-recall-bestlast": ["--policy", "infinipot", "--recall", "4096", "--recall-order", "best-last"],
    # a re-read's question-guided pot (FINCH with the question) asked with the same passages
    "finch-recall-bestlast": ["--policy", "finch", "--recall", "4096", "--recall-order", "best-last"],
    # whole words: a word or number is kept or dropped whole, never cut (a 7-digit code that
    # loses its last digit answers wrong)
    "finch-words": ["--policy", "finch", "--whole-words", "1"],
    "finch-words-recall-bestlast": ["--policy", "finch", "--whole-words", "1", "--recall", "4096",
                                    "--recall-order", "best-last"],
    "infinipot-words": ["--policy", "infinipot", "--whole-words", "1"],
    # the question-guided pot with one choice for every layer and head (the question's scores
    # summed over them), so a sentence the question points at is whole in every head, not kept
    # in fragments that differ per head
    "finch-words-shared": ["--policy", "finch", "--whole-words", "1", "--shared-selection", "1"],
    # FINCH scored by each entry's sharpest question row (max over the rows, not their sum),
    # and also by the group's sharpest head: a question's key word against its instructions
    "finch-rowmax": ["--policy", "finch", "--row-max", "1"],
    "finch-max": ["--policy", "finch", "--row-max", "1", "--score-max", "1"],
}
# --also-without-recall: a recall policy's rows answered over the same pot without
# the passages, recorded under the policy without recall (finch-recall-bestlast -> finch)
WITHOUT_RECALL = {p: p.split("-recall")[0] for p, args in ABLATIONS.items() if "--recall" in args}
# A `+ra` suffix (e.g. `none+ra`, `infinipot+ra`) answers with recycled
# attention (the Recycled Attention paper): a full step every 16, the 1024 entries each KV head
# attended to most in between, scores max-pooled over 7 slots (`+ra-w1`: not
# pooled), the configuration of docs/methods.md, "Recycled attention".
RECYCLED = {"": [],
            "ra": ["--recycle-stride", "16", "--recycle-keep", "1024"],
            "ra-w1": ["--recycle-stride", "16", "--recycle-keep", "1024", "--recycle-pool", "1"]}
N_CTX_MARGIN = 256  # policy none: room for the template, the needle and the question


def n_tokens(model, text):
    p = subprocess.run([str(POTSERVE), "tokenize", "-m", str(model), "--no-special"], input=text.encode(),
                       capture_output=True, check=True)
    return len(p.stdout.split())


def n_ctx(model):
    p = subprocess.run([str(POTSERVE), "info", "-m", str(model)], capture_output=True, text=True, check=True)
    for line in p.stdout.splitlines():
        if line.startswith("context length"):
            digits = "".join(c for c in line.split(":")[-1] if c.isdigit())
            if digits:
                return int(digits)
    return 8192


class Haystack:
    """The haystack as units (the intro, then filler sentences or prose
    paragraphs) with cumulative byte offsets and token counts, so a document
    of L tokens with the needle at depth d is cut at unit boundaries."""

    def __init__(self, model, kind, max_tokens):
        if kind == "filler":
            unit_texts, seps = [FILLER], ""
        else:
            unit_texts, seps = bench_text.PARAGRAPHS, "\n\n"
        # a unit's cost in the middle of the haystack: BPE merges across unit
        # boundaries (the filler alone is 25 tokens, 24 each when repeated)
        lead = unit_texts[0] + seps
        base = n_tokens(model, lead)
        cost = {t: n_tokens(model, lead + t + seps) - base for t in unit_texts}
        intro = INTRO + seps
        self.units = [intro]
        toks = [n_tokens(model, intro)]
        total = toks[0]
        rng = random.Random(0)
        while total < max_tokens + 1024:
            order = list(range(len(unit_texts)))
            if kind == "text":
                rng.shuffle(order)
            for i in order:
                self.units.append(unit_texts[i] + seps)
                toks.append(cost[unit_texts[i]])
                total += toks[-1]
        self.text = "".join(self.units)
        self.cum_tok, self.cum_byte = [0], [0]
        for u, t in zip(self.units, toks):
            self.cum_tok.append(self.cum_tok[-1] + t)
            self.cum_byte.append(self.cum_byte[-1] + len(u.encode()))

    def boundary(self, tokens):
        """Index of the first unit boundary at or after `tokens`."""
        lo, hi = 0, len(self.cum_tok) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.cum_tok[mid] >= tokens:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def cut(self, length, depth):
        """(insert byte, end byte, haystack tokens) for a document of about
        `length` tokens with the needle at `depth`; the needle never goes
        before the intro."""
        end = self.boundary(length)
        ins = max(1, min(end, self.boundary(depth * length)))
        return self.cum_byte[ins], self.cum_byte[end], self.cum_tok[end]


def exact_match(answer, key):
    """The answer's first number is the key: exact match, so an answer that
    repeats a digit ("261099" for 26109) or stops short ("4380") misses."""
    m = re.search(r"\d+", answer)
    return m is not None and m.group() == str(key)


def key_for(seed, haystack, length, depth, k):
    """The same keys for every policy, so cells differ only by policy."""
    return random.Random(f"{seed}:{haystack}:{length}:{depth}:{k}").randint(10000, 99999)


def uncompressed(policy):
    """`none` and its decoding variants (`none+ra`): the pot is the document."""
    return policy.partition("+")[0] == "none"


def run_cell(a, hay, kind, policy, budget, lengths, depths, work, done=frozenset()):
    """All trials of one (haystack, policy, budget) in one longdoc_bench run,
    less those already in `done` (cell_key + trial), so a grid resumes.
    Yields each trial's row as the bench reports it, so that an interrupted
    run keeps the trials it finished."""
    plan = []
    for L in lengths:
        for d in depths:
            ins, end, toks = hay.cut(L, d)
            for k in range(a.keys):
                if (kind, policy, budget, L, d, k) in done:
                    continue
                key = key_for(a.seed, kind, L, d, k)
                plan.append((ins, end, f"{L}:{d}:{k}:{toks}", key))
    plan.sort()
    if not plan:
        return
    work.mkdir(parents=True, exist_ok=True)
    hay_path, plan_path = work / f"haystack_{kind}.txt", work / "plan.tsv"
    if not hay_path.exists() or hay_path.read_text() != hay.text:
        hay_path.write_text(hay.text)
    plan_path.write_text("".join(f"{tid}\t{i}\t{e}\t{key}\t{NEEDLE.format(key=key)}\n"
                                 for i, e, tid, key in plan))
    args = [a.bin, "-m", str(a.model), "-t", str(a.threads), "--backend", a.backend, "--haystack", str(hay_path),
            "--plan", str(plan_path), "--work", str(work), "--question", a.question, "--budget", str(budget),
            "-n", "12"]
    keep = a.keep if a.keep else budget // 2
    base, _, decoding = policy.partition("+")
    if not uncompressed(base):
        args += ["--keep", str(keep)]
    args += ABLATIONS.get(base, ["--policy", base]) + RECYCLED[decoding]
    t0, n = time.time(), 0
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as p:
        for line in p.stdout:
            r = json.loads(line)
            L, d, k, toks = r["id"].split(":")
            r.update(hit=exact_match(r["answer"], r["key"]),
                     haystack=kind, policy=policy, budget=budget, keep=budget if uncompressed(base) else keep,
                     length=int(L), depth=float(d), trial=int(k), doc_tokens=int(toks),
                     tps=r["tokens_read"] / (r["ingest_ms"] / 1e3 + 1e-9), model=pathlib.Path(a.model).name)
            n += 1
            print(json.dumps({x: r[x] for x in ("haystack", "policy", "budget", "length", "depth", "key",
                                                "hit", "kept", "answer")}), file=sys.stderr, flush=True)
            yield r
    if p.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode})")
    print(f"cell {kind} {policy} {budget}: {n} trials in {time.time() - t0:.0f} s", file=sys.stderr)


def wilson(k, n, z=1.96):
    if n == 0:
        return 0.0, 0.0
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, c - h), min(1.0, c + h)


def fmt_acc(cell):
    k, n = sum(r["hit"] for r in cell), len(cell)
    lo, hi = wilson(k, n)
    return f"{k}/{n} ({100 * k / n:.0f} %, {100 * lo:.0f}–{100 * hi:.0f})" if n else "–"


def cell_key(r):
    return (r["haystack"], r["policy"], r["budget"], r["length"])


def report(rows, out, cmdline):
    depths = sorted({r["depth"] for r in rows})
    lines = [f"`{cmdline}`", "",
             "Exact match (the first number of a greedy 12-token answer is the key): hits/trials (accuracy, Wilson 95 % "
             "interval). needle kept: share of the needle's tokens in the pot at question time, over all "
             "layers and KV heads. tok/s: median ingest speed. RSS: the bench process's peak (model + two "
             "pots). policy none: no compression, pot = the document (lengths beyond the window clipped to "
             "fit: doc tokens).", "",
             "| haystack | policy | budget | length | doc tokens | " + " | ".join(f"depth {d}" for d in depths)
             + " | all depths | needle kept | tok/s | peak RSS MB |",
             "|---|---|---|---|---|" + "---|" * len(depths) + "---|---|---|---|"]
    for key in sorted({cell_key(r) for r in rows}, key=lambda x: (x[0], x[3], x[1], x[2])):
        cell = [r for r in rows if cell_key(r) == key]
        accs = [fmt_acc([r for r in cell if r["depth"] == d]) for d in depths]
        kept = sum(r["kept"] for r in cell) / len(cell)
        # trials recovered from an interrupted run's log have no speed or RSS
        timed = [r for r in cell if "tps" in r]
        tps = sorted(r["tps"] for r in timed)[len(timed) // 2]
        rss = max(r["peak_rss_bytes"] for r in timed) / 1e6
        toks = max(r["doc_tokens"] for r in cell)
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {toks} | " + " | ".join(accs)
                     + f" | {fmt_acc(cell)} | {kept:.2f} | {tps:.0f} | {rss:.0f} |")
    table = "\n".join(lines) + "\n"
    (out / "results.md").write_text(table)
    heatmap(rows, out / "heatmap.png")
    return table


def pyplot():
    """matplotlib's pyplot drawing to files, or None (no charts) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("matplotlib missing: no heatmap", file=sys.stderr)
        return None


def heatmap(rows, path):
    plt = pyplot()
    if plt is None:
        return
    def panel(r):  # policy none: one panel whatever the (per-length) budget
        return (r["haystack"], r["policy"], 0 if uncompressed(r["policy"]) else r["budget"])

    order = ["none", "none+ra", "none+ra-w1", "infinipot", "infinipot+ra", "infinipot+ra-w1", "infinipot-sym",
             "infinipot-w1", "-nuc", "-nuc-cap", "-nuc-cap-reset", "finch", "finch-w1",
             "finch-late", "finch-late-w1", "snapkv", "h2o", "cascade", "streaming", "truncate"]
    panels = sorted({panel(r) for r in rows},
                    key=lambda x: (x[0], order.index(x[1]) if x[1] in order else len(order), x[1], x[2]))
    cols = min(4, len(panels))
    nrow = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrow, cols, figsize=(3.6 * cols, 2.8 * nrow), squeeze=False)
    for ax, (hk, pol, bud) in zip(axes.flat, panels):
        cell = [r for r in rows if panel(r) == (hk, pol, bud)]
        Ls, ds = sorted({r["length"] for r in cell}), sorted({r["depth"] for r in cell})
        grid = [[float("nan")] * len(Ls) for _ in ds]
        for i, d in enumerate(ds):
            for j, L in enumerate(Ls):
                c = [r for r in cell if r["depth"] == d and r["length"] == L]
                if c:
                    grid[i][j] = sum(r["hit"] for r in c) / len(c)
                    ax.text(j, i, f"{sum(r['hit'] for r in c)}/{len(c)}", ha="center", va="center", fontsize=7)
        ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(Ls)), [f"{L // 1024}K" for L in Ls], fontsize=7)
        ax.set_yticks(range(len(ds)), [str(d) for d in ds], fontsize=7)
        ax.set_title(f"{pol} |M|={'document' if uncompressed(pol) else bud} ({hk})", fontsize=8)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.supxlabel("document length (tokens)", fontsize=8)
    fig.supylabel("needle depth", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def memory_runs(a, out):
    """Peak RSS, ingest tokens/s and compression share of single documents
    (needle at depth 0.5, filler) read by `potserve ingest` at each length:
    one process per document, so RSS is the model plus one pot."""
    lengths = [int(x) for x in a.memory.split(",")]
    hay = Haystack(a.model, "filler", max(lengths))
    path = out / "work" / "memory_doc.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for L in lengths:
        ins, end, toks = hay.cut(L, 0.5)
        key = key_for(a.seed, "memory", L, 0.5, 0)
        needle = NEEDLE.format(key=key)
        hb = hay.text.encode()
        path.write_bytes(hb[:ins] + needle.encode() + hb[ins:end])
        budget = int(a.budgets.split(",")[0])
        pre = n_tokens(a.model, hb[:ins].decode())  # the needle's token range, for --track
        track = f"{pre}:{pre + n_tokens(a.model, needle)}"
        args = [str(POTSERVE), "ingest", "-m", str(a.model), str(path), "-t", str(a.threads), "--backend",
                a.backend, "--budget", str(budget), "--question", a.question, "-n", "12", "--json", "--track", track]
        t0 = time.time()
        r = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
        r.update(length=L, doc_tokens=toks, key=key, hit=exact_match(r["answer"], key), wall_s=time.time() - t0)
        print(json.dumps(r), file=sys.stderr, flush=True)
        append(out / "memory.jsonl", [r])
        rows.append(r)
    return rows


def showcase(a, out, length):
    """One document of `length` tokens (filler, needle at depth 0.5) through
    a pot by `potserve ingest --progress`: its time, its RSS curve (sampled
    every 16K tokens read) and whether the key is found; showcase.md,
    showcase.jsonl and showcase.png in OUT."""
    hay = Haystack(a.model, "filler", length)
    ins, end, toks = hay.cut(length, 0.5)
    key = key_for(a.seed, "showcase", length, 0.5, 0)
    path = out / "work" / "showcase_doc.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    hb = hay.text.encode()
    path.write_bytes(hb[:ins] + NEEDLE.format(key=key).encode() + hb[ins:end])
    budget = int(a.budgets.split(",")[0])
    args = [str(POTSERVE), "ingest", "-m", str(a.model), str(path), "-t", str(a.threads), "--backend", a.backend,
            "--budget", str(budget),
            "--question", a.question, "-n", "12", "--json", "--progress", "16384"]
    curve, t0 = [], time.time()
    log = open(out / "showcase.jsonl", "w")
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        for line in p.stderr:  # progress lines while it reads
            if line.startswith("{"):
                curve.append(json.loads(line))
                log.write(line)
                log.flush()
        result = json.loads(p.stdout.read())
    if p.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode})")
    result.update(length=length, doc_tokens=toks, key=key, hit=exact_match(result["answer"], key),
                  wall_s=time.time() - t0, final=True)
    log.write(json.dumps(result) + "\n")
    log.close()
    rss = [c["rss_bytes"] / 1e6 for c in curve]
    first = next((c for c in curve if c["tokens_read"] >= 8192), curve[0])
    text = "\n".join([
        f"`{' '.join(sys.argv)}`", "",
        f"{result['tokens_read']:,} tokens ({result['bytes_read'] / 1e6:.1f} MB of text) through a "
        f"{budget}-entry pot ({result['policy']}, keep {result['keep_tokens']}, {a.threads} thread(s)): "
        f"{result['wall_s'] / 60:.1f} min, {result['ingest_tokens_per_s']:.1f} tokens/s, "
        f"{result['compressions']:,} compressions ({100 * result['compress_share']:.2f} % of ingest time); "
        f"key {key} {'found' if result['hit'] else 'NOT found'} (answer: {result['answer']!r}).", "",
        f"Resident memory while reading (sampled every 16K tokens): {min(rss):.1f}-{max(rss):.1f} MB; "
        f"{rss[0]:.1f} MB at {curve[0]['tokens_read']:,} tokens, {rss[-1]:.1f} MB at "
        f"{curve[-1]['tokens_read']:,} ({100 * (rss[-1] / (first['rss_bytes'] / 1e6) - 1):+.1f} % from "
        f"{first['tokens_read']:,} tokens); peak RSS {result['peak_rss_bytes'] / 1e6:.1f} MB; "
        f"pot {result['pot_bytes'] / 1e6:.1f} MB.", ""])
    (out / "showcase.md").write_text(text)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3))
        xs = [c["tokens_read"] / 1e3 for c in curve]
        ax.plot(xs, rss, label="resident memory (MB)")
        ax.set_ylim(0, max(rss) * 1.3)
        ax.set_xlabel("document tokens read (thousands)")
        ax.set_ylabel("MB")
        ax2 = ax.twinx()
        tps = [(b["tokens_read"] - a_["tokens_read"]) / max(1e-9, b["seconds"] - a_["seconds"])
               for a_, b in zip(curve, curve[1:])]
        ax2.plot(xs[1:], tps, color="tab:orange", label="tokens/s")
        ax2.set_ylim(0, max(tps + [1]) * 1.3)
        ax2.set_ylabel("tokens/s")
        fig.legend(loc="lower right", fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "showcase.png", dpi=110)
    except ImportError:
        print("matplotlib missing: no chart", file=sys.stderr)
    return text


def memory_report(out, cmdline):
    path = out / "memory.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    lines = [f"`{cmdline}`", "",
             "| length | doc tokens | policy | budget | ingest tok/s | compress share | peak RSS MB | pot MB "
             "| needle kept | key found |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['length']} | {r['tokens_read']} | {r['policy']} | {r['budget_tokens']} | "
                     f"{r['ingest_tokens_per_s']:.1f} | {100 * r['compress_share']:.2f} % | "
                     f"{r['peak_rss_bytes'] / 1e6:.1f} | {r['pot_bytes'] / 1e6:.1f} | "
                     f"{r.get('tracked_kept_share', -1):.2f} | {'yes' if r['hit'] else 'no'} |")
    text = "\n".join(lines) + "\n"
    (out / "memory.md").write_text(text)
    return text


# ---- --tasks: five tasks over non-repetitive natural haystacks (issue 22) ----------------

def tokens_per_byte(a, split, out):
    """Tokens per byte of the split's text for this model (one tokenize call
    over 64 KB of it), cached in OUT/calibration.json."""
    path = out / "calibration.json"
    cal = json.loads(path.read_text()) if path.exists() else {}
    key = f"{pathlib.Path(a.model).name}:{split}"
    if key not in cal:
        sample = "\n\n".join(corpus.shuffled(corpus.load_units(), split, 0))[:65536]
        sample = sample.encode()[:65536].decode(errors="ignore")
        cal[key] = n_tokens(a.model, sample) / len(sample.encode())
        path.write_text(json.dumps(cal, indent=1))
    return cal[key]


def task_docs(a, split, length, units, tpb, work, limit=None):
    """The documents of one (split, length): trials x 3 rotations, written to
    work/; [(doc id, path, tasks, needles)]. limit: the most tokens a document
    may have (policy none within the window): documents are built to the
    estimate and shrunk until a tokenize call says they fit."""
    docs = []
    rotations = [int(x) for x in a.rotations.split(",")] if a.rotations else range(len(tasks.DEPTHS))
    for k in range(a.from_trial, a.trials):
        for rot in rotations:
            plan = tasks.document_plan(a.seed, split, length, k, rot)
            paras = corpus.shuffled(units, split, f"{a.seed}:{k}:{rot}")
            target = length if limit is None else min(length, limit)
            while True:
                text, needles = tasks.build_document(paras, tpb, target, plan, rot, hint=a.hint)
                if limit is None or n_tokens(a.model, text) <= limit:
                    break
                target = int(target * 0.97)
            path = work / f"doc_{split}_{length}_{k}_{rot}.txt"
            tmp = path.with_suffix(f".{os.getpid()}.tmp")  # renamed into place, as the plan below
            tmp.write_text(text)
            os.replace(tmp, path)
            docs.append((f"{split}:{length}:{k}:{rot}", path, plan, needles))
    return docs


def run_task_cell(a, split, policy, budget, length, docs, done):
    """One longdoc_bench --docs run over the documents not in `done`; yields
    one row per question as the bench answers it."""
    pending = [d for d in docs if d[0] not in done]
    if not pending:
        return
    work = pathlib.Path(a.out) / "work"
    plan_path = work / "docs.jsonl"
    # written aside and renamed into place: a bench still reading the plan of another run in the
    # same folder keeps its own file (an overwrite in place cut one short)
    tmp = plan_path.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        for did, path, plan, needles in pending:
            flat = sorted(list(r) for t in needles for r in t)  # the bench reads them in document order
            f.write(json.dumps({"id": did, "doc": str(path), "needles": flat,
                                "questions": [t["question"] if t["kind"] in a.ask.split(",") else ""
                                              for t in plan]}) + "\n")
    os.replace(tmp, plan_path)
    by_id = {d[0]: d for d in pending}
    base, _, decoding = policy.partition("+")
    keep = budget if uncompressed(base) else (a.keep or budget // 2)
    args = [a.bin, "-m", str(a.model), "-t", str(a.threads), "--backend", a.backend, "--docs", str(plan_path),
            "--budget", str(budget), "-n", str(a.answer_tokens)]
    if not uncompressed(base):
        args += ["--keep", str(keep)]
    args += ABLATIONS.get(base, ["--policy", base]) + RECYCLED[decoding]
    if a.also_without_recall and base in WITHOUT_RECALL and not decoding:
        args += ["--also-without-recall"]
    if a.pots:
        pots = pathlib.Path(a.pots) / pathlib.Path(a.model).stem
        pots.mkdir(parents=True, exist_ok=True)
        args += ["--pots", str(pots)]
    t0 = time.time()
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as p:
        for line in p.stdout:
            r = json.loads(line)
            did, path, plan, needles = by_id[r["id"]]
            _, L, k, rot = r["id"].split(":")
            task = plan[r["q"]]
            first = sorted(x for t in needles for x in t).index(needles[r["q"]][0])  # the answer's needle
            r.update(split=split, policy=WITHOUT_RECALL[base] if r.pop("without_recall", False) else policy,
                     budget=budget, keep=keep, length=length, trial=int(k),
                     rotation=int(rot), task=task["kind"], depth=tasks.depth_of(r["q"], int(rot)),
                     expected=task["answer"], hit=tasks.score(task, r["answer"]),
                     kept_needle=r["kept"][first], kept_layers_needle=r["kept_layers"][first],
                     doc_tokens=r["tokens_read"], model=pathlib.Path(a.model).name,
                     tps=r["tokens_read"] / (r["ingest_ms"] / 1e3 + 1e-9))
            del r["kept_layers"]
            print(json.dumps({x: r[x] for x in ("split", "policy", "length", "task", "depth", "expected", "hit",
                                                "kept_needle", "answer")}), file=sys.stderr, flush=True)
            yield r
    if p.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode})")
    print(f"cell {split} {policy} {budget} {length}: {len(pending)} documents in {time.time() - t0:.0f} s",
          file=sys.stderr)


def run_tasks(a, out):
    results = out / "tasks.jsonl"
    old = [json.loads(x) for x in results.read_text().splitlines() if x.strip()] if results.exists() else []
    model = pathlib.Path(a.model).name
    lengths = [int(x) for x in a.lengths.split(",")]
    ctx = n_ctx(a.model)
    units = corpus.load_units()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    for split in a.splits.split(","):
        tpb = tokens_per_byte(a, split, out)
        for policy in a.policies.split(","):
            for L in lengths:
                full = uncompressed(policy)
                if full and L > ctx:
                    print(f"skip {policy} at {L}: beyond the {ctx}-token window", file=sys.stderr)
                    continue
                limit = ctx - 2 * N_CTX_MARGIN if full else None
                for budget in ([ctx - 32] if full else [int(x) for x in a.budgets.split(",")]):
                    # a document is done when every question asked now has its row (an
                    # interrupted run may have answered only some)
                    asked = collections.Counter(f"{r['split']}:{r['length']}:{r['trial']}:{r['rotation']}"
                                                for r in old if r["task"] in a.ask.split(",") and
                                                (r["model"], r["split"], r["policy"], r["budget"], r["length"])
                                                == (model, split, policy, budget, L))
                    done = {d for d, n in asked.items() if n >= len(a.ask.split(","))}
                    docs = task_docs(a, split, L, units, tpb, work, limit)
                    for r in run_task_cell(a, split, policy, budget, L, docs, done):
                        append(results, [r])
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()] if results.exists() else []
    return tasks_report(rows, out, " ".join(sys.argv))


def tasks_report(rows, out, cmdline):
    """tasks.md: per (model, split, policy, budget, length) the accuracy of
    each task and each depth, their average, the needle's kept share and
    its per-layer profile; tasks.png: accuracy by length x depth."""
    def k(r):
        return (r["model"], r["split"], r["policy"], 0 if uncompressed(r["policy"]) else r["budget"], r["length"])
    # a document re-run after an interruption answers its questions again: the last row counts
    rows = list({(k(r), r["trial"], r["rotation"], r["task"]): r for r in rows}.values())
    lines = [f"`{cmdline}`", "",
             "Exact match over non-repetitive natural text (tests/bench/longdoc/corpus.py, tasks.py): "
             "hits/questions (accuracy, Wilson 95 % interval). Each document carries all five tasks' needles "
             "and is asked the five questions over one prefilled pot (finch: one pass per question, "
             "the same pot a re-read builds). kept: share of the answer's first needle in the pot over all "
             "layers and KV heads; kept all: the same averaged over every needle of the document (all tasks); low layers: how many layers hold less than a tenth of it (on average over the "
             "cell). tok/s: median ingest speed (a shared 2-core machine: compare only within one run). "
             "compress share: median share of ingest time spent selecting and compacting. peak RSS: the "
             "bench process (model + one pot). cut misses: misses whose answer the answer-token limit "
             "(--answer-tokens) stopped, not the model (– where the rows predate the field).", "",
             "| model | split | policy | budget | length | doc tokens | " + " | ".join(tasks.TASKS)
             + " | " + " | ".join(f"depth {d}" for d in tasks.DEPTHS) + " | all | kept | kept all | low layers | tok/s | compress share | peak RSS MB | cut misses |",
             "|---|---|---|---|---|---|" + "---|" * (len(tasks.TASKS) + len(tasks.DEPTHS)) + "---|---|---|---|---|---|---|---|"]
    for key in sorted({k(r) for r in rows}, key=lambda x: (x[0], x[1], x[4], x[2], x[3])):
        cell = [r for r in rows if k(r) == key]
        per_task = [fmt_acc([r for r in cell if r["task"] == t]) for t in tasks.TASKS]
        per_depth = [fmt_acc([r for r in cell if r["depth"] == d]) for d in tasks.DEPTHS]
        kept = sum(r["kept_needle"] for r in cell) / len(cell)
        kept_all = sum(sum(r["kept"]) / max(len(r["kept"]), 1) for r in cell) / len(cell)
        n_layer = len(cell[0]["kept_layers_needle"])
        prof = [sum(r["kept_layers_needle"][l] for r in cell) / len(cell) for l in range(n_layer)]
        low = f"{sum(v < 0.1 for v in prof)}/{n_layer}"
        tps = sorted(r["tps"] for r in cell)[len(cell) // 2]
        toks = max(r["doc_tokens"] for r in cell)
        share = sorted(r["compress_ms"] / max(r["ingest_ms"], 1e-9) for r in cell)[len(cell) // 2]
        read = [r["peak_rss_bytes"] for r in cell if not r.get("pot_loaded")]  # a loaded pot's run read nothing
        rss = f"{max(read) / 1e6:.0f}" if read else "–"
        marked = [r for r in cell if "answer_cut" in r]
        cut = f"{sum(r['answer_cut'] and not r['hit'] for r in marked)}" if marked else "–"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3] or 'document'} | {key[4]} | {toks} | "
                     + " | ".join(per_task) + " | " + " | ".join(per_depth)
                     + f" | {fmt_acc(cell)} | {kept:.2f} | {kept_all:.2f} | {low} | {tps:.0f} | {100 * share:.2f} % | {rss} | {cut} |")
    table = "\n".join(lines) + "\n"
    (out / "tasks.md").write_text(table)
    tasks_heatmap(rows, out / "tasks.png")
    return table


def tasks_heatmap(rows, path):
    """Accuracy by task x depth, one panel per (model, split, policy, length)."""
    plt = pyplot()
    if plt is None:
        return
    keys = sorted({(r["model"].split("-")[0], r["split"], r["policy"], r["length"]) for r in rows},
                  key=lambda x: (x[0], x[1], x[3], x[2]))
    cols = min(4, len(keys))
    nrow = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(nrow, cols, figsize=(3.6 * cols, 2.8 * nrow), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        cell = [r for r in rows if (r["model"].split("-")[0], r["split"], r["policy"], r["length"]) == key]
        grid = [[float("nan")] * len(tasks.TASKS) for _ in tasks.DEPTHS]
        for i, d in enumerate(tasks.DEPTHS):
            for j, t in enumerate(tasks.TASKS):
                c = [r for r in cell if r["depth"] == d and r["task"] == t]
                if c:
                    grid[i][j] = sum(r["hit"] for r in c) / len(c)
                    ax.text(j, i, f"{sum(r['hit'] for r in c)}/{len(c)}", ha="center", va="center", fontsize=7)
        ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(tasks.TASKS)), tasks.TASKS, fontsize=6)
        ax.set_yticks(range(len(tasks.DEPTHS)), [str(d) for d in tasks.DEPTHS], fontsize=7)
        ax.set_title(f"{key[0]} {key[2]} {key[3] // 1024}K ({key[1]})", fontsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.supylabel("needle depth", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--bin", default=str(BIN), help="the longdoc_bench binary")
    ap.add_argument("--haystacks", default="filler,text")
    ap.add_argument("--lengths", default="2048,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--keys", type=int, default=20)
    ap.add_argument("--policies", default="none,infinipot,infinipot-w1,-nuc,-nuc-cap,-nuc-cap-reset,finch,"
                                          "finch-w1,finch-late,finch-late-w1,snapkv,h2o,cascade,streaming,"
                                          "truncate")
    ap.add_argument("--budgets", default="1024,2048,4096")
    ap.add_argument("--keep", type=int, default=0, help="entries kept by a compression (default budget/2)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backend", default="cpu", help="cpu, or cuda with --bin build/cuda/longdoc_bench "
                                                      "(make build/cuda/longdoc_bench) and POTSERVE_BIN=build/cuda/potserve")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--question", default=QUESTION)
    ap.add_argument("--out", default=str(ROOT / "build" / "longdoc"))
    ap.add_argument("--report", action="store_true", help="only redraw the table and heatmap")
    ap.add_argument("--memory", default="", help="lengths for the RSS / tokens/s runs (e.g. 8192,32768,131072): "
                                                "one `potserve ingest` per document at the first budget, nothing else")
    ap.add_argument("--showcase", type=int, default=0, help="one document of this many tokens (e.g. 1048576) "
                                                              "with its memory curve, nothing else")
    ap.add_argument("--tasks", action="store_true",
                    help="the five tasks over non-repetitive natural text (corpus.py, tasks.py) into OUT/tasks.jsonl")
    ap.add_argument("--splits", default="test", help="--tasks: corpus splits (tune, test, heldout)")
    ap.add_argument("--trials", type=int, default=5, help="--tasks: documents per (length, rotation)")
    ap.add_argument("--from-trial", type=int, default=0,
                    help="--tasks: start at this trial (0-based), so trials can be split between runs or machines")
    ap.add_argument("--rotations", default="",
                    help="--tasks: only these rotations (e.g. 2: the third document of each trial; default all)")
    ap.add_argument("--hint", action="store_true", help="--tasks: the hint sentence before the document")
    ap.add_argument("--ask", default=",".join(tasks.TASKS),
                    help="--tasks: the tasks whose questions are asked (every needle is still in the document)")
    ap.add_argument("--answer-tokens", type=int, default=40,
                    help="--tasks: the most tokens an answer has (40: room for four 7-digit values)")
    ap.add_argument("--also-without-recall", action="store_true",
                    help="--tasks: a recall policy (e.g. finch-recall-bestlast) also answers each question over "
                         "the same pot without the passages, recorded as the policy without recall (finch)")
    ap.add_argument("--pots", help="--tasks: keep each document's question-agnostic pot in POTS/<model>/ once "
                                   "read and load it from there the next time (any --out): new questions or "
                                   "another recall cost no re-reading; rows so answered have pot_loaded")
    ap.add_argument("--tasks-report", action="store_true", help="only redraw OUT/tasks.md")
    a = ap.parse_args()
    known = [str(r) for r in range(len(tasks.DEPTHS))]
    if a.rotations and not all(r in known for r in a.rotations.split(",")):
        ap.error(f"--rotations {a.rotations}: a comma-separated list of {', '.join(known)}")
    if not 0 <= a.from_trial < a.trials:
        ap.error(f"--from-trial {a.from_trial}: from 0 to --trials {a.trials} less one")
    for policy in a.policies.split(","):
        if policy.partition("+")[2] not in RECYCLED:
            ap.error(f"policy {policy}: unknown decoding suffix (known: "
                     + ", ".join("+" + k for k in RECYCLED if k) + ")")
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    cmdline = " ".join(sys.argv)
    if a.tasks_report:
        rows = [json.loads(x) for x in (out / "tasks.jsonl").read_text().splitlines() if x.strip()]
        print(tasks_report(rows, out, cmdline))
        return
    if a.tasks:
        print(run_tasks(a, out))
        return
    if a.showcase:
        print(showcase(a, out, a.showcase))
        return
    if a.memory:
        memory_runs(a, out)
        print(memory_report(out, cmdline))
        return
    if not a.report:
        old = [json.loads(x) for x in results.read_text().splitlines() if x.strip()] if results.exists() else []
        done = {(r["haystack"], r["policy"], r["budget"], r["length"], r["depth"], r["trial"]) for r in old}
        lengths = [int(x) for x in a.lengths.split(",")]
        depths = [float(x) for x in a.depths.split(",")]
        ctx = n_ctx(a.model)
        for kind in a.haystacks.split(","):
            hay = Haystack(a.model, kind, max(lengths))
            for policy in a.policies.split(","):
                if uncompressed(policy):  # one run per length: the pot is the document
                    for L in lengths:
                        eff = min(L, ctx - N_CTX_MARGIN)
                        # the pot also reserves room for the (unused) catalyst rows
                        budget = min(eff + N_CTX_MARGIN, ctx - 32)
                        for r in run_cell(a, hay, kind, policy, budget, [eff], depths, out / "work",
                                          {(h, p, b, eff, d, k) for h, p, b, l, d, k in done if l == L}):
                            r["length"] = L
                            append(results, [r])
                    continue
                for budget in [int(x) for x in a.budgets.split(",")]:
                    for r in run_cell(a, hay, kind, policy, budget, lengths, depths, out / "work", done):
                        append(results, [r])
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()] if results.exists() else []
    for r in rows:  # rows of the sessions that counted any answer containing the key
        r["hit"] = exact_match(r["answer"], r["key"])
    print(report(rows, out, cmdline))


def append(path, rows):
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
