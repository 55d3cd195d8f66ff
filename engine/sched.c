/* The engine thread: one pthread owns the engine, the documents it is handed
 * and every generation. Other threads only queue work (under one mutex) and
 * read counters. Each turn of the loop:
 *   1. takes what was submitted, in order, and starts every item whose turn
 *      has come (tasks run, ingests push their bytes, generations get their
 *      pot);
 *   2. runs one step of every active generation in one batched forward
 *      (prefill pieces and decode tokens together);
 *   3. runs one ingest chunk of one active document, round-robin;
 * and sleeps when none of these has anything to do.
 *
 * Order: items of one document (ingests, generations over it, its tasks) and
 * engine_sched_task tasks keep submission order. An ingest's bytes are
 * pushed at its turn; the ingest completes when its document has no ready
 * chunk left. A generation over a document, and a task, wait for the earlier
 * ingests they are ordered after to complete, so an answer sees the whole
 * ingested text and a close never pulls a document from under its chunks. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine_internal.h"

enum item_kind { ITEM_TASK, ITEM_INGEST, ITEM_GEN };

/* How a task is ordered: after everything before it (engine_sched_task),
 * after its document's items, or with nothing. */
enum task_order { ORDER_ALL, ORDER_DOC, ORDER_NONE };

typedef struct item {
    struct item *next;
    enum item_kind kind;
    engine_doc *doc;
    void *user;
    /* task */
    enum task_order order;
    engine_task_fn fn;
    /* ingest */
    char *bytes;
    size_t n;
    int final;
    engine_ingest_done_fn done;
    int64_t end_token;    /* the document's pushed-token count right after this ingest's push */
    /* generation */
    gen_seq *seq;
    int32_t *prompt;
    size_t n_prompt;
    int32_t max_tokens;
    void (*on_done)(void *user, int rc, const engine_gen_result *res, const char *err);
    /* n > 1: the other sequences, started from this one's prefill (their
       items are in no list until then) */
    struct item **forks;
    int n_forks;
    double deadline_ms;   /* 0: none (engine_gen_request.deadline_ms) */
    int timed_out;        /* the deadline cut it: it reports finish TIMEOUT */
    const atomic_int *cancel; /* engine_gen_request.cancel */
} item;

/* A document with ingests whose chunks have not all run. */
typedef struct active_doc {
    engine_doc *doc;
    item *head, *tail; /* its pending ingests, in submission order */
} active_doc;

struct engine_sched {
    engine *e;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    item *in_head, *in_tail; /* submitted, not yet taken by the engine thread */
    int n_in, stopping;
    engine_sched_stats st;
    /* the engine thread's own */
    item *wait_head;         /* taken, waiting for their turn */
    int n_wait;
    item **gens;             /* active generations, in start order */
    gen_seq **seqs;          /* their sequences, the same order */
    int n_gens, cap_gens;
    active_doc *docs;
    int n_docs, cap_docs, rr; /* rr: the document whose chunk runs next */
    int64_t decode_steps, decoded_tokens, ingest_chunks;
    /* time sharing while generations run: generation steps since the last
       ingest chunk have taken gen_ms; that chunk took ingest_ms */
    double gen_ms, ingest_ms;
};

static void fail_gen(item *it, const char *err);
static void time_out_gen(item *it);
static void discard(item *it);

static void item_free(item *it) {
    if (!it) return;
    for (int i = 0; i < it->n_forks; i++) {
        if (it->timed_out) time_out_gen(it->forks[i]); /* they share its prompt, and its deadline */
        else fail_gen(it->forks[i], "the shared prompt failed");
    }
    free(it->forks);
    free(it->bytes);
    gen_seq_free(it->seq);
    free(it->prompt);
    free(it);
}

/* ---- documents with pending ingests ------------------------------------------------ */

/* Reports an ingest's end and frees it. */
static void ingest_done(item *it, int rc, const char *err) {
    if (it->done) it->done(it->user, rc, rc ? err : NULL);
    item_free(it);
}

static active_doc *find_doc(engine_sched *s, const engine_doc *d) {
    for (int i = 0; i < s->n_docs; i++)
        if (s->docs[i].doc == d) return &s->docs[i];
    return NULL;
}

