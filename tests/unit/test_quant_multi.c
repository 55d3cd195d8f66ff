/* quant_vec_dot_multi and quant_matmul (engine/quant.c) against quant_vec_dot:
 * every result must have the same bits (memcmp), on the AVX2 path (when the
 * CPU has it) and on the scalar path, for
 *  - every weight type with a dot product, random valid rows of 1, 2, 3, 5, 7
 *    and 9 blocks, 1..9 activation rows (and 15, 16, 17, 31: groups of 8 plus
 *    remainders), activations normal / zero / one huge value / tiny;
 *  - the rows of every tensor in build/fixtures/quant_<TYPE>.gguf (real,
 *    random and edge-case blocks: zero, subnormal, largest and negative scales);
 *  - quant_matmul on 1..5 rows x 1..9 activations, on blocks that cross its
 *    activation chunks, with an output stride wider than the row count (the
 *    other entries must stay untouched), and with unaligned rows/activations. */
#include "test.h"

#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/quant_scales.h"

#include <stdint.h>
#include <stdlib.h>

static const uint32_t types[] = {
    GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
    GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,
};
enum { N_TYPES = sizeof types / sizeof types[0] };

static uint64_t rs = 0x853c49e6748fea9bull;
static uint32_t rnd(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}
static float rnd_normal(void) { /* sum of four uniforms in [-1, 1) */
    float s = 0;
    for (int i = 0; i < 4; i++) s += (float)((double)rnd() / 2147483648.0 - 1.0);
    return s;
}

/* Random valid weights: random quant bytes, finite scales of either sign
 * between about 2^-12 and 2 (F32 / F16 / BF16: random normal values). */
static void gen_weights(uint32_t type, uint8_t *w, size_t bytes) {
    if (type == GGML_TYPE_F32) {
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            const float v = rnd_normal();
            memcpy(w + i, &v, 4);
        }
        return;
    }
    if (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
        for (size_t i = 0; i + 2 <= bytes; i += 2) {
            const float v = rnd_normal();
            const uint16_t h = type == GGML_TYPE_F16 ? quant_f32_to_f16(v) : quant_f32_to_bf16(v);
            memcpy(w + i, &h, 2);
        }
        return;
    }
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
    const size_t bb = quant_block_bytes(type);
    int off[2];
    quant_scale_offsets(type, off);
    for (size_t b = 0; b + bb <= bytes; b += bb)
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) {
                const float mag = ldexpf(1.0f + (float)(rnd() % 1024) / 1024.0f, -(int)(rnd() % 13));
                const uint16_t h = quant_f32_to_f16(rnd() & 1 ? -mag : mag);
                memcpy(w + b + (size_t)off[k], &h, 2);
            }
}

/* n_acts activation rows of n elements, quantised for `type`, `stride` bytes
 * apart; mode 0 normal, 1 zero, 2 one huge value, 3 tiny, by row. */
static void gen_acts(uint32_t type, uint8_t *a, size_t stride, int64_t n_acts, int64_t n, int mode0) {
    float *x = malloc((size_t)n * sizeof *x);
    if (!x) return;
    for (int64_t t = 0; t < n_acts; t++) {
        const int mode = (int)((mode0 + t) % 4);
        for (int64_t i = 0; i < n; i++) x[i] = mode == 1 ? 0.0f : rnd_normal() * (mode == 3 ? 1e-6f : 1.0f);
        if (mode == 2) x[rnd() % (uint32_t)n] = 3.0e4f;
        quant_quantize_act(type, x, a + (size_t)t * stride, n);
    }
    free(x);
}

static int n_differ(const float *a, const float *b, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return bad;
}

/* Checks multi against single for one row and n_acts activations on the
 * current path; returns the number of differing results. */
static int check_multi(uint32_t type, const uint8_t *row, const uint8_t *acts, size_t stride, int64_t n_acts,
                       int64_t n) {
    float want[64], got[65];
    for (int64_t t = 0; t < n_acts; t++) want[t] = quant_vec_dot(type, row, acts + (size_t)t * stride, n);
    const float sentinel = -1234.5f;
    got[n_acts] = sentinel;
    quant_vec_dot_multi(type, row, acts, stride, n_acts, n, got);
    int bad = n_differ(got, want, n_acts) + (got[n_acts] != sentinel);
    if (bad) fprintf(stderr, "  %s n=%lld acts=%lld (%s): %d differ\n", quant_type_name(type), (long long)n,
                     (long long)n_acts, quant_simd_name(), bad);
    return bad;
}

/* Every path: the default (AVX2, with VNNI where available), the forced
 * scalar one, and AVX2 without VNNI. */
static int check_multi_paths(uint32_t type, const uint8_t *row, const uint8_t *acts, size_t stride, int64_t n_acts,
                             int64_t n) {
    int bad = check_multi(type, row, acts, stride, n_acts, n);
    quant_force_scalar(1);
    bad += check_multi(type, row, acts, stride, n_acts, n);
    quant_force_scalar(0);
    quant_force_no_vnni(1);
    bad += check_multi(type, row, acts, stride, n_acts, n);
    quant_force_no_vnni(0);
    return bad;
}

