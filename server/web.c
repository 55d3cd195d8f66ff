/* The web page (server/web/: index.html, app.js, style.css, favicon.svg),
 * compiled into the binary: the Makefile turns each file into a C array with
 * `xxd -i` ($(BUILD)/gen/web_assets.c). Served at / without an API key (the
 * page asks for one), with a strict Content-Security-Policy so that nothing
 * a model writes can run as script, and an ETag so browsers revalidate
 * cheaply. */
#include <stdio.h>
#include <string.h>

#include "common/common.h" /* crc32c */
#include "server/server_internal.h"

/* The arrays xxd -i writes (named after each file). */
extern unsigned char index_html[], app_js[], style_css[], favicon_svg[];
extern unsigned int index_html_len, app_js_len, style_css_len, favicon_svg_len;

typedef struct web_asset {
    const char *path, *type;
    const unsigned char *data;
    const unsigned int *len;
} web_asset;

static const web_asset assets[] = {
    {"/", "text/html; charset=utf-8", index_html, &index_html_len},
    {"/index.html", "text/html; charset=utf-8", index_html, &index_html_len},
    {"/app.js", "text/javascript; charset=utf-8", app_js, &app_js_len},
    {"/style.css", "text/css; charset=utf-8", style_css, &style_css_len},
    {"/favicon.svg", "image/svg+xml", favicon_svg, &favicon_svg_len},
};

/* Same origin only: no inline script or style, no plugins, no framing. */
static const char csp[] =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

static const web_asset *find_asset(const char *path) {
    for (size_t i = 0; i < sizeof assets / sizeof *assets; i++)
        if (!strcmp(assets[i].path, path)) return &assets[i];
    return NULL;
}

int web_is_page(const char *path) { return find_asset(path) != NULL; }

void route_web(request *r) {
    const web_asset *a = find_asset(r->url);
    char etag[16];
    snprintf(etag, sizeof etag, "\"%08x\"", crc32c(0, a->data, *a->len));
    const char *inm = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "If-None-Match");
    int fresh = inm && strstr(inm, etag);
    /* a 304 too: its Content-Length must be the 200's (RFC 9110 8.6); libmicrohttpd sends no body with it */
    struct MHD_Response *resp = MHD_create_response_from_buffer(*a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, "Content-Type", a->type);
    MHD_add_response_header(resp, "Cache-Control", "no-cache"); /* revalidate: the ETag makes it cheap */
    MHD_add_response_header(resp, "ETag", etag);
    MHD_add_response_header(resp, "Content-Security-Policy", csp);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    if (!fresh) r->bytes_out += *a->len;
    respond_raw(r, fresh ? 304 : 200, resp);
}
