/* Attention of one span over [pot keys | its own keys], for one layer.
 *
 * attn_kernel: flash style. A block takes one KV head g and NW (query, head)
 * items of that group, t-major (the heads of a group share the block's key
 * tiles); one warp per item. Keys come in tiles of BK rows: read from the pot
 * layer before RoPE, rotated to their slot's position into shared memory (K
 * padded by one float against bank conflicts), V beside them. Per tile, lane
 * j scores key j of the tile against the warp's query (kept in shared
 * memory), the warp takes the tile's max, rescales its running sum and
 * output, and each lane accumulates the output dimensions d = lane + 32 i.
 * With n_split > 1 (blockIdx.z) a block covers one slice of the key range and
 * writes (max, sum, unnormalised output) for a second pass (combine_kernel)
 * to merge: split-K, for a single decode query over a long pot.
 *
 * scores_kernel: the policies' attention scores, exact probabilities
 * exp(scale q.k - lse) (lse from the first pass), one thread per key, summed
 * (or maxed) over the score rows per query head and combined over the group's heads in
 * head order, the order engine/cpu/cpu_backend.c's store_scores uses. */
#include "cuda/kernels.h"
#include "cuda/kernels/rope.cuh"

#include <math.h>
#include <stdlib.h>

enum {
    ATTN_NW = 4,                 /* warps per block = (query, head) items per block: decode */
    ATTN_MAX_NW = 16,            /* ... and at most, for spans of many queries (attn_span_warps) */
    ATTN_SHARED = 40 * 1024,     /* bytes of K and V tiles at most */
    ATTN_MAX_DIM = 256,          /* head_dim limit (8 output values per lane) */
    ATTN_SPLIT_KEYS = 256,       /* keys per split for split-K decoding */
    ATTN_MAX_SPLITS = 64,
};

__host__ __device__ __forceinline__ int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }

/* Key tile rows: 32 (one key per lane) unless head_dim is large. */
static int attn_tile_keys(int32_t head_dim) {
    int bk = ATTN_SHARED / (int)(sizeof(float) * (2 * head_dim + 1));
    return bk >= 32 ? 32 : bk >= 16 ? 16 : 8;
}

/* Shared memory of a block of nw warps: the K and V tiles, each warp's query
 * and probabilities. */
static size_t attn_shared_bytes(int32_t head_dim, int nw) {
    int bk = attn_tile_keys(head_dim);
    return sizeof(float) * ((size_t)bk * (head_dim + 1) + (size_t)bk * head_dim + (size_t)nw * head_dim +
                            (size_t)nw * 32);
}

/* Warps per block of a span's attention: a block's warps share each K/V tile
 * it loads (and rotates), so a long span takes as many as fit in 48 KiB of
 * shared memory (up to 16: a tile serves 16 (query, head) items instead of
 * 4); a single query keeps ATTN_NW (its group has few heads). */
static int attn_span_warps(int32_t n_q, int32_t head_dim) {
    if (n_q <= 1) return ATTN_NW;
    for (int nw = ATTN_MAX_NW; nw > ATTN_NW; nw /= 2)
        if (attn_shared_bytes(head_dim, nw) <= 48 * 1024) return nw;
    return ATTN_NW;
}

/* Pot slot of attended key k of KV head g. */
__device__ __forceinline__ int32_t attn_key_slot(const cuda_attn &a, int32_t g, int32_t k) {
    if (k >= a.n_pre) return a.n0 + (k - a.n_pre);
    return a.slots ? a.slots[(size_t)g * a.n_pre + k] : k;
}

/* RoPE position of a slot of KV head g: pot_rope_pos's value. */
__host__ __device__ __forceinline__ int64_t attn_slot_pos(const cuda_attn &a, int32_t g, int32_t slot) {
    return a.slot_pos ? a.slot_pos[(size_t)g * a.capacity + slot] : slot;
}

/* Row k of the tile: key k0 + k of head g rotated into ks (stride head_dim + 1)
 * and its value into vs; zeros past n_keys. Called by one warp per row. */
