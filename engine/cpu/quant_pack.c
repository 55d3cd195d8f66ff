/* Matrices packed eight rows at a time (engine/quant.h, "eight rows
 * interleaved"): the packing and its kernels, portable, AVX2 and AVX-512. */
#include "engine/quant.h"

#include <math.h>
#include <stdlib.h>
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

static int is_kquant(uint32_t type);
static size_t kq_group_block_bytes(uint32_t type);
static void kq_pack_block(uint32_t type, const uint8_t *x, int r, uint8_t *o);
enum { KQ_MAX_BLOCKS = 256 };

int quant_packable(uint32_t type, int64_t n_rows, int64_t n) {
    if (n_rows <= 0 || n_rows % PACK_ROWS != 0 || n <= 0) return 0;
    if (is_kquant(type)) return n % QK_K == 0 && n / QK_K <= KQ_MAX_BLOCKS;
    return (type == GGML_TYPE_Q4_0 || type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q8_0) && n % QK == 0 &&
           n / QK <= PACK_MAX_BLOCKS;
}

size_t quant_packed_group_bytes(uint32_t type, int64_t n) {
    if (!quant_packable(type, PACK_ROWS, n)) return 0;
    if (is_kquant(type)) return (size_t)(n / QK_K) * kq_group_block_bytes(type);
    return PACK_ROWS * quant_row_bytes(type, (uint64_t)n);
}

void quant_pack_rows(uint32_t type, const void *rows, size_t row_stride, int64_t n_rows, int64_t n, void *dst) {
    if (!quant_packable(type, n_rows, n)) return;
    const uint8_t *src = rows;
    uint8_t *o = dst;
    if (is_kquant(type)) {
        const size_t bb = quant_block_bytes(type), gbb = kq_group_block_bytes(type);
        for (int64_t g = 0; g < n_rows / PACK_ROWS; g++)
            for (int64_t b = 0; b < n / QK_K; b++, o += gbb)
                for (int r = 0; r < PACK_ROWS; r++)
                    kq_pack_block(type, src + (size_t)(PACK_ROWS * g + r) * row_stride + (size_t)b * bb, r, o);
        return;
    }
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

static void pack_prepare(uint32_t type, const uint8_t *acts, size_t as, int64_t n_acts, int64_t nb, void *out) {
    act_block *pre = out;
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
static void packed_scalar(uint32_t type, const uint8_t *g, int64_t nb, const uint8_t *a, const void *pre_v,
                          float *out) {
    const act_block *pre = pre_v;
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
typedef void (*packed_fn)(const uint8_t *g, int64_t nb, const uint8_t *a, size_t as, const void *pre, float *out,
                          size_t os);

#if QUANT_HAVE_AVX2
#define PK_UNROLL _Pragma("GCC unroll 8")

/* One activation (a decode step) reads each weight byte once, so the
 * kernels wait on memory: the bytes STREAM_AHEAD past the block in hand are
 * asked for as it starts. The groups a thread takes lie end to end, so this
 * runs ahead along its one stream. Measured on the 2-core Xeon: Qwen2.5 1.5B
 * Q4_K_M decode about 16 -> 19 tok/s (docs/benchmarks.md); 4 to 16 KB ahead
 * were alike. Prefetches past the end do not fault. */
enum { STREAM_AHEAD = 8192 };

static QUANT_INLINE void stream_prefetch(const uint8_t *block, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)block + STREAM_AHEAD + o, _MM_HINT_T0);
}

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
                                      void *out) {
    act_block *pre = out;
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
        if (A == 1) stream_prefetch(blk, gbb);
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
                                         const void *pre, float *out, size_t os) {                             \
        packed_tile(GGML_TYPE_##T, g, nb, a, as, pre, out, os, A, 0);                                          \
    }                                                                                                          \
    static AVX2_FN void packed_##T##_##A##_vnni(const uint8_t *g, int64_t nb, const uint8_t *a, size_t as,    \
                                                const void *pre, float *out, size_t os) {                      \
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

/* 16 bytes of each of two groups, side by side. */
static QUANT_INLINE AVX2_FN __m256i load2x128(const uint8_t *p0, const uint8_t *p1) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(load128(p0)), load128(p1), 1);
}

static QUANT_INLINE AVX512_FN __m512 halves16(const uint8_t *p0, const uint8_t *p1) {
    return _mm512_cvtph_ps(load2x128(p0, p1));
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
                               const void *pre, float *out, size_t os);

