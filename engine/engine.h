/* potserve engine: load a GGUF model, tokenize, render chat templates, and
 * generate. The public header of engine/; everything else in engine/ is
 * private to it (the sampling types of sample.h are re-exported here). */
#ifndef POTSERVE_ENGINE_H
#define POTSERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/sample.h"

typedef struct engine engine;

typedef struct engine_options {
    int n_threads;              /* <= 0: all online CPUs */
    const char *chat_template;  /* family name overriding the GGUF's template, or NULL */
    int exact;                  /* 1: f32 activations in every matrix product (see cpu_backend_new)
                                   and f32 KV entries (f16 otherwise) */
} engine_options;

/* Loads the model at path. NULL + one line in err on any problem (bad file,
 * unsupported architecture or type, missing tokenizer, ...). Caller owns it. */
engine *engine_open(const char *path, const engine_options *opt, char *err, size_t errlen);
void engine_close(engine *e);

typedef struct engine_info {
    const char *arch, *name, *quant, *tokenizer, *chat_family; /* owned by the engine */
    int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    float rope_base, norm_eps;
    uint64_t n_params;
    int tied_output;
    int n_threads;
} engine_info;
void engine_get_info(const engine *e, engine_info *info);

/* Tokenizes text (see tokenizer_encode): returns the count (may exceed cap),
 * or -1 for invalid UTF-8. */
int64_t engine_tokenize(const engine *e, const char *text, size_t len, int add_special,
                        int parse_special, int32_t *out, int64_t cap);
/* Text of one token (special tokens rendered); returns its length or -1. */
int engine_token_text(const engine *e, int32_t id, char *buf, size_t cap);
int32_t engine_eos(const engine *e);

typedef struct engine_message {
    const char *role, *content;
} engine_message;
/* Renders messages with the model's chat template (plus the assistant header)
 * into a malloc'd string (caller frees). NULL + err when the template is not
 * recognised (the message lists the families and --chat-template NAME). */
char *engine_render_chat(const engine *e, const engine_message *msgs, size_t n, char *err,
                         size_t errlen);
/* Tokenizes a rendered chat prompt (special-token text parsed, BOS per the
 * metadata). Returns a malloc'd array and its length in *n, NULL on error. */
int32_t *engine_tokenize_prompt(const engine *e, const char *prompt, int chat, size_t *n,
                                char *err, size_t errlen);

/* Logits of the last position after a full prefill of tokens, into
 * logits[n_vocab]. 0 or -1 + err. */
int engine_prompt_logits(engine *e, const int32_t *tokens, size_t n, float *logits, char *err,
                         size_t errlen);

typedef struct engine_gen_params {
    sample_params sampling;
    int32_t max_tokens;          /* <= 0: until EOS or the context is full */
    const char *const *stop;     /* stop strings (not included in the output) */
    size_t n_stop;
    int want_logprobs;
    int32_t *tokens_out;         /* when non-NULL, receives the generated ids (room for max_tokens) */
} engine_gen_params;

enum engine_finish { ENGINE_FINISH_STOP = 0, ENGINE_FINISH_LENGTH = 1, ENGINE_FINISH_CANCELLED = 2 };

typedef struct engine_gen_result {
    int64_t n_prompt, n_generated;
    enum engine_finish finish;
    double prefill_ms, decode_ms;
} engine_gen_result;

/* Called with each piece of text that is safe to emit (complete UTF-8, no
 * part of a stop string). `lp` is the sampled token's log-probabilities when
 * asked for, else NULL (a piece may carry text of several tokens; lp then
 * describes the last). Return nonzero to cancel. */
typedef int (*engine_text_cb)(void *user, const char *text, size_t len, int32_t token,
                              const sample_logprobs *lp);

/* Prefills prompt[n_prompt] and generates. Returns 0 (res filled) or -1 + err. */
int engine_generate(engine *e, const int32_t *prompt, size_t n_prompt, const engine_gen_params *p,
                    engine_text_cb cb, void *user, engine_gen_result *res, char *err,
                    size_t errlen);

#endif
