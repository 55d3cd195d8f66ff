/* AVX2+FMA kernels for the attention loops (the row kernels also in
 * AVX-512), with scalar fallbacks (simd.h describes the numerics). The dot
 * and axpy loops fuse each multiply-add explicitly (fmaf, vfmadd: one
 * rounding, the same on every path); everywhere else a*b+c keeps its two
 * roundings: gcc in ISO C mode does not contract it into an FMA, and for
 * clang the pragma below says so. */
#include "simd.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- scalar kernels ------------------------------------------------------------ */

static float dot_scalar(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] = fmaf(a[i + j], b[i + j], acc[j]);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

static void axpy_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

static float max_scalar(const float *x, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

static void dot_rows_scalar(float *out, int64_t os, const float *const *a, int na, const float *b, int64_t bs,
                            int64_t rows, int64_t n, float scale) {
    for (int q = 0; q < na; q++)
        for (int64_t k = 0; k < rows; k++) out[q * os + k] = dot_scalar(a[q], b + k * bs, n) * scale;
}

static void axpy_rows_scalar(float *const *y, int ny, const float *w, int64_t ws, const float *x, int64_t xs,
                             int64_t rows, int64_t n) {
    for (int q = 0; q < ny; q++)
        for (int64_t k = 0; k < rows; k++) axpy_scalar(y[q], w[q * ws + k], x + k * xs, n);
}

/* The f16 forms: each row converted exactly into a buffer, then as above. */
enum { F16_ROW_STACK = 256 };

static float *f16_row(const uint16_t *src, int64_t n, float *stack_buf) {
    float *dst = n <= F16_ROW_STACK ? stack_buf : malloc((size_t)n * sizeof *dst);
    if (!dst) abort(); /* a row longer than any head */
    for (int64_t i = 0; i < n; i++) {
        _Float16 h;
        memcpy(&h, src + i, sizeof h);
        dst[i] = (float)h;
    }
    return dst;
}

static void dot_rows_f16_scalar(float *out, int64_t os, const float *const *a, int na, const uint16_t *b,
                                int64_t bs, int64_t rows, int64_t n, float scale) {
    float buf[F16_ROW_STACK];
    for (int64_t k = 0; k < rows; k++) {
        float *row = f16_row(b + k * bs, n, buf);
        for (int q = 0; q < na; q++) out[q * os + k] = dot_scalar(a[q], row, n) * scale;
        if (row != buf) free(row);
    }
}

static void axpy_rows_f16_scalar(float *const *y, int ny, const float *w, int64_t ws, const uint16_t *x, int64_t xs,
                                 int64_t rows, int64_t n) {
    float buf[F16_ROW_STACK];
    for (int64_t k = 0; k < rows; k++) { /* k outermost: each y[q] still gets its rows in order */
        float *row = f16_row(x + k * xs, n, buf);
        for (int q = 0; q < ny; q++) axpy_scalar(y[q], w[q * ws + k], row, n);
        if (row != buf) free(row);
    }
}

/* The softmax sum: eight double partial sums, lane i % 8, combined as the
 * dot's lanes are (one long dependent chain of double additions had cost
 * as much as the exponentials). */
static double sum8_scalar(const float *p, int64_t n) {
    double acc[8] = {0};
    for (int64_t i = 0; i < n; i++) acc[i % 8] += p[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The sum of squares in double, lane i % 8, combined as the dot's lanes. */
static double sum_squares_scalar(const float *x, int64_t n) {
    double acc[8] = {0};
    for (int64_t i = 0; i < n; i++) acc[i % 8] += (double)x[i] * x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static void scale_mul_scalar(float *out, const float *x, float scale, const float *w, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

static void swiglu_scalar(float *g, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * up[i];
}

static double exp_sub_sum_scalar(float *p, int64_t n, float mx) {
    for (int64_t i = 0; i < n; i++) p[i] = expf(p[i] - mx);
    return sum8_scalar(p, n);
}

/* ---- AVX2 + FMA kernels ---------------------------------------------------------- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SIMD_HAVE_AVX2 1
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))

/* hadd: [l0+l1, l2+l3, ., . | l4+l5, l6+l7, ., .], twice: lane 0 (l0+l1)+(l2+l3),
 * lane 4 (l4+l5)+(l6+l7); then lane 0 + lane 4, the scalar order. */
static inline AVX2_FN float reduce_dot(__m256 acc) {
    const __m256 h = _mm256_hadd_ps(acc, acc);
    const __m256 h2 = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
}

/* reduce_dot of four accumulators at once, lane k the sum of c_k (the same
 * additions in the same order: hadd pairs, pairs of pairs, then the halves). */
static inline AVX2_FN __m128 reduce4(__m256 c0, __m256 c1, __m256 c2, __m256 c3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(c0, c1), _mm256_hadd_ps(c2, c3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

static AVX2_FN void axpy_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 y0 = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i));
        const __m256 y1 = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8));
        _mm256_storeu_ps(y + i, y0);
        _mm256_storeu_ps(y + i + 8, y1);
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* Row kernels over f32 rows (F16 = 0) or IEEE half rows (F16 = 1, converted
 * exactly by vcvtph2ps, so the same bits as converting the rows first): one
 * always-inlined body, instantiated for each. */
#define ALWAYS_INLINE inline __attribute__((always_inline))

/* TILE(i, N) over items [0, n): four at a time, then the three, two or one
 * left, N a constant in each call so that the tile's loops unroll and its
 * accumulators stay in registers. */
#define FOR_TILES_OF_4(n, TILE)                                                                                        \
    do {                                                                                                               \
        int i_ = 0;                                                                                                    \
        for (; i_ + 4 <= (n); i_ += 4) TILE(i_, 4);                                                                    \
        switch ((n) - i_) {                                                                                            \
        case 3: TILE(i_, 3); break;                                                                                    \
        case 2: TILE(i_, 2); break;                                                                                    \
        case 1: TILE(i_, 1); break;                                                                                    \
        default: break;                                                                                                \
        }                                                                                                              \
    } while (0)

static ALWAYS_INLINE AVX2_FN __m256 load8(const void *row, int64_t i, const int F16) {
    if (F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    return _mm256_loadu_ps((const float *)row + i);
}

static ALWAYS_INLINE float elem(const void *row, int64_t i, const int F16) {
    if (!F16) return ((const float *)row)[i];
    _Float16 h;
    memcpy(&h, (const uint16_t *)row + i, sizeof h);
    return (float)h;
}

static ALWAYS_INLINE const void *row_at(const void *base, int64_t k, const int F16) {
    return F16 ? (const void *)((const uint16_t *)base + k) : (const void *)((const float *)base + k);
}


/* A tile of NQ queries x NK rows (constant counts, so the NQ*NK accumulators
 * stay in registers): each row's eight lanes are loaded once for all NQ
 * queries. Per (query, row) the operations are those of the scalar dot. */
static ALWAYS_INLINE AVX2_FN void dot_tile(float *out, int64_t os, const float *const *a, const int NQ,
                                           const void *const *b, const int NK, int64_t n, float scale, const int F16) {
    __m256 c[4][2];
#pragma GCC unroll 4
    for (int q = 0; q < NQ; q++)
        for (int r = 0; r < NK; r++) c[q][r] = _mm256_setzero_ps();
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t i = 0; i < n8; i += 8) {
        __m256 vb[2];
        for (int r = 0; r < NK; r++) vb[r] = load8(b[r], i, F16);
#pragma GCC unroll 4
        for (int q = 0; q < NQ; q++) {
            const __m256 va = _mm256_loadu_ps(a[q] + i);
            for (int r = 0; r < NK; r++) c[q][r] = _mm256_fmadd_ps(va, vb[r], c[q][r]);
        }
    }
    int q0 = 0;
    if (NK == 2 && n8 == n) { /* two queries' four reductions in three operations */
        const __m128 vs = _mm_set1_ps(scale);
#pragma GCC unroll 2
        for (int q = 0; q + 2 <= NQ; q += 2) {
            const __m128 s = _mm_mul_ps(reduce4(c[q][0], c[q][1], c[q + 1][0], c[q + 1][1]), vs);
            _mm_storel_pi((__m64 *)(void *)(out + q * os), s);
            _mm_storeh_pi((__m64 *)(void *)(out + (q + 1) * os), s);
        }
        q0 = NQ & ~1;
    }
    for (int q = q0; q < NQ; q++)
        for (int r = 0; r < NK; r++) {
            float s = reduce_dot(c[q][r]);
            for (int64_t i = n8; i < n; i++) s = fmaf(a[q][i], elem(b[r], i, F16), s);
            out[q * os + r] = s * scale;
        }
}

static ALWAYS_INLINE AVX2_FN void dot_tiles(float *out, int64_t os, const float *const *a, int na,
                                            const void *const *b, const int NK, int64_t n, float scale, const int F16) {
#define TILE(q, NQ) dot_tile(out + (q) * os, os, a + (q), NQ, b, NK, n, scale, F16)
    FOR_TILES_OF_4(na, TILE);
#undef TILE
}

/* Rows two at a time, every query against them while they sit in L1: the
 * rows stream from memory once for all the queries. */
static ALWAYS_INLINE AVX2_FN void dot_rows_body(float *out, int64_t os, const float *const *a, int na, const void *b,
                                                int64_t bs, int64_t rows, int64_t n, float scale, const int F16) {
    int64_t k = 0;
    for (; k + 2 <= rows; k += 2) {
        const void *bk[2] = {row_at(b, k * bs, F16), row_at(b, (k + 1) * bs, F16)};
        dot_tiles(out + k, os, a, na, bk, 2, n, scale, F16);
    }
    if (k < rows) {
        const void *bk[1] = {row_at(b, k * bs, F16)};
        dot_tiles(out + k, os, a, na, bk, 1, n, scale, F16);
    }
}

static AVX2_FN float dot_avx2(const float *a, const float *b, int64_t n) {
    float s;
    const void *bk[1] = {b};
    dot_tile(&s, 1, &a, 1, bk, 1, n, 1.0f, 0);
    return s;
}

static AVX2_FN void dot_rows_avx2(float *out, int64_t os, const float *const *a, int na, const float *b, int64_t bs,
                                  int64_t rows, int64_t n, float scale) {
    dot_rows_body(out, os, a, na, b, bs, rows, n, scale, 0);
}

static AVX2_FN void dot_rows_f16_avx2(float *out, int64_t os, const float *const *a, int na, const uint16_t *b,
                                      int64_t bs, int64_t rows, int64_t n, float scale) {
    dot_rows_body(out, os, a, na, b, bs, rows, n, scale, 1);
}

/* Columns [c, c + 8*NV) of NQ outputs kept in registers while `rows` rows go
 * by; per (output, column) the additions come in row order, as in the scalar
 * axpy loop. */
static ALWAYS_INLINE AVX2_FN void axpy_tile(float *const *y, int64_t c, const float *w, int64_t ws, const int NQ,
                                            const void *x, int64_t xs, int64_t rows, const int NV, const int F16) {
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int q = 0; q < NQ; q++)
        for (int v = 0; v < NV; v++) acc[q][v] = _mm256_loadu_ps(y[q] + c + 8 * v);
    for (int64_t k = 0; k < rows; k++) {
        __m256 vx[2];
        for (int v = 0; v < NV; v++) vx[v] = load8(x, k * xs + c + 8 * v, F16);
#pragma GCC unroll 4
        for (int q = 0; q < NQ; q++) {
            const __m256 wk = _mm256_set1_ps(w[q * ws + k]);
            for (int v = 0; v < NV; v++) acc[q][v] = _mm256_fmadd_ps(wk, vx[v], acc[q][v]);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < NQ; q++)
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(y[q] + c + 8 * v, acc[q][v]);
}

static ALWAYS_INLINE AVX2_FN void axpy_tiles(float *const *y, int ny, int64_t c, const float *w, int64_t ws,
                                             const void *x, int64_t xs, int64_t rows, const int NV, const int F16) {
#define TILE(q, NQ) axpy_tile(y + (q), c, w + (q) * ws, ws, NQ, x, xs, rows, NV, F16)
    FOR_TILES_OF_4(ny, TILE);
#undef TILE
}

/* Columns [n8, n) (the last n % 8) of a block of rows, rows in order. */
static ALWAYS_INLINE void axpy_last_columns(float *const *y, int ny, const float *w, int64_t ws, const void *xb,
                                            int64_t xs, int64_t rows, int64_t n8, int64_t n, const int F16) {
    for (int q = 0; q < ny; q++)
        for (int64_t i = n8; i < n; i++) {
            float v = y[q][i];
            for (int64_t k = 0; k < rows; k++) v = fmaf(w[q * ws + k], elem(xb, k * xs + i, F16), v);
            y[q][i] = v;
        }
}

enum { AXPY_BLOCK_ROWS = 64 }; /* 64 rows of a 64-wide f32 head: 16 KB, in L1 for every output */

static ALWAYS_INLINE AVX2_FN void axpy_rows_body(float *const *y, int ny, const float *w, int64_t ws, const void *x,
                                                 int64_t xs, int64_t rows, int64_t n, const int F16) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t k0 = 0; k0 < rows; k0 += AXPY_BLOCK_ROWS) {
        const int64_t kn = rows - k0 < AXPY_BLOCK_ROWS ? rows - k0 : AXPY_BLOCK_ROWS;
        const void *xb = row_at(x, k0 * xs, F16);
        int64_t c = 0;
        for (; c + 16 <= n8; c += 16) axpy_tiles(y, ny, c, w + k0, ws, xb, xs, kn, 2, F16);
        if (c < n8) axpy_tiles(y, ny, c, w + k0, ws, xb, xs, kn, 1, F16);
        axpy_last_columns(y, ny, w + k0, ws, xb, xs, kn, n8, n, F16);
    }
}

static AVX2_FN void axpy_rows_avx2(float *const *y, int ny, const float *w, int64_t ws, const float *x, int64_t xs,
                                   int64_t rows, int64_t n) {
    axpy_rows_body(y, ny, w, ws, x, xs, rows, n, 0);
}

static AVX2_FN void axpy_rows_f16_avx2(float *const *y, int ny, const float *w, int64_t ws, const uint16_t *x,
                                       int64_t xs, int64_t rows, int64_t n) {
    axpy_rows_body(y, ny, w, ws, x, xs, rows, n, 1);
}

/* ---- AVX-512 forms of the row kernels -------------------------------------------------
 * The same lanes, the same fused multiply-adds in the same order as the AVX2
 * tiles above (so the same bits), twice as many per instruction:
 *  - dot: two queries side by side in one register (query 2p's eight lanes
 *    low, query 2p+1's high), each key row's eight lanes broadcast to both
 *    halves; every lane still accumulates a[i+j]*b[i+j] for i = 0, 8, 16, ... and the
 *    halves are reduced as reduce_dot does. The interleaved queries are built
 *    once per call, so the inner loop only loads.
 *  - axpy: sixteen columns per register (each column's additions in row
 *    order, as before). */
#define AVX512_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl,avx512bw")))

enum { DOT512_MAX_N = 256, DOT512_MAX_Q = 16, DOT512_ROWS = 4 };

/* Row `row`'s lanes [i, i + 8) in both halves. */
static ALWAYS_INLINE AVX512_FN __m512 load8x2(const void *row, int64_t i, const int F16) {
    if (F16) return _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i))));
    return _mm512_broadcast_f32x8(_mm256_loadu_ps((const float *)row + i));
}

