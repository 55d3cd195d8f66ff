/* The session store (private to server/): where a session's meta, chunk log
 * and pot snapshot live, and who may write them.
 *
 * Two kinds. "dir" (the default): data_dir/sessions/<id>/ holds meta.json,
 * chunks.log (server/chunklog.c) and pot.snap; one server owns the
 * directory. "redis://host:port/db": the same three things in Redis, shared
 * by replicas (docs/cluster.md):
 *   potserve:s:<id>:meta   hash: json (the meta), last_seq, final
 *   potserve:s:<id>:log    list: one element per committed chunk, a 32-byte
 *                          header (seq, bytes, CRC-32C, final) + its bytes
 *   potserve:s:<id>:idx    list: the same headers alone (read at takeover)
 *   potserve:s:<id>:snap   string: the pot snapshot file's bytes
 *   potserve:s:<id>:lease  string "<fencing token> <replica>", with a PX expiry
 *   potserve:s:<id>:want   string: another replica asked for the session
 * A replica writes a session only while it holds the lease: every append and
 * snapshot is a Lua script that first compares the lease's value with the
 * writer's token, so a replica that lost its lease (paused, partitioned)
 * can never append after another took over.
 *
 * A store_log has the contract of chunk_log (server/chunklog.h): same rules,
 * same threads (one user at a time), same meaning of each call; offsets of a
 * Redis log count each chunk's bytes plus a 32-byte header. Redis calls run
 * on the calling thread over that thread's own connection. */
#ifndef POTSERVE_STORE_H
#define POTSERVE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "server/chunklog.h"

typedef struct store store;
typedef struct store_log store_log;

/* Opens the store `spec` names ("dir" or "redis://host[:port][/db]"); the
 * caller owns it (store_close). Redis: connects once to check it answers.
 * lease_ms: a lease's lifetime; replica: this server's name in leases.
 * NULL + one line in err. */
store *store_open(const char *spec, const char *data_dir, int fsync_mode, int64_t lease_ms,
                  const char *replica, char *err, size_t errlen);
void store_close(store *st);
/* 1 when sessions live in a store shared by replicas (Redis): a session is
 * served by the replica holding its lease and is not restored at start. */
int store_is_shared(const store *st);
/* The store for a log line: "dir", or redis://host:port/db without its password. */
void store_describe(const store *st, char *out, size_t cap);
/* The local directory of session id (owned by the caller): its files (dir
 * store) or its scratch space for snapshots (Redis). NULL when out of memory. */
char *store_session_dir(const store *st, const char *id);

/* ---- meta ---- */
/* Creates session id with meta (JSON text); dir: the directory, meta.json and
 * an empty chunks.log, whose open log goes to *log (NULL log: closed). A
 * shared store also lists it among owner's sessions (store_owned; owner: a
 * key's tag). -1 + err. */
int store_create(store *st, const char *id, const char *meta, const char *owner, store_log **log, char *err,
                 size_t errlen);
/* The meta JSON of session id (caller frees), NULL + err when absent or unreadable
 * (*absent = 1 when the session does not exist; absent may be NULL). */
char *store_meta_read(store *st, const char *id, int *absent, char *err, size_t errlen);
/* Makes session id's deletion durable before its files go (they may stay
 * while readers finish): dir: its directory renamed out of the sessions'
 * list (synced); Redis: its meta removed (under the lease: token), so no
 * restart or takeover brings it back. -1 + err (Redis: errno EAGAIN when it
 * did not run it or did not answer, so retry: a deletion runs twice alike,
 * and a commit after it is refused; EPERM when another replica holds the
 * session's lease now). */
int store_mark_deleted(store *st, const char *id, const char *token, char *err, size_t errlen);
/* Removes everything of session id (a Redis session only while holding its lease: token). */
void store_remove(store *st, const char *id, const char *token);
/* Ids of the sessions in the dir store (restore at start): calls fn for each;
 * what store_mark_deleted left is removed on the way. */
void store_list(store *st, void (*fn)(void *user, const char *id), void *user);
/* Shared store, at start: removes the local scratch directories (DATA_DIR/cache)
 * an earlier process left, whose leases are gone (a replica takes sessions
 * over under new fencing tokens, so new directories). */
void store_clear_scratch(store *st);

