/* What every backend checks before a forward: the spans fit the model and
 * their pots, no pot is shared, every token id, score row and attended slot
 * is in range, and every output asked for has a buffer. */
#include <stdio.h>

#include "backend.h"
#include "model.h"

/* A ring layer still holds every slot its queries see once the span's keys
 * are in: the window - 1 slots before the first query, not overwritten by
 * earlier writes (a truncation) or by the span's own (more tokens than the
 * ring's slack). */
static int check_rings(const struct model *m, const backend_span *sp, int32_t s, char *err, size_t errlen) {
    const pot *p = sp->kv;
    for (int32_t l = 0; l < m->n_layer; l++) {
        int32_t rows = pot_ring_rows(p, l), window = m->layers[l].window;
        if (!rows) continue;
        int64_t needed = p->n - (window - 1), oldest = p->ring_oldest[l];
        if (needed < 0) needed = 0;
        if ((int64_t)p->n + sp->n_tokens - rows > oldest) oldest = (int64_t)p->n + sp->n_tokens - rows;
        if (oldest > needed) {
            snprintf(err, errlen,
                     "forward: span %d: layer %d's ring of %d entries cannot hold its window of %d for %d "
                     "new tokens after %d (it keeps slots from %lld on)",
                     s, l, rows, window, sp->n_tokens, p->n, (long long)oldest);
            return -1;
        }
    }
    return 0;
}

int backend_check_spans(const struct model *m, const backend_span *spans, int32_t n_spans, int64_t *T,
                       int64_t *max_keys, char *err, size_t errlen) {
    *T = 0;
    *max_keys = 0;
    for (int32_t s = 0; s < n_spans; s++) {
        const backend_span *sp = &spans[s];
        const pot *p = sp->kv;
        if (sp->n_tokens <= 0 || !sp->tokens || !p) {
            snprintf(err, errlen, "forward: span %d is empty or has no pot", s);
            return -1;
        }
        if (p->n_layer != m->n_layer || p->n_head_kv != m->n_head_kv || p->head_dim != m->head_dim) {
            snprintf(err, errlen, "forward: span %d's pot does not fit this model", s);
            return -1;
        }
        if ((int64_t)p->n + sp->n_tokens > p->capacity) {
            snprintf(err, errlen, "forward: %d tokens do not fit the pot (%d of %d slots used)",
                     sp->n_tokens, p->n, p->capacity);
            return -1;
        }
        if (check_rings(m, sp, s, err, errlen)) return -1;
        for (int32_t i = 0; i < s; i++)
            if (spans[i].kv == p) {
                snprintf(err, errlen, "forward: spans %d and %d share a pot", i, s);
                return -1;
            }
        for (int32_t t = 0; t < sp->n_tokens; t++)
            if (sp->tokens[t] < 0 || sp->tokens[t] >= m->n_vocab) {
                snprintf(err, errlen, "forward: token id %d is outside the vocabulary (%d)",
                         sp->tokens[t], m->n_vocab);
                return -1;
            }
        if (sp->scores && (sp->score_row0 < 0 || sp->n_score_rows < 0 ||
                           sp->score_row0 + sp->n_score_rows > sp->n_tokens)) {
            snprintf(err, errlen, "forward: score rows lie outside span %d", s);
            return -1;
        }
        if (sp->hidden_sum && (sp->hidden_row0 < 0 || sp->n_hidden_rows < 0 ||
                               sp->hidden_row0 + sp->n_hidden_rows > sp->n_tokens)) {
            snprintf(err, errlen, "forward: hidden-state rows lie outside span %d", s);
            return -1;
        }
        if (sp->attend_slots) {
            if (sp->scores || sp->n_attend < 0 || sp->n_attend > p->n) {
                snprintf(err, errlen, "forward: span %d: bad partial attention (%d of %d slots%s)", s,
                         sp->n_attend, p->n, sp->scores ? ", with scores" : "");
                return -1;
            }
            for (size_t i = 0; i < (size_t)m->n_layer * m->n_head_kv * sp->n_attend; i++)
                if (sp->attend_slots[i] < 0 || sp->attend_slots[i] >= p->n) {
                    snprintf(err, errlen, "forward: span %d: attended slot %d is not in the pot", s,
                             sp->attend_slots[i]);
                    return -1;
                }
        }
        if (sp->labels && !sp->label_logprob) {
            snprintf(err, errlen, "forward: span %d has labels without an output buffer", s);
            return -1;
        }
        if (sp->logits_mode != BACKEND_LOGITS_NONE && !sp->logits) {
            snprintf(err, errlen, "forward: span %d asks for logits without a buffer", s);
            return -1;
        }
        *T += sp->n_tokens;
        if (p->n + sp->n_tokens > *max_keys) *max_keys = p->n + sp->n_tokens;
    }
    return 0;
}
