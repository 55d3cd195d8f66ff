/* Recall: BM25 over a document's passages for a question (engine/recall.h). */
#include "engine/recall.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* BM25's usual parameters (Robertson et al.; Lucene's defaults): term
 * frequency saturation and length normalisation. Not tuned here. */
#define BM25_K1 1.2
#define BM25_B 0.75
#define RECALL_HEADING "Passages of the document that share words with the question:\n\n"
#define RECALL_SEP "\n\n"

enum { MAX_WORD = 64 }; /* longer words are compared on their first MAX_WORD bytes */

typedef recall_passage passage;

typedef struct term {
    char w[MAX_WORD];
    size_t n;
    int df;       /* passages holding it */
    int tf;       /* in the passage being counted */
} term;

/* Code points that separate words though they are not ASCII: no-break and
 * typographic spaces, dashes, curly quotes, ellipses (U+2000-U+206F), « »,
 * CJK and full-width punctuation, the BOM. Text exported from a word processor
 * or a PDF ("zebra" in curly quotes, words joined by em dashes) otherwise
 * forms words that no question's word equals. */
static int separator(uint32_t cp) {
    return cp == 0xA0 || cp == 0xAB || cp == 0xBB || cp == 0xFEFF || (cp >= 0x2000 && cp <= 0x206F) ||
           (cp >= 0x3000 && cp <= 0x303F) || (cp >= 0xFF01 && cp <= 0xFF0F) || (cp >= 0xFF1A && cp <= 0xFF20) ||
           (cp >= 0xFF3B && cp <= 0xFF40) || (cp >= 0xFF5B && cp <= 0xFF65);
}

/* The bytes of the character at s[i] (i < end): > 0 when it is part of a word
 * (ASCII letters and digits, and any other character but the separators
 * above; a byte that is not valid UTF-8 counts as a word's), else minus its
 * length. */
static int word_char(const char *s, size_t i, size_t end) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ? 1 : -1;
    uint32_t cp;
    int l = utf8_seq((const unsigned char *)s + i, end - i, &cp);
    if (l <= 0) return 1;
    return separator(cp) ? -l : l;
}

static unsigned char lower(unsigned char c) { return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c; }

/* The next word of s[*at, end): its bytes lower-cased into w (at most
 * MAX_WORD of them, *n), *at moved past it. 0 when no word is left. */
static int next_word(const char *s, size_t *at, size_t end, char *w, size_t *n) {
    size_t i = *at;
    int l;
    while (i < end && (l = word_char(s, i, end)) < 0) i += (size_t)-l;
    if (i >= end) return *at = end, 0;
    size_t k = 0;
    while (i < end && (l = word_char(s, i, end)) > 0)
        for (int b = 0; b < l; b++, i++)
            if (k < MAX_WORD) w[k++] = (char)lower((unsigned char)s[i]);
    *n = k;
    *at = i;
    return 1;
}

/* The start of the UTF-8 sequence holding byte i (i itself for ASCII). */
static size_t utf8_start(const char *s, size_t lo, size_t i) {
    while (i > lo && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    return i;
}

/* Where a passage starting at `from` ends when it may not pass `limit`
 * (< the paragraph's end): after the last sentence end (". ", "! ", "? ")
 * in its second half, else after its last space, else at a UTF-8 boundary. */
static size_t cut_at(const char *s, size_t from, size_t limit) {
    size_t half = from + (limit - from) / 2;
    for (size_t i = limit; i > half + 1; i--)
        if (s[i - 1] == ' ' && (s[i - 2] == '.' || s[i - 2] == '!' || s[i - 2] == '?')) return i;
    for (size_t i = limit; i > from + 1; i--)
        if (s[i - 1] == ' ' || s[i - 1] == '\n' || s[i - 1] == '\t') return i;
    size_t u = utf8_start(s, from, limit);
    return u > from ? u : limit;
}

/* A blank line: '\n', spaces or tabs (or '\r'), '\n'. Returns the index past
 * it when one starts at s[i] == '\n', else 0. */
static size_t blank_line_end(const char *s, size_t i, size_t len) {
    if (s[i] != '\n') return 0;
    size_t j = i + 1;
    while (j < len && (s[j] == ' ' || s[j] == '\t' || s[j] == '\r')) j++;
    return j < len && s[j] == '\n' ? j + 1 : 0;
}

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* Appends s[start, end) without its surrounding white space, when any is left. */
static int add_passage(const char *s, passage **ps, int *n, int *cap, size_t start, size_t end) {
    while (start < end && is_space(s[start])) start++;
    while (end > start && is_space(s[end - 1])) end--;
    if (start == end) return 0;
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        passage *t = realloc(*ps, (size_t)c * sizeof *t);
        if (!t) return -1;
        *ps = t;
        *cap = c;
    }
    (*ps)[(*n)++] = (passage){.start = start, .len = end - start};
    return 0;
}

