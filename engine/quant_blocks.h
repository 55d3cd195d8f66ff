/* Block layouts shared by the formats (engine/quant.c) and the CPU kernels
 * (engine/cpu/quant_kernels.c, quant_pack.c); private to engine/. Every
 * block stores its scales as IEEE halves, little-endian; the activation
 * blocks are described in engine/cpu/quant_kernels.c. */
#ifndef POTSERVE_QUANT_BLOCKS_H
#define POTSERVE_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "engine/quant.h"

enum { QK = 32, QK_K = 256 };
/* activation blocks: Q8_0, Q8_1 (32 elements) and Q8_K (256) */
enum { Q8_0_BYTES = 2 + QK, Q8_1_BYTES = 4 + QK, Q8_K_BYTES = 4 + QK_K + 2 * (QK_K / 16) };

static inline float half_at(const uint8_t *p) {
    return quant_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static inline uint32_t u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Q4_K / Q5_K 12-byte scale block: eight 6-bit scales and eight 6-bit mins. */
static inline void scale_min_k4(int j, const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
        *mn = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* Q8_K: its d (an f32) and the sum of its 16-element group j. */
static inline float q8k_d(const uint8_t *b) {
    float d;
    memcpy(&d, b, sizeof d);
    return d;
}

static inline int q8k_bsum(const uint8_t *b, int j) {
    int16_t v;
    memcpy(&v, b + 4 + QK_K + 2 * j, sizeof v);
    return v;
}

#endif
