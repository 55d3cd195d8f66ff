/* Documents read through a memory pot: bytes -> streaming tokenizer -> token
 * queue -> engine chunks chosen by the schedule -> forward over [pot | chunk]
 * (plus the policy's scoring rows when the pot is about to fill) -> policy
 * selection and in-order compaction. Questions are answered over a copy of
 * the pot, so the pot itself never changes after a question. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine_internal.h"

#define DEFAULT_CATALYST "Summarize the critical points highlighted in this section."
/* reconstruct: the rows after each chunk ask for the chunk again (the KVzip paper's prompt) */
#define RECONSTRUCT_PROMPT "\n\nRepeat the previous context:\n"
/* Where the document goes in the rendered template: not blank at either end,
 * since templates strip a message's blanks (gemma's), and Python's strip
 * counts \x1e among them. */
#define DOC_MARK "<potserve\x1e" "document>"

enum {
    SNAPKV_WINDOW = 32, /* observation rows at the end of a chunk (SnapKV's default) */
    SNAPKV_POOL = 5,    /* pooling width over slots (SnapKV's default) */
    /* infinipot, finch: max pooling width (docs/results/longdoc.md, "Span pooling": the prose
       needle at 16K, 0/15 found choosing token by token, 15/15 with 15) */
    DEFAULT_POOL_WIDTH = 15,
    MAX_POOL_WIDTH = 255,
    STREAMING_SINKS = 4, /* attention sinks kept by streaming (StreamingLLM's default) */
    CASCADES = 4,        /* cascade: sub-caches (the Cascading KV Cache paper's default) */
    NUC_RELATIVE_RADIUS = 32, /* nuc_relative: tokens each side in the neighbourhood's mean */
    CASCADE_SINKS = 64   /* cascade: sinks (Cascading KV Cache), at most a quarter of the kept entries */
};
/* cascade: per-token decay of the attention average (the Cascading KV Cache paper's gamma) */
#define CASCADE_GAMMA 0.9999

/* cascade: the sinks of `room` kept entries (after the pinned prefix) */
static int32_t cascade_sinks(int32_t room) { return room / 4 < CASCADE_SINKS ? room / 4 : CASCADE_SINKS; }

typedef VEC(int32_t) int_vec; /* common/common.h's vec_append */

struct engine_doc {
    engine *e;
    enum pot_policy policy;
    int needs_surprisal;      /* infinipot-style ingest: NuC from every chunk token */
    pot *pot;
    chunk_schedule sched;
    chunk_plan plan;
    int have_plan;
    tok_stream *ts;
    int_vec queue;            /* document tokens not yet run; queue.v[q_pos..] pending */
    size_t q_pos;
    int_vec score_rows;       /* catalyst or question tokens appended when a chunk fills the pot */
    int_vec recorded;         /* every token run (record_tokens) */
    int record;
    float pending_surprisal;  /* surprisal of the next chunk's first token, from the last row */
    int have_pending;
    int32_t n_prefix;
    int32_t finch_keep;
    int rows_are_question;    /* score_rows are FINCH's question (else the catalyst) */
    float nuc_share;
    int32_t pool;             /* pot_select's pooling width (settings' pool_width resolved) */
    enum backend_score_combine combine;
    int plain;
    int no_catalyst;          /* infinipot ablation: the chunk's last rows score, not the catalyst */
    int original_positions;   /* ablation: no context-reset positions (pot_rope_pos) */
    int score_memory;         /* settings' score_memory (infinipot only) */
    int nuc_relative;         /* settings' nuc_relative */
    int reconstruct;          /* settings' reconstruct (infinipot only) */
    int32_t nuc_regions;      /* settings' nuc_regions */
    int_vec reconstruct_rows; /* RECONSTRUCT_PROMPT's tokens; the chunk follows them */
    int shared_selection;     /* settings' shared_selection */
    int whole_words;          /* settings' whole_words */
    int key_diff;             /* settings' key_diff (infinipot only) */
    int observe_rows;         /* settings' observe_rows (infinipot with its catalyst only) */
    int row_max;              /* settings' row_max */
    char *system;             /* chat mode: system message, or NULL */
    engine_doc_stats st;
    int failed;
    atomic_int cancelled;     /* engine_doc_cancel: set by another thread */
    const atomic_int *const *abandon; /* engine_doc_abandon_when(_all): flags other threads set */
    int n_abandon;                    /* how many; 0: never abandoned */
    const atomic_int *abandon_one;    /* engine_doc_abandon_when's one flag (abandon points here) */
    int ended;                /* the final piece has been pushed */
    cascade *casc;            /* POLICY_CASCADE's state */
    engine_compress_hook on_compress; /* diagnostics (engine_doc_on_compress), or NULL */
    void *on_compress_ctx;
    char settings_key[sizeof ((pot_snapshot_meta *)0)->settings]; /* see settings_key() */
};

engine_pot_settings engine_pot_settings_default(void) {
    engine_pot_settings s;
    memset(&s, 0, sizeof s);
    s.budget_tokens = 2048;
    s.chunk_tokens = 0; /* min(512, budget/4), decided when the budget is known */
    s.nuc_share = 0.5f;
    return s;
}

/* Tokenizes text into v (appending). */
static int tokenize_into(const engine *e, const char *text, int add_special, int parse_special,
                         int_vec *v) {
    size_t len = strlen(text);
    int64_t n = tokenizer_encode(e->m->tok, text, len, add_special, parse_special, NULL, 0);
    if (n < 0) return -1;
    int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids) return -1;
    tokenizer_encode(e->m->tok, text, len, add_special, parse_special, ids, n);
    int rc = vec_append(v, ids, (size_t)n);
    free(ids);
    return rc;
}

/* The ids of the chat rendering of [system,] user = DOC_MARK + after, rest...
 * on one side of the mark (want_before: the text before it, the pinned
 * prefix; else the text after it, the question), appended to out; the
 * messages' text is read without control tokens (engine_tokenize_chat). */
static int tokens_around_document(engine_doc *d, const char *after, const engine_message *rest, size_t n_rest,
                                  int want_before, int_vec *out, char *err, size_t errlen) {
    engine_message *msgs = malloc((n_rest + 2) * sizeof *msgs);
    size_t len = strlen(DOC_MARK) + strlen(after) + 1;
    char *user = malloc(len);
    if (!msgs || !user) {
        free(msgs);
        free(user);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    size_t n = 0;
    if (d->system) msgs[n++] = (engine_message){"system", d->system};
    snprintf(user, len, "%s%s", DOC_MARK, after);
    msgs[n++] = (engine_message){"user", user};
    for (size_t i = 0; i < n_rest; i++) msgs[n++] = rest[i];
    chat_spans spans = {0};
    char *text = engine_render_chat(d->e, msgs, n, 1, &spans, err, errlen);
    free(user);
    free(msgs);
    if (!text) return -1;
    char *mark = strstr(text, DOC_MARK);
    int rc = 0;
    if (!mark || strstr(mark + 1, DOC_MARK)) { /* (where the document goes must be one place) */
        snprintf(err, errlen, mark ? "the system prompt or a message holds potserve's document mark"
                                   : "the chat template dropped the document");
        rc = -1;
    } else {
        size_t at = (size_t)(mark - text), n_ids = 0;
        int32_t *ids = want_before ? engine_tokenize_chat(d->e, text, 0, at, &spans, &n_ids)
                                   : engine_tokenize_chat(d->e, text, at + strlen(DOC_MARK), strlen(text), &spans,
                                                          &n_ids);
        rc = ids && !vec_append(out, ids, n_ids) ? 0 : -1;
        if (rc) snprintf(err, errlen, "not valid UTF-8, or out of memory");
        free(ids);
    }
    free(text);
    free(spans.v);
    return rc;
}

/* Appends "\n\n" + text to a growing string; -1 when out of memory. */
static int append_paragraph(char **s, size_t *len, const char *text) {
    size_t add = strlen(text) + 2;
    char *t = realloc(*s, *len + add + 1);
    if (!t) return -1;
    memcpy(t + *len, "\n\n", 2);
    memcpy(t + *len + 2, text, add - 2);
    *len += add;
    t[*len] = 0;
    *s = t;
    return 0;
}

/* Tokens of the prompt that follows the document: in chat mode the messages
 * continue the document's user turn (system and first user contents as
 * paragraphs after it, later turns rendered as they are); plain documents
 * and raw text take the text as it is. */
static int prompt_tokens(engine_doc *d, const engine_message *msgs, size_t n_msgs,
                         const char *raw, int_vec *out, char *err, size_t errlen) {
    if (raw) {
        if (tokenize_into(d->e, raw, 0, 0, out)) return snprintf(err, errlen, "prompt is not valid UTF-8"), -1;
        return 0;
    }
    char *after = calloc(1, 1);
    size_t len = 0, i = 0;
    int rc = after ? 0 : -1;
    /* everything up to and including the first user message joins the document's turn */
    for (; !rc && i < n_msgs; i++) {
        rc = append_paragraph(&after, &len, msgs[i].content);
        if (!strcmp(msgs[i].role, "user")) {
            i++;
            break;
        }
    }
    if (rc) {
        free(after);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    if (d->plain) {
        size_t qlen = len + 32;
        char *text = malloc(qlen);
        rc = text ? 0 : -1;
        if (text) {
            snprintf(text, qlen, "\n\nQuestion: %s\nAnswer:", len >= 2 ? after + 2 : after);
            rc = tokenize_into(d->e, text, 0, 0, out);
        }
        free(text);
        free(after);
        if (rc) snprintf(err, errlen, "question is not valid UTF-8");
        return rc;
    }
    rc = tokens_around_document(d, after, msgs + i, n_msgs - i, 0, out, err, errlen);
    free(after);
    return rc;
}

static int question_tokens(engine_doc *d, const char *question, int_vec *out, char *err,
                           size_t errlen) {
    engine_message m = {"user", question};
    return prompt_tokens(d, &m, 1, NULL, out, err, errlen);
}

int32_t *engine_doc_prompt(engine_doc *d, const engine_message *msgs, size_t n_msgs,
                           const char *raw, size_t *n, char *err, size_t errlen) {
    int_vec q = {0};
    if (prompt_tokens(d, msgs, n_msgs, raw, &q, err, errlen)) {
        free(q.v);
        return NULL;
    }
    if (!q.n) {
        free(q.v);
        snprintf(err, errlen, "empty prompt");
        return NULL;
    }
    *n = q.n;
    return q.v;
}

static void doc_fail(engine_doc *d) { d->failed = 1; }

/* 1 when token id continues the word before it: its text starts with a letter
 * or a digit (any non-ASCII byte counts as a letter), not with a space or a
 * mark. Qwen's and SmolLM2's tokenizers split numbers digit by digit, so the
 * digits after a number's first join it. */
static uint8_t token_joins(const tokenizer *tk, int32_t id) {
    char first[8];
    if (tokenizer_piece(tk, id, 0, first, sizeof first) < 1) return 0;
    unsigned char c = (unsigned char)first[0];
    return c >= 0x80 || isalnum(c);
}

/* Writes whether the token at `slot` joins the word before it into every (layer, head). */
static void set_joins(pot *p, int32_t slot, uint8_t joins) {
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++) p->joins[pot_slot(p, l, h, slot)] = joins;
}

/* Writes the surprisal of the token at `slot` into every (layer, head). */
static void set_surprisal(pot *p, int32_t slot, float value) {
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t h = 0; h < p->n_head_kv; h++) p->surprisal[pot_slot(p, l, h, slot)] = value;
}

