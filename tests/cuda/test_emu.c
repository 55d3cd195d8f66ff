/* The emulator's CUDA semantics, checked by kernels that run the same way on
 * a GPU (selftest.cu), and the cuBLAS subset against a plain GEMM. */
#include <cublas_v2.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "engine/quant.h"
#include "tests/cuda/cuda_test.h"
#include "tests/cuda/selftest.h"

TEST(cuda_emu_shared_memory_is_per_block) {
    int shapes[][2] = {{1, 32}, {3, 100}, {2, 1024}, {5, 1}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        int blocks = shapes[c][0], threads = shapes[c][1];
        int *d = dev_alloc((size_t)blocks * threads * sizeof(int));
        int *h = malloc((size_t)blocks * threads * sizeof(int));
        CHECK_CUDA(selftest_shared_exchange(d, blocks, threads));
        host_from(h, d, (size_t)blocks * threads * sizeof(int));
        int bad = 0;
        for (int b = 0; b < blocks; b++)
            for (int t = 0; t < threads; t++) bad += h[b * threads + t] != b * 10000 + (t + 1) % threads;
        CHECK_EQ_INT(bad, 0);
        free(h);
        cudaFree(d);
    }
}

TEST(cuda_emu_warp_shuffles_and_votes) {
    enum { N = 64 };
    int *d = dev_alloc(8 * N * sizeof(int)), h[8 * N];
    CHECK_CUDA(selftest_warp_ops(d));
    host_from(h, d, sizeof h);
    int bad = 0;
    for (int t = 0; t < N; t++) {
        int lane = t % 32, base = t - lane;
        unsigned ballot = 0;
        for (int l = 0; l < 32; l++) ballot |= (unsigned)(l % 3 == 0) << l;
        int want[8] = {
            base + (lane * 7) % 32,
            base + (lane ^ 5),
            lane + 3 < 32 ? t + 3 : t,
            lane >= 2 ? t - 2 : t,
            base + (lane & ~15) + 3,
            (int)ballot,
            t >= 32, /* lane 63 is in the second warp */
            1,
        };
        for (int k = 0; k < 8; k++)
            if (h[k * N + t] != want[k]) {
                if (bad++ < 5) fprintf(stderr, "  op %d thread %d: %d, expected %d\n", k, t, h[k * N + t], want[k]);
            }
    }
    CHECK_EQ_INT(bad, 0);
    cudaFree(d);
}

TEST(cuda_emu_dynamic_shared_memory) {
    enum { BLOCKS = 3, THREADS = 160 };
    test_rng r = {11};
    float in[BLOCKS * THREADS], out[BLOCKS * THREADS];
    rng_fill(&r, in, BLOCKS * THREADS, -1, 1);
    float *din = dev_from(in, sizeof in), *dout = dev_alloc(sizeof out);
    CHECK_CUDA(selftest_dynamic_shared(dout, din, BLOCKS, THREADS));
    host_from(out, dout, sizeof out);
    int bad = 0;
    for (int b = 0; b < BLOCKS; b++)
        for (int t = 0; t < THREADS; t++) bad += out[b * THREADS + t] != in[b * THREADS + THREADS - 1 - t];
    CHECK_EQ_INT(bad, 0);
    cudaFree(din);
    cudaFree(dout);
}

TEST(cuda_emu_atomics) {
    unsigned zero = 0, count;
    int start = -1, max;
    unsigned *dc = dev_from(&zero, sizeof zero);
    int *dm = dev_from(&start, sizeof start);
    CHECK_CUDA(selftest_atomics(dc, dm, 7, 96));
    host_from(&count, dc, sizeof count);
    host_from(&max, dm, sizeof max);
    CHECK_EQ_INT(count, 7 * 96);
    CHECK_EQ_INT(max, 7 * 96 - 1);
    cudaFree(dc);
    cudaFree(dm);
}

