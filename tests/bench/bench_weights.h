/* Random quantised weights for the kernel benches (bench_matmul.c, bench_quant_dot.c):
 * random bytes, then every half-precision scale of every block replaced by a small
 * finite value, so no block holds an infinity or NaN scale and the kernels run on
 * ordinary numbers. Header-only: each bench is one translation unit. */
#ifndef POTSERVE_BENCH_WEIGHTS_H
#define POTSERVE_BENCH_WEIGHTS_H

#include "engine/quant.h"

#include <stddef.h>
#include <stdint.h>

static uint64_t bench_rng = 0x243f6a8885a308d3ull;

static uint8_t bench_random_byte(void) {
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return (uint8_t)(bench_rng >> 32);
}

static void bench_fill_weights(uint32_t type, uint8_t *w, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) w[i] = bench_random_byte();
    const size_t bb = quant_block_bytes(type);
    /* Byte offsets of each type's half-precision scales in its block (-1: none). */
    static const struct { uint32_t type; int off[2]; } halves[] = {
        {GGML_TYPE_Q4_0, {0, -1}}, {GGML_TYPE_Q4_1, {0, 2}}, {GGML_TYPE_Q5_0, {0, -1}}, {GGML_TYPE_Q5_1, {0, 2}},
        {GGML_TYPE_Q8_0, {0, -1}}, {GGML_TYPE_Q4_K, {0, 2}}, {GGML_TYPE_Q5_K, {0, 2}}, {GGML_TYPE_Q6_K, {208, -1}},
    };
    for (size_t h = 0; h < sizeof halves / sizeof halves[0]; h++) {
        if (halves[h].type != type) continue;
        for (size_t b = 0; b + bb <= bytes; b += bb)
            for (int k = 0; k < 2; k++)
                if (halves[h].off[k] >= 0) {
                    const uint16_t v = quant_f32_to_f16(0.001f * (float)(1 + bench_random_byte() % 64));
                    w[b + (size_t)halves[h].off[k]] = (uint8_t)v;
                    w[b + (size_t)halves[h].off[k] + 1] = (uint8_t)(v >> 8);
                }
    }
}

#endif
