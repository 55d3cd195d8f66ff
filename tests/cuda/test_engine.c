/* The engine on the CUDA backend against the engine on the CPU backend
 * (both exact: f32 products, f32 pots), on the tiny synthetic GGUF
 * (build/bench/synthetic-tiny.Q4_0.gguf: 2 layers, 128 wide, random Q4_0
 * weights, the default model's tokenizer; tests/bench/cuda/make_synthetic_gguf.py):
 * a document ingested through a compressing pot with InfiniPot (catalyst
 * score rows, NuC surprisal from label log-probabilities, selection on the
 * host, compaction on the device), the kept entries of every (layer, KV head)
 * compared, then a question's logits (the document pot copied device to
 * device), then the GPU document's snapshot loaded into the CPU engine (the
 * pot synced from the device) answering the same question.
 * Tolerances: the kept entries identical (the scores agree to ~1e-6 and
 * random scores leave no ties that close: measured identical); logits within
 * 1e-4 of the logit range (measured ~1e-6). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "tests/cuda/cuda_test.h"

#define TOL_LOGITS 1e-4

static const char *tiny_gguf(void) {
    const char *p = getenv("POTSERVE_TINY_GGUF");
    return p ? p : "build/bench/synthetic-tiny.Q4_0.gguf";
}

/* A document of pseudo-random words with a pass key in the middle. */
static char *document(size_t words) {
    static const char *w[] = {"the", "harbour", "lamp", "keeper", "wrote", "of", "storms", "and", "ships",
                              "that", "passed", "north", "in", "winter", "light", "grey", "sea"};
    char *s = malloc(words * 10 + 64);
    size_t n = 0;
    uint64_t x = 42;
    for (size_t i = 0; i < words; i++) {
        if (i == words / 2) n += (size_t)sprintf(s + n, "The pass key is 71942. ");
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        n += (size_t)sprintf(s + n, "%s%s", w[(x >> 33) % (sizeof w / sizeof w[0])], i % 13 == 12 ? ". " : " ");
    }
    return s;
}

static engine_doc *ingest(engine *e, const engine_pot_settings *s, const char *text, char *err, size_t errlen) {
    engine_doc *d = engine_doc_open(e, s, err, errlen);
    if (!d) return NULL;
    size_t n = strlen(text), piece = 301; /* pieces that cut words: the tokens must not care */
    for (size_t i = 0; i < n; i += piece) {
        size_t len = n - i < piece ? n - i : piece;
        if (engine_doc_feed(d, text + i, len, i + len == n, err, errlen)) {
            engine_doc_close(d);
            return NULL;
        }
    }
    return d;
}

static double rel_to_range(const float *a, const float *b, size_t n) {
    double mx = 0, lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= mx)) mx = d;
        lo = fmin(lo, b[i]);
        hi = fmax(hi, b[i]);
    }
    return mx / (hi > lo ? hi - lo : 1.0);
}