#define PACKED_PAIR(T, A)                                                                                       \
    static AVX512_FN void packed_pair_##T##_##A(const uint8_t *g, size_t gbytes, int64_t nb, const uint8_t *a, \
                                                size_t as, const void *pre, float *out, size_t os) {           \
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

/* ---- K-quants packed ------------------------------------------------------------------
 * Q2_K, Q4_K, Q5_K and Q6_K, eight rows per 256-element super-block, the quants
 * interleaved four bytes at a time as above and the scales unpacked to bytes,
 * so that a super-block's integer sum is exact per row:
 *     isum = sum over sub-blocks s of sc[s] * (off[s] + sum_e u_e * y_e)
 *     msum = sum over s of mn[s] * (sum of y over sub-block s)     (Q4_K, Q5_K)
 * with u the unsigned quants (Q6_K's q + 32, off[s] = -32 * sum of y over s;
 * off = 0 for the others), then acc = fma(dx * dy, isum, acc) and, with
 * mins, acc = fma(-(mx * dy), msum, acc). Q5_K and Q6_K instead sum
 * sc[s] * (...) as fsum = fma(float sub-block sum, float sc[s], fsum) in
 * sub-block order and take fsum for isum: Q6_K's sixteen scales per
 * super-block made the integer multiply (two uops on the port vpdpbusd needs)
 * cost about a fifth of the kernel, Q5_K's eight less but still some; convert
 * + fma is cheaper (each product sc[s] * sub is under 2^24, exact in float). Q4_K
 * keeps the integer sum. Q2_K (a 4-bit scale and a 4-bit min per 16
 * elements) takes the float sum too: its scaled sums stay below 2^24 in every
 * order (16 * 3 * 127 * 15 per sub-block), so the float sum is the integer
 * one, bit for bit. Group super-block layout:
 *   Q4_K: d[8] dmin[8] (halves), sc[8 sub][8 rows], mn[4 pairs][8 rows][2],
 *         qs chunks (32 x 32 bytes: chunk c = bytes 4c..4c+3 of each row)
 *   Q5_K: as Q4_K with qh chunks (8 x 32) before qs
 *   Q6_K: d[8], sc[16 sub][8 rows] (signed), ql chunks (32 x 32), qh chunks (16 x 32)
 *   Q2_K: d[8] dmin[8], the scale bytes (min << 4 | scale) [8 pairs][8 rows][2],
 *         qs chunks (16 x 32: chunk c = bytes 4c..4c+3 of each row's qs; the
 *         quants of element 128n + 32j + l at bits 2j of byte 32n + l)
 * Q4_K and Q5_K take 32 bytes more per group super-block than the rows (the
 * 6-bit scales as bytes); Q6_K and Q2_K exactly the rows' bytes. */

enum { KQ_MN = 96, KQ4_QS = 160, KQ5_QH = 160, KQ5_QS = 416, KQ6_SC = 16, KQ6_QL = 144, KQ6_QH = 1168 };
enum { KQ2_SC = 32, KQ2_QS = 160 };
enum { KQ_PRE = 512 }; /* prepared activation super-blocks per chunk */

static int is_kquant(uint32_t type) {
    return type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K;
}

/* Bytes of one group super-block. */
static size_t kq_group_block_bytes(uint32_t type) {
    switch (type) {
    case GGML_TYPE_Q2_K: return 672;
    case GGML_TYPE_Q4_K: return 1184;
    case GGML_TYPE_Q5_K: return 1440;
    default: return 1680;
    }
}

/* Sub-blocks per super-block and 4-byte chunks per sub-block. */
static int kq_subs(uint32_t type) {
    return type == GGML_TYPE_Q6_K || type == GGML_TYPE_Q2_K ? 16 : 8;
}

static void kq_pack_block(uint32_t type, const uint8_t *x, int r, uint8_t *o) {
    if (type == GGML_TYPE_Q2_K) {
        memcpy(o + 2 * r, x + 80, 2);
        memcpy(o + 16 + 2 * r, x + 82, 2);
        for (int s = 0; s < 16; s++) o[KQ2_SC + 16 * (s / 2) + 2 * r + s % 2] = x[s];
        for (int c = 0; c < 16; c++) memcpy(o + KQ2_QS + 32 * c + 4 * r, x + 16 + 4 * c, 4);
        return;
    }
    if (type == GGML_TYPE_Q6_K) {
        memcpy(o + 2 * r, x + 208, 2);
        for (int s = 0; s < 16; s++) o[KQ6_SC + 8 * s + r] = x[192 + s];
        for (int c = 0; c < 32; c++) memcpy(o + KQ6_QL + 32 * c + 4 * r, x + 4 * c, 4);
        for (int c = 0; c < 16; c++) memcpy(o + KQ6_QH + 32 * c + 4 * r, x + 128 + 4 * c, 4);
        return;
    }
    memcpy(o + 2 * r, x, 2);
    memcpy(o + 16 + 2 * r, x + 2, 2);
    for (int s = 0; s < 8; s++) {
        uint8_t sc, mn;
        scale_min_k4(s, x + 4, &sc, &mn);
        o[32 + 8 * s + r] = sc;
        o[KQ_MN + 16 * (s / 2) + 2 * r + s % 2] = mn;
    }
    const int q5 = type == GGML_TYPE_Q5_K;
    const uint8_t *qs = x + (q5 ? 48 : 16);
    uint8_t *oq = o + (q5 ? KQ5_QS : KQ4_QS);
    for (int c = 0; c < 32; c++) memcpy(oq + 32 * c + 4 * r, qs + 4 * c, 4);
    if (q5)
        for (int c = 0; c < 8; c++) memcpy(o + KQ5_QH + 32 * c + 4 * r, x + 16 + 4 * c, 4);
}

/* The unsigned quant of element e (0..255) of row r in a group super-block. */
static int kq_quant(uint32_t type, const uint8_t *blk, int r, int e) {
    if (type == GGML_TYPE_Q2_K) {
        const int L = 32 * (e / 128) + e % 32;
        return (blk[KQ2_QS + 32 * (L / 4) + 4 * r + L % 4] >> (2 * (e % 128 / 32))) & 3;
    }
    if (type == GGML_TYPE_Q6_K) {
        const int n = e / 128, k = e % 128 / 32, l = e % 32;
        const int L = 64 * n + (k & 1) * 32 + l, H = 32 * n + l;
        const int lo = (blk[KQ6_QL + 32 * (L / 4) + 4 * r + L % 4] >> (4 * (k >> 1))) & 0x0f;
        return lo | (((blk[KQ6_QH + 32 * (H / 4) + 4 * r + H % 4] >> (2 * k)) & 3) << 4);
    }
    const int j = e / 64, h = e % 64 / 32, l = e % 32, q5 = type == GGML_TYPE_Q5_K;
    const int L = 32 * j + l;
    int u = (blk[(q5 ? KQ5_QS : KQ4_QS) + 32 * (L / 4) + 4 * r + L % 4] >> (4 * h)) & 0x0f;
    if (q5) u |= ((blk[KQ5_QH + 32 * (l / 4) + 4 * r + l % 4] >> (e / 32)) & 1) << 4;
    return u;
}

/* Activation super-block (t, b) as the K kernels read it: dy, the pairs of
 * sub-block sums for the mins (Q4_K, Q5_K: low half sum of sub-block 2p, high
 * half 2p+1; Q2_K's bpair: the same for its 16-element sub-blocks, Q8_K's
 * bsums as they are) and Q6_K's offsets -32 * sum of each 16-element sub-block. */
typedef struct kact_block {
    float d;
    int32_t mpair[4];
    int32_t off[16];
    int32_t bpair[8];
    int32_t pad[3];
} kact_block;

static void kq_prepare(uint32_t type, const uint8_t *acts, size_t as, int64_t n_acts, int64_t nb, void *out) {
    (void)type; /* one preparation serves Q4_K, Q5_K and Q6_K */
    kact_block *pre = out;
    for (int64_t t = 0; t < n_acts; t++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *y = acts + (size_t)t * as + (size_t)b * Q8_K_BYTES;
            kact_block *p = pre + t * nb + b;
            memset(p, 0, sizeof *p);
            p->d = q8k_d(y);
            for (int s = 0; s < 16; s++) p->off[s] = -32 * q8k_bsum(y, s);
            for (int k = 0; k < 4; k++) {
                const int lo = q8k_bsum(y, 4 * k) + q8k_bsum(y, 4 * k + 1);
                const int hi = q8k_bsum(y, 4 * k + 2) + q8k_bsum(y, 4 * k + 3);
                p->mpair[k] = (int32_t)(((uint32_t)(uint16_t)hi << 16) | (uint16_t)lo);
            }
            for (int k = 0; k < 8; k++)
                p->bpair[k] = (int32_t)(((uint32_t)(uint16_t)q8k_bsum(y, 2 * k + 1) << 16) |
                                        (uint16_t)q8k_bsum(y, 2 * k));
        }
}

/* One group against one activation, the arithmetic above. */
static void kq_scalar(uint32_t type, const uint8_t *g, int64_t nb, const uint8_t *a, const void *pre_v,
                      float *out) {
    const kact_block *pre = pre_v;
    const size_t gbb = kq_group_block_bytes(type);
    const int subs = kq_subs(type), len = QK_K / subs, q6 = type == GGML_TYPE_Q6_K, q2 = type == GGML_TYPE_Q2_K;
    const int fsc = type != GGML_TYPE_Q4_K; /* scales applied in float (Q2_K, Q5_K, Q6_K) */
    float acc[PACK_ROWS] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * gbb;
        const int8_t *y = (const int8_t *)(a + (size_t)b * Q8_K_BYTES + 4);
        const kact_block *p = pre + b;
        for (int r = 0; r < PACK_ROWS; r++) {
            int32_t isum = 0, msum = 0;
            float fsum = 0.0f; /* Q5_K, Q6_K: the scaled sub-block sums in float */
            for (int s = 0; s < subs; s++) {
                int32_t sub = q6 ? p->off[s] : 0;
                for (int e = s * len; e < (s + 1) * len; e++) sub += kq_quant(type, blk, r, e) * y[e];
                const int sb = q2 ? blk[KQ2_SC + 16 * (s / 2) + 2 * r + s % 2] : 0; /* Q2_K: min << 4 | scale */
                const int sc = q6 ? (int8_t)blk[KQ6_SC + 8 * s + r] : q2 ? sb & 15 : blk[32 + 8 * s + r];
                if (fsc) fsum = fmaf((float)sub, (float)sc, fsum);
                else isum += sc * sub;
                if (q2) {
                    msum += (sb >> 4) * (int16_t)(uint16_t)((uint32_t)p->bpair[s / 2] >> (16 * (s % 2)));
                } else if (!q6) {
                    const int16_t ys = (int16_t)(uint16_t)((uint32_t)p->mpair[s / 2] >> (16 * (s % 2)));
                    msum += blk[KQ_MN + 16 * (s / 2) + 2 * r + s % 2] * ys;
                }
            }
            acc[r] = fmaf(half_at(blk + 2 * r) * p->d, fsc ? fsum : (float)isum, acc[r]);
            if (!q6) acc[r] = fmaf(-(half_at(blk + 16 + 2 * r) * p->d), (float)msum, acc[r]);
        }
    }
    memcpy(out, acc, sizeof acc);
}

