/* Documents through a memory pot (the tiny fixture model for speed, the real
 * default model once for realism):
 * - with a budget the document fits in, every policy and schedule gives the
 *   logits of a plain full prefill of the same tokens (f32 pots, exact path);
 * - however the bytes are split into feeds, the pot is the same;
 * - pinned entries survive compression, kept entries stay in document order,
 *   the pot never exceeds its budget;
 * - bad settings and overflowing `none` pots fail with a message. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "engine/engine.h"
#include "test.h"
#include "test_model.h"

/* f32 pots; exact (f32) activations for the tiny models. The real model runs
 * its default quantised activations (each token's activations are quantised on
 * their own, so chunking does not change them) to keep the sanitizer run short. */
static engine *open_engine(const char *path, int exact) {
    engine_options opt = {.n_threads = 2, .exact = exact, .kv_f32 = 1};
    return test_open_engine(path, &opt);
}

static double max_rel_diff(const float *a, const float *b, int n) {
    double mx = 0, scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int i = 0; i < n; i++) mx = fmax(mx, fabs(a[i] - b[i]));
    return mx / (scale > 0 ? scale : 1);
}

/* The answer's logits from the pot (into a) equal a full prefill of every
 * token the document's reading recorded (into b); more than min_tokens of them. */
static void answer_equals_prefill(engine *e, engine_doc *d, int32_t n_vocab, size_t min_tokens, float *a, float *b,
                                  const char *label) {
    char err[512];
    CHECK_EQ_INT(engine_doc_answer_logits(d, "How many ships passed in April?", a, err, sizeof err), 0);
    size_t n_tok;
    const int32_t *toks = engine_doc_tokens(d, &n_tok);
    CHECK(toks != NULL && n_tok > min_tokens);
    CHECK_EQ_INT(engine_prompt_logits(e, toks, n_tok, b, err, sizeof err), 0);
    double rel = max_rel_diff(a, b, n_vocab);
    if (rel > 1e-4) fprintf(stderr, "  %s: max relative error %g\n", label, rel);
    CHECK(rel <= 1e-4);
}

/* Every policy and schedule, budget >= document: logits equal a full prefill. */
static void check_no_compression_equals_prefill(const char *model_path, size_t doc_bytes,
                                                int32_t budget, int32_t chunk, int n_policies,
                                                int exact) {
    engine *e = open_engine(model_path, exact);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    char *doc = test_lighthouse_doc(doc_bytes);
    const char *policies[] = {"infinipot", "finch", "snapkv", "streaming", "h2o", "truncate", "none", "cascade"};
    const char *schedules[] = {"fixed", "imdc"};
    float *a = malloc(info.n_vocab * sizeof(float)), *b = malloc(info.n_vocab * sizeof(float));
    char err[512];
    for (int s = 0; s < 2; s++)
        for (int p = 0; p < n_policies; p++) {
            engine_pot_settings set = engine_pot_settings_default();
            set.policy = policies[p];
            set.schedule = schedules[s];
            set.budget_tokens = budget;
            set.keep_tokens = budget - 8; /* imdc: memory may hold the whole document */
            set.chunk_tokens = chunk;
            set.record_tokens = 1;
            set.system = "You answer from the document.";
            if (p == 1) set.question = "How many ships passed in April?";
            engine_doc *d = engine_doc_open(e, &set, err, sizeof err);
            CHECK(d != NULL);
            if (!d) {
                fprintf(stderr, "  %s/%s: %s\n", policies[p], schedules[s], err);
                continue;
            }
            /* fed in uneven pieces, so engine chunks never follow the feeds */
            size_t len = strlen(doc), off = 0, piece = 37;
            int rc = 0;
            while (!rc && off < len) {
                size_t n = len - off < piece ? len - off : piece;
                rc = engine_doc_feed(d, doc + off, n, off + n == len, err, sizeof err);
                off += n;
                piece = piece * 7 % 101 + 1;
            }
            CHECK_EQ_INT(rc, 0);
            engine_doc_stats st;
            engine_doc_get_stats(d, &st);
            CHECK_EQ_INT(st.compressions, 0);
            CHECK(st.chunks >= 4);
            answer_equals_prefill(e, d, info.n_vocab, (size_t)(3 * chunk), a, b, policies[p]);
            engine_doc_close(d);
        }
    free(a);
    free(b);
    free(doc);
    engine_close(e);
}

