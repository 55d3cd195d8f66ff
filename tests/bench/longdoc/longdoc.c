/* Needle-in-a-haystack trials through a memory pot, sharing work between them.
 *
 *   longdoc -m MODEL -t N --haystack FILE --plan FILE --work DIR [pot settings]
 *
 * The plan (written by run.py) has one trial per line, sorted by insertion
 * point:  id <TAB> insert_byte <TAB> end_byte <TAB> key <TAB> needle text.
 * Trial i's document is haystack[0, insert) + needle + haystack[insert, end).
 * Every policy here is question-agnostic or sees the same question for every
 * key, so the pot just before a needle is the same for all trials inserting
 * there: one "main" document reads the haystack once, is saved
 * (engine_doc_save) at each insertion point, and every trial loads that
 * snapshot and reads only its needle and the rest of its document. Output:
 * one JSON object per trial on stdout. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "cache/cache.h"
#include "engine/engine.h"
#include "engine/recall.h"

enum { TRACE_BYTES = 8192 }; /* about 2K tokens of English */

typedef struct trial {
    char id[64];
    long insert, end;
    char key[32];
    char needle[512];
} trial;

typedef struct options {
    const char *model, *haystack, *plan, *work, *question, *backend;
    const char *docs; /* --docs: documents carrying several needles, several questions each */
    const char *pots; /* --docs: a folder keeping each document's pot once read (read_or_load_doc) */
    int threads, n_predict, late_question, trace, winners;
    int attend; /* --attend W (--docs): rank W-token windows by the question's attention instead of answering */
    int recycle_stride, recycle_keep, recycle_pool; /* the answer's decoding (engine_gen_params) */
    long recall_bytes; /* --docs: the question comes with this many bytes of recalled passages */
    int also_without_recall; /* --docs with --recall: each question answered first without the passages */
    recall_order recall_order; /* --recall-order: the passages' layout (document order unless set) */
    engine_pot_settings set;
} options;

static void usage(void) {
    fprintf(stderr,
            "usage: longdoc -m MODEL (--haystack FILE --plan FILE --work DIR | --docs FILE) [-t N] [-n N]\n"
            "  [--backend B]\n"
            "  [--question Q] [--policy P] [--budget N] [--keep N] [--chunk N] [--nuc-share A]\n"
            "  [--catalyst TEXT] [--score-memory 1] [--nuc-regions N] [--reconstruct 1] [--nuc-relative 1]\n"
            "  [--shared-selection 1] [--whole-words 1] [--key-diff 1] [--observe-rows 1]\n"
            "  [--row-max 1] [--score-max 1]\n"
            "  [--pool-width N] [--recycle-stride S --recycle-keep K [--recycle-pool W]]\n"
            "  [--no-catalyst] [--no-reset-positions] [--late-question] [--plain] [--trace]\n"
            "  [--recall BYTES [--recall-order document|best-last] [--also-without-recall]] [--pots DIR]\n"
            "  [--attend W]\n"
            "--trace: on stderr, the needle's kept share after every TRACE_BYTES of the document\n"
            "--winners (--docs): on stderr, at every compression, what became of each needle's entries\n"
            "  (kept by surprisal, by attention score, forced, dropped) and their mean surprisal and\n"
            "  score against the entries each scorer kept and all entries; and (\"budgets\" lines) the share of\n"
            "  its entries the score alone would keep with the budget per head, pooled per layer, or pooled\n"
            "  over the whole pot\n"
            "--docs FILE: JSON lines {id, doc (path), needles [[a, b] byte ranges], questions [..] (\"\":\n"
            "  not asked)}:\n"
            "  each document is read once (once per question for finch with the question up front)\n"
            "  and every question answered over its pot; one JSON line per question\n"
            "--recall BYTES (--docs): each question is asked with the document's passages that share\n"
            "  its words, at most BYTES of them (engine/recall.h), as the server's \"recall\" does;\n"
            "  --also-without-recall: each question is first answered over the same pot without them\n"
            "  (its line has \"without_recall\": true), so both are measured on one read\n"
            "--attend W (--docs): instead of answering, on stderr for each question and needle, the rank of\n"
            "  the needle's W-token window of the document among all windows by the attention the question's\n"
            "  rows give the pot's entries in it (summed; their max; their mean): could the pot's attention\n"
            "  say where to recall from?\n"
            "--pots DIR (--docs): a document's pot is saved in DIR once read and loaded from there the\n"
            "  next time the same model reads it with the same settings (question-agnostic pots only):\n"
            "  asking new questions, or the same ones with other --recall, costs no re-reading\n");
}

