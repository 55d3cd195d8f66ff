/* Generation as a step-wise sequence: one prompt prefilled into a pot, then
 * sample -> emit text -> one decode token, a step at a time. Steps of many
 * sequences share one backend forward (each span appending to its own pot),
 * so the engine thread (sched.c) decodes every active request together, and
 * engine_generate / engine_doc_answer are the one-sequence case of the same
 * loop. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine_internal.h"

enum seq_state { SEQ_NEW, SEQ_PREFILL, SEQ_DECODE, SEQ_DONE };

/* The Recycled Attention paper's "kernel 7": max-pooling the full step's scores over 7 slots */
#define RECYCLE_POOL_DEFAULT 7
/* Most tokens a grammar value's forced ending may take (seq_pick). */
#define GEN_MAX_CLOSING 1024

/* Recycled attention's state during one generation. */
typedef struct recycler {
    int32_t stride, keep, pool, step;
    int32_t *chosen;   /* [n_layer][n_head_kv][keep] slots picked at the last full step */
    int32_t *attend;   /* [n_layer][n_head_kv][keep + stride] what a partial step reads */
    float *scores;     /* [n_layer][n_head_kv][capacity] */
    int32_t full_n;    /* pot size right after the last full step */
    int active;
} recycler;

struct gen_seq {
    engine *e;
    engine_text_cb cb;
    void *user;
    /* what generation keeps of engine_gen_params (stop strings and the logit
       bias live on in the matcher and the sampler, which copied them) */
    int32_t max_tokens, recycle_stride, recycle_keep, recycle_pool;
    int want_logprobs;
    int32_t *tokens_out;
    sampler *smp;
    stop_matcher *sm;
    const char *end_after;   /* engine_gen_params' */
    char end_tail[32];       /* the text's last bytes, where end_after may have begun */
    size_t n_end_tail;
    float *logits;           /* [n_vocab]: the last forward's, then sampler scratch */
    recycler rec;
    detok_state ds;
    /* constrained decoding (grammar != NULL) */
    grammar *gram;
    grammar_state gst;       /* after the tokens sampled so far */
    const vocab_trie *trie;
    float *logits_copy;      /* [n_vocab]: the logits again for a masked second draw */
    uint8_t *allowed;        /* [n_vocab]: the mask */
    int32_t closing[GEN_MAX_CLOSING]; /* max_tokens: the tokens that end the value in time */
    int32_t n_closing, i_closing;     /* closing[i_closing..n_closing) are still to come */
    pot *p;
    int own_pot;
    const int32_t *prompt;   /* borrowed until the prefill is done */
    size_t n_prompt, n_prefilled;
    int32_t span_len;        /* prefill tokens in the forward under way */
    int32_t tok;             /* the token of the decode span under way */
    int presampled;          /* next_tok / next_lp hold this step's sample (sample_all) */
    int32_t next_tok;
    sample_logprobs next_lp;
    /* want_logprobs: the tokens whose logprobs wait for their text's release
       (emit_text), and the bytes of text detokenized and released so far */
    struct pending_lp *pend;
    size_t n_pend, cap_pend;
    int64_t n_text, n_released;
    int full_pending;        /* recycled attention: a full step's scores await selection */
    int32_t full_keys;
    enum seq_state state;
    int rc;
    engine_gen_result res;
    double t_start, t_decode;
    char err[256];
};

static void recycler_free(recycler *r) {
    free(r->chosen);
    free(r->attend);
    free(r->scores);
    memset(r, 0, sizeof *r);
}

