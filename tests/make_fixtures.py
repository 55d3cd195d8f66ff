#!/usr/bin/env python3
"""Writes the test fixtures: `python tests/make_fixtures.py OUTDIR`.

Everything is deterministic (fixed seeds, no clock), so two runs give identical
files. Uses the `gguf` package (gguf-py from llama.cpp) for writing GGUF files
and as the reference dequantiser.

(a) quant_<TYPE>.gguf, one per tensor type potserve supports. Each holds a few
    tensors of that type and, for every tensor NAME, a tensor NAME.expected (F32,
    same shape) made with gguf.quants.dequantize. Tensors:
      real.2d   rows of several blocks, quantised from random normal floats
      real.3d   a 3-dimensional tensor (ne = [2 blocks, 3, 2]), same origin
      rand.2d   random bytes with sane f16 scales
      edge      blocks with edge-case scales (0, -0, subnormal, largest, negative)
                and all-zero / all-one quant bytes
      one       a single block (1-dimensional)
    The key potserve.fixture.type holds the ggml type id of the file.
    quant_F16.gguf / quant_BF16.gguf also hold `allbits` (all 65536 bit patterns,
    ne = [256, 256]) and a conversion table conv.f32 -> conv.f16 / conv.bf16
    (numpy's round-to-nearest-even f32->f16; ggml's f32->bf16).
(b) tiny random models (gpt2-style tokenizer, ChatML template):
      tiny_llama.gguf           llama, n_embd 64, tied embeddings, F32
      tiny_llama_untied.gguf    same plus output.weight
      tiny_qwen2.gguf           qwen2 with attn_q/k/v biases, F32
      tiny_llama_<t>.gguf       matrices in type t (q8_0 q4_0 q4_1 f16 bf16 with
                                n_embd 64; q4_k q5_k q6_k with n_embd 256 and
                                n_ff 256, as K-quant rows need 256 elements);
                                norms stay F32.
      tiny_qwen3*, tiny_gemma3*, tiny_phi3*, tiny_llama_rope_*: the other
                                families and RoPE scalings (write_tiny_families).
"""
import os
import re
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

QK_K = 256

# ---------------------------------------------------------------------------
# K-quant quantisers. gguf-py can dequantise K-quants but not quantise them, so
# these build valid blocks from floats: a simple min/max (or abs-max) fit per
# sub-block, not llama.cpp's optimised search, but the same bit layout.
# Packing follows ggml's block_qN_K structs (ggml-common.h).
# ---------------------------------------------------------------------------

f16 = np.float16
f32 = np.float32


def _div(a, b):
    """a / b elementwise, 0 where b == 0."""
    a, b = np.broadcast_arrays(np.asarray(a, f32), np.asarray(b, f32))
    out = np.zeros(a.shape, f32)
    np.divide(a, b, out=out, where=b != 0)
    return out


def _h(x):
    """f32 array -> (f16 bytes as uint8 (..., 2), the f16 value back as f32)."""
    h = np.asarray(x, f32).astype(f16)
    return h.view(np.uint8).reshape(*h.shape, 2), h.astype(f32)


def _asym(xs, levels, scale_bits):
    """Per sub-block scale/min fit for the asymmetric K-quants (value = d*q - m)."""
    mn = np.minimum(xs.min(-1), 0)
    mx = xs.max(-1)
    scale = (mx - mn) / levels
    mins = -mn
    top = (1 << scale_bits) - 1
    dbytes, df = _h(scale.max(-1) / top)
    mbytes, mf = _h(mins.max(-1) / top)
    ls = np.rint(_div(scale, df[:, None])).clip(0, top).astype(np.uint8)
    lm = np.rint(_div(mins, mf[:, None])).clip(0, top).astype(np.uint8)
    dsub = df[:, None] * ls.astype(f32)
    msub = mf[:, None] * lm.astype(f32)
    q = np.rint(_div(xs + msub[..., None], dsub[..., None])).clip(0, levels).astype(np.uint8)
    return dbytes, mbytes, ls, lm, q


def _pack_k4_scales(ls, lm):
    """Eight 6-bit scales and mins into 12 bytes (inverse of get_scale_min_k4)."""
    sc = np.zeros((ls.shape[0], 12), np.uint8)
    sc[:, 0:4] = (ls[:, 0:4] & 63) | ((ls[:, 4:8] >> 4) << 6)
    sc[:, 4:8] = (lm[:, 0:4] & 63) | ((lm[:, 4:8] >> 4) << 6)
    sc[:, 8:12] = (ls[:, 4:8] & 15) | ((lm[:, 4:8] & 15) << 4)
    return sc


