/* engine/cpu/simd.c: the AVX2 and AVX-512 kernels (when the CPU has them)
 * against the scalar ones and against reference loops written out here, on
 * random inputs of every length 0..67, 248..264 and 1000..1040, 4099, at
 * unaligned addresses:
 *  - simd_dot_f32, simd_axpy_f32, simd_max_f32: the same bits on both paths
 *    and as the reference loops (fused multiply-adds in simd.h's order; also
 *    with NaNs and infinities for max);
 *  - simd_exp_sub_sum: each p[i] the bits of expf(p[i] - mx) (glibc; with
 *    another libm within 1 ulp), also for differences beyond +-88,
 *    infinities and NaN; the sum the bits of eight partial sums (lane i%8) of
 *    the stored values, as the scalar path adds them; plus a
 *    sweep over [-104, 89] in steps of 2^-12;
 *  - simd_swiglu: the bits of the backend's original SwiGLU loop (libm expf);
 *  - simd_rmsnorm: the same bits on both paths, within 1 ulp of a sequential sum;
 *  - simd_dot_rows_f32 / simd_axpy_rows_f32: the same bits as the row-by-row
 *    loops on every path (scalar, AVX2, AVX-512) for 1..9 and 17 queries,
 *    0..130 rows. */
#include "test.h"

#include "engine/cpu/simd.h"

#include <stdint.h>
#include <stdlib.h>

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static float uni(void) { /* [-1, 1) */
    return (float)((double)rnd() / 2147483648.0 - 1.0);
}

