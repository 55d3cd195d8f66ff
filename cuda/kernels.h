/* The CUDA kernels' C entry points (private to cuda/ and its tests). Pointers
 * are device pointers unless a comment says host; each call enqueues its work
 * on `stream` and returns cudaSuccess or the launch error (cudaErrorInvalidValue
 * for arguments the kernel cannot take, checked before launching). Nothing
 * here allocates. Every kernel has a CPU reference: the engine's own code
 * where it exports one (quant_dequantize_row, quant_dot_row, rope_rotate,
 * pot_read_k, pot_select), else a *_ref function beside the kernel that
 * repeats engine/cpu/cpu_backend.c's arithmetic (host pointers). */
#ifndef POTSERVE_CUDA_KERNELS_H
#define POTSERVE_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- rmsnorm.cu: row-wise RMS normalisation, f32 -------------------------------- */
/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of n floats (out may be x). */
cudaError_t cuda_rmsnorm_f32(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps,
                             cudaStream_t stream);
/* The residual step fused with the next norm: x[r] += delta[r] (x updated in
 * place), then out[r] = rmsnorm(x[r]) * w. out must not alias x or delta. */
cudaError_t cuda_add_rmsnorm_f32(float *out, float *x, const float *delta, const float *w, int64_t rows, int64_t n,
                                 float eps, cudaStream_t stream);
void cuda_rmsnorm_ref(float *out, const float *x, const float *w, int64_t rows, int64_t n, float eps);

/* ---- elementwise.cu ---------------------------------------------------------------- */
/* gate[i] = silu(gate[i]) * up[i] (the FFN's SwiGLU), i < n. */
cudaError_t cuda_swiglu_f32(float *gate, const float *up, int64_t n, cudaStream_t stream);
/* y[i] += x[i], i < n (the residual add). */
cudaError_t cuda_add_f32(float *y, const float *x, int64_t n, cudaStream_t stream);
/* y[r][i] += bias[i] for rows of n (qwen2's Q/K/V biases). */
cudaError_t cuda_add_bias_f32(float *y, const float *bias, int64_t rows, int64_t n, cudaStream_t stream);
void cuda_swiglu_ref(float *gate, const float *up, int64_t n);

/* ---- rope.cu: rotary embedding by position ----------------------------------------- */
/* The angles, as engine/rope.c computes them (rope_init): cs[pos][i] =
 * (cos, sin) of pos * inv_freq[i] rounded to f32 for pos < n_table; beyond the
 * table the kernels compute them in double from inv_freq, as rope_rotate does.
 * layout: 0 rotates pairs (2i, 2i+1) (llama), 1 pairs (i, i + n_rot/2) (neox,
 * qwen2), the values of enum rope_layout. Device arrays; the struct itself is
 * read on the host. */
typedef struct cuda_rope {
    int32_t n_rot, layout;
    int64_t n_table;
    const float *cs;        /* [n_table][n_rot / 2][2] */
    const double *inv_freq; /* [n_rot / 2] */
} cuda_rope;
/* Rotates x, [n_tokens][n_heads][head_dim], in place: token t to position
 * pos[t], or pos0 + t when pos is NULL (a span's queries). */
cudaError_t cuda_rope_f32(float *x, int64_t n_tokens, int32_t n_heads, int32_t head_dim, const int32_t *pos,
                          int32_t pos0, const cuda_rope *rope, cudaStream_t stream);
/* Reads keys (or values) of one layer of a pot, stored [n_head_kv][capacity]
 * [head_dim] in dtype (enum pot_dtype: 0 f16, 1 f32) before RoPE, as f32 rows
 * out[g][k] for k < n_keys: slot slots[g * n_keys + k], or k when slots is
 * NULL; rotated to the slot's position when rope is not NULL (keys). */
cudaError_t cuda_pot_load_f32(float *out, const void *pot_layer, int32_t dtype, int32_t capacity, int32_t n_head_kv,
                              int32_t head_dim, const int32_t *slots, int32_t n_keys, const cuda_rope *rope,
                              cudaStream_t stream);

