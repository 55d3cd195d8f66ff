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
    float *ffn_norm;             /* [n_embd] */
    weight w_gate, w_up, w_down;
} layer_weights;

typedef struct model {
    gguf_file *file;
    tokenizer *tok;
    chat_template chat;          /* family CHAT_UNKNOWN when the template is not recognised */
    char arch[32];
    char name[128];
    int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_rot, n_vocab, n_ctx_train;
    float rope_base, norm_eps;
    enum rope_layout rope_layout;
    weight tok_embd;             /* [n_vocab rows][n_embd] */
    weight output;               /* = tok_embd when the embeddings are tied */
    int tied_output;
    float *output_norm;
    layer_weights *layers;
    uint64_t n_params;
    uint32_t main_type;          /* most common matrix type, for `info` */
} model;

/* Loads and validates everything the forward pass needs. NULL + one line in
 * err on any problem. The caller owns the result (model_free). */
model *model_load(const char *path, char *err, size_t errlen);
void model_free(model *m);

#endif
