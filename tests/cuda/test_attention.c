/* The attention kernels against cuda_attention_ref (engine/cpu/cpu_backend.c's
 * arithmetic): flash-style prefill over [pot | span] with the causal mask,
 * split-K decoding, partial attention over chosen slots, and the score rows
 * (sum and max over a KV group, rows weighted as the cascade weighs them or
 * not), keys rotated by slot or by positions of their own (the no-reset
 * ablation's stream positions) — on pots of f16 and f32 keys stored before
 * RoPE, odd head sizes, GQA ratios 1 and 3, key counts that are not a whole
 * number of tiles, positions inside and beyond the angle table. The batched
 * decode (cuda_attention_batch_f32: many single-token spans, each over its own
 * pot) against a double-precision softmax attention written here. */
#include "cache/cache.h"
#include "cuda/kernels.h"
#include "engine/rope.h"
#include "tests/cuda/cuda_test.h"

typedef struct attn_case {
    int32_t head_dim, n_rot, n_head, n_head_kv;
    int32_t n0, n_q, n_attend; /* n_attend > 0: partial attention over that many slots */
    int32_t dtype, layout;
    int64_t n_table;
} attn_case;

/* stream_positions: every slot rotates to a position of its own (increasing
 * with gaps, past the angle table for the later slots), not to the slot. */
