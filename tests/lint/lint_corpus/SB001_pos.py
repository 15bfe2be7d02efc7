def f(x, idx, src):
    x.index_add_(0, idx, src)  # samebits: deterministic  # expect: SB001 SB301
    # samebits: ok  # expect: SB001
    x.scatter_add_(0, idx, src)  # expect: SB301
    x.index_add_(0, idx, src)  # SAMEBITS: deterministic because  # expect: SB001 SB301
