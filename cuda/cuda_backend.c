/* The CUDA backend: engine/backend.h's forward pass on the GPU, step for step
 * the CPU reference (engine/cpu/cpu_backend.c) with the kernels of
 * cuda/kernels/ and cuBLAS.
 *
 * Per forward: token embeddings for all spans' tokens at once; per layer RMS
 * norm, the Q/K/V products over all tokens (matvec on the quantised weights
 * for up to MATVEC_MAX_T tokens, else the weight dequantised (f32 exact, f16
 * fast) and cublasGemmEx), biases, every query rotated to its slot; the
 * single-token spans (decode) in one batched launch that stores their K/V
 * and attends each over its own pot; every other span its K/V stored (before
 * RoPE) into its pot on the device, attention over [pot | span] (flash-style
 * kernel, split-K for a single query over a long pot) and the score rows
 * when asked; then the output product, residual, FFN (SwiGLU), residual.
 * Finally logits and label log-probabilities for the rows asked for, copied
 * to the spans' arrays. Everything runs in order on one stream; the host
 * waits once at the end (and per chunk of label rows). A forward of decode
 * tokens only computes every row's logits in its body and runs that body as
 * a CUDA graph (cuda_graph.c).
 *
 * Pots live in device memory (cuda_pots.c): a span's pot is attached on its
 * first forward (its valid slots uploaded once) and from then on the new
 * K/V are written on the device only; the host's copy is synced when host
 * code reads it, compaction gathers on the device. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "cuda/cuda_backend.h"
#include "cuda/cuda_internal.h"
#include "cuda/kernels.h"
#include "engine/backend.h"
#include "engine/rope.h"
#include "engine/model.h"
#include "engine/quant.h"

enum {
    MATVEC_MAX_T = 16,   /* up to this many tokens the products read the quantised weights: a
                            decode batch of 16 reads the weights twice (matvec.cu groups 8 rows)
                            instead of writing and reading them as f32 for cuBLAS */
    LOGIT_ROWS = 64,     /* rows of logits computed at once */
    WBUF_MIN = 1 << 22,  /* floats of the dequantisation buffer at least (16 MiB) */
};

/* ---- errors --------------------------------------------------------------------- */

#define CK(call)                                                                             \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            snprintf(err, errlen, "cuda backend: %s: %s", #call, cudaGetErrorString(e_));   \
            goto fail;                                                                       \
        }                                                                                    \
    } while (0)

/* ---- device memory ----------------------------------------------------------------- */

static int track(cuda_backend *cb, void *p) {
    if (cb->n_allocs == cb->cap_allocs) {
        size_t cap = cb->cap_allocs ? 2 * cb->cap_allocs : 64;
        void **a = realloc(cb->allocs, cap * sizeof *a);
        if (!a) return -1;
        cb->allocs = a;
        cb->cap_allocs = cap;
    }
    cb->allocs[cb->n_allocs++] = p;
    return 0;
}

/* A device copy of host bytes, owned by the backend; NULL on failure. */
static void *upload(cuda_backend *cb, const void *host, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 1) != cudaSuccess) return NULL;
    if (track(cb, d) || (bytes && cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)) return NULL;
    return d;
}

static int upload_weight(cuda_backend *cb, const weight *w, dev_weight *dw, char *err, size_t errlen) {
    if (!cuda_weight_type_supported(w->type)) {
        snprintf(err, errlen, "cuda backend: weights of type %s are not supported", quant_type_name(w->type));
        return -1;
    }
    dw->type = w->type;
    dw->rows = w->rows;
    dw->cols = w->cols;
    dw->row_bytes = w->row_bytes;
    dw->data = upload(cb, w->data, (size_t)w->rows * w->row_bytes);
    if (!dw->data) {
        snprintf(err, errlen, "cuda backend: out of device memory for the weights");
        return -1;
    }
    return 0;
}

static float *upload_vec(cuda_backend *cb, const float *v, int64_t n) {
    return v ? upload(cb, v, (size_t)n * sizeof(float)) : NULL;
}

static size_t pot_esize(const pot *p) { return p->dtype == POT_F16 ? 2 : 4; }

/* ---- matrix products ----------------------------------------------------------------- */

/* out[t][r] = dot(W row r, x[t]) for t < T (x [T][cols], out [T][rows]).
 * Up to MATVEC_MAX_T rows: the quantised weights read directly. More: the
 * weight dequantised in row chunks into wbuf and one GEMM per chunk; exact
 * in f32 (the CPU reference's numbers), else f16 operands with f32
 * accumulation on the tensor cores (half the dequantisation traffic of f32,
 * twice TF32's rate; activations rounded to f16 as llama.cpp's cuBLAS path
 * does). */
static int matmul(cuda_backend *cb, const dev_weight *w, const float *x, int64_t T, float *out, char *err,
                  size_t errlen) {
    if (T <= MATVEC_MAX_T) {
        CK(cuda_matvec(out, w->data, w->type, w->row_bytes, w->rows, w->cols, x, T, cb->stream));
        return 0;
    }
    int64_t chunk = (int64_t)(cb->wbuf_floats / (size_t)w->cols);
    if (chunk > w->rows) chunk = w->rows;
    const float one = 1.0f, zero = 0.0f;
    cudaDataType in_type = cb->exact ? CUDA_R_32F : CUDA_R_16F;
    const void *xin = x;
    if (!cb->exact) {
        CK(cuda_f32_to_f16(cb->xh.p, x, T * w->cols, cb->stream));
        xin = cb->xh.p;
    }
    for (int64_t r0 = 0; r0 < w->rows; r0 += chunk) {
        int64_t n = w->rows - r0 < chunk ? w->rows - r0 : chunk;
        const void *rows = (const char *)w->data + (size_t)r0 * w->row_bytes;
        if (cb->exact)
            CK(cuda_dequantize_rows(cb->wbuf, rows, w->type, w->row_bytes, n, w->cols, cb->stream));
        else
            CK(cuda_dequantize_rows_f16(cb->wbuf, rows, w->type, w->row_bytes, n, w->cols, cb->stream));
        /* column-major: out^T (rows x T, ld rows) = op(A) B with A = the weight chunk
         * stored as cols x n (ld cols), op = T; B = x^T, cols x T (ld cols) */
        cublasStatus_t s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)T, (int)w->cols, &one,
                                        cb->wbuf, in_type, (int)w->cols, xin, in_type, (int)w->cols, &zero,
                                        out + r0, CUDA_R_32F, (int)w->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(err, errlen, "cuda backend: cublasGemmEx: %s", cublasGetStatusString(s));
            return -1;
        }
    }
    return 0;