static int parse_args(int argc, char **argv, options *o) {
    o->set = engine_pot_settings_default();
    o->recall_order = RECALL_DOCUMENT_ORDER; /* as the bench's first recall rows were measured */
    o->threads = 1;
    o->n_predict = 12;
    o->question = "What is the pass key?";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1; /* consumes v */
        if (!strcmp(a, "-m")) o->model = v;
        else if (!strcmp(a, "-t")) o->threads = v ? atoi(v) : 0;
        else if (!strcmp(a, "-n")) o->n_predict = v ? atoi(v) : 0;
        else if (!strcmp(a, "--backend")) o->backend = v;
        else if (!strcmp(a, "--haystack")) o->haystack = v;
        else if (!strcmp(a, "--plan")) o->plan = v;
        else if (!strcmp(a, "--docs")) o->docs = v;
        else if (!strcmp(a, "--work")) o->work = v;
        else if (!strcmp(a, "--question")) o->question = v;
        else if (!strcmp(a, "--policy")) o->set.policy = v;
        else if (!strcmp(a, "--budget")) o->set.budget_tokens = v ? atoi(v) : 0;
        else if (!strcmp(a, "--keep")) o->set.keep_tokens = v ? atoi(v) : 0;
        else if (!strcmp(a, "--chunk")) o->set.chunk_tokens = v ? atoi(v) : 0;
        else if (!strcmp(a, "--catalyst")) o->set.catalyst = v;
        else if (!strcmp(a, "--nuc-share")) o->set.nuc_share = v ? (float)atof(v) : -1;
        else if (!strcmp(a, "--pool-width")) o->set.pool_width = v ? atoi(v) : -1;
        else if (!strcmp(a, "--score-memory")) o->set.score_memory = v ? atoi(v) : 0;
        else if (!strcmp(a, "--nuc-regions")) o->set.nuc_regions = v ? atoi(v) : 0;
        else if (!strcmp(a, "--reconstruct")) o->set.reconstruct = v ? atoi(v) : 0;
        else if (!strcmp(a, "--nuc-relative")) o->set.nuc_relative = v ? atoi(v) : 0;
        else if (!strcmp(a, "--shared-selection")) o->set.shared_selection = v ? atoi(v) : 0;
        else if (!strcmp(a, "--whole-words")) o->set.whole_words = v ? atoi(v) : 0;
        else if (!strcmp(a, "--key-diff")) o->set.key_diff = v ? atoi(v) : 0;
        else if (!strcmp(a, "--observe-rows")) o->set.observe_rows = v ? atoi(v) : 0;
        else if (!strcmp(a, "--row-max")) o->set.row_max = v ? atoi(v) : 0;
        else if (!strcmp(a, "--score-max")) o->set.score_max = v ? atoi(v) : 0;
        else if (!strcmp(a, "--recycle-stride")) o->recycle_stride = v ? atoi(v) : 0;
        else if (!strcmp(a, "--recycle-keep")) o->recycle_keep = v ? atoi(v) : 0;
        else if (!strcmp(a, "--recycle-pool")) o->recycle_pool = v ? atoi(v) : 0;
        else if (!strcmp(a, "--recall")) o->recall_bytes = v ? atol(v) : 0;
        else if (!strcmp(a, "--pots")) o->pots = v;
        else if (!strcmp(a, "--attend")) {
            o->attend = v ? atoi(v) : 0;
            if (o->attend < 1) return fprintf(stderr, "longdoc: --attend takes a window of 1 or more tokens\n"), -1;
        }
        else if (!strcmp(a, "--recall-order")) {
            int order = recall_order_named(v);
            if (v && order < 0) return fprintf(stderr, "longdoc: --recall-order is document or best-last\n"), -1;
            o->recall_order = (recall_order)order;
        }
        else {
            used = 0;
            if (!strcmp(a, "--no-catalyst")) o->set.no_catalyst = 1;
            else if (!strcmp(a, "--no-reset-positions")) o->set.original_positions = 1;
            else if (!strcmp(a, "--late-question")) o->late_question = 1;
            else if (!strcmp(a, "--plain")) o->set.plain = 1;
            else if (!strcmp(a, "--trace")) o->trace = 1;
            else if (!strcmp(a, "--winners")) o->winners = 1;
            else if (!strcmp(a, "--also-without-recall")) o->also_without_recall = 1;
            else return fprintf(stderr, "longdoc: unknown argument %s\n", a), -1;
        }
        if (used && !v) return fprintf(stderr, "longdoc: %s needs a value\n", a), -1;
        i += used;
    }
    if (!o->model || (!o->docs && (!o->haystack || !o->plan || !o->work))) return usage(), -1;
    /* finch up front is guided by the question; finch-late and the others are not */
    if (!o->late_question) o->set.question = o->question;
    return 0;
}

static char *read_file(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)*len + 1);
    if (b && fread(b, 1, (size_t)*len, f) != (size_t)*len) {
        free(b);
        b = NULL;
    }
    if (b) b[*len] = 0;
    fclose(f);
    return b;
}

static trial *read_plan(const char *path, int *n) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    trial *t = NULL;
    int cap = 0;
    char line[1024];
    *n = 0;
    while (fgets(line, sizeof line, f)) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            trial *nt = realloc(t, (size_t)cap * sizeof *t);
            if (!nt) break;
            t = nt;
        }
        trial *x = &t[*n];
        memset(x, 0, sizeof *x);
        if (sscanf(line, "%63[^\t]\t%ld\t%ld\t%31[^\t]\t%511[^\n]", x->id, &x->insert, &x->end,
                   x->key, x->needle) == 5)
            (*n)++;
    }
    fclose(f);
    return t;
}

