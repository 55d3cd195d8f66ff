/* Where each quantised block type keeps its half-precision scales: byte
 * offsets within one block, -1 for none (F32, F16, BF16 and Q3_K's second).
 * The unit tests and kernel benches that fill blocks with random bytes
 * overwrite these with finite values, so no block holds an infinity or NaN
 * scale. The layouts themselves: engine/quant.c. Header-only. */
#ifndef POTSERVE_TESTS_QUANT_SCALES_H
#define POTSERVE_TESTS_QUANT_SCALES_H

#include "engine/quant.h"

#include <stdint.h>

static inline void quant_scale_offsets(uint32_t type, int off[2]) {
    off[0] = off[1] = -1;
    switch (type) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q5_0: case GGML_TYPE_Q8_0: off[0] = 0; break;
    case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_1: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: off[0] = 0; off[1] = 2; break;
    case GGML_TYPE_Q2_K: off[0] = 80; off[1] = 82; break;
    case GGML_TYPE_Q3_K: off[0] = 108; break;
    case GGML_TYPE_Q6_K: off[0] = 208; break;
    default: break;
    }
}

#endif