static active_doc *add_doc(engine_sched *s, engine_doc *d) {
    active_doc *ad = find_doc(s, d);
    if (ad) return ad;
    if (s->n_docs == s->cap_docs) {
        int cap = s->cap_docs ? 2 * s->cap_docs : 8;
        active_doc *v = realloc(s->docs, (size_t)cap * sizeof *v);
        if (!v) return NULL;
        s->docs = v;
        s->cap_docs = cap;
    }
    ad = &s->docs[s->n_docs++];
    *ad = (active_doc){.doc = d};
    return ad;
}

/* Completes every pending ingest of docs[i] (rc 0, or -1 + err) in order and
 * drops the document from the active set. */
static void complete_doc(engine_sched *s, int i, int rc, const char *err) {
    item *it = s->docs[i].head;
    memmove(&s->docs[i], &s->docs[i + 1], (size_t)(s->n_docs - i - 1) * sizeof *s->docs);
    s->n_docs--;
    if (s->rr > i) s->rr--;
    while (it) {
        item *next = it->next;
        ingest_done(it, rc, err);
        it = next;
    }
}

/* Completes, in order, the pending ingests of docs[i] whose own bytes can
 * form no further chunk (what is left of them waits for later bytes), so an
 * upload hears back piece by piece rather than when the document idles. */
static void complete_finished_ingests(engine_sched *s, int i) {
    active_doc *ad = &s->docs[i];
    while (ad->head && ad->head->next && !engine_doc_ready_within(ad->doc, ad->head->end_token)) {
        item *it = ad->head;
        ad->head = it->next;
        ingest_done(it, 0, NULL);
    }
}

/* Runs one chunk of one active document, round-robin; a document with no
 * ready chunk (or failing) completes its pending ingests instead. */
static void ingest_one_chunk(engine_sched *s) {
    char err[256];
    while (s->n_docs > 0) {
        if (s->rr >= s->n_docs) s->rr = 0;
        int rc = engine_doc_step(s->docs[s->rr].doc, err, sizeof err);
        if (rc > 0) {
            s->ingest_chunks++;
            complete_finished_ingests(s, s->rr);
            s->rr++;
            return;
        }
        complete_doc(s, s->rr, rc, err);
    }
}

/* ---- starting items ------------------------------------------------------------------ */

static void push_ingest(engine_sched *s, item *it) {
    char err[256];
    active_doc *ad = add_doc(s, it->doc);
    int rc = ad ? engine_doc_push(it->doc, it->bytes, it->n, it->final, err, sizeof err)
                : (snprintf(err, sizeof err, "out of memory"), -1);
    free(it->bytes);
    it->bytes = NULL;
    it->end_token = engine_doc_tokens_pushed(it->doc);
    if (!ad) {
        ingest_done(it, -1, err);
        return;
    }
    if (ad->tail) ad->tail->next = it;
    else ad->head = it;
    ad->tail = it;
    it->next = NULL;
    /* the document is unusable now: its earlier ingests fail with this one */
    if (rc) complete_doc(s, (int)(ad - s->docs), -1, err);
}

static int add_gen(engine_sched *s, item *it) {
    if (s->n_gens == s->cap_gens) {
        int cap = s->cap_gens ? 2 * s->cap_gens : 8;
        item **g = realloc(s->gens, (size_t)cap * sizeof *g);
        if (g) s->gens = g;
        gen_seq **q = realloc(s->seqs, (size_t)cap * sizeof *q);
        if (q) s->seqs = q;
        if (!g || !q) return -1;
        s->cap_gens = cap;
    }
    s->gens[s->n_gens] = it;
    s->seqs[s->n_gens++] = it->seq;
    return 0;
}

/* Reports a generation that never ran (or is abandoned) and frees it. */
static void fail_gen(item *it, const char *err) {
    engine_gen_result res = {0};
    res.finish = ENGINE_FINISH_CANCELLED;
    it->on_done(it->user, -1, &res, err);
    item_free(it);
}

/* Reports a generation that never started because its deadline passed
 * (finish TIMEOUT, nothing generated) and frees it. */
static void time_out_gen(item *it) {
    engine_gen_result res = {0};
    res.finish = ENGINE_FINISH_TIMEOUT;
    it->timed_out = 1;
    it->on_done(it->user, 0, &res, NULL);
    item_free(it);
}

static void cache_prompt(engine *e, item *it);

static void gen_done(engine *e, item *it) {
    engine_gen_result res;
    char err[256];
    int rc = gen_seq_result(it->seq, &res, err, sizeof err);
    if (!rc && it->timed_out) res.finish = ENGINE_FINISH_TIMEOUT;
    if (!rc && !it->timed_out) cache_prompt(e, it);
    it->on_done(it->user, rc, &res, rc ? err : NULL);
    item_free(it);
}

