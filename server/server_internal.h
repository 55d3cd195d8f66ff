/* What the HTTP server's files share (private to server/): the server, a
 * request, a session, and the loop-thread functions between them.
 *
 * Threads: everything here lives on the libuv loop thread except where a
 * comment says otherwise. The engine thread talks to the loop only through
 * srv_post (a locked event queue + uv_async_t); disk work runs on libuv's
 * thread pool, one operation per session at a time. */
#ifndef POTSERVE_SERVER_INTERNAL_H
#define POTSERVE_SERVER_INTERNAL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "api/api.h"
#include "config/config.h"
#include "engine/engine.h"
#include "server/store.h"

typedef struct server server;
typedef struct request request;
typedef struct session session;

/* ---- API keys (auth.c) ------------------------------------------------------------- */
typedef struct api_key {
    char *key;
    char owner[17]; /* hex tag of the key's SHA-256: sessions on disk name their owner by it */
    char name[64];
    /* rate limit bucket */
    double tokens, last_ms;
} api_key;

int auth_load(server *s, char *err, size_t errlen);
/* The key the request's Authorization header names (constant-time compare),
 * or NULL. With no keys configured every request gets the anonymous key. */
api_key *auth_check(server *s, struct MHD_Connection *c);
/* 0 when the key may make another request now, else the seconds to wait. */
int auth_rate_limit(server *s, api_key *k);
void sha256_hex(const void *data, size_t n, char out[65]);

/* A pot of `bytes` must wait for room in pot_memory_limit (0), or can never
 * have it, being larger than the limit less what is held for good: then e is
 * a 422 naming param (-1), not a 429 a client would retry for ever. */
int pot_memory_admit(server *s, size_t bytes, const char *param, const char *what, api_error *e);

/* ---- metrics (metrics.c) ----------------------------------------------------------- */
enum { METRIC_ROUTES = 32 }; /* router.c classify()'s 16 routes and "other", with room */
typedef struct metrics {
    const char *route_names[METRIC_ROUTES];
    int64_t requests[METRIC_ROUTES][6]; /* by status class: 1xx..5xx, index status/100 */
    int64_t tokens_ingested, tokens_prompted, tokens_generated, bytes_uploaded;
    int64_t tokens_reread; /* read again from sessions' logs for questions (reread.c) */
    int64_t tokens_embedded; /* read for /v1/embeddings (embeddings.c) */
    int64_t compressions;
    double ingest_ms, decode_ms, compress_ms;
    int64_t constrained_tokens, masked_steps; /* response_format / forced tool calls */
    int64_t fenced_writes, takeovers, handoffs; /* shared store: refused late writes, sessions taken, given */
    int64_t page_outs, page_ins; /* idle pots paged out for room, and read back (sessions.c) */
    int64_t page_in_failures;    /* page-ins that could not read the pot back (it stays paged out) */
    double page_in_ms;
} metrics;
int metrics_route(metrics *m, const char *route);
char *metrics_render(server *s);

/* ---- requests (router.c) ----------------------------------------------------------- */
typedef struct piece piece;
typedef struct upload upload;
typedef struct file_form file_form;
typedef struct generation generation;
typedef struct background background;
typedef struct event_log event_log;
typedef struct waiting_stream waiting_stream;

struct request {
    server *srv;
    struct MHD_Connection *conn; /* NULL once MHD has finished with it */
    int refs;                    /* MHD + outstanding engine/disk work */
    char method[8];
    char *url;
    const char *route;           /* for logs and metrics */
    double t0;
    int status;
    size_t bytes_out;
    api_key *key;
    char session_id[48];
    int64_t tokens;
    /* JSON body: its text as it arrives, then parsed once before dispatch (off the loop
       when large: router.c) and the text freed; body_len stays */
    char *body;
    size_t body_len, body_cap;
    int body_too_large;
    int takes_json;              /* its route's body is JSON (parsed before dispatch) */
    int body_blank;              /* empty or white space only: json is NULL */
    json_t *json;                /* the parsed body (request_json); NULL when blank or not an object */
    api_error json_err;          /* why json is NULL */
    int receiving_body;          /* its body is still to come (srv_sweep_connections: a client gone meanwhile) */
    int close_conn;              /* its framing is not trusted: close after the answer */
    /* a response prepared while suspended, or at MHD's first call for a request without a
       body (one queued there, headers only, makes libmicrohttpd 0.9.75 close the connection
       after it), queued on the next access call */
    int first_call;
    /* suspended in MHD's headers call (an upload waiting for a takeover): once resumed without
       an answer, MHD calls with no data again before the body, which is not the body's end */
    int headers_again;
    struct MHD_Response *pending;
    int pending_status;
    int suspended;
    double suspended_at_ms, suspended_ms; /* (monotonic_ms) since when, and how long in all before */
    int stored_redone;           /* its stored_update found the entry changed and ran again (stored.c) */
    upload *up;
    file_form *form;             /* POST /v1/files: its form, read as it arrives (files.c) */
    generation *gen;
    background *bg;              /* a background response's own request: no connection (background.c) */
    event_log *follows;          /* a stream that reads a background response's events (background.c) */
    size_t follows_at;           /* how far it has read them */
    /* streamed response bytes (SSE), read by the content reader */
    char *out;
    size_t out_len, out_pos, out_cap;
    int out_done;
    double last_write_ms;
    request *next_live; /* server's list of live requests */
    request *next_waiting; /* a session's takeover_waiting */
};