template <class T>
__device__ __forceinline__ void attn_load_row(const cuda_attn &a, const cuda_rope &r, int32_t g, int32_t key,
                                              int32_t n_keys, float *krow, float *vrow, int lane) {
    int32_t hd = a.head_dim;
    if (key >= n_keys) {
        for (int e = lane; e < hd; e += 32) krow[e] = vrow[e] = 0.0f;
        return;
    }
    int32_t slot = attn_key_slot(a, g, key);
    size_t at = ((size_t)g * a.capacity + slot) * hd;
    const T *ksrc = static_cast<const T *>(a.k) + at;
    const T *vsrc = static_cast<const T *>(a.v) + at;
    int64_t pos = attn_slot_pos(a, g, slot);
    for (int i = lane; i < r.n_rot / 2; i += 32) rope_key_pair(r, ksrc, krow, pos, i);
    for (int e = r.n_rot + lane; e < hd; e += 32) krow[e] = to_f32(ksrc[e]);
    for (int e = lane; e < hd; e += 32) vrow[e] = to_f32(vsrc[e]);
}

/* One block's work: KV head g, (query, head) items [item_block * nw, + nw)
 * for the block's nw warps, keys [split * split_keys, + split_keys); partial NULL writes
 * the normalised output, else this split's partial results go to
 * partial[split][t][h]. */
template <class T>
__device__ void attn_block(const cuda_attn &a, const cuda_rope &r, int32_t bk, int32_t split_keys, float *partial,
                           int32_t g, int32_t item_block, int32_t split) {
    CU_DYNAMIC_SHARED(float, smem);
    const int32_t hd = a.head_dim, group = a.n_head / a.n_head_kv;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    float *ks = smem;                              /* [bk][hd + 1] */
    float *vs = ks + (size_t)bk * (hd + 1);        /* [bk][hd] */
    float *qs = vs + (size_t)bk * hd;              /* [nw][hd] */
    float *ps = qs + (size_t)nw * hd;              /* [nw][32] */

    const int32_t n_items = a.n_q * group, n_keys = a.n_pre + a.n_q;
    const int32_t item = item_block * nw + warp;
    const bool active = item < n_items;
    const int32_t t = active ? item / group : 0, h = g * group + (active ? item % group : 0);
    /* the block's last query sees the most keys */
    int32_t last_item = imin(n_items - 1, item_block * nw + nw - 1);
    int32_t block_keys = a.n_pre + last_item / group + 1;
    int32_t k_begin = split * split_keys, k_end = imin(n_keys, k_begin + split_keys);
    int32_t tile_end = imin(k_end, block_keys);
    int32_t n_vis = a.n_pre + t + 1; /* this warp's causal limit */

    const float *qv = a.q + ((size_t)t * a.n_head + h) * hd;
    for (int e = lane; e < hd; e += 32) qs[warp * hd + e] = active ? qv[e] : 0.0f;

    float m = -INFINITY, l = 0.0f, o[ATTN_MAX_DIM / 32];
CU_UNROLL
    for (int i = 0; i < ATTN_MAX_DIM / 32; i++) o[i] = 0.0f;

    for (int32_t k0 = k_begin; k0 < tile_end; k0 += bk) {
        __syncthreads(); /* the previous tile is no longer read */
        for (int row = warp; row < bk; row += nw)
            attn_load_row<T>(a, r, g, k0 + row, k_end, ks + (size_t)row * (hd + 1), vs + (size_t)row * hd, lane);
        __syncthreads();
        int32_t key = k0 + lane;
        bool valid = active && lane < bk && key < k_end && key < n_vis;
        float s = -INFINITY;
        if (valid) {
            const float *kr = ks + (size_t)lane * (hd + 1), *q = qs + warp * hd;
            float dot = 0.0f;
            for (int e = 0; e < hd; e++) dot = fmaf(q[e], kr[e], dot);
            s = dot * a.scale;
        }
        float m_new = fmaxf(m, warp_max(s));
        float p = valid ? expf(s - m_new) : 0.0f;
        float sum = warp_sum(p);
        if (m_new == -INFINITY) continue; /* nothing visible yet (uniform across the warp) */
        float corr = expf(m - m_new);     /* 0 while m is -inf */
        l = l * corr + sum;
        m = m_new;
        ps[warp * 32 + lane] = p;
        __syncwarp();
        int32_t n_here = imin(bk, imin(k_end, n_vis) - k0);
CU_UNROLL
        for (int i = 0; i < ATTN_MAX_DIM / 32; i++) {
            int e = lane + 32 * i;
            if (e >= hd) break;
            float acc = o[i] * corr;
            for (int32_t k = 0; k < n_here; k++) acc = fmaf(ps[warp * 32 + k], vs[(size_t)k * hd + e], acc);
            o[i] = acc;
        }
        __syncwarp();
    }
    if (!active) return;
    if (!partial) {
        float inv = 1.0f / l;
        float *out = a.out + ((size_t)t * a.n_head + h) * hd;
CU_UNROLL
        for (int i = 0; i < ATTN_MAX_DIM / 32; i++)
            if (lane + 32 * i < hd) out[lane + 32 * i] = o[i] * inv;
        if (a.lse && lane == 0) a.lse[(size_t)h * a.n_q + t] = m + logf(l);
        return;
    }
    /* partial[split][t][h]: max, sum, then head_dim unnormalised outputs */
    float *pr = partial + (((size_t)split * a.n_q + t) * a.n_head + h) * (hd + 2);
    if (lane == 0) {
        pr[0] = m;
        pr[1] = l;
    }
CU_UNROLL
    for (int i = 0; i < ATTN_MAX_DIM / 32; i++)
        if (lane + 32 * i < hd) pr[2 + lane + 32 * i] = o[i];
}

