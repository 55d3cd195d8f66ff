#!/usr/bin/env python3
"""echo's prompt log-probabilities on text nobody here wrote: the long-document bench's
TEST passages (Debian text, `make longdoc-data`), up to 400 tokens each, against
llama.cpp's logits at every position (llama-cpp-python, `make test-reference`) and, on
the first --exact of them, both against the float64 numpy forward.

    .venv/bin/python tests/bench/echo_logprobs.py [--passages 12] [--exact 6] [-m MODEL]
"""
import argparse
import json
import sys
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
for sub in ("tests/py", "tests/reference", "tests/bench/longdoc"):
    sys.path.insert(0, str(ROOT / sub))


def log_softmax_rows(rows):
    rows = np.asarray(rows, dtype=np.float64)
    rows = rows - rows.max(1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--passages", type=int, default=12)
    ap.add_argument("--exact", type=int, default=6)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    import corpus
    import numpy_forward
    import server_util
    from lcpp import Llama
    server_util.MODEL = a.model
    llm = Llama(a.model, n_ctx=1024, n_threads=2, logits_all=True, verbose=False)
    weights = numpy_forward.load(a.model) if a.exact else None
    srv = server_util.Server(Path("/tmp/potserve-echo-bench"), "--threads", "2").start()
    ours_llama, ours_exact, llama_exact = [], [], []
    try:
        for i, text in enumerate(corpus.shuffled(corpus.load_units(), "test", 1)[:a.passages]):
            ids = llm.tokenize(text.encode(), add_bos=True, special=False)[:400]
            llm.reset()
            llm.eval(ids)
            lsm = log_softmax_rows([llm.scores[t] for t in range(len(ids) - 1)])
            theirs = np.array([lsm[t - 1, ids[t]] for t in range(1, len(ids))])
            req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(
                {"prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}).encode(),
                headers={"Content-Type": "application/json"})
            ours = np.array(json.load(urllib.request.urlopen(req))["choices"][0]["logprobs"]["token_logprobs"]
                            [1:len(ids)], dtype=np.float64)
            ours_llama += list(np.abs(ours - theirs))
            if i < a.exact:
                out_w = weights[1].get("output.weight", weights[1]["token_embd.weight"])
                ex = log_softmax_rows(numpy_forward.hidden(None, ids, weights) @ out_w.T)
                exact = np.array([ex[t - 1, ids[t]] for t in range(1, len(ids))])
                ours_exact += list(np.abs(ours - exact))
                llama_exact += list(np.abs(theirs - exact))
    finally:
        srv.stop()
    for name, d in (("potserve / llama.cpp", ours_llama), ("potserve / float64", ours_exact),
                    ("llama.cpp / float64", llama_exact)):
        if d:
            d = np.array(d)
            print(f"{name:22s} {len(d):5d} tokens: |diff| max {d.max():.3f}, p99 {np.percentile(d, 99):.3f}, "
                  f"mean {d.mean():.4f} nats")


if __name__ == "__main__":
    main()
