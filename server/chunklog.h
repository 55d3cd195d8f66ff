/* Per-session durable append-only log of uploaded document chunks (private to
 * server/). A client uploads a document in numbered chunks (seq 1, 2, 3, ...);
 * each chunk's body is appended piece by piece as it arrives, and the chunk is
 * acknowledged only once chunk_log_commit has returned 0 (its COMMIT frame is
 * then fsynced in fsync mode). On restart chunk_log_open drops any torn or
 * uncommitted tail and chunk_log_replay feeds the committed bytes back.
 *
 * Rules kept by the writer: seq of a new chunk is > every committed seq (and
 * never 0); nothing can be begun after a final chunk; every frame before the
 * last COMMIT belongs to a committed chunk (abort truncates). All calls are
 * synchronous; one chunk_log is used by one thread at a time, and a file is
 * held by one chunk_log at a time (an exclusive flock, taken at open).
 * File format: server/chunklog.c. */
#ifndef POTSERVE_CHUNKLOG_H
#define POTSERVE_CHUNKLOG_H

#include <stddef.h>
#include <stdint.h>

typedef struct chunk_log_entry {
    uint64_t seq;        /* the chunk's number (>= 1, increasing through the log) */
    uint64_t bytes;      /* document bytes in the chunk */
    uint64_t end_offset; /* file offset just past the chunk's COMMIT frame */
    uint32_t crc;        /* CRC-32C of the chunk's document bytes */
    int final;           /* 1: the chunk ends the document */
} chunk_log_entry;

typedef struct chunk_log chunk_log;

/* Opens or creates path (the caller owns the returned log; chunk_log_close frees it).
 * Scans every frame; stops at the first frame that is incomplete, fails its CRC
 * or breaks the rules above, and truncates the file to the end of the last valid
 * COMMIT (a torn tail was never acknowledged). When a valid COMMIT frame still
 * follows the bad bytes (damage inside acknowledged data, not a torn tail)
 * *damaged is set to 1 (else 0; damaged may be NULL); the log is still truncated
 * to the last good commit before the damage and opened. fsync_mode 1: commits
 * are fdatasync'ed, the first commit of each open also fsyncs the directory, and
 * a truncation done here is synced. NULL + one line in err on I/O errors, a
 * non-regular file, or a file already held by another chunk_log. */
chunk_log *chunk_log_open(const char *path, int fsync_mode, int *damaged, char *err,
                          size_t errlen);
/* A read-only copy of l for chunk_log_replay on another thread while l goes
 * on (appends and aborts never touch committed bytes): its own descriptor of
 * the file and a copy of the committed chunks as they are now. The caller owns
 * it (chunk_log_close). NULL + err. */
chunk_log *chunk_log_reader(const chunk_log *l, char *err, size_t errlen);
/* Frees l (NULL is fine); an open chunk is dropped (truncated, best effort). */
void chunk_log_close(chunk_log *l);
/* Committed chunks in log order, *n of them (owned by l, valid until the next commit). */
const chunk_log_entry *chunk_log_entries(const chunk_log *l, size_t *n);
/* The committed chunk numbered seq (owned by l, valid until the next commit); NULL if absent. */
const chunk_log_entry *chunk_log_find(const chunk_log *l, uint64_t seq);
/* seq of the last committed chunk; 0 when none is. */
uint64_t chunk_log_last_seq(const chunk_log *l);
/* File offset just past the last COMMIT (0 when empty): what replay can read. */
uint64_t chunk_log_committed_size(const chunk_log *l);
/* 1 when a final chunk was committed (nothing more can be begun). */
int chunk_log_is_final(const chunk_log *l);
/* Starts chunk seq at the committed end; -1 + err if a chunk is already open,
 * seq is 0 or not above the last committed seq, the log is final, or an earlier
 * I/O error left the log needing a reopen. Writes nothing yet. */
int chunk_log_begin(chunk_log *l, uint64_t seq, char *err, size_t errlen);
/* Appends n bytes (copied at once; data stays the caller's) to the open chunk as
 * DATA frames of at most 1 MiB each. -1 + err on I/O errors (errno says which, e.g.
 * ENOSPC): the chunk is then spoiled (append and commit refuse it) and must be aborted. n == 0 does nothing. */
int chunk_log_append(chunk_log *l, const void *data, size_t n, char *err, size_t errlen);
/* Writes the open chunk's COMMIT frame (final = 1: it ends the document), fsyncs
 * in fsync mode; on 0 the chunk is durable and listed. On -1 (errno set after an I/O
 * error) the chunk is dropped
 * as if aborted (a later chunk_log_abort is a harmless no-op); after a failed
 * fsync the log refuses new chunks until it is reopened. */
int chunk_log_commit(chunk_log *l, int final, char *err, size_t errlen);
/* Drops the open chunk: truncates the file back to the committed end. 0 when no
 * chunk is open; -1 + err if the truncation fails (the log then refuses new
 * chunks until reopened; the bytes left over are discarded by the reopen). */
int chunk_log_abort(chunk_log *l, char *err, size_t errlen);

/* Replay callbacks; nonzero stops the replay. They must not modify the log. */
typedef int (*chunk_log_data_fn)(void *user, uint64_t seq, const char *data, size_t n);
typedef int (*chunk_log_commit_fn)(void *user, const chunk_log_entry *e);
/* Replays committed chunks from from_offset (must be 0 or some entry's end_offset,
 * else -1 + err) to the committed end: on_data for each DATA frame's bytes (in
 * order, at most 1 MiB at a time), on_commit after each chunk (either may be NULL).
 * Every frame's CRC and each chunk's size and CRC are checked again as read; a
 * mismatch, an I/O error or a callback returning nonzero stops with -1 (err says
 * which). Reads through one bounded buffer (about 1 MiB), never the whole file.
 * An open chunk is not replayed. */
int chunk_log_replay(chunk_log *l, uint64_t from_offset, chunk_log_data_fn on_data,
                     chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen);

/* The same replay in steps (a restore fed to the engine a piece at a time):
 * each chunk_log_cursor_read delivers frames until at least at_least document
 * bytes have gone to on_data, stopping after a whole frame (mid-chunk too), and
 * answers 1 (more to read: the next call goes on from there), 0 (the committed
 * end) or -1 + err. l must not be appended to meanwhile. */
typedef struct chunk_log_cursor chunk_log_cursor;
chunk_log_cursor *chunk_log_cursor_open(chunk_log *l, uint64_t from_offset, char *err, size_t errlen);
int chunk_log_cursor_read(chunk_log_cursor *r, uint64_t at_least, chunk_log_data_fn on_data,
                          chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen);
void chunk_log_cursor_close(chunk_log_cursor *r);

#endif
