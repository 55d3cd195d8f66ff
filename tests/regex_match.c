/* regex_match PATTERN: reads strings, one per line (a line is JSON-string
 * escaped, so it may hold any character), and prints 1 or 0 for each: does
 * the DFA of engine/regex.c accept it. tests/py/test_regex.py compares it with
 * Python's `re` on strings drawn at random. A pattern it refuses prints
 * "refused: " and the reason. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/regex.h"

int main(int argc, char **argv) {
    if (argc != 2) return fprintf(stderr, "usage: regex_match PATTERN < lines\n"), 2;
    char err[200];
    regex_dfa *d = regex_compile(argv[1], err, sizeof err);
    if (!d) return printf("refused: %s\n", err), 0;
    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        json_t *s = json_loads(line, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (!json_is_string(s)) return fprintf(stderr, "not a JSON string: %s", line), 2;
        const char *text = json_string_value(s);
        int32_t st = regex_start(d);
        for (size_t i = 0; i < json_string_length(s) && st >= 0; i++) st = regex_next(d, st, (uint8_t)text[i]);
        printf("%d\n", regex_accepting(d, st));
        json_decref(s);
    }
    regex_free(d);
    return 0;
}
