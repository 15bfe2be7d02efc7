def f(x, idx, src):
    # samebits: deterministic because this path runs on the CPU only, where index_add_ is a sequential loop
    x.index_add_(0, idx, src)
    x.scatter_add_(0, idx, src)  # samebits: deterministic because CPU only, a sequential loop in index order
    # samebits: intentionally nondeterministic because this is the demonstration of the bug the probe measures
    x.scatter_add_(0, idx, src)
    note = "samebits: ok"  # a marker in a string is not a comment
