__global__ void k(float* out, const float* x) {
    // samebits: trust me  // expect: SB001
    atomicAdd(&out[0], x[threadIdx.x]);  // expect: SB101
    atomicAdd(&out[1], x[0]);  /* samebits: deterministic */  // expect: SB001 SB101
}
