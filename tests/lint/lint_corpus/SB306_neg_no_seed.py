import torch


def sample(probs):
    g = torch.Generator(device=probs.device)
    g.manual_seed(1234)
    return torch.multinomial(probs, 1, generator=g), torch.multinomial(probs, 1)
