/* Device-side decoding of the weight formats the kernels read directly
 * (private to cuda/kernels/): F32, F16, BF16 and the 32-element blocks Q4_0,
 * Q4_1, Q8_0 of engine/quant.c, byte for byte the GGUF layouts. */
#ifndef POTSERVE_CUDA_QUANT_CUH
#define POTSERVE_CUDA_QUANT_CUH

#include "cuda/kernels/common.cuh"
#include "engine/quant.h" /* enum ggml_type: the type ids the weights carry */

enum { QBLOCK = 32 }; /* elements per Q4_0 / Q4_1 / Q8_0 block */

__host__ __device__ __forceinline__ int qblock_bytes(uint32_t type) {
    return type == GGML_TYPE_Q4_0 ? 18 : type == GGML_TYPE_Q4_1 ? 20 : type == GGML_TYPE_Q8_0 ? 34 : 0;
}

__host__ __device__ __forceinline__ bool weight_type_ok(uint32_t type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 || qblock_bytes(type) != 0;
}

/* Element i of a row, with quant_dequantize_row's arithmetic (no FMA: the
 * Q4_1 value is q*d rounded, then + m), so the result is bit-identical. */
__device__ __forceinline__ float weight_element(uint32_t type, const unsigned char *row, int64_t i) {
    switch (type) {
    case GGML_TYPE_F32: return reinterpret_cast<const float *>(row)[i];
    case GGML_TYPE_F16: return load_f16(row + 2 * i);
    case GGML_TYPE_BF16: return load_bf16(row + 2 * i);
    default: break;
    }
    const unsigned char *b = row + (size_t)(i / QBLOCK) * qblock_bytes(type);
    int j = (int)(i % QBLOCK);
    float d = load_f16(b);
    switch (type) {
    case GGML_TYPE_Q4_0: {
        int q = j < 16 ? (b[2 + j] & 0x0f) : (b[2 + j - 16] >> 4);
        return __fmul_rn((float)(q - 8), d);
    }
    case GGML_TYPE_Q4_1: {
        int q = j < 16 ? (b[4 + j] & 0x0f) : (b[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, d), load_f16(b + 2));
    }
    default: /* Q8_0 */
        return __fmul_rn((float)(signed char)b[2 + j], d);
    }
}

/* A quarter of a block: 8 weights at elements o0..o0+3 and o1..o1+3. Four
 * lanes decode one block, so a warp reads 8 consecutive blocks at a time. */
struct block_part {
    float w[8];
    int o0, o1;
};

__device__ __forceinline__ block_part decode_part(uint32_t type, const unsigned char *b, int part) {
    block_part r;
    float d = load_f16(b);
    if (type == GGML_TYPE_Q8_0) {
        const signed char *q = reinterpret_cast<const signed char *>(b + 2) + part * 8;
        for (int k = 0; k < 8; k++) r.w[k] = (float)q[k] * d;
        r.o0 = part * 8;
        r.o1 = part * 8 + 4;
        return r;
    }
    bool with_min = type == GGML_TYPE_Q4_1;
    float m = with_min ? load_f16(b + 2) : -8.0f * d;
    const unsigned char *q = b + (with_min ? 4 : 2) + part * 4;
    for (int k = 0; k < 4; k++) {
        r.w[k] = fmaf((float)(q[k] & 0x0f), d, m);
        r.w[k + 4] = fmaf((float)(q[k] >> 4), d, m);
    }
    r.o0 = part * 4;
    r.o1 = 16 + part * 4;
    return r;
}

#endif