def quant_q4_k(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    d, dm, ls, lm, q = _asym(xs, 15, 6)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(nb, 128)
    return np.concatenate([d, dm, _pack_k4_scales(ls, lm), qs], axis=1)


def quant_q5_k(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    d, dm, ls, lm, q = _asym(xs, 31, 6)
    lo = q & 15
    qs = (lo[:, 0::2, :] | (lo[:, 1::2, :] << 4)).reshape(nb, 128)
    qh = np.zeros((nb, 32), np.uint8)
    for k in range(8):
        qh |= ((q[:, k, :] >> 4) & 1) << k
    return np.concatenate([d, dm, _pack_k4_scales(ls, lm), qh, qs], axis=1)


def quant_q2_k(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    d, dm, ls, lm, q = _asym(xs, 3, 4)
    q = q.reshape(nb, 2, 4, 32)  # half, bit pair, byte
    qs = np.zeros((nb, 2, 32), np.uint8)
    for g in range(4):
        qs |= q[:, :, g, :] << (2 * g)
    scales = ls | (lm << 4)
    return np.concatenate([scales, qs.reshape(nb, 64), d, dm], axis=1)


def quant_q3_k(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    scale = np.abs(xs).max(-1) / 4
    dbytes, df = _h(scale.max(-1) / 31)
    ls = np.rint(_div(scale, df[:, None])).clip(0, 31).astype(np.int32)
    q = np.rint(_div(xs, (df[:, None] * ls.astype(f32))[..., None])).clip(-4, 3).astype(np.int32)
    u = (q + 4).reshape(nb, 2, 4, 32).astype(np.uint8)
    qs = np.zeros((nb, 2, 32), np.uint8)
    hm = np.zeros((nb, 32), np.uint8)
    for half in range(2):
        for g in range(4):
            qs[:, half, :] |= (u[:, half, g, :] & 3) << (2 * g)
            hm |= (u[:, half, g, :] >> 2) << (4 * half + g)
    s = (ls + 32).astype(np.uint8)  # 6-bit, offset 32
    sb = np.zeros((nb, 12), np.uint8)
    sb[:, 0:8] = (s[:, 0:8] & 15) | ((s[:, 8:16] & 15) << 4)
    for i in range(4):
        for j in range(4):
            sb[:, 8 + i] |= ((s[:, i + 4 * j] >> 4) & 3) << (2 * j)
    return np.concatenate([hm, qs.reshape(nb, 64), sb, dbytes], axis=1)


def quant_q6_k(x):
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    scale = np.abs(xs).max(-1) / 31
    dbytes, df = _h(scale.max(-1) / 127)
    ls = np.rint(_div(scale, df[:, None])).clip(0, 127).astype(np.int8)
    q = np.rint(_div(xs, (df[:, None] * ls.astype(f32))[..., None])).clip(-32, 31).astype(np.int32)
    u = (q + 32).astype(np.uint8).reshape(nb, 2, 4, 32)  # half, quarter, l
    a, b, c, e = u[:, :, 0], u[:, :, 1], u[:, :, 2], u[:, :, 3]
    ql = np.concatenate([(a & 15) | ((c & 15) << 4), (b & 15) | ((e & 15) << 4)], axis=2)
    qh = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)
    return np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64), ls.view(np.uint8), dbytes], axis=1)


K_QUANTISERS = {T.Q2_K: quant_q2_k, T.Q3_K: quant_q3_k, T.Q4_K: quant_q4_k,
                T.Q5_K: quant_q5_k, T.Q6_K: quant_q6_k}

# Byte offsets of the f16 scale fields inside one block, per type.
SCALE_OFFSETS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}

BLOCK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]


