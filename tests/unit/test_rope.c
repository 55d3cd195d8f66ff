/* RoPE: re-positioning composes (rotating to p, then by delta, equals rotating
 * to p + delta), for both pair layouts, inside the angle table and beyond it;
 * and the table agrees with angles computed directly. */
#include <math.h>
#include <stdlib.h>

#include "engine/rope.h"
#include "test.h"

static double max_abs_diff(const float *a, const float *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

TEST(rope_repositioning_composes) {
    enum { D = 64 };
    enum rope_layout layouts[2] = {ROPE_PAIRS_ADJACENT, ROPE_PAIRS_HALVES};
    for (int l = 0; l < 2; l++) {
        rope r;
        CHECK_EQ_INT(rope_init(&r, D, 100000.0f, layouts[l], 8192), 0);
        uint64_t s = 99;
        int64_t cases[][2] = {{0, 5}, {17, 100}, {1000, 3000}, {1, 4000}, {8000, 500}, {9000, 7000}};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int64_t p = cases[c][0], delta = cases[c][1];
            float v[D], once[D], twice[D];
            for (int i = 0; i < D; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                v[i] = (float)((int64_t)(s >> 40) % 2000) / 1000.0f - 1.0f;
                once[i] = twice[i] = v[i];
            }
            rope_rotate(&r, once, p + delta);
            rope_rotate(&r, twice, p);
            rope_rotate(&r, twice, delta);
            double d = max_abs_diff(once, twice, D);
            if (d > 1e-5) fprintf(stderr, "  layout %d, p %lld + %lld: %g\n", l, (long long)p, (long long)delta, d);
            CHECK(d <= 1e-5);
        }
        /* table (inside) and direct angles (beyond) agree at the boundary's neighbours */
        rope small;
        CHECK_EQ_INT(rope_init(&small, D, 100000.0f, layouts[l], 16), 0);
        float a[D], b[D];
        for (int i = 0; i < D; i++) a[i] = b[i] = (float)i / D - 0.5f;
        rope_rotate(&r, a, 4000);
        rope_rotate(&small, b, 4000);
        CHECK(max_abs_diff(a, b, D) <= 1e-6);
        rope_free(&small);
        rope_free(&r);
    }
}
