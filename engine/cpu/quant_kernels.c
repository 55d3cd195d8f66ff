/* The CPU's quantised kernels: activation quantisation, dot products and
 * matrix products with llama.cpp's arithmetic, portable and AVX2 (with
 * AVX512-VNNI's vpdpbusd where the CPU has it); the packed eight-row kernels
 * are quant_pack.c. The formats themselves are engine/quant.c. */
#include "engine/quant.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "quant_cpu.h"
#include "simd.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* clang contracts by default even in ISO mode */
#endif

/* ==== llama.cpp-compatible activation formats and dot products ================
 *
 * Activation blocks, as in ggml-common.h (halves little-endian; the Q8_K fields
 * are in host order, as only this file reads them):
 *   Q8_0: d (half), qs[32] int8                                     34 bytes
 *   Q8_1: d (half), s (half) = d * sum(qs), qs[32] int8             36 bytes
 *   Q8_K: d (f32), qs[256] int8, bsums[16] int16 (sums of 16 qs)   292 bytes
 *
 * Quantisation is what llama.cpp's CPU backend runs on x86-64:
 *  - Q8_0 / Q8_1: quantize_row_q8_0 / q8_1 of ggml-cpu/arch/x86/quants.c (the
 *    AVX/AVX2 build): amax = max |x|, d = amax / 127, id = 127 / amax (0 when
 *    amax is 0), q = x * id rounded to nearest, ties to even. The portable
 *    quantize_row_q8_0_ref instead uses id = 1/d and roundf (ties away from
 *    zero); the two differ only where x * id lands on, or within an ulp of, a
 *    half-integer.
 *  - Q8_K: quantize_row_q8_K_ref (the x86 build uses the reference): max = the
 *    first element of largest |x|, iscale = -127 / max, q = min(127,
 *    nearest_int(iscale * x)) (ties to even), d = 1 / iscale, bsums.
 *  - F16 / BF16: each activation rounded to nearest even (ggml_cpu_fp32_to_fp16,
 *    GGML_FP32_TO_BF16); F32: copied.
 * Quantised values are clamped to [-127, 127], which changes nothing for finite
 * inputs and keeps the SIMD kernels exact for any input.
 *
 * Dot products compute the integer sums of ggml's ggml_vec_dot_*_q8_* exactly
 * (they fit in int32) and combine them with the block scales in the float
 * order of llama.cpp's x86 AVX2 kernels (ggml-cpu/arch/x86/quants.c, as gcc
 * or clang compile them: `summs += m*s` contracted to an FMA), so for Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants the result is bit-identical to
 * ggml_vec_dot_* of an x86 AVX2 (or AVX-512) build. Those kernels keep eight
 * int32 lanes per block, lane l holding the products of the vector's bytes
 * 4l..4l+3, and accumulate acc[l] = fma(d, (float)lane[l], acc[l]):
 *  - Q4_0 / Q5_0 / Q8_0: d = dx*dy per 32-element block; result hsum8(acc).
 *  - Q4_1 / Q5_1: likewise, plus summs = fma(mx, sy, summs) per block;
 *    result hsum8(acc) + summs.
 *  - Q4_K / Q5_K / Q6_K: d = y.d * half(x.d) per 256-element block, lanes as
 *    ggml forms them (see the kernels); Q4_K adds four lanes of
 *    fma(-y.d*dmin, mins.bsums), Q5_K one fma per block.
 * hsum8(l) = ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)) (ggml's hsum_float_8).
 *  - Q2_K / Q3_K: the same lanes over eight 32-element groups; Q2_K first
 *    adds fma(-y.d*dmin, mins.bsums) to each lane (scalar only here: their
 *    matrices take the packed kernels of quant_pack.c at load).
 * The portable kernels perform the same operations with fmaf, so the scalar
 * and AVX2 paths agree bit for bit. F32 / F16 / BF16 add
 * element i to lane i % 8 and reduce with hsum8 (F16 and BF16 products are
 * exact in f32; llama.cpp's own summation order differs there). */

/* ---- activation quantisation ----------------------------------------------------- */

static void put_half(uint8_t *p, float f) {
    const uint16_t h = quant_f32_to_f16(f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* x rounded to the nearest integer, ties to even, for |x| < 2^22 (ggml's
 * nearest_int); clamped to [-127, 127]. Any input is defined behaviour. */
static int8_t round_q8(float x) {
    const float v = x + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof i);
    const int q = (i & 0x007fffff) - 0x00400000;
    return (int8_t)(q < -127 ? -127 : q > 127 ? 127 : q);
}

/* Q8_0 (s == NULL) or Q8_1 (s = where the half d*sum goes) block of 32. */
static void quantize_q8_block(const float *x, uint8_t *d_out, uint8_t *s_out, int8_t *qs) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        qs[j] = round_q8(x[j] * id);
        sum += qs[j];
    }
    put_half(d_out, d);
    if (s_out) put_half(s_out, d * (float)sum);
}

static void quantize_q8_k_block(const float *x, uint8_t *b) {
    float max = 0.0f, amax = 0.0f, d = 0.0f;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
    for (int j = 0; j < QK_K; j++) {
        const float a = fabsf(x[j]);
        if (a > amax) {
            amax = a;
            max = x[j];
        }
    }
    if (amax == 0.0f) {
        memset(qs, 0, sizeof qs);
    } else {
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) qs[j] = round_q8(iscale * x[j]);
        d = 1 / iscale;
    }
    for (int j = 0; j < QK_K / 16; j++) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += qs[16 * j + l];
        bsums[j] = (int16_t)sum;
    }
    memcpy(b, &d, sizeof d);
    memcpy(b + 4, qs, sizeof qs);
    memcpy(b + 4 + QK_K, bsums, sizeof bsums);
}

/* The AVX2 versions of the Q8_0 / Q8_1 / Q8_K loops below (same bytes); 0
 * when they are not in use. Defined with the other AVX2 kernels. */
static int quantize_act_simd(uint32_t act_type, const float *x, uint8_t *dst, int64_t n);

void quant_quantize_act(uint32_t weight_type, const float *x, void *dst, int64_t n) {
    if (!quant_act_row_bytes(weight_type, n)) return;
    uint8_t *p = dst;
    if (quantize_act_simd(quant_vec_dot_type(weight_type), x, p, n)) return;
    switch (quant_vec_dot_type(weight_type)) {
    case GGML_TYPE_F32: memcpy(dst, x, (size_t)n * sizeof(float)); return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) put_half(p + 2 * i, x[i]);
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = quant_f32_to_bf16(x[i]);
            p[2 * i] = (uint8_t)h;
            p[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return;
    case GGML_TYPE_Q8_0:
        for (int64_t i = 0; i < n; i += QK, p += Q8_0_BYTES) quantize_q8_block(x + i, p, NULL, (int8_t *)(p + 2));
        return;
    case GGML_TYPE_Q8_1:
        for (int64_t i = 0; i < n; i += QK, p += Q8_1_BYTES) quantize_q8_block(x + i, p, p + 2, (int8_t *)(p + 4));
        return;
    case GGML_TYPE_Q8_K:
        for (int64_t i = 0; i < n; i += QK_K, p += Q8_K_BYTES) quantize_q8_k_block(x + i, p);
        return;
    default: return;
    }
}

/* ---- scalar kernels ----------------------------------------------------------------
 * Each takes the weight row, the activations and the number of blocks (of the
 * weight type; elements for F32 / F16 / BF16). */

typedef float (*vdot_fn)(const uint8_t *w, const uint8_t *a, int64_t nb);

