/* Recall for a question over a session (server/recall.h): the document comes
 * back from the session's chunk log on the engine thread, as a re-read's does
 * (session_log_fetch, server/reread.c), and engine/recall.c picks the
 * paragraphs that share the question's words. Questions that arrive while the
 * log is being read wait for the same read. Milliseconds for documents of
 * megabytes; the answer then prefills about recall_bytes more of prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/recall.h"
#include "server/recall.h"
#include "server/reread.h"

typedef struct recall_job {
    struct recall_job *next;
    char *question;
    recall_done_fn done;
    void *user;
    double t0_ms;
} recall_job;

/* One read of a session's log and the recalls waiting for it (ss->recall_read while it runs). */
typedef struct recall_read {
    session *ss;
    session_log_text log;
    recall_job *jobs, **last;
} recall_read;

int recall_mode(const server *s, const api_session_settings *settings, int requested) {
    if (requested != API_RECALL_UNSET) return requested;
    if (settings->recall != API_RECALL_UNSET) return settings->recall;
    int configured = api_recall_from_name(s->cfg.recall);
    return configured == API_RECALL_UNSET ? API_RECALL_OFF : configured;
}

int recall_auto_applies(const session *ss) {
    const engine_doc_stats *st = &ss->stats;
    int dropped = st->tokens_read > (int64_t)st->tokens_in_pot - st->pinned_tokens;
    int log_free = ss->recall_read || !(ss->busy || ss->disk_busy);
    return dropped && ss->log && !ss->rebuilding && log_free;
}

/* The question with its passages, or NULL and *err. */
static char *recalled(const session_log_text *log, const char *question, size_t budget, recall_order order,
                      recall_stats *st, const char **err) {
    recall_result r = {0};
    char *asked = NULL;
    if (recall_passages(log->text ? log->text : "", log->len, question, budget, order, &r))
        *err = "out of memory choosing passages";
    else if (!(asked = recall_question(&r, question)))
        *err = "out of memory";
    st->passages = r.passages;
    st->candidates = r.candidates;
    /* the passages' own bytes, which recall_bytes bounds: the text joins them with "\n\n" */
    st->bytes = r.passages ? r.len - 2 * (size_t)(r.passages - 1) : 0;
    st->chosen = r.chosen;
    st->text = r.text;
    r.chosen = NULL;
    r.text = NULL;
    recall_result_free(&r);
    return asked;
}

static void log_read(server *s, void *arg) {
    recall_read *rd = arg;
    if (rd->ss->recall_read == rd) rd->ss->recall_read = NULL; /* later recalls read the log again */
    for (recall_job *j = rd->jobs, *next; j; j = next) {
        next = j->next;
        size_t budget = (size_t)s->cfg.recall_bytes;
        for (;;) { /* fewer passages while they do not fit the window (recall_done_fn) */
            recall_stats st = {.document_bytes = rd->log.len, .log_ms = rd->log.ms};
            const char *err = rd->log.rc ? rd->log.err : NULL;
            char *asked = err ? NULL
                              : recalled(&rd->log, j->question, budget,
                                         (recall_order)recall_order_named(s->cfg.recall_order), &st, &err);
            st.ms = monotonic_ms() - j->t0_ms;
            if (!j->done(s, j->user, asked, &st, err) || !asked || !st.passages) break;
            budget = st.bytes / 2;
        }
        free(j->question);
        free(j);
    }
    session_unref(rd->ss);
    free(rd->log.text);
    free(rd);
}

int recall_start(server *s, session *ss, const char *question, recall_done_fn done, void *user, api_error *e) {
    if (!ss->log) return api_fail(e, 409, "recall_unavailable", "recall", "the session keeps no log to recall from");
    recall_read *rd = ss->recall_read;
    const char *why = rd ? NULL : session_log_busy(ss);
    if (why) return api_fail(e, 409, "session_busy", "session", "%s; retry to recall from it", why);
    recall_job *j = calloc(1, sizeof *j);
    char *q = strdup(question);
    if (!rd) rd = calloc(1, sizeof *rd);
    if (!j || !q || !rd) {
        free(j);
        free(q);
        if (rd != ss->recall_read) free(rd);
        return api_fail(e, 500, NULL, NULL, "out of memory");
    }
    *j = (recall_job){.question = q, .done = done, .user = user, .t0_ms = monotonic_ms()};
    if (rd == ss->recall_read) { /* the read under way takes this question too */
        *rd->last = j;
        rd->last = &j->next;
        return 0;
    }
    *rd = (recall_read){.ss = ss, .jobs = j, .last = &j->next};
    session_ref(ss);
    if (session_log_fetch(s, ss, &rd->log, log_read, rd)) {
        session_unref(ss);
        free(j->question);
        free(j);
        free(rd);
        return api_fail(e, 503, "unavailable", NULL, "the server is shutting down");
    }
    ss->recall_read = rd;
    return 0;
}