/* NuC relative to the neighbourhood (settings' nuc_relative): each of the
 * chunk's n surprisals minus the mean of those within NUC_RELATIVE_RADIUS of
 * it, so a surprising sentence in plain prose outranks the steady surprisal
 * of a table or a code listing. */
static void relative_surprisal(float *sur, int32_t n) {
    double *prefix = malloc(((size_t)n + 1) * sizeof *prefix);
    if (!prefix) return; /* out of memory: the plain surprisal */
    prefix[0] = 0;
    for (int32_t j = 0; j < n; j++) prefix[j + 1] = prefix[j] + sur[j];
    for (int32_t j = 0; j < n; j++) {
        int32_t lo = j - NUC_RELATIVE_RADIUS > 0 ? j - NUC_RELATIVE_RADIUS : 0;
        int32_t hi = j + NUC_RELATIVE_RADIUS < n - 1 ? j + NUC_RELATIVE_RADIUS : n - 1;
        sur[j] -= (float)((prefix[hi + 1] - prefix[lo]) / (hi - lo + 1));
    }
    free(prefix);
}

/* pot_compact, with err set when it failed (a device's K/V not read back). */
static int compact_pot(pot *p, const int32_t *keep, int32_t n_keep, char *err, size_t errlen) {
    if (!pot_compact(p, keep, n_keep)) return 0;
    snprintf(err, errlen, "compaction: the pot's K/V could not be read back from the device");
    return -1;
}

/* Sliding-window layers keep the newest n_keep slots, whatever the policy
 * chose for the others: a window only ever sees the latest positions, so the
 * tail is what full attention shows such a layer (while n_keep >= window - 1;
 * relative positions survive the context reset), and the policy's choice
 * matters for the global layers alone. */
static void keep_window_tails(const engine_doc *d, const pot *p, int32_t *idx, int32_t n_keep) {
    const model *m = d->e->m;
    for (int32_t l = 0; l < p->n_layer; l++)
        for (int32_t g = 0; m->layers[l].window && g < p->n_head_kv; g++)
            for (int32_t i = 0; i < n_keep; i++) idx[((size_t)l * p->n_head_kv + g) * n_keep + i] = p->n - n_keep + i;
}

void engine_doc_on_compress(engine_doc *d, engine_compress_hook hook, void *ctx) {
    d->on_compress = hook;
    d->on_compress_ctx = ctx;
}

/* key_diff: per (layer, KV head), the score of slot j is -cos(k_j, a), a the mean of the
 * head's unit keys (unpinned slots): a key far from what its head usually stores is
 * kept. [n_layer][n_head_kv][p->n] scores, or NULL (out of memory, device failed). */
static float *key_diff_scores(const pot *p) {
    int32_t n = p->n, dim = p->head_dim;
    float *out = malloc((size_t)p->n_layer * p->n_head_kv * n * sizeof *out);
    float *k = malloc((size_t)n * dim * sizeof *k), *a = malloc((size_t)dim * sizeof *a);
    float *norm = malloc((size_t)n * sizeof *norm);
    if (!out || !k || !a || !norm || pot_host_sync(p)) {
        free(out);
        out = NULL;
    }
    for (int32_t lh = 0; out && lh < p->n_layer * p->n_head_kv; lh++) {
        pot_read_k(p, lh / p->n_head_kv, lh % p->n_head_kv, 0, n, k);
        memset(a, 0, (size_t)dim * sizeof *a);
        for (int32_t j = 0; j < n; j++) {
            double sq = 0;
            for (int32_t i = 0; i < dim; i++) sq += (double)k[(size_t)j * dim + i] * k[(size_t)j * dim + i];
            norm[j] = sq > 0 ? (float)sqrt(sq) : 1;
            for (int32_t i = 0; j >= p->n_pinned && i < dim; i++) a[i] += k[(size_t)j * dim + i] / norm[j];
        }
        double an = 0;
        for (int32_t i = 0; i < dim; i++) an += (double)a[i] * a[i];
        an = an > 0 ? sqrt(an) : 1;
        for (int32_t j = 0; j < n; j++) {
            double dot = 0;
            for (int32_t i = 0; i < dim; i++) dot += (double)k[(size_t)j * dim + i] * a[i];
            out[(size_t)lh * n + j] = (float)(-dot / (norm[j] * an));
        }
    }
    free(k);
    free(a);
    free(norm);
    return out;
}