/* ggml's hsum_float_8. */
static float hsum8(const float l[8]) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* acc[l] = fma(d, v[4l..4l+3] . y[4l..4l+3], acc[l]): one 32-element block. */
static inline void fma_lanes(float acc[8], float d, const int8_t v[QK], const int8_t *y) {
    for (int l = 0; l < 8; l++) {
        const int8_t *p = v + 4 * l, *q = y + 4 * l;
        const int s = p[0] * q[0] + p[1] * q[1] + p[2] * q[2] + p[3] * q[3];
        acc[l] = fmaf(d, (float)s, acc[l]);
    }
}

/* Quants of one 32-element block in element order (as the SIMD kernels hold them). */
static inline void unpack_q4_0(const uint8_t *x, int8_t v[QK]) {
    for (int j = 0; j < QK / 2; j++) {
        v[j] = (int8_t)((x[2 + j] & 0x0f) - 8);
        v[j + QK / 2] = (int8_t)((x[2 + j] >> 4) - 8);
    }
}

static inline void unpack_q4_1(const uint8_t *x, int8_t v[QK]) {
    for (int j = 0; j < QK / 2; j++) {
        v[j] = (int8_t)(x[4 + j] & 0x0f);
        v[j + QK / 2] = (int8_t)(x[4 + j] >> 4);
    }
}

static inline void unpack_q5_0(const uint8_t *x, int8_t v[QK]) {
    const uint32_t qh = u32_at(x + 2);
    for (int j = 0; j < QK / 2; j++) {
        v[j] = (int8_t)(((x[6 + j] & 0x0f) | (int)(((qh >> j) & 1) << 4)) - 16);
        v[j + QK / 2] = (int8_t)(((x[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16);
    }
}

static inline void unpack_q5_1(const uint8_t *x, int8_t v[QK]) {
    const uint32_t qh = u32_at(x + 4);
    for (int j = 0; j < QK / 2; j++) {
        v[j] = (int8_t)((x[8 + j] & 0x0f) | (int)(((qh >> j) & 1) << 4));
        v[j + QK / 2] = (int8_t)((x[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4));
    }
}

static inline void unpack_q8_0(const uint8_t *x, int8_t v[QK]) {
    memcpy(v, x + 2, QK);
}

/* with_min: Q4_1 / Q5_1, whose mx (weights) and sy (activations) halves sit at offset 2. */
#define SCALAR32(name, unpack, wbytes, abytes, qoff, with_min)                    \
    static float name(const uint8_t *w, const uint8_t *a, int64_t nb) {         \
        float acc[8] = {0}, summs = 0.0f;                                       \
        int8_t v[QK];                                                           \
        for (int64_t b = 0; b < nb; b++) {                                      \
            const uint8_t *x = w + b * (wbytes), *y = a + b * (abytes);          \
            unpack(x, v);                                                       \
            fma_lanes(acc, half_at(x) * half_at(y), v, (const int8_t *)(y + (qoff))); \
            if (with_min) summs = fmaf(half_at(x + 2), half_at(y + 2), summs);  \
        }                                                                       \
        return with_min ? hsum8(acc) + summs : hsum8(acc);                      \
    }
SCALAR32(vd_q4_0, unpack_q4_0, 2 + QK / 2, Q8_0_BYTES, 2, 0)
SCALAR32(vd_q4_1, unpack_q4_1, 4 + QK / 2, Q8_1_BYTES, 4, 1)
SCALAR32(vd_q5_0, unpack_q5_0, 6 + QK / 2, Q8_0_BYTES, 2, 0)
SCALAR32(vd_q5_1, unpack_q5_1, 8 + QK / 2, Q8_1_BYTES, 4, 1)
SCALAR32(vd_q8_0, unpack_q8_0, Q8_0_BYTES, Q8_0_BYTES, 2, 0)
#undef SCALAR32

enum { Q2_K_BYTES = 84, Q3_K_BYTES = 110, Q4_K_BYTES = 144, Q5_K_BYTES = 176, Q6_K_BYTES = 210 };

/* Q2_K: lane l of block b gets, for each of the eight 32-element groups g
 * (2 bits at shift 2*(g%4) of q[32*(g/4)..]), sc[2g + l/4] & 15 times the
 * bytes 4l..4l+3 of that group dotted with y; then acc[l] = fma(d, lane,
 * acc[l]) after acc[k] = fma(-dy*dmin, (sc[2k] >> 4)*bsums[2k] +
 * (sc[2k+1] >> 4)*bsums[2k+1], acc[k]) for the block's minimums. */
static float vd_q2_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, w += Q2_K_BYTES, a += Q8_K_BYTES) {
        const uint8_t *sc = w;
        const int8_t *y = (const int8_t *)(a + 4);
        const float dy = q8k_d(a);
        const float d = dy * half_at(w + 80), dmin = -dy * half_at(w + 82);
        for (int k = 0; k < 8; k++)
            acc[k] = fmaf(dmin, (float)((sc[2 * k] >> 4) * q8k_bsum(a, 2 * k) + (sc[2 * k + 1] >> 4) * q8k_bsum(a, 2 * k + 1)),
                          acc[k]);
        int si[8] = {0};
        for (int g = 0; g < 8; g++, y += 32) {
            const uint8_t *q = w + 16 + 32 * (g / 4);
            const int shift = 2 * (g % 4);
            for (int t = 0; t < 32; t++) si[t >> 2] += (sc[2 * g + t / 16] & 0x0f) * (((q[t] >> shift) & 3) * y[t]);
        }
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)si[l], acc[l]);
    }
    return hsum8(acc);
}

/* Q3_K: lanes as Q2_K's, each value (2 low bits at shift 2*(g%4), minus 4
 * where bit g of hmask[t] is clear) times its 6-bit scale minus 32. */
static float vd_q3_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, w += Q3_K_BYTES, a += Q8_K_BYTES) {
        const uint8_t *hm = w, *sb = w + 96;
        const int8_t *y = (const int8_t *)(a + 4);
        int sc[16];
        for (int is = 0; is < 16; is++) {
            const int lo = is < 8 ? (sb[is] & 0x0f) : (sb[is - 8] >> 4);
            const int hi = (sb[8 + is % 4] >> (2 * (is / 4))) & 3;
            sc[is] = (lo | (hi << 4)) - 32;
        }
        int si[8] = {0};
        for (int g = 0; g < 8; g++, y += 32) {
            const uint8_t *q = w + 32 + 32 * (g / 4);
            const int shift = 2 * (g % 4);
            for (int t = 0; t < 32; t++)
                si[t >> 2] += sc[2 * g + t / 16] * ((((q[t] >> shift) & 3) - ((hm[t] >> g) & 1 ? 0 : 4)) * y[t]);
        }
        const float d = q8k_d(a) * half_at(w + 108);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)si[l], acc[l]);
    }
    return hsum8(acc);
}

/* Q4_K / Q5_K minimum term of one block: lane k = mn[2k]*(bsums[4k]+bsums[4k+1])
 * + mn[2k+1]*(bsums[4k+2]+bsums[4k+3]). */
static inline int k_min_lane(const uint8_t *a, const uint8_t mn[8], int k) {
    return mn[2 * k] * (q8k_bsum(a, 4 * k) + q8k_bsum(a, 4 * k + 1)) +
           mn[2 * k + 1] * (q8k_bsum(a, 4 * k + 2) + q8k_bsum(a, 4 * k + 3));
}

/* Q4_K (qh == NULL) and Q5_K: lane l of block b gets, for each 64-element
 * chunk j, sc[2j] * (bytes 4l..4l+3 of the low nibbles . y) + sc[2j+1] * (the
 * high nibbles . y), then acc[l] = fma(d, lane, acc[l]). */
