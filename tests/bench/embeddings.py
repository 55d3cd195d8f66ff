#!/usr/bin/env python3
"""/v1/embeddings against llama.cpp (llama-cpp-python, pooling "mean",
normalised) on the same GGUF, threads and passages, alternated rounds,
medians: tokens per second of each, and how close their vectors are.

    .venv/bin/python tests/bench/embeddings.py [ROUNDS] [--passages N] [--threads T] [-m MODEL]

The passages are the first N units of the long-document bench's TEST split
(Debian text nobody here wrote: `make longdoc-data`). llama-cpp-python comes
with `make test-reference` (or `make llama-python`).
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
sys.path.insert(0, str(ROOT / "tests" / "py"))
sys.path.insert(0, str(ROOT / "tests" / "reference"))
sys.path.insert(0, str(ROOT / "tests" / "bench" / "longdoc"))


def potserve_round(url, passages):
    req = urllib.request.Request(url + "/v1/embeddings", data=json.dumps({"input": passages}).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    body = json.load(urllib.request.urlopen(req, timeout=3600))
    return time.perf_counter() - t, np.array([d["embedding"] for d in body["data"]]), body["usage"]["prompt_tokens"]


def llama_round(llm, passages):
    t = time.perf_counter()
    vecs = llm.embed(passages, normalize=True)
    return time.perf_counter() - t, np.array(vecs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rounds", type=int, nargs="?", default=3)
    ap.add_argument("--passages", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2048, help="llama.cpp's n_ctx = n_batch = n_ubatch")
    ap.add_argument("-m", "--model", default=str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    import corpus
    import llama_cpp
    from lcpp import Llama
    from server_util import Server
    import server_util
    server_util.MODEL = a.model
    passages = corpus.shuffled(corpus.load_units(), "test", 0)[:a.passages]
    llm = Llama(a.model, n_ctx=a.batch, n_batch=a.batch, n_ubatch=a.batch, n_threads=a.threads, n_threads_batch=a.threads,
                embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
    srv = Server(Path("/tmp/potserve-embed-bench"), "--threads", a.threads).start()
    ours_s, theirs_s = [], []
    try:
        for r in range(a.rounds):  # alternated, potserve first in even rounds
            for side in (("potserve", "llama") if r % 2 == 0 else ("llama", "potserve")):
                if side == "potserve":
                    s, ours, n_tokens = potserve_round(srv.url, passages)
                    ours_s.append(s)
                else:
                    s, theirs = llama_round(llm, passages)
                    theirs_s.append(s)
            print(f"round {r}: potserve {ours_s[-1]:.2f} s, llama.cpp {theirs_s[-1]:.2f} s", flush=True)
    finally:
        srv.stop()
    # retrieval on the same text: each passage's first sentence as the query, the rest as the
    # document; top-1 = the share of queries whose nearest document is their own
    pairs = [(p[:p.index(". ") + 1], p[p.index(". ") + 2:]) for p in passages if ". " in p[:-2]]
    queries, docs = [q for q, _ in pairs], [d for _, d in pairs]
    top1 = {}
    for name, fn in (("potserve", lambda t: potserve_round(srv.url, t)[1]), ("llama.cpp", lambda t: llama_round(llm, t)[1])):
        if name == "potserve":
            srv.start()
        sims = fn(queries) @ fn(docs).T
        top1[name] = float(np.mean(sims.argmax(1) == np.arange(len(pairs))))
        if name == "potserve":
            srv.stop()
    cos = np.sum(ours * theirs, axis=1)
    mo, ml = statistics.median(ours_s), statistics.median(theirs_s)
    print(f"{len(passages)} passages, {n_tokens} tokens, {a.threads} threads, {Path(a.model).name}")
    print(f"potserve  {n_tokens / mo:8.0f} tokens/s (median {mo:.2f} s)")
    print(f"llama.cpp {n_tokens / ml:8.0f} tokens/s (median {ml:.2f} s)")
    print(f"potserve / llama.cpp speed {ml / mo:.2f}; cosine of the vectors: min {cos.min():.5f}, "
          f"median {np.median(cos):.5f}")
    print(f"retrieval, {len(pairs)} first sentences against the rest of their passages: top-1 potserve "
          f"{top1['potserve']:.3f}, llama.cpp {top1['llama.cpp']:.3f} (chance {1 / len(pairs):.3f})")


if __name__ == "__main__":
    main()
