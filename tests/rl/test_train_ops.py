"""The trainer's backward: gradients within a tolerance of autograd through transformers' own torch model, and the
same bits run to run."""
import copy

import pytest
import torch

from samebits.engine.sampling_params import SamplingParams
from samebits.kernels import get_ops
from samebits.models.llama import LlamaModel
from samebits.models.synthetic import hf_parameters_to, tiny_hf_config
from samebits.rl import policy as policy_module
from samebits.rl.policy import Policy
from samebits.rl.sampling import token_logprobs
from samebits.rl.train_ops import TrainOps
from samebits.runtime import deterministic_runtime

transformers = pytest.importorskip("transformers")

# fp32, weights of std 0.08: measured max |grad error| / max |grad| <= 3e-6 over every tensor; the bound leaves room.
REL_TOL = 1e-4
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
COMPLETIONS = [[31, 32, 33], [34, 35, 36, 37, 38], [39, 40]]
WEIGHTS = (0.7, 1.3, -0.4)  # per-sequence loss weights, as GRPO advantages
TEMPERED = SamplingParams(temperature=0.7, top_k=50)
VARIANTS = {"llama3": ("llama3", {}), "qwen2-bias-tied": ("qwen2", {"tie_word_embeddings": True}),
            "qwen3-qk-norm": ("qwen3", {})}


def hf_model(variant, overrides, seed):
    hf = tiny_hf_config(variant, hidden_size=128, intermediate_size=256, vocab_size=512, **overrides)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.08 * torch.randn_like(p))
    return model


def policy_grads(policy, order=(0, 1, 2)) -> dict:
    """The loss's gradients, the micro-batch's sequences (and their loss weights) listed in `order`."""
    prompts, completions = [PROMPTS[i] for i in order], [COMPLETIONS[i] for i in order]
    weights = [WEIGHTS[i] for i in order]
    with deterministic_runtime():
        policy.zero_grad(set_to_none=True)
        raw, sampled = policy.logprobs(prompts, completions), policy.logprobs(prompts, completions, TEMPERED)
        loss = sum(w * (r.sum() + 0.5 * s.sum()) for w, r, s in zip(weights, raw, sampled))
        loss.backward()
    return {n: p.grad.clone() for n, p in policy.model.named_parameters()}


def differing(a: dict, b: dict) -> list[str]:
    return [n for n in a if not torch.equal(a[n].view(torch.int32), b[n].view(torch.int32))]


def reference_loss(model):
    """The same loss through transformers' forward and plain torch autograd (the stock ops for log_softmax)."""
    device = next(model.parameters()).device
    ops = get_ops("fast", device)
    raw, sampled = [], []
    for p, c in zip(PROMPTS, COMPLETIONS):
        logits = model(torch.tensor([p + c[:-1]], device=device)).logits[0, len(p) - 1:].float()
        targets = torch.tensor(c, device=device)
        raw.append(token_logprobs(logits, targets, ops))
        sampled.append(token_logprobs(logits, targets, ops, [TEMPERED] * len(c)))
    return sum(w * (r.sum() + 0.5 * s.sum()) for w, r, s in zip(WEIGHTS, raw, sampled))


def assert_gradients_match_transformers(case, seed, device="cpu", **policy_args):
    variant, overrides = VARIANTS[case]
    model = hf_model(variant, overrides, seed).to(device)
    policy = Policy.from_hf(model, **policy_args)
    grads = policy_grads(policy)
    reference_loss(model).backward()
    # Our gradients in a model of their own, so `destination` finds an HF tensor's rows of a fused one.
    as_model = LlamaModel(policy.config, get_ops("fast", device))
    for name, q in as_model.named_parameters():
        q.data.copy_(grads[name])
    checked = 0
    for name, p in model.named_parameters():
        if policy.model.ignorable(name):
            continue
        ours = as_model.destination(name)
        scale = float(p.grad.abs().max())
        assert scale > 0, name
        assert float((ours - p.grad).abs().max()) <= REL_TOL * scale, name
        checked += 1
    assert checked == len(policy.model.expected_weight_names())


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_gradients_match_transformers_autograd(case, seed):
    """The fused backward (kernels/grads.py's torch forms on the CPU)."""
    assert_gradients_match_transformers(case, seed)


def test_reference_backward_matches_transformers_autograd(seed):
    """The reference backward that fast mode keeps (autograd through rl/reference.py)."""
    assert_gradients_match_transformers("qwen3-qk-norm", seed, backward="reference")


def test_gradients_bitwise_run_to_run(seed):
    model = hf_model("llama3", {}, seed)
    first = policy_grads(Policy.from_hf(model))
    assert not differing(first, policy_grads(Policy.from_hf(model)))