static inline void k45_lanes(const uint8_t *q, const uint8_t *qh, const uint8_t sc[8], const int8_t *y, int si[8]) {
    for (int l = 0; l < 8; l++) si[l] = 0;
    for (int j = 0; j < QK_K / 64; j++, q += 32, y += 64) {
        for (int t = 0; t < 32; t++) {
            const int h1 = qh ? ((qh[t] >> (2 * j)) & 1) << 4 : 0;
            const int h2 = qh ? ((qh[t] >> (2 * j + 1)) & 1) << 4 : 0;
            si[t >> 2] += sc[2 * j] * (((q[t] & 0x0f) | h1) * y[t]) + sc[2 * j + 1] * (((q[t] >> 4) | h2) * y[t + 32]);
        }
    }
}

static float vd_q4_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float acc[8] = {0}, accm[4] = {0};
    for (int64_t b = 0; b < nb; b++, w += Q4_K_BYTES, a += Q8_K_BYTES) {
        uint8_t sc[8], mn[8];
        int si[8];
        for (int j = 0; j < 8; j++) scale_min_k4(j, w + 4, &sc[j], &mn[j]);
        k45_lanes(w + 16, NULL, sc, (const int8_t *)(a + 4), si);
        const float dy = q8k_d(a);
        const float d = dy * half_at(w), dmin = -dy * half_at(w + 2);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)si[l], acc[l]);
        for (int k = 0; k < 4; k++) accm[k] = fmaf(dmin, (float)k_min_lane(a, mn, k), accm[k]);
    }
    return hsum8(acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]));
}

static float vd_q5_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q5_K_BYTES, a += Q8_K_BYTES) {
        uint8_t sc[8], mn[8];
        int si[8];
        for (int j = 0; j < 8; j++) scale_min_k4(j, w + 4, &sc[j], &mn[j]);
        k45_lanes(w + 48, w + 16, sc, (const int8_t *)(a + 4), si);
        const float dy = q8k_d(a);
        const float d = dy * half_at(w), dmin = -dy * half_at(w + 2);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)si[l], acc[l]);
        int m = 0;
        for (int k = 0; k < 4; k++) m += k_min_lane(a, mn, k);
        summs = fmaf(dmin, (float)m, summs);
    }
    return hsum8(acc) + summs;
}

/* Q6_K: lane l gets sc[e/16] * q * y[e] over the bytes 4l..4l+3 of each of the
 * eight 32-element groups (q unsigned, 0..63), minus 32 * (bsums[2l]*sc[2l] +
 * bsums[2l+1]*sc[2l+1]). */
static float vd_q6_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, w += Q6_K_BYTES, a += Q8_K_BYTES) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const int8_t *y = (const int8_t *)(a + 4);
        int si[8] = {0};
        for (int n = 0; n < 2; n++) {
            const uint8_t *ql = w + 64 * n, *qh = w + 128 + 32 * n;
            for (int t = 0; t < 32; t++) {
                const int e = 128 * n + t;
                const int q0 = (ql[t] & 0x0f) | ((qh[t] & 3) << 4);
                const int q1 = (ql[t + 32] & 0x0f) | (((qh[t] >> 2) & 3) << 4);
                const int q2 = (ql[t] >> 4) | (((qh[t] >> 4) & 3) << 4);
                const int q3 = (ql[t + 32] >> 4) | (((qh[t] >> 6) & 3) << 4);
                si[t >> 2] += sc[e >> 4] * (q0 * y[e]) + sc[(e + 32) >> 4] * (q1 * y[e + 32]) +
                              sc[(e + 64) >> 4] * (q2 * y[e + 64]) + sc[(e + 96) >> 4] * (q3 * y[e + 96]);
            }
        }
        for (int l = 0; l < 8; l++)
            si[l] -= 32 * (q8k_bsum(a, 2 * l) * sc[2 * l] + q8k_bsum(a, 2 * l + 1) * sc[2 * l + 1]);
        const float d = q8k_d(a) * half_at(w + 208);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)si[l], acc[l]);
    }
    return hsum8(acc);
}

static float vd_f32(const uint8_t *w, const uint8_t *a, int64_t n) {
    float l[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        float x, y;
        memcpy(&x, w + 4 * i, 4);
        memcpy(&y, a + 4 * i, 4);
        l[i & 7] += x * y;
    }
    return hsum8(l);
}

static float vd_f16(const uint8_t *w, const uint8_t *a, int64_t n) {
    float l[8] = {0};
    for (int64_t i = 0; i < n; i++) l[i & 7] += half_at(w + 2 * i) * half_at(a + 2 * i);
    return hsum8(l);
}

static float bf16_at(const uint8_t *p) {
    return quant_bf16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static float vd_bf16(const uint8_t *w, const uint8_t *a, int64_t n) {
    float l[8] = {0};
    for (int64_t i = 0; i < n; i++) l[i & 7] += bf16_at(w + 2 * i) * bf16_at(a + 2 * i);
    return hsum8(l);
}

static vdot_fn scalar_kernel(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return vd_f32;
    case GGML_TYPE_F16: return vd_f16;
    case GGML_TYPE_BF16: return vd_bf16;
    case GGML_TYPE_Q4_0: return vd_q4_0;
    case GGML_TYPE_Q4_1: return vd_q4_1;
    case GGML_TYPE_Q5_0: return vd_q5_0;
    case GGML_TYPE_Q5_1: return vd_q5_1;
    case GGML_TYPE_Q8_0: return vd_q8_0;
    case GGML_TYPE_Q2_K: return vd_q2_k;
    case GGML_TYPE_Q3_K: return vd_q3_k;
    case GGML_TYPE_Q4_K: return vd_q4_k;
    case GGML_TYPE_Q5_K: return vd_q5_k;
    case GGML_TYPE_Q6_K: return vd_q6_k;
    default: return NULL;
    }
}

/* ---- AVX2 kernels ------------------------------------------------------------------
 * Integer products with _mm256_maddubs_epi16 (u8 x s8 -> adjacent pairs summed
 * in s16; no saturation is reachable: |x| <= 128 unsigned against |y| <= 127)
 * and _mm256_madd_epi16, so int32 lane l holds the products of bytes 4l..4l+3;
 * the sign trick (|x|, y*sign(x)) turns signed weights into the unsigned
 * operand (activations are never -128, which it could not negate). */

#if QUANT_HAVE_AVX2

static inline AVX2_FN float half_f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
}

static inline AVX2_FN float hsum8_avx(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    return hsum8(l);
}

/* Signed bytes x times signed bytes y, summed in groups of four into int32. */
static inline AVX2_FN __m256i dot_s8(__m256i x, __m256i y) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Unsigned bytes x (< 128) times signed bytes y, likewise. */
static inline AVX2_FN __m256i dot_u8(__m256i x, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
}

/* The same with AVX512-VNNI's vpdpbusd (256-bit, AVX512VL): one instruction
 * instead of two, and the same int32 lanes, as maddubs cannot saturate here
 * (see above). Inline assembly keeps the kernels' target at AVX2: a kernel
 * instance uses it only when the CPU has the instructions (cpu_has_vnni). */
static inline AVX2_FN __m256i dot_u8_vnni(__m256i x, __m256i y) {
    __m256i acc = _mm256_setzero_si256();
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(y));
    return acc;
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles first, then high nibbles (the
 * bytes in both halves, the upper half shifted by 4: three instructions). */
static inline AVX2_FN __m256i nibbles32(const uint8_t *p) {
    const __m256i t = _mm256_broadcastsi128_si256(load128(p));
    return _mm256_and_si256(_mm256_srlv_epi64(t, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0f));
}

