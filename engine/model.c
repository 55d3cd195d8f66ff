/* Model loading: architecture hyper-parameters from the GGUF metadata, then
 * every tensor the forward pass reads, each checked for type and shape. */
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

typedef struct loader {
    model *m;
    char *err;
    size_t errlen;
} loader;

static int lfail(loader *L, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->err, L->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int get_hparam(loader *L, const char *suffix, int required, int64_t lo, int64_t hi,
                      int32_t *out) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", L->m->arch, suffix);
    uint64_t v;
    if (gguf_get_u64(L->m->file, key, &v)) {
        if (required) return lfail(L, "model: missing or non-integer metadata %s", key);
        return 0;
    }
    if ((int64_t)v < lo || (int64_t)v > hi)
        return lfail(L, "model: %s = %llu is out of range [%lld, %lld]", key, (unsigned long long)v,
                     (long long)lo, (long long)hi);
    *out = (int32_t)v;
    return 0;
}

static int get_weight(loader *L, const char *name, int64_t cols, int64_t rows, int required,
                      weight *w) {
    const gguf_tensor *t = gguf_find_tensor(L->m->file, name);
    memset(w, 0, sizeof *w);
    if (!t) return required ? lfail(L, "model: missing tensor %s", name) : 0;
    if (!quant_type_supported(t->type))
        return lfail(L, "model: tensor %s has type %s, which potserve does not support", name,
                     quant_type_name(t->type));
    if ((int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return lfail(L, "model: tensor %s has shape [%llu, %llu, %llu], expected [%lld, %lld]", name,
                     (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                     (unsigned long long)t->ne[2], (long long)cols, (long long)rows);
    w->type = t->type;
    w->cols = cols;
    w->rows = rows;
    w->row_bytes = quant_row_bytes(t->type, cols);
    w->data = t->data;
    L->m->n_params += (uint64_t)cols * rows;
    return 0;
}

/* A 1-D tensor of n elements converted to an f32 copy we own (*out stays NULL
 * when absent and not required). */
static int get_vector(loader *L, const char *name, int64_t n, int required, float **out) {
    weight w;
    *out = NULL;
    if (get_weight(L, name, n, 1, required, &w)) return -1;
    if (!w.data) return 0;
    *out = malloc((size_t)n * sizeof(float));
    if (!*out) return lfail(L, "model: out of memory");
    quant_dequantize_row(w.type, w.data, *out, n);
    return 0;
}

static int load_layers(loader *L) {
    model *m = L->m;
    int64_t d = m->n_embd, dq = (int64_t)m->n_head * m->head_dim,
            dkv = (int64_t)m->n_head_kv * m->head_dim, ff = m->n_ff;
    int qkv_bias = !strcmp(m->arch, "qwen2");
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    if (!m->layers) return lfail(L, "model: out of memory");
    for (int32_t i = 0; i < m->n_layer; i++) {
        layer_weights *lw = &m->layers[i];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, i), n)
        if (get_vector(L, NAME("attn_norm.weight"), d, 1, &lw->attn_norm) ||
            get_weight(L, NAME("attn_q.weight"), d, dq, 1, &lw->wq) ||
            get_weight(L, NAME("attn_k.weight"), d, dkv, 1, &lw->wk) ||
            get_weight(L, NAME("attn_v.weight"), d, dkv, 1, &lw->wv) ||
            get_weight(L, NAME("attn_output.weight"), dq, d, 1, &lw->wo) ||
            get_vector(L, NAME("attn_q.bias"), dq, qkv_bias, &lw->bq) ||
            get_vector(L, NAME("attn_k.bias"), dkv, qkv_bias, &lw->bk) ||
            get_vector(L, NAME("attn_v.bias"), dkv, qkv_bias, &lw->bv) ||
            get_vector(L, NAME("ffn_norm.weight"), d, 1, &lw->ffn_norm) ||
            get_weight(L, NAME("ffn_gate.weight"), d, ff, 1, &lw->w_gate) ||
            get_weight(L, NAME("ffn_up.weight"), d, ff, 1, &lw->w_up) ||
            get_weight(L, NAME("ffn_down.weight"), ff, d, 1, &lw->w_down))
            return -1;
#undef NAME
    }
    return 0;
}

/* The most common matrix type decides the model's quantization label. */
static uint32_t dominant_type(const model *m) {
    uint64_t count[GGML_TYPE_COUNT_] = {0};
    for (int32_t i = 0; i < m->n_layer; i++) {
        const layer_weights *lw = &m->layers[i];
        const weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (size_t j = 0; j < sizeof ws / sizeof ws[0]; j++)
            if (ws[j]->type < GGML_TYPE_COUNT_) count[ws[j]->type] += (uint64_t)ws[j]->cols * ws[j]->rows;
    }
    uint32_t best = 0;
    for (uint32_t t = 0; t < GGML_TYPE_COUNT_; t++)
        if (count[t] > count[best]) best = t;
    return best;
}

static int load_hparams(loader *L) {
    model *m = L->m;
    if (gguf_get_cstr(m->file, "general.architecture", m->arch, sizeof m->arch))
        return lfail(L, "model: missing general.architecture");
    if (strcmp(m->arch, "llama") && strcmp(m->arch, "qwen2"))
        return lfail(L, "model: architecture '%s' is not supported (supported: llama, qwen2)", m->arch);
    if (gguf_get_cstr(m->file, "general.name", m->name, sizeof m->name)) strcpy(m->name, m->arch);
    m->n_ctx_train = 2048;
    if (get_hparam(L, "block_count", 1, 1, 1024, &m->n_layer) ||
        get_hparam(L, "embedding_length", 1, 1, 1 << 16, &m->n_embd) ||
        get_hparam(L, "feed_forward_length", 1, 1, 1 << 20, &m->n_ff) ||
        get_hparam(L, "attention.head_count", 1, 1, 1024, &m->n_head) ||
        get_hparam(L, "context_length", 0, 1, 1 << 24, &m->n_ctx_train))
        return -1;
    m->n_head_kv = m->n_head;
    if (get_hparam(L, "attention.head_count_kv", 0, 1, m->n_head, &m->n_head_kv)) return -1;
    if (m->n_head % m->n_head_kv)
        return lfail(L, "model: head_count %d is not a multiple of head_count_kv %d", m->n_head,
                     m->n_head_kv);
    if (m->n_embd % m->n_head)
        return lfail(L, "model: embedding_length %d is not a multiple of head_count %d", m->n_embd,
                     m->n_head);
    m->head_dim = m->n_embd / m->n_head;
    int32_t key_len = m->head_dim;
    if (get_hparam(L, "attention.key_length", 0, 1, 4096, &key_len)) return -1;
    if (key_len != m->head_dim)
        return lfail(L, "model: attention.key_length %d differs from embedding/heads %d (unsupported)",
                     key_len, m->head_dim);
    m->n_rot = m->head_dim;
    if (get_hparam(L, "rope.dimension_count", 0, 2, m->head_dim, &m->n_rot)) return -1;
    if (m->n_rot % 2) return lfail(L, "model: rope.dimension_count %d is odd", m->n_rot);

    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.rope.freq_base", m->arch);
    m->rope_base = gguf_get_f64(m->file, key, &v) ? 10000.0f : (float)v;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", m->arch);
    if (gguf_get_f64(m->file, key, &v)) return lfail(L, "model: missing %s", key);
    m->norm_eps = (float)v;
    if (!(m->rope_base > 0) || !isfinite(m->rope_base) || !(m->norm_eps > 0) || m->norm_eps > 1)
        return lfail(L, "model: invalid rope.freq_base %g or rms epsilon %g", m->rope_base, m->norm_eps);
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch);
    char scaling[32];
    if (!gguf_get_cstr(m->file, key, scaling, sizeof scaling) && strcmp(scaling, "none"))
        return lfail(L, "model: RoPE scaling '%s' is not supported", scaling);
    m->rope_layout = strcmp(m->arch, "qwen2") ? ROPE_PAIRS_ADJACENT : ROPE_PAIRS_HALVES;
    return 0;
}

