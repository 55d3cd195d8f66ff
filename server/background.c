/* Background responses: POST /v1/responses with "background": true (OpenAI's
 * background mode, for answers that take minutes, such as a re-read).
 *
 * The request is answered at once with the response stored as "queued". Its
 * generation runs on a request of its own with no connection (its `bg` set),
 * made here: everything a generation answers on it ends in
 * background_answered instead of a client. The finished response is stored
 * as any stored response (responses_keep, through background_keep), an error
 * as a "failed" response with its error. GET /v1/responses/{id} polls it: on
 * the replica running it the object says "queued" while it waits for a turn
 * and "in_progress" after; POST /v1/responses/{id}/cancel stops it.
 *
 * The entry written as "queued" is replaced by the answer only while it is
 * still that entry: a cancel (which stores "cancelled") or a DELETE that came
 * first, on any replica, is kept. With a shared store the check is Redis's
 * (the entry's text as it was written); in memory, the entry's status.
 *
 * With a shared store the replica running a response also keeps its run mark
 * (server/store.h) alive, renewed with the session leases. A mark gone at a
 * renewal means the entry was replaced elsewhere (a cancel or a delete through
 * another replica): the generation stops. A poll through another replica that
 * finds the entry still unfinished and its mark gone knows its runner died (or
 * lost the store for lease_ms), and stores it as "failed", so that a client
 * never polls a response nobody runs.
 *
 * With "stream": true its generation streams as any: what it writes goes to
 * an event log, which the asking client and GET .../{id}?stream=true follow
 * (server/background_events.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "server/background_internal.h"

const char BACKGROUND_RUNNER_GONE[] =
    "the replica running the response stopped (or lost the store for longer than lease_ms) before the answer ended: "
    "ask again";

/* Why bg ended "failed" though its generation did not fail, or NULL. */
static const char *stopped_why(const background *bg) {
    return bg->stopped ? "the server stopped before the answer ended (the output is what it had generated): ask again"
           : bg->lost  ? "the response was replaced through another replica, or this replica lost the store for "
                         "longer than lease_ms, before the answer ended: ask again"
                       : NULL;
}

void background_free(background *bg) {
    if (!bg) return;
    event_log_unref(bg->log);
    json_decref(bg->in);
    json_decref(bg->history);
    free(bg->queued);
    free(bg);
}

/* The response object in status (no output), as the SDK's Response has it. */
static json_t *background_object(server *s, const background *bg, const char *status) {
    json_t *o = responses_object(bg->id, bg->created, s->model_id, status, NULL, NULL, bg->in);
    json_t *sid = json_object_get(bg->in, "session");
    if (o && json_is_string(sid)) json_object_set(o, "session", sid);
    return o;
}

/* The request that runs bg's generation: no connection, the key and the chat
 * body of the one that asked, on the server's live list (a drain waits for it). */
static request *detached_request(request *r, background *bg) {
    server *s = r->srv;
    request *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->srv = s;
    d->refs = 1; /* until background_answered */
    d->t0 = monotonic_ms();
    snprintf(d->method, sizeof d->method, "POST");
    d->route = r->route;
    d->key = r->key;
    d->url = strdup("/v1/responses");
    if (!d->url) {
        free(d);
        return NULL;
    }
    d->json = json_incref(r->json);
    d->body_len = r->body_len;
    d->bg = bg;
    d->next_live = s->live;
    s->live = d;
    s->n_live++;
    return d;
}

/* ---- the answer: stored over the queued entry only ----------------------------------------- */

typedef struct keep_ctx {
    void (*then)(request *r, void *arg, int rc);
    void *arg;
} keep_ctx;

static void failed_kept(request *d, void *arg, int rc);
static void write_over_queued(request *d, json_t *entry, void (*then)(request *r, void *arg, int rc), void *arg);

/* d's answer could not be stored (larger than response_store_bytes, or the
 * store did not take it): its queued entry must not stay queued for ever. */
static void answer_not_kept(request *d) {
    server *s = d->srv;
    background *bg = d->bg;
    json_t *o = background_object(s, bg, "failed");
    if (!o) return;
    json_object_set_new(o, "error", json_pack("{s:s, s:s}", "code", "server_error", "message",
                                             "the answer was made but could not be stored (larger than "
                                             "response_store_bytes, or the store did not take it): ask again"));
    json_t *entry = stored_new(d, "response", o, json_incref(json_object_get(bg->history, "items")),
                               json_incref(json_object_get(bg->history, "messages")));
    request_ref(d); /* (failed_kept's) */
    write_over_queued(d, entry, failed_kept, NULL);
}

