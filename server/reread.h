/* Re-reading a session's document from its chunk log through a new pot
 * guided by a question (server/reread.c); private to server/. Loop thread. */
#ifndef POTSERVE_REREAD_H
#define POTSERVE_REREAD_H

#include "server/server_internal.h"

typedef struct reread_pass reread_pass;
typedef struct reread_pot reread_pot; /* a re-read pot, shared by the questions it answers */

typedef struct reread_stats {
    uint64_t bytes;  /* document bytes re-read */
    int64_t tokens;  /* document tokens read into the question's pot */
    int32_t tokens_in_pot; /* entries the pot holds at the end (what an answer's prompt comes after) */
    double ms;       /* from the question's arrival to its pot being ready */
    double log_ms;   /* reading the log (engine thread), once for the whole pass */
    uint64_t pass;   /* the log pass: questions with the same id shared one read of the log */
    int questions;   /* questions the pass had taken when this one's pot was ready */
    int pots;        /* pots the pass fed by then (share "rows": 1; "pots": one a question) */
} reread_stats;

/* After each piece the question's pot has read: bytes done of total. */
typedef void (*reread_progress_fn)(server *s, void *user, uint64_t done, uint64_t total);
/* Once: the question's pot (release it with reread_pot_release), or NULL and err. */
typedef void (*reread_done_fn)(server *s, void *user, reread_pot *pot, const reread_stats *st,
                               const char *err);

/* Re-reads ss's logged document for question (copied) through a FINCH pot
 * with the session's budget, joining a pass of the same session that other
 * questions wait on when the server's reread_share settings allow it; cancel
 * (may be NULL) set stops this question's part between pieces. 0 (done will
 * be called), or -1 + e: 409 when the session has no log or an upload or
 * restore holds it, 429 when no pot memory is free. */
int reread_start(server *s, session *ss, const char *question, const atomic_int *cancel,
                 reread_progress_fn progress, reread_done_fn done, void *user, api_error *e);

/* A session's whole logged document, read on the engine thread by
 * session_log_fetch: what a re-read feeds its pots and a recall searches. */
typedef struct session_log_text {
    char *text;     /* malloc'd, len bytes (not NUL-terminated); the caller frees it */
    size_t len, cap;
    int final;      /* the log's document is complete */
    double ms;      /* the read, on the engine thread */
    int rc;         /* 0, or -1 and err */
    char err[256];
    /* session_log_fetch's own */
    server *srv;
    session *ss;
    void (*done)(server *s, void *user);
    void *user;
} session_log_text;

/* Reads every committed byte of ss's log into t (zeroed by the caller) on the
 * engine thread while uploads are held off (ss->disk_busy, set here), then,
 * back on the loop thread with disk_busy cleared, calls done(s, user): t->rc
 * says how it went. 0, or -1 (t->rc, t->err) when the server is shutting down:
 * done is not called. The caller keeps ss referenced and t in place until done. */
int session_log_fetch(server *s, session *ss, session_log_text *t, void (*done)(server *s, void *user),
                      void *user);

/* The pot's document, for generations over it (valid until the release). */
engine_doc *reread_pot_doc(const reread_pot *p);
/* Drops one question's hold on the pot; the last closes it and frees its memory. */
void reread_pot_release(reread_pot *p);

#endif
