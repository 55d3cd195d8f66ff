/* Pots held in device memory (cuda/cuda_internal.h, cache/cache.h "pots held
 * by a device"). A forward attaches the pot of each span: device K/V arrays
 * of the pot's layout, its valid slots uploaded once. From then on the
 * forwards write new K/V on the device only and the host copy goes stale;
 * cache/pot.c calls back here when host code needs the K/V (sync: copy the
 * slots the host lacks), compacts the pot (a gather kernel into a second
 * buffer, the host moving only the per-slot metadata the policies use),
 * copies it (device to device) or frees it (release). Nothing here is
 * thread-safe: pots and the backend belong to the engine thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"

cudaError_t dbuf_need(dbuf *b, size_t bytes) {
    if (b->bytes >= bytes && b->p) return cudaSuccess;
    cudaFree(b->p);
    b->p = NULL;
    b->bytes = 0;
    size_t want = bytes > 256 ? bytes : 256;
    cudaError_t e = cudaMalloc(&b->p, want);
    if (e == cudaSuccess) b->bytes = want;
    return e;
}

void dbuf_free(dbuf *b) {
    cudaFree(b->p);
    b->p = NULL;
    b->bytes = 0;
}

static size_t slot_bytes(const pot *p) { return (size_t)p->head_dim * (p->dtype == POT_F16 ? 2 : 4); }

static size_t kv_bytes(const pot *p) {
    return (size_t)p->n_layer * p->n_head_kv * p->capacity * slot_bytes(p);
}

/* Slots [s0, s1) of every (layer, head) row from src (src_capacity slots a
 * row) to dst (dst_capacity), for K and V, on the stream. */
static cudaError_t copy_slots(cudaStream_t stream, void *dk, void *dv, int32_t dst_capacity, const void *sk,
                              const void *sv, int32_t src_capacity, const pot *shape, int32_t s0, int32_t s1,
                              enum cudaMemcpyKind kind) {
    if (s1 <= s0) return cudaSuccess;
    size_t row = slot_bytes(shape), off = (size_t)s0 * row, width = (size_t)(s1 - s0) * row;
    size_t height = (size_t)shape->n_layer * shape->n_head_kv;
    size_t dpitch = (size_t)dst_capacity * row, spitch = (size_t)src_capacity * row;
    cudaError_t e = cudaMemcpy2DAsync((char *)dk + off, dpitch, (const char *)sk + off, spitch, width, height, kind,
                                      stream);
    if (e == cudaSuccess)
        e = cudaMemcpy2DAsync((char *)dv + off, dpitch, (const char *)sv + off, spitch, width, height, kind, stream);
    return e;
}

static dev_pot *as_dev(pot_device *d) { return (dev_pot *)d; }

/* ---- the callbacks cache/pot.c makes ---------------------------------------------- */

