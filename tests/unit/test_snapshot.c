/* Pot snapshots: CRC-32C vectors, exact f16/f32 round trips (with and without
 * extra bytes), every truncation and every single-byte flip of a small
 * snapshot refused, version 1 files still read, future versions refused by
 * name, clean failures (missing directory, a write cut short by the file size
 * limit), and atomic replacement seen by a concurrent reader. */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/common.h"
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

/* Bit-at-a-time CRC-32C, the definition the table and hardware paths must match. */
static uint32_t crc32c_reference(const unsigned char *p, size_t len) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < len; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
    }
    return ~c;
}

TEST(crc32c_known_vectors) {
    CHECK_EQ_INT(crc32c(0, "", 0), 0);
    CHECK_EQ_INT(crc32c(0, "123456789", 9), 0xE3069283u);
    unsigned char b[64];
    memset(b, 0, 32); /* RFC 3720 B.4 */
    CHECK_EQ_INT(crc32c(0, b, 32), 0x8A9136AAu);
    memset(b, 0xff, 32);
    CHECK_EQ_INT(crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
    CHECK_EQ_INT(crc32c(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
    CHECK_EQ_INT(crc32c(0, b, 32), 0x113FDB5Cu);
    /* random buffers at every alignment and many lengths, whole and split anywhere */
    uint64_t seed = 42;
    size_t big = 4096 + 64;
    unsigned char *buf = malloc(big);
    random_bytes(buf, big, &seed);
    for (size_t off = 0; off < 8; off++)
        for (size_t len = 0; len <= 300; len += (len < 80 ? 1 : 37)) {
            uint32_t want = crc32c_reference(buf + off, len);
            CHECK_EQ_INT(crc32c(0, buf + off, len), want);
            for (size_t cut = 0; cut <= len; cut += 13)
                CHECK_EQ_INT(crc32c(crc32c(0, buf + off, cut), buf + off + cut, len - cut), want);
        }
    CHECK_EQ_INT(crc32c(0, buf + 3, 4096), crc32c_reference(buf + 3, 4096));
    free(buf);
}

/* Rewrites the checksum after a test changed the bytes before it. */
static void put_checksum(unsigned char *b, long len) {
    uint32_t crc = crc32c(0, b, (size_t)len - 4);
    for (int i = 0; i < 4; i++) b[len - 4 + i] = (unsigned char)(crc >> (8 * i));
}

/* A pot with random bits in every slot (NaNs included), so equality is bitwise. */
static pot *random_pot(int32_t L, int32_t H, int32_t D, int32_t cap, int32_t n,
                       enum pot_dtype dtype, uint64_t seed) {
    char err[160];
    pot *p = pot_new(L, H, D, cap, dtype, err, sizeof err);
    if (!p) return NULL;
    size_t slots = (size_t)L * H * cap, elem = dtype == POT_F32 ? 4 : 2;
    random_bytes(p->k, slots * D * elem, &seed);
    random_bytes(p->v, slots * D * elem, &seed);
    random_bytes(p->token_index, slots * sizeof *p->token_index, &seed);
    random_bytes(p->surprisal, slots * sizeof *p->surprisal, &seed);
    random_bytes(p->score_acc, slots * sizeof *p->score_acc, &seed);
    random_bytes(p->joins, slots * sizeof *p->joins, &seed);
    p->n = n;
    p->n_pinned = n < 4 ? n : 4;
    p->n_seen = 123456789012345ll + n;
    return p;
}

/* 1 when a and b hold the same shape, counts and bytes in every valid slot;
 * b's joins may instead all be 0 when b was read from a file older than them. */
static int pots_equal_but_joins(const pot *a, const pot *b, int b_without_joins) {
    if (a->n_layer != b->n_layer || a->n_head_kv != b->n_head_kv || a->head_dim != b->head_dim ||
        a->dtype != b->dtype || a->n != b->n || a->n_pinned != b->n_pinned ||
        a->n_seen != b->n_seen)
        return 0;
    size_t row = (size_t)a->head_dim * (a->dtype == POT_F32 ? 4 : 2), n = (size_t)a->n;
    for (int32_t l = 0; l < a->n_layer; l++)
        for (int32_t h = 0; h < a->n_head_kv; h++) {
            size_t sa = pot_slot(a, l, h, 0), sb = pot_slot(b, l, h, 0);
            if (memcmp((char *)a->k + sa * row, (char *)b->k + sb * row, n * row) ||
                memcmp((char *)a->v + sa * row, (char *)b->v + sb * row, n * row) ||
                memcmp(a->token_index + sa, b->token_index + sb, n * 8) ||
                memcmp(a->surprisal + sa, b->surprisal + sb, n * 4) ||
                memcmp(a->score_acc + sa, b->score_acc + sb, n * 4))
                return 0;
            for (size_t i = 0; i < n; i++)
                if (b->joins[sb + i] != (b_without_joins ? 0 : a->joins[sa + i])) return 0;
        }
    return 1;
}

static int pots_equal(const pot *a, const pot *b) { return pots_equal_but_joins(a, b, 0); }

static pot_snapshot_meta make_meta(uint64_t log_offset, const char *settings) {
    pot_snapshot_meta m;
    memset(&m, 0, sizeof m);
    m.model_fingerprint = 0x0123456789abcdefull;
    m.log_offset = log_offset;
    snprintf(m.settings, sizeof m.settings, "%s", settings);
    return m;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

TEST(snapshot_round_trip_f16_f32) {
    char *dir = test_make_tempdir("potserve_snap_");
    CHECK(dir != NULL);
    if (!dir) return;
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/pot.snap", dir);
    const char *settings = "policy=infinipot schedule=imdc budget_tokens=2048 keep_tokens=1024";
    enum pot_dtype types[2] = {POT_F16, POT_F32};
    for (int t = 0; t < 2; t++) {
        pot *p = random_pot(3, 2, 5, 20, 13, types[t], 7 + t);
        pot_snapshot_meta m = make_meta((1ull << 40) + 5, settings), back;
        CHECK_EQ_INT(pot_snapshot_write(path, p, &m, err, sizeof err), 0);
        /* the size the documented layout implies: 72-byte header, settings, slots, CRC */
        size_t elem = types[t] == POT_F32 ? 4 : 2;
        CHECK_EQ_INT(test_file_size(path), 72 + strlen(settings) + 3 * 2 * 13 * (2 * 5 * elem + 17) + 4);
        memset(&back, 0x55, sizeof back);
        pot *q = pot_snapshot_read(path, 0, &back, err, sizeof err);
        CHECK(q != NULL);
        if (q) {
            CHECK(pots_equal(p, q));
            CHECK_EQ_INT(q->capacity, 13);
            CHECK(back.model_fingerprint == m.model_fingerprint);
            CHECK(back.log_offset == m.log_offset);
            CHECK_STR(back.settings, settings);
            pot_free(q);
        }
        q = pot_snapshot_read(path, 64, &back, err, sizeof err);
        CHECK(q && q->capacity == 64 && pots_equal(p, q));
        pot_free(q);
        /* an empty pot, empty settings, and no temporary file left behind */
        p->n = p->n_pinned = 0;
        m = make_meta(0, "");
        CHECK_EQ_INT(pot_snapshot_write(path, p, &m, err, sizeof err), 0);
        q = pot_snapshot_read(path, 0, &back, err, sizeof err);
        CHECK(q && q->n == 0 && q->capacity == 1 && pots_equal(p, q) && back.settings[0] == 0);
        pot_free(q);
        CHECK_EQ_INT(count_entries(dir), 1);
        pot_free(p);
    }
    /* settings of the maximum length round-trip; unterminated ones are refused */
    pot *p = random_pot(1, 1, 4, 4, 2, POT_F16, 3);
    pot_snapshot_meta m = make_meta(9, ""), back;
    memset(m.settings, 'x', sizeof m.settings - 1);
    CHECK_EQ_INT(pot_snapshot_write(path, p, &m, err, sizeof err), 0);
    pot *q = pot_snapshot_read(path, 0, &back, err, sizeof err);
    CHECK(q && strlen(back.settings) == sizeof m.settings - 1 && back.settings[5] == 'x');
    pot_free(q);
    memset(m.settings, 'x', sizeof m.settings);
    CHECK_EQ_INT(pot_snapshot_write(path, p, &m, err, sizeof err), -1);
    CHECK(strstr(err, "settings") != NULL);
    /* an inconsistent pot is refused before anything is written */
    m = make_meta(9, "");
    p->n_pinned = 3;
    CHECK_EQ_INT(pot_snapshot_write(path, p, &m, err, sizeof err), -1);
    p->n_pinned = 0;
    p->n = 5;
    CHECK_EQ_INT(pot_snapshot_write(path, p, &m, err, sizeof err), -1);
    CHECK(strstr(err, "out of range") != NULL);
    pot_free(p);
    CHECK_EQ_INT(count_entries(dir), 1);
    test_remove_dir(dir);
}

/* Writes a small snapshot (a few hundred bytes) and returns its bytes. */
static unsigned char *small_snapshot(const char *path, long *len) {
    char err[256];
    pot *p = random_pot(2, 2, 2, 3, 2, POT_F16, 11);
    pot_snapshot_meta m = make_meta(777, "policy=snapkv");
    int rc = pot_snapshot_write(path, p, &m, err, sizeof err);
    pot_free(p);
    return rc == 0 ? test_slurp(path, len) : NULL;
}

TEST(snapshot_every_truncation_refused) {
    char *dir = test_make_tempdir("potserve_snap_");
    char path[512], cut[512], err[256];
    snprintf(path, sizeof path, "%s/pot.snap", dir);
    snprintf(cut, sizeof cut, "%s/cut.snap", dir);
    long len = 0;
    unsigned char *b = small_snapshot(path, &len);
    CHECK(b != NULL && len > 64);
    if (!b) return;
    pot_snapshot_meta m;
    for (long k = 0; k < len; k++) {
        CHECK_EQ_INT(test_spit(cut, b, k), 0);
        err[0] = 0;
        pot *q = pot_snapshot_read(cut, 0, &m, err, sizeof err);
        CHECK(q == NULL && err[0] != 0);
        pot_free(q);
        if (k >= 12 && !strstr(err, "truncated")) {
            test_failures++;
            fprintf(stderr, "  %ld bytes: \"%s\"\n", k, err);
        }
    }
    /* one byte too many is refused as well */
    b[len] = 0;
    CHECK_EQ_INT(test_spit(cut, b, len + 1), 0);
    CHECK(pot_snapshot_read(cut, 0, &m, err, sizeof err) == NULL);
    CHECK(strstr(err, "size mismatch") != NULL);
    /* the untouched file still reads */
    pot *q = pot_snapshot_read(path, 0, &m, err, sizeof err);
    CHECK(q != NULL);
    pot_free(q);
    free(b);
    test_remove_dir(dir);
}

TEST(snapshot_every_byte_flip_refused) {
    char *dir = test_make_tempdir("potserve_snap_");
    char path[512], bad[512], err[256];
    snprintf(path, sizeof path, "%s/pot.snap", dir);
    snprintf(bad, sizeof bad, "%s/bad.snap", dir);
    long len = 0;
    unsigned char *b = small_snapshot(path, &len);
    CHECK(b != NULL);
    if (!b) return;
    static const unsigned char masks[] = {0x01, 0x80, 0xff, 0x5a};
    pot_snapshot_meta m;
    int by_checksum = 0;
    for (long i = 0; i < len; i++)
        for (size_t k = 0; k < sizeof masks; k++) {
            b[i] ^= masks[k];
            CHECK_EQ_INT(test_spit(bad, b, len), 0);
            err[0] = 0;
            pot *q = pot_snapshot_read(bad, 0, &m, err, sizeof err);
            if (q || !err[0]) {
                test_failures++;
                fprintf(stderr, "  flip 0x%02x at byte %ld was accepted\n", masks[k], i);
            }
            by_checksum += strstr(err, "checksum") != NULL;
            pot_free(q);
            b[i] ^= masks[k];
        }
    /* the settings, the payload and the checksum itself are all only caught by the checksum */
    CHECK(by_checksum >= (int)((len - 72) * sizeof masks));
    free(b);
    test_remove_dir(dir);
}

TEST(snapshot_foreign_and_future_files_refused) {
    char *dir = test_make_tempdir("potserve_snap_");
    char path[512], other[512], err[256];
    snprintf(path, sizeof path, "%s/pot.snap", dir);
    snprintf(other, sizeof other, "%s/other.snap", dir);
    long len = 0;
    unsigned char *b = small_snapshot(path, &len);
    CHECK(b != NULL);
    if (!b) return;
    pot_snapshot_meta m;
    /* version 4 with a valid checksum: what a newer potserve would write */
    b[8] = 4;
    put_checksum(b, len);
    CHECK_EQ_INT(test_spit(other, b, len), 0);
    CHECK(pot_snapshot_read(other, 0, &m, err, sizeof err) == NULL);
    CHECK(strstr(err, "version 4 is newer") != NULL);
    /* a newer version with a different layout (here: a short file) is still named as such */
    CHECK_EQ_INT(test_spit(other, b, 12), 0);
    CHECK(pot_snapshot_read(other, 0, &m, err, sizeof err) == NULL);
    CHECK(strstr(err, "newer") != NULL);
    b[8] = 0;
    CHECK_EQ_INT(test_spit(other, b, len), 0);
    CHECK(pot_snapshot_read(other, 0, &m, err, sizeof err) == NULL);
    CHECK(strstr(err, "unsupported format version 0") != NULL);
    /* something else entirely */
    CHECK_EQ_INT(test_spit(other, (const unsigned char *)"GGUF\3\0\0\0\0\0\0\0\0\0\0\0", 16), 0);
    CHECK(pot_snapshot_read(other, 0, &m, err, sizeof err) == NULL);
    CHECK(strstr(err, "not a pot snapshot") != NULL);
    CHECK(pot_snapshot_read(dir, 0, &m, err, sizeof err) == NULL);
    CHECK(strstr(err, "not a regular file") != NULL);
    snprintf(other, sizeof other, "%s/missing.snap", dir);
    CHECK(pot_snapshot_read(other, 0, &m, err, sizeof err) == NULL);
    CHECK(strstr(err, "No such file") != NULL);
    free(b);
    test_remove_dir(dir);
}

/* Rewrites a version 3 snapshot without extra bytes of `heads` (layer, head)
 * blocks of n slots, f16 rows of head_dim, as the version 2 file an older
 * potserve wrote: no joins after each block's score_acc. */
static long as_version_2(unsigned char *b, long len, long settings_len, long heads, long n, long head_dim) {
    long at = 72 + settings_len, kept = n * (2 * head_dim * 2 + 16);
    for (long h = 0; h < heads; h++) {
        at += kept;
        memmove(b + at, b + at + n, (size_t)(len - at - n));
        len -= n;
    }
    b[8] = 2;
    put_checksum(b, len);
    return len;
}

/* Rewrites a version 2 snapshot without extra bytes as the version 1 file:
 * no extra_len field, version 1, checksum recomputed. */
static long as_version_1(unsigned char *b, long len) {
    memmove(b + 64, b + 72, (size_t)(len - 72));
    len -= 8;
    b[8] = 1;
    put_checksum(b, len);
    return len;
}

TEST(snapshot_extra_bytes_and_version_1) {
    char *dir = test_make_tempdir("potserve_snap_");
    char path[512], other[512], err[256];
    snprintf(path, sizeof path, "%s/pot.snap", dir);
    snprintf(other, sizeof other, "%s/other.snap", dir);
    pot *p = random_pot(2, 3, 4, 9, 7, POT_F16, 31);
    pot_snapshot_meta m = make_meta(4242, "policy=h2o"), back;
    unsigned char extra[300];
    uint64_t seed = 5;
    random_bytes(extra, sizeof extra, &seed);
    /* extra bytes round-trip beside the pot; plain readers check and drop them */
    CHECK_EQ_INT(pot_snapshot_write_extra(path, p, &m, extra, sizeof extra, err, sizeof err), 0);
    CHECK_EQ_INT(test_file_size(path), 72 + 10 + (long)sizeof extra + 2 * 3 * 7 * (2 * 4 * 2 + 17) + 4);
    void *ex = NULL;
    size_t ex_len = 0;
    pot *q = pot_snapshot_read_extra(path, 0, &back, &ex, &ex_len, err, sizeof err);
    CHECK(q && pots_equal(p, q) && back.log_offset == 4242);
    CHECK(ex && ex_len == sizeof extra && memcmp(ex, extra, sizeof extra) == 0);
    pot_free(q);
    free(ex);
    q = pot_snapshot_read(path, 0, &back, err, sizeof err);
    CHECK(q && pots_equal(p, q));
    pot_free(q);
    /* every flip inside the extra bytes is caught by the checksum */
    long len = 0;
    unsigned char *b = test_slurp(path, &len);
    CHECK(b != NULL);
    for (long i = 72 + 10; b && i < 72 + 10 + (long)sizeof extra; i += 7) {
        b[i] ^= 0x10;
        CHECK_EQ_INT(test_spit(other, b, len), 0);
        ex = (void *)1;
        CHECK(pot_snapshot_read_extra(other, 0, &back, &ex, &ex_len, err, sizeof err) == NULL);
        CHECK(strstr(err, "checksum") != NULL && ex == NULL);
        b[i] ^= 0x10;
    }
    free(b);
    /* no extra bytes: NULL and 0; a version 1 file still reads, with no extra bytes */
    CHECK_EQ_INT(pot_snapshot_write_extra(path, p, &m, NULL, 0, err, sizeof err), 0);
    q = pot_snapshot_read_extra(path, 0, &back, &ex, &ex_len, err, sizeof err);
    CHECK(q && pots_equal(p, q) && ex == NULL && ex_len == 0);
    pot_free(q);
    b = test_slurp(path, &len);
    CHECK(b != NULL);
    if (b) {
        /* version 2: the same pot, its joins read as 0 */
        len = as_version_2(b, len, 10, 2 * 3, 7, 4);
        CHECK_EQ_INT(test_spit(other, b, len), 0);
        q = pot_snapshot_read(other, 0, &back, err, sizeof err);
        CHECK(q && pots_equal_but_joins(p, q, 1) && back.log_offset == 4242);
        pot_free(q);
        len = as_version_1(b, len);
        CHECK_EQ_INT(test_spit(other, b, len), 0);
        ex_len = 99;
        q = pot_snapshot_read_extra(other, 0, &back, &ex, &ex_len, err, sizeof err);
        CHECK(q && pots_equal_but_joins(p, q, 1) && ex == NULL && ex_len == 0);
        CHECK(back.log_offset == 4242 && strcmp(back.settings, "policy=h2o") == 0);
        pot_free(q);
        /* and a version 1 file is checked as strictly: cut short, or one byte flipped */
        CHECK_EQ_INT(test_spit(other, b, len - 1), 0);
        CHECK(pot_snapshot_read(other, 0, &back, err, sizeof err) == NULL);
        CHECK(strstr(err, "truncated") != NULL);
        b[70] ^= 1;
        CHECK_EQ_INT(test_spit(other, b, len), 0);
        CHECK(pot_snapshot_read(other, 0, &back, err, sizeof err) == NULL);
        CHECK(strstr(err, "checksum") != NULL);
        free(b);
    }
    pot_free(p);
    test_remove_dir(dir);
}

TEST(snapshot_write_fails_cleanly) {
    char *dir = test_make_tempdir("potserve_snap_");
    char path[512], err[256];
    pot *p = random_pot(2, 2, 8, 16, 16, POT_F32, 5);
    pot_snapshot_meta m = make_meta(1, "a");
    /* into a directory that does not exist: an error, and nothing created anywhere */
    snprintf(path, sizeof path, "%s/no/such/dir/pot.snap", dir);
    CHECK_EQ_INT(pot_snapshot_write(path, p, &m, err, sizeof err), -1);
    CHECK(strstr(err, "No such file") != NULL);
    CHECK_EQ_INT(count_entries(dir), 0);
    /* a write cut short (file size limit, as a full disk would): the old snapshot stays */
    snprintf(path, sizeof path, "%s/pot.snap", dir);
    p->n = 4;
    CHECK_EQ_INT(pot_snapshot_write(path, p, &m, err, sizeof err), 0);
    long old_len = test_file_size(path);
    struct rlimit saved, lim;
    CHECK_EQ_INT(getrlimit(RLIMIT_FSIZE, &saved), 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = saved;
    lim.rlim_cur = (rlim_t)old_len + 100;
    CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &lim), 0);
    p->n = 16;
    pot_snapshot_meta m2 = make_meta(2, "b");
    int rc = pot_snapshot_write(path, p, &m2, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, old_handler);
    CHECK_EQ_INT(rc, -1);
    CHECK(strstr(err, "write failed") != NULL);
    CHECK_EQ_INT(count_entries(dir), 1); /* no pot.snap.tmp */
    pot_snapshot_meta back;
    pot *q = pot_snapshot_read(path, 0, &back, err, sizeof err);
    CHECK(q && q->n == 4 && back.log_offset == 1);
    pot_free(q);
    /* a path whose temporary name is taken by a directory: refused, the old file intact */
    char tmpdir[600];
    snprintf(tmpdir, sizeof tmpdir, "%s.tmp", path);
    CHECK_EQ_INT(mkdir(tmpdir, 0700), 0);
    CHECK_EQ_INT(pot_snapshot_write(path, p, &m2, err, sizeof err), -1);
    rmdir(tmpdir);
    q = pot_snapshot_read(path, 0, &back, err, sizeof err);
    CHECK(q && q->n == 4 && back.log_offset == 1);
    pot_free(q);
    /* and with the limit gone the same write succeeds */
    CHECK_EQ_INT(pot_snapshot_write(path, p, &m2, err, sizeof err), 0);
    q = pot_snapshot_read(path, 0, &back, err, sizeof err);
    CHECK(q && pots_equal(p, q) && back.log_offset == 2);
    pot_free(q);
    pot_free(p);
    test_remove_dir(dir);
}

typedef struct writer_job {
    const char *path;
    const pot *p;
    pot_snapshot_meta meta;
    int rc;
    atomic_int done;
} writer_job;

static void *writer_main(void *arg) {
    writer_job *job = arg;
    char err[256];
    job->rc = pot_snapshot_write(job->path, job->p, &job->meta, err, sizeof err);
    if (job->rc) fprintf(stderr, "  writer: %s\n", err);
    atomic_store(&job->done, 1);
    return NULL;
}

TEST(snapshot_overwrite_is_atomic) {
    char *dir = test_make_tempdir("potserve_snap_");
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/pot.snap", dir);
    pot *old_pot = random_pot(2, 2, 16, 32, 32, POT_F16, 21);
    pot *new_pot = random_pot(8, 4, 64, 1024, 1024, POT_F32, 22); /* about 17 MB */
    pot_snapshot_meta m = make_meta(100, "old");
    CHECK_EQ_INT(pot_snapshot_write(path, old_pot, &m, err, sizeof err), 0);
    /* a reader polling while the new snapshot is written sees the old or the new, never
       an error or a mix */
    writer_job job = {.path = path, .p = new_pot, .meta = make_meta(200, "new"), .rc = -1};
    atomic_init(&job.done, 0);
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, writer_main, &job), 0);
    int reads = 0, saw_old = 0, saw_new = 0;
    for (;;) {
        int finished = atomic_load(&job.done);
        pot_snapshot_meta back;
        pot *q = pot_snapshot_read(path, 0, &back, err, sizeof err);
        reads++;
        if (!q) {
            test_failures++;
            fprintf(stderr, "  concurrent read failed: %s\n", err);
        } else if (back.log_offset == 100) {
            saw_old++;
            CHECK(!finished);
            CHECK(pots_equal(q, old_pot) && strcmp(back.settings, "old") == 0);
        } else {
            saw_new++;
            CHECK(back.log_offset == 200 && pots_equal(q, new_pot));
        }
        pot_free(q);
        if (finished || test_failures > 5) break;
    }
    pthread_join(th, NULL);
    CHECK_EQ_INT(job.rc, 0);
    CHECK(reads >= 1 && saw_old + saw_new == reads);
    pot_snapshot_meta back;
    pot *q = pot_snapshot_read(path, 0, &back, err, sizeof err);
    CHECK(q && back.log_offset == 200 && pots_equal(q, new_pot));
    pot_free(q);
    CHECK_EQ_INT(count_entries(dir), 1);
    if (getenv("VERBOSE"))
        fprintf(stderr, "  atomic overwrite: %d reads, %d old, %d new\n", reads, saw_old, saw_new);
    pot_free(old_pot);
    pot_free(new_pot);
    test_remove_dir(dir);
}
