/* ECMA-262 regular expressions as DFAs over UTF-8 bytes (see regex.h).
 *
 * A recursive-descent parser builds a Thompson NFA whose edges are byte
 * ranges: a set of code points becomes the UTF-8 byte sequences of its
 * ranges (split so each byte position is one range, surrogates left out),
 * so the DFA accepts valid UTF-8 only. A counted repeat {n,m} parses its atom
 * again for each copy. The subset construction runs over byte classes (bytes
 * no edge tells apart), and states from which no match can be reached are
 * dropped, so every byte the DFA takes leaves a match reachable. */
#include "regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_NFA = 1 << 18, MAX_SUBSET_INTS = 1 << 20, MAX_CP = 0x10FFFF };
/* Groups nested deeper are refused: each is a few stack frames of the
 * recursive parser (30,000 overflowed the loop thread's stack). */
enum { MAX_GROUP_DEPTH = 100 };

typedef struct nstate {
    int32_t out, eps2; /* a byte edge to out; or epsilon edges to out and eps2 (-1: none) */
    uint8_t lo, hi, is_byte;
} nstate;

typedef struct range {
    uint32_t lo, hi;
} range;

typedef struct cpset {
    range *r;
    int n, cap;
} cpset;

typedef struct parser {
    const char *p, *end;
    nstate *st;
    int n, cap;
    char *err;
    size_t errlen;
    int failed;
    int depth; /* groups open: the parser recurses once per group */
} parser;

typedef struct frag {
    int32_t start, end; /* end: an epsilon state whose out is patched by what follows */
} frag;

struct regex_dfa {
    int32_t n_states, n_classes, start;
    uint8_t cls[256];
    int32_t *next; /* [state * n_classes + class], -1: dead */
    uint8_t *accepting;
};

static int fail(parser *ps, const char *msg) {
    if (!ps->failed) snprintf(ps->err, ps->errlen, "%s", msg);
    ps->failed = 1;
    return -1;
}

static int32_t new_state(parser *ps, int is_byte, uint8_t lo, uint8_t hi) {
    if (ps->failed) return -1;
    if (ps->n == ps->cap) {
        int cap = ps->cap ? ps->cap * 2 : 256;
        if (cap > MAX_NFA) return fail(ps, "the pattern is too large");
        nstate *t = realloc(ps->st, (size_t)cap * sizeof *t);
        if (!t) return fail(ps, "out of memory");
        ps->st = t;
        ps->cap = cap;
    }
    ps->st[ps->n] = (nstate){.out = -1, .eps2 = -1, .lo = lo, .hi = hi, .is_byte = (uint8_t)is_byte};
    return ps->n++;
}

static frag empty_frag(parser *ps) {
    int32_t s = new_state(ps, 0, 0, 0);
    return (frag){s, s};
}

static frag concat(parser *ps, frag a, frag b) {
    if (ps->failed) return a;
    ps->st[a.end].out = b.start;
    return (frag){a.start, b.end};
}

static frag alternate(parser *ps, frag a, frag b) {
    int32_t s = new_state(ps, 0, 0, 0), e = new_state(ps, 0, 0, 0);
    if (ps->failed) return a;
    ps->st[s].out = a.start;
    ps->st[s].eps2 = b.start;
    ps->st[a.end].out = e;
    ps->st[b.end].out = e;
    return (frag){s, e};
}

/* a* (a+ when at_least_one) */
static frag star(parser *ps, frag a, int at_least_one) {
    int32_t s = new_state(ps, 0, 0, 0), e = new_state(ps, 0, 0, 0);
    if (ps->failed) return a;
    ps->st[s].out = a.start;
    ps->st[s].eps2 = e;
    ps->st[a.end].out = s;
    return (frag){at_least_one ? a.start : s, e};
}

static frag optional(parser *ps, frag a) {
    int32_t s = new_state(ps, 0, 0, 0);
    if (ps->failed) return a;
    ps->st[s].out = a.start;
    ps->st[s].eps2 = a.end;
    return (frag){s, a.end};
}

/* ---- code point sets ---- */

static int set_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        range *t = realloc(s->r, (size_t)cap * sizeof *t);
        if (!t) return -1;
        s->r = t;
        s->cap = cap;
    }
    s->r[s->n++] = (range){lo, hi};
    return 0;
}

static int by_lo(const void *a, const void *b) {
    uint32_t x = ((const range *)a)->lo, y = ((const range *)b)->lo;
    return x < y ? -1 : x > y;
}

static void set_normalize(cpset *s) {
    if (!s->n) return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, by_lo);
    int k = 0;
    for (int i = 0; i < s->n; i++)
        if (k && s->r[i].lo <= s->r[k - 1].hi + 1) {
            if (s->r[i].hi > s->r[k - 1].hi) s->r[k - 1].hi = s->r[i].hi;
        } else {
            s->r[k++] = s->r[i];
        }
    s->n = k;
}

/* The code points of [lo, hi] not in s (s normalized). */
static int set_negate(cpset *s, uint32_t lo, uint32_t hi) {
    cpset out = {0};
    uint32_t at = lo;
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        if (s->r[i].hi < at || s->r[i].lo > hi) continue;
        if (s->r[i].lo > at) rc = set_add(&out, at, s->r[i].lo - 1);
        at = s->r[i].hi + 1;
    }
    if (!rc && at <= hi) rc = set_add(&out, at, hi);
    free(s->r);
    *s = out;
    return rc;
}

