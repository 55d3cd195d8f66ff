/* The CPU reference backend: a plain, threaded forward pass of the llama /
 * qwen2 decoder over a batch of token spans. Matrix products run over all
 * tokens of all spans at once; attention runs per span over its pot. Keys are
 * stored before RoPE and rotated here by slot index. Clarity first: the fast
 * kernels of the performance work must agree with this code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/backend.h"
#include "engine/model.h"
#include "engine/quant.h"
#include "engine/rope.h"
#include "simd.h"
#include "threadpool.h"

/* A matrix as this backend multiplies it: the model's weight and, for the
 * types quant_pack_rows takes, its rows packed eight at a time (quant.h),
 * which the products then read instead (NULL: the rows as in the file). */
typedef struct cpu_weight {
    const weight *w;
    uint8_t *packed;
    uint32_t packed_type; /* w's type, or Q6_K for Q3_K rows (quant_q3_k_as_q6_k) */
} cpu_weight;

enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN, W_PER_LAYER };

typedef struct cpu_backend {
    backend base;
    const model *m;
    threadpool *tp;
    rope rope[2];     /* angles for every position of the model's context, per model.rope */
    int exact;        /* f32 activations (see cpu_backend_new) */
    cpu_weight *mats; /* [n_layer][W_PER_LAYER], then the output matrix */
    uint8_t *arena;   /* every packed matrix, one mapping (packed_arena) */
    size_t arena_bytes;
} cpu_backend;

/* ---- matrix product: out[t][r] = dot(W row r, x[t]) ------------------------ */

enum { MATMUL_MAX_WEIGHTS = 3 };

/* An elementwise step that makes a product's input rows, run token by token
 * inside the product's parallel loop (before quantising them), so that it
 * does not leave the other threads waiting at a barrier (SwiGLU alone was a
 * tenth of a batched decode step on one thread):
 *   PREP_NORM      in[t] = rmsnorm(res[t]) * w
 *   PREP_ADD_NORM  res[t] += in[t], then in[t] = rmsnorm(res[t]) * w
 *   PREP_SWIGLU    in[t] = silu(in[t]) * up[t]
 *   PREP_GEGLU     in[t] = gelu(in[t]) * up[t] (PREP_GEGLU_F16: in f16 steps, as llama.cpp)
 * where in is the product's input x (simd.h: rmsnorm and SwiGLU on vectors). */
typedef struct row_prep {
    enum { PREP_NONE, PREP_NORM, PREP_ADD_NORM, PREP_SWIGLU, PREP_GEGLU, PREP_GEGLU_F16 } kind;
    float *res;      /* NORM, ADD_NORM: the residual stream [T][cols] */
    const float *w;  /* NORM, ADD_NORM: the norm's weights */
    const float *up; /* SWIGLU, GEGLU: [T][cols] */
    float eps;
} row_prep;

/* One input against up to three weights (q, k, v; gate, up) in one parallel
 * loop over their rows laid end to end: one quantisation of the input and
 * one barrier instead of three, which a decode step (one token, thirty
 * layers) feels. Every output element is computed as by a single product. */
typedef struct matmul_job {
    const cpu_weight *w[MATMUL_MAX_WEIGHTS];
    float *out[MATMUL_MAX_WEIGHTS]; /* [T][rows of w[i]] */
    int n_w;
    float *x;         /* [T][cols] */
    int64_t T;
    row_prep prep;    /* makes x's rows first */
    float *scratch;   /* exact: [n_threads][cols] dequantised rows */
    uint8_t *act;     /* quantised: [T][act_bytes] activations in the weights' vec_dot format */
    size_t act_bytes;
    uint8_t *lanes;   /* act laid out once for the packed K-quant products (quant_packed_lanes), or NULL */
} matmul_job;

typedef void (*rows_fn)(const matmul_job *j, const cpu_weight *w, float *out, int64_t r0, int64_t r1, int worker);

/* The parallel loop's units of a matrix: groups of eight rows when packed
 * (a group is never split), else rows. */
static int64_t units_of(const cpu_weight *cw) {
    return cw->packed ? cw->w->rows / 8 : cw->w->rows;
}

/* Units [r0, r1) of the weights laid end to end, handed out weight by weight. */
static void for_rows(const matmul_job *j, int64_t r0, int64_t r1, int worker, rows_fn fn) {
    int64_t base = 0;
    for (int i = 0; i < j->n_w && r0 < r1; i++) {
        const int64_t rows = units_of(j->w[i]);
        if (r0 < base + rows) {
            const int64_t e = r1 < base + rows ? r1 : base + rows;
            fn(j, j->w[i], j->out[i], r0 - base, e - base, worker);
            r0 = e;
        }
        base += rows;
    }
}

enum { MATMUL_DEQUANT_MIN_T = 3 }; /* exact path: from this batch size on, dequantise a row once */

static void rows_exact(const matmul_job *j, const cpu_weight *cw, float *out, int64_t r0, int64_t r1, int worker) {
    const weight *w = cw->w; /* never packed: units are rows */
    float *buf = j->scratch + (size_t)worker * w->cols;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w->data + (size_t)r * w->row_bytes;
        if (j->T < MATMUL_DEQUANT_MIN_T) {
            for (int64_t t = 0; t < j->T; t++)
                out[t * w->rows + r] = quant_dot_row(w->type, row, j->x + t * w->cols, w->cols);
        } else {
            quant_dequantize_row(w->type, row, buf, w->cols);
            for (int64_t t = 0; t < j->T; t++)
                out[t * w->rows + r] = simd_dot_f32(buf, j->x + t * w->cols, w->cols);
        }
    }
}

static void rows_quant(const matmul_job *j, const cpu_weight *cw, float *out, int64_t r0, int64_t r1, int worker) {
    (void)worker;
    const weight *w = cw->w;
    if (cw->packed && j->lanes && quant_packed_lanes_bytes(cw->packed_type, j->T, w->cols)) {
        quant_matmul_packed_lanes(cw->packed_type, cw->packed + (size_t)r0 * quant_packed_group_bytes(cw->packed_type, w->cols),
                                  r1 - r0, j->lanes, j->T, w->cols, out + r0 * 8, (size_t)w->rows);
        return;
    }
    if (cw->packed) {
        quant_matmul_packed(cw->packed_type, cw->packed + (size_t)r0 * quant_packed_group_bytes(cw->packed_type, w->cols), r1 - r0, j->act, j->act_bytes, j->T,
                            w->cols, out + r0 * 8, (size_t)w->rows);
        return;
    }
    quant_matmul(w->type, w->data + (size_t)r0 * w->row_bytes, w->row_bytes, r1 - r0, j->act, j->act_bytes, j->T,
                 w->cols, out + r0, (size_t)w->rows);
}

static void matmul_rows_exact(void *ctx, int64_t r0, int64_t r1, int worker) {
    for_rows(ctx, r0, r1, worker, rows_exact);
}

static void matmul_rows_quant(void *ctx, int64_t r0, int64_t r1, int worker) {
    for_rows(ctx, r0, r1, worker, rows_quant);
}

static void prep_row(const row_prep *p, float *x, int64_t t, int64_t n) {
    float *in = x + t * n;
    switch (p->kind) {
    case PREP_NONE: return;
    case PREP_ADD_NORM:
        for (int64_t i = 0; i < n; i++) p->res[t * n + i] += in[i];
        /* fall through */
    case PREP_NORM: simd_rmsnorm(in, p->res + t * n, p->w, n, p->eps); return;
    case PREP_SWIGLU: simd_swiglu(in, p->up + t * n, n); return;
    case PREP_GEGLU: simd_geglu(in, p->up + t * n, n); return;
    case PREP_GEGLU_F16: simd_geglu_f16(in, p->up + t * n, n); return;
    }
}

static void prep_rows(void *ctx, int64_t t0, int64_t t1, int worker) {
    (void)worker;
    matmul_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) prep_row(&j->prep, j->x, t, j->w[0]->w->cols);
}