TEST(quant_multi_random) {
    static const int blocks[] = {1, 2, 3, 5, 7, 9};
    static const int counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31};
    enum { MAX_ACTS = 31 };
    int checked = 0, bad = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = types[ti];
        const int64_t qk = quant_block_elems(type) == 1 ? 32 : quant_block_elems(type);
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
            const int64_t n = qk * blocks[bi];
            const size_t rb = quant_row_bytes(type, (uint64_t)n), ab = quant_act_row_bytes(type, n);
            CHECK(rb > 0 && ab > 0);
            /* activations 3 bytes further apart than their size: odd strides and alignments */
            const size_t stride = ab + 3;
            uint8_t *row = malloc(rb + 1), *acts = malloc(stride * MAX_ACTS + 1);
            CHECK(row && acts);
            if (!row || !acts) return;
            for (int mode = 0; mode < 4; mode++) {
                gen_weights(type, row + 1, rb);
                gen_acts(type, acts + 1, stride, MAX_ACTS, n, mode);
                for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
                    bad += check_multi_paths(type, row + 1, acts + 1, stride, counts[ci], n);
                    checked++;
                }
            }
            free(row);
            free(acts);
        }
    }
    CHECK_EQ_INT(bad, 0);
    if (getenv("VERBOSE")) fprintf(stderr, "  %d (type, n, count, mode) cases, kernels %s\n", checked, quant_simd_name());
}

/* n_acts <= 0 writes nothing; a type without a dot product gives zeros. */
TEST(quant_multi_edges) {
    float out[4] = {7, 7, 7, 7};
    uint8_t row[64] = {0}, act[64] = {0};
    quant_vec_dot_multi(GGML_TYPE_Q4_1, row, act, 0, 0, 32, out);
    quant_vec_dot_multi(GGML_TYPE_Q4_1, row, act, 0, -3, 32, out);
    quant_matmul(GGML_TYPE_Q4_1, row, 0, 1, act, 0, 0, 32, out, 1);
    quant_matmul(GGML_TYPE_Q4_1, row, 0, 0, act, 0, 2, 32, out, 1);
    CHECK(out[0] == 7 && out[1] == 7 && out[2] == 7 && out[3] == 7);
    quant_vec_dot_multi(GGML_TYPE_Q8_K, row, act, 0, 2, 256, out);
    CHECK(out[0] == 0 && out[1] == 0 && out[2] == 7);
    /* a partial block: no dot product, as quant_vec_dot */
    quant_vec_dot_multi(GGML_TYPE_Q4_0, row, act, 0, 2, 33, out);
    CHECK(out[0] == 0 && out[1] == 0);
}

/* The rows of the fixture tensors (real, random and edge-case blocks). */
TEST(quant_multi_fixtures) {
    int files = 0, rows_checked = 0, bad = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = types[ti];
        char fname[64], err[256];
        snprintf(fname, sizeof fname, "quant_%s.gguf", quant_type_name(type));
        gguf_file *f = gguf_open(test_fixture(fname), err, sizeof err);
        if (!f) fprintf(stderr, "  %s: %s\n", fname, err);
        CHECK(f != NULL);
        if (!f) continue;
        files++;
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const gguf_tensor *t = &f->tensors[i];
            if (t->type != type) continue;
            const int64_t n = (int64_t)t->ne[0];
            const size_t rb = quant_row_bytes(type, (uint64_t)n), ab = quant_act_row_bytes(type, n);
            if (!rb || !ab) continue;
            const int64_t rows = (int64_t)(t->nbytes / rb);
            uint8_t *acts = malloc(ab * 9);
            float *want = malloc(sizeof(float) * 9 * (size_t)rows), *got = malloc(sizeof(float) * 9 * (size_t)rows);
            CHECK(acts && want && got);
            if (!acts || !want || !got) return;
            gen_acts(type, acts, ab, 9, n, (int)i);
            for (int64_t r = 0; r < rows; r++) {
                const uint8_t *row = (const uint8_t *)t->data + (size_t)r * rb;
                for (int64_t k = 1; k <= 9; k++) bad += check_multi_paths(type, row, acts, ab, k, n);
                rows_checked++;
            }
            /* the whole tensor as a matrix */
            for (int64_t r = 0; r < rows; r++)
                for (int k = 0; k < 9; k++)
                    want[(size_t)k * rows + r] =
                        quant_vec_dot(type, (const uint8_t *)t->data + (size_t)r * rb, acts + (size_t)k * ab, n);
            quant_matmul(type, t->data, rb, rows, acts, ab, 9, n, got, (size_t)rows);
            bad += n_differ(got, want, 9 * rows);
            free(acts);
            free(want);
            free(got);
        }
        gguf_close(f);
    }
    CHECK_EQ_INT(files, N_TYPES);
    CHECK(rows_checked > 0);
    CHECK_EQ_INT(bad, 0);
}

