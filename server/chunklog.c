/* Per-session chunk log: an append-only file of frames, every integer
 * little-endian, no file header.
 *
 * Frame (20-byte header, payload, 4-byte trailer):
 *   0  magic                      u32  0x314C43FF, on disk FF 'C' 'L' '1'
 *   4  type                       u8   1 DATA, 2 COMMIT
 *   5  zero                       u8[3]
 *   8  seq                        u64  the chunk's number, >= 1
 *  16  payload_len                u32  DATA: 1 .. 1 MiB; COMMIT: 16
 *  20  payload                    payload_len bytes
 *   .  CRC-32C of header + payload u32
 * DATA payload: document bytes (an append larger than 1 MiB becomes several
 * frames). COMMIT payload: u64 chunk_bytes, u32 chunk_crc (CRC-32C of the
 * chunk's document bytes), u32 flags (bit 0: final, the end of the document;
 * other bits zero). An empty chunk is a lone COMMIT with chunk_bytes 0.
 *
 * The magic's first byte 0xFF never occurs in UTF-8, so a frame image cannot
 * hide inside committed document text (the server aborts a chunk that is not
 * UTF-8), which keeps the damage search below free of false alarms.
 *
 * The writer keeps: a chunk is DATA frames of its seq followed by one COMMIT of
 * the same seq whose size and CRC match them; seqs increase through the file;
 * nothing follows a final chunk; every frame before the last COMMIT belongs to
 * a committed chunk (abort truncates back to the last COMMIT's end). The reader
 * (chunk_log_open) accepts frames while all of that holds and the CRCs match,
 * and cuts the file at the end of the last accepted COMMIT. The bytes it cut
 * are a torn tail (an upload in progress at a crash; never acknowledged) unless
 * a well-formed COMMIT frame with a valid CRC appears anywhere after the first
 * rejected byte: then acknowledged data was damaged and the caller is told. */
#include "chunklog.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

enum {
    CL_HDR = 20,
    CL_TRAILER = 4,
    CL_COMMIT_PAYLOAD = 16,
    CL_COMMIT_FRAME = CL_HDR + CL_COMMIT_PAYLOAD + CL_TRAILER, /* 40 */
    CL_MAX_DATA = 1 << 20,
    CL_BUF = CL_HDR + CL_MAX_DATA + CL_TRAILER,
    CL_DATA = 1,
    CL_COMMIT = 2,
    CL_FLAG_FINAL = 1,
};
static const unsigned char cl_magic[4] = {0xFF, 'C', 'L', '1'};

struct chunk_log {
    int fd;
    int fsync_mode;
    int dir_synced;  /* fsync mode: the directory was fsynced since open */
    int broken;      /* an I/O error left the file in doubt: no new chunks */
    char *path;      /* for messages and the directory fsync */
    uint64_t end;    /* committed size: just past the last COMMIT */
    chunk_log_entry *ents;
    size_t n, cap;
    int final;
    /* the open chunk */
    int open;
    int spoiled;     /* an append failed: only abort is allowed */
    uint64_t open_seq, open_bytes, write_off;
    uint32_t open_crc;
};


static void put_header(unsigned char *h, int type, uint64_t seq, uint32_t len) {
    memcpy(h, cl_magic, 4);
    h[4] = (unsigned char)type;
    h[5] = h[6] = h[7] = 0;
    le_put_u64(h + 8, seq);
    le_put_u32(h + 16, len);
}

/* ---- raw I/O ---------------------------------------------------------------------------- */