template <class T>
__global__ void attn_kernel(cuda_attn a, cuda_rope r, int32_t bk, int32_t split_keys, float *partial) {
    attn_block<T>(a, r, bk, split_keys, partial, blockIdx.x, blockIdx.y, blockIdx.z);
}

/* One warp per (query, head): merges the splits' partial results. */
__global__ void combine_kernel(cuda_attn a, int32_t n_split, const float *partial) {
    int32_t row = blockIdx.x * ATTN_NW + threadIdx.x / 32, lane = threadIdx.x % 32, hd = a.head_dim;
    if (row >= a.n_q * a.n_head) return;
    int32_t t = row / a.n_head, h = row % a.n_head;
    size_t stride = (size_t)a.n_q * a.n_head * (hd + 2);
    const float *p0 = partial + (size_t)row * (hd + 2);
    float m = -INFINITY;
    for (int32_t s = 0; s < n_split; s++) m = fmaxf(m, p0[s * stride]);
    float l = 0.0f;
    for (int32_t s = 0; s < n_split; s++) {
        float ms = p0[s * stride];
        if (ms != -INFINITY) l += p0[s * stride + 1] * expf(ms - m);
    }
    float inv = 1.0f / l;
    for (int32_t e = lane; e < hd; e += 32) {
        float acc = 0.0f;
        for (int32_t s = 0; s < n_split; s++) {
            float ms = p0[s * stride];
            if (ms != -INFINITY) acc += p0[s * stride + 2 + e] * expf(ms - m);
        }
        a.out[((size_t)t * a.n_head + h) * hd + e] = acc * inv;
    }
    if (a.lse && lane == 0) a.lse[(size_t)h * a.n_q + t] = m + logf(l);
}

/* ---- batched decode: one launch for the single-token spans of a forward ---------- */

/* Splits of a span with n_keys keys in a batch launched with grid_splits. */
__host__ __device__ __forceinline__ int32_t batch_splits(int32_t n_keys, int32_t grid_splits) {
    int32_t s = (n_keys + ATTN_SPLIT_KEYS - 1) / ATTN_SPLIT_KEYS;
    return s < 1 ? 1 : s > grid_splits ? grid_splits : s;
}

/* The span's arguments in cuda_attn form, for layer b.layer. */
__device__ __forceinline__ cuda_attn batch_span(const cuda_attn_batch &b, const cuda_attn_desc &d) {
    size_t layer_off = (size_t)b.layer * b.n_head_kv * d.capacity * b.head_dim * (b.dtype == 0 ? 2 : 4);
    cuda_attn a;
    a.q = b.q + (size_t)d.t * b.n_head * b.head_dim;
    a.out = b.out + (size_t)d.t * b.n_head * b.head_dim;
    a.lse = nullptr;
    a.k = static_cast<const char *>(d.k) + layer_off;
    a.v = static_cast<const char *>(d.v) + layer_off;
    a.dtype = b.dtype, a.capacity = d.capacity, a.n_head = b.n_head, a.n_head_kv = b.n_head_kv;
    a.head_dim = b.head_dim;
    a.slots = d.slots ? d.slots + (size_t)b.layer * b.n_head_kv * d.n_pre : nullptr;
    a.n_pre = d.n_pre, a.n0 = d.n0, a.n_q = 1, a.scale = b.scale;
    a.slot_pos = nullptr; /* spans with original positions are not batched */
    return a;
}

