/* The access handler: one request's life from its headers to the access-log
 * line. Routing, authentication, rate limits, bounded JSON bodies, queued
 * and streamed (SSE) responses with suspend/resume, and the small endpoints
 * (health, models, metrics, tokenize). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>

#include "common/common.h"
#include "cache/cache.h" /* policy and schedule names */
#include "server/server_internal.h"

/* ---- request lifetime --------------------------------------------------------------- */

static void body_free_work(uv_work_t *w) { json_decref(w->data); }

static void body_freed(uv_work_t *w, int status) {
    (void)status;
    free(w);
}

/* A large body is let go on libuv's pool: a million values (a list of token
 * ids) take the loop tens of milliseconds to free. */
static void body_free(request *r) {
    uv_work_t *w = r->json && r->body_len > OFF_LOOP_BYTES && !r->srv->stopping ? malloc(sizeof *w) : NULL;
    if (w) {
        w->data = r->json;
        if (!uv_queue_work(r->srv->loop, w, body_free_work, body_freed)) return;
        free(w);
    }
    json_decref(r->json);
}

void request_ref(request *r) { r->refs++; }

void request_unref(request *r) {
    if (--r->refs > 0) return;
    server *s = r->srv;
    for (request **p = &s->live; *p; p = &(*p)->next_live)
        if (*p == r) {
            *p = r->next_live;
            s->n_live--;
            break;
        }
    if (r->pending) MHD_destroy_response(r->pending);
    if (r->follows) background_unfollow(r);
    if (r->up) upload_free(r->up);
    if (r->form) files_form_free(r->form);
    if (r->gen) generation_free(r->gen);
    background_free(r->bg);
    free(r->url);
    free(r->body);
    body_free(r);
    free(r->out);
    free(r);
}

json_t *request_json(request *r, api_error *e) {
    if (r->json) return json_incref(r->json);
    *e = r->json_err;
    return NULL;
}

void request_wake(request *r) {
    if (r->conn && r->suspended) {
        r->suspended = 0;
        r->suspended_ms += monotonic_ms() - r->suspended_at_ms;
        MHD_resume_connection(r->conn);
        srv_kick_soon(r->srv); /* MHD runs only when the loop calls it */
    }
}

static void queue(request *r, int status, struct MHD_Response *resp) {
    r->status = status;
    /* framing that cannot be trusted, or a drain: the connection ends with this answer */
    if (r->close_conn || r->srv->draining) MHD_add_response_header(resp, "Connection", "close");
    cors_add_headers(r, resp); /* CORS (cors.c): every response, errors and SSE included */
    if (status == 421) { /* another replica holds the session, or will: OpenAI's clients retry only on this header */
        if (!MHD_get_response_header(resp, "Retry-After")) MHD_add_response_header(resp, "Retry-After", "1");
        MHD_add_response_header(resp, "x-should-retry", "true");
    } else if (status == 409 && !MHD_get_response_header(resp, "Retry-After")) {
        /* a conflict retrying cannot mend (a failed session, a seq conflict): OpenAI's clients
           retry every 409 unless told not to (session_busy says Retry-After: it passes) */
        MHD_add_response_header(resp, "x-should-retry", "false");
    }
    if (r->conn && MHD_queue_response(r->conn, (unsigned)status, resp) != MHD_YES)
        r->status = 500;
    MHD_destroy_response(resp);
}

/* A response built while the connection is suspended, or at the first call
 * for a request without a body, waits in r->pending until the access handler
 * runs again. */
void respond_raw(request *r, int status, struct MHD_Response *resp) {
    if (r->bg) { /* (no answer of a background request is other than JSON) */
        MHD_destroy_response(resp);
        return background_answered(r, status, NULL);
    }
    if (r->suspended || r->first_call) {
        if (r->pending) MHD_destroy_response(r->pending);
        r->pending = resp;
        r->pending_status = status;
        request_wake(r);
        return;
    }
    queue(r, status, resp);
}

/* A suspended connection is not polled by MHD, so a client that leaves while
 * its non-streamed answer is made goes unnoticed until the answer is written.
 * Peeking at the socket notices the close (EOF). */
int request_client_gone(request *r) {
    if (!r->conn) return !r->bg; /* (a background response has no client to leave) */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void client_closed_error(api_error *e, const char *what) {
    api_fail(e, 499, "client_closed", NULL,
             "the client closed its side of the connection (a half-close counts as leaving): %s was stopped", what);
}

char *json_text(json_t *body, size_t *n) { return json_text_flags(body, JSON_COMPACT, n); }

char *json_text_flags(json_t *body, size_t flags, size_t *n) {
    char *text = body ? json_dumps(body, flags) : NULL;
    json_decref(body);
    *n = text ? strlen(text) : 0;
    char *t = text ? realloc(text, *n + 2) : NULL;
    if (!t) {
        free(text);
        return NULL;
    }
    t[(*n)++] = '\n';
    t[*n] = 0;
    return t;
}

/* A JSON response of text (json_text's; NULL: out of memory); takes text. */
static struct MHD_Response *text_response(request *r, char *text, size_t n) {
    if (!text) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}\n";
        struct MHD_Response *resp = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        if (resp) MHD_add_response_header(resp, "Content-Type", "application/json");
        return resp;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    r->bytes_out += n;
    return resp;
}

