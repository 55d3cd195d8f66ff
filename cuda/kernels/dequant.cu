/* Whole weight matrices to f32 (the operand of the prefill GEMMs), and new
 * K/V rows into a pot layer on the device. Grid-stride loops over a bounded
 * grid: one thread per 8-element group of a weight row. */
#include "cuda/kernels.h"
#include "cuda/kernels/quant.cuh"

enum { DQ_THREADS = 256, DQ_MAX_BLOCKS = 4096, DQ_GROUP = 8 /* elements a thread decodes at once */ };

template <class T>
__global__ void dequantize_kernel(T *out, const unsigned char *w, uint32_t type, size_t row_bytes, int64_t rows,
                                  int64_t cols) {
    int64_t groups = (cols + DQ_GROUP - 1) / DQ_GROUP, n = rows * groups;
    bool quantised = qblock_bytes(type) != 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / groups, c0 = (i % groups) * DQ_GROUP;
        const unsigned char *row = w + (size_t)r * row_bytes;
        T *o = out + (size_t)r * cols + c0;
        float v[DQ_GROUP];
        int m = cols - c0 < DQ_GROUP ? (int)(cols - c0) : DQ_GROUP; /* a float row's tail */
        if (quantised)
            decode8_row(type, row, c0, v);
        else
            for (int k = 0; k < m; k++) v[k] = float_element(type, row, c0 + k);
        for (int k = 0; k < m; k++) o[k] = from_f32<T>(v[k]);
    }
}

template <class T>
static cudaError_t dequantize(T *out, const void *w, uint32_t type, size_t row_bytes, int64_t rows, int64_t cols,
                              cudaStream_t stream) {
    if (!weight_type_ok(type) || rows < 0 || !weight_cols_ok(type, cols)) return cudaErrorInvalidValue;
    if (!rows || !cols) return cudaSuccess;
    int64_t n = rows * ((cols + DQ_GROUP - 1) / DQ_GROUP), blocks = (n + DQ_THREADS - 1) / DQ_THREADS;
    if (blocks > DQ_MAX_BLOCKS) blocks = DQ_MAX_BLOCKS;
    CU_LAUNCH(dequantize_kernel<T>, dim3((unsigned)blocks), dim3(DQ_THREADS), 0, stream, out,
              static_cast<const unsigned char *>(w), type, row_bytes, rows, cols);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_dequantize_rows(float *out, const void *w, uint32_t type, size_t row_bytes, int64_t rows,
                                            int64_t cols, cudaStream_t stream) {
    return dequantize<float>(out, w, type, row_bytes, rows, cols, stream);
}

extern "C" cudaError_t cuda_dequantize_rows_f16(void *out, const void *w, uint32_t type, size_t row_bytes,
                                                int64_t rows, int64_t cols, cudaStream_t stream) {
    return dequantize<__half>(static_cast<__half *>(out), w, type, row_bytes, rows, cols, stream);
}

/* f32 to f16, grid-stride. */
__global__ void to_f16_kernel(__half *out, const float *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(x[i]);
}

extern "C" cudaError_t cuda_f32_to_f16(void *out, const float *x, int64_t n, cudaStream_t stream) {
    if (n < 0) return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    int64_t blocks = (n + DQ_THREADS - 1) / DQ_THREADS;
    if (blocks > DQ_MAX_BLOCKS) blocks = DQ_MAX_BLOCKS;
    CU_LAUNCH(to_f16_kernel, dim3((unsigned)blocks), dim3(DQ_THREADS), 0, stream, static_cast<__half *>(out), x, n);
    return cudaGetLastError();
}

template <class T>
__global__ void pot_store_kernel(T *kl, T *vl, int32_t capacity, int32_t n_head_kv, int32_t head_dim,
                                 const float *k, const float *v, int32_t slot0, int32_t n) {
    int64_t dkv = (int64_t)n_head_kv * head_dim, total = (int64_t)n * dkv;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / dkv, g = (i % dkv) / head_dim, e = i % head_dim;
        size_t at = ((size_t)g * capacity + slot0 + t) * head_dim + e;
        kl[at] = from_f32<T>(k[i]);
        vl[at] = from_f32<T>(v[i]);
    }
}

extern "C" cudaError_t cuda_pot_store(void *k_layer, void *v_layer, int32_t dtype, int32_t capacity, int32_t n_head_kv,
                                      int32_t head_dim, const float *k, const float *v, int32_t slot0, int32_t n,
                                      cudaStream_t stream) {
    if ((dtype != 0 && dtype != 1) || n_head_kv <= 0 || head_dim <= 0 || slot0 < 0 || n < 0 ||
        (int64_t)slot0 + n > capacity)
        return cudaErrorInvalidValue;
    if (!n) return cudaSuccess;
    int64_t total = (int64_t)n * n_head_kv * head_dim, blocks = (total + DQ_THREADS - 1) / DQ_THREADS;
    if (blocks > DQ_MAX_BLOCKS) blocks = DQ_MAX_BLOCKS;
    if (dtype == 0)
        CU_LAUNCH(pot_store_kernel<__half>, dim3((unsigned)blocks), dim3(DQ_THREADS), 0, stream,
                  static_cast<__half *>(k_layer), static_cast<__half *>(v_layer), capacity, n_head_kv, head_dim, k, v,
                  slot0, n);
    else
        CU_LAUNCH(pot_store_kernel<float>, dim3((unsigned)blocks), dim3(DQ_THREADS), 0, stream,
                  static_cast<float *>(k_layer), static_cast<float *>(v_layer), capacity, n_head_kv, head_dim, k, v,
                  slot0, n);
    return cudaGetLastError();
}
