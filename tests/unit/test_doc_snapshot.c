/* Durable document snapshots (engine_doc_save / engine_doc_load):
 * - the streaming tokenizer saved at any byte (inside a UTF-8 sequence, inside
 *   a word) and resumed from what it held back gives the ids of the whole text,
 *   for byte-level BPE (SmolLM2) and SentencePiece (the SPM fixture);
 * - every policy with both schedules, on the tiny fixture model (f32 entries)
 *   and on the real default model (f16 entries, GQA), plus chat mode with a
 *   pinned system prompt and two-stage FINCH: a document saved at several cuts
 *   (inside a word, inside a multi-byte character, right after a compression;
 *   on the tiny model and in chat mode also with tokens pushed but not yet run
 *   and after the end), loaded into a new document and fed the rest ends with
 *   the stats, the kept entries of every (layer, head), the recorded tokens and
 *   the answer logits of the document that never stopped, bit for bit;
 * - an in-memory copy (engine_doc_copy) taken at each of those cuts, while
 *   the original reads on, ends the same way when fed the rest;
 * - a missing, truncated or damaged file, another model, another KV type,
 *   other settings, a future format and a bare pot snapshot are refused with
 *   one line, a failed save leaves the old file, a failed document is not saved. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "common/common.h"
#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "test.h"
#include "test_model.h"

/* ---- the tokenizer: held-back bytes resume exactly ------------------------------- */

static tokenizer *load_tokenizer(const char *path) {
    char err[256];
    gguf_file *f = path ? gguf_open(path, err, sizeof err) : NULL;
    if (!f) {
        fprintf(stderr, "  cannot open %s: %s\n", path ? path : "(model missing)", path ? err : "");
        return NULL;
    }
    tokenizer *t = tokenizer_load(f, err, sizeof err);
    if (!t) fprintf(stderr, "  tokenizer_load(%s): %s\n", path, err);
    gguf_close(f);
    return t;
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Feeds s[0, cut) to a stream in random pieces, saves what it holds back,
 * resumes a new stream from that and feeds it the rest in random pieces: 1
 * when the ids of both streams are those of the whole text. */
static int resume_matches(const tokenizer *t, const char *s, size_t n, size_t cut, int ps,
                          const int32_t *want, size_t n_want, uint64_t *rng) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tok_stream *a = tok_stream_new(t, 0, ps);
    int ok = a != NULL;
    for (size_t off = 0; ok && off < cut;) {
        size_t k = 1 + rng_next(rng) % 9;
        if (k > cut - off) k = cut - off;
        ok = tok_stream_feed(a, s + off, k, 0, &ids, &n_ids) == 0;
        off += k;
    }
    tok_resume at;
    size_t n_held = ok ? tok_stream_held(a, NULL, 0, &at) : 0;
    char *held = malloc(n_held + 1);
    ok = ok && held && tok_stream_held(a, held, n_held, &at) == n_held;
    tok_stream_free(a);
    tok_stream *b = ok ? tok_stream_resume(t, 0, ps, &at) : NULL;
    ok = ok && b && tok_stream_feed(b, held, n_held, 0, &ids, &n_ids) == 0;
    for (size_t off = cut; ok && off < n;) {
        size_t k = 1 + rng_next(rng) % 9;
        if (k > n - off) k = n - off;
        ok = tok_stream_feed(b, s + off, k, 0, &ids, &n_ids) == 0;
        off += k;
    }
    ok = ok && tok_stream_feed(b, "", 0, 1, &ids, &n_ids) == 0;
    ok = ok && n_ids == n_want && (!n_ids || memcmp(ids, want, n_ids * sizeof *ids) == 0);
    tok_stream_free(b);
    free(held);
    free(ids);
    return ok;
}

/* Every case of a reference token file, cut at every byte, plain and with
 * special tokens parsed. Returns the failures. */
static int check_resume_suite(const tokenizer *t, const char *json_path, const char *label) {
    json_error_t je;
    json_t *doc = json_load_file(json_path, JSON_ALLOW_NUL, &je);
    if (!doc) {
        fprintf(stderr, "  %s: %s\n", json_path, je.text);
        return 1;
    }
    json_t *cases = json_object_get(doc, "cases");
    uint64_t rng = 99;
    int bad = 0, checked = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *text = json_object_get(json_array_get(cases, i), "text");
        const char *s = json_string_value(text);
        size_t n = json_string_length(text);
        for (int ps = 0; ps < 2 && s; ps++) {
            int64_t n_want = tokenizer_encode(t, s, n, 0, ps, NULL, 0);
            if (n_want < 0) continue; /* invalid UTF-8 cases */
            int32_t *want = malloc((size_t)(n_want + 1) * sizeof *want);
            tokenizer_encode(t, s, n, 0, ps, want, n_want);
            for (size_t cut = 0; cut <= n; cut++, checked++)
                if (!resume_matches(t, s, n, cut, ps, want, (size_t)n_want, &rng) && bad++ < 5)
                    fprintf(stderr, "  %s: case %zu cut at byte %zu (parse_special %d) differs\n",
                            label, i, cut, ps);
            free(want);
        }
    }
    if (getenv("VERBOSE")) fprintf(stderr, "  %s: %d cuts resumed\n", label, checked);
    json_decref(doc);
    return bad + (checked < 1000);
}

