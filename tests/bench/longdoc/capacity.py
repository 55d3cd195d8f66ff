"""What a question-agnostic pot could hold at best: how many tokens of a bench
document's own text state facts of the kind questions ask for (a number, a
name), against the entries a compression keeps. A pot that does not know the
question, and has no reason to prefer the bench's needles over the document's
other facts, can keep at most keep / (fact tokens) of those facts, each
needle included; the targets of issue 22 need nearly all of the needles.

  .venv/bin/python tests/bench/longdoc/capacity.py -m MODEL --split test --lengths 32768,131072 --trials 5

builds the same documents run.py builds (run.py's seed and the calibration in
--cal, the tokens per byte run.py measured for the model) and counts, with
the model's own tokenizer, the tokens of the haystack's sentences in each
class; the needles are counted apart and never in a class.

  .venv/bin/python tests/bench/longdoc/capacity.py --rows tests/bench/longdoc/results/natural/test_qwen1.5b.jsonl

instead tabulates measured rows: questions answered by the share of the
answer's needle still in the pot, for the question-agnostic pot (infinipot)
and the question-guided one (finch), budget 2048, 8K and longer, each
question once (the first row of a repeated cell).
"""
import argparse
import json
import pathlib
import re
import statistics
import sys

import corpus
import run
import tasks

NUMBER = re.compile(r"\d{2,}")          # a number of two digits or more: versions, sizes, years, counts
NAME = re.compile(r"[A-Z][a-z]+")        # a capitalised word after a sentence's first: a name or a proper noun
LONG_NUMBER = re.compile(r"\d{5,}")      # the bench's own answer form (5-7 digits): counted to show what a prior for it would shape
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(paragraph):
    return [s for line in paragraph.split("\n") for s in SENTENCE_END.split(line) if s.strip()]


def kinds(sentence):
    """The fact classes a sentence falls in: 'number', 'name' (either may be
    both); 'long number' is a subset of 'number', kept apart."""
    words = [w.strip("\"'“”‘’()[]{},.;:!?") for w in sentence.split()[1:]]
    out = set()
    if NUMBER.search(sentence):
        out.add("number")
    if any(NAME.fullmatch(w) for w in words):
        out.add("name")
    if LONG_NUMBER.search(sentence):
        out.add("long number")
    return out


def haystack_and_needles(text, needles):
    """(haystack paragraphs, needle texts) of a built document; needles are
    byte ranges (tasks.build_document)."""
    raw = text.encode()
    spans = sorted(s for task in needles for s in task)
    hay, pos = [], 0
    for start, end in spans:
        hay.append(raw[pos:start].decode())
        pos = end
    hay.append(raw[pos:].decode())
    paras = [p for chunk in hay for p in chunk.split("\n\n") if p.strip()]
    return paras, [raw[s:e].decode() for s, e in spans]


def count(model, text_by_class):
    return {k: (run.n_tokens(model, "\n".join(v)) if v else 0) for k, v in text_by_class.items()}


def measure(model, split, length, trial, rotation, tpb, seed):
    plan = tasks.document_plan(seed, split, length, trial, rotation)
    paras = corpus.shuffled(corpus.load_units(), split, f"{seed}:{trial}:{rotation}")
    text, needles = tasks.build_document(paras, tpb, length, plan, rotation)
    hay, needle_texts = haystack_and_needles(text, needles)
    by_class = {"document": [text], "number": [], "name": [], "long number": [], "fact": [],
                "needles": needle_texts}
    for p in hay:
        for s in sentences(p):
            k = kinds(s)
            for c in k:
                by_class[c].append(s)
            if k & {"number", "name"}:
                by_class["fact"].append(s)
    tokens = count(model, by_class)
    tokens["fact sentences"] = len(by_class["fact"])
    tokens["number sentences"] = len(by_class["number"])
    tokens["long number sentences"] = len(by_class["long number"])
    return tokens


KEPT_BINS = ((0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 1.01))


def answered_by_kept(rows, policy):
    """[(bin, answered, asked)] for one policy's rows (see the module doc)."""
    seen, cell = set(), []
    for r in rows:
        key = (r["model"], r["split"], r["id"], r["policy"], r["budget"], r["length"], r["task"])
        if (r["policy"] != policy or r["budget"] != 2048 or r["length"] < 8192 or r.get("kept_needle") is None
                or key in seen):
            continue
        seen.add(key)
        cell.append(r)
    return [((lo, hi), sum(r["hit"] for r in b), len(b))
            for lo, hi in KEPT_BINS for b in [[r for r in cell if lo <= r["kept_needle"] < hi]]]


def rows_report(paths):
    print("| rows | pot | " + " | ".join(f"kept {lo:.1f}–{min(hi, 1):.1f}" for lo, hi in KEPT_BINS) + " |")
    print("|---|---|" + "---|" * len(KEPT_BINS))
    for path in paths:
        try:
            rows = [json.loads(x) for x in pathlib.Path(path).read_text().splitlines() if x.strip()]
            cells = {policy: answered_by_kept(rows, policy) for policy in ("infinipot", "finch")}
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"{path}: not run.py --tasks rows ({type(e).__name__}: {e})")
        for policy, row in cells.items():
            print(f"| {pathlib.Path(path).name} | {policy} | " + " | ".join(f"{k}/{n}" for _, k, n in row) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(run.ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--split", default="test")
    ap.add_argument("--lengths", default="32768,131072")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--keep", type=int, default=1024, help="entries a compression keeps (budget 2048)")
    ap.add_argument("--seed", type=int, default=1, help="run.py's --seed")
    ap.add_argument("--cal", help="a run.py OUT/calibration.json measured for this model")
    ap.add_argument("--rows", nargs="+", help="tabulate answers by kept share from these run.py tasks rows instead")
    a = ap.parse_args()
    if a.rows:
        return rows_report(a.rows)
    if not a.cal:
        sys.exit("--cal (a run.py OUT/calibration.json) is needed to build the documents")
    key = f"{pathlib.Path(a.model).name}:{a.split}"
    cal = json.loads(pathlib.Path(a.cal).read_text())
    if key not in cal:
        sys.exit(f"{a.cal} has no tokens per byte for {key}: run run.py with this model and split first")
    print(f"model {pathlib.Path(a.model).name}, split {a.split}, keep {a.keep}")
    print("| length | documents | tokens | sentences with a number or a name (tokens, share) | "
          "with a number | with a number of 5+ digits | needles' tokens | keep / fact tokens | keep / number tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for length in [int(x) for x in a.lengths.split(",")]:
        rows = [measure(a.model, a.split, length, t, r, cal[key], a.seed)
                for t in range(a.trials) for r in range(len(tasks.DEPTHS))]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"| {length:,} | {len(rows)} | {med['document']:,.0f} | {med['fact']:,.0f} "
              f"({med['fact'] / med['document']:.2f}; {med['fact sentences']:.0f} sentences) | "
              f"{med['number']:,.0f} ({med['number'] / med['document']:.2f}; {med['number sentences']:.0f}) | "
              f"{med['long number']:,.0f} ({med['long number sentences']:.0f}) | {med['needles']:,.0f} | {a.keep / med['fact']:.3f} | {a.keep / med['number']:.3f} |")
    print("(medians over the documents)")


if __name__ == "__main__":
    main()
