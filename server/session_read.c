/* Reading a session back: GET /v1/sessions/{id}/retention (which of the
 * document's tokens its pot still holds, per layer and KV head, in bins) and
 * GET /v1/sessions/{id}/text (the text of a token range, read back from its
 * log, with how many heads hold each token). Both look at the pot on the
 * engine thread (start_doc_read) and answer from the loop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/server_internal.h"

/* ---- retention ------------------------------------------------------------------------------- */

typedef struct retention_job {
    request *r;
    session *ss;
    engine_doc *doc;
    int bins;
    json_t *body;
} retention_job;

static void retention_back(server *s, void *arg) {
    (void)s;
    retention_job *j = arg;
    respond_json(j->r, 200, j->body);
    request_unref(j->r);
    session_unref(j->ss);
    free(j);
}

/* Engine thread: calls fn for every (layer, KV head) with the document token
 * indices of the entries d's pot holds (the pinned prefix's are negative).
 * -1 when out of memory. */
static int for_each_kept(engine_doc *d, const engine_info *in, int32_t budget,
                         void (*fn)(void *user, int32_t layer, const int64_t *idx, int32_t n),
                         void *user) {
    int64_t *idx = malloc(sizeof *idx * (size_t)(budget > 0 ? budget : 1));
    if (!idx) return -1;
    for (int32_t l = 0; l < in->n_layer; l++)
        for (int32_t h = 0; h < in->n_head_kv; h++) fn(user, l, idx, engine_doc_kept(d, l, h, idx, budget));
    free(idx);
    return 0;
}

typedef struct retention_hist {
    int64_t *hist; /* [layer][bin] */
    int bins;
    int64_t n_doc;
    double kept;
} retention_hist;

static void retention_add(void *user, int32_t layer, const int64_t *idx, int32_t n) {
    retention_hist *rh = user;
    for (int32_t i = 0; i < n; i++) {
        if (idx[i] < 0) continue; /* pinned prefix */
        int b = (int)(idx[i] * rh->bins / rh->n_doc);
        rh->hist[(size_t)layer * (size_t)rh->bins + (size_t)(b < rh->bins ? b : rh->bins - 1)]++;
        rh->kept++;
    }
}

static void retention_task(engine *e, void *arg) {
    retention_job *j = arg;
    engine_doc *d = j->doc;
    engine_info in;
    engine_get_info(e, &in);
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    retention_hist rh = {calloc((size_t)in.n_layer * (size_t)j->bins, sizeof *rh.hist), j->bins,
                         st.tokens_read > 0 ? st.tokens_read : 1, 0};
    int ok = rh.hist && !for_each_kept(d, &in, st.budget_tokens, retention_add, &rh);
    json_t *layers = json_array();
    for (int32_t l = 0; ok && l < in.n_layer; l++) {
        json_t *arr = json_array();
        for (int b = 0; b < j->bins; b++)
            json_array_append_new(arr, json_real((double)rh.hist[(size_t)l * (size_t)j->bins + (size_t)b] / in.n_head_kv));
        json_t *layer = json_pack("{s:i, s:s, s:o}", "layer", l, "attention",
                                  engine_layer_window(e, l) ? "sliding" : "global", "kept_per_bin", arr);
        if (engine_layer_window(e, l)) json_object_set_new(layer, "window", json_integer(engine_layer_window(e, l)));
        json_array_append_new(layers, layer);
    }
    free(rh.hist);
    double coverage = st.tokens_read ? rh.kept / ((double)in.n_layer * in.n_head_kv) / (double)st.tokens_read : 0;
    j->body = json_pack("{s:s, s:s, s:I, s:i, s:I, s:f, s:o}", "object", "session.retention", "id",
                        j->ss->id, "tokens_ingested", (json_int_t)st.tokens_read, "bins", j->bins,
                        "bin_tokens", (json_int_t)((rh.n_doc + j->bins - 1) / j->bins), "coverage",
                        coverage, "layers", layers);
    srv_post(j->ss->srv, retention_back, j);
}

/* Runs fn(job) on the engine thread after ss's earlier work, for request r
 * (suspended meanwhile; r and ss are held until the job lets them go). 0, or
 * -1 once an error has been answered (409 while the pot is being restored;
 * the job is then not taken). */
static int start_doc_read(request *r, session *ss, engine_task_fn fn, void *job) {
    api_error e;
    if (ss->status == SESSION_FAILED && !ss->doc) {
        api_fail(&e, 409, "session_failed", NULL, "the session failed: %s", ss->fail_msg);
        respond_error(r, &e);
        return -1;
    }
    if (!ss->doc || ss->rebuilding) {
        api_fail(&e, 409, "session_busy", NULL, "the session is being restored; retry");
        respond_error(r, &e);
        return -1;
    }
    request_ref(r);
    session_ref(ss);
    request_suspend(r);
    if (srv_task(r->srv, ss->doc, fn, job)) {
        request_unref(r);
        session_unref(ss);
        api_fail(&e, 503, "unavailable", NULL, "the engine is stopping");
        respond_error(r, &e);
        return -1;
    }
    return 0;
}