fail:
    return -1;
}

/* ---- the forward pass -------------------------------------------------------------------- */

typedef struct span_plan {
    dev_pot *dp;
    int64_t t0;          /* first row of the span in the batch */
    int32_t n0, n_pre;   /* slots before the span; pot keys attended */
    int32_t n_split;
    int batched;         /* a single token in the batched decode launch */
    size_t scores_at;    /* floats into cb->scores */
    size_t slots_at;     /* ints into cb->slots */
    size_t weights_at;   /* floats into cb->row_w: the score rows' weights, when the span has them */
    size_t pos_at;       /* ints into cb->slot_pos: every slot's RoPE position, for a pot with
                            original positions ([n_layer][n_head_kv][capacity]) */
} span_plan;

/* Device buffer sizes a forward needs beyond the per-row ones. */
typedef struct fwd_sizes {
    size_t partial, scores, slots, weights, positions; /* floats, floats, ints, floats, ints */
    int64_t max_q;                          /* the longest span */
} fwd_sizes;

/* Everything a forward runs, decided before anything is queued. */
typedef struct fwd_plan {
    backend_span *spans;
    span_plan *sp;
    int32_t n_spans;
    int64_t T;
    int32_t n_batched;   /* spans in the batched decode launch (rows of cb->batch's descriptors) */
    int32_t batch_dtype;
    int32_t grid_splits; /* of the batched launch: from the key-count bucket */
    int decode_only;     /* every span batched, no scores or labels: the LM head runs for all rows
                            inside the body and the logits come back in one copy */
    int graph;           /* ... and the body runs as a captured CUDA graph */
} fwd_plan;

#define F(b) ((float *)(b).p)

/* The batched launch's descriptors and every row's position, in cb->batch. */
static cuda_attn_desc *batch_desc(cuda_backend *cb) { return (cuda_attn_desc *)cb->batch.p; }
static int32_t *batch_pos(cuda_backend *cb, const fwd_plan *fp) {
    return (int32_t *)((char *)cb->batch.p + (size_t)fp->n_batched * sizeof(cuda_attn_desc));
}

/* Final norm + LM head for rows [r0, r0 + n) of x into cb->logits ([n][n_vocab]). */
static int lm_head(cuda_backend *cb, const float *x_rows, int64_t n, char *err, size_t errlen) {
    const model *m = cb->m;
    CK(cuda_rmsnorm_f32(F(cb->xn), x_rows, cb->output_norm, n, m->n_embd, m->norm_eps, cb->stream));
    return matmul(cb, &cb->output, F(cb->xn), n, F(cb->logits), err, errlen);
fail:
    return -1;
}

/* The attention of the spans outside the batched launch: K/V stored, then
 * attention over [pot | span] and the score rows, span by span. */
static int span_attention(cuda_backend *cb, int32_t l, const fwd_plan *fp, char *err, size_t errlen) {
    const model *m = cb->m;
    int64_t hd = m->head_dim, dq = (int64_t)m->n_head * hd, dkv = (int64_t)m->n_head_kv * hd;
    for (int32_t s = 0; s < fp->n_spans; s++) {
        backend_span *sp = &fp->spans[s];
        const span_plan *pl = &fp->sp[s];
        if (pl->batched) continue;
        pot *p = sp->kv;
        size_t layer_off = (size_t)l * p->n_head_kv * p->capacity * p->head_dim * pot_esize(p);
        void *kl = (char *)pl->dp->k + layer_off, *vl = (char *)pl->dp->v + layer_off;
        float *q = F(cb->q) + pl->t0 * dq;
        CK(cuda_pot_store(kl, vl, (int32_t)p->dtype, p->capacity, p->n_head_kv, p->head_dim, F(cb->k) + pl->t0 * dkv,
                          F(cb->v) + pl->t0 * dkv, pl->n0, sp->n_tokens, cb->stream));
        cuda_attn a = {q, F(cb->att) + pl->t0 * dq, sp->scores ? F(cb->lse) : NULL, kl, vl, (int32_t)p->dtype,
                       p->capacity, m->n_head, m->n_head_kv, m->head_dim,
                       sp->attend_slots ? (const int32_t *)cb->slots.p + pl->slots_at +
                                              (size_t)l * m->n_head_kv * sp->n_attend
                                        : NULL,
                       pl->n_pre, pl->n0, sp->n_tokens, 1.0f / sqrtf((float)m->head_dim),
                       p->original_positions ? (const int32_t *)cb->slot_pos.p + pl->pos_at +
                                                   (size_t)l * p->n_head_kv * p->capacity
                                             : NULL};
        CK(cuda_attention_f32(&a, &cb->rope, pl->n_split, F(cb->partial), cb->stream));
        if (sp->scores) {
            int32_t n_keys = pl->n_pre + sp->n_tokens;
            float *dst = F(cb->scores) + pl->scores_at + (size_t)l * m->n_head_kv * n_keys;
            const float *row_w = sp->score_row_weight ? F(cb->row_w) + pl->weights_at : NULL;
            CK(cuda_attention_scores(&a, &cb->rope, sp->score_row0, sp->n_score_rows, row_w,
                                     (sp->score_combine == BACKEND_SCORE_MAX) | (sp->score_rows_max ? 2 : 0), dst,
                                     cb->stream));
        }
    }
    return 0;
fail:
    return -1;
}

