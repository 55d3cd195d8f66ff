/* Engine: ties the model, tokenizer, chat template, sampler and a backend
 * together into load / tokenize / generate. */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "cuda/cuda_backend.h"
#include "engine_internal.h"
#include "quant.h"



/* The CUDA backend is linked only into `make CUDA=1` builds; in the others
 * these weak references (the header's own prototypes, so a signature change
 * fails to compile here) are NULL, so one engine object serves both. */
#pragma weak cuda_probe
#pragma weak cuda_backend_new

static backend *open_backend(engine *e, const engine_options *opt, char *err, size_t errlen) {
    int exact = opt ? opt->exact : 0;
    const char *name = opt && opt->backend ? opt->backend : "cpu";
    if (!strcmp(name, "cpu")) return cpu_backend_new(e->m, e->n_threads, exact, err, errlen);
    if (strcmp(name, "cuda")) {
        snprintf(err, errlen, "unknown backend '%s' (cpu, cuda)", name);
        return NULL;
    }
    if (!cuda_probe || !cuda_backend_new) {
        snprintf(err, errlen, "the cuda backend is not built into this binary (build with make CUDA=1)");
        return NULL;
    }
    if (cuda_probe(err, errlen)) return NULL; /* no device, or no driver: err says which */
    return cuda_backend_new(e->m, e->n_threads, exact, err, errlen);
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
    e->be = open_backend(e, opt, err, errlen);
    if (!e->be) goto bad;
    return e;
bad:
    engine_close(e);
    return NULL;
}

void engine_close(engine *e) {
    if (!e) return;
    if (e->be) e->be->free(e->be);
    vocab_trie_free(e->trie);
    prompt_cache_free(e->pc);
    model_free(e->m);
    free(e);
}

size_t engine_pot_device_memory(const engine *e) {
    return e->be->pot_memory ? e->be->pot_memory(e->be) : 0;
}

void engine_get_info(const engine *e, engine_info *info) {
    const model *m = e->m;
    memset(info, 0, sizeof *info);
    info->arch = m->arch;
    info->name = m->name;
    info->quant = quant_type_name(m->main_type);
    info->tokenizer = tokenizer_model_name(m->tok);
    info->chat_family = m->chat.family == CHAT_UNKNOWN ? "unrecognised" : chat_family_name(m->chat.family);
    info->pooling = m->pooling == POOLING_CLS ? "cls" : m->pooling == POOLING_LAST ? "last" : "mean";
    info->bos_added = tokenizer_adds_bos(m->tok) ? tokenizer_bos(m->tok) : -1;
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
    info->rope_scaling = m->rope_scaling;
    info->rope_factor = 1.0f / m->rope[0].freq_scale;
    info->sliding_window = m->n_swa;
    info->n_sliding_layers = m->n_swa_layers;
    info->n_params = m->n_params;
    info->tied_output = m->tied_output;
    info->n_threads = e->n_threads;
}

int32_t engine_layer_window(const engine *e, int32_t layer) {
    return layer >= 0 && layer < e->m->n_layer ? e->m->layers[layer].window : 0;
}

int64_t engine_tokenize(const engine *e, const char *text, size_t len, int add_special,
                        int parse_special, int32_t *out, int64_t cap) {
    return tokenizer_encode(e->m->tok, text, len, add_special, parse_special, out, cap);
}

int engine_token_text(const engine *e, int32_t id, char *buf, size_t cap) {
    return tokenizer_piece(e->m->tok, id, 1, buf, cap);
}

char *engine_detokenize(const engine *e, const int32_t *ids, size_t n, size_t limit, size_t *len) {
    size_t cap = n * 8 + 64;
    char *text = malloc(cap);
    *len = 0;
    for (size_t i = 0; text && i < n; i++) {
        int k = engine_token_text(e, ids[i], text + *len, cap - *len - 1);
        if (k > 0 && (size_t)k > cap - *len - 1) { /* a long piece (a run of spaces is 160 bytes in SmolLM2) */
            cap = (cap + (size_t)k) * 2;
            char *t = realloc(text, cap);
            if (!t) free(text);
            text = t;
            if (text) k = engine_token_text(e, ids[i], text + *len, cap - *len - 1);
        }
        if (text && k > 0) *len += (size_t)k;
        if (*len > limit) { /* long pieces make text of many times the ids' size */
            free(text);
            return NULL;
        }
    }
    if (!text) return NULL;
    text[*len] = 0;
    for (size_t i = 0; i < *len;) { /* ids that end inside a character: U+FFFD, as a generation writes it */
        uint32_t cp;
        int l = utf8_seq((const unsigned char *)text + i, *len - i, &cp);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        char *clean = malloc(3 * *len + 1);
        if (clean) *len = tokenizer_utf8_clean(text, *len, clean, 3 * *len);
        free(text);
        if (!clean || *len > limit) {
            free(clean);
            return NULL;
        }
        clean[*len] = 0;
        return clean;
    }
    return text;
}