void session_retention(request *r, session *ss) {
    api_error e;
    const char *b = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "bins");
    int64_t bins = 32;
    char err[128];
    if (b && config_parse_int("bins", b, 1, 4096, &bins, err, sizeof err)) {
        api_fail(&e, 400, "invalid_value", "bins", "%s", err);
        return respond_error(r, &e);
    }
    retention_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    j->r = r;
    j->ss = ss;
    j->doc = ss->doc;
    j->bins = (int)bins;
    if (start_doc_read(r, ss, retention_task, j)) free(j);
}

/* ---- the text of a token range ------------------------------------------------------------------ */

enum { TEXT_MAX_TOKENS = 8192 };

/* GET /v1/sessions/{id}/text: on the engine thread, how many (layer, KV
 * head) pairs hold each token of the range; then, on the thread pool, the
 * range's text, read back from the log through the document's tokenizer
 * (from the start: the cost grows with the position). */
typedef struct text_job {
    uv_work_t work;
    request *r;
    session *ss;
    int64_t start, end;     /* token range [start, end), end clamped to what the pot has read */
    int64_t tokens_ingested;
    int32_t heads;          /* layers x KV heads */
    int32_t *kept;          /* per token of the range */
    store_log *reader;
    engine_doc_text_reader *tr;
    int64_t next;           /* document index of the next token the reader gives */
    char *text;             /* the range's bytes */
    size_t text_len, text_cap;
    size_t *tok_end;        /* end of each token's bytes in text */
    int rc;
    char err[256];
} text_job;

static void text_job_free(text_job *j) {
    engine_doc_text_reader_free(j->tr);
    store_log_close(j->reader);
    free(j->kept);
    free(j->text);
    free(j->tok_end);
    free(j);
}

static void text_fail(text_job *j, int status, const char *code, const char *msg) {
    api_error e;
    api_fail(&e, status, code, NULL, "%s", msg);
    if (status == 503) respond_retry(j->r, &e, 1);
    else respond_error(j->r, &e);
    request_unref(j->r);
    session_unref(j->ss);
    text_job_free(j);
}

/* Takes the reader's ids: the text of those inside the range, and of up to
 * TEXT_TAIL after it (the rest of a character cut at its end). 1 once past. */
enum { TEXT_TAIL = 3 };
static int text_take_ids(text_job *j, const int32_t *ids, size_t n) {
    const engine *e = j->ss->srv->eng;
    for (size_t i = 0; i < n && j->next < j->end + TEXT_TAIL; i++, j->next++) {
        if (j->next < j->start) continue;
        for (;;) {
            int k = engine_token_text(e, ids[i], j->text + j->text_len, j->text_cap - j->text_len);
            if (k < 0) k = 0;
            if ((size_t)k <= j->text_cap - j->text_len) {
                j->text_len += (size_t)k;
                break;
            }
            size_t cap = j->text_cap * 2 + (size_t)k;
            char *t = realloc(j->text, cap);
            if (!t) return -1;
            j->text = t;
            j->text_cap = cap;
        }
        if (j->next < j->end) j->tok_end[j->next - j->start] = j->text_len;
    }
    return j->next >= j->end + TEXT_TAIL;
}

static int text_feed(text_job *j, const char *data, size_t n, int final) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = engine_doc_text_reader_feed(j->tr, data, n, final, &ids, &n_ids);
    if (!rc) rc = text_take_ids(j, ids, n_ids);
    free(ids);
    return rc;
}

static int text_on_data(void *user, uint64_t seq, const char *data, size_t n) {
    (void)seq;
    return text_feed(user, data, n, 0);
}

static int text_on_commit(void *user, const chunk_log_entry *e) {
    return e->final ? text_feed(user, "", 0, 1) : 0;
}

static void text_work(uv_work_t *w) {
    text_job *j = w->data;
    j->text_cap = 4096;
    j->text = malloc(j->text_cap);
    j->tok_end = calloc((size_t)(j->end - j->start) + 1, sizeof *j->tok_end);
    j->next = 0;
    if (!j->text || !j->tok_end) {
        j->rc = -1;
        snprintf(j->err, sizeof j->err, "out of memory");
        return;
    }
    if (j->start >= j->end) return;
    j->rc = store_log_replay(j->reader, 0, text_on_data, text_on_commit, j, j->err, sizeof j->err);
    if (j->rc && j->next >= j->end) j->rc = 0; /* stopped on purpose, past the range */
}

/* Length of the UTF-8 character's continuation bytes at p[0..n). */
static size_t continuation(const char *p, size_t n) {
    size_t k = 0;
    while (k < n && ((unsigned char)p[k] & 0xC0) == 0x80) k++;
    return k;
}

/* n less a character cut short at the end of p[0..n). */
static size_t utf8_whole(const char *p, size_t n) {
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        unsigned c = (unsigned char)p[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        return len > back ? n - back : n;
    }
    return n;
}

