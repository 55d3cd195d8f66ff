/* Pots in device memory (cuda/cuda_pots.c, cache/pot_device.c): the
 * compaction kernel against pot_compact and the K/V stores (one span's, and
 * the batched decode's into many pots) against pot_write, byte for byte; the
 * backend's pots against the CPU backend on a tiny random model: K/V written on the
 * device only (the host copy untouched until read), synced on pot_read_*,
 * compacted on the device, copied device to device, truncated, snapshotted,
 * released by pot_free and handed back to the host when the backend goes.
 * Tolerances: f32 pots, CPU backend exact; logits within 1e-5 of the logit
 * range, K/V within 1e-5 of the largest value (both sides compute in f32
 * and differ by summation order; measured about 1e-7). */
#include <stdio.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cuda/cuda_backend.h"
#include "cuda/kernels.h"
#include "engine/backend.h"
#include "tests/cuda/tiny_model.h"

#define TOL_LOGITS 1e-5
#define TOL_KV 1e-5

/* keep[r][i]: n_keep increasing slots of [0, n) per row, a different pick per row. */
static void random_keep(test_rng *g, int32_t *keep, int32_t rows, int32_t n, int32_t n_keep) {
    for (int32_t r = 0; r < rows; r++) {
        int32_t need = n_keep;
        for (int32_t s = 0, i = 0; s < n && need; s++)
            if ((int32_t)(rng_u32(g) % (uint32_t)(n - s)) < need) {
                keep[r * n_keep + i++] = s;
                need--;
            }
    }
}

static void check_gather(enum pot_dtype dtype, int32_t head_dim) {
    test_rng g = {(uint64_t)head_dim * 7 + dtype};
    char err[128];
    int32_t L = 3, G = 2, cap = 37, n = 30, n_keep = 11, rows = L * G;
    pot *p = pot_new(L, G, head_dim, cap, dtype, err, sizeof err);
    float k[64], v[64];
    for (int32_t l = 0; l < L; l++)
        for (int32_t h = 0; h < G; h++)
            for (int32_t s = 0; s < n; s++) {
                rng_fill(&g, k, (size_t)head_dim, -2, 2);
                rng_fill(&g, v, (size_t)head_dim, -2, 2);
                pot_write(p, l, h, s, k, v);
            }
    p->n = n;
    size_t slot = (size_t)head_dim * (dtype == POT_F16 ? 2 : 4), bytes = (size_t)rows * cap * slot;
    void *src = dev_from(p->k, bytes), *dst = dev_alloc(bytes);
    int32_t *keep = malloc((size_t)rows * n_keep * sizeof *keep);
    random_keep(&g, keep, rows, n, n_keep);
    int32_t *dkeep = dev_from(keep, (size_t)rows * n_keep * sizeof *keep);
    CHECK_CUDA(cuda_pot_gather(dst, src, rows, cap, slot, dkeep, n_keep, 0));
    CHECK(cuda_pot_gather(src, src, rows, cap, slot, dkeep, n_keep, 0) == cudaErrorInvalidValue);
    pot_compact(p, keep, n_keep);
    char *got = malloc(bytes);
    host_from(got, dst, bytes);
    for (int32_t r = 0; r < rows; r++)
        if (memcmp(got + (size_t)r * cap * slot, (char *)p->k + (size_t)r * cap * slot, (size_t)n_keep * slot)) {
            fprintf(stderr, "  gather %s dim %d: row %d differs\n", dtype == POT_F16 ? "f16" : "f32", head_dim, r);
            test_failures++;
            break;
        }
    cudaFree(src), cudaFree(dst), cudaFree(dkeep);
    free(keep), free(got);
    pot_free(p);
}

TEST(cuda_pot_gather_matches_pot_compact) {
    /* 14-byte slots (2-byte units), 28 (4-byte), 32 and 64 (16-byte) */
    check_gather(POT_F16, 7);
    check_gather(POT_F32, 7);
    check_gather(POT_F16, 16);
    check_gather(POT_F32, 16);
}

