import torch

SPLIT = 128


def launch(x, meta, cfg, kernel):
    M, K = x.shape
    split_k = triton.cdiv(K, 4096)
    n_split_grid = -(-meta.max_context_len // SPLIT)
    splits = torch.split(x, M)
    kernel[(M,)](x, SPLIT_K=cfg["split"])
    parts = x.split(M)
    out_split_k = matmul_split_k(x, b)  # `b` is the second operand here, not a batch
    return split_k, n_split_grid, splits, parts, out_split_k