TEST(doc_snapshot_tokenizer_resumes_from_held_bytes) {
    tokenizer *bpe = load_tokenizer(test_model_path());
    tokenizer *spm = load_tokenizer(test_fixture("spm_vocab.gguf"));
    CHECK(bpe != NULL && spm != NULL);
    if (bpe) CHECK_EQ_INT(check_resume_suite(bpe, "tests/fixtures/ref_tokens.json", "SmolLM2"), 0);
    if (spm) CHECK_EQ_INT(check_resume_suite(spm, "tests/fixtures/ref_tokens_spm.json", "SPM"), 0);
    /* the held bytes are the unsettled tail: the last word and a cut-short character */
    if (bpe) {
        tok_stream *s = tok_stream_new(bpe, 0, 0);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        char held[64];
        tok_resume at;
        CHECK_EQ_INT(tok_stream_feed(s, "Hello wor", 9, 0, &ids, &n_ids), 0);
        size_t n = tok_stream_held(s, held, sizeof held, &at);
        CHECK(n == 4 && memcmp(held, " wor", 4) == 0);
        CHECK_EQ_INT(tok_stream_feed(s, "ld caf\xc3", 7, 0, &ids, &n_ids), 0);
        n = tok_stream_held(s, held, sizeof held, &at);
        CHECK(n == 5 && memcmp(held, " caf\xc3", 5) == 0);
        CHECK_EQ_INT(tok_stream_held(s, NULL, 0, NULL), 5);
        tok_stream_free(s);
        free(ids);
    }
    tokenizer_free(bpe);
    tokenizer_free(spm);
}

/* Runs of one class longer than TOK_RUN_CUT are cut (engine/tokenizer.h): a
 * stream saved in the middle of one, or just before or after a cut, resumes
 * to the ids of the whole text. */
TEST(doc_snapshot_tokenizer_resumes_inside_long_runs) {
    tokenizer *tks[2] = {load_tokenizer(test_model_path()), load_tokenizer(test_fixture("spm_vocab.gguf"))};
    size_t cap = 8 * TOK_RUN_CUT + 64, n = 0;
    char *s = malloc(cap);
    const struct { char c; size_t len; } runs[] = {{'w', 5}, {' ', 1}, {'a', 2 * TOK_RUN_CUT + 7}, {' ', 1},
                                                   {'7', TOK_RUN_CUT + 3}, {'\n', 2}, {' ', TOK_RUN_CUT + 1},
                                                   {'x', 3}, {'!', TOK_RUN_CUT}, {'b', 2}};
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++)
        for (size_t k = 0; k < runs[i].len && n < cap; k++) s[n++] = runs[i].c;
    uint64_t rng = 5;
    for (int v = 0; v < 2; v++) {
        CHECK(tks[v] != NULL);
        if (!tks[v]) continue;
        int64_t n_want = tokenizer_encode(tks[v], s, n, 0, 0, NULL, 0);
        int32_t *want = malloc((size_t)n_want * sizeof *want);
        tokenizer_encode(tks[v], s, n, 0, 0, want, n_want);
        int bad = 0;
        for (size_t cut = 0; cut <= n; cut += cut % 4096 < 20 || cut % 4096 > 4076 ? 1 : 509)
            bad += !resume_matches(tks[v], s, n, cut, 0, want, (size_t)n_want, &rng);
        CHECK_EQ_INT(bad, 0);
        free(want);
        tokenizer_free(tks[v]);
    }
    free(s);
}

/* ---- documents ------------------------------------------------------------------------ */

/* About 1.3 KB with 2-, 3- and 4-byte characters (for the tiny model: ~1100
 * byte-level tokens). The first cuts come from markers both documents share:
 * inside "compass", then inside the ship emoji after it (check_restores). */