/* cuda_pot_store writes n new slots of one layer as pot_write does, byte for byte (f16: round to
 * nearest even), and nothing else: the slots around them keep their bytes. */
static void check_store(enum pot_dtype dtype, int32_t head_dim) {
    test_rng g = {(uint64_t)head_dim * 13 + dtype};
    char err[128];
    int32_t G = 3, cap = 29, slot0 = 5, n = 17, dkv = G * head_dim;
    pot *p = pot_new(1, G, head_dim, cap, dtype, err, sizeof err);
    float *k = malloc((size_t)n * dkv * sizeof *k), *v = malloc((size_t)n * dkv * sizeof *v), fill[64];
    for (int32_t h = 0; h < G; h++) /* every slot written once, so the untouched ones have known bytes */
        for (int32_t s = 0; s < cap; s++) {
            rng_fill(&g, fill, (size_t)head_dim, -3, 3);
            pot_write(p, 0, h, s, fill, fill);
        }
    size_t bytes = (size_t)G * cap * head_dim * (dtype == POT_F16 ? 2 : 4);
    void *dk = dev_from(p->k, bytes), *dv = dev_from(p->v, bytes);
    rng_fill(&g, k, (size_t)n * dkv, -70000, 70000); /* beyond f16's range too: rounds to infinity */
    rng_fill(&g, v, (size_t)n * dkv, -1e-6f, 1e-6f); /* f16's subnormals */
    for (int32_t t = 0; t < n; t++)
        for (int32_t h = 0; h < G; h++) pot_write(p, 0, h, slot0 + t, k + (size_t)t * dkv + h * head_dim,
                                                  v + (size_t)t * dkv + h * head_dim);
    float *dkin = dev_from(k, (size_t)n * dkv * sizeof *k), *dvin = dev_from(v, (size_t)n * dkv * sizeof *v);
    CHECK_CUDA(cuda_pot_store(dk, dv, dtype, cap, G, head_dim, dkin, dvin, slot0, n, 0));
    char *got = malloc(bytes);
    host_from(got, dk, bytes);
    if (memcmp(got, p->k, bytes)) {
        fprintf(stderr, "  store %s dim %d: K differs\n", dtype == POT_F16 ? "f16" : "f32", head_dim);
        test_failures++;
    }
    host_from(got, dv, bytes);
    if (memcmp(got, p->v, bytes)) {
        fprintf(stderr, "  store %s dim %d: V differs\n", dtype == POT_F16 ? "f16" : "f32", head_dim);
        test_failures++;
    }
    cudaFree(dk), cudaFree(dv), cudaFree(dkin), cudaFree(dvin);
    free(k), free(v), free(got);
    pot_free(p);
}

TEST(cuda_pot_store_matches_pot_write) {
    check_store(POT_F16, 7);
    check_store(POT_F32, 7);
    check_store(POT_F16, 64);
    check_store(POT_F32, 64);
}

/* cuda_pot_store_batch as the batched decode calls it (cuda_backend.c's forward_layer): one
 * descriptor per single-token span in device memory, each over its own pot (the whole
 * [n_layer][n_head_kv][capacity][head_dim] arrays, capacities and slots of their own), the new
 * K/V rows [rows][n_head_kv * head_dim] of the batch in an order of their own (rows no span
 * takes are never read). The reference is pot_write of each span's row to its slot n0 of
 * the layer, on host pots whose every slot was written once before: the device arrays must
 * equal them byte for byte, so the other slots, layers and heads keep their bytes. G = 5 KV
 * heads: at head_dim 64 a row is 320 values, more than one block of threads. */
