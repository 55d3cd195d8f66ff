/* The cuBLAS subset the backend uses, on the CPU (part of the emulator): GEMM
 * with cuBLAS's column-major semantics exactly (op(A) is m x k, op(B) k x n,
 * C m x n, leading dimensions in elements, C not read when beta == 0), f32,
 * f16 and bf16 operands, f32 accumulation. Work goes through the handle's
 * stream, so it is captured into graphs like kernels are. */
#include "cuda_emu.h"

#include <cublas_v2.h>

#include <vector>

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

size_t type_bytes(cudaDataType t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    default: return 0;
    }
}

float load(cudaDataType t, const void *base, size_t i) {
    switch (t) {
    case CUDA_R_16F: return __half2float(static_cast<const __half *>(base)[i]);
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
    default: return static_cast<const float *>(base)[i];
    }
}

void store(cudaDataType t, void *base, size_t i, float v) {
    switch (t) {
    case CUDA_R_16F: static_cast<__half *>(base)[i] = __float2half(v); break;
    case CUDA_R_16BF: static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16(v); break;
    default: static_cast<float *>(base)[i] = v; break;
    }
}

struct gemm_args {
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    const void *A, *B;
    void *C;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
    long long sa, sb, sc;
    int batch;
};

/* One product: op(A) copied to rows of k (row i = A's row i of op(A)) and
 * op(B) to columns of k, so the inner loop runs over contiguous memory. */
void gemm_one(const gemm_args &g, const void *A, const void *B, void *C) {
    std::vector<float> a((size_t)g.m * g.k), b((size_t)g.n * g.k);
    for (int i = 0; i < g.m; i++)
        for (int p = 0; p < g.k; p++)
            a[(size_t)i * g.k + p] = load(g.at, A, g.ta == CUBLAS_OP_N ? i + (size_t)p * g.lda : p + (size_t)i * g.lda);
    for (int j = 0; j < g.n; j++)
        for (int p = 0; p < g.k; p++)
            b[(size_t)j * g.k + p] = load(g.bt, B, g.tb == CUBLAS_OP_N ? p + (size_t)j * g.ldb : j + (size_t)p * g.ldb);
    for (int j = 0; j < g.n; j++)
        for (int i = 0; i < g.m; i++) {
            const float *ai = &a[(size_t)i * g.k], *bj = &b[(size_t)j * g.k];
            /* eight partial sums (the compiler vectorises them); cuBLAS does
             * not promise a summation order either */
            float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int p = 0;
            for (; p + 8 <= g.k; p += 8)
                for (int u = 0; u < 8; u++) part[u] += ai[p + u] * bj[p + u];
            float acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
            for (; p < g.k; p++) acc += ai[p] * bj[p];
            size_t at = i + (size_t)j * g.ldc;
            float v = g.alpha * acc;
            if (g.beta != 0.0f) v += g.beta * load(g.ct, C, at); /* beta == 0: C may hold garbage, even NaN */
            store(g.ct, C, at, v);
        }
}

cublasStatus_t gemm(cublasHandle_t h, const gemm_args &g) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    bool ops_ok = (g.ta == CUBLAS_OP_N || g.ta == CUBLAS_OP_T || g.ta == CUBLAS_OP_C) &&
                  (g.tb == CUBLAS_OP_N || g.tb == CUBLAS_OP_T || g.tb == CUBLAS_OP_C);
    int a_rows = g.ta == CUBLAS_OP_N ? g.m : g.k, b_rows = g.tb == CUBLAS_OP_N ? g.k : g.n;
    if (!ops_ok || g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0 || g.lda < (a_rows > 1 ? a_rows : 1) ||
        g.ldb < (b_rows > 1 ? b_rows : 1) || g.ldc < (g.m > 1 ? g.m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!type_bytes(g.at) || !type_bytes(g.bt) || !type_bytes(g.ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!g.m || !g.n || !g.batch) return CUBLAS_STATUS_SUCCESS;
    cuemu::enqueue(h->stream, [g]() {
        for (int b = 0; b < g.batch; b++)
            gemm_one(g, static_cast<const char *>(g.A) + (size_t)b * g.sa * type_bytes(g.at),
                     static_cast<const char *>(g.B) + (size_t)b * g.sb * type_bytes(g.bt),
                     static_cast<char *>(g.C) + (size_t)b * g.sc * type_bytes(g.ct));
    });
    return CUBLAS_STATUS_SUCCESS;
}

/* f32 accumulation is what the emulator does for every compute type it takes. */
bool compute_ok(cublasComputeType_t c) {
    return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC || c == CUBLAS_COMPUTE_32F_FAST_16F ||
           c == CUBLAS_COMPUTE_32F_FAST_16BF || c == CUBLAS_COMPUTE_32F_FAST_TF32;
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    *handle = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN (CPU emulator)";
    }
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                              const float *beta, float *C, int ldc) {
    return gemm(handle, gemm_args{transa, transb, m, n, k, *alpha, *beta, A, B, C, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F,
                                  lda, ldb, ldc, 0, 0, 0, 1});
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!compute_ok(computeType)) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm(handle, gemm_args{transa, transb, m, n, k, *static_cast<const float *>(alpha),
                                  *static_cast<const float *>(beta), A, B, C, Atype, Btype, Ctype, lda, ldb, ldc, 0, 0,
                                  0, 1});
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!compute_ok(computeType)) return CUBLAS_STATUS_NOT_SUPPORTED;
    return gemm(handle, gemm_args{transa, transb, m, n, k, *static_cast<const float *>(alpha),
                                  *static_cast<const float *>(beta), A, B, C, Atype, Btype, Ctype, lda, ldb, ldc,
                                  strideA, strideB, strideC, batchCount});
}

} /* extern "C" */
