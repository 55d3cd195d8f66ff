/* CPU forward pass invariants on the real default model: the same tokens give
 * the same logits however they are split into forwards and batched with other
 * sequences, attention scores are probability mass, and bad spans are refused
 * without touching the pot. (Agreement with llama.cpp is tests/py/test_reference.py.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "test.h"
#include "test_model.h"

static const int32_t prompt[] = {504, 3575, 282, 4649, 314, 1978, 28, 253, 3654, 1345, 30, 392, 17, 26};
enum { N_PROMPT = sizeof prompt / sizeof prompt[0] };

static pot *new_pot(const model *m, int32_t cap) {
    char err[256];
    return pot_new(m->n_layer, m->n_head_kv, m->head_dim, cap, POT_F32, err, sizeof err);
}

static double max_rel_diff(const float *a, const float *b, int n) {
    double mx = 0, scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int i = 0; i < n; i++) mx = fmax(mx, fabs(a[i] - b[i]));
    return mx / (scale > 0 ? scale : 1);
}

/* Runs tokens through a fresh pot in pieces of `piece` tokens; last logits out. */
static int run_in_pieces(backend *be, const model *m, int piece, float *logits) {
    pot *p = new_pot(m, 64);
    char err[256];
    int rc = 0;
    for (int i = 0; i < N_PROMPT && !rc; i += piece) {
        int n = N_PROMPT - i < piece ? N_PROMPT - i : piece;
        backend_span sp = {.tokens = prompt + i, .n_tokens = n, .kv = p,
                           .logits_mode = i + n == N_PROMPT ? BACKEND_LOGITS_LAST : BACKEND_LOGITS_NONE,
                           .logits = logits};
        rc = be->forward(be, &sp, 1, err, sizeof err);
    }
    CHECK_EQ_INT(p->n, N_PROMPT);
    pot_free(p);
    return rc;
}

TEST(forward_split_invariance) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    float *whole = malloc(m->n_vocab * sizeof(float)), *split = malloc(m->n_vocab * sizeof(float));
    CHECK_EQ_INT(run_in_pieces(be, m, N_PROMPT, whole), 0);
    int pieces[] = {1, 3, 5};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(run_in_pieces(be, m, pieces[i], split), 0);
        double d = max_rel_diff(split, whole, m->n_vocab);
        if (d > 1e-4) fprintf(stderr, "  pieces of %d: max rel diff %g\n", pieces[i], d);
        CHECK(d <= 1e-4);
    }
    free(whole);
    free(split);
    be->free(be);
    model_free(m);
}

TEST(forward_batch_of_spans_equals_separate_runs) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    int V = m->n_vocab;
    float *alone_a = malloc(V * sizeof(float)), *alone_b = malloc(V * (size_t)5 * sizeof(float));
    float *batch_a = malloc(V * sizeof(float)), *batch_b = malloc(V * (size_t)5 * sizeof(float));
    pot *pa = new_pot(m, 32), *pb = new_pot(m, 32);
    /* alone: a = whole prompt, b = first 5 tokens with all logits */
    backend_span sa = {.tokens = prompt, .n_tokens = N_PROMPT, .kv = pa,
                       .logits_mode = BACKEND_LOGITS_LAST, .logits = alone_a};
    backend_span sb = {.tokens = prompt + 2, .n_tokens = 5, .kv = pb,
                       .logits_mode = BACKEND_LOGITS_ALL, .logits = alone_b};
    CHECK_EQ_INT(be->forward(be, &sa, 1, err, sizeof err), 0);
    CHECK_EQ_INT(be->forward(be, &sb, 1, err, sizeof err), 0);
    pot_truncate(pa, 0);
    pot_truncate(pb, 0);
    pa->n_seen = pb->n_seen = 0;
    backend_span both[2] = {sa, sb};
    both[0].logits = batch_a;
    both[1].logits = batch_b;
    CHECK_EQ_INT(be->forward(be, both, 2, err, sizeof err), 0);
    CHECK(max_rel_diff(batch_a, alone_a, V) <= 1e-5);
    CHECK(max_rel_diff(batch_b, alone_b, V * 5) <= 1e-5);
    CHECK_EQ_INT(pa->n, N_PROMPT);
    CHECK_EQ_INT(pb->n, 5);
    CHECK_EQ_INT(pb->token_index[pot_slot(pb, m->n_layer - 1, m->n_head_kv - 1, 4)], 4);
    pot_free(pa);
    pot_free(pb);
    free(alone_a);
    free(alone_b);
    free(batch_a);
    free(batch_b);
    be->free(be);
    model_free(m);
}

