#!/usr/bin/env python3
"""Records llama.cpp's log-probabilities of the default model's prompt tokens: for each
prompt, its tokens (with llama.cpp's tokenizer) and, from llama.cpp's logits at every
position (logits_all), each token's log-probability given those before it and the three
likeliest tokens there: what /v1/completions with echo and logprobs must agree with.
(llama-cpp-python's own create_completion(echo=True) is not the reference: its prompt
log-probabilities are one position off, each token scored by the logits after it.)

    record_echo.py MODEL OUT.json           write the fixture
    record_echo.py MODEL OUT.json --check   recompute and compare with OUT.json

Needs llama-cpp-python (`make test-reference` installs it in the venv).
"""
import argparse
import json
import sys

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Water boils at 100 degrees Celsius at sea level.",
    "Les fleurs du jardin sont belles.",
    "1, 2, 3, 5, 8, 13, 21,",
]


def record(model_path):
    import numpy as np
    from lcpp import Llama
    llm = Llama(model_path, n_ctx=512, n_threads=2, logits_all=True, verbose=False)
    out = []
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        token_lp, top = [None], [None]
        for t in range(1, len(ids)):
            row = np.array(llm.scores[t - 1], dtype=np.float64)
            lsm = row - row.max() - np.log(np.exp(row - row.max()).sum())
            token_lp.append(float(lsm[ids[t]]))
            best = np.argsort(-lsm, kind="stable")[:3]
            top.append([[int(i), float(lsm[i])] for i in best])
        out.append({"prompt": text, "ids": [int(i) for i in ids], "token_logprobs": token_lp, "top": top})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    got = record(a.model)
    if not a.check:
        with open(a.out, "w") as f:
            json.dump(got, f, indent=1)
            f.write("\n")
        print(f"wrote {a.out}: {len(got)} prompts")
        return 0
    with open(a.out) as f:
        ref = json.load(f)
    bad = 0
    for r, g in zip(ref, got):
        same = r["ids"] == g["ids"] and all(
            (x is None and y is None) or abs(x - y) < 1e-3 for x, y in zip(r["token_logprobs"], g["token_logprobs"]))
        if not same:
            bad += 1
            print(f"{r['prompt']!r}: llama.cpp now differs from the stored reference")
    print(f"{len(ref) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
