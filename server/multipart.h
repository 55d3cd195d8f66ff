/* A streaming reader of multipart/form-data bodies (RFC 7578, RFC 2046
 * section 5.1): POST /v1/files's form, fed in pieces of any size as they
 * arrive, without holding a part's data. Pure: no I/O, no allocation. */
#ifndef POTSERVE_MULTIPART_H
#define POTSERVE_MULTIPART_H

#include <stddef.h>

enum { MULTIPART_BOUNDARY_MAX = 70, MULTIPART_HEADERS_MAX = 8192 };

typedef enum multipart_event {
    MULTIPART_PART,     /* a part's headers have been read (part says its name) */
    MULTIPART_DATA,     /* bytes of the current part's body (any number of events a part) */
    MULTIPART_PART_END, /* the current part's body has ended */
    MULTIPART_END       /* the closing boundary: what follows is ignored */
} multipart_event;

typedef struct multipart_part {
    char name[64];          /* Content-Disposition's name */
    char filename[256];     /* its filename (filename* when given), "" when none */
    int has_filename;       /* a filename was given (even an empty one): a file field */
    char content_type[128]; /* the part's Content-Type, "" when none */
} multipart_part;

/* Called for each event. MULTIPART_DATA passes its bytes (data, n); the other
 * events pass none. Return 0 to go on, -1 to stop (multipart_feed then
 * returns -1 with the reader's error unset), or, for MULTIPART_PART only, 1 to
 * pause: multipart_feed returns 1 having consumed the part's headers and
 * nothing after them. */
typedef int (*multipart_fn)(void *user, multipart_event ev, const multipart_part *part, const char *data,
                            size_t n);

typedef struct multipart {
    char delim[4 + MULTIPART_BOUNDARY_MAX + 1]; /* "\r\n--" + boundary */
    size_t delim_len;
    int state;
    size_t match;       /* bytes of delim matched so far */
    size_t carried;     /* of them, those that came in earlier pieces (not yet passed on) */
    char after[2];      /* the two bytes after a delimiter ("--" or "\r\n") */
    int n_after;
    char headers[MULTIPART_HEADERS_MAX];
    size_t headers_len;
    multipart_part part;
    char err[160];
} multipart;

/* Takes the boundary from a Content-Type header value ("multipart/form-data;
 * boundary=..."). 0, or -1 with m->err set (not multipart/form-data, no
 * boundary, or one RFC 2046 does not allow). */
int multipart_init(multipart *m, const char *content_type);

/* Reads n bytes of the body: 0 when all were consumed, 1 when fn paused
 * (*used bytes consumed; feed the rest later), -1 on a malformed body (m->err)
 * or when fn stopped it. */
int multipart_feed(multipart *m, const char *data, size_t n, size_t *used, multipart_fn fn, void *user);

/* The body has ended: 0 when the closing boundary was read, else -1 and m->err. */
int multipart_finish(multipart *m);

#endif