void request_ref(request *r);
void request_unref(request *r);
/* Parses r's body (a JSON route's before dispatch, a JSON chunk's once it has
 * come: off the loop when large, r waiting suspended), frees its text, then
 * calls then(r) on the loop unless the client has left. */
void request_parse_json(request *r, void (*then)(request *r));
/* Routes r again, as when its headers (and a JSON body) came: for a request
 * that waited, suspended, for what its route needs. */
void request_dispatch(request *r);
/* r's parsed JSON body (a new reference), or NULL with e saying why (blank,
 * not JSON, not an object). */
json_t *request_json(request *r, api_error *e);
/* Queues (or, while suspended, prepares) resp; takes it. */
void respond_raw(request *r, int status, struct MHD_Response *resp);
/* Queues (or, while suspended, prepares) a JSON response; takes body. */
void respond_json(request *r, int status, json_t *body);
/* body as every JSON response sends it (compact, then a newline; NULL when out
 * of memory): made off the loop where it is large. Takes body. */
char *json_text(json_t *body, size_t *n);
/* json_text with json_dumps's flags (JSON_COMPACT and more). */
char *json_text_flags(json_t *body, size_t flags, size_t *n);
/* respond_json for json_text's text (takes it; NULL: out of memory). */
void respond_json_text(request *r, int status, char *text, size_t n);
void respond_error(request *r, const api_error *e);
/* respond_error with a Retry-After header (seconds, at least 1). */
void respond_retry(request *r, const api_error *e, int seconds);
/* GET, or HEAD (the same answer; libmicrohttpd leaves the body out). */
int request_reads(const request *r);
/* 405 for r's method, with Allow listing the methods the route takes (e.g. "GET, POST"). */
void respond_method_not_allowed(request *r, const char *allow);
/* The id in a route's rest ("/{id}" or "/{id}/more", cut to cap - 1 bytes)
 * into id; returns where "/more" begins, or NULL. */
const char *route_id(const char *rest, char *id, size_t cap);
/* Whether r's client has left (a suspended request's socket peeked at; a
 * background response's request never has one to leave). */
int request_client_gone(request *r);
/* The 499 of work stopped because its client left (a half-close counts as
 * leaving): answering it resumes the connection, so MHD finds it closed. */
void client_closed_error(api_error *e, const char *what);
/* Resumes a suspended request so MHD calls the access handler again. */
void request_wake(request *r);
/* Suspends the connection while async work runs (call in the access handler). */
void request_suspend(request *r);
/* Work for a request that must not hold the loop: fn(arg) runs on libuv's
 * thread pool (it must touch no loop state) while r waits, suspended and
 * held, then done(r, arg) on the loop. WORK_POOL: a call that waits (Redis,
 * the disk); WORK_HEAVY: seconds of CPU (parsing or tokenizing megabytes),
 * at most server.heavy_max of them at once, the others waiting in order, so
 * that the pool keeps threads for the calls that must not wait behind them
 * (lease renewals, run marks, disk writes); WORK_HERE: inline. */
typedef enum work_where { WORK_HERE, WORK_POOL, WORK_HEAVY } work_where;
void request_work(request *r, work_where where, void (*fn)(void *arg), void (*done)(request *r, void *arg), void *arg);
/* request_work on r's input: WORK_HEAVY for a body over OFF_LOOP_BYTES, else here. */
enum { OFF_LOOP_BYTES = 64 * 1024 };
void request_work_input(request *r, void (*fn)(void *arg), void (*done)(request *r, void *arg), void *arg);
/* Half of libuv's pool (UV_THREADPOOL_SIZE, 4 by default), at least 1. */
int srv_heavy_max(void);
/* Appends to the streamed response and wakes the reader (a background
 * response's request: to its event log, for the streams that follow it). */
