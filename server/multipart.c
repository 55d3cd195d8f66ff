/* multipart/form-data, read as it arrives (multipart.h). A part's body ends
 * at the delimiter CRLF "--" boundary; bytes that might begin one are held
 * until the next bytes decide, and since RFC 2046 keeps CR out of a boundary,
 * the held bytes are always a prefix of the delimiter: they are passed on from
 * the delimiter itself when it turns out not to be one. */
#include "server/multipart.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

enum { ST_PREAMBLE, ST_AFTER_DELIM, ST_HEADERS, ST_DATA, ST_EPILOGUE, ST_FAILED };

static int fail(multipart *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    m->state = ST_FAILED;
    return -1;
}

/* RFC 2046's bchars: digits, letters and '()+_,-./:=? (a space, but not last) */
static int boundary_char(int c) {
    return isalnum(c) || (c && strchr("'()+_,-./:=? ", c));
}

int multipart_init(multipart *m, const char *content_type) {
    memset(m, 0, sizeof *m);
    const char *ct = content_type ? content_type : "";
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, "multipart/form-data", 19) || (ct[19] && ct[19] != ';' && ct[19] != ' '))
        return fail(m, "the body must be multipart/form-data, not %.60s", *ct ? ct : "(no Content-Type)");
    const char *b = NULL;
    for (const char *p = ct + 19; (p = strchr(p, ';')) != NULL;) {
        p++;
        while (*p == ' ' || *p == '\t') p++;
        if (!strncasecmp(p, "boundary=", 9)) {
            b = p + 9;
            break;
        }
    }
    if (!b) return fail(m, "%s", "the multipart/form-data Content-Type names no boundary");
    char bound[MULTIPART_BOUNDARY_MAX + 1];
    size_t n = 0;
    if (*b == '"') {
        for (b++; *b && *b != '"'; b++) {
            if (n == MULTIPART_BOUNDARY_MAX || !boundary_char((unsigned char)*b)) goto bad;
            bound[n++] = *b;
        }
        if (*b != '"') goto bad;
    } else {
        for (; *b && *b != ';' && *b != ' ' && *b != '\t'; b++) {
            if (n == MULTIPART_BOUNDARY_MAX || !boundary_char((unsigned char)*b)) goto bad;
            bound[n++] = *b;
        }
    }
    if (!n || bound[n - 1] == ' ') goto bad;
    memcpy(m->delim, "\r\n--", 4);
    memcpy(m->delim + 4, bound, n);
    m->delim_len = 4 + n;
    m->delim[m->delim_len] = 0;
    m->state = ST_PREAMBLE;
    m->match = 2; /* the body may begin with the first "--boundary": a CRLF before it is implied */
    return 0;
bad:
    return fail(m, "%s", "the multipart boundary is not 1 to 70 of the characters RFC 2046 allows");
}

/* ---- a part's headers ------------------------------------------------------------------------ */

/* One parameter's value of a Content-Disposition (quoted or a token) into out. */
static const char *param_value(const char *p, char *out, size_t cap, int *too_long) {
    size_t n = 0;
    *too_long = 0;
    if (*p == '"') {
        for (p++; *p && *p != '"'; p++) {
            if (*p == '\\' && p[1]) p++;
            if (n + 1 < cap) out[n++] = *p;
            else *too_long = 1;
        }
        if (*p == '"') p++;
    } else {
        for (; *p && *p != ';' && *p != ' ' && *p != '\t'; p++) {
            if (n + 1 < cap) out[n++] = *p;
            else *too_long = 1;
        }
    }
    out[n] = 0;
    return p;
}

