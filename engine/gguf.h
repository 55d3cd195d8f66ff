/* GGUF reader (private to engine/): maps a file, validates every header field,
 * metadata value and tensor descriptor against the file before anything uses
 * them, and gives read-only views into the mapping. Nothing here allocates per
 * lookup; strings are (pointer, length) views, not NUL-terminated. */
#ifndef POTSERVE_GGUF_H
#define POTSERVE_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_value_type {
    GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3,
    GGUF_UINT32 = 4, GGUF_INT32 = 5, GGUF_FLOAT32 = 6, GGUF_BOOL = 7,
    GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
    GGUF_FLOAT64 = 12,
};

typedef struct gguf_str {
    const char *ptr; /* points into the mapping; not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;           /* enum gguf_value_type */
    /* scalars (numbers are widened; check `type` for the original) */
    uint64_t u;
    int64_t i;
    double f;
    gguf_str s;              /* GGUF_STRING */
    /* arrays */
    uint32_t arr_type;       /* element type (never GGUF_ARRAY: nested arrays are rejected) */
    uint64_t arr_n;          /* element count */
    const uint8_t *arr_data; /* numeric elements, little-endian, packed */
    gguf_str *arr_str;       /* string elements (owned by the gguf_file) */
} gguf_kv;

enum { GGUF_MAX_DIMS = 4 };

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    uint32_t type;              /* enum ggml_type (engine/quant.h) */
    uint64_t offset;            /* relative to the data section */
    uint64_t nbytes;
    const void *data;           /* inside the mapping, validated to lie within the file */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t version;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    uint64_t alignment;
    const uint8_t *base; /* whole file */
    size_t size;
    int mapped;          /* 1: base is an mmap we unmap on close */
} gguf_file;

/* Maps and validates the file at `path`. On failure returns NULL and writes one
 * line naming the problem into err. The caller owns the result (gguf_close). */
gguf_file *gguf_open(const char *path, char *err, size_t errlen);

/* Validates a GGUF image already in memory (used by gguf_open and the fuzzer).
 * `data` must outlive the result; the result does not free it. */
gguf_file *gguf_parse(const void *data, size_t size, char *err, size_t errlen);

/* Tells a mapped file that bytes [p, p + n) will not be read again soon: the
 * whole pages among them leave resident memory (they are read back from the
 * file if touched). Nothing happens for an image the caller owns. */
void gguf_release(const gguf_file *f, const void *p, size_t n);

/* Releases everything gguf_open/gguf_parse returned (NULL is fine). */
void gguf_close(gguf_file *f);

/* Lookups: NULL when absent. The results point into `f`. */
const gguf_kv *gguf_find(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: return 0 and store the value when the key exists with a
 * compatible type (any integer type for ints, f32/f64 for floats), else -1. */
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
int gguf_get_f64(const gguf_file *f, const char *key, double *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* Copies a string value into buf as a NUL-terminated string (truncated to cap-1). */
int gguf_get_cstr(const gguf_file *f, const char *key, char *buf, size_t cap);

/* Numeric array element i as double / int64 (caller checks i < arr_n). */
double gguf_arr_f64(const gguf_kv *kv, uint64_t i);
int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i);

/* 1 if s equals the NUL-terminated c. */
int gguf_str_eq(gguf_str s, const char *c);

#endif