static int recycler_init(recycler *r, const pot *p, int32_t stride, int32_t keep, int32_t pool,
                         char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    if (stride <= 1) return 0;
    size_t lh = (size_t)p->n_layer * p->n_head_kv;
    r->stride = stride;
    r->keep = keep;
    r->pool = pool;
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

gen_seq *gen_seq_new(engine *e, const engine_gen_params *gp, engine_text_cb cb, void *user,
                     char *err, size_t errlen) {
    if (gp->recycle_stride > 1 && gp->recycle_keep <= 0)
        return snprintf(err, errlen, "recycle_keep must be positive"), NULL;
    if (gp->recycle_pool < 0 || (gp->recycle_pool > 0 && gp->recycle_pool % 2 == 0))
        return snprintf(err, errlen, "recycle_pool must be odd (or 0 for %d)", RECYCLE_POOL_DEFAULT), NULL;
    gen_seq *q = calloc(1, sizeof *q);
    if (!q) return snprintf(err, errlen, "out of memory"), NULL;
    q->e = e;
    q->cb = cb;
    q->user = user;
    q->max_tokens = gp->max_tokens;
    q->recycle_stride = gp->recycle_stride;
    q->recycle_keep = gp->recycle_keep;
    q->recycle_pool = gp->recycle_pool ? gp->recycle_pool : RECYCLE_POOL_DEFAULT;
    q->want_logprobs = gp->want_logprobs;
    q->end_after = gp->end_after && *gp->end_after && strlen(gp->end_after) < sizeof q->end_tail ? gp->end_after : NULL;
    q->tokens_out = gp->tokens_out;
    q->logits = malloc((size_t)e->m->n_vocab * sizeof(float));
    q->smp = q->logits ? sampler_new(&gp->sampling, e->m->n_vocab, err, errlen) : NULL;
    q->sm = q->smp ? stop_matcher_new(gp->grammar ? NULL : gp->stop, gp->grammar ? 0 : gp->n_stop, gp->stop_guard)
                   : NULL;
    if (!q->sm) {
        if (!q->logits || q->smp) snprintf(err, errlen, "out of memory"); /* else sampler_new said why */
        gen_seq_free(q);
        return NULL;
    }
    if (gp->grammar) {
        q->gram = grammar_ref(gp->grammar);
        grammar_start(q->gram, &q->gst);
        q->logits_copy = malloc((size_t)e->m->n_vocab * sizeof(float));
        q->allowed = malloc((size_t)e->m->n_vocab);
        if (!q->logits_copy || !q->allowed) {
            snprintf(err, errlen, "out of memory");
            gen_seq_free(q);
            return NULL;
        }
    }
    q->ds.leading_space_done = 1; /* generated text keeps its first space */
    return q;
}

int gen_seq_start(gen_seq *q, pot *p, int own_pot, const int32_t *prompt, size_t n_prompt,
                  char *err, size_t errlen) {
    q->p = p;
    q->own_pot = own_pot;
    memset(&q->res, 0, sizeof q->res);
    q->res.n_cached = p->n;
    if (n_prompt == 0) return snprintf(err, errlen, "empty prompt"), -1;
    if ((size_t)p->n + n_prompt > (size_t)p->capacity)
        return snprintf(err, errlen, "prompt of %zu tokens does not fit the %d free slots",
                        n_prompt, p->capacity - p->n), -1;
    /* checked here, not by the forward: a bad id must fail this sequence, not a whole batch */
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= q->e->m->n_vocab)
            return snprintf(err, errlen, "token id %d is outside the vocabulary (%d)", prompt[i],
                            q->e->m->n_vocab), -1;
    if (recycler_init(&q->rec, p, q->recycle_stride, q->recycle_keep, q->recycle_pool, err, errlen)) return -1;
    if (q->gram && !(q->trie = engine_vocab_trie(q->e))) return snprintf(err, errlen, "out of memory"), -1;
    for (size_t i = 0; i < n_prompt; i++) sampler_accept(q->smp, prompt[i]);
    q->prompt = prompt;
    q->n_prompt = n_prompt;
    q->n_prefilled = 0;
    q->res.finish = ENGINE_FINISH_LENGTH;
    q->state = SEQ_PREFILL;
    q->t_start = monotonic_ms();
    return 0;
}

void gen_seq_history(gen_seq *q, const int32_t *tokens, size_t n) {
    for (size_t i = 0; i < n; i++) sampler_accept(q->smp, tokens[i]);
}

