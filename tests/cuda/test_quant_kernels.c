/* Embedding lookup and decode matrix-vector products reading GGUF blocks
 * directly, against engine/quant.c: embeddings bit for bit, dot products to
 * float rounding. Tables hold random quants and sane random scales. */
#include "cuda/kernels.h"
#include "engine/quant.h"
#include "tests/cuda/cuda_test.h"

static const uint32_t TYPES[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16,
                                 GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0};

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
                uint16_t d = quant_f32_to_f16(rng_float(g, 0.001f, 0.1f));
                memcpy(row + b, &d, 2);
                if (type == GGML_TYPE_Q4_1) {
                    uint16_t m_ = quant_f32_to_f16(rng_float(g, -0.5f, 0.5f));
                    memcpy(row + b + 2, &m_, 2);
                }
            }
    }
    return m;
}

TEST(cuda_embed_rows_bit_identical) {
    test_rng g = {21};
    int64_t dims[] = {32, 96, 576};
    int64_t token_counts[] = {1, 7, 33};
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++)
        for (size_t c = 0; c < 3; c++) {
            uint32_t type = TYPES[t];
            int64_t n_embd = dims[c], vocab = 50, nt = token_counts[c];
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
    CHECK(!cuda_weight_type_supported(GGML_TYPE_Q4_K));
    CHECK_EQ_INT(cuda_embed_rows(NULL, NULL, GGML_TYPE_Q4_K, 144, 256, NULL, 1, 0), cudaErrorInvalidValue);
}

TEST(cuda_matvec_matches_quant_dot_row) {
    test_rng g = {22};
    struct {
        int64_t rows, cols, n_x;
    } cases[] = {{1, 32, 1}, {5, 96, 3}, {67, 576, 4}, {13, 1536, 5}, {3, 64, 9}, {129, 160, 2}, {7, 128, 17}};
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int odd = 0; odd < 2; odd++) {
                uint32_t type = TYPES[t];
                int64_t rows = cases[c].rows, cols = cases[c].cols + (odd ? 7 : 0), nx = cases[c].n_x;
                if (odd && quant_block_elems(type) > 1) continue; /* blocks need whole multiples of 32 */
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