static const char long_doc[] =
    "The lighthouse keeper of \xc3\x86r\xc3\xb8sk\xc3\xb8" "bing counted the ships that passed "
    "each night. In M\xc3\xa4rz there were seventeen, in April twenty-two, and in May the fog "
    "\xe2\x80\x94 \xe2\x80\x9e" "dichter Nebel\xe2\x80\x9c \xe2\x80\x94 kept every vessel in port. "
    "The keeper's daughter, who was nine, wrote the numbers on the wall in chalk: 17, 22, 0. "
    "\xe7\x81\xaf\xe5\x8f\xb0\xe5\xae\x88\xe3\x81\xae\xe5\xa8\x98\xe3\x81\xaf\xe6\x95\xb0\xe5"
    "\xad\x97\xe3\x82\x92\xe5\xa3\x81\xe3\x81\xab\xe6\x9b\xb8\xe3\x81\x84\xe3\x81\x9f\xe3\x80"
    "\x82 When the inspector came in June he asked why the wall was covered in numbers, and she "
    "said that the sea was a library and the ships were its books. He wrote that down too, "
    "na\xc3\xafvely, in his caf\xc3\xa9 notebook (price: 2,50 \xe2\x82\xac). The next winter "
    "the harbour froze for eleven days; the daughter counted gulls instead, 340 of them, and "
    "the keeper said that gulls were footnotes. In spring the ferry from Svendborg returned, "
    "then the fishing boats, then a white schooner nobody had seen before, flying a flag with "
    "a green anchor. It stayed for three nights. On the third night the daughter rowed out to "
    "it with her chalk and wrote the number 1 on its hull, because, she explained later, it "
    "was the first book of a new shelf. The captain laughed, gave her a brass compass "
    "\xf0\x9f\x9a\xa2, and sailed at dawn. The inspector returned in August and found the wall "
    "repainted white, with a single line in blue: 17, 22, 0, 1. He asked what the last number "
    "meant. \xe2\x80\x9c" "A schooner,\xe2\x80\x9d she said, \xe2\x80\x9cthat came to be read.\xe2"
    "\x80\x9d He closed his notebook and did not write that down.";

/* The same story in 326 bytes (99 tokens of the real model). */
static const char short_doc[] =
    "In May the fog \xe2\x80\x94 \xe2\x80\x9e" "dichter Nebel\xe2\x80\x9c \xe2\x80\x94 kept every "
    "ship in port. The keeper's daughter wrote 17, 22, 0 on the wall. \xe7\x81\xaf\xe5\x8f\xb0"
    "\xe5\xae\x88\xe3\x81\xae\xe5\xa8\x98. A white schooner came; she rowed out and wrote 1 on "
    "its hull. The captain laughed, gave her a brass compass \xf0\x9f\x9a\xa2 and sailed at dawn; "
    "the inspector found the wall repainted, one line in blue.";

static const char question[] = "What is on the hull?";

typedef struct doc_result {
    engine_doc_stats st;
    int64_t *kept;   /* [n_layer * n_head_kv][budget] */
    float *logits;   /* [n_vocab] */
    int32_t *tokens; /* the recorded tokens */
    size_t n_tokens;
} doc_result;

static void result_free(doc_result *r) {
    free(r->kept);
    free(r->logits);
    free(r->tokens);
    memset(r, 0, sizeof *r);
}

/* Answers the question and collects what the comparison looks at; 0 or -1. */
static int finish(engine *e, engine_doc *d, doc_result *r) {
    engine_info info;
    engine_get_info(e, &info);
    char err[512];
    engine_doc_get_stats(d, &r->st);
    size_t n_lh = (size_t)info.n_layer * info.n_head_kv, cap = (size_t)r->st.budget_tokens;
    r->kept = calloc(n_lh * cap, sizeof *r->kept);
    r->logits = malloc((size_t)info.n_vocab * sizeof *r->logits);
    if (!r->kept || !r->logits) return -1;
    if (engine_doc_answer_logits(d, question, r->logits, err, sizeof err)) {
        fprintf(stderr, "  answer: %s\n", err);
        return -1;
    }
    for (int32_t l = 0; l < info.n_layer; l++)
        for (int32_t h = 0; h < info.n_head_kv; h++)
            engine_doc_kept(d, l, h, r->kept + ((size_t)l * info.n_head_kv + h) * cap, (int32_t)cap);
    size_t n;
    const int32_t *t = engine_doc_tokens(d, &n);
    r->n_tokens = t ? n : 0;
    r->tokens = malloc((n ? n : 1) * sizeof *r->tokens);
    if (!r->tokens) return -1;
    if (t) memcpy(r->tokens, t, n * sizeof *t);
    return 0;
}

/* 1 when b ended exactly as a did (timings aside). */
static int results_equal(const engine *e, const doc_result *a, const doc_result *b,
                         const char *label) {
    engine_info info;
    engine_get_info(e, &info);
    const engine_doc_stats *x = &a->st, *y = &b->st;
    const char *what = NULL;
    if (x->bytes_read != y->bytes_read || x->tokens_read != y->tokens_read ||
        x->tokens_in_pot != y->tokens_in_pot || x->pinned_tokens != y->pinned_tokens ||
        x->budget_tokens != y->budget_tokens || x->keep_tokens != y->keep_tokens ||
        x->compressions != y->compressions || x->chunks != y->chunks || x->pot_bytes != y->pot_bytes)
        what = "stats";
    else if (memcmp(a->kept, b->kept, (size_t)info.n_layer * info.n_head_kv * x->budget_tokens *
                                          sizeof *a->kept))
        what = "kept entries";
    else if (a->n_tokens != b->n_tokens ||
             memcmp(a->tokens, b->tokens, a->n_tokens * sizeof *a->tokens))
        what = "recorded tokens";
    else if (memcmp(a->logits, b->logits, (size_t)info.n_vocab * sizeof *a->logits))
        what = "answer logits";
    if (what)
        fprintf(stderr, "  %s: %s differ (tokens %lld/%lld, compressions %lld/%lld)\n", label,
                what, (long long)x->tokens_read, (long long)y->tokens_read,
                (long long)x->compressions, (long long)y->compressions);
    return what == NULL;
}