/* ---- leases (Redis; a dir store always grants them) ---- */
enum { STORE_TOKEN_MAX = 160 };
/* Takes session id's lease when it is free (or held under this replica's name by
 * an earlier process): 1 and the lease value in token; 0 when another replica
 * holds it (its name in owner, and it is asked to hand it over); -1 + err. */
int store_lease_acquire(store *st, const char *id, char token[STORE_TOKEN_MAX],
                        char owner[STORE_TOKEN_MAX], char *err, size_t errlen);
/* Renews n leases in one round trip: out[i] = 1 held, 2 held and another replica
 * asked for it, 0 lost, -1 the store did not answer (the lease may still run). */
void store_lease_renew(store *st, const char *const *ids, const char *const *tokens, size_t n,
                       int *out);
/* Whether the store answers now: 0, or -1 (Redis did not answer a PING; a
 * directory always answers). */
int store_ping(store *st);
/* Gives the lease up (only if still ours). */
void store_lease_release(store *st, const char *id, const char *token);

/* ---- the chunk log ---- */
/* Opens session id's committed log (Redis: written under token, the lease's
 * value; dir: chunks.log with chunk_log_open's repair, *damaged as there).
 * NULL + err (Redis: errno EAGAIN when it did not answer or run the read). */
store_log *store_log_open(store *st, const char *id, const char *token, int *damaged, char *err,
                          size_t errlen);
store_log *store_log_reader(const store_log *l, char *err, size_t errlen);
void store_log_close(store_log *l);
const chunk_log_entry *store_log_find(const store_log *l, uint64_t seq);
uint64_t store_log_last_seq(const store_log *l);
uint64_t store_log_committed_size(const store_log *l);
int store_log_is_final(const store_log *l);
int store_log_begin(store_log *l, uint64_t seq, char *err, size_t errlen);
int store_log_append(store_log *l, const void *data, size_t n, char *err, size_t errlen);
/* As chunk_log_commit; Redis: the chunk is acknowledged only once Redis has
 * it, and refused when the lease's value is no longer l's token
 * (store_log_fenced then returns 1); errno EAGAIN when Redis did not run the
 * commit (no connection, still loading): not committed, retry. */
int store_log_commit(store_log *l, int final, char *err, size_t errlen);
int store_log_abort(store_log *l, char *err, size_t errlen);
int store_log_replay(store_log *l, uint64_t from_offset, chunk_log_data_fn on_data,
                     chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen);
/* The same in steps (chunk_log_cursor_read): each read delivers at least
 * at_least bytes or the rest; 1 more to read, 0 the end, -1 + err. Redis
 * stops between whole chunks only (a list element is read whole). */
typedef struct store_log_cursor store_log_cursor;
store_log_cursor *store_log_cursor_open(store_log *l, uint64_t from_offset, char *err, size_t errlen);
int store_log_cursor_read(store_log_cursor *r, uint64_t at_least, chunk_log_data_fn on_data,
                          chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen);
void store_log_cursor_close(store_log_cursor *r);
/* 1 after a write was refused because the lease is gone, or Redis did not
 * answer a commit (committed or not: only the store knows). */
int store_log_fenced(const store_log *l);
/* 1 when the last replay stopped because Redis did not answer: the log is
 * whole there, and a later replay may read it (dir: 0). */
int store_log_unreachable(const store_log *l);
/* 1 after a commit found the session deleted in the store (fenced too). */
int store_log_deleted(const store_log *l);

/* ---- stored /v1/responses (a shared store only: Redis; server/responses.c
 * keeps them in its memory otherwise) ----
 *   potserve:r:<id>        string: the stored entry (JSON)
 *   potserve:r:<id>:items  set: the ids of its items (input and output)
 *   potserve:r:<id>:run    string: a background response's runner (below)
 *   potserve:r:<id>:events string: a streamed background response's events (below)
 *   potserve:r:<id>:events:end  "1" once its runner wrote the last of them
 *   potserve:r:item        hash: item id -> the last stored response holding it
 *   potserve:r:lru         sorted set: response ids by their last use (a counter)
 *   potserve:r:clock       integer: that counter
 *   potserve:r:bytes       integer: the entries' total size, their events' too
 * All in one script per call, so the total stays the sum of the entries. */
/* Stores response id's entry (JSON text) with the ids of its items, then drops
 * the least recently used entries while all of them pass max_bytes. With
 * `expect` (the entry as it was read), only while the store still holds
 * exactly that: 1 when another write came between (read again and retry).
 * 0, or -1 + err. */