static void over_queued_kept(request *r, void *arg, int rc) {
    keep_ctx k = *(keep_ctx *)arg;
    free(arg);
    if (rc == 1)
        fprintf(stderr, "potserve: %s was cancelled or deleted before it ended: its answer is not stored\n", r->bg->id);
    if (rc < 0) answer_not_kept(r);
    k.then(r, k.arg, rc); /* (1: not stored, a cancel or delete came first) */
}

/* Stores entry (taken) in place of d's queued entry, if it is still there
 * (else nothing: a cancel or a delete came first, rc 1), then then(d, arg, rc). */
static void write_over_queued(request *d, json_t *entry, void (*then)(request *r, void *arg, int rc), void *arg) {
    server *s = d->srv;
    background *bg = d->bg;
    keep_ctx *k = malloc(sizeof *k);
    json_t *mine = json_object_get(s->stored, bg->id);
    const char *status = json_string_value(json_object_get(json_object_get(mine, "object"), "status"));
    if (!k || (!store_is_shared(s->st) && !(status && !strcmp(status, "queued")))) {
        json_decref(entry);
        free(k);
        return then(d, arg, k ? 1 : -1);
    }
    *k = (keep_ctx){then, arg};
    /* (a shared store compares the entry's text: what stored_update writes over) */
    json_object_set_new(s->stored_read, bg->id, json_string(bg->queued));
    stored_update(d, bg->id, entry, 0, over_queued_kept, k);
}

void background_keep(request *d, json_t *entry, void (*then)(request *r, void *arg, int rc), void *arg) {
    background_final_error(d, json_object_get(entry, "object"));
    write_over_queued(d, entry, then, arg);
}

static void failed_kept(request *d, void *arg, int rc) {
    (void)arg;
    (void)rc;
    request_unref(d);
}

