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

/* Rows [r0, r0 + n) of w, as a matrix of their own (phi3's fused matrices). */
static weight row_range(const weight *w, int64_t r0, int64_t n) {
    weight v = *w;
    v.rows = n;
    v.data = w->data + (size_t)r0 * w->row_bytes;
    return v;
}

/* Q, K, V: separate matrices, or phi3's fused attn_qkv (Q rows, then K, then V). */
static int load_qkv(loader *L, int32_t i, layer_weights *lw) {
    const model *m = L->m;
    int64_t d = m->n_embd, dq = (int64_t)m->n_head * m->head_dim, dkv = (int64_t)m->n_head_kv * m->head_dim;
    char n[96];
    snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", i);
    if (m->arch_id == ARCH_PHI3 && gguf_find_tensor(m->file, n)) {
        weight qkv;
        if (get_weight(L, n, d, dq + 2 * dkv, 1, &qkv)) return -1;
        lw->wq = row_range(&qkv, 0, dq);
        lw->wk = row_range(&qkv, dq, dkv);
        lw->wv = row_range(&qkv, dq + dkv, dkv);
        return 0;
    }
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, i), n)
    return get_weight(L, NAME("attn_q.weight"), d, dq, 1, &lw->wq) ||
                   get_weight(L, NAME("attn_k.weight"), d, dkv, 1, &lw->wk) ||
                   get_weight(L, NAME("attn_v.weight"), d, dkv, 1, &lw->wv)
               ? -1
               : 0;
#undef NAME
}

/* Gate and up: separate, or phi3's fused ffn_up (gate rows first, as
 * llama.cpp's swiglu of one fused product takes its first half as the gate). */
static int load_gate_up(loader *L, int32_t i, layer_weights *lw) {
    const model *m = L->m;
    int64_t d = m->n_embd, ff = m->n_ff;
    char n[96];
    if (m->arch_id == ARCH_PHI3) {
        weight up;
        snprintf(n, sizeof n, "blk.%d.ffn_up.weight", i);
        if (get_weight(L, n, d, 2 * ff, 1, &up)) return -1;
        lw->w_gate = row_range(&up, 0, ff);
        lw->w_up = row_range(&up, ff, ff);
        return 0;
    }
    snprintf(n, sizeof n, "blk.%d.ffn_gate.weight", i);
    if (get_weight(L, n, d, ff, 1, &lw->w_gate)) return -1;
    snprintf(n, sizeof n, "blk.%d.ffn_up.weight", i);
    return get_weight(L, n, d, ff, 1, &lw->w_up);
}

