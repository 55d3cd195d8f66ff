/* The session store's dispatch, and the dir store: a directory per session
 * under data_dir/sessions (meta.json, chunks.log, pot.snap). The Redis store
 * is in store_redis.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "server/store_impl.h"

static char *path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", a, b);
    return p;
}

store *store_open(const char *spec, const char *data_dir, int fsync_mode, int64_t lease_ms,
                  const char *replica, char *err, size_t errlen) {
    store *st = calloc(1, sizeof *st);
    if (!st || !(st->data_dir = strdup(data_dir)) || !(st->replica = strdup(replica))) {
        store_close(st);
        return set_err(err, errlen, "out of memory"), NULL;
    }
    st->fsync_mode = fsync_mode;
    st->lease_ms = lease_ms;
    if (!strcmp(spec, "dir")) return st;
    if (strncmp(spec, "redis://", 8)) {
        store_close(st);
        return set_err(err, errlen, "store: '%.100s' is neither dir nor redis://host:port/db", spec), NULL;
    }
    st->redis = 1;
    if (redis_store_init(st, spec, err, errlen)) {
        store_close(st);
        return NULL;
    }
    return st;
}

void store_close(store *st) {
    if (!st) return;
    if (st->redis) redis_store_free(st);
    free(st->data_dir);
    free(st->replica);
    free(st->host);
    free(st->user);
    free(st->password);
    free(st);
}

int store_is_shared(const store *st) { return st->redis; }

void store_describe(const store *st, char *out, size_t cap) {
    if (!st->redis) snprintf(out, cap, "dir");
    else snprintf(out, cap, "redis://%s%s:%d/%d", st->password ? "(password)@" : "", st->host, st->port, st->db);
}

char *store_session_dir(const store *st, const char *id) {
    char *root = path_join(st->data_dir, st->redis ? "cache" : "sessions");
    char *dir = root ? path_join(root, id) : NULL;
    free(root);
    return dir;
}

/* ---- meta ---- */

static int write_file_synced(const char *path, const char *text, int sync, char *err, size_t errlen) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return set_err(err, errlen, "cannot create %.200s: %s", tmp, strerror(errno)), -1;
    size_t n = strlen(text), off = 0;
    while (off < n) {
        ssize_t k = write(fd, text + off, n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            close(fd);
            return set_err(err, errlen, "cannot write %.200s: %s", tmp, strerror(errno)), -1;
        }
        off += (size_t)k;
    }
    if ((sync && fsync(fd)) || close(fd) || rename(tmp, path))
        return set_err(err, errlen, "cannot write %s: %s", path, strerror(errno)), -1;
    return 0;
}

static int dir_create(store *st, const char *dir, const char *meta, store_log **log, char *err,
                      size_t errlen) {
    if (mkdir(dir, 0700)) return set_err(err, errlen, "cannot create %s: %s", dir, strerror(errno)), -1;
    char *meta_path = path_join(dir, "meta.json"), *log_path = path_join(dir, "chunks.log");
    int rc = meta_path && log_path ? write_file_synced(meta_path, meta, st->fsync_mode, err, errlen) : -1;
    chunk_log *cl = NULL;
    if (!rc) {
        cl = chunk_log_open(log_path, st->fsync_mode, NULL, err, errlen);
        rc = cl ? 0 : -1;
    }
    if (!rc && st->fsync_mode) { /* the new directory's entry, in data_dir/sessions */
        int e = fsync_parent_dir(dir);
        if (e) rc = -1, set_err(err, errlen, "cannot sync the directory of %s: %s", dir, strerror(e));
    }
    free(meta_path);
    free(log_path);
    if (!rc && log) {
        *log = calloc(1, sizeof **log);
        if (*log) (*log)->st = st, (*log)->file = cl, cl = NULL;
        else rc = -1, set_err(err, errlen, "out of memory");
    }
    chunk_log_close(cl);
    return rc;
}

int store_create(store *st, const char *id, const char *meta, const char *owner, store_log **log, char *err,
                 size_t errlen) {
    if (log) *log = NULL;
    if (st->redis) return redis_store_create(st, id, meta, owner, err, errlen);
    char *dir = store_session_dir(st, id);
    int rc = dir ? dir_create(st, dir, meta, log, err, errlen) : (set_err(err, errlen, "out of memory"), -1);
    free(dir);
    return rc;
}

