/* Engine: ties the model, tokenizer, chat template, sampler and a backend
 * together into load / tokenize / generate. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine_internal.h"
#include "quant.h"


double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

engine *engine_open(const char *path, const engine_options *opt, char *err, size_t errlen) {
    engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    e->n_threads = opt && opt->n_threads > 0 ? opt->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (e->n_threads < 1) e->n_threads = 1;
    e->m = model_load(path, err, errlen);
    if (!e->m) goto bad;
    if (opt && opt->chat_template) {
        enum chat_family f = chat_family_from_name(opt->chat_template);
        if (f == CHAT_UNKNOWN) {
            snprintf(err, errlen, "unknown chat template '%s' (known: %s)", opt->chat_template,
                     chat_family_list());
            goto bad;
        }
        /* keep what detection learned (default system prompt) when the family agrees */
        if (e->m->chat.family != f) {
            e->m->chat.family = f;
            e->m->chat.default_system[0] = 0;
        }
    }
    e->kv_dtype = opt && (opt->exact || opt->kv_f32) ? POT_F32 : POT_F16;
    e->be = cpu_backend_new(e->m, e->n_threads, opt ? opt->exact : 0, err, errlen);
    if (!e->be) goto bad;
    return e;
bad:
    engine_close(e);
    return NULL;
}

void engine_close(engine *e) {
    if (!e) return;
    if (e->be) e->be->free(e->be);
    model_free(e->m);
    free(e);
}

void engine_get_info(const engine *e, engine_info *info) {
    const model *m = e->m;
    memset(info, 0, sizeof *info);
    info->arch = m->arch;
    info->name = m->name;
    info->quant = quant_type_name(m->main_type);
    info->tokenizer = tokenizer_model_name(m->tok);
    info->chat_family = m->chat.family == CHAT_UNKNOWN ? "unrecognised" : chat_family_name(m->chat.family);
    info->n_layer = m->n_layer;
    info->n_embd = m->n_embd;
    info->n_ff = m->n_ff;
    info->n_head = m->n_head;
    info->n_head_kv = m->n_head_kv;
    info->head_dim = m->head_dim;
    info->n_vocab = m->n_vocab;
    info->n_ctx_train = m->n_ctx_train;
    info->rope_base = m->rope_base;
    info->norm_eps = m->norm_eps;
    info->n_params = m->n_params;
    info->tied_output = m->tied_output;
    info->n_threads = e->n_threads;
}

int64_t engine_tokenize(const engine *e, const char *text, size_t len, int add_special,
                        int parse_special, int32_t *out, int64_t cap) {
    return tokenizer_encode(e->m->tok, text, len, add_special, parse_special, out, cap);
}

int engine_token_text(const engine *e, int32_t id, char *buf, size_t cap) {
    return tokenizer_piece(e->m->tok, id, 1, buf, cap);
}

int32_t engine_eos(const engine *e) { return tokenizer_eos(e->m->tok); }

char *engine_render_chat(const engine *e, const engine_message *msgs, size_t n, char *err,
                         size_t errlen) {
    if (e->m->chat.family == CHAT_UNKNOWN) {
        snprintf(err, errlen,
                 "the model's chat template is not recognised; choose one of %s with "
                 "--chat-template NAME",
                 chat_family_list());
        return NULL;
    }
    chat_message *cm = calloc(n ? n : 1, sizeof *cm);
    if (!cm) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        cm[i].role = msgs[i].role;
        cm[i].content = msgs[i].content;
    }
    char *out = chat_render(&e->m->chat, cm, n, 1, err, errlen);
    free(cm);
    return out;
}

int32_t *engine_tokenize_prompt(const engine *e, const char *prompt, int chat, size_t *n,
                                char *err, size_t errlen) {
    size_t len = strlen(prompt);
    /* a chat rendering carries its own BOS text when the template writes one */
    int add_special = !chat, parse_special = chat;
    int64_t cnt = engine_tokenize(e, prompt, len, add_special, parse_special, NULL, 0);
    if (cnt < 0) {
        snprintf(err, errlen, "prompt is not valid UTF-8");
        return NULL;
    }
    int32_t *ids = malloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
    if (!ids) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    engine_tokenize(e, prompt, len, add_special, parse_special, ids, cnt);
    *n = (size_t)cnt;
    return ids;
}

/* Runs tokens through the pot in PREFILL_CHUNK pieces; logits of the last
 * token into `logits` when non-NULL. */
