/* Decode-time matrix products: weights stay in their GGUF format and are
 * decoded in registers; one warp per weight row, up to MATVEC_X activation
 * rows per pass (the decode batch), one shared-memory exchange per warp for
 * the reduction. Prefill
 * (many activation rows) will go to cuBLAS on dequantised tiles instead. */
#include "cuda/kernels.h"
#include "cuda/kernels/quant.cuh"

enum {
    MATVEC_WARPS = 4, /* weight rows per block */
    MATVEC_X = 8,     /* activation rows per block (blockIdx.y picks the group): a batched decode
                         step of 16 sequences reads each weight block twice, not four times */
};

__global__ void matvec_kernel(float *y, const unsigned char *w, uint32_t type, size_t row_bytes, int64_t rows,
                              int64_t cols, const float *x, int64_t n_x) {
    int64_t r = (int64_t)blockIdx.x * MATVEC_WARPS + threadIdx.x / 32;
    if (r >= rows) return; /* whole warps only */
    int lane = threadIdx.x % 32;
    int64_t t0 = (int64_t)blockIdx.y * MATVEC_X;
    int nt = n_x - t0 < MATVEC_X ? (int)(n_x - t0) : MATVEC_X;
    const float *xs = x + (size_t)t0 * cols;
    const unsigned char *row = w + (size_t)r * row_bytes;
    float acc[MATVEC_X];
CU_UNROLL
    for (int t = 0; t < MATVEC_X; t++) acc[t] = 0.0f;
    if (qblock_bytes(type)) {
        /* lane l decodes elements 8l..8l+7 of each 256: for 32-element blocks
         * four lanes a block, for K-quants a warp a super-block */
        for (int64_t i0 = 8 * lane; i0 < cols; i0 += 256) {
            float wk[8];
            decode8_row(type, row, i0, wk);
CU_UNROLL
            for (int t = 0; t < MATVEC_X; t++) {
                if (t >= nt) break;
                const float *xb = xs + (size_t)t * cols + i0;
                float s = 0.0f;
                for (int k = 0; k < 8; k++) s = fmaf(wk[k], xb[k], s);
                acc[t] += s;
            }
        }
    } else {
        for (int64_t i = lane; i < cols; i += 32) {
            float wi = float_element(type, row, i);
CU_UNROLL
            for (int t = 0; t < MATVEC_X; t++)
                if (t < nt) acc[t] = fmaf(wi, xs[(size_t)t * cols + i], acc[t]);
        }
    }
    /* One exchange through shared memory instead of a shuffle tree per
     * activation row: lane t < nt adds up row t's 32 partial sums. */
    __shared__ float part[MATVEC_WARPS][MATVEC_X][33];
    int wi = threadIdx.x / 32;
CU_UNROLL
    for (int t = 0; t < MATVEC_X; t++)
        if (t < nt) part[wi][t][lane] = acc[t];
    __syncwarp();
    if (lane < nt) {
        const float *p = part[wi][lane];
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int i = 0; i < 32; i += 4) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
        }
        y[(size_t)(t0 + lane) * rows + r] = (s0 + s1) + (s2 + s3);
    }
}

extern "C" cudaError_t cuda_matvec(float *y, const void *w, uint32_t type, size_t row_bytes, int64_t rows, int64_t cols,
                                   const float *x, int64_t n_x, cudaStream_t stream) {
    if (!weight_type_ok(type) || rows < 0 || !weight_cols_ok(type, cols) || n_x < 0 ||
        rows > (int64_t)0x7fffffff * MATVEC_WARPS || n_x > (int64_t)65535 * MATVEC_X)
        return cudaErrorInvalidValue;
    if (!rows || !n_x) return cudaSuccess;
    dim3 grid((unsigned)((rows + MATVEC_WARPS - 1) / MATVEC_WARPS), (unsigned)((n_x + MATVEC_X - 1) / MATVEC_X));
    CU_LAUNCH(matvec_kernel, grid, dim3(32 * MATVEC_WARPS), 0, stream, y, static_cast<const unsigned char *>(w), type,
              row_bytes, rows, cols, x, n_x);
    return cudaGetLastError();
}
