#include <cuda_fp16.h>
#include <cuda_bf16.h>

__global__ void k(float* out, const float* x, __half* h, double* d, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&out[0], x[i]);  // expect: SB101
    atomicAdd(out + 1, 1.0f);  // expect: SB101
    atomicAdd_block(&d[i % 4], 2.0);  // expect: SB101
    atomicAdd_system(h, __float2half(1.0f));  // expect: SB101
    atomicAdd(reinterpret_cast<float*>(buf), v);  // expect: SB101
}

template <typename scalar_t>
__global__ void index_add_kernel(scalar_t* grad, const scalar_t* g, const int64_t* idx) {
    gpuAtomicAdd(&grad[idx[threadIdx.x]], g[threadIdx.x]);  // expect: SB101
}

__global__ void bf(__nv_bfloat162* acc, __nv_bfloat162 v, float scale) {
    atomicAdd(acc,  // expect: SB101
              v);
    atomicAdd(&unknown_buffer[3], scale);  // expect: SB101
    if (scale > 0) return ::atomicAdd(&unknown_buffer[4], scale);  // expect: SB101
}
