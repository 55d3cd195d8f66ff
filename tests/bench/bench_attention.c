/* Throughput of the attention row kernels (engine/cpu/simd.c) on each path the
 * CPU has (AVX-512, AVX2, scalar), one thread, random f16 keys and values as
 * pots hold them, in the shapes the CPU backend calls them with: a prefill
 * tile of a KV group's query heads times several tokens against a pot of
 * 2,048 entries plus a 512-token chunk, and a decoding token's heads against
 * one 256-key range. Not run by `make test` (its build stage compiles it):
 * `make build/bench/attention && build/bench/attention` (`make bench-kernels`
 * runs it with the other kernel benches).
 *
 * Prints GFLOP/s (two per multiply-add) of simd_dot_rows_f16 (scores) and
 * simd_axpy_rows_f16 (values), best of 5 passes. */
#include "engine/cpu/simd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    const char *name;
    int queries, head_dim, keys;
} shape;

static const shape shapes[] = {
    {"SmolLM2 prefill tile (3 heads x 4 tokens, hd 64)", 12, 64, 2560},
    {"SmolLM2 decode range (3 heads, hd 64)", 3, 64, 256},
    {"Qwen2.5-1.5B prefill tile (6 heads x 2 tokens, hd 128)", 12, 128, 2560},
};

static volatile float sink;

/* Best seconds of 5 passes of `iters` calls: dot (values = 0) or axpy. */
static double run(const shape *s, const float *const *qs, float *const *ys, float *P, const uint16_t *rows, int iters,
                  int values) {
    double best = 1e30;
    for (int pass = 0; pass < 5; pass++) {
        const double t0 = now();
        for (int it = 0; it < iters; it++) {
            if (values)
                simd_axpy_rows_f16(ys, s->queries, P, s->keys, rows, s->head_dim, s->keys, s->head_dim);
            else
                simd_dot_rows_f16(P, s->keys, qs, s->queries, rows, s->head_dim, s->keys, s->head_dim, 0.125f);
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    sink = P[0] + ys[0][0];
    return best;
}

int main(void) {
    srand(1);
    printf("attention row kernels, one thread, f16 rows, best of 5 (GFLOP/s: scores / values)\n");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        const int nq = s->queries, hd = s->head_dim, nk = s->keys;
        float *q = malloc(sizeof *q * nq * hd), *y = malloc(sizeof *y * nq * hd), *P = malloc(sizeof *P * nq * nk);
        uint16_t *rows = malloc(sizeof *rows * nk * hd);
        if (!q || !y || !P || !rows) return 1;
        for (int i = 0; i < nq * hd; i++) q[i] = y[i] = (float)rand() / RAND_MAX - 0.5f;
        for (int i = 0; i < nk * hd; i++) {
            _Float16 h = (_Float16)((float)rand() / RAND_MAX - 0.5f);
            memcpy(rows + i, &h, sizeof h);
        }
        for (int i = 0; i < nq * nk; i++) P[i] = (float)rand() / RAND_MAX / nk;
        const float *qs[64];
        float *ys[64];
        for (int i = 0; i < nq; i++) {
            qs[i] = q + i * hd;
            ys[i] = y + i * hd;
        }
        const double flops = 2.0 * nq * nk * hd;
        const int iters = (int)(2e8 / flops) + 1;
        printf("%s, %d keys:\n", s->name, nk);
        for (int path = 0; path < 3; path++) {
            simd_force_no_avx512(path == 1);
            simd_force_scalar(path == 2);
            const char *name = simd_name();
            if (path == 0 && strcmp(name, "avx2+avx512") != 0) continue; /* the CPU has no AVX-512 */
            if (path == 1 && strcmp(name, "avx2") != 0) continue;
            const double td = run(s, qs, ys, P, rows, iters, 0), tv = run(s, qs, ys, P, rows, iters, 1);
            printf("  %-12s %7.1f / %7.1f\n", path == 0 ? "avx512" : name, flops * iters / td / 1e9,
                   flops * iters / tv / 1e9);
        }
        simd_force_no_avx512(0);
        simd_force_scalar(0);
        free(q);
        free(y);
        free(P);
        free(rows);
    }
    return 0;
}
