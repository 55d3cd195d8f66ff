/* RMS normalisation of f32 rows, optionally fused with the residual add that
 * precedes it: one block per row, a block-wide sum of squares. */
#include "cuda/kernels.h"
#include "cuda/kernels/common.cuh"

#include <math.h>

enum { RMSNORM_THREADS = 256 };

/* delta != NULL: x += delta first (written back), the fused residual step. */
__global__ void rmsnorm_kernel(float *out, float *x, const float *delta, const float *w, int64_t n, float eps) {
    size_t row = (size_t)blockIdx.x * (size_t)n;
    float *xr = x + row;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (delta) {
            v += delta[row + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = block_sum(ss);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[row + i] = xr[i] * scale * w[i];
}

static cudaError_t rmsnorm_launch(float *out, float *x, const float *delta, const float *w, int64_t rows, int64_t n,
                                  float eps, cudaStream_t stream) {
    if (rows < 0 || n < 0 || rows > 0x7fffffff) return cudaErrorInvalidValue;
    if (!rows || !n) return cudaSuccess;
    CU_LAUNCH(rmsnorm_kernel, dim3((unsigned)rows), dim3(RMSNORM_THREADS), 0, stream, out, x, delta, w, n, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_rmsnorm_f32(float *out, const float *x, const float *w, int64_t rows, int64_t n,
                                        float eps, cudaStream_t stream) {
    /* without delta the kernel never writes x */
    return rmsnorm_launch(out, const_cast<float *>(x), nullptr, w, rows, n, eps, stream);
}

extern "C" cudaError_t cuda_add_rmsnorm_f32(float *out, float *x, const float *delta, const float *w, int64_t rows,
                                            int64_t n, float eps, cudaStream_t stream) {
    if (!delta) return cudaErrorInvalidValue;
    return rmsnorm_launch(out, x, delta, w, rows, n, eps, stream);
}

/* engine/cpu/cpu_backend.c's rmsnorm, row by row (double sum of squares). */
extern "C" void cuda_rmsnorm_ref(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
        for (int64_t i = 0; i < n; i++) out[r * n + i] = xr[i] * scale * w[i];
    }
}
