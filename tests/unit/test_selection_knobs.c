/* The question-agnostic selection knobs of engine_pot_settings (score_memory,
 * nuc_relative, shared_selection) and the compression hook that reports why
 * each entry was kept (longdoc_bench --winners), on the tiny fixture model:
 * - the hook sees every compression, each head's why[] marks exactly the
 *   kept count, NuC's share as nuc_share says;
 * - shared_selection: every layer and head holds the same tokens after each
 *   compression (and without it they do not);
 * - nuc_relative: the first compression sees each chunk's surprisal minus the
 *   mean of its neighbours (32 each side, within the chunk) of the plain one
 *   (the document's first token has none and stays 0);
 * - score_memory: a compressing pot differs from the default's;
 * - key_diff: the scores a compression selects by are KeyDiff's, recomputed
 *   here from the pot's keys. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "engine/engine.h"
#include "test.h"
#include "test_model.h"

enum { CHUNK = 72, BUDGET = 176 };

typedef struct seen {
    int compressions;
    int bad_counts;        /* heads whose why[] does not mark n_keep slots or NuC's share */
    int heads_differ;      /* compressions where two heads kept different tokens */
    int32_t n_first, pinned_first;
    float surprisal_first[BUDGET + CHUNK + 8]; /* layer 0, head 0, at the first compression */
} seen;

static void on_compress(void *ctx, const pot *p, const select_params *sp) {
    seen *s = ctx;
    int32_t free_slots = sp->n_keep - p->n_pinned, nuc = (int32_t)floorf(sp->nuc_share * (float)free_slots);
    for (int32_t lh = 0; lh < p->n_layer * p->n_head_kv; lh++) {
        int32_t kept = 0, by_nuc = 0;
        for (int32_t j = 0; j < p->n; j++) {
            kept += sp->why[(size_t)lh * p->n + j] != POT_DROPPED;
            by_nuc += sp->why[(size_t)lh * p->n + j] == POT_KEPT_NUC;
        }
        s->bad_counts += kept != sp->n_keep || by_nuc != nuc;
    }
    /* the kept tokens, compared between heads */
    for (int32_t lh = 1; lh < p->n_layer * p->n_head_kv; lh++)
        if (memcmp(sp->why + (size_t)lh * p->n, sp->why, (size_t)p->n)) {
            s->heads_differ++;
            break;
        }
    if (!s->compressions++ && p->n <= (int32_t)(sizeof s->surprisal_first / sizeof *s->surprisal_first)) {
        s->n_first = p->n;
        s->pinned_first = p->n_pinned;
        memcpy(s->surprisal_first, p->surprisal, (size_t)p->n * sizeof *p->surprisal);
    }
}

static int read_with(engine *e, const engine_pot_settings *set, const char *doc, seen *s, int64_t *kept_tokens) {
    char err[512];
    memset(s, 0, sizeof *s);
    engine_doc *d = engine_doc_open(e, set, err, sizeof err);
    if (!d) return fprintf(stderr, "  open: %s\n", err), -1;
    engine_doc_on_compress(d, on_compress, s);
    int rc = engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    if (!rc && kept_tokens) engine_doc_kept(d, 0, 0, kept_tokens, BUDGET);
    engine_doc_close(d);
    return rc;
}

/* The tiny fixture model, exact f32 activations and pots. */
static engine *open_tiny(void) {
    engine_options opt = {.n_threads = 2, .exact = 1, .kv_f32 = 1};
    return test_open_engine(test_fixture("tiny_llama.gguf"), &opt);
}

/* Reads doc through a pot of settings s with `hook` seeing every compression. 0 or -1. */
static int feed_with_hook(engine *e, const engine_pot_settings *s, const char *doc, engine_compress_hook hook,
                          void *ctx) {
    char err[512];
    engine_doc *d = engine_doc_open(e, s, err, sizeof err);
    if (!d) return fprintf(stderr, "  open: %s\n", err), -1;
    engine_doc_on_compress(d, hook, ctx);
    int rc = engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    engine_doc_close(d);
    return rc;
}

static engine_pot_settings knobs(int memory, int relative, int shared) {
    engine_pot_settings s = engine_pot_settings_default();
    s.budget_tokens = BUDGET;
    s.chunk_tokens = CHUNK;
    s.score_memory = memory;
    s.nuc_relative = relative;
    s.shared_selection = shared;
    return s;
}

