int choose(int M, int N, int K) {
    const int split_k = K / 4096;
    int kSplitSize = 256;
    int blocks_m = (M + 63) / 64;
    bool split = false;
    for (int s = 0; s < split_k; ++s) {}
    // int split_k = M < 64 ? 8 : 1;
    return split_k;
}
