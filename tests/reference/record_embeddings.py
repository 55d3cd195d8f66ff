#!/usr/bin/env python3
"""Records llama.cpp's embeddings of the default model: for each text, its
token ids and the mean of its final-normed hidden states scaled to length 1
(llama.cpp with pooling "mean", as llama-cpp-python's embed() normalises them).

    record_embeddings.py MODEL OUT.npz           write the fixture
    record_embeddings.py MODEL OUT.npz --check   recompute and compare with OUT.npz

Needs llama-cpp-python (`make test-reference` installs it in the venv).
"""
import argparse
import sys

import numpy as np

TEXTS = [
    "hello world",
    "The capital of France is Paris.",
    "Memory pots keep a fixed number of entries however long the document is.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Les fleurs du jardin sont belles au printemps.",
    "日本の首都は東京です。",
    "Emoji test: 😀 means happy",
    "<|im_start|>user\nthis text's special-token markup is read as plain text<|im_end|>",
    "a",
    "SELECT name, price FROM products WHERE price > 10 ORDER BY price DESC;",
    # longer than one forward's 512 tokens (engine/embed.c reads it in pieces)
    " ".join(f"Line {i}: the river ran past mill {i * 7 % 31} and the bridge at mile {i * 13 % 97}."
             for i in range(60)),
]


def record(model_path):
    import llama_cpp
    from lcpp import Llama

    llm = Llama(model_path, n_ctx=2048, n_batch=2048, n_ubatch=2048, n_threads=2, embedding=True,
                pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False)
    ids = [np.array(llm.tokenize(t.encode(), add_bos=True, special=False), dtype=np.int32) for t in TEXTS]
    vecs = [np.array(llm.embed(t, normalize=True), dtype=np.float32) for t in TEXTS]
    return ids, vecs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    ids, vecs = record(a.model)
    if not a.check:
        arrays = {f"ids_{i}": ids[i] for i in range(len(TEXTS))}
        arrays.update({f"embedding_{i}": vecs[i] for i in range(len(TEXTS))})
        np.savez_compressed(a.out, n=np.array(len(TEXTS)), **arrays)
        print(f"wrote {a.out}: {len(TEXTS)} texts, {max(len(x) for x in ids)} tokens at most")
        return 0
    ref = np.load(a.out)
    bad = 0
    for i in range(len(TEXTS)):
        if not (np.array_equal(ref[f"ids_{i}"], ids[i]) and np.allclose(ref[f"embedding_{i}"], vecs[i], atol=1e-4)):
            bad += 1
            print(f"text {i}: llama.cpp now differs from the stored reference")
    print(f"{len(TEXTS) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