static void prep_quantize_acts(void *ctx, int64_t t0, int64_t t1, int worker) {
    (void)worker;
    matmul_job *j = ctx;
    const int64_t n = j->w[0]->w->cols;
    for (int64_t t = t0; t < t1; t++) {
        prep_row(&j->prep, j->x, t, n);
        quant_quantize_act(j->w[0]->w->type, j->x + t * n, j->act + t * j->act_bytes, n);
    }
}

/* prep_quantize_acts for the rows of lane groups [g0, g1), then their lanes. */
static void prep_quantize_lanes(void *ctx, int64_t g0, int64_t g1, int worker) {
    matmul_job *j = ctx;
    const int64_t t0 = 8 * g0, t1 = 8 * g1 < j->T ? 8 * g1 : j->T;
    prep_quantize_acts(ctx, t0, t1, worker);
    quant_packed_lanes(j->act, j->act_bytes, j->T, t0, t1, j->w[0]->w->cols, j->lanes);
}

static const rope *layer_rope(const cpu_backend *cb, int32_t layer) {
    return &cb->rope[cb->m->layers[layer].rope_id];
}

typedef struct buffers buffers;
static void matmul(cpu_backend *cb, const cpu_weight *w, float *x, int64_t T, float *out, buffers *B);

/* ---- attention over one span's pot ---------------------------------------------- */

typedef struct attn_job {
    cpu_backend *cb;
    const backend_span *sp;
    int32_t layer, n0, n_keys; /* n0 = slots before the span */
    int32_t n_pre;             /* pot keys attended: n0, or n_attend with a subset */
    const float *q;            /* [n_tokens][n_head * head_dim], rotated */
    float *out;                /* [n_tokens][n_head * head_dim] */
    int in_place;              /* keys from the pot's rotated-key cache, values from the pot */
    float *krot;               /* [n_head_kv][n_keys][head_dim] rotated keys (in place: [n_threads][head_dim]) */
    float *vals;               /* [n_head_kv][n_keys][head_dim] values as f32 */
    float *probs;              /* [n_threads][ATTN_TILE_QUERIES][n_keys] */
    float *head_scores;        /* [n_head][n_keys] or NULL */
    float *partial;            /* key-split decoding: [split][n_head][2 + head_dim] (max, sum, output) */
    const struct attn_task *tasks;
} attn_job;

/* Queries attended together: heads [h0, h0 + n_heads) of one KV group, for
 * tokens [t0, t0 + n_tok), taken ATTN_TILE_QUERIES at most at a time, so each
 * key and value row is read once for all of them. split >= 0: a decoding
 * token's heads over keys [split * ATTN_SPLIT_KEYS, + ATTN_SPLIT_KEYS) only,
 * merged afterwards (merge_splits). */
typedef struct attn_task {
    int32_t h0, n_heads, t0, n_tok, split;
} attn_task;

/* ATTN_SPLIT_KEYS: a decoding token over more keys than this attends in key
 * ranges of this size, one task per (KV group, range), so two threads share
 * a long pot evenly instead of one taking two of three groups. The ranges
 * depend on the key count only: the same bits on any number of threads. */
enum { ATTN_TILE_QUERIES = 16, ATTN_SPLIT_KEYS = 256 };

static int32_t attn_splits(int32_t n_keys) { return (n_keys + ATTN_SPLIT_KEYS - 1) / ATTN_SPLIT_KEYS; }

/* Pot slot of attended key k of KV head g: the pot's keys (all, or the
 * span's subset), then the span's own tokens. */
static int32_t key_slot(const attn_job *j, int32_t g, int32_t k) {
    const backend_span *sp = j->sp;
    if (k >= j->n_pre) return j->n0 + (k - j->n_pre);
    if (!sp->attend_slots) return k;
    return sp->attend_slots[((size_t)j->layer * j->cb->m->n_head_kv + g) * sp->n_attend + k];
}

/* Loads keys (rotated to their slot's position, rounded to the pot's entry
 * precision) and values of the pot as f32, for pots without a rotated-key
 * cache and for partial attention; slots the cache holds come from it. */
static void load_keys_values(void *ctx, int64_t a, int64_t b, int worker) {
    (void)worker;
    attn_job *j = ctx;
    const model *m = j->cb->m;
    const pot *p = j->sp->kv;
    for (int64_t task = a; task < b; task++) {
        int32_t g = (int32_t)(task / j->n_keys), k = (int32_t)(task % j->n_keys);
        int32_t slot = key_slot(j, g, k);
        float *kr = j->krot + ((size_t)g * j->n_keys + k) * m->head_dim;
        pot_read_v(p, j->layer, g, slot, 1, j->vals + (kr - j->krot));
        if (p->k_rot && slot < p->n_rot && !pot_ring_rows(p, j->layer)) { /* (a ring layer has no cache) */
            pot_read_k_rotated(p, j->layer, g, slot, 1, kr);
            continue;
        }
        pot_read_k(p, j->layer, g, slot, 1, kr);
        rope_rotate(layer_rope(j->cb, j->layer), kr, pot_rope_pos(p, j->layer, g, slot));
        pot_round_row(p, kr); /* the value the cache would hold: the same bits with or without it */
    }
}

/* Pots with a rotated-key cache: rotates the keys of slots [n_rot, n_keys)
 * of this layer into it; attention then reads keys and values in place. */
static void fill_rotated(void *ctx, int64_t a, int64_t b, int worker) {
    attn_job *j = ctx;
    const model *m = j->cb->m;
    pot *p = j->sp->kv;
    int32_t n_new = j->n_keys - p->n_rot;
    float *kr = j->krot + (size_t)worker * m->head_dim;
    for (int64_t task = a; task < b; task++) {
        int32_t g = (int32_t)(task / n_new), slot = p->n_rot + (int32_t)(task % n_new);
        pot_read_k(p, j->layer, g, slot, 1, kr);
        rope_rotate(layer_rope(j->cb, j->layer), kr, pot_rope_pos(p, j->layer, g, slot));
        pot_round_row(p, kr);
        pot_write_k_rotated(p, j->layer, g, slot, kr);
    }
}

/* Tokens attended together with n_heads heads: as many as fit the tile,
 * in whole multiples of 4 queries where one exists (the kernels' tiles). */
static int32_t tokens_per_tile(int32_t n_heads) {
    int32_t nt = ATTN_TILE_QUERIES / n_heads;
    for (int32_t b = nt; b > 0; b--)
        if (n_heads * b % 4 == 0) return b;
    return nt > 0 ? nt : 1;
}

/* Scores of token t's query against keys [0, n_vis) whose RoPE position lies
 * `window` or more before the query's become -inf (llama.cpp's standard
 * sliding-window mask: a query sees itself and the window - 1 before it). */
static void mask_outside_window(const attn_job *j, int32_t g, int32_t t, int32_t window, float *p, int32_t n_vis) {
    const pot *kv = j->sp->kv;
    const int64_t qpos = pot_rope_pos(kv, j->layer, g, j->n0 + t);
    for (int32_t k = 0; k < n_vis; k++)
        if (qpos - pot_rope_pos(kv, j->layer, g, key_slot(j, g, k)) >= window) p[k] = -INFINITY;
}

/* Heads [h0, h0+nh) x tokens [t0, t0+nt), nh * nt <= ATTN_TILE_QUERIES:
 * scores against every key the last token sees (earlier tokens' extra keys
 * get probability 0: causal), a softmax per query, then the values. */