int engine_set_prompt_cache(engine *e, int entries, size_t max_bytes) {
    prompt_cache_free(e->pc);
    e->pc = entries > 0 ? prompt_cache_new(entries, max_bytes) : NULL;
    return entries > 0 && !e->pc ? -1 : 0;
}

const vocab_trie *engine_vocab_trie(engine *e) {
    if (e->trie) return e->trie;
    const tokenizer *tk = e->m->tok;
    int32_t n = tokenizer_n_vocab(tk);
    uint32_t *off = malloc(((size_t)n + 1) * sizeof *off);
    size_t cap = (size_t)n * 8 + 256, len = 0;
    char *bytes = malloc(cap);
    int ok = off && bytes;
    for (int32_t id = 0; ok && id < n; id++) {
        off[id] = (uint32_t)len;
        if (tokenizer_is_eog(tk, id)) continue; /* the end is the grammar's to allow */
        int k = tokenizer_piece(tk, id, 0, bytes + len, cap - len);
        if (k > 0 && (size_t)k > cap - len) {
            cap = (cap + (size_t)k) * 2;
            char *t = realloc(bytes, cap);
            if (!t) {
                ok = 0;
                break;
            }
            bytes = t;
            k = tokenizer_piece(tk, id, 0, bytes + len, cap - len);
        }
        if (k > 0) len += (size_t)k;
    }
    if (ok) {
        off[n] = (uint32_t)len;
        e->trie = vocab_trie_new(bytes, off, n);
    }
    free(off);
    free(bytes);
    return e->trie;
}

int32_t engine_eos(const engine *e) { return tokenizer_eos(e->m->tok); }

char *engine_render_chat(const engine *e, const engine_message *msgs, size_t n, int enable_thinking,
                         chat_spans *spans, char *err, size_t errlen) {
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
    const chat_options opt = {.no_thinking = !enable_thinking};
    char *out = chat_render_spans(&e->m->chat, cm, n, 1, &opt, spans, err, errlen);
    free(cm);
    return out;
}

int32_t *engine_tokenize_chat(const engine *e, const char *text, size_t from, size_t to, const chat_spans *spans,
                              size_t *n) {
    size_t *cut = malloc((spans->n + 1) * sizeof *cut), n_cut = 0; /* spans within [from, to), from 0 */
    if (!cut) return NULL;
    for (size_t k = 0; k + 1 < spans->n; k += 2) {
        size_t a = spans->v[k] > from ? spans->v[k] : from, b = spans->v[k + 1] < to ? spans->v[k + 1] : to;
        if (a >= b) continue;
        cut[n_cut++] = a - from;
        cut[n_cut++] = b - from;
    }
    int64_t cnt = tokenizer_encode_chat(e->m->tok, text + from, to - from, cut, n_cut, NULL, 0);
    int32_t *ids = cnt < 0 ? NULL : malloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
    if (ids) tokenizer_encode_chat(e->m->tok, text + from, to - from, cut, n_cut, ids, cnt);
    free(cut);
    *n = ids ? (size_t)cnt : 0;
    return ids;
}

int32_t *engine_chat_prompt(const engine *e, const engine_message *msgs, size_t n, int enable_thinking,
                            size_t *n_ids, char *err, size_t errlen) {
    chat_spans spans = {0};
    char *text = engine_render_chat(e, msgs, n, enable_thinking, &spans, err, errlen);
    int32_t *ids = text ? engine_tokenize_chat(e, text, 0, strlen(text), &spans, n_ids) : NULL;
    if (text && !ids) snprintf(err, errlen, "the messages are not valid UTF-8, or out of memory");
    free(text);
    free(spans.v);
    return ids;
}

