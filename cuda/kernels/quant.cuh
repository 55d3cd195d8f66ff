/* Device-side decoding of the weight formats the kernels read directly
 * (private to cuda/kernels/): F32, F16, BF16, the 32-element blocks Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0 and the 256-element K-quant super-blocks Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K: every type engine/quant.c dequantises, byte for byte the
 * GGUF layouts. Quantised rows are decoded eight elements at a time (a run
 * of eight never crosses a block or a K-quant scale), with quant.c's
 * arithmetic step by step (__fmul_rn and friends keep nvcc from fusing), so
 * the values are bit-identical to quant_dequantize_row. */
#ifndef POTSERVE_CUDA_QUANT_CUH
#define POTSERVE_CUDA_QUANT_CUH

#include "cuda/kernels/common.cuh"
#include "engine/quant.h" /* enum ggml_type: the type ids the weights carry */

/* Bytes of one block of a quantised type; 0 for the float types and for
 * types the kernels do not read. */
__host__ __device__ __forceinline__ int qblock_bytes(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q4_0: return 18;
    case GGML_TYPE_Q4_1: return 20;
    case GGML_TYPE_Q5_0: return 22;
    case GGML_TYPE_Q5_1: return 24;
    case GGML_TYPE_Q8_0: return 34;
    case GGML_TYPE_Q2_K: return 84;
    case GGML_TYPE_Q3_K: return 110;
    case GGML_TYPE_Q4_K: return 144;
    case GGML_TYPE_Q5_K: return 176;
    case GGML_TYPE_Q6_K: return 210;
    default: return 0;
    }
}

/* Elements per block: 256 for the K-quants, 32 for the other block types, 1
 * for the float types (a row of any length). */
__host__ __device__ __forceinline__ int qblock_elems(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: return 256;
    default: return qblock_bytes(type) ? 32 : 1;
    }
}

__host__ __device__ __forceinline__ bool weight_type_ok(uint32_t type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 || qblock_bytes(type) != 0;
}

/* A row length the type can hold: whole blocks. */
__host__ __device__ __forceinline__ bool weight_cols_ok(uint32_t type, int64_t cols) {
    return cols >= 0 && cols % qblock_elems(type) == 0;
}

/* Element i of a float-type row. */
__device__ __forceinline__ float float_element(uint32_t type, const unsigned char *row, int64_t i) {
    switch (type) {
    case GGML_TYPE_F16: return load_f16(row + 2 * i);
    case GGML_TYPE_BF16: return load_bf16(row + 2 * i);
    default: return reinterpret_cast<const float *>(row)[i];
    }
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (engine/quant_blocks.h scale_min_k4). */
__device__ __forceinline__ void scale_min_k4(int j, const unsigned char *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* w[k] = element j + k of block b, k < 8, j % 8 == 0. */
__device__ __forceinline__ void decode8(uint32_t type, const unsigned char *b, int j, float w[8]) {
    switch (type) {
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q5_1: {
        /* nibble j of qs for j < 16, j - 16's high nibble after; Q5 adds bit j of qh */
        bool with_min = type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1;
        bool five = type == GGML_TYPE_Q5_0 || type == GGML_TYPE_Q5_1;
        float d = load_f16(b), m = with_min ? load_f16(b + 2) : 0.0f;
        const unsigned char *h = b + (with_min ? 4 : 2), *qs = h + (five ? 4 : 0);
        uint32_t qh = five ? (uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24 : 0;
        int offset = with_min ? 0 : five ? 16 : 8;
        for (int k = 0; k < 8; k++) {
            int e = j + k, q = e < 16 ? qs[e] & 0x0f : qs[e - 16] >> 4;
            q |= (int)((qh >> e) & 1) << 4;
            float v = __fmul_rn((float)(q - offset), d);
            w[k] = with_min ? __fadd_rn(v, m) : v;
        }
        return;
    }
    case GGML_TYPE_Q8_0: {
        float d = load_f16(b);
        for (int k = 0; k < 8; k++) w[k] = __fmul_rn((float)(signed char)b[2 + j + k], d);
        return;
    }
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K: {
        /* half n of 128; bit pair g of the 32 bytes q[32n..]; sub-block h of 16 */
        int n = j / 128, g = j % 128 / 32, h = j % 32 / 16, l = j % 16, is = 8 * n + 2 * g + h;
        const unsigned char *q = b + (type == GGML_TYPE_Q2_K ? 16 : 32) + 32 * n + 16 * h + l;
        if (type == GGML_TYPE_Q2_K) {
            float d = load_f16(b + 80), dmin = load_f16(b + 82);
            float dl = __fmul_rn(d, (float)(b[is] & 0x0f)), ml = __fmul_rn(dmin, (float)(b[is] >> 4));
            for (int k = 0; k < 8; k++) w[k] = __fsub_rn(__fmul_rn(dl, (float)((q[k] >> (2 * g)) & 3)), ml);
        } else {
            const unsigned char *hm = b + 16 * h + l, *sb = b + 96;
            int lo = is < 8 ? sb[is] & 0x0f : sb[is - 8] >> 4, hi = (sb[8 + is % 4] >> (2 * (is / 4))) & 3;
            float dl = __fmul_rn(load_f16(b + 108), (float)((lo | hi << 4) - 32));
            for (int k = 0; k < 8; k++) {
                int v = ((q[k] >> (2 * g)) & 3) - ((hm[k] >> (4 * n + g)) & 1 ? 0 : 4);
                w[k] = __fmul_rn(dl, (float)v);
            }
        }
        return;
    }
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: {
        /* pair p of 64: sub-block 2p takes the low nibbles of 32 bytes, 2p + 1 the high */
        int p = j / 64, high = j % 64 / 32, l = j % 32, sub = 2 * p + high, sc, mn;
        scale_min_k4(sub, b + 4, &sc, &mn);
        float d1 = __fmul_rn(load_f16(b), (float)sc), m1 = __fmul_rn(load_f16(b + 2), (float)mn);
        bool five = type == GGML_TYPE_Q5_K;
        const unsigned char *qh = b + 16 + l, *q = b + (five ? 48 : 16) + 32 * p + l;
        for (int k = 0; k < 8; k++) {
            int v = high ? q[k] >> 4 : q[k] & 0x0f;
            if (five && ((qh[k] >> sub) & 1)) v += 16;
            w[k] = __fsub_rn(__fmul_rn(d1, (float)v), m1);
        }
        return;
    }
    default: { /* Q6_K: half n of 128, quarter u of 32, one int8 scale per 16 */
        int n = j / 128, u = j % 128 / 32, l = j % 32;
        const unsigned char *ql = b + 64 * n + 32 * (u & 1) + l, *qh = b + 128 + 32 * n + l;
        float ds = __fmul_rn(load_f16(b + 208), (float)(signed char)b[192 + 8 * n + l / 16 + 2 * u]);
        for (int k = 0; k < 8; k++) {
            int v = ((u < 2 ? ql[k] & 0x0f : ql[k] >> 4) | ((qh[k] >> (2 * u)) & 3) << 4) - 32;
            w[k] = __fmul_rn(ds, (float)v);
        }
        return;
    }
    }
}

/* w[k] = element i0 + k of a quantised row, k < 8, i0 % 8 == 0. */
__device__ __forceinline__ void decode8_row(uint32_t type, const unsigned char *row, int64_t i0, float w[8]) {
    int64_t e = qblock_elems(type);
    decode8(type, row + (size_t)(i0 / e) * qblock_bytes(type), (int)(i0 % e), w);
}

#endif
