/* OpenAI's Files API over sessions: a file is a session whose document is the
 * file's text, read into its pot as it is uploaded.
 *
 * POST /v1/files takes the official clients' multipart form (purpose, then
 * file; optionally expires_after[anchor]/[seconds] and potserve's "settings",
 * a session's settings as JSON). The form is read as it arrives (multipart.c);
 * at the file part it pauses, the session is created with the file's name and
 * purpose in its meta, and the file's bytes go through the session's upload
 * path (sessions.c: log, durability, UTF-8 check, back-pressure) as its one,
 * final chunk; the answer (the file object) comes once the file is durable,
 * while its pot is still being read ("status": "uploaded", then "processed").
 * An upload that fails leaves no file: its session expires at once and the
 * once-a-second sweep removes it; one cut by a crash is removed at the next
 * start (its log never ended).
 *
 * A question names a file as OpenAI's do: a chat message's part
 * {"type": "file", "file": {"file_id": ...}} (a Responses input_file part
 * becomes one), which makes the file's session the question's; a part's
 * inline file_data is decoded into the message as text. Loop thread. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "server/multipart.h"
#include "server/reread.h"
#include "server/server_internal.h"

enum { FIELD_MAX = 64, SETTINGS_MAX = 65536 };

struct file_form {
    request *r;
    multipart mp;
    enum { IN_NONE, IN_FIELD, IN_FILE } in;
    char field[FIELD_MAX];
    char *value; /* the current field's value as it comes */
    size_t value_len, value_cap;
    char purpose[32];
    char *settings; /* the "settings" field: a session's settings as JSON */
    char anchor[32];
    char seconds[24];
    char filename[256];
    int file_seen;
    uint64_t file_bytes;
    int creating;    /* paused at the file part while its session is created */
    int backlogged;  /* the upload asked to stop reading until the engine catches up */
    int failed;      /* refused (err): the rest of the body is dropped, then answered */
    upload *u;       /* the file's upload once its session exists (r->up too) */
    api_error err;
};

static const char *const purposes[] = {"assistants", "batch", "fine-tune", "vision", "user_data", "evals", NULL};

void file_id_of(const char *session_id, char *out, size_t cap) {
    snprintf(out, cap, "file-%s", session_id + 5); /* "sess_" + its own part */
}

/* The session id a file id names, or NULL when it is not one ("sess_" ids too: a
 * session made by POST /v1/sessions can stand for a file in a question). */
static const char *session_of_file(const char *id, char *out, size_t cap) {
    const char *own = !strncmp(id, "file-", 5) ? id + 5 : !strncmp(id, "sess_", 5) ? id + 5 : NULL;
    size_t n = own ? strlen(own) : 0;
    if (!own || n < 5 || n > 35) return NULL;
    for (const char *p = own; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'))) return NULL;
    snprintf(out, cap, "sess_%s", own);
    return out;
}

static int session_expired_now(const session *ss) { return ss->expires && (int64_t)time(NULL) > ss->expires; }

/* An upload that made no file: its session goes (sessions_expire removes it once idle). */
static void forget_file(session *ss) { ss->expires = 1; }

/* OpenAI's file object. */
static json_t *file_object(const char *session_id, uint64_t bytes, int64_t created, int64_t expires, json_t *file,
                           const char *status, const char *details) {
    char fid[48];
    file_id_of(session_id, fid, sizeof fid);
    const char *filename = json_string_value(json_object_get(file, "filename"));
    const char *purpose = json_string_value(json_object_get(file, "purpose"));
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:s}", "id", fid, "object", "file", "bytes",
                          (json_int_t)bytes, "created_at", (json_int_t)created, "filename", filename ? filename : "",
                          "purpose", purpose ? purpose : "", "status", status, "session", session_id);
    json_object_set_new(o, "status_details", details ? json_string(details) : json_null());
    json_object_set_new(o, "expires_at", expires ? json_integer(expires) : json_null());
    return o;
}

