"""Qwen3's enable_thinking switch as a request field, over real HTTP on
loopback: a tiny qwen3 model carrying the real Qwen3 chat template (its text
from tests/fixtures/ref_chat.json) renders the empty think block after the
assistant header only when the request turns thinking off."""
import json
import sys

import pytest

from conftest import REF, ROOT
from server_util import Server

sys.path.insert(0, str(ROOT / "tests"))
import make_fixtures  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3")
    tpl = next(t for t in json.loads((REF / "ref_chat.json").read_text())["templates"] if t["family"] == "qwen3")
    path = d / "tiny_qwen3_chat.gguf"
    make_fixtures.write_model(str(path), arch="qwen3", head_dim=32, qk_norm=True, seed=5151,
                              chat_template=tpl["template"])
    s = Server(d / "data", "--model", path, "--budget-tokens", "64").start()
    yield s
    s.stop()


def prompt_tokens(server, **fields):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
    status, r, _ = server.request("POST", "/v1/chat/completions", body)
    assert status == 200, r
    return r["usage"]["prompt_tokens"]


def test_enable_thinking_false_adds_the_empty_think_block(server):
    default = prompt_tokens(server)
    assert prompt_tokens(server, enable_thinking=True) == default
    off = prompt_tokens(server, enable_thinking=False)
    assert off > default  # "<think>\n\n</think>\n\n" after "<|im_start|>assistant\n"
    assert prompt_tokens(server, chat_template_kwargs={"enable_thinking": False}) == off


@pytest.mark.parametrize("fields", [{"enable_thinking": "no"}, {"chat_template_kwargs": []},
                                    {"chat_template_kwargs": {"enable_thinking": 0}}])
def test_bad_switch_is_a_400(server, fields):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
    status, r, _ = server.request("POST", "/v1/chat/completions", body)
    assert status == 400 and r["error"]["type"] == "invalid_request_error", r