void stream_write(request *r, const char *data, size_t n);
void stream_end(request *r);
/* Starts an SSE response (queued now; a background response's request: its
 * event log, 0 when it has one). */
int stream_start(request *r);
/* ---- CORS (cors.c) ----------------------------------------------------------------- */
int cors_enabled(const server *s);
/* Adds Access-Control-Allow-Origin (and Vary) when the request's Origin is allowed. */
void cors_add_headers(request *r, struct MHD_Response *resp);
/* Answers an OPTIONS preflight when CORS is on; 1 when it did. */
int cors_preflight(request *r);
/* Whether a server without API keys refuses r as another site's (DNS
 * rebinding, a cross-site request): 0, or -1 + e (403). */
int cors_foreign_site(request *r, api_error *e);

/* ---- sessions (sessions.c) --------------------------------------------------------- */
enum session_status { SESSION_READY, SESSION_INGESTING, SESSION_FAILED };

struct session {
    server *srv;
    char id[48];
    char owner[17];
    char *dir;
    api_session_settings settings;
    int64_t created, expires;
    engine_doc *doc;          /* owned by the engine thread once opened */
    store_log *log;           /* used by one disk operation at a time */
    char token[STORE_TOKEN_MAX]; /* the lease this replica holds on it (shared store) */
    double lease_until_ms;    /* (monotonic_ms) when the lease lapses unless renewed: until the
                                 store says otherwise, no other replica can hold it before */
    int disk_busy;
    enum session_status status;
    char fail_msg[256];
    int busy;                 /* an upload is in progress */
    /* read again at start (503 loading until done), taken over from the shared store (409
       session_busy), or paged in (its requests wait for it: session_pot_wait) */
    enum { RESTORE_NONE, RESTORE_QUEUED, RESTORE_RUNNING, RESTORE_TAKEOVER, RESTORE_PAGE_IN } restoring;
    request *pot_waiting;        /* requests dispatched again once its takeover or page-in ends (sessions.c) */
    /* pieces of a chunk not yet acknowledged are in the pot: a question waits (session_chunk_wait)
       for its acknowledgement, or for the pot put back when it fails, in chunk_waiting */
    int chunk_in_pot;
    request *chunk_waiting;
    /* the upload holding a copy of the pot from before its chunk (a failure puts it back rather
       than re-reading the log): only a shortcut, dropped by pots_make_room when memory is short */
    struct upload *keeping;
    /* its pot was paged out to make room (pots_make_room): no doc, memory_bytes not counted in
       pot_memory; its snapshot and log hold it, and session_pot_wait reads it back */
    int paged;
    int in_renewal;              /* a lease renewal round holds a reference (not a reader of its pot) */
    int page_in_after_save;      /* a page-in waits for the snapshot its page-out began */
    double page_in_began_ms;     /* (monotonic_ms) for the page-ins' time in /metrics */
    double used_ms;              /* (monotonic_ms) last looked up: the least recently used pages out first */
    int rebuilding;
    int deleted;
    int refs;
    int gens;                 /* generations reading the doc */
    int acked_ingests;        /* acknowledged (wait=false) chunks still being ingested */
    int64_t bytes_acked;      /* document bytes of the acknowledged chunks (bytes_received) */
    size_t memory_bytes;
    engine_doc_stats stats;   /* mirror, updated from engine events */
    uint64_t last_seq;
    int final;
    uint64_t snap_offset;     /* log bytes the snapshot on disk covers (0: none) */
    double snap_ingest_ms;    /* the document's engine reading time (stats.ingest_ms) the snapshot holds */
    engine_doc *restore_doc;  /* a failed chunk's pre-chunk copy, for the rebuild to put back
                                 (instead of re-reading the log); memory_bytes counted */
    int snap_saving;
    struct reread_pass *reread_open; /* the re-read pass new questions join (reread.c) */
    struct recall_read *recall_read; /* the log read new recalls join (recall.c) */
    json_t *file;             /* a file's (POST /v1/files) {"filename", "purpose"}, as in its meta; NULL: none */
    session *next;
};

int sessions_restore(server *s, char *err, size_t errlen);
void sessions_free_all(server *s);
void route_sessions(request *r, const char *rest, const char *upload_data,
                    size_t *upload_data_size);
session *session_find(server *s, const char *id, const api_key *k);
/* The session id names for r's key, held here (a shared store: taken over
 * when free); NULL once r has been answered (404 with param, 421, 409, 503). */