TEST(ingest_without_compression_equals_full_prefill_tiny) {
    check_no_compression_equals_prefill(test_fixture("tiny_llama.gguf"), 150, 180, 32, 8, 1);
    check_no_compression_equals_prefill(test_fixture("tiny_qwen2.gguf"), 150, 180, 32, 8, 1);
}

/* The other families through a pot read in chunks: gemma3's sliding-window
 * layers (window 4, so every chunk's queries mask keys of the chunks before)
 * and global layers, qwen3's QK-norm, phi3's fused matrices, YaRN's angles. */
TEST(ingest_without_compression_equals_full_prefill_families) {
    const char *files[] = {"tiny_gemma3.gguf", "tiny_gemma3_pattern3.gguf", "tiny_qwen3.gguf", "tiny_phi3.gguf",
                           "tiny_llama_rope_yarn.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        check_no_compression_equals_prefill(test_fixture(files[i]), 150, 180, 32, 3, 1);
}

TEST(ingest_without_compression_equals_full_prefill_default_model) {
    if (TEST_SANITIZED) { /* 20 s there; the tiny and families variants run */
        test_skip("the default model is too slow under the sanitizers");
        return;
    }
    /* the real model, for its chat template and GQA shape: the two policies that score */
    check_no_compression_equals_prefill(test_model_path(), 600, 256, 24, 2, 0);
}

/* A document in gemma's chat template (which strips each message's blanks):
 * the pinned prefix and the answer render around it, and the answer equals a
 * full prefill of the same tokens. */
TEST(ingest_gemma_chat_template_keeps_the_document) {
    engine_options opt = {.n_threads = 2, .exact = 1, .kv_f32 = 1, .chat_template = "gemma"};
    engine *e = test_open_engine(test_fixture("tiny_gemma3.gguf"), &opt);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    char *doc = test_lighthouse_doc(150);
    float *a = malloc(info.n_vocab * sizeof(float)), *b = malloc(info.n_vocab * sizeof(float));
    char err[512];
    engine_pot_settings set = engine_pot_settings_default();
    set.budget_tokens = 200;
    set.record_tokens = 1;
    set.system = "You answer from the document.";
    engine_doc *d = engine_doc_open(e, &set, err, sizeof err);
    CHECK(d != NULL);
    if (d) {
        CHECK_EQ_INT(engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err), 0);
        answer_equals_prefill(e, d, info.n_vocab, 100, a, b, "gemma chat");
        engine_doc_close(d);
    } else {
        fprintf(stderr, "  %s\n", err);
    }
    free(a);
    free(b);
    free(doc);
    engine_close(e);
}

/* The real Gemma 3 270M (when models/ has it; `make gemma3-model`), as plain
 * text (its GGUF's chat template is not one potserve detects): a document of
 * ~800 tokens, longer than the 512-token window of its 15 sliding layers and
 * than their rings (511 + a 64-token chunk), through a pot that holds it all;
 * the answer's logits equal a full prefill's, on the sliding layers (whose
 * rings wrapped) and the 3 global ones, with both schedules. */