static int compress(engine_doc *d, int32_t keep, const float *scores, int32_t stride, char *err,
                    size_t errlen) {
    double t0 = monotonic_ms();
    pot *p = d->pot;
    float *kd = NULL;
    if (d->key_diff) {
        if (!(kd = key_diff_scores(p)))
            return snprintf(err, errlen, "key_diff: out of memory, or the pot's keys not read back from the device"), -1;
        scores = kd;
        stride = p->n;
    }
    select_params sp = {.policy = d->policy, .n_keep = keep, .scores = scores,
                        .scores_stride = stride, .nuc_share = d->nuc_share,
                        .window = SNAPKV_WINDOW, .n_sinks = STREAMING_SINKS, .pool = d->pool,
                        .shared = d->shared_selection, .regions = d->nuc_regions,
                        .whole_words = d->whole_words};
    if (d->policy == POLICY_FINCH && !scores) sp.policy = POLICY_INFINIPOT; /* two-stage: CaP now */
    if (d->reconstruct) { /* scored when read (run_chunk), not by a catalyst */
        sp.scores = p->score_acc;
        sp.scores_stride = p->capacity;
    } else if (sp.policy == POLICY_INFINIPOT && d->score_memory && scores) {
        /* the catalyst attends most to the newest entries: an old entry competes with the
           score it had when it was new */
        pot_remember_max_scores(p, scores, stride);
        sp.scores = p->score_acc;
        sp.scores_stride = p->capacity;
    }
    int32_t *idx = malloc((size_t)p->n_layer * p->n_head_kv * keep * sizeof *idx);
    uint8_t *why = d->on_compress ? malloc((size_t)p->n_layer * p->n_head_kv * p->n) : NULL;
    if (!idx || (d->on_compress && !why)) {
        free(idx);
        free(why);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    sp.why = why;
    int rc = pot_select(p, &sp, idx, err, errlen);
    if (!rc && d->on_compress) d->on_compress(d->on_compress_ctx, p, &sp);
    free(why);
    free(kd);
    if (!rc) keep_window_tails(d, p, idx, keep);
    if (!rc) rc = compact_pot(p, idx, keep, err, errlen);
    free(idx);
    d->st.compressions += !rc;
    d->st.compress_ms += monotonic_ms() - t0;
    return rc;
}

/* Cascading KV Cache's weights of a chunk's c rows in the moving average: row q counts
 * (1 - g) g^(c-1-q), as if the rows had updated mu one token at a time, so
 * the newest row weighs most. They sum to 1 - g^c, the weight the chunk
 * takes from the decayed history. */
static float *cascade_row_weights(int32_t c) {
    float *w = malloc((size_t)c * sizeof *w);
    for (int32_t q = 0; w && q < c; q++)
        w[q] = (float)((1 - CASCADE_GAMMA) * pow(CASCADE_GAMMA, c - 1 - q));
    return w;
}

/* Cascade after a chunk of c tokens (document indices first..first+c-1): the
 * moving average mu <- g^c mu + max over the KV group of the chunk rows'
 * attention, each row weighted by cascade_row_weights (the backend applies
 * the weights before combining the group, as the Cascading KV Cache's chunked update does),
 * then the cascades' insertions and, when they dropped entries, one compaction. */
static int cascade_step(engine_doc *d, const float *scores, int32_t stride, int64_t first, int32_t c,
                        char *err, size_t errlen) {
    double t0 = monotonic_ms();
    pot *p = d->pot;
    float decay = (float)pow(CASCADE_GAMMA, c);
    for (int32_t lh = 0; lh < p->n_layer * p->n_head_kv; lh++) {
        float *mu = p->score_acc + (size_t)lh * p->capacity;
        const float *s = scores + (size_t)lh * stride;
        for (int32_t j = 0; j < p->n; j++) mu[j] = decay * mu[j] + s[j];
    }
    int32_t keep = cascade_update(d->casc, p, first, c);
    int rc = 0;
    if (keep < p->n) {
        int32_t *idx = malloc((size_t)p->n_layer * p->n_head_kv * keep * sizeof *idx);
        rc = !idx ? (snprintf(err, errlen, "out of memory"), -1)
                  : cascade_keep(d->casc, p, idx, keep) ? (snprintf(err, errlen, "cascade: state lost"), -1) : 0;
        if (!rc) keep_window_tails(d, p, idx, keep);
        if (!rc) rc = compact_pot(p, idx, keep, err, errlen);
        free(idx);
        d->st.compressions += !rc;
    }
    d->st.compress_ms += monotonic_ms() - t0;
    return rc;
}

/* Which rows of [chunk | score rows] produce attention scores, if any. */
static void score_rows(const engine_doc *d, int32_t c, int32_t n_prompt, int compressing,
                       int32_t *row0, int32_t *n_rows) {
    *row0 = 0;
    *n_rows = 0;
    switch (d->policy) {
    case POLICY_INFINIPOT:
    case POLICY_FINCH:
        if (compressing || d->reconstruct) *row0 = c, *n_rows = n_prompt;
        /* without the catalyst, as many of the chunk's own last rows (the InfiniPot
           paper's ablation: the same number of rows, only their source differs) */
        if (compressing && d->no_catalyst) {
            *n_rows = c < (int32_t)d->score_rows.n ? c : (int32_t)d->score_rows.n;
            *row0 = c - *n_rows;
        }
        /* observe_rows: SnapKV's window of the chunk's last rows, then the catalyst's */
        if (compressing && d->observe_rows) {
            int32_t w = c < SNAPKV_WINDOW ? c : SNAPKV_WINDOW;
            *row0 = c - w, *n_rows = w + n_prompt;
        }
        break;
    case POLICY_SNAPKV:
        if (compressing) *n_rows = c < SNAPKV_WINDOW ? c : SNAPKV_WINDOW, *row0 = c - *n_rows;
        break;
    case POLICY_H2O:
    case POLICY_CASCADE:
        *n_rows = c; /* accumulated on every chunk */
        break;
    default:
        break;
    }
}

/* Runs the next c queued tokens; compresses to `keep` afterwards when asked. */
static int run_chunk(engine_doc *d, int32_t c, int compressing, int32_t keep, char *err,
                     size_t errlen) {
    pot *p = d->pot;
    const int32_t *chunk = d->queue.v + d->q_pos;
    int uses_prompt = (d->policy == POLICY_INFINIPOT && !d->no_catalyst && !d->key_diff) || d->policy == POLICY_FINCH;
    int32_t n_prompt = d->reconstruct        ? (int32_t)d->reconstruct_rows.n + c
                       : compressing && uses_prompt ? (int32_t)d->score_rows.n
                                                    : 0;
    int32_t n_tok = c + n_prompt, n0 = p->n, row0, n_rows;
    score_rows(d, c, n_prompt, compressing, &row0, &n_rows);
    int32_t n_keys = n0 + n_tok;

    int32_t *tokens = malloc((size_t)n_tok * sizeof *tokens);
    int32_t *labels = d->needs_surprisal ? malloc((size_t)n_tok * sizeof *labels) : NULL;
    float *label_lp = d->needs_surprisal ? malloc((size_t)n_tok * sizeof *label_lp) : NULL;
    float *scores = n_rows ? calloc((size_t)p->n_layer * p->n_head_kv * n_keys, sizeof *scores) : NULL;
    float *row_w = d->policy == POLICY_CASCADE ? cascade_row_weights(n_rows) : NULL;
    int rc = -1;
    if (!tokens || (d->needs_surprisal && (!labels || !label_lp)) || (n_rows && !scores) ||
        (d->policy == POLICY_CASCADE && !row_w)) {
        snprintf(err, errlen, "out of memory for a chunk of %d tokens", c);
        goto done;
    }
    memcpy(tokens, chunk, (size_t)c * sizeof *tokens);
    if (d->reconstruct) { /* the prompt, then the chunk once more */
        memcpy(tokens + c, d->reconstruct_rows.v, d->reconstruct_rows.n * sizeof *tokens);
        memcpy(tokens + c + d->reconstruct_rows.n, chunk, (size_t)c * sizeof *tokens);
    } else {
        memcpy(tokens + c, d->score_rows.v, (size_t)n_prompt * sizeof *tokens);
    }
    if (labels) {
        /* row t predicts token t+1; the chunk's last row predicts the next queued token */
        for (int32_t t = 0; t < n_tok; t++) labels[t] = -1;
        for (int32_t t = 0; t + 1 < c; t++) labels[t] = chunk[t + 1];
        if (d->q_pos + (size_t)c < d->queue.n) labels[c - 1] = chunk[c]; /* absent only at the end */
    }
    backend_span sp = {.tokens = tokens, .n_tokens = n_tok, .kv = p,
                       .score_row0 = row0, .n_score_rows = n_rows, .scores = scores,
                       .score_combine = d->combine, .score_rows_max = d->row_max,
                       .labels = labels, .label_logprob = label_lp,
                       .score_row_weight = row_w};
    int64_t seen = p->n_seen;
    if (d->e->be->forward(d->e->be, &sp, 1, err, errlen)) goto done;
    pot_truncate(p, n0 + c); /* the scoring rows are never kept */
    p->n_seen = seen + c;
    for (int32_t j = 0; j < c; j++) set_joins(p, n0 + j, token_joins(d->e->m->tok, chunk[j]));
    if (labels) {
        /* the chunk's surprisals: slot n0 + j holds -log p of token j (the first from the
           previous chunk's last row; 0 for the document's first token) */
        float *sur = label_lp; /* reused in place: label_lp[t] is read before sur[t + 1] is written */
        int has_first = d->have_pending;
        float first = has_first ? d->pending_surprisal : 0;
        d->have_pending = labels[c - 1] >= 0;
        d->pending_surprisal = d->have_pending ? -label_lp[c - 1] : 0;
        for (int32_t t = c - 1; t > 0; t--) sur[t] = -label_lp[t - 1];
        sur[0] = first;
        if (d->nuc_relative) relative_surprisal(sur, c);
        for (int32_t j = 0; j < c; j++)
            if (j || has_first) set_surprisal(p, n0 + j, sur[j]);
    }
    if (d->record && vec_append(&d->recorded, chunk, (size_t)c)) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    d->q_pos += (size_t)c;
    d->st.tokens_read += c;
    d->st.chunks++;
    if (d->policy == POLICY_H2O) pot_accumulate_scores(p, scores, n_keys);
    /* reconstruct: every entry keeps the best attention a repetition of text gave it */
    if (d->reconstruct) pot_remember_max_scores(p, scores, n_keys);
    rc = 0;
    if (d->policy == POLICY_CASCADE) rc = cascade_step(d, scores, n_keys, seen, c, err, errlen);
    else if (compressing && keep < p->n) rc = compress(d, keep, scores, n_keys, err, errlen);
done:
    free(row_w);
    free(tokens);
    free(labels);
    free(label_lp);
    free(scores);
    return rc;
}

/* Runs the next engine chunk if the queue can fill it (or holds the rest of
 * a finished document). 1 when a chunk ran, 0 when none is ready. */
static int run_next_chunk(engine_doc *d, char *err, size_t errlen) {
    size_t avail = d->queue.n - d->q_pos;
    if (!avail) return 0;
    if (!d->have_plan) {
        d->plan = schedule_next(&d->sched, d->pot->n);
        d->have_plan = 1;
    }
    if (d->plan.chunk_tokens <= 0) {
        snprintf(err, errlen,
                 "the document does not fit the pot (budget_tokens %d) and policy none never "
                 "compresses",
                 d->sched.budget);
        return -1;
    }
    /* one token of lookahead: the chunk's last row scores the next token's
       surprisal, so it must not depend on whether that token has arrived */
    if (avail <= (size_t)d->plan.chunk_tokens && !d->ended) return 0;
    int32_t c = avail < (size_t)d->plan.chunk_tokens ? (int32_t)avail : d->plan.chunk_tokens;
    int full = c == d->plan.chunk_tokens;
    int compressing = full && d->plan.compress_after && d->policy != POLICY_NONE &&
                      d->policy != POLICY_CASCADE;
    d->have_plan = 0;
    if (run_chunk(d, c, compressing, d->plan.keep_after, err, errlen)) return -1;
    /* drop consumed tokens once they dominate, so the queue stays bounded */
    if (d->q_pos > d->queue.n / 2) {
        memmove(d->queue.v, d->queue.v + d->q_pos, (d->queue.n - d->q_pos) * sizeof *d->queue.v);
        d->queue.n -= d->q_pos;
        d->q_pos = 0;
    }
    return 1;
}

int64_t engine_doc_tokens_pushed(const engine_doc *d) {
    return d->st.tokens_read + (int64_t)(d->queue.n - d->q_pos);
}

int engine_doc_ready_within(engine_doc *d, int64_t limit) {
    int64_t avail = limit - d->st.tokens_read;
    if (avail <= 0 || d->failed) return 0;
    if (!d->have_plan) { /* the plan run_next_chunk will use (schedule_next is deterministic) */
        d->plan = schedule_next(&d->sched, d->pot->n);
        d->have_plan = 1;
    }
    if (avail > d->plan.chunk_tokens) return 1;
    return d->ended && limit >= engine_doc_tokens_pushed(d);
}

/* A document's tokenizer: a plain stream, no special tokens (a document's
 * text is never read as control tokens). */
static tok_stream *doc_tok_stream(const engine *e) { return tok_stream_new(e->m->tok, 0, 0); }

/* A reader is the stream a document's bytes go through. */
struct engine_doc_text_reader {
    tok_stream *ts;
};

engine_doc_text_reader *engine_doc_text_reader_new(const engine *e) {
    engine_doc_text_reader *r = calloc(1, sizeof *r);
    if (r && !(r->ts = doc_tok_stream(e))) {
        free(r);
        return NULL;
    }
    return r;
}

void engine_doc_text_reader_free(engine_doc_text_reader *r) {
    if (!r) return;
    tok_stream_free(r->ts);
    free(r);
}

int engine_doc_text_reader_feed(engine_doc_text_reader *r, const char *bytes, size_t n, int final,
                                int32_t **ids, size_t *n_ids) {
    return tok_stream_feed(r->ts, bytes, n, final, ids, n_ids);
}

void engine_doc_cancel(engine_doc *d) {
    if (d) atomic_store(&d->cancelled, 1);
}

void engine_doc_abandon_when_all(engine_doc *d, const atomic_int *const *flags, int n) {
    d->abandon = flags;
    d->n_abandon = flags ? n : 0;
}

void engine_doc_abandon_when(engine_doc *d, const atomic_int *flag) {
    d->abandon_one = flag;
    engine_doc_abandon_when_all(d, &d->abandon_one, flag != NULL);
}

static int abandoned(const engine_doc *d) {
    for (int i = 0; i < d->n_abandon; i++)
        if (!atomic_load(d->abandon[i])) return 0;
    return d->n_abandon > 0;
}

/* A cancelled document fails at the next push or chunk, on the engine thread. */
static int doc_cancelled(engine_doc *d, char *err, size_t errlen) {
    if (!atomic_load(&d->cancelled) && !abandoned(d)) return 0;
    doc_fail(d);
    snprintf(err, errlen, "the document's ingest was cancelled");
    return -1;
}

int engine_doc_push(engine_doc *d, const char *bytes, size_t n, int final, char *err,
                    size_t errlen) {
    if (doc_cancelled(d, err, errlen)) return -1;
    if (d->failed) return snprintf(err, errlen, "the document already failed"), -1;
    if (d->ended) return snprintf(err, errlen, "the document has already ended"), -1;
    double t0 = monotonic_ms();
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (tok_stream_feed(d->ts, bytes, n, final, &ids, &n_ids)) {
        free(ids);
        doc_fail(d);
        return snprintf(err, errlen, "the document is not valid UTF-8"), -1;
    }
    int rc = vec_append(&d->queue, ids, n_ids);
    free(ids);
    if (rc) {
        doc_fail(d);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    d->ended = final;
    d->st.bytes_read += (int64_t)n;
    d->st.ingest_ms += monotonic_ms() - t0;
    return 0;
}

int engine_doc_step(engine_doc *d, char *err, size_t errlen) {
    if (doc_cancelled(d, err, errlen)) return -1;
    if (d->failed) return snprintf(err, errlen, "the document already failed"), -1;
    double t0 = monotonic_ms();
    int rc = run_next_chunk(d, err, errlen);
    if (rc < 0) doc_fail(d);
    d->st.ingest_ms += monotonic_ms() - t0;
    return rc;
}

int engine_doc_feed(engine_doc *d, const char *bytes, size_t n, int final, char *err,
                    size_t errlen) {
    if (engine_doc_push(d, bytes, n, final, err, errlen)) return -1;
    int rc;
    while ((rc = engine_doc_step(d, err, errlen)) > 0) {
    }
    return rc;
}

static int validate(engine *e, const engine_pot_settings *s, int32_t *keep, char *err,
                    size_t errlen) {
    int32_t ctx = e->m->n_ctx_train;
    if (s->budget_tokens < 16 || s->budget_tokens > ctx)
        return snprintf(err, errlen, "budget_tokens: %d must be in [16, %d] (the model's context)",
                        s->budget_tokens, ctx), -1;
    *keep = s->keep_tokens ? s->keep_tokens : s->budget_tokens / 2;
    if (*keep <= 0 || *keep >= s->budget_tokens)
        return snprintf(err, errlen, "keep_tokens: %d must be in [1, budget_tokens)", *keep), -1;
    if (s->chunk_tokens < 0 || s->chunk_tokens > 8192)
        return snprintf(err, errlen, "chunk_tokens: %d must be in [0, 8192] (0: automatic)", s->chunk_tokens), -1;
    if (s->nuc_regions < 0 || s->nuc_regions > 1024)
        return snprintf(err, errlen, "nuc_regions: %d must be in [0, 1024]", s->nuc_regions), -1;
    if (!(s->nuc_share >= 0 && s->nuc_share <= 1))
        return snprintf(err, errlen, "nuc_share: %g must be in [0, 1]", s->nuc_share), -1;
    if (s->pool_width && (s->pool_width < 1 || s->pool_width > MAX_POOL_WIDTH || s->pool_width % 2 == 0))
        return snprintf(err, errlen, "pool_width: %d must be odd, in [1, %d] (0: default)", s->pool_width,
                        MAX_POOL_WIDTH), -1;
    if (s->finch_keep < 0 || s->finch_keep > s->budget_tokens)
        return snprintf(err, errlen, "finch_keep: %d must be in [0, budget_tokens]", s->finch_keep), -1;
    if (s->no_catalyst && s->policy && strcmp(s->policy, "infinipot"))
        return snprintf(err, errlen, "no_catalyst: only for policy infinipot"), -1;
    /* sliding-window layers keep the pot's newest entries through a compression
       (keep_window_tails): fewer than window - 1 would drop positions their
       next query still sees, and its attention would differ from the model's */
    const int32_t fewest = e->m->n_swa - 1;
    if (e->m->n_swa_layers && (*keep < fewest || (s->finch_keep && s->finch_keep < fewest)))
        return snprintf(err, errlen,
                        "%s: %d is below the model's sliding window - 1 (%d): its %d sliding-window layers "
                        "must keep the last %d positions through a compression",
                        *keep < fewest ? "keep_tokens" : "finch_keep", *keep < fewest ? *keep : s->finch_keep,
                        fewest, e->m->n_swa_layers, fewest), -1;
    return 0;
}

/* Appends printf(fmt, ...) to settings_key's text when `on` (and the text still fits). */
static void key_add(char *out, size_t cap, int *len, int on, const char *fmt, ...) {
    if (!on || *len <= 0 || (size_t)*len >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    *len += vsnprintf(out + *len, cap - (size_t)*len, fmt, ap);
    va_end(ap);
}

/* The canonical text of the settings that change what a document computes
 * (defaults resolved, free texts as length and CRC-32C), so a snapshot is only
 * restored under the settings it was saved with. record_tokens is not one. */
static void settings_key(const engine_doc *d, const engine_pot_settings *s, const char *rows,
                         char *out, size_t cap) {
    const char *texts[3] = {rows, s->question, s->system};
    const char *names[3] = {"rows", "question", "system"};
    uint32_t share;
    memcpy(&share, &s->nuc_share, sizeof share);
    int len = snprintf(out, cap,
                       "doc policy=%s schedule=%s budget=%d keep=%d chunk=%d nuc_share=%08x "
                       "score_max=%d plain=%d finch_keep=%d",
                       pot_policy_name(d->policy), schedule_kind_name(d->sched.kind),
                       d->sched.budget, d->sched.keep, d->sched.chunk_tokens, share,
                       !!s->score_max, !!d->plain, s->finch_keep);
    /* the ablations appear only when on, so snapshots saved before them still load */
    key_add(out, cap, &len, s->no_catalyst, " no_catalyst=1");
    key_add(out, cap, &len, s->original_positions, " positions=original");
    key_add(out, cap, &len, d->score_memory, " score_memory=1");
    key_add(out, cap, &len, d->nuc_regions, " nuc_regions=%d", d->nuc_regions);
    key_add(out, cap, &len, d->reconstruct, " reconstruct=1");
    key_add(out, cap, &len, d->nuc_relative, " nuc_relative=1");
    key_add(out, cap, &len, d->shared_selection, " shared=1");
    key_add(out, cap, &len, d->whole_words, " whole_words=1");
    key_add(out, cap, &len, d->key_diff, " key_diff=1");
    key_add(out, cap, &len, d->observe_rows, " observe_rows=1");
    key_add(out, cap, &len, d->row_max, " row_max=1");
    /* likewise the pooling when it differs from what came before it */
    key_add(out, cap, &len, d->pool != (d->policy == POLICY_SNAPKV ? SNAPKV_POOL : 1), " pool=%d", d->pool);
    /* NuC's spans, once centred, now mostly after their peak: a pot saved under
       centred spans does not continue under the others */
    key_add(out, cap, &len, d->policy == POLICY_INFINIPOT && d->pool > 1, " nuc_lead=%d", pot_nuc_lead(d->pool));
    for (int i = 0; i < 3 && len > 0 && (size_t)len < cap; i++) {
        const char *t = texts[i];
        len += t ? snprintf(out + len, cap - (size_t)len, " %s=%zu:%08x", names[i], strlen(t),
                            crc32c(0, t, strlen(t)))
                 : snprintf(out + len, cap - (size_t)len, " %s=-", names[i]);
    }
}

/* A document of settings s without its pot and token stream: the settings
 * checked, the scoring rows and the pinned prefix tokenized (the prefix into
 * *prefix, the caller's), the schedule and the cascade set up. NULL + err. */
static engine_doc *doc_new(engine *e, const engine_pot_settings *s, int_vec *prefix, char *err,
                           size_t errlen) {
    int32_t keep;
    if (validate(e, s, &keep, err, errlen)) return NULL;
    int policy = pot_policy_from_name(s->policy ? s->policy : "infinipot");
    if (policy < 0) {
        snprintf(err, errlen, "policy: unknown '%s' (known: %s)", s->policy, pot_policy_list());
        return NULL;
    }
    int kind = schedule_kind_from_name(s->schedule ? s->schedule : "fixed");
    if (kind < 0) {
        snprintf(err, errlen, "schedule: unknown '%s' (known: fixed, imdc)", s->schedule);
        return NULL;
    }
    engine_doc *d = calloc(1, sizeof *d);
    if (!d) return snprintf(err, errlen, "out of memory"), NULL;
    d->e = e;
    d->policy = (enum pot_policy)policy;
    d->plain = s->plain;
    d->record = s->record_tokens;
    d->nuc_share = s->nuc_share;
    d->pool = s->pool_width          ? s->pool_width
              : d->policy == POLICY_SNAPKV ? SNAPKV_POOL
              : d->policy == POLICY_INFINIPOT || d->policy == POLICY_FINCH ? DEFAULT_POOL_WIDTH
                                                                           : 1;
    d->finch_keep = s->finch_keep;
    d->no_catalyst = s->no_catalyst;
    d->original_positions = s->original_positions;
    d->score_memory = s->score_memory && d->policy == POLICY_INFINIPOT;
    d->nuc_relative = s->nuc_relative;
    d->reconstruct = s->reconstruct && d->policy == POLICY_INFINIPOT;
    d->nuc_regions = s->nuc_regions > 1 ? s->nuc_regions : 0;
    if (d->reconstruct && tokenize_into(e, RECONSTRUCT_PROMPT, 0, 0, &d->reconstruct_rows)) goto oom;
    d->shared_selection = s->shared_selection;
    d->whole_words = s->whole_words;
    d->key_diff = s->key_diff && d->policy == POLICY_INFINIPOT && !d->reconstruct;
    d->observe_rows = s->observe_rows && d->policy == POLICY_INFINIPOT && !d->no_catalyst && !d->reconstruct &&
                      !d->key_diff;
    d->row_max = s->row_max && d->policy != POLICY_CASCADE && d->policy != POLICY_H2O;
    /* cascade: each KV head decides by the max over its group (Cascading KV Cache) */
    d->combine = s->score_max || d->policy == POLICY_CASCADE ? BACKEND_SCORE_MAX : BACKEND_SCORE_SUM;
    if (s->system && !(d->system = strdup(s->system))) goto oom;

    /* scoring rows: the question (finch, known up front) or the catalyst */
    int finch_up_front = d->policy == POLICY_FINCH && s->question;
    d->rows_are_question = finch_up_front;
    if (d->policy == POLICY_FINCH && !s->question && !s->finch_keep) d->finch_keep = keep;
    d->needs_surprisal = d->policy == POLICY_INFINIPOT || (d->policy == POLICY_FINCH && !finch_up_front);
    const char *rows = finch_up_front ? s->question : (s->catalyst ? s->catalyst : DEFAULT_CATALYST);
    /* (refused before tokenizing when they cannot fit: megabytes held the engine for seconds) */
    if (tokenizer_min_tokens(e->m->tok, strlen(rows)) >= (size_t)e->m->n_ctx_train) {
        snprintf(err, errlen, "%s: its %zu bytes are more tokens than the model's context of %d",
                 finch_up_front ? "question" : "catalyst", strlen(rows), e->m->n_ctx_train);
        goto fail;
    }
    if (s->system && tokenizer_min_tokens(e->m->tok, strlen(s->system)) >= (size_t)keep) {
        snprintf(err, errlen, "keep_tokens: the pinned prefix cannot fit: the system prompt's %zu bytes are more "
                 "tokens than keep_tokens %d (half of budget_tokens unless set)", strlen(s->system), keep);
        goto fail;
    }
    size_t len = strlen(rows) + 3;
    char *text = malloc(len);
    if (!text) goto oom;
    snprintf(text, len, "\n\n%s", rows);
    int bad = tokenize_into(e, text, 0, 0, &d->score_rows);
    free(text);
    if (bad) {
        snprintf(err, errlen, "%s: not valid UTF-8", finch_up_front ? "question" : "catalyst");
        goto fail;
    }

    /* the pinned prefix: template and system prompt before the document */
    if (d->plain) {
        bad = tokenize_into(e, "", 1, 0, prefix);
    } else {
        if (tokens_around_document(d, "", NULL, 0, 1, prefix, err, errlen)) goto fail;
        bad = 0;
    }
    if (bad || prefix->n >= (size_t)keep) {
        snprintf(err, errlen, "keep_tokens: the pinned prefix (%zu tokens: the chat template's start and the system "
                 "prompt) must be shorter than keep_tokens %d (half of budget_tokens unless set): raise them",
                 prefix->n, keep);
        goto fail;
    }
    d->n_prefix = (int32_t)prefix->n;
    int32_t chunk = s->chunk_tokens ? s->chunk_tokens
                                    : (s->budget_tokens / 4 < 512 ? s->budget_tokens / 4 : 512);
    if (schedule_init(&d->sched, (enum schedule_kind)kind, s->budget_tokens, keep, chunk,
                      d->n_prefix, err, errlen))
        goto fail;
    if (d->policy == POLICY_CASCADE) {
        int32_t room = keep - d->n_prefix, sinks = cascade_sinks(room);
        int32_t cap = (room - sinks) / CASCADES * CASCADES;
        if (cap < CASCADES) { /* the fewest kept entries that give each cascade one */
            int32_t least = CASCADES;
            while ((least - cascade_sinks(least)) / CASCADES < 1) least++;
            snprintf(err, errlen, "keep_tokens: %d leaves cascade no room: at least %d here (the pinned prefix's %d "
                     "tokens, then one entry for each of its %d cascades and its sinks)", keep, d->n_prefix + least,
                     d->n_prefix, CASCADES);
            goto fail;
        }
        d->casc = cascade_new(e->m->n_layer, e->m->n_head_kv, CASCADES, cap, sinks, err, errlen);
        if (!d->casc) goto fail;
    }
    settings_key(d, s, rows, d->settings_key, sizeof d->settings_key);
    return d;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    free(prefix->v);
    *prefix = (int_vec){0};
    engine_doc_close(d);
    return NULL;
}

/* Slots of a document's pot: the budget plus room for the scoring rows. */
static size_t doc_capacity(const engine_doc *d) {
    if (d->reconstruct) /* the prompt and a chunk again */
        return (size_t)d->sched.budget + d->reconstruct_rows.n + (size_t)d->sched.chunk_tokens;
    return (size_t)d->sched.budget + d->score_rows.n;
}

/* The most tokens one forward appends to a document's pot: a chunk with its
 * scoring rows (dropped again right after), or a piece of the pinned prefix.
 * A sliding-window layer's ring holds window - 1 entries more than this. */
static int32_t doc_slack(const engine_doc *d) {
    int32_t prefix_piece = d->n_prefix < PREFILL_CHUNK ? d->n_prefix : PREFILL_CHUNK;
    int32_t chunk = d->sched.chunk_tokens + (int32_t)d->score_rows.n;
    return chunk > prefix_piece ? chunk : prefix_piece;
}

/* 0 when the budget and the policy's scoring rows fit the model's context, else -1 and why. */
static int doc_fits_context(const engine_doc *d, char *err, size_t errlen) {
    const engine *e = d->e;
    size_t over = doc_capacity(d) - (size_t)d->sched.budget; /* the policy's scoring rows */
    if (doc_capacity(d) <= (size_t)e->m->n_ctx_train) return 0;
    long long most = (long long)e->m->n_ctx_train - (long long)over;
    if (most >= 16)
        snprintf(err, errlen, "budget_tokens: %d and this policy's %zu scoring rows exceed the model's context "
                 "of %d tokens: budget_tokens can be at most %lld here", d->sched.budget, over,
                 e->m->n_ctx_train, most);
    else /* (the field named first is the one the server's 422 names) */
        snprintf(err, errlen, "%s: this policy's %zu scoring rows (%s) exceed the model's context of %d tokens with "
                 "any budget", d->rows_are_question ? "question" : "catalyst", over,
                 d->rows_are_question ? "a FINCH question's" : "the catalyst's", e->m->n_ctx_train);
    return -1;
}

int engine_doc_check(engine *e, const engine_pot_settings *s, char *err, size_t errlen) {
    int_vec prefix = {0};
    engine_doc *d = doc_new(e, s, &prefix, err, errlen);
    int rc = d ? doc_fits_context(d, err, errlen) : -1;
    free(prefix.v);
    engine_doc_close(d);
    return rc;
}

engine_doc *engine_doc_open(engine *e, const engine_pot_settings *s, char *err, size_t errlen) {
    int_vec prefix = {0};
    engine_doc *d = doc_new(e, s, &prefix, err, errlen);
    if (!d) return NULL;
    if (doc_fits_context(d, err, errlen)) {
        free(prefix.v);
        engine_doc_close(d);
        return NULL;
    }
    d->pot = engine_new_ring_pot(e, doc_capacity(d), doc_slack(d), err, errlen);
    if (d->pot) d->pot->original_positions = d->original_positions;
    d->ts = doc_tok_stream(e);
    int bad = !d->pot || !d->ts;
    if (!d->ts) snprintf(err, errlen, "out of memory");
    if (!bad && prefix.n) {
        double t0 = monotonic_ms();
        bad = engine_prefill(e, d->pot, prefix.v, prefix.n, NULL, err, errlen);
        d->st.ingest_ms += monotonic_ms() - t0;
        if (!bad && d->record && vec_append(&d->recorded, prefix.v, prefix.n))
            bad = 1, snprintf(err, errlen, "out of memory");
    }
    free(prefix.v);
    if (bad) {
        engine_doc_close(d);
        return NULL;
    }
    d->pot->n_pinned = d->n_prefix;
    return d;
}

size_t engine_doc_memory(const engine *e, const engine_pot_settings *s) {
    /* (as before, the scoring rows' few slots are not counted) */
    int32_t chunk = s->chunk_tokens ? s->chunk_tokens : (s->budget_tokens / 4 < 512 ? s->budget_tokens / 4 : 512);
    return engine_ring_pot_bytes(e, (size_t)(s->budget_tokens > 0 ? s->budget_tokens : 1), chunk);
}

void engine_doc_close(engine_doc *d) {
    if (!d) return;
    pot_free(d->pot);
    cascade_free(d->casc);
    tok_stream_free(d->ts);
    free(d->queue.v);
    free(d->score_rows.v);
    free(d->reconstruct_rows.v);
    free(d->recorded.v);
    free(d->system);
    free(d);
}

void engine_doc_get_stats(const engine_doc *d, engine_doc_stats *st) {
    *st = d->st;
    st->tokens_in_pot = d->pot->n;
    st->pinned_tokens = d->n_prefix;
    st->budget_tokens = d->sched.budget;
    st->keep_tokens = d->sched.keep;
    st->pot_bytes = pot_memory(d->pot);
    st->ring_entries = 0;
    for (int32_t l = 0; l < d->pot->n_layer; l++)
        if (pot_ring_rows(d->pot, l) > st->ring_entries) st->ring_entries = pot_ring_rows(d->pot, l);
}

const int32_t *engine_doc_tokens(const engine_doc *d, size_t *n) {
    *n = d->recorded.n;
    return d->record ? d->recorded.v : NULL;
}

int32_t engine_doc_kept(const engine_doc *d, int32_t layer, int32_t head, int64_t *out,
                        int32_t cap) {
    const pot *p = d->pot;
    if (layer < 0 || layer >= p->n_layer || head < 0 || head >= p->n_head_kv) return 0;
    /* a sliding-window layer keeps what its next token sees: the newest window - 1 */
    int32_t window = d->e->m->layers[layer].window, first = window && p->n > window - 1 ? p->n - (window - 1) : 0;
    int32_t kept = p->n - first, n = kept < cap ? kept : cap;
    for (int32_t i = 0; i < n; i++) out[i] = p->token_index[pot_slot(p, layer, head, first + i)] - d->n_prefix;
    return kept;
}

/* A copy of the pot with room for the question and the answer, refined by
 * two-stage FINCH when configured. The caller frees it. */
size_t gen_answer_room(const engine *e, int32_t max_tokens) {
    return max_tokens > 0 ? (size_t)max_tokens : (size_t)e->m->n_ctx_train;
}

pot *doc_answer_pot(engine_doc *d, const int32_t *prompt, size_t n_prompt, size_t answer_room,
                    char *err, size_t errlen) {
    const int_vec qv = {.v = (int32_t *)prompt, .n = n_prompt}, *q = &qv;
    engine *e = d->e;
    if (d->failed) return snprintf(err, errlen, "the document failed earlier"), NULL;
    /* tokens read but not yet run (less than an engine chunk, or the lookahead
       token) are part of what the question is about: they go into the copy */
    size_t pending = d->queue.n - d->q_pos, base = (size_t)d->pot->n + pending;
    size_t need = base + q->n + answer_room;
    if (need > (size_t)e->m->n_ctx_train) need = (size_t)e->m->n_ctx_train;
    if (need < base + q->n)
        return snprintf(err, errlen, ENGINE_ERR_PROMPT_TOO_LONG ": %zu tokens with the %zu the pot holds; the window is %d",
                        q->n, base, e->m->n_ctx_train), NULL;
    pot *p = engine_new_decode_pot(e, need, err, errlen);
    if (!p) return NULL;
    if (pot_copy(p, d->pot)) {
        pot_free(p);
        return snprintf(err, errlen, "the document's pot could not be copied (device read-back failed)"), NULL;
    }
    if (pending && engine_prefill(e, p, d->queue.v + d->q_pos, pending, NULL, err, errlen)) {
        pot_free(p);
        return NULL;
    }
    if (d->policy != POLICY_FINCH || !d->finch_keep || d->finch_keep >= p->n) return p;

    /* two-stage FINCH: one question-guided pass over the stored pot (K1 -> K2) */
    int32_t n0 = p->n, n_keys = n0 + (int32_t)q->n;
    float *scores = calloc((size_t)p->n_layer * p->n_head_kv * n_keys, sizeof *scores);
    int32_t *idx = malloc((size_t)p->n_layer * p->n_head_kv * d->finch_keep * sizeof *idx);
    backend_span sp = {.tokens = q->v, .n_tokens = (int32_t)q->n, .kv = p, .score_row0 = 0,
                       .n_score_rows = (int32_t)q->n, .scores = scores, .score_combine = d->combine};
    int rc = !scores || !idx ? (snprintf(err, errlen, "out of memory"), -1)
                             : e->be->forward(e->be, &sp, 1, err, errlen);
    if (!rc) {
        pot_truncate(p, n0);
        p->n_seen -= (int64_t)q->n;
        select_params sel = {.policy = POLICY_FINCH, .n_keep = d->finch_keep, .scores = scores,
                             .scores_stride = n_keys, .pool = d->pool, .whole_words = d->whole_words};
        rc = pot_select(p, &sel, idx, err, errlen);
        if (!rc) keep_window_tails(d, p, idx, d->finch_keep);
        if (!rc) rc = compact_pot(p, idx, d->finch_keep, err, errlen);
    }
    free(scores);
    free(idx);
    if (rc) {
        pot_free(p);
        return NULL;
    }
    return p;
}

int engine_doc_question_attention(engine_doc *d, const char *question, int32_t cap, float *score,
                                  int64_t *pos, int32_t *n, char *err, size_t errlen) {
    int_vec q = {0};
    if (question_tokens(d, question, &q, err, errlen)) {
        free(q.v);
        return -1;
    }
    pot *p = doc_answer_pot(d, q.v, q.n, 0, err, errlen);
    float *all = NULL;
    int rc = -1;
    if (p && p->n > cap) {
        snprintf(err, errlen, "the pot holds %d entries, more than %d", p->n, cap);
    } else if (p) {
        int32_t n0 = p->n, n_keys = n0 + (int32_t)q.n;
        all = calloc((size_t)p->n_layer * p->n_head_kv * n_keys, sizeof *all);
        backend_span sp = {.tokens = q.v, .n_tokens = (int32_t)q.n, .kv = p, .score_row0 = 0,
                           .n_score_rows = (int32_t)q.n, .scores = all};
        rc = !all ? (snprintf(err, errlen, "out of memory"), -1) : d->e->be->forward(d->e->be, &sp, 1, err, errlen);
        for (int32_t lh = 0; !rc && lh < p->n_layer * p->n_head_kv; lh++)
            for (int32_t j = 0; j < n0; j++) {
                score[(size_t)lh * cap + j] = all[(size_t)lh * n_keys + j];
                pos[(size_t)lh * cap + j] = p->token_index[pot_slot(p, lh / p->n_head_kv, lh % p->n_head_kv, j)] -
                                            d->n_prefix;
            }
        *n = n0;
    }
    free(all);
    pot_free(p);
    free(q.v);
    return rc;
}

int engine_doc_answer(engine_doc *d, const char *question, const engine_gen_params *gp,
                      engine_text_cb cb, void *user, engine_gen_result *res, char *err,
                      size_t errlen) {
    memset(res, 0, sizeof *res);
    int_vec q = {0};
    if (question_tokens(d, question, &q, err, errlen)) {
        free(q.v);
        return -1;
    }
    pot *p = doc_answer_pot(d, q.v, q.n, gen_answer_room(d->e, gp->max_tokens), err, errlen);
    int rc = -1;
    if (p) {
        int64_t cached = p->n;
        rc = engine_continue(d->e, p, q.v, q.n, gp, cb, user, res, err, errlen);
        res->n_cached = cached;
    }
    pot_free(p);
    free(q.v);
    return rc;
}

int engine_doc_answer_logits(engine_doc *d, const char *question, float *logits, char *err,
                             size_t errlen) {
    int_vec q = {0};
    if (question_tokens(d, question, &q, err, errlen)) {
        free(q.v);
        return -1;
    }
    pot *p = doc_answer_pot(d, q.v, q.n, 0, err, errlen);
    int rc = p ? engine_prefill(d->e, p, q.v, q.n, logits, err, errlen) : -1;
    if (!rc && d->record) {
        /* record the pending tail and the question prompt after the document for
           the caller's comparison */
        rc = vec_append(&d->recorded, d->queue.v + d->q_pos, d->queue.n - d->q_pos);
        if (!rc) rc = vec_append(&d->recorded, q.v, q.n);
    }
    pot_free(p);
    free(q.v);
    return rc;
}

/* ---- durable snapshots of a document ------------------------------------------------
 * One file: the pot snapshot (cache/snapshot.c, format 3) with the model's
 * fingerprint, the settings key and the caller's log offset in its header,
 * and this document state as its extra bytes, all under one CRC-32C and one
 * atomic rename. The state, little-endian:
 *   u32 magic "PDOC", u32 version (2; version 1 had no run state)
 *   i32 n_prefix, u32 flags (1 ended, 2 have_plan, 4 have_pending,
 *       8 tokenizer continues a raw fragment, 16 recorded tokens follow)
 *   i32 schedule step, i64 tokens_planned
 *   i32 plan chunk_tokens, compress_after, keep_after
 *   u32 pending_surprisal (f32 bits)
 *   i64 bytes_read, tokens_read, compressions, chunks
 *   u64 ingest_ms, compress_ms (f64 bits)
 *   u64 n + i32[n]: tokens read but not yet run
 *   u64 n + n bytes: what the tokenizer holds back
 *   i32 class, u32 bytes: the run of one class those bytes continue (tok_run)
 *   u64 n + i32[n]: the recorded tokens (with flag 16)
 * Cascade state is not stored: it is rebuilt from the pot (cascade_rebuild). */

enum {
    DOC_STATE_MAGIC = 0x434f4450u, /* "PDOC" */
    DOC_STATE_VERSION = 2,
    DOC_ENDED = 1,
    DOC_HAVE_PLAN = 2,
    DOC_HAVE_PENDING = 4,
    DOC_TOK_CONT = 8,
    DOC_RECORDED = 16,
};

typedef struct byte_out {
    unsigned char *p;
    size_t n, cap;
    int oom;
} byte_out;

static void out_bytes(byte_out *b, const void *src, size_t n) {
    if (!b->oom && vec_append_((void **)&b->p, &b->n, &b->cap, src, n, 1)) b->oom = 1;
}

static void out_u64(byte_out *b, uint64_t v) {
    unsigned char t[8];
    le_put_u64(t, v);
    out_bytes(b, t, 8);
}

static void out_u32(byte_out *b, uint32_t v) {
    unsigned char t[4];
    le_put_u32(t, v);
    out_bytes(b, t, 4);
}

static void out_f64(byte_out *b, double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    out_u64(b, u);
}

/* A token array: u64 count, then i32 each. */
static void out_tokens(byte_out *b, const int32_t *v, size_t n) {
    out_u64(b, n);
    for (size_t i = 0; i < n; i++) out_u32(b, (uint32_t)v[i]);
}

typedef struct byte_in {
    const unsigned char *p;
    size_t n, off;
    int bad; /* read past the end */
} byte_in;

static const unsigned char *in_bytes(byte_in *r, size_t n) {
    if (r->bad || n > r->n - r->off) {
        r->bad = 1;
        return NULL;
    }
    r->off += n;
    return r->p + r->off - n;
}

static uint64_t in_u64(byte_in *r) {
    const unsigned char *t = in_bytes(r, 8);
    return t ? le_get_u64(t) : 0;
}

static uint32_t in_u32(byte_in *r) {
    const unsigned char *t = in_bytes(r, 4);
    return t ? le_get_u32(t) : 0;
}

static double in_f64(byte_in *r) {
    uint64_t u = in_u64(r);
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Appends a token array (see out_tokens) to v, every id below n_vocab. 0 or -1. */
static int in_tokens(byte_in *r, int32_t n_vocab, int_vec *v) {
    uint64_t n = in_u64(r);
    if (r->bad || n > (r->n - r->off) / 4) return r->bad = 1, -1;
    for (uint64_t i = 0; i < n; i++) {
        int32_t id = (int32_t)in_u32(r);
        if (id < 0 || id >= n_vocab || vec_append(v, &id, 1)) return -1;
    }
    return 0;
}

/* CRC-32C of v as 8 little-endian bytes (fingerprints are the same on every host). */
static uint32_t crc_u64(uint32_t c, uint64_t v) {
    unsigned char t[8];
    for (int i = 0; i < 8; i++) t[i] = (unsigned char)(v >> (8 * i));
    return crc32c(c, t, 8);
}

static uint32_t crc_f32s(uint32_t c, const float *v, size_t n) {
    for (size_t i = 0; v && i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], sizeof u);
        c = crc_u64(c, u);
    }
    return c;
}

/* A weight's shape and type into *shape, its first and last bytes into *data. */
static void crc_weight(uint32_t *shape, uint32_t *data, const weight *w) {
    *shape = crc_u64(crc_u64(crc_u64(crc_u64(*shape, w->type), (uint64_t)w->cols),
                             (uint64_t)w->rows), w->row_bytes);
    size_t total = w->row_bytes * (size_t)w->rows, n = total < 64 ? total : 64;
    if (!w->data || !n) return;
    *data = crc32c(*data, w->data, n);
    *data = crc32c(*data, w->data + total - n, n);
}

/* Identifies the model cheaply: CRC-32C of its shape, types and
 * hyper-parameters (high word) and of its norms, samples of every matrix and
 * the tokenizer's vocabulary (low word). Another file of the same
 * architecture but other weights (a fine-tune, another quantisation) differs. */
static uint64_t model_fingerprint(const engine *e) {
    const model *m = e->m;
    uint32_t shape = crc32c(0, m->arch, strnlen(m->arch, sizeof m->arch)), data = 0;
    const int64_t dims[] = {m->n_layer, m->n_embd, m->n_ff, m->n_head, m->n_head_kv, m->head_dim,
                            m->n_rot, m->n_vocab, m->n_ctx_train, m->rope_layout, m->tied_output,
                            m->main_type};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) shape = crc_u64(shape, (uint64_t)dims[i]);
    shape = crc_f32s(crc_f32s(crc_u64(shape, m->n_params), &m->rope_base, 1), &m->norm_eps, 1);
    const float rope_shape[] = {m->rope[0].freq_scale, m->rope[0].ext_factor, m->rope[0].mscale, m->rope[1].base,
                                (float)m->rope[0].n_ctx_orig, (float)m->n_swa, (float)m->n_swa_layers};
    if (model_is_extended(m, NULL)) /* (llama/qwen2 files keep the fingerprints their snapshots carry) */
        shape = crc_f32s(shape, rope_shape, sizeof rope_shape / sizeof *rope_shape);
    if (m->rope_freqs) data = crc_f32s(data, m->rope_freqs, (size_t)m->n_rot / 2);
    crc_weight(&shape, &data, &m->tok_embd);
    crc_weight(&shape, &data, &m->output);
    data = crc_f32s(data, m->output_norm, (size_t)m->n_embd);
    for (int32_t l = 0; l < m->n_layer; l++) {
        const layer_weights *lw = &m->layers[l];
        const weight *ws[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up, &lw->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) crc_weight(&shape, &data, ws[i]);
        shape = crc_u64(shape, (uint64_t)((lw->bq != NULL) | (lw->bk != NULL) << 1 | (lw->bv != NULL) << 2));
        data = crc_f32s(crc_f32s(data, lw->attn_norm, (size_t)m->n_embd), lw->ffn_norm, (size_t)m->n_embd);
        if (lw->q_norm) data = crc_f32s(crc_f32s(data, lw->q_norm, (size_t)m->head_dim), lw->k_norm, (size_t)m->head_dim);
        if (lw->attn_post_norm)
            data = crc_f32s(crc_f32s(data, lw->attn_post_norm, (size_t)m->n_embd), lw->ffn_post_norm, (size_t)m->n_embd);
    }
    const tokenizer *t = m->tok;
    const char *tname = tokenizer_model_name(t);
    data = crc32c(data, tname, strlen(tname));
    data = crc_u64(crc_u64(crc_u64(data, (uint64_t)tokenizer_n_vocab(t)), (uint64_t)tokenizer_bos(t)),
                   (uint64_t)tokenizer_eos(t));
    char piece[256];
    for (int32_t id = 0; id < tokenizer_n_vocab(t); id++) {
        int len = tokenizer_piece(t, id, 1, piece, sizeof piece);
        data = crc_u64(data, (uint64_t)len);
        if (len > 0) data = crc32c(data, piece, (size_t)len < sizeof piece ? (size_t)len : sizeof piece);
    }
    return (uint64_t)shape << 32 | data;
}

/* Serialises d's state beside its pot (the layout above) into *b. */
static void doc_state_encode(const engine_doc *d, const char *held, size_t n_held, const tok_resume *at,
                             byte_out *b) {
    uint32_t flags = (d->ended ? DOC_ENDED : 0) | (d->have_plan ? DOC_HAVE_PLAN : 0) |
                     (d->have_pending ? DOC_HAVE_PENDING : 0) | (at->cont ? DOC_TOK_CONT : 0) |
                     (d->record ? DOC_RECORDED : 0);
    uint32_t surprisal;
    memcpy(&surprisal, &d->pending_surprisal, sizeof surprisal);
    out_u32(b, DOC_STATE_MAGIC);
    out_u32(b, DOC_STATE_VERSION);
    out_u32(b, (uint32_t)d->n_prefix);
    out_u32(b, flags);
    out_u32(b, (uint32_t)d->sched.step);
    out_u64(b, (uint64_t)d->sched.tokens_planned);
    out_u32(b, (uint32_t)d->plan.chunk_tokens);
    out_u32(b, (uint32_t)d->plan.compress_after);
    out_u32(b, (uint32_t)d->plan.keep_after);
    out_u32(b, surprisal);
    const int64_t counts[] = {d->st.bytes_read, d->st.tokens_read, d->st.compressions, d->st.chunks};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) out_u64(b, (uint64_t)counts[i]);
    out_f64(b, d->st.ingest_ms);
    out_f64(b, d->st.compress_ms);
    out_tokens(b, d->queue.v + d->q_pos, d->queue.n - d->q_pos);
    out_u64(b, n_held);
    out_bytes(b, held, n_held);
    out_u32(b, (uint32_t)at->run.cls);
    out_u32(b, at->run.bytes);
    if (d->record) out_tokens(b, d->recorded.v, d->recorded.n);
}

