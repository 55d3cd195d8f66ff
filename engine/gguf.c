/* GGUF reader: every count, length, offset and shape is checked against the
 * bytes actually present before it is used, so a hostile file yields one
 * error line, never a read outside the mapping or an overflowed allocation. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"

#define GGUF_MAGIC "GGUF"
enum {
    GGUF_DEFAULT_ALIGNMENT = 32,
    GGUF_MAX_KEY_LEN = 65535,       /* generous: real keys are < 100 bytes */
    GGUF_MAX_NAME_LEN = 65535,
};

typedef struct reader {
    const uint8_t *p;
    size_t size;
    size_t off;
    char *err;
    size_t errlen;
} reader;

static int fail(reader *r, const char *fmt, ...) {
    if (r->err && r->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int need(reader *r, uint64_t n, const char *what) {
    if (n > r->size - r->off)
        return fail(r, "gguf: truncated file: %s at byte %zu needs %llu bytes, %zu left", what,
                    r->off, (unsigned long long)n, r->size - r->off);
    return 0;
}

static int read_bytes(reader *r, void *dst, size_t n, const char *what) {
    if (need(r, n, what)) return -1;
    memcpy(dst, r->p + r->off, n);
    r->off += n;
    return 0;
}

static int read_u32(reader *r, uint32_t *v, const char *what) { return read_bytes(r, v, 4, what); }
static int read_u64(reader *r, uint64_t *v, const char *what) { return read_bytes(r, v, 8, what); }

static int read_str(reader *r, gguf_str *s, uint64_t max_len, const char *what) {
    uint64_t len;
    if (read_u64(r, &len, what)) return -1;
    if (len > max_len) return fail(r, "gguf: %s length %llu is absurd", what, (unsigned long long)len);
    if (need(r, len, what)) return -1;
    s->ptr = (const char *)r->p + r->off;
    s->len = len;
    r->off += len;
    return 0;
}

/* Size in bytes of one scalar of a non-string, non-array type; 0 otherwise. */
static size_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
    case GGUF_UINT16: case GGUF_INT16: return 2;
    case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
    case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static void decode_scalar(uint32_t t, const uint8_t *src, uint64_t *u, int64_t *i, double *f) {
    uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
    uint64_t u64; int64_t i64; float f32; double f64;
    switch (t) {
    case GGUF_UINT8: case GGUF_BOOL: memcpy(&u8, src, 1); *u = u8; *i = u8; *f = u8; break;
    case GGUF_INT8: memcpy(&i8, src, 1); *u = (uint64_t)i8; *i = i8; *f = i8; break;
    case GGUF_UINT16: memcpy(&u16, src, 2); *u = u16; *i = u16; *f = u16; break;
    case GGUF_INT16: memcpy(&i16, src, 2); *u = (uint64_t)i16; *i = i16; *f = i16; break;
    case GGUF_UINT32: memcpy(&u32, src, 4); *u = u32; *i = u32; *f = u32; break;
    case GGUF_INT32: memcpy(&i32, src, 4); *u = (uint64_t)i32; *i = i32; *f = i32; break;
    case GGUF_UINT64: memcpy(&u64, src, 8); *u = u64; *i = (int64_t)u64; *f = (double)u64; break;
    case GGUF_INT64: memcpy(&i64, src, 8); *u = (uint64_t)i64; *i = i64; *f = (double)i64; break;
    case GGUF_FLOAT32: memcpy(&f32, src, 4); *f = f32; break;
    case GGUF_FLOAT64: memcpy(&f64, src, 8); *f = f64; break;
    default: *u = 0; *i = 0; *f = 0; break;
    }
    if (t == GGUF_FLOAT32 || t == GGUF_FLOAT64) {
        /* integer views of a float only where they are representable (NaN, huge -> 0) */
        *i = *f >= -9.2e18 && *f <= 9.2e18 ? (int64_t)*f : 0;
        *u = (uint64_t)*i;
    }
}

static int read_value(reader *r, gguf_kv *kv) {
    char what[96];
    snprintf(what, sizeof what, "value of '%.*s'", (int)(kv->key.len > 60 ? 60 : kv->key.len),
             kv->key.ptr);
    if (kv->type == GGUF_STRING) return read_str(r, &kv->s, r->size, what);
    if (kv->type == GGUF_ARRAY) {
        if (read_u32(r, &kv->arr_type, what) || read_u64(r, &kv->arr_n, what)) return -1;
        if (kv->arr_type == GGUF_STRING) {
            /* each string needs at least its 8-byte length */
            if (kv->arr_n > (r->size - r->off) / 8)
                return fail(r, "gguf: %s: array of %llu strings cannot fit in the file", what,
                            (unsigned long long)kv->arr_n);
            kv->arr_str = calloc(kv->arr_n ? kv->arr_n : 1, sizeof *kv->arr_str);
            if (!kv->arr_str) return fail(r, "gguf: out of memory for %s", what);
            for (uint64_t j = 0; j < kv->arr_n; j++)
                if (read_str(r, &kv->arr_str[j], r->size, what)) return -1;
            return 0;
        }
        size_t es = scalar_size(kv->arr_type);
        if (!es) return fail(r, "gguf: %s: array element type %u is invalid", what, kv->arr_type);
        if (kv->arr_n > (r->size - r->off) / es)
            return fail(r, "gguf: %s: array of %llu elements runs past the end of the file", what,
                        (unsigned long long)kv->arr_n);
        kv->arr_data = r->p + r->off;
        r->off += (size_t)kv->arr_n * es;
        return 0;
    }
    size_t es = scalar_size(kv->type);
    if (!es) return fail(r, "gguf: %s: value type %u is invalid", what, kv->type);
    if (need(r, es, what)) return -1;
    decode_scalar(kv->type, r->p + r->off, &kv->u, &kv->i, &kv->f);
    if (kv->type == GGUF_BOOL && kv->u > 1)
        return fail(r, "gguf: %s: bool value %llu is not 0 or 1", what, (unsigned long long)kv->u);
    r->off += es;
    return 0;
}

static int read_tensor_info(reader *r, gguf_tensor *t, uint64_t idx) {
    char what[64];
    snprintf(what, sizeof what, "tensor #%llu", (unsigned long long)idx);
    if (read_str(r, &t->name, GGUF_MAX_NAME_LEN, what) || read_u32(r, &t->n_dims, what)) return -1;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return fail(r, "gguf: tensor '%.*s' has %u dimensions (1..%d allowed)", (int)t->name.len,
                    t->name.ptr, t->n_dims, GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (read_u64(r, &t->ne[d], what)) return -1;
        if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 40) || n_elems > UINT64_MAX / t->ne[d])
            return fail(r, "gguf: tensor '%.*s' has invalid dimension %u = %llu", (int)t->name.len,
                        t->name.ptr, d, (unsigned long long)t->ne[d]);
        n_elems *= t->ne[d];
    }
    if (n_elems > ((uint64_t)1 << 40))
        return fail(r, "gguf: tensor '%.*s' has an absurd element count", (int)t->name.len,
                    t->name.ptr);
    if (read_u32(r, &t->type, what) || read_u64(r, &t->offset, what)) return -1;
    if (!quant_block_elems(t->type))
        return fail(r, "gguf: tensor '%.*s' has unknown type %u", (int)t->name.len, t->name.ptr,
                    t->type);
    size_t row = quant_row_bytes(t->type, t->ne[0]);
    if (!row)
        return fail(r, "gguf: tensor '%.*s': row of %llu elements is not a whole number of %s blocks",
                    (int)t->name.len, t->name.ptr, (unsigned long long)t->ne[0],
                    quant_type_name(t->type));
    uint64_t rows = n_elems / t->ne[0];
    if (rows > UINT64_MAX / row)
        return fail(r, "gguf: tensor '%.*s' size overflows", (int)t->name.len, t->name.ptr);
    t->nbytes = rows * row;
    return 0;
}