pot *gen_seq_take_pot(gen_seq *q) {
    if (!q->own_pot || q->state != SEQ_DONE) return NULL;
    pot *p = q->p;
    q->p = NULL;
    q->own_pot = 0;
    return p;
}

int gen_seq_forkable(const gen_seq *src) {
    return src->state == SEQ_DECODE && src->res.n_generated == 0 && !src->presampled;
}

int gen_seq_fork(const gen_seq *src, gen_seq *dst, char *err, size_t errlen) {
    engine *e = src->e;
    pot *p = engine_new_decode_pot(e, (size_t)src->p->capacity, err, errlen);
    if (!p) return -1;
    if (pot_copy(p, src->p)) {
        pot_free(p);
        return snprintf(err, errlen, "out of memory copying the prompt's cache"), -1;
    }
    dst->p = p;
    dst->own_pot = 1;
    if (recycler_init(&dst->rec, p, dst->recycle_stride, dst->recycle_keep, dst->recycle_pool, err, errlen)) return -1;
    if (dst->gram && !(dst->trie = engine_vocab_trie(e))) return snprintf(err, errlen, "out of memory"), -1;
    sampler_accept_history(dst->smp, src->smp); /* (its prompt, and a prompt cache's part of it before) */
    memcpy(dst->logits, src->logits, (size_t)e->m->n_vocab * sizeof(float));
    dst->res = src->res;
    dst->res.finish = ENGINE_FINISH_LENGTH;
    dst->n_prompt = src->n_prompt;
    dst->n_prefilled = src->n_prefilled;
    dst->t_start = src->t_start;
    dst->t_decode = src->t_decode;
    dst->state = SEQ_DECODE;
    return 0;
}

void gen_seq_free(gen_seq *q) {
    if (!q) return;
    recycler_free(&q->rec);
    grammar_unref(q->gram);
    free(q->logits_copy);
    free(q->allowed);
    stop_matcher_free(q->sm);
    sampler_free(q->smp);
    free(q->logits);
    free(q->pend);
    if (q->own_pot) pot_free(q->p);
    free(q);
}

int gen_seq_done(const gen_seq *q) { return q->state == SEQ_DONE || q->state == SEQ_NEW; }

int gen_seq_result(const gen_seq *q, engine_gen_result *res, char *err, size_t errlen) {
    *res = q->res;
    if (q->rc) snprintf(err, errlen, "%s", q->err);
    return q->rc;
}

static void seq_fail(gen_seq *q, const char *msg) {
    snprintf(q->err, sizeof q->err, "%s", msg);
    q->rc = -1;
    q->state = SEQ_DONE;
}

/* A token's logprobs waiting for its text: `at` is where its text starts in
 * the detokenized output (a token the detokenizer holds whole starts where
 * the character it begins is written). */
typedef struct pending_lp {
    int64_t at;
    sample_logprobs lp;
} pending_lp;

/* Whether the engine_text_cb calls carry every token's logprobs (else the
 * text alone, with the token that released it). */
static int lp_calls(const gen_seq *q) { return q->want_logprobs && q->cb; }

/* lp_calls: sends the n_out bytes just released with the logprobs of the
 * pending tokens whose text starts before q->n_released (all: every one),
 * a call per token in order, the text with the last one (or alone, token -1,
 * when none is due). 1 when the callback cancelled. */
static int send_released(gen_seq *q, const char *out, size_t n_out, int all) {
    size_t k = 0;
    while (k < q->n_pend && (all || q->pend[k].at < q->n_released)) k++;
    int stop = 0;
    for (size_t i = 0; i < k && !stop; i++) {
        const sample_logprobs *lp = &q->pend[i].lp;
        stop = i + 1 < k ? q->cb(q->user, "", 0, lp->token, lp) : q->cb(q->user, out, n_out, lp->token, lp);
    }
    if (!k && n_out) stop = q->cb(q->user, out, n_out, -1, NULL);
    if (k) {
        q->n_pend -= k;
        memmove(q->pend, q->pend + k, q->n_pend * sizeof *q->pend);
    }
    return stop;
}