def test_gradients_independent_of_the_packing_order(seed, monkeypatch):
    """A micro-batch is packed by content (rl/policy.py packing_order): listing its sequences in another order gives
    the same gradient bits. Negative control: packed in the caller's order, the weight gradients' sums over the
    tokens run in another order and round otherwise."""
    policy = Policy.from_hf(hf_model("llama3", {}, seed))
    first = policy_grads(policy)
    assert not differing(first, policy_grads(policy, order=(2, 0, 1)))
    monkeypatch.setattr(policy_module, "packing_order", lambda prompts, completions: list(range(len(prompts))))
    assert differing(first, policy_grads(policy, order=(2, 0, 1)))


def test_checkpointed_layers_give_the_same_gradient_bits(seed):
    model = hf_model("qwen3", {}, seed)
    assert not differing(policy_grads(Policy.from_hf(model)), policy_grads(Policy.from_hf(model, checkpoint=True)))


def test_forward_bits_are_the_base_ops(seed):
    base = get_ops("deterministic", "cpu")
    ops = TrainOps(base)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(37, 64, generator=gen, requires_grad=True)
    w = torch.randn(96, 64, generator=gen, requires_grad=True)
    assert torch.equal(ops.linear(x, w).detach().view(torch.int32), base.linear(x.detach(), w.detach()).view(torch.int32))
    norm_w = torch.randn(64, generator=gen)
    assert torch.equal(ops.rms_norm(x, norm_w, 1e-5).detach(), base.rms_norm(x.detach(), norm_w, 1e-5))
    assert torch.equal(ops.log_softmax(x).detach(), base.log_softmax(x.detach()))


def test_attention_without_write_kv_is_refused():
    ops = TrainOps(get_ops("deterministic", "cpu"))
    with pytest.raises(RuntimeError, match="no write_kv into this cache came first"):
        ops.attention(torch.zeros(1, 1, 64), torch.zeros(1, 16, 1, 64), torch.zeros(1, 16, 1, 64), None, 0.125)


def gradients_in_our_names(config, model, loss) -> dict:
    """loss(model)'s gradients of a transformers module under samebits' (fused) parameter names, in fp32."""
    loss(model).backward()
    ours = LlamaModel(config, get_ops("fast", "cpu"))
    ours.load_weights((n, p.grad.float().cpu()) for n, p in model.named_parameters())
    return {n: p.detach() for n, p in ours.named_parameters()}


def relative_errors(grads: dict, truth: dict) -> list[float]:
    """Per tensor max |grads - truth| / max |truth|, sorted."""
    return sorted(float((grads[n].float().cpu() - t).abs().max() / t.abs().max()) for n, t in truth.items())


def assert_bf16_error_within_transformers(seed, device="cpu"):
    """samebits' bf16 gradients against transformers' fp32 ones from the same weights (fp32 ones rounded to bf16;
    transformers' RoPE frequencies kept fp32 in both, hf_parameters_to): the median tensor's error within 1.5x of
    transformers' bf16 autograd's, the largest within 2x (one tensor: noisier)."""
    model = hf_parameters_to(hf_parameters_to(hf_model("llama3", {}, seed), torch.bfloat16), torch.float32).to(device)
    config = Policy.from_hf(model).config
    truth = gradients_in_our_names(config, model, reference_loss)
    hf_bf16 = hf_parameters_to(model, torch.bfloat16)
    hf_bf16.zero_grad(set_to_none=True)
    theirs = relative_errors(gradients_in_our_names(config, hf_bf16, reference_loss), truth)
    ours = relative_errors(policy_grads(Policy.from_hf(hf_bf16)), truth)
    assert ours[-1] <= 2.0 * theirs[-1], (ours[-1], theirs[-1])
    assert ours[len(ours) // 2] <= 1.5 * theirs[len(theirs) // 2], (ours[len(ours) // 2], theirs[len(theirs) // 2])


def test_bf16_gradient_error_is_transformers_bf16_error(seed):
    """Measured 0.81-1.12x transformers' error (median tensor) and 0.83-1.11x (largest) over seeds 1-6."""
    assert_bf16_error_within_transformers(seed)


def test_module_to_rounds_transformers_rope_frequencies():
    """The control for the comparison above: `Module.to(bf16)` rounds transformers' RoPE inv_freq buffer and `.float()`
    keeps the rounding, so a reference built that way is another model (benchmarks/rl.py measured samebits against it
    at 3x transformers' bf16 error); hf_parameters_to leaves the buffer exact."""
    model = hf_model("llama3", {}, 0)
    exact = {n: b.clone() for n, b in model.named_buffers() if n.endswith("inv_freq")}
    assert exact
    kept = hf_parameters_to(hf_parameters_to(copy.deepcopy(model), torch.bfloat16), torch.float32)
    rounded = copy.deepcopy(model).to(torch.bfloat16).float()
    for name, b in exact.items():
        assert torch.equal(dict(kept.named_buffers())[name], b)
        assert not torch.equal(dict(rounded.named_buffers())[name], b)
