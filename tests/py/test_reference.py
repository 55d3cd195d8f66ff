"""The default model against llama.cpp's recorded reference
(tests/fixtures/ref_logits.npz, written by tests/reference/record_logits.py):
last-position logits and greedy continuations on the same GGUF file."""
import json

import numpy as np
import pytest

from conftest import REF, ROOT, run


@pytest.fixture(scope="module")
def ref():
    return np.load(REF / "ref_logits.npz")


def our_logits(model, ids, tmp_path):
    out = tmp_path / "logits.bin"
    run("logits", "-m", model, "--tokens", ",".join(map(str, ids)), "-o", out, check=True)
    return np.fromfile(out, dtype=np.float32)


def cosine(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_prompt_tokens_match_llama_cpp(model, ref):
    """Our tokenizer gives the ids llama.cpp used for every reference prompt."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("record_logits", ROOT / "tests/reference/record_logits.py")
    rl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rl)
    for i, text in enumerate(rl.PROMPTS):
        p = run("tokenize", "-m", model, "--parse-special", input=text.encode(), check=True)
        ours = [int(x) for x in p.stdout.split()]
        assert ours == ref[f"ids_{i}"].tolist(), f"prompt {i}: {text!r}"


# This 135M Q4_1 model is numerically fragile: llama.cpp disagrees with
# itself when only its KV-cache precision changes (f16 -> f32): logit cosines
# down to ~0.996 and only about a third of the greedy 32-token continuations
# identical (recorded in the fixture as self_cos / self_greedy_same). The
# checks below hold potserve to that same yardstick; bit-level agreement is
# checked separately against the float64 reference (test_exact_matches_numpy).
# Measured here (llama-cpp-python 0.3.36): llama.cpp default vs f32 KV, min
# cosine 0.9963, largest logit difference ~1.0; default vs flash attention,
# min cosine 0.979.
TIE_MARGIN = 0.25     # a top-2 gap below this in llama.cpp's logits is a tie
GREEDY_MARGIN = 0.5   # half of llama.cpp's own largest logit movement
MIN_COSINE = 0.98     # llama.cpp's flash-attention setting alone reaches 0.979


def test_last_logits_match_llama_cpp(model, ref, tmp_path):
    n = int(ref["n"])
    assert n >= 20
    report = []
    for i in range(n):
        ids = ref[f"ids_{i}"].tolist()
        ours = our_logits(model, ids, tmp_path)
        theirs = ref[f"logits_{i}"].astype(np.float32)
        assert ours.shape == theirs.shape
        top2 = np.sort(theirs)[-2:]
        report.append({"prompt": i, "cosine": cosine(ours, theirs),
                       "llama_self_cosine": float(ref["self_cos"][i]),
                       "max_abs_diff": float(np.max(np.abs(ours - theirs))),
                       "argmax_equal": bool(np.argmax(ours) == np.argmax(theirs)),
                       "ref_top2_margin": float(top2[1] - top2[0])})
    (ROOT / "build").mkdir(exist_ok=True)
    (ROOT / "build" / "reference_logits.json").write_text(json.dumps(report, indent=1))
    cos = np.array([r["cosine"] for r in report])
    ours_hi = int(np.sum(cos >= 0.999))
    self_hi = int(np.sum(ref["self_cos"] >= 0.999))
    n_arg = sum(r["argmax_equal"] for r in report)
    print(f"\nlogits vs llama.cpp, {n} prompts: cosine min {cos.min():.5f} median {np.median(cos):.6f}; "
          f">= 0.999 for {ours_hi}/{n} (llama.cpp f16-vs-f32 KV: {self_hi}/{n}); argmax equal {n_arg}/{n}")
    assert cos.min() >= MIN_COSINE
    assert np.median(cos) >= 0.999
    assert ours_hi >= self_hi - 2
    for r in report:
        if r["ref_top2_margin"] > TIE_MARGIN:
            assert r["argmax_equal"], r


def test_greedy_continuations_match_llama_cpp(model, ref, tmp_path):
    n = int(ref["n"])
    same, notes = 0, []
    for i in range(n):
        ids = ref[f"ids_{i}"].tolist()
        want = ref[f"cont_{i}"].tolist()
        p = run("generate", "-m", model, "--tokens", ",".join(map(str, ids)), "-n", len(want),
                "--print-ids", check=True)
        got = [int(x) for x in p.stdout.split()]
        if got == want:
            same += 1
            continue
        k = next(j for j in range(len(want) + 1) if j == len(got) or j == len(want) or got[j] != want[j])
        assert k < len(want) and k < len(got), f"prompt {i}: one continuation stops early at {k}"
        # at the first divergence: how much our logits prefer our token over llama.cpp's
        at = our_logits(model, ids + want[:k], tmp_path)
        margin = float(at[got[k]] - at[want[k]])
        notes.append((i, k, margin))
    self_same = int(ref["self_greedy_same"])
    print(f"\ngreedy 32-token continuations identical to llama.cpp: {same}/{n} "
          f"(llama.cpp with f32 KV vs its default f16 KV: {self_same}/{n})")
    for i, k, margin in notes:
        print(f"  prompt {i}: first differs at token {k}; our logit margin there {margin:.4f}")
    (ROOT / "build" / "reference_greedy.json").write_text(json.dumps(
        {"identical": same, "n": n, "llama_self_identical": self_same,
         "divergences": [{"prompt": i, "token": k, "margin": m} for i, k, m in notes]}, indent=1))
    assert same >= self_same - 2
    # every divergence is a near-tie in our own logits
    for i, k, margin in notes:
        assert 0 <= margin <= GREEDY_MARGIN, (i, k, margin)


def test_exact_matches_numpy(model, ref, tmp_path):
    """--exact (f32 activations) on the real model equals an independent
    float64 numpy forward pass over the gguf package's dequantised weights."""
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "reference"))
    import numpy_forward

    weights = numpy_forward.load(str(model))
    for i in (0, 8):
        ids = ref[f"ids_{i}"].tolist()
        want = numpy_forward.logits(str(model), ids, weights)
        out = tmp_path / "e.bin"
        run("logits", "-m", model, "--exact", "--tokens", ",".join(map(str, ids)), "-o", out, check=True)
        got = np.fromfile(out, dtype=np.float32)
        rel = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        print(f"\nprompt {i}: --exact vs float64 numpy: max relative error {rel:.2e}")
        assert rel <= 1e-4