/* Byte j = 0x10 where bit j of the little-endian u32 at p is set, else 0. */
static inline AVX2_FN __m256i bit4_bytes(const uint8_t *p) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)u32_at(p)), shuf);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(0x10));
}

/* The 32-element block kernels; `ints` gives the int32 lanes of the block at x
 * (weights) against the activation quants y. */
#define AVX2_32(name, wbytes, abytes, qoff, ints, with_min)                                      \
    static AVX2_FN float name(const uint8_t *w, const uint8_t *a, int64_t nb) {                  \
        __m256 acc = _mm256_setzero_ps();                                                       \
        __m128 summs = _mm_setzero_ps();                                                        \
        for (int64_t b = 0; b < nb; b++) {                                                      \
            const uint8_t *x = w + b * (wbytes), *ya = a + b * (abytes);                        \
            const __m256i y = load256(ya + (qoff));                                             \
            const float d = half_f16c(x) * half_f16c(ya);                                       \
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(ints), acc);            \
            if (with_min)                                                                       \
                summs = _mm_fmadd_ss(_mm_set_ss(half_f16c(x + 2)), _mm_set_ss(half_f16c(ya + 2)), summs); \
        }                                                                                       \
        return with_min ? hsum8_avx(acc) + _mm_cvtss_f32(summs) : hsum8_avx(acc);               \
    }

AVX2_32(vd_q4_0_avx2, 2 + QK / 2, Q8_0_BYTES, 2, dot_s8(_mm256_sub_epi8(nibbles32(x + 2), _mm256_set1_epi8(8)), y),
        0)
AVX2_32(vd_q4_1_avx2, 4 + QK / 2, Q8_1_BYTES, 4, dot_u8(nibbles32(x + 4), y), 1)
AVX2_32(vd_q5_0_avx2, 6 + QK / 2, Q8_0_BYTES, 2,
        dot_s8(_mm256_sub_epi8(_mm256_or_si256(nibbles32(x + 6), bit4_bytes(x + 2)), _mm256_set1_epi8(16)), y), 0)
AVX2_32(vd_q5_1_avx2, 8 + QK / 2, Q8_1_BYTES, 4, dot_u8(_mm256_or_si256(nibbles32(x + 8), bit4_bytes(x + 4)), y), 1)
AVX2_32(vd_q8_0_avx2, Q8_0_BYTES, Q8_0_BYTES, 2, dot_s8(load256(x + 2), y), 0)
#undef AVX2_32

/* Q4_K / Q5_K: the eight 6-bit scales and mins of the 12-byte block (x86 is
 * little-endian, so the words can be masked as a whole). */
static inline void scales_mins_k4(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t w0, w1, w2, u[4];
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    u[0] = w0 & 0x3f3f3f3fu;                                            /* scales 0-3 */
    u[1] = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);        /* scales 4-7 */
    u[2] = w1 & 0x3f3f3f3fu;                                            /* mins 0-3 */
    u[3] = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4); /* mins 4-7 */
    memcpy(sc, u, 8);
    memcpy(mn, u + 2, 8);
}

/* The four minimum lanes (k_min_lane) of a Q4_K / Q5_K block. */
static inline AVX2_FN __m128i k_min_lanes(const uint8_t *a, const uint8_t mn[8]) {
    const __m256i bs = load256(a + 4 + QK_K);
    const __m128i q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    return _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)mn)), q8s);
}

/* Q4_K / Q5_K lanes (k45_lanes); qh == NULL for Q4_K. */
static inline AVX2_FN __m256i k45_lanes_avx2(const uint8_t *q, const uint8_t *qh, const uint8_t sc[8], const uint8_t *y) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const __m256i hb = qh ? load256(qh) : _mm256_setzero_si256();
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < QK_K / 64; j++) {
        const __m256i bits = load256(q + 32 * j);
        __m256i q1 = _mm256_and_si256(bits, m4), q2 = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
        if (qh) {
            q1 = _mm256_or_si256(q1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4));
            q2 = _mm256_or_si256(q2, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4));
        }
        const __m256i p1 = _mm256_maddubs_epi16(q1, load256(y + 64 * j));
        const __m256i p2 = _mm256_maddubs_epi16(q2, load256(y + 64 * j + 32));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(_mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j])),
                                                       _mm256_madd_epi16(p2, _mm256_set1_epi16(sc[2 * j + 1]))));
    }
    return sumi;
}

static AVX2_FN float vd_q4_k_avx2(const uint8_t *w, const uint8_t *a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += Q4_K_BYTES, a += Q8_K_BYTES) {
        uint8_t sc[8], mn[8];
        scales_mins_k4(w + 4, sc, mn);
        const float dy = q8k_d(a);
        const float d = dy * half_f16c(w), dmin = -dy * half_f16c(w + 2);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k_min_lanes(a, mn)), accm);
        const __m256i sumi = k45_lanes_avx2(w + 16, NULL, sc, a + 4);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    float m[4];
    _mm_storeu_ps(m, accm);
    return hsum8_avx(acc) + ((m[0] + m[2]) + (m[1] + m[3]));
}

static AVX2_FN float vd_q5_k_avx2(const uint8_t *w, const uint8_t *a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    __m128 summs = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += Q5_K_BYTES, a += Q8_K_BYTES) {
        uint8_t sc[8], mn[8];
        scales_mins_k4(w + 4, sc, mn);
        const float dy = q8k_d(a);
        const float d = dy * half_f16c(w), dmin = -dy * half_f16c(w + 2);
        __m128i m = k_min_lanes(a, mn);
        m = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
        m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0xb1));
        summs = _mm_fmadd_ss(_mm_set_ss(dmin), _mm_set_ss((float)_mm_cvtsi128_si32(m)), summs);
        const __m256i sumi = k45_lanes_avx2(w + 48, w + 16, sc, a + 4);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8_avx(acc) + _mm_cvtss_f32(summs);
}

/* The 6-bit quants (0..63, unsigned) of half n of a Q6_K block as four
 * 32-byte vectors: low nibbles from ql, the two high bits from qh. */
static inline AVX2_FN void q6_k_quants(const uint8_t *x, int n, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    const __m256i ql0 = load256(x + 64 * n), ql1 = load256(x + 64 * n + 32);
    const __m256i qh = load256(x + 128 + 32 * n);
    q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
}

static AVX2_FN float vd_q6_k_avx2(const uint8_t *w, const uint8_t *a, int64_t nb) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, w += Q6_K_BYTES, a += Q8_K_BYTES) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const __m256i sc16 = _mm256_cvtepi8_epi16(load128(w + 192));
        const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(load256(a + 4 + QK_K), sc16), 5);
        __m256i sumi = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            __m256i q[4];
            q6_k_quants(w, n, q);
            for (int g = 0; g < 4; g++) {
                const __m256i p = _mm256_maddubs_epi16(q[g], load256(a + 4 + 128 * n + 32 * g));
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[8 * n + 2 * g + 1]), _mm_set1_epi16(sc[8 * n + 2 * g]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s));
            }
        }
        sumi = _mm256_sub_epi32(sumi, sub);
        const float d = q8k_d(a) * half_f16c(w + 208);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum8_avx(acc);
}

static AVX2_FN float vd_f32_avx2(const uint8_t *w, const uint8_t *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps((const float *)(const void *)(w + 4 * i)),
                                               _mm256_loadu_ps((const float *)(const void *)(a + 4 * i))));
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (; i < n; i++) {
        float x, y;
        memcpy(&x, w + 4 * i, 4);
        memcpy(&y, a + 4 * i, 4);
        l[i & 7] += x * y;
    }
    return hsum8(l);
}