TEST(cuda_emu_grid_and_block_indices) {
    enum { N = 12 * 24 };
    uint32_t h[N];
    uint32_t *d = dev_alloc(sizeof h);
    CHECK_CUDA(selftest_indices(d));
    host_from(h, d, sizeof h);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        int block = i / 24, thread = i % 24;
        uint32_t tx = thread % 4, ty = thread / 4 % 2, tz = thread / 8;
        uint32_t bx = block % 2, by = block / 2 % 3, bz = block / 6;
        uint32_t want = tx | ty << 2 | tz << 3 | bx << 5 | by << 6 | bz << 8 | (uint32_t)N << 9;
        bad += h[i] != want;
    }
    CHECK_EQ_INT(bad, 0);
    cudaFree(d);
}

TEST(cuda_emu_half_and_bfloat16) {
    enum { N = 300 };
    test_rng r = {5};
    uint16_t h[N], b[N];
    float out[N];
    for (int i = 0; i < N; i++) {
        h[i] = quant_f32_to_f16(rng_float(&r, -100, 100));
        b[i] = quant_f32_to_bf16(rng_float(&r, -100, 100));
    }
    uint16_t *dh = dev_from(h, sizeof h), *db = dev_from(b, sizeof b);
    float *dout = dev_alloc(sizeof out);
    CHECK_CUDA(selftest_half(dout, dh, db, N));
    host_from(out, dout, sizeof out);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        /* doubling a half is exact unless it overflows, which these values do not */
        float want = quant_f16_to_f32(h[i]) * 2.0f + quant_bf16_to_f32(b[i]);
        bad += out[i] != want;
    }
    CHECK_EQ_INT(bad, 0);
    cudaFree(dh);
    cudaFree(db);
    cudaFree(dout);
}

TEST(cuda_emu_bad_launch_is_reported) {
    CHECK_EQ_INT(selftest_bad_launch(), cudaErrorInvalidValue); /* a 2048-thread block: what an H200 answers */
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess); /* reading the error clears it */
    CHECK_EQ_INT(cuda_rmsnorm_f32(NULL, NULL, NULL, -1, 4, 1e-5f, 0), cudaErrorInvalidValue);
}

static int on_emulator(void) {
    struct cudaDeviceProp prop;
    return cudaGetDeviceProperties(&prop, 0) == cudaSuccess && !strcmp(prop.name, "potserve CPU emulator");
}

TEST(cuda_probe_finds_the_device) {
    char msg[256] = "";
    CHECK_EQ_INT(cuda_probe(msg, sizeof msg), 0);
    CHECK(msg[0] != 0);
    if (on_emulator()) CHECK(strstr(msg, "potserve CPU emulator") != NULL);
}

