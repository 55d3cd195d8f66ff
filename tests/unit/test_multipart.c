/* multipart/form-data reader: the forms clients send (httpx's, as the openai
 * client builds them; curl -F; a browser's FormData) read the same whatever
 * the pieces they arrive in (every split point of a form, random pieces of a
 * large one, a part whose data is full of near-delimiters); boundaries from
 * the header (quoted, bad ones refused); filename and filename*; pausing at a
 * part; malformed forms refused with a message; random and mutated bodies
 * never crash and never yield data beyond what was fed. */
#include <stdlib.h>
#include <string.h>

#include "server/multipart.h"
#include "test.h"

typedef struct seen {
    char log[1 << 16];  /* "P<name>|<filename>|<type>;" per part, data as is, "E;" per end, "$" at END */
    size_t len;
    int pause_at;       /* pause at the part with this index (-1: never) */
    int parts;
    size_t data_bytes;
} seen;

static void add(seen *s, const char *p, size_t n) {
    if (s->len + n >= sizeof s->log) n = sizeof s->log - 1 - s->len;
    memcpy(s->log + s->len, p, n);
    s->len += n;
    s->log[s->len] = 0;
}

static int on_event(void *user, multipart_event ev, const multipart_part *pt, const char *data, size_t n) {
    seen *s = user;
    char line[512];
    switch (ev) {
    case MULTIPART_PART:
        snprintf(line, sizeof line, "P%s|%s%s|%s;", pt->name, pt->has_filename ? "f:" : "", pt->filename,
                 pt->content_type);
        add(s, line, strlen(line));
        return s->parts++ == s->pause_at ? 1 : 0;
    case MULTIPART_DATA:
        s->data_bytes += n;
        add(s, data, n);
        return 0;
    case MULTIPART_PART_END:
        add(s, "E;", 2);
        return 0;
    case MULTIPART_END:
        add(s, "$", 1);
        return 0;
    }
    return 0;
}

/* Feeds body in pieces whose sizes come from sizes[] (cycled; 0 entries: whole),
 * resuming after pauses; returns the reader's last result (0: finished). */
static int read_form(const char *ct, const char *body, size_t len, const size_t *sizes, size_t n_sizes, seen *s,
                     char *err, size_t errlen) {
    multipart m;
    memset(s, 0, sizeof *s);
    s->pause_at = -1;
    if (multipart_init(&m, ct)) {
        snprintf(err, errlen, "%s", m.err);
        return -1;
    }
    size_t at = 0, k = 0;
    while (at < len) {
        size_t piece = n_sizes ? sizes[k++ % n_sizes] : len;
        if (piece > len - at) piece = len - at;
        size_t off = 0;
        while (off < piece) {
            size_t used;
            int rc = multipart_feed(&m, body + at + off, piece - off, &used, on_event, s);
            if (rc < 0) {
                snprintf(err, errlen, "%s", m.err);
                return -1;
            }
            off += used;
        }
        at += piece;
    }
    int rc = multipart_finish(&m);
    if (rc) snprintf(err, errlen, "%s", m.err);
    return rc;
}

static const char *CT = "multipart/form-data; boundary=----potserveBoundary7MA4YWxkTrZu0gW";
#define B "----potserveBoundary7MA4YWxkTrZu0gW" /* the boundary: "--" B starts a part */

static const char FORM[] =
    "--" B "\r\n"
    "Content-Disposition: form-data; name=\"purpose\"\r\n\r\n"
    "user_data\r\n"
    "--" B "\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"notes.txt\"\r\n"
    "Content-Type: text/plain\r\n\r\n"
    "line one\r\n-- not a boundary\r\n--" "----potserveBoundary7MA4YWx almost\r\n\r\r\n-\r\nend\r\n"
    "--" B "--\r\n";

static const char WANT[] =
    "Ppurpose||;user_dataE;"
    "Pfile|f:notes.txt|text/plain;line one\r\n-- not a boundary\r\n------potserveBoundary7MA4YWx almost\r\n\r\r\n-\r\nendE;$";

TEST(multipart_reads_a_form_split_anywhere) {
    seen s;
    char err[200];
    size_t len = sizeof FORM - 1;
    CHECK_EQ_INT(read_form(CT, FORM, len, NULL, 0, &s, err, sizeof err), 0);
    CHECK_STR(s.log, WANT);
    /* every split into two pieces, and every piece size from 1 to 9 */
    int bad = 0;
    for (size_t cut = 1; cut < len; cut++) {
        size_t sizes[2] = {cut, len};
        if (read_form(CT, FORM, len, sizes, 2, &s, err, sizeof err) || strcmp(s.log, WANT)) bad++;
    }
    for (size_t piece = 1; piece < 10; piece++)
        if (read_form(CT, FORM, len, &piece, 1, &s, err, sizeof err) || strcmp(s.log, WANT)) bad++;
    CHECK_EQ_INT(bad, 0);
}

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

