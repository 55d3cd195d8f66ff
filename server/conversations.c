/* /v1/conversations (OpenAI's Conversations API): a conversation is a stored
 * list of items (server/stored.c: in memory, or in a shared store for every
 * replica) that a /v1/responses request naming it is asked after, and that
 * gains the request's input and the answer's output (responses.c).
 *
 *   POST   /v1/conversations                      {items?, metadata?} -> conversation
 *   GET    /v1/conversations/{id}                 -> conversation
 *   POST   /v1/conversations/{id}                 {metadata} -> conversation
 *   DELETE /v1/conversations/{id}                 -> {id, object: "conversation.deleted", deleted}
 *   GET    /v1/conversations/{id}/items           -> a page of items (stored_list_page)
 *   POST   /v1/conversations/{id}/items           {items} -> the list of items added
 *   GET    /v1/conversations/{id}/items/{item}    -> the item
 *   DELETE /v1/conversations/{id}/items/{item}    -> conversation
 *
 * Only the key that made a conversation sees it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "server/server_internal.h"

enum { MAX_METADATA = 16 };

static void conversation_not_found(request *r, const char *id) {
    api_error e;
    api_fail(&e, 404, "conversation_not_found", NULL,
             "no stored conversation '%s' (conversations are kept while they fit in response_store_bytes)", id);
    respond_error(r, &e);
}

static void out_of_memory(request *r) {
    api_error e;
    api_fail(&e, 500, NULL, NULL, "out of memory");
    respond_error(r, &e);
}

/* metadata as OpenAI takes it: up to 16 string values, keys of at most 64
 * characters, values of at most 512. 0, or -1 + e. */
int metadata_check(json_t *m, api_error *e) {
    if (!json_is_object(m) || json_object_size(m) > MAX_METADATA)
        return api_fail(e, 400, "invalid_value", "metadata", "metadata must be an object of at most %d strings",
                        MAX_METADATA);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (utf8_chars(k, strlen(k)) > 64 || !json_is_string(v) ||
            utf8_chars(json_string_value(v), json_string_length(v)) > 512)
            return api_fail(e, 400, "invalid_value", "metadata",
                            "metadata's keys are at most 64 characters and its values strings of at most 512");
    }
    return 0;
}

/* Once the entry is written: its answer (arg, taken), or why not. */
static void answer_conversation(request *r);

enum { REDONE_AT_MOST = 16 }; /* a change that finds the conversation changed meanwhile is redone this often */

typedef struct written {
    json_t *answer;
    char id[128];
} written;

static void conversation_written(request *r, void *arg, int rc) {
    written *w = arg;
    json_t *answer = w->answer;
    char id[128];
    snprintf(id, sizeof id, "%s", w->id);
    free(w);
    if (rc == 1 && ++r->stored_redone <= REDONE_AT_MOST) { /* another request changed it: read it again, redo */
        json_decref(answer);
        return stored_fetch_one(r, id, answer_conversation);
    }
    if (rc) { /* (what does not fit is refused before) */
        api_error e;
        api_fail(&e, 503, "store_unavailable", NULL, rc < 0 ? "the store did not take the conversation; retry"
                                                            : "the conversation kept changing under this change; retry");
        respond_retry(r, &e, 1);
        return json_decref(answer);
    }
    respond_json(r, 200, answer);
}

/* Writes entry under id (taken), then answers answer (taken); update: entry
 * is the conversation read by this request, changed (stored_update). */
static void write_then_answer(request *r, const char *id, json_t *entry, json_t *answer, int update) {
    if (!entry || !answer) {
        json_decref(entry);
        json_decref(answer);
        return out_of_memory(r);
    }
    if (!stored_fits(r->srv, entry)) {
        api_error e;
        api_fail(&e, 400, "invalid_value", "items", "the conversation would not fit in response_store_bytes (%lld bytes)",
                 (long long)r->srv->cfg.response_store_bytes);
        json_decref(entry);
        json_decref(answer);
        return respond_error(r, &e);
    }
    written *w = malloc(sizeof *w);
    if (!w) {
        json_decref(entry);
        json_decref(answer);
        return out_of_memory(r);
    }
    w->answer = answer;
    snprintf(w->id, sizeof w->id, "%s", id);
    (update ? stored_update : stored_write)(r, id, entry, 1, conversation_written, w);
}

/* POST /v1/conversations */
void route_conversations(request *r) {
    if (strcmp(r->method, "POST")) return respond_method_not_allowed(r, "POST");
    api_error e;
    json_t *in = r->body_len ? request_json(r, &e) : json_object();
    if (!in) return respond_error(r, &e);
    json_t *items = json_object_get(in, "items"), *meta = json_object_get(in, "metadata"), *listed = json_array();
    int rc = 0;
    if (items && !json_is_null(items)) rc = responses_listed_items(r, items, NULL, listed, &e);
    if (!rc && meta && !json_is_null(meta)) rc = metadata_check(meta, &e);
    if (rc) {
        json_decref(in);
        json_decref(listed);
        return respond_error(r, &e);
    }
    char id[48];
    random_id(id, sizeof id, "conv_");
    json_t *object = json_pack("{s:s, s:s, s:I, s:o}", "id", id, "object", "conversation", "created_at",
                               (json_int_t)time(NULL), "metadata",
                               meta && !json_is_null(meta) ? json_incref(meta) : json_object());
    json_decref(in);
    write_then_answer(r, id, stored_new(r, "conversation", json_incref(object), listed, NULL), object, 0);
}

