#!/bin/bash
# A/B of potserve builds on one machine: `tests/bench/ab.sh ROUNDS THREADS BIN...`
# runs each binary's `generate` in rotating order, ROUNDS times, and prints one
# line per run: decode at context 128 (a 128-token prompt, 128 tokens), the
# prefill of a 512-token prompt, and the prefill of a 2048-token prompt with
# decode after it (context 2048). Prompts are fixed pseudo-random token ids;
# take medians per binary. MODEL overrides the default model.
set -eu
M=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
R=$1 T=$2
shift 2
ids() { python3 -c "import random; r = random.Random($2); print(','.join(str(r.randrange(200, 40000)) for _ in range($1)))"; }
I128=$(ids 128 1) I512=$(ids 512 2) I2048=$(ids 2048 3)
speed() { "$@" 2>&1 >/dev/null | grep -o "\(prompt\|generated\): [0-9]* tokens, [0-9.]* tok/s" | tr '\n' ' '; }
n=$#
for ((round = 0; round < R; round++)); do
    for ((k = 0; k < n; k++)); do
        b=${@:$(((k + round) % n + 1)):1}
        echo "$round $b | ctx128 $(speed "$b" generate -m "$M" --tokens "$I128" -n 128 -t "$T" -v)" \
             "| p512 $(speed "$b" generate -m "$M" --tokens "$I512" -n 1 -t "$T" -v)" \
             "| p2048+ctx2048 $(speed "$b" generate -m "$M" --tokens "$I2048" -n 128 -t "$T" -v)"
    done
done