static struct MHD_Response *json_response(request *r, json_t *body) {
    size_t n;
    char *text = json_text(body, &n);
    return text_response(r, text, n);
}

void respond_json_text(request *r, int status, char *text, size_t n) { respond_raw(r, status, text_response(r, text, n)); }

void respond_json(request *r, int status, json_t *body) {
    if (r->bg) return background_answered(r, status, body);
    respond_raw(r, status, json_response(r, body));
}

void respond_error(request *r, const api_error *e) {
    /* a busy session (an upload, a restore, a re-read holding its log) is a wait: say how long */
    if (e->status == 409 && e->code && !strcmp(e->code, "session_busy")) return respond_retry(r, e, 1);
    respond_json(r, e->status, api_error_json(e));
}

void respond_retry(request *r, const api_error *e, int seconds) {
    if (r->bg) return background_answered(r, e->status, api_error_json(e));
    struct MHD_Response *resp = json_response(r, api_error_json(e));
    char v[24];
    snprintf(v, sizeof v, "%d", seconds < 1 ? 1 : seconds);
    MHD_add_response_header(resp, "Retry-After", v);
    respond_raw(r, e->status, resp);
}

typedef struct off_loop {
    uv_work_t w;
    request *r;
    void (*fn)(void *);
    void (*done)(request *, void *);
    void *arg;
    int heavy;
    struct off_loop *next_waiting; /* (heavy ones waiting their turn) */
} off_loop;

static void off_loop_work(uv_work_t *w) {
    off_loop *o = w->data;
    o->fn(o->arg);
}

static void off_loop_start(server *s, off_loop *o);

static void off_loop_done(uv_work_t *w, int status) {
    (void)status;
    off_loop *o = w->data;
    server *s = o->r->srv;
    if (o->heavy) {
        s->heavy_running--;
        off_loop *next = s->heavy_waiting; /* the next in line */
        if (next && !(s->heavy_waiting = next->next_waiting)) s->heavy_waiting_last = NULL;
        if (next) s->n_heavy_waiting--, off_loop_start(s, next);
    }
    o->done(o->r, o->arg);
    request_unref(o->r);
    free(o);
}

static void off_loop_start(server *s, off_loop *o) {
    s->heavy_running += o->heavy;
    if (!uv_queue_work(s->loop, &o->w, off_loop_work, off_loop_done)) return;
    o->fn(o->arg); /* the pool refused (the loop is closing): here */
    off_loop_done(&o->w, 0);
}

int srv_heavy_max(void) {
    const char *v = getenv("UV_THREADPOOL_SIZE"); /* (as libuv reads it: 4 when unset) */
    long pool = v && atol(v) > 0 ? atol(v) : 4;
    return pool / 2 > 1 ? (int)(pool / 2) : 1;
}

void request_work(request *r, enum work_where where, void (*fn)(void *arg), void (*done)(request *r, void *arg),
                  void *arg) {
    server *s = r->srv;
    off_loop *o = where != WORK_HERE ? malloc(sizeof *o) : NULL;
    if (!o) { /* (out of memory: here) */
        fn(arg);
        return done(r, arg);
    }
    *o = (off_loop){.r = r, .fn = fn, .done = done, .arg = arg, .heavy = where == WORK_HEAVY};
    o->w.data = o;
    request_ref(r);
    request_suspend(r);
    if (!o->heavy || s->heavy_running < s->heavy_max) return off_loop_start(s, o);
    if (s->heavy_waiting_last) s->heavy_waiting_last->next_waiting = o;
    else s->heavy_waiting = o;
    s->heavy_waiting_last = o;
    s->n_heavy_waiting++;
}

void request_work_input(request *r, void (*fn)(void *arg), void (*done)(request *r, void *arg), void *arg) {
    request_work(r, r->body_len > OFF_LOOP_BYTES ? WORK_HEAVY : WORK_HERE, fn, done, arg);
}

void request_suspend(request *r) {
    if (r->conn && !r->suspended && !r->srv->stopping) {
        r->suspended = 1;
        r->suspended_at_ms = monotonic_ms();
        MHD_suspend_connection(r->conn);
    }
}

/* ---- streamed responses ------------------------------------------------------------ */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    request *r = cls;
    r->srv->mhd_calls++;
    if (r->follows) { /* a background response's events; between them its own keep-alive pings (below) */
        ssize_t got = background_follow_read(r, buf, max);
        if (got < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        r->bytes_out += (size_t)got;
        if (got) return got;
    }
    size_t avail = r->out_len - r->out_pos;
    if (!avail) {
        if (r->out_done) return MHD_CONTENT_READER_END_OF_STREAM;
        request_suspend(r);
        return 0;
    }
    size_t n = avail < max ? avail : max;
    memcpy(buf, r->out + r->out_pos, n);
    r->out_pos += n;
    r->bytes_out += n;
    if (r->out_pos == r->out_len) r->out_pos = r->out_len = 0;
    return (ssize_t)n;
}

static void stream_free(void *cls) { request_unref(cls); }

int stream_start(request *r) {
    if (r->bg) return background_log_start(r);
    request_ref(r); /* the response's reader holds the request */
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, stream_free);
    if (!resp) {
        request_unref(r);
        return -1;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    r->last_write_ms = monotonic_ms();
    respond_raw(r, 200, resp);
    return 0;
}

