/* Chunk log: round trips with many appends (a >1 MiB append split into frames),
 * replay from every commit boundary, reopen, abort without a trace, a torn
 * tail at every byte offset, single-bit damage in the middle (reported) and in
 * the last frame (a torn tail), hundreds of garbage and mutated files (never a
 * crash, never an entry that was not written), misuse refused, replay stopped
 * by either callback, damage after open caught by replay, and the file lock. */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "server/chunklog.h"
#include "test.h"

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static void random_bytes(void *dst, size_t len, uint64_t *s) {
    unsigned char *p = dst;
    for (size_t i = 0; i < len; i++) p[i] = (unsigned char)(rng_next(s) >> 56);
}

/* ---- a model of what was written --------------------------------------------------- */

typedef struct want_chunk {
    uint64_t seq;
    unsigned char *data;
    size_t len;
    int final;
} want_chunk;

typedef struct want_log {
    want_chunk c[16];
    int n;
} want_log;

static void want_free(want_log *w) {
    for (int i = 0; i < w->n; i++) free(w->c[i].data);
    w->n = 0;
}

/* Writes chunk seq of len random bytes to l in pieces of 1..max_piece bytes
 * (max_piece 0: one append) and records it in w; 0 on success. */
static int add_chunk(chunk_log *l, want_log *w, uint64_t seq, size_t len, size_t max_piece,
                     int final, uint64_t *rng) {
    char err[256];
    want_chunk *c = &w->c[w->n];
    c->seq = seq;
    c->len = len;
    c->final = final;
    c->data = malloc(len ? len : 1);
    if (!c->data) return -1;
    random_bytes(c->data, len, rng);
    w->n++;
    if (chunk_log_begin(l, seq, err, sizeof err) != 0) return -1;
    size_t off = 0;
    while (off < len) {
        size_t k = max_piece ? 1 + rng_next(rng) % max_piece : len;
        if (k > len - off) k = len - off;
        if (chunk_log_append(l, c->data + off, k, err, sizeof err) != 0) return -1;
        off += k;
    }
    return chunk_log_commit(l, final, err, sizeof err);
}

/* Replay collector. */
typedef struct collect {
    unsigned char *buf;
    size_t len, cap;
    uint64_t cur_seq;   /* seq of the chunk whose data is arriving, 0 between chunks */
    int bad_order;      /* data of one chunk interleaved with another */
    size_t max_piece;
    int data_calls, commit_calls;
    chunk_log_entry commits[16];
    size_t commit_len[16]; /* bytes collected when each commit arrived */
    int stop_data_at, stop_commit_at; /* stop at the k-th call (1-based), 0 never */
} collect;

static int on_data(void *user, uint64_t seq, const char *data, size_t n) {
    collect *c = user;
    c->data_calls++;
    if (c->cur_seq && c->cur_seq != seq) c->bad_order = 1;
    c->cur_seq = seq;
    if (n > c->max_piece) c->max_piece = n;
    if (c->len + n > c->cap) {
        size_t cap = (c->len + n) * 2;
        unsigned char *b = realloc(c->buf, cap);
        if (!b) return 1;
        c->buf = b;
        c->cap = cap;
    }
    memcpy(c->buf + c->len, data, n);
    c->len += n;
    return c->stop_data_at && c->data_calls == c->stop_data_at;
}

static int on_commit(void *user, const chunk_log_entry *e) {
    collect *c = user;
    if (c->cur_seq && c->cur_seq != e->seq) c->bad_order = 1;
    c->cur_seq = 0;
    if (c->commit_calls < 16) {
        c->commits[c->commit_calls] = *e;
        c->commit_len[c->commit_calls] = c->len;
    }
    c->commit_calls++;
    return c->stop_commit_at && c->commit_calls == c->stop_commit_at;
}

/* Checks that the log's entries are exactly chunks [0, n) of w. */
static void check_entries(const chunk_log *l, const want_log *w, int n) {
    size_t got;
    const chunk_log_entry *e = chunk_log_entries(l, &got);
    CHECK_EQ_INT(got, n);
    if ((int)got != n) return;
    uint64_t prev_end = 0;
    for (int i = 0; i < n; i++) {
        CHECK_EQ_INT(e[i].seq, w->c[i].seq);
        CHECK_EQ_INT(e[i].bytes, w->c[i].len);
        CHECK_EQ_INT(e[i].crc, crc32c(0, w->c[i].data, w->c[i].len));
        CHECK_EQ_INT(e[i].final, w->c[i].final);
        CHECK(e[i].end_offset > prev_end);
        prev_end = e[i].end_offset;
        CHECK(chunk_log_find(l, w->c[i].seq) == &e[i]);
    }
    CHECK_EQ_INT(chunk_log_committed_size(l), prev_end);
    CHECK_EQ_INT(chunk_log_last_seq(l), n ? w->c[n - 1].seq : 0);
    CHECK_EQ_INT(chunk_log_is_final(l), n ? w->c[n - 1].final : 0);
}

