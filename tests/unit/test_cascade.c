/* The cascading policy's state machine on a synthetic pot: one cascade is
 * StreamingLLM (sinks + the most recent entries); several cascades keep
 * sinks, a full recent cascade and older entries chosen by score, in order. */
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "test.h"

/* Appends tokens [n_seen, n_seen + n) to every (layer, head) of p with the given scores. */
static void append(pot *p, int32_t n, const float *score) {
    float zero[4] = {0};
    for (int32_t i = 0; i < n; i++) {
        for (int32_t l = 0; l < p->n_layer; l++)
            for (int32_t h = 0; h < p->n_head_kv; h++) {
                pot_write(p, l, h, p->n + i, zero, zero);
                size_t s = pot_slot(p, l, h, p->n + i);
                p->token_index[s] = p->n_seen + i;
                p->score_acc[s] = score ? score[i] : 0;
            }
    }
    p->n += n;
    p->n_seen += n;
}

/* Runs a document of `total` tokens in chunks; returns the final kept token
 * indices of (layer 0, head 0) into out (count returned). */
static int32_t run_cascade(int32_t n_cascades, int32_t cap, int32_t sinks, int32_t pinned,
                           int32_t total, int32_t chunk, int64_t *out) {
    char err[128];
    pot *p = pot_new(2, 2, 4, 1024, POT_F32, err, sizeof err);
    cascade *c = cascade_new(2, 2, n_cascades, cap, sinks, err, sizeof err);
    append(p, pinned, NULL);
    p->n_pinned = pinned;
    float score[64];
    for (int32_t done = 0; done < total; done += chunk) {
        int32_t n = total - done < chunk ? total - done : chunk;
        for (int32_t i = 0; i < n; i++) score[i] = (float)((done + i) * 7919 % 101); /* arbitrary */
        int64_t first = p->n_seen;
        append(p, n, score);
        int32_t keep = cascade_update(c, p, first, n);
        if (keep < p->n) {
            int32_t *idx = malloc((size_t)4 * keep * sizeof *idx);
            CHECK_EQ_INT(cascade_keep(c, p, idx, keep), 0);
            pot_compact(p, idx, keep);
            free(idx);
        }
    }
    int32_t n = p->n;
    for (int32_t i = 0; i < n; i++) out[i] = p->token_index[pot_slot(p, 0, 0, i)];
    /* every head keeps the same count, in increasing order */
    for (int32_t lh = 0; lh < 4; lh++)
        for (int32_t i = 1; i < n; i++)
            CHECK(p->token_index[(size_t)lh * p->capacity + i] > p->token_index[(size_t)lh * p->capacity + i - 1]);
    cascade_free(c);
    pot_free(p);
    return n;
}

TEST(cascade_with_one_cascade_is_streaming) {
    int64_t kept[1024];
    /* pinned 3, sinks 4, window 32, 300 document tokens in chunks of 10 */
    int32_t n = run_cascade(1, 32, 4, 3, 300, 10, kept);
    CHECK_EQ_INT(n, 3 + 4 + 32);
    for (int32_t i = 0; i < 7; i++) CHECK_EQ_INT(kept[i], i);          /* pinned + sinks */
    for (int32_t i = 0; i < 32; i++) CHECK_EQ_INT(kept[7 + i], 3 + 300 - 32 + i); /* most recent */
}

TEST(cascade_keeps_sinks_recent_and_scored_history) {
    int64_t kept[1024];
    int32_t n = run_cascade(4, 32, 4, 0, 400, 16, kept);
    CHECK_EQ_INT(n, 4 + 32);
    for (int32_t i = 0; i < 4; i++) CHECK_EQ_INT(kept[i], i);
    /* the newest cascade (8 entries) holds the most recent accepted tokens */
    CHECK_EQ_INT(kept[n - 1], 399);
    /* older cascades reach further back than a 32-entry window would (the span
       is W * (2^N - 1) = 120 accepted positions), but not past it */
    int old = 0;
    for (int32_t i = 4; i < n; i++) {
        old += kept[i] < 400 - 32;
        CHECK(kept[i] >= 400 - 120 - 16);
    }
    CHECK(old > 0);
    /* nothing is dropped before the cascades are full (eager fill) */
    n = run_cascade(4, 32, 4, 0, 36, 6, kept);
    CHECK_EQ_INT(n, 36);
    for (int32_t i = 0; i < 36; i++) CHECK_EQ_INT(kept[i], i);
    char err[128];
    CHECK(cascade_new(1, 1, 3, 32, 4, err, sizeof err) == NULL); /* 32 is not 3 equal cascades */
}