#if QUANT_HAVE_AVX2
#define KQ_UNROLL _Pragma("GCC unroll 16")

static QUANT_INLINE AVX2_FN __m128i load64(const uint8_t *p) {
    return _mm_loadl_epi64((const __m128i *)(const void *)p);
}

/* The unsigned quants of elements len*s + 4c .. +3 of the eight rows (a
 * K-quant group super-block), lanes in row order; q/qh: the 32-byte chunks
 * that hold them (Q4_K: qh unused). s and c are constants once unrolled. */
static QUANT_INLINE AVX2_FN __m256i kq_u256(const uint32_t type, __m256i v, __m256i h, const int s, const int c) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (type == GGML_TYPE_Q2_K) {
        const int j = s % 8 / 2; /* the bit pair */
        return _mm256_and_si256(j ? _mm256_srli_epi16(v, 2 * j) : v, _mm256_set1_epi8(0x03));
    }
    if (type == GGML_TYPE_Q6_K) {
        const int k = (16 * s + 4 * c) % 128 / 32;
        v = _mm256_and_si256(k >> 1 ? _mm256_srli_epi16(v, 4) : v, m4);
        h = k == 3 ? _mm256_srli_epi16(h, 2) : _mm256_slli_epi16(h, 4 - 2 * k);
        return _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(0x30)));
    }
    v = _mm256_and_si256(s % 2 ? _mm256_srli_epi16(v, 4) : v, m4);
    if (type == GGML_TYPE_Q4_K) return v;
    h = s <= 4 ? _mm256_slli_epi16(h, 4 - s) : _mm256_srli_epi16(h, s - 4);
    return _mm256_or_si256(v, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
}

/* Offsets (in a group super-block) of the chunks kq_u256 reads (h: Q5_K and
 * Q6_K only). */
static QUANT_INLINE int kq_has_h(const uint32_t type) {
    return type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K;
}

static QUANT_INLINE size_t kq_q_at(const uint32_t type, const int s, const int c) {
    if (type == GGML_TYPE_Q2_K) return KQ2_QS + 32 * (size_t)(8 * (s / 8) + 4 * (s % 2) + c);
    if (type == GGML_TYPE_Q6_K) {
        const int e = 16 * s + 4 * c, n = e / 128, k = e % 128 / 32, l = e % 32;
        return KQ6_QL + 8 * (size_t)(64 * n + (k & 1) * 32 + l);
    }
    return (type == GGML_TYPE_Q5_K ? KQ5_QS : KQ4_QS) + 32 * (size_t)(8 * (s / 2) + c);
}

static QUANT_INLINE size_t kq_h_at(const uint32_t type, const int s, const int c) {
    if (type == GGML_TYPE_Q6_K) {
        const int e = 16 * s + 4 * c;
        return KQ6_QH + 8 * (size_t)(32 * (e / 128) + e % 32);
    }
    return KQ5_QH + 32 * (size_t)c;
}

