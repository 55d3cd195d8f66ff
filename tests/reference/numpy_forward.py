#!/usr/bin/env python3
"""An independent float64 forward pass of a llama/qwen2 GGUF in numpy, on
weights dequantised by the `gguf` package: the plain-math reference that the
CPU backend must equal (before any activation quantisation).

    numpy_forward.py MODEL IDS   -> prints the last-position logits' argmax
    (import: logits(path, ids) -> np.ndarray)
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def _field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


def load(path):
    r = GGUFReader(path)
    arch = _field(r, "general.architecture")
    hp = {
        "arch": arch,
        "n_layer": _field(r, f"{arch}.block_count"),
        "n_head": _field(r, f"{arch}.attention.head_count"),
        "n_head_kv": _field(r, f"{arch}.attention.head_count_kv", _field(r, f"{arch}.attention.head_count")),
        "eps": _field(r, f"{arch}.attention.layer_norm_rms_epsilon"),
        "base": _field(r, f"{arch}.rope.freq_base", 10000.0),
    }
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 or len(t.shape) > 1 else a
    return hp, w


def rope(x, pos, base, neox):
    # x: [n_heads, hd]
    hd = x.shape[-1]
    inv = base ** (-np.arange(0, hd // 2) * 2.0 / hd)
    th = pos * inv
    c, s = np.cos(th), np.sin(th)
    y = x.copy()
    if neox:
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        y[..., : hd // 2] = a * c - b * s
        y[..., hd // 2:] = a * s + b * c
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2] = a * c - b * s
        y[..., 1::2] = a * s + b * c
    return y


def logits(path, ids, model=None):
    hp, w = model or load(path)
    neox = hp["arch"] == "qwen2"
    nh, nkv = hp["n_head"], hp["n_head_kv"]
    x = w["token_embd.weight"][ids]
    T, d = x.shape
    hd = d // nh

    def norm(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + hp["eps"]) * g

    for l in range(hp["n_layer"]):
        p = f"blk.{l}."
        h = norm(x, w[p + "attn_norm.weight"])
        q = h @ w[p + "attn_q.weight"].T + w.get(p + "attn_q.bias", 0)
        k = h @ w[p + "attn_k.weight"].T + w.get(p + "attn_k.bias", 0)
        v = h @ w[p + "attn_v.weight"].T + w.get(p + "attn_v.bias", 0)
        q = np.stack([rope(q[t].reshape(nh, hd), t, hp["base"], neox) for t in range(T)])
        k = np.stack([rope(k[t].reshape(nkv, hd), t, hp["base"], neox) for t in range(T)])
        v = v.reshape(T, nkv, hd)
        out = np.zeros((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh] @ k[:, g].T / np.sqrt(hd)
            s = s + np.triu(np.full((T, T), -np.inf), 1)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, hh] = s @ v[:, g]
        x = x + out.reshape(T, d) @ w[p + "attn_output.weight"].T
        h = norm(x, w[p + "ffn_norm.weight"])
        gate = h @ w[p + "ffn_gate.weight"].T
        up = h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    out_w = w.get("output.weight", w["token_embd.weight"])
    return norm(x[-1], w["output_norm.weight"]) @ out_w.T


if __name__ == "__main__":
    ids = [int(t) for t in sys.argv[2].split(",")]
    print(int(np.argmax(logits(sys.argv[1], ids))))