static void attend_tile(attn_job *j, int32_t h0, int32_t nh, int32_t t0, int32_t nt, float *P) {
    const model *m = j->cb->m;
    int32_t hd = m->head_dim, g = h0 / (m->n_head / m->n_head_kv), nq = nh * nt, n_keys = j->n_keys;
    int32_t n_vis_max = j->n_pre + t0 + nt; /* causal: keys up to and including the token */
    const float *qs[ATTN_TILE_QUERIES];
    float *ys[ATTN_TILE_QUERIES];
    for (int32_t ti = 0; ti < nt; ti++)
        for (int32_t hi = 0; hi < nh; hi++) {
            size_t at = ((size_t)(t0 + ti) * m->n_head + h0 + hi) * hd;
            qs[ti * nh + hi] = j->q + at;
            ys[ti * nh + hi] = j->out + at;
            memset(j->out + at, 0, (size_t)hd * sizeof(float));
        }
    float scale = m->attn_scale;
    const pot *kv = j->sp->kv;
    size_t row0 = pot_row(kv, j->layer, g, 0) * hd;
    if (!j->in_place)
        simd_dot_rows_f32(P, n_keys, qs, nq, j->krot + (size_t)g * n_keys * hd, hd, n_vis_max, hd, scale);
    else if (kv->dtype == POT_F16)
        simd_dot_rows_f16(P, n_keys, qs, nq, (const uint16_t *)kv->k_rot + row0, hd, n_vis_max, hd, scale);
    else
        simd_dot_rows_f32(P, n_keys, qs, nq, (const float *)kv->k_rot + row0, hd, n_vis_max, hd, scale);
    const backend_span *sp = j->sp;
    const int32_t window = m->layers[j->layer].window;
    for (int32_t ti = 0; ti < nt; ti++) {
        int32_t t = t0 + ti, n_vis = j->n_pre + t + 1;
        if (window) /* a sliding-window layer: keys `window` or more positions back are out of sight */
            for (int32_t hi = 0; hi < nh; hi++) mask_outside_window(j, g, t, window, P + (size_t)(ti * nh + hi) * n_keys, n_vis);
        for (int32_t hi = 0; hi < nh; hi++) {
            float *p = P + (size_t)(ti * nh + hi) * n_keys;
            float mx = simd_max_f32(p, n_vis);
            double sum = simd_exp_sub_sum(p, n_vis, mx);
            float inv = (float)(1.0 / sum);
            for (int32_t k = 0; k < n_vis; k++) p[k] *= inv;
            for (int32_t k = n_vis; k < n_vis_max; k++) p[k] = 0;
            if (j->head_scores && t >= sp->score_row0 && t < sp->score_row0 + sp->n_score_rows) {
                float *hs = j->head_scores + (size_t)(h0 + hi) * n_keys;
                float w = sp->score_row_weight ? sp->score_row_weight[t - sp->score_row0] : 1.0f;
                if (sp->score_rows_max)
                    for (int32_t k = 0; k < n_vis; k++) hs[k] = fmaxf(hs[k], w * p[k]);
                else
                    for (int32_t k = 0; k < n_vis; k++) hs[k] += w * p[k];
            }
        }
    }
    if (!j->in_place)
        simd_axpy_rows_f32(ys, nq, P, n_keys, j->vals + (size_t)g * n_keys * hd, hd, n_vis_max, hd);
    else if (kv->dtype == POT_F16)
        simd_axpy_rows_f16(ys, nq, P, n_keys, (const uint16_t *)kv->v + row0, hd, n_vis_max, hd);
    else
        simd_axpy_rows_f32(ys, nq, P, n_keys, (const float *)kv->v + row0, hd, n_vis_max, hd);
}

/* A decoding token's heads [h0, h0 + nh) over one key range: softmax
 * numerators against the range's own max, their sum, and the unnormalised
 * output, into j->partial for merge_splits. */
static void attend_split(attn_job *j, const attn_task *tk, float *P) {
    const model *m = j->cb->m;
    int32_t hd = m->head_dim, g = tk->h0 / (m->n_head / m->n_head_kv), nq = tk->n_heads;
    int32_t k0 = tk->split * ATTN_SPLIT_KEYS, n = j->n_keys - k0 < ATTN_SPLIT_KEYS ? j->n_keys - k0 : ATTN_SPLIT_KEYS;
    const float *qs[ATTN_TILE_QUERIES];
    float *ys[ATTN_TILE_QUERIES];
    for (int32_t hi = 0; hi < nq; hi++) {
        qs[hi] = j->q + ((size_t)tk->t0 * m->n_head + tk->h0 + hi) * hd;
        ys[hi] = j->partial + ((size_t)tk->split * m->n_head + tk->h0 + hi) * (2 + hd) + 2;
        memset(ys[hi], 0, (size_t)hd * sizeof(float));
    }
    float scale = m->attn_scale;
    const pot *kv = j->sp->kv;
    size_t row0 = (pot_row(kv, j->layer, g, 0) + (size_t)k0) * hd;
    if (!j->in_place)
        simd_dot_rows_f32(P, n, qs, nq, j->krot + ((size_t)g * j->n_keys + k0) * hd, hd, n, hd, scale);
    else if (kv->dtype == POT_F16)
        simd_dot_rows_f16(P, n, qs, nq, (const uint16_t *)kv->k_rot + row0, hd, n, hd, scale);
    else
        simd_dot_rows_f32(P, n, qs, nq, (const float *)kv->k_rot + row0, hd, n, hd, scale);
    for (int32_t hi = 0; hi < nq; hi++) {
        float *p = P + (size_t)hi * n, mx = simd_max_f32(p, n);
        ys[hi][-2] = mx;
        ys[hi][-1] = (float)simd_exp_sub_sum(p, n, mx);
    }
    if (!j->in_place)
        simd_axpy_rows_f32(ys, nq, P, n, j->vals + ((size_t)g * j->n_keys + k0) * hd, hd, n, hd);
    else if (kv->dtype == POT_F16)
        simd_axpy_rows_f16(ys, nq, P, n, (const uint16_t *)kv->v + row0, hd, n, hd);
    else
        simd_axpy_rows_f32(ys, nq, P, n, (const float *)kv->v + row0, hd, n, hd);
}

/* Every head of a key-split decoding token: out = sum over ranges of
 * exp(max_r - max) * output_r / sum over ranges of exp(max_r - max) * sum_r. */
static void merge_splits(const attn_job *j, int32_t n_split) {
    const model *m = j->cb->m;
    int32_t hd = m->head_dim;
    for (int32_t h = 0; h < m->n_head; h++) {
        float mx = -INFINITY;
        for (int32_t s = 0; s < n_split; s++) mx = fmaxf(mx, j->partial[((size_t)s * m->n_head + h) * (2 + hd)]);
        float *out = j->out + (size_t)h * hd;
        memset(out, 0, (size_t)hd * sizeof(float));
        double sum = 0;
        for (int32_t s = 0; s < n_split; s++) {
            const float *pr = j->partial + ((size_t)s * m->n_head + h) * (2 + hd);
            float w = expf(pr[0] - mx);
            sum += (double)w * pr[1];
            for (int32_t e = 0; e < hd; e++) out[e] += w * pr[2 + e];
        }
        float inv = (float)(1.0 / sum);
        for (int32_t e = 0; e < hd; e++) out[e] *= inv;
    }
}

/* A task's tokens in order (a head's score rows accumulate in token order:
 * the same bits however many threads run). */
static void run_task(attn_job *j, const attn_task *tk, float *P) {
    if (tk->split >= 0) {
        attend_split(j, tk, P);
        return;
    }
    int32_t step = tokens_per_tile(tk->n_heads);
    for (int32_t t = tk->t0; t < tk->t0 + tk->n_tok; t += step) {
        int32_t nt = tk->t0 + tk->n_tok - t < step ? tk->t0 + tk->n_tok - t : step;
        attend_tile(j, tk->h0, tk->n_heads, t, nt, P);
    }
}

static void attend_tasks(void *ctx, int64_t a, int64_t b, int worker) {
    attn_job *j = ctx;
    float *P = j->probs + (size_t)worker * ATTN_TILE_QUERIES * j->n_keys;
    for (int64_t i = a; i < b; i++) run_task(j, &j->tasks[i], P);
}