static int cmp_str_ptr(const void *a, const void *b) {
    const gguf_str *x = *(const gguf_str *const *)a, *y = *(const gguf_str *const *)b;
    size_t n = x->len < y->len ? (size_t)x->len : (size_t)y->len;
    int c = memcmp(x->ptr, y->ptr, n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* Fails on two equal names among n strings laid out `stride` bytes apart
 * (sorting, so a hostile file with millions of entries stays O(n log n)). */
static int check_unique(reader *r, const gguf_str *first, size_t stride, uint64_t n,
                        const char *what) {
    if (n < 2) return 0;
    const gguf_str **v = malloc(n * sizeof *v);
    if (!v) return fail(r, "gguf: out of memory");
    for (uint64_t i = 0; i < n; i++) v[i] = (const gguf_str *)((const char *)first + i * stride);
    qsort(v, n, sizeof *v, cmp_str_ptr);
    int rc = 0;
    for (uint64_t i = 1; i < n && !rc; i++)
        if (!cmp_str_ptr(&v[i - 1], &v[i]))
            rc = fail(r, "gguf: duplicate %s '%.*s'", what, (int)(v[i]->len > 80 ? 80 : v[i]->len),
                      v[i]->ptr);
    free(v);
    return rc;
}

void gguf_release(const gguf_file *f, const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p, e = a + n;
    const uintptr_t lo = (a + page - 1) & ~(page - 1), hi = e & ~(page - 1);
    if (!f || !f->mapped || a < (uintptr_t)f->base || e > (uintptr_t)f->base + f->size || hi <= lo) return;
    madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) free(f->kv[i].arr_str);
    free(f->kv);
    free(f->tensors);
    if (f->mapped && f->base) munmap((void *)f->base, f->size);
    free(f);
}

gguf_file *gguf_parse(const void *data, size_t size, char *err, size_t errlen) {
    reader r = {.p = data, .size = size, .off = 0, .err = err, .errlen = errlen};
    if (err && errlen) err[0] = 0;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        fail(&r, "gguf: out of memory");
        return NULL;
    }
    f->base = data;
    f->size = size;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;

    char magic[4];
    if (read_bytes(&r, magic, 4, "magic")) goto bad;
    if (memcmp(magic, GGUF_MAGIC, 4) != 0) {
        fail(&r, "gguf: not a GGUF file (bad magic)");
        goto bad;
    }
    if (read_u32(&r, &f->version, "version")) goto bad;
    if (f->version != 2 && f->version != 3) {
        fail(&r, "gguf: unsupported version %u (2 and 3 are supported)", f->version);
        goto bad;
    }
    if (read_u64(&r, &f->n_tensors, "tensor count") || read_u64(&r, &f->n_kv, "metadata count"))
        goto bad;
    /* every metadata entry needs >= 12 bytes (key length + type), every tensor >= 28 */
    if (f->n_kv > (size - r.off) / 12 || f->n_tensors > (size - r.off) / 28) {
        fail(&r, "gguf: absurd counts (%llu metadata entries, %llu tensors) for a %zu-byte file",
             (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors, size);
        goto bad;
    }
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) {
        fail(&r, "gguf: out of memory");
        goto bad;
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        if (read_str(&r, &kv->key, GGUF_MAX_KEY_LEN, "metadata key") ||
            read_u32(&r, &kv->type, "metadata type") || read_value(&r, kv))
            goto bad;
    }
    if (check_unique(&r, &f->kv[0].key, sizeof(gguf_kv), f->n_kv, "metadata key")) goto bad;
    const gguf_kv *al = gguf_find(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_UINT32 || al->u == 0 || (al->u & (al->u - 1)) || al->u > 65536) {
            fail(&r, "gguf: general.alignment must be a power of two (u32), got %llu",
                 (unsigned long long)al->u);
            goto bad;
        }
        f->alignment = al->u;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (read_tensor_info(&r, &f->tensors[i], i)) goto bad;

    size_t data_start = (r.off + f->alignment - 1) / f->alignment * f->alignment;
    if (f->n_tensors && data_start > size) {
        fail(&r, "gguf: tensor data section starts past the end of the file");
        goto bad;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment) {
            fail(&r, "gguf: tensor '%.*s' offset %llu is not aligned to %llu", (int)t->name.len,
                 t->name.ptr, (unsigned long long)t->offset, (unsigned long long)f->alignment);
            goto bad;
        }
        if (t->offset > size - data_start || t->nbytes > size - data_start - t->offset) {
            fail(&r, "gguf: tensor '%.*s' (%llu bytes at offset %llu) lies past the end of the file",
                 (int)t->name.len, t->name.ptr, (unsigned long long)t->nbytes,
                 (unsigned long long)t->offset);
            goto bad;
        }
        t->data = f->base + data_start + t->offset;
    }
    if (f->n_tensors &&
        check_unique(&r, &f->tensors[0].name, sizeof(gguf_tensor), f->n_tensors, "tensor name"))
        goto bad;
    return f;