TEST(forward_attention_scores_are_probabilities) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    pot *p = new_pot(m, 32);
    /* 6 tokens in the pot first, then 8 more with scores for their last 3 rows */
    backend_span first = {.tokens = prompt, .n_tokens = 6, .kv = p};
    CHECK_EQ_INT(be->forward(be, &first, 1, err, sizeof err), 0);
    int n_keys = N_PROMPT, rows = 3, group = m->n_head / m->n_head_kv;
    float *scores = calloc((size_t)m->n_layer * m->n_head_kv * n_keys, sizeof(float));
    backend_span sp = {.tokens = prompt + 6, .n_tokens = N_PROMPT - 6, .kv = p,
                       .score_row0 = N_PROMPT - 6 - rows, .n_score_rows = rows, .scores = scores};
    CHECK_EQ_INT(be->forward(be, &sp, 1, err, sizeof err), 0);
    for (int l = 0; l < m->n_layer; l++)
        for (int g = 0; g < m->n_head_kv; g++) {
            const float *s = scores + ((size_t)l * m->n_head_kv + g) * n_keys;
            double sum = 0;
            for (int k = 0; k < n_keys; k++) {
                CHECK(s[k] >= 0);
                sum += s[k];
            }
            /* each of `rows` rows of each of `group` heads is a distribution */
            CHECK_NEAR(sum, rows * group, 1e-3);
            /* causal: the last key is seen only by the last row */
            CHECK(s[n_keys - 1] <= group + 1e-5);
        }
    free(scores);
    pot_free(p);
    be->free(be);
    model_free(m);
}

/* A device that lost the pot's K/V: nothing can be read back. */
static int lost_sync(pot_device *d, pot *p) { return (void)d, (void)p, -1; }
static int lost_compact(pot_device *d, pot *p, const int32_t *keep, int32_t n_keep) {
    return (void)d, (void)p, (void)keep, (void)n_keep, -1;
}
static void lost_release(pot_device *d, pot *p) { (void)d, p->device = NULL; }

TEST(forward_rejects_bad_spans_and_keeps_the_pot) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 1, 0, err, sizeof err);
    pot *p = new_pot(m, 8);
    backend_span ok = {.tokens = prompt, .n_tokens = 4, .kv = p};
    CHECK_EQ_INT(be->forward(be, &ok, 1, err, sizeof err), 0);
    int32_t bad_tok[2] = {5, 1 << 30};
    backend_span bad1 = {.tokens = bad_tok, .n_tokens = 2, .kv = p};
    CHECK_EQ_INT(be->forward(be, &bad1, 1, err, sizeof err), -1);
    CHECK(strstr(err, "vocabulary") != NULL);
    backend_span bad2 = {.tokens = prompt, .n_tokens = 5, .kv = p}; /* 4 + 5 > 8 */
    CHECK_EQ_INT(be->forward(be, &bad2, 1, err, sizeof err), -1);
    CHECK(strstr(err, "do not fit") != NULL);
    backend_span twice[2] = {ok, ok};
    CHECK_EQ_INT(be->forward(be, twice, 2, err, sizeof err), -1);
    CHECK_EQ_INT(p->n, 4);
    /* a pot whose device cannot give its K/V back is refused, not extended over stale ones */
    pot_device lost = {lost_sync, lost_compact, NULL, lost_release};
    p->device = &lost;
    backend_span more = {.tokens = prompt + 4, .n_tokens = 2, .kv = p};
    CHECK_EQ_INT(be->forward(be, &more, 1, err, sizeof err), -1);
    CHECK(strstr(err, "read back") != NULL);
    CHECK(p->n == 4 && p->device == NULL);
    pot_free(p);
    be->free(be);
    model_free(m);
}