static void run_case(const attn_case *c, test_rng *g, int stream_positions) {
    int32_t hd = c->head_dim, cap = c->n0 + c->n_q + 3, nkv = c->n_head_kv, nh = c->n_head;
    char err[128];
    pot *p = pot_new(1, nkv, hd, cap, c->dtype, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    float *kv = malloc(2 * (size_t)hd * sizeof(float));
    for (int32_t h = 0; h < nkv; h++)
        for (int32_t s = 0; s < c->n0 + c->n_q; s++) {
            rng_fill(g, kv, 2 * (size_t)hd, -1.5f, 1.5f);
            pot_write(p, 0, h, s, kv, kv + hd);
        }
    free(kv);
    rope r;
    CHECK(rope_init(&r, c->n_rot, 10000.0f, c->layout, c->n_table) == 0);
    cuda_rope host_rope = {r.n_rot, (int32_t)r.layout, r.n_table, r.cs, r.inv_freq};
    void *dcs = dev_from(r.cs, (size_t)r.n_table * r.half * 2 * sizeof(float));
    void *dinv = dev_from(r.inv_freq, (size_t)(r.half ? r.half : 1) * sizeof(double));
    cuda_rope dev_rope = {r.n_rot, (int32_t)r.layout, r.n_table, dcs, dinv};

    int32_t n_pre = c->n_attend > 0 ? c->n_attend : c->n0, n_keys = n_pre + c->n_q;
    int32_t *slots = NULL;
    if (c->n_attend > 0) { /* increasing subsets of [0, n0), one per KV head */
        slots = malloc((size_t)nkv * n_pre * sizeof(int32_t));
        for (int32_t h = 0; h < nkv; h++) {
            int32_t taken = 0;
            for (int32_t s = 0; s < c->n0 && taken < n_pre; s++)
                if ((int32_t)(rng_u32(g) % (uint32_t)(c->n0 - s)) < n_pre - taken) slots[(size_t)h * n_pre + taken++] = s;
        }
    }
    size_t nqf = (size_t)c->n_q * nh * hd, esz = c->dtype == POT_F16 ? 2 : 4;
    size_t layer_bytes = (size_t)nkv * cap * hd * esz;
    float *q = malloc(nqf * sizeof(float)), *want = malloc(nqf * sizeof(float)), *got = malloc(nqf * sizeof(float));
    float *lse_want = malloc((size_t)nh * c->n_q * sizeof(float)), *lse_got = malloc((size_t)nh * c->n_q * sizeof(float));
    size_t n_scores = (size_t)nkv * n_keys;
    float *sc_want = malloc(n_scores * sizeof(float)), *sc_got = malloc(n_scores * sizeof(float));
    rng_fill(g, q, nqf, -1.5f, 1.5f);

    void *dk = dev_from(p->k, layer_bytes), *dv = dev_from(p->v, layer_bytes);
    float *dq = dev_from(q, nqf * sizeof(float)), *dout = dev_alloc(nqf * sizeof(float));
    float *dlse = dev_alloc((size_t)nh * c->n_q * sizeof(float)), *dsc = dev_alloc(n_scores * sizeof(float));
    int32_t *dslots = slots ? dev_from(slots, (size_t)nkv * n_pre * sizeof(int32_t)) : NULL;

    int32_t *pos = NULL, *dpos = NULL;
    if (stream_positions) {
        pos = malloc((size_t)nkv * cap * sizeof(int32_t));
        for (int32_t h = 0; h < nkv; h++)
            for (int32_t s = 0, at = 5 * h; s < cap; s++) pos[(size_t)h * cap + s] = at += 1 + (int32_t)(rng_u32(g) % 40);
        dpos = dev_from(pos, (size_t)nkv * cap * sizeof(int32_t));
    }
    cuda_attn host = {q, want, lse_want, p->k, p->v, c->dtype, cap, nh, nkv, hd, slots, n_pre, c->n0, c->n_q,
                      1.0f / sqrtf((float)hd), pos};
    cuda_attn dev = {dq, dout, dlse, dk, dv, c->dtype, cap, nh, nkv, hd, dslots, n_pre, c->n0, c->n_q, host.scale,
                     dpos};
    int32_t row0 = c->n_q > 2 ? c->n_q / 3 : 0, n_rows = c->n_q - row0;

    /* row weights like the cascade's: geometric, the last row heaviest */
    float *row_w = malloc((size_t)n_rows * sizeof(float) + 1);
    for (int32_t i = 0; i < n_rows; i++) row_w[i] = powf(0.7f, (float)(n_rows - 1 - i));
    float *drow_w = dev_from(row_w, (size_t)n_rows * sizeof(float));

    int32_t splits[] = {1, cuda_attention_splits(c->n_q, n_keys), 3, 7};
    for (int mode = 0; mode < 5; mode++) { /* heads summed, their max, weighted rows; rows' max (heads max, sum) */
        int combine = mode == 1 ? 1 : mode == 3 ? 3 : mode == 4 ? 2 : 0;
        const float *w_host = mode == 2 ? row_w : NULL, *w_dev = mode == 2 ? drow_w : NULL;
        cuda_attention_ref(&host, &host_rope, row0, n_rows, w_host, combine, slots ? NULL : sc_want);
        for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
            int32_t ns = splits[si];
            size_t scratch_n = cuda_attention_scratch_floats(c->n_q, nh, hd, ns);
            float *scratch = scratch_n ? dev_alloc(scratch_n * sizeof(float)) : NULL;
            CHECK_CUDA(cuda_attention_f32(&dev, &dev_rope, ns, scratch, 0));
            host_from(got, dout, nqf * sizeof(float));
            host_from(lse_got, dlse, (size_t)nh * c->n_q * sizeof(float));
            double e_out = worst_error(got, want, nqf, 2e-5, 1e-4);
            double e_lse = worst_error(lse_got, lse_want, (size_t)nh * c->n_q, 1e-5, 1e-5);
            double e_sc = 0;
            if (!slots) {
                CHECK_CUDA(cuda_attention_scores(&dev, &dev_rope, row0, n_rows, w_dev, combine, dsc, 0));
                host_from(sc_got, dsc, n_scores * sizeof(float));
                e_sc = worst_error(sc_got, sc_want, n_scores, 1e-5, 1e-4);
            }
            if (getenv("ATTN_VERBOSE") || !(e_out <= 1 && e_lse <= 1 && e_sc <= 1))
                fprintf(stderr, "  hd %d heads %d/%d n0 %d n_q %d attend %d dtype %d split %d scores mode %d: "
                        "out %g lse %g scores %g\n", hd, nh, nkv, c->n0, c->n_q, c->n_attend, c->dtype, ns,
                        mode, e_out, e_lse, e_sc);
            CHECK(e_out <= 1);
            CHECK(e_lse <= 1);
            CHECK(e_sc <= 1);
            cudaFree(scratch);
        }
    }
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout), cudaFree(dlse), cudaFree(dsc), cudaFree(dslots);
    cudaFree(dcs), cudaFree(dinv), cudaFree(drow_w), cudaFree(dpos);
    free(row_w), free(pos);
    free(q), free(want), free(got), free(lse_want), free(lse_got), free(sc_want), free(sc_got), free(slots);
    rope_free(&r);
    pot_free(p);
}

