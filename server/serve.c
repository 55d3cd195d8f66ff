/* `potserve serve`: settings, model, engine thread, sessions restored from
 * disk, then one libuv loop driving libmicrohttpd (no MHD threads): a
 * uv_poll_t on MHD's epoll descriptor and a uv_timer_t following
 * MHD_get_timeout both call MHD_run. SIGTERM/SIGINT drain and exit 0. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "server/server.h"
#include "server/server_internal.h"

extern char **environ;

struct srv_event {
    srv_event_fn fn;
    void *arg;
    srv_event *next;
};

void srv_post(server *s, srv_event_fn fn, void *arg) {
    srv_event *ev = malloc(sizeof *ev);
    if (!ev) { /* cannot queue: run nothing rather than crash; the caller's work is lost */
        fprintf(stderr, "potserve: out of memory posting an event\n");
        abort();
    }
    *ev = (srv_event){fn, arg, NULL};
    pthread_mutex_lock(&s->ev_lock);
    if (s->ev_tail) s->ev_tail->next = ev;
    else s->ev_head = ev;
    s->ev_tail = ev;
    pthread_mutex_unlock(&s->ev_lock);
    uv_async_send(&s->wake);
}

static void on_wake(uv_async_t *h) {
    server *s = h->data;
    pthread_mutex_lock(&s->ev_lock);
    srv_event *ev = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    pthread_mutex_unlock(&s->ev_lock);
    while (ev) {
        srv_event *next = ev->next;
        ev->fn(s, ev->arg);
        free(ev);
        ev = next;
    }
    srv_kick(s);
}

/* ---- the engine thread, as seen from the loop: after shutdown began every
 * call fails cleanly instead of touching a freed scheduler ---------------------- */

int srv_task(server *s, engine_doc *d, engine_task_fn fn, void *user) {
    return s->sched ? engine_sched_doc_task(s->sched, d, fn, user) : -1;
}

int srv_ingest(server *s, engine_doc *d, const char *bytes, size_t n, int final,
               engine_ingest_done_fn done, void *user) {
    return s->sched ? engine_sched_ingest(s->sched, d, bytes, n, final, done, user) : -1;
}

int srv_generate(server *s, const engine_gen_request *r, char *err, size_t errlen) {
    if (s->sched) return engine_sched_generate(s->sched, r, err, errlen);
    snprintf(err, errlen, "the server is shutting down");
    return -1;
}

/* ---- libmicrohttpd driven from the loop -------------------------------------------- */

static void on_mhd_timer(uv_timer_t *t);

/* MHD asks to be run again at once (a timeout of 0) by the loop's next
 * iteration (mhd_soon, an idle handle), never by a timer of 0 ms: libuv 1.44
 * runs a timer armed at 0 from a timer's callback again in the same pass, its
 * clock unchanged, so a connection MHD keeps asking for at once (libmicrohttpd
 * 0.9.75 does for some until their idle timeout) held every other timer, the
 * pool's answers and the engine's events for that long.
 * Such a connection (a chunk-size line longer than MHD's buffer is one: MHD
 * neither reads nor closes it) would still make every iteration run MHD, one
 * core busy until its idle timeout; so once MHD has asked to run at once for
 * MHD_STUCK_MS without calling the server once (no request, body byte, answer
 * byte or connection event), it runs every MHD_STUCK_TICK_MS instead until it
 * stops asking or makes progress. Sockets' own events still run it at once. */
enum { MHD_STUCK_MS = 20, MHD_STUCK_TICK_MS = 5 };

