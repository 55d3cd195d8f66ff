/* /v1/chat/completions and /v1/completions: validate, build the prompt (after
 * a session's pot or alone), hand it to the engine thread, and turn the text
 * it streams back into one OpenAI response or SSE chunks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/common.h"
#include "server/recall.h"
#include "server/reread.h"
#include "server/server_internal.h"

/* One of the answers (OpenAI's choices: n per prompt, prompts of a batch). */
typedef struct choice {
    generation *g;
    int index;
    char *text;
    size_t len, cap;
    json_t *logprobs; /* chat: array of token entries; completions: {tokens, token_logprobs, top_logprobs} */
    size_t lp_sent;   /* /v1/responses streamed: the entries its deltas have sent */
    size_t chars;     /* characters of its text so far (echo included): completions' text_offset */
    double lp_sum;    /* its tokens' log-probabilities summed (best_of compares the answers by them) */
    size_t text_sent; /* a stream with tools (auto): the bytes of its text sent so far (stream_ready_text) */
    VEC(size_t) lp_end; /* a stream with tools: where each logprobs entry's token ends in text (SIZE_MAX:
                           its character is not whole yet, it ends with the next text) */
    /* a stream's first call, streamed as it is written (stream_first_call): opened (its ids and name
       sent), the bytes of its arguments sent, its output item's index (/v1/responses: 1 when the
       message item was open before it) */
    int call_open;
    size_t args_sent;
    int call_index;
    char call_id[48], fc_id[48];
    engine_gen_result res;
    int done, rc;
    int timed_out; /* request_timeout passed before its first token (rc is then -1) */
    char err[256];
} choice;

/* A prompt as echo repeats it: its text, and (logprobs asked) each of its
 * tokens' log-probability given those before it (lp[0]: none). */
typedef struct echo_prompt {
    char *text;
    size_t len;
    sample_logprobs *lp;
    int bos_added; /* its first token is the BOS its text was given (not in its text) */
} echo_prompt;

/* A prompt of a batch (/v1/completions with a list of prompts) after the first. */
typedef struct batch_prompt {
    int32_t *ids;
    size_t n;
} batch_prompt;

struct generation {
    request *r;
    session *ss;
    api_gen_request req;
    int32_t *prompt; /* the (first) prompt */
    size_t n_prompt;
    batch_prompt *batch; /* prompts 1.. of a batch */
    size_t n_batch;      /* prompts in all (1 without a batch) */
    char id[48];
    int64_t created;
    choice *choices;     /* n_batch * n, prompt-major */
    int n_choices, n_done, n_submitted;
    /* /v1/responses: the original body (echoed), the output message's id, the
       stream's events */
    json_t *responses;
    char msg_id[48];
    response_events ev;
    json_t *output; /* its output items once the answer is done (responses_output) */
    json_t *history; /* stored with the answer: {messages, items} (NULL: not stored) */
    int count_only;  /* POST /v1/responses/input_tokens: the prompt's tokens counted, nothing generated */
    int message_open;     /* a stream with tools: its message item is open (stream_ready_text) */
    int seqs;                 /* sequences it decodes: choices × prompts (what max_answers counts) */
    int rereading_asked, recall_asked; /* decided before the prompt was tokenized (prompt_work) */
    api_error prep_err;       /* prompt_work's error (status 0: none) */
    generation *next_waiting; /* in the server's queue of answers waiting their turn */
    atomic_int cancel;
    int client_left;      /* cancelled because the client closed its side: no answer is its due */
    double deadline_ms;   /* request_timeout: the engine ends the generation there (monotonic_ms clock) */
    /* a prompt longer than the window, read through a temporary pot */
    engine_doc *tmp_doc;
    int64_t tmp_tokens;  /* the tokens it read (pinned prefix and document): all are prompt, none cached */
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
    int created_sent; /* a /v1/responses stream's response.created went out while it waited for a turn */
    reread_stats reread_st;
    reread_pot *reread_pot; /* its pot, held until the generation is freed */
    /* a question asked with its document's passages (recall.c); after a re-read
       (recall_after_reread: the question's api_recall mode): over the re-read's pot */
    int recalling, recall_after_reread;
    int recall_auto;        /* recall was chosen by "auto": if it fails, the pot answers alone */
    recall_stats recall_st;
    char *recalled;         /* the question with the passages: what req's question points to */
    /* echo (/v1/completions): each prompt's text and, with logprobs, its tokens' log-probabilities,
       put before each of its answers */
    echo_prompt *echo;      /* [n_batch] */
    int echo_rc;
    char echo_err[256];
    engine_logprob_reader *echo_reader; /* the prompt being read (engine thread), between tasks */
    size_t echo_at;         /* prompts read whole */
};

static void release_temporary_pot(server *s, generation *g);
static void next_turns(server *s);

/* What the engine thread sends for each engine_text_cb call: a piece of
 * text and/or one token's logprobs (n 0: a token whose text is still held
 * back, or is released with a later token's). */
typedef struct text_event {
    choice *c;
    int has_lp;
    sample_logprobs lp;
    size_t n;
    char text[];
} text_event;

typedef struct done_event {
    choice *c;
    int rc;
    engine_gen_result res;
    char err[256];
} done_event;

void generation_free(generation *g) {
    if (g->reread_pot) reread_pot_release(g->reread_pot);
    free(g->recalled);
    free(g->recall_st.chosen);
    free(g->recall_st.text);
    if (g->ss) session_unref(g->ss);
    json_decref(g->responses);
    json_decref(g->output);
    json_decref(g->history);
    free(g->doc_text);
    api_gen_request_free(&g->req);
    free(g->prompt);
    for (size_t i = 1; i < g->n_batch; i++) free(g->batch[i].ids);
    free(g->batch);
    for (size_t p = 0; g->echo && p < g->n_batch; p++) {
        free(g->echo[p].text);
        free(g->echo[p].lp);
    }
    free(g->echo);
    for (int i = 0; i < g->n_choices; i++) {
        free(g->choices[i].text);
        json_decref(g->choices[i].logprobs);
        free(g->choices[i].lp_end.v);
    }
    free(g->choices);
    free(g);
}

void random_id(char *out, size_t cap, const char *prefix) { api_random_id(out, cap, prefix); }

/* {token, logprob, bytes}: bytes are the token's own piece (joined over a
 * choice's entries, the UTF-8 of its text). */
static json_t *token_json(server *s, int32_t tok, float logprob) {
    char small[256], *buf = small;
    int n = engine_token_text(s->eng, tok, buf, sizeof small);
    if (n < 0) n = 0;
    if ((size_t)n > sizeof small) { /* a long piece */
        buf = malloc((size_t)n);
        if (buf) engine_token_text(s->eng, tok, buf, (size_t)n);
        else buf = small, n = (int)sizeof small;
    }
    json_t *bytes = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(bytes, json_integer((unsigned char)buf[i]));
    json_t *str = api_piece_json(buf, (size_t)n);
    if (buf != small) free(buf);
    if (!str) str = json_string("");
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

/* A completions logprobs object, empty. */
static json_t *completion_logprobs_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* Adds one token; offset: where its text starts in the choice's text, in characters. */
static void completion_logprob_add(server *s, json_t *acc, const sample_logprobs *lp, size_t offset) {
    json_t *t = token_json(s, lp->token, lp->logprob), *top = json_object();
    json_array_append(json_object_get(acc, "tokens"), json_object_get(t, "token"));
    json_array_append_new(json_object_get(acc, "token_logprobs"), json_real(lp->logprob));
    json_array_append_new(json_object_get(acc, "text_offset"), json_integer((json_int_t)offset));
    for (int i = 0; i < lp->n_top; i++) {
        json_t *alt = token_json(s, lp->top_tokens[i], lp->top_logprobs[i]);
        json_object_set(top, json_string_value(json_object_get(alt, "token")),
                        json_object_get(alt, "logprob"));
        json_decref(alt);
    }
    json_array_append_new(json_object_get(acc, "top_logprobs"), top);
    json_decref(t);
}

/* Adds a prompt's tokens to a completions logprobs object: the first token
 * with null log-probability and alternatives, as OpenAI's echo shows it. */
static void echo_logprobs_add(server *s, json_t *acc, const echo_prompt *ep, const int32_t *ids, size_t n) {
    size_t offset = 0;
    for (size_t t = 0; t < n; t++) {
        if (t == 0) {
            json_t *tok = token_json(s, ids[0], 0.0f);
            json_array_append(json_object_get(acc, "tokens"), json_object_get(tok, "token"));
            json_array_append_new(json_object_get(acc, "token_logprobs"), json_null());
            json_array_append_new(json_object_get(acc, "top_logprobs"), json_null());
            json_array_append_new(json_object_get(acc, "text_offset"), json_integer(0));
            json_decref(tok);
        } else {
            completion_logprob_add(s, acc, &ep->lp[t], offset);
        }
        if (t == 0 && ep->bos_added) continue; /* (not in the text) */
        char piece[256];
        int k = engine_token_text(s->eng, ids[t], piece, sizeof piece);
        offset += k > 0 ? utf8_chars(piece, (size_t)k < sizeof piece ? (size_t)k : sizeof piece) : 0;
    }
}

/* Usage over every choice: each prompt counted once (its n answers share it). */
static json_t *usage_json(const generation *g) {
    int64_t prompt = 0, generated = 0, cached = 0;
    int n = g->req.n_choices;
    for (int i = 0; i < g->n_choices; i++) {
        const engine_gen_result *res = &g->choices[i].res;
        if (i % n == 0) prompt += res->n_prompt + res->n_cached, cached += res->n_cached;
        generated += res->n_generated;
    }
    if (g->tmp_tokens) { /* read through a temporary pot: every token of the prompt was read now */
        prompt += g->tmp_tokens - cached;
        cached = 0;
    }
    return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)prompt,
                     "completion_tokens", (json_int_t)generated, "total_tokens",
                     (json_int_t)(prompt + generated), "prompt_tokens_details",
                     "cached_tokens", (json_int_t)cached);
}

static const char *model_name(const generation *g) {
    return g->r->srv->model_id;
}

/* system_fingerprint: this build (compile time of this file) and the model
 * (name, parameter count, vocabulary, quantization), hashed (FNV-1a) once. */
static const char *system_fingerprint(server *s) {
    static char fp[32];
    if (*fp) return fp;
    char text[512];
    snprintf(text, sizeof text, "%s %s|%s|%llu|%d|%s|%s", __DATE__, __TIME__, s->model_id,
             (unsigned long long)s->info.n_params, s->info.n_vocab, s->info.quant ? s->info.quant : "",
             s->info.arch ? s->info.arch : "");
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = text; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    snprintf(fp, sizeof fp, "fp_%012llx", (unsigned long long)(h & 0xffffffffffffull));
    return fp;
}

/* The finish_reason of a finished choice. */
static const char *finish_reason(const choice *c) { return api_finish_reason(c->res.finish); }

/* Where a request error about the prompt points. */
static const char *prompt_param(const generation *g) { return g->req.chat ? "messages" : "prompt"; }

/* The error of a failed choice: 503 request_timeout when the deadline came
 * before its first token (queued behind other work, or a long prefill);
 * 400 context_length_exceeded when the prompt does not fit beside the pot;
 * else `status` generation_failed about `param`. */