/* Share of document tokens [a, b) the pot holds, over every (layer, KV head);
 * per_layer (NULL, or n_layer values) gets each layer's share. */
static double kept_share_layers(const engine_doc *d, const engine_info *in, int64_t a, int64_t b,
                                double *per_layer) {
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    int64_t *idx = malloc((size_t)(st.tokens_in_pot + 1) * sizeof *idx);
    double hit = 0;
    for (int32_t l = 0; l < in->n_layer && idx; l++) {
        double layer_hit = 0;
        for (int32_t h = 0; h < in->n_head_kv; h++) {
            int32_t n = engine_doc_kept(d, l, h, idx, st.tokens_in_pot);
            for (int32_t i = 0; i < n; i++) layer_hit += idx[i] >= a && idx[i] < b;
        }
        hit += layer_hit;
        if (per_layer) per_layer[l] = b > a ? layer_hit / ((double)(b - a) * in->n_head_kv) : 0;
    }
    free(idx);
    return b > a ? hit / ((double)(b - a) * in->n_layer * in->n_head_kv) : 0;
}

static double kept_share(const engine_doc *d, const engine_info *in, int64_t a, int64_t b) {
    return kept_share_layers(d, in, a, b, NULL);
}

typedef struct answer {
    char text[1024];
    size_t len;
} answer;

static int on_text(void *user, const char *text, size_t len, int32_t token, const sample_logprobs *lp) {
    (void)token;
    (void)lp;
    answer *a = user;
    if (a->len + len < sizeof a->text) {
        memcpy(a->text + a->len, text, len);
        a->len += len;
        a->text[a->len] = 0;
    }
    return 0;
}

static double now_ms_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The greedy answer to question over d (the bench's decoding settings). */
static int greedy_answer(engine_doc *d, const options *o, const char *question, answer *ans,
                         engine_gen_result *res, char *err, size_t el) {
    engine_gen_params gp = {.sampling = sample_params_default(), .max_tokens = o->n_predict,
                            .recycle_stride = o->recycle_stride, .recycle_keep = o->recycle_keep,
                            .recycle_pool = o->recycle_pool};
    gp.sampling.temperature = 0;
    engine_gen_result own = {0};
    return engine_doc_answer(d, question, &gp, on_text, ans, res ? res : &own, err, el);
}

/* One trial: from the snapshot at its insertion point, the needle, the rest
 * of the document, the question; prints its JSON line. */
static int run_trial(engine *e, const options *o, const engine_info *info, const char *hay,
                     const trial *t, const char *snap, double t_start_ms, char *err, size_t el) {
    uint64_t off;
    engine_doc *d = engine_doc_load(e, &o->set, snap, &off, err, el);
    if (!d) return -1;
    int rc = -1;
    int64_t a = engine_doc_tokens_pushed(d);
    if (engine_doc_push(d, t->needle, strlen(t->needle), 0, err, el)) goto out;
    int64_t b = engine_doc_tokens_pushed(d);
    while ((rc = engine_doc_step(d, err, el)) > 0) {
    }
    if (rc < 0) goto out;
    /* the rest of the document; with --trace in slices (a pot does not
     * depend on how its document is split), reporting the needle's share */
    const size_t rest = (size_t)(t->end - t->insert), slice = o->trace ? TRACE_BYTES : rest;
    size_t at = 0;
    do { /* once for an empty rest too: the final feed ends the document */
        const size_t n = rest - at < slice ? rest - at : slice;
        if (engine_doc_feed(d, hay + t->insert + at, n, at + n == rest, err, el)) {
            rc = -1;
            goto out;
        }
        at += n;
        if (o->trace)
            fprintf(stderr, "trace %s tokens %lld kept %.3f\n", t->id, (long long)engine_doc_tokens_pushed(d),
                    kept_share(d, info, a, b));
    } while (at < rest);
    answer ans = {{0}, 0};
    if (greedy_answer(d, o, o->question, &ans, NULL, err, el)) goto out;
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    /* run.py scores the answer (exact_match) */
    json_t *j = json_pack("{s:s, s:s, s:s, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:I}",
                          "id", t->id, "key", t->key, "answer", ans.text, "kept", kept_share(d, info, a, b),
                          "needle_a", (json_int_t)a, "needle_b", (json_int_t)b,
                          "tokens_read", (json_int_t)st.tokens_read, "ingest_ms", st.ingest_ms,
                          "compress_ms", st.compress_ms, "wall_ms", now_ms_wall() - t_start_ms,
                          "compressions", (json_int_t)st.compressions,
                          "peak_rss_bytes", (json_int_t)ru.ru_maxrss * 1024);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(j);
    rc = 0;
out:
    engine_doc_close(d);
    return rc;
}

/* Reads the haystack through the main document up to each insertion point,
 * saves it there, and runs the trials inserting at that point. */
static int run_plan(engine *e, const options *o, const char *hay, long hay_len, const trial *t,
                    int n) {
    char err[512], snap[4096];
    engine_info info;
    engine_get_info(e, &info);
    snprintf(snap, sizeof snap, "%s/main.pot", o->work);
    engine_doc *main_doc = engine_doc_open(e, &o->set, err, sizeof err);
    if (!main_doc) return fprintf(stderr, "longdoc: %s\n", err), -1;
    long fed = 0;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        if (t[i].insert < fed || t[i].end > hay_len || t[i].end < t[i].insert) {
            fprintf(stderr, "longdoc: trial %s: plan not sorted or beyond the haystack\n", t[i].id);
            rc = -1;
            break;
        }
        if (i == 0 || t[i].insert != t[i - 1].insert) {
            if (engine_doc_feed(main_doc, hay + fed, (size_t)(t[i].insert - fed), 0, err, sizeof err) ||
                engine_doc_save(main_doc, snap, 0, err, sizeof err)) {
                fprintf(stderr, "longdoc: main document: %s\n", err);
                rc = -1;
                break;
            }
            fed = t[i].insert;
        }
        if (run_trial(e, o, &info, hay, &t[i], snap, now_ms_wall(), err, sizeof err)) {
            fprintf(stderr, "longdoc: trial %s: %s\n", t[i].id, err);
            rc = -1;
        }
    }
    engine_doc_close(main_doc);
    remove(snap);
    return rc;
}