/* d's state beside its pot, with the bytes its tokenizer holds back, into
 * *b (the caller frees b->p). 0, or -1 + err. */
static int doc_state_bytes(const engine_doc *d, byte_out *b, char *err, size_t errlen) {
    if (d->failed) return snprintf(err, errlen, "the document failed earlier: nothing to save"), -1;
    tok_resume at;
    size_t n_held = tok_stream_held(d->ts, NULL, 0, &at);
    char *held = malloc(n_held ? n_held : 1);
    if (!held) return snprintf(err, errlen, "out of memory"), -1;
    tok_stream_held(d->ts, held, n_held, &at);
    doc_state_encode(d, held, n_held, &at, b);
    free(held);
    if (b->oom) return snprintf(err, errlen, "out of memory"), -1;
    return 0;
}

int engine_doc_save(const engine_doc *d, const char *path, uint64_t log_offset, char *err,
                    size_t errlen) {
    byte_out b = {0};
    if (doc_state_bytes(d, &b, err, errlen)) return free(b.p), -1;
    pot_snapshot_meta meta;
    memset(&meta, 0, sizeof meta);
    meta.model_fingerprint = model_fingerprint(d->e);
    meta.log_offset = log_offset;
    memcpy(meta.settings, d->settings_key, sizeof meta.settings);
    int rc = pot_snapshot_write_extra(path, d->pot, &meta, b.p, b.n, err, errlen);
    free(b.p);
    return rc;
}

