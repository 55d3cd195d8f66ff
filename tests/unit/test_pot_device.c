/* cache/'s hook for pots held by a device (cache/cache.h, "pots held by a
 * device"), with a fake device that keeps the K/V in its own host arrays:
 * the host copy is read only after a sync, compaction moves the metadata on
 * the host and the K/V on the device, a failed device compaction or copy
 * falls back to the host, pot_write takes the pot back, pot_free and
 * pot_copy into a pot release it, snapshots sync first. The CUDA backend
 * (cuda/cuda_pots.c) is the real device; this checks cache/ alone. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "tests/unit/test.h"

typedef struct fake_dev {
    pot_device hooks; /* first */
    void *k, *v;      /* the "device" K/V, the pot's layout */
    size_t bytes;
    int syncs, compacts, copies, releases, fail_compact, fail_copy, fail_sync;
} fake_dev;

static size_t kv_bytes(const pot *p) {
    return (size_t)p->n_layer * p->n_head_kv * p->capacity * p->head_dim * (p->dtype == POT_F16 ? 2 : 4);
}

static int fd_sync(pot_device *d, pot *p) {
    fake_dev *f = (fake_dev *)d;
    f->syncs++;
    if (f->fail_sync) return -1;
    memcpy(p->k, f->k, f->bytes);
    memcpy(p->v, f->v, f->bytes);
    return 0;
}

static int fd_compact(pot_device *d, pot *p, const int32_t *keep, int32_t n_keep) {
    fake_dev *f = (fake_dev *)d;
    if (f->fail_compact) return -1;
    f->compacts++;
    size_t row = f->bytes / ((size_t)p->n_layer * p->n_head_kv * p->capacity);
    for (int32_t lh = 0; lh < p->n_layer * p->n_head_kv; lh++)
        for (int32_t i = 0; i < n_keep; i++) {
            size_t to = ((size_t)lh * p->capacity + i) * row;
            size_t from = ((size_t)lh * p->capacity + keep[lh * n_keep + i]) * row;
            memmove((char *)f->k + to, (char *)f->k + from, row);
            memmove((char *)f->v + to, (char *)f->v + from, row);
        }
    return 0;
}

static void fd_release(pot_device *d, pot *p) {
    fake_dev *f = (fake_dev *)d;
    f->releases++;
    free(f->k), free(f->v);
    f->k = f->v = NULL;
    p->device = NULL;
}

static int fd_attach(fake_dev *f, pot *p);

static int fd_copy(pot_device *d, pot *dst, const pot *src) {
    fake_dev *f = (fake_dev *)d;
    if (f->fail_copy) return -1;
    f->copies++;
    (void)src;
    static fake_dev second; /* dst's device copy: same capacity in these tests */
    memset(&second, 0, sizeof second);
    if (fd_attach(&second, dst)) return -1;
    memcpy(second.k, f->k, f->bytes < second.bytes ? f->bytes : second.bytes);
    memcpy(second.v, f->v, f->bytes < second.bytes ? f->bytes : second.bytes);
    return 0;
}

/* Attaches f to p: the device takes the host's K/V. */
static int fd_attach(fake_dev *f, pot *p) {
    f->hooks = (pot_device){fd_sync, fd_compact, fd_copy, fd_release};
    f->bytes = kv_bytes(p);
    f->k = malloc(f->bytes), f->v = malloc(f->bytes);
    if (!f->k || !f->v) return -1;
    memcpy(f->k, p->k, f->bytes);
    memcpy(f->v, p->v, f->bytes);
    p->device = &f->hooks;
    return 0;
}

static pot *filled_pot(int32_t n, float base) {
    char err[128];
    pot *p = pot_new(2, 2, 4, 16, POT_F32, err, sizeof err);
    float k[4], v[4];
    for (int32_t l = 0; l < 2; l++)
        for (int32_t h = 0; h < 2; h++)
            for (int32_t s = 0; s < n; s++) {
                for (int e = 0; e < 4; e++) k[e] = base + 1000 * l + 100 * h + s + e * 0.25f, v[e] = -k[e];
                pot_write(p, l, h, s, k, v);
            }
    pot_append_done(p, n);
    return p;
}

/* The device writes "new K/V" the host does not see: every value + delta. */
static void device_shift(fake_dev *f, float delta) {
    for (size_t i = 0; i < f->bytes / 4; i++) ((float *)f->k)[i] += delta, ((float *)f->v)[i] += delta;
}