/* _mm256_hadd_ps in each 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3]. */
static ALWAYS_INLINE AVX512_FN __m512 hadd512(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* NQP query pairs (qp: n/8 registers each) x DOT512_ROWS rows; `na` queries
 * and `nr` rows of the tile are real (the others repeat a real one and are
 * not stored). */
static ALWAYS_INLINE AVX512_FN void dot_tile512(float *out, int64_t os, const float *qp, int64_t n, const int NQP, int na,
                                               const void *const *b, int nr, float scale, const int F16) {
    __m512 c[4][DOT512_ROWS];
#pragma GCC unroll 4
    for (int p = 0; p < NQP; p++)
#pragma GCC unroll 4
        for (int r = 0; r < DOT512_ROWS; r++) c[p][r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        __m512 vb[DOT512_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < DOT512_ROWS; r++) vb[r] = load8x2(b[r], i, F16);
#pragma GCC unroll 4
        for (int p = 0; p < NQP; p++) {
            const __m512 va = _mm512_loadu_ps(qp + p * 2 * n + 2 * i);
#pragma GCC unroll 4
            for (int r = 0; r < DOT512_ROWS; r++) c[p][r] = _mm512_fmadd_ps(va, vb[r], c[p][r]);
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
#pragma GCC unroll 4
    for (int p = 0; p < NQP; p++) {
        /* reduce4 in each half: per 128-bit lane, hadd of the rows' pairs,
         * then of pairs of pairs; then lanes 4-7 onto lanes 0-3 */
        const __m512 h = hadd512(hadd512(c[p][0], c[p][1]), hadd512(c[p][2], c[p][3]));
        const __m512 s = _mm512_mul_ps(_mm512_add_ps(h, _mm512_shuffle_f32x4(h, h, _MM_SHUFFLE(2, 3, 0, 1))), vs);
        for (int half = 0; half < 2 && 2 * p + half < na; half++) {
            const __m128 v = half ? _mm512_extractf32x4_ps(s, 2) : _mm512_castps512_ps128(s);
            float *o = out + (2 * p + half) * os;
            if (nr == DOT512_ROWS) {
                _mm_storeu_ps(o, v);
            } else {
                float l[4];
                _mm_storeu_ps(l, v);
                for (int r = 0; r < nr; r++) o[r] = l[r];
            }
        }
    }
}

/* Queries [0, na), na <= DOT512_MAX_Q, n % 8 == 0, n <= DOT512_MAX_N. */
static ALWAYS_INLINE AVX512_FN void dot_rows512_body(float *out, int64_t os, const float *const *a, int na,
                                                    const void *b, int64_t bs, int64_t rows, int64_t n, float scale,
                                                    const int F16) {
    float qp[DOT512_MAX_Q * DOT512_MAX_N] __attribute__((aligned(64)));
    const int np = (na + 1) / 2;
    for (int p = 0; p < np; p++) {
        const float *lo = a[2 * p], *hi = a[2 * p + 1 < na ? 2 * p + 1 : 2 * p];
        for (int64_t i = 0; i < n; i += 8) {
            memcpy(qp + p * 2 * n + 2 * i, lo + i, 8 * sizeof(float));
            memcpy(qp + p * 2 * n + 2 * i + 8, hi + i, 8 * sizeof(float));
        }
    }
    for (int64_t k = 0; k < rows; k += DOT512_ROWS) {
        const int nr = rows - k < DOT512_ROWS ? (int)(rows - k) : DOT512_ROWS;
        const void *bk[DOT512_ROWS];
        for (int r = 0; r < DOT512_ROWS; r++) bk[r] = row_at(b, (k + (r < nr ? r : 0)) * bs, F16);
#define TILE(p, NQP) dot_tile512(out + 2 * (p) * os + k, os, qp + (p) * 2 * n, n, NQP, na - 2 * (p), bk, nr, scale, F16)
        FOR_TILES_OF_4(np, TILE);
#undef TILE
    }
}

static AVX512_FN void dot_rows_avx512(float *out, int64_t os, const float *const *a, int na, const void *b, int64_t bs,
                                      int64_t rows, int64_t n, float scale, int f16) {
    for (int q = 0; q < na; q += DOT512_MAX_Q) {
        const int nq = na - q < DOT512_MAX_Q ? na - q : DOT512_MAX_Q;
        if (f16)
            dot_rows512_body(out + q * os, os, a + q, nq, b, bs, rows, n, scale, 1);
        else
            dot_rows512_body(out + q * os, os, a + q, nq, b, bs, rows, n, scale, 0);
    }
}

static ALWAYS_INLINE AVX512_FN __m512 load16(const void *row, int64_t i, const int F16) {
    if (F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i)));
    return _mm512_loadu_ps((const float *)row + i);
}

/* axpy_tile with NV registers of sixteen columns. */
static ALWAYS_INLINE AVX512_FN void axpy_tile512(float *const *y, int64_t c, const float *w, int64_t ws, const int NQ,
                                                const void *x, int64_t xs, int64_t rows, const int NV, const int F16) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[q][v] = _mm512_loadu_ps(y[q] + c + 16 * v);
    for (int64_t k = 0; k < rows; k++) {
        __m512 vx[4];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) vx[v] = load16(x, k * xs + c + 16 * v, F16);
#pragma GCC unroll 4
        for (int q = 0; q < NQ; q++) {
            const __m512 wk = _mm512_set1_ps(w[q * ws + k]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[q][v] = _mm512_fmadd_ps(wk, vx[v], acc[q][v]);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(y[q] + c + 16 * v, acc[q][v]);
}

static ALWAYS_INLINE AVX512_FN void axpy_tiles512(float *const *y, int ny, int64_t c, const float *w, int64_t ws,
                                                 const void *x, int64_t xs, int64_t rows, const int NV, const int F16) {
#define TILE(q, NQ) axpy_tile512(y + (q), c, w + (q) * ws, ws, NQ, x, xs, rows, NV, F16)
    FOR_TILES_OF_4(ny, TILE);
#undef TILE
}

/* axpy_rows_body with columns 64, 32 and 16 at a time, then the AVX2 tile and
 * the scalar tail for the rest. */
static ALWAYS_INLINE AVX512_FN void axpy_rows512_body(float *const *y, int ny, const float *w, int64_t ws, const void *x,
                                                     int64_t xs, int64_t rows, int64_t n, const int F16) {
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t k0 = 0; k0 < rows; k0 += AXPY_BLOCK_ROWS) {
        const int64_t kn = rows - k0 < AXPY_BLOCK_ROWS ? rows - k0 : AXPY_BLOCK_ROWS;
        const void *xb = row_at(x, k0 * xs, F16);
        int64_t c = 0;
        for (; c + 64 <= n8; c += 64) axpy_tiles512(y, ny, c, w + k0, ws, xb, xs, kn, 4, F16);
        if (c + 32 <= n8) axpy_tiles512(y, ny, c, w + k0, ws, xb, xs, kn, 2, F16), c += 32;
        if (c + 16 <= n8) axpy_tiles512(y, ny, c, w + k0, ws, xb, xs, kn, 1, F16), c += 16;
        if (c < n8) axpy_tiles(y, ny, c, w + k0, ws, xb, xs, kn, 1, F16);
        axpy_last_columns(y, ny, w + k0, ws, xb, xs, kn, n8, n, F16);
    }
}

static AVX512_FN void axpy_rows_avx512(float *const *y, int ny, const float *w, int64_t ws, const void *x, int64_t xs,
                                       int64_t rows, int64_t n, int f16) {
    if (f16)
        axpy_rows512_body(y, ny, w, ws, x, xs, rows, n, 1);
    else
        axpy_rows512_body(y, ny, w, ws, x, xs, rows, n, 0);
}

static AVX2_FN float max_avx2(const float *x, int64_t n) {
    /* vmaxps(v, m) returns m when v is NaN, so NaNs are skipped as in the scalar loop */
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
    }
    for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    m0 = _mm256_max_ps(m0, m1);
    float l[8];
    _mm256_storeu_ps(l, m0);
    float m = -INFINITY;
    for (int k = 0; k < 8; k++)
        if (l[k] > m) m = l[k];
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

/* expf, vectorised: the algorithm of glibc's expf (since 2.28; ARM's
 * optimized-routines, also in musl) in the form its x86-64 FMA build runs
 * (__expf_fma, which glibc picks on every CPU this path runs on), operation
 * for operation in double precision, so the results are bit-identical to
 * that expf: x*32/ln2 = k + r, 2^(k/32) from a table and the exponent
 * bits, 2^(r/32) by a cubic, one rounding to float at the end:
 *   kd' = fma(InvLn2N, x, Shift)   ki = bits(kd')   kd = kd' - Shift
 *   r = fma(InvLn2N, x, -kd)       s = bits(T[ki % 32] + (ki << 47))
 *   y = fma(fma(C0, r, C1), r*r, fma(C2, r, 1)) * s
 * Lanes with |x| >= 88 or NaN (glibc's special cases) take expf itself. */
static const uint64_t exp2f_tab[32] = { /* bits of 2^(i/32), minus i << 47 */
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

static inline AVX2_FN __m128 expf4(__m128 x) {
    const __m256d inv_ln2_n = _mm256_set1_pd(0x1.71547652b82fep+0 * 32), shift = _mm256_set1_pd(0x1.8p+52);
    const __m256d xd = _mm256_cvtps_pd(x);
    const __m256d kds = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kds);
    const __m256d kd = _mm256_sub_pd(kds, shift);
    const __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
    const __m256i t = _mm256_i64gather_epi64((const long long *)(const void *)exp2f_tab,
                                             _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    const __m256d sc = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
    const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                      _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, sc));
}

