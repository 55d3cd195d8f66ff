/* Re-reading a session's document for a question that arrived after it: the
 * document comes back from the session's chunk log (every committed byte)
 * and is read through a new pot whose compression is guided by the question
 * (FINCH's question rows in every engine chunk), so what the question needs
 * is kept even when the session's own question-agnostic pot dropped it.
 *
 * Questions waiting for the same session share one pass: a pass waits
 * reread_gather_ms for others before it reads the log, and takes at most
 * reread_share_limit questions. With reread_share "rows" the pass feeds one
 * pot scored by all its questions' rows together (one forward pass for all;
 * questions join until the log has been read); with "pots" it feeds one
 * pot per question from the one copy of the text read from the log (each
 * pot's forward passes are its own: a chunk's KV depends on what the pot
 * kept before it), and a question may join while the pass is running: its
 * pot starts from the first byte.
 *
 * Loop thread, except the tasks marked "engine thread". The log is read on
 * the engine thread while the session's disk_busy flag keeps uploads out;
 * the text then goes to each pot in pieces of REREAD_PIECE bytes, each
 * reported through the progress callback, so other sessions' work runs in
 * between and a streamed request can tell its client how far it is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/reread.h"

/* A pot stops within an engine chunk once every question it is read for has
 * been cancelled (feeder.abandon: their cancel flags). */
enum { REREAD_PIECE = 16 * 1024, REREAD_MAX_SHARE = 32 };

typedef struct feeder { /* one pot fed from the pass's text */
    reread_pass *pass;
    engine_pot_settings settings;
    char *question;     /* its scoring rows' text (owned; "rows": every question's) */
    engine_doc *doc;
    size_t at;          /* bytes sent to the pot */
    size_t memory;      /* counted in the server's pot_memory until released */
    int sent_last, ended, rc;
    char err[256];
    /* The pot is abandoned once all of these are set: its questions' cancel flags, an ended
     * question's swapped for ended_flag (the generation holding its own may be freed). */
    const atomic_int *abandon[REREAD_MAX_SHARE];
    int n_abandon;
} feeder;

static const atomic_int ended_flag = 1;

typedef struct member { /* one question waiting on the pass */
    reread_progress_fn progress;
    reread_done_fn done;
    void *user;
    const atomic_int *cancel;
    feeder *f;
    int abandon_slot;   /* its place in f->abandon, or -1 */
    double t0_ms;
    int ended;
} member;

struct reread_pot {
    server *srv;
    engine_doc *doc;
    size_t memory;
    int refs;
};

struct reread_pass {
    server *srv;
    session *ss;
    uint64_t id;
    int rows;            /* share "rows": one pot for all the questions */
    enum { GATHERING, READING, FEEDING } state;
    uv_timer_t gather;
    session_log_text log; /* the document, read from the log */
    member members[REREAD_MAX_SHARE];
    feeder feeders[REREAD_MAX_SHARE];
    int n_members, n_feeders;
};

static uint64_t last_pass_id; /* loop thread only */

engine_doc *reread_pot_doc(const reread_pot *p) { return p->doc; }

static void close_doc_task(engine *e, void *doc) { /* engine thread */
    (void)e;
    engine_doc_close(doc);
}

static void close_doc(server *s, engine_doc *doc) {
    if (doc && srv_task(s, doc, close_doc_task, doc)) engine_doc_close(doc);
}

void reread_pot_release(reread_pot *p) {
    if (--p->refs) return;
    close_doc(p->srv, p->doc);
    p->srv->pot_memory -= p->memory;
    free(p);
}

static void pass_free_cb(uv_handle_t *h) {
    reread_pass *p = h->data;
    for (int i = 0; i < p->n_feeders; i++) free(p->feeders[i].question);
    free(p->log.text);
    free(p);
}

/* Ends the pass once nothing of it runs: no feeder is left and the log is read. */
static void pass_maybe_end(reread_pass *p) {
    if (p->state != FEEDING) return;
    for (int i = 0; i < p->n_feeders; i++)
        if (!p->feeders[i].ended) return;
    if (p->ss->reread_open == p) p->ss->reread_open = NULL;
    session_unref(p->ss);
    uv_close((uv_handle_t *)&p->gather, pass_free_cb);
}

