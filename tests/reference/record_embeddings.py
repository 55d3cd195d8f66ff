#!/usr/bin/env python3
"""Records llama.cpp's embeddings of the default model: for each text, its
token ids and the mean of its final-normed hidden states scaled to length 1
(llama.cpp with pooling "mean", as llama-cpp-python's embed() normalises them).

    record_embeddings.py MODEL OUT.npz [--fixtures DIR]           write the fixture
    record_embeddings.py MODEL OUT.npz [--fixtures DIR] --check   recompute and compare with OUT.npz

With --fixtures, also the tiny embedding models of tests/make_fixtures.py
(FIXTURE_MODELS: pooled by the last token with EOS appended, and by the
first), each pooled as its file says, on FIXTURE_TEXTS.

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


FIXTURE_MODELS = ["embed_qwen3_last", "embed_llama_cls"]
FIXTURE_TEXTS = ["hello world", "the cat sat on the mat", "a", "one two three four five six seven eight nine ten"]


def record_fixtures(fixtures):
    """{key: array} for the tiny models, pooled as their files say."""
    from lcpp import Llama
    out = {}
    for name in FIXTURE_MODELS:
        llm = Llama(f"{fixtures}/{name}.gguf", n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2, embedding=True,
                    verbose=False)
        for i, t in enumerate(FIXTURE_TEXTS):
            out[f"{name}_ids_{i}"] = np.array(llm.tokenize(t.encode(), add_bos=True, special=False), dtype=np.int32)
            out[f"{name}_embedding_{i}"] = np.array(llm.embed(t, normalize=True), dtype=np.float32)
    return out


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
    ap.add_argument("--fixtures")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    ids, vecs = record(a.model)
    tiny = record_fixtures(a.fixtures) if a.fixtures else {}
    if not a.check:
        arrays = {f"ids_{i}": ids[i] for i in range(len(TEXTS))}
        arrays.update({f"embedding_{i}": vecs[i] for i in range(len(TEXTS))})
        arrays.update(tiny)
        np.savez_compressed(a.out, n=np.array(len(TEXTS)), **arrays)
        print(f"wrote {a.out}: {len(TEXTS)} texts, {max(len(x) for x in ids)} tokens at most")
        return 0
    ref = np.load(a.out)
    bad = 0
    for i in range(len(TEXTS)):
        if not (np.array_equal(ref[f"ids_{i}"], ids[i]) and np.allclose(ref[f"embedding_{i}"], vecs[i], atol=1e-4)):
            bad += 1
            print(f"text {i}: llama.cpp now differs from the stored reference")
    for k in tiny:
        if not (np.allclose(ref[k], tiny[k], atol=1e-4) if "embedding" in k else np.array_equal(ref[k], tiny[k])):
            bad += 1
            print(f"{k}: llama.cpp now differs from the stored reference")
    print(f"{len(TEXTS) + len(tiny) // 2 - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