static int forward_layer(cuda_backend *cb, int32_t l, const fwd_plan *fp, char *err, size_t errlen) {
    const model *m = cb->m;
    const dev_layer *L = &cb->layers[l];
    int64_t T = fp->T, d = m->n_embd, hd = m->head_dim, dq = (int64_t)m->n_head * hd, dkv = (int64_t)m->n_head_kv * hd;
    CK(cuda_rmsnorm_f32(F(cb->xn), F(cb->x), L->attn_norm, T, d, m->norm_eps, cb->stream));
    if (matmul(cb, &L->wq, F(cb->xn), T, F(cb->q), err, errlen) || matmul(cb, &L->wk, F(cb->xn), T, F(cb->k), err, errlen) ||
        matmul(cb, &L->wv, F(cb->xn), T, F(cb->v), err, errlen))
        return -1;
    if (L->bq) CK(cuda_add_bias_f32(F(cb->q), L->bq, T, dq, cb->stream));
    if (L->bk) CK(cuda_add_bias_f32(F(cb->k), L->bk, T, dkv, cb->stream));
    if (L->bv) CK(cuda_add_bias_f32(F(cb->v), L->bv, T, dkv, cb->stream));
    /* every row's query rotated to its slot in one launch (positions in device memory) */
    CK(cuda_rope_f32(F(cb->q), T, m->n_head, m->head_dim, batch_pos(cb, fp), 0, &cb->rope, cb->stream));
    if (fp->n_batched) {
        CK(cuda_pot_store_batch(batch_desc(cb), fp->n_batched, l, fp->batch_dtype, m->n_head_kv, m->head_dim, F(cb->k),
                                F(cb->v), cb->stream));
        cuda_attn_batch ab = {batch_desc(cb), fp->n_batched, l, fp->batch_dtype, m->n_head, m->n_head_kv,
                              m->head_dim, F(cb->q), F(cb->att), 1.0f / sqrtf((float)m->head_dim)};
        CK(cuda_attention_batch_f32(&ab, &cb->rope, fp->grid_splits, F(cb->partial), cb->stream));
    }
    if (span_attention(cb, l, fp, err, errlen)) return -1;
    if (matmul(cb, &L->wo, F(cb->att), T, F(cb->xb), err, errlen)) return -1;
    CK(cuda_add_rmsnorm_f32(F(cb->xn), F(cb->x), F(cb->xb), L->ffn_norm, T, d, m->norm_eps, cb->stream));
    if (matmul(cb, &L->gate, F(cb->xn), T, F(cb->hb), err, errlen) ||
        matmul(cb, &L->up, F(cb->xn), T, F(cb->hb2), err, errlen))
        return -1;
    CK(cuda_swiglu_f32(F(cb->hb), F(cb->hb2), T * m->n_ff, cb->stream));
    if (matmul(cb, &L->down, F(cb->hb), T, F(cb->xb), err, errlen)) return -1;
    CK(cuda_add_f32(F(cb->x), F(cb->xb), T * d, cb->stream));
    return 0;
fail:
    return -1;
}

/* Everything between the inputs' upload and the outputs' download, reading
 * only device memory: what a decode graph captures. */
static int forward_body(cuda_backend *cb, void *arg, char *err, size_t errlen) {
    const fwd_plan *fp = arg;
    const model *m = cb->m;
    CK(cuda_embed_rows(F(cb->x), cb->tok_embd.data, cb->tok_embd.type, cb->tok_embd.row_bytes, m->n_embd,
                       cb->tokens.p, fp->T, cb->stream));
    for (int32_t l = 0; l < m->n_layer; l++)
        if (forward_layer(cb, l, fp, err, errlen)) return -1;
    if (fp->decode_only && lm_head(cb, F(cb->x), fp->T, err, errlen)) return -1;
    return 0;
fail:
    return -1;
}

/* label_logprob for the span's labelled rows, LOGIT_ROWS at a time. */
static int span_labels(cuda_backend *cb, backend_span *sp, int64_t t0, char *err, size_t errlen) {
    const model *m = cb->m;
    int64_t d = m->n_embd, V = m->n_vocab;
    int32_t rows[LOGIT_ROWS], labels[LOGIT_ROWS];
    float lp[LOGIT_ROWS];
    for (int32_t t = 0; t < sp->n_tokens;) {
        int32_t n = 0;
        for (; t < sp->n_tokens && n < LOGIT_ROWS; t++)
            if (sp->labels[t] >= 0 && sp->labels[t] < V) {
                rows[n] = (int32_t)(t0 + t);
                labels[n++] = sp->labels[t];
            }
        if (!n) continue;
        CK(cudaMemcpyAsync(cb->rows.p, rows, n * sizeof(int32_t), cudaMemcpyHostToDevice, cb->stream));
        CK(cudaMemcpyAsync(cb->labels.p, labels, n * sizeof(int32_t), cudaMemcpyHostToDevice, cb->stream));
        /* gather the rows (an f32 "embedding table" lookup), then the LM head */
        CK(cuda_embed_rows(F(cb->xb), F(cb->x), GGML_TYPE_F32, (size_t)d * sizeof(float), d, cb->rows.p, n,
                           cb->stream));
        if (lm_head(cb, F(cb->xb), n, err, errlen)) return -1;
        cuda_softmax_rows sr = {F(cb->logits), V, n, V, 1.0f, -1, NULL, 0, NULL, cb->labels.p, F(cb->lp)};
        CK(cuda_softmax_lse_f32(&sr, cb->stream));
        CK(cudaMemcpyAsync(lp, cb->lp.p, n * sizeof(float), cudaMemcpyDeviceToHost, cb->stream));
        CK(cudaStreamSynchronize(cb->stream)); /* rows, labels and lp are reused by the next chunk */
        for (int32_t i = 0; i < n; i++) sp->label_logprob[rows[i] - t0] = lp[i];
    }
    return 0;
fail:
    return -1;
}