TEST(multipart_large_data_of_near_delimiters_comes_through_whole) {
    /* 200 KB of data made of CR, LF, '-' and pieces of the boundary, in random pieces */
    const char *frags[] = {"\r", "\n", "-", "--", "\r\n", "\r\n--", "\r\n--" "----potserve", "\r\n--------potserveBoundary7MA4YWxkTrZu0g", "\r\n------potserveBoundary7MA4YWxkTrZu0g",
                           "------potserveBoundary7MA4YWxkTrZu0g", "text ", "\r\n-", "\r\r\n--"};
    size_t cap = 220000, n = 0;
    char *data = malloc(cap);
    uint64_t x = 42;
    while (n < 200000) {
        const char *f = frags[rng_next(&x) % (sizeof frags / sizeof *frags)];
        size_t l = strlen(f);
        memcpy(data + n, f, l);
        n += l;
    }
    const char *head = "--" B "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.txt\"\r\n\r\n";
    const char *tail = "\r\n--" B "--";
    size_t len = strlen(head) + n + strlen(tail);
    char *body = malloc(len);
    memcpy(body, head, strlen(head));
    memcpy(body + strlen(head), data, n);
    memcpy(body + strlen(head) + n, tail, strlen(tail));
    seen *s = malloc(sizeof *s);
    char err[200];
    int bad = 0;
    for (int round = 0; round < 20; round++) {
        size_t sizes[64];
        for (int k = 0; k < 64; k++) sizes[k] = 1 + rng_next(&x) % (round < 10 ? 97 : 9000);
        if (read_form(CT, body, len, sizes, 64, s, err, sizeof err)) {
            bad++;
            continue;
        }
        const char *want_head = "Pfile|f:big.txt|;";
        size_t hl = strlen(want_head);
        /* the log holds at most 64 KB: compare what it holds, and the byte count */
        if (s->data_bytes != n || strncmp(s->log, want_head, hl) || memcmp(s->log + hl, data, s->len - hl < n ? s->len - hl : n))
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    free(s);
    free(body);
    free(data);
}

TEST(multipart_boundaries_and_names_as_clients_send_them) {
    seen s;
    char err[200];
    /* curl: a preamble-free body, a quoted boundary, filename* (RFC 5987) winning over filename */
    const char *ct = "Multipart/Form-Data; charset=utf-8; boundary=\"a b:c\"";
    const char *body = "preamble text\r\n--a b:c\r\n"
                       "content-disposition: form-data; filename=\"x.txt\"; name=file; filename*=UTF-8''%E2%82%AC%20rates.txt\r\n"
                       "\r\n\xe2\x82\xac 1.08\r\n--a b:c  \r\n"
                       "Content-Disposition: form-data; name=\"purpose\"\r\n\r\n"
                       "assistants\r\n--a b:c--\r\nepilogue";
    CHECK_EQ_INT(read_form(ct, body, strlen(body), NULL, 0, &s, err, sizeof err), 0);
    CHECK_STR(s.log, "Pfile|f:\xe2\x82\xac rates.txt|;\xe2\x82\xac 1.08E;Ppurpose||;assistantsE;$");
    /* an escaped quote in a filename, an empty part, an empty filename (a browser's empty file input) */
    body = "--zz\r\nContent-Disposition: form-data; name=\"f\"; filename=\"say \\\"hi\\\".txt\"\r\n\r\n\r\n"
           "--zz\r\nContent-Disposition: form-data; name=\"g\"; filename=\"\"\r\n\r\n\r\n--zz--";
    CHECK_EQ_INT(read_form("multipart/form-data; boundary=zz", body, strlen(body), NULL, 0, &s, err, sizeof err), 0);
    CHECK_STR(s.log, "Pf|f:say \"hi\".txt|;E;Pg|f:|;E;$");
    /* headers refused */
    const char *bad_ct[] = {"application/json", "multipart/form-data", "multipart/form-data; boundary=",
                            "multipart/form-data; boundary=\"unclosed", "multipart/form-data; boundary=a\rb",
                            "multipart/form-data; boundary=01234567890123456789012345678901234567890123456789012345678901234567890",
                            "multipart/mixed; boundary=x", "multipart/form-dataX; boundary=x", NULL};
    for (int i = 0; bad_ct[i]; i++) {
        multipart m;
        CHECK(multipart_init(&m, bad_ct[i]) == -1 && m.err[0]);
    }
    multipart m;
    CHECK(multipart_init(&m, NULL) == -1);
}

TEST(multipart_refuses_malformed_forms_with_a_reason) {
    struct {
        const char *body, *why;
    } cases[] = {
        {"--zz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nno end", "before its closing boundary"},
        {"", "before its closing boundary"},
        {"no boundary at all", "before its closing boundary"},
        {"--zz\r\n\r\nno headers\r\n--zz--", "no Content-Disposition"},
        {"--zz\r\nContent-Disposition: attachment; name=\"a\"\r\n\r\nx\r\n--zz--", "must be form-data"},
        {"--zz\r\nContent-Disposition: form-data; filename=\"a\"\r\n\r\nx\r\n--zz--", "has no name"},
        {"--zz\r\nContent-Disposition: form-data; name=\"a\"\r\nbroken header\r\n\r\nx\r\n--zz--", "no colon"},
        {"--zzX\r\n", "neither"},
        {"--zz-x", "neither"},
        {"--zz\r\nContent-Disposition: form-data; name=\"a\"; filename*=latin1''x\r\n\r\nx\r\n--zz--", "filename*"},
        {"--zz\r\nContent-Disposition: form-data; name=\"a\"; filename*=UTF-8''a%00b\r\n\r\nx\r\n--zz--", "filename*"},
        {"--zz\r\nContent-Disposition: form-data; name=\"0123456789012345678901234567890123456789012345678901234567890123\"\r\n\r\n--zz--",
         "longer than 63"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        seen s;
        char err[200] = "";
        int rc = read_form("multipart/form-data; boundary=zz", cases[i].body, strlen(cases[i].body), NULL, 0, &s, err,
                           sizeof err);
        if (rc != -1 || !strstr(err, cases[i].why)) {
            fprintf(stderr, "  case %zu: rc %d, err '%s', expected '%s'\n", i, rc, err, cases[i].why);
            test_failures++;
        }
    }
    { /* a NUL in a part's headers: it cut the filename short, or hid the header after it */
        static const char nul[] = "--zz\r\nContent-Disposition: form-data; name=\"a\"; filename=\"a\0b\"\r\n\r\nx\r\n--zz--";
        seen s;
        char err[200] = "";
        CHECK_EQ_INT(read_form("multipart/form-data; boundary=zz", nul, sizeof nul - 1, NULL, 0, &s, err, sizeof err),
                     -1);
        CHECK(strstr(err, "NUL") != NULL);
    }
    /* headers beyond the limit */
    size_t n = 2 * MULTIPART_HEADERS_MAX;
    char *body = malloc(n + 1);
    memcpy(body, "--zz\r\nX-Long: ", 14);
    memset(body + 14, 'a', n - 14);
    body[n] = 0;
    seen s;
    char err[200];
    CHECK_EQ_INT(read_form("multipart/form-data; boundary=zz", body, n, NULL, 0, &s, err, sizeof err), -1);
    CHECK(strstr(err, "headers are longer") != NULL);
    free(body);
}

TEST(multipart_pauses_at_a_part_and_goes_on_where_it_stopped) {
    multipart m;
    seen s;
    memset(&s, 0, sizeof s);
    s.pause_at = 1; /* the file part */
    CHECK_EQ_INT(multipart_init(&m, CT), 0);
    size_t len = sizeof FORM - 1, used = 0;
    int rc = multipart_feed(&m, FORM, len, &used, on_event, &s);
    CHECK_EQ_INT(rc, 1);
    const char *data_start = strstr(FORM, "line one");
    CHECK_EQ_INT(used, data_start - FORM); /* consumed the headers and nothing of the data */
    size_t more;
    CHECK_EQ_INT(multipart_feed(&m, FORM + used, len - used, &more, on_event, &s), 0);
    CHECK_EQ_INT(more, len - used);
    CHECK_EQ_INT(multipart_finish(&m), 0);
    CHECK_STR(s.log, WANT);
}

TEST(multipart_survives_garbage_and_mutations) {
    uint64_t x = 7;
    char buf[700];
    seen *s = malloc(sizeof *s);
    char err[200];
    int crashed_logic = 0;
    for (int round = 0; round < 4000; round++) {
        size_t len;
        if (round % 2) { /* the form with a few bytes changed, cut or repeated */
            len = sizeof FORM - 1;
            memcpy(buf, FORM, len);
            int edits = 1 + (int)(rng_next(&x) % 4);
            for (int k = 0; k < edits && len; k++) {
                size_t at = rng_next(&x) % len;
                switch (rng_next(&x) % 3) {
                case 0: buf[at] = (char)(rng_next(&x) >> 56); break;
                case 1: len = at; break;
                default: if (len + 10 < sizeof buf) memmove(buf + at + 10, buf + at, len - at), len += 10; break;
                }
            }
        } else { /* random bytes drawn from the form's alphabet */
            len = rng_next(&x) % sizeof buf;
            const char alpha[] = "-\r\n\"; =:abzContent-Disposition form-data name filename" B;
            for (size_t k = 0; k < len; k++) buf[k] = alpha[rng_next(&x) % (sizeof alpha - 1)];
        }
        size_t sizes[3] = {1 + rng_next(&x) % 50, 1 + rng_next(&x) % 3, 1 + rng_next(&x) % 200};
        int rc = read_form(CT, buf, len, sizes, 3, s, err, sizeof err);
        if (s->data_bytes > len || (rc == -1 && !err[0])) crashed_logic++;
    }
    CHECK_EQ_INT(crashed_logic, 0);
    free(s);
}