/* Splits a span's queries into tasks: rows that score attention one task
 * per head (each head's sums owned by one task), the other rows by KV group
 * and token block; groups split into single heads only when there are fewer
 * tasks than threads (a decode step on many threads): a group's tile reads
 * each key and value row once for all its heads, which beats balancing the
 * threads exactly (2 threads, 3 groups: +5 % decode at context 128 and 2048
 * over 9 single-head tasks, A/B on SmolLM2-135M). */
static int32_t plan_attention(const model *m, const backend_span *sp, int32_t layer, int32_t n_keys, int has_scores,
                              int n_threads, attn_task *out) {
    int32_t group = m->n_head / m->n_head_kv, n = 0;
    if (sp->n_tokens == 1 && !sp->prefill && !has_scores && attn_splits(n_keys) > 1 && group <= ATTN_TILE_QUERIES &&
        !m->layers[layer].window) { /* (key ranges are not masked: attend_tile does that) */
        for (int32_t g = 0; g < m->n_head_kv; g++) /* a decoding token over a long pot */
            for (int32_t s = 0; s < attn_splits(n_keys); s++) out[n++] = (attn_task){g * group, group, 0, 1, s};
        return n;
    }
    int32_t s0 = has_scores ? sp->score_row0 : sp->n_tokens, s1 = has_scores ? s0 + sp->n_score_rows : s0;
    int32_t nh = group < ATTN_TILE_QUERIES ? group : ATTN_TILE_QUERIES;
    int32_t block = tokens_per_tile(nh);
    int32_t free_rows = sp->n_tokens - (s1 - s0);
    int64_t n_blocks = (free_rows + block - 1) / block;
    if (n_blocks * m->n_head_kv * ((group + nh - 1) / nh) < n_threads) nh = 1, block = tokens_per_tile(1);
    for (int32_t h = 0; h < m->n_head; h++) /* scoring rows */
        if (s1 > s0) out[n++] = (attn_task){h, 1, s0, s1 - s0, -1};
    int32_t ranges[2][2] = {{0, s0}, {s1, sp->n_tokens}};
    for (int r = 0; r < 2; r++)
        for (int32_t t = ranges[r][0]; t < ranges[r][1]; t += block)
            for (int32_t h = 0; h < m->n_head; h += nh) {
                int32_t heads = (h / group + 1) * group - h; /* to the end of h's group */
                out[n++] = (attn_task){h, heads < nh ? heads : nh, t,
                                       ranges[r][1] - t < block ? ranges[r][1] - t : block, -1};
            }
    return n;
}

/* Combines per-head scores into the span's [layer][kv head][key] output. */
static void store_scores(const model *m, const backend_span *sp, int32_t layer, int32_t n_keys,
                         const float *head_scores) {
    int32_t group = m->n_head / m->n_head_kv;
    for (int32_t g = 0; g < m->n_head_kv; g++) {
        float *dst = sp->scores + ((size_t)layer * m->n_head_kv + g) * n_keys;
        for (int32_t k = 0; k < n_keys; k++) {
            float acc = head_scores[(size_t)g * group * n_keys + k];
            for (int32_t i = 1; i < group; i++) {
                float s = head_scores[((size_t)g * group + i) * n_keys + k];
                acc = sp->score_combine == BACKEND_SCORE_MAX ? fmaxf(acc, s) : acc + s;
            }
            dst[k] = acc;
        }
    }
}

/* ---- the forward pass ------------------------------------------------------------- */

struct buffers {
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* activations, [T][...] */
    float *scratch;                             /* [n_threads][max cols] */
    uint8_t *act;                               /* [T][max cols] quantised activations (f32 worst case) */
    uint8_t *lanes;                             /* act as lanes (quant_packed_lanes), or NULL */
    size_t lanes_bytes;
    float *krot, *vals, *probs, *head_scores;   /* attention, sized for the largest span */
    float *partial;                             /* key-split decoding: [splits][n_head][2 + head_dim] */
    attn_task *tasks; /* [n_head][T + 1] (at most one per head and token, plus each head's scoring
                         task) or [n_head_kv][splits], whichever is more */
    /* decoding spans attended together (batch_attention): their jobs, and
     * for each task the job it belongs to; partial above has room for each */
    struct attn_job *jobs;
    int32_t *task_job;
    int32_t *batch_which; /* [n_spans] the spans of batch_attention, or of last_row_logits */
    int64_t *batch_t;     /* [n_decode] their token's row */
    int64_t *span_t0;     /* [n_spans] each span's first row */
    uint8_t *span_batched; /* [n_spans] attends in batch_attention */
};

/* The quantised products' units go to the threads in chunks, each to the
 * next free thread: with one equal range per thread the first to finish
 * waited for the other (one thread is often slowed by the machine: 2
 * threads, prefill of 512 on the 1.5B Q6_K file, the ranges' times differed
 * by 0.28 s in 4.7 s). About 16 chunks per thread (medians of 8 alternated
 * runs: 85.0 tok/s against 82.6 with 8 and 79.7 with one range each), an
 * even number of units (the pair kernels take groups two at a time), and at
 * least MATMUL_MIN_CHUNK_BYTES of weights a chunk: a 135M model's decode
 * step cut into chunks of a few KB lost more to handing them out than it won. */
enum { MATMUL_CHUNKS_PER_THREAD = 16, MATMUL_MIN_CHUNK_BYTES = 64 * 1024 };

static int64_t matmul_chunk(const cpu_weight *cw, int64_t units, int n_threads) {
    const int64_t per = (int64_t)n_threads * MATMUL_CHUNKS_PER_THREAD;
    const size_t unit_bytes = cw->packed ? quant_packed_group_bytes(cw->packed_type, cw->w->cols) : cw->w->row_bytes;
    int64_t c = (units + per - 1) / per, least = (int64_t)(MATMUL_MIN_CHUNK_BYTES / (unit_bytes ? unit_bytes : 1));
    if (c < least) c = least;
    return (c + 1) & ~(int64_t)1;
}

/* out_i = x W_i^T for the n weights (same input width), fused into one loop
 * while they share an activation format; `prep` first makes x's rows. */
static void matmul_n(cpu_backend *cb, int n, const cpu_weight *const *w, float *x, int64_t T, float *const *out,
                     const row_prep *prep, buffers *B) {
    matmul_job j = {.x = x, .T = T, .scratch = B->scratch, .act = B->act};
    if (prep) j.prep = *prep;
    int64_t units = 0;
    while (j.n_w < n && j.n_w < MATMUL_MAX_WEIGHTS &&
           (cb->exact || quant_vec_dot_type(w[j.n_w]->w->type) == quant_vec_dot_type(w[0]->w->type))) {
        j.w[j.n_w] = w[j.n_w];
        j.out[j.n_w] = out[j.n_w];
        units += units_of(w[j.n_w++]);
    }
    if (cb->exact) {
        if (j.prep.kind != PREP_NONE) tp_parallel_for(cb->tp, T, prep_rows, &j);
        tp_parallel_for(cb->tp, units, matmul_rows_exact, &j);
    } else {
        j.act_bytes = quant_act_row_bytes(w[0]->w->type, w[0]->w->cols);
        for (int i = 0; i < j.n_w && B->lanes; i++) { /* the packed K-quants read lanes, laid out once here */
            const size_t need = j.w[i]->packed ? quant_packed_lanes_bytes(j.w[i]->packed_type, T, w[0]->w->cols) : 0;
            if (need && need <= B->lanes_bytes) j.lanes = B->lanes;
        }
        if (j.lanes) tp_parallel_for(cb->tp, (T + 7) / 8, prep_quantize_lanes, &j);
        else tp_parallel_for(cb->tp, T, prep_quantize_acts, &j);
        tp_parallel_for_chunked(cb->tp, units, matmul_chunk(j.w[0], units, tp_threads(cb->tp)), matmul_rows_quant, &j);
    }
    /* the rest of the weights (another activation format) read the prepared rows */
    if (j.n_w < n) matmul_n(cb, n - j.n_w, w + j.n_w, x, T, out + j.n_w, NULL, B);
}

static void matmul(cpu_backend *cb, const cpu_weight *w, float *x, int64_t T, float *out, buffers *B) {
    matmul_n(cb, 1, &w, x, T, &out, NULL, B);
}

