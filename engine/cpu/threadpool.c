/* Thread pool: workers sleep on a condition variable between jobs; a job is
 * one parallel_for, split into one contiguous range per worker. */
#include "threadpool.h"

#include <pthread.h>
#include <stdlib.h>

struct threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    uint64_t generation; /* bumped per job; workers run each generation once */
    int pending;         /* workers still running the current job */
    int stop;
    tp_fn fn;
    void *ctx;
    int64_t n_tasks;
};

typedef struct worker_arg {
    threadpool *tp;
    int index;
} worker_arg;

static void run_share(threadpool *tp, int w) {
    int64_t per = tp->n_tasks / tp->n, extra = tp->n_tasks % tp->n;
    int64_t begin = w * per + (w < extra ? w : extra);
    int64_t end = begin + per + (w < extra);
    if (begin < end) tp->fn(tp->ctx, begin, end, w);
}

static void *worker_main(void *p) {
    worker_arg *a = p;
    threadpool *tp = a->tp;
    int w = a->index;
    free(a);
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->stop && tp->generation == seen) pthread_cond_wait(&tp->start, &tp->mu);
        if (tp->stop) break;
        seen = tp->generation;
        pthread_mutex_unlock(&tp->mu);
        run_share(tp, w);
        pthread_mutex_lock(&tp->mu);
        if (--tp->pending == 0) pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

threadpool *tp_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->start, NULL);
    pthread_cond_init(&tp->done, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof *tp->threads);
    if (!tp->threads) {
        free(tp);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (a) {
            a->tp = tp;
            a->index = i;
        }
        if (!a || pthread_create(&tp->threads[i], NULL, worker_main, a) != 0) {
            free(a);
            tp->n = i; /* run with the workers we have */
            break;
        }
    }
    return tp;
}

void tp_free(threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->stop = 1;
    pthread_cond_broadcast(&tp->start);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->start);
    pthread_cond_destroy(&tp->done);
    free(tp->threads);
    free(tp);
}

int tp_threads(const threadpool *tp) { return tp->n; }

void tp_parallel_for(threadpool *tp, int64_t n, tp_fn fn, void *ctx) {
    if (n <= 0) return;
    if (tp->n == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_tasks = n;
    tp->pending = tp->n - 1;
    tp->generation++;
    pthread_cond_broadcast(&tp->start);
    pthread_mutex_unlock(&tp->mu);
    run_share(tp, 0);
    pthread_mutex_lock(&tp->mu);
    while (tp->pending) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}