/* The key-count bucket of a batched launch: the next power of two from 512
 * (each bucket one grid-split count, one graph per batch size). */
static int32_t key_bucket(int32_t keys) {
    int32_t b = 512;
    while (b < keys && b < (1 << 30)) b *= 2;
    return b;
}

/* Adds the span's chosen rows, final-normed, to its hidden_sum (xn holds T rows). */
static int span_hidden_sum(cuda_backend *cb, backend_span *sp, int64_t t0, char *err, size_t errlen) {
    const model *m = cb->m;
    int64_t d = m->n_embd, n = sp->n_hidden_rows;
    float *rows = malloc((size_t)n * (size_t)d * sizeof(float));
    if (!rows) {
        snprintf(err, errlen, "forward: out of memory for hidden states");
        return -1;
    }
    CK(cuda_rmsnorm_f32(F(cb->xn), F(cb->x) + (t0 + sp->hidden_row0) * d, cb->output_norm, n, d, m->norm_eps,
                        cb->stream));
    CK(cudaMemcpyAsync(rows, cb->xn.p, (size_t)n * (size_t)d * sizeof(float), cudaMemcpyDeviceToHost, cb->stream));
    CK(cudaStreamSynchronize(cb->stream));
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < d; i++) sp->hidden_sum[i] += rows[r * d + i];
    free(rows);
    return 0;
fail:
    free(rows);
    return -1;
}

/* Decides what runs where (fp->sp filled) and the buffer sizes. */
static void plan_forward(cuda_backend *cb, fwd_plan *fp, fwd_sizes *z) {
    const model *m = cb->m;
    int32_t max_batched_keys = 0;
    int labels = 0;
    fp->batch_dtype = -1;
    for (int32_t s = 0; s < fp->n_spans; s++) {
        backend_span *sp = &fp->spans[s];
        span_plan *pl = &fp->sp[s];
        pl->t0 = fp->T;
        pl->n0 = sp->kv->n;
        pl->n_pre = sp->attend_slots ? sp->n_attend : pl->n0;
        /* a decode token joins the batched launch (one dtype per launch; keys rotated by slot) */
        pl->batched = sp->n_tokens == 1 && !sp->prefill && !sp->scores && !sp->kv->original_positions &&
                      (fp->batch_dtype < 0 || fp->batch_dtype == (int32_t)sp->kv->dtype);
        if (pl->batched) {
            fp->batch_dtype = (int32_t)sp->kv->dtype;
            fp->n_batched++;
            if (pl->n_pre + 1 > max_batched_keys) max_batched_keys = pl->n_pre + 1;
        }
        pl->n_split = cuda_attention_splits(sp->n_tokens, pl->n_pre + sp->n_tokens);
        size_t part = cuda_attention_scratch_floats(sp->n_tokens, m->n_head, m->head_dim, pl->n_split);
        if (part > z->partial) z->partial = part;
        pl->scores_at = z->scores;
        if (sp->scores) z->scores += (size_t)m->n_layer * m->n_head_kv * (pl->n_pre + sp->n_tokens);
        pl->slots_at = z->slots;
        if (sp->attend_slots) z->slots += (size_t)m->n_layer * m->n_head_kv * sp->n_attend;
        pl->weights_at = z->weights;
        if (sp->scores && sp->score_row_weight) z->weights += (size_t)sp->n_score_rows;
        pl->pos_at = z->positions;
        if (sp->kv->original_positions) z->positions += (size_t)m->n_layer * m->n_head_kv * sp->kv->capacity;
        fp->T += sp->n_tokens;
        if (sp->n_tokens > z->max_q) z->max_q = sp->n_tokens;
        labels |= sp->labels != NULL || sp->hidden_sum != NULL; /* (both read rows after the body) */
    }
    fp->grid_splits = fp->n_batched ? cuda_attention_batch_splits(key_bucket(max_batched_keys)) : 1;
    size_t part = cuda_attention_batch_scratch_floats(fp->n_batched, m->n_head, m->head_dim, fp->grid_splits);
    if (part > z->partial) z->partial = part;
    fp->decode_only = fp->n_batched == fp->n_spans && !labels && fp->T <= LOGIT_ROWS;
    fp->graph = fp->decode_only && cb->use_graphs && fp->T <= MATVEC_MAX_T;
}

