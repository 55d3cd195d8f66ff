/* Pot storage: one contiguous allocation per K and V so a (layer, head)'s
 * slots are adjacent and attention reads them as one matrix. */
#include "cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t pot_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity) {
    if (n_layer <= 0 || n_head_kv <= 0 || head_dim <= 0 || capacity <= 0) return 0;
    size_t per_slot = 2 * sizeof(float) * (size_t)head_dim;
    size_t slots = (size_t)n_layer * (size_t)n_head_kv * (size_t)capacity;
    if (slots > SIZE_MAX / per_slot) return 0;
    size_t kv = slots * per_slot, idx = (size_t)capacity * sizeof(int64_t);
    return kv > SIZE_MAX - idx ? 0 : kv + idx;
}

pot *pot_new(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity, char *err,
             size_t errlen) {
    size_t bytes = pot_bytes(n_layer, n_head_kv, head_dim, capacity);
    if (!bytes) {
        snprintf(err, errlen, "pot: invalid size (%d layers, %d heads, dim %d, %d slots)", n_layer,
                 n_head_kv, head_dim, capacity);
        return NULL;
    }
    pot *p = calloc(1, sizeof *p);
    size_t n = (size_t)n_layer * n_head_kv * capacity * head_dim;
    if (p) {
        p->k = malloc(n * sizeof(float));
        p->v = malloc(n * sizeof(float));
        p->token_index = malloc((size_t)capacity * sizeof(int64_t));
    }
    if (!p || !p->k || !p->v || !p->token_index) {
        pot_free(p);
        snprintf(err, errlen, "pot: out of memory for %zu bytes", bytes);
        return NULL;
    }
    p->n_layer = n_layer;
    p->n_head_kv = n_head_kv;
    p->head_dim = head_dim;
    p->capacity = capacity;
    return p;
}

void pot_free(pot *p) {
    if (!p) return;
    free(p->k);
    free(p->v);
    free(p->token_index);
    free(p);
}

float *pot_k(const pot *p, int32_t layer, int32_t head) {
    return p->k + ((size_t)layer * p->n_head_kv + head) * (size_t)p->capacity * p->head_dim;
}

float *pot_v(const pot *p, int32_t layer, int32_t head) {
    return p->v + ((size_t)layer * p->n_head_kv + head) * (size_t)p->capacity * p->head_dim;
}

void pot_truncate(pot *p, int32_t n) {
    if (n >= 0 && n < p->n) p->n = n;
    if (p->n_pinned > p->n) p->n_pinned = p->n;
}

int pot_copy(pot *dst, const pot *src) {
    if (dst->n_layer != src->n_layer || dst->n_head_kv != src->n_head_kv ||
        dst->head_dim != src->head_dim || dst->capacity < src->n)
        return -1;
    size_t row = (size_t)src->n * src->head_dim * sizeof(float);
    for (int32_t l = 0; l < src->n_layer; l++)
        for (int32_t h = 0; h < src->n_head_kv; h++) {
            memcpy(pot_k(dst, l, h), pot_k(src, l, h), row);
            memcpy(pot_v(dst, l, h), pot_v(src, l, h), row);
        }
    memcpy(dst->token_index, src->token_index, (size_t)src->n * sizeof(int64_t));
    dst->n = src->n;
    dst->n_pinned = src->n_pinned;
    dst->n_seen = src->n_seen;
    return 0;
}