int32_t *engine_tokenize_prompt(const engine *e, const char *prompt, size_t *n, char *err, size_t errlen) {
    size_t len = strlen(prompt);
    int64_t cnt = engine_tokenize(e, prompt, len, 1, 0, NULL, 0);
    if (cnt < 0) {
        snprintf(err, errlen, "prompt is not valid UTF-8");
        return NULL;
    }
    int32_t *ids = malloc((size_t)(cnt ? cnt : 1) * sizeof *ids);
    if (!ids) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    engine_tokenize(e, prompt, len, 1, 0, ids, cnt);
    *n = (size_t)cnt;
    return ids;
}

int32_t *engine_fim_prompt(const engine *e, const char *prefix, const char *suffix, size_t *n, char *err,
                           size_t errlen) {
    int32_t pre, suf, mid, bos = tokenizer_bos(e->m->tok);
    if (!tokenizer_fim(e->m->tok, &pre, &suf, &mid)) {
        snprintf(err, errlen, "the model has no fill-in-the-middle tokens (such as <|fim_prefix|>, <|fim_suffix|>, "
                 "<|fim_middle|>)");
        return NULL;
    }
    int add_bos = tokenizer_adds_bos(e->m->tok);
    int64_t np = engine_tokenize(e, prefix, strlen(prefix), 0, 0, NULL, 0);
    int64_t ns = engine_tokenize(e, suffix, strlen(suffix), 0, 0, NULL, 0);
    if (np < 0 || ns < 0) {
        snprintf(err, errlen, "%s is not valid UTF-8", np < 0 ? "prompt" : "suffix");
        return NULL;
    }
    int32_t *ids = malloc((size_t)(add_bos + np + ns + 3) * sizeof *ids);
    if (!ids) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    size_t k = 0;
    if (add_bos) ids[k++] = bos;
    ids[k++] = pre;
    k += (size_t)engine_tokenize(e, prefix, strlen(prefix), 0, 0, ids + k, np);
    ids[k++] = suf;
    k += (size_t)engine_tokenize(e, suffix, strlen(suffix), 0, 0, ids + k, ns);
    ids[k++] = mid;
    *n = k;
    return ids;
}

/* Runs tokens through the pot in PREFILL_CHUNK pieces; logits of the last
 * token into `logits` when non-NULL. */
int engine_prefill(engine *e, pot *p, const int32_t *tokens, size_t n, float *logits, char *err,
                   size_t errlen) {
    for (size_t i = 0; i < n; i += PREFILL_CHUNK) {
        size_t len = n - i < PREFILL_CHUNK ? n - i : PREFILL_CHUNK;
        int last = i + len == n;
        backend_span sp = {.tokens = tokens + i, .n_tokens = (int32_t)len, .kv = p,
                           .logits_mode = last && logits ? BACKEND_LOGITS_LAST : BACKEND_LOGITS_NONE,
                           .logits = logits, .prefill = 1};
        if (e->be->forward(e->be, &sp, 1, err, errlen)) return -1;
    }
    return 0;
}

pot *engine_new_pot(engine *e, size_t capacity, char *err, size_t errlen) {
    const model *m = e->m;
    if (capacity > (size_t)m->n_ctx_train) {
        snprintf(err, errlen, "%zu tokens exceed the model's context of %d tokens", capacity,
                 m->n_ctx_train);
        return NULL;
    }
    return pot_new(m->n_layer, m->n_head_kv, m->head_dim, (int32_t)capacity, e->kv_dtype, err,
                   errlen);
}

/* The model's window per layer (0: global), malloc'd; NULL when out of memory. */
static int32_t *layer_windows(const model *m) {
    int32_t *w = malloc((size_t)m->n_layer * sizeof *w);
    for (int32_t l = 0; w && l < m->n_layer; l++) w[l] = m->layers[l].window;
    return w;
}

pot *engine_new_ring_pot(engine *e, size_t capacity, int32_t slack, char *err, size_t errlen) {
    const model *m = e->m;
    if (!m->n_swa_layers || e->be->pot_memory) /* (a device's pots keep every slot) */
        return engine_new_pot(e, capacity, err, errlen);
    if (capacity > (size_t)m->n_ctx_train) return engine_new_pot(e, capacity, err, errlen); /* its message */
    int32_t *w = layer_windows(m);
    pot *p = w ? pot_new_windowed(m->n_layer, m->n_head_kv, m->head_dim, (int32_t)capacity, e->kv_dtype, w,
                                  slack, err, errlen)
               : NULL;
    if (!w) snprintf(err, errlen, "out of memory");
    free(w);
    return p;
}

