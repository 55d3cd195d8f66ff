/* Throughput of a prefill-shaped matrix product, one thread: a weight matrix
 * times 512 quantised activation rows, out[t][r] = quant_vec_dot(row r, act t),
 * computed three ways that must give the same bits:
 *   single  for each row, for each activation: quant_vec_dot (what
 *           engine/cpu/cpu_backend.c's matmul_rows_quant did);
 *   multi   for each row: quant_vec_dot_multi over all activations, then the
 *           results scattered into out[t][r];
 *   matmul  quant_matmul over the whole block (activation chunks, 2x4 tiles);
 *   packed  quant_matmul_packed on the rows packed eight at a time, where the
 *           type packs (its own float order, quant.h: not compared here).
 * Rows with one activation are a decode step through a larger matrix.
 * BENCH_TYPE=Q4_K runs only that type's rows.
 * The main case is SmolLM2-135M's ffn_gate / ffn_up shape (1536 rows of 576,
 * Q4_1); the other rows show the other types and shapes (K-quant rows must be
 * whole 256-element blocks, so they use the ffn_down shape, 576 rows of 1536).
 * Not run by `make test` (its build stage compiles it). Build and run from the
 * repository root: `make build/bench/matmul && build/bench/matmul`
 * (`make bench-kernels` runs it and bench_quant_dot.c).
 *
 * Columns: milliseconds for the 512 activations (best of several passes),
 * "tok/s": activation rows per second through this one matrix, "GB/s": weight
 * bytes consumed per second counting one pass over the matrix per activation
 * row (as bench_quant_dot counts it), "GMAC/s": multiply-adds per second.
 * POTSERVE_NO_SIMD=1 measures the scalar kernels. */
#include "engine/quant.h"
#include "tests/bench/bench_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Thread CPU time, so that other processes on a shared machine cost less noise
 * (their cache pollution remains; take the best of several passes). */
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { T_ACTS = 512 };
static int64_t T_ACTS_NOW = T_ACTS; /* this case's activation rows (1: a decode step) */
#define T_ACTS T_ACTS_NOW

typedef struct mat {
    uint32_t type;
    int64_t rows, n;
    size_t rb, ab;
    uint8_t *w, *act, *packed; /* packed: NULL when quant_packable says no */
    float *out, *tmp;
} mat;

static void run_single(const mat *m) {
    for (int64_t r = 0; r < m->rows; r++) {
        const uint8_t *row = m->w + (size_t)r * m->rb;
        for (int64_t t = 0; t < T_ACTS; t++)
            m->out[t * m->rows + r] = quant_vec_dot(m->type, row, m->act + (size_t)t * m->ab, m->n);
    }
}

static void run_multi(const mat *m) {
    for (int64_t r = 0; r < m->rows; r++) {
        quant_vec_dot_multi(m->type, m->w + (size_t)r * m->rb, m->act, m->ab, T_ACTS, m->n, m->tmp);
        for (int64_t t = 0; t < T_ACTS; t++) m->out[t * m->rows + r] = m->tmp[t];
    }
}

static void run_matmul(const mat *m) {
    quant_matmul(m->type, m->w, m->rb, m->rows, m->act, m->ab, T_ACTS, m->n, m->out, (size_t)m->rows);
}

static void run_packed(const mat *m) {
    quant_matmul_packed(m->type, m->packed, m->rows / 8, m->act, m->ab, T_ACTS, m->n, m->out, (size_t)m->rows);
}

