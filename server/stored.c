/* Stored objects of /v1/responses and /v1/conversations (responses.c,
 * conversations.c): an entry per id, {"owner": the API key's owner, "kind":
 * "response" or "conversation", "object": what GET answers, "items": the items
 * it holds (a response: the input items that made it; a conversation: its
 * items), "messages" (a response only: its conversation as chat messages, the
 * answer's turn last), "bytes": its size}.
 *
 * They are kept in the server's memory (s->stored, the least recently used
 * first, dropped past response_store_bytes). With a shared store (Redis) they
 * live there instead, for every replica (server/store.h): a request fetches
 * the entries it names into s->stored first (it is then that request's
 * scratch, the loop running one handler at a time), and a write's request is
 * answered once the store has it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

int stored_id_ok(const char *id) {
    size_t n = strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-");
    return n && n <= 100 && !id[n];
}

json_t *stored_get(request *r, const char *id, const char *kind) {
    json_t *entry = json_object_get(r->srv->stored, id);
    if (!entry || strcmp(json_string_value(json_object_get(entry, "owner")), r->key->owner)) return NULL;
    return !kind || !strcmp(json_string_value(json_object_get(entry, "kind")), kind) ? entry : NULL;
}

json_t *stored_item(request *r, const char *item_id) {
    const char *id;
    json_t *entry, *found = NULL;
    json_object_foreach(r->srv->stored, id, entry) {
        if (strcmp(json_string_value(json_object_get(entry, "owner")), r->key->owner)) continue;
        json_t *lists[] = {json_object_get(entry, "items"), json_object_get(json_object_get(entry, "object"), "output")};
        for (size_t l = 0; l < 2; l++) {
            size_t i;
            json_t *item;
            json_array_foreach(lists[l], i, item) {
                const char *at = json_string_value(json_object_get(item, "id"));
                if (at && !strcmp(at, item_id)) found = item; /* (the newest entry's: the last seen) */
            }
        }
    }
    return found;
}

/* Sets entry's bytes: what its JSON takes. */
static void stored_measure(json_t *entry) {
    json_object_del(entry, "bytes");
    char *text = json_dumps(entry, JSON_COMPACT);
    json_object_set_new(entry, "bytes", json_integer(text ? (json_int_t)strlen(text) : 0));
    free(text);
}

json_t *stored_new(request *r, const char *kind, json_t *object, json_t *items, json_t *messages) {
    json_t *entry = json_pack("{s:s, s:s, s:o, s:o}", "owner", r->key->owner, "kind", kind, "object", object,
                              "items", items ? items : json_array());
    if (entry && messages) json_object_set_new(entry, "messages", messages);
    else json_decref(messages);
    if (entry) stored_measure(entry);
    return entry;
}

int stored_fits(const server *s, const json_t *entry) {
    return json_integer_value(json_object_get(entry, "bytes")) <= s->cfg.response_store_bytes;
}

void stored_drop(server *s, const char *id) {
    json_t *entry = json_object_get(s->stored, id);
    if (!entry) return;
    s->stored_bytes -= (size_t)json_integer_value(json_object_get(entry, "bytes"));
    json_object_del(s->stored, id);
}

/* Into the server's memory (takes entry), the least recently used going while
 * they pass response_store_bytes; one that never fits is not kept. */
static void stored_set(server *s, const char *id, json_t *entry) {
    if (!stored_fits(s, entry)) return json_decref(entry);
    size_t bytes = (size_t)json_integer_value(json_object_get(entry, "bytes"));
    const char *oldest;
    json_t *v;
    void *tmp;
    stored_drop(s, id); /* (an older entry of id: entry is always a new one) */
    json_object_foreach_safe(s->stored, tmp, oldest, v) {
        if (s->stored_bytes + bytes <= (size_t)s->cfg.response_store_bytes) break;
        stored_drop(s, oldest);
    }
    json_object_set_new(s->stored, id, entry);
    s->stored_bytes += bytes;
}

void stored_touch(server *s, const char *id) {
    json_t *entry = json_object_get(s->stored, id);
    if (!entry) return;
    json_incref(entry); /* the most recently used: the last dropped */
    json_object_del(s->stored, id);
    json_object_set_new(s->stored, id, entry);
}

void stored_free(server *s) {
    json_decref(s->stored);
    json_decref(s->stored_read);
    s->stored = s->stored_read = NULL;
    s->stored_bytes = 0;
}

/* ---- fetching from a shared store ------------------------------------------------------- */