def quantize(x, qtype):
    """float array (..., n) -> ggml bytes (..., n / block * block_bytes) as uint8."""
    x = np.ascontiguousarray(x, dtype=f32)
    if qtype == T.F32:
        return x
    if qtype == T.F16:
        return x.astype(f16)
    if qtype in K_QUANTISERS:
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        blocks = K_QUANTISERS[qtype](x.reshape(-1, bs))
        assert blocks.shape[1] == ts, (qtype, blocks.shape)
        return blocks.reshape(*x.shape[:-1], x.shape[-1] // bs * ts)
    return gguf.quants.quantize(x, qtype)


def dequantize(data, qtype):
    return np.asarray(gguf.quants.dequantize(data, qtype), dtype=f32)


def check_quantiser(qtype, rng):
    """The hand-written quantisers must round-trip through gguf's dequantiser."""
    if qtype not in K_QUANTISERS:
        return
    x = rng.standard_normal((8, QK_K)).astype(f32)
    y = dequantize(quantize(x, qtype), qtype)
    rel = float(np.sqrt(np.mean((x - y) ** 2)) / np.sqrt(np.mean(x ** 2)))
    limit = {T.Q2_K: 0.45, T.Q3_K: 0.3, T.Q4_K: 0.12, T.Q5_K: 0.06, T.Q6_K: 0.03}[qtype]
    assert rel < limit, f"{qtype.name} quantiser round trip rms error {rel:.3f}"


def sane_scales(rng, n):
    """f16 scale values as a real model has them, plus a few sign flips."""
    v = (rng.standard_normal(n) * 0.01).astype(f32)
    v[rng.random(n) < 0.1] *= -1
    return v.astype(f16)


def set_scales(blocks, qtype, values):
    """Overwrite every f16 scale field of each block with the given f16 values (n_blocks, n_fields)."""
    for k, off in enumerate(SCALE_OFFSETS[qtype]):
        blocks[:, off:off + 2] = values[:, k].astype(f16).view(np.uint8).reshape(-1, 2)


def random_blocks(rng, qtype, n_blocks):
    _, ts = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    fields = len(SCALE_OFFSETS[qtype])
    set_scales(blocks, qtype, sane_scales(rng, n_blocks * fields).reshape(n_blocks, fields))
    return blocks


def edge_blocks(rng, qtype):
    """Blocks with edge-case scales; random quants, then all-0x00 and all-0xff quants."""
    specials = np.array([0.0, -0.0, 6e-8, -6e-8, 1e-5, 65504.0, -65504.0, 1.0, -1.0, 0.5], f16)
    fields = len(SCALE_OFFSETS[qtype])
    rows = []
    for i, s in enumerate(specials):
        b = random_blocks(rng, qtype, 1)
        other = specials[(i + 3) % len(specials)]
        set_scales(b, qtype, np.array([[s, other][:fields]], f16))
        rows.append(b)
    for fill in (0x00, 0xFF):
        _, ts = gguf.GGML_QUANT_SIZES[qtype]
        b = np.full((1, ts), fill, np.uint8)
        set_scales(b, qtype, np.array([[0.25, -0.125][:fields]], f16))
        rows.append(b)
    return np.concatenate(rows, axis=0)


def new_writer(path, arch):
    return gguf.GGUFWriter(path, arch)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def add_quant_tensor(w, name, data, qtype):
    """Adds a tensor given as its ggml bytes (or float data for F32/F16)."""
    if qtype in (T.F32, T.F16):
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, np.ascontiguousarray(data).view(np.uint8), raw_dtype=qtype)