/* Emits text through the stop matcher; returns 1 to stop (stop string or
 * callback cancelled). With lp_calls, lp (the token's, NULL for text flushed
 * at the end) waits in q->pend until the first byte of the token's text is
 * released; a stop string drops those of the tokens it cuts off whole. */
static int emit_text(gen_seq *q, const char *text, size_t len, int32_t tok,
                     const sample_logprobs *lp, int *cancelled) {
    const char *out;
    size_t n_out;
    if (lp_calls(q) && lp) {
        if (q->n_pend == q->cap_pend) {
            size_t cap = q->cap_pend ? 2 * q->cap_pend : 8;
            pending_lp *p = realloc(q->pend, cap * sizeof *p);
            if (!p) { /* out of memory: the pending logprobs go now, ahead of their text */
                if (send_released(q, "", 0, 1) || q->cb(q->user, "", 0, lp->token, lp)) *cancelled = 1;
                lp = NULL;
            } else {
                q->pend = p;
                q->cap_pend = cap;
            }
        }
        if (lp) q->pend[q->n_pend++] = (pending_lp){.at = q->n_text, .lp = *lp};
    }
    q->n_text += (int64_t)len;
    int hit = stop_matcher_push(q->sm, text, len, &out, &n_out);
    if (!lp_calls(q)) {
        if (n_out && q->cb && q->cb(q->user, out, n_out, tok, lp)) *cancelled = 1;
        return hit || *cancelled;
    }
    q->n_released += (int64_t)n_out;
    if (!*cancelled && send_released(q, out, n_out, 0)) *cancelled = 1;
    if (hit) q->n_pend = 0; /* the rest lies in the stop string */
    return hit || *cancelled;
}

/* Whether the text so far, now ending with text[0, n), holds end_after. */
static int wrote_end(gen_seq *q, const char *text, size_t n) {
    size_t k = strlen(q->end_after), head = n < k - 1 ? n : k - 1; /* (k < sizeof end_tail) */
    char joint[2 * sizeof q->end_tail]; /* the text before and this text's first bytes: an end across them */
    memcpy(joint, q->end_tail, q->n_end_tail);
    memcpy(joint + q->n_end_tail, text, head);
    if (memmem(joint, q->n_end_tail + head, q->end_after, k) || memmem(text, n, q->end_after, k)) return 1;
    if (n >= k - 1) { /* keep the last k - 1 bytes of it all */
        memcpy(q->end_tail, text + n - (k - 1), k - 1);
        q->n_end_tail = k - 1;
    } else {
        size_t keep = q->n_end_tail + n > k - 1 ? k - 1 - n : q->n_end_tail;
        memmove(q->end_tail, q->end_tail + q->n_end_tail - keep, keep);
        memcpy(q->end_tail + keep, text, n);
        q->n_end_tail = keep + n;
    }
    return 0;
}

/* Ends the sequence; `flush` sends what the detokenizer and the stop matcher
 * still hold (not after a stop string or a cancellation). */
static void seq_finish(gen_seq *q, enum engine_finish finish, int flush) {
    q->res.finish = finish;
    if (flush) {
        char text[256];
        const char *out;
        size_t n_out;
        int cancelled = 0;
        size_t n = detok_flush(&q->ds, text, sizeof text);
        if (n) emit_text(q, text, n, -1, NULL, &cancelled);
        stop_matcher_flush(q->sm, &out, &n_out);
        if (!lp_calls(q)) {
            if (n_out && q->cb) q->cb(q->user, out, n_out, -1, NULL);
        } else if (!cancelled) { /* the tokens still pending go with the rest of the text */
            q->n_released += (int64_t)n_out;
            send_released(q, out, n_out, 1);
        }
    }
    q->res.decode_ms = monotonic_ms() - q->t_decode;
    q->state = SEQ_DONE;
}

void gen_seq_cancel(gen_seq *q) {
    if (q->state == SEQ_DONE) return;
    if (q->state == SEQ_DECODE) seq_finish(q, ENGINE_FINISH_CANCELLED, 0);
    q->res.finish = ENGINE_FINISH_CANCELLED;
    q->state = SEQ_DONE;
}