TEST(forward_partial_attention_over_every_slot_equals_full) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    int V = m->n_vocab, n0 = N_PROMPT - 1;
    float *full = malloc(V * sizeof(float)), *part = malloc(V * sizeof(float));
    pot *a = new_pot(m, 32), *b = new_pot(m, 32);
    backend_span pre = {.tokens = prompt, .n_tokens = n0, .kv = a};
    CHECK_EQ_INT(be->forward(be, &pre, 1, err, sizeof err), 0);
    pre.kv = b;
    CHECK_EQ_INT(be->forward(be, &pre, 1, err, sizeof err), 0);
    int32_t *all = malloc((size_t)m->n_layer * m->n_head_kv * n0 * sizeof *all);
    for (int i = 0; i < m->n_layer * m->n_head_kv * n0; i++) all[i] = i % n0;
    backend_span sa = {.tokens = prompt + n0, .n_tokens = 1, .kv = a,
                       .logits_mode = BACKEND_LOGITS_LAST, .logits = full};
    backend_span sb = sa;
    sb.kv = b;
    sb.logits = part;
    sb.attend_slots = all;
    sb.n_attend = n0;
    CHECK_EQ_INT(be->forward(be, &sa, 1, err, sizeof err), 0);
    CHECK_EQ_INT(be->forward(be, &sb, 1, err, sizeof err), 0);
    CHECK(memcmp(full, part, V * sizeof(float)) == 0);
    /* a strict subset changes the result, and bad subsets are refused */
    pot_truncate(b, n0);
    b->n_seen = n0;
    for (int i = 0; i < m->n_layer * m->n_head_kv; i++) all[i * (n0 - 1)] = 0;
    sb.n_attend = n0 - 1;
    for (int lh = 0; lh < m->n_layer * m->n_head_kv; lh++)
        for (int i = 0; i < n0 - 1; i++) all[lh * (n0 - 1) + i] = i + 1; /* drop slot 0 */
    CHECK_EQ_INT(be->forward(be, &sb, 1, err, sizeof err), 0);
    CHECK(memcmp(full, part, V * sizeof(float)) != 0);
    all[0] = 999;
    CHECK_EQ_INT(be->forward(be, &sb, 1, err, sizeof err), -1);
    CHECK(strstr(err, "not in the pot") != NULL);
    free(all);
    free(full);
    free(part);
    pot_free(a);
    pot_free(b);
    be->free(be);
    model_free(m);
}

/* Attention is split into tasks by thread count (small spans by head, large
 * ones by KV group and token block, scoring rows by head): every split must
 * give the same bits. 60 tokens after a 14-token prefix, scoring rows in the
 * middle, then 7 more (few enough that 5 threads split by head where 1 does
 * not); f32 and f16 pots, with and without the rotated-key cache. */
TEST(forward_same_bits_on_any_thread_count) {
    char err[256];
    /* sanitizers: the tiny model (the real one took 18 s there) */
    model *m = TEST_SANITIZED ? model_load(test_fixture("tiny_llama.gguf"), err, sizeof err) : test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    enum { N = 60, ROW0 = 20, ROWS = 9, TAIL = 7 };
    int32_t toks[N], head[N_PROMPT];
    for (int i = 0; i < N; i++) toks[i] = prompt[(i * 5) % N_PROMPT] % m->n_vocab;
    for (int i = 0; i < N_PROMPT; i++) head[i] = prompt[i] % m->n_vocab;
    size_t V = (size_t)m->n_vocab, n_scores = (size_t)m->n_layer * m->n_head_kv * (N_PROMPT + N);
    float *logits[3], *scores[3];
    static const int threads[3] = {1, 2, 5};
    for (int dt = 0; dt < 2; dt++)
        for (int cached = 0; cached < 2; cached++) {
            for (int k = 0; k < 3; k++) {
                backend *be = cpu_backend_new(m, threads[k], 0, err, sizeof err);
                pot *p = pot_new(m->n_layer, m->n_head_kv, m->head_dim, 128, dt ? POT_F16 : POT_F32, err, sizeof err);
                if (cached) CHECK_EQ_INT(pot_cache_rotated_keys(p), 0);
                logits[k] = malloc(V * (N + TAIL) * sizeof(float));
                scores[k] = calloc(n_scores, sizeof(float));
                backend_span pre = {.tokens = head, .n_tokens = N_PROMPT, .kv = p};
                backend_span sp = {.tokens = toks, .n_tokens = N, .kv = p, .logits_mode = BACKEND_LOGITS_ALL,
                                   .logits = logits[k], .score_row0 = ROW0, .n_score_rows = ROWS,
                                   .scores = scores[k]};
                CHECK_EQ_INT(be->forward(be, &pre, 1, err, sizeof err), 0);
                CHECK_EQ_INT(be->forward(be, &sp, 1, err, sizeof err), 0);
                backend_span tail = {.tokens = toks + 3, .n_tokens = TAIL, .kv = p,
                                     .logits_mode = BACKEND_LOGITS_ALL, .logits = logits[k] + V * N};
                CHECK_EQ_INT(be->forward(be, &tail, 1, err, sizeof err), 0);
                pot_free(p);
                be->free(be);
            }
            for (int k = 1; k < 3; k++) {
                CHECK(memcmp(logits[0], logits[k], V * (N + TAIL) * sizeof(float)) == 0);
                CHECK(memcmp(scores[0], scores[k], n_scores * sizeof(float)) == 0);
            }
            for (int k = 0; k < 3; k++) {
                free(logits[k]);
                free(scores[k]);
            }
        }
    model_free(m);
}