enum { MIN_CACHED_PREFIX = 8 }; /* shorter shared prefixes are read again */

/* A generation without a document: copies the longest prefix of its prompt
 * that the prompt cache holds into p and tells the penalties about it.
 * Returns its length. It leaves a token to read: the logits need one (a
 * prompt's pieces are read alike however they are cut: backend_span.prefill). */
static size_t cached_prefix(engine *e, item *it, pot **pp) {
    size_t lcp;
    const pot *hit = prompt_cache_find(e->pc, it->prompt, it->n_prompt, &lcp);
    if (it->n_prompt < 2) return 0;
    if (lcp > it->n_prompt - 1) lcp = it->n_prompt - 1;
    if (!hit || lcp < MIN_CACHED_PREFIX) return 0;
    if (hit->n > (*pp)->capacity) { /* the copy needs room for the whole entry before it is cut */
        char err[128];
        pot *big = engine_new_decode_pot(e, (size_t)hit->n, err, sizeof err);
        if (!big) return 0;
        pot_free(*pp);
        *pp = big;
    }
    pot *p = *pp;
    if (pot_copy(p, hit)) {
        if (p->n) pot_truncate(p, 0);
        return 0;
    }
    pot_truncate(p, (int32_t)lcp);
    gen_seq_history(it->seq, it->prompt, lcp);
    return lcp;
}

/* After a generation without a document: its prompt's entries go into the
 * prompt cache (a compact copy of the pot cut after the prompt). */
static void cache_prompt(engine *e, item *it) {
    if (!e->pc || it->doc || !it->prompt || it->n_prompt < MIN_CACHED_PREFIX) return;
    pot *p = gen_seq_take_pot(it->seq);
    if (!p) return;
    if ((size_t)p->n >= it->n_prompt) {
        char err[128];
        pot_truncate(p, (int32_t)it->n_prompt);
        pot *compact = engine_new_pot(e, it->n_prompt, err, sizeof err);
        if (compact && !pot_copy(compact, p)) prompt_cache_put(e->pc, compact, it->prompt, it->n_prompt);
        else pot_free(compact);
    }
    pot_free(p);
}

/* Gives the generation its pot (a copy of the document's, or a new one);
 * the prompt is prefilled by the next steps. */
static void start_gen(engine_sched *s, item *it) {
    char err[256];
    pot *p = it->doc ? doc_answer_pot(it->doc, it->prompt, it->n_prompt, gen_answer_room(s->e, it->max_tokens), err,
                                      sizeof err)
                     : gen_new_pot(s->e, it->n_prompt, it->max_tokens, err, sizeof err);
    size_t cached = p && !it->doc ? cached_prefix(s->e, it, &p) : 0;
    int rc = p ? gen_seq_start(it->seq, p, 1, it->prompt + cached, it->n_prompt - cached, err, sizeof err) : -1;
    if (!rc && add_gen(s, it)) rc = (snprintf(err, sizeof err, "out of memory"), -1);
    if (!rc) return;
    engine_gen_result res = {0};
    it->on_done(it->user, -1, &res, err);
    item_free(it);
}

static void start_item(engine_sched *s, item *it) {
    switch (it->kind) {
    case ITEM_TASK:
        it->fn(s->e, it->user);
        item_free(it);
        break;
    case ITEM_INGEST:
        push_ingest(s, it);
        break;
    case ITEM_GEN:
        start_gen(s, it);
        break;
    }
}

enum { MAX_HELD_DOCS = 64 }; /* documents tracked per scan; beyond, everything waits */

/* What the waiting items before the one being looked at hold back. */
typedef struct holds {
    int any;                      /* some earlier item still waits */
    int all;                      /* everything later waits (an ORDER_ALL task, or overflow) */
    engine_doc *docs[MAX_HELD_DOCS];
    int n_docs;
} holds;

static int doc_held(const holds *h, const engine_doc *d) {
    for (int i = 0; i < h->n_docs; i++)
        if (h->docs[i] == d) return 1;
    return 0;
}