static void choice_error(const choice *c, int status, const char *param, api_error *e) {
    if (c->timed_out)
        api_fail(e, 503, "request_timeout", NULL,
                 "no token within request_timeout (%lld s): the engine was busy (queued work or a long prompt); retry later",
                 (long long)c->g->r->srv->cfg.request_timeout);
    else if (!strncmp(c->err, ENGINE_ERR_PROMPT_TOO_LONG, strlen(ENGINE_ERR_PROMPT_TOO_LONG)))
        api_fail(e, 400, "context_length_exceeded", param, "%s", c->err);
    else api_fail(e, status, "generation_failed", param, "%s", c->err);
}

/* A question's own pot (a re-read's or a long prompt's) that finds no pot memory free is a 429
 * whose Retry-After is short: that memory is held mostly by other questions' pots, each freed
 * when its answer ends, which the server cannot time. */
#define QUESTION_POT_RETRY_SECONDS 5

static void respond_question_error(request *r, const api_error *e) {
    if (e->status == 429) return respond_retry(r, e, QUESTION_POT_RETRY_SECONDS);
    respond_error(r, e);
}

/* One SSE chunk of choice `index`: a text delta (text != NULL), the role
 * opener, or the finish. */
static json_t *chunk_json(const generation *g, int index, const char *text, size_t n, int role,
                          const char *finish, json_t *logprobs) {
    json_t *choice;
    json_t *str = text ? json_stringn(text, n) : NULL;
    if (text && !str) str = json_string("");
    if (g->req.chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (role && !text) json_object_set_new(delta, "content", json_string(""));
        if (str) json_object_set_new(delta, "content", str);
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta, "logprobs",
                           logprobs ? json_pack("{s:o}", "content", logprobs) : json_null(),
                           "finish_reason", finish ? json_string(finish) : json_null());
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "text", str ? str : json_string(""),
                           "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
                           finish ? json_string(finish) : json_null());
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o]}", "id", g->id, "object",
                          g->req.chat ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)g->created, "model", model_name(g), "system_fingerprint",
                          system_fingerprint(g->r->srv), "choices", choice);
    if (g->ss) json_object_set_new(o, "session", json_string(g->ss->id)); /* as the whole answer says it */
    return o;
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

static void client_left(generation *g);

/* Whether what r's stream writes is read: by its client, or (a background
 * response's request) by the event log its followers read. */
static int streams_to(const request *r) { return r->conn || r->bg; }

/* Tool calls are parsed from the whole text, so a request that may call a
 * tool streams its answer only once it is complete. */
static int tools_active(const generation *g) { return g->req.tools && g->req.tool_choice != TOOL_CHOICE_NONE; }

static void append_text(choice *c, const char *text, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = (c->len + n + 1) * 2;
        char *t = realloc(c->text, cap);
        if (!t) return; /* dropped: the answer is cut short */
        c->text = t;
        c->cap = cap;
    }
    memcpy(c->text + c->len, text, n);
    c->len += n;
    c->text[c->len] = 0;
}

/* One event of a /v1/responses stream (takes data; adds its type and number). */
static void responses_event(response_events *ev, const char *type, json_t *data) {
    json_object_set_new(data, "type", json_string(type));
    json_object_set_new(data, "sequence_number", json_integer(ev->seq));
    if (ev->seq++ <= ev->skip_through) return json_decref(data);
    stream_write(ev->r, "event: ", 7);
    stream_write(ev->r, type, strlen(type));
    stream_write(ev->r, "\n", 1);
    sse_send(ev->r, data);
}


/* OpenAI's Responses error event: code, message and param at its top (a chat
 * stream's error is {"error": {...}}, which the SDK's ResponseErrorEvent refuses). */
static void responses_error_event(response_events *ev, const api_error *e) {
    responses_event(ev, "error", json_pack("{s:s?, s:s, s:s?}", "code", e->code, "message", e->message, "param",
                                           e->param));
}

static void responses_item_added(response_events *ev, int index, json_t *item);
static json_t *delta_chunk(const generation *g, int index, json_t *delta);

/* The logprobs entries (new references, in an array) of the tokens whose text ends
 * within the first `upto` bytes and were not sent yet; NULL without logprobs. */
static json_t *released_logprobs(choice *c, size_t upto) {
    if (!c->logprobs) return NULL;
    json_t *lp = json_array();
    while (c->lp_sent < c->lp_end.n && c->lp_end.v[c->lp_sent] <= upto)
        json_array_append(lp, json_array_get(c->logprobs, c->lp_sent++));
    return lp;
}

/* A stream with tools (auto) sends the answer's text as it comes, as far as it
 * is surely not the start of a call (chat: content deltas; /v1/responses: the
 * message item, opened at its first text); the calls are parsed at the end. */
static void stream_ready_text(choice *c) {
    generation *g = c->g;
    size_t ready = api_tool_text_ready(&g->req, c->text, c->len);
    if (ready <= c->text_sent) return;
    if (!g->responses) {
        sse_send(g->r, chunk_json(g, c->index, c->text + c->text_sent, ready - c->text_sent, 0, NULL,
                                  released_logprobs(c, ready)));
    } else {
        if (!g->message_open) {
            json_t *open = responses_message(g->msg_id, "in_progress", NULL);
            responses_item_added(&g->ev, 0, open);
            json_decref(open);
            g->message_open = 1;
        }
        json_t *lp = released_logprobs(c, ready);
        responses_event(&g->ev, "response.output_text.delta",
                        json_pack("{s:s, s:i, s:i, s:o, s:o}", "item_id", g->msg_id, "output_index", 0,
                                  "content_index", 0, "delta", json_stringn(c->text + c->text_sent, ready - c->text_sent),
                                  "logprobs", lp ? lp : json_array()));
    }
    c->text_sent = ready;
}

/* A stream's first call as it is written (forced by tool_choice required or
 * named, or written by the model with auto): its id and name once the name is
 * sure, then its arguments as they come (chat: tool_calls deltas; /v1/responses:
 * the function_call item's events). The answer's end sends the rest
 * (send_tool_calls, responses_item_done) and any further calls whole. */
static void stream_first_call(choice *c) {
    generation *g = c->g;
    size_t at, n;
    int whole;
    const char *name = api_call_progress(&g->req, c->text, c->len, &at, &n, &whole);
    if (!name) return;
    if (!c->call_open) {
        c->call_index = g->responses && g->message_open; /* (after the message item its text opened) */
        random_id(c->call_id, sizeof c->call_id, "call_");
        if (!g->responses) {
            sse_send(g->r, delta_chunk(g, c->index, json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls",
                                                              "index", 0, "id", c->call_id, "type", "function",
                                                              "function", "name", name, "arguments", "")));
        } else {
            random_id(c->fc_id, sizeof c->fc_id, "fc_");
            json_t *item = json_pack("{s:s, s:s, s:s, s:s, s:s}", "type", "function_call", "id", c->fc_id, "call_id",
                                     c->call_id, "name", name, "arguments", "");
            responses_item_added(&g->ev, c->call_index, item);
            json_decref(item);
        }
        c->call_open = 1;
    }
    json_t *d = n > c->args_sent ? json_stringn(c->text + at + c->args_sent, n - c->args_sent) : NULL;
    if (!d) return; /* (nothing new, or a character not whole yet: with the next text) */
    if (!g->responses)
        sse_send(g->r, delta_chunk(g, c->index, json_pack("{s:[{s:i, s:{s:o}}]}", "tool_calls", "index", 0,
                                                          "function", "arguments", d)));
    else
        responses_event(&g->ev, "response.function_call_arguments.delta",
                        json_pack("{s:s, s:i, s:o}", "item_id", c->fc_id, "output_index", c->call_index, "delta", d));
    c->args_sent = n;
}

/* The answer's calls as its stream sent them: the first, when streamed as it
 * was written, with the id it was sent with and its arguments as written (also
 * when max_tokens cut it, or cut it so that the answer's calls lost it: then it
 * is the only one). Takes calls (may be NULL); NULL when there are none. */
static json_t *calls_as_streamed(choice *c, json_t *calls) {
    if (!c->call_open) return calls;
    generation *g = c->g;
    size_t at, n;
    int whole;
    const char *name = api_call_progress(&g->req, c->text, c->len, &at, &n, &whole);
    if (!name) return calls; /* (cannot be: it was sent) */
    if (!calls) calls = json_array();
    json_t *first = json_array_get(calls, 0);
    const char *had = json_string_value(json_object_get(json_object_get(first, "function"), "name"));
    if (!first || !had || strcmp(had, name)) { /* cut (or not parsed as a call after all): as far as it came */
        json_array_clear(calls);
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", c->call_id, "type", "function",
                                               "function", "name", name, "arguments", ""));
        first = json_array_get(calls, 0);
    }
    json_object_set_new(first, "id", json_string(c->call_id));
    json_t *args = json_stringn(c->text + at, n);
    json_object_set_new(json_object_get(first, "function"), "arguments", args ? args : json_string(""));
    return calls;
}

/* Of the content an answer with calls gets (its text around them, trimmed), the bytes
 * stream_ready_text sent: what it sent, less the whitespace the answer began with. */
static size_t content_sent(const choice *c) {
    size_t lead = 0;
    while (lead < c->text_sent && strchr(" \t\r\n", c->text[lead])) lead++;
    return c->text_sent - lead;
}

/* The answer's "reread" object. */
static json_t *reread_json(const reread_stats *st) {
    return json_pack("{s:I, s:I, s:f, s:f, s:I, s:i, s:i}", "bytes", (json_int_t)st->bytes, "tokens",
                     (json_int_t)st->tokens, "seconds", st->ms / 1e3, "log_seconds", st->log_ms / 1e3, "pass",
                     (json_int_t)st->pass, "questions", st->questions, "pots", st->pots);
}

/* The answer's "recall" object: where each passage is in the document and its text. */
static json_t *recall_json(const recall_stats *st) {
    json_t *spans = json_array(), *texts = json_array();
    for (int i = 0; spans && texts && st->chosen && st->text && i < st->passages; i++) {
        const recall_passage *p = &st->chosen[i];
        json_array_append_new(spans, json_pack("[I, I]", (json_int_t)p->start, (json_int_t)(p->start + p->len)));
        json_array_append_new(texts, api_text_json(st->text + p->at, p->len));
    }
    return json_pack("{s:i, s:i, s:I, s:I, s:f, s:f, s:o*, s:o*}", "passages", st->passages, "candidates",
                     st->candidates, "bytes", (json_int_t)st->bytes, "document_bytes", (json_int_t)st->document_bytes,
                     "seconds", st->ms / 1e3, "log_seconds", st->log_ms / 1e3, "spans", spans, "texts", texts);
}

/* The response object as it stands (status given; output and usage once done). */
static json_t *responses_now(generation *g, const char *status, int with_output);

