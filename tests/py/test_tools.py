"""Tool calls with the official `openai` client against a real server on the
default model (chatml): tool_choice required / named / auto / none,
streamed and not, arguments validated against the tool's schema with
`jsonschema`, a conversation with tool results, and the 400s."""
import json

import jsonschema
import openai
import pytest

from server_util import Server

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "get_time", "description": "Time in a timezone",
                                           "parameters": TIME}}]
SCHEMA_OF = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(plain_client):
    return plain_client


def check_calls(calls, only=None):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in SCHEMA_OF and (only is None or c.function.name == only)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMA_OF[c.function.name])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_makes_a_valid_call(client, seed):
    r = client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=0.9, seed=seed, max_tokens=80)
    assert r.choices[0].finish_reason == "tool_calls"
    check_calls(r.choices[0].message.tool_calls)


def test_named_function_is_the_one_called(client):
    for seed in range(2):
        r = client.chat.completions.create(
            model="x", messages=ASK, tools=TOOLS, temperature=0.9, seed=seed, max_tokens=80,
            tool_choice={"type": "function", "function": {"name": "get_time"}})
        check_calls(r.choices[0].message.tool_calls, only="get_time")


def test_streamed_tool_call_chunks(client):
    """A forced call streams as it is written: its id and name once the name is sure, then its
    arguments a token or so at a time (they came in one delta at the end), which join to the whole
    answer's arguments, as written."""
    chunks = list(client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, stream=True,
                                                 tool_choice="required", temperature=0, max_tokens=80))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    args = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), WEATHER)
    assert len([d for d in deltas if d.function.arguments]) >= 4, deltas  # not one block
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the same as the whole answer
    whole = client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80)
    assert whole.choices[0].message.tool_calls[0].function.arguments == args


def test_forced_call_is_closed_in_max_tokens_or_cut_as_a_call(client):
    """A forced call (required, named) never comes back as the template's
    markup in content: from the fewest tokens a whole call takes, every
    max_tokens gives a complete call whose arguments validate; below it,
    finish_reason "length" and the call as far as it came (OpenAI's shape for
    a call cut by max_tokens: name, arguments not yet valid JSON)."""
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        name = None if choice == "required" else "get_time"  # required: the shortest call may be get_time
        whole_from = None
        for max_tokens in range(6, 50, 3):
            r = client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice=choice,
                                               temperature=0, max_tokens=max_tokens)
            c = r.choices[0]
            assert c.message.content is None, (max_tokens, c.message.content)
            if c.finish_reason == "tool_calls":
                whole_from = whole_from or max_tokens
                check_calls(c.message.tool_calls, only=name)
                continue
            assert whole_from is None, f"cut open at {max_tokens} after whole calls from {whole_from}"
            assert c.finish_reason == "length" and r.usage.completion_tokens == max_tokens
            if c.message.tool_calls:  # else cut before the name was sure: no call
                assert len(c.message.tool_calls) == 1 and c.message.tool_calls[0].function.name in (name or SCHEMA_OF)
        assert whole_from and whole_from < 49, choice
        # streamed, a cut call arrives as tool_calls deltas too
        chunks = list(client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice=choice,
                                                     temperature=0, max_tokens=whole_from - 3, stream=True))
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
        assert deltas[0].function.name in (name or SCHEMA_OF) and chunks[-1].choices[0].finish_reason == "length"


def test_auto_and_none_answer_with_text_or_calls(client):
    for choice in ("auto", "none"):
        r = client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice=choice,
                                           temperature=0, max_tokens=30)
        m = r.choices[0].message
        if m.tool_calls:
            assert choice == "auto"
            check_calls(m.tool_calls)
            assert r.choices[0].finish_reason == "tool_calls"
        else:
            assert m.content and r.choices[0].finish_reason in ("stop", "length")


def test_stop_strings_do_not_cut_a_forced_call(client):
    """tool_choice required with stop "<" (or one inside the arguments) matched the template's own
    markup: no call, or a call with empty arguments, finish_reason "stop"."""
    for stop in (["<"], ["call"], ['"']):
        r = client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice="required",
                                           stop=stop, temperature=0, max_tokens=80)
        assert len(r.choices[0].message.tool_calls or []) == 1, (stop, r)
        check_calls(r.choices[0].message.tool_calls)
        assert r.choices[0].finish_reason == "tool_calls", (stop, r)