/* ---- embed.cu: token embeddings ---------------------------------------------------- */
/* out[t] = dequantised row tokens[t] of a [n_vocab][n_embd] table of type (F32,
 * F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: every
 * type engine/quant.c dequantises; rows row_bytes apart, whole blocks of 32
 * or 256); the caller checks tokens against n_vocab. Bit-identical to
 * quant_dequantize_row. */
cudaError_t cuda_embed_rows(float *out, const void *table, uint32_t type, size_t row_bytes, int64_t n_embd,
                            const int32_t *tokens, int64_t n_tokens, cudaStream_t stream);
/* 1 if cuda_embed_rows and cuda_matvec take weights of this ggml type. */
int cuda_weight_type_supported(uint32_t type);

/* ---- matvec.cu: quantised matrix times a few activation rows (decode) ------------- */
/* y[t][r] = dot(weight row r, x[t]) for r < rows, t < n_x; weights [rows][cols]
 * of type (as cuda_embed_rows), f32
 * activations x [n_x][cols]. Agrees with quant_dot_row (the exact CPU path)
 * to float rounding. */
cudaError_t cuda_matvec(float *y, const void *w, uint32_t type, size_t row_bytes, int64_t rows, int64_t cols,
                        const float *x, int64_t n_x, cudaStream_t stream);

/* ---- softmax.cu: softmax and log-sum-exp per row ---------------------------------- */
typedef struct cuda_softmax_rows {
    const float *x; /* [rows] rows of n logits, x_stride apart */
    int64_t x_stride, rows, n;
    float scale;            /* applied to x first (attention's 1/sqrt(head_dim)) */
    int32_t causal_offset;  /* >= 0: row r sees columns < causal_offset + r + 1 only; -1: all */
    float *probs;           /* optional [rows] rows, probs_stride apart; masked columns get 0 */
    int64_t probs_stride;
    float *lse;             /* optional [rows]: log sum_j exp(scale * x[r][j]) over seen columns */
    const int32_t *labels;  /* optional [rows]: with label_logprob, label_logprob[r] = */
    float *label_logprob;   /*   scale * x[r][labels[r]] - lse[r] for labels[r] in [0, n) */
} cuda_softmax_rows;
cudaError_t cuda_softmax_lse_f32(const cuda_softmax_rows *a, cudaStream_t stream);
void cuda_softmax_lse_ref(const cuda_softmax_rows *a);

/* ---- topk.cu: per-row top-k selection, cache/policy.c's rules ------------------------ */
/* kept[r][s] = s < n_pinned for s < n, rows of kept_stride bytes. */
cudaError_t cuda_kept_init(uint8_t *kept, int64_t kept_stride, int32_t rows, int32_t n, int32_t n_pinned,
                           cudaStream_t stream);
/* policy.c's take_best, per row: marks the best-valued unmarked slots of [from,
 * n) until the row holds `target` marked slots of [0, n) (or no candidate is
 * left). Higher value first, NaN as -inf, ties to the lower slot: the same
 * slots pot_select picks. values [rows] rows of values_stride floats. */
cudaError_t cuda_topk_fill(const float *values, int64_t values_stride, uint8_t *kept, int64_t kept_stride,
                           int32_t rows, int32_t from, int32_t n, int32_t target, cudaStream_t stream);
/* keep[r * n_keep + i] = the i-th marked slot of row r, increasing (the first
 * n_keep marked ones; a row with fewer leaves the rest untouched). */
cudaError_t cuda_kept_to_slots(const uint8_t *kept, int64_t kept_stride, int32_t rows, int32_t n, int32_t n_keep,
                               int32_t *keep, cudaStream_t stream);

/* ---- dequant.cu: weights to f32, K/V into a pot layer on the device ------------------ */
/* out[r][c] = element c of weight row r, r < rows, c < cols (types as
 * cuda_embed_rows): the f32 copy cuBLAS multiplies. Bit-identical to
 * quant_dequantize_row. */