/* Text of a special token as a C string ("" when absent or too long). */
static void piece_cstr(const tokenizer *t, int32_t id, char *buf, size_t cap) {
    int n = id >= 0 ? tokenizer_piece(t, id, 1, buf, cap - 1) : -1;
    buf[(n < 0 || (size_t)n >= cap) ? 0 : n] = 0;
}

model *model_load(const char *path, char *err, size_t errlen) {
    model *m = calloc(1, sizeof *m);
    loader L = {m, err, errlen};
    if (!m) {
        snprintf(err, errlen, "model: out of memory");
        return NULL;
    }
    m->file = gguf_open(path, err, errlen);
    if (!m->file) goto bad;
    if (load_hparams(&L)) goto bad;
    m->tok = tokenizer_load(m->file, err, errlen);
    if (!m->tok) goto bad;
    m->n_vocab = tokenizer_n_vocab(m->tok);
    if (get_weight(&L, "token_embd.weight", m->n_embd, m->n_vocab, 1, &m->tok_embd) ||
        get_vector(&L, "output_norm.weight", m->n_embd, 1, &m->output_norm) ||
        get_weight(&L, "output.weight", m->n_embd, m->n_vocab, 0, &m->output) || load_layers(&L))
        goto bad;
    if (!m->output.data) {
        m->output = m->tok_embd;
        m->tied_output = 1;
    }
    m->main_type = dominant_type(m);

    char bos[64], eos[64];
    piece_cstr(m->tok, tokenizer_bos(m->tok), bos, sizeof bos);
    piece_cstr(m->tok, tokenizer_eos(m->tok), eos, sizeof eos);
    gguf_str s;
    char *tmpl = NULL;
    if (!gguf_get_str(m->file, "tokenizer.chat_template", &s) && (tmpl = malloc(s.len + 1))) {
        memcpy(tmpl, s.ptr, s.len);
        tmpl[s.len] = 0;
    }
    chat_template_detect(tmpl, bos, eos, &m->chat); /* CHAT_UNKNOWN is reported when chat is used */
    free(tmpl);
    return m;
bad:
    model_free(m);
    return NULL;
}

void model_free(model *m) {
    if (!m) return;
    if (m->layers)
        for (int32_t i = 0; i < m->n_layer; i++) {
            layer_weights *lw = &m->layers[i];
            free(lw->attn_norm);
            free(lw->ffn_norm);
            free(lw->bq);
            free(lw->bk);
            free(lw->bv);
        }
    free(m->layers);
    free(m->output_norm);
    tokenizer_free(m->tok);
    gguf_close(m->file);
    free(m);
}
