/* The API's errors (docs/api.md "Errors"): filling an api_error, its type
 * and its JSON. Apart from the parsers so that whatever reports an api_error
 * (the schema compiler, and its fuzzer in tests/fuzz/) needs nothing else. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "common/common.h" /* utf8_seq */

/* Every byte of s that is not part of a valid UTF-8 sequence becomes '?': a
 * message may quote a client's bytes (a session id from the URL) or be cut
 * inside a character, and JSON strings must be UTF-8. */
static void utf8_repair(char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_seq((const unsigned char *)s + i, n - i, &cp);
        if (l > 0) {
            i += (size_t)l;
        } else {
            s[i++] = '?';
        }
    }
}

int api_name_is_valid(const char *name) {
    size_t n = strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-");
    return n >= 1 && n <= 64 && !name[n];
}

int api_fail(api_error *e, int status, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->code = code;
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    utf8_repair(e->message);
    return -1;
}

const char *api_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 409: return "conflict_error";
    case 421: return "misdirected_request_error"; /* a session held by another replica */
    case 429: return "rate_limit_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

json_t *api_error_json(const api_error *e) {
    return json_pack("{s:{s:s, s:s, s:s?, s:s?}}", "error", "message", e->message, "type",
                     api_error_type(e->status), "param", e->param, "code", e->code);
}
