/* Pot storage: one contiguous allocation per K and V so a (layer, head)'s
 * slots are adjacent. f16 entries use the compiler's _Float16 conversions
 * (IEEE round-to-nearest-even), which keeps this module free of engine code;
 * on x86 with F16C the same conversions run 8 at a time in hardware (the
 * software conversion was a fifth of decode time). */
#include "cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("f16c,avx"))) static void f16_to_f32_f16c(const _Float16 *src, float *dst,
                                                                size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = (float)src[i];
}

__attribute__((target("f16c,avx"))) static void f32_to_f16_f16c(const float *src, _Float16 *dst,
                                                                size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = (_Float16)src[i];
}

static int have_f16c(void) {
    static int known = -1; /* benign race: every thread computes the same answer */
    if (known < 0) known = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
    return known;
}
#endif

static void f16_to_f32(const _Float16 *src, float *dst, size_t n) {
#if defined(__x86_64__)
    if (have_f16c()) {
        f16_to_f32_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

static void f32_to_f16(const float *src, _Float16 *dst, size_t n) {
#if defined(__x86_64__)
    if (have_f16c()) {
        f32_to_f16_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dst[i] = (_Float16)src[i];
}

static size_t elem_bytes(enum pot_dtype t) { return t == POT_F32 ? 4 : 2; }

size_t pot_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                 enum pot_dtype dtype) {
    if (n_layer <= 0 || n_head_kv <= 0 || head_dim <= 0 || capacity <= 0 || head_dim > 65536)
        return 0;
    /* K and V rows plus token index (8), surprisal (4) and score (4) per slot */
    size_t per_slot = 2 * elem_bytes(dtype) * (size_t)head_dim + 16;
    size_t slots = (size_t)n_layer * (size_t)n_head_kv;
    if (slots > SIZE_MAX / (size_t)capacity) return 0;
    slots *= (size_t)capacity;
    return slots > SIZE_MAX / per_slot ? 0 : slots * per_slot;
}

pot *pot_new(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
             enum pot_dtype dtype, char *err, size_t errlen) {
    size_t bytes = pot_bytes(n_layer, n_head_kv, head_dim, capacity, dtype);
    if (!bytes || (dtype != POT_F16 && dtype != POT_F32)) {
        snprintf(err, errlen, "pot: invalid size (%d layers, %d heads, dim %d, %d slots)", n_layer,
                 n_head_kv, head_dim, capacity);
        return NULL;
    }
    pot *p = calloc(1, sizeof *p);
    size_t slots = (size_t)n_layer * n_head_kv * capacity;
    if (p) {
        p->k = malloc(slots * head_dim * elem_bytes(dtype));
        p->v = malloc(slots * head_dim * elem_bytes(dtype));
        p->token_index = malloc(slots * sizeof *p->token_index);
        p->surprisal = calloc(slots, sizeof *p->surprisal);
        p->score_acc = calloc(slots, sizeof *p->score_acc);
    }
    if (!p || !p->k || !p->v || !p->token_index || !p->surprisal || !p->score_acc) {
        pot_free(p);
        snprintf(err, errlen, "pot: out of memory for %zu bytes", bytes);
        return NULL;
    }
    p->n_layer = n_layer;
    p->n_head_kv = n_head_kv;
    p->head_dim = head_dim;
    p->capacity = capacity;
    p->dtype = dtype;
    return p;
}

size_t pot_rotated_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                         enum pot_dtype dtype) {
    size_t all = pot_bytes(n_layer, n_head_kv, head_dim, capacity, dtype);
    return all ? (size_t)n_layer * n_head_kv * capacity * head_dim * elem_bytes(dtype) : 0;
}

int pot_cache_rotated_keys(pot *p) {
    if (p->k_rot) return 0;
    p->k_rot = malloc(pot_rotated_bytes(p->n_layer, p->n_head_kv, p->head_dim, p->capacity, p->dtype));
    p->n_rot = 0;
    return p->k_rot ? 0 : -1;
}

void pot_free(pot *p) {
    if (!p) return;
    if (p->device) p->device->release(p->device, p);
    free(p->k_rot);
    free(p->k);
    free(p->v);
    free(p->token_index);
    free(p->surprisal);
    free(p->score_acc);
    free(p);
}

size_t pot_slot(const pot *p, int32_t layer, int32_t head, int32_t slot) {
    return ((size_t)layer * p->n_head_kv + head) * (size_t)p->capacity + slot;
}

static void store_row(const pot *p, void *base, size_t slot_index, const float *src) {
    size_t d = (size_t)p->head_dim;
    if (p->dtype == POT_F32) {
        memcpy((float *)base + slot_index * d, src, d * sizeof(float));
        return;
    }
    f32_to_f16(src, (_Float16 *)base + slot_index * d, d);
}

static void load_rows(const pot *p, const void *base, size_t slot_index, int32_t n, float *dst) {
    size_t count = (size_t)n * p->head_dim;
    if (pot_host_sync(p)) { /* the device failed: NaN rather than stale values */
        for (size_t i = 0; i < count; i++) dst[i] = __builtin_nanf("");
        return;
    }
    if (p->dtype == POT_F32) {
        memcpy(dst, (const float *)base + slot_index * p->head_dim, count * sizeof(float));
        return;
    }
    f16_to_f32((const _Float16 *)base + slot_index * p->head_dim, dst, count);
}

int pot_write(pot *p, int32_t layer, int32_t head, int32_t slot, const float *k, const float *v) {
    if (pot_host_take(p)) return -1; /* a host writer: the host holds the K/V from now on */
    size_t s = pot_slot(p, layer, head, slot);
    store_row(p, p->k, s, k);
    store_row(p, p->v, s, v);
    if (slot < p->n_rot) p->n_rot = slot;
    return 0;
}

void pot_round_row(const pot *p, float *row) {
    if (p->dtype == POT_F32) return;
    _Float16 h[64];
    for (int32_t i = 0; i < p->head_dim; i += 64) {
        size_t n = p->head_dim - i < 64 ? (size_t)(p->head_dim - i) : 64;
        f32_to_f16(row + i, h, n);
        f16_to_f32(h, row + i, n);
    }
}

void pot_write_k_rotated(pot *p, int32_t layer, int32_t head, int32_t slot, const float *k) {
    store_row(p, p->k_rot, pot_slot(p, layer, head, slot), k);
}

void pot_read_k_rotated(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst) {
    load_rows(p, p->k_rot, pot_slot(p, layer, head, slot0), n, dst);
}

void pot_read_k(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst) {
    load_rows(p, p->k, pot_slot(p, layer, head, slot0), n, dst);
}

void pot_read_v(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst) {
    load_rows(p, p->v, pot_slot(p, layer, head, slot0), n, dst);
}

int64_t pot_rope_pos(const pot *p, int32_t layer, int32_t head, int32_t slot) {
    if (!p->original_positions) return slot;
    if (slot >= p->n) return p->n_seen + (slot - p->n);
    return p->token_index[pot_slot(p, layer, head, slot)];
}

void pot_truncate(pot *p, int32_t n) {
    if (n >= 0 && n < p->n) p->n = n;
    if (p->n_pinned > p->n) p->n_pinned = p->n;
    if (p->n_rot > p->n) p->n_rot = p->n;
}

int pot_copy(pot *dst, const pot *src) {
    if (dst->n_layer != src->n_layer || dst->n_head_kv != src->n_head_kv ||
        dst->head_dim != src->head_dim || dst->dtype != src->dtype || dst->capacity < src->n)
        return -1;
    /* K/V copied on the device that holds src when it can, else through the host */
    int kv_here = !src->device || !src->device->copy || src->device->copy(src->device, dst, src);
    if (kv_here && pot_host_sync(src)) return -1;
    if (kv_here && dst->device) dst->device->release(dst->device, dst);
    size_t row = (size_t)src->head_dim * elem_bytes(src->dtype), n = (size_t)src->n;
    for (int32_t l = 0; l < src->n_layer; l++)
        for (int32_t h = 0; h < src->n_head_kv; h++) {
            size_t s = pot_slot(src, l, h, 0), d = pot_slot(dst, l, h, 0);
            if (kv_here) {
                memcpy((char *)dst->k + d * row, (const char *)src->k + s * row, n * row);
                memcpy((char *)dst->v + d * row, (const char *)src->v + s * row, n * row);
            }
            memcpy(dst->token_index + d, src->token_index + s, n * sizeof *src->token_index);
            memcpy(dst->surprisal + d, src->surprisal + s, n * sizeof *src->surprisal);
            memcpy(dst->score_acc + d, src->score_acc + s, n * sizeof *src->score_acc);
            if (dst->k_rot && src->k_rot)
                memcpy((char *)dst->k_rot + d * row, (const char *)src->k_rot + s * row, (size_t)src->n_rot * row);
        }
    dst->n_rot = dst->k_rot && src->k_rot ? src->n_rot : 0;
    dst->n = src->n;
    dst->n_pinned = src->n_pinned;
    dst->n_seen = src->n_seen;
    dst->original_positions = src->original_positions;
    return 0;
}

int pot_compact(pot *p, const int32_t *keep, int32_t n_keep) {
    size_t row = (size_t)p->head_dim * elem_bytes(p->dtype);
    /* a device holding the K/V moves them there; the host moves the metadata */
    int kv_here = !p->device || p->device->compact(p->device, p, keep, n_keep);
    if (kv_here && pot_host_take(p)) return -1;
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            const int32_t *idx = keep + ((size_t)l * p->n_head_kv + h) * n_keep;
            size_t base = pot_slot(p, l, h, 0);
            /* idx is increasing, so idx[i] >= i: moving front to back never overwrites a
               slot still to be read */
            for (int32_t i = 0; i < n_keep; i++) {
                size_t from = base + (size_t)idx[i], to = base + (size_t)i;
                if (from == to) continue;
                if (kv_here) {
                    memcpy((char *)p->k + to * row, (const char *)p->k + from * row, row);
                    memcpy((char *)p->v + to * row, (const char *)p->v + from * row, row);
                }
                p->token_index[to] = p->token_index[from];
                p->surprisal[to] = p->surprisal[from];
                p->score_acc[to] = p->score_acc[from];
            }
        }
    p->n = n_keep;
    if (p->n_pinned > n_keep) p->n_pinned = n_keep;
    if (p->n_rot > p->n_pinned) p->n_rot = p->n_pinned; /* kept keys moved: their positions changed */
    return 0;
}

void pot_append_done(pot *p, int32_t n) {
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t g = 0; g < p->n_head_kv; g++)
            for (int32_t i = 0; i < n; i++) {
                size_t at = pot_slot(p, l, g, p->n + i);
                p->token_index[at] = p->n_seen + i;
                p->surprisal[at] = 0;
                p->score_acc[at] = 0;
            }
    p->n += n;
    p->n_seen += n;
}
