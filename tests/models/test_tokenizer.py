"""Chat templates render exactly as transformers renders them; no transformers import at run time."""
import subprocess
import sys

import jinja2
import pytest

from samebits.models.synthetic import write_tiny_checkpoint
from samebits.models.tokenizer import Tokenizer

TEMPLATES = {
    "bos-and-tojson": "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] | tojson }}\n{% endfor %}"
                      "{% if add_generation_prompt %}assistant:{% endif %}",
    "whitespace-control": "{% for m in messages %}\n    {% if m['role'] == 'system' %}\n        [SYS]{{ m['content'] }}"
                          "\n    {% else %}\n        <{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}\n    {% endif %}"
                          "\n{% endfor %}",
    "namespace-loopcontrols": "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m['role'] == 'system' %}"
                              "{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}{{ ns.n }}.{{ m['content'] }} "
                              "{% endfor %}",
    "generation-tag": "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
                      "{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}{% endfor %}",
    "tools-none": "{% if tools is not none %}TOOLS{% endif %}{{ messages[-1]['content'] }}",
}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say \"<hi>\" & bye — ünï"},
            {"role": "assistant", "content": "<hi> & bye"}, {"role": "user", "content": "again"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tok"), "smollm2")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_templates_render_like_transformers(folder, name, add_generation_prompt):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    ours = Tokenizer.from_hf_dir(folder)
    ours.chat_template = TEMPLATES[name]
    expected = ref.apply_chat_template(MESSAGES, chat_template=TEMPLATES[name], tokenize=False,
                                       add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(MESSAGES, add_generation_prompt=add_generation_prompt) == expected


def test_raise_exception_and_missing_template(folder):
    ours = Tokenizer.from_hf_dir(folder)
    ours.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
    with pytest.raises(jinja2.exceptions.TemplateError, match="first must be user"):
        ours.apply_chat_template(MESSAGES)
    ours.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        ours.apply_chat_template(MESSAGES)


def test_special_tokens_and_round_trip(folder):
    tok = Tokenizer.from_hf_dir(folder)
    ids = tok.encode_chat([{"role": "user", "content": "the cat sat"}])
    assert ids[0] == tok.bos_token_id == 1 and tok.eos_token_ids == {2}
    assert tok.decode(ids) == "user\nthe cat sat\nassistant\n"
    assert tok.decode(ids, skip_special_tokens=False).startswith("<|im_start|>user\n")


def test_loading_and_running_never_imports_transformers(folder):
    code = ("import sys, torch; from samebits.models import load_model; m = load_model(sys.argv[1]); "
            "m.tokenizer.encode_chat([{'role': 'user', 'content': 'hi'}]); "
            "assert 'transformers' not in sys.modules, 'transformers was imported'")
    result = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]


EXPORT_TEXTS = ["Hello world", "  spaces\tand\nlines ", "ünï — 你好 🙂", "<|im_start|>user\nhi<|im_end|>", ""]


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_export_loads_in_transformers_with_the_same_ids_text_and_template(tmp_path, kind):
    """`samebits tokenizer export`'s folder, for an HF checkpoint and for a GGUF file (no tokenizer files of its own):
    transformers' AutoTokenizer encodes, decodes and renders the chat template as the served tokenizer does."""
    transformers = pytest.importorskip("transformers")
    from samebits.models.loader import load_tokenizer
    from samebits.models.synthetic import write_tiny_gguf

    source = (write_tiny_checkpoint(tmp_path / "ckpt", "smollm2") if kind == "hf"
              else write_tiny_gguf(tmp_path / "tiny.gguf", "smollm2"))
    ours = load_tokenizer(source)
    ours.save_pretrained(tmp_path / "export")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "export")
    for text in EXPORT_TEXTS:
        ids = ours.encode(text)
        assert theirs.encode(text) == ids, text
        assert theirs.decode(ids) == ours.decode(ids, skip_special_tokens=False)
    assert theirs.eos_token == ours.special_tokens["eos_token"]
    assert (theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
            == ours.apply_chat_template(MESSAGES, add_generation_prompt=True))