cudaError_t cuda_dequantize_rows(float *out, const void *w, uint32_t type, size_t row_bytes, int64_t rows,
                                 int64_t cols, cudaStream_t stream);
/* The same as IEEE f16 (round to nearest even): the operand of the fast
 * (exact = 0) prefill GEMMs, f16 inputs with f32 accumulation on tensor
 * cores. The reference is cuda_dequantize_rows rounded to f16. */
cudaError_t cuda_dequantize_rows_f16(void *out, const void *w, uint32_t type, size_t row_bytes, int64_t rows,
                                     int64_t cols, cudaStream_t stream);
/* out[i] = x[i] rounded to f16, i < n (the GEMMs' activation operand). */
cudaError_t cuda_f32_to_f16(void *out, const float *x, int64_t n, cudaStream_t stream);
/* Stores n new slots of one pot layer ([n_head_kv][capacity][head_dim] of
 * dtype, 0 f16 / 1 f32, K before RoPE): slot slot0 + i of head g gets
 * k[i][g * head_dim ...] (and v likewise), k and v [n][n_head_kv * head_dim]
 * f32, converted as pot_write does (f16: round to nearest even). */
cudaError_t cuda_pot_store(void *k_layer, void *v_layer, int32_t dtype, int32_t capacity, int32_t n_head_kv,
                           int32_t head_dim, const float *k, const float *v, int32_t slot0, int32_t n,
                           cudaStream_t stream);

/* ---- potops.cu: pot compaction on the device ------------------------------------- */
/* dst row r, slot i = src row r, slot keep[r * n_keep + i] for i < n_keep and
 * r < rows: rows (layer, KV head) of capacity slots of slot_bytes (even)
 * each, the layout of a pot's K or V array. dst must not be src (the gather
 * is parallel); keep holds device ints < capacity. cache/pot.c's
 * pot_compact is the reference (the same bytes moved on the host). */
cudaError_t cuda_pot_gather(void *dst, const void *src, int64_t rows, int32_t capacity, size_t slot_bytes,
                            const int32_t *keep, int32_t n_keep, cudaStream_t stream);

/* ---- attention.cu: attention of a span over [pot keys | span keys] ---------------- */
/* One span, one layer. Keys: the pot's n_pre attended slots (slots[g][i], or
 * slot i when slots is NULL), then the span's own n_q tokens at slots n0 ..
 * n0 + n_q - 1 (already stored in the pot layer: cuda_pot_store). Keys are read
 * before RoPE and rotated to their slot's position (then rounded to the pot's
 * entry precision, as the CPU backend attends); query t (rotated to
 * position n0 + t by the caller) sees keys k < n_pre + t + 1 (causal). Query
 * head h uses KV head h / (n_head / n_head_kv). */
typedef struct cuda_attn {
    const float *q;        /* [n_q][n_head][head_dim] */
    float *out;            /* [n_q][n_head][head_dim]: softmax(scale q.k) . v */
    float *lse;            /* optional [n_head][n_q]: log sum_k exp(scale q.k), for cuda_attention_scores */
    const void *k, *v;     /* one pot layer, [n_head_kv][capacity][head_dim] of dtype */
    int32_t dtype, capacity, n_head, n_head_kv, head_dim;
    const int32_t *slots;  /* optional [n_head_kv][n_pre], each < n0 (partial attention) */
    int32_t n_pre, n0, n_q;
    float scale;           /* 1 / sqrt(head_dim) */
    const int32_t *slot_pos; /* optional [n_head_kv][capacity]: the RoPE position of each slot (slots
                                below n0 + n_q), pot_rope_pos's; NULL: the slot itself (context reset) */
} cuda_attn;
/* Splits of the key range cuda_attention_f32 is best given (1 for prefill,
 * more for a single query over a long pot: split-K decoding). */
int32_t cuda_attention_splits(int32_t n_q, int32_t n_keys);
/* Floats of the partial-results scratch for n_split > 1 (0 for 1). */
size_t cuda_attention_scratch_floats(int32_t n_q, int32_t n_head, int32_t head_dim, int32_t n_split);
/* Tiled online-softmax attention (flash style: key tiles in shared memory,
 * running max and sum per query, one warp per (query, head) of a KV group).
 * With n_split > 1 each split of the key range writes a partial (max, sum,
 * unnormalised output) to scratch and a second pass combines them. */