static void check_store_batch(enum pot_dtype dtype, int32_t head_dim) {
    enum { NS = 4, ROWS = 6, L = 3, G = 5 };
    const int32_t cap[NS] = {1, 29, 13, 64}; /* one slot only; the last slot; two in the middle */
    const int32_t n0[NS] = {0, 28, 5, 40};
    const int32_t row[NS] = {3, 0, 5, 1};    /* rows 2 and 4 belong to no span */
    const char *name = dtype == POT_F16 ? "f16" : "f32";
    test_rng g = {(uint64_t)head_dim * 17 + dtype};
    char err[128];
    int32_t dkv = G * head_dim;
    size_t esz = dtype == POT_F16 ? 2 : 4;
    pot *p[NS];
    void *dk[NS], *dv[NS];
    size_t bytes[NS];
    cuda_attn_desc desc[NS];
    float fill[128];
    for (int s = 0; s < NS; s++) {
        p[s] = pot_new(L, G, head_dim, cap[s], dtype, err, sizeof err);
        CHECK(p[s] != NULL);
        if (!p[s]) return;
        for (int32_t l = 0; l < L; l++) /* every slot written once: the untouched ones have known bytes */
            for (int32_t h = 0; h < G; h++)
                for (int32_t i = 0; i < cap[s]; i++) {
                    rng_fill(&g, fill, 2 * (size_t)head_dim, -3, 3);
                    pot_write(p[s], l, h, i, fill, fill + head_dim);
                }
        bytes[s] = (size_t)L * G * cap[s] * head_dim * esz;
        dk[s] = dev_from(p[s]->k, bytes[s]);
        dv[s] = dev_from(p[s]->v, bytes[s]);
        /* n_pre and slots are the attention's; the store reads t, n0, capacity, k and v */
        desc[s] = (cuda_attn_desc){row[s], n0[s], n0[s], cap[s], dk[s], dv[s], NULL};
    }
    cuda_attn_desc *ddesc = dev_from(desc, sizeof desc);
    float *k = malloc((size_t)ROWS * dkv * sizeof *k), *v = malloc((size_t)ROWS * dkv * sizeof *v);
    float *dkin = dev_alloc((size_t)ROWS * dkv * sizeof *k), *dvin = dev_alloc((size_t)ROWS * dkv * sizeof *v);
    /* layer 2 (the last) with f16's overflow and subnormals, then layer 1 in range; layer 0 untouched */
    const int32_t layers[2] = {2, 1};
    for (int c = 0; c < 2; c++) {
        int32_t l = layers[c];
        rng_fill(&g, k, (size_t)ROWS * dkv, c ? -3 : -70000, c ? 3 : 70000);
        rng_fill(&g, v, (size_t)ROWS * dkv, c ? -3 : -1e-6f, c ? 3 : 1e-6f);
        cudaMemcpy(dkin, k, (size_t)ROWS * dkv * sizeof *k, cudaMemcpyHostToDevice);
        cudaMemcpy(dvin, v, (size_t)ROWS * dkv * sizeof *v, cudaMemcpyHostToDevice);
        CHECK_CUDA(cuda_pot_store_batch(ddesc, NS, l, dtype, G, head_dim, dkin, dvin, 0));
        for (int s = 0; s < NS; s++)
            for (int32_t h = 0; h < G; h++)
                pot_write(p[s], l, h, n0[s], k + (size_t)row[s] * dkv + h * head_dim,
                          v + (size_t)row[s] * dkv + h * head_dim);
    }
    /* refused arguments and an empty batch write nothing */
    CHECK(cuda_pot_store_batch(ddesc, NS, 0, 2, G, head_dim, dkin, dvin, 0) == cudaErrorInvalidValue);
    CHECK(cuda_pot_store_batch(ddesc, NS, -1, dtype, G, head_dim, dkin, dvin, 0) == cudaErrorInvalidValue);
    CHECK(cuda_pot_store_batch(NULL, NS, 0, dtype, G, head_dim, dkin, dvin, 0) == cudaErrorInvalidValue);
    CHECK_CUDA(cuda_pot_store_batch(ddesc, 0, 0, dtype, G, head_dim, dkin, dvin, 0));
    for (int s = 0; s < NS; s++) {
        char *got = malloc(bytes[s]);
        const void *want[2] = {p[s]->k, p[s]->v}, *dev[2] = {dk[s], dv[s]};
        for (int kv = 0; kv < 2; kv++) {
            host_from(got, dev[kv], bytes[s]);
            if (!memcmp(got, want[kv], bytes[s])) continue;
            size_t at = 0;
            while (got[at] == ((const char *)want[kv])[at]) at++;
            size_t slot = at / esz / (size_t)head_dim;
            fprintf(stderr, "  store batch %s dim %d span %d: %c differs at layer %zu head %zu slot %zu\n", name,
                    head_dim, s, kv ? 'V' : 'K', slot / cap[s] / G, slot / cap[s] % G, slot % cap[s]);
            test_failures++;
        }
        free(got);
        cudaFree(dk[s]), cudaFree(dv[s]);
        pot_free(p[s]);
    }
    cudaFree(ddesc), cudaFree(dkin), cudaFree(dvin);
    free(k), free(v);
}

