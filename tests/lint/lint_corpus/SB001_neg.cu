__global__ void k(float* out, const float* x) {
    // samebits: deterministic because one thread per block adds, and the grid is a single block
    atomicAdd(&out[0], x[threadIdx.x]);
    atomicAdd(&out[1], x[0]);  // samebits: deterministic because exactly one thread ever reaches this line
    /* samebits: deterministic because
       the second counter is written by thread 0 of block 0 only */
    atomicAdd(&out[2], x[1]);
    const char* s = "// samebits: ok";
}