TEST(selection_knobs_and_the_compression_hook) {
    engine *e = open_tiny();
    CHECK(e != NULL);
    if (!e) return;
    char *doc = test_lighthouse_doc(8000);
    seen plain, shared, rel, mem;
    int64_t kept_plain[BUDGET], kept_mem[BUDGET];
    engine_pot_settings sp = knobs(0, 0, 0), ss = knobs(0, 0, 1), sr = knobs(0, 1, 0), sm = knobs(1, 0, 0);
    CHECK_EQ_INT(read_with(e, &sp, doc, &plain, kept_plain), 0);
    CHECK_EQ_INT(read_with(e, &ss, doc, &shared, NULL), 0);
    CHECK_EQ_INT(read_with(e, &sr, doc, &rel, NULL), 0);
    CHECK_EQ_INT(read_with(e, &sm, doc, &mem, kept_mem), 0);
    CHECK(plain.compressions > 5);
    CHECK_EQ_INT(plain.bad_counts + shared.bad_counts + rel.bad_counts + mem.bad_counts, 0);
    CHECK(plain.heads_differ > 0);
    CHECK_EQ_INT(shared.heads_differ, 0);
    CHECK(memcmp(kept_plain, kept_mem, sizeof kept_plain) != 0);
    /* nuc_relative: the same surprisals, each minus its chunk neighbourhood's mean */
    CHECK(plain.n_first == rel.n_first && plain.n_first > plain.pinned_first + CHUNK);
    int32_t first = plain.pinned_first, bad = 0;
    for (int32_t c0 = first; c0 < plain.n_first; c0 += CHUNK) {
        int32_t c1 = c0 + CHUNK < plain.n_first ? c0 + CHUNK : plain.n_first;
        for (int32_t j = c0; j < c1; j++) {
            int32_t lo = j - 32 > c0 ? j - 32 : c0, hi = j + 32 < c1 - 1 ? j + 32 : c1 - 1;
            double mean = 0;
            for (int32_t i = lo; i <= hi; i++) mean += plain.surprisal_first[i];
            mean /= hi - lo + 1;
            if (j == first) continue; /* the document's first token: no surprisal, 0 in both */
            bad += fabs(rel.surprisal_first[j] - (plain.surprisal_first[j] - mean)) > 1e-4;
        }
    }
    CHECK_EQ_INT(bad, 0);
    free(doc);
    engine_close(e);
}

typedef struct scored {
    int compressions, from_memory, unscored; /* unscored: unpinned entries never given a score */
} scored;

static void on_compress_scored(void *ctx, const pot *p, const select_params *sp) {
    scored *s = ctx;
    s->compressions++;
    s->from_memory += sp->scores == p->score_acc && sp->scores_stride == p->capacity;
    for (int32_t lh = 0; lh < p->n_layer * p->n_head_kv; lh++)
        for (int32_t j = p->n_pinned; j < p->n; j++) s->unscored += !(p->score_acc[(size_t)lh * p->capacity + j] > 0);
}

/* reconstruct: every chunk, compressing or not, is scored when read (so no
 * entry reaches a compression without a score), the compressions select by
 * those remembered scores, and the repeated rows never stay in the pot: with a
 * budget the document fits in, the answer is the plain pot's, bit for bit. */
TEST(reconstruct_scores_every_chunk_when_read) {
    engine *e = open_tiny();
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    char err[512], *doc = test_lighthouse_doc(8000), *small = test_lighthouse_doc(150);
    engine_pot_settings s = knobs(0, 0, 0);
    s.reconstruct = 1;
    s.budget_tokens = 160; /* with the repeated chunk, within the tiny model's 256 */
    s.chunk_tokens = 64;
    scored sc = {0};
    CHECK_EQ_INT(feed_with_hook(e, &s, doc, on_compress_scored, &sc), 0);
    CHECK(sc.compressions > 5);
    CHECK_EQ_INT(sc.from_memory, sc.compressions);
    CHECK_EQ_INT(sc.unscored, 0);
    /* no compression: the same answer as without the repeated rows */
    float *a = malloc((size_t)info.n_vocab * sizeof *a), *b = malloc((size_t)info.n_vocab * sizeof *b);
    engine_pot_settings plain = knobs(0, 0, 0);
    plain.budget_tokens = s.budget_tokens = 150;
    plain.chunk_tokens = s.chunk_tokens = 48;
    engine_doc *dp = engine_doc_open(e, &plain, err, sizeof err), *dr = engine_doc_open(e, &s, err, sizeof err);
    CHECK(dp && dr && a && b);
    if (dp && dr && a && b) {
        CHECK_EQ_INT(engine_doc_feed(dp, small, strlen(small), 1, err, sizeof err), 0);
        CHECK_EQ_INT(engine_doc_feed(dr, small, strlen(small), 1, err, sizeof err), 0);
        CHECK_EQ_INT(engine_doc_answer_logits(dp, "Who kept the light?", a, err, sizeof err), 0);
        CHECK_EQ_INT(engine_doc_answer_logits(dr, "Who kept the light?", b, err, sizeof err), 0);
        /* the chunks' own rows compute alike with or without rows after them: the same bits */
        CHECK(memcmp(a, b, (size_t)info.n_vocab * sizeof *a) == 0);
    }
    engine_doc_close(dp);
    engine_doc_close(dr);
    free(a);
    free(b);
    free(small);
    free(doc);
    engine_close(e);
}