static void free_buffers(buffers *B) {
    float **all[] = {&B->x, &B->xb, &B->q, &B->k, &B->v, &B->att, &B->hb, &B->hb2,
                     &B->scratch, &B->krot, &B->vals, &B->probs, &B->head_scores, &B->partial};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free(*all[i]);
        *all[i] = NULL;
    }
    free(B->act);
    free(B->lanes);
    free(B->tasks);
    free(B->jobs);
    free(B->task_job);
    free(B->batch_which);
    free(B->batch_t);
    free(B->span_t0);
    free(B->span_batched);
    B->batch_which = NULL;
    B->batch_t = NULL;
    B->span_t0 = NULL;
    B->span_batched = NULL;
    B->act = NULL;
    B->lanes = NULL;
    B->tasks = NULL;
    B->jobs = NULL;
    B->task_job = NULL;
}

/* Tasks of one decoding token's attention (plan_attention): one per head
 * at most, or one per KV group and key range. */
static int64_t decode_tasks(const model *m, int64_t max_keys) {
    int64_t split = (int64_t)m->n_head_kv * attn_splits((int32_t)max_keys);
    return split > m->n_head ? split : m->n_head;
}

/* n_decode: spans of one token (batch_attention's room). */
static int alloc_buffers(buffers *B, const model *m, int64_t T, int64_t max_keys, int32_t n_spans, int64_t n_decode,
                         int n_threads) {
    int64_t dq = (int64_t)m->n_head * m->head_dim, dkv = (int64_t)m->n_head_kv * m->head_dim;
    int64_t max_cols = m->n_ff > m->n_embd ? m->n_ff : m->n_embd;
    if (dq > max_cols) max_cols = dq;
    memset(B, 0, sizeof *B);
    B->x = malloc((size_t)T * m->n_embd * sizeof(float));
    B->xb = malloc((size_t)T * (m->n_embd > dq ? m->n_embd : dq) * sizeof(float));
    B->q = malloc((size_t)T * dq * sizeof(float));
    B->k = malloc((size_t)T * dkv * sizeof(float));
    B->v = malloc((size_t)T * dkv * sizeof(float));
    B->att = malloc((size_t)T * dq * sizeof(float));
    B->hb = malloc((size_t)T * m->n_ff * sizeof(float));
    B->hb2 = malloc((size_t)T * m->n_ff * sizeof(float));
    B->scratch = malloc((size_t)n_threads * max_cols * sizeof(float));
    B->act = malloc((size_t)T * max_cols * sizeof(float));
    /* lanes for the widest input, where this CPU reads them (else none) */
    const int64_t qk = (int64_t)quant_block_elems(GGML_TYPE_Q4_K);
    B->lanes_bytes = quant_packed_lanes_bytes(GGML_TYPE_Q4_K, T, (max_cols + qk - 1) / qk * qk);
    B->lanes = B->lanes_bytes ? malloc(B->lanes_bytes) : NULL;
    B->krot = malloc((size_t)m->n_head_kv * max_keys * m->head_dim * sizeof(float));
    B->vals = malloc((size_t)m->n_head_kv * max_keys * m->head_dim * sizeof(float));
    B->probs = malloc((size_t)n_threads * ATTN_TILE_QUERIES * max_keys * sizeof(float));
    B->head_scores = malloc((size_t)m->n_head * max_keys * sizeof(float));
    if (n_decode < 1) n_decode = 1;
    int64_t n_tasks = (int64_t)m->n_head * (T + 1), n_batch_tasks = n_decode * decode_tasks(m, max_keys);
    if (n_batch_tasks > n_tasks) n_tasks = n_batch_tasks;
    B->tasks = malloc((size_t)n_tasks * sizeof *B->tasks);
    B->task_job = malloc((size_t)n_tasks * sizeof *B->task_job);
    B->jobs = malloc((size_t)n_decode * sizeof *B->jobs);
    B->batch_which = malloc((size_t)n_spans * sizeof *B->batch_which);
    B->batch_t = malloc((size_t)n_decode * sizeof *B->batch_t);
    B->span_t0 = malloc((size_t)n_spans * sizeof *B->span_t0);
    B->span_batched = malloc((size_t)n_spans);
    B->partial = malloc((size_t)n_decode * attn_splits((int32_t)max_keys) * m->n_head * (2 + m->head_dim) * sizeof(float));
    if (!B->x || !B->xb || !B->q || !B->k || !B->v || !B->att || !B->hb || !B->hb2 ||
        !B->scratch || !B->act || !B->krot || !B->vals || !B->probs || !B->head_scores || !B->tasks ||
        !B->partial || !B->task_job || !B->jobs || !B->batch_which || !B->batch_t ||
        !B->span_t0 || !B->span_batched) {
        free_buffers(B);
        return -1;
    }
    return 0;
}


static void span_attention(cpu_backend *cb, const backend_span *sp, int32_t layer,
                           const float *q, float *out, buffers *B) {
    const model *m = cb->m;
    int32_t n0 = sp->kv->n, n_pre = sp->attend_slots ? sp->n_attend : n0;
    int32_t n_keys = n_pre + sp->n_tokens;
    attn_job j = {.cb = cb, .sp = sp, .layer = layer, .n0 = n0, .n_pre = n_pre, .n_keys = n_keys, .q = q,
                  .out = out, .krot = B->krot, .vals = B->vals, .probs = B->probs,
                  .head_scores = sp->scores ? B->head_scores : NULL, .partial = B->partial};
    j.in_place = sp->kv->k_rot && !sp->attend_slots && !pot_ring_rows(sp->kv, layer); /* (rings wrap) */
    if (j.in_place)
        tp_parallel_for(cb->tp, (int64_t)m->n_head_kv * (n_keys - sp->kv->n_rot), fill_rotated, &j);
    else
        tp_parallel_for(cb->tp, (int64_t)m->n_head_kv * n_keys, load_keys_values, &j);
    if (j.head_scores) memset(j.head_scores, 0, (size_t)m->n_head * n_keys * sizeof(float));
    j.tasks = B->tasks;
    int32_t n_tasks = plan_attention(m, sp, layer, n_keys, j.head_scores != NULL, tp_threads(cb->tp), B->tasks);
    /* one task at a time to whichever thread is free: a causal span's later
     * tokens attend more keys, so equal ranges of tasks are unequal work
     * (2 threads, prefill of 512: the second thread's share took 1.7x the first's) */
    tp_parallel_for_chunked(cb->tp, n_tasks, 1, attend_tasks, &j);
    if (n_tasks && B->tasks[0].split >= 0) merge_splits(&j, attn_splits(n_keys));
    if (j.head_scores) store_scores(m, sp, layer, n_keys, j.head_scores);
}

/* Decoding spans (one token each, a rotated-key cache, every slot, no
 * scores) of one layer attend in two parallel loops for all of them, not two
 * per span: a batched step of 8 sequences had 16 thread-pool barriers per
 * layer, with 3 tasks (KV groups) in each for 2 threads. Every task and its
 * arithmetic are span_attention's: the same bits. */
static int batchable(const backend_span *sp, int32_t layer) {
    return sp->n_tokens == 1 && !sp->prefill && sp->kv->k_rot && !sp->attend_slots && !sp->scores &&
           !pot_ring_rows(sp->kv, layer);
}

typedef struct batch_job {
    attn_job *jobs;
    int32_t n_jobs;
    const int32_t *task_job;
    const attn_task *tasks;
    float *probs;
    size_t probs_stride; /* per worker: tiles of the longest span's keys */
} batch_job;

static void batch_tasks(void *ctx, int64_t a, int64_t b, int worker) {
    batch_job *bj = ctx;
    float *P = bj->probs + (size_t)worker * bj->probs_stride;
    for (int64_t i = a; i < b; i++) run_task(&bj->jobs[bj->task_job[i]], &bj->tasks[i], P);
}