TEST(ingest_gemma3_270m_rings_without_compression_equal_full_prefill) {
    const char *path = "models/gemma-3-270m-q4_k_m.gguf";
    FILE *f = fopen(path, "rb");
    if (!f) {
        test_skip("models/gemma-3-270m-q4_k_m.gguf absent (make gemma3-model)");
        return;
    }
    fclose(f);
    engine *e = open_engine(path, 0);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    char *doc = test_lighthouse_doc(3600);
    float *a = malloc(info.n_vocab * sizeof(float)), *b = malloc(info.n_vocab * sizeof(float));
    char err[512];
    const char *schedules[] = {"fixed", "imdc"};
    for (int s = 0; s < 2; s++) {
        engine_pot_settings set = engine_pot_settings_default();
        set.schedule = schedules[s];
        set.plain = 1;
        set.budget_tokens = 1024;
        set.keep_tokens = 1016;
        set.chunk_tokens = 64;
        set.record_tokens = 1;
        engine_doc *d = engine_doc_open(e, &set, err, sizeof err);
        CHECK(d != NULL);
        if (!d) {
            fprintf(stderr, "  %s: %s\n", schedules[s], err);
            continue;
        }
        CHECK_EQ_INT(engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err), 0);
        engine_doc_stats st;
        engine_doc_get_stats(d, &st);
        CHECK_EQ_INT(st.compressions, 0);
        CHECK(st.tokens_read > st.ring_entries && st.ring_entries >= 511 + 64 && st.ring_entries < 1024);
        answer_equals_prefill(e, d, info.n_vocab, (size_t)st.ring_entries, a, b, schedules[s]);
        engine_doc_close(d);
    }
    free(a);
    free(b);
    free(doc);
    engine_close(e);
}

/* A model whose layers all slide (window 32) through a pot far smaller than
 * the document: each layer keeps its window's tail, so the answer's logits
 * equal a full prefill of every token (what the pot lost was out of every
 * window's sight). Attention-scored policies would keep the tail anyway
 * (nothing outside a window gets attention), so InfiniPot also runs on
 * surprisal alone (nuc_share 1), which would drop recent entries. */
TEST(ingest_sliding_layers_keep_their_window_exactly) {
    engine *e = open_engine(test_fixture("swa_gemma3_local.gguf"), 1);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    CHECK_EQ_INT(info.n_sliding_layers, 2);
    char *doc = test_lighthouse_doc(400);
    const char *policies[] = {"infinipot", "infinipot", "snapkv", "h2o", "streaming", "truncate"};
    float *a = malloc(info.n_vocab * sizeof(float)), *b = malloc(info.n_vocab * sizeof(float));
    char err[512];
    for (size_t p = 0; p < sizeof policies / sizeof *policies; p++) {
        engine_pot_settings set = engine_pot_settings_default();
        set.policy = policies[p];
        if (p == 0) set.nuc_share = 1.0f;
        set.budget_tokens = 64;
        set.keep_tokens = 40;
        set.chunk_tokens = 12;
        set.record_tokens = 1;
        engine_doc *d = engine_doc_open(e, &set, err, sizeof err);
        CHECK(d != NULL);
        if (!d) {
            fprintf(stderr, "  %s: %s\n", policies[p], err);
            continue;
        }
        CHECK_EQ_INT(engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err), 0);
        engine_doc_stats st;
        engine_doc_get_stats(d, &st);
        CHECK(st.compressions >= 3);
        answer_equals_prefill(e, d, info.n_vocab, 100, a, b, policies[p]);
        engine_doc_close(d);
    }
    free(a);
    free(b);
    free(doc);
    engine_close(e);
}

/* The pot's bytes: its sliding layers' K/V in rings of window - 1 + a chunk
 * and its scoring rows (ring_entries), the rest (and all metadata) at the
 * pot's capacity, the budget plus those scoring rows; f32 entries. */
static void check_ring_memory(const engine_info *info, const engine_doc_stats *st, int32_t chunk) {
    int32_t rows = st->ring_entries - (info->sliding_window - 1) - chunk, capacity = st->budget_tokens + rows;
    CHECK(st->ring_entries > 0 && rows >= 0);
    size_t ring_saving = (size_t)info->n_sliding_layers * info->n_head_kv * (size_t)(capacity - st->ring_entries) *
                         2 * sizeof(float) * (size_t)info->head_dim;
    CHECK_EQ_INT(st->pot_bytes, pot_bytes(info->n_layer, info->n_head_kv, info->head_dim, capacity, POT_F32) - ring_saving);
}

/* The boundary of that: window - 1 kept entries are exactly enough (the next
 * query sees itself and window - 1 before it), so a pot keeping 31 for window
 * 32 still gives full prefill's logits, and keep_tokens or finch_keep of 30 is
 * refused with a message naming the window. */
