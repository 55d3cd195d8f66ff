"""A second real client: LangChain's ChatOpenAI (langchain-openai) against a
real server on the default model: with_structured_output (json_schema),
bind_tools with a forced tool, and streaming; the same over the Responses API
(use_responses_api), with a tool's result sent back."""
import datetime

import pydantic
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from server_util import serve


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    for s in serve(tmp_path_factory):
        yield s


@pytest.fixture(scope="module", params=[False, True], ids=["chat", "responses"])
def llm(request, server):
    return ChatOpenAI(base_url=server.url + "/v1", api_key="none", model="x", temperature=0, max_tokens=80,
                      max_retries=0, timeout=300, use_responses_api=request.param)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=40)
    country: str = pydantic.Field(max_length=40)
    population: int = pydantic.Field(ge=0)
    founded: datetime.date
    code: str = pydantic.Field(pattern=r"^[A-Z]{3}$")


@tool
def get_weather(city: str, unit: str) -> str:
    """The weather in a city, in celsius or fahrenheit."""
    return "sunny"


def test_with_structured_output(llm):
    city = llm.with_structured_output(City).invoke("Tell me about Paris.")
    assert isinstance(city, City) and city.population >= 0 and len(city.code) == 3, city  # parsed: every field valid


def test_bind_tools_forced_call(llm):
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Rome?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert set(msg.tool_calls[0]["args"]) == {"city", "unit"}
    if not llm.use_responses_api:  # (the Responses API has no finish_reason: its items say it)
        assert msg.response_metadata["finish_reason"] == "tool_calls"


def test_a_tool_result_goes_back(llm):
    from langchain_core.messages import HumanMessage, ToolMessage
    ask = HumanMessage("What is the weather in Rome?")
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke([ask])
    streamed = list(llm.bind_tools([get_weather], tool_choice="get_weather").stream([ask]))
    whole = streamed[0]
    for c in streamed[1:]:
        whole = whole + c
    assert whole.tool_calls == [{**c, "id": whole.tool_calls[0]["id"]} for c in msg.tool_calls]
    back = [ask, msg, ToolMessage("sunny, 21 degrees", tool_call_id=msg.tool_calls[0]["id"])]
    answer = llm.bind_tools([get_weather]).invoke(back)
    assert answer.usage_metadata["input_tokens"] > 20 + llm.invoke([ask]).usage_metadata["input_tokens"]


def test_structured_output_by_a_tool_streams_partial_objects(llm):
    """with_structured_output(method="function_calling") forces a call; streamed, LangChain parses
    its arguments as they come, so the object grows field by field (it came whole at the end)."""
    schema = City.model_json_schema()  # (a Pydantic class is yielded only once whole: it cannot be partial)
    parts = list(llm.with_structured_output(schema, method="function_calling").stream("Tell me about Paris."))
    assert len(parts) >= 3 and len(parts[0]) < len(parts[-1]) == 5, parts
    City.model_validate(parts[-1])


def test_streaming(llm):
    chunks = list(llm.stream("Say hello in one sentence."))
    text = "".join(c.text for c in chunks)
    assert len(chunks) > 2 and text == llm.invoke("Say hello in one sentence.").text


def test_previous_response_id_is_the_whole_conversation(server):
    """use_previous_response_id: LangChain sends only the new messages and the id of the
    response before them; the server's stored conversation makes it the same prompt, so the
    same answer, as sending the whole conversation."""
    from langchain_core.messages import HumanMessage
    kw = dict(base_url=server.url + "/v1", api_key="none", model="x", temperature=0, max_tokens=20, max_retries=0,
              timeout=300, use_responses_api=True)
    chained, whole = ChatOpenAI(use_previous_response_id=True, **kw), ChatOpenAI(**kw)
    first = chained.invoke([HumanMessage("My name is Ada. Say hi.")])
    talk = [HumanMessage("My name is Ada. Say hi."), first, HumanMessage("What is my name?")]
    a, b = chained.invoke(talk), whole.invoke(talk)
    assert a.text == b.text and a.usage_metadata["input_tokens"] == b.usage_metadata["input_tokens"]