/* expf of eight lanes. */
static inline AVX2_FN __m256 expf8(__m256 x) {
    __m256 e = _mm256_set_m128(expf4(_mm256_extractf128_ps(x, 1)), expf4(_mm256_castps256_ps128(x)));
    /* |x| >= 88 (bits of |x| >= those of 88.0f) or NaN */
    const __m256i ax = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff));
    const __m256i special = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x42afffff));
    if (!_mm256_testz_si256(special, special)) {
        float xs[8], es[8];
        _mm256_storeu_ps(xs, x);
        _mm256_storeu_ps(es, e);
        const int m = _mm256_movemask_ps(_mm256_castsi256_ps(special));
        for (int k = 0; k < 8; k++)
            if (m >> k & 1) es[k] = expf(xs[k]);
        e = _mm256_loadu_ps(es);
    }
    return e;
}

/* p[i] = expf(p[i] - mx) for eight lanes. */
static inline AVX2_FN void expf8_store(float *p, __m256 vm) {
    _mm256_storeu_ps(p, expf8(_mm256_sub_ps(_mm256_loadu_ps(p), vm)));
}

static AVX2_FN double sum_squares_avx2(const float *x, int64_t n) {
    __m256d lo = _mm256_setzero_pd(), hi = lo;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) { /* (double)x * x is exact: mul then add, as the scalar lanes */
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
    }
    double acc[8];
    _mm256_storeu_pd(acc, lo);
    _mm256_storeu_pd(acc + 4, hi);
    for (; i < n; i++) acc[i % 8] += (double)x[i] * x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

