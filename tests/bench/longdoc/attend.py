"""Could the pot's own attention say where to recall from when the question's
words do not? For every document of the given bench output folders (their
saved question-agnostic pots, `run.py --pots`), each task's question and its
paraphrase (recall_paraphrase.py's, written before either was run) are put
to the pot with `longdoc_bench --attend W`: the document is cut into W-token
windows, each ranked by the attention the question's rows give the pot's
entries in it (summed, max, mean over entries, layers and KV heads). A task
counts as found by a measure when every one of its needles has a window in
the top K (K windows of W tokens: about what recall's 4 KB of passages
holds). Printed next to BM25's figure for the same questions (the search the
server's recall uses: `potserve recall`).

  .venv/bin/python tests/bench/longdoc/attend.py -m MODEL --pots build/pots/MODEL_STEM build/attn_tune
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from recall_paraphrase import PARAPHRASE, ROOT, found, kind_of  # noqa: E402

MEASURES = ("sum", "max", "mean")


def own_needles(doc, needles, q):
    """Indices (in the docs line's order) of the needles the question is about: those holding its key word."""
    k = kind_of(q)
    key = (b"pass key" if k == "single" else b"VAR " if k == "vartrack" else
           re.search(r"(?:for|does) ([\w ]+?)(?: live)?\?", q).group(1).encode())
    return [i for i, (a, b) in enumerate(needles) if key in doc[a:b]]


def attend(a, plan):
    """{(doc id, q): {needle: {measure: rank}}} from one longdoc_bench --attend run over plan."""
    args = [a.bin, "-m", a.model, "-t", str(a.threads), "--docs", str(plan), "--policy", a.policy,
            "--budget", str(a.budget), "--pots", a.pots, "--attend", str(a.window)]
    if a.policy != "none":
        args += ["--keep", str(a.budget // 2)]
    p = subprocess.run(args, capture_output=True, text=True, check=True)
    out = {}
    for line in p.stderr.splitlines():
        w = line.split()
        if w[:1] != ["attend"]:
            continue
        ranks = dict(zip(w[7::2], map(int, w[8::2])))
        out.setdefault((w[1], int(w[2][1:])), {})[int(w[6])] = ranks
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--pots", required=True, help="the model's folder of saved pots (run.py --pots DIR: DIR/<stem>)")
    ap.add_argument("--bin", default=str(ROOT / "build" / "longdoc_bench"))
    ap.add_argument("--policy", default="infinipot", help="the pots' policy (none: full attention, the check)")
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--window", type=int, default=256, help="tokens per window")
    ap.add_argument("--top", type=int, default=4, help="windows a task's needles must be among")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("folders", nargs="+")
    a = ap.parse_args()
    stats = {}
    for folder in a.folders:
        lines = [json.loads(x) for x in open(pathlib.Path(folder) / "work" / "docs.jsonl")]
        for which in ("own", "paraphrase"):
            plan = pathlib.Path(folder) / "work" / f"attend_{which}.jsonl"
            with open(plan, "w") as f:
                for d in lines:
                    qs = [q if not q or which == "own" else PARAPHRASE[kind_of(q)](q) for q in d["questions"]]
                    f.write(json.dumps(dict(d, questions=qs)) + "\n")
            ranks = attend(a, plan)
            for d in lines:
                doc = pathlib.Path(d["doc"]).read_bytes()
                for qi, q in enumerate(d["questions"]):
                    if not q:
                        continue
                    k = kind_of(q)
                    mine = own_needles(doc, d["needles"], q)
                    asked = q if which == "own" else PARAPHRASE[k](q)
                    got, n = found(doc, asked, [doc[x:y].strip() for x, y in (d["needles"][i] for i in mine)])
                    s = stats.setdefault((k, which), {"n": 0, "bm25": 0, **{m: 0 for m in MEASURES}})
                    s["n"] += 1
                    s["bm25"] += got == n
                    r = ranks[(d["id"], qi)]
                    for m in MEASURES:
                        s[m] += all(r[i][m] < a.top for i in mine)
                    print(f"{d['id']} {k} {which}: " + " ".join(f"{i}:{r[i]['sum']}/{r[i]['max']}/{r[i]['mean']}"
                                                              for i in mine), file=sys.stderr)
    print(f"| task | question | BM25 recalls all its needles | attention: all in the top {a.top} windows of "
          f"{a.window} tokens (sum / max / mean) |")
    print("|---|---|---|---|")
    for (k, which), s in sorted(stats.items()):
        print(f"| {k} | {which} | {s['bm25']}/{s['n']} | " + " / ".join(f"{s[m]}/{s['n']}" for m in MEASURES) + " |")


if __name__ == "__main__":
    main()
