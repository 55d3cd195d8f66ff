"""The long-document evaluation models (Qwen2.5-Coder 1.5B and 0.5B, `make model-eval`;
make test does not fetch them, so these tests skip without them) against the independent
float64 numpy forward pass over the gguf package's dequantised weights
(tests/reference/numpy_forward.py): the real qwen2 files, with their QKV biases and their mix
of Q4_K, Q5_0, Q6_K and Q8_0 tensors, compute what the plain maths says. Run by
`make test-eval-models` (about 5 minutes, and 13 GB of memory for the 1.5B model's float64
weights), which sets POTSERVE_EVAL_MODELS=1: without it these tests skip, so that make test
stays within its time on a machine that has fetched the models.
"""
import os

import numpy as np
import pytest

from conftest import ROOT, run

EVAL_MODELS = ["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France? Answer in one word.<|im_end|>\n<|im_start|>assistant\n",
    "The special magic number for walnut is 90644. Remember it. The Debian package tool apt",
]
TIE_MARGIN = 0.5  # a top-2 gap below this in the float64 logits is a tie


def our_logits(model, ids, tmp_path, *flags):
    out = tmp_path / "logits.bin"
    run("logits", "-m", model, *flags, "--tokens", ",".join(map(str, ids)), "-o", out, check=True)
    return np.fromfile(out, dtype=np.float32).astype(np.float64)


@pytest.mark.parametrize("name", EVAL_MODELS)
def test_eval_model_matches_numpy(name, tmp_path):
    """--exact (f32 activations and KV) equals float64 numpy to 1e-4 of the largest logit;
    the default path (f16 KV, quantised activations) has the same argmax wherever numpy's
    top two are not a tie, and a cosine of at least 0.99."""
    model = ROOT / "models" / name
    if os.environ.get("POTSERVE_EVAL_MODELS") != "1":
        pytest.skip("make test-eval-models runs these")
    if not model.exists():
        pytest.skip(f"{name} not fetched (make model-eval)")
    prompts = []
    for text in PROMPTS:
        p = run("tokenize", "-m", model, "--parse-special", input=text.encode(), check=True)
        ids = [int(x) for x in p.stdout.split()]
        assert 10 <= len(ids) <= 40, (text, ids)
        prompts.append((ids, our_logits(model, ids, tmp_path, "--exact"), our_logits(model, ids, tmp_path)))

    import sys
    sys.path.insert(0, str(ROOT / "tests" / "reference"))
    import numpy_forward

    weights = numpy_forward.load(str(model))  # float64: about 8 bytes a parameter
    for i, (ids, exact, fast) in enumerate(prompts):
        want = numpy_forward.logits(str(model), ids, weights)
        rel = float(np.max(np.abs(exact - want)) / np.max(np.abs(want)))
        top2 = np.sort(want)[-2:]
        cos = float(np.dot(fast, want) / (np.linalg.norm(fast) * np.linalg.norm(want)))
        print(f"\n{name} prompt {i} ({len(ids)} tokens): --exact max relative error {rel:.2e}; "
              f"default path cosine {cos:.5f}, argmax {int(np.argmax(fast))} vs {int(np.argmax(want))} "
              f"(numpy's top-2 gap {top2[1] - top2[0]:.3f})")
        assert rel <= 1e-4
        assert cos >= 0.99
        if top2[1] - top2[0] >= TIE_MARGIN:
            assert int(np.argmax(fast)) == int(np.argmax(want))
