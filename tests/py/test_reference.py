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


def test_last_logits_match_llama_cpp(model, ref, tmp_path):
    n = int(ref["n"])
    assert n >= 20
    report = []
    for i in range(n):
        ids = ref[f"ids_{i}"].tolist()
        ours = our_logits(model, ids, tmp_path)
        theirs = ref[f"logits_{i}"].astype(np.float32)
        assert ours.shape == theirs.shape
        c = cosine(ours, theirs)
        report.append({"prompt": i, "cosine": c, "max_abs_diff": float(np.max(np.abs(ours - theirs))),
                       "argmax_ours": int(np.argmax(ours)), "argmax_ref": int(np.argmax(theirs))})
        assert c >= 0.999, f"prompt {i}: cosine {c}"
        assert np.argmax(ours) == np.argmax(theirs), f"prompt {i}: argmax differs"
    (ROOT / "build").mkdir(exist_ok=True)
    (ROOT / "build" / "reference_logits.json").write_text(json.dumps(report, indent=1))
    print(f"\nlogits vs llama.cpp: {n} prompts, min cosine {min(r['cosine'] for r in report):.6f}, "
          f"max |diff| {max(r['max_abs_diff'] for r in report):.4f}, argmax equal {n}/{n}")


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
        k = next(j for j in range(min(len(got), len(want)) + 1) if j == len(got) or j == len(want) or got[j] != want[j])
        # the reference's logit margin between its choice and ours at the first divergence
        theirs = our_logits(model, ids + want[:k], tmp_path) if k < len(want) else None
        margin = None
        if theirs is not None and k < len(got):
            margin = float(theirs[want[k]] - theirs[got[k]])
        notes.append(f"prompt {i}: diverges at token {k}; our logit margin there {margin}")
    print(f"\ngreedy 32-token continuations identical to llama.cpp: {same}/{n}")
    for line in notes:
        print("  " + line)
    (ROOT / "build" / "reference_greedy.txt").write_text(f"{same}/{n}\n" + "\n".join(notes) + "\n")
    assert same >= int(np.ceil(0.9 * n)), notes