static int hex(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* filename*=UTF-8''percent%20encoded (RFC 5987) into out; -1 when not UTF-8 or malformed. */
static int ext_value(const char *v, char *out, size_t cap) {
    if (strncasecmp(v, "utf-8''", 7)) return -1;
    size_t n = 0;
    for (v += 7; *v; v++) {
        int c = (unsigned char)*v;
        if (c == '%') {
            int hi = hex((unsigned char)v[1]), lo = hi < 0 ? -1 : hex((unsigned char)v[2]);
            if (lo < 0) return -1;
            c = hi * 16 + lo;
            v += 2;
            if (!c) return -1; /* (a NUL would end the name there) */
        }
        if (n + 1 >= cap) return -1;
        out[n++] = (char)c;
    }
    out[n] = 0;
    return 0;
}

static int disposition(multipart *m, const char *v) {
    multipart_part *pt = &m->part;
    while (*v == ' ' || *v == '\t') v++;
    if (strncasecmp(v, "form-data", 9) || (v[9] && v[9] != ';' && v[9] != ' '))
        return fail(m, "a part's Content-Disposition must be form-data, not %.40s", v);
    int named = 0, extended = 0;
    for (const char *p = v + 9; *p;) {
        while (*p == ';' || *p == ' ' || *p == '\t') p++;
        if (!*p) break;
        const char *key = p;
        while (*p && *p != '=' && *p != ';') p++;
        size_t klen = (size_t)(p - key);
        while (klen && (key[klen - 1] == ' ' || key[klen - 1] == '\t')) klen--;
        if (*p != '=') continue; /* a parameter without a value: nothing to take */
        p++;
        while (*p == ' ' || *p == '\t') p++;
        char value[512];
        int too_long;
        p = param_value(p, value, sizeof value, &too_long);
        if (klen == 4 && !strncasecmp(key, "name", 4)) {
            if (too_long || strlen(value) >= sizeof pt->name) return fail(m, "%s", "a part's name is longer than 63 bytes");
            memcpy(pt->name, value, strlen(value) + 1);
            named = 1;
        } else if (klen == 8 && !strncasecmp(key, "filename", 8) && !extended) {
            if (too_long || strlen(value) >= sizeof pt->filename)
                return fail(m, "%s", "a part's filename is longer than 255 bytes");
            memcpy(pt->filename, value, strlen(value) + 1);
            pt->has_filename = 1;
        } else if (klen == 9 && !strncasecmp(key, "filename*", 9)) {
            if (too_long || ext_value(value, pt->filename, sizeof pt->filename))
                return fail(m, "%s", "a part's filename* is not UTF-8''... of at most 255 bytes");
            pt->has_filename = extended = 1;
        }
    }
    if (!named) return fail(m, "%s", "a part's Content-Disposition has no name");
    return 0;
}

/* The headers block (CRLF-separated lines, the empty line's CRLF included). */
static int parse_headers(multipart *m) {
    memset(&m->part, 0, sizeof m->part);
    int disposed = 0;
    char *h = m->headers, *end = m->headers + m->headers_len - 2; /* the last line's CRLF: the empty line */
    if (memchr(h, 0, m->headers_len)) /* (it would cut a name short, or hide the header after it) */
        return fail(m, "%s", "a part's headers hold a NUL byte");
    while (h < end) {
        char *eol = strstr(h, "\r\n");
        if (!eol || eol > end) eol = end;
        *eol = 0;
        char *colon = strchr(h, ':');
        if (colon) {
            *colon = 0;
            char *v = colon + 1;
            while (*v == ' ' || *v == '\t') v++;
            size_t vl = strlen(v);
            while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) v[--vl] = 0;
            if (!strcasecmp(h, "Content-Disposition")) {
                if (disposition(m, v)) return -1;
                disposed = 1;
            } else if (!strcasecmp(h, "Content-Type")) {
                snprintf(m->part.content_type, sizeof m->part.content_type, "%s", v);
            }
        } else if (*h) {
            return fail(m, "%s", "a part's header line has no colon");
        }
        h = eol + 2;
    }
    if (!disposed) return fail(m, "%s", "a part has no Content-Disposition");
    return 0;
}

/* ---- the body -------------------------------------------------------------------------------- */