/* Seconds for the fastest of `reps` runs. */
static double best(void (*fn)(const mat *), const mat *m, int reps) {
    double b = 1e30;
    for (int i = 0; i < reps; i++) {
        const double t0 = now();
        fn(m);
        const double t = now() - t0;
        if (t < b) b = t;
    }
    return b;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 7;
    /* acts 1: a decode step through Qwen2.5-1.5B's ffn_up (8960 x 1536), its
     * weights streamed from memory (GB/s then is what the memory gives) */
    const struct { uint32_t type; int64_t rows, n, acts; } cases[] = {
        {GGML_TYPE_Q4_1, 1536, 576, 512}, {GGML_TYPE_Q4_1, 576, 1536, 512}, {GGML_TYPE_Q4_0, 1536, 576, 512},
        {GGML_TYPE_Q8_0, 1536, 576, 512}, {GGML_TYPE_Q5_0, 1536, 576, 512}, {GGML_TYPE_Q5_1, 1536, 576, 512},
        {GGML_TYPE_Q4_K, 576, 1536, 512}, {GGML_TYPE_Q5_K, 576, 1536, 512}, {GGML_TYPE_Q6_K, 576, 1536, 512},
        {GGML_TYPE_Q4_K, 1536, 8960, 512}, {GGML_TYPE_Q6_K, 1536, 8960, 512},
        {GGML_TYPE_Q4_K, 8960, 1536, 1},  {GGML_TYPE_Q5_K, 8960, 1536, 1},  {GGML_TYPE_Q6_K, 8960, 1536, 1},
    };
    const char *only = getenv("BENCH_TYPE"); /* e.g. BENCH_TYPE=Q4_K: only that type's rows */
    printf("kernels: %s; %d activation rows, one thread, best of %d\n", quant_simd_name(), (int)T_ACTS, reps);
    printf("%-5s %5s %5s | %-7s %8s %8s %7s %7s | %s\n", "type", "rows", "n", "method", "ms", "tok/s", "GB/s",
           "GMAC/s", "speed-up, same bits");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mat m = {.type = cases[c].type, .rows = cases[c].rows, .n = cases[c].n};
        if (only && strcmp(only, quant_type_name(m.type)) != 0) continue;
        T_ACTS_NOW = cases[c].acts;
        m.rb = quant_row_bytes(m.type, (uint64_t)m.n);
        m.ab = quant_act_row_bytes(m.type, m.n);
        m.w = malloc(m.rb * (size_t)m.rows);
        m.act = malloc(m.ab * T_ACTS);
        m.out = malloc(sizeof(float) * T_ACTS * (size_t)m.rows);
        m.tmp = malloc(sizeof(float) * T_ACTS);
        float *ref = malloc(sizeof(float) * T_ACTS * (size_t)m.rows), *x = malloc(sizeof(float) * (size_t)m.n);
        if (!m.w || !m.act || !m.out || !m.tmp || !ref || !x) return 1;
        bench_fill_weights(m.type, m.w, m.rb * (size_t)m.rows);
        for (int64_t t = 0; t < T_ACTS; t++) {
            for (int64_t i = 0; i < m.n; i++) x[i] = (float)sin(0.37 * (double)i + 0.11 * (double)t) * 2.0f;
            quant_quantize_act(m.type, x, m.act + (size_t)t * m.ab, m.n);
        }
        if (quant_packable(m.type, m.rows, m.n)) {
            m.packed = malloc((size_t)(m.rows / 8) * quant_packed_group_bytes(m.type, m.n));
            if (!m.packed) return 1;
            quant_pack_rows(m.type, m.w, m.rb, m.rows, m.n, m.packed);
        }
        static const char *names[4] = {"single", "multi", "matmul", "packed"};
        void (*fns[4])(const mat *) = {run_single, run_multi, run_matmul, run_packed};
        double ts = 0;
        for (int k = 0; k < (m.packed ? 4 : 3); k++) {
            memset(m.out, 0, sizeof(float) * T_ACTS * (size_t)m.rows);
            const double t = best(fns[k], &m, k == 0 ? (reps + 1) / 2 : reps);
            int same = 1;
            if (k == 0) {
                memcpy(ref, m.out, sizeof(float) * T_ACTS * (size_t)m.rows);
                ts = t;
            } else if (k < 3) {
                same = memcmp(ref, m.out, sizeof(float) * T_ACTS * (size_t)m.rows) == 0;
            } /* packed: its own float order (quant.h), tested in tests/unit/test_quant_multi.c */
            const double macs = (double)m.rows * (double)m.n * T_ACTS;
            const double bytes = (double)m.rb * (double)m.rows * T_ACTS;
            printf("%-5s %5lld %5lld | %-7s %8.2f %8.0f %7.1f %7.2f | %.2fx%s\n", quant_type_name(m.type),
                   (long long)m.rows, (long long)m.n, names[k], t * 1e3, T_ACTS / t, bytes / t / 1e9, macs / t / 1e9,
                   ts / t, k == 3 ? " (own rounding)" : same ? "" : "  BITS DIFFER");
            if (!same) return 1;
        }
        free(m.w);
        free(m.packed);
        free(m.act);
        free(m.out);
        free(m.tmp);
        free(ref);
        free(x);
    }
    return 0;
}