session *session_lookup(request *r, const char *id, const char *param);
/* A question (chat, completions, responses) naming a session (X-Session-Id or
 * the body's "session") that a shared store holds and this replica does not:
 * taken over before the body is handled, so that, a new session's, r waits
 * for it and is dispatched again (sessions.c). 1 when r waits or was answered. */
int session_take_over_first(request *r);
/* Shared store: renews the leases of the sessions held here; drops those lost,
 * hands idle ones over to a replica that asked for them. */
void sessions_renew_leases(server *s);
/* At exit, after the last snapshots: gives every lease up, so that other
 * replicas need not wait for them to run out. */
void sessions_release_leases(server *s);
json_t *session_json(server *s, const session *ss);
/* The expires_at second of a session from its store meta (created +
 * settings.ttl_seconds), 0 when it has no expiry. */
int64_t meta_expires(const json_t *meta);
void session_ref(session *ss);
/* Whether r, for ss, waits for ss's pot (1: it was suspended, or answered):
 * while a page-in is under way, and, when need_pot, for a paged-out pot,
 * whose page-in it starts. Waiting requests are dispatched again when it
 * ends (a generation goes on: generation_session_ready); when the page-in
 * fails they are answered its error, and ss stays paged out. */
int session_pot_wait(request *r, session *ss, int need_pot);
/* 1 when r (a question) waits, suspended, for the chunk whose unacknowledged
 * text is in ss's pot: an answer sees the acknowledged text, not part of a
 * chunk that may yet fail; generation_session_ready goes on once it ends.
 * generations_sweep ends a wait whose client left or whose request_timeout
 * passed (an upload may trickle for as long as its connection lives). */
int session_chunk_wait(request *r, session *ss);
/* generations_sweep's part: the questions waiting for a chunk (session_chunk_wait)
 * that lost is true of (it answers them) leave the wait. */
void sessions_sweep_chunk_waits(server *s, int (*lost)(request *r));
/* Pages idle sessions' pots out to their snapshots, the least recently used
 * first, until `bytes` more fit in pot_memory_limit (page_out_idle); whether
 * they fit now. Only pots nothing reads, writes or waits for go. */
int pots_make_room(server *s, size_t bytes);
/* Whether ss is still reading its document (an upload, a rebuild, a restore;
 * not a page-in): answers from it now would come from a part of it. */
int session_reading(const session *ss);
/* Whether acknowledged (?wait=false) chunks are still being read into a pot. */
int sessions_ingesting(const server *s);
/* A stop past its grace: those ingests end now (their chunks are in the logs,
 * which the next start reads); their pots, behind their logs, get no snapshot. */
void sessions_stop_ingests(server *s);
/* Why ss's log cannot be read now (an upload, a restore, another read or
 * write under way), or NULL when it can. */
const char *session_log_busy(const session *ss);
void session_unref(session *ss);
/* GET /v1/sessions/{id}/retention and GET /v1/sessions/{id}/text (session_read.c). */
void session_retention(request *r, session *ss);
void session_text(request *r, session *ss);
/* Registers and opens a new session for r's key with these settings (taken
 * over) and, for a file, its {"filename", "purpose"} (taken over): answers 201
 * with the session, or, for a file, calls files_session_created once it is
 * open; errors are answered here. */
void session_create(request *r, api_session_settings *settings, json_t *file);
/* DELETE of ss (answered as a session's deletion, or as_file as a file's). */
void session_delete(request *r, session *ss, int as_file);
/* An upload of ss's next chunk whose bytes come from elsewhere than r's raw
 * body (a form's file): upload_open (the document's last chunk, acknowledged
 * once durable), upload_take for its bytes (1: stop reading until the engine
 * catches up, as a raw upload is held), upload_abort with why (nothing of the
 * chunk is kept), upload_end when r's body has ended (then it answers, with
 * the failure if there was one). r->up owns it. */
upload *upload_open(request *r, session *ss);
int upload_take(upload *u, const char *data, size_t n);
void upload_end(upload *u);
void upload_abort(upload *u, const api_error *e);
/* Upload data (called with pieces, then with size 0 at the end). */
void upload_receive(request *r, const char *data, size_t *size);
void upload_free(upload *u);
/* The client left before the upload ended: the chunk is dropped. */
void upload_abandon(upload *u);
void sessions_expire(server *s);
/* Saves ss's pot (and the rest of its document state) when its log has grown
 * past the last snapshot; skipped while an upload is open. */
void session_snapshot(server *s, session *ss);
/* A shared store: reads r's key's sessions (or only session id) from the
 * store on the pool, then done(r, list, n, user) on the loop (a store that
 * does not answer: 503, and user is freed). */
