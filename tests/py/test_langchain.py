"""A second real client: LangChain's ChatOpenAI (langchain-openai) against a
real server on the default model: with_structured_output (json_schema),
bind_tools with a forced tool, and streaming."""
import datetime

import pydantic
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from server_util import serve


@pytest.fixture(scope="module")
def llm(tmp_path_factory, model):
    for s in serve(tmp_path_factory):
        yield ChatOpenAI(base_url=s.url + "/v1", api_key="none", model="x", temperature=0, max_tokens=80,
                         max_retries=0, timeout=300)


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
    assert msg.response_metadata["finish_reason"] == "tool_calls"


def test_streaming(llm):
    chunks = list(llm.stream("Say hello in one sentence."))
    text = "".join(c.content for c in chunks)
    assert len(chunks) > 2 and text == llm.invoke("Say hello in one sentence.").content
