/* The kernels behind selftest.h. */
#include "cuda/cu.cuh"
#include "tests/cuda/selftest.h"

__global__ void shared_exchange_kernel(int *out) {
    __shared__ int buf[1024];
    int t = threadIdx.x, n = blockDim.x;
    buf[t] = blockIdx.x * 10000 + t;
    __syncthreads();
    int v = buf[(t + 1) % n];
    __syncthreads();
    buf[t] = -buf[t];
    __syncthreads();
    out[blockIdx.x * n + t] = v * 2 + buf[(t + 1) % n]; /* = v: its negation was added */
}

extern "C" cudaError_t selftest_shared_exchange(int *out, int blocks, int threads) {
    CU_LAUNCH(shared_exchange_kernel, dim3(blocks), dim3(threads), 0, 0, out);
    return cudaGetLastError();
}

__global__ void warp_ops_kernel(int *out) {
    int t = threadIdx.x, lane = t % 32, n = blockDim.x;
    out[0 * n + t] = __shfl_sync(0xffffffffu, t, lane * 7);
    out[1 * n + t] = __shfl_xor_sync(0xffffffffu, t, 5);
    out[2 * n + t] = __shfl_down_sync(0xffffffffu, t, 3);
    out[3 * n + t] = __shfl_up_sync(0xffffffffu, t, 2);
    out[4 * n + t] = __shfl_sync(0xffffffffu, t, 3, 16);
    out[5 * n + t] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    out[6 * n + t] = __any_sync(0xffffffffu, t == 63);
    out[7 * n + t] = __all_sync(0xffffffffu, t < 64);
}

extern "C" cudaError_t selftest_warp_ops(int *out) {
    CU_LAUNCH(warp_ops_kernel, dim3(1), dim3(64), 0, 0, out);
    return cudaGetLastError();
}

__global__ void dynamic_shared_kernel(float *out, const float *in) {
    CU_DYNAMIC_SHARED(float, buf);
    int t = threadIdx.x, n = blockDim.x;
    buf[t] = in[blockIdx.x * n + t];
    __syncthreads();
    out[blockIdx.x * n + t] = buf[n - 1 - t];
}

extern "C" cudaError_t selftest_dynamic_shared(float *out, const float *in, int blocks, int threads) {
    CU_LAUNCH(dynamic_shared_kernel, dim3(blocks), dim3(threads), threads * sizeof(float), 0, out, in);
    return cudaGetLastError();
}

__global__ void atomics_kernel(unsigned *counter, int *max) {
    atomicAdd(counter, 1u);
    atomicMax(max, (int)(blockIdx.x * blockDim.x + threadIdx.x));
}

extern "C" cudaError_t selftest_atomics(unsigned *counter, int *max, int blocks, int threads) {
    CU_LAUNCH(atomics_kernel, dim3(blocks), dim3(threads), 0, 0, counter, max);
    return cudaGetLastError();
}

/* Packs threadIdx (2 bits x, 1 y, 2 z), blockIdx (1 x, 2 y, 1 z) and the
 * dimensions' product, so one word checks them all. */
__global__ void indices_kernel(uint32_t *out) {
    unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned dims = gridDim.x * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
    out[block * blockDim.x * blockDim.y * blockDim.z + thread] =
        threadIdx.x | threadIdx.y << 2 | threadIdx.z << 3 | blockIdx.x << 5 | blockIdx.y << 6 | blockIdx.z << 8 |
        dims << 9;
}

extern "C" cudaError_t selftest_indices(uint32_t *out) {
    CU_LAUNCH(indices_kernel, dim3(2, 3, 2), dim3(4, 2, 3), 0, 0, out);
    return cudaGetLastError();
}

__global__ void half_kernel(float *out, const __half *h, const __nv_bfloat16 *b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __half2float(h[i] * __float2half(2.0f)) + __bfloat162float(b[i]);
}

extern "C" cudaError_t selftest_half(float *out, const uint16_t *h, const uint16_t *b, int n) {
    CU_LAUNCH(half_kernel, dim3((n + 127) / 128), dim3(128), 0, 0, out, reinterpret_cast<const __half *>(h),
              reinterpret_cast<const __nv_bfloat16 *>(b), n);
    return cudaGetLastError();
}

__global__ void nothing_kernel(int *out) {
    if (out) out[threadIdx.x] = 0;
}

extern "C" cudaError_t selftest_bad_launch(void) {
    CU_LAUNCH(nothing_kernel, dim3(1), dim3(2048), 0, 0, nullptr);
    return cudaGetLastError();
}

__global__ void divergent_kernel(int *out) {
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncwarp();
    if (out) out[threadIdx.x] = 1;
}

extern "C" cudaError_t selftest_divergent_barriers(void) {
    CU_LAUNCH(divergent_kernel, dim3(1), dim3(64), 0, 0, nullptr);
    return cudaGetLastError();
}
