void info() {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("SMs: %d\n", prop.multiProcessorCount);
}

void pack(Params* out, const cudaDeviceProp& prop) {
    Params p;
    fill(&p, prop.multiProcessorCount);  // not an SM-count API: p is not an SM count
    int grid = p.x;
    *out = p;
}

void launch(const float* x, float* y, int n) {
    int blocks = (n + 255) / 256;
    k<<<blocks, 256>>>(x, y, n);
    // k<<<prop.multiProcessorCount, 128>>>(x, y, n);
    const char* doc = "grid = multiProcessorCount";
}

__global__ void k(const float* x, float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] = x[i];
}

void reduce_config(int n) {
    int ctas_per_output = 1;  // the name is tainted below, but this value is a constant
    if (n > 4096) ctas_per_output = n / 4096;
}