TEST(ingest_sliding_layers_need_window_minus_one_kept) {
    engine *e = open_engine(test_fixture("swa_gemma3_local.gguf"), 1);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    CHECK_EQ_INT(info.sliding_window, 32);
    char *doc = test_lighthouse_doc(400);
    float *a = malloc(info.n_vocab * sizeof(float)), *b = malloc(info.n_vocab * sizeof(float));
    char err[512];
    engine_pot_settings set = engine_pot_settings_default();
    set.policy = "infinipot";
    set.nuc_share = 1.0f; /* surprisal alone: it would drop recent entries */
    set.budget_tokens = 48;
    set.keep_tokens = 31;
    set.chunk_tokens = 12;
    set.record_tokens = 1;
    engine_doc *d = engine_doc_open(e, &set, err, sizeof err);
    CHECK(d != NULL);
    if (d) {
        CHECK_EQ_INT(engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err), 0);
        engine_doc_stats st;
        engine_doc_get_stats(d, &st);
        CHECK(st.compressions >= 3);
        check_ring_memory(&info, &st, set.chunk_tokens);
        answer_equals_prefill(e, d, info.n_vocab, 100, a, b, "keep 31, window 32");
        engine_doc_close(d);
    } else {
        fprintf(stderr, "  keep 31: %s\n", err);
    }
    set.keep_tokens = 30;
    CHECK(engine_doc_open(e, &set, err, sizeof err) == NULL);
    CHECK(strstr(err, "keep_tokens: 30 is below the model's sliding window - 1 (31)") != NULL);
    set.keep_tokens = 40;
    set.policy = "finch";
    set.question = "Who kept the light?";
    set.finch_keep = 30;
    CHECK(engine_doc_open(e, &set, err, sizeof err) == NULL);
    CHECK(strstr(err, "finch_keep: 30 is below the model's sliding window - 1 (31)") != NULL);
    free(a);
    free(b);
    free(doc);
    engine_close(e);
}

/* Ingests doc with the given feed sizes; returns the answer logits and the
 * kept indices of every (layer, head). */
static int ingest_split(engine *e, const engine_pot_settings *set, const char *doc, size_t piece,
                        float *logits, int64_t *kept, int32_t cap, engine_doc_stats *st) {
    char err[512];
    engine_doc *d = engine_doc_open(e, set, err, sizeof err);
    if (!d) {
        fprintf(stderr, "  %s\n", err);
        return -1;
    }
    size_t len = strlen(doc), off = 0;
    int rc = 0;
    while (!rc && off < len) {
        size_t n = len - off < piece ? len - off : piece;
        rc = engine_doc_feed(d, doc + off, n, off + n == len, err, sizeof err);
        engine_doc_get_stats(d, st);
        if (st->tokens_in_pot > st->budget_tokens) rc = -1, fprintf(stderr, "  pot over budget\n");
        off += n;
    }
    if (!rc) rc = engine_doc_answer_logits(d, "What did the daughter write?", logits, err, sizeof err);
    engine_info info;
    engine_get_info(e, &info);
    for (int32_t l = 0; !rc && l < info.n_layer; l++)
        for (int32_t h = 0; h < info.n_head_kv; h++)
            engine_doc_kept(d, l, h, kept + ((size_t)l * info.n_head_kv + h) * cap, cap);
    engine_doc_get_stats(d, st);
    if (rc) fprintf(stderr, "  %s\n", err);
    engine_doc_close(d);
    return rc;
}

/* Sliding and global layers in one model (tiny_gemma3: window 4, five
 * sliding layers and one global) under compression, seen right after one (a
 * document whose last chunk fills the pot): every sliding layer's (every
 * head's) newest entries are exactly the document's last positions, while the
 * global layer holds what the policy chose (InfiniPot on surprisal alone
 * keeps an older span there). */
