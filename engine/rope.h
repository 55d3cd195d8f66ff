/* Rotary position embedding (shared by the CPU and CUDA backends): rotates the first n_rot
 * elements of a head vector to a position, with the pair layout the model's
 * architecture uses. Angles come from a table for positions inside the
 * model's context and are computed beyond it. */
#ifndef POTSERVE_ROPE_H
#define POTSERVE_ROPE_H

#include <stdint.h>

#include "engine/model.h"

typedef struct rope {
    int32_t n_rot, half;
    enum rope_layout layout;
    int64_t n_table;  /* positions with precomputed angles */
    double *inv_freq; /* [half] angle per position of each pair: base^(-2i/n_rot), scaled */
    double mscale;    /* cos and sin are multiplied by it (YaRN), else 1 */
    float *cs;        /* [n_table][half][2] cos and sin */
} rope;

/* 0, or -1 when memory is short. rope_free releases it (also after a failure). */
int rope_init(rope *r, int32_t n_rot, float base, enum rope_layout layout, int64_t n_table);
/* The same with RoPE scaling (linear, YaRN, per-pair factors: model.h). */
int rope_init_params(rope *r, int32_t n_rot, const rope_params *p, enum rope_layout layout, int64_t n_table);
void rope_free(rope *r);
/* Rotates v to position pos (>= 0). */
void rope_rotate(const rope *r, float *v, int64_t pos);

#endif
