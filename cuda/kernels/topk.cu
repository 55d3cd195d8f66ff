/* Per-(layer, KV head) top-k for the pot policies, choosing exactly the slots
 * cache/policy.c's take_best chooses: higher value first, NaN as -inf, equal
 * values to the lower (older) slot. One block per row. Instead of sorting,
 * a radix select finds the threshold value in four 8-bit passes over an
 * order-preserving integer key; every slot above it is taken, and slots equal
 * to it are taken in slot order until the count is reached, which is the
 * tie rule. Marks live in a byte mask per row so policies can chain steps
 * (pinned, then NuC, then attention) before cuda_kept_to_slots lists them. */
#include "cuda/kernels.h"
#include "cuda/kernels/common.cuh"

#include <math.h>

enum { TOPK_THREADS = 256, TOPK_BINS = 256 };

/* Unsigned key in the order of the floats: NaN as -inf, -0 as +0 (equal in
 * policy.c's comparison, so they must tie here too). */
__device__ __forceinline__ unsigned order_key(float v) {
    if (v != v) v = -INFINITY;
    if (v == 0.0f) v = 0.0f;
    unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void kept_init_kernel(uint8_t *kept, int64_t stride, int32_t n, int32_t n_pinned) {
    uint8_t *k = kept + (size_t)blockIdx.x * stride;
    for (int32_t s = threadIdx.x; s < n; s += blockDim.x) k[s] = s < n_pinned;
}

__global__ void topk_fill_kernel(const float *values, int64_t values_stride, uint8_t *kept, int64_t kept_stride,
                                 int32_t from, int32_t n, int32_t target) {
    __shared__ unsigned hist[TOPK_BINS];
    __shared__ unsigned prefix_sh, mask_sh;
    __shared__ int want_sh;
    const float *v = values + (size_t)blockIdx.x * values_stride;
    uint8_t *k = kept + (size_t)blockIdx.x * kept_stride;

    int marked = 0, candidates = 0;
    for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
        marked += k[s] != 0;
        candidates += s >= from && !k[s];
    }
    int want = target - block_sum_int(marked);
    candidates = block_sum_int(candidates);
    if (want <= 0) return; /* uniform across the block: every thread returns */
    if (want >= candidates) {
        for (int32_t s = from + threadIdx.x; s < n; s += blockDim.x) k[s] = 1;
        return;
    }
    /* Radix select: fix the threshold key 8 bits at a time, from the top. want
     * counts how many of the keys matching the prefix so far are still to take. */
    if (threadIdx.x == 0) {
        prefix_sh = 0;
        mask_sh = 0;
        want_sh = want;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < TOPK_BINS; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        unsigned prefix = prefix_sh, mask = mask_sh;
        for (int32_t s = from + threadIdx.x; s < n; s += blockDim.x) {
            if (k[s]) continue;
            unsigned key = order_key(v[s]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int above = 0;
            for (int b = TOPK_BINS - 1; b >= 0; b--) {
                if (above + (int)hist[b] >= want_sh) {
                    prefix_sh |= (unsigned)b << shift;
                    mask_sh |= 0xffu << shift;
                    want_sh -= above;
                    break;
                }
                above += (int)hist[b];
            }
        }
        __syncthreads();
    }
    /* Take every key above the threshold, and the first want_sh equal to it in
     * slot order (a block-wide scan per chunk of slots). */
    unsigned threshold = prefix_sh;
    int ties_left = want_sh, ties_before = 0;
    for (int32_t base = from; base < n; base += blockDim.x) {
        int32_t s = base + threadIdx.x;
        bool cand = s < n && !k[s];
        unsigned key = cand ? order_key(v[s]) : 0u;
        int tie = cand && key == threshold, ties_in_chunk;
        int rank = block_scan_flags(tie, &ties_in_chunk);
        if (cand && (key > threshold || (tie && ties_before + rank < ties_left))) k[s] = 1;
        ties_before += ties_in_chunk;
    }
}

__global__ void kept_to_slots_kernel(const uint8_t *kept, int64_t kept_stride, int32_t n, int32_t n_keep, int32_t *keep) {
    const uint8_t *k = kept + (size_t)blockIdx.x * kept_stride;
    int32_t *out = keep + (size_t)blockIdx.x * n_keep;
    int done = 0;
    for (int32_t base = 0; base < n && done < n_keep; base += blockDim.x) {
        int32_t s = base + threadIdx.x;
        int flag = s < n && k[s], in_chunk;
        int at = done + block_scan_flags(flag, &in_chunk);
        if (flag && at < n_keep) out[at] = s;
        done += in_chunk;
    }
}

extern "C" cudaError_t cuda_kept_init(uint8_t *kept, int64_t kept_stride, int32_t rows, int32_t n, int32_t n_pinned,
                                      cudaStream_t stream) {
    if (rows < 0 || n < 0 || (rows > 1 && kept_stride < n)) return cudaErrorInvalidValue;
    if (!rows || !n) return cudaSuccess;
    CU_LAUNCH(kept_init_kernel, dim3((unsigned)rows), dim3(TOPK_THREADS), 0, stream, kept, kept_stride, n, n_pinned);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_topk_fill(const float *values, int64_t values_stride, uint8_t *kept, int64_t kept_stride,
                                      int32_t rows, int32_t from, int32_t n, int32_t target, cudaStream_t stream) {
    if (rows < 0 || n < 0 || from < 0 || (rows > 1 && (kept_stride < n || values_stride < n)))
        return cudaErrorInvalidValue;
    if (!rows || from >= n) return cudaSuccess;
    CU_LAUNCH(topk_fill_kernel, dim3((unsigned)rows), dim3(TOPK_THREADS), 0, stream, values, values_stride, kept,
              kept_stride, from, n, target);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_kept_to_slots(const uint8_t *kept, int64_t kept_stride, int32_t rows, int32_t n,
                                          int32_t n_keep, int32_t *keep, cudaStream_t stream) {
    if (rows < 0 || n < 0 || n_keep < 0 || (rows > 1 && kept_stride < n)) return cudaErrorInvalidValue;
    if (!rows || !n || !n_keep) return cudaSuccess;
    CU_LAUNCH(kept_to_slots_kernel, dim3((unsigned)rows), dim3(TOPK_THREADS), 0, stream, kept, kept_stride, n, n_keep,
              keep);
    return cudaGetLastError();
}
