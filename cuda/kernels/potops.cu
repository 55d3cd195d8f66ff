/* Pot compaction on the device: the kept slots of every (layer, KV head)
 * gathered in order into a second buffer. In place would race (slot i is
 * written by keep entry i and may be read by an earlier one), so the caller
 * gives a destination distinct from the source. The reference is
 * cache/pot.c's pot_compact, which moves the same bytes on the host. */
#include "cuda/kernels.h"
#include "cuda/kernels/common.cuh"

enum { GATHER_THREADS = 256, GATHER_MAX_BLOCKS = 4096 };

/* One thread per unit (U: 16, 4 or 2 bytes) of a kept slot, grid-stride. */
template <class U>
__global__ void gather_kernel(U *dst, const U *src, int64_t rows, int32_t capacity, int64_t units, const int32_t *keep,
                              int32_t n_keep) {
    int64_t per_row = (int64_t)n_keep * units, total = rows * per_row;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / per_row, j = i % per_row, k = j / units, u = j % units;
        int64_t from = (r * capacity + keep[r * n_keep + k]) * units + u;
        dst[(r * capacity + k) * units + u] = src[from];
    }
}

template <class U>
static cudaError_t gather(void *dst, const void *src, int64_t rows, int32_t capacity, size_t slot_bytes,
                          const int32_t *keep, int32_t n_keep, cudaStream_t stream) {
    int64_t units = (int64_t)(slot_bytes / sizeof(U)), total = rows * n_keep * units;
    int64_t blocks = (total + GATHER_THREADS - 1) / GATHER_THREADS;
    if (blocks > GATHER_MAX_BLOCKS) blocks = GATHER_MAX_BLOCKS;
    CU_LAUNCH(gather_kernel<U>, dim3((unsigned)blocks), dim3(GATHER_THREADS), 0, stream, static_cast<U *>(dst),
              static_cast<const U *>(src), rows, capacity, units, keep, n_keep);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_pot_gather(void *dst, const void *src, int64_t rows, int32_t capacity, size_t slot_bytes,
                                       const int32_t *keep, int32_t n_keep, cudaStream_t stream) {
    if (!dst || !src || dst == src || rows < 0 || capacity <= 0 || n_keep < 0 || n_keep > capacity || !slot_bytes ||
        slot_bytes % 2 || (n_keep && rows && !keep))
        return cudaErrorInvalidValue;
    if (!rows || !n_keep) return cudaSuccess;
    /* the widest unit the slot size and the arrays' alignment allow */
    uintptr_t align = (uintptr_t)dst | (uintptr_t)src;
    if (slot_bytes % 16 == 0 && align % 16 == 0)
        return gather<uint4>(dst, src, rows, capacity, slot_bytes, keep, n_keep, stream);
    if (slot_bytes % 4 == 0 && align % 4 == 0)
        return gather<uint32_t>(dst, src, rows, capacity, slot_bytes, keep, n_keep, stream);
    return gather<uint16_t>(dst, src, rows, capacity, slot_bytes, keep, n_keep, stream);
}

/* ---- the batched decode's K/V store ------------------------------------------------- */

/* blockIdx.y = span; threads over its n_head_kv * head_dim values. */
template <class T>
__global__ void store_batch_kernel(const cuda_attn_desc *desc, int32_t layer, int32_t n_head_kv, int32_t head_dim,
                                   const float *k, const float *v) {
    const cuda_attn_desc d = desc[blockIdx.y];
    int32_t dkv = n_head_kv * head_dim;
    size_t layer_off = (size_t)layer * n_head_kv * d.capacity * head_dim;
    for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < dkv; i += gridDim.x * blockDim.x) {
        int32_t g = i / head_dim, e = i % head_dim;
        size_t at = layer_off + ((size_t)g * d.capacity + d.n0) * head_dim + e;
        static_cast<T *>(const_cast<void *>(d.k))[at] = from_f32<T>(k[(size_t)d.t * dkv + i]);
        static_cast<T *>(const_cast<void *>(d.v))[at] = from_f32<T>(v[(size_t)d.t * dkv + i]);
    }
}

extern "C" cudaError_t cuda_pot_store_batch(const cuda_attn_desc *desc, int32_t n_spans, int32_t layer, int32_t dtype,
                                            int32_t n_head_kv, int32_t head_dim, const float *k, const float *v,
                                            cudaStream_t stream) {
    if (!desc || n_spans < 0 || n_spans > 65535 || layer < 0 || (dtype != 0 && dtype != 1) || n_head_kv <= 0 ||
        head_dim <= 0)
        return cudaErrorInvalidValue;
    if (!n_spans) return cudaSuccess;
    int32_t dkv = n_head_kv * head_dim;
    dim3 grid((unsigned)((dkv + GATHER_THREADS - 1) / GATHER_THREADS), (unsigned)n_spans);
    if (dtype == 0)
        CU_LAUNCH(store_batch_kernel<__half>, grid, dim3(GATHER_THREADS), 0, stream, desc, layer, n_head_kv, head_dim,
                  k, v);
    else
        CU_LAUNCH(store_batch_kernel<float>, grid, dim3(GATHER_THREADS), 0, stream, desc, layer, n_head_kv, head_dim,
                  k, v);
    return cudaGetLastError();
}
