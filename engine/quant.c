/* Tensor element types and their dequantisation. Block layouts are those of
 * ggml (ggml-common.h): every block stores its scales as IEEE halves,
 * little-endian, and the quants packed as described above each decoder. The
 * arithmetic follows ggml's reference dequantisers operation for operation, so
 * results are bit-identical to them (and to gguf-py's numpy versions) as long
 * as the compiler does not contract a*b-c into an FMA (gcc in ISO C mode, which
 * the Makefile uses, does not; for clang the pragma below says so). */
#include "quant.h"

#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* clang contracts by default even in ISO mode */
#endif

enum { QK = 32, QK_K = 256 };

/* ---- type table ------------------------------------------------------------ */

typedef struct {
    const char *name;
    uint32_t elems, bytes;
    int supported;
} type_info;

static const type_info *info(uint32_t type) {
    static const type_info t[GGML_TYPE_COUNT_] = {
        [GGML_TYPE_F32] = {"F32", 1, 4, 1},
        [GGML_TYPE_F16] = {"F16", 1, 2, 1},
        [GGML_TYPE_BF16] = {"BF16", 1, 2, 1},
        [GGML_TYPE_Q4_0] = {"Q4_0", QK, 2 + QK / 2, 1},
        [GGML_TYPE_Q4_1] = {"Q4_1", QK, 4 + QK / 2, 1},
        [GGML_TYPE_Q5_0] = {"Q5_0", QK, 2 + 4 + QK / 2, 1},
        [GGML_TYPE_Q5_1] = {"Q5_1", QK, 4 + 4 + QK / 2, 1},
        [GGML_TYPE_Q8_0] = {"Q8_0", QK, 2 + QK, 1},
        /* Q8_1 and Q8_K are ggml's intermediate types for activations; they do
         * not occur as stored weights, so they are known but not computed. */
        [GGML_TYPE_Q8_1] = {"Q8_1", QK, 4 + QK, 0},
        [GGML_TYPE_Q2_K] = {"Q2_K", QK_K, QK_K / 16 + QK_K / 4 + 4, 1},
        [GGML_TYPE_Q3_K] = {"Q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2, 1},
        [GGML_TYPE_Q4_K] = {"Q4_K", QK_K, 4 + 12 + QK_K / 2, 1},
        [GGML_TYPE_Q5_K] = {"Q5_K", QK_K, 4 + 12 + QK_K / 8 + QK_K / 2, 1},
        [GGML_TYPE_Q6_K] = {"Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, 1},
        [GGML_TYPE_Q8_K] = {"Q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2, 0},
    };
    if (type >= GGML_TYPE_COUNT_ || !t[type].name) return NULL;
    return &t[type];
}

int quant_type_supported(uint32_t type) {
    const type_info *t = info(type);
    return t ? t->supported : 0;
}

const char *quant_type_name(uint32_t type) {
    const type_info *t = info(type);
    return t ? t->name : "unknown";
}

uint32_t quant_block_elems(uint32_t type) {
    const type_info *t = info(type);
    return t ? t->elems : 0;
}

uint32_t quant_block_bytes(uint32_t type) {
    const type_info *t = info(type);
    return t ? t->bytes : 0;
}

size_t quant_row_bytes(uint32_t type, uint64_t n) {
    const type_info *t = info(type);
    if (!t || n % t->elems) return 0;
    uint64_t blocks = n / t->elems;
    if (blocks > SIZE_MAX / t->bytes) return 0;
    return (size_t)(blocks * t->bytes);
}

/* ---- half / bfloat16 ------------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float quant_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13)); /* inf, nan */
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t quant_f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* nan: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to inf */
    uint32_t exp = a >> 23;
    if (exp < 113) { /* below 2^-14: half subnormal (or zero) in units of 2^-24 */
        if (exp < 102) return sign; /* < 2^-25: rounds to zero */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = ((exp - 112) << 10) | ((a >> 13) & 0x3ff);
    uint32_t rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* carry may reach the exponent: fine */
    return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t quant_f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet nan */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* ---- block decoders ---------------------------------------------------------
 * Each decodes one block at b into y (quant_block_elems floats). */

static float half_at(const uint8_t *p) {
    return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static uint32_t u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Q4_0: d, qs[16]. Element j is the low nibble of qs[j], j+16 the high one. */
static void dq_q4_0(const uint8_t *b, float *y) {
    const float d = half_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((qs[j] & 0x0f) - 8) * d;
        y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
    }
}

/* Q4_1: d, m, qs[16]; value = q*d + m. */
static void dq_q4_1(const uint8_t *b, float *y) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(qs[j] & 0x0f) * d + m;
        y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
    }
}

/* Q5_0: d, qh (u32: bit j is bit 4 of element j), qs[16] as in Q4_0; offset 16. */
static void dq_q5_0(const uint8_t *b, float *y) {
    const float d = half_at(b);
    const uint32_t qh = u32_at(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)(lo - 16) * d;
        y[j + QK / 2] = (float)(hi - 16) * d;
    }
}

/* Q5_1: d, m, qh, qs[16]; value = q*d + m. */
static void dq_q5_1(const uint8_t *b, float *y) {
    const float d = half_at(b), m = half_at(b + 2);
    const uint32_t qh = u32_at(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < QK / 2; j++) {
        int lo = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = (float)lo * d + m;
        y[j + QK / 2] = (float)hi * d + m;
    }
}

/* Q8_0: d, int8 qs[32]. */
static void dq_q8_0(const uint8_t *b, float *y) {
    const float d = half_at(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) y[j] = (float)qs[j] * d;
}

/* Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
 * Each 128-element half uses 32 bytes of qs; its four 32-element groups take
 * bit pairs 0-1, 2-3, 4-5, 6-7; each group is two 16-element sub-blocks
 * (qs[0..15] and qs[16..31]) with their own scale byte. */
static void dq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *q = b + 16;
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int h = 0; h < 2; h++, is++) {
                const float dl = d * (float)(sc[is] & 0x0f), ml = dmin * (float)(sc[is] >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * h] >> shift) & 3) - ml;
            }
        }
    }
}

