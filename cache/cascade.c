/* Cascading KV cache (docs/methods.md; the paper "Training-free Exponential
 * Context Extension via Cascading KV Cache", Willette et al.) as a pot policy. Per
 * (layer, KV head): sinks that are never evicted, then N cascades of W = C/N
 * entries each, kept as rings of document token indices. Cascade i accepts
 * a token when t mod 2^i == 0 (and every cascade accepts while t <= C, the
 * eager fill); a full accepting cascade passes its oldest entry on to the
 * next; a non-accepting one keeps the better (by score) of the incoming token
 * and its newest entry and discards the other. Scores are the pot's
 * score_acc (an exponential moving average of attention the engine keeps).
 * The kept set of every head has the same size (the counts depend only on t),
 * so the pot is compacted with one pot_compact. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

struct cascade {
    int32_t n_lh, n_cascades, width, n_sinks;
    int64_t t;         /* non-sink tokens inserted so far */
    int64_t sinks_seen;
    int64_t *ring;     /* [n_lh][n_cascades][width] token indices */
    int32_t *head;     /* [n_lh][n_cascades] index of the oldest entry */
    int32_t *count;    /* [n_cascades] entries (the same for every head) */
};

cascade *cascade_new(int32_t n_layer, int32_t n_head_kv, int32_t n_cascades, int32_t capacity,
                     int32_t n_sinks, char *err, size_t errlen) {
    if (n_cascades < 1 || n_cascades > 30 || capacity < n_cascades || capacity % n_cascades ||
        n_sinks < 0) {
        snprintf(err, errlen,
                 "cascade: %d entries cannot be split into %d equal cascades (or bad sinks %d)",
                 capacity, n_cascades, n_sinks);
        return NULL;
    }
    cascade *c = calloc(1, sizeof *c);
    size_t lh = (size_t)n_layer * n_head_kv;
    if (c) {
        c->ring = malloc(lh * capacity * sizeof *c->ring);
        c->head = calloc(lh * n_cascades, sizeof *c->head);
        c->count = calloc((size_t)n_cascades, sizeof *c->count);
    }
    if (!c || !c->ring || !c->head || !c->count) {
        cascade_free(c);
        snprintf(err, errlen, "cascade: out of memory");
        return NULL;
    }
    c->n_lh = (int32_t)lh;
    c->n_cascades = n_cascades;
    c->width = capacity / n_cascades;
    c->n_sinks = n_sinks;
    return c;
}

void cascade_free(cascade *c) {
    if (!c) return;
    free(c->ring);
    free(c->head);
    free(c->count);
    free(c);
}

/* Slot of document token tx in (layer, head) of p (token indices increase with
 * the slot), or -1. */
static int32_t slot_of(const pot *p, int32_t lh, int64_t tx) {
    const int64_t *ti = p->token_index + (size_t)lh * p->capacity;
    int32_t lo = 0, hi = p->n - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        if (ti[mid] == tx) return mid;
        if (ti[mid] < tx) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static float score_of(const pot *p, int32_t lh, int64_t tx) {
    int32_t s = slot_of(p, lh, tx);
    return s < 0 ? -1.0f : p->score_acc[(size_t)lh * p->capacity + s];
}

/* Inserts token tx into every head's cascades. */
static void insert(cascade *c, const pot *p, int64_t tx) {
    int64_t t = c->t++;
    int64_t capacity = (int64_t)c->width * c->n_cascades;
    for (int32_t lh = 0; lh < c->n_lh; lh++) {
        int64_t x = tx;
        for (int32_t i = 0; i < c->n_cascades; i++) {
            int64_t *ring = c->ring + ((size_t)lh * c->n_cascades + i) * c->width;
            int32_t *head = c->head + (size_t)lh * c->n_cascades + i;
            int32_t cnt = c->count[i];
            int accepting = t < capacity || t % ((int64_t)1 << i) == 0;
            if (accepting) {
                if (cnt < c->width) {
                    ring[(*head + cnt) % c->width] = x;
                    x = -1;
                    break;
                }
                int64_t y = ring[*head]; /* the oldest moves on */
                ring[*head] = x;
                *head = (*head + 1) % c->width;
                x = y;
                continue;
            }
            if (cnt == 0) {
                ring[*head] = x;
                x = -1;
                break;
            }
            int32_t newest = (*head + cnt - 1) % c->width;
            if (score_of(p, lh, x) > score_of(p, lh, ring[newest])) ring[newest] = x;
            x = -1; /* the loser is discarded */
            break;
        }
        (void)x; /* non-negative here: it fell off the last cascade and is dropped */
    }
    /* counts depend only on t: every head took the same branch for the same cascade */
    for (int32_t i = 0; i < c->n_cascades; i++) {
        int accepting = t < capacity || t % ((int64_t)1 << i) == 0;
        if (accepting) {
            if (c->count[i] < c->width) {
                c->count[i]++;
                break;
            }
            continue;
        }
        if (c->count[i] == 0) c->count[i]++;
        break;
    }
}

int32_t cascade_update(cascade *c, const pot *p, int64_t first, int64_t n) {
    for (int64_t tx = first; tx < first + n; tx++) {
        if (c->sinks_seen < c->n_sinks) {
            c->sinks_seen++;
            continue;
        }
        insert(c, p, tx);
    }
    int32_t kept = p->n_pinned + (int32_t)c->sinks_seen;
    for (int32_t i = 0; i < c->n_cascades; i++) kept += c->count[i];
    return kept;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int cascade_keep(const cascade *c, const pot *p, int32_t *keep, int32_t n_keep) {
    for (int32_t lh = 0; lh < c->n_lh; lh++) {
        int32_t *out = keep + (size_t)lh * n_keep, m = 0;
        for (int32_t s = 0; s < p->n_pinned + c->sinks_seen && m < n_keep; s++) out[m++] = s;
        for (int32_t i = 0; i < c->n_cascades; i++) {
            const int64_t *ring = c->ring + ((size_t)lh * c->n_cascades + i) * c->width;
            int32_t h = c->head[(size_t)lh * c->n_cascades + i];
            for (int32_t k = 0; k < c->count[i]; k++) {
                int32_t s = slot_of(p, lh, ring[(h + k) % c->width]);
                if (s < 0 || m >= n_keep) return -1;
                out[m++] = s;
            }
        }
        if (m != n_keep) return -1;
        qsort(out, (size_t)m, sizeof *out, cmp_i32);
    }
    return 0;
}