static int load_layers(loader *L) {
    model *m = L->m;
    int64_t d = m->n_embd, dq = (int64_t)m->n_head * m->head_dim,
            dkv = (int64_t)m->n_head_kv * m->head_dim, ff = m->n_ff;
    int qkv_bias = m->arch_id == ARCH_QWEN2;
    int qk_norm = m->arch_id == ARCH_QWEN3 || m->arch_id == ARCH_GEMMA3;
    int post_norms = m->arch_id == ARCH_GEMMA3;
    m->layers = calloc((size_t)m->n_layer, sizeof *m->layers);
    if (!m->layers) return lfail(L, "model: out of memory");
    for (int32_t i = 0; i < m->n_layer; i++) {
        layer_weights *lw = &m->layers[i];
        char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d." s, i), n)
        if (get_vector(L, NAME("attn_norm.weight"), d, 1, &lw->attn_norm) || load_qkv(L, i, lw) ||
            get_weight(L, NAME("attn_output.weight"), dq, d, 1, &lw->wo) ||
            get_vector(L, NAME("attn_q.bias"), dq, qkv_bias, &lw->bq) ||
            get_vector(L, NAME("attn_k.bias"), dkv, qkv_bias, &lw->bk) ||
            get_vector(L, NAME("attn_v.bias"), dkv, qkv_bias, &lw->bv) ||
            get_vector(L, NAME("attn_q_norm.weight"), m->head_dim, qk_norm, &lw->q_norm) ||
            get_vector(L, NAME("attn_k_norm.weight"), m->head_dim, qk_norm, &lw->k_norm) ||
            get_vector(L, NAME("post_attention_norm.weight"), d, post_norms, &lw->attn_post_norm) ||
            get_vector(L, NAME("post_ffw_norm.weight"), d, post_norms, &lw->ffn_post_norm) ||
            get_vector(L, NAME("ffn_norm.weight"), d, 1, &lw->ffn_norm) || load_gate_up(L, i, lw) ||
            get_weight(L, NAME("ffn_down.weight"), ff, d, 1, &lw->w_down))
            return -1;
        /* norms of another family's kind in the file: llama.cpp ignores them too */
        if (!qk_norm) free(lw->q_norm), free(lw->k_norm), lw->q_norm = lw->k_norm = NULL;
        if (!post_norms)
            free(lw->attn_post_norm), free(lw->ffn_post_norm), lw->attn_post_norm = lw->ffn_post_norm = NULL;
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

static const struct {
    const char *name;
    enum model_arch id;
    enum rope_layout layout;
} ARCHS[] = {
    {"llama", ARCH_LLAMA, ROPE_PAIRS_ADJACENT}, {"qwen2", ARCH_QWEN2, ROPE_PAIRS_HALVES},
    {"qwen3", ARCH_QWEN3, ROPE_PAIRS_HALVES},   {"gemma3", ARCH_GEMMA3, ROPE_PAIRS_HALVES},
    {"phi3", ARCH_PHI3, ROPE_PAIRS_HALVES},
};

static int get_float(loader *L, const char *suffix, float dflt, float *out) {
    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.%s", L->m->arch, suffix);
    *out = gguf_get_f64(L->m->file, key, &v) ? dflt : (float)v;
    if (!isfinite(*out)) return lfail(L, "model: %s is not finite", key);
    return 0;
}

/* RoPE scaling from the GGUF keys, as llama.cpp reads them: the type
 * (absent: linear, with no factor a no-op), the factor, YaRN's original
 * context; and the llama3 type's per-pair factors in rope_freqs.weight. */
static int load_rope(loader *L) {
    model *m = L->m;
    rope_params *r = &m->rope[0];
    char key[128], type[32] = "linear";
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch);
    if (gguf_get_cstr(m->file, key, type, sizeof type) && gguf_find(m->file, key))
        return lfail(L, "model: %s is not a string", key);
    float factor, attn_factor, log_mul;
    if (get_float(L, "rope.freq_base", 10000.0f, &r->base) || get_float(L, "rope.scaling.factor", 0.0f, &factor) ||
        (factor == 0.0f && get_float(L, "rope.scale_linear", 0.0f, &factor)) ||
        get_float(L, "rope.scaling.attn_factor", 1.0f, &attn_factor) ||
        get_float(L, "rope.scaling.yarn_log_multiplier", 0.0f, &log_mul))
        return -1;
    if (!(r->base > 0)) return lfail(L, "model: invalid rope.freq_base %g", r->base);
    if (factor < 0) return lfail(L, "model: invalid rope.scaling.factor %g", factor);
    int yarn = !strcmp(type, "yarn");
    if (strcmp(type, "none") && strcmp(type, "linear") && !yarn)
        return lfail(L, "model: RoPE scaling '%s' is not supported (supported: none, linear, yarn, llama3 rope_freqs)",
                     type);
    if (yarn && log_mul != 0.0f)
        return lfail(L, "model: RoPE scaling 'yarn' with yarn_log_multiplier is not supported");
    r->freq_scale = strcmp(type, "none") && factor != 0.0f ? 1.0f / factor : 1.0f;
    r->ext_factor = yarn ? 1.0f : 0.0f;
    /* llama.cpp: attn_factor * (1 + 0.1 ln factor) for YaRN beyond a factor of 1 */
    r->mscale = attn_factor * (yarn && factor > 1.0f ? 1.0f + 0.1f * logf(factor) : 1.0f);
    if (get_hparam(L, "rope.scaling.original_context_length", 0, 1, 1 << 24, &r->n_ctx_orig)) return -1;
    snprintf(m->rope_scaling, sizeof m->rope_scaling, "%s",
             yarn ? "yarn" : r->freq_scale != 1.0f ? "linear" : "none");
    if (gguf_find_tensor(m->file, "rope_factors_long.weight") || gguf_find_tensor(m->file, "rope_factors_short.weight"))
        return lfail(L, "model: RoPE scaling 'longrope' (rope_factors_long/short) is not supported");
    if (m->arch_id == ARCH_LLAMA && gguf_find_tensor(m->file, "rope_freqs.weight")) {
        if (get_vector(L, "rope_freqs.weight", m->n_rot / 2, 1, &m->rope_freqs)) return -1;
        for (int32_t i = 0; i < m->n_rot / 2; i++)
            if (!(m->rope_freqs[i] > 0) || !isfinite(m->rope_freqs[i]))
                return lfail(L, "model: rope_freqs.weight[%d] = %g is not a positive factor", i, m->rope_freqs[i]);
        r->freq_factors = m->rope_freqs;
        snprintf(m->rope_scaling, sizeof m->rope_scaling, "llama3");
    }
    m->n_rope = 1;
    return 0;
}

/* Gemma 3's sliding-window layers: the window, which layers (a pattern of
 * n: all but every n-th, or a per-layer array), and their own RoPE base. */
static int load_sliding_window(loader *L) {
    model *m = L->m;
    if (get_hparam(L, "attention.sliding_window", 0, 0, 1 << 24, &m->n_swa)) return -1;
    if (m->arch_id != ARCH_GEMMA3 || m->n_swa == 0) { /* llama.cpp: llama and phi3 attend to everything */
        m->n_swa = 0;
        return 0;
    }
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->arch);
    const gguf_kv *pat = gguf_find(m->file, key);
    int32_t every = 6;
    if (pat && pat->type == GGUF_ARRAY) {
        if (pat->arr_type != GGUF_BOOL || pat->arr_n != (uint64_t)m->n_layer)
            return lfail(L, "model: %s is not an array of %d bools", key, m->n_layer);
        for (int32_t i = 0; i < m->n_layer; i++) m->layers[i].window = gguf_arr_i64(pat, (uint64_t)i) ? m->n_swa : 0;
    } else {
        if (get_hparam(L, "attention.sliding_window_pattern", 0, 0, 1 << 16, &every)) return -1;
        for (int32_t i = 0; i < m->n_layer; i++) m->layers[i].window = every == 0 || i % every < every - 1 ? m->n_swa : 0;
    }
    rope_params *local = &m->rope[1];
    *local = (rope_params){.freq_scale = 1.0f, .mscale = 1.0f, .beta_fast = 32.0f, .beta_slow = 1.0f,
                           .n_ctx_orig = m->rope[0].n_ctx_orig};
    if (get_float(L, "rope.freq_base_swa", 10000.0f, &local->base)) return -1;
    if (!(local->base > 0)) return lfail(L, "model: invalid rope.freq_base_swa %g", local->base);
    if (m->rope[0].ext_factor != 0.0f) return lfail(L, "model: RoPE scaling 'yarn' on gemma3 is not supported");
    m->n_rope = 2;
    for (int32_t i = 0; i < m->n_layer; i++) {
        m->layers[i].rope_id = m->layers[i].window ? 1 : 0;
        m->n_swa_layers += m->layers[i].window != 0;
    }
    return 0;
}

