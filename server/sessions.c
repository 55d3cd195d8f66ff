/* Sessions: the registry, their store (server/store.h: meta, chunk log, snapshot), the
 * sessions API, streamed uploads into the pot with back-pressure and
 * durability, restore on start, TTL expiry.
 *
 * An upload's bytes go: MHD piece -> 16 KiB piece -> log append (thread pool,
 * one disk operation per session at a time) -> engine ingest (engine thread)
 * -> done event (loop). Pieces between arrival and ingest are bounded by
 * upload_buffer_bytes for all uploads (MAX_IN_FLIGHT an upload may always
 * have); beyond that the connection is suspended, so memory does not grow
 * with the body. A chunk is committed (fsync) only after every piece is
 * ingested, and acknowledged after the commit. A chunk that fails is
 * truncated out of the log and the pot is rebuilt from the log, so a failed
 * request changes nothing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "server/recall.h"
#include "server/server_internal.h"

enum { PIECE_BYTES = 16 * 1024, MAX_IN_FLIGHT = 8 };
#define SNAPSHOT_FILE "pot.snap"

struct piece {
    piece *next;
    size_t n;
    char data[PIECE_BYTES];
};

enum upload_mode { UPLOAD_RAW, UPLOAD_JSON, UPLOAD_DUPLICATE };

struct upload {
    request *r;
    session *ss;
    enum upload_mode mode;
    uint64_t seq;
    int final, wait, sse;
    int streaming;               /* sse and the event stream has started */
    int answered;                /* the error or result has been sent (or the client is gone) */
    const chunk_log_entry *dup;  /* UPLOAD_DUPLICATE (JSON: once read): the acknowledged chunk */
    int seq_given;               /* the header or query gave seq */
    piece *cur;
    piece *disk_head, *disk_tail;
    int disk_running, began;
    int in_flight;               /* pieces (and the end mark) between arrival and ingest */
    int to_disk;                 /* pieces not yet appended to the log */
    int acked;                   /* the client has its answer (wait=false: before ingest ends) */
    int body_done, failed, finished, committed, final_pushed;
    int engine_touched;          /* a piece or the end mark went to the engine: a failure rebuilds */
    engine_doc *kept;            /* the document as it stood before this chunk (engine_doc_copy),
                                    put back if the chunk fails; its memory is counted */
    int cancelled;               /* after a failure: the document's queued ingests were cancelled */
    api_error err;
    uint64_t bytes;
    uint32_t crc;
    uint32_t utf8_need;          /* continuation bytes still expected */
    uint32_t utf8_cp, utf8_min;  /* code point so far, and its smallest legal value */
    double t0;
    int64_t tokens;              /* document tokens its pieces added (chunk.tokens) */
};

/* ---- small helpers ------------------------------------------------------------------- */

static void in_flight_add(upload *u, int d) {
    u->in_flight += d;
    u->ss->srv->upload_pieces += d;
}

/* Whether u must wait for the engine before reading on: MAX_IN_FLIGHT pieces
 * are between arrival and ingest, and all uploads together hold
 * upload_buffer_bytes. Reading on past the engine lets a ?wait=false chunk
 * (acknowledged once durable, before its ingest) have its 202 without
 * waiting for the engine to come within 128 KiB of its end, and lets any
 * upload see its client leave: a connection not read is not seen to close
 * (the client's last bytes and its FIN wait in its own send queue), so a
 * client that left in the middle of a chunk held back kept its session busy
 * while every byte it had sent was read into the pot, to be thrown away. */
static int in_flight_full(const upload *u) {
    if (u->in_flight < MAX_IN_FLIGHT) return 0;
    const server *s = u->ss->srv;
    return s->upload_pieces * PIECE_BYTES >= s->cfg.upload_buffer_bytes;
}

static char *path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int valid_session_id(const char *id) {
    size_t n = strlen(id);
    if (n < 10 || n > 40 || strncmp(id, "sess_", 5)) return 0;
    for (size_t i = 5; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') || (id[i] >= '0' && id[i] <= '9')))
            return 0;
    return 1;
}

/* Incremental UTF-8 check (RFC 3629: no overlongs, surrogates or values
 * above U+10FFFF); state carries across pieces. 0 or -1. */
static int utf8_check(upload *u, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned c = p[i];
        if (u->utf8_need) {
            if ((c & 0xC0) != 0x80) return -1;
            u->utf8_cp = u->utf8_cp << 6 | (c & 0x3F);
            if (--u->utf8_need == 0 &&
                (u->utf8_cp < u->utf8_min || u->utf8_cp > 0x10FFFF ||
                 (u->utf8_cp >= 0xD800 && u->utf8_cp <= 0xDFFF)))
                return -1;
            continue;
        }
        if (c < 0x80) continue;
        if ((c & 0xE0) == 0xC0) u->utf8_need = 1, u->utf8_cp = c & 0x1F, u->utf8_min = 0x80;
        else if ((c & 0xF0) == 0xE0) u->utf8_need = 2, u->utf8_cp = c & 0x0F, u->utf8_min = 0x800;
        else if ((c & 0xF8) == 0xF0) u->utf8_need = 3, u->utf8_cp = c & 0x07, u->utf8_min = 0x10000;
        else return -1;
    }
    return 0;
}

/* ---- registry ------------------------------------------------------------------------ */

void session_ref(session *ss) { ss->refs++; }

static void free_session(session *ss) {
    api_session_settings_free(&ss->settings);
    json_decref(ss->file);
    store_log_close(ss->log);
    free(ss->dir);
    free(ss);
}

typedef struct doc_close_job {
    session *ss;
    engine_doc *doc; /* ss->doc, taken on the loop thread */
    int remove_files;
} doc_close_job;

/* A deleted session's files, and in a shared store, the local scratch
 * directory of any session leaving this replica (deleted or not). */
static void remove_dir_work(uv_work_t *w) {
    session *ss = w->data;
    if (ss->deleted) store_remove(ss->srv->st, ss->id, ss->token);
    if (store_is_shared(ss->srv->st)) { /* the local scratch copy of its snapshot */
        char *snap = path_join(ss->dir, SNAPSHOT_FILE);
        if (snap) unlink(snap);
        free(snap);
        rmdir(ss->dir);
    }
}

static void remove_dir_done(uv_work_t *w, int status) {
    (void)status;
    free_session(w->data);
    free(w);
}

/* ss is deleted: its files go, and its pot's memory, once its last reader
 * ends (counted as going until then, for the Retry-After of a 429). */
static void session_going(server *s, session *ss) {
    ss->deleted = 1;
    if (!ss->paged) s->pot_memory_going += ss->memory_bytes;
}

static void closed_on_engine(server *s, void *arg) {
    doc_close_job *j = arg;
    session *ss = j->ss;
    if (!ss->paged) s->pot_memory -= ss->memory_bytes;
    if (!ss->paged && ss->deleted) s->pot_memory_going -= ss->memory_bytes;
    if (j->remove_files || store_is_shared(s->st)) {
        store_log_close(ss->log);
        ss->log = NULL;
        uv_work_t *w = malloc(sizeof *w);
        if (w) {
            w->data = ss;
            if (!uv_queue_work(s->loop, w, remove_dir_work, remove_dir_done)) {
                free(j);
                return;
            }
            free(w);
        }
    }
    free_session(ss);
    free(j);
}

static void close_doc_task(engine *e, void *arg) {
    (void)e;
    doc_close_job *j = arg;
    engine_doc_close(j->doc);
    srv_post(j->ss->srv, closed_on_engine, j);
}

void session_unref(session *ss) {
    if (--ss->refs > 0) return;
    server *s = ss->srv;
    doc_close_job *j = malloc(sizeof *j);
    if (!j) abort();
    *j = (doc_close_job){ss, ss->doc, ss->deleted};
    ss->doc = NULL;
    if (srv_task(s, j->doc, close_doc_task, j)) {
        engine_doc_close(j->doc); /* the engine thread is gone: close here */
        if (!ss->paged) s->pot_memory -= ss->memory_bytes;
        free_session(ss);
        free(j);
    }
}

session *session_find(server *s, const char *id, const api_key *k) {
    for (session *ss = s->sessions; ss; ss = ss->next)
        if (!strcmp(ss->id, id) && (!k || !strcmp(ss->owner, k->owner))) return ss;
    return NULL;
}

static void unlink_session(server *s, session *ss) {
    for (session **p = &s->sessions; *p; p = &(*p)->next)
        if (*p == ss) {
            *p = ss->next;
            return;
        }
}

/* ss leaves the registry for good (deleted, expired): its queued acknowledged
 * chunks need not be read; its files and memory go when its last reader (a
 * question still answering) is done. */
static void session_remove(server *s, session *ss) {
    if (ss->acked_ingests) engine_doc_cancel(ss->doc);
    unlink_session(s, ss);
    session_going(s, ss);
    session_unref(ss); /* the registry's */
}

int64_t meta_expires(const json_t *meta) {
    int64_t ttl = (int64_t)json_integer_value(json_object_get(json_object_get(meta, "settings"), "ttl_seconds"));
    return ttl > 0 ? (int64_t)json_integer_value(json_object_get(meta, "created")) + ttl : 0;
}

/* Past its expires_at second (created, in whole seconds, + ttl_seconds): so it
 * lives at least ttl_seconds however late in its second it was created. */
static int session_expired(const session *ss, int64_t now) { return ss->expires && now > ss->expires; }

/* Forgets ss here (its store copy stays): the registry's reference goes. */
static void session_drop(server *s, session *ss) {
    for (session *p = s->sessions; p; p = p->next)
        if (p == ss) {
            unlink_session(s, ss);
            session_unref(ss);
            return;
        }
}

void sessions_free_all(server *s) {
    while (s->sessions) {
        session *ss = s->sessions;
        s->sessions = ss->next;
        engine_doc_close(ss->doc);
        ss->doc = NULL;
        free_session(ss);
    }
}

const char *session_log_busy(const session *ss) {
    if (ss->busy) return "the session is receiving an upload";
    if (ss->rebuilding) return "the session is restoring its document";
    if (ss->disk_busy) return "the session's log is being written or read (an upload's chunk, another question's re-read)";
    return NULL;
}

static const char *status_name(const session *ss) {
    if (ss->status == SESSION_FAILED) return "failed";
    if (ss->restoring) return "restoring";
    if (ss->paged) return "stored"; /* its pot in its snapshot: read back when a request needs it */
    return ss->busy || ss->rebuilding || ss->acked_ingests ? "ingesting" : "ready";
}

/* A session's "file" field: its file's {"filename", "purpose"} (file, from
 * its meta) with the file's id. */
static json_t *file_field(const char *session_id, const json_t *file) {
    json_t *f = json_deep_copy(file);
    char fid[48];
    file_id_of(session_id, fid, sizeof fid);
    json_object_set_new(f, "id", json_string(fid));
    return f;
}

/* The settings a session object shows, into o, as a session held here and one
 * only in the shared store (stored_session_json) show them; keep_tokens the
 * pot's own when it has one (keep), else the setting or its default. */
static void put_settings(server *s, const api_session_settings *set, int32_t keep, json_t *o) {
    const engine_pot_settings *p = &set->pot;
    json_object_set_new(o, "budget_tokens", json_integer(p->budget_tokens));
    json_object_set_new(o, "keep_tokens",
                        json_integer(keep ? keep : p->keep_tokens ? p->keep_tokens : p->budget_tokens / 2));
    json_object_set_new(o, "policy", json_string(p->policy ? p->policy : "infinipot"));
    json_object_set_new(o, "schedule", json_string(p->schedule ? p->schedule : "fixed"));
    json_object_set_new(o, "chunk_tokens", json_integer(p->chunk_tokens));
    json_object_set_new(o, "metadata", set->metadata ? json_incref(set->metadata) : json_object());
    json_object_set_new(o, "reread", json_boolean(set->reread));
    json_object_set_new(o, "whole_words", api_whole_words_json(set->whole_words));
    json_object_set_new(o, "recall", api_recall_json(recall_mode(s, set, API_RECALL_UNSET)));
}

json_t *session_json(server *s, const session *ss) {
    const engine_doc_stats *st = &ss->stats;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:I, s:I, s:i, s:I, s:I, s:b, s:I}", "id", ss->id, "object",
                          "session", "created", (json_int_t)ss->created, "model", s->model_id, "status",
                          status_name(ss), "bytes_received", (json_int_t)ss->bytes_acked, "tokens_ingested",
                          (json_int_t)st->tokens_read, "tokens_in_pot", st->tokens_in_pot, "compressions",
                          (json_int_t)st->compressions, "last_seq", (json_int_t)ss->last_seq, "final", ss->final,
                          "memory_bytes", (json_int_t)ss->memory_bytes);
    put_settings(s, &ss->settings, st->keep_tokens, o);
    if (ss->expires) json_object_set_new(o, "expires_at", json_integer(ss->expires));
    json_object_set_new(o, "pinned_tokens", json_integer(st->pinned_tokens));
    if (st->ring_entries) json_object_set_new(o, "ring_entries", json_integer(st->ring_entries));
    if (ss->status == SESSION_FAILED) json_object_set_new(o, "error", json_string(ss->fail_msg));
    if (ss->file) json_object_set_new(o, "file", file_field(ss->id, ss->file));
    return o;
}

/* ---- engine work for a session -------------------------------------------------------- */

typedef struct doc_job {
    session *ss;
    int rc;
    uint64_t from;                 /* log offset the snapshot covered (0: none used) */
    double snap_ingest_ms;         /* the reading time the snapshot held (0: none used) */
    char snap_err[256];            /* why the snapshot was not used */
    char err[256];
    char feed_err[256];            /* why the engine refused what the replay fed it ("" when it did not) */
    engine_doc_stats stats;
    engine_doc *old_doc;           /* the document it replaces (closed on the engine thread) */
    engine_doc *kept;              /* a rebuild that puts this copy back instead of re-reading */
    int restored;                  /* kept was given (the engine thread takes it) */
    engine_doc *doc;               /* the new one, handed to ss->doc back on the loop */
    int replay;                    /* open + replay the log (restore, rebuild) */
    void (*then)(server *, struct doc_job *);
    request *r;                    /* the request waiting for it, if any */
    /* a replay, a piece at a time (replay_go) */
    store_log_cursor *cursor;
    char *piece;                   /* the log's next bytes, read on the engine thread */
    size_t piece_len, piece_cap;
    uint64_t piece_seq;            /* the chunk its last bytes are from (a refusal names it) */
    int piece_final;               /* it ends with the document's final chunk */
    int more;                      /* the log has more after it */
    int restarted;                 /* the snapshot was given up: read from the log's start */
} doc_job;

