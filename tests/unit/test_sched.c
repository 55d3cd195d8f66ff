/* The engine thread (engine/sched.c) on the real default model:
 * - generations decoded together in one batched forward give exactly the
 *   tokens and text of engine_generate run one at a time;
 * - a document ingested through the thread in pieces ends up with the pot,
 *   stats and answer of engine_doc_feed, and a generation queued right after
 *   the ingests sees the whole document;
 * - a generation stays responsive while a long document streams in;
 * - stopping cancels active generations cleanly and still runs queued tasks;
 * - tasks run in submission order, after the ingests queued before them;
 * - a deadline ends a generation still queued behind a document's ingest
 *   (and its forks), or one decoding, with finish TIMEOUT;
 * - a cancel flag set by another thread ends a generation in its prefill. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "test.h"
#include "test_model.h"

enum { WAIT_S = 600 }; /* a hung engine thread fails the test instead of hanging it */

/* What callbacks on the engine thread report to the test thread. */
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int count;
} waiter;

static void waiter_init(waiter *w) {
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->count = 0;
}

static void waiter_destroy(waiter *w) {
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static void waiter_add(waiter *w) {
    pthread_mutex_lock(&w->mu);
    w->count++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits until count >= target; 0, or -1 after WAIT_S. */
static int waiter_wait(waiter *w, int target) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_S;
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    while (w->count < target && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cv, &w->mu, &until);
    int ok = w->count >= target;
    pthread_mutex_unlock(&w->mu);
    if (!ok) fprintf(stderr, "  timed out waiting for the engine thread\n");
    return ok ? 0 : -1;
}

/* One generation's output. */
typedef struct gen_out {
    char text[4096];
    size_t len;
    int32_t tokens[256]; /* the token of each text piece */
    float logprobs[256]; /* with logprobs: the piece's token's logprob, then its top one's */
    int32_t top[256];
    int n_pieces;
    int rc, n_done;
    engine_gen_result res;
    char err[256];
    waiter *w;
    int cancel_after;    /* > 0: on_text cancels after this many pieces */
    double done_ms;      /* CLOCK_MONOTONIC ms of on_done */
    int *first_text_seen; /* set to 1 with the first piece (interleaving test) */
} gen_out;

static int on_text(void *user, const char *text, size_t len, int32_t token, const sample_logprobs *lp) {
    gen_out *o = user;
    if (lp && o->n_pieces < 256) {
        o->logprobs[o->n_pieces] = lp->logprob;
        o->top[o->n_pieces] = lp->n_top ? lp->top_tokens[0] : -1;
    }
    if (o->len + len < sizeof o->text) {
        memcpy(o->text + o->len, text, len);
        o->len += len;
        o->text[o->len] = 0;
    }
    if (o->n_pieces < 256) o->tokens[o->n_pieces] = token;
    o->n_pieces++;
    if (o->first_text_seen) {
        pthread_mutex_lock(&o->w->mu);
        *o->first_text_seen = 1;
        pthread_mutex_unlock(&o->w->mu);
    }
    return o->cancel_after > 0 && o->n_pieces >= o->cancel_after;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void on_done(void *user, int rc, const engine_gen_result *res, const char *err) {
    gen_out *o = user;
    o->done_ms = now_ms();
    o->rc = rc;
    o->res = *res;
    snprintf(o->err, sizeof o->err, "%s", err ? err : "");
    o->n_done++;
    waiter_add(o->w);
}

static const char *const prompts[8] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "List three primary colors:",
    "The quick brown fox",
    "Water boils at a temperature of",
    "In 1969, the first humans",
    "My favourite recipe for pancakes needs",
};

/* Request i: its own prompt (request 5 is long enough to prefill in two
 * pieces), its own length, one sampled with a seed, one with a stop string. */
static int32_t *request_prompt(engine *e, int i, size_t *n) {
    char err[256], text[2048];
    if (i == 5) {
        text[0] = 0;
        for (int r = 0; r < 37; r++) strcat(text, "Water boils at one hundred degrees. ");
        strcat(text, prompts[i]);
    } else {
        snprintf(text, sizeof text, "%s", prompts[i]);
    }
    return engine_tokenize_prompt(e, text, n, err, sizeof err);
}

static engine_gen_params request_params(int i) {
    static const char *const stop[] = {"\n\n"};
    engine_gen_params gp = {0};
    gp.sampling = sample_params_default();
    gp.sampling.temperature = 0;
    if (i == 3) gp.sampling.temperature = 0.8f, gp.sampling.seed = 42;
    if (i == 2) gp.stop = stop, gp.n_stop = 1;
    if (i == 4 || i == 6) gp.want_logprobs = 1, gp.sampling.n_top_logprobs = 3;
    gp.max_tokens = 3 + i;
    return gp;
}

static void check_same_output(const gen_out *a, const gen_out *b, int i) {
    if (a->rc != b->rc || a->len != b->len || strcmp(a->text, b->text) != 0 ||
        a->n_pieces != b->n_pieces || a->res.n_generated != b->res.n_generated ||
        a->res.finish != b->res.finish || a->res.n_prompt != b->res.n_prompt) {
        test_failures++;
        fprintf(stderr, "  request %d: \"%s\" (%lld tokens) vs alone \"%s\" (%lld tokens)\n", i,
                a->text, (long long)a->res.n_generated, b->text, (long long)b->res.n_generated);
        return;
    }
    int n = a->n_pieces < 256 ? a->n_pieces : 256;
    CHECK(memcmp(a->tokens, b->tokens, (size_t)n * sizeof *a->tokens) == 0);
    CHECK(memcmp(a->logprobs, b->logprobs, (size_t)n * sizeof *a->logprobs) == 0);
    CHECK(memcmp(a->top, b->top, (size_t)n * sizeof *a->top) == 0);
}

TEST(sched_batched_generations_equal_one_at_a_time) {
    engine *e = test_open_default_engine(2);
    CHECK(e != NULL);
    if (!e) return;
    char err[512];
    int32_t *toks[8];
    size_t n_toks[8];
    static gen_out alone[8], batched[8];
    waiter w;
    waiter_init(&w);
    for (int i = 0; i < 8; i++) {
        toks[i] = request_prompt(e, i, &n_toks[i]);
        CHECK(toks[i] != NULL);
        if (!toks[i]) return;
        memset(&alone[i], 0, sizeof alone[i]);
        engine_gen_params gp = request_params(i);
        alone[i].rc = engine_generate(e, toks[i], n_toks[i], &gp, on_text, &alone[i], &alone[i].res,
                                      err, sizeof err);
        CHECK_EQ_INT(alone[i].rc, 0);
    }
    CHECK(n_toks[5] > 256); /* prefilled in two pieces, next to the others' decoding */
    const int counts[] = {1, 4, 8};
    for (int c = 0; c < 3; c++) {
        int n = counts[c];
        engine_sched *s = engine_sched_new(e, err, sizeof err);
        CHECK(s != NULL);
        if (!s) break;
        w.count = 0;
        for (int i = 0; i < n; i++) {
            int k = i;
            memset(&batched[k], 0, sizeof batched[k]);
            batched[k].w = &w;
            engine_gen_request r = {.prompt = toks[k], .n_prompt = n_toks[k], .params = request_params(k),
                                    .on_text = on_text, .on_done = on_done, .user = &batched[k]};
            CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
        }
        CHECK_EQ_INT(waiter_wait(&w, n), 0);
        engine_sched_stats st;
        engine_sched_get_stats(s, &st);
        engine_sched_free(s);
        int64_t generated = 0;
        for (int i = 0; i < n; i++) {
            int k = i;
            CHECK_EQ_INT(batched[k].n_done, 1);
            check_same_output(&batched[k], &alone[k], k);
            generated += batched[k].res.n_generated;
        }
        /* the last token of each is sampled, never decoded */
        CHECK_EQ_INT(st.decoded_tokens, generated - n);
        CHECK_EQ_INT(st.active_generations, 0);
        if (n == 8) CHECK(st.decode_steps < st.decoded_tokens / 2); /* decoded together */
    }
    for (int i = 0; i < 8; i++) free(toks[i]);
    waiter_destroy(&w);
    engine_close(e);
}

static engine_pot_settings small_pot(void) {
    engine_pot_settings set = engine_pot_settings_default();
    set.budget_tokens = 128;
    set.keep_tokens = 64;
    set.chunk_tokens = 32;
    return set;
}

/* A task opening a document with small_pot() into *(engine_doc **)user. */
static void open_doc_task(engine *e, void *user) {
    char err[256];
    engine_pot_settings set = small_pot();
    *(engine_doc **)user = engine_doc_open(e, &set, err, sizeof err);
}

/* The same with engine chunks of 16 tokens: many chunks from a short text. */
static void open_fine_doc_task(engine *e, void *user) {
    char err[256];
    engine_pot_settings set = small_pot();
    set.chunk_tokens = 16;
    *(engine_doc **)user = engine_doc_open(e, &set, err, sizeof err);
}

static void close_doc_task(engine *e, void *user) {
    (void)e;
    engine_doc_close(*(engine_doc **)user);
}

/* Records ingest completions, in the order they come. */
typedef struct ingest_log {
    waiter *w;
    int order[16], rc[16], n;
    int gen_text_seen_at_done; /* interleaving: *first_text_seen when the ingest completed */
    int *first_text_seen;
} ingest_log;

typedef struct ingest_ref {
    ingest_log *log;
    int index;
} ingest_ref;

static void on_ingest(void *user, int rc, const char *err) {
    ingest_ref *r = user;
    ingest_log *l = r->log;
    if (rc) fprintf(stderr, "  ingest %d: %s\n", r->index, err ? err : "(no message)");
    pthread_mutex_lock(&l->w->mu);
    if (l->n < 16) l->order[l->n] = r->index, l->rc[l->n] = rc;
    l->n++;
    if (l->first_text_seen) l->gen_text_seen_at_done = *l->first_text_seen;
    l->w->count++;
    pthread_cond_broadcast(&l->w->cv);
    pthread_mutex_unlock(&l->w->mu);
}

static void sync_task(engine *e, void *user) {
    (void)e;
    waiter_add(user);
}

/* The default model, a waiter and an engine thread over them (NULL when
 * either cannot start: the test has failed). */
static engine_sched *sched_start(engine **e, waiter *w) {
    char err[512];
    waiter_init(w);
    *e = test_open_default_engine(2);
    CHECK(*e != NULL);
    engine_sched *s = *e ? engine_sched_new(*e, err, sizeof err) : NULL;
    if (*e && !s) fprintf(stderr, "  engine_sched_new: %s\n", err);
    CHECK(!*e || s != NULL);
    return s;
}

/* Stops what sched_start started. */
static void sched_stop(engine *e, engine_sched *s, waiter *w) {
    engine_sched_free(s);
    waiter_destroy(w);
    engine_close(e);
}

/* Opens *d on the engine thread with `open` and waits for it (w counts one
 * more); 0 when it opened. */
static int open_doc_now(engine_sched *s, waiter *w, engine_task_fn open, engine_doc **d) {
    int target = w->count + 1;
    CHECK_EQ_INT(engine_sched_task(s, open, d), 0);
    CHECK_EQ_INT(engine_sched_task(s, sync_task, w), 0);
    CHECK_EQ_INT(waiter_wait(w, target), 0);
    CHECK(*d != NULL);
    return *d ? 0 : -1;
}

TEST(sched_ingest_in_pieces_equals_doc_feed) {
    engine *e = test_open_default_engine(2);
    CHECK(e != NULL);
    if (!e) return;
    char err[512];
    engine_info info;
    engine_get_info(e, &info);
    char *doc = test_lighthouse_doc(1000);
    size_t len = strlen(doc);

    /* the reference: one engine_doc_feed, then engine_doc_answer */
    engine_pot_settings set = small_pot();
    engine_doc *ref = engine_doc_open(e, &set, err, sizeof err);
    CHECK(ref != NULL);
    if (!ref) return;
    CHECK_EQ_INT(engine_doc_feed(ref, doc, len, 1, err, sizeof err), 0);
    engine_doc_stats st_ref;
    engine_doc_get_stats(ref, &st_ref);
    CHECK(st_ref.compressions >= 2);
    const char *question = "What did the daughter write on the wall?";
    engine_gen_params gp = request_params(0);
    gp.max_tokens = 12;
    static gen_out ans_ref, ans;
    memset(&ans_ref, 0, sizeof ans_ref);
    CHECK_EQ_INT(engine_doc_answer(ref, question, &gp, on_text, &ans_ref, &ans_ref.res, err, sizeof err), 0);
    engine_message msg = {"user", question};
    size_t n_q;
    int32_t *q = engine_doc_prompt(ref, &msg, 1, NULL, &n_q, err, sizeof err);
    CHECK(q != NULL);

    /* the same through the engine thread: open, ingest in uneven pieces, ask at once */
    waiter w;
    waiter_init(&w);
    ingest_log log = {.w = &w};
    ingest_ref refs[16];
    engine_sched *s = engine_sched_new(e, err, sizeof err);
    CHECK(s != NULL);
    engine_doc *d = NULL;
    CHECK_EQ_INT(engine_sched_task(s, open_doc_task, &d), 0);
    CHECK_EQ_INT(engine_sched_task(s, sync_task, &w), 0);
    CHECK_EQ_INT(waiter_wait(&w, 1), 0);
    CHECK(d != NULL);
    int n_pieces = 0;
    if (d) {
        size_t off = 0, piece = 97;
        while (off < len && n_pieces < 16) {
            size_t n = len - off < piece || n_pieces == 15 ? len - off : piece;
            refs[n_pieces] = (ingest_ref){&log, n_pieces};
            CHECK_EQ_INT(engine_sched_ingest(s, d, doc + off, n, off + n == len, on_ingest, &refs[n_pieces]), 0);
            off += n;
            n_pieces++;
            piece = piece * 7 % 301 + 13;
        }
        memset(&ans, 0, sizeof ans);
        ans.w = &w;
        engine_gen_request r = {.doc = d, .prompt = q, .n_prompt = n_q, .params = gp,
                                .on_text = on_text, .on_done = on_done, .user = &ans};
        CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    }
    CHECK_EQ_INT(waiter_wait(&w, 1 + n_pieces + 1), 0);
    CHECK(n_pieces >= 5);
    CHECK_EQ_INT(log.n, n_pieces);
    for (int i = 0; i < log.n && i < 16; i++) {
        CHECK_EQ_INT(log.order[i], i);
        CHECK_EQ_INT(log.rc[i], 0);
    }
    CHECK_EQ_INT(ans.n_done, 1);
    CHECK_EQ_INT(ans.rc, 0);
    check_same_output(&ans, &ans_ref, 0);
    CHECK_EQ_INT(ans.res.n_cached, ans_ref.res.n_cached);
    engine_sched_stats sst;
    engine_sched_get_stats(s, &sst);
    CHECK_EQ_INT(sst.ingest_chunks, st_ref.chunks);
    engine_sched_free(s); /* the thread is gone: the document is the test's again */
    if (d) {
        engine_doc_stats st;
        engine_doc_get_stats(d, &st);
        CHECK_EQ_INT(st.bytes_read, st_ref.bytes_read);
        CHECK_EQ_INT(st.tokens_read, st_ref.tokens_read);
        CHECK_EQ_INT(st.tokens_in_pot, st_ref.tokens_in_pot);
        CHECK_EQ_INT(st.compressions, st_ref.compressions);
        CHECK_EQ_INT(st.chunks, st_ref.chunks);
        int64_t a[128], b[128];
        for (int32_t l = 0; l < info.n_layer; l += 7)
            for (int32_t h = 0; h < info.n_head_kv; h++) {
                int32_t na = engine_doc_kept(d, l, h, a, 128), nb = engine_doc_kept(ref, l, h, b, 128);
                CHECK(na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0);
            }
        engine_doc_close(d);
    }
    free(q);
    engine_doc_close(ref);
    waiter_destroy(&w);
    free(doc);
    engine_close(e);
}

TEST(sched_generation_runs_while_a_document_streams_in) {
    engine *e = test_open_default_engine(2);
    CHECK(e != NULL);
    if (!e) return;
    char err[512];
    waiter w;
    waiter_init(&w);
    int first_text_seen = 0;
    ingest_log log = {.w = &w, .first_text_seen = &first_text_seen};
    ingest_ref ref = {&log, 0};
    engine_sched *s = engine_sched_new(e, err, sizeof err);
    CHECK(s != NULL);
    if (!s) return;
    engine_doc *d = NULL;
    CHECK_EQ_INT(engine_sched_task(s, open_fine_doc_task, &d), 0);
    CHECK_EQ_INT(engine_sched_task(s, sync_task, &w), 0);
    CHECK_EQ_INT(waiter_wait(&w, 1), 0);
    char *doc = test_lighthouse_doc(800); /* ~180 tokens: ~11 chunks of 16 */
    static gen_out out;
    memset(&out, 0, sizeof out);
    out.w = &w;
    out.first_text_seen = &first_text_seen;
    size_t n_p;
    int32_t *p = request_prompt(e, 0, &n_p);
    engine_gen_request r = {.prompt = p, .n_prompt = n_p, .params = request_params(1),
                            .on_text = on_text, .on_done = on_done, .user = &out};
    r.params.max_tokens = 4;
    if (d) CHECK_EQ_INT(engine_sched_ingest(s, d, doc, strlen(doc), 1, on_ingest, &ref), 0);
    CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    CHECK_EQ_INT(waiter_wait(&w, 1 + (d != NULL) + 1), 0);
    CHECK_EQ_INT(out.n_done, 1);
    CHECK_EQ_INT(out.rc, 0);
    CHECK(out.n_pieces > 0);
    CHECK_EQ_INT(log.n, d != NULL);
    CHECK_EQ_INT(log.rc[0], 0);
    CHECK_EQ_INT(log.gen_text_seen_at_done, 1); /* the generation spoke before the ingest ended */
    engine_sched_stats st;
    engine_sched_get_stats(s, &st);
    CHECK(st.ingest_chunks >= 8);
    CHECK_EQ_INT(engine_sched_task(s, close_doc_task, &d), 0);
    sched_stop(e, s, &w);
    free(p);
    free(doc);
}

/* Shutdown: what a task records and whether the thread still takes work. */
typedef struct shutdown_probe {
    engine_sched *s;
    int task_ran, submit_rc;
} shutdown_probe;

static void probe_task(engine *e, void *user) {
    (void)e;
    shutdown_probe *p = user;
    p->task_ran = 1;
    p->submit_rc = engine_sched_task(p->s, probe_task, p); /* stopping: refused */
}

TEST(sched_free_cancels_active_generations) {
    engine *e;
    waiter w;
    char err[512];
    engine_sched *s = sched_start(&e, &w);
    if (!s) return;
    static gen_out out[3];
    int32_t *toks[3];
    size_t n_toks[3];
    int first_text_seen = 0;
    for (int i = 0; i < 3; i++) {
        toks[i] = request_prompt(e, i, &n_toks[i]);
        memset(&out[i], 0, sizeof out[i]);
        out[i].w = &w;
        out[i].first_text_seen = &first_text_seen;
        engine_gen_request r = {.prompt = toks[i], .n_prompt = n_toks[i], .params = request_params(i),
                                .on_text = on_text, .on_done = on_done, .user = &out[i]};
        r.params.max_tokens = 1000;
        r.params.stop = NULL, r.params.n_stop = 0;
        logit_bias ban = {engine_eos(e), -INFINITY};
        r.params.sampling.bias = &ban; /* copied at submission */
        r.params.sampling.n_bias = 1;
        CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    }
    /* wait until they are decoding */
    for (int tries = 0; tries < 2000; tries++) {
        pthread_mutex_lock(&w.mu);
        int seen = first_text_seen;
        pthread_mutex_unlock(&w.mu);
        if (seen) break;
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
    }
    shutdown_probe probe = {.s = s, .submit_rc = 0};
    CHECK_EQ_INT(engine_sched_task(s, probe_task, &probe), 0);
    engine_sched_free(s);
    CHECK_EQ_INT(w.count, 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(out[i].n_done, 1);
        CHECK_EQ_INT(out[i].rc, 0);
        CHECK_EQ_INT(out[i].res.finish, ENGINE_FINISH_CANCELLED);
        CHECK(out[i].res.n_generated < 1000);
        free(toks[i]);
    }
    CHECK_EQ_INT(probe.task_ran, 1);
    CHECK_EQ_INT(probe.submit_rc, -1);
    waiter_destroy(&w);
    engine_close(e);
}

/* Tasks append their number to a list. */
typedef struct order_log {
    int seen[64], n;
    engine_doc **doc;
    int64_t tokens_read_at[64]; /* the document's tokens_read when each task ran */
} order_log;

typedef struct order_ref {
    order_log *log;
    int index;
} order_ref;

static void order_task(engine *e, void *user) {
    (void)e;
    order_ref *r = user;
    order_log *l = r->log;
    engine_doc_stats st = {0};
    if (l->doc && *l->doc) engine_doc_get_stats(*l->doc, &st);
    if (l->n < 64) l->seen[l->n] = r->index, l->tokens_read_at[l->n] = st.tokens_read;
    l->n++;
}

TEST(sched_tasks_run_in_order_after_earlier_ingests) {
    engine *e;
    waiter w;
    engine_sched *s = sched_start(&e, &w);
    if (!s) return;
    engine_doc *d = NULL;
    order_log log = {.doc = &d};
    order_ref refs[40];
    ingest_log ilog = {.w = &w};
    ingest_ref iref = {&ilog, 0};
    char *doc = test_lighthouse_doc(600);
    open_doc_now(s, &w, open_doc_task, &d);
    for (int i = 0; i < 40; i++) {
        refs[i] = (order_ref){&log, i};
        if (i == 10 && d) CHECK_EQ_INT(engine_sched_ingest(s, d, doc, strlen(doc), 1, on_ingest, &iref), 0);
        /* every fifth through the document's own order */
        int rc = i % 5 == 4 ? engine_sched_doc_task(s, d, order_task, &refs[i])
                            : engine_sched_task(s, order_task, &refs[i]);
        CHECK_EQ_INT(rc, 0);
    }
    CHECK_EQ_INT(engine_sched_task(s, sync_task, &w), 0);
    CHECK_EQ_INT(waiter_wait(&w, 1 + (d != NULL) + 1), 0);
    CHECK_EQ_INT(log.n, 40);
    for (int i = 0; i < 40 && i < log.n; i++) CHECK_EQ_INT(log.seen[i], i);
    /* the tasks after the ingest saw the whole document, those before none of it */
    for (int i = 0; i < 40 && i < log.n; i++) {
        if (i < 10) CHECK_EQ_INT(log.tokens_read_at[i], 0);
        else CHECK(log.tokens_read_at[i] > 100);
    }
    CHECK_EQ_INT(ilog.n, d != NULL);
    CHECK_EQ_INT(engine_sched_task(s, close_doc_task, &d), 0);
    engine_sched_free(s);
    free(doc);
    waiter_destroy(&w);
    engine_close(e);
}

TEST(sched_generation_errors) {
    engine *e;
    waiter w;
    char err[512];
    engine_sched *s = sched_start(&e, &w);
    if (!s) return;
    static gen_out bad_token, empty, fine;
    int32_t prompt[2] = {1, 1 << 30};
    size_t n_good;
    int32_t *good = request_prompt(e, 0, &n_good);
    CHECK(good != NULL);
    if (!good) return;
    engine_gen_params gp = request_params(0);
    memset(&bad_token, 0, sizeof bad_token);
    memset(&empty, 0, sizeof empty);
    memset(&fine, 0, sizeof fine);
    bad_token.w = empty.w = fine.w = &w;
    /* invalid sampling parameters: refused at once, on_done never called */
    engine_gen_request r = {.prompt = prompt, .n_prompt = 1, .params = gp, .on_text = on_text,
                            .on_done = on_done, .user = &fine};
    r.params.sampling.top_p = 0;
    CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), -1);
    CHECK(strstr(err, "top_p") != NULL);
    /* a bad token fails only its own generation, not the batch it would join */
    r.params = gp;
    r.n_prompt = 2;
    r.user = &bad_token;
    CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    r.n_prompt = 0;
    r.user = &empty;
    CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    r.prompt = good;
    r.n_prompt = n_good;
    r.user = &fine;
    CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    CHECK_EQ_INT(waiter_wait(&w, 3), 0);
    CHECK_EQ_INT(bad_token.rc, -1);
    CHECK(strstr(bad_token.err, "outside the vocabulary") != NULL);
    CHECK_EQ_INT(empty.rc, -1);
    CHECK(strstr(empty.err, "empty prompt") != NULL);
    CHECK_EQ_INT(fine.rc, 0);
    CHECK_EQ_INT(fine.res.n_generated, gp.max_tokens);
    engine_sched_free(s);
    free(good);
    waiter_destroy(&w);
    engine_close(e);
}