# a few turns where the small model called tools itself: it then writes <tool_call> unforced
FEW_SHOT = []
for _i, _city in enumerate(["Rome", "Oslo", "Lima", "Kyiv"]):
    FEW_SHOT += [
        {"role": "user", "content": f"Weather and time in {_city}?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{_i}", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": _city, "unit": "celsius"})}},
            {"id": f"c{_i}b", "type": "function", "function": {
                "name": "get_time", "arguments": json.dumps({"timezone": _city})}}]},
        {"role": "tool", "tool_call_id": f"c{_i}", "content": "20 C"},
        {"role": "tool", "tool_call_id": f"c{_i}b", "content": "12:00"},
        {"role": "assistant", "content": f"20 C in {_city}, 12:00."}]
FEW_SHOT.append({"role": "user", "content": "Weather and time in Paris?"})


def test_a_call_the_model_writes_is_neither_leaked_nor_cut(client):
    """tool_choice auto: an answer max_tokens cut inside a call gave the template's markup as its
    content ('<tool_call>\\n{"name":'), and "tool_calls" when one call before it was whole; a stop
    string ("<") cut the model's own call away. Now a call cut open is dropped, the answer says
    "length", and stop strings apply only to the text before a call."""
    whole = client.chat.completions.create(model="x", messages=FEW_SHOT, tools=TOOLS, temperature=0, max_tokens=200)
    assert whole.choices[0].finish_reason == "tool_calls" and len(whole.choices[0].message.tool_calls) == 2, whole
    used = whole.usage.completion_tokens
    for max_tokens in (used // 3, used * 2 // 3, used - 2):
        for stream in (False, True):
            if stream:
                content, calls, finish = "", {}, None
                for c in client.chat.completions.create(model="x", messages=FEW_SHOT, tools=TOOLS, temperature=0,
                                                        max_tokens=max_tokens, stream=True):
                    d = c.choices[0].delta
                    content += d.content or ""
                    for t in d.tool_calls or []:
                        calls.setdefault(t.index, "")
                    finish = c.choices[0].finish_reason or finish
            else:
                r = client.chat.completions.create(model="x", messages=FEW_SHOT, tools=TOOLS, temperature=0,
                                                   max_tokens=max_tokens)
                content, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
                calls = r.choices[0].message.tool_calls or []
                if calls:
                    check_calls(calls)
            assert "<tool_call" not in content and "</tool_call" not in content, (max_tokens, content)
            assert finish == "length", (max_tokens, stream, finish)
            assert len(calls) < 2, (max_tokens, calls)
    stopped = client.chat.completions.create(model="x", messages=FEW_SHOT, tools=TOOLS, temperature=0,
                                             max_tokens=200, stop=["<", "\n"])
    assert stopped.choices[0].finish_reason == "tool_calls" and len(stopped.choices[0].message.tool_calls) == 2, stopped
    check_calls(stopped.choices[0].message.tool_calls)


def test_streamed_answers_with_tools_send_their_text_as_it_comes(client):
    """tool_choice auto, streamed: the text was held until the answer ended (one chunk), as
    any text might turn into a call. Now it comes token by token as far as it cannot be the
    start of a call's markup; the calls come at the end; both as the whole answer has them."""
    for messages in (ASK, FEW_SHOT):
        whole = client.chat.completions.create(model="x", messages=messages, tools=TOOLS, temperature=0,
                                               max_tokens=60)
        chunks = list(client.chat.completions.create(model="x", messages=messages, tools=TOOLS, temperature=0,
                                                     max_tokens=60, stream=True))
        texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        calls = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
        m = whole.choices[0].message
        assert "".join(texts) == (m.content or ""), (texts, m.content)
        assert [(t.function.name, t.function.arguments) for t in calls if t.function.name] == \
            [(t.function.name, "") for t in m.tool_calls or []]
        built = {}
        for t in calls:  # each call's name, then its arguments in pieces
            built.setdefault(t.index, [t.function.name, ""])[1] += t.function.arguments or ""
        assert [tuple(built[i]) for i in sorted(built)] == \
            [(t.function.name, t.function.arguments) for t in m.tool_calls or []]
        assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
        if messages is ASK:
            assert not m.tool_calls and len(texts) > 10, texts  # (the model answers this one in words)
        else:  # the first call the model writes streams as it is written: its arguments in many chunks
            first = [i for i, c in enumerate(chunks) if c.choices and any(
                t.index == 0 and t.function.arguments for t in c.choices[0].delta.tool_calls or [])]
            assert len(first) >= 4 and first[-1] - first[0] >= 3, first


def test_streamed_answers_with_tools_carry_their_tokens_logprobs(client):
    """logprobs with tools, streamed: the chunks carried none. Now each text chunk carries its
    tokens' entries: joined, the whole answer's (a text answer), or their start (the tokens
    of the text before a call)."""
    for messages in (ASK, FEW_SHOT):
        kw = dict(model="x", messages=messages, tools=TOOLS, temperature=0, max_tokens=40, logprobs=True,
                  top_logprobs=2)
        whole = client.chat.completions.create(**kw)
        chunks = list(client.chat.completions.create(stream=True, **kw))
        streamed = [(t.token, round(t.logprob, 4)) for c in chunks if c.choices and c.choices[0].logprobs
                    for t in c.choices[0].logprobs.content or []]
        entries = [(t.token, round(t.logprob, 4)) for t in whole.choices[0].logprobs.content]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        if whole.choices[0].message.tool_calls:
            assert streamed == entries[:len(streamed)] and "".join(t for t, _ in streamed).strip() == text.strip()
        else:
            assert streamed == entries and len(streamed) > 10, (streamed, entries)
    r = client.responses.create(model="x", input=ASK[0]["content"], tools=RESPONSES_TOOLS, temperature=0,
                                max_output_tokens=40, include=["message.output_text.logprobs"])
    events = list(client.responses.create(model="x", input=ASK[0]["content"], tools=RESPONSES_TOOLS, temperature=0,
                                          max_output_tokens=40, include=["message.output_text.logprobs"], stream=True))
    deltas = [x.token for e in events if e.type == "response.output_text.delta" for x in e.logprobs]
    assert deltas == [x.token for x in r.output[0].content[0].logprobs] and deltas


def test_tool_results_continue_the_conversation(client):
    first = client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=80)
    call = first.choices[0].message.tool_calls[0]
    msgs = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'}]
    r = client.chat.completions.create(model="x", messages=msgs, tools=TOOLS, temperature=0, max_tokens=30)
    assert r.choices[0].message.content or r.choices[0].message.tool_calls
    # the call and its result are part of the prompt
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 20


