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

typedef struct prompt_cache prompt_cache;

enum { PREFILL_CHUNK = 256 }; /* tokens per forward while reading a prompt */

struct engine {
    model *m;
    backend *be;
    int n_threads;
    enum pot_dtype kv_dtype; /* f16, or f32 with --exact */
    vocab_trie *trie;        /* token pieces for grammar masks; built at the first use */
    prompt_cache *pc;        /* sessionless prompts' KV (NULL: off) */
};

/* ---- the prompt cache (prompt_cache.c), engine thread ------------------------------ */
prompt_cache *prompt_cache_new(int max_entries, size_t max_bytes);
void prompt_cache_free(prompt_cache *c);
/* The entry sharing the longest prefix with tokens (borrowed; *lcp its
 * length), or NULL. */
const pot *prompt_cache_find(prompt_cache *c, const int32_t *tokens, size_t n, size_t *lcp);
/* Keeps p (exactly the entries of tokens[n]; taken) and a copy of tokens. */
void prompt_cache_put(prompt_cache *c, pot *p, const int32_t *tokens, size_t n);

/* e->trie, built on first use (engine thread). NULL when out of memory. */
const vocab_trie *engine_vocab_trie(engine *e);

/* An empty pot of `capacity` slots for this model (at most its context). */
pot *engine_new_pot(engine *e, size_t capacity, char *err, size_t errlen);
/* engine_new_pot whose sliding-window layers keep rings of window - 1 + slack
 * entries (pot_new_windowed): a document's pot, slack its largest forward.
 * Backends with device pots get pots that keep every slot. */
pot *engine_new_ring_pot(engine *e, size_t capacity, int32_t slack, char *err, size_t errlen);
/* Bytes engine_new_ring_pot's pot holds. */
size_t engine_ring_pot_bytes(const engine *e, size_t capacity, int32_t slack);
/* engine_new_pot with a rotated-key cache, for pots that decode (cache/cache.h). */
pot *engine_new_decode_pot(engine *e, size_t capacity, char *err, size_t errlen);
/* Runs tokens through p in PREFILL_CHUNK pieces; the last token's logits into
 * `logits` when non-NULL. */
int engine_prefill(engine *e, pot *p, const int32_t *tokens, size_t n, float *logits, char *err,
                   size_t errlen);
/* Prefills prompt on top of what p holds (p stays the caller's), then samples
 * and decodes into p until a stop (see engine_generate): one gen_seq stepped
 * until it ends. */
int engine_continue(engine *e, pot *p, const int32_t *prompt, size_t n_prompt,
                    const engine_gen_params *gp, engine_text_cb cb, void *user,
                    engine_gen_result *res, char *err, size_t errlen);

/* ---- generation as a step-wise sequence (generate.c) ----------------------------
 * new (sampler, stop matcher) -> start (pot, prompt) -> steps until done.
 * gen_seq_step runs one step of many sequences in ONE backend forward: each
 * still prefilling sends its next prompt piece (PREFILL_CHUNK tokens per
 * step over all of them), each decoding samples from its logits, emits the
 * text through its callback (stop strings, end of generation, max_tokens, a
 * full context and cancellation end it) and, if it goes on, sends that
 * token. Every sequence has its own pot, so their order never changes what
 * they compute. */
typedef struct gen_seq gen_seq;

/* A sequence that has not started: the sampler and the stop matcher copy
 * what they need of gp (stop strings, logit bias), gp->tokens_out (when set)
 * must outlive the sequence. Reads only the model's constants, so any thread
 * may call it. NULL + err (bad sampling parameters, out of memory). */
gen_seq *gen_seq_new(engine *e, const engine_gen_params *gp, engine_text_cb cb, void *user,
                     char *err, size_t errlen);
/* Attaches p and the prompt, which the steps prefill on top of p. own_pot:
 * gen_seq_free frees p (also when this fails); else p stays the caller's.
 * The prompt is borrowed and must outlive the sequence. 0 or -1 + err (empty
 * prompt, no room, a token outside the vocabulary, out of memory). */
int gen_seq_start(gen_seq *q, pot *p, int own_pot, const int32_t *prompt, size_t n_prompt,
                  char *err, size_t errlen);
/* Frees q and, when it owns it, its pot. */
void gen_seq_free(gen_seq *q);
/* Tokens before the prompt that the penalties must see (a cached prefix). */
void gen_seq_history(gen_seq *q, const int32_t *tokens, size_t n);
/* The pot q owns once it is done, handed to the caller (NULL if none). */
pot *gen_seq_take_pot(gen_seq *q);
/* 1 when src has read its whole prompt and not sampled yet: the moment to fork. */
int gen_seq_forkable(const gen_seq *src);
/* Starts dst (new, not started) where src stands after its prefill: a copy of
 * src's pot (dst owns it), its last logits, the prompt's penalties history;
 * dst then decodes with its own sampler. 0 or -1 + err. */
int gen_seq_fork(const gen_seq *src, gen_seq *dst, char *err, size_t errlen);
/* 1 once the sequence ended (or never started). */
int gen_seq_done(const gen_seq *q);
/* Ends a sequence that has not: finish CANCELLED, nothing more emitted. */
void gen_seq_cancel(gen_seq *q);
/* The result so far; 0, or -1 with what failed into err. */
int gen_seq_result(const gen_seq *q, engine_gen_result *res, char *err, size_t errlen);

typedef struct gen_step_info {
    int running;                        /* sequences not done after the step */
    int forwards;                       /* 1 when a forward ran */
    int32_t decode_tokens, prefill_tokens;
} gen_step_info;
/* One step of every sequence of seqs[n] that is not done (see above), in
 * one forward; a forward that fails fails the sequences that were in it.
 * Returns how many are still running; info (optional) gets the counts. */
int gen_seq_step(engine *e, gen_seq **seqs, int n, gen_step_info *info);
/* A pot for a prompt of n_prompt tokens and max_tokens more (the whole
 * context when max_tokens <= 0). NULL + err when the prompt leaves no room. */
pot *gen_new_pot(engine *e, size_t n_prompt, int32_t max_tokens, char *err, size_t errlen);

/* A private copy of d's pot with room for prompt[n_prompt] and answer_room
 * more entries, as far as the window allows (refined by two-stage FINCH when
 * the document asks for it); the prompt itself is not run. The caller frees
 * it. NULL + err. */
pot *doc_answer_pot(engine_doc *d, const int32_t *prompt, size_t n_prompt, size_t answer_room,
                    char *err, size_t errlen);
/* The answer_room of a generation's max_tokens: the rest of the window when
 * max_tokens <= 0 (engine_gen_params). */
size_t gen_answer_room(const engine *e, int32_t max_tokens);

/* Renders msgs with the model's chat template (plus the assistant header)
 * into a malloc'd string, the messages' own text in *spans (NULL: not
 * wanted). NULL + err when the template is not recognised. */
char *engine_render_chat(const engine *e, const engine_message *msgs, size_t n, int enable_thinking,
                         chat_spans *spans, char *err, size_t errlen);
/* The ids of text[from, to) of such a rendering, its control tokens read only
 * outside spans; malloc'd, the count in *n; NULL when not valid UTF-8 or out
 * of memory. */
int32_t *engine_tokenize_chat(const engine *e, const char *text, size_t from, size_t to, const chat_spans *spans,
                              size_t *n);

#endif