/* A GPU would hang; the emulator must stop with a message instead. */
TEST(cuda_emu_divergent_barriers_abort) {
    if (!on_emulator()) {
        test_skip("the emulator's check: a GPU would hang");
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        selftest_divergent_barriers();
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
}

/* Work on a capturing stream is recorded, not run; each graph launch replays it. */
TEST(cuda_emu_graph_capture_replays) {
    enum { N = 1000 };
    float y[N], x[N], out[N];
    for (int i = 0; i < N; i++) y[i] = (float)i, x[i] = 0.5f;
    float *dy = dev_from(y, sizeof y), *dx = dev_from(x, sizeof x), *dcopy = dev_alloc(sizeof y);
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t exec;
    CHECK_CUDA(cudaStreamCreate(&s));
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK_CUDA(cuda_add_f32(dy, dx, N, s));
    CHECK_CUDA(cudaMemcpyAsync(dcopy, dy, sizeof y, cudaMemcpyDeviceToDevice, s));
    CHECK_CUDA(cudaStreamEndCapture(s, &g));
    host_from(out, dy, sizeof out);
    CHECK(out[10] == 10.0f); /* captured, not run */
    CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaGraphLaunch(exec, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    host_from(out, dcopy, sizeof out);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += out[i] != (float)i + 1.0f;
    CHECK_EQ_INT(bad, 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    cudaFree(dy);
    cudaFree(dx);
    cudaFree(dcopy);
}

/* Column-major C = alpha op(A) op(B) + beta C against loops over the same
 * definition; inputs are rounded to the operand type first. */
static void gemm_ref(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int p = 0; p < k; p++) {
                float a = ta ? A[p + i * lda] : A[i + p * lda], b = tb ? B[j + p * ldb] : B[p + j * ldb];
                acc += (double)a * b;
            }
            C[i + j * ldc] = (float)(alpha * acc + (beta != 0 ? beta * C[i + j * ldc] : 0));
        }
}

TEST(cuda_emu_cublas_gemm) {
    test_rng r = {99};
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 64}, {64, 9, 31}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int half = 0; half < 2; half++) {
                    int m = shapes[c][0], n = shapes[c][1], k = shapes[c][2];
                    int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
                    size_t na = (size_t)lda * (ta ? m : k), nb = (size_t)ldb * (tb ? k : n), nc = (size_t)ldc * n;
                    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4), *out = malloc(nc * 4);
                    uint16_t *A16 = malloc(na * 2), *B16 = malloc(nb * 2);
                    rng_fill(&r, A, na, -1, 1);
                    rng_fill(&r, B, nb, -1, 1);
                    rng_fill(&r, C, nc, -1, 1);
                    for (size_t i = 0; i < na; i++) A[i] = quant_f16_to_f32(A16[i] = quant_f32_to_f16(A[i]));
                    for (size_t i = 0; i < nb; i++) B[i] = quant_f16_to_f32(B16[i] = quant_f32_to_f16(B[i]));
                    float alpha = 0.75f, beta = c % 2 ? 0.5f : 0.0f;
                    void *dA = half ? dev_from(A16, na * 2) : dev_from(A, na * 4);
                    void *dB = half ? dev_from(B16, nb * 2) : dev_from(B, nb * 4);
                    float *dC = dev_from(C, nc * 4);
                    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
                    cublasStatus_t st =
                        half ? cublasGemmEx(h, oa, ob, m, n, k, &alpha, dA, CUDA_R_16F, lda, dB, CUDA_R_16F, ldb, &beta,
                                            dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
                             : cublasSgemm(h, oa, ob, m, n, k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc);
                    CHECK(st == CUBLAS_STATUS_SUCCESS);
                    host_from(out, dC, nc * 4);
                    gemm_ref(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
                    double worst = 0;
                    for (int j = 0; j < n; j++) {
                        double e = worst_error(out + (size_t)j * ldc, C + (size_t)j * ldc, (size_t)m, 1e-5, 1e-4);
                        if (e > worst) worst = e;
                    }
                    if (worst > 1) fprintf(stderr, "  gemm %dx%dx%d ta %d tb %d half %d: error %g\n", m, n, k, ta, tb, half, worst);
                    CHECK(worst <= 1);
                    cudaFree(dA);
                    cudaFree(dB);
                    cudaFree(dC);
                    free(A), free(B), free(C), free(out), free(A16), free(B16);
                }
    cublasDestroy(h);
}

/* Batched: C_b = A_b^T B_b, the shape of a per-head attention product. */
TEST(cuda_emu_cublas_strided_batched) {
    enum { M = 5, N = 4, K = 8, BATCH = 3 };
    test_rng r = {7};
    float A[BATCH * K * M], B[BATCH * K * N], C[BATCH * M * N], want[BATCH * M * N];
    rng_fill(&r, A, BATCH * K * M, -1, 1);
    rng_fill(&r, B, BATCH * K * N, -1, 1);
    float *dA = dev_from(A, sizeof A), *dB = dev_from(B, sizeof B), *dC = dev_alloc(sizeof C);
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    float alpha = 1, beta = 0; /* dC holds garbage (NaN on the emulator): beta = 0 must not read it */
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, M, N, K, &alpha, dA, CUDA_R_32F, K, K * M, dB,
                                     CUDA_R_32F, K, K * N, &beta, dC, CUDA_R_32F, M, M * N, BATCH, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    host_from(C, dC, sizeof C);
    for (int b = 0; b < BATCH; b++)
        gemm_ref(1, 0, M, N, K, 1, A + b * K * M, K, B + b * K * N, K, 0, want + b * M * N, M);
    CHECK(worst_error(C, want, BATCH * M * N, 1e-5, 1e-4) <= 1);
    cublasDestroy(h);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
}