TEST(cuda_engine_ingest_matches_cpu) {
    char err[256];
    const char *path = tiny_gguf();
    if (access(path, R_OK)) {
        fprintf(stderr, "  %s missing (make %s)\n", path, path);
        CHECK(access(path, R_OK) == 0);
        return;
    }
    engine_options oc = {.n_threads = 1, .exact = 1}, og = oc;
    og.backend = "cuda";
    engine *ec = engine_open(path, &oc, err, sizeof err);
    if (!ec) fprintf(stderr, "  cpu engine: %s\n", err);
    engine *eg = engine_open(path, &og, err, sizeof err);
    if (!eg) fprintf(stderr, "  cuda engine: %s\n", err);
    CHECK(ec && eg);
    if (!ec || !eg) goto out;
    CHECK(engine_pot_device_memory(eg) > 0);
    CHECK(engine_pot_device_memory(ec) == 0);

    engine_pot_settings s = engine_pot_settings_default();
    s.budget_tokens = 96;
    s.keep_tokens = 48;
    s.chunk_tokens = 24;
    char *text = document(400);
    engine_doc *dc = ingest(ec, &s, text, err, sizeof err);
    if (!dc) fprintf(stderr, "  cpu ingest: %s\n", err);
    engine_doc *dg = ingest(eg, &s, text, err, sizeof err);
    if (!dg) fprintf(stderr, "  cuda ingest: %s\n", err);
    CHECK(dc && dg);
    if (!dc || !dg) goto out_docs;
    engine_doc_stats sc, sg;
    engine_doc_get_stats(dc, &sc);
    engine_doc_get_stats(dg, &sg);
    CHECK(sc.compressions >= 3);
    CHECK_EQ_INT(sg.compressions, sc.compressions);
    CHECK_EQ_INT(sg.tokens_in_pot, sc.tokens_in_pot);

    engine_info info;
    engine_get_info(eg, &info);
    int64_t kc[128], kg[128];
    int differ = 0;
    for (int32_t l = 0; l < info.n_layer; l++)
        for (int32_t h = 0; h < info.n_head_kv; h++) {
            int32_t nc = engine_doc_kept(dc, l, h, kc, 128), ng = engine_doc_kept(dg, l, h, kg, 128);
            differ += nc != ng || memcmp(kc, kg, (size_t)(nc < 128 ? nc : 128) * sizeof *kc) != 0;
        }

    const char *question = "What is the pass key?";
    float *lc = malloc((size_t)info.n_vocab * sizeof(float)), *lg = malloc((size_t)info.n_vocab * sizeof(float));
    float *ls = malloc((size_t)info.n_vocab * sizeof(float));
    CHECK_EQ_INT(engine_doc_answer_logits(dc, question, lc, err, sizeof err), 0);
    CHECK_EQ_INT(engine_doc_answer_logits(dg, question, lg, err, sizeof err), 0);
    double d_answer = rel_to_range(lg, lc, (size_t)info.n_vocab);

    /* the GPU document's snapshot answers on the CPU engine as the CPU document does */
    char snap[] = "/tmp/potserve_cuda_doc_XXXXXX";
    int fd = mkstemp(snap);
    if (fd >= 0) close(fd);
    double d_snap = INFINITY;
    CHECK_EQ_INT(engine_doc_save(dg, snap, 123, err, sizeof err), 0);
    uint64_t off = 0;
    engine_doc *ds = engine_doc_load(ec, &s, snap, &off, err, sizeof err);
    if (!ds) fprintf(stderr, "  load: %s\n", err);
    CHECK(ds != NULL);
    if (ds) {
        CHECK_EQ_INT(off, 123);
        CHECK_EQ_INT(engine_doc_answer_logits(ds, question, ls, err, sizeof err), 0);
        d_snap = rel_to_range(ls, lc, (size_t)info.n_vocab);
        engine_doc_close(ds);
    }
    unlink(snap);
    fprintf(stderr, "  engine on cuda: %lld compressions, %d of %d (layer, head) kept sets differ; answer logits "
                    "%.2e, from the GPU's snapshot on the CPU %.2e\n",
            (long long)sg.compressions, differ, info.n_layer * info.n_head_kv, d_answer, d_snap);
    CHECK_EQ_INT(differ, 0);
    CHECK(d_answer <= TOL_LOGITS);
    CHECK(d_snap <= TOL_LOGITS);
    free(lc), free(lg), free(ls);
out_docs:
    engine_doc_close(dc);
    engine_doc_close(dg);
    free(text);
out:
    engine_close(ec);
    engine_close(eg);
}

/* Every policy and both schedules through the engine on both backends: the
 * same kept entries, and answers within TOL_LOGITS. cascade's score rows are
 * weighted (the scores kernel's row weights); finch scores each chunk with
 * the question, two-stage FINCH refines at answer time; h2o accumulates;
 * InfiniPot without context reset rotates keys to their stream positions;
 * then a greedy answer decoded with recycled attention. */