/* grid (n_head_kv * item blocks of a group, n_spans, grid splits). Everything
 * that changes from step to step (positions, key counts, pot arrays) is read
 * from b.desc in device memory, so a captured graph replays with new values. */
template <class T>
__global__ void attn_batch_kernel(cuda_attn_batch b, cuda_rope r, int32_t bk, float *partial) {
    const cuda_attn_desc d = b.desc[blockIdx.y];
    const int32_t group = b.n_head / b.n_head_kv, item_blocks = (group + ATTN_NW - 1) / ATTN_NW;
    const int32_t n_keys = d.n_pre + 1, n_split = batch_splits(n_keys, gridDim.z);
    if ((int32_t)blockIdx.z >= n_split) return; /* uniform across the block */
    int32_t split_keys = (n_keys + n_split - 1) / n_split;
    split_keys = (split_keys + bk - 1) / bk * bk;
    cuda_attn a = batch_span(b, d);
    float *pr = gridDim.z > 1 ? partial + (size_t)blockIdx.y * gridDim.z * b.n_head * (b.head_dim + 2) : nullptr;
    attn_block<T>(a, r, bk, split_keys, pr, blockIdx.x / item_blocks, blockIdx.x % item_blocks, blockIdx.z);
}

/* One warp per (span, head): merges that span's splits. */
__global__ void combine_batch_kernel(cuda_attn_batch b, int32_t grid_splits, const float *partial) {
    int32_t row = blockIdx.x * ATTN_NW + threadIdx.x / 32, lane = threadIdx.x % 32, hd = b.head_dim;
    if (row >= b.n_spans * b.n_head) return;
    int32_t s = row / b.n_head, h = row % b.n_head;
    const cuda_attn_desc d = b.desc[s];
    int32_t n_split = batch_splits(d.n_pre + 1, grid_splits);
    size_t stride = (size_t)b.n_head * (hd + 2);
    const float *p0 = partial + ((size_t)s * grid_splits * b.n_head + h) * (hd + 2);
    float m = -INFINITY;
    for (int32_t i = 0; i < n_split; i++) m = fmaxf(m, p0[i * stride]);
    float l = 0.0f;
    for (int32_t i = 0; i < n_split; i++) {
        float mi = p0[i * stride];
        if (mi != -INFINITY) l += p0[i * stride + 1] * expf(mi - m);
    }
    float inv = 1.0f / l;
    float *out = b.out + ((size_t)d.t * b.n_head + h) * hd;
    for (int32_t e = lane; e < hd; e += 32) {
        float acc = 0.0f;
        for (int32_t i = 0; i < n_split; i++) {
            float mi = p0[i * stride];
            if (mi != -INFINITY) acc += p0[i * stride + 2 + e] * expf(mi - m);
        }
        out[e] = acc * inv;
    }
}

extern "C" int32_t cuda_attention_batch_splits(int32_t max_keys) {
    if (max_keys <= 2 * ATTN_SPLIT_KEYS) return 1;
    return batch_splits(max_keys, ATTN_MAX_SPLITS);
}

extern "C" size_t cuda_attention_batch_scratch_floats(int32_t n_spans, int32_t n_head, int32_t head_dim,
                                                      int32_t grid_splits) {
    return grid_splits > 1 ? (size_t)n_spans * grid_splits * n_head * (head_dim + 2) : 0;
}

extern "C" cudaError_t cuda_attention_batch_f32(const cuda_attn_batch *b, const cuda_rope *rope, int32_t grid_splits,
                                                float *scratch, cudaStream_t stream) {
    if (!b || !rope || !b->desc || !b->q || !b->out || (b->dtype != 0 && b->dtype != 1) || b->n_spans < 0 ||
        b->n_spans > 65535 || b->n_head <= 0 || b->n_head_kv <= 0 || b->n_head % b->n_head_kv ||
        b->head_dim <= 0 || b->head_dim > ATTN_MAX_DIM || b->layer < 0 || grid_splits < 1 ||
        grid_splits > ATTN_MAX_SPLITS || (grid_splits > 1 && !scratch) || rope->n_rot > b->head_dim)
        return cudaErrorInvalidValue;
    if (!b->n_spans) return cudaSuccess;
    int32_t group = b->n_head / b->n_head_kv, item_blocks = (group + ATTN_NW - 1) / ATTN_NW;
    int32_t bk = attn_tile_keys(b->head_dim);
    dim3 grid((unsigned)(b->n_head_kv * item_blocks), (unsigned)b->n_spans, (unsigned)grid_splits);
    size_t shmem = attn_shared_bytes(b->head_dim, ATTN_NW);
    float *partial = grid_splits > 1 ? scratch : nullptr;
    if (b->dtype == 0)
        CU_LAUNCH(attn_batch_kernel<__half>, grid, dim3(32 * ATTN_NW), shmem, stream, *b, *rope, bk, partial);
    else
        CU_LAUNCH(attn_batch_kernel<float>, grid, dim3(32 * ATTN_NW), shmem, stream, *b, *rope, bk, partial);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || grid_splits == 1) return e;
    int32_t rows = b->n_spans * b->n_head;
    CU_LAUNCH(combine_batch_kernel, dim3((unsigned)((rows + ATTN_NW - 1) / ATTN_NW)), dim3(32 * ATTN_NW), 0, stream,
              *b, grid_splits, (const float *)scratch);
    return cudaGetLastError();
}

