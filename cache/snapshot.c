/* Pot snapshots: a pot, its session metadata and the caller's extra bytes in
 * one self-checking file.
 *
 * Layout of version 3 (written), every integer little-endian, no padding:
 *   0  magic "POTSNAP\0"          8 bytes
 *   8  format version (3)         u32
 *  12  model_fingerprint          u64
 *  20  log_offset                 u64
 *  28  n_layer, n_head_kv,        i32 x 3
 *      head_dim
 *  40  dtype (0 f16, 1 f32)       u32
 *  44  n, n_pinned                i32 x 2
 *  52  n_seen                     i64
 *  60  settings_len (< 1024)      u32
 *  64  extra_len (<= 2^30)        u64
 *  72  settings                   settings_len bytes, no NUL
 *      extra                      extra_len bytes, opaque here (a document's state: ingest.c)
 *  then for each layer, for each KV head, the n valid slots:
 *      K [n][head_dim] and V [n][head_dim] in the pot's dtype (IEEE half or
 *      single, little-endian), token_index i64[n], surprisal f32[n],
 *      score_acc f32[n], joins u8[n]
 *  then CRC-32C of every byte before it   u32
 * Version 2 (still read) is the same without joins (read as 0); version 1
 * also lacks extra_len and extra: a 64-byte header, then the settings.
 * The reader checks magic, version (a newer one is refused before anything
 * else is trusted), every count against sane bounds, the exact file size those
 * counts imply, and only then allocates; the checksum is verified before the
 * pot is handed out. */
#include "cache.h"
#include "common/common.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    SNAP_VERSION = 3,
    SNAP_FIRST_JOINS_VERSION = 3,
    SNAP_V1_HEADER_BYTES = 64,
    SNAP_HEADER_BYTES = 72, /* version 2: extra_len after the v1 fields */
    SNAP_MAX_LAYERS = 4096,
    SNAP_MAX_HEADS = 4096,
    SNAP_MAX_HEAD_DIM = 65536, /* pot_bytes' limit */
    SNAP_MAX_SLOTS = 1 << 26,
    SNAP_IO_BYTES = 1 << 20,
    SNAP_MAX_EXTRA = 1 << 30,
};
static const char snap_magic[8] = {'P', 'O', 'T', 'S', 'N', 'A', 'P', '\0'};

static int host_is_little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* Reverses the bytes of each of count elements of size elem (2, 4 or 8), in place: turns
 * host order into little-endian and back on a big-endian host. */
