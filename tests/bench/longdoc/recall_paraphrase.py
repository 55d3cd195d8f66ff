"""How much of recall's result rests on the bench's questions repeating their
needles' words: for every --docs plan under the given bench output folders,
`potserve recall` with each task's own question and with a paraphrase that
avoids the needle's words where English allows (written once, before this
was run, and not changed after), and whether the answer's needles are among
the recalled passages. No model: the search alone.

  .venv/bin/python tests/bench/longdoc/recall_paraphrase.py build/longdoc_q15 build/longdoc_recall_smol_test
"""
import json
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
PARAPHRASE = {  # question -> a paraphrase (the key word of multikey/multivalue/fact cannot be avoided)
    "single": lambda q: "Which secret code was I told to keep in mind? Reply with digits only.",
    "multikey": lambda q: "Which figure goes with the word " + re.search(r"for (\w+)\?", q).group(1)
                          + "? Reply with digits only.",
    "multivalue": lambda q: "List every figure tied to " + re.search(r"codes for (\w+)\?", q).group(1) + ".",
    "vartrack": lambda q: "Trace the chain of assignments: what does " + re.search(r"VAR (\w+)\?", q).group(1)
                          + " finally hold?",
    "fact": lambda q: "Where is the home of " + re.search(r"does (.+) live\?", q).group(1) + " today?",
}
KIND = [("pass key", "single"), ("special magic number", "multikey"), ("special codes", "multivalue"),
        ("VAR assignments", "vartrack"), ("which city", "fact")]


def kind_of(q):
    return next(k for s, k in KIND if s.lower() in q.lower())


def found(doc, question, needles):
    out = subprocess.run([str(ROOT / "build" / "potserve"), "recall", "-q", question], input=doc,
                         capture_output=True, check=True).stdout
    return sum(n in out for n in needles), len(needles)


def main():
    stats = {}
    for folder in sys.argv[1:]:
        for line in open(pathlib.Path(folder) / "work" / "docs.jsonl"):
            d = json.loads(line)
            doc = pathlib.Path(d["doc"]).read_bytes()
            needles = [doc[a:b].strip() for a, b in d["needles"]]
            for q in d["questions"]:
                if not q:
                    continue
                k = kind_of(q)
                # the task's own needles: those sharing its key word (all of them for single)
                key = (b"pass key" if k == "single" else b"VAR " if k == "vartrack" else
                       re.search(r"(?:for|does) ([\w ]+?)(?: live)?\?", q).group(1).encode())
                mine = [n for n in needles if key in n]
                for which, text in (("own", q), ("paraphrase", PARAPHRASE[k](q))):
                    got, n = found(doc, text, mine)
                    s = stats.setdefault((k, which), [0, 0, 0])
                    s[0] += got == n
                    s[1] += 1
                    s[2] += got / n
    print("| task | question | all its needles recalled | share of its needles recalled |")
    print("|---|---|---|---|")
    for (k, which), (full, n, share) in sorted(stats.items()):
        print(f"| {k} | {which} | {full}/{n} | {share / n:.2f} |")


if __name__ == "__main__":
    main()
