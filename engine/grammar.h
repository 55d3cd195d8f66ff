/* Constrained decoding: a JSON grammar built node by node (api/schema.c
 * compiles JSON Schema into it) and run as a pushdown automaton over bytes.
 * Generation keeps one automaton state per sequence and lets the sampler
 * pick only tokens whose bytes the automaton accepts (engine/generate.c).
 * Re-exported by engine.h. */
#ifndef POTSERVE_GRAMMAR_H
#define POTSERVE_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

typedef struct grammar grammar;

enum { GRAMMAR_MAX_PROPS = 64, GRAMMAR_MAX_LITERALS = 64, GRAMMAR_MAX_DEPTH = 32, GRAMMAR_MAX_PATTERN_STATES = 65536 };

/* An empty grammar; its root is any JSON value until grammar_set_root.
 * Caller owns it (grammar_unref). NULL when out of memory. */
grammar *grammar_new(void);
/* Grammars are immutable once handed to generation; each holder takes a reference. */
grammar *grammar_ref(grammar *g);
void grammar_unref(grammar *g);

/* Node builders: each returns the new node's id (>= 0), or -1 with one line
 * in err. Children must exist already (no recursion). */
int grammar_any(grammar *g);                              /* any JSON value */
int grammar_string(grammar *g, int32_t min_len, int32_t max_len); /* max_len < 0: no limit */
int grammar_number(grammar *g, int integer);
/* A string of one of JSON Schema's formats (2020-12: "date", "time", "date-time"
 * as RFC 3339 with the offset, "duration", "uuid", "ipv4", "ipv6", "email",
 * "idn-email", "hostname", "idn-hostname", "uri", "uri-reference", "iri",
 * "iri-reference", "uri-template", "json-pointer", "relative-json-pointer",
 * "regex"), of min_len to max_len characters (max_len < 0: any); any other
 * name, or lengths that would cut a fixed-shape format's values, is -1 with err. */
int grammar_format(grammar *g, const char *name, int32_t min_len, int32_t max_len, char *err, size_t errlen);
/* 1 when grammar_format writes the format `name`. */
int grammar_has_format(const char *name);
/* A string of min_len to max_len characters (max_len < 0: any) that the
 * ECMA-262 regular expression `pattern` matches somewhere (engine/regex.h);
 * -1 with err when it is not supported or nothing matches. */
int grammar_pattern(grammar *g, const char *pattern, int32_t min_len, int32_t max_len, char *err, size_t errlen);
/* As grammar_pattern (pattern NULL: any string), less the strings any of
 * except_patterns[0..n_patterns) matches and those among the JSON texts
 * except_texts[0..n_except) (non-strings are skipped): JSON Schema's
 * `not: {pattern}`, `not: {enum}` and `not: {anyOf: [...]}` of them.
 * -1 with err when not supported or no string is left. */
int grammar_pattern_except(grammar *g, const char *pattern, const char *const *except_patterns, size_t n_patterns,
                           const char *const *except_texts, size_t n_except, int32_t min_len, int32_t max_len,
                           char *err, size_t errlen);
/* Bounds number node `node`: its values <= value (upper) or >= value, or
 * strictly so when exclusive; value is a decimal text ([-]digits[.digits],
 * exact). A bounded number has no exponent; the limits tighten each other.
 * 0, or -1 with one line in err (no number written could meet them). */
int grammar_number_limit(grammar *g, int node, const char *value, int upper, int exclusive, char *err,
                         size_t errlen);
/* Number node `node`'s values are multiples of k (a whole number >= 1; with
 * limits too, call this first). 0, or -1 with err. */
int grammar_number_multiple(grammar *g, int node, int64_t k, char *err, size_t errlen);
/* Exactly one of the given JSON texts (compact: what enum and const allow). */
int grammar_literals(grammar *g, const char *const *texts, size_t n, char *err, size_t errlen);
/* items: node of every item; max_items < 0: no limit. */
int grammar_array(grammar *g, int items, int32_t min_items, int32_t max_items, char *err,
                  size_t errlen);
/* Array node `array`'s first n items are of nodes items[0..n) (JSON Schema's
 * prefixItems), the rest of its items node. 0, or -1 with err. */
int grammar_array_prefix(grammar *g, int array, const int *items, size_t n, char *err, size_t errlen);
/* Array node `array` (of an enum or const's items, or of at most one item) writes
 * each item at most once (JSON Schema's uniqueItems); its maxItems becomes at most
 * the number of values. 0, or -1 with err for other items. */
int grammar_array_unique(grammar *g, int array, char *err, size_t errlen);
/* An object of the named properties only (names JSON-escaped, without quotes),
 * in any order, each at most once, every required one present. With n == 0,
 * any keys, each value of node `values` (-1: only {}). */