/* Q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales, offset 32), d.
 * Low two bits as in Q2_K; the third bit comes from hmask (bit k for group k);
 * a clear bit subtracts 4. Scale s: low nibble from byte s (s < 8) or the high
 * nibble of byte s-8; top two bits from byte 8 + s%4, bit pair s/4. */
static void dq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32, *sb = b + 96;
    const float d = half_at(b + 108);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
        for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
            for (int h = 0; h < 2; h++, is++) {
                int lo = is < 8 ? (sb[is] & 0x0f) : (sb[is - 8] >> 4);
                int hi = (sb[8 + is % 4] >> (2 * (is / 4))) & 3;
                const float dl = d * (float)((lo | (hi << 4)) - 32);
                for (int l = 0; l < 16; l++) {
                    int k = l + 16 * h;
                    int v = ((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
                    *y++ = dl * (float)v;
                }
            }
        }
    }
}

/* Q4_K / Q5_K 12-byte scale block: eight 6-bit scales and eight 6-bit mins. */
static void scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]. Each 64 elements use 32 bytes of qs:
 * low nibbles are the first 32 (sub-block 2i), high nibbles the next 32. */
static void dq_q4_k(const uint8_t *b, float *y) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t *s = b + 4, *q = b + 16;
    for (int j = 0; j < QK_K / 64; j++, q += 32) {
        uint8_t sc, mn;
        scale_min_k4(2 * j, s, &sc, &mn);
        const float d1 = d * (float)sc, m1 = dmin * (float)mn;
        scale_min_k4(2 * j + 1, s, &sc, &mn);
        const float d2 = d * (float)sc, m2 = dmin * (float)mn;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0f) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
    }
}

/* Q5_K: d, dmin, scales[12], qh[32], qs[128]; as Q4_K plus a fifth bit:
 * bit k of qh[l] belongs to element l of sub-block k. */
