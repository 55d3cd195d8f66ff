/* The deterministic quantised rows and activations of the dot-product tests:
 * gen_case(type, idx) fills a random valid row of `type` (random quant bytes,
 * finite scales) and float activations of one of five kinds, seeded by type and
 * idx only, so the same case can be rebuilt anywhere. tests/unit/test_quant_dot.c
 * checks quant_vec_dot on them against golden values that
 * tests/reference/ggml_vec_dot_golden.c records from ggml on the same cases.
 * Header-only; needs engine/quant.c. */
#ifndef POTSERVE_TESTS_QUANT_CASES_H
#define POTSERVE_TESTS_QUANT_CASES_H

#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/quant_scales.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t gen_state;
static inline uint32_t gen_u32(void) {
    gen_state ^= gen_state << 13;
    gen_state ^= gen_state >> 7;
    gen_state ^= gen_state << 17;
    return (uint32_t)(gen_state >> 32);
}
static inline float gen_unit(void) { /* uniform in [-1, 1) */
    return (float)((double)gen_u32() / 2147483648.0 - 1.0);
}
static inline float gen_normal(void) { /* sum of four uniforms: roughly normal, sd ~1.15 */
    float s = gen_unit(); /* one call per statement: the order is then defined */
    s += gen_unit();
    s += gen_unit();
    return s + gen_unit();
}

static inline void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* A random valid row of n elements: random quant bytes, finite scales of
 * either sign between about 2^-12 and 2 (F32/F16/BF16: random normal values). */
static inline void gen_row(uint32_t type, uint8_t *row, int64_t n) {
    if (type == GGML_TYPE_F32) {
        for (int64_t i = 0; i < n; i++) {
            const float v = gen_normal();
            memcpy(row + 4 * i, &v, 4);
        }
        return;
    }
    if (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++)
            put_u16(row + 2 * i, type == GGML_TYPE_F16 ? quant_f32_to_f16(gen_normal()) : quant_f32_to_bf16(gen_normal()));
        return;
    }
    const size_t bytes = quant_row_bytes(type, (uint64_t)n), bb = quant_block_bytes(type);
    for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)gen_u32();
    int off[2];
    quant_scale_offsets(type, off);
    for (size_t b = 0; b < bytes; b += bb)
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) {
                const uint32_t m = gen_u32() % 1024;
                const uint32_t e = gen_u32() % 13;
                const uint32_t sign = gen_u32() & 1;
                const float mag = ldexpf(1.0f + (float)m / 1024.0f, -(int)e);
                put_u16(row + b + off[k], quant_f32_to_f16(sign ? -mag : mag));
            }
}

/* Activations: 0 normal, 1 all zero, 2 one huge value, 3 tiny, 4 quarter-integers (many ties). */
static inline void gen_act(float *x, int64_t n, int mode) {
    for (int64_t i = 0; i < n; i++) x[i] = gen_normal();
    if (mode == 1)
        for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
    if (mode == 2) x[gen_u32() % (uint32_t)n] = 3.0e4f;
    if (mode == 3)
        for (int64_t i = 0; i < n; i++) x[i] *= 1e-6f;
    if (mode == 4)
        for (int64_t i = 0; i < n; i++) x[i] = (float)(int)(x[i] * 20.0f) / 4.0f;
}

/* Golden case `idx` of a type: seed, block count and activation mode. */
static inline int64_t gen_case(uint32_t type, int idx, uint8_t *row, float *x) {
    static const int blocks[4] = {1, 3, 7, 9};
    gen_state = 0x9e3779b97f4a7c15ull ^ ((uint64_t)type << 32) ^ (uint64_t)(idx + 1) * 0x2545f4914f6cdd1dull;
    const uint32_t qk = quant_block_elems(type);
    const int64_t n = (int64_t)(qk == 1 ? 32 : qk) * blocks[idx % 4];
    gen_row(type, row, n);
    gen_act(x, n, idx % 5);
    return n;
}

#endif