TEST(cuda_attention_prefill_matches_cpu) {
    test_rng g = {21};
    attn_case cases[] = {
        {64, 64, 9, 3, 45, 12, 0, POT_F16, 0, 4096},  /* SmolLM2's shape: GQA 3 */
        {64, 64, 4, 4, 0, 37, 0, POT_F32, 1, 4096},   /* no pot, GQA 1, 37 keys: a partial tile */
        {40, 32, 6, 2, 70, 5, 0, POT_F32, 0, 50},     /* odd head_dim, partial rotary, beyond the table */
        {256, 256, 2, 1, 33, 3, 0, POT_F16, 1, 4096}, /* large head_dim: smaller tiles */
        {96, 96, 3, 1, 0, 1, 0, POT_F16, 0, 4096},    /* one token, empty pot */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &g, 0);
}

TEST(cuda_attention_split_k_decode_matches_cpu) {
    test_rng g = {22};
    attn_case cases[] = {
        {64, 64, 9, 3, 1000, 1, 0, POT_F16, 0, 4096}, /* 1001 keys: 4 splits by default */
        {128, 128, 2, 2, 777, 1, 0, POT_F32, 1, 600}, /* slots beyond the angle table */
        {64, 64, 3, 1, 130, 2, 0, POT_F16, 0, 4096},  /* two queries over a split range */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &g, 0);
}

TEST(cuda_attention_partial_slots_match_cpu) {
    test_rng g = {23};
    attn_case cases[] = {
        {64, 64, 6, 2, 50, 7, 20, POT_F16, 0, 4096},
        {64, 64, 3, 3, 600, 1, 333, POT_F32, 1, 4096},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &g, 0);
}

TEST(cuda_attention_stream_positions_match_cpu) {
    test_rng g = {24};
    attn_case cases[] = {
        {64, 64, 9, 3, 45, 12, 0, POT_F16, 0, 100},   /* prefill; positions run past the table */
        {64, 64, 3, 1, 700, 1, 0, POT_F32, 1, 4096},  /* split-K decoding */
        {32, 16, 4, 2, 60, 3, 20, POT_F16, 0, 4096},  /* partial attention, partial rotary */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], &g, 1);
}

TEST(cuda_attention_rejects_bad_arguments) {
    float dummy = 0;
    cuda_rope r = {0, 0, 0, NULL, NULL};
    cuda_attn a = {&dummy, &dummy, NULL, &dummy, &dummy, 1, 4, 3, 2, 8, NULL, 0, 0, 1, 1.0f, NULL};
    CHECK(cuda_attention_f32(&a, &r, 1, NULL, 0) == cudaErrorInvalidValue); /* 3 heads over 2 KV heads */
    a.n_head = 4;
    a.n_q = 5; /* beyond capacity */
    CHECK(cuda_attention_f32(&a, &r, 1, NULL, 0) == cudaErrorInvalidValue);
    a.n_q = 1;
    CHECK(cuda_attention_f32(&a, &r, 2, NULL, 0) == cudaErrorInvalidValue); /* split without scratch */
    CHECK(cuda_attention_scores(&a, &r, 0, 1, NULL, 0, &dummy, 0) == cudaErrorInvalidValue); /* no lse */
}

