/* A small random llama-shaped model built in memory (no file), for the CUDA
 * backend tests that need many forwards: both backends run it in
 * milliseconds under the emulator, where the default model takes seconds a
 * step. F32 matrices (the CPU backend's exact path multiplies the same
 * values), GQA with 2 query heads per KV head, head_dim 16, two layers. */
#ifndef POTSERVE_TINY_MODEL_H
#define POTSERVE_TINY_MODEL_H

#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "engine/quant.h"
#include "tests/cuda/cuda_test.h"

enum { TINY_LAYERS = 2, TINY_EMBD = 64, TINY_HEADS = 4, TINY_KV_HEADS = 2, TINY_FF = 96, TINY_VOCAB = 97,
       TINY_CTX = 2048 };

static inline weight tiny_weight(test_rng *g, int64_t rows, int64_t cols, float scale) {
    float *w = malloc((size_t)(rows * cols) * sizeof(float));
    rng_fill(g, w, (size_t)(rows * cols), -scale, scale);
    return (weight){GGML_TYPE_F32, cols, rows, (size_t)cols * sizeof(float), (const uint8_t *)w};
}

static inline float *tiny_norm(test_rng *g, int64_t n) {
    float *w = malloc((size_t)n * sizeof(float));
    rng_fill(g, w, (size_t)n, 0.8f, 1.2f);
    return w;
}

static inline model *tiny_model_new(uint64_t seed) {
    test_rng g = {seed};
    model *m = calloc(1, sizeof *m);
    snprintf(m->arch, sizeof m->arch, "llama");
    m->n_layer = TINY_LAYERS, m->n_embd = TINY_EMBD, m->n_ff = TINY_FF, m->n_head = TINY_HEADS;
    m->n_head_kv = TINY_KV_HEADS, m->head_dim = TINY_EMBD / TINY_HEADS, m->n_rot = m->head_dim;
    m->n_vocab = TINY_VOCAB, m->n_ctx_train = TINY_CTX, m->rope_base = 10000.0f, m->norm_eps = 1e-5f;
    m->rope_layout = ROPE_PAIRS_ADJACENT;
    model_set_llama_defaults(m);
    int64_t d = m->n_embd, dkv = (int64_t)m->n_head_kv * m->head_dim;
    m->tok_embd = tiny_weight(&g, m->n_vocab, d, 1.0f);
    m->output = tiny_weight(&g, m->n_vocab, d, 0.3f);
    m->output_norm = tiny_norm(&g, d);
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    for (int32_t l = 0; l < m->n_layer; l++) {
        layer_weights *lw = &m->layers[l];
        lw->attn_norm = tiny_norm(&g, d);
        lw->ffn_norm = tiny_norm(&g, d);
        /* large enough Q/K that the attention is far from uniform */
        lw->wq = tiny_weight(&g, d, d, 0.4f);
        lw->wk = tiny_weight(&g, dkv, d, 0.4f);
        lw->wv = tiny_weight(&g, dkv, d, 0.3f);
        lw->wo = tiny_weight(&g, d, d, 0.15f);
        lw->w_gate = tiny_weight(&g, m->n_ff, d, 0.2f);
        lw->w_up = tiny_weight(&g, m->n_ff, d, 0.2f);
        lw->w_down = tiny_weight(&g, d, m->n_ff, 0.15f);
    }
    return m;
}

static inline void tiny_model_free(model *m) {
    if (!m) return;
    for (int32_t l = 0; l < m->n_layer; l++) {
        layer_weights *lw = &m->layers[l];
        const weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int i = 0; i < 7; i++) free((void *)ws[i]->data);
        free(lw->attn_norm);
        free(lw->ffn_norm);
    }
    free((void *)m->tok_embd.data);
    free((void *)m->output.data);
    free(m->output_norm);
    free(m->layers);
    free(m);
}

/* Largest |a - b| over the spread of b (the logits' scale). */
static inline double tiny_rel_to_range(const float *a, const float *b, size_t n) {
    double mx = 0, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= mx)) mx = d; /* NaN wins */
        lo = fmin(lo, b[i]);
        hi = fmax(hi, b[i]);
    }
    return mx / (hi > lo ? hi - lo : 1.0);
}

/* Largest difference of the valid K/V slots of two pots over the largest |value|. */
static inline double tiny_pot_diff(const pot *a, const pot *b) {
    float x[256], y[256];
    double d = 0, scale = 0;
    if (a->n != b->n) return INFINITY;
    for (int32_t l = 0; l < a->n_layer; l++)
        for (int32_t g = 0; g < a->n_head_kv; g++)
            for (int32_t s = 0; s < a->n; s++)
                for (int kv = 0; kv < 2; kv++) {
                    (kv ? pot_read_v : pot_read_k)(a, l, g, s, 1, x);
                    (kv ? pot_read_v : pot_read_k)(b, l, g, s, 1, y);
                    for (int32_t e = 0; e < a->head_dim; e++) {
                        double dd = fabs((double)x[e] - y[e]);
                        if (!(dd <= d)) d = dd;
                        scale = fmax(scale, fabs(y[e]));
                    }
                }
    return d / (scale > 0 ? scale : 1);
}

#endif