/* ---- --docs: several needles and questions per document ---------------------------- */

enum { MAX_NEEDLES = 32 };

/* Feeds n bytes of a --docs document; with trace, in TRACE_BYTES slices (a
 * pot does not depend on how its document is split), printing after each the
 * kept share per layer of every needle already read (tok[2i] < pushed). */
static int feed_traced(engine_doc *d, const char *text, size_t n, int final, const int64_t *tok,
                       int n_tok, const engine_info *trace, char *err, size_t el) {
    size_t at = 0;
    do {
        size_t m = trace && n - at > TRACE_BYTES ? TRACE_BYTES : n - at;
        if (engine_doc_feed(d, text + at, m, final && at + m == n, err, el)) return -1;
        at += m;
        for (int i = 0; trace && i < n_tok / 2 && trace->n_layer <= 256; i++) {
            double layer[256];
            double all = kept_share_layers(d, trace, tok[2 * i], tok[2 * i + 1], layer);
            fprintf(stderr, "trace tokens %lld needle %d kept %.3f layers",
                    (long long)engine_doc_tokens_pushed(d), i, all);
            for (int32_t l = 0; l < trace->n_layer; l++) fprintf(stderr, " %.2f", layer[l]);
            fprintf(stderr, "\n");
        }
    } while (at < n);
    return 0;
}

/* --winners: the needles whose token ranges are known so far */
typedef struct winners_ctx {
    const int64_t *tok; /* needle i: document tokens [tok[2i], tok[2i+1]) */
    int n_known;
} winners_ctx;

/* Mean of value[] over the (layer, head, slot)s whose why[] passes `want` (-1: all) and whose
 * token lies in [a, b) (a < 0: any token). */
static double mean_where(const pot *p, const select_params *sp, const float *value, int32_t vstride, int want,
                         int64_t a, int64_t b, int64_t *count) {
    double sum = 0;
    *count = 0;
    for (int32_t lh = 0; lh < p->n_layer * p->n_head_kv; lh++)
        for (int32_t s = 0; s < p->n; s++) {
            int64_t t = p->token_index[(size_t)lh * p->capacity + s];
            if ((want >= 0 && sp->why[(size_t)lh * p->n + s] != want) || (a >= 0 && (t < a || t >= b))) continue;
            sum += value[(size_t)lh * vstride + s];
            ++*count;
        }
    return *count ? sum / (double)*count : 0;
}

static int by_value_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The k-th largest of v[0, n): the threshold that keeps k of them (all when
 * k >= n, none when k is 0); sorts v. */
static float kth_largest(float *v, size_t n, size_t k) {
    if (!k) return INFINITY;
    if (k > n) return -INFINITY;
    qsort(v, n, sizeof *v, by_value_desc);
    return v[k - 1];
}

/* Uneven budgets, asked of the scores this compression has (--winners): the
 * k unpinned entries a (layer, head) keeps by score (k = n_keep - pinned, the
 * whole budget to the score, as with nuc_share 0 and no pooling), chosen
 * (0) per (layer, head) as the pot does, (1) per layer, pooled over its heads
 * (AdaKV's allocation: a head whose attention is concentrated gives its
 * slots to one whose attention is spread), (2) over every layer and head (the
 * budget wherever the score is highest: the most uneven split the score itself
 * asks for, a per-layer budget included). thr[] gets each
 * (layer, head)'s threshold under each: [3][n_layer * n_head_kv]. 0, or -1
 * when memory is short. */