def write_quant_fixture(outdir, qtype, seed):
    rng = np.random.default_rng(seed)
    check_quantiser(qtype, rng)
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    w = new_writer(os.path.join(outdir, f"quant_{qtype.name}.gguf"), "potserve-fixture")
    w.add_uint32("potserve.fixture.type", int(qtype))
    tensors = {}

    # Rows several blocks long (for 1-element "blocks" use a longer row).
    blk = bs if bs > 1 else 32
    real2 = rng.standard_normal((4, 4 * blk)).astype(f32) * np.float32(0.7)
    real3 = rng.standard_normal((2, 3, 2 * blk)).astype(f32)
    one = rng.standard_normal((blk,)).astype(f32) * np.float32(3.0)

    if qtype == T.F32:
        tensors["real.2d"] = real2
        tensors["real.3d"] = real3
        tensors["one"] = one
        sp = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1e-45, -1e-40, 3.4028235e38,
                       -3.4028235e38, 1.17549435e-38, 1.0, -2.5], f32)
        edge = np.resize(sp, 2 * blk).astype(f32)
        tensors["edge"] = edge.reshape(2, blk)
        tensors["rand.2d"] = rng.integers(0, 2**32, size=(3, blk), dtype=np.uint32).view(f32)
    elif qtype in (T.F16, T.BF16):
        tensors["real.2d"] = quantize(real2, qtype)
        tensors["real.3d"] = quantize(real3, qtype)
        tensors["one"] = quantize(one, qtype)
        bits = rng.integers(0, 2**16, size=(3, blk), dtype=np.uint16)
        tensors["rand.2d"] = bits.view(f16) if qtype == T.F16 else bits.view(np.uint8).reshape(3, 2 * blk)
        allbits = np.arange(65536, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
        tensors["allbits"] = allbits.view(f16) if qtype == T.F16 else allbits.view(np.uint8).reshape(256, 512)
        # edge: +-0, smallest/largest subnormal, smallest normal, largest finite, inf, nan
        if qtype == T.F16:
            e = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff,
                          0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x3c00, 0xbc00, 0x3555, 0x0200], np.uint16)
        else:
            e = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f,
                          0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x3f80, 0xbf80, 0x3eab, 0x0040], np.uint16)
        e = np.resize(e, 2 * blk).reshape(2, blk)
        tensors["edge"] = e.view(f16) if qtype == T.F16 else e.view(np.uint8).reshape(2, 2 * blk)
    else:
        tensors["real.2d"] = quantize(real2, qtype)
        tensors["real.3d"] = quantize(real3, qtype)
        tensors["one"] = quantize(one, qtype)
        tensors["rand.2d"] = random_blocks(rng, qtype, 5 * 3).reshape(5, 3 * ts)
        eb = edge_blocks(rng, qtype)  # 12 blocks
        tensors["edge"] = eb.reshape(6, 2 * ts)

    for name, data in tensors.items():
        if qtype in (T.F32, T.F16):
            ref = np.asarray(data, f32) if qtype == T.F32 else dequantize(data, qtype)
        else:
            ref = dequantize(data, qtype)
        add_quant_tensor(w, name, data, qtype)
        w.add_tensor(name + ".expected", np.ascontiguousarray(ref, dtype=f32))

    if qtype in (T.F16, T.BF16):
        conv = conversion_inputs(rng, qtype)
        w.add_tensor("conv.f32", conv)
        if qtype == T.F16:
            with np.errstate(over="ignore"):
                w.add_tensor("conv.f16", conv.astype(f16))
        else:
            w.add_tensor("conv.bf16", gguf.quants.quantize(conv, T.BF16), raw_dtype=T.BF16)
    finish(w)


def conversion_inputs(rng, qtype):
    """f32 values that exercise f32 -> half/bfloat16 rounding: ties, subnormals, overflow."""
    v = [rng.standard_normal(256).astype(f32) * np.float32(10.0) ** rng.integers(-9, 6, 256).astype(f32)]
    if qtype == T.F16:
        # exact midpoints between neighbouring finite halves (ties), and +-1 ulp around them
        h = rng.integers(0, 0x7bff, 256).astype(np.uint16)
        lo = h.view(f16).astype(np.float64)
        hi = (h + 1).view(f16).astype(np.float64)
        mid = ((lo + hi) / 2).astype(f32)
        v += [mid, -mid, np.nextafter(mid, f32(np.inf)), np.nextafter(mid, f32(0))]
        v.append(np.array([65504, 65519, 65519.996, 65520, 65536, 1e6, 2.0**-24, 2.0**-25,
                           1.5 * 2.0**-25, 2.0**-26, 3 * 2.0**-25, 2.0**-14, 2.0**-14 - 2.0**-25,
                           1e-30, 0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 1.0 + 2.0**-11,
                           1.0 + 3 * 2.0**-11, 2049.0, 2051.0], f32))
    else:
        b = rng.integers(0, 0x7f7f, 256).astype(np.uint32)
        tie = ((b << 16) | 0x8000).astype(np.uint32).view(f32)
        v += [tie, -tie, np.nextafter(tie, f32(np.inf)), np.nextafter(tie, f32(0))]
        v.append(rng.integers(0, 2**32, 256, dtype=np.uint32).view(f32))
        v.append(np.array([3.4028235e38, 3.39e38, 1e-40, 1e-45, 0.0, -0.0, np.inf, -np.inf,
                           np.nan, 1.0, 1.00390625, 1.01171875], f32))
    out = np.concatenate(v).astype(f32)
    return out


# ---------------------------------------------------------------------------
# Tokenizer: byte-level BPE (gpt2 style) trained on a fixed text.
# ---------------------------------------------------------------------------

