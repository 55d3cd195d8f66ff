#!/usr/bin/env python3
"""An independent float64 forward pass of a llama/qwen2/qwen3/gemma3/phi3 GGUF in numpy, on
weights dequantised by the `gguf` package: the plain-math reference that the
CPU backend must equal (before any activation quantisation).

    numpy_forward.py MODEL IDS   -> prints the last-position logits' argmax
    (import: logits(path, ids) -> np.ndarray; hidden(), embedding())
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def _field(r, key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


ARCH_NEOX = {"qwen2", "qwen3", "gemma3", "phi3"}  # RoPE pairs (i, i + n_rot/2)


def load(path):
    r = GGUFReader(path)
    arch = _field(r, "general.architecture")
    n_layer = _field(r, f"{arch}.block_count")
    n_head = _field(r, f"{arch}.attention.head_count")
    n_embd = _field(r, f"{arch}.embedding_length")
    scaling = _field(r, f"{arch}.rope.scaling.type", "linear")
    factor = _field(r, f"{arch}.rope.scaling.factor", 0.0)
    hp = {
        "arch": arch,
        "n_layer": n_layer,
        "n_head": n_head,
        "n_head_kv": _field(r, f"{arch}.attention.head_count_kv", n_head),
        "head_dim": _field(r, f"{arch}.attention.key_length", n_embd // n_head),
        "eps": _field(r, f"{arch}.attention.layer_norm_rms_epsilon"),
        "base": _field(r, f"{arch}.rope.freq_base", 10000.0),
        "freq_scale": 1.0 / factor if factor and scaling != "none" else 1.0,
        "yarn": scaling == "yarn",
        "n_ctx_orig": _field(r, f"{arch}.rope.scaling.original_context_length",
                             _field(r, f"{arch}.context_length")),
        "window": [0] * n_layer,
        "base_l": [_field(r, f"{arch}.rope.freq_base", 10000.0)] * n_layer,
    }
    swa = _field(r, f"{arch}.attention.sliding_window", 0)
    if arch == "gemma3" and swa:
        every = _field(r, f"{arch}.attention.sliding_window_pattern", 6)
        local = [i % every < every - 1 for i in range(n_layer)]
        hp["window"] = [swa if loc else 0 for loc in local]
        base_swa = _field(r, f"{arch}.rope.freq_base_swa", 10000.0)
        hp["base_l"] = [base_swa if loc else hp["base"] for loc in local]
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim > 1 or len(t.shape) > 1 else a
    return hp, w


def rope_angles(hp, base, n_rot, pos, scaled=True):
    """Angles [n_rot/2] of position pos, as in the YaRN paper and llama.cpp's
    rope_ext: base^(-2i/n_rot) / freq_factor_i, interpolated by freq_scale
    (YaRN: ramped back to the original on the fast pairs), and the
    magnitude factor YaRN applies to cos and sin."""
    i = np.arange(n_rot // 2)
    extrap = base ** (-2.0 * i / n_rot) / hp.get("freq_factors", np.ones(n_rot // 2))
    fs = hp["freq_scale"] if scaled else 1.0
    mag = 1.0
    mix = np.zeros(n_rot // 2)
    if hp["yarn"] and scaled:
        def corr(beta):
            return n_rot * np.log(hp["n_ctx_orig"] / (beta * 2 * np.pi)) / (2 * np.log(base))
        lo, hi = max(0.0, np.floor(corr(32.0))), min(n_rot - 1.0, np.ceil(corr(1.0)))
        mix = 1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)
        if fs < 1:
            mag = 1 + 0.1 * np.log(1 / fs)
    theta = pos * extrap * (fs * (1 - mix) + mix)
    return theta, mag


def rope(x, pos, hp, base, neox, scaled=True):
    # x: [n_heads, hd]
    hd = x.shape[-1]
    th, mag = rope_angles(hp, base, hd, pos, scaled)
    c, s = np.cos(th) * mag, np.sin(th) * mag
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


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def hidden(path, ids, model=None):
    """Every position's final-normed hidden state (what the LM head reads), [T][n_embd]."""
    hp, w = model or load(path)
    arch = hp["arch"]
    neox = arch in ARCH_NEOX
    nh, nkv, hd = hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    if "rope_freqs.weight" in w and arch == "llama":
        hp = dict(hp, freq_factors=w["rope_freqs.weight"])
    x = w["token_embd.weight"][ids]
    T, d = x.shape
    if arch == "gemma3":
        x = x * np.sqrt(d)
    scale = 1 / np.sqrt(hd)

    def norm(v, g):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + hp["eps"]) * g

    for l in range(hp["n_layer"]):
        p = f"blk.{l}."
        h = norm(x, w[p + "attn_norm.weight"])
        if p + "attn_qkv.weight" in w:
            qkv = h @ w[p + "attn_qkv.weight"].T
            q, k, v = np.split(qkv, [nh * hd, nh * hd + nkv * hd], axis=1)
        else:
            q = h @ w[p + "attn_q.weight"].T + w.get(p + "attn_q.bias", 0)
            k = h @ w[p + "attn_k.weight"].T + w.get(p + "attn_k.bias", 0)
            v = h @ w[p + "attn_v.weight"].T + w.get(p + "attn_v.bias", 0)
        q, k = q.reshape(T, nh, hd), k.reshape(T, nkv, hd)
        if p + "attn_q_norm.weight" in w:
            q, k = norm(q, w[p + "attn_q_norm.weight"]), norm(k, w[p + "attn_k_norm.weight"])
        local = hp["window"][l]
        base = hp["base_l"][l]
        q = np.stack([rope(q[t], t, hp, base, neox, not local) for t in range(T)])
        k = np.stack([rope(k[t], t, hp, base, neox, not local) for t in range(T)])
        v = v.reshape(T, nkv, hd)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        if local:  # a query sees itself and the local - 1 positions before it
            mask = mask + np.tril(np.full((T, T), -np.inf), -local)
        out = np.zeros((T, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh] @ k[:, g].T * scale + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, hh] = s @ v[:, g]
        att = out.reshape(T, nh * hd) @ w[p + "attn_output.weight"].T
        if p + "post_attention_norm.weight" in w:
            att = norm(att, w[p + "post_attention_norm.weight"])
        x = x + att
        h = norm(x, w[p + "ffn_norm.weight"])
        if p + "ffn_gate.weight" in w:
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        else:  # phi3: gate and up fused, gate first
            gate, up = np.split(h @ w[p + "ffn_up.weight"].T, 2, axis=1)
        act = gelu_tanh(gate) if arch == "gemma3" else gate / (1 + np.exp(-gate))
        ffn = (act * up) @ w[p + "ffn_down.weight"].T
        if p + "post_ffw_norm.weight" in w:
            ffn = norm(ffn, w[p + "post_ffw_norm.weight"])
        x = x + ffn
    return norm(x, w["output_norm.weight"])


def logits(path, ids, model=None):
    hp, w = model or load(path)
    out_w = w.get("output.weight", w["token_embd.weight"])
    return hidden(path, ids, (hp, w))[-1] @ out_w.T


def embedding(path, ids, model=None):
    """The mean of the final-normed hidden states, scaled to length 1 (llama.cpp's pooling
    "mean", normalised)."""
    v = hidden(path, ids, model).mean(0)
    return v / np.linalg.norm(v)


if __name__ == "__main__":
    ids = [int(t) for t in sys.argv[2].split(",")]
    print(int(np.argmax(logits(sys.argv[1], ids))))
