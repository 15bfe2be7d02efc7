"""The output processor: every stop rule in one place, with the precedence the engine reports (torch-free)."""
import functools
import math
import operator
import random

import pytest

from samebits.engine.output_processor import OutputProcessor
from samebits.engine.outputs import StepResult
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.scheduler import ScheduledSeq, SchedulerOutput
from samebits.engine.sequence import Sequence

EOS = 0


class LetterTokenizer:
    """Token t decodes to one letter; EOS is the one special token ("<eos>" when special tokens are kept)."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return "".join(("" if skip_special_tokens else "<eos>") if t == EOS else chr(ord("A") + t) for t in ids)


def feed(tokens, max_model_len=64, logprobs=None, **params):
    """Sample `tokens` (with `logprobs`, else -0.5 each) one step at a time into a fresh request; returns the
    decisions of the last step."""
    proc = OutputProcessor(LetterTokenizer(), {EOS}, max_model_len)
    seq = Sequence("r", [1, 2], SamplingParams(**params))
    proc.add_request("r", None, [1, 2], 7, [seq])
    finished = []
    for t, lp in zip(tokens, logprobs or [-0.5] * len(tokens)):
        assert not finished, "a finished sequence got another token"
        out = SchedulerOutput([ScheduledSeq(seq, 1, True, seq.num_tokens - 1)])
        seq.reserve_token()  # as Scheduler.schedule does for a chunk that samples
        finished = proc.process(out, {seq.seq_id: StepResult(t, lp, {})})
    return proc, seq, finished


@pytest.mark.parametrize("tokens, params, want", [
    ([3, 4, EOS], {}, ("stop", None)),
    ([3, 4, EOS], {"ignore_eos": True, "max_tokens": 3}, ("length", None)),
    ([3, 9], {"stop_token_ids": [9]}, ("stop", 9)),
    ([3, 4, 5], {"stop": ["EF"]}, ("stop", "EF")),
    ([3, 4], {"max_tokens": 2}, ("length", None)),
    ([3, 4], {"max_tokens": 2, "stop": ["DE"]}, ("stop", "DE")),  # the last allowed token completes a stop: stop
    ([3, 4], {"max_tokens": 9}, None),
    ([3, 4, 3], {"stop": ["D"], "min_tokens": 2}, ("stop", "D")),  # as vLLM: no stop string before min_tokens
    ([3, 4], {"stop": ["D"], "min_tokens": 2}, None),
])
def test_every_stop_rule(tokens, params, want):
    _, seq, finished = feed(tokens, **params)
    assert [(f.reason, f.stop_reason) for f in finished] == ([want] if want else [])
    assert all(f.seq is seq for f in finished)


@pytest.mark.parametrize("tokens, params, text", [
    ([3, 4, 5], {"stop": ["F"]}, "DE"),
    ([3, 4, 5], {"stop": ["F"], "include_stop_str_in_output": True}, "DEF"),
    ([3, 4, 5], {"stop": ["EF"], "include_stop_str_in_output": True}, "DEF"),
    ([3, 4, EOS], {}, "DE"),
    ([3, 4, EOS], {"skip_special_tokens": False}, "DE"),  # the ending eos is no text, as in vLLM
    ([3, 4, EOS], {"skip_special_tokens": False, "include_stop_str_in_output": True}, "DE<eos>"),
    ([3, EOS, 4], {"skip_special_tokens": False, "ignore_eos": True, "max_tokens": 3}, "D<eos>E"),
    ([3, EOS, 4], {"ignore_eos": True, "max_tokens": 3}, "DE"),
])
def test_text_options(tokens, params, text):
    proc, seq, finished = feed(tokens, **params)
    assert finished and proc.samples[seq.seq_id].text == text and seq.output_token_ids == tokens


def test_context_limit_is_a_length_stop():
    _, seq, finished = feed([3, 4], max_model_len=4, max_tokens=9)
    assert [(f.reason, f.stop_reason) for f in finished] == [("length", None)] and seq.num_tokens == 4


def test_stop_string_truncates_the_text_and_outputs_are_cumulative():
    proc, seq, finished = feed([3, 4, 5], stop=["F"])
    assert [(f.reason, f.stop_reason) for f in finished] == [("stop", "F")]
    assert proc.samples[seq.seq_id].text == "DE" and seq.output_token_ids == [3, 4, 5]
    (out,) = proc.outputs()
    c = out.outputs[0]
    assert (c.text, c.token_ids, c.logprobs, c.cumulative_logprob) == ("DE", [3, 4, 5], None, -1.5)


def test_a_sampled_chunk_without_a_draw_is_refused():
    proc = OutputProcessor(LetterTokenizer(), {EOS}, 64)
    seq = Sequence("r", [1, 2])
    proc.add_request("r", None, [1, 2], 7, [seq])
    with pytest.raises(ValueError, match="no sampled token"):
        proc.process(SchedulerOutput([ScheduledSeq(seq, 2, True, 0)]), {})
    assert proc.process(SchedulerOutput([ScheduledSeq(seq, 1, False, 0)]), {}) == []


def test_cumulative_logprob_adds_left_to_right_on_every_python(seed):
    """Python 3.12's sum() compensates (as math.fsum does) and 3.11's does not; the engine's own fold is the same on
    both. Negative control: the compensated sum of these logprobs has other bits."""
    rnd = random.Random(seed)
    # After -3.0 each tiny logprob is below half an ulp, so a left-to-right fold drops it and a compensated sum not.
    lps = [-3.0] + [-rnd.uniform(1e-17, 1e-16) for _ in range(199)]
    proc, _, _ = feed([3] * 200, max_model_len=256, logprobs=lps, max_tokens=200)
    (out,) = proc.outputs()
    assert out.outputs[0].cumulative_logprob == functools.reduce(operator.add, lps, 0.0)
    assert math.fsum(lps) != functools.reduce(operator.add, lps, 0.0)


def windowed_texts(tok, tokens, skip):
    """The text after each token by the windowed decode as the processor first did it (vLLM's offsets, decoding
    slices of a copy of the whole output each step): the reference the processor's must equal, step for step."""
    texts, text, prefix, read = [], "", 0, 0
    for k in range(1, len(tokens) + 1):
        ids = tokens[:k]
        before = tok.decode(ids[prefix:read], skip_special_tokens=skip)
        after = tok.decode(ids[prefix:], skip_special_tokens=skip)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            text += after[len(before):]
            prefix, read = read, len(ids)
        texts.append(text)
    return texts


