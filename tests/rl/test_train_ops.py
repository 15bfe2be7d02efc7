"""The trainer's backward: gradients within a tolerance of autograd through transformers' own torch model, and the
same bits run to run."""
import pytest
import torch

from samebits.engine.sampling_params import SamplingParams
from samebits.kernels import get_ops
from samebits.models.llama import LlamaModel
from samebits.models.testing import tiny_hf_config
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


def loss_of(per_seq_raw, per_seq_sampled):
    return sum(w * (r.sum() + 0.5 * s.sum()) for w, r, s in zip(WEIGHTS, per_seq_raw, per_seq_sampled))


def policy_grads(policy) -> dict:
    with deterministic_runtime():
        policy.zero_grad(set_to_none=True)
        loss = loss_of(policy.logprobs(PROMPTS, COMPLETIONS), policy.logprobs(PROMPTS, COMPLETIONS, TEMPERED))
        loss.backward()
    return {n: p.grad.clone() for n, p in policy.model.named_parameters()}


def reference_loss(model):
    """The same loss through transformers' forward and plain torch autograd (the stock ops for log_softmax)."""
    ops = get_ops("fast", "cpu")
    raw, sampled = [], []
    for p, c in zip(PROMPTS, COMPLETIONS):
        logits = model(torch.tensor([p + c[:-1]])).logits[0, len(p) - 1:].float()
        targets = torch.tensor(c)
        raw.append(token_logprobs(logits, targets, ops))
        sampled.append(token_logprobs(logits, targets, ops, [TEMPERED] * len(c)))
    return loss_of(raw, sampled)


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_gradients_match_transformers_autograd(case, seed):
    variant, overrides = VARIANTS[case]
    model = hf_model(variant, overrides, seed)
    policy = Policy.from_hf(model)
    grads = policy_grads(policy)
    reference_loss(model).backward()
    # Our gradients in a model of their own, so `destination` finds an HF tensor's rows of a fused one.
    as_model = LlamaModel(policy.config, get_ops("fast", "cpu"))
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


def test_gradients_bitwise_run_to_run(seed):
    model = hf_model("llama3", {}, seed)
    first = policy_grads(Policy.from_hf(model))
    again = policy_grads(Policy.from_hf(model))
    for name, g in first.items():
        assert torch.equal(g.view(torch.int32), again[name].view(torch.int32)), name


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