/* Feeds doc[from, to) in pieces of `piece` bytes; final with the last byte of the document. */
static int feed_range(engine_doc *d, const char *doc, size_t from, size_t to, size_t piece) {
    char err[512];
    size_t len = strlen(doc);
    while (from < to) {
        size_t n = to - from < piece ? to - from : piece;
        if (engine_doc_feed(d, doc + from, n, from + n == len, err, sizeof err)) {
            fprintf(stderr, "  feed: %s\n", err);
            return -1;
        }
        from += n;
    }
    return 0;
}

enum { MAX_CUTS = 6 };

typedef struct cut {
    size_t offset;  /* bytes fed before the save */
    const char *why;
    engine_doc *copy; /* engine_doc_copy at the same point */
} cut;

/* Offset in doc of the byte `into` bytes into marker; 0 when it is absent. */
static size_t at(const char *doc, const char *marker, size_t into) {
    const char *p = strstr(doc, marker);
    return p ? (size_t)(p - doc) + into : 0;
}

/* Saves d (opened with set) at the current offset into dir/cutN, copies it,
 * and records the cut. */
static int save_cut(engine_doc *d, const engine_pot_settings *set, const char *dir, cut *cuts, int *n_cuts,
                    size_t offset, const char *why) {
    char err[512], path[600];
    snprintf(path, sizeof path, "%s/cut%d.pds", dir, *n_cuts);
    if (engine_doc_save(d, path, 1000 + offset, err, sizeof err)) {
        fprintf(stderr, "  save %s: %s\n", why, err);
        return -1;
    }
    engine_doc *copy = engine_doc_copy(d, set, err, sizeof err);
    if (!copy) {
        fprintf(stderr, "  copy %s: %s\n", why, err);
        return -1;
    }
    cuts[(*n_cuts)++] = (cut){offset, why, copy};
    return 0;
}

/* Feeds r (restored at cut c) the rest of doc and compares its end with want. */
static void check_rest(engine *e, engine_doc *r, const char *doc, const cut *c, const doc_result *want,
                       const char *what) {
    doc_result got = {0};
    size_t len = strlen(doc);
    int frc = c->offset < len ? feed_range(r, doc, c->offset, len, 200) : 0;
    CHECK(frc == 0 && finish(e, r, &got) == 0);
    CHECK(results_equal(e, want, &got, what));
    result_free(&got);
}

/* Runs every chunk d's queue can fill. */
static int run_ready(engine_doc *d) {
    char err[512];
    int rc;
    while ((rc = engine_doc_step(d, err, sizeof err)) > 0) {
    }
    if (rc) fprintf(stderr, "  step: %s\n", err);
    return rc;
}

/* Feeds doc to a document with settings set, saving at the cuts: inside
 * "compass", inside the ship emoji after it, right after the next compression
 * and, with all_cuts, with half the rest pushed but not run and after the end.
 * Then restores every save into a new document, feeds it the rest and
 * compares the end with the uninterrupted one. */
