/* The CUDA backend's benchmark (tests/bench/cuda/README.md): for one model,
 * prefill and ingest tokens/s, decode tokens/s at batch 1 and 16, each as a
 * % of its bound, the bounds measured on the same device: HBM bandwidth from
 * a device-to-device copy, tensor-core throughput from a large cuBLAS GEMM
 * in the precision the prefill products use (f16 operands, f32 accumulation;
 * TF32 shown beside it). Built against the CUDA runtime (make bench-cuda) it measures a
 * GPU; built against the emulator (make bench-cuda-emu) it only shows that
 * every step runs: its timings are the CPU's and are labelled so.
 *
 *   bench_cuda MODEL [--quick]
 *
 * Ingest here is the engine's loop without the tokenizer: chunks forwarded
 * with the observation window's score rows, a SnapKV selection on the host
 * and the compaction on the device whenever the pot is full. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cache/cache.h"
#include "cuda/cuda_backend.h"
#include "engine/backend.h"
#include "engine/model.h"
#include "engine/quant.h"

typedef struct cfg {
    int32_t prefill_tokens, chunk, ingest_tokens, budget, keep, window, decode_ctx, decode_steps, copy_mib, gemm_n;
} cfg;

static const cfg FULL = {4096, 512, 32768, 2048, 1024, 32, 1024, 64, 1024, 8192};
static const cfg QUICK = {48, 24, 96, 48, 24, 4, 16, 2, 8, 128}; /* chunks of 24: the GEMM path */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, why);
    exit(1);
}

#define CKD(call)                                                       \
    do {                                                                \
        cudaError_t e_ = (call);                                        \
        if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_));      \
    } while (0)

/* Device-to-device copy bandwidth, bytes read + written per second. */
static double hbm_bandwidth(size_t mib) {
    size_t bytes = mib << 20;
    void *a, *b;
    CKD(cudaMalloc(&a, bytes));
    CKD(cudaMalloc(&b, bytes));
    CKD(cudaMemset(a, 1, bytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    CKD(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice)); /* warm-up */
    int reps = 10;
    cudaEventRecord(e0, 0);
    for (int i = 0; i < reps; i++) CKD(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaFree(a), cudaFree(b);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return 2.0 * (double)bytes * reps / (ms * 1e-3);
}

/* FLOP/s of an n x n x n cuBLAS GEMM with operands of type t and compute ct. */
static double gemm_flops(int n, cudaDataType t, cublasComputeType_t ct) {
    size_t es = t == CUDA_R_32F ? 4 : 2;
    void *a, *b, *c;
    CKD(cudaMalloc(&a, (size_t)n * n * es));
    CKD(cudaMalloc(&b, (size_t)n * n * es));
    CKD(cudaMalloc(&c, (size_t)n * n * 4));
    CKD(cudaMemset(a, 0, (size_t)n * n * es));
    CKD(cudaMemset(b, 0, (size_t)n * n * es));
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) die("cublasCreate", "failed");
    const float one = 1, zero = 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    int reps = 5;
    for (int i = -1; i < reps; i++) {
        if (i == 0) cudaEventRecord(e0, 0);
        if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, t, n, b, t, n, &zero, c, CUDA_R_32F, n, ct,
                         CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            die("cublasGemmEx", "failed");
    }
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    cublasDestroy(h);
    cudaFree(a), cudaFree(b), cudaFree(c);
    return 2.0 * n * (double)n * n * reps / (ms * 1e-3);
}

/* Bytes of every matrix a decode step reads (the LM head once if tied). */
static double weight_bytes(const model *m) {
    double b = (double)m->tok_embd.rows * m->tok_embd.row_bytes; /* the LM head (tied) or embeddings */
    if (m->output.data != m->tok_embd.data) b = (double)m->output.rows * m->output.row_bytes;
    for (int32_t l = 0; l < m->n_layer; l++) {
        const layer_weights *w = &m->layers[l];
        const weight *ws[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < 7; i++) b += (double)ws[i]->rows * ws[i]->row_bytes;
    }
    return b;
}

/* Multiply-adds x 2 of one token's matrix products, and of its attention over n_keys keys. */
static double token_flops(const model *m, double n_keys) {
    double d = m->n_embd, dkv = (double)m->n_head_kv * m->head_dim, ff = m->n_ff;
    double per_layer = 2 * (d * d * 2 + 2 * d * dkv + 3 * d * ff) + 4.0 * m->n_head * m->head_dim * n_keys;
    return m->n_layer * per_layer + 2 * d * m->n_vocab;
}

static pot *new_pot(const model *m, int32_t cap) {
    char err[128];
    pot *p = pot_new(m->n_layer, m->n_head_kv, m->head_dim, cap, POT_F16, err, sizeof err);
    if (!p) die("pot_new", err);
    return p;
}

static void forward(backend *b, backend_span *sp, int32_t n) {
    char err[256];
    if (b->forward(b, sp, n, err, sizeof err)) die("forward", err);
}

static int32_t *random_tokens(const model *m, int32_t n, uint64_t seed) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int32_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        t[i] = (int32_t)((seed >> 33) % (uint64_t)m->n_vocab);
    }
    return t;
}