/* Reads up to n bytes at off, retrying short reads and EINTR; the count read
 * (less than n only at end of file), or -1 with errno set. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t off) {
    unsigned char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(fd, p + got, n - got, (off_t)(off + got));
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) break;
        got += (size_t)k;
    }
    return (ssize_t)got;
}

/* Writes the iovecs (modified) at off, retrying short writes and EINTR; 0 or an errno. */
static int pwritev_full(int fd, struct iovec *iov, int cnt, uint64_t off) {
    int i = 0;
    while (i < cnt && iov[i].iov_len == 0) i++;
    while (i < cnt) {
        ssize_t k = pwritev(fd, iov + i, cnt - i, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (k == 0) return EIO;
        off += (uint64_t)k;
        size_t left = (size_t)k;
        while (i < cnt && left >= iov[i].iov_len) left -= iov[i++].iov_len;
        if (i < cnt) {
            iov[i].iov_base = (char *)iov[i].iov_base + left;
            iov[i].iov_len -= left;
            while (i < cnt && iov[i].iov_len == 0) i++;
        }
    }
    return 0;
}

/* Writes one frame at off; 0 or an errno. */
static int write_frame(int fd, uint64_t off, int type, uint64_t seq, const void *payload,
                       uint32_t len) {
    unsigned char h[CL_HDR], t[CL_TRAILER];
    put_header(h, type, seq, len);
    le_put_u32(t, crc32c(crc32c(0, h, sizeof h), payload, len));
    struct iovec iov[3] = {{h, sizeof h}, {(void *)payload, len}, {t, sizeof t}};
    return pwritev_full(fd, iov, 3, off);
}

static int truncate_to(int fd, uint64_t size) {
    for (;;) {
        if (ftruncate(fd, (off_t)size) == 0) return 0;
        if (errno != EINTR) return errno;
    }
}


/* ---- frame parsing ------------------------------------------------------------------------- */

typedef struct frame {
    int type;
    uint64_t seq;
    uint32_t len;
    const unsigned char *payload;
    uint64_t total; /* header + payload + trailer */
} frame;

/* Checks a 20-byte header's fixed fields; the payload length, or -1 when malformed. */
static long header_ok(const unsigned char *h, int *type, uint64_t *seq) {
    if (memcmp(h, cl_magic, 4) != 0 || h[5] || h[6] || h[7]) return -1;
    *type = h[4];
    *seq = le_get_u64(h + 8);
    uint32_t len = le_get_u32(h + 16);
    if (*seq == 0) return -1;
    if (*type == CL_DATA) return len >= 1 && len <= CL_MAX_DATA ? (long)len : -1;
    if (*type == CL_COMMIT) return len == CL_COMMIT_PAYLOAD ? (long)len : -1;
    return -1;
}

/* 1 when the 40 bytes at p are a well-formed COMMIT frame with a valid CRC. */
static int commit_image_ok(const unsigned char *p) {
    int type;
    uint64_t seq;
    if (header_ok(p, &type, &seq) < 0 || type != CL_COMMIT) return 0;
    if (le_get_u32(p + CL_HDR + 12) & ~(uint32_t)CL_FLAG_FINAL) return 0;
    return crc32c(0, p, CL_HDR + CL_COMMIT_PAYLOAD) == le_get_u32(p + CL_HDR + CL_COMMIT_PAYLOAD);
}

/* Reads the frame at off into buf (CL_BUF bytes), not reading at or past limit.
 * 1: a well-formed frame with a valid CRC (f filled); 0: incomplete or invalid;
 * -1: I/O error (errno set). */
static int read_frame(int fd, uint64_t off, uint64_t limit, unsigned char *buf, frame *f) {
    if (off > limit || limit - off < CL_HDR + CL_TRAILER) return 0;
    ssize_t k = pread_full(fd, buf, CL_HDR, off);
    if (k < 0) return -1;
    if (k < CL_HDR) return 0;
    long len = header_ok(buf, &f->type, &f->seq);
    if (len < 0) return 0;
    uint64_t total = (uint64_t)CL_HDR + (uint64_t)len + CL_TRAILER;
    if (limit - off < total) return 0;
    size_t rest = (size_t)len + CL_TRAILER;
    k = pread_full(fd, buf + CL_HDR, rest, off + CL_HDR);
    if (k < 0) return -1;
    if ((size_t)k < rest) return 0;
    if (crc32c(0, buf, CL_HDR + (size_t)len) != le_get_u32(buf + CL_HDR + len)) return 0;
    if (f->type == CL_COMMIT && (le_get_u32(buf + CL_HDR + 12) & ~(uint32_t)CL_FLAG_FINAL)) return 0;
    f->len = (uint32_t)len;
    f->payload = buf + CL_HDR;
    f->total = total;
    return 1;
}

/* Looks for a valid COMMIT frame image starting anywhere in [start, size).
 * 1 found, 0 not, -1 I/O error. */
static int find_commit_after(int fd, uint64_t start, uint64_t size, unsigned char *buf) {
    uint64_t pos = start;
    while (pos < size && size - pos >= CL_COMMIT_FRAME) {
        uint64_t left = size - pos;
        size_t want = left < CL_BUF ? (size_t)left : CL_BUF;
        ssize_t k = pread_full(fd, buf, want, pos);
        if (k < 0) return -1;
        if ((size_t)k < CL_COMMIT_FRAME) return 0; /* the file shrank under us */
        for (size_t i = 0; i + CL_COMMIT_FRAME <= (size_t)k; i++)
            if (buf[i] == cl_magic[0] && commit_image_ok(buf + i)) return 1;
        if ((size_t)k < want) return 0;
        pos += (uint64_t)k - (CL_COMMIT_FRAME - 1);
    }
    return 0;
}

/* ---- the log ---------------------------------------------------------------------------- */

/* Makes room for one more entry; 0 or ENOMEM. */
static int reserve_entry(chunk_log *l) {
    return vec_reserve_((void **)&l->ents, &l->cap, l->n + 1, sizeof *l->ents) ? ENOMEM : 0;
}

/* Chunk-assembly state of the open-time scan and of replay. */
typedef struct chunk_state {
    int open;
    uint64_t seq, bytes;
    uint32_t crc;
} chunk_state;

/* Applies frame f to the scan state (last committed seq and finality given);
 * 1 when the frame keeps the writer's rules, 0 when it breaks them. On a valid
 * COMMIT, *e is filled (end_offset left to the caller) and the state reset. */
static int apply_frame(chunk_state *s, uint64_t last_seq, int final, const frame *f,
                       chunk_log_entry *e) {
    if (!s->open && (final || f->seq <= last_seq)) return 0;
    if (s->open && f->seq != s->seq) return 0;
    if (f->type == CL_DATA) {
        if (!s->open) *s = (chunk_state){1, f->seq, 0, 0};
        if (s->bytes > UINT64_MAX - f->len) return 0;
        s->bytes += f->len;
        s->crc = crc32c(s->crc, f->payload, f->len);
        return 1;
    }
    uint64_t bytes = le_get_u64(f->payload);
    uint32_t crc = le_get_u32(f->payload + 8), flags = le_get_u32(f->payload + 12);
    uint64_t have = s->open ? s->bytes : 0;
    uint32_t have_crc = s->open ? s->crc : 0;
    if (bytes != have || crc != have_crc) return 0;
    *e = (chunk_log_entry){f->seq, bytes, 0, crc, (flags & CL_FLAG_FINAL) ? 1 : 0};
    *s = (chunk_state){0, 0, 0, 0};
    return 1;
}

/* Copies the log's bytes [from, size) to PATH.damaged-SECONDS (fsynced), so
 * that acknowledged chunks after damage are not destroyed by the cut: a
 * person (or a tool) can still read them back. 0, or an errno. */
static int keep_damaged_tail(chunk_log *l, uint64_t from, uint64_t size, unsigned char *buf) {
    char *path = malloc(strlen(l->path) + 32);
    if (!path) return ENOMEM;
    sprintf(path, "%s.damaged-%lld", l->path, (long long)time(NULL));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600), e = fd < 0 ? errno : 0;
    for (uint64_t at = from; !e && at < size;) {
        ssize_t n = pread(l->fd, buf, size - at < CL_BUF ? (size_t)(size - at) : CL_BUF, (off_t)at);
        if (n <= 0) e = n < 0 ? errno : EIO;
        else if (write(fd, buf, (size_t)n) != n) e = errno ? errno : EIO;
        else at += (uint64_t)n;
    }
    if (!e && fsync(fd)) e = errno;
    if (fd >= 0) close(fd);
    free(path);
    return e;
}