/* ---- the batched decode: cuda_attention_batch_f32 ------------------------------------ */

/* The reference of one batched span, written here apart from cuda_attention_ref: query
 * heads q [n_head][head_dim] over the span's keys, its pot's slots slots[layer][g][k] (or
 * 0 .. n_pre - 1) and then its own slot n0, read from the host pot (pot_read_k/v) and
 * rotated to their slot by the engine's rope_rotate, then rounded to the pot's entry
 * precision as the CPU backend attends (pot_round_row); the scores, softmax and weighted
 * sum of values in double. */
static void batch_span_ref(const pot *p, int32_t layer, const rope *r, const float *q, int32_t n_head, int32_t n0,
                           int32_t n_pre, const int32_t *slots, float *out) {
    int32_t hd = p->head_dim, nkv = p->n_head_kv, group = n_head / nkv, n_keys = n_pre + 1;
    float *keys = malloc((size_t)n_keys * hd * sizeof(float)), *vals = malloc((size_t)n_keys * hd * sizeof(float));
    double *w = malloc((size_t)n_keys * sizeof(double)), scale = 1.0 / sqrt((double)hd);
    for (int32_t g = 0; g < nkv; g++) {
        for (int32_t k = 0; k < n_keys; k++) {
            int32_t slot = k == n_pre ? n0 : slots ? slots[((size_t)layer * nkv + g) * n_pre + k] : k;
            float *kr = keys + (size_t)k * hd;
            pot_read_k(p, layer, g, slot, 1, kr);
            rope_rotate(r, kr, slot);
            pot_round_row(p, kr);
            pot_read_v(p, layer, g, slot, 1, vals + (size_t)k * hd);
        }
        for (int32_t h = g * group; h < (g + 1) * group; h++) {
            const float *qh = q + (size_t)h * hd;
            double mx = -INFINITY, sum = 0;
            for (int32_t k = 0; k < n_keys; k++) {
                double dot = 0;
                for (int32_t e = 0; e < hd; e++) dot += (double)qh[e] * keys[(size_t)k * hd + e];
                w[k] = dot * scale;
                mx = fmax(mx, w[k]);
            }
            for (int32_t k = 0; k < n_keys; k++) sum += w[k] = exp(w[k] - mx);
            for (int32_t e = 0; e < hd; e++) {
                double o = 0;
                for (int32_t k = 0; k < n_keys; k++) o += w[k] * vals[(size_t)k * hd + e];
                out[(size_t)h * hd + e] = (float)(o / sum);
            }
        }
    }
    free(keys), free(vals), free(w);
}

typedef struct batch_case {
    int32_t head_dim, n_rot, n_head, n_head_kv, dtype, layout;
    int64_t n_table;
} batch_case;

/* One batched launch as cuda_backend.c's forward_layer makes it (upload_inputs' descriptors,
 * plan_forward's grid splits): NS single-token spans, each over a pot of its own (L layers,
 * capacities of their own, the whole K/V arrays in the descriptor; the span's own K/V
 * already at slot n0, where cuda_pot_store_batch puts them), attending at layer 1; queries
 * in rows of q in an order of their own (random: the kernel takes them as given, rotated);
 * the backend's cuda_rope (rope_init's table and inverse frequencies in device memory). The
 * pots' slots past n0 hold keys too, which no span may attend. Each span's output is
 * compared with batch_span_ref; the row no span takes keeps its bytes. Grid splits: 1
 * (every span in one pass), 2 (fewer than the long spans want), and plan_forward's, from
 * the key-count bucket (the next power of two from 512) of the longest span: 8 for its
 * 1100 keys, 5 of them used.
 *
 * Tolerance, as the other attention tests': |got - want| <= 2e-5 + 1e-4 |want|. Both sides
 * attend with the same keys to the bit (rope_rotate's rotation, rounded as the pot's
 * entries); the kernel's scores (head_dim f32 products), exp and running sums over up to
 * 1100 keys round in f32 where the reference keeps double: a few 2^-24 relative per step,
 * growing about as the square root of the key count, on outputs |o| <= 1.5 (means of
 * values in [-1.5, 1.5]), i.e. a few 1e-6 at most; measured about 1e-7 (the worst span at
 * 0.005 of the tolerance; ATTN_VERBOSE prints each). */