int multipart_feed(multipart *m, const char *data, size_t n, size_t *used, multipart_fn fn, void *user) {
    size_t i = 0;
    *used = 0;
    while (i < n) {
        switch (m->state) {
        case ST_FAILED:
            return -1;
        case ST_EPILOGUE:
            i = n;
            break;
        case ST_AFTER_DELIM: {
            char c = data[i++];
            if (m->n_after == 0 && c == '-') {
                m->after[m->n_after++] = c;
            } else if (m->n_after == 1 && m->after[0] == '-') {
                if (c != '-') return fail(m, "%s", "a boundary is followed by neither \"--\" nor a line end");
                m->state = ST_EPILOGUE;
                if (fn(user, MULTIPART_END, NULL, NULL, 0) < 0) return -1;
            } else if (m->n_after == 0 && (c == ' ' || c == '\t')) {
                /* transport padding */
            } else if (m->n_after == 0 && c == '\r') {
                m->after[m->n_after++] = c;
            } else if (m->n_after == 1 && m->after[0] == '\r' && c == '\n') {
                m->state = ST_HEADERS;
                m->headers_len = 0;
            } else {
                return fail(m, "%s", "a boundary is followed by neither \"--\" nor a line end");
            }
            break;
        }
        case ST_HEADERS: {
            if (m->headers_len == sizeof m->headers - 1)
                return fail(m, "a part's headers are longer than %d bytes", MULTIPART_HEADERS_MAX - 1);
            m->headers[m->headers_len++] = data[i++];
            m->headers[m->headers_len] = 0;
            size_t l = m->headers_len;
            int ended = (l == 2 && !memcmp(m->headers, "\r\n", 2)) || (l >= 4 && !memcmp(m->headers + l - 4, "\r\n\r\n", 4));
            if (!ended) break;
            if (parse_headers(m)) return -1;
            m->state = ST_DATA;
            m->match = m->carried = 0;
            int rc = fn(user, MULTIPART_PART, &m->part, NULL, 0);
            if (rc < 0) return -1;
            if (rc > 0) {
                *used = i;
                return 1;
            }
            break;
        }
        case ST_PREAMBLE:
        case ST_DATA: {
            /* data is [run, i) of this piece, less the bytes of a delimiter match begun in it */
            int keep = m->state == ST_DATA;
            size_t run = i, match_at = i;
            if (m->match && !m->carried) m->carried = m->match; /* (a match left by the last piece) */
            while (i < n && m->state != ST_AFTER_DELIM) {
                if (data[i] == m->delim[m->match]) {
                    if (m->match == 0) match_at = i;
                    m->match++;
                    i++;
                    if (m->match < m->delim_len) continue;
                    /* a delimiter: the part's data ends before it */
                    size_t end = m->carried ? run : match_at;
                    if (keep && end > run && fn(user, MULTIPART_DATA, &m->part, data + run, end - run) < 0) return -1;
                    if (keep && fn(user, MULTIPART_PART_END, &m->part, NULL, 0) < 0) return -1;
                    m->match = m->carried = 0;
                    m->n_after = 0;
                    m->state = ST_AFTER_DELIM;
                    continue;
                }
                if (m->match) { /* not a delimiter after all: the held bytes are data */
                    if (m->carried && keep && fn(user, MULTIPART_DATA, &m->part, m->delim, m->carried) < 0) return -1;
                    m->match = m->carried = 0; /* this piece's matched bytes stay in the run */
                    continue;                  /* the byte may begin a delimiter itself */
                }
                i++;
            }
            if (m->state == ST_AFTER_DELIM) break;
            /* the piece ended: pass on what cannot be a delimiter, hold what may */
            size_t end = m->match && !m->carried ? match_at : m->carried ? run : n;
            if (keep && end > run && fn(user, MULTIPART_DATA, &m->part, data + run, end - run) < 0) return -1;
            m->carried = m->match;
            break;
        }
        }
    }
    *used = n;
    return 0;
}

int multipart_finish(multipart *m) {
    if (m->state == ST_EPILOGUE) return 0;
    if (m->state != ST_FAILED) fail(m, "%s", "the form ended before its closing boundary");
    return -1;
}