static int piece_data(void *user, uint64_t seq, const char *data, size_t n) { /* engine thread */
    doc_job *j = user;
    if (j->piece_len + n > j->piece_cap) {
        size_t cap = (j->piece_len + n) * 2;
        char *grown = realloc(j->piece, cap);
        if (!grown) return -1;
        j->piece = grown;
        j->piece_cap = cap;
    }
    memcpy(j->piece + j->piece_len, data, n);
    j->piece_len += n;
    j->piece_seq = seq;
    return 0;
}

static int piece_commit(void *user, const chunk_log_entry *e) { /* engine thread */
    doc_job *j = user;
    j->piece_final |= e->final;
    if (!j->piece_len) j->piece_seq = e->seq; /* (an empty final chunk) */
    return 0;
}

/* Why a replay failed, for the session's error: the engine's reason when it
 * refused a chunk (the log's own message names the file's path otherwise). */
static const char *replay_error(const doc_job *j) { return *j->feed_err ? j->feed_err : j->err; }

/* Document bytes of the chunks the log holds (bytes_received of a session
 * whose replay failed part way). */
static int64_t logged_bytes(const session *ss) {
    int64_t n = 0;
    for (uint64_t seq = 1; ss->log && seq <= ss->last_seq; seq++) {
        const chunk_log_entry *e = store_log_find(ss->log, seq);
        if (e) n += (int64_t)e->bytes;
    }
    return n;
}

static void doc_job_back(server *s, void *arg) {
    doc_job *j = arg;
    j->ss->doc = j->doc;
    j->then(s, j);
}

/* ---- a replay, a piece at a time: reading REPLAY_PIECE bytes of the log is one
 * engine task, and feeding them one ingest, which the scheduler interleaves
 * with other documents' reading and the answers' decode steps; so a restore,
 * takeover or rebuild of a long log holds no one else's work up ---------------- */

enum { REPLAY_PIECE = 64 * 1024 };

static void replay_go(server *s, void *arg);

/* Engine thread: a snapshot the log does not fit (an offset it does not know,
 * bytes the engine refuses after it) is given up: a new document, from the
 * log's first byte. */
static void restart_from_zero(engine *e, doc_job *j) {
    session *ss = j->ss;
    store_log_cursor_close(j->cursor);
    j->cursor = NULL;
    engine_doc_close(j->doc);
    j->from = 0;
    j->snap_ingest_ms = 0;
    j->restarted = 1;
    *j->feed_err = 0;
    j->doc = engine_doc_open(e, &ss->settings.pot, j->err, sizeof j->err);
    if (j->doc) engine_doc_abandon_when(j->doc, &ss->srv->abandon_replays);
}

/* Engine thread: the log's next piece into j->piece (j->rc on a failure). */
static void read_piece(engine *e, doc_job *j) {
    session *ss = j->ss;
    for (;;) {
        j->piece_len = 0;
        j->piece_final = 0;
        int more = -1;
        if (!j->cursor) j->cursor = store_log_cursor_open(ss->log, j->from, j->err, sizeof j->err);
        if (j->cursor)
            more = store_log_cursor_read(j->cursor, REPLAY_PIECE, piece_data, piece_commit, j, j->err, sizeof j->err);
        if (more >= 0) {
            j->more = more;
            j->rc = 0;
            return;
        }
        j->rc = -1;
        if (!j->from || j->restarted || atomic_load(&ss->srv->abandon_replays)) return;
        restart_from_zero(e, j);
        if (!j->doc) return;
    }
}

static void read_piece_task(engine *e, void *arg) { /* engine thread */
    doc_job *j = arg;
    read_piece(e, j);
    srv_post(j->ss->srv, replay_go, j);
}

static void restart_task(engine *e, void *arg) { /* engine thread */
    doc_job *j = arg;
    restart_from_zero(e, j);
    if (j->doc) read_piece(e, j);
    else j->rc = -1;
    srv_post(j->ss->srv, replay_go, j);
}

static void replay_end_task(engine *e, void *arg) { /* engine thread */
    (void)e;
    doc_job *j = arg;
    store_log_cursor_close(j->cursor);
    j->cursor = NULL;
    if (j->doc) {
        engine_doc_abandon_when(j->doc, NULL);
        engine_doc_get_stats(j->doc, &j->stats);
    }
    srv_post(j->ss->srv, doc_job_back, j);
}

static void replay_end(server *s, doc_job *j) {
    free(j->piece);
    j->piece = NULL;
    if (!srv_task(s, j->doc, replay_end_task, j)) return;
    store_log_cursor_close(j->cursor); /* the engine has stopped: nothing of its runs */
    j->cursor = NULL;
    if (!j->rc) j->rc = -1, snprintf(j->err, sizeof j->err, "the server is shutting down");
    doc_job_back(s, j);
}

static void piece_fed(void *user, int rc, const char *err) { /* engine thread */
    doc_job *j = user;
    if (rc) {
        j->rc = -1;
        snprintf(j->feed_err, sizeof j->feed_err, "chunk %llu: %.200s", (unsigned long long)j->piece_seq,
                 err ? err : "refused");
    }
    srv_post(j->ss->srv, replay_go, j);
}

/* The replay's next move, on the loop: feed the piece read, read the next,
 * or end. j->piece_len is zeroed once the piece went to the engine. */
static void replay_go(server *s, void *arg) {
    doc_job *j = arg;
    int abandoning = atomic_load(&s->abandon_replays);
    if (j->rc && *j->feed_err && j->from && !j->restarted && !abandoning) {
        if (srv_task(s, j->doc, restart_task, j)) replay_end(s, j);
        return;
    }
    if (j->rc || abandoning) {
        if (!j->rc) j->rc = -1, snprintf(j->err, sizeof j->err, "the server is stopping");
        return replay_end(s, j);
    }
    if (j->piece_len || j->piece_final) {
        size_t n = j->piece_len;
        int final = j->piece_final;
        j->piece_len = 0;
        j->piece_final = 0;
        if (srv_ingest(s, j->doc, j->piece, n, final, piece_fed, j)) {
            j->rc = -1;
            snprintf(j->err, sizeof j->err, "the server is shutting down");
            replay_end(s, j);
        }
        return;
    }
    if (!j->more) return replay_end(s, j);
    if (srv_task(s, j->doc, read_piece_task, j)) {
        j->rc = -1;
        snprintf(j->err, sizeof j->err, "the server is shutting down");
        replay_end(s, j);
    }
}

/* Engine thread: (re)opens the session's document, replaying its log. The
 * previous document (a rebuild) is closed first. ss->doc itself belongs to
 * the loop thread: the new document goes back in the job. */
static void open_doc_task(engine *e, void *arg) {
    doc_job *j = arg;
    session *ss = j->ss;
    engine_doc_close(j->old_doc);
    j->old_doc = NULL;
    if (j->kept) { /* the state before the failed chunk: nothing to re-read */
        j->doc = j->kept;
        j->kept = NULL;
        engine_doc_get_stats(j->doc, &j->stats);
        srv_post(ss->srv, doc_job_back, j);
        return;
    }
    char *snap = j->replay ? path_join(ss->dir, SNAPSHOT_FILE) : NULL;
    int have_snap = snap && ss->log ? store_snapshot_get(ss->log, snap, j->snap_err, sizeof j->snap_err) : 1;
    if (have_snap == 0 && access(snap, F_OK) && errno == ENOENT) have_snap = 1; /* none written yet: not news */
    if (have_snap == 0) { /* the snapshot, then the log past it */
        j->doc = engine_doc_load(e, &ss->settings.pot, snap, &j->from, j->snap_err, sizeof j->snap_err);
        if (j->doc && j->from > store_log_committed_size(ss->log)) {
            /* the log was cut back (damage): the snapshot goes too, else once new chunks bring the
               log past its offset again it would be taken for theirs (it holds the old ones) */
            snprintf(j->snap_err, sizeof j->snap_err, "it covers more of the log than the log holds (removed)");
            engine_doc_close(j->doc);
            j->doc = NULL;
            if (!store_is_shared(ss->srv->st)) unlink(snap);
        }
        if (!j->doc) j->from = 0;
        if (j->doc) {
            engine_doc_stats ds;
            engine_doc_get_stats(j->doc, &ds);
            j->snap_ingest_ms = ds.ingest_ms;
        }
    }
    if (have_snap == 0 && store_is_shared(ss->srv->st)) unlink(snap); /* a copy fetched from the store */
    free(snap);
    if (!j->doc) j->doc = engine_doc_open(e, &ss->settings.pot, j->err, sizeof j->err);
    j->rc = j->doc ? 0 : -1;
    if (!j->rc && j->replay && ss->log) {
        /* a stopping server abandons the replay (the log stays: the next start reads it) */
        engine_doc_abandon_when(j->doc, &ss->srv->abandon_replays);
        read_piece(e, j);
        return srv_post(ss->srv, replay_go, j);
    }
    if (j->doc) engine_doc_get_stats(j->doc, &j->stats);
    srv_post(ss->srv, doc_job_back, j);
}

static int submit_doc_job(server *s, session *ss, int replay, void (*then)(server *, doc_job *),
                          request *r) {
    doc_job *j = calloc(1, sizeof *j);
    if (!j) return -1;
    j->ss = ss;
    j->replay = replay;
    j->then = then;
    j->r = r;
    j->old_doc = ss->doc;
    if (replay && ss->restore_doc) {
        j->kept = ss->restore_doc;
        j->restored = 1;
        j->from = ss->snap_offset; /* the snapshot on disk is still the one it was */
        j->snap_ingest_ms = ss->snap_ingest_ms;
    }
    session_ref(ss);
    if (r) request_ref(r);
    if (srv_task(s, j->old_doc, open_doc_task, j)) {
        session_unref(ss);
        if (r) request_unref(r);
        free(j);
        return -1;
    }
    if (j->restored) ss->restore_doc = NULL; /* (j->kept is the engine thread's now) */
    ss->doc = NULL; /* the engine closes it; doc_job_back sets the new one */
    return 0;
}

static void finish_doc_job(doc_job *j) {
    free(j->piece);
    if (j->r) request_unref(j->r);
    session_unref(j->ss);
    free(j);
}

static void pot_waiters_go(server *s, session *ss, request *w);

/* The chunk in the pot was acknowledged, or the pot put back after it failed: the questions
   that waited for it go on. */
static void chunk_settled(server *s, session *ss) {
    ss->chunk_in_pot = 0;
    request *w = ss->chunk_waiting;
    ss->chunk_waiting = NULL;
    if (w) pot_waiters_go(s, ss, w);
}

/* ---- rebuild: after a failed chunk, the pot is put back as it was before the chunk
 * (the upload's copy) or, without one, re-read from the snapshot and the log past it ----- */

static void release_lease_later(server *s, const char *id, const char *token);

static void rebuilt(server *s, doc_job *j) {
    session *ss = j->ss;
    request *waiting = ss->chunk_waiting; /* (they go on once the session is as it is now) */
    ss->chunk_waiting = NULL;
    ss->chunk_in_pot = 0;
    if (j->restored) s->pot_memory -= ss->memory_bytes; /* the copy replaced the failed document */
    ss->rebuilding = 0;
    ss->busy = 0;
    if (j->rc && !*j->feed_err && store_log_unreachable(ss->log) && !atomic_load(&s->abandon_replays)) {
        /* Redis did not answer the re-read: the session is whole there (the failed chunk was
           not committed), so it is let go for the next request to take over, not failed */
        fprintf(stderr, "potserve: session %s: rebuild stopped, the store did not answer (%.200s); released\n",
                ss->id, j->err);
        release_lease_later(s, ss->id, ss->token);
        session_drop(s, ss);
    } else if (j->rc) {
        ss->status = SESSION_FAILED;
        snprintf(ss->fail_msg, sizeof ss->fail_msg, "rebuilding from the log failed: %.200s", replay_error(j));
        ss->bytes_acked = logged_bytes(ss);
    } else {
        ss->stats = j->stats;
        ss->bytes_acked = ss->stats.bytes_read;
        ss->snap_offset = j->from;
        ss->snap_ingest_ms = j->snap_ingest_ms;
        fprintf(stderr, "potserve: session %s: after a failed chunk the pot is %s\n", ss->id,
                j->restored ? "back as it was before the chunk" : "re-read from the log");
    }
    session_ref(ss);
    finish_doc_job(j);
    pot_waiters_go(s, ss, waiting);
    session_unref(ss);
}

static void start_rebuild(server *s, session *ss) {
    if (ss->gens > 0) return; /* session_generation_done starts it */
    if (submit_doc_job(s, ss, 1, rebuilt, NULL)) {
        engine_doc_close(ss->restore_doc); /* no engine thread holds it */
        if (ss->restore_doc) s->pot_memory -= ss->memory_bytes;
        ss->restore_doc = NULL;
        ss->rebuilding = 0;
        ss->busy = 0;
        ss->status = SESSION_FAILED;
        snprintf(ss->fail_msg, sizeof ss->fail_msg, "cannot rebuild: the engine is stopping");
        chunk_settled(s, ss);
    }
}

void session_generation_done(session *ss) {
    if (--ss->gens == 0 && ss->rebuilding) start_rebuild(ss->srv, ss);
}

/* ---- the pre-chunk copy: a failed chunk puts it back ------------------------------------------ */

typedef struct keep_job {
    server *srv;
    upload *u;
    engine_doc *doc, *copy;
    const engine_pot_settings *settings;
    char err[256];
} keep_job;

static void drop_kept(upload *u);

static void kept_back(server *s, void *arg) {
    keep_job *k = arg;
    upload *u = k->u;
    request *r = u->r;
    u->kept = k->copy;
    if (k->copy) u->ss->keeping = u;
    if (u->acked) drop_kept(u); /* (made after the commit: of no use) */
    if (!k->copy) {
        s->pot_memory -= u->ss->memory_bytes;
        fprintf(stderr, "potserve: session %s: no copy of the pot before chunk %llu (%s): a failure re-reads the log\n",
                u->ss->id, (unsigned long long)u->seq, k->err);
    }
    free(k);
    request_unref(r);
}

static void keep_task(engine *e, void *arg) {
    (void)e;
    keep_job *k = arg;
    k->copy = engine_doc_copy(k->doc, k->settings, k->err, sizeof k->err);
    srv_post(k->srv, kept_back, k);
}

/* Closes a document no session holds any more (arg). */
static void close_bare_doc_task(engine *e, void *arg) {
    (void)e;
    engine_doc_close(arg);
}

/* Before the chunk's first byte goes to the engine: a copy of the document as
 * it stands, made on the engine thread after the session's earlier ingests, so
 * that a failure later in the chunk costs a copy back, not a re-read of the
 * log. Only when pot memory allows a second pot (else a failure re-reads). */
