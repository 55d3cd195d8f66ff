/* Tests of the llama.cpp-compatible activation formats and integer dot
 * products of engine/quant.c (quant_quantize_act, quant_vec_dot, ...).
 *
 *  - activation round trip: dequantising Q8_0 / Q8_1 / Q8_K activations gives
 *    back x within d/2 per element (plus the rounding of d to a half), ties
 *    round to even, Q8_1's s is half(d * sum(qs)), Q8_K's d and bsums;
 *  - quant_vec_dot equals a double dot of the dequantised row and activations
 *    within float rounding (plus, for Q4_1 / Q5_1, the half rounding of s), for
 *    every weight type on random valid blocks, 1, 3, 7 and 9 blocks, with
 *    normal, all-zero, one-huge-value and tiny activations;
 *  - the AVX2 kernels return the same bits as the scalar ones, and integer
 *    parts are exact (a setup where every float step is exact);
 *  - golden values: results of ggml's own ggml_vec_dot_* (an x86 AVX2/AVX-512
 *    build of llama.cpp's ggml) on the deterministic inputs of gen_case()
 *    (tests/quant_cases.h), which quant_vec_dot must reproduce bit for bit;
 *    tests/reference/ggml_vec_dot_golden.c records them (make check-ggml-vec-dot).
 * Run with VERBOSE=1 to print per-type counts and maximum errors. */
#include "test.h"

#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/quant_cases.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>

static const uint32_t weight_types[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
    GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};
enum { N_TYPES = sizeof weight_types / sizeof weight_types[0] };

/* ---- helpers ---------------------------------------------------------------------- */

static float half_of(const uint8_t *p) {
    return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static float vec_dot_path(int scalar, uint32_t type, const void *row, const void *act, int64_t n) {
    quant_force_scalar(scalar);
    const float r = quant_vec_dot(type, row, act, n);
    quant_force_scalar(0);
    return r;
}

enum { MAX_N = 9 * 256 };

/* ---- API basics ------------------------------------------------------------------- */

TEST(quant_dot_types) {
    static const struct {
        uint32_t type, act;
    } want[] = {
        {GGML_TYPE_F32, GGML_TYPE_F32},   {GGML_TYPE_F16, GGML_TYPE_F16},   {GGML_TYPE_BF16, GGML_TYPE_BF16},
        {GGML_TYPE_Q4_0, GGML_TYPE_Q8_0}, {GGML_TYPE_Q4_1, GGML_TYPE_Q8_1}, {GGML_TYPE_Q5_0, GGML_TYPE_Q8_0},
        {GGML_TYPE_Q5_1, GGML_TYPE_Q8_1}, {GGML_TYPE_Q8_0, GGML_TYPE_Q8_0}, {GGML_TYPE_Q2_K, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q3_K, GGML_TYPE_Q8_K}, {GGML_TYPE_Q4_K, GGML_TYPE_Q8_K}, {GGML_TYPE_Q5_K, GGML_TYPE_Q8_K},
        {GGML_TYPE_Q6_K, GGML_TYPE_Q8_K},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK_EQ_INT(quant_vec_dot_type(want[i].type), want[i].act);
    static const uint32_t none[] = {GGML_TYPE_Q8_1, GGML_TYPE_Q8_K, 4, 5, 39, 40, 1000};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        CHECK_EQ_INT(quant_vec_dot_type(none[i]), GGML_TYPE_COUNT_);
        CHECK_EQ_INT(quant_act_row_bytes(none[i], 256), 0);
    }
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_Q4_0, 576), 18 * 34);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_Q4_1, 576), 18 * 36);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_Q8_0, 32), 34);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_Q4_K, 512), 2 * 292);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_Q6_K, 256), 292);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_F16, 7), 14);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_BF16, 7), 14);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_F32, 7), 28);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_Q4_0, 48), 0);  /* not whole blocks */
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_Q4_K, 288), 0); /* whole Q8_0 blocks, not Q4_K ones */
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_Q4_0, 0), 0);
    CHECK_EQ_INT(quant_act_row_bytes(GGML_TYPE_F32, -32), 0);
    /* a type with no dot product reads as 0, touching nothing */
    uint8_t blk[292] = {0};
    CHECK(quant_vec_dot(GGML_TYPE_Q8_K, blk, blk, 256) == 0.0f);
    CHECK(quant_vec_dot(GGML_TYPE_Q4_0, blk, blk, 48) == 0.0f);
    const char *name = quant_simd_name();
    CHECK(strcmp(name, "avx2+vnni") == 0 || strcmp(name, "avx2") == 0 || strcmp(name, "scalar") == 0);
    quant_force_scalar(1);
    CHECK_STR(quant_simd_name(), "scalar");
    quant_force_scalar(0);
    CHECK_STR(quant_simd_name(), name);
    quant_force_no_vnni(1);
    CHECK_STR(quant_simd_name(), strcmp(name, "avx2+vnni") == 0 ? "avx2" : name);
    quant_force_no_vnni(0);
    if (getenv("VERBOSE")) fprintf(stderr, "  quant_vec_dot kernels: %s\n", name);
}