static void run_batch_case(const batch_case *c, test_rng *g) {
    enum { NS = 5, ROWS = 6, L = 2, LAYER = 1 };
    const int32_t n0[NS] = {0, 44, 1099, 300, 256};
    const int32_t cap[NS] = {1, 50, 1103, 333, 257};
    const int32_t n_attend[NS] = {0, 0, 0, 77, 0}; /* > 0: partial attention over that many slots */
    const int32_t row[NS] = {4, 0, 2, 5, 1};      /* row 3 is no span's */
    /* keys: 1 (the token alone), 45 (not a whole number of tiles), 1100 (split-K: 5 splits of
     * 256), 78 (chosen slots), 257 (two splits, the second of one key) */
    int32_t hd = c->head_dim, nh = c->n_head, nkv = c->n_head_kv;
    size_t esz = c->dtype == POT_F16 ? 2 : 4, row_f = (size_t)nh * hd, nqf = ROWS * row_f;
    char err[128];
    rope r;
    CHECK(rope_init(&r, c->n_rot, 10000.0f, c->layout, c->n_table) == 0);
    void *dcs = dev_from(r.cs, (size_t)r.n_table * r.half * 2 * sizeof(float));
    void *dinv = dev_from(r.inv_freq, (size_t)(r.half ? r.half : 1) * sizeof(double));
    cuda_rope dev_rope = {r.n_rot, (int32_t)r.layout, r.n_table, dcs, dinv};

    pot *p[NS];
    void *dk[NS], *dv[NS];
    int32_t *slots[NS], *dslots[NS], max_keys = 0;
    cuda_attn_desc desc[NS];
    float *kv = malloc(2 * (size_t)hd * sizeof(float));
    for (int s = 0; s < NS; s++) {
        p[s] = pot_new(L, nkv, hd, cap[s], c->dtype, err, sizeof err);
        CHECK(p[s] != NULL);
        if (!p[s]) return;
        for (int32_t l = 0; l < L; l++)
            for (int32_t h = 0; h < nkv; h++)
                for (int32_t i = 0; i < cap[s]; i++) {
                    rng_fill(g, kv, 2 * (size_t)hd, -1.5f, 1.5f);
                    pot_write(p[s], l, h, i, kv, kv + hd);
                }
        p[s]->n = n0[s];
        size_t bytes = (size_t)L * nkv * cap[s] * hd * esz;
        dk[s] = dev_from(p[s]->k, bytes);
        dv[s] = dev_from(p[s]->v, bytes);
        int32_t n_pre = n_attend[s] > 0 ? n_attend[s] : n0[s];
        slots[s] = dslots[s] = NULL;
        if (n_attend[s] > 0) { /* [L][n_head_kv][n_pre]: increasing subsets of [0, n0), one per (layer, head) */
            slots[s] = malloc((size_t)L * nkv * n_pre * sizeof(int32_t));
            for (int32_t lh = 0; lh < L * nkv; lh++)
                for (int32_t i = 0, taken = 0; i < n0[s] && taken < n_pre; i++)
                    if ((int32_t)(rng_u32(g) % (uint32_t)(n0[s] - i)) < n_pre - taken)
                        slots[s][(size_t)lh * n_pre + taken++] = i;
            dslots[s] = dev_from(slots[s], (size_t)L * nkv * n_pre * sizeof(int32_t));
        }
        desc[s] = (cuda_attn_desc){row[s], n0[s], n_pre, cap[s], dk[s], dv[s], dslots[s]};
        if (n_pre + 1 > max_keys) max_keys = n_pre + 1;
    }
    free(kv);
    cuda_attn_desc *ddesc = dev_from(desc, sizeof desc);

    float *q = malloc(nqf * sizeof(float)), *want = malloc(nqf * sizeof(float)), *got = malloc(nqf * sizeof(float));
    float *sentinel = malloc(nqf * sizeof(float));
    rng_fill(g, q, nqf, -1.5f, 1.5f);
    for (size_t i = 0; i < nqf; i++) sentinel[i] = 1234.5f;
    memcpy(want, sentinel, nqf * sizeof(float));
    for (int s = 0; s < NS; s++)
        batch_span_ref(p[s], LAYER, &r, q + row[s] * row_f, nh, n0[s], desc[s].n_pre, slots[s],
                       want + row[s] * row_f);
    float *dq = dev_from(q, nqf * sizeof(float)), *dout = dev_alloc(nqf * sizeof(float));
    cuda_attn_batch b = {ddesc, NS, LAYER, c->dtype, nh, nkv, hd, dq, dout, 1.0f / sqrtf((float)hd)};

    int32_t bucket = 512;
    while (bucket < max_keys) bucket *= 2;
    int32_t grid_splits[] = {1, 2, cuda_attention_batch_splits(bucket)};
    CHECK_EQ_INT(grid_splits[2], 8);
    for (size_t gi = 0; gi < sizeof grid_splits / sizeof grid_splits[0]; gi++) {
        int32_t gs = grid_splits[gi];
        size_t scratch_n = cuda_attention_batch_scratch_floats(NS, nh, hd, gs);
        float *scratch = scratch_n ? dev_alloc(scratch_n * sizeof(float)) : NULL;
        cudaMemcpy(dout, sentinel, nqf * sizeof(float), cudaMemcpyHostToDevice);
        CHECK_CUDA(cuda_attention_batch_f32(&b, &dev_rope, gs, scratch, 0));
        host_from(got, dout, nqf * sizeof(float));
        for (int s = 0; s < NS; s++) {
            double e = worst_error(got + row[s] * row_f, want + row[s] * row_f, row_f, 2e-5, 1e-4);
            if (getenv("ATTN_VERBOSE") || !(e <= 1))
                fprintf(stderr, "  batch hd %d heads %d/%d dtype %d grid splits %d span %d (n0 %d, %d keys): %g\n", hd,
                        nh, nkv, c->dtype, gs, s, n0[s], desc[s].n_pre + 1, e);
            CHECK(e <= 1);
        }
        CHECK(memcmp(got + 3 * row_f, sentinel, row_f * sizeof(float)) == 0); /* no span's row: untouched */
        cudaFree(scratch);
    }
    CHECK(cuda_attention_batch_f32(&b, &dev_rope, 2, NULL, 0) == cudaErrorInvalidValue); /* splits, no scratch */
    for (int s = 0; s < NS; s++) {
        cudaFree(dk[s]), cudaFree(dv[s]), cudaFree(dslots[s]);
        free(slots[s]);
        pot_free(p[s]);
    }
    cudaFree(ddesc), cudaFree(dq), cudaFree(dout), cudaFree(dcs), cudaFree(dinv);
    free(q), free(want), free(got), free(sentinel);
    rope_free(&r);
}

TEST(cuda_attention_batch_decode_matches_cpu) {
    test_rng g = {25};
    batch_case cases[] = {
        {64, 64, 9, 3, POT_F16, 0, 4096}, /* SmolLM2's shape: GQA 3, f16 pots */
        {40, 32, 10, 2, POT_F32, 1, 600}, /* GQA 5 (two warp groups per KV head, the second part idle),
                                             partial rotary, the long span's keys past the angle table */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_batch_case(&cases[i], &g);
}