static int at_max_tokens(const gen_seq *q) {
    return q->max_tokens > 0 && q->res.n_generated >= q->max_tokens;
}

/* Whether the grammar's state takes tok next (an end-of-generation token:
 * when the value is complete) leaving a value that `budget` more tokens can
 * still finish. */
static int grammar_takes(const gen_seq *q, int32_t tok, uint32_t budget) {
    if (tokenizer_is_eog(q->e->m->tok, tok)) return grammar_can_end(q->gram, &q->gst);
    size_t n;
    const char *piece = vocab_trie_piece(q->trie, tok, &n);
    grammar_state st = q->gst;
    return n && grammar_feed(q->gram, &st, piece, n) &&
           (budget == UINT32_MAX || grammar_cost(q->gram, &st) <= budget);
}

static int64_t sat_left(int64_t max, int64_t used) { return max > used ? max - used : 0; }

/* The tokens the sequence may still write after the one being picked: the
 * fewer of max_tokens' and the context's (every token but the last is
 * decoded into the pot, which ends the answer when full); UINT32_MAX with
 * neither bound near. */
static uint32_t tokens_left(const gen_seq *q) {
    int64_t left = INT64_MAX;
    if (q->max_tokens > 0) left = sat_left(q->max_tokens, q->res.n_generated + 1);
    int64_t room = sat_left((int64_t)q->p->capacity, (int64_t)q->p->n);
    if (room < left) left = room;
    return left >= UINT32_MAX ? UINT32_MAX : (uint32_t)left;
}

/* Tokens that end the value from state st: the bytes of its shortest
 * completion split into the longest pieces; -1 when they cannot be built. */
static int32_t closing_tokens(const gen_seq *q, const grammar_state *st, int32_t *ids) {
    char bytes[GEN_MAX_CLOSING * 4];
    int64_t n = grammar_shortest_completion(q->gram, st, bytes, sizeof bytes);
    return n < 0 ? -1 : (int32_t)vocab_trie_split(q->trie, bytes, (size_t)n, ids, GEN_MAX_CLOSING);
}

/* Whether `left` tokens can still end the value after tok (the bytes it
 * still needs bound the tokens, else the tokens of its shortest ending). */
static int tok_leaves_room(const gen_seq *q, int32_t tok, uint32_t left) {
    if (tok < 0) return 0;
    if (grammar_takes(q, tok, left)) return 1;
    size_t n;
    const char *piece = vocab_trie_piece(q->trie, tok, &n);
    grammar_state st = q->gst;
    int32_t ids[GEN_MAX_CLOSING];
    if (!n || !grammar_feed(q->gram, &st, piece, n)) return 0;
    int32_t k = closing_tokens(q, &st, ids);
    return k >= 0 && (uint32_t)k <= left;
}

/* Draws from the logits with every token but those allowed (and the
 * end-of-generation tokens when the value can end) at -inf. */
static int32_t draw_masked(gen_seq *q, sample_logprobs *lpp) {
    int32_t n_vocab = q->e->m->n_vocab;
    int can_end = grammar_can_end(q->gram, &q->gst);
    for (int32_t i = 0; i < n_vocab; i++)
        if (!q->allowed[i] && !(can_end && tokenizer_is_eog(q->e->m->tok, i))) q->logits_copy[i] = -INFINITY;
    return sampler_sample(q->smp, q->logits_copy, lpp);
}

/* The next token from q->logits (scratch). With a grammar, the sampler first
 * draws from all tokens; a token the grammar takes is kept (for greedy that
 * is the masked argmax; for a draw without top_k / top_p / min_p this
 * rejection step gives exactly the masked distribution, with them the draw
 * is from the truncated one first), else the mask is built and the sampler
 * draws again from the logits with every other token at -inf. Only this
 * second draw walks the vocabulary trie.
 * With max_tokens, every token must leave the value a way to end in the
 * tokens that remain: tokens whose state needs at most that many bytes are
 * always fine (a byte is a token at worst); past that bound a token is kept
 * when the value's shortest ending, split into tokens, still fits, and when
 * none of the draws fits, the ending of the current state (which fitted, by
 * the same rule one token earlier) is written token by token. */
