"""Output deltas (engine/output_deltas.py): cumulative outputs rebuilt across a pickle equal to the engine's, bit for
bit, however the text moved; and the deltas are small where the outputs are large."""
from __future__ import annotations

import pickle
import random

import torch

from samebits.engine.output_deltas import DeltaDecoder, DeltaEncoder
from samebits.engine.outputs import CompletionOutput, Logprob, RequestOutput

SEED = 0


def _sample(index: int, ids: list[int], lps: list[float] | None, text: str, reason=None, stop=None):
    top = None if lps is None else [{t: lp - 1.0} for t, lp in zip(ids, lps)]
    ranks = None if lps is None else [1 + t % 50 for t in ids]
    return CompletionOutput(index, text, list(ids), None if lps is None else list(lps), top,
                            sum(lps or [0.0]), reason, stop, ranks)


def _steps(rng: random.Random) -> list[list[RequestOutput]]:
    """Three requests over four steps: n=2 with logprobs and prompt logprobs (complete from its first output, sent
    once), one without, one whose text a stop string cuts back."""
    ids = [rng.randrange(1000) for _ in range(8)]
    prompt_lps = [None, {2: Logprob(-1.5, 3, "b")}, {3: Logprob(-0.25, 1, "c"), 7: Logprob(-2.0, 2, "g")}]
    lps = [float(torch.tensor(-rng.random() * 9, dtype=torch.float32)) for _ in range(8)]
    texts = ["ab", "abcd", "abcdef", "abcdefgh"]
    steps = []
    for k in range(4):
        done = k == 3
        n = 2 * (k + 1)
        a = RequestOutput("a", "hi", [1, 2, 3], [_sample(0, ids[:n], lps[:n], texts[k]),
                                                  _sample(1, ids[:k + 1], lps[:k + 1], texts[k][:k + 1])],
                          num_cached_tokens=16, seed=5, fingerprint="fp", finished=done,
                          prompt_logprobs=prompt_lps, first_scheduled_time=100.0 + 1e-9)
        b = RequestOutput("b", None, [4, 5], [_sample(0, ids[:k + 1], None, "x" * (k + 1))], seed=6,
                          fingerprint="fp", first_scheduled_time=101.0)
        cut = "abcXY" if k < 2 else "abc"  # "XY" held text until the stop string "XYZ" showed: cut back
        c = RequestOutput("c", "s", [9], [_sample(0, ids[:k + 1], lps[:k + 1], cut, "stop" if k == 2 else None,
                                                 "XYZ" if k == 2 else None)], seed=7, finished=k == 2)
        steps.append([a, b] + ([c] if k <= 2 else []))
    return steps


def _roundtrip(steps):
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    return [decoder.decode(pickle.loads(pickle.dumps(encoder.encode(outs)))) for outs in steps]


def _bits(outs) -> list[list[int]]:
    return [torch.tensor(c.token_logprobs, dtype=torch.float32).view(torch.int32).tolist()
            for o in outs for c in o.outputs if c.token_logprobs]


def test_rebuilt_outputs_equal_the_engines_bit_for_bit():
    steps = _steps(random.Random(SEED))
    rebuilt = _roundtrip(steps)
    assert rebuilt == steps  # every field: text, ids, logprobs, top logprobs, ranks, reasons, cached tokens, seeds, times
    assert [_bits(o) for o in rebuilt] == [_bits(o) for o in steps]
    assert rebuilt[2][2].outputs[0].text == "abc" and rebuilt[2][2].outputs[0].stop_reason == "XYZ"


def test_rebuilt_outputs_are_fresh_lists():
    rebuilt = _roundtrip(_steps(random.Random(SEED)))
    first, last = rebuilt[0][0].outputs[0], rebuilt[-1][0].outputs[0]
    assert len(first.token_ids) == 2 and len(last.token_ids) == 8  # later steps did not grow the earlier output


def test_negative_control_a_lost_delta_shows():
    steps = _steps(random.Random(SEED))
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    deltas = [encoder.encode(outs) for outs in steps]
    rebuilt = [decoder.decode(d) for i, d in enumerate(deltas) if i != 1]  # step 1's delta never arrives
    assert rebuilt[1] != steps[2]


def test_deltas_stay_small_where_cumulative_outputs_grow():
    rng = random.Random(SEED)
    encoder = DeltaEncoder()
    sizes = []
    for n in range(1, 301):
        ids = [rng.randrange(128000) for _ in range(n)]
        outs = [RequestOutput(f"r{i}", None, list(range(500)), [_sample(0, ids, [-1.5] * n, "t" * 4 * n)], seed=i)
                for i in range(4)]
        sizes.append((len(pickle.dumps(outs)), len(pickle.dumps(encoder.encode(outs)))))
    full, delta = sizes[-1]
    assert delta < full / 20 and sizes[-1][1] <= sizes[1][1]  # the 300th step's delta: no larger than the 2nd's


def test_list_view_reads_as_the_list_it_was_and_never_grows():
    from samebits.engine.outputs import ListView

    items = [3, 1, 4, 1, 5]
    view = ListView(items, 0, 3)
    items += [9, 2, 6]  # appended after the view was taken, as the decoder's lists are
    assert view == [3, 1, 4] and [3, 1, 4] == view and list(view) == [3, 1, 4] and len(view) == 3
    assert view[1:] == [1, 4] and view[-1] == 4 and view[:10] == [3, 1, 4] and view[::-1] == [4, 1, 3]
    assert view != [3, 1, 4, 1] and view != [3, 1, 5]  # negative control: a longer or different list differs
    try:
        view[3]
    except IndexError:
        pass
    else:
        raise AssertionError("an index past the view must not read what came after")
    tail = ListView(items, 2, 5)  # an offset window, as a sequence's output tokens after its prompt
    items[5] = 0  # rewritten past the window's end, as a pending draw is resolved
    assert tail == [4, 1, 5] and tail[0] == 4 and tail[-3] == 4 and tail[1:] == [1, 5] and tail[::-2] == [5, 4]
    assert repr(tail) == "[4, 1, 5]" and tail != [4, 1, 0]