static void on_text_event(server *s, void *arg) {
    text_event *ev = arg;
    choice *c = ev->c;
    generation *g = c->g;
    request *r = g->r;
    /* a half-closed client still reads: a stream's writes succeed, and only a look at the
       socket (EOF) tells it left; the engine stops at its next step */
    if (!g->client_left && request_client_gone(r)) client_left(g);
    if (g->client_left) {
        free(ev);
        return;
    }
    if (g->responses && g->req.stream && !tools_active(g)) {
        append_text(c, ev->text, ev->n);
        /* a token whose text is held back (a character not yet whole) has its logprobs sent with
           the next delta */
        if (ev->has_lp && c->logprobs) json_array_append_new(c->logprobs, chat_logprob_entry(s, &ev->lp));
        json_t *d = ev->n ? json_stringn(ev->text, ev->n) : NULL;
        if (streams_to(r) && d) {
            size_t from = c->lp_sent, to = json_array_size(c->logprobs);
            json_t *lp = json_array();
            for (size_t i = from; i < to; i++) json_array_append(lp, json_array_get(c->logprobs, i));
            c->lp_sent = to;
            responses_event(&g->ev, "response.output_text.delta",
                            json_pack("{s:s, s:i, s:i, s:o, s:o}", "item_id", g->msg_id, "output_index", 0,
                                      "content_index", 0, "delta", d, "logprobs", lp));
        } else {
            json_decref(d);
        }
    } else if (g->req.stream && !tools_active(g)) {
        json_t *lp = NULL;
        if (ev->has_lp && g->req.chat) {
            lp = json_array();
            json_array_append_new(lp, chat_logprob_entry(s, &ev->lp));
        } else if (ev->has_lp) {
            lp = completion_logprobs_new();
            completion_logprob_add(s, lp, &ev->lp, c->chars);
        }
        c->chars += utf8_chars(ev->text, ev->n);
        if (r->conn) sse_send(r, chunk_json(g, c->index, ev->text, ev->n, 0, NULL, lp));
        else json_decref(lp);
    } else {
        size_t at = c->chars; /* (where this token's text starts) */
        if (ev->has_lp) c->lp_sum += ev->lp.logprob;
        append_text(c, ev->text, ev->n);
        c->chars += utf8_chars(ev->text, ev->n);
        if (g->req.stream) /* where the held-back tokens' text ends, and this token's */
            for (size_t i = c->lp_end.n; ev->n && i-- > 0 && c->lp_end.v[i] == SIZE_MAX;) c->lp_end.v[i] = c->len;
        if (ev->has_lp && c->logprobs) {
            if (g->req.chat) json_array_append_new(c->logprobs, chat_logprob_entry(s, &ev->lp));
            else completion_logprob_add(s, c->logprobs, &ev->lp, at);
            if (g->req.stream) vec_push(&c->lp_end, ev->n ? c->len : SIZE_MAX);
        }
        if (g->req.stream && streams_to(r)) {
            stream_ready_text(c);
            stream_first_call(c);
        }
    }
    free(ev);
}

/* A chunk of choice `index` whose delta is the given object. */
static json_t *delta_chunk(const generation *g, int index, json_t *delta) {
    json_t *ch = chunk_json(g, index, NULL, 0, 0, NULL, NULL);
    json_object_set_new(json_array_get(json_object_get(ch, "choices"), 0), "delta", delta);
    return ch;
}

/* Streams calls as OpenAI does: each call's id and name with empty
 * arguments, then its arguments. */
static void send_tool_calls(choice *c, json_t *calls) {
    generation *g = c->g;
    request *r = g->r;
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *fn = json_object_get(call, "function");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        size_t from = i == 0 && c->call_open ? c->args_sent : 0; /* (the first: sent as it came) */
        if (!(i == 0 && c->call_open))
            sse_send(r, delta_chunk(g, c->index, json_pack("{s:[{s:i, s:O, s:s, s:{s:O, s:s}}]}", "tool_calls",
                                                           "index", (int)i, "id", json_object_get(call, "id"), "type",
                                                           "function", "function", "name", json_object_get(fn, "name"),
                                                           "arguments", "")));
        if (!from || strlen(args) > from)
            sse_send(r, delta_chunk(g, c->index, json_pack("{s:[{s:i, s:{s:s}}]}", "tool_calls", "index", (int)i,
                                                           "function", "arguments", args + from)));
    }
}

/* An answer with calls ends "tool_calls", unless max_tokens cut it ("length":
 * a call may be missing, as OpenAI says then). */
static const char *tool_answer_finish(const json_t *calls, const char *finish) {
    return json_array_size(calls) && strcmp(finish, "length") ? "tool_calls" : finish;
}

/* Streams the buffered answer of a request with tools: its calls, a forced
 * call cut short as far as it came, or its text. Returns the finish_reason. */
static const char *stream_tool_answer(choice *c, const char *finish) {
    generation *g = c->g;
    request *r = g->r;
    char *content = NULL;
    const char *text = c->text ? c->text : "";
    json_t *calls = api_find_tool_calls(&g->req, text, c->len, &content);
    if (!calls && !c->call_open) {
        json_t *cut = api_cut_tool_call(&g->req, text, c->len);
        if (cut) send_tool_calls(c, cut);
        else if (c->len > c->text_sent)
            sse_send(r, chunk_json(g, c->index, c->text + c->text_sent, c->len - c->text_sent, 0, NULL,
                                   released_logprobs(c, SIZE_MAX)));
        json_decref(cut);
        return finish;
    }
    calls = calls_as_streamed(c, calls);
    size_t sent = content_sent(c); /* (the stream may carry whitespace the answer began with) */
    if (content && strlen(content) > sent) {
        /* the text before the first call with its tokens' logprobs (the calls' markup has none here) */
        json_t *chunk = delta_chunk(g, c->index, json_pack("{s:s}", "content", content + sent));
        json_t *lp = released_logprobs(c, api_tool_text_ready(&g->req, text, c->len));
        if (lp) json_object_set_new(json_array_get(json_object_get(chunk, "choices"), 0), "logprobs",
                                    json_pack("{s:o}", "content", lp));
        sse_send(r, chunk);
    }
    free(content);
    send_tool_calls(c, calls);
    const char *said = tool_answer_finish(calls, finish);
    json_decref(calls);
    return said;
}

/* A choice of a stream ended: its last chunk (or the error). */
static void stream_choice_done(choice *c) {
    generation *g = c->g;
    request *r = g->r;
    if (c->rc) {
        api_error e;
        choice_error(c, 500, prompt_param(g), &e);
        return sse_send(r, api_error_json(&e));
    }
    const char *finish = finish_reason(c);
    if (tools_active(g)) finish = stream_tool_answer(c, finish);
    sse_send(r, chunk_json(g, c->index, NULL, 0, 0, finish, NULL));
}

/* The status of a finished /v1/responses generation. */
static const char *responses_status(generation *g) {
    return background_final_status(g->r, strcmp(finish_reason(&g->choices[0]), "length") ? "completed" : "incomplete");
}

/* The finished answer's output items, made once (the stream's events and the
 * response object name the same ids): its message, then a function_call item
 * for each tool call; with calls, the message only when text came with them. */
static json_t *responses_output(generation *g) {
    if (g->output) return g->output;
    choice *c = &g->choices[0];
    const char *text = c->text ? c->text : "", *status = responses_status(g);
    /* an item is in_progress, completed or incomplete (the SDK's types): a cancelled or failed
       response's items are incomplete */
    if (strcmp(status, "completed") && strcmp(status, "in_progress")) status = "incomplete";
    char *content = NULL;
    json_t *calls = tools_active(g) ? api_find_tool_calls(&g->req, text, c->len, &content) : NULL;
    if (!calls && tools_active(g) && !c->call_open) calls = api_cut_tool_call(&g->req, text, c->len); /* cut short */
    calls = calls_as_streamed(c, calls);
    json_t *items = json_array(), *msg = NULL;
    if (!calls || content) {
        json_t *t = calls ? json_string(content) : json_stringn(text, c->len);
        msg = responses_message(g->msg_id, status, t ? t : json_string(""));
        /* the tokens' logprobs, when asked for and they are the text's (not a call's markup too) */
        json_object_set_new(json_array_get(json_object_get(msg, "content"), 0), "logprobs",
                            !calls && c->logprobs ? json_incref(c->logprobs) : json_array());
        json_decref(t);
    }
    free(content);
    /* the message first, unless a call streamed as it came opened before it (text after that call) */
    int message_last = c->call_open && c->call_index == 0;
    if (msg && !message_last) json_array_append_new(items, msg);
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        json_t *fn = json_object_get(call, "function");
        char fc_id[48];
        random_id(fc_id, sizeof fc_id, "fc_");
        if (i == 0 && c->call_open) /* streamed as it came: the item id it was sent with */
            snprintf(fc_id, sizeof fc_id, "%s", c->fc_id);
        json_array_append_new(items, json_pack("{s:s, s:s, s:O, s:O, s:O, s:s}", "type", "function_call", "id", fc_id,
                                               "call_id", json_object_get(call, "id"), "name",
                                               json_object_get(fn, "name"), "arguments",
                                               json_object_get(fn, "arguments"), "status", status));
    }
    if (msg && message_last) json_array_append_new(items, msg);
    json_decref(calls);
    return g->output = items;
}

static json_t *responses_now(generation *g, const char *status, int with_output) {
    json_t *output = NULL, *usage = NULL;
    if (with_output) {
        output = json_incref(responses_output(g));
        json_t *chat_usage = usage_json(g);
        usage = responses_usage(chat_usage);
        json_decref(chat_usage);
    }
    json_t *o = responses_object(g->id, g->created, model_name(g), status, output, usage, g->responses);
    if (g->ss) json_object_set_new(o, "session", json_string(g->ss->id));
    if (g->rereading) json_object_set_new(o, "reread", reread_json(&g->reread_st));
    if (g->recalling) json_object_set_new(o, "recall", recall_json(&g->recall_st));
    return o;
}

/* The finished response, stored unless the request said not to, then sent by send. */
static void responses_final(generation *g, void (*send)(request *r, json_t *response)) {
    json_t *o = responses_now(g, responses_status(g), 1);
    if (o) background_final_error(g->r, o);
    if (!o) {
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(g->r, &e);
    }
    responses_keep(g->r, g->history, o, send);
}

