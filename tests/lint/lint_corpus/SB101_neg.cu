__global__ void hist(int* bins, unsigned long long* total, const int* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(&bins[x[i]], 1);
    atomicAdd(total, 1ULL);
    atomicMax(&bins[0], x[i]);
    atomicCAS(&bins[1], 0, 1);
    atomicAdd((int*)out, 1);
    // atomicAdd(&out[0], 1.0f);
    /* atomicAdd(out, 2.0f); */
    const char* msg = "atomicAdd(out, 1.0f)";
    out[i] = 1.0f;
}

__device__ float atomicAdd(float* address, float val);
__device__ inline double atomicAdd_system(double* address, double val) { return 0.0; }

__global__ void ordered(const float* partial, float* out, int n_parts) {
    float acc = 0.f;
    for (int j = 0; j < n_parts; ++j) acc += partial[j];
    out[0] = acc;
}