/* Scans the whole file, fills the entries and cuts the file at the last good
 * COMMIT (the bytes after damage kept aside first); 0, or -1 + err. */
static int scan(chunk_log *l, uint64_t size, int *damaged, char *err, size_t errlen) {
    unsigned char *buf = malloc(CL_BUF);
    if (!buf) {
        set_err(err, errlen, "chunk log %s: out of memory", l->path);
        return -1;
    }
    chunk_state s = {0, 0, 0, 0};
    uint64_t off = 0, last_seq = 0;
    int rc = 0, r;
    frame f;
    while ((r = read_frame(l->fd, off, size, buf, &f)) == 1) {
        chunk_log_entry e;
        if (!apply_frame(&s, last_seq, l->final, &f, &e)) break;
        off += f.total;
        if (f.type != CL_COMMIT) continue;
        if (reserve_entry(l) != 0) {
            set_err(err, errlen, "chunk log %s: out of memory", l->path);
            rc = -1;
            goto out;
        }
        e.end_offset = off;
        l->ents[l->n++] = e;
        l->end = off;
        last_seq = e.seq;
        l->final = e.final;
    }
    if (r < 0) {
        set_err(err, errlen, "chunk log %s: read at %llu: %s", l->path, (unsigned long long)off,
                strerror(errno));
        rc = -1;
        goto out;
    }
    /* off is the first byte not accepted; everything from l->end on goes. */
    if (off < size) {
        r = find_commit_after(l->fd, off + 1, size, buf);
        if (r < 0) {
            set_err(err, errlen, "chunk log %s: read: %s", l->path, strerror(errno));
            rc = -1;
            goto out;
        }
        if (damaged) *damaged = r;
        int e = r ? keep_damaged_tail(l, l->end, size, buf) : 0;
        if (e) {
            set_err(err, errlen, "chunk log %s: keeping the chunks after its damage aside: %s", l->path, strerror(e));
            rc = -1;
            goto out;
        }
    }
    if (l->end < size) {
        int e = truncate_to(l->fd, l->end);
        if (!e && l->fsync_mode && fdatasync(l->fd) != 0) e = errno;
        if (e) {
            set_err(err, errlen, "chunk log %s: truncating the uncommitted tail to %llu: %s",
                    l->path, (unsigned long long)l->end, strerror(e));
            rc = -1;
        }
    }
out:
    free(buf);
    return rc;
}