/* Cuts doc into passages: paragraphs, long ones in pieces. */
static int split_passages(const char *doc, size_t len, passage **ps, int *n) {
    int cap = 0;
    *ps = NULL;
    *n = 0;
    size_t para = 0;
    for (size_t i = 0; i <= len; i++) {
        size_t next = i < len ? blank_line_end(doc, i, len) : len + 1;
        if (!next) continue;
        size_t end = i < len ? i : len; /* the paragraph is doc[para, end) */
        while (end - para > RECALL_PASSAGE_BYTES) {
            size_t c = cut_at(doc, para, para + RECALL_PASSAGE_BYTES);
            if (add_passage(doc, ps, n, &cap, para, c)) return -1;
            para = c;
        }
        if (add_passage(doc, ps, n, &cap, para, end)) return -1;
        para = next > len ? len : next;
        if (next <= len) i = next - 1;
    }
    return 0;
}

/* The question's distinct words (at most RECALL_MAX_TERMS), in a small
 * open-addressing table so that counting a document costs one hash a word. */
enum { TERM_SLOTS = 4 * RECALL_MAX_TERMS };

typedef struct query {
    term t[RECALL_MAX_TERMS];
    int n;
    signed char slot[TERM_SLOTS]; /* term index, or -1 */
} query;

static unsigned hash_word(const char *w, size_t n) { /* FNV-1a */
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)w[i]) * 16777619u;
    return h;
}

/* The term index of w, or -1; with add, a new term when there is room. */
static int find_term(query *q, const char *w, size_t n, int add) {
    for (unsigned s = hash_word(w, n) % TERM_SLOTS;; s = (s + 1) % TERM_SLOTS) {
        int k = q->slot[s];
        if (k < 0) {
            if (!add || q->n == RECALL_MAX_TERMS) return -1;
            k = q->n++;
            memcpy(q->t[k].w, w, n);
            q->t[k].n = n;
            q->t[k].df = 0;
            q->slot[s] = (signed char)k;
            return k;
        }
        if (q->t[k].n == n && !memcmp(q->t[k].w, w, n)) return k;
    }
}

static void query_init(query *q, const char *question) {
    q->n = 0;
    memset(q->slot, -1, sizeof q->slot);
    size_t at = 0, end = strlen(question), wn;
    char w[MAX_WORD];
    while (q->n < RECALL_MAX_TERMS && next_word(question, &at, end, w, &wn)) find_term(q, w, wn, 1);
}

/* Counts, for passage p, its words and each term's occurrences (q->t[].tf). */
static void count_terms(const char *doc, passage *p, query *q) {
    for (int k = 0; k < q->n; k++) q->t[k].tf = 0;
    size_t at = p->start, end = p->start + p->len, wn;
    char w[MAX_WORD];
    int words = 0;
    while (next_word(doc, &at, end, w, &wn)) {
        words++;
        int k = find_term(q, w, wn, 0);
        if (k >= 0) q->t[k].tf++;
    }
    p->words = words;
}

static int by_score(const void *a, const void *b) { /* best first; ties: the earlier */
    const passage *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    return (x->start > y->start) - (x->start < y->start);
}

