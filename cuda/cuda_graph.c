/* CUDA graphs for the decode step (cuda/cuda_internal.h). A decode step of
 * a small model is a few hundred short kernels; launching them one by one
 * costs the host several microseconds each, more than the kernels take on
 * a GPU. A graph is captured per (rows, key bucket, pot dtype, buffer
 * addresses) on first use and replayed by one cudaGraphLaunch; the kernels
 * find each step's values (tokens, positions, key counts, pot arrays) in
 * device buffers written just before the launch, so a graph never needs
 * updating. A handful of keys covers a server's life: rows <= 16 and one
 * bucket per doubling of the longest pot; the least recently used entry
 * makes room for a new one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"

enum { GRAPH_CACHE = 32 };

typedef struct graph_entry {
    cuda_graph_key key;
    cudaGraphExec_t exec;
    uint64_t last_use;
} graph_entry;

struct cuda_decode_graphs {
    graph_entry e[GRAPH_CACHE];
    int n;
    uint64_t clock;
};

static int same_key(const cuda_graph_key *a, const cuda_graph_key *b) {
    return a->rows == b->rows && a->grid_splits == b->grid_splits && a->dtype == b->dtype &&
           a->buffers == b->buffers;
}

/* Captures body into a new executable graph; NULL + err. */
static cudaGraphExec_t capture(cuda_backend *cb, cuda_graph_body body, void *arg, char *err, size_t errlen) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: graph capture: %s", cudaGetErrorString(e));
        return NULL;
    }
    int rc = body(cb, arg, err, errlen);
    e = cudaStreamEndCapture(cb->stream, &g);
    if (!rc && e != cudaSuccess) snprintf(err, errlen, "cuda backend: graph capture: %s", cudaGetErrorString(e));
    if (!rc && e == cudaSuccess) {
        e = cudaGraphInstantiate(&exec, g, 0);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "cuda backend: graph instantiation: %s", cudaGetErrorString(e));
            exec = NULL;
        }
    }
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    return exec;
}

/* The entry for key: found, or a free or least recently used slot (its old graph destroyed). */
static graph_entry *slot_for(struct cuda_decode_graphs *gs, const cuda_graph_key *key, int *found) {
    for (int i = 0; i < gs->n; i++)
        if (same_key(&gs->e[i].key, key)) return *found = 1, &gs->e[i];
    *found = 0;
    if (gs->n < GRAPH_CACHE) return &gs->e[gs->n++];
    graph_entry *old = &gs->e[0];
    for (int i = 1; i < gs->n; i++)
        if (gs->e[i].last_use < old->last_use) old = &gs->e[i];
    cudaGraphExecDestroy(old->exec);
    memset(old, 0, sizeof *old);
    return old;
}

int cuda_graph_run(cuda_backend *cb, const cuda_graph_key *key, cuda_graph_body body, void *arg, char *err,
                   size_t errlen) {
    if (!cb->graphs && !(cb->graphs = calloc(1, sizeof *cb->graphs))) {
        snprintf(err, errlen, "cuda backend: out of memory");
        return -1;
    }
    struct cuda_decode_graphs *gs = cb->graphs;
    int found;
    graph_entry *en = slot_for(gs, key, &found);
    if (!found) {
        en->exec = capture(cb, body, arg, err, errlen);
        if (!en->exec) {
            *en = gs->e[--gs->n]; /* give the slot back */
            return -1;
        }
        en->key = *key;
        cb->graph_captures++;
    } else {
        cb->graph_replays++;
    }
    en->last_use = ++gs->clock;
    cudaError_t e = cudaGraphLaunch(en->exec, cb->stream);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cuda backend: graph launch: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

void cuda_graphs_free(cuda_backend *cb) {
    if (!cb->graphs) return;
    for (int i = 0; i < cb->graphs->n; i++) cudaGraphExecDestroy(cb->graphs->e[i].exec);
    free(cb->graphs);
    cb->graphs = NULL;
}
