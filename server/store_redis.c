/* The Redis session store (layout and rules: server/store.h). hiredis's
 * blocking API, one connection per thread (the loop, the engine thread and
 * each thread-pool worker), reconnected after an error. A chunk is buffered
 * in memory while it arrives and written by one Lua script at its commit:
 * the script checks the lease's fencing token and the log's length, then
 * appends the framed chunk to the log and its header to the index. */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "server/store_impl.h"

enum { HEADER_BYTES = 32, REPLAY_BATCH = 8, FEED_MAX = 1 << 20 };
static const unsigned char HEADER_MAGIC[4] = {'P', 'S', 'C', '1'};

struct redis_log {
    store *st;
    char id[48];
    char token[STORE_TOKEN_MAX];
    VEC(chunk_log_entry) entries;
    /* the open chunk: HEADER_BYTES reserved, then its bytes */
    unsigned char *buf;
    size_t len, cap;
    uint64_t seq;
    uint32_t crc;
    int open, spoiled, fenced;
    int deleted; /* a commit found the session deleted (fenced too) */
    int unreachable; /* the last replay stopped because Redis did not answer */
};

/* ---- the connection ---- */

static _Thread_local redisContext *thread_conn;
/* Every thread's connection, so that redis_store_free can close those of
 * threads that have ended (the engine thread's, at exit). */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static VEC(redisContext *) all_conns;

static void conn_free(redisContext *c) {
    pthread_mutex_lock(&all_lock);
    for (size_t i = 0; i < all_conns.n; i++)
        if (all_conns.v[i] == c) {
            all_conns.v[i] = all_conns.v[--all_conns.n];
            break;
        }
    pthread_mutex_unlock(&all_lock);
    redisFree(c);
    if (thread_conn == c) thread_conn = NULL;
}

void redis_store_free(store *st) {
    (void)st;
    pthread_mutex_lock(&all_lock);
    for (size_t i = 0; i < all_conns.n; i++) redisFree(all_conns.v[i]);
    free(all_conns.v);
    all_conns.v = NULL;
    all_conns.n = all_conns.cap = 0;
    pthread_mutex_unlock(&all_lock);
    thread_conn = NULL;
}

/* Whether Redis has closed c already (a restart since this thread last used it):
 * seen before a command is sent on it, so that a failure after the send means
 * the command may have run (unanswered), not that the connection was old. */
