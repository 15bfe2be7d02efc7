"""engine/prompts: vLLM prompt dicts and the chat template's options, on a template that shows what it was given."""
import pytest

from samebits.engine.prompts import ChatTemplateError, normalize_prompts, render_chat


class ShowingTokenizer:
    """Renders the messages, the generation prompt and every template kwarg; one token id per character."""

    def apply_chat_template(self, messages, add_generation_prompt=True, **kwargs):
        if kwargs.get("fail"):
            raise RuntimeError("roles must alternate")
        body = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return body + "".join(f"[{k}={v}]" for k, v in sorted(kwargs.items())) + ("<assistant>" * add_generation_prompt)

    @staticmethod
    def encode(text, add_special_tokens=True):
        return [ord(ch) for ch in text]


def rendered(messages, **kw) -> str:
    return "".join(map(chr, render_chat(ShowingTokenizer(), messages, **kw)))


MSGS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "So"}]


def test_template_options():
    assert rendered(MSGS) == "<user>hi</><assistant>So</><assistant>"
    assert rendered(MSGS, add_generation_prompt=False) == "<user>hi</><assistant>So</>"
    assert rendered(MSGS, add_generation_prompt=False, continue_final_message=True) == "<user>hi</><assistant>So"
    assert rendered(MSGS, chat_template_kwargs={"enable_thinking": False}) == \
        "<user>hi</><assistant>So</>[enable_thinking=False]<assistant>"
    parts = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]}]
    assert rendered(parts) == rendered([{"role": "user", "content": "hi"}])
    assert rendered([{"role": "user", "content": None}]) == "<user></><assistant>"


@pytest.mark.parametrize("kw, words", [
    ({"continue_final_message": True}, "continue_final_message cannot be combined with add_generation_prompt"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs may not set"),
    ({"chat_template_kwargs": {"fail": True}}, "messages cannot be rendered by the chat template: roles must"),
])
def test_option_errors_name_the_field(kw, words):
    with pytest.raises(ValueError, match=words):
        rendered(MSGS, **kw)


def test_template_failure_is_its_own_type():
    with pytest.raises(ChatTemplateError):
        rendered(MSGS, chat_template_kwargs={"fail": True})


def test_final_message_must_render_as_is():
    with pytest.raises(ValueError, match="continue_final_message needs a final message"):
        rendered([{"role": "user", "content": ""}], add_generation_prompt=False, continue_final_message=True)


def test_prompt_shapes():
    enc = ShowingTokenizer.encode
    one = [("ab", [97, 98])]
    assert normalize_prompts("ab", enc) == normalize_prompts({"prompt": "ab"}, enc) == one
    assert normalize_prompts(["ab", {"prompt_token_ids": [5]}, [6, 7]], enc) == [("ab", [97, 98]), (None, [5]),
                                                                                (None, [6, 7])]
    assert normalize_prompts([5, 6], enc) == normalize_prompts({"prompt_token_ids": [5, 6]}, enc) == [(None, [5, 6])]
    for bad in ({"prompt": "a", "prompt_token_ids": [1]}, {"multi_modal_data": {}}, {"prompt": [1, 2]}):
        with pytest.raises(ValueError, match="prompt: a dict prompt holds exactly one of"):
            normalize_prompts(bad, enc)


TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
CALLED = [{"role": "user", "content": "1+2"}, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "3"}]


class ToolTokenizer(ShowingTokenizer):
    """A template that knows tools: shows the tools and each message's calls (their arguments as objects)."""

    chat_template = "{{ tools }} {{ tool_calls }}"

    def apply_chat_template(self, messages, add_generation_prompt=True, **kwargs):
        calls = [(m["role"], c["function"]["name"], c["function"]["arguments"], m.get("tool_call_id"))
                 for m in messages for c in m.get("tool_calls", [])]
        return f"{[t['function']['name'] for t in kwargs.pop('tools', [])]}{calls}" + super().apply_chat_template(
            messages, add_generation_prompt, **kwargs)


def test_a_template_that_knows_tools_gets_them_and_the_calls_as_objects():
    text = "".join(map(chr, render_chat(ToolTokenizer(), CALLED, tools=TOOLS)))
    assert text.startswith("['add'][('assistant', 'add', {'a': 1}, None)]<user>1+2</><assistant></><tool>3</>")


def test_a_template_that_knows_no_tools_gets_them_as_hermes_text():
    text = rendered(CALLED, tools=TOOLS)
    assert text.startswith("<system>You are a function calling AI model.") and '"name": "add"' in text
    assert '<assistant><tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call></>' in text
    assert rendered(CALLED[:1]) == rendered(CALLED[:1], tools=None)
    with pytest.raises(ValueError, match=r"messages\[1\].tool_calls"):
        rendered([CALLED[0], {**CALLED[1], "tool_calls": [{"function": {"name": "add", "arguments": "[1]"}}]}])