TEST(cuda_pot_store_batch_matches_pot_write) {
    check_store_batch(POT_F16, 7);
    check_store_batch(POT_F32, 7);
    check_store_batch(POT_F16, 64);
    check_store_batch(POT_F32, 64);
}

typedef struct duo {
    model *m;
    backend *cpu, *gpu;
    float *lc, *lg;
} duo;

/* The same tokens through both backends, each on its pot; the logits of the
 * last token compared (returned: max diff over the range). */
static double step(duo *D, pot *pc, pot *pg, const int32_t *tokens, int32_t n) {
    char err[256];
    backend_span sc = {.tokens = tokens, .n_tokens = n, .kv = pc, .logits_mode = BACKEND_LOGITS_LAST,
                       .logits = D->lc};
    backend_span sg = sc;
    sg.kv = pg;
    sg.logits = D->lg;
    if (D->cpu->forward(D->cpu, &sc, 1, err, sizeof err)) fprintf(stderr, "  cpu: %s\n", err), test_failures++;
    if (D->gpu->forward(D->gpu, &sg, 1, err, sizeof err)) fprintf(stderr, "  cuda: %s\n", err), test_failures++;
    return tiny_rel_to_range(D->lg, D->lc, TINY_VOCAB);
}

static int meta_equal(const pot *a, const pot *b) {
    if (a->n != b->n || a->n_seen != b->n_seen) return 0;
    for (int32_t l = 0; l < a->n_layer; l++)
        for (int32_t h = 0; h < a->n_head_kv; h++)
            for (int32_t s = 0; s < a->n; s++)
                if (a->token_index[pot_slot(a, l, h, s)] != b->token_index[pot_slot(b, l, h, s)]) return 0;
    return 1;
}