int prefill(engine *e, pot *p, const int32_t *tokens, size_t n, float *logits, char *err,
                   size_t errlen) {
    for (size_t i = 0; i < n; i += PREFILL_CHUNK) {
        size_t len = n - i < PREFILL_CHUNK ? n - i : PREFILL_CHUNK;
        int last = i + len == n;
        backend_span sp = {.tokens = tokens + i, .n_tokens = (int32_t)len, .kv = p,
                           .logits_mode = last && logits ? BACKEND_LOGITS_LAST : BACKEND_LOGITS_NONE,
                           .logits = logits};
        if (e->be->forward(e->be, &sp, 1, err, errlen)) return -1;
    }
    return 0;
}

pot *new_pot(engine *e, size_t capacity, char *err, size_t errlen) {
    const model *m = e->m;
    if (capacity > (size_t)m->n_ctx_train) {
        snprintf(err, errlen, "%zu tokens exceed the model's context of %d tokens", capacity,
                 m->n_ctx_train);
        return NULL;
    }
    return pot_new(m->n_layer, m->n_head_kv, m->head_dim, (int32_t)capacity, e->kv_dtype, err,
                   errlen);
}

int engine_prompt_logits(engine *e, const int32_t *tokens, size_t n, float *logits, char *err,
                         size_t errlen) {
    if (n == 0) {
        snprintf(err, errlen, "empty prompt");
        return -1;
    }
    pot *p = new_pot(e, n, err, errlen);
    if (!p) return -1;
    int rc = prefill(e, p, tokens, n, logits, err, errlen);
    pot_free(p);
    return rc;
}

/* Emits text through the stop matcher; returns 1 to stop (stop string or
 * callback cancelled). */
static int emit_text(stop_matcher *sm, const char *text, size_t len, int32_t tok,
                     const sample_logprobs *lp, engine_text_cb cb, void *user, int *cancelled) {
    const char *out;
    size_t n_out;
    int hit = stop_matcher_push(sm, text, len, &out, &n_out);
    if (n_out && cb && cb(user, out, n_out, tok, lp)) *cancelled = 1;
    return hit || *cancelled;
}

/* Recycled attention's state during one generation. */
typedef struct recycler {
    int32_t stride, keep, step;
    int32_t *chosen;   /* [n_layer][n_head_kv][keep] slots picked at the last full step */
    int32_t *attend;   /* [n_layer][n_head_kv][keep + stride] what a partial step reads */
    float *scores;     /* [n_layer][n_head_kv][capacity] */
    int32_t full_n;    /* pot size right after the last full step */
    int active;
} recycler;

static void recycler_free(recycler *r) {
    free(r->chosen);
    free(r->attend);
    free(r->scores);
}

/* Runs one decode step for tok, full or partial as the schedule says. */
static int decode_step(engine *e, pot *p, recycler *r, int32_t tok, float *logits, char *err,
                       size_t errlen) {
    backend_span sp = {.tokens = &tok, .n_tokens = 1, .kv = p,
                       .logits_mode = BACKEND_LOGITS_LAST, .logits = logits};
    /* full attention while the pot (with this token) is no larger than the recycled set */
    if (!r->active || p->n + 1 <= r->keep) return e->be->forward(e->be, &sp, 1, err, errlen);
    int full = r->step++ % r->stride == 0;
    int32_t L = p->n_layer, G = p->n_head_kv;
    if (full) {
        int32_t n_keys = p->n + 1;
        sp.scores = r->scores;
        sp.n_score_rows = 1;
        sp.score_combine = BACKEND_SCORE_MAX;
        if (e->be->forward(e->be, &sp, 1, err, errlen)) return -1;
        select_params sel = {.policy = POLICY_FINCH, .n_keep = r->keep, .scores = r->scores,
                             .scores_stride = n_keys};
        if (pot_select(p, &sel, r->chosen, err, errlen)) return -1;
        r->full_n = p->n;
        return 0;
    }
    int32_t recent = p->n - r->full_n, n_attend = r->keep + recent;
    for (int32_t lh = 0; lh < L * G; lh++) {
        int32_t *dst = r->attend + (size_t)lh * n_attend;
        memcpy(dst, r->chosen + (size_t)lh * r->keep, (size_t)r->keep * sizeof *dst);
        for (int32_t i = 0; i < recent; i++) dst[r->keep + i] = r->full_n + i;
    }
    sp.attend_slots = r->attend;
    sp.n_attend = n_attend;
    return e->be->forward(e->be, &sp, 1, err, errlen);
}

