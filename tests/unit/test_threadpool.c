/* The thread pool runs every task of every job exactly once, whether its
 * workers are spinning (jobs back to back) or asleep (gaps longer than the
 * spin), for any task count, including fewer tasks than workers, in one
 * range per worker or in chunks. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "engine/cpu/threadpool.h"
#include "test.h"

enum { MAX_TASKS = 97 };

typedef struct job {
    atomic_int hits[MAX_TASKS];
    atomic_int bad_worker;
    int n_threads;
} job;

static void count_tasks(void *ctx, int64_t begin, int64_t end, int worker) {
    job *j = ctx;
    if (worker < 0 || worker >= j->n_threads) atomic_fetch_add(&j->bad_worker, 1);
    for (int64_t t = begin; t < end; t++) atomic_fetch_add(&j->hits[t], 1);
}

static void pause_us(long us) {
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

TEST(threadpool_runs_every_task_once_spinning_or_sleeping) {
    for (int n_threads = 1; n_threads <= 4; n_threads++) {
        threadpool *tp = tp_new(n_threads);
        CHECK(tp != NULL);
        if (!tp) return;
        CHECK_EQ_INT(tp_threads(tp), n_threads);
        unsigned seed = 7;
        int wrong = 0;
        for (int round = 0; round < 400; round++) {
            job j = {.n_threads = n_threads};
            int64_t n = rand_r(&seed) % (MAX_TASKS + 1); /* 0 .. MAX_TASKS */
            /* every other job in chunks of 1..9 tasks, taken by whichever worker is free */
            if (round % 2) tp_parallel_for_chunked(tp, n, 1 + rand_r(&seed) % 9, count_tasks, &j);
            else tp_parallel_for(tp, n, count_tasks, &j);
            for (int64_t t = 0; t < MAX_TASKS; t++) wrong += atomic_load(&j.hits[t]) != (t < n);
            wrong += atomic_load(&j.bad_worker);
            if (round % 50 == 0) pause_us(300); /* longer than the spin: workers go to sleep */
        }
        CHECK_EQ_INT(wrong, 0);
        tp_free(tp);
    }
}
