"""Structured outputs and tools through the HTTP server on the tiny random model: the grammar holds whatever the model
wants, bad constraints are 400s naming their field before any work, a grammar cut by max_tokens says "length", tool
calls stream as OpenAI deltas that add up to the body."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.server.conftest import make_engine, start_server
from tests.server.test_bad_inputs import CHAT, CMPL, c, ch, check_error

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer",
          "minimum": 0, "maximum": 99}}, "required": ["name", "n"], "additionalProperties": False}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "maximum": 99, "minimum": 0},
                                     "b": {"type": "integer", "maximum": 99, "minimum": 0}},
    "required": ["a", "b"], "additionalProperties": False}}}
ECHO = {"type": "function", "function": {"name": "echo", "parameters": {
    "type": "object", "properties": {"s": {"enum": ["x", "yz"]}}, "required": ["s"], "additionalProperties": False}}}
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
# A ChatML template that knows tools, short enough for the tiny model's context: the tools reach it as `tools`, an
# assistant's calls as `tool_calls` (the default template knows neither: engine/prompts.py writes them as text).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>"
    "{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tool_server(tiny_model_dir):
    engine = make_engine(tiny_model_dir)
    engine.tokenizer.chat_template = TOOL_TEMPLATE
    live = start_server(engine)
    yield live
    live.stop()


def post(server, path, body):
    with server.client() as http:
        r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def message(server, **kw) -> tuple[dict, str]:
    choice = post(server, CHAT, ch(**{"max_tokens": 64, "temperature": 1.0, "seed": 3, **kw}))["choices"][0]
    return choice["message"], choice["finish_reason"]


@pytest.mark.parametrize("field,value,check", [
    ("response_format", SCHEMA_FORMAT, lambda t: jsonschema.validate(json.loads(t), PERSON)),
    ("response_format", {"type": "json_object"}, lambda t: isinstance(json.loads(t), dict)),
    ("guided_json", PERSON, lambda t: jsonschema.validate(json.loads(t), PERSON)),
    ("structured_outputs", {"regex": "[a-c]{3}-[0-9]{2}"}, lambda t: re.fullmatch("[a-c]{3}-[0-9]{2}", t)),
    ("guided_regex", "(yes|no)!", lambda t: t in ("yes!", "no!")),
    ("guided_choice", ["alpha", "beta"], lambda t: t in ("alpha", "beta")),
    ("guided_grammar", 'start: "(" /[0-9]/ ")"', lambda t: re.fullmatch(r"\([0-9]\)", t)),
    ("guided_grammar", 'root ::= "<" [a-z] ">"', lambda t: re.fullmatch("<[a-z]>", t)),  # GBNF
], ids=["json_schema", "json_object", "guided_json", "structured_outputs", "regex", "choice", "lark", "gbnf"])
def test_the_output_follows_the_constraint(server, field, value, check):
    msg, finish = message(server, **{field: value}, max_tokens=96)
    if finish == "stop":
        assert check(msg["content"]) is not False, msg["content"]
    else:
        assert field == "response_format" and value["type"] == "json_object" and finish == "length"


def test_completions_take_a_constraint_too(server):
    body = post(server, CMPL, c(max_tokens=8, temperature=1.0, seed=5, n=3, guided_regex="[0-9]{2}[a-z]"))
    assert all(re.fullmatch("[0-9]{2}[a-z]", x["text"]) and x["finish_reason"] == "stop" for x in body["choices"])


def test_a_grammar_cut_by_max_tokens_finishes_with_length_never_stop(server):
    msg, finish = message(server, guided_regex="[a-z]{40}", max_tokens=5)
    assert finish == "length" and re.fullmatch("[a-z]{1,39}", msg["content"])


BAD = [
    ("schema", ch(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}),
     "response_format", ["response_format.json_schema.schema", "objekt"]),
    ("schema_missing", ch(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format",
     ["schema", "required"]),
    ("format_type", ch(response_format={"type": "xml"}), "response_format", ["text, json_object, json_schema"]),
    ("regex", ch(guided_regex="(ab"), "guided_regex", ["guided_regex", "unclosed group"]),
    ("lark", ch(guided_grammar="start: foo"), "guided_grammar", ["guided_grammar", "unknown name"]),
    ("so_regex", c(structured_outputs={"regex": "[z-a]"}), "structured_outputs", ["structured_outputs.regex"]),
    ("so_two", c(structured_outputs={"regex": "a", "choice": ["b"]}), "structured_outputs", ["exactly one"]),
    ("so_unknown", c(structured_outputs={"regexp": "a"}), "structured_outputs", ["regexp", "unknown"]),
    ("so_structural_tag", c(structured_outputs={"structural_tag": "{}"}), "structured_outputs",
     ["structural_tag", "does not implement"]),
    ("two_fields", ch(guided_regex="a", response_format={"type": "json_object"}), "guided_regex", ["both"]),
    ("guided_json_string", ch(guided_json="{not json"), "guided_json", ["guided_json", "not valid JSON"]),
    ("choice_empty", ch(guided_choice=[]), "guided_choice", ["guided_choice"]),
    ("backend", ch(guided_choice=["a"], guided_decoding_backend="xgrammar"), "guided_decoding_backend",
     ["llguidance"]),
    ("whitespace_alone", ch(guided_whitespace_pattern=" *"), "guided_whitespace_pattern", ["guided_json"]),
    ("min_tokens", ch(guided_choice=["a"], min_tokens=2), "min_tokens", ["min_tokens", "structured_outputs"]),
    ("tool_type", ch(tools=[{"type": "retrieval", "function": {"name": "f"}}]), "tools", ["tools[0].type"]),
    ("tool_name", ch(tools=[{"type": "function", "function": {"name": "a b"}}]), "tools", ["tools[0].function.name"]),
    ("tool_twice", ch(tools=[ADD, ADD]), "tools", ["unique"]),
    ("tool_extra", ch(tools=[{**ADD, "cache": 1}]), "tools", ["tools[0].cache"]),
    ("tool_schema", ch(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
                       tool_choice="required"), "tools", ["objekt"]),
    ("choice_word", ch(tools=[ADD], tool_choice="always"), "tool_choice", ["none, auto, required"]),
    ("choice_unknown", ch(tools=[ADD], tool_choice={"type": "function", "function": {"name": "sub"}}), "tool_choice",
     ["sub"]),
    ("choice_without_tools", ch(tool_choice="required"), "tool_choice", ["needs tools"]),
    ("forced_and_format", ch(tools=[ADD], tool_choice="required", response_format={"type": "json_object"}),
     "tool_choice", ["both"]),
    ("tools_on_completions", c(tools=[ADD]), "tools", ["tools"]),
    ("call_arguments", ch(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "add", "arguments": "[1]"}}]}]), "messages",
     ["messages[1].tool_calls"]),
]


@pytest.mark.parametrize("name,body,param,words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_constraint_is_a_400_naming_its_field(server, name, body, param, words):
    with server.client() as http:
        check_error(http.post(CMPL if "prompt" in body else CHAT, json=body), 400, param, words)
    assert server.healthy()


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "echo"}}],
                         ids=["required", "named"])
def test_a_forced_tool_call_parses_and_its_arguments_follow_the_parameters(tool_server, choice):
    msg, finish = message(tool_server, tools=[ADD, ECHO], tool_choice=choice, parallel_tool_calls=False, max_tokens=96)
    assert finish == ("tool_calls" if choice == "required" else "stop") and msg["content"] is None
    (call,) = msg["tool_calls"]
    tool = {"add": ADD, "echo": ECHO}[call["function"]["name"]]
    assert choice == "required" or call["function"]["name"] == "echo"
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])
    assert call["type"] == "function" and call["id"].startswith("call_")


def test_streamed_tool_call_deltas_add_up_to_the_body(tool_server):
    """Two choices of different lengths: each one's calls are sent once, when it finishes."""
    body = ch(tools=[ADD, ECHO], tool_choice="required", max_tokens=120, temperature=1.0, seed=8, n=2)
    choices = post(tool_server, CHAT, body)["choices"]
    with tool_server.client() as http, http.stream("POST", CHAT, json={**body, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    for whole in choices:
        deltas = [x["choices"][0] for x in chunks if x["choices"] and x["choices"][0]["index"] == whole["index"]]
        calls = [t for d in deltas for t in d["delta"].get("tool_calls", [])]
        assert [(t["index"], t["function"]) for t in calls] == [
            (k, t["function"]) for k, t in enumerate(whole["message"]["tool_calls"])]
        assert "".join(d["delta"].get("content") or "" for d in deltas) == ""
        assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == [whole["finish_reason"]]
        assert [t for d in deltas for t in d.get("token_ids", [])] == whole["token_ids"]


def test_auto_leaves_plain_text_as_content_and_a_tool_conversation_is_accepted_back(tool_server):
    msg, _ = message(tool_server, tools=[ADD], max_tokens=8)
    assert "tool_calls" not in msg and isinstance(msg["content"], str)
    turns = [{"role": "user", "content": "1+2?"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    msg, _ = message(tool_server, messages=turns, tools=[ADD], tool_choice="none", max_tokens=4)
    assert "tool_calls" not in msg