/* A decoding token over more keys than ATTN_SPLIT_KEYS attends in key ranges
 * merged afterwards: its logits agree with the same token's row of a full
 * prefill (one pass over all keys) within float rounding, on f32 and f16
 * pots (with the rotated-key cache: keys read in place), and are the same
 * bits on 1, 2 and 5 threads. 300 pot keys + the token: ranges of 256 and
 * 45. Exact mode (f32 activations): with activations quantised per
 * block, a last-bit difference in an attention output can move a block's
 * int8 rounding, and the logits then differ by ~1e-2 of their scale. */
TEST(forward_key_split_decode_matches_prefill) {
    char err[256];
    /* sanitizers: the tiny model (the real one in exact mode took 3 minutes there) */
    model *m = TEST_SANITIZED ? model_load(test_fixture("tiny_llama.gguf"), err, sizeof err) : test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    enum { N = 301 };
    int32_t *toks = malloc(N * sizeof *toks);
    for (int i = 0; i < N; i++) toks[i] = (prompt[(i * 5 + i / 7) % N_PROMPT] + (i % 11) * 3) % m->n_vocab;
    size_t V = (size_t)m->n_vocab;
    float *full = malloc(V * sizeof(float)), *step[3];
    static const int threads[3] = {1, 2, 5};
    for (int dt = 0; dt < 2; dt++) {
        enum pot_dtype dtype = dt ? POT_F16 : POT_F32;
        backend *be = cpu_backend_new(m, 2, 1, err, sizeof err);
        pot *p = pot_new(m->n_layer, m->n_head_kv, m->head_dim, N, dtype, err, sizeof err);
        backend_span all = {.tokens = toks, .n_tokens = N, .kv = p, .logits_mode = BACKEND_LOGITS_LAST, .logits = full};
        CHECK_EQ_INT(be->forward(be, &all, 1, err, sizeof err), 0);
        pot_free(p);
        be->free(be);
        /* the N - 1 keys once (a prefill's bits do not depend on the thread
           count: forward_same_bits_on_any_thread_count), then each thread
           count decodes the last token over a copy of them */
        pot *keys = pot_new(m->n_layer, m->n_head_kv, m->head_dim, N, dtype, err, sizeof err);
        if (dt) CHECK_EQ_INT(pot_cache_rotated_keys(keys), 0);
        be = cpu_backend_new(m, 2, 1, err, sizeof err);
        backend_span pre = {.tokens = toks, .n_tokens = N - 1, .kv = keys};
        CHECK_EQ_INT(be->forward(be, &pre, 1, err, sizeof err), 0);
        be->free(be);
        for (int k = 0; k < 3; k++) {
            be = cpu_backend_new(m, threads[k], 1, err, sizeof err);
            p = pot_new(m->n_layer, m->n_head_kv, m->head_dim, N, dtype, err, sizeof err);
            if (dt) CHECK_EQ_INT(pot_cache_rotated_keys(p), 0);
            CHECK_EQ_INT(pot_copy(p, keys), 0);
            step[k] = malloc(V * sizeof(float));
            backend_span one = {.tokens = toks + N - 1, .n_tokens = 1, .kv = p, .logits_mode = BACKEND_LOGITS_LAST,
                                .logits = step[k]};
            CHECK_EQ_INT(be->forward(be, &one, 1, err, sizeof err), 0);
            pot_free(p);
            be->free(be);
        }
        pot_free(keys);
        double d = max_rel_diff(step[0], full, (int)V);
        if (getenv("VERBOSE")) fprintf(stderr, "  %s pot: key-split decode vs prefill row %.2e\n", dt ? "f16" : "f32", d);
        CHECK(d <= 1e-4);
        for (int k = 1; k < 3; k++) CHECK(memcmp(step[0], step[k], V * sizeof(float)) == 0);
        for (int k = 0; k < 3; k++) free(step[k]);
    }
    free(full);
    free(toks);
    model_free(m);
}

