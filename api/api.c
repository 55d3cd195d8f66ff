/* Request parsing and validation for the HTTP API (docs/api.md). Every field is
 * checked for type and range; the first problem becomes one api_error that
 * names the field. */
#include "api.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h" /* the policies' and schedules' names */
#include "common/common.h" /* utf8_seq */

/* s as a JSON string, each byte of an invalid or incomplete UTF-8 sequence
 * written as U+FFFD, or (hex) as the 4 characters \xNN. */
static json_t *text_json(const char *s, size_t n, int hex) {
    size_t bad = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_seq((const unsigned char *)s + i, n - i, &cp);
        i += l > 0 ? (size_t)l : 1;
        bad += l <= 0;
    }
    if (!bad) return json_stringn(s, n);
    char *out = malloc(n + 3 * bad + 1); /* 3 (U+FFFD) or 4 (\xNN) bytes in place of 1 */
    if (!out) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_seq((const unsigned char *)s + i, n - i, &cp);
        if (l > 0) {
            memcpy(out + k, s + i, (size_t)l);
            k += (size_t)l;
            i += (size_t)l;
        } else if (hex) {
            k += (size_t)snprintf(out + k, 5, "\\x%02x", (unsigned char)s[i++]);
        } else {
            memcpy(out + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    json_t *j = json_stringn(out, k);
    free(out);
    return j;
}

json_t *api_text_json(const char *s, size_t n) { return text_json(s, n, 0); }

json_t *api_piece_json(const char *s, size_t n) { return text_json(s, n, 1); }

json_t *api_parse_object(const char *body, size_t n, api_error *e) {
    json_error_t je;
    json_t *root = json_loadb(body ? body : "", n, JSON_REJECT_DUPLICATES, &je);
    if (!root && strstr(je.text, "JSON_ALLOW_NUL")) { /* valid JSON, but C strings end at a NUL */
        api_fail(e, 400, "unsupported_value", NULL,
                 "a string holds \\u0000 (NUL, line %d, column %d), which JSON requests cannot carry here: "
                 "remove it (a document with NUL bytes can be uploaded as a text/plain chunk)", je.line, je.column);
        return NULL;
    }
    if (!root) {
        api_fail(e, 400, "invalid_json", NULL, "the body is not valid JSON: %s (line %d, column %d)",
                 je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        api_fail(e, 400, "invalid_json", NULL, "the body must be a JSON object");
        return NULL;
    }
    return root;
}

/* ---- typed field readers: absent or null leaves *out alone ----------------------- */

static int get_string(json_t *o, const char *key, const char **out, api_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return api_fail(e, 400, "invalid_type", key, "%s must be a string", key);
    *out = json_string_value(v);
    if (strlen(*out) != json_string_length(v))
        return api_fail(e, 400, "invalid_value", key, "%s must not contain NUL characters", key);
    return 0;
}

static int get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, api_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    /* an integer is compared as one (through a double, seeds above 2^53 would merge and 2^63 - 1
       would round out of int64_t's range); a real with no fraction (2048.0) is taken when exact */
    int64_t n = 0;
    int in_range = 1;
    if (json_is_integer(v)) {
        n = (int64_t)json_integer_value(v);
    } else {
        double d = json_real_value(v);
        if (!json_is_real(v) || d != floor(d)) return api_fail(e, 400, "invalid_type", key, "%s must be an integer", key);
        in_range = d >= -0x1p63 && d < 0x1p63;
        if (in_range) n = (int64_t)d;
    }
    if (!in_range || n < lo || n > hi)
        return api_fail(e, 400, "invalid_value", key, "%s must be in [%lld, %lld]", key,
                        (long long)lo, (long long)hi);
    *out = n;
    return 0;
}

static int get_float(json_t *o, const char *key, double lo, double hi, double *out, api_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return api_fail(e, 400, "invalid_type", key, "%s must be a number", key);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return api_fail(e, 400, "invalid_value", key, "%s must be in [%g, %g]", key, lo, hi);
    *out = d;
    return 0;
}

static int get_bool(json_t *o, const char *key, int *out, api_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return api_fail(e, 400, "invalid_type", key, "%s must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* ---- sessions ---------------------------------------------------------------------- */

int api_recall_from_name(const char *name) {
    if (!name) return API_RECALL_UNSET;
    if (!strcmp(name, "true")) return API_RECALL_ON;
    if (!strcmp(name, "false")) return API_RECALL_OFF;
    if (!strcmp(name, "auto")) return API_RECALL_AUTO;
    return API_RECALL_UNSET;
}

json_t *api_recall_json(int recall) {
    return recall == API_RECALL_AUTO ? json_string("auto") : json_boolean(recall == API_RECALL_ON);
}

/* A field that is true, false or one word: *out = off, on or as_word
 * (settings' three-way fields: "recall", "whole_words"); absent or null
 * leaves *out. */
static int get_bool_or_word(json_t *o, const char *key, const char *word, int off, int on,
                            int as_word, int *out, api_error *e) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_boolean(v)) *out = json_is_true(v) ? on : off;
    else if (json_is_string(v) && !strcmp(json_string_value(v), word)) *out = as_word;
    else return api_fail(e, 400, "invalid_type", key, "%s must be true, false or \"%s\"", key, word);
    return 0;
}

static int get_recall(json_t *o, int *out, api_error *e) {
    return get_bool_or_word(o, "recall", "auto", API_RECALL_OFF, API_RECALL_ON, API_RECALL_AUTO, out, e);
}

json_t *api_whole_words_json(int whole_words) {
    return whole_words == API_WHOLE_WORDS_QUESTION ? json_string("question")
                                                   : json_boolean(whole_words == API_WHOLE_WORDS_ON);
}

static int one_of(const char *v, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(v, *names)) return 1;
    return 0;
}