/* The events that open an output item (a message: its text part too). */
static void responses_item_added(response_events *ev, int index, json_t *item) {
    json_t *open = json_deep_copy(item);
    json_object_set_new(open, "status", json_string("in_progress"));
    int message = !strcmp(json_string_value(json_object_get(item, "type")), "message");
    if (message) json_object_set_new(open, "content", json_array());
    else json_object_set_new(open, "arguments", json_string(""));
    responses_event(ev, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", index, "item", open));
    if (message)
        responses_event(ev, "response.content_part.added",
                        json_pack("{s:O, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", json_object_get(item, "id"),
                                  "output_index", index, "content_index", 0, "part", "type", "output_text", "text",
                                  "", "annotations"));
}

/* The events that close an output item, after a function call's arguments from byte
 * args_sent on (what a stream sent of them as they came) in one delta. */
static void responses_item_done(response_events *ev, int index, json_t *item, size_t args_sent) {
    json_t *id = json_object_get(item, "id");
    if (!strcmp(json_string_value(json_object_get(item, "type")), "message")) {
        json_t *part = json_array_get(json_object_get(item, "content"), 0);
        json_t *text = json_object_get(part, "text"), *lp = json_object_get(part, "logprobs");
        responses_event(ev, "response.output_text.done",
                        json_pack("{s:O, s:i, s:i, s:O, s:O}", "item_id", id, "output_index", index, "content_index", 0,
                                  "text", text, "logprobs", lp));
        responses_event(ev, "response.content_part.done",
                        json_pack("{s:O, s:i, s:i, s:O}", "item_id", id, "output_index", index, "content_index", 0,
                                  "part", part));
    } else {
        json_t *args = json_object_get(item, "arguments");
        if (!args_sent || json_string_length(args) > args_sent)
            responses_event(ev, "response.function_call_arguments.delta",
                            json_pack("{s:O, s:i, s:s}", "item_id", id, "output_index", index, "delta",
                                      json_string_value(args) + args_sent));
        responses_event(ev, "response.function_call_arguments.done",
                        json_pack("{s:O, s:i, s:O, s:O}", "item_id", id, "output_index", index, "name",
                                  json_object_get(item, "name"), "arguments", args));
    }
    responses_event(ev, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", index, "item", item));
}

/* The events that open a /v1/responses stream; with tools the answer is
 * parsed whole, so its items open only at the end (as chat's tool calls do). */
static void responses_stream_start(generation *g) {
    if (!g->created_sent)
        responses_event(&g->ev, "response.created", json_pack("{s:o}", "response", responses_now(g, "in_progress", 0)));
    responses_event(&g->ev, "response.in_progress", json_pack("{s:o}", "response", responses_now(g, "in_progress", 0)));
    if (tools_active(g)) return;
    json_t *open = responses_message(g->msg_id, "in_progress", NULL);
    responses_item_added(&g->ev, 0, open);
    json_decref(open);
}

/* The last event of a /v1/responses stream, with the response (by its status). */
static void responses_end_event(response_events *ev, json_t *response) {
    const char *status = json_string_value(json_object_get(response, "status"));
    responses_event(ev, !strcmp(status, "completed") ? "response.completed"
                        : !strcmp(status, "failed")  ? "response.failed"
                                                     : "response.incomplete",
                    json_pack("{s:o}", "response", response));
}

static void send_stream_end(request *r, json_t *response) {
    responses_end_event(&r->gen->ev, response);
    stream_end(r);
}

/* A copy of response as a stream's first events give it: in progress, no output yet. */
static json_t *response_head(json_t *response) {
    json_t *head = json_deep_copy(response);
    json_object_set_new(head, "status", json_string("in_progress"));
    json_object_set_new(head, "output", json_array());
    json_object_del(head, "usage");
    json_object_del(head, "error");
    return head;
}

/* The last event, after a response.created when none was written yet. */
static void stream_last_event(response_events *ev, json_t *response) {
    if (!ev->seq) responses_event(ev, "response.created", json_pack("{s:o}", "response", response_head(response)));
    responses_end_event(ev, json_incref(response));
}

void responses_stream_ended(request *r, json_t *response) {
    response_events fresh = {.r = r, .skip_through = -1};
    stream_last_event(r->gen ? &r->gen->ev : &fresh, response);
}

void responses_stream_end_from(request *r, json_t *response, int64_t seq, int64_t skip_through) {
    response_events ev = {.r = r, .seq = seq, .skip_through = skip_through};
    stream_last_event(&ev, response);
    stream_end(r);
}

void responses_replay(request *r, json_t *response, int64_t starting_after) {
    response_events ev = {.r = r, .skip_through = starting_after};
    json_t *head = response_head(response);
    responses_event(&ev, "response.created", json_pack("{s:O}", "response", head));
    responses_event(&ev, "response.in_progress", json_pack("{s:o}", "response", head));
    size_t i;
    json_t *item;
    json_array_foreach(json_object_get(response, "output"), i, item) {
        responses_item_added(&ev, (int)i, item);
        json_t *part = json_array_get(json_object_get(item, "content"), 0);
        if (!strcmp(json_string_value(json_object_get(item, "type")), "message"))
            responses_event(&ev, "response.output_text.delta",
                            json_pack("{s:O, s:i, s:i, s:s, s:o}", "item_id", json_object_get(item, "id"),
                                      "output_index", (int)i, "content_index", 0, "delta",
                                      json_string_value(json_object_get(part, "text")) ? json_string_value(json_object_get(part, "text")) : "", "logprobs",
                                      json_is_array(json_object_get(part, "logprobs"))
                                          ? json_incref(json_object_get(part, "logprobs"))
                                          : json_array()));
        responses_item_done(&ev, (int)i, item, 0);
    }
    if (ev.seq <= starting_after) { /* the client saw more events than this replay has (the live
                                       stream's, no longer kept): it still gets the last one */
        ev.seq = starting_after + 1;
        ev.skip_through = -1;
    }
    responses_end_event(&ev, json_incref(response));
    stream_end(r);
}

/* The events that close it. */
static void responses_stream_end(generation *g) {
    json_t *items = responses_output(g);
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item) {
        if (tools_active(g)) { /* the rest of the message's text, or the whole item */
            json_t *text = json_object_get(json_array_get(json_object_get(item, "content"), 0), "text");
            size_t sent = 0;
            if (text && g->message_open) { /* (raw without calls; trimmed, with) */
                choice *c = &g->choices[0];
                sent = strncmp(json_string_value(text), c->text, c->text_sent) ? content_sent(c) : c->text_sent;
            } else if (!((int)i == g->choices[0].call_index && g->choices[0].call_open)) { /* (its item is open) */
                responses_item_added(&g->ev, (int)i, item);
            }
            if (json_string_length(text) > sent) { /* with its tokens' logprobs: all, or those before a call */
                choice *c = &g->choices[0];
                json_t *lp = released_logprobs(
                    c, json_array_size(items) > 1 ? api_tool_text_ready(&g->req, c->text, c->len) : SIZE_MAX);
                responses_event(&g->ev, "response.output_text.delta",
                                json_pack("{s:s, s:i, s:i, s:s, s:o}", "item_id", g->msg_id, "output_index", (int)i,
                                          "content_index", 0, "delta", json_string_value(text) + sent, "logprobs",
                                          lp ? lp : json_array()));
            }
        }
        choice *c = &g->choices[0];
        responses_item_done(&g->ev, (int)i, item,
                            (int)i == c->call_index && c->call_open ? c->args_sent : 0); /* (sent as it came) */
    }
    responses_final(g, send_stream_end);
}

static void finish_stream(generation *g) {
    request *r = g->r;
    if (g->client_left) { /* never an ending that reads as a whole answer */
        api_error e;
        client_closed_error(&e, "the answer");
        r->close_conn = 1;
        if (g->responses) {
            responses_error_event(&g->ev, &e);
        } else {
            sse_send(r, api_error_json(&e));
            stream_write(r, "data: [DONE]\n\n", 14);
        }
        return stream_end(r);
    }
    if (g->responses && !g->choices[0].rc) return responses_stream_end(g);
    if (g->responses && !r->bg) { /* its error event was sent: a Responses stream ends with no [DONE] */
        json_t *o = responses_now(g, "failed", 0);
        api_error e;
        choice_error(&g->choices[0], 500, "input", &e);
        json_object_set_new(o, "error", responses_error(e.status, e.code, e.message));
        responses_event(&g->ev, "response.failed", json_pack("{s:o}", "response", o));
        return stream_end(r);
    }
    int failed = 0;
    for (int i = 0; i < g->n_choices; i++) failed |= g->choices[i].rc;
    if (r->bg) { /* (a background one: stored as failed, its stream's last event) */
        api_error e;
        choice_error(&g->choices[0], 500, "input", &e);
        return respond_error(r, &e);
    }
    if (g->req.include_usage && !failed) {
        json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:s, s:[], s:o}", "id", g->id, "object",
                              g->req.chat ? "chat.completion.chunk" : "text_completion",
                              "created", (json_int_t)g->created, "model", model_name(g),
                              "system_fingerprint", system_fingerprint(g->r->srv),
                              "choices", "usage", usage_json(g));
        sse_send(r, j);
    }
    stream_write(r, "data: [DONE]\n\n", 14);
    stream_end(r);
}

static json_t *choice_json(choice *c) {
    generation *g = c->g;
    json_t *str = json_stringn(c->text ? c->text : "", c->len);
    if (!str) str = json_string("");
    const char *finish = finish_reason(c);
    json_t *out;
    if (g->req.chat) {
        char *content = NULL;
        const char *text = c->text ? c->text : "";
        json_t *calls = tools_active(g) ? api_find_tool_calls(&g->req, text, c->len, &content) : NULL;
        if (calls) {
            json_decref(str);
            str = content ? json_string(content) : json_null();
            if (!str) str = json_null();
            free(content);
            finish = tool_answer_finish(calls, finish);
            if (!json_array_size(calls)) json_decref(calls), calls = NULL;
        } else if (tools_active(g) && (calls = api_cut_tool_call(&g->req, text, c->len))) {
            json_decref(str); /* a forced call cut short: no text, the call as far as it came */
            str = json_null();
            if (!json_array_size(calls)) json_decref(calls), calls = NULL;
        }
        out = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", c->index, "message", "role",
                        "assistant", "content", str, "logprobs",
                        c->logprobs ? json_pack("{s:O}", "content", c->logprobs) : json_null(),
                        "finish_reason", finish);
        if (calls) json_object_set_new(json_object_get(out, "message"), "tool_calls", calls);
    } else {
        out = json_pack("{s:i, s:o, s:O?, s:s}", "index", c->index, "text", str, "logprobs",
                        c->logprobs, "finish_reason", finish);
        if (!c->logprobs) json_object_set_new(out, "logprobs", json_null());
    }
    return out;
}

static void send_whole_response(request *r, json_t *response) { respond_json(r, 200, response); }

static double mean_logprob(const choice *c) {
    return c->res.n_generated ? c->lp_sum / (double)c->res.n_generated : 0.0;
}

static void finish_whole(generation *g) {
    request *r = g->r;
    if (g->client_left) {
        api_error e;
        client_closed_error(&e, "the answer");
        r->close_conn = 1;
        return respond_error(r, &e);
    }
    for (int i = 0; i < g->n_choices; i++)
        if (g->choices[i].rc) {
            api_error e;
            choice_error(&g->choices[i], 400, g->responses ? "input" : prompt_param(g), &e);
            if (g->choices[i].timed_out) return respond_retry(r, &e, srv_timeout_retry_seconds(r->srv));
            return respond_error(r, &e);
        }
    if (g->responses) return responses_final(g, send_whole_response);
    json_t *choices = json_array();
    const int made = g->req.n_choices, kept = g->req.n_returned;
    for (size_t p = 0; p < g->n_batch; p++) { /* best_of: each prompt's likeliest n, by mean log-probability */
        choice *all = &g->choices[p * (size_t)made];
        int order[API_MAX_N];
        for (int k = 0; k < made; k++) {
            int j = k;
            for (; j > 0 && mean_logprob(&all[order[j - 1]]) < mean_logprob(&all[k]); j--) order[j] = order[j - 1];
            order[j] = k;
        }
        for (int k = 0; k < kept; k++) {
            choice *c = made > kept ? &all[order[k]] : &all[k];
            c->index = (int)p * kept + k;
            json_array_append_new(choices, choice_json(c));
        }
    }
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o, s:o}", "id", g->id, "object",
                             g->req.chat ? "chat.completion" : "text_completion", "created",
                             (json_int_t)g->created, "model", model_name(g), "system_fingerprint",
                             system_fingerprint(g->r->srv), "choices", choices, "usage", usage_json(g));
    if (g->ss) json_object_set_new(body, "session", json_string(g->ss->id));
    if (g->rereading)
        json_object_set_new(body, "reread", reread_json(&g->reread_st));
    if (g->recalling)
        json_object_set_new(body, "recall", recall_json(&g->recall_st));
    respond_json(r, 200, body);
}