TEST(cuda_engine_every_policy_matches_cpu) {
    char err[256];
    const char *path = tiny_gguf();
    CHECK(access(path, R_OK) == 0);
    if (access(path, R_OK)) return;
    engine_options oc = {.n_threads = 1, .exact = 1}, og = oc;
    og.backend = "cuda";
    engine *ec = engine_open(path, &oc, err, sizeof err), *eg = engine_open(path, &og, err, sizeof err);
    CHECK(ec && eg);
    static const struct {
        const char *policy, *schedule, *question;
        int32_t finch_keep;
        int no_reset; /* InfiniPot's ablation: entries keep their stream positions */
    } runs[] = {{"cascade", NULL, NULL, 0, 0},    {"finch", NULL, "What is the pass key?", 0, 0},
                {"infinipot", NULL, NULL, 24, 0}, {"snapkv", "imdc", NULL, 0, 0},
                {"h2o", NULL, NULL, 0, 0},        {"streaming", NULL, NULL, 0, 0},
                {"truncate", NULL, NULL, 0, 0},   {"infinipot", NULL, NULL, 0, 1}};
    char *text = document(300);
    engine_info info;
    if (ec && eg) engine_get_info(eg, &info);
    for (size_t r = 0; ec && eg && r < sizeof runs / sizeof runs[0]; r++) {
        engine_pot_settings s = engine_pot_settings_default();
        s.budget_tokens = 96, s.keep_tokens = 48, s.chunk_tokens = 24;
        s.policy = runs[r].policy, s.schedule = runs[r].schedule, s.question = runs[r].question;
        s.finch_keep = runs[r].finch_keep, s.original_positions = runs[r].no_reset;
        engine_doc *dc = ingest(ec, &s, text, err, sizeof err);
        if (!dc) fprintf(stderr, "  %s on cpu: %s\n", runs[r].policy, err);
        engine_doc *dg = ingest(eg, &s, text, err, sizeof err);
        if (!dg) fprintf(stderr, "  %s on cuda: %s\n", runs[r].policy, err);
        CHECK(dc && dg);
        if (dc && dg) {
            engine_doc_stats sc, sg;
            engine_doc_get_stats(dc, &sc);
            engine_doc_get_stats(dg, &sg);
            CHECK(sc.compressions >= 2);
            CHECK_EQ_INT(sg.compressions, sc.compressions);
            int64_t kc[128], kg[128];
            int differ = 0;
            for (int32_t l = 0; l < info.n_layer; l++)
                for (int32_t h = 0; h < info.n_head_kv; h++) {
                    int32_t nc = engine_doc_kept(dc, l, h, kc, 128), ng = engine_doc_kept(dg, l, h, kg, 128);
                    differ += nc != ng || memcmp(kc, kg, (size_t)(nc < 128 ? nc : 128) * sizeof *kc) != 0;
                }
            float *lc = malloc((size_t)info.n_vocab * sizeof(float)), *lg = malloc((size_t)info.n_vocab * sizeof(float));
            CHECK_EQ_INT(engine_doc_answer_logits(dc, "What is the pass key?", lc, err, sizeof err), 0);
            CHECK_EQ_INT(engine_doc_answer_logits(dg, "What is the pass key?", lg, err, sizeof err), 0);
            double d = rel_to_range(lg, lc, (size_t)info.n_vocab);
            fprintf(stderr, "  %s%s%s%s: %lld compressions, %d kept sets differ, answer logits %.2e\n",
                    runs[r].policy, runs[r].schedule ? " + imdc" : "", runs[r].finch_keep ? " + two-stage finch" : "",
                    runs[r].no_reset ? " without context reset" : "", (long long)sg.compressions, differ, d);
            CHECK_EQ_INT(differ, 0);
            CHECK(d <= TOL_LOGITS);
            /* a greedy answer with recycled attention (partial steps over the
             * entries a full step picked): the same tokens */
            engine_gen_params gp = {.sampling = sample_params_default(), .max_tokens = 12, .recycle_stride = 3,
                                    .recycle_keep = 40};
            gp.sampling.temperature = 0;
            int32_t tc[12] = {0}, tg[12] = {0};
            engine_gen_result rc = {0}, rg = {0};
            gp.tokens_out = tc;
            CHECK_EQ_INT(engine_doc_answer(dc, "What is the pass key?", &gp, NULL, NULL, &rc, err, sizeof err), 0);
            gp.tokens_out = tg;
            if (engine_doc_answer(dg, "What is the pass key?", &gp, NULL, NULL, &rg, err, sizeof err))
                fprintf(stderr, "  answer on cuda: %s\n", err), test_failures++;
            CHECK_EQ_INT(rg.n_generated, rc.n_generated);
            CHECK(rc.n_generated > 0 && !memcmp(tc, tg, sizeof tc));
            free(lc), free(lg);
        }
        engine_doc_close(dc);
        engine_doc_close(dg);
    }
    free(text);
    engine_close(ec);
    engine_close(eg);
}
