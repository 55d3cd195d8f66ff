/* The CUDA backend end to end against the CPU backend (exact mode: f32
 * activations times dequantised weights) on the default model
 * (SmolLM2-135M, Q4_1): prefill logits of every row, a decode step on the
 * same pot, score rows (sum and max over a KV group), label
 * log-probabilities, partial attention, two spans in one batch (with their
 * hidden-state sums, the embeddings' input), and the pot
 * pots held on the device through host-side changes (pot_compact on the
 * device, pot_truncate, pot_copy).
 * Under the emulator the kernels run on the CPU; on a GPU (make test-cuda)
 * the same checks hold with the same tolerances. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/cache.h"
#include "cuda/cuda_backend.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "tests/cuda/cuda_test.h"
#include "tests/cuda/tiny_model.h"

static const int32_t prompt[] = {504, 3575, 282, 4649, 314, 1978, 28, 253, 3654, 1345, 30, 392, 17, 26,
                                 2438, 28, 314, 1345, 30, 392, 17, 26, 253, 3654};
enum { N_PROMPT = 12 }; /* the prefill; the rest feed later steps */

/* Tolerances, with what the emulator measures (cuda/README.md). Logits as
 * max |diff| over the spread of the CPU's logits; with f32 pots both sides
 * compute in f32 and differ by summation order only (measured <= 2e-6). With
 * f16 pots a K/V value that lands near a rounding boundary may round the
 * other way on one side (one f16 ulp, 5e-4 relative), which the following
 * layers amplify (measured 1e-4). Scores: absolute, sums of probabilities
 * (measured 3e-6); label log-probabilities: absolute nats (2e-6); pot K/V:
 * over the largest |value| (6e-7). */
#define TOL_LOGITS 5e-5
#define TOL_LOGITS_F16 1e-3
#define TOL_SCORES 1e-4
#define TOL_LABELS 1e-4
#define TOL_POT 1e-4

/* Largest |a - b| over the spread of b (max - min): the logits' scale. */
static double rel_to_range(const float *a, const float *b, size_t n) {
    double mx = 0, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= mx)) mx = d; /* NaN wins */
        lo = fmin(lo, b[i]);
        hi = fmax(hi, b[i]);
    }
    return mx / (hi > lo ? hi - lo : 1.0);
}

static double max_abs(const float *a, const float *b, size_t n) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= mx)) mx = d;
    }
    return mx;
}

typedef struct pair {
    model *m;
    backend *cpu, *gpu;
} pair;

/* Runs the same span on both backends (each with its own pot and output
 * arrays); returns 0 when both succeed. */