int api_parse_session_settings(json_t *body, int32_t n_ctx, int32_t default_budget, const char *default_policy,
                               api_session_settings *out, api_error *e) {
    memset(out, 0, sizeof *out);
    out->recall = API_RECALL_UNSET;
    out->whole_words = API_WHOLE_WORDS_QUESTION;
    if (body && !json_is_object(body)) return api_fail(e, 400, "invalid_json", NULL, "the body must be a JSON object");
    json_t *root = body ? json_incref(body) : json_object();
    if (!root) return api_fail(e, 500, NULL, NULL, "out of memory");
    out->root = root;
    engine_pot_settings *s = &out->pot;
    *s = engine_pot_settings_default();
    s->budget_tokens = default_budget;
    s->policy = default_policy;
    int64_t budget = s->budget_tokens, keep = 0, chunk = 0, ttl = 0, pool = 0;
    double nuc = s->nuc_share;
    if (get_int(root, "budget_tokens", INT32_MIN, INT32_MAX, &budget, e) || /* its range: below */
        get_int(root, "keep_tokens", 1, INT32_MAX, &keep, e) ||
        get_int(root, "chunk_tokens", 1, INT32_MAX, &chunk, e) ||
        get_int(root, "ttl_seconds", 0, INT32_MAX, &ttl, e) ||
        get_int(root, "pool_width", 1, 255, &pool, e) ||
        get_float(root, "nuc_share", 0, 1, &nuc, e) || get_string(root, "policy", &s->policy, e) ||
        get_string(root, "schedule", &s->schedule, e) ||
        get_string(root, "catalyst", &s->catalyst, e) ||
        get_string(root, "question", &s->question, e) ||
        get_string(root, "system", &s->system, e) || get_bool(root, "reread", &out->reread, e) ||
        get_bool_or_word(root, "whole_words", "question", API_WHOLE_WORDS_OFF, API_WHOLE_WORDS_ON,
                         API_WHOLE_WORDS_QUESTION, &out->whole_words, e) ||
        get_recall(root, &out->recall, e))
        goto fail;
    json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_null(md) && !json_is_object(md)) {
        api_fail(e, 400, "invalid_type", "metadata", "metadata must be an object");
        goto fail;
    }
    out->metadata = md && json_is_object(md) ? md : NULL;
    if (pot_policy_from_name(s->policy) < 0) {
        api_fail(e, 422, "invalid_value", "policy", "policy '%s' is not one of %s", s->policy,
                 pot_policy_list());
        goto fail;
    }
    if (s->schedule && schedule_kind_from_name(s->schedule) < 0) {
        api_fail(e, 422, "invalid_value", "schedule", "schedule '%s' is not one of " SCHEDULE_KIND_LIST,
                 s->schedule);
        goto fail;
    }
    if (budget < 16 || budget > n_ctx) {
        api_fail(e, 422, "invalid_value", "budget_tokens",
                 "budget_tokens %lld must be in [16, %d] (the model's window)", (long long)budget,
                 n_ctx);
        goto fail;
    }
    if (keep && keep >= budget) {
        api_fail(e, 422, "invalid_value", "keep_tokens",
                 "keep_tokens %lld must be smaller than budget_tokens %lld", (long long)keep,
                 (long long)budget);
        goto fail;
    }
    if (chunk > budget) {
        api_fail(e, 422, "invalid_value", "chunk_tokens",
                 "chunk_tokens %lld must not exceed budget_tokens %lld", (long long)chunk,
                 (long long)budget);
        goto fail;
    }
    if (pool % 2 == 0 && pool) {
        api_fail(e, 422, "invalid_value", "pool_width", "pool_width %lld must be odd", (long long)pool);
        goto fail;
    }
    s->budget_tokens = (int32_t)budget;
    s->keep_tokens = (int32_t)keep;
    s->pool_width = (int32_t)pool;
    s->chunk_tokens = (int32_t)chunk;
    s->nuc_share = (float)nuc;
    /* the session's own pot; server/reread.c decides a re-read's */
    s->whole_words = out->whole_words == API_WHOLE_WORDS_ON ||
                     (out->whole_words == API_WHOLE_WORDS_QUESTION && s->question &&
                      pot_policy_from_name(s->policy) == POLICY_FINCH);
    out->ttl_seconds = ttl;
    return 0;