static void keep_pre_chunk_state(upload *u) {
    session *ss = u->ss;
    server *s = ss->srv;
    if (s->pot_memory + ss->memory_bytes > (size_t)s->cfg.pot_memory_limit) return;
    keep_job *k = calloc(1, sizeof *k);
    if (!k) return;
    *k = (keep_job){.srv = s, .u = u, .doc = ss->doc, .settings = &ss->settings.pot};
    s->pot_memory += ss->memory_bytes;
    request_ref(u->r);
    if (srv_task(s, ss->doc, keep_task, k)) {
        s->pot_memory -= ss->memory_bytes;
        request_unref(u->r);
        free(k);
    }
}

/* Marks that the chunk's bytes (or end) go to the engine now; the first time,
 * the pre-chunk copy is made. */
static void touch_engine(upload *u) {
    if (!u->engine_touched) keep_pre_chunk_state(u);
    u->engine_touched = 1;
    if (!u->acked) u->ss->chunk_in_pot = 1;
}

int session_chunk_wait(request *r, session *ss) {
    if (!ss->chunk_in_pot) return 0;
    request_suspend(r);
    request_ref(r);
    r->next_waiting = ss->chunk_waiting;
    ss->chunk_waiting = r;
    return 1;
}

void sessions_sweep_chunk_waits(server *s, int (*lost)(request *r)) {
    for (session *ss = s->sessions; ss; ss = ss->next)
        for (request **p = &ss->chunk_waiting; *p;) {
            request *r = *p, *next = r->next_waiting;
            if (lost(r)) *p = next; /* (it answered r and gave the list's reference up) */
            else p = &r->next_waiting;
        }
}

/* The copy is no longer needed (the upload ended). */
static void drop_kept(upload *u) {
    server *s = u->ss->srv;
    if (!u->kept) return;
    if (srv_task(s, NULL, close_bare_doc_task, u->kept)) engine_doc_close(u->kept); /* no engine thread left */
    s->pot_memory -= u->ss->memory_bytes;
    u->kept = NULL;
    u->ss->keeping = NULL;
}

/* ---- disk operations, one at a time per session ------------------------------------------ */

typedef struct disk_op {
    uv_work_t work;
    upload *u;
    piece *p;     /* append */
    int kind;     /* 0 append, 1 commit, 2 abort */
    int rc;
    int full;     /* the failure was a full disk or a file size limit */
    int fenced;   /* the shared store refused it: another replica holds the session */
    int deleted;  /* ... or it was deleted there */
    int began;    /* append: this op opened the chunk in the log (which an abort must close) */
    int unavailable; /* the shared store did not run it (no connection, loading): retry */
    char err[256];
} disk_op;

static void upload_step(upload *u);

static void disk_work(uv_work_t *w) {
    disk_op *op = w->data;
    upload *u = op->u;
    store_log *log = u->ss->log;
    errno = 0; /* a refusal that is no I/O error leaves it 0: not a full disk */
    if (op->kind == 0) {
        op->rc = 0;
        if (!u->began) op->rc = store_log_begin(log, u->seq, op->err, sizeof op->err), op->began = !op->rc;
        if (!op->rc) op->rc = store_log_append(log, op->p->data, op->p->n, op->err, sizeof op->err);
    } else if (op->kind == 1) {
        op->rc = store_log_commit(log, u->final, op->err, sizeof op->err);
    } else {
        op->rc = u->began ? store_log_abort(log, op->err, sizeof op->err) : 0;
    }
    op->full = op->rc && (errno == ENOSPC || errno == EDQUOT || errno == EFBIG);
    op->unavailable = op->rc && errno == EAGAIN;
    op->fenced = op->rc && store_log_fenced(log);
    op->deleted = op->rc && store_log_deleted(log);
}

static void piece_ingested(void *user, int rc, const char *err);

typedef struct ingest_ctx {
    upload *u;
    engine_doc *doc; /* the session's, read on the engine thread */
    piece *p;
    engine_doc_stats stats;
    int rc;
    char err[256];
} ingest_ctx;

static void fail_upload(upload *u, int status, const char *code, const char *fmt, const char *detail) {
    if (u->failed) return;
    u->failed = 1;
    api_fail(&u->err, status, code, NULL, fmt, detail);
}

/* A write that failed: 507 when storage ran out (the client may retry once
 * space is freed), else 500. */
static void fail_storage(upload *u, const disk_op *op, const char *what) {
    if (op->deleted)
        return fail_upload(u, 404, "session_not_found", "the session was deleted (%s)", u->ss->id);
    if (op->fenced) {
        u->ss->srv->m.fenced_writes++;
        return fail_upload(u, 421, "session_moved", "this replica gave the session up; retry: %s", op->err);
    }
    if (op->unavailable) return fail_upload(u, 503, "store_unavailable", "the store did not take the chunk; retry: %s", op->err);
    fail_upload(u, op->full ? 507 : 500, op->full ? "insufficient_storage" : "storage_error", what, op->err);
}

static void disk_done(uv_work_t *w, int status) {
    (void)status;
    disk_op *op = w->data;
    upload *u = op->u;
    server *s = u->ss->srv;
    u->disk_running = 0;
    u->ss->disk_busy = 0;
    if (op->kind == 0) {
        u->to_disk--;
        if (op->began) u->began = 1; /* even when the append then failed: the abort closes it */
        if (op->rc) {
            fail_storage(u, op, "cannot write the chunk to the log: %s");
            in_flight_add(u, -1);
            free(op->p);
        } else if (u->failed || !op->p->n) { /* an empty chunk's record: nothing to ingest */
            in_flight_add(u, -1);
            free(op->p);
        } else {
            ingest_ctx *c = calloc(1, sizeof *c);
            c->u = u;
            c->doc = u->ss->doc;
            c->p = op->p;
            touch_engine(u);
            request_ref(u->r);
            if (srv_ingest(s, u->ss->doc, op->p->data, op->p->n, 0, piece_ingested, c)) {
                request_unref(u->r);
                fail_upload(u, 503, "unavailable", "%s", "the engine is stopping");
                in_flight_add(u, -1);
                free(op->p);
                free(c);
            }
        }
    } else if (op->kind == 1) {
        if (op->rc) fail_storage(u, op, "cannot commit the chunk: %s");
        else u->committed = 1;
    } else {
        u->began = 0;
    }
    request *r = u->r;
    free(op);
    upload_step(u);
    request_unref(r);
}

static void disk_submit(upload *u, int kind, piece *p) {
    disk_op *op = calloc(1, sizeof *op);
    if (!op) abort();
    op->u = u;
    op->kind = kind;
    op->p = p;
    op->work.data = op;
    u->disk_running = 1;
    u->ss->disk_busy = 1;
    request_ref(u->r);
    if (uv_queue_work(u->ss->srv->loop, &op->work, disk_work, disk_done)) abort();
}

/* ---- engine ingest of one piece ---------------------------------------------------------- */

static void piece_ingested_loop(server *s, void *arg) {
    ingest_ctx *c = arg;
    upload *u = c->u;
    session *ss = u->ss;
    int64_t before = ss->stats.tokens_read, comp = ss->stats.compressions;
    double ims = ss->stats.ingest_ms, cms = ss->stats.compress_ms;
    ss->stats = c->stats;
    u->tokens += ss->stats.tokens_read - before; /* the engine reads a document's pieces in order */
    s->m.tokens_ingested += ss->stats.tokens_read - before;
    s->m.compressions += ss->stats.compressions - comp;
    s->m.ingest_ms += ss->stats.ingest_ms - ims;
    s->m.compress_ms += ss->stats.compress_ms - cms;
    in_flight_add(u, -1);
    if (c->rc) {
        if ((s->draining || s->stopping) && strstr(c->err, "shutting down")) /* the engine stopped at the drain's end */
            fail_upload(u, 503, "shutting_down", "%s", "the server is shutting down; the chunk was not kept");
        else if (strstr(c->err, "does not fit"))
            fail_upload(u, 422, "document_too_long", "%s", c->err);
        else
            fail_upload(u, 500, "ingest_failed", "%s", c->err);
    }
    if (u->streaming && u->r->conn && !u->answered) {
        char line[256];
        int n = snprintf(line, sizeof line,
                         "event: progress\ndata: {\"tokens_ingested\": %lld, \"tokens_in_pot\": %d, "
                         "\"compressions\": %lld}\n\n",
                         (long long)ss->stats.tokens_read, ss->stats.tokens_in_pot,
                         (long long)ss->stats.compressions);
        stream_write(u->r, line, (size_t)n);
    }
    request *r = u->r;
    free(c->p);
    free(c);
    upload_step(u);
    request_unref(r);
}

static void piece_ingested(void *user, int rc, const char *err) {
    ingest_ctx *c = user; /* engine thread: the doc's stats are read here */
    c->rc = rc;
    if (err) snprintf(c->err, sizeof c->err, "%s", err);
    engine_doc_get_stats(c->doc, &c->stats);
    srv_post(c->u->ss->srv, piece_ingested_loop, c);
}

/* ---- the upload's state machine ------------------------------------------------------------ */

static json_t *chunk_result(upload *u) {
    session *ss = u->ss;
    json_t *o = session_json(ss->srv, ss);
    json_object_set_new(o, "chunk",
                        json_pack("{s:I, s:I, s:I, s:f}", "seq", (json_int_t)u->seq, "bytes",
                                  (json_int_t)u->bytes, "tokens",
                                  (json_int_t)u->tokens, "ms",
                                  monotonic_ms() - u->t0));
    return o;
}

static void respond_upload(upload *u, int status, json_t *body) {
    request *r = u->r;
    u->answered = 1;
    if (u->ss->file) files_upload_answer(u->ss, &status, &body);
    if (!r->conn) {
        json_decref(body);
        return;
    }
    if (u->streaming) {
        /* the 200 is gone: the status the answer would have had goes in the error object, so a
           client can tell a refusal (4xx) from a failure to retry (5xx, as Retry-After would say) */
        json_t *err = status >= 400 ? json_object_get(body, "error") : NULL;
        if (err) json_object_set_new(err, "status", json_integer(status));
        if (err && status == 503) json_object_set_new(err, "retry_after", json_integer(1));
        char *text = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        const char *ev = status >= 400 ? "error" : "done";
        char head[32];
        int n = snprintf(head, sizeof head, "event: %s\ndata: ", ev);
        stream_write(r, head, (size_t)n);
        if (text) stream_write(r, text, strlen(text));
        stream_write(r, "\n\n", 2);
        free(text);
        stream_end(r);
        return;
    }
    if (status == 503) { /* the engine or the store: both pass, so say when to retry */
        json_decref(body);
        return respond_retry(r, &u->err, 1);
    }
    respond_json(r, status, body);
}

/* After the answer (wait=false), a failure can no longer be undone: the
 * chunk is committed, so the session is marked failed. */
static void fail_acked(upload *u) {
    session *ss = u->ss;
    ss->status = SESSION_FAILED;
    snprintf(ss->fail_msg, sizeof ss->fail_msg, "ingesting chunk %llu failed: %.200s",
             (unsigned long long)u->seq, u->err.message);
}

/* After a failure: the pieces still waiting for the log are dropped (each
 * was counted in flight when it was dispatched). */
static void drop_queued_pieces(upload *u) {
    while (u->disk_head) {
        piece *p = u->disk_head;
        u->disk_head = p->next;
        free(p);
        in_flight_add(u, -1);
        u->to_disk--;
    }
    u->disk_tail = NULL;
}

/* An acknowledged upload's last piece is back from the engine. */
static void acked_ingest_ended(upload *u) {
    u->finished = 1;
    u->ss->acked_ingests--;
}

/* The chunk is committed: the session counts it and the client gets its
 * answer (200, or 202 with wait=false while the ingest goes on). */
static void acknowledge(upload *u) {
    session *ss = u->ss;
    u->acked = 1;
    drop_kept(u); /* committed: a later failure never puts it back (fail_acked) */
    ss->last_seq = u->seq;
    ss->final = u->final;
    ss->busy = 0;
    ss->srv->m.bytes_uploaded += (int64_t)u->bytes;
    u->r->tokens = u->tokens;
    ss->bytes_acked += (int64_t)u->bytes;
    if (u->in_flight > 0) ss->acked_ingests++; /* wait=false: the ingest goes on after the answer */
    respond_upload(u, u->wait ? 200 : 202, chunk_result(u));
    chunk_settled(ss->srv, ss);
}

/* Moves the upload on: pieces to disk, then the document's end, the commit,
 * the answer; or, after a failure, the abort and the rebuild. With wait
 * (the default) the commit follows the ingest of every piece; without, it
 * follows their append to the log and the answer is 202. */