static AVX2_FN void scale_mul_avx2(float *out, const float *x, float scale, const float *w, int64_t n) {
    const __m256 vs = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
    for (; i < n; i++) out[i] = x[i] * scale * w[i];
}

static AVX2_FN void swiglu_avx2(float *g, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 e = expf8(_mm256_xor_ps(x, sign));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * up[i];
}

static AVX2_FN double exp_sub_sum_avx2(float *p, int64_t n, float mx) {
    const __m256 vm = _mm256_set1_ps(mx);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) expf8_store(p + i, vm);
    for (; i < n; i++) p[i] = expf(p[i] - mx);
    /* sum8_scalar's order: lanes 0-3 and 4-7 in two vectors of doubles */
    __m256d lo = _mm256_setzero_pd(), hi = lo;
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(p + i);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    double acc[8];
    _mm256_storeu_pd(acc, lo);
    _mm256_storeu_pd(acc + 4, hi);
    for (; i < n; i++) acc[i % 8] += p[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* expf4 on eight lanes in one register of doubles, 2^(k/32) picked from
 * the table held in four registers (two two-table permutes and a blend, not
 * a gather): the same operations, the same bits. */
static ALWAYS_INLINE AVX512_FN __m256 expf8_pd(__m256 x, const __m512i t[4]) {
    const __m512d inv_ln2_n = _mm512_set1_pd(0x1.71547652b82fep+0 * 32), shift = _mm512_set1_pd(0x1.8p+52);
    const __m512d xd = _mm512_cvtps_pd(x);
    const __m512d kds = _mm512_fmadd_pd(inv_ln2_n, xd, shift);
    const __m512i ki = _mm512_castpd_si512(kds);
    const __m512d kd = _mm512_sub_pd(kds, shift);
    const __m512d r = _mm512_fmsub_pd(inv_ln2_n, xd, kd);
    const __m512i lo = _mm512_permutex2var_epi64(t[0], ki, t[1]), hi = _mm512_permutex2var_epi64(t[2], ki, t[3]);
    const __m512i tab = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    const __m512d sc = _mm512_castsi512_pd(_mm512_add_epi64(tab, _mm512_slli_epi64(ki, 47)));
    const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                      _mm512_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
    const __m512d r2 = _mm512_mul_pd(r, r);
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, r2, y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, sc));
}

