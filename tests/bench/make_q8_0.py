#!/usr/bin/env python3
"""Requantize a GGUF model to Q8_0 (a second weight type for the CPU benchmark).

    python tests/bench/make_q8_0.py IN.gguf OUT.gguf

Every 2-D weight matrix is dequantized (gguf.quants.dequantize) and quantized
again as Q8_0 (gguf.quants.quantize); the other tensors (norms, 1-D) are
written as F32. All metadata and tokenizer key/value pairs are copied, with
general.file_type set to MOSTLY_Q8_0. Writes OUT atomically (OUT.tmp, then a
rename).
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT


def convert(src, dst):
    r = gguf.GGUFReader(src)
    arch = r.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    tmp = dst + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    for field in r.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType.MOSTLY_Q8_0)
        w.add_key_value(field.name, value, vtype, sub_type=sub)
    for t in r.tensors:
        x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        # GGUF shape (ne0, ne1) = numpy shape reversed
        x = x.reshape(tuple(int(d) for d in reversed(t.shape.tolist())))
        if x.ndim == 2 and x.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(x, QT.Q8_0)
            w.add_tensor(t.name, q, raw_dtype=QT.Q8_0)
        else:
            w.add_tensor(t.name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    convert(sys.argv[1], sys.argv[2])
