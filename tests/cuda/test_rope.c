/* RoPE on the GPU against engine/rope.c: query rows rotated in place,
 * and pot keys (f16 and f32, pre-RoPE) loaded and rotated by slot. Inside the
 * angle table the results must be bit-identical; beyond it (angles computed
 * in double on each side) within an ulp or so. */
#include "cache/cache.h"
#include "cuda/kernels.h"
#include "engine/rope.h"
#include "tests/cuda/cuda_test.h"

/* The rope's tables uploaded to the device; *dev owns the two arrays. */
static cuda_rope upload_rope(const rope *r, void **cs, void **inv) {
    size_t half = (size_t)r->half;
    *cs = dev_from(r->cs, (size_t)r->n_table * half * 2 * sizeof(float));
    *inv = dev_from(r->inv_freq, half * sizeof(double));
    return (cuda_rope){r->n_rot, (int32_t)r->layout, r->n_table, *cs, *inv};
}

/* Compares rows; exact when every position is inside the table. */
static void check_rows(const float *got, const float *want, size_t n, int exact) {
    if (exact)
        CHECK(!memcmp(got, want, n * sizeof(float)));
    else
        CHECK(worst_error(got, want, n, 1e-6, 1e-6) <= 1);
}

TEST(cuda_rope_queries_match_rope_rotate) {
    test_rng g = {4};
    struct {
        int32_t head_dim, n_rot, n_heads, n_tokens;
        int64_t n_table;
        int32_t pos0;
    } cases[] = {{64, 64, 3, 5, 4096, 100}, {40, 32, 2, 7, 64, 50}, {6, 6, 1, 1, 8, 0}, {128, 128, 9, 33, 200, 190}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int layout = 0; layout < 2; layout++)
            for (int with_pos = 0; with_pos < 2; with_pos++) {
                int32_t hd = cases[c].head_dim, nh = cases[c].n_heads, nt = cases[c].n_tokens;
                rope r;
                CHECK(rope_init(&r, cases[c].n_rot, 10000.0f, layout, cases[c].n_table) == 0);
                size_t n = (size_t)nt * nh * hd;
                float *x = malloc(n * 4), *got = malloc(n * 4);
                int32_t *pos = malloc(nt * 4);
                rng_fill(&g, x, n, -3, 3);
                int exact = 1;
                for (int32_t t = 0; t < nt; t++) {
                    pos[t] = with_pos ? (int32_t)(rng_u32(&g) % (cases[c].n_table + 40)) : cases[c].pos0 + t;
                    exact &= pos[t] < cases[c].n_table;
                }
                void *cs, *inv;
                cuda_rope cr = upload_rope(&r, &cs, &inv);
                float *dx = dev_from(x, n * 4);
                int32_t *dpos = dev_from(pos, nt * 4);
                CHECK_CUDA(cuda_rope_f32(dx, nt, nh, hd, with_pos ? dpos : NULL, cases[c].pos0, &cr, 0));
                host_from(got, dx, n * 4);
                for (int32_t t = 0; t < nt; t++)
                    for (int32_t h = 0; h < nh; h++) rope_rotate(&r, x + ((size_t)t * nh + h) * hd, pos[t]);
                check_rows(got, x, n, exact);
                cudaFree(dx), cudaFree(dpos), cudaFree(cs), cudaFree(inv);
                free(x), free(got), free(pos);
                rope_free(&r);
            }
}

TEST(cuda_pot_load_matches_pot_read_and_rope) {
    test_rng g = {8};
    enum { LAYERS = 2, HEADS = 3, DIM = 40, ROT = 32, CAP = 37, FILL = 29 };
    for (int dtype = 0; dtype < 2; dtype++)
        for (int layout = 0; layout < 2; layout++)
            for (int64_t n_table = 10; n_table <= 4096; n_table += 4086) {
                char err[128];
                pot *p = pot_new(LAYERS, HEADS, DIM, CAP, dtype, err, sizeof err);
                CHECK(p != NULL);
                if (!p) return;
                float k[DIM], v[DIM];
                for (int l = 0; l < LAYERS; l++)
                    for (int h = 0; h < HEADS; h++)
                        for (int s = 0; s < FILL; s++) {
                            rng_fill(&g, k, DIM, -2, 2);
                            rng_fill(&g, v, DIM, -2, 2);
                            pot_write(p, l, h, s, k, v);
                        }
                p->n = FILL;
                rope r;
                CHECK(rope_init(&r, ROT, 10000.0f, layout, n_table) == 0);
                void *cs, *inv;
                cuda_rope cr = upload_rope(&r, &cs, &inv);
                size_t elem = dtype == POT_F16 ? 2 : 4, layer_elems = (size_t)HEADS * CAP * DIM;
                /* layer 1 only: the loader takes one layer's block */
                void *dk = dev_from((char *)p->k + layer_elems * elem, layer_elems * elem);
                void *dv = dev_from((char *)p->v + layer_elems * elem, layer_elems * elem);
                int32_t slots[HEADS * 11];
                for (int h = 0; h < HEADS; h++) /* an increasing subset per head */
                    for (int i = 0, s = 0; i < 11; i++, s++) {
                        s += (int)(rng_u32(&g) % 2);
                        slots[h * 11 + i] = s;
                    }
                int32_t *dslots = dev_from(slots, sizeof slots);
                float *out = dev_alloc((size_t)HEADS * FILL * DIM * 4), *got = malloc((size_t)HEADS * FILL * DIM * 4),
                      *want = malloc((size_t)HEADS * FILL * DIM * 4);
                for (int subset = 0; subset < 2; subset++)
                    for (int keys = 0; keys < 2; keys++) {
                        int32_t n_keys = subset ? 11 : FILL;
                        CHECK_CUDA(cuda_pot_load_f32(out, keys ? dk : dv, dtype, CAP, HEADS, DIM, subset ? dslots : NULL,
                                                     n_keys, keys ? &cr : NULL, 0));
                        host_from(got, out, (size_t)HEADS * n_keys * DIM * 4);
                        int exact = 1;
                        for (int h = 0; h < HEADS; h++)
                            for (int i = 0; i < n_keys; i++) {
                                int32_t s = subset ? slots[h * 11 + i] : i;
                                float *row = want + ((size_t)h * n_keys + i) * DIM;
                                if (keys) {
                                    pot_read_k(p, 1, h, s, 1, row);
                                    rope_rotate(&r, row, s);
                                    exact &= s < n_table;
                                } else {
                                    pot_read_v(p, 1, h, s, 1, row);
                                }
                            }
                        check_rows(got, want, (size_t)HEADS * n_keys * DIM, exact);
                    }
                cudaFree(dk), cudaFree(dv), cudaFree(dslots), cudaFree(out), cudaFree(cs), cudaFree(inv);
                free(got), free(want);
                rope_free(&r);
                pot_free(p);
            }
}