static int dp_sync(pot_device *d, pot *p) {
    dev_pot *dp = as_dev(d);
    if (dp->n_host >= p->n) return 0;
    cudaStream_t st = dp->cb->stream;
    if (copy_slots(st, p->k, p->v, p->capacity, dp->k, dp->v, p->capacity, p, dp->n_host, p->n,
                   cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaStreamSynchronize(st) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    dp->n_host = p->n;
    return 0;
}

static void dp_release(pot_device *d, pot *p) {
    dev_pot *dp = as_dev(d);
    cuda_backend *cb = dp->cb;
    cudaStreamSynchronize(cb->stream); /* queued work may still read the arrays */
    cudaFree(dp->k);
    cudaFree(dp->v);
    if (dp->prev) dp->prev->next = dp->next;
    else cb->pots = dp->next;
    if (dp->next) dp->next->prev = dp->prev;
    cb->pot_bytes -= 2 * dp->bytes;
    p->device = NULL;
    free(dp);
}

/* The in-order gather of the kept slots into the second buffers (cmp_k,
 * cmp_v); then the pot takes them and, when they are the same size, its old
 * arrays become the second buffers (no copy back; same-size pots are the
 * common case: one budget per server). */
static int dp_compact(pot_device *d, pot *p, const int32_t *keep, int32_t n_keep) {
    dev_pot *dp = as_dev(d);
    cuda_backend *cb = dp->cb;
    size_t rows = (size_t)p->n_layer * p->n_head_kv, keep_bytes = rows * (size_t)n_keep * sizeof(int32_t);
    if (n_keep < 0 || n_keep > p->n) return -1;
    if (dbuf_need(&cb->cmp_k, dp->bytes) || dbuf_need(&cb->cmp_v, dp->bytes) ||
        dbuf_need(&cb->keep, keep_bytes ? keep_bytes : 1)) {
        cudaGetLastError();
        return -1;
    }
    cudaStream_t st = cb->stream;
    if ((keep_bytes && cudaMemcpyAsync(cb->keep.p, keep, keep_bytes, cudaMemcpyHostToDevice, st)) ||
        cuda_pot_gather(cb->cmp_k.p, dp->k, (int64_t)rows, p->capacity, slot_bytes(p), cb->keep.p, n_keep, st) ||
        cuda_pot_gather(cb->cmp_v.p, dp->v, (int64_t)rows, p->capacity, slot_bytes(p), cb->keep.p, n_keep, st)) {
        cudaGetLastError();
        return -1; /* nothing written to the pot's arrays */
    }
    if (cb->cmp_k.bytes == dp->bytes && cb->cmp_v.bytes == dp->bytes) {
        void *k = dp->k, *v = dp->v;
        dp->k = cb->cmp_k.p;
        dp->v = cb->cmp_v.p;
        cb->cmp_k.p = k;
        cb->cmp_v.p = v;
    } else if (copy_slots(st, dp->k, dp->v, p->capacity, cb->cmp_k.p, cb->cmp_v.p, p->capacity, p, 0, n_keep,
                          cudaMemcpyDeviceToDevice)) {
        /* the gather is done, the copy back is not: the pot's K/V are lost */
        cudaGetLastError();
        fprintf(stderr, "potserve: cuda: a pot's compaction failed half way; its K/V are lost\n");
        return -1;
    }
    dp->n_host = 0; /* the host's K/V are where they were: stale */
    return 0;
}

static dev_pot *attach_new(cuda_backend *cb, pot *p, uint64_t now, char *err, size_t errlen);

static int dp_copy(pot_device *d, pot *dst, const pot *src) {
    dev_pot *sp = as_dev(d);
    cuda_backend *cb = sp->cb;
    char err[160];
    if (dst->device && !cuda_pot_is_ours(cb, dst)) dst->device->release(dst->device, dst);
    /* the source counts as used now, so making room for dst never evicts it */
    uint64_t now = ++cb->clock;
    sp->last_use = now;
    dev_pot *dp = dst->device ? as_dev(dst->device) : attach_new(cb, dst, now, err, sizeof err);
    if (!dp) return -1;
    if (copy_slots(cb->stream, dp->k, dp->v, dst->capacity, sp->k, sp->v, src->capacity, src, 0, src->n,
                   cudaMemcpyDeviceToDevice)) {
        cudaGetLastError();
        dp_release(&dp->hooks, dst);
        return -1;
    }
    dp->n_host = 0;
    return 0;
}

/* ---- attaching ---------------------------------------------------------------------- */

int cuda_pot_is_ours(const cuda_backend *cb, const pot *p) {
    return p->device && p->device->sync == dp_sync && as_dev(p->device)->cb == cb;
}

/* Sends the least recently used pot not used at `now` back to the host. 0 if one went. */
static int evict_one(cuda_backend *cb, uint64_t now) {
    dev_pot *best = NULL;
    for (dev_pot *dp = cb->pots; dp; dp = dp->next)
        if (dp->last_use < now && (!best || dp->last_use < best->last_use)) best = dp;
    if (!best) return -1;
    if (pot_host_take(best->p))
        fprintf(stderr, "potserve: cuda: a pot could not be read back from the device; its K/V are lost\n");
    return 0;
}

/* Device K/V arrays for p (no contents), in the list; NULL + err. */
static dev_pot *attach_new(cuda_backend *cb, pot *p, uint64_t now, char *err, size_t errlen) {
    if (p->ring) { /* the kernels address every slot of every layer; a ring layer has fewer rows */
        snprintf(err, errlen, "cuda backend: pots with sliding-window rings are not supported on the device");
        return NULL;
    }
    dev_pot *dp = calloc(1, sizeof *dp);
    if (!dp) {
        snprintf(err, errlen, "cuda backend: out of memory");
        return NULL;
    }
    dp->bytes = kv_bytes(p);
    for (;;) {
        cudaError_t ek = cudaMalloc(&dp->k, dp->bytes), ev = ek ? ek : cudaMalloc(&dp->v, dp->bytes);
        if (ev == cudaSuccess) break;
        cudaFree(dp->k);
        dp->k = dp->v = NULL;
        cudaGetLastError(); /* clear the allocation error */
        if (evict_one(cb, now)) {
            snprintf(err, errlen, "cuda backend: out of device memory for a pot of %d slots (%zu MiB of pots held)",
                     p->capacity, cb->pot_bytes >> 20);
            free(dp);
            return NULL;
        }
    }
    dp->hooks = (pot_device){dp_sync, dp_compact, dp_copy, dp_release};
    dp->cb = cb;
    dp->p = p;
    dp->last_use = now;
    dp->next = cb->pots;
    if (cb->pots) cb->pots->prev = dp;
    cb->pots = dp;
    cb->pot_bytes += 2 * dp->bytes;
    p->device = &dp->hooks;
    return dp;
}

dev_pot *cuda_pot_acquire(cuda_backend *cb, pot *p, uint64_t now, char *err, size_t errlen) {
    if (cuda_pot_is_ours(cb, p)) {
        as_dev(p->device)->last_use = now;
        return as_dev(p->device);
    }
    if (p->device && pot_host_take(p)) {
        snprintf(err, errlen, "cuda backend: a pot held by another device could not be read back");
        return NULL;
    }
    dev_pot *dp = attach_new(cb, p, now, err, errlen);
    if (!dp) return NULL;
    cudaError_t e = copy_slots(cb->stream, dp->k, dp->v, p->capacity, p->k, p->v, p->capacity, p, 0, p->n,
                               cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: uploading a pot: %s", cudaGetErrorString(e));
        cudaGetLastError();
        dp_release(&dp->hooks, p);
        return NULL;
    }
    dp->n_host = p->n;
    return dp;
}

void cuda_pots_return_all(cuda_backend *cb) {
    while (cb->pots)
        if (pot_host_take(cb->pots->p))
            fprintf(stderr, "potserve: cuda: a pot could not be read back from the device; its K/V are lost\n");
}
