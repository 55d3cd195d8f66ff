/* InfiniPot's ablations (the InfiniPot paper's Table 4):
 * - original positions (no context reset): pot_rope_pos maps a slot to its
 *   token's stream index; off, it is the slot, so default pots compute the same
 *   bits as before; on without evictions, the same bits as off (positions
 *   agree) and the logits of a full prefill; on with evictions, positions run
 *   past the rope table (the model's window) and are computed, not read past it;
 * - no catalyst: the chunk's own last rows score instead of the catalyst;
 * - both are refused where they make no sense. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "engine/rope.h"
#include "engine/engine.h"
#include "test.h"
#include "test_model.h"

TEST(pot_rope_pos_is_the_slot_unless_original_positions) {
    char err[128];
    pot *p = pot_new(2, 2, 4, 16, POT_F32, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    pot_append_done(p, 10);
    for (int32_t s = 0; s < 16; s++) CHECK_EQ_INT(pot_rope_pos(p, 1, 1, s), s);
    /* keep slots 0, 3, 7, 9 everywhere but (1, 1), which keeps 0, 2, 5, 8 */
    int32_t keep[4 * 4];
    for (int lh = 0; lh < 4; lh++) {
        const int32_t a[4] = {0, 3, 7, 9}, b[4] = {0, 2, 5, 8};
        memcpy(keep + lh * 4, lh == 3 ? b : a, sizeof a);
    }
    pot_compact(p, keep, 4);
    CHECK_EQ_INT(pot_rope_pos(p, 0, 0, 2), 2); /* default: context reset, slot = position */
    p->original_positions = 1;
    CHECK_EQ_INT(pot_rope_pos(p, 0, 0, 2), 7);
    CHECK_EQ_INT(pot_rope_pos(p, 1, 1, 2), 5);
    CHECK_EQ_INT(pot_rope_pos(p, 0, 1, 3), 9);
    /* new tokens (slots from n on) continue the stream, whatever the head */
    CHECK_EQ_INT(pot_rope_pos(p, 0, 0, 4), 10);
    CHECK_EQ_INT(pot_rope_pos(p, 1, 1, 6), 12);
    pot *q = pot_new(2, 2, 4, 16, POT_F32, err, sizeof err);
    CHECK(q && pot_copy(q, p) == 0 && q->original_positions == 1);
    pot_free(q);
    pot_free(p);
}

TEST(rope_beyond_its_table_is_computed_like_the_table) {
    rope small, big;
    CHECK_EQ_INT(rope_init(&small, 64, 100000.0f, ROPE_PAIRS_HALVES, 64), 0);
    CHECK_EQ_INT(rope_init(&big, 64, 100000.0f, ROPE_PAIRS_HALVES, 300000), 0);
    const int64_t pos[] = {63, 64, 8191, 8192, 131071, 299999};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        float a[64], b[64];
        for (int k = 0; k < 64; k++) a[k] = b[k] = (float)(k % 7) - 3.0f + 0.25f * (float)k;
        rope_rotate(&small, a, pos[i]);
        rope_rotate(&big, b, pos[i]);
        CHECK(memcmp(a, b, sizeof a) == 0);
    }
    rope_free(&small);
    rope_free(&big);
}

/* Answer logits of doc read with set; 0 or -1. With record, also the full
 * prefill of the same tokens into full (when not NULL). */
static int doc_logits(engine *e, const engine_pot_settings *set, const char *doc, float *out,
                      float *full, int64_t *compressions) {
    char err[512];
    engine_doc *d = engine_doc_open(e, set, err, sizeof err);
    if (!d) return fprintf(stderr, "  open: %s\n", err), -1;
    int rc = engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err);
    if (!rc) rc = engine_doc_answer_logits(d, "Who kept the light?", out, err, sizeof err);
    if (!rc && full) {
        size_t n;
        const int32_t *toks = engine_doc_tokens(d, &n);
        rc = toks ? engine_prompt_logits(e, toks, n, full, err, sizeof err) : -1;
    }
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    *compressions = st.compressions;
    if (rc) fprintf(stderr, "  %s\n", err);
    engine_doc_close(d);
    return rc;
}

