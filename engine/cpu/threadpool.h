/* A small fixed pool of worker threads for data-parallel loops (private to
 * engine/cpu/). The calling thread takes part as worker 0. */
#ifndef POTSERVE_THREADPOOL_H
#define POTSERVE_THREADPOOL_H

#include <stdint.h>

typedef struct threadpool threadpool;

/* Work item: handle tasks [begin, end) on worker `worker` (0..n_threads-1). */
typedef void (*tp_fn)(void *ctx, int64_t begin, int64_t end, int worker);

threadpool *tp_new(int n_threads);
void tp_free(threadpool *tp);
int tp_threads(const threadpool *tp);
/* Splits [0, n) into contiguous ranges, one per worker, and waits for all. */
void tp_parallel_for(threadpool *tp, int64_t n, tp_fn fn, void *ctx);
/* [0, n) in ranges of `chunk` tasks, each taken by the next free worker (a
 * worker may get several, in any order), and waits for all. */
void tp_parallel_for_chunked(threadpool *tp, int64_t n, int64_t chunk, tp_fn fn, void *ctx);

#endif
