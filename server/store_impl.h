/* What store.c (the dispatch and the dir store) and store_redis.c share
 * (private to server/store*.c). */
#ifndef POTSERVE_STORE_IMPL_H
#define POTSERVE_STORE_IMPL_H

#include "server/store.h"

typedef struct redis_log redis_log;

struct store {
    int redis;           /* 0: dir store */
    char *data_dir;
    int fsync_mode;
    int64_t lease_ms;
    char *replica;
    char *host;
    int port, db;
    char *user, *password; /* AUTH on connecting (redis://[user:]password@host...); NULL: none */
};

struct store_log {
    store *st;
    chunk_log *file; /* dir store */
    redis_log *rl;   /* Redis store */
};

/* Redis: parses spec and checks the server answers (store_open's other half). */
int redis_store_init(store *st, const char *spec, char *err, size_t errlen);
/* Closes every thread's connection (at exit: no thread uses the store any more). */
void redis_store_free(store *st);
int redis_store_create(store *st, const char *id, const char *meta, const char *owner, char *err, size_t errlen);
int redis_store_owned(store *st, const char *owner, const char *id, store_owned_session **out, size_t *n, char *err,
                      size_t errlen);
char *redis_store_meta_read(store *st, const char *id, int *absent, char *err, size_t errlen);
void redis_store_remove(store *st, const char *id, const char *token);
int redis_store_mark_deleted(store *st, const char *id, const char *token, char *err, size_t errlen);
int redis_lease_acquire(store *st, const char *id, char token[STORE_TOKEN_MAX],
                        char owner[STORE_TOKEN_MAX], char *err, size_t errlen);
void redis_lease_renew(store *st, const char *const *ids, const char *const *tokens, size_t n,
                       int *out);
void redis_lease_release(store *st, const char *id, const char *token);
int redis_ping(store *st);
int redis_response_put(store *st, const char *id, const char *entry, const char *const *items, size_t n_items,
                       int64_t max_bytes, const char *expect, char *err, size_t errlen);
char *redis_response_get(store *st, const char *id, int by_item, int touch, int *absent, char *err, size_t errlen);
int redis_response_delete(store *st, const char *id, char *err, size_t errlen);
int redis_response_run_mark(store *st, const char *id, char *err, size_t errlen);
void redis_response_run_renew(store *st, const char *const *ids, size_t n, int *out);
int redis_response_run_held(store *st, const char *id, char *err, size_t errlen);
int redis_response_events_append(store *st, const char *id, uint64_t at, const char *data, size_t n, int end,
                                 char *err, size_t errlen);
int redis_response_events_look(store *st, const char *id, uint64_t from, size_t max, int want_entry,
                               store_events_look *out, char *err, size_t errlen);

redis_log *redis_log_open(store *st, const char *id, const char *token, char *err, size_t errlen);
redis_log *redis_log_copy(const redis_log *l, char *err, size_t errlen);
void redis_log_close(redis_log *l);
const chunk_log_entry *redis_log_find(const redis_log *l, uint64_t seq);
uint64_t redis_log_last_seq(const redis_log *l);
uint64_t redis_log_committed_size(const redis_log *l);
int redis_log_is_final(const redis_log *l);
int redis_log_begin(redis_log *l, uint64_t seq, char *err, size_t errlen);
int redis_log_append(redis_log *l, const void *data, size_t n, char *err, size_t errlen);
int redis_log_commit(redis_log *l, int final, char *err, size_t errlen);
void redis_log_abort(redis_log *l);
typedef struct redis_log_cursor redis_log_cursor;
redis_log_cursor *redis_log_cursor_open(redis_log *l, uint64_t from_offset, char *err, size_t errlen);
int redis_log_cursor_read(redis_log_cursor *r, uint64_t at_least, chunk_log_data_fn on_data,
                          chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen);
void redis_log_cursor_close(redis_log_cursor *r);
int redis_log_fenced(const redis_log *l);
int redis_log_unreachable(const redis_log *l);
int redis_log_deleted(const redis_log *l);
int redis_snapshot_put(redis_log *l, const char *path, char *err, size_t errlen);
int redis_snapshot_get(redis_log *l, const char *path, char *err, size_t errlen);

#endif