static AVX2_FN float vd_f16_avx2(const uint8_t *w, const uint8_t *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtph_ps(load128(w + 2 * i)), _mm256_cvtph_ps(load128(a + 2 * i))));
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (; i < n; i++) l[i & 7] += half_at(w + 2 * i) * half_at(a + 2 * i);
    return hsum8(l);
}

static inline AVX2_FN __m256 bf16x8(const uint8_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
}

static AVX2_FN float vd_bf16_avx2(const uint8_t *w, const uint8_t *a, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(bf16x8(w + 2 * i), bf16x8(a + 2 * i)));
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (; i < n; i++) l[i & 7] += bf16_at(w + 2 * i) * bf16_at(a + 2 * i);
    return hsum8(l);
}

static vdot_fn avx2_kernel(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return vd_f32_avx2;
    case GGML_TYPE_F16: return vd_f16_avx2;
    case GGML_TYPE_BF16: return vd_bf16_avx2;
    case GGML_TYPE_Q4_0: return vd_q4_0_avx2;
    case GGML_TYPE_Q4_1: return vd_q4_1_avx2;
    case GGML_TYPE_Q5_0: return vd_q5_0_avx2;
    case GGML_TYPE_Q5_1: return vd_q5_1_avx2;
    case GGML_TYPE_Q8_0: return vd_q8_0_avx2;
    case GGML_TYPE_Q4_K: return vd_q4_k_avx2;
    case GGML_TYPE_Q5_K: return vd_q5_k_avx2;
    case GGML_TYPE_Q6_K: return vd_q6_k_avx2;
    default: return scalar_kernel(type); /* Q2_K, Q3_K */
    }
}

/* ---- AVX2 activation quantisation ----------------------------------------------------
 * The same bytes as quantize_q8_block / quantize_q8_k_block: the maximum is
 * exact, x * id is the same float product and vcvtps2dq rounds it to nearest
 * even (under the default rounding mode, which round_q8 assumes as well).
 * Blocks with a non-finite input or scale go to the scalar code, whose
 * clamping of NaN and infinite products the conversion would not reproduce. */

/* Maximum |x| of n floats (a multiple of 8) and whether all are finite. */
static inline AVX2_FN float amax_avx2(const float *x, int n, int *finite) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    __m256 m = _mm256_setzero_ps();
    int fin = 0xff;
    for (int i = 0; i < n; i += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
        fin &= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_LE_OQ));
        m = _mm256_max_ps(a, m);
    }
    *finite = fin == 0xff;
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

/* round(x * s) clamped to [-127, 127], as int32 lanes. */
static inline AVX2_FN __m256i q8_lanes(const float *x, __m256 s) {
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), s));
    return _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
}

/* 32 int32 lanes (in order) to 32 bytes at dst. */
static inline AVX2_FN void store_q8x32(int8_t *dst, __m256i q0, __m256i q1, __m256i q2, __m256i q3) {
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    const __m256i v = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)(void *)dst, v);
}

static inline AVX2_FN int hsum_epi32(__m256i v) {
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    return _mm_cvtsi128_si32(h);
}

static AVX2_FN int q8_block_avx2(const float *x, uint8_t *d_out, uint8_t *s_out, int8_t *qs) {
    int finite;
    const float amax = amax_avx2(x, QK, &finite);
    if (!finite) return 0;
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    if (!(id <= FLT_MAX)) return 0;
    const __m256 s = _mm256_set1_ps(id);
    const __m256i q0 = q8_lanes(x, s), q1 = q8_lanes(x + 8, s), q2 = q8_lanes(x + 16, s), q3 = q8_lanes(x + 24, s);
    store_q8x32(qs, q0, q1, q2, q3);
    /* F16C rounds finite floats to nearest even, as quant_f32_to_f16 */
    const uint16_t hd = _cvtss_sh(d, 0);
    memcpy(d_out, &hd, 2);
    if (s_out) {
        const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
        const uint16_t hs = _cvtss_sh(d * (float)sum, 0);
        memcpy(s_out, &hs, 2);
    }
    return 1;
}

static AVX2_FN int q8_k_block_avx2(const float *x, uint8_t *b) {
    int finite;
    const float amax = amax_avx2(x, QK_K, &finite);
    if (!finite || amax == 0.0f) return 0;
    /* the first element of largest magnitude, with its sign */
    const __m256 sign = _mm256_set1_ps(-0.0f), va = _mm256_set1_ps(amax);
    int j = 0;
    for (int i = 0; i < QK_K; i += 8) {
        const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), va, _CMP_EQ_OQ));
        if (m) {
            j = i + __builtin_ctz((unsigned)m);
            break;
        }
    }
    const float iscale = -127.f / x[j];
    if (!(fabsf(iscale) <= FLT_MAX)) return 0;
    const __m256 s = _mm256_set1_ps(iscale);
    int16_t bsums[QK_K / 16];
    for (int i = 0; i < QK_K; i += 32) {
        const __m256i q0 = q8_lanes(x + i, s), q1 = q8_lanes(x + i + 8, s);
        const __m256i q2 = q8_lanes(x + i + 16, s), q3 = q8_lanes(x + i + 24, s);
        store_q8x32((int8_t *)(b + 4 + i), q0, q1, q2, q3);
        bsums[i / 16] = (int16_t)hsum_epi32(_mm256_add_epi32(q0, q1));
        bsums[i / 16 + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(q2, q3));
    }
    const float d = 1 / iscale;
    memcpy(b, &d, sizeof d);
    memcpy(b + 4 + QK_K, bsums, sizeof bsums);
    return 1;
}

/* ---- AVX2 kernels for several activation (and weight) rows -------------------------
 * tile_*(R, A) computes the R x A dot products of R weight rows (stride ws) with
 * A activation rows (stride as) into out[t * os + r]. Every product goes
 * through the operations of the single-row kernel above, in its order: the
 * same int32 lanes, one fma(d, lane, acc) per block with d = dx * dy, the same
 * minimum terms and the same final sums, so each result has the same bits as
 * quant_vec_dot. Shared are the unpacking of a weight block (across the A
 * activations), the loads of an activation block and the conversion of its
 * scales (across the R rows, vectorised: d for eight activations with one
 * vcvtph2ps, then one multiply by dx per row). R and A are constants after
 * inlining; the per-(row, activation) accumulators live in registers. */

#define UNROLL _Pragma("GCC unroll 8")

/* hsum8 of a vector, in its order: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)). */
static QUANT_INLINE AVX2_FN float hsum8_v(__m256 v) {
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static QUANT_INLINE uint16_t u16_at(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The halves at p + k*s for k < cnt (0 for the other lanes) as 8 floats. */
static QUANT_INLINE AVX2_FN __m256 halves8(const uint8_t *p, size_t s, const int cnt) {
    uint16_t h[8];
    UNROLL for (int k = 0; k < 8; k++) h[k] = k < cnt ? u16_at(p + (size_t)k * s) : 0;
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4],
                                          (short)h[5], (short)h[6], (short)h[7]));
}

/* The half pairs (d, s) at p + k*s for k < cnt as [d0 s0 d1 s1 d2 s2 d3 s3]. */
static QUANT_INLINE AVX2_FN __m256 pairs4(const uint8_t *p, size_t s, const int cnt) {
    uint32_t v[4];
    UNROLL for (int k = 0; k < 4; k++) v[k] = k < cnt ? u32_le(p + (size_t)k * s) : 0;
    return _mm256_cvtph_ps(_mm_setr_epi32((int)v[0], (int)v[1], (int)v[2], (int)v[3]));
}

