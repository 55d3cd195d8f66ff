/* Thread pool: a job is one parallel_for, split into one contiguous range per
 * worker, or (tp_parallel_for_chunked) into ranges of a given size that the
 * workers take in turn from an atomic counter as each becomes free. A
 * forward pass runs hundreds of short jobs (two per matrix product, two per
 * attention), microseconds apart, so waking workers through a condition
 * variable every time cost more than the work at small batch sizes (about a
 * third of decode time in futex wake-ups). Workers and the caller therefore
 * spin on an atomic job counter for a short while before sleeping on the
 * condition variable; the spin is bounded (SPIN_NS) so idle workers, and a
 * machine shared with other jobs, do not lose a core to polling. The mutex is
 * taken only around sleeping: the caller and the last worker each announce
 * (sleepers, caller_waiting) and then check, or change and then look, in
 * sequentially consistent atomics, so one of the two always sees the other
 * and no wake-up is lost. Taking it for every job made the worker that
 * finished a job and the caller starting the next one meet on it: a futex
 * sleep at every handover. */
#include "threadpool.h"

#include "common/common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

enum { SPIN_NS = 50 * 1000 }; /* longer than the gap between the jobs of one forward */

struct threadpool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    _Atomic uint64_t generation; /* bumped per job (under mu); workers run each once */
    atomic_int pending;          /* workers still running the current job */
    atomic_int stop;
    atomic_int sleepers;         /* workers about to wait or waiting on `start` (changed under mu) */
    atomic_int caller_waiting;   /* the caller is about to wait or waits on `done` (changed under mu) */
    tp_fn fn;                    /* the job: written before generation is bumped */
    void *ctx;
    int64_t n_tasks;
    int64_t chunk;               /* 0: one range per worker; else ranges of this many, taken in turn */
    _Atomic int64_t next;        /* the next range's first task (chunk > 0) */
};

typedef struct worker_arg {
    threadpool *tp;
    int index;
} worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins until done(arg) or SPIN_NS pass; returns done(arg). After the first
 * few hundred polls it yields the core at each poll: when the machine has more
 * runnable threads than cores, the thread we wait for may be queued behind us. */
static int spin_until(int (*done)(threadpool *, uint64_t), threadpool *tp, uint64_t arg) {
    int64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        if (done(tp, arg)) return 1;
        if (i < 256) {
            cpu_relax();
            continue;
        }
        int64_t t = monotonic_ns();
        if (!deadline) deadline = t + SPIN_NS;
        else if (t > deadline) return done(tp, arg);
        sched_yield();
    }
}

/* Both checks load in sequentially consistent order: they are the second
 * half of the announce-then-check handshakes (see the top). */
static int new_job(threadpool *tp, uint64_t seen) {
    return atomic_load(&tp->generation) != seen || atomic_load(&tp->stop);
}

static int job_finished(threadpool *tp, uint64_t unused) {
    (void)unused;
    return atomic_load(&tp->pending) == 0;
}

static void run_share(threadpool *tp, int w) {
    if (tp->chunk) {
        for (;;) {
            const int64_t b = atomic_fetch_add_explicit(&tp->next, tp->chunk, memory_order_relaxed);
            if (b >= tp->n_tasks) return;
            tp->fn(tp->ctx, b, b + tp->chunk < tp->n_tasks ? b + tp->chunk : tp->n_tasks, w);
        }
    }
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
    for (;;) {
        if (!spin_until(new_job, tp, seen)) {
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->sleepers, 1); /* announces, then checks */
            while (!new_job(tp, seen)) pthread_cond_wait(&tp->start, &tp->mu);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) break;
        seen = atomic_load(&tp->generation);
        run_share(tp, w);
        /* the last one out wakes the caller if it sleeps or is about to */
        if (atomic_fetch_sub(&tp->pending, 1) == 1 && atomic_load(&tp->caller_waiting)) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done);
            pthread_mutex_unlock(&tp->mu);
        }
    }
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
    atomic_store(&tp->stop, 1);
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

static void run_job(threadpool *tp, int64_t n, int64_t chunk, tp_fn fn, void *ctx) {
    if (n <= 0) return;
    if (tp->n == 1 || n == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_tasks = n;
    tp->chunk = chunk;
    atomic_store_explicit(&tp->next, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->pending, tp->n - 1, memory_order_relaxed);
    atomic_fetch_add(&tp->generation, 1); /* publishes the job, then looks for sleepers */
    if (atomic_load(&tp->sleepers)) {
        pthread_mutex_lock(&tp->mu); /* a sleeper holds mu from its check until it waits */
        pthread_cond_broadcast(&tp->start);
        pthread_mutex_unlock(&tp->mu);
    }
    run_share(tp, 0);
    if (spin_until(job_finished, tp, 0)) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->caller_waiting, 1);
    while (!job_finished(tp, 0)) pthread_cond_wait(&tp->done, &tp->mu);
    atomic_store(&tp->caller_waiting, 0);
    pthread_mutex_unlock(&tp->mu);
}

void tp_parallel_for(threadpool *tp, int64_t n, tp_fn fn, void *ctx) {
    run_job(tp, n, 0, fn, ctx);
}

void tp_parallel_for_chunked(threadpool *tp, int64_t n, int64_t chunk, tp_fn fn, void *ctx) {
    run_job(tp, n, chunk < 1 ? 1 : chunk, fn, ctx);
}
