int choose(int M, int N, int K, at::Tensor x) {
    int split_k = M < 64 ? 8 : 1;  // expect: SB104
    const int splitK = heuristic(batch_size, K);  // expect: SB104
    num_splits = std::max(1, 132 / x.size(0));  // expect: SB104
    return split_k;
}