static void dq_q5_k(const uint8_t *b, float *y) {
    const float d = half_at(b), dmin = half_at(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *q = b + 48;
    for (int j = 0; j < QK_K / 64; j++, q += 32) {
        uint8_t sc, mn;
        scale_min_k4(2 * j, s, &sc, &mn);
        const float d1 = d * (float)sc, m1 = dmin * (float)mn;
        scale_min_k4(2 * j + 1, s, &sc, &mn);
        const float d2 = d * (float)sc, m2 = dmin * (float)mn;
        const uint8_t u1 = (uint8_t)(1u << (2 * j)), u2 = (uint8_t)(2u << (2 * j));
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)((q[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)((q[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
}

/* Q6_K: ql[128], qh[64], int8 scales[16], d. Each 128-element half uses 64
 * bytes of ql and 32 of qh: element l (+32, +64, +96) takes the low nibble of
 * ql[l] (ql[l+32], high nibble of ql[l], high nibble of ql[l+32]) and bit pair
 * 0-1 (2-3, 4-5, 6-7) of qh[l]; offset 32; one scale per 16 elements. */
static void dq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = half_at(b + 208);
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
    }
}

typedef void (*block_fn)(const uint8_t *b, float *y);

static block_fn block_decoder(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q4_0: return dq_q4_0;
    case GGML_TYPE_Q4_1: return dq_q4_1;
    case GGML_TYPE_Q5_0: return dq_q5_0;
    case GGML_TYPE_Q5_1: return dq_q5_1;
    case GGML_TYPE_Q8_0: return dq_q8_0;
    case GGML_TYPE_Q2_K: return dq_q2_k;
    case GGML_TYPE_Q3_K: return dq_q3_k;
    case GGML_TYPE_Q4_K: return dq_q4_k;
    case GGML_TYPE_Q5_K: return dq_q5_k;
    case GGML_TYPE_Q6_K: return dq_q6_k;
    default: return NULL;
    }
}

/* ---- rows -------------------------------------------------------------------- */

void quant_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    if (n <= 0) return;
    switch (type) {
    case GGML_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = half_at(p + 2 * i);
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
        return;
    default: break;
    }
    block_fn fn = quant_type_supported(type) ? block_decoder(type) : NULL;
    int64_t done = 0;
    if (fn) {
        const int64_t qk = quant_block_elems(type), bs = quant_block_bytes(type);
        for (int64_t i = 0; i + qk <= n; i += qk, p += bs) fn(p, dst + i);
        done = n - n % qk;
    }
    /* unsupported types and a partial trailing block (both caller errors) read as zeros */
    for (int64_t i = done; i < n; i++) dst[i] = 0.0f;
}

/* acc[k] += a[i]*b[i] over lanes i%8 == k (eight independent sums). */
static void dot_acc(float acc[8], const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
    for (int k = 0; i < n; i++, k++) acc[k] += a[i] * b[i];
}

float quant_dot_row(uint32_t type, const void *row, const float *x, int64_t n) {
    float acc[8] = {0};
    float buf[QK_K];
    const uint8_t *p = row;
    if (n <= 0) return 0.0f;
    if (type == GGML_TYPE_F32) {
        const float *r = row;
        dot_acc(acc, r, x, n);
    } else if (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
        for (int64_t i = 0; i < n; i += QK_K) {
            int64_t m = n - i < QK_K ? n - i : QK_K;
            quant_dequantize_row(type, p + 2 * i, buf, m);
            dot_acc(acc, buf, x + i, m);
        }
    } else {
        block_fn fn = quant_type_supported(type) ? block_decoder(type) : NULL;
        if (!fn) return 0.0f;
        const int64_t qk = quant_block_elems(type), bs = quant_block_bytes(type);
        for (int64_t i = 0; i + qk <= n; i += qk, p += bs) {
            fn(p, buf);
            dot_acc(acc, buf, x + i, qk);
        }
    }
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

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
 * Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K the result is bit-identical to
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
 * The portable kernels perform the same operations with fmaf, so the scalar
 * and AVX2 paths agree bit for bit. Q2_K and Q3_K (scalar only) sum one float
 * per 256-element block: sum += dall*isum - dmin*summs (Q2_K), sum += d*isum
 * (Q3_K), the generic versions' formulas in our order. F32 / F16 / BF16 add
 * element i to lane i % 8 and reduce with hsum8 (F16 and BF16 products are
 * exact in f32; llama.cpp's own summation order differs there). */

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

enum { Q8_0_BYTES = 2 + QK, Q8_1_BYTES = 4 + QK, Q8_K_BYTES = 4 + QK_K + 2 * (QK_K / 16) };

uint32_t quant_vec_dot_type(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return GGML_TYPE_F32;
    case GGML_TYPE_F16: return GGML_TYPE_F16;
    case GGML_TYPE_BF16: return GGML_TYPE_BF16;
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_Q8_0: return GGML_TYPE_Q8_0;
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1: return GGML_TYPE_Q8_1;
    case GGML_TYPE_Q2_K:
    case GGML_TYPE_Q3_K:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K:
    case GGML_TYPE_Q6_K: return GGML_TYPE_Q8_K;
    default: return GGML_TYPE_COUNT_;
    }
}

size_t quant_act_row_bytes(uint32_t weight_type, int64_t n) {
    const uint32_t vt = quant_vec_dot_type(weight_type);
    if (vt == GGML_TYPE_COUNT_ || n <= 0 || n % quant_block_elems(weight_type)) return 0;
    return quant_row_bytes(vt, (uint64_t)n);
}

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

static float q8k_d(const uint8_t *b) {
    float d;
    memcpy(&d, b, sizeof d);
    return d;
}

static int q8k_bsum(const uint8_t *b, int j) {
    int16_t v;
    memcpy(&v, b + 4 + QK_K + 2 * j, sizeof v);
    return v;
}

void quant_dequantize_act(uint32_t weight_type, const void *act, float *dst, int64_t n) {
    const uint8_t *p = act;
    if (n <= 0) return;
    if (!quant_act_row_bytes(weight_type, n)) {
        for (int64_t i = 0; i < n; i++) dst[i] = 0.0f;
        return;
    }
    switch (quant_vec_dot_type(weight_type)) {
    case GGML_TYPE_Q8_1:
        for (int64_t i = 0; i < n; i += QK, p += Q8_1_BYTES) {
            const float d = half_at(p);
            for (int j = 0; j < QK; j++) dst[i + j] = (float)(int8_t)p[4 + j] * d;
        }
        return;
    case GGML_TYPE_Q8_K:
        for (int64_t i = 0; i < n; i += QK_K, p += Q8_K_BYTES) {
            const float d = q8k_d(p);
            for (int j = 0; j < QK_K; j++) dst[i + j] = d * (float)(int8_t)p[4 + j];
        }
        return;
    default: quant_dequantize_row(quant_vec_dot_type(weight_type), act, dst, n); return;
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

static float vd_q2_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float sumf = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q2_K_BYTES, a += Q8_K_BYTES) {
        const uint8_t *sc = w, *q = w + 16;
        const int8_t *y = (const int8_t *)(a + 4);
        int summs = 0, isum = 0, is = 0;
        for (int j = 0; j < 16; j++) summs += q8k_bsum(a, j) * (sc[j] >> 4);
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, y += 32) {
                for (int h = 0; h < 2; h++, is++) {
                    int s = 0;
                    for (int l = 16 * h; l < 16 * h + 16; l++) s += y[l] * ((q[l] >> shift) & 3);
                    isum += (sc[is] & 0x0f) * s;
                }
            }
        }
        const float dy = q8k_d(a);
        const float dall = dy * half_at(w + 80), dmin = dy * half_at(w + 82);
        sumf += dall * (float)isum - dmin * (float)summs;
    }
    return sumf;
}

static float vd_q3_k(const uint8_t *w, const uint8_t *a, int64_t nb) {
    float sumf = 0.0f;
    for (int64_t b = 0; b < nb; b++, w += Q3_K_BYTES, a += Q8_K_BYTES) {
        const uint8_t *hm = w, *q = w + 32, *sb = w + 96;
        const int8_t *y = (const int8_t *)(a + 4);
        int isum = 0, is = 0;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1), y += 32) {
                for (int h = 0; h < 2; h++, is++) {
                    const int lo = is < 8 ? (sb[is] & 0x0f) : (sb[is - 8] >> 4);
                    const int hi = (sb[8 + is % 4] >> (2 * (is / 4))) & 3;
                    int s = 0;
                    for (int l = 16 * h; l < 16 * h + 16; l++)
                        s += y[l] * (((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
                    isum += ((lo | (hi << 4)) - 32) * s;
                }
            }
        }
        sumf += half_at(w + 108) * q8k_d(a) * (float)isum;
    }
    return sumf;
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QUANT_HAVE_AVX2 1
#include <cpuid.h>
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

static inline AVX2_FN __m256i load256(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

static inline AVX2_FN __m128i load128(const uint8_t *p) {
    return _mm_loadu_si128((const __m128i *)(const void *)p);
}

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

#define QUANT_INLINE inline __attribute__((always_inline))
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

static QUANT_INLINE uint32_t u32_le(const uint8_t *p) {
    uint32_t v;
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

#define TILE_S8(T, R, A)                                                                                       \
    static AVX2_FN void tile_##T##_##R##x##A(const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int64_t nb, \
                                             float *out, size_t os) {                                          \
        tile_s8(GGML_TYPE_##T, w, ws, a, as, nb, out, os, R, A, 0);                                            \
    }                                                                                                          \
    static AVX2_FN void tile_##T##_##R##x##A##_vnni(const uint8_t *w, size_t ws, const uint8_t *a, size_t as,  \
                                                    int64_t nb, float *out, size_t os) {                       \
        tile_s8(GGML_TYPE_##T, w, ws, a, as, nb, out, os, R, A, 1);                                            \
    }
#define TILE_U8(T, R, A)                                                                                       \
    static AVX2_FN void tile_##T##_##R##x##A(const uint8_t *w, size_t ws, const uint8_t *a, size_t as, int64_t nb, \
                                             float *out, size_t os) {                                          \
        tile_u8(GGML_TYPE_##T, w, ws, a, as, nb, out, os, R, A, 0);                                            \
    }                                                                                                          \
    static AVX2_FN void tile_##T##_##R##x##A##_vnni(const uint8_t *w, size_t ws, const uint8_t *a, size_t as,  \
                                                    int64_t nb, float *out, size_t os) {                       \
        tile_u8(GGML_TYPE_##T, w, ws, a, as, nb, out, os, R, A, 1);                                            \
    }
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
#undef TILE_U8
#undef TILE_K45
#undef TILE_Q6K
#undef UNROLL

static int cpu_has_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C)) return 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* vpdpbusd on 256- and 512-bit registers, with the byte operations of
 * AVX512BW (libgcc also checks that the OS saves the AVX-512 state). */
static int cpu_has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw");
}
#else
#define QUANT_HAVE_AVX2 0
#endif

/* ---- dispatch ------------------------------------------------------------------------ */

static atomic_int simd_mode = -1; /* -1 not yet known, 0 scalar, 1 AVX2, 2 AVX2 with VNNI */
static atomic_int forced_scalar = 0, forced_no_vnni = 0;

static int use_avx2(void) {
    if (atomic_load_explicit(&forced_scalar, memory_order_relaxed)) return 0;
    int m = atomic_load_explicit(&simd_mode, memory_order_relaxed);
    if (m < 0) {
        const char *e = getenv("POTSERVE_NO_SIMD");
        m = 0;
#if QUANT_HAVE_AVX2
        if (!(e && *e && strcmp(e, "0") != 0)) m = cpu_has_avx2() ? 1 + cpu_has_vnni() : 0;
#else
        (void)e;
#endif
        atomic_store_explicit(&simd_mode, m, memory_order_relaxed);
    }
    return m;
}

static int use_vnni(void) {
    return use_avx2() == 2 && !atomic_load_explicit(&forced_no_vnni, memory_order_relaxed);
}

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
enum { MATMUL_CHUNK_BYTES = 16 * 1024, MATMUL_CHUNK_MIN = 8 };

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

/* ---- eight rows interleaved ("packed") ----------------------------------------------
 * A group of eight rows, per 32-element block: the rows' scales dx (8 halves),
 * for Q4_1 their mins mx (8 halves), then the quants, four bytes of each row
 * in turn (chunk c holds bytes 4c..4c+3 of rows 0..7). A 4-bit chunk's low
 * nibbles are elements 4c..4c+3, its high nibbles 16+4c..16+4c+3; Q8_0's are
 * stored plus 128 (q ^ 0x80), so that every type's quants are unsigned bytes
 * u = q + offset for vpdpbusd, the offset taken back as offset * sum(y). */

enum { PACK_ROWS = 8, PACK_MAX_BLOCKS = 2048, PACK_PRE = 2048 };

static size_t pack_qoff(uint32_t type) {
    return type == GGML_TYPE_Q4_1 ? 32 : 16;
}

static int pack_offset(uint32_t type) {
    return type == GGML_TYPE_Q4_0 ? 8 : type == GGML_TYPE_Q8_0 ? 128 : 0;
}

int quant_packable(uint32_t type, int64_t n_rows, int64_t n) {
    return (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q8_0) && n_rows > 0 &&
           n_rows % PACK_ROWS == 0 && n > 0 && n % QK == 0 && n / QK <= PACK_MAX_BLOCKS;
}

void quant_pack_rows(uint32_t type, const void *rows, size_t row_stride, int64_t n_rows, int64_t n, void *dst) {
    if (!quant_packable(type, n_rows, n)) return;
    const uint8_t *src = rows;
    uint8_t *o = dst;
    const size_t bb = quant_block_bytes(type), qoff = pack_qoff(type);
    const size_t wq = type == GGML_TYPE_Q4_1 ? 4 : 2; /* the quants' offset in a row's block */
    const uint8_t flip = type == GGML_TYPE_Q8_0 ? 0x80 : 0;
    for (int64_t g = 0; g < n_rows / PACK_ROWS; g++)
        for (int64_t b = 0; b < n / QK; b++, o += PACK_ROWS * bb)
            for (int r = 0; r < PACK_ROWS; r++) {
                const uint8_t *x = src + (size_t)(PACK_ROWS * g + r) * row_stride + (size_t)b * bb;
                memcpy(o + 2 * r, x, 2);
                if (type == GGML_TYPE_Q4_1) memcpy(o + 16 + 2 * r, x + 2, 2);
                for (size_t c = 0; c < (bb - wq) / 4; c++)
                    for (int k = 0; k < 4; k++) o[qoff + 32 * c + 4 * r + k] = x[wq + 4 * c + k] ^ flip;
            }
}

/* What the packed kernels need of activation block (t, b), converted once per
 * matrix product: dy, sy (Q8_1's s) and offset * sum of its quants. */
typedef struct act_block {
    float d, s;
    int32_t osum, pad;
} act_block;

static void pack_prepare(uint32_t type, const uint8_t *acts, size_t as, int64_t n_acts, int64_t nb, act_block *pre) {
    const size_t ab = type == GGML_TYPE_Q4_1 ? Q8_1_BYTES : Q8_0_BYTES;
    const int off = pack_offset(type);
    for (int64_t t = 0; t < n_acts; t++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *y = acts + (size_t)t * as + (size_t)b * ab;
            act_block *p = pre + t * nb + b;
            p->d = half_at(y);
            p->s = type == GGML_TYPE_Q4_1 ? half_at(y + 2) : 0.0f;
            int32_t sum = 0;
            if (off)
                for (int j = 0; j < QK; j++) sum += (int8_t)y[ab - QK + j];
            p->osum = off * sum;
            p->pad = 0;
        }
}

/* One group against one activation, as the arithmetic of quant.h says. */
static void packed_scalar(uint32_t type, const uint8_t *g, int64_t nb, const uint8_t *a, const act_block *pre,
                          float *out) {
    const size_t bb = quant_block_bytes(type), qoff = pack_qoff(type);
    const size_t ab = type == GGML_TYPE_Q4_1 ? Q8_1_BYTES : Q8_0_BYTES;
    float acc[PACK_ROWS] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * PACK_ROWS * bb, *q = blk + qoff;
        const int8_t *y = (const int8_t *)(a + (size_t)b * ab + ab - QK);
        for (int r = 0; r < PACK_ROWS; r++) {
            int32_t isum = 0;
            if (type == GGML_TYPE_Q8_0) {
                for (int j = 0; j < QK; j++) isum += q[32 * (j / 4) + 4 * r + j % 4] * y[j];
            } else {
                for (int j = 0; j < QK / 2; j++) {
                    const uint8_t u = q[32 * (j / 4) + 4 * r + j % 4];
                    isum += (u & 0x0f) * y[j] + (u >> 4) * y[j + QK / 2];
                }
            }
            isum -= pre[b].osum;
            acc[r] = fmaf(half_at(blk + 2 * r) * pre[b].d, (float)isum, acc[r]);
            if (type == GGML_TYPE_Q4_1) acc[r] = fmaf(half_at(blk + 16 + 2 * r), pre[b].s, acc[r]);
        }
    }
    memcpy(out, acc, sizeof acc);
}

