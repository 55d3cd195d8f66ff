/* Batched decode and decode graphs (cuda/cuda_backend.c, cuda/cuda_graph.c)
 * on a tiny random model against the CPU backend (exact), with the same
 * batches on both: many single-token spans in one forward (one batched
 * attention launch: pots of different lengths, a long one split over the
 * key range, partial attention, an f16 pot beside f32 ones), a prefill span
 * mixed in, batches past the matvec limit; then the decode step as a CUDA
 * graph replayed over many steps (through a compaction that moves the pot
 * arrays and a pot growing into the next key bucket), which must give the
 * same logits bit for bit as the same steps launched directly.
 * Tolerances: logits within 1e-5 of the logit range for f32 pots (both
 * sides f32, summation order only), 1e-3 with an f16 pot (one f16 rounding
 * may differ, as in test_backend.c). */
#include <stdio.h>

#include "cache/cache.h"
#include "cuda/cuda_backend.h"
#include "engine/backend.h"
#include "tests/cuda/tiny_model.h"

/* The emulator's kernel counter (absent from GPU builds: those checks are skipped there). */
__attribute__((weak)) unsigned long long cuemu_kernel_runs(const char *prefix);

#define TOL_F32 1e-5
#define TOL_F16 1e-3

enum { NSEQ = 5, LONG_PROMPT = 530, CAP = 600 };

typedef struct fleet {
    model *m;
    backend *cpu, *gpu;
    pot *pc[NSEQ + 1], *pg[NSEQ + 1];
    float *lc, *lg; /* [NSEQ + 1][vocab] */
} fleet;

/* One forward of n spans (tokens[i] of len[i]) on both backends; returns the
 * worst logits difference over the range, f16 spans apart in *worst16. */
static double run_both(fleet *F, const int32_t *const *tokens, const int32_t *len, int n, const int32_t *att,
                       int32_t n_att, int att_span, double *worst16) {
    backend_span sc[NSEQ + 1], sg[NSEQ + 1];
    char err[256];
    for (int i = 0; i < n; i++) {
        sc[i] = (backend_span){.tokens = tokens[i], .n_tokens = len[i], .kv = F->pc[i],
                               .logits_mode = BACKEND_LOGITS_LAST, .logits = F->lc + (size_t)i * TINY_VOCAB};
        if (i == att_span) sc[i].attend_slots = att, sc[i].n_attend = n_att;
        sg[i] = sc[i];
        sg[i].kv = F->pg[i];
        sg[i].logits = F->lg + (size_t)i * TINY_VOCAB;
    }
    if (F->cpu->forward(F->cpu, sc, n, err, sizeof err)) fprintf(stderr, "  cpu: %s\n", err), test_failures++;
    if (F->gpu->forward(F->gpu, sg, n, err, sizeof err)) fprintf(stderr, "  cuda: %s\n", err), test_failures++;
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = tiny_rel_to_range(F->lg + (size_t)i * TINY_VOCAB, F->lc + (size_t)i * TINY_VOCAB, TINY_VOCAB);
        if (F->pc[i]->dtype == POT_F16) *worst16 = fmax(*worst16, d);
        else worst = fmax(worst, d);
    }
    return worst;
}

static void fleet_close(fleet *F) {
    for (int i = 0; i <= NSEQ; i++) pot_free(F->pc[i]), pot_free(F->pg[i]);
    if (F->gpu) F->gpu->free(F->gpu);
    if (F->cpu) F->cpu->free(F->cpu);
    free(F->lc), free(F->lg);
    tiny_model_free(F->m);
}

/* A model on both backends, NSEQ + 1 pots on each and a random prompt; -1
 * (the test has failed, nothing left open) when a backend cannot start. */