static void check_restores(engine *e, const engine_pot_settings *set, const char *doc,
                           int all_cuts, const char *label) {
    char err[512];
    char *dir = test_make_tempdir("potserve_docsnap_");
    engine_doc *d = dir ? engine_doc_open(e, set, err, sizeof err) : NULL;
    CHECK(d != NULL);
    if (!d) {
        fprintf(stderr, "  %s: %s\n", label, err);
        free(dir);
        return;
    }
    size_t len = strlen(doc), mid_word = at(doc, "compass", 3);
    size_t in_char = at(doc, "\xf0\x9f\x9a\xa2", 2);
    CHECK(mid_word && in_char && mid_word < in_char && in_char + 20 < len);
    cut cuts[MAX_CUTS];
    int n_cuts = 0;
    int ok = !feed_range(d, doc, 0, mid_word, 97) &&
             !save_cut(d, set, dir, cuts, &n_cuts, mid_word, "inside a word") &&
             !feed_range(d, doc, mid_word, in_char, 101) &&
             !save_cut(d, set, dir, cuts, &n_cuts, in_char, "inside a character");
    /* right after the next compression (a plain cut where there is none) */
    engine_doc_stats st0, st;
    engine_doc_get_stats(d, &st0);
    size_t off = in_char;
    do {
        ok = ok && !feed_range(d, doc, off, off + 3, 3);
        off += 3;
        engine_doc_get_stats(d, &st);
    } while (ok && st.compressions == st0.compressions && off + 3 + 8 < len);
    int compressed = st.compressions > st0.compressions;
    ok = ok && !save_cut(d, set, dir, cuts, &n_cuts, off, compressed ? "after a compression" : "plain cut");
    if (all_cuts) { /* tokens pushed, no chunk run yet */
        size_t to = off + (len - off) / 2;
        if (ok && engine_doc_push(d, doc + off, to - off, 0, err, sizeof err))
            ok = 0, fprintf(stderr, "  push: %s\n", err);
        ok = ok && !save_cut(d, set, dir, cuts, &n_cuts, to, "pushed, not run") && !run_ready(d);
        off = to;
    }
    ok = ok && !feed_range(d, doc, off, len, 89);
    if (all_cuts) ok = ok && !save_cut(d, set, dir, cuts, &n_cuts, len, "after the end");
    CHECK(ok);
    doc_result want = {0};
    CHECK(finish(e, d, &want) == 0);
    engine_doc_close(d);
    if (getenv("VERBOSE"))
        fprintf(stderr, "  %s: %lld tokens, %lld compressions; cuts at %zu, %zu, %zu (%s)\n",
                label, (long long)want.st.tokens_read, (long long)want.st.compressions,
                cuts[0].offset, cuts[1].offset, cuts[2].offset, cuts[2].why);
    if (set->policy && strcmp(set->policy, "none")) {
        CHECK(want.st.compressions >= 3);
        CHECK(compressed);
    }
    for (int i = 0; ok && i < n_cuts; i++) {
        char path[600], what[160];
        snprintf(path, sizeof path, "%s/cut%d.pds", dir, i);
        snprintf(what, sizeof what, "%s, %s (byte %zu)", label, cuts[i].why, cuts[i].offset);
        uint64_t log_offset = 0;
        engine_doc *r = engine_doc_load(e, set, path, &log_offset, err, sizeof err);
        CHECK(r != NULL);
        if (!r) {
            fprintf(stderr, "  %s: load: %s\n", what, err);
            continue;
        }
        CHECK_EQ_INT(log_offset, 1000 + cuts[i].offset);
        check_rest(e, r, doc, &cuts[i], &want, what);
        engine_doc_close(r);
        snprintf(what, sizeof what, "%s, copied %s (byte %zu)", label, cuts[i].why, cuts[i].offset);
        check_rest(e, cuts[i].copy, doc, &cuts[i], &want, what);
    }
    for (int i = 0; i < n_cuts; i++) engine_doc_close(cuts[i].copy);
    result_free(&want);
    test_remove_dir(dir);
}

/* A small pot, plain text, every token recorded. */
static engine_pot_settings small_settings(const char *policy, const char *schedule,
                                          int32_t budget, int32_t keep, int32_t chunk) {
    engine_pot_settings s = engine_pot_settings_default();
    s.policy = policy;
    s.schedule = schedule;
    s.budget_tokens = budget;
    s.keep_tokens = keep;
    s.chunk_tokens = chunk;
    s.plain = 1;
    s.record_tokens = 1;
    s.catalyst = "Key facts."; /* scoring rows are run with every compressing chunk: keep them short */
    if (!strcmp(policy, "finch")) s.question = question;
    return s;
}

static const char *const all_policies[] = {"infinipot", "finch", "snapkv", "streaming",
                                           "h2o", "truncate", "cascade"};
enum { N_POLICIES = sizeof all_policies / sizeof *all_policies };
static const char *const schedules[] = {"fixed", "imdc"};

/* Sanitizer builds (TEST_SANITIZED): the tiny model's matrix stands in for the
 * real model's, which runs one configuration of it and skips the chat test. */

/* Chat mode: a pinned system prompt and two-stage FINCH (no question up
 * front: CaP while reading, the question's attention at answer time), heads
 * combined by max. */
static engine_pot_settings chat_settings(int32_t budget, int32_t keep) {
    engine_pot_settings s = small_settings("finch", "fixed", budget, keep, 16);
    s.question = NULL;
    s.plain = 0;
    s.system = "Answer from the document.";
    s.score_max = 1;
    return s;
}

/* The tiny fixture model (f32 entries): every compressing policy and schedule,
 * a 64-entry pot over ~1100 tokens, and the chat settings. */
TEST(doc_snapshot_restores_every_policy_tiny) {
    char err[512];
    engine_options opt = {.n_threads = 2, .exact = 1, .kv_f32 = 1};
    engine *e = engine_open(test_fixture("tiny_llama.gguf"), &opt, err, sizeof err);
    CHECK(e != NULL);
    if (!e) return;
    for (int p = 0; p < N_POLICIES; p++)
        for (int s = 0; s < 2; s++) {
            engine_pot_settings set = small_settings(all_policies[p], schedules[s], 64, 32, 16);
            char label[64];
            snprintf(label, sizeof label, "tiny %s/%s", all_policies[p], schedules[s]);
            check_restores(e, &set, long_doc, 1, label);
        }
    engine_pot_settings set = chat_settings(192, 128);
    check_restores(e, &set, long_doc, 1, "tiny finch two-stage/chat");
    engine_close(e);
}