typedef void (*owned_done_fn)(request *r, store_owned_session *list, size_t n, void *user);
void sessions_read_owned(request *r, const char *id, owned_done_fn done, void *user);
/* Whether some session's snapshot is still being written. */
int sessions_saving(const server *s);
/* A generation over ss ended (a pending rebuild may start). */
void session_generation_done(session *ss);

/* ---- files (files.c): OpenAI's Files API over sessions ---------------------------------- */
/* /v1/files and /v1/files/{id}[/content]; rest is what follows /v1/files. */
void route_files(request *r, const char *rest);
/* POST /v1/files's body (pieces, then size 0 at the end). */
void files_receive(request *r, const char *data, size_t *size);
void files_form_free(file_form *f);
/* The file's session is open: its upload begins. */
void files_session_created(request *r, session *ss);
/* What a file's upload answers: the file object instead of the session's. */
void files_upload_answer(session *ss, int *status, json_t **body);
/* "file-" + the session id's own part. */
void file_id_of(const char *session_id, char *out, size_t cap);
/* A chat body's file parts ({"type": "file", "file": {"file_id" | "file_data"}}):
 * file_data becomes a text part, a file_id the body's session. 0, or -1 + e
 * (with *retry_after > 0 when retrying later helps). */
int files_in_messages(request *r, json_t *body, api_error *e, int *retry_after);

/* ---- the web page (web.c) ----------------------------------------------------------- */
/* 1 when path is one of the page's files. */
int web_is_page(const char *path);
/* GET of a page file (r->url must be one: web_is_page). */
void route_web(request *r);

/* ---- generation (completions.c) ------------------------------------------------------- */
void route_generate(request *r, int chat);
/* A generation that waited for ss goes on: for its pot (session_pot_wait), or
 * for the takeover its own lookup began (then ss is NULL when the takeover
 * did not register it here). */
void generation_session_ready(request *r, session *ss);
/* /v1/responses once responses.c has turned r->body into a chat body;
 * takes `responses` (the original body, echoed in the answer) and `history`
 * (what is stored with the answer, see responses_keep; NULL: not stored). */
void route_generate_responses(request *r, json_t *responses, json_t *history);
/* POST /v1/responses/input_tokens: as route_generate_responses, but answers the
 * prompt's token count ({"object": "response.input_tokens", "input_tokens"}). */
void route_count_responses(request *r, json_t *responses, json_t *history);

/* ---- embeddings (embeddings.c) --------------------------------------------------------- */
void route_embeddings(request *r);

/* ---- stored responses and conversations (stored.c) ---------------------------------- */
/* Whether id can name a stored object (a store key is made of it). */
int stored_id_ok(const char *id);
/* The entry of id this request's key stored (kind "response" or "conversation";
 * NULL: either), borrowed; NULL when none (fetched first with a shared store). */
json_t *stored_get(request *r, const char *id, const char *kind);
/* The item item_id of an entry this key stored (an item, or a response's output), borrowed, or NULL. */
json_t *stored_item(request *r, const char *item_id);
/* A new entry (takes object, items and messages; messages may be NULL), its size measured. */
json_t *stored_new(request *r, const char *kind, json_t *object, json_t *items, json_t *messages);
/* Whether entry fits in response_store_bytes at all. */
int stored_fits(const server *s, const json_t *entry);
/* The entry id becomes the most recently used (in memory). */
void stored_touch(server *s, const char *id);
void stored_drop(server *s, const char *id);
void stored_free(server *s);
/* Runs then(r) once the entries named by ids (item ids where by_item; the first
 * made the most recently used with touch_first) are in s->stored: fetched from
 * a shared store (a 503 if it does not answer), at once otherwise. Takes ids
 * and by_item. */
void stored_fetch(request *r, char **ids, int *by_item, size_t n, int touch_first, void (*then)(request *r));
void stored_fetch_one(request *r, const char *id, void (*then)(request *r));
/* Stores entry under id (takes it), then then(r, arg, rc): rc 0 kept, -1 not
 * (too large, or the store did not take it). suspend: r is not answered yet. */
void stored_write(request *r, const char *id, json_t *entry, int suspend, void (*then)(request *r, void *arg, int rc),
                  void *arg);
/* stored_write for an entry changed from what this request fetched: with a
 * shared store it is written only while the store still holds what was read;
 * else rc 1 (another request changed it meanwhile: fetch again and redo). */
void stored_update(request *r, const char *id, json_t *entry, int suspend, void (*then)(request *r, void *arg, int rc),
                   void *arg);