def stream_texts(tok, prompt, tokens, skip):
    """The processor's text after each of `tokens` (the last one ends the sample by length, which flushes)."""
    proc = OutputProcessor(tok, tok.eos_token_ids, 4096)
    seq = Sequence("r", prompt, SamplingParams(max_tokens=len(tokens), ignore_eos=True, skip_special_tokens=skip))
    proc.add_request("r", None, prompt, 7, [seq])
    texts = []
    for t in tokens:
        seq.reserve_token()
        proc.process(SchedulerOutput([ScheduledSeq(seq, 1, True, seq.num_tokens - 2)]), {seq.seq_id: StepResult(t, -0.5, {})})
        texts.append(proc.samples[seq.seq_id].text)
    return texts


def test_incremental_text_over_random_byte_level_streams(seed):
    """Random streams over a real byte-level BPE: lone bytes that split (or never complete) a UTF-8 character, merged
    words and the special tokens. Every step's text equals the windowed reference's, and the flushed final text the
    full decode. Negative control: appending each token's own decode differs (it breaks split characters)."""
    from samebits.models.synthetic import build_tokenizer
    from samebits.models.tokenizer import Tokenizer

    tok = Tokenizer(build_tokenizer(), {"eos_token": "<|im_end|>"})
    rnd, vocab = random.Random(seed), tok.vocab_size
    utf8 = [t for t in range(vocab) if tok.decode([t], skip_special_tokens=False) in ("é", "😀")]
    naive_differs = False
    for _ in range(60):
        prompt = [rnd.randrange(3, vocab) for _ in range(rnd.randrange(1, 6))]
        tokens = [rnd.randrange(vocab) for _ in range(rnd.randrange(1, 40))]
        tokens += tok.encode("é 😀 naïve", add_special_tokens=False)  # whole characters of 2 and 4 bytes
        skip = rnd.random() < 0.5
        texts = stream_texts(tok, prompt, tokens, skip)
        assert texts[:-1] == windowed_texts(tok, tokens, skip)[:-1]
        assert texts[-1] == tok.decode(tokens, skip_special_tokens=skip)
        naive_differs |= texts[-1] != "".join(tok.decode([t], skip_special_tokens=skip) for t in tokens)
    assert not utf8 and naive_differs, "the 2- and 4-byte characters must span several tokens"