static void member_end(reread_pass *p, member *m, reread_pot *pot, const char *err) {
    m->ended = 1;
    feeder *f = m->f;
    if (m->abandon_slot >= 0) f->abandon[m->abandon_slot] = &ended_flag; /* the pot is idle here */
    reread_stats st = {.bytes = p->log.len, .ms = monotonic_ms() - m->t0_ms, .log_ms = p->log.ms, .pass = p->id,
                       .questions = p->n_members, .pots = p->n_feeders};
    if (pot) {
        engine_doc_stats ds;
        engine_doc_get_stats(pot->doc, &ds); /* the document is idle: no chunk of it is running */
        st.tokens = ds.tokens_read;
        st.tokens_in_pot = ds.tokens_in_pot;
    } else {
        st.bytes = f->at;
    }
    m->done(p->srv, m->user, pot, &st, pot ? NULL : err);
}

/* The feeder stops: its pot goes to the questions still waiting on it, or
 * (err, or nobody waits) is closed. */
static void feeder_end(feeder *f, const char *err) {
    reread_pass *p = f->pass;
    server *s = p->srv;
    f->ended = 1;
    int waiting = 0;
    for (int i = 0; i < p->n_members; i++) waiting += p->members[i].f == f && !p->members[i].ended;
    reread_pot *pot = NULL;
    if (!err && waiting) {
        pot = malloc(sizeof *pot);
        if (!pot) err = "out of memory";
        else *pot = (reread_pot){.srv = s, .doc = f->doc, .memory = f->memory, .refs = waiting};
    }
    if (f->doc) { /* what it read, asked for or not (the document is idle) */
        engine_doc_stats ds;
        engine_doc_get_stats(f->doc, &ds);
        s->m.tokens_reread += ds.tokens_read;
    }
    if (!pot) {
        close_doc(s, f->doc);
        s->pot_memory -= f->memory;
    }
    f->doc = NULL;
    for (int i = 0; i < p->n_members; i++)
        if (p->members[i].f == f && !p->members[i].ended) member_end(p, &p->members[i], pot, err);
    pass_maybe_end(p);
}

static void feeder_step(server *s, void *arg);

static void piece_done(void *user, int rc, const char *err) { /* engine thread */
    feeder *f = user;
    if (f->sent_last) engine_doc_abandon_when_all(f->doc, NULL, 0); /* read: each answer has its own cancel */
    if (rc) {
        f->rc = rc;
        snprintf(f->err, sizeof f->err, "%s", err ? err : "reading failed");
    }
    srv_post(f->pass->srv, feeder_step, f);
}

static void open_task(engine *e, void *arg) { /* engine thread */
    feeder *f = arg;
    f->doc = engine_doc_open(e, &f->settings, f->err, sizeof f->err);
    f->rc = f->doc ? 0 : -1;
    if (f->doc) engine_doc_abandon_when_all(f->doc, f->abandon, f->n_abandon);
    srv_post(f->pass->srv, feeder_step, f);
}

/* The feeder's next move: its cancelled questions end, then the pot is
 * opened, fed the next piece, or handed over. */