void stream_write(request *r, const char *data, size_t n) {
    if (r->bg) return background_log_write(r, data, n);
    if (r->out_len + n > r->out_cap) {
        size_t cap = (r->out_len + n) * 2 + 1024;
        char *t = realloc(r->out, cap);
        if (!t) return; /* dropped: the client sees a truncated stream */
        r->out = t;
        r->out_cap = cap;
    }
    memcpy(r->out + r->out_len, data, n);
    r->out_len += n;
    r->last_write_ms = monotonic_ms();
    request_wake(r);
}

void stream_end(request *r) {
    if (r->bg) return background_log_end(r);
    r->out_done = 1;
    request_wake(r);
}

/* ---- access log ---------------------------------------------------------------------- */

void srv_access_log(request *r) {
    server *s = r->srv;
    int route = metrics_route(&s->m, r->route ? r->route : "other");
    if (r->status >= 100 && r->status < 600) s->m.requests[route][r->status / 100]++;
    if (!s->cfg.access_log) return;
    json_t *line = json_pack("{s:s, s:s, s:s, s:i, s:I, s:f, s:s?, s:I, s:s?}", "method", r->method,
                             "route", r->route ? r->route : "other", "path", r->url ? r->url : "",
                             "status", r->status, "bytes", (json_int_t)r->bytes_out, "ms",
                             monotonic_ms() - r->t0, "session", *r->session_id ? r->session_id : NULL,
                             "tokens", (json_int_t)r->tokens, "key",
                             r->key && *r->key->name ? r->key->name : NULL);
    char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
    if (text) fprintf(stderr, "%s\n", text);
    free(text);
    json_decref(line);
}

/* ---- small endpoints ----------------------------------------------------------------- */

static void route_health(request *r) {
    server *s = r->srv;
    const char *st = s->loading ? "loading" : s->draining ? "draining" : "ok";
    json_t *body = json_pack("{s:s}", "status", st);
    /* a shared store that answered no renewal (or PING) last time: said, not a 503 (docs/cluster.md) */
    if (store_is_shared(s->st)) json_object_set_new(body, "store", json_string(s->store_silent ? "unavailable" : "ok"));
    respond_json(r, s->loading || s->draining ? 503 : 200, body);
}

