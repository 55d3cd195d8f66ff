/* Pot storage: sizes, overflow checks, f16/f32 round trips, copy, truncate
 * and in-order compaction. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "test.h"

TEST(pot_sizes_and_overflow) {
    CHECK_EQ_INT(pot_bytes(30, 3, 64, 2048, POT_F16), 30ull * 3 * 2048 * (64 * 2 * 2 + 17));
    CHECK_EQ_INT(pot_bytes(30, 3, 64, 2048, POT_F32), 30ull * 3 * 2048 * (64 * 2 * 4 + 17));
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

/* Writes slots [from, to) of every (layer, head) with keys naming (layer, slot). */
static void write_named(pot *p, int32_t from, int32_t to) {
    float k[4], v[4];
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++)
            for (int32_t s = from; s < to; s++) {
                for (int i = 0; i < 4; i++) k[i] = v[i] = (float)(l * 1000 + s);
                pot_write(p, l, h, s, k, v);
            }
}

/* Slot s of layer l reads back as written (named), or as zeros (gone). */
static int reads_named(const pot *p, int32_t l, int32_t s, float named) {
    float k[4], v[4];
    pot_read_k(p, l, 1, s, 1, k);
    pot_read_v(p, l, 1, s, 1, v);
    return k[0] == named && k[3] == named && v[2] == named;
}

/* A sliding layer (window 4, slack 3: a ring of 6 rows) beside a global one:
 * the ring keeps the newest 6 slots and reads older ones as zeros; compaction
 * to the newest slots keeps its rows in place while the global layer's move;
 * any other keep list is refused; copies into a plain pot and back keep what
 * the window sees; memory counts the ring's rows. */
TEST(pot_ring_layers_keep_their_newest_slots) {
    char err[128];
    const int32_t window[2] = {4, 0};
    pot *p = pot_new_windowed(2, 2, 4, 16, POT_F32, window, 3, err, sizeof err);
    CHECK(p != NULL);
    if (!p) return;
    CHECK_EQ_INT(pot_ring_rows(p, 0), 6);
    CHECK_EQ_INT(pot_ring_rows(p, 1), 0);
    size_t plain = pot_bytes(2, 2, 4, 16, POT_F32);
    CHECK_EQ_INT(pot_memory(p), plain - 2ull * (16 - 6) * 2 * 4 * 4);
    CHECK_EQ_INT(pot_windowed_bytes(2, 2, 4, 16, POT_F32, window, 3), pot_memory(p));
    write_named(p, 0, 10);
    p->n = 10;
    CHECK(reads_named(p, 0, 9, 9) && reads_named(p, 0, 4, 4));
    CHECK(reads_named(p, 0, 3, 0)); /* overwritten by slot 9: zeros */
    CHECK(reads_named(p, 1, 0, 1000) && reads_named(p, 1, 9, 1009));
    /* keep 5: the ring layer its newest, the global layer slots 0, 2, 4, 6, 8 */
    int32_t keep[2 * 2 * 5];
    for (int32_t h = 0; h < 2; h++)
        for (int32_t i = 0; i < 5; i++) {
            keep[h * 5 + i] = 10 - 5 + i;
            keep[(2 + h) * 5 + i] = 2 * i;
        }
    int32_t bad[2 * 2 * 5];
    memcpy(bad, keep, sizeof bad);
    bad[3] = 2; /* a ring layer's slot that is not among its newest */
    bad[4] = 3;
    CHECK_EQ_INT(pot_compact(p, bad, 5), -1);
    CHECK_EQ_INT(p->n, 10);
    CHECK_EQ_INT(pot_compact(p, keep, 5), 0);
    for (int32_t i = 0; i < 5; i++) CHECK(reads_named(p, 0, i, 5 + i) && reads_named(p, 1, i, 1000 + 2 * i));
    write_named(p, 5, 8); /* three new slots overwrite the ring's two oldest (slots 0, 1 now) */
    p->n = 8;
    CHECK(reads_named(p, 0, 0, 0) && reads_named(p, 0, 1, 0) && reads_named(p, 0, 2, 7));
    CHECK(reads_named(p, 0, 5, 5) && reads_named(p, 0, 7, 7) && reads_named(p, 1, 7, 1007));
    /* into a plain pot and back into a ring: the same slots, zeros below */
    pot *flat = pot_new(2, 2, 4, 16, POT_F32, err, sizeof err), *back = pot_new_windowed(2, 2, 4, 16, POT_F32, window, 3, err, sizeof err);
    CHECK(flat && back);
    if (flat && back) {
        CHECK_EQ_INT(pot_copy(flat, p), 0);
        CHECK_EQ_INT(pot_copy(back, flat), 0);
        for (int32_t s = 0; s < 8; s++) {
            float want = s < 2 ? 0 : s < 5 ? (float)(5 + s) : (float)s;
            CHECK(reads_named(flat, 0, s, want) && reads_named(back, 0, s, want));
            CHECK(reads_named(back, 1, s, s < 5 ? 1000 + 2 * s : 1000 + s));
        }
    }
    pot_free(flat);
    pot_free(back);
    pot_free(p);
    /* a window the capacity holds anyway: no ring */
    pot *wide = pot_new_windowed(2, 2, 4, 8, POT_F32, window, 8, err, sizeof err);
    CHECK(wide && !pot_ring_rows(wide, 0) && pot_memory(wide) == pot_bytes(2, 2, 4, 8, POT_F32));
    pot_free(wide);
}
