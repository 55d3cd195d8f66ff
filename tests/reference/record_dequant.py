#!/usr/bin/env python3
"""Records reference dequantisations of a few rows of real tensors of the
default model, for tests/unit/test_quant.c (test quant_smollm2_reference).

    python tests/reference/record_dequant.py [MODEL] [OUT]

MODEL defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf, OUT to
tests/fixtures/ref_dequant_smollm2.bin. The reference is gguf-py's
gguf.quants.dequantize. Output format (little-endian):
    "PSDQ" u32 version (1) u32 n_records
    per record: u32 name_len, name bytes, u32 ggml type, u64 row, u32 n, n x f32
"""
import struct
import sys

import numpy as np
import gguf

# (tensor, rows): Q8_0 token embeddings, Q4_1 matrices of both row lengths, F32 norms.
PICKS = [
    ("token_embd.weight", [0, 1, 2, 1000, 49151]),
    ("blk.0.attn_q.weight", [0, 575]),
    ("blk.0.attn_k.weight", [191]),
    ("blk.0.ffn_down.weight", [0, 575]),
    ("blk.15.attn_output.weight", [300]),
    ("blk.29.ffn_up.weight", [1535]),
    ("blk.0.attn_norm.weight", [0]),
    ("output_norm.weight", [0]),
]


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
    out = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/ref_dequant_smollm2.bin"
    r = gguf.GGUFReader(model)
    by_name = {t.name: t for t in r.tensors}
    records = []
    for name, rows in PICKS:
        t = by_name[name]
        qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
        ne0 = int(t.shape[0])
        n_rows = int(np.prod([int(s) for s in t.shape])) // ne0
        raw = np.asarray(r.data[t.data_offset:t.data_offset + t.n_bytes], dtype=np.uint8)
        row_bytes = len(raw) // n_rows
        for row in rows:
            assert row < n_rows
            rb = raw[row * row_bytes:(row + 1) * row_bytes].copy()
            if qtype == gguf.GGMLQuantizationType.F32:
                vals = rb.view(np.float32)
            else:
                vals = np.asarray(gguf.quants.dequantize(rb, qtype), dtype=np.float32)
            assert vals.shape == (ne0,)
            records.append((name, int(qtype), row, vals))
    with open(out, "wb") as f:
        f.write(b"PSDQ" + struct.pack("<II", 1, len(records)))
        for name, qtype, row, vals in records:
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<IQI", qtype, row, len(vals)))
            f.write(vals.astype("<f4").tobytes())
    print(f"{out}: {len(records)} rows")


if __name__ == "__main__":
    main()
