/* JSON Schema's "pattern": an ECMA-262 regular expression compiled into a
 * DFA over the UTF-8 bytes of a string, for constrained decoding
 * (engine/grammar.c runs it inside a JSON string). */
#ifndef POTSERVE_REGEX_H
#define POTSERVE_REGEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct regex_dfa regex_dfa;

/* What the DFA accepts: the strings the pattern matches somewhere (a search,
 * as JSON Schema means it; ^ and $ at the ends of the pattern or of its
 * top-level alternatives anchor it), written as valid UTF-8. \d, \w, \s and
 * their negations are ASCII, '.' excludes line terminators. What no DFA
 * holds (backreferences, lookaround, \b) or a DFA past REGEX_MAX_STATES is
 * NULL with one line in err. */
enum { REGEX_MAX_STATES = 16384 };
regex_dfa *regex_compile(const char *pattern, char *err, size_t errlen);
void regex_free(regex_dfa *d);

int32_t regex_start(const regex_dfa *d);
/* The state after byte b, or -1 when no match can follow. */
int32_t regex_next(const regex_dfa *d, int32_t state, uint8_t b);
int regex_accepting(const regex_dfa *d, int32_t state);
int32_t regex_n_states(const regex_dfa *d);
/* dist[state] = the least total cost of bytes from state to a match, where
 * byte b costs cost[b] (0: b cannot be written); UINT32_MAX when none.
 * 0, or -1 when out of memory. */
int regex_distances(const regex_dfa *d, const uint8_t cost[256], uint32_t *dist);
/* The fewest and the most characters (code points) of a match: -1 for none
 * (no match; no most when matches are unbounded). 0, or -1 when out of memory. */
int regex_length_bounds(const regex_dfa *d, int64_t *min_chars, int64_t *max_chars);
/* A new DFA of d's matches of min_chars to max_chars characters (max_chars < 0:
 * no most); NULL with err when out of memory or past REGEX_MAX_STATES. */
regex_dfa *regex_limit_length(const regex_dfa *d, int32_t min_chars, int32_t max_chars, char *err, size_t errlen);

/* A new DFA of the strings a or b accepts (their product); NULL with err when out
 * of memory or past REGEX_MAX_STATES. */
regex_dfa *regex_union(const regex_dfa *a, const regex_dfa *b, char *err, size_t errlen);
/* A new DFA of the strings a accepts and b does not (start -1 when none is
 * left); NULL with err when out of memory or past REGEX_MAX_STATES. */
regex_dfa *regex_minus(const regex_dfa *a, const regex_dfa *b, char *err, size_t errlen);

#endif
