/* Elementwise f32 kernels of the forward pass: SwiGLU, the residual add and
 * the bias add. Grid-stride loops, so any n fits a bounded grid. */
#include "cuda/kernels.h"
#include "cuda/kernels/common.cuh"

#include <math.h>

static const int ELEMENTWISE_THREADS = 256;
static const int64_t ELEMENTWISE_MAX_BLOCKS = 4096;

static dim3 elementwise_grid(int64_t n) {
    int64_t blocks = (n + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS;
    return dim3((unsigned)(blocks < ELEMENTWISE_MAX_BLOCKS ? blocks : ELEMENTWISE_MAX_BLOCKS));
}

/* silu(g) * u written as the CPU backend does: g / (1 + exp(-g)) * u. */
__global__ void swiglu_kernel(float *gate, const float *up, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void add_kernel(float *y, const float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

__global__ void add_bias_kernel(float *y, const float *bias, int64_t total, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += bias[i % n];
}

extern "C" cudaError_t cuda_swiglu_f32(float *gate, const float *up, int64_t n, cudaStream_t stream) {
    if (n < 0) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    CU_LAUNCH(swiglu_kernel, elementwise_grid(n), dim3(ELEMENTWISE_THREADS), 0, stream, gate, up, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_add_f32(float *y, const float *x, int64_t n, cudaStream_t stream) {
    if (n < 0) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    CU_LAUNCH(add_kernel, elementwise_grid(n), dim3(ELEMENTWISE_THREADS), 0, stream, y, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_add_bias_f32(float *y, const float *bias, int64_t rows, int64_t n, cudaStream_t stream) {
    if (rows < 0 || n < 0 || (n && rows > INT64_MAX / n)) return cudaErrorInvalidValue;
    if (!rows || !n) return cudaSuccess;
    CU_LAUNCH(add_bias_kernel, elementwise_grid(rows * n), dim3(ELEMENTWISE_THREADS), 0, stream, y, bias, rows * n, n);
    return cudaGetLastError();
}

/* engine/cpu/cpu_backend.c's SwiGLU loop. */
extern "C" void cuda_swiglu_ref(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