fail:
    api_session_settings_free(out);
    return -1;
}

void api_session_settings_free(api_session_settings *s) {
    json_decref(s->root);
    memset(s, 0, sizeof *s);
}

json_t *api_session_settings_json(const api_session_settings *s) {
    const engine_pot_settings *p = &s->pot;
    json_t *o = json_pack("{s:i, s:s, s:s, s:f}", "budget_tokens", p->budget_tokens, "policy",
                          p->policy ? p->policy : "infinipot", "schedule",
                          p->schedule ? p->schedule : "fixed", "nuc_share", (double)p->nuc_share);
    if (!o) return NULL;
    if (p->keep_tokens) json_object_set_new(o, "keep_tokens", json_integer(p->keep_tokens));
    if (p->chunk_tokens) json_object_set_new(o, "chunk_tokens", json_integer(p->chunk_tokens));
    if (p->pool_width) json_object_set_new(o, "pool_width", json_integer(p->pool_width));
    if (s->whole_words != API_WHOLE_WORDS_QUESTION)
        json_object_set_new(o, "whole_words", api_whole_words_json(s->whole_words));
    if (p->catalyst) json_object_set_new(o, "catalyst", json_string(p->catalyst));
    if (p->question) json_object_set_new(o, "question", json_string(p->question));
    if (p->system) json_object_set_new(o, "system", json_string(p->system));
    if (s->ttl_seconds) json_object_set_new(o, "ttl_seconds", json_integer(s->ttl_seconds));
    if (s->reread) json_object_set_new(o, "reread", json_true());
    if (s->recall != API_RECALL_UNSET) json_object_set_new(o, "recall", api_recall_json(s->recall));
    json_object_set_new(o, "metadata", s->metadata ? json_incref(s->metadata) : json_object());
    return o;
}

/* ---- generation -------------------------------------------------------------------- */

/* The text of a content part: a text part's, or an assistant's refusal part's
 * ({"type": "refusal", "refusal": ...}, which OpenAI's assistant messages may
 * hold: a history replayed with one); NULL for any other. */
static json_t *part_text(const json_t *msg, json_t *part) {
    int refusal = !strcmp(json_string_value(json_object_get(msg, "role")), "assistant") &&
                  json_is_string(json_object_get(part, "type")) &&
                  !strcmp(json_string_value(json_object_get(part, "type")), "refusal");
    json_t *t = json_object_get(part, refusal ? "refusal" : "text");
    return json_is_string(t) ? t : NULL;
}

/* Content of a chat message: a string, or an array of {"type":"text","text":...} parts
 * (an assistant's refusal parts too), joined into one string owned by root under a
 * private key. */