/* The first field where two settings keys differ, as "saved, now current". */
static void key_difference(const char *saved, const char *now, char *out, size_t cap) {
    size_t i = 0, field = 0;
    for (; saved[i] && saved[i] == now[i]; i++)
        if (saved[i] == ' ') field = i + 1;
    int a = (int)strcspn(saved + field, " "), b = (int)strcspn(now + field, " ");
    snprintf(out, cap, "%.*s, now %.*s", a, saved + field, b, now + field);
}

/* Sets d's state from the bytes doc_state_encode wrote (the pot already in
 * place); re-feeds what the tokenizer held back. 0, or -1 + err. */
static int doc_state_decode(engine_doc *d, const unsigned char *p, size_t n, char *err,
                            size_t errlen) {
    byte_in r = {p, n, 0, 0};
    int32_t n_vocab = d->e->m->n_vocab;
    if (in_u32(&r) != DOC_STATE_MAGIC) return snprintf(err, errlen, "no document state in it (a bare pot snapshot)"), -1;
    uint32_t version = in_u32(&r);
    if (version != DOC_STATE_VERSION) /* (the server then replays the session's log) */
        return snprintf(err, errlen, "document state format version %u (this build reads %d)",
                        version, DOC_STATE_VERSION), -1;
    int32_t n_prefix = (int32_t)in_u32(&r);
    uint32_t flags = in_u32(&r);
    d->sched.step = (int32_t)in_u32(&r);
    d->sched.tokens_planned = (int64_t)in_u64(&r);
    d->plan.chunk_tokens = (int32_t)in_u32(&r);
    d->plan.compress_after = (int)in_u32(&r);
    d->plan.keep_after = (int32_t)in_u32(&r);
    uint32_t surprisal = in_u32(&r);
    memcpy(&d->pending_surprisal, &surprisal, sizeof surprisal);
    int64_t *counts[] = {&d->st.bytes_read, &d->st.tokens_read, &d->st.compressions, &d->st.chunks};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) *counts[i] = (int64_t)in_u64(&r);
    d->st.ingest_ms = in_f64(&r);
    d->st.compress_ms = in_f64(&r);
    d->ended = !!(flags & DOC_ENDED);
    d->have_plan = !!(flags & DOC_HAVE_PLAN);
    d->have_pending = !!(flags & DOC_HAVE_PENDING);
    if (in_tokens(&r, n_vocab, &d->queue)) goto bad;
    uint64_t n_held = in_u64(&r);
    const unsigned char *held = r.bad || n_held > r.n - r.off ? NULL : in_bytes(&r, (size_t)n_held);
    if (!held) goto bad;
    tok_resume at = {.cont = !!(flags & DOC_TOK_CONT)};
    at.run.cls = (int32_t)in_u32(&r);
    at.run.bytes = in_u32(&r);
    if (at.run.cls < -1 || at.run.cls > 3 || at.run.bytes >= TOK_RUN_CUT) goto bad;
    int_vec recorded = {0};
    if ((flags & DOC_RECORDED) && in_tokens(&r, n_vocab, &recorded)) {
        free(recorded.v);
        goto bad;
    }
    if (d->record && !(flags & DOC_RECORDED)) {
        free(recorded.v);
        return snprintf(err, errlen, "record_tokens: the snapshot holds no recorded tokens"), -1;
    }
    if (d->record) d->recorded = recorded; /* empty until now: doc_new records nothing */
    else free(recorded.v);
    const pot *pt = d->pot;
    if (r.bad || r.off != r.n || n_prefix != d->n_prefix || (flags & ~31u) ||
        (d->ended && n_held) || d->sched.step < 0 || d->sched.tokens_planned < 0 ||
        d->plan.chunk_tokens < 0 || d->plan.chunk_tokens > d->sched.chunk_tokens ||
        d->plan.keep_after < 0 || d->plan.keep_after > d->sched.budget || d->st.bytes_read < 0 ||
        d->st.tokens_read < 0 || d->st.compressions < 0 || d->st.chunks < 0 ||
        pt->n_pinned != d->n_prefix || pt->n > d->sched.budget ||
        pt->n_seen != d->n_prefix + d->st.tokens_read)
        goto bad;
    d->ts = tok_stream_resume(d->e->m->tok, 0, 0, &at);
    if (!d->ts) return snprintf(err, errlen, "out of memory"), -1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    int rc = tok_stream_feed(d->ts, (const char *)held, (size_t)n_held, 0, &ids, &n_ids);
    if (!rc) rc = vec_append(&d->queue, ids, n_ids);
    free(ids);
    if (rc) return snprintf(err, errlen, "the held-back bytes do not tokenize"), -1;
    return 0;
