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
import sys

import json_fixture

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


def failing(ref, got):
    return [r["prompt"] for r, g in zip(ref, got)
            if r["ids"] != g["ids"] or any((x is None) != (y is None) or (x is not None and abs(x - y) >= 1e-3)
                                           for x, y in zip(r["token_logprobs"], g["token_logprobs"]))]


if __name__ == "__main__":
    sys.exit(json_fixture.main(record, failing, len))