static void swap_elements(void *data, size_t count, size_t elem) {
    unsigned char *p = data;
    for (size_t i = 0; i < count; i++, p += elem)
        for (size_t a = 0, b = elem - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

static size_t dtype_bytes(enum pot_dtype t) { return t == POT_F32 ? 4 : 2; }

/* Bytes of one (layer, head)'s n slots in the file, 0 on overflow. */
static uint64_t slots_bytes(uint64_t n, uint64_t head_dim, size_t elem, int has_joins) {
    uint64_t per_slot = 2 * head_dim * elem + 8 + 4 + 4 + (has_joins ? 1 : 0);
    return n > UINT64_MAX / per_slot ? 0 : n * per_slot;
}

/* Total file size for a header's counts (header_bytes: 64 for version 1, 72
 * from 2, whose extra_len v1 files lack; joins from version 3); 0 when it overflows. */
static uint64_t snapshot_bytes(uint32_t header_bytes, int has_joins, int32_t n_layer, int32_t n_head_kv,
                               int32_t head_dim, enum pot_dtype dtype, int32_t n,
                               uint32_t settings_len, uint64_t extra_len) {
    uint64_t per_head = slots_bytes((uint64_t)n, (uint64_t)head_dim, dtype_bytes(dtype), has_joins);
    uint64_t heads = (uint64_t)n_layer * (uint64_t)n_head_kv, payload;
    if (n > 0 && per_head == 0) return 0;
    if (__builtin_mul_overflow(heads, per_head, &payload)) return 0;
    uint64_t fixed = header_bytes + (uint64_t)settings_len + extra_len + 4;
    return payload > UINT64_MAX - fixed ? 0 : payload + fixed;
}

/* ---- writing ------------------------------------------------------------------------- */

typedef struct snap_writer {
    int fd;
    uint32_t crc;
    unsigned char *buf;
    size_t len;
    int err; /* errno of the first failure, 0 while all is well */
} snap_writer;

static void write_all(snap_writer *w, const unsigned char *p, size_t len) {
    while (len && !w->err) {
        ssize_t k = write(w->fd, p, len);
        if (k < 0) {
            if (errno != EINTR) w->err = errno;
            continue;
        }
        if (k == 0) {
            w->err = EIO;
            break;
        }
        p += k;
        len -= (size_t)k;
    }
}

static void writer_flush(snap_writer *w) {
    write_all(w, w->buf, w->len);
    w->len = 0;
}

/* Appends len bytes (already little-endian) to the file and the checksum. */
static void put_bytes(snap_writer *w, const void *data, size_t len) {
    const unsigned char *p = data;
    w->crc = crc32c(w->crc, p, len);
    if (w->len + len > SNAP_IO_BYTES) writer_flush(w);
    if (len >= SNAP_IO_BYTES) {
        write_all(w, p, len);
        return;
    }
    memcpy(w->buf + w->len, p, len);
    w->len += len;
}

/* Appends count host-order elements of size elem as little-endian. */
static void put_array(snap_writer *w, const void *data, size_t count, size_t elem) {
    if (host_is_little_endian()) {
        put_bytes(w, data, count * elem);
        return;
    }
    unsigned char tmp[4096];
    const unsigned char *p = data;
    size_t per = sizeof tmp / elem;
    while (count) {
        size_t k = count < per ? count : per;
        memcpy(tmp, p, k * elem);
        swap_elements(tmp, k, elem);
        put_bytes(w, tmp, k * elem);
        p += k * elem;
        count -= k;
    }
}

/* The K/V rows (base: p->k or p->v) of (l, h)'s valid slots, in slot order:
 * one run, or row by row around a ring layer, whose overwritten slots (outside
 * every window, never attended) are written as zeros. */
static void put_kv_rows(snap_writer *w, const pot *p, const void *base, int32_t l, int32_t h) {
    size_t elem = dtype_bytes(p->dtype), row = (size_t)p->head_dim;
    if (!pot_ring_rows(p, l)) {
        put_array(w, (const char *)base + pot_row(p, l, h, 0) * row * elem, (size_t)p->n * row, elem);
        return;
    }
    static const unsigned char zeros[4 * 1024];
    for (int32_t s = 0; s < p->n; s++) {
        if (s >= p->ring_oldest[l]) {
            put_array(w, (const char *)base + pot_row(p, l, h, s) * row * elem, row, elem);
            continue;
        }
        for (size_t left = row, k; left; left -= k) put_array(w, zeros, k = left < 1024 ? left : 1024, elem);
    }
}

static int pot_shape_ok(const pot *p) {
    return p->n_layer >= 1 && p->n_layer <= SNAP_MAX_LAYERS && p->n_head_kv >= 1 &&
           p->n_head_kv <= SNAP_MAX_HEADS && p->head_dim >= 1 &&
           p->head_dim <= SNAP_MAX_HEAD_DIM && (p->dtype == POT_F16 || p->dtype == POT_F32) &&
           p->n >= 0 && p->n <= p->capacity && p->n <= SNAP_MAX_SLOTS && p->n_pinned >= 0 &&
           p->n_pinned <= p->n && p->n_seen >= 0;
}

/* Writes the whole snapshot to fd; 0 or an errno. */
static int write_contents(int fd, const pot *p, const pot_snapshot_meta *meta,
                          size_t settings_len, const void *extra, size_t extra_len) {
    snap_writer w = {fd, 0, malloc(SNAP_IO_BYTES), 0, 0};
    if (!w.buf) return ENOMEM;
    unsigned char h[SNAP_HEADER_BYTES];
    memcpy(h, snap_magic, 8);
    le_put_u32(h + 8, SNAP_VERSION);
    le_put_u64(h + 12, meta->model_fingerprint);
    le_put_u64(h + 20, meta->log_offset);
    le_put_u32(h + 28, (uint32_t)p->n_layer);
    le_put_u32(h + 32, (uint32_t)p->n_head_kv);
    le_put_u32(h + 36, (uint32_t)p->head_dim);
    le_put_u32(h + 40, (uint32_t)p->dtype);
    le_put_u32(h + 44, (uint32_t)p->n);
    le_put_u32(h + 48, (uint32_t)p->n_pinned);
    le_put_u64(h + 52, (uint64_t)p->n_seen);
    le_put_u32(h + 60, (uint32_t)settings_len);
    le_put_u64(h + 64, (uint64_t)extra_len);
    put_bytes(&w, h, sizeof h);
    put_bytes(&w, meta->settings, settings_len);
    if (extra_len) put_bytes(&w, extra, extra_len);
    size_t n = (size_t)p->n;
    for (int32_t l = 0; l < p->n_layer && !w.err; l++)
        for (int32_t hd = 0; hd < p->n_head_kv && !w.err; hd++) {
            size_t s = pot_slot(p, l, hd, 0);
            put_kv_rows(&w, p, p->k, l, hd);
            put_kv_rows(&w, p, p->v, l, hd);
            put_array(&w, p->token_index + s, n, sizeof *p->token_index);
            put_array(&w, p->surprisal + s, n, sizeof *p->surprisal);
            put_array(&w, p->score_acc + s, n, sizeof *p->score_acc);
            put_array(&w, p->joins + s, n, sizeof *p->joins);
        }
    unsigned char crc[4];
    le_put_u32(crc, w.crc);
    put_bytes(&w, crc, 4);
    writer_flush(&w);
    free(w.buf);
    return w.err;
}

int pot_snapshot_write(const char *path, const pot *p, const pot_snapshot_meta *meta, char *err,
                       size_t errlen) {
    return pot_snapshot_write_extra(path, p, meta, NULL, 0, err, errlen);
}

int pot_snapshot_write_extra(const char *path, const pot *p, const pot_snapshot_meta *meta,
                             const void *extra, size_t extra_len, char *err, size_t errlen) {
    if (!path || !*path || !p || !meta || (extra_len && !extra)) {
        snprintf(err, errlen, "snapshot: missing path, pot or metadata");
        return -1;
    }
    if (!pot_shape_ok(p)) {
        snprintf(err, errlen, "snapshot %s: pot shape out of range (%d layers, %d heads, dim %d, "
                 "n %d of %d, %d pinned)", path, p->n_layer, p->n_head_kv, p->head_dim, p->n,
                 p->capacity, p->n_pinned);
        return -1;
    }
    if (pot_host_sync(p)) { /* a device holds the K/V: the file needs them on the host */
        snprintf(err, errlen, "snapshot %s: cannot read the pot back from the device", path);
        return -1;
    }
    size_t settings_len = strnlen(meta->settings, sizeof meta->settings);
    if (settings_len == sizeof meta->settings) {
        snprintf(err, errlen, "snapshot %s: settings are not NUL-terminated", path);
        return -1;
    }
    if (extra_len > SNAP_MAX_EXTRA) {
        snprintf(err, errlen, "snapshot %s: %zu extra bytes exceed the limit of %d", path,
                 extra_len, SNAP_MAX_EXTRA);
        return -1;
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) {
        snprintf(err, errlen, "snapshot %s: out of memory", path);
        return -1;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    const char *stage = "create";
    int rc = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = errno;
    } else {
        stage = "write";
        rc = write_contents(fd, p, meta, settings_len, extra, extra_len);
        if (!rc) {
            stage = "fsync";
            if (fsync(fd) != 0) rc = errno;
        }
        if (close(fd) != 0 && !rc) {
            stage = "close";
            rc = errno;
        }
        if (!rc) {
            stage = "rename";
            if (rename(tmp, path) != 0) rc = errno;
        }
        if (rc) unlink(tmp);
    }
    if (!rc) {
        /* The new snapshot is in place; only its durability across a crash is in doubt. */
        stage = "fsync of the directory";
        rc = fsync_parent_dir(path);
    }
    free(tmp);
    if (rc) {
        snprintf(err, errlen, "snapshot %s: %s failed: %s", path, stage, strerror(rc));
        return -1;
    }
    return 0;
}

/* ---- reading ------------------------------------------------------------------------- */

typedef struct snap_reader {
    int fd;
    uint32_t crc;
    int err;       /* errno of a failed read */
    int truncated; /* the file ended early */
} snap_reader;

/* Reads exactly len bytes into dst and adds them to the checksum; 0 or -1. */
static int get_bytes(snap_reader *r, void *dst, size_t len) {
    unsigned char *p = dst, *start = dst;
    size_t want = len;
    while (len) {
        ssize_t k = read(r->fd, p, len);
        if (k < 0) {
            if (errno == EINTR) continue;
            r->err = errno;
            return -1;
        }
        if (k == 0) {
            r->truncated = 1;
            return -1;
        }
        p += k;
        len -= (size_t)k;
    }
    r->crc = crc32c(r->crc, start, want);
    return 0;
}

/* Reads count little-endian elements of size elem into host order. */
static int get_array(snap_reader *r, void *dst, size_t count, size_t elem) {
    if (get_bytes(r, dst, count * elem) != 0) return -1;
    if (!host_is_little_endian()) swap_elements(dst, count, elem);
    return 0;
}

/* Reads and checks magic, version and the header's counts against the file
 * size; 0 with *header_bytes set, or -1 with err. */
static int read_header(snap_reader *r, const char *path, uint64_t file_bytes, unsigned char *h,
                       uint32_t *header_bytes, char *err, size_t errlen) {
    if (file_bytes < 12 || get_bytes(r, h, 12) != 0) {
        snprintf(err, errlen, "snapshot %s: truncated (%llu bytes)", path,
                 (unsigned long long)file_bytes);
        return -1;
    }
    if (memcmp(h, snap_magic, 8) != 0) {
        snprintf(err, errlen, "snapshot %s: not a pot snapshot (bad magic)", path);
        return -1;
    }
    uint32_t version = le_get_u32(h + 8);
    if (version > SNAP_VERSION) {
        snprintf(err, errlen,
                 "snapshot %s: format version %u is newer than this build reads (%d); "
                 "rebuild the pot from the session log or upgrade",
                 path, version, SNAP_VERSION);
        return -1;
    }
    if (version < 1) {
        snprintf(err, errlen, "snapshot %s: unsupported format version %u", path, version);
        return -1;
    }
    *header_bytes = version == 1 ? SNAP_V1_HEADER_BYTES : SNAP_HEADER_BYTES;
    if (file_bytes < *header_bytes || get_bytes(r, h + 12, *header_bytes - 12) != 0) {
        snprintf(err, errlen, "snapshot %s: truncated header (%llu bytes)", path,
                 (unsigned long long)file_bytes);
        return -1;
    }
    if (version == 1) memset(h + SNAP_V1_HEADER_BYTES, 0, 8); /* no extra bytes */
    return 0;
}

/* Reads the extra section (always, so the checksum covers it) into a malloc'd
 * buffer, handed to the caller through *out when it asks for it. 0 or -1. */
static int read_extra(snap_reader *r, uint64_t len, void **out) {
    unsigned char *b = malloc(len ? (size_t)len : 1);
    if (!b) {
        r->err = ENOMEM;
        return -1;
    }
    if (get_bytes(r, b, (size_t)len) != 0) {
        free(b);
        return -1;
    }
    *out = b;
    return 0;
}

pot *pot_snapshot_read(const char *path, int32_t min_capacity, pot_snapshot_meta *meta, char *err,
                       size_t errlen) {
    return pot_snapshot_read_extra(path, min_capacity, meta, NULL, NULL, err, errlen);
}

pot *pot_snapshot_read_extra(const char *path, int32_t min_capacity, pot_snapshot_meta *meta,
                             void **extra, size_t *extra_len, char *err, size_t errlen) {
    if (extra) *extra = NULL;
    if (extra_len) *extra_len = 0;
    if (!path || !meta) {
        snprintf(err, errlen, "snapshot: missing path or metadata");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "snapshot %s: %s", path, strerror(errno));
        return NULL;
    }
    pot *p = NULL;
    void *ex = NULL;
    snap_reader r = {fd, 0, 0, 0};
    struct stat st;
    unsigned char h[SNAP_HEADER_BYTES];
    uint32_t header_bytes = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "snapshot %s: not a regular file", path);
        goto fail;
    }
    uint64_t file_bytes = (uint64_t)st.st_size;
    if (read_header(&r, path, file_bytes, h, &header_bytes, err, errlen) != 0) goto fail;
    int32_t n_layer = (int32_t)le_get_u32(h + 28), n_head_kv = (int32_t)le_get_u32(h + 32);
    int32_t head_dim = (int32_t)le_get_u32(h + 36), n = (int32_t)le_get_u32(h + 44);
    int32_t n_pinned = (int32_t)le_get_u32(h + 48);
    uint32_t dtype = le_get_u32(h + 40), settings_len = le_get_u32(h + 60);
    int64_t n_seen = (int64_t)le_get_u64(h + 52);
    uint64_t ex_len = le_get_u64(h + 64);
    if (n_layer < 1 || n_layer > SNAP_MAX_LAYERS || n_head_kv < 1 || n_head_kv > SNAP_MAX_HEADS ||
        head_dim < 1 || head_dim > SNAP_MAX_HEAD_DIM || (dtype != POT_F16 && dtype != POT_F32) ||
        n < 0 || n > SNAP_MAX_SLOTS || n_pinned < 0 || n_pinned > n || n_seen < 0 ||
        settings_len >= sizeof meta->settings || ex_len > SNAP_MAX_EXTRA) {
        snprintf(err, errlen,
                 "snapshot %s: corrupt header (%d layers, %d heads, dim %d, dtype %u, n %d, "
                 "%d pinned, settings %u bytes, extra %llu bytes)",
                 path, n_layer, n_head_kv, head_dim, dtype, n, n_pinned, settings_len,
                 (unsigned long long)ex_len);
        goto fail;
    }
    int has_joins = le_get_u32(h + 8) >= SNAP_FIRST_JOINS_VERSION;
    uint64_t want = snapshot_bytes(header_bytes, has_joins, n_layer, n_head_kv, head_dim,
                                   (enum pot_dtype)dtype, n, settings_len, ex_len);
    if (want != file_bytes) {
        snprintf(err, errlen, "snapshot %s: %s (%llu bytes, the header implies %llu)", path,
                 file_bytes < want ? "truncated" : "size mismatch",
                 (unsigned long long)file_bytes, (unsigned long long)want);
        goto fail;
    }
    char settings[sizeof meta->settings];
    memset(settings, 0, sizeof settings);
    if (get_bytes(&r, settings, settings_len) != 0) goto io_fail;
    if (memchr(settings, '\0', settings_len)) {
        snprintf(err, errlen, "snapshot %s: corrupt settings (NUL byte)", path);
        goto fail;
    }
    if (read_extra(&r, ex_len, &ex) != 0) goto io_fail;
    int32_t capacity = n > min_capacity ? n : min_capacity;
    if (capacity < 1) capacity = 1;
    char perr[160];
    p = pot_new(n_layer, n_head_kv, head_dim, capacity, (enum pot_dtype)dtype, perr, sizeof perr);
    if (!p) {
        snprintf(err, errlen, "snapshot %s: %s", path, perr);
        goto fail;
    }
    size_t elem = dtype_bytes(p->dtype), row = (size_t)head_dim;
    for (int32_t l = 0; l < n_layer; l++)
        for (int32_t hd = 0; hd < n_head_kv; hd++) {
            size_t s = pot_slot(p, l, hd, 0);
            if (get_array(&r, (char *)p->k + s * row * elem, (size_t)n * row, elem) != 0 ||
                get_array(&r, (char *)p->v + s * row * elem, (size_t)n * row, elem) != 0 ||
                get_array(&r, p->token_index + s, (size_t)n, sizeof *p->token_index) != 0 ||
                get_array(&r, p->surprisal + s, (size_t)n, sizeof *p->surprisal) != 0 ||
                get_array(&r, p->score_acc + s, (size_t)n, sizeof *p->score_acc) != 0 ||
                (has_joins && get_array(&r, p->joins + s, (size_t)n, sizeof *p->joins) != 0))
                goto io_fail;
        }
    uint32_t computed = r.crc;
    unsigned char stored[4];
    if (get_bytes(&r, stored, 4) != 0) goto io_fail;
    if (le_get_u32(stored) != computed) {
        snprintf(err, errlen, "snapshot %s: checksum mismatch (corrupt file)", path);
        goto fail;
    }
    close(fd);
    p->n = n;
    p->n_pinned = n_pinned;
    p->n_seen = n_seen;
    memset(meta, 0, sizeof *meta);
    meta->model_fingerprint = le_get_u64(h + 12);
    meta->log_offset = le_get_u64(h + 20);
    memcpy(meta->settings, settings, settings_len);
    if (extra && ex_len) {
        *extra = ex;
        ex = NULL;
        if (extra_len) *extra_len = (size_t)ex_len;
    }
    free(ex);
    return p;

io_fail:
    if (r.truncated)
        snprintf(err, errlen, "snapshot %s: truncated (the file shrank while being read)", path);
    else
        snprintf(err, errlen, "snapshot %s: read failed: %s", path, strerror(r.err));
fail:
    free(ex);
    pot_free(p);
    close(fd);
    return NULL;
}