/* A group against A activations: out[t * os + r]. */
typedef void (*packed_fn)(const uint8_t *g, int64_t nb, const uint8_t *a, size_t as, const act_block *pre, float *out,
                          size_t os);

#if QUANT_HAVE_AVX2
#define PK_UNROLL _Pragma("GCC unroll 8")

/* acc + the int32 lanes of u (eight rows' four bytes) times the four
 * activation bytes at y4. VNNI: one vpdpbusd with the bytes broadcast from
 * memory. AVX2: maddubs + madd; Q8_0's quants (q + 128, up to 255) would
 * saturate maddubs, so they are turned back to q and go through the sign
 * trick, which makes the product q * y itself (no offset to take back). */
static QUANT_INLINE AVX2_FN __m256i pk_dot(__m256i acc, __m256i u, const uint8_t *y4, const int q8, const int vnni) {
    if (vnni) {
        __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const uint32_t *)(const void *)y4));
        return acc;
    }
    const __m256i y = _mm256_set1_epi32((int)u32_le(y4));
    __m256i p;
    if (q8) {
        const __m256i w = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
        p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w));
    } else {
        p = _mm256_maddubs_epi16(u, y);
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* pack_prepare with F16C conversions and the quants' sum in vectors (the
 * portable one was 2 % of a batched decode step): the same values. */