bad:
    return snprintf(err, errlen, "inconsistent document state"), -1;
}

/* The cascade's state follows from the tokens inserted and the entries kept:
 * within a (layer, head) each cascade holds its entries oldest first, and
 * every decision between two tokens that were both kept to the end is
 * impossible (the loser is dropped for good). So re-inserting every document
 * token against a view of the pot in which each kept entry outscores every
 * dropped one (dropped tokens are absent and score -1) takes the same branch
 * at every step wherever a kept token is involved, and ends with the same
 * rings holding the same kept tokens; which dropped token a slot held before
 * it was evicted never mattered. The result must keep exactly the pot. */
static int cascade_rebuild(engine_doc *d, char *err, size_t errlen) {
    const pot *p = d->pot;
    size_t slots = (size_t)p->n_layer * p->n_head_kv * p->capacity;
    float *ones = malloc(slots * sizeof *ones);
    int32_t *idx = malloc(slots * sizeof *idx);
    int ok = ones && idx;
    if (ok) {
        for (size_t i = 0; i < slots; i++) ones[i] = 1.0f;
        pot view = *p;
        view.score_acc = ones;
        int32_t kept = cascade_update(d->casc, &view, d->n_prefix, d->st.tokens_read);
        ok = kept == p->n && !cascade_keep(d->casc, &view, idx, kept);
        for (size_t lh = 0; ok && lh < (size_t)p->n_layer * p->n_head_kv; lh++)
            for (int32_t i = 0; ok && i < kept; i++) ok = idx[lh * (size_t)kept + (size_t)i] == i;
        if (!ok) snprintf(err, errlen, "the cascade's state does not match the pot");
    } else {
        snprintf(err, errlen, "out of memory");
    }
    free(ones);
    free(idx);
    return ok ? 0 : -1;
}

