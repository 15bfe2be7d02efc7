import torch

torch.manual_seed(0)


def sample(logits):
    probs = torch.softmax(logits, -1)
    tok = torch.multinomial(probs, 1)  # expect: SB306
    noise = torch.bernoulli(probs)  # expect: SB306
    gumbel = probs.clone().exponential_()  # expect: SB306
    return tok, noise, gumbel
