#!/usr/bin/env python3
"""Writes a llama-family GGUF with random weights in the shapes of a real model,
for the CUDA benchmark (no model hub is reachable from here).

    python tests/bench/cuda/make_synthetic_gguf.py TOKENIZER.gguf OUT.gguf [--shape llama-3.2-1b|tiny] [--type q4_k_m|q4_0|q8_0]

Speed does not depend on the weight values: the kernels read and multiply
every weight the same way whatever it holds, so a model with random blocks
of Llama-3.2-1B's shapes decodes and prefills exactly as fast as the real one
in that type mix would. The text it produces is noise. Blocks are random
bytes with fixed small f16 scales (activations stay finite through the
layers). q4_k_m mixes types as llama.cpp's Q4_K_M (the usual 1B download):
Q4_K, with Q6_K for the embeddings and for attn_v / ffn_down of the layers
llama.cpp gives more bits (the first and last eighth, every third between).
The tokenizer is copied from TOKENIZER.gguf (the default model, a gpt2-style
BPE) and padded with unused tokens up to the shape's vocabulary, so the LM
head has the real model's size. Writes OUT.tmp, then renames.
"""
import argparse
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

SHAPES = {
    # Llama-3.2-1B: 16 layers, 2048 wide, 8192 FFN, 32 heads over 8 KV heads, tied embeddings
    "llama-3.2-1b": dict(n_layer=16, n_embd=2048, n_ff=8192, n_head=32, n_head_kv=8, n_vocab=128256,
                         ctx=131072, rope_base=500000.0),
    # Qwen2.5(-Coder)-1.5B: 28 layers, 1536 wide, 8960 FFN, 12 heads over 2 KV heads (head_dim 128),
    # 151936 tokens, tied embeddings, biases on Q/K/V (the qwen2 architecture)
    "qwen2.5-1.5b": dict(n_layer=28, n_embd=1536, n_ff=8960, n_head=12, n_head_kv=2, n_vocab=151936,
                         ctx=32768, rope_base=1000000.0, arch="qwen2", eps=1e-6),
    # SmolLM2-135M: 30 layers, 576 wide, 1536 FFN, 9 heads over 3 KV heads, 49152 tokens, tied
    "smollm2-135m": dict(n_layer=30, n_embd=576, n_ff=1536, n_head=9, n_head_kv=3, n_vocab=49152,
                         ctx=8192, rope_base=100000.0),
    # a smoke-test model: runs in seconds under the CUDA emulator
    "tiny": dict(n_layer=2, n_embd=128, n_ff=256, n_head=4, n_head_kv=2, n_vocab=0, ctx=4096, rope_base=10000.0),
}
TYPES = {"q4_0": QT.Q4_0, "q8_0": QT.Q8_0, "q4_k_m": QT.Q4_K}
FILE_TYPES = {QT.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0, QT.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
              QT.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M}
# Where a block keeps its f16 scales, and what each is set to relative to the
# Q4_0 scale s (so a weight's magnitude is about the same in every type):
# Q4_K multiplies 6-bit sub-scales (up to 63) by 4-bit quants, Q6_K int8
# sub-scales (up to 127) by 6-bit ones.
SCALES = {QT.Q4_0: [(0, 1.0)], QT.Q8_0: [(0, 0.0625)], QT.Q4_K: [(0, 1 / 32), (2, 1 / 32)], QT.Q6_K: [(208, 1 / 256)]}


def random_blocks(rng, rows, cols, qtype):
    """rows x cols weights as random blocks, scaled by 0.02 / sqrt(cols / 256)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise SystemExit(f"{qtype.name} rows hold {block}-element blocks; this shape has rows of {cols}")
    n_blocks = rows * cols // block
    raw = np.frombuffer(rng.bytes(n_blocks * size), np.uint8).reshape(n_blocks, size).copy()
    s = 0.02 / np.sqrt(cols / 256.0)
    for at, k in SCALES[qtype]:
        raw[:, at:at + 2] = np.frombuffer(np.float16(s * k).tobytes(), np.uint8)
    return raw.reshape(rows, cols // block * size)


def more_bits(layer, n_layer):
    """llama.cpp's use_more_bits: the layers whose attn_v / ffn_down Q4_K_M keeps in Q6_K."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def copy_tokenizer(r, w, n_vocab):
    tokens = types = None
    for field in r.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == "tokenizer.ggml.tokens":
            tokens = value
            continue
        if field.name == "tokenizer.ggml.token_type":
            types = value
            continue
        w.add_key_value(field.name, value, vtype, sub_type=sub)
    n_vocab = max(n_vocab, len(tokens))
    pad = n_vocab - len(tokens)
    w.add_token_list(list(tokens) + [f"<|synthetic_{i}|>" for i in range(pad)])
    w.add_token_types(list(types) + [int(gguf.TokenType.UNUSED)] * pad)
    return n_vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--type", default="q4_0", choices=sorted(TYPES))
    a = ap.parse_args()
    s, qtype = SHAPES[a.shape], TYPES[a.type]
    rng = np.random.default_rng(1234)
    r = gguf.GGUFReader(a.tokenizer)
    tmp = a.out + ".tmp"
    arch = s.get("arch", "llama")
    w = gguf.GGUFWriter(tmp, arch)
    w.add_name(f"synthetic {a.shape} {a.type} (random weights)")
    n_vocab = copy_tokenizer(r, w, s["n_vocab"])
    d, hd = s["n_embd"], s["n_embd"] // s["n_head"]
    w.add_context_length(s["ctx"])
    w.add_embedding_length(d)
    w.add_block_count(s["n_layer"])
    w.add_feed_forward_length(s["n_ff"])
    w.add_head_count(s["n_head"])
    w.add_head_count_kv(s["n_head_kv"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(s["rope_base"])
    w.add_layer_norm_rms_eps(s.get("eps", 1e-5))
    w.add_file_type(int(FILE_TYPES[qtype]))
    ones = np.ones(d, np.float32)
    k_mix = qtype == QT.Q4_K
    etype = QT.Q6_K if k_mix else qtype
    w.add_tensor("token_embd.weight", random_blocks(rng, n_vocab, d, etype), raw_dtype=etype)
    w.add_tensor("output_norm.weight", ones)
    dkv = s["n_head_kv"] * hd
    for l in range(s["n_layer"]):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "ffn_norm.weight", ones)
        for name, rows, cols in (("attn_q", d, d), ("attn_k", dkv, d), ("attn_v", dkv, d), ("attn_output", d, d),
                                 ("ffn_gate", s["n_ff"], d), ("ffn_up", s["n_ff"], d), ("ffn_down", d, s["n_ff"])):
            t = QT.Q6_K if k_mix and name in ("attn_v", "ffn_down") and more_bits(l, s["n_layer"]) else qtype
            w.add_tensor(p + name + ".weight", random_blocks(rng, rows, cols, t), raw_dtype=t)
            if arch == "qwen2" and name in ("attn_q", "attn_k", "attn_v"):
                w.add_tensor(p + name + ".bias", np.zeros(rows, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