static QUANT_INLINE AVX2_FN __m256 lane_bcast(__m256 v, const int k) {
    return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(k));
}

/* Q4_0 / Q5_0 / Q8_0 (activations Q8_0): signed weight quants of block x. */
static QUANT_INLINE AVX2_FN __m256i wq_signed(const uint32_t type, const uint8_t *x) {
    switch (type) {
    case GGML_TYPE_Q4_0: return _mm256_sub_epi8(nibbles32(x + 2), _mm256_set1_epi8(8));
    case GGML_TYPE_Q5_0: return _mm256_sub_epi8(_mm256_or_si256(nibbles32(x + 6), bit4_bytes(x + 2)), _mm256_set1_epi8(16));
    default: return load256(x + 2); /* Q8_0 */
    }
}

static QUANT_INLINE AVX2_FN void tile_s8(const uint32_t type, const uint8_t *w, size_t ws, const uint8_t *a, size_t as,
                                         int64_t nb, float *out, size_t os, const int R, const int A, const int vnni) {
    const size_t wb = type == GGML_TYPE_Q4_0 ? 2 + QK / 2 : type == GGML_TYPE_Q5_0 ? 6 + QK / 2 : Q8_0_BYTES;
    __m256 acc[2][8];
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < A; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *ab = a + (size_t)b * Q8_0_BYTES;
        const __m256 dy = halves8(ab, as, A);
        __m256i xs[2], ax[2];
        __m256 dd[2];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *x = w + (size_t)r * ws + (size_t)b * wb;
            xs[r] = wq_signed(type, x);
            ax[r] = _mm256_sign_epi8(xs[r], xs[r]);
            dd[r] = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16((short)u16_at(x))), dy);
        }
        UNROLL for (int t = 0; t < A; t++) {
            const __m256i y = load256(ab + (size_t)t * as + 2);
            UNROLL for (int r = 0; r < R; r++) {
                const __m256i ys = _mm256_sign_epi8(y, xs[r]);
                const __m256i p = vnni ? dot_u8_vnni(ax[r], ys) : dot_u8(ax[r], ys);
                acc[r][t] = _mm256_fmadd_ps(lane_bcast(dd[r], t), _mm256_cvtepi32_ps(p), acc[r][t]);
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) UNROLL for (int t = 0; t < A; t++) out[(size_t)t * os + r] = hsum8_v(acc[r][t]);
}

/* Q4_1 / Q5_1 (activations Q8_1): unsigned weight quants, plus the minimum
 * term summs = fma(mx, sy, summs), kept in the odd lanes of [d s] vectors. */
static QUANT_INLINE AVX2_FN void tile_u8(const uint32_t type, const uint8_t *w, size_t ws, const uint8_t *a, size_t as,
                                         int64_t nb, float *out, size_t os, const int R, const int A, const int vnni) {
    const size_t wb = type == GGML_TYPE_Q4_1 ? 4 + QK / 2 : 8 + QK / 2;
    const int G = (A + 3) / 4;
    __m256 acc[2][8], sm[2][2];
    UNROLL for (int r = 0; r < R; r++) {
        UNROLL for (int t = 0; t < A; t++) acc[r][t] = _mm256_setzero_ps();
        UNROLL for (int g = 0; g < G; g++) sm[r][g] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *ab = a + (size_t)b * Q8_1_BYTES;
        __m256 ds[2];
        UNROLL for (int g = 0; g < G; g++) ds[g] = pairs4(ab + (size_t)(4 * g) * as, as, A - 4 * g);
        __m256i xq[2];
        __m256 dd[2][2];
        UNROLL for (int r = 0; r < R; r++) {
            const uint8_t *x = w + (size_t)r * ws + (size_t)b * wb;
            xq[r] = type == GGML_TYPE_Q4_1 ? nibbles32(x + 4) : _mm256_or_si256(nibbles32(x + 8), bit4_bytes(x + 4));
            /* [dx mx dx mx ...] against [d0 s0 d1 s1 ...]: the even lanes of the
             * product are d = dx * dy, the odd lanes of the fma the summs */
            const __m128i dmh = A == 1 ? _mm_cvtsi32_si128((int)u32_le(x)) : _mm_set1_epi32((int)u32_le(x));
            const __m256 dm = _mm256_cvtph_ps(dmh); /* one activation: lanes 0-1 suffice */
            UNROLL for (int g = 0; g < G; g++) {
                dd[r][g] = _mm256_mul_ps(dm, ds[g]);
                sm[r][g] = _mm256_fmadd_ps(dm, ds[g], sm[r][g]);
            }
        }
        UNROLL for (int t = 0; t < A; t++) {
            const __m256i y = load256(ab + (size_t)t * as + 4);
            UNROLL for (int r = 0; r < R; r++) {
                const __m256i p = vnni ? dot_u8_vnni(xq[r], y) : dot_u8(xq[r], y);
                acc[r][t] = _mm256_fmadd_ps(lane_bcast(dd[r][t / 4], 2 * (t % 4)), _mm256_cvtepi32_ps(p), acc[r][t]);
            }
        }
    }
    UNROLL for (int r = 0; r < R; r++) {
        float s[2][8];
        UNROLL for (int g = 0; g < G; g++) _mm256_storeu_ps(s[g], sm[r][g]);
        UNROLL for (int t = 0; t < A; t++) out[(size_t)t * os + r] = hsum8_v(acc[r][t]) + s[t / 4][2 * (t % 4) + 1];
    }
}

/* Q4_K / Q5_K (one row): the lanes of k45_lanes_avx2 for A activations at once. */
static QUANT_INLINE AVX2_FN void tile_k45(const uint32_t type, const uint8_t *w, const uint8_t *a, size_t as, int64_t nb,
                                          float *out, size_t os, const int A) {
    const int q5 = type == GGML_TYPE_Q5_K;
    const size_t wb = q5 ? Q5_K_BYTES : Q4_K_BYTES;
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc[8];
    __m128 accm[8];
    UNROLL for (int t = 0; t < A; t++) {
        acc[t] = _mm256_setzero_ps();
        accm[t] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x = w + (size_t)b * wb, *ab = a + (size_t)b * Q8_K_BYTES;
        uint8_t sc[8], mn[8];
        scales_mins_k4(x + 4, sc, mn);
        const uint8_t *q = x + (q5 ? 48 : 16);
        const __m256i hb = q5 ? load256(x + 16) : _mm256_setzero_si256();
        __m256i sumi[8];
        UNROLL for (int t = 0; t < A; t++) sumi[t] = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 64; j++) {
            const __m256i bits = load256(q + 32 * j);
            __m256i q1 = _mm256_and_si256(bits, m4), q2 = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if (q5) {
                q1 = _mm256_or_si256(q1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4));
                q2 = _mm256_or_si256(q2, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4));
            }
            const __m256i s1 = _mm256_set1_epi16(sc[2 * j]), s2 = _mm256_set1_epi16(sc[2 * j + 1]);
            UNROLL for (int t = 0; t < A; t++) {
                const uint8_t *y = ab + (size_t)t * as + 4 + 64 * j;
                const __m256i p1 = _mm256_maddubs_epi16(q1, load256(y)), p2 = _mm256_maddubs_epi16(q2, load256(y + 32));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(_mm256_madd_epi16(p1, s1), _mm256_madd_epi16(p2, s2)));
            }
        }
        const float dxw = half_f16c(x), dmw = half_f16c(x + 2);
        UNROLL for (int t = 0; t < A; t++) {
            const uint8_t *at = ab + (size_t)t * as;
            const float dy = q8k_d(at);
            const float d = dy * dxw, dmin = -dy * dmw;
            __m128i m = k_min_lanes(at, mn);
            if (q5) {
                m = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
                m = _mm_add_epi32(m, _mm_shuffle_epi32(m, 0xb1));
                accm[t] = _mm_fmadd_ss(_mm_set_ss(dmin), _mm_set_ss((float)_mm_cvtsi128_si32(m)), accm[t]);
            } else {
                accm[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(m), accm[t]);
            }
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < A; t++) {
        float m[4];
        _mm_storeu_ps(m, accm[t]);
        out[(size_t)t * os] = q5 ? hsum8_v(acc[t]) + m[0] : hsum8_v(acc[t]) + ((m[0] + m[2]) + (m[1] + m[3]));
    }
}