/* quant_matmul on one path: rows x acts into an out matrix of stride rows + 3
 * (the extra entries keep their sentinel). */
static int check_matmul(uint32_t type, const uint8_t *w, size_t rb, int64_t rows, const uint8_t *a, size_t as,
                        int64_t acts, int64_t n) {
    const size_t os = (size_t)rows + 3, total = os * (size_t)acts;
    float *want = malloc(total * sizeof *want), *got = malloc(total * sizeof *got);
    if (!want || !got) {
        free(want);
        free(got);
        return 1;
    }
    for (size_t i = 0; i < total; i++) want[i] = got[i] = -99.0f;
    for (int64_t t = 0; t < acts; t++)
        for (int64_t r = 0; r < rows; r++)
            want[(size_t)t * os + r] = quant_vec_dot(type, w + (size_t)r * rb, a + (size_t)t * as, n);
    quant_matmul(type, w, rb, rows, a, as, acts, n, got, os);
    const int bad = n_differ(got, want, (int64_t)total);
    if (bad) fprintf(stderr, "  matmul %s n=%lld %lldx%lld (%s): %d differ\n", quant_type_name(type), (long long)n,
                     (long long)rows, (long long)acts, quant_simd_name(), bad);
    free(want);
    free(got);
    return bad;
}

TEST(quant_multi_matmul) {
    int bad = 0, cases = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = types[ti];
        const int64_t qk = quant_block_elems(type) == 1 ? 32 : quant_block_elems(type);
        /* small shapes, 3 blocks; then a long row (9 blocks of 256 elements:
         * activation chunks of 8 or fewer rows for the K-quants) with 37 activations */
        for (int shape = 0; shape < 2; shape++) {
            const int64_t n = shape == 0 ? qk * 3 : 9 * 256;
            const int64_t max_rows = shape == 0 ? 5 : 7, max_acts = shape == 0 ? 9 : 37;
            const size_t rb = quant_row_bytes(type, (uint64_t)n), ab = quant_act_row_bytes(type, n);
            const size_t ws = rb + 1, as = ab + 5; /* odd strides: unaligned rows and activations */
            uint8_t *w = malloc(ws * (size_t)max_rows), *a = malloc(as * (size_t)max_acts);
            CHECK(w && a);
            if (!w || !a) return;
            for (int64_t r = 0; r < max_rows; r++) gen_weights(type, w + (size_t)r * ws, rb);
            gen_acts(type, a, as, max_acts, n, shape);
            for (int path = 0; path < 3; path++) { /* default, scalar, AVX2 without VNNI */
                quant_force_scalar(path == 1);
                quant_force_no_vnni(path == 2);
                if (shape == 0) {
                    for (int64_t rows = 1; rows <= max_rows; rows++)
                        for (int64_t acts = 1; acts <= max_acts; acts++, cases++)
                            bad += check_matmul(type, w, ws, rows, a, as, acts, n);
                } else {
                    bad += check_matmul(type, w, ws, max_rows, a, as, max_acts, n);
                    bad += check_matmul(type, w, ws, max_rows - 1, a, as, max_acts - 1, n);
                    cases += 2;
                }
            }
            quant_force_scalar(0);
            quant_force_no_vnni(0);
            free(w);
            free(a);
        }
    }
    CHECK_EQ_INT(bad, 0);
    if (getenv("VERBOSE")) fprintf(stderr, "  %d matmul shapes, kernels %s\n", cases, quant_simd_name());
}

/* quant_quantize_act: the AVX2 path writes the same bytes as the scalar one,
 * for Q8_0, Q8_1 and Q8_K activations and awkward inputs: ties (quarter
 * integers scaled so that x * id lands on .5), zeros, subnormals (127/amax
 * overflows), a largest magnitude occurring with both signs, infinities, NaN,
 * huge values (d rounds to an infinite half) and tiny ones (a subnormal half). */
