"""Structured outputs on the CPU end to end: the default model (SmolLM2-135M) behind the server, through the real `openai`
client and LangChain: parsed pydantic objects, 20 JSON schemas whose outputs validate, choices and regexes that
match, forced tool calls that parse. One server for the module, few tokens each."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pydantic
import pytest

from samebits.engine.config import EngineConfig
from tests.server.conftest import start_server

pytestmark = pytest.mark.slow
NAME = "smol"
S = {"type": "string", "maxLength": 12}


def obj(**props) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


# Twenty schemas, bounded so that a complete answer fits max_tokens: short strings, small arrays, enums, ranges.
SCHEMAS = [
    obj(name=S, age={"type": "integer", "minimum": 0, "maximum": 120}),
    obj(city=S, country=S),
    obj(answer={"type": "boolean"}),
    obj(colour={"enum": ["red", "green", "blue"]}),
    obj(x={"type": "number", "minimum": 0, "maximum": 10}, y={"type": "number", "minimum": 0, "maximum": 10}),
    obj(tags={"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}),
    obj(title=S, year={"type": "integer", "minimum": 1900, "maximum": 2030}),
    obj(user=obj(id={"type": "integer", "minimum": 0, "maximum": 999}, admin={"type": "boolean"})),
    obj(word=S),
    obj(n={"type": "integer", "minimum": 1, "maximum": 9}),
    obj(ok={"type": "boolean"}, code={"type": "integer", "minimum": 100, "maximum": 599}),
    obj(animal={"enum": ["cat", "dog"]}, legs={"type": "integer", "minimum": 0, "maximum": 8}),
    obj(first=S, last=S),
    obj(score={"type": "number", "minimum": 0, "maximum": 1}),
    obj(items={"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}),
    obj(day={"enum": ["mon", "tue", "wed", "thu", "fri"]}),
    obj(point=obj(lat={"type": "integer", "minimum": -90, "maximum": 90}, lon={"type": "integer", "minimum": 0,
                                                                           "maximum": 180})),
    obj(status={"enum": ["open", "closed"]}, count={"type": "integer", "minimum": 0, "maximum": 50}),
    obj(language=S),
    obj(pair={"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2}),
]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather of a city", "parameters":
           obj(city=S)}}


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    age: int = pydantic.Field(ge=0, le=120)


@pytest.fixture(scope="module")
def live():
    from samebits.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model="smollm2-135m", mode="fast", device="cpu", max_num_seqs=32,
                                    max_model_len=1024))
    server = start_server(engine, served_model_name=NAME)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=600)


def ask(client, content: str, **kw):
    return client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": content}],
                                          **{"temperature": 0, "max_tokens": 48, **kw}).choices[0]


def test_parse_with_a_pydantic_model_returns_the_object(client):
    r = client.chat.completions.parse(model=NAME, messages=[{"role": "user", "content": "A person as JSON."}],
                                      response_format=Person, temperature=0, max_tokens=48)
    assert isinstance(r.choices[0].message.parsed, Person)


def test_twenty_json_schemas_validate(client):
    def one(i_schema):
        i, schema = i_schema
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        return ask(client, "Answer in JSON.", response_format=fmt, max_tokens=64, seed=i, temperature=0.5)

    with ThreadPoolExecutor(len(SCHEMAS)) as pool:
        choices = list(pool.map(one, enumerate(SCHEMAS)))
    for schema, choice in zip(SCHEMAS, choices):
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_guided_choice_and_regex_match(client):
    assert ask(client, "Is the sky blue?", extra_body={"guided_choice": ["yes", "no"]}).message.content in ("yes", "no")
    date = ask(client, "A date:", extra_body={"guided_regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"}).message.content
    assert re.fullmatch("[0-9]{4}-[0-9]{2}-[0-9]{2}", date)


def test_required_tool_choice_returns_parseable_tool_calls(client):
    choice = ask(client, "What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                 parallel_tool_calls=False)
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_langchain_structured_output_and_bound_tools(live):
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return "sunny"

    llm = langchain_openai.ChatOpenAI(model=NAME, base_url=f"{live.url}/v1", api_key="unused", temperature=0,
                                      max_tokens=48, max_retries=0)
    assert isinstance(llm.with_structured_output(Person).invoke("A person as JSON."), Person)
    called = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert [c["name"] for c in called.tool_calls] == ["get_weather"] and isinstance(called.tool_calls[0]["args"], dict)
