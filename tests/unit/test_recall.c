/* engine/recall.c: passages cut from a document, ranked by BM25 against a
 * question, chosen within a byte budget. The BM25 figures are recomputed
 * here from the formula (Robertson's, Lucene's idf) on small documents. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/recall.h"
#include "test.h"

/* 1 when every passage of r->text (split on "\n\n") occurs in doc, in increasing order. */
static int passages_in_order(const recall_result *r, const char *doc, size_t len) {
    const char *at = r->text, *end = r->text + r->len, *from = doc;
    while (at < end) {
        const char *sep = strstr(at, "\n\n");
        size_t n = sep && sep < end ? (size_t)(sep - at) : (size_t)(end - at);
        const char *hit = NULL;
        for (const char *s = from; s + n <= doc + len && !hit; s++)
            if (!memcmp(s, at, n)) hit = s;
        if (!hit) return 0;
        from = hit + n;
        at += n + (sep && sep < end ? 2 : 0);
    }
    return 1;
}

/* 1 when r->chosen says where r->text came from: its passages, in the order of
 * the text, are the document's bytes at their spans (a NUL as a space), joined
 * by "\n\n"; and NULL when nothing was chosen. */
static int chosen_spans_make_the_text(const recall_result *r, const char *doc, size_t len) {
    if (!r->passages) return r->chosen == NULL;
    size_t at = 0;
    for (int i = 0; i < r->passages; i++) {
        const recall_passage *p = &r->chosen[i];
        if (p->start > len || p->len > len - p->start) return 0;
        if (i && (at + 2 > r->len || memcmp(r->text + at, "\n\n", 2))) return 0;
        at += i ? 2 : 0;
        if (p->at != at || at + p->len > r->len) return 0; /* `at` says where it is in the text */
        for (size_t k = 0; k < p->len; k++)
            if (r->text[at + k] != (doc[p->start + k] ? doc[p->start + k] : ' ')) return 0;
        at += p->len;
    }
    return at == r->len;
}

TEST(recall_finds_the_paragraph_the_question_names) {
    const char *doc =
        "The kernel reads its configuration from the boot loader.\n\n"
        "The special magic number for apple is 4411.\n\n"
        "Packages are installed with apt-get and removed with apt-get remove.\n\n"
        "The special magic number for walnut is 90644.\n"
        "  \n" /* a blank line of spaces also ends a paragraph */
        "Mount points are listed in /etc/fstab.";
    recall_result r;
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "What is the special magic number for WALNUT?", 60,
        RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_EQ_INT(r.candidates, 5);
    CHECK_EQ_INT(r.passages, 1);
    CHECK_STR(r.text, "The special magic number for walnut is 90644.");
    char *q = recall_question(&r, "What is the special magic number for WALNUT?");
    CHECK(q && strstr(q, "90644.\n\nWhat is the special magic number for WALNUT?") != NULL);
    CHECK(q && strstr(q, "Passages of the document") == q);
    free(q);
    recall_result_free(&r);
    /* room for two: the apple paragraph shares "special magic number", and comes first in the text */
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "What is the special magic number for walnut?", 100,
        RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_EQ_INT(r.passages, 2);
    CHECK_STR(r.text, "The special magic number for apple is 4411.\n\nThe special magic number for walnut is 90644.");
    CHECK(chosen_spans_make_the_text(&r, doc, strlen(doc)));
    CHECK(r.chosen[0].start < r.chosen[1].start && r.chosen[1].score > r.chosen[0].score);
    recall_result_free(&r);
    /* best last: the same two, walnut (the better) nearest the question */
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "What is the special magic number for walnut?", 100,
        RECALL_BEST_LAST, &r), 0);
    CHECK_STR(r.text, "The special magic number for apple is 4411.\n\nThe special magic number for walnut is 90644.");
    CHECK(chosen_spans_make_the_text(&r, doc, strlen(doc)));
    recall_result_free(&r);
    /* the budget of walnut's paragraph alone: one passage, where the document has it */
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "What is the special magic number for walnut?", 46,
        RECALL_BEST_LAST, &r), 0);
    CHECK_EQ_INT(r.passages, 1);
    CHECK(r.chosen && r.chosen[0].start == (size_t)(strstr(doc, "The special magic number for walnut") - doc) &&
          r.chosen[0].len == strlen("The special magic number for walnut is 90644."));
    recall_result_free(&r);
}