/* The spans `which[0..n)`, whose token is row t_of[i] of q and out, and
 * whose new keys are in their rotated-key caches (store_spans). */
static void batch_attention(cpu_backend *cb, const backend_span *spans, const int32_t *which, const int64_t *t_of,
                            int32_t n, int32_t layer, buffers *B) {
    const model *m = cb->m;
    const int64_t dq = (int64_t)m->n_head * m->head_dim;
    int64_t n_tasks = 0;
    int32_t max_keys = 0;
    for (int32_t i = 0; i < n; i++) {
        const backend_span *sp = &spans[which[i]];
        const int32_t n_keys = sp->kv->n + 1;
        if (n_keys > max_keys) max_keys = n_keys;
    }
    for (int32_t i = 0; i < n; i++) {
        const backend_span *sp = &spans[which[i]];
        attn_job *j = &B->jobs[i];
        *j = (attn_job){.cb = cb, .sp = sp, .layer = layer, .n0 = sp->kv->n, .n_pre = sp->kv->n,
                        .n_keys = sp->kv->n + 1, .q = B->q + t_of[i] * dq, .out = B->att + t_of[i] * dq,
                        .in_place = 1, .krot = B->krot, .vals = B->vals, .probs = B->probs,
                        .partial = B->partial + (size_t)i * attn_splits(max_keys) * m->n_head * (2 + m->head_dim)};
        j->tasks = B->tasks + n_tasks;
        const int32_t k = plan_attention(m, sp, layer, j->n_keys, 0, tp_threads(cb->tp), B->tasks + n_tasks);
        for (int32_t x = 0; x < k; x++) B->task_job[n_tasks + x] = i;
        n_tasks += k;
    }
    batch_job bj = {.jobs = B->jobs, .n_jobs = n, .task_job = B->task_job, .tasks = B->tasks, .probs = B->probs,
                    .probs_stride = (size_t)ATTN_TILE_QUERIES * max_keys};
    tp_parallel_for(cb->tp, n_tasks, batch_tasks, &bj);
    for (int32_t i = 0; i < n; i++)
        if (B->jobs[i].tasks[0].split >= 0) merge_splits(&B->jobs[i], attn_splits(B->jobs[i].n_keys));
}

static void add_bias(float *y, const float *b, int64_t T, int64_t n) {
    if (!b) return;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += b[i];
}

/* Each span's new keys and values into its pot and its queries rotated; a
 * batched decoding span's new keys also into its rotated-key cache (what
 * fill_rotated does for the others). Spans are handed out whole (their pots
 * are distinct), so a batched decode step does this on all threads, without
 * a barrier of its own for the cache. */
typedef struct store_job {
    cpu_backend *cb;
    backend_span *spans;
    const int64_t *t0;     /* [n_spans] the span's first row */
    const uint8_t *batched;
    int32_t layer;
    buffers *B;
} store_job;

static void store_spans(void *ctx, int64_t a, int64_t b, int worker) {
    const store_job *sj = ctx;
    const model *m = sj->cb->m;
    const int64_t hd = m->head_dim, dq = (int64_t)m->n_head * hd, dkv = (int64_t)m->n_head_kv * hd;
    const int32_t l = sj->layer;
    for (int64_t s = a; s < b; s++) {
        backend_span *sp = &sj->spans[s];
        pot *p = sp->kv;
        for (int32_t i = 0; i < sp->n_tokens; i++) {
            int64_t t = sj->t0[s] + i, slot = (int64_t)p->n + i;
            for (int32_t g = 0; g < m->n_head_kv; g++) /* on the host already (cpu_forward): cannot fail */
                (void)pot_write(p, l, g, (int32_t)slot, sj->B->k + t * dkv + g * hd, sj->B->v + t * dkv + g * hd);
            int64_t pos = pot_rope_pos(p, l, 0, (int32_t)slot);
            for (int32_t h = 0; h < m->n_head; h++) rope_rotate(layer_rope(sj->cb, l), sj->B->q + t * dq + h * hd, pos);
        }
        if (!sj->batched[s]) continue;
        attn_job j = {.cb = sj->cb, .sp = sp, .layer = l, .n_keys = p->n + 1, .krot = sj->B->scratch};
        const int64_t n_new = j.n_keys - p->n_rot;
        fill_rotated(&j, 0, (int64_t)m->n_head_kv * n_new, worker);
    }
}

typedef struct norm_job {
    float *x; /* [rows][n], normed in place */
    int64_t n;
    const float *w;
    float eps;
} norm_job;

static void norm_rows_range(void *ctx, int64_t a, int64_t b, int worker) {
    (void)worker;
    const norm_job *nj = ctx;
    for (int64_t r = a; r < b; r++) simd_rmsnorm(nj->x + r * nj->n, nj->x + r * nj->n, nj->w, nj->n, nj->eps);
}

/* rows of n elements of x := rmsnorm(row) * w, in place (QK-norm per head, gemma3's post-norms) */
static void norm_rows(cpu_backend *cb, float *x, int64_t rows, int64_t n, const float *w, float eps) {
    norm_job nj = {.x = x, .n = n, .w = w, .eps = eps};
    tp_parallel_for(cb->tp, rows, norm_rows_range, &nj);
}

static void forward_layer(cpu_backend *cb, int32_t l, backend_span *spans, int32_t n_spans,
                          int64_t T, buffers *B) {
    const model *m = cb->m;
    const layer_weights *lw = &m->layers[l];
    const cpu_weight *W = cb->mats + (size_t)l * W_PER_LAYER;
    int64_t hd = m->head_dim, dq = (int64_t)m->n_head * hd, dkv = (int64_t)m->n_head_kv * hd;
    /* after layer 0, xb holds the previous layer's FFN output, added here */
    const row_prep attn_in = {.kind = l ? PREP_ADD_NORM : PREP_NORM, .res = B->x, .w = lw->attn_norm,
                              .eps = m->norm_eps};
    matmul_n(cb, 3, (const cpu_weight *[]){&W[W_Q], &W[W_K], &W[W_V]}, B->xb, T, (float *[]){B->q, B->k, B->v},
             &attn_in, B);
    add_bias(B->q, lw->bq, T, dq);
    add_bias(B->k, lw->bk, T, dkv);
    add_bias(B->v, lw->bv, T, dkv);
    if (lw->q_norm) { /* QK-norm: each head's query and key, before RoPE (the pot keeps them normed) */
        norm_rows(cb, B->q, T * m->n_head, hd, lw->q_norm, m->norm_eps);
        norm_rows(cb, B->k, T * m->n_head_kv, hd, lw->k_norm, m->norm_eps);
    }

    int64_t t0 = 0, n_batch = 0;
    for (int32_t s = 0; s < n_spans; s++) {
        B->span_t0[s] = t0;
        t0 += spans[s].n_tokens;
        n_batch += batchable(&spans[s], l);
    }
    if (n_batch < 2) n_batch = 0; /* one decoding span: span_attention */
    for (int32_t s = 0; s < n_spans; s++) B->span_batched[s] = n_batch && batchable(&spans[s], l);
    store_job sj = {.cb = cb, .spans = spans, .t0 = B->span_t0, .batched = B->span_batched, .layer = l, .B = B};
    tp_parallel_for(cb->tp, n_spans, store_spans, &sj);
    n_batch = 0;
    for (int32_t s = 0; s < n_spans; s++) {
        const int64_t ts = B->span_t0[s];
        if (B->span_batched[s]) {
            B->batch_which[n_batch] = s;
            B->batch_t[n_batch++] = ts;
        } else {
            span_attention(cb, &spans[s], l, B->q + ts * dq, B->att + ts * dq, B);
        }
    }
    if (n_batch) batch_attention(cb, spans, B->batch_which, B->batch_t, (int32_t)n_batch, l, B);
    matmul(cb, &W[W_O], B->att, T, B->xb, B);
    if (lw->attn_post_norm) norm_rows(cb, B->xb, T, m->n_embd, lw->attn_post_norm, m->norm_eps);

    /* x += attention's output, then the FFN's norm of it */
    const row_prep ffn_in = {.kind = PREP_ADD_NORM, .res = B->x, .w = lw->ffn_norm, .eps = m->norm_eps};
    matmul_n(cb, 2, (const cpu_weight *[]){&W[W_GATE], &W[W_UP]}, B->xb, T, (float *[]){B->hb, B->hb2}, &ffn_in, B);
    /* the default path rounds GELU through f16 as llama.cpp does; --exact keeps f32 */
    const row_prep glu = {.kind = m->ffn_act != FFN_GELU_TANH ? PREP_SWIGLU : cb->exact ? PREP_GEGLU : PREP_GEGLU_F16,
                          .up = B->hb2};
    matmul_n(cb, 1, (const cpu_weight *[]){&W[W_DOWN]}, B->hb, T, (float *[]){B->xb}, &glu, B);
    if (lw->ffn_post_norm) norm_rows(cb, B->xb, T, m->n_embd, lw->ffn_post_norm, m->norm_eps);
    /* x += xb: in the next layer's first product, or after the last layer */
}