static int same_bits(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Distance in units in the last place (both finite, same sign or zero). */
static int64_t ulp_diff(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* The dot as simd.h defines it: eight lanes of fused multiply-adds, a fixed
 * reduction, the tail in order. */
static float ref_dot(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] = fmaf(a[i + j], b[i + j], acc[j]);
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

enum { MAX_N = 4099 };
static int64_t lengths[96];
static int n_lengths;

static void init_lengths(void) {
    n_lengths = 0;
    for (int64_t n = 0; n <= 67; n++) lengths[n_lengths++] = n;
    for (int64_t n = 248; n <= 264; n += 8) lengths[n_lengths++] = n; /* around the AVX-512 dot's longest row */
    for (int64_t n = 1000; n <= 1040; n += 5) lengths[n_lengths++] = n;
    lengths[n_lengths++] = MAX_N;
}

TEST(simd_name_and_dispatch) {
    const char *name = simd_name();
    CHECK(strcmp(name, "avx2+avx512") == 0 || strcmp(name, "avx2") == 0 || strcmp(name, "scalar") == 0);
    simd_force_scalar(1);
    CHECK_STR(simd_name(), "scalar");
    simd_force_scalar(0);
    CHECK_STR(simd_name(), name);
    simd_force_no_avx512(1);
    CHECK_STR(simd_name(), strcmp(name, "avx2+avx512") == 0 ? "avx2" : name);
    simd_force_no_avx512(0);
    CHECK_STR(simd_name(), name);
}

/* The row kernels' paths, best first: as the CPU allows, AVX2, scalar. */
enum { N_PATHS = 3 };
static void use_path(int path) {
    simd_force_no_avx512(path == 1);
    simd_force_scalar(path == 2);
}

TEST(simd_dot) {
    init_lengths();
    float *a = malloc((MAX_N + 1) * sizeof *a), *b = malloc((MAX_N + 1) * sizeof *b);
    CHECK(a && b);
    if (!a || !b) return;
    int bad = 0;
    for (int rep = 0; rep < 3; rep++)
        for (int li = 0; li < n_lengths; li++) {
            const int64_t n = lengths[li];
            /* +1: unaligned; the scale spread makes cancellation and rounding matter */
            for (int64_t i = 0; i <= n; i++) {
                a[i] = uni() * ldexpf(1.0f, (int)(rnd() % 9) - 4);
                b[i] = uni();
            }
            const float want = ref_dot(a + 1, b + 1, n);
            const float v = simd_dot_f32(a + 1, b + 1, n);
            simd_force_scalar(1);
            const float s = simd_dot_f32(a + 1, b + 1, n);
            simd_force_scalar(0);
            if (!same_bits(v, want) || !same_bits(s, want)) {
                if (bad++ < 5) fprintf(stderr, "  dot n=%lld: %.9g / %.9g, want %.9g\n", (long long)n, v, s, want);
            }
            /* and close to the exact value */
            double exact = 0, mag = 0;
            for (int64_t i = 1; i <= n; i++) {
                exact += (double)a[i] * b[i];
                mag += fabs((double)a[i] * b[i]);
            }
            CHECK(fabs(v - exact) <= 1e-6 * (double)(n + 1) * mag + 1e-30);
        }
    CHECK_EQ_INT(bad, 0);
    CHECK(simd_dot_f32(a, b, 0) == 0.0f);
    free(a);
    free(b);
}

TEST(simd_axpy) {
    init_lengths();
    float *x = malloc((MAX_N + 1) * sizeof *x), *y0 = malloc((MAX_N + 2) * sizeof *y0),
          *y1 = malloc((MAX_N + 2) * sizeof *y1), *y2 = malloc((MAX_N + 2) * sizeof *y2);
    CHECK(x && y0 && y1 && y2);
    if (!x || !y0 || !y1 || !y2) return;
    int bad = 0;
    for (int li = 0; li < n_lengths; li++) {
        const int64_t n = lengths[li];
        const float a = uni() * 3.0f;
        for (int64_t i = 0; i <= n; i++) x[i] = uni();
        for (int64_t i = 0; i < n + 2; i++) y0[i] = y1[i] = y2[i] = uni() * 10.0f;
        for (int64_t i = 0; i < n; i++) y0[i + 1] = fmaf(a, x[i + 1], y0[i + 1]); /* the reference loop */
        simd_axpy_f32(y1 + 1, a, x + 1, n);
        simd_force_scalar(1);
        simd_axpy_f32(y2 + 1, a, x + 1, n);
        simd_force_scalar(0);
        /* the element before and after stay as they were */
        bad += memcmp(y0, y1, (size_t)(n + 2) * sizeof *y0) != 0;
        bad += memcmp(y0, y2, (size_t)(n + 2) * sizeof *y0) != 0;
    }
    CHECK_EQ_INT(bad, 0);
    free(x);
    free(y0);
    free(y1);
    free(y2);
}

TEST(simd_max) {
    init_lengths();
    float *x = malloc((MAX_N + 1) * sizeof *x);
    CHECK(x != NULL);
    if (!x) return;
    int bad = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int li = 0; li < n_lengths; li++) {
            const int64_t n = lengths[li];
            for (int64_t i = 0; i <= n; i++) x[i] = uni() * 100.0f - (mode == 1 ? 1000.0f : 0.0f);
            if (mode == 2 && n > 0) /* NaNs are skipped */
                for (int k = 0; k < 3; k++) x[1 + rnd() % (uint32_t)n] = NAN;
            if (mode == 3 && n > 0) x[1 + rnd() % (uint32_t)n] = rnd() & 1 ? INFINITY : -INFINITY;
            float want = -INFINITY;
            for (int64_t i = 1; i <= n; i++)
                if (x[i] > want) want = x[i];
            const float v = simd_max_f32(x + 1, n);
            simd_force_scalar(1);
            const float s = simd_max_f32(x + 1, n);
            simd_force_scalar(0);
            if (!same_bits(v, want) || !same_bits(s, want)) {
                if (bad++ < 5) fprintf(stderr, "  max n=%lld mode %d: %g / %g, want %g\n", (long long)n, mode, v, s, want);
            }
        }
    CHECK_EQ_INT(bad, 0);
    /* empty, all NaN, the maximum in the tail */
    CHECK(simd_max_f32(x, 0) == -INFINITY);
    for (int i = 0; i < 20; i++) x[i] = NAN;
    CHECK(simd_max_f32(x, 20) == -INFINITY);
    for (int i = 0; i < 19; i++) x[i] = (float)i;
    x[18] = 100.0f;
    CHECK(simd_max_f32(x, 19) == 100.0f);
    free(x);
}

/* How far the AVX2 exp may be from this libm's expf: glibc's expf is the
 * algorithm it reproduces, so 0 there; 1 ulp elsewhere. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 28))
enum { EXP_ULP = 0 };
#else
enum { EXP_ULP = 1 };
#endif

static int exp_close(float got, float want) {
    if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
    if (isinf(got) || isinf(want) || got == 0.0f || want == 0.0f) return same_bits(got, want);
    return ulp_diff(got, want) <= EXP_ULP;
}

/* Checks one simd_exp_sub_sum call on the current path against expf. */
static int check_exp(const float *in, int64_t n, float mx, float *p, double *sum_out) {
    memcpy(p, in, (size_t)n * sizeof *p);
    const double sum = simd_exp_sub_sum(p, n, mx);
    int bad = 0;
    double acc[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        const float x = in[i] - mx, want = expf(x);
        if (!exp_close(p[i], want) && bad++ < 5) fprintf(stderr, "  exp(%.9g) = %.9g, expf %.9g\n", x, p[i], want);
        acc[i % 8] += p[i];
    }
    const double s2 = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    if (memcmp(&sum, &s2, sizeof sum) != 0 && !(isnan(sum) && isnan(s2))) {
        fprintf(stderr, "  sum %.17g, stored values add to %.17g\n", sum, s2);
        bad++;
    }
    *sum_out = sum;
    return bad;
}

TEST(simd_exp_sum) {
    init_lengths();
    float *in = malloc(MAX_N * sizeof *in), *p = malloc((MAX_N + 1) * sizeof *p);
    CHECK(in && p);
    if (!in || !p) return;
    int bad = 0;
    for (int mode = 0; mode < 3; mode++)
        for (int li = 0; li < n_lengths; li++) {
            const int64_t n = lengths[li];
            /* attention-like scores: the maximum subtracted, differences down to -40 */
            for (int64_t i = 0; i < n; i++) in[i] = uni() * 20.0f;
            float mx = simd_max_f32(in, n);
            if (n == 0) mx = 0.0f;
            if (mode == 1 && n > 0) { /* out-of-range and special lanes */
                in[rnd() % (uint32_t)n] = mx - 100.0f;
                in[rnd() % (uint32_t)n] = mx - 88.0f;
                in[rnd() % (uint32_t)n] = -INFINITY;
                in[rnd() % (uint32_t)n] = mx + 88.5f;
                in[rnd() % (uint32_t)n] = NAN;
            }
            if (mode == 2) mx = -5.0f; /* positive differences up to 25 */
            double sum[N_PATHS]; /* the last path is the scalar one */
            for (int path = 0; path < N_PATHS; path++) {
                use_path(path);
                bad += check_exp(in, n, mx, p + 1, &sum[path]);
            }
            use_path(0);
            const double ss = sum[N_PATHS - 1];
            for (int path = 0; path < N_PATHS - 1; path++) {
                const double sv = sum[path];
                if (EXP_ULP == 0 && memcmp(&sv, &ss, sizeof sv) != 0 && !(isnan(sv) && isnan(ss))) {
                    if (bad++ < 5)
                        fprintf(stderr, "  n=%lld mode %d path %d: sum %.17g, scalar %.17g\n", (long long)n, mode, path, sv, ss);
                }
                if (n == 0) CHECK(sv == 0.0);
            }
            if (n == 0) CHECK(ss == 0.0);
        }
    CHECK_EQ_INT(bad, 0);
    free(in);
    free(p);
}

/* [-104, 89] (where expf goes from 0 to infinity) in steps of 2^-12, plus
 * random points: within EXP_ULP of expf, on the AVX-512 and the AVX2 path. */
TEST(simd_exp_sweep) {
    for (int path = 0; path < 2; path++) {
        use_path(path);
        enum { CHUNK = 4096 };
        float in[CHUNK], p[CHUNK];
        int64_t worst = 0, count = 0, bad = 0;
        float worst_x = 0;
        for (double x0 = -104.0; x0 < 89.0; x0 += CHUNK / 4096.0) {
            for (int k = 0; k < CHUNK; k++) in[k] = (float)(x0 + k / 4096.0);
            memcpy(p, in, sizeof p);
            simd_exp_sub_sum(p, CHUNK, 0.0f);
            for (int k = 0; k < CHUNK; k++, count++) {
                const float want = expf(in[k]);
                bad += !exp_close(p[k], want);
                const int64_t d = isfinite(want) && want != 0.0f ? ulp_diff(p[k], want) : 0;
                if (d > worst) {
                    worst = d;
                    worst_x = in[k];
                }
            }
        }
        for (int rep = 0; rep < 64; rep++) {
            for (int k = 0; k < CHUNK; k++) in[k] = uni() * 88.0f;
            memcpy(p, in, sizeof p);
            simd_exp_sub_sum(p, CHUNK, 0.0f);
            for (int k = 0; k < CHUNK; k++, count++) bad += !exp_close(p[k], expf(in[k]));
        }
        if (getenv("VERBOSE") || bad)
            fprintf(stderr, "  %s exp: %lld points, %lld off, worst %lld ulp at %.9g\n", simd_name(), (long long)count,
                    (long long)bad, (long long)worst, worst_x);
        CHECK_EQ_INT(bad, 0);
    }
    use_path(0);
}

/* simd_rmsnorm: the same bits on both paths, and within 1 ulp of the
 * norm computed with one sequential double sum (the backend's loop before
 * the eight partial sums), every length, unaligned, with eps. */
TEST(simd_rmsnorm_paths_agree) {
    init_lengths();
    float *x = malloc((MAX_N + 1) * sizeof *x), *w = malloc(MAX_N * sizeof *w);
    float *a = malloc(MAX_N * sizeof *a), *b = malloc(MAX_N * sizeof *b);
    CHECK(x && w && a && b);
    if (!x || !w || !a || !b) return;
    int bad = 0;
    for (int li = 0; li < n_lengths; li++) {
        const int64_t n = lengths[li];
        for (int64_t i = 0; i < n; i++) x[1 + i] = uni() * (i % 7 ? 3.0f : 40.0f), w[i] = 0.5f + uni();
        simd_rmsnorm(a, x + 1, w, n, 1e-5f);
        simd_force_scalar(1);
        simd_rmsnorm(b, x + 1, w, n, 1e-5f);
        simd_force_scalar(0);
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += (double)x[1 + i] * x[1 + i];
        const float scale = (float)(1.0 / sqrt(ss / (double)n + 1e-5f));
        for (int64_t i = 0; i < n; i++) {
            const float want = x[1 + i] * scale * w[i];
            if ((!same_bits(a[i], b[i]) || ulp_diff(a[i], want) > 1) && bad++ < 5)
                fprintf(stderr, "  n=%lld i=%lld: %.9g, scalar %.9g, sequential sum %.9g\n", (long long)n, (long long)i,
                        a[i], b[i], want);
        }
    }
    CHECK_EQ_INT(bad, 0);
    free(x);
    free(w);
    free(a);
    free(b);
}

/* simd_swiglu against the backend's original loop (g / (1 + expf(-g)) * up,
 * libm's expf): gate values of activations (|g| < 12), beyond +-88 where expf
 * over- and underflows, infinities and NaN, every length, unaligned; within
 * EXP_ULP of the loop (0: bit for bit) on both paths. */
TEST(simd_swiglu_matches_the_loop) {
    init_lengths();
    float *g = malloc((MAX_N + 1) * sizeof *g), *up = malloc(MAX_N * sizeof *up), *in = malloc(MAX_N * sizeof *in);
    CHECK(g && up && in);
    if (!g || !up || !in) return;
    int bad = 0;
    for (int path = 0; path < 2; path++) {
        simd_force_scalar(path);
        for (int mode = 0; mode < 2; mode++)
            for (int li = 0; li < n_lengths; li++) {
                const int64_t n = lengths[li];
                for (int64_t i = 0; i < n; i++) in[i] = uni() * 12.0f, up[i] = uni() * 3.0f;
                if (mode == 1 && n > 0) {
                    in[rnd() % (uint32_t)n] = 95.0f;
                    in[rnd() % (uint32_t)n] = -95.0f;
                    in[rnd() % (uint32_t)n] = -88.5f;
                    in[rnd() % (uint32_t)n] = INFINITY;
                    in[rnd() % (uint32_t)n] = -INFINITY;
                    in[rnd() % (uint32_t)n] = NAN;
                }
                memcpy(g + 1, in, (size_t)n * sizeof *g);
                simd_swiglu(g + 1, up, n);
                for (int64_t i = 0; i < n; i++) {
                    const float want = in[i] / (1.0f + expf(-in[i])) * up[i], got = g[1 + i];
                    const int ok = isnan(want) ? isnan(got)
                                   : EXP_ULP == 0 || isinf(want) || want == 0.0f ? same_bits(got, want)
                                                                                   : ulp_diff(got, want) <= 2 * EXP_ULP;
                    if (!ok && bad++ < 5)
                        fprintf(stderr, "  %s swiglu(%.9g, %.9g) = %.9g, loop %.9g\n", simd_name(), in[i], up[i], got,
                                want);
                }
            }
    }
    simd_force_scalar(0);
    CHECK_EQ_INT(bad, 0);
    free(g);
    free(up);
    free(in);
}

/* The batched forms equal the row-by-row loops bit for bit on every path,
 * for every query of a batch: rows 0..9, 37 and 130 (the tiles' row tails;
 * more than 64: the value blocks), queries 1..6, 9 and 17 (the tiles, their
 * tails, more than the AVX-512 dot's block of 16), every length 0..67 and
 * some long ones, strides wider than a row, unaligned. */
TEST(simd_rows) {
    init_lengths();
    static const int64_t row_counts[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 37, 130};
    static const int query_counts[] = {1, 2, 3, 4, 5, 6, 9, 17};
    enum { MAX_ROWS = 130, MAX_Q = 17 };
    int bad = 0, cases = 0;
    for (int li = 0; li < n_lengths; li++) {
        const int64_t n = lengths[li];
        if (n > (TEST_SANITIZED ? 264 : 1040)) continue; /* (the long rows cost minutes under the sanitizers) */
        const int64_t stride = n + 3, ys = n + 2;
        float *a = malloc((size_t)(MAX_Q * stride + 1) * sizeof *a), *b = malloc((size_t)(stride * MAX_ROWS + 1) * sizeof *b);
        float *w = malloc(MAX_Q * MAX_ROWS * sizeof *w), *y0 = malloc((size_t)(MAX_Q * ys) * sizeof *y0),
              *y1 = malloc((size_t)(MAX_Q * ys) * sizeof *y1), *y_init = malloc((size_t)(MAX_Q * ys) * sizeof *y_init);
        float *want = malloc(MAX_Q * (MAX_ROWS + 1) * sizeof *want), *got = malloc(MAX_Q * (MAX_ROWS + 1) * sizeof *got);
        CHECK(a && b && w && y0 && y1 && y_init && want && got);
        if (!a || !b || !w || !y0 || !y1 || !y_init || !want || !got) return;
        for (int64_t i = 0; i <= MAX_Q * stride; i++) a[i] = uni();
        for (int64_t i = 0; i <= stride * MAX_ROWS; i++) b[i] = uni() * 4.0f;
        for (int k = 0; k < MAX_Q * MAX_ROWS; k++) w[k] = uni();
        const float *qs[MAX_Q];
        float *y1s[MAX_Q];
        for (int q = 0; q < MAX_Q; q++) {
            qs[q] = a + 1 + q * stride;
            y1s[q] = y1 + q * ys + 1;
        }
        const float scale = 0.125f + uni() * 0.01f;
        for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++)
            for (size_t qi = 0; qi < sizeof query_counts / sizeof query_counts[0]; qi++, cases++) {
                const int64_t rows = row_counts[ri], os = rows + 1;
                const int nq = query_counts[qi];
                for (int q = 0; q < nq; q++)
                    for (int64_t k = 0; k < rows; k++) want[q * os + k] = ref_dot(qs[q], b + 1 + k * stride, n) * scale;
                for (int64_t i = 0; i < MAX_Q * ys; i++) y0[i] = y_init[i] = uni();
                for (int q = 0; q < nq; q++) /* the reference loop, key by key */
                    for (int64_t k = 0; k < rows; k++)
                        for (int64_t i = 0; i < n; i++)
                            y0[q * ys + i + 1] = fmaf(w[q * MAX_ROWS + k], b[1 + k * stride + i], y0[q * ys + i + 1]);
                for (int path = 0; path < N_PATHS; path++) {
                    for (int q = 0; q < nq; q++) { /* the element past the last row stays */
                        want[q * os + rows] = got[q * os + rows] = -7.0f;
                        for (int64_t k = 0; k < rows; k++) got[q * os + k] = NAN;
                    }
                    use_path(path);
                    simd_dot_rows_f32(got, os, qs, nq, b + 1, stride, rows, n, scale);
                    memcpy(y1, y_init, (size_t)(MAX_Q * ys) * sizeof *y1);
                    simd_axpy_rows_f32(y1s, nq, w, MAX_ROWS, b + 1, stride, rows, n);
                    use_path(0);
                    bad += memcmp(got, want, (size_t)(nq * os) * sizeof *got) != 0;
                    bad += memcmp(y0, y1, (size_t)(MAX_Q * ys) * sizeof *y0) != 0;
                }
            }
        free(a);
        free(b);
        free(w);
        free(y0);
        free(y1);
        free(y_init);
        free(want);
        free(got);
    }
    CHECK_EQ_INT(bad, 0);
    if (getenv("VERBOSE")) fprintf(stderr, "  %d (length, rows, queries) cases, kernels %s\n", cases, simd_name());
}