static AVX2_FN void pack_prepare_avx2(uint32_t type, const uint8_t *acts, size_t as, int64_t n_acts, int64_t nb,
                                      act_block *pre) {
    const size_t ab = type == GGML_TYPE_Q4_1 ? Q8_1_BYTES : Q8_0_BYTES;
    const int off = pack_offset(type), min = type == GGML_TYPE_Q4_1;
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int64_t t = 0; t < n_acts; t++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *y = acts + (size_t)t * as + (size_t)b * ab;
            act_block *p = pre + t * nb + b;
            p->d = _cvtsh_ss((unsigned short)(y[0] | y[1] << 8));
            p->s = min ? _cvtsh_ss((unsigned short)(y[2] | y[3] << 8)) : 0.0f;
            int32_t sum = 0;
            if (off) { /* 1 * q summed in pairs (maddubs), then in fours (madd), then across */
                const __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, load256(y + ab - QK)), ones16);
                __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
                h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
                h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
                sum = _mm_cvtsi128_si32(h);
            }
            p->osum = off * sum;
            p->pad = 0;
        }
}

static QUANT_INLINE AVX2_FN void packed_tile(const uint32_t type, const uint8_t *g, int64_t nb, const uint8_t *a,
                                             size_t as, const act_block *pre, float *out, size_t os, const int A,
                                             const int vnni) {
    const int q8 = type == GGML_TYPE_Q8_0, min = type == GGML_TYPE_Q4_1;
    const int take_offset = type == GGML_TYPE_Q4_0 || (q8 && vnni);
    const size_t gbb = PACK_ROWS * (size_t)quant_block_bytes(type), qoff = pack_qoff(type);
    const size_t ab = min ? Q8_1_BYTES : Q8_0_BYTES, aq = ab - QK;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4];
    PK_UNROLL for (int t = 0; t < A; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * gbb, *q = blk + qoff;
        const uint8_t *y = a + (size_t)b * ab + aq;
        __m256i iv[4];
        PK_UNROLL for (int t = 0; t < A; t++) iv[t] = _mm256_setzero_si256();
        if (q8) {
            PK_UNROLL for (int c = 0; c < 8; c++) {
                const __m256i u = load256(q + 32 * c);
                PK_UNROLL for (int t = 0; t < A; t++) iv[t] = pk_dot(iv[t], u, y + (size_t)t * as + 4 * c, 1, vnni);
            }
        } else {
            PK_UNROLL for (int c = 0; c < 4; c++) {
                const __m256i v = load256(q + 32 * c);
                const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                PK_UNROLL for (int t = 0; t < A; t++) {
                    iv[t] = pk_dot(iv[t], lo, y + (size_t)t * as + 4 * c, 0, vnni);
                    iv[t] = pk_dot(iv[t], hi, y + (size_t)t * as + 16 + 4 * c, 0, vnni);
                }
            }
        }
        const __m256 dx = _mm256_cvtph_ps(load128(blk));
        const __m256 mx = min ? _mm256_cvtph_ps(load128(blk + 16)) : _mm256_setzero_ps();
        PK_UNROLL for (int t = 0; t < A; t++) {
            const act_block *p = pre + (size_t)t * (size_t)nb + b;
            if (take_offset) iv[t] = _mm256_sub_epi32(iv[t], _mm256_set1_epi32(p->osum));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, _mm256_set1_ps(p->d)), _mm256_cvtepi32_ps(iv[t]), acc[t]);
            if (min) acc[t] = _mm256_fmadd_ps(mx, _mm256_set1_ps(p->s), acc[t]);
        }
    }
    PK_UNROLL for (int t = 0; t < A; t++) _mm256_storeu_ps(out + (size_t)t * os, acc[t]);
}

