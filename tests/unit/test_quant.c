/* Tests of engine/quant.c: the type table, half/bfloat16 conversions, and
 * dequantisation / dot products against gguf-py's reference dequantiser.
 *
 * Fixtures: build/fixtures/quant_<TYPE>.gguf (tests/make_fixtures.py) hold, for
 * every tensor NAME of the file's type, NAME.expected (F32) computed with
 * gguf.quants.dequantize; tests/fixtures/ref_dequant_smollm2.bin
 * (tests/reference/record_dequant.py) holds reference rows of the default model.
 *
 * Dequantisation must match the reference bit for bit for every type (a NaN
 * matches any NaN): quant.c performs ggml's operations in ggml's order without
 * FMA contraction, so there is no rounding to allow for. Dot products are
 * compared with a double-precision sum of the dequantised row, within the
 * float summation bound (n/8 + 4) * FLT_EPSILON * sum|a_i x_i|.
 * Run with VERBOSE=1 to print per-type counts and maximum errors. */
#include "test.h"

#include "engine/gguf.h"
#include "engine/quant.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>

/* ---- helpers ------------------------------------------------------------- */

/* Bitwise equality, except that any NaN equals any NaN. */
static int same_float(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return float_bits(a) == float_bits(b);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rnd_unit(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 40) / (double)(1ull << 23) - 1.0);
}

static int is_f16_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int is_bf16_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

static uint16_t u16_at(const void *p, uint64_t i) {
    uint16_t v;
    memcpy(&v, (const uint8_t *)p + 2 * i, 2);
    return v;
}

static float f32_at(const void *p, uint64_t i) {
    float v;
    memcpy(&v, (const uint8_t *)p + 4 * i, 4);
    return v;
}

static uint64_t n_elements(const gguf_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) n *= t->ne[d];
    return n;
}

static void str_copy(char *dst, size_t cap, gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Per-type statistics, printed with VERBOSE=1. */
typedef struct {
    int tensors, rows, dot_rows, dot_skipped, mismatches;
    uint64_t blocks, values;
    double max_abs, max_rel, dot_max_rel;
} stats;

static void note_diff(stats *st, float got, float want) {
    if (isnan(got) || isnan(want) || isinf(got) || isinf(want)) return;
    double d = fabs((double)got - (double)want);
    if (d > st->max_abs) st->max_abs = d;
    if (want != 0 && d / fabs((double)want) > st->max_rel) st->max_rel = d / fabs((double)want);
}

/* Dequantises one row and compares it with `want` (n floats, possibly unaligned);
 * then checks quant_dot_row against a double dot of the dequantised row. */
static void check_row(stats *st, uint32_t type, const void *row, const void *want, int64_t n,
                      const char *what, uint64_t r, float *buf, float *x) {
    quant_dequantize_row(type, row, buf, n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float w = f32_at(want, (uint64_t)i);
        note_diff(st, buf[i], w);
        if (!same_float(buf[i], w)) {
            if (bad < 3)
                fprintf(stderr, "  %s row %llu [%lld]: got %.9g (0x%08x), expected %.9g (0x%08x)\n", what,
                        (unsigned long long)r, (long long)i, buf[i], float_bits(buf[i]), w, float_bits(w));
            bad++;
        }
    }
    st->mismatches += bad;
    CHECK(bad == 0);
    st->rows++;
    st->values += (uint64_t)n;

    double ref = 0, mag = 0;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        x[i] = rnd_unit();
        if (!isfinite(buf[i])) finite = 0;
        ref += (double)buf[i] * x[i];
        mag += fabs((double)buf[i] * x[i]);
    }
    if (!finite || mag > 1e30) { /* f32 sums may overflow where the double one does not */
        st->dot_skipped++;
        return;
    }
    float got = quant_dot_row(type, row, x, n);
    double tol = ((double)n / 8 + 4) * FLT_EPSILON * mag + 1e-30;
    double err = fabs((double)got - ref);
    if (mag > 0 && err / mag > st->dot_max_rel) st->dot_max_rel = err / mag;
    if (!(err <= tol))
        fprintf(stderr, "  %s row %llu: dot %.9g, expected %.9g (tol %g)\n", what, (unsigned long long)r, got,
                ref, tol);
    CHECK(err <= tol);
    st->dot_rows++;
}