static void arm_mhd_timer(server *s) {
    MHD_UNSIGNED_LONG_LONG timeout;
    uint64_t ms = 1000;
    if (MHD_get_timeout(s->mhd, &timeout) == MHD_YES) ms = timeout < 1000 ? timeout : 1000;
    if (ms) {
        s->mhd_zero_since = 0;
        s->mhd_stuck = 0;
    } else {
        double now = monotonic_ms();
        if (!s->mhd_zero_since || s->mhd_calls != s->mhd_zero_calls) {
            s->mhd_zero_since = now;
            s->mhd_zero_calls = s->mhd_calls;
            s->mhd_stuck = 0;
        }
        if (now - s->mhd_zero_since < MHD_STUCK_MS) return srv_kick_soon(s);
        if (!s->mhd_stuck) s->mhd_stuck = 1, s->mhd_stuck_episodes++;
        ms = MHD_STUCK_TICK_MS;
    }
    uv_timer_start(&s->mhd_timer, on_mhd_timer, ms, 0);
}

void srv_kick(server *s) {
    if (!s->mhd) return;
    MHD_run(s->mhd);
    arm_mhd_timer(s);
}

static void on_mhd_timer(uv_timer_t *t) { srv_kick(t->data); }

static void on_mhd_soon(uv_idle_t *h) {
    uv_idle_stop(h);
    srv_kick(h->data);
}

void srv_kick_soon(server *s) {
    if (s->mhd && !uv_is_closing((uv_handle_t *)&s->mhd_soon)) uv_idle_start(&s->mhd_soon, on_mhd_soon);
}

static void on_mhd_poll(uv_poll_t *p, int status, int events) {
    (void)status;
    (void)events;
    srv_kick(p->data);
}

/* ---- housekeeping and shutdown ------------------------------------------------------ */

static void close_handles(server *s) {
    if (s->mhd_poll.loop) { /* only once start_http got that far: a start-up error comes here too */
        uv_poll_stop(&s->mhd_poll);
        uv_close((uv_handle_t *)&s->mhd_poll, NULL);
    }
    uv_timer_stop(&s->mhd_timer);
    uv_idle_stop(&s->mhd_soon);
    uv_close((uv_handle_t *)&s->mhd_soon, NULL);
    uv_timer_stop(&s->housekeeping);
    uv_timer_stop(&s->leases);
    uv_close((uv_handle_t *)&s->leases, NULL);
    uv_timer_stop(&s->bg_follow);
    uv_close((uv_handle_t *)&s->bg_follow, NULL);
    uv_timer_stop(&s->bg_ship);
    uv_close((uv_handle_t *)&s->bg_ship, NULL);
    uv_signal_stop(&s->sig_term);
    uv_signal_stop(&s->sig_int);
    uv_close((uv_handle_t *)&s->mhd_timer, NULL);
    uv_close((uv_handle_t *)&s->housekeeping, NULL);
    uv_close((uv_handle_t *)&s->sig_term, NULL);
    uv_close((uv_handle_t *)&s->sig_int, NULL);
    uv_close((uv_handle_t *)&s->wake, NULL);
}

/* Requests whose client is still connected. */
static int open_requests(server *s) {
    int n = 0;
    for (request *r = s->live; r; r = r->next_live) n += r->conn != NULL || (r->bg && !r->status);
    return n;
}

enum { SNAPSHOTS_AT_STOP_MS = 60000 }; /* the most a stop waits for its last snapshots */

