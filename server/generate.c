/* /v1/chat/completions and /v1/completions: validate, build the prompt (after
 * a session's pot or alone), hand it to the engine thread, and turn the text
 * it streams back into one OpenAI response or SSE chunks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/reread.h"
#include "server/srv.h"

struct generation {
    request *r;
    session *ss;
    api_gen_request req;
    int32_t *prompt;
    size_t n_prompt;
    char id[48];
    int64_t created;
    char *text;
    size_t len, cap;
    json_t *logprobs; /* chat: array of token entries; completions: {tokens, token_logprobs, top_logprobs} */
    atomic_int cancel;
    double deadline_ms;
    engine_gen_result res;
    int finished;
    /* a prompt longer than the window, read through a temporary pot */
    engine_doc *tmp_doc;
    engine_pot_settings tmp_settings;
    size_t tmp_memory;
    char *doc_text;       /* what goes into the temporary pot */
    size_t doc_len;
    size_t question_at;   /* chat: index of the message asked after the document */
    const char *tail;     /* completions: the prompt's end, asked after the document */
    int tmp_rc;
    char tmp_err[256];
    /* a question answered from a re-read of the session's document (reread.c) */
    int rereading, stream_started;
    reread_stats reread_st;
};

static void release_temporary_pot(server *s, generation *g);

/* What the engine thread sends for each piece of text. */
typedef struct text_event {
    generation *g;
    int has_lp;
    sample_logprobs lp;
    size_t n;
    char text[];
} text_event;

typedef struct done_event {
    generation *g;
    int rc;
    engine_gen_result res;
    char err[256];
} done_event;

void generation_free(generation *g) {
    if (g->ss) session_unref(g->ss);
    free(g->doc_text);
    api_gen_request_free(&g->req);
    free(g->prompt);
    free(g->text);
    json_decref(g->logprobs);
    free(g);
}

void random_id(char *out, size_t cap, const char *prefix) {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned char rnd[24];
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(rnd, 1, sizeof rnd, f) : 0;
    if (f) fclose(f);
    for (size_t i = got; i < sizeof rnd; i++) rnd[i] = (unsigned char)rand();
    size_t n = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof rnd && n + 1 < cap; i++) out[n++] = alphabet[rnd[i] % 62];
    out[n] = 0;
}

static json_t *token_json(server *s, int32_t tok, float logprob) {
    char buf[256];
    int n = engine_token_text(s->eng, tok, buf, sizeof buf);
    if (n < 0) n = 0;
    json_t *bytes = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)buf[i]));
    json_t *str = json_stringn(buf, (size_t)n);
    if (!str) str = json_string(""); /* part of a multi-byte character */
    return json_pack("{s:o, s:f, s:o}", "token", str, "logprob", (double)logprob, "bytes", bytes);
}

/* The logprobs of one sampled token, in the endpoint's shape. */
static json_t *chat_logprob_entry(server *s, const sample_logprobs *lp) {
    json_t *e = token_json(s, lp->token, lp->logprob), *top = json_array();
    for (int i = 0; i < lp->n_top; i++)
        json_array_append_new(top, token_json(s, lp->top_tokens[i], lp->top_logprobs[i]));
    json_object_set_new(e, "top_logprobs", top);
    return e;
}

static void completion_logprob_add(server *s, json_t *acc, const sample_logprobs *lp) {
    json_t *t = token_json(s, lp->token, lp->logprob), *top = json_object();
    json_array_append(json_object_get(acc, "tokens"), json_object_get(t, "token"));
    json_array_append_new(json_object_get(acc, "token_logprobs"), json_real(lp->logprob));
    for (int i = 0; i < lp->n_top; i++) {
        json_t *alt = token_json(s, lp->top_tokens[i], lp->top_logprobs[i]);
        json_object_set(top, json_string_value(json_object_get(alt, "token")),
                        json_object_get(alt, "logprob"));
        json_decref(alt);
    }
    json_array_append_new(json_object_get(acc, "top_logprobs"), top);
    json_decref(t);
}

static json_t *usage_json(const generation *g) {
    int64_t prompt = g->res.n_prompt + g->res.n_cached;
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt,
                     "completion_tokens", (json_int_t)g->res.n_generated, "total_tokens",
                     (json_int_t)(prompt + g->res.n_generated), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)g->res.n_cached);
}

static const char *model_name(const generation *g) {
    return g->r->srv->model_id;
}