TEST(quant_multi_quantize_simd) {
    static const uint32_t wtypes[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K};
    enum { N = 4 * 256 };
    float x[N];
    uint8_t a[2 * N + 64], b[2 * N + 64];
    int bad = 0, cases = 0;
    for (size_t wi = 0; wi < sizeof wtypes / sizeof wtypes[0]; wi++) {
        const uint32_t type = wtypes[wi];
        const size_t bytes = quant_act_row_bytes(type, N);
        CHECK(bytes > 0 && bytes <= sizeof a);
        for (int mode = 0; mode < 12; mode++)
            for (int rep = 0; rep < 8; rep++, cases++) {
                for (int i = 0; i < N; i++) x[i] = rnd_normal();
                switch (mode) {
                case 1: /* ties: multiples of amax/254 */
                    for (int i = 0; i < N; i++) x[i] = (float)((int)(rnd() % 255) - 127) * 0.5f;
                    break;
                case 2: for (int i = 0; i < N; i++) x[i] = (float)(int)(x[i] * 20.0f) / 4.0f; break;
                case 3: for (int i = 0; i < N / 2; i++) x[i] = 0.0f; break;
                case 4: for (int i = 0; i < N; i++) x[i] *= 1e-42f; break; /* subnormal */
                case 5: for (int i = 0; i < N; i += 3) x[i] = -x[i - (i % 2)]; break;
                case 6: x[rnd() % N] = INFINITY; x[rnd() % N] = -INFINITY; break;
                case 7: x[rnd() % N] = NAN; break;
                case 8: /* +-m in the same block, either first */
                    for (int i = 0; i < N; i += 64) {
                        x[i + rnd() % 32] = 9.0f;
                        x[i + rnd() % 32] = -9.0f;
                    }
                    break;
                case 9: for (int i = 0; i < N; i++) x[i] *= 3e37f; break; /* x * id near the top of the range */
                case 10: for (int i = 0; i < N; i++) x[i] *= 3e-6f; break; /* d a half subnormal */
                case 11: for (int i = 0; i < N; i++) x[i] *= (float)(1 + rnd() % 7) * 1e-3f; break;
                default: break;
                }
                memset(a, 0xaa, sizeof a);
                memset(b, 0xaa, sizeof b);
                quant_quantize_act(type, x, a + 1, N);
                quant_force_scalar(1);
                quant_quantize_act(type, x, b + 1, N);
                quant_force_scalar(0);
                if (memcmp(a, b, sizeof a) != 0) {
                    if (bad < 5) fprintf(stderr, "  quantize for %s mode %d: bytes differ\n", quant_type_name(type), mode);
                    bad++;
                }
            }
    }
    CHECK_EQ_INT(bad, 0);
    if (getenv("VERBOSE")) fprintf(stderr, "  %d quantisation cases, kernels %s\n", cases, quant_simd_name());
}

/* ---- packed matrices (quant_pack_rows, quant_matmul_packed) -------------------------
 * Their arithmetic (quant.h) is computed here by a plain loop over the rows as
 * they are in the file: each block's integer dot from the unpacked quants,
 * then acc = fma(dx * dy, isum, acc) (and fma(mx, sy, acc) for Q4_1). Every
 * kernel (scalar, AVX2, AVX2 with VNNI) must give exactly these bits, which
 * also proves the interleaved layout (AVX-512 reads two groups per register);
 * and they must agree with quant_vec_dot
 * (llama.cpp's arithmetic) to float rounding. */

static float half_le(const uint8_t *p) {
    return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* The signed quant j of a Q4_0 / Q4_1 / Q8_0 block. */
static int block_quant(uint32_t type, const uint8_t *x, int j) {
    switch (type) {
    case GGML_TYPE_Q4_0: return (j < 16 ? x[2 + j] & 0x0f : x[2 + j - 16] >> 4) - 8;
    case GGML_TYPE_Q4_1: return j < 16 ? x[4 + j] & 0x0f : x[4 + j - 16] >> 4;
    default: return (int8_t)x[2 + j];
    }
}

static float packed_reference(uint32_t type, const uint8_t *row, const uint8_t *act, int64_t n) {
    const size_t bb = quant_block_bytes(type), ab = type == GGML_TYPE_Q4_1 ? 36 : 34;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *x = row + (size_t)b * bb, *y = act + (size_t)b * ab;
        int32_t isum = 0;
        for (int j = 0; j < 32; j++) isum += block_quant(type, x, j) * (int8_t)y[ab - 32 + j];
        acc = fmaf(half_le(x) * half_le(y), (float)isum, acc);
        if (type == GGML_TYPE_Q4_1) acc = fmaf(half_le(x + 2), half_le(y + 2), acc);
    }
    return acc;
}

/* The K-quants' packed arithmetic (quant_pack.c), from the rows as they are
 * in the file (the GGUF block layouts): per 256-element super-block the exact
 * integer sums isum = sum_s sc[s] * sum_e q_e * y_e (Q6_K's q signed; Q5_K and
 * Q6_K sum these products in float, in sub-block order) and
 * msum = sum_s mn[s] * sum_e y_e, then acc = fma(dx * dy, isum, acc) and
 * acc = fma(-(dmin * dy), msum, acc). *mag: the sum of |terms| (dequantised
 * weight times activation, the mins and Q6_K's offset apart). */
static void k_scales(uint32_t type, const uint8_t *x, int sc[16], int mn[16]) {
    if (type == GGML_TYPE_Q2_K) {
        for (int s = 0; s < 16; s++) sc[s] = x[s] & 15, mn[s] = x[s] >> 4;
        return;
    }
    if (type == GGML_TYPE_Q6_K) {
        for (int s = 0; s < 16; s++) sc[s] = (int8_t)x[192 + s], mn[s] = 0;
        return;
    }
    const uint8_t *q = x + 4; /* 6-bit scales and mins, the high bits of 4..7 in the top of 0..3 and 4..7 */
    for (int s = 0; s < 4; s++) {
        sc[s] = q[s] & 63;
        mn[s] = q[s + 4] & 63;
        sc[s + 4] = (q[s + 8] & 15) | ((q[s] >> 6) << 4);
        mn[s + 4] = (q[s + 8] >> 4) | ((q[s + 4] >> 6) << 4);
    }
}