static int message_content(json_t *root, json_t *msg, size_t idx, const char **out, api_error *e) {
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c)) { /* only an assistant's may be absent (its tool calls say it all), as OpenAI's */
        if (strcmp(json_string_value(json_object_get(msg, "role")), "assistant"))
            return api_fail(e, 400, "missing_field", "messages", "messages[%zu] (%s) needs its content", idx,
                            json_string_value(json_object_get(msg, "role")));
        *out = "";
        return 0;
    }
    if (json_is_string(c)) {
        *out = json_string_value(c);
        if (strlen(*out) != json_string_length(c))
            return api_fail(e, 400, "invalid_value", "messages", "messages[%zu].content contains NUL", idx);
        return 0;
    }
    if (!json_is_array(c))
        return api_fail(e, 400, "invalid_type", "messages",
                        "messages[%zu].content must be a string or an array of text parts", idx);
    size_t len = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        json_t *t = json_is_object(part) ? part_text(msg, part) : NULL;
        if (!t)
            return api_fail(e, 400, "invalid_type", "messages",
                            "messages[%zu].content[%zu] must be a text part", idx, i);
        len += json_string_length(t);
    }
    char *joined = malloc(len + 1);
    if (!joined) return api_fail(e, 500, NULL, NULL, "out of memory");
    size_t at = 0;
    json_array_foreach(c, i, part) {
        json_t *t = part_text(msg, part);
        memcpy(joined + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    joined[at] = 0;
    json_t *keep = json_stringn_nocheck(joined, at);
    free(joined);
    if (!keep) return api_fail(e, 500, NULL, NULL, "out of memory");
    char key[48];
    snprintf(key, sizeof key, "\x01joined%zu", idx);
    json_object_set_new(root, key, keep);
    *out = json_string_value(keep);
    return 0;
}

static int parse_messages(api_gen_request *r, api_error *e) {
    json_t *msgs = json_object_get(r->root, "messages");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return api_fail(e, 400, "invalid_value", "messages", "messages must be a non-empty array");
    r->n_messages = json_array_size(msgs);
    r->messages = calloc(r->n_messages, sizeof *r->messages);
    if (!r->messages) return api_fail(e, 500, NULL, NULL, "out of memory");
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", NULL};
    for (size_t i = 0; i < r->n_messages; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role");
        if (!json_is_object(m) || !json_is_string(role) || !one_of(json_string_value(role), roles))
            return api_fail(e, 400, "invalid_value", "messages",
                            "messages[%zu] needs a role: system, developer, user, assistant or tool", i);
        r->messages[i].role = json_string_value(role);
        if (!strcmp(r->messages[i].role, "developer")) r->messages[i].role = "system";
        if (message_content(r->root, m, i, &r->messages[i].content, e)) return -1;
    }
    return 0;
}

/* The token ids of array a into a malloc'd array; 400 naming param (where: the
 * element's path, for the message). */
static int token_list(json_t *a, int32_t n_vocab, const char *param, const char *where, int32_t **out, size_t *n,
                      api_error *e) {
    *n = json_array_size(a);
    if (!*n) return api_fail(e, 400, "invalid_value", param, "%s must not be empty", where);
    *out = malloc(*n * sizeof **out);
    if (!*out) return api_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < *n; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab)
            return api_fail(e, 400, "invalid_value", param, "%s[%zu] must be a token id in [0, %d)", where, i, n_vocab);
        (*out)[i] = (int32_t)json_integer_value(t);
    }
    return 0;
}

/* A list of prompts: strings, or token-id arrays (batch completions). */
static int parse_batch(api_gen_request *r, json_t *p, int32_t n_vocab, api_error *e) {
    size_t n = json_array_size(p);
    int strings = json_is_string(json_array_get(p, 0));
    if (n > API_MAX_BATCH)
        return api_fail(e, 400, "invalid_value", "prompt", "a batch has at most %d prompts", API_MAX_BATCH);
    r->batch_texts = calloc(n, sizeof *r->batch_texts);
    r->batch_tokens = calloc(n, sizeof *r->batch_tokens);
    r->batch_counts = calloc(n, sizeof *r->batch_counts);
    if (!r->batch_texts || !r->batch_tokens || !r->batch_counts) return api_fail(e, 500, NULL, NULL, "out of memory");
    r->n_batch = n;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        char where[32];
        snprintf(where, sizeof where, "prompt[%zu]", i);
        if (strings && json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v)) {
            r->batch_texts[i] = json_string_value(v);
        } else if (!strings && json_is_array(v)) {
            if (token_list(v, n_vocab, "prompt", where, &r->batch_tokens[i], &r->batch_counts[i], e)) return -1;
        } else {
            return api_fail(e, 400, "invalid_value", "prompt", "%s must be a %s like the first prompt", where,
                            strings ? "string" : "token-id array");
        }
    }
    r->prompt = r->batch_texts[0];
    r->prompt_tokens = r->batch_tokens[0];
    r->n_prompt_tokens = r->batch_counts[0];
    return 0;
}

