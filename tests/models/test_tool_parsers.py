"""Tool calls as Hermes and Llama 3 write them: parsed to OpenAI's calls, and each family's grammar accepts the calls
it writes and nothing else."""
import json

import llguidance
import pytest

from samebits.models.synthetic import build_tokenizer
from samebits.models.tool_parsers import PARSERS, parser_for

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "now"}}]
CALLS = [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]


def test_hermes_reads_every_block_and_the_content_before_them():
    h = PARSERS["hermes"]
    parsed = h.parse("Let me add. " + h.render_calls(CALLS) + "\ntrailing")
    assert parsed.content == "Let me add. "
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("add", {"a": 1, "b": 2}), ("now", {})]
    assert h.parse("plain").calls == () and h.parse("plain").content == "plain"
    broken = '<tool_call>\n{"name": "add", "arguments": [1]}\n</tool_call>'
    assert h.parse(broken).calls == () and h.parse(broken).content == broken
    assert h.parse('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>').calls[0].arguments == \
        '{"a": 1}'


def test_llama3_json_reads_calls_joined_by_semicolons():
    lj = PARSERS["llama3_json"]
    parsed = lj.parse("<|python_tag|>" + lj.render_calls(CALLS))
    assert parsed.content is None and [c.name for c in parsed.calls] == ["add", "now"]
    for text in ("hello", '{"name": "add", "parameters": {}} and more', '{"nome": "add"}'):
        assert lj.parse(text).calls == () and lj.parse(text).content == text


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("parallel", [True, False])
def test_the_grammar_accepts_the_familys_calls_and_refuses_an_unknown_tool(name, parallel):
    p, tok = PARSERS[name], build_tokenizer()
    lltok = llguidance.LLTokenizer(tok.to_str(), eos_token=[0])
    grammar = llguidance.LLMatcher.grammar_from_lark(p.grammar(TOOLS, parallel))

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(lltok, grammar, log_level=0)
        return m.consume_tokens(tok.encode(text).ids) and m.is_accepting()

    assert accepts(p.render_calls(CALLS[:1]))
    assert accepts(p.render_calls(CALLS)) == parallel
    assert not accepts(p.render_calls([{"name": "sub", "arguments": {}}]))
    assert not accepts(p.render_calls([{"name": "add", "arguments": {"a": "x", "b": 2}}]))


def test_the_parser_is_picked_by_the_template():
    assert parser_for(None).name == "hermes"
    assert parser_for("{{ '<tool_call>' }}").name == "hermes"
    assert parser_for("{{ '<|python_tag|>' }} ipython").name == "llama3_json"
    assert parser_for("anything", "llama3_json").name == "llama3_json"
    with pytest.raises(ValueError, match="tool_call_parser must be one of"):
        parser_for(None, "mistral")