#define PACKED(T, A)                                                                                            \
    static AVX2_FN void packed_##T##_##A(const uint8_t *g, int64_t nb, const uint8_t *a, size_t as,           \
                                         const act_block *pre, float *out, size_t os) {                        \
        packed_tile(GGML_TYPE_##T, g, nb, a, as, pre, out, os, A, 0);                                          \
    }                                                                                                          \
    static AVX2_FN void packed_##T##_##A##_vnni(const uint8_t *g, int64_t nb, const uint8_t *a, size_t as,    \
                                                const act_block *pre, float *out, size_t os) {                 \
        packed_tile(GGML_TYPE_##T, g, nb, a, as, pre, out, os, A, 1);                                          \
    }
#define PACKED_ALL(T) PACKED(T, 1) PACKED(T, 2) PACKED(T, 4)
PACKED_ALL(Q4_0)
PACKED_ALL(Q4_1)
PACKED_ALL(Q8_0)
#undef PACKED_ALL
#undef PACKED

/* Two neighbouring groups (sixteen rows) per 512-bit register: lanes 0-7 are
 * group g's rows, lanes 8-15 group g+1's, whose outputs are the next eight
 * in a row of out. The same integer sums and the same float operations per
 * lane as packed_tile's, so the same bits; twice the products per
 * instruction, and up to eight activations per pass over the weights (the
 * 32 registers hold their accumulators). Only with VNNI (AVX-512 machines). */
#define AVX512_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

static QUANT_INLINE AVX512_FN __m512i pk_dot16(__m512i acc, __m512i u, const uint8_t *y4) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const uint32_t *)(const void *)y4));
    return acc;
}

