/* libFuzzer target: JSON Schemas through the schema compiler (api/schema.c)
 * and walks through the automaton it builds (engine/grammar.c).
 *
 * Input: a schema's JSON text, a NUL, then walk bytes. A schema the compiler
 * refuses must come with a 400 or 500 and a message; an accepted one must
 * keep tests/grammar_walk.h's promises along the walk. A broken promise
 * aborts, which the fuzzer reports. Seeds: tests/fuzz/schema_seeds/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "tests/grammar_walk.h"

static void fail(const char *what, const char *text, size_t n) {
    fprintf(stderr, "fuzz_schema: %s; the text, in hex:", what);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)text[i]);
    fprintf(stderr, "\n");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t schema_len = nul ? (size_t)(nul - data) : size;
    json_t *schema = json_loadb((const char *)data, schema_len, 0, NULL);
    if (!schema) return 0;
    api_error e = {0};
    grammar *g = api_schema_grammar(schema, "response_format", &e);
    json_decref(schema);
    if (!g) {
        if ((e.status != 400 && e.status != 500) || !e.message[0]) abort();
        return 0;
    }
    const uint8_t *walk = nul ? nul + 1 : data + size;
    grammar_walk(g, walk, (size_t)(data + size - walk), fail);
    grammar_unref(g);
    return 0;
}