/* Adds items (borrowed) to entry id's, then then(r, arg, rc) as stored_write. */
void stored_append(request *r, const char *id, json_t *items, int suspend, void (*then)(request *r, void *arg, int rc),
                   void *arg);
/* Forgets entry id and answers {"id", "object": object, "deleted": true} (503 when the store did not answer). */
void stored_delete_answer(request *r, const char *id, const char *object);
/* Answers a page of items as OpenAI lists them: ?order desc (the last first) or asc, ?limit 1-100 (20),
 * ?after an item's id; {"object": "list", "data", "first_id", "last_id", "has_more"}. */
void stored_list_page(request *r, json_t *items);

/* ---- background responses (background.c) --------------------------------------------- */
/* POST /v1/responses with "background": true, its body checked and r->body its
 * chat body: stores the response as "queued" and answers that (takes in and
 * history), then generates it on a request of its own with no connection. */
void background_start(request *r, json_t *in, json_t *history);
/* Where a background request's answer goes (respond_json and the like on a
 * request with bg): an error is stored as a "failed" (or "cancelled") response;
 * takes body (may be NULL). */
void background_answered(request *d, int status, json_t *body);
/* A background request's finished response entry (taken) stored in place of
 * its queued one, unless a cancel or a delete replaced that; then then(). */
void background_keep(request *d, json_t *entry, void (*then)(request *r, void *arg, int rc), void *arg);
/* The response id a background request generates (NULL: not one). */
const char *background_id(const request *r);
/* status, or "cancelled" for a background request cancelled while it ran. */
const char *background_final_status(const request *r, const char *status);
/* Its error on a response whose status background_final_status made failed
 * (stopped by a drain): the stream's last event and the stored object alike. */
void background_final_error(const request *r, json_t *response);
/* GET /v1/responses/{id}: answers entry's object (r's scratch, as fetched).
 * Running here: with its live status ("queued" while it waits for a turn,
 * "in_progress"). Unfinished in a shared store and no replica's run mark:
 * stored and answered as "failed" (when the entry changed meanwhile, it is
 * fetched again and again(r) answers). */
void background_poll(request *r, const char *id, json_t *entry, void (*again)(request *r));
/* With a shared store, each lease_ms/3: renews the run marks of the background
 * responses running here; one gone stops its generation. */
void background_renew(server *s);
/* At the end of a drain: every background response still running here is
 * stopped, to be stored as "failed" (not left queued in a shared store). */
void background_stop_all(server *s);
/* For /metrics: background responses generating here, streams waiting for an
 * answer with no events here, bytes of the ended ones' events kept. */
void background_gauges(const server *s, int *running, int *waiting, size_t *kept_log_bytes);
/* Whether a background response's request is still live here (running, or its
 * entry on its way to the store): a stopping server waits for it. */
int background_pending(const server *s);
/* POST /v1/responses/{id}/cancel. */
void background_cancel(request *r, const char *id);
/* Response id, cancelled or deleted while it runs here, stops now (its answer
 * ends as cancelled and is not stored). */
void background_stop_running(server *s, const char *id);
/* A background request's event log (its stream's bytes, for the requests that
 * follow it): stream_write, stream_end and stream_start of such a request. */
void background_log_write(request *d, const char *data, size_t n);
/* The logs kept after their end and the streams waiting, freed (the server's end). */
void background_logs_free(server *s);
void background_log_end(request *d);
int background_log_start(request *d);
/* A following stream's reader: up to max bytes more of its log into buf, 0
 * when it has read all so far (it then waits, suspended), -1 at its end. */
ssize_t background_follow_read(request *f, char *buf, size_t max);
/* At a following request's end: it leaves its log. */
void background_unfollow(request *f);
/* GET /v1/responses/{id}?stream=true[&starting_after=N]: the response's events
 * after N: from its log where this replica has it (a response made with
 * "stream": true, running here or ended here lately), else from a shared
 * store's copy of them, else replayed from the stored response (entry: r's
 * scratch, as fetched) once it has ended (the stream waits for that). */
void background_stream_get(request *r, const char *id, json_t *entry, int64_t starting_after);
void background_free(background *bg);

/* ---- /v1/conversations (conversations.c) --------------------------------------------- */
void route_conversations(request *r);
/* /v1/conversations/{id}[/items[/{item_id}]] (path: what follows /v1/conversations/). */
void route_conversation_id(request *r, const char *path);