/* Whether it may start now, given the earlier items that still wait. */
static int item_ready(engine_sched *s, const item *it, const holds *h) {
    if (it->kind == ITEM_TASK && it->order == ORDER_ALL) return !h->any && s->n_docs == 0;
    if (it->kind == ITEM_TASK && it->order == ORDER_NONE) return 1;
    if (it->kind == ITEM_GEN && !it->doc) return 1;
    if (h->all || doc_held(h, it->doc)) return 0;
    /* pushing bytes behind the document's pending ingests keeps their order */
    return it->kind == ITEM_INGEST || !find_doc(s, it->doc);
}

static void hold(holds *h, const item *it) {
    h->any = 1;
    if (it->kind == ITEM_TASK && it->order == ORDER_ALL) h->all = 1;
    else if (doc_held(h, it->doc)) return;
    else if (h->n_docs < MAX_HELD_DOCS) h->docs[h->n_docs++] = it->doc;
    else h->all = 1;
}

/* Starts, in order, every waiting item whose turn has come. */
static void start_ready(engine_sched *s) {
    holds h = {0};
    item **link = &s->wait_head;
    while (*link) {
        item *it = *link;
        if (!item_ready(s, it, &h)) {
            hold(&h, it);
            link = &it->next;
            continue;
        }
        *link = it->next;
        it->next = NULL;
        s->n_wait--;
        start_item(s, it);
    }
}

/* ---- deadlines ------------------------------------------------------------------------ */

static int past_deadline(const item *it, double now) { return it->deadline_ms > 0 && now > it->deadline_ms; }

/* Ends the generations whose deadline has passed: those still waiting for
 * their turn report TIMEOUT now; the active ones (prefilling or decoding)
 * are cancelled and report TIMEOUT when the next step collects them. The
 * active ones whose cancel flag is set end CANCELLED at that step too. */
static void expire_generations(engine_sched *s) {
    double now = monotonic_ms();
    item **link = &s->wait_head;
    while (*link) {
        item *it = *link;
        if (it->kind != ITEM_GEN || !past_deadline(it, now)) {
            link = &it->next;
            continue;
        }
        *link = it->next;
        s->n_wait--;
        time_out_gen(it);
    }
    for (int i = 0; i < s->n_gens; i++) {
        if (gen_seq_done(s->seqs[i])) continue;
        if (past_deadline(s->gens[i], now)) {
            s->gens[i]->timed_out = 1;
            gen_seq_cancel(s->seqs[i]);
        } else if (s->gens[i]->cancel && atomic_load(s->gens[i]->cancel)) {
            gen_seq_cancel(s->seqs[i]);
        }
    }
}

/* ---- decoding ---------------------------------------------------------------------- */

static void publish_stats(engine_sched *s);

/* One batched step of every active generation; the finished ones leave the
 * active set, the stats say so, then they report (so that a caller woken by
 * on_done reads stats without them). */
/* Starts the forks of every generation whose prompt has just been read: they
 * decode from a copy of its pot. */
static void start_forks(engine_sched *s) {
    int n = s->n_gens;
    for (int i = 0; i < n; i++) {
        item *it = s->gens[i];
        if (!it->n_forks || !gen_seq_forkable(it->seq)) continue;
        for (int k = 0; k < it->n_forks; k++) {
            item *f = it->forks[k];
            char err[256];
            if (gen_seq_fork(it->seq, f->seq, err, sizeof err) || add_gen(s, f)) {
                fail_gen(f, "out of memory");
                continue;
            }
        }
        free(it->forks);
        it->forks = NULL;
        it->n_forks = 0;
    }
}

static void decode_step(engine_sched *s) {
    gen_step_info info;
    gen_seq_step(s->e, s->seqs, s->n_gens, &info);
    start_forks(s);
    s->decode_steps += info.decode_tokens > 0;
    s->decoded_tokens += info.decode_tokens;
    item *finished = NULL, **tail = &finished;
    int kept = 0;
    for (int i = 0; i < s->n_gens; i++) {
        if (gen_seq_done(s->seqs[i])) {
            *tail = s->gens[i];
            tail = &s->gens[i]->next;
            *tail = NULL;
            continue;
        }
        s->gens[kept] = s->gens[i];
        s->seqs[kept++] = s->seqs[i];
    }
    s->n_gens = kept;
    pthread_mutex_lock(&s->mu);
    publish_stats(s);
    pthread_mutex_unlock(&s->mu);
    while (finished) {
        item *next = finished->next;
        gen_done(s->e, finished);
        finished = next;
    }
}

/* ---- the thread ---------------------------------------------------------------------- */