/* One SSE chunk: a text delta (text != NULL), the role opener, or the finish. */
static json_t *chunk_json(const generation *g, const char *text, size_t n, int role,
                          const char *finish, json_t *logprobs) {
    json_t *choice;
    json_t *str = text ? json_stringn(text, n) : NULL;
    if (text && !str) str = json_string("");
    if (g->req.chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (role && !text) json_object_set_new(delta, "content", json_string(""));
        if (str) json_object_set_new(delta, "content", str);
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "delta", delta, "logprobs",
                           logprobs ? json_pack("{s:o}", "content", logprobs) : json_null(),
                           "finish_reason", finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", 0, "text", str ? str : json_string(""),
                           "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
                           finish ? json_string(finish) : json_null());
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", g->id, "object",
                     g->req.chat ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)g->created, "model", model_name(g), "choices", choice);
}

static void sse_send(request *r, json_t *j) {
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text) return;
    stream_write(r, "data: ", 6);
    stream_write(r, text, strlen(text));
    stream_write(r, "\n\n", 2);
    free(text);
}

/* ---- engine thread -> loop ----------------------------------------------------------- */

static void on_text_event(server *s, void *arg) {
    text_event *ev = arg;
    generation *g = ev->g;
    request *r = g->r;
    if (g->req.stream) {
        json_t *lp = NULL;
        if (ev->has_lp && g->req.chat) {
            lp = json_array();
            json_array_append_new(lp, chat_logprob_entry(s, &ev->lp));
        } else if (ev->has_lp) {
            lp = json_pack("{s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs");
            completion_logprob_add(s, lp, &ev->lp);
        }
        if (r->conn) sse_send(r, chunk_json(g, ev->text, ev->n, 0, NULL, lp));
        else json_decref(lp);
    } else {
        if (g->len + ev->n + 1 > g->cap) {
            size_t cap = (g->len + ev->n + 1) * 2;
            char *t = realloc(g->text, cap);
            if (t) {
                g->text = t;
                g->cap = cap;
            }
        }
        if (g->len + ev->n + 1 <= g->cap) {
            memcpy(g->text + g->len, ev->text, ev->n);
            g->len += ev->n;
            g->text[g->len] = 0;
        }
        if (ev->has_lp && g->logprobs) {
            if (g->req.chat) json_array_append_new(g->logprobs, chat_logprob_entry(s, &ev->lp));
            else completion_logprob_add(s, g->logprobs, &ev->lp);
        }
    }
    free(ev);
}

static void finish_stream(generation *g, const done_event *ev) {
    request *r = g->r;
    if (ev->rc) {
        api_error e;
        api_fail(&e, 500, "generation_failed", NULL, "%s", ev->err);
        sse_send(r, api_error_json(&e));
    } else {
        sse_send(r, chunk_json(g, NULL, 0, 0, api_finish_reason(ev->res.finish), NULL));
        if (g->req.include_usage) {
            json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", g->id, "object",
                                  g->req.chat ? "chat.completion.chunk" : "text_completion",
                                  "created", (json_int_t)g->created, "model", model_name(g),
                                  "choices", "usage", usage_json(g));
            sse_send(r, j);
        }
    }
    stream_write(r, "data: [DONE]\n\n", 14);
    stream_end(r);
}

static void finish_whole(generation *g, const done_event *ev) {
    request *r = g->r;
    if (ev->rc) {
        api_error e;
        api_fail(&e, 400, "generation_failed", NULL, "%s", ev->err);
        return respond_error(r, &e);
    }
    json_t *str = json_stringn(g->text ? g->text : "", g->len);
    if (!str) str = json_string("");
    json_t *choice;
    const char *finish = api_finish_reason(ev->res.finish);
    if (g->req.chat) {
        choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", 0, "message", "role",
                           "assistant", "content", str, "logprobs",
                           g->logprobs ? json_pack("{s:O}", "content", g->logprobs) : json_null(),
                           "finish_reason", finish);
    } else {
        choice = json_pack("{s:i, s:o, s:O?, s:s}", "index", 0, "text", str, "logprobs",
                           g->logprobs, "finish_reason", finish);
        if (!g->logprobs) json_object_set_new(choice, "logprobs", json_null());
    }
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", g->id, "object",
                             g->req.chat ? "chat.completion" : "text_completion", "created",
                             (json_int_t)g->created, "model", model_name(g), "choices", choice,
                             "usage", usage_json(g));
    if (g->ss) json_object_set_new(body, "session", json_string(g->ss->id));
    if (g->rereading)
        json_object_set_new(body, "reread", json_pack("{s:I, s:I, s:f}", "bytes", (json_int_t)g->reread_st.bytes,
                                                      "tokens", (json_int_t)g->reread_st.tokens, "seconds",
                                                      g->reread_st.ms / 1e3));
    respond_json(r, 200, body);
}

