"""A third real client: the OpenAI Agents SDK (openai-agents), whose models
speak the Responses API (and chat completions), against a real server on the
default model: an agent that calls a function tool, streamed and not, and
agents whose output is a Pydantic model."""
import asyncio

import pydantic
import pytest

agents = pytest.importorskip("agents")
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from server_util import serve  # noqa: E402

agents.set_tracing_disabled(True)  # (it would post traces to OpenAI)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model):
    yield from serve(tmp_path_factory)


@pytest.fixture(params=[OpenAIResponsesModel, OpenAIChatCompletionsModel], ids=["responses", "chat"])
def model_of(request, server):
    """A model on a new client: an async client belongs to the event loop it first ran in."""
    return lambda: request.param(model="potserve", openai_client=AsyncOpenAI(
        base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300))


CALLED = []


@agents.function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLED.append(city)
    return f"sunny, 21 degrees in {city}"


class Report(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=40)
    degrees: int


@pytest.mark.parametrize("streamed", [False, True])
def test_agent_calls_its_tool(model_of, streamed):
    """The SDK sends the tool, reads the model's call, runs the function and (told to stop
    at the first tool) answers with its result."""
    agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model_of(),
                  model_settings=ModelSettings(temperature=0, max_tokens=80, tool_choice="required"),
                  tool_use_behavior="stop_on_first_tool")

    async def run():
        if not streamed:
            return (await Runner.run(agent, "What is the weather in Paris?")).final_output
        r = Runner.run_streamed(agent, "What is the weather in Paris?")
        kinds = [e.type async for e in r.stream_events()]
        assert "raw_response_event" in kinds
        return r.final_output

    CALLED.clear()
    out = asyncio.run(run())
    assert len(CALLED) == 1 and out == f"sunny, 21 degrees in {CALLED[0]}", (out, CALLED)


def test_agent_output_type(model_of):
    agent = Agent(name="report", instructions="Report the weather as JSON.", output_type=Report, model=model_of(),
                  model_settings=ModelSettings(temperature=0, max_tokens=80))
    out = asyncio.run(Runner.run(agent, "Paris: sunny, 21 degrees.")).final_output
    assert isinstance(out, Report), out  # parsed and validated by the SDK


def test_previous_response_id_continues_a_run(server):
    """A second run chained to the first's last response (previous_response_id) is read after
    the first's conversation, its tool call and the tool's output included, which the server kept.
    (The first run reads the tool's output and answers: a run stopped at its call leaves the call
    unanswered, which chained is OpenAI's 400 "No tool output found", and this server's.)"""
    def model():
        return OpenAIResponsesModel(model="potserve", openai_client=AsyncOpenAI(
            base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300))

    settings = ModelSettings(temperature=0, max_tokens=80)

    async def runs():
        caller = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model(),
                       model_settings=ModelSettings(temperature=0, max_tokens=80, tool_choice="required"))
        first = await Runner.run(caller, "What is the weather in Paris?")  # (tool_choice is auto after the call)
        reporter = Agent(name="report", instructions="Report the weather as JSON.", output_type=Report,
                         model=model(), model_settings=settings)
        chained = await Runner.run(reporter, "Report it.", previous_response_id=first.last_response_id)
        alone = await Runner.run(reporter, "Report it.")
        return first, chained, alone

    first, chained, alone = asyncio.run(runs())
    assert isinstance(chained.final_output, Report)
    assert [o.type for o in first.raw_responses[0].output] == ["function_call"] and len(first.raw_responses) == 2
    # the first run's question and call (its tools' definitions are the first agent's, not sent again)
    before = chained.raw_responses[-1].usage.input_tokens - alone.raw_responses[-1].usage.input_tokens
    assert before >= 30, (before, first.raw_responses[-1].output)


def test_a_conversations_session_remembers_the_turns(server):
    """An agent with OpenAIConversationsSession keeps its history in a conversation on this
    server (the Conversations API): a second run reads after the first's turn, and the session's
    items are what both runs said."""
    from agents import OpenAIConversationsSession

    def client():
        return AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)

    async def runs():
        session = OpenAIConversationsSession(openai_client=client())
        agent = Agent(name="talk", instructions="Be brief.", model=OpenAIResponsesModel(
            model="potserve", openai_client=client()), model_settings=ModelSettings(temperature=0, max_tokens=300))
        first = await Runner.run(agent, "My name is Ada.", session=session)
        second = await Runner.run(agent, "What is my name?", session=session)
        alone = await Runner.run(agent, "What is my name?")
        return first, second, alone, await session.get_items()

    first, second, alone, items = asyncio.run(runs())
    grown = second.raw_responses[-1].usage.input_tokens - alone.raw_responses[-1].usage.input_tokens
    assert grown >= 8, grown  # the first turn (its question and answer) before the second
    said = [i.get("content") if isinstance(i.get("content"), str) else i["content"][0]["text"] for i in items]
    assert said[0] == "My name is Ada." and said[2] == "What is my name?" and len(items) == 4, items
