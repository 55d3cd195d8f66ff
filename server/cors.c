/* CORS for browser clients (setting cors_origins): a preflight OPTIONS is
 * answered before authentication (browsers send it without credentials), and
 * every response to an allowed origin, errors and SSE streams included,
 * carries Access-Control-Allow-Origin. With cors_origins "" nothing here
 * changes a response.
 *
 * Other sites' pages (cors_foreign_site). A server with no API keys answers
 * whoever reaches it, and a browser on its machine reaches it for any page it
 * shows. Two ways in are closed. DNS rebinding: a page whose own name is made
 * to point at 127.0.0.1 is then "same origin" with the server and reads every
 * answer; a keyless server listening on loopback therefore answers only Host
 * names no other site answers for (an IP address, a name without a dot such as
 * localhost, *.localhost) and those in allowed_hosts. Cross-site requests: a page may POST a text/plain or form
 * body to any address without a preflight; a keyless server refuses a request
 * whose Origin is another site than its Host unless CORS allows that origin.
 * Keys close both already: a page knows none, and sending Authorization needs
 * a preflight. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

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

/* How name matches a comma-separated list: 2 by its "*", 1 by an entry equal
 * to it (ignoring case when asked), 0 not. */
static int list_match(const char *list, const char *name, int ignore_case) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *end = p;
        while (*end && *end != ',') end++;
        const char *last = end;
        while (last > p && last[-1] == ' ') last--;
        size_t len = (size_t)(last - p);
        if (len == 1 && *p == '*') return 2;
        if (len == n && !(ignore_case ? strncasecmp(p, name, n) : strncmp(p, name, n))) return 1;
        p = end;
    }
    return 0;
}

/* The value of Access-Control-Allow-Origin for this request's Origin, or
 * NULL when CORS is off, the request has no Origin or it is not allowed. */
static const char *allowed_origin(request *r) {
    const char *list = r->srv->cfg.cors_origins;
    if (!list || !*list || !r->conn) return NULL;
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (!origin || !*origin) return NULL;
    int m = list_match(list, origin, 0);
    return m == 2 ? "*" : m == 1 ? origin : NULL;
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
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "Retry-After, x-should-retry");
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

/* ---- other sites' pages ---------------------------------------------------------------- */

/* The host name of a Host header or an origin's authority ("[::1]:8080",
 * "localhost:8080", "Example.COM"): into out without port or brackets; 0, or
 * -1 when it does not fit. */
static int host_name(const char *authority, size_t len, char *out, size_t cap) {
    const char *end = authority + len;
    if (len && authority[0] == '[') {
        const char *close = memchr(authority, ']', len);
        if (!close) return -1;
        authority++;
        end = close;
    } else {
        const char *colon = memchr(authority, ':', len);
        if (colon) end = colon;
    }
    size_t n = (size_t)(end - authority);
    if (!n || n >= cap) return -1;
    memcpy(out, authority, n);
    out[n] = 0;
    return 0;
}

static int is_loopback_address(const char *host) {
    struct in_addr a4;
    struct in6_addr a6;
    if (!strcasecmp(host, "localhost")) return 1;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

/* A name no other site's DNS answers for: an IP address, a single label
 * (this machine's name, or one the local network resolves; another site's
 * names have a dot), localhost or *.localhost (RFC 6761 keeps them here). */
static int names_this_machine(const char *host) {
    struct in_addr a4;
    struct in6_addr a6;
    size_t n = strlen(host);
    if (!strchr(host, '.') || (n > 10 && !strcasecmp(host + n - 10, ".localhost"))) return 1;
    return inet_pton(AF_INET, host, &a4) == 1 || inet_pton(AF_INET6, host, &a6) == 1;
}

int cors_foreign_site(request *r, api_error *e) {
    server *s = r->srv;
    if (s->n_keys) return 0;
    const char *host = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Host");
    char host_only[256] = "";
    int host_ok = host && !host_name(host, strlen(host), host_only, sizeof host_only);
    if (host && is_loopback_address(s->cfg.host) && !(host_ok && names_this_machine(host_only)) &&
        !(host_ok && list_match(s->cfg.allowed_hosts, host_only, 1)))
        return api_fail(e, 403, "host_not_allowed", NULL,
                        "this server has no API key and listens on loopback: it answers Host names of this machine "
                        "(localhost, an IP address, a name without a dot) and those in allowed_hosts, not '%s'",
                        host_ok ? host_only : "(unreadable)");
    const char *origin = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin");
    if (!origin || allowed_origin(r)) return 0;
    const char *sep = strstr(origin, "://");
    char origin_host[256];
    if (sep && host_ok && !host_name(sep + 3, strcspn(sep + 3, "/"), origin_host, sizeof origin_host) &&
        !strcasecmp(origin_host, host_only))
        return 0; /* the page is the server's own (the port may differ behind a proxy) */
    return api_fail(e, 403, "origin_not_allowed", NULL,
                    "a request from the page of another site (Origin %.200s) to a server without API keys: "
                    "allow it with cors_origins, or give the server an API key", origin);
}