/* Spans of tokens held by the same number of (layer, head) pairs, with their
 * token counts; a character cut between tokens goes whole to the span (and
 * the range) where it starts, so a span may have no text of its own and
 * consecutive ranges join into the document. */
static json_t *text_spans(text_job *j) {
    json_t *spans = json_array();
    int64_t got = j->next > j->start ? (j->next < j->end ? j->next : j->end) - j->start : 0;
    size_t b0 = continuation(j->text, j->text_len); /* a character begun before the range */
    for (int64_t t = 0; t < got;) {
        int64_t u = t + 1;
        while (u < got && j->kept[u] == j->kept[t]) u++;
        size_t b1 = j->tok_end[u - 1];
        b1 += continuation(j->text + b1, j->text_len - b1);
        if (u == got) b1 = utf8_whole(j->text, b1); /* the tail not read yet */
        if (b1 < b0) b1 = b0;
        json_t *str = api_text_json(j->text + b0, b1 - b0);
        json_array_append_new(spans, json_pack("{s:o, s:i, s:I}", "text", str ? str : json_string(""),
                                               "kept", j->kept[t], "tokens", (json_int_t)(u - t)));
        b0 = b1;
        t = u;
    }
    return spans;
}

static void text_done(uv_work_t *w, int status) {
    (void)status;
    text_job *j = w->data;
    if (j->rc && store_log_unreachable(j->reader)) return text_fail(j, 503, "store_unavailable", j->err);
    if (j->rc) return text_fail(j, 500, "storage_error", j->err);
    int64_t got = j->next > j->start ? (j->next < j->end ? j->next : j->end) - j->start : 0;
    respond_json(j->r, 200,
                 json_pack("{s:s, s:s, s:I, s:I, s:I, s:i, s:o}", "object", "session.text", "id",
                           j->ss->id, "start", (json_int_t)j->start, "end",
                           (json_int_t)(j->start + got), "tokens_ingested",
                           (json_int_t)j->tokens_ingested, "heads", j->heads, "spans", text_spans(j)));
    request_unref(j->r);
    session_unref(j->ss);
    text_job_free(j);
}

static void text_kept_back(server *s, void *arg) {
    text_job *j = arg;
    char err[256];
    j->reader = j->ss->log ? store_log_reader(j->ss->log, err, sizeof err) : NULL;
    j->tr = engine_doc_text_reader_new(s->eng);
    if (!j->reader || !j->tr || !j->kept)
        return text_fail(j, 500, NULL, j->reader ? "out of memory" : err);
    j->work.data = j;
    if (uv_queue_work(s->loop, &j->work, text_work, text_done)) text_fail(j, 500, NULL, "cannot queue work");
}

static void text_count(void *user, int32_t layer, const int64_t *idx, int32_t n) {
    (void)layer;
    text_job *j = user;
    for (int32_t i = 0; i < n; i++)
        if (idx[i] >= j->start && idx[i] < j->end) j->kept[idx[i] - j->start]++;
}

static void text_kept_task(engine *e, void *arg) {
    text_job *j = arg;
    engine_info in;
    engine_get_info(e, &in);
    engine_doc_stats st;
    engine_doc_get_stats(j->ss->doc, &st);
    j->tokens_ingested = st.tokens_read;
    if (j->end > st.tokens_read) j->end = st.tokens_read;
    if (j->start > j->end) j->start = j->end;
    j->heads = in.n_layer * in.n_head_kv;
    j->kept = calloc((size_t)(j->end - j->start) + 1, sizeof *j->kept);
    if (j->kept && for_each_kept(j->ss->doc, &in, st.budget_tokens, text_count, j)) {
        free(j->kept);
        j->kept = NULL;
    }
    srv_post(j->ss->srv, text_kept_back, j);
}

void session_text(request *r, session *ss) {
    api_error e;
    char err[128];
    const char *a = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "start");
    const char *b = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "end");
    int64_t start = 0, end = 0;
    if (!a) {
        api_fail(&e, 400, "missing_value", "start", "start (the first token of the range) is required");
        return respond_error(r, &e);
    }
    if (config_parse_int("start", a, 0, INT64_MAX / 2, &start, err, sizeof err) ||
        (b && config_parse_int("end", b, 0, INT64_MAX / 2, &end, err, sizeof err))) {
        api_fail(&e, 400, "invalid_value", b && strstr(err, "end") == err ? "end" : "start", "%s", err);
        return respond_error(r, &e);
    }
    if (!b) end = start + 1024;
    if (end < start || end - start > TEXT_MAX_TOKENS) {
        api_fail(&e, 400, "invalid_value", "end", "end must be in [start, start + %d]", TEXT_MAX_TOKENS);
        return respond_error(r, &e);
    }
    text_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    j->r = r;
    j->ss = ss;
    j->start = start;
    j->end = end;
    if (start_doc_read(r, ss, text_kept_task, j)) free(j);
}