static int fleet_open(fleet *F, uint64_t seed, test_rng *g, int32_t *prompt) {
    char err[256];
    memset(F, 0, sizeof *F);
    F->m = tiny_model_new(seed);
    F->cpu = cpu_backend_new(F->m, 1, 1, err, sizeof err);
    F->gpu = cuda_backend_new(F->m, 1, 1, err, sizeof err);
    F->lc = malloc((NSEQ + 1) * TINY_VOCAB * sizeof(float));
    F->lg = malloc((NSEQ + 1) * TINY_VOCAB * sizeof(float));
    for (int i = 0; i <= NSEQ; i++) {
        enum pot_dtype t = i == 3 ? POT_F16 : POT_F32; /* one f16 pot: its own per-span launch */
        F->pc[i] = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, t, err, sizeof err);
        F->pg[i] = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, t, err, sizeof err);
    }
    for (int i = 0; i < LONG_PROMPT; i++) prompt[i] = (int32_t)(rng_u32(g) % TINY_VOCAB);
    CHECK(F->cpu && F->gpu);
    if (F->cpu && F->gpu) return 0;
    fleet_close(F);
    return -1;
}

/* Prompts: sequence 0 the long one (past 512 keys: a split key range), the
 * others 3 + 4i tokens of it, each prefilled alone. */
static void prefill_all(fleet *F, const int32_t *prompt, int32_t long_len, double *worst, double *worst16) {
    for (int i = 0; i < NSEQ; i++) {
        const int32_t *t[1] = {prompt + i};
        int32_t len[1] = {i == 0 ? long_len : 3 + 4 * i};
        pot *sc = F->pc[0], *sg = F->pg[0];
        F->pc[0] = F->pc[i], F->pg[0] = F->pg[i];
        *worst = fmax(*worst, run_both(F, t, len, 1, NULL, 0, -1, worst16));
        F->pc[i] = F->pc[0], F->pg[i] = F->pg[0];
        F->pc[0] = sc, F->pg[0] = sg;
    }
}