/* tiny_gemma3 (window 4: five of its six layers keep rings, written as
 * zeros where overwritten and restored into rings): saved at every cut and
 * restored, the end equals the uninterrupted document's, for two policies
 * and both schedules. */
TEST(doc_snapshot_restores_sliding_window_rings) {
    char err[512];
    engine_options opt = {.n_threads = 2, .exact = 1, .kv_f32 = 1};
    engine *e = engine_open(test_fixture("tiny_gemma3.gguf"), &opt, err, sizeof err);
    CHECK(e != NULL);
    if (!e) return;
    const char *policies[] = {"infinipot", "h2o"};
    for (int p = 0; p < 2; p++)
        for (int s = 0; s < 2; s++) {
            engine_pot_settings set = small_settings(policies[p], schedules[s], 64, 32, 16);
            char label[64];
            snprintf(label, sizeof label, "gemma3 %s/%s", policies[p], schedules[s]);
            check_restores(e, &set, long_doc, 1, label);
        }
    engine_close(e);
}

/* The real model (f16 entries, GQA, byte-level BPE): every policy and
 * schedule, a 40-entry pot over ~100 tokens; none with a pot it fits. */
TEST(doc_snapshot_restores_every_policy_default_model) {
    engine *e = test_open_default_engine(2);
    CHECK(e != NULL);
    if (!e) return;
    for (int p = 0; p <= N_POLICIES; p++)
        for (int s = 0; s < 2; s++) {
            if (TEST_SANITIZED && (p || s)) continue;
            const char *policy = p < N_POLICIES ? all_policies[p] : "none";
            /* imdc's chunks shrink to chunk - keep/2 once the memory is full: 8 here */
            engine_pot_settings set = p < N_POLICIES ? small_settings(policy, schedules[s], 40, 16, 16)
                                                     : small_settings(policy, schedules[s], 160, 150, 16);
            char label[64];
            snprintf(label, sizeof label, "%s/%s", policy, schedules[s]);
            check_restores(e, &set, short_doc, 0, label);
        }
    engine_close(e);
}

/* The chat settings on the real model, whose template pins ~30 tokens. */
TEST(doc_snapshot_restores_chat_two_stage_finch) {
    if (TEST_SANITIZED) {
        test_skip("the default model is too slow under the sanitizers");
        return;
    }
    engine *e = test_open_default_engine(2);
    CHECK(e != NULL);
    if (!e) return;
    engine_pot_settings set = chat_settings(64, 48);
    check_restores(e, &set, short_doc, 1, "finch two-stage/chat");
    engine_close(e);
}

/* ---- refusals ----------------------------------------------------------------------- */

/* Rewrites the checksum at the end of a snapshot's n bytes after an edit. */
static void reseal(unsigned char *b, long n) {
    uint32_t crc = crc32c(0, b, (size_t)n - 4);
    for (int i = 0; i < 4; i++) b[n - 4 + i] = (unsigned char)(crc >> (8 * i));
}

/* Loads path expecting a refusal whose message names `why`. */
static void expect_refused(engine *e, const engine_pot_settings *s, const char *path,
                           const char *why) {
    char err[512] = "";
    uint64_t off = 77;
    engine_doc *d = engine_doc_load(e, s, path, &off, err, sizeof err);
    CHECK(d == NULL && off == 77 && strchr(err, '\n') == NULL);
    if (!strstr(err, why)) {
        test_failures++;
        fprintf(stderr, "  expected '%s' in '%s'\n", why, err);
    }
    engine_doc_close(d);
}

