/* Tensor element types and their dequantisation (the CPU kernels that
 * multiply with them are engine/cpu/quant_kernels.c and quant_pack.c). Block layouts are those of
 * ggml (ggml-common.h): every block stores its scales as IEEE halves,
 * little-endian, and the quants packed as described above each decoder. The
 * arithmetic follows ggml's reference dequantisers operation for operation, so
 * results are bit-identical to them (and to gguf-py's numpy versions) as long
 * as the compiler does not contract a*b-c into an FMA (gcc in ISO C mode, which
 * the Makefile uses, does not; for clang the pragma below says so). */
#include "quant.h"

#include <string.h>

#include "quant_blocks.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* clang contracts by default even in ISO mode */
#endif

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

/* Q3_K as Q6_K: a Q3_K weight is d * (s - 32) * v with v in -4..3 and the
 * six-bit s per 16 elements; Q6_K's is d * c * (q - 32) with the signed byte c
 * per 16 elements and q in 0..63, so c = s - 32 and q = v + 32 give the same
 * products (and the same float steps when dequantised: dq_q3_k, dq_q6_k). */
void quant_q3_k_as_q6_k(const void *src, void *dst, int64_t n_blocks) {
    const uint8_t *b = src;
    uint8_t *o = dst;
    for (int64_t i = 0; i < n_blocks; i++, b += 110, o += 210) {
        const uint8_t *hm = b, *q = b + 32, *sb = b + 96;
        uint8_t v6[QK_K];
        for (int e = 0; e < QK_K; e++) {
            const int n = e / 128, k = e % 128 / 32, l = e % 32; /* dq_q3_k's order */
            const int v = ((q[32 * n + l] >> (2 * k)) & 3) - ((hm[l] >> (4 * n + k)) & 1 ? 0 : 4);
            v6[e] = (uint8_t)(v + 32);
        }
        for (int s = 0; s < 16; s++) {
            const int lo = s < 8 ? (sb[s] & 0x0f) : (sb[s - 8] >> 4), hi = (sb[8 + s % 4] >> (2 * (s / 4))) & 3;
            o[192 + s] = (uint8_t)(int8_t)((lo | (hi << 4)) - 32);
        }
        for (int n = 0; n < 2; n++) /* ggml's Q6_K layout: ql[128], qh[64] */
            for (int l = 0; l < 32; l++) {
                const uint8_t *L = v6 + 128 * n + l;
                o[64 * n + l] = (uint8_t)((L[0] & 0x0f) | (L[64] & 0x0f) << 4);
                o[64 * n + l + 32] = (uint8_t)((L[32] & 0x0f) | (L[96] & 0x0f) << 4);
                o[128 + 32 * n + l] = (uint8_t)(L[0] >> 4 | (L[32] >> 4) << 2 | (L[64] >> 4) << 4 | (L[96] >> 4) << 6);
            }
        memcpy(o + 208, b + 108, 2);
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

/* ---- activation formats (engine/cpu/quant_kernels.c describes them) ---------------- */

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
