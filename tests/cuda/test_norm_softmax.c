/* rmsnorm, the elementwise kernels and softmax/LSE against their CPU
 * references, on random rows of awkward sizes. */
#include "cuda/kernels.h"
#include "tests/cuda/cuda_test.h"

TEST(cuda_rmsnorm_matches_reference) {
    test_rng r = {1};
    int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {2, 576}, {17, 1000}, {1, 4099}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int64_t rows = shapes[c][0], n = shapes[c][1], total = rows * n;
        float *x = malloc(total * 4), *d = malloc(total * 4), *w = malloc(n * 4), *want = malloc(total * 4),
              *got = malloc(total * 4), *sum = malloc(total * 4);
        rng_fill(&r, x, total, -2, 2);
        rng_fill(&r, d, total, -1, 1);
        rng_fill(&r, w, n, 0.5f, 1.5f);
        float *dx = dev_from(x, total * 4), *dd = dev_from(d, total * 4), *dw = dev_from(w, n * 4),
              *dout = dev_alloc(total * 4);

        CHECK_CUDA(cuda_rmsnorm_f32(dout, dx, dw, rows, n, 1e-5f, 0));
        host_from(got, dout, total * 4);
        cuda_rmsnorm_ref(want, x, w, rows, n, 1e-5f);
        CHECK(worst_error(got, want, total, 1e-6, 1e-5) <= 1);

        /* in place */
        CHECK_CUDA(cuda_rmsnorm_f32(dout, dout, dw, rows, n, 1e-5f, 0));
        host_from(got, dout, total * 4);
        cuda_rmsnorm_ref(want, want, w, rows, n, 1e-5f);
        CHECK(worst_error(got, want, total, 1e-6, 1e-5) <= 1);

        /* fused residual: x += d exactly, then the norm of the sum */
        CHECK_CUDA(cuda_add_rmsnorm_f32(dout, dx, dd, dw, rows, n, 1e-6f, 0));
        for (int64_t i = 0; i < total; i++) sum[i] = x[i] + d[i];
        host_from(got, dx, total * 4);
        CHECK(!memcmp(got, sum, total * 4));
        host_from(got, dout, total * 4);
        cuda_rmsnorm_ref(want, sum, w, rows, n, 1e-6f);
        CHECK(worst_error(got, want, total, 1e-6, 1e-5) <= 1);

        cudaFree(dx), cudaFree(dd), cudaFree(dw), cudaFree(dout);
        free(x), free(d), free(w), free(want), free(got), free(sum);
    }
}

TEST(cuda_elementwise_match_reference) {
    test_rng r = {2};
    int64_t sizes[] = {1, 31, 1000, 100003};
    for (size_t c = 0; c < sizeof sizes / sizeof sizes[0]; c++) {
        int64_t n = sizes[c];
        float *g = malloc(n * 4), *u = malloc(n * 4), *want = malloc(n * 4), *got = malloc(n * 4);
        rng_fill(&r, g, n, -12, 12);
        rng_fill(&r, u, n, -3, 3);
        float *dg = dev_from(g, n * 4), *du = dev_from(u, n * 4);
        CHECK_CUDA(cuda_swiglu_f32(dg, du, n, 0));
        host_from(got, dg, n * 4);
        memcpy(want, g, n * 4);
        cuda_swiglu_ref(want, u, n);
        CHECK(worst_error(got, want, n, 1e-7, 1e-6) <= 1); /* expf may differ by an ulp on a GPU */

        CHECK_CUDA(cuda_add_f32(dg, du, n, 0));
        host_from(got, dg, n * 4);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) bad += got[i] != want[i] + u[i] && fabsf(got[i] - (want[i] + u[i])) > 1e-5f;
        CHECK_EQ_INT(bad, 0);
        cudaFree(dg), cudaFree(du);
        free(g), free(u), free(want), free(got);
    }
    /* bias over rows of an odd width */
    enum { ROWS = 7, N = 45 };
    float y[ROWS * N], b[N], got[ROWS * N];
    rng_fill(&r, y, ROWS * N, -1, 1);
    rng_fill(&r, b, N, -1, 1);
    float *dy = dev_from(y, sizeof y), *db = dev_from(b, sizeof b);
    CHECK_CUDA(cuda_add_bias_f32(dy, db, ROWS, N, 0));
    host_from(got, dy, sizeof got);
    int bad = 0;
    for (int i = 0; i < ROWS * N; i++) bad += got[i] != y[i] + b[i % N];
    CHECK_EQ_INT(bad, 0);
    cudaFree(dy), cudaFree(db);
}

TEST(cuda_softmax_lse_matches_reference) {
    test_rng r = {3};
    struct {
        int64_t rows, n;
        int32_t causal;
        float scale;
    } cases[] = {{1, 1, -1, 1}, {3, 5, -1, 1}, {4, 33, 29, 0.125f}, {17, 1000, 983, 0.125f}, {2, 4097, -1, 1},
                 {5, 64, 0, 2}, {1, 50000, -1, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t rows = cases[c].rows, n = cases[c].n, stride = n + 3, total = rows * stride;
        float *x = malloc(total * 4), *p = malloc(total * 4), *p_ref = malloc(total * 4), lse[17], lse_ref[17],
              lp[17], lp_ref[17];
        int32_t labels[17];
        rng_fill(&r, x, total, -8, 8);
        for (int64_t i = 0; i < rows; i++) labels[i] = i % 3 == 2 ? -1 : (int32_t)(rng_u32(&r) % n);
        float *dx = dev_from(x, total * 4), *dp = dev_alloc(total * 4), *dlse = dev_alloc(rows * 4),
              *dlp = dev_alloc(rows * 4);
        int32_t *dlab = dev_from(labels, rows * 4);
        cuda_softmax_rows a = {dx, stride, rows, n, cases[c].scale, cases[c].causal, dp, stride, dlse, dlab, dlp};
        CHECK_CUDA(cuda_softmax_lse_f32(&a, 0));
        host_from(p, dp, total * 4);
        host_from(lse, dlse, rows * 4);
        host_from(lp, dlp, rows * 4);
        cuda_softmax_rows ra = {x, stride, rows, n, cases[c].scale, cases[c].causal, p_ref, stride, lse_ref, labels, lp_ref};
        cuda_softmax_lse_ref(&ra);
        for (int64_t i = 0; i < rows; i++) {
            CHECK(worst_error(p + i * stride, p_ref + i * stride, n, 1e-7, 1e-5) <= 1);
            CHECK_NEAR(lse[i], lse_ref[i], 1e-5 * (1 + fabs(lse_ref[i])));
            if (labels[i] >= 0) CHECK_NEAR(lp[i], lp_ref[i], 1e-5 * (1 + fabs(lp_ref[i])));
        }
        /* masked columns are exactly zero, and each row sums to one */
        for (int64_t i = 0; cases[c].causal >= 0 && i < rows; i++) {
            int64_t vis = cases[c].causal + i + 1;
            for (int64_t j = vis; j < n; j++) CHECK(p[i * stride + j] == 0.0f);
        }
        for (int64_t i = 0; i < rows; i++) {
            double s = 0;
            for (int64_t j = 0; j < n; j++) s += p[i * stride + j];
            CHECK_NEAR(s, 1.0, 1e-4);
        }
        cudaFree(dx), cudaFree(dp), cudaFree(dlse), cudaFree(dlp), cudaFree(dlab);
        free(x), free(p), free(p_ref);
    }
}