static int32_t seq_pick(gen_seq *q, sample_logprobs *lpp) {
    if (!q->gram) return sampler_sample(q->smp, q->logits, lpp);
    int32_t n_vocab = q->e->m->n_vocab;
    if (q->i_closing < q->n_closing) { /* writing the ending: its next token, certain (logprob 0) */
        for (int32_t i = 0; i < n_vocab; i++) q->logits_copy[i] = -INFINITY;
        q->logits_copy[q->closing[q->i_closing]] = 0.0f;
        q->res.n_masked++;
        int32_t tok = sampler_sample(q->smp, q->logits_copy, lpp);
        if (tok == q->closing[q->i_closing]) q->i_closing++;
        return tok;
    }
    memcpy(q->logits_copy, q->logits, (size_t)n_vocab * sizeof(float));
    uint32_t left = tokens_left(q); /* tokens after this one */
    int32_t tok = sampler_sample(q->smp, q->logits, lpp);
    if (tok >= 0 && grammar_takes(q, tok, left)) return tok;
    q->res.n_masked++;
    if (left != UINT32_MAX && tok_leaves_room(q, tok, left)) return tok;
    if (grammar_mask(q->gram, &q->gst, q->trie, left, q->allowed) || left == UINT32_MAX) return draw_masked(q, lpp);
    /* no token leaves as few bytes as tokens remain */
    grammar_mask(q->gram, &q->gst, q->trie, UINT32_MAX, q->allowed);
    tok = draw_masked(q, lpp);
    if (tok_leaves_room(q, tok, left)) return tok;
    int32_t k = closing_tokens(q, &q->gst, q->closing);
    if (k <= 0 || (uint32_t)k > left + 1) return tok; /* too short anyway */
    q->n_closing = k, q->i_closing = 0;
    q->res.n_masked--; /* counted once for this step */
    return seq_pick(q, lpp);
}

/* Samples the next token from the current logits (or takes sample_all's) and
 * emits its text. 1 when the sequence goes on (q->tok is to be decoded), 0
 * when it ended. */
static int seq_sample(gen_seq *q) {
    const tokenizer *tk = q->e->m->tok;
    if (at_max_tokens(q)) return seq_finish(q, ENGINE_FINISH_LENGTH, 1), 0;
    sample_logprobs *lpp = q->want_logprobs ? &q->next_lp : NULL;
    int32_t tok = q->presampled ? q->next_tok : seq_pick(q, lpp);
    q->presampled = 0;
    if (q->tokens_out && q->max_tokens > 0) q->tokens_out[q->res.n_generated] = tok;
    q->res.n_generated++;
    if (tok < 0) return seq_fail(q, q->gram ? "the grammar and logit_bias leave no token" : "logit_bias bans every token"), 0;
    if (tokenizer_is_eog(tk, tok)) return seq_finish(q, ENGINE_FINISH_STOP, 1), 0;
    if (q->gram) {
        size_t n_piece;
        const char *piece = vocab_trie_piece(q->trie, tok, &n_piece);
        grammar_feed(q->gram, &q->gst, piece, n_piece); /* seq_pick chose a token it takes */
    }
    sampler_accept(q->smp, tok);
    char text[256];
    size_t n = detok_push(tk, &q->ds, tok, 0, text, sizeof text);
    int cancelled = 0;
    if (emit_text(q, text, n, tok, lpp, &cancelled))
        return seq_finish(q, cancelled ? ENGINE_FINISH_CANCELLED : ENGINE_FINISH_STOP, 0), 0;
    if (q->end_after && wrote_end(q, text, n)) return seq_finish(q, ENGINE_FINISH_STOP, 1), 0;
    if (q->gram && grammar_must_end(q->gram, &q->gst)) return seq_finish(q, ENGINE_FINISH_STOP, 1), 0;
    /* the last token is never decoded: nothing would read its logits */
    if (q->max_tokens > 0 && q->res.n_generated >= q->max_tokens)
        return seq_finish(q, ENGINE_FINISH_LENGTH, 1), 0;
    if (q->p->n >= q->p->capacity) return seq_finish(q, ENGINE_FINISH_LENGTH, 1), 0; /* context full */
    q->tok = tok;
    return 1;
}

