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
    MATVEC_UNROLL = 4, /* runs of 256 elements a lane decodes before multiplying */
};

/* Row r's products with activation rows [t0, t0 + nt): the quantised blocks
 * of type TYPE (a template argument, so each type's decoding is compiled
 * without a switch), MATVEC_UNROLL runs of 256 elements decoded before any is
 * multiplied (their loads in flight together: a warp's rows are short and
 * latency, not bandwidth, bounded the one-run-at-a-time loop). The sums are
 * added in the same order as one run at a time. */
template <uint32_t TYPE>
__device__ __forceinline__ void matvec_quant_row(const unsigned char *__restrict__ row, int64_t cols,
                                                 const float *__restrict__ xs, int nt, int lane,
                                                 float acc[MATVEC_X]) {
    for (int64_t i0 = 8 * lane; i0 < cols; i0 += 256 * MATVEC_UNROLL) {
        float wk[MATVEC_UNROLL][8];
CU_UNROLL
        for (int u = 0; u < MATVEC_UNROLL; u++)
            if (i0 + 256 * u < cols) decode8_row(TYPE, row, i0 + 256 * u, wk[u]);
CU_UNROLL
        for (int u = 0; u < MATVEC_UNROLL; u++) {
            int64_t i = i0 + 256 * u;
            if (i >= cols) break;
CU_UNROLL
            for (int t = 0; t < MATVEC_X; t++) {
                if (t >= nt) break;
                const float *xb = xs + (size_t)t * cols + i;
                float s = 0.0f;
                for (int k = 0; k < 8; k++) s = fmaf(wk[u][k], xb[k], s);
                acc[t] += s;
            }
        }
    }
}

/* TYPE 0 (GGML_TYPE_F32) stands for the float types, read element by element. */
template <uint32_t TYPE>
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
    if constexpr (TYPE != GGML_TYPE_F32) {
        /* lane l decodes elements 8l..8l+7 of each 256: for 32-element blocks
         * four lanes a block, for K-quants a warp a super-block */
        matvec_quant_row<TYPE>(row, cols, xs, nt, lane, acc);
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
    const unsigned char *wb = static_cast<const unsigned char *>(w);
    dim3 block(32 * MATVEC_WARPS);
#define MATVEC_CASE(T)                                                                                \
    case T: CU_LAUNCH(matvec_kernel<T>, grid, block, 0, stream, y, wb, type, row_bytes, rows, cols, x, n_x); break
    switch (type) {
        MATVEC_CASE(GGML_TYPE_Q4_0);
        MATVEC_CASE(GGML_TYPE_Q4_1);
        MATVEC_CASE(GGML_TYPE_Q5_0);
        MATVEC_CASE(GGML_TYPE_Q5_1);
        MATVEC_CASE(GGML_TYPE_Q8_0);
        MATVEC_CASE(GGML_TYPE_Q2_K);
        MATVEC_CASE(GGML_TYPE_Q3_K);
        MATVEC_CASE(GGML_TYPE_Q4_K);
        MATVEC_CASE(GGML_TYPE_Q5_K);
        MATVEC_CASE(GGML_TYPE_Q6_K);
    default: /* F32, F16, BF16 */
        CU_LAUNCH(matvec_kernel<GGML_TYPE_F32>, grid, block, 0, stream, y, wb, type, row_bytes, rows, cols, x, n_x);
    }
#undef MATVEC_CASE
    return cudaGetLastError();
}