/* Replays from from_offset and checks the bytes and commits are chunks [first, n) of w. */
static void check_replay(chunk_log *l, uint64_t from_offset, const want_log *w, int first,
                         int n) {
    char err[256] = "";
    collect c = {0};
    int rc = chunk_log_replay(l, from_offset, on_data, on_commit, &c, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  replay: %s\n", err);
    CHECK_EQ_INT(c.commit_calls, n - first);
    CHECK(!c.bad_order);
    CHECK(c.max_piece <= (1u << 20));
    size_t off = 0;
    for (int i = first; i < n && c.commit_calls == n - first; i++) {
        const want_chunk *wc = &w->c[i];
        CHECK_EQ_INT(c.commits[i - first].seq, wc->seq);
        CHECK_EQ_INT(c.commits[i - first].bytes, wc->len);
        CHECK_EQ_INT(c.commits[i - first].crc, crc32c(0, wc->data, wc->len));
        CHECK(c.commit_len[i - first] == off + wc->len);
        CHECK(off + wc->len <= c.len && (wc->len == 0 || memcmp(c.buf + off, wc->data, wc->len) == 0));
        off += wc->len;
    }
    CHECK_EQ_INT(c.len, off);
    free(c.buf);
}

/* The log most tests use: six chunks, seqs with a gap, an empty chunk, a
 * 3 MiB single append, many 16..64 KiB-ish pieces, the last final when asked. */
static chunk_log *build_standard(const char *path, want_log *w, int final, uint64_t seed) {
    char err[256];
    int damaged = -1;
    chunk_log *l = chunk_log_open(path, 0, &damaged, err, sizeof err);
    if (!l) return NULL;
    uint64_t rng = seed;
    int rc = add_chunk(l, w, 1, 200000, 65536, 0, &rng);
    rc |= add_chunk(l, w, 2, 0, 0, 0, &rng);
    rc |= add_chunk(l, w, 3, 3 * (1u << 20) + 5, 0, 0, &rng);
    rc |= add_chunk(l, w, 5, 1, 1, 0, &rng);
    rc |= add_chunk(l, w, 6, 700000, 16384, 0, &rng);
    rc |= add_chunk(l, w, 7, 100000, 40000, final, &rng);
    if (rc) {
        chunk_log_close(l);
        return NULL;
    }
    return l;
}

/* Each test's own folder: the log's path and a path for damaged copies of it. */
typedef struct test_dir {
    char *dir;
    char path[256], copy[256];
} test_dir;

/* 0 with the folder made and the paths set; -1 (reported) when it cannot be made. */
static int test_dir_make(test_dir *t) {
    t->dir = test_make_tempdir("chunklog-test-");
    CHECK(t->dir != NULL);
    if (!t->dir) return -1;
    snprintf(t->path, sizeof t->path, "%s/log", t->dir);
    snprintf(t->copy, sizeof t->copy, "%s/copy", t->dir);
    return 0;
}

/* Opens the log at path; the log, checked to hold exactly w and no damage, or
 * NULL (reported). */
static chunk_log *open_checked(const char *path, int fsync_mode, const want_log *w) {
    char err[256];
    int damaged = -1;
    chunk_log *l = chunk_log_open(path, fsync_mode, &damaged, err, sizeof err);
    CHECK(l != NULL);
    if (!l) return NULL;
    CHECK_EQ_INT(damaged, 0);
    check_entries(l, w, w->n);
    check_replay(l, 0, w, 0, w->n);
    return l;
}

TEST(chunklog_roundtrip) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    chunk_log *l = build_standard(t.path, &w, 1, 11);
    CHECK(l != NULL);
    if (l) {
        check_entries(l, &w, w.n);
        CHECK_EQ_INT(test_file_size(t.path), (long)chunk_log_committed_size(l));
        CHECK(chunk_log_find(l, 4) == NULL);
        CHECK(chunk_log_find(l, 0) == NULL);
        CHECK(chunk_log_find(l, 8) == NULL);
        check_replay(l, 0, &w, 0, w.n);
        /* the 3 MiB append came back in pieces of at most 1 MiB */
        collect c = {0};
        CHECK_EQ_INT(chunk_log_replay(l, chunk_log_find(l, 2)->end_offset, on_data, NULL, &c,
                                      err, sizeof err), 0);
        CHECK(c.data_calls >= 4);
        CHECK(c.max_piece == (1u << 20));
        free(c.buf);
        /* final: nothing more */
        CHECK_EQ_INT(chunk_log_begin(l, 8, err, sizeof err), -1);
        chunk_log_close(l);
    }
    want_free(&w);
    test_remove_dir(t.dir);
}

TEST(chunklog_replay_from_each_offset) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    chunk_log *l = build_standard(t.path, &w, 0, 12);
    CHECK(l != NULL);
    if (l) {
        size_t n;
        const chunk_log_entry *e = chunk_log_entries(l, &n);
        check_replay(l, 0, &w, 0, w.n);
        for (size_t i = 0; i < n; i++) check_replay(l, e[i].end_offset, &w, (int)i + 1, w.n);
        /* not commit boundaries */
        uint64_t bad[] = {1, e[0].end_offset - 1, e[0].end_offset + 1, e[2].end_offset - 40,
                          chunk_log_committed_size(l) + 1, UINT64_MAX};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            err[0] = 0;
            collect c = {0};
            CHECK_EQ_INT(chunk_log_replay(l, bad[i], on_data, on_commit, &c, err, sizeof err), -1);
            CHECK(err[0] != 0);
            CHECK_EQ_INT(c.data_calls + c.commit_calls, 0);
        }
        chunk_log_close(l);
    }
    want_free(&w);
    test_remove_dir(t.dir);
}