static void print_stats(const char *label, const stats *st) {
    if (!getenv("VERBOSE")) return;
    fprintf(stderr,
            "  %-6s %2d tensors %4d rows %6llu blocks %7llu values: %d mismatches, max abs err %g, "
            "max rel err %g; dot: %d rows (%d skipped, non-finite), max err/sum|ax| %.3g\n",
            label, st->tensors, st->rows, (unsigned long long)st->blocks, (unsigned long long)st->values,
            st->mismatches, st->max_abs, st->max_rel, st->dot_rows, st->dot_skipped, st->dot_max_rel);
}

/* ---- type table -------------------------------------------------------------- */

TEST(quant_type_table) {
    static const struct {
        uint32_t type;
        const char *name;
        uint32_t elems, bytes;
        int must_support;
    } want[] = {
        {GGML_TYPE_F32, "F32", 1, 4, 1},      {GGML_TYPE_F16, "F16", 1, 2, 1},
        {GGML_TYPE_BF16, "BF16", 1, 2, 1},    {GGML_TYPE_Q4_0, "Q4_0", 32, 18, 1},
        {GGML_TYPE_Q4_1, "Q4_1", 32, 20, 1},  {GGML_TYPE_Q5_0, "Q5_0", 32, 22, 1},
        {GGML_TYPE_Q5_1, "Q5_1", 32, 24, 1},  {GGML_TYPE_Q8_0, "Q8_0", 32, 34, 1},
        {GGML_TYPE_Q8_1, "Q8_1", 32, 36, 0},  {GGML_TYPE_Q2_K, "Q2_K", 256, 84, 0},
        {GGML_TYPE_Q3_K, "Q3_K", 256, 110, 0}, {GGML_TYPE_Q4_K, "Q4_K", 256, 144, 1},
        {GGML_TYPE_Q5_K, "Q5_K", 256, 176, 1}, {GGML_TYPE_Q6_K, "Q6_K", 256, 210, 1},
        {GGML_TYPE_Q8_K, "Q8_K", 256, 292, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK_STR(quant_type_name(want[i].type), want[i].name);
        CHECK_EQ_INT(quant_block_elems(want[i].type), want[i].elems);
        CHECK_EQ_INT(quant_block_bytes(want[i].type), want[i].bytes);
        if (want[i].must_support) CHECK_EQ_INT(quant_type_supported(want[i].type), 1);
        CHECK_EQ_INT(quant_row_bytes(want[i].type, 4 * (uint64_t)want[i].elems), 4 * (uint64_t)want[i].bytes);
    }
    static const uint32_t unknown[] = {4, 5, 16, 19, 29, 31, 39, 40, 41, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        CHECK_EQ_INT(quant_type_supported(unknown[i]), 0);
        CHECK_STR(quant_type_name(unknown[i]), "unknown");
        CHECK_EQ_INT(quant_block_elems(unknown[i]), 0);
        CHECK_EQ_INT(quant_block_bytes(unknown[i]), 0);
        CHECK_EQ_INT(quant_row_bytes(unknown[i], 256), 0);
    }
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q4_0, 64), 36);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q4_0, 33), 0);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q8_0, 576), 18 * 34);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q4_K, 512), 288);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q4_K, 128), 0);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q6_K, 1536), 6 * 210);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_F32, 7), 28);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_BF16, 7), 14);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_F32, 0), 0);
    /* a row whose byte size does not fit in size_t */
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_Q8_0, UINT64_MAX - 31), 0);
    CHECK_EQ_INT(quant_row_bytes(GGML_TYPE_F32, UINT64_MAX / 2), 0);
}

/* ---- half / bfloat16 --------------------------------------------------------- */

