#!/usr/bin/env python3
"""Records llama.cpp's last-position logits for every tiny fixture model
(build/fixtures/tiny_*.gguf, written deterministically by make_fixtures.py):
one architecture or tensor type per file.

    record_tiny_logits.py FIXTURE_DIR OUT.npz [--check]
"""
import argparse
import pathlib
import sys

import numpy as np

IDS = [[5, 77, 130, 200, 250, 12, 9], [297, 40, 41, 42, 298, 120, 33, 7, 7, 7, 1, 2]]


def record(fixture_dir):
    from lcpp import Llama

    out = {}
    for f in sorted(pathlib.Path(fixture_dir).glob("tiny_*.gguf")):
        llm = Llama(model_path=str(f), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
        for j, ids in enumerate(IDS):
            llm.reset()
            llm.eval(ids)
            out[f"{f.stem}/{j}"] = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures")
    ap.add_argument("out")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    got = record(a.fixtures)
    if not a.check:
        np.savez_compressed(a.out, **got)
        print(f"wrote {a.out}: {len(got)} logit vectors")
        return 0
    ref = np.load(a.out)
    bad = [k for k in got if k not in ref or not np.allclose(ref[k], got[k], atol=1e-3)]
    for k in bad:
        print(f"{k}: " + (f"max difference {np.max(np.abs(ref[k] - got[k])):.4g}" if k in ref else "not recorded"))
    print(f"{len(got) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
