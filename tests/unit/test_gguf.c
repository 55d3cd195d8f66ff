/* GGUF reader: a valid image built here parses; every kind of damage and every
 * truncation gives an error line (never a crash or an out-of-bounds read,
 * which `make asan` would catch). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/quant.h"
#include "test.h"

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* Offsets of interesting fields in the image make_image writes. */
typedef struct layout {
    size_t n_tensors_at, n_kv_at, arr_n_at, dim0_at, type_at, offset_at;
} layout;

/* A small valid GGUF: three metadata values (string, u32, string array) and
 * two tensors (F32 [4, 2] and Q8_0 [32]). */
static buf make_image(layout *L) {
    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    L->n_tensors_at = b.n;
    put_u64(&b, 2);
    L->n_kv_at = b.n;
    put_u64(&b, 3);
    put_str(&b, "general.architecture");
    put_u32(&b, GGUF_STRING);
    put_str(&b, "llama");
    put_str(&b, "llama.block_count");
    put_u32(&b, GGUF_UINT32);
    put_u32(&b, 7);
    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, GGUF_STRING);
    L->arr_n_at = b.n;
    put_u64(&b, 2);
    put_str(&b, "a");
    put_str(&b, "bc");
    /* tensor 0: F32 [4, 2] at offset 0 */
    put_str(&b, "t0");
    put_u32(&b, 2);
    L->dim0_at = b.n;
    put_u64(&b, 4);
    put_u64(&b, 2);
    L->type_at = b.n;
    put_u32(&b, GGML_TYPE_F32);
    put_u64(&b, 0);
    /* tensor 1: Q8_0 [32] at offset 32 */
    put_str(&b, "t1");
    put_u32(&b, 1);
    put_u64(&b, 32);
    put_u32(&b, GGML_TYPE_Q8_0);
    L->offset_at = b.n;
    put_u64(&b, 32);
    while (b.n % 32) put(&b, "", 1);
    float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    put(&b, f, sizeof f);
    uint8_t q8[34] = {0x00, 0x3c}; /* scale 1.0 (f16), quants 0 */
    put(&b, q8, sizeof q8);
    return b;
}

static gguf_file *parse(const buf *b, char *err) { return gguf_parse(b->p, b->n, err, 256); }

TEST(gguf_parses_valid_image) {
    layout L;
    buf b = make_image(&L);
    char err[256];
    gguf_file *f = parse(&b, err);
    CHECK(f != NULL);
    if (!f) {
        fprintf(stderr, "  %s\n", err);
        free(b.p);
        return;
    }
    CHECK_EQ_INT(f->n_kv, 3);
    CHECK_EQ_INT(f->n_tensors, 2);
    char arch[16];
    CHECK_EQ_INT(gguf_get_cstr(f, "general.architecture", arch, sizeof arch), 0);
    CHECK_STR(arch, "llama");
    uint64_t v;
    CHECK_EQ_INT(gguf_get_u64(f, "llama.block_count", &v), 0);
    CHECK_EQ_INT(v, 7);
    CHECK(gguf_get_u64(f, "general.architecture", &v) == -1); /* wrong type */
    const gguf_kv *kv = gguf_find(f, "tokenizer.ggml.tokens");
    CHECK(kv && kv->arr_n == 2 && gguf_str_eq(kv->arr_str[1], "bc"));
    const gguf_tensor *t = gguf_find_tensor(f, "t0");
    CHECK(t && t->ne[0] == 4 && t->ne[1] == 2 && t->nbytes == 32);
    CHECK(t && ((const float *)t->data)[7] == 8.0f);
    t = gguf_find_tensor(f, "t1");
    CHECK(t && t->nbytes == 34);
    CHECK(gguf_find_tensor(f, "nope") == NULL);
    gguf_close(f);
    free(b.p);
}

TEST(gguf_rejects_every_truncation) {
    layout L;
    buf b = make_image(&L);
    char err[256];
    for (size_t n = 0; n < b.n; n++) {
        /* a fresh allocation of exactly n bytes, so ASan sees any read past it */
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, b.p, n);
        gguf_file *f = gguf_parse(copy, n, err, sizeof err);
        if (f) {
            fprintf(stderr, "  truncation to %zu bytes was accepted\n", n);
            test_failures++;
            gguf_close(f);
        } else if (!err[0] || strchr(err, '\n')) {
            fprintf(stderr, "  truncation to %zu: error is not one line: '%s'\n", n, err);
            test_failures++;
        }
        free(copy);
    }
    free(b.p);
}