/* ---- /v1/responses (responses.c) --------------------------------------------------- */
void route_responses(request *r);
/* GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items (path: what follows /v1/responses/). */
void route_response_id(request *r, const char *path);
/* Keeps a finished response with its history (borrowed: {"messages": the chat
 * messages before the answer, "items": the input items that made it, the
 * earlier responses' too}; NULL: not kept) for previous_response_id,
 * item_reference and input_items, under the request's key (the least recently
 * used go past response_store_bytes), then calls send(r, response), which
 * takes the response: at once, or once a shared store has it (said "store":
 * false when it could not). */
void responses_keep(request *r, json_t *history, json_t *response, void (*send)(request *r, json_t *response));
/* A request's input items checked and as they are listed (appended to listed):
 * what POST /v1/conversations and its items take; none may repeat an id of
 * existing (the conversation's items, or NULL) or of another. 0, or -1 + e
 * (param "items"). */
int responses_listed_items(request *r, json_t *items, json_t *existing, json_t *listed, api_error *e);
/* metadata as OpenAI takes it (conversations, responses): an object of at
 * most 16 string values, keys of at most 64 characters, values of at most
 * 512. 0, or -1 + a 400 naming metadata. */
int metadata_check(json_t *m, api_error *e);
/* A failed response's error in OpenAI's codes (the SDK's ResponseError:
 * rate_limit_exceeded, invalid_prompt, server_error by status), ours in the
 * message ("503 request_timeout: ..."). New reference. */
json_t *responses_error(int status, const char *code, const char *message);
/* The Responses API's usage from a chat usage object (borrowed); new reference. */
json_t *responses_usage(json_t *chat_usage);
/* An output message item with one output_text part (text borrowed; NULL: no part yet). */
json_t *responses_message(const char *msg_id, const char *status, json_t *text);
/* A response object; takes output and usage (either may be NULL), echoes request's fields. */
json_t *responses_object(const char *id, int64_t created, const char *model, const char *status,
                         json_t *output, json_t *usage, json_t *request);
/* A /v1/responses stream's events: written to r's stream, numbered from 0;
 * those numbered at most skip_through are not written (a replay after
 * starting_after; -1: all). */
typedef struct response_events {
    request *r;
    int64_t seq, skip_through;
} response_events;
/* The last event of the stream r's generation writes, for response (borrowed)
 * by its status (response.completed, .failed or .incomplete), after a
 * response.created when none was written yet (it failed before it began). */
void responses_stream_ended(request *r, json_t *response);
/* Writes a finished response's events to r's stream as a stream of it would
 * have sent them (response borrowed), its text in one delta per message, and ends the stream:
 * those numbered after starting_after (-1: all); the last event always, numbered
 * starting_after + 1 when the replay has no more events than that. */
void responses_replay(request *r, json_t *response, int64_t starting_after);
/* Ends r's stream with response's last event (borrowed; by its status),
 * numbered seq (after a response.created when seq is 0), unless seq is at
 * most skip_through. */
void responses_stream_end_from(request *r, json_t *response, int64_t seq, int64_t skip_through);
void generation_free(generation *g);
/* Asks the engine to stop (client gone, server draining). */
void generation_cancel(generation *g);
/* Whether g stopped because the server saw its client leave (a stream may have ended
 * meanwhile, with that error event, before libmicrohttpd found the socket closed). */
int generation_client_left(const generation *g);
/* Whether r's body (a Responses request's chat body) parses as
 * route_generate_responses would take it: 0 with q filled (the caller frees it;
 * its schema, when api_gen_request_constrained, is not compiled yet), or -1 + e
 * (*retry_after > 0: a file still being read). Its file parts are resolved
 * (files_in_messages) and its tool turns checked (api_render_tools). */
int generation_check_responses(request *r, api_gen_request *q, api_error *e, int *retry_after);
/* Whether g waits for its turn to decode (max_answers). */
int generation_waiting(const generation *g);
/* The housekeeping timer's, each second: generations being prepared whose
 * client left are cancelled, and answers waiting their turn or their session's
 * chunk whose client left or whose request_timeout passed end. */
void generations_sweep(server *s);
/* Generated ids are random: prefix + 24 alphanumerics. */
void random_id(char *out, size_t cap, const char *prefix);

/* ---- the server (serve.c) ---------------------------------------------------------- */
typedef struct srv_event srv_event;
typedef struct conn_track conn_track;
typedef void (*srv_event_fn)(server *s, void *arg);