def test_parallel_tool_calls_false_ends_the_answer_with_its_first_call(client):
    """parallel_tool_calls false keeps one call; the answer now ends with that call's close: the
    model went on to write a second (dropped), and max_tokens could cut it, so that one whole call
    came back with finish_reason "length"."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

    def shot(city, i):  # a few turns where the model answered with two calls
        calls = [{"id": f"call_{i}{k}", "type": "function",
                  "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}
                 for k, c in (("a", city), ("b", city + "2"))]
        return [{"role": "user", "content": f"Weather in {city}?"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": f"call_{i}a", "content": "sunny"},
                {"role": "tool", "tool_call_id": f"call_{i}b", "content": "rain"},
                {"role": "assistant", "content": "It is sunny."}]
    msgs = shot("Paris", 1) + shot("Rome", 2) + shot("Oslo", 3) + [{"role": "user", "content": "Weather in Berlin?"}]
    both = client.chat.completions.create(model="x", messages=msgs, tools=[weather], temperature=0, max_tokens=200)
    assert len(both.choices[0].message.tool_calls) == 2  # (what this model writes here, for the check below)
    for max_tokens in (50, 200):
        r = client.chat.completions.create(model="x", messages=msgs, tools=[weather], temperature=0,
                                           max_tokens=max_tokens, parallel_tool_calls=False)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1, r
        assert json.loads(calls[0].function.arguments) == json.loads(both.choices[0].message.tool_calls[0]
                                                                     .function.arguments)
        assert r.usage.completion_tokens < both.usage.completion_tokens


def test_tool_errors_are_400s(client):
    cases = [({"tools": [{"type": "function"}]}, "tools"),
             ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
             ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
             ({"tool_choice": "required"}, "tool_choice"),
             ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                 "type": "object", "properties": {"x": {"type": "string", "pattern": "(?=a)"}}}}}],
               "tool_choice": "required"}, "tools")]
    # arguments are an object: a schema of another value gave arguments with the template's markup in
    # them ('"Paris"}\n</tool_call>') and finish_reason "stop"
    for schema in [{"type": "string"}, {"type": "integer"}, {"type": "null"}, {"enum": ["a", "b"]},
                   {"type": "array", "items": {"type": "string"}}, {"anyOf": [{"type": "object"}]}]:
        fn = {"name": "f", "parameters": schema}
        cases.append(({"tools": [{"type": "function", "function": fn}], "tool_choice": "required"}, "tools"))
    # OpenAI's names: a name holding the call's markup ('</tool_call>') broke the parsing of calls
    for name in ['a b"</tool_call>', "x" * 65, "get.weather", "名前"]:
        cases.append(({"tools": [{"type": "function", "function": {"name": name}}]}, "tools"))
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as ei:
            client.chat.completions.create(model="x", messages=ASK, max_tokens=5, **extra)
        assert ei.value.body["param"] == param, (extra, ei.value.body)


def test_tool_messages_answer_the_calls_before_them(client):
    """OpenAI's rule for tool turns (its 400s): a tool message answers, by id, a call of the
    assistant message just before it, and every such call is answered. A result given to no call,
    or a call left unanswered, was rendered silently (the model read a result of nothing)."""
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
    asked = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]}]
    cases = [(ASK + [{"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "No tool call found"),
             (asked + [{"role": "tool", "tool_call_id": "c2", "content": "sunny"}], "answering 'c2'"),
             (asked + [{"role": "tool", "content": "sunny"}], "needs a tool_call_id"),
             (asked, "No tool output found for tool call 'c1'"),
             (asked + [{"role": "user", "content": "And?"}], "No tool output found for tool call 'c1'"),
             (asked + [{"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                       {"role": "assistant", "content": "Sunny."},
                       {"role": "tool", "tool_call_id": "c1", "content": "again"}], "No tool call found")]
    for msgs, said in cases:
        with pytest.raises(openai.BadRequestError) as ei:
            client.chat.completions.create(model="x", messages=msgs, tools=TOOLS, max_tokens=5)
        assert ei.value.body["param"] == "messages" and said in ei.value.body["message"], (msgs, ei.value.body)
    whole = asked + [{"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    assert client.chat.completions.create(model="x", messages=whole, tools=TOOLS, max_tokens=5).choices
    with pytest.raises(openai.BadRequestError) as ei:  # Responses: an output of no call
        client.responses.create(model="x", max_output_tokens=5, tools=RESPONSES_TOOLS, input=[
            {"role": "user", "content": "Hi"}, {"type": "function_call_output", "call_id": "c9", "output": "x"}])
    assert ei.value.body["param"] == "input" and "answering 'c9'" in ei.value.body["message"], ei.value.body
    with pytest.raises(openai.BadRequestError) as ei:  # a background one: at once, not a stored failure
        client.responses.create(model="x", max_output_tokens=5, tools=RESPONSES_TOOLS, background=True, input=[
            {"role": "user", "content": "Hi"}, {"type": "function_call_output", "call_id": "c9", "output": "x"}])
    assert ei.value.body["param"] == "input" and "answering 'c9'" in ei.value.body["message"], ei.value.body


def test_template_without_a_tool_format_is_a_400(tmp_path):
    s = Server(tmp_path, "--chat-template", "zephyr")
    s.start()
    try:
        st, body, _ = s.request("POST", "/v1/chat/completions",
                                {"messages": ASK, "tools": TOOLS, "max_tokens": 5})
        assert st == 400 and body["error"]["param"] == "tools"
        assert "zephyr" in body["error"]["message"] and "chatml" in body["error"]["message"]
        st, body, _ = s.request("POST", "/v1/chat/completions", {"messages": ASK, "max_tokens": 2})
        assert st == 200  # without tools the template still works
    finally:
        s.stop()


# ---- /v1/responses: function tools ---------------------------------------------------------

# Responses' function tools: name and parameters at the top, not under "function"
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


def calls_of(response):
    items = [o for o in response.output if o.type == "function_call"]
    for o in items:
        assert o.id.startswith("fc_") and o.call_id.startswith("call_") and o.name in SCHEMA_OF
    return items


def test_responses_call_the_tools_the_chat_route_calls(client):
    """Each tool_choice gives the call the chat route gives for the same conversation
    (the same prompt, so at temperature 0 the same arguments), as function_call items."""
    choices = [("required", "required"),
               ({"type": "function", "name": "get_time"}, {"type": "function", "function": {"name": "get_time"}}),
               ("auto", "auto"), ("none", "none")]
    for responses_choice, chat_choice in choices:
        r = client.responses.create(model="x", input=ASK[0]["content"], tools=RESPONSES_TOOLS,
                                    tool_choice=responses_choice, temperature=0, max_output_tokens=80)
        c = client.chat.completions.create(model="x", messages=ASK, tools=TOOLS, tool_choice=chat_choice,
                                           temperature=0, max_tokens=80)
        chat_calls = c.choices[0].message.tool_calls or []
        calls = calls_of(r)
        assert [(o.name, o.arguments) for o in calls] == [(t.function.name, t.function.arguments) for t in chat_calls]
        assert [o.call_id for o in calls] == [t.id for t in chat_calls] or chat_calls  # ids are each answer's own
        text = "".join(p.text for o in r.output if o.type == "message" for p in o.content)
        assert text == (c.choices[0].message.content or "")
        for o in calls:
            jsonschema.validate(json.loads(o.arguments), SCHEMA_OF[o.name])
        if responses_choice != "auto":
            assert bool(calls) == (responses_choice != "none"), r.output
        assert r.usage.input_tokens == c.usage.prompt_tokens
    # the response names the tools it was given, as sent
    assert r.tools[0].name == "get_weather" and r.tool_choice == "none"


def test_responses_streamed_call_events(client):
    kw = dict(model="x", input=ASK[0]["content"], tools=RESPONSES_TOOLS, tool_choice="required", temperature=0,
              max_output_tokens=80)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    n = types.count("response.function_call_arguments.delta")
    assert n >= 4 and types == ["response.created", "response.in_progress", "response.output_item.added"] + \
        ["response.function_call_arguments.delta"] * n + \
        ["response.function_call_arguments.done", "response.output_item.done", "response.completed"], types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, deltas, (done, item_done, completed) = events[2], events[3:3 + n], events[3 + n:]
    assert added.item.status == "in_progress" and added.item.arguments == ""
    assert {d.item_id for d in deltas} == {done.item_id} == {added.item.id} == {item_done.item.id}
    assert added.item.call_id == item_done.item.call_id == completed.response.output[0].call_id
    assert "".join(d.delta for d in deltas) == done.arguments == item_done.item.arguments == \
        completed.response.output[0].arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER)
    whole = client.responses.create(**kw)
    assert [(o.name, o.arguments) for o in calls_of(whole)] == [(item_done.item.name, done.arguments)]


def responses_input(messages):
    """A chat conversation as Responses input items."""
    items = []
    for m in messages:
        if m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
            continue
        if m.get("content"):
            items.append({"role": m["role"], "content": m["content"]})
        for t in m.get("tool_calls") or []:
            items.append({"type": "function_call", "call_id": t["id"], "name": t["function"]["name"],
                          "arguments": t["function"]["arguments"]})
    return items


def test_responses_streamed_with_tools_send_their_text_as_it_comes(client):
    """tool_choice auto, streamed: the message item opens at the answer's first text and its
    deltas come as it is written; the calls' items follow at the end; as the whole answer."""
    for messages in (ASK, FEW_SHOT):
        kw = dict(model="x", input=responses_input(messages), tools=RESPONSES_TOOLS, temperature=0,
                  max_output_tokens=60)
        whole = client.responses.create(**kw)
        events = list(client.responses.create(stream=True, **kw))
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        text = "".join(p.text for o in whole.output if o.type == "message" for p in o.content)
        assert "".join(deltas) == text
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [(o.type, getattr(o, "arguments", None)) for o in done] == \
            [(o.type, getattr(o, "arguments", None)) for o in whole.output]
        assert events[-1].response.output_text == whole.output_text
        if messages is ASK:
            assert len(deltas) > 10 and not calls_of(whole), deltas
        else:  # the first call streams as it is written, at the index the finished output gives it
            assert calls_of(whole)
            args = [e for e in events if e.type == "response.function_call_arguments.delta"]
            first = whole.output.index(next(o for o in whole.output if o.type == "function_call"))
            assert len([e for e in args if e.output_index == first]) >= 4, args
            added = [e for e in events if e.type == "response.output_item.added"]
            assert [(e.output_index, e.item.type) for e in added] == \
                sorted((e.output_index, e.item.type) for e in added)  # each item opened at its own index
            assert [(e.output_index, e.item.id) for e in added] == \
                [(i, o.id) for i, o in enumerate(events[-1].response.output)]  # as the stream's own response says