static void route_models(request *r) {
    server *s = r->srv;
    engine_info *in = &s->info;
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:{s:i, s:i, s:s, s:I, s:s, s:s, s:i, s:s}}", "id",
                          s->model_id, "object", "model", "created", (json_int_t)s->started,
                          "owned_by", "potserve", "meta", "context_length", in->n_ctx_train,
                          "vocab_size", in->n_vocab, "quantization", in->quant ? in->quant : "",
                          "parameters", (json_int_t)in->n_params, "architecture",
                          in->arch ? in->arch : "", "chat_template", in->chat_family ? in->chat_family : "",
                          "embedding_length", in->n_embd, "embedding_pooling", in->pooling);
    const char *id = r->url + strlen("/v1/models");
    if (*id == '/') {
        if (strcmp(id + 1, s->model_id)) {
            json_decref(m);
            api_error e;
            api_fail(&e, 404, "model_not_found", "model", "no model '%s' (this server has '%s')",
                     id + 1, s->model_id);
            return respond_error(r, &e);
        }
        return respond_json(r, 200, m);
    }
    respond_json(r, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

/* What a client (the web page) needs to offer session settings: the
 * defaults a session gets, the names it may choose, and the upload limit. */
static void route_server(request *r) {
    server *s = r->srv;
    json_t *policies = json_array(), *schedules = json_array();
    for (int p = 0; p < POLICY_COUNT_; p++)
        json_array_append_new(policies, json_string(pot_policy_name((enum pot_policy)p)));
    for (int k = 0; k < SCHEDULE_COUNT_; k++)
        json_array_append_new(schedules, json_string(schedule_kind_name((enum schedule_kind)k)));
    int32_t budget = (int32_t)s->cfg.budget_tokens;
    respond_json(r, 200,
                 json_pack("{s:s, s:s, s:i, s:{s:i, s:i, s:s, s:s}, s:o, s:o, s:I, s:I}", "object",
                           "server", "model", s->model_id, "context_length", s->info.n_ctx_train,
                           "session_defaults", "budget_tokens", budget, "keep_tokens", budget / 2,
                           "policy", s->cfg.policy, "schedule", "fixed", "policies", policies,
                           "schedules", schedules, "max_chunk_bytes",
                           (json_int_t)s->cfg.max_chunk_bytes, "max_sessions_per_key",
                           (json_int_t)s->cfg.max_sessions_per_key));
}

static void route_metrics(request *r) {
    char *text = metrics_render(r->srv);
    if (!text) {
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
    r->bytes_out += strlen(text);
    respond_raw(r, 200, resp);
}

static void route_openapi(request *r) {
    size_t n;
    const char *doc = api_openapi_json(&n);
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, (void *)doc, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    r->bytes_out += n;
    respond_raw(r, 200, resp);
}

/* /tokenize and /detokenize: megabytes of text or ids take the pool
 * (request_work), their answer's JSON text made there too. */
typedef struct token_job {
    server *srv;
    json_t *root;     /* the parsed body: tokenize's content points into it */
    const char *content;
    int add_special;
    int32_t *ids;     /* detokenize's */
    size_t n_ids;
    int64_t n_tokens; /* tokenize: how many it made */
    char *text;       /* the answer */
    size_t len;
    api_error e;      /* or why not (e.status) */
} token_job;

static void token_job_done(request *r, void *arg) {
    token_job *j = arg;
    if (j->e.status) {
        respond_error(r, &j->e);
    } else {
        r->tokens = j->n_tokens;
        respond_json_text(r, 200, j->text, j->len);
    }
    free(j->ids);
    json_decref(j->root);
    free(j);
}

static void tokenize_work(void *arg) {
    token_job *j = arg;
    size_t len = strlen(j->content);
    int64_t n = engine_tokenize(j->srv->eng, j->content, len, j->add_special, 0, NULL, 0);
    int32_t *ids = n >= 0 ? malloc((size_t)(n ? n : 1) * sizeof *ids) : NULL;
    json_t *arr = ids ? json_array() : NULL;
    if (arr) engine_tokenize(j->srv->eng, j->content, len, j->add_special, 0, ids, n);
    for (int64_t i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, json_integer(ids[i]))) json_decref(arr), arr = NULL;
    free(ids);
    if (n < 0) {
        api_fail(&j->e, 400, "invalid_utf8", "content", "content is not valid UTF-8");
        return;
    }
    j->n_tokens = n;
    if (!arr || !(j->text = json_text(json_pack("{s:o}", "tokens", arr), &j->len)))
        api_fail(&j->e, 500, NULL, NULL, "out of memory");
}

static void detokenize_work(void *arg) {
    token_job *j = arg;
    if (api_parse_detokenize(j->root, j->srv->info.n_vocab, &j->ids, &j->n_ids, &j->e)) return; /* (a million ids) */
    size_t len, limit = (size_t)j->srv->cfg.max_body_bytes;
    char *text = engine_detokenize(j->srv->eng, j->ids, j->n_ids, limit, &len);
    if (!text && len > limit) { /* long pieces make text of many times the body's size */
        api_fail(&j->e, 413, "text_too_large", "tokens", "the text of these tokens exceeds %lld bytes "
                 "(max_body_bytes): detokenize fewer at a time", (long long)limit);
        return;
    }
    json_t *str = text ? json_stringn(text, len) : NULL;
    if (text && !str) str = json_string(""); /* pieces of one character split across tokens */
    free(text);
    if (!str || !(j->text = json_text(json_pack("{s:o}", "content", str), &j->len)))
        api_fail(&j->e, 500, NULL, NULL, "out of memory");
}

static void route_tokens(request *r, int detokenize) {
    api_error e;
    token_job *j = calloc(1, sizeof *j);
    json_t *body = request_json(r, &e);
    int bad = !j || !body || (!detokenize && api_parse_tokenize(body, &j->content, &j->add_special, &j->root, &e));
    if (detokenize && !bad) j->root = json_incref(body);
    json_decref(body);
    if (bad) {
        if (!j) api_fail(&e, 500, NULL, NULL, "out of memory");
        free(j);
        return respond_error(r, &e);
    }
    j->srv = r->srv;
    request_work_input(r, detokenize ? detokenize_work : tokenize_work, token_job_done, j);
}

/* ---- routing --------------------------------------------------------------------------- */

enum body_kind { BODY_NONE, BODY_JSON, BODY_UPLOAD };

typedef struct route_def {
    const char *method, *path; /* path prefix when it ends with '/' */
    const char *name;
    enum body_kind body;
} route_def;

int request_reads(const request *r) { return !strcmp(r->method, "GET") || !strcmp(r->method, "HEAD"); }

const char *route_id(const char *rest, char *id, size_t cap) {
    const char *slash = strchr(rest + 1, '/');
    size_t n = slash ? (size_t)(slash - rest - 1) : strlen(rest + 1);
    if (n >= cap) n = cap - 1;
    memcpy(id, rest + 1, n);
    id[n] = 0;
    return slash;
}

void respond_method_not_allowed(request *r, const char *allow) {
    api_error e;
    api_fail(&e, 405, "method_not_allowed", NULL, "%s is not allowed on %s", r->method, r->url);
    struct MHD_Response *resp = json_response(r, api_error_json(&e));
    MHD_add_response_header(resp, "Allow", allow); /* RFC 9110: a 405 lists what is allowed */
    respond_raw(r, 405, resp);
}

static void not_found(request *r) {
    api_error e;
    api_fail(&e, 404, "not_found", NULL, "no route %s %s", r->method, r->url);
    respond_error(r, &e);
}

/* Names the route (for logs and metrics) and whether it takes a body. */
static const char *classify(const char *method, const char *url, enum body_kind *body) {
    *body = BODY_NONE;
    int post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) return "/health";
    if (web_is_page(url)) return "/ (page)";
    if (!strcmp(url, "/metrics")) return "/metrics";
    if (!strcmp(url, "/openapi.json")) return "/openapi.json";
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11)) return "/v1/models";
    if (!strcmp(url, "/v1/chat/completions")) return *body = post ? BODY_JSON : BODY_NONE, "/v1/chat/completions";
    if (!strcmp(url, "/v1/completions")) return *body = post ? BODY_JSON : BODY_NONE, "/v1/completions";
    if (!strcmp(url, "/v1/server")) return "/v1/server";
    if (!strcmp(url, "/v1/responses")) return *body = post ? BODY_JSON : BODY_NONE, "/v1/responses";
    if (!strcmp(url, "/v1/responses/input_tokens"))
        return *body = post ? BODY_JSON : BODY_NONE, "/v1/responses/input_tokens";
    if (!strncmp(url, "/v1/responses/", 14) && url[14] && url[14] != '/') {
        const char *slash = strchr(url + 14, '/');
        if (!slash) return "/v1/responses/{id}";
        if (!strcmp(slash, "/input_items")) return "/v1/responses/{id}/input_items";
        if (!strcmp(slash, "/cancel")) return "/v1/responses/{id}/cancel";
    }
    if (!strcmp(url, "/v1/conversations")) return *body = post ? BODY_JSON : BODY_NONE, "/v1/conversations";
    if (!strncmp(url, "/v1/conversations/", 18) && url[18] && url[18] != '/') {
        const char *slash = strchr(url + 18, '/');
        *body = post ? BODY_JSON : BODY_NONE;
        if (!slash) return "/v1/conversations/{id}";
        if (!strcmp(slash, "/items")) return "/v1/conversations/{id}/items";
        if (!strncmp(slash, "/items/", 7) && slash[7] && !strchr(slash + 7, '/'))
            return *body = BODY_NONE, "/v1/conversations/{id}/items/{item_id}";
        *body = BODY_NONE;
    }
    if (!strcmp(url, "/v1/embeddings")) return *body = post ? BODY_JSON : BODY_NONE, "/v1/embeddings";
    if (!strcmp(url, "/tokenize")) return *body = post ? BODY_JSON : BODY_NONE, "/tokenize";
    if (!strcmp(url, "/detokenize")) return *body = post ? BODY_JSON : BODY_NONE, "/detokenize";
    if (!strcmp(url, "/v1/sessions")) return *body = post ? BODY_JSON : BODY_NONE, "/v1/sessions";
    if (!strcmp(url, "/v1/files")) return *body = post ? BODY_UPLOAD : BODY_NONE, "/v1/files";
    if (!strncmp(url, "/v1/files/", 10) && url[10] && url[10] != '/') {
        const char *slash = strchr(url + 10, '/');
        if (slash && !strcmp(slash, "/content")) return "/v1/files/{id}/content";
        return "/v1/files/{id}";
    }
    if (!strncmp(url, "/v1/sessions/", 13)) {
        const char *slash = strchr(url + 13, '/');
        if (slash && !strcmp(slash, "/chunks")) { /* PUT too: what `curl -T` sends */
            *body = post || !strcmp(method, "PUT") ? BODY_UPLOAD : BODY_NONE;
            return "/v1/sessions/{id}/chunks";
        }
        if (slash && !strcmp(slash, "/retention")) return "/v1/sessions/{id}/retention";
        if (slash && !strcmp(slash, "/text")) return "/v1/sessions/{id}/text";
        return "/v1/sessions/{id}";
    }
    return "other";
}