/* ---- /v1/conversations/{id}[/items[/{item}]] ------------------------------------------- */

/* The parts of a path after /v1/conversations/: id, and the item's id (or "" for
 * .../items); 0 when the path is neither. */
static int path_parts(const char *path, char id[128], char item[257], int *items) {
    const char *slash = strchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : strlen(path);
    if (!n || n >= 128) return 0;
    memcpy(id, path, n);
    id[n] = 0;
    *items = 0;
    item[0] = 0;
    if (!slash) return 1;
    if (strncmp(slash, "/items", 6) || (slash[6] && slash[6] != '/')) return 0;
    *items = 1;
    if (slash[6] == '/') {
        if (!slash[7] || strlen(slash + 7) > 256 || strchr(slash + 7, '/')) return 0;
        snprintf(item, 257, "%s", slash + 7);
    }
    return 1;
}

/* The index of item_id in items, or -1. */
static long item_index(json_t *items, const char *item_id) {
    size_t i;
    json_t *item;
    json_array_foreach(items, i, item) {
        const char *at = json_string_value(json_object_get(item, "id"));
        if (at && !strcmp(at, item_id)) return (long)i;
    }
    return -1;
}

static void answer_conversation(request *r) {
    const char *path = r->url + strlen("/v1/conversations/");
    char id[128], item_id[257];
    int items_route;
    path_parts(path, id, item_id, &items_route);
    json_t *entry = stored_get(r, id, "conversation");
    if (!entry) return conversation_not_found(r, id);
    json_t *object = json_object_get(entry, "object"), *items = json_object_get(entry, "items");
    int get = request_reads(r), post = !strcmp(r->method, "POST");
    api_error e;
    if (!items_route) {
        if (get) return respond_json(r, 200, json_incref(object));
        if (!post) return stored_delete_answer(r, id, "conversation.deleted");
        json_t *in = request_json(r, &e), *meta = json_object_get(in, "metadata");
        if (in && !meta) api_fail(&e, 400, "missing_field", "metadata", "the update's metadata is missing");
        if (!in || !meta || metadata_check(meta, &e)) {
            json_decref(in);
            return respond_error(r, &e);
        }
        json_t *updated = json_deep_copy(entry);
        json_object_set(json_object_get(updated, "object"), "metadata", meta);
        json_decref(in);
        json_t *answer = json_incref(json_object_get(updated, "object"));
        json_t *fresh = stored_new(r, "conversation", json_incref(answer), json_incref(json_object_get(updated, "items")), NULL);
        json_decref(updated);
        return write_then_answer(r, id, fresh, answer, 1);
    }
    if (!item_id[0]) {
        if (get) return stored_list_page(r, items);
        json_t *in = request_json(r, &e), *listed = json_array();
        json_t *given = json_object_get(in, "items");
        if (in && !given) api_fail(&e, 400, "missing_field", "items", "the items to add are missing");
        if (!in || !given || responses_listed_items(r, given, items, listed, &e)) {
            json_decref(in);
            json_decref(listed);
            return respond_error(r, &e);
        }
        json_decref(in);
        size_t n = json_array_size(listed);
        json_t *answer = json_pack("{s:s, s:O, s:O?, s:O?, s:b}", "object", "list", "data", listed, "first_id",
                                   json_object_get(json_array_get(listed, 0), "id"), "last_id",
                                   json_object_get(json_array_get(listed, n ? n - 1 : 0), "id"), "has_more", 0);
        json_t *grown = json_deep_copy(items);
        json_array_extend(grown, listed);
        json_decref(listed);
        return write_then_answer(r, id, stored_new(r, "conversation", json_incref(object), grown, NULL), answer, 1);
    }
    long at = item_index(items, item_id);
    if (at < 0) {
        api_fail(&e, 404, "item_not_found", NULL, "conversation '%s' has no item '%s'", id, item_id);
        return respond_error(r, &e);
    }
    if (get) return respond_json(r, 200, json_incref(json_array_get(items, (size_t)at)));
    json_t *fewer = json_deep_copy(items);
    json_array_remove(fewer, (size_t)at);
    write_then_answer(r, id, stored_new(r, "conversation", json_incref(object), fewer, NULL), json_incref(object), 1);
}

void route_conversation_id(request *r, const char *path) {
    char id[128], item_id[257];
    int items_route;
    api_error e;
    if (!path_parts(path, id, item_id, &items_route)) {
        api_fail(&e, 404, "not_found", NULL, "no such route");
        return respond_error(r, &e);
    }
    int get = request_reads(r), post = !strcmp(r->method, "POST"), del = !strcmp(r->method, "DELETE");
    if (items_route && !item_id[0] && !get && !post) return respond_method_not_allowed(r, "GET, HEAD, POST");
    if (item_id[0] && !get && !del) return respond_method_not_allowed(r, "GET, HEAD, DELETE");
    if (!items_route && !get && !post && !del) return respond_method_not_allowed(r, "GET, HEAD, POST, DELETE");
    if (!stored_id_ok(id)) return conversation_not_found(r, id);
    stored_fetch_one(r, id, answer_conversation);
}