static int budget_thresholds(const pot *p, const select_params *sp, float *thr) {
    int32_t L = p->n_layer, H = p->n_head_kv, n0 = p->n_pinned, m = p->n - n0, k = sp->n_keep - n0;
    float *v = malloc((size_t)L * H * (size_t)(m > 0 ? m : 1) * sizeof *v);
    if (!v) return -1;
    for (int32_t l = 0; l < L; l++) {
        for (int32_t h = 0; h < H; h++) {
            memcpy(v, sp->scores + (size_t)(l * H + h) * sp->scores_stride + n0, (size_t)m * sizeof *v);
            thr[l * H + h] = kth_largest(v, (size_t)m, (size_t)k);
        }
        for (int32_t h = 0; h < H; h++)
            memcpy(v + (size_t)h * m, sp->scores + (size_t)(l * H + h) * sp->scores_stride + n0, (size_t)m * sizeof *v);
        float t = kth_largest(v, (size_t)H * m, (size_t)H * k);
        for (int32_t h = 0; h < H; h++) thr[L * H + l * H + h] = t;
    }
    for (int32_t lh = 0; lh < L * H; lh++)
        memcpy(v + (size_t)lh * m, sp->scores + (size_t)lh * sp->scores_stride + n0, (size_t)m * sizeof *v);
    float t = kth_largest(v, (size_t)L * H * m, (size_t)L * H * k);
    for (int32_t lh = 0; lh < L * H; lh++) thr[2 * L * H + lh] = t;
    free(v);
    return 0;
}

/* engine_compress_hook of --winners: one line per needle that has entries in the pot. */
static void print_winners(void *vctx, const pot *p, const select_params *sp) {
    const winners_ctx *c = vctx;
    int64_t cnt, in_pot;
    const float *sc = sp->scores;
    int32_t ss = sp->scores_stride;
    double s_nuc = mean_where(p, sp, p->surprisal, p->capacity, POT_KEPT_NUC, -1, 0, &cnt);
    double s_all = mean_where(p, sp, p->surprisal, p->capacity, -1, -1, 0, &cnt);
    double c_cap = sc ? mean_where(p, sp, sc, ss, POT_KEPT_SCORE, -1, 0, &cnt) : 0;
    double c_all = sc ? mean_where(p, sp, sc, ss, -1, -1, 0, &cnt) : 0;
    int32_t LH = p->n_layer * p->n_head_kv;
    float *thr = sc && sp->n_keep > p->n_pinned ? malloc(3 * (size_t)LH * sizeof *thr) : NULL;
    if (thr && budget_thresholds(p, sp, thr)) {
        free(thr);
        thr = NULL;
    }
    for (int i = 0; i < c->n_known; i++) {
        int64_t a = c->tok[2 * i], b = c->tok[2 * i + 1], by[POT_KEPT_SCORE + 1];
        double s_needle = mean_where(p, sp, p->surprisal, p->capacity, -1, a, b, &in_pot);
        if (!in_pot) continue;
        for (int w = 0; w <= POT_KEPT_SCORE; w++) mean_where(p, sp, p->surprisal, p->capacity, w, a, b, &by[w]);
        double c_needle = sc ? mean_where(p, sp, sc, ss, -1, a, b, &cnt) : 0;
        fprintf(stderr,
                "winners seen %lld needle %d entries %lld nuc %.3f score %.3f fixed %.3f dropped %.3f"
                " surprisal needle %.2f nuc-kept %.2f all %.2f score needle %.4g score-kept %.4g all %.4g\n",
                (long long)p->n_seen, i, (long long)in_pot, (double)by[POT_KEPT_NUC] / in_pot,
                (double)by[POT_KEPT_SCORE] / in_pot, (double)(by[POT_KEPT_PINNED] + by[POT_KEPT_FORCED]) / in_pot,
                (double)by[POT_DROPPED] / in_pot, s_needle, s_nuc, s_all, c_needle, c_cap, c_all);
        if (!thr) continue;
        /* the needle's unpinned entries each allocation would keep by score */
        int64_t kept[3] = {0}, n_needle = 0;
        for (int32_t lh = 0; lh < LH; lh++)
            for (int32_t slot = p->n_pinned; slot < p->n; slot++) {
                int64_t t = p->token_index[(size_t)lh * p->capacity + slot];
                if (t < a || t >= b) continue;
                float v = sc[(size_t)lh * ss + slot];
                n_needle++;
                for (int w = 0; w < 3; w++) kept[w] += v >= thr[w * LH + lh];
            }
        if (n_needle)
            fprintf(stderr, "budgets seen %lld needle %d entries %lld by-score per-head %.3f per-layer %.3f global %.3f\n",
                    (long long)p->n_seen, i, (long long)n_needle, (double)kept[0] / n_needle,
                    (double)kept[1] / n_needle, (double)kept[2] / n_needle);
    }
    free(thr);
}

/* Reads one document of a --docs line through a pot (settings s), feeding the
 * needles' byte ranges as their own pieces to learn their token ranges
 * (tok[2i], tok[2i+1]); the caller closes the document. trace: see
 * feed_traced. */