static void on_housekeeping(uv_timer_t *t) {
    server *s = t->data;
    double now = monotonic_ms();
    /* how late this tick is: the longest time the loop was held from its timers (/metrics) */
    double late = s->housekeeping_ms ? now - s->housekeeping_ms - (double)uv_timer_get_repeat(t) : 0;
    if (late > s->loop_lag_max_ms) s->loop_lag_max_ms = late;
    s->housekeeping_ms = now;
    srv_sweep_connections(s);
    generations_sweep(s);
    for (request *r = s->live; r; r = r->next_live) /* keep idle streams alive */
        if (r->conn && (r->out_cap || r->follows) && !r->out_done && now - r->last_write_ms > 15000)
            stream_write(r, ": ping\n\n", 8);
    if (!s->draining) {
        sessions_expire(s);
        return;
    }
    if (s->snapshots_deadline > 0) { /* (snapshot_saved stops the loop after the last one) */
        if ((!sessions_saving(s) && !background_pending(s)) || now > s->snapshots_deadline) uv_stop(s->loop);
        return;
    }
    /* draining: wait for open requests, disk work and acknowledged chunks' ingests, at most
     * shutdown_grace; what is still open then (an upload whose client went quiet) ends
     * unacknowledged, and the ingests stop (their chunks are in the log) */
    int done = (open_requests(s) == 0 && !sessions_ingesting(s)) || now > s->drain_deadline;
    if (done) {
        sessions_stop_ingests(s);
        for (session *ss = s->sessions; ss; ss = ss->next)
            if (!ss->acked_ingests) session_snapshot(s, ss);
        background_stop_all(s); /* stored as failed, not left queued (the loop waits for them below) */
        atomic_store(&s->abandon_replays, 1); /* restores under way end at their next engine chunk */
        fprintf(stderr, "potserve: drained, stopping\n");
        /* the loop runs on until the snapshots are written: a shared store's leases are still
           renewed meanwhile (a snapshot written after its lease lapsed is refused, FENCED) */
        s->snapshots_deadline = now + SNAPSHOTS_AT_STOP_MS;
        if (!sessions_saving(s) && !background_pending(s)) uv_stop(s->loop);
    }
}

static int make_dir(const char *path, char *err, size_t errlen) {
    if (mkdir(path, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "data_dir: cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* One server a data directory: a second one on it failed the first's sessions
 * ("already open elsewhere") and could delete them. The lock lives as long as
 * the process (its descriptor is never closed; a killed server's goes with it). */
static int lock_data_dir(const char *dir, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) /* (a read-only mount) */
        return snprintf(err, errlen, "data_dir: %.300s is not writable: %s", dir, strerror(errno)), -1;
    if (fd < 0) return snprintf(err, errlen, "data_dir: cannot open %.300s: %s", path, strerror(errno)), -1;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
    int e = errno;
    close(fd);
    if (e == EWOULDBLOCK)
        return snprintf(err, errlen, "data_dir: %.300s is in use by another potserve (it holds its .lock)", dir), -1;
    return snprintf(err, errlen, "data_dir: cannot lock %.300s: %s", path, strerror(e)), -1;
}

static void on_leases(uv_timer_t *t) {
    sessions_renew_leases(t->data);
    background_renew(t->data);
}

/* Opens the session store; a shared one gets its lease renewals and a local
 * scratch directory (data_dir/cache) for snapshots on their way. */
static int open_store(server *s, char *err, size_t errlen) {
    char name[STORE_TOKEN_MAX - 32], host[64] = "localhost";
    gethostname(host, sizeof host - 1); /* replicas in containers share host and port, not hostnames */
    if (*s->cfg.replica_name) snprintf(name, sizeof name, "%s", s->cfg.replica_name);
    else snprintf(name, sizeof name, "%s:%lld", host, (long long)s->cfg.port);
    s->st = store_open(s->cfg.store, s->cfg.data_dir, !strcmp(s->cfg.durability, "fsync"), s->cfg.lease_ms,
                       name, err, errlen);
    if (!s->st) return -1;
    if (!store_is_shared(s->st)) return 0;
    char cache[4096];
    snprintf(cache, sizeof cache, "%s/cache", s->cfg.data_dir);
    if (make_dir(cache, err, errlen)) return -1;
    uv_timer_start(&s->leases, on_leases, (uint64_t)s->cfg.lease_ms / 3, (uint64_t)s->cfg.lease_ms / 3);
    char where[256];
    store_describe(s->st, where, sizeof where);
    fprintf(stderr, "potserve: sessions in %s, replica %s\n", where, name);
    return 0;
}

static void on_signal(uv_signal_t *h, int signum) {
    server *s = h->data;
    if (s->draining) return;
    /* still listening: /health answers 503 "draining" and every other request
     * 503 shutting_down, each with Connection: close, until the drain ends */
    fprintf(stderr, "potserve: %s: draining (new requests get 503)\n", strsignal(signum));
    s->draining = 1;
    s->drain_deadline = monotonic_ms() + 1e3 * (double)s->cfg.shutdown_grace;
    s->housekeeping_ms = 0; /* (its ticks come each 100 ms from now: no lateness measured across the change) */
    uv_timer_start(&s->housekeeping, on_housekeeping, 0, 100);
}

/* ---- startup ------------------------------------------------------------------------ */

extern enum MHD_Result srv_access_handler(void *cls, struct MHD_Connection *c, const char *url,
                                          const char *method, const char *version,
                                          const char *upload_data, size_t *upload_data_size,
                                          void **con_cls);
extern void srv_connection_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                                  enum MHD_ConnectionNotificationCode toe);
extern void srv_request_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                                  enum MHD_RequestTerminationCode toe);

/* Every session keeps its chunk log open (one descriptor each, paged out or not), besides the
 * connections and the snapshots being written: the usual soft limit of 1,024 would refuse new
 * sessions ("Too many open files") of a server with many keys long before its hard limit, so
 * the soft limit is raised to the hard one at start (as Redis does). MHD runs on epoll, so
 * descriptors past FD_SETSIZE are fine. */
static void raise_open_files_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20) ? (1u << 20) : rl.rlim_max;
    if (rl.rlim_cur >= want) return;
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl))
        fprintf(stderr, "potserve: open files limit stays %llu: %s\n", (unsigned long long)was, strerror(errno));
    else
        fprintf(stderr, "potserve: open files limit raised from %llu to %llu\n", (unsigned long long)was,
                (unsigned long long)want);
}