char *store_meta_read(store *st, const char *id, int *absent, char *err, size_t errlen) {
    if (absent) *absent = 0;
    if (st->redis) return redis_store_meta_read(st, id, absent, err, errlen);
    char *dir = store_session_dir(st, id), *path = dir ? path_join(dir, "meta.json") : NULL;
    free(dir);
    FILE *f = path ? fopen(path, "rb") : NULL;
    free(path);
    if (!f) {
        if (absent) *absent = errno == ENOENT;
        return set_err(err, errlen, "%.60s: unreadable meta.json", id), NULL;
    }
    char *text = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            char *t = realloc(text, cap = n + 8192);
            if (!t) break;
            text = t;
        }
        size_t k = fread(text + n, 1, 4096, f);
        n += k;
        if (k < 4096) break;
    }
    int bad = ferror(f) || !text || n + 1 > cap;
    fclose(f);
    if (bad) {
        free(text);
        return set_err(err, errlen, "%.60s: unreadable meta.json", id), NULL;
    }
    text[n] = 0;
    return text;
}

/* A session's directory once deleted: data_dir/sessions/.deleted-<id>
 * (store_list skips names that start with a dot). */
static char *deleted_dir(const store *st, const char *id) {
    char name[128];
    snprintf(name, sizeof name, ".deleted-%s", id);
    return store_session_dir(st, name);
}

/* opendir(path) by way of open(2) (NULL on a NULL path): ThreadSanitizer sees
 * the descriptor made here (its opendir does not), so that one whose number a
 * socket closed on the loop had before does not read as a race at closedir. */
static DIR *open_dir(const char *path) {
    int fd = path ? open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d && fd >= 0) close(fd);
    return d;
}

/* Removes dir and the files in it (a session's directory holds no others). */
static void remove_files(const char *dir) {
    DIR *d = open_dir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                char *p = path_join(dir, e->d_name);
                if (p) unlink(p);
                free(p);
            }
        closedir(d);
    }
    if (dir) rmdir(dir);
}

int store_mark_deleted(store *st, const char *id, const char *token, char *err, size_t errlen) {
    if (st->redis) return redis_store_mark_deleted(st, id, token, err, errlen);
    char *dir = store_session_dir(st, id), *gone = deleted_dir(st, id);
    int rc = 0;
    if (!dir || !gone) rc = -1, set_err(err, errlen, "out of memory");
    else if (rename(dir, gone)) rc = -1, set_err(err, errlen, "cannot delete %s: %s", dir, strerror(errno));
    else if (st->fsync_mode) { /* the rename itself, in data_dir/sessions */
        int e = fsync_parent_dir(gone);
        if (e) rc = -1, set_err(err, errlen, "cannot sync the directory of %s: %s", gone, strerror(e));
    }
    free(dir);
    free(gone);
    return rc;
}

void store_remove(store *st, const char *id, const char *token) {
    if (st->redis) return redis_store_remove(st, id, token);
    char *dirs[2] = {deleted_dir(st, id), store_session_dir(st, id)};
    for (int i = 0; i < 2; i++) {
        remove_files(dirs[i]);
        free(dirs[i]);
    }
}

void store_clear_scratch(store *st) {
    if (!st->redis) return;
    char *root = path_join(st->data_dir, "cache");
    DIR *d = open_dir(root);
    struct dirent *ent;
    while (d && (ent = readdir(d)))
        if (ent->d_name[0] != '.') {
            char *dir = path_join(root, ent->d_name);
            remove_files(dir);
            free(dir);
        }
    if (d) closedir(d);
    free(root);
}

void store_list(store *st, void (*fn)(void *user, const char *id), void *user) {
    if (st->redis) return; /* replicas take sessions over on demand */
    char *root = path_join(st->data_dir, "sessions");
    DIR *d = open_dir(root);
    struct dirent *ent;
    while (d && (ent = readdir(d))) {
        static const char gone[] = ".deleted-";
        if (!strncmp(ent->d_name, gone, sizeof gone - 1)) { /* deleted before a stop: finish it */
            char *dir = path_join(root, ent->d_name);
            remove_files(dir);
            free(dir);
        } else if (ent->d_name[0] != '.') {
            fn(user, ent->d_name);
        }
    }
    if (d) closedir(d);
    free(root);
}

/* ---- leases ---- */