/* ---- activation formats -------------------------------------------------------------- */

TEST(quant_dot_act_roundtrip) {
    static const uint32_t via[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K,
                                   GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_F32};
    static float x[MAX_N], y[MAX_N];
    static uint8_t act[MAX_N * 2 + 4096];
    for (size_t v = 0; v < sizeof via / sizeof via[0]; v++) {
        const uint32_t wt = via[v], at = quant_vec_dot_type(wt);
        const int64_t qk = at == GGML_TYPE_Q8_K ? 256 : 32;
        double worst = 0; /* max |x - y| / d */
        int checked = 0;
        for (int nb = 1; nb <= 9; nb += 2) {
            for (int mode = 0; mode < 5; mode++) {
                gen_state = 0x1234567ull + (uint64_t)(nb * 31 + mode * 7 + v);
                const int64_t n = qk * nb;
                gen_act(x, n, mode);
                CHECK(quant_act_row_bytes(wt, n) <= sizeof act);
                quant_quantize_act(wt, x, act, n);
                quant_dequantize_act(wt, act, y, n);
                checked++;
                if (at == GGML_TYPE_F32) {
                    CHECK(memcmp(x, y, (size_t)n * 4) == 0);
                    continue;
                }
                if (at == GGML_TYPE_F16 || at == GGML_TYPE_BF16) {
                    const double rel = at == GGML_TYPE_F16 ? 0x1p-11 : 0x1p-8;
                    for (int64_t i = 0; i < n; i++)
                        if (!(fabs((double)x[i] - y[i]) <= rel * fabs((double)x[i]) + 0x1p-25)) {
                            CHECK(!"f16/bf16 activation not within half an ulp");
                            break;
                        }
                    continue;
                }
                for (int64_t b = 0; b < nb; b++) {
                    const float *xb = x + b * qk, *yb = y + b * qk;
                    float amax = 0.0f, max = 0.0f;
                    for (int64_t i = 0; i < qk; i++)
                        if (fabsf(xb[i]) > amax) {
                            amax = fabsf(xb[i]);
                            max = xb[i];
                        }
                    const uint8_t *blk = act + b * quant_block_bytes(at);
                    const int8_t *qs = (const int8_t *)(blk + (at == GGML_TYPE_Q8_0 ? 2 : 4));
                    double d_true, d_used;
                    if (at == GGML_TYPE_Q8_K) {
                        float d;
                        memcpy(&d, blk, 4);
                        /* d = 1/iscale with iscale = -127/max, the signed element of largest |x| */
                        const float want = amax == 0.0f ? 0.0f : 1 / (-127.f / max);
                        CHECK(float_bits(d) == float_bits(want));
                        d_true = d_used = fabs((double)d);
                        for (int j = 0; j < 16; j++) {
                            int s = 0;
                            int16_t bs;
                            for (int l = 0; l < 16; l++) s += qs[16 * j + l];
                            memcpy(&bs, blk + 4 + 256 + 2 * j, 2);
                            CHECK_EQ_INT(bs, s);
                        }
                    } else {
                        const float d = amax / 127.f;
                        CHECK_EQ_INT((blk[0] | (blk[1] << 8)), quant_f32_to_f16(d));
                        d_true = d;
                        d_used = half_of(blk);
                        if (at == GGML_TYPE_Q8_1) { /* s = half(d * sum(qs)), with the f32 d */
                            int sum = 0;
                            for (int j = 0; j < 32; j++) sum += qs[j];
                            CHECK_EQ_INT((blk[2] | (blk[3] << 8)), quant_f32_to_f16(d * (float)sum));
                        }
                    }
                    for (int64_t i = 0; i < qk; i++) {
                        CHECK(qs[i] >= -127 && qs[i] <= 127);
                        /* |x - q*d_used| <= d/2 + |q| * |d - d_used| (the half rounding of d), plus f32 slack */
                        const double err = fabs((double)xb[i] - yb[i]);
                        const double tol = d_true / 2 + fabs((double)qs[i]) * fabs(d_true - d_used) +
                                           4 * FLT_EPSILON * (fabs((double)xb[i]) + d_true);
                        if (!(err <= tol)) {
                            fprintf(stderr, "  %s act block %lld [%lld]: x %g, back %g, d %g\n", quant_type_name(at),
                                    (long long)b, (long long)i, xb[i], yb[i], d_true);
                            CHECK(err <= tol);
                        }
                        if (err / tol > worst) worst = err / tol;
                    }
                    if (amax > 0) { /* the element of largest |x| maps to +-127 */
                        int hit = 0;
                        for (int64_t i = 0; i < qk; i++) hit |= (fabsf(xb[i]) == amax && (qs[i] == 127 || qs[i] == -127));
                        CHECK(hit);
                    }
                }
            }
        }
        if (getenv("VERBOSE"))
            fprintf(stderr, "  act %-4s (for %s): %d rows, max |x - back| / bound = %.4f\n", quant_type_name(at),
                    quant_type_name(wt), checked, worst);
    }
}