TEST(ingest_mixed_layers_sliding_keep_last_positions) {
    engine *e = open_engine(test_fixture("tiny_gemma3.gguf"), 1);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    CHECK_EQ_INT(info.sliding_window, 4);
    CHECK_EQ_INT(info.n_sliding_layers, 5);
    engine_pot_settings set = engine_pot_settings_default();
    set.policy = "infinipot";
    set.nuc_share = 1.0f;
    set.budget_tokens = 48;
    set.keep_tokens = 20;
    set.chunk_tokens = 12;
    int32_t cap = set.budget_tokens, W = info.sliding_window;
    int64_t *kept = calloc((size_t)info.n_layer * info.n_head_kv * cap, sizeof *kept);
    float *logits = malloc(info.n_vocab * sizeof(float));
    engine_doc_stats st = {0};
    for (size_t bytes = 300; bytes < 400 && st.tokens_in_pot != set.keep_tokens; bytes++) {
        char *doc = test_lighthouse_doc(bytes);
        CHECK_EQ_INT(ingest_split(e, &set, doc, 1 << 20, logits, kept, cap, &st), 0);
        free(doc);
    }
    CHECK_EQ_INT(st.tokens_in_pot, set.keep_tokens); /* a document that ends with a compression */
    CHECK(st.compressions >= 3);
    check_ring_memory(&info, &st, set.chunk_tokens);
    /* admission control counts the rings too (the scoring rows' slots aside, as for every pot) */
    size_t plain = pot_bytes(info.n_layer, info.n_head_kv, info.head_dim, set.budget_tokens, POT_F32);
    CHECK_EQ_INT(engine_doc_memory(e, &set), plain - (size_t)info.n_sliding_layers * info.n_head_kv *
                                                         (size_t)(set.budget_tokens - (W - 1 + set.chunk_tokens)) * 2 *
                                                         sizeof(float) * (size_t)info.head_dim);
    int sliding_seen = 0, global_elsewhere = 0; /* global heads whose newest entries are not the tail */
    for (int32_t l = 0; l < info.n_layer; l++) {
        int sliding = engine_layer_window(e, l) != 0;
        sliding_seen += sliding;
        for (int32_t h = 0; h < info.n_head_kv; h++) {
            const int64_t *k = kept + ((size_t)l * info.n_head_kv + h) * cap;
            /* a sliding layer reports the window - 1 entries its next token sees, a global one all */
            int32_t n = sliding ? W - 1 : st.tokens_in_pot, tail_ok = 1;
            for (int32_t i = 0; i < W - 1; i++) tail_ok &= k[n - (W - 1) + i] == st.tokens_read - (W - 1) + i;
            if (sliding && !tail_ok) {
                test_failures++;
                fprintf(stderr, "  layer %d head %d: its entries are not the last %d positions\n", l, h, W - 1);
            }
            global_elsewhere += !sliding && !tail_ok;
        }
    }
    CHECK_EQ_INT(sliding_seen, info.n_sliding_layers);
    CHECK(global_elsewhere > 0); /* the policy, not the tail rule, chose the global layer's entries */
    free(kept);
    free(logits);
    engine_close(e);
}