/* exp_sub_sum_avx2 sixteen lanes at a time (the same expf, the same sums). */
static AVX512_FN double exp_sub_sum_avx512(float *p, int64_t n, float mx) {
    __m512i t[4];
    for (int k = 0; k < 4; k++) t[k] = _mm512_loadu_si512((const void *)(exp2f_tab + 8 * k));
    const __m512 vm = _mm512_set1_ps(mx);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(p + i), vm);
        __m512 e = _mm512_insertf32x8(_mm512_castps256_ps512(expf8_pd(_mm512_castps512_ps256(x), t)),
                                      expf8_pd(_mm512_extractf32x8_ps(x, 1), t), 1);
        /* |x| >= 88 (bits of |x| >= those of 88.0f) or NaN: glibc's special cases */
        const __m512i ax = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff));
        const __mmask16 special = _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x42afffff));
        if (special) {
            float xs[16], es[16];
            _mm512_storeu_ps(xs, x);
            _mm512_storeu_ps(es, e);
            for (int k = 0; k < 16; k++)
                if (special >> k & 1) es[k] = expf(xs[k]);
            e = _mm512_loadu_ps(es);
        }
        _mm512_storeu_ps(p + i, e);
    }
    const __m256 vm8 = _mm256_set1_ps(mx);
    for (; i + 8 <= n; i += 8) expf8_store(p + i, vm8);
    for (; i < n; i++) p[i] = expf(p[i] - mx);
    /* sum8_scalar's order: lane i % 8 in one register of doubles */
    __m512d acc = _mm512_setzero_pd();
    for (i = 0; i + 8 <= n; i += 8) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_loadu_ps(p + i)));
    double l[8];
    _mm512_storeu_pd(l, acc);
    for (; i < n; i++) l[i % 8] += p[i];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static int cpu_has_avx2_fma(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

/* vpdpbusd on 256- and 512-bit registers, with the byte operations of
 * AVX512BW, and AVX512DQ's 256-bit halves for the row kernels (libgcc also
 * checks that the OS saves the AVX-512 state). */
static int cpu_has_avx512_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq");
}
#else
#define SIMD_HAVE_AVX2 0
#endif

