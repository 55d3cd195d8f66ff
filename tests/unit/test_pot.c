/* Pot storage: sizes, overflow checks, layout, copy and truncate. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "test.h"

TEST(pot_sizes_and_overflow) {
    CHECK_EQ_INT(pot_bytes(30, 3, 64, 2048), 30ull * 3 * 2048 * 64 * 2 * 4 + 2048 * 8);
    CHECK_EQ_INT(pot_bytes(0, 3, 64, 16), 0);
    CHECK_EQ_INT(pot_bytes(30, 3, 64, -1), 0);
    CHECK_EQ_INT(pot_bytes(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX), 0);
    char err[128];
    CHECK(pot_new(1, 1, 0, 4, err, sizeof err) == NULL);
    CHECK(strstr(err, "invalid size") != NULL);
}

TEST(pot_layout_copy_truncate) {
    char err[128];
    pot *a = pot_new(2, 3, 4, 8, err, sizeof err), *b = pot_new(2, 3, 4, 8, err, sizeof err);
    CHECK(a && b);
    if (!a || !b) return;
    /* rows of one (layer, head) are adjacent; heads and layers follow in order */
    CHECK(pot_k(a, 0, 1) == pot_k(a, 0, 0) + 8 * 4);
    CHECK(pot_k(a, 1, 0) == pot_k(a, 0, 0) + 3 * 8 * 4);
    for (int l = 0; l < 2; l++)
        for (int h = 0; h < 3; h++)
            for (int i = 0; i < 5 * 4; i++) {
                pot_k(a, l, h)[i] = (float)(l * 1000 + h * 100 + i);
                pot_v(a, l, h)[i] = -(float)(l * 1000 + h * 100 + i);
            }
    for (int i = 0; i < 5; i++) a->token_index[i] = 10 + i;
    a->n = 5;
    a->n_pinned = 2;
    a->n_seen = 15;
    CHECK_EQ_INT(pot_copy(b, a), 0);
    CHECK_EQ_INT(b->n, 5);
    CHECK_EQ_INT(b->n_seen, 15);
    CHECK(pot_k(b, 1, 2)[19] == 1219.0f && pot_v(b, 1, 2)[19] == -1219.0f);
    CHECK_EQ_INT(b->token_index[4], 14);
    pot_truncate(b, 1);
    CHECK_EQ_INT(b->n, 1);
    CHECK_EQ_INT(b->n_pinned, 1);
    pot_truncate(b, 3); /* cannot grow */
    CHECK_EQ_INT(b->n, 1);
    pot *small = pot_new(2, 3, 4, 4, err, sizeof err), *other = pot_new(2, 2, 4, 8, err, sizeof err);
    CHECK_EQ_INT(pot_copy(small, a), -1);
    CHECK_EQ_INT(pot_copy(other, a), -1);
    pot_free(a);
    pot_free(b);
    pot_free(small);
    pot_free(other);
}