/* The device buffers the plan needs. */
static int size_buffers(cuda_backend *cb, const fwd_plan *fp, const fwd_sizes *z, char *err, size_t errlen) {
    const model *m = cb->m;
    int64_t T = fp->T, d = m->n_embd, dq = (int64_t)m->n_head * m->head_dim, dkv = (int64_t)m->n_head_kv * m->head_dim;
    int64_t wide = d > dq ? d : dq, lrows = T > LOGIT_ROWS ? T : LOGIT_ROWS;
    CK(dbuf_need(&cb->x, (size_t)T * d * sizeof(float)));
    CK(dbuf_need(&cb->xn, (size_t)lrows * wide * sizeof(float)));
    CK(dbuf_need(&cb->xb, (size_t)lrows * wide * sizeof(float)));
    CK(dbuf_need(&cb->q, (size_t)T * dq * sizeof(float)));
    CK(dbuf_need(&cb->k, (size_t)T * dkv * sizeof(float)));
    CK(dbuf_need(&cb->v, (size_t)T * dkv * sizeof(float)));
    CK(dbuf_need(&cb->att, (size_t)T * dq * sizeof(float)));
    CK(dbuf_need(&cb->hb, (size_t)T * m->n_ff * sizeof(float)));
    CK(dbuf_need(&cb->hb2, (size_t)T * m->n_ff * sizeof(float)));
    CK(dbuf_need(&cb->lse, (size_t)m->n_head * z->max_q * sizeof(float)));
    CK(dbuf_need(&cb->partial, z->partial * sizeof(float)));
    CK(dbuf_need(&cb->scores, z->scores * sizeof(float)));
    CK(dbuf_need(&cb->slots, z->slots * sizeof(int32_t)));
    CK(dbuf_need(&cb->row_w, z->weights * sizeof(float)));
    CK(dbuf_need(&cb->slot_pos, z->positions * sizeof(int32_t)));
    CK(dbuf_need(&cb->tokens, (size_t)T * sizeof(int32_t)));
    CK(dbuf_need(&cb->logits, (size_t)LOGIT_ROWS * m->n_vocab * sizeof(float)));
    CK(dbuf_need(&cb->batch, (size_t)fp->n_batched * sizeof(cuda_attn_desc) + (size_t)T * sizeof(int32_t)));
    if (!cb->exact && T > MATVEC_MAX_T) { /* the GEMMs' f16 activations: the widest input is n_ff */
        int64_t widest = wide > m->n_ff ? wide : m->n_ff;
        CK(dbuf_need(&cb->xh, (size_t)T * widest * 2));
    }
    return 0;
fail:
    return -1;
}

/* Without context reset (the ablation) keys rotate to their tokens' stream
 * positions: pot_rope_pos of every slot the forward attends (the pot's
 * entries and the span's new tokens), [n_layer][n_head_kv][capacity], copied
 * to dst in device memory (a synchronous copy: the host array is freed). */
static int upload_slot_positions(cuda_backend *cb, const backend_span *sp, int32_t *dst) {
    const pot *p = sp->kv;
    size_t n = (size_t)p->n_layer * p->n_head_kv * p->capacity;
    int32_t *pos = calloc(n, sizeof *pos);
    if (!pos) return -1;
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t g = 0; g < p->n_head_kv; g++)
            for (int32_t s = 0; s < p->n + sp->n_tokens; s++)
                pos[((size_t)l * p->n_head_kv + g) * p->capacity + s] = (int32_t)pot_rope_pos(p, l, g, s);
    cudaError_t e = cudaMemcpyAsync(dst, pos, n * sizeof *pos, cudaMemcpyHostToDevice, cb->stream);
    free(pos);
    return e == cudaSuccess ? 0 : -1;
}

/* Tokens, positions, the batched launch's descriptors and the attended
 * slots, staged on the host and copied up (before a graph launch: copies
 * from pageable memory are not captured). */
static int upload_inputs(cuda_backend *cb, const fwd_plan *fp, char *err, size_t errlen) {
    const model *m = cb->m;
    size_t desc_bytes = (size_t)fp->n_batched * sizeof(cuda_attn_desc);
    char *stage = malloc(desc_bytes + (size_t)fp->T * 2 * sizeof(int32_t));
    if (!stage) {
        snprintf(err, errlen, "forward: out of memory");
        return -1;
    }
    cuda_attn_desc *desc = (cuda_attn_desc *)stage;
    int32_t *pos = (int32_t *)(stage + desc_bytes), *tokens = pos + fp->T;
    for (int32_t s = 0, t = 0, b = 0; s < fp->n_spans; s++) {
        const backend_span *sp = &fp->spans[s];
        const span_plan *pl = &fp->sp[s];
        for (int32_t i = 0; i < sp->n_tokens; i++, t++) {
            tokens[t] = sp->tokens[i];
            pos[t] = (int32_t)pot_rope_pos(sp->kv, 0, 0, pl->n0 + i);
        }
        if (pl->batched)
            desc[b++] = (cuda_attn_desc){(int32_t)pl->t0, pl->n0, pl->n_pre, sp->kv->capacity, pl->dp->k, pl->dp->v,
                                         sp->attend_slots ? (const int32_t *)cb->slots.p + pl->slots_at : NULL};
    }
    CK(cudaMemcpyAsync(cb->batch.p, stage, desc_bytes + (size_t)fp->T * sizeof(int32_t), cudaMemcpyHostToDevice,
                       cb->stream));
    CK(cudaMemcpyAsync(cb->tokens.p, tokens, (size_t)fp->T * sizeof(int32_t), cudaMemcpyHostToDevice, cb->stream));
    for (int32_t s = 0; s < fp->n_spans; s++) {
        const backend_span *sp = &fp->spans[s];
        if (sp->attend_slots)
            CK(cudaMemcpyAsync((int32_t *)cb->slots.p + fp->sp[s].slots_at, sp->attend_slots,
                               (size_t)m->n_layer * m->n_head_kv * sp->n_attend * sizeof(int32_t),
                               cudaMemcpyHostToDevice, cb->stream));
        if (sp->scores && sp->score_row_weight)
            CK(cudaMemcpyAsync(F(cb->row_w) + fp->sp[s].weights_at, sp->score_row_weight,
                               (size_t)sp->n_score_rows * sizeof(float), cudaMemcpyHostToDevice, cb->stream));
        if (sp->kv->original_positions && upload_slot_positions(cb, sp, (int32_t *)cb->slot_pos.p + fp->sp[s].pos_at)) {
            snprintf(err, errlen, "forward: uploading slot positions failed");
            goto fail;
        }
    }
    free(stage); /* pageable copies have read their source when they return */
    return 0;
fail:
    free(stage);
    return -1;
}