int simd_cpu_probe(void) {
    const char *e = getenv("POTSERVE_NO_SIMD");
    int m = 0;
#if SIMD_HAVE_AVX2
    if (!(e && *e && strcmp(e, "0") != 0)) m = cpu_has_avx2_fma() ? 1 + cpu_has_avx512_vnni() : 0;
#else
    (void)e;
#endif
    return m;
}

/* ---- dispatch ------------------------------------------------------------------------ */

static atomic_int simd_mode = -1; /* -1 not yet known, else simd_cpu_probe's 0, 1 or 2 */
static atomic_int forced_scalar = 0, forced_no_avx512 = 0;

static __attribute__((noinline, cold)) int detect_mode(void) {
    const int m = simd_cpu_probe();
    atomic_store_explicit(&simd_mode, m, memory_order_relaxed);
    return m;
}

/* Called once per helper call: two relaxed loads on the usual path. 0 scalar,
 * 1 AVX2, 2 AVX2 and the AVX-512 row kernels. */
static inline int simd_level(void) {
    if (atomic_load_explicit(&forced_scalar, memory_order_relaxed)) return 0;
    int m = atomic_load_explicit(&simd_mode, memory_order_relaxed);
    if (m < 0) m = detect_mode();
    return m == 2 && atomic_load_explicit(&forced_no_avx512, memory_order_relaxed) ? 1 : m;
}