typedef struct key_checked {
    int compressions, bad_scores, cap_kept; /* cap_kept: heads where the score chose some slots */
} key_checked;

/* Recomputes KeyDiff's score from the pot's keys, independently of the engine:
 * slot j of (l, h) scores -cos(k_j, a), a the mean of the unpinned unit keys. */
static void on_compress_keys(void *ctx, const pot *p, const select_params *sp) {
    key_checked *s = ctx;
    s->compressions++;
    int32_t dim = p->head_dim;
    float *k = malloc((size_t)p->n * dim * sizeof *k);
    double *a = calloc((size_t)dim, sizeof *a);
    for (int32_t lh = 0; k && a && lh < p->n_layer * p->n_head_kv; lh++) {
        pot_read_k(p, lh / p->n_head_kv, lh % p->n_head_kv, 0, p->n, k);
        memset(a, 0, (size_t)dim * sizeof *a);
        for (int32_t j = p->n_pinned; j < p->n; j++) {
            double nj = 0;
            for (int32_t i = 0; i < dim; i++) nj += (double)k[j * dim + i] * k[j * dim + i];
            for (int32_t i = 0; i < dim; i++) a[i] += k[j * dim + i] / sqrt(nj);
        }
        int by_score = 0;
        for (int32_t j = 0; j < p->n; j++) {
            double dot = 0, nj = 0, na = 0;
            for (int32_t i = 0; i < dim; i++) {
                dot += k[j * dim + i] * a[i];
                nj += (double)k[j * dim + i] * k[j * dim + i];
                na += a[i] * a[i];
            }
            s->bad_scores += fabs(sp->scores[(size_t)lh * sp->scores_stride + j] + dot / sqrt(nj * na)) > 1e-4;
            by_score |= sp->why[(size_t)lh * p->n + j] == POT_KEPT_SCORE;
        }
        s->cap_kept += by_score;
    }
    free(k);
    free(a);
}

/* key_diff: every compression selects by the keys' distinctiveness (the scores
 * the hook sees are -cos to the head's mean unit key, recomputed here), every
 * head keeps some entries by that score, and NuC keeps its share. */
TEST(key_diff_scores_by_the_keys) {
    engine *e = open_tiny();
    CHECK(e != NULL);
    if (!e) return;
    char *doc = test_lighthouse_doc(8000);
    engine_pot_settings s = knobs(0, 0, 0);
    s.key_diff = 1;
    key_checked kc = {0};
    CHECK_EQ_INT(feed_with_hook(e, &s, doc, on_compress_keys, &kc), 0);
    engine_info info;
    engine_get_info(e, &info);
    CHECK(kc.compressions > 5);
    CHECK_EQ_INT(kc.bad_scores, 0);
    CHECK_EQ_INT(kc.cap_kept, kc.compressions * info.n_layer * info.n_head_kv);
    seen by_keys;
    CHECK_EQ_INT(read_with(e, &s, doc, &by_keys, NULL), 0);
    CHECK_EQ_INT(by_keys.bad_counts, 0);
    free(doc);
    engine_close(e);
}

typedef struct first_scores {
    int32_t n;
    float *v; /* [n_layer * n_head_kv][n] at the first compression */
} first_scores;

static void on_compress_first(void *ctx, const pot *p, const select_params *sp) {
    first_scores *f = ctx;
    if (f->v) return;
    f->n = p->n;
    f->v = malloc((size_t)p->n_layer * p->n_head_kv * p->n * sizeof *f->v);
    for (int32_t lh = 0; f->v && lh < p->n_layer * p->n_head_kv; lh++)
        memcpy(f->v + (size_t)lh * p->n, sp->scores + (size_t)lh * sp->scores_stride, (size_t)p->n * sizeof *f->v);
}

