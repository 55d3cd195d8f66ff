/* /metrics in the Prometheus text format: request counts by route and status
 * class, token and time counters, sessions and pot memory, engine queue. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

/* The slot of route's series, taken when first seen (routes are static
 * strings). The last slot is "other": unknown paths, and any route beyond the
 * table (none: it has room for more than router.c's routes), never counted
 * under another route's name. */
int metrics_route(metrics *m, const char *route) {
    enum { OTHER = METRIC_ROUTES - 1 };
    m->route_names[OTHER] = "other";
    for (int i = 0; i < OTHER && strcmp(route, "other"); i++) {
        if (!m->route_names[i]) {
            m->route_names[i] = route;
            return i;
        }
        if (!strcmp(m->route_names[i], route)) return i;
    }
    return OTHER;
}

typedef struct text_buf {
    char *s;
    size_t n, cap;
    int oom;
} text_buf;

__attribute__((format(printf, 2, 3))) static void put(text_buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)k + 256;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = 1;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
}

static void counter(text_buf *b, const char *name, const char *help, const char *type, double v) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *metrics_render(server *s) {
    metrics *m = &s->m;
    text_buf b = {.s = malloc(4096), .cap = 4096};
    if (!b.s) return NULL;
    b.s[0] = 0;
    put(&b, "# HELP potserve_requests_total HTTP requests by route and status class.\n"
            "# TYPE potserve_requests_total counter\n");
    for (int i = 0; i < METRIC_ROUTES; i++)
        for (int c = 1; c < 6; c++)
            if (m->route_names[i] && m->requests[i][c])
                put(&b, "potserve_requests_total{route=\"%s\",status=\"%dxx\"} %lld\n",
                    m->route_names[i], c, (long long)m->requests[i][c]);
    counter(&b, "potserve_tokens_ingested_total", "Document tokens read into pots from uploads.", "counter",
            (double)m->tokens_ingested);
    counter(&b, "potserve_tokens_embedded_total", "Tokens read for /v1/embeddings.", "counter",
            (double)m->tokens_embedded);
    counter(&b, "potserve_tokens_reread_total", "Document tokens read again into question-guided pots (re-reads).",
            "counter", (double)m->tokens_reread);
    counter(&b, "potserve_tokens_prompted_total", "Prompt tokens prefilled for generations.",
            "counter", (double)m->tokens_prompted);
    counter(&b, "potserve_tokens_generated_total", "Tokens generated.", "counter",
            (double)m->tokens_generated);
    counter(&b, "potserve_upload_bytes_total", "Document bytes acknowledged.", "counter",
            (double)m->bytes_uploaded);
    counter(&b, "potserve_ingest_tokens_per_second",
            "Document tokens per second of ingest time, over the server's life.", "gauge",
            m->ingest_ms > 0 ? m->tokens_ingested / (m->ingest_ms / 1e3) : 0);
    counter(&b, "potserve_decode_tokens_per_second",
            "Generated tokens per second of generation time, over the server's life.", "gauge",
            m->decode_ms > 0 ? m->tokens_generated / (m->decode_ms / 1e3) : 0);
    counter(&b, "potserve_compressions_total", "Pot compressions.", "counter", (double)m->compressions);
    counter(&b, "potserve_constrained_tokens_total", "Tokens generated under a grammar (structured outputs).",
            "counter", (double)m->constrained_tokens);
    counter(&b, "potserve_grammar_masked_steps_total",
            "Constrained steps whose first draw the grammar refused, so the token mask was built.", "counter",
            (double)m->masked_steps);
    counter(&b, "potserve_store_fenced_writes_total",
            "Chunk commits the shared store refused: this replica had lost the session's lease.", "counter",
            (double)m->fenced_writes);
    counter(&b, "potserve_store_takeovers_total", "Sessions taken over from the shared store.", "counter",
            (double)m->takeovers);
    counter(&b, "potserve_store_handoffs_total", "Sessions handed over to a replica that asked.", "counter",
            (double)m->handoffs);
    counter(&b, "potserve_compression_seconds_total", "Time spent selecting and compacting.",
            "counter", m->compress_ms / 1e3);
    counter(&b, "potserve_page_outs_total", "Idle sessions' pots paged out to their snapshots, for room.", "counter",
            (double)m->page_outs);
    counter(&b, "potserve_page_ins_total", "Paged-out pots read back for a request.", "counter", (double)m->page_ins);
    counter(&b, "potserve_page_in_seconds_total", "Time requests waited for page-ins.", "counter", m->page_in_ms / 1e3);
    counter(&b, "potserve_page_in_failures_total",
            "Page-ins that could not read the pot back (the store did not answer, a read failed); it stays paged out.",
            "counter", (double)m->page_in_failures);
    int n_sessions = 0, n_paged = 0;
    for (session *ss = s->sessions; ss; ss = ss->next) /* (not those still queued to be read at start) */
        n_sessions++, n_paged += ss->paged && ss->restoring != RESTORE_QUEUED;
    counter(&b, "potserve_sessions", "Open sessions.", "gauge", n_sessions);
    counter(&b, "potserve_sessions_paged_out", "Of them, those whose pot is paged out.", "gauge", n_paged);
    counter(&b, "potserve_pot_memory_bytes", "Bytes of all pots.", "gauge", (double)s->pot_memory);
    counter(&b, "potserve_pot_memory_limit_bytes", "pot_memory_limit.", "gauge",
            (double)s->cfg.pot_memory_limit);
    engine_sched_stats st = {0};
    if (s->sched) engine_sched_get_stats(s->sched, &st);
    counter(&b, "potserve_queue_depth", "Engine tasks waiting.", "gauge", st.queued_tasks);
    counter(&b, "potserve_active_generations", "Generations being decoded.", "gauge",
            st.active_generations);
    counter(&b, "potserve_decode_steps_total", "Batched decode steps.", "counter",
            (double)st.decode_steps);
    counter(&b, "potserve_open_requests", "Requests in progress.", "gauge", s->n_live);
    counter(&b, "potserve_loop_lag_max_seconds",
            "The longest the event loop was held from its timers since start (its once-a-second tick's lateness).",
            "gauge", s->loop_lag_max_ms / 1e3);
    counter(&b, "potserve_mhd_stuck_total",
            "Times libmicrohttpd asked to run at once for 20 ms without progress (a stuck connection): "
            "it then ran every 5 ms.", "counter", (double)s->mhd_stuck_episodes);
    counter(&b, "potserve_answers_running", "Answer sequences with their turn (at most max_answers).", "gauge",
            s->answers_running);
    counter(&b, "potserve_answers_waiting", "Requests waiting for a turn to answer.", "gauge",
            s->n_answers_waiting);
    counter(&b, "potserve_input_work_running",
            "Request bodies being parsed or tokenized on the thread pool (at most half of it).", "gauge",
            s->heavy_running);
    counter(&b, "potserve_input_work_waiting", "Request bodies waiting for their turn to be parsed or tokenized.",
            "gauge", s->n_heavy_waiting);
    int bg_running, bg_waiting;
    size_t bg_log_bytes;
    background_gauges(s, &bg_running, &bg_waiting, &bg_log_bytes);
    counter(&b, "potserve_background_running", "Background responses generating here.", "gauge", bg_running);
    counter(&b, "potserve_background_streams_waiting",
            "Streams of background responses whose events are not kept here (following the store's copy, or "
            "waiting for the answer).",
            "gauge",
            bg_waiting);
    counter(&b, "potserve_background_event_log_bytes",
            "Bytes of ended streamed background responses' events kept here for later streams.", "gauge",
            (double)bg_log_bytes);
    if (store_is_shared(s->st))
        counter(&b, "potserve_store_up", "1 when the shared store answered the last lease renewal (or PING).",
                "gauge", !s->store_silent);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