TEST(cuda_pots_live_on_device) {
    char err[256];
    duo D = {tiny_model_new(11), NULL, NULL, malloc(TINY_VOCAB * 4), malloc(TINY_VOCAB * 4)};
    D.cpu = cpu_backend_new(D.m, 1, 1, err, sizeof err);
    D.gpu = cuda_backend_new(D.m, 1, 1, err, sizeof err);
    CHECK(D.cpu && D.gpu);
    if (!D.cpu || !D.gpu) return;
    CHECK(D.gpu->pot_memory && D.gpu->pot_memory(D.gpu) > 0);
    test_rng g = {5};
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)(rng_u32(&g) % TINY_VOCAB);
    enum { CAP = 48 };
    pot *pc = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, POT_F32, err, sizeof err);
    pot *pg = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, POT_F32, err, sizeof err);
    size_t kv_bytes = (size_t)TINY_LAYERS * TINY_KV_HEADS * CAP * 16 * 4;
    memset(pg->k, 0x5a, kv_bytes);
    char *sentinel = malloc(kv_bytes);
    memset(sentinel, 0x5a, kv_bytes);
    double worst = 0;

    /* 1. prefill and two decode steps: the host copy is not written */
    worst = fmax(worst, step(&D, pc, pg, toks, 9));
    worst = fmax(worst, step(&D, pc, pg, toks + 9, 1));
    worst = fmax(worst, step(&D, pc, pg, toks + 10, 1));
    CHECK(cuda_backend_holds_pot(D.gpu, pg));
    CHECK(cuda_backend_pot_bytes(D.gpu) == 2 * kv_bytes);
    CHECK(memcmp(pg->k, sentinel, kv_bytes) == 0); /* no copy back after the forwards */
    CHECK(meta_equal(pc, pg));
    double dkv = tiny_pot_diff(pg, pc); /* pot_read_k/v sync it */
    CHECK(dkv <= TOL_KV);
    CHECK(memcmp(pg->k, sentinel, kv_bytes) != 0);
    CHECK(cuda_backend_holds_pot(D.gpu, pg)); /* a sync does not detach */

    /* 2. compaction on the device (different slots per row), then decoding on */
    int32_t rows = TINY_LAYERS * TINY_KV_HEADS, n_keep = 6;
    int32_t *keep = malloc((size_t)rows * n_keep * sizeof *keep);
    random_keep(&g, keep, rows, pc->n, n_keep);
    pot_compact(pc, keep, n_keep);
    pot_compact(pg, keep, n_keep);
    CHECK(cuda_backend_holds_pot(D.gpu, pg));
    CHECK(meta_equal(pc, pg));
    double dcompact = step(&D, pc, pg, toks + 11, 1);
    worst = fmax(worst, dcompact);
    worst = fmax(worst, step(&D, pc, pg, toks + 12, 3));
    dkv = fmax(dkv, tiny_pot_diff(pg, pc));

    /* 3. pot_copy (device to device) into a larger pot, then both go on */
    pot *qc = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP + 5, POT_F32, err, sizeof err);
    pot *qg = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP + 5, POT_F32, err, sizeof err);
    CHECK_EQ_INT(pot_copy(qc, pc), 0);
    CHECK_EQ_INT(pot_copy(qg, pg), 0);
    CHECK(cuda_backend_holds_pot(D.gpu, qg));
    double dcopy = step(&D, qc, qg, toks + 20, 2);
    worst = fmax(worst, dcopy);
    worst = fmax(worst, step(&D, pc, pg, toks + 30, 1)); /* the source is unchanged */
    dkv = fmax(dkv, fmax(tiny_pot_diff(qg, qc), tiny_pot_diff(pg, pc)));

    /* 4. truncation after a sync, then new slots over the truncated ones */
    pot_truncate(pc, pc->n - 2);
    pot_truncate(pg, pg->n - 2);
    worst = fmax(worst, step(&D, pc, pg, toks + 40, 3));
    dkv = fmax(dkv, tiny_pot_diff(pg, pc));

    /* 5. a snapshot of a device pot holds the device's K/V */
    char path[] = "/tmp/potserve_cuda_pots_XXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    worst = fmax(worst, step(&D, pc, pg, toks + 50, 1)); /* host copy stale again */
    pot_snapshot_meta meta = {.model_fingerprint = 1, .log_offset = 2};
    CHECK_EQ_INT(pot_snapshot_write(path, pg, &meta, err, sizeof err), 0);
    pot *back = pot_snapshot_read(path, CAP, &meta, err, sizeof err);
    CHECK(back != NULL);
    if (back) {
        CHECK(back->device == NULL);
        CHECK(tiny_pot_diff(back, pc) <= TOL_KV);
        pot_free(back);
    }
    unlink(path);

    /* 6. pot_free releases the device memory; freeing the backend hands pots back */
    pot_free(qg);
    CHECK(cuda_backend_pot_bytes(D.gpu) == 2 * kv_bytes);
    worst = fmax(worst, step(&D, pc, pg, toks + 51, 1));
    D.gpu->free(D.gpu);
    D.gpu = NULL;
    CHECK(pg->device == NULL);
    dkv = fmax(dkv, tiny_pot_diff(pg, pc));

    fprintf(stderr, "  device pots: logits %.2e (after compaction %.2e, copy %.2e), K/V %.2e\n", worst, dcompact,
            dcopy, dkv);
    CHECK(worst <= TOL_LOGITS);
    CHECK(dkv <= TOL_KV);
    pot_free(pc), pot_free(pg), pot_free(qc);
    free(keep), free(sentinel), free(D.lc), free(D.lg);
    D.cpu->free(D.cpu);
    tiny_model_free(D.m);
}

