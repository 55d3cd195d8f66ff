/* A loaded model (private to engine/): hyper-parameters and weight views read
 * from a validated GGUF. Matrices stay in their file type inside the mapping;
 * small vectors (norms, biases) are converted to f32 copies we own. */
#ifndef POTSERVE_MODEL_H
#define POTSERVE_MODEL_H

#include <stdint.h>

#include "chat.h"
#include "gguf.h"
#include "tokenizer.h"

/* Which elements RoPE rotates together: llama.cpp's "norm" mode pairs
 * (2i, 2i+1) (llama family: the converter permutes Q/K for it), "neox" pairs
 * (i, i + n_rot/2) (qwen2). */
enum rope_layout { ROPE_PAIRS_ADJACENT = 0, ROPE_PAIRS_HALVES = 1 };

/* The families the forward pass knows; each differs from llama only where
 * the model fields below say so (QK-norm, extra norms, fused matrices). */
enum model_arch { ARCH_LLAMA = 0, ARCH_QWEN2, ARCH_QWEN3, ARCH_GEMMA3, ARCH_PHI3 };

/* How an embedding pools an input's final hidden states: the GGUF's
 * {arch}.pooling_type, as llama.cpp reads it (1 mean, 2 cls: the first
 * token's, 3 last: the last token's, as Qwen3-Embedding's files say); a
 * file without one (a chat model), or with none (0) or rank (4): mean. */
enum model_pooling { POOLING_MEAN = 0, POOLING_CLS = 1, POOLING_LAST = 2 };

/* The FFN's gate activation: SwiGLU's SiLU, or GELU (tanh form) for gemma3. */
enum ffn_act { FFN_SILU = 0, FFN_GELU_TANH = 1 };

/* How RoPE turns a position into angles, as llama.cpp's rope_ext does:
 * angle_i = pos * base^(-2i/n_rot) / freq_factor_i, interpolated by
 * freq_scale (linear and YaRN), blended back towards the unscaled angle on
 * YaRN's fast dimensions (ext_factor 1), and cos/sin scaled by mscale. */
typedef struct rope_params {
    float base;
    float freq_scale;          /* 1 / scaling factor; 1 without scaling */
    float ext_factor;          /* YaRN: 1, else 0 */
    float mscale;              /* YaRN's magnitude (attention temperature), else 1 */
    float beta_fast, beta_slow;
    int32_t n_ctx_orig;        /* YaRN: the context the model was trained at */
    const float *freq_factors; /* [n_rot/2] the rope_freqs tensor (llama3 scaling), or NULL */
} rope_params;

/* A matrix of `rows` rows of `cols` elements of `type`, rows row_bytes apart. */
typedef struct weight {
    uint32_t type;
    int64_t cols, rows;
    size_t row_bytes;
    const uint8_t *data;
} weight;

typedef struct layer_weights {
    float *attn_norm;            /* [n_embd] */
    weight wq, wk, wv, wo;
    float *bq, *bk, *bv;         /* qwen2 biases, NULL otherwise */
    float *q_norm, *k_norm;      /* [head_dim] per-head RMS norms (qwen3, gemma3), NULL otherwise */
    float *attn_post_norm;       /* [n_embd] norms of the attention and FFN outputs (gemma3) */
    float *ffn_post_norm;
    float *ffn_norm;             /* [n_embd] */
    weight w_gate, w_up, w_down; /* phi3: views into its fused matrices */
    int32_t window;              /* sliding-window layer: attends to the last `window` positions; 0: all */
    int32_t rope_id;             /* index into model.rope: 1 for gemma3's sliding layers */
} layer_weights;

typedef struct model {
    gguf_file *file;
    tokenizer *tok;
    chat_template chat;          /* family CHAT_UNKNOWN when the template is not recognised */
    char arch[32];
    char name[128];
    int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_rot, n_vocab, n_ctx_train;
    float rope_base, norm_eps;   /* rope_base = rope[0].base */
    enum rope_layout rope_layout;
    enum model_arch arch_id;
    enum ffn_act ffn_act;
    enum model_pooling pooling;
    rope_params rope[2];         /* [0] every layer's, [1] gemma3's sliding layers' */
    int32_t n_rope;
    char rope_scaling[16];       /* "none", "linear", "yarn", "llama3" (rope_freqs), for `info` */
    float *rope_freqs;           /* owned copy of rope_freqs.weight, or NULL */
    float embd_scale;            /* input embeddings are multiplied by it (gemma3: sqrt(n_embd)) */
    float attn_scale;            /* attention scores' scale, 1/sqrt(head_dim) but for gemma3 27B */
    int32_t n_swa, n_swa_layers; /* sliding window and how many layers use it (0, 0: none) */
    weight tok_embd;             /* [n_vocab rows][n_embd] */
    weight output;               /* = tok_embd when the embeddings are tied */
    int tied_output;
    float *output_norm;
    layer_weights *layers;
    uint64_t n_params;
    uint32_t main_type;          /* most common matrix type, for `info` */
} model;

/* 1 when the model needs more than the llama/qwen2 forward pass (a backend
 * that only has that one refuses such models); reason names what. */
int model_is_extended(const model *m, const char **reason);

/* The llama family's values of the fields beyond its hyper-parameters (one
 * unscaled RoPE from rope_base, no embedding scale, 1/sqrt(head_dim), SiLU),
 * for a model built in code once head_dim and rope_base are set. */
void model_set_llama_defaults(model *m);

/* Loads and validates everything the forward pass needs. NULL + one line in
 * err on any problem. The caller owns the result (model_free). */
model *model_load(const char *path, char *err, size_t errlen);
void model_free(model *m);

#endif
