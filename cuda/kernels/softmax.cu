/* Softmax and log-sum-exp of f32 rows, with an optional causal limit: the
 * attention probabilities over [pot | span] and the label log-probabilities
 * over the vocabulary both come from here. One block per row: a block max,
 * then a block sum of exp(x - max). */
#include "cuda/kernels.h"
#include "cuda/kernels/common.cuh"

#include <math.h>

enum { SOFTMAX_THREADS = 256 };

__global__ void softmax_lse_kernel(cuda_softmax_rows a) {
    int64_t r = blockIdx.x;
    const float *x = a.x + (size_t)r * a.x_stride;
    int64_t n_vis = a.causal_offset < 0 ? a.n : a.causal_offset + r + 1;
    if (n_vis > a.n) n_vis = a.n;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < n_vis; j += blockDim.x) m = fmaxf(m, a.scale * x[j]);
    m = block_max(m);
    if (m == -INFINITY) m = 0.0f; /* nothing seen, or all -inf: probabilities 0, lse -inf */
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < n_vis; j += blockDim.x) s += expf(a.scale * x[j] - m);
    s = block_sum(s);
    if (a.probs) {
        float *p = a.probs + (size_t)r * a.probs_stride, inv = 1.0f / s;
        for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) p[j] = j < n_vis ? expf(a.scale * x[j] - m) * inv : 0.0f;
    }
    if (threadIdx.x == 0) {
        float log_s = logf(s);
        if (a.lse) a.lse[r] = m + log_s;
        if (a.labels && a.label_logprob && a.labels[r] >= 0 && a.labels[r] < a.n)
            a.label_logprob[r] = (a.scale * x[a.labels[r]] - m) - log_s;
    }
}

extern "C" cudaError_t cuda_softmax_lse_f32(const cuda_softmax_rows *a, cudaStream_t stream) {
    if (!a || a->rows < 0 || a->n < 0 || a->rows > 0x7fffffff || a->causal_offset < -1 ||
        (a->rows > 1 && a->x_stride < a->n) || (a->probs && a->rows > 1 && a->probs_stride < a->n))
        return cudaErrorInvalidValue;
    if (!a->rows) return cudaSuccess;
    CU_LAUNCH(softmax_lse_kernel, dim3((unsigned)a->rows), dim3(SOFTMAX_THREADS), 0, stream, *a);
    return cudaGetLastError();
}

/* The CPU backend's attention softmax (max, exp sum in double, times 1/sum)
 * and its label log-probability ((x - max) - log sum), per row. */
extern "C" void cuda_softmax_lse_ref(const cuda_softmax_rows *a) {
    for (int64_t r = 0; r < a->rows; r++) {
        const float *x = a->x + r * a->x_stride;
        int64_t n_vis = a->causal_offset < 0 ? a->n : a->causal_offset + r + 1;
        if (n_vis > a->n) n_vis = a->n;
        float m = -INFINITY;
        for (int64_t j = 0; j < n_vis; j++) m = fmaxf(m, a->scale * x[j]);
        if (m == -INFINITY) m = 0.0f;
        double sum = 0;
        for (int64_t j = 0; j < n_vis; j++) sum += exp((double)(a->scale * x[j] - m));
        if (a->probs) {
            float inv = (float)(1.0 / sum);
            for (int64_t j = 0; j < a->n; j++)
                a->probs[r * a->probs_stride + j] = j < n_vis ? (float)exp((double)(a->scale * x[j] - m)) * inv : 0.0f;
        }
        if (a->lse) a->lse[r] = (float)((double)m + log(sum));
        if (a->labels && a->label_logprob && a->labels[r] >= 0 && a->labels[r] < a->n)
            a->label_logprob[r] = (float)((double)(a->scale * x[a->labels[r]] - m) - log(sum));
    }
}