static int first_compression(engine *e, const engine_pot_settings *s, const char *doc, first_scores *f) {
    return feed_with_hook(e, s, doc, on_compress_first, f) || !f->v ? -1 : 0;
}

/* observe_rows: the attention a compression selects by is the catalyst's rows'
 * (the default's) plus SnapKV's window of the chunk's last 32 rows (policy
 * snapkv's), as both see the same pot at the first compression. */
TEST(observe_rows_add_the_window_to_the_catalyst) {
    engine *e = open_tiny();
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    char *doc = test_lighthouse_doc(1500);
    engine_pot_settings cat = knobs(0, 0, 0), win = knobs(0, 0, 0), both = knobs(0, 0, 0);
    win.policy = "snapkv";
    both.observe_rows = 1;
    first_scores fc = {0}, fw = {0}, fb = {0};
    CHECK_EQ_INT(first_compression(e, &cat, doc, &fc), 0);
    CHECK_EQ_INT(first_compression(e, &win, doc, &fw), 0);
    CHECK_EQ_INT(first_compression(e, &both, doc, &fb), 0);
    CHECK(fc.n == fw.n && fc.n == fb.n && fc.n > 0);
    int bad = 0, window_counts = 0;
    for (size_t i = 0; fc.v && fw.v && fb.v && fc.n == fw.n && fc.n == fb.n &&
                       i < (size_t)info.n_layer * info.n_head_kv * fc.n; i++) {
        bad += fabsf(fb.v[i] - (fc.v[i] + fw.v[i])) > 1e-4f * (1 + fabsf(fb.v[i]));
        window_counts += fw.v[i] > 1e-3f;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(window_counts > 0);
    free(fc.v);
    free(fw.v);
    free(fb.v);
    free(doc);
    engine_close(e);
}

/* whole_words' input: when the default model's tokens are read, each slot's
 * joins says whether its token's text starts with a letter or a digit (it
 * continues the word before it), in every layer and head; the digits of a
 * number after its first join it. */
typedef struct joins_seen {
    int compressions, bad;
    const engine *e;
    const engine_doc *d;   /* read with record_tokens: its tokens by token index */
    int digits_joined;     /* slots holding a digit that joins a digit before it */
} joins_seen;

static void check_joins(void *ctx, const pot *p, const select_params *sp) {
    (void)sp;
    joins_seen *s = ctx;
    s->compressions++;
    size_t n_tokens = 0;
    const int32_t *tokens = engine_doc_tokens(s->d, &n_tokens);
    for (int32_t lh = 0; lh < p->n_layer * p->n_head_kv; lh++)
        for (int32_t j = p->n_pinned; j < p->n; j++) {
            size_t at = (size_t)lh * p->capacity + j;
            int64_t t = p->token_index[at];
            if (t < 0 || (size_t)t >= n_tokens) {
                s->bad++;
                continue;
            }
            char piece[64];
            int len = engine_token_text(s->e, tokens[t], piece, sizeof piece);
            int starts_word = len > 0 && ((unsigned char)piece[0] >= 0x80 || isalnum((unsigned char)piece[0]));
            s->bad += p->joins[at] != starts_word;
            if (lh == 0 && p->joins[at] && len == 1 && isdigit((unsigned char)piece[0])) s->digits_joined++;
        }
}

TEST(joins_mark_the_tokens_that_continue_a_word) {
    engine *e = test_open_default_engine(2);
    CHECK(e != NULL);
    if (!e) return;
    engine_pot_settings set = engine_pot_settings_default();
    set.budget_tokens = 96;
    set.chunk_tokens = 32;
    set.record_tokens = 1;
    set.whole_words = 1;
    const char *doc = "One of the special codes for walnut is 6360112. The harbour of Marrakesh opens at 0530 "
                      "and the lighthouse keeper, Amelia Brennan, writes 24 numbers a day: 90644, 110899, "
                      "243593 and 7 others. The pass key is 353745. Remember it. 353745 is the pass key.";
    char err[512];
    engine_doc *d = engine_doc_open(e, &set, err, sizeof err);
    CHECK(d != NULL);
    joins_seen s = {.e = e, .d = d};
    if (d) {
        engine_doc_on_compress(d, check_joins, &s);
        CHECK_EQ_INT(engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err), 0);
        engine_doc_close(d);
    }
    CHECK(s.compressions > 0);
    CHECK_EQ_INT(s.bad, 0);
    CHECK(s.digits_joined > 0);
    engine_close(e);
}