size_t engine_ring_pot_bytes(const engine *e, size_t capacity, int32_t slack) {
    const model *m = e->m;
    int32_t *w = m->n_swa_layers && !e->be->pot_memory ? layer_windows(m) : NULL;
    size_t bytes = pot_windowed_bytes(m->n_layer, m->n_head_kv, m->head_dim, (int32_t)capacity, e->kv_dtype, w, slack);
    free(w);
    return bytes;
}

pot *engine_new_decode_pot(engine *e, size_t capacity, char *err, size_t errlen) {
    pot *p = engine_new_pot(e, capacity, err, errlen);
    /* the rotated-key cache serves the CPU backend; a backend that keeps pots on its
       device (pot_memory) rotates keys as it reads them there */
    if (p && !e->be->pot_memory && pot_cache_rotated_keys(p)) {
        pot_free(p);
        snprintf(err, errlen, "out of memory for a pot of %zu entries", capacity);
        return NULL;
    }
    return p;
}

enum { LOGPROB_ROWS = 32 }; /* rows of logits at once for prompt log-probabilities */

struct engine_logprob_reader {
    engine *e;
    const int32_t *tokens;
    size_t n;
    size_t at;       /* rows read: row t's logits predict token t + 1 */
    int32_t n_top;
    sample_logprobs *out;
    pot *p;
    float *logits;   /* LOGPROB_ROWS rows */
};

void engine_logprob_reader_free(engine_logprob_reader *r) {
    if (!r) return;
    free(r->logits);
    pot_free(r->p);
    free(r);
}

engine_logprob_reader *engine_logprob_reader_new(engine *e, const int32_t *tokens, size_t n, int32_t n_top,
                                                 sample_logprobs *out, char *err, size_t errlen) {
    if (n == 0) {
        snprintf(err, errlen, "empty prompt");
        return NULL;
    }
    engine_logprob_reader *r = calloc(1, sizeof *r);
    if (r) r->p = engine_new_pot(e, n, err, errlen);
    if (r && r->p) r->logits = malloc((size_t)LOGPROB_ROWS * (size_t)e->m->n_vocab * sizeof *r->logits);
    if (!r || !r->logits) {
        if (!r || r->p) snprintf(err, errlen, "out of memory");
        engine_logprob_reader_free(r);
        return NULL;
    }
    *r = (engine_logprob_reader){.e = e, .tokens = tokens, .n = n, .n_top = n_top, .out = out, .p = r->p,
                                 .logits = r->logits};
    memset(&out[0], 0, sizeof out[0]);
    out[0].token = tokens[0];
    out[0].n_top = -1;
    return r;
}

int engine_logprob_reader_step(engine_logprob_reader *r, size_t max_tokens, size_t *read, char *err, size_t errlen) {
    const int32_t V = r->e->m->n_vocab;
    *read = 0;
    /* the last row predicts nothing asked for */
    while (r->at + 1 < r->n && (*read == 0 || *read < max_tokens)) {
        size_t len = r->n - 1 - r->at < LOGPROB_ROWS ? r->n - 1 - r->at : LOGPROB_ROWS;
        backend_span sp = {.tokens = r->tokens + r->at, .n_tokens = (int32_t)len, .kv = r->p,
                           .logits_mode = BACKEND_LOGITS_ALL, .logits = r->logits};
        if (r->e->be->forward(r->e->be, &sp, 1, err, errlen)) return -1;
        for (size_t k = 0; k < len; k++)
            sample_logprobs_of(r->logits + k * (size_t)V, V, r->tokens[r->at + k + 1], r->n_top, &r->out[r->at + k + 1]);
        r->at += len;
        *read += len;
    }
    return r->at + 1 >= r->n;
}

int engine_prompt_logits(engine *e, const int32_t *tokens, size_t n, float *logits, char *err,
                         size_t errlen) {
    if (n == 0) {
        snprintf(err, errlen, "empty prompt");
        return -1;
    }
    pot *p = engine_new_pot(e, n, err, errlen);
    if (!p) return -1;
    int rc = engine_prefill(e, p, tokens, n, logits, err, errlen);
    pot_free(p);
    return rc;
}