/* Ties: x*id exactly half-way rounds to even (llama.cpp's x86 quantize_row_q8_0
 * and q8_1 use _mm256_round_ps, quantize_row_q8_K nearest_int). With amax =
 * 127, id = 1 and d = 1 exactly. */
TEST(quant_dot_act_ties) {
    float x[256];
    uint8_t act[292 * 1];
    static const float in[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f, 3.49f, -3.51f};
    static const int out[] = {0, 2, 2, 0, -2, -2, 126, -126, 3, -4};
    for (int t = 0; t < 3; t++) {
        const uint32_t wt = t == 0 ? GGML_TYPE_Q8_0 : t == 1 ? GGML_TYPE_Q4_1 : GGML_TYPE_Q4_K;
        const int qk = t == 2 ? 256 : 32, off = t == 0 ? 2 : 4;
        for (int i = 0; i < qk; i++) x[i] = 0.0f;
        x[qk - 1] = t == 2 ? -127.0f : 127.0f; /* Q8_K: max = -127 gives iscale = 1 */
        for (int i = 0; i < 10; i++) x[i] = in[i];
        quant_quantize_act(wt, x, act, qk);
        for (int i = 0; i < 10; i++) CHECK_EQ_INT((int8_t)act[off + i], out[i]);
        CHECK_EQ_INT((int8_t)act[off + qk - 1], t == 2 ? -127 : 127);
    }
}

/* ---- dot products ------------------------------------------------------------------- */

typedef struct {
    int rows, zero_rows;
    double max_rel, max_rel_parts;
} dot_stats;

