#!/usr/bin/env python3
"""Records llama.cpp's reference for the default model: for each prompt, the
token ids, the last-position logits and a greedy 32-token continuation.

    record_logits.py MODEL OUT.npz           write the fixture
    record_logits.py MODEL OUT.npz --check   recompute and compare with OUT.npz

Needs llama-cpp-python (`make test-reference` installs it in the venv). The
fixture keeps logits as float16 so 20 full vocabularies stay under 2 MB.

It also records how far llama.cpp agrees with *itself* when only its KV-cache
precision changes (f16, its default, vs f32): per-prompt logit cosines and the
number of identical greedy continuations. This 135M Q4_1 model is numerically
fragile, and these figures calibrate what "agrees with llama.cpp" can mean.
"""
import argparse
import sys

import numpy as np

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "1, 2, 3, 5, 8, 13,",
    "The quick brown fox",
    "In machine learning, a transformer is",
    "Q: What is the boiling point of water at sea level?\nA:",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a haiku about memory.<|im_end|>\n<|im_start|>assistant\n",
    "Paris, London, Berlin, Madrid,",
    "import numpy as np\nx = np.",
    "The mitochondria is the",
    "SELECT name FROM users WHERE",
    "Les fleurs du jardin sont",
    "El perro corre por el",
    "日本の首都は",
    "Emoji test: 😀 means",
    "To be, or not to be, that is",
    "<|im_start|>user\nSummarize: The cat sat on the mat. It was warm.<|im_end|>\n<|im_start|>assistant\n",
    "The year 2024 was",
    "Water is made of hydrogen and",
]
N_CONTINUE = 32


def greedy(llm, toks):
    """Last-position logits of toks and the greedy continuation after them."""
    llm.reset()
    llm.eval(toks)
    first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    out, cur = [], first
    for _ in range(N_CONTINUE):
        nxt = int(np.argmax(cur))
        out.append(nxt)
        if nxt == llm.token_eos():
            break
        llm.eval([nxt])
        cur = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return first, out


def record(model_path):
    from lcpp import Llama

    llm = Llama(model_path=model_path, n_ctx=512, n_threads=2, logits_all=True, verbose=False)
    f32kv = Llama(model_path=model_path, n_ctx=512, n_threads=2, logits_all=True, verbose=False,
                  type_k=0, type_v=0)
    ids, logits, cont, self_cos, self_same = [], [], [], [], 0
    for text in PROMPTS:
        toks = llm.tokenize(text.encode(), add_bos=True, special=True)
        first, out = greedy(llm, toks)
        other, other_out = greedy(f32kv, toks)
        self_cos.append(float(first @ other / (np.linalg.norm(first) * np.linalg.norm(other))))
        self_same += other_out == out
        ids.append(np.array(toks, dtype=np.int32))
        logits.append(first.astype(np.float16))
        cont.append(np.array(out, dtype=np.int32))
    return ids, logits, cont, np.array(self_cos), self_same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    ids, logits, cont, self_cos, self_same = record(a.model)
    if not a.check:
        arrays = {}
        for i in range(len(PROMPTS)):
            arrays[f"ids_{i}"] = ids[i]
            arrays[f"logits_{i}"] = logits[i]
            arrays[f"cont_{i}"] = cont[i]
        np.savez_compressed(a.out, n=np.array(len(PROMPTS)), self_cos=self_cos,
                            self_greedy_same=np.array(self_same), **arrays)
        print(f"wrote {a.out}: {len(PROMPTS)} prompts")
        return 0
    ref = np.load(a.out)
    bad = 0
    for i in range(len(PROMPTS)):
        same = (np.array_equal(ref[f"ids_{i}"], ids[i]) and np.array_equal(ref[f"cont_{i}"], cont[i])
                and np.allclose(ref[f"logits_{i}"].astype(np.float32), logits[i].astype(np.float32), atol=0.05))
        if not same:
            bad += 1
            print(f"prompt {i}: llama.cpp now differs from the stored reference")
    print(f"{len(PROMPTS) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
