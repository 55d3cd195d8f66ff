/* common/common.h: the error helper, growable vectors and little-endian
 * integers (CRC-32C is checked against its standard vector in test_snapshot.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "test.h"

TEST(common_set_err_formats_and_truncates) {
    char err[8] = "garbage"; /* overwritten by the first call */
    set_err(err, sizeof err, "bad %s %d", "value", 42);
    CHECK_STR(err, "bad val"); /* truncated to the buffer, NUL-terminated */
    set_err(NULL, 10, "ignored %d", 1);
    set_err(err, 0, "ignored %d", 1);
    CHECK_STR(err, "bad val");
}

typedef struct pair {
    int32_t a, b;
} pair;

TEST(common_vec_push_append_reserve) {
    VEC(int32_t) v = {0};
    for (int32_t i = 0; i < 1000; i++) CHECK_EQ_INT(vec_push(&v, i * 3), 0);
    CHECK(v.n == 1000 && v.cap >= 1000);
    int ok = 1;
    for (int32_t i = 0; i < 1000; i++) ok &= v.v[i] == i * 3;
    CHECK(ok);
    const int32_t more[3] = {7, 8, 9};
    CHECK_EQ_INT(vec_append(&v, more, 3), 0);
    CHECK_EQ_INT(vec_append(&v, (const int32_t *)NULL, 0), 0);
    CHECK(v.n == 1003 && v.v[1000] == 7 && v.v[1002] == 9);
    size_t cap = v.cap;
    CHECK_EQ_INT(vec_reserve(&v, cap), 0);
    CHECK(v.cap == cap); /* enough room: nothing moves */
    /* a size no allocator can give: -1, the vector unchanged */
    CHECK_EQ_INT(vec_reserve(&v, SIZE_MAX / 2), -1);
    CHECK(v.n == 1003 && v.cap == cap && v.v[1002] == 9);
    free(v.v);

    VEC(pair) p = {0}; /* a compound literal's commas pass through vec_push */
    CHECK_EQ_INT(vec_push(&p, (pair){1, 2}), 0);
    CHECK(p.n == 1 && p.v[0].a == 1 && p.v[0].b == 2);
    free(p.v);
}

TEST(common_little_endian_round_trip) {
    unsigned char b[8];
    le_put_u32(b, 0x11223344u);
    CHECK(b[0] == 0x44 && b[3] == 0x11);
    CHECK(le_get_u32(b) == 0x11223344u);
    le_put_u64(b, 0x0102030405060708ull);
    CHECK(b[0] == 0x08 && b[7] == 0x01);
    CHECK(le_get_u64(b) == 0x0102030405060708ull);
}