static void on_done_event(server *s, void *arg) {
    done_event *ev = arg;
    choice *c = ev->c;
    generation *g = c->g;
    request *r = g->r;
    c->res = ev->res;
    c->rc = ev->rc;
    snprintf(c->err, sizeof c->err, "%s", ev->err);
    if (!c->rc && c->res.finish == ENGINE_FINISH_TIMEOUT && c->res.n_generated == 0) {
        c->rc = -1; /* nothing to answer with: an error, not an empty "length" answer */
        c->timed_out = 1;
    }
    c->done = 1;
    g->n_done++;
    s->answers_running--;
    free(ev);
    if (g->ss) session_generation_done(g->ss);
    s->m.tokens_prompted += c->index % g->req.n_choices == 0 ? c->res.n_prompt : 0;
    s->m.tokens_generated += c->res.n_generated;
    if (g->req.grammar) s->m.constrained_tokens += c->res.n_generated;
    s->m.masked_steps += c->res.n_masked;
    s->m.decode_ms += c->res.decode_ms;
    r->tokens += (c->index % g->req.n_choices == 0 ? c->res.n_prompt : 0) + c->res.n_generated;
    if (r->conn && g->req.stream && !g->responses && !g->client_left) stream_choice_done(c);
    if (r->conn && g->req.stream && g->responses && c->rc) {
        api_error e;
        choice_error(c, 500, "input", &e);
        responses_error_event(&g->ev, &e);
    }
    if (g->n_done == g->n_submitted) {
        if (g->tmp_doc) release_temporary_pot(s, g);
        if (r->conn || r->bg) {
            if (g->req.stream) finish_stream(g);
            else finish_whole(g);
        }
    }
    request_unref(r); /* the engine's reference for this choice */
    next_turns(s);
}

static int gen_on_text(void *user, const char *text, size_t len, int32_t token,
                       const sample_logprobs *lp) {
    (void)token;
    choice *c = user;
    generation *g = c->g;
    if (atomic_load(&g->cancel)) return 1;
    text_event *ev = malloc(sizeof *ev + len + 1);
    if (!ev) return 1;
    ev->c = c;
    ev->has_lp = lp != NULL;
    if (lp) ev->lp = *lp;
    ev->n = len;
    memcpy(ev->text, text, len);
    ev->text[len] = 0;
    srv_post(g->r->srv, on_text_event, ev);
    return 0;
}

static void gen_on_done(void *user, int rc, const engine_gen_result *res, const char *err) {
    choice *c = user;
    done_event *ev = calloc(1, sizeof *ev);
    if (!ev) abort(); /* the request would never complete */
    ev->c = c;
    ev->rc = rc;
    if (res) ev->res = *res;
    if (err) snprintf(ev->err, sizeof ev->err, "%s", err);
    srv_post(c->g->r->srv, on_done_event, ev);
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
    if (q->suffix) { /* the answer goes between the prompt and the suffix */
        g->prompt = engine_fim_prompt(s->eng, q->prompt, q->suffix, &g->n_prompt, err, sizeof err);
        return g->prompt ? 0 : api_fail(e, 400, "unsupported_value", "suffix", "%s", err);
    }
    g->prompt = q->chat ? engine_chat_prompt(s->eng, q->messages, q->n_messages, q->enable_thinking, &g->n_prompt,
                                             err, sizeof err)
                        : engine_tokenize_prompt(s->eng, q->prompt, &g->n_prompt, err, sizeof err);
    if (!g->prompt) return api_fail(e, 400, "invalid_value", q->chat ? "messages" : "prompt", "%s", err);
    if (!g->n_prompt) /* (a chat always has its template's tokens) */
        return api_fail(e, 400, "invalid_value", "prompt", "the prompt is empty: there is nothing to continue");
    return 0;
}

/* The token ids of the prompts after the first in a batch; each must fit
 * the window (a batch is not read through a pot). */
static int batch_prompts(server *s, generation *g, api_error *e) {
    api_gen_request *q = &g->req;
    if (q->n_batch <= 1) return 0;
    g->batch = calloc(q->n_batch, sizeof *g->batch);
    if (!g->batch) return api_fail(e, 500, NULL, NULL, "out of memory");
    g->n_batch = q->n_batch;
    size_t room = (size_t)s->info.n_ctx_train - (q->params.max_tokens > 0 ? (size_t)q->params.max_tokens : 1);
    for (size_t p = 0; p < q->n_batch; p++) {
        size_t n = p ? 0 : g->n_prompt;
        if (p && q->batch_tokens[p]) {
            n = q->batch_counts[p];
            g->batch[p].ids = malloc(n * sizeof *g->batch[p].ids);
            if (!g->batch[p].ids) return api_fail(e, 500, NULL, NULL, "out of memory");
            memcpy(g->batch[p].ids, q->batch_tokens[p], n * sizeof *g->batch[p].ids);
        } else if (p) {
            char err[256];
            g->batch[p].ids = engine_tokenize_prompt(s->eng, q->batch_texts[p], &n, err, sizeof err);
            if (!g->batch[p].ids) return api_fail(e, 400, "invalid_value", "prompt", "prompt[%zu]: %s", p, err);
        }
        if (!n) /* (as the first prompt's: nothing to continue) */
            return api_fail(e, 400, "invalid_value", "prompt", "prompt[%zu] is empty: there is nothing to continue", p);
        g->batch[p].n = n;
        if (n > room)
            return api_fail(e, 400, "context_length_exceeded", "prompt",
                            "prompt[%zu] has %zu tokens; with max_tokens it exceeds the model's window of %d "
                            "(prompts of a batch are not read through a pot)", p, n, s->info.n_ctx_train);
    }
    return 0;
}

/* ---- echo: the prompt before each answer (/v1/completions) ----------------------------- */

static void take_turn(server *s, generation *g);

static const int32_t *prompt_ids(const generation *g, size_t p, size_t *n) {
    *n = p ? g->batch[p].n : g->n_prompt;
    return p ? g->batch[p].ids : g->prompt;
}

/* Puts each prompt's echo before its answers' text (and logprobs, in a whole
 * answer; a stream sends them in its first chunk: submit). */
static void echo_fill(server *s, generation *g) {
    for (int i = 0; i < g->n_choices; i++) {
        choice *c = &g->choices[i];
        size_t p = (size_t)i / (size_t)g->req.n_choices, n;
        const int32_t *ids = prompt_ids(g, p, &n);
        append_text(c, g->echo[p].text, g->echo[p].len);
        c->chars = utf8_chars(g->echo[p].text, g->echo[p].len);
        if (c->logprobs && g->echo[p].lp) echo_logprobs_add(s, c->logprobs, &g->echo[p], ids, n);
    }
}

/* One echo task reads for about this long: a prompt's logits are the costly part of reading it
   (1,024 tokens took 1.9 s on the default model, two cores), so a bound in tokens would hold
   the engine for seconds on a larger vocabulary or a slower machine */
enum { ECHO_TASK_MS = 150 };

static void echo_task(engine *e, void *arg);

/* After each echo task: the next one, or the answer. A client gone (its
 * socket peeked at, or MHD's end of the request) stops the reading; the
 * engine thread frees what it read into first. */
static void echo_read(server *s, void *arg) {
    generation *g = arg;
    api_error e;
    int more = !g->echo_rc && g->echo_at < g->n_batch;
    if (more && !g->client_left && request_client_gone(g->r)) g->client_left = 1;
    if ((more && !g->client_left) || g->echo_reader) {
        if (g->client_left) atomic_store(&g->cancel, 1);
        if (!srv_task(s, NULL, echo_task, g)) return; /* (the request's reference goes on with it) */
        engine_logprob_reader_free(g->echo_reader); /* the engine has stopped: it runs no more tasks */
        g->echo_reader = NULL;
        if (!g->client_left) {
            g->echo_rc = -1;
            snprintf(g->echo_err, sizeof g->echo_err, "the server is shutting down");
        }
    }
    if (g->client_left) {
        client_closed_error(&e, "reading the prompt's log-probabilities");
        g->r->close_conn = 1;
        respond_error(g->r, &e);
    } else if (g->echo_rc) {
        api_fail(&e, 500, NULL, NULL, "reading the prompt's log-probabilities failed: %s", g->echo_err);
        respond_error(g->r, &e);
    } else {
        echo_fill(s, g);
        take_turn(s, g);
    }
    request_unref(g->r);
}

/* Engine thread: about ECHO_TASK_MS more of the prompts' log-probabilities
 * (then the engine's other work: answers and uploads take their turns between
 * the tasks), or, once told to stop, the reader freed. */
static void echo_task(engine *e, void *arg) {
    generation *g = arg;
    double t0 = monotonic_ms();
    while (!g->echo_rc && !atomic_load(&g->cancel) && g->echo_at < g->n_batch && monotonic_ms() - t0 < ECHO_TASK_MS) {
        size_t n, read = 0;
        const int32_t *ids = prompt_ids(g, g->echo_at, &n);
        echo_prompt *ep = &g->echo[g->echo_at];
        if (!g->echo_reader && !(ep->lp = malloc(n * sizeof *ep->lp))) {
            g->echo_rc = -1;
            snprintf(g->echo_err, sizeof g->echo_err, "out of memory");
        } else if (!g->echo_reader &&
                   !(g->echo_reader = engine_logprob_reader_new(e, ids, n, g->req.params.sampling.n_top_logprobs,
                                                                ep->lp, g->echo_err, sizeof g->echo_err))) {
            g->echo_rc = -1;
        } else {
            int rc = engine_logprob_reader_step(g->echo_reader, 1, &read, g->echo_err, sizeof g->echo_err);
            if (rc < 0) g->echo_rc = -1;
            if (rc == 1) {
                engine_logprob_reader_free(g->echo_reader);
                g->echo_reader = NULL;
                g->echo_at++;
            }
        }
    }
    if (g->echo_rc || atomic_load(&g->cancel)) {
        engine_logprob_reader_free(g->echo_reader);
        g->echo_reader = NULL;
    }
    srv_post(g->r->srv, echo_read, g);
}

/* Each prompt's text as given (a prompt of token ids: their text); with
 * logprobs, its tokens' log-probabilities are read on the engine thread
 * first. Then the answers take their turn. */
static int start_echo(server *s, generation *g, api_error *e) {
    api_gen_request *q = &g->req;
    if (!(g->echo = calloc(g->n_batch, sizeof *g->echo))) return api_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t p = 0; p < g->n_batch; p++) {
        const char *given = p ? q->batch_texts[p] : q->prompt;
        size_t n;
        const int32_t *ids = prompt_ids(g, p, &n);
        echo_prompt *ep = &g->echo[p];
        ep->text = given ? strdup(given) : engine_detokenize(s->eng, ids, n, SIZE_MAX, &ep->len);
        if (!ep->text) return api_fail(e, 500, NULL, NULL, "out of memory");
        if (given) ep->len = strlen(given);
        ep->bos_added = given && n && ids[0] == s->info.bos_added;
    }
    if (!q->logprobs) {
        echo_fill(s, g);
        take_turn(s, g);
        return 0;
    }
    request_ref(g->r);
    request_suspend(g->r);
    if (srv_task(s, NULL, echo_task, g)) {
        request_unref(g->r);
        return api_fail(e, 503, "unavailable", NULL, "the server is shutting down");
    }
    return 0;
}

/* Hands the prepared generation to the engine thread: each prompt once,
 * with n answers from its one prefill. */