/* Appends items to the waiting list, keeping their order. */
static void append_waiting(engine_sched *s, item *head, int n) {
    item **tail = &s->wait_head;
    while (*tail) tail = &(*tail)->next;
    *tail = head;
    s->n_wait += n;
}

/* Copies the engine thread's counters for get_stats; under mu. */
static void publish_stats(engine_sched *s) {
    s->st.active_generations = s->n_gens;
    s->st.queued_tasks = s->n_wait; /* the submitted, not yet taken, are added by get_stats */
    s->st.decode_steps = s->decode_steps;
    s->st.decoded_tokens = s->decoded_tokens;
    s->st.ingest_chunks = s->ingest_chunks;
}

/* Stopping: generations end CANCELLED, pending and queued ingests fail,
 * queued tasks still run (in order) so the caller can save or close its
 * documents. */
static void shut_down(engine_sched *s, item *submitted, int n_submitted) {
    for (int i = 0; i < s->n_gens; i++) {
        gen_seq_cancel(s->seqs[i]);
        gen_done(s->e, s->gens[i]);
    }
    s->n_gens = 0;
    while (s->n_docs > 0) complete_doc(s, 0, -1, "shutting down");
    append_waiting(s, submitted, n_submitted);
    while (s->wait_head) {
        item *it = s->wait_head;
        s->wait_head = it->next;
        s->n_wait--;
        if (it->kind == ITEM_TASK) {
            it->fn(s->e, it->user);
            item_free(it);
        } else if (it->kind == ITEM_INGEST) {
            ingest_done(it, -1, "shutting down");
        } else {
            gen_seq_cancel(it->seq);
            gen_done(s->e, it);
        }
    }
}

static int has_work(const engine_sched *s) {
    return s->in_head || s->wait_head || s->n_gens || s->n_docs;
}

static void *engine_thread(void *arg) {
    engine_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        publish_stats(s);
        while (!s->stopping && !has_work(s)) pthread_cond_wait(&s->cv, &s->mu);
        item *submitted = s->in_head;
        int n = s->n_in, stopping = s->stopping;
        s->in_head = s->in_tail = NULL;
        s->n_in = 0;
        pthread_mutex_unlock(&s->mu);
        if (stopping) {
            shut_down(s, submitted, n);
            break;
        }
        append_waiting(s, submitted, n);
        expire_generations(s);
        start_ready(s);
        if (s->n_gens) {
            double t0 = monotonic_ms();
            decode_step(s);
            s->gen_ms += monotonic_ms() - t0;
        }
        /* While generations run, ingest gets at most half of the time: a chunk
           runs once the generation steps since the last one have taken as long
           as it did, so a question is answered at about half speed during a
           long upload instead of one token per chunk. */
        if (!s->n_gens || s->gen_ms >= s->ingest_ms) {
            double t0 = monotonic_ms();
            ingest_one_chunk(s);
            s->ingest_ms = monotonic_ms() - t0;
            s->gen_ms = 0;
        }
    }
    pthread_mutex_lock(&s->mu);
    publish_stats(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

engine_sched *engine_sched_new(engine *e, char *err, size_t errlen) {
    engine_sched *s = calloc(1, sizeof *s);
    if (!s) return snprintf(err, errlen, "out of memory"), NULL;
    s->e = e;
    if (pthread_mutex_init(&s->mu, NULL)) {
        free(s);
        return snprintf(err, errlen, "cannot create a mutex"), NULL;
    }
    if (pthread_cond_init(&s->cv, NULL)) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return snprintf(err, errlen, "cannot create a condition variable"), NULL;
    }
    if (pthread_create(&s->thread, NULL, engine_thread, s)) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return snprintf(err, errlen, "cannot start the engine thread"), NULL;
    }
    return s;
}