TEST(cuda_batched_decode_matches_cpu) {
    test_rng g = {77};
    int32_t prompt[LONG_PROMPT];
    fleet F;
    if (fleet_open(&F, 3, &g, prompt)) return;
    cuda_backend_use_graphs(F.gpu, 0); /* the direct launches here; graphs below */
    double worst = 0, worst16 = 0;
    prefill_all(&F, prompt, LONG_PROMPT, &worst, &worst16);

    /* partial attention for sequence 2: 4 of its slots per (layer, head) */
    int32_t att[TINY_LAYERS * TINY_KV_HEADS * 4];
    for (int i = 0; i < TINY_LAYERS * TINY_KV_HEADS; i++)
        for (int j = 0; j < 4; j++) att[i * 4 + j] = j * 2 + i % 2;
    int32_t toks[NSEQ + 1];
    const int32_t *tp[NSEQ + 1];
    int32_t len[NSEQ + 1];
    for (int step = 0; step < 3; step++) {
        for (int i = 0; i < NSEQ; i++) toks[i] = (int32_t)(rng_u32(&g) % TINY_VOCAB), tp[i] = &toks[i], len[i] = 1;
        unsigned long long batched0 = cuemu_kernel_runs ? cuemu_kernel_runs("attn_batch_kernel") : 0;
        unsigned long long single0 = cuemu_kernel_runs ? cuemu_kernel_runs("attn_kernel") : 0;
        worst = fmax(worst, run_both(&F, tp, len, NSEQ, att, 4, step == 1 ? 2 : -1, &worst16));
        if (cuemu_kernel_runs) {
            /* per layer one launch for the four f32 pots, one for the f16 pot on its own */
            CHECK_EQ_INT(cuemu_kernel_runs("attn_batch_kernel") - batched0, TINY_LAYERS);
            CHECK_EQ_INT(cuemu_kernel_runs("attn_kernel") - single0, TINY_LAYERS);
        }
    }
    /* a prefill span in the same forward as the decode tokens */
    tp[NSEQ] = prompt + 100, len[NSEQ] = 7;
    worst = fmax(worst, run_both(&F, tp, len, NSEQ + 1, NULL, 0, -1, &worst16));
    /* 16 sequences (the last batch on the quantised-weight products) and 17 (cuBLAS), decode only */
    double wide = 0;
    for (int n = 16; n <= 17; n++) {
        pot *c[17], *gp[17];
        backend_span sc[17], sg[17];
        float *lc = malloc((size_t)n * TINY_VOCAB * sizeof(float)), *lg = malloc((size_t)n * TINY_VOCAB * sizeof(float));
        int32_t tk[17];
        char err[256];
        for (int i = 0; i < n; i++) {
            c[i] = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, POT_F32, err, sizeof err);
            gp[i] = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, POT_F32, err, sizeof err);
            pot_copy(c[i], F.pc[1 + i % 2]);
            pot_copy(gp[i], F.pg[1 + i % 2]);
            tk[i] = (int32_t)(rng_u32(&g) % TINY_VOCAB);
            sc[i] = (backend_span){.tokens = &tk[i], .n_tokens = 1, .kv = c[i], .logits_mode = BACKEND_LOGITS_LAST,
                                   .logits = lc + (size_t)i * TINY_VOCAB};
            sg[i] = sc[i], sg[i].kv = gp[i], sg[i].logits = lg + (size_t)i * TINY_VOCAB;
        }
        CHECK_EQ_INT(F.cpu->forward(F.cpu, sc, n, err, sizeof err), 0);
        CHECK_EQ_INT(F.gpu->forward(F.gpu, sg, n, err, sizeof err), 0);
        for (int i = 0; i < n; i++) {
            wide = fmax(wide, tiny_rel_to_range(lg + (size_t)i * TINY_VOCAB, lc + (size_t)i * TINY_VOCAB, TINY_VOCAB));
            pot_free(c[i]), pot_free(gp[i]);
        }
        free(lc), free(lg);
    }
    worst = fmax(worst, wide);
    fprintf(stderr, "  batched decode: logits %.2e (f16 pot %.2e; batches of 16 and 17: %.2e)\n", worst, worst16,
            wide);
    CHECK(worst <= TOL_F32);
    CHECK(worst16 <= TOL_F16);
    fleet_close(&F);
}