/* A cursor read in steps of at_least bytes gives what one replay gives, each
 * step at least at_least bytes (less only at the end) and at most one frame
 * more; from every commit boundary, for steps of a byte up to a frame. */
TEST(chunklog_cursor_reads_in_steps) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    chunk_log *l = build_standard(t.path, &w, 1, 13);
    CHECK(l != NULL);
    if (l) {
        size_t n;
        const chunk_log_entry *e = chunk_log_entries(l, &n);
        const uint64_t steps[] = {1, 1000, 65536, 1u << 20};
        for (size_t b = 0; b <= n; b++) {
            uint64_t from = b ? e[b - 1].end_offset : 0;
            collect whole = {0};
            CHECK_EQ_INT(chunk_log_replay(l, from, on_data, on_commit, &whole, err, sizeof err), 0);
            for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
                collect c = {0};
                chunk_log_cursor *cur = chunk_log_cursor_open(l, from, err, sizeof err);
                CHECK(cur != NULL);
                int rc = 1, reads = 0;
                while (cur && rc == 1 && reads < 100000) {
                    size_t before = c.len;
                    rc = chunk_log_cursor_read(cur, steps[k], on_data, on_commit, &c, err, sizeof err);
                    reads++;
                    if (rc == 1) CHECK(c.len - before >= steps[k]);
                    CHECK(c.len - before <= steps[k] + (1u << 20));
                }
                CHECK_EQ_INT(rc, 0);
                chunk_log_cursor_close(cur);
                CHECK_EQ_INT(c.len, whole.len);
                CHECK(c.len == whole.len && (c.len == 0 || memcmp(c.buf, whole.buf, c.len) == 0));
                CHECK_EQ_INT(c.commit_calls, whole.commit_calls);
                for (int i = 0; i < c.commit_calls && i < 16; i++) {
                    CHECK_EQ_INT(c.commits[i].seq, whole.commits[i].seq);
                    CHECK(c.commit_len[i] == whole.commit_len[i]);
                }
                CHECK(!c.bad_order);
                if (steps[k] == 1) CHECK(reads > (int)(n - b)); /* it did stop inside chunks */
                free(c.buf);
            }
            free(whole.buf);
        }
        CHECK(chunk_log_cursor_open(l, 1, err, sizeof err) == NULL); /* not a boundary */
        chunk_log_close(l);
    }
    want_free(&w);
    test_remove_dir(t.dir);
}

TEST(chunklog_reopen_keeps_everything) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    want_log w = {0};
    chunk_log *l = build_standard(t.path, &w, 0, 13);
    CHECK(l != NULL);
    long size = test_file_size(t.path);
    chunk_log_close(l);
    l = open_checked(t.path, 0, &w);
    if (l) {
        CHECK_EQ_INT(test_file_size(t.path), size);
        /* and it goes on where it stopped */
        uint64_t rng = 99;
        CHECK_EQ_INT(add_chunk(l, &w, 8, 5000, 777, 1, &rng), 0);
        chunk_log_close(l);
        chunk_log_close(open_checked(t.path, 0, &w));
    }
    want_free(&w);
    test_remove_dir(t.dir);
}

TEST(chunklog_fsync_mode) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    chunk_log *l = chunk_log_open(t.path, 1, NULL, err, sizeof err);
    CHECK(l != NULL);
    if (l) {
        uint64_t rng = 5;
        CHECK_EQ_INT(add_chunk(l, &w, 1, 100000, 30000, 0, &rng), 0);
        CHECK_EQ_INT(add_chunk(l, &w, 2, 10, 3, 1, &rng), 0);
        chunk_log_close(l);
        chunk_log_close(open_checked(t.path, 1, &w));
    }
    want_free(&w);
    test_remove_dir(t.dir);
}