static inline int use_avx2(void) {
    return simd_level() > 0;
}

const char *simd_name(void) {
    static const char *const names[] = {"scalar", "avx2", "avx2+avx512"};
    return names[simd_level()];
}

void simd_force_scalar(int on) {
    atomic_store_explicit(&forced_scalar, on != 0, memory_order_relaxed);
}

void simd_force_no_avx512(int on) {
    atomic_store_explicit(&forced_no_avx512, on != 0, memory_order_relaxed);
}

float simd_dot_f32(const float *a, const float *b, int64_t n) {
#if SIMD_HAVE_AVX2
    if (use_avx2()) return dot_avx2(a, b, n);
#endif
    return dot_scalar(a, b, n);
}

void simd_axpy_f32(float *y, float a, const float *x, int64_t n) {
#if SIMD_HAVE_AVX2
    if (use_avx2()) {
        axpy_avx2(y, a, x, n);
        return;
    }
#endif
    axpy_scalar(y, a, x, n);
}

float simd_max_f32(const float *x, int64_t n) {
#if SIMD_HAVE_AVX2
    if (use_avx2()) return max_avx2(x, n);
#endif
    return max_scalar(x, n);
}

void simd_dot_rows_f32(float *out, int64_t out_stride, const float *const *a, int n_a, const float *b,
                       int64_t b_stride, int64_t n_rows, int64_t n, float scale) {
    if (n_rows <= 0 || n_a <= 0) return;
#if SIMD_HAVE_AVX2
    const int level = simd_level();
    if (level == 2 && n % 8 == 0 && n <= DOT512_MAX_N) {
        dot_rows_avx512(out, out_stride, a, n_a, b, b_stride, n_rows, n, scale, 0);
        return;
    }
    if (level) {
        dot_rows_avx2(out, out_stride, a, n_a, b, b_stride, n_rows, n, scale);
        return;
    }
#endif
    dot_rows_scalar(out, out_stride, a, n_a, b, b_stride, n_rows, n, scale);
}