void background_answered(request *d, int status, json_t *body) {
    server *s = d->srv;
    background *bg = d->bg;
    if (d->status) return json_decref(body); /* (answered already) */
    d->status = status;
    srv_access_log(d);
    if (status == 200) { /* stored already (responses_keep) */
        json_decref(body);
        return request_unref(d);
    }
    /* an error: the response failed, or (cancelled) stopped */
    json_t *o = background_object(s, bg, bg->cancelled ? "cancelled" : "failed");
    if (o && !bg->cancelled) {
        json_t *err = json_object_get(body, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        json_object_set_new(o, "error", responses_error(status, json_string_value(json_object_get(err, "code")),
                                                        stopped_why(bg) ? stopped_why(bg) : msg ? msg : ""));
    }
    json_decref(body);
    if (bg->log && o) { /* its followers' last event */
        responses_stream_ended(d, o);
        event_log_close(d);
    }
    json_t *entry = o ? stored_new(d, "response", o, json_incref(json_object_get(bg->history, "items")),
                                   json_incref(json_object_get(bg->history, "messages")))
                      : NULL;
    write_over_queued(d, entry, failed_kept, NULL);
}

/* ---- starting ----------------------------------------------------------------------- */

typedef struct queued_ctx {
    request *d;
    json_t *answer; /* the queued object, for the client */
    json_t *entry;  /* what is stored (a shared store: once its run mark is there) */
    int marked;     /* store_response_run_mark's answer */
    char err[160];
} queued_ctx;

static void queued_kept(request *r, void *arg, int rc) {
    queued_ctx q = *(queued_ctx *)arg;
    free(arg);
    if (rc < 0) { /* nothing runs: the request is answered as not taken */
        json_decref(q.answer);
        json_decref(q.entry);
        q.d->status = 503;
        request_unref(q.d);
        api_error e;
        api_fail(&e, 503, "store_unavailable", NULL, "the store did not take the background response; retry");
        return respond_retry(r, &e, 1);
    }
    background *bg = q.d->bg;
    if (bg->log) { /* "stream": the asking client follows its events (and may leave: it runs on) */
        json_decref(q.answer);
        event_log_follow(r, bg->log);
    } else {
        respond_json(r, 200, q.answer);
    }
    route_generate_responses(q.d, json_incref(bg->in), json_incref(bg->history));
}

static void mark_work(void *arg) {
    queued_ctx *q = arg;
    q->marked = store_response_run_mark(q->d->srv->st, q->d->bg->id, q->err, sizeof q->err);
}

/* The run mark is there before the queued entry: a reader never sees the entry without it. */
static void marked(request *r, void *arg) {
    queued_ctx *q = arg;
    if (q->marked < 0) {
        fprintf(stderr, "potserve: %s not stored: %s\n", q->d->bg->id, q->err);
        return queued_kept(r, q, -1);
    }
    json_t *entry = q->entry;
    q->entry = NULL;
    stored_write(r, q->d->bg->id, entry, 1, queued_kept, q);
}

void background_start(request *r, json_t *in, json_t *history) {
    server *s = r->srv;
    api_error e;
    background *bg = calloc(1, sizeof *bg);
    queued_ctx *q = bg ? calloc(1, sizeof *q) : NULL;
    request *d = q ? detached_request(r, bg) : NULL;
    if (!d) {
        free(q);
        free(bg);
        json_decref(in);
        json_decref(history);
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    random_id(bg->id, sizeof bg->id, "resp_");
    if (json_is_true(json_object_get(in, "stream"))) bg->log = event_log_new(s, bg->id);
    bg->in = in;
    bg->history = history;
    bg->created = (int64_t)time(NULL);
    json_t *object = background_object(s, bg, "queued");
    json_t *entry = stored_new(r, "response", json_incref(object), json_incref(json_object_get(history, "items")),
                               json_incref(json_object_get(history, "messages")));
    bg->queued = entry ? json_dumps(entry, JSON_COMPACT) : NULL; /* (the very text a shared store is given) */
    if (!bg->queued || !stored_fits(s, entry)) {
        json_decref(entry);
        json_decref(object);
        free(q);
        d->status = 400;
        request_unref(d);
        api_fail(&e, 400, "invalid_value", "input", "the response would not fit in response_store_bytes (%lld bytes)",
                 (long long)s->cfg.response_store_bytes);
        return respond_error(r, &e);
    }
    *q = (queued_ctx){.d = d, .answer = object, .entry = entry};
    if (store_is_shared(s->st)) return request_work(r, WORK_POOL, mark_work, marked, q);
    q->entry = NULL;
    stored_write(r, bg->id, entry, 1, queued_kept, q);
}

/* ---- polling and cancelling -------------------------------------------------------------- */

const char *background_id(const request *r) { return r->bg ? r->bg->id : NULL; }

const char *background_final_status(const request *r, const char *status) {
    return !r->bg ? status : r->bg->cancelled ? "cancelled" : stopped_why(r->bg) ? "failed" : status;
}

void background_final_error(const request *r, json_t *response) {
    const char *why = r->bg && !r->bg->cancelled ? stopped_why(r->bg) : NULL;
    if (why) /* (its status says failed: background_final_status) */
        json_object_set_new(response, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", why));
}

void background_stop_all(server *s) {
    background_streams_stop(s);
    for (request *r = s->live; r; r = r->next_live)
        if (r->bg && !r->status) {
            r->bg->stopped = 1;
            if (r->gen) generation_cancel(r->gen);
        }
}

void background_gauges(const server *s, int *running, int *waiting, size_t *kept_log_bytes) {
    *running = *waiting = 0;
    for (const request *r = s->live; r; r = r->next_live) *running += r->bg && !r->status;
    *waiting = background_streams_waiting(s);
    *kept_log_bytes = s->bg_logs_bytes;
}

int background_pending(const server *s) {
    for (const request *r = s->live; r; r = r->next_live)
        if (r->bg) return 1; /* (answered, its entry may still be on its way to the store) */
    return 0;
}

/* The request running response id here, or NULL. */
static request *running(server *s, const char *id) {
    for (request *r = s->live; r; r = r->next_live)
        if (r->bg && !r->status && !strcmp(r->bg->id, id)) return r;
    return NULL;
}

void background_stop_running(server *s, const char *id) {
    request *d = running(s, id);
    if (!d) return;
    d->bg->cancelled = 1;
    if (d->gen) generation_cancel(d->gen);
}

/* ---- the run marks: renewed while running, their runner's life for pollers --------------- */

typedef struct renew_job {
    uv_work_t work;
    server *s;
    size_t n;
    char (*ids)[48];
    const char **names; /* ids[i] */
    int *out;
} renew_job;

static void renew_job_free(renew_job *j) {
    free(j->ids);
    free(j->names);
    free(j->out);
    free(j);
}

static void renew_work(uv_work_t *w) {
    renew_job *j = w->data;
    store_response_run_renew(j->s->st, j->names, j->n, j->out);
}

static void renew_done(uv_work_t *w, int status) {
    (void)status;
    renew_job *j = w->data;
    j->s->bg_renewing = 0;
    for (size_t i = 0; i < j->n; i++) {
        request *d = j->out[i] == 0 || j->out[i] == 2 ? running(j->s, j->ids[i]) : NULL;
        if (!d || d->bg->cancelled || d->bg->lost) continue; /* (ended meanwhile: its own write removed the mark) */
        fprintf(stderr, "potserve: %s was %s through another replica (its run mark is gone): stopping it\n",
                d->bg->id, j->out[i] == 2 ? "cancelled" : "deleted or replaced");
        if (j->out[i] == 2) d->bg->cancelled = 1; /* ends as a cancel here would */
        else d->bg->lost = 1;
        if (d->gen) generation_cancel(d->gen);
    }
    renew_job_free(j);
}

void background_renew(server *s) {
    size_t n = 0;
    for (request *r = s->live; r; r = r->next_live) n += r->bg && !r->status;
    if (!n || s->bg_renewing || !store_is_shared(s->st)) return;
    renew_job *j = calloc(1, sizeof *j);
    if (!j || !(j->ids = calloc(n, sizeof *j->ids)) || !(j->names = calloc(n, sizeof *j->names)) ||
        !(j->out = calloc(n, sizeof *j->out))) {
        if (j) renew_job_free(j);
        return;
    }
    j->s = s;
    for (request *r = s->live; r; r = r->next_live)
        if (r->bg && !r->status) {
            snprintf(j->ids[j->n], sizeof j->ids[j->n], "%s", r->bg->id);
            j->names[j->n] = j->ids[j->n];
            j->n++;
        }
    j->work.data = j;
    if (uv_queue_work(s->loop, &j->work, renew_work, renew_done)) return renew_job_free(j);
    s->bg_renewing = 1;
}

typedef struct poll_ctx {
    server *s;
    char id[48];
    json_t *entry; /* as fetched (the request's scratch may be another's by the time the store answers) */
    char *read;    /* its text, what a write over it expects */
    int held;
    char err[160];
    void (*again)(request *r);
} poll_ctx;

static void poll_ctx_free(poll_ctx *p) {
    json_decref(p->entry);
    free(p->read);
    free(p);
}

static void held_work(void *arg) {
    poll_ctx *p = arg;
    p->held = store_response_run_held(p->s->st, p->id, p->err, sizeof p->err);
}

static void failed_written(request *r, void *arg, int rc) {
    poll_ctx *p = arg;
    if (rc == 1 && ++r->stored_redone <= 16) { /* it ended (or was cancelled) meanwhile: as it is now */
        void (*again)(request *) = p->again;
        char id[48];
        snprintf(id, sizeof id, "%s", p->id);
        poll_ctx_free(p);
        return stored_fetch_one(r, id, again);
    }
    if (rc) { /* not stored: said as it stands, the next poll tries again */
        fprintf(stderr, "potserve: %s: its runner is gone, but the store did not take it as failed\n", p->id);
        api_error e;
        api_fail(&e, 503, "store_unavailable", NULL, "the store did not answer; retry");
        poll_ctx_free(p);
        return respond_retry(r, &e, 1);
    }
    respond_json(r, 200, json_incref(json_object_get(p->entry, "object")));
    poll_ctx_free(p);
}

static void held_known(request *r, void *arg) {
    poll_ctx *p = arg;
    server *s = r->srv;
    if (p->held != 0) { /* running somewhere (or the store did not say): as stored */
        if (p->held < 0) fprintf(stderr, "potserve: %s: %s\n", p->id, p->err);
        respond_json(r, 200, json_incref(json_object_get(p->entry, "object")));
        return poll_ctx_free(p);
    }
    /* no replica runs it: failed, written over the very entry read (a late answer or a cancel wins) */
    fprintf(stderr, "potserve: %s: no replica runs it (its run mark is gone): storing it as failed\n", p->id);
    json_object_set_new(p->entry, "object", background_runner_gone(json_object_get(p->entry, "object")));
    json_object_set_new(s->stored_read, p->id, json_string(p->read));
    stored_update(r, p->id, json_deep_copy(p->entry), 1, failed_written, p);
}

void background_poll(request *r, const char *id, json_t *entry, void (*again)(request *r)) {
    server *s = r->srv;
    json_t *object = json_object_get(entry, "object");
    int unfinished = background_unfinished(object);
    request *d = unfinished ? running(s, id) : NULL;
    if (d && !d->bg->lost) { /* running here: how far it is */
        object = json_deep_copy(object);
        json_object_set_new(object, "status", json_string(d->bg->cancelled ? "cancelled"
                                                           : d->gen && generation_waiting(d->gen) ? "queued"
                                                                                                : "in_progress"));
        return respond_json(r, 200, object);
    }
    if (!unfinished || !store_is_shared(s->st)) return respond_json(r, 200, json_incref(object));
    poll_ctx *p = calloc(1, sizeof *p);
    const char *read = json_string_value(json_object_get(s->stored_read, id));
    if (!p || !read || !(p->read = strdup(read)) || !(p->entry = json_deep_copy(entry))) {
        if (p) poll_ctx_free(p);
        return respond_json(r, 200, json_incref(object));
    }
    snprintf(p->id, sizeof p->id, "%s", id);
    p->s = s;
    p->again = again;
    request_work(r, WORK_POOL, held_work, held_known, p);
}

typedef struct cancel_ctx {
    char id[48];
    json_t *answer;
} cancel_ctx;

static void answer_cancel(request *r);

static void cancel_kept(request *r, void *arg, int rc) {
    cancel_ctx c = *(cancel_ctx *)arg;
    free(arg);
    if (rc == 1 && ++r->stored_redone <= 16) { /* it changed meanwhile (it ended): look again */
        json_decref(c.answer);
        return stored_fetch_one(r, c.id, answer_cancel);
    }
    if (rc) {
        json_decref(c.answer);
        api_error e;
        api_fail(&e, 503, "store_unavailable", NULL, "the store did not take the cancel; retry");
        return respond_retry(r, &e, 1);
    }
    respond_json(r, 200, c.answer);
}

static void answer_cancel(request *r) {
    server *s = r->srv;
    char id[48];
    snprintf(id, sizeof id, "%.*s", (int)strcspn(r->url + strlen("/v1/responses/"), "/"),
             r->url + strlen("/v1/responses/"));
    api_error e;
    json_t *entry = stored_get(r, id, "response"), *object = json_object_get(entry, "object");
    if (!entry) {
        api_fail(&e, 404, "response_not_found", NULL, "no stored response '%s'", id);
        return respond_error(r, &e);
    }
    if (!json_is_true(json_object_get(object, "background"))) {
        api_fail(&e, 400, "invalid_value", NULL, "only a response created with background: true can be cancelled");
        return respond_error(r, &e);
    }
    const char *status = json_string_value(json_object_get(object, "status"));
    if (strcmp(status, "queued") && strcmp(status, "in_progress")) /* it ended: as it is */
        return respond_json(r, 200, json_incref(object));
    background_stop_running(s, id); /* here: stopped now (its answer ends in background_answered, as cancelled) */
    cancel_ctx *c = malloc(sizeof *c);
    json_t *fresh = json_deep_copy(entry);
    if (!c || !fresh) {
        free(c);
        json_decref(fresh);
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    json_object_set_new(json_object_get(fresh, "object"), "status", json_string("cancelled"));
    snprintf(c->id, sizeof c->id, "%s", id);
    c->answer = json_incref(json_object_get(fresh, "object"));
    stored_update(r, id, fresh, 1, cancel_kept, c);
}

void background_cancel(request *r, const char *id) {
    if (strcmp(r->method, "POST")) return respond_method_not_allowed(r, "POST");
    stored_fetch_one(r, id, answer_cancel);
}