cudaError_t cuda_attention_f32(const cuda_attn *a, const cuda_rope *rope, int32_t n_split, float *scratch,
                               cudaStream_t stream);
/* Attention received by each key from query rows [row0, row0 + n_rows): per
 * query head, the sum over those rows of the exact probabilities
 * exp(scale q.k - lse) (a->lse from cuda_attention_f32), row r's weighted by
 * row_weight[r - row0] when row_weight (device memory, [n_rows]: the
 * cascade's row weights) is not NULL, then combined over the heads of each
 * KV group in head order (combine bit 0: their max, not their sum; bit 1:
 * each head's max over the rows, not their sum: backend_span.score_rows_max), as
 * engine/cpu/cpu_backend.c's store_scores: scores [n_head_kv][n_pre + n_q]. */
cudaError_t cuda_attention_scores(const cuda_attn *a, const cuda_rope *rope, int32_t row0, int32_t n_rows,
                                  const float *row_weight, int32_t combine, float *scores, cudaStream_t stream);
/* Batched decode: one launch for many single-token spans, each over its own
 * pot (the same dtype for all). Per span, in device memory, so that a
 * captured CUDA graph replays with the values of the step: */
typedef struct cuda_attn_desc {
    int32_t t;            /* the span's row in q and out */
    int32_t n0;           /* its token's slot (= position; its K/V already stored there) */
    int32_t n_pre;        /* pot keys before it: slots 0..n_pre-1, or slots[] */
    int32_t capacity;     /* of the pot */
    const void *k, *v;    /* the pot's whole K and V arrays, [n_layer][n_head_kv][capacity][head_dim] */
    const int32_t *slots; /* optional [n_layer][n_head_kv][n_pre], each < n0 (partial attention) */
} cuda_attn_desc;
typedef struct cuda_attn_batch {
    const cuda_attn_desc *desc; /* device [n_spans] */
    int32_t n_spans, layer, dtype, n_head, n_head_kv, head_dim;
    const float *q; /* [rows][n_head][head_dim], rotated */
    float *out;     /* same layout */
    float scale;
} cuda_attn_batch;
/* The grid splits for spans of at most max_keys keys (each span uses
 * ceil(keys / 256) of them, at most this many; a graph is captured per
 * value, so the caller may round max_keys up to a bucket). */
int32_t cuda_attention_batch_splits(int32_t max_keys);
size_t cuda_attention_batch_scratch_floats(int32_t n_spans, int32_t n_head, int32_t head_dim, int32_t grid_splits);
/* Attention of every span's token over its pot keys and itself, as
 * cuda_attention_f32 with n_q = 1 per span (the same kernel body). */
cudaError_t cuda_attention_batch_f32(const cuda_attn_batch *b, const cuda_rope *rope, int32_t grid_splits,
                                     float *scratch, cudaStream_t stream);
/* Stores the new K/V row of every span of a batch into its pot at slot n0 of
 * layer `layer` (as cuda_pot_store: k and v rows [rows][n_head_kv * head_dim]
 * f32, row desc[s].t for span s). */
cudaError_t cuda_pot_store_batch(const cuda_attn_desc *desc, int32_t n_spans, int32_t layer, int32_t dtype,
                                 int32_t n_head_kv, int32_t head_dim, const float *k, const float *v,
                                 cudaStream_t stream);
/* The CPU backend's attention for the same arguments on host memory: keys
 * from a host pot layer rotated with the host rope (rope_rotate's
 * arithmetic), softmax with a double sum; out, lse as above, and scores
 * (when not NULL) as cuda_attention_scores. */
void cuda_attention_ref(const cuda_attn *a, const cuda_rope *host_rope, int32_t row0, int32_t n_rows,
                        const float *row_weight, int32_t combine, float *scores);

#ifdef __cplusplus
}
#endif

#endif