static QUANT_INLINE AVX2_FN void kq_tile(const uint32_t type, const uint8_t *g, int64_t nb, const uint8_t *a,
                                         size_t as, const kact_block *pre, float *out, size_t os, const int A,
                                         const int vnni) {
    const int q6 = type == GGML_TYPE_Q6_K, q2 = type == GGML_TYPE_Q2_K, subs = kq_subs(type), len = QK_K / subs;
    const int fsc = type != GGML_TYPE_Q4_K; /* scales applied in float (Q2_K, Q5_K, Q6_K) */
    const size_t gbb = kq_group_block_bytes(type);
    __m256 acc[4];
    KQ_UNROLL for (int t = 0; t < A; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = g + (size_t)b * gbb, *y = a + (size_t)b * Q8_K_BYTES + 4;
        if (A == 1) stream_prefetch(blk, gbb);
        __m256i isum[4];
        __m256 fsum[4];
        KQ_UNROLL for (int t = 0; t < A; t++) isum[t] = _mm256_setzero_si256(), fsum[t] = _mm256_setzero_ps();
        KQ_UNROLL for (int s = 0; s < subs; s++) {
            __m256i iv[4];
            KQ_UNROLL for (int t = 0; t < A; t++)
                iv[t] = q6 ? _mm256_set1_epi32(pre[(size_t)t * (size_t)nb + b].off[s]) : _mm256_setzero_si256();
            KQ_UNROLL for (int c = 0; c < len / 4; c++) {
                const __m256i h = kq_has_h(type) ? load256(blk + kq_h_at(type, s, c)) : _mm256_setzero_si256();
                const __m256i u = kq_u256(type, load256(blk + kq_q_at(type, s, c)), h, s, c);
                KQ_UNROLL for (int t = 0; t < A; t++)
                    iv[t] = pk_dot(iv[t], u, y + (size_t)t * as + len * s + 4 * c, 0, vnni);
            }
            if (q2) {
                const __m256i sb = _mm256_cvtepu16_epi32(load128(blk + KQ2_SC + 16 * (s / 2))); /* the pair's bytes */
                const __m256i sc4 = _mm256_and_si256(s % 2 ? _mm256_srli_epi32(sb, 8) : sb, _mm256_set1_epi32(15));
                const __m256 sc = _mm256_cvtepi32_ps(sc4);
                KQ_UNROLL for (int t = 0; t < A; t++) fsum[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv[t]), sc, fsum[t]);
            } else if (fsc) {
                const __m128i sc8 = load64(blk + (q6 ? KQ6_SC : 32) + 8 * s);
                const __m256 sc = _mm256_cvtepi32_ps(q6 ? _mm256_cvtepi8_epi32(sc8) : _mm256_cvtepu8_epi32(sc8));
                KQ_UNROLL for (int t = 0; t < A; t++) fsum[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv[t]), sc, fsum[t]);
            } else {
                const __m256i sc = _mm256_cvtepu8_epi32(load64(blk + 32 + 8 * s));
                KQ_UNROLL for (int t = 0; t < A; t++) isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(iv[t], sc));
            }
        }
        const __m256 dx = _mm256_cvtph_ps(load128(blk));
        KQ_UNROLL for (int t = 0; t < A; t++) {
            const kact_block *p = pre + (size_t)t * (size_t)nb + b;
            const __m256 dy = _mm256_set1_ps(p->d);
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), fsc ? fsum[t] : _mm256_cvtepi32_ps(isum[t]), acc[t]);
            if (q2) {
                __m256i m = _mm256_setzero_si256();
                KQ_UNROLL for (int k = 0; k < 8; k++) {
                    const __m256i mn = _mm256_srli_epi16(_mm256_cvtepu8_epi16(load128(blk + KQ2_SC + 16 * k)), 4);
                    m = _mm256_add_epi32(m, _mm256_madd_epi16(mn, _mm256_set1_epi32(p->bpair[k])));
                }
                const __m256 mx = _mm256_cvtph_ps(load128(blk + 16));
                acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(mx, dy), _mm256_cvtepi32_ps(m), acc[t]);
            } else if (!q6) {
                __m256i m = _mm256_setzero_si256();
                KQ_UNROLL for (int k = 0; k < 4; k++)
                    m = _mm256_add_epi32(m, _mm256_madd_epi16(_mm256_cvtepu8_epi16(load128(blk + KQ_MN + 16 * k)),
                                                              _mm256_set1_epi32(p->mpair[k])));
                const __m256 mx = _mm256_cvtph_ps(load128(blk + 16));
                acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(mx, dy), _mm256_cvtepi32_ps(m), acc[t]);
            }
        }
    }
    KQ_UNROLL for (int t = 0; t < A; t++) _mm256_storeu_ps(out + (size_t)t * os, acc[t]);
}

/* kq_prepare's values for one activation super-block, with the sums in vectors. */
static QUANT_INLINE AVX2_FN void kq_prepare_block_avx2(const uint8_t *y, kact_block *p) {
    p->d = q8k_d(y);
    const __m256i s16 = load256(y + 4 + QK_K); /* the 16 sums of 16 */
    const __m256i s32 = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s16));
    const __m256i s32h = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(s16, 1));
    _mm256_storeu_si256((__m256i *)(void *)p->off, _mm256_mullo_epi32(s32, _mm256_set1_epi32(-32)));
    _mm256_storeu_si256((__m256i *)(void *)(p->off + 8), _mm256_mullo_epi32(s32h, _mm256_set1_epi32(-32)));
    /* sums of pairs (16-bit, exact: at most 32 * 128) */
    const __m256i pairs = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    const __m256i packed = _mm256_packs_epi32(pairs, pairs); /* per 128-bit lane: 4 sums twice */
    p->mpair[0] = _mm256_extract_epi32(packed, 0);
    p->mpair[1] = _mm256_extract_epi32(packed, 1);
    p->mpair[2] = _mm256_extract_epi32(packed, 4);
    p->mpair[3] = _mm256_extract_epi32(packed, 5);
    _mm256_storeu_si256((__m256i *)(void *)p->bpair, s16); /* Q8_K's bsums, two per word */
    p->pad[0] = p->pad[1] = p->pad[2] = 0;
}