/* The span of the next prefill piece, at most `budget` tokens. */
static void prefill_span(gen_seq *q, int32_t budget, backend_span *sp) {
    size_t rest = q->n_prompt - q->n_prefilled;
    int32_t len = rest < (size_t)budget ? (int32_t)rest : budget;
    int last = (size_t)len == rest;
    *sp = (backend_span){.tokens = q->prompt + q->n_prefilled, .n_tokens = len, .kv = q->p,
                         .logits_mode = last ? BACKEND_LOGITS_LAST : BACKEND_LOGITS_NONE,
                         .logits = q->logits, .prefill = 1};
    q->span_len = len;
}

/* The span decoding q->tok: full attention, or with recycled attention a
 * scoring full step or a partial step over the recycled set. */
static void decode_span(gen_seq *q, backend_span *sp) {
    pot *p = q->p;
    recycler *r = &q->rec;
    *sp = (backend_span){.tokens = &q->tok, .n_tokens = 1, .kv = p,
                         .logits_mode = BACKEND_LOGITS_LAST, .logits = q->logits};
    q->full_pending = 0;
    /* full attention while the pot (with this token) is no larger than the recycled set */
    if (!r->active || p->n + 1 <= r->keep) return;
    if (r->step++ % r->stride == 0) {
        sp->scores = r->scores;
        sp->n_score_rows = 1;
        sp->score_combine = BACKEND_SCORE_MAX;
        q->full_pending = 1;
        q->full_keys = p->n + 1;
        return;
    }
    int32_t recent = p->n - r->full_n, n_attend = r->keep + recent;
    for (int32_t lh = 0; lh < p->n_layer * p->n_head_kv; lh++) {
        int32_t *dst = r->attend + (size_t)lh * n_attend;
        memcpy(dst, r->chosen + (size_t)lh * r->keep, (size_t)r->keep * sizeof *dst);
        for (int32_t i = 0; i < recent; i++) dst[r->keep + i] = r->full_n + i;
    }
    sp->attend_slots = r->attend;
    sp->n_attend = n_attend;
}

/* After the forward: the prefill advances, or a full recycled step picks
 * the entries the next partial steps read. */
static void after_forward(gen_seq *q) {
    if (q->state == SEQ_PREFILL) {
        q->n_prefilled += (size_t)q->span_len;
        if (q->n_prefilled < q->n_prompt) return;
        q->res.n_prompt = (int64_t)q->n_prompt;
        q->t_decode = monotonic_ms();
        q->res.prefill_ms = q->t_decode - q->t_start;
        q->state = SEQ_DECODE;
        return;
    }
    if (!q->full_pending) return;
    recycler *r = &q->rec;
    select_params sel = {.policy = POLICY_FINCH, .n_keep = r->keep, .scores = r->scores,
                         .scores_stride = q->full_keys, .pool = r->pool};
    if (pot_select(q->p, &sel, r->chosen, q->err, sizeof q->err)) {
        q->rc = -1;
        q->state = SEQ_DONE;
        return;
    }
    r->full_n = q->p->n;
}

static void sample_range(void *ctx, int64_t a, int64_t b, int worker) {
    (void)worker;
    gen_seq *const *qs = ctx;
    for (int64_t i = a; i < b; i++) {
        gen_seq *q = qs[i];
        q->next_tok = seq_pick(q, q->want_logprobs ? &q->next_lp : NULL);
        q->presampled = 1;
    }
}

/* Samples every decoding sequence's next token on the backend's threads:
 * each sequence's sampler, logits and logprobs are its own, so the tokens are
 * those of sampling one by one (seq_sample then takes them); the greedy
 * passes over the vocabulary of 8 sequences, and with logprobs or a
 * temperature much more, no longer run on one thread while the rest wait. */
