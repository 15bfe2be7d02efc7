import torch
import torch.nn.functional as F
from torch import nn


def f(x, idx, src, w):
    x.index_add_(0, idx, src)  # expect: SB301
    torch.index_add(x, 0, idx, src)  # expect: SB301
    x.scatter_add_(0, idx, src)  # expect: SB301
    x.scatter_reduce_(0, idx, src, reduce="sum")  # expect: SB301
    x.scatter_reduce(0, idx, src, "mean")  # expect: SB301
    x.index_put_((idx,), src, accumulate=True)  # expect: SB301
    x.index_put_((idx,), src, True)  # expect: SB301
    torch.bincount(idx, weights=w)  # expect: SB301
    torch.bincount(idx, w)  # expect: SB301
    idx.bincount(w)  # expect: SB301
    torch.histc(x, bins=10)  # expect: SB301
    F.embedding_bag(idx, w, mode="sum")  # expect: SB301
    return nn.EmbeddingBag(100, 16)  # expect: SB301
