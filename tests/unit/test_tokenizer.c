/* Tokenizer tests: ids equal to llama.cpp's (tests/fixtures/ref_tokens*.json,
 * recorded by tests/reference/record_tokens.py), streaming over random splits,
 * detokenization, and rejection of broken metadata / invalid UTF-8. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "test.h"

/* ------------------------------------------------------------------------- */
/* a minimal GGUF writer for hand-built images                               */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    uint64_t nkv;
} gw;

static void gw_put(gw *w, const void *d, size_t n) {
    if (w->n + n > w->cap) {
        size_t nc = w->cap ? w->cap : 4096;
        while (nc < w->n + n) nc *= 2;
        w->p = realloc(w->p, nc);
        w->cap = nc;
    }
    memcpy(w->p + w->n, d, n);
    w->n += n;
}
static void gw_u32v(gw *w, uint32_t v) { gw_put(w, &v, 4); }
static void gw_u64v(gw *w, uint64_t v) { gw_put(w, &v, 8); }
static void gw_strv(gw *w, const char *s, size_t n) {
    gw_u64v(w, n);
    gw_put(w, s, n);
}
static void gw_init(gw *w) {
    memset(w, 0, sizeof *w);
    gw_put(w, "GGUF", 4);
    gw_u32v(w, 3);
    gw_u64v(w, 0); /* tensors */
    gw_u64v(w, 0); /* kv count, patched */
}
static void gw_key(gw *w, const char *key, uint32_t type) {
    gw_strv(w, key, strlen(key));
    gw_u32v(w, type);
    w->nkv++;
}
static void gw_str(gw *w, const char *key, const char *val) {
    gw_key(w, key, GGUF_STRING);
    gw_strv(w, val, strlen(val));
}
static void gw_u32(gw *w, const char *key, uint32_t v) {
    gw_key(w, key, GGUF_UINT32);
    gw_u32v(w, v);
}
static void gw_bool(gw *w, const char *key, int v) {
    gw_key(w, key, GGUF_BOOL);
    unsigned char b = (unsigned char)v;
    gw_put(w, &b, 1);
}
static void gw_arr_strs(gw *w, const char *key, const char *const *s, size_t n) {
    gw_key(w, key, GGUF_ARRAY);
    gw_u32v(w, GGUF_STRING);
    gw_u64v(w, n);
    for (size_t i = 0; i < n; i++) gw_strv(w, s[i], strlen(s[i]));
}
static void gw_arr_gstr(gw *w, const char *key, const gguf_kv *kv) {
    gw_key(w, key, GGUF_ARRAY);
    gw_u32v(w, GGUF_STRING);
    gw_u64v(w, kv->arr_n);
    for (uint64_t i = 0; i < kv->arr_n; i++) gw_strv(w, kv->arr_str[i].ptr, kv->arr_str[i].len);
}
static void gw_arr_i32(gw *w, const char *key, const int32_t *v, size_t n) {
    gw_key(w, key, GGUF_ARRAY);
    gw_u32v(w, GGUF_INT32);
    gw_u64v(w, n);
    gw_put(w, v, n * 4);
}
static void gw_arr_f32(gw *w, const char *key, const float *v, size_t n) {
    gw_key(w, key, GGUF_ARRAY);
    gw_u32v(w, GGUF_FLOAT32);
    gw_u64v(w, n);
    gw_put(w, v, n * 4);
}
static gguf_file *gw_parse(gw *w) {
    memcpy(w->p + 16, &w->nkv, 8);
    char err[256];
    gguf_file *f = gguf_parse(w->p, w->n, err, sizeof err);
    if (!f) fprintf(stderr, "  gguf_parse: %s\n", err);
    return f;
}

/* ------------------------------------------------------------------------- */
/* helpers                                                                   */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static tokenizer *load_path(const char *path) {
    char err[256];
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) {
        fprintf(stderr, "  cannot open %s: %s\n", path, err);
        return NULL;
    }
    tokenizer *t = tokenizer_load(f, err, sizeof err);
    if (!t) fprintf(stderr, "  tokenizer_load(%s): %s\n", path, err);
    gguf_close(f);
    return t;
}

static int64_t encode(const tokenizer *t, const char *s, size_t n, int add_special, int parse_special,
                      int32_t **ids) {
    int64_t cap = (int64_t)n + 8;
    *ids = malloc((size_t)cap * sizeof **ids);
    int64_t k = tokenizer_encode(t, s, n, add_special, parse_special, *ids, cap);
    if (k > cap) {
        *ids = realloc(*ids, (size_t)k * sizeof **ids);
        k = tokenizer_encode(t, s, n, add_special, parse_special, *ids, k);
    }
    return k;
}

static int ids_equal_json(const int32_t *ids, int64_t n, json_t *arr) {
    if (!json_is_array(arr) || (int64_t)json_array_size(arr) != n) return 0;
    for (int64_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(arr, (size_t)i)) != ids[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, int64_t n) {
    fprintf(stderr, "    %s:", what);
    for (int64_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    if (n > 40) fprintf(stderr, " ...");
    fprintf(stderr, "\n");
}

static void print_json_ids(const char *what, json_t *arr) {
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < json_array_size(arr) && i < 40; i++)
        fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(arr, i)));
    fprintf(stderr, "\n");
}