static int parse_prompt(api_gen_request *r, int32_t n_vocab, api_error *e) {
    json_t *p = json_object_get(r->root, "prompt");
    r->n_batch = 1;
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0); /* the openai client sends [prompt] for one prompt */
    if (json_is_array(p) && json_array_size(p) > 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        return parse_batch(r, p, n_vocab, e);
    if (json_is_string(p)) {
        r->prompt = json_string_value(p);
        if (strlen(r->prompt) != json_string_length(p))
            return api_fail(e, 400, "invalid_value", "prompt", "prompt contains NUL");
        return 0;
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return api_fail(e, 400, "invalid_value", "prompt",
                        "prompt must be a string, an array of token ids, or a list of either");
    return token_list(p, n_vocab, "prompt", "prompt", &r->prompt_tokens, &r->n_prompt_tokens, e);
}

static int parse_stop(api_gen_request *r, api_error *e) {
    json_t *s = json_object_get(r->root, "stop");
    if (!s || json_is_null(s)) return 0;
    if (!json_is_string(s) && !json_is_array(s))
        return api_fail(e, 400, "invalid_type", "stop", "stop must be a string or an array of strings");
    size_t n = json_is_string(s) ? 1 : json_array_size(s);
    if (n > 16) return api_fail(e, 400, "invalid_value", "stop", "stop takes up to 16 strings, not %zu", n);
    r->stops = calloc(n ? n : 1, sizeof *r->stops);
    if (!r->stops) return api_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_string(s) ? s : json_array_get(s, i);
        if (!json_is_string(v)) return api_fail(e, 400, "invalid_type", "stop", "stop[%zu] must be a string", i);
        r->stops[i] = json_string_value(v);
    }
    r->params.stop = r->stops;
    r->params.n_stop = n;
    return 0;
}

static int parse_bias(api_gen_request *r, int32_t n_vocab, api_error *e) {
    json_t *b = json_object_get(r->root, "logit_bias");
    if (!b || json_is_null(b)) return 0;
    if (!json_is_object(b)) return api_fail(e, 400, "invalid_type", "logit_bias", "logit_bias must be an object");
    size_t n = json_object_size(b);
    r->bias = calloc(n ? n : 1, sizeof *r->bias);
    if (!r->bias) return api_fail(e, 500, NULL, NULL, "out of memory");
    const char *key;
    json_t *v;
    size_t i = 0;
    json_object_foreach(b, key, v) {
        char *end;
        long tok = strtol(key, &end, 10);
        /* a token id written plainly: " 5", "+5" and "05" would name 5 twice over */
        int plain = key[0] >= '0' && key[0] <= '9' && !(key[0] == '0' && key[1]);
        if (!plain || *end || tok >= n_vocab)
            return api_fail(e, 400, "invalid_value", "logit_bias", "logit_bias key '%s' is not a token id", key);
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            return api_fail(e, 400, "invalid_value", "logit_bias", "logit_bias values must be in [-100, 100]");
        double d = json_number_value(v);
        r->bias[i++] = (logit_bias){(int32_t)tok, d <= -100 ? -INFINITY : (float)d};
    }
    r->params.sampling.bias = r->bias;
    r->params.sampling.n_bias = n;
    return 0;
}

/* Fields other servers act on that this one does not: refused rather than
 * ignored, since ignoring them would change what the client gets back
 * silently (text instead of a call). */
static int refuse_unserved(json_t *root, int chat, api_error *e) {
    static const char *const legacy[] = {"functions", "function_call"};
    for (size_t i = 0; chat && i < 2; i++) {
        json_t *v = json_object_get(root, legacy[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && !json_array_size(v)))
            return api_fail(e, 400, "unsupported_parameter", legacy[i],
                            "%s (OpenAI's deprecated function calling) is not supported: send tools and tool_choice", legacy[i]);
    }
    return 0;
}