static int by_start(const void *a, const void *b) {
    const passage *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* BM25 of every passage: document frequencies in a first pass, scores in a second. */
static void score_passages(const char *doc, passage *ps, int n, query *q) {
    double total_words = 0;
    for (int i = 0; i < n; i++) {
        count_terms(doc, &ps[i], q);
        total_words += ps[i].words;
        for (int k = 0; k < q->n; k++) q->t[k].df += q->t[k].tf > 0;
    }
    double avg = total_words > 0 ? total_words / n : 1;
    for (int i = 0; i < n; i++) {
        count_terms(doc, &ps[i], q);
        double s = 0, norm = BM25_K1 * (1 - BM25_B + BM25_B * ps[i].words / avg);
        for (int k = 0; k < q->n; k++) {
            int f = q->t[k].tf;
            if (!f) continue;
            double idf = log(1 + (n - q->t[k].df + 0.5) / (q->t[k].df + 0.5));
            s += idf * f * (BM25_K1 + 1) / (f + norm);
        }
        ps[i].score = s;
    }
}

int recall_rank(const char *doc, size_t len, const char *question, recall_passage **out, int *n) {
    query q;
    query_init(&q, question ? question : "");
    if (split_passages(doc, len, out, n)) {
        free(*out);
        *out = NULL;
        *n = 0;
        return -1;
    }
    if (*n > 0 && q.n > 0) score_passages(doc, *out, *n, &q);
    return 0;
}

/* ---- links: a chain of references -------------------------------------------
 * A question about the end of a chain ("VAR D = VAR C", "VAR C = VAR B", ...,
 * "VAR A = 7") shares its words with the last link only. So from the best
 * passage holding one of the question's rarest words (the name it asks
 * about), the sentence holding that word is followed: a word
 * of that sentence the question lacks, found in exactly one other passage of
 * the document, leads to that passage, whose sentence holding the word leads
 * on, at most RECALL_MAX_LINKS times. A word in exactly two passages is a
 * name the two share and the rest of the document does not; a commoner word
 * is not a link. The linked passages are chosen right after the chain's
 * first, in its rank among the best passages. */

/* The sentence of passage p around byte at: [*s, *e), cut after ". ", "! ",
 * "? " or a line break. */
static void sentence_around(const char *doc, const passage *p, size_t at, size_t *s, size_t *e) {
    size_t lo = p->start, hi = p->start + p->len;
    size_t i = at;
    while (i > lo && doc[i - 1] != '\n' &&
           !(i - lo >= 2 && doc[i - 1] == ' ' && (doc[i - 2] == '.' || doc[i - 2] == '!' || doc[i - 2] == '?')))
        i--;
    size_t j = at;
    while (j < hi && doc[j] != '\n' && !((doc[j] == '.' || doc[j] == '!' || doc[j] == '?') &&
                                          (j + 1 == hi || doc[j + 1] == ' ' || doc[j + 1] == '\n')))
        j++;
    *s = i;
    *e = j < hi ? j + 1 : hi;
}

/* Where in passage p the word w (of q's terms: index k) first occurs: its
 * byte offset, or p->start when it does not. */
static size_t word_at(const char *doc, const passage *p, const query *q, int k) {
    size_t at = p->start, end = p->start + p->len, wn;
    char w[MAX_WORD];
    for (size_t before = at; next_word(doc, &at, end, w, &wn); before = at)
        if (wn == q->t[k].n && !memcmp(w, q->t[k].w, wn)) {
            for (int l; (l = word_char(doc, before, end)) < 0;) before += (size_t)-l;
            return before;
        }
    return p->start;
}

/* The chain (see above): the best passage of ps (sorted best first) holding
 * the question's rarest word, then the passages it links to, as indices into
 * chain. Returns the chain's length (0 when no passage holds a question word).
 * q: the question, its df counted. */
static int follow_links(const char *doc, passage *ps, int n, query *q, int chain[RECALL_MAX_LINKS + 1]) {
    int min_df = 0;
    for (int k = 0; k < q->n; k++)
        if (q->t[k].df && (!min_df || q->t[k].df < min_df)) min_df = q->t[k].df;
    if (!min_df) return 0;
    query probe = *q;
    int len = 0, rare = -1; /* ties: the best passage holding one of the rarest words */
    for (int i = 0; i < n && !len; i++) {
        passage tmp = ps[i];
        count_terms(doc, &tmp, &probe);
        for (int k = 0; k < q->n && !len; k++)
            if (probe.t[k].tf && q->t[k].df == min_df) chain[len++] = i, rare = k;
    }
    if (!len) return 0;
    size_t s, e;
    sentence_around(doc, &ps[chain[0]], word_at(doc, &ps[chain[0]], q, rare), &s, &e);
    while (len <= RECALL_MAX_LINKS) {
        /* the sentence's words the question lacks, their passages counted */
        query cand;
        cand.n = 0;
        memset(cand.slot, -1, sizeof cand.slot);
        size_t at = s, wn;
        char w[MAX_WORD];
        while (cand.n < RECALL_MAX_TERMS && next_word(doc, &at, e, w, &wn))
            if (find_term(q, w, wn, 0) < 0) find_term(&cand, w, wn, 1);
        if (!cand.n) break;
        int holder[RECALL_MAX_TERMS]; /* the last passage holding each, besides the chain's */
        for (int k = 0; k < cand.n; k++) holder[k] = -1;
        for (int i = 0; i < n; i++) {
            passage tmp = ps[i];
            count_terms(doc, &tmp, &cand);
            for (int k = 0; k < cand.n; k++)
                if (cand.t[k].tf) {
                    cand.t[k].df++;
                    int mine = 0;
                    for (int c = 0; c < len; c++) mine |= chain[c] == i;
                    if (!mine) holder[k] = i;
                }
        }
        int next = -1, via = -1;
        for (int k = 0; k < cand.n && next < 0; k++)
            if (cand.t[k].df == 2 && holder[k] >= 0) next = holder[k], via = k;
        if (next < 0) break;
        chain[len++] = next;
        sentence_around(doc, &ps[next], word_at(doc, &ps[next], &cand, via), &s, &e);
    }
    return len;
}

int recall_passages(const char *doc, size_t len, const char *question, size_t max_bytes, recall_order order,
                    recall_result *r) {
    *r = (recall_result){0};
    passage *ps = NULL, *chosen = NULL;
    int n = 0;
    query q;
    query_init(&q, question ? question : "");
    if (split_passages(doc, len, &ps, &n)) goto oom;
    r->candidates = n;
    if (n == 0 || q.n == 0) goto done;
    score_passages(doc, ps, n, &q);
    /* the best first, the chain's links right after the chain's first passage,
     * as many as fit; then laid out in the order asked for (after "done") */
    if (n > 1) qsort(ps, (size_t)n, sizeof *ps, by_score);
    if (ps[0].score <= 0) goto done;
    int chain[RECALL_MAX_LINKS + 1];
    int n_chain = follow_links(doc, ps, n, &q, chain);
    chosen = malloc((size_t)(unsigned)n * sizeof *chosen); /* n > 0 here */
    if (!chosen) goto oom;
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        int link = 0;
        for (int c = 1; c < n_chain; c++) link |= chain[c] == i;
        if (link || ps[i].score <= 0) continue;
        for (int c = 0; c < (n_chain && chain[0] == i ? n_chain : 1); c++) {
            const passage *p = c ? &ps[chain[c]] : &ps[i];
            if (p->len <= max_bytes - used) {
                used += p->len;
                chosen[r->passages++] = *p;
            }
        }
    }
    free(ps);
    ps = chosen;
    chosen = NULL;
done:
    if (r->passages > 1 && order == RECALL_DOCUMENT_ORDER) qsort(ps, (size_t)r->passages, sizeof *ps, by_start);
    for (int i = 0; order == RECALL_BEST_LAST && i < r->passages / 2; i++) {
        passage t = ps[i];
        ps[i] = ps[r->passages - 1 - i];
        ps[r->passages - 1 - i] = t;
    }
    size_t out = 1;
    for (int i = 0; i < r->passages; i++) out += ps[i].len + strlen(RECALL_SEP);
    r->text = malloc(out);
    if (!r->text) goto oom;
    for (int i = 0; i < r->passages; i++) {
        if (i) {
            memcpy(r->text + r->len, RECALL_SEP, strlen(RECALL_SEP));
            r->len += strlen(RECALL_SEP);
        }
        ps[i].at = r->len;
        /* a NUL byte of the document becomes a space: the text goes on as a C string */
        for (size_t k = 0; k < ps[i].len; k++) {
            char c = doc[ps[i].start + k];
            r->text[r->len++] = c ? c : ' ';
        }
    }
    r->text[r->len] = 0;
    if (r->passages) {
        r->chosen = ps;
        ps = NULL;
    }
    free(ps);
    return 0;
oom:
    free(ps);
    free(chosen);
    recall_result_free(r);
    return -1;
}

int recall_order_named(const char *name) {
    if (name && !strcmp(name, "best-last")) return RECALL_BEST_LAST;
    if (name && !strcmp(name, "document")) return RECALL_DOCUMENT_ORDER;
    return -1;
}

void recall_result_free(recall_result *r) {
    free(r->text);
    free(r->chosen);
    *r = (recall_result){0};
}

char *recall_question(const recall_result *r, const char *question) {
    const char *head = r->passages ? RECALL_HEADING : "", *sep = r->passages ? RECALL_SEP : "";
    size_t nh = strlen(head), nt = r->passages ? r->len : 0, ns = strlen(sep), nq = strlen(question);
    char *q = malloc(nh + nt + ns + nq + 1);
    if (!q) return NULL;
    memcpy(q, head, nh);
    memcpy(q + nh, r->text, nt);
    memcpy(q + nh + nt, sep, ns);
    memcpy(q + nh + nt + ns, question, nq + 1);
    return q;
}