static json_t *load_json(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j) fprintf(stderr, "  %s: %s (line %d)\n", path, je.text, je.line);
    return j;
}

static void text_of(json_t *s, const char **p, size_t *n) {
    *p = json_string_value(s);
    *n = json_string_length(s);
}

/* Compares every case (plain and special, without and with add_special). */
static int check_cases(const tokenizer *t, json_t *doc, const char *label) {
    int bad = 0, total = 0;
    const char *lists[2] = {"cases", "bos_cases"};
    for (int li = 0; li < 2; li++) {
        json_t *cases = json_object_get(doc, lists[li]);
        for (size_t i = 0; i < json_array_size(cases); i++) {
            json_t *c = json_array_get(cases, i);
            const char *s;
            size_t n;
            text_of(json_object_get(c, "text"), &s, &n);
            for (int ps = 0; ps < 2; ps++) {
                json_t *want = json_object_get(c, ps ? "special" : "plain");
                int32_t *ids;
                int64_t k = encode(t, s, n, li == 1, ps, &ids);
                total++;
                if (!ids_equal_json(ids, k, want)) {
                    if (bad < 8) {
                        fprintf(stderr, "  %s %s[%zu] parse_special=%d mismatch for \"%.*s\"\n",
                                label, lists[li], i, ps, (int)(n > 80 ? 80 : n), s);
                        print_ids("ours", ids, k);
                        print_json_ids("llama.cpp", want);
                    }
                    bad++;
                }
                free(ids);
            }
        }
    }
    fprintf(stderr, "  %s: %d/%d tokenizations match llama.cpp\n", label, total - bad, total);
    return bad;
}

static uint64_t fnv_piece(uint64_t h, const char *p, int n) {
    unsigned char len[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16),
                            (unsigned char)(n >> 24)};
    for (int i = 0; i < 4; i++) h = (h ^ len[i]) * 0x100000001b3ULL;
    for (int i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    return h;
}

static void check_vocab_facts(const tokenizer *t, json_t *doc) {
    CHECK_EQ_INT(tokenizer_n_vocab(t), json_integer_value(json_object_get(doc, "n_vocab")));
    CHECK_EQ_INT(tokenizer_bos(t), json_integer_value(json_object_get(doc, "bos")));
    CHECK_EQ_INT(tokenizer_eos(t), json_integer_value(json_object_get(doc, "eos")));
    json_t *eog = json_object_get(doc, "eog");
    int n_eog = 0;
    for (int32_t i = 0; i < tokenizer_n_vocab(t); i++) n_eog += tokenizer_is_eog(t, i);
    CHECK_EQ_INT(n_eog, json_array_size(eog));
    for (size_t i = 0; i < json_array_size(eog); i++)
        CHECK(tokenizer_is_eog(t, (int32_t)json_integer_value(json_array_get(eog, i))));
    char buf[1024];
    for (int sp = 0; sp < 2; sp++) {
        uint64_t h = 0xcbf29ce484222325ULL;
        for (int32_t i = 0; i < tokenizer_n_vocab(t); i++) {
            int n = tokenizer_piece(t, i, sp, buf, sizeof buf);
            CHECK(n >= 0 && n <= (int)sizeof buf);
            h = fnv_piece(h, buf, n);
        }
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
        CHECK_STR(hex, json_string_value(json_object_get(doc, sp ? "piece_hash_special" : "piece_hash_plain")));
    }
    json_t *pieces = json_object_get(doc, "pieces");
    for (size_t i = 0; i < json_array_size(pieces); i++) {
        json_t *e = json_array_get(pieces, i);
        int32_t id = (int32_t)json_integer_value(json_array_get(e, 0));
        for (int sp = 0; sp < 2; sp++) {
            int n = tokenizer_piece(t, id, sp, buf, sizeof buf);
            char hex[2100];
            for (int k = 0; k < n && k < 1024; k++) snprintf(hex + 2 * k, 3, "%02x", (unsigned char)buf[k]);
            hex[n > 0 ? 2 * n : 0] = 0;
            CHECK_STR(hex, json_string_value(json_array_get(e, sp ? 1 : 2)));
        }
    }
    CHECK_EQ_INT(tokenizer_piece(t, -1, 1, buf, sizeof buf), -1);
    CHECK_EQ_INT(tokenizer_piece(t, tokenizer_n_vocab(t), 1, buf, sizeof buf), -1);
}

/* ------------------------------------------------------------------------- */
/* llama.cpp reference                                                       */

