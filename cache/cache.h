/* Memory pots: the per-sequence KV store the engine reads and appends to.
 * Per layer and KV head, K (stored BEFORE RoPE: a slot's index is its RoPE
 * position, so entries can be re-packed after compaction without re-rotating)
 * and V, each [capacity][head_dim]; one shared count of valid slots; per slot
 * the original token index in the document. Nothing here knows which backend
 * runs. */
#ifndef POTSERVE_CACHE_H
#define POTSERVE_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct pot {
    int32_t n_layer, n_head_kv, head_dim;
    int32_t capacity;     /* slots per (layer, head) */
    int32_t n;            /* valid slots, shared by all layers and heads */
    int32_t n_pinned;     /* front slots never evicted (template prefix, system prompt) */
    float *k;             /* [n_layer][n_head_kv][capacity][head_dim], pre-RoPE */
    float *v;             /* same layout */
    int64_t *token_index; /* [capacity] index of the slot's token in the document */
    int64_t n_seen;       /* tokens of the document seen so far (next token_index) */
} pot;

/* Allocates an empty pot; NULL + err when sizes are invalid or memory is short.
 * The caller owns it (pot_free). */
pot *pot_new(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity, char *err,
             size_t errlen);
void pot_free(pot *p);
/* Bytes a pot of these sizes holds (for admission control), 0 on overflow. */
size_t pot_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t capacity);
/* Row of slot 0 of (layer, head); rows are head_dim floats, consecutive slots adjacent. */
float *pot_k(const pot *p, int32_t layer, int32_t head);
float *pot_v(const pot *p, int32_t layer, int32_t head);
/* Forgets every slot from n on (n <= p->n); used to drop a question's tokens. */
void pot_truncate(pot *p, int32_t n);
/* Copies the valid slots of src into dst (same sizes, dst->capacity >= src->n). */
int pot_copy(pot *dst, const pot *src);

#endif