/* Scores, logits and label log-probabilities to the spans' arrays. */
static int download_outputs(cuda_backend *cb, const fwd_plan *fp, char *err, size_t errlen) {
    const model *m = cb->m;
    int64_t d = m->n_embd;
    if (fp->decode_only) { /* the body computed every row's logits */
        for (int32_t s = 0; s < fp->n_spans; s++)
            if (fp->spans[s].logits_mode != BACKEND_LOGITS_NONE)
                CK(cudaMemcpyAsync(fp->spans[s].logits, F(cb->logits) + (size_t)fp->sp[s].t0 * m->n_vocab,
                                   (size_t)m->n_vocab * sizeof(float), cudaMemcpyDeviceToHost, cb->stream));
        return 0;
    }
    for (int32_t s = 0; s < fp->n_spans; s++) {
        backend_span *sp = &fp->spans[s];
        const span_plan *pl = &fp->sp[s];
        if (sp->scores)
            CK(cudaMemcpyAsync(sp->scores, F(cb->scores) + pl->scores_at,
                               (size_t)m->n_layer * m->n_head_kv * (pl->n_pre + sp->n_tokens) * sizeof(float),
                               cudaMemcpyDeviceToHost, cb->stream));
        if (sp->logits_mode != BACKEND_LOGITS_NONE) {
            int64_t first = sp->logits_mode == BACKEND_LOGITS_LAST ? sp->n_tokens - 1 : 0;
            for (int64_t r = first; r < sp->n_tokens; r += LOGIT_ROWS) {
                int64_t n = sp->n_tokens - r < LOGIT_ROWS ? sp->n_tokens - r : LOGIT_ROWS;
                if (lm_head(cb, F(cb->x) + (pl->t0 + r) * d, n, err, errlen)) return -1;
                CK(cudaMemcpyAsync(sp->logits + (size_t)(r - first) * m->n_vocab, cb->logits.p,
                                   (size_t)n * m->n_vocab * sizeof(float), cudaMemcpyDeviceToHost, cb->stream));
                CK(cudaStreamSynchronize(cb->stream)); /* the logits buffer is reused */
            }
        }
        if (sp->hidden_sum && span_hidden_sum(cb, sp, pl->t0, err, errlen)) return -1;
        if (sp->labels) {
            CK(dbuf_need(&cb->rows, LOGIT_ROWS * sizeof(int32_t)));
            CK(dbuf_need(&cb->labels, LOGIT_ROWS * sizeof(int32_t)));
            CK(dbuf_need(&cb->lp, LOGIT_ROWS * sizeof(float)));
            if (span_labels(cb, sp, pl->t0, err, errlen)) return -1;
        }
    }
    return 0;
fail:
    return -1;
}

/* A signature of the buffers a graph reads and writes: a graph captured with
 * other addresses is stale. */
static uint64_t buffers_signature(const cuda_backend *cb) {
    const void *ps[] = {cb->x.p,  cb->xn.p,    cb->xb.p,     cb->q.p,      cb->k.p,     cb->v.p,
                        cb->att.p, cb->hb.p,   cb->hb2.p,    cb->partial.p, cb->tokens.p, cb->logits.p,
                        cb->batch.p, cb->slots.p};
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) h = (h ^ (uint64_t)(uintptr_t)ps[i]) * 0x100000001b3ULL;
    return h;
}

/* Phase p of a forward of kind k ended now (phase timing on): its host time added. */
static void phase_done(cuda_backend *cb, int k, enum cuda_phase p, double *t) {
    if (!cb->time_phases) return;
    double now = (monotonic_ms() / 1e3);
    cb->phases.host_s[k][p] += now - *t;
    *t = now;
}

static int cuda_forward(backend *b, backend_span *spans, int32_t n_spans, char *err, size_t errlen) {
    cuda_backend *cb = (cuda_backend *)b;
    double t = cb->time_phases ? (monotonic_ms() / 1e3) : 0;
    if (n_spans <= 0) {
        snprintf(err, errlen, "forward: no spans");
        return -1;
    }
    int64_t n_rows, max_keys;
    if (backend_check_spans(cb->m, spans, n_spans, &n_rows, &max_keys, err, errlen)) return -1;
    fwd_plan fp = {.spans = spans, .sp = calloc((size_t)n_spans, sizeof(span_plan)), .n_spans = n_spans};
    if (!fp.sp) {
        snprintf(err, errlen, "forward: out of memory");
        return -1;
    }
    fwd_sizes z = {0};
    plan_forward(cb, &fp, &z);
    if (size_buffers(cb, &fp, &z, err, errlen)) goto out;
    const int kind = fp.decode_only;
    phase_done(cb, kind, CUDA_PHASE_PLAN, &t);

    uint64_t now = ++cb->clock;
    for (int32_t s = 0; s < n_spans; s++)
        if (cuda_pot_is_ours(cb, spans[s].kv)) ((dev_pot *)spans[s].kv->device)->last_use = now;
    /* (the pots of this forward marked first: making room for one never evicts another) */
    for (int32_t s = 0; s < n_spans; s++) {
        if (!(fp.sp[s].dp = cuda_pot_acquire(cb, spans[s].kv, now, err, errlen))) goto out;
        /* the slots from n0 on are about to change on the device */
        if (fp.sp[s].dp->n_host > fp.sp[s].n0) fp.sp[s].dp->n_host = fp.sp[s].n0;
    }
    phase_done(cb, kind, CUDA_PHASE_ACQUIRE, &t);
    if (upload_inputs(cb, &fp, err, errlen)) goto out;
    phase_done(cb, kind, CUDA_PHASE_UPLOAD, &t);
    if (cb->time_phases) CK(cudaEventRecord(cb->body_start, cb->stream));
    if (fp.graph) {
        cuda_graph_key key = {(int32_t)fp.T, fp.grid_splits, fp.batch_dtype, buffers_signature(cb)};
        if (cuda_graph_run(cb, &key, forward_body, &fp, err, errlen)) goto out;
    } else if (forward_body(cb, &fp, err, errlen)) {
        goto out;
    }
    if (cb->time_phases) CK(cudaEventRecord(cb->body_end, cb->stream));
    phase_done(cb, kind, CUDA_PHASE_LAUNCH, &t);
    if (download_outputs(cb, &fp, err, errlen)) goto out;
    phase_done(cb, kind, CUDA_PHASE_DOWNLOAD, &t);
    CK(cudaStreamSynchronize(cb->stream));
    CK(cudaGetLastError());
    phase_done(cb, kind, CUDA_PHASE_SYNC, &t);
    if (cb->time_phases) {
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, cb->body_start, cb->body_end));
        cb->phases.body_device_s[kind] += ms * 1e-3;
        cb->phases.forwards[kind]++;
    }

    for (int32_t s = 0; s < n_spans; s++) pot_append_done(spans[s].kv, spans[s].n_tokens);
    free(fp.sp);
    return 0;