static int k_quant(uint32_t type, const uint8_t *x, int e) {
    if (type == GGML_TYPE_Q2_K) return (x[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
    if (type == GGML_TYPE_Q6_K) {
        const int n = e / 128, k = e % 128 / 32, l = e % 32;
        const int lo = (x[64 * n + 32 * (k & 1) + l] >> (4 * (k / 2))) & 15;
        return (lo | (((x[128 + 32 * n + l] >> (2 * k)) & 3) << 4)) - 32;
    }
    const int q5 = type == GGML_TYPE_Q5_K;
    const int lo = (x[(q5 ? 48 : 16) + 32 * (e / 64) + e % 32] >> (4 * (e % 64 / 32))) & 15;
    return q5 ? lo | (((x[16 + e % 32] >> (e / 32)) & 1) << 4) : lo;
}

/* fsc: sum the scaled sub-block sums in float (what Q5_K and Q6_K do) rather
 * than in integers; the other order only for the test that the data tell them apart. */
static float packed_reference_k_as(uint32_t type, const uint8_t *row, const uint8_t *act, int64_t n, double *mag,
                                   int fsc) {
    const size_t bb = quant_block_bytes(type);
    const int q6 = type == GGML_TYPE_Q6_K, q2 = type == GGML_TYPE_Q2_K, len = q6 || q2 ? 16 : 32;
    float acc = 0.0f;
    *mag = 0;
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *x = row + (size_t)b * bb, *ya = act + (size_t)b * 292;
        const int8_t *y = (const int8_t *)(ya + 4);
        float dy;
        memcpy(&dy, ya, 4);
        const float dx = half_le(x + (q6 ? 208 : q2 ? 80 : 0)), dm = q6 ? 0.0f : half_le(x + (q2 ? 82 : 2));
        int sc[16], mn[16];
        k_scales(type, x, sc, mn);
        int32_t isum = 0, msum = 0;
        float fsum = 0.0f; /* Q2_K, Q5_K and Q6_K scale their sub-block sums in float, in order */
        for (int s = 0; s < 256 / len; s++) {
            int32_t dot = 0, ysum = 0;
            for (int e = s * len; e < (s + 1) * len; e++) {
                dot += k_quant(type, x, e) * y[e];
                ysum += y[e];
                /* llama.cpp's Q6_K sums q + 32 and 32 * y apart (lanes that cancel), so both count */
                *mag += fabs((double)dx * sc[s] * k_quant(type, x, e) * dy * y[e]) +
                        fabs((double)(q6 ? dx * sc[s] * 32 : dm * mn[s]) * dy * y[e]);
            }
            if (fsc) fsum = fmaf((float)dot, (float)sc[s], fsum);
            else isum += sc[s] * dot;
            msum += mn[s] * ysum;
        }
        acc = fmaf(dx * dy, fsc ? fsum : (float)isum, acc);
        if (!q6) acc = fmaf(-(dm * dy), (float)msum, acc);
    }
    return acc;
}

static float packed_reference_k(uint32_t type, const uint8_t *row, const uint8_t *act, int64_t n, double *mag) {
    return packed_reference_k_as(type, row, act, n, mag, type != GGML_TYPE_Q4_K);
}

/* With check_packed's random data a super-block's scaled sum stays far below
 * 2^24, where float and integer sums agree whatever the order. large_k makes
 * them pass it (Q5_K, Q6_K): quants and scales near their top, activations all
 * near +1, so that fsum rounds and a kernel that summed in another order (or
 * in integers) would give other bits. Set while check_packed runs. */
static int k_large;

static void large_k(uint32_t type, uint8_t *w, size_t rb, int64_t rows, uint8_t *a, size_t ab, int64_t acts,
                    int64_t n) {
    const size_t bb = quant_block_bytes(type);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < n / 256; b++) {
            uint8_t *x = w + (size_t)r * rb + (size_t)b * bb;
            if (type == GGML_TYPE_Q2_K) {
                memset(x, 0xff, 80); /* every scale, min and quant at its top */
            } else if (type == GGML_TYPE_Q6_K) {
                memset(x + 128, 0xff, 64); /* high bits 3: q = 16..31 */
                for (int s = 0; s < 16; s++) x[192 + s] = (uint8_t)(64 + rnd() % 64); /* scales 64..127 */
            } else {
                memset(x + 16, 0xff, 32); /* fifth bits set: u = 16..31 */
                /* scales 0-3: 32..63; 4-7: 48..63 (these bytes' top bits are theirs) */
                for (int s = 0; s < 4; s++) x[4 + s] = (uint8_t)(0xe0 | (rnd() & 31));
            }
        }
    float *x = malloc((size_t)n * sizeof *x);
    if (!x) return;
    for (int64_t t = 0; t < acts; t++) {
        for (int64_t i = 0; i < n; i++) x[i] = 1.0f + 0.05f * rnd_normal();
        quant_quantize_act(type, x, a + (size_t)t * ab, n);
    }
    free(x);
}