TEST(ingest_pot_is_independent_of_upload_splits) {
    engine *e = open_engine(test_fixture("tiny_llama.gguf"), 1);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    char *doc = test_lighthouse_doc(1500); /* ~1000 byte-level tokens through a 200-entry pot */
    const char *policies[] = {"infinipot", "snapkv", "h2o", "cascade"};
    for (int p = 0; p < 4; p++) {
        engine_pot_settings set = engine_pot_settings_default();
        set.policy = policies[p];
        set.budget_tokens = 180;
        set.keep_tokens = 90;
        set.chunk_tokens = 40;
        int32_t cap = set.budget_tokens;
        size_t nk = (size_t)info.n_layer * info.n_head_kv * cap;
        int64_t *k1 = calloc(nk, sizeof *k1), *k2 = calloc(nk, sizeof *k2);
        float *l1 = malloc(info.n_vocab * sizeof(float)), *l2 = malloc(info.n_vocab * sizeof(float));
        engine_doc_stats s1, s2;
        CHECK_EQ_INT(ingest_split(e, &set, doc, 1 << 20, l1, k1, cap, &s1), 0);
        CHECK_EQ_INT(ingest_split(e, &set, doc, 13, l2, k2, cap, &s2), 0);
        CHECK(s1.compressions >= 3);
        CHECK_EQ_INT(s1.compressions, s2.compressions);
        CHECK_EQ_INT(s1.tokens_in_pot, s2.tokens_in_pot);
        CHECK(memcmp(k1, k2, nk * sizeof *k1) == 0);
        CHECK(memcmp(l1, l2, info.n_vocab * sizeof(float)) == 0);
        /* pinned prefix first (negative document indices), then strictly increasing */
        for (int32_t lh = 0; lh < info.n_layer * info.n_head_kv; lh++) {
            const int64_t *k = k1 + (size_t)lh * cap;
            for (int32_t i = 0; i < s1.pinned_tokens; i++) CHECK_EQ_INT(k[i], i - s1.pinned_tokens);
            for (int32_t i = 1; i < s1.tokens_in_pot; i++)
                if (k[i] <= k[i - 1]) {
                    test_failures++;
                    fprintf(stderr, "  %s: kept indices not increasing\n", policies[p]);
                    break;
                }
        }
        free(k1);
        free(k2);
        free(l1);
        free(l2);
    }
    free(doc);
    engine_close(e);
}

/* engine_doc_question_attention: the question's rows' attention over exactly
 * the entries the pot keeps (engine_doc_kept's positions, slot for slot),
 * each a sum of softmax probabilities: at least 0, and over a (layer, head)
 * at most the rows times the query heads of its group; d's pot unchanged. */
TEST(ingest_question_attention_is_over_the_kept_entries) {
    engine *e = open_engine(test_fixture("tiny_llama.gguf"), 1);
    CHECK(e != NULL);
    if (!e) return;
    engine_info info;
    engine_get_info(e, &info);
    char *doc = test_lighthouse_doc(1500);
    engine_pot_settings set = engine_pot_settings_default();
    set.budget_tokens = 180;
    set.keep_tokens = 90;
    set.chunk_tokens = 40;
    char err[512];
    engine_doc *d = engine_doc_open(e, &set, err, sizeof err);
    CHECK(d && !engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err));
    int32_t cap = 256, n = 0, n_lh = info.n_layer * info.n_head_kv;
    float *score = malloc((size_t)n_lh * cap * sizeof *score);
    int64_t *pos = malloc((size_t)n_lh * cap * sizeof *pos), *kept = malloc((size_t)cap * sizeof *kept);
    engine_doc_stats before, after;
    engine_doc_get_stats(d, &before);
    CHECK(before.compressions >= 3);
    const char *question = "What did the daughter write?";
    CHECK_EQ_INT(engine_doc_question_attention(d, question, cap, score, pos, &n, err, sizeof err), 0);
    CHECK(n >= before.tokens_in_pot && n <= before.tokens_in_pot + 40);
    size_t n_rows = strlen(question); /* at least the question's tokens; its prompt has more */
    for (int32_t lh = 0; lh < n_lh; lh++) {
        int32_t k = engine_doc_kept(d, lh / info.n_head_kv, lh % info.n_head_kv, kept, cap);
        double sum = 0;
        for (int32_t j = 0; j < n; j++) {
            CHECK(score[(size_t)lh * cap + j] >= 0);
            sum += score[(size_t)lh * cap + j];
        }
        for (int32_t j = 0; j < k; j++) CHECK_EQ_INT(pos[(size_t)lh * cap + j], kept[j]);
        CHECK(sum > 0 && sum <= (double)(n_rows + 64) * info.n_head / info.n_head_kv);
    }
    CHECK_EQ_INT(engine_doc_question_attention(d, question, 10, score, pos, &n, err, sizeof err), -1); /* cap too small */
    engine_doc_get_stats(d, &after);
    CHECK_EQ_INT(after.tokens_in_pot, before.tokens_in_pot);
    free(score);
    free(pos);
    free(kept);
    engine_doc_close(d);
    free(doc);
    engine_close(e);
}