/* Byte ranges of the quants in a block ({start, end} pairs, end exclusive). */
static void quant_ranges(uint32_t type, int r[4]) {
    r[0] = r[1] = r[2] = r[3] = 0;
    switch (type) {
    case GGML_TYPE_Q4_0: r[0] = 2; r[1] = 18; break;
    case GGML_TYPE_Q4_1: r[0] = 4; r[1] = 20; break;
    case GGML_TYPE_Q5_0: r[0] = 2; r[1] = 22; break;
    case GGML_TYPE_Q5_1: r[0] = 4; r[1] = 24; break;
    case GGML_TYPE_Q8_0: r[0] = 2; r[1] = 34; break;
    case GGML_TYPE_Q2_K: r[0] = 16; r[1] = 80; break;
    case GGML_TYPE_Q3_K: r[0] = 0; r[1] = 96; break;
    case GGML_TYPE_Q4_K: r[0] = 16; r[1] = 144; break;
    case GGML_TYPE_Q5_K: r[0] = 16; r[1] = 176; break;
    case GGML_TYPE_Q6_K: r[0] = 0; r[1] = 192; break;
    default: break;
    }
}

/* Checks quant_vec_dot of one row against the double dot of the dequantised
 * row and activations, and the scalar kernels against the SIMD ones.
 *
 * The bound: the kernels sum integer parts exactly, but what they round in
 * float are partial sums of the unsigned quants and of the offsets (ggml's
 * Q4_1 adds m*s apart from d*q*y; Q6_K subtracts 32*scale*bsums from the
 * products of the unsigned quants), which can be far larger than the terms
 * w_i*y_i when they cancel (a huge activation against a zero weight). So the
 * magnitude is P = sum (|w_i| + |o_i|) * |y_i|, o_i = the element's value at
 * quant 0 (all quant bits cleared: m, -dmin*min, -32*d*scale, ...), and the
 * tolerance 64 ulps of P. For Q4_1 / Q5_1 add the half rounding of s (and of
 * the activation d, which can underflow to 0 while s does not). */
static void check_dot(uint32_t type, const uint8_t *row, const float *x, int64_t n, dot_stats *st, const char *what) {
    static uint8_t act[MAX_N * 4], zrow[MAX_N * 4];
    static float w[MAX_N], y[MAX_N], o[MAX_N];
    quant_quantize_act(type, x, act, n);
    quant_dequantize_row(type, row, w, n);
    quant_dequantize_act(type, act, y, n);
    const size_t rb = quant_row_bytes(type, (uint64_t)n), wb = quant_block_bytes(type);
    memcpy(zrow, row, rb);
    int qr[4];
    quant_ranges(type, qr);
    if (qr[1] > 0)
        for (size_t b = 0; b < rb; b += wb) memset(zrow + b + qr[0], 0, (size_t)(qr[1] - qr[0]));
    if (quant_block_elems(type) == 1) memset(o, 0, (size_t)n * sizeof *o);
    else quant_dequantize_row(type, zrow, o, n);
    double ref = 0, mag = 0, parts = 0, s_err = 0;
    int all_zero = 1;
    for (int64_t i = 0; i < n; i++) {
        ref += (double)w[i] * y[i];
        mag += fabs((double)w[i] * y[i]);
        parts += (fabs((double)w[i]) + fabs((double)o[i])) * fabs((double)y[i]);
        all_zero &= x[i] == 0.0f;
    }
    if (type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1) {
        /* |s - half(d) * sum q| <= |s - d*sum q| + |d - half(d)| * |sum q| */
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *ab = act + 36 * b;
            double sq = 0, amax = 0;
            for (int j = 0; j < 32; j++) {
                sq += fabs((double)(int8_t)ab[4 + j]);
                if (fabs((double)x[32 * b + j]) > amax) amax = fabs((double)x[32 * b + j]);
            }
            const double d = amax / 127;
            s_err += fabs((double)half_of(row + wb * (size_t)b + 2)) *
                     ((fabs((double)half_of(ab + 2)) * 0x1p-11 + 0x1p-24) + sq * (d * 0x1p-11 + 0x1p-24)) * 1.01;
        }
    }
    const float scalar = vec_dot_path(1, type, row, act, n);
    const float simd = vec_dot_path(0, type, row, act, n);
    if (float_bits(scalar) != float_bits(simd)) {
        fprintf(stderr, "  %s %s n=%lld: scalar %.9g != simd %.9g\n", quant_type_name(type), what, (long long)n, scalar, simd);
        CHECK(float_bits(scalar) == float_bits(simd));
    }
    const double tol = 64 * FLT_EPSILON * parts + s_err + 1e-30;
    const double err = fabs((double)simd - ref);
    if (!(err <= tol)) {
        fprintf(stderr, "  %s %s n=%lld: dot %.9g, expected %.9g (tol %g)\n", quant_type_name(type), what, (long long)n, simd,
                ref, tol);
        CHECK(err <= tol);
    }
    if (mag > 0 && err / mag > st->max_rel) st->max_rel = err / mag;
    if (s_err == 0 && parts > 0 && err / parts > st->max_rel_parts) st->max_rel_parts = err / parts;
    if (s_err > 0 && err / tol > st->max_rel_parts) st->max_rel_parts = err / tol;
    if (all_zero) {
        st->zero_rows++;
        CHECK(simd == 0.0f);
    }
    st->rows++;
}