/* Prefill: chunks into one pot, the last chunk's logits only. Tokens/s. */
static double bench_prefill(backend *b, const model *m, const cfg *c, double *flops) {
    pot *p = new_pot(m, c->prefill_tokens);
    int32_t *tok = random_tokens(m, c->prefill_tokens, 1);
    float *logits = malloc((size_t)m->n_vocab * sizeof *logits);
    backend_span warm = {.tokens = tok, .n_tokens = c->chunk, .kv = p};
    forward(b, &warm, 1); /* buffers grown, kernels loaded */
    pot_truncate(p, 0);
    p->n_seen = 0;
    double t0 = now_s();
    *flops = 0;
    for (int32_t i = 0; i < c->prefill_tokens; i += c->chunk) {
        int last = i + c->chunk >= c->prefill_tokens;
        backend_span sp = {.tokens = tok + i, .n_tokens = c->chunk, .kv = p,
                           .logits_mode = last ? BACKEND_LOGITS_LAST : BACKEND_LOGITS_NONE, .logits = logits};
        forward(b, &sp, 1);
        *flops += c->chunk * token_flops(m, i + c->chunk / 2.0);
    }
    double dt = now_s() - t0;
    *flops /= dt;
    pot_free(p), free(tok), free(logits);
    return c->prefill_tokens / dt;
}

/* Ingest with compression between chunks. Tokens/s; *compress_share the
 * share of the time in selection and compaction. */
static double bench_ingest(backend *b, const model *m, const cfg *c, double *compress_share) {
    pot *p = new_pot(m, c->budget);
    int32_t *tok = random_tokens(m, c->ingest_tokens, 2);
    int32_t rows = m->n_layer * m->n_head_kv, chunk = c->budget - c->keep;
    float *scores = malloc((size_t)rows * c->budget * sizeof *scores);
    int32_t *keep = malloc((size_t)rows * c->keep * sizeof *keep);
    char err[256];
    double t0 = now_s(), t_compress = 0;
    for (int32_t i = 0; i < c->ingest_tokens; i += chunk) {
        int32_t n = c->ingest_tokens - i < chunk ? c->ingest_tokens - i : chunk;
        if (p->n + n > c->budget) n = c->budget - p->n;
        int32_t n_keys = p->n + n, w = c->window < n ? c->window : n;
        backend_span sp = {.tokens = tok + i, .n_tokens = n, .kv = p, .score_row0 = n - w, .n_score_rows = w,
                           .scores = scores};
        forward(b, &sp, 1);
        if (p->n < c->budget) continue;
        double t1 = now_s();
        select_params sel = {.policy = POLICY_SNAPKV, .n_keep = c->keep, .scores = scores, .scores_stride = n_keys,
                             .window = w, .pool = 5};
        if (pot_select(p, &sel, keep, err, sizeof err)) die("pot_select", err);
        pot_compact(p, keep, c->keep);
        cudaDeviceSynchronize(); /* the compaction's kernels are done */
        t_compress += now_s() - t1;
    }
    double dt = now_s() - t0;
    *compress_share = t_compress / dt;
    pot_free(p), free(tok), free(scores), free(keep);
    return c->ingest_tokens / dt;
}

/* Decode: `batch` sequences over copies of one prefilled pot, all in one
 * forward per step. Tokens/s; *bytes_per_s what the step must read from
 * memory (weights once, each sequence's K/V) at that rate. */