static int recycler_init(recycler *r, const pot *p, const engine_gen_params *gp, char *err,
                         size_t errlen) {
    memset(r, 0, sizeof *r);
    if (gp->recycle_stride <= 1) return 0;
    if (gp->recycle_keep <= 0) return snprintf(err, errlen, "recycle_keep must be positive"), -1;
    size_t lh = (size_t)p->n_layer * p->n_head_kv;
    r->stride = gp->recycle_stride;
    r->keep = gp->recycle_keep;
    r->chosen = malloc(lh * r->keep * sizeof *r->chosen);
    r->attend = malloc(lh * ((size_t)r->keep + r->stride) * sizeof *r->attend);
    r->scores = malloc(lh * (size_t)p->capacity * sizeof *r->scores);
    if (!r->chosen || !r->attend || !r->scores) {
        recycler_free(r);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    r->active = 1;
    return 0;
}

int engine_continue(engine *e, pot *p, const int32_t *prompt, size_t n_prompt,
                    const engine_gen_params *gp, engine_text_cb cb, void *user,
                    engine_gen_result *res, char *err, size_t errlen) {
    const model *m = e->m;
    memset(res, 0, sizeof *res);
    if (n_prompt == 0) {
        snprintf(err, errlen, "empty prompt");
        return -1;
    }
    if ((size_t)p->n + n_prompt > (size_t)p->capacity) {
        snprintf(err, errlen, "prompt of %zu tokens does not fit the %d free slots", n_prompt,
                 p->capacity - p->n);
        return -1;
    }
    recycler rec;
    if (recycler_init(&rec, p, gp, err, errlen)) return -1;
    float *logits = malloc((size_t)m->n_vocab * sizeof(float));
    sampler *s = logits ? sampler_new(&gp->sampling, m->n_vocab, err, errlen) : NULL;
    stop_matcher *sm = s ? stop_matcher_new(gp->stop, gp->n_stop) : NULL;
    int rc = -1;
    if (!sm) {
        if (!logits || s) snprintf(err, errlen, "out of memory"); /* else sampler_new said why */
        goto done;
    }
    for (size_t i = 0; i < n_prompt; i++) sampler_accept(s, prompt[i]);

    double t0 = now_ms();
    if (prefill(e, p, prompt, n_prompt, logits, err, errlen)) goto done;
    res->n_prompt = (int64_t)n_prompt;
    res->prefill_ms = now_ms() - t0;
    t0 = now_ms();

    detok_state ds = {.leading_space_done = 1}; /* generated text keeps its first space */
    char text[256];
    int cancelled = 0, stopped = 0;
    res->finish = ENGINE_FINISH_LENGTH;
    while (!stopped) {
        if (gp->max_tokens > 0 && res->n_generated >= gp->max_tokens) break;
        sample_logprobs lp;
        int32_t tok = sampler_sample(s, logits, gp->want_logprobs ? &lp : NULL);
        if (gp->tokens_out && gp->max_tokens > 0) gp->tokens_out[res->n_generated] = tok;
        res->n_generated++;
        if (tokenizer_is_eog(m->tok, tok)) {
            res->finish = ENGINE_FINISH_STOP;
            break;
        }
        sampler_accept(s, tok);
        size_t n = detok_push(m->tok, &ds, tok, 0, text, sizeof text);
        if (emit_text(sm, text, n, tok, gp->want_logprobs ? &lp : NULL, cb, user, &cancelled)) {
            res->finish = cancelled ? ENGINE_FINISH_CANCELLED : ENGINE_FINISH_STOP;
            stopped = 1;
            break;
        }
        if (p->n >= p->capacity) break; /* context full */
        if (decode_step(e, p, &rec, tok, logits, err, errlen)) goto done;
    }
    if (!stopped) {
        size_t n = detok_flush(&ds, text, sizeof text);
        const char *out;
        size_t n_out;
        if (n) emit_text(sm, text, n, -1, NULL, cb, user, &cancelled);
        stop_matcher_flush(sm, &out, &n_out);
        if (n_out && cb) cb(user, out, n_out, -1, NULL);
    }
    res->decode_ms = now_ms() - t0;
    rc = 0;
done:
    recycler_free(&rec);
    stop_matcher_free(sm);
    sampler_free(s);
    free(logits);
    return rc;
}

int engine_generate(engine *e, const int32_t *prompt, size_t n_prompt, const engine_gen_params *gp,
                    engine_text_cb cb, void *user, engine_gen_result *res, char *err,
                    size_t errlen) {
    const model *m = e->m;
    size_t capacity = gp->max_tokens > 0 ? n_prompt + (size_t)gp->max_tokens : (size_t)m->n_ctx_train;
    if (capacity > (size_t)m->n_ctx_train) capacity = (size_t)m->n_ctx_train;
    if (n_prompt >= capacity) {
        memset(res, 0, sizeof *res);
        snprintf(err, errlen, "prompt of %zu tokens leaves no room in the model's context of %d",
                 n_prompt, m->n_ctx_train);
        return -1;
    }
    pot *p = new_pot(e, capacity, err, errlen);
    if (!p) return -1;
    int rc = engine_continue(e, p, prompt, n_prompt, gp, cb, user, res, err, errlen);
    pot_free(p);
    return rc;
}