int api_parse_gen_request(json_t *body, int chat, int32_t n_vocab, api_gen_request *r, api_error *e) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->reread = -1;
    r->recall = API_RECALL_UNSET;
    if (!json_is_object(body)) return api_fail(e, 400, "invalid_json", NULL, "the body must be a JSON object");
    r->root = json_incref(body);
    engine_gen_params *gp = &r->params;
    gp->sampling = sample_params_default();
    gp->max_tokens = chat ? 0 : 16;
    sample_params *sp = &gp->sampling;
    int64_t max_tokens = gp->max_tokens, top_k = 0, seed = 0, n_choices = 1, top_lp = 0;
    double temp = 1, top_p = 1, min_p = 0, pres = 0, freq = 0, rep = 1;
    int lp_bool = 0;
    const char *overflow = NULL;
    json_t *lp = json_object_get(r->root, "logprobs");
    if ((chat ? parse_messages(r, e) : parse_prompt(r, n_vocab, e)) || refuse_unserved(r->root, chat, e) ||
        get_string(r->root, "model", &r->model, e) ||
        get_int(r->root, "max_tokens", 1, INT32_MAX, &max_tokens, e) ||
        get_int(r->root, "max_completion_tokens", 1, INT32_MAX, &max_tokens, e) ||
        get_float(r->root, "temperature", 0, 2, &temp, e) ||
        get_float(r->root, "top_p", 0, 1, &top_p, e) ||
        get_int(r->root, "top_k", 0, INT32_MAX, &top_k, e) ||
        get_float(r->root, "min_p", 0, 1, &min_p, e) ||
        get_int(r->root, "seed", INT64_MIN, INT64_MAX, &seed, e) ||
        get_int(r->root, "n", 1, API_MAX_N, &n_choices, e) || get_bool(r->root, "stream", &r->stream, e) ||
        get_float(r->root, "presence_penalty", -2, 2, &pres, e) ||
        get_float(r->root, "frequency_penalty", -2, 2, &freq, e) ||
        get_float(r->root, "repetition_penalty", 0.01, 10, &rep, e) ||
        get_string(r->root, "session", &r->session, e) ||
        get_string(r->root, "overflow", &overflow, e) || get_bool(r->root, "reread", &r->reread, e) ||
        get_recall(r->root, &r->recall, e) || parse_stop(r, e) || (!chat && get_bool(r->root, "echo", &r->echo, e)) ||
        (!chat && get_string(r->root, "suffix", &r->suffix, e)) ||
        parse_bias(r, n_vocab, e) || api_parse_response_format(r->root, &r->format_schema, e) ||
        (chat && api_parse_tools(r, e)))
        return -1;
    /* chat: logprobs is a boolean with top_logprobs; completions: logprobs is the count */
    r->enable_thinking = -1; /* (not given) */
    json_t *kw = json_object_get(r->root, "chat_template_kwargs"); /* llama-server's and vLLM's spelling */
    if (kw && !json_is_null(kw) && !json_is_object(kw))
        return api_fail(e, 400, "invalid_type", "chat_template_kwargs", "chat_template_kwargs must be an object");
    if (get_bool(r->root, "enable_thinking", &r->enable_thinking, e) ||
        (kw && get_bool(kw, "enable_thinking", &r->enable_thinking, e)))
        return -1;
    /* OpenAI's reasoning_effort (the Responses API's reasoning.effort comes as it): a thinking
       template thinks unless the effort is none or minimal; non-thinking templates ignore it, as
       they ignore enable_thinking */
    const char *effort = NULL;
    if (get_string(r->root, "reasoning_effort", &effort, e)) return -1;
    if (effort) {
        static const char *const off[] = {"none", "minimal", NULL}, *const on[] = {"low", "medium", "high", "xhigh", NULL};
        int think = one_of(effort, off) ? 0 : one_of(effort, on) ? 1 : -1;
        if (think < 0)
            return api_fail(e, 400, "invalid_value", "reasoning_effort",
                            "reasoning_effort must be none, minimal, low, medium, high or xhigh, not '%.40s'", effort);
        if (r->enable_thinking >= 0 && r->enable_thinking != think)
            return api_fail(e, 400, "invalid_value", "reasoning_effort",
                            "reasoning_effort '%s' and enable_thinking %s disagree", effort,
                            r->enable_thinking ? "true" : "false");
        r->enable_thinking = think;
    }
    if (r->enable_thinking < 0) r->enable_thinking = 1;
    if (chat) {
        if (get_bool(r->root, "logprobs", &lp_bool, e) ||
            get_int(r->root, "top_logprobs", 0, SAMPLE_MAX_TOP_LOGPROBS, &top_lp, e))
            return -1;
        if (top_lp && !lp_bool)
            return api_fail(e, 400, "invalid_value", "top_logprobs", "top_logprobs needs logprobs: true");
    } else if (lp && !json_is_null(lp)) {
        if (get_int(r->root, "logprobs", 0, 5, &top_lp, e)) return -1;
        lp_bool = 1;
    }
    if (r->suffix && !*r->suffix) r->suffix = NULL; /* "" asks for nothing after the answer */
    if (r->suffix && (r->prompt_tokens || r->n_batch > 1 || r->echo || r->session))
        return api_fail(e, 400, "unsupported_value", "suffix", "suffix (fill-in-the-middle) takes one text prompt, "
                        "without echo or a session");
    if (overflow && strcmp(overflow, "error") && strcmp(overflow, "pot"))
        return api_fail(e, 400, "invalid_value", "overflow", "overflow must be \"error\" or \"pot\"");
    json_t *so = json_object_get(r->root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return api_fail(e, 400, "invalid_type", "stream_options", "stream_options must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    r->overflow_error = overflow && !strcmp(overflow, "error");
    int64_t best_of = n_choices; /* completions: answers made, of which the n likeliest are returned */
    if (!chat && get_int(r->root, "best_of", 1, API_MAX_N, &best_of, e)) return -1;
    if (best_of < n_choices)
        return api_fail(e, 400, "invalid_value", "best_of", "best_of (%lld) must be at least n (%lld)",
                        (long long)best_of, (long long)n_choices);
    if (best_of > n_choices && r->stream)
        return api_fail(e, 400, "invalid_value", "best_of", "best_of above n cannot be streamed: the answers are "
                        "compared once they are whole");
    r->n_returned = (int)n_choices;
    r->n_choices = (int)best_of;
    if (chat) r->n_batch = 1;
    gp->max_tokens = (int32_t)max_tokens;
    sp->temperature = (float)temp;
    sp->top_p = (float)top_p > 0 ? (float)top_p : FLT_MIN; /* 0, as OpenAI allows: the likeliest token */
    sp->top_k = (int32_t)top_k;
    sp->min_p = (float)min_p;
    sp->seed = (uint64_t)seed;
    sp->presence_penalty = (float)pres;
    sp->frequency_penalty = (float)freq;
    sp->repeat_penalty = (float)rep;
    sp->n_top_logprobs = (int32_t)top_lp;
    r->logprobs = lp_bool;
    r->top_logprobs = (int)top_lp;
    gp->want_logprobs = lp_bool || r->n_choices > r->n_returned; /* (best_of compares them) */
    return 0;
}

void api_gen_request_free(api_gen_request *r) {
    free(r->messages);
    if (r->batch_tokens)
        for (size_t i = 0; i < r->n_batch; i++) free(r->batch_tokens[i]); /* [0] is prompt_tokens */
    else free(r->prompt_tokens);
    free(r->batch_tokens);
    free(r->batch_texts);
    free(r->batch_counts);
    free(r->stops);
    free(r->bias);
    grammar_unref(r->grammar);
    json_decref(r->format_schema);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

int api_gen_request_constrained(const api_gen_request *r) {
    return r->format_schema || r->tool_choice == TOOL_CHOICE_REQUIRED || r->tool_choice == TOOL_CHOICE_NAMED;
}

int api_gen_request_compile(api_gen_request *r, api_error *e) {
    grammar *g = NULL;
    if (r->tool_choice == TOOL_CHOICE_REQUIRED || r->tool_choice == TOOL_CHOICE_NAMED)
        g = api_tool_call_grammar(r, e); /* (replaces any response_format) */
    else if (r->format_schema)
        g = api_schema_grammar(r->format_schema, "response_format", e);
    else
        return 0;
    if (!g) return -1;
    grammar_unref(r->grammar);
    r->grammar = r->params.grammar = g;
    return 0;
}

int api_parse_tokenize(json_t *body, const char **content, int *add_special, json_t **root, api_error *e) {
    if (!json_is_object(body)) return api_fail(e, 400, "invalid_json", NULL, "the body must be a JSON object");
    *root = json_incref(body);
    *content = NULL;
    *add_special = 0;
    if (get_string(*root, "content", content, e) || get_bool(*root, "add_special", add_special, e))
        goto fail;
    if (!*content) {
        api_fail(e, 400, "missing_field", "content", "content is required");
        goto fail;
    }
    return 0;
fail:
    json_decref(*root);
    *root = NULL;
    return -1;
}

int api_parse_detokenize(json_t *body, int32_t n_vocab, int32_t **tokens, size_t *n_tokens, api_error *e) {
    json_t *t = json_object_get(body, "tokens");
    int rc = 0;
    *tokens = NULL;
    *n_tokens = 0;
    if (!json_is_object(body)) {
        rc = api_fail(e, 400, "invalid_json", NULL, "the body must be a JSON object");
    } else if (!json_is_array(t)) {
        rc = api_fail(e, 400, "missing_field", "tokens", "tokens must be an array of token ids");
    } else {
        *n_tokens = json_array_size(t);
        *tokens = malloc((*n_tokens ? *n_tokens : 1) * sizeof **tokens);
        if (!*tokens) rc = api_fail(e, 500, NULL, NULL, "out of memory");
        for (size_t i = 0; !rc && i < *n_tokens; i++) {
            json_t *v = json_array_get(t, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= n_vocab)
                rc = api_fail(e, 400, "invalid_value", "tokens", "tokens[%zu] must be a token id in [0, %d)", i, n_vocab);
            else (*tokens)[i] = (int32_t)json_integer_value(v);
        }
    }
    if (rc) {
        free(*tokens);
        *tokens = NULL;
    }
    return rc;
}

/* One input of /v1/embeddings: a string (not empty, no NUL) or token ids. */
static int embed_input(api_embed_request *q, size_t i, json_t *v, int strings, int32_t n_vocab, const char *where,
                       api_error *e) {
    if (strings && json_is_string(v)) {
        if (!json_string_length(v)) return api_fail(e, 400, "invalid_value", "input", "%s must not be empty", where);
        if (strlen(json_string_value(v)) != json_string_length(v))
            return api_fail(e, 400, "invalid_value", "input", "%s must not contain NUL characters", where);
        q->texts[i] = json_string_value(v);
        return 0;
    }
    if (!strings && json_is_array(v)) return token_list(v, n_vocab, "input", where, &q->tokens[i], &q->counts[i], e);
    return api_fail(e, 400, "invalid_type", "input", "%s must be a %s like the first input", where,
                    strings ? "string" : "token-id array");
}

int api_parse_embeddings(json_t *body, int32_t n_vocab, int32_t n_embd, api_embed_request *q, api_error *e) {
    memset(q, 0, sizeof *q);
    if (!json_is_object(body)) return api_fail(e, 400, "invalid_json", NULL, "the body must be a JSON object");
    q->root = json_incref(body);
    json_t *in = json_object_get(body, "input");
    const char *format = NULL;
    int64_t dims = n_embd;
    if (get_string(body, "encoding_format", &format, e) || get_int(body, "dimensions", 1, INT32_MAX, &dims, e))
        return -1;
    if (format && strcmp(format, "float") && strcmp(format, "base64"))
        return api_fail(e, 400, "invalid_value", "encoding_format", "encoding_format must be \"float\" or \"base64\"");
    q->base64 = format && !strcmp(format, "base64");
    if (dims != n_embd)
        return api_fail(e, 400, "unsupported_value", "dimensions",
                        "this model's embeddings have %d dimensions; shortening them is not supported", n_embd);
    if (!in || json_is_null(in)) return api_fail(e, 400, "missing_field", "input", "input is required");
    /* a list of inputs, or one: a string or a token-id array */
    int list = json_is_array(in) && json_array_size(in) &&
               (json_is_string(json_array_get(in, 0)) || json_is_array(json_array_get(in, 0)));
    if (!json_is_string(in) && !json_is_array(in))
        return api_fail(e, 400, "invalid_type", "input",
                        "input must be a string, an array of strings, an array of token ids, or a list of those");
    q->n = list ? json_array_size(in) : 1;
    if (q->n > API_MAX_EMBED_INPUTS)
        return api_fail(e, 400, "invalid_value", "input", "input has at most %d items, not %zu", API_MAX_EMBED_INPUTS,
                        q->n);
    q->texts = calloc(q->n, sizeof *q->texts);
    q->tokens = calloc(q->n, sizeof *q->tokens);
    q->counts = calloc(q->n, sizeof *q->counts);
    if (!q->texts || !q->tokens || !q->counts) return api_fail(e, 500, NULL, NULL, "out of memory");
    if (!list) return embed_input(q, 0, in, json_is_string(in), n_vocab, "input", e);
    int strings = json_is_string(json_array_get(in, 0));
    for (size_t i = 0; i < q->n; i++) {
        char where[32];
        snprintf(where, sizeof where, "input[%zu]", i);
        if (embed_input(q, i, json_array_get(in, i), strings, n_vocab, where, e)) return -1;
    }
    return 0;
}

void api_embed_request_free(api_embed_request *q) {
    for (size_t i = 0; q->tokens && i < q->n; i++) free(q->tokens[i]);
    free(q->tokens);
    free(q->texts);
    free(q->counts);
    json_decref(q->root);
    memset(q, 0, sizeof *q);
}

void api_random_id(char *out, size_t cap, const char *prefix) {
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

const char *api_finish_reason(enum engine_finish f) {
    /* a deadline that cut the answer short reads like max_tokens did */
    return f == ENGINE_FINISH_LENGTH || f == ENGINE_FINISH_TIMEOUT ? "length" : "stop";
}