/* kq_prepare with the sums in vectors: the same values. */
static AVX2_FN void kq_prepare_avx2(uint32_t type, const uint8_t *acts, size_t as, int64_t n_acts, int64_t nb,
                                    void *out) {
    (void)type;
    kact_block *pre = out;
    for (int64_t t = 0; t < n_acts; t++)
        for (int64_t b = 0; b < nb; b++)
            kq_prepare_block_avx2(acts + (size_t)t * as + (size_t)b * Q8_K_BYTES, pre + t * nb + b);
}

/* The pair kernels' activations, eight at a time ("lanes"): for lane group l
 * (activations 8l..8l+7) and super-block b, the 64 four-byte words of the
 * quants with the eight activations' words side by side, and their prepared
 * blocks side by side. Every word a kernel reads is then at a fixed
 * displacement from one pointer per super-block; with a row stride per
 * activation the compiler kept 512 offsets on the stack and loaded one for
 * each vpdpbusd (measured 10-20 % slower). */
enum { KQ_LANES = 8, KQ_LANE_BLOCK = QK_K * KQ_LANES };

static AVX2_FN void kq_prepare_lanes(const uint8_t *acts, size_t as, int64_t n_acts, int64_t nb, kact_block *pre,
                                     uint8_t *qs) {
    for (int64_t t = 0; t < n_acts; t++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t lb = t / KQ_LANES * nb + b; /* the lane group's super-block */
            const int slot = (int)(t % KQ_LANES);
            const uint8_t *y = acts + (size_t)t * as + (size_t)b * Q8_K_BYTES;
            kq_prepare_block_avx2(y, pre + (size_t)lb * KQ_LANES + slot);
            uint8_t *q = qs + (size_t)lb * KQ_LANE_BLOCK + 4 * (size_t)slot;
            for (int w = 0; w < QK_K / 4; w++) memcpy(q + 4 * KQ_LANES * w, y + 4 + 4 * w, 4);
        }
}

/* kq_u256 for two groups in one 512-bit register. */
static QUANT_INLINE AVX512_FN __m512i kq_u512(const uint32_t type, __m512i v, __m512i h, const int s, const int c) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    if (type == GGML_TYPE_Q2_K) {
        const int j = s % 8 / 2;
        return _mm512_and_si512(j ? _mm512_srli_epi16(v, 2 * j) : v, _mm512_set1_epi8(0x03));
    }
    if (type == GGML_TYPE_Q6_K) {
        const int k = (16 * s + 4 * c) % 128 / 32;
        v = _mm512_and_si512(k >> 1 ? _mm512_srli_epi16(v, 4) : v, m4);
        h = k == 3 ? _mm512_srli_epi16(h, 2) : _mm512_slli_epi16(h, 4 - 2 * k);
        return _mm512_or_si512(v, _mm512_and_si512(h, _mm512_set1_epi8(0x30)));
    }
    v = _mm512_and_si512(s % 2 ? _mm512_srli_epi16(v, 4) : v, m4);
    if (type == GGML_TYPE_Q4_K) return v;
    h = s <= 4 ? _mm512_slli_epi16(h, 4 - s) : _mm512_srli_epi16(h, s - 4);
    return _mm512_or_si512(v, _mm512_and_si512(h, _mm512_set1_epi8(0x10)));
}

/* Two neighbouring groups against A activations of one lane group (q and pre
 * at the first one's slot), as packed_pair_tile: the same integer sums and
 * float operations per lane as kq_tile. gbytes 0 takes group g twice and
 * `keep` 0x00ff stores only its eight outputs (a last group without a pair). */
static QUANT_INLINE AVX512_FN void kq_pair_tile(const uint32_t type, const uint8_t *g, size_t gbytes, int64_t nb,
                                                const uint8_t *q, const kact_block *pre, float *out, size_t os,
                                                __mmask16 keep, const int A) {
    const int q6 = type == GGML_TYPE_Q6_K, q2 = type == GGML_TYPE_Q2_K, subs = kq_subs(type), len = QK_K / subs;
    const int fsc = type != GGML_TYPE_Q4_K; /* scales applied in float (Q2_K, Q5_K, Q6_K) */
    const size_t gbb = kq_group_block_bytes(type);
    __m512 acc[8];
    KQ_UNROLL for (int t = 0; t < A; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g + (size_t)b * gbb, *b1 = b0 + gbytes, *y = q + (size_t)b * KQ_LANE_BLOCK;
        const kact_block *pb = pre + (size_t)b * KQ_LANES;
        __m512i isum[8];
        __m512 fsum[8];
        KQ_UNROLL for (int t = 0; t < A; t++) isum[t] = _mm512_setzero_si512(), fsum[t] = _mm512_setzero_ps();
        KQ_UNROLL for (int s = 0; s < subs; s++) {
            __m512i iv[8];
            KQ_UNROLL for (int t = 0; t < A; t++)
                iv[t] = q6 ? _mm512_set1_epi32(pb[t].off[s]) : _mm512_setzero_si512();
            KQ_UNROLL for (int c = 0; c < len / 4; c++) {
                const size_t qa = kq_q_at(type, s, c), ha = kq_h_at(type, s, c);
                const __m512i h = kq_has_h(type) ? load2x256(b0 + ha, b1 + ha) : _mm512_setzero_si512();
                const __m512i u = kq_u512(type, load2x256(b0 + qa, b1 + qa), h, s, c);
                const uint8_t *w = y + 4 * KQ_LANES * (len / 4 * s + c); /* the word of quants 4w..4w+3 */
                KQ_UNROLL for (int t = 0; t < A; t++) iv[t] = pk_dot16(iv[t], u, w + 4 * t);
            }
            const size_t so = (q6 ? KQ6_SC : 32) + 8 * (size_t)s;
            const __m128i sc8 = _mm_unpacklo_epi64(load64(b0 + so), load64(b1 + so));
            if (q2) {
                const size_t po = KQ2_SC + 16 * (size_t)(s / 2); /* the pair's bytes */
                const __m512i sb = _mm512_cvtepu16_epi32(load2x128(b0 + po, b1 + po));
                const __m512 sc = _mm512_cvtepi32_ps(
                    _mm512_and_si512(s % 2 ? _mm512_srli_epi32(sb, 8) : sb, _mm512_set1_epi32(15)));
                KQ_UNROLL for (int t = 0; t < A; t++) fsum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv[t]), sc, fsum[t]);
            } else if (fsc) {
                const __m512 sc = _mm512_cvtepi32_ps(q6 ? _mm512_cvtepi8_epi32(sc8) : _mm512_cvtepu8_epi32(sc8));
                KQ_UNROLL for (int t = 0; t < A; t++) fsum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iv[t]), sc, fsum[t]);
            } else {
                const __m512i sc = _mm512_cvtepu8_epi32(sc8);
                KQ_UNROLL for (int t = 0; t < A; t++) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(iv[t], sc));
            }
        }
        const __m512 dx = halves16(b0, b1);
        KQ_UNROLL for (int t = 0; t < A; t++) {
            const kact_block *p = pb + t;
            const __m512 dy = _mm512_set1_ps(p->d);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dx, dy), fsc ? fsum[t] : _mm512_cvtepi32_ps(isum[t]), acc[t]);
            if (q2) {
                __m512i m = _mm512_setzero_si512();
                KQ_UNROLL for (int k = 0; k < 8; k++) {
                    const size_t po = KQ2_SC + 16 * (size_t)k;
                    const __m512i mn = _mm512_srli_epi16(_mm512_cvtepu8_epi16(load2x128(b0 + po, b1 + po)), 4);
                    m = _mm512_add_epi32(m, _mm512_madd_epi16(mn, _mm512_set1_epi32(p->bpair[k])));
                }
                acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(halves16(b0 + 16, b1 + 16), dy), _mm512_cvtepi32_ps(m), acc[t]);
            } else if (!q6) {
                __m512i m = _mm512_setzero_si512();
                KQ_UNROLL for (int k = 0; k < 4; k++) {
                    const __m256i mn = load2x128(b0 + KQ_MN + 16 * k, b1 + KQ_MN + 16 * k);
                    m = _mm512_add_epi32(m, _mm512_madd_epi16(_mm512_cvtepu8_epi16(mn), _mm512_set1_epi32(p->mpair[k])));
                }
                acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(halves16(b0 + 16, b1 + 16), dy), _mm512_cvtepi32_ps(m), acc[t]);
            }
        }
    }
    KQ_UNROLL for (int t = 0; t < A; t++) _mm512_mask_storeu_ps(out + (size_t)t * os, keep, acc[t]);
}