static void upload_step(upload *u) {
    session *ss = u->ss;
    server *s = ss->srv;
    request *r = u->r;
    if (u->finished || u->disk_running) return;
    if (u->failed && !u->acked && !u->wait && u->committed) {
        /* wait=false: the ingest failed while the commit ran, and the commit
           made the chunk durable: it is acknowledged (202) as the commit
           promised, and fails as an acknowledged chunk does */
        acknowledge(u);
        if (u->in_flight == 0) ss->acked_ingests++; /* acked_ingest_ended below counts it down */
    }
    if (u->failed && u->acked) {
        if (u->in_flight > 0) return;
        acked_ingest_ended(u);
        return fail_acked(u);
    }
    if (u->failed) {
        drop_queued_pieces(u); /* nothing more goes to the log or the engine */
        /* the answer goes out once the body has been read (and dropped), not
         * after the pieces already in the engine: those can take a while */
        if (r->suspended && !u->body_done) request_wake(r);
        if (u->body_done && !u->answered) respond_upload(u, u->err.status, api_error_json(&u->err));
        /* the pot is re-read after this chunk anyway: its queued pieces fail at
         * once (unless an acknowledged chunk's pieces are queued before them) */
        if (u->in_flight > 0 && u->engine_touched && !u->cancelled && !ss->acked_ingests) {
            u->cancelled = 1;
            engine_doc_cancel(ss->doc);
        }
        if (u->in_flight > 0) return; /* wait for the engine to hand back every piece */
        if (u->began && !u->committed) return disk_submit(u, 2, NULL);
        if (u->committed) { /* the failure came during the commit: the log holds the chunk, so it stands */
            ss->last_seq = u->seq;
            ss->final = u->final;
        }
        u->finished = 1;
        /* (libmicrohttpd sends nothing before the body has been read: body_ended answers then) */
        if (!u->answered && u->body_done) respond_upload(u, u->err.status, api_error_json(&u->err));
        if (store_log_fenced(ss->log)) { /* another replica took the session over: it is not ours */
            ss->busy = 0;
            chunk_settled(s, ss);
            return session_drop(s, ss);
        }
        if (!u->engine_touched) { /* the pot never saw this chunk: it holds the pre-chunk state */
            ss->busy = 0;
            return;
        }
        /* pieces of this chunk reached the pot: put back its copy from before the chunk or,
           without one (or when the log kept the chunk), re-read it (last snapshot + the log
           past it) */
        if (!u->committed) {
            ss->restore_doc = u->kept;
            u->kept = NULL;
            ss->keeping = NULL;
        }
        ss->rebuilding = 1;
        start_rebuild(s, ss);
        return;
    }
    if (u->disk_head) {
        piece *p = u->disk_head;
        u->disk_head = p->next;
        if (!u->disk_head) u->disk_tail = NULL;
        return disk_submit(u, 0, p);
    }
    if (r->suspended && !u->body_done && !in_flight_full(u)) request_wake(r);
    if (!u->body_done) return;
    if (u->acked) {
        if (u->in_flight == 0) acked_ingest_ended(u);
        return;
    }
    if (u->wait ? u->in_flight > 0 : u->to_disk > 0) return;
    if (u->final && !u->final_pushed) {
        ingest_ctx *c = calloc(1, sizeof *c);
        if (!c) abort();
        c->u = u;
        c->doc = ss->doc;
        u->final_pushed = 1;
        touch_engine(u);
        in_flight_add(u, 1);
        request_ref(r);
        if (srv_ingest(s, ss->doc, "", 0, 1, piece_ingested, c)) {
            request_unref(r);
            free(c);
            in_flight_add(u, -1);
            fail_upload(u, 503, "unavailable", "%s", "the engine is stopping");
        }
        return upload_step(u);
    }
    if (!u->began) { /* an empty chunk still gets its record */
        piece *p = calloc(1, sizeof *p);
        if (!p) abort();
        in_flight_add(u, 1);
        u->to_disk++;
        return disk_submit(u, 0, p);
    }
    if (!u->committed) return disk_submit(u, 1, NULL);
    acknowledge(u);
    if (u->in_flight == 0) u->finished = 1;
    if (u->final || store_log_committed_size(ss->log) - ss->snap_offset >= (uint64_t)s->cfg.snapshot_bytes ||
        (s->cfg.snapshot_seconds && ss->stats.ingest_ms - ss->snap_ingest_ms >= (double)s->cfg.snapshot_seconds * 1e3))
        session_snapshot(s, ss);
}

void upload_free(upload *u) {
    while (u->disk_head) {
        piece *p = u->disk_head;
        u->disk_head = p->next;
        free(p);
    }
    free(u->cur);
    if (u->ss) {
        u->ss->srv->upload_pieces -= u->in_flight; /* (pieces never handed to the log or the engine) */
        drop_kept(u);
        if (!u->finished && u->ss->busy) {
            /* the client left: the chunk was never acknowledged */
            u->ss->busy = 0;
        }
        session_unref(u->ss);
    }
    free(u);
}

void upload_abandon(upload *u) {
    /* once acknowledged (202 of wait=false) the chunk is durable: the ingest goes on */
    if (u->finished || u->acked) return;
    fail_upload(u, 400, "client_closed", "%s", "the client closed the connection before the chunk ended");
    u->body_done = 1; /* (none of it will come now: the failure is answered, to no one) */
    upload_step(u);
}

static void dispatch_piece(upload *u) {
    piece *p = u->cur;
    u->cur = NULL;
    if (!p || !p->n || u->failed) { /* a failed chunk's bytes go nowhere */
        free(p);
        return;
    }
    p->next = NULL;
    if (u->disk_tail) u->disk_tail->next = p;
    else u->disk_head = p;
    u->disk_tail = p;
    in_flight_add(u, 1);
    u->to_disk++;
    upload_step(u);
}

static void take_bytes(upload *u, const char *data, size_t n) {
    server *s = u->ss->srv;
    if (u->bytes + n > (uint64_t)s->cfg.max_chunk_bytes) {
        char limit[32];
        snprintf(limit, sizeof limit, "%lld", (long long)s->cfg.max_chunk_bytes);
        fail_upload(u, 413, "chunk_too_large", "the chunk exceeds max_chunk_bytes (%s)", limit);
        return;
    }
    u->crc = crc32c(u->crc, data, n);
    u->bytes += n;
    if (u->mode == UPLOAD_DUPLICATE) return;
    if (utf8_check(u, (const unsigned char *)data, n)) {
        fail_upload(u, 400, "invalid_utf8", "%s", "the chunk is not valid UTF-8; nothing of it was kept");
        return;
    }
    while (n) {
        if (!u->cur) {
            u->cur = malloc(sizeof *u->cur);
            if (!u->cur) {
                fail_upload(u, 500, NULL, "%s", "out of memory");
                return;
            }
            u->cur->n = 0;
        }
        size_t k = PIECE_BYTES - u->cur->n < n ? PIECE_BYTES - u->cur->n : n;
        memcpy(u->cur->data + u->cur->n, data, k);
        u->cur->n += k;
        data += k;
        n -= k;
        if (u->cur->n == PIECE_BYTES) dispatch_piece(u);
    }
}

static void finish_duplicate(upload *u) {
    u->finished = 1;
    u->ss->busy = 0;
    int same_final = (u->final != 0) == (u->dup->final != 0); /* (a retry that now says final would leave
                                                                  the document open while its client thinks it closed) */
    if (u->bytes == u->dup->bytes && u->crc == u->dup->crc && same_final) {
        json_t *o = session_json(u->ss->srv, u->ss);
        json_object_set_new(o, "duplicate", json_true());
        json_object_set_new(o, "chunk", json_pack("{s:I, s:I}", "seq", (json_int_t)u->seq, "bytes",
                                                  (json_int_t)u->bytes));
        return respond_upload(u, 200, o);
    }
    api_error e;
    if (!same_final)
        api_fail(&e, 409, "seq_conflict", "final", "chunk %llu was acknowledged with final=%s", (unsigned long long)u->seq,
                 u->dup->final ? "true" : "false");
    else
        api_fail(&e, 409, "seq_conflict", "seq", "chunk %llu was acknowledged with different bytes",
                 (unsigned long long)u->seq);
    respond_upload(u, 409, api_error_json(&e));
}

/* JSON body {"text": ..., "seq": N, "final": bool}: fields override the query. */
static int take_json_body(upload *u, api_error *e) {
    json_t *root = request_json(u->r, e);
    if (!root) return -1;
    json_t *text = json_object_get(root, "text"), *seq = json_object_get(root, "seq"),
           *fin = json_object_get(root, "final");
    int rc = 0;
    if (!text) rc = api_fail(e, 400, "missing_field", "text", "the chunk's text is missing (\"text\": \"...\")");
    else if (!json_is_string(text)) rc = api_fail(e, 400, "invalid_type", "text", "text must be a string");
    else if (seq && !json_is_null(seq) && (!json_is_integer(seq) || json_integer_value(seq) < 1))
        rc = api_fail(e, 400, "invalid_type", "seq", "seq must be a positive integer");
    else if (fin && !json_is_null(fin) && !json_is_boolean(fin))
        rc = api_fail(e, 400, "invalid_type", "final", "final must be a boolean");
    if (!rc && seq && json_is_integer(seq)) {
        uint64_t want = (uint64_t)json_integer_value(seq);
        if (u->seq_given && want != u->seq) /* no guessing which one the client meant */
            rc = api_fail(e, 400, "invalid_value", "seq", "the body's seq (%llu) and X-Chunk-Seq or ?seq= (%llu) disagree",
                          (unsigned long long)want, (unsigned long long)u->seq);
        else if (!u->seq_given && (u->dup = store_log_find(u->ss->log, want)) == NULL && want != u->ss->last_seq + 1)
            rc = api_fail(e, 409, "seq_gap", "seq", "seq %llu is not the next chunk (last_seq %llu)",
                          (unsigned long long)want, (unsigned long long)u->ss->last_seq);
        u->seq = want;
    }
    if (!rc && !u->dup && u->ss->final)
        rc = api_fail(e, 409, "document_final", NULL, "%s", "the document has already ended (final)");
    if (!rc) {
        if (fin && json_is_boolean(fin)) u->final = json_is_true(fin); /* the body overrides ?final */
        u->mode = u->dup ? UPLOAD_DUPLICATE : UPLOAD_RAW;
        take_bytes(u, json_string_value(text), json_string_length(text));
    }
    json_decref(root);
    return rc;
}

static void json_chunk_parsed(request *r);
static void body_ended(upload *u);

void upload_receive(request *r, const char *data, size_t *size) {
    upload *u = r->up;
    if (*size) {
        if (u->mode == UPLOAD_JSON) {
            size_t n = *size;
            *size = 0;
            if (r->body_len + n > (size_t)r->srv->cfg.max_body_bytes) {
                fail_upload(u, 413, "body_too_large", "%s", "the JSON body exceeds max_body_bytes");
                return;
            }
            char *t = realloc(r->body, r->body_len + n + 1);
            if (!t) return fail_upload(u, 500, NULL, "%s", "out of memory");
            r->body = t;
            memcpy(r->body + r->body_len, data, n);
            r->body_len += n;
            r->body[r->body_len] = 0;
            return;
        }
        if (!u->failed) take_bytes(u, data, *size);
        *size = 0;
        /* back-pressure: stop reading while the engine is behind */
        if (in_flight_full(u) && !u->failed) request_suspend(r);
        return;
    }
    if (u->body_done) return;
    /* the body has ended */
    u->body_done = 1;
    if (u->mode == UPLOAD_JSON && !u->failed) return request_parse_json(r, json_chunk_parsed);
    body_ended(u);
}

/* ---- uploads whose bytes come from elsewhere (a form's file) ----------------------------- */

upload *upload_open(request *r, session *ss) {
    upload *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    u->r = r;
    u->ss = ss;
    session_ref(ss);
    u->mode = UPLOAD_RAW;
    u->seq = ss->last_seq + 1;
    u->final = 1;
    u->wait = ss->acked_ingests >= MAX_IN_FLIGHT; /* (as start_upload's back-pressure) */
    u->t0 = monotonic_ms();
    ss->busy = 1;
    return u;
}

int upload_take(upload *u, const char *data, size_t n) {
    if (!u->failed) take_bytes(u, data, n);
    return !u->failed && in_flight_full(u);
}

void upload_end(upload *u) {
    if (u->body_done) return;
    u->body_done = 1;
    body_ended(u);
}

void upload_abort(upload *u, const api_error *e) {
    if (!u->failed) {
        u->failed = 1;
        u->err = *e;
    }
    upload_step(u);
}

static void json_chunk_parsed(request *r) {
    upload *u = r->up;
    api_error e;
    if (take_json_body(u, &e)) {
        u->finished = 1;
        u->ss->busy = 0;
        return respond_error(r, &e);
    }
    body_ended(u);
}

/* The chunk's body has come (a JSON one's text taken from it): answered, or sent on. */
static void body_ended(upload *u) {
    request *r = u->r;
    if (u->mode == UPLOAD_DUPLICATE && !u->failed) { /* an event stream asked for: its done (or error) event */
        if (u->sse) u->streaming = !stream_start(r);
        return finish_duplicate(u);
    }
    if (!u->failed && u->utf8_need)
        fail_upload(u, 400, "invalid_utf8", "%s", "the chunk ends inside a UTF-8 character; nothing of it was kept");
    dispatch_piece(u);
    if (u->sse && !u->failed) u->streaming = !stream_start(r);
    /* a failed chunk is answered now, from this handler where it can be (from
       a suspended connection its answer would wait for libmicrohttpd's next
       timer: up to a second); when disk work under way holds the answer back,
       the connection waits suspended for it */
    else if (!u->finished && !u->failed) request_suspend(r);
    upload_step(u);
    if (u->failed && u->finished && !u->answered) respond_upload(u, u->err.status, api_error_json(&u->err));
    if (u->failed && !u->answered) request_suspend(r);
}

/* A chunk number as the JSON body's seq takes it: decimal digits only (no
 * sign, no spaces), 1 .. INT64_MAX. 0, or -1 for anything else. */
static int parse_seq(const char *text, uint64_t *out) {
    uint64_t v = 0;
    if (!*text) return -1;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9' || v > ((uint64_t)INT64_MAX - (uint64_t)(*p - '0')) / 10) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v == 0) return -1;
    *out = v;
    return 0;
}

/* A boolean query parameter: dflt when absent, -1 when neither true/1/yes nor false/0/no. */
static int query_flag(request *r, const char *name, int dflt) {
    const char *v = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
    if (!v) return dflt;
    if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes")) return 1;
    return !strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no") ? 0 : -1;
}

/* Whether a header value's first token (up to ';', white space or a closing
 * quote) is word, ignoring case: "text/plainx" is not text/plain. */
static int media_type_is(const char *value, const char *word) {
    size_t n = strlen(word);
    if (!value || strncasecmp(value, word, n)) return 0;
    char c = value[n];
    return !c || c == ';' || c == ' ' || c == '\t' || c == '"';
}

/* Headers of POST /v1/sessions/{id}/chunks: everything that can be refused
 * before the body is read. */
