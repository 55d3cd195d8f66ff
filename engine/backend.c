/* What every backend checks before a forward: the spans fit the model and
 * their pots, no pot is shared, every token id, score row and attended slot
 * is in range, and every output asked for has a buffer. */
#include <stdio.h>

#include "backend.h"
#include "model.h"

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