static const cpu_weight *output_of(const cpu_backend *cb) {
    return cb->mats + (size_t)cb->m->n_layer * W_PER_LAYER;
}

/* Logits of every row of an ALL-mode span. */
static void span_logits_all(cpu_backend *cb, backend_span *sp, const float *x, buffers *B) {
    const model *m = cb->m;
    int64_t d = m->n_embd;
    for (int64_t r = 0; r < sp->n_tokens; r++) /* xb has room for T >= n_tokens rows */
        simd_rmsnorm(B->xb + r * d, x + r * d, m->output_norm, d, m->norm_eps);
    matmul(cb, output_of(cb), B->xb, sp->n_tokens, sp->logits, B);
}

/* Adds the chosen rows' final-normed hidden states to the span's hidden_sum. */
static void span_hidden_sum(cpu_backend *cb, backend_span *sp, const float *x, buffers *B) {
    const model *m = cb->m;
    int64_t d = m->n_embd;
    for (int64_t r = sp->hidden_row0; r < sp->hidden_row0 + sp->n_hidden_rows; r++) {
        simd_rmsnorm(B->xb, x + r * d, m->output_norm, d, m->norm_eps);
        for (int64_t i = 0; i < d; i++) sp->hidden_sum[i] += B->xb[i];
    }
}

typedef struct logits_job {
    backend_span *spans;
    const int32_t *which; /* row i of `all` is span which[i]'s */
    const float *all;
    int64_t V;
} logits_job;

static void copy_logits(void *ctx, int64_t a, int64_t b, int worker) {
    (void)worker;
    const logits_job *lj = ctx;
    for (int64_t i = a; i < b; i++)
        memcpy(lj->spans[lj->which[i]].logits, lj->all + (size_t)i * lj->V, (size_t)lj->V * sizeof(float));
}

/* Logits of the last row of every LAST-mode span, in one matrix product: in
 * batched decode each span is one token, and the LM head (the largest matrix
 * of a small model) then streams once per step instead of once per sequence. */
static int last_row_logits(cpu_backend *cb, backend_span *spans, int32_t n_spans, buffers *B) {
    const model *m = cb->m;
    int64_t d = m->n_embd, V = m->n_vocab, n = 0, t0 = 0;
    for (int32_t s = 0; s < n_spans; s++) {
        const backend_span *sp = &spans[s];
        t0 += sp->n_tokens;
        if (sp->logits_mode == BACKEND_LOGITS_LAST)
            simd_rmsnorm(B->xb + n++ * d, B->x + (t0 - 1) * d, m->output_norm, d, m->norm_eps);
    }
    if (!n) return 0;
    if (n == 1) { /* straight into the one span's buffer */
        for (int32_t s = 0; s < n_spans; s++)
            if (spans[s].logits_mode == BACKEND_LOGITS_LAST) matmul(cb, output_of(cb), B->xb, 1, spans[s].logits, B);
        return 0;
    }
    float *out = malloc((size_t)n * V * sizeof(float));
    if (!out) return -1;
    matmul(cb, output_of(cb), B->xb, n, out, B);
    int32_t i = 0;
    for (int32_t s = 0; s < n_spans; s++)
        if (spans[s].logits_mode == BACKEND_LOGITS_LAST) B->batch_which[i++] = s;
    /* the copies (8 x 196 KB for SmolLM2) on all threads */
    logits_job lj = {.spans = spans, .which = B->batch_which, .all = out, .V = V};
    tp_parallel_for(cb->tp, n, copy_logits, &lj);
    free(out);
    return 0;
}

enum { LABEL_ROWS = 32 }; /* rows of logits materialised at once for label log-probs */

typedef struct label_job {
    float *logits; /* [n][V], overwritten */
    int64_t V;
    const int32_t *rows;
    backend_span *sp;
} label_job;

/* log-softmax at the label of each row, the rows shared among the threads
 * (this ran on one thread with a double exp per logit: 5 % of an ingest). */
static void label_rows(void *ctx, int64_t a, int64_t b, int worker) {
    (void)worker;
    const label_job *lj = ctx;
    for (int64_t i = a; i < b; i++) {
        float *l = lj->logits + (size_t)i * lj->V;
        const int32_t t = lj->rows[i];
        const float mx = simd_max_f32(l, lj->V), at = l[lj->sp->labels[t]];
        const double sum = simd_exp_sub_sum(l, lj->V, mx);
        lj->sp->label_logprob[t] = (float)((double)(at - mx) - log(sum));
    }
}

/* log-softmax at labels[t] for the span's labelled rows, LABEL_ROWS at a time,
 * so the [rows][n_vocab] logits never exceed a small buffer. */
static int span_label_logprobs(cpu_backend *cb, backend_span *sp, const float *x, buffers *B) {
    const model *m = cb->m;
    int64_t d = m->n_embd, V = m->n_vocab;
    float *logits = malloc((size_t)LABEL_ROWS * V * sizeof(float));
    int32_t rows[LABEL_ROWS];
    if (!logits) return -1;
    for (int32_t t = 0; t < sp->n_tokens;) {
        int32_t n = 0;
        for (; t < sp->n_tokens && n < LABEL_ROWS; t++)
            if (sp->labels[t] >= 0 && sp->labels[t] < V) {
                simd_rmsnorm(B->xb + n * d, x + (int64_t)t * d, m->output_norm, d, m->norm_eps);
                rows[n++] = t;
            }
        if (!n) continue;
        matmul(cb, output_of(cb), B->xb, n, logits, B);
        label_job lj = {.logits = logits, .V = V, .rows = rows, .sp = sp};
        tp_parallel_for(cb->tp, n, label_rows, &lj);
    }
    free(logits);
    return 0;
}

