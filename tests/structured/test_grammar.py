"""StructuredOutputsParams' shape, llguidance compiles and its errors, one matcher per sample, the row-local masks."""
import json

import pytest
import torch

from samebits.engine.sampling_params import SamplingParams
from samebits.engine.sequence import Sequence, SequenceStatus
from samebits.models.synthetic import build_tokenizer
from samebits.models.tokenizer import Tokenizer
from samebits.structured.grammar import COMPLETE, REJECTED, GrammarError, Grammars, closed_objects
from samebits.structured.masks import GrammarRows, unpack
from samebits.structured.params import StructuredOutputsParams as S

VOCAB = 320


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(build_tokenizer(), {"eos_token": "<|endoftext|>"})


@pytest.fixture(scope="module")
def grammars(tok):
    return Grammars(tok, VOCAB)


@pytest.mark.parametrize("kwargs,words", [
    ({}, "exactly one"), ({"regex": "a", "choice": ["a"]}, "exactly one"), ({"json": "{"}, "not valid JSON"),
    ({"json": "[1]"}, "JSON object"), ({"choice": []}, "choice"), ({"choice": ["a", ""]}, "choice"),
    ({"grammar": " "}, "grammar"), ({"json_object": False}, "exactly one"), ({"regex": 5}, "regex"),
    ({"regex": "a", "disable_any_whitespace": 1}, "bool"),
])
def test_params_refuse_a_bad_shape(kwargs, words):
    with pytest.raises(ValueError, match=words):
        S(**kwargs)


def test_params_name_unknown_and_unimplemented_fields():
    with pytest.raises(TypeError, match="'regexp' is unknown"):
        S(regexp="a")
    with pytest.raises(TypeError, match="'structural_tag' is a vLLM field samebits does not implement"):
        S(structural_tag="{}")


def test_sampling_params_carry_it_and_refuse_what_could_leave_no_token():
    assert SamplingParams(structured_outputs=S(regex="a")).structured_outputs.kind == "regex"
    with pytest.raises(ValueError, match="^min_tokens cannot"):
        SamplingParams(structured_outputs=S(regex="a"), min_tokens=1)
    with pytest.raises(ValueError, match="^allowed_token_ids cannot"):
        SamplingParams(structured_outputs=S(regex="a"), allowed_token_ids=[1])
    with pytest.raises(ValueError, match="StructuredOutputsParams"):
        SamplingParams(structured_outputs={"regex": "a"})


@pytest.mark.parametrize("so,kind,words", [
    (S(json={"type": "objekt"}), "json", "objekt"), (S(regex="(ab"), "regex", "unclosed group"),
    (S(grammar="start: foo"), "grammar", "unknown name"), (S(json={"properties": {"a": {"$ref": "#/no"}}}), "json",
                                                           "/no"),
])
def test_a_bad_constraint_names_its_field_and_llguidances_reason(grammars, so, kind, words):
    with pytest.raises(GrammarError, match=words) as e:
        grammars.compile(so)
    assert e.value.kind == kind and str(e.value).startswith(f"structured_outputs.{kind} is not valid")


def test_closed_objects_and_gbnf():
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}, "b": {"type": "string"}},
              "additionalProperties": True}
    assert closed_objects(schema) == {"type": "object", "additionalProperties": True, "properties": {
        "a": {"type": "object", "properties": {}, "additionalProperties": False}, "b": {"type": "string"}}}
    assert S(grammar='root ::= "a" [0-9]').kind == "grammar"


def seq_of(tok, text: str, so) -> Sequence:
    s = Sequence("r", [5, 6], SamplingParams(structured_outputs=so))
    for t in tok.encode(text, add_special_tokens=False):
        s.reserve_token()
        s.resolve_token(t)
    return s


def allowed(words: torch.Tensor) -> set[int]:
    return {t for t in range(VOCAB) if int(words[t // 32]) >> (t % 32) & 1}


def test_a_matcher_follows_its_own_tokens_and_ends_the_sample(tok, grammars):
    so = S(json={"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"],
                 "additionalProperties": False}, disable_any_whitespace=True)
    (m,) = grammars.matchers(so, 1)
    s = seq_of(tok, '{"k": ', so)
    assert m.advance(s) is None and m.consumed == len(s.token_ids) - 2
    row = torch.zeros(VOCAB // 32, dtype=torch.int32)
    m.fill(row, s, len(s.token_ids))
    assert {tok.decode([t]) for t in allowed(row)} == {"1", "2"}
    with pytest.raises(RuntimeError, match="the mask is for generated token"):
        m.fill(row, s, len(s.token_ids) + 1)
    for t in tok.encode("2}", add_special_tokens=False):
        s.reserve_token()
        s.resolve_token(t)
    assert m.advance(s) == COMPLETE
    (bad,) = grammars.matchers(so, 1)
    assert bad.advance(seq_of(tok, "x", so)) == REJECTED


def test_unpack_matches_the_bits():
    g = torch.Generator().manual_seed(0)
    words = torch.randint(-2**31, 2**31 - 1, (3, 10), dtype=torch.int32, generator=g)
    got = unpack(words, 300)
    ref = torch.tensor([[bool(int(w[t // 32]) >> (t % 32) & 1) for t in range(300)] for w in words])
    assert torch.equal(got, ref)


def test_masks_touch_the_grammar_rows_only_and_a_finished_row_not_at_all(tok, grammars):
    a, b = S(choice=["yes", "no"]), S(regex="[0-9]")
    seqs = [Sequence("u", [5, 6]), seq_of(tok, "", a), seq_of(tok, "", b), seq_of(tok, "", b)]
    seqs[3].status = SequenceStatus.FINISHED_STOPPED
    for s, m in zip(seqs[1:], [grammars.matchers(a, 1)[0], *grammars.matchers(b, 2)]):
        s.grammar = m
    rows = GrammarRows.of(seqs, [2, 2, 2, 2])
    assert rows.rows == [1, 2, 3] and rows.ready()
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(1))
    out = rows.apply(logits)
    assert torch.equal(out[0].view(torch.int32), logits[0].view(torch.int32))
    assert torch.equal(out[3].view(torch.int32), logits[3].view(torch.int32))
    assert {tok.decode([t]) for t in torch.nonzero(out[2].isfinite())[:, 0].tolist()} == set("0123456789")
    kept = torch.nonzero(out[1].isfinite())[:, 0].tolist()
    assert kept and all(out[1, t] == logits[1, t] for t in kept)
    assert {tok.decode([t])[:1] for t in kept} == {"y", "n"}
    seqs[1].reserve_token()  # its last token not read back yet: the batch must wait (model_runner.DeferredStep)
    assert not GrammarRows.of(seqs, [2, 3, 2, 2]).ready()


def test_grammars_read_the_tokenizer_json_and_size_the_mask_to_the_logits(grammars):
    assert grammars.lltokenizer.vocab_size == VOCAB
    assert json.loads(grammars.tokenizer.backend.to_str())["model"]["type"] == "BPE"