int store_lease_acquire(store *st, const char *id, char token[STORE_TOKEN_MAX],
                        char owner[STORE_TOKEN_MAX], char *err, size_t errlen) {
    if (st->redis) return redis_lease_acquire(st, id, token, owner, err, errlen);
    snprintf(token, STORE_TOKEN_MAX, "local");
    return 1;
}

int store_ping(store *st) { return st->redis ? redis_ping(st) : 0; }

void store_lease_renew(store *st, const char *const *ids, const char *const *tokens, size_t n,
                       int *out) {
    if (st->redis) return redis_lease_renew(st, ids, tokens, n, out);
    for (size_t i = 0; i < n; i++) out[i] = 1;
}

void store_lease_release(store *st, const char *id, const char *token) {
    if (st->redis) redis_lease_release(st, id, token);
}

/* ---- stored responses (Redis only) ---- */

int store_response_put(store *st, const char *id, const char *entry, const char *const *items, size_t n_items,
                       int64_t max_bytes, const char *expect, char *err, size_t errlen) {
    if (st->redis) return redis_response_put(st, id, entry, items, n_items, max_bytes, expect, err, errlen);
    return set_err(err, errlen, "store: responses are kept in a shared store only"), -1;
}

char *store_response_get(store *st, const char *id, int by_item, int touch, int *absent, char *err, size_t errlen) {
    if (st->redis) return redis_response_get(st, id, by_item, touch, absent, err, errlen);
    set_err(err, errlen, "store: responses are kept in a shared store only");
    return NULL;
}

int store_response_delete(store *st, const char *id, char *err, size_t errlen) {
    if (st->redis) return redis_response_delete(st, id, err, errlen);
    return set_err(err, errlen, "store: responses are kept in a shared store only"), -1;
}

int store_response_run_mark(store *st, const char *id, char *err, size_t errlen) {
    if (st->redis) return redis_response_run_mark(st, id, err, errlen);
    return set_err(err, errlen, "store: responses are kept in a shared store only"), -1;
}

void store_response_run_renew(store *st, const char *const *ids, size_t n, int *out) {
    if (st->redis) return redis_response_run_renew(st, ids, n, out);
    for (size_t i = 0; i < n; i++) out[i] = -1;
}

int store_response_run_held(store *st, const char *id, char *err, size_t errlen) {
    if (st->redis) return redis_response_run_held(st, id, err, errlen);
    return set_err(err, errlen, "store: responses are kept in a shared store only"), -1;
}

int store_response_events_append(store *st, const char *id, uint64_t at, const char *data, size_t n, int end,
                                 char *err, size_t errlen) {
    if (st->redis) return redis_response_events_append(st, id, at, data, n, end, err, errlen);
    return set_err(err, errlen, "store: responses are kept in a shared store only"), -1;
}

int store_response_events_look(store *st, const char *id, uint64_t from, size_t max, int want_entry,
                               store_events_look *out, char *err, size_t errlen) {
    if (st->redis) return redis_response_events_look(st, id, from, max, want_entry, out, err, errlen);
    return set_err(err, errlen, "store: responses are kept in a shared store only"), -1;
}

/* ---- the chunk log ---- */

store_log *store_log_open(store *st, const char *id, const char *token, int *damaged, char *err,
                          size_t errlen) {
    store_log *l = calloc(1, sizeof *l);
    if (!l) return set_err(err, errlen, "out of memory"), NULL;
    l->st = st;
    if (damaged) *damaged = 0;
    if (st->redis) {
        l->rl = redis_log_open(st, id, token, err, errlen);
    } else {
        char *dir = store_session_dir(st, id), *path = dir ? path_join(dir, "chunks.log") : NULL;
        l->file = path ? chunk_log_open(path, st->fsync_mode, damaged, err, errlen) : NULL;
        if (!path) set_err(err, errlen, "out of memory");
        free(dir);
        free(path);
    }
    if (!l->rl && !l->file) {
        int e = errno; /* (why, for the caller) */
        free(l);
        errno = e;
        return NULL;
    }
    return l;
}

store_log *store_log_reader(const store_log *l, char *err, size_t errlen) {
    store_log *c = calloc(1, sizeof *c);
    if (!c) return set_err(err, errlen, "out of memory"), NULL;
    c->st = l->st;
    if (l->rl) c->rl = redis_log_copy(l->rl, err, errlen);
    else c->file = chunk_log_reader(l->file, err, errlen);
    if (!c->rl && !c->file) {
        free(c);
        return NULL;
    }
    return c;
}

