/* Embedding lookup, dequantisation and decode matrix-vector products reading
 * GGUF blocks directly, for every weight type engine/quant.c reads, against
 * engine/quant.c: embeddings and dequantised rows bit for bit, dot products
 * to float rounding. Tables hold random quants and sane random scales. */
#include "cuda/kernels.h"
#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/cuda/cuda_test.h"

static const uint32_t TYPES[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                                 GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                                 GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
enum { N_TYPES = sizeof TYPES / sizeof TYPES[0] };

/* Where a block keeps its f16 scales (d, then dmin or m): random bytes there
 * could be NaN or huge. */
static void scale_offsets(uint32_t type, int *d, int *m) {
    *m = -1;
    switch (type) {
    case GGML_TYPE_Q4_1:
    case GGML_TYPE_Q5_1:
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_Q5_K: *d = 0, *m = 2; return;
    case GGML_TYPE_Q2_K: *d = 80, *m = 82; return;
    case GGML_TYPE_Q3_K: *d = 108; return;
    case GGML_TYPE_Q6_K: *d = 208; return;
    default: *d = 0; return;
    }
}

/* rows x cols of `type` with random contents; scales are finite halves. */
static uint8_t *random_matrix(test_rng *g, uint32_t type, int64_t rows, int64_t cols, size_t *row_bytes) {
    *row_bytes = quant_row_bytes(type, (uint64_t)cols);
    uint8_t *m = malloc(*row_bytes * rows);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = m + *row_bytes * r;
        for (size_t i = 0; i < *row_bytes; i++) row[i] = (uint8_t)rng_u32(g);
        if (type == GGML_TYPE_F32)
            rng_fill(g, (float *)row, cols, -1, 1);
        else if (type == GGML_TYPE_F16 || type == GGML_TYPE_BF16)
            for (int64_t i = 0; i < cols; i++) {
                float f = rng_float(g, -1, 1);
                uint16_t h = type == GGML_TYPE_F16 ? quant_f32_to_f16(f) : quant_f32_to_bf16(f);
                memcpy(row + 2 * i, &h, 2);
            }
        else
            for (size_t b = 0; b < *row_bytes; b += quant_block_bytes(type)) {
                int od, om;
                scale_offsets(type, &od, &om);
                uint16_t d = quant_f32_to_f16(rng_float(g, 0.001f, 0.1f));
                memcpy(row + b + od, &d, 2);
                if (om >= 0) {
                    uint16_t m_ = quant_f32_to_f16(rng_float(g, -0.5f, 0.5f));
                    memcpy(row + b + om, &m_, 2);
                }
            }
    }
    return m;
}

TEST(cuda_embed_rows_bit_identical) {
    test_rng g = {21};
    int64_t dims[] = {32, 96, 576, 256, 1280};
    int64_t token_counts[] = {1, 7, 33, 5, 3};
    for (size_t t = 0; t < N_TYPES; t++)
        for (size_t c = 0; c < 5; c++) {
            uint32_t type = TYPES[t];
            int64_t n_embd = dims[c], vocab = 50, nt = token_counts[c];
            if (n_embd % quant_block_elems(type)) continue;
            size_t rb;
            uint8_t *table = random_matrix(&g, type, vocab, n_embd, &rb);
            int32_t tokens[33];
            for (int64_t i = 0; i < nt; i++) tokens[i] = (int32_t)(rng_u32(&g) % vocab);
            float *got = malloc(nt * n_embd * 4), *want = malloc(nt * n_embd * 4);
            void *dtab = dev_from(table, rb * vocab);
            int32_t *dtok = dev_from(tokens, nt * 4);
            float *dout = dev_alloc(nt * n_embd * 4);
            CHECK(cuda_weight_type_supported(type));
            CHECK_CUDA(cuda_embed_rows(dout, dtab, type, rb, n_embd, dtok, nt, 0));
            host_from(got, dout, nt * n_embd * 4);
            for (int64_t i = 0; i < nt; i++) quant_dequantize_row(type, table + rb * tokens[i], want + i * n_embd, n_embd);
            if (memcmp(got, want, nt * n_embd * 4)) fprintf(stderr, "  embed %s n_embd %lld differs\n", quant_type_name(type), (long long)n_embd);
            CHECK(!memcmp(got, want, nt * n_embd * 4));
            cudaFree(dtab), cudaFree(dtok), cudaFree(dout);
            free(table), free(got), free(want);
        }
    /* types the CPU cannot read either, and rows that are not whole blocks */
    CHECK(!cuda_weight_type_supported(GGML_TYPE_Q8_K));
    CHECK(!cuda_weight_type_supported(GGML_TYPE_Q8_1));
    CHECK_EQ_INT(cuda_embed_rows(NULL, NULL, GGML_TYPE_Q8_K, 292, 256, NULL, 1, 0), cudaErrorInvalidValue);
    CHECK_EQ_INT(cuda_embed_rows(NULL, NULL, GGML_TYPE_Q4_K, 144, 96, NULL, 1, 0), cudaErrorInvalidValue);
    CHECK_EQ_INT(cuda_matvec(NULL, NULL, GGML_TYPE_Q6_K, 210, 1, 288, NULL, 1, 0), cudaErrorInvalidValue);
    CHECK_EQ_INT(cuda_dequantize_rows(NULL, NULL, GGML_TYPE_Q5_0, 22, 1, 48, 0), cudaErrorInvalidValue);
}