chunk_log *chunk_log_open(const char *path, int fsync_mode, int *damaged, char *err,
                          size_t errlen) {
    if (damaged) *damaged = 0;
    if (!path || !*path) {
        set_err(err, errlen, "chunk log: no path");
        return NULL;
    }
    chunk_log *l = calloc(1, sizeof *l);
    char *p = strdup(path);
    if (!l || !p) {
        free(l);
        free(p);
        set_err(err, errlen, "chunk log %s: out of memory", path);
        return NULL;
    }
    l->path = p;
    l->fsync_mode = fsync_mode ? 1 : 0;
    l->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (l->fd < 0) {
        set_err(err, errlen, "chunk log %s: open: %s", path, strerror(errno));
        goto fail;
    }
    if (flock(l->fd, LOCK_EX | LOCK_NB) != 0) {
        set_err(err, errlen, "chunk log %s: %s", path,
                errno == EWOULDBLOCK ? "already open elsewhere" : strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(l->fd, &st) != 0) {
        set_err(err, errlen, "chunk log %s: stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, "chunk log %s: not a regular file", path);
        goto fail;
    }
    if (scan(l, (uint64_t)st.st_size, damaged, err, errlen) != 0) goto fail;
    return l;
fail:
    if (damaged) *damaged = 0;
    if (l->fd >= 0) close(l->fd);
    free(l->ents);
    free(l->path);
    free(l);
    return NULL;
}

chunk_log *chunk_log_reader(const chunk_log *l, char *err, size_t errlen) {
    chunk_log *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(l->path)) || !(r->ents = malloc((l->n ? l->n : 1) * sizeof *r->ents))) {
        if (r) free(r->path);
        free(r);
        set_err(err, errlen, "chunk log %s: out of memory", l->path);
        return NULL;
    }
    memcpy(r->ents, l->ents, l->n * sizeof *r->ents);
    r->n = r->cap = l->n;
    r->end = l->end;
    r->final = l->final;
    r->broken = 1; /* refuses chunk_log_begin */
    r->fd = open(l->path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        set_err(err, errlen, "chunk log %s: open: %s", l->path, strerror(errno));
        free(r->ents);
        free(r->path);
        free(r);
        return NULL;
    }
    return r;
}