static void sample_all(engine *e, gen_seq **seqs, int n, gen_seq **tmp) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (seqs[i]->state == SEQ_DECODE && !at_max_tokens(seqs[i])) tmp[m++] = seqs[i];
    if (m > 1 && e->be->parallel_for) e->be->parallel_for(e->be, m, sample_range, tmp);
}

int gen_seq_step(engine *e, gen_seq **seqs, int n, gen_step_info *info) {
    gen_step_info st = {0};
    backend_span *spans = malloc((size_t)(n > 0 ? n : 1) * sizeof *spans);
    gen_seq **in = malloc((size_t)(n > 0 ? n : 1) * sizeof *in);
    if (!spans || !in) {
        for (int i = 0; i < n; i++)
            if (seqs[i]->state != SEQ_DONE) seq_fail(seqs[i], "out of memory");
        n = 0;
    }
    /* prefill shares the forward with the decode tokens, PREFILL_CHUNK tokens
       a step, so a long prompt delays the others' next token by one chunk only */
    int32_t budget = PREFILL_CHUNK;
    int m = 0;
    if (n && in) sample_all(e, seqs, n, in);
    for (int i = 0; i < n; i++) {
        gen_seq *q = seqs[i];
        if (q->state == SEQ_PREFILL) {
            if (!budget) continue;
            prefill_span(q, budget, &spans[m]);
            budget -= spans[m].n_tokens;
            st.prefill_tokens += spans[m].n_tokens;
        } else if (q->state == SEQ_DECODE && seq_sample(q)) {
            decode_span(q, &spans[m]);
            st.decode_tokens++;
        } else {
            continue;
        }
        in[m++] = q;
    }
    if (m) {
        char err[256];
        if (e->be->forward(e->be, spans, m, err, sizeof err)) {
            for (int j = 0; j < m; j++) seq_fail(in[j], err);
            st.decode_tokens = st.prefill_tokens = 0;
        } else {
            for (int j = 0; j < m; j++) after_forward(in[j]);
        }
        st.forwards = 1;
    }
    free(spans);
    free(in);
    for (int i = 0; i < n; i++) st.running += seqs[i]->state != SEQ_DONE;
    if (info) *info = st;
    return st.running;
}

pot *gen_new_pot(engine *e, size_t n_prompt, int32_t max_tokens, char *err, size_t errlen) {
    const model *m = e->m;
    size_t capacity = n_prompt + gen_answer_room(e, max_tokens);
    if (capacity > (size_t)m->n_ctx_train) capacity = (size_t)m->n_ctx_train;
    if (n_prompt >= capacity)
        return snprintf(err, errlen, "prompt of %zu tokens leaves no room in the model's context of %d",
                        n_prompt, m->n_ctx_train), NULL;
    return engine_new_decode_pot(e, capacity, err, errlen);
}

int engine_continue(engine *e, pot *p, const int32_t *prompt, size_t n_prompt,
                    const engine_gen_params *gp, engine_text_cb cb, void *user,
                    engine_gen_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    gen_seq *q = gen_seq_new(e, gp, cb, user, err, errlen);
    if (!q) return -1;
    int rc = gen_seq_start(q, p, 0, prompt, n_prompt, err, errlen);
    if (!rc) {
        while (gen_seq_step(e, &q, 1, NULL) > 0) {
        }
        rc = gen_seq_result(q, res, err, errlen);
    }
    gen_seq_free(q);
    return rc;
}

int engine_generate(engine *e, const int32_t *prompt, size_t n_prompt, const engine_gen_params *gp,
                    engine_text_cb cb, void *user, engine_gen_result *res, char *err,
                    size_t errlen) {
    memset(res, 0, sizeof *res);
    pot *p = gen_new_pot(e, n_prompt, gp->max_tokens, err, errlen);
    if (!p) return -1;
    int rc = engine_continue(e, p, prompt, n_prompt, gp, cb, user, res, err, errlen);
    pot_free(p);
    return rc;
}