fail:
out:
    cudaStreamSynchronize(cb->stream); /* nothing queued may still write the host's arrays */
    cudaGetLastError();
    free(fp.sp);
    return -1;
}

/* ---- lifetime ------------------------------------------------------------------------------- */

/* The phase totals on stderr, per forward of each kind, in milliseconds. */
static void print_phases(const cuda_backend *cb) {
    static const char *const names[] = {"plan", "acquire", "upload", "launch", "download", "sync"};
    for (int k = 1; k >= 0; k--) {
        const cuda_phase_totals *t = &cb->phases;
        if (!t->forwards[k]) continue;
        double n = (double)t->forwards[k], host = 0;
        fprintf(stderr, "cuda phases, %s: %llu forwards, ms each:", k ? "decode steps" : "other forwards",
                (unsigned long long)t->forwards[k]);
        for (int p = 0; p < CUDA_PHASE_COUNT; p++) {
            fprintf(stderr, " %s %.3f", names[p], 1e3 * t->host_s[k][p] / n);
            host += t->host_s[k][p];
        }
        fprintf(stderr, "; wall %.3f, device body %.3f\n", 1e3 * host / n, 1e3 * t->body_device_s[k] / n);
    }
}

void cuda_backend_time_phases(backend *b, int on) {
    cuda_backend *cb = (cuda_backend *)b;
    if (on && !cb->body_start &&
        (cudaEventCreate(&cb->body_start) != cudaSuccess || cudaEventCreate(&cb->body_end) != cudaSuccess))
        return; /* no events: timing stays off */
    cb->time_phases = on != 0;
}

cuda_phase_totals cuda_backend_phase_totals(backend *b) { return ((cuda_backend *)b)->phases; }

static void cuda_free_backend(backend *b) {
    cuda_backend *cb = (cuda_backend *)b;
    if (!cb) return;
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    if (cb->time_phases) print_phases(cb);
    if (cb->body_start) cudaEventDestroy(cb->body_start);
    if (cb->body_end) cudaEventDestroy(cb->body_end);
    cuda_pots_return_all(cb); /* the pots outlive the backend, on the host */
    cuda_graphs_free(cb);
    dbuf *bufs[] = {&cb->x,   &cb->xn,  &cb->xb,      &cb->q,      &cb->k,     &cb->v,      &cb->att,
                    &cb->hb,  &cb->hb2, &cb->lse,     &cb->partial, &cb->scores, &cb->slots, &cb->row_w, &cb->slot_pos,
                    &cb->tokens, &cb->logits, &cb->rows, &cb->labels, &cb->lp, &cb->batch, &cb->cmp_k, &cb->cmp_v, &cb->keep, &cb->xh};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dbuf_free(bufs[i]);
    for (size_t i = 0; i < cb->n_allocs; i++) cudaFree(cb->allocs[i]);
    free(cb->allocs);
    cudaFree(cb->wbuf);
    free(cb->layers);
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->stream) cudaStreamDestroy(cb->stream);
    free(cb);
}

int cuda_backend_forget_pot(backend *b, pot *p) {
    return cuda_pot_is_ours((cuda_backend *)b, p) ? pot_host_take(p) : 0;
}

int cuda_backend_holds_pot(backend *b, const pot *p) { return cuda_pot_is_ours((cuda_backend *)b, p); }

size_t cuda_backend_pot_bytes(backend *b) { return ((cuda_backend *)b)->pot_bytes; }

void cuda_backend_use_graphs(backend *b, int on) { ((cuda_backend *)b)->use_graphs = on != 0; }

void cuda_backend_graph_counts(backend *b, uint64_t *captures, uint64_t *replays) {
    *captures = ((cuda_backend *)b)->graph_captures;
    *replays = ((cuda_backend *)b)->graph_replays;
}

/* Device memory for pots: what is free once the weights are in, less a
 * reserve for the buffers a forward grows (activations of a prefill chunk
 * of 4096 tokens, the logits rows) and 1/16 for the runtime, fragmentation
 * and the compaction's second buffers (one pot's size). An estimate: when
 * an allocation fails anyway, the least recently used pots go back to the
 * host, and a compaction without its second buffers runs on the host. */