static double bench_decode(backend *b, const model *m, const cfg *c, int batch, double *bytes_per_s) {
    int32_t cap = c->decode_ctx + c->decode_steps + 1;
    pot *base = new_pot(m, cap);
    int32_t *tok = random_tokens(m, c->decode_ctx, 3);
    for (int32_t i = 0; i < c->decode_ctx; i += c->chunk) {
        int32_t n = c->decode_ctx - i < c->chunk ? c->decode_ctx - i : c->chunk;
        backend_span sp = {.tokens = tok + i, .n_tokens = n, .kv = base};
        forward(b, &sp, 1);
    }
    pot **pots = malloc((size_t)batch * sizeof *pots);
    backend_span *sp = calloc((size_t)batch, sizeof *sp);
    float *logits = malloc((size_t)batch * m->n_vocab * sizeof *logits);
    int32_t *next = random_tokens(m, batch, 4);
    for (int i = 0; i < batch; i++) {
        pots[i] = new_pot(m, cap);
        if (pot_copy(pots[i], base)) die("pot_copy", "shapes differ");
        sp[i] = (backend_span){.tokens = &next[i], .n_tokens = 1, .kv = pots[i],
                               .logits_mode = BACKEND_LOGITS_LAST, .logits = logits + (size_t)i * m->n_vocab};
    }
    forward(b, sp, batch); /* the graph captured, buffers grown */
    double t0 = now_s(), kv_bytes = 0, kv_token = 2.0 * m->n_layer * m->n_head_kv * m->head_dim * 2;
    for (int32_t s = 1; s < c->decode_steps; s++) {
        kv_bytes += batch * (double)pots[0]->n * kv_token;
        forward(b, sp, batch);
    }
    double dt = now_s() - t0, steps = c->decode_steps - 1;
    *bytes_per_s = (steps * weight_bytes(m) + kv_bytes) / dt;
    for (int i = 0; i < batch; i++) pot_free(pots[i]);
    pot_free(base), free(pots), free(sp), free(logits), free(next), free(tok);
    return batch * steps / dt;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cuda MODEL [--quick]\n");
        return 2;
    }
    const cfg *c = argc > 2 && !strcmp(argv[2], "--quick") ? &QUICK : &FULL;
    char err[256];
    struct cudaDeviceProp prop;
    CKD(cudaGetDeviceProperties(&prop, 0));
    int emulated = strstr(prop.name, "emulator") != NULL;
    model *m = model_load(argv[1], err, sizeof err);
    if (!m) die(argv[1], err);
    backend *b = cuda_backend_new(m, 1, 0, err, sizeof err);
    if (!b) die("cuda_backend_new", err);
    const char *name = strrchr(argv[1], '/') ? strrchr(argv[1], '/') + 1 : argv[1];

    double bw = hbm_bandwidth((size_t)c->copy_mib);
    double tf32 = gemm_flops(c->gemm_n, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32);
    double f16 = gemm_flops(c->gemm_n, CUDA_R_16F, CUBLAS_COMPUTE_32F);
    double pf_flops, share, bps1, bps16;
    double prefill = bench_prefill(b, m, c, &pf_flops);
    double ingest = bench_ingest(b, m, c, &share);
    double dec1 = bench_decode(b, m, c, 1, &bps1);
    double dec16 = bench_decode(b, m, c, 16, &bps16);
    uint64_t caps, reps;
    cuda_backend_graph_counts(b, &caps, &reps);

    printf("## %s on %s%s\n\n", name, prop.name,
           emulated ? " (EMULATED on the CPU: a smoke test, these are not GPU figures)" : "");
    printf("bounds: HBM %.1f GB/s (device copy), f16 GEMM %.1f TFLOP/s (f32 accumulation), TF32 GEMM %.1f TFLOP/s "
           "(n = %d)\n\n", bw / 1e9, f16 / 1e12, tf32 / 1e12, c->gemm_n);
    printf("| measure | tokens/s | %% of bound | bound |\n|---|---|---|---|\n");
    printf("| prefill %d tokens (chunks of %d) | %.0f | %.1f %% | f16 GEMM (%.2f TFLOP/s done) |\n",
           c->prefill_tokens, c->chunk, prefill, 100 * pf_flops / f16, pf_flops / 1e12);
    printf("| ingest %d tokens, pot %d -> %d (snapkv) | %.0f | %.1f %% | f16 GEMM; compression %.1f %% of the time |\n",
           c->ingest_tokens, c->budget, c->keep, ingest,
           100 * ingest * token_flops(m, c->budget * 0.75) / f16, 100 * share);
    printf("| decode batch 1, %d keys | %.1f | %.1f %% | HBM (%.1f GB/s read) |\n", c->decode_ctx, dec1,
           100 * bps1 / bw, bps1 / 1e9);
    printf("| decode batch 16, %d keys | %.1f | %.1f %% | HBM (%.1f GB/s read) |\n", c->decode_ctx, dec16,
           100 * bps16 / bw, bps16 / 1e9);
    printf("\nweights %.1f MB (%s), %llu decode graphs captured, %llu replays\n", weight_bytes(m) / 1e6,
           quant_type_name(m->main_type), (unsigned long long)caps, (unsigned long long)reps);
    b->free(b);
    model_free(m);
    return 0;
}