static void start_upload(request *r, session *ss) {
    server *s = r->srv;
    api_error e;
    struct MHD_Connection *c = r->conn;
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    const char *seq_h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Chunk-Seq");
    const char *seq_q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "seq");
    const char *len_h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    const char *accept = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    while (ct && (*ct == ' ' || *ct == '\t')) ct++;
    if (ct && !*ct) ct = NULL; /* an empty Content-Type is none */
    int json = media_type_is(ct, "application/json");
    if (ct && !json && !media_type_is(ct, "text/plain") && !media_type_is(ct, "application/octet-stream")) {
        api_fail(&e, 415, "unsupported_media_type", NULL,
                 "upload text/plain, application/octet-stream or application/json, not %s", ct);
        return respond_error(r, &e);
    }
    const char *charset = ct ? strcasestr(ct, "charset=") : NULL;
    if (charset) { /* the document is kept and read as UTF-8: another encoding would be misread */
        charset += 8;
        if (*charset == '"') charset++;
        if (!media_type_is(charset, "utf-8") && !media_type_is(charset, "utf8") && !media_type_is(charset, "us-ascii")) {
            api_fail(&e, 415, "unsupported_media_type", NULL, "the text must be UTF-8, not %.60s (%s)", charset, ct);
            return respond_error(r, &e);
        }
    }
    if (len_h && json && strtoull(len_h, NULL, 10) > (unsigned long long)s->cfg.max_body_bytes) {
        api_fail(&e, 413, "body_too_large", NULL, "the JSON body exceeds max_body_bytes (%lld)",
                 (long long)s->cfg.max_body_bytes);
        return respond_error(r, &e);
    }
    if (len_h && !json && strtoull(len_h, NULL, 10) > (unsigned long long)s->cfg.max_chunk_bytes) {
        api_fail(&e, 413, "chunk_too_large", NULL, "the chunk exceeds max_chunk_bytes (%lld)",
                 (long long)s->cfg.max_chunk_bytes);
        return respond_error(r, &e);
    }
    if (ss->status == SESSION_FAILED) {
        api_fail(&e, 409, "session_failed", NULL, "the session failed: %s", ss->fail_msg);
        return respond_error(r, &e);
    }
    if (ss->busy || ss->rebuilding || ss->disk_busy) {
        api_fail(&e, 409, "session_busy", NULL, "the session is still ingesting another upload");
        return respond_error(r, &e);
    }
    upload *u = calloc(1, sizeof *u);
    if (!u) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    u->r = r;
    u->ss = ss;
    session_ref(ss);
    u->mode = json ? UPLOAD_JSON : UPLOAD_RAW;
    u->seq = ss->last_seq + 1;
    u->final = query_flag(r, "final", 0);
    u->wait = query_flag(r, "wait", 1);
    u->sse = accept && strstr(accept, "text/event-stream");
    u->t0 = monotonic_ms();
    r->up = u;
    if (u->final < 0 || u->wait < 0) {
        api_fail(&e, 400, "invalid_value", u->final < 0 ? "final" : "wait", "%s must be true or false",
                 u->final < 0 ? "final" : "wait");
        u->finished = 1;
        return respond_error(r, &e);
    }
    if (u->sse) u->wait = 1; /* progress events need the ingest */
    /* back-pressure on acknowledged chunks: beyond MAX_IN_FLIGHT of them still
       being ingested, an upload waits for its own ingest (200), so a client
       cannot queue unbounded work and memory */
    if (ss->acked_ingests >= MAX_IN_FLIGHT) u->wait = 1;
    uint64_t v = 0, vq = 0;
    const char *bad = seq_h && parse_seq(seq_h, &v) ? seq_h : seq_q && parse_seq(seq_q, &vq) ? seq_q : NULL;
    if (bad) {
        api_fail(&e, 400, "invalid_value", "seq", "seq must be an integer in [1, 2^63-1], not '%.40s'", bad);
        u->finished = 1;
        return respond_error(r, &e);
    }
    if (!seq_h) v = vq;
    if (seq_h && seq_q && v != vq) { /* no guessing which one the client meant */
        api_fail(&e, 400, "invalid_value", "seq", "X-Chunk-Seq (%llu) and ?seq= (%llu) disagree",
                 (unsigned long long)v, (unsigned long long)vq);
        u->finished = 1;
        return respond_error(r, &e);
    }
    if (v) {
        const chunk_log_entry *dup = store_log_find(ss->log, v);
        if (dup) {
            if (!json) u->mode = UPLOAD_DUPLICATE; /* JSON: the text is compared once the body is read */
            u->dup = dup;
        } else if (v != ss->last_seq + 1) {
            api_fail(&e, 409, "seq_gap", "seq", "seq %llu is not the next chunk (last_seq %llu)",
                     (unsigned long long)v, (unsigned long long)ss->last_seq);
            u->finished = 1;
            return respond_error(r, &e);
        }
        u->seq = v;
        u->seq_given = 1;
    }
    if (ss->final && u->mode == UPLOAD_RAW) { /* JSON: once its seq is known (take_json_body) */
        api_fail(&e, 409, "document_final", NULL, "the document has already ended (final)");
        u->finished = 1;
        return respond_error(r, &e);
    }
    ss->busy = 1;
}

/* ---- session creation --------------------------------------------------------------------- */

typedef struct create_job {
    uv_work_t work;
    request *r;
    session *ss;
    char *meta;
    int rc;
    int full; /* the disk is full (or a quota or file size limit) */
    char err[256];
} create_job;

static void create_work(uv_work_t *w) {
    create_job *j = w->data;
    session *ss = j->ss;
    errno = 0;
    j->rc = store_create(ss->srv->st, ss->id, j->meta, ss->owner, &ss->log, j->err, sizeof j->err);
    j->full = j->rc && (errno == ENOSPC || errno == EDQUOT || errno == EFBIG);
}

/* The session setting an engine error names first ("keep_tokens: ..."), where
 * it names one; NULL otherwise. */
static const char *setting_at_fault(const char *err) {
    static const char *const settings[] = {"budget_tokens", "keep_tokens", "chunk_tokens", "pool_width", "nuc_share",
                                           "policy", "schedule", "question", "system", "catalyst"};
    for (size_t i = 0; i < sizeof settings / sizeof *settings; i++) {
        size_t n = strlen(settings[i]);
        if (!strncmp(err, settings[i], n) && err[n] == ':') return settings[i];
    }
    return NULL;
}

static void created_doc(server *s, doc_job *j) {
    session *ss = j->ss;
    request *r = j->r;
    if (j->rc) {
        api_error e;
        api_fail(&e, 422, "invalid_value", setting_at_fault(j->err), "%s", j->err);
        respond_error(r, &e);
        session_going(s, ss); /* unref below removes the files */
        unlink_session(s, ss);
        finish_doc_job(j);
        session_unref(ss); /* the registry's reference */
        return;
    }
    ss->stats = j->stats;
    ss->busy = 0;
    if (ss->file) files_session_created(r, ss); /* POST /v1/files: the form's file is its first chunk */
    else respond_json(r, 201, session_json(s, ss));
    finish_doc_job(j);
}

static void take_over(request *r, const char *id, const char *param);

static void create_done(uv_work_t *w, int status) {
    (void)status;
    create_job *j = w->data;
    server *s = j->ss->srv;
    request *r = j->r;
    session *ss = j->ss;
    free(j->meta);
    if (store_is_shared(s->st)) { /* in the store only, held by no replica yet */
        api_error e;
        ss->busy = 0; /* nothing to read yet: ready */
        if (j->rc) api_fail(&e, 503, "store_unavailable", NULL, "%s", j->err), respond_retry(r, &e, 1);
        else if (ss->file) take_over(r, ss->id, "file"); /* a file's bytes are read here: taken at once */
        else respond_json(r, 201, session_json(s, ss));
        free_session(ss);
    } else if (j->rc || submit_doc_job(s, ss, 0, created_doc, r)) {
        api_error e;
        if (j->full) api_fail(&e, 507, "insufficient_storage", NULL, "%s", j->err);
        else api_fail(&e, j->rc ? 500 : 503, j->rc ? "storage_error" : "shutting_down", NULL, "%s",
                      j->rc ? j->err : "the engine is stopping");
        respond_error(r, &e);
        unlink_session(s, ss);
        session_going(s, ss);
        session_unref(ss);
    }
    free(j);
    request_unref(r);
}

static int count_sessions(server *s, const api_key *k) {
    int n = 0;
    for (session *ss = s->sessions; ss; ss = ss->next) n += !strcmp(ss->owner, k->owner);
    return n;
}

/* Retry-After of a 429 that waits for sessions to go: the seconds until the
 * first of them (k's, or anyone's with k NULL) is gone, so that a retry then
 * finds room (it expires once its expires_at second has passed, and the
 * once-a-second sweep removes it within the next); a minute when none has a
 * TTL (they go only when deleted). */
static int seconds_to_next_expiry(server *s, const api_key *k) {
    int64_t now = (int64_t)time(NULL), best = 0;
    for (session *ss = s->sessions; ss; ss = ss->next)
        if (ss->expires && (!k || !strcmp(ss->owner, k->owner)) && (!best || ss->expires < best))
            best = ss->expires;
    if (!best) return 60;
    int64_t wait = best + 2 - now;
    return wait < 1 ? 1 : wait > 3600 ? 3600 : (int)wait;
}

static char *sessions_dir(server *s) { return path_join(s->cfg.data_dir, "sessions"); }

static void create_session(request *r) {
    server *s = r->srv;
    api_error e;
    api_session_settings settings;
    json_t *body = r->body_blank ? NULL : request_json(r, &e); /* blank: every default */
    if ((!r->body_blank && !body) || api_parse_session_settings(body, s->info.n_ctx_train, (int32_t)s->cfg.budget_tokens,
                                                                 s->cfg.policy, &settings, &e)) {
        json_decref(body);
        return respond_error(r, &e);
    }
    json_decref(body);
    session_create(r, &settings, NULL);
}

void session_create(request *r, api_session_settings *settings, json_t *file) {
    server *s = r->srv;
    api_error e;
    session *ss = calloc(1, sizeof *ss);
    if (!ss) {
        api_session_settings_free(settings);
        json_decref(file);
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    ss->settings = *settings;
    ss->file = file;
    if (count_sessions(s, r->key) >= s->cfg.max_sessions_per_key) {
        free_session(ss);
        api_fail(&e, 429, "too_many_sessions", NULL, "this key already has %lld sessions (max_sessions_per_key)",
                 (long long)s->cfg.max_sessions_per_key);
        return respond_retry(r, &e, seconds_to_next_expiry(s, r->key));
    }
    ss->memory_bytes = engine_doc_memory(s->eng, &ss->settings.pot);
    if (pot_memory_admit(s, ss->memory_bytes, "budget_tokens", "the session", &e)) {
        free_session(ss);
        return respond_error(r, &e);
    }
    /* (shared store: the replica the session's requests reach makes room when it takes it over) */
    if (!store_is_shared(s->st) && !pots_make_room(s, ss->memory_bytes)) {
        api_fail(&e, 429, "insufficient_memory", "budget_tokens",
                 "a pot of %zu bytes does not fit: %zu of pot_memory_limit %lld are in use",
                 ss->memory_bytes, s->pot_memory, (long long)s->cfg.pot_memory_limit);
        /* deleted pots about to be freed would make room: retry in a second, not at the next expiry */
        int soon = s->pot_memory - s->pot_memory_going + ss->memory_bytes <= (size_t)s->cfg.pot_memory_limit;
        free_session(ss);
        return respond_retry(r, &e, soon ? 1 : seconds_to_next_expiry(s, NULL));
    }
    ss->srv = s;
    ss->refs = 1; /* the registry */
    random_id(ss->id, sizeof ss->id, "sess_");
    memcpy(ss->owner, r->key->owner, sizeof ss->owner);
    ss->created = (int64_t)time(NULL);
    ss->used_ms = monotonic_ms();
    ss->expires = ss->settings.ttl_seconds ? ss->created + ss->settings.ttl_seconds : 0;
    ss->dir = store_session_dir(s->st, ss->id);
    json_t *meta = json_pack("{s:s, s:s, s:I, s:o, s:s}", "id", ss->id, "owner", ss->owner,
                             "created", (json_int_t)ss->created, "settings",
                             api_session_settings_json(&ss->settings), "model", s->model_id);
    if (meta && ss->file) json_object_set(meta, "file", ss->file);
    create_job *j = calloc(1, sizeof *j);
    if (j) j->meta = meta ? json_dumps(meta, JSON_INDENT(1)) : NULL;
    json_decref(meta);
    if (!ss->dir || !j || !j->meta) {
        if (j) free(j->meta);
        free(j);
        free_session(ss);
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    snprintf(r->session_id, sizeof r->session_id, "%s", ss->id);
    if (!store_is_shared(s->st)) { /* shared: the replica nginx routes its id to takes it (session_lookup) */
        s->pot_memory += ss->memory_bytes;
        ss->next = s->sessions;
        s->sessions = ss;
    }
    j->r = r;
    j->ss = ss;
    j->work.data = j;
    request_ref(r);
    request_suspend(r);
    ss->busy = 1; /* until the document is open */
    if (uv_queue_work(s->loop, &j->work, create_work, create_done)) abort();
}

/* ---- snapshots ------------------------------------------------------------------------------- */

typedef struct save_job {
    session *ss;
    engine_doc *doc;    /* ss->doc when it was queued (the engine thread does not read ss) */
    uint64_t offset;
    double ingest_ms;   /* the document's reading time when saved */
    char *path;
    int rc;
    char err[256];
} save_job;

static void page_in_submit(server *s, session *ss);

static void snapshot_saved(server *s, void *arg) {
    save_job *j = arg;
    session *ss = j->ss;
    ss->snap_saving = 0;
    if (!j->rc && j->offset > ss->snap_offset) ss->snap_offset = j->offset, ss->snap_ingest_ms = j->ingest_ms;
    if (ss->page_in_after_save) page_in_submit(s, ss);
    /* (a session deleted while its snapshot was queued: its directory is gone, and so is the need) */
    if (j->rc && !ss->deleted) fprintf(stderr, "potserve: session %s: snapshot failed: %s\n", ss->id, j->err);
    free(j->path);
    session_unref(ss);
    free(j);
    if (s->snapshots_deadline > 0 && !sessions_saving(s) && !background_pending(s))
        uv_stop(s->loop); /* the stop's last snapshot */
}

static void save_task(engine *e, void *arg) {
    (void)e;
    save_job *j = arg;
    j->rc = j->doc ? engine_doc_save(j->doc, j->path, j->offset, j->err, sizeof j->err) : -1;
    if (j->doc) {
        engine_doc_stats ds;
        engine_doc_get_stats(j->doc, &ds);
        j->ingest_ms = ds.ingest_ms;
    }
    if (!j->rc) j->rc = store_snapshot_put(j->ss->log, j->path, j->err, sizeof j->err);
    if (!j->doc) snprintf(j->err, sizeof j->err, "no document");
    srv_post(j->ss->srv, snapshot_saved, j);
}

int sessions_saving(const server *s) {
    for (const session *ss = s->sessions; ss; ss = ss->next)
        if (ss->snap_saving) return 1;
    return 0;
}

void session_snapshot(server *s, session *ss) {
    if (!ss->log || !ss->doc || ss->busy || ss->disk_busy || ss->rebuilding || ss->snap_saving ||
        ss->status == SESSION_FAILED || ss->deleted)
        return;
    uint64_t offset = store_log_committed_size(ss->log);
    if (offset <= ss->snap_offset) return;
    save_job *j = calloc(1, sizeof *j);
    if (!j || !(j->path = path_join(ss->dir, SNAPSHOT_FILE))) {
        free(j);
        return;
    }
    j->ss = ss;
    j->doc = ss->doc;
    j->offset = offset; /* the document holds exactly the committed bytes once the task's turn comes */
    session_ref(ss);
    ss->snap_saving = 1;
    if (srv_task(s, ss->doc, save_task, j)) {
        ss->snap_saving = 0;
        session_unref(ss);
        free(j->path);
        free(j);
    }
}

/* ---- routes ------------------------------------------------------------------------------------- */

/* ---- a key's sessions in a shared store --------------------------------------------------- */

typedef struct owned_job {
    server *s;
    char owner[17];
    char id[48]; /* "": all of the owner's */
    store_owned_session *list;
    size_t n;
    int rc;
    char err[256];
    owned_done_fn done;
    void *user;
} owned_job;

static void owned_read_work(void *arg) {
    owned_job *j = arg;
    j->rc = store_owned(j->s->st, j->owner, *j->id ? j->id : NULL, &j->list, &j->n, j->err, sizeof j->err);
}

static void owned_read_done(request *r, void *arg) {
    owned_job *j = arg;
    if (j->rc) {
        api_error e;
        api_fail(&e, 503, "store_unavailable", NULL, "the store did not answer; retry: %s", j->err);
        respond_retry(r, &e, 1);
    } else {
        j->done(r, j->list, j->n, j->user);
    }
    if (j->rc) free(j->user);
    store_owned_free(j->list, j->n);
    free(j);
}

void sessions_read_owned(request *r, const char *id, owned_done_fn done, void *user) {
    owned_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(user);
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    *j = (owned_job){.s = r->srv, .done = done, .user = user};
    snprintf(j->owner, sizeof j->owner, "%s", r->key->owner);
    if (id) snprintf(j->id, sizeof j->id, "%s", id);
    request_work(r, WORK_POOL, owned_read_work, owned_read_done, j);
}

/* A session of the shared store that this replica does not hold, as its
 * meta says ("status": "stored"; what only its pot knows, its tokens, is
 * not shown; its settings as session_json shows them); NULL when it is not
 * key's, has expired, or its settings do not parse. */
static json_t *stored_session_json(server *s, const store_owned_session *so, const api_key *key) {
    json_t *meta = json_loads(so->meta, 0, NULL), *o = NULL;
    const char *owner = json_string_value(json_object_get(meta, "owner"));
    json_t *settings = json_object_get(meta, "settings");
    int64_t created = (int64_t)json_integer_value(json_object_get(meta, "created")), expires = meta_expires(meta);
    api_session_settings set = {0};
    api_error e;
    if (owner && !strcmp(owner, key->owner) && json_is_object(settings) && !(expires && (int64_t)time(NULL) > expires) &&
        !api_parse_session_settings(settings, s->info.n_ctx_train, (int32_t)s->cfg.budget_tokens, s->cfg.policy, &set,
                                    &e)) {
        const char *model = json_string_value(json_object_get(meta, "model"));
        o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:I, s:I, s:b}", "id", so->id, "object", "session", "created",
                      (json_int_t)created, "model", model ? model : s->model_id, "status", "stored", "bytes_received",
                      (json_int_t)so->bytes, "last_seq", (json_int_t)so->last_seq, "final", so->final);
        put_settings(s, &set, 0, o);
        if (expires) json_object_set_new(o, "expires_at", json_integer(expires));
        json_t *file = json_object_get(meta, "file");
        if (json_is_object(file)) json_object_set_new(o, "file", file_field(so->id, file));
    }
    api_session_settings_free(&set);
    json_decref(meta);
    return o;
}

