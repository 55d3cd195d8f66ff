/* Helpers of the CUDA tests (tests/cuda/): device buffers from host data and
 * back, a seeded generator for random inputs, and CHECK_CUDA. The tests are
 * C, built once against the emulator (make test-cuda-emu) and once against
 * the CUDA runtime on a GPU (make test-cuda). */
#ifndef POTSERVE_CUDA_TEST_H
#define POTSERVE_CUDA_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "tests/unit/test.h"

#define CHECK_CUDA(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            test_failures++;                                                                      \
            fprintf(stderr, "  %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
        }                                                                                         \
    } while (0)

/* A device copy of bytes of host data (the caller cudaFrees it). */
static inline void *dev_from(const void *host, size_t bytes) {
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, bytes ? bytes : 1);
    if (e != cudaSuccess) { /* no device, or out of memory: nothing after this can run */
        fprintf(stderr, "cudaMalloc(%zu): %s\n", bytes, cudaGetErrorString(e));
        exit(1);
    }
    if (host && bytes) cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    return d;
}

/* Device memory with unspecified contents (the emulator fills it with NaNs). */
static inline void *dev_alloc(size_t bytes) { return dev_from(NULL, bytes); }

static inline void host_from(void *host, const void *dev, size_t bytes) {
    cudaDeviceSynchronize();
    if (bytes) cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
}

/* xorshift64*: each test owns its state, so tests do not disturb each other. */
typedef struct test_rng {
    uint64_t s;
} test_rng;

static inline uint32_t rng_u32(test_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (uint32_t)((r->s * 0x2545F4914F6CDD1DULL) >> 32);
}

/* Uniform in [lo, hi). */
static inline float rng_float(test_rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)(rng_u32(r) >> 8) * (1.0f / 16777216.0f);
}

static inline void rng_fill(test_rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = rng_float(r, lo, hi);
}

/* Largest |a - b| / (abs_tol + rel_tol * |b|) over n values; <= 1 passes. */
static inline double worst_error(const float *a, const float *b, size_t n, double abs_tol, double rel_tol) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]) / (abs_tol + rel_tol * fabs((double)b[i]));
        if (!(e <= worst)) worst = e; /* NaN wins */
    }
    return worst;
}

#endif
