/* A question answered with the passages of its session's document that share
 * its words (server/recall.c; the search is engine/recall.h); private to
 * server/. Loop thread. */
#ifndef POTSERVE_SERVER_RECALL_H
#define POTSERVE_SERVER_RECALL_H

#include "engine/recall.h"
#include "server/server_internal.h"

typedef struct recall_stats {
    int passages;            /* passages put before the question */
    int candidates;          /* passages the document was cut into */
    size_t bytes;            /* their bytes (at most the server's recall_bytes), separators not counted */
    uint64_t document_bytes; /* the document searched: the log's committed bytes */
    double ms;               /* from the question's arrival to its recalled text */
    double log_ms;           /* reading the log (engine thread), shared by the recalls that joined it */
    recall_passage *chosen;  /* the passages in the order put before the question (engine/recall.h);
                                malloc'd, the done callback's to free; NULL when none */
    char *text;              /* their text as put there (recall_result.text: chosen[i] is at
                                text[chosen[i].at]); malloc'd, the done callback's to free */
} recall_stats;

/* The question with its passages before it (malloc'd, the callee's, as are
 * st->chosen and st->text), or NULL and err. Returns 0 when done with the recall; 1 (only when st->passages > 0)
 * when the passages take too much of the model's window: it is called again
 * with fewer (at most half their bytes), until 0 or no passage is left. */
typedef int (*recall_done_fn)(server *s, void *user, char *asked, const recall_stats *st, const char *err);

/* The API_RECALL_* mode (api/api.h) of a question over a session of these
 * settings: the request's (requested), else the session's, else the server's `recall`. */
int recall_mode(const server *s, const api_session_settings *settings, int requested);

/* Whether an "auto" recall takes place over ss now: its pot has dropped some
 * of its document (a pot that still holds all of it answers as full
 * attention would), it keeps a log, and no upload or restore holds the log
 * (a recall reading it is joined). A question it skips is answered from the
 * pot alone. */
int recall_auto_applies(const session *ss);

/* Reads ss's logged document on the engine thread (uploads held off
 * meanwhile; recalls that arrive during the read share it) and chooses its
 * passages for question (copied), at most s->cfg.recall_bytes. 0 (done will
 * be called), or -1 + e: 409 recall_unavailable when the session keeps no log,
 * 409 session_busy while an upload, restore, snapshot read or re-read holds
 * the log, 503 when the server is shutting down. */
int recall_start(server *s, session *ss, const char *question, recall_done_fn done, void *user, api_error *e);

#endif