TEST(recall_follows_a_chain_of_references) {
    /* "VAR FRAMB = VAR ZINGO" names the question's word; ZINGO, BLORP and
     * QWXYZ are each in exactly two passages: the links to the chain's start.
     * The two "var ... value" paragraphs outrank the inner links by BM25. */
    const char *links[] = {"VAR QWXYZ = 4417.", "VAR BLORP = VAR QWXYZ.", "VAR ZINGO = VAR BLORP.",
                           "VAR FRAMB = VAR ZINGO."};
    char doc[1024];
    snprintf(doc, sizeof doc,
             "The kernel reads its configuration from the boot loader.\n\n%s\n\n"
             "A var keeps a value in its table.\n\n%s\n\n"
             "Mount points are listed in /etc/fstab.\n\n%s\n\n"
             "A var has one value.\n\n%s",
             links[0], links[1], links[2], links[3]);
    size_t chain_bytes = 0;
    for (int i = 0; i < 4; i++) chain_bytes += strlen(links[i]);
    recall_result r;
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "What is the value of VAR FRAMB?", chain_bytes,
        RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_EQ_INT(r.passages, 4);
    char want[256];
    snprintf(want, sizeof want, "%s\n\n%s\n\n%s\n\n%s", links[0], links[1], links[2], links[3]);
    CHECK_STR(r.text, want);
    recall_result_free(&r);

    /* the chain written backwards: in document order it comes last link first;
       best last puts it in the order it was defined, the question's link last */
    char back[1024];
    snprintf(back, sizeof back,
             "%s\n\nThe kernel reads its configuration from the boot loader.\n\n%s\n\n"
             "Mount points are listed in /etc/fstab.\n\n%s\n\n%s",
             links[3], links[2], links[1], links[0]);
    CHECK_EQ_INT(recall_passages(back, strlen(back), "What is the value of VAR FRAMB?", chain_bytes,
        RECALL_DOCUMENT_ORDER, &r), 0);
    snprintf(want, sizeof want, "%s\n\n%s\n\n%s\n\n%s", links[3], links[2], links[1], links[0]);
    CHECK_STR(r.text, want);
    recall_result_free(&r);
    CHECK_EQ_INT(recall_passages(back, strlen(back), "What is the value of VAR FRAMB?", chain_bytes,
                                         RECALL_BEST_LAST, &r), 0);
    snprintf(want, sizeof want, "%s\n\n%s\n\n%s\n\n%s", links[0], links[1], links[2], links[3]);
    CHECK_STR(r.text, want);
    CHECK(chosen_spans_make_the_text(&r, back, strlen(back)));
    CHECK(r.chosen[0].start > r.chosen[3].start); /* the document wrote it backwards */
    recall_result_free(&r);

    /* a name in three passages is no link: the chain stops before it */
    char doc3[1200];
    snprintf(doc3, sizeof doc3, "%s\n\nQWXYZ is also a file name here.", doc);
    CHECK_EQ_INT(recall_passages(doc3, strlen(doc3), "What is the value of VAR FRAMB?", chain_bytes - 4,
        RECALL_DOCUMENT_ORDER, &r), 0);
    snprintf(want, sizeof want, "%s\n\n%s\n\n%s", links[1], links[2], links[3]);
    CHECK_STR(r.text, want);
    recall_result_free(&r);

}

/* Robertson's BM25 with Lucene's idf, written out for the test. */
static double bm25(int tf, int df, int n_docs, int dl, double avgdl) {
    double idf = log(1 + (n_docs - df + 0.5) / (df + 0.5));
    return idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl / avgdl));
}

