/* The one interface every compute backend implements (CPU in engine/cpu/,
 * CUDA in cuda/): a forward pass over a batch of token spans, each appending
 * to its own pot, returning the logits and the attention scores the caller
 * asks for. Pots keep K before RoPE; a backend rotates keys by slot index. */
#ifndef POTSERVE_BACKEND_H
#define POTSERVE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"

struct model;

enum backend_logits {
    BACKEND_LOGITS_NONE = 0,
    BACKEND_LOGITS_LAST = 1, /* one row: the span's last token */
    BACKEND_LOGITS_ALL = 2,  /* one row per token of the span */
};

enum backend_score_combine {
    BACKEND_SCORE_SUM = 0, /* sum over the query heads of a KV group (default) */
    BACKEND_SCORE_MAX = 1,
};

typedef struct backend_span {
    const int32_t *tokens;
    int32_t n_tokens;
    pot *kv; /* the span's tokens go to slots kv->n ... kv->n + n_tokens - 1 (their RoPE
                positions); kv->n advances; needs kv->capacity >= kv->n + n_tokens */
    enum backend_logits logits_mode;
    float *logits; /* [1 or n_tokens][n_vocab], written when logits_mode != NONE */
    /* When non-NULL, the final-normed hidden states (what the LM head reads)
     * of rows [hidden_row0, hidden_row0 + n_hidden_rows) are added to
     * hidden_sum[n_embd]: pooled embeddings. */
    float *hidden_sum;
    int32_t hidden_row0, n_hidden_rows;
    /* Attention scores, when scores != NULL: for query rows [score_row0,
     * score_row0 + n_score_rows) of this span, the softmax probabilities over
     * every key (pot slots, then this span's tokens: n_keys = kv->n before the
     * call + n_tokens), summed over those rows (or their max, score_rows_max) and combined over the query
     * heads of each KV group. Written as [n_layer][n_head_kv][n_keys]. */
    int32_t score_row0, n_score_rows;
    enum backend_score_combine score_combine;
    int score_rows_max; /* the rows combined by their max instead of their sum (KVzip) */
    float *scores;
    /* Optional [n_score_rows] weight of each score row in that sum (NULL: 1
     * each): the cascade's geometric row weights (Cascading KV Cache). */
    const float *score_row_weight;
    /* Label log-probabilities, when labels != NULL: for each row t with
     * labels[t] >= 0, label_logprob[t] = log p(labels[t] | tokens up to t)
     * from that row's logits (the LM head runs for those rows only; NuC's
     * surprisal is its negation). Rows with labels[t] < 0 are left alone. */
    const int32_t *labels;
    float *label_logprob;
    /* Partial attention (the Recycled Attention paper), when attend_slots !=
     * NULL: every (layer, KV head) attends only over the pot slots
     * attend_slots[(layer * n_head_kv + head) * n_attend + i], i < n_attend
     * (increasing, < kv->n), plus this span's own tokens. Not combinable with
     * scores. */
    const int32_t *attend_slots;
    int32_t n_attend;
    /* A prompt's piece, however short, not a decoding step: a one-token span
     * is otherwise taken for a decoding token (its attention over a long pot
     * summed in key ranges, batched with the others), which rounds apart from
     * a piece of two, so that where a prompt's pieces were cut (alone, after
     * a prompt-cache hit, beside another request) would change its answer. */
    int prefill;
} backend_span;

typedef struct backend backend;
struct backend {
    const char *name;
    /* Runs the spans (any mix of lengths and pots; each pot at most once).
     * Returns 0, or -1 with one line in err (pots unchanged then). */
    int (*forward)(backend *b, backend_span *spans, int32_t n_spans, char *err, size_t errlen);
    void (*free)(backend *b);
    /* NULL when pots live in host memory; else the bytes of device memory
     * pots may take in all (admission control counts pot_bytes against it). */
    size_t (*pot_memory)(backend *b);
    /* NULL, or runs fn over [0, n) split across the backend's host threads
     * and waits (the engine's per-sequence work between forwards, e.g.
     * sampling, then does not run on one thread while the others wait). */
    void (*parallel_for)(backend *b, int64_t n, void (*fn)(void *ctx, int64_t begin, int64_t end, int worker),
                         void *ctx);
};

/* Validates a forward's spans against model m (engine/backend.c; every
 * backend calls it first): 0 with the total tokens in *T and the most keys a
 * span attends over in *max_keys, or -1 with one line in err. */
int backend_check_spans(const struct model *m, const backend_span *spans, int32_t n_spans,
                        int64_t *T, int64_t *max_keys, char *err, size_t errlen);

/* The CPU backend with n_threads worker threads (>= 1); the model must
 * outlive it. exact = 1 multiplies f32 activations with dequantised weights
 * (the plain-math reference); exact = 0 quantises activations per block the
 * way llama.cpp does and uses integer dot products (faster, and the numerics
 * llama.cpp users know). NULL + err on failure. */
backend *cpu_backend_new(const struct model *m, int n_threads, int exact, char *err, size_t errlen);

#endif