TEST(tokenizer_matches_llama_cpp_default_model) {
    const char *mp = test_model_path();
    CHECK(mp != NULL);
    if (!mp) return;
    tokenizer *t = load_path(mp);
    json_t *doc = load_json("tests/fixtures/ref_tokens.json");
    CHECK(t && doc);
    if (t && doc) {
        CHECK_STR(tokenizer_model_name(t), "gpt2");
        CHECK_EQ_INT(check_cases(t, doc, "SmolLM2"), 0);
        check_vocab_facts(t, doc);
        CHECK_EQ_INT(tokenizer_find(t, "<|im_end|>", 10), 2);
        CHECK_EQ_INT(tokenizer_find(t, "<|im_start|>", 12), 1);
        CHECK_EQ_INT(tokenizer_find(t, "no such token!", 14), -1);
        CHECK(tokenizer_is_eog(t, 2));
        CHECK(!tokenizer_is_eog(t, 1));
        CHECK(!tokenizer_is_eog(t, -1));
    }
    json_decref(doc);
    tokenizer_free(t);
}

TEST(tokenizer_matches_llama_cpp_spm_vocab) {
    tokenizer *t = load_path(test_fixture("spm_vocab.gguf"));
    json_t *doc = load_json("tests/fixtures/ref_tokens_spm.json");
    CHECK(t && doc);
    if (t && doc) {
        CHECK_STR(tokenizer_model_name(t), "llama");
        CHECK_EQ_INT(check_cases(t, doc, "SPM vocab"), 0);
        check_vocab_facts(t, doc);
    }
    json_decref(doc);
    tokenizer_free(t);
}

/* The default model's vocabulary and merges under another tokenizer.ggml.pre. */
static tokenizer *load_variant(const gguf_file *m, const char *pre) {
    gw w;
    gw_init(&w);
    gw_str(&w, "general.architecture", "llama");
    gw_str(&w, "tokenizer.ggml.model", "gpt2");
    gw_str(&w, "tokenizer.ggml.pre", pre);
    gw_arr_gstr(&w, "tokenizer.ggml.tokens", gguf_find(m, "tokenizer.ggml.tokens"));
    const gguf_kv *tt = gguf_find(m, "tokenizer.ggml.token_type");
    gw_arr_i32(&w, "tokenizer.ggml.token_type", (const int32_t *)tt->arr_data, tt->arr_n);
    gw_arr_gstr(&w, "tokenizer.ggml.merges", gguf_find(m, "tokenizer.ggml.merges"));
    gw_u32(&w, "tokenizer.ggml.bos_token_id", 1);
    gw_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    gw_u32(&w, "tokenizer.ggml.unknown_token_id", 0);
    gw_u32(&w, "tokenizer.ggml.padding_token_id", 2);
    gw_bool(&w, "tokenizer.ggml.add_bos_token", 0);
    gw_bool(&w, "tokenizer.ggml.add_space_prefix", 0);
    gguf_file *f = gw_parse(&w);
    char err[256] = "";
    tokenizer *t = f ? tokenizer_load(f, err, sizeof err) : NULL;
    if (f && !t) fprintf(stderr, "  variant %s: %s\n", pre, err);
    gguf_close(f);
    free(w.p);
    return t;
}

TEST(tokenizer_matches_llama_cpp_pre_variants) {
    const char *mp = test_model_path();
    CHECK(mp != NULL);
    if (!mp) return;
    char err[256];
    gguf_file *m = gguf_open(mp, err, sizeof err);
    json_t *doc = load_json("tests/fixtures/ref_tokens_pre.json");
    CHECK(m && doc);
    if (m && doc) {
        json_t *texts = json_object_get(doc, "texts");
        json_t *vars = json_object_get(doc, "variants");
        const char *pre;
        json_t *want_all;
        json_object_foreach(vars, pre, want_all) {
            tokenizer *t = load_variant(m, pre);
            CHECK(t != NULL);
            if (!t) continue;
            int bad = 0;
            for (size_t i = 0; i < json_array_size(texts); i++) {
                const char *s;
                size_t n;
                text_of(json_array_get(texts, i), &s, &n);
                int32_t *ids;
                int64_t k = encode(t, s, n, 0, 1, &ids);
                json_t *want = json_array_get(want_all, i);
                if (!ids_equal_json(ids, k, want)) {
                    if (bad < 3) {
                        fprintf(stderr, "  pre=%s mismatch for \"%.*s\"\n", pre, (int)(n > 80 ? 80 : n), s);
                        print_ids("ours", ids, k);
                        print_json_ids("llama.cpp", want);
                    }
                    bad++;
                }
                free(ids);
            }
            if (bad || getenv("VERBOSE"))
                fprintf(stderr, "  pre=%s: %zu/%zu strings match llama.cpp\n", pre,
                        json_array_size(texts) - (size_t)bad, json_array_size(texts));
            CHECK_EQ_INT(bad, 0);
            tokenizer_free(t);
        }
    }
    json_decref(doc);
    gguf_close(m);
}

/* ------------------------------------------------------------------------- */
/* streaming                                                                 */

static const char *const EXTRA_STREAM[] = {
    "     \n\n\t\t   \r\n    x   y",
    "1234567890123456789 0.5 1e10 ١٢٣",
    "日本語のテキスト 中文文本 한국어",
    "😀😃😄😁 👨‍👩‍👧‍👦 🏳️‍🌈",
    "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|<|im_start|>><|im_end<|im_end|>|>",
    "a<s>b</s>c<|user|>d<mask>e",
    "it's   don't  we'll\n\n'll",
    "caf\u00e9 cafe\u0301 \u00a0\u3000x",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "the of the people the of the people of the",
};

