/* Token embeddings: one block per token dequantises its table row to f32. */
#include "cuda/kernels.h"
#include "cuda/kernels/quant.cuh"

enum { EMBED_THREADS = 256 };

__global__ void embed_kernel(float *out, const unsigned char *table, uint32_t type, size_t row_bytes, int64_t n_embd,
                             const int32_t *tokens) {
    const unsigned char *row = table + (size_t)tokens[blockIdx.x] * row_bytes;
    float *o = out + (size_t)blockIdx.x * n_embd;
    if (!qblock_bytes(type)) {
        for (int64_t i = threadIdx.x; i < n_embd; i += blockDim.x) o[i] = float_element(type, row, i);
        return;
    }
    for (int64_t i = 8 * (int64_t)threadIdx.x; i < n_embd; i += 8 * (int64_t)blockDim.x) decode8_row(type, row, i, o + i);
}

extern "C" int cuda_weight_type_supported(uint32_t type) { return weight_type_ok(type); }

extern "C" cudaError_t cuda_embed_rows(float *out, const void *table, uint32_t type, size_t row_bytes, int64_t n_embd,
                                       const int32_t *tokens, int64_t n_tokens, cudaStream_t stream) {
    if (!weight_type_ok(type) || !weight_cols_ok(type, n_embd) || n_tokens < 0 || n_tokens > 0x7fffffff)
        return cudaErrorInvalidValue;
    if (!n_tokens || !n_embd) return cudaSuccess;
    CU_LAUNCH(embed_kernel, dim3((unsigned)n_tokens), dim3(EMBED_THREADS), 0, stream, out,
              static_cast<const unsigned char *>(table), type, row_bytes, n_embd, tokens);
    return cudaGetLastError();
}
