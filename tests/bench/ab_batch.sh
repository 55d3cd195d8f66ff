#!/bin/bash
# A/B of batched decode: `tests/bench/ab_batch.sh ROUNDS BENCH_BATCH...` runs
# each build's bench_batch (1 sequence three times, then 8 sequences three
# times; each figure the best of bench_batch's own 2 runs) in turn, ROUNDS
# times, and prints per binary the medians of the 1- and 8-sequence aggregate
# tokens/s and their ratio. MODEL overrides the default model.
set -eu
M=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
R=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 0; r < R; r++)); do
    for b in "$@"; do
        "$b" "$M" 2 1,1,1,8,8,8 2>&1 | grep '^| [18] ' | awk -F'|' -v b="$b" '{print b, $2 + 0, $5 + 0}' >> "$out"
    done
done
python3 - "$out" "$@" <<'PY'
import statistics as st
import sys
rows = [line.split() for line in open(sys.argv[1])]
for b in sys.argv[2:]:
    one = [float(r[2]) for r in rows if r[0] == b and r[1] == "1"]
    eight = [float(r[2]) for r in rows if r[0] == b and r[1] == "8"]
    print(f"{b}: 1 sequence {st.median(one):.1f} (n={len(one)}), 8 sequences {st.median(eight):.1f} "
          f"(n={len(eight)}), 8 vs 1 {st.median(eight) / st.median(one):.2f}x")
PY