def test_responses_call_cut_short_is_incomplete(client):
    r = client.responses.create(model="x", input=ASK[0]["content"], tools=RESPONSES_TOOLS, temperature=0,
                                tool_choice={"type": "function", "name": "get_time"}, max_output_tokens=24)
    assert r.status == "incomplete" and [(o.type, o.status) for o in r.output] == [("function_call", "incomplete")]
    assert r.output[0].name == "get_time" and r.output[0].arguments  # as far as it came


def test_responses_tool_turns_are_the_chat_conversation(client):
    """A function_call and its function_call_output in input are the chat route's assistant
    tool_calls and tool message: the same prompt, the same answer."""
    first = client.responses.create(model="x", input=ASK[0]["content"], tools=RESPONSES_TOOLS,
                                    tool_choice="required", temperature=0, max_output_tokens=80)
    call = calls_of(first)[0]
    result = '{"temperature": 21, "sky": "clear"}'
    r = client.responses.create(model="x", tools=RESPONSES_TOOLS, temperature=0, max_output_tokens=30, input=[
        {"role": "user", "content": ASK[0]["content"]}, *[o.model_dump(exclude_none=True) for o in first.output],
        {"type": "reasoning", "id": "rs_1", "summary": []},  # another server's reasoning: dropped
        {"type": "function_call_output", "call_id": call.call_id, "output": result}])
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": result}]
    c = client.chat.completions.create(model="x", messages=msgs, tools=TOOLS, temperature=0, max_tokens=30)
    assert r.usage.input_tokens == c.usage.prompt_tokens > first.usage.input_tokens + 20
    text = "".join(p.text for o in r.output if o.type == "message" for p in o.content)
    assert text == (c.choices[0].message.content or "")
    # the call named by an item_reference (as Codex-like clients send it back): the same prompt
    by_ref = client.responses.create(model="x", tools=RESPONSES_TOOLS, temperature=0, max_output_tokens=30, input=[
        {"role": "user", "content": ASK[0]["content"]}, {"type": "item_reference", "id": call.id},
        {"type": "function_call_output", "call_id": call.call_id, "output": result}])
    assert by_ref.usage.input_tokens == r.usage.input_tokens
    listed = list(client.responses.input_items.list(by_ref.id, order="asc"))
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]
    assert (listed[1].id, listed[1].arguments, listed[2].output) == (call.id, call.arguments, result)


def test_responses_tool_errors_are_400s(client):
    cases = [({"tools": [{"type": "web_search"}]}, "tools", "function tools"),
             ({"tools": [{"type": "function", "parameters": WEATHER}]}, "tools", "name"),
             ({"tools": RESPONSES_TOOLS, "tool_choice": {"type": "file_search"}}, "tool_choice", "function"),
             ({"tools": RESPONSES_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
             ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input", "call_id"),
             ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input", "arguments"),
             ({"input": [{"type": "function_call_output", "call_id": "c", "output": 7}]}, "input", "output"),
             ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "item_reference")]
    for extra, param, said in cases:
        kw = {"input": "Hi", **extra}
        with pytest.raises(openai.BadRequestError) as ei:
            client.responses.create(model="x", max_output_tokens=5, **kw)
        assert ei.value.body["param"] == param and said in ei.value.body["message"], (extra, ei.value.body)