/* Q6_K (one row), as vd_q6_k_avx2 for A activations at once. */
static QUANT_INLINE AVX2_FN void tile_q6_k(const uint8_t *w, const uint8_t *a, size_t as, int64_t nb, float *out,
                                           size_t os, const int A) {
    __m256 acc[8];
    UNROLL for (int t = 0; t < A; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x = w + (size_t)b * Q6_K_BYTES, *ab = a + (size_t)b * Q8_K_BYTES;
        const int8_t *sc = (const int8_t *)(x + 192);
        __m256i sumi[8];
        UNROLL for (int t = 0; t < A; t++) sumi[t] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            __m256i q[4];
            q6_k_quants(x, n, q);
            for (int g = 0; g < 4; g++) {
                const __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[8 * n + 2 * g + 1]), _mm_set1_epi16(sc[8 * n + 2 * g]));
                UNROLL for (int t = 0; t < A; t++) {
                    const __m256i p = _mm256_maddubs_epi16(q[g], load256(ab + (size_t)t * as + 4 + 128 * n + 32 * g));
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(p, s));
                }
            }
        }
        const __m256i sc16 = _mm256_cvtepi8_epi16(load128(x + 192));
        const float dw = half_f16c(x + 208);
        UNROLL for (int t = 0; t < A; t++) {
            const uint8_t *at = ab + (size_t)t * as;
            const __m256i sub = _mm256_slli_epi32(_mm256_madd_epi16(load256(at + 4 + QK_K), sc16), 5);
            const float d = q8k_d(at) * dw;
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi[t], sub)), acc[t]);
        }
    }
    UNROLL for (int t = 0; t < A; t++) out[(size_t)t * os] = hsum8_v(acc[t]);
}

/* Instances: tile_fn(w, ws, a, as, nb, out, os). One-row kernels for 1, 2, 4
 * and 8 activations (any count is a sum of those), two-row kernels for 4
 * (Q4_1 and Q8_0, see avx2_tiles). */
typedef void (*tile_fn)(const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int64_t nb, float *out, size_t os);

/* the 32-element block types: one kernel (tile_s8 or tile_u8), with and without VNNI */
#define TILE_32(kernel, T, R, A)                                                                               \
    static AVX2_FN void tile_##T##_##R##x##A(const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int64_t nb, \
                                             float *out, size_t os) {                                          \
        kernel(GGML_TYPE_##T, w, ws, a, as, nb, out, os, R, A, 0);                                             \
    }                                                                                                          \
    static AVX2_FN void tile_##T##_##R##x##A##_vnni(const uint8_t *w, size_t ws, const uint8_t *a, size_t as,  \
                                                    int64_t nb, float *out, size_t os) {                       \
        kernel(GGML_TYPE_##T, w, ws, a, as, nb, out, os, R, A, 1);                                             \
    }
#define TILE_S8(T, R, A) TILE_32(tile_s8, T, R, A)
#define TILE_U8(T, R, A) TILE_32(tile_u8, T, R, A)
#define TILE_K45(T, R, A)                                                                                      \
    static AVX2_FN void tile_##T##_##R##x##A(const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int64_t nb, \
                                             float *out, size_t os) {                                          \
        (void)ws;                                                                                              \
        tile_k45(GGML_TYPE_##T, w, a, as, nb, out, os, A);                                                     \
    }
#define TILE_Q6K(T, R, A)                                                                                      \
    static AVX2_FN void tile_##T##_##R##x##A(const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int64_t nb, \
                                             float *out, size_t os) {                                          \
        (void)ws;                                                                                              \
        tile_q6_k(w, a, as, nb, out, os, A);                                                                   \
    }
#define TILES_1ROW(K, T) K(T, 1, 1) K(T, 1, 2) K(T, 1, 4) K(T, 1, 8)
#define TILES(K, T) TILES_1ROW(K, T) K(T, 2, 4)

TILES_1ROW(TILE_S8, Q4_0)
TILES_1ROW(TILE_S8, Q5_0)
TILES(TILE_S8, Q8_0)
TILES(TILE_U8, Q4_1)
TILES_1ROW(TILE_U8, Q5_1)
TILES_1ROW(TILE_K45, Q4_K)
TILES_1ROW(TILE_K45, Q5_K)
TILES_1ROW(TILE_Q6K, Q6_K)

typedef struct tile_set {
    tile_fn one[4]; /* one row against 1, 2, 4, 8 activations */
    tile_fn two4;   /* two rows against 4 activations, or NULL */
} tile_set;

/* vnni: the 32-element block types' kernels with vpdpbusd (same bits). */
static const tile_set *avx2_tiles(uint32_t type, int vnni) {
#define SET1(T) {{tile_##T##_1x1, tile_##T##_1x2, tile_##T##_1x4, tile_##T##_1x8}, NULL}
#define SET2(T) {{tile_##T##_1x1, tile_##T##_1x2, tile_##T##_1x4, tile_##T##_1x8}, tile_##T##_2x4}
#define SET1V(T) {{tile_##T##_1x1_vnni, tile_##T##_1x2_vnni, tile_##T##_1x4_vnni, tile_##T##_1x8_vnni}, NULL}
#define SET2V(T) {{tile_##T##_1x1_vnni, tile_##T##_1x2_vnni, tile_##T##_1x4_vnni, tile_##T##_1x8_vnni}, tile_##T##_2x4_vnni}
    /* 2x4 tiles measured 2-5% faster than 1x8 for Q4_1 and Q8_0 and 2-6% slower
     * for Q4_0, Q5_0 and Q5_1 (bench_matmul shapes on a Zen 4 core) */
    static const tile_set q4_0 = SET1(Q4_0), q5_0 = SET1(Q5_0), q8_0 = SET2(Q8_0), q4_1 = SET2(Q4_1),
                          q5_1 = SET1(Q5_1), q4_k = SET1(Q4_K), q5_k = SET1(Q5_K), q6_k = SET1(Q6_K);
    static const tile_set q4_0v = SET1V(Q4_0), q5_0v = SET1V(Q5_0), q8_0v = SET2V(Q8_0), q4_1v = SET2V(Q4_1),
                          q5_1v = SET1V(Q5_1);
#undef SET1
#undef SET2
#undef SET1V
#undef SET2V
    switch (type) {
    case GGML_TYPE_Q4_0: return vnni ? &q4_0v : &q4_0;
    case GGML_TYPE_Q5_0: return vnni ? &q5_0v : &q5_0;
    case GGML_TYPE_Q8_0: return vnni ? &q8_0v : &q8_0;
    case GGML_TYPE_Q4_1: return vnni ? &q4_1v : &q4_1;
    case GGML_TYPE_Q5_1: return vnni ? &q5_1v : &q5_1;
    case GGML_TYPE_Q4_K: return &q4_k;
    case GGML_TYPE_Q5_K: return &q5_k;
    case GGML_TYPE_Q6_K: return &q6_k;
    default: return NULL;
    }
}