static void submit(server *s, generation *g) {
    request *r = g->r;
    api_gen_request *q = &g->req;
    api_error e;
    engine_doc *doc = g->tmp_doc       ? g->tmp_doc /* a temporary or re-read pot first */
                      : g->reread_pot ? reread_pot_doc(g->reread_pot)
                      : g->ss         ? g->ss->doc
                                      : NULL;
    int n = q->n_choices;
    void **users = malloc((size_t)n * sizeof *users);
    if (!users) {
        s->answers_running -= g->seqs;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    for (size_t p = 0; p < g->n_batch; p++) {
        for (int i = 0; i < n; i++) users[i] = &g->choices[p * (size_t)n + (size_t)i];
        engine_gen_request er = {.doc = doc, .prompt = p ? g->batch[p].ids : g->prompt,
                                 .n_prompt = p ? g->batch[p].n : g->n_prompt, .params = q->params,
                                 .on_text = gen_on_text, .on_done = gen_on_done, .user = users[0],
                                 .n = n, .users = users, .deadline_ms = g->deadline_ms, .cancel = &g->cancel};
        char err[256];
        for (int i = 0; i < n; i++) request_ref(r); /* held by the engine until on_done arrives */
        if (srv_generate(s, &er, err, sizeof err)) {
            for (int i = 0; i < n; i++) request_unref(r);
            free(users);
            s->answers_running -= g->seqs - g->n_submitted; /* never to run: their turn is given back */
            if (g->n_submitted) { /* the earlier prompts complete the request, cut short */
                generation_cancel(g);
                return;
            }
            api_fail(&e, 503, "unavailable", NULL, "%s", err);
            return respond_error(r, &e);
        }
        g->n_submitted += n;
        if (g->ss) g->ss->gens += n; /* the doc must not be replaced until the generations are done */
    }
    free(users);
    if (q->stream) {
        if (!g->stream_started && stream_start(r)) return; /* the engine's done events still complete r */
        g->stream_started = 1;
        if (g->responses) responses_stream_start(g);
        else
            for (int i = 0; i < g->n_choices; i++) {
                size_t p = (size_t)i / (size_t)n, n_ids;
                const int32_t *ids = prompt_ids(g, p, &n_ids);
                json_t *lp = g->echo && g->echo[p].lp ? completion_logprobs_new() : NULL;
                if (lp) echo_logprobs_add(s, lp, &g->echo[p], ids, n_ids);
                json_t *chunk = g->echo ? chunk_json(g, i, g->echo[p].text, g->echo[p].len, 1, NULL, lp)
                                        : chunk_json(g, i, NULL, 0, 1, NULL, NULL);
                if (i == 0 && g->rereading) json_object_set_new(chunk, "reread", reread_json(&g->reread_st));
                if (i == 0 && g->recalling) json_object_set_new(chunk, "recall", recall_json(&g->recall_st));
                sse_send(r, chunk);
            }
    } else {
        request_suspend(r);
    }
}

/* Streams start (with a first comment) or the request waits, while the answer is prepared. */
static void hold_request(generation *g, const char *comment) {
    if (g->req.stream) {
        if (!stream_start(g->r)) {
            g->stream_started = 1;
            stream_write(g->r, comment, strlen(comment));
        }
    } else {
        request_suspend(g->r);
    }
}

/* ---- answers take turns ------------------------------------------------------------
 * Each answer decodes in its own copy of its pot, up to a model window (SmolLM2: 8,192
 * entries of 36 KB), which pot_memory_limit does not count: at most max_answers
 * sequences decode at once (a request with n choices over k prompts is n*k of them),
 * the others wait in arrival order, held as a re-read is (a streamed one gets the
 * comment ": waiting for a turn"). A request larger than max_answers is refused
 * (start_generation). */

static int turn_free(const server *s, int seqs) {
    return s->answers_running == 0 || s->answers_running + seqs <= s->cfg.max_answers;
}

static void take_turn(server *s, generation *g) {
    g->seqs = g->req.n_choices * (int)(g->n_batch > 1 ? g->n_batch : 1);
    if (!s->answers_waiting && turn_free(s, g->seqs)) {
        s->answers_running += g->seqs;
        return submit(s, g);
    }
    request_ref(g->r); /* until its turn comes, or it ends waiting */
    g->next_waiting = NULL;
    if (s->answers_waiting_last) s->answers_waiting_last->next_waiting = g;
    else s->answers_waiting = g;
    s->answers_waiting_last = g;
    s->n_answers_waiting++;
    static const char comment[] = ": waiting for a turn (max_answers)\n\n";
    if (g->stream_started) stream_write(g->r, comment, sizeof comment - 1);
    else hold_request(g, comment);
    if (g->responses && g->stream_started && !g->created_sent) {
        /* its id at once (to poll, cancel or resume it while it waits), as OpenAI's queued ones */
        g->created_sent = 1;
        responses_event(&g->ev, "response.created", json_pack("{s:o}", "response", responses_now(g, "queued", 0)));
        responses_event(&g->ev, "response.queued", json_pack("{s:o}", "response", responses_now(g, "queued", 0)));
    }
}

/* 1 with e filled when a waiting answer cannot take its turn: its client left, or
 * its request_timeout passed; 0 when it can. */
static void client_left(generation *g);

static int turn_lost(generation *g, api_error *e) {
    request *r = g->r;
    if (request_client_gone(r)) { /* (logged and counted 499, as every answer whose client left) */
        client_left(g);
        client_closed_error(e, "an answer waiting for its turn");
        r->close_conn = 1;
        return 1;
    }
    if (r->bg && atomic_load(&g->cancel)) /* a background response cancelled, or stopped by a drain */
        return api_fail(e, 503, "shutting_down", NULL, "stopped before its turn came"), 1;
    if (g->deadline_ms && monotonic_ms() > g->deadline_ms)
        return api_fail(e, 503, "request_timeout", NULL,
                        "no turn to answer within request_timeout (%lld s): %d answers were running "
                        "(max_answers); retry later", (long long)r->srv->cfg.request_timeout,
                        r->srv->answers_running), 1;
    return 0;
}

/* Ends a waiting answer that lost its turn (taken off the queue already). */
static void end_waiting(generation *g, const api_error *e) {
    request *r = g->r;
    if (g->stream_started && !r->bg) { /* (a background one's failure is stored, its stream's last event) */
        if (r->conn) {
            sse_send(r, api_error_json(e));
            stream_write(r, "data: [DONE]\n\n", 14);
        }
        stream_end(r);
    } else {
        respond_retry(r, e, srv_timeout_retry_seconds(r->srv));
    }
    request_unref(r);
}

static void next_turns(server *s) {
    while (s->answers_waiting && turn_free(s, s->answers_waiting->seqs)) {
        generation *g = s->answers_waiting;
        s->answers_waiting = g->next_waiting;
        if (!s->answers_waiting) s->answers_waiting_last = NULL;
        s->n_answers_waiting--;
        api_error e;
        if (turn_lost(g, &e)) {
            end_waiting(g, &e);
            continue;
        }
        s->answers_running += g->seqs;
        submit(s, g);
        request_unref(g->r);
    }
}

/* sessions_sweep_chunk_waits' test: 1 (r answered, its reference given up) when a question
 * waiting for its session's chunk can wait no longer. */
static int chunk_wait_lost(request *r) {
    generation *g = r->gen;
    api_error e;
    if (request_client_gone(r)) {
        client_left(g);
        client_closed_error(&e, "an answer waiting for its session's chunk");
        r->close_conn = 1;
    } else if (r->srv->cfg.request_timeout && monotonic_ms() - r->t0 > (double)r->srv->cfg.request_timeout * 1e3) {
        api_fail(&e, 503, "request_timeout", NULL, /* (its answer's own deadline is set once it goes on) */
                 "no answer within request_timeout (%lld s): the session's chunk being uploaded was not "
                 "acknowledged by then (the answer waits for it); retry later",
                 (long long)r->srv->cfg.request_timeout);
    } else {
        return 0;
    }
    end_waiting(g, &e);
    return 1;
}

void generations_sweep(server *s) {
    /* a suspended connection is not polled: a client that left while its prompt was read through
       a temporary pot (or a recall prepared) is seen only by looking */
    for (request *r = s->live; r; r = r->next_live)
        if (r->gen && r->suspended && !atomic_load(&r->gen->cancel) && request_client_gone(r)) client_left(r->gen);
    for (generation **p = &s->answers_waiting, *prev = NULL; *p;) {
        generation *g = *p;
        api_error e;
        if (!turn_lost(g, &e)) {
            prev = g;
            p = &g->next_waiting;
            continue;
        }
        *p = g->next_waiting;
        if (s->answers_waiting_last == g) s->answers_waiting_last = prev;
        s->n_answers_waiting--;
        end_waiting(g, &e);
    }
    sessions_sweep_chunk_waits(s, chunk_wait_lost);
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
    if (g->client_left) { /* its reading was abandoned for that */
        client_closed_error(&e, "reading the prompt through a pot");
        g->r->close_conn = 1;
    } else {
        api_fail(&e, status, "overflow_failed", prompt_param(g), "reading the prompt through a pot failed: %s", msg);
    }
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
    take_turn(s, g);
    request_unref(g->r);
}

static void temporary_pot_ingested(void *user, int rc, const char *err) {
    generation *g = user; /* engine thread */
    g->tmp_rc = rc;
    if (err) snprintf(g->tmp_err, sizeof g->tmp_err, "%s", err);
    engine_doc_stats st;
    engine_doc_get_stats(g->tmp_doc, &st);
    g->tmp_tokens = st.pinned_tokens + st.tokens_read;
    srv_post(g->r->srv, temporary_pot_read, g);
}

static void temporary_pot_opened(server *s, void *arg) {
    generation *g = arg;
    /* as when a session is created: what engine_doc_open refuses is the request's
     * (a system prompt or tools longer than the pot keeps) */
    if (!g->tmp_doc) return temporary_pot_failed(s, g, 422, g->tmp_err);
    if (srv_ingest(s, g->tmp_doc, g->doc_text, g->doc_len, 1, temporary_pot_ingested, g))
        temporary_pot_failed(s, g, 503, "the server is shutting down");
}

static void open_temporary_pot(engine *e, void *arg) {
    generation *g = arg;
    g->tmp_doc = engine_doc_open(e, &g->tmp_settings, g->tmp_err, sizeof g->tmp_err);
    if (g->tmp_doc) engine_doc_abandon_when(g->tmp_doc, &g->cancel); /* its reading ends with the request */
    srv_post(g->r->srv, temporary_pot_opened, g);
}

static int append_doc_text(generation *g, const char *a, const char *b) {
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
            rc = append_doc_text(g, role, q->messages[i].content);
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
    if (pot_memory_admit(s, g->tmp_memory, prompt_param(g), "a prompt beyond the window", e)) return -1;
    if (!pots_make_room(s, g->tmp_memory))
        return api_fail(e, 429, "insufficient_memory", prompt_param(g),
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
    if (!g->req.stream) { /* suspended: a client that left is noticed only by looking (client_gone) */
        if (request_client_gone(g->r)) client_left(g);
        return;
    }
    if (!streams_to(g->r)) return;
    char line[96];
    int n = snprintf(line, sizeof line, ": reread %llu/%llu bytes\n\n", (unsigned long long)done,
                     (unsigned long long)total);
    stream_write(g->r, line, (size_t)n);
}

/* A suspended or streamed request whose re-read or recall failed. */
static void prepare_failed(generation *g, int status, const char *code, const char *what, const char *msg) {
    request *r = g->r;
    api_error e;
    if (g->client_left) {
        client_closed_error(&e, what);
        r->close_conn = 1;
    } else if (status >= 500 && (r->srv->draining || r->srv->stopping)) /* the engine stopped at the drain's end */
        api_fail(&e, 503, "shutting_down", NULL, "%s stopped: the server is shutting down; retry", what);
    else
        api_fail(&e, status, code, NULL, "%s failed: %s", what, msg);
    if (g->stream_started && !r->bg) { /* (a background one's failure is stored, its stream's last event) */
        if (r->conn) {
            sse_send(r, api_error_json(&e));
            stream_write(r, "data: [DONE]\n\n", 14);
        }
        stream_end(r);
    } else {
        respond_error(r, &e);
    }
}

static const char **asked_question(api_gen_request *q);
static int recall_done(server *s, void *user, char *asked, const recall_stats *st, const char *err);

/* A recall that "auto" chose failed (the log could not be read: a store that
 * does not answer, a disk error): the question is answered from the pot
 * alone, as when recall does not apply, and the failure is logged (and told
 * a streamed client as a comment). */
static void answer_without_passages(server *s, generation *g, const char *why) {
    api_gen_request *q = &g->req;
    request *r = g->r;
    fprintf(stderr, "potserve: session %s: recall failed (%.200s); answered from the pot alone\n", g->ss->id, why);
    g->recalling = 0;
    if (q->stream && streams_to(r) && g->stream_started) {
        char line[300];
        int n = snprintf(line, sizeof line, ": recall failed (%.200s): answered from the pot alone\n\n", why);
        stream_write(r, line, (size_t)n);
    }
    char msg[256];
    engine_doc *over = g->reread_pot ? reread_pot_doc(g->reread_pot) : g->ss->rebuilding ? NULL : g->ss->doc;
    free(g->prompt);
    g->prompt = over ? engine_doc_prompt(over, q->messages, q->n_messages, q->chat ? NULL : q->prompt ? q->prompt : "",
                                         &g->n_prompt, msg, sizeof msg)
                     : NULL;
    if (!over) snprintf(msg, sizeof msg, "the session is being restored");
    if (!g->prompt) return prepare_failed(g, over ? 400 : 409, over ? "invalid_value" : "session_busy",
                                          "answering from the pot", msg);
    take_turn(s, g);
}

static void reread_done(server *s, void *user, reread_pot *pot, const reread_stats *st, const char *err) {
    generation *g = user;
    request *r = g->r;
    g->reread_st = *st;
    if (!pot) { /* a question too long for the re-read's pot is the request's fault, not the re-read's */
        int too_long = err && strstr(err, "exceed the model's context");
        prepare_failed(g, too_long ? 400 : 500, "reread_failed", "re-reading the session's document", err);
        return request_unref(r);
    }
    g->reread_pot = pot; /* released with the generation (generation_free) */
    api_gen_request *q = &g->req;
    g->deadline_ms = srv_request_deadline(s); /* the answer's own time */
    if (q->stream && streams_to(r)) {
        char line[160];
        int n = snprintf(line, sizeof line, ": reread done: %lld tokens in %.1f s (pass %llu, %d questions)\n\n",
                         (long long)st->tokens, st->ms / 1e3, (unsigned long long)st->pass, st->questions);
        stream_write(r, line, (size_t)n);
    }
    /* "auto" recalls when it applies now: the session may have begun receiving an upload */
    if (g->recall_after_reread == API_RECALL_ON ||
        (g->recall_after_reread == API_RECALL_AUTO && recall_auto_applies(g->ss))) {
        /* recall_done asks the question over this pot, with its passages */
        api_error e;
        g->recall_auto = g->recall_after_reread == API_RECALL_AUTO;
        if (recall_start(s, g->ss, *asked_question(q), recall_done, g, &e)) {
            if (g->recall_auto && e.status != 503) answer_without_passages(s, g, e.message);
            else prepare_failed(g, e.status, e.code, "recalling the session's passages", e.message);
            return request_unref(r);
        }
        g->recalling = 1;
        static const char started[] = ": recall started\n\n";
        if (q->stream && streams_to(r)) stream_write(r, started, sizeof started - 1);
        return; /* r's reference passes to recall_done */
    }
    char msg[256];
    free(g->prompt);
    g->prompt = engine_doc_prompt(reread_pot_doc(pot), q->messages, q->n_messages,
                                  q->chat ? NULL : q->prompt ? q->prompt : "", &g->n_prompt, msg, sizeof msg);
    if (!g->prompt) {
        prepare_failed(g, 400, "reread_failed", "re-reading the session's document", msg);
        return request_unref(r);
    }
    take_turn(s, g);
    request_unref(r);
}

/* The question a re-read is guided by and a recall searches for: the last
 * user message (chat), the prompt (completions); where it is kept in *at. */
static const char **asked_question(api_gen_request *q) {
    if (!q->chat) return &q->prompt;
    for (size_t i = q->n_messages; i > 0; i--)
        if (!strcmp(q->messages[i - 1].role, "user")) return &q->messages[i - 1].content;
    return NULL;
}

/* The question, or NULL with e (400) naming what a re-read or recall lacks. */
static const char *question_for(api_gen_request *q, const char *field, api_error *e) {
    const char **at = asked_question(q);
    if (at && *at && **at) return *at;
    api_fail(e, 400, "invalid_value", q->chat ? "messages" : "prompt",
             "%s needs a question: a user message (chat) or a text prompt", field);
    return NULL;
}


static int start_reread(server *s, generation *g, api_error *e) {
    api_gen_request *q = &g->req;
    const char *question = question_for(q, "reread", e);
    if (!question) return -1;
    if (reread_start(s, g->ss, question, &g->cancel, reread_progress, reread_done, g, e)) return -1;
    g->rereading = 1;
    request_ref(g->r); /* until reread_done */
    hold_request(g, ": reread started\n\n");
    return 0;
}

/* ---- a question after the upload: the passages of the document it names ---------------
 * The session's document is read from its chunk log and searched for the
 * paragraphs that share the question's words (engine/recall.h); the question
 * is asked with them before it, over the session's own pot. */

/* Whether a prompt of n tokens with passages leaves the answer its room in the
 * window after the session's pot: max_tokens when the request sets it, and at
 * least half of what the pot leaves free. */
static int recall_fits(const server *s, const generation *g, size_t n) {
    int64_t in_pot = g->reread_pot ? g->reread_st.tokens_in_pot : g->ss->stats.tokens_in_pot;
    int64_t free_after_pot = (int64_t)s->info.n_ctx_train - in_pot;
    int64_t answer = free_after_pot / 2;
    if (g->req.params.max_tokens > 0 && g->req.params.max_tokens < answer) answer = g->req.params.max_tokens;
    return (int64_t)n + answer <= free_after_pot;
}

static int recall_done(server *s, void *user, char *asked, const recall_stats *st, const char *err) {
    generation *g = user;
    request *r = g->r;
    free(g->recall_st.chosen); /* an earlier try's, when the passages did not fit */
    free(g->recall_st.text);
    g->recall_st = *st;
    if (!asked && g->recall_auto && !atomic_load(&g->cancel)) {
        answer_without_passages(s, g, err);
        request_unref(r);
        return 0;
    }
    if (!asked || atomic_load(&g->cancel)) {
        prepare_failed(g, 500, "recall_failed", "recalling the session's passages", asked ? "cancelled" : err);
        free(asked);
        request_unref(r);
        return 0;
    }
    api_gen_request *q = &g->req;
    if (!g->reread_pot && (!g->ss->doc || g->ss->rebuilding)) { /* (uploads, and so rebuilds, waited for the read) */
        g->recalled = asked;
        prepare_failed(g, 409, "session_busy", "recalling the session's passages", "the session is being restored");
        request_unref(r);
        return 0;
    }
    const char **at = asked_question(q), *question = *at; /* the same message question_for found */
    *at = asked;
    char msg[256];
    engine_doc *over = g->reread_pot ? reread_pot_doc(g->reread_pot) : g->ss->doc;
    g->prompt = engine_doc_prompt(over, q->messages, q->n_messages, q->chat ? NULL : q->prompt, &g->n_prompt, msg,
                                  sizeof msg);
    if (g->prompt && st->passages > 0 && !recall_fits(s, g, g->n_prompt)) {
        *at = question;
        free(g->prompt);
        g->prompt = NULL;
        free(asked);
        return 1;
    }
    g->recalled = asked;
    if (!g->prompt) {
        prepare_failed(g, 400, "recall_failed", "recalling the session's passages", msg);
        request_unref(r);
        return 0;
    }
    if (q->stream && streams_to(r)) {
        char line[160];
        int n = snprintf(line, sizeof line, ": recall %d passages (%zu bytes) in %.3f s\n\n", st->passages, st->bytes,
                         st->ms / 1e3);
        stream_write(r, line, (size_t)n);
    }
    take_turn(s, g);
    request_unref(r);
    return 0;
}

static int start_recall(server *s, generation *g, api_error *e) {
    const char *question = question_for(&g->req, "recall", e);
    if (!question) return -1;
    if (recall_start(s, g->ss, question, recall_done, g, e)) {
        if (!g->recall_auto || e->status == 503) return -1; /* (503: the server is stopping) */
        answer_without_passages(s, g, e->message);
        return 0;
    }
    g->recalling = 1;
    request_ref(g->r); /* until recall_done */
    hold_request(g, ": recall started\n\n");
    return 0;
}

static void prompt_work(void *arg);
static void prompt_done(request *r, void *arg);

/* prompt_work, then prompt_done: off the loop when it may take long, for tokenizing megabytes of
   prompt, or compiling a schema or a forced tool call's grammar (a costly pattern: up to a second) */
static void prepare_prompt(request *r, generation *g) {
    if (api_gen_request_constrained(&g->req)) request_work(r, WORK_HEAVY, prompt_work, prompt_done, g);
    else request_work_input(r, prompt_work, prompt_done, g);
}

/* r's body as a generation request; a Responses request's errors name its own fields. */
static int parse_request(request *r, int chat, int responses, api_gen_request *q, api_error *e) {
    json_t *body = request_json(r, e);
    int bad = !body || api_parse_gen_request(body, chat, r->srv->info.n_vocab, q, e);
    json_decref(body);
    if (!bad) return 0;
    if (responses && e->param && !strcmp(e->param, "max_tokens")) {
        e->param = "max_output_tokens";
        snprintf(e->message, sizeof e->message, "max_output_tokens must be a positive integer");
    } else if (responses && e->param && !strcmp(e->param, "messages")) {
        e->param = "input";
    } else if (responses && e->param && !strcmp(e->param, "reasoning_effort")) {
        e->param = "reasoning";
    }
    return -1;
}

int generation_check_responses(request *r, api_gen_request *q, api_error *e, int *retry_after) {
    *retry_after = 0;
    memset(q, 0, sizeof *q);
    if (r->json && files_in_messages(r, r->json, e, retry_after)) return -1;
    if (parse_request(r, 1, 1, q, e)) return -1;
    if (!api_render_tools(q, r->srv->info.chat_family, e)) return 0; /* (tool turns as the answer takes them) */
    if (e->param && !strcmp(e->param, "messages")) e->param = "input";
    return -1;
}

static void start_generation(request *r, int chat, json_t *responses, json_t *history, int count_only) {
    server *s = r->srv;
    api_error e;
    generation *g = calloc(1, sizeof *g);
    if (!g) {
        json_decref(responses);
        json_decref(history);
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    g->r = r;
    g->ev = (response_events){.r = r, .skip_through = -1};
    r->gen = g;
    g->responses = responses;
    g->history = history;
    g->count_only = count_only;
    int retry = 0;
    if (chat && r->json && files_in_messages(r, r->json, &e, &retry))
        return retry ? respond_retry(r, &e, retry) : respond_error(r, &e);
    if (parse_request(r, chat, responses != NULL, &g->req, &e)) return respond_error(r, &e);
    api_gen_request *q = &g->req;
    size_t seqs = (size_t)q->n_choices * (q->n_batch ? q->n_batch : 1);
    if (seqs > (size_t)s->cfg.max_answers) { /* each its own copy of up to a window: max_answers bounds them */
        const char *field = q->n_choices > q->n_returned ? "best_of" : "n";
        api_fail(&e, 400, "invalid_value", field, "%s (%d) × prompts (%zu) = %zu answers at once, more than the server's "
                 "max_answers (%lld)", field, q->n_choices, q->n_batch ? q->n_batch : 1, seqs,
                 (long long)s->cfg.max_answers);
        return respond_error(r, &e);
    }
    if (chat && api_render_tools(q, s->info.chat_family, &e)) {
        if (responses && e.param && !strcmp(e.param, "messages")) e.param = "input"; /* (its messages are its input) */
        return respond_error(r, &e);
    }
    const char *sid = q->session,
               *header_sid = r->conn ? MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Session-Id") : NULL;
    if (sid && header_sid && strcmp(sid, header_sid)) { /* nginx routes by the header: one of them is a mistake */
        api_fail(&e, 400, "invalid_value", "session", "the body's session and the X-Session-Id header name two sessions");
        return respond_error(r, &e);
    }
    if (!sid) sid = header_sid;
    if (sid && q->n_batch > 1) {
        api_fail(&e, 400, "invalid_value", "prompt", "a list of prompts cannot be asked over a session");
        return respond_error(r, &e);
    }
    if (sid && (q->echo || q->suffix)) {
        api_fail(&e, 400, "unsupported_value", q->echo ? "echo" : "suffix", "%s cannot be asked over a session",
                 q->echo ? "echo (the session's document is not repeated)" : "suffix (fill-in-the-middle)");
        return respond_error(r, &e);
    }
    if (sid && !chat && q->prompt_tokens) { /* recall and re-reading read the question's words */
        api_fail(&e, 400, "invalid_value", "prompt", "token ids cannot be asked over a session: send the prompt as text");
        return respond_error(r, &e);
    }
    if (sid) {
        snprintf(r->session_id, sizeof r->session_id, "%s", sid);
        g->ss = session_lookup(r, sid, "session");
        if (!g->ss) return;
        session_ref(g->ss);
        if (session_pot_wait(r, g->ss, 1)) return; /* paged out: generation_session_ready goes on */
        return generation_session_ready(r, g->ss);
    }
    if (q->reread > 0 || q->recall == API_RECALL_ON) { /* ("auto" has nothing to search: no recall) */
        api_fail(&e, 400, "invalid_value", q->reread > 0 ? "reread" : "recall", "%s needs a session: the document it %s",
                 q->reread > 0 ? "reread" : "recall", q->reread > 0 ? "re-reads" : "searches");
        return respond_error(r, &e);
    }
    prepare_prompt(r, g);
}

void generation_session_ready(request *r, session *found) {
    generation *g = r->gen;
    server *s = r->srv;
    api_gen_request *q = &g->req;
    api_error e;
    if (!g->ss) { /* its lookup began a takeover (session_lookup), which has ended */
        if (!found) {
            api_fail(&e, 503, "store_unavailable", "session", "session '%s' could not be taken over here; retry",
                     r->session_id);
            return respond_retry(r, &e, 1);
        }
        g->ss = found;
        session_ref(found);
        if (session_pot_wait(r, found, 1)) return;
    }
    session *ss = g->ss;
    if (ss->status == SESSION_FAILED) {
        api_fail(&e, 409, "session_failed", "session", "the session failed: %s", ss->fail_msg);
        return respond_error(r, &e);
    }
    if (ss->rebuilding || !ss->doc) {
        api_fail(&e, 409, "session_busy", "session", "the session is being restored; retry");
        return respond_error(r, &e);
    }
    if (session_chunk_wait(r, ss)) return; /* (an answer sees acknowledged text only) */
    int reread = q->reread > 0 || (q->reread < 0 && ss->settings.reread); /* answer from a question-guided re-read */
    int mode = recall_mode(s, &ss->settings, q->recall);
    const char **asked = asked_question(q);
    /* ask with the passages of the session's document that share the question's words */
    int recall = !reread && (mode == API_RECALL_ON ||
                             (mode == API_RECALL_AUTO && asked && *asked && **asked && recall_auto_applies(ss)));
    if (g->count_only) reread = recall = 0; /* counted: the question as asked over the session's pot */
    g->recall_auto = recall && mode == API_RECALL_AUTO;
    /* after a re-read, "auto" is decided once its pot is ready (reread_done): a re-read's pot,
       of the same budget, drops as much as the session's, and the passages add answers to it
       (docs/results/longdoc.md, "Re-reading with recall") */
    g->recall_after_reread = reread ? mode : API_RECALL_OFF;
    g->rereading_asked = reread;
    g->recall_asked = recall;
    prepare_prompt(r, g);
}

/* A pot reads the document, never the question: a question whose text alone
 * has more tokens than the window (a lower bound of its rendered prompt) is
 * refused here, off the loop, before any pot is read for it; what is rendered
 * on the loop afterwards is then at most about a window's worth of text. */
static void question_fits_window(server *s, generation *g) {
    const char **at = asked_question(&g->req);
    if (!at || !*at) return; /* (a re-read or recall without one is refused by question_for) */
    int64_t n = engine_tokenize(s->eng, *at, strlen(*at), 0, 0, NULL, 0);
    if (n >= s->info.n_ctx_train)
        api_fail(&g->prep_err, 400, "context_length_exceeded", prompt_param(g),
                 "the question has %lld tokens; the model's window is %d tokens (a pot reads the document, "
                 "not the question%s)", (long long)n, s->info.n_ctx_train,
                 g->ss ? "" : ": upload long text to a session and ask about it");
}

/* The prompt's tokens (any thread: reads only the request, the engine and the
 * session's document settings); a re-read renders its prompt after its pot
 * exists (reread_done), a recall after its passages are chosen (recall_done). */
static void prompt_work(void *arg) {
    generation *g = arg;
    server *s = g->r->srv;
    api_gen_request *q = &g->req;
    if (api_gen_request_compile(q, &g->prep_err)) return;
    if (!g->ss) {
        if (!plain_prompt(s, g, &g->prep_err)) batch_prompts(s, g, &g->prep_err);
        if (!g->prep_err.status && q->chat && !q->overflow_error &&
            g->n_prompt + (q->params.max_tokens > 0 ? (size_t)q->params.max_tokens : 1) > (size_t)s->info.n_ctx_train)
            question_fits_window(s, g); /* to be read through a temporary pot */
        return;
    }
    if (g->rereading_asked || g->recall_asked) return question_fits_window(s, g);
    char err[256];
    g->prompt = engine_doc_prompt(g->ss->doc, q->messages, q->n_messages, q->chat ? NULL : q->prompt ? q->prompt : "",
                                  &g->n_prompt, err, sizeof err);
    if (!g->prompt) api_fail(&g->prep_err, 400, "invalid_value", q->chat ? "messages" : "prompt", "%s", err);
}

/* The rest of start_generation, once the prompt is tokenized. */
static void prompt_done(request *r, void *arg) {
    generation *g = arg;
    server *s = r->srv;
    api_gen_request *q = &g->req;
    int chat = q->chat, reread = g->rereading_asked, recall = g->recall_asked;
    json_t *responses = g->responses;
    api_error e;
    if (g->prep_err.status) return respond_error(r, &g->prep_err);
    if (g->count_only) { /* POST /v1/responses/input_tokens: what usage.input_tokens would say (over a
                            session, the pot's entries count as cached prompt tokens, as they do there) */
        int64_t n = (int64_t)g->n_prompt + (g->ss ? g->ss->stats.tokens_in_pot : 0);
        return respond_json(r, 200, json_pack("{s:s, s:I}", "object", "response.input_tokens", "input_tokens",
                                              (json_int_t)n));
    }
    int32_t n_ctx = s->info.n_ctx_train;
    int overflow = 0;
    if (!g->ss && g->n_prompt + (q->params.max_tokens > 0 ? (size_t)q->params.max_tokens : 1) > (size_t)n_ctx) {
        if (q->overflow_error || (!chat && q->prompt_tokens) || q->n_batch > 1 || q->suffix) {
            api_fail(&e, 400, "context_length_exceeded", chat ? "messages" : "prompt",
                     "the prompt has %zu tokens and max_tokens %d; the model's window is %d tokens "
                     "(create a session and upload long documents to read them through a pot)",
                     g->n_prompt, q->params.max_tokens, n_ctx);
            return respond_error(r, &e);
        }
        overflow = 1;
    }
    if (background_id(r)) snprintf(g->id, sizeof g->id, "%s", background_id(r)); /* (answered with it already) */
    else random_id(g->id, sizeof g->id, responses ? "resp_" : chat ? "chatcmpl-" : "cmpl-");
    random_id(g->msg_id, sizeof g->msg_id, "msg_");
    g->created = (int64_t)time(NULL);
    g->deadline_ms = srv_request_deadline(s);
    g->n_batch = q->n_batch ? q->n_batch : 1;
    g->n_choices = (int)g->n_batch * q->n_choices;
    g->choices = calloc((size_t)g->n_choices, sizeof *g->choices);
    if (!g->choices) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    for (int i = 0; i < g->n_choices; i++) {
        g->choices[i] = (choice){.g = g, .index = i};
        /* (a stream of the Responses API sends them at the end too; one with tools, as its text is released) */
        if (q->logprobs && (!q->stream || responses || tools_active(g)))
            g->choices[i].logprobs = chat ? json_array()
                                          : completion_logprobs_new();
    }
    if (reread) return start_reread(s, g, &e) ? respond_question_error(r, &e) : (void)0;
    if (recall) return start_recall(s, g, &e) ? respond_question_error(r, &e) : (void)0;
    if (q->echo && overflow) {
        api_fail(&e, 400, "context_length_exceeded", "echo",
                 "the prompt has %zu tokens and max_tokens %d; the model's window is %d tokens: echo needs "
                 "the prompt in the window (its tokens' log-probabilities are not read through a pot)",
                 g->n_prompt, q->params.max_tokens, n_ctx);
        return respond_error(r, &e);
    }
    if (q->echo) return start_echo(s, g, &e) ? respond_error(r, &e) : (void)0;
    if (overflow) {
        if (start_temporary_pot(s, g, &e)) return respond_question_error(r, &e);
        request_suspend(r);
        return;
    }
    take_turn(s, g);
}

void route_generate(request *r, int chat) {
    if (!session_take_over_first(r)) start_generation(r, chat, NULL, NULL, 0);
}

void route_generate_responses(request *r, json_t *responses, json_t *history) {
    start_generation(r, 1, responses, history, 0);
}

void route_count_responses(request *r, json_t *responses, json_t *history) {
    start_generation(r, 1, responses, history, 1);
}

/* Called when the client disconnects or the server drains. */
void generation_cancel(generation *g) { atomic_store(&g->cancel, 1); }

int generation_client_left(const generation *g) { return g->client_left; }

int generation_waiting(const generation *g) {
    for (const generation *w = g->r->srv->answers_waiting; w; w = w->next_waiting)
        if (w == g) return 1;
    return 0;
}

/* The client closed its side (gone, or a half-close: recv cannot tell them apart): the
 * generation stops, and what it wrote so far is not sent as if it were the answer. */
static void client_left(generation *g) {
    g->client_left = 1;
    generation_cancel(g);
}