TEST(quant_dot_vs_dequantised) {
    static uint8_t row[MAX_N * 4];
    static float x[MAX_N];
    for (size_t t = 0; t < N_TYPES; t++) {
        const uint32_t type = weight_types[t];
        dot_stats st = {0};
        for (int idx = 0; idx < 60; idx++) {
            const int64_t n = gen_case(type, idx, row, x);
            check_dot(type, row, x, n, &st, "random");
        }
        /* F32/F16/BF16: lengths that are not multiples of 8 */
        if (quant_block_elems(type) == 1)
            for (int64_t n = 1; n < 40; n += 3) {
                gen_state = 77 + (uint64_t)n;
                gen_row(type, row, n);
                gen_act(x, n, 0);
                check_dot(type, row, x, n, &st, "odd length");
            }
        if (getenv("VERBOSE"))
            fprintf(stderr, "  dot %-4s: %3d rows (%d all-zero activations): max |dot - ref| / P = %.3g%s, / sum|w y| = %.3g\n",
                    quant_type_name(type), st.rows, st.zero_rows, st.max_rel_parts,
                    type == GGML_TYPE_Q4_1 || type == GGML_TYPE_Q5_1 ? " (of the tolerance, s rounding included)" : "",
                    st.max_rel);
    }
}

/* Every float step exact: weight scales 1 (mins 1 or 0), activations small
 * integers with an element +-127 per block so that the activation d is 1. The
 * dot is then an integer, which both kernels must return exactly. */
