/* Recall for a question over a session (server/recall.h): the document comes
 * back from the session's chunk log on the engine thread, as a re-read's does
 * (session_log_fetch, server/reread.c), and engine/recall.c picks the
 * paragraphs that share the question's words. Milliseconds for documents of
 * megabytes; the answer then prefills about recall_bytes more of prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/recall.h"
#include "server/recall.h"
#include "server/reread.h"

typedef struct recall_job {
    session *ss;
    char *question;
    recall_done_fn done;
    void *user;
    double t0_ms;
    session_log_text log;
} recall_job;

static void job_free(recall_job *j) {
    session_unref(j->ss);
    free(j->log.text);
    free(j->question);
    free(j);
}

static void log_read(server *s, void *arg) {
    recall_job *j = arg;
    recall_stats st = {.document_bytes = j->log.len, .log_ms = j->log.ms};
    recall_result r = {0};
    char *asked = NULL;
    const char *err = j->log.rc ? j->log.err : NULL;
    if (!err && recall_passages(j->log.text ? j->log.text : "", j->log.len, j->question,
                                (size_t)s->cfg.recall_bytes, &r))
        err = "out of memory choosing passages";
    if (!err && !(asked = recall_question(&r, j->question))) err = "out of memory";
    st.passages = r.passages;
    st.candidates = r.candidates;
    /* the passages' own bytes, which recall_bytes bounds: the text joins them with "\n\n" */
    st.bytes = r.passages ? r.len - 2 * (size_t)(r.passages - 1) : 0;
    recall_result_free(&r);
    st.ms = monotonic_ms() - j->t0_ms;
    j->done(s, j->user, asked, &st, err);
    job_free(j);
}

int recall_start(server *s, session *ss, const char *question, recall_done_fn done, void *user, api_error *e) {
    if (!ss->log) return api_fail(e, 409, "recall_unavailable", "recall", "the session keeps no log to recall from");
    if (ss->busy || ss->disk_busy || ss->rebuilding)
        return api_fail(e, 409, "session_busy", "session",
                        "the session is receiving or restoring its document; retry to recall from it");
    recall_job *j = calloc(1, sizeof *j);
    char *q = strdup(question);
    if (!j || !q) {
        free(j);
        free(q);
        return api_fail(e, 500, NULL, NULL, "out of memory");
    }
    *j = (recall_job){.ss = ss, .question = q, .done = done, .user = user, .t0_ms = monotonic_ms()};
    session_ref(ss);
    if (session_log_fetch(s, ss, &j->log, log_read, j)) {
        job_free(j);
        return api_fail(e, 503, "unavailable", NULL, "the server is shutting down");
    }
    return 0;
}
