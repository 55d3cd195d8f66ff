"""Would uneven budgets keep more of the needles? Summarises the "budgets"
lines of `longdoc_bench --winners` (tests/bench/longdoc/longdoc.c): at every
compression, the share of each needle's entries the pot's attention score
alone would keep with the budget per (layer, head) as the pot has it, pooled
over each layer's heads (AdaKV's allocation), or pooled over the whole pot
(any per-layer or per-head split of the same score). Documents follow one
another in the file (the tokens seen start again).

  build/longdoc_bench -m MODEL --docs DOCS.jsonl --policy infinipot --budget 2048 --keep 1024 \\
      --winners 2> winners.txt
  .venv/bin/python tests/bench/longdoc/budgets.py winners.txt
"""
import sys

ALLOCATIONS = ("per head", "per layer", "whole pot")


def documents(lines):
    """[[(seen, needle, entries, [share per allocation])]] per document."""
    docs, last = [], None
    for line in lines:
        if not line.startswith("budgets "):
            continue
        f = line.split()
        seen, needle, entries = int(f[2]), int(f[4]), int(f[6])
        if last is None or seen < last:
            docs.append([])
        last = seen
        docs[-1].append((seen, needle, entries, [float(f[9]), float(f[11]), float(f[13])]))
    return docs


def summary(docs):
    """Mean share at each needle's first compression, and entry-weighted over all."""
    first, weighted, entries = [], [0.0] * 3, 0
    for doc in docs:
        seen_needles = set()
        for _, needle, n, shares in doc:
            if needle not in seen_needles:
                seen_needles.add(needle)
                first.append(shares)
            weighted = [w + s * n for w, s in zip(weighted, shares)]
            entries += n
    return ([sum(s[k] for s in first) / len(first) for k in range(3)] if first else None, len(first),
            [w / entries for w in weighted] if entries else None)


def main():
    for path in sys.argv[1:]:
        with open(path) as f:
            docs = documents(f)
        first, n_needles, weighted = summary(docs)
        if first is None:
            print(f"{path}: no budgets lines")
            continue
        print(f"{path}: {len(docs)} documents, {n_needles} needles compressed")
        print("  at a needle's first compression: " + ", ".join(f"{a} {v:.3f}" for a, v in zip(ALLOCATIONS, first)))
        print("  every compression (by entries):  " + ", ".join(f"{a} {v:.3f}" for a, v in zip(ALLOCATIONS, weighted)))


if __name__ == "__main__":
    main()