static engine_doc *read_doc(engine *e, const engine_pot_settings *s, const char *text, size_t len,
                            const long *cuts, int n_needles, int64_t *tok, const engine_info *trace,
                            int winners, char *err, size_t el) {
    engine_doc *d = engine_doc_open(e, s, err, el);
    if (!d) return NULL;
    winners_ctx wc = {tok, 0};
    if (winners) engine_doc_on_compress(d, print_winners, &wc);
    size_t at = 0;
    for (int i = 0; i <= 2 * n_needles; i++) {
        size_t to = i < 2 * n_needles ? (size_t)cuts[i] : len;
        if (to < at || to > len) {
            snprintf(err, el, "needle byte ranges out of order or beyond the document");
            goto fail;
        }
        /* tok[] entries past i are not set yet: trace only the needles read */
        if (feed_traced(d, text + at, to - at, i == 2 * n_needles, tok, i - i % 2, trace, err, el)) goto fail;
        at = to;
        if (i < 2 * n_needles) tok[i] = engine_doc_tokens_pushed(d);
        wc.n_known = (i + 1) / 2;
    }
    engine_doc_on_compress(d, NULL, NULL); /* wc ends here */
    return d;
fail:
    engine_doc_close(d);
    return NULL;
}

/* --pots: the files of a document's pot and of its needles' token ranges,
 * named by its id (':' and '/' as '_') and budget; the pot file's own
 * check (engine_doc_load) refuses another model or other settings. */
static void pot_paths(const options *o, const char *id, char *pot_path, char *tok_path, size_t cap) {
    char name[128];
    size_t i = 0;
    for (; id[i] && i + 1 < sizeof name; i++) name[i] = id[i] == ':' || id[i] == '/' ? '_' : id[i];
    name[i] = 0;
    snprintf(pot_path, cap, "%s/%s.b%d.pot", o->pots, name, o->set.budget_tokens);
    snprintf(tok_path, cap, "%s/%s.b%d.needles", o->pots, name, o->set.budget_tokens);
}

/* The needles' token ranges saved beside a pot: "n_needles doc_bytes" and
 * then tok[]; 0 when they match this document. */
static int load_needle_tokens(const char *path, int n_needles, size_t len, int64_t *tok) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = -1;
    long long bytes = -1, v;
    int ok = fscanf(f, "%d %lld", &n, &bytes) == 2 && n == n_needles && bytes == (long long)len;
    for (int i = 0; ok && i < 2 * n_needles; i++) {
        ok = fscanf(f, "%lld", &v) == 1;
        tok[i] = (int64_t)v;
    }
    fclose(f);
    return ok ? 0 : -1;
}

static void save_needle_tokens(const char *path, int n_needles, size_t len, const int64_t *tok) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "%d %zu\n", n_needles, len);
    for (int i = 0; i < 2 * n_needles; i++) fprintf(f, "%lld\n", (long long)tok[i]);
    if (fclose(f) == 0) rename(tmp, path);
}

/* read_doc, or with --pots the pot saved when this document was last read
 * with these settings (*loaded := 1); a document read is saved there. Pots
 * guided by a question, traced or with --winners are always read. */
static engine_doc *read_or_load_doc(engine *e, const options *o, const engine_pot_settings *s, const char *id,
                                    const char *text, size_t len, const long *cuts, int n_needles, int64_t *tok,
                                    const engine_info *trace, int *loaded, char *err, size_t el) {
    *loaded = 0;
    if (!o->pots || s->question || trace || o->winners)
        return read_doc(e, s, text, len, cuts, n_needles, tok, trace, o->winners, err, el);
    char pot_path[1024], tok_path[1024], why[512];
    pot_paths(o, id, pot_path, tok_path, sizeof pot_path);
    uint64_t offset;
    if (!load_needle_tokens(tok_path, n_needles, len, tok)) {
        engine_doc *d = engine_doc_load(e, s, pot_path, &offset, why, sizeof why);
        if (d) return *loaded = 1, d;
        fprintf(stderr, "longdoc: %s: reading the document again: %s\n", pot_path, why);
    }
    engine_doc *d = read_doc(e, s, text, len, cuts, n_needles, tok, NULL, 0, err, el);
    if (!d) return NULL;
    if (mkdir(o->pots, 0755) && errno != EEXIST)
        fprintf(stderr, "longdoc: cannot make %s: %s\n", o->pots, strerror(errno));
    else if (engine_doc_save(d, pot_path, 0, why, sizeof why))
        fprintf(stderr, "longdoc: cannot save %s: %s\n", pot_path, why);
    else
        save_needle_tokens(tok_path, n_needles, len, tok);
    return d;
}

/* Answers question qi over d (with recall_bytes > 0, after the passages of
 * text that share its words) and prints its JSON line. */