bad:
    f->mapped = 0; /* the caller owns `data` */
    gguf_close(f);
    return NULL;
}

gguf_file *gguf_open(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* (a FIFO would block the open until a writer came) */
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s is not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size < 8) {
        snprintf(err, errlen, "%s: gguf: truncated file (%lld bytes)", path, (long long)st.st_size);
        close(fd);
        return NULL;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
        return NULL;
    }
    char e[512];
    gguf_file *f = gguf_parse(m, (size_t)st.st_size, e, sizeof e);
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, e);
        munmap(m, (size_t)st.st_size);
        return NULL;
    }
    f->mapped = 1;
    return f;
}

int gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

static int is_int_type(uint32_t t) {
    return t == GGUF_UINT8 || t == GGUF_INT8 || t == GGUF_UINT16 || t == GGUF_INT16 ||
           t == GGUF_UINT32 || t == GGUF_INT32 || t == GGUF_UINT64 || t == GGUF_INT64;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || !is_int_type(kv->type) || kv->i < 0) return -1;
    *out = kv->u;
    return 0;
}

int gguf_get_f64(const gguf_file *f, const char *key, double *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || (kv->type != GGUF_FLOAT32 && kv->type != GGUF_FLOAT64)) return -1;
    *out = kv->f;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_BOOL) return -1;
    *out = (int)kv->u;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_STRING) return -1;
    *out = kv->s;
    return 0;
}

int gguf_get_cstr(const gguf_file *f, const char *key, char *buf, size_t cap) {
    gguf_str s;
    if (cap == 0 || gguf_get_str(f, key, &s)) return -1;
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(buf, s.ptr, n);
    buf[n] = 0;
    return 0;
}

double gguf_arr_f64(const gguf_kv *kv, uint64_t i) {
    uint64_t u; int64_t v; double f;
    decode_scalar(kv->arr_type, kv->arr_data + i * scalar_size(kv->arr_type), &u, &v, &f);
    return f;
}

int64_t gguf_arr_i64(const gguf_kv *kv, uint64_t i) {
    uint64_t u; int64_t v; double f;
    decode_scalar(kv->arr_type, kv->arr_data + i * scalar_size(kv->arr_type), &u, &v, &f);
    return v;
}