static void on_done_event(server *s, void *arg) {
    done_event *ev = arg;
    generation *g = ev->g;
    request *r = g->r;
    g->res = ev->res;
    g->finished = 1;
    if (g->ss) session_generation_done(g->ss);
    if (g->tmp_doc) release_temporary_pot(s, g);
    s->m.tokens_prompted += ev->res.n_prompt;
    s->m.tokens_generated += ev->res.n_generated;
    s->m.decode_ms += ev->res.decode_ms;
    r->tokens = ev->res.n_prompt + ev->res.n_generated;
    if (r->conn) {
        if (g->req.stream) finish_stream(g, ev);
        else finish_whole(g, ev);
    }
    free(ev);
    request_unref(r); /* the engine's reference */
}

static int gen_on_text(void *user, const char *text, size_t len, int32_t token,
                       const sample_logprobs *lp) {
    (void)token;
    generation *g = user;
    if (atomic_load(&g->cancel)) return 1;
    if (srv_now_ms() > g->deadline_ms) {
        atomic_store(&g->cancel, 1);
        return 1;
    }
    text_event *ev = malloc(sizeof *ev + len + 1);
    if (!ev) return 1;
    ev->g = g;
    ev->has_lp = lp != NULL;
    if (lp) ev->lp = *lp;
    ev->n = len;
    memcpy(ev->text, text, len);
    ev->text[len] = 0;
    srv_post(g->r->srv, on_text_event, ev);
    return 0;
}

static void gen_on_done(void *user, int rc, const engine_gen_result *res, const char *err) {
    generation *g = user;
    done_event *ev = calloc(1, sizeof *ev);
    if (!ev) abort(); /* the request would never complete */
    ev->g = g;
    ev->rc = rc;
    if (res) ev->res = *res;
    if (err) snprintf(ev->err, sizeof ev->err, "%s", err);
    srv_post(g->r->srv, on_done_event, ev);
}

/* ---- the route ------------------------------------------------------------------------ */

/* Prompt tokens for a request without a session. */
static int plain_prompt(server *s, generation *g, api_error *e) {
    char err[256];
    api_gen_request *q = &g->req;
    if (!q->chat && q->prompt_tokens) {
        g->n_prompt = q->n_prompt_tokens;
        g->prompt = malloc(g->n_prompt * sizeof *g->prompt);
        if (!g->prompt) return api_fail(e, 500, NULL, NULL, "out of memory");
        memcpy(g->prompt, q->prompt_tokens, g->n_prompt * sizeof *g->prompt);
        return 0;
    }
    char *text = q->chat ? engine_render_chat(s->eng, q->messages, q->n_messages, err, sizeof err)
                         : strdup(q->prompt);
    if (!text) return api_fail(e, 400, "invalid_value", "messages", "%s", err);
    g->prompt = engine_tokenize_prompt(s->eng, text, q->chat, &g->n_prompt, err, sizeof err);
    free(text);
    if (!g->prompt) return api_fail(e, 400, "invalid_value", q->chat ? "messages" : "prompt", "%s", err);
    return 0;
}

/* Hands the prepared generation to the engine thread. */
static void submit(server *s, generation *g) {
    request *r = g->r;
    api_gen_request *q = &g->req;
    api_error e;
    engine_doc *doc = g->tmp_doc ? g->tmp_doc : g->ss ? g->ss->doc : NULL;
    engine_gen_request er = {.doc = doc, .prompt = g->prompt, .n_prompt = g->n_prompt,
                             .params = q->params, .on_text = gen_on_text, .on_done = gen_on_done,
                             .user = g};
    char err[256];
    request_ref(r); /* held by the engine until on_done arrives */
    if (srv_generate(s, &er, err, sizeof err)) {
        request_unref(r);
        api_fail(&e, 503, "unavailable", NULL, "%s", err);
        return respond_error(r, &e);
    }
    if (g->ss) g->ss->gens++; /* the doc must not be replaced until the generation is done */
    if (q->stream) {
        if (!g->stream_started && stream_start(r)) return; /* the engine's done event still completes r */
        g->stream_started = 1;
        sse_send(r, chunk_json(g, NULL, 0, 1, NULL, NULL));
    } else {
        request_suspend(r);
    }
}