TEST(ingest_rejects_bad_settings_and_overflow) {
    engine *e = open_engine(test_fixture("tiny_llama.gguf"), 1);
    CHECK(e != NULL);
    if (!e) return;
    char err[512];
    struct {
        const char *field;
        engine_pot_settings s;
    } bad[8];
    for (int i = 0; i < 8; i++) {
        bad[i].s = engine_pot_settings_default();
        bad[i].s.budget_tokens = 180; /* the tiny model's context is 256 */
    }
    bad[0].field = "budget_tokens", bad[0].s.budget_tokens = 1 << 20;
    bad[1].field = "keep_tokens", bad[1].s.keep_tokens = 4096, bad[1].s.budget_tokens = 180;
    bad[2].field = "policy", bad[2].s.policy = "magic";
    bad[3].field = "schedule", bad[3].s.schedule = "weekly";
    bad[4].field = "chunk_tokens", bad[4].s.chunk_tokens = -5;  /* 0 means automatic */
    bad[5].field = "nuc_share", bad[5].s.nuc_share = 2;
    bad[6].field = "pool_width", bad[6].s.pool_width = 4;  /* even: no centre */
    bad[7].field = "pool_width", bad[7].s.pool_width = 257;
    for (int i = 0; i < 8; i++) {
        engine_doc *d = engine_doc_open(e, &bad[i].s, err, sizeof err);
        CHECK(d == NULL);
        if (!strstr(err, bad[i].field)) {
            test_failures++;
            fprintf(stderr, "  expected '%s' in '%s'\n", bad[i].field, err);
        }
        engine_doc_close(d);
    }
    engine_pot_settings s = engine_pot_settings_default();
    s.policy = "none";
    s.budget_tokens = 64;
    s.keep_tokens = 32;
    s.chunk_tokens = 16;
    engine_doc *d = engine_doc_open(e, &s, err, sizeof err);
    CHECK(d != NULL);
    if (d) {
        char *doc = test_lighthouse_doc(1000);
        CHECK_EQ_INT(engine_doc_feed(d, doc, strlen(doc), 1, err, sizeof err), -1);
        CHECK(strstr(err, "does not fit") != NULL);
        free(doc);
        engine_doc_close(d);
    }
    d = engine_doc_open(e, &(engine_pot_settings){.budget_tokens = 180, .chunk_tokens = 64, .nuc_share = 0.5f}, err, sizeof err);
    CHECK(d != NULL);
    if (d) {
        CHECK_EQ_INT(engine_doc_feed(d, "ok \xff", 4, 1, err, sizeof err), -1);
        CHECK(strstr(err, "UTF-8") != NULL);
        engine_doc_close(d);
    }
    engine_close(e);
}

/* engine_doc_cancel (set by the server's loop thread when a chunk failed):
 * the chunk under way finishes, then the next step and every push fail. */
TEST(ingest_cancel_fails_the_next_step_and_push) {
    engine *e = open_engine(test_fixture("tiny_llama.gguf"), 1);
    CHECK(e != NULL);
    if (!e) return;
    char err[256];
    engine_doc *d = engine_doc_open(e, &(engine_pot_settings){.budget_tokens = 180, .chunk_tokens = 16, .nuc_share = 0.5f},
                                    err, sizeof err);
    CHECK(d != NULL);
    if (d) {
        char *doc = test_lighthouse_doc(2000);
        CHECK_EQ_INT(engine_doc_push(d, doc, strlen(doc), 0, err, sizeof err), 0);
        CHECK_EQ_INT(engine_doc_step(d, err, sizeof err), 1); /* chunks are ready */
        engine_doc_cancel(d);
        CHECK_EQ_INT(engine_doc_step(d, err, sizeof err), -1);
        CHECK(strstr(err, "cancelled") != NULL);
        CHECK_EQ_INT(engine_doc_push(d, "more", 4, 0, err, sizeof err), -1);
        engine_doc_stats st;
        engine_doc_get_stats(d, &st);
        CHECK(st.chunks == 1);
        free(doc);
        engine_doc_close(d);
    }
    engine_close(e);
}