void store_log_close(store_log *l) {
    if (!l) return;
    chunk_log_close(l->file);
    redis_log_close(l->rl);
    free(l);
}

const chunk_log_entry *store_log_find(const store_log *l, uint64_t seq) {
    return l->rl ? redis_log_find(l->rl, seq) : chunk_log_find(l->file, seq);
}

uint64_t store_log_last_seq(const store_log *l) {
    return l->rl ? redis_log_last_seq(l->rl) : chunk_log_last_seq(l->file);
}

uint64_t store_log_committed_size(const store_log *l) {
    return l->rl ? redis_log_committed_size(l->rl) : chunk_log_committed_size(l->file);
}

int store_log_is_final(const store_log *l) {
    return l->rl ? redis_log_is_final(l->rl) : chunk_log_is_final(l->file);
}

int store_log_begin(store_log *l, uint64_t seq, char *err, size_t errlen) {
    return l->rl ? redis_log_begin(l->rl, seq, err, errlen) : chunk_log_begin(l->file, seq, err, errlen);
}

int store_log_append(store_log *l, const void *data, size_t n, char *err, size_t errlen) {
    return l->rl ? redis_log_append(l->rl, data, n, err, errlen)
                 : chunk_log_append(l->file, data, n, err, errlen);
}

int store_log_commit(store_log *l, int final, char *err, size_t errlen) {
    return l->rl ? redis_log_commit(l->rl, final, err, errlen) : chunk_log_commit(l->file, final, err, errlen);
}

int store_log_abort(store_log *l, char *err, size_t errlen) {
    if (!l->rl) return chunk_log_abort(l->file, err, errlen);
    redis_log_abort(l->rl);
    return 0;
}

struct store_log_cursor {
    chunk_log_cursor *file;
    redis_log_cursor *rl;
};

store_log_cursor *store_log_cursor_open(store_log *l, uint64_t from_offset, char *err, size_t errlen) {
    store_log_cursor *r = calloc(1, sizeof *r);
    if (!r) return snprintf(err, errlen, "out of memory"), NULL;
    if (l->rl) r->rl = redis_log_cursor_open(l->rl, from_offset, err, errlen);
    else r->file = chunk_log_cursor_open(l->file, from_offset, err, errlen);
    if (!r->rl && !r->file) return free(r), NULL;
    return r;
}

int store_log_cursor_read(store_log_cursor *r, uint64_t at_least, chunk_log_data_fn on_data,
                          chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen) {
    if (r->rl) return redis_log_cursor_read(r->rl, at_least, on_data, on_commit, user, err, errlen);
    return chunk_log_cursor_read(r->file, at_least, on_data, on_commit, user, err, errlen);
}

void store_log_cursor_close(store_log_cursor *r) {
    if (!r) return;
    redis_log_cursor_close(r->rl);
    chunk_log_cursor_close(r->file);
    free(r);
}

int store_log_replay(store_log *l, uint64_t from_offset, chunk_log_data_fn on_data,
                     chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen) {
    store_log_cursor *r = store_log_cursor_open(l, from_offset, err, errlen);
    if (!r) return -1;
    int rc = store_log_cursor_read(r, UINT64_MAX, on_data, on_commit, user, err, errlen);
    store_log_cursor_close(r);
    return rc;
}

int store_log_fenced(const store_log *l) { return l->rl && redis_log_fenced(l->rl); }

int store_log_unreachable(const store_log *l) { return l->rl && redis_log_unreachable(l->rl); }
int store_log_deleted(const store_log *l) { return l->rl && redis_log_deleted(l->rl); }

/* ---- snapshots ---- */

int store_snapshot_put(store_log *l, const char *path, char *err, size_t errlen) {
    return l->rl ? redis_snapshot_put(l->rl, path, err, errlen) : 0;
}

int store_owned(store *st, const char *owner, const char *id, store_owned_session **out, size_t *n, char *err,
                size_t errlen) {
    *out = NULL;
    *n = 0;
    if (st->redis) return redis_store_owned(st, owner, id, out, n, err, errlen);
    return set_err(err, errlen, "a dir store's sessions are all in memory"), -1;
}

void store_owned_free(store_owned_session *f, size_t n) {
    for (size_t i = 0; f && i < n; i++) free(f[i].meta);
    free(f);
}

int store_snapshot_get(store_log *l, const char *path, char *err, size_t errlen) {
    return l->rl ? redis_snapshot_get(l->rl, path, err, errlen) : 0;
}
