/* Token sampling (private to engine/): greedy, temperature, top_k, top_p,
 * min_p, repetition/presence/frequency penalties, logit_bias, seeded RNG,
 * log-probabilities with top alternatives, and stop-string matching. */
#ifndef POTSERVE_SAMPLE_H
#define POTSERVE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct logit_bias {
    int32_t token;
    float bias; /* added to the logit; -INFINITY bans the token */
} logit_bias;

typedef struct sample_params {
    float temperature;       /* <= 0: greedy */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off (llama.cpp semantics: divide positive logits, multiply negative) */
    int32_t repeat_last_n;   /* window of recent tokens for all three penalties; -1 = whole history */
    float presence_penalty;  /* OpenAI semantics: subtract once if the token occurred */
    float frequency_penalty; /* OpenAI semantics: subtract count * penalty */
    uint64_t seed;
    const logit_bias *bias;
    size_t n_bias;
    int32_t n_top_logprobs;  /* alternatives to report (0..20) */
} sample_params;

/* Defaults: temperature 1, top_k 0, top_p 1, min_p 0, penalties off,
 * repeat_last_n 64, seed 0, no bias, no logprobs. */
sample_params sample_params_default(void);

enum { SAMPLE_MAX_TOP_LOGPROBS = 20 };

typedef struct sample_logprobs {
    int32_t token;
    float logprob; /* of the chosen token */
    int32_t n_top;
    int32_t top_tokens[SAMPLE_MAX_TOP_LOGPROBS];
    float top_logprobs[SAMPLE_MAX_TOP_LOGPROBS];
} sample_logprobs;

typedef struct sampler sampler;

/* Copies params (including the bias array). NULL on allocation failure or
 * invalid params (err says which). */
sampler *sampler_new(const sample_params *p, int32_t n_vocab, char *err, size_t errlen);
void sampler_free(sampler *s);

/* Picks the next token from logits[n_vocab] (the array is used as scratch and
 * changed). Log-probabilities are those of the distribution after logit_bias
 * and penalties, before temperature and truncation; written to lp when non-NULL.
 * The same seed and the same logits give the same token.
 * (Added detail: returns -1, lp->token = -1, when every token is banned.) */
int32_t sampler_sample(sampler *s, float *logits, sample_logprobs *lp);
/* lp of token under the model's own distribution (log-softmax of logits, which
 * are sanitised as sampling does: NaN counts as -inf), with the n_top likeliest
 * tokens: a prompt token's log-probability (echo). */
void sample_logprobs_of(float *logits, int32_t n_vocab, int32_t token, int32_t n_top, sample_logprobs *lp);
/* Records a token of the context (prompt or generated) for the penalties. */
void sampler_accept(sampler *s, int32_t token);
/* Records into dst the tokens src's penalties hold, oldest first: a copy of
 * a sequence (n > 1) starts with its parent's context, a prompt cache's part
 * included. */
void sampler_accept_history(sampler *dst, const sampler *src);

/* Stop strings: feed generated text; it tells how much can be emitted now
 * (text that cannot be the start of a stop string) and whether a stop string
 * completed (then everything from the stop string on is dropped). guard
 * (NULL: none): stop strings apply only to the text before its first
 * occurrence, and a stop string that runs into it does not count (a tool
 * call's opening markup: the call is not cut open). */
typedef struct stop_matcher stop_matcher;
stop_matcher *stop_matcher_new(const char *const *stops, size_t n_stops, const char *guard);
void stop_matcher_free(stop_matcher *m);
/* Appends len bytes. Writes into *emit and *n_emit (pointer into the matcher's
 * buffer, valid until the next call) the bytes that are safe to send. Returns
 * 1 when a stop string was matched (nothing after it is emitted), else 0.
 * (Added detail: the stop string that completes first wins, the longer one on
 * a tie, whatever the split into pushes; after a match every push returns 1
 * and emits nothing; empty stop strings are ignored.) */
int stop_matcher_push(stop_matcher *m, const char *text, size_t len, const char **emit,
                      size_t *n_emit);
/* At the end of generation: the held-back bytes (no stop matched). */
void stop_matcher_flush(stop_matcher *m, const char **emit, size_t *n_emit);

#endif