static void dispatch(request *r, const char *upload, size_t *upload_size) {
    const char *rt = r->route, *m = r->method;
    int get = request_reads(r), post = !strcmp(m, "POST");
    if (!strcmp(rt, "/health")) return get ? route_health(r) : respond_method_not_allowed(r, "GET, HEAD");
    if (!strcmp(rt, "/ (page)")) return get ? route_web(r) : respond_method_not_allowed(r, "GET, HEAD");
    if (!strcmp(rt, "/v1/server")) return get ? route_server(r) : respond_method_not_allowed(r, "GET, HEAD");
    if (!strcmp(rt, "/metrics")) return get ? route_metrics(r) : respond_method_not_allowed(r, "GET, HEAD");
    if (!strcmp(rt, "/openapi.json")) return get ? route_openapi(r) : respond_method_not_allowed(r, "GET, HEAD");
    if (!strcmp(rt, "/v1/models")) return get ? route_models(r) : respond_method_not_allowed(r, "GET, HEAD");
    if (!strcmp(rt, "/v1/chat/completions")) return post ? route_generate(r, 1) : respond_method_not_allowed(r, "POST");
    if (!strcmp(rt, "/v1/completions")) return post ? route_generate(r, 0) : respond_method_not_allowed(r, "POST");
    if (!strcmp(rt, "/v1/responses") || !strcmp(rt, "/v1/responses/input_tokens"))
        return post ? route_responses(r) : respond_method_not_allowed(r, "POST");
    if (!strncmp(rt, "/v1/responses/{id}", 18)) return route_response_id(r, r->url + strlen("/v1/responses/"));
    if (!strcmp(rt, "/v1/conversations")) return route_conversations(r);
    if (!strncmp(rt, "/v1/conversations/{id}", 22)) return route_conversation_id(r, r->url + strlen("/v1/conversations/"));
    if (!strcmp(rt, "/v1/embeddings")) return post ? route_embeddings(r) : respond_method_not_allowed(r, "POST");
    if (!strcmp(rt, "/tokenize")) return post ? route_tokens(r, 0) : respond_method_not_allowed(r, "POST");
    if (!strcmp(rt, "/detokenize")) return post ? route_tokens(r, 1) : respond_method_not_allowed(r, "POST");
    if (!strncmp(rt, "/v1/sessions", 12))
        return route_sessions(r, r->url + strlen("/v1/sessions"), upload, upload_size);
    if (!strncmp(rt, "/v1/files", 9)) return route_files(r, r->url + strlen("/v1/files"));
    not_found(r);
}

/* ---- JSON bodies: parsed once, before dispatch ---------------------------------------- */