/* ---- prompts longer than the window: read through a temporary pot ------------------
 * The conversation before the last user message (or a completion prompt
 * without its last part) becomes the document of a pot with the server's
 * default settings; the last message is asked after it, as with a session. */

enum { COMPLETION_TAIL_BYTES = 512 };

static void close_doc_task(engine *e, void *arg) {
    (void)e;
    engine_doc_close(arg);
}

static void release_temporary_pot(server *s, generation *g) {
    if (srv_task(s, g->tmp_doc, close_doc_task, g->tmp_doc)) engine_doc_close(g->tmp_doc);
    g->tmp_doc = NULL;
    s->pot_memory -= g->tmp_memory;
}

static void temporary_pot_failed(server *s, generation *g, int status, const char *msg) {
    api_error e;
    api_fail(&e, status, "overflow_failed", NULL, "reading the prompt through a pot failed: %s", msg);
    if (g->tmp_doc) release_temporary_pot(s, g);
    respond_error(g->r, &e);
    request_unref(g->r);
}

static void temporary_pot_read(server *s, void *arg) {
    generation *g = arg;
    if (g->tmp_rc) return temporary_pot_failed(s, g, 500, g->tmp_err);
    api_gen_request *q = &g->req;
    free(g->prompt);
    g->prompt = engine_doc_prompt(g->tmp_doc, q->messages + g->question_at, q->n_messages - g->question_at,
                                  q->chat ? NULL : g->tail, &g->n_prompt, g->tmp_err, sizeof g->tmp_err);
    if (!g->prompt) return temporary_pot_failed(s, g, 400, g->tmp_err);
    submit(s, g);
    request_unref(g->r);
}

static void temporary_pot_ingested(void *user, int rc, const char *err) {
    generation *g = user; /* engine thread */
    g->tmp_rc = rc;
    if (err) snprintf(g->tmp_err, sizeof g->tmp_err, "%s", err);
    srv_post(g->r->srv, temporary_pot_read, g);
}

static void temporary_pot_opened(server *s, void *arg) {
    generation *g = arg;
    if (!g->tmp_doc) return temporary_pot_failed(s, g, 500, g->tmp_err);
    if (srv_ingest(s, g->tmp_doc, g->doc_text, g->doc_len, 1, temporary_pot_ingested, g))
        temporary_pot_failed(s, g, 503, "the server is shutting down");
}

static void open_temporary_pot(engine *e, void *arg) {
    generation *g = arg;
    g->tmp_doc = engine_doc_open(e, &g->tmp_settings, g->tmp_err, sizeof g->tmp_err);
    srv_post(g->r->srv, temporary_pot_opened, g);
}

static int append_text(generation *g, const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *t = realloc(g->doc_text, g->doc_len + n + 1);
    if (!t) return -1;
    g->doc_text = t;
    g->doc_len += (size_t)sprintf(t + g->doc_len, "%s%s\n\n", a, b);
    return 0;
}

static int start_temporary_pot(server *s, generation *g, api_error *e) {
    api_gen_request *q = &g->req;
    engine_pot_settings *ps = &g->tmp_settings;
    *ps = engine_pot_settings_default();
    ps->budget_tokens = (int32_t)s->cfg.budget_tokens;
    ps->policy = s->cfg.policy;
    ps->plain = !q->chat;
    if (!strcmp(ps->policy, "none")) ps->policy = "infinipot"; /* none cannot read what does not fit */
    int rc = 0;
    if (q->chat) {
        size_t last = q->n_messages;
        while (last > 0 && strcmp(q->messages[last - 1].role, "user")) last--;
        if (last == 0) last = q->n_messages;
        g->question_at = last - 1;
        for (size_t i = 0; !rc && i < g->question_at; i++) {
            if (!strcmp(q->messages[i].role, "system") && !ps->system) {
                ps->system = q->messages[i].content;
                continue;
            }
            char role[32];
            snprintf(role, sizeof role, "%s: ", q->messages[i].role);
            rc = append_text(g, role, q->messages[i].content);
        }
    } else {
        size_t n = strlen(q->prompt), cut = n > COMPLETION_TAIL_BYTES ? n - COMPLETION_TAIL_BYTES : 0;
        while (cut > 0 && ((unsigned char)q->prompt[cut] & 0xC0) == 0x80) cut--; /* a character boundary */
        g->doc_text = strndup(q->prompt, cut);
        g->doc_len = cut;
        g->tail = q->prompt + cut;
        rc = g->doc_text ? 0 : -1;
    }
    if (rc) return api_fail(e, 500, NULL, NULL, "out of memory");
    g->tmp_memory = engine_doc_memory(s->eng, ps);
    if (s->pot_memory + g->tmp_memory > (size_t)s->cfg.pot_memory_limit)
        return api_fail(e, 429, "insufficient_memory", NULL,
                        "the prompt exceeds the window and no pot memory is free to read it");
    s->pot_memory += g->tmp_memory;
    request_ref(g->r); /* until the generation is submitted */
    if (srv_task(s, NULL, open_temporary_pot, g)) {
        s->pot_memory -= g->tmp_memory;
        request_unref(g->r);
        return api_fail(e, 503, "unavailable", NULL, "the server is shutting down");
    }
    return 0;
}

