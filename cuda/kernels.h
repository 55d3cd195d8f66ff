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
/* The angles, as engine/cpu/rope.c computes them (rope_init): cs[pos][i] =
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
 * F16, BF16, Q4_0, Q4_1, Q8_0; rows row_bytes apart); the caller checks
 * tokens against n_vocab. Bit-identical to quant_dequantize_row. */
cudaError_t cuda_embed_rows(float *out, const void *table, uint32_t type, size_t row_bytes, int64_t n_embd,
                            const int32_t *tokens, int64_t n_tokens, cudaStream_t stream);
/* 1 if cuda_embed_rows and cuda_matvec take weights of this ggml type. */
int cuda_weight_type_supported(uint32_t type);

/* ---- matvec.cu: quantised matrix times a few activation rows (decode) ------------- */
/* y[t][r] = dot(weight row r, x[t]) for r < rows, t < n_x; weights [rows][cols]
 * of type (as cuda_embed_rows; quantised types need cols % 32 == 0), f32
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

#ifdef __cplusplus
}
#endif

#endif
