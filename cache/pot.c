/* Pot storage: one contiguous allocation per K and V so a (layer, head)'s
 * slots are adjacent. f16 entries use the compiler's _Float16 conversions
 * (IEEE round-to-nearest-even), which keeps this module free of engine code;
 * on x86 with F16C the same conversions run 8 at a time in hardware (the
 * software conversion was a fifth of decode time). */
#include "cache.h"

#include <stdatomic.h>
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
    /* every thread computes the same answer; atomic so that two first calls at once (two
       spans stored in parallel by a process's first forward) are no data race */
    static atomic_int known = -1;
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        k = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k;
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

/* Per slot beside its K and V rows: token index (8), surprisal (4), score (4), joins (1) */
enum { SLOT_META_BYTES = 8 + 4 + 4 + 1 };

size_t pot_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                 enum pot_dtype dtype) {
    if (n_layer <= 0 || n_head_kv <= 0 || head_dim <= 0 || capacity <= 0 || head_dim > 65536)
        return 0;
    size_t per_slot = 2 * elem_bytes(dtype) * (size_t)head_dim + SLOT_META_BYTES;
    size_t slots = (size_t)n_layer * (size_t)n_head_kv;
    if (slots > SIZE_MAX / (size_t)capacity) return 0;
    slots *= (size_t)capacity;
    return slots > SIZE_MAX / per_slot ? 0 : slots * per_slot;
}

/* Rows of a layer with this window: a ring when that is fewer than capacity, else 0. */
static int32_t ring_rows_for(const int32_t *window, int32_t layer, int32_t slack, int32_t capacity) {
    if (!window || window[layer] <= 0) return 0;
    int64_t rows = (int64_t)window[layer] - 1 + (slack > 0 ? slack : 0);
    return rows < 1 ? 1 : rows < capacity ? (int32_t)rows : 0;
}

size_t pot_windowed_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                          enum pot_dtype dtype, const int32_t *window, int32_t slack) {
    size_t all = pot_bytes(n_layer, n_head_kv, head_dim, capacity, dtype);
    for (int32_t l = 0; all && l < n_layer; l++) {
        int32_t rows = ring_rows_for(window, l, slack, capacity);
        if (rows) all -= (size_t)n_head_kv * (size_t)(capacity - rows) * 2 * elem_bytes(dtype) * (size_t)head_dim;
    }
    return all;
}

int32_t pot_ring_rows(const pot *p, int32_t layer) { return p->ring ? p->ring[layer] : 0; }

/* K/V rows of the pot: every slot of every (layer, head), but a ring's rows for a ring layer. */
static size_t kv_rows_total(const pot *p) {
    if (!p->layer_row0) return (size_t)p->n_layer * p->n_head_kv * p->capacity;
    int32_t last = p->n_layer - 1, rows = p->ring[last] ? p->ring[last] : p->capacity;
    return p->layer_row0[last] + (size_t)p->n_head_kv * rows;
}

size_t pot_memory(const pot *p) {
    size_t slots = (size_t)p->n_layer * p->n_head_kv * p->capacity;
    return kv_rows_total(p) * 2 * elem_bytes(p->dtype) * (size_t)p->head_dim + slots * SLOT_META_BYTES;
}

size_t pot_row(const pot *p, int32_t layer, int32_t head, int32_t slot) {
    if (!p->layer_row0) return pot_slot(p, layer, head, slot);
    int32_t rows = p->ring[layer];
    if (!rows) return p->layer_row0[layer] + (size_t)head * p->capacity + (size_t)slot;
    return p->layer_row0[layer] + (size_t)head * rows + (size_t)((p->ring_base + slot) % rows);
}

pot *pot_new(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
             enum pot_dtype dtype, char *err, size_t errlen) {
    return pot_new_windowed(n_layer, n_head_kv, head_dim, capacity, dtype, NULL, 0, err, errlen);
}