static int stream_once(const tokenizer *t, const char *s, size_t n, int add_special, int ps,
                       const size_t *cuts, size_t ncuts, int32_t **ids, size_t *nids) {
    tok_stream *st = tok_stream_new(t, add_special, ps);
    if (!st) return -1;
    *ids = NULL;
    *nids = 0;
    size_t prev = 0;
    int rc = 0;
    for (size_t k = 0; k <= ncuts && rc == 0; k++) {
        size_t end = k < ncuts ? cuts[k] : n;
        rc = tok_stream_feed(st, s + prev, end - prev, k == ncuts, ids, nids);
        prev = end;
    }
    tok_stream_free(st);
    return rc;
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Random splits (and byte-by-byte) of s give the ids of the whole text. */
static int check_splits(const tokenizer *t, const char *s, size_t n, uint64_t *rng, int rounds) {
    int bad = 0;
    for (int ps = 0; ps < 2; ps++) {
        for (int as = 0; as < 2; as++) {
            int32_t *want;
            int64_t wn = encode(t, s, n, as, ps, &want);
            size_t *cuts = malloc((n + 1) * sizeof *cuts);
            for (int r = 0; r < rounds + 1; r++) {
                size_t nc = 0;
                if (r == rounds) { /* one byte at a time */
                    for (size_t i = 1; i < n; i++) cuts[nc++] = i;
                } else {
                    size_t want_cuts = n ? rng_next(rng) % (n < 12 ? n + 1 : 12) : 0;
                    for (size_t i = 0; i < want_cuts; i++) cuts[nc++] = rng_next(rng) % (n + 1);
                    qsort(cuts, nc, sizeof *cuts, cmp_size);
                }
                int32_t *got;
                size_t gn;
                int rc = stream_once(t, s, n, as, ps, cuts, nc, &got, &gn);
                int same = rc == 0 && (int64_t)gn == wn && (gn == 0 || memcmp(got, want, gn * sizeof *got) == 0);
                if (!same) {
                    if (bad < 3) {
                        fprintf(stderr, "  split mismatch (parse_special=%d add_special=%d) for \"%.*s\" cuts:",
                                ps, as, (int)(n > 80 ? 80 : n), s);
                        for (size_t i = 0; i < nc && i < 20; i++) fprintf(stderr, " %zu", cuts[i]);
                        fprintf(stderr, "\n");
                        print_ids("whole", want, wn);
                        print_ids("stream", got, (int64_t)gn);
                    }
                    bad++;
                }
                free(got);
            }
            free(cuts);
            free(want);
        }
    }
    return bad;
}

static void split_suite(const tokenizer *t, const char *fixture, const char *label) {
    json_t *doc = load_json(fixture);
    CHECK(doc != NULL);
    if (!doc) return;
    uint64_t rng = 42;
    int bad = 0, total = 0;
    json_t *cases = json_object_get(doc, "cases");
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const char *s;
        size_t n;
        text_of(json_object_get(json_array_get(cases, i), "text"), &s, &n);
        bad += check_splits(t, s, n, &rng, 6);
        total++;
    }
    for (size_t i = 0; i < sizeof EXTRA_STREAM / sizeof EXTRA_STREAM[0]; i++) {
        bad += check_splits(t, EXTRA_STREAM[i], strlen(EXTRA_STREAM[i]), &rng, 40);
        total++;
    }
    if (bad || getenv("VERBOSE"))
        fprintf(stderr, "  %s: %d split failures over %d strings\n", label, bad, total);
    CHECK_EQ_INT(bad, 0);
    json_decref(doc);
}

TEST(tokenizer_stream_splits_default_model) {
    const char *mp = test_model_path();
    CHECK(mp != NULL);
    if (!mp) return;
    tokenizer *t = load_path(mp);
    CHECK(t != NULL);
    if (t) split_suite(t, "tests/fixtures/ref_tokens.json", "SmolLM2");
    tokenizer_free(t);
}

TEST(tokenizer_stream_splits_spm_vocab) {
    tokenizer *t = load_path(test_fixture("spm_vocab.gguf"));
    CHECK(t != NULL);
    if (t) split_suite(t, "tests/fixtures/ref_tokens_spm.json", "SPM vocab");
    tokenizer_free(t);
}

