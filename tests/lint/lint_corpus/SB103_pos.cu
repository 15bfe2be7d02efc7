void launch(const float* x, float* y, int n) {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    int num_sms = prop.multiProcessorCount;
    int blocks = num_sms * 4;  // expect: SB103
    k<<<blocks, 256>>>(x, y, n);
    int sm;
    cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0);
    dim3 g(sm * 2);  // expect: SB103
    int per_sm;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, 256, 0);
    for (int w = 0; w < per_sm; ++w) {  // expect: SB103
    }
    k<<<prop.multiProcessorCount, 128>>>(x, y, n);  // expect: SB103
    int waves = per_sm * num_sms;  // expect: SB103
    splitk_kernel<<<dim3(waves), 128>>>(x, y, n);
}

void reduce_config(int n, const cudaDeviceProp* prop) {
    int ctas_per_output = 1;
    const int target_grid_size = prop->multiProcessorCount * 2;  // expect: SB103
    ctas_per_output = (target_grid_size + n - 1) / n;
}