static int is_k(uint32_t type) {
    return type == GGML_TYPE_Q2_K || type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K || type == GGML_TYPE_Q6_K;
}

/* rows x acts through quant_matmul_packed on every path, against the
 * reference loop (bits) and quant_vec_dot (rounding); returns the number of
 * results that differ. Quants span their whole range, Q8_0's -128 included. */
static int lanes_checked; /* cases check_packed ran through quant_matmul_packed_lanes */

static int check_packed(uint32_t type, int64_t rows, int64_t acts, int64_t n, double *worst) {
    const size_t rb = quant_row_bytes(type, (uint64_t)n), ab = quant_act_row_bytes(type, n), os = (size_t)rows + 5;
    const size_t pb = (size_t)(rows / 8) * quant_packed_group_bytes(type, n);
    uint8_t *w = malloc(rb * (size_t)rows), *p = malloc(pb), *a = malloc(ab * (size_t)acts);
    float *want = malloc(sizeof(float) * os * (size_t)acts), *got = malloc(sizeof(float) * os * (size_t)acts);
    float *deq = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    int bad = 0;
    if (!w || !p || !a || !want || !got || !deq || !y) bad = 1;
    if (!bad) {
        gen_weights(type, w, rb * (size_t)rows);
        gen_acts(type, a, ab, acts, n, (int)rows);
        if (k_large) large_k(type, w, rb, rows, a, ab, acts, n);
        quant_pack_rows(type, w, rb, rows, n, p);
        for (size_t i = 0; i < os * (size_t)acts; i++) want[i] = -99.0f;
        for (int64_t t = 0; t < acts; t++)
            for (int64_t r = 0; r < rows; r++) {
                const uint8_t *row = w + (size_t)r * rb, *act = a + (size_t)t * ab;
                double mag = 0;
                const float ref = is_k(type) ? packed_reference_k(type, row, act, n, &mag)
                                             : packed_reference(type, row, act, n);
                const float llama = quant_vec_dot(type, row, act, n);
                want[(size_t)t * os + r] = ref;
                /* both round a sum of |terms| <= mag; 1e-5 relative to it is ~100 ulps */
                quant_dequantize_row(type, row, deq, n);
                quant_dequantize_act(type, act, y, n);
                if (!is_k(type))
                    for (int64_t i = 0; i < n; i++) mag += fabs((double)deq[i] * y[i]);
                /* and the dequantised weights times the activations: the same sum */
                double exact = 0;
                for (int64_t i = 0; i < n; i++) exact += (double)deq[i] * y[i];
                if (is_k(type) && !(fabs(exact - ref) <= 1e-5 * mag + 1e-30)) {
                    bad++;
                    fprintf(stderr, "  packed %s: %g vs dequantised %g\n", quant_type_name(type), ref, exact);
                }
                if (type == GGML_TYPE_Q4_1)
                    for (int64_t b = 0; b < n / 32; b++)
                        mag += fabs((double)half_le(row + (size_t)b * rb / (size_t)(n / 32) + 2) *
                                    half_le(act + (size_t)b * 36 + 2));
                const double diff = fabs((double)ref - llama), rel = mag > 0 ? diff / mag : diff;
                if (rel > *worst) *worst = rel;
                if (!(rel <= 1e-5)) {
                    bad++;
                    fprintf(stderr, "  packed %s: %g vs quant_vec_dot %g (sum of |terms| %g, dequantised %g, n %d t %d)\n",
                            quant_type_name(type), ref, llama, mag, exact, (int)n, (int)t);
                }
            }
        for (int path = 0; path < 3; path++) { /* VNNI where the CPU has it, AVX2, scalar */
            quant_force_no_vnni(path >= 1);
            quant_force_scalar(path == 2);
            for (size_t i = 0; i < os * (size_t)acts; i++) got[i] = -99.0f;
            quant_matmul_packed(type, p, rows / 8, a, ab, acts, n, got, os);
            const int d = n_differ(got, want, (int64_t)(os * (size_t)acts));
            if (d) fprintf(stderr, "  packed %s n=%lld %lldx%lld path %d (%s): %d differ\n", quant_type_name(type),
                           (long long)n, (long long)rows, (long long)acts, path, quant_simd_name(), d);
            bad += d;
        }
        quant_force_no_vnni(0);
        quant_force_scalar(0);
        /* the activations laid out once (quant_packed_lanes, where this CPU
         * reads lanes), in two ranges as parallel workers would */
        const size_t lb = quant_packed_lanes_bytes(type, acts, n);
        uint8_t *lanes = lb ? malloc(lb) : NULL;
        if (lanes) {
            const int64_t mid = acts / 16 * 8; /* a multiple of 8 */
            quant_packed_lanes(a, ab, acts, mid, acts, n, lanes);
            quant_packed_lanes(a, ab, acts, 0, mid, n, lanes);
            for (size_t i = 0; i < os * (size_t)acts; i++) got[i] = -99.0f;
            quant_matmul_packed_lanes(type, p, rows / 8, lanes, acts, n, got, os);
            const int d = n_differ(got, want, (int64_t)(os * (size_t)acts));
            if (d) fprintf(stderr, "  packed %s n=%lld %lldx%lld laid-out lanes: %d differ\n", quant_type_name(type),
                           (long long)n, (long long)rows, (long long)acts, d);
            bad += d;
            lanes_checked++;
        }
        free(lanes);
    }
    free(w);
    free(p);
    free(a);
    free(want);
    free(got);
    free(deq);
    free(y);
    return bad;
}

