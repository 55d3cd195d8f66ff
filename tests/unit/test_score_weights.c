/* Weighted score rows (backend_span.score_row_weight, the cascade's geometric
 * row weights of the Cascading KV Cache paper) on the real default model: weights of 1 give the
 * unweighted bits, weights of 2 exactly twice them, and a weight of 0 drops
 * a row exactly; score_rows_max gives the largest of the rows' scores. Each
 * case runs the same span over a copy of the same pot. */
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "test.h"
#include "test_model.h"

static const int32_t toks[] = {504, 3575, 282, 4649, 314, 1978, 28, 253, 3654, 1345, 30, 392, 17, 26};
enum { N_TOK = sizeof toks / sizeof toks[0], N_PRE = 6, ROWS = 3 };

/* Scores of the last ROWS (or only the first of them, one_row) rows of
 * toks[N_PRE..] over a pot holding toks[..N_PRE], into out. */
static int scores_with(backend *be, const model *m, const pot *base, const float *w, int one_row, int rows_max,
                       float *out) {
    char err[256];
    pot *p = pot_new(m->n_layer, m->n_head_kv, m->head_dim, 32, POT_F32, err, sizeof err);
    if (!p || pot_copy(p, base)) return pot_free(p), -1;
    int32_t n = N_TOK - N_PRE;
    backend_span sp = {.tokens = toks + N_PRE, .n_tokens = n, .kv = p, .score_row0 = n - ROWS,
                       .n_score_rows = one_row ? 1 : ROWS, .scores = out, .score_row_weight = w,
                       .score_rows_max = rows_max, .score_combine = rows_max ? BACKEND_SCORE_MAX : BACKEND_SCORE_SUM};
    int rc = be->forward(be, &sp, 1, err, sizeof err);
    pot_free(p);
    return rc;
}

static int scores_of(backend *be, const model *m, const pot *base, const float *w, int one_row, float *out) {
    return scores_with(be, m, base, w, one_row, 0, out);
}

TEST(weighted_score_rows_scale_exactly) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    pot *base = pot_new(m->n_layer, m->n_head_kv, m->head_dim, 32, POT_F32, err, sizeof err);
    backend_span first = {.tokens = toks, .n_tokens = N_PRE, .kv = base};
    CHECK(be && base && be->forward(be, &first, 1, err, sizeof err) == 0);
    size_t n = (size_t)m->n_layer * m->n_head_kv * N_TOK;
    float *plain = calloc(n, sizeof(float)), *got = calloc(n, sizeof(float));
    const float ones[ROWS] = {1, 1, 1}, twos[ROWS] = {2, 2, 2}, first_only[ROWS] = {1, 0, 0};
    CHECK_EQ_INT(scores_of(be, m, base, NULL, 0, plain), 0);
    CHECK_EQ_INT(scores_of(be, m, base, ones, 0, got), 0);
    CHECK(memcmp(plain, got, n * sizeof(float)) == 0);
    CHECK_EQ_INT(scores_of(be, m, base, twos, 0, got), 0);
    int doubled = 1;
    for (size_t i = 0; i < n; i++) doubled &= got[i] == 2 * plain[i];
    CHECK(doubled);
    CHECK_EQ_INT(scores_of(be, m, base, first_only, 0, got), 0);
    CHECK_EQ_INT(scores_of(be, m, base, NULL, 1, plain), 0);
    CHECK(memcmp(plain, got, n * sizeof(float)) == 0);
    /* score_rows_max (KVzip's max over rows, here with the max over a group's heads, with
       which it commutes): exactly the largest of the rows' scores taken one row at a time */
    float *each = calloc(n, sizeof(float)), *largest = calloc(n, sizeof(float));
    for (int r = 0; r < ROWS && each && largest; r++) {
        float only[ROWS] = {0};
        only[r] = 1;
        CHECK_EQ_INT(scores_with(be, m, base, only, 0, 1, each), 0);
        for (size_t i = 0; i < n; i++) largest[i] = r == 0 || each[i] > largest[i] ? each[i] : largest[i];
    }
    CHECK_EQ_INT(scores_with(be, m, base, NULL, 0, 1, got), 0);
    CHECK(largest && memcmp(largest, got, n * sizeof(float)) == 0);
    CHECK_EQ_INT(scores_of(be, m, base, NULL, 0, plain), 0);
    CHECK(memcmp(plain, got, n * sizeof(float)) != 0);
    free(each);
    free(largest);
    free(plain);
    free(got);
    pot_free(base);
    if (be) be->free(be);
    model_free(m);
}
