/* The rotated-key cache of decoding pots (cache/cache.h, filled by the CPU
 * backend) changes nothing but speed: with f32 entries the logits are the
 * same bits as without it; with f16 entries they are the same bits however
 * and whenever the cache was filled (step by step, all at once after a copy,
 * after a compaction moved every entry), and within f16 rounding of the
 * uncached ones. Also: the LM head batched over several decoding spans gives
 * each the bits it gets alone. */
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "test.h"
#include "test_model.h"

static const int32_t doc[] = {504, 3575, 282, 4649, 314, 1978, 28, 253, 3654, 1345, 30, 392, 17, 26,
                              1060, 314, 4474, 282, 260, 3868, 30};
enum { N_DOC = sizeof doc / sizeof doc[0], N_PREFIX = 12, CAP = 40 };

static pot *make_pot(const model *m, enum pot_dtype dt, int cached) {
    char err[256];
    pot *p = pot_new(m->n_layer, m->n_head_kv, m->head_dim, CAP, dt, err, sizeof err);
    if (p && cached && pot_cache_rotated_keys(p)) {
        pot_free(p);
        return NULL;
    }
    return p;
}

static int run(backend *be, pot *p, const int32_t *t, int n, float *logits) {
    char err[256];
    backend_span sp = {.tokens = t, .n_tokens = n, .kv = p, .logits_mode = logits ? BACKEND_LOGITS_LAST : BACKEND_LOGITS_NONE,
                       .logits = logits};
    return be->forward(be, &sp, 1, err, sizeof err);
}

static double max_rel(const float *a, const float *b, int n) {
    double mx = 0, scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int i = 0; i < n; i++) mx = fmax(mx, fabs(a[i] - b[i]));
    return mx / (scale > 0 ? scale : 1);
}

/* Decodes doc[N_PREFIX..] one token a step in both pots; 1 if every step's
 * logits are the same bits (and b's cache covers b after each step). */
static int decode_agrees(backend *be, const model *m, pot *a, pot *b) {
    float *la = malloc(m->n_vocab * sizeof(float)), *lb = malloc(m->n_vocab * sizeof(float));
    int ok = la && lb;
    for (int i = N_PREFIX; i < N_DOC && ok; i++) {
        ok = !run(be, a, doc + i, 1, la) && !run(be, b, doc + i, 1, lb);
        if (ok) ok = !memcmp(la, lb, m->n_vocab * sizeof(float));
        if (ok && b->k_rot) ok = b->n_rot == b->n;
        if (!ok) fprintf(stderr, "  step %d: max rel diff %g\n", i, max_rel(la, lb, m->n_vocab));
    }
    free(la);
    free(lb);
    return ok;
}

TEST(rotated_key_cache_changes_no_bits) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    /* f32 entries: cached and uncached are the same computation */
    pot *plain = make_pot(m, POT_F32, 0), *cached = make_pot(m, POT_F32, 1);
    CHECK(!run(be, plain, doc, N_PREFIX, NULL) && !run(be, cached, doc, N_PREFIX, NULL));
    CHECK_EQ_INT(cached->n_rot, N_PREFIX);
    CHECK(decode_agrees(be, m, plain, cached));
    pot_free(plain);
    pot_free(cached);

    /* f16: filled step by step == refilled at once (a copy of the same
       entries with an empty cache) */
    pot *stepwise = make_pot(m, POT_F16, 1), *refill = make_pot(m, POT_F16, 1);
    pot *f16 = make_pot(m, POT_F16, 0);
    CHECK(!run(be, stepwise, doc, N_PREFIX, NULL));
    CHECK_EQ_INT(pot_copy(refill, stepwise), 0);
    CHECK_EQ_INT(refill->n_rot, N_PREFIX);
    refill->n_rot = 0;
    CHECK(decode_agrees(be, m, stepwise, refill));
    pot_truncate(stepwise, N_PREFIX);
    stepwise->n_seen = N_PREFIX;
    CHECK_EQ_INT(pot_copy(f16, stepwise), 0);
    CHECK(decode_agrees(be, m, f16, stepwise)); /* uncached: keys rounded the same way */
    pot_free(stepwise);
    pot_free(refill);
    pot_free(f16);
    be->free(be);
    model_free(m);
}

TEST(rotated_key_cache_follows_compaction) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    pot *cached = make_pot(m, POT_F16, 1), *moved = make_pot(m, POT_F16, 1);
    CHECK(!run(be, cached, doc, N_PREFIX, NULL));
    CHECK_EQ_INT(pot_copy(moved, cached), 0);
    /* keep 2 pinned slots and every other later one: every kept key moves down */
    int32_t n_keep = 2 + (N_PREFIX - 2) / 2, lh = m->n_layer * m->n_head_kv;
    int32_t *keep = malloc((size_t)lh * n_keep * sizeof *keep);
    for (int i = 0; i < lh; i++)
        for (int j = 0; j < n_keep; j++) keep[i * n_keep + j] = j < 2 ? j : 2 + 2 * (j - 2) + (i % 2);
    cached->n_pinned = moved->n_pinned = 2;
    pot_compact(cached, keep, n_keep);
    pot_compact(moved, keep, n_keep);
    CHECK_EQ_INT(cached->n_rot, 2);
    moved->n_rot = 0; /* as if every rotation were made afresh */
    CHECK(decode_agrees(be, m, moved, cached));
    free(keep);
    pot_free(cached);
    pot_free(moved);
    be->free(be);
    model_free(m);
}

TEST(batched_lm_head_gives_each_span_its_own_bits) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    enum { S = 3 };
    int V = m->n_vocab;
    pot *alone[S], *batch[S];
    float *la = malloc((size_t)S * V * sizeof(float)), *lb = malloc((size_t)S * V * sizeof(float));
    backend_span spans[S];
    for (int s = 0; s < S; s++) {
        alone[s] = make_pot(m, POT_F16, 1);
        batch[s] = make_pot(m, POT_F16, 1);
        CHECK(!run(be, alone[s], doc + s, 4 + s, NULL) && !run(be, batch[s], doc + s, 4 + s, NULL));
        CHECK(!run(be, alone[s], doc + 10 + s, 1, la + (size_t)s * V));
        spans[s] = (backend_span){.tokens = doc + 10 + s, .n_tokens = 1, .kv = batch[s],
                                  .logits_mode = BACKEND_LOGITS_LAST, .logits = lb + (size_t)s * V};
    }
    spans[1].logits_mode = BACKEND_LOGITS_ALL; /* a mix: one ALL span between LAST ones */
    CHECK_EQ_INT(be->forward(be, spans, S, err, sizeof err), 0);
    CHECK(memcmp(la, lb, (size_t)S * V * sizeof(float)) == 0);
    for (int s = 0; s < S; s++) {
        pot_free(alone[s]);
        pot_free(batch[s]);
    }
    free(la);
    free(lb);
    be->free(be);
    model_free(m);
}
