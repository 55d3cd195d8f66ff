/* Embeddings: each input is read through a pot of its own, and its embedding
 * is its final-normed hidden states (what the LM head reads) pooled as the
 * model's file says (their mean; or the first or the last token's, as
 * embedding models such as Qwen3-Embedding ask), scaled to length 1: what
 * llama.cpp computes with that pooling and normalisation on. Several inputs
 * share each forward, so many short ones (a document's passages) cost few
 * passes over the weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

enum { EMBED_FORWARD_TOKENS = 512 }; /* tokens of all inputs in one forward at most */

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

int engine_embed(engine *e, const int32_t *const *inputs, const size_t *lens, size_t n, float *out, char *err,
                 size_t errlen) {
    const int64_t d = e->m->n_embd;
    pot **pots = calloc(n ? n : 1, sizeof *pots);
    size_t *done = calloc(n ? n : 1, sizeof *done);
    backend_span *spans = calloc(n ? n : 1, sizeof *spans);
    int32_t *which = calloc(n ? n : 1, sizeof *which);
    int rc = pots && done && spans && which ? 0 : -1;
    if (rc) snprintf(err, errlen, "out of memory");
    memset(out, 0, n * (size_t)d * sizeof *out);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!lens[i]) {
            snprintf(err, errlen, "input %zu is empty", i);
            rc = -1;
        } else if (!(pots[i] = engine_new_pot(e, lens[i], err, errlen))) {
            rc = -1;
        }
    }
    /* each forward takes the next pieces of the inputs not yet read, in order */
    for (size_t first = 0; !rc && first < n;) {
        int32_t n_spans = 0, room = EMBED_FORWARD_TOKENS;
        for (size_t i = first; i < n && room > 0; i++) {
            size_t left = lens[i] - done[i];
            int32_t take = left < (size_t)room ? (int32_t)left : room;
            spans[n_spans] = (backend_span){.tokens = inputs[i] + done[i], .n_tokens = take, .kv = pots[i]};
            pool_rows(e->m->pooling, &spans[n_spans], done[i] == 0, done[i] + (size_t)take == lens[i],
                      out + i * (size_t)d);
            which[n_spans++] = (int32_t)i;
            room -= take;
        }
        rc = e->be->forward(e->be, spans, n_spans, err, errlen);
        for (int32_t s = 0; !rc && s < n_spans; s++) done[which[s]] += (size_t)spans[s].n_tokens;
        while (first < n && done[first] == lens[first]) first++;
    }
    for (size_t i = 0; !rc && i < n; i++) {
        float *v = out + i * (size_t)d;
        const float count = e->m->pooling == POOLING_MEAN ? (float)lens[i] : 1.0f;
        double norm = 0;
        for (int64_t k = 0; k < d; k++) {
            v[k] /= count;
            norm += (double)v[k] * v[k];
        }
        const float scale = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
        for (int64_t k = 0; k < d; k++) v[k] *= scale;
    }
    for (size_t i = 0; pots && i < n; i++) pot_free(pots[i]);
    free(pots);
    free(done);
    free(spans);
    free(which);
    return rc;
}