#define KQ_TILE(T, A)                                                                                             \
    static AVX2_FN void kq_##T##_##A(const uint8_t *g, int64_t nb, const uint8_t *a, size_t as, const void *p,     \
                                     float *o, size_t os) {                                                        \
        kq_tile(GGML_TYPE_##T, g, nb, a, as, p, o, os, A, 0);                                                      \
    }                                                                                                              \
    static AVX2_FN void kq_##T##_##A##_vnni(const uint8_t *g, int64_t nb, const uint8_t *a, size_t as,            \
                                            const void *p, float *o, size_t os) {                                  \
        kq_tile(GGML_TYPE_##T, g, nb, a, as, p, o, os, A, 1);                                                      \
    }
#define KQ_PAIR(T, A)                                                                                             \
    static AVX512_FN void kq_pair_##T##_##A(const uint8_t *g, size_t gb, int64_t nb, const uint8_t *q,            \
                                            const kact_block *p, float *o, size_t os, __mmask16 keep) {            \
        kq_pair_tile(GGML_TYPE_##T, g, gb, nb, q, p, o, os, keep, A);                                              \
    }
#define KQ_TILES(T) KQ_TILE(T, 1) KQ_TILE(T, 2) KQ_TILE(T, 4) KQ_PAIR(T, 1) KQ_PAIR(T, 2) KQ_PAIR(T, 4) KQ_PAIR(T, 8)
KQ_TILES(Q2_K)
KQ_TILES(Q4_K)
KQ_TILES(Q5_K)
KQ_TILES(Q6_K)
#undef KQ_TILES
#undef KQ_PAIR
#undef KQ_TILE
#undef KQ_UNROLL

/* The 256-bit kernels for 1, 2 and 4 activations, the pair kernels for 1, 2, 4 and 8. */
static const packed_fn *kq_tiles(uint32_t type, int vnni) {
#define SET(T) {kq_##T##_1, kq_##T##_2, kq_##T##_4}
#define SETV(T) {kq_##T##_1_vnni, kq_##T##_2_vnni, kq_##T##_4_vnni}
    static const packed_fn q2[3] = SET(Q2_K), q4[3] = SET(Q4_K), q5[3] = SET(Q5_K), q6[3] = SET(Q6_K);
    static const packed_fn q2v[3] = SETV(Q2_K), q4v[3] = SETV(Q4_K), q5v[3] = SETV(Q5_K), q6v[3] = SETV(Q6_K);
#undef SET
#undef SETV
    switch (type) {
    case GGML_TYPE_Q2_K: return vnni ? q2v : q2;
    case GGML_TYPE_Q4_K: return vnni ? q4v : q4;
    case GGML_TYPE_Q5_K: return vnni ? q5v : q5;
    default: return vnni ? q6v : q6;
    }
}

/* Two groups against A activations of a lane group; gbytes: one group's bytes. */
typedef void (*kq_pair_fn)(const uint8_t *g, size_t gbytes, int64_t nb, const uint8_t *q, const kact_block *pre,
                           float *out, size_t os, __mmask16 keep);

static const kq_pair_fn *kq_pair_tiles(uint32_t type) {
#define SET(T) {kq_pair_##T##_1, kq_pair_##T##_2, kq_pair_##T##_4, kq_pair_##T##_8}
    static const kq_pair_fn q2[4] = SET(Q2_K), q4[4] = SET(Q4_K), q5[4] = SET(Q5_K), q6[4] = SET(Q6_K);
#undef SET
    switch (type) {
    case GGML_TYPE_Q2_K: return q2;
    case GGML_TYPE_Q4_K: return q4;
    case GGML_TYPE_Q5_K: return q5;
    default: return q6;
    }
}

/* K-quants with AVX512-VNNI and more than one activation: the activations in
 * lanes (kq_prepare_lanes), taken in windows of whole lane groups, every pair
 * of groups against a window in tiles of 8, 4, 2 and 1. A window holds up to
 * KQ_LANE_CHUNK_BYTES of lane data (in L2 while the weights pass): every
 * window streams all the weights again, so small windows made prefill wait
 * on memory (16 KB measured 15 % slower). */
enum { KQ_LANE_CHUNK_BYTES = 1 << 20 };

/* One activation's lane data. */
static size_t kq_lane_bytes(int64_t nb) {
    return (size_t)nb * (QK_K + sizeof(kact_block));
}

/* Activations per window: whole lane groups, at least one. */
static int64_t kq_lane_window(int64_t nb) {
    const int64_t w = (int64_t)(KQ_LANE_CHUNK_BYTES / kq_lane_bytes(nb)) & ~(int64_t)(KQ_LANES - 1);
    return w < KQ_LANES ? KQ_LANES : w;
}

/* Lanes of n_acts activations: the prepared blocks of every lane group, then
 * their quant words. */
static void kq_lanes_at(const void *lanes, int64_t n_acts, int64_t nb, const kact_block **pre, const uint8_t **qs) {
    const int64_t lg = (n_acts + KQ_LANES - 1) / KQ_LANES;
    *pre = lanes;
    *qs = (const uint8_t *)lanes + (size_t)lg * (size_t)nb * KQ_LANES * sizeof(kact_block);
}

/* Activations [0, n_acts) of laid-out lanes against n_groups groups, window by window. */
static void kq_lanes_product(uint32_t type, const uint8_t *w, int64_t n_groups, int64_t nb, const kact_block *pre,
                             const uint8_t *qs, int64_t n_acts, float *out, size_t os) {
    const kq_pair_fn *pairs = kq_pair_tiles(type);
    const size_t gbytes = (size_t)nb * kq_group_block_bytes(type);
    const int64_t window = kq_lane_window(nb);
    for (int64_t t0 = 0; t0 < n_acts; t0 += window) {
        const int64_t na = n_acts - t0 < window ? n_acts - t0 : window;
        for (int64_t g = 0; g < n_groups; g += 2) {
            const int pair = g + 1 < n_groups;
            const uint8_t *gw = w + (size_t)g * gbytes;
            for (int64_t t = t0; t < t0 + na;) {
                const int64_t left = t0 + na - t;
                const int ti = left >= 8 ? 3 : left >= 4 ? 2 : left >= 2 ? 1 : 0; /* a tile of 1 << ti */
                const int64_t lb = t / KQ_LANES * nb;
                const int slot = (int)(t % KQ_LANES);
                pairs[ti](gw, pair ? gbytes : 0, nb, qs + (size_t)lb * KQ_LANE_BLOCK + 4 * (size_t)slot,
                          pre + (size_t)lb * KQ_LANES + slot, out + (size_t)t * os + (size_t)g * PACK_ROWS, os,
                          pair ? 0xffff : 0x00ff);
                t += 1 << ti;
            }
        }
    }
}

/* quant_matmul_packed's lanes: a window at a time in a buffer of its own.
 * Returns 0 without memory for it (then the caller takes the 256-bit tiles). */
static int run_kq_lanes(uint32_t type, const uint8_t *w, int64_t n_groups, int64_t nb, const uint8_t *a, size_t as,
                        int64_t n_acts, float *out, size_t os) {
    int64_t window = kq_lane_window(nb);
    if (window > n_acts) window = (n_acts + KQ_LANES - 1) & ~(int64_t)(KQ_LANES - 1);
    void *buf = malloc((size_t)window * kq_lane_bytes(nb));
    if (!buf) return 0;
    const kact_block *pre;
    const uint8_t *qs;
    kq_lanes_at(buf, window, nb, &pre, &qs);
    for (int64_t t0 = 0; t0 < n_acts; t0 += window) {
        const int64_t na = n_acts - t0 < window ? n_acts - t0 : window;
        kq_prepare_lanes(a + (size_t)t0 * as, as, na, nb, (kact_block *)pre, (uint8_t *)qs);
        kq_lanes_product(type, w, n_groups, nb, pre, qs, na, out + (size_t)t0 * os, os);
    }
    free(buf);
    return 1;
}
#endif


/* What a packed product needs of its type: the prepared activation block
 * (pre_bytes each) and the kernels (tiles: 1, 2 and 4 activations, NULL for
 * the scalar path; pairs: 1, 2, 4 and 8, NULL without AVX512-VNNI and for
 * K-quants, whose pair kernels read lanes: run_kq_lanes). */
typedef struct packed_kernels {
    size_t pre_bytes;
    void (*prepare)(uint32_t type, const uint8_t *acts, size_t as, int64_t n_acts, int64_t nb, void *pre);
    void (*scalar)(uint32_t type, const uint8_t *g, int64_t nb, const uint8_t *a, const void *pre, float *out);
#if QUANT_HAVE_AVX2
    const packed_fn *tiles;
    const packed_pair_fn *pairs;
#endif
} packed_kernels;

/* The activations in chunks of `chunk` rows, each prepared once, then every
 * group (two at a time with the pair kernels) against the chunk in tiles. */
static void run_packed(uint32_t type, const packed_kernels *k, const uint8_t *w, size_t gbytes, int64_t n_groups,
                       int64_t nb, const uint8_t *a, size_t as, int64_t n_acts, int64_t chunk, void *pre, float *out,
                       size_t os) {
    const uint8_t *pb = pre;
    const size_t pt = (size_t)nb * k->pre_bytes; /* one activation's prepared blocks */
    for (int64_t t0 = 0; t0 < n_acts; t0 += chunk) {
        const int64_t na = n_acts - t0 < chunk ? n_acts - t0 : chunk;
        const uint8_t *ac = a + (size_t)t0 * as;
        float *oc = out + (size_t)t0 * os;
        k->prepare(type, ac, as, na, nb, pre);
        for (int64_t g = 0; g < n_groups; g++) {
            const uint8_t *gw = w + (size_t)g * gbytes;
            float *og = oc + (size_t)g * PACK_ROWS;
#if QUANT_HAVE_AVX2
            /* this group and the next; one activation (a single decode
             * stream) keeps the 256-bit kernel, measured 13 % faster there */
            if (k->pairs && na > 1 && g + 1 < n_groups) {
                int64_t t = 0;
                for (; t + 8 <= na; t += 8)
                    k->pairs[3](gw, gbytes, nb, ac + (size_t)t * as, as, pb + (size_t)t * pt, og + (size_t)t * os, os);
                for (int b = 2; b >= 0; b--)
                    if ((na - t) & (1 << b)) {
                        k->pairs[b](gw, gbytes, nb, ac + (size_t)t * as, as, pb + (size_t)t * pt, og + (size_t)t * os,
                                    os);
                        t += 1 << b;
                    }
                g++;
                continue;
            }
            if (k->tiles) {
                int64_t t = 0;
                for (; t + 4 <= na; t += 4)
                    k->tiles[2](gw, nb, ac + (size_t)t * as, as, pb + (size_t)t * pt, og + (size_t)t * os, os);
                for (int b = 1; b >= 0; b--)
                    if ((na - t) & (1 << b)) {
                        k->tiles[b](gw, nb, ac + (size_t)t * as, as, pb + (size_t)t * pt, og + (size_t)t * os, os);
                        t += 1 << b;
                    }
                continue;
            }
#endif
            for (int64_t t = 0; t < na; t++)
                k->scalar(type, gw, nb, ac + (size_t)t * as, pb + (size_t)t * pt, og + (size_t)t * os);
        }
    }
}

void quant_matmul_packed(uint32_t type, const void *groups, int64_t n_groups, const void *acts, size_t act_stride,
                         int64_t n_acts, int64_t n, float *out, size_t out_stride) {
    if (n_groups <= 0 || n_acts <= 0 || !quant_packable(type, PACK_ROWS, n)) return;
    const size_t arb = quant_act_row_bytes(type, n);
#if QUANT_HAVE_AVX2
    const int avx2 = quant_cpu_avx2(), vnni = quant_cpu_vnni();
#endif
    if (is_kquant(type)) {
        const int64_t nb = n / QK_K;
        /* at least eight activations a pass over the weights: ffn_down's
         * rows of 8960 would otherwise get four (with AVX512-VNNI more than
         * one activation goes to run_kq_lanes, which chunks by its own rule) */
        int64_t chunk = (int64_t)(MATMUL_CHUNK_BYTES / arb) & ~(int64_t)7;
        if (chunk < 8) chunk = 8;
        if (chunk > KQ_PRE / nb) chunk = KQ_PRE / nb;
        kact_block pre[KQ_PRE];
        packed_kernels k = {.pre_bytes = sizeof pre[0], .prepare = kq_prepare, .scalar = kq_scalar};
#if QUANT_HAVE_AVX2
        if (avx2) k.tiles = kq_tiles(type, vnni), k.prepare = kq_prepare_avx2;
        if (vnni && n_acts > 1 && run_kq_lanes(type, groups, n_groups, nb, acts, act_stride, n_acts, out, out_stride))
            return;
#endif
        run_packed(type, &k, groups, (size_t)nb * kq_group_block_bytes(type), n_groups, nb, acts, act_stride, n_acts,
                   chunk, pre, out, out_stride);
        return;
    }
    const int64_t nb = n / QK;
    /* activation chunks as in quant_matmul, and no more than PACK_PRE blocks */
    int64_t chunk = (int64_t)(MATMUL_CHUNK_BYTES / arb) & ~(int64_t)3;
    if (chunk < 4) chunk = 4;
    if (chunk > PACK_PRE / nb) chunk = PACK_PRE / nb;
    act_block pre[PACK_PRE];
    packed_kernels k = {.pre_bytes = sizeof pre[0], .prepare = pack_prepare, .scalar = packed_scalar};
#if QUANT_HAVE_AVX2
    if (avx2) k.tiles = packed_tiles(type, vnni), k.prepare = pack_prepare_avx2;
    if (vnni) k.pairs = packed_pair_tiles(type);
#endif
    run_packed(type, &k, groups, (size_t)nb * PACK_ROWS * quant_block_bytes(type), n_groups, nb, acts, act_stride,
               n_acts, chunk, pre, out, out_stride);
}

size_t quant_packed_lanes_bytes(uint32_t type, int64_t n_acts, int64_t n) {
#if QUANT_HAVE_AVX2
    if (n_acts > 1 && is_kquant(type) && quant_packable(type, PACK_ROWS, n) && quant_cpu_vnni())
        return (size_t)((n_acts + KQ_LANES - 1) / KQ_LANES * KQ_LANES) * kq_lane_bytes(n / QK_K);
#endif
    (void)type, (void)n_acts, (void)n;
    return 0;
}

void quant_packed_lanes(const void *acts, size_t act_stride, int64_t n_acts, int64_t t0, int64_t t1, int64_t n,
                        void *lanes) {
#if QUANT_HAVE_AVX2
    const int64_t nb = n / QK_K;
    const kact_block *pre;
    const uint8_t *qs;
    kq_lanes_at(lanes, n_acts, nb, &pre, &qs);
    const int64_t lg = t0 / KQ_LANES; /* t0's lane group */
    kq_prepare_lanes((const uint8_t *)acts + (size_t)t0 * act_stride, act_stride, t1 - t0, nb,
                     (kact_block *)pre + (size_t)lg * (size_t)nb * KQ_LANES,
                     (uint8_t *)qs + (size_t)lg * (size_t)nb * KQ_LANE_BLOCK);
#else
    (void)acts, (void)act_stride, (void)n_acts, (void)t0, (void)t1, (void)n, (void)lanes;
#endif
}

void quant_matmul_packed_lanes(uint32_t type, const void *groups, int64_t n_groups, const void *lanes, int64_t n_acts,
                               int64_t n, float *out, size_t out_stride) {
#if QUANT_HAVE_AVX2
    if (n_groups <= 0 || !quant_packed_lanes_bytes(type, n_acts, n)) return;
    const kact_block *pre;
    const uint8_t *qs;
    kq_lanes_at(lanes, n_acts, n / QK_K, &pre, &qs);
    kq_lanes_product(type, groups, n_groups, n / QK_K, pre, qs, n_acts, out, out_stride);
#else
    (void)type, (void)groups, (void)n_groups, (void)lanes, (void)n_acts, (void)n, (void)out, (void)out_stride;
#endif
}