void engine_sched_free(engine_sched *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    /* the thread emptied every list; what a task submitted while stopping was refused */
    free(s->gens);
    free(s->seqs);
    free(s->docs);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Queues it (taking it), or frees it and returns -1 when stopping. */
static int submit(engine_sched *s, item *it) {
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    if (!stopping) {
        if (s->in_tail) s->in_tail->next = it;
        else s->in_head = it;
        s->in_tail = it;
        s->n_in++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (stopping) discard(it); /* its forks must not report either */
    return stopping ? -1 : 0;
}

static int submit_task(engine_sched *s, engine_doc *d, enum task_order order, engine_task_fn fn,
                       void *user) {
    item *it = fn ? calloc(1, sizeof *it) : NULL;
    if (!it) return -1;
    *it = (item){.kind = ITEM_TASK, .doc = d, .order = order, .fn = fn, .user = user};
    return submit(s, it);
}

int engine_sched_task(engine_sched *s, engine_task_fn fn, void *user) {
    return submit_task(s, NULL, ORDER_ALL, fn, user);
}

int engine_sched_doc_task(engine_sched *s, engine_doc *d, engine_task_fn fn, void *user) {
    return submit_task(s, d, d ? ORDER_DOC : ORDER_NONE, fn, user);
}

int engine_sched_ingest(engine_sched *s, engine_doc *d, const char *bytes, size_t n, int final,
                        engine_ingest_done_fn done, void *user) {
    if (!d || (n && !bytes)) return -1;
    item *it = calloc(1, sizeof *it);
    char *copy = malloc(n ? n : 1);
    if (!it || !copy) {
        free(it);
        free(copy);
        return -1;
    }
    if (n) memcpy(copy, bytes, n);
    *it = (item){.kind = ITEM_INGEST, .doc = d, .bytes = copy, .n = n, .final = final,
                 .done = done, .user = user};
    return submit(s, it);
}

/* The forks of a request with n > 1: sequences 1..n-1, each with its seed. */
static int make_forks(engine_sched *s, const engine_gen_request *r, item *first, char *err, size_t errlen) {
    first->forks = calloc((size_t)r->n - 1, sizeof *first->forks);
    if (!first->forks) return snprintf(err, errlen, "out of memory"), -1;
    for (int i = 1; i < r->n; i++) {
        engine_gen_params gp = r->params;
        gp.tokens_out = NULL;
        gp.sampling.seed += (uint64_t)i;
        item *f = calloc(1, sizeof *f);
        gen_seq *q = f ? gen_seq_new(s->e, &gp, r->on_text, r->users[i], err, errlen) : NULL;
        if (!q) {
            if (!f) snprintf(err, errlen, "out of memory");
            free(f);
            return -1;
        }
        *f = (item){.kind = ITEM_GEN, .user = r->users[i], .seq = q, .n_prompt = r->n_prompt,
                    .max_tokens = r->params.max_tokens, .on_done = r->on_done, .deadline_ms = r->deadline_ms,
                    .cancel = r->cancel};
        first->forks[first->n_forks++] = f;
    }
    return 0;
}

/* Frees an item that was never submitted, its forks silently. */
static void discard(item *it) {
    for (int i = 0; i < it->n_forks; i++) item_free(it->forks[i]);
    it->n_forks = 0;
    item_free(it);
}

int engine_sched_generate(engine_sched *s, const engine_gen_request *r, char *err, size_t errlen) {
    if (!r->on_done) return snprintf(err, errlen, "a generation needs on_done"), -1;
    if (r->n > 1 && !r->users) return snprintf(err, errlen, "n > 1 needs users"), -1;
    if (r->n_prompt && !r->prompt) return snprintf(err, errlen, "no prompt"), -1;
    engine_gen_params gp = r->params;
    gp.tokens_out = NULL;
    item *it = calloc(1, sizeof *it);
    int32_t *prompt = malloc((r->n_prompt ? r->n_prompt : 1) * sizeof *prompt);
    gen_seq *q = it && prompt ? gen_seq_new(s->e, &gp, r->on_text, r->n > 1 ? r->users[0] : r->user, err, errlen) : NULL;
    if (!q) {
        if (!it || !prompt) snprintf(err, errlen, "out of memory");
        free(it);
        free(prompt);
        return -1;
    }
    if (r->n_prompt) memcpy(prompt, r->prompt, r->n_prompt * sizeof *prompt);
    *it = (item){.kind = ITEM_GEN, .doc = r->doc, .user = r->n > 1 ? r->users[0] : r->user, .seq = q,
                 .prompt = prompt, .n_prompt = r->n_prompt, .max_tokens = r->params.max_tokens,
                 .on_done = r->on_done, .deadline_ms = r->deadline_ms, .cancel = r->cancel};
    if (r->n > 1 && make_forks(s, r, it, err, errlen)) {
        discard(it);
        return -1;
    }
    if (submit(s, it)) return snprintf(err, errlen, "the engine is shutting down"), -1;
    return 0;
}

void engine_sched_get_stats(engine_sched *s, engine_sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->queued_tasks += s->n_in;
    pthread_mutex_unlock(&s->mu);
}