/* The prefill GEMMs' operand: whole matrices to f32 bit for bit, and to f16
 * as those f32 values rounded to nearest even. */
TEST(cuda_dequantize_rows_bit_identical) {
    test_rng g = {23};
    int64_t shapes[][2] = {{3, 256}, {17, 512}, {5, 1536}, {2, 32}, {9, 96}, {4, 13}};
    for (size_t t = 0; t < N_TYPES; t++)
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
            uint32_t type = TYPES[t];
            int64_t rows = shapes[c][0], cols = shapes[c][1];
            if (cols % quant_block_elems(type)) continue;
            size_t rb, n = (size_t)(rows * cols);
            uint8_t *w = random_matrix(&g, type, rows, cols, &rb);
            float *want = malloc(n * 4), *got = malloc(n * 4);
            uint16_t *got_h = malloc(n * 2);
            for (int64_t r = 0; r < rows; r++) quant_dequantize_row(type, w + rb * r, want + r * cols, cols);
            void *dw = dev_from(w, rb * rows), *dh = dev_alloc(n * 2);
            float *dout = dev_alloc(n * 4);
            CHECK_CUDA(cuda_dequantize_rows(dout, dw, type, rb, rows, cols, 0));
            CHECK_CUDA(cuda_dequantize_rows_f16(dh, dw, type, rb, rows, cols, 0));
            host_from(got, dout, n * 4);
            host_from(got_h, dh, n * 2);
            int bad = 0;
            for (size_t i = 0; i < n; i++) bad += memcmp(&got[i], &want[i], 4) || got_h[i] != quant_f32_to_f16(want[i]);
            if (bad) fprintf(stderr, "  dequantize %s %lldx%lld: %d values differ\n", quant_type_name(type),
                             (long long)rows, (long long)cols, bad);
            CHECK_EQ_INT(bad, 0);
            cudaFree(dw), cudaFree(dh), cudaFree(dout);
            free(w), free(want), free(got), free(got_h);
        }
}

TEST(cuda_matvec_matches_quant_dot_row) {
    test_rng g = {22};
    struct {
        int64_t rows, cols, n_x;
    } cases[] = {{1, 32, 1}, {5, 96, 3}, {67, 576, 4}, {13, 1536, 5}, {3, 64, 9}, {129, 160, 2}, {7, 128, 17},
                 {9, 256, 3}, {33, 768, 8}, {6, 2560, 1}};
    for (size_t t = 0; t < N_TYPES; t++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int odd = 0; odd < 2; odd++) {
                uint32_t type = TYPES[t];
                int64_t rows = cases[c].rows, cols = cases[c].cols + (odd ? 7 : 0), nx = cases[c].n_x;
                if (cols % quant_block_elems(type)) continue; /* quantised rows are whole blocks */
                size_t rb;
                uint8_t *w = random_matrix(&g, type, rows, cols, &rb);
                float *x = malloc(nx * cols * 4), *got = malloc(nx * rows * 4), *want = malloc(nx * rows * 4),
                      *tol = malloc(nx * rows * 4), *deq = malloc(cols * 4);
                rng_fill(&g, x, nx * cols, -1, 1);
                for (int64_t r = 0; r < rows; r++) {
                    quant_dequantize_row(type, w + rb * r, deq, cols);
                    for (int64_t i = 0; i < nx; i++) {
                        want[i * rows + r] = quant_dot_row(type, w + rb * r, x + i * cols, cols);
                        double mag = 0;
                        for (int64_t j = 0; j < cols; j++) mag += fabs((double)deq[j] * x[i * cols + j]);
                        tol[i * rows + r] = (float)(2e-6 * mag + 1e-6);
                    }
                }
                void *dw = dev_from(w, rb * rows);
                float *dx = dev_from(x, nx * cols * 4), *dy = dev_alloc(nx * rows * 4);
                CHECK_CUDA(cuda_matvec(dy, dw, type, rb, rows, cols, dx, nx, 0));
                host_from(got, dy, nx * rows * 4);
                int bad = 0;
                for (int64_t i = 0; i < nx * rows; i++)
                    if (!(fabsf(got[i] - want[i]) <= tol[i])) {
                        if (bad++ < 3) fprintf(stderr, "  matvec %s %lldx%lld: y[%lld] = %g, expected %g\n", quant_type_name(type),
                                (long long)rows, (long long)cols, (long long)i, got[i], want[i]);
                    }
                CHECK_EQ_INT(bad, 0);
                cudaFree(dw), cudaFree(dx), cudaFree(dy);
                free(w), free(x), free(got), free(want), free(tol), free(deq);
            }
}