TEST(quant_dot_integer_exact) {
    static uint8_t row[MAX_N * 4], act[MAX_N * 4];
    static float x[MAX_N], w[MAX_N];
    const uint16_t one = quant_f32_to_f16(1.0f);
    for (size_t t = 0; t < N_TYPES; t++) {
        const uint32_t type = weight_types[t];
        const uint32_t qk = quant_block_elems(type);
        if (qk == 1) continue;
        for (int rep = 0; rep < 8; rep++) {
            gen_state = 0xabcdefull + t * 100 + (uint64_t)rep;
            const int nb = 1 + 2 * (rep % 5);
            const int64_t n = (int64_t)qk * nb;
            gen_row(type, row, n);
            const size_t bb = quant_block_bytes(type);
            int off[2];
            quant_scale_offsets(type, off);
            for (int b = 0; b < nb; b++) {
                uint8_t *blk = row + bb * (size_t)b;
                for (int k = 0; k < 2; k++)
                    if (off[k] >= 0) put_u16(blk + off[k], one);
                if (type == GGML_TYPE_Q6_K) /* keep the sum below 2^24 */
                    for (int j = 0; j < 16; j++) blk[192 + j] = (uint8_t)(int8_t)((int)(gen_u32() % 9) - 4);
            }
            const int64_t ablk = quant_vec_dot_type(type) == GGML_TYPE_Q8_K ? 256 : 32;
            for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(gen_u32() % 7) - 3);
            for (int64_t b = 0; b < n / ablk; b++) x[b * ablk + (int64_t)(gen_u32() % (uint32_t)ablk)] = ablk == 256 ? -127.0f : 127.0f;
            quant_quantize_act(type, x, act, n);
            quant_dequantize_row(type, row, w, n);
            double ref = 0;
            for (int64_t i = 0; i < n; i++) ref += (double)w[i] * x[i];
            CHECK(fabs(ref) < 16777216.0 && ref == floor(ref));
            const float scalar = vec_dot_path(1, type, row, act, n), simd = vec_dot_path(0, type, row, act, n);
            if ((double)scalar != ref || (double)simd != ref) {
                fprintf(stderr, "  %s nb=%d: scalar %.9g simd %.9g, exact %.1f\n", quant_type_name(type), nb, scalar, simd, ref);
                CHECK((double)scalar == ref && (double)simd == ref);
            }
        }
    }
}

/* The default model: rows of its Q4_1 matrices and of the Q8_0 token_embd
 * (the tied output matrix) against random activations. */
TEST(quant_dot_smollm2_rows) {
    const char *model = test_model_path();
    CHECK(model != NULL);
    if (!model) return;
    char err[256];
    gguf_file *f = gguf_open(model, err, sizeof err);
    if (!f) fprintf(stderr, "  %s: %s\n", model, err);
    CHECK(f != NULL);
    if (!f) return;
    static float x[MAX_N];
    dot_stats st[GGML_TYPE_COUNT_] = {{0}};
    int tensors = 0;
    for (uint64_t t = 0; t < f->n_tensors; t++) {
        const gguf_tensor *T = &f->tensors[t];
        const int64_t n = (int64_t)T->ne[0];
        if (T->n_dims != 2 || n > MAX_N || !quant_act_row_bytes(T->type, n) || T->type >= GGML_TYPE_COUNT_) continue;
        const size_t rb = quant_row_bytes(T->type, (uint64_t)n);
        const uint64_t rows = T->ne[1];
        tensors++;
        for (int r = 0; r < 8; r++) {
            gen_state = 0x5eedull + t * 97 + (uint64_t)r;
            const uint64_t ri = gen_u32() % rows;
            gen_act(x, n, r % 5 == 1 ? 0 : r % 5);
            check_dot(T->type, (const uint8_t *)T->data + ri * rb, x, n, &st[T->type], T->name.ptr);
        }
    }
    CHECK(tensors >= 100);
    CHECK(st[GGML_TYPE_Q4_1].rows > 0 && st[GGML_TYPE_Q8_0].rows > 0);
    if (getenv("VERBOSE"))
        for (uint32_t ty = 0; ty < GGML_TYPE_COUNT_; ty++)
            if (st[ty].rows)
                fprintf(stderr, "  model %-4s: %4d rows, max |dot - ref| / P = %.3g, / sum|w y| = %.3g\n", quant_type_name(ty),
                        st[ty].rows, st[ty].max_rel_parts, st[ty].max_rel);
    gguf_close(f);
}

/* ---- golden values from ggml ----------------------------------------------------------
 * ggml_vec_dot_<type>_q8_* (type_traits_cpu[type].vec_dot) of an x86 build of
 * ggml (AVX2 + AVX-512) applied to gen_case(type, idx) with the activations
 * quantised by type_traits_cpu[vec_dot_type].from_float; bit patterns of the
 * float results, idx = 0..9. The lines are what `make check-ggml-vec-dot`
 * prints (llama.cpp's sources from llama-cpp-python 0.3.36). */
