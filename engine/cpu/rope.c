/* RoPE: a table of cos/sin per (position, pair) so rotating a key costs a few
 * multiplies (the CPU backend rotates every pot key by its slot on each
 * forward, since pots keep keys before RoPE). */
#include "rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int rope_init(rope *r, int32_t n_rot, float base, enum rope_layout layout, int64_t n_table) {
    memset(r, 0, sizeof *r);
    r->n_rot = n_rot;
    r->half = n_rot / 2;
    r->layout = layout;
    r->n_table = n_table;
    r->inv_freq = malloc((size_t)(r->half ? r->half : 1) * sizeof *r->inv_freq);
    r->cs = malloc((size_t)(n_table > 0 ? n_table : 1) * (r->half ? r->half : 1) * 2 * sizeof *r->cs);
    if (!r->inv_freq || !r->cs) return -1;
    for (int32_t i = 0; i < r->half; i++) r->inv_freq[i] = pow((double)base, -2.0 * i / n_rot);
    for (int64_t pos = 0; pos < n_table; pos++)
        for (int32_t i = 0; i < r->half; i++) {
            double theta = (double)pos * r->inv_freq[i];
            r->cs[((size_t)pos * r->half + i) * 2] = (float)cos(theta);
            r->cs[((size_t)pos * r->half + i) * 2 + 1] = (float)sin(theta);
        }
    return 0;
}

void rope_free(rope *r) {
    free(r->inv_freq);
    free(r->cs);
    memset(r, 0, sizeof *r);
}

void rope_rotate(const rope *r, float *v, int64_t pos) {
    const float *cs = pos < r->n_table ? r->cs + (size_t)pos * r->half * 2 : NULL;
    for (int32_t i = 0; i < r->half; i++) {
        float c, s;
        if (cs) {
            c = cs[2 * i];
            s = cs[2 * i + 1];
        } else {
            double theta = (double)pos * r->inv_freq[i];
            c = (float)cos(theta);
            s = (float)sin(theta);
        }
        int32_t a = r->layout == ROPE_PAIRS_ADJACENT ? 2 * i : i;
        int32_t b = r->layout == ROPE_PAIRS_ADJACENT ? 2 * i + 1 : i + r->half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}
