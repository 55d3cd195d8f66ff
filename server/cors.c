/* CORS for browser clients (setting cors_origins): a preflight OPTIONS is
 * answered before authentication (browsers send it without credentials), and
 * every response to an allowed origin, errors and SSE streams included,
 * carries Access-Control-Allow-Origin. With cors_origins "" nothing here
 * changes a response. */
#include <stdio.h>
#include <string.h>

#include "server/server_internal.h"

static const char CORS_METHODS[] = "GET, POST, PUT, DELETE, OPTIONS";
static const char CORS_HEADERS[] = "Authorization, Content-Type, X-Session-Id, X-Chunk-Seq";

/* The headers a preflight asked for, when they are a plain list of header
 * names (clients add their own, e.g. the openai package's X-Stainless-*):
 * allowed besides ours, since the origin is. NULL otherwise. */
static const char *asked_headers(request *r) {
    const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    if (!h || !*h || strlen(h) > 2048) return NULL;
    for (const char *p = h; *p; p++)
        if (!(*p == ',' || *p == ' ' || *p == '-' || *p == '_' || (*p >= '0' && *p <= '9') ||
              ((*p | 0x20) >= 'a' && (*p | 0x20) <= 'z')))
            return NULL;
    return h;
}

/* The value of Access-Control-Allow-Origin for this request's Origin, or
 * NULL when CORS is off, the request has no Origin or it is not allowed. */
static const char *allowed_origin(request *r) {
    const char *list = r->srv->cfg.cors_origins;
    if (!list || !*list || !r->conn) return NULL;
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (!origin || !*origin) return NULL;
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *end = p;
        while (*end && *end != ',') end++;
        const char *last = end;
        while (last > p && last[-1] == ' ') last--;
        size_t len = (size_t)(last - p);
        if (len == 1 && *p == '*') return "*";
        if (len == n && !strncmp(p, origin, n)) return origin;
        p = end;
    }
    return NULL;
}

int cors_enabled(const server *s) { return s->cfg.cors_origins && *s->cfg.cors_origins; }

void cors_add_headers(request *r, struct MHD_Response *resp) {
    const char *list = r->srv->cfg.cors_origins;
    /* the answer depends on Origin for every request, allowed or not, and a preflight's on the
     * headers it asked for (reflected in Allow-Headers): a shared cache must know */
    if (cors_enabled(r->srv)) {
        int any = !strcmp(list, "*"), preflight = !strcmp(r->method, "OPTIONS");
        const char *vary = preflight ? (any ? "Access-Control-Request-Headers" : "Origin, Access-Control-Request-Headers")
                                     : (any ? NULL : "Origin");
        if (vary) MHD_add_response_header(resp, "Vary", vary);
    }
    const char *origin = allowed_origin(r);
    if (!origin) return;
    MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "Retry-After, X-Session-Id");
}

int cors_preflight(request *r) {
    if (strcmp(r->method, "OPTIONS") || !cors_enabled(r->srv)) return 0;
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return 0;
    if (allowed_origin(r)) {
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", CORS_METHODS);
        char allow[2200];
        const char *asked = asked_headers(r);
        snprintf(allow, sizeof allow, "%s%s%s", CORS_HEADERS, asked ? ", " : "", asked ? asked : "");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", allow);
        MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    }
    respond_raw(r, 204, resp); /* adds Allow-Origin through cors_add_headers */
    return 1;
}
