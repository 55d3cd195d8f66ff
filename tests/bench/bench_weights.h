/* Random quantised weights for the kernel benches (bench_matmul.c, bench_quant_dot.c):
 * random bytes, then every half-precision scale of every block (tests/quant_scales.h)
 * replaced by a small finite value, so the kernels run on ordinary numbers.
 * Header-only: each bench is one translation unit. */
#ifndef POTSERVE_BENCH_WEIGHTS_H
#define POTSERVE_BENCH_WEIGHTS_H

#include "engine/quant.h"
#include "tests/quant_scales.h"

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
    int off[2];
    quant_scale_offsets(type, off);
    for (size_t b = 0; b + bb <= bytes; b += bb)
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) {
                const uint16_t v = quant_f32_to_f16(0.001f * (float)(1 + bench_random_byte() % 64));
                w[b + (size_t)off[k]] = (uint8_t)v;
                w[b + (size_t)off[k] + 1] = (uint8_t)(v >> 8);
            }
}

#endif