/* With d's pot in place: the rest of its state from doc_state_bytes' bytes
 * (the cascade's rebuilt from the pot). 0, or -1 + err. */
static int doc_state_restore(engine_doc *d, const void *p, size_t n, char *err, size_t errlen) {
    if (doc_state_decode(d, p, n, err, errlen)) return -1;
    return d->policy == POLICY_CASCADE ? cascade_rebuild(d, err, errlen) : 0;
}

engine_doc *engine_doc_copy(const engine_doc *d, const engine_pot_settings *s, char *err, size_t errlen) {
    byte_out b = {0};
    if (doc_state_bytes(d, &b, err, errlen)) return free(b.p), NULL;
    int_vec prefix = {0};
    engine_doc *c = doc_new(d->e, s, &prefix, err, errlen);
    free(prefix.v); /* the copied pot holds the prefix, the state its recorded tokens */
    int bad = !c;
    if (!bad && strcmp(c->settings_key, d->settings_key))
        bad = 1, snprintf(err, errlen, "the settings are not the document's");
    if (!bad && !(c->pot = engine_new_ring_pot(d->e, doc_capacity(c), doc_slack(c), err, errlen))) bad = 1;
    if (!bad && pot_copy(c->pot, d->pot)) bad = 1, snprintf(err, errlen, "out of memory copying the pot");
    if (!bad && doc_state_restore(c, b.p, b.n, err, errlen)) bad = 1;
    free(b.p);
    if (bad) {
        engine_doc_close(c);
        return NULL;
    }
    return c;
}