static int answer_question(engine_doc *d, const options *o, const engine_info *info, const char *id,
                           int qi, const char *question, long recall_bytes, const char *text, size_t len,
                           const int64_t *tok, int n_needles, int pot_loaded, double t_start_ms, char *err,
                           size_t el) {
    answer ans = {{0}, 0};
    engine_gen_result res = {0};
    recall_result rr = {0};
    char *asked = NULL;
    if (recall_bytes > 0) {
        if (recall_passages(text, len, question, (size_t)recall_bytes, o->recall_order, &rr) ||
            !(asked = recall_question(&rr, question))) {
            recall_result_free(&rr);
            return snprintf(err, el, "out of memory recalling passages"), -1;
        }
    }
    int failed = greedy_answer(d, o, asked ? asked : question, &ans, &res, err, el);
    free(asked);
    if (failed) {
        recall_result_free(&rr);
        return -1;
    }
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    json_t *kept = json_array(), *layers = json_array();
    double *per_layer = malloc((size_t)info->n_layer * sizeof *per_layer);
    for (int i = 0; i < n_needles && per_layer; i++) {
        json_array_append_new(kept, json_real(kept_share_layers(d, info, tok[2 * i], tok[2 * i + 1], per_layer)));
        json_t *row = json_array();
        for (int32_t l = 0; l < info->n_layer; l++) json_array_append_new(row, json_real(per_layer[l]));
        json_array_append_new(layers, row);
    }
    free(per_layer);
    json_t *j = json_pack("{s:s, s:i, s:s, s:o, s:o, s:I, s:f, s:f, s:f, s:I, s:I, s:f}", "id", id, "q", qi,
                          "answer", ans.text, "kept", kept, "kept_layers", layers,
                          "tokens_read", (json_int_t)st.tokens_read, "ingest_ms", st.ingest_ms,
                          "compress_ms", st.compress_ms, "wall_ms", now_ms_wall() - t_start_ms,
                          "compressions", (json_int_t)st.compressions,
                          "peak_rss_bytes", (json_int_t)ru.ru_maxrss * 1024, "answer_ms",
                          res.prefill_ms + res.decode_ms);
    if (j && pot_loaded) json_object_set_new(j, "pot_loaded", json_true()); /* ingest fields: from its first reading */
    /* an answer stopped by -n rather than by the model: a miss may be a right answer cut short */
    if (j) json_object_set_new(j, "answer_cut", json_boolean(res.finish == ENGINE_FINISH_LENGTH));
    if (j && recall_bytes == 0 && o->recall_bytes > 0) json_object_set_new(j, "without_recall", json_true());
    if (j && recall_bytes > 0) {
        json_object_set_new(j, "recall_passages", json_integer(rr.passages));
        json_object_set_new(j, "recall_bytes", json_integer((json_int_t)rr.len));
        json_object_set_new(j, "prompt_tokens", json_integer((json_int_t)res.n_prompt));
    }
    recall_result_free(&rr);
    char *out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (out) printf("%s\n", out);
    fflush(stdout);
    free(out);
    json_decref(j);
    return 0;
}

/* The rank (0 = first) of window w among n by value v[] (ties: the earlier window first). */
static int window_rank(const double *v, int n, int w) {
    int r = 0;
    for (int i = 0; i < n; i++) r += v[i] > v[w] || (v[i] == v[w] && i < w);
    return r;
}

/* --attend: "attend ID qQI windows N needle I sum R max R mean R" per needle on stderr, the
 * needle's best window by each measure (its first window holding one of its tokens that ranks best). */
static int print_attention(engine_doc *d, const options *o, const engine_info *info, const char *id, int qi,
                           const char *question, const int64_t *tok, int n_needles, char *err, size_t el) {
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    int32_t cap = st.budget_tokens + 4096, n = 0; /* the pot, and the pending tail (less than a chunk) */
    size_t lh = (size_t)info->n_layer * info->n_head_kv;
    int nw = (int)(st.tokens_read / o->attend) + 1;
    float *score = malloc(lh * cap * sizeof *score);
    int64_t *pos = malloc(lh * cap * sizeof *pos);
    double *sum = calloc((size_t)nw, sizeof *sum), *max = calloc((size_t)nw, sizeof *max);
    double *mean = calloc((size_t)nw, sizeof *mean), *count = calloc((size_t)nw, sizeof *count);
    int rc = !score || !pos || !sum || !max || !mean || !count ? (snprintf(err, el, "out of memory"), -1)
             : engine_doc_question_attention(d, question, cap, score, pos, &n, err, el);
    for (size_t k = 0; !rc && k < lh; k++)
        for (int32_t j = 0; j < n; j++) {
            int64_t t = pos[k * cap + j];
            if (t < 0 || t / o->attend >= nw) continue; /* the pinned prefix */
            int w = (int)(t / o->attend);
            double v = score[k * cap + j];
            sum[w] += v;
            count[w] += 1;
            if (v > max[w]) max[w] = v;
        }
    for (int w = 0; !rc && w < nw; w++) mean[w] = count[w] ? sum[w] / count[w] : 0;
    for (int i = 0; !rc && i < n_needles; i++) {
        int best[3] = {nw, nw, nw};
        for (int64_t w = tok[2 * i] / o->attend; w <= (tok[2 * i + 1] - 1) / o->attend && w < nw; w++) {
            int r[3] = {window_rank(sum, nw, (int)w), window_rank(max, nw, (int)w), window_rank(mean, nw, (int)w)};
            for (int k = 0; k < 3; k++) best[k] = r[k] < best[k] ? r[k] : best[k];
        }
        fprintf(stderr, "attend %s q%d windows %d needle %d sum %d max %d mean %d\n", id, qi, nw, i, best[0], best[1],
                best[2]);
    }
    free(score);
    free(pos);
    free(sum);
    free(max);
    free(mean);
    free(count);
    return rc;
}

