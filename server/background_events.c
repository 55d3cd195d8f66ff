/* The events of streamed background responses ("background": true,
 * "stream": true), and GET /v1/responses/{id}?stream=true.
 *
 * What the running request's stream writes goes to an event log here
 * (event_log), which the asking client and GET ?stream=true follow, each from
 * its own offset, woken as it grows; it is kept a while after its end
 * (s->bg_logs, within response_store_bytes together).
 *
 * With a shared store the log is also shipped there as it grows (one append
 * out at a time, what was written meanwhile going with the next), so that a
 * stream through a replica without the log (another replica, or this one
 * after a restart) follows the store's copy: a remote follower, looked at
 * every FOLLOW_MS, which sends the same events with the same numbers while
 * they are written. It ends with the runner's last event; when the runner
 * dies first (its run mark gone, the entry unfinished), with the
 * response.failed a poll stores; when the answer is stored but its last
 * events never come, with the answer's end after FINAL_GRACE_MS.
 *
 * A response with no events anywhere (made without "stream", or its events
 * lost) is streamed by a waiting stream: it waits for the end (looked at each
 * second; SSE pings keep the connection open) and replays the stored answer's
 * events (responses_replay, numbered as the replay makes them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/background_internal.h"

enum {
    FOLLOW_MS = 50,          /* how often a remote follower reads the store's copy */
    WAIT_LOOK_MS = 1000,     /* how often a stream waiting for an answer without events looks */
    FINAL_GRACE_MS = 5000,   /* the answer stored, how long its last events may take to come */
    SHIP_EVERY_MS = 20,      /* appends at most this often while it runs (one per token cost the
                                generation some 15 % here: tests/bench/background_stream.py --redis) */
    SHIP_RETRY_MS = 1000,    /* an append the store did not take is tried again after this, */
    SHIP_RETRIES = 60,       /* at most this many times in a row (a Redis restart costs no event) */
    SHIP_MAX = 256 * 1024,   /* the most one append ships */
    FOLLOW_MAX = 256 * 1024, /* the most one look reads */
};

struct event_log {
    int refs; /* its response's request, each follower, the kept list, an append out */
    char id[48];
    char *text;
    size_t len, cap;
    int ended;
    VEC(request *) readers; /* woken as it grows */
    event_log *next_kept;
    server *shipped_by; /* a shared store's copy: the server whose store has it (NULL: none) */
    size_t shipped;     /* bytes the store has */
    int shipping;       /* an append is out */
    double shipped_ms;  /* (monotonic_ms) when the last one went (a failed one: when the next may go, less
                           SHIP_EVERY_MS) */
    int ship_failures;  /* appends in a row the store did not take */
    int ship_ended;     /* the store has them whole */
    int ship_stopped;   /* the entry is gone, or the store failed: no more appends */
};

/* A GET ?stream=true of a response whose events are not here (below). */
struct waiting_stream {
    request *r;
    char id[48];
    int64_t after;       /* starting_after */
    int looking;         /* a look at the shared store is out (its work holds w) */
    int done;            /* its stream ended: w goes at the next sweep with no look out */
    int said_waiting;    /* the comment that it waits for the end was sent */
    double next_look_ms; /* (monotonic_ms) */
    /* following the store's copy of the events */
    uint64_t offset;          /* bytes of them read */
    char *partial;            /* an event read in part */
    size_t partial_len;
    int64_t last_seq;         /* the last event's number (-1: none yet) */
    double final_since_ms;    /* the answer stored, its last events not yet read: since when (0: not) */
    int want_entry;           /* the next look fetches the entry: the last one read no new events */
    /* a look's answer */
    store_events_look seen;
    int look_rc;
    char err[160];
    waiting_stream *next;
};

/* ---- the log -------------------------------------------------------------------------- */

event_log *event_log_new(server *s, const char *id) {
    event_log *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->refs = 1;
    snprintf(l->id, sizeof l->id, "%s", id);
    if (store_is_shared(s->st)) l->shipped_by = s;
    return l;
}

void event_log_unref(event_log *l) {
    if (!l || --l->refs > 0) return;
    free(l->text);
    free(l->readers.v);
    free(l);
}

typedef struct ship_job {
    uv_work_t work;
    event_log *l;
    store *st;
    char *data;
    size_t at, n;
    int end, rc;
    char err[160];
} ship_job;

static void log_ship(event_log *l);