static int cpu_forward(backend *b, backend_span *spans, int32_t n_spans, char *err, size_t errlen) {
    cpu_backend *cb = (cpu_backend *)b;
    const model *m = cb->m;
    int64_t T, max_keys;
    if (n_spans <= 0) {
        snprintf(err, errlen, "forward: no spans");
        return -1;
    }
    if (backend_check_spans(m, spans, n_spans, &T, &max_keys, err, errlen)) return -1;
    buffers B;
    int64_t n_decode = 0;
    for (int32_t s = 0; s < n_spans; s++) n_decode += spans[s].n_tokens == 1 && !spans[s].prefill;
    if (alloc_buffers(&B, m, T, max_keys, n_spans, n_decode, tp_threads(cb->tp))) {
        snprintf(err, errlen, "forward: out of memory for %lld tokens", (long long)T);
        return -1;
    }
    int64_t d = m->n_embd, t = 0;
    int rc = 0;
    /* the host writes these pots' K/V (pot_write): a device's copy comes back first */
    for (int32_t s = 0; s < n_spans; s++)
        if (pot_host_take(spans[s].kv)) {
            free_buffers(&B);
            snprintf(err, errlen, "forward: the pot's K/V could not be read back from the device");
            return -1;
        }
    for (int32_t s = 0; s < n_spans; s++)
        for (int32_t i = 0; i < spans[s].n_tokens; i++, t++)
            quant_dequantize_row(m->tok_embd.type,
                                 m->tok_embd.data + (size_t)spans[s].tokens[i] * m->tok_embd.row_bytes,
                                 B.x + t * d, d);
    if (m->embd_scale != 1.0f)
        for (int64_t i = 0; i < T * d; i++) B.x[i] *= m->embd_scale;
    for (int32_t l = 0; l < m->n_layer; l++) forward_layer(cb, l, spans, n_spans, T, &B);
    for (int64_t i = 0; i < T * d; i++) B.x[i] += B.xb[i]; /* the last layer's FFN output */

    int64_t t0 = 0;
    for (int32_t s = 0; s < n_spans; s++) {
        backend_span *sp = &spans[s];
        pot_append_done(sp->kv, sp->n_tokens);
        if (sp->logits_mode == BACKEND_LOGITS_ALL) span_logits_all(cb, sp, B.x + t0 * d, &B);
        if (sp->hidden_sum) span_hidden_sum(cb, sp, B.x + t0 * d, &B);
        if (sp->labels && span_label_logprobs(cb, sp, B.x + t0 * d, &B)) rc = -1;
        t0 += sp->n_tokens;
    }
    if (last_row_logits(cb, spans, n_spans, &B)) rc = -1;
    for (int32_t s = 0; s < n_spans; s++) /* every layer rotated every slot into the cache */
        if (spans[s].kv->k_rot && !spans[s].attend_slots) spans[s].kv->n_rot = spans[s].kv->n;
    free_buffers(&B);
    if (rc) snprintf(err, errlen, "forward: out of memory for logits");
    return rc;
}

/* The packed type of w, or 0 when its rows stay as in the file. Q3_K rows
 * are Q6_K rows exactly: packed as Q6_K they take its kernels (the scalar
 * Q3_K product was 25x slower than llama.cpp's in prefill), at 6.6 instead
 * of 3.4 bits a weight in memory. */
static uint32_t packed_type_of(const weight *w) {
    if (w->type == GGML_TYPE_Q3_K && quant_packable(GGML_TYPE_Q6_K, w->rows, w->cols)) return GGML_TYPE_Q6_K;
    return quant_packable(w->type, w->rows, w->cols) ? w->type : 0;
}

static size_t packed_bytes_of(const weight *w, uint32_t type) {
    return ((size_t)(w->rows / 8) * quant_packed_group_bytes(type, w->cols) + 63) & ~(size_t)63;
}

/* One anonymous mapping for all packed matrices, aligned to 2 MB and asked
 * for in huge pages: a decode step streams every weight once, and with 4 KB
 * pages each 4 KB of the stream cost a TLB miss and the hardware prefetcher
 * stopped at every page's end (Qwen2.5 1.5B Q4_K_M decode ~11 % faster on the
 * 2-core Xeon with them, docs/benchmarks.md). Pages are only backed as the
 * packing touches them, so the peak memory stays that of one matrix packed
 * while its file copy is still resident. */
enum { ARENA_ALIGN = 2u << 20 };

static uint8_t *packed_arena(size_t bytes, size_t *mapped) {
    *mapped = bytes + ARENA_ALIGN;
    uint8_t *m = mmap(NULL, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    const size_t lead = (ARENA_ALIGN - (uintptr_t)m % ARENA_ALIGN) % ARENA_ALIGN;
    if (lead) munmap(m, lead); /* keep [m + lead, m + mapped): the aligned part and its tail */
    *mapped -= lead;
#ifdef MADV_HUGEPAGE
    madvise(m + lead, *mapped, MADV_HUGEPAGE); /* a hint: without it (or THP off) 4 KB pages */
#endif
    return m + lead;
}

/* The matrices, packed where quant_pack_rows takes them (not in exact mode,
 * which multiplies in f32). The file's copy of a packed matrix is then
 * dropped from memory (gguf_release): the products never read it again, so
 * packing costs no resident memory (token embeddings tied to the output are
 * read back from the file a row at a time). */
static int setup_matrices(cpu_backend *cb) {
    const model *m = cb->m;
    const int64_t n = (int64_t)m->n_layer * W_PER_LAYER + 1;
    if (!(cb->mats = calloc((size_t)n, sizeof *cb->mats))) return -1;
    for (int32_t l = 0; l < m->n_layer; l++) {
        const layer_weights *lw = &m->layers[l];
        const weight *ws[W_PER_LAYER] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (int k = 0; k < W_PER_LAYER; k++) cb->mats[(size_t)l * W_PER_LAYER + k].w = ws[k];
    }
    cb->mats[n - 1].w = &m->output;
    if (cb->exact) return 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint32_t type = packed_type_of(cb->mats[i].w);
        if (type) total += packed_bytes_of(cb->mats[i].w, type);
    }
    if (!total) return 0;
    if (!(cb->arena = packed_arena(total, &cb->arena_bytes))) return -1;
    size_t at = 0;
    for (int64_t i = 0; i < n; i++) { /* places in the arena in matrix order */
        const uint32_t type = packed_type_of(cb->mats[i].w);
        if (!type) continue;
        cb->mats[i].packed = cb->arena + at;
        cb->mats[i].packed_type = type;
        at += packed_bytes_of(cb->mats[i].w, type);
    }
    for (int64_t i = n - 1; i >= 0; i--) { /* the largest (output) first: a lower peak */
        const weight *w = cb->mats[i].w;
        const uint32_t type = cb->mats[i].packed_type;
        if (!cb->mats[i].packed) continue;
        if (type != w->type) { /* Q3_K as Q6_K */
            const size_t row_bytes = quant_row_bytes(type, (uint64_t)w->cols);
            uint8_t *q6 = malloc((size_t)w->rows * row_bytes);
            if (!q6) return -1;
            quant_q3_k_as_q6_k(w->data, q6, w->rows * (w->cols / quant_block_elems(GGML_TYPE_Q3_K)));
            quant_pack_rows(type, q6, row_bytes, w->rows, w->cols, cb->mats[i].packed);
            free(q6);
        } else {
            quant_pack_rows(type, w->data, w->row_bytes, w->rows, w->cols, cb->mats[i].packed);
        }
        gguf_release(m->file, w->data, (size_t)w->rows * w->row_bytes);
    }
    return 0;
}

static void cpu_free(backend *b) {
    cpu_backend *cb = (cpu_backend *)b;
    if (!cb) return;
    tp_free(cb->tp);
    rope_free(&cb->rope[0]);
    rope_free(&cb->rope[1]);
    if (cb->arena) munmap(cb->arena, cb->arena_bytes);
    free(cb->mats);
    free(cb);
}

static void cpu_parallel_for(backend *b, int64_t n, tp_fn fn, void *ctx) {
    tp_parallel_for(((cpu_backend *)b)->tp, n, fn, ctx);
}

backend *cpu_backend_new(const model *m, int n_threads, int exact, char *err, size_t errlen) {
    cpu_backend *cb = calloc(1, sizeof *cb);
    int rope_failed = 0;
    for (int32_t i = 0; cb && i < m->n_rope; i++)
        rope_failed |= rope_init_params(&cb->rope[i], m->n_rot, &m->rope[i], m->rope_layout, m->n_ctx_train);
    if (!cb || rope_failed || !(cb->tp = tp_new(n_threads))) {
        if (cb) cpu_free(&cb->base);
        snprintf(err, errlen, "cpu backend: out of memory");
        return NULL;
    }
    cb->m = m;
    cb->exact = exact;
    if (setup_matrices(cb)) {
        cpu_free(&cb->base);
        snprintf(err, errlen, "cpu backend: out of memory");
        return NULL;
    }
    cb->base.name = "cpu";
    cb->base.forward = cpu_forward;
    cb->base.free = cpu_free;
    cb->base.parallel_for = cpu_parallel_for;
    return &cb->base;
}