TEST(tokenizer_stream_splits_pre_variants) {
    const char *mp = test_model_path();
    CHECK(mp != NULL);
    if (!mp) return;
    char err[256];
    gguf_file *m = gguf_open(mp, err, sizeof err);
    CHECK(m != NULL);
    if (!m) return;
    static const char *const pres[] = {"llama-bpe", "qwen2", "default", "deepseek-llm", "falcon",
                                       "gpt-4o", "tekken", "poro-chat"};
    json_t *doc = load_json("tests/fixtures/ref_tokens.json");
    for (size_t p = 0; p < sizeof pres / sizeof pres[0] && doc; p++) {
        tokenizer *t = load_variant(m, pres[p]);
        CHECK(t != NULL);
        if (!t) continue;
        uint64_t rng = 7 + p;
        int bad = 0;
        json_t *cases = json_object_get(doc, "cases");
        for (size_t i = 0; i < json_array_size(cases); i += 2) {
            const char *s;
            size_t n;
            text_of(json_object_get(json_array_get(cases, i), "text"), &s, &n);
            bad += check_splits(t, s, n, &rng, 2);
        }
        for (size_t i = 0; i < sizeof EXTRA_STREAM / sizeof EXTRA_STREAM[0]; i++)
            bad += check_splits(t, EXTRA_STREAM[i], strlen(EXTRA_STREAM[i]), &rng, 10);
        if (bad) fprintf(stderr, "  pre=%s: %d split failures\n", pres[p], bad);
        CHECK_EQ_INT(bad, 0);
        tokenizer_free(t);
    }
    json_decref(doc);
    gguf_close(m);
}

TEST(tokenizer_stream_edge_cases) {
    tokenizer *t = load_path(test_fixture("spm_vocab.gguf"));
    CHECK(t != NULL);
    if (!t) return;
    int32_t *ids = NULL;
    size_t n = 0;
    /* empty stream: just BOS with add_special */
    tok_stream *s = tok_stream_new(t, 1, 1);
    CHECK_EQ_INT(tok_stream_feed(s, "", 0, 1, &ids, &n), 0);
    CHECK_EQ_INT(n, 1);
    if (n == 1) CHECK_EQ_INT(ids[0], tokenizer_bos(t));
    /* feeding after the final piece is an error */
    CHECK_EQ_INT(tok_stream_feed(s, "x", 1, 1, &ids, &n), -1);
    tok_stream_free(s);
    free(ids);
    ids = NULL;
    n = 0;
    /* invalid UTF-8 makes the stream unusable */
    s = tok_stream_new(t, 0, 0);
    CHECK_EQ_INT(tok_stream_feed(s, "ab\xff", 3, 0, &ids, &n), -1);
    CHECK_EQ_INT(tok_stream_feed(s, "cd", 2, 1, &ids, &n), -1);
    tok_stream_free(s);
    /* a sequence cut short at the end is invalid, even when split */
    s = tok_stream_new(t, 0, 0);
    CHECK_EQ_INT(tok_stream_feed(s, "ab\xe6\x97", 4, 0, &ids, &n), 0);
    CHECK_EQ_INT(tok_stream_feed(s, "", 0, 1, &ids, &n), -1);
    tok_stream_free(s);
    /* a sequence split across feeds is fine */
    s = tok_stream_new(t, 0, 0);
    CHECK_EQ_INT(tok_stream_feed(s, "\xe6", 1, 0, &ids, &n), 0);
    CHECK_EQ_INT(tok_stream_feed(s, "\x97", 1, 0, &ids, &n), 0);
    CHECK_EQ_INT(tok_stream_feed(s, "\xa5", 1, 1, &ids, &n), 0);
    tok_stream_free(s);
    int32_t *want;
    int64_t wn = encode(t, "\xe6\x97\xa5", 3, 0, 0, &want);
    CHECK_EQ_INT(wn, (int64_t)n);
    if (wn == (int64_t)n) CHECK(memcmp(want, ids, n * sizeof *ids) == 0);
    free(want);
    free(ids);
    tokenizer_free(t);
}

/* Bytes of text not yet covered by the ids a stream emitted (gpt2 pieces
 * cover their text exactly). */
static size_t covered(const tokenizer *t, const int32_t *ids, size_t n) {
    char buf[256];
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += (size_t)tokenizer_piece(t, ids[i], 1, buf, sizeof buf);
    return c;
}

TEST(tokenizer_stream_emits_early) {
    const char *mp = test_model_path();
    CHECK(mp != NULL);
    if (!mp) return;
    tokenizer *t = load_path(mp);
    CHECK(t != NULL);
    if (!t) return;
    const char *s = "It is a truth universally acknowledged, that a single man in possession of a "
                    "good fortune, must be in want of a wife.\n\n<|im_start|>user\nHow are you "
                    "today? 12345 apples<|im_end|>\n";
    size_t n = strlen(s), maxpend = 0;
    tok_stream *st = tok_stream_new(t, 0, 1);
    int32_t *ids = NULL;
    size_t nids = 0;
    for (size_t i = 0; i < n; i++) { /* one byte at a time */
        CHECK_EQ_INT(tok_stream_feed(st, s + i, 1, 0, &ids, &nids), 0);
        size_t pend = i + 1 - covered(t, ids, nids);
        if (pend > maxpend) maxpend = pend;
    }
    /* only the unfinished word(s) are held back */
    CHECK(maxpend <= 24);
    CHECK_EQ_INT(tok_stream_feed(st, "", 0, 1, &ids, &nids), 0);
    CHECK_EQ_INT(covered(t, ids, nids), n);
    tok_stream_free(st);
    free(ids);
    tokenizer_free(t);
}