void chunk_log_close(chunk_log *l) {
    if (!l) return;
    if (l->open && !l->broken) (void)truncate_to(l->fd, l->end);
    close(l->fd);
    free(l->ents);
    free(l->path);
    free(l);
}

const chunk_log_entry *chunk_log_entries(const chunk_log *l, size_t *n) {
    if (n) *n = l ? l->n : 0;
    return l ? l->ents : NULL;
}

const chunk_log_entry *chunk_log_find(const chunk_log *l, uint64_t seq) {
    if (!l) return NULL;
    size_t lo = 0, hi = l->n; /* seqs increase through the log */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->ents[mid].seq < seq) lo = mid + 1;
        else hi = mid;
    }
    return lo < l->n && l->ents[lo].seq == seq ? &l->ents[lo] : NULL;
}

uint64_t chunk_log_last_seq(const chunk_log *l) { return l && l->n ? l->ents[l->n - 1].seq : 0; }

uint64_t chunk_log_committed_size(const chunk_log *l) { return l ? l->end : 0; }

int chunk_log_is_final(const chunk_log *l) { return l ? l->final : 0; }

int chunk_log_begin(chunk_log *l, uint64_t seq, char *err, size_t errlen) {
    if (!l) {
        set_err(err, errlen, "chunk log: no log");
        return -1;
    }
    if (l->open) {
        set_err(err, errlen, "chunk log %s: chunk %llu is already open", l->path,
                (unsigned long long)l->open_seq);
        return -1;
    }
    if (l->broken) {
        set_err(err, errlen, "chunk log %s: an earlier I/O error needs a reopen", l->path);
        return -1;
    }
    if (l->final) {
        set_err(err, errlen, "chunk log %s: the document is complete (final chunk %llu)",
                l->path, (unsigned long long)chunk_log_last_seq(l));
        return -1;
    }
    uint64_t last = chunk_log_last_seq(l);
    if (seq == 0 || seq <= last) {
        set_err(err, errlen, "chunk log %s: chunk %llu does not follow chunk %llu", l->path,
                (unsigned long long)seq, (unsigned long long)last);
        return -1;
    }
    l->open = 1;
    l->spoiled = 0;
    l->open_seq = seq;
    l->open_bytes = 0;
    l->open_crc = 0;
    l->write_off = l->end;
    return 0;
}

/* -1 + err unless a chunk is open and writable. */
static int check_writable(const chunk_log *l, const char *what, char *err, size_t errlen) {
    if (!l) {
        set_err(err, errlen, "chunk log: no log");
        return -1;
    }
    if (!l->open) {
        set_err(err, errlen, "chunk log %s: %s without an open chunk", l->path, what);
        return -1;
    }
    if (l->spoiled || l->broken) {
        set_err(err, errlen, "chunk log %s: chunk %llu failed earlier and must be aborted",
                l->path, (unsigned long long)l->open_seq);
        return -1;
    }
    return 0;
}

