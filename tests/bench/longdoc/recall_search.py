"""Recall's search alone, no model: over the bench's task documents (built as
run.py --tasks builds them, for the given splits, lengths and trials, three
rotations each), does `potserve recall` with each task's question bring back
all of that task's needles? One line per (split, length, task), then the
documents where it did not.

  .venv/bin/python tests/bench/longdoc/recall_search.py --splits tune,test \
      --lengths 32768,65536,131072 --trials 3 [--bin build/potserve]

Documents are sized with --tokens-per-byte (default: SmolLM2's on the TEST
split, 0.2644, from a run's calibration.json), so no model is needed; the
document for (split, length, trial, rotation) is the one run.py builds for a
model with that ratio.
"""
import argparse
import pathlib
import subprocess

import corpus
import tasks

ROOT = pathlib.Path(__file__).resolve().parents[3]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(ROOT / "build" / "potserve"))
    ap.add_argument("--splits", default="tune,test")
    ap.add_argument("--lengths", default="32768,65536,131072")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens-per-byte", type=float, default=0.2644)
    a = ap.parse_args()
    units = corpus.load_units()
    stats, misses = {}, []
    for split in a.splits.split(","):
        for length in (int(x) for x in a.lengths.split(",")):
            for k in range(a.trials):
                for rot in range(len(tasks.DEPTHS)):
                    plan = tasks.document_plan(a.seed, split, length, k, rot)
                    paras = corpus.shuffled(units, split, f"{a.seed}:{k}:{rot}")
                    text, needles = tasks.build_document(paras, a.tokens_per_byte, length, plan, rot)
                    doc = text.encode()
                    for task, spans in zip(plan, needles):
                        mine = [doc[s:e].strip() for s, e in spans]
                        out = subprocess.run([a.bin, "recall", "-q", task["question"]], input=doc,
                                             capture_output=True, check=True).stdout
                        got = sum(n in out for n in mine)
                        s = stats.setdefault((split, length, task["kind"]), [0, 0])
                        s[0] += got == len(mine)
                        s[1] += 1
                        if got < len(mine):
                            misses.append(f"{split} {length} trial {k} rotation {rot} {task['kind']}: "
                                          f"{got} of {len(mine)} needles")
    print("| split | length | task | all its needles recalled |")
    print("|---|---|---|---|")
    for (split, length, kind), (full, n) in sorted(stats.items()):
        print(f"| {split} | {length} | {kind} | {full}/{n} |")
    for m in misses:
        print("missed:", m)


if __name__ == "__main__":
    main()
