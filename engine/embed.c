/* Embeddings: each input is read through a pot of its own, and its embedding
 * is its final-normed hidden states (what the LM head reads) pooled as the
 * model's file says (their mean; or the first or the last token's, as
 * embedding models such as Qwen3-Embedding ask), scaled to length 1: what
 * llama.cpp computes with that pooling and normalisation on. Several inputs
 * share each forward, so many short ones (a document's passages) cost few
 * passes over the weights; the reading goes one forward a step, so that a
 * caller can let other work run between steps (a 32K-token input is minutes
 * of one 1.5B model's time on two cores). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

enum { EMBED_FORWARD_TOKENS = 512 }; /* tokens of all inputs in one forward at most */

struct engine_embedder {
    engine *e;
    const int32_t *const *inputs;
    const size_t *lens;
    size_t n, first; /* inputs [0, first) are read */
    float *out;
    pot **pots;      /* each input's, from its first piece to its last */
    size_t *done;    /* tokens of each input read */
    backend_span *spans;
    size_t *which;
};

void engine_embedder_free(engine_embedder *x) {
    if (!x) return;
    for (size_t i = 0; x->pots && i < x->n; i++) pot_free(x->pots[i]);
    free(x->pots);
    free(x->done);
    free(x->spans);
    free(x->which);
    free(x);
}

engine_embedder *engine_embedder_new(engine *e, const int32_t *const *inputs, const size_t *lens, size_t n,
                                     float *out, char *err, size_t errlen) {
    engine_embedder *x = calloc(1, sizeof *x);
    size_t m = n ? n : 1;
    if (!x || !(x->pots = calloc(m, sizeof *x->pots)) || !(x->done = calloc(m, sizeof *x->done)) ||
        !(x->spans = calloc(m, sizeof *x->spans)) || !(x->which = calloc(m, sizeof *x->which))) {
        engine_embedder_free(x);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    x->e = e;
    x->inputs = inputs;
    x->lens = lens;
    x->n = n;
    x->out = out;
    for (size_t i = 0; i < n; i++)
        if (!lens[i] || lens[i] > (size_t)e->m->n_ctx_train) {
            snprintf(err, errlen, "input %zu has %zu tokens: 1 to %d are read", i, lens[i], e->m->n_ctx_train);
            engine_embedder_free(x);
            return NULL;
        }
    memset(out, 0, n * (size_t)e->m->n_embd * sizeof *out);
    return x;
}

size_t engine_embed_memory(const engine *e, const size_t *lens, size_t n) {
    const model *m = e->m;
    size_t longest = 0, all = 0;
    for (size_t i = 0; i < n; i++) {
        longest = lens[i] > longest ? lens[i] : longest;
        all += lens[i];
    }
    size_t tokens = 2 * longest + EMBED_FORWARD_TOKENS; /* (a forward's middle inputs are read whole in it) */
    if (tokens > all) tokens = all;
    return pot_bytes(m->n_layer, m->n_head_kv, m->head_dim, (int32_t)(tokens ? tokens : 1), e->kv_dtype);
}

/* Which rows of a piece of an input its embedding takes (first, last: whether
 * the piece starts or ends the input). */
static void pool_rows(enum model_pooling pooling, backend_span *sp, int first, int last, float *sum) {
    if (pooling == POOLING_MEAN) {
        sp->hidden_sum = sum;
        sp->n_hidden_rows = sp->n_tokens;
    } else if (pooling == POOLING_CLS ? first : last) {
        sp->hidden_sum = sum;
        sp->hidden_row0 = pooling == POOLING_CLS ? 0 : sp->n_tokens - 1;
        sp->n_hidden_rows = 1;
    }
}

/* Input i's embedding, from its hidden-state sum: scaled to length 1. */
static void finish_input(engine_embedder *x, size_t i) {
    const int64_t d = x->e->m->n_embd;
    float *v = x->out + i * (size_t)d;
    const float count = x->e->m->pooling == POOLING_MEAN ? (float)x->lens[i] : 1.0f;
    double norm = 0;
    for (int64_t k = 0; k < d; k++) {
        v[k] /= count;
        norm += (double)v[k] * v[k];
    }
    const float scale = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
    for (int64_t k = 0; k < d; k++) v[k] *= scale;
    pot_free(x->pots[i]);
    x->pots[i] = NULL;
}

int engine_embedder_step(engine_embedder *x, int64_t *tokens, char *err, size_t errlen) {
    engine *e = x->e;
    const int64_t d = e->m->n_embd;
    int32_t n_spans = 0, room = EMBED_FORWARD_TOKENS;
    /* the next pieces of the inputs not yet read, in order */
    for (size_t i = x->first; i < x->n && room > 0; i++) {
        if (!x->pots[i] && !(x->pots[i] = engine_new_pot(e, x->lens[i], err, errlen))) return -1;
        size_t left = x->lens[i] - x->done[i];
        int32_t take = left < (size_t)room ? (int32_t)left : room;
        x->spans[n_spans] = (backend_span){.tokens = x->inputs[i] + x->done[i], .n_tokens = take, .kv = x->pots[i]};
        pool_rows(e->m->pooling, &x->spans[n_spans], x->done[i] == 0, x->done[i] + (size_t)take == x->lens[i],
                  x->out + i * (size_t)d);
        x->which[n_spans++] = i;
        room -= take;
    }
    if (n_spans && e->be->forward(e->be, x->spans, n_spans, err, errlen)) return -1;
    for (int32_t s = 0; s < n_spans; s++) {
        size_t i = x->which[s];
        x->done[i] += (size_t)x->spans[s].n_tokens;
        if (x->done[i] == x->lens[i]) finish_input(x, i);
    }
    while (x->first < x->n && x->done[x->first] == x->lens[x->first]) x->first++;
    if (tokens) *tokens = EMBED_FORWARD_TOKENS - room;
    return x->first < x->n;
}

int engine_embed(engine *e, const int32_t *const *inputs, const size_t *lens, size_t n, float *out, char *err,
                 size_t errlen) {
    engine_embedder *x = engine_embedder_new(e, inputs, lens, n, out, err, errlen);
    int rc = x ? 1 : -1;
    while (rc == 1) rc = engine_embedder_step(x, NULL, err, errlen);
    engine_embedder_free(x);
    return rc;
}