TEST(cuda_decode_graph_replay_matches_direct) {
    test_rng g = {78};
    int32_t prompt[LONG_PROMPT];
    fleet F;
    if (fleet_open(&F, 4, &g, prompt)) return;
    char err[256];
    backend *direct = cuda_backend_new(F.m, 1, 1, err, sizeof err);
    CHECK(direct != NULL);
    if (!direct) return fleet_close(&F);
    cuda_backend_use_graphs(direct, 0);
    double worst = 0, worst16 = 0;
    /* 508 tokens: the long pot's keys pass 512 at the fifth step, into the next bucket */
    prefill_all(&F, prompt, 508, &worst, &worst16);
    /* the direct backend's pots: copies of the graph backend's (same bytes) */
    pot *pd[NSEQ];
    for (int i = 0; i < NSEQ; i++) {
        pd[i] = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, F.pg[i]->dtype, err, sizeof err);
        CHECK_EQ_INT(pot_copy(pd[i], F.pg[i]), 0);
    }
    /* f32 pots only in the graph steps (sequence 3 is f16: it would leave the batch) */
    enum { NS = 4, STEPS = 8 };
    int seq[] = {0, 1, 2, 4};
    float *ld = malloc(NS * TINY_VOCAB * sizeof(float));
    int mismatches = 0;
    for (int step = 0; step < STEPS; step++) {
        if (step == 4) { /* compaction: new pot arrays under the same graph */
            int32_t rows = TINY_LAYERS * TINY_KV_HEADS, keep_n = F.pc[1]->n - 3;
            int32_t *keep = malloc((size_t)rows * keep_n * sizeof *keep);
            for (int32_t r = 0; r < rows; r++)
                for (int32_t i = 0; i < keep_n; i++) keep[r * keep_n + i] = i + (i >= r % 3 ? 3 : 0);
            pot_compact(F.pc[1], keep, keep_n);
            pot_compact(F.pg[1], keep, keep_n);
            pot_compact(pd[1], keep, keep_n);
            free(keep);
        }
        int32_t toks[NS];
        backend_span sc[NS], sg[NS], sd[NS];
        for (int j = 0; j < NS; j++) {
            int i = seq[j];
            toks[j] = (int32_t)(rng_u32(&g) % TINY_VOCAB);
            sc[j] = (backend_span){.tokens = &toks[j], .n_tokens = 1, .kv = F.pc[i],
                                   .logits_mode = BACKEND_LOGITS_LAST, .logits = F.lc + (size_t)j * TINY_VOCAB};
            sg[j] = sc[j], sg[j].kv = F.pg[i], sg[j].logits = F.lg + (size_t)j * TINY_VOCAB;
            sd[j] = sc[j], sd[j].kv = pd[i], sd[j].logits = ld + (size_t)j * TINY_VOCAB;
        }
        /* steps 6 and 7: sequence 2 attends to 5 of its slots only (recycled attention's
           partial steps): the attended slots are data of the replayed graph */
        int32_t att[TINY_LAYERS * TINY_KV_HEADS * 5];
        if (step >= 6) {
            for (int r = 0; r < TINY_LAYERS * TINY_KV_HEADS; r++)
                for (int j = 0; j < 5; j++) att[r * 5 + j] = j * 2 + (r + step) % 2;
            backend_span *all[] = {&sc[2], &sg[2], &sd[2]};
            for (int k = 0; k < 3; k++) all[k]->attend_slots = att, all[k]->n_attend = 5;
        }
        /* the first steps run 3 sequences, then 4: two graphs */
        int n = step < 2 ? 3 : NS;
        CHECK_EQ_INT(F.cpu->forward(F.cpu, sc, n, err, sizeof err), 0);
        CHECK_EQ_INT(F.gpu->forward(F.gpu, sg, n, err, sizeof err), 0);
        CHECK_EQ_INT(direct->forward(direct, sd, n, err, sizeof err), 0);
        mismatches += memcmp(F.lg, ld, (size_t)n * TINY_VOCAB * sizeof(float)) != 0;
        for (int j = 0; j < n; j++)
            worst = fmax(worst, tiny_rel_to_range(F.lg + (size_t)j * TINY_VOCAB, F.lc + (size_t)j * TINY_VOCAB,
                                                  TINY_VOCAB));
    }
    uint64_t captures, replays;
    cuda_backend_graph_counts(F.gpu, &captures, &replays);
    fprintf(stderr, "  decode graphs: %llu captured, %llu replays; logits vs cpu %.2e, %d steps differ from "
                    "direct launches\n", (unsigned long long)captures, (unsigned long long)replays, worst, mismatches);
    CHECK_EQ_INT(mismatches, 0);
    CHECK(worst <= TOL_F32);
    /* 3 rows; 4 rows in the 512-key bucket; 4 rows in the 1024 one; the attended slots'
       buffer once it exists (and a new buffer address at most once more) */
    CHECK(captures >= 3 && captures <= 5);
    CHECK(replays >= STEPS - captures);
    for (int i = 0; i < NSEQ; i++) pot_free(pd[i]);
    free(ld);
    direct->free(direct);
    fleet_close(&F);
}

/* exact = 0: the prefill products in f16 on the tensor cores (activations and
 * dequantised weights rounded to f16, f32 accumulation) stay close to the
 * exact CPU backend. Tolerance 5e-3 of the logit range (two f16 roundings of
 * 5e-4 relative each, through two layers). */