static int closed_by_redis(const redisContext *c) {
    char b;
    ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static _Thread_local int conn_reused; /* conn() gave this thread's connection of before */

static redisContext *conn(store *st, char *err, size_t errlen) {
    conn_reused = thread_conn && !thread_conn->err && !closed_by_redis(thread_conn);
    if (conn_reused) return thread_conn;
    if (thread_conn) conn_free(thread_conn);
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(st->host, st->port, tv);
    pthread_mutex_lock(&all_lock);
    int pushed = c && !c->err && !vec_push(&all_conns, c);
    pthread_mutex_unlock(&all_lock);
    if (!pushed) {
        set_err(err, errlen, "redis %s:%d: %s", st->host, st->port, c && c->err ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    thread_conn = c;
    redisSetTimeout(thread_conn, tv);
    if (st->password) {
        redisReply *r = st->user ? redisCommand(thread_conn, "AUTH %s %s", st->user, st->password)
                                 : redisCommand(thread_conn, "AUTH %s", st->password);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            set_err(err, errlen, "redis %s:%d: AUTH failed: %s", st->host, st->port,
                    r ? r->str : thread_conn->errstr);
            if (r) freeReplyObject(r);
            conn_free(thread_conn);
            return NULL;
        }
        freeReplyObject(r);
    }
    if (st->db) {
        redisReply *r = redisCommand(thread_conn, "SELECT %d", st->db);
        int bad = !r || r->type == REDIS_REPLY_ERROR;
        if (r) freeReplyObject(r);
        if (bad) {
            set_err(err, errlen, "redis: SELECT %d failed", st->db);
            conn_free(thread_conn);
            return NULL;
        }
    }
    return thread_conn;
}

/* Whether c failed because the server had closed it: almost always a Redis
 * restart while the connection sat idle, so the command never reached it and
 * is sent again on a new connection. Should Redis have run it and died
 * before answering, sending it again is harmless: every write here is
 * idempotent or checked by its script (a commit by the log's length, which
 * then refuses it as CONFLICT). A timeout is not stale: a stalled Redis may
 * still run the command, so it is not sent again. */
static int stale(const redisContext *c) {
    return c->err == REDIS_ERR_EOF ||
           (c->err == REDIS_ERR_IO && (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN));
}

/* Runs one command of argc binary-safe arguments; the reply (caller frees) or
 * NULL + err, also for an error reply (its text in err). */
/* Whether this thread's last command failed without an answer (the
 * connection failed or timed out), so that it may have run or may still run. */
static _Thread_local int unanswered;
/* ... and whether it is known not to have run: no connection, or Redis
 * refused it while loading its data or running a script (retry later). */
static _Thread_local int not_run;

static redisReply *command(store *st, int argc, const char **argv, const size_t *lens, char *err,
                           size_t errlen) {
    unanswered = 0;
    not_run = 0;
    redisContext *c = conn(st, err, errlen);
    if (!c) return not_run = 1, NULL;
    int reused = conn_reused;
    redisReply *r = redisCommandArgv(c, argc, argv, lens);
    int resent = 0;
    if (!r && reused && stale(c)) { /* Redis closed it as it was sent (conn() saw it open): once more, anew */
        conn_free(c);
        resent = 1; /* (the first send may have run: Redis may have died after running it) */
        if (!(c = conn(st, err, errlen))) return unanswered = 1, NULL;
        r = redisCommandArgv(c, argc, argv, lens);
    }
    if (!r) {
        set_err(err, errlen, "redis: %s", c->err == REDIS_ERR_IO && errno == EAGAIN ? "no answer in time" : c->errstr);
        unanswered = 1;
        conn_free(c);
        return NULL;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        set_err(err, errlen, "%s", r->str);
        not_run = !strncmp(r->str, "LOADING", 7) || !strncmp(r->str, "BUSY", 4) || !strncmp(r->str, "MASTERDOWN", 10);
        if (not_run && resent) not_run = 0, unanswered = 1; /* this send did not run; the first may have */
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

/* argv's lengths from strlen (none of them binary). */
static redisReply *command_str(store *st, int argc, const char **argv, char *err, size_t errlen) {
    size_t lens[16];
    for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
    return command(st, argc, argv, lens, err, errlen);
}

static void key(char *out, size_t cap, const char *id, const char *what) {
    snprintf(out, cap, "potserve:s:%s:%s", id, what);
}

/* A decimal number of at most 5 digits at p (no sign or space), or -1; *end after it. */
static long digits(const char *p, const char **end) {
    long v = 0;
    const char *q = p;
    while (*q >= '0' && *q <= '9' && q - p < 5) v = v * 10 + (*q++ - '0');
    *end = q;
    return q == p ? -1 : v;
}

int redis_store_init(store *st, const char *spec, char *err, size_t errlen) {
    const char *p = spec + strlen("redis://");
    const char *at = strrchr(p, '@'); /* the last: a password may hold '@', ':' or '/' */
    if (at) { /* user:password@ or password@ (or :password@) */
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (colon && colon > p) st->user = strndup(p, (size_t)(colon - p));
        st->password = colon ? strndup(colon + 1, (size_t)(at - colon - 1)) : strndup(p, (size_t)(at - p));
        if (!st->password || !*st->password)
            return set_err(err, errlen, "store: empty password in the redis URL"), -1;
        p = at + 1;
    }
    size_t hn = strcspn(p, ":/");
    st->host = strndup(p, hn);
    st->port = 6379;
    p += hn;
    const char *end;
    if (*p == ':') {
        long v = digits(p + 1, &end);
        if (v < 1 || v > 65535 || (*end && *end != '/'))
            return set_err(err, errlen, "store: bad port in the redis URL (redis://[[user:]password@]host:port/db)"), -1;
        st->port = (int)v;
        p = end;
    }
    if (*p == '/' && p[1]) {
        long v = digits(p + 1, &end);
        if (*end || v < 0 || v > 1000)
            return set_err(err, errlen, "store: bad db in the redis URL (a number 0..1000)"), -1;
        st->db = (int)v;
    } else if (*p && strcmp(p, "/")) {
        return set_err(err, errlen, "store: cannot read the redis URL (redis://[[user:]password@]host:port/db)"), -1;
    }
    if (!st->host || !*st->host) return set_err(err, errlen, "store: no host in the redis URL"), -1;
    const char *ping[] = {"PING"};
    redisReply *r = command_str(st, 1, ping, err, errlen);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

int redis_ping(store *st) {
    char err[128];
    const char *ping[] = {"PING"};
    redisReply *r = command_str(st, 1, ping, err, sizeof err);
    if (r) freeReplyObject(r);
    return r ? 0 : -1;
}

/* ---- meta ---- */

/* The set of a key's sessions (its files among them): potserve:owner:<owner tag>. */
static void owner_key(char *out, size_t cap, const char *owner) { snprintf(out, cap, "potserve:owner:%s", owner); }

static const char CREATE_SCRIPT[] =
    "redis.call('HSET', KEYS[1], 'json', ARGV[1], 'last_seq', '0', 'final', '0', 'bytes', '0') "
    "redis.call('SADD', KEYS[2], ARGV[2]) return 1";

int redis_store_create(store *st, const char *id, const char *meta, const char *owner, char *err, size_t errlen) {
    char k[96], owned[96];
    key(k, sizeof k, id, "meta");
    owner_key(owned, sizeof owned, owner);
    const char *argv[] = {"EVAL", CREATE_SCRIPT, "2", k, owned, meta, id}; /* both or neither */
    redisReply *r = command_str(st, 7, argv, err, errlen);
    if (r) freeReplyObject(r);
    return r ? 0 : -1;
}

char *redis_store_meta_read(store *st, const char *id, int *absent, char *err, size_t errlen) {
    char k[96];
    key(k, sizeof k, id, "meta");
    const char *argv[] = {"HGET", k, "json"};
    redisReply *r = command_str(st, 3, argv, err, errlen);
    if (!r) return NULL;
    char *text = NULL;
    if (r->type == REDIS_REPLY_STRING) text = strndup(r->str, r->len);
    else if (absent) *absent = 1;
    if (!text) set_err(err, errlen, "%.60s: no such session in the store", id);
    freeReplyObject(r);
    return text;
}

static const char REMOVE_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]) return 1";

void redis_store_remove(store *st, const char *id, const char *token) {
    char k[6][96];
    const char *what[] = {"lease", "meta", "log", "idx", "snap", "want"};
    for (int i = 0; i < 6; i++) key(k[i], sizeof k[i], id, what[i]);
    const char *argv[] = {"EVAL", REMOVE_SCRIPT, "6", k[0], k[1], k[2], k[3], k[4], k[5], token};
    char err[128];
    redisReply *r = command_str(st, 10, argv, err, sizeof err);
    if (r) freeReplyObject(r);
}

/* The meta goes now; the log, index and snapshot, which readers on this
 * replica may still use, expire in an hour unless redis_store_remove takes
 * them first (a replica that dies in between leaves nothing for good). */
static const char MARK_DELETED_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end redis.call('DEL', KEYS[2]) "
    "for i = 3, 5 do redis.call('PEXPIRE', KEYS[i], 3600000) end return 1";

int redis_store_mark_deleted(store *st, const char *id, const char *token, char *err, size_t errlen) {
    char k[5][96];
    const char *what[] = {"lease", "meta", "log", "idx", "snap"};
    for (int i = 0; i < 5; i++) key(k[i], sizeof k[i], id, what[i]);
    const char *argv[] = {"EVAL", MARK_DELETED_SCRIPT, "5", k[0], k[1], k[2], k[3], k[4], token};
    redisReply *r = command_str(st, 9, argv, err, errlen);
    if (!r) return errno = EAGAIN, -1; /* not run, or not answered: a deletion runs twice alike, so retry */
    int rc = r->type == REDIS_REPLY_INTEGER && r->integer == 1 ? 0 : -1;
    if (rc) snprintf(err, errlen, "this replica no longer holds the session's lease"), errno = EPERM;
    freeReplyObject(r);
    return rc;
}

/* ---- leases ---- */

/* A lease held under another name is left alone (and that replica asked to
 * hand it over); a free one, or one held under this replica's own name by an
 * earlier process, is taken with a new fencing token. */
static const char ACQUIRE_SCRIPT[] =
    "local cur = redis.call('GET', KEYS[1]) "
    "if cur and string.match(cur, '^%d+ (.*)$') ~= ARGV[1] then "
    "  redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2]) return {0, cur} end "
    "local v = redis.call('INCR', KEYS[2]) .. ' ' .. ARGV[1] "
    "redis.call('SET', KEYS[1], v, 'PX', ARGV[2]) redis.call('DEL', KEYS[3]) return {1, v}";

int redis_lease_acquire(store *st, const char *id, char token[STORE_TOKEN_MAX],
                        char owner[STORE_TOKEN_MAX], char *err, size_t errlen) {
    char lease[96], want[96], ms[32];
    key(lease, sizeof lease, id, "lease");
    key(want, sizeof want, id, "want");
    snprintf(ms, sizeof ms, "%lld", (long long)st->lease_ms);
    const char *argv[] = {"EVAL", ACQUIRE_SCRIPT, "3", lease, "potserve:fence", want, st->replica, ms};
    redisReply *r = command_str(st, 8, argv, err, errlen);
    if (!r) return -1;
    int rc = -1;
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[1]->type == REDIS_REPLY_STRING) {
        const char *v = r->element[1]->str;
        rc = r->element[0]->integer == 1;
        if (rc) snprintf(token, STORE_TOKEN_MAX, "%s", v);
        else snprintf(owner, STORE_TOKEN_MAX, "%s", strchr(v, ' ') ? strchr(v, ' ') + 1 : v);
    } else {
        set_err(err, errlen, "redis: unexpected reply to the lease script");
    }
    freeReplyObject(r);
    return rc;
}

static const char RENEW_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 + redis.call('EXISTS', KEYS[2])";

/* One command of a pipeline (pipelined_integers): its arguments, and room for two keys. */
typedef struct pipe_cmd {
    const char *argv[8];
    int argc;
    char keys[2][128];
} pipe_cmd;

/* Sends n commands at once (one round trip), build(user, i, cmd) making the
 * i-th; out[i] = its integer reply, -1 when Redis did not answer it. As
 * command() does, a connection Redis closed since this thread last used it (a
 * restart) is made anew and the whole pipeline sent once more, so its
 * commands must be safe to run twice (renewals are). */
static void pipelined_integers(store *st, size_t n, void (*build)(void *user, size_t i, pipe_cmd *cmd), void *user,
                               int *out) {
    char err[128];
    for (int attempt = 0; attempt < 2; attempt++) {
        for (size_t i = 0; i < n; i++) out[i] = -1;
        redisContext *c = conn(st, err, sizeof err);
        if (!c) return;
        int reused = conn_reused;
        size_t sent = 0;
        for (; sent < n; sent++) {
            pipe_cmd cmd = {0};
            build(user, sent, &cmd);
            size_t lens[8];
            for (int k = 0; k < cmd.argc; k++) lens[k] = strlen(cmd.argv[k]);
            if (redisAppendCommandArgv(c, cmd.argc, cmd.argv, lens) != REDIS_OK) break;
        }
        size_t i = 0;
        for (; i < sent; i++) {
            void *reply = NULL;
            if (redisGetReply(c, &reply) != REDIS_OK) break;
            redisReply *r = reply;
            if (r->type == REDIS_REPLY_INTEGER) out[i] = (int)r->integer;
            freeReplyObject(r);
        }
        if (i == sent) return;
        int again = !attempt && !i && reused && stale(c);
        conn_free(c);
        if (!again) return;
    }
}

typedef struct renew_args {
    const char *const *ids, *const *tokens;
    char ms[32];
} renew_args;

static void lease_renew_cmd(void *user, size_t i, pipe_cmd *cmd) {
    renew_args *a = user;
    key(cmd->keys[0], sizeof cmd->keys[0], a->ids[i], "lease");
    key(cmd->keys[1], sizeof cmd->keys[1], a->ids[i], "want");
    const char *argv[] = {"EVAL", RENEW_SCRIPT, "2", cmd->keys[0], cmd->keys[1], a->tokens[i], a->ms};
    memcpy(cmd->argv, argv, sizeof argv);
    cmd->argc = 7;
}

void redis_lease_renew(store *st, const char *const *ids, const char *const *tokens, size_t n,
                       int *out) {
    renew_args a = {.ids = ids, .tokens = tokens};
    snprintf(a.ms, sizeof a.ms, "%lld", (long long)st->lease_ms);
    pipelined_integers(st, n, lease_renew_cmd, &a, out);
}

static const char RELEASE_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('DEL', KEYS[1]) return 1";

void redis_lease_release(store *st, const char *id, const char *token) {
    char lease[96], err[128];
    key(lease, sizeof lease, id, "lease");
    const char *argv[] = {"EVAL", RELEASE_SCRIPT, "1", lease, token};
    redisReply *r = command_str(st, 5, argv, err, sizeof err);
    if (r) freeReplyObject(r);
}

/* ---- stored responses ---------------------------------------------------------------------- */

/* drop(rid, rewritten): forgets a stored response, its items' names where
 * they are its own, its run mark, and its size; the total left. A response
 * rewritten (its answer, a cancel over its queued entry) keeps its events
 * (their bytes stay counted); one dropped loses them too. (Other entries' keys
 * are named here, not in KEYS: a single Redis, as everywhere in this store.) */
#define RESPONSE_DROP_FN                                                                                 \
    "local function drop(rid, rewritten) local k = 'potserve:r:' .. rid local size = redis.call('STRLEN', k) " \
    "for _, item in ipairs(redis.call('SMEMBERS', k .. ':items')) do "                                    \
    "if redis.call('HGET', KEYS[3], item) == rid then redis.call('HDEL', KEYS[3], item) end end "         \
    "redis.call('DEL', k, k .. ':items', k .. ':run') redis.call('ZREM', KEYS[4], rid) "                   \
    "if not rewritten then size = size + redis.call('STRLEN', k .. ':events') "                           \
    "redis.call('DEL', k .. ':events', k .. ':events:end') end "                                          \
    "return redis.call('DECRBY', KEYS[5], size) end "

/* KEYS: entry, its items, potserve:r:item, :lru, :bytes, :clock; ARGV: id,
 * entry, max_bytes, expect ("0": none; else "1" and the entry as read),
 * item ids... -1: the entry is no longer what was read. */
static const char RESPONSE_PUT_SCRIPT[] =
    RESPONSE_DROP_FN
    "local first = 5 "
    "if ARGV[4] == '1' then first = 6 if redis.call('GET', KEYS[1]) ~= ARGV[5] then return -1 end end "
    "if redis.call('EXISTS', KEYS[1]) == 1 then drop(ARGV[1], true) end "
    "redis.call('SET', KEYS[1], ARGV[2]) "
    "for i = first, #ARGV do redis.call('SADD', KEYS[2], ARGV[i]) redis.call('HSET', KEYS[3], ARGV[i], ARGV[1]) end "
    "redis.call('ZADD', KEYS[4], redis.call('INCR', KEYS[6]), ARGV[1]) "
    "local total = redis.call('INCRBY', KEYS[5], string.len(ARGV[2])) "
    "while total > tonumber(ARGV[3]) do "
    "local oldest = redis.call('ZRANGE', KEYS[4], 0, 0)[1] "
    "if not oldest or oldest == ARGV[1] then break end total = drop(oldest) end "
    "return total";

int redis_response_put(store *st, const char *id, const char *entry, const char *const *items, size_t n_items,
                       int64_t max_bytes, const char *expect, char *err, size_t errlen) {
    char k[2][128], max[24];
    snprintf(k[0], sizeof k[0], "potserve:r:%s", id);
    snprintf(k[1], sizeof k[1], "potserve:r:%s:items", id);
    snprintf(max, sizeof max, "%lld", (long long)max_bytes);
    size_t n_head = expect ? 14 : 13, argc = n_head + n_items;
    const char **argv = malloc(argc * sizeof *argv);
    size_t *lens = malloc(argc * sizeof *lens);
    if (!argv || !lens) {
        free(argv);
        free(lens);
        return set_err(err, errlen, "out of memory"), -1;
    }
    const char *head[] = {"EVAL", RESPONSE_PUT_SCRIPT, "6", k[0], k[1], "potserve:r:item", "potserve:r:lru",
                          "potserve:r:bytes", "potserve:r:clock", id, entry, max, expect ? "1" : "0", expect};
    for (size_t i = 0; i < n_head; i++) argv[i] = head[i];
    for (size_t i = 0; i < n_items; i++) argv[n_head + i] = items[i];
    for (size_t i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
    redisReply *r = command(st, (int)argc, argv, lens, err, errlen);
    free(argv);
    free(lens);
    int changed = r && r->type == REDIS_REPLY_INTEGER && r->integer == -1;
    if (r) freeReplyObject(r);
    return !r ? -1 : changed;
}

/* KEYS: potserve:r:item, :lru, :clock; ARGV: id, by_item, touch */
static const char RESPONSE_GET_SCRIPT[] =
    "local rid = ARGV[1] "
    "if ARGV[2] == '1' then rid = redis.call('HGET', KEYS[1], ARGV[1]) if not rid then return false end end "
    "local e = redis.call('GET', 'potserve:r:' .. rid) "
    "if not e then return false end "
    "if ARGV[3] == '1' then redis.call('ZADD', KEYS[2], 'XX', redis.call('INCR', KEYS[3]), rid) end "
    "return e";

char *redis_response_get(store *st, const char *id, int by_item, int touch, int *absent, char *err, size_t errlen) {
    const char *argv[] = {"EVAL", RESPONSE_GET_SCRIPT, "3", "potserve:r:item", "potserve:r:lru", "potserve:r:clock",
                          id, by_item ? "1" : "0", touch ? "1" : "0"};
    redisReply *r = command_str(st, 9, argv, err, errlen);
    if (!r) return NULL;
    char *entry = NULL;
    if (r->type == REDIS_REPLY_STRING) {
        if (!(entry = strndup(r->str, r->len))) set_err(err, errlen, "out of memory");
    } else {
        *absent = 1;
    }
    freeReplyObject(r);
    return entry;
}

/* KEYS: (none of its own), (none), potserve:r:item, :lru, :bytes; ARGV: id */
static const char RESPONSE_DELETE_SCRIPT[] =
    RESPONSE_DROP_FN "if redis.call('EXISTS', 'potserve:r:' .. ARGV[1]) == 0 then return 0 end "
                     "drop(ARGV[1]) return 1";

int redis_response_delete(store *st, const char *id, char *err, size_t errlen) {
    const char *argv[] = {"EVAL", RESPONSE_DELETE_SCRIPT, "5", "potserve:r:none", "potserve:r:none",
                          "potserve:r:item", "potserve:r:lru", "potserve:r:bytes", id};
    redisReply *r = command_str(st, 9, argv, err, errlen);
    if (!r) return -1;
    int gone = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    return gone;
}

int redis_response_run_mark(store *st, const char *id, char *err, size_t errlen) {
    char k[128], ms[32];
    snprintf(k, sizeof k, "potserve:r:%s:run", id);
    snprintf(ms, sizeof ms, "%lld", (long long)st->lease_ms);
    const char *argv[] = {"SET", k, st->replica, "PX", ms};
    redisReply *r = command_str(st, 5, argv, err, errlen);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

/* KEYS: the run mark, the entry; ARGV: ms. 1 renewed; its mark gone: 2 when the
 * entry says cancelled (a cancel through another replica), else 0. */
static const char RUN_RENEW_SCRIPT[] =
    "if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 1 then return 1 end "
    "local e = redis.call('GET', KEYS[2]) if not e then return 0 end "
    "local ok, v = pcall(cjson.decode, e) "
    "if ok and type(v) == 'table' and type(v.object) == 'table' and v.object.status == 'cancelled' then return 2 end "
    "return 0";

static void run_renew_cmd(void *user, size_t i, pipe_cmd *cmd) {
    renew_args *a = user;
    snprintf(cmd->keys[0], sizeof cmd->keys[0], "potserve:r:%s:run", a->ids[i]);
    snprintf(cmd->keys[1], sizeof cmd->keys[1], "potserve:r:%s", a->ids[i]);
    const char *argv[] = {"EVAL", RUN_RENEW_SCRIPT, "2", cmd->keys[0], cmd->keys[1], a->ms};
    memcpy(cmd->argv, argv, sizeof argv);
    cmd->argc = 6;
}

void redis_response_run_renew(store *st, const char *const *ids, size_t n, int *out) {
    renew_args a = {.ids = ids};
    snprintf(a.ms, sizeof a.ms, "%lld", (long long)st->lease_ms);
    pipelined_integers(st, n, run_renew_cmd, &a, out);
}

int redis_response_run_held(store *st, const char *id, char *err, size_t errlen) {
    char k[128];
    snprintf(k, sizeof k, "potserve:r:%s:run", id);
    const char *argv[] = {"EXISTS", k};
    redisReply *r = command_str(st, 2, argv, err, errlen);
    if (!r) return -1;
    int held = r->type == REDIS_REPLY_INTEGER ? r->integer == 1 : -1;
    if (held < 0) set_err(err, errlen, "redis: unexpected reply to EXISTS");
    freeReplyObject(r);
    return held;
}

/* KEYS: entry, its events, their end, potserve:r:bytes; ARGV: bytes, end,
 * where they go. Appended only while the entry is stored (never an orphan
 * after its drop), and only at that offset: an append retried after an
 * answer lost on the way (with what was written since added to it) finds
 * its first part there and adds the rest. 1: gone, 2: the copy differs. */
static const char EVENTS_APPEND_SCRIPT[] =
    "if redis.call('EXISTS', KEYS[1]) == 0 then return 1 end "
    "local have, at = redis.call('STRLEN', KEYS[2]), tonumber(ARGV[3]) "
    "if have < at or have > at + #ARGV[1] then return 2 end "
    "if have > at and redis.call('GETRANGE', KEYS[2], at, have - 1) ~= string.sub(ARGV[1], 1, have - at) then "
    "return 2 end "
    "local rest = string.sub(ARGV[1], have - at + 1) "
    "if #rest > 0 then redis.call('APPEND', KEYS[2], rest) redis.call('INCRBY', KEYS[4], #rest) end "
    "if ARGV[2] == '1' then redis.call('SET', KEYS[3], '1') end "
    "return 0";

int redis_response_events_append(store *st, const char *id, uint64_t at, const char *data, size_t n, int end,
                                 char *err, size_t errlen) {
    char k[3][128], offset[24];
    snprintf(k[0], sizeof k[0], "potserve:r:%s", id);
    snprintf(k[1], sizeof k[1], "potserve:r:%s:events", id);
    snprintf(k[2], sizeof k[2], "potserve:r:%s:events:end", id);
    snprintf(offset, sizeof offset, "%llu", (unsigned long long)at);
    const char *argv[] = {"EVAL", EVENTS_APPEND_SCRIPT, "4", k[0], k[1], k[2], "potserve:r:bytes", data,
                          end ? "1" : "0", offset};
    size_t lens[10];
    for (int i = 0; i < 10; i++) lens[i] = i == 7 ? n : strlen(argv[i]);
    redisReply *r = command(st, 10, argv, lens, err, errlen);
    if (!r) return -1;
    int rc = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : -1;
    if (rc < 0) set_err(err, errlen, "redis: unexpected reply to the events append");
    freeReplyObject(r);
    return rc;
}

/* KEYS: entry, its run mark, its events, their end; ARGV: first byte, last
 * byte, whether the entry is wanted (also fetched when it has no events). */
static const char EVENTS_LOOK_SCRIPT[] =
    "local has = redis.call('EXISTS', KEYS[3]) local e, read = false, 0 "
    "if ARGV[3] == '1' or has == 0 then e, read = redis.call('GET', KEYS[1]), 1 end "
    "return {e, redis.call('EXISTS', KEYS[2]), has, redis.call('GETRANGE', KEYS[3], ARGV[1], ARGV[2]), "
    "redis.call('EXISTS', KEYS[4]), read}";

int redis_response_events_look(store *st, const char *id, uint64_t from, size_t max, int want_entry,
                               store_events_look *out, char *err, size_t errlen) {
    char k[4][128], first[24], last[24];
    snprintf(k[0], sizeof k[0], "potserve:r:%s", id);
    snprintf(k[1], sizeof k[1], "potserve:r:%s:run", id);
    snprintf(k[2], sizeof k[2], "potserve:r:%s:events", id);
    snprintf(k[3], sizeof k[3], "potserve:r:%s:events:end", id);
    snprintf(first, sizeof first, "%llu", (unsigned long long)from);
    snprintf(last, sizeof last, "%llu", (unsigned long long)(from + (max ? max : 1) - 1));
    const char *argv[] = {"EVAL", EVENTS_LOOK_SCRIPT, "4", k[0], k[1], k[2], k[3], first, last, want_entry ? "1" : "0"};
    redisReply *r = command_str(st, 10, argv, err, errlen);
    if (!r) return -1;
    memset(out, 0, sizeof *out);
    int ok = r->type == REDIS_REPLY_ARRAY && r->elements == 6 && r->element[3]->type == REDIS_REPLY_STRING;
    if (ok && r->element[0]->type == REDIS_REPLY_STRING &&
        !(out->entry = strndup(r->element[0]->str, r->element[0]->len)))
        ok = 0;
    if (ok) {
        out->held = r->element[1]->integer == 1;
        out->has_events = r->element[2]->integer == 1;
        out->ended = r->element[4]->integer == 1;
        out->entry_read = r->element[5]->integer == 1;
        out->len = r->element[3]->len;
        if (out->len && !(out->events = malloc(out->len))) ok = 0;
        else if (out->len) memcpy(out->events, r->element[3]->str, out->len);
    }
    freeReplyObject(r);
    if (!ok) {
        free(out->entry);
        memset(out, 0, sizeof *out);
        return set_err(err, errlen, "redis: unexpected reply to the events look (or out of memory)"), -1;
    }
    return 0;
}

static void header_put(unsigned char *h, const chunk_log_entry *e) {
    memset(h, 0, HEADER_BYTES);
    memcpy(h, HEADER_MAGIC, 4);
    h[4] = (unsigned char)(e->final != 0);
    le_put_u64(h + 8, e->seq);
    le_put_u64(h + 16, e->bytes);
    le_put_u32(h + 24, e->crc);
    le_put_u32(h + 28, crc32c(0, h, 28));
}

static int header_get(const unsigned char *h, size_t n, chunk_log_entry *e) {
    if (n < HEADER_BYTES || memcmp(h, HEADER_MAGIC, 4) || le_get_u32(h + 28) != crc32c(0, h, 28)) return -1;
    e->final = h[4];
    e->seq = le_get_u64(h + 8);
    e->bytes = le_get_u64(h + 16);
    e->crc = le_get_u32(h + 24);
    return 0;
}

redis_log *redis_log_open(store *st, const char *id, const char *token, char *err, size_t errlen) {
    redis_log *l = calloc(1, sizeof *l);
    if (!l) return set_err(err, errlen, "out of memory"), NULL;
    l->st = st;
    snprintf(l->id, sizeof l->id, "%s", id);
    snprintf(l->token, sizeof l->token, "%s", token ? token : "");
    char idx[96];
    key(idx, sizeof idx, id, "idx");
    const char *argv[] = {"LRANGE", idx, "0", "-1"};
    redisReply *r = command_str(st, 4, argv, err, errlen);
    if (!r) {
        free(l);
        return errno = unanswered || not_run ? EAGAIN : EIO, NULL; /* EAGAIN: a retry may read it */
    }
    uint64_t end = 0;
    for (size_t i = 0; i < r->elements; i++) {
        chunk_log_entry e;
        redisReply *h = r->element[i];
        if (h->type != REDIS_REPLY_STRING || header_get((const unsigned char *)h->str, h->len, &e) ||
            (l->entries.n && (e.seq <= l->entries.v[l->entries.n - 1].seq || l->entries.v[l->entries.n - 1].final))) {
            set_err(err, errlen, "session %s: chunk header %zu in the store is damaged", id, i);
            freeReplyObject(r);
            redis_log_close(l);
            return NULL;
        }
        end += HEADER_BYTES + e.bytes;
        e.end_offset = end;
        if (vec_push(&l->entries, e)) {
            freeReplyObject(r);
            redis_log_close(l);
            return set_err(err, errlen, "out of memory"), NULL;
        }
    }
    freeReplyObject(r);
    return l;
}

redis_log *redis_log_copy(const redis_log *l, char *err, size_t errlen) {
    redis_log *c = calloc(1, sizeof *c);
    if (!c || vec_append(&c->entries, l->entries.v, l->entries.n)) {
        if (c) free(c->entries.v);
        free(c);
        return set_err(err, errlen, "out of memory"), NULL;
    }
    c->st = l->st;
    memcpy(c->id, l->id, sizeof c->id);
    return c; /* no token: a copy never writes */
}

void redis_log_close(redis_log *l) {
    if (!l) return;
    free(l->entries.v);
    free(l->buf);
    free(l);
}

const chunk_log_entry *redis_log_find(const redis_log *l, uint64_t seq) {
    for (size_t i = l->entries.n; i-- > 0;)
        if (l->entries.v[i].seq == seq) return &l->entries.v[i];
    return NULL;
}

uint64_t redis_log_last_seq(const redis_log *l) {
    return l->entries.n ? l->entries.v[l->entries.n - 1].seq : 0;
}

uint64_t redis_log_committed_size(const redis_log *l) {
    return l->entries.n ? l->entries.v[l->entries.n - 1].end_offset : 0;
}

int redis_log_is_final(const redis_log *l) {
    return l->entries.n && l->entries.v[l->entries.n - 1].final;
}

int redis_log_fenced(const redis_log *l) { return l->fenced; }

int redis_log_unreachable(const redis_log *l) { return l->unreachable; }
int redis_log_deleted(const redis_log *l) { return l->deleted; }

int redis_log_begin(redis_log *l, uint64_t seq, char *err, size_t errlen) {
    if (l->open) return set_err(err, errlen, "a chunk is already open"), -1;
    if (!seq || seq <= redis_log_last_seq(l))
        return set_err(err, errlen, "seq %llu is not above the last committed chunk", (unsigned long long)seq), -1;
    if (redis_log_is_final(l)) return set_err(err, errlen, "the document has ended"), -1;
    if (l->fenced) return set_err(err, errlen, "this replica no longer holds the session's lease"), -1;
    l->open = 1;
    l->spoiled = 0;
    l->seq = seq;
    l->crc = 0;
    l->len = HEADER_BYTES;
    if (l->cap < HEADER_BYTES) {
        free(l->buf);
        l->buf = malloc(l->cap = 64 * 1024);
        if (!l->buf) {
            l->cap = 0;
            l->open = 0;
            errno = ENOMEM;
            return set_err(err, errlen, "out of memory"), -1;
        }
    }
    return 0;
}

int redis_log_append(redis_log *l, const void *data, size_t n, char *err, size_t errlen) {
    if (!l->open || l->spoiled) return set_err(err, errlen, "no chunk is open"), -1;
    if (!n) return 0;
    if (l->len + n > l->cap) {
        size_t cap = l->cap;
        while (cap < l->len + n) cap *= 2;
        unsigned char *b = realloc(l->buf, cap);
        if (!b) {
            l->spoiled = 1;
            errno = ENOMEM;
            return set_err(err, errlen, "out of memory for the chunk"), -1;
        }
        l->buf = b;
        l->cap = cap;
    }
    memcpy(l->buf + l->len, data, n);
    l->crc = crc32c(l->crc, data, n);
    l->len += n;
    return 0;
}

/* KEYS: lease meta log idx; ARGV: token seq final expected-length header frame.
 * A session whose meta has gone was deleted (a deletion Redis ran after its
 * replica stopped waiting for the answer): nothing more is written to it. */
static const char COMMIT_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then "
    "  return redis.error_reply('FENCED the session lease is held by another replica') end "
    "if redis.call('HEXISTS', KEYS[2], 'json') == 0 then "
    "  return redis.error_reply('DELETED the session was deleted') end "
    "if redis.call('LLEN', KEYS[4]) ~= tonumber(ARGV[4]) then "
    "  return redis.error_reply('CONFLICT the log in the store changed under this replica') end "
    "redis.call('RPUSH', KEYS[3], ARGV[6]) redis.call('RPUSH', KEYS[4], ARGV[5]) "
    "redis.call('HSET', KEYS[2], 'last_seq', ARGV[2], 'final', ARGV[3]) "
    "redis.call('HINCRBY', KEYS[2], 'bytes', ARGV[7]) return 1";

int redis_log_commit(redis_log *l, int final, char *err, size_t errlen) {
    if (!l->open || l->spoiled) {
        l->open = 0;
        return set_err(err, errlen, "no chunk is open"), -1;
    }
    l->open = 0;
    chunk_log_entry e = {.seq = l->seq, .bytes = l->len - HEADER_BYTES, .crc = l->crc, .final = final};
    e.end_offset = redis_log_committed_size(l) + l->len;
    header_put(l->buf, &e);
    char k[4][96], seq[32], n[32], bytes[32];
    const char *what[] = {"lease", "meta", "log", "idx"};
    for (int i = 0; i < 4; i++) key(k[i], sizeof k[i], l->id, what[i]);
    snprintf(seq, sizeof seq, "%llu", (unsigned long long)e.seq);
    snprintf(n, sizeof n, "%zu", l->entries.n);
    snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)e.bytes);
    const char *argv[] = {"EVAL", COMMIT_SCRIPT, "4", k[0], k[1], k[2], k[3], l->token, seq,
                          final ? "1" : "0", n, (const char *)l->buf, (const char *)l->buf, bytes};
    size_t lens[14];
    for (int i = 0; i < 11; i++) lens[i] = strlen(argv[i]);
    lens[11] = HEADER_BYTES;
    lens[12] = l->len;
    lens[13] = strlen(bytes);
    if (vec_reserve(&l->entries, l->entries.n + 1)) {
        errno = ENOMEM;
        return set_err(err, errlen, "out of memory"), -1;
    }
    errno = 0;
    char why[256] = "";
    redisReply *r = command(l->st, 14, argv, lens, why, sizeof why);
    if (!r) {
        if (!strncmp(why, "FENCED", 6) || !strncmp(why, "CONFLICT", 8)) l->fenced = 1;
        if (!strncmp(why, "DELETED", 7)) l->fenced = l->deleted = 1;
        if (unanswered) { /* committed or not, or later: only the store knows now */
            l->fenced = 1;
            set_err(err, errlen, "the store did not answer the commit (%s), which may have been made: re-send the "
                    "chunk with its seq (a committed one is answered as a duplicate)", why);
            return errno = EIO, -1;
        }
        errno = not_run ? EAGAIN : errno ? errno : EIO; /* EAGAIN: not committed, the store is unavailable */
        return set_err(err, errlen, "%s", why), -1;
    }
    freeReplyObject(r);
    l->entries.v[l->entries.n++] = e;
    if (l->cap > 4 * 1024 * 1024) { /* a big chunk's buffer is not kept */
        free(l->buf);
        l->buf = NULL;
        l->cap = 0;
    }
    return 0;
}

void redis_log_abort(redis_log *l) { l->open = 0; }

struct redis_log_cursor {
    redis_log *l;
    size_t next; /* the next entry to read */
};

redis_log_cursor *redis_log_cursor_open(redis_log *l, uint64_t from_offset, char *err, size_t errlen) {
    size_t start = 0;
    if (from_offset) {
        while (start < l->entries.n && l->entries.v[start].end_offset != from_offset) start++;
        if (start == l->entries.n)
            return set_err(err, errlen, "offset %llu is no chunk's end", (unsigned long long)from_offset), NULL;
        start++;
    }
    redis_log_cursor *r = calloc(1, sizeof *r);
    if (!r) return set_err(err, errlen, "out of memory"), NULL;
    r->l = l;
    r->next = start;
    return r;
}

void redis_log_cursor_close(redis_log_cursor *r) { free(r); }

/* Whole chunks (a list element is read whole): batches of at most
 * REPLAY_BATCH, ending where at_least bytes are reached, so nothing fetched is
 * thrown away when the read stops. */
int redis_log_cursor_read(redis_log_cursor *r, uint64_t at_least, chunk_log_data_fn on_data,
                          chunk_log_commit_fn on_commit, void *user, char *err, size_t errlen) {
    redis_log *l = r->l;
    char logk[96];
    key(logk, sizeof logk, l->id, "log");
    l->unreachable = 0;
    uint64_t delivered = 0;
    while (r->next < l->entries.n) {
        if (delivered >= at_least) return 1;
        size_t i = r->next, last = i;
        uint64_t batch_bytes = l->entries.v[i].bytes;
        while (last + 1 < l->entries.n && last + 1 - i < REPLAY_BATCH && delivered + batch_bytes < at_least)
            batch_bytes += l->entries.v[++last].bytes;
        char a[32], b[32];
        snprintf(a, sizeof a, "%zu", i);
        snprintf(b, sizeof b, "%zu", last);
        const char *argv[] = {"LRANGE", logk, a, b};
        redisReply *rep = command_str(l->st, 4, argv, err, errlen);
        if (!rep) return l->unreachable = unanswered || not_run, -1; /* (no connection: not run) */
        int rc = rep->elements == last - i + 1 ? 0 : -1;
        if (rc) set_err(err, errlen, "the store's log has fewer chunks than its index");
        for (size_t k = 0; !rc && k < rep->elements; k++) {
            const chunk_log_entry *want = &l->entries.v[i + k];
            redisReply *f = rep->element[k];
            chunk_log_entry got;
            if (f->type != REDIS_REPLY_STRING || header_get((const unsigned char *)f->str, f->len, &got) ||
                got.seq != want->seq || got.bytes != want->bytes || got.crc != want->crc ||
                f->len != HEADER_BYTES + got.bytes || crc32c(0, f->str + HEADER_BYTES, got.bytes) != got.crc) {
                set_err(err, errlen, "chunk %llu in the store fails its check", (unsigned long long)want->seq);
                rc = -1;
                break;
            }
            const char *data = f->str + HEADER_BYTES;
            for (size_t off = 0; !rc && on_data && off < got.bytes; off += FEED_MAX) {
                size_t m = got.bytes - off < FEED_MAX ? got.bytes - off : FEED_MAX;
                if (on_data(user, got.seq, data + off, m))
                    rc = -1, set_err(err, errlen, "replay stopped at chunk %llu", (unsigned long long)got.seq);
            }
            if (!rc && on_commit && on_commit(user, want))
                rc = -1, set_err(err, errlen, "replay stopped at chunk %llu", (unsigned long long)got.seq);
            delivered += got.bytes;
        }
        freeReplyObject(rep);
        if (rc) return -1;
        r->next = last + 1;
    }
    return 0;
}

/* ---- a key's sessions ---- */

/* One session's meta, bytes, last seq, end and snapshot; nil (and dropped from its owner's set)
 * when gone. A file whose upload never ended, unleased for ABANDONED_S since its creation (its
 * replica died while reading it: the one reading a file holds its lease from the start), is
 * removed. (A session's log may stay open for good: only files end theirs at once.) */
enum { ABANDONED_S = 600 };
static const char OWNED_SCRIPT[] =
    "local m = redis.call('HMGET', KEYS[1], 'json', 'final', 'bytes', 'last_seq') "
    "if not m[1] then redis.call('SREM', KEYS[3], ARGV[1]) return false end "
    "if m[2] ~= '1' and redis.call('EXISTS', KEYS[4]) == 0 then "
    "  local ok, meta = pcall(cjson.decode, m[1]) "
    "  if ok and type(meta.file) == 'table' and "
    "     (type(meta.created) ~= 'number' or tonumber(ARGV[2]) - meta.created > tonumber(ARGV[3])) then "
    "    redis.call('DEL', KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7]) redis.call('SREM', KEYS[3], ARGV[1]) "
    "    return false end end "
    "return {m[1], m[2] or '0', m[3] or '0', m[4] or '0', redis.call('EXISTS', KEYS[2])}";

static int owned_read(store *st, const char *owned, const char *id, store_owned_session *out, int *gone, char *err,
                      size_t errlen) {
    char k[6][96], now[32], abandoned[32];
    const char *what[] = {"meta", "snap", "lease", "log", "idx", "want"};
    for (int i = 0; i < 6; i++) key(k[i], sizeof k[i], id, what[i]);
    snprintf(now, sizeof now, "%lld", (long long)time(NULL));
    snprintf(abandoned, sizeof abandoned, "%d", ABANDONED_S);
    const char *argv[] = {"EVAL", OWNED_SCRIPT, "7", k[0], k[1], owned, k[2], k[3], k[4], k[5], id, now, abandoned};
    redisReply *r = command_str(st, 13, argv, err, errlen);
    if (!r) return -1;
    *gone = r->type != REDIS_REPLY_ARRAY || r->elements != 5 || r->element[0]->type != REDIS_REPLY_STRING;
    if (!*gone) {
        redisReply **e = r->element;
        snprintf(out->id, sizeof out->id, "%s", id);
        out->meta = strndup(e[0]->str, e[0]->len);
        out->final = e[1]->type == REDIS_REPLY_STRING && !strcmp(e[1]->str, "1");
        out->bytes = e[2]->type == REDIS_REPLY_STRING ? strtoull(e[2]->str, NULL, 10) : 0;
        out->last_seq = e[3]->type == REDIS_REPLY_STRING ? strtoull(e[3]->str, NULL, 10) : 0;
        out->snapshot = e[4]->type == REDIS_REPLY_INTEGER && e[4]->integer == 1;
    }
    freeReplyObject(r);
    if (!*gone && !out->meta) return set_err(err, errlen, "out of memory"), -1;
    return 0;
}

int redis_store_owned(store *st, const char *owner, const char *id, store_owned_session **out, size_t *n, char *err,
                      size_t errlen) {
    char owned[96];
    owner_key(owned, sizeof owned, owner);
    redisReply *ids = NULL;
    size_t want = 1;
    if (!id) {
        const char *argv[] = {"SMEMBERS", owned};
        if (!(ids = command_str(st, 2, argv, err, errlen))) return -1;
        want = ids->type == REDIS_REPLY_ARRAY ? ids->elements : 0;
    }
    store_owned_session *f = calloc(want ? want : 1, sizeof *f);
    int rc = f ? 0 : (set_err(err, errlen, "out of memory"), -1);
    size_t got = 0;
    for (size_t i = 0; !rc && i < want; i++) {
        const char *one = id ? id : ids->element[i]->type == REDIS_REPLY_STRING ? ids->element[i]->str : NULL;
        int gone = 1;
        if (one && strlen(one) < sizeof f->id) rc = owned_read(st, owned, one, &f[got], &gone, err, errlen);
        if (!rc && !gone) got++;
    }
    if (ids) freeReplyObject(ids);
    if (rc) return store_owned_free(f, got + 1), -1;
    *out = f;
    *n = got;
    return 0;
}

/* ---- snapshots ---- */

static const char SNAP_SCRIPT[] =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then "
    "  return redis.error_reply('FENCED the session lease is held by another replica') end "
    "redis.call('SET', KEYS[2], ARGV[2]) return 1";

int redis_snapshot_put(redis_log *l, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return set_err(err, errlen, "cannot read %s: %s", path, strerror(errno)), -1;
    char *data = NULL;
    long n = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
    if (n >= 0 && !fseek(f, 0, SEEK_SET) && (data = malloc((size_t)n + 1)) &&
        fread(data, 1, (size_t)n, f) != (size_t)n)
        n = -1;
    fclose(f);
    unlink(path); /* Redis holds the snapshot: the local copy was only on its way there */
    if (n < 0 || !data) {
        free(data);
        return set_err(err, errlen, "cannot read %s", path), -1;
    }
    char lease[96], snap[96];
    key(lease, sizeof lease, l->id, "lease");
    key(snap, sizeof snap, l->id, "snap");
    const char *argv[] = {"EVAL", SNAP_SCRIPT, "2", lease, snap, l->token, data};
    size_t lens[7];
    for (int i = 0; i < 6; i++) lens[i] = strlen(argv[i]);
    lens[6] = (size_t)n;
    redisReply *r = command(l->st, 7, argv, lens, err, errlen);
    free(data);
    if (!r) return -1;
    freeReplyObject(r);
    return 0;
}

int redis_snapshot_get(redis_log *l, const char *path, char *err, size_t errlen) {
    char snap[96];
    key(snap, sizeof snap, l->id, "snap");
    const char *argv[] = {"GET", snap};
    redisReply *r = command_str(l->st, 2, argv, err, errlen);
    if (!r) return -1;
    if (r->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        return 1;
    }
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(r->str, 1, r->len, f) == r->len ? 0 : -1;
    if (f && fclose(f)) rc = -1;
    if (rc) set_err(err, errlen, "cannot write %s: %s", path, strerror(errno));
    freeReplyObject(r);
    return rc;
}