/* When the long ingest of the deadline test completed. */
static void on_long_ingest(void *user, int rc, const char *err) {
    (void)err;
    gen_out *o = user; /* rc and done_ms only */
    o->rc = rc;
    o->done_ms = now_ms();
    waiter_add(o->w);
}

TEST(sched_deadline_ends_queued_and_decoding_generations) {
    engine *e;
    waiter w;
    engine_sched *s = sched_start(&e, &w);
    engine_doc *d = NULL;
    if (!s || open_doc_now(s, &w, open_fine_doc_task, &d)) return;
    char err[512];
    char *doc = test_lighthouse_doc(3000); /* ~45 chunks of 16 tokens: a second or more of work */
    static gen_out ingest, queued[2], late, decoding;
    memset(&ingest, 0, sizeof ingest);
    memset(queued, 0, sizeof queued);
    memset(&late, 0, sizeof late);
    memset(&decoding, 0, sizeof decoding);
    ingest.w = queued[0].w = queued[1].w = late.w = decoding.w = &w;
    size_t n_p;
    int32_t *p = request_prompt(e, 0, &n_p);
    double t0 = now_ms();
    /* a generation with no document, decoding without end: the deadline stops it */
    engine_gen_request r = {.prompt = p, .n_prompt = n_p, .params = request_params(0), .on_text = on_text,
                            .on_done = on_done, .user = &decoding, .deadline_ms = t0 + 400};
    r.params.max_tokens = 100000;
    logit_bias ban = {engine_eos(e), -INFINITY};
    r.params.sampling.bias = &ban;
    r.params.sampling.n_bias = 1;
    CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    CHECK_EQ_INT(engine_sched_ingest(s, d, doc, strlen(doc), 1, on_long_ingest, &ingest), 0);
    /* over the document: they wait for the ingest; n = 2 shares one prefill */
    void *users[2] = {&queued[0], &queued[1]};
    engine_gen_request q = {.doc = d, .prompt = p, .n_prompt = n_p, .params = request_params(0), .on_text = on_text,
                            .on_done = on_done, .n = 2, .users = users, .deadline_ms = t0 + 100};
    CHECK_EQ_INT(engine_sched_generate(s, &q, err, sizeof err), 0);
    q.n = 1, q.users = NULL, q.user = &late, q.deadline_ms = 0; /* no deadline: answered after the ingest */
    CHECK_EQ_INT(engine_sched_generate(s, &q, err, sizeof err), 0);
    CHECK_EQ_INT(waiter_wait(&w, 1 + 5), 0);
    CHECK_EQ_INT(ingest.rc, 0);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(queued[i].n_done, 1);
        CHECK_EQ_INT(queued[i].rc, 0);
        CHECK_EQ_INT(queued[i].res.finish, ENGINE_FINISH_TIMEOUT);
        CHECK_EQ_INT(queued[i].res.n_generated, 0);
        CHECK(queued[i].done_ms < ingest.done_ms); /* not held until the document was read */
    }
    CHECK_EQ_INT(decoding.rc, 0);
    CHECK_EQ_INT(decoding.res.finish, ENGINE_FINISH_TIMEOUT);
    /* cut while decoding (a slow build or machine may cut it in its prefill: 0 tokens) */
    CHECK(decoding.res.n_generated < 100000);
    CHECK(decoding.done_ms - t0 >= 400);
    CHECK_EQ_INT(late.rc, 0);
    CHECK(late.res.finish != ENGINE_FINISH_TIMEOUT);
    CHECK(late.done_ms >= ingest.done_ms);
    fprintf(stderr, "  queued ones timed out after %.0f ms, ingest took %.0f ms, decoding one %.0f ms (%lld tokens)\n",
            queued[0].done_ms - t0, ingest.done_ms - t0, decoding.done_ms - t0, (long long)decoding.res.n_generated);
    CHECK_EQ_INT(engine_sched_task(s, close_doc_task, &d), 0);
    sched_stop(e, s, &w);
    free(p);
    free(doc);
}