static size_t pot_budget(const model *m) {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) return 0;
    size_t d = (size_t)m->n_embd, dq = (size_t)m->n_head * m->head_dim, ff = (size_t)m->n_ff;
    size_t reserve = 4096 * (6 * (d > dq ? d : dq) + 2 * ff) * sizeof(float) +
                     (size_t)LOGIT_ROWS * m->n_vocab * sizeof(float) + free_b / 16;
    return free_b > reserve ? free_b - reserve : 0;
}

static size_t cuda_pot_memory(backend *b) { return ((cuda_backend *)b)->pot_budget; }

backend *cuda_backend_new(const model *m, int n_threads, int exact, char *err, size_t errlen) {
    (void)n_threads;
    const char *unsupported;
    if (model_is_extended(m, &unsupported)) { /* its kernels run the llama/qwen2 forward pass only */
        snprintf(err, errlen, "cuda backend: %s is not supported (use --backend cpu)", unsupported);
        return NULL;
    }
    cuda_backend *cb = calloc(1, sizeof *cb);
    rope r;
    memset(&r, 0, sizeof r);
    if (!cb) {
        snprintf(err, errlen, "cuda backend: out of memory");
        return NULL;
    }
    cb->m = m;
    cb->exact = exact;
    cb->base.name = "cuda";
    cb->base.forward = cuda_forward;
    cb->base.free = cuda_free_backend;
    cb->base.pot_memory = cuda_pot_memory;
    const char *graphs = getenv("POTSERVE_CUDA_GRAPHS"); /* "0" turns the decode graphs off */
    cb->use_graphs = !graphs || strcmp(graphs, "0") != 0;
    const char *phases = getenv("POTSERVE_CUDA_PHASES");
    if (m->n_head <= 0 || m->n_head_kv <= 0 || m->n_head % m->n_head_kv || m->head_dim > 256) {
        snprintf(err, errlen, "cuda backend: unsupported head layout (%d heads, %d KV heads, head_dim %d)", m->n_head,
                 m->n_head_kv, m->head_dim);
        goto fail_quiet;
    }
    cb->layers = calloc((size_t)m->n_layer, sizeof *cb->layers);
    if (!cb->layers) {
        snprintf(err, errlen, "cuda backend: out of memory");
        goto fail_quiet;
    }
    CK(cudaSetDevice(0));
    CK(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    cublasStatus_t bs = cublasCreate(&cb->blas);
    if (bs != CUBLAS_STATUS_SUCCESS || (bs = cublasSetStream(cb->blas, cb->stream)) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cuda backend: cuBLAS: %s", cublasGetStatusString(bs));
        goto fail_quiet;
    }
    if (upload_weight(cb, &m->tok_embd, &cb->tok_embd, err, errlen)) goto fail_quiet;
    if (m->output.data == m->tok_embd.data)
        cb->output = cb->tok_embd;
    else if (upload_weight(cb, &m->output, &cb->output, err, errlen))
        goto fail_quiet;
    size_t wmax = (size_t)WBUF_MIN;
    for (int32_t l = 0; l < m->n_layer; l++) {
        const layer_weights *lw = &m->layers[l];
        dev_layer *L = &cb->layers[l];
        const weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        dev_weight *ds[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 7; i++) {
            if (upload_weight(cb, ws[i], ds[i], err, errlen)) goto fail_quiet;
            if ((size_t)(ws[i]->rows * ws[i]->cols) > wmax) wmax = (size_t)(ws[i]->rows * ws[i]->cols);
        }
        int64_t dq = (int64_t)m->n_head * m->head_dim, dkv = (int64_t)m->n_head_kv * m->head_dim;
        L->attn_norm = upload_vec(cb, lw->attn_norm, m->n_embd);
        L->ffn_norm = upload_vec(cb, lw->ffn_norm, m->n_embd);
        L->bq = upload_vec(cb, lw->bq, dq);
        L->bk = upload_vec(cb, lw->bk, dkv);
        L->bv = upload_vec(cb, lw->bv, dkv);
        if (!L->attn_norm || !L->ffn_norm || (lw->bq && !L->bq) || (lw->bk && !L->bk) || (lw->bv && !L->bv)) {
            snprintf(err, errlen, "cuda backend: out of device memory for the weights");
            goto fail_quiet;
        }
    }
    if (!(cb->output_norm = upload_vec(cb, m->output_norm, m->n_embd))) {
        snprintf(err, errlen, "cuda backend: out of device memory for the weights");
        goto fail_quiet;
    }
    /* the LM head is dequantised in row chunks of the largest layer matrix */
    cb->wbuf_floats = wmax;
    CK(cudaMalloc((void **)&cb->wbuf, wmax * sizeof(float)));
    if (rope_init(&r, m->n_rot, m->rope_base, m->rope_layout, m->n_ctx_train)) {
        snprintf(err, errlen, "cuda backend: out of memory");
        goto fail_quiet;
    }
    const void *cs = upload(cb, r.cs, (size_t)r.n_table * r.half * 2 * sizeof(float));
    const void *inv = upload(cb, r.inv_freq, (size_t)(r.half ? r.half : 1) * sizeof(double));
    if (!cs || !inv) {
        snprintf(err, errlen, "cuda backend: out of device memory");
        goto fail_quiet;
    }
    cb->rope = (cuda_rope){r.n_rot, (int32_t)r.layout, r.n_table, cs, inv};
    rope_free(&r);
    cb->pot_budget = pot_budget(m);
    if (phases && !strcmp(phases, "1")) cuda_backend_time_phases(&cb->base, 1);
    return &cb->base;
fail:
fail_quiet:
    rope_free(&r);
    cuda_free_backend(&cb->base);
    return NULL;
}