static void feeder_step(server *s, void *arg) {
    feeder *f = arg;
    reread_pass *p = f->pass;
    /* progress first: reporting it is how a question finds its client gone (and cancels) */
    for (int i = 0; f->at > 0 && f->doc && i < p->n_members; i++) {
        member *m = &p->members[i];
        if (m->f == f && !m->ended && m->progress) m->progress(s, m->user, f->at, p->log.len);
    }
    int waiting = 0;
    for (int i = 0; i < p->n_members; i++) {
        member *m = &p->members[i];
        if (m->f != f || m->ended) continue;
        if (m->cancel && atomic_load(m->cancel)) member_end(p, m, NULL, "cancelled");
        else waiting++;
    }
    if (f->rc) return feeder_end(f, f->err);
    if (!waiting) return feeder_end(f, "cancelled");
    if (!f->doc) { /* its questions are all here now ("rows" takes none once the log is read) */
        f->n_abandon = 0;
        for (int i = 0; i < p->n_members; i++) {
            member *m = &p->members[i];
            if (m->f != f || m->ended || !m->cancel) continue;
            m->abandon_slot = f->n_abandon;
            f->abandon[f->n_abandon++] = m->cancel;
        }
        if (f->n_abandon < waiting) f->n_abandon = 0; /* a question that cannot be cancelled: read on */
        if (srv_task(s, NULL, open_task, f)) feeder_end(f, "the server is shutting down");
        return;
    }
    if (f->sent_last || (p->log.len == 0 && !p->log.final)) return feeder_end(f, NULL);
    size_t n = p->log.len - f->at < REREAD_PIECE ? p->log.len - f->at : REREAD_PIECE;
    int last = f->at + n == p->log.len;
    f->sent_last = last;
    const char *piece = p->log.text + f->at;
    f->at += n;
    if (srv_ingest(s, f->doc, piece, n, last && p->log.final, piece_done, f))
        feeder_end(f, "the server is shutting down");
}

static void log_read(server *s, void *arg) {
    reread_pass *p = arg;
    p->state = FEEDING;
    if (p->rows && p->ss->reread_open == p) p->ss->reread_open = NULL; /* its rows are fixed now */
    for (int i = 0; i < p->n_feeders; i++) {
        if (p->log.rc) feeder_end(&p->feeders[i], p->log.err);
        else feeder_step(s, &p->feeders[i]);
    }
}

/* ---- a session's whole logged document (also server/recall.c's) ---------------------- */

static int collect(void *user, uint64_t seq, const char *data, size_t n) { /* engine thread */
    (void)seq;
    session_log_text *t = user;
    if (t->len + n > t->cap) {
        size_t cap = (t->len + n) * 2;
        char *grown = realloc(t->text, cap);
        if (!grown) return snprintf(t->err, sizeof t->err, "out of memory reading the log"), -1;
        t->text = grown;
        t->cap = cap;
    }
    memcpy(t->text + t->len, data, n);
    t->len += n;
    return 0;
}

static int note_final(void *user, const chunk_log_entry *e) { /* engine thread */
    ((session_log_text *)user)->final |= e->final;
    return 0;
}

static void log_fetched(server *s, void *arg) {
    session_log_text *t = arg;
    t->ss->disk_busy = 0;
    t->done(s, t->user);
}

static void fetch_task(engine *e, void *arg) { /* engine thread */
    (void)e;
    session_log_text *t = arg;
    double t0 = monotonic_ms();
    t->rc = store_log_replay(t->ss->log, 0, collect, note_final, t, t->err, sizeof t->err);
    t->ms = monotonic_ms() - t0;
    srv_post(t->srv, log_fetched, t);
}

int session_log_fetch(server *s, session *ss, session_log_text *t, void (*done)(server *s, void *user),
                      void *user) {
    t->srv = s;
    t->ss = ss;
    t->done = done;
    t->user = user;
    ss->disk_busy = 1; /* no upload touches the log until the engine thread has read it */
    if (srv_task(s, NULL, fetch_task, t)) {
        ss->disk_busy = 0;
        t->rc = -1;
        snprintf(t->err, sizeof t->err, "the server is shutting down");
        return -1;
    }
    return 0;
}

static void gathered(uv_timer_t *t) {
    reread_pass *p = t->data;
    p->state = READING;
    if (session_log_fetch(p->srv, p->ss, &p->log, log_read, p)) log_read(p->srv, p);
}

/* The pot settings of a re-read: the session's budget and keep, FINCH scored by
 * question, whole words unless the session said "whole_words": false (the
 * default, "question", keeps them in every pot a question guides). */