TEST(pot_device_sync_on_read_compact_copy_release) {
    fake_dev f = {0};
    pot *p = filled_pot(10, 0);
    CHECK_EQ_INT(fd_attach(&f, p), 0);
    device_shift(&f, 0.5f);
    CHECK(((float *)p->k)[0] == 0.0f); /* the host copy is stale until read */
    float row[4];
    pot_read_k(p, 0, 0, 0, 1, row);
    CHECK(row[0] == 0.5f && f.syncs == 1);
    CHECK(p->device == &f.hooks); /* reading keeps the device */

    /* compaction: metadata on the host, K/V on the device */
    int32_t keep[4 * 3];
    for (int lh = 0; lh < 4; lh++) keep[lh * 3] = 1, keep[lh * 3 + 1] = 4 + lh % 2, keep[lh * 3 + 2] = 9;
    pot_compact(p, keep, 3);
    CHECK(f.compacts == 1 && p->n == 3);
    CHECK_EQ_INT(p->token_index[pot_slot(p, 1, 1, 1)], 5);
    CHECK(((float *)p->k)[pot_slot(p, 0, 0, 1) * 4] == 0.5f + 1); /* host K/V not moved: still token 1 */
    pot_read_k(p, 1, 1, 1, 1, row);
    CHECK(row[0] == 0.5f + 1000 + 100 + 5); /* synced from the compacted device */

    /* a device that cannot compact: taken back to the host (synced), compacted there */
    device_shift(&f, 0.25f);
    f.fail_compact = 1;
    int32_t keep2[4 * 2];
    for (int lh = 0; lh < 4; lh++) keep2[lh * 2] = 0, keep2[lh * 2 + 1] = 2;
    pot_compact(p, keep2, 2);
    CHECK(p->device == NULL && f.releases == 1);
    pot_read_k(p, 0, 0, 1, 1, row);
    CHECK(row[0] == 0.75f + 9); /* slot 2 held token 9 */
    pot_free(p);
}

TEST(pot_device_copy_write_free_snapshot) {
    fake_dev f = {0};
    pot *p = filled_pot(6, 0);
    CHECK_EQ_INT(fd_attach(&f, p), 0);
    device_shift(&f, 2.0f);
    /* pot_copy through the device: dst attached, host copy of src never read */
    pot *q = filled_pot(0, 0);
    CHECK_EQ_INT(pot_copy(q, p), 0);
    CHECK(f.copies == 1 && q->device != NULL && f.syncs == 0);
    CHECK_EQ_INT(q->n, 6);
    float row[4];
    pot_read_v(q, 1, 0, 5, 1, row);
    CHECK(row[0] == -(1000 + 5.0f) + 2.0f);
    pot_free(q); /* releases q's device copy */
    /* a failing device copy: through the host (src synced), dst's device released */
    f.fail_copy = 1;
    pot *r = filled_pot(0, 0);
    fake_dev g = {0};
    CHECK_EQ_INT(fd_attach(&g, r), 0);
    CHECK_EQ_INT(pot_copy(r, p), 0);
    CHECK(r->device == NULL && g.releases == 1 && f.syncs == 1);
    pot_read_k(r, 0, 1, 3, 1, row);
    CHECK(row[0] == 100 + 3 + 2.0f);
    pot_free(r);
    /* a snapshot holds the device's K/V */
    device_shift(&f, 1.0f);
    char path[] = "/tmp/potserve_pot_device_XXXXXX", err[256];
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    pot_snapshot_meta meta = {.model_fingerprint = 7};
    CHECK_EQ_INT(pot_snapshot_write(path, p, &meta, err, sizeof err), 0);
    pot *back = pot_snapshot_read(path, 16, &meta, err, sizeof err);
    CHECK(back != NULL);
    if (back) {
        pot_read_k(back, 1, 1, 4, 1, row);
        CHECK(row[0] == 1000 + 100 + 4 + 3.0f);
        pot_free(back);
    }
    unlink(path);
    /* a host writer takes the pot back (synced first), and pot_free then has nothing to release */
    float k[4] = {9, 9, 9, 9};
    pot_write(p, 0, 0, 6, k, k);
    CHECK(p->device == NULL && f.releases == 1);
    pot_read_k(p, 0, 0, 5, 1, row);
    CHECK(row[0] == 5 + 3.0f);
    pot_free(p);
    CHECK(f.releases == 1);
}

/* A device whose K/V cannot be read back: pot_write and pot_compact report it
 * and change nothing, instead of going on with the stale host copy. */
TEST(pot_device_failed_read_back_is_an_error) {
    fake_dev f = {0};
    pot *p = filled_pot(6, 0);
    CHECK_EQ_INT(fd_attach(&f, p), 0);
    device_shift(&f, 1.0f);
    f.fail_sync = 1;
    float k[4] = {9, 9, 9, 9}, *host = (float *)p->k + pot_slot(p, 0, 0, 6) * 4;
    *host = -1.0f;
    CHECK_EQ_INT(pot_write(p, 0, 0, 6, k, k), -1);
    CHECK(*host == -1.0f); /* nothing written */
    pot_free(p);

    fake_dev g = {0};
    p = filled_pot(6, 0);
    CHECK_EQ_INT(fd_attach(&g, p), 0);
    g.fail_sync = g.fail_compact = 1;
    int32_t keep[4 * 2];
    for (int lh = 0; lh < 4; lh++) keep[lh * 2] = 0, keep[lh * 2 + 1] = 5;
    CHECK_EQ_INT(pot_compact(p, keep, 2), -1);
    CHECK_EQ_INT(p->n, 6); /* nothing moved */
    CHECK_EQ_INT(p->token_index[pot_slot(p, 0, 0, 1)], 1);
    pot_free(p);

    /* and the same device working: both succeed */
    fake_dev h = {0};
    p = filled_pot(6, 0);
    CHECK_EQ_INT(fd_attach(&h, p), 0);
    CHECK_EQ_INT(pot_compact(p, keep, 2), 0);
    CHECK_EQ_INT(pot_write(p, 0, 0, 2, k, k), 0);
    CHECK(p->n == 2 && p->device == NULL);
    pot_free(p);
}
