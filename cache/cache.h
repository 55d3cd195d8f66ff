/* Memory pots: the per-sequence KV store the engine reads and appends to.
 * Per layer and KV head, K (stored BEFORE RoPE: a slot's index is its RoPE
 * position, so entries can be re-packed after compaction without re-rotating)
 * and V, each [capacity][head_dim], in f16 (default) or f32; one shared count
 * of valid slots. Per (layer, head, slot): the original token index in the
 * document, its surprisal (NuC) and an accumulated attention score (H2O);
 * heads select independently, so these differ between heads.
 * Nothing here knows which backend runs. */
#ifndef POTSERVE_CACHE_H
#define POTSERVE_CACHE_H

#include <stddef.h>
#include <stdint.h>

enum pot_dtype { POT_F16 = 0, POT_F32 = 1 };

typedef struct pot {
    int32_t n_layer, n_head_kv, head_dim;
    int32_t capacity;     /* slots per (layer, head) */
    int32_t n;            /* valid slots, shared by all layers and heads */
    int32_t n_pinned;     /* front slots never evicted (template prefix, system prompt) */
    enum pot_dtype dtype;
    void *k, *v;          /* [n_layer][n_head_kv][capacity][head_dim] of dtype, K pre-RoPE */
    int64_t *token_index; /* [n_layer][n_head_kv][capacity] index of the slot's token in the document */
    float *surprisal;     /* same layout: -log p(token | what preceded it when it was read) */
    float *score_acc;     /* same layout: attention received so far (policies that accumulate) */
    int64_t n_seen;       /* tokens of the document seen so far (the next token index) */
} pot;

/* Allocates an empty pot; NULL + err when sizes are invalid or memory is short.
 * The caller owns it (pot_free). */
pot *pot_new(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
             enum pot_dtype dtype, char *err, size_t errlen);
void pot_free(pot *p);
/* Bytes a pot of these sizes holds (for admission control), 0 on overflow. */
size_t pot_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity,
                 enum pot_dtype dtype);
/* Index of (layer, head, slot) in the per-slot arrays. */
size_t pot_slot(const pot *p, int32_t layer, int32_t head, int32_t slot);

/* Stores one slot's pre-RoPE key and value (head_dim floats each), converting
 * to the pot's dtype. */
void pot_write(pot *p, int32_t layer, int32_t head, int32_t slot, const float *k, const float *v);
/* Reads n consecutive slots from slot0 as f32 rows into dst ([n][head_dim]). */
void pot_read_k(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst);
void pot_read_v(const pot *p, int32_t layer, int32_t head, int32_t slot0, int32_t n, float *dst);

/* Forgets every slot from n on (n <= p->n); used to drop a question's tokens. */
void pot_truncate(pot *p, int32_t n);
/* Copies the valid slots of src into dst (same shape and dtype, dst->capacity >= src->n). */
int pot_copy(pot *dst, const pot *src);

/* Keeps, in every (layer, head), the n_keep slots listed in
 * keep[(layer * n_head_kv + head) * n_keep + i] (strictly increasing, < p->n),
 * moving them to slots 0..n_keep-1 in that order; p->n becomes n_keep. Slot
 * index is the RoPE position, so kept keys are re-positioned by this move. */
void pot_compact(pot *p, const int32_t *keep, int32_t n_keep);

#endif
