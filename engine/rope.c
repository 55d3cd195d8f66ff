/* RoPE: a table of cos/sin per (position, pair) so rotating a key costs a few
 * multiplies (the CPU backend rotates every pot key by its slot on each
 * forward, since pots keep keys before RoPE). */
#include "engine/rope.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* YaRN's blend of pair i between the interpolated (0) and the original (1)
 * angle, from the dimensions where beta_fast and beta_slow rotations fit the
 * original context (llama.cpp's rope_yarn_ramp and corr_dims). */
static double yarn_mix(const rope_params *p, int32_t n_rot, int32_t i) {
    if (p->ext_factor == 0.0f) return 0.0;
    const double two_pi = 6.283185307179586;
    double lo = floor(n_rot * log(p->n_ctx_orig / (p->beta_fast * two_pi)) / (2 * log(p->base)));
    double hi = ceil(n_rot * log(p->n_ctx_orig / (p->beta_slow * two_pi)) / (2 * log(p->base)));
    if (lo < 0) lo = 0;
    if (hi > n_rot - 1) hi = n_rot - 1;
    double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
    return (1 - (y < 0 ? 0 : y > 1 ? 1 : y)) * p->ext_factor;
}

int rope_init_params(rope *r, int32_t n_rot, const rope_params *p, enum rope_layout layout, int64_t n_table) {
    memset(r, 0, sizeof *r);
    r->n_rot = n_rot;
    r->half = n_rot / 2;
    r->layout = layout;
    r->n_table = n_table;
    r->mscale = p->mscale;
    r->inv_freq = malloc((size_t)(r->half ? r->half : 1) * sizeof *r->inv_freq);
    r->cs = malloc((size_t)(n_table > 0 ? n_table : 1) * (r->half ? r->half : 1) * 2 * sizeof *r->cs);
    if (!r->inv_freq || !r->cs) return -1;
    /* every variant keeps the angle linear in the position: one rate per pair */
    for (int32_t i = 0; i < r->half; i++) {
        double extrap = pow((double)p->base, -2.0 * i / n_rot) / (p->freq_factors ? p->freq_factors[i] : 1.0);
        double mix = yarn_mix(p, n_rot, i);
        r->inv_freq[i] = extrap * (p->freq_scale * (1 - mix) + mix);
    }
    for (int64_t pos = 0; pos < n_table; pos++)
        for (int32_t i = 0; i < r->half; i++) {
            double theta = (double)pos * r->inv_freq[i];
            r->cs[((size_t)pos * r->half + i) * 2] = (float)(cos(theta) * r->mscale);
            r->cs[((size_t)pos * r->half + i) * 2 + 1] = (float)(sin(theta) * r->mscale);
        }
    return 0;
}

int rope_init(rope *r, int32_t n_rot, float base, enum rope_layout layout, int64_t n_table) {
    const rope_params plain = {.base = base, .freq_scale = 1.0f, .mscale = 1.0f};
    return rope_init_params(r, n_rot, &plain, layout, n_table);
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
            c = (float)(cos(theta) * r->mscale);
            s = (float)(sin(theta) * r->mscale);
        }
        int32_t a = r->layout == ROPE_PAIRS_ADJACENT ? 2 * i : i;
        int32_t b = r->layout == ROPE_PAIRS_ADJACENT ? 2 * i + 1 : i + r->half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}