/* A body over OFF_LOOP_BYTES is parsed on libuv's pool: megabytes take tens of
 * milliseconds, which the loop (answering, renewing leases) cannot spare. */
typedef struct body_parse {
    const char *text;
    size_t n;
    json_t *root;
    api_error err;
    void (*then)(request *r);
} body_parse;

static void body_parse_work(void *arg) {
    body_parse *p = arg;
    p->root = api_parse_object(p->text, p->n, &p->err);
}

static void body_parsed(request *r, void *arg) {
    body_parse *p = arg;
    void (*then)(request *r) = p->then;
    r->json = p->root;
    r->json_err = p->err;
    free(p);
    free(r->body); /* (what follows reads the parsed body; body_len stays) */
    r->body = NULL;
    r->body_cap = 0;
    if (r->conn) then(r); /* (else its client left meanwhile: nothing to answer) */
}

void request_parse_json(request *r, void (*then)(request *r)) {
    body_parse *p = calloc(1, sizeof *p);
    if (!p) {
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    int blank = 1;
    for (size_t i = 0; blank && i < r->body_len; i++) blank = r->body[i] && strchr(" \t\r\n", r->body[i]);
    r->body_blank = blank;
    *p = (body_parse){.text = r->body ? r->body : "", .n = r->body_len, .then = then};
    request_work_input(r, body_parse_work, body_parsed, p);
}

void request_dispatch(request *r) {
    size_t none = 0;
    dispatch(r, NULL, &none);
}

/* Whether a Content-Length value is zero as libmicrohttpd reads it ("0", "00", ...). */
static int zero_length(const char *length) {
    if (!length || !*length) return 0;
    while (*length == '0') length++;
    return !*length;
}

/* Whether the request says a body follows. */
static int has_body(struct MHD_Connection *c) {
    const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    return (length && !zero_length(length)) || MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
}

/* First call for a request: checks that need only the headers. Returns 0 to
 * go on, -1 when a response has been queued. */
static int admit(request *r) {
    server *s = r->srv;
    api_error e;
    if (!strcmp(r->route, "/health")) return 0;
    if (cors_foreign_site(r, &e)) {
        if (has_body(r->conn)) r->close_conn = 1;
        respond_error(r, &e);
        return -1;
    }
    if (!strcmp(r->route, "/ (page)")) return 0; /* public: the page asks for a key itself */
    if (s->draining) {
        api_fail(&e, 503, "shutting_down", NULL, "the server is shutting down");
        respond_retry(r, &e, 1); /* (behind a balancer another replica answers) */
        return -1;
    }
    r->key = auth_check(s, r->conn);
    if (!r->key) {
        api_fail(&e, 401, "invalid_api_key", NULL,
                 "missing or wrong API key: send Authorization: Bearer <key>");
        /* a body sent without a key is not read: the connection ends with the answer */
        if (has_body(r->conn)) r->close_conn = 1;
        respond_error(r, &e);
        return -1;
    }
    int wait = auth_rate_limit(s, r->key);
    if (wait) {
        api_fail(&e, 429, "rate_limited", NULL, "too many requests; retry in %d s", wait);
        respond_retry(r, &e, wait);
        return -1;
    }
    if (strcmp(r->route, "other")) return 0;
    not_found(r);
    return -1;
}

/* Accumulates a JSON body up to max_body_bytes. */
static void take_body(request *r, const char *data, size_t n) {
    if (r->body_too_large) return;
    if (r->body_len + n > (size_t)r->srv->cfg.max_body_bytes) {
        r->body_too_large = 1;
        return;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = (r->body_len + n + 1) * 2;
        char *t = realloc(r->body, cap);
        if (!t) {
            r->body_too_large = 1;
            return;
        }
        r->body = t;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    r->body[r->body_len] = 0;
}

/* ---- connection deadlines ---------------------------------------------------------
 * MHD's own timeout (idle_timeout) restarts with every byte, so a client that
 * trickles its headers a byte at a time would hold a connection forever, and
 * the access handler (where connection_timeout used to be checked) runs only
 * once the headers are complete. Each connection is therefore tracked from
 * accept: its request line and headers must arrive within idle_timeout of the
 * moment it began waiting for them (accept, or the end of the previous
 * request), and it may live connection_timeout in all: a kept-alive one is
 * closed between requests once past that age (a request in flight finishes;
 * a body still arriving connection_timeout after its request began is cut).
 * srv_sweep_connections (once a second) cuts those past a deadline with
 * shutdown(2), which MHD sees as the peer going away and cleans up like any
 * other close. */
struct conn_track {
    struct MHD_Connection *conn;
    double opened_ms;       /* accept */
    double waiting_since_ms; /* when it began waiting for a request's headers */
    int in_request;         /* the headers are complete: a request is being served */
    int cut;
    conn_track *next, **prev;
};

static conn_track *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void srv_connection_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                           enum MHD_ConnectionNotificationCode toe) {
    server *s = cls;
    s->mhd_calls++;
    conn_track *t = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        t = calloc(1, sizeof *t);
        if (t) {
            t->conn = c;
            t->opened_ms = t->waiting_since_ms = monotonic_ms();
            t->next = s->conns;
            if (s->conns) s->conns->prev = &t->next;
            t->prev = &s->conns;
            s->conns = t;
        }
        *socket_context = t;
    } else if (t) {
        *t->prev = t->next;
        if (t->next) t->next->prev = t->prev;
        free(t);
        *socket_context = NULL;
    }
}