static int load_hparams(loader *L) {
    model *m = L->m;
    if (gguf_get_cstr(m->file, "general.architecture", m->arch, sizeof m->arch))
        return lfail(L, "model: missing general.architecture");
    size_t a = 0;
    while (a < sizeof ARCHS / sizeof *ARCHS && strcmp(m->arch, ARCHS[a].name)) a++;
    if (a == sizeof ARCHS / sizeof *ARCHS)
        return lfail(L, "model: architecture '%s' is not supported (supported: llama, qwen2, qwen3, gemma3, phi3)",
                     m->arch);
    m->arch_id = ARCHS[a].id;
    m->rope_layout = ARCHS[a].layout;
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
    /* the head size is embedding/heads unless key_length says otherwise (qwen3, gemma3) */
    m->head_dim = m->n_embd / m->n_head;
    if (get_hparam(L, "attention.key_length", 0, 1, 4096, &m->head_dim)) return -1;
    int32_t value_len = m->head_dim;
    if (get_hparam(L, "attention.value_length", 0, 1, 4096, &value_len)) return -1;
    if (value_len != m->head_dim)
        return lfail(L, "model: attention.value_length %d differs from key_length %d (unsupported)", value_len,
                     m->head_dim);
    if (m->head_dim < 2 || (m->head_dim * m->n_head != m->n_embd && m->arch_id != ARCH_QWEN3 &&
                            m->arch_id != ARCH_GEMMA3))
        return lfail(L, "model: head size %d times %d heads differs from embedding_length %d (unsupported for %s)",
                     m->head_dim, m->n_head, m->n_embd, m->arch);
    m->n_rot = m->head_dim;
    if (get_hparam(L, "rope.dimension_count", 0, 2, m->head_dim, &m->n_rot)) return -1;
    if (m->n_rot % 2) return lfail(L, "model: rope.dimension_count %d is odd", m->n_rot);

    char key[128];
    double v;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", m->arch);
    if (gguf_get_f64(m->file, key, &v)) return lfail(L, "model: missing %s", key);
    m->norm_eps = (float)v;
    if (!(m->norm_eps > 0) || m->norm_eps > 1) return lfail(L, "model: invalid rms epsilon %g", m->norm_eps);
    int32_t pooling = 0;
    if (get_hparam(L, "pooling_type", 0, 0, 4, &pooling)) return -1;
    m->pooling = pooling == 2 ? POOLING_CLS : pooling == 3 ? POOLING_LAST : POOLING_MEAN;
    model_set_llama_defaults(m); /* then what the file says otherwise */
    if (load_rope(L)) return -1;
    m->rope_base = m->rope[0].base;
    if (m->arch_id == ARCH_GEMMA3) {
        float softcap;
        if (get_float(L, "final_logit_softcapping", 0.0f, &softcap)) return -1;
        if (softcap != 0.0f) return lfail(L, "model: gemma3 final_logit_softcapping is not supported");
        m->embd_scale = sqrtf((float)m->n_embd);
        m->ffn_act = FFN_GELU_TANH;
        if (m->n_layer == 62) /* llama.cpp: the 27B model scales by embedding/heads */
            m->attn_scale = 1.0f / sqrtf((float)(m->n_embd / m->n_head));
    }
    return 0;
}

