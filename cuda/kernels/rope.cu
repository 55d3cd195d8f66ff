/* Rotary position embedding on the GPU, the arithmetic of engine/rope.c:
 * the same f32 angle table (built by rope_init on the host and uploaded),
 * angles beyond it in double, and the rotation without fused multiply-adds,
 * so a rotated vector is bit-identical to rope_rotate's inside the table.
 * One warp per head vector. Also the pot's key/value loader, which rotates
 * pre-RoPE keys to their slot's position as it converts them to f32. */
#include "cuda/kernels.h"
#include "cuda/kernels/rope.cuh"

#include <math.h>

enum { ROPE_ROWS_PER_BLOCK = 4 }; /* warps per block, one head vector each */

__global__ void rope_kernel(float *x, int64_t n_rows, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                            int32_t pos0, cuda_rope r) {
    int64_t row = (int64_t)blockIdx.x * ROPE_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= n_rows) return; /* whole warps only: no barriers follow */
    int64_t token = row / n_heads, p = pos ? pos[token] : pos0 + token;
    float *v = x + (size_t)row * head_dim;
    for (int i = threadIdx.x % 32; i < r.n_rot / 2; i += 32) rope_pair(r, v, v, p, i);
}

/* out[g][k] = row slots[g][k] (or k) of head g of a pot layer, as f32,
 * rotated to that slot's position when rotate is set. */
template <class T>
__global__ void pot_load_kernel(float *out, const T *pot, int32_t capacity, int32_t n_head_kv, int32_t head_dim,
                                const int32_t *slots, int32_t n_keys, cuda_rope r, int rotate) {
    int64_t row = (int64_t)blockIdx.x * ROPE_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= (int64_t)n_head_kv * n_keys) return;
    int lane = threadIdx.x % 32;
    int32_t g = (int32_t)(row / n_keys), k = (int32_t)(row % n_keys);
    int32_t slot = slots ? slots[row] : k;
    const T *src = pot + ((size_t)g * capacity + slot) * head_dim;
    float *dst = out + (size_t)row * head_dim;
    int rotated = rotate ? r.n_rot : 0;
    for (int i = lane; i < rotated / 2; i += 32) rope_pair(r, src, dst, slot, i);
    for (int e = rotated + lane; e < head_dim; e += 32) dst[e] = to_f32(src[e]);
}

static int rope_valid(const cuda_rope *r, int32_t head_dim) {
    return r->n_rot >= 0 && r->n_rot % 2 == 0 && r->n_rot <= head_dim && (r->layout == 0 || r->layout == 1) &&
           r->n_table >= 0 && (r->n_table == 0 || r->cs) && (r->n_rot == 0 || r->inv_freq);
}

static dim3 rope_grid(int64_t rows) { return dim3((unsigned)((rows + ROPE_ROWS_PER_BLOCK - 1) / ROPE_ROWS_PER_BLOCK)); }

extern "C" cudaError_t cuda_rope_f32(float *x, int64_t n_tokens, int32_t n_heads, int32_t head_dim,
                                     const int32_t *pos, int32_t pos0, const cuda_rope *rope, cudaStream_t stream) {
    if (!rope || n_tokens < 0 || n_heads <= 0 || head_dim <= 0 || !rope_valid(rope, head_dim) ||
        n_tokens > ((int64_t)1 << 36) / n_heads)
        return cudaErrorInvalidValue;
    if (!n_tokens || !rope->n_rot) return cudaSuccess;
    int64_t rows = n_tokens * n_heads;
    CU_LAUNCH(rope_kernel, rope_grid(rows), dim3(32 * ROPE_ROWS_PER_BLOCK), 0, stream, x, rows, n_heads, head_dim,
              pos, pos0, *rope);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_pot_load_f32(float *out, const void *pot_layer, int32_t dtype, int32_t capacity,
                                         int32_t n_head_kv, int32_t head_dim, const int32_t *slots, int32_t n_keys,
                                         const cuda_rope *rope, cudaStream_t stream) {
    if (capacity < 0 || n_head_kv <= 0 || head_dim <= 0 || n_keys < 0 || (!slots && n_keys > capacity) ||
        (dtype != 0 && dtype != 1) || (rope && !rope_valid(rope, head_dim)))
        return cudaErrorInvalidValue;
    if (!n_keys) return cudaSuccess;
    cuda_rope r = rope ? *rope : cuda_rope{0, 0, 0, nullptr, nullptr};
    int64_t rows = (int64_t)n_head_kv * n_keys;
    if (dtype == 0)
        CU_LAUNCH(pot_load_kernel<__half>, rope_grid(rows), dim3(32 * ROPE_ROWS_PER_BLOCK), 0, stream, out,
                  static_cast<const __half *>(pot_layer), capacity, n_head_kv, head_dim, slots, n_keys, r, rope != nullptr);
    else
        CU_LAUNCH(pot_load_kernel<float>, rope_grid(rows), dim3(32 * ROPE_ROWS_PER_BLOCK), 0, stream, out,
                  static_cast<const float *>(pot_layer), capacity, n_head_kv, head_dim, slots, n_keys, r, rope != nullptr);
    return cudaGetLastError();
}