/* Whether the client of r hung up (or shut its side) before its body was
 * whole, with nothing of it left unread: the rest can never come, and MHD,
 * woken by epoll only at an edge, misses a hang-up that came in one packet
 * with the data it read last (the request then held its connection until
 * idle_timeout). Bytes still unread (an upload held back) are MHD's to read. */
static int body_abandoned(request *r) {
    if (!r->conn || !r->receiving_body) return 0;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    int unread = 0;
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) &&
           !ioctl(ci->connect_fd, FIONREAD, &unread) && unread == 0;
}

/* How long the server has held r (suspended: an upload waiting for the engine, a takeover):
 * time that is not its client's. */
static double held_ms(const request *r, double now) {
    return r->suspended_ms + (r->suspended ? now - r->suspended_at_ms : 0);
}

void srv_sweep_connections(server *s) {
    double now = monotonic_ms(), header_ms = (double)s->cfg.idle_timeout * 1e3,
           life_ms = (double)s->cfg.connection_timeout * 1e3;
    int cut = 0;
    for (request *r = s->live; r; r = r->next_live)
        if (body_abandoned(r)) {
            shutdown(MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD)->connect_fd, SHUT_RDWR);
            r->receiving_body = 0;
            cut = 1;
        }
    for (request *r = s->live; r && life_ms > 0; r = r->next_live) /* a body trickling in for ever */
        if (r->conn && r->receiving_body && now - r->t0 - held_ms(r, now) > life_ms) {
            shutdown(MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD)->connect_fd, SHUT_RDWR);
            r->receiving_body = 0;
            cut = 1;
        }
    for (conn_track *t = s->conns; t; t = t->next) {
        if (t->cut) continue;
        int slow_headers = !t->in_request && now - t->waiting_since_ms > header_ms;
        /* a kept-alive connection past its age goes between requests, not in the middle of one
           (its answer would be lost: a generation has request_timeout, a body the check above) */
        int too_old = life_ms > 0 && now - t->opened_ms > life_ms && !t->in_request;
        if (!slow_headers && !too_old) continue;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(t->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci) shutdown(ci->connect_fd, SHUT_RDWR);
        t->cut = 1;
        cut = 1;
    }
    if (cut) srv_kick(s);
}

static int connection_expired(server *s, struct MHD_Connection *c) {
    if (!s->cfg.connection_timeout) return 0;
    const conn_track *t = conn_of(c);
    return t && monotonic_ms() - t->opened_ms > (double)s->cfg.connection_timeout * 1e3;
}

/* ---- header checks MHD leaves to the application -------------------------------------
 * MHD refuses headers only when they overflow its memory pool
 * (max_header_bytes plus room for the body's buffers), in HTML; the
 * max_header_bytes limit itself is checked here, in the API's JSON.
 * MHD also frames the body by the first Content-Length it sees and reads a body
 * of any Transfer-Encoding other than chunked until the peer closes. Behind
 * a proxy that frames differently that is request smuggling, so such
 * requests are refused before their body is read. */
typedef struct framing {
    size_t header_bytes; /* as sent: "Key: value\r\n" each */
    int n_length, lengths_differ, n_encoding;
    const char *length, *encoding, *expect;
} framing;

static enum MHD_Result scan_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing *f = cls;
    f->header_bytes += strlen(key) + strlen(value) + 4;
    if (!strcasecmp(key, "Content-Length")) {
        if (f->length && strcmp(f->length, value)) f->lengths_differ = 1;
        f->length = value;
        f->n_length++;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->encoding = value;
        f->n_encoding++;
    } else if (!strcasecmp(key, "Expect")) {
        f->expect = value;
    }
    return MHD_YES;
}

static enum MHD_Result count_query(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) + 1 : 0) + 1; /* "key=value" and '?' or '&' */
    return MHD_YES;
}

/* 0, or -1 with an error queued (the connection then closes). body_limit:
 * the most bytes the route reads, checked after the key (check_length). */
static int check_framing(request *r) {
    framing f = {0};
    api_error e;
    MHD_get_connection_values(r->conn, MHD_HEADER_KIND, scan_framing, &f);
    size_t line_bytes = strlen(r->method) + strlen(r->url) + 12; /* " HTTP/1.1\r\n" */
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, count_query, &line_bytes); /* (not in url) */
    if (line_bytes + f.header_bytes > (size_t)r->srv->cfg.max_header_bytes)
        api_fail(&e, line_bytes > (size_t)r->srv->cfg.max_header_bytes ? 414 : 431, "headers_too_large", NULL,
                 "the request line and headers exceed max_header_bytes (%lld)", (long long)r->srv->cfg.max_header_bytes);
    else if (f.lengths_differ)
        api_fail(&e, 400, "invalid_framing", NULL, "the request has Content-Length headers that disagree");
    else if (f.n_encoding && f.n_length)
        api_fail(&e, 400, "invalid_framing", NULL, "the request has both Transfer-Encoding and Content-Length");
    else if (f.n_encoding > 1 || (f.encoding && strcasecmp(f.encoding, "chunked")))
        api_fail(&e, 400, "unsupported_transfer_encoding", NULL,
                 "Transfer-Encoding must be chunked (or absent), not '%.60s'", f.encoding);
    else if (f.expect && !f.n_encoding && (!f.length || zero_length(f.length))) {
        /* a client must not expect a 100 without a body (RFC 9110, 10.1.1); libmicrohttpd 0.9.75 sends
           one, then loses the request when bytes follow, and asks to be run at once until the idle
           timeout: answered now, at its first call (not deferred to one that never comes) */
        api_fail(&e, 400, "invalid_framing", NULL, "Expect: %.40s on a request without a body", f.expect);
    } else
        return 0;
    r->close_conn = 1;
    /* answered now, at its first call, not deferred to a next call that may never come: with
       Expect: 100-continue and a length libmicrohttpd reads as 0 (the first of two that disagree,
       say), it sends 100 Continue, then loses the request when bytes follow */
    r->first_call = 0;
    respond_error(r, &e);
    return -1;
}

