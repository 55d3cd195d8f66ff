#!/usr/bin/env python3
"""Records llama.cpp on the real Gemma 3 270M file (make gemma3-model), small
enough to keep in the repository: for each prompt, llama.cpp's token ids, the
64 largest last-position logits (ids and values), 24 greedy tokens and how
many of them llama.cpp itself keeps with an f32 KV cache.
One prompt is longer than the model's 512-token sliding window, so the local
layers' mask is exercised. tests/py/test_gemma3.py holds potserve to it.

    record_gemma3.py MODEL OUT.json [--check]
"""
import sys

import numpy as np

import json_fixture
from lcpp import Llama

N_TOP, N_GREEDY = 64, 24
FILLER = ("The old lighthouse keeper wrote in his log every evening: the weather, the ships that passed, "
          "the colour of the sea at dusk and the names of the birds that rested on the rail. ")
PROMPTS = {
    "capital": "The capital of France is",
    "recipe": "Here is a simple recipe for pancakes:\n1.",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "unicode": "Übersetze ins Englische: « Le chat dort sur le canapé. » →",
    # about 900 tokens: past the 512-token window of the sliding layers
    "long": FILLER * 24 + "The keeper's log mentioned the colour of the",
}


def top_logits(llm):
    n_vocab = llm.n_vocab()
    logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)).copy()
    top = np.argsort(-logits, kind="stable")[:N_TOP]
    return logits, top


def greedy(llm, ids):
    llm.reset()
    llm.eval(ids)
    logits, top = top_logits(llm)
    out = []
    for _ in range(N_GREEDY):
        tok = int(np.argmax(top_logits(llm)[0]))
        out.append(tok)
        llm.eval([tok])
    return logits, top, out


def record(model):
    """Also llama.cpp's own yardstick: how many greedy tokens it keeps when
    only its KV cache turns f32 (self_agree)."""
    llm = Llama(model, n_ctx=2048, n_batch=512, n_threads=2, logits_all=False, verbose=False)
    f32kv = Llama(model, n_ctx=2048, n_batch=512, n_threads=2, logits_all=False, verbose=False, type_k=0, type_v=0)
    out = {"model": "gemma-3-270m-q4_k_m.gguf", "n_top": N_TOP, "prompts": {}}
    for name, text in PROMPTS.items():
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        logits, top, toks = greedy(llm, ids)
        alt = greedy(f32kv, ids)[2]
        agree = next((j for j in range(N_GREEDY) if alt[j] != toks[j]), N_GREEDY)
        out["prompts"][name] = {"text": text, "ids": [int(i) for i in ids], "top_ids": [int(i) for i in top],
                                "top_logits": [round(float(logits[i]), 4) for i in top], "greedy": toks,
                                "self_agree": agree}
    return out


def failing(ref, got):
    bad = []
    for name, p in got["prompts"].items():
        r = ref["prompts"].get(name)
        if (not r or r["ids"] != p["ids"] or r["greedy"] != p["greedy"] or r["top_ids"][:8] != p["top_ids"][:8]
                or not np.allclose(r["top_logits"], p["top_logits"], atol=1e-2)):
            bad.append(name)
    return bad


if __name__ == "__main__":
    sys.exit(json_fixture.main(record, failing, lambda o: len(o["prompts"])))