/* Keys per block of scores_kernel (one thread each; their rotated rows in
 * shared memory). */
static int scores_block_keys(int32_t head_dim) { return head_dim <= 128 ? 64 : 32; }

/* One thread per key of head g (blockIdx.x); rotated keys in shared memory. */
template <class T>
__global__ void scores_kernel(cuda_attn a, cuda_rope r, int32_t row0, int32_t n_rows, const float *row_weight,
                              int32_t combine, float *scores) {
    CU_DYNAMIC_SHARED(float, ks); /* [blockDim.x][hd] */
    const int32_t hd = a.head_dim, group = a.n_head / a.n_head_kv, g = blockIdx.x;
    const int32_t n_keys = a.n_pre + a.n_q;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int kb = blockDim.x;
    int32_t k0 = blockIdx.y * kb;
    for (int row = warp; row < kb; row += kb / 32) {
        float *krow = ks + (size_t)row * hd;
        int32_t key = k0 + row;
        if (key >= n_keys) continue; /* whole warp: no collective inside */
        int32_t slot = attn_key_slot(a, g, key);
        const T *src = static_cast<const T *>(a.k) + ((size_t)g * a.capacity + slot) * hd;
        int64_t pos = attn_slot_pos(a, g, slot);
        for (int i = lane; i < r.n_rot / 2; i += 32) rope_key_pair(r, src, krow, pos, i);
        for (int e = r.n_rot + lane; e < hd; e += 32) krow[e] = to_f32(src[e]);
    }
    __syncthreads();
    int32_t key = k0 + threadIdx.x;
    if (key >= n_keys) return;
    const float *kr = ks + (size_t)threadIdx.x * hd;
    float acc = 0.0f;
    for (int32_t i = 0; i < group; i++) {
        int32_t h = g * group + i;
        float sum = 0.0f;
        for (int32_t t = row0; t < row0 + n_rows; t++) {
            if (key >= a.n_pre + t + 1) continue; /* masked for this row */
            const float *q = a.q + ((size_t)t * a.n_head + h) * hd;
            float dot = 0.0f;
            for (int e = 0; e < hd; e++) dot = fmaf(__ldg(q + e), kr[e], dot);
            float p = expf(dot * a.scale - a.lse[(size_t)h * a.n_q + t]);
            float wp = row_weight ? row_weight[t - row0] * p : p;
            sum = combine & 2 ? fmaxf(sum, wp) : sum + wp;
        }
        acc = i == 0 ? sum : combine & 1 ? fmaxf(acc, sum) : acc + sum;
    }
    scores[(size_t)g * n_keys + key] = acc;
}

static bool attn_valid(const cuda_attn *a, const cuda_rope *r) {
    return a && r && a->q && a->k && a->v && (a->dtype == 0 || a->dtype == 1) && a->n_head > 0 &&
           a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 && a->head_dim > 0 && a->head_dim <= ATTN_MAX_DIM &&
           a->n_q >= 0 && a->n_pre >= 0 && a->n0 >= 0 && (a->slots || a->n_pre <= a->n0) &&
           (int64_t)a->n0 + a->n_q <= a->capacity && r->n_rot >= 0 && r->n_rot % 2 == 0 && r->n_rot <= a->head_dim &&
           (r->layout == 0 || r->layout == 1) && (r->n_table == 0 || r->cs) && (r->n_rot == 0 || r->inv_freq) &&
           (int64_t)a->n_q * a->n_head / ATTN_NW < 65535;
}