static int start_http(server *s, char *err, size_t errlen) {
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg.port)};
    if (inet_pton(AF_INET, s->cfg.host, &addr.sin_addr) != 1) {
        snprintf(err, errlen, "host: '%s' is not an IPv4 address", s->cfg.host);
        return -1;
    }
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)s->cfg.port, NULL, NULL, srv_access_handler, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&addr, MHD_OPTION_NOTIFY_COMPLETED, srv_request_completed, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_connections_per_ip,
        MHD_OPTION_NOTIFY_CONNECTION, srv_connection_notify, s,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg.idle_timeout,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(s->cfg.max_header_bytes + 64 * 1024),
        MHD_OPTION_END);
    if (!s->mhd) {
        snprintf(err, errlen, "cannot listen on %s:%lld: %s", s->cfg.host, (long long)s->cfg.port,
                 strerror(errno));
        return -1;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    const union MHD_DaemonInfo *port = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    if (!info || uv_poll_init(s->loop, &s->mhd_poll, info->epoll_fd)) {
        snprintf(err, errlen, "cannot watch the HTTP daemon's epoll descriptor");
        return -1;
    }
    s->mhd_poll.data = s;
    uv_poll_start(&s->mhd_poll, UV_READABLE, on_mhd_poll);
    fprintf(stderr, "potserve: listening on http://%s:%u\n", s->cfg.host,
            port ? port->port : (unsigned)s->cfg.port);
    fflush(stderr);
    return 0;
}

