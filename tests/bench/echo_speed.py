#!/usr/bin/env python3
"""How fast echo reads a prompt's log-probabilities (what lm-evaluation-harness asks for each
log-likelihood): potserve's /v1/completions with echo and logprobs against llama.cpp
(llama-cpp-python, logits for every row, then the same log-softmax and pick in numpy, float32;
its forward alone is reported too) on the same token ids, alternated, medians; potserve's time
includes its HTTP, JSON and the answer's one token. The prompts are the long-document bench's TEST
text (Debian, `make longdoc-data`), cut to --tokens.

    .venv/bin/python tests/bench/echo_speed.py [--rounds 3] [--tokens 2000] [-m MODEL]
"""
import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
for sub in ("tests/py", "tests/reference", "tests/bench/longdoc"):
    sys.path.insert(0, str(ROOT / sub))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    import corpus
    import server_util
    from lcpp import Llama
    server_util.MODEL = a.model
    llm = Llama(a.model, n_ctx=a.tokens + 16, n_batch=512, n_threads=2, logits_all=True, verbose=False)
    text = " ".join(corpus.shuffled(corpus.load_units(), "test", 1)[:200])
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)[:a.tokens]
    srv = server_util.Server(Path("/tmp/potserve-echo-speed"), "--threads", "2").start()
    times = {"potserve": [], "llama.cpp": []}
    evals = []  # llama.cpp's forward alone (its logits kept for every row), without the log-softmax
    try:
        for r in range(a.rounds):
            for who in (("potserve", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "potserve")):
                t0 = time.time()
                if who == "potserve":
                    req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(
                        {"prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}).encode(),
                        headers={"Content-Type": "application/json"})
                    lp = json.load(urllib.request.urlopen(req, timeout=3600))["choices"][0]["logprobs"]
                    assert len(lp["token_logprobs"]) >= len(ids)
                else:
                    llm.reset()
                    llm.eval(ids)
                    evals.append(time.time() - t0)
                    rows = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float32)
                    rows = rows - rows.max(1, keepdims=True)
                    lsm = rows - np.log(np.exp(rows).sum(1, keepdims=True))
                    picked = lsm[np.arange(len(ids) - 1), ids[1:]]
                    top = lsm.argmax(1)
                    assert len(picked) == len(top) == len(ids) - 1
                times[who].append(time.time() - t0)
                print(f"round {r} {who}: {times[who][-1]:.2f} s", flush=True)
    finally:
        srv.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k}: median {v:.2f} s for {len(ids)} tokens ({len(ids) / v:.0f} tokens/s)")
    print(f"llama.cpp's forward alone: median {statistics.median(evals):.2f} s")
    print(f"potserve / llama.cpp speed: {med['llama.cpp'] / med['potserve']:.2f}x "
          f"(against its forward alone {statistics.median(evals) / med['potserve']:.2f}x)")


if __name__ == "__main__":
    main()
