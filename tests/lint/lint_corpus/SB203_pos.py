import triton


def launch(x, w, kernel):
    M, K = x.shape
    split_k = 4 if M < 64 else 1  # expect: SB203
    SPLIT_K = max(1, 128 // x.shape[0])  # expect: SB203
    num_splits = choose_splits(x.size(0), K)  # expect: SB203
    kernel[(1,)](x, w, SPLIT_K=8 if M <= 16 else 2)  # expect: SB203
    return split_k, SPLIT_K, num_splits


heuristics = triton.heuristics({"SPLIT_K": lambda args: 4 if args["M"] < 32 else 1})  # expect: SB203


class Plan:
    def __init__(self, meta):
        self.num_kv_splits = max(1, 256 // meta.num_seqs)  # expect: SB203