static int open_engine(server *s, char *err, size_t errlen) {
    engine_options eo = {.n_threads = (int)s->cfg.threads,
                         .chat_template = *s->cfg.chat_template ? s->cfg.chat_template : NULL,
                         .backend = s->cfg.backend};
    char why[384];
    s->eng = engine_open(s->cfg.model, &eo, why, sizeof why);
    if (!s->eng) {
        snprintf(err, errlen, "%s", why);
        return -1;
    }
    engine_get_info(s->eng, &s->info);
    /* a default that makes no session (beyond the window, or not beside the policy's scoring rows) is
       lowered, else every session made with it would be refused */
    engine_pot_settings dflt = engine_pot_settings_default();
    dflt.budget_tokens = (int32_t)s->cfg.budget_tokens;
    dflt.policy = s->cfg.policy;
    if (engine_doc_check(s->eng, &dflt, why, sizeof why)) {
        fprintf(stderr, "potserve: budget_tokens lowered from %lld to %d: half of the model's window (%d tokens): %s\n",
                (long long)s->cfg.budget_tokens, s->info.n_ctx_train / 2, s->info.n_ctx_train, why);
        s->cfg.budget_tokens = dflt.budget_tokens = s->info.n_ctx_train / 2;
        if (engine_doc_check(s->eng, &dflt, why, sizeof why))
            return snprintf(err, errlen, "the default session settings make no session: %s", why), -1;
    }
    /* pots in device memory: admission control counts them against the device too */
    size_t dev = engine_pot_device_memory(s->eng);
    if (dev && (int64_t)dev < s->cfg.pot_memory_limit) {
        fprintf(stderr, "potserve: pot_memory_limit lowered to %zu MiB: what the device holds for pots\n",
                dev >> 20);
        s->cfg.pot_memory_limit = (int64_t)dev;
    }
    const char *base = strrchr(s->cfg.model, '/');
    snprintf(s->model_id, sizeof s->model_id, "%s", base ? base + 1 : s->cfg.model);
    char *dot = strstr(s->model_id, ".gguf");
    if (dot) *dot = 0;
    /* the prompt cache's budget is part of pot_memory_limit, held from the start */
    int64_t pc_bytes = s->cfg.prompt_cache_entries ? s->cfg.prompt_cache_bytes : 0;
    if (pc_bytes > s->cfg.pot_memory_limit / 2) { /* the pots keep at least half */
        pc_bytes = s->cfg.pot_memory_limit / 2;
        fprintf(stderr, "potserve: prompt_cache_bytes lowered to %lld MiB: half of pot_memory_limit\n",
                (long long)(pc_bytes >> 20));
    }
    if (pc_bytes && engine_set_prompt_cache(s->eng, (int)s->cfg.prompt_cache_entries, (size_t)pc_bytes)) {
        snprintf(err, errlen, "out of memory for the prompt cache");
        return -1;
    }
    s->pot_memory += (size_t)pc_bytes;
    s->pot_memory_held = (size_t)pc_bytes;
    size_t one = engine_doc_memory(s->eng, &dflt);
    if (one + s->pot_memory_held > (size_t)s->cfg.pot_memory_limit)
        fprintf(stderr, "potserve: pot_memory_limit (%lld MiB, %zu MiB of it the prompt cache's) holds no session of "
                "the default budget_tokens %lld (%zu MiB each): sessions need a smaller budget_tokens\n",
                (long long)(s->cfg.pot_memory_limit >> 20), s->pot_memory_held >> 20, (long long)s->cfg.budget_tokens,
                one >> 20);
    s->sched = engine_sched_new(s->eng, err, errlen);
    return s->sched ? 0 : -1;
}

double srv_request_deadline(const server *s) {
    return s->cfg.request_timeout ? monotonic_ms() + (double)s->cfg.request_timeout * 1e3 : 0;
}

int srv_timeout_retry_seconds(const server *s) {
    int64_t t = s->cfg.request_timeout;
    return t < 1 ? 1 : t > 30 ? 30 : (int)t;
}

int pot_memory_admit(server *s, size_t bytes, const char *param, const char *what, api_error *e) {
    size_t room = (size_t)s->cfg.pot_memory_limit - s->pot_memory_held;
    if (bytes > room)
        return api_fail(e, 422, "pot_too_large", param, "%s needs a pot of %zu bytes, more than the %zu of "
                        "pot_memory_limit there are for pots: it can never fit this server", what, bytes, room);
    return 0;
}