TEST(quant_f16_conversions) {
    CHECK(quant_f16_to_f32(0x3c00) == 1.0f);
    CHECK(quant_f16_to_f32(0xc000) == -2.0f);
    CHECK(quant_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(quant_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(quant_f16_to_f32(0x8001) == -0x1p-24f);
    CHECK(quant_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(quant_f16_to_f32(0x0400) == 0x1p-14f);
    CHECK(quant_f16_to_f32(0x3555) == 0x1.554p-2f);
    CHECK(float_bits(quant_f16_to_f32(0x8000)) == 0x80000000u);
    CHECK(float_bits(quant_f16_to_f32(0x0000)) == 0);
    CHECK(isinf(quant_f16_to_f32(0x7c00)) && quant_f16_to_f32(0x7c00) > 0);
    CHECK(isinf(quant_f16_to_f32(0xfc00)) && quant_f16_to_f32(0xfc00) < 0);
    CHECK(isnan(quant_f16_to_f32(0x7e00)));
    CHECK(isnan(quant_f16_to_f32(0x7c01)));
    CHECK(isnan(quant_f16_to_f32(0xffff)));

    CHECK_EQ_INT(quant_f32_to_f16(1.0f), 0x3c00);
    CHECK_EQ_INT(quant_f32_to_f16(-2.0f), 0xc000);
    CHECK_EQ_INT(quant_f32_to_f16(0.0f), 0x0000);
    CHECK_EQ_INT(quant_f32_to_f16(-0.0f), 0x8000);
    CHECK_EQ_INT(quant_f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(quant_f32_to_f16(65519.996f), 0x7bff); /* just below the tie with 65536 */
    CHECK_EQ_INT(quant_f32_to_f16(65520.0f), 0x7c00);   /* tie rounds to even: infinity */
    CHECK_EQ_INT(quant_f32_to_f16(1e10f), 0x7c00);
    CHECK_EQ_INT(quant_f32_to_f16(-1e10f), 0xfc00);
    CHECK_EQ_INT(quant_f32_to_f16(INFINITY), 0x7c00);
    CHECK_EQ_INT(quant_f32_to_f16(-INFINITY), 0xfc00);
    CHECK(is_f16_nan(quant_f32_to_f16(NAN)));
    CHECK(is_f16_nan(quant_f32_to_f16(bits_float(0x7f800001u)))); /* payload only in the low bits */
    CHECK(is_f16_nan(quant_f32_to_f16(bits_float(0xffc00000u))));
    CHECK_EQ_INT(quant_f32_to_f16(0x1p-24f), 0x0001);
    CHECK_EQ_INT(quant_f32_to_f16(-0x1p-24f), 0x8001);
    CHECK_EQ_INT(quant_f32_to_f16(0x1p-25f), 0x0000);         /* tie: to even (zero) */
    CHECK_EQ_INT(quant_f32_to_f16(0x1.000002p-25f), 0x0001); /* just above the tie */
    CHECK_EQ_INT(quant_f32_to_f16(0x1.8p-25f), 0x0001);
    CHECK_EQ_INT(quant_f32_to_f16(3 * 0x1p-25f), 0x0002); /* 1.5 units: tie to even */
    CHECK_EQ_INT(quant_f32_to_f16(0x1p-26f), 0x0000);
    CHECK_EQ_INT(quant_f32_to_f16(1e-30f), 0x0000);
    CHECK_EQ_INT(quant_f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400); /* subnormal rounding up to normal */
    CHECK_EQ_INT(quant_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie to even */
    CHECK_EQ_INT(quant_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie to even */
    CHECK_EQ_INT(quant_f32_to_f16(2049.0f), 0x6800);
    CHECK_EQ_INT(quant_f32_to_f16(2051.0f), 0x6802);
    CHECK_EQ_INT(quant_f32_to_f16(0x1.ffcp-15f), 0x0400); /* 1023.5 units: tie to even 1024 */

    /* every half survives f16 -> f32 -> f16; NaNs stay NaN */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_f16_to_f32((uint16_t)h);
        uint16_t back = quant_f32_to_f16(f);
        if (is_f16_nan((uint16_t)h) ? !(isnan(f) && is_f16_nan(back)) : back != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

TEST(quant_bf16_conversions) {
    CHECK(quant_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(quant_bf16_to_f32(0xc000) == -2.0f);
    CHECK(float_bits(quant_bf16_to_f32(0x8000)) == 0x80000000u);
    CHECK(quant_bf16_to_f32(0x0001) == bits_float(0x00010000u)); /* subnormal */
    CHECK(isinf(quant_bf16_to_f32(0x7f80)));
    CHECK(isnan(quant_bf16_to_f32(0x7fc0)));
    CHECK(isnan(quant_bf16_to_f32(0x7f81)));

    CHECK_EQ_INT(quant_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(quant_f32_to_bf16(-0.0f), 0x8000);
    CHECK_EQ_INT(quant_f32_to_bf16(1.00390625f), 0x3f80);  /* 1 + 2^-8: tie to even */
    CHECK_EQ_INT(quant_f32_to_bf16(1.01171875f), 0x3f82);  /* 1 + 3*2^-8: tie to even */
    CHECK_EQ_INT(quant_f32_to_bf16(bits_float(0x3f808001u)), 0x3f81); /* just above the tie */
    CHECK_EQ_INT(quant_f32_to_bf16(FLT_MAX), 0x7f80);      /* rounds up to infinity */
    CHECK_EQ_INT(quant_f32_to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(quant_f32_to_bf16(-INFINITY), 0xff80);
    CHECK_EQ_INT(quant_f32_to_bf16(bits_float(0x00000001u)), 0x0000);
    CHECK_EQ_INT(quant_f32_to_bf16(bits_float(0x00008001u)), 0x0001); /* subnormal rounding up */
    CHECK(is_bf16_nan(quant_f32_to_bf16(NAN)));
    CHECK_EQ_INT(quant_f32_to_bf16(bits_float(0x7f800001u)), 0x7fc0); /* signalling NaN made quiet, not inf */
    CHECK_EQ_INT(quant_f32_to_bf16(bits_float(0xffc00000u)), 0xffc0);

    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quant_bf16_to_f32((uint16_t)h);
        uint16_t back = quant_f32_to_bf16(f);
        if (is_bf16_nan((uint16_t)h) ? !(isnan(f) && is_bf16_nan(back)) : back != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

/* quant_F16.gguf / quant_BF16.gguf hold conv.f32 and the reference conversion
 * (numpy's float16 cast; gguf-py's bfloat16, the same as ggml's). */
TEST(quant_fixture_conversions) {
    static const struct {
        const char *file, *out;
        int bf16;
    } sets[] = {{"quant_F16.gguf", "conv.f16", 0}, {"quant_BF16.gguf", "conv.bf16", 1}};
    for (int s = 0; s < 2; s++) {
        char err[256];
        gguf_file *f = gguf_open(test_fixture(sets[s].file), err, sizeof err);
        if (!f) fprintf(stderr, "  %s: %s\n", sets[s].file, err);
        CHECK(f != NULL);
        if (!f) continue;
        const gguf_tensor *in = gguf_find_tensor(f, "conv.f32");
        const gguf_tensor *out = gguf_find_tensor(f, sets[s].out);
        CHECK(in && out);
        if (in && out) {
            CHECK_EQ_INT(in->type, GGML_TYPE_F32);
            CHECK_EQ_INT(out->type, sets[s].bf16 ? GGML_TYPE_BF16 : GGML_TYPE_F16);
            uint64_t n = n_elements(in);
            CHECK_EQ_INT(n_elements(out), n);
            CHECK(n > 1000);
            int bad = 0;
            for (uint64_t i = 0; i < n && n == n_elements(out); i++) {
                float v = f32_at(in->data, i);
                uint16_t want = u16_at(out->data, i);
                uint16_t got = sets[s].bf16 ? quant_f32_to_bf16(v) : quant_f32_to_f16(v);
                int ok = sets[s].bf16 ? got == want : (is_f16_nan(want) ? is_f16_nan(got) : got == want);
                if (!ok && bad++ < 5)
                    fprintf(stderr, "  %s: %.9g (0x%08x) -> 0x%04x, expected 0x%04x\n", sets[s].out, v, float_bits(v),
                            got, want);
            }
            CHECK_EQ_INT(bad, 0);
            if (getenv("VERBOSE"))
                fprintf(stderr, "  %s: %llu conversions compared, %d mismatches\n", sets[s].out,
                        (unsigned long long)n, bad);
        }
        gguf_close(f);
    }
}

/* ---- dequantisation against the reference ---------------------------------- */

TEST(quant_fixtures_dequantize) {
    int files = 0;
    for (uint32_t type = 0; type < GGML_TYPE_COUNT_; type++) {
        if (!quant_type_supported(type)) continue;
        char fname[64], err[256];
        snprintf(fname, sizeof fname, "quant_%s.gguf", quant_type_name(type));
        gguf_file *f = gguf_open(test_fixture(fname), err, sizeof err);
        if (!f) fprintf(stderr, "  %s: %s\n", fname, err);
        CHECK(f != NULL); /* every supported type must have a fixture */
        if (!f) continue;
        files++;
        uint64_t ft = 0;
        CHECK(gguf_get_u64(f, "potserve.fixture.type", &ft) == 0);
        CHECK_EQ_INT(ft, type);

        stats st = {0};
        int saw_3d = 0, saw_multiblock = 0;
        for (uint64_t ti = 0; ti < f->n_tensors; ti++) {
            const gguf_tensor *t = &f->tensors[ti];
            char name[200], ename[256];
            str_copy(name, sizeof name, t->name);
            if (ends_with(name, ".expected") || strncmp(name, "conv.", 5) == 0) continue;
            CHECK_EQ_INT(t->type, type);
            snprintf(ename, sizeof ename, "%s.expected", name);
            const gguf_tensor *e = gguf_find_tensor(f, ename);
            if (!e) fprintf(stderr, "  %s: no %s\n", fname, ename);
            CHECK(e != NULL);
            if (!e) continue;
            CHECK_EQ_INT(e->type, GGML_TYPE_F32);
            int same_shape = 1;
            for (int d = 0; d < GGUF_MAX_DIMS; d++) same_shape &= t->ne[d] == e->ne[d];
            CHECK(same_shape);
            if (!same_shape || t->type != type) continue;

            const uint64_t ne0 = t->ne[0], nel = n_elements(t), rows = nel / ne0;
            const size_t rb = quant_row_bytes(type, ne0);
            CHECK(rb > 0);
            CHECK_EQ_INT(rb * rows, t->nbytes);
            if (rb == 0 || rb * rows != t->nbytes) continue;
            if (t->n_dims >= 3) saw_3d = 1;
            if (ne0 >= 2 * (uint64_t)quant_block_elems(type) && quant_block_elems(type) > 1) saw_multiblock = 1;

            float *buf = malloc(nel * sizeof *buf), *x = malloc(ne0 * sizeof *x);
            CHECK(buf && x);
            if (buf && x) {
                char what[300];
                snprintf(what, sizeof what, "%s %s", fname, name);
                for (uint64_t r = 0; r < rows; r++)
                    check_row(&st, type, (const uint8_t *)t->data + r * rb, (const uint8_t *)e->data + r * ne0 * 4,
                              (int64_t)ne0, what, r, buf, x);
                /* the whole tensor in one call (rows are contiguous) */
                quant_dequantize_row(type, t->data, buf, (int64_t)nel);
                int bad = 0;
                for (uint64_t i = 0; i < nel; i++) bad += !same_float(buf[i], f32_at(e->data, i));
                CHECK_EQ_INT(bad, 0);
            }
            free(buf);
            free(x);
            st.tensors++;
            st.blocks += nel / quant_block_elems(type);
        }
        CHECK(st.tensors >= 5);
        CHECK(saw_3d);
        if (quant_block_elems(type) > 1) CHECK(saw_multiblock);
        print_stats(quant_type_name(type), &st);
        gguf_close(f);
    }
    CHECK(files >= 9);
}

/* F32/F16/BF16 dot products on lengths that are not multiples of 8 or 256. */
TEST(quant_dot_row_odd_lengths) {
    enum { N = 700 };
    static float row[N], x[N], tmp[N];
    static uint16_t h[N], b[N];
    for (int i = 0; i < N; i++) {
        row[i] = rnd_unit() * 3;
        x[i] = rnd_unit();
        h[i] = quant_f32_to_f16(row[i]);
        b[i] = quant_f32_to_bf16(row[i]);
    }
    static const int lens[] = {1, 7, 8, 13, 255, 256, 257, 300, 700};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
        int n = lens[k];
        for (int which = 0; which < 3; which++) {
            uint32_t type = which == 0 ? GGML_TYPE_F32 : which == 1 ? GGML_TYPE_F16 : GGML_TYPE_BF16;
            const void *src = which == 0 ? (const void *)row : which == 1 ? (const void *)h : (const void *)b;
            quant_dequantize_row(type, src, tmp, n);
            double ref = 0, mag = 0;
            for (int i = 0; i < n; i++) {
                ref += (double)tmp[i] * x[i];
                mag += fabs((double)tmp[i] * x[i]);
            }
            float got = quant_dot_row(type, src, x, n);
            CHECK_NEAR(got, ref, ((double)n / 8 + 4) * FLT_EPSILON * mag);
        }
    }
    /* unknown / unsupported types read as zeros rather than touching memory wildly */
    uint8_t blk[292] = {0};
    float out[256];
    out[0] = 1.0f;
    quant_dequantize_row(GGML_TYPE_Q8_K, blk, out, 256);
    CHECK(out[0] == 0.0f && out[255] == 0.0f);
    CHECK(quant_dot_row(GGML_TYPE_Q8_K, blk, x, 256) == 0.0f);
    quant_dequantize_row(1000, blk, out, 4);
    CHECK(out[3] == 0.0f);
}

/* ---- the default model ------------------------------------------------------- */

TEST(quant_smollm2_reference) {
    const char *model = test_model_path();
    CHECK(model != NULL);
    if (!model) return;
    const char *ref_path = "tests/fixtures/ref_dequant_smollm2.bin";
    FILE *fp = fopen(ref_path, "rb");
    CHECK(fp != NULL);
    if (!fp) return;
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *ref = size > 0 ? malloc((size_t)size) : NULL;
    CHECK(ref && fread(ref, 1, (size_t)size, fp) == (size_t)size);
    fclose(fp);
    char err[256];
    gguf_file *f = gguf_open(model, err, sizeof err);
    if (!f) fprintf(stderr, "  %s: %s\n", model, err);
    CHECK(f != NULL);
    if (!ref || !f || size < 12 || memcmp(ref, "PSDQ", 4) != 0) {
        CHECK(!"bad reference file");
        free(ref);
        gguf_close(f);
        return;
    }
    uint32_t version, n_rec;
    memcpy(&version, ref + 4, 4);
    memcpy(&n_rec, ref + 8, 4);
    CHECK_EQ_INT(version, 1);
    CHECK(n_rec >= 10);
    size_t off = 12;
    stats st[GGML_TYPE_COUNT_];
    memset(st, 0, sizeof st);
    static float buf[8192], x[8192];
    uint32_t done = 0;
    for (uint32_t r = 0; r < n_rec; r++) {
        uint32_t name_len, type, n;
        uint64_t row;
        if (off + 4 > (size_t)size) break;
        memcpy(&name_len, ref + off, 4);
        if (name_len >= 200 || off + 4 + name_len + 16 > (size_t)size) break;
        char name[200];
        memcpy(name, ref + off + 4, name_len);
        name[name_len] = 0;
        off += 4 + name_len;
        memcpy(&type, ref + off, 4);
        memcpy(&row, ref + off + 4, 8);
        memcpy(&n, ref + off + 12, 4);
        off += 16;
        if (n > 8192 || off + (size_t)n * 4 > (size_t)size) break;
        const uint8_t *want = ref + off;
        off += (size_t)n * 4;

        const gguf_tensor *t = gguf_find_tensor(f, name);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK_EQ_INT(t->type, type);
        CHECK_EQ_INT(t->ne[0], n);
        CHECK(type < GGML_TYPE_COUNT_ && quant_type_supported(type));
        size_t rb = quant_row_bytes(type, n);
        uint64_t rows = n_elements(t) / t->ne[0];
        CHECK(row < rows);
        if (t->type != type || t->ne[0] != n || row >= rows || rb == 0 || type >= GGML_TYPE_COUNT_) continue;
        char what[256];
        snprintf(what, sizeof what, "%s %s", model, name);
        check_row(&st[type], type, (const uint8_t *)t->data + row * rb, want, n, what, row, buf, x);
        st[type].blocks += n / quant_block_elems(type);
        done++;
    }
    CHECK_EQ_INT(done, n_rec);
    CHECK_EQ_INT(off, (uint64_t)size);
    CHECK(st[GGML_TYPE_Q4_1].rows > 0 && st[GGML_TYPE_Q8_0].rows > 0 && st[GGML_TYPE_F32].rows > 0);
    for (uint32_t t = 0; t < GGML_TYPE_COUNT_; t++)
        if (st[t].rows) {
            char label[32];
            snprintf(label, sizeof label, "model %s", quant_type_name(t));
            print_stats(label, &st[t]);
        }
    free(ref);
    gguf_close(f);
}

/* Every tensor of every tiny model fixture has a supported type, a byte size
 * that matches its shape, and dequantises to finite values. */
TEST(quant_tiny_models_dequantize) {
    static const char *files[] = {
        "tiny_llama.gguf",      "tiny_llama_untied.gguf", "tiny_qwen2.gguf",      "tiny_llama_q8_0.gguf",
        "tiny_llama_q4_0.gguf", "tiny_llama_q4_1.gguf",   "tiny_llama_q4_k.gguf", "tiny_llama_q5_k.gguf",
        "tiny_llama_q6_k.gguf", "tiny_llama_f16.gguf",    "tiny_llama_bf16.gguf",   "tiny_llama_mixed.gguf",
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char err[256];
        gguf_file *f = gguf_open(test_fixture(files[i]), err, sizeof err);
        if (!f) fprintf(stderr, "  %s: %s\n", files[i], err);
        CHECK(f != NULL);
        if (!f) continue;
        CHECK(f->n_tensors >= 20);
        for (uint64_t ti = 0; ti < f->n_tensors; ti++) {
            const gguf_tensor *t = &f->tensors[ti];
            CHECK(quant_type_supported(t->type));
            uint64_t nel = n_elements(t), rows = nel / t->ne[0];
            size_t rb = quant_row_bytes(t->type, t->ne[0]);
            CHECK(rb > 0 && rb * rows == t->nbytes);
            if (!quant_type_supported(t->type) || rb == 0 || rb * rows != t->nbytes) continue;
            float *buf = malloc(nel * sizeof *buf);
            CHECK(buf != NULL);
            if (!buf) continue;
            quant_dequantize_row(t->type, t->data, buf, (int64_t)nel);
            int bad = 0;
            for (uint64_t k = 0; k < nel; k++) bad += !isfinite(buf[k]) || fabsf(buf[k]) > 100.0f;
            CHECK_EQ_INT(bad, 0);
            free(buf);
        }
        gguf_close(f);
    }
}

/* quant_q3_k_as_q6_k keeps every weight: random Q3_K blocks (every bit
 * pattern of quants, high-bit masks and scales; d a finite half) dequantise to
 * the same floats, bit for bit, as the Q6_K blocks made of them. A scale, a
 * quant or a layout off by one position changes some of the 64 K weights. */
TEST(quant_q3_k_as_q6_k_exact) {
    enum { NB = 256 };
    uint8_t *q3 = malloc(NB * 110), *q6 = malloc(NB * 210);
    float *a = malloc(sizeof(float) * NB * 256), *b = malloc(sizeof(float) * NB * 256);
    CHECK(q3 && q6 && a && b);
    if (q3 && q6 && a && b) {
        for (int i = 0; i < NB * 110; i++) q3[i] = (uint8_t)(rnd_unit() * 128.0f + 128.0f);
        for (int i = 0; i < NB; i++) { /* d: a finite half, both signs */
            const uint16_t h = quant_f32_to_f16(rnd_unit() * 0.05f);
            q3[110 * i + 108] = (uint8_t)h, q3[110 * i + 109] = (uint8_t)(h >> 8);
        }
        quant_q3_k_as_q6_k(q3, q6, NB);
        quant_dequantize_row(GGML_TYPE_Q3_K, q3, a, NB * 256);
        quant_dequantize_row(GGML_TYPE_Q6_K, q6, b, NB * 256);
        int differ = 0, nonzero = 0;
        for (int i = 0; i < NB * 256; i++) differ += !same_float(a[i], b[i]), nonzero += a[i] != 0.0f;
        CHECK_EQ_INT(differ, 0);
        CHECK(nonzero > NB * 256 / 2);
    }
    free(q3);
    free(q6);
    free(a);
    free(b);
}