extern "C" int32_t cuda_attention_splits(int32_t n_q, int32_t n_keys) {
    if (n_q != 1 || n_keys <= 2 * ATTN_SPLIT_KEYS) return 1;
    int32_t s = (n_keys + ATTN_SPLIT_KEYS - 1) / ATTN_SPLIT_KEYS;
    return s < ATTN_MAX_SPLITS ? s : ATTN_MAX_SPLITS;
}

extern "C" size_t cuda_attention_scratch_floats(int32_t n_q, int32_t n_head, int32_t head_dim, int32_t n_split) {
    return n_split > 1 ? (size_t)n_split * n_q * n_head * (head_dim + 2) : 0;
}

extern "C" cudaError_t cuda_attention_f32(const cuda_attn *a, const cuda_rope *rope, int32_t n_split, float *scratch,
                                          cudaStream_t stream) {
    if (!attn_valid(a, rope) || !a->out || n_split < 1 || n_split > 65535 || (n_split > 1 && !scratch))
        return cudaErrorInvalidValue;
    if (!a->n_q) return cudaSuccess;
    int32_t n_keys = a->n_pre + a->n_q, bk = attn_tile_keys(a->head_dim);
    /* each split a whole number of tiles */
    int32_t split_keys = (n_keys + n_split - 1) / n_split;
    split_keys = (split_keys + bk - 1) / bk * bk;
    int32_t group = a->n_head / a->n_head_kv, n_items = a->n_q * group;
    int nw = attn_span_warps(a->n_q, a->head_dim);
    dim3 grid((unsigned)a->n_head_kv, (unsigned)((n_items + nw - 1) / nw), (unsigned)n_split);
    size_t shmem = attn_shared_bytes(a->head_dim, nw);
    float *partial = n_split > 1 ? scratch : nullptr;
    if (a->dtype == 0)
        CU_LAUNCH(attn_kernel<__half>, grid, dim3(32 * nw), shmem, stream, *a, *rope, bk, split_keys, partial);
    else
        CU_LAUNCH(attn_kernel<float>, grid, dim3(32 * nw), shmem, stream, *a, *rope, bk, split_keys, partial);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || n_split == 1) return e;
    int32_t rows = a->n_q * a->n_head;
    CU_LAUNCH(combine_kernel, dim3((unsigned)((rows + ATTN_NW - 1) / ATTN_NW)), dim3(32 * ATTN_NW), 0, stream, *a,
              n_split, (const float *)scratch);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_attention_scores(const cuda_attn *a, const cuda_rope *rope, int32_t row0, int32_t n_rows,
                                             const float *row_weight, int32_t combine, float *scores,
                                             cudaStream_t stream) {
    if (!attn_valid(a, rope) || !a->lse || !scores || row0 < 0 || n_rows < 0 || row0 + n_rows > a->n_q ||
        combine < 0 || combine > 3)
        return cudaErrorInvalidValue;
    int32_t n_keys = a->n_pre + a->n_q, kb = scores_block_keys(a->head_dim);
    if (!n_keys) return cudaSuccess;
    dim3 grid((unsigned)a->n_head_kv, (unsigned)((n_keys + kb - 1) / kb));
    size_t shmem = (size_t)kb * a->head_dim * sizeof(float);
    if (a->dtype == 0)
        CU_LAUNCH(scores_kernel<__half>, grid, dim3(kb), shmem, stream, *a, *rope, row0, n_rows, row_weight, combine,
                  scores);
    else
        CU_LAUNCH(scores_kernel<float>, grid, dim3(kb), shmem, stream, *a, *rope, row0, n_rows, row_weight, combine,
                  scores);
    return cudaGetLastError();
}

/* ---- the CPU reference (host memory) ------------------------------------------------ */

static float ref_load(const cuda_attn *a, const void *base, size_t i) {
    if (a->dtype == 1) return static_cast<const float *>(base)[i];
    return __half2float(static_cast<const __half *>(base)[i]);
}