CORPUS = """The quick brown fox jumps over the lazy dog. Hello world! Hello there, how are you?
I am fine, thank you. What is the capital of France? The capital of France is Paris.
Explain in two sentences what a memory pot is for long documents. A memory pot keeps the
important parts of a long document so that the model can answer questions about it later.
Once upon a time there was a little robot that liked to read books in the library.
The weather is nice today and the sun is shining over the hills and the river.
1 2 3 4 5 6 7 8 9 10 100 2024 3.14 <html> x = y + 1; print("hello")
"""

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def bytes_to_unicode():
    """GPT-2's byte -> printable unicode map, in GPT-2's order (printable bytes first)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, [chr(c) for c in cs]


def make_tokenizer(n_vocab, specials=SPECIALS):
    bs, cs = bytes_to_unicode()
    b2u = dict(zip(bs, cs))
    tokens = list(cs)  # ids 0..255 in GPT-2 order
    n_merges = n_vocab - 256 - len(specials)
    pat = re.compile(r"""'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")
    words = {}
    for piece in pat.findall(CORPUS):
        sym = tuple(b2u[b] for b in piece.encode("utf-8"))
        words[sym] = words.get(sym, 0) + 1
    merges = []
    vocab = set(tokens)
    while len(merges) < n_merges:
        pairs = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        merged = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        if merged not in vocab:
            vocab.add(merged)
            tokens.append(merged)
        nw = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] = nw.get(tuple(out), 0) + c
        words = nw
    assert len(tokens) == 256 + n_merges, "corpus too small for the requested vocab"
    types = [1] * len(tokens) + [3] * len(specials)
    tokens += specials
    return tokens, types, merges


def add_tokenizer(w, n_vocab, chat_template=CHAT_TEMPLATE, specials=SPECIALS, add_bos=False):
    tokens, types, merges = make_tokenizer(n_vocab, specials)
    assert len(tokens) == n_vocab
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(add_bos)
    w.add_chat_template(chat_template)


# ---------------------------------------------------------------------------
# Tiny models
# ---------------------------------------------------------------------------

FILE_TYPES = {
    T.F32: gguf.LlamaFileType.ALL_F32, T.F16: gguf.LlamaFileType.MOSTLY_F16,
    T.BF16: gguf.LlamaFileType.MOSTLY_BF16, T.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    T.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0, T.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
    T.Q4_K: gguf.LlamaFileType.MOSTLY_Q4_K_M, T.Q5_K: gguf.LlamaFileType.MOSTLY_Q5_K_M,
    T.Q6_K: gguf.LlamaFileType.MOSTLY_Q6_K,
}


