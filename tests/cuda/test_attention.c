/* The attention kernels against cuda_attention_ref (engine/cpu/cpu_backend.c's
 * arithmetic): flash-style prefill over [pot | span] with the causal mask,
 * split-K decoding, partial attention over chosen slots, and the score rows
 * (sum and max over a KV group, rows weighted as the cascade weighs them or
 * not), keys rotated by slot or by positions of their own (the no-reset
 * ablation's stream positions) — on pots of f16 and f32 keys stored before
 * RoPE, odd head sizes, GQA ratios 1 and 3, key counts that are not a whole
 * number of tiles, positions inside and beyond the angle table. */
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
