#!/bin/bash
# A/B of potserve builds reading a document: `tests/bench/ab_ingest.sh ROUNDS
# THREADS DOC BIN...` runs each binary's `ingest` of the text file DOC through
# the default pot (budget 2048, then 512) in rotating order, ROUNDS times, and
# prints one line per run: ingest tokens/s at each budget. Take medians per
# binary. MODEL overrides the default model.
set -eu
M=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
R=$1 T=$2 DOC=$3
shift 3
speed() { "$@" --json 2>/dev/null | python3 -c "import json, sys; print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])['ingest_tokens_per_s'], 1))"; }
n=$#
for ((round = 0; round < R; round++)); do
    for ((k = 0; k < n; k++)); do
        b=${@:$(((k + round) % n + 1)):1}
        echo "$round $b | budget 2048 $(speed "$b" ingest -m "$M" "$DOC" --budget 2048 -t "$T") tok/s" \
             "| budget 512 $(speed "$b" ingest -m "$M" "$DOC" --budget 512 -t "$T") tok/s"
    done
done