struct server {
    server_config cfg;
    uv_loop_t *loop;
    struct MHD_Daemon *mhd;
    uv_poll_t mhd_poll;
    uv_timer_t mhd_timer, housekeeping, leases;
    uv_idle_t mhd_soon;         /* runs MHD at the loop's next iteration (srv_kick_soon) */
    uint64_t mhd_calls;         /* MHD's calls into the server (handler, reader, notices): its progress */
    double mhd_zero_since;      /* (monotonic_ms) MHD has asked to run at once since, without progress */
    uint64_t mhd_zero_calls;    /* mhd_calls then */
    int mhd_stuck;              /* it asked so for MHD_STUCK_MS: run every MHD_STUCK_TICK_MS (serve.c) */
    int64_t mhd_stuck_episodes; /* how often since start (/metrics) */
    double housekeeping_ms;     /* (monotonic_ms) the last housekeeping tick */
    double loop_lag_max_ms;     /* the latest a tick came past its time, since start */
    uv_async_t wake;
    uv_signal_t sig_term, sig_int;
    engine *eng;
    engine_info info;
    engine_sched *sched;
    char model_id[128];
    int64_t started;
    int loading, draining, stopping;
    atomic_int abandon_replays;  /* set at the drain's end: log replays (restores, rebuilds) stop */
    int restores_pending;     /* sessions still being replayed at start */
    double drain_deadline;
    double snapshots_deadline; /* > 0: drained, waiting for the last snapshots (leases still renewed) */
    /* keys */
    api_key *keys;
    size_t n_keys;
    api_key anonymous;
    /* sessions */
    store *st;
    session *sessions;
    size_t pot_memory;
    size_t pot_memory_held;   /* of it, held for good: the prompt cache's share */
    int store_silent;         /* the shared store answered no lease renewal last time */
    int renewing;             /* a round of lease renewals is out (sessions_renew_leases) */
    int bg_renewing;          /* a round of run-mark renewals is out (background_renew) */
    event_log *bg_logs;       /* streamed background responses' events, kept after their end (background.c) */
    waiting_stream *bg_waiting; /* GET ?stream=true of events not kept here (background_events.c) */
    uv_timer_t bg_follow;       /* looks at those while there are any */
    uv_timer_t bg_ship;         /* ships streamed ones' events written since the last append */
    size_t bg_logs_bytes;
    struct takeover *takeovers; /* takeovers asking the shared store (sessions.c take_over) */
    int heavy_running, heavy_max; /* WORK_HEAVY jobs on the pool, and how many may be (router.c) */
    struct off_loop *heavy_waiting, *heavy_waiting_last; /* the others, in order */
    int n_heavy_waiting;
    size_t pot_memory_going;  /* of it, deleted sessions' pots still held by their last readers */
    /* answers take turns (completions.c): at most max_answers sequences decode at once */
    int answers_running;
    generation *answers_waiting, *answers_waiting_last; /* their turn comes in this order */
    int n_answers_waiting;
    /* stored /v1/responses answers (responses.c): id -> {owner, conversation, items,
       response, bytes}, the least recently used first; stored_bytes their size */
    json_t *stored;
    size_t stored_bytes;
    json_t *stored_read; /* a shared store: id -> the entry's text as the last fetch read it (stored_update) */
    int64_t upload_pieces; /* uploads' pieces between arrival and ingest, all together (sessions.c) */
    /* live requests, and every open connection (router.c) */
    request *live;
    int n_live;
    conn_track *conns;
    metrics m;
    /* engine -> loop events */
    pthread_mutex_t ev_lock;
    srv_event *ev_head, *ev_tail;
};

/* From any thread: runs fn(s, arg) on the loop thread soon. */
void srv_post(server *s, srv_event_fn fn, void *arg);
/* Runs MHD's event processing now. */
void srv_kick(server *s);
/* Runs it on the next loop iteration (after a resume outside MHD's callbacks). */
void srv_kick_soon(server *s);
/* The engine scheduler's calls; -1 once shutdown has stopped the engine. */
/* fn runs after d's earlier work (d NULL: ordered with nothing). */
int srv_task(server *s, engine_doc *d, engine_task_fn fn, void *user);
/* When a request arriving now must end: request_timeout from now (monotonic_ms;
 * 0: no limit); and the Retry-After of its 503 (the timeout, 1 to 30 s). */
double srv_request_deadline(const server *s);
int srv_timeout_retry_seconds(const server *s);
int srv_ingest(server *s, engine_doc *d, const char *bytes, size_t n, int final,
               engine_ingest_done_fn done, void *user);
int srv_generate(server *s, const engine_gen_request *r, char *err, size_t errlen);
void srv_access_log(request *r);
/* Closes connections past their deadlines: headers not complete within
 * idle_timeout, or open longer than connection_timeout (router.c). */
void srv_sweep_connections(server *s);

#endif