/* As check_framing, for a Content-Length above body_limit (after the key:
 * a client without one learns that first). */
static int check_length(request *r, uint64_t body_limit) {
    const char *length = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Content-Length");
    if (!length || strtoull(length, NULL, 10) <= body_limit) return 0;
    api_error e;
    api_fail(&e, 413, "body_too_large", NULL, "Content-Length %.24s exceeds this route's limit (%llu bytes)", length,
             (unsigned long long)body_limit);
    r->close_conn = 1;
    respond_error(r, &e);
    return -1;
}

enum MHD_Result srv_access_handler(void *cls, struct MHD_Connection *c, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_data_size,
                                   void **con_cls) {
    (void)version;
    server *s = cls;
    s->mhd_calls++;
    request *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->srv = s;
        r->conn = c;
        r->refs = 1;
        r->t0 = monotonic_ms();
        r->close_conn = connection_expired(s, c); /* its age is up: this request is its last */
        snprintf(r->method, sizeof r->method, "%s", method);
        r->url = strdup(url);
        enum body_kind body;
        r->route = classify(method, url, &body);
        r->takes_json = body == BODY_JSON;
        r->next_live = s->live;
        s->live = r;
        s->n_live++;
        *con_cls = r;
        /* answered at the next call, which a request without a body gets at once */
        r->first_call = !has_body(c);
        conn_track *t = conn_of(c);
        if (t) t->in_request = 1;
        if (!r->url) return MHD_NO;
        /* uploads check their own (larger) limit once the route knows the body's type */
        uint64_t limit = body == BODY_UPLOAD ? UINT64_MAX : (uint64_t)s->cfg.max_body_bytes;
        if (check_framing(r)) return MHD_YES;
        if (cors_preflight(r)) return MHD_YES; /* before auth: browsers send no credentials */
        if (admit(r) || check_length(r, limit)) return MHD_YES;
        if (body == BODY_NONE) return MHD_YES; /* dispatched at the next call */
        r->receiving_body = 1;
        if (body == BODY_UPLOAD) {
            dispatch(r, NULL, upload_data_size); /* headers only: set up */
            r->headers_again = r->suspended && !r->status && !r->pending;
        }
        return MHD_YES;
    }
    r->first_call = 0;
    if (r->headers_again && !r->pending) {
        r->headers_again = 0;
        if (!*upload_data_size) return MHD_YES; /* MHD's headers call once more, after the resume: not the end */
    }
    if (!*upload_data_size) r->receiving_body = 0; /* MHD's last call for a request: its body is whole */
    if (r->pending && *upload_data_size) {
        /* prepared while suspended in the middle of the body (a form's file whose session could not
           be made): libmicrohttpd sends nothing queued before the body has been read, so the rest
           is dropped and the answer queued at the body's end */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->pending) { /* a response prepared while suspended */
        struct MHD_Response *resp = r->pending;
        r->pending = NULL;
        queue(r, r->pending_status, resp);
        return MHD_YES;
    }
    if (r->status) { /* already answered (an error before the body ended): drop the rest */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->form) { /* POST /v1/files: a form whose file is streamed as an upload */
        files_receive(r, upload_data, upload_data_size);
        return MHD_YES;
    }
    if (r->up) { /* streamed upload */
        upload_receive(r, upload_data, upload_data_size);
        return MHD_YES;
    }
    if (*upload_data_size) {
        take_body(r, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->gen || r->suspended || r->refs > 1) return MHD_YES; /* async work under way */
    if (r->body_too_large) {
        api_error e;
        api_fail(&e, 413, "body_too_large", NULL, "the request body exceeds max_body_bytes (%lld)",
                 (long long)s->cfg.max_body_bytes);
        respond_error(r, &e);
        return MHD_YES;
    }
    if (r->takes_json) request_parse_json(r, request_dispatch);
    else dispatch(r, NULL, upload_data_size);
    return MHD_YES;
}

void srv_request_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                           enum MHD_RequestTerminationCode toe) {
    ((server *)cls)->mhd_calls++;
    conn_track *t = conn_of(c);
    if (t) { /* the next request's headers are timed from now */
        t->in_request = 0;
        t->waiting_since_ms = monotonic_ms();
    }
    request *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    /* the client went away before its answer was whole, or its generation saw it go (a
       half-close: the stream's error event may still have been sent) */
    int cut = (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !r->out_done) || (r->gen && generation_client_left(r->gen));
    if (cut && r->status < 400) r->status = 499;
    srv_access_log(r);
    r->conn = NULL;
    r->suspended = 0;
    if (r->gen) generation_cancel(r->gen);
    if (r->up) upload_abandon(r->up);
    request_unref(r);
}