int grammar_object(grammar *g, const char *const *names, const int *nodes, const int *required,
                   size_t n, int values, char *err, size_t errlen);
/* Object node `object` holds min_props to max_props properties (max_props < 0:
 * any number); an object without named properties writes its keys as node
 * `keys` (a string node; -1: any string) and may need at most one property (a
 * key written twice counts once). 0, or -1 with err when no object meets them. */
int grammar_object_limits(grammar *g, int object, int32_t min_props, int32_t max_props, int keys, char *err,
                          size_t errlen);
/* 1 when `text` is a whole value of node `node` (a schema compiler's check of a
 * property name against a pattern, say). */
int grammar_node_accepts(const grammar *g, int node, const char *text, size_t n);
/* One of the alternatives; they must start with different bytes (a string
 * and an object, not two objects), else -1 + err. */
int grammar_any_of(grammar *g, const int *alts, size_t n, char *err, size_t errlen);
/* anyOf's alternatives, which may overlap (a value valid for several): their enums'
 * and consts' values are joined into one set, less those another alternative takes,
 * an alternative another covers (a string of no limits covers every string) is
 * dropped, and objects are written as the one their first property tells apart (a
 * property only one of them lists, or a discriminator); the rest must start with
 * different bytes, as for grammar_any_of. Not for oneOf, where a value two
 * alternatives take is invalid. */
int grammar_any_of_overlapping(grammar *g, const int *alts, size_t n, char *err, size_t errlen);
/* oneOf's alternatives: as grammar_any_of, but objects among them are written as
 * the one a property every one of them lists tells apart (an enum or const of
 * values no other has: a discriminator). */
int grammar_one_of(grammar *g, const int *alts, size_t n, char *err, size_t errlen);
/* A value written inside fixed text: prefixes[i] then a value of nodes[i],
 * then suffix (a tool call: `{"name": "f", "arguments": ` args `}`). The
 * prefixes must not be prefixes of one another. */
int grammar_tagged(grammar *g, const char *const *prefixes, const int *nodes, size_t n,
                   const char *suffix, char *err, size_t errlen);
void grammar_set_root(grammar *g, int node);

/* The automaton's state (plain data: copy it freely). */
typedef struct grammar_frame {
    int32_t node;
    uint8_t st, aux;
    uint16_t pos;
    uint32_t count;
    uint64_t cand, used;
} grammar_frame;

typedef struct grammar_state {
    int16_t depth;
    uint8_t ws; /* whitespace bytes in a row */
    grammar_frame f[GRAMMAR_MAX_DEPTH];
} grammar_state;

/* The state before the first byte. */
void grammar_start(const grammar *g, grammar_state *st);
/* Advances st over n bytes; 1 when every byte was accepted, else 0 (st then
 * undefined). */
int grammar_feed(const grammar *g, grammar_state *st, const char *bytes, size_t n);
/* 1 when the text so far is a complete value (the end may come now). */
int grammar_can_end(const grammar *g, const grammar_state *st);
/* 1 when it is complete and no byte may follow. */
int grammar_must_end(const grammar *g, const grammar_state *st);

/* The model's token pieces as a byte trie, walked once per masked step. */
typedef struct vocab_trie vocab_trie;
/* pieces: token i's bytes are bytes[off[i] .. off[i+1]); empty pieces
 * (control tokens) are never allowed. Caller owns it. */
vocab_trie *vocab_trie_new(const char *bytes, const uint32_t *off, int32_t n_vocab);
void vocab_trie_free(vocab_trie *t);
/* Token i's bytes and their length. */
const char *vocab_trie_piece(const vocab_trie *t, int32_t id, size_t *n);
/* Bytes the shortest completion of the value still needs from st (so at
 * most that many tokens: every byte is a token of byte-level vocabularies). */
uint32_t grammar_cost(const grammar *g, const grammar_state *st);
/* Writes the bytes of a shortest completion of the value from st (grammar_cost
 * bytes, after which the value can end) to out; returns their count, or -1
 * when they do not fit in cap. */
int64_t grammar_shortest_completion(const grammar *g, const grammar_state *st, char *out, size_t cap);
/* Splits n bytes into tokens whose pieces they are, the longest piece first at
 * each point; returns how many, or -1 when some point starts no piece or more
 * than cap are needed. */
int64_t vocab_trie_split(const vocab_trie *t, const char *bytes, size_t n, int32_t *ids, int64_t cap);
/* allowed[i] = 1 for every token whose whole piece st accepts and after
 * which grammar_cost is at most budget (UINT32_MAX: no limit), else 0 (EOG
 * tokens are the caller's: they have empty pieces here). Returns how many. */
int64_t grammar_mask(const grammar *g, const grammar_state *st, const vocab_trie *t, uint32_t budget,
                     uint8_t *allowed);

#endif