void model_set_llama_defaults(model *m) {
    m->rope[0] = (rope_params){.base = m->rope_base, .freq_scale = 1.0f, .mscale = 1.0f, .beta_fast = 32.0f,
                               .beta_slow = 1.0f, .n_ctx_orig = m->n_ctx_train};
    m->n_rope = 1;
    snprintf(m->rope_scaling, sizeof m->rope_scaling, "none");
    m->embd_scale = 1.0f;
    m->attn_scale = 1.0f / sqrtf((float)m->head_dim);
    m->ffn_act = FFN_SILU;
}

int model_is_extended(const model *m, const char **reason) {
    const char *r = NULL;
    if (m->arch_id != ARCH_LLAMA && m->arch_id != ARCH_QWEN2) r = m->arch;
    else if (m->rope[0].freq_scale != 1.0f || m->rope[0].ext_factor != 0.0f || m->rope[0].mscale != 1.0f ||
             m->rope[0].freq_factors)
        r = "RoPE scaling";
    else if (m->n_swa_layers) r = "sliding-window attention";
    else if (m->head_dim * m->n_head != m->n_embd) r = "a head size other than embedding/heads";
    if (reason) *reason = r;
    return r != NULL;
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
        get_weight(&L, "output.weight", m->n_embd, m->n_vocab, 0, &m->output) || load_layers(&L) ||
        load_sliding_window(&L))
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
            free(lw->q_norm);
            free(lw->k_norm);
            free(lw->attn_post_norm);
            free(lw->ffn_post_norm);
        }
    free(m->layers);
    free(m->output_norm);
    free(m->rope_freqs);
    tokenizer_free(m->tok);
    gguf_close(m->file);
    free(m);
}