/* Products that share an input (q, k, v; gate, up) run as one loop over their
 * rows laid end to end, fused only while their activation formats agree. On
 * a model whose layers mix formats (tests/make_fixtures.py tiny_llama_mixed:
 * q Q4_1 / k Q8_0 / v Q4_0, gate Q5_1 / up Q5_0), thread counts that cut the
 * rows at different places, across weight boundaries, give the same bits,
 * prefill and decode. (Agreement with llama.cpp: tests/py/test_tiny_models.py.) */
TEST(forward_fused_products_same_bits_on_any_thread_count) {
    char err[256];
    model *m = model_load(test_fixture("tiny_llama_mixed.gguf"), err, sizeof err);
    if (!m) fprintf(stderr, "  %s (make fixtures)\n", err);
    CHECK(m != NULL);
    if (!m) return;
    CHECK(m->layers[0].wq.type != m->layers[0].wk.type && m->layers[0].w_gate.type != m->layers[0].w_up.type);
    enum { N = 20, RUNS = 4 };
    static const int threads[RUNS] = {1, 2, 3, 7};
    const size_t V = (size_t)m->n_vocab;
    int32_t toks[N + 1];
    for (int i = 0; i <= N; i++) toks[i] = (int32_t)((i * 37 + 5) % m->n_vocab);
    float *logits[RUNS];
    for (int k = 0; k < RUNS; k++) {
        logits[k] = malloc((N + 1) * V * sizeof(float));
        backend *be = cpu_backend_new(m, threads[k], 0, err, sizeof err);
        pot *p = new_pot(m, N + 1);
        CHECK(be && p && logits[k]);
        if (!be || !p || !logits[k]) return;
        backend_span pre = {.tokens = toks, .n_tokens = N, .kv = p, .logits_mode = BACKEND_LOGITS_ALL,
                            .logits = logits[k]};
        backend_span step = {.tokens = toks + N, .n_tokens = 1, .kv = p, .logits_mode = BACKEND_LOGITS_LAST,
                             .logits = logits[k] + N * V};
        CHECK_EQ_INT(be->forward(be, &pre, 1, err, sizeof err), 0);
        CHECK_EQ_INT(be->forward(be, &step, 1, err, sizeof err), 0);
        pot_free(p);
        be->free(be);
    }
    for (int k = 1; k < RUNS; k++) CHECK(memcmp(logits[0], logits[k], (N + 1) * V * sizeof(float)) == 0);
    for (int k = 0; k < RUNS; k++) free(logits[k]);
    model_free(m);
}

/* Label log-probabilities (NuC's surprisal) against a float64 log-softmax of
 * the same rows' logits; a negative label leaves its row alone. 40 rows: more
 * than one batch of the backend's label rows. */
TEST(forward_label_logprobs_are_log_softmax_of_the_logits) {
    model *m = test_load_default_model();
    CHECK(m != NULL);
    if (!m) return;
    char err[256];
    backend *be = cpu_backend_new(m, 2, 0, err, sizeof err);
    enum { N = 40 };
    const int64_t V = m->n_vocab;
    int32_t toks[N], labels[N];
    for (int i = 0; i < N; i++) {
        toks[i] = prompt[i % N_PROMPT] + i;
        labels[i] = i == 7 ? -1 : (int32_t)((i * 7919) % V);
    }
    float *logits = malloc((size_t)N * V * sizeof(float)), lp[N];
    for (int i = 0; i < N; i++) lp[i] = 99.0f;
    pot *p = new_pot(m, 64);
    backend_span s = {.tokens = toks, .n_tokens = N, .kv = p, .logits_mode = BACKEND_LOGITS_ALL,
                      .logits = logits, .labels = labels, .label_logprob = lp};
    CHECK_EQ_INT(be->forward(be, &s, 1, err, sizeof err), 0);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        if (labels[i] < 0) {
            CHECK(lp[i] == 99.0f);
            continue;
        }
        const float *l = logits + (size_t)i * V;
        double mx = l[0], sum = 0;
        for (int64_t v = 1; v < V; v++) mx = l[v] > mx ? l[v] : mx;
        for (int64_t v = 0; v < V; v++) sum += exp((double)l[v] - mx);
        const double want = (double)l[labels[i]] - mx - log(sum), d = fabs(lp[i] - want);
        worst = d > worst ? d : worst;
        CHECK(d <= 1e-5 * (1 + fabs(want)));
    }
    if (getenv("VERBOSE")) fprintf(stderr, "  label log-probs: worst |diff| %.2e\n", worst);
    pot_free(p);
    free(logits);
    be->free(be);
    model_free(m);
}