TEST(doc_snapshot_refuses_bad_files) {
    engine *e = test_open_default_engine(2);
    CHECK(e != NULL);
    if (!e) return;
    char err[512], path[600], bad[600];
    char *dir = test_make_tempdir("potserve_docsnap_");
    engine_pot_settings set = small_settings("h2o", "fixed", 16, 8, 4);
    engine_doc *d = dir ? engine_doc_open(e, &set, err, sizeof err) : NULL;
    CHECK(d != NULL);
    if (!d) {
        free(dir);
        engine_close(e);
        return;
    }
    snprintf(path, sizeof path, "%s/doc.pds", dir);
    snprintf(bad, sizeof bad, "%s/bad.pds", dir);
    /* a short document stopped inside a word, so every section of the state is in use */
    CHECK_EQ_INT(engine_doc_feed(d, long_doc, 203, 0, err, sizeof err), 0);
    CHECK_EQ_INT(engine_doc_save(d, path, 5, err, sizeof err), 0);
    uint64_t off = 0;
    engine_doc *r = engine_doc_load(e, &set, path, &off, err, sizeof err);
    CHECK(r != NULL && off == 5);
    engine_doc_close(r);

    /* missing */
    expect_refused(e, &set, bad, "No such file");
    /* every truncation (sampled) and a byte flipped anywhere (sampled) */
    long len = 0;
    unsigned char *b = test_slurp(path, &len);
    CHECK(b != NULL && len > 1000);
    /* every byte up to the end of the document state, then every 4099th of the pot */
    long dense = 0;
    if (b) {
        uint64_t extra_len = 0;
        for (int i = 0; i < 8; i++) extra_len |= (uint64_t)b[64 + i] << (8 * i);
        dense = 72 + (long)(b[60] | b[61] << 8) + (long)extra_len + 64;
        CHECK(extra_len > 100 && dense < len);
    }
    for (long k = 0; b && k < len; k += k < dense ? 1 : 4099) {
        CHECK_EQ_INT(test_spit(bad, b, k), 0);
        expect_refused(e, &set, bad, "truncated");
    }
    int flips = 0;
    for (long i = 0; b && i < len; i += i < dense ? 1 : 4099, flips++) {
        b[i] ^= 0x20;
        CHECK_EQ_INT(test_spit(bad, b, len), 0);
        char e2[512] = "";
        uint64_t o = 0;
        engine_doc *x = engine_doc_load(e, &set, bad, &o, e2, sizeof e2);
        if (x || !e2[0]) {
            test_failures++;
            fprintf(stderr, "  flip at byte %ld was accepted\n", i);
        }
        engine_doc_close(x);
        b[i] ^= 0x20;
    }
    CHECK(flips > dense);
    /* a future snapshot format */
    if (b) {
        b[8] = 4;
        CHECK_EQ_INT(test_spit(bad, b, len), 0);
        expect_refused(e, &set, bad, "version 4 is newer");
        b[8] = 3;
    }
    /* other settings: each one that matters is named */
    engine_pot_settings other = set;
    other.policy = "snapkv";
    expect_refused(e, &other, path, "policy=h2o, now policy=snapkv");
    other = set;
    other.schedule = "imdc";
    expect_refused(e, &other, path, "schedule=fixed, now schedule=imdc");
    other = set;
    other.keep_tokens = 6;
    expect_refused(e, &other, path, "keep=8, now keep=6");
    other = set;
    other.catalyst = "Something else.";
    expect_refused(e, &other, path, "rows=");
    other = set;
    other.nuc_share = 0.25f;
    expect_refused(e, &other, path, "nuc_share");
    other = set;
    other.pool_width = 3;
    expect_refused(e, &other, path, "pool=3");
    other = set;
    other.score_max = 1;
    expect_refused(e, &other, path, "score_max=0, now score_max=1");
    other = set;
    other.system = "Be brief."; /* ignored when plain, but a different setting */
    expect_refused(e, &other, path, "system=-, now system=9:");
    /* record_tokens is not a setting that changes the pot: off loads, on needs recorded tokens */
    other = set;
    other.record_tokens = 0;
    r = engine_doc_load(e, &other, path, &off, err, sizeof err);
    CHECK(r != NULL);
    if (r) {
        CHECK(engine_doc_save(r, bad, 6, err, sizeof err) == 0);
        expect_refused(e, &set, bad, "record_tokens");
    }
    engine_doc_close(r);
    if (b) {
        size_t settings_len = (size_t)b[60] | (size_t)b[61] << 8, at_extra = 72 + settings_len;
        uint64_t extra_len = 0;
        for (int i = 0; i < 8; i++) extra_len |= (uint64_t)b[64 + i] << (8 * i);
        /* another model's fingerprint, in a file that is otherwise intact */
        b[12] ^= 1;
        reseal(b, len);
        CHECK_EQ_INT(test_spit(bad, b, len), 0);
        expect_refused(e, &set, bad, "another model");
        b[12] ^= 1;
        /* a document state of a future version */
        b[at_extra + 4] = 3;
        reseal(b, len);
        CHECK_EQ_INT(test_spit(bad, b, len), 0);
        expect_refused(e, &set, bad, "document state format version 3");
        b[at_extra + 4] = 2;
        /* a pot snapshot with no document state (what pot_snapshot_write alone writes):
           extra_len := 0 and the extra bytes cut out */
        memmove(b + at_extra, b + at_extra + extra_len, (size_t)len - at_extra - extra_len);
        long n = len - (long)extra_len;
        memset(b + 64, 0, 8);
        reseal(b, n);
        CHECK_EQ_INT(test_spit(bad, b, n), 0);
        expect_refused(e, &set, bad, "no document state");
    }
    free(b);
    /* a failed save leaves the old file as it was; a failed document is not saved */
    long before = test_file_size(path);
    snprintf(bad, sizeof bad, "%s/no/such/dir/doc.pds", dir);
    CHECK_EQ_INT(engine_doc_save(d, bad, 9, err, sizeof err), -1);
    CHECK(test_file_size(path) == before);
    CHECK_EQ_INT(engine_doc_feed(d, "\xff", 1, 0, err, sizeof err), -1);
    CHECK_EQ_INT(engine_doc_save(d, path, 9, err, sizeof err), -1);
    CHECK(strstr(err, "failed") != NULL && test_file_size(path) == before);
    r = engine_doc_load(e, &set, path, &off, err, sizeof err);
    CHECK(r != NULL && off == 5);
    engine_doc_close(r);
    engine_doc_close(d);
    test_remove_dir(dir);
    engine_close(e);
}

