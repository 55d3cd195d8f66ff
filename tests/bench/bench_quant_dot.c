/* Throughput of quant_vec_dot (weights x quantised activations), scalar vs AVX2,
 * on a matrix shaped like SmolLM2's tied output matrix (49152 rows of 576; 512
 * for the K-quants, whose rows are whole 256-element blocks), one thread, one
 * activation row (a decode step). Also shows the f32-activation quant_dot_row.
 * Not run by `make test` (its build stage compiles it). Build and run from the
 * repository root: `make build/bench/quant_dot && build/bench/quant_dot`
 * (`make bench-kernels` runs it and bench_matmul.c).
 *
 * Prints GB/s of weight bytes read (best of several passes over the matrix). */
#include "engine/quant.h"
#include "tests/bench/bench_weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile float sink;

/* Seconds for the fastest of `reps` passes over all rows. */
static double pass(uint32_t type, const uint8_t *w, size_t rb, int64_t rows, int64_t n, const void *act,
                   const float *x, int f32_path, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        float s = 0;
        const double t0 = now();
        for (int64_t i = 0; i < rows; i++)
            s += f32_path ? quant_dot_row(type, w + (size_t)i * rb, x, n) : quant_vec_dot(type, w + (size_t)i * rb, act, n);
        const double t = now() - t0;
        sink = s;
        if (t < best) best = t;
    }
    return best;
}

int main(void) {
    const struct { uint32_t type; int64_t n; } cases[] = {
        {GGML_TYPE_Q4_0, 576}, {GGML_TYPE_Q4_1, 576}, {GGML_TYPE_Q8_0, 576},
        {GGML_TYPE_Q4_K, 512}, {GGML_TYPE_Q6_K, 512},
    };
    const int64_t rows = 49152;
    printf("default kernels: %s\n", quant_simd_name());
    printf("%-5s %5s %6s %9s | %12s %12s %12s | %s\n", "type", "n", "rows", "MB", "f32 dot_row", "scalar", "avx2",
           "avx2/scalar");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint32_t type = cases[c].type;
        const int64_t n = cases[c].n;
        const size_t rb = quant_row_bytes(type, (uint64_t)n);
        uint8_t *w = malloc(rb * (size_t)rows);
        float *x = malloc((size_t)n * sizeof *x);
        void *act = malloc(quant_act_row_bytes(type, n));
        if (!w || !x || !act) return 1;
        bench_fill_weights(type, w, rb * (size_t)rows);
        for (int64_t i = 0; i < n; i++) x[i] = (float)sin(0.37 * (double)i) * 2.0f;
        quant_quantize_act(type, x, act, n);
        const double mb = (double)rb * (double)rows / 1e6;
        const double tf = pass(type, w, rb, rows, n, act, x, 1, 3);
        quant_force_scalar(1);
        const double ts = pass(type, w, rb, rows, n, act, x, 0, 5);
        quant_force_scalar(0);
        const double tv = pass(type, w, rb, rows, n, act, x, 0, 5);
        printf("%-5s %5lld %6lld %9.1f | %7.2f GB/s %7.2f GB/s %7.2f GB/s | %.1fx\n", quant_type_name(type), (long long)n,
               (long long)rows, mb, mb / 1e3 / tf, mb / 1e3 / ts, mb / 1e3 / tv, ts / tv);
        free(w);
        free(x);
        free(act);
    }
    return 0;
}
