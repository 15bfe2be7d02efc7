"""The trainer's attention backward (kernels/triton/attention_bwd.py) on small shapes: under TRITON_INTERPRET=1 on a
CPU machine, natively on a GPU. Within fp32 accuracy of the dense torch form (kernels/grads.py); a sequence's gradient
the same bits alone and anywhere in a pack; run to run. Negative control: the atomic dQ variant
(attention_bwd_atomic_demo.py), whose dQ follows the order its programs run in."""
from __future__ import annotations

import itertools

import pytest
import torch

from samebits.kernels import grads as torch_grads
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import fresh_generator

pytestmark = pytest.mark.interpreter
bwd = pytest.importorskip("samebits.kernels.triton.attention_bwd")
demo = pytest.importorskip("samebits.kernels.triton.attention_bwd_atomic_demo")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def dense_forward(q, k, v, cu, scale):
    """o of causal attention per sequence, fp32, rounded to q.dtype (the backward's saved output)."""
    g = q.shape[1] // k.shape[1]
    o = torch.empty_like(q)
    for t0, t1 in itertools.pairwise(cu.tolist()):
        s = torch.einsum("thd,shd->hts", q[t0:t1].float(), k[t0:t1].float().repeat_interleave(g, 1)) * scale
        s = s.masked_fill(torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        o[t0:t1] = torch.einsum("hts,shd->thd", s.softmax(-1), v[t0:t1].float().repeat_interleave(g, 1)).to(q.dtype)
    return o


def make_seqs(lens, hq, hkv, d, dtype, g):
    """Per sequence (q, k, v, o, do), each [len, H, D], on DEVICE; o its forward at scale d^-0.5, computed alone."""
    def r(n, h):
        return torch.randn(n, h, d, generator=g).to(device=DEVICE, dtype=dtype)
    seqs = []
    for n in lens:
        q, k, v = r(n, hq), r(n, hkv), r(n, hkv)
        cu = torch.tensor([0, n], dtype=torch.int32, device=DEVICE)
        seqs.append((q, k, v, dense_forward(q, k, v, cu, d ** -0.5), r(n, hq)))
    return seqs


def packed(seqs, order, scale):
    """The backward of seqs packed in `order` -> (per sequence (dq, dk, dv) in seqs' order, the launch's arguments)."""
    q, k, v, o, do = (torch.cat([seqs[i][j] for i in order]) for j in range(5))
    lens = [seqs[i][0].shape[0] for i in order]
    cu = torch.tensor(list(itertools.accumulate(lens, initial=0)), dtype=torch.int32, device=DEVICE)
    grads = bwd.attention_bwd(q, k, v, o, do, cu, max(lens), scale)
    out = [None] * len(seqs)
    for at, i in enumerate(order):
        out[i] = tuple(t[cu[at]:cu[at + 1]] for t in grads)
    return out, (q, k, v, o, do, cu, max(lens))


# (D, Hq, Hkv, lens): GQA 2 at head dim 64 across a diagonal and several blocks, GQA 3 at 128. Interpreter-sized.
CASES = [(64, 4, 2, [1, 40, 100]), (128, 3, 1, [65, 2])]


@pytest.mark.parametrize("d,hq,hkv,lens", CASES)
def test_gradients_match_the_dense_form(d, hq, hkv, lens, seed):
    seqs = make_seqs(lens, hq, hkv, d, torch.float32, fresh_generator(seed))
    got, args = packed(seqs, range(len(lens)), d ** -0.5)
    want = torch_grads.attention_bwd(*args[:6], args[6], d ** -0.5)
    for name, a, b in zip("qkv", (torch.cat([g[j] for g in got]) for j in range(3)), want):
        err = float((a - b).abs().max() / b.abs().max())
        assert err < 2e-5, f"d{name}: max |err| / max |ref| = {err:.2e}"


@pytest.mark.parametrize("d,hq,hkv,lens", CASES)
def test_a_sequence_gradient_is_the_same_bits_alone_and_anywhere_in_a_pack(d, hq, hkv, lens, seed):
    seqs = make_seqs(lens, hq, hkv, d, torch.bfloat16, fresh_generator(seed))
    scale = d ** -0.5
    alone = [packed([s], [0], scale)[0][0] for s in seqs]
    for order in (range(len(seqs)), reversed(range(len(seqs)))):  # other launches: run to run as well
        got, _ = packed(seqs, list(order), scale)
        for i, (a, b) in enumerate(zip(got, alone)):
            for name, x, y in zip("qkv", a, b):
                assert_same_bits(x, y, f"d{name} of sequence {i} packed in order {list(order)} vs alone")


def test_atomic_dq_control_follows_the_program_order(seed):
    """The atomic variant's dQ changes with the order its key-block programs run in (on the CPU the interpreter runs
    them in grid order, so a reversed grid stands in for the GPU's scheduler; tests/rl/test_train_gpu.py shows the
    run-to-run difference on the GPU); its dK and dV, and the ordered kernels' dQ, do not."""
    d = 64
    seqs = make_seqs([200], 1, 1, d, torch.float32, fresh_generator(seed))
    ordered, args = packed(seqs, [0], d ** -0.5)
    forward = demo.attention_bwd_atomic_dq(*args, d ** -0.5)
    backward = demo.attention_bwd_atomic_dq(*args, d ** -0.5, reversed_grid=True)
    assert not mismatch(forward[0], backward[0]).same, "dQ through atomics did not follow the program order"
    assert_same_bits(forward[1], backward[1], "dK does not take atomics")
    assert float((forward[0] - ordered[0][0]).abs().max() / ordered[0][0].abs().max()) < 1e-5