typedef struct fetch_job {
    server *s;
    size_t n;
    char **ids; /* entry ids, or item ids where by_item */
    int *by_item;
    char **entries;  /* what the store has (NULL: none) */
    int touch_first; /* the first is continued: it becomes the most recently used */
    int failed;
    char err[160];
    void (*then)(request *r);
} fetch_job;

static void free_ids(char **ids, size_t n) {
    for (size_t i = 0; ids && i < n; i++) free(ids[i]);
    free(ids);
}

static void fetch_job_free(fetch_job *j) {
    for (size_t i = 0; i < j->n; i++) free(j->entries[i]);
    free_ids(j->ids, j->n);
    free(j->by_item);
    free(j->entries);
    free(j);
}

static void fetch_work(void *arg) {
    fetch_job *j = arg;
    for (size_t i = 0; i < j->n && !j->failed; i++) {
        int absent = 0;
        j->entries[i] = store_response_get(j->s->st, j->ids[i], j->by_item[i], j->touch_first && i == 0, &absent,
                                           j->err, sizeof j->err);
        j->failed = !j->entries[i] && !absent;
    }
}

static void fetch_done(request *r, void *arg) {
    fetch_job *j = arg;
    server *s = r->srv;
    if (j->failed) {
        api_error e;
        api_fail(&e, 503, "store_unavailable", NULL, "the store did not answer; retry: %s", j->err);
        respond_retry(r, &e, 1);
        return fetch_job_free(j);
    }
    json_object_clear(s->stored); /* this request's scratch: what the store has now */
    json_object_clear(s->stored_read);
    s->stored_bytes = 0;
    for (size_t i = 0; i < j->n; i++) {
        json_t *entry = j->entries[i] ? json_loads(j->entries[i], 0, NULL) : NULL;
        const char *id = json_string_value(json_object_get(json_object_get(entry, "object"), "id"));
        if (id) json_object_set_new(s->stored_read, id, json_string(j->entries[i]));
        if (id) stored_set(s, id, entry);
        else json_decref(entry);
    }
    void (*then)(request *) = j->then;
    fetch_job_free(j);
    then(r);
}