/* f16 rows: the same bits as the f32 kernels on the converted rows, on every
 * path, for row lengths around the vector width and beyond the scalar
 * path's stack buffer, 0..9 rows, unaligned. */
TEST(simd_rows_f16) {
    static const int64_t lengths[] = {0, 1, 7, 8, 9, 16, 31, 64, 65, 127, 128, 256, 300};
    enum { ROWS = 9 };
    int bad = 0;
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        const int64_t n = lengths[li], stride = n + 5;
        float *a = malloc((size_t)(n + 1) * sizeof *a), *bf = malloc((size_t)(stride * ROWS + 1) * sizeof *bf);
        uint16_t *bh = malloc((size_t)(stride * ROWS + 1) * sizeof *bh);
        enum { NQ = 3 };
        float w[NQ * ROWS], want[NQ * ROWS], got[NQ * ROWS], *y0 = malloc((size_t)NQ * (n + 1) * sizeof *y0),
                                                            *y1 = malloc((size_t)NQ * (n + 1) * sizeof *y1);
        CHECK(a && bf && bh && y0 && y1);
        if (!a || !bf || !bh || !y0 || !y1) return;
        for (int64_t i = 0; i <= n; i++) a[i] = uni();
        for (int64_t i = 0; i <= stride * ROWS; i++) {
            _Float16 h = (_Float16)(uni() * 3.0f);
            memcpy(&bh[i], &h, sizeof h);
            bf[i] = (float)h;
        }
        for (int k = 0; k < NQ * ROWS; k++) w[k] = uni();
        const float *qs[NQ] = {a + 1, a + 1, a}; /* the same query twice: each output its own */
        float *y0s[NQ] = {y0, y0 + (n + 1), y0 + 2 * (n + 1)}, *y1s[NQ] = {y1, y1 + (n + 1), y1 + 2 * (n + 1)};
        for (int rows = 0; rows <= ROWS; rows++)
            for (int path = 0; path < N_PATHS; path++) {
                use_path(path);
                simd_dot_rows_f32(want, ROWS, qs, NQ, bf + 1, stride, rows, n, 0.125f);
                simd_dot_rows_f16(got, ROWS, qs, NQ, bh + 1, stride, rows, n, 0.125f);
                for (int q = 0; q < NQ; q++) bad += memcmp(want + q * ROWS, got + q * ROWS, (size_t)rows * sizeof *got) != 0;
                for (int64_t i = 0; i < NQ * (n + 1); i++) y0[i] = y1[i] = uni();
                simd_axpy_rows_f32(y0s, NQ, w, ROWS, bf + 1, stride, rows, n);
                simd_axpy_rows_f16(y1s, NQ, w, ROWS, bh + 1, stride, rows, n);
                bad += memcmp(y0, y1, (size_t)NQ * (n + 1) * sizeof *y0) != 0;
            }
        use_path(0);
        free(a);
        free(bf);
        free(bh);
        free(y0);
        free(y1);
    }
    CHECK_EQ_INT(bad, 0);
}