int chunk_log_append(chunk_log *l, const void *data, size_t n, char *err, size_t errlen) {
    if (check_writable(l, "append", err, errlen) != 0) return -1;
    if (n == 0) return 0;
    if (!data) {
        set_err(err, errlen, "chunk log %s: append of %zu bytes from NULL", l->path, n);
        return -1;
    }
    /* the file must stay below INT64_MAX bytes, frame overheads included */
    uint64_t grow = (uint64_t)n + ((uint64_t)n / CL_MAX_DATA + 1) * (CL_HDR + CL_TRAILER);
    if ((uint64_t)n > (uint64_t)INT64_MAX / 2 || l->write_off > (uint64_t)INT64_MAX - grow) {
        l->spoiled = 1;
        set_err(err, errlen, "chunk log %s: chunk %llu too large", l->path,
                (unsigned long long)l->open_seq);
        return -1;
    }
    const unsigned char *p = data;
    while (n) {
        uint32_t k = n > CL_MAX_DATA ? CL_MAX_DATA : (uint32_t)n;
        int e = write_frame(l->fd, l->write_off, CL_DATA, l->open_seq, p, k);
        if (e) {
            l->spoiled = 1;
            set_err(err, errlen, "chunk log %s: writing chunk %llu at %llu: %s", l->path,
                    (unsigned long long)l->open_seq, (unsigned long long)l->write_off,
                    strerror(e));
            errno = e;
            return -1;
        }
        l->write_off += (uint64_t)CL_HDR + k + CL_TRAILER;
        l->open_bytes += k;
        l->open_crc = crc32c(l->open_crc, p, k);
        p += k;
        n -= k;
    }
    return 0;
}

/* Drops the open chunk's bytes; 0, or an errno (the log is then broken). */
static int drop_open(chunk_log *l) {
    l->open = 0;
    l->spoiled = 0;
    int e = truncate_to(l->fd, l->end);
    if (e) l->broken = 1;
    return e;
}

int chunk_log_commit(chunk_log *l, int final, char *err, size_t errlen) {
    if (check_writable(l, "commit", err, errlen) != 0) return -1;
    /* room for the entry first: a durable commit must not then fail to be listed */
    if (reserve_entry(l) != 0) {
        (void)drop_open(l);
        set_err(err, errlen, "chunk log %s: out of memory", l->path);
        return -1;
    }
    struct stat st;
    if (fstat(l->fd, &st) == 0 && st.st_nlink == 0) { /* its data directory was deleted under it */
        uint64_t seq = l->open_seq;
        (void)drop_open(l);
        l->broken = 1;
        set_err(err, errlen, "chunk log %s: the file was removed (the data directory deleted?): chunk %llu not kept",
                l->path, (unsigned long long)seq);
        errno = ENOENT;
        return -1;
    }
    unsigned char payload[CL_COMMIT_PAYLOAD];
    le_put_u64(payload, l->open_bytes);
    le_put_u32(payload + 8, l->open_crc);
    le_put_u32(payload + 12, final ? CL_FLAG_FINAL : 0);
    const char *stage = "writing";
    int e = write_frame(l->fd, l->write_off, CL_COMMIT, l->open_seq, payload, sizeof payload);
    if (!e && l->fsync_mode) {
        stage = "syncing";
        if (fdatasync(l->fd) != 0) e = errno;
        if (!e && !l->dir_synced) {
            stage = "syncing the directory of";
            e = fsync_parent_dir(l->path);
            if (!e) l->dir_synced = 1;
        }
        if (e) l->broken = 1; /* after a failed fsync the page cache is not to be trusted */
    }
    if (e) {
        uint64_t seq = l->open_seq;
        (void)drop_open(l);
        set_err(err, errlen, "chunk log %s: %s commit of chunk %llu: %s", l->path, stage,
                (unsigned long long)seq, strerror(e));
        errno = e;
        return -1;
    }
    l->end = l->write_off + CL_COMMIT_FRAME;
    l->ents[l->n++] = (chunk_log_entry){l->open_seq, l->open_bytes, l->end, l->open_crc,
                                        final ? 1 : 0};
    l->final = final ? 1 : 0;
    l->open = 0;
    return 0;
}

int chunk_log_abort(chunk_log *l, char *err, size_t errlen) {
    if (!l) {
        set_err(err, errlen, "chunk log: no log");
        return -1;
    }
    if (!l->open) return 0;
    uint64_t seq = l->open_seq;
    int e = drop_open(l);
    if (e) {
        set_err(err, errlen, "chunk log %s: truncating chunk %llu away: %s", l->path,
                (unsigned long long)seq, strerror(e));
        return -1;
    }
    return 0;
}