int store_response_put(store *st, const char *id, const char *entry, const char *const *items, size_t n_items,
                       int64_t max_bytes, const char *expect, char *err, size_t errlen);
/* The entry of response id (by_item: of the last stored response holding item
 * id), the caller frees; touch: it becomes the most recently used. NULL and
 * *absent = 1 when none, NULL + err when the store did not answer. */
char *store_response_get(store *st, const char *id, int by_item, int touch, int *absent, char *err, size_t errlen);
/* Forgets response id: 1, 0 when it was not stored, -1 + err. */
int store_response_delete(store *st, const char *id, char *err, size_t errlen);
/* A background response's run mark, potserve:r:<id>:run (this replica's
 * name, expiring after lease_ms unrenewed): while it is there the replica
 * running the response is alive. Set before its queued entry is written;
 * any later write or drop of the entry (the answer, a cancel, a delete, an
 * eviction) removes it, so a mark that is gone tells the runner to stop and
 * tells a reader whose entry still says queued that its runner died.
 * store_response_run_mark: 0, or -1 + err. store_response_run_renew: n marks
 * in one round trip, out[i] = 1 renewed, 0 gone (2: and the entry says cancelled), -1 the store did not answer.
 * store_response_run_held: 1 there, 0 gone, -1 + err. */
int store_response_run_mark(store *st, const char *id, char *err, size_t errlen);
void store_response_run_renew(store *st, const char *const *ids, size_t n, int *out);
int store_response_run_held(store *st, const char *id, char *err, size_t errlen);
/* A streamed background response's events (SSE text, as its runner wrote
 * them), shared so that a stream through any replica reads the same events
 * with the same numbers while they are written. They count in the response's
 * size, are kept when its entry is rewritten (its answer, a cancel) and
 * dropped with it. store_response_events_append: appends data at byte `at`
 * of them and, with end, marks them whole; only while the entry is stored and
 * the events are `at` bytes long, or already hold a first part of data there
 * (a retry after a lost answer, with what came since: the rest is added):
 * 0, 1 when the entry is gone, 2 when the events hold something else
 * (nothing appended), -1 + err (retry). store_response_events_look: at once,
 * whether its run mark is there, whether it has events, at most max of them
 * from byte `from` on, whether they are whole, and the entry (NULL: none)
 * when want_entry or when it has no events (entry_read says which: a large
 * entry is not fetched each time a follower looks for more events); the
 * caller frees entry and events. 0, or -1 + err. */
typedef struct store_events_look {
    char *entry;
    int entry_read, held, has_events, ended;
    char *events;
    size_t len;
} store_events_look;
int store_response_events_append(store *st, const char *id, uint64_t at, const char *data, size_t n, int end,
                                 char *err, size_t errlen);
int store_response_events_look(store *st, const char *id, uint64_t from, size_t max, int want_entry,
                               store_events_look *out, char *err, size_t errlen);

/* ---- a key's sessions and files, as a shared store holds them ---- */
/* What a shared store holds of a session, for replicas that do not hold it
 * (a dir store's sessions are all in memory). */
typedef struct store_owned_session {
    char id[48];
    char *meta;        /* its meta JSON */
    uint64_t bytes;    /* its log's bytes */
    uint64_t last_seq; /* its log's last chunk */
    int final;         /* its log ended (a file: its upload) */
    int snapshot;      /* a snapshot of its pot is there (a file's: it has been read whole) */
} store_owned_session;
/* Shared store: the sessions of owner (a key's tag), or only session id when
 * id is given (none when it is gone), in *out (n of them; store_owned_free);
 * sessions gone from the store are dropped from owner's list on the way.
 * -1 + err. */
int store_owned(store *st, const char *owner, const char *id, store_owned_session **out, size_t *n, char *err,
                size_t errlen);
void store_owned_free(store_owned_session *f, size_t n);

/* ---- snapshots ---- */
/* After engine_doc_save wrote path: Redis stores its bytes (under l's lease)
 * and removes the file; dir: nothing to do (path is in the session's
 * directory). -1 + err. */
int store_snapshot_put(store_log *l, const char *path, char *err, size_t errlen);
/* Before engine_doc_load reads path: Redis writes the stored snapshot there
 * (0; 1 when there is none); dir: 0 (the file is already there). -1 + err. */
int store_snapshot_get(store_log *l, const char *path, char *err, size_t errlen);

#endif
