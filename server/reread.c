/* Re-reading a session's document for a question that arrived after it: the
 * document comes back from the session's chunk log (every committed byte)
 * and is read through a new pot whose compression is guided by the question
 * (FINCH's question rows in every engine chunk), so what the question needs
 * is kept even when the session's own question-agnostic pot dropped it.
 *
 * Loop thread, except the tasks marked "engine thread". The log is read on
 * the engine thread while the session's disk_busy flag keeps uploads out;
 * the text then goes to the engine in pieces of REREAD_PIECE bytes, each
 * reported through the progress callback, so other sessions' work runs in
 * between and a streamed request can tell its client how far it is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/reread.h"

enum { REREAD_PIECE = 64 * 1024 };

struct reread {
    server *srv;
    session *ss;
    engine_pot_settings settings; /* strings owned by the caller, alive until done */
    reread_progress_fn progress;
    reread_done_fn done;
    void *user;
    const atomic_int *cancel;
    char *text;                   /* the document, read from the log */
    size_t len, cap, at;
    int final;                    /* the log's document is complete */
    int sent_last;                /* the last piece went to the engine */
    engine_doc *doc;
    double t0_ms;
    int rc;
    char err[256];
};

static void finish(reread *rr, int rc, const char *err) {
    engine_doc *doc = rc ? NULL : rr->doc;
    if (rc && rr->doc) {
        if (srv_task(rr->srv, rr->doc, reread_close_task, rr->doc)) engine_doc_close(rr->doc);
    }
    reread_stats st = {.bytes = rr->len, .ms = srv_now_ms() - rr->t0_ms};
    if (doc) {
        engine_doc_stats ds;
        engine_doc_get_stats(doc, &ds); /* the document is idle: no chunk of it is running */
        st.tokens = ds.tokens_read;
    }
    rr->done(rr->srv, rr->user, doc, &st, rc ? err : NULL);
    session_unref(rr->ss);
    free(rr->text);
    free(rr);
}

void reread_close_task(engine *e, void *doc) {
    (void)e;
    engine_doc_close(doc);
}

static int collect(void *user, uint64_t seq, const char *data, size_t n) {
    (void)seq;
    reread *rr = user;
    if (rr->len + n > rr->cap) {
        size_t cap = (rr->len + n) * 2;
        char *t = realloc(rr->text, cap);
        if (!t) return snprintf(rr->err, sizeof rr->err, "out of memory reading the log"), -1;
        rr->text = t;
        rr->cap = cap;
    }
    memcpy(rr->text + rr->len, data, n);
    rr->len += n;
    return 0;
}

static int note_final(void *user, const chunk_log_entry *e) {
    ((reread *)user)->final |= e->final;
    return 0;
}

static void next_piece(server *s, void *arg);

static void piece_done(void *user, int rc, const char *err) { /* engine thread */
    reread *rr = user;
    rr->rc = rc;
    if (rc) snprintf(rr->err, sizeof rr->err, "%s", err ? err : "reading failed");
    srv_post(rr->srv, next_piece, rr);
}

/* Sends the next piece of the text to the engine, or finishes. */
static void next_piece(server *s, void *arg) {
    reread *rr = arg;
    if (rr->rc) return finish(rr, -1, rr->err);
    if (rr->cancel && atomic_load(rr->cancel)) return finish(rr, -1, "cancelled");
    if (rr->at > 0 && rr->progress) rr->progress(s, rr->user, rr->at, rr->len);
    if (rr->sent_last || (rr->len == 0 && !rr->final)) return finish(rr, 0, NULL);
    size_t n = rr->len - rr->at < REREAD_PIECE ? rr->len - rr->at : REREAD_PIECE;
    int last = rr->at + n == rr->len;
    rr->sent_last = last;
    const char *piece = rr->text + rr->at;
    rr->at += n;
    if (srv_ingest(s, rr->doc, piece, n, last && rr->final, piece_done, rr))
        finish(rr, -1, "the server is shutting down");
}

static void log_read(server *s, void *arg) {
    reread *rr = arg;
    rr->ss->disk_busy = 0;
    if (rr->rc) return finish(rr, -1, rr->err);
    next_piece(s, rr);
}

/* Engine thread: the log's bytes into memory, and the new pot. */
static void read_log_task(engine *e, void *arg) {
    reread *rr = arg;
    rr->rc = store_log_replay(rr->ss->log, 0, collect, note_final, rr, rr->err, sizeof rr->err);
    if (!rr->rc) {
        rr->doc = engine_doc_open(e, &rr->settings, rr->err, sizeof rr->err);
        rr->rc = rr->doc ? 0 : -1;
    }
    srv_post(rr->srv, log_read, rr);
}

int reread_start(server *s, session *ss, const engine_pot_settings *settings, const atomic_int *cancel,
                 reread_progress_fn progress, reread_done_fn done, void *user, api_error *e) {
    if (!ss->log)
        return api_fail(e, 409, "reread_unavailable", "reread", "the session keeps no log to re-read");
    if (ss->busy || ss->disk_busy || ss->rebuilding)
        return api_fail(e, 409, "session_busy", "session",
                        "the session is receiving or restoring its document; retry to re-read it");
    reread *rr = calloc(1, sizeof *rr);
    if (!rr) return api_fail(e, 500, NULL, NULL, "out of memory");
    *rr = (reread){.srv = s, .ss = ss, .settings = *settings, .progress = progress, .done = done,
                   .user = user, .cancel = cancel, .t0_ms = srv_now_ms()};
    session_ref(ss);
    ss->disk_busy = 1; /* no upload touches the log while the engine thread reads it */
    if (srv_task(s, NULL, read_log_task, rr)) {
        ss->disk_busy = 0;
        session_unref(ss);
        free(rr);
        return api_fail(e, 503, "unavailable", NULL, "the server is shutting down");
    }
    return 0;
}