/* Against an independent reference: the quant_<TYPE>.gguf fixtures hold, for
 * every type the CPU backend reads, tensors (real and random blocks, and
 * edge-case scales: zeros, subnormals, the largest half, negatives) with
 * NAME.expected dequantised by gguf-py. The CUDA dequantisation must equal
 * it bit for bit (any NaN equals any NaN), and no CPU type may be refused. */
TEST(cuda_dequantize_matches_gguf_fixtures) {
    int files = 0;
    for (uint32_t type = 0; type < GGML_TYPE_COUNT_; type++) {
        if (!quant_type_supported(type)) continue;
        CHECK(cuda_weight_type_supported(type));
        char fname[64], err[256];
        snprintf(fname, sizeof fname, "quant_%s.gguf", quant_type_name(type));
        gguf_file *f = gguf_open(test_fixture(fname), err, sizeof err);
        if (!f) fprintf(stderr, "  %s: %s (make fixtures)\n", fname, err);
        CHECK(f != NULL);
        if (!f) continue;
        files++;
        for (uint64_t ti = 0; ti < f->n_tensors; ti++) {
            const gguf_tensor *t = &f->tensors[ti];
            char name[200], ename[256];
            snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
            snprintf(ename, sizeof ename, "%s.expected", name);
            const gguf_tensor *e = gguf_find_tensor(f, ename);
            if (t->type != type || !e) continue; /* the .expected tensors and conversion tables */
            int64_t cols = (int64_t)t->ne[0], rows = (int64_t)(t->nbytes / quant_row_bytes(type, t->ne[0]));
            size_t n = (size_t)(rows * cols);
            float *got = malloc(n * 4);
            void *dw = dev_from(t->data, t->nbytes);
            float *dout = dev_alloc(n * 4);
            CHECK_CUDA(cuda_dequantize_rows(dout, dw, type, quant_row_bytes(type, t->ne[0]), rows, cols, 0));
            host_from(got, dout, n * 4);
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                float want;
                memcpy(&want, (const uint8_t *)e->data + 4 * i, 4);
                if (isnan(want) || isnan(got[i]) ? !(isnan(want) && isnan(got[i])) : memcmp(&want, &got[i], 4) != 0)
                    if (bad++ < 3) fprintf(stderr, "  %s %s [%zu]: %.9g, expected %.9g\n", fname, name, i, got[i], want);
            }
            CHECK_EQ_INT(bad, 0);
            cudaFree(dw), cudaFree(dout);
            free(got);
        }
        gguf_close(f);
    }
    CHECK(files >= 13);
}

/* The GEMMs' f16 activations: round to nearest even as quant_f32_to_f16, bit for bit, over odd
 * lengths and the values where rounding is hard: ties, the subnormal range, overflow to infinity,
 * signed zeros and infinities (the CUDA toolkit's __float2half_rn against engine/quant.c). */
TEST(cuda_f32_to_f16_bit_identical) {
    test_rng g = {29};
    static const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e9f,
                                 6.1035156e-05f, 6.0975552e-05f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
                                 1.0e-10f, 1.0009765625f, 1.00048828125f, 1.00146484375f, 2049.0f, 2051.0f,
                                 INFINITY, -INFINITY};
    enum { N_EDGE = sizeof edge / sizeof edge[0] };
    static const int64_t lengths[] = {1, 7, 33, 1000, 4099};
    for (int li = 0; li < 5; li++) {
        int64_t n = lengths[li] + N_EDGE;
        float *x = malloc((size_t)n * sizeof *x);
        uint16_t *want = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
        memcpy(x, edge, sizeof edge);
        for (int64_t i = N_EDGE; i < n; i++) /* magnitudes 2^-30 .. 2^17, either sign */
            x[i] = ldexpf(rng_float(&g, 1, 2), (int)(rng_u32(&g) % 48) - 30) * (rng_u32(&g) & 1 ? -1 : 1);
        for (int64_t i = 0; i < n; i++) want[i] = quant_f32_to_f16(x[i]);
        float *dx = dev_from(x, (size_t)n * sizeof *x);
        void *dout = dev_alloc((size_t)n * 2);
        CHECK_CUDA(cuda_f32_to_f16(dout, dx, n, 0));
        host_from(got, dout, (size_t)n * 2);
        for (int64_t i = 0; i < n; i++)
            if (got[i] != want[i]) {
                fprintf(stderr, "  n %lld: x[%lld] = %.9g gives 0x%04x, want 0x%04x\n", (long long)n, (long long)i,
                        (double)x[i], got[i], want[i]);
                test_failures++;
                break;
            }
        cudaFree(dx), cudaFree(dout);
        free(x), free(want), free(got);
    }
    CHECK(cuda_f32_to_f16(NULL, NULL, -1, 0) == cudaErrorInvalidValue);
    CHECK_CUDA(cuda_f32_to_f16(NULL, NULL, 0, 0));
}