static void ship_work(uv_work_t *w) {
    ship_job *j = w->data;
    j->rc = store_response_events_append(j->st, j->l->id, j->at, j->data, j->n, j->end, j->err, sizeof j->err);
}

static void ship_done(uv_work_t *w, int status) {
    (void)status;
    ship_job *j = w->data;
    event_log *l = j->l;
    l->shipping = 0;
    if (!j->rc) {
        l->shipped += j->n;
        l->ship_ended = j->end;
        l->ship_failures = 0;
    } else if (j->rc < 0 && ++l->ship_failures <= SHIP_RETRIES) {
        l->shipped_ms = monotonic_ms() + SHIP_RETRY_MS - SHIP_EVERY_MS;
        if (l->ship_failures == 1)
            fprintf(stderr, "potserve: %s: the store did not take its events (%s): trying again each second\n", l->id,
                    j->err);
    } else { /* (1: gone, deleted or dropped, nobody can follow it there) */
        l->ship_stopped = 1;
        if (j->rc != 1)
            fprintf(stderr, "potserve: %s: its events are no longer shipped to the store (%s): streams through "
                            "other replicas end with the stored answer\n", l->id,
                    j->rc < 0 ? j->err : "its copy there is not what was shipped");
    }
    free(j->data);
    free(j);
    log_ship(l);
    event_log_unref(l);
}

static void on_ship_tick(uv_timer_t *t) {
    server *s = t->data;
    for (request *r = s->live; r; r = r->next_live)
        if (r->bg && r->bg->log) log_ship(r->bg->log);
    for (event_log *l = s->bg_logs; l; l = l->next_kept) log_ship(l); /* (ended, an append to try again) */
}

/* Ships what the store does not have yet, unless an append is out (its end
 * ships the rest) or may not go yet: less than SHIP_EVERY_MS after the last
 * while it runs, SHIP_RETRY_MS after one that failed (then at that time). */
static void log_ship(event_log *l) {
    server *s = l->shipped_by;
    if (!s || l->shipping || l->ship_stopped || l->ship_ended) return;
    size_t n = l->len - l->shipped < SHIP_MAX ? l->len - l->shipped : SHIP_MAX;
    int end = l->ended && l->shipped + n == l->len;
    if (!n && !end) return;
    double now = monotonic_ms(), due = l->shipped_ms + (l->ended && !l->ship_failures ? 0 : SHIP_EVERY_MS);
    if (now < due) {
        uint64_t wait = (uint64_t)(due - now) + 1;
        if (!uv_is_active((uv_handle_t *)&s->bg_ship) || uv_timer_get_due_in(&s->bg_ship) > wait)
            uv_timer_start(&s->bg_ship, on_ship_tick, wait, 0);
        return;
    }
    l->shipped_ms = now;
    ship_job *j = calloc(1, sizeof *j);
    if (!j || !(j->data = malloc(n ? n : 1))) {
        free(j);
        l->ship_stopped = 1;
        fprintf(stderr, "potserve: %s: out of memory: its events are no longer shipped to the store\n", l->id);
        return;
    }
    if (n) memcpy(j->data, l->text + l->shipped, n);
    *j = (ship_job){.l = l, .st = s->st, .data = j->data, .at = l->shipped, .n = n, .end = end};
    j->work.data = j;
    if (uv_queue_work(s->loop, &j->work, ship_work, ship_done)) {
        free(j->data);
        free(j);
        l->ship_stopped = 1;
        return;
    }
    l->refs++;
    l->shipping = 1;
}

int background_log_start(request *d) { return d->bg->log ? 0 : -1; }

void background_log_write(request *d, const char *data, size_t n) {
    event_log *l = d->bg->log;
    if (!l || l->ended) return;
    if (l->len + n > l->cap) {
        size_t cap = (l->len + n) * 2 + 4096;
        char *t = realloc(l->text, cap);
        if (!t) { /* out of memory: its followers' streams end here (never a gap; SSE drops an unended event) */
            fprintf(stderr, "potserve: %s: out of memory for its events: its streams end early\n", d->bg->id);
            l->ended = 1;
            for (size_t i = 0; i < l->readers.n; i++) request_wake(l->readers.v[i]);
            return log_ship(l);
        }
        l->text = t;
        l->cap = cap;
    }
    memcpy(l->text + l->len, data, n);
    l->len += n;
    for (size_t i = 0; i < l->readers.n; i++) {
        l->readers.v[i]->last_write_ms = monotonic_ms(); /* (no keep-alive ping needed) */
        request_wake(l->readers.v[i]);
    }
    log_ship(l);
}

