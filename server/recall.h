/* A question answered with the passages of its session's document that share
 * its words (server/recall.c; the search is engine/recall.h); private to
 * server/. Loop thread. */
#ifndef POTSERVE_SERVER_RECALL_H
#define POTSERVE_SERVER_RECALL_H

#include "server/server_internal.h"

typedef struct recall_stats {
    int passages;            /* passages put before the question */
    int candidates;          /* passages the document was cut into */
    size_t bytes;            /* their bytes (at most the server's recall_bytes), separators not counted */
    uint64_t document_bytes; /* the document searched: the log's committed bytes */
    double ms;               /* from the question's arrival to its recalled text */
    double log_ms;           /* reading the log (engine thread) */
} recall_stats;

/* Once: the question with its passages before it (malloc'd, the callee's),
 * or NULL and err. */
typedef void (*recall_done_fn)(server *s, void *user, char *asked, const recall_stats *st, const char *err);

/* Reads ss's logged document on the engine thread (uploads held off
 * meanwhile) and chooses its passages for question (copied), at most
 * s->cfg.recall_bytes. 0 (done will be called), or -1 + e: 409
 * recall_unavailable when the session keeps no log, 409 session_busy while an
 * upload, restore, snapshot read or re-read holds the log, 503 when the server
 * is shutting down. */
int recall_start(server *s, session *ss, const char *question, recall_done_fn done, void *user, api_error *e);

#endif