TEST(quant_packed_matches_reference_and_llama) {
    static const uint32_t packable[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0};
    int bad = 0, cases = 0;
    double worst = 0;
    /* 1-5 groups: pairs of groups (AVX-512) with and without a group left
     * over; 1-17 activations: tiles of 8, 4, 2 and 1 and their remainders */
    static const int64_t counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 16, 17};
    for (int ti = 0; ti < 3; ti++)
        for (int64_t rows = 8; rows <= 40; rows += 8)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
                for (int64_t nb = 1; nb <= 64; nb = nb * 3 + 1) { /* 1, 4, 13, 40 blocks */
                    bad += check_packed(packable[ti], rows, counts[ci], 32 * nb, &worst);
                    cases++;
                }
    if (getenv("VERBOSE")) fprintf(stderr, "  %d packed cases, worst |packed - llama| / sum|terms| %.2e\n", cases, worst);
    CHECK_EQ_INT(bad, 0);
}

/* Q2_K, Q4_K, Q5_K and Q6_K packed: the same checks on 1, 2, 3 and 7 super-blocks. */
TEST(quant_packed_k_matches_reference_and_llama) {
    static const uint32_t packable[] = {GGML_TYPE_Q2_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    static const int64_t counts[] = {1, 2, 3, 4, 5, 8, 9, 12, 13, 17};
    int bad = 0, cases = 0;
    double worst = 0;
    for (int ti = 0; ti < 4; ti++)
        for (int64_t rows = 8; rows <= 40; rows += 8)
            for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
                for (int64_t nb = 1; nb <= 7; nb = nb * 2 + 1) { /* 1, 3, 7 super-blocks */
                    bad += check_packed(packable[ti], rows, counts[ci], 256 * nb, &worst);
                    cases++;
                }
    /* long rows: fewer activations per prepared chunk (KQ_PRE / super-blocks;
     * the AVX-512 lanes hold eight of these rows a chunk), so several chunks,
     * the last one partial, and a group left over without a pair */
    bad += check_packed(GGML_TYPE_Q6_K, 16, 7, 256 * 200, &worst);
    bad += check_packed(GGML_TYPE_Q6_K, 24, 17, 256 * 200, &worst);
    bad += check_packed(GGML_TYPE_Q4_K, 24, 19, 256 * 160, &worst);
    bad += check_packed(GGML_TYPE_Q2_K, 24, 19, 256 * 200, &worst);
    if (getenv("VERBOSE")) fprintf(stderr, "  %d packed K cases, worst |packed - llama| / sum|terms| %.2e\n", cases, worst);
    CHECK_EQ_INT(bad, 0);
    /* with AVX512-VNNI every case of more than one activation also went through laid-out lanes */
    if (quant_packed_lanes_bytes(GGML_TYPE_Q4_K, 2, 256)) CHECK(lanes_checked > cases / 2);
    CHECK(quant_packed_lanes_bytes(GGML_TYPE_Q4_K, 1, 256) == 0); /* one activation: the 256-bit tiles */
    CHECK(quant_packed_lanes_bytes(GGML_TYPE_Q4_1, 8, 256) == 0);
    CHECK(quant_packable(GGML_TYPE_Q4_K, 151936, 1536));
    CHECK(quant_packable(GGML_TYPE_Q6_K, 8, 256 * 256));
    CHECK(!quant_packable(GGML_TYPE_Q6_K, 8, 256 * 257)); /* more super-blocks than a kernel prepares */
    CHECK(!quant_packable(GGML_TYPE_Q5_K, 8, 128));        /* not whole super-blocks */
    /* Q5_K and Q6_K with sums past 2^24 (large_k), where the order of the
     * float sum shows in the bits: every path as the reference, on pairs of
     * groups, a group left over and every tile width */
    static const uint32_t fscaled[] = {GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    k_large = 1;
    for (int ti = 0; ti < 2; ti++) {
        CHECK_EQ_INT(check_packed(fscaled[ti], 24, 15, 256 * 3, &worst), 0);
        /* and the data do tell the float sum from the integer one */
        const size_t rb = quant_row_bytes(fscaled[ti], 256 * 3), ab = quant_act_row_bytes(fscaled[ti], 256 * 3);
        uint8_t *w = malloc(rb * 8), *a = malloc(ab * 4);
        int apart = 0;
        if (w && a) {
            gen_weights(fscaled[ti], w, rb * 8);
            large_k(fscaled[ti], w, rb, 8, a, ab, 4, 256 * 3);
            for (int64_t t = 0; t < 4; t++)
                for (int64_t r = 0; r < 8; r++) {
                    const uint8_t *row = w + (size_t)r * rb, *act = a + (size_t)t * ab;
                    double mag;
                    const float f = packed_reference_k_as(fscaled[ti], row, act, 256 * 3, &mag, 1);
                    const float i = packed_reference_k_as(fscaled[ti], row, act, 256 * 3, &mag, 0);
                    apart += memcmp(&f, &i, sizeof f) != 0;
                }
        }
        free(w);
        free(a);
        CHECK(apart > 0);
    }
    /* Q2_K at its top (every scale 15, quant 3, activations near +1): its
     * float sum is still the integer one, bit for bit (quant_pack.c) */
    CHECK_EQ_INT(check_packed(GGML_TYPE_Q2_K, 24, 15, 256 * 3, &worst), 0);
    {
        const size_t rb = quant_row_bytes(GGML_TYPE_Q2_K, 256 * 3), ab = quant_act_row_bytes(GGML_TYPE_Q2_K, 256 * 3);
        uint8_t *w = malloc(rb * 8), *a = malloc(ab * 4);
        int apart = 0, big = 0;
        if (w && a) {
            gen_weights(GGML_TYPE_Q2_K, w, rb * 8);
            large_k(GGML_TYPE_Q2_K, w, rb, 8, a, ab, 4, 256 * 3);
            for (int64_t t = 0; t < 4; t++)
                for (int64_t r = 0; r < 8; r++) {
                    double mag;
                    const float f = packed_reference_k_as(GGML_TYPE_Q2_K, w + (size_t)r * rb, a + (size_t)t * ab,
                                                          256 * 3, &mag, 1);
                    const float i = packed_reference_k_as(GGML_TYPE_Q2_K, w + (size_t)r * rb, a + (size_t)t * ab,
                                                          256 * 3, &mag, 0);
                    apart += memcmp(&f, &i, sizeof f) != 0;
                    /* the data reach the top of the range: a super-block's integer sum past 2^20 */
                    int sc[16], mn[16];
                    int64_t isum = 0;
                    k_scales(GGML_TYPE_Q2_K, w + (size_t)r * rb, sc, mn);
                    for (int e = 0; e < 256; e++)
                        isum += sc[e / 16] * k_quant(GGML_TYPE_Q2_K, w + (size_t)r * rb, e) *
                                (int8_t)a[(size_t)t * ab + 4 + (size_t)e];
                    big += llabs(isum) > (1 << 20); /* (Q8_K may store -y with a negative d) */
                }
        }
        free(w);
        free(a);
        CHECK_EQ_INT(apart, 0);
        CHECK_EQ_INT(big, 32);
    }
    k_large = 0;
    CHECK(!quant_packable(GGML_TYPE_Q3_K, 8, 256));
    CHECK(quant_packed_group_bytes(GGML_TYPE_Q6_K, 512) == 8 * 420);
    CHECK(quant_packed_group_bytes(GGML_TYPE_Q4_K, 512) == 8 * 288 + 64);
    CHECK(quant_packed_group_bytes(GGML_TYPE_Q4_K, 100) == 0);
}

TEST(quant_packed_shapes) {
    CHECK(quant_packable(GGML_TYPE_Q4_0, 8, 32));
    CHECK(quant_packable(GGML_TYPE_Q4_1, 49152, 576));
    CHECK(quant_packable(GGML_TYPE_Q8_0, 16, 65536));
    CHECK(!quant_packable(GGML_TYPE_Q8_0, 16, 65536 + 32)); /* more blocks than a kernel prepares */
    CHECK(!quant_packable(GGML_TYPE_Q4_1, 12, 64));         /* not whole groups of eight */
    CHECK(!quant_packable(GGML_TYPE_Q4_1, 0, 64));
    CHECK(!quant_packable(GGML_TYPE_Q4_1, 8, 48));          /* not whole blocks */
    CHECK(!quant_packable(GGML_TYPE_Q5_0, 8, 32));
    CHECK(!quant_packable(GGML_TYPE_F32, 8, 32));
    /* nothing is written for empty or unpackable products */
    uint8_t blk[34 * 8] = {0}, act[34] = {0};
    float out[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    quant_matmul_packed(GGML_TYPE_Q8_0, blk, 0, act, 34, 1, 32, out, 8);
    quant_matmul_packed(GGML_TYPE_Q8_0, blk, 1, act, 34, 0, 32, out, 8);
    quant_matmul_packed(GGML_TYPE_Q5_0, blk, 1, act, 22, 1, 32, out, 8);
    for (int i = 0; i < 8; i++) CHECK(out[i] == 7.0f);
    /* a long row: activation chunks of fewer rows (PACK_PRE / blocks) */
    double worst = 0;
    CHECK_EQ_INT(check_packed(GGML_TYPE_Q4_1, 8, 11, 32 * 700, &worst), 0);
}