/* One row against n_acts activations with the one-row kernels: groups of 8,
 * then 4, 2, 1. */
static void tiles_one_row(const tile_set *ts, const uint8_t *w, const uint8_t *a, size_t as, int64_t n_acts,
                          int64_t nb, float *out, size_t os) {
    int64_t t = 0;
    for (; t + 8 <= n_acts; t += 8) ts->one[3](w, 0, a + (size_t)t * as, as, nb, out + (size_t)t * os, os);
    for (int k = 2; k >= 0; k--)
        if ((n_acts - t) & (1 << k)) {
            ts->one[k](w, 0, a + (size_t)t * as, as, nb, out + (size_t)t * os, os);
            t += 1 << k;
        }
}
#undef TILES
#undef TILES_1ROW
#undef TILE_S8
#undef TILE_32
#undef TILE_U8
#undef TILE_K45
#undef TILE_Q6K
#undef UNROLL
#endif

/* ---- dispatch ------------------------------------------------------------------------ */

static atomic_int simd_mode = -1; /* -1 not yet known, 0 scalar, 1 AVX2, 2 AVX2 with VNNI */
static atomic_int forced_scalar = 0, forced_no_vnni = 0;

static int use_avx2(void) {
    if (atomic_load_explicit(&forced_scalar, memory_order_relaxed)) return 0;
    int m = atomic_load_explicit(&simd_mode, memory_order_relaxed);
    if (m < 0) {
        m = QUANT_HAVE_AVX2 ? simd_cpu_probe() : 0;
        atomic_store_explicit(&simd_mode, m, memory_order_relaxed);
    }
    return m;
}

static int use_vnni(void) {
    return use_avx2() == 2 && !atomic_load_explicit(&forced_no_vnni, memory_order_relaxed);
}

int quant_cpu_avx2(void) { return use_avx2() != 0; }

int quant_cpu_vnni(void) { return use_vnni(); }

static int quantize_act_simd(uint32_t act_type, const float *x, uint8_t *p, int64_t n) {
#if QUANT_HAVE_AVX2
    if (!use_avx2()) return 0;
    switch (act_type) {
    case GGML_TYPE_Q8_0:
        for (int64_t i = 0; i < n; i += QK, p += Q8_0_BYTES)
            if (!q8_block_avx2(x + i, p, NULL, (int8_t *)(p + 2))) quantize_q8_block(x + i, p, NULL, (int8_t *)(p + 2));
        return 1;
    case GGML_TYPE_Q8_1:
        for (int64_t i = 0; i < n; i += QK, p += Q8_1_BYTES)
            if (!q8_block_avx2(x + i, p, p + 2, (int8_t *)(p + 4))) quantize_q8_block(x + i, p, p + 2, (int8_t *)(p + 4));
        return 1;
    case GGML_TYPE_Q8_K:
        for (int64_t i = 0; i < n; i += QK_K, p += Q8_K_BYTES)
            if (!q8_k_block_avx2(x + i, p)) quantize_q8_k_block(x + i, p);
        return 1;
    default: return 0;
    }
#else
    (void)act_type, (void)x, (void)p, (void)n;
    return 0;
#endif
}

const char *quant_simd_name(void) {
    return !use_avx2() ? "scalar" : use_vnni() ? "avx2+vnni" : "avx2";
}

void quant_force_scalar(int on) {
    atomic_store_explicit(&forced_scalar, on != 0, memory_order_relaxed);
}

void quant_force_no_vnni(int on) {
    atomic_store_explicit(&forced_no_vnni, on != 0, memory_order_relaxed);
}

float quant_vec_dot(uint32_t type, const void *row, const void *act, int64_t n) {
    if (!quant_act_row_bytes(type, n)) return 0.0f;
    const int64_t nb = n / quant_block_elems(type);
#if QUANT_HAVE_AVX2
    if (use_avx2()) return avx2_kernel(type)(row, act, nb);
#endif
    return scalar_kernel(type)(row, act, nb);
}

/* ---- several rows at once ------------------------------------------------------------ */

void quant_vec_dot_multi(uint32_t type, const void *row, const void *acts, size_t act_stride, int64_t n_acts,
                         int64_t n, float *out) {
    if (n_acts <= 0) return;
    const uint8_t *a = acts;
#if QUANT_HAVE_AVX2
    const tile_set *ts = use_avx2() && quant_act_row_bytes(type, n) ? avx2_tiles(type, use_vnni()) : NULL;
    if (ts) {
        tiles_one_row(ts, row, a, act_stride, n_acts, n / quant_block_elems(type), out, 1);
        return;
    }
#endif
    for (int64_t t = 0; t < n_acts; t++) out[t] = quant_vec_dot(type, row, a + (size_t)t * act_stride, n);
}

/* quant_matmul takes the activations in chunks of about 16 KiB (a multiple of
 * 8 rows, at least 8) and runs every row of the block over one chunk before
 * the next, so that the chunk stays in L1 while the weights stream from L2.
 * Measured on a Zen 4 core (tests/bench/bench_matmul.c shapes, 512 rows):
 * about 17% faster than no chunks for Q4_K / Q5_K / Q6_K rows of 1536, ~5% for
 * Q4_1; 8 KiB to 32 KiB chunks all did as well. */
enum { MATMUL_CHUNK_MIN = 8 }; /* MATMUL_CHUNK_BYTES: quant_cpu.h */

void quant_matmul(uint32_t type, const void *rows, size_t row_stride, int64_t n_rows, const void *acts,
                  size_t act_stride, int64_t n_acts, int64_t n, float *out, size_t out_stride) {
    if (n_rows <= 0 || n_acts <= 0) return;
    const uint8_t *w = rows, *a = acts;
    const size_t arb = quant_act_row_bytes(type, n);
#if QUANT_HAVE_AVX2
    const tile_set *ts = use_avx2() && arb ? avx2_tiles(type, use_vnni()) : NULL;
    if (ts) {
        const int64_t nb = n / quant_block_elems(type);
        int64_t chunk = (int64_t)(MATMUL_CHUNK_BYTES / arb) & ~(int64_t)7;
        if (chunk < MATMUL_CHUNK_MIN) chunk = MATMUL_CHUNK_MIN;
        for (int64_t t0 = 0; t0 < n_acts; t0 += chunk) {
            const int64_t na = n_acts - t0 < chunk ? n_acts - t0 : chunk;
            const uint8_t *ac = a + (size_t)t0 * act_stride;
            float *oc = out + (size_t)t0 * out_stride;
            int64_t r = 0;
            if (ts->two4 && na >= 4)
                for (; r + 2 <= n_rows; r += 2) {
                    const uint8_t *wr = w + (size_t)r * row_stride;
                    int64_t t = 0;
                    for (; t + 4 <= na; t += 4)
                        ts->two4(wr, row_stride, ac + (size_t)t * act_stride, act_stride, nb,
                                 oc + (size_t)t * out_stride + r, out_stride);
                    if (t < na)
                        for (int k = 0; k < 2; k++)
                            tiles_one_row(ts, wr + (size_t)k * row_stride, ac + (size_t)t * act_stride, act_stride,
                                          na - t, nb, oc + (size_t)t * out_stride + r + k, out_stride);
                }
            for (; r < n_rows; r++)
                tiles_one_row(ts, w + (size_t)r * row_stride, ac, act_stride, na, nb, oc + r, out_stride);
        }
        return;
    }
#endif
    (void)arb;
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t t = 0; t < n_acts; t++)
            out[(size_t)t * out_stride + r] = quant_vec_dot(type, w + (size_t)r * row_stride, a + (size_t)t * act_stride, n);
}