engine_doc *engine_doc_load(engine *e, const engine_pot_settings *s, const char *path,
                            uint64_t *log_offset, char *err, size_t errlen) {
    int_vec prefix = {0};
    engine_doc *d = doc_new(e, s, &prefix, err, errlen);
    free(prefix.v); /* the pot holds the prefix, the state its recorded tokens */
    if (!d) return NULL;
    char why[256];
    pot_snapshot_meta meta;
    void *extra = NULL;
    size_t extra_len = 0;
    if (doc_capacity(d) > (size_t)e->m->n_ctx_train) {
        snprintf(err, errlen, "%zu tokens exceed the model's context of %d tokens",
                 doc_capacity(d), e->m->n_ctx_train);
        goto fail;
    }
    d->pot = pot_snapshot_read_extra(path, (int32_t)doc_capacity(d), &meta, &extra, &extra_len,
                                     err, errlen);
    if (!d->pot) goto fail;
    d->pot->original_positions = d->original_positions; /* a setting, checked by the key below */
    if (meta.model_fingerprint != model_fingerprint(e)) {
        snprintf(why, sizeof why, "written for another model (fingerprint %016llx)",
                 (unsigned long long)meta.model_fingerprint);
    } else if (strcmp(meta.settings, d->settings_key)) {
        char diff[200];
        key_difference(meta.settings, d->settings_key, diff, sizeof diff);
        snprintf(why, sizeof why, "saved with other pot settings (%s)", diff);
    } else if (d->pot->n_layer != e->m->n_layer || d->pot->n_head_kv != e->m->n_head_kv ||
               d->pot->head_dim != e->m->head_dim) {
        snprintf(why, sizeof why,
                 "its pot has %d layers x %d KV heads x head size %d, the model %d x %d x %d",
                 d->pot->n_layer, d->pot->n_head_kv, d->pot->head_dim, e->m->n_layer,
                 e->m->n_head_kv, e->m->head_dim);
    } else if (d->pot->dtype != e->kv_dtype) {
        snprintf(why, sizeof why, "its pot holds %s entries, the engine %s",
                 d->pot->dtype == POT_F32 ? "f32" : "f16", e->kv_dtype == POT_F32 ? "f32" : "f16");
    } else if (doc_state_restore(d, extra, extra ? extra_len : 0, why, sizeof why) == 0) {
        free(extra);
        *log_offset = meta.log_offset;
        /* a snapshot's pot keeps every slot: back into rings (what the window sees is there) */
        pot *rings = engine_new_ring_pot(e, doc_capacity(d), doc_slack(d), err, errlen);
        if (!rings || pot_copy(rings, d->pot)) {
            pot_free(rings);
            goto fail;
        }
        pot_free(d->pot);
        d->pot = rings;
        return d;
    }
    snprintf(err, errlen, "snapshot %s: %s", path, why);
fail:
    free(extra);
    engine_doc_close(d);
    return NULL;
}
