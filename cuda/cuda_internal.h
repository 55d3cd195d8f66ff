/* What the CUDA backend's host files share (private to cuda/): the backend
 * struct, device buffers, pots held on the device (cuda_pots.c) and the
 * decode graphs (cuda_graph.c). */
#ifndef POTSERVE_CUDA_INTERNAL_H
#define POTSERVE_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "cache/cache.h"
#include "cuda/kernels.h"
#include "cuda/cuda_backend.h" /* cuda_phase_totals */
#include "engine/backend.h"
#include "engine/model.h"

typedef struct dev_weight {
    void *data;
    uint32_t type;
    int64_t rows, cols;
    size_t row_bytes;
} dev_weight;

typedef struct dev_layer {
    float *attn_norm, *ffn_norm, *bq, *bk, *bv;
    dev_weight wq, wk, wv, wo, gate, up, down;
} dev_layer;

/* A device buffer that only grows. */
typedef struct dbuf {
    void *p;
    size_t bytes;
} dbuf;

/* Grows b to at least bytes (contents lost). */
cudaError_t dbuf_need(dbuf *b, size_t bytes);
void dbuf_free(dbuf *b);

typedef struct cuda_backend cuda_backend;

/* A pot whose K/V live in device memory (cache/cache.h, "pots held by a
 * device"): the device copy is authoritative; the host's p->k, p->v hold
 * slots [0, n_host) only until they are synced. */
typedef struct dev_pot {
    pot_device hooks; /* first member: p->device points here */
    cuda_backend *cb;
    pot *p;
    void *k, *v;      /* [n_layer][n_head_kv][capacity][head_dim] of p->dtype, K before RoPE */
    size_t bytes;     /* of k and of v each */
    int32_t n_host;   /* slots [0, n_host) of the host's K/V equal the device's */
    uint64_t last_use;
    struct dev_pot *prev, *next;
} dev_pot;

struct cuda_decode_graphs; /* cuda_graph.c */

struct cuda_backend {
    backend base;
    const model *m;
    int exact;
    cudaStream_t stream;
    cublasHandle_t blas;
    dev_weight tok_embd, output;
    float *output_norm;
    dev_layer *layers;
    void **allocs; /* every weight allocation, for free */
    size_t n_allocs, cap_allocs;
    cuda_rope rope;
    float *wbuf; /* dequantised weight rows */
    size_t wbuf_floats;
    dbuf x, xn, xb, q, k, v, att, hb, hb2, lse, partial, scores, slots, row_w, slot_pos, tokens, logits, rows, labels, lp;
    dbuf batch; /* the batched decode attention's per-span arrays */
    dbuf xh;    /* f16 activations of the fast (exact = 0) GEMMs */
    /* pots held on the device */
    dev_pot *pots;           /* every one, most recently attached first */
    size_t pot_bytes;        /* their K/V bytes together */
    size_t pot_budget;       /* device bytes admission control may give to pots */
    dbuf cmp_k, cmp_v, keep; /* compaction: the second buffers and the keep list */
    uint64_t clock;
    /* decode graphs (cuda_graph.c) */
    int use_graphs;
    struct cuda_decode_graphs *graphs;
    uint64_t graph_captures, graph_replays;
    /* phase timing (cuda_backend_time_phases) */
    int time_phases;
    cudaEvent_t body_start, body_end;
    cuda_phase_totals phases;
};

/* The device copy of p for a forward at clock `now`: p's own if this backend
 * holds it, else made (p taken back from another device first, its slots
 * uploaded; least recently used pots not used at `now` go back to the host
 * when device memory is short). NULL + err when it cannot be had. */
dev_pot *cuda_pot_acquire(cuda_backend *cb, pot *p, uint64_t now, char *err, size_t errlen);
/* Every pot this backend holds goes back to the host (synced, released). */
void cuda_pots_return_all(cuda_backend *cb);
/* 1 when p's K/V are held by cb. */
int cuda_pot_is_ours(const cuda_backend *cb, const pot *p);

/* ---- decode graphs (cuda_graph.c) ----------------------------------------------
 * A decode step's kernels (every span one token, the products on the
 * quantised weights, no cuBLAS) captured once per key and replayed: the
 * kernels read what changes between steps (tokens, positions, key counts,
 * pot arrays) from device buffers the host fills before each launch. */
typedef struct cuda_graph_key {
    int32_t rows;        /* sequences in the step */
    int32_t grid_splits; /* the attention's key-count bucket */
    int32_t dtype;       /* of the pots */
    uint64_t buffers;    /* signature of the work buffers' addresses */
} cuda_graph_key;
typedef int (*cuda_graph_body)(cuda_backend *cb, void *arg, char *err, size_t errlen);
/* Runs body's work on cb->stream through the graph of key, capturing body
 * first when there is none (cb->graph_captures, cb->graph_replays count).
 * 0, or -1 + err. */
int cuda_graph_run(cuda_backend *cb, const cuda_graph_key *key, cuda_graph_body body, void *arg, char *err,
                   size_t errlen);
void cuda_graphs_free(cuda_backend *cb);

#endif