/* Applies one mutation to a fresh valid image and expects an error containing `want`. */
static void expect_error(void (*mutate)(buf *, const layout *), const char *want) {
    layout L;
    buf b = make_image(&L);
    mutate(&b, &L);
    char err[256];
    gguf_file *f = parse(&b, err);
    if (f) {
        fprintf(stderr, "  mutation expecting '%s' was accepted\n", want);
        test_failures++;
        gguf_close(f);
    } else if (!strstr(err, want)) {
        fprintf(stderr, "  expected an error with '%s', got '%s'\n", want, err);
        test_failures++;
    }
    free(b.p);
}

static void set_u64(buf *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }
static void set_u32(buf *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }

static void m_magic(buf *b, const layout *L) { (void)L; memcpy(b->p, "GGUG", 4); }
static void m_version(buf *b, const layout *L) { (void)L; set_u32(b, 4, 99); }
static void m_tensor_count(buf *b, const layout *L) { set_u64(b, L->n_tensors_at, UINT64_MAX / 2); }
static void m_kv_count(buf *b, const layout *L) { set_u64(b, L->n_kv_at, 1ull << 40); }
static void m_array_count(buf *b, const layout *L) { set_u64(b, L->arr_n_at, 1ull << 60); }
static void m_dim_overflow(buf *b, const layout *L) { set_u64(b, L->dim0_at, 1ull << 62); }
static void m_dim_zero(buf *b, const layout *L) { set_u64(b, L->dim0_at, 0); }
static void m_type(buf *b, const layout *L) { set_u32(b, L->type_at, 1234); }
static void m_offset(buf *b, const layout *L) { set_u64(b, L->offset_at, 1ull << 20); }
static void m_unaligned(buf *b, const layout *L) { set_u64(b, L->offset_at, 33); }
static void m_row_blocks(buf *b, const layout *L) {
    set_u64(b, L->dim0_at, 3);
    set_u32(b, L->type_at, GGML_TYPE_Q8_0); /* 3 is not a multiple of Q8_0's 32 */
}
TEST(gguf_rejects_damaged_images) {
    expect_error(m_magic, "bad magic");
    expect_error(m_version, "unsupported version");
    expect_error(m_tensor_count, "absurd counts");
    expect_error(m_kv_count, "absurd counts");
    expect_error(m_array_count, "cannot fit");
    expect_error(m_dim_overflow, "invalid dimension");
    expect_error(m_dim_zero, "invalid dimension");
    expect_error(m_type, "unknown type");
    expect_error(m_offset, "past the end");
    expect_error(m_unaligned, "not aligned");
    expect_error(m_row_blocks, "whole number");
}

TEST(gguf_rejects_duplicate_names) {
    layout L;
    buf b = make_image(&L);
    /* rename tensor "t1" to "t0" */
    uint8_t *t1 = NULL;
    for (size_t i = 0; i + 2 <= b.n; i++)
        if (b.p[i] == 't' && b.p[i + 1] == '1') t1 = b.p + i;
    CHECK(t1 != NULL);
    if (t1) t1[1] = '0';
    char err[256];
    gguf_file *f = parse(&b, err);
    CHECK(f == NULL);
    CHECK(strstr(err, "duplicate tensor name") != NULL);
    gguf_close(f);
    free(b.p);
}

TEST(gguf_random_bytes_never_crash) {
    layout L;
    buf b = make_image(&L);
    uint64_t s = 12345;
    char err[256];
    for (int iter = 0; iter < 3000; iter++) {
        uint8_t *copy = malloc(b.n);
        memcpy(copy, b.p, b.n);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            copy[(s >> 33) % b.n] = (uint8_t)(s >> 13);
        }
        gguf_file *f = gguf_parse(copy, b.n, err, sizeof err);
        gguf_close(f); /* accepted or not, nothing may crash */
        free(copy);
    }
    free(b.p);
}

TEST(gguf_open_reports_missing_and_real_file) {
    char err[512];
    CHECK(gguf_open("/nonexistent/model.gguf", err, sizeof err) == NULL);
    CHECK(strstr(err, "cannot open") != NULL);
    CHECK(gguf_open("/", err, sizeof err) == NULL);
    const char *path = test_model_path();
    CHECK(path != NULL);
    if (!path) return;
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK(f != NULL);
    if (!f) return;
    CHECK_EQ_INT(f->n_tensors, 272);
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->type == GGML_TYPE_Q8_0 && t->ne[0] == 576 && t->ne[1] == 49152);
    gguf_close(f);
}