/* One --docs line: the document read once, or once per question when the
 * policy is guided by the question (finch with the question up front). */
static int run_doc_line(engine *e, const options *o, const engine_info *info, json_t *line, char *err,
                        size_t el) {
    const char *id = json_string_value(json_object_get(line, "id"));
    const char *path = json_string_value(json_object_get(line, "doc"));
    json_t *needles = json_object_get(line, "needles"), *questions = json_object_get(line, "questions");
    int n_needles = (int)json_array_size(needles), n_q = (int)json_array_size(questions);
    if (!id || !path || n_q == 0 || n_needles > MAX_NEEDLES)
        return snprintf(err, el, "a --docs line needs id, doc, questions and at most %d needles", MAX_NEEDLES), -1;
    long cuts[2 * MAX_NEEDLES];
    for (int i = 0; i < n_needles; i++)
        for (int k = 0; k < 2; k++)
            cuts[2 * i + k] = (long)json_integer_value(json_array_get(json_array_get(needles, (size_t)i), (size_t)k));
    long len = 0;
    char *text = read_file(path, &len);
    if (!text) return snprintf(err, el, "cannot read %s: %s", path, strerror(errno)), -1;
    int guided = o->set.policy && !strcmp(o->set.policy, "finch") && !o->late_question;
    int rc = 0, loaded = 0;
    engine_doc *d = NULL;
    int64_t tok[2 * MAX_NEEDLES];
    for (int qi = 0; qi < n_q && !rc; qi++) {
        const char *q = json_string_value(json_array_get(questions, (size_t)qi));
        if (!q || !*q) continue; /* not asked this run */
        double t0 = now_ms_wall();
        if (!d || guided) {
            engine_pot_settings s = o->set;
            s.question = guided ? q : NULL;
            engine_doc_close(d);
            d = read_or_load_doc(e, o, &s, id, text, (size_t)len, cuts, n_needles, tok, o->trace ? info : NULL,
                                 &loaded, err, el);
            if (!d) rc = -1;
        }
        if (!rc && o->attend > 0) rc = print_attention(d, o, info, id, qi, q, tok, n_needles, err, el);
        else if (!rc) {
            if (o->also_without_recall && o->recall_bytes > 0)
                rc = answer_question(d, o, info, id, qi, q, 0, text, (size_t)len, tok, n_needles, loaded, t0, err, el);
            if (!rc)
                rc = answer_question(d, o, info, id, qi, q, o->recall_bytes, text, (size_t)len, tok, n_needles,
                                     loaded, t0, err, el);
        }
    }
    engine_doc_close(d);
    free(text);
    return rc;
}

static int run_docs(engine *e, const options *o) {
    char err[512];
    engine_info info;
    engine_get_info(e, &info);
    FILE *f = fopen(o->docs, "r");
    if (!f) return fprintf(stderr, "longdoc: cannot read %s: %s\n", o->docs, strerror(errno)), -1;
    char line[65536];
    int rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) {
            fprintf(stderr, "longdoc: %s: %s\n", o->docs, je.text);
            rc = -1;
            break;
        }
        if (run_doc_line(e, o, &info, j, err, sizeof err)) {
            fprintf(stderr, "longdoc: %s: %s\n", json_string_value(json_object_get(j, "id")), err);
            rc = -1;
        }
        json_decref(j);
    }
    fclose(f);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    if (parse_args(argc, argv, &o)) return 2;
    if (o.docs) {
        char err[512];
        engine_options eo = {.n_threads = o.threads, .backend = o.backend};
        engine *e = engine_open(o.model, &eo, err, sizeof err);
        if (!e) return fprintf(stderr, "longdoc: %s\n", err), 1;
        int rc = run_docs(e, &o);
        engine_close(e);
        return rc ? 1 : 0;
    }
    long hay_len = 0;
    char *hay = read_file(o.haystack, &hay_len);
    int n = 0;
    trial *t = read_plan(o.plan, &n);
    if (!hay || !t) {
        fprintf(stderr, "longdoc: cannot read %s: %s\n", !hay ? o.haystack : o.plan, strerror(errno));
        return 1;
    }
    char err[512];
    engine_options eo = {.n_threads = o.threads, .backend = o.backend};
    engine *e = engine_open(o.model, &eo, err, sizeof err);
    if (!e) return fprintf(stderr, "longdoc: %s\n", err), 1;
    int rc = run_plan(e, &o, hay, hay_len, t, n);
    engine_close(e);
    free(hay);
    free(t);
    return rc ? 1 : 0;
}