int cli_serve(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* a file size limit is a write error (EFBIG, answered 507), not death */
    server *s = calloc(1, sizeof *s);
    if (!s) return 1;
    char err[512] = "";
    config_defaults(&s->cfg);
    int rc = config_load(&s->cfg, argc, argv, environ, err, sizeof err);
    if (rc == 1) {
        config_print_help(stdout);
        config_free(&s->cfg);
        free(s);
        return 0;
    }
    int code = 1;
    uv_loop_t loop;
    if (rc) {
        fprintf(stderr, "potserve serve: %s\n", err);
        config_free(&s->cfg);
        free(s);
        return 2;
    }
    pthread_mutex_init(&s->ev_lock, NULL);
    s->stored = json_object();
    s->stored_read = json_object();
    s->started = (int64_t)time(NULL);
    s->loading = 1;
    s->heavy_max = srv_heavy_max();
    raise_open_files_limit();
    uv_loop_init(&loop);
    s->loop = &loop;
    uv_async_init(&loop, &s->wake, on_wake);
    uv_timer_init(&loop, &s->mhd_timer);
    uv_idle_init(&loop, &s->mhd_soon);
    uv_timer_init(&loop, &s->housekeeping);
    uv_timer_init(&loop, &s->leases);
    uv_timer_init(&loop, &s->bg_follow);
    uv_timer_init(&loop, &s->bg_ship);
    uv_signal_init(&loop, &s->sig_term);
    uv_signal_init(&loop, &s->sig_int);
    s->wake.data = s->mhd_timer.data = s->mhd_soon.data = s->housekeeping.data = s->leases.data = s->bg_follow.data = s->bg_ship.data = s->sig_term.data = s->sig_int.data = s;
    if (auth_load(s, err, sizeof err) || make_dir(s->cfg.data_dir, err, sizeof err) ||
        lock_data_dir(s->cfg.data_dir, err, sizeof err) || open_store(s, err, sizeof err) || open_engine(s, err, sizeof err) || start_http(s, err, sizeof err)) {
        fprintf(stderr, "potserve serve: %s\n", err);
        goto out;
    }
    uv_signal_start(&s->sig_term, on_signal, SIGTERM);
    uv_signal_start(&s->sig_int, on_signal, SIGINT);
    uv_timer_start(&s->housekeeping, on_housekeeping, 1000, 1000);
    /* sessions are replayed on the engine thread while /health says 503 */
    if (sessions_restore(s, err, sizeof err)) {
        fprintf(stderr, "potserve serve: %s\n", err);
        goto out;
    }
    srv_kick(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    code = 0;
out:
    /* the wait for the stop's snapshots is over: one that comes back now (a deleted session's,
       not waited for) must not stop the loop that closes the handles below */
    s->snapshots_deadline = 0;
    if (s->sched) engine_sched_free(s->sched); /* cancels generations, runs queued tasks */
    s->sched = NULL;
    on_wake(&s->wake);                          /* deliver what the engine said last */
    if (s->st) sessions_release_leases(s);
    s->stopping = 1; /* nothing suspends any more: MHD refuses to stop with suspended connections */
    for (request *r = s->live; r; r = r->next_live) request_wake(r);
    if (s->mhd) {
        /* the answers the engine's last words completed go out whole (a stream's last chunk and
           its terminator): a resumed connection takes MHD a round to resume and one to write */
        for (int i = 0; i < 50; i++) {
            MHD_run(s->mhd);
            if (!open_requests(s)) break;
            usleep(10000);
        }
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
    }
    on_wake(&s->wake);
    close_handles(s);
    uv_run(&loop, UV_RUN_DEFAULT);
    sessions_free_all(s);
    stored_free(s);
    background_logs_free(s);
    store_close(s->st);
    if (uv_loop_close(&loop)) { /* a handle not closed: the exit lost track of something */
        fprintf(stderr, "potserve: the event loop still had open handles at exit\n");
        if (!code) code = 1;
    }
    engine_close(s->eng);
    for (size_t i = 0; i < s->n_keys; i++) free(s->keys[i].key);
    free(s->keys);
    config_free(&s->cfg);
    pthread_mutex_destroy(&s->ev_lock);
    free(s);
    return code;
}
