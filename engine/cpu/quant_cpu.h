/* What the CPU's quantised kernels (quant_kernels.c: dot products, matrix
 * products, activation quantisation) and the packed eight-row kernels
 * (quant_pack.c) share; private to engine/cpu/. */
#ifndef POTSERVE_QUANT_CPU_H
#define POTSERVE_QUANT_CPU_H

#include <stdint.h>
#include <string.h>

#include "engine/quant_blocks.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QUANT_HAVE_AVX2 1
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2,fma,f16c")))
#define QUANT_INLINE inline __attribute__((always_inline))

static inline AVX2_FN __m256i load256(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

static inline AVX2_FN __m128i load128(const uint8_t *p) {
    return _mm_loadu_si128((const __m128i *)(const void *)p);
}

static QUANT_INLINE uint32_t u32_le(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}
#else
#define QUANT_HAVE_AVX2 0
#endif

/* quant_matmul takes the activations in chunks of about this many bytes
 * (quant_kernels.c says why), and quant_matmul_packed too. */
enum { MATMUL_CHUNK_BYTES = 16 * 1024 };

/* 1 when the AVX2 kernels are in use (the CPU has them, POTSERVE_NO_SIMD is
 * not set, quant_force_scalar is off); quant_cpu_vnni: and AVX512-VNNI's
 * vpdpbusd (quant_force_no_vnni off). */
int quant_cpu_avx2(void);
int quant_cpu_vnni(void);

#endif
