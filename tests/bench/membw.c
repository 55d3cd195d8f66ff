/* Memory bandwidth for the CPU benchmark (tests/bench/bench_cpu.py): the
 * physical bound of decoding, which streams every weight once per token.
 *
 *   build/bench/membw [MBYTES] [THREADS] [REPEATS]   (default 256 2 10)
 *
 * copy: THREADS threads each memcpy their share of an MBYTES buffer into a
 *       second one; bytes read + written / time.
 * read: THREADS threads each sum their share of the buffer (64-bit words);
 *       bytes read / time.
 * vread: the same with the widest vector loads the CPU has (AVX-512, else
 *       AVX2, else the words of `read`), four accumulators: how fast the
 *       cores can stream memory, which is what a decode step does with the
 *       weights. The decode bound of bench_kquant.py. `copy` counts bytes
 *       read and written (two streams), so it is no read rate.
 * Best of REPEATS passes (the machine may be shared), in GB/s (1e9 bytes),
 * printed as one JSON line. */
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct job {
    const uint64_t *src;
    uint64_t *dst;
    size_t n; /* words */
    int op;   /* 0 copy, 1 read, 2 vread */
    uint64_t sum;
} job;

static pthread_barrier_t bar;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t vread512(const uint64_t *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512((const void *)(p + i + 8)));
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512((const void *)(p + i + 16)));
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512((const void *)(p + i + 24)));
    }
    uint64_t s = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
    for (; i < n; i++) s += p[i];
    return s;
}

__attribute__((target("avx2"))) static uint64_t vread256(const uint64_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(const void *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(const void *)(p + i + 12)));
    }
    __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t s = (uint64_t)(_mm256_extract_epi64(a, 0) + _mm256_extract_epi64(a, 1) + _mm256_extract_epi64(a, 2) +
                            _mm256_extract_epi64(a, 3));
    for (; i < n; i++) s += p[i];
    return s;
}
#endif

static void work(job *j) {
    if (j->op == 0) {
        memcpy(j->dst, j->src, j->n * sizeof *j->src);
        return;
    }
#if defined(__x86_64__)
    if (j->op == 2 && __builtin_cpu_supports("avx512f")) {
        j->sum = vread512(j->src, j->n);
        return;
    }
    if (j->op == 2 && __builtin_cpu_supports("avx2")) {
        j->sum = vread256(j->src, j->n);
        return;
    }
#endif
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= j->n; i += 4) {
        s0 += j->src[i];
        s1 += j->src[i + 1];
        s2 += j->src[i + 2];
        s3 += j->src[i + 3];
    }
    for (; i < j->n; i++) s0 += j->src[i];
    j->sum = s0 + s1 + s2 + s3;
}

static void *run(void *arg) {
    pthread_barrier_wait(&bar);
    work(arg);
    pthread_barrier_wait(&bar);
    return NULL;
}

/* One pass of `op` over the buffers with nt threads; the caller is thread 0
 * and times from the first barrier to the second. */
static double pass(int op, const uint64_t *src, uint64_t *dst, size_t n, int nt, uint64_t *sink) {
    pthread_t th[64];
    job jobs[64];
    size_t per = n / (size_t)nt;
    pthread_barrier_init(&bar, NULL, (unsigned)nt);
    for (int t = 0; t < nt; t++) {
        size_t a = per * (size_t)t, b = t == nt - 1 ? n : a + per;
        jobs[t] = (job){src + a, dst + a, b - a, op, 0};
    }
    for (int t = 1; t < nt; t++) pthread_create(&th[t], NULL, run, &jobs[t]);
    pthread_barrier_wait(&bar);
    double t0 = now();
    work(&jobs[0]);
    pthread_barrier_wait(&bar);
    double dt = now() - t0;
    for (int t = 1; t < nt; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    for (int t = 0; t < nt; t++) *sink += jobs[t].sum;
    return dt;
}

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int nt = argc > 2 ? atoi(argv[2]) : 2, reps = argc > 3 ? atoi(argv[3]) : 10;
    if (nt < 1 || nt > 64 || reps < 1 || mb < 1) {
        fprintf(stderr, "usage: membw [MBYTES] [THREADS 1..64] [REPEATS]\n");
        return 2;
    }
    size_t bytes = mb << 20, n = bytes / sizeof(uint64_t);
    uint64_t *a = malloc(bytes), *b = malloc(bytes), sink = 0;
    if (!a || !b) {
        fprintf(stderr, "membw: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) a[i] = i * 2654435761u;
    memset(b, 1, bytes);
    double best_copy = 1e30, best_read = 1e30, best_vread = 1e30;
    for (int r = 0; r < reps; r++) {
        double c = pass(0, a, b, n, nt, &sink), d = pass(1, a, b, n, nt, &sink), v = pass(2, a, b, n, nt, &sink);
        if (c < best_copy) best_copy = c;
        if (d < best_read) best_read = d;
        if (v < best_vread) best_vread = v;
    }
    printf("{\"mbytes\": %zu, \"threads\": %d, \"repeats\": %d, \"copy_gbs\": %.3f, \"read_gbs\": %.3f, "
           "\"vread_gbs\": %.3f, \"sink\": %llu}\n",
           mb, nt, reps, 2.0 * (double)bytes / best_copy / 1e9, (double)bytes / best_read / 1e9,
           (double)bytes / best_vread / 1e9, (unsigned long long)(sink & 1));
    free(a);
    free(b);
    return 0;
}