TEST(cuda_fast_prefill_close_to_exact) {
    char err[256];
    model *m = tiny_model_new(21);
    backend *cpu = cpu_backend_new(m, 1, 1, err, sizeof err), *fast = cuda_backend_new(m, 1, 0, err, sizeof err);
    CHECK(cpu && fast);
    if (cpu && fast) {
        test_rng g = {23};
        int32_t tok[40];
        for (int i = 0; i < 40; i++) tok[i] = (int32_t)(rng_u32(&g) % TINY_VOCAB);
        pot *pc = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, 48, POT_F32, err, sizeof err);
        pot *pf = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, 48, POT_F32, err, sizeof err);
        float *lc = malloc(40 * TINY_VOCAB * sizeof(float)), *lf = malloc(40 * TINY_VOCAB * sizeof(float));
        backend_span sc = {.tokens = tok, .n_tokens = 40, .kv = pc, .logits_mode = BACKEND_LOGITS_ALL, .logits = lc};
        backend_span sf = sc;
        sf.kv = pf, sf.logits = lf;
        CHECK_EQ_INT(cpu->forward(cpu, &sc, 1, err, sizeof err), 0);
        CHECK_EQ_INT(fast->forward(fast, &sf, 1, err, sizeof err), 0);
        double d = tiny_rel_to_range(lf, lc, 40 * TINY_VOCAB);
        fprintf(stderr, "  f16 prefill products (exact = 0): logits %.2e of the range\n", d);
        CHECK(d <= 5e-3);
        pot_free(pc), pot_free(pf), free(lc), free(lf);
    }
    if (fast) fast->free(fast);
    if (cpu) cpu->free(cpu);
    tiny_model_free(m);
}

/* Phase timing (cuda_backend_time_phases): off by default; on, it counts
 * decode steps and other forwards apart, and every counted forward adds host
 * time and the body's device time; turned off, nothing more is added. */
TEST(cuda_phase_timing_counts_forwards) {
    test_rng g = {79};
    int32_t prompt[LONG_PROMPT];
    fleet F;
    if (fleet_open(&F, 5, &g, prompt)) return;
    double worst = 0, worst16 = 0;
    const int32_t *t1[1] = {prompt};
    int32_t len1[1] = {9};
    run_both(&F, t1, len1, 1, NULL, 0, -1, &worst16);
    CHECK_EQ_INT((int)cuda_backend_phase_totals(F.gpu).forwards[0], 0); /* off by default */
    cuda_backend_time_phases(F.gpu, 1);
    prefill_all(&F, prompt, 40, &worst, &worst16); /* NSEQ span forwards */
    int32_t toks[NSEQ];
    const int32_t *tp[NSEQ];
    int32_t len[NSEQ];
    enum { STEPS = 3 };
    for (int i = 0; i < NSEQ; i++) tp[i] = &toks[i], len[i] = 1;
    for (int step = 0; step < STEPS; step++) { /* sequences 0-2: f32 pots, one batched decode step */
        for (int i = 0; i < NSEQ; i++) toks[i] = (int32_t)(rng_u32(&g) % TINY_VOCAB);
        run_both(&F, tp, len, 3, NULL, 0, -1, &worst16);
    }
    cuda_phase_totals t = cuda_backend_phase_totals(F.gpu);
    CHECK_EQ_INT((int)t.forwards[0], NSEQ);
    CHECK_EQ_INT((int)t.forwards[1], STEPS);
    for (int k = 0; k < 2; k++) {
        double host = 0;
        for (int p = 0; p < CUDA_PHASE_COUNT; p++) host += t.host_s[k][p];
        CHECK(host > 0);
        CHECK(t.body_device_s[k] > 0);
    }
    cuda_backend_time_phases(F.gpu, 0);
    run_both(&F, tp, len, 3, NULL, 0, -1, &worst16);
    CHECK_EQ_INT((int)cuda_backend_phase_totals(F.gpu).forwards[1], STEPS);
    fleet_close(&F);
}