/* A kv_f32 engine refuses a snapshot of f16 entries (same model, same settings),
 * and a pot of another shape is refused as such. */
TEST(doc_snapshot_refuses_other_kv_type) {
    engine *e = test_open_default_engine(2);
    const char *mp = test_model_path();
    engine_options opt = {.n_threads = 2, .kv_f32 = 1};
    char err[512], path[600];
    engine *f = mp ? engine_open(mp, &opt, err, sizeof err) : NULL;
    CHECK(e != NULL && f != NULL);
    char *dir = test_make_tempdir("potserve_docsnap_");
    CHECK(dir != NULL);
    snprintf(path, sizeof path, "%s/doc.pds", dir ? dir : "/nonexistent");
    engine_pot_settings set = small_settings("streaming", "fixed", 32, 16, 8);
    engine_doc *d = e && dir ? engine_doc_open(e, &set, err, sizeof err) : NULL;
    CHECK(d != NULL);
    if (d && f) {
        CHECK_EQ_INT(engine_doc_feed(d, long_doc, 100, 0, err, sizeof err), 0);
        CHECK_EQ_INT(engine_doc_save(d, path, 1, err, sizeof err), 0);
        expect_refused(f, &set, path, "f16 entries");
        /* the same file with a pot of one layer less (same model, settings, state):
           refused for its shape, not its entry type */
        pot_snapshot_meta meta;
        void *extra = NULL;
        size_t extra_len = 0;
        pot *p = pot_snapshot_read_extra(path, 0, &meta, &extra, &extra_len, err, sizeof err);
        pot *q = p ? pot_new(p->n_layer - 1, p->n_head_kv, p->head_dim, p->capacity, p->dtype, err,
                             sizeof err)
                   : NULL;
        CHECK(q != NULL && extra != NULL);
        if (q) {
            q->n = p->n, q->n_seen = p->n_seen, q->n_pinned = p->n_pinned;
            CHECK_EQ_INT(pot_snapshot_write_extra(path, q, &meta, extra, extra_len, err, sizeof err), 0);
            expect_refused(e, &set, path, "its pot has 29 layers x 3 KV heads x head size 64, the model 30");
        }
        pot_free(p);
        pot_free(q);
        free(extra);
    }
    engine_doc_close(d);
    test_remove_dir(dir);
    engine_close(e);
    engine_close(f);
}

/* The settings key names NuC's span (pot_nuc_lead) when infinipot pools, so a
 * pot saved while NuC's spans were centred ("pool=15" alone) is refused by
 * this build rather than continued under other spans; unpooled pots keep the
 * key they always had. */
TEST(doc_snapshot_names_nuc_span) {
    engine *e = test_open_default_engine(2);
    char err[512], path[600];
    char *dir = test_make_tempdir("potserve_docsnap_");
    CHECK(e != NULL && dir != NULL);
    const int32_t widths[2] = {0, 1};
    const char *want[2] = {" pool=15 nuc_lead=3 ", NULL};
    for (int i = 0; e && dir && i < 2; i++) {
        snprintf(path, sizeof path, "%s/doc%d.pds", dir, i);
        engine_pot_settings set = small_settings("infinipot", "fixed", 32, 16, 8);
        set.pool_width = widths[i];
        engine_doc *d = engine_doc_open(e, &set, err, sizeof err);
        CHECK(d != NULL);
        if (!d) break;
        CHECK_EQ_INT(engine_doc_feed(d, long_doc, 100, 0, err, sizeof err), 0);
        CHECK_EQ_INT(engine_doc_save(d, path, 1, err, sizeof err), 0);
        engine_doc_close(d);
        long len = 0;
        unsigned char *b = test_slurp(path, &len);
        CHECK(b != NULL);
        int has_lead = b && memmem(b, (size_t)len, "nuc_lead=", 9) != NULL;
        CHECK_EQ_INT(has_lead, want[i] != NULL);
        if (b && want[i]) CHECK(memmem(b, (size_t)len, want[i], strlen(want[i])) != NULL);
        free(b);
    }
    test_remove_dir(dir);
    engine_close(e);
}