static int both(pair *P, backend_span cs, pot *pc, pot *pg, float *out_c, float *out_g, size_t out_n,
                float *sc_c, float *sc_g, float *lp_c, float *lp_g) {
    char err[256];
    backend_span gs = cs;
    cs.kv = pc;
    gs.kv = pg;
    if (out_n) {
        cs.logits = out_c;
        gs.logits = out_g;
    }
    cs.scores = cs.scores ? sc_c : NULL;
    gs.scores = gs.scores ? sc_g : NULL;
    cs.label_logprob = cs.labels ? lp_c : NULL;
    gs.label_logprob = gs.labels ? lp_g : NULL;
    int rc = P->cpu->forward(P->cpu, &cs, 1, err, sizeof err);
    if (rc) fprintf(stderr, "  cpu: %s\n", err);
    int rg = P->gpu->forward(P->gpu, &gs, 1, err, sizeof err);
    if (rg) fprintf(stderr, "  cuda: %s\n", err);
    return rc || rg;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

TEST(cuda_backend_matches_cpu_end_to_end) {
    const char *path = test_model_path();
    char err[256];
    if (!path) {
        fprintf(stderr, "  default model missing (make model)\n");
        CHECK(path != NULL);
        return;
    }
    pair P = {model_load(path, err, sizeof err), NULL, NULL};
    CHECK(P.m != NULL);
    if (!P.m) return;
    const model *m = P.m;
    double t_start = now_s();
    P.cpu = cpu_backend_new(m, 2, 1, err, sizeof err);
    P.gpu = cuda_backend_new(m, 1, 1, err, sizeof err);
    if (!P.gpu) fprintf(stderr, "  %s\n", err);
    CHECK(P.cpu && P.gpu);
    if (!P.cpu || !P.gpu) goto done_model;

    size_t V = (size_t)m->n_vocab, L = (size_t)m->n_layer, G = (size_t)m->n_head_kv;
    enum { CAP = 40 };
    pot *pc = pot_new(m->n_layer, m->n_head_kv, m->head_dim, CAP, POT_F32, err, sizeof err);
    pot *pg = pot_new(m->n_layer, m->n_head_kv, m->head_dim, CAP, POT_F32, err, sizeof err);
    float *lc = malloc(N_PROMPT * V * sizeof(float)), *lg = malloc(N_PROMPT * V * sizeof(float));
    float *sc = calloc(L * G * CAP, sizeof(float)), *sg = calloc(L * G * CAP, sizeof(float));
    float lpc[8], lpg[8];
    double worst_logits = 0;

    /* 1. prefill: every row's logits (12 rows: the matvec path, LM head included) */
    backend_span s1 = {.tokens = prompt, .n_tokens = N_PROMPT, .logits_mode = BACKEND_LOGITS_ALL};
    CHECK_EQ_INT(both(&P, s1, pc, pg, lc, lg, 1, NULL, NULL, NULL, NULL), 0);
    double d = rel_to_range(lg, lc, N_PROMPT * V);
    worst_logits = fmax(worst_logits, d);
    fprintf(stderr, "  e2e prefill %d tokens: logits max |diff| / range %.2e, pot K/V %.2e [%.1f s]\n",
            N_PROMPT, d, tiny_pot_diff(pg, pc), now_s() - t_start);
    CHECK(d <= TOL_LOGITS);
    CHECK(tiny_pot_diff(pg, pc) <= TOL_POT);
    CHECK_EQ_INT(pg->n, N_PROMPT);
    CHECK_EQ_INT(pg->n_seen, N_PROMPT);
    CHECK_EQ_INT(pg->token_index[pot_slot(pg, m->n_layer - 1, m->n_head_kv - 1, N_PROMPT - 1)], N_PROMPT - 1);
    CHECK(cuda_backend_holds_pot(P.gpu, pg));

    /* 2. a decode step on the same pot (matvec path) */
    backend_span s2 = {.tokens = prompt + N_PROMPT, .n_tokens = 1, .logits_mode = BACKEND_LOGITS_LAST};
    CHECK_EQ_INT(both(&P, s2, pc, pg, lc, lg, 1, NULL, NULL, NULL, NULL), 0);
    d = rel_to_range(lg, lc, V);
    worst_logits = fmax(worst_logits, d);
    fprintf(stderr, "  e2e decode: logits %.2e [%.1f s]\n", d, now_s() - t_start);
    CHECK(d <= TOL_LOGITS);

    /* 3. score rows: 3 tokens, rows 1..2, summed over the group; then 2 tokens, max */
    int32_t n0 = pg->n;
    backend_span s3 = {.tokens = prompt + 13, .n_tokens = 3, .logits_mode = BACKEND_LOGITS_LAST, .score_row0 = 1,
                       .n_score_rows = 2, .score_combine = BACKEND_SCORE_SUM, .scores = sc};
    CHECK_EQ_INT(both(&P, s3, pc, pg, lc, lg, 1, sc, sg, NULL, NULL), 0);
    size_t n_sc = L * G * (size_t)(n0 + 3);
    double ds = max_abs(sg, sc, n_sc);
    d = rel_to_range(lg, lc, V);
    worst_logits = fmax(worst_logits, d);
    fprintf(stderr, "  e2e scores (sum of 2 rows x 3 heads): max |diff| %.2e, logits %.2e [%.1f s]\n", ds, d, now_s() - t_start);
    CHECK(ds <= TOL_SCORES);
    CHECK(d <= TOL_LOGITS);
    n0 = pg->n;
    backend_span s4 = {.tokens = prompt + 16, .n_tokens = 2, .score_row0 = 0, .n_score_rows = 2,
                       .score_combine = BACKEND_SCORE_MAX, .scores = sc};
    CHECK_EQ_INT(both(&P, s4, pc, pg, NULL, NULL, 0, sc, sg, NULL, NULL), 0);
    n_sc = L * G * (size_t)(n0 + 2);
    ds = max_abs(sg, sc, n_sc);
    fprintf(stderr, "  e2e scores (max): max |diff| %.2e [%.1f s]\n", ds, now_s() - t_start);
    CHECK(ds <= TOL_SCORES);

    /* 4. label log-probabilities (rows with label -1 left alone) */
    int32_t labels[4] = {prompt[19], -1, prompt[21], prompt[22]};
    for (int i = 0; i < 4; i++) lpc[i] = lpg[i] = 42.0f;
    backend_span s5 = {.tokens = prompt + 18, .n_tokens = 4, .labels = labels, .label_logprob = lpc};
    CHECK_EQ_INT(both(&P, s5, pc, pg, NULL, NULL, 0, NULL, NULL, lpc, lpg), 0);
    double dl = max_abs(lpg, lpc, 4);
    fprintf(stderr, "  e2e label log-probs %.3f %.3f %.3f: max |diff| %.2e [%.1f s]\n", lpc[0], lpc[2], lpc[3], dl, now_s() - t_start);
    CHECK(dl <= TOL_LABELS);
    CHECK(lpg[1] == 42.0f);

    /* 5. compaction (both pots alike: on the host for the CPU's, on the device for the GPU's), then a decode step */
    int32_t n_keep = 10; /* of 22 slots: 2i + (0, 1 or 2) per (layer, head) */
    int32_t *keep = malloc(L * G * n_keep * sizeof(int32_t));
    for (size_t lg_i = 0; lg_i < L * G; lg_i++)
        for (int32_t i = 0; i < n_keep; i++) keep[lg_i * n_keep + i] = 2 * i + (int32_t)(lg_i % 3);
    pot_compact(pc, keep, n_keep);
    pot_compact(pg, keep, n_keep);
    backend_span s6 = {.tokens = prompt + 22, .n_tokens = 1, .logits_mode = BACKEND_LOGITS_LAST};
    CHECK_EQ_INT(both(&P, s6, pc, pg, lc, lg, 1, NULL, NULL, NULL, NULL), 0);
    d = rel_to_range(lg, lc, V);
    worst_logits = fmax(worst_logits, d);
    fprintf(stderr, "  e2e after pot_compact: logits %.2e [%.1f s]\n", d, now_s() - t_start);
    CHECK(d <= TOL_LOGITS);
    CHECK_EQ_INT(pg->n, n_keep + 1);
    CHECK(cuda_backend_holds_pot(P.gpu, pg));

    /* 6. partial attention over a subset of the pot */
    int32_t n_att = 5;
    int32_t *att = malloc(L * G * n_att * sizeof(int32_t));
    for (size_t i = 0; i < L * G; i++)
        for (int32_t j = 0; j < n_att; j++) att[i * n_att + j] = j * 2 + (int32_t)(i % 2);
    backend_span s7 = {.tokens = prompt + 3, .n_tokens = 2, .logits_mode = BACKEND_LOGITS_ALL,
                       .attend_slots = att, .n_attend = n_att};
    CHECK_EQ_INT(both(&P, s7, pc, pg, lc, lg, 1, NULL, NULL, NULL, NULL), 0);
    d = rel_to_range(lg, lc, 2 * V);
    worst_logits = fmax(worst_logits, d);
    fprintf(stderr, "  e2e partial attention: logits %.2e [%.1f s]\n", d, now_s() - t_start);
    CHECK(d <= TOL_LOGITS);

    /* 7. the host replaces the pot's contents (pot_copy of a fresh 5-token pot over it) */
    pot *fresh = pot_new(m->n_layer, m->n_head_kv, m->head_dim, CAP, POT_F32, err, sizeof err);
    backend_span s8 = {.tokens = prompt + 5, .n_tokens = 5, .kv = fresh};
    CHECK_EQ_INT(P.cpu->forward(P.cpu, &s8, 1, err, sizeof err), 0);
    pot_truncate(pc, 0);
    pot_truncate(pg, 0);
    CHECK_EQ_INT(pot_copy(pc, fresh), 0);
    CHECK_EQ_INT(pot_copy(pg, fresh), 0);
    backend_span s9 = {.tokens = prompt + 10, .n_tokens = 1, .logits_mode = BACKEND_LOGITS_LAST};
    CHECK_EQ_INT(both(&P, s9, pc, pg, lc, lg, 1, NULL, NULL, NULL, NULL), 0);
    d = rel_to_range(lg, lc, V);
    worst_logits = fmax(worst_logits, d);
    fprintf(stderr, "  e2e after pot_copy: logits %.2e [%.1f s]\n", d, now_s() - t_start);
    CHECK(d <= TOL_LOGITS);

    /* 8. two spans (two pots) in one forward, each also summing hidden states (embeddings; rows 2..5 of the second) */
    pot *qc = pot_new(m->n_layer, m->n_head_kv, m->head_dim, CAP, POT_F16, err, sizeof err);
    pot *qg = pot_new(m->n_layer, m->n_head_kv, m->head_dim, CAP, POT_F16, err, sizeof err);
    float *lc2 = malloc(V * sizeof(float)), *lg2 = malloc(V * sizeof(float));
    size_t D = (size_t)m->n_embd;
    float *hc = calloc(2 * D, sizeof(float)), *hg = calloc(2 * D, sizeof(float));
    backend_span bc[2] = {{.tokens = prompt + 11, .n_tokens = 1, .kv = pc, .logits_mode = BACKEND_LOGITS_LAST,
                           .logits = lc, .hidden_sum = hc, .n_hidden_rows = 1},
                          {.tokens = prompt, .n_tokens = 6, .kv = qc, .logits_mode = BACKEND_LOGITS_LAST,
                           .logits = lc2, .hidden_sum = hc + D, .hidden_row0 = 2, .n_hidden_rows = 4}};
    backend_span bg[2] = {bc[0], bc[1]};
    bg[0].kv = pg, bg[0].logits = lg, bg[0].hidden_sum = hg;
    bg[1].kv = qg, bg[1].logits = lg2, bg[1].hidden_sum = hg + D;
    CHECK_EQ_INT(P.cpu->forward(P.cpu, bc, 2, err, sizeof err), 0);
    CHECK_EQ_INT(P.gpu->forward(P.gpu, bg, 2, err, sizeof err), 0);
    double d2 = fmax(rel_to_range(lg, lc, V), rel_to_range(lg2, lc2, V));
    double dh = fmax(rel_to_range(hg, hc, D), rel_to_range(hg + D, hc + D, D));
    worst_logits = fmax(worst_logits, d2);
    fprintf(stderr, "  e2e batch of two spans: logits %.2e, hidden sums %.2e [%.1f s]\n", d2, dh, now_s() - t_start);
    CHECK(d2 <= TOL_LOGITS_F16);
    CHECK(dh <= TOL_LOGITS_F16);
    CHECK(rel_to_range(hc, hc + D, D) > 0.01); /* (the sums are not alike by accident) */
    CHECK(cuda_backend_holds_pot(P.gpu, qg));

    /* a bad span is refused and leaves the pot alone */
    int32_t bad = m->n_vocab;
    backend_span sb = {.tokens = &bad, .n_tokens = 1, .kv = pg};
    int32_t n_before = pg->n;
    CHECK(P.gpu->forward(P.gpu, &sb, 1, err, sizeof err) != 0);
    CHECK_EQ_INT(pg->n, n_before);

    fprintf(stderr, "  e2e worst logits diff / range %.2e; %.1f s\n", worst_logits, now_s() - t_start);
    cuda_backend_forget_pot(P.gpu, pg);
    CHECK(!cuda_backend_holds_pot(P.gpu, pg));
    CHECK(tiny_pot_diff(pg, pc) <= TOL_POT); /* taken back to the host intact */
    pot_free(qc), pot_free(qg), pot_free(fresh), pot_free(pc), pot_free(pg);
    free(lc), free(lg), free(lc2), free(lg2), free(hc), free(hg), free(sc), free(sg), free(keep), free(att);
done_model:
    if (P.gpu) P.gpu->free(P.gpu);
    if (P.cpu) P.cpu->free(P.cpu);
    model_free(P.m);
}

/* Every weight type end to end: the tiny models of tests/make_fixtures.py
 * (F32, F16, BF16, Q4_0, Q4_1, Q8_0 at n_embd 64; Q4_K, Q5_K, Q6_K at 256;
 * one that mixes Q4_1, Q8_0, Q4_0, F16, Q5_1 and Q5_0 inside each layer),
 * a 20-token prefill (more rows than the matvec takes: dequantisation and
 * GEMM) and a decode step (the matvec reading the blocks), every row's
 * logits against the CPU backend's exact path. */
TEST(cuda_backend_every_weight_type_matches_cpu) {
    static const char *const files[] = {"tiny_llama.gguf",      "tiny_llama_f16.gguf",  "tiny_llama_bf16.gguf",
                                        "tiny_llama_q4_0.gguf", "tiny_llama_q4_1.gguf", "tiny_llama_q8_0.gguf",
                                        "tiny_llama_q4_k.gguf", "tiny_llama_q5_k.gguf", "tiny_llama_q6_k.gguf",
                                        "tiny_llama_mixed.gguf"};
    enum { N = 20 };
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char err[256];
        pair P = {model_load(test_fixture(files[f]), err, sizeof err), NULL, NULL};
        if (!P.m) fprintf(stderr, "  %s: %s (make fixtures)\n", files[f], err);
        CHECK(P.m != NULL);
        if (!P.m) continue;
        const model *m = P.m;
        P.cpu = cpu_backend_new(m, 1, 1, err, sizeof err);
        P.gpu = cuda_backend_new(m, 1, 1, err, sizeof err);
        if (!P.gpu) fprintf(stderr, "  %s: %s\n", files[f], err);
        CHECK(P.cpu && P.gpu);
        if (P.cpu && P.gpu) {
            size_t V = (size_t)m->n_vocab;
            int32_t tokens[N + 1];
            for (int i = 0; i <= N; i++) tokens[i] = (int32_t)((i * 37 + 5) % m->n_vocab);
            pot *pc = pot_new(m->n_layer, m->n_head_kv, m->head_dim, N + 1, POT_F32, err, sizeof err);
            pot *pg = pot_new(m->n_layer, m->n_head_kv, m->head_dim, N + 1, POT_F32, err, sizeof err);
            float *lc = malloc(N * V * sizeof(float)), *lg = malloc(N * V * sizeof(float));
            backend_span prefill = {.tokens = tokens, .n_tokens = N, .logits_mode = BACKEND_LOGITS_ALL};
            CHECK_EQ_INT(both(&P, prefill, pc, pg, lc, lg, 1, NULL, NULL, NULL, NULL), 0);
            double dp = rel_to_range(lg, lc, N * V);
            backend_span step = {.tokens = tokens + N, .n_tokens = 1, .logits_mode = BACKEND_LOGITS_LAST};
            CHECK_EQ_INT(both(&P, step, pc, pg, lc, lg, 1, NULL, NULL, NULL, NULL), 0);
            double dd = rel_to_range(lg, lc, V);
            fprintf(stderr, "  %s (%s): prefill logits %.2e, decode %.2e of the range\n", files[f],
                    quant_type_name(m->layers[0].wq.type), dp, dd);
            CHECK(dp <= TOL_LOGITS);
            CHECK(dd <= TOL_LOGITS);
            cuda_backend_forget_pot(P.gpu, pg);
            pot_free(pc), pot_free(pg);
            free(lc), free(lg);
        }
        if (P.gpu) P.gpu->free(P.gpu);
        if (P.cpu) P.cpu->free(P.cpu);
        model_free(P.m);
    }
}