def write_model(path, arch="llama", qtype=T.F32, n_embd=64, n_ff=128, n_layer=2, n_head=4,
                n_head_kv=2, n_vocab=300, n_ctx=256, tied=True, bias=False, rope_base=10000.0,
                seed=1234, mix=None, head_dim=None, qk_norm=False, post_norms=False, fused=False,
                keys=None, rope_freqs=None, name=None, chat_template=CHAT_TEMPLATE, specials=SPECIALS, add_bos=False,
                u32=None):
    """mix: tensor kind ("attn_k", "ffn_up", ...) -> a type other than qtype.
    head_dim: other than n_embd / n_head (written as key/value_length);
    qk_norm: attn_q_norm / attn_k_norm per head (qwen3, gemma3); post_norms:
    post_attention_norm / post_ffw_norm (gemma3); fused: attn_qkv and a
    double-height ffn_up (phi3); keys: name -> method of GGUFWriter and its
    argument (e.g. {"add_sliding_window": 4}); rope_freqs: the llama3
    per-pair factors tensor; name: general.name (default: the file's stem)."""
    rng = np.random.default_rng(seed)
    if head_dim is None:
        head_dim = n_embd // n_head
    else:
        keys = dict(keys or {}, add_key_length=head_dim, add_value_length=head_dim)
    n_q = n_head * head_dim
    n_kv = n_head_kv * head_dim
    w = new_writer(path, arch)
    w.add_name(name or os.path.splitext(os.path.basename(path))[0])
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(int(FILE_TYPES[qtype]))
    if qtype != T.F32:
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for method, value in (keys or {}).items():
        getattr(w, method)(value)
    for key, value in (u32 or {}).items():  # (metadata keys the writer has no method for)
        w.add_uint32(key, value)
    add_tokenizer(w, n_vocab, chat_template, specials, add_bos)

    def mat(name, n_in, n_out, std=None):
        # numpy shape (n_out, n_in) == gguf ne [n_in, n_out]
        s = np.float32(std if std is not None else 1.0 / np.sqrt(n_in))
        x = rng.standard_normal((n_out, n_in)).astype(f32) * s
        t = (mix or {}).get(name.split(".")[-2], qtype)
        add_quant_tensor(w, name, quantize(x, t), t)

    def vec(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, (np.float32(mean) + rng.standard_normal(n).astype(f32) * np.float32(std)))

    mat("token_embd.weight", n_embd, n_vocab, std=0.5)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, f32))
    for i in range(n_layer):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", n_embd)
        if fused:
            mat(p + "attn_qkv.weight", n_embd, n_q + 2 * n_kv)
        else:
            mat(p + "attn_q.weight", n_embd, n_q)
            mat(p + "attn_k.weight", n_embd, n_kv)
            mat(p + "attn_v.weight", n_embd, n_kv)
        if bias:
            vec(p + "attn_q.bias", n_q, 0.0, 0.1)
            vec(p + "attn_k.bias", n_kv, 0.0, 0.1)
            vec(p + "attn_v.bias", n_kv, 0.0, 0.1)
        if qk_norm:
            vec(p + "attn_q_norm.weight", head_dim)
            vec(p + "attn_k_norm.weight", head_dim)
        mat(p + "attn_output.weight", n_q, n_embd)
        if post_norms:
            vec(p + "post_attention_norm.weight", n_embd)
        vec(p + "ffn_norm.weight", n_embd)
        if fused:
            mat(p + "ffn_up.weight", n_embd, 2 * n_ff)
        else:
            mat(p + "ffn_gate.weight", n_embd, n_ff)
            mat(p + "ffn_up.weight", n_embd, n_ff)
        mat(p + "ffn_down.weight", n_ff, n_embd)
        if post_norms:
            vec(p + "post_ffw_norm.weight", n_embd)
    vec("output_norm.weight", n_embd)
    if not tied:
        mat("output.weight", n_embd, n_vocab)
    finish(w)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_fixtures.py OUTDIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    quant_types = [T.F32, T.F16, T.BF16] + BLOCK_TYPES
    for qt in quant_types:
        write_quant_fixture(out, qt, seed=1000 + int(qt))

    write_model(os.path.join(out, "tiny_llama.gguf"))
    write_model(os.path.join(out, "tiny_llama_untied.gguf"), tied=False)
    write_model(os.path.join(out, "tiny_qwen2.gguf"), arch="qwen2", bias=True, rope_base=1000000.0,
                seed=4321)
    for qt in (T.Q8_0, T.Q4_0, T.Q4_1, T.F16, T.BF16):
        write_model(os.path.join(out, f"tiny_llama_{qt.name.lower()}.gguf"), qtype=qt)
    # one model of several types whose activation formats differ inside a
    # layer (Q8_1 for Q4_1 / Q5_1, Q8_0 for Q8_0 / Q4_0 / Q5_0, f16 for F16):
    # the products that share an input are fused only where the formats agree
    write_model(os.path.join(out, "tiny_llama_mixed.gguf"), qtype=T.Q4_1, seed=2468,
                mix={"attn_k": T.Q8_0, "attn_v": T.Q4_0, "attn_output": T.F16, "ffn_gate": T.Q5_1,
                     "ffn_up": T.Q5_0, "ffn_down": T.Q8_0})
    for qt in (T.Q4_K, T.Q5_K, T.Q6_K):
        write_model(os.path.join(out, f"tiny_llama_{qt.name.lower()}.gguf"), qtype=qt,
                    n_embd=256, n_ff=256)
    write_tiny_families(out)


