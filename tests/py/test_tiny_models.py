"""Every architecture and tensor type, on the tiny deterministic fixture models
(build/fixtures, written by tests/make_fixtures.py):
- `--exact` (f32 activations) equals an independent float64 numpy forward pass
  (tests/reference/numpy_forward.py, weights dequantised by the gguf package);
- the default path (activations quantised per block, as llama.cpp does) agrees
  with llama.cpp's recorded logits (tests/fixtures/ref_tiny_logits.npz)."""
import sys

import numpy as np
import pytest
from gguf import RopeScalingType

from conftest import FIXTURES, REF, ROOT, run

sys.path.insert(0, str(ROOT / "tests" / "reference"))
import numpy_forward  # noqa: E402
from record_tiny_logits import IDS  # noqa: E402

MODELS = sorted(p.stem for p in FIXTURES.glob("tiny_*.gguf"))
# the other architectures and RoPE scalings (make_fixtures.write_tiny_families)
FAMILIES = ("tiny_qwen3", "tiny_qwen3_q8_0", "tiny_gemma3", "tiny_gemma3_pattern3", "tiny_phi3", "tiny_phi3_q4_0",
            "tiny_llama_rope_linear", "tiny_llama_rope_yarn", "tiny_llama_rope_freqs")
F32_FAMILIES = ("tiny_qwen3", "tiny_gemma3", "tiny_phi3", "tiny_llama_rope_linear", "tiny_llama_rope_yarn",
                "tiny_llama_rope_freqs")


def ours(path, ids, tmp_path, *flags):
    out = tmp_path / "l.bin"
    run("logits", "-m", path, "--tokens", ",".join(map(str, ids)), "-o", out, *flags, check=True)
    return np.fromfile(out, dtype=np.float32)


def test_fixture_set_is_complete():
    for name in ("tiny_llama", "tiny_llama_untied", "tiny_qwen2", "tiny_llama_q8_0", "tiny_llama_q4_0",
                 "tiny_llama_q4_1", "tiny_llama_q4_k", "tiny_llama_q5_k", "tiny_llama_q6_k",
                 "tiny_llama_f16", "tiny_llama_bf16", "tiny_llama_mixed") + FAMILIES:
        assert name in MODELS


@pytest.mark.parametrize("name", MODELS)
def test_exact_path_equals_numpy_reference(name, tmp_path):
    path = FIXTURES / f"{name}.gguf"
    model = numpy_forward.load(str(path))
    for ids in IDS:
        ref = numpy_forward.logits(str(path), ids, model)
        got = ours(path, ids, tmp_path, "--exact")
        rel = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
        assert rel <= 1e-4, f"{name}: max relative error {rel:.2e}"


def against_llama_cpp(name, tmp_path):
    """(j, our logits, llama.cpp's, their cosine) for each test string."""
    ref = np.load(REF / "ref_tiny_logits.npz")
    for j, ids in enumerate(IDS):
        want = ref[f"{name}/{j}"]
        got = ours(FIXTURES / f"{name}.gguf", ids, tmp_path)
        yield j, got, want, float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))


@pytest.mark.parametrize("name", MODELS)
def test_default_path_agrees_with_llama_cpp(name, tmp_path):
    for j, got, want, cos in against_llama_cpp(name, tmp_path):
        assert cos >= 0.999, f"{name}/{j}: cosine {cos:.6f}"
        assert int(np.argmax(got)) == int(np.argmax(want)), f"{name}/{j}: argmax differs"


@pytest.mark.parametrize("name", F32_FAMILIES)
def test_families_agree_closely_with_llama_cpp(name, tmp_path):
    """With F32 weights only the activation rounding differs from llama.cpp:
    a closer bound than the cosine above, which a feature slightly off (a
    sliding layer's RoPE base, the window by one) would still pass."""
    for j, got, want, cos in against_llama_cpp(name, tmp_path):
        rel = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert cos >= 0.99999 and rel <= 2e-3, f"{name}/{j}: cosine {cos:.7f}, max relative error {rel:.2e}"


@pytest.mark.parametrize("kind, kwargs, message", [
    ("arch", dict(arch="mamba"), "model: architecture 'mamba' is not supported (supported: llama, qwen2, qwen3, "
                                  "gemma3, phi3)"),
    ("longrope", dict(keys={"add_rope_scaling_type": RopeScalingType.LONGROPE, "add_rope_scaling_factor": 4.0}),
     "model: RoPE scaling 'longrope' is not supported (supported: none, linear, yarn, llama3 rope_freqs)"),
    ("yarn log multiplier", dict(keys={"add_rope_scaling_type": RopeScalingType.YARN, "add_rope_scaling_factor": 4.0,
                                       "add_rope_scaling_yarn_log_mul": 0.1}),
     "model: RoPE scaling 'yarn' with yarn_log_multiplier is not supported"),
    ("qwen3 without QK-norm", dict(arch="qwen3"), "model: missing tensor blk.0.attn_q_norm.weight"),
])
def test_unsupported_model_is_a_one_line_error(kind, kwargs, message, tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    import make_fixtures
    path = tmp_path / f"{kind.replace(' ', '_')}.gguf"
    make_fixtures.write_model(str(path), **kwargs)
    p = run("info", "-m", path)
    assert p.returncode != 0
    err = p.stderr.decode().strip()
    assert message in err and len(err.splitlines()) == 1, err