static json_t *file_json(const session *ss) {
    const char *status = ss->status == SESSION_FAILED ? "error" : session_reading(ss) ? "uploaded" : "processed";
    return file_object(ss->id, (uint64_t)ss->bytes_acked, ss->created, ss->expires, ss->file, status,
                       ss->status == SESSION_FAILED ? ss->fail_msg : NULL);
}

/* A shared store's file as the store holds it, for key; NULL when it is not
 * one of key's files now (another key's, its upload never ended, expired).
 * "processed" once its pot's snapshot is there: the replica reading it writes
 * one when the whole file has been read. */
static json_t *stored_file_json(const store_owned_session *sf, const api_key *key) {
    json_t *meta = json_loads(sf->meta, 0, NULL), *o = NULL;
    json_t *file = json_object_get(meta, "file");
    const char *owner = json_string_value(json_object_get(meta, "owner"));
    int64_t created = (int64_t)json_integer_value(json_object_get(meta, "created")), expires = meta_expires(meta);
    if (json_is_object(file) && owner && !strcmp(owner, key->owner) && sf->final &&
        !(expires && (int64_t)time(NULL) > expires))
        o = file_object(sf->id, sf->bytes, created, expires, file, sf->snapshot ? "processed" : "uploaded", NULL);
    json_decref(meta);
    return o;
}

/* A file of r's key held here, or NULL (answered 404 or as session_lookup answers). */
static session *file_lookup(request *r, const char *sid) {
    session *ss = session_find(r->srv, sid, r->key);
    if (ss && ss->file && !ss->final && !ss->busy && ss->status != SESSION_FAILED)
        forget_file(ss); /* (a shared store: taken over after the replica reading it died mid-file) */
    if (!ss || !ss->file || !ss->final || session_expired_now(ss) || ss->deleted) {
        api_error e;
        api_fail(&e, 404, "file_not_found", "file_id", "no file 'file-%s'", sid + 5);
        respond_error(r, &e);
        return NULL;
    }
    snprintf(r->session_id, sizeof r->session_id, "%s", ss->id);
    return session_lookup(r, sid, "file_id"); /* (a restore under way: 503 loading) */
}

/* ---- GET /v1/files -------------------------------------------------------------------------- */

typedef struct list_query {
    const char *purpose, *after;
    int64_t limit;
    int desc;
} list_query;

/* The query of GET /v1/files; 0, or -1 answered. */
static int list_query_parse(request *r, list_query *q) {
    api_error e;
    q->purpose = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "purpose");
    q->after = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "after");
    const char *order = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "order");
    const char *limit = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
    char err[128];
    q->limit = 10000;
    if (limit && config_parse_int("limit", limit, 1, 10000, &q->limit, err, sizeof err)) {
        api_fail(&e, 400, "invalid_value", "limit", "%s", err);
        return respond_error(r, &e), -1;
    }
    if (order && strcmp(order, "asc") && strcmp(order, "desc")) {
        api_fail(&e, 400, "invalid_value", "order", "order must be asc or desc, not '%.40s'", order);
        return respond_error(r, &e), -1;
    }
    q->desc = !order || !strcmp(order, "desc");
    return 0;
}

static int by_created(const void *a, const void *b) {
    json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    json_int_t cx = json_integer_value(json_object_get(x, "created_at"));
    json_int_t cy = json_integer_value(json_object_get(y, "created_at"));
    return cx != cy ? (cx < cy ? -1 : 1)
                    : strcmp(json_string_value(json_object_get(x, "id")), json_string_value(json_object_get(y, "id")));
}