struct chunk_log_cursor {
    chunk_log *l;
    size_t idx;         /* the next entry to read */
    uint64_t off;       /* the next frame's file offset */
    chunk_state s;      /* the chunk under way (apply_frame's rules) */
    unsigned char *buf; /* one frame */
};

chunk_log_cursor *chunk_log_cursor_open(chunk_log *l, uint64_t from_offset, char *err, size_t errlen) {
    if (!l) {
        set_err(err, errlen, "chunk log: no log");
        return NULL;
    }
    size_t idx = 0; /* first entry after from_offset */
    if (from_offset != 0) {
        size_t lo = 0, hi = l->n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (l->ents[mid].end_offset < from_offset) lo = mid + 1;
            else hi = mid;
        }
        if (lo == l->n || l->ents[lo].end_offset != from_offset) {
            set_err(err, errlen, "chunk log %s: replay offset %llu is not a commit boundary",
                    l->path, (unsigned long long)from_offset);
            return NULL;
        }
        idx = lo + 1;
    }
    chunk_log_cursor *r = calloc(1, sizeof *r);
    if (r) r->buf = malloc(CL_BUF);
    if (!r || !r->buf) {
        free(r);
        set_err(err, errlen, "chunk log %s: out of memory", l->path);
        return NULL;
    }
    r->l = l;
    r->idx = idx;
    r->off = from_offset;
    return r;
}

void chunk_log_cursor_close(chunk_log_cursor *r) {
    if (!r) return;
    free(r->buf);
    free(r);
}

int chunk_log_cursor_read(chunk_log_cursor *r, uint64_t at_least, chunk_log_data_fn on_data,
                          chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen) {
    chunk_log *l = r->l;
    uint64_t delivered = 0;
    while (r->idx < l->n) {
        if (delivered >= at_least) return 1; /* after a whole frame: the next read goes on from here */
        const chunk_log_entry *want = &l->ents[r->idx];
        frame f;
        chunk_log_entry got;
        int rf = read_frame(l->fd, r->off, want->end_offset, r->buf, &f);
        if (rf < 0) {
            set_err(err, errlen, "chunk log %s: read at %llu: %s", l->path,
                    (unsigned long long)r->off, strerror(errno));
            return -1;
        }
        uint64_t prev = r->idx ? l->ents[r->idx - 1].seq : 0; /* only the last entry is final */
        if (rf == 0 || f.seq != want->seq || !apply_frame(&r->s, prev, 0, &f, &got)) {
            set_err(err, errlen, "chunk log %s: damaged since open at offset %llu (chunk %llu)",
                    l->path, (unsigned long long)r->off, (unsigned long long)want->seq);
            return -1;
        }
        r->off += f.total;
        if (f.type == CL_DATA) {
            delivered += f.len;
            if (on_data && on_data(user, f.seq, (const char *)f.payload, f.len) != 0) {
                set_err(err, errlen, "chunk log %s: replay stopped by the consumer in chunk %llu",
                        l->path, (unsigned long long)f.seq);
                return -1;
            }
            continue;
        }
        if (r->off != want->end_offset || got.bytes != want->bytes || got.crc != want->crc ||
            got.final != want->final) {
            set_err(err, errlen, "chunk log %s: chunk %llu changed since open", l->path,
                    (unsigned long long)want->seq);
            return -1;
        }
        if (on_commit && on_commit(user, want) != 0) {
            set_err(err, errlen, "chunk log %s: replay stopped by the consumer after chunk %llu",
                    l->path, (unsigned long long)want->seq);
            return -1;
        }
        r->idx++;
    }
    return 0;
}

int chunk_log_replay(chunk_log *l, uint64_t from_offset, chunk_log_data_fn on_data,
                     chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen) {
    chunk_log_cursor *r = chunk_log_cursor_open(l, from_offset, err, errlen);
    if (!r) return -1;
    int rc = chunk_log_cursor_read(r, UINT64_MAX, on_data, on_commit, user, err, errlen);
    chunk_log_cursor_close(r);
    return rc;
}
