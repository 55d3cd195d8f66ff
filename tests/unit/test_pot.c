/* Pot storage: sizes, overflow checks, f16/f32 round trips, copy, truncate
 * and in-order compaction. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "test.h"

TEST(pot_sizes_and_overflow) {
    CHECK_EQ_INT(pot_bytes(30, 3, 64, 2048, POT_F16), 30ull * 3 * 2048 * (64 * 2 * 2 + 16));
    CHECK_EQ_INT(pot_bytes(30, 3, 64, 2048, POT_F32), 30ull * 3 * 2048 * (64 * 2 * 4 + 16));
    CHECK_EQ_INT(pot_bytes(0, 3, 64, 16, POT_F16), 0);
    CHECK_EQ_INT(pot_bytes(30, 3, 64, -1, POT_F16), 0);
    CHECK_EQ_INT(pot_bytes(INT32_MAX, INT32_MAX, 60000, INT32_MAX, POT_F32), 0);
    char err[128];
    CHECK(pot_new(1, 1, 0, 4, POT_F16, err, sizeof err) == NULL);
    CHECK(strstr(err, "invalid size") != NULL);
}

/* Fills slots 0..n-1 of every (layer, head) with values that name their place. */
static void fill(pot *p, int32_t n) {
    float k[16], v[16];
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++)
            for (int32_t s = 0; s < n; s++) {
                for (int i = 0; i < p->head_dim; i++) {
                    k[i] = (float)(l * 100 + h * 10 + s) + i / 8.0f;
                    v[i] = -k[i];
                }
                pot_write(p, l, h, s, k, v);
                p->token_index[pot_slot(p, l, h, s)] = 1000 + s;
                p->surprisal[pot_slot(p, l, h, s)] = (float)s;
            }
    p->n = n;
    p->n_seen = 1000 + n;
}

TEST(pot_f16_and_f32_round_trip) {
    char err[128];
    enum pot_dtype types[2] = {POT_F16, POT_F32};
    for (int t = 0; t < 2; t++) {
        pot *p = pot_new(2, 3, 4, 8, types[t], err, sizeof err);
        CHECK(p != NULL);
        if (!p) return;
        fill(p, 5);
        float k[8], v[8];
        pot_read_k(p, 1, 2, 3, 2, k);
        pot_read_v(p, 1, 2, 3, 2, v);
        /* 123 + i/8 and 124 + i/8 are exact in f16 too */
        CHECK(k[0] == 123.0f && k[3] == 123.375f && k[4] == 124.0f && v[7] == -124.375f);
        pot_free(p);
    }
    pot *p = pot_new(1, 1, 4, 2, POT_F16, err, sizeof err);
    float k[4] = {1.0f / 3, 65504.0f, 1e-8f, -2.5f}, v[4] = {0}, back[4];
    pot_write(p, 0, 0, 0, k, v);
    pot_read_k(p, 0, 0, 0, 1, back);
    CHECK_NEAR(back[0], 1.0f / 3, 1e-3);
    CHECK(back[1] == 65504.0f && back[3] == -2.5f);
    CHECK_NEAR(back[2], 0, 1e-7);
    pot_free(p);
}

TEST(pot_copy_truncate) {
    char err[128];
    pot *a = pot_new(2, 3, 4, 8, POT_F32, err, sizeof err), *b = pot_new(2, 3, 4, 8, POT_F32, err, sizeof err);
    CHECK(a && b);
    if (!a || !b) return;
    fill(a, 5);
    a->n_pinned = 2;
    CHECK_EQ_INT(pot_copy(b, a), 0);
    CHECK_EQ_INT(b->n, 5);
    CHECK_EQ_INT(b->n_seen, 1005);
    float k[4];
    pot_read_k(b, 1, 2, 4, 1, k);
    CHECK(k[0] == 124.0f);
    CHECK_EQ_INT(b->token_index[pot_slot(b, 1, 2, 4)], 1004);
    pot_truncate(b, 1);
    CHECK_EQ_INT(b->n, 1);
    CHECK_EQ_INT(b->n_pinned, 1);
    pot_truncate(b, 3); /* cannot grow */
    CHECK_EQ_INT(b->n, 1);
    pot *small = pot_new(2, 3, 4, 4, POT_F32, err, sizeof err), *other = pot_new(2, 2, 4, 8, POT_F32, err, sizeof err);
    pot *half = pot_new(2, 3, 4, 8, POT_F16, err, sizeof err);
    CHECK_EQ_INT(pot_copy(small, a), -1);
    CHECK_EQ_INT(pot_copy(other, a), -1);
    CHECK_EQ_INT(pot_copy(half, a), -1);
    pot_free(a);
    pot_free(b);
    pot_free(small);
    pot_free(other);
    pot_free(half);
}

TEST(pot_compact_keeps_order_per_head) {
    char err[128];
    pot *p = pot_new(2, 2, 4, 8, POT_F16, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    fill(p, 7);
    /* each (layer, head) keeps a different set of 3 slots */
    int32_t keep[4][3] = {{0, 1, 2}, {2, 4, 6}, {0, 5, 6}, {1, 3, 4}};
    pot_compact(p, &keep[0][0], 3);
    CHECK_EQ_INT(p->n, 3);
    for (int32_t l = 0; l < 2; l++)
        for (int32_t h = 0; h < 2; h++)
            for (int32_t i = 0; i < 3; i++) {
                int32_t from = keep[l * 2 + h][i];
                float k[4], v[4];
                pot_read_k(p, l, h, i, 1, k);
                pot_read_v(p, l, h, i, 1, v);
                CHECK(k[0] == (float)(l * 100 + h * 10 + from));
                CHECK(v[0] == -k[0]);
                CHECK_EQ_INT(p->token_index[pot_slot(p, l, h, i)], 1000 + from);
                CHECK(p->surprisal[pot_slot(p, l, h, i)] == (float)from);
            }
    pot_free(p);
}
