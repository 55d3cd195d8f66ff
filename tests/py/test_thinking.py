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


def test_reasoning_effort_turns_thinking_off_or_leaves_it_on(server):
    """OpenAI's reasoning_effort: none and minimal render the empty think block as
    enable_thinking false does; low, medium, high and xhigh leave thinking on."""
    default, off = prompt_tokens(server), prompt_tokens(server, enable_thinking=False)
    for effort in ("none", "minimal"):
        assert prompt_tokens(server, reasoning_effort=effort) == off
    for effort in ("low", "medium", "high", "xhigh"):
        assert prompt_tokens(server, reasoning_effort=effort) == default
    assert prompt_tokens(server, reasoning_effort="minimal", enable_thinking=False) == off


@pytest.mark.parametrize("fields,why", [({"reasoning_effort": "extreme"}, "must be none"),
                                        ({"reasoning_effort": 3}, "string"),
                                        ({"reasoning_effort": "minimal", "enable_thinking": True}, "disagree")])
def test_bad_reasoning_effort_is_a_400(server, fields, why):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, **fields}
    status, r, _ = server.request("POST", "/v1/chat/completions", body)
    assert status == 400 and r["error"]["param"] == "reasoning_effort" and why in r["error"]["message"], r


def test_responses_reasoning_effort_is_the_same_switch(server):
    """The Responses API's reasoning.effort (what the Agents SDK and LangChain send for
    reasoning models) counts as chat's reasoning_effort; the response echoes it, with no
    summary (none is written)."""
    def counted(**fields):
        status, r, _ = server.request("POST", "/v1/responses/input_tokens", {"input": "hi", **fields})
        assert status == 200, r
        return r["input_tokens"]
    assert counted(reasoning={"effort": "minimal"}) == counted(enable_thinking=False) > counted()
    assert counted(reasoning={"effort": "high", "summary": "auto"}) == counted()
    status, r, _ = server.request("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 2,
                                                             "reasoning": {"effort": "low", "summary": "auto"}})
    assert status == 200 and r["reasoning"] == {"effort": "low", "summary": None}, r
    for bad, why in [("low", "object"), ({"effort": "lots"}, "must be none")]:
        status, r, _ = server.request("POST", "/v1/responses", {"input": "hi", "reasoning": bad})
        assert status == 400 and r["error"]["param"] == "reasoning" and why in r["error"]["message"], r