void stored_fetch(request *r, char **ids, int *by_item, size_t n, int touch_first, void (*then)(request *r)) {
    fetch_job *j = n && store_is_shared(r->srv->st) ? calloc(1, sizeof *j) : NULL;
    char **entries = j ? calloc(n, sizeof *entries) : NULL;
    if (!entries) {
        int oom = j != NULL;
        free(j);
        free_ids(ids, n);
        free(by_item);
        if (!oom) return then(r); /* nothing to fetch */
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    *j = (fetch_job){.s = r->srv, .n = n, .ids = ids, .by_item = by_item, .entries = entries,
                     .touch_first = touch_first, .then = then};
    request_work(r, WORK_POOL, fetch_work, fetch_done, j);
}

void stored_fetch_one(request *r, const char *id, void (*then)(request *r)) {
    char **ids = calloc(1, sizeof *ids);
    int *by_item = calloc(1, sizeof *by_item);
    if (ids && by_item && (ids[0] = strdup(id))) return stored_fetch(r, ids, by_item, 1, 0, then);
    free_ids(ids, 1);
    free(by_item);
    api_error e;
    api_fail(&e, 500, NULL, NULL, "out of memory");
    respond_error(r, &e);
}

/* ---- writing ------------------------------------------------------------------------------ */

enum write_op { WRITE_PUT, WRITE_APPEND, WRITE_DELETE };
enum { APPEND_TRIES = 16 }; /* an append that finds the entry changed reads it again, at most this often */

typedef struct write_job {
    uv_work_t work;
    request *r;
    server *s;
    enum write_op op;
    char id[128];
    json_t *entry;  /* WRITE_PUT: what to store */
    char *expect;   /* WRITE_PUT: only over this text (what was read; NULL: over anything) */
    json_t *append; /* WRITE_APPEND: the items to add */
    int rc;         /* put, append: 0 or -1; delete: 1, 0 (none), -1 */
    char err[160];
    void (*then)(request *r, void *arg, int rc);
    void *arg;
} write_job;

/* The entry into the store, with its items' ids (and a response's output's). */
static int put_entry(server *s, const char *id, json_t *entry, const char *expect, char *err, size_t errlen) {
    json_t *lists[] = {json_object_get(entry, "items"), json_object_get(json_object_get(entry, "object"), "output")};
    size_t n = json_array_size(lists[0]) + json_array_size(lists[1]), k = 0;
    const char **items = calloc(n ? n : 1, sizeof *items);
    char *text = json_dumps(entry, JSON_COMPACT);
    int rc = -1;
    if (items && text) {
        for (size_t l = 0; l < 2; l++) {
            size_t i;
            json_t *item;
            json_array_foreach(lists[l], i, item)
                if (json_string_value(json_object_get(item, "id"))) items[k++] = json_string_value(json_object_get(item, "id"));
        }
        rc = store_response_put(s->st, id, text, items, k, s->cfg.response_store_bytes, expect, err, errlen);
    } else {
        snprintf(err, errlen, "out of memory");
    }
    free(items);
    free(text);
    return rc;
}

static void write_work(uv_work_t *w) {
    write_job *j = w->data;
    if (j->op == WRITE_PUT) {
        j->rc = put_entry(j->s, j->id, j->entry, j->expect, j->err, sizeof j->err);
    } else if (j->op == WRITE_DELETE) {
        j->rc = store_response_delete(j->s->st, j->id, j->err, sizeof j->err);
    } else { /* read, add, write while it is still what was read: else again (another replica added
                to it in between; that addition is kept) */
        j->rc = 1;
        for (int tries = 0; j->rc == 1 && tries < APPEND_TRIES; tries++) {
            int absent = 0;
            char *text = store_response_get(j->s->st, j->id, 0, 0, &absent, j->err, sizeof j->err);
            json_t *entry = text ? json_loads(text, 0, NULL) : NULL;
            j->rc = -1;
            if (entry) {
                json_array_extend(json_object_get(entry, "items"), j->append);
                stored_measure(entry);
                if (stored_fits(j->s, entry)) j->rc = put_entry(j->s, j->id, entry, text, j->err, sizeof j->err);
                else snprintf(j->err, sizeof j->err, "it would pass response_store_bytes");
            } else if (absent) {
                snprintf(j->err, sizeof j->err, "it is no longer stored");
            }
            json_decref(entry);
            free(text);
        }
        if (j->rc == 1) {
            snprintf(j->err, sizeof j->err, "other writes to it came between %d tries", APPEND_TRIES);
            j->rc = -1;
        }
    }
}

static void write_done(uv_work_t *w, int status) {
    (void)status;
    write_job *j = w->data;
    if (j->rc < 0) fprintf(stderr, "potserve: %s not stored: %s\n", j->id, j->err);
    j->then(j->r, j->arg, j->rc);
    request_unref(j->r);
    json_decref(j->entry);
    json_decref(j->append);
    free(j->expect);
    free(j);
}

/* Runs op on the thread pool (a shared store), then `then` on the loop. */
static void write_shared(request *r, enum write_op op, const char *id, json_t *entry, const char *expect,
                         json_t *append, int suspend, void (*then)(request *r, void *arg, int rc), void *arg) {
    write_job *j = calloc(1, sizeof *j);
    char *expected = expect ? strdup(expect) : NULL;
    if (!j || (expect && !expected)) {
        free(j);
        free(expected);
        json_decref(entry);
        json_decref(append);
        return then(r, arg, -1);
    }
    *j = (write_job){.r = r, .s = r->srv, .op = op, .entry = entry, .expect = expected, .append = append,
                     .then = then, .arg = arg};
    snprintf(j->id, sizeof j->id, "%s", id);
    j->work.data = j;
    request_ref(r);
    if (suspend) request_suspend(r);
    if (uv_queue_work(r->srv->loop, &j->work, write_work, write_done)) {
        snprintf(j->err, sizeof j->err, "cannot queue work");
        j->rc = -1;
        write_done(&j->work, 0);
    }
}

static void write_entry(request *r, const char *id, json_t *entry, const char *expect, int suspend,
                        void (*then)(request *r, void *arg, int rc), void *arg) {
    server *s = r->srv;
    if (!entry || !stored_fits(s, entry)) {
        json_decref(entry);
        return then(r, arg, -1);
    }
    if (store_is_shared(s->st)) {
        json_t *mine = json_deep_copy(entry); /* (the store's copy is written on the pool) */
        stored_set(s, id, entry);
        return write_shared(r, WRITE_PUT, id, mine, expect, NULL, suspend, then, arg);
    }
    stored_set(s, id, entry);
    then(r, arg, 0);
}

void stored_write(request *r, const char *id, json_t *entry, int suspend, void (*then)(request *r, void *arg, int rc),
                  void *arg) {
    write_entry(r, id, entry, NULL, suspend, then, arg);
}

void stored_update(request *r, const char *id, json_t *entry, int suspend, void (*then)(request *r, void *arg, int rc),
                   void *arg) {
    /* (in memory the loop runs the read and the write with nothing between them) */
    write_entry(r, id, entry, json_string_value(json_object_get(r->srv->stored_read, id)), suspend, then, arg);
}

void stored_append(request *r, const char *id, json_t *items, int suspend, void (*then)(request *r, void *arg, int rc),
                   void *arg) {
    server *s = r->srv;
    if (store_is_shared(s->st)) return write_shared(r, WRITE_APPEND, id, NULL, NULL, json_deep_copy(items), suspend, then, arg);
    json_t *entry = json_object_get(s->stored, id);
    if (!entry) return then(r, arg, -1);
    json_t *grown = json_deep_copy(entry);
    json_array_extend(json_object_get(grown, "items"), items);
    stored_measure(grown);
    if (!stored_fits(s, grown)) {
        json_decref(grown);
        return then(r, arg, -1);
    }
    stored_set(s, id, grown);
    then(r, arg, 0);
}

/* Forgets entry id, then then(r, arg, rc): 1, 0 when it was not stored, -1 (the store did not answer). */
static void stored_delete(request *r, const char *id, void (*then)(request *r, void *arg, int rc), void *arg) {
    server *s = r->srv;
    int had = json_object_get(s->stored, id) != NULL;
    stored_drop(s, id);
    if (store_is_shared(s->st)) return write_shared(r, WRITE_DELETE, id, NULL, NULL, NULL, 1, then, arg);
    then(r, arg, had);
}

typedef struct forget {
    char id[128];
    const char *object; /* what the answer says was deleted */
} forget;

static void forgotten(request *r, void *arg, int rc) {
    forget *f = arg;
    api_error e;
    if (rc < 0) {
        api_fail(&e, 503, "store_unavailable", NULL, "the store did not take the deletion; retry");
        respond_retry(r, &e, 1);
    } else {
        respond_json(r, 200, json_pack("{s:s, s:s, s:b}", "id", f->id, "object", f->object, "deleted", 1));
    }
    free(f);
}

void stored_delete_answer(request *r, const char *id, const char *object) {
    forget *f = malloc(sizeof *f);
    if (!f) {
        api_error e;
        api_fail(&e, 500, NULL, NULL, "out of memory");
        return respond_error(r, &e);
    }
    snprintf(f->id, sizeof f->id, "%s", id);
    f->object = object;
    stored_delete(r, id, forgotten, f);
}

/* ---- listing items ------------------------------------------------------------------------ */

void stored_list_page(request *r, json_t *items) {
    api_error e;
    const char *order = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "order");
    const char *limit_arg = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
    const char *after = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "after");
    int64_t limit = 20;
    char err[128];
    if (order && strcmp(order, "asc") && strcmp(order, "desc")) {
        api_fail(&e, 400, "invalid_value", "order", "order must be asc or desc");
        return respond_error(r, &e);
    }
    if (limit_arg && config_parse_int("limit", limit_arg, 1, 100, &limit, err, sizeof err)) {
        api_fail(&e, 400, "invalid_value", "limit", "%s", err);
        return respond_error(r, &e);
    }
    size_t n = json_array_size(items), at = 0;
    int asc = order && !strcmp(order, "asc");
    if (after) { /* (from the last item with that id: a page never leads back to an earlier one) */
        size_t found = n;
        for (size_t k = 0; k < n; k++) {
            const char *id = json_string_value(json_object_get(json_array_get(items, asc ? k : n - 1 - k), "id"));
            if (id && !strcmp(id, after)) found = k;
        }
        if (found == n) {
            api_fail(&e, 400, "invalid_value", "after", "after: there is no item '%s'", after);
            return respond_error(r, &e);
        }
        at = found + 1;
    }
    json_t *data = json_array();
    for (size_t k = at; k < n && json_array_size(data) < (size_t)limit; k++)
        json_array_append(data, json_array_get(items, asc ? k : n - 1 - k));
    size_t got = json_array_size(data);
    json_t *first = json_object_get(json_array_get(data, 0), "id");
    json_t *last = json_object_get(json_array_get(data, got ? got - 1 : 0), "id");
    respond_json(r, 200, json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data, "first_id", first,
                                   "last_id", last, "has_more", at + got < n));
}