static QUANT_INLINE AVX512_FN __m512i load2x256(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(load256(p0)), load256(p1), 1);
}

static QUANT_INLINE AVX512_FN __m512 halves16(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(load128(p0)), load128(p1), 1));
}

static QUANT_INLINE AVX512_FN void packed_pair_tile(const uint32_t type, const uint8_t *g, size_t gbytes, int64_t nb,
                                                    const uint8_t *a, size_t as, const act_block *pre, float *out,
                                                    size_t os, const int A) {
    const int q8 = type == GGML_TYPE_Q8_0, min = type == GGML_TYPE_Q4_1;
    const int take_offset = type == GGML_TYPE_Q4_0 || q8;
    const size_t gbb = PACK_ROWS * (size_t)quant_block_bytes(type), qoff = pack_qoff(type);
    const size_t ab = min ? Q8_1_BYTES : Q8_0_BYTES, aq = ab - QK;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[8];
    PK_UNROLL for (int t = 0; t < A; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + (size_t)b * gbb, *b1 = b0 + gbytes, *q0 = b0 + qoff, *q1 = b1 + qoff;
        const uint8_t *y = a + (size_t)b * ab + aq;
        __m512i iv[8];
        PK_UNROLL for (int t = 0; t < A; t++) iv[t] = _mm512_setzero_si512();
        if (q8) {
            PK_UNROLL for (int c = 0; c < 8; c++) {
                const __m512i u = load2x256(q0 + 32 * c, q1 + 32 * c);
                PK_UNROLL for (int t = 0; t < A; t++) iv[t] = pk_dot16(iv[t], u, y + (size_t)t * as + 4 * c);
            }
        } else {
            PK_UNROLL for (int c = 0; c < 4; c++) {
                const __m512i v = load2x256(q0 + 32 * c, q1 + 32 * c);
                const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                PK_UNROLL for (int t = 0; t < A; t++) {
                    iv[t] = pk_dot16(iv[t], lo, y + (size_t)t * as + 4 * c);
                    iv[t] = pk_dot16(iv[t], hi, y + (size_t)t * as + 16 + 4 * c);
                }
            }
        }
        const __m512 dx = halves16(b0, b1);
        const __m512 mx = min ? halves16(b0 + 16, b1 + 16) : _mm512_setzero_ps();
        PK_UNROLL for (int t = 0; t < A; t++) {
            const act_block *p = pre + (size_t)t * (size_t)nb + b;
            if (take_offset) iv[t] = _mm512_sub_epi32(iv[t], _mm512_set1_epi32(p->osum));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(p->d)), _mm512_cvtepi32_ps(iv[t]), acc[t]);
            if (min) acc[t] = _mm512_fmadd_ps(mx, _mm512_set1_ps(p->s), acc[t]);
        }
    }
    PK_UNROLL for (int t = 0; t < A; t++) _mm512_storeu_ps(out + (size_t)t * os, acc[t]);
}

/* Two groups against A activations; gbytes: one group's bytes. */
typedef void (*packed_pair_fn)(const uint8_t *g, size_t gbytes, int64_t nb, const uint8_t *a, size_t as,
                               const act_block *pre, float *out, size_t os);

