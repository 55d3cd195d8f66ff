/* Cost of one grammar token mask (engine/grammar.c) on the default model's
 * vocabulary: the trie walk from a state inside structure (after '{'), inside
 * a free string, after a number, inside numbers with limits and inside a
 * date-time and a pattern, without and with the max_tokens budget.
 * Build and run from the repository root after `make all`:
 *   gcc -O2 -std=c11 -D_GNU_SOURCE -I. tests/bench/bench_grammar_mask.c \
 *     $(find build/obj/engine build/obj/cache build/obj/config build/obj/api build/obj/common -name '*.o') \
 *     -o build/bench_grammar_mask \
 *     -lpcre2-8 -ljansson -lm -lpthread && build/bench_grammar_mask */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api.h"
#include "engine/engine_internal.h"

static double now_msec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(void) {
    char err[256];
    engine_options o = {.n_threads = 1};
    engine *e = engine_open("models/SmolLM2-135M-Instruct.Q4_1.gguf", &o, err, sizeof err);
    if (!e) return fprintf(stderr, "%s\n", err), 1;
    const vocab_trie *t = engine_vocab_trie(e);
    json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                           "\"age\":{\"type\":\"integer\"},\"score\":{\"type\":\"number\",\"minimum\":-2.5,"
                           "\"maximum\":1234.5},\"at\":{\"format\":\"date-time\"},\"tag\":{\"pattern\":\"^[a-z]+(-[a-z0-9]+)*$\"}},\"required\":[\"name\",\"age\",\"score\"]}",
                           0, NULL);
    api_error ae;
    grammar *g = api_schema_grammar(s, "response_format", &ae);
    const char *prefixes[] = {"{", "{\"name\":\"Al", "{\"name\":\"Al\",\"age\":1", "{\"score\":12",
                              "{\"score\":-", "{\"at\":\"2024-0", "{\"tag\":\"long-"};
    uint8_t *allowed = malloc(1 << 20);
    for (int i = 0; i < (int)(sizeof prefixes / sizeof *prefixes); i++) {
        grammar_state st;
        grammar_start(g, &st);
        grammar_feed(g, &st, prefixes[i], strlen(prefixes[i]));
        double t0 = now_msec();
        int64_t n = 0;
        for (int k = 0; k < 20; k++) n = grammar_mask(g, &st, t, UINT32_MAX, allowed);
        double plain = (now_msec() - t0) / 20;
        t0 = now_msec();
        for (int k = 0; k < 20; k++) grammar_mask(g, &st, t, grammar_cost(g, &st) + 5, allowed);
        printf("state after %-24s allowed %6lld  mask %.2f ms  with a tight budget %.2f ms\n", prefixes[i],
               (long long)n, plain, (now_msec() - t0) / 20);
    }
    free(allowed);
    grammar_unref(g);
    json_decref(s);
    engine_close(e);
    return 0;
}