/* Key k of head g as f32, rotated as rope_rotate does (table, else double). */
static void ref_key(const cuda_attn *a, const cuda_rope *r, int32_t g, int32_t slot, float *dst, float *val) {
    size_t at = ((size_t)g * a->capacity + slot) * a->head_dim;
    for (int32_t e = 0; e < a->head_dim; e++) {
        dst[e] = ref_load(a, a->k, at + e);
        val[e] = ref_load(a, a->v, at + e);
    }
    int32_t half = r->n_rot / 2;
    int64_t pos = attn_slot_pos(*a, g, slot);
    for (int32_t i = 0; i < half; i++) {
        float c, s;
        if (pos < r->n_table) {
            c = r->cs[((size_t)pos * half + i) * 2];
            s = r->cs[((size_t)pos * half + i) * 2 + 1];
        } else {
            double theta = (double)pos * r->inv_freq[i];
            c = (float)cos(theta);
            s = (float)sin(theta);
        }
        int32_t x = r->layout == 0 ? 2 * i : i, y = r->layout == 0 ? 2 * i + 1 : i + half;
        float x0 = dst[x], x1 = dst[y];
        dst[x] = x0 * c - x1 * s;
        dst[y] = x0 * s + x1 * c;
        if (a->dtype == 0) { /* rounded to the pot's precision, as the CPU backend attends */
            dst[x] = __half2float(__float2half_rn(dst[x]));
            dst[y] = __half2float(__float2half_rn(dst[y]));
        }
    }
}

extern "C" void cuda_attention_ref(const cuda_attn *a, const cuda_rope *r, int32_t row0, int32_t n_rows,
                                   const float *row_weight, int32_t combine, float *scores) {
    int32_t hd = a->head_dim, group = a->n_head / a->n_head_kv, n_keys = a->n_pre + a->n_q;
    float *krot = (float *)malloc(sizeof(float) * ((size_t)n_keys * hd * 2 + n_keys + (size_t)group * n_keys + 1));
    float *vals = krot + (size_t)n_keys * hd, *p = vals + (size_t)n_keys * hd, *hs = p + n_keys;
    for (int32_t g = 0; g < a->n_head_kv; g++) {
        for (int32_t k = 0; k < n_keys; k++) {
            int32_t slot = k >= a->n_pre ? a->n0 + k - a->n_pre : a->slots ? a->slots[(size_t)g * a->n_pre + k] : k;
            ref_key(a, r, g, slot, krot + (size_t)k * hd, vals + (size_t)k * hd);
        }
        for (size_t i = 0; i < (size_t)group * n_keys; i++) hs[i] = 0.0f;
        for (int32_t i = 0; i < group; i++) {
            int32_t h = g * group + i;
            for (int32_t t = 0; t < a->n_q; t++) {
                int32_t n_vis = a->n_pre + t + 1;
                const float *q = a->q + ((size_t)t * a->n_head + h) * hd;
                float mx = -INFINITY;
                for (int32_t k = 0; k < n_vis; k++) {
                    float dot = 0.0f;
                    for (int32_t e = 0; e < hd; e++) dot += q[e] * krot[(size_t)k * hd + e];
                    p[k] = dot * a->scale;
                    mx = fmaxf(mx, p[k]);
                }
                double sum = 0;
                for (int32_t k = 0; k < n_vis; k++) {
                    p[k] = expf(p[k] - mx);
                    sum += p[k];
                }
                float inv = (float)(1.0 / sum);
                float *o = a->out + ((size_t)t * a->n_head + h) * hd;
                for (int32_t e = 0; e < hd; e++) o[e] = 0.0f;
                for (int32_t k = 0; k < n_vis; k++) {
                    p[k] *= inv;
                    for (int32_t e = 0; e < hd; e++) o[e] += p[k] * vals[(size_t)k * hd + e];
                }
                if (a->lse) a->lse[(size_t)h * a->n_q + t] = (float)((double)mx + log(sum));
                if (scores && t >= row0 && t < row0 + n_rows) {
                    float w = row_weight ? row_weight[t - row0] : 1.0f;
                    for (int32_t k = 0; k < n_vis; k++) {
                        float *h_k = hs + (size_t)i * n_keys + k;
                        *h_k = combine & 2 ? fmaxf(*h_k, w * p[k]) : *h_k + w * p[k];
                    }
                }
            }
        }
        if (scores)
            for (int32_t k = 0; k < n_keys; k++) {
                float acc = hs[k];
                for (int32_t i = 1; i < group; i++) {
                    float s = hs[(size_t)i * n_keys + k];
                    acc = combine & 1 ? fmaxf(acc, s) : acc + s;
                }
                scores[(size_t)g * n_keys + k] = acc;
            }
    }
    free(krot);
}