static const struct {
    uint32_t type;
    uint32_t bits[10];
} golden[] = {
    {GGML_TYPE_Q4_0, {0x3caf926b, 0x00000000, 0x47773cb3, 0x00000000, 0xbe902160, 0x42173afa, 0x00000000, 0x4680d916, 0x00000000, 0x42dcc036}},
    {GGML_TYPE_Q4_1, {0x42789596, 0x00000000, 0x450a5e02, 0xb72ac10c, 0x3e26144a, 0xbea41790, 0x00000000, 0x45d74989, 0x35494800, 0x4100b5ef}},
    {GGML_TYPE_Q5_0, {0xb93c0600, 0x00000000, 0x4300d43e, 0x00000000, 0x42a2e88a, 0x42b19fa4, 0x00000000, 0x430a4007, 0x00000000, 0x43159070}},
    {GGML_TYPE_Q5_1, {0xc183e980, 0x00000000, 0xc80b97f2, 0xb608e8e3, 0xbfd10d14, 0x419defa4, 0x00000000, 0xc6f309a3, 0xb1581780, 0xc45e8170}},
    {GGML_TYPE_Q8_0, {0x3ed74ecb, 0x00000000, 0xc852cc16, 0x00000000, 0x435ffcbf, 0x42d61a2a, 0x00000000, 0x48576e0b, 0x00000000, 0x45ab0484}},
    {GGML_TYPE_Q2_K, {0xc08e6422, 0x00000000, 0xc8360ba1, 0xb942151c, 0x42acb24e, 0xc2fc30f9, 0x00000000, 0xc47be5da, 0x32d1cf40, 0xc3180d3a}},
    {GGML_TYPE_Q3_K, {0x3fd70c44, 0x00000000, 0xc3a231fa, 0x3abddb36, 0x42d8b298, 0x43f0216d, 0x00000000, 0x467a665a, 0xba29ee4b, 0xc3ce2862}},
    {GGML_TYPE_Q4_K, {0x42f4ecc7, 0x00000000, 0xcbe731c0, 0xbb3f5459, 0xc6eabd83, 0xc59572cc, 0x00000000, 0x48a643d1, 0x374cffe8, 0xc43167d2}},
    {GGML_TYPE_Q5_K, {0x427b2804, 0x00000000, 0x47d673fa, 0xbb17f849, 0x44c7c6e7, 0xc0167e6c, 0x00000000, 0xc7905cf5, 0xbaa60ed7, 0xc78bf454}},
    {GGML_TYPE_Q6_K, {0xc51e4904, 0x00000000, 0x46d1e654, 0x3bd26488, 0xc62d9fb0, 0x4594846a, 0x00000000, 0xc5405100, 0x39718e6f, 0xc57b5a22}},
};

TEST(quant_dot_ggml_golden) {
    static uint8_t row[MAX_N * 4], act[MAX_N * 4];
    static float x[MAX_N];
    int checked = 0;
    for (size_t g = 0; g < sizeof golden / sizeof golden[0]; g++) {
        for (int idx = 0; idx < 10; idx++) {
            const int64_t n = gen_case(golden[g].type, idx, row, x);
            quant_quantize_act(golden[g].type, x, act, n);
            for (int scalar = 1; scalar >= 0; scalar--) {
                const float got = vec_dot_path(scalar, golden[g].type, row, act, n);
                if (float_bits(got) != golden[g].bits[idx]) {
                    uint32_t u = golden[g].bits[idx];
                    float want;
                    memcpy(&want, &u, 4);
                    fprintf(stderr, "  %s case %d (%s): %.9g (0x%08x), ggml %.9g (0x%08x)\n", quant_type_name(golden[g].type),
                            idx, scalar ? "scalar" : "simd", got, float_bits(got), want, u);
                    CHECK(float_bits(got) == golden[g].bits[idx]);
                }
                checked++;
            }
        }
    }
    CHECK(checked >= 10 * 10 * 2);
    if (getenv("VERBOSE")) fprintf(stderr, "  %d results bit-identical to ggml\n", checked);
}