TEST(chunklog_abort_leaves_no_trace) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    int damaged = -1;
    chunk_log *l = chunk_log_open(t.path, 0, &damaged, err, sizeof err);
    CHECK(l != NULL);
    if (!l) {
        test_remove_dir(t.dir);
        return;
    }
    uint64_t rng = 21;
    CHECK_EQ_INT(add_chunk(l, &w, 1, 100000, 50000, 0, &rng), 0);
    CHECK_EQ_INT(add_chunk(l, &w, 2, 30000, 20000, 0, &rng), 0);
    long size = test_file_size(t.path);
    CHECK_EQ_INT(chunk_log_abort(l, err, sizeof err), 0); /* nothing open: a no-op */
    /* an aborted 2.5 MiB upload */
    size_t big = 5 * (1u << 19);
    unsigned char *junk = malloc(big);
    CHECK(junk != NULL);
    if (junk) {
        random_bytes(junk, big, &rng);
        CHECK_EQ_INT(chunk_log_begin(l, 3, err, sizeof err), 0);
        for (size_t off = 0; off < big; off += 48000)
            CHECK_EQ_INT(chunk_log_append(l, junk + off, big - off < 48000 ? big - off : 48000,
                                          err, sizeof err), 0);
        CHECK(test_file_size(t.path) > size + (long)big);
        CHECK_EQ_INT(chunk_log_abort(l, err, sizeof err), 0);
        CHECK_EQ_INT(test_file_size(t.path), size);
        check_entries(l, &w, w.n);
        CHECK(chunk_log_find(l, 3) == NULL);
        CHECK_EQ_INT(chunk_log_abort(l, err, sizeof err), 0);
        /* an aborted empty chunk */
        CHECK_EQ_INT(chunk_log_begin(l, 3, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_abort(l, err, sizeof err), 0);
        CHECK_EQ_INT(test_file_size(t.path), size);
        /* the same seq again, different bytes, commits */
        CHECK_EQ_INT(add_chunk(l, &w, 3, 70000, 9000, 0, &rng), 0);
        check_entries(l, &w, w.n);
        check_replay(l, 0, &w, 0, w.n);
        long size3 = test_file_size(t.path);
        /* close with a chunk open drops it as well */
        CHECK_EQ_INT(chunk_log_begin(l, 4, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_append(l, junk, 1000, err, sizeof err), 0);
        chunk_log_close(l);
        CHECK_EQ_INT(test_file_size(t.path), size3);
        l = open_checked(t.path, 0, &w);
        CHECK_EQ_INT(test_file_size(t.path), size3);
        free(junk);
    }
    chunk_log_close(l);
    want_free(&w);
    test_remove_dir(t.dir);
}

/* A small log whose frame layout is easy to walk: chunks of a few hundred bytes
 * in 2-4 pieces, the last one with several frames. */
static long build_small(const char *path, want_log *w, int n_chunks, uint64_t seed) {
    char err[256];
    chunk_log *l = chunk_log_open(path, 0, NULL, err, sizeof err);
    if (!l) return -1;
    uint64_t rng = seed;
    int rc = 0;
    for (int i = 0; i < n_chunks; i++)
        rc |= add_chunk(l, w, (uint64_t)(i + 1), 200 + 100 * (size_t)i, 150, 0, &rng);
    chunk_log_close(l);
    return rc ? -1 : test_file_size(path);
}

/* Number of entries of the written log that end at or before off. */
static int entries_before(const uint64_t *ends, int n, uint64_t off) {
    int k = 0;
    while (k < n && ends[k] <= off) k++;
    return k;
}

TEST(chunklog_torn_tail_every_offset) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    long size = build_small(t.path, &w, 4, 31);
    CHECK(size > 0);
    /* and an upload in progress at the "crash": frames of chunk 5, no commit */
    chunk_log *l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
    unsigned char piece[300];
    memset(piece, 'x', sizeof piece);
    CHECK(l && chunk_log_begin(l, 5, err, sizeof err) == 0);
    CHECK(l && chunk_log_append(l, piece, sizeof piece, err, sizeof err) == 0);
    CHECK(l && chunk_log_append(l, piece, 7, err, sizeof err) == 0);
    long len;
    unsigned char *img = test_slurp(t.path, &len); /* taken before close drops chunk 5 */
    chunk_log_close(l);
    CHECK(img != NULL && len > size);
    l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
    uint64_t ends[8];
    size_t n = 0;
    const chunk_log_entry *e = l ? chunk_log_entries(l, &n) : NULL;
    CHECK_EQ_INT(n, 4);
    for (size_t i = 0; i < n && i < 8; i++) ends[i] = e[i].end_offset;
    chunk_log_close(l);
    int bad = 0;
    for (long cut = 0; img && n == 4 && cut <= len && bad < 5; cut++) {
        if (test_spit(t.copy, img, cut) != 0) {
            CHECK(0);
            break;
        }
        int damaged = -1, before = test_failures;
        l = chunk_log_open(t.copy, 0, &damaged, err, sizeof err);
        CHECK(l != NULL);
        if (!l) {
            bad++;
            continue;
        }
        int k = entries_before(ends, 4, (uint64_t)cut);
        CHECK_EQ_INT(damaged, 0);
        check_entries(l, &w, k);
        CHECK_EQ_INT(test_file_size(t.copy), k ? (long)ends[k - 1] : 0);
        if (cut % 7 == 0 || cut >= (long)ends[3]) check_replay(l, 0, &w, 0, k);
        /* the torn chunk can be uploaded again */
        CHECK_EQ_INT(chunk_log_begin(l, (uint64_t)k + 1, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_append(l, "again", 5, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_commit(l, 0, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_last_seq(l), k + 1);
        chunk_log_close(l);
        if (test_failures != before) {
            fprintf(stderr, "  (cut at %ld of %ld)\n", cut, len);
            bad++;
        }
    }
    free(img);
    want_free(&w);
    test_remove_dir(t.dir);
}

/* Opens a copy of img with bit `bit` of byte off flipped; the log or NULL. */
static chunk_log *open_flipped(const char *copy, const unsigned char *img, long len, long off,
                               int bit, int *damaged) {
    unsigned char *b = malloc((size_t)len);
    if (!b) return NULL;
    memcpy(b, img, (size_t)len);
    b[off] ^= (unsigned char)(1u << bit);
    int rc = test_spit(copy, b, len);
    free(b);
    char err[256];
    return rc ? NULL : chunk_log_open(copy, 0, damaged, err, sizeof err);
}

/* The newest COPY.damaged-* in dir holds img (bit flipped at off) from `from` on. */
static void check_damaged_copy(const char *dir, const unsigned char *img, long len, long off, int bit, long from) {
    DIR *d = opendir(dir);
    char name[512] = "";
    struct dirent *ent;
    size_t at = strlen(dir) + 1; /* (names of one length: the newest is the greatest) */
    while (d && (ent = readdir(d)))
        if (!strncmp(ent->d_name, "copy.damaged-", 13) && (!name[0] || strcmp(ent->d_name, name + at) > 0))
            snprintf(name, sizeof name, "%s/%s", dir, ent->d_name);
    if (d) closedir(d);
    CHECK(name[0] != 0);
    long n = 0;
    unsigned char *got = name[0] ? test_slurp(name, &n) : NULL;
    CHECK_EQ_INT(n, len - from);
    if (got && n == len - from) {
        unsigned char *want = malloc((size_t)len);
        memcpy(want, img, (size_t)len);
        want[off] ^= (unsigned char)(1u << bit);
        CHECK(memcmp(got, want + from, (size_t)n) == 0);
        free(want);
    }
    free(got);
}

TEST(chunklog_bitflip_middle_is_damage) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    long len = build_small(t.path, &w, 4, 41);
    CHECK(len > 0);
    unsigned char *img = test_slurp(t.path, &len);
    chunk_log *l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
    size_t n = 0;
    const chunk_log_entry *e = l ? chunk_log_entries(l, &n) : NULL;
    CHECK_EQ_INT(n, 4);
    uint64_t ends[4] = {0};
    for (size_t i = 0; i < n && i < 4; i++) ends[i] = e[i].end_offset;
    chunk_log_close(l);
    int bad = 0;
    /* every byte before the last COMMIT frame: a later commit survives, so it is damage */
    for (long off = 0; img && n == 4 && off < (long)ends[3] - 40 && bad < 5; off++) {
        int damaged = -1, before = test_failures;
        l = open_flipped(t.copy, img, len, off, (int)(off % 8), &damaged);
        CHECK(l != NULL);
        if (l) {
            int k = entries_before(ends, 4, (uint64_t)off);
            CHECK_EQ_INT(damaged, 1);
            check_entries(l, &w, k);
            CHECK_EQ_INT(test_file_size(t.copy), k ? (long)ends[k - 1] : 0);
            if (off % 11 == 0) check_replay(l, 0, &w, 0, k);
            chunk_log_close(l);
            if (off == (long)ends[1] + 7) /* the acknowledged chunks after the damage are kept aside, whole */
                check_damaged_copy(t.dir, img, len, off, (int)(off % 8), (long)ends[k - 1]);
        }
        if (test_failures != before) {
            fprintf(stderr, "  (flip at %ld)\n", off);
            bad++;
        }
    }
    free(img);
    want_free(&w);
    test_remove_dir(t.dir);
}

TEST(chunklog_bitflip_last_frame_is_torn) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    want_log w = {0};
    long len = build_small(t.path, &w, 3, 51);
    CHECK(len > 40);
    unsigned char *img = test_slurp(t.path, &len);
    long prev_end = -1;
    { /* end of chunk 2 */
        char err[256];
        chunk_log *l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
        CHECK(l != NULL);
        if (l) prev_end = (long)chunk_log_find(l, 2)->end_offset;
        chunk_log_close(l);
    }
    int bad = 0;
    for (long off = len - 40; img && prev_end > 0 && off < len && bad < 5; off++)
        for (int bit = 0; bit < 8; bit++) {
            int damaged = -1, before = test_failures;
            chunk_log *l = open_flipped(t.copy, img, len, off, bit, &damaged);
            CHECK(l != NULL);
            if (l) {
                CHECK_EQ_INT(damaged, 0);
                check_entries(l, &w, 2);
                CHECK_EQ_INT(test_file_size(t.copy), prev_end);
                chunk_log_close(l);
            }
            if (test_failures != before) {
                fprintf(stderr, "  (flip at %ld bit %d)\n", off, bit);
                bad++;
            }
        }
    free(img);
    want_free(&w);
    test_remove_dir(t.dir);
}

TEST(chunklog_garbage_never_invents_entries) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    long vlen = build_small(t.path, &w, 4, 61);
    CHECK(vlen > 0);
    unsigned char *valid = test_slurp(t.path, &vlen);
    unsigned char *b = malloc(16384);
    CHECK(valid != NULL && b != NULL);
    uint64_t rng = 0x1234567;
    int bad = 0;
    for (int iter = 0; valid && b && iter < 1200 && bad < 5; iter++) {
        int mode = iter % 4, before = test_failures;
        long len = iter % 50 == 0 ? 0 : (long)(rng_next(&rng) % 8192);
        int keep = 0; /* mode 2: the whole valid log must survive */
        if (mode <= 1) { /* random bytes; mode 1 sprinkled with plausible frame headers */
            random_bytes(b, (size_t)len, &rng);
            for (int h = 0; mode == 1 && h < 8 && len >= 24; h++) {
                long at = (long)(rng_next(&rng) % (uint64_t)(len - 23));
                unsigned char hdr[20] = {0xFF, 'C', 'L', '1', (unsigned char)(1 + h % 2), 0, 0, 0,
                                         (unsigned char)(1 + rng_next(&rng) % 4)};
                uint32_t plen = h % 2 ? 16 : (uint32_t)(rng_next(&rng) % 64);
                for (int i = 0; i < 4; i++) hdr[16 + i] = (unsigned char)(plen >> (8 * i));
                memcpy(b + at, hdr, sizeof hdr);
            }
        } else if (mode == 2) { /* garbage after a valid log */
            memcpy(b, valid, (size_t)vlen);
            random_bytes(b + vlen, (size_t)len, &rng);
            len += vlen;
            keep = 1;
        } else { /* a valid log with a few random bytes overwritten */
            memcpy(b, valid, (size_t)vlen);
            len = vlen;
            int k = 1 + (int)(rng_next(&rng) % 5);
            for (int i = 0; i < k; i++) b[rng_next(&rng) % (uint64_t)vlen] = (unsigned char)rng_next(&rng);
        }
        if (test_spit(t.copy, b, len) != 0) {
            CHECK(0);
            break;
        }
        int damaged = -1;
        chunk_log *l = chunk_log_open(t.copy, 0, &damaged, err, sizeof err);
        CHECK(l != NULL);
        if (!l) {
            bad++;
            continue;
        }
        size_t n;
        const chunk_log_entry *e = chunk_log_entries(l, &n);
        CHECK(damaged == 0 || damaged == 1);
        if (mode <= 1) {
            CHECK_EQ_INT(n, 0);
            CHECK_EQ_INT(damaged, 0);
        } else if (keep) {
            CHECK_EQ_INT(n, w.n);
            CHECK_EQ_INT(damaged, 0);
        }
        /* whatever is listed is a prefix of what was written, byte for byte */
        CHECK(n <= (size_t)w.n);
        if (n <= (size_t)w.n) {
            check_entries(l, &w, (int)n);
            check_replay(l, 0, &w, 0, (int)n);
        }
        CHECK_EQ_INT(test_file_size(t.copy), n ? (long)e[n - 1].end_offset : 0);
        /* and the log is usable */
        uint64_t next = chunk_log_last_seq(l) + 1;
        CHECK_EQ_INT(chunk_log_begin(l, next, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_append(l, b, 100, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_commit(l, 1, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_last_seq(l), next);
        chunk_log_close(l);
        if (test_failures != before) {
            fprintf(stderr, "  (garbage iteration %d, mode %d, %ld bytes)\n", iter, mode, len);
            bad++;
        }
    }
    free(b);
    free(valid);
    want_free(&w);
    test_remove_dir(t.dir);
}

TEST(chunklog_misuse_refused) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    chunk_log *l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
    CHECK(l != NULL);
    if (l) {
        err[0] = 0;
        CHECK_EQ_INT(chunk_log_append(l, "x", 1, err, sizeof err), -1);
        CHECK(err[0] != 0);
        CHECK_EQ_INT(chunk_log_commit(l, 0, err, sizeof err), -1);
        CHECK_EQ_INT(chunk_log_begin(l, 0, err, sizeof err), -1);
        CHECK_EQ_INT(chunk_log_begin(l, 1, err, sizeof err), 0);
        err[0] = 0;
        CHECK_EQ_INT(chunk_log_begin(l, 1, err, sizeof err), -1); /* begin twice */
        CHECK(err[0] != 0);
        CHECK_EQ_INT(chunk_log_begin(l, 2, err, sizeof err), -1);
        CHECK_EQ_INT(chunk_log_append(l, NULL, 3, err, sizeof err), -1);
        CHECK_EQ_INT(chunk_log_append(l, NULL, 0, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_append(l, "abc", 3, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_commit(l, 0, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_begin(l, 1, err, sizeof err), -1); /* not increasing */
        CHECK_EQ_INT(chunk_log_begin(l, 3, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_commit(l, 1, err, sizeof err), 0); /* empty final chunk */
        CHECK_EQ_INT(chunk_log_is_final(l), 1);
        err[0] = 0;
        CHECK_EQ_INT(chunk_log_begin(l, 4, err, sizeof err), -1); /* after final */
        CHECK(err[0] != 0);
        CHECK_EQ_INT(chunk_log_find(l, 3)->bytes, 0);
        CHECK_EQ_INT(chunk_log_find(l, 3)->crc, 0);
        /* one chunk_log per file */
        err[0] = 0;
        CHECK(chunk_log_open(t.path, 0, NULL, err, sizeof err) == NULL);
        CHECK(err[0] != 0);
        chunk_log_close(l);
        l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
        CHECK(l != NULL);
        CHECK_EQ_INT(chunk_log_last_seq(l), 3);
        CHECK_EQ_INT(chunk_log_is_final(l), 1);
        chunk_log_close(l);
    }
    /* I/O errors: a missing directory, a directory */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/log", t.dir);
    err[0] = 0;
    CHECK(chunk_log_open(bad, 0, NULL, err, sizeof err) == NULL);
    CHECK(err[0] != 0);
    err[0] = 0;
    CHECK(chunk_log_open(t.dir, 0, NULL, err, sizeof err) == NULL);
    CHECK(err[0] != 0);
    chunk_log_close(NULL);
    test_remove_dir(t.dir);
}

TEST(chunklog_replay_callback_stops) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    CHECK(build_small(t.path, &w, 3, 71) > 0);
    chunk_log *l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
    CHECK(l != NULL);
    if (l) {
        collect c = {0};
        c.stop_data_at = 2;
        err[0] = 0;
        CHECK_EQ_INT(chunk_log_replay(l, 0, on_data, on_commit, &c, err, sizeof err), -1);
        CHECK(err[0] != 0);
        CHECK_EQ_INT(c.data_calls, 2);
        CHECK_EQ_INT(c.commit_calls, 0);
        free(c.buf);
        collect d = {0};
        d.stop_commit_at = 1;
        err[0] = 0;
        CHECK_EQ_INT(chunk_log_replay(l, 0, on_data, on_commit, &d, err, sizeof err), -1);
        CHECK(err[0] != 0);
        CHECK_EQ_INT(d.commit_calls, 1);
        CHECK_EQ_INT(d.len, w.c[0].len); /* nothing of chunk 2 */
        free(d.buf);
        /* and a full replay still works afterwards */
        check_replay(l, 0, &w, 0, w.n);
        chunk_log_close(l);
    }
    want_free(&w);
    test_remove_dir(t.dir);
}

TEST(chunklog_replay_catches_later_damage) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    want_log w = {0};
    CHECK(build_small(t.path, &w, 3, 81) > 0);
    chunk_log *l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
    CHECK(l != NULL);
    if (l) {
        /* a byte of chunk 2 changes on disk behind the open log */
        long at = (long)chunk_log_find(l, 1)->end_offset + 30;
        int fd = open(t.path, O_RDWR);
        CHECK(fd >= 0);
        unsigned char x = 0;
        CHECK(fd >= 0 && pread(fd, &x, 1, at) == 1);
        x ^= 0x10;
        CHECK(fd >= 0 && pwrite(fd, &x, 1, at) == 1);
        if (fd >= 0) close(fd);
        collect c = {0};
        err[0] = 0;
        CHECK_EQ_INT(chunk_log_replay(l, 0, on_data, on_commit, &c, err, sizeof err), -1);
        CHECK(strstr(err, "damaged") != NULL);
        CHECK_EQ_INT(c.commit_calls, 1);
        free(c.buf);
        chunk_log_close(l);
    }
    want_free(&w);
    test_remove_dir(t.dir);
}

/* ---- the format, encoded independently from the comment in server/chunklog.c ---------- */

static size_t enc_frame(unsigned char *out, int type, uint64_t seq, const void *payload,
                        uint32_t len) {
    unsigned char *p = out;
    p[0] = 0xFF, p[1] = 'C', p[2] = 'L', p[3] = '1', p[4] = (unsigned char)type;
    p[5] = p[6] = p[7] = 0;
    for (int i = 0; i < 8; i++) p[8 + i] = (unsigned char)(seq >> (8 * i));
    for (int i = 0; i < 4; i++) p[16 + i] = (unsigned char)(len >> (8 * i));
    if (len) memcpy(p + 20, payload, len);
    uint32_t crc = crc32c(0, p, 20 + (size_t)len);
    for (int i = 0; i < 4; i++) p[20 + len + i] = (unsigned char)(crc >> (8 * i));
    return 24 + (size_t)len;
}

static size_t enc_commit(unsigned char *out, uint64_t seq, uint64_t bytes, uint32_t crc,
                         uint32_t flags) {
    unsigned char pl[16];
    for (int i = 0; i < 8; i++) pl[i] = (unsigned char)(bytes >> (8 * i));
    for (int i = 0; i < 4; i++) pl[8 + i] = (unsigned char)(crc >> (8 * i));
    for (int i = 0; i < 4; i++) pl[12 + i] = (unsigned char)(flags >> (8 * i));
    return enc_frame(out, 2, seq, pl, 16);
}

TEST(chunklog_format_matches_doc) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    size_t big = (1u << 20) + 10;
    unsigned char *doc = malloc(big), *want = malloc(big + 4096);
    CHECK(doc && want);
    chunk_log *l = chunk_log_open(t.path, 0, NULL, err, sizeof err);
    CHECK(l != NULL);
    if (doc && want && l) {
        uint64_t rng = 7;
        random_bytes(doc, big, &rng);
        /* chunk 1: "hello" + " world"; chunk 4: 1 MiB + 10 in one append; chunk 9: empty, final */
        CHECK_EQ_INT(chunk_log_begin(l, 1, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_append(l, "hello", 5, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_append(l, " world", 6, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_commit(l, 0, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_begin(l, 4, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_append(l, doc, big, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_commit(l, 0, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_begin(l, 9, err, sizeof err), 0);
        CHECK_EQ_INT(chunk_log_commit(l, 1, err, sizeof err), 0);
        chunk_log_close(l);
        size_t n = 0;
        n += enc_frame(want + n, 1, 1, "hello", 5);
        n += enc_frame(want + n, 1, 1, " world", 6);
        n += enc_commit(want + n, 1, 11, crc32c(0, "hello world", 11), 0);
        n += enc_frame(want + n, 1, 4, doc, 1u << 20);
        n += enc_frame(want + n, 1, 4, doc + (1u << 20), 10);
        n += enc_commit(want + n, 4, big, crc32c(0, doc, big), 0);
        n += enc_commit(want + n, 9, 0, 0, 1);
        long len;
        unsigned char *got = test_slurp(t.path, &len);
        CHECK_EQ_INT(len, (long)n);
        CHECK(got && len == (long)n && memcmp(got, want, n) == 0);
        free(got);
    } else {
        chunk_log_close(l);
    }
    free(doc);
    free(want);
    test_remove_dir(t.dir);
}

/* Frames with valid CRCs that break the writer's rules end the log where they start. */
TEST(chunklog_rule_breaking_frames_rejected) {
    test_dir t;
    if (test_dir_make(&t) != 0) return;
    char err[256];
    unsigned char f[4096];
    uint32_t crc_ab = crc32c(0, "ab", 2), crc_a = crc32c(0, "a", 1);
    for (int c = 0; c < 11; c++) {
        size_t n = 0;
        /* a good chunk 1 = "ab" */
        n += enc_frame(f + n, 1, 1, "ab", 2);
        n += enc_commit(f + n, 1, 2, crc_ab, 0);
        size_t good = n;
        int tail_commit = 1; /* a valid commit follows the bad frame: reported as damage */
        switch (c) {
        case 0: /* commit size does not match the data */
            n += enc_frame(f + n, 1, 2, "a", 1);
            n += enc_commit(f + n, 2, 2, crc_a, 0);
            tail_commit = 0; /* the bad frame is that commit itself */
            break;
        case 1: /* commit CRC does not match the data */
            n += enc_frame(f + n, 1, 2, "a", 1);
            n += enc_commit(f + n, 2, 1, crc_a ^ 1, 0);
            tail_commit = 0;
            break;
        case 2: /* seq repeats */
            n += enc_frame(f + n, 1, 1, "a", 1);
            n += enc_commit(f + n, 1, 1, crc_a, 0);
            break;
        case 3: /* data of one chunk, commit of another */
            n += enc_frame(f + n, 1, 2, "a", 1);
            n += enc_commit(f + n, 3, 1, crc_a, 0);
            tail_commit = 0;
            break;
        case 4: /* seq 0 */
            n += enc_frame(f + n, 1, 0, "a", 1);
            n += enc_commit(f + n, 2, 1, crc_a, 0);
            break;
        case 5: /* unknown flag bits */
            n += enc_commit(f + n, 2, 0, 0, 2);
            n += enc_commit(f + n, 3, 0, 0, 0);
            break;
        case 6: /* a chunk after the final one */
            n += enc_commit(f + n, 2, 0, 0, 1);
            good = n;
            n += enc_commit(f + n, 3, 0, 0, 0);
            tail_commit = 0;
            break;
        case 7: /* unknown frame type */
            n += enc_frame(f + n, 3, 2, "a", 1);
            n += enc_commit(f + n, 2, 0, 0, 0);
            break;
        case 8: /* empty DATA frame */
            n += enc_frame(f + n, 1, 2, "", 0);
            n += enc_commit(f + n, 2, 0, 0, 0);
            break;
        case 9: /* commit of the wrong payload size */
            n += enc_frame(f + n, 2, 2, "0123456789abcdef0", 17);
            n += enc_commit(f + n, 3, 0, 0, 0);
            break;
        case 10: /* nonzero padding */
            n += enc_frame(f + n, 1, 2, "a", 1);
            f[good + 6] = 1;
            { /* re-seal its CRC so only the padding is wrong */
                uint32_t crc = crc32c(0, f + good, 21);
                for (int i = 0; i < 4; i++) f[good + 21 + i] = (unsigned char)(crc >> (8 * i));
            }
            n += enc_commit(f + n, 2, 1, crc_a, 0);
            break;
        }
        CHECK(test_spit(t.path, f, (long)n) == 0);
        int damaged = -1, before = test_failures;
        chunk_log *l = chunk_log_open(t.path, 0, &damaged, err, sizeof err);
        CHECK(l != NULL);
        if (l) {
            CHECK_EQ_INT(chunk_log_committed_size(l), good);
            CHECK_EQ_INT(test_file_size(t.path), (long)good);
            CHECK_EQ_INT(damaged, tail_commit);
            CHECK(chunk_log_find(l, 1) && chunk_log_find(l, 1)->crc == crc_ab);
            chunk_log_close(l);
        }
        if (test_failures != before) fprintf(stderr, "  (case %d)\n", c);
    }
    test_remove_dir(t.dir);
}