/* The emulator's device memory limit (absent from GPU builds: the test is skipped there). */
__attribute__((weak)) size_t cuemu_memory_in_use(void);
__attribute__((weak)) void cuemu_set_memory_limit(size_t bytes);

/* Device memory for one and a half pots: attaching a second pot sends the
 * least recently used one back to the host, which comes back on its next
 * forward; a forward needing two new pots at once fails cleanly. */
TEST(cuda_pots_evicted_when_device_memory_is_short) {
    if (!cuemu_set_memory_limit || !cuemu_memory_in_use) { /* a GPU: no way to shrink it */
        test_skip("needs the emulator's memory limit");
        return;
    }
    char err[256];
    duo D = {tiny_model_new(12), NULL, NULL, malloc(TINY_VOCAB * 4), malloc(TINY_VOCAB * 4)};
    D.cpu = cpu_backend_new(D.m, 1, 1, err, sizeof err);
    D.gpu = cuda_backend_new(D.m, 1, 1, err, sizeof err);
    CHECK(D.cpu && D.gpu);
    if (!D.cpu || !D.gpu) return;
    cuda_backend_use_graphs(D.gpu, 0);
    enum { CAP = 40, NP = 3 };
    pot *pc[NP], *pg[NP];
    for (int i = 0; i < NP; i++) {
        pc[i] = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, POT_F32, err, sizeof err);
        pg[i] = pot_new(TINY_LAYERS, TINY_KV_HEADS, 16, CAP, POT_F32, err, sizeof err);
    }
    test_rng g = {9};
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)(rng_u32(&g) % TINY_VOCAB);
    double worst = step(&D, pc[0], pg[0], toks, 9); /* buffers grown, pot 0 attached */
    size_t pot_bytes = cuda_backend_pot_bytes(D.gpu);
    cuemu_set_memory_limit(cuemu_memory_in_use() + pot_bytes / 2);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < NP; i++) {
            int32_t n = pc[i]->n ? 1 : 9;
            worst = fmax(worst, step(&D, pc[i], pg[i], toks + 10 + round * 10 + i, n));
            CHECK(cuda_backend_holds_pot(D.gpu, pg[i]));
            CHECK(cuda_backend_pot_bytes(D.gpu) == pot_bytes); /* one pot on the device at a time */
        }
    int back_on_host = 0;
    for (int i = 0; i < NP; i++) back_on_host += pg[i]->device == NULL;
    CHECK_EQ_INT(back_on_host, NP - 1);
    /* two pots new to the device in one forward cannot both fit: refused, pots unchanged */
    backend_span two[2] = {{.tokens = toks, .n_tokens = 1, .kv = pg[0]}, {.tokens = toks, .n_tokens = 1, .kv = pg[1]}};
    int32_t n0 = pg[0]->n, n1 = pg[1]->n;
    CHECK(D.gpu->forward(D.gpu, two, 2, err, sizeof err) != 0);
    CHECK(strstr(err, "out of device memory") != NULL);
    CHECK_EQ_INT(pg[0]->n, n0);
    CHECK_EQ_INT(pg[1]->n, n1);
    cuemu_set_memory_limit(0);
    worst = fmax(worst, step(&D, pc[1], pg[1], toks + 40, 1));
    double dkv = 0;
    for (int i = 0; i < NP; i++) dkv = fmax(dkv, tiny_pot_diff(pg[i], pc[i]));
    fprintf(stderr, "  eviction: logits %.2e, K/V %.2e\n", worst, dkv);
    CHECK(worst <= TOL_LOGITS);
    CHECK(dkv <= TOL_KV);
    for (int i = 0; i < NP; i++) pot_free(pc[i]), pot_free(pg[i]);
    free(D.lc), free(D.lg);
    D.gpu->free(D.gpu);
    D.cpu->free(D.cpu);
    tiny_model_free(D.m);
}