static engine_pot_settings settings(int32_t budget, int original, int no_catalyst) {
    engine_pot_settings s = engine_pot_settings_default();
    s.budget_tokens = budget;
    s.chunk_tokens = 32;
    s.record_tokens = 1;
    s.original_positions = original;
    s.no_catalyst = no_catalyst;
    return s;
}

TEST(ablations_without_eviction_equal_full_prefill) {
    engine_options opt = {.n_threads = 2, .exact = 1, .kv_f32 = 1};
    engine *e = test_open_engine(test_fixture("tiny_llama.gguf"), &opt);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    char *doc = test_lighthouse_doc(150);
    size_t bytes = (size_t)info.n_vocab * sizeof(float);
    float *off = malloc(bytes), *on = malloc(bytes), *full = malloc(bytes), *nocap = malloc(bytes);
    int64_t c0 = -1, c1 = -1, c2 = -1;
    engine_pot_settings s0 = settings(200, 0, 0), s1 = settings(200, 1, 0), s2 = settings(200, 0, 1);
    CHECK_EQ_INT(doc_logits(e, &s0, doc, off, full, &c0), 0);
    CHECK_EQ_INT(doc_logits(e, &s1, doc, on, NULL, &c1), 0);
    CHECK_EQ_INT(doc_logits(e, &s2, doc, nocap, NULL, &c2), 0);
    CHECK(c0 == 0 && c1 == 0 && c2 == 0);
    /* nothing evicted: positions agree, so the very same bits */
    CHECK(memcmp(off, on, bytes) == 0);
    CHECK(memcmp(off, nocap, bytes) == 0);
    double mx = 0, scale = 0;
    for (int32_t i = 0; i < info.n_vocab; i++) {
        mx = fmax(mx, fabs(on[i] - full[i]));
        scale = fmax(scale, fabs(full[i]));
    }
    CHECK(mx <= 1e-4 * scale);
    free(off);
    free(on);
    free(full);
    free(nocap);
    free(doc);
    engine_close(e);
}

TEST(ablations_change_a_compressing_pot_and_run_past_the_window) {
    engine_options opt = {.n_threads = 2, .exact = 1, .kv_f32 = 1};
    engine *e = test_open_engine(test_fixture("tiny_llama.gguf"), &opt);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    /* a document several times the tiny model's window through a 64-entry pot */
    char *doc = test_lighthouse_doc((size_t)info.n_ctx_train * 12);
    size_t bytes = (size_t)info.n_vocab * sizeof(float);
    float *off = malloc(bytes), *on = malloc(bytes), *nocap = malloc(bytes);
    int64_t c0 = 0, c1 = 0, c2 = 0;
    engine_pot_settings s0 = settings(64, 0, 0), s1 = settings(64, 1, 0), s2 = settings(64, 0, 1);
    s0.record_tokens = s1.record_tokens = s2.record_tokens = 0;
    s0.chunk_tokens = s1.chunk_tokens = s2.chunk_tokens = 16;
    CHECK_EQ_INT(doc_logits(e, &s0, doc, off, NULL, &c0), 0);
    CHECK_EQ_INT(doc_logits(e, &s1, doc, on, NULL, &c1), 0);
    CHECK_EQ_INT(doc_logits(e, &s2, doc, nocap, NULL, &c2), 0);
    CHECK(c0 > 4 && c1 == c0 && c2 == c0);
    CHECK(memcmp(off, on, bytes) != 0);
    CHECK(memcmp(off, nocap, bytes) != 0);
    int finite = 1;
    for (int32_t i = 0; i < info.n_vocab; i++) finite &= isfinite(on[i]) != 0;
    CHECK(finite);
    free(off);
    free(on);
    free(nocap);
    free(doc);
    engine_close(e);
}

TEST(ablations_refuse_settings_they_do_not_apply_to) {
    engine_options opt = {.n_threads = 1, .exact = 1, .kv_f32 = 1};
    engine *e = test_open_engine(test_fixture("tiny_llama.gguf"), &opt);
    CHECK(e != NULL);
    if (!e) return;
    char err[512] = "";
    engine_pot_settings s = settings(64, 0, 1);
    s.policy = "snapkv";
    CHECK(engine_doc_open(e, &s, err, sizeof err) == NULL);
    CHECK(strstr(err, "no_catalyst") != NULL);
    engine_close(e);
}