/* ---- a question after the upload: re-read the document guided by it ------------------
 * The session's document is read again from its chunk log through a FINCH
 * pot scored by the question (the session's budget and keep), and the
 * question is answered from that pot instead of the session's. Streamed
 * requests get the SSE comment ": reread DONE/TOTAL bytes" after each piece,
 * so clients that wait for bytes do not time out. */

static void reread_progress(server *s, void *user, uint64_t done, uint64_t total) {
    (void)s;
    generation *g = user;
    if (!g->req.stream || !g->r->conn) return;
    char line[96];
    int n = snprintf(line, sizeof line, ": reread %llu/%llu bytes\n\n", (unsigned long long)done,
                     (unsigned long long)total);
    stream_write(g->r, line, (size_t)n);
}

static void reread_failed(server *s, generation *g, int status, const char *msg) {
    request *r = g->r;
    api_error e;
    api_fail(&e, status, "reread_failed", NULL, "re-reading the session's document failed: %s", msg);
    s->pot_memory -= g->tmp_memory;
    g->tmp_memory = 0;
    if (g->stream_started) {
        if (r->conn) {
            sse_send(r, api_error_json(&e));
            stream_write(r, "data: [DONE]\n\n", 14);
        }
        stream_end(r);
    } else {
        respond_error(r, &e);
    }
}

static void reread_done(server *s, void *user, engine_doc *doc, const reread_stats *st, const char *err) {
    generation *g = user;
    request *r = g->r;
    g->reread_st = *st;
    if (!doc) {
        reread_failed(s, g, 500, err);
        return request_unref(r);
    }
    g->tmp_doc = doc; /* released with the generation (on_done_event) */
    api_gen_request *q = &g->req;
    char msg[256];
    free(g->prompt);
    g->prompt = engine_doc_prompt(doc, q->messages, q->n_messages, q->chat ? NULL : q->prompt ? q->prompt : "",
                                  &g->n_prompt, msg, sizeof msg);
    if (!g->prompt) {
        if (srv_task(s, doc, close_doc_task, doc)) engine_doc_close(doc);
        g->tmp_doc = NULL;
        reread_failed(s, g, 400, msg);
        return request_unref(r);
    }
    if (q->stream && r->conn) {
        char line[128];
        int n = snprintf(line, sizeof line, ": reread done: %lld tokens in %.1f s\n\n", (long long)st->tokens,
                         st->ms / 1e3);
        stream_write(r, line, (size_t)n);
    }
    g->deadline_ms = srv_now_ms() + (double)s->cfg.request_timeout * 1e3; /* the answer's own time */
    submit(s, g);
    request_unref(r);
}

/* The question a re-read is guided by: the last user message (chat), the
 * prompt (completions). */
static const char *reread_question(const api_gen_request *q) {
    if (!q->chat) return q->prompt;
    for (size_t i = q->n_messages; i > 0; i--)
        if (!strcmp(q->messages[i - 1].role, "user")) return q->messages[i - 1].content;
    return NULL;
}