static int add_class(cpset *s, char k) { /* \d \w \s and their negations, ASCII (see regex.h) */
    cpset c = {0};
    int rc = 0;
    switch (k | 0x20) {
    case 'd': rc = set_add(&c, '0', '9'); break;
    case 'w':
        rc = set_add(&c, '0', '9') || set_add(&c, 'A', 'Z') || set_add(&c, 'a', 'z') || set_add(&c, '_', '_');
        break;
    case 's': rc = set_add(&c, '\t', '\r') || set_add(&c, ' ', ' '); break;
    }
    set_normalize(&c);
    if (!rc && k >= 'A' && k <= 'Z') rc = set_negate(&c, 0, 0x7F);
    for (int i = 0; i < c.n && !rc; i++) rc = set_add(s, c.r[i].lo, c.r[i].hi);
    free(c.r);
    return rc;
}

/* ---- UTF-8 ---- */

static int utf8_encode(uint32_t cp, uint8_t *b) {
    if (cp < 0x80) return b[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return b[0] = (uint8_t)(0xC0 | cp >> 6), b[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return b[0] = (uint8_t)(0xE0 | cp >> 12), b[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)),
               b[2] = (uint8_t)(0x80 | (cp & 0x3F)), 3;
    b[0] = (uint8_t)(0xF0 | cp >> 18), b[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    b[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* The byte paths of a set under construction: each path's states branch off
 * a chain of splits at `branch`; paths end in shared states (see set_frag). */
typedef struct paths {
    int32_t branch; /* the last split of the chain, whose eps2 the next path takes (-1: none yet) */
    int32_t start;  /* the first split */
    int32_t tail[4]; /* tail[k]: k more bytes of 80-BF, then the set's end (tail[0] is the end) */
} paths;

/* Adds the byte path of the code points [lo, hi]: split until the ends share
 * their encoded length and every byte position is one range. A path's last
 * bytes of 80-BF (any continuation byte) go to the shared tail, so the DFA
 * state after a lead byte is the same for every path. */
static void add_utf8(parser *ps, uint32_t lo, uint32_t hi, paths *pt) {
    static const uint32_t len_max[] = {0x7F, 0x7FF, 0xFFFF};
    if (ps->failed || lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) { /* no surrogates */
        if (lo < 0xD800) add_utf8(ps, lo, 0xD7FF, pt);
        if (hi > 0xDFFF) add_utf8(ps, 0xE000, hi, pt);
        return;
    }
    for (int i = 0; i < 3; i++)
        if (lo <= len_max[i] && hi > len_max[i]) {
            add_utf8(ps, lo, len_max[i], pt);
            add_utf8(ps, len_max[i] + 1, hi, pt);
            return;
        }
    if (hi >= 0x80)
        for (int i = 1; i < 4; i++) {
            uint32_t m = (1u << (6 * i)) - 1;
            if ((lo & ~m) == (hi & ~m)) continue;
            if (lo & m) {
                add_utf8(ps, lo, lo | m, pt);
                add_utf8(ps, (lo | m) + 1, hi, pt);
                return;
            }
            if ((hi & m) != m) {
                add_utf8(ps, lo, (hi & ~m) - 1, pt);
                add_utf8(ps, hi & ~m, hi, pt);
                return;
            }
        }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a), k = 0;
    utf8_encode(hi, b);
    while (k < n - 1 && a[n - 1 - k] == 0x80 && b[n - 1 - k] == 0xBF) k++; /* the shared tail's part */
    for (int t = 1; t <= k && !ps->failed; t++)
        if (pt->tail[t] < 0) {
            int32_t x = new_state(ps, 1, 0x80, 0xBF);
            if (!ps->failed) ps->st[x].out = pt->tail[t - 1], pt->tail[t] = x;
        }
    int32_t split = new_state(ps, 0, 0, 0), prev = -1;
    for (int i = 0; i < n - k && !ps->failed; i++) {
        int32_t x = new_state(ps, 1, a[i], b[i]);
        if (ps->failed) return;
        if (prev < 0) ps->st[split].out = x;
        else ps->st[prev].out = x;
        prev = x;
    }
    if (ps->failed) return;
    ps->st[prev].out = pt->tail[k];
    if (pt->branch < 0) pt->start = split;
    else ps->st[pt->branch].eps2 = split;
    pt->branch = split;
}

static frag set_frag(parser *ps, cpset *s) {
    set_normalize(s);
    paths pt = {.branch = -1, .start = -1, .tail = {new_state(ps, 0, 0, 0), -1, -1, -1}};
    for (int i = 0; i < s->n; i++) add_utf8(ps, s->r[i].lo, s->r[i].hi, &pt);
    if (ps->failed) return (frag){-1, -1};
    if (pt.start < 0) { /* an empty class: a state with no way out */
        int32_t dead = new_state(ps, 1, 1, 0); /* lo > hi: no byte */
        if (!ps->failed) ps->st[dead].out = pt.tail[0];
        pt.start = dead;
    }
    return (frag){pt.start, pt.tail[0]};
}

/* ---- the parser ---- */

static frag parse_alternation(parser *ps, int top);

static int hex_value(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

/* One UTF-8 character of the pattern itself. */
static uint32_t pattern_char(parser *ps) {
    const unsigned char *p = (const unsigned char *)ps->p;
    int n = p[0] < 0x80 ? 1 : p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC0 ? 2 : 0;
    if (!n || ps->p + n > ps->end) return fail(ps, "the pattern is not UTF-8"), 0;
    uint32_t cp = n == 1 ? p[0] : p[0] & (0x3F >> (n - 1));
    for (int i = 1; i < n; i++) cp = cp << 6 | (p[i] & 0x3F);
    ps->p += n;
    return cp;
}

/* After a backslash: a class escape into s (returns 1), or one code point in *cp (returns 0). */
static int parse_escape(parser *ps, cpset *s, uint32_t *cp, int in_class) {
    if (ps->p >= ps->end) return fail(ps, "the pattern ends with a backslash");
    char c = *ps->p++;
    int h[4];
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        if (add_class(s, c)) return fail(ps, "out of memory");
        return 1;
    case 't': *cp = '\t'; return 0;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'f': *cp = '\f'; return 0;
    case '0':
        if (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') /* Python reads \01 as an octal escape */
            return fail(ps, "\\0 followed by a digit reads differently in ECMA-262 and Python (write \\x00)");
        *cp = 0;
        return 0;
    case 'b':
        if (in_class) return *cp = '\b', 0;
        return fail(ps, "\\b (a word boundary) is not supported in a pattern");
    case 'x':
        if (ps->end - ps->p < 2 || (h[0] = hex_value(ps->p[0])) < 0 || (h[1] = hex_value(ps->p[1])) < 0)
            return fail(ps, "\\x needs two hex digits");
        ps->p += 2;
        *cp = (uint32_t)(h[0] * 16 + h[1]);
        return 0;
    case 'u':
        if (ps->end - ps->p < 4) return fail(ps, "\\u needs four hex digits");
        for (int i = 0; i < 4; i++)
            if ((h[i] = hex_value(ps->p[i])) < 0) return fail(ps, "\\u needs four hex digits");
        ps->p += 4;
        *cp = (uint32_t)(h[0] << 12 | h[1] << 8 | h[2] << 4 | h[3]);
        if (*cp >= 0xD800 && *cp <= 0xDFFF) return fail(ps, "a surrogate \\u escape is not supported in a pattern");
        return 0;
    default:
        if ((c >= '1' && c <= '9') || c == 'k') return fail(ps, "backreferences are not supported in a pattern");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return fail(ps, "this escape (\\B, \\c, \\p, ...) is not supported in a pattern");
        ps->p--;
        *cp = pattern_char(ps); /* an escaped character stands for itself */
        return 0;
    }
}

static frag parse_class(parser *ps) { /* after '[' */
    cpset s = {0};
    int negated = ps->p < ps->end && *ps->p == '^';
    ps->p += negated;
    if (ps->p < ps->end && *ps->p == ']') /* ECMA-262: the empty class; Python: a ']' in the class */
        return fail(ps, "a class starting with ']' reads differently in ECMA-262 and Python (write \\])"),
               (frag){-1, -1};
    while (!ps->failed) {
        if (ps->p >= ps->end) {
            fail(ps, "a '[' is not closed");
            break;
        }
        if (*ps->p == ']') {
            ps->p++;
            break;
        }
        uint32_t lo, hi;
        int is_class = 0;
        if (*ps->p == '\\') ps->p++, is_class = parse_escape(ps, &s, &lo, 1);
        else lo = pattern_char(ps);
        if (ps->failed || is_class) continue;
        hi = lo;
        if (ps->end - ps->p >= 2 && ps->p[0] == '-' && ps->p[1] != ']') {
            ps->p++;
            if (*ps->p == '\\') {
                ps->p++;
                if (parse_escape(ps, &s, &hi, 1) == 1) fail(ps, "a range in [] ends with a class escape");
            } else {
                hi = pattern_char(ps);
            }
            if (!ps->failed && hi < lo) fail(ps, "a range in [] is out of order");
        }
        if (!ps->failed && set_add(&s, lo, hi)) fail(ps, "out of memory");
    }
    set_normalize(&s);
    if (negated && set_negate(&s, 0, MAX_CP)) fail(ps, "out of memory");
    frag f = ps->failed ? (frag){-1, -1} : set_frag(ps, &s);
    free(s.r);
    return f;
}

static frag single(parser *ps, uint32_t lo, uint32_t hi) {
    cpset s = {0};
    if (set_add(&s, lo, hi)) return fail(ps, "out of memory"), (frag){-1, -1};
    frag f = set_frag(ps, &s);
    free(s.r);
    return f;
}

/* '.': any character but a line terminator */
static frag any_char(parser *ps) {
    cpset s = {0};
    if (set_add(&s, '\n', '\n') || set_add(&s, '\r', '\r') || set_add(&s, 0x2028, 0x2029) ||
        (set_normalize(&s), set_negate(&s, 0, MAX_CP)))
        return fail(ps, "out of memory"), (frag){-1, -1};
    frag f = set_frag(ps, &s);
    free(s.r);
    return f;
}

static frag parse_atom(parser *ps) {
    char c = *ps->p;
    if (c == '(') {
        ps->p++;
        if (ps->p < ps->end && *ps->p == '?') {
            if (ps->end - ps->p >= 2 && ps->p[1] == ':') ps->p += 2;
            else if (ps->end - ps->p >= 3 && ps->p[1] == '<' && ps->p[2] != '=' && ps->p[2] != '!') {
                const char *close = memchr(ps->p, '>', (size_t)(ps->end - ps->p));
                if (!close) return fail(ps, "a group name is not closed"), (frag){-1, -1};
                ps->p = close + 1;
            } else if (ps->end - ps->p >= 2 && (ps->p[1] == '=' || ps->p[1] == '!' || ps->p[1] == '<')) {
                return fail(ps, "lookahead and lookbehind are not supported in a pattern"), (frag){-1, -1};
            } else {
                return fail(ps, "this (? group is not ECMA-262 syntax"), (frag){-1, -1};
            }
        }
        if (++ps->depth > MAX_GROUP_DEPTH)
            return fail(ps, "the pattern nests groups more than 100 deep"), (frag){-1, -1};
        frag f = parse_alternation(ps, 0);
        ps->depth--;
        if (!ps->failed && (ps->p >= ps->end || *ps->p != ')')) fail(ps, "a '(' is not closed");
        ps->p++;
        return f;
    }
    ps->p++;
    if (c == '[') return parse_class(ps);
    if (c == '.') return any_char(ps);
    if (c == '\\') {
        cpset s = {0};
        uint32_t cp;
        int is_class = parse_escape(ps, &s, &cp, 0);
        frag f = is_class == 1 ? set_frag(ps, &s) : is_class == 0 ? single(ps, cp, cp) : (frag){-1, -1};
        free(s.r);
        return f;
    }
    if (c == '^' || c == '$')
        return fail(ps, "^ and $ are supported only at the ends of the pattern or of its top-level alternatives"),
               (frag){-1, -1};
    if (c == '*' || c == '+' || c == '?') return fail(ps, "a quantifier follows nothing"), (frag){-1, -1};
    if (c == ')') return fail(ps, "a ')' is not opened"), (frag){-1, -1};
    ps->p--;
    uint32_t cp = pattern_char(ps);
    return ps->failed ? (frag){-1, -1} : single(ps, cp, cp);
}

/* {n}, {n,}, {n,m} at ps->p: 1 with the counts (m = -1: no limit), 0 when it is not
 * a quantifier (then '{' is a character, as ECMA-262 reads it without the u flag). */
static int parse_braces(parser *ps, long *n, long *m) {
    const char *p = ps->p + 1;
    char *e;
    if (p < ps->end && *p == ',') /* {,n}: a repeat in Python, characters in ECMA-262 */
        return fail(ps, "{,n} reads differently in ECMA-262 and Python (write {0,n})");
    if (p >= ps->end || *p < '0' || *p > '9') return 0;
    *n = strtol(p, &e, 10);
    *m = *n;
    if (e < ps->end && *e == ',') {
        *m = -1;
        if (e + 1 < ps->end && e[1] >= '0' && e[1] <= '9') *m = strtol(e + 1, &e, 10);
        else e++;
    }
    if (e >= ps->end || *e != '}') return 0;
    ps->p = e + 1;
    return 1;
}

static frag parse_repeat(parser *ps) {
    const char *atom_at = ps->p;
    frag f = parse_atom(ps);
    if (ps->failed || ps->p >= ps->end) return f;
    char c = *ps->p;
    long n = 0, m = 0;
    if (c == '*' || c == '+' || c == '?') {
        ps->p++;
        f = c == '?' ? optional(ps, f) : star(ps, f, c == '+');
    } else if (c == '{' && parse_braces(ps, &n, &m)) {
        if ((m >= 0 && m < n) || n > 1000 || m > 1000)
            return fail(ps, "a {n,m} repeat is out of order or above 1000"), f;
        const char *after = ps->p;
        /* n copies, then (m < 0) a star of one more, or the m - n optional ones nested as
           (x(x(x)?)?)?: skipping the rest is one step, so the DFA's subsets stay small */
        frag head = n ? f : empty_frag(ps), tail = empty_frag(ps); /* the first copy is f itself */
        for (long i = 1; i < n && !ps->failed; i++) {
            ps->p = atom_at; /* each copy parses the atom again */
            head = concat(ps, head, parse_atom(ps));
        }
        if (m < 0) {
            frag more = n ? (ps->p = atom_at, parse_atom(ps)) : f;
            tail = star(ps, more, 0);
        } else {
            for (long i = n; i < m && !ps->failed; i++) {
                frag copy = n == 0 && i == 0 ? f : (ps->p = atom_at, parse_atom(ps));
                tail = optional(ps, concat(ps, copy, tail));
            }
        }
        f = concat(ps, head, tail);
        ps->p = after;
    } else {
        return f;
    }
    if (ps->p < ps->end && *ps->p == '?') ps->p++; /* lazy: the same strings */
    long n2, m2;
    const char *at = ps->p;
    if (!ps->failed && ps->p < ps->end &&
        (*ps->p == '*' || *ps->p == '+' || *ps->p == '?' || (*ps->p == '{' && parse_braces(ps, &n2, &m2))))
        return ps->p = at, fail(ps, "a quantifier follows a quantifier"), f;
    return f;
}

/* A branch: atoms up to '|' or ')' or the end. At the top level ^ may open
 * it and $ close it; otherwise the branch is open at that side (a search). */
static frag parse_branch(parser *ps, int top) {
    int anchored_start = top && ps->p < ps->end && *ps->p == '^';
    ps->p += anchored_start;
    frag f = empty_frag(ps);
    int anchored_end = 0;
    while (!ps->failed && ps->p < ps->end && *ps->p != '|' && *ps->p != ')') {
        if (top && *ps->p == '$' && (ps->p + 1 == ps->end || ps->p[1] == '|')) {
            ps->p++;
            anchored_end = 1;
            break;
        }
        f = concat(ps, f, parse_repeat(ps));
    }
    if (top && !anchored_start) f = concat(ps, star(ps, single(ps, 0, MAX_CP), 0), f);
    if (top && !anchored_end) f = concat(ps, f, star(ps, single(ps, 0, MAX_CP), 0));
    return f;
}

static frag parse_alternation(parser *ps, int top) {
    frag f = parse_branch(ps, top);
    while (!ps->failed && ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        f = alternate(ps, f, parse_branch(ps, top));
    }
    return f;
}

/* ---- the subset construction ---- */

enum { SUBSET_SLOTS = 2 * REGEX_MAX_STATES }; /* a power of two */

typedef struct subset_table {
    int32_t **sets; /* each: its size, then its sorted NFA states */
    int n, cap;
    int32_t slot[SUBSET_SLOTS]; /* open addressing by the set's hash: index + 1, 0 empty */
    size_t ints;                /* stored so far: at most MAX_SUBSET_INTS */
} subset_table;

static void closure(const nstate *st, int32_t s, uint8_t *seen, int32_t *stack, int32_t *out, int *n_out) {
    int sp = 0;
    stack[sp++] = s;
    while (sp) {
        int32_t x = stack[--sp];
        if (x < 0 || seen[x]) continue;
        seen[x] = 1;
        out[(*n_out)++] = x;
        if (!st[x].is_byte) {
            stack[sp++] = st[x].out;
            stack[sp++] = st[x].eps2;
        }
    }
}

static int by_int(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* The DFA state of the (sorted) set, added when new; -1 when out of room. */
static int32_t subset_id(subset_table *t, const int32_t *set, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)set[i]) * 16777619u;
    uint32_t at = h & (SUBSET_SLOTS - 1);
    for (; t->slot[at]; at = (at + 1) & (SUBSET_SLOTS - 1)) {
        const int32_t *had = t->sets[t->slot[at] - 1];
        if (had[0] == n && !memcmp(had + 1, set, (size_t)n * sizeof *set)) return t->slot[at] - 1;
    }
    if (t->n == REGEX_MAX_STATES || t->ints + (size_t)n + 1 > MAX_SUBSET_INTS) return -1;
    t->ints += (size_t)n + 1;
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 64;
        int32_t **s = realloc(t->sets, (size_t)cap * sizeof *s);
        if (!s) return -1;
        t->sets = s;
        t->cap = cap;
    }
    int32_t *copy = malloc((size_t)(n + 1) * sizeof *copy);
    if (!copy) return -1;
    copy[0] = n;
    memcpy(copy + 1, set, (size_t)n * sizeof *set);
    t->sets[t->n] = copy;
    t->slot[at] = t->n + 1;
    return t->n++;
}

/* Cuts the edges into states from which no match is reachable (the start too: -1). */
static int prune_dead(regex_dfa *d) {
    uint8_t ones[256];
    memset(ones, 1, sizeof ones);
    uint32_t *dist = malloc((size_t)(d->n_states > 0 ? d->n_states : 1) * sizeof *dist);
    if (!dist || regex_distances(d, ones, dist)) return free(dist), -1;
    for (size_t i = 0; i < (size_t)d->n_states * (size_t)d->n_classes; i++)
        if (d->next[i] >= 0 && dist[d->next[i]] == UINT32_MAX) d->next[i] = -1;
    if (d->start >= 0 && dist[d->start] == UINT32_MAX) d->start = -1;
    free(dist);
    return 0;
}

static regex_dfa *build_dfa(parser *ps, frag f, int32_t match) {
    const nstate *st = ps->st;
    int n = ps->n;
    regex_dfa *d = calloc(1, sizeof *d);
    uint8_t cut[257] = {0}, *seen = calloc((size_t)n, 1);
    int32_t *stack = malloc((size_t)(2 * n + 2) * sizeof *stack), *set = malloc((size_t)n * sizeof *set);
    subset_table *tp = calloc(1, sizeof *tp);
    int32_t *next = NULL, rows = 0;
    uint8_t *acc = NULL;
    if (!d || !seen || !stack || !set || !tp) goto oom;
    for (int i = 0; i < n; i++)
        if (st[i].is_byte && st[i].lo <= st[i].hi) cut[st[i].lo] = cut[st[i].hi + 1] = 1;
    cut[0x80] = cut[0xC0] = 1; /* a class either starts characters or continues them (regex_limit_length) */
    for (int b = 0, c = -1; b < 256; b++) d->cls[b] = (uint8_t)(c += (b == 0 || cut[b]));
    d->n_classes = d->cls[255] + 1;
    uint8_t rep[256]; /* a byte of each class */
    for (int b = 255; b >= 0; b--) rep[d->cls[b]] = (uint8_t)b;
    int k = 0;
    closure(st, f.start, seen, stack, set, &k);
    memset(seen, 0, (size_t)n);
    qsort(set, (size_t)k, sizeof *set, by_int);
    if (subset_id(tp, set, k) < 0) goto oom;
    for (int32_t i = 0; i < tp->n; i++) {
        if (i >= rows) {
            int32_t r = rows ? rows * 2 : 64;
            int32_t *nx = realloc(next, (size_t)r * (size_t)d->n_classes * sizeof *nx);
            uint8_t *ac = realloc(acc, (size_t)r);
            if (nx) next = nx;
            if (ac) acc = ac;
            if (!nx || !ac) goto oom;
            rows = r;
        }
        const int32_t *cur = tp->sets[i] + 1;
        int m = tp->sets[i][0];
        acc[i] = 0;
        for (int j = 0; j < m; j++) acc[i] |= cur[j] == match;
        for (int c = 0; c < d->n_classes; c++) {
            uint8_t b = rep[c];
            k = 0;
            for (int j = 0; j < m; j++) {
                const nstate *x = &st[tp->sets[i][1 + j]];
                if (x->is_byte && x->lo <= b && b <= x->hi) closure(st, x->out, seen, stack, set, &k);
            }
            for (int j = 0; j < k; j++) seen[set[j]] = 0;
            qsort(set, (size_t)k, sizeof *set, by_int);
            int32_t id = k ? subset_id(tp, set, k) : -1;
            if (k && id < 0) {
                snprintf(ps->err, ps->errlen, "the pattern needs more than %d automaton states (or is too complex)",
                         REGEX_MAX_STATES);
                goto refused;
            }
            next[(size_t)i * (size_t)d->n_classes + (size_t)c] = id;
            cur = tp->sets[i] + 1; /* tp->sets may have moved */
        }
    }
    d->n_states = tp->n;
    d->next = next;
    d->accepting = acc;
    d->start = 0;
    if (prune_dead(d)) goto oom;
    goto done;
oom:
    snprintf(ps->err, ps->errlen, "out of memory");
refused:
    free(next);
    free(acc);
    free(d);
    d = NULL;
done:
    for (int i = 0; tp && i < tp->n; i++) free(tp->sets[i]);
    if (tp) free(tp->sets);
    free(tp);
    free(seen);
    free(stack);
    free(set);
    return d;
}

regex_dfa *regex_compile(const char *pattern, char *err, size_t errlen) {
    parser ps = {.p = pattern, .end = pattern + strlen(pattern), .err = err, .errlen = errlen};
    frag f = parse_alternation(&ps, 1);
    if (!ps.failed && ps.p < ps.end) fail(&ps, "a ')' is not opened");
    int32_t match = new_state(&ps, 0, 0, 0);
    regex_dfa *d = NULL;
    if (!ps.failed) {
        ps.st[f.end].out = match;
        d = build_dfa(&ps, f, match);
    }
    free(ps.st);
    return d;
}

void regex_free(regex_dfa *d) {
    if (!d) return;
    free(d->next);
    free(d->accepting);
    free(d);
}

int32_t regex_start(const regex_dfa *d) { return d->start; }

int32_t regex_next(const regex_dfa *d, int32_t state, uint8_t b) {
    return state < 0 ? -1 : d->next[(size_t)state * (size_t)d->n_classes + d->cls[b]];
}

int regex_accepting(const regex_dfa *d, int32_t state) { return state >= 0 && d->accepting[state]; }

int32_t regex_n_states(const regex_dfa *d) { return d->n_states; }

/* Shortest paths from the matching states backwards, over each class's cheapest byte. */
int regex_distances(const regex_dfa *d, const uint8_t cost[256], uint32_t *dist) {
    int32_t n = d->n_states, k = d->n_classes;
    uint8_t w[256] = {0}; /* a class's cheapest byte, 0: none can be written */
    for (int b = 0; b < 256; b++)
        if (cost[b] && (!w[d->cls[b]] || cost[b] < w[d->cls[b]])) w[d->cls[b]] = cost[b];
    int32_t *first = malloc((size_t)(n + 1) * sizeof *first), *from = malloc((size_t)n * (size_t)k * sizeof *from);
    uint8_t *weight = malloc((size_t)n * (size_t)k), *done = calloc((size_t)n, 1);
    int rc = first && from && weight && done ? 0 : -1;
    if (!rc) { /* the edges into each state, grouped by target (counting sort) */
        memset(first, 0, (size_t)(n + 1) * sizeof *first);
        for (size_t e = 0; e < (size_t)n * (size_t)k; e++)
            if (d->next[e] >= 0 && w[e % (size_t)k]) first[d->next[e] + 1]++;
        for (int32_t i = 0; i < n; i++) first[i + 1] += first[i];
        int32_t *fill = malloc((size_t)n * sizeof *fill);
        if (!fill) rc = -1;
        for (int32_t i = 0; !rc && i < n; i++) fill[i] = first[i];
        for (size_t e = 0; !rc && e < (size_t)n * (size_t)k; e++)
            if (d->next[e] >= 0 && w[e % (size_t)k]) {
                int32_t at = fill[d->next[e]]++;
                from[at] = (int32_t)(e / (size_t)k);
                weight[at] = w[e % (size_t)k];
            }
        free(fill);
    }
    for (int32_t i = 0; !rc && i < n; i++) dist[i] = d->accepting[i] ? 0 : UINT32_MAX;
    /* Dial's algorithm: edge weights are 1 or 2, so three rotating buckets of states */
    int32_t *bucket[3], len[3] = {0};
    for (int i = 0; i < 3; i++) bucket[i] = rc ? NULL : malloc((size_t)n * 3 * sizeof **bucket);
    if (!rc && (!bucket[0] || !bucket[1] || !bucket[2])) rc = -1;
    for (int32_t i = 0; !rc && i < n; i++)
        if (!dist[i]) bucket[0][len[0]++] = i;
    for (uint32_t at = 0, empty = 0; !rc && empty < 3; at++) {
        int32_t *q = bucket[at % 3];
        if (!len[at % 3]) {
            empty++;
            continue;
        }
        empty = 0;
        for (int32_t j = 0; j < len[at % 3]; j++) {
            int32_t x = q[j];
            if (done[x] || dist[x] != at) continue;
            done[x] = 1;
            for (int32_t e = first[x]; e < first[x + 1]; e++) {
                uint32_t nd = at + weight[e];
                int32_t y = from[e];
                if (nd < dist[y]) {
                    dist[y] = nd;
                    int32_t *yq = bucket[nd % 3];
                    if (len[nd % 3] < n * 3) yq[len[nd % 3]++] = y;
                }
            }
        }
        len[at % 3] = 0;
    }
    for (int i = 0; i < 3; i++) free(bucket[i]);
    free(first);
    free(from);
    free(weight);
    free(done);
    return rc;
}

/* ---- lengths in characters (JSON Schema's minLength and maxLength count code points) ---- */

static int starts_char(const regex_dfa *d, int cls) {
    for (int b = 0; b < 256; b++) /* classes never mix bytes that start characters with others */
        if (d->cls[b] == cls) return b < 0x80 || b >= 0xC0;
    return 0;
}

int regex_length_bounds(const regex_dfa *d, int64_t *min_chars, int64_t *max_chars) {
    int32_t n = d->n_states, k = d->n_classes;
    *min_chars = -1;
    *max_chars = -1;
    if (d->start < 0) return 0;
    int64_t *lo = malloc((size_t)n * sizeof *lo), *hi = malloc((size_t)n * sizeof *hi);
    int32_t *indeg = calloc((size_t)n, sizeof *indeg), *order = malloc((size_t)n * sizeof *order);
    uint8_t *seen = calloc((size_t)n, 1), w[256];
    int rc = lo && hi && indeg && order && seen ? 0 : -1;
    for (int c = 0; c < k; c++) w[c] = (uint8_t)starts_char(d, c);
    int32_t m = 0; /* the states reachable from the start, then Kahn's order of them */
    if (!rc) seen[d->start] = 1, order[m++] = d->start;
    for (int32_t i = 0; !rc && i < m; i++)
        for (int c = 0; c < k; c++) {
            int32_t t = d->next[(size_t)order[i] * (size_t)k + (size_t)c];
            if (t >= 0 && !seen[t]) seen[t] = 1, order[m++] = t;
            if (t >= 0) indeg[t]++;
        }
    int32_t sorted = 0, head = 0;
    int32_t *queue = rc ? NULL : malloc((size_t)n * sizeof *queue);
    if (!rc && !queue) rc = -1;
    if (!rc) {
        for (int32_t i = 0; i < n; i++) lo[i] = INT64_MAX, hi[i] = -1;
        lo[d->start] = hi[d->start] = 0;
        queue[sorted++] = d->start; /* the start has no edge in on an acyclic DFA */
        if (indeg[d->start]) sorted = 0;
        while (head < sorted) {
            int32_t x = queue[head++];
            for (int c = 0; c < k; c++) {
                int32_t t = d->next[(size_t)x * (size_t)k + (size_t)c];
                if (t < 0) continue;
                if (hi[x] + w[c] > hi[t]) hi[t] = hi[x] + w[c];
                if (--indeg[t] == 0) queue[sorted++] = t;
            }
        }
        if (sorted == m) { /* acyclic: the longest match is finite */
            for (int32_t i = 0; i < m; i++)
                if (d->accepting[order[i]] && hi[order[i]] > *max_chars) *max_chars = hi[order[i]];
        }
        /* the shortest: 0-1 weights, relaxed in rounds (a pass per character at most) */
        for (int changed = 1; changed;) {
            changed = 0;
            for (int32_t i = 0; i < m; i++) {
                int32_t x = order[i];
                if (lo[x] == INT64_MAX) continue;
                for (int c = 0; c < k; c++) {
                    int32_t t = d->next[(size_t)x * (size_t)k + (size_t)c];
                    if (t >= 0 && lo[x] + w[c] < lo[t]) lo[t] = lo[x] + w[c], changed = 1;
                }
            }
        }
        for (int32_t i = 0; i < m; i++)
            if (d->accepting[order[i]] && (*min_chars < 0 || lo[order[i]] < *min_chars)) *min_chars = lo[order[i]];
    }
    free(lo);
    free(hi);
    free(indeg);
    free(order);
    free(seen);
    free(queue);
    return rc;
}

regex_dfa *regex_limit_length(const regex_dfa *d, int32_t min_chars, int32_t max_chars, char *err, size_t errlen) {
    int32_t cap = max_chars >= 0 ? max_chars : min_chars, k = d->n_classes; /* counts above cap: cap (no max) */
    size_t pairs = (size_t)d->n_states * (size_t)(cap + 1);
    if (pairs > (size_t)REGEX_MAX_STATES * 64)
        return snprintf(err, errlen, "the pattern with this minLength/maxLength is too complex"), NULL;
    regex_dfa *p = calloc(1, sizeof *p);
    int32_t *id = malloc(pairs * sizeof *id), *pair = malloc((size_t)REGEX_MAX_STATES * sizeof *pair);
    int32_t *next = malloc((size_t)REGEX_MAX_STATES * (size_t)k * sizeof *next);
    uint8_t *acc = malloc(REGEX_MAX_STATES), w[256];
    if (!p || !id || !pair || !next || !acc) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (int c = 0; c < k; c++) w[c] = (uint8_t)starts_char(d, c);
    for (size_t i = 0; i < pairs; i++) id[i] = -1;
    int32_t n = 0;
    if (d->start >= 0) id[(size_t)d->start * (size_t)(cap + 1)] = 0, pair[n++] = d->start * (cap + 1);
    for (int32_t i = 0; i < n; i++) { /* breadth first over (state, characters so far) */
        int32_t s = pair[i] / (cap + 1), count = pair[i] % (cap + 1);
        acc[i] = d->accepting[s] && count >= min_chars;
        for (int c = 0; c < k; c++) {
            int32_t t = d->next[(size_t)s * (size_t)k + (size_t)c], after = count + w[c];
            if (after > cap) after = max_chars >= 0 ? -1 : cap;
            int32_t to = -1;
            if (t >= 0 && after >= 0) {
                size_t key = (size_t)t * (size_t)(cap + 1) + (size_t)after;
                if (id[key] < 0) {
                    if (n == REGEX_MAX_STATES) {
                        snprintf(err, errlen, "the pattern with this minLength/maxLength needs more than %d states",
                                 REGEX_MAX_STATES);
                        goto fail;
                    }
                    id[key] = n;
                    pair[n++] = (int32_t)key;
                }
                to = id[key];
            }
            next[(size_t)i * (size_t)k + (size_t)c] = to;
        }
    }
    memcpy(p->cls, d->cls, sizeof p->cls);
    p->n_classes = k;
    p->n_states = n;
    p->start = n ? 0 : -1;
    p->next = next;
    p->accepting = acc;
    if (prune_dead(p)) {
        snprintf(err, errlen, "out of memory");
        p->next = NULL, p->accepting = NULL;
        goto fail;
    }
    free(id);
    free(pair);
    return p;
fail:
    free(p);
    free(id);
    free(pair);
    free(next);
    free(acc);
    return NULL;
}

/* The product of a and b: with minus 0 the strings either accepts (a union), with
 * minus 1 those a accepts and b does not (a difference). */
static regex_dfa *product(const regex_dfa *a, const regex_dfa *b, int minus, char *err, size_t errlen) {
    /* the product's byte classes: the pairs of a's and b's classes that some byte has */
    int32_t *pair_class = malloc((size_t)a->n_classes * (size_t)b->n_classes * sizeof *pair_class);
    int32_t na = a->n_states, nb = b->n_states, k = 0, class_a[256], class_b[256];
    uint8_t cls[256];
    if (!pair_class) return snprintf(err, errlen, "out of memory"), NULL;
    for (int i = 0; i < a->n_classes * b->n_classes; i++) pair_class[i] = -1;
    for (int byte = 0; byte < 256; byte++) {
        int32_t key = a->cls[byte] * b->n_classes + b->cls[byte];
        if (pair_class[key] < 0) class_a[k] = a->cls[byte], class_b[k] = b->cls[byte], pair_class[key] = k++;
        cls[byte] = (uint8_t)pair_class[key];
    }
    free(pair_class);
    /* states: pairs (a's state or na for none, b's state or nb for none), numbered breadth first */
    size_t pairs = (size_t)(na + 1) * (size_t)(nb + 1);
    if (pairs > (size_t)REGEX_MAX_STATES * 256)
        return snprintf(err, errlen, "the %s of these patterns is too complex", minus ? "difference" : "union"), NULL;
    regex_dfa *u = calloc(1, sizeof *u);
    int32_t *id = malloc(pairs * sizeof *id), *pair = malloc((size_t)REGEX_MAX_STATES * sizeof *pair);
    int32_t *next = malloc((size_t)REGEX_MAX_STATES * (size_t)k * sizeof *next);
    uint8_t *acc = malloc(REGEX_MAX_STATES);
    if (!u || !id || !pair || !next || !acc) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < pairs; i++) id[i] = -1;
    int32_t n = 0, sa0 = a->start >= 0 ? a->start : na, sb0 = b->start >= 0 ? b->start : nb;
    if (sa0 < na || (sb0 < nb && !minus))
        id[(size_t)sa0 * (size_t)(nb + 1) + (size_t)sb0] = 0, pair[n++] = sa0 * (nb + 1) + sb0;
    for (int32_t i = 0; i < n; i++) {
        int32_t sa = pair[i] / (nb + 1), sb = pair[i] % (nb + 1);
        int in_a = sa < na && a->accepting[sa], in_b = sb < nb && b->accepting[sb];
        acc[i] = minus ? in_a && !in_b : in_a || in_b;
        for (int c = 0; c < k; c++) {
            int32_t ta = sa < na ? a->next[(size_t)sa * (size_t)a->n_classes + (size_t)class_a[c]] : -1;
            int32_t tb = sb < nb ? b->next[(size_t)sb * (size_t)b->n_classes + (size_t)class_b[c]] : -1;
            int32_t to = -1;
            if (ta >= 0 || (tb >= 0 && !minus)) {
                size_t key = (size_t)(ta >= 0 ? ta : na) * (size_t)(nb + 1) + (size_t)(tb >= 0 ? tb : nb);
                if (id[key] < 0) {
                    if (n == REGEX_MAX_STATES) {
                        snprintf(err, errlen, "the %s of these patterns needs more than %d states",
                                 minus ? "difference" : "union", REGEX_MAX_STATES);
                        goto fail;
                    }
                    id[key] = n;
                    pair[n++] = (int32_t)key;
                }
                to = id[key];
            }
            next[(size_t)i * (size_t)k + (size_t)c] = to;
        }
    }
    memcpy(u->cls, cls, sizeof cls);
    u->n_classes = k;
    u->n_states = n;
    u->start = n ? 0 : -1;
    u->next = next;
    u->accepting = acc;
    free(id);
    free(pair);
    /* both were pruned, so every state of a union leads to a match; a difference's may
       lead only into b */
    if (minus && prune_dead(u)) {
        regex_free(u);
        return snprintf(err, errlen, "out of memory"), NULL;
    }
    return u;
fail:
    free(u);
    free(id);
    free(pair);
    free(next);
    free(acc);
    return NULL;
}

regex_dfa *regex_union(const regex_dfa *a, const regex_dfa *b, char *err, size_t errlen) {
    return product(a, b, 0, err, errlen);
}

regex_dfa *regex_minus(const regex_dfa *a, const regex_dfa *b, char *err, size_t errlen) {
    return product(a, b, 1, err, errlen);
}
