/* Matrices packed eight rows at a time (engine/quant.h, "eight rows
 * interleaved"): the packing and its kernels, portable, AVX2 and AVX-512. */
#include "engine/quant.h"

#include <math.h>
#include <string.h>

#include "quant_cpu.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* clang contracts by default even in ISO mode */
#endif

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
    const packed_fn *tiles = quant_cpu_avx2() ? packed_tiles(type, quant_cpu_vnni()) : NULL;
    const packed_pair_fn *pairs = quant_cpu_vnni() ? packed_pair_tiles(type) : NULL;
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