/* Keeps l for GET ?stream=true after its end, the oldest kept going past response_store_bytes. */
static void log_keep(server *s, event_log *l) {
    l->refs++;
    l->next_kept = s->bg_logs;
    s->bg_logs = l;
    s->bg_logs_bytes += l->len;
    size_t kept = 0;
    for (event_log **p = &s->bg_logs; *p;) {
        kept += (*p)->len;
        if (kept > (size_t)s->cfg.response_store_bytes && *p != l) {
            event_log *old = *p;
            *p = old->next_kept;
            s->bg_logs_bytes -= old->len;
            event_log_unref(old);
        } else {
            p = &(*p)->next_kept;
        }
    }
}

static void waiting_free(waiting_stream *w) {
    request_unref(w->r);
    free(w->seen.entry);
    free(w->seen.events);
    free(w->partial);
    free(w);
}

void background_logs_free(server *s) {
    while (s->bg_waiting) {
        waiting_stream *w = s->bg_waiting;
        s->bg_waiting = w->next;
        waiting_free(w);
    }
    while (s->bg_logs) {
        event_log *l = s->bg_logs;
        s->bg_logs = l->next_kept;
        event_log_unref(l);
    }
    s->bg_logs_bytes = 0;
}

void event_log_close(request *d) {
    event_log *l = d->bg->log;
    if (!l || l->ended) return;
    l->ended = 1;
    for (size_t i = 0; i < l->readers.n; i++) request_wake(l->readers.v[i]);
    log_keep(d->srv, l);
    log_ship(l);
}

void background_log_end(request *d) {
    event_log_close(d);
    if (!d->status) background_answered(d, 200, NULL); /* (its stream ended with the answer, stored already) */
}

/* ---- following the log here --------------------------------------------------------------- */

ssize_t background_follow_read(request *f, char *buf, size_t max) {
    event_log *l = f->follows;
    size_t avail = l->len - f->follows_at;
    if (!avail) return l->ended ? -1 : 0;
    size_t n = avail < max ? avail : max;
    memcpy(buf, l->text + f->follows_at, n);
    f->follows_at += n;
    return (ssize_t)n;
}

void background_unfollow(request *f) {
    event_log *l = f->follows;
    for (size_t i = 0; i < l->readers.n; i++)
        if (l->readers.v[i] == f) {
            l->readers.v[i] = l->readers.v[--l->readers.n];
            break;
        }
    f->follows = NULL;
    event_log_unref(l);
}