pot *pot_new_windowed(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                      enum pot_dtype dtype, const int32_t *window, int32_t slack, char *err, size_t errlen) {
    size_t bytes = pot_windowed_bytes(n_layer, n_head_kv, head_dim, capacity, dtype, window, slack);
    if (!bytes || (dtype != POT_F16 && dtype != POT_F32)) {
        snprintf(err, errlen, "pot: invalid size (%d layers, %d heads, dim %d, %d slots)", n_layer,
                 n_head_kv, head_dim, capacity);
        return NULL;
    }
    int any_ring = 0;
    for (int32_t l = 0; l < n_layer; l++) any_ring |= ring_rows_for(window, l, slack, capacity) != 0;
    pot *p = calloc(1, sizeof *p);
    size_t slots = (size_t)n_layer * n_head_kv * capacity;
    int rings_ok = 1;
    if (p && any_ring) {
        p->ring = calloc((size_t)n_layer, sizeof *p->ring);
        p->ring_oldest = calloc((size_t)n_layer, sizeof *p->ring_oldest);
        p->layer_row0 = calloc((size_t)n_layer, sizeof *p->layer_row0);
        rings_ok = p->ring && p->ring_oldest && p->layer_row0;
        for (int32_t l = 0, row = 0; rings_ok && l < n_layer; l++) {
            p->ring[l] = ring_rows_for(window, l, slack, capacity);
            p->layer_row0[l] = (size_t)row;
            row += n_head_kv * (p->ring[l] ? p->ring[l] : capacity);
        }
    }
    if (p) {
        p->n_layer = n_layer;
        p->n_head_kv = n_head_kv;
        p->capacity = capacity;
    }
    size_t rows = p && rings_ok ? kv_rows_total(p) : 0;
    if (p && rings_ok) {
        p->k = malloc(rows * head_dim * elem_bytes(dtype));
        p->v = malloc(rows * head_dim * elem_bytes(dtype));
        p->token_index = malloc(slots * sizeof *p->token_index);
        p->surprisal = calloc(slots, sizeof *p->surprisal);
        p->score_acc = calloc(slots, sizeof *p->score_acc);
        p->joins = calloc(slots, sizeof *p->joins);
    }
    if (!p || !rings_ok || !p->k || !p->v || !p->token_index || !p->surprisal || !p->score_acc ||
        !p->joins) {
        pot_free(p);
        snprintf(err, errlen, "pot: out of memory for %zu bytes", bytes);
        return NULL;
    }
    p->head_dim = head_dim;
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
    p->k_rot = malloc(kv_rows_total(p) * p->head_dim * elem_bytes(p->dtype)); /* (ring layers: unused) */
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
    free(p->joins);
    free(p->ring);
    free(p->ring_oldest);
    free(p->layer_row0);
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
    size_t s = pot_row(p, layer, head, slot);
    store_row(p, p->k, s, k);
    store_row(p, p->v, s, v);
    int32_t rows = pot_ring_rows(p, layer);
    if (rows && slot - rows + 1 > p->ring_oldest[layer]) p->ring_oldest[layer] = slot - rows + 1;
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

/* n consecutive slots of (layer, head) from base (k, v or k_rot) as f32 rows:
 * one run for a layer that keeps every slot, row by row around a ring, whose
 * overwritten slots read as zeros (they lie outside every window: masked). */
static void read_slots(const pot *p, const void *base, int32_t layer, int32_t head, int32_t slot0, int32_t n,
                       float *dst) {
    if (!pot_ring_rows(p, layer)) {
        load_rows(p, base, pot_row(p, layer, head, slot0), n, dst);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        float *row = dst + (size_t)i * p->head_dim;
        if (slot0 + i < p->ring_oldest[layer]) memset(row, 0, (size_t)p->head_dim * sizeof *row);
        else load_rows(p, base, pot_row(p, layer, head, slot0 + i), 1, row);
    }
}

void pot_write_k_rotated(pot *p, int32_t layer, int32_t head, int32_t slot, const float *k) {
    store_row(p, p->k_rot, pot_row(p, layer, head, slot), k);
}

void pot_read_k_rotated(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst) {
    read_slots(p, p->k_rot, layer, head, slot0, n, dst);
}

void pot_read_k(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst) {
    read_slots(p, p->k, layer, head, slot0, n, dst);
}

void pot_read_v(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst) {
    read_slots(p, p->v, layer, head, slot0, n, dst);
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

/* Layer l's K/V of (l, h) from src's valid slots into dst's: one run between
 * layers that keep every slot, else slot by slot from the oldest slot both
 * hold; a dst that keeps every slot gets zeros below it (slots outside every
 * window, never attended). Sets dst's oldest slot of a ring layer. */
static void copy_layer_rows(pot *dst, const pot *src, int32_t l, int32_t h) {
    size_t row = (size_t)src->head_dim * elem_bytes(src->dtype);
    int32_t n = src->n, src_ring = pot_ring_rows(src, l), dst_ring = pot_ring_rows(dst, l);
    if (!src_ring && !dst_ring) {
        memcpy((char *)dst->k + pot_row(dst, l, h, 0) * row, (const char *)src->k + pot_row(src, l, h, 0) * row, n * row);
        memcpy((char *)dst->v + pot_row(dst, l, h, 0) * row, (const char *)src->v + pot_row(src, l, h, 0) * row, n * row);
        return;
    }
    int32_t from = src_ring ? src->ring_oldest[l] : 0;
    if (dst_ring && n - dst_ring > from) from = n - dst_ring;
    if (from > n) from = n;
    if (dst_ring) dst->ring_oldest[l] = from;
    for (int32_t s = 0; s < n; s++) {
        char *dk = (char *)dst->k + pot_row(dst, l, h, s) * row, *dv = (char *)dst->v + pot_row(dst, l, h, s) * row;
        if (s >= from) {
            memcpy(dk, (const char *)src->k + pot_row(src, l, h, s) * row, row);
            memcpy(dv, (const char *)src->v + pot_row(src, l, h, s) * row, row);
        } else if (!dst_ring) {
            memset(dk, 0, row);
            memset(dv, 0, row);
        }
    }
}

int pot_copy(pot *dst, const pot *src) {
    if (dst->n_layer != src->n_layer || dst->n_head_kv != src->n_head_kv ||
        dst->head_dim != src->head_dim || dst->dtype != src->dtype || dst->capacity < src->n)
        return -1;
    /* K/V copied on the device that holds src when it can, else through the host
       (pots with ring layers never live on a device) */
    int rings = src->ring || dst->ring;
    int kv_here = rings || !src->device || !src->device->copy || src->device->copy(src->device, dst, src);
    if (kv_here && pot_host_sync(src)) return -1;
    if (kv_here && dst->device) dst->device->release(dst->device, dst);
    if (kv_here) dst->ring_base = 0;
    size_t row = (size_t)src->head_dim * elem_bytes(src->dtype), n = (size_t)src->n;
    int copy_rot = dst->k_rot && src->k_rot && !rings;
    for (int32_t l = 0; l < src->n_layer; l++)
        for (int32_t h = 0; h < src->n_head_kv; h++) {
            size_t s = pot_slot(src, l, h, 0), d = pot_slot(dst, l, h, 0);
            if (kv_here) copy_layer_rows(dst, src, l, h);
            memcpy(dst->token_index + d, src->token_index + s, n * sizeof *src->token_index);
            memcpy(dst->surprisal + d, src->surprisal + s, n * sizeof *src->surprisal);
            memcpy(dst->score_acc + d, src->score_acc + s, n * sizeof *src->score_acc);
            memcpy(dst->joins + d, src->joins + s, n * sizeof *src->joins);
            if (copy_rot)
                memcpy((char *)dst->k_rot + pot_row(dst, l, h, 0) * row,
                       (const char *)src->k_rot + pot_row(src, l, h, 0) * row, (size_t)src->n_rot * row);
        }
    dst->n_rot = copy_rot ? src->n_rot : 0;
    dst->n = src->n;
    dst->n_pinned = src->n_pinned;
    dst->n_seen = src->n_seen;
    dst->original_positions = src->original_positions;
    return 0;
}

/* 1 when every ring layer's keep list is its newest n_keep slots. */
static int rings_keep_newest(const pot *p, const int32_t *keep, int32_t n_keep) {
    for (int32_t l = 0; p->ring && l < p->n_layer; l++)
        for (int32_t h = 0; p->ring[l] && h < p->n_head_kv; h++)
            for (int32_t i = 0; i < n_keep; i++)
                if (keep[((size_t)l * p->n_head_kv + h) * n_keep + i] != p->n - n_keep + i) return 0;
    return 1;
}

int pot_compact(pot *p, const int32_t *keep, int32_t n_keep) {
    if (!rings_keep_newest(p, keep, n_keep)) return -1;
    size_t row = (size_t)p->head_dim * elem_bytes(p->dtype);
    /* a device holding the K/V moves them there; the host moves the metadata */
    int kv_here = !p->device || p->device->compact(p->device, p, keep, n_keep);
    if (kv_here && pot_host_take(p)) return -1;
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++) {
            const int32_t *idx = keep + ((size_t)l * p->n_head_kv + h) * n_keep;
            size_t base = pot_slot(p, l, h, 0);
            /* idx is increasing, so idx[i] >= i: moving front to back never overwrites a
               slot still to be read; a ring's rows stay (ring_base moves below) */
            for (int32_t i = 0; i < n_keep; i++) {
                size_t from = base + (size_t)idx[i], to = base + (size_t)i;
                if (from == to) continue;
                if (kv_here && !pot_ring_rows(p, l)) {
                    size_t rf = pot_row(p, l, h, idx[i]), rt = pot_row(p, l, h, i);
                    memcpy((char *)p->k + rt * row, (const char *)p->k + rf * row, row);
                    memcpy((char *)p->v + rt * row, (const char *)p->v + rf * row, row);
                }
                p->token_index[to] = p->token_index[from];
                p->surprisal[to] = p->surprisal[from];
                p->score_acc[to] = p->score_acc[from];
                p->joins[to] = p->joins[from];
            }
        }
    if (p->ring) { /* a ring layer's newest slots move down by the dropped count: their rows stay */
        int32_t dropped = p->n - n_keep;
        p->ring_base += dropped;
        for (int32_t l = 0; l < p->n_layer; l++)
            p->ring_oldest[l] = p->ring_oldest[l] > dropped ? p->ring_oldest[l] - dropped : 0;
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
                p->joins[at] = 0;
            }
    p->n += n;
    p->n_seen += n;
}