/* Answers the page q asks of files (file objects; taken). */
static void answer_files_page(request *r, json_t *files, const list_query *q) {
    size_t n = 0, all = json_array_size(files);
    json_t **v = malloc((all ? all : 1) * sizeof *v);
    if (!v) {
        json_decref(files);
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    for (size_t i = 0; i < all; i++) {
        json_t *f = json_array_get(files, i);
        const char *purpose = json_string_value(json_object_get(f, "purpose"));
        if (!q->purpose || !strcmp(purpose, q->purpose)) v[n++] = f;
    }
    if (n) qsort(v, n, sizeof *v, by_created);
    if (q->desc)
        for (size_t i = 0; i < n / 2; i++) {
            json_t *t = v[i];
            v[i] = v[n - 1 - i];
            v[n - 1 - i] = t;
        }
    size_t from = 0;
    if (q->after) /* the page after that file (one gone since: from the start, as nothing matches) */
        for (size_t i = 0; i < n; i++)
            if (!strcmp(json_string_value(json_object_get(v[i], "id")), q->after)) from = i + 1;
    json_t *data = json_array();
    for (size_t i = from; i < n && (int64_t)(i - from) < q->limit; i++) json_array_append(data, v[i]);
    size_t shown = json_array_size(data);
    json_t *o = json_pack("{s:s, s:o, s:b}", "object", "list", "data", data, "has_more", from + shown < n);
    json_object_set(o, "first_id", shown ? json_object_get(json_array_get(data, 0), "id") : json_null());
    json_object_set(o, "last_id", shown ? json_object_get(json_array_get(data, shown - 1), "id") : json_null());
    free(v);
    json_decref(files);
    respond_json(r, 200, o);
}

/* A file held here as GET /v1/files shows it, or NULL when it is not one of key's now. */
static json_t *held_file_json(const session *ss, const api_key *key) {
    if (!ss->file || !ss->final || ss->deleted || session_expired_now(ss) || strcmp(ss->owner, key->owner))
        return NULL; /* (!final: its upload is still coming, and may yet leave no file) */
    return file_json(ss);
}

/* A shared store's files: read from the store (another replica may hold any of them). */
typedef struct files_ask {
    char id[48]; /* "": GET /v1/files */
    list_query q;
} files_ask;

static void files_read_done(request *r, store_owned_session *list, size_t n, void *user) {
    files_ask *a = user;
    server *s = r->srv;
    if (*a->id) { /* GET /v1/files/{id} of a file held elsewhere (or by none) */
        session *held = session_find(s, a->id, r->key); /* (taken here meanwhile) */
        json_t *o = held ? held_file_json(held, r->key) : n ? stored_file_json(&list[0], r->key) : NULL;
        if (o) {
            respond_json(r, 200, o);
        } else {
            api_error e;
            api_fail(&e, 404, "file_not_found", "file_id", "no file 'file-%s'", a->id + 5);
            respond_error(r, &e);
        }
    } else {
        json_t *files = json_array();
        for (size_t i = 0; i < n; i++) {
            session *held = session_find(s, list[i].id, r->key);
            json_t *o = held ? held_file_json(held, r->key) : stored_file_json(&list[i], r->key);
            if (o) json_array_append_new(files, o);
        }
        answer_files_page(r, files, &a->q);
    }
    free(a);
}

/* GET /v1/files, or GET /v1/files/{id} (sid: its session) of a file not held here. */
static void read_stored_files(request *r, const char *sid, const list_query *q) {
    files_ask *a = calloc(1, sizeof *a);
    if (!a) {
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    if (sid) snprintf(a->id, sizeof a->id, "%s", sid);
    if (q) a->q = *q;
    sessions_read_owned(r, sid, files_read_done, a);
}

static void list_files(request *r) {
    list_query q;
    if (list_query_parse(r, &q)) return;
    if (store_is_shared(r->srv->st)) return read_stored_files(r, NULL, &q);
    json_t *files = json_array();
    for (session *ss = r->srv->sessions; ss; ss = ss->next) {
        json_t *o = held_file_json(ss, r->key);
        if (o) json_array_append_new(files, o);
    }
    answer_files_page(r, files, &q);
}

/* ---- GET /v1/files/{id}/content ------------------------------------------------------------- */

typedef struct content_job {
    request *r;
    session *ss;
    session_log_text log;
} content_job;

static void content_read(server *s, void *user) {
    (void)s;
    content_job *j = user;
    request *r = j->r;
    if (j->log.rc && store_log_unreachable(j->ss->log)) { /* whole in Redis: a retry may read it */
        api_error e;
        api_fail(&e, 503, "store_unavailable", NULL, "cannot read the file now: %s", j->log.err);
        respond_retry(r, &e, 1);
        free(j->log.text);
    } else if (j->log.rc) {
        api_error e;
        api_fail(&e, 500, "storage_error", NULL, "cannot read the file: %s", j->log.err);
        respond_error(r, &e);
        free(j->log.text);
    } else {
        struct MHD_Response *resp = MHD_create_response_from_buffer(j->log.len, j->log.text ? j->log.text : (void *)"",
                                                                    j->log.text ? MHD_RESPMEM_MUST_FREE
                                                                                : MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Content-Type", "text/plain; charset=utf-8");
        r->bytes_out += j->log.len;
        respond_raw(r, 200, resp);
    }
    session_unref(j->ss);
    request_unref(r);
    free(j);
}

static void file_content(request *r, session *ss) {
    api_error e;
    const char *busy = session_log_busy(ss);
    if (busy) {
        api_fail(&e, 409, "file_busy", "file_id", "the file cannot be read now: %s", busy);
        return respond_retry(r, &e, 1);
    }
    content_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    j->r = r;
    j->ss = ss;
    session_ref(ss);
    request_ref(r);
    request_suspend(r);
    if (session_log_fetch(r->srv, ss, &j->log, content_read, j)) content_read(r->srv, j);
}

/* ---- POST /v1/files: the form --------------------------------------------------------------- */

static int form_error(file_form *f, int status, const char *code, const char *param, const char *msg) {
    if (!f->err.status) api_fail(&f->err, status, code, param, "%s", msg);
    return -1;
}

/* A form that cannot be taken: its upload, if it has begun, drops what it
 * holds now; the rest of the body is read and dropped, and the answer goes
 * once it has ended (form_answer_failure), as an upload's does. */
static void form_fail(file_form *f) {
    if (f->failed) return;
    f->failed = 1;
    if (f->u) upload_abort(f->u, &f->err);
}

static void form_answer_failure(file_form *f) {
    if (f->u) return upload_end(f->u); /* (the upload answers with f->err) */
    respond_error(f->r, &f->err);
}

/* The file's session settings (the form's "settings", its expiry) and its
 * meta; 0, or -1 with f->err. */
static int file_session_settings(file_form *f, api_session_settings *settings, json_t **file) {
    server *s = f->r->srv;
    api_error *e = &f->err;
    json_t *given = NULL;
    if (f->settings) {
        json_error_t je;
        given = json_loads(f->settings, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(given)) {
            int parsed = given != NULL;
            json_decref(given);
            return api_fail(e, 400, "invalid_value", "settings", "settings must be a JSON object of session settings%s%.80s",
                            parsed ? "" : ": ", parsed ? "" : je.text);
        }
    }
    int rc = api_parse_session_settings(given, s->info.n_ctx_train, (int32_t)s->cfg.budget_tokens, s->cfg.policy,
                                        settings, e);
    json_decref(given);
    if (rc) return -1;
    if (f->anchor[0] || f->seconds[0]) { /* OpenAI's expiry: anchored at creation, as ttl_seconds is */
        int64_t secs = 0;
        char err[128];
        if (strcmp(f->anchor, "created_at"))
            rc = api_fail(e, 400, "invalid_value", "expires_after[anchor]", "expires_after[anchor] must be created_at");
        else if (config_parse_int("expires_after[seconds]", f->seconds, 1, 2592000, &secs, err, sizeof err))
            rc = api_fail(e, 400, "invalid_value", "expires_after[seconds]", "%s", err);
        else if (settings->ttl_seconds)
            rc = api_fail(e, 400, "invalid_value", "expires_after[seconds]",
                          "give expires_after or settings' ttl_seconds, not both");
        settings->ttl_seconds = secs;
    }
    *file = rc ? NULL : json_pack("{s:s, s:s}", "filename", f->filename, "purpose", f->purpose);
    if (!rc && !*file) /* (a name that is not UTF-8: a JSON string cannot hold it) */
        rc = api_fail(e, 400, "invalid_value", "file", "the file's name is not UTF-8");
    if (rc) api_session_settings_free(settings);
    return rc;
}

void files_session_created(request *r, session *ss) {
    file_form *f = r->form;
    if (!ss) { /* a shared store: its takeover here failed (said in the log) */
        if (f && r->conn && !r->status) {
            f->failed = 1;
            api_fail(&f->err, 503, "store_unavailable", NULL, "the file's session could not be taken here: retry");
            request_wake(r); /* (answered at the body's end) */
        }
        return;
    }
    if (!f || !r->conn || r->status) return forget_file(ss); /* the client left meanwhile */
    f->u = upload_open(r, ss);
    if (!f->u) {
        forget_file(ss);
        f->failed = 1;
        api_fail(&f->err, 500, NULL, NULL, "out of memory");
        return request_wake(r); /* (answered at the body's end) */
    }
    r->up = f->u;
    f->creating = 0;
    snprintf(r->session_id, sizeof r->session_id, "%s", ss->id);
    request_wake(r); /* the rest of the form: the file's bytes */
}

void files_upload_answer(session *ss, int *status, json_t **body) {
    if (*status < 400) {
        json_decref(*body);
        *body = file_json(ss);
        *status = 200; /* (OpenAI's: the file exists, whatever its processing) */
        return;
    }
    forget_file(ss);
    json_t *err = json_object_get(*body, "error");
    const char *code = json_string_value(json_object_get(err, "code"));
    if (code && !strcmp(code, "invalid_utf8"))
        json_object_set_new(err, "message",
                            json_string("the file is not UTF-8 text: potserve reads text files (plain text, Markdown, "
                                        "HTML, code); nothing of it was kept"));
}

static int is_purpose(const char *v) {
    for (const char *const *p = purposes; *p; p++)
        if (!strcmp(*p, v)) return 1;
    return 0;
}

static int take_field(file_form *f) {
    const char *v = f->value ? f->value : "";
    if (!strcmp(f->field, "purpose")) {
        if (!is_purpose(v))
            return form_error(f, 400, "invalid_value", "purpose",
                              "purpose must be one of assistants, batch, fine-tune, vision, user_data, evals");
        snprintf(f->purpose, sizeof f->purpose, "%s", v);
    } else if (!strcmp(f->field, "expires_after[anchor]")) {
        snprintf(f->anchor, sizeof f->anchor, "%s", v);
    } else if (!strcmp(f->field, "expires_after[seconds]")) {
        snprintf(f->seconds, sizeof f->seconds, "%s", v);
    } else { /* settings */
        free(f->settings);
        f->settings = strdup(v);
    }
    return 0;
}

static int form_event(void *user, multipart_event ev, const multipart_part *pt, const char *data, size_t n) {
    file_form *f = user;
    switch (ev) {
    case MULTIPART_PART:
        if (f->file_seen)
            return form_error(f, 400, "invalid_value", pt->name,
                              "the file must be the form's last part (purpose and the other fields before it)");
        if (!strcmp(pt->name, "file")) {
            if (!f->purpose[0])
                return form_error(f, 400, "missing_field", "purpose", "purpose is required, before the file");
            snprintf(f->filename, sizeof f->filename, "%s", pt->has_filename && pt->filename[0] ? pt->filename : "file");
            f->file_seen = 1;
            f->in = IN_FILE;
            return 1; /* pause: its session first */
        }
        if (strcmp(pt->name, "purpose") && strcmp(pt->name, "settings") && strcmp(pt->name, "expires_after[anchor]") &&
            strcmp(pt->name, "expires_after[seconds]"))
            return form_error(f, 400, "unknown_parameter", pt->name,
                              "unknown form field: POST /v1/files takes file, purpose, expires_after[anchor], "
                              "expires_after[seconds] and settings");
        snprintf(f->field, sizeof f->field, "%s", pt->name);
        f->in = IN_FIELD;
        f->value_len = 0;
        if (f->value) f->value[0] = 0; /* (an empty part writes none: "" then, not the field before) */
        return 0;
    case MULTIPART_DATA:
        if (f->in == IN_FILE) {
            f->file_bytes += n;
            if (upload_take(f->u, data, n)) f->backlogged = 1;
            return 0;
        }
        if (f->value_len + n > (strcmp(f->field, "settings") ? FIELD_MAX : SETTINGS_MAX))
            return form_error(f, 400, "invalid_value", f->field, "a form field's value is too long");
        if (f->value_len + n + 1 > f->value_cap) {
            size_t cap = (f->value_len + n + 1) * 2;
            char *grown = realloc(f->value, cap);
            if (!grown) return form_error(f, 500, NULL, NULL, "out of memory");
            f->value = grown;
            f->value_cap = cap;
        }
        memcpy(f->value + f->value_len, data, n);
        f->value_len += n;
        f->value[f->value_len] = 0;
        if (strlen(f->value) != f->value_len) return form_error(f, 400, "invalid_value", f->field, "a form field holds NUL");
        return 0;
    case MULTIPART_PART_END:
        if (f->in == IN_FILE) {
            if (!f->file_bytes) return form_error(f, 400, "invalid_value", "file", "the file is empty");
        } else if (take_field(f)) {
            return -1;
        }
        f->in = IN_NONE;
        return 0;
    case MULTIPART_END:
        return 0;
    }
    return 0;
}

void files_receive(request *r, const char *data, size_t *size) {
    file_form *f = r->form;
    if (f->failed) { /* the rest is dropped; the answer comes at the end */
        if (!*size) form_answer_failure(f);
        *size = 0;
        return;
    }
    if (*size) {
        if (f->creating) return; /* (held until the session exists) */
        size_t used = 0;
        int rc = multipart_feed(&f->mp, data, *size, &used, form_event, f);
        if (rc < 0) {
            *size = 0;
            if (!f->err.status) api_fail(&f->err, 400, "invalid_multipart", NULL, "%s", f->mp.err);
            return form_fail(f);
        }
        *size -= used;
        if (rc == 1) { /* the file part: its session is made before its bytes are read */
            api_session_settings settings;
            json_t *file = NULL;
            if (file_session_settings(f, &settings, &file)) {
                *size = 0;
                return form_fail(f);
            }
            f->creating = 1;
            request_suspend(r); /* (session_create's own refusals are answered at the body's end) */
            return session_create(r, &settings, file);
        }
        if (f->backlogged) { /* the upload's own back-pressure: woken when the engine catches up */
            f->backlogged = 0;
            request_suspend(r);
        }
        return;
    }
    /* the body has ended */
    if (multipart_finish(&f->mp)) {
        if (!f->err.status) api_fail(&f->err, 400, "invalid_multipart", NULL, "%s", f->mp.err);
        form_fail(f);
        return form_answer_failure(f);
    }
    if (!f->file_seen) {
        form_error(f, 400, "missing_field", "file", "the form has no file");
        form_fail(f);
        return form_answer_failure(f);
    }
    upload_end(f->u);
}

void files_form_free(file_form *f) {
    free(f->value);
    free(f->settings);
    free(f);
}

static void start_form(request *r) {
    server *s = r->srv;
    api_error e;
    const char *ct = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Content-Type");
    const char *len = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Content-Length");
    /* the form's own parts come on top of the file: a megabyte of room for them */
    if (len && strtoull(len, NULL, 10) > (unsigned long long)s->cfg.max_chunk_bytes + (1u << 20)) {
        api_fail(&e, 413, "file_too_large", NULL, "the file exceeds max_chunk_bytes (%lld)", (long long)s->cfg.max_chunk_bytes);
        return respond_error(r, &e);
    }
    file_form *f = calloc(1, sizeof *f);
    if (!f) {
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    f->r = r;
    if (multipart_init(&f->mp, ct)) {
        api_fail(&e, 415, "unsupported_media_type", NULL, "%s (as the OpenAI clients and curl -F send it)", f->mp.err);
        files_form_free(f);
        return respond_error(r, &e);
    }
    r->form = f;
}

/* ---- a question's file parts --------------------------------------------------------------- */

/* Standard base64 (padding optional, no line breaks) into a new string; NULL when malformed. */
static char *base64_decode(const char *in, size_t n, size_t *out_len) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    while (n && in[n - 1] == '=') n--;
    if (n % 4 == 1) return NULL;
    char *out = malloc(n / 4 * 3 + 3);
    if (!out) return NULL;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = in[i] ? strchr(alphabet, in[i]) : NULL;
        if (!p) {
            free(out);
            return NULL;
        }
        acc = acc << 6 | (uint32_t)(p - alphabet);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (char)(acc >> bits & 0xff);
        }
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

/* A file_data part's text: "data:<type>;base64,<data>" or bare base64 of UTF-8 text. */
static json_t *inline_file_text(const char *data, api_error *e) {
    const char *b64 = data;
    if (!strncmp(data, "data:", 5)) {
        const char *comma = strchr(data, ',');
        if (!comma || comma - data < 12 || strncmp(comma - 7, ";base64", 7)) {
            api_fail(e, 400, "invalid_value", "messages", "file_data must be base64: data:<type>;base64,<data>");
            return NULL;
        }
        b64 = comma + 1;
    }
    size_t n = 0;
    char *text = base64_decode(b64, strlen(b64), &n);
    json_t *t = text ? json_stringn(text, n) : NULL; /* (NULL when not UTF-8 or holding NUL) */
    if (t && strlen(text) != n) json_decref(t), t = NULL;
    free(text);
    if (!t)
        api_fail(e, 400, "invalid_value", "messages",
                 text ? "file_data is not UTF-8 text: potserve reads text files" : "file_data is not valid base64");
    return t;
}

int files_in_messages(request *r, json_t *body, api_error *e, int *retry_after) {
    *retry_after = 0;
    json_t *msgs = json_object_get(body, "messages");
    if (!json_is_array(msgs)) return 0; /* (the parser says what is wrong) */
    char sid[48] = "";
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *content = json_object_get(json_array_get(msgs, i), "content");
        if (!json_is_array(content)) continue;
        int files = 0;
        for (size_t k = 0; k < json_array_size(content);) {
            json_t *part = json_array_get(content, k);
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!type || strcmp(type, "file")) {
                k++;
                continue;
            }
            json_t *file = json_object_get(part, "file");
            const char *id = json_string_value(json_object_get(file, "file_id"));
            const char *data = json_string_value(json_object_get(file, "file_data"));
            if (!!id == !!data)
                return api_fail(e, 400, "invalid_value", "messages",
                                "messages[%zu].content[%zu]: a file part needs file.file_id or file.file_data", i, k);
            if (data) { /* its text, in its place */
                json_t *text = inline_file_text(data, e);
                if (!text) return -1;
                json_array_set_new(content, k++, json_pack("{s:s, s:o}", "type", "text", "text", text));
                continue;
            }
            char named[48];
            if (!session_of_file(id, named, sizeof named)) {
                api_fail(e, 404, "file_not_found", "messages", "no file '%.60s'", id);
                return -1;
            }
            if (*sid && strcmp(sid, named))
                return api_fail(e, 400, "invalid_value", "messages",
                                "a question reads one file (or session): this one names %.60s and another", id);
            snprintf(sid, sizeof sid, "%s", named);
            json_array_remove(content, k);
            files++;
        }
        if (files && !json_array_size(content)) { /* a message that was only the file: the pot stands for it */
            json_array_remove(msgs, i--);
        }
    }
    if (!*sid) return 0;
    if (!json_array_size(msgs))
        return api_fail(e, 400, "invalid_value", "messages", "ask something about the file: the messages hold only it");
    const char *given = json_string_value(json_object_get(body, "session"));
    if (given && strcmp(given, sid))
        return api_fail(e, 400, "invalid_value", "session", "the body's session and its file name two documents");
    session *ss = session_find(r->srv, sid, r->key);
    if (!strncmp(sid, "sess_", 5) && ss && ss->file) { /* a file: it must exist and have been read */
        if (session_expired_now(ss) || ss->deleted) {
            api_fail(e, 404, "file_not_found", "messages", "no file 'file-%s'", sid + 5);
            return -1;
        }
        if (ss->status != SESSION_FAILED && session_reading(ss)) {
            /* answered from a part of the file would be a wrong answer: wait for the rest, as long as the
               rate so far says (clients retry a 409 with Retry-After, OpenAI's after up to a minute) */
            double secs = 2;
            if (ss->stats.ingest_ms > 0 && ss->stats.bytes_read > 0 && ss->bytes_acked > ss->stats.bytes_read)
                secs = (double)(ss->bytes_acked - ss->stats.bytes_read) * ss->stats.ingest_ms / 1e3 /
                       (double)ss->stats.bytes_read;
            *retry_after = secs < 1 ? 1 : secs > 60 ? 60 : (int)secs + 1;
            return api_fail(e, 409, "file_not_ready", "messages",
                            "file 'file-%s' is still being read (%lld of %lld bytes): retry, or wait until "
                            "GET /v1/files/{id} says processed", sid + 5, (long long)ss->stats.bytes_read,
                            (long long)ss->bytes_acked);
        }
    } else if (!ss && !store_is_shared(r->srv->st)) { /* (a shared store: the session route takes it over) */
        api_fail(e, 404, "file_not_found", "messages", "no file '%s%s'", !strncmp(sid, "sess_", 5) ? "file-" : "", sid + 5);
        return -1;
    }
    json_object_set_new(body, "session", json_string(sid));
    return 0;
}

/* ---- routes ------------------------------------------------------------------------------------- */

void route_files(request *r, const char *rest) {
    api_error e;
    int get = request_reads(r), post = !strcmp(r->method, "POST"), del = !strcmp(r->method, "DELETE");
    if (!*rest) {
        if (post) return start_form(r);
        if (get) return list_files(r);
        return respond_method_not_allowed(r, "GET, HEAD, POST");
    }
    char id[64];
    const char *slash = route_id(rest, id, sizeof id);
    if (slash && strcmp(slash, "/content")) {
        api_fail(&e, 404, "not_found", NULL, "no route %s %s", r->method, r->url);
        return respond_error(r, &e);
    }
    if (slash && !get) return respond_method_not_allowed(r, "GET, HEAD");
    if (!slash && !get && !del) return respond_method_not_allowed(r, "GET, HEAD, DELETE");
    char sid[48];
    if (!session_of_file(id, sid, sizeof sid)) {
        api_fail(&e, 404, "file_not_found", "file_id", "no file '%.60s'", id);
        return respond_error(r, &e);
    }
    if (store_is_shared(r->srv->st) && !session_find(r->srv, sid, r->key)) {
        if (get && !slash) return read_stored_files(r, sid, NULL); /* held elsewhere, or by none: as the store says */
        return (void)session_lookup(r, sid, "file_id"); /* taken over here (answered meanwhile: retry) */
    }
    session *ss = file_lookup(r, sid);
    if (!ss) return;
    if (!(get && !slash) && session_pot_wait(r, ss, 0)) return; /* (its log, or its deletion, after a page-in) */
    if (slash) return file_content(r, ss);
    if (del) return session_delete(r, ss, 1);
    respond_json(r, 200, file_json(ss));
}