#define PACKED_PAIR(T, A)                                                                                       \
    static AVX512_FN void packed_pair_##T##_##A(const uint8_t *g, size_t gbytes, int64_t nb, const uint8_t *a, \
                                                size_t as, const act_block *pre, float *out, size_t os) {      \
        packed_pair_tile(GGML_TYPE_##T, g, gbytes, nb, a, as, pre, out, os, A);                                \
    }
#define PACKED_PAIR_ALL(T) PACKED_PAIR(T, 1) PACKED_PAIR(T, 2) PACKED_PAIR(T, 4) PACKED_PAIR(T, 8)
PACKED_PAIR_ALL(Q4_0)
PACKED_PAIR_ALL(Q4_1)
PACKED_PAIR_ALL(Q8_0)
#undef PACKED_PAIR_ALL
#undef PACKED_PAIR
#undef PK_UNROLL

/* The pair kernels for 1, 2, 4 and 8 activations. */
static const packed_pair_fn *packed_pair_tiles(uint32_t type) {
#define SET(T) {packed_pair_##T##_1, packed_pair_##T##_2, packed_pair_##T##_4, packed_pair_##T##_8}
    static const packed_pair_fn q4_0[4] = SET(Q4_0), q4_1[4] = SET(Q4_1), q8_0[4] = SET(Q8_0);
#undef SET
    switch (type) {
    case GGML_TYPE_Q4_0: return q4_0;
    case GGML_TYPE_Q4_1: return q4_1;
    default: return q8_0;
    }
}

/* The kernels for 1, 2 and 4 activations. */
static const packed_fn *packed_tiles(uint32_t type, int vnni) {
#define SET(T) {packed_##T##_1, packed_##T##_2, packed_##T##_4}
#define SETV(T) {packed_##T##_1_vnni, packed_##T##_2_vnni, packed_##T##_4_vnni}
    static const packed_fn q4_0[3] = SET(Q4_0), q4_1[3] = SET(Q4_1), q8_0[3] = SET(Q8_0);
    static const packed_fn q4_0v[3] = SETV(Q4_0), q4_1v[3] = SETV(Q4_1), q8_0v[3] = SETV(Q8_0);
#undef SET
#undef SETV
    switch (type) {
    case GGML_TYPE_Q4_0: return vnni ? q4_0v : q4_0;
    case GGML_TYPE_Q4_1: return vnni ? q4_1v : q4_1;
    default: return vnni ? q8_0v : q8_0;
    }
}
#endif

void quant_matmul_packed(uint32_t type, const void *groups, int64_t n_groups, const void *acts, size_t act_stride,
                         int64_t n_acts, int64_t n, float *out, size_t out_stride) {
    if (n_groups <= 0 || n_acts <= 0 || !quant_packable(type, PACK_ROWS, n)) return;
    const int64_t nb = n / QK;
    const size_t gbytes = (size_t)nb * PACK_ROWS * quant_block_bytes(type);
    const uint8_t *w = groups, *a = acts;
    /* activation chunks as in quant_matmul, and no more than PACK_PRE blocks */
    int64_t chunk = (int64_t)(MATMUL_CHUNK_BYTES / quant_act_row_bytes(type, n)) & ~(int64_t)3;
    if (chunk < 4) chunk = 4;
    if (chunk > PACK_PRE / nb) chunk = PACK_PRE / nb;
    act_block pre[PACK_PRE];
#if QUANT_HAVE_AVX2
    const packed_fn *tiles = use_avx2() ? packed_tiles(type, use_vnni()) : NULL;
    const packed_pair_fn *pairs = use_vnni() ? packed_pair_tiles(type) : NULL;
#endif
    for (int64_t t0 = 0; t0 < n_acts; t0 += chunk) {
        const int64_t na = n_acts - t0 < chunk ? n_acts - t0 : chunk;
        const uint8_t *ac = a + (size_t)t0 * act_stride;
        float *oc = out + (size_t)t0 * out_stride;
#if QUANT_HAVE_AVX2
        if (tiles)
            pack_prepare_avx2(type, ac, act_stride, na, nb, pre);
        else
#endif
            pack_prepare(type, ac, act_stride, na, nb, pre);
        for (int64_t g = 0; g < n_groups; g++) {
            const uint8_t *gw = w + (size_t)g * gbytes;
            float *og = oc + (size_t)g * PACK_ROWS;
#if QUANT_HAVE_AVX2
            /* this group and the next; one activation (a single decode
             * stream) keeps the 256-bit kernel, measured 13 % faster there */
            if (pairs && na > 1 && g + 1 < n_groups) {
                int64_t t = 0;
                for (; t + 8 <= na; t += 8)
                    pairs[3](gw, gbytes, nb, ac + (size_t)t * act_stride, act_stride, pre + t * nb,
                             og + (size_t)t * out_stride, out_stride);
                for (int k = 2; k >= 0; k--)
                    if ((na - t) & (1 << k)) {
                        pairs[k](gw, gbytes, nb, ac + (size_t)t * act_stride, act_stride, pre + t * nb,
                                 og + (size_t)t * out_stride, out_stride);
                        t += 1 << k;
                    }
                g++;
                continue;
            }
            if (tiles) {
                int64_t t = 0;
                for (; t + 4 <= na; t += 4)
                    tiles[2](gw, nb, ac + (size_t)t * act_stride, act_stride, pre + t * nb, og + (size_t)t * out_stride,
                             out_stride);
                for (int k = 1; k >= 0; k--)
                    if ((na - t) & (1 << k)) {
                        tiles[k](gw, nb, ac + (size_t)t * act_stride, act_stride, pre + t * nb,
                                 og + (size_t)t * out_stride, out_stride);
                        t += 1 << k;
                    }
                continue;
            }
#endif
            for (int64_t t = 0; t < na; t++)
                packed_scalar(type, gw, nb, ac + (size_t)t * act_stride, pre + t * nb, og + (size_t)t * out_stride);
        }
    }
}
