import torch

torch.manual_seed(0)


def sample(logits, gen):
    probs = torch.softmax(logits, -1)
    tok = torch.multinomial(probs, 1, generator=gen)
    q = torch.empty_like(probs).exponential_(generator=gen)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 4)  # test data and weights, not a sampling draw: not reported
    return tok, q, torch.rand(3, generator=g), x
