/* Recall: the passages of a document that share the most words with a
 * question, found in the document's text (the server's chunk log) and put
 * before the question, so that a question the session's pot was not
 * compressed for can still see the paragraphs it names. A cheap re-read:
 * instead of reading the whole document again through a question-guided pot
 * (server/reread.c), only about max_bytes of it are read, after the pot.
 *
 * Passages are the document's paragraphs (blank-line separated), longer ones
 * cut into pieces of at most RECALL_PASSAGE_BYTES at a sentence end or a
 * space. They are ranked by BM25 (k1 = 1.2, b = 0.75, the usual defaults)
 * over words (runs of ASCII letters, digits and non-ASCII characters, so
 * that accented words stay whole, typographic punctuation and spaces parting
 * them as ASCII's do; ASCII lower-cased), the question's distinct
 * words as the query. From the best passage, a chain of references ("VAR D =
 * VAR C", then "VAR C = VAR B", ...) is followed through the names its
 * sentences share with exactly one other passage (engine/recall.c). Lexical:
 * a question that shares no word with its answer's paragraph (a paraphrase)
 * does not find it. Pure text; no model. */
#ifndef POTSERVE_RECALL_H
#define POTSERVE_RECALL_H

#include <stddef.h>

enum {
    RECALL_PASSAGE_BYTES = 1024, /* longest passage: about 250 tokens of English */
    RECALL_MAX_TERMS = 64,       /* question words used, in order of appearance */
    RECALL_DEFAULT_BYTES = 4096, /* the passages' budget unless set: about 1,000 tokens of English */
    RECALL_MAX_BYTES = 1048576,  /* the largest budget a setting or request may ask */
    RECALL_MAX_LINKS = 4         /* passages followed from the best one along a chain of references */
};

/* One passage: doc[start, start + len), its length in words and its BM25 score. */
typedef struct recall_passage {
    size_t start, len;
    int words;
    double score;
    size_t at; /* a chosen passage's place in recall_result.text: text[at, at + len) */
} recall_passage;

/* Every passage of doc[0, len) with its score for question, in document
 * order: *out malloc'd (the caller frees it; NULL when *n is 0), *n. 0, or
 * -1 when memory is short. For diagnostics (`potserve recall --scores`). */
int recall_rank(const char *doc, size_t len, const char *question, recall_passage **out, int *n);

/* How the chosen passages are laid out before the question. */
typedef enum recall_order {
    RECALL_BEST_LAST,     /* the reverse of their choice: the best passage nearest the question, a
                             chain's links before it from the chain's start ("VAR A = n" first) */
    RECALL_DOCUMENT_ORDER /* as the document has them */
} recall_order;

typedef struct recall_result {
    char *text;        /* the chosen passages in the order asked for, joined by "\n\n", a NUL
                          byte of the document as a space (malloc'd; "" when the document or
                          the question has no words) */
    size_t len;        /* strlen(text) */
    int passages;      /* passages chosen */
    int candidates;    /* passages the document was cut into */
    recall_passage *chosen; /* the chosen passages in the order of text: where each is in the
                               document, and its score (0 for a link sharing no word with the
                               question). malloc'd; NULL when none */
} recall_result;

/* Chooses the best-ranked passage of doc[0, len) for question, then the
 * passages it links to (a chain of references, at most RECALL_MAX_LINKS),
 * then the next best, as many as fit in max_bytes (their bytes, separators
 * not counted; a passage that does not fit is skipped for smaller ones ranked
 * after it). Passages sharing no word with the question are chosen only as
 * links. They are laid out in `order`. 0, or -1 when memory is short (r->text NULL). Any bytes are
 * accepted; a cut never splits a UTF-8 sequence. */
int recall_passages(const char *doc, size_t len, const char *question, size_t max_bytes, recall_order order,
                    recall_result *r);
/* The order named "best-last" or "document" (the server's recall_order); -1 for another name. */
int recall_order_named(const char *name);
void recall_result_free(recall_result *r);

/* The question as the model is asked it: the passages (when any) under a
 * one-line heading, then the question. malloc'd; NULL when memory is short. */
char *recall_question(const recall_result *r, const char *question);

#endif