def write_tiny_families(out):
    """The other architectures and RoPE variants (issue 24), each on its own
    tiny file; shapes small, but every feature that changes the arithmetic on."""
    # qwen3: QK-norm, no biases, a head size other than n_embd / n_head
    write_model(os.path.join(out, "tiny_qwen3.gguf"), arch="qwen3", head_dim=32, qk_norm=True,
                rope_base=1000000.0, seed=5151)
    write_model(os.path.join(out, "tiny_qwen3_q8_0.gguf"), arch="qwen3", qtype=T.Q8_0, head_dim=32,
                qk_norm=True, rope_base=1000000.0, seed=5152)
    # gemma3: 6 layers (5 sliding : 1 global by default), window 4 so that
    # the test strings (7 and 12 tokens) cross it; the sliding layers' own
    # RoPE base; a second file with a pattern key of 3 and one KV head
    gemma = dict(arch="gemma3", head_dim=32, qk_norm=True, post_norms=True, rope_base=1000000.0)
    write_model(os.path.join(out, "tiny_gemma3.gguf"), n_layer=6, seed=6161,
                keys={"add_sliding_window": 4, "add_rope_freq_base_swa": 10000.0}, **gemma)
    write_model(os.path.join(out, "tiny_gemma3_pattern3.gguf"), n_layer=3, n_head_kv=1, seed=6162,
                qtype=T.Q8_0, keys={"add_sliding_window": 5, "add_sliding_window_pattern": 3}, **gemma)
    # gemma3 with every layer a sliding one (pattern 0): a pot that keeps each
    # window's tail answers exactly as full attention (tests/unit/test_ingest.c);
    # not tiny_*: it has no llama.cpp recording
    write_model(os.path.join(out, "swa_gemma3_local.gguf"), n_layer=2, n_ctx=1024, seed=6163,
                keys={"add_sliding_window": 32, "add_sliding_window_pattern": 0}, **gemma)
    # phi3: fused QKV and gate-up (named without "phi3": llama.cpp then looks up
    # Phi-3's <s> </s> <unk> tokens, which the tiny vocabulary lacks)
    write_model(os.path.join(out, "tiny_phi3.gguf"), arch="phi3", fused=True, n_head_kv=4, seed=7171,
                name="tiny fused-qkv model")
    write_model(os.path.join(out, "tiny_phi3_q4_0.gguf"), arch="phi3", fused=True, qtype=T.Q4_0, seed=7172,
                name="tiny fused-qkv model, q4_0")
    # embedding models: pooled by the last token, with EOS appended (as Qwen3-Embedding's files
    # say), and by the first; /v1/embeddings reads pooling_type (not tiny_*: no logits recording)
    write_model(os.path.join(out, "embed_qwen3_last.gguf"), arch="qwen3", head_dim=32, qk_norm=True,
                rope_base=1000000.0, seed=5153,
                keys={"add_pooling_type": gguf.PoolingType.LAST, "add_add_eos_token": True})
    write_model(os.path.join(out, "embed_llama_cls.gguf"), seed=5154, keys={"add_pooling_type": gguf.PoolingType.CLS})
    # fill-in-the-middle: Qwen2.5-Coder's markers in the vocabulary (detected by their text, as
    # llama.cpp does), one file adding BOS (not tiny_*: no logits recording)
    fim = SPECIALS + ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
    write_model(os.path.join(out, "fim_qwen2.gguf"), arch="qwen2", bias=True, rope_base=1000000.0, seed=4322,
                specials=fim)
    write_model(os.path.join(out, "fim_llama_bos.gguf"), seed=4323, specials=fim, add_bos=True)
    # ... and markers of other texts that only the metadata names
    write_model(os.path.join(out, "fim_llama_ids.gguf"), seed=4324, specials=SPECIALS + ["<A>", "<B>", "<C>"],
                u32={"tokenizer.ggml.fim_pre_token_id": 297, "tokenizer.ggml.fim_suf_token_id": 298,
                     "tokenizer.ggml.fim_mid_token_id": 299})
    # llama RoPE scaling: linear, YaRN (original context 64), llama3's rope_freqs
    write_model(os.path.join(out, "tiny_llama_rope_linear.gguf"), seed=8181,
                keys={"add_rope_scaling_type": gguf.RopeScalingType.LINEAR, "add_rope_scaling_factor": 4.0})
    write_model(os.path.join(out, "tiny_llama_rope_yarn.gguf"), seed=8182,
                keys={"add_rope_scaling_type": gguf.RopeScalingType.YARN, "add_rope_scaling_factor": 4.0,
                      "add_rope_scaling_orig_ctx_len": 64})
    write_model(os.path.join(out, "tiny_llama_rope_freqs.gguf"), seed=8183,
                rope_freqs=[1.0, 1.0, 1.0, 1.5, 2.5, 4.0, 8.0, 8.0])


if __name__ == "__main__":
    main()