static void pot_settings(const session *ss, const char *question, engine_pot_settings *ps) {
    *ps = ss->settings.pot;
    ps->policy = "finch";
    ps->whole_words = ss->settings.whole_words != API_WHOLE_WORDS_OFF;
    ps->question = question;
    ps->finch_keep = 0;
    ps->no_catalyst = 0;
    ps->original_positions = 0;
    ps->record_tokens = 0;
}

/* Whether a question arriving now may share p: room, rows not yet fed, and
 * (once p has read the log, when uploads go on) no chunk acknowledged since,
 * which its copy of the log would not hold. */
static int joinable(const reread_pass *p) {
    if (p->n_members >= p->srv->cfg.reread_share_limit) return 0;
    if (p->state != FEEDING) return 1;
    return !p->rows && (int64_t)p->log.len == p->ss->bytes_acked;
}

/* Adds the question to the pass: a feeder of its own ("pots", or the pass's
 * first), or its rows after the others' ("rows"); charges the pot memory. */
static int join(reread_pass *p, const char *question, api_error *e) {
    server *s = p->srv;
    int own = !p->rows || p->n_feeders == 0;
    feeder *f = own ? &p->feeders[p->n_feeders] : &p->feeders[0];
    size_t len = strlen(question) + (own ? 1 : strlen(f->question) + 2);
    char *rows = malloc(len);
    if (!rows) return api_fail(e, 500, NULL, NULL, "out of memory");
    if (own) snprintf(rows, len, "%s", question);
    else snprintf(rows, len, "%s\n\n%s", f->question, question);
    engine_pot_settings ps;
    pot_settings(p->ss, rows, &ps);
    size_t mem = engine_doc_memory(s->eng, &ps);
    size_t before = own ? 0 : f->memory;
    if (pot_memory_admit(s, mem, "reread", "a re-read", e)) {
        free(rows);
        return -1;
    }
    if (!pots_make_room(s, mem > before ? mem - before : 0)) {
        free(rows);
        return api_fail(e, 429, "insufficient_memory", NULL, "no pot memory is free to re-read the document");
    }
    s->pot_memory = s->pot_memory - before + mem;
    if (own) {
        *f = (feeder){.pass = p};
        p->n_feeders++;
    }
    free(f->question);
    f->question = rows;
    f->settings = ps;
    f->memory = mem;
    return 0;
}

int reread_start(server *s, session *ss, const char *question, const atomic_int *cancel,
                 reread_progress_fn progress, reread_done_fn done, void *user, api_error *e) {
    if (!ss->log)
        return api_fail(e, 409, "reread_unavailable", "reread", "the session keeps no log to re-read");
    reread_pass *p = ss->reread_open;
    int fresh = !p || !joinable(p);
    if (fresh) {
        const char *why = session_log_busy(ss);
        if (why) return api_fail(e, 409, "session_busy", "session", "%s; retry to re-read it", why);
        p = calloc(1, sizeof *p);
        if (!p) return api_fail(e, 500, NULL, NULL, "out of memory");
        *p = (reread_pass){.srv = s, .ss = ss, .id = ++last_pass_id,
                           .rows = !strcmp(s->cfg.reread_share, "rows")};
    }
    if (join(p, question, e)) {
        if (fresh) free(p);
        return -1;
    }
    p->members[p->n_members++] = (member){.progress = progress, .done = done, .user = user, .cancel = cancel,
                                          .f = p->rows ? &p->feeders[0] : &p->feeders[p->n_feeders - 1],
                                          .abandon_slot = -1,
                                          .t0_ms = monotonic_ms()};
    if (!fresh) {
        feeder *f = p->members[p->n_members - 1].f;
        if (p->state == FEEDING) srv_post(s, feeder_step, f); /* "pots": it starts from the first byte */
        return 0;
    }
    session_ref(ss);
    ss->disk_busy = 1; /* uploads wait from now, through the gathering, until the log is read */
    ss->reread_open = p;
    uv_timer_init(s->loop, &p->gather);
    p->gather.data = p;
    uv_timer_start(&p->gather, gathered, (uint64_t)s->cfg.reread_gather_ms, 0);
    return 0;
}