TEST(recall_ranks_by_bm25) {
    /* "disk" is in three passages, "quota" in one: one rare word outweighs a
       common word said three times, and a long passage's words count less */
    const char *doc = "disk disk disk usage grows\n\n"          /* 5 words */
                      "the quota limits it\n\n"                 /* 4 */
                      "disk is full\n\n"                        /* 3 */
                      "a disk and a quota and more words here"; /* 9 */
    double avg = (5 + 4 + 3 + 9) / 4.0;
    double want[4] = {bm25(3, 3, 4, 5, avg), bm25(1, 2, 4, 4, avg), bm25(1, 3, 4, 3, avg),
                      bm25(1, 3, 4, 9, avg) + bm25(1, 2, 4, 9, avg)};
    /* the test's own ranking, then one passage at a time by budget: the budget
       of each passage's length picks the best passage that fits */
    const char *text[4] = {"disk disk disk usage grows", "the quota limits it", "disk is full",
                           "a disk and a quota and more words here"};
    int best = 0;
    for (int i = 1; i < 4; i++)
        if (want[i] > want[best]) best = i;
    CHECK_EQ_INT(best, 3);                 /* both words */
    CHECK(want[1] > want[0]);              /* the rare word over the thrice-said common one */
    recall_result r;
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "disk quota", strlen(text[3]), RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_STR(r.text, text[3]);
    recall_result_free(&r);
    /* a budget too small for it: the next best that fits */
    int next = -1;
    for (int i = 0; i < 3; i++)
        if (strlen(text[i]) <= 26 && (next < 0 || want[i] > want[next])) next = i;
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "disk quota", 26, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_EQ_INT(r.passages, 1);
    CHECK_STR(r.text, text[next]);
    CHECK_EQ_INT(next, 1);
    recall_result_free(&r);
    /* room for everything: every passage holding a word, in document order */
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "Disk? QUOTA!", 1000, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_EQ_INT(r.passages, 4);
    CHECK(passages_in_order(&r, doc, strlen(doc)));
    recall_result_free(&r);
    /* best last: the test's ranking reversed, the best passage nearest the question */
    int order[4] = {0, 1, 2, 3};
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            if (want[order[j]] < want[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    char rev[256];
    snprintf(rev, sizeof rev, "%s\n\n%s\n\n%s\n\n%s", text[order[0]], text[order[1]], text[order[2]],
             text[order[3]]);
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "Disk? QUOTA!", 1000, RECALL_BEST_LAST, &r), 0);
    CHECK_STR(r.text, rev);
    recall_result_free(&r);
}