/* Text with no settled boundary, fed a byte at a time, must not be re-scanned
 * quadratically. */
TEST(tokenizer_stream_long_runs_are_linear) {
    const char *mp = test_model_path();
    CHECK(mp != NULL);
    if (!mp) return;
    tokenizer *t = load_path(mp);
    tokenizer *spm = load_path(test_fixture("spm_vocab.gguf"));
    CHECK(t && spm);
    size_t n = 200000;
    char *s = malloc(n);
    for (int v = 0; v < 4 && t && spm; v++) {
        const tokenizer *tk = v < 2 ? t : spm;
        memset(s, v % 2 ? ' ' : 'a', n);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        tok_stream *st = tok_stream_new(tk, 0, 1);
        int32_t *ids = NULL;
        size_t nids = 0;
        for (size_t i = 0; i < n; i++) tok_stream_feed(st, s + i, 1, 0, &ids, &nids);
        CHECK_EQ_INT(tok_stream_feed(st, "", 0, 1, &ids, &nids), 0);
        tok_stream_free(st);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double sec = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
        CHECK(sec < 5.0);
        int32_t *want;
        int64_t wn = encode(tk, s, n, 0, 1, &want);
        CHECK_EQ_INT(wn, (int64_t)nids);
        if (wn == (int64_t)nids) CHECK(memcmp(want, ids, nids * sizeof *ids) == 0);
        free(want);
        free(ids);
    }
    free(s);
    tokenizer_free(t);
    tokenizer_free(spm);
}

/* ------------------------------------------------------------------------- */
/* invalid input, detokenizer                                                */

TEST(tokenizer_rejects_invalid_utf8) {
    tokenizer *t = load_path(test_fixture("spm_vocab.gguf"));
    CHECK(t != NULL);
    if (!t) return;
    static const char *const bad[] = {"\xff", "a\xc3", "\xc3\x28", "\xed\xa0\x80", "\xc0\xaf",
                                      "\xe0\x80\xaf", "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80",
                                      "ok\x80", "\xe6\x97"};
    int32_t ids[16];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_EQ_INT(tokenizer_encode(t, bad[i], strlen(bad[i]), 0, 0, ids, 16), -1);
    CHECK_EQ_INT(tokenizer_encode(t, "", 0, 0, 0, ids, 16), 0);
    CHECK_EQ_INT(tokenizer_encode(t, "", 0, 1, 0, ids, 16), 1); /* BOS */
    CHECK(tokenizer_encode(t, "\xf4\x8f\xbf\xbf", 4, 0, 0, ids, 16) > 0); /* U+10FFFF is fine */
    tokenizer_free(t);
}

/* Detokenizes ids one at a time and checks that every push returns complete,
 * valid UTF-8; returns the text. */
static char *detok_all(const tokenizer *t, const int32_t *ids, int64_t n, int render_special) {
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    detok_state st;
    memset(&st, 0, sizeof st);
    char buf[2048];
    for (int64_t i = 0; i <= n; i++) {
        size_t k = i < n ? detok_push(t, &st, ids[i], render_special, buf, sizeof buf)
                         : detok_flush(&st, buf, sizeof buf);
        /* complete, valid UTF-8 */
        int bad = 0;
        for (size_t j = 0; j < k;) {
            unsigned char c = (unsigned char)buf[j];
            size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
            if (!l || j + l > k) {
                bad = 1;
                break;
            }
            for (size_t q = 1; q < l; q++)
                if (((unsigned char)buf[j + q] & 0xC0) != 0x80) bad = 1;
            j += l;
        }
        CHECK(!bad);
        while (len + k + 1 > cap) cap *= 2, out = realloc(out, cap);
        memcpy(out + len, buf, k);
        len += k;
    }
    out[len] = 0;
    return out;
}

TEST(tokenizer_detokenize_roundtrip_default_model) {
    const char *mp = test_model_path();
    CHECK(mp != NULL);
    if (!mp) return;
    tokenizer *t = load_path(mp);
    json_t *doc = load_json("tests/fixtures/ref_tokens.json");
    CHECK(t && doc);
    if (t && doc) {
        json_t *cases = json_object_get(doc, "cases");
        int bad = 0;
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const char *s;
            size_t n;
            text_of(json_object_get(json_array_get(cases, i), "text"), &s, &n);
            if (memchr(s, 0, n)) continue; /* compared as C strings below */
            for (int ps = 0; ps < 2; ps++) {
                int32_t *ids;
                int64_t k = encode(t, s, n, 0, ps, &ids);
                char *back = detok_all(t, ids, k, ps);
                if (strlen(back) != n || memcmp(back, s, n) != 0) {
                    if (bad < 3) fprintf(stderr, "  roundtrip: \"%s\" -> \"%s\"\n", s, back);
                    bad++;
                }
                free(back);
                free(ids);
            }
        }
        CHECK_EQ_INT(bad, 0);
        /* control tokens render only with render_special */
        char buf[64];
        CHECK_EQ_INT(tokenizer_piece(t, 2, 0, buf, sizeof buf), 0);
        CHECK_EQ_INT(tokenizer_piece(t, 2, 1, buf, sizeof buf), 10);
        CHECK(memcmp(buf, "<|im_end|>", 10) == 0);
        /* emoji split over byte-level tokens: nothing broken comes out early */
        const char *emo = "\xf0\x9f\x98\x80";
        int32_t *ids;
        int64_t k = encode(t, emo, 4, 0, 0, &ids);
        detok_state st;
        memset(&st, 0, sizeof st);
        size_t total = 0;
        char out[64];
        for (int64_t i = 0; i < k; i++) {
            size_t w = detok_push(t, &st, ids[i], 0, out + total, sizeof out - total);
            if (i + 1 < k) CHECK_EQ_INT(w, 0);
            total += w;
        }
        CHECK_EQ_INT(total, 4);
        CHECK(memcmp(out, emo, 4) == 0);
        CHECK_EQ_INT(detok_flush(&st, out, sizeof out), 0);
        free(ids);
    }
    json_decref(doc);
    tokenizer_free(t);
}