/* A client that left during a long prompt's prefill: the server sets the generation's
 * cancel flag, and it ends CANCELLED at the next step instead of after the whole prefill
 * (on_text's return, the other way to cancel, is seen only once text comes). */
TEST(sched_cancel_flag_ends_a_generation_in_its_prefill) {
    engine *e;
    waiter w;
    engine_sched *s = sched_start(&e, &w);
    if (!s) return;
    char err[512];
    char *text = test_lighthouse_doc(8000); /* several prefill pieces */
    size_t n;
    int32_t *p = engine_tokenize_prompt(e, text, &n, err, sizeof err);
    CHECK(p != NULL && n > 1500);
    static gen_out cancelled, whole;
    memset(&cancelled, 0, sizeof cancelled);
    memset(&whole, 0, sizeof whole);
    cancelled.w = whole.w = &w;
    static atomic_int gone = 1; /* set before it starts: it must stop within the prefill's first step */
    engine_gen_request r = {.prompt = p, .n_prompt = n, .params = request_params(0), .on_text = on_text,
                            .on_done = on_done, .user = &cancelled, .cancel = &gone};
    r.params.max_tokens = 4;
    double t0 = now_ms();
    CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    CHECK_EQ_INT(waiter_wait(&w, 1), 0);
    double cancelled_ms = now_ms() - t0;
    r.user = &whole, r.cancel = NULL;
    CHECK_EQ_INT(engine_sched_generate(s, &r, err, sizeof err), 0);
    CHECK_EQ_INT(waiter_wait(&w, 2), 0);
    double whole_ms = now_ms() - t0 - cancelled_ms;
    CHECK_EQ_INT(cancelled.rc, 0);
    CHECK_EQ_INT(cancelled.res.finish, ENGINE_FINISH_CANCELLED);
    CHECK_EQ_INT(cancelled.res.n_generated, 0);
    CHECK_EQ_INT(whole.rc, 0);
    CHECK(whole.res.n_generated > 0);
    CHECK(cancelled_ms < whole_ms / 2);
    fprintf(stderr, "  %zu-token prompt: cancelled after %.0f ms, whole answer %.0f ms\n", n, cancelled_ms, whole_ms);
    sched_stop(e, s, &w);
    free(p);
    free(text);
}