/* r streams l's events from byte `from` on, as they come. */
static void follow(request *r, event_log *l, size_t from) {
    if (vec_push(&l->readers, r)) {
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    l->refs++;
    r->follows = l;
    r->follows_at = from;
    if (stream_start(r)) { /* (out of memory: the reader was not made) */
        background_unfollow(r);
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        respond_error(r, &e);
    }
}

void event_log_follow(request *r, event_log *l) { follow(r, l, 0); }

/* The number of the event in block (its text, "event: T\ndata: {...,
 * "sequence_number":K}\n\n"), or -1 when it has none. */
static int64_t block_seq(const char *block, size_t n) {
    static const char KEY[] = "\"sequence_number\":";
    const char *k = memmem(block, n, KEY, sizeof KEY - 1);
    return k ? strtoll(k + sizeof KEY - 1, NULL, 10) : -1;
}

/* Where l's events after the one numbered n begin: past that event's block;
 * its end when l has not come that far yet (what comes next), 0 for n < 0. */
static size_t log_offset_after(const event_log *l, int64_t n) {
    if (n < 0) return 0;
    size_t at = 0;
    while (at < l->len) {
        const char *end = memmem(l->text + at, l->len - at, "\n\n", 2);
        if (!end) break;
        size_t block_end = (size_t)(end - l->text) + 2;
        if (block_seq(l->text + at, block_end - at) == n) return block_end;
        at = block_end;
    }
    return l->len;
}

/* The log of response id here: its running request's, or one kept. */
static event_log *log_of(server *s, const char *id) {
    for (request *r = s->live; r; r = r->next_live)
        if (r->bg && r->bg->log && !strcmp(r->bg->id, id)) return r->bg->log;
    for (event_log *l = s->bg_logs; l; l = l->next_kept)
        if (!strcmp(l->id, id)) return l;
    return NULL;
}

/* ---- streams of events not here: the store's copy, or the answer at its end -------------- */

int background_unfinished(json_t *object) {
    const char *status = json_string_value(json_object_get(object, "status"));
    return status && (!strcmp(status, "queued") || !strcmp(status, "in_progress"));
}

json_t *background_runner_gone(json_t *object) {
    json_t *failed = json_deep_copy(object);
    json_object_set_new(failed, "status", json_string("failed"));
    json_object_set_new(failed, "error",
                        json_pack("{s:s, s:s}", "code", "server_error", "message", BACKGROUND_RUNNER_GONE));
    return failed;
}

static void waiting_end(waiting_stream *w) {
    stream_end(w->r);
    w->done = 1;
}

/* w's response is gone from the store: an error event ends its stream. */
static void waiting_gone(waiting_stream *w) {
    api_error e;
    api_fail(&e, 404, "response_not_found", NULL, "response '%s' is no longer stored", w->id);
    stream_write(w->r, "event: error\ndata: ", 19);
    char *text = json_dumps(api_error_json(&e), JSON_COMPACT);
    if (text) stream_write(w->r, text, strlen(text));
    free(text);
    stream_write(w->r, "\n\n", 2);
    waiting_end(w);
}

/* w's stream, its response having no events (entry: what the store has now, NULL: gone). */
static void waiting_look(waiting_stream *w, json_t *entry, int runner) {
    json_t *object = json_object_get(entry, "object");
    if (!object) return waiting_gone(w);
    if (!background_unfinished(object)) {
        responses_replay(w->r, object, w->after);
        w->done = 1;
    } else if (!runner) { /* its runner is gone: failed, as a poll finds it (background_poll stores that) */
        json_t *failed = background_runner_gone(object);
        responses_replay(w->r, failed, w->after);
        json_decref(failed);
        w->done = 1;
    } else if (!w->said_waiting) {
        static const char WAIT[] = ": waiting for its end (it is generated without its events here)\n\n";
        stream_write(w->r, WAIT, sizeof WAIT - 1);
        w->said_waiting = 1;
    }
}

/* w's stream follows the store's copy of its events: the whole events read
 * now are sent (those numbered after starting_after), then it ends, or waits
 * for more, by what the look saw. */
static void follow_store(waiting_stream *w, json_t *entry, double now) {
    store_events_look *seen = &w->seen;
    if (seen->len) {
        char *t = realloc(w->partial, w->partial_len + seen->len);
        if (!t) { /* out of memory: the stream ends here (SSE drops an unended event) */
            fprintf(stderr, "potserve: %s: out of memory for a stream of its events\n", w->id);
            return waiting_end(w);
        }
        memcpy(t + w->partial_len, seen->events, seen->len);
        w->partial = t;
        w->partial_len += seen->len;
        w->offset += seen->len;
    }
    size_t at = 0;
    for (const char *end; at < w->partial_len && (end = memmem(w->partial + at, w->partial_len - at, "\n\n", 2));) {
        size_t block_end = (size_t)(end - w->partial) + 2;
        int64_t seq = block_seq(w->partial + at, block_end - at);
        if (seq >= 0) w->last_seq = seq;
        if (seq < 0 || seq > w->after) stream_write(w->r, w->partial + at, block_end - at);
        at = block_end;
    }
    if (at) {
        memmove(w->partial, w->partial + at, w->partial_len - at);
        w->partial_len -= at;
    }
    json_t *object = json_object_get(entry, "object");
    json_t *last = NULL; /* the end this stream gets from the entry, its runner's never coming */
    w->want_entry = !seen->len;
    if (seen->len == FOLLOW_MAX) {
        w->next_look_ms = 0; /* more to read at once */
    } else if (seen->ended) {
        return waiting_end(w);
    } else if (seen->len || !seen->entry_read) {
        return; /* events came (more will), or none and the next look brings the entry to judge by */
    } else if (!object) {
        return waiting_gone(w);
    } else if (background_unfinished(object)) {
        w->final_since_ms = 0;
        if (!seen->held) last = background_runner_gone(object);
    } else if (!w->final_since_ms) {
        w->final_since_ms = now;
    } else if (now - w->final_since_ms > FINAL_GRACE_MS) {
        fprintf(stderr, "potserve: %s: its answer is stored but its last events did not come: "
                        "a stream of it ends with the answer\n", w->id);
        last = json_incref(object);
    }
    if (last) {
        responses_stream_end_from(w->r, last, w->last_seq + 1, w->after);
        json_decref(last);
        w->done = 1;
    }
}

static void look_work(uv_work_t *work) {
    waiting_stream *w = work->data;
    server *s = w->r->srv;
    w->look_rc = store_response_events_look(s->st, w->id, w->offset, FOLLOW_MAX, w->want_entry, &w->seen, w->err,
                                            sizeof w->err);
}

static void look_done(uv_work_t *work, int status) {
    (void)status;
    waiting_stream *w = work->data;
    free(work);
    w->looking = 0;
    double now = monotonic_ms();
    w->next_look_ms = now + (w->seen.has_events || w->offset ? FOLLOW_MS : WAIT_LOOK_MS);
    if (w->look_rc) { /* the store did not answer: look again */
        w->next_look_ms = now + WAIT_LOOK_MS;
        return;
    }
    json_t *entry = w->seen.entry ? json_loads(w->seen.entry, 0, NULL) : NULL;
    if (!w->done && w->r->conn) {
        if (w->seen.has_events || w->offset) follow_store(w, entry, now);
        else waiting_look(w, entry, w->seen.held);
    }
    json_decref(entry);
    free(w->seen.entry);
    free(w->seen.events);
    memset(&w->seen, 0, sizeof w->seen);
}

static void look(server *s, waiting_stream *w) {
    if (!store_is_shared(s->st)) { /* (in memory: the entry itself) */
        w->next_look_ms = monotonic_ms() + WAIT_LOOK_MS;
        return waiting_look(w, json_object_get(s->stored, w->id), 1);
    }
    uv_work_t *work = calloc(1, sizeof *work);
    if (!work) return;
    work->data = w;
    w->looking = 1;
    if (uv_queue_work(s->loop, work, look_work, look_done)) {
        w->looking = 0;
        free(work);
    }
}

void background_sweep(server *s) {
    double now = monotonic_ms();
    for (waiting_stream **p = &s->bg_waiting; *p;) {
        waiting_stream *w = *p;
        if (w->looking) {
            p = &w->next;
            continue;
        }
        if (w->done || !w->r->conn) { /* ended, or its client left */
            *p = w->next;
            waiting_free(w);
            continue;
        }
        p = &w->next;
        if (now >= w->next_look_ms) look(s, w);
    }
    if (!s->bg_waiting) uv_timer_stop(&s->bg_follow);
}

static void on_follow_tick(uv_timer_t *t) { background_sweep(t->data); }

void background_stream_get(request *r, const char *id, json_t *entry, int64_t starting_after) {
    server *s = r->srv;
    json_t *object = json_object_get(entry, "object");
    event_log *l = log_of(s, id);
    if (l) return follow(r, l, log_offset_after(l, starting_after));
    /* a shared store may have its events; in memory, an unfinished one waits */
    int shared = store_is_shared(s->st);
    waiting_stream *w = shared || background_unfinished(object) ? calloc(1, sizeof *w) : NULL;
    if ((!w && (shared || background_unfinished(object))) || stream_start(r)) {
        free(w);
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    if (!w) return responses_replay(r, object, starting_after);
    *w = (waiting_stream){.r = r, .after = starting_after, .last_seq = -1, .want_entry = 1, .next = s->bg_waiting};
    snprintf(w->id, sizeof w->id, "%s", id);
    request_ref(r);
    s->bg_waiting = w;
    if (!uv_is_active((uv_handle_t *)&s->bg_follow)) uv_timer_start(&s->bg_follow, on_follow_tick, FOLLOW_MS, FOLLOW_MS);
    look(s, w);
}

void background_streams_stop(server *s) {
    for (waiting_stream *w = s->bg_waiting; w; w = w->next) /* (their connections close) */
        if (!w->done && w->r->conn) {
            static const char STOP[] = ": the server is stopping: stream it again from another replica, or later\n\n";
            stream_write(w->r, STOP, sizeof STOP - 1);
            waiting_end(w);
        }
}

int background_streams_waiting(const server *s) {
    int n = 0;
    for (const waiting_stream *w = s->bg_waiting; w; w = w->next) n += !w->done;
    return n;
}