TEST(tokenizer_detokenize_spm_and_invalid_bytes) {
    tokenizer *t = load_path(test_fixture("spm_vocab.gguf"));
    CHECK(t != NULL);
    if (!t) return;
    /* the prefix space llama.cpp adds is stripped from the first piece */
    const char *s = "the people of the world";
    int32_t *ids;
    int64_t k = encode(t, s, strlen(s), 0, 0, &ids);
    char *back = detok_all(t, ids, k, 0);
    CHECK_STR(back, s);
    free(back);
    free(ids);
    /* byte fallback: a CJK character not in the vocabulary becomes byte tokens */
    s = "x\xe5\x90\x8dy"; /* U+540D */
    k = encode(t, s, strlen(s), 0, 0, &ids);
    CHECK(k >= 4);
    back = detok_all(t, ids, k, 0);
    CHECK_STR(back, s);
    free(back);
    free(ids);
    /* invalid sequences from byte tokens become U+FFFD; an incomplete tail at
     * flush too */
    int32_t b_ff = tokenizer_find(t, "<0xFF>", 6), b_e6 = tokenizer_find(t, "<0xE6>", 6),
            b_97 = tokenizer_find(t, "<0x97>", 6), a = tokenizer_find(t, "a", 1);
    CHECK(b_ff >= 0 && b_e6 >= 0 && b_97 >= 0 && a >= 0);
    int32_t seq[] = {a, b_ff, a, b_e6, b_97, a, b_e6, b_97};
    back = detok_all(t, seq, 8, 0);
    CHECK_STR(back, "a\xef\xbf\xbd" "a\xef\xbf\xbd" "a\xef\xbf\xbd");
    free(back);
    tokenizer_free(t);
}

/* ------------------------------------------------------------------------- */
/* bad metadata                                                              */

static const char *const MINI_TOKENS[] = {"<unk>", "<s>", "</s>", "a", "b", "ab", "\xc4\xa0", "c"};
static const char *const MINI_MERGES[] = {"a b", "\xc4\xa0 a"};

enum {
    NO_MODEL = 1, BAD_MODEL = 2, NO_TOKENS = 4, TOKENS_NOT_STR = 8, NO_MERGES = 16,
    MERGE_MALFORMED = 32, MERGES_NOT_STR = 64, TYPES_SHORT = 128, BOS_RANGE = 256,
    SCORES_SHORT = 512, BAD_PRE = 1024, BOOL_TYPE = 2048, EOS_NEG = 4096, EMPTY_TOKENS = 8192
};

static tokenizer *mini(int flags, char *err, size_t errlen) {
    gw w;
    gw_init(&w);
    if (!(flags & NO_MODEL)) gw_str(&w, "tokenizer.ggml.model", flags & BAD_MODEL ? "wordpiece9" : "gpt2");
    gw_str(&w, "tokenizer.ggml.pre", flags & BAD_PRE ? "no-such-pre" : "gpt-2");
    if (flags & TOKENS_NOT_STR) {
        int32_t v[8] = {0};
        gw_arr_i32(&w, "tokenizer.ggml.tokens", v, 8);
    } else if (flags & EMPTY_TOKENS) {
        gw_arr_strs(&w, "tokenizer.ggml.tokens", MINI_TOKENS, 0);
    } else if (!(flags & NO_TOKENS)) {
        gw_arr_strs(&w, "tokenizer.ggml.tokens", MINI_TOKENS, 8);
    }
    int32_t types[8] = {2, 3, 3, 1, 1, 1, 1, 1};
    gw_arr_i32(&w, "tokenizer.ggml.token_type", types, flags & TYPES_SHORT ? 7 : 8);
    float scores[8] = {0};
    gw_arr_f32(&w, "tokenizer.ggml.scores", scores, flags & SCORES_SHORT ? 3 : 8);
    if (flags & MERGES_NOT_STR) {
        int32_t v[2] = {0};
        gw_arr_i32(&w, "tokenizer.ggml.merges", v, 2);
    } else if (flags & MERGE_MALFORMED) {
        static const char *const mm[] = {"a b", "ab"};
        gw_arr_strs(&w, "tokenizer.ggml.merges", mm, 2);
    } else if (!(flags & NO_MERGES)) {
        gw_arr_strs(&w, "tokenizer.ggml.merges", MINI_MERGES, 2);
    }
    gw_u32(&w, "tokenizer.ggml.bos_token_id", flags & BOS_RANGE ? 8 : 1);
    if (flags & EOS_NEG) {
        gw_key(&w, "tokenizer.ggml.eos_token_id", GGUF_INT32);
        gw_u32v(&w, 0xFFFFFFFFu);
    } else {
        gw_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    }
    if (flags & BOOL_TYPE) gw_u32(&w, "tokenizer.ggml.add_bos_token", 1);
    else gw_bool(&w, "tokenizer.ggml.add_bos_token", 1);
    gguf_file *f = gw_parse(&w);
    tokenizer *t = f ? tokenizer_load(f, err, errlen) : NULL;
    gguf_close(f); /* the tokenizer copies what it needs */
    free(w.p);
    return t;
}

