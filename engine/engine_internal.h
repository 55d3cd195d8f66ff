/* What the engine's own files share (private to engine/): the engine struct
 * and the prefill / generation steps that both plain prompts (engine.c) and
 * documents read through a pot (ingest.c) use. */
#ifndef POTSERVE_ENGINE_INTERNAL_H
#define POTSERVE_ENGINE_INTERNAL_H

#include "backend.h"
#include "cache/cache.h"
#include "chat.h"
#include "engine.h"
#include "model.h"
#include "tokenizer.h"

enum { PREFILL_CHUNK = 256 }; /* tokens per forward while reading a prompt */

struct engine {
    model *m;
    backend *be;
    int n_threads;
    enum pot_dtype kv_dtype; /* f16, or f32 with --exact */
};

double now_ms(void);
/* An empty pot of `capacity` slots for this model (at most its context). */
pot *new_pot(engine *e, size_t capacity, char *err, size_t errlen);
/* Runs tokens through p in PREFILL_CHUNK pieces; the last token's logits into
 * `logits` when non-NULL. */
int prefill(engine *e, pot *p, const int32_t *tokens, size_t n, float *logits, char *err,
            size_t errlen);
/* Prefills prompt on top of what p holds, then samples and decodes into p
 * until a stop (see engine_generate). */
int engine_continue(engine *e, pot *p, const int32_t *prompt, size_t n_prompt,
                    const engine_gen_params *gp, engine_text_cb cb, void *user,
                    engine_gen_result *res, char *err, size_t errlen);

/* A private copy of d's pot with room for prompt[n_prompt] and max_tokens
 * more (refined by two-stage FINCH when the document asks for it); the
 * prompt itself is not run. The caller frees it. NULL + err. */
pot *doc_answer_pot(engine_doc *d, const int32_t *prompt, size_t n_prompt, int32_t max_tokens,
                    char *err, size_t errlen);

#endif
