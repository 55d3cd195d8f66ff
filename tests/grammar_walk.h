/* The promises of a JSON grammar automaton (engine/grammar.c), checked along
 * one walk through it: shared by the schema fuzzer (tests/fuzz/fuzz_schema.c)
 * and the unit suite's seeded walks (tests/unit/test_grammar.c).
 *
 * Each walk byte picks one of the bytes the automaton accepts next. From
 * every state on the way:
 *   - some byte is accepted, or the value can end (no dead ends);
 *   - the shortest completion is grammar_cost bytes, the automaton accepts
 *     it, and the value can end after it;
 *   - the text so far plus that completion is one JSON value jansson reads
 *     (numbers a double holds, escapes, UTF-8), with nothing after it. */
#ifndef POTSERVE_TESTS_GRAMMAR_WALK_H
#define POTSERVE_TESTS_GRAMMAR_WALK_H

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/grammar.h"

enum { GRAMMAR_WALK_MAX_TEXT = 4096 };

/* Called with what broke and the text (n bytes) that broke it. */
typedef void (*grammar_walk_report)(const char *what, const char *text, size_t n);

static int grammar_walk_json_ok(const char *text, size_t n, grammar_walk_report report) {
    json_error_t je;
    json_t *v = json_loadb(text, n, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je);
    /* jansson's own limit, not the text's fault: JSON allows \u0000 in an object's key */
    if (!v && strstr(je.text, "NUL byte in object key")) return 1;
    if (!v) {
        char what[200];
        snprintf(what, sizeof what, "not JSON: %s", je.text);
        report(what, text, n);
        return 0;
    }
    json_decref(v);
    return 1;
}

/* The completion promises of the state st reached by text[0..n). */
static int grammar_walk_state_ok(const grammar *g, const grammar_state *st, const char *text, size_t n,
                                 grammar_walk_report report) {
    static char buf[GRAMMAR_WALK_MAX_TEXT * 2 + 64];
    uint32_t cost = grammar_cost(g, st);
    memcpy(buf, text, n);
    int64_t k = grammar_shortest_completion(g, st, buf + n, sizeof buf - n);
    if (k < 0 && cost > sizeof buf - n) return 1; /* longer than the buffer: nothing to check */
    if (k < 0) {
        report("no completion of grammar_cost bytes (a cost that is not exact)", text, n);
        return 0;
    }
    if ((uint32_t)k != cost) {
        report("the shortest completion's length is not grammar_cost", buf, n + (size_t)k);
        return 0;
    }
    grammar_state end = *st;
    if (!grammar_feed(g, &end, buf + n, (size_t)k) || !grammar_can_end(g, &end)) {
        report("the shortest completion does not end the value", buf, n + (size_t)k);
        return 0;
    }
    return grammar_walk_json_ok(buf, n + (size_t)k, report);
}

/* Walks g as walk[0..n_walk) picks; 1 when every promise held, else 0
 * after one report. */
static int grammar_walk(const grammar *g, const unsigned char *walk, size_t n_walk, grammar_walk_report report) {
    static char text[GRAMMAR_WALK_MAX_TEXT];
    size_t n = 0;
    grammar_state st;
    grammar_start(g, &st);
    for (size_t i = 0;; i++) {
        if (!grammar_walk_state_ok(g, &st, text, n, report)) return 0;
        if (i >= n_walk || n >= GRAMMAR_WALK_MAX_TEXT || grammar_must_end(g, &st)) break;
        unsigned char next[256];
        int n_next = 0;
        for (int b = 0; b < 256; b++) {
            grammar_state t = st;
            char c = (char)b;
            if (grammar_feed(g, &t, &c, 1)) next[n_next++] = (unsigned char)b;
        }
        if (!n_next) {
            if (grammar_can_end(g, &st)) break;
            report("dead end: no byte is accepted and the value cannot end", text, n);
            return 0;
        }
        text[n] = (char)next[walk[i] % n_next];
        if (!grammar_feed(g, &st, text + n, 1)) {
            report("a byte found acceptable was refused", text, n + 1);
            return 0;
        }
        n++;
    }
    return !grammar_can_end(g, &st) || grammar_walk_json_ok(text, n, report);
}

#endif