TEST(tokenizer_mini_vocab_works) {
    char err[256] = "";
    tokenizer *t = mini(0, err, sizeof err);
    CHECK(t != NULL);
    if (!t) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    int32_t ids[16];
    int64_t n = tokenizer_encode(t, "ab a", 4, 1, 0, ids, 16);
    /* "ab" merges (rank 0); " a" -> "Ġa" merges (rank 1) but is no token:
     * llama.cpp then looks up each single byte of the byte-encoded text
     * (C4 A0 61): only "a" is a token */
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        CHECK_EQ_INT(ids[0], 1);
        CHECK_EQ_INT(ids[1], 5);
        CHECK_EQ_INT(ids[2], 3);
    }
    CHECK_EQ_INT(tokenizer_encode(t, "<s>c", 4, 0, 1, ids, 16), 2);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 7);
    /* cap smaller than the result: the full count comes back */
    CHECK_EQ_INT(tokenizer_encode(t, "ccccc", 5, 0, 0, ids, 2), 5);
    tokenizer_free(t);
}

TEST(tokenizer_rejects_bad_metadata) {
    static const struct {
        int flags;
        const char *needle;
    } cases[] = {
        {NO_MODEL, "tokenizer.ggml.model"},      {BAD_MODEL, "wordpiece9"},
        {NO_TOKENS, "tokenizer.ggml.tokens"},    {TOKENS_NOT_STR, "tokenizer.ggml.tokens"},
        {EMPTY_TOKENS, "tokenizer.ggml.tokens"}, {NO_MERGES, "merges"},
        {MERGE_MALFORMED, "merges[1]"},          {MERGES_NOT_STR, "merges"},
        {TYPES_SHORT, "token_type"},             {BOS_RANGE, "bos_token_id"},
        {SCORES_SHORT, "scores"},                {BAD_PRE, "no-such-pre"},
        {BOOL_TYPE, "add_bos_token"},            {EOS_NEG, "eos_token_id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[256] = "";
        tokenizer *t = mini(cases[i].flags, err, sizeof err);
        CHECK(t == NULL);
        tokenizer_free(t);
        if (!strstr(err, cases[i].needle)) {
            test_failures++;
            fprintf(stderr, "  case %zu: error \"%s\" does not name \"%s\"\n", i, err, cases[i].needle);
        }
        CHECK(strchr(err, '\n') == NULL);
    }
}

/* ------------------------------------------------------------------------- */
/* speed                                                                     */

TEST(tokenizer_speed_1mb_prose) {
    const char *mp = test_model_path();
    CHECK(mp != NULL);
    if (!mp) return;
    tokenizer *t = load_path(mp);
    CHECK(t != NULL);
    if (!t) return;
    static const char *const para[] = {
        "The history of the city begins in the early middle ages, when a small settlement grew "
        "around the river crossing. Merchants travelled from distant markets, and by 1250 the town "
        "had a charter, a cathedral and nearly 4,000 inhabitants. ",
        "It's often said that the best way to learn is by doing; however, reading carefully "
        "(and taking notes!) matters just as much. We'll see whether that holds.\n\n",
        "She opened the letter slowly. \"Dear Margaret,\" it began, \"I hope this finds you well, "
        "and that the winter hasn't been too hard on the farm.\"\n",
    };
    size_t cap = 1 << 20, n = 0;
    char *text = malloc(cap + 512);
    for (int i = 0; n < cap; i++) {
        const char *p = para[i % 3];
        size_t l = strlen(p);
        memcpy(text + n, p, l);
        n += l;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int64_t k = tokenizer_encode(t, text, n, 0, 1, NULL, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double sec = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    CHECK(k > 100000);
    if (getenv("VERBOSE"))
        fprintf(stderr, "  tokenized %.2f MB into %lld tokens in %.3f s (%.1f MB/s)\n", (double)n / 1e6,
                (long long)k, sec, (double)n / 1e6 / sec);
    CHECK(sec < 5.0); /* well under a second in a normal build; generous for sanitizers */
    free(text);
    tokenizer_free(t);
}