static int start_reread(server *s, generation *g, api_error *e) {
    api_gen_request *q = &g->req;
    const char *question = reread_question(q);
    if (!question || !*question)
        return api_fail(e, 400, "invalid_value", q->chat ? "messages" : "prompt",
                        "reread needs a question: a user message (chat) or a text prompt");
    engine_pot_settings *ps = &g->tmp_settings;
    *ps = g->ss->settings.pot;
    ps->policy = "finch";
    ps->question = question;
    ps->finch_keep = 0;
    ps->no_catalyst = 0;
    ps->original_positions = 0;
    ps->record_tokens = 0;
    size_t mem = engine_doc_memory(s->eng, ps);
    if (s->pot_memory + mem > (size_t)s->cfg.pot_memory_limit)
        return api_fail(e, 429, "insufficient_memory", NULL, "no pot memory is free to re-read the document");
    if (reread_start(s, g->ss, ps, &g->cancel, reread_progress, reread_done, g, e)) return -1;
    s->pot_memory += mem;
    g->tmp_memory = mem;
    g->rereading = 1;
    request_ref(g->r); /* until reread_done */
    if (q->stream) {
        if (!stream_start(g->r)) {
            g->stream_started = 1;
            static const char started[] = ": reread started\n\n";
            stream_write(g->r, started, sizeof started - 1);
        }
    } else {
        request_suspend(g->r);
    }
    return 0;
}

void route_generate(request *r, int chat) {
    server *s = r->srv;
    api_error e;
    generation *g = calloc(1, sizeof *g);
    if (!g) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    g->r = r;
    r->gen = g;
    if (api_parse_gen_request(r->body, r->body_len, chat, s->info.n_vocab, &g->req, &e))
        return respond_error(r, &e);
    api_gen_request *q = &g->req;
    const char *sid = q->session;
    if (!sid) sid = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Session-Id");
    if (sid) {
        snprintf(r->session_id, sizeof r->session_id, "%s", sid);
        g->ss = session_find(s, sid, r->key);
        if (!g->ss) {
            api_fail(&e, 404, "session_not_found", "session", "no session '%s'", sid);
            return respond_error(r, &e);
        }
        session_ref(g->ss);
        if (g->ss->status == SESSION_FAILED) {
            api_fail(&e, 409, "session_failed", "session", "the session failed: %s", g->ss->fail_msg);
            return respond_error(r, &e);
        }
        if (g->ss->rebuilding || !g->ss->doc) {
            api_fail(&e, 409, "session_busy", "session", "the session is being restored; retry");
            return respond_error(r, &e);
        }
        if (q->reread > 0 || (q->reread < 0 && g->ss->settings.reread)) {
            random_id(g->id, sizeof g->id, chat ? "chatcmpl-" : "cmpl-");
            g->created = (int64_t)time(NULL);
            if (q->logprobs && !q->stream)
                g->logprobs = chat ? json_array()
                                   : json_pack("{s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs");
            if (start_reread(s, g, &e)) return respond_error(r, &e);
            return;
        }
        char err[256];
        g->prompt = engine_doc_prompt(g->ss->doc, q->messages, q->n_messages,
                                      chat ? NULL : q->prompt ? q->prompt : "", &g->n_prompt, err,
                                      sizeof err);
        if (!g->prompt) {
            api_fail(&e, 400, "invalid_value", chat ? "messages" : "prompt", "%s", err);
            return respond_error(r, &e);
        }
    } else if (q->reread > 0) {
        api_fail(&e, 400, "invalid_value", "reread", "reread needs a session: the document it re-reads");
        return respond_error(r, &e);
    } else if (plain_prompt(s, g, &e)) {
        return respond_error(r, &e);
    }
    int32_t n_ctx = s->info.n_ctx_train;
    int overflow = 0;
    if (!g->ss && g->n_prompt + (q->params.max_tokens > 0 ? (size_t)q->params.max_tokens : 1) > (size_t)n_ctx) {
        if (q->overflow_error || (!chat && q->prompt_tokens)) {
            api_fail(&e, 400, "context_length_exceeded", chat ? "messages" : "prompt",
                     "the prompt has %zu tokens and max_tokens %d; the model's window is %d tokens "
                     "(create a session and upload long documents to read them through a pot)",
                     g->n_prompt, q->params.max_tokens, n_ctx);
            return respond_error(r, &e);
        }
        overflow = 1;
    }
    random_id(g->id, sizeof g->id, chat ? "chatcmpl-" : "cmpl-");
    g->created = (int64_t)time(NULL);
    g->deadline_ms = srv_now_ms() + (double)s->cfg.request_timeout * 1e3;
    if (q->logprobs && !q->stream)
        g->logprobs = chat ? json_array() : json_pack("{s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs");
    if (overflow) {
        if (start_temporary_pot(s, g, &e)) return respond_error(r, &e);
        request_suspend(r);
        return;
    }
    submit(s, g);
}

/* Called when the client disconnects or the server drains. */
void generation_cancel(generation *g) { atomic_store(&g->cancel, 1); }
