"""Shared fixtures for the integration tests: the real binary, the real
default model, the tiny generated GGUFs (build/fixtures)."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("POTSERVE_BIN", ROOT / "build" / "potserve"))
MODEL = pathlib.Path(os.environ.get("POTSERVE_MODEL", ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
FIXTURES = ROOT / "build" / "fixtures"
REF = ROOT / "tests" / "fixtures"
# tests/fault/faultfs.c: an LD_PRELOAD shim that fails or holds one chosen storage call
FAULTFS = ROOT / "build" / "faultfs.so"
# The Makefile's sanitizer runs (make asan, make tsan) set it: their server is
# many times slower, so model-heavy tests there read shorter documents.
SANITIZED = os.environ.get("POTSERVE_SANITIZED") == "1"


def run(*args, input=None, timeout=600, check=False):
    """Runs build/potserve with args; returns the CompletedProcess (bytes)."""
    p = subprocess.run([str(BIN), *map(str, args)], input=input, capture_output=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"potserve {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr.decode()}")
    return p


@pytest.fixture(scope="session")
def model():
    assert MODEL.exists(), f"default model missing at {MODEL}: run `make model`"
    return MODEL


@pytest.fixture(scope="session")
def fixtures():
    assert FIXTURES.exists(), "tiny GGUF fixtures missing: run `make fixtures`"
    return FIXTURES


# The test files that take longest, longest first (worker seconds in make test's two pytest
# stages, 2-core CI VM, --durations=0): pytest-xdist hands out whole files in collection
# order (the Makefile's --no-loadscope-reorder), so the last file to start is a short one
# and no worker waits alone at the end. Other files keep their order after these.
LONGEST_FILES_FIRST = ["test_reliability.py", "test_cluster.py", "test_reread.py", "test_embeddings.py",
                       "test_files.py", "test_web.py", "test_openai_compat.py", "test_structured.py",
                       "test_server.py", "test_recall.py", "test_longdoc.py", "test_http_fuzz.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable)


def pytest_configure(config):
    config.addinivalue_line("markers", "heavy: model-heavy; skipped in the sanitizer run (make asan) to keep it short")


@pytest.fixture(scope="module")
def plain_srv(tmp_path_factory, model):
    """A server with the default settings, one per test module."""
    from server_util import serve
    yield from serve(tmp_path_factory)


@pytest.fixture(scope="module")
def plain_client(plain_srv):
    """The official openai client on plain_srv."""
    from server_util import openai_client
    return openai_client(plain_srv)