static int by_created_desc(const void *a, const void *b) {
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    json_int_t cx = json_integer_value(json_object_get(x, "created"));
    json_int_t cy = json_integer_value(json_object_get(y, "created"));
    return cx != cy ? (cx > cy ? -1 : 1)
                    : strcmp(json_string_value(json_object_get(x, "id")), json_string_value(json_object_get(y, "id")));
}

static void list_owned(request *r, store_owned_session *list, size_t n, void *user) {
    (void)user;
    server *s = r->srv;
    json_t **v = calloc(n ? n : 1, sizeof *v);
    size_t k = 0;
    int64_t now = (int64_t)time(NULL);
    for (size_t i = 0; v && i < n; i++) {
        session *held = session_find(s, list[i].id, r->key);
        json_t *o = !held ? stored_session_json(s, &list[i], r->key)
                    : !session_expired(held, now) ? session_json(s, held) : NULL;
        if (o) v[k++] = o;
    }
    if (k) qsort(v, k, sizeof *v, by_created_desc); /* (the store's set has no order) */
    json_t *data = json_array();
    for (size_t i = 0; i < k; i++) json_array_append_new(data, v[i]);
    free(v);
    respond_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static void list_sessions(request *r) {
    server *s = r->srv;
    /* a shared store: every replica's, from the store (the ones held here as they are here) */
    if (store_is_shared(s->st)) return sessions_read_owned(r, NULL, list_owned, NULL);
    json_t *data = json_array();
    int64_t now = (int64_t)time(NULL);
    for (session *ss = s->sessions; ss; ss = ss->next) /* (an expired one is gone, though the sweep has not run) */
        if (!strcmp(ss->owner, r->key->owner) && !session_expired(ss, now)) json_array_append_new(data, session_json(s, ss));
    respond_json(r, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static int registered(const server *s, const session *ss);

/* A deletion being made durable (store_mark_deleted, on the thread pool: a
 * rename and a sync, or a Redis round trip that may stall); the session is
 * busy meanwhile, so no upload starts and no second delete. */
typedef struct delete_job {
    session *ss;
    int as_file; /* answered as a file's deletion */
    int rc, again; /* again: the store did not run it, or did not answer (retry: it runs twice alike) */
    int moved;     /* the store says another replica holds the session now */
    char err[256];
} delete_job;

static void delete_work(void *arg) {
    delete_job *j = arg;
    session *ss = j->ss;
    j->rc = store_mark_deleted(ss->srv->st, ss->id, ss->token, j->err, sizeof j->err);
    j->again = j->rc && errno == EAGAIN;
    j->moved = j->rc && errno == EPERM && store_is_shared(ss->srv->st);
}

static void delete_done(request *r, void *arg) {
    delete_job *j = arg;
    session *ss = j->ss;
    server *s = ss->srv;
    api_error e;
    ss->busy = 0;
    if (j->again) {
        api_fail(&e, 503, "store_unavailable", NULL, "the store did not take the deletion; retry: %s", j->err);
        respond_retry(r, &e, 1);
    } else if (j->moved) { /* its lease lapsed: the replica holding it now deletes it */
        if (registered(s, ss)) session_drop(s, ss);
        api_fail(&e, 421, "session_moved", NULL, "this replica gave the session up; retry: %s", j->err);
        respond_retry(r, &e, 1);
    } else if (j->rc) {
        api_fail(&e, 500, "storage_error", NULL, "cannot delete the session: %s", j->err);
        respond_error(r, &e);
    } else {
        if (registered(s, ss)) session_remove(s, ss); /* (not dropped meanwhile: a lease lost) */
        char fid[48];
        if (j->as_file) file_id_of(ss->id, fid, sizeof fid);
        respond_json(r, 200, json_pack("{s:s, s:s, s:b}", "id", j->as_file ? fid : ss->id, "object",
                                       j->as_file ? "file" : "session.deleted", "deleted", 1));
    }
    session_unref(ss); /* the job's */
    free(j);
}

void session_delete(request *r, session *ss, int as_file) {
    api_error e;
    if (ss->busy) {
        api_fail(&e, 409, "session_busy", NULL, "the session is ingesting an upload; retry when it ends");
        return respond_error(r, &e);
    }
    /* durable before the 200: the files may stay while readers (an
       acknowledged chunk's ingest, a question) finish, and a restart then
       must not bring the session back */
    delete_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    j->ss = ss;
    j->as_file = as_file;
    session_ref(ss);
    ss->busy = 1;
    request_work(r, WORK_POOL, delete_work, delete_done, j);
}

void route_sessions(request *r, const char *rest, const char *upload, size_t *upload_size) {
    (void)upload;
    (void)upload_size;
    server *s = r->srv;
    api_error e;
    int get = request_reads(r), post = !strcmp(r->method, "POST"), del = !strcmp(r->method, "DELETE");
    if (!*rest) {
        if (post) return create_session(r);
        if (get) return list_sessions(r);
        return respond_method_not_allowed(r, "GET, HEAD, POST");
    }
    char id[48];
    const char *slash = route_id(rest, id, sizeof id);
    snprintf(r->session_id, sizeof r->session_id, "%s", id);
    session *ss = session_lookup(r, id, NULL);
    if (!ss) return;
    /* an upload and the pot's readings need the pot (paged in), a deletion waits for a page-in
       under way; the session's info needs neither */
    int needs_pot = slash && (!strcmp(slash, "/chunks") ? post || !strcmp(r->method, "PUT")
                                                         : get && (!strcmp(slash, "/retention") || !strcmp(slash, "/text")));
    if ((needs_pot || (!slash && del)) && session_pot_wait(r, ss, needs_pot)) return;
    if (!slash) {
        if (get) return respond_json(r, 200, session_json(s, ss));
        if (del) return session_delete(r, ss, 0);
        return respond_method_not_allowed(r, "GET, HEAD, DELETE");
    } else if (!strcmp(slash, "/chunks")) {
        if (post || !strcmp(r->method, "PUT")) return start_upload(r, ss);
        return respond_method_not_allowed(r, "POST, PUT");
    } else if (!strcmp(slash, "/retention")) {
        if (get) return session_retention(r, ss);
        return respond_method_not_allowed(r, "GET, HEAD");
    } else if (!strcmp(slash, "/text")) {
        if (get) return session_text(r, ss);
        return respond_method_not_allowed(r, "GET, HEAD");
    }
    api_fail(&e, 404, "not_found", NULL, "no route %s %s", r->method, r->url);
    respond_error(r, &e);
}

/* ---- restore on start and expiry ------------------------------------------------------------------ */

/* One restore less to wait for; /health says ready after the last. */
static void restore_done_one(server *s) {
    if (--s->restores_pending == 0) {
        s->loading = 0;
        fprintf(stderr, "potserve: ready\n");
    }
}

/* A restore's end (at start, at a takeover or at a page-in: `what` says which in
 * the log line): the session is ready, or failed. */
static void restore_ended(doc_job *j, const char *what) {
    session *ss = j->ss;
    ss->busy = 0;
    if (j->rc && atomic_load(&ss->srv->abandon_replays)) {
        ss->status = SESSION_FAILED; /* for the moments left: the log is whole, the next start reads it */
        snprintf(ss->fail_msg, sizeof ss->fail_msg, "the server is stopping");
        fprintf(stderr, "potserve: session %s: restore abandoned, the server is stopping\n", ss->id);
    } else if (j->rc) {
        ss->status = SESSION_FAILED;
        snprintf(ss->fail_msg, sizeof ss->fail_msg, "restore failed: %.200s", replay_error(j));
        ss->bytes_acked = logged_bytes(ss);
        if (j->doc) ss->stats = j->stats; /* what the replay read before it failed */
        fprintf(stderr, "potserve: session %s: %s\n", ss->id, ss->fail_msg);
    } else {
        ss->stats = j->stats;
        ss->bytes_acked = ss->stats.bytes_read; /* the log, read whole */
        ss->snap_offset = j->from;
        ss->snap_ingest_ms = j->snap_ingest_ms;
        fprintf(stderr, "potserve: session %s: %s (%lld bytes, %lld tokens, last_seq %llu; %s)\n", ss->id, what,
                (long long)ss->stats.bytes_read, (long long)ss->stats.tokens_read, (unsigned long long)ss->last_seq,
                j->from ? "from its snapshot" : "log replayed from the start");
        if (!j->from && *j->snap_err) /* (an emptied log too: the snapshot says chunks were there) */
            fprintf(stderr, "potserve: session %s: snapshot not used: %s\n", ss->id, j->snap_err);
    }
    finish_doc_job(j);
}

static void restore_next(server *s);

static void restored(server *s, doc_job *j) {
    j->ss->restoring = RESTORE_NONE;
    restore_ended(j, "restored");
    restore_done_one(s);
    restore_next(s);
}

/* A session from the store: its meta (JSON text) and its log, opened under
 * token (the lease held on it). NULL + err (*unanswered, when not NULL: the
 * shared store did not answer the log's read, so a retry may find it). */
static session *load_session(server *s, const char *id, const char *meta_text, const char *token, int keep_failed,
                             int *unanswered, char *err, size_t errlen) {
    json_error_t je;
    json_t *meta = json_loads(meta_text, 0, &je);
    session *ss = calloc(1, sizeof *ss);
    api_error e;
    int ok = 0;
    if (!meta || !ss) {
        snprintf(err, errlen, "%.60s: unreadable meta.json", id);
        goto out;
    }
    json_t *settings = json_object_get(meta, "settings");
    const char *owner = json_string_value(json_object_get(meta, "owner"));
    int rc = settings ? api_parse_session_settings(settings, s->info.n_ctx_train, (int32_t)s->cfg.budget_tokens,
                                                   s->cfg.policy, &ss->settings, &e)
                      : -1;
    if (rc || !owner || !*owner || strlen(owner) > 16) {
        snprintf(err, errlen, "%.60s: bad settings in meta.json%s%.150s", id, rc ? ": " : "", rc ? e.message : "");
        goto out;
    }
    int damaged = 0;
    ss->log = store_log_open(s->st, id, token, &damaged, err, errlen);
    if (!ss->log && unanswered) *unanswered = store_is_shared(s->st) && errno == EAGAIN;
    if (!ss->log && !keep_failed) goto out;
    if (!ss->log) { /* its owner sees it failed, with why, rather than gone (404) */
        ss->status = SESSION_FAILED;
        snprintf(ss->fail_msg, sizeof ss->fail_msg, "cannot restore: %s", err);
    }
    if (damaged)
        fprintf(stderr, "potserve: session %s: the log was damaged; kept what precedes the damage (the rest is "
                "in chunks.log.damaged-*)\n", id);
    snprintf(ss->id, sizeof ss->id, "%.40s", id);
    snprintf(ss->owner, sizeof ss->owner, "%s", owner);
    snprintf(ss->token, sizeof ss->token, "%s", token);
    ss->srv = s;
    ss->refs = 1;
    if (store_is_shared(s->st)) { /* a scratch directory of this lease's own, gone with the session here */
        char name[96];
        snprintf(name, sizeof name, "%.40s.%lld", id, atoll(token));
        ss->dir = store_session_dir(s->st, name);
    } else {
        ss->dir = store_session_dir(s->st, id);
    }
    ss->created = (int64_t)json_integer_value(json_object_get(meta, "created"));
    json_t *file = json_object_get(meta, "file");
    ss->file = json_is_object(file) ? json_incref(file) : NULL;
    ss->expires = ss->settings.ttl_seconds ? ss->created + ss->settings.ttl_seconds : 0;
    ss->last_seq = ss->log ? store_log_last_seq(ss->log) : 0;
    ss->bytes_acked = logged_bytes(ss); /* (bytes_received, a file's bytes, while it is restored) */
    ss->final = ss->log && store_log_is_final(ss->log);
    ss->memory_bytes = ss->log ? engine_doc_memory(s->eng, &ss->settings.pot) : 0; /* (failed: no pot) */
    ok = ss->dir != NULL;
out:
    json_decref(meta);
    if (!ok && ss) {
        api_session_settings_free(&ss->settings);
        store_log_close(ss->log);
        free(ss->dir);
        free(ss);
        ss = NULL;
    }
    return ss;
}

static void restore_one(void *user, const char *id) {
    server *s = user;
    if (!valid_session_id(id)) return;
    char err[256];
    char *meta = store_meta_read(s->st, id, NULL, err, sizeof err);
    session *ss = meta ? load_session(s, id, meta, "local", 1, NULL, err, sizeof err) : NULL;
    free(meta);
    if (!ss) {
        fprintf(stderr, "potserve: skipping session %s: %s\n", id, err);
        return;
    }
    ss->paged = ss->memory_bytes > 0; /* its pot is counted when its turn to be read comes (restore_next) */
    ss->next = s->sessions;
    s->sessions = ss;
    if (session_expired(ss, (int64_t)time(NULL))) { /* while the server was down: gone unread */
        fprintf(stderr, "potserve: session %s expired\n", id);
        return session_remove(s, ss);
    }
    if (ss->file && !ss->final && ss->status != SESSION_FAILED) { /* its upload never ended: no file was made */
        fprintf(stderr, "potserve: session %s: a file upload that never ended, removed\n", id);
        return session_remove(s, ss);
    }
    if (ss->status == SESSION_FAILED) return (void)fprintf(stderr, "potserve: session %s failed: %s\n", id, ss->fail_msg);
    ss->busy = 1;
    ss->restoring = RESTORE_QUEUED; /* read in turn (restore_next) */
    s->restores_pending++;
}

/* Restores run one at a time, each one task on the engine thread, so that
 * between two of them the engine serves the sessions already restored (and
 * new ones): a session answers as soon as its own restore ends, not the last
 * one's (session_lookup answers 503 loading for it until then). */
static void restore_next(server *s) {
    for (session *ss = s->sessions; ss; ss = ss->next)
        if (ss->restoring == RESTORE_RUNNING) return; /* one under way */
    for (session *ss = s->sessions; ss; ss = ss->next) {
        if (ss->restoring != RESTORE_QUEUED) continue;
        ss->used_ms = monotonic_ms();
        if (!s->draining && !s->stopping && !pots_make_room(s, ss->memory_bytes)) {
            /* the sessions read before it page out when they do not all fit (the limit holds from
               the start); when none can (all busy already), it is read when first asked (a page-in) */
            fprintf(stderr, "potserve: session %s stays paged out: no room for its pot now\n", ss->id);
            ss->restoring = RESTORE_NONE;
            ss->busy = 0;
            restore_done_one(s);
            continue;
        }
        if (!s->draining && !s->stopping) {
            s->pot_memory += ss->memory_bytes;
            ss->paged = 0;
            if (!submit_doc_job(s, ss, 1, restored, NULL)) {
                ss->restoring = RESTORE_RUNNING;
                return;
            }
            s->pot_memory -= ss->memory_bytes;
            ss->paged = 1;
        }
        ss->restoring = RESTORE_NONE; /* not read: stays busy with no pot until the server stops */
        ss->status = SESSION_FAILED;
        snprintf(ss->fail_msg, sizeof ss->fail_msg, "the server is stopping");
        restore_done_one(s);
    }
}

int sessions_restore(server *s, char *err, size_t errlen) {
    char *root = sessions_dir(s);
    if (!root) return snprintf(err, errlen, "out of memory"), -1;
    if (mkdir(root, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "data_dir: cannot create %s: %s", root, strerror(errno));
        free(root);
        return -1;
    }
    struct stat st;
    if (stat(root, &st) == 0 && !S_ISDIR(st.st_mode)) { /* (a file there: every session made would be a 500) */
        snprintf(err, errlen, "data_dir: %s is not a directory", root);
        free(root);
        return -1;
    }
    if (access(root, W_OK)) { /* (a read-only mount): every session's log would fail to open, and each upload */
        snprintf(err, errlen, "data_dir: %s is not writable: %s", root, strerror(errno));
        free(root);
        return -1;
    }
    free(root);
    store_clear_scratch(s->st);
    s->restores_pending = 1; /* held until the scan ends */
    store_list(s->st, restore_one, s);
    restore_done_one(s);
    restore_next(s);
    return 0;
}

/* Once a second. An expired session answers 404 at once (session_lookup); it
 * leaves as a DELETE would: questions still answering finish, an upload still
 * being read (busy) is let end first. */
void sessions_expire(server *s) {
    int64_t now = (int64_t)time(NULL);
    for (session *ss = s->sessions, *next; ss; ss = next) {
        next = ss->next;
        if (session_expired(ss, now) && !ss->busy) {
            fprintf(stderr, "potserve: session %s expired\n", ss->id);
            session_remove(s, ss);
        }
    }
}

/* ---- a shared store: takeover, handoff, leases ------------------------------------------------ */

/* A lease given back from the loop: Redis is asked from the thread pool, as
 * every other store question of the loop's (a stalled Redis waits up to 2 s a
 * command, and on the loop every request would wait with it). The lease's
 * token goes with it, so a late release never frees a lease taken since. */
typedef struct lease_release {
    uv_work_t work;
    server *srv;
    char id[48], token[STORE_TOKEN_MAX];
} lease_release;

static void lease_release_work(uv_work_t *w) {
    lease_release *l = w->data;
    store_lease_release(l->srv->st, l->id, l->token);
}

static void lease_release_done(uv_work_t *w, int status) {
    (void)status;
    free(w->data);
}

static void release_lease_later(server *s, const char *id, const char *token) {
    lease_release *l = calloc(1, sizeof *l);
    if (l) {
        l->srv = s, l->work.data = l;
        snprintf(l->id, sizeof l->id, "%s", id);
        snprintf(l->token, sizeof l->token, "%s", token);
        if (!uv_queue_work(s->loop, &l->work, lease_release_work, lease_release_done)) return;
        free(l);
    }
    store_lease_release(s->st, id, token); /* no memory or no pool: here, rather than never */
}

/* A session this replica is taking over from the shared store (its lease
 * asked, or its replay under way): every request for it hears the same. */
static void session_busy_restoring(request *r, const char *id, const char *param) {
    api_error e;
    api_fail(&e, 409, "session_busy", param,
             "session '%s' is being restored here (taken over from the shared store); retry", id);
    respond_retry(r, &e, 1);
}

/* A request for a session taken over with an empty log (a new one: its
 * replay takes moments) waits for it, suspended, rather than being answered
 * 409: the first upload after creating a session in a cluster (curl does not
 * retry a 409). Only routes whose handling starts at the lookup wait, to be
 * dispatched again as they came: the session's own, and the questions, which
 * take a session over before their body is handled (session_take_over_first). */
static int waits_for_takeover(const request *r, const session *ss) {
    if (r->form) return 1; /* POST /v1/files: the file's new session, taken by the replica reading it */
    static const char *const routes[] = {"/v1/sessions/{id}", "/v1/chat/completions", "/v1/completions",
                                         "/v1/responses", NULL}; /* (prefixes: the session's own routes too) */
    for (const char *const *p = routes; *p; p++)
        if (!strncmp(r->route, *p, strlen(*p))) return logged_bytes(ss) == 0;
    return 0;
}

/* r waits, suspended, for ss's takeover or page-in (pot_waiters_go). */
static void wait_for_pot(request *r, session *ss) {
    request_suspend(r); /* (a takeover's: suspended since it began) */
    request_ref(r);
    r->next_waiting = ss->pot_waiting;
    ss->pot_waiting = r;
}

/* The requests that waited for ss's takeover or page-in, dispatched again
 * (those whose client is still there); an upload's body is read from now on,
 * a file's form (POST /v1/files) goes on with ss as its session, a
 * generation (a background response's has no client) from its lookup. */
static void pot_waiters_go(server *s, session *ss, request *w) {
    while (w) {
        request *r = w;
        w = r->next_waiting;
        r->next_waiting = NULL;
        if (r->gen && (r->conn || r->bg)) {
            generation_session_ready(r, registered(s, ss) ? ss : NULL);
        } else if (r->conn && r->form) {
            files_session_created(r, registered(s, ss) && ss->status != SESSION_FAILED ? ss : NULL);
        } else if (r->conn) {
            request_dispatch(r);
            if (r->up && !r->status && !r->pending) request_wake(r);
        }
        request_unref(r);
    }
}

static void taken_over(server *s, doc_job *j) {
    session *ss = j->ss;
    request *waiting = ss->pot_waiting;
    ss->pot_waiting = NULL;
    ss->restoring = RESTORE_NONE;
    if (j->rc && !*j->feed_err && store_log_unreachable(ss->log) && !atomic_load(&s->abandon_replays)) {
        /* Redis did not answer the replay: the session is whole there, so it is
           let go (lease released) for the next request to take over again,
           not failed for good under a lease this replica keeps renewing */
        fprintf(stderr, "potserve: session %s: takeover stopped, the store did not answer (%.200s); released\n",
                ss->id, j->err);
        ss->busy = 0;
        release_lease_later(s, ss->id, ss->token);
        session_drop(s, ss);
        finish_doc_job(j);
    } else {
        restore_ended(j, "taken over");
    }
    pot_waiters_go(s, ss, waiting);
}

/* A takeover's questions to the shared store (the session's meta, its lease,
 * its log's index) are asked from the thread pool: a stalled Redis waits up to
 * 2 s a command, and on the loop every request would wait with it. */
typedef struct takeover {
    struct takeover *next; /* s->takeovers: one at a time per session */
    server *srv;
    const api_key *key;
    const char *param;
    char id[48];
    char err[256], token[STORE_TOKEN_MAX], owner[STORE_TOKEN_MAX];
    int unreachable; /* the meta could not be read */
    int load_unanswered; /* ... or the log's index (load_session) */
    int mine;        /* the session exists and belongs to the request's key */
    int expired;     /* ... but its time is up: 404, and removed when its lease was free */
    int got;         /* store_lease_acquire's answer */
    double asked;    /* monotonic_ms before the lease was asked for */
    session *ss;     /* loaded under the lease */
} takeover;

static void takeover_ask(void *arg) {
    takeover *t = arg;
    server *s = t->srv;
    int absent = 0;
    char *meta = store_meta_read(s->st, t->id, &absent, t->err, sizeof t->err);
    json_t *m = meta ? json_loads(meta, 0, NULL) : NULL;
    const char *key_owner = json_string_value(json_object_get(m, "owner"));
    t->mine = key_owner && !strcmp(key_owner, t->key->owner);
    t->unreachable = !meta && !absent;
    int64_t expires = meta_expires(m);
    t->expired = expires && (int64_t)time(NULL) > expires;
    json_decref(m);
    if (t->mine && t->expired) { /* its owner gone or stalled at its expiry: not read again, removed */
        if (store_lease_acquire(s->st, t->id, t->token, t->owner, t->err, sizeof t->err) > 0 &&
            !store_mark_deleted(s->st, t->id, t->token, t->err, sizeof t->err)) {
            store_remove(s->st, t->id, t->token);
            fprintf(stderr, "potserve: session %s expired\n", t->id);
        }
    } else if (t->mine) {
        t->asked = monotonic_ms();
        t->got = store_lease_acquire(s->st, t->id, t->token, t->owner, t->err, sizeof t->err);
        if (t->got > 0 && !(t->ss = load_session(s, t->id, meta, t->token, 0, &t->load_unanswered, t->err,
                                                   sizeof t->err)))
            store_lease_release(s->st, t->id, t->token);
    }
    free(meta);
}

/* On the loop: the session is registered and replayed on the engine thread
 * (r is answered 409 session_busy until that ends), or r is told why not. */
static void takeover_answer(request *r, void *arg) {
    takeover *t = arg;
    server *s = t->srv;
    for (takeover **p = &s->takeovers; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            break;
        }
    session *ss = t->ss;
    api_error e;
    if (!t->mine || t->expired) {
        if (t->unreachable && !t->expired) {
            api_fail(&e, 503, "store_unavailable", t->param, "%s", t->err);
            respond_retry(r, &e, 1);
        } else {
            if (t->param && !strcmp(t->param, "file_id")) /* (/v1/files/{id}: a file's session) */
                api_fail(&e, 404, "file_not_found", t->param, "no file 'file-%s'", t->id + 5);
            else
                api_fail(&e, 404, "session_not_found", t->param, "no session '%s'", t->id);
            respond_error(r, &e);
        }
    } else if (t->got < 0) {
        api_fail(&e, 503, "store_unavailable", t->param, "%s", t->err);
        respond_retry(r, &e, 1);
    } else if (t->got == 0) {
        api_fail(&e, 421, "session_elsewhere", t->param,
                 "session '%s' is held by replica %s; it hands it over when idle: retry", t->id, t->owner);
        respond_retry(r, &e, 1);
    } else if (s->stopping) { /* its leases are being released: this one too */
        if (ss) release_lease_later(s, t->id, t->token), free_session(ss);
        api_fail(&e, 503, "unavailable", t->param, "the server is shutting down");
        respond_retry(r, &e, 1);
    } else if (!ss && t->load_unanswered) {
        api_fail(&e, 503, "store_unavailable", t->param, "%s", t->err);
        respond_retry(r, &e, 1);
    } else if (!ss || (mkdir(ss->dir, 0700) && errno != EEXIST)) {
        if (ss) snprintf(t->err, sizeof t->err, "cannot create %s: %s", ss->dir, strerror(errno));
        if (ss) release_lease_later(s, t->id, t->token), free_session(ss);
        api_fail(&e, 500, "storage_error", t->param, "%s", t->err);
        respond_error(r, &e);
    } else if (!pots_make_room(s, ss->memory_bytes)) {
        free_session(ss);
        release_lease_later(s, t->id, t->token);
        api_fail(&e, 429, "insufficient_memory", t->param, "this replica has no room for session '%s'", t->id);
        respond_retry(r, &e, seconds_to_next_expiry(s, NULL));
    } else {
        s->pot_memory += ss->memory_bytes;
        ss->used_ms = monotonic_ms();
        ss->lease_until_ms = t->asked + (double)s->cfg.lease_ms;
        ss->next = s->sessions;
        s->sessions = ss;
        ss->busy = 1;
        ss->restoring = RESTORE_TAKEOVER;
        s->m.takeovers++;
        fprintf(stderr, "potserve: took session %s over (lease %s)\n", t->id, t->token);
        if (submit_doc_job(s, ss, 1, taken_over, NULL)) {
            ss->busy = 0;
            ss->restoring = RESTORE_NONE;
            ss->status = SESSION_FAILED;
            snprintf(ss->fail_msg, sizeof ss->fail_msg, "cannot restore: the engine is stopping");
            session_busy_restoring(r, t->id, t->param);
        } else if (waits_for_takeover(r, ss)) {
            wait_for_pot(r, ss);
        } else {
            session_busy_restoring(r, t->id, t->param);
        }
    }
    free(t);
}

/* Shared store: session id is not held here. Takes it over when its lease is
 * free, else answers 421 naming the replica that holds it (which is asked to
 * hand it over once idle); a takeover of it already under way here: 409. */
static void take_over(request *r, const char *id, const char *param) {
    server *s = r->srv;
    api_error e;
    for (takeover *t = s->takeovers; t; t = t->next)
        if (!strcmp(t->id, id)) return session_busy_restoring(r, id, param);
    takeover *t = calloc(1, sizeof *t);
    if (!t) {
        api_fail(&e, 503, "unavailable", param, "out of memory");
        return respond_retry(r, &e, 1);
    }
    *t = (takeover){.next = s->takeovers, .srv = s, .key = r->key, .param = param};
    snprintf(t->id, sizeof t->id, "%s", id);
    s->takeovers = t;
    request_work(r, WORK_POOL, takeover_ask, takeover_answer, t);
}

int session_take_over_first(request *r) {
    server *s = r->srv;
    if (!store_is_shared(s->st)) return 0;
    const char *sid = r->conn ? MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "X-Session-Id") : NULL;
    if (!sid) sid = json_string_value(json_object_get(r->json, "session"));
    if (!sid || !valid_session_id(sid) || session_find(s, sid, NULL)) return 0;
    take_over(r, sid, "session");
    return 1;
}

/* Shared store: whether this replica's lease on ss may have lapsed (no
 * renewal answered for the lease's length), so that another replica may
 * serve it now: it is dropped here, and not served from a stale pot. */
static int lease_lapsed(server *s, session *ss) {
    if (!store_is_shared(s->st) || monotonic_ms() < ss->lease_until_ms) return 0;
    fprintf(stderr, "potserve: no lease renewal of session %s answered for %lld ms: dropping it here\n", ss->id,
            (long long)s->cfg.lease_ms);
    session_drop(s, ss);
    return 1;
}

session *session_lookup(request *r, const char *id, const char *param) {
    server *s = r->srv;
    session *ss = valid_session_id(id) ? session_find(s, id, r->key) : NULL;
    int expired = ss && session_expired(ss, (int64_t)time(NULL)); /* gone, though still busy here */
    if (ss && lease_lapsed(s, ss)) ss = NULL;
    if (ss && !expired && ss->restoring == RESTORE_TAKEOVER) {
        session_busy_restoring(r, id, param);
        return NULL;
    }
    if (ss && !expired && ss->restoring && ss->restoring != RESTORE_PAGE_IN) {
        api_error e;
        api_fail(&e, 503, "loading", param, "session '%s' is still being read again after the server's start", id);
        respond_retry(r, &e, 2);
        return NULL;
    }
    if (ss && !expired) {
        ss->used_ms = monotonic_ms();
        return ss;
    }
    if (store_is_shared(s->st) && !expired && valid_session_id(id) && !session_find(s, id, NULL)) {
        take_over(r, id, param);
        return NULL;
    }
    api_error e;
    api_fail(&e, 404, "session_not_found", param, "no session '%s'", id);
    respond_error(r, &e);
    return NULL;
}

/* One round of renewals, sent from the thread pool: a Redis that stalls
 * (each command waits up to 2 s) must not stall the loop and every request
 * with it. The sessions are held (refs) until the answers are read. */
typedef struct renew_job {
    uv_work_t work;
    server *srv;
    size_t n;
    session **list;
    const char **ids, **tokens;
    int *out;
    int ping;     /* without sessions to renew: store_ping's answer */
    double asked; /* monotonic_ms before the renewals were sent */
} renew_job;

static void renew_job_free(renew_job *j) {
    for (size_t i = 0; i < j->n; i++) j->list[i]->in_renewal = 0, session_unref(j->list[i]);
    free(j->list);
    free(j->ids);
    free(j->tokens);
    free(j->out);
    free(j);
}

static void renew_work(uv_work_t *w) {
    renew_job *j = w->data;
    if (j->n) store_lease_renew(j->srv->st, j->ids, j->tokens, j->n, j->out);
    else j->ping = store_ping(j->srv->st);
}

static int registered(const server *s, const session *ss) {
    for (const session *p = s->sessions; p; p = p->next)
        if (p == ss) return 1;
    return 0;
}

static void renew_done(uv_work_t *w, int status) {
    (void)status;
    renew_job *j = w->data;
    server *s = j->srv;
    s->renewing = 0;
    int answered = !j->n && j->ping == 0;
    for (size_t i = 0; i < j->n; i++) answered |= j->out[i] >= 0;
    if (answered == s->store_silent) /* said once per outage, and once when it ends */
        fprintf(stderr, answered ? "potserve: the store answers lease renewals again\n"
                                 : "potserve: the store does not answer lease renewals (or PING); sessions whose "
                                   "lease lapses meanwhile are dropped here\n");
    s->store_silent = !answered;
    for (size_t i = 0; i < j->n; i++) {
        session *ss = j->list[i];
        if (!registered(s, ss)) continue; /* dropped or deleted while the renewals were out */
        if (j->out[i] > 0) ss->lease_until_ms = j->asked + (double)s->cfg.lease_ms;
        if (j->out[i] < 0) {
            lease_lapsed(s, ss);
        } else if (j->out[i] == 0) { /* an upload still open here is refused at its commit */
            fprintf(stderr, "potserve: lost the lease of session %s: dropping it here\n", ss->id);
            session_drop(s, ss);
        } else if (j->out[i] == 2 && !ss->busy && !ss->disk_busy && !ss->gens && !ss->rebuilding &&
                   !ss->snap_saving && !ss->acked_ingests) {
            fprintf(stderr, "potserve: handing session %s over on request\n", ss->id);
            release_lease_later(s, ss->id, ss->token);
            s->m.handoffs++;
            session_drop(s, ss);
        }
    }
    renew_job_free(j);
}

void sessions_renew_leases(server *s) {
    size_t n = 0;
    for (session *ss = s->sessions; ss; ss = ss->next) n++;
    if (s->renewing) return; /* one round out at a time: a stalled Redis answers none */
    /* (no session: a PING, so that /health knows whether the store answers) */
    renew_job *j = calloc(1, sizeof *j);
    size_t m = n ? n : 1;
    if (!j || !(j->list = malloc(m * sizeof *j->list)) || !(j->ids = malloc(m * sizeof *j->ids)) ||
        !(j->tokens = malloc(m * sizeof *j->tokens)) || !(j->out = malloc(m * sizeof *j->out))) {
        if (j) renew_job_free(j);
        return;
    }
    j->srv = s;
    for (session *ss = s->sessions; ss; ss = ss->next, j->n++) {
        session_ref(ss);
        ss->in_renewal = 1;
        j->list[j->n] = ss, j->ids[j->n] = ss->id, j->tokens[j->n] = ss->token;
    }
    j->asked = monotonic_ms();
    j->work.data = j;
    if (uv_queue_work(s->loop, &j->work, renew_work, renew_done)) return renew_job_free(j);
    s->renewing = 1;
}

void sessions_release_leases(server *s) {
    if (!store_is_shared(s->st)) return;
    for (session *ss = s->sessions; ss; ss = ss->next) store_lease_release(s->st, ss->id, ss->token);
}

int sessions_ingesting(const server *s) {
    for (const session *ss = s->sessions; ss; ss = ss->next)
        if (ss->acked_ingests) return 1;
    return 0;
}

void sessions_stop_ingests(server *s) {
    for (session *ss = s->sessions; ss; ss = ss->next)
        if (ss->acked_ingests && ss->doc) {
            fprintf(stderr, "potserve: session %s: acknowledged chunks still being read are left to the next "
                            "start (they are in its log)\n", ss->id);
            engine_doc_cancel(ss->doc);
        }
}

/* ---- paging: at pot_memory_limit, idle pots go to their snapshots and are read back when asked ---- */

int session_reading(const session *ss) {
    if (ss->restoring == RESTORE_PAGE_IN) return 0; /* (busy while its pot is read back, which was whole) */
    return ss->busy || ss->rebuilding || ss->acked_ingests || ss->restoring;
}

/* Nothing reads, writes or waits for ss's pot: the registry's is its only reference
 * (besides a lease renewal's, which reads only its id and lease). */
static int pageable(const session *ss) {
    return !ss->paged && ss->doc && ss->log && ss->refs == 1 + ss->in_renewal && ss->status != SESSION_FAILED &&
           !ss->deleted && !ss->busy && !ss->disk_busy && !ss->rebuilding && !ss->snap_saving && !ss->acked_ingests &&
           !ss->gens && ss->restoring == RESTORE_NONE && !ss->restore_doc && !ss->reread_open && !ss->recall_read &&
           !ss->pot_waiting;
}

/* Whether a page-in of ss would read only its snapshot (not the log past it). */
static int snapshot_current(const session *ss) { return store_log_committed_size(ss->log) <= ss->snap_offset; }

/* ss's pot goes: saved first when its log has grown past its snapshot (the
 * save is ordered before the close on the engine thread). Its memory counts
 * as free at once: the close runs when the engine's step under way ends. */
static void page_out(server *s, session *ss) {
    if (!snapshot_current(ss)) session_snapshot(s, ss);
    engine_doc *doc = ss->doc;
    ss->doc = NULL;
    ss->paged = 1;
    s->pot_memory -= ss->memory_bytes;
    s->m.page_outs++;
    if (srv_task(s, doc, close_bare_doc_task, doc)) engine_doc_close(doc); /* the engine has stopped */
    fprintf(stderr, "potserve: session %s paged out (its pot of %zu MiB to its snapshot%s), for room\n", ss->id,
            ss->memory_bytes >> 20, ss->snap_saving ? ", saved first" : "");
}

int pots_make_room(server *s, size_t bytes) {
    size_t limit = (size_t)s->cfg.pot_memory_limit;
    /* first uploads' copies of their pots from before their chunks (a failure re-reads the log
       instead: rare), then idle pots (each read back when next asked) */
    for (session *ss = s->sessions; ss && s->pot_memory + bytes > limit; ss = ss->next)
        if (ss->keeping) drop_kept(ss->keeping);
    while (s->cfg.page_out_idle && s->pot_memory + bytes > limit) {
        session *pick = NULL; /* those whose snapshot is current first, then the least recently used */
        for (session *ss = s->sessions; ss; ss = ss->next) {
            if (!pageable(ss)) continue;
            int cur = snapshot_current(ss), pick_cur = pick && snapshot_current(pick);
            if (!pick || cur > pick_cur || (cur == pick_cur && ss->used_ms < pick->used_ms)) pick = ss;
        }
        if (!pick) break;
        page_out(s, pick);
    }
    return s->pot_memory + bytes <= limit;
}

/* The requests that waited for a page-in that failed hear why. */
static void pot_waiters_fail(request *w, const api_error *e) {
    while (w) {
        request *r = w;
        w = r->next_waiting;
        r->next_waiting = NULL;
        if (r->conn || r->bg) respond_retry(r, e, 1);
        request_unref(r);
    }
}

static void paged_in(server *s, doc_job *j) {
    session *ss = j->ss;
    request *waiting = ss->pot_waiting;
    ss->pot_waiting = NULL;
    ss->restoring = RESTORE_NONE;
    if (j->rc && !atomic_load(&s->abandon_replays)) {
        /* not read back (the store did not answer, a read failed): the session is whole in its
           log and snapshot, so it stays paged out (not failed) and the next request tries again */
        api_error e;
        int unreachable = store_log_unreachable(ss->log);
        api_fail(&e, unreachable ? 503 : 500, unreachable ? "store_unavailable" : "storage_error", "session",
                 "session '%s' could not be read back from its snapshot and log: %.200s", ss->id, replay_error(j));
        fprintf(stderr, "potserve: session %s: page-in failed, it stays paged out: %s\n", ss->id, replay_error(j));
        engine_doc *doc = ss->doc; /* what the replay read before it failed */
        ss->doc = NULL;
        if (doc && srv_task(s, doc, close_bare_doc_task, doc)) engine_doc_close(doc);
        ss->busy = 0;
        ss->paged = 1;
        s->pot_memory -= ss->memory_bytes;
        s->m.page_in_failures++;
        finish_doc_job(j);
        return pot_waiters_fail(waiting, &e);
    }
    s->m.page_ins++;
    s->m.page_in_ms += monotonic_ms() - ss->page_in_began_ms;
    restore_ended(j, "paged in");
    pot_waiters_go(s, ss, waiting);
}

/* The page-in's read of the snapshot (and the log past it) on the engine thread. */
static void page_in_submit(server *s, session *ss) {
    ss->page_in_after_save = 0;
    if (!submit_doc_job(s, ss, 1, paged_in, NULL)) return;
    request *waiting = ss->pot_waiting; /* the engine is stopping */
    ss->pot_waiting = NULL;
    ss->restoring = RESTORE_NONE;
    ss->busy = 0;
    ss->status = SESSION_FAILED;
    snprintf(ss->fail_msg, sizeof ss->fail_msg, "the server is stopping");
    pot_waiters_go(s, ss, waiting);
}

int session_pot_wait(request *r, session *ss, int need_pot) {
    server *s = r->srv;
    if (ss->restoring == RESTORE_PAGE_IN) return wait_for_pot(r, ss), 1;
    if (!ss->paged || !need_pot || ss->status == SESSION_FAILED) return 0;
    if (ss->busy) { /* a deletion under way: its pot is not read back for it */
        api_error e;
        api_fail(&e, 409, "session_busy", NULL, "session '%s' is being deleted", ss->id);
        respond_error(r, &e);
        return 1;
    }
    if (!pots_make_room(s, ss->memory_bytes)) {
        api_error e;
        api_fail(&e, 429, "insufficient_memory", NULL,
                 "session '%s' must be read back from its snapshot, and its pot of %zu bytes does not fit now: "
                 "%zu of pot_memory_limit %lld are in use by pots being read or written", ss->id,
                 ss->memory_bytes, s->pot_memory, (long long)s->cfg.pot_memory_limit);
        respond_retry(r, &e, 1);
        return 1;
    }
    s->pot_memory += ss->memory_bytes;
    ss->paged = 0;
    ss->busy = 1;
    ss->restoring = RESTORE_PAGE_IN;
    ss->page_in_began_ms = monotonic_ms();
    wait_for_pot(r, ss);
    if (ss->snap_saving) ss->page_in_after_save = 1; /* snapshot_saved submits it */
    else page_in_submit(s, ss);
    return 1;
}
