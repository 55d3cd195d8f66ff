/* Re-reading a session's document from its chunk log through a new pot
 * (server/reread.c); private to server/. Loop thread. */
#ifndef POTSERVE_REREAD_H
#define POTSERVE_REREAD_H

#include "server/server_internal.h"

typedef struct reread reread;

typedef struct reread_stats {
    uint64_t bytes;  /* document bytes re-read */
    int64_t tokens;  /* document tokens re-read */
    double ms;       /* from the start to the pot being ready */
} reread_stats;

/* After each piece the engine has read: bytes done of total. */
typedef void (*reread_progress_fn)(server *s, void *user, uint64_t done, uint64_t total);
/* Once: the new pot (the caller's; close it on the engine thread with
 * reread_close_task), or NULL and err. */
typedef void (*reread_done_fn)(server *s, void *user, engine_doc *doc, const reread_stats *st,
                               const char *err);

/* Reads ss's whole logged document through a new pot with settings (copied;
 * its strings must stay alive until done is called); cancel (may be NULL)
 * set stops it between pieces. 0 (done will be called), or -1 + e: 409 when
 * the session has no log or an upload or restore holds it. */
int reread_start(server *s, session *ss, const engine_pot_settings *settings, const atomic_int *cancel,
                 reread_progress_fn progress, reread_done_fn done, void *user, api_error *e);

/* Engine task closing a document (srv_task(s, doc, reread_close_task, doc)). */
void reread_close_task(engine *e, void *doc);

#endif