void simd_axpy_rows_f32(float *const *y, int n_y, const float *w, int64_t w_stride, const float *x, int64_t x_stride,
                        int64_t n_rows, int64_t n) {
    if (n_rows <= 0 || n <= 0 || n_y <= 0) return;
#if SIMD_HAVE_AVX2
    const int level = simd_level();
    if (level == 2) {
        axpy_rows_avx512(y, n_y, w, w_stride, x, x_stride, n_rows, n, 0);
        return;
    }
    if (level) {
        axpy_rows_avx2(y, n_y, w, w_stride, x, x_stride, n_rows, n);
        return;
    }
#endif
    axpy_rows_scalar(y, n_y, w, w_stride, x, x_stride, n_rows, n);
}

void simd_dot_rows_f16(float *out, int64_t out_stride, const float *const *a, int n_a, const uint16_t *b,
                       int64_t b_stride, int64_t n_rows, int64_t n, float scale) {
    if (n_rows <= 0 || n_a <= 0) return;
#if SIMD_HAVE_AVX2
    const int level = simd_level();
    if (level == 2 && n % 8 == 0 && n <= DOT512_MAX_N) {
        dot_rows_avx512(out, out_stride, a, n_a, b, b_stride, n_rows, n, scale, 1);
        return;
    }
    if (level) {
        dot_rows_f16_avx2(out, out_stride, a, n_a, b, b_stride, n_rows, n, scale);
        return;
    }
#endif
    dot_rows_f16_scalar(out, out_stride, a, n_a, b, b_stride, n_rows, n, scale);
}

void simd_axpy_rows_f16(float *const *y, int n_y, const float *w, int64_t w_stride, const uint16_t *x,
                        int64_t x_stride, int64_t n_rows, int64_t n) {
    if (n_rows <= 0 || n <= 0 || n_y <= 0) return;
#if SIMD_HAVE_AVX2
    const int level = simd_level();
    if (level == 2) {
        axpy_rows_avx512(y, n_y, w, w_stride, x, x_stride, n_rows, n, 1);
        return;
    }
    if (level) {
        axpy_rows_f16_avx2(y, n_y, w, w_stride, x, x_stride, n_rows, n);
        return;
    }
#endif
    axpy_rows_f16_scalar(y, n_y, w, w_stride, x, x_stride, n_rows, n);
}

double simd_exp_sub_sum(float *p, int64_t n, float mx) {
    if (n <= 0) return 0.0;
#if SIMD_HAVE_AVX2
    const int level = simd_level();
    if (level == 2) return exp_sub_sum_avx512(p, n, mx);
    if (level) return exp_sub_sum_avx2(p, n, mx);
#endif
    return exp_sub_sum_scalar(p, n, mx);
}

void simd_swiglu(float *g, const float *up, int64_t n) {
    if (n <= 0) return;
#if SIMD_HAVE_AVX2
    if (use_avx2()) {
        swiglu_avx2(g, up, n);
        return;
    }
#endif
    swiglu_scalar(g, up, n);
}

void simd_geglu(float *g, const float *up, int64_t n) {
    const float sqrt_2_over_pi = 0.79788456080286535588f;
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        g[i] = 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * (1.0f + 0.044715f * x * x))) * up[i];
    }
}

void simd_geglu_f16(float *g, const float *up, int64_t n) {
    const float sqrt_2_over_pi = 0.79788456080286535588f;
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        if (x <= -10.0f) {
            g[i] = 0.0f;
        } else if (x >= 10.0f) {
            g[i] = x * up[i];
        } else {
            const float h = (float)(_Float16)x;
            g[i] = (float)(_Float16)(0.5f * h * (1.0f + tanhf(sqrt_2_over_pi * h * (1.0f + 0.044715f * h * h)))) * up[i];
        }
    }
}

void simd_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    if (n <= 0) return;
    double ss;
#if SIMD_HAVE_AVX2
    const int avx2 = use_avx2();
    ss = avx2 ? sum_squares_avx2(x, n) : sum_squares_scalar(x, n);
#else
    ss = sum_squares_scalar(x, n);
#endif
    const float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
#if SIMD_HAVE_AVX2
    if (avx2) {
        scale_mul_avx2(out, x, scale, w, n);
        return;
    }
#endif
    scale_mul_scalar(out, x, scale, w, n);
}