TEST(recall_cuts_long_paragraphs_at_sentences_and_characters) {
    /* one 3,000-byte paragraph of sentences */
    char doc[4096] = "";
    while (strlen(doc) < 3000) strcat(doc, "The cache keeps what the model reads. ");
    recall_result r;
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "cache", 100000, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK(r.candidates >= 3);
    CHECK_EQ_INT(r.passages, r.candidates);
    /* every passage is at most RECALL_PASSAGE_BYTES and ends a sentence */
    int ok = 1;
    for (const char *at = r.text; *at;) {
        const char *sep = strstr(at, "\n\n");
        size_t n = sep ? (size_t)(sep - at) : strlen(at);
        ok &= n <= RECALL_PASSAGE_BYTES && at[n - 1] == '.';
        at += n + (sep ? 2 : 0);
    }
    CHECK(ok);
    recall_result_free(&r);
    /* 2,499 bytes of three-byte characters and no space: cut between
       characters (1,024 is not a multiple of 3). Words are compared on their
       first 64 bytes, so a question of those bytes matches each piece only
       when the piece starts with a whole "€" */
    char u[2600], word[65];
    size_t n = 0;
    while (n < 2499) u[n++] = (char)0xE2, u[n++] = (char)0x82, u[n++] = (char)0xAC;
    memcpy(word, u, 64);
    word[64] = 0;
    CHECK_EQ_INT(recall_passages(u, n, word, 100000, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_EQ_INT(r.candidates, 3);
    CHECK_EQ_INT(r.passages, 3);
    CHECK_EQ_INT(r.len, 2499 + 2 * 2);
    recall_result_free(&r);
}

TEST(recall_splits_words_at_typographic_punctuation) {
    /* curly quotes, an em dash, no-break spaces, an ellipsis and CJK punctuation part words as
       ASCII punctuation does: "\u201czebra\u201d" was one word no question's "zebra" equalled */
    const char *docs[] = {
        "The mascot is a \xe2\x80\x9czebra\xe2\x80\x9d of the plains.\n\nThe colour is blue.",
        "The mascot\xe2\x80\x94zebra\xe2\x80\x94is fast.\n\nThe colour is blue.",
        "The mascot\xc2\xa0zebra\xc2\xa0runs.\n\nThe colour is blue.",
        "Wait\xe2\x80\xa6zebra\xe3\x80\x82\n\nThe colour is blue.",
        "\xe6\x96\x91\xe9\xa9\xac\xef\xbc\x8czebra\xef\xbc\x9a\n\nThe colour is blue.",
    };
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) {
        recall_result r;
        CHECK_EQ_INT(recall_passages(docs[i], strlen(docs[i]), "zebra?", 48, RECALL_DOCUMENT_ORDER, &r), 0);
        if (r.passages < 1 || !strstr(r.text, "zebra")) { /* (before: no passage at all) */
            fprintf(stderr, "  doc %zu: %d passages\n", i, r.passages);
            test_failures++;
        }
        recall_result_free(&r);
    }
    /* other scripts' letters stay word characters: "caf\xc3\xa9" is one word, as is a CJK run */
    const char *doc = "Le caf\xc3\xa9 ouvre.\n\nLe th\xc3\xa9 ferme.";
    recall_result r;
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "caf\xc3\xa9", 20, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK(r.passages >= 1 && strstr(r.text, "ouvre") != NULL);
    recall_result_free(&r);
}

TEST(recall_without_words_chooses_nothing) {
    recall_result r;
    CHECK_EQ_INT(recall_passages("", 0, "anything", 4096, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK(r.text && r.len == 0 && r.passages == 0 && r.candidates == 0);
    char *q = recall_question(&r, "anything?");
    CHECK_STR(q, "anything?");
    free(q);
    recall_result_free(&r);
    const char *doc = "Alpha beta.\n\nGamma delta.";
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "?!", 4096, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK(r.passages == 0 && r.candidates == 2 && r.len == 0 && r.chosen == NULL);
    recall_result_free(&r);
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "epsilon", 4096, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_EQ_INT(r.passages, 0);
    recall_result_free(&r);
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), NULL, 4096, RECALL_DOCUMENT_ORDER, &r), 0);
    CHECK_EQ_INT(r.passages, 0);
    recall_result_free(&r);
    CHECK_EQ_INT(recall_passages(doc, strlen(doc), "gamma", 0, RECALL_DOCUMENT_ORDER, &r), 0); /* no budget */
    CHECK_EQ_INT(r.passages, 0);
    recall_result_free(&r);
}

TEST(recall_garbage_stays_in_bounds) {
    uint64_t s = 88172645463325252ull;
    char *doc = malloc(20000), q[200];
    int ok = 1;
    for (int round = 0; round < 200 && doc; round++) {
        size_t len = (size_t)(s % 20000);
        for (size_t i = 0; i < len; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            /* few distinct bytes so that words repeat, and every kind of separator */
            static const char alphabet[] = "ab \n\n\t.\r\xC3\xA9\x80\xff";
            doc[i] = round % 3 ? alphabet[s % (sizeof alphabet - 1)] : (char)(s & 0xFF);
        }
        size_t qn = (size_t)(s % sizeof q);
        for (size_t i = 0; i < qn; i++) q[i] = "ab .\xC3\xA9"[(s >> (i % 40)) % 6];
        q[qn] = 0;
        size_t budget = (size_t)(s >> 20) % 3000;
        recall_result r;
        recall_order order = round % 2 ? RECALL_BEST_LAST : RECALL_DOCUMENT_ORDER;
        if (recall_passages(doc, len, q, budget, order, &r)) {
            ok = 0;
            break;
        }
        /* at most the budget, plus the separators */
        ok &= r.len <= budget + 2 * (size_t)(r.passages > 0 ? r.passages - 1 : 0);
        ok &= r.passages <= r.candidates;
        ok &= strlen(r.text) == r.len; /* a NUL of the document comes out as a space */
        ok &= chosen_spans_make_the_text(&r, doc, len);
        if (round % 3 && order == RECALL_DOCUMENT_ORDER) ok &= passages_in_order(&r, doc, len); /* without NUL */
        char *full = recall_question(&r, q);
        ok &= full != NULL;
        free(full);
        recall_result_free(&r);
    }
    CHECK(ok);
    free(doc);
}
