/* A JSON grammar as a deterministic pushdown automaton over bytes.
 *
 * Nodes (any value, string, number, literal set, array, object, anyOf) are
 * built by the schema compiler. The state is a stack of frames, one per open
 * value; a frame steps on a byte by its node's kind. A value that may end
 * (a number, a literal that is a prefix of a longer one, a closed string)
 * ends lazily: the byte it cannot take pops it and goes to its parent.
 * Parents own the whitespace between values; at most MAX_WS bytes of it in a
 * row (a small model would otherwise pad forever). anyOf is decided by the
 * value's first byte, so the automaton never keeps alternatives: alternatives
 * that start alike are joined before (enums into one set, patterns into one
 * DFA, objects into a union that commits at the first property that tells them
 * apart). A frame whose next step depends on which of several fixed texts it
 * writes (a property name, a union's discriminator, an item of a uniqueItems
 * array) matches those texts itself, so its cost stays exact.
 *
 * The token mask walks a byte trie of the vocabulary depth-first with the
 * state, so a prefix the grammar rejects cuts off every token below it: in
 * structure (after '{' only '"', '}' and whitespace) almost the whole trie is
 * cut at its first level; inside a free string most of it is walked. */
#include "grammar.h"

#include "regex.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Numbers: 16 integer and 16 fraction digits and a two-digit exponent keep
 * every value between about 1e-115 and 1e116, finite and not rounded to 0 in
 * a double (what most JSON readers parse numbers into). */
enum { MAX_WS = 20, MAX_INT_DIGITS = 16, MAX_FRAC_DIGITS = 16, MAX_EXP_DIGITS = 2 };

enum kind {
    K_ANY, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_LITERALS, K_ANY_OF, K_TAGGED, K_FORMAT, K_PATTERN,
    K_UNION
};

/* A bounded number's value in units of 1e-16 (MAX_FRAC_DIGITS): every number
 * the automaton writes is a whole count of them, below 1e32 in magnitude. */
typedef __int128 units;

typedef struct gnode {
    enum kind kind;
    int bounded;        /* number: lo/hi set (no exponent then) */
    int unique;         /* array of literals (child), each written at most once (uniqueItems) */
    units lo, hi;       /* number: the values allowed, inclusive, in units */
    units multiple;     /* number: its values are multiples of this (0: any), a whole number of units */
    int32_t min, max;   /* string length, array items, object properties (max < 0: none); format: its index in formats[] */
    int32_t child;      /* array items; object values when it has no properties; union: its index in unions */
    int32_t key;        /* object without properties: the node of its keys (-1: any string) */
    int32_t first, n;   /* object: props[first..+n); literals: lits; anyOf: alts */
    uint32_t min_len;   /* bytes of the shortest value */
    uint8_t starts[32]; /* bitmask of the bytes a value of this node can start with */
} gnode;

typedef struct gtext {
    char *s;
    size_t len;
    int node;     /* property value */
    int required;
} gtext;

struct grammar {
    atomic_int refs;
    gnode *nodes;
    int n_nodes, cap_nodes;
    gtext *texts; /* property names and literals */
    int n_texts, cap_texts;
    int *alts;
    int n_alts, cap_alts;
    int root;
    struct pattern { /* a K_PATTERN node's DFA (node.first indexes them) */
        regex_dfa *dfa;
        uint32_t *dist; /* bytes of JSON text from each DFA state to a match */
    } *patterns;
    int n_patterns, cap_patterns;
    int64_t pattern_states; /* of all patterns: at most GRAMMAR_MAX_PATTERN_STATES */
    /* A K_UNION node: objects of which the first property written tells which one is
       written (engine/grammar.c, "unions of objects"). node.first/n: the names of all
       of them (texts); each alternative's own object node is alts[first_alt + i]. */
    struct object_union {
        int first_alt, n_alts;
        int first_lit, n_lits;  /* the values that tell them apart: texts (node: which alternative, required: which name) */
        int8_t *index;          /* [name * n_alts + alt]: the name's property index in that alternative, -1: none */
        uint64_t first_names;   /* names that may be written first */
        int empty_ok;           /* some alternative may be {} */
    } *unions;
    int n_unions, cap_unions;
    /* the pieces of "any value" */
    int any, any_object, any_array, any_string, any_number, any_literal;
};

/* frame states */
enum {
    ST_START = 0,
    /* object */
    O_OPEN, O_KEY, O_KEY_CHILD, O_COLON, O_VALUE_WS, O_VALUE, O_AFTER, O_NEXT,
    /* array; A_LIT: inside an item of a uniqueItems array of literals (cand, pos) */
    A_OPEN, A_VALUE, A_AFTER, A_NEXT, A_LIT,
    /* string */
    S_BODY, S_ESC, S_HEX, S_LOW_BS, S_LOW_U, /* S_LOW_*: the \\u of a surrogate pair's second half */
    /* number */
    N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_EXP, N_EXP_SIGN, N_EXP_DIG,
    /* literals */
    L_MATCH,
    /* tagged: prefix text, the value, suffix text */
    T_PREFIX, T_VALUE, T_SUFFIX,
    /* format: along its template (pos), then a time's tail: fraction, offset, closing quote */
    F_TEMPLATE, F_TAIL, F_FRAC, F_OFFSET, F_CLOSE, F_IP,
    /* pattern: the string's text, the DFA state in count; after a backslash */
    P_BODY, P_ESC,
    /* union of objects until its first property tells which: after '{'; in the name
       (cand, pos); after a name whose value tells (count: the name); in that value */
    U_OPEN, U_KEY, U_COLON, U_VALUE_WS, U_VALUE,
    ST_DONE,
};

/* ---- building ----------------------------------------------------------------------- */

static int grow(void **v, int *cap, int need, size_t size) {
    if (need <= *cap) return 0;
    int cap2 = *cap ? *cap * 2 : 16;
    while (cap2 < need) cap2 *= 2;
    void *t = realloc(*v, (size_t)cap2 * size);
    if (!t) return -1;
    *v = t;
    *cap = cap2;
    return 0;
}

static uint32_t union_cost(const grammar *g, const grammar_frame *f);
static int add_pattern(grammar *g, regex_dfa *dfa, char *err, size_t errlen);

static void set_start(gnode *n, unsigned char c) { n->starts[c >> 3] |= (uint8_t)(1u << (c & 7)); }
static int has_start(const gnode *n, unsigned char c) { return n->starts[c >> 3] >> (c & 7) & 1; }

/* Bytes of property i written whole, with the comma before it. */
static uint32_t property_cost(const grammar *g, const gnode *nd, int i) {
    const gtext *t = &g->texts[nd->first + i];
    return 1 + (uint32_t)t->len + 3 + g->nodes[t->node].min_len;
}

/* Bytes the properties an object of named properties still needs once those in
 * `used` (and `except`) are written: the required ones not written, and the
 * cheapest others up to minProperties; each with the comma before it; with none,
 * 0. An object's own shortest form is '{' + this - 1 + '}' (its first property
 * has no comma). */
static uint32_t rest_required(const grammar *g, const gnode *nd, uint64_t used, int except) {
    if (except >= 0) used |= 1ull << except;
    uint32_t sum = 0, optional[GRAMMAR_MAX_PROPS];
    int written = __builtin_popcountll(used), missing = 0, n_optional = 0;
    for (int i = 0; i < nd->n; i++) {
        if (used >> i & 1) continue;
        if (g->texts[nd->first + i].required) sum += property_cost(g, nd, i), missing++;
        else optional[n_optional++] = property_cost(g, nd, i);
    }
    for (int more = nd->min - written - missing; more > 0 && n_optional > 0; more--) { /* the cheapest first */
        int best = 0;
        for (int k = 1; k < n_optional; k++)
            if (optional[k] < optional[best]) best = k;
        sum += optional[best];
        optional[best] = optional[--n_optional];
    }
    return sum;
}

/* The named properties that may come next after those in `used`: any not written while
 * maxProperties leaves room for the required ones still missing, else only those. */
static uint64_t next_properties(const grammar *g, const gnode *nd, uint64_t used) {
    uint64_t unused = 0, missing = 0;
    for (int i = 0; i < nd->n; i++)
        if (!(used >> i & 1)) {
            unused |= 1ull << i;
            if (g->texts[nd->first + i].required) missing |= 1ull << i;
        }
    if (nd->max >= 0 && __builtin_popcountll(used) + 1 + __builtin_popcountll(missing) > nd->max) return missing;
    return unused;
}

/* Bytes of an object without named properties, after '{' (O_OPEN) or a comma (O_NEXT):
 * '}' alone, or one entry and '}' where one must come. */
static uint32_t free_object_rest(const grammar *g, const gnode *nd, int after_comma) {
    if (nd->child < 0) return 1; /* only {} */
    uint32_t entry = g->nodes[nd->key >= 0 ? nd->key : g->any_string].min_len + 1 + g->nodes[nd->child].min_len;
    return after_comma || nd->min > 0 ? entry + 1 : 1;
}

static int add_node(grammar *g, enum kind k) {
    if (grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes)) return -1;
    gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->kind = k;
    n->child = -1;
    n->key = -1;
    n->max = -1;
    return g->n_nodes++;
}

static int add_text(grammar *g, const char *s, size_t len, int node, int required) {
    if (grow((void **)&g->texts, &g->cap_texts, g->n_texts + 1, sizeof *g->texts)) return -1;
    char *copy = malloc(len + 1);
    if (!copy) return -1;
    memcpy(copy, s, len);
    copy[len] = 0;
    g->texts[g->n_texts] = (gtext){copy, len, node, required};
    return g->n_texts++;
}

int grammar_string(grammar *g, int32_t min_len, int32_t max_len) {
    int id = add_node(g, K_STRING);
    if (id < 0) return -1;
    g->nodes[id].min_len = 2 + (uint32_t)min_len;
    g->nodes[id].min = min_len;
    g->nodes[id].max = max_len;
    set_start(&g->nodes[id], '"');
    return id;
}

static units pow10u(int k) { /* k in [0, 32] */
    static const units p[] = {
        1, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL, 100000000ULL, 1000000000ULL,
        10000000000ULL, 100000000000ULL, 1000000000000ULL, 10000000000000ULL, 100000000000000ULL,
        1000000000000000ULL, 10000000000000000ULL, 100000000000000000ULL, 1000000000000000000ULL,
        (units)1000000000000000000ULL * 10ULL, (units)1000000000000000000ULL * 100ULL,
        (units)1000000000000000000ULL * 1000ULL, (units)1000000000000000000ULL * 10000ULL,
        (units)1000000000000000000ULL * 100000ULL, (units)1000000000000000000ULL * 1000000ULL,
        (units)1000000000000000000ULL * 10000000ULL, (units)1000000000000000000ULL * 100000000ULL,
        (units)1000000000000000000ULL * 1000000000ULL, (units)1000000000000000000ULL * 10000000000ULL,
        (units)1000000000000000000ULL * 100000000000ULL, (units)1000000000000000000ULL * 1000000000000ULL,
        (units)1000000000000000000ULL * 10000000000000ULL, (units)1000000000000000000ULL * 100000000000000ULL,
    };
    return p[k];
}
#define UNIT pow10u(MAX_FRAC_DIGITS) /* 1 in units */
#define BEYOND pow10u(MAX_INT_DIGITS + MAX_FRAC_DIGITS) /* no number written reaches it */

int grammar_number(grammar *g, int integer) {
    int id = add_node(g, integer ? K_INTEGER : K_NUMBER);
    if (id < 0) return -1;
    g->nodes[id].min_len = 1;
    g->nodes[id].lo = -BEYOND;
    g->nodes[id].hi = BEYOND;
    for (const char *c = "-0123456789"; *c; c++) set_start(&g->nodes[id], (unsigned char)*c);
    return id;
}

int grammar_literals(grammar *g, const char *const *texts, size_t n, char *err, size_t errlen) {
    if (n == 0 || n > GRAMMAR_MAX_LITERALS)
        return snprintf(err, errlen, "enum must have 1 to %d values", GRAMMAR_MAX_LITERALS), -1;
    int id = add_node(g, K_LITERALS);
    if (id < 0) return snprintf(err, errlen, "out of memory"), -1;
    g->nodes[id].first = g->n_texts;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(texts[i]);
        if (!len || len > 0xffff) return snprintf(err, errlen, "an enum value is too long"), -1;
        if (add_text(g, texts[i], len, -1, 0) < 0) return snprintf(err, errlen, "out of memory"), -1;
        set_start(&g->nodes[id], (unsigned char)texts[i][0]);
        if (i == 0 || len < g->nodes[id].min_len) g->nodes[id].min_len = (uint32_t)len;
    }
    g->nodes[id].n = (int32_t)n;
    return id;
}

int grammar_array(grammar *g, int items, int32_t min_items, int32_t max_items, char *err,
                  size_t errlen) {
    if (items < 0 || items >= g->n_nodes) return snprintf(err, errlen, "bad items node"), -1;
    if (max_items >= 0 && min_items > max_items)
        return snprintf(err, errlen, "minItems %d exceeds maxItems %d", min_items, max_items), -1;
    int id = add_node(g, K_ARRAY);
    if (id < 0) return snprintf(err, errlen, "out of memory"), -1;
    g->nodes[id].child = items;
    g->nodes[id].min_len = 2 + (min_items ? (uint32_t)min_items * (g->nodes[items].min_len + 1) - 1 : 0);
    g->nodes[id].min = min_items;
    g->nodes[id].max = max_items;
    set_start(&g->nodes[id], '[');
    return id;
}

/* The node of array item i: its prefixItems entry, or items. */
static int item_node(const grammar *g, const gnode *nd, uint32_t i) {
    return i < (uint32_t)nd->n ? g->alts[nd->first + (int)i] : nd->child;
}

/* Bytes of the items from `from` up to minItems, each with a comma or the ']' after it. */
static uint32_t items_rest(const grammar *g, const gnode *nd, uint32_t from) {
    uint32_t sum = 0;
    for (uint32_t i = from; i < (uint32_t)nd->min; i++) sum += g->nodes[item_node(g, nd, i)].min_len + 1;
    return sum;
}

int grammar_array_prefix(grammar *g, int array, const int *items, size_t n, char *err, size_t errlen) {
    if (array < 0 || array >= g->n_nodes || g->nodes[array].kind != K_ARRAY || n > GRAMMAR_MAX_PROPS)
        return snprintf(err, errlen, "bad prefixItems"), -1;
    for (size_t i = 0; i < n; i++)
        if (items[i] < 0 || items[i] >= g->n_nodes) return snprintf(err, errlen, "bad prefixItems node"), -1;
    if (grow((void **)&g->alts, &g->cap_alts, g->n_alts + (int)n, sizeof *g->alts))
        return snprintf(err, errlen, "out of memory"), -1;
    gnode *nd = &g->nodes[array];
    nd->first = g->n_alts;
    nd->n = (int32_t)n;
    memcpy(g->alts + g->n_alts, items, n * sizeof *items);
    g->n_alts += (int)n;
    nd->min_len = nd->min ? 1 + items_rest(g, nd, 0) : 2;
    return 0;
}

static uint32_t unique_rest(const grammar *g, const gnode *nd, uint64_t used, int32_t k);

int grammar_array_unique(grammar *g, int array, char *err, size_t errlen) {
    gnode *nd = array >= 0 && array < g->n_nodes && g->nodes[array].kind == K_ARRAY ? &g->nodes[array] : NULL;
    if (!nd) return snprintf(err, errlen, "not an array"), -1;
    if (nd->max >= 0 && nd->max <= 1) return 0; /* one item at most: unique as it is */
    const gnode *items = &g->nodes[nd->child];
    if (nd->n || items->kind != K_LITERALS)
        return snprintf(err, errlen, "uniqueItems needs items that are an enum or const (or maxItems 1)"), -1;
    if (nd->min > items->n)
        return snprintf(err, errlen, "uniqueItems: minItems %d exceeds the %d values of the items' enum", nd->min,
                        items->n), -1;
    if (nd->max < 0 || nd->max > items->n) nd->max = items->n;
    nd->unique = 1;
    nd->min_len = 1 + (nd->min ? unique_rest(g, nd, 0, nd->min) - 1 : 1);
    return 0;
}

int grammar_object(grammar *g, const char *const *names, const int *nodes, const int *required,
                   size_t n, int values, char *err, size_t errlen) {
    if (n > GRAMMAR_MAX_PROPS)
        return snprintf(err, errlen, "an object may have at most %d properties", GRAMMAR_MAX_PROPS), -1;
    if (values >= g->n_nodes) return snprintf(err, errlen, "bad value node"), -1;
    int id = add_node(g, K_OBJECT);
    if (id < 0) return snprintf(err, errlen, "out of memory"), -1;
    g->nodes[id].first = g->n_texts;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (len > 0xffff) return snprintf(err, errlen, "a property name is too long"), -1;
        if (nodes[i] < 0 || nodes[i] >= g->n_nodes) return snprintf(err, errlen, "bad property node"), -1;
        for (size_t j = 0; j < i; j++)
            if (!strcmp(names[i], names[j]))
                return snprintf(err, errlen, "property '%s' is listed twice", names[i]), -1;
        if (add_text(g, names[i], len, nodes[i], required[i]) < 0)
            return snprintf(err, errlen, "out of memory"), -1;
    }
    g->nodes[id].n = (int32_t)n;
    g->nodes[id].child = n ? -1 : values;
    uint32_t rest = rest_required(g, &g->nodes[id], 0, -1);
    g->nodes[id].min_len = 2 + (rest ? rest - 1 : 0);
    set_start(&g->nodes[id], '{');
    return id;
}

int grammar_object_limits(grammar *g, int object, int32_t min_props, int32_t max_props, int keys, char *err,
                          size_t errlen) {
    gnode *nd = object >= 0 && object < g->n_nodes && g->nodes[object].kind == K_OBJECT ? &g->nodes[object] : NULL;
    if (!nd) return snprintf(err, errlen, "not an object"), -1;
    if (max_props >= 0 && min_props > max_props)
        return snprintf(err, errlen, "minProperties %d exceeds maxProperties %d", min_props, max_props), -1;
    int required = 0;
    for (int i = 0; i < nd->n; i++) required += g->texts[nd->first + i].required;
    if (nd->n && min_props > nd->n)
        return snprintf(err, errlen, "minProperties %d exceeds the %d properties that may be written", min_props,
                        nd->n), -1;
    if (max_props >= 0 && required > max_props)
        return snprintf(err, errlen, "maxProperties %d is below the %d required properties", max_props, required), -1;
    if (!nd->n && min_props > 1) /* a key written twice counts once for a JSON reader */
        return snprintf(err, errlen, "minProperties above 1 needs the properties listed"), -1;
    if (!nd->n && min_props && nd->child < 0)
        return snprintf(err, errlen, "minProperties %d, but no property is allowed", min_props), -1;
    if (keys >= 0) {
        static const uint8_t quote_only[32] = {['"' >> 3] = 1u << ('"' & 7)};
        if (nd->n || keys >= g->n_nodes || memcmp(g->nodes[keys].starts, quote_only, sizeof quote_only))
            return snprintf(err, errlen, "property names must be strings of an object without listed properties"), -1;
        nd->key = keys;
    }
    nd->min = min_props;
    nd->max = max_props;
    if (nd->n) {
        uint32_t rest = rest_required(g, nd, 0, -1);
        nd->min_len = 2 + (rest ? rest - 1 : 0);
    } else {
        nd->min_len = 1 + free_object_rest(g, nd, 0);
    }
    return 0;
}

/* Whether every value of node b (not a literal set) is a value of node a, as far as
 * cheap checks tell (a no where unsure): any value covers all; a string of no limits
 * (or of wider ones) every string; a number without bounds every number; an object or
 * array of anything every object or array. */
static int covers(const grammar *g, int a, int b) {
    const gnode *na = &g->nodes[a], *nb = &g->nodes[b];
    if (a == b || na->kind == K_ANY) return 1;
    switch (na->kind) {
    case K_STRING:
        if (nb->kind == K_STRING) return na->min <= nb->min && (na->max < 0 || (nb->max >= 0 && nb->max <= na->max));
        return na->min == 0 && na->max < 0 && (nb->kind == K_PATTERN || nb->kind == K_FORMAT);
    case K_NUMBER: return !na->bounded && (nb->kind == K_NUMBER || nb->kind == K_INTEGER);
    case K_INTEGER: return !na->bounded && nb->kind == K_INTEGER;
    case K_OBJECT:
        return nb->kind == K_OBJECT && !na->n && na->child == g->any && na->key < 0 && !na->min && na->max < 0;
    case K_ARRAY: return nb->kind == K_ARRAY && !na->n && na->child == g->any && !na->min && na->max < 0;
    default: return 0;
    }
}

/* ---- unions of objects ----
 * Objects among anyOf's alternatives all start with '{', and the automaton keeps
 * no alternatives: their union commits to one of them at its first property. That
 * property is one only that object lists, or one every object listing it gives an
 * enum or const of values the others do not have (a discriminator, as Pydantic's
 * tagged unions write `"type": "cat"`): after the name, or after the value, the
 * frame becomes that object's own, with the property written. With `exclusive`
 * (oneOf: a value two alternatives take is invalid) only a discriminator every
 * object lists may come first, and {} never. What is written is valid for the
 * object committed to. */

/* Replaces the objects among alts[0..*n) by one union node; 0 when they are fewer than
 * two, or not all of named properties, or nothing tells them apart (alts unchanged:
 * grammar_any_of then names the clash), -1 when out of memory. */
static int join_objects(grammar *g, int *alts, size_t *n, int exclusive) {
    int objs[16], k = 0, rest[64], m = 0;
    for (size_t i = 0; i < *n; i++) {
        const gnode *nd = &g->nodes[alts[i]];
        if (nd->kind == K_OBJECT && nd->n && k < 16) objs[k++] = alts[i];
        else if (nd->kind == K_OBJECT) return 0; /* an object of any keys: no name is its own */
        else rest[m++] = alts[i];
    }
    if (k < 2) return 0;
    /* the names of all of them */
    int names[GRAMMAR_MAX_PROPS], n_names = 0; /* as indices of texts: add_text moves them */
    for (int a = 0; a < k; a++) {
        const gnode *nd = &g->nodes[objs[a]];
        for (int i = 0; i < nd->n; i++) {
            const gtext *t = &g->texts[nd->first + i];
            int j = 0;
            while (j < n_names && strcmp(g->texts[names[j]].s, t->s)) j++;
            if (j < n_names) continue;
            if (n_names == GRAMMAR_MAX_PROPS) return 0;
            names[n_names++] = nd->first + i;
        }
    }
    int8_t *index = malloc((size_t)n_names * (size_t)k);
    if (!index) return -1;
    for (int j = 0; j < n_names; j++)
        for (int a = 0; a < k; a++) {
            const gnode *nd = &g->nodes[objs[a]];
            index[j * k + a] = -1;
            for (int i = 0; i < nd->n; i++)
                if (!strcmp(g->texts[nd->first + i].s, g->texts[names[j]].s)) index[j * k + a] = (int8_t)i;
        }
    struct object_union u = {.n_alts = k, .index = index};
    /* apart[a]: the alternatives that an object of a's properties fails, for each requires
       a property a does not list (what oneOf needs of the one written) */
    uint32_t apart[16] = {0};
    for (int a = 0; a < k; a++)
        for (int b = 0; b < k; b++) {
            const gnode *nb = &g->nodes[objs[b]];
            for (int i = 0; i < nb->n && b != a; i++)
                if (g->texts[nb->first + i].required) {
                    int j = 0;
                    while (strcmp(g->texts[names[j]].s, g->texts[nb->first + i].s)) j++;
                    if (index[j * k + a] < 0) apart[a] |= 1u << b;
                }
        }
    uint32_t all = (1u << k) - 1;
    for (int a = 0; a < k; a++) {
        const gnode *nd = &g->nodes[objs[a]];
        int others_require = 1; /* {} fails each of the others */
        for (int b = 0; b < k; b++)
            others_require &= b == a || rest_required(g, &g->nodes[objs[b]], 0, -1) > 0;
        if (!nd->min && !rest_required(g, nd, 0, -1) && (!exclusive || others_require)) u.empty_ok = 1;
    }
    /* which names may come first; the values that tell them apart, as (alternative, name) texts */
    const char *lit_s[64];
    int lit_owner[64], lit_name[64], n_lits = 0;
    for (int j = 0; j < n_names; j++) {
        int owners = 0, literal = 1, first = n_lits;
        for (int a = 0; a < k; a++) {
            if (index[j * k + a] < 0) continue;
            owners++;
            const gnode *v = &g->nodes[g->texts[g->nodes[objs[a]].first + index[j * k + a]].node];
            literal &= v->kind == K_LITERALS;
        }
        uint32_t owned = 0;
        for (int a = 0; a < k; a++) owned |= (uint32_t)(index[j * k + a] >= 0) << a;
        int sole = owners == 1 ? __builtin_ctz(owned) : -1;
        if (sole >= 0 && (!exclusive || (apart[sole] | 1u << sole) == all)) {
            u.first_names |= 1ull << j;
            continue;
        }
        /* a discriminator: the owners fail on each other's values, the rest must fail otherwise */
        int others_fail = 1;
        for (int a = 0; a < k; a++)
            if (owned >> a & 1) others_fail &= ((apart[a] | owned) & all) == all;
        if (!literal || (exclusive && !others_fail)) continue;
        int apart = 1;
        for (int a = 0; a < k && apart; a++) {
            if (index[j * k + a] < 0) continue;
            const gnode *v = &g->nodes[g->texts[g->nodes[objs[a]].first + index[j * k + a]].node];
            for (int i = 0; i < v->n && apart; i++) {
                const char *t = g->texts[v->first + i].s;
                for (int l = first; l < n_lits && apart; l++) apart = !(lit_owner[l] != a && !strcmp(lit_s[l], t));
                if (apart && n_lits == 64) apart = 0;
                if (apart) lit_s[n_lits] = t, lit_owner[n_lits] = a, lit_name[n_lits++] = j;
            }
        }
        if (apart) u.first_names |= 1ull << j;
        else n_lits = first;
    }
    int id = -1;
    if (!u.first_names && !u.empty_ok) {
        free(index);
        return 0;
    }
    if (grow((void **)&g->unions, &g->cap_unions, g->n_unions + 1, sizeof *g->unions) ||
        grow((void **)&g->alts, &g->cap_alts, g->n_alts + k, sizeof *g->alts) || (id = add_node(g, K_UNION)) < 0) {
        free(index);
        return -1;
    }
    gnode *nd = &g->nodes[id];
    nd->first = g->n_texts;
    nd->n = n_names;
    for (int j = 0; j < n_names; j++)
        if (add_text(g, g->texts[names[j]].s, g->texts[names[j]].len, -1, 0) < 0) return free(index), -1;
    u.first_lit = g->n_texts;
    u.n_lits = n_lits;
    for (int l = 0; l < n_lits; l++)
        if (add_text(g, lit_s[l], strlen(lit_s[l]), lit_owner[l], lit_name[l]) < 0) return free(index), -1;
    u.first_alt = g->n_alts;
    memcpy(g->alts + g->n_alts, objs, (size_t)k * sizeof *objs);
    g->n_alts += k;
    nd = &g->nodes[id];
    nd->child = g->n_unions;
    g->unions[g->n_unions++] = u;
    set_start(nd, '{');
    grammar_frame f = {.node = id, .st = U_OPEN};
    nd->min_len = 1 + union_cost(g, &f);
    rest[m++] = id;
    memcpy(alts, rest, (size_t)m * sizeof *rest);
    *n = (size_t)m;
    return 0;
}

/* A DFA of exactly the strings among the JSON texts (each a compact JSON value: those
 * that are strings, '"'-quoted, with JSON's escapes), built as the pattern
 * ^text$|^text$...; NULL with err. */
static regex_dfa *strings_dfa(const char *const *texts, size_t n, char *err, size_t errlen) {
    size_t cap = 16;
    for (size_t i = 0; i < n; i++) cap += strlen(texts[i]) * 2 + 4;
    char *re = malloc(cap), *o = re;
    if (!re) return snprintf(err, errlen, "out of memory"), NULL;
    for (size_t i = 0; i < n; i++) {
        const char *t = texts[i];
        if (t[0] != '"') continue;
        if (o != re) *o++ = '|';
        *o++ = '^';
        for (const char *p = t + 1; *p && !(p[0] == '"' && !p[1]); p++) {
            if (*p == '\\') { /* JSON's escapes are the pattern's, but \" and \/, which stand for themselves */
                p++;
                if (*p == '"' || *p == '/') *o++ = *p;
                else if (*p == 'b') o += sprintf(o, "\\x08");
                else *o++ = '\\', *o++ = *p;
            } else {
                if (strchr("\\^$.|?*+()[]{}/", *p)) *o++ = '\\';
                *o++ = *p;
            }
        }
        *o++ = '$';
    }
    *o = 0;
    regex_dfa *d = regex_compile(re, err, errlen);
    free(re);
    return d;
}

/* Joins the patterns among alts[0..*n) and the string literals of texts[0..*n_texts)
 * (when there is a pattern) into one pattern node; 0, or -1 with err. */
static int join_patterns(grammar *g, int *alts, size_t *n, const char **texts, size_t *n_texts, char *err,
                         size_t errlen) {
    regex_dfa *all = NULL;
    size_t m = 0, strings = 0;
    for (size_t i = 0; i < *n_texts; i++) strings += texts[i][0] == '"';
    int joined = 0;
    for (size_t i = 0; i < *n; i++) joined += g->nodes[alts[i]].kind == K_PATTERN;
    if (!joined || joined + (strings > 0) < 2) return 0;
    if (strings) {
        if (!(all = strings_dfa(texts, *n_texts, err, errlen))) return -1;
        size_t k = 0;
        for (size_t i = 0; i < *n_texts; i++)
            if (texts[i][0] != '"') texts[k++] = texts[i];
        *n_texts = k;
    }
    const regex_dfa *first = NULL; /* the first pattern's, while nothing is joined to it */
    for (size_t i = 0; i < *n; i++) {
        const gnode *nd = &g->nodes[alts[i]];
        if (nd->kind != K_PATTERN) {
            alts[m++] = alts[i];
            continue;
        }
        const regex_dfa *d = g->patterns[nd->first].dfa;
        if (!all && !first) {
            first = d;
            continue;
        }
        regex_dfa *u = regex_union(all ? all : first, d, err, errlen);
        regex_free(all);
        if (!(all = u)) return -1;
    }
    int id = add_pattern(g, all, err, errlen);
    if (id < 0) return -1;
    alts[m++] = id;
    *n = m;
    return 0;
}

int grammar_one_of(grammar *g, const int *alts, size_t n, char *err, size_t errlen) {
    int list[64];
    if (n == 0 || n > 64) return snprintf(err, errlen, "oneOf needs 1 to 64 alternatives"), -1;
    memcpy(list, alts, n * sizeof *alts);
    for (size_t i = 0; i < n; i++)
        if (alts[i] < 0 || alts[i] >= g->n_nodes) return snprintf(err, errlen, "bad alternative"), -1;
    if (join_objects(g, list, &n, 1)) return snprintf(err, errlen, "out of memory"), -1;
    return grammar_any_of(g, list, n, err, errlen);
}

int grammar_any_of_overlapping(grammar *g, const int *alts, size_t n, char *err, size_t errlen) {
    if (n == 0 || n > 64) return snprintf(err, errlen, "anyOf needs 1 to 64 alternatives"), -1;
    int others[64], m = 0, sets = 0, first_set = -1;
    const char *texts[GRAMMAR_MAX_LITERALS];
    size_t n_texts = 0, n_all = 0;
    for (size_t i = 0; i < n; i++) {
        if (alts[i] < 0 || alts[i] >= g->n_nodes) return snprintf(err, errlen, "bad alternative"), -1;
        if (g->nodes[alts[i]].kind != K_LITERALS) others[m++] = alts[i];
        else if (!sets++) first_set = alts[i];
    }
    /* the enums' and consts' values, once each, but those another alternative takes */
    for (size_t i = 0; i < n; i++) {
        const gnode *nd = &g->nodes[alts[i]];
        for (int k = 0; nd->kind == K_LITERALS && k < nd->n; k++) {
            const gtext *t = &g->texts[nd->first + k];
            int taken = 0;
            for (size_t j = 0; j < n_texts && !taken; j++) taken = !strcmp(texts[j], t->s);
            for (int j = 0; j < m && !taken; j++) taken = grammar_node_accepts(g, others[j], t->s, t->len);
            n_all++;
            if (taken) continue;
            if (n_texts == GRAMMAR_MAX_LITERALS)
                return snprintf(err, errlen, "the values of anyOf's enums and consts together exceed %d",
                                GRAMMAR_MAX_LITERALS), -1;
            texts[n_texts++] = t->s;
        }
    }
    /* an alternative another covers is dropped (of two that cover each other, the later) */
    int out[65], k = 0;
    for (int i = 0; i < m; i++) {
        int dropped = 0;
        for (int j = 0; j < m && !dropped; j++)
            dropped = j != i && covers(g, others[j], others[i]) && (j < i || !covers(g, others[i], others[j]));
        if (!dropped) out[k++] = others[i];
    }
    size_t n_out = (size_t)k;
    if (join_patterns(g, out, &n_out, texts, &n_texts, err, errlen)) return -1;
    if (n_texts) {
        int lits = sets == 1 && n_texts == n_all ? first_set : grammar_literals(g, texts, n_texts, err, errlen);
        if (lits < 0) return -1;
        out[n_out++] = lits;
    }
    if (join_objects(g, out, &n_out, 0)) return snprintf(err, errlen, "out of memory"), -1;
    return grammar_any_of(g, out, n_out, err, errlen);
}

int grammar_any_of(grammar *g, const int *alts, size_t n, char *err, size_t errlen) {
    if (n == 0) return snprintf(err, errlen, "anyOf needs at least one alternative"), -1;
    uint8_t seen[32] = {0};
    for (size_t i = 0; i < n; i++) {
        if (alts[i] < 0 || alts[i] >= g->n_nodes) return snprintf(err, errlen, "bad alternative"), -1;
        for (int b = 0; b < 32; b++) {
            if (seen[b] & g->nodes[alts[i]].starts[b])
                return snprintf(err, errlen, "anyOf alternatives that can start alike (two objects, "
                                "two arrays, two kinds of string or of number) are not supported"), -1;
            seen[b] |= g->nodes[alts[i]].starts[b];
        }
    }
    if (n == 1) return alts[0];
    int id = add_node(g, K_ANY_OF);
    if (id < 0 || grow((void **)&g->alts, &g->cap_alts, g->n_alts + (int)n, sizeof *g->alts))
        return snprintf(err, errlen, "out of memory"), -1;
    memcpy(g->alts + g->n_alts, alts, n * sizeof *alts);
    g->nodes[id].first = g->n_alts;
    g->nodes[id].n = (int32_t)n;
    g->n_alts += (int)n;
    memcpy(g->nodes[id].starts, seen, sizeof seen);
    for (size_t i = 0; i < n; i++)
        if (i == 0 || g->nodes[alts[i]].min_len < g->nodes[id].min_len) g->nodes[id].min_len = g->nodes[alts[i]].min_len;
    return id;
}

int grammar_tagged(grammar *g, const char *const *prefixes, const int *nodes, size_t n,
                   const char *suffix, char *err, size_t errlen) {
    if (n == 0 || n > GRAMMAR_MAX_LITERALS)
        return snprintf(err, errlen, "1 to %d tagged values", GRAMMAR_MAX_LITERALS), -1;
    int id = add_node(g, K_TAGGED);
    if (id < 0) return snprintf(err, errlen, "out of memory"), -1;
    g->nodes[id].first = g->n_texts;
    uint32_t best = UINT32_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(prefixes[i]);
        if (!len || len > 0xffff || nodes[i] < 0 || nodes[i] >= g->n_nodes)
            return snprintf(err, errlen, "bad tagged value"), -1;
        for (size_t j = 0; j < i; j++)
            if (!strncmp(prefixes[i], prefixes[j], len < strlen(prefixes[j]) ? len : strlen(prefixes[j])))
                return snprintf(err, errlen, "tagged prefixes must not be prefixes of one another"), -1;
        if (add_text(g, prefixes[i], len, nodes[i], 0) < 0) return snprintf(err, errlen, "out of memory"), -1;
        set_start(&g->nodes[id], (unsigned char)prefixes[i][0]);
        if ((uint32_t)len + g->nodes[nodes[i]].min_len < best) best = (uint32_t)len + g->nodes[nodes[i]].min_len;
    }
    if (add_text(g, suffix, strlen(suffix), -1, 0) < 0) return snprintf(err, errlen, "out of memory"), -1;
    g->nodes[id].n = (int32_t)n; /* the suffix is texts[first + n] */
    g->nodes[id].min_len = best + (uint32_t)strlen(suffix);
    return id;
}

/* String formats (JSON Schema's "format"), written one way each: a template
 * of literal bytes and digit classes (Y year, M month, D day, h hour, m
 * minute, s second, H hex digit), and for times a tail of an optional
 * fraction (1-6 digits) and an offset (Z or +hh:mm); ipv4 has its own states.
 * Every digit is checked against those before it (month 01-12, the month's
 * days in that year, hour 00-23), so each value is a valid date, time or
 * address, not only its shape. */
static const struct format {
    const char *name, *template;
    int time_tail;
    int32_t min_chars, max_chars; /* the lengths of its values */
} formats[] = {
    {"date", "\"YYYY-MM-DD\"", 0, 10, 10},
    {"time", "\"hh:mm:ss", 1, 9, 21},
    {"date-time", "\"YYYY-MM-DDThh:mm:ss", 1, 20, 32},
    {"uuid", "\"HHHHHHHH-HHHH-HHHH-HHHH-HHHHHHHHHHHH\"", 0, 36, 36},
    {"ipv4", "\"", 0, 7, 15},
};
enum { FORMAT_IPV4 = 4, FORMAT_FRAC_DIGITS = 6 };

/* Formats whose values are a language of words, written as patterns (grammar_pattern):
 * a subset every checker takes. An email's local part is dot-atoms of letters and
 * digits, at most 63 bytes; its domain has up to three labels before a common
 * top-level domain (checkers such as Pydantic's refuse special-use ones like .local
 * or .test); a hostname has up to four labels of at most 51 bytes (253 in all at
 * most, as RFC 1123 asks), lower case where IDNA checkers read it; a uri is an http
 * or https URL of such a domain and up to six path segments (at most 296 characters:
 * Pydantic's HttpUrl allows 2,083), which is also a uri-reference, an iri and a
 * uri-template without expressions. A regex is letters, digits, spaces, '_' and '-'
 * (a literal in every dialect); a duration is RFC 3339's (appendix A) with numbers of
 * up to four digits; an ipv6 address is eight groups, uncompressed. */
#define EMAIL "^[A-Za-z0-9]{1,15}([._+-][A-Za-z0-9]{1,15}){0,3}@([a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\\.){1,3}" \
              "(com|org|net|edu|gov|io|dev|app|info|biz|co|uk|de|fr|es|it|nl|ca|au|jp|in|br|ch|se)$"
#define URI "^https?://([a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\\.){1,3}(com|org|net|edu|gov|io|dev|app|info|co|uk|de)" \
            "(/[A-Za-z0-9._~-]{1,30}){0,6}/?$"
#define POINTER "(/[A-Za-z0-9_.-]{0,20}){0,8}"
#define DUR_TIME "T([0-9]{1,4}H([0-9]{1,4}M([0-9]{1,4}S)?)?|[0-9]{1,4}M([0-9]{1,4}S)?|[0-9]{1,4}S)"
static const struct {
    const char *name, *pattern;
} format_patterns[] = {
    {"email", EMAIL},
    {"idn-email", EMAIL},
    {"hostname", "^[A-Za-z0-9]([A-Za-z0-9-]{0,49}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,49}[A-Za-z0-9])?){0,3}$"},
    {"idn-hostname", "^[a-z0-9]([a-z0-9-]{0,49}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,49}[a-z0-9])?){0,3}$"},
    {"uri", URI},
    {"uri-reference", URI},
    {"iri", URI},
    {"iri-reference", URI},
    {"uri-template", URI},
    {"ipv6", "^[0-9a-f]{1,4}(:[0-9a-f]{1,4}){7}$"},
    {"json-pointer", "^" POINTER "$"},
    {"relative-json-pointer", "^(0|[1-9][0-9]{0,3})(#|" POINTER ")$"},
    {"regex", "^[A-Za-z0-9 _-]*$"},
    {"duration", "^P(([0-9]{1,4}D|[0-9]{1,4}M([0-9]{1,4}D)?|[0-9]{1,4}Y([0-9]{1,4}M([0-9]{1,4}D)?)?)(" DUR_TIME ")?|"
                 DUR_TIME "|[0-9]{1,4}W)$"},
};
#undef EMAIL
#undef URI
#undef POINTER
#undef DUR_TIME

int grammar_has_format(const char *name) {
    for (size_t i = 0; i < sizeof format_patterns / sizeof *format_patterns; i++)
        if (!strcmp(format_patterns[i].name, name)) return 1;
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        if (!strcmp(formats[i].name, name)) return 1;
    return 0;
}

int grammar_format(grammar *g, const char *name, int32_t min_len, int32_t max_len, char *err, size_t errlen) {
    for (size_t i = 0; i < sizeof format_patterns / sizeof *format_patterns; i++)
        if (!strcmp(format_patterns[i].name, name))
            return grammar_pattern(g, format_patterns[i].pattern, min_len, max_len, err, errlen);
    int k = 0, n = (int)(sizeof formats / sizeof *formats);
    while (k < n && strcmp(formats[k].name, name)) k++;
    if (k == n)
        return snprintf(err, errlen,
                        "format '%s' is not supported", name),
               -1;
    if (min_len > formats[k].min_chars || (max_len >= 0 && max_len < formats[k].max_chars))
        return snprintf(err, errlen, "format '%s' writes %d to %d characters: minLength/maxLength would cut it", name,
                        formats[k].min_chars, formats[k].max_chars),
               -1;
    int id = add_node(g, K_FORMAT);
    if (id < 0) return snprintf(err, errlen, "out of memory"), -1;
    g->nodes[id].min = k;
    /* the shortest value: the template, then "Z\"" for a time, "0.0.0.0\"" for an address */
    g->nodes[id].min_len =
        (uint32_t)strlen(formats[k].template) + (formats[k].time_tail ? 2 : 0) + (k == FORMAT_IPV4 ? 8 : 0);
    set_start(&g->nodes[id], '"');
    return id;
}

/* The JSON text of a string byte: most are themselves, '"' and '\\' and five control
 * characters take a two-byte escape; the other control characters are not written. */
static const char short_escapes[] = "\"\\/bfnrt", short_escaped[] = "\"\\/\b\f\n\r\t";

static uint8_t text_cost(uint8_t b) {
    if (b == '"' || b == '\\') return 2;
    if (b < 0x20) return memchr(short_escaped + 3, b, 5) ? 2 : 0;
    return 1;
}

static regex_dfa *strings_dfa(const char *const *texts, size_t n, char *err, size_t errlen);

int grammar_pattern(grammar *g, const char *pattern, int32_t min_len, int32_t max_len, char *err, size_t errlen) {
    return grammar_pattern_except(g, pattern, NULL, 0, NULL, 0, min_len, max_len, err, errlen);
}

/* *acc joined with d (both may be NULL; d is taken); 0, or -1 with err. */
static int join_dfa(regex_dfa **acc, regex_dfa *d, char *err, size_t errlen) {
    if (!*acc || !d) {
        if (!*acc) *acc = d;
        return 0;
    }
    regex_dfa *u = regex_union(*acc, d, err, errlen);
    regex_free(*acc);
    regex_free(d);
    return (*acc = u) ? 0 : -1;
}

int grammar_pattern_except(grammar *g, const char *pattern, const char *const *except_patterns, size_t n_patterns,
                           const char *const *except_texts, size_t n_except, int32_t min_len, int32_t max_len,
                           char *err, size_t errlen) {
    regex_dfa *dfa = regex_compile(pattern ? pattern : "", err, errlen), *out = NULL;
    if (!dfa) return -1;
    if (n_patterns || n_except) {
        size_t strings = 0;
        for (size_t i = 0; i < n_except; i++) strings += except_texts[i][0] == '"';
        regex_dfa *taken = NULL, *d; /* NULL at the end: only non-strings to leave out */
        int ok = 1;
        for (size_t i = 0; ok && i < n_patterns; i++)
            ok = (d = regex_compile(except_patterns[i], err, errlen)) && !join_dfa(&taken, d, err, errlen);
        if (ok && strings) ok = (d = strings_dfa(except_texts, n_except, err, errlen)) && !join_dfa(&taken, d, err, errlen);
        if (ok && taken) {
            out = regex_minus(dfa, taken, err, errlen);
            if (out && regex_start(out) < 0) {
                snprintf(err, errlen, "no string is left once 'not' takes its strings out");
                regex_free(out);
                out = NULL;
            }
            ok = out != NULL;
        } else if (ok) {
            out = dfa, dfa = NULL;
        }
        regex_free(taken);
        regex_free(dfa);
        if (!ok) return -1;
        dfa = out;
    }
    int64_t fewest, most;
    if ((min_len > 0 || max_len >= 0) && !regex_length_bounds(dfa, &fewest, &most) &&
        (fewest < min_len || (max_len >= 0 && (most < 0 || most > max_len)))) { /* the lengths cut the matches */
        regex_dfa *within = regex_limit_length(dfa, min_len, max_len, err, errlen);
        regex_free(dfa);
        if (!within) return -1;
        dfa = within;
    }
    return add_pattern(g, dfa, err, errlen);
}

/* A string node of dfa's matches (owned now, freed on failure). */
static int add_pattern(grammar *g, regex_dfa *dfa, char *err, size_t errlen) {
    if (g->pattern_states + regex_n_states(dfa) > GRAMMAR_MAX_PATTERN_STATES) {
        regex_free(dfa);
        return snprintf(err, errlen, "the schema's patterns need more than %d automaton states together",
                        GRAMMAR_MAX_PATTERN_STATES), -1;
    }
    g->pattern_states += regex_n_states(dfa);
    uint8_t cost[256];
    for (int b = 0; b < 256; b++) cost[b] = text_cost((uint8_t)b);
    uint32_t *dist = malloc((size_t)regex_n_states(dfa) * sizeof *dist);
    int id = -1;
    if (!dist || regex_distances(dfa, cost, dist) ||
        grow((void **)&g->patterns, &g->cap_patterns, g->n_patterns + 1, sizeof *g->patterns) ||
        (id = add_node(g, K_PATTERN)) < 0) {
        snprintf(err, errlen, "out of memory");
    } else if (regex_start(dfa) < 0 || dist[regex_start(dfa)] == UINT32_MAX) {
        snprintf(err, errlen, "the pattern matches no string a JSON text can hold");
        g->n_nodes--, id = -1;
    }
    if (id < 0) {
        regex_free(dfa);
        free(dist);
        return -1;
    }
    g->patterns[g->n_patterns] = (struct pattern){dfa, dist};
    g->nodes[id].first = g->n_patterns++;
    g->nodes[id].min_len = dist[regex_start(dfa)] + 2;
    set_start(&g->nodes[id], '"');
    return id;
}

int grammar_any(grammar *g) { return g->any; }

void grammar_set_root(grammar *g, int node) {
    if (node >= 0 && node < g->n_nodes) g->root = node;
}

grammar *grammar_new(void) {
    grammar *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    atomic_init(&g->refs, 1);
    char err[64];
    static const char *const tfn[] = {"true", "false", "null"};
    g->any = add_node(g, K_ANY);
    g->any_string = grammar_string(g, 0, -1);
    g->any_number = grammar_number(g, 0);
    g->any_literal = grammar_literals(g, tfn, 3, err, sizeof err);
    g->any_array = grammar_array(g, g->any, 0, -1, err, sizeof err);
    g->any_object = grammar_object(g, NULL, NULL, NULL, 0, g->any, err, sizeof err);
    if (g->any < 0 || g->any_string < 0 || g->any_number < 0 || g->any_literal < 0 ||
        g->any_array < 0 || g->any_object < 0) {
        grammar_unref(g);
        return NULL;
    }
    for (int k = 1; k < g->n_nodes; k++)
        for (int b = 0; b < 32; b++) g->nodes[g->any].starts[b] |= g->nodes[k].starts[b];
    g->nodes[g->any].min_len = 1;
    g->root = g->any;
    return g;
}

grammar *grammar_ref(grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void grammar_unref(grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
    for (int i = 0; i < g->n_texts; i++) free(g->texts[i].s);
    free(g->texts);
    free(g->nodes);
    free(g->alts);
    for (int i = 0; i < g->n_patterns; i++) {
        regex_free(g->patterns[i].dfa);
        free(g->patterns[i].dist);
    }
    free(g->patterns);
    for (int i = 0; i < g->n_unions; i++) free(g->unions[i].index);
    free(g->unions);
    free(g);
}

/* ---- running ------------------------------------------------------------------------- */

enum step { REJECT, ACCEPT, POP, PUSH };

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_hex(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
static int hex_value(unsigned char c) { return is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10; }

/* Candidates among texts[first..first+n) (bits of cand) whose byte at pos is c. */
static uint64_t narrow(const grammar *g, const gnode *nd, uint64_t cand, uint32_t pos, unsigned char c) {
    uint64_t out = 0;
    for (int i = 0; i < nd->n; i++)
        if (cand >> i & 1) {
            const gtext *t = &g->texts[nd->first + i];
            if (t->len > pos && (unsigned char)t->s[pos] == c) out |= 1ull << i;
        }
    return out;
}

/* The candidate of cand that ends exactly at pos, or -1. */
static int ended(const grammar *g, const gnode *nd, uint64_t cand, uint32_t pos) {
    for (int i = 0; i < nd->n; i++)
        if ((cand >> i & 1) && g->texts[nd->first + i].len == pos) return i;
    return -1;
}

static uint64_t all_bits(int n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }

/* Whether an object may close after `used` (its named properties written, or with
 * none named, the count of entries): every required one and minProperties met. */
static int object_may_end(const grammar *g, const gnode *nd, uint64_t used) {
    if (!nd->n) return used >= (uint64_t)nd->min;
    for (int i = 0; i < nd->n; i++)
        if (g->texts[nd->first + i].required && !(used >> i & 1)) return 0;
    return __builtin_popcountll(used) >= nd->min;
}

/* ---- arrays of distinct literals (uniqueItems) ----
 * The array frame matches its items' literals itself (A_LIT, like a property name),
 * so its cost knows which one an item is: used holds those written. */

/* Bytes of the k shortest literals not in used, each with the ',' before it, and the
 * ']' after them: what k more items and the end need; UINT32_MAX when fewer are left. */
static uint32_t unique_rest(const grammar *g, const gnode *nd, uint64_t used, int32_t k) {
    const gnode *items = &g->nodes[nd->child];
    uint32_t sum = 1, taken = 0;
    uint64_t left = all_bits(items->n) & ~used;
    for (int32_t i = 0; i < k; i++) {
        int best = -1;
        for (int l = 0; l < items->n; l++)
            if ((left >> l & 1) && (best < 0 || g->texts[items->first + l].len < g->texts[items->first + best].len))
                best = l;
        if (best < 0) return UINT32_MAX;
        left &= ~(1ull << best);
        taken += 1 + (uint32_t)g->texts[items->first + best].len;
    }
    return sum + taken;
}

static uint32_t unique_cost(const grammar *g, const gnode *nd, const grammar_frame *f) {
    int32_t need = nd->min - (int32_t)f->count;
    switch (f->st) {
    case A_OPEN: return need > 0 ? unique_rest(g, nd, f->used, need) - 1 : 1; /* the first has no ',' */
    case A_NEXT: return unique_rest(g, nd, f->used, need > 1 ? need : 1) - 1;
    case A_AFTER: return unique_rest(g, nd, f->used, need > 0 ? need : 0);
    case A_LIT: {
        const gnode *items = &g->nodes[nd->child];
        uint32_t best = UINT32_MAX;
        for (int l = 0; l < items->n; l++)
            if (f->cand >> l & 1) {
                uint32_t r = unique_rest(g, nd, f->used | 1ull << l, need > 1 ? need - 1 : 0);
                uint32_t c = r == UINT32_MAX ? r : (uint32_t)g->texts[items->first + l].len - f->pos + r;
                if (c < best) best = c;
            }
        return best;
    }
    default: return 0;
    }
}

static enum step unique_step(const grammar *g, const gnode *nd, grammar_frame *f, unsigned char c) {
    const gnode *items = &g->nodes[nd->child];
    switch (f->st) {
    case A_OPEN:
    case A_NEXT: {
        if (is_ws(c)) return ACCEPT;
        if (c == ']' && f->st == A_OPEN && nd->min == 0) return f->st = ST_DONE, ACCEPT;
        uint64_t cand = narrow(g, items, all_bits(items->n) & ~f->used, 0, c);
        if (!cand) return REJECT;
        return f->cand = cand, f->pos = 1, f->st = A_LIT, ACCEPT;
    }
    case A_LIT: {
        uint64_t cand = narrow(g, items, f->cand, f->pos, c);
        if (cand) return f->cand = cand, f->pos++, ACCEPT;
        int l = ended(g, items, f->cand, f->pos);
        if (l < 0) return REJECT;
        f->used |= 1ull << l;
        f->count++;
        f->st = A_AFTER; /* c follows the item */
    }
    /* fall through */
    case A_AFTER:
        if (is_ws(c)) return ACCEPT;
        if (c == ']') return f->count >= (uint32_t)nd->min ? (f->st = ST_DONE, ACCEPT) : REJECT;
        if (c != ',' || f->count >= (uint32_t)nd->max) return REJECT;
        return f->st = A_NEXT, ACCEPT;
    default: return REJECT;
    }
}

/* ---- unions of objects (built by join_objects) ---- */

/* Bytes alternative a needs once name j and its value are written: its other properties and '}'. */
static uint32_t union_after(const grammar *g, const struct object_union *u, int j, int a) {
    const gnode *obj = &g->nodes[g->alts[u->first_alt + a]];
    return rest_required(g, obj, 1ull << u->index[j * u->n_alts + a], -1) + 1;
}

/* The shortest value of name j in alternative a. */
static uint32_t union_value_min(const grammar *g, const struct object_union *u, int j, int a) {
    const gnode *obj = &g->nodes[g->alts[u->first_alt + a]];
    return g->nodes[g->texts[obj->first + u->index[j * u->n_alts + a]].node].min_len;
}

/* The values that tell the alternatives apart, as a node whose texts narrow() and ended() read. */
static gnode union_values(const struct object_union *u) {
    gnode v = {.kind = K_LITERALS, .first = u->first_lit, .n = u->n_lits};
    return v;
}

/* The values of name j that tell the alternatives apart (bits of union_values' texts; 0: none). */
static uint64_t union_name_values(const grammar *g, const struct object_union *u, int j) {
    uint64_t out = 0;
    for (int l = 0; l < u->n_lits; l++)
        if (g->texts[u->first_lit + l].required == j) out |= 1ull << l;
    return out;
}

/* The frame becomes alternative a's object with name j written (its value too when
 * after_value). */
static void union_commit(const grammar *g, grammar_frame *f, const struct object_union *u, int j, int a,
                         int after_value) {
    int i = u->index[j * u->n_alts + a];
    f->node = g->alts[u->first_alt + a];
    f->used = 1ull << i;
    f->count = (uint32_t)i;
    f->st = after_value ? O_AFTER : O_COLON;
}

static uint32_t union_cost(const grammar *g, const grammar_frame *f) {
    const gnode *nd = &g->nodes[f->node];
    const struct object_union *u = &g->unions[nd->child];
    uint32_t best = UINT32_MAX;
    if (f->st == U_VALUE) {
        for (int l = 0; l < u->n_lits; l++)
            if (f->cand >> l & 1) {
                const gtext *t = &g->texts[u->first_lit + l];
                uint32_t c = (uint32_t)t->len - f->pos + union_after(g, u, (int)f->count, t->node);
                if (c < best) best = c;
            }
        return best;
    }
    if (f->st == U_OPEN && u->empty_ok) best = 1;
    uint64_t names = f->st == U_OPEN ? u->first_names : f->st == U_KEY ? f->cand : 1ull << f->count;
    for (int j = 0; j < nd->n; j++) {
        if (!(names >> j & 1)) continue;
        /* what comes before the value: the rest of the name, its quote and ':' */
        uint32_t before = f->st == U_OPEN    ? (uint32_t)g->texts[nd->first + j].len + 3
                        : f->st == U_KEY     ? (uint32_t)g->texts[nd->first + j].len - f->pos + 2
                        : f->st == U_COLON   ? 1
                                             : 0;
        for (int a = 0; a < u->n_alts; a++)
            if (u->index[j * u->n_alts + a] >= 0) {
                uint32_t c = before + union_value_min(g, u, j, a) + union_after(g, u, j, a);
                if (c < best) best = c;
            }
    }
    return best;
}

/* One byte of a union frame before it commits. */
static enum step union_step(const grammar *g, grammar_frame *f, unsigned char c, int *child);

/* ---- numbers with bounds ----
 * A bounded number is written without an exponent, so the value of what can
 * follow a prefix is known: after the integer part I (k digits) come m more
 * digits and maybe a fraction of d digits, a value of [I·10^m, (I+1)·10^m)
 * on a grid of 10^-d. number_rest finds the fewest bytes that reach [lo, hi]
 * this way; a byte that leaves no way there is refused, so every state the
 * automaton reaches can still end in range. */

/* Whether a value of the given sign whose magnitude (units) lies in [a, b] and
 * is a multiple of step lies in [nd->lo, nd->hi]. A minus sign writes only
 * values below zero (no -0 where nothing negative is allowed). */
static int number_meets(const gnode *nd, int negative, units a, units b, units step) {
    units x = negative ? -b : a, y = negative ? (a ? -a : -1) : b;
    if (nd->multiple) step = nd->multiple; /* a whole multiple of 1, so of every step of the grid too */
    if (x < nd->lo) x = nd->lo;
    if (y > nd->hi) y = nd->hi;
    if (x > y) return 0;
    units first = x / step * step; /* C division truncates: up for x < 0, down for x >= 0 */
    if (first < x) first += step;
    return first <= y;
}

/* The fewest bytes frame f of a bounded number node needs to a value in
 * [lo, hi] (0: it may end now), or UINT32_MAX when none is reachable. */
static uint32_t number_rest(const gnode *nd, const grammar_frame *f) {
    int negative = f->aux, frac_ok = nd->kind == K_NUMBER;
    units I = (units)f->cand;
    switch (f->st) {
    case N_SIGN: { /* the first digit, then as from there */
        uint32_t best = UINT32_MAX;
        for (int d = 0; d <= 9; d++) {
            grammar_frame next = *f;
            next.st = d ? N_INT : N_ZERO;
            next.count = 1;
            next.cand = (uint64_t)d;
            uint32_t r = number_rest(nd, &next);
            if (r != UINT32_MAX && r + 1 < best) best = r + 1;
        }
        return best;
    }
    case N_FRAC: { /* more fraction digits only */
        units step = pow10u(MAX_FRAC_DIGITS - (int)f->count);
        units at = I * UNIT + (units)f->used * step;
        for (uint32_t more = 0; more <= MAX_FRAC_DIGITS - f->count; more++)
            if (number_meets(nd, negative, at, at + step - 1, pow10u(MAX_FRAC_DIGITS - (int)f->count - (int)more)))
                return more;
        return UINT32_MAX;
    }
    case N_ZERO:
    case N_INT:
    case N_DOT: {
        int dot = f->st == N_DOT, max_more = f->st == N_INT ? MAX_INT_DIGITS - (int)f->count : 0;
        /* bytes = m more integer digits + (a fraction of d digits: d, and 1 for the dot unless written) */
        for (int bytes = 0; bytes <= max_more + 1 + MAX_FRAC_DIGITS; bytes++)
            for (int m = 0; m <= max_more && m <= bytes; m++) {
                int d = bytes - m - (dot ? 0 : 1);
                if (bytes == m ? dot : (!frac_ok || d < 1 || d > MAX_FRAC_DIGITS)) continue;
                units scale = pow10u(m), a = I * scale * UNIT, b = (I + 1) * scale * UNIT - 1;
                if (number_meets(nd, negative, a, b, pow10u(MAX_FRAC_DIGITS - (bytes == m ? 0 : d))))
                    return (uint32_t)bytes;
            }
        return UINT32_MAX;
    }
    default: return UINT32_MAX;
    }
}

/* ACCEPT when the number can still end in range, else REJECT. */
static enum step number_checked(const gnode *nd, const grammar_frame *f) {
    return !nd->bounded || number_rest(nd, f) != UINT32_MAX ? ACCEPT : REJECT;
}

/* The number ends at a byte it cannot take: POP when its value is in range. */
static enum step number_pop(const gnode *nd, const grammar_frame *f) {
    return !nd->bounded || number_rest(nd, f) == 0 ? POP : REJECT;
}

/* ---- patterns ---- */

/* The DFA state after decoded byte b, or -1 when no match that can be written follows. */
static int32_t pattern_next(const struct pattern *p, uint32_t state, uint8_t b) {
    int32_t t = regex_next(p->dfa, (int32_t)state, b);
    return t >= 0 && p->dist[t] != UINT32_MAX ? t : -1;
}

static enum step pattern_step(const struct pattern *p, grammar_frame *f, unsigned char c) {
    if (f->st == P_ESC) {
        const char *e = memchr(short_escapes, c, sizeof short_escapes - 1);
        int32_t t = e ? pattern_next(p, f->count, (uint8_t)short_escaped[e - short_escapes]) : -1;
        if (t < 0) return REJECT;
        f->count = (uint32_t)t;
        f->st = P_BODY;
        return ACCEPT;
    }
    if (c == '"') return regex_accepting(p->dfa, (int32_t)f->count) ? (f->st = ST_DONE, ACCEPT) : REJECT;
    if (c == '\\') { /* only when some escape leads on */
        for (size_t i = 0; i < sizeof short_escaped - 1; i++)
            if (pattern_next(p, f->count, (uint8_t)short_escaped[i]) >= 0) return f->st = P_ESC, ACCEPT;
        return REJECT;
    }
    int32_t t = c < 0x20 ? -1 : pattern_next(p, f->count, c);
    if (t < 0) return REJECT;
    f->count = (uint32_t)t;
    return ACCEPT;
}

static uint32_t pattern_rest(const struct pattern *p, const grammar_frame *f) {
    if (f->st == P_BODY) return p->dist[f->count] + 1;
    uint32_t best = UINT32_MAX;
    for (size_t i = 0; i < sizeof short_escaped - 1; i++) {
        int32_t t = pattern_next(p, f->count, (uint8_t)short_escaped[i]);
        if (t >= 0 && p->dist[t] + 2 < best) best = p->dist[t] + 2;
    }
    return best;
}

/* ---- formats ---- */

static int days_in_month(int year, int month) {
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    return month == 2 && leap ? 29 : days[month - 1];
}

/* Whether c may stand at a template position of class k; prev is the digit before it
 * in the same field (-1 at a field's first digit) and f->cand the date's digits so far
 * (year then month, as one number). */
static int format_digit_ok(char k, int prev, const grammar_frame *f, unsigned char c) {
    if (k == 'H') return is_hex(c);
    if (!is_digit(c)) return 0;
    int d = c - '0';
    switch (k) {
    case 'Y': return f->count != 3 || f->cand != 0 || d > 0; /* year 0001 and later */
    case 'M': return prev < 0 ? d <= 1 : prev == 0 ? d >= 1 : d <= 2;
    case 'D': {
        int days = days_in_month((int)(f->cand / 100), (int)(f->cand % 100));
        return prev < 0 ? d * 10 <= days : prev == 0 ? d >= 1 : prev * 10 + d <= days;
    }
    case 'h': return prev < 0 ? d <= 2 : prev < 2 || d <= 3;
    case 'm':
    case 's': return prev >= 0 || d <= 5;
    default: return 0;
    }
}

/* One byte of a format value. */
static enum step format_step(const gnode *nd, grammar_frame *f, unsigned char c) {
    static const char offset[] = "hh:mm\"";
    const char *t = f->st == F_OFFSET ? offset : formats[nd->min].template;
    switch (f->st) {
    case F_TEMPLATE:
    case F_OFFSET: {
        char k = t[f->pos];
        if (strchr("YMDhmsH", k)) {
            int prev = f->pos > 0 && t[f->pos - 1] == k ? f->aux : -1;
            if (!format_digit_ok(k, prev, f, c)) return REJECT;
            if (k == 'Y' || k == 'M') f->cand = f->cand * 10 + (uint64_t)(c - '0'), f->count++;
            f->aux = (uint8_t)(c - '0');
        } else if ((unsigned char)k != c) {
            return REJECT;
        }
        if (t[++f->pos]) return ACCEPT;
        f->st = f->st == F_TEMPLATE && formats[nd->min].time_tail ? F_TAIL : ST_DONE;
        return ACCEPT;
    }
    case F_TAIL: /* after the seconds */
    case F_FRAC:
        if (f->st == F_TAIL && c == '.') return f->st = F_FRAC, f->count = 0, ACCEPT;
        if (f->st == F_FRAC && is_digit(c)) return f->count < FORMAT_FRAC_DIGITS ? (f->count++, ACCEPT) : REJECT;
        if (f->st == F_FRAC && f->count == 0) return REJECT;
        if (c == 'Z') return f->st = F_CLOSE, ACCEPT;
        if (c == '+' || c == '-') return f->st = F_OFFSET, f->pos = 0, ACCEPT;
        return REJECT;
    case F_CLOSE: return c == '"' ? (f->st = ST_DONE, ACCEPT) : REJECT;
    case F_IP: /* four parts of 0-255 without leading zeros: count parts done, aux digits, cand value */
        if (is_digit(c)) {
            uint64_t v = f->cand * 10 + (uint64_t)(c - '0');
            if (f->aux == 3 || (f->aux && f->cand == 0) || v > 255) return REJECT;
            f->cand = v;
            f->aux++;
            return ACCEPT;
        }
        if (!f->aux) return REJECT;
        if (c == '.' && f->count < 3) return f->count++, f->aux = 0, f->cand = 0, ACCEPT;
        if (c == '"' && f->count == 3) return f->st = ST_DONE, ACCEPT;
        return REJECT;
    default: return REJECT;
    }
}

/* Bytes a format value needs to end (every position has a byte that keeps it valid). */
static uint32_t format_rest(const gnode *nd, const grammar_frame *f) {
    const struct format *fm = &formats[nd->min];
    switch (f->st) {
    case F_TEMPLATE: return (uint32_t)(strlen(fm->template) - f->pos) + (fm->time_tail ? 2 : 0);
    case F_TAIL: return 2;
    case F_FRAC: return f->count ? 2 : 3;
    case F_OFFSET: return 6 - f->pos;
    case F_CLOSE: return 1;
    case F_IP: return (f->aux ? 0 : 1) + (3 - f->count) * 2 + 1;
    default: return 0;
    }
}

/* Steps frame f of node nd on c. PUSH: *child is the node of a value that
 * starts with c (the caller pushes it and feeds c to it). */
static enum step step_frame(const grammar *g, grammar_frame *f, unsigned char c, int *child) {
    const gnode *nd = &g->nodes[f->node];
    if (f->st == ST_START) {
        /* a value's first byte: settle which kind of value it is */
        while (nd->kind == K_ANY || nd->kind == K_ANY_OF) {
            int next = -1;
            if (nd->kind == K_ANY) {
                const int kinds[] = {g->any_object, g->any_array, g->any_string, g->any_number, g->any_literal};
                for (int i = 0; i < 5 && next < 0; i++)
                    if (has_start(&g->nodes[kinds[i]], c)) next = kinds[i];
            } else {
                for (int i = 0; i < nd->n && next < 0; i++)
                    if (has_start(&g->nodes[g->alts[nd->first + i]], c)) next = g->alts[nd->first + i];
            }
            if (next < 0) return REJECT;
            f->node = next;
            nd = &g->nodes[next];
        }
        if (!has_start(nd, c)) return REJECT;
        switch (nd->kind) {
        case K_OBJECT: f->st = O_OPEN; f->used = 0; return ACCEPT;
        case K_UNION: f->st = U_OPEN; return ACCEPT;
        case K_ARRAY: f->st = A_OPEN; f->count = 0; return ACCEPT;
        case K_STRING: f->st = S_BODY; f->count = 0; f->aux = 0; return ACCEPT;
        case K_NUMBER:
        case K_INTEGER:
            f->count = c == '-' ? 0 : 1;
            f->st = c == '-' ? N_SIGN : c == '0' ? N_ZERO : N_INT;
            f->aux = c == '-'; /* the value so far: sign, integer part (cand), fraction digits (used) */
            f->cand = is_digit(c) ? (uint64_t)(c - '0') : 0;
            f->used = 0;
            return number_checked(nd, f);
        case K_PATTERN:
            f->st = P_BODY;
            f->count = (uint32_t)regex_start(g->patterns[nd->first].dfa);
            return ACCEPT;
        case K_FORMAT:
            f->pos = 1;
            f->cand = 0;
            f->count = 0;
            f->aux = 0;
            f->st = nd->min == FORMAT_IPV4 ? F_IP : F_TEMPLATE;
            return ACCEPT;
        case K_LITERALS:
        case K_TAGGED:
            f->cand = narrow(g, nd, all_bits(nd->n), 0, c);
            f->pos = 1;
            f->st = nd->kind == K_TAGGED ? T_PREFIX : L_MATCH;
            return f->cand ? ACCEPT : REJECT;
        default: return REJECT;
        }
    }
    int is_int = nd->kind == K_INTEGER;
    switch (f->st) {
    /* ---- object ---- */
    case O_OPEN:
    case O_NEXT:
        if (is_ws(c)) return ACCEPT;
        if (c == '}' && f->st == O_OPEN && object_may_end(g, nd, f->used)) return f->st = ST_DONE, ACCEPT;
        if (c != '"') return REJECT;
        if (nd->n == 0) { /* used counts the entries */
            if (nd->child < 0) return REJECT; /* additionalProperties false: only {} */
            f->st = O_KEY_CHILD;
            f->used++;
            *child = nd->key >= 0 ? nd->key : g->any_string;
            return PUSH;
        }
        f->cand = next_properties(g, nd, f->used);
        if (!f->cand) return REJECT;
        f->pos = 0;
        f->st = O_KEY;
        return ACCEPT;
    case O_KEY: {
        /* a '"' ends the key where a name ends; inside a name (kept escaped, as JSON text) it
           follows an escaping backslash, which no complete name ends with: never both */
        int i = c == '"' ? ended(g, nd, f->cand, f->pos) : -1;
        if (i >= 0) {
            f->used |= 1ull << i;
            f->count = (uint32_t)i;
            f->st = O_COLON;
            return ACCEPT;
        }
        uint64_t cand = narrow(g, nd, f->cand, f->pos, c);
        if (!cand) return REJECT;
        f->cand = cand;
        f->pos++;
        return ACCEPT;
    }
    case O_COLON:
        if (is_ws(c)) return ACCEPT;
        if (c != ':') return REJECT;
        f->st = O_VALUE_WS;
        return ACCEPT;
    case O_VALUE_WS:
        if (is_ws(c)) return ACCEPT;
        f->st = O_VALUE;
        *child = nd->n ? g->texts[nd->first + f->count].node : nd->child;
        return PUSH;
    case O_AFTER:
        if (is_ws(c)) return ACCEPT;
        if (c == '}') return object_may_end(g, nd, f->used) ? (f->st = ST_DONE, ACCEPT) : REJECT;
        if (c != ',') return REJECT;
        if (nd->n ? !next_properties(g, nd, f->used) : nd->max >= 0 && f->used >= (uint64_t)nd->max) return REJECT;
        f->st = O_NEXT;
        return ACCEPT;
    /* ---- array ---- */
    case A_OPEN:
    case A_NEXT:
    case A_LIT:
        if (nd->unique) return unique_step(g, nd, f, c);
        if (is_ws(c)) return ACCEPT;
        if (c == ']' && f->st == A_OPEN && nd->min == 0) return f->st = ST_DONE, ACCEPT;
        if (nd->max >= 0 && f->count >= (uint32_t)nd->max) return REJECT;
        f->st = A_VALUE;
        *child = item_node(g, nd, f->count);
        return PUSH;
    case A_AFTER:
        if (nd->unique) return unique_step(g, nd, f, c);
        if (is_ws(c)) return ACCEPT;
        if (c == ']') return f->count >= (uint32_t)nd->min ? (f->st = ST_DONE, ACCEPT) : REJECT;
        if (c != ',' || (nd->max >= 0 && f->count >= (uint32_t)nd->max)) return REJECT;
        f->st = A_NEXT;
        return ACCEPT;
    /* ---- string ----
     * Only valid UTF-8 and escapes every JSON reader takes: no overlong or
     * surrogate encodings, nothing past U+10FFFF (pos holds a sequence's lead
     * byte until its first continuation byte), and a \\u escape of a high
     * surrogate only as the first half of a pair (cand accumulates the hex
     * digits; used = 1 while the second half is read). */
    case S_BODY: {
        int room = nd->max < 0 || f->count < (uint32_t)nd->max;
        if (f->aux) { /* inside a UTF-8 sequence */
            unsigned lo = 0x80, hi = 0xBF;
            if (f->pos == 0xE0) lo = 0xA0;
            else if (f->pos == 0xED) hi = 0x9F;
            else if (f->pos == 0xF0) lo = 0x90;
            else if (f->pos == 0xF4) hi = 0x8F;
            if (c < lo || c > hi) return REJECT;
            f->pos = 0;
            f->aux--;
            return ACCEPT;
        }
        if (c == '"') return f->count >= (uint32_t)nd->min ? (f->st = ST_DONE, ACCEPT) : REJECT;
        if (c < 0x20 || !room) return REJECT;
        if (c == '\\') return f->st = S_ESC, f->count++, ACCEPT;
        if (c < 0x80) return f->count++, ACCEPT;
        if (c >= 0xC2 && c <= 0xDF) f->aux = 1;
        else if (c >= 0xE0 && c <= 0xEF) f->aux = 2;
        else if (c >= 0xF0 && c <= 0xF4) f->aux = 3;
        else return REJECT;
        f->pos = c;
        f->count++;
        return ACCEPT;
    }
    case S_ESC:
        if (c == 'u') return f->st = S_HEX, f->aux = 4, f->cand = 0, ACCEPT;
        if (!strchr("\"\\/bfnrt", c) || !c) return REJECT;
        f->st = S_BODY;
        return ACCEPT;
    case S_HEX: {
        if (!is_hex(c)) return REJECT;
        uint64_t v = f->cand * 16 + (uint64_t)hex_value(c);
        unsigned left = --f->aux * 4;
        uint64_t first = v << left, last = first + (1u << left) - 1; /* the code units still possible */
        int all_low = first >= 0xDC00 && last <= 0xDFFF, any_low = first <= 0xDFFF && last >= 0xDC00;
        if (f->used ? !any_low : all_low) return REJECT;
        f->cand = v;
        if (f->aux) return ACCEPT;
        if (!f->used && v >= 0xD800 && v <= 0xDBFF) return f->st = S_LOW_BS, ACCEPT;
        f->used = 0;
        f->st = S_BODY;
        return ACCEPT;
    }
    case S_LOW_BS: return c == '\\' ? (f->st = S_LOW_U, ACCEPT) : REJECT;
    case S_LOW_U: return c == 'u' ? (f->st = S_HEX, f->aux = 4, f->cand = 0, f->used = 1, ACCEPT) : REJECT;
    /* ---- number ---- */
    case N_SIGN:
        if (!is_digit(c)) return REJECT;
        f->st = c == '0' ? N_ZERO : N_INT;
        f->count = 1;
        f->cand = (uint64_t)(c - '0');
        return number_checked(nd, f);
    case N_ZERO:
    case N_INT:
        if (f->st == N_INT && is_digit(c)) {
            if (f->count == MAX_INT_DIGITS) return REJECT;
            f->count++;
            f->cand = f->cand * 10 + (uint64_t)(c - '0');
            return number_checked(nd, f);
        }
        if (c == '.' && !is_int) return f->st = N_DOT, number_checked(nd, f);
        if ((c == 'e' || c == 'E') && !is_int && !nd->bounded) return f->st = N_EXP, ACCEPT;
        return number_pop(nd, f);
    case N_DOT:
        if (!is_digit(c)) return REJECT;
        f->st = N_FRAC;
        f->count = 1;
        f->used = (uint64_t)(c - '0');
        return number_checked(nd, f);
    case N_FRAC:
        if (is_digit(c)) {
            if (f->count == MAX_FRAC_DIGITS) return REJECT;
            f->count++;
            f->used = f->used * 10 + (uint64_t)(c - '0');
            return number_checked(nd, f);
        }
        if ((c == 'e' || c == 'E') && !nd->bounded) return f->st = N_EXP, ACCEPT;
        return number_pop(nd, f);
    case N_EXP:
        if (c == '+' || c == '-') return f->st = N_EXP_SIGN, ACCEPT;
        /* fall through */
    case N_EXP_SIGN:
        if (!is_digit(c)) return REJECT;
        f->st = N_EXP_DIG;
        f->count = 1;
        return ACCEPT;
    case N_EXP_DIG:
        if (is_digit(c)) return f->count < MAX_EXP_DIGITS ? (f->count++, ACCEPT) : REJECT;
        return POP;
    /* ---- literals ---- */
    case L_MATCH: {
        uint64_t cand = narrow(g, nd, f->cand, f->pos, c);
        if (cand) {
            f->cand = cand;
            f->pos++;
            return ACCEPT;
        }
        return ended(g, nd, f->cand, f->pos) >= 0 ? POP : REJECT;
    }
    /* ---- tagged ---- */
    case T_PREFIX: {
        int i = ended(g, nd, f->cand, f->pos);
        if (i >= 0) { /* the prefix is written: its value starts with c */
            f->count = (uint32_t)i;
            f->st = T_VALUE;
            *child = g->texts[nd->first + i].node;
            return PUSH;
        }
        uint64_t cand = narrow(g, nd, f->cand, f->pos, c);
        if (!cand) return REJECT;
        f->cand = cand;
        f->pos++;
        return ACCEPT;
    }
    case T_SUFFIX: {
        const gtext *sfx = &g->texts[nd->first + nd->n];
        if (f->pos >= sfx->len || (unsigned char)sfx->s[f->pos] != c) return REJECT;
        if (++f->pos == sfx->len) f->st = ST_DONE;
        return ACCEPT;
    }
    case F_TEMPLATE:
    case F_TAIL:
    case F_FRAC:
    case F_OFFSET:
    case F_CLOSE:
    case F_IP: return format_step(nd, f, c);
    case P_BODY:
    case P_ESC: return pattern_step(&g->patterns[nd->first], f, c);
    case U_OPEN:
    case U_KEY:
    case U_COLON:
    case U_VALUE_WS:
    case U_VALUE: return union_step(g, f, c, child);
    case ST_DONE: return POP;
    default: return REJECT; /* O_KEY_CHILD, O_VALUE, A_VALUE, T_VALUE: a child is open above */
    }
}

static enum step union_step(const grammar *g, grammar_frame *f, unsigned char c, int *child) {
    const gnode *nd = &g->nodes[f->node];
    const struct object_union *u = &g->unions[nd->child];
    gnode values = union_values(u);
    switch (f->st) {
    case U_OPEN:
        if (is_ws(c)) return ACCEPT;
        if (c == '}' && u->empty_ok) return f->st = ST_DONE, ACCEPT;
        if (c != '"') return REJECT;
        f->cand = u->first_names;
        f->pos = 0;
        f->st = U_KEY;
        return ACCEPT;
    case U_KEY: {
        int j = c == '"' ? ended(g, nd, f->cand, f->pos) : -1;
        if (j >= 0) {
            if (union_name_values(g, u, j)) return f->count = (uint32_t)j, f->st = U_COLON, ACCEPT;
            for (int a = 0; a < u->n_alts; a++) /* a name only one object has */
                if (u->index[j * u->n_alts + a] >= 0) return union_commit(g, f, u, j, a, 0), ACCEPT;
            return REJECT;
        }
        uint64_t cand = narrow(g, nd, f->cand, f->pos, c);
        if (!cand) return REJECT;
        f->cand = cand;
        f->pos++;
        return ACCEPT;
    }
    case U_COLON:
        if (is_ws(c)) return ACCEPT;
        return c == ':' ? (f->st = U_VALUE_WS, ACCEPT) : REJECT;
    case U_VALUE_WS:
        if (is_ws(c)) return ACCEPT;
        f->cand = union_name_values(g, u, (int)f->count);
        f->pos = 0;
        f->st = U_VALUE; /* c is the value's first byte */
        /* fall through */
    case U_VALUE: {
        uint64_t cand = narrow(g, &values, f->cand, f->pos, c);
        if (cand) {
            f->cand = cand;
            f->pos++;
            return ACCEPT;
        }
        int l = f->pos ? ended(g, &values, f->cand, f->pos) : -1;
        if (l < 0) return REJECT;
        union_commit(g, f, u, (int)f->count, g->texts[u->first_lit + l].node, 1);
        return step_frame(g, f, c, child); /* c follows the value */
    }
    default: return REJECT;
    }
}

/* The parent's state once its child value ended. */
static void child_ended(const grammar *g, grammar_frame *f) {
    if (f->st == T_VALUE) {
        const gnode *nd = &g->nodes[f->node];
        f->pos = 0;
        f->st = g->texts[nd->first + nd->n].len ? T_SUFFIX : ST_DONE;
    } else if (f->st == O_KEY_CHILD) f->st = O_COLON;
    else if (f->st == O_VALUE) f->st = O_AFTER;
    else if (f->st == A_VALUE) f->st = A_AFTER, f->count++;
}

static int in_text(const grammar_state *s) {
    if (!s->depth) return 0;
    uint8_t st = s->f[s->depth - 1].st;
    /* a string's text, and fixed text matched byte by byte: a property name, a literal, a tag */
    return st == S_BODY || st == S_ESC || st == S_HEX || st == S_LOW_BS || st == S_LOW_U || st == P_BODY ||
           st == P_ESC || st == O_KEY || st == L_MATCH || st == T_PREFIX || st == T_SUFFIX || st == U_KEY ||
           st == U_VALUE || st == A_LIT;
}

static int feed_byte(const grammar *g, grammar_state *s, unsigned char c) {
    int padding = is_ws(c) && !in_text(s); /* whitespace inside a string is text */
    if (padding && s->ws >= MAX_WS) return 0;
    for (;;) {
        if (s->depth == 0) return 0; /* the value ended: nothing may follow */
        grammar_frame *f = &s->f[s->depth - 1];
        int child = -1;
        enum step r = step_frame(g, f, c, &child);
        if (r == REJECT) return 0;
        if (r == ACCEPT) break;
        if (r == POP) {
            if (--s->depth == 0) return 0;
            child_ended(g, &s->f[s->depth - 1]);
            continue;
        }
        if (s->depth == GRAMMAR_MAX_DEPTH) return 0;
        s->f[s->depth++] = (grammar_frame){.node = child, .st = ST_START};
    }
    s->ws = padding ? (uint8_t)(s->ws + 1) : 0;
    return 1;
}

void grammar_start(const grammar *g, grammar_state *st) {
    st->depth = 1;
    st->ws = MAX_WS; /* no whitespace before the value */
    st->f[0] = (grammar_frame){.node = g->root, .st = ST_START};
}

int grammar_feed(const grammar *g, grammar_state *st, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(g, st, (unsigned char)bytes[i])) return 0;
    return 1;
}

int grammar_node_accepts(const grammar *g, int node, const char *text, size_t n) {
    if (node < 0 || node >= g->n_nodes) return 0;
    grammar_state st = {.depth = 1, .ws = MAX_WS, .f[0] = {.node = node, .st = ST_START}};
    return grammar_feed(g, &st, text, n) && grammar_can_end(g, &st);
}

/* Whether frame f could end its value now. */
static int frame_complete(const grammar *g, const grammar_frame *f) {
    const gnode *nd = &g->nodes[f->node];
    switch (f->st) {
    case ST_DONE: return 1;
    case N_ZERO:
    case N_INT:
    case N_FRAC: return !nd->bounded || number_rest(nd, f) == 0;
    case N_EXP_DIG: return 1;
    case L_MATCH: return ended(g, nd, f->cand, f->pos) >= 0;
    default: return 0;
    }
}

int grammar_can_end(const grammar *g, const grammar_state *st) {
    return st->depth == 0 || (st->depth == 1 && frame_complete(g, &st->f[0]));
}

int grammar_must_end(const grammar *g, const grammar_state *st) {
    if (st->depth == 0) return 1;
    if (st->depth > 1) return 0;
    const grammar_frame *f = &st->f[0];
    if (f->st == ST_DONE) return 1;
    const gnode *nd = &g->nodes[f->node];
    if (nd->bounded && frame_complete(g, f)) { /* in range: may another digit or a fraction follow? */
        for (const char *c = "0123456789."; *c; c++) {
            grammar_frame next = *f;
            int child;
            if (step_frame(g, &next, (unsigned char)*c, &child) == ACCEPT) return 0;
        }
        return 1;
    }
    if (f->st != L_MATCH || !frame_complete(g, f)) return 0;
    for (int i = 0; i < nd->n; i++) /* a longer literal could still follow */
        if ((f->cand >> i & 1) && g->texts[nd->first + i].len > f->pos) return 0;
    return 1;
}

/* text: [-]digits[.digits] exactly (no exponent). *v: its value in units,
 * rounded up when up, else down. 1 when |value| < 1e16, 0 when beyond
 * (*negative says which side), -1 when text is no such number. */
static int parse_units(const char *text, int up, units *v, int *negative) {
    const char *p = text;
    *negative = *p == '-';
    p += *negative;
    units mag = 0;
    int int_digits = 0, frac_digits = 0, rest = 0;
    for (; is_digit((unsigned char)*p); p++)
        if (int_digits || *p != '0') {
            if (++int_digits > MAX_INT_DIGITS) return 0;
            mag = mag * 10 + (*p - '0');
        }
    if (p == text + *negative) return -1;
    if (*p == '.') {
        const char *start = ++p;
        for (; is_digit((unsigned char)*p); p++)
            if (frac_digits < MAX_FRAC_DIGITS) mag = mag * 10 + (*p - '0'), frac_digits++;
            else rest |= *p != '0';
        if (p == start) return -1;
    }
    if (*p) return -1;
    mag *= pow10u(MAX_FRAC_DIGITS - frac_digits);
    if (rest && up != *negative) mag++; /* away from zero: up for a positive value, down for a negative one */
    *v = *negative ? -mag : mag;
    return 1;
}

int grammar_number_multiple(grammar *g, int node, int64_t k, char *err, size_t errlen) {
    gnode *nd = node >= 0 && node < g->n_nodes ? &g->nodes[node] : NULL;
    if (!nd || (nd->kind != K_NUMBER && nd->kind != K_INTEGER)) return snprintf(err, errlen, "not a number"), -1;
    if (k < 1) return snprintf(err, errlen, "multipleOf must be a whole number above 0 here"), -1;
    if (k >= 10000000000000000LL) k = 10000000000000000LL; /* beyond 16 digits only 0 is a multiple */
    nd->multiple = (units)k * UNIT;
    return grammar_number_limit(g, node, "-99999999999999999", 0, 0, err, errlen); /* bounded: no exponent */
}

int grammar_number_limit(grammar *g, int node, const char *value, int upper, int exclusive, char *err,
                         size_t errlen) {
    gnode *nd = node >= 0 && node < g->n_nodes ? &g->nodes[node] : NULL;
    if (!nd || (nd->kind != K_NUMBER && nd->kind != K_INTEGER)) return snprintf(err, errlen, "not a number"), -1;
    units v;
    int negative, got = parse_units(value, !upper, &v, &negative);
    if (got < 0) return snprintf(err, errlen, "'%s' is not a decimal number", value), -1;
    if (!got && negative == upper)
        return snprintf(err, errlen, "no number of at most %d integer digits is %s %s", MAX_INT_DIGITS,
                        upper ? "below" : "above", value), -1;
    nd->bounded = 1; /* without an exponent even a limit beyond every number written holds */
    if (got) {
        /* exclusive: the next value of the grid (v was rounded toward the allowed side,
           so a limit between grid points is already excluded) */
        units v_other;
        int neg_other;
        parse_units(value, upper, &v_other, &neg_other);
        if (exclusive && v_other == v) v += upper ? -1 : 1;
        if (nd->kind == K_INTEGER) { /* to whole numbers, toward the allowed side */
            units q = v / UNIT * UNIT;
            if (!upper && q < v) q += UNIT;
            if (upper && q > v) q -= UNIT;
            v = q;
        }
        if (upper && v < nd->hi) nd->hi = v;
        if (!upper && v > nd->lo) nd->lo = v;
    }
    if (nd->lo > nd->hi) return snprintf(err, errlen, "no number lies within the minimum and maximum given"), -1;
    /* the bytes a value may start with, and the shortest value */
    memset(nd->starts, 0, sizeof nd->starts);
    nd->min_len = UINT32_MAX;
    for (const char *c = "-0123456789"; *c; c++) {
        grammar_frame f = {.node = node, .st = *c == '-' ? N_SIGN : *c == '0' ? N_ZERO : N_INT, .count = *c != '-',
                           .aux = *c == '-', .cand = is_digit((unsigned char)*c) ? (uint64_t)(*c - '0') : 0};
        uint32_t rest = number_rest(nd, &f);
        if (rest == UINT32_MAX) continue;
        set_start(nd, (unsigned char)*c);
        if (rest + 1 < nd->min_len) nd->min_len = rest + 1;
    }
    if (nd->min_len == UINT32_MAX) /* limits and multipleOf that no number meets */
        return snprintf(err, errlen, "no number lies within the minimum and maximum given"), -1;
    return 0;
}

/* ---- the shortest way to finish --------------------------------------------------------
 * The bytes a frame still needs to end its value once the frames above it
 * have ended theirs (what a child adds is counted by the child's frame). */

static uint32_t sat_sub(uint32_t a, uint32_t b) { return a > b ? a - b : 0; }
static void copy_state(grammar_state *dst, const grammar_state *src);

static uint32_t frame_cost(const grammar *g, const grammar_frame *f) {
    const gnode *nd = &g->nodes[f->node];
    if (f->st == ST_START) return nd->min_len;
    if (nd->kind == K_ARRAY && nd->unique) return unique_cost(g, nd, f);
    uint32_t item = nd->child >= 0 ? g->nodes[nd->child].min_len : 0, rest, best = UINT32_MAX;
    switch (f->st) {
    case O_OPEN:
    case O_NEXT:
        if (nd->n == 0) return free_object_rest(g, nd, f->st == O_NEXT);
        rest = rest_required(g, nd, f->used, -1);
        if (rest) return rest; /* the first needs no comma, the '}' ends it */
        if (f->st == O_OPEN) return 1;
        for (int i = 0; i < nd->n; i++) /* after a comma some property must follow */
            if (next_properties(g, nd, f->used) >> i & 1) {
                uint32_t c = property_cost(g, nd, i);
                if (c < best) best = c;
            }
        return best;
    case O_KEY:
        for (int i = 0; i < nd->n; i++)
            if (f->cand >> i & 1) {
                const gtext *t = &g->texts[nd->first + i];
                uint32_t c = (uint32_t)t->len - f->pos + 2 + g->nodes[t->node].min_len +
                             rest_required(g, nd, f->used, i) + 1;
                if (c < best) best = c;
            }
        return best;
    case O_KEY_CHILD: return 1 + item + 1;
    case O_COLON:
    case O_VALUE_WS: {
        uint32_t v = nd->n ? g->nodes[g->texts[nd->first + f->count].node].min_len : item;
        return (f->st == O_COLON) + v + rest_required(g, nd, f->used, -1) + 1;
    }
    case O_VALUE:
    case O_AFTER:
        return (nd->n ? rest_required(g, nd, f->used, -1) : 0) + 1;
    case A_OPEN: return nd->min ? items_rest(g, nd, 0) : 1;
    case A_NEXT: return g->nodes[item_node(g, nd, f->count)].min_len + items_rest(g, nd, f->count + 1) + 1;
    case A_VALUE: return items_rest(g, nd, f->count + 1) + 1;
    case A_AFTER: return items_rest(g, nd, f->count) + 1;
    case S_BODY: return sat_sub((uint32_t)nd->min, f->count) + 1 + f->aux;
    case S_ESC: return 1 + sat_sub((uint32_t)nd->min, f->count) + 1;
    case S_HEX: { /* the rest of the escape, and a second half when every completion is a high surrogate */
        unsigned left = f->aux * 4;
        uint64_t first = f->cand << left, last = first + (1u << left) - 1;
        int high = !f->used && first >= 0xD800 && last <= 0xDBFF;
        return f->aux + (high ? 6 : 0) + sat_sub((uint32_t)nd->min, f->count) + 1;
    }
    case S_LOW_BS: return 6 + sat_sub((uint32_t)nd->min, f->count) + 1;
    case S_LOW_U: return 5 + sat_sub((uint32_t)nd->min, f->count) + 1;
    case N_SIGN:
    case N_DOT:
    case N_ZERO:
    case N_INT:
    case N_FRAC:
        if (nd->bounded) return number_rest(nd, f);
        return f->st == N_SIGN || f->st == N_DOT;
    case N_EXP:
    case N_EXP_SIGN: return 1;
    case L_MATCH:
        for (int i = 0; i < nd->n; i++)
            if (f->cand >> i & 1) {
                uint32_t c = (uint32_t)g->texts[nd->first + i].len - f->pos;
                if (c < best) best = c;
            }
        return best;
    case T_PREFIX:
        for (int i = 0; i < nd->n; i++)
            if (f->cand >> i & 1) {
                const gtext *t = &g->texts[nd->first + i];
                uint32_t c = (uint32_t)t->len - f->pos + g->nodes[t->node].min_len;
                if (c < best) best = c;
            }
        return best + (uint32_t)g->texts[nd->first + nd->n].len;
    case T_VALUE: return (uint32_t)g->texts[nd->first + nd->n].len;
    case T_SUFFIX: return (uint32_t)g->texts[nd->first + nd->n].len - f->pos;
    case F_TEMPLATE:
    case F_TAIL:
    case F_FRAC:
    case F_OFFSET:
    case F_CLOSE:
    case F_IP: return format_rest(nd, f);
    case P_BODY:
    case P_ESC: return pattern_rest(&g->patterns[nd->first], f);
    case U_OPEN:
    case U_KEY:
    case U_COLON:
    case U_VALUE_WS:
    case U_VALUE: return union_cost(g, f);
    default: return 0;
    }
}

uint32_t grammar_cost(const grammar *g, const grammar_state *st) {
    uint64_t sum = 0;
    for (int i = 0; i < st->depth; i++) sum += frame_cost(g, &st->f[i]);
    return sum > UINT32_MAX ? UINT32_MAX : (uint32_t)sum;
}

/* One byte at a time, each a byte after which the cost falls by one (the
 * cost is exact, so one always exists until the value can end); bytes that
 * read well in JSON are tried first. */
int64_t grammar_shortest_completion(const grammar *g, const grammar_state *st, char *out, size_t cap) {
    static const char preferred[] = "\"}],:0 ";
    grammar_state cur;
    copy_state(&cur, st);
    size_t n = 0;
    if (grammar_cost(g, &cur) > cap) return -1;
    for (uint32_t cost = grammar_cost(g, &cur); cost > 0 || !grammar_can_end(g, &cur); cost--) {
        if (cost == 0 || n >= cap) return -1;
        int found = 0;
        for (int i = 0; i < (int)sizeof preferred - 1 + 256 && !found; i++) {
            unsigned char b = i < (int)sizeof preferred - 1 ? (unsigned char)preferred[i]
                                                          : (unsigned char)(i - (int)sizeof preferred + 1);
            grammar_state next;
            copy_state(&next, &cur);
            if (feed_byte(g, &next, b) && grammar_cost(g, &next) == cost - 1) {
                copy_state(&cur, &next);
                out[n++] = (char)b;
                found = 1;
            }
        }
        if (!found) return -1;
    }
    return (int64_t)n;
}

/* ---- the vocabulary trie --------------------------------------------------------------- */

typedef struct trie_node {
    int32_t first_child, next_sibling;
    int32_t first_token; /* tokens whose piece ends here, chained by next_token */
    uint8_t byte;
} trie_node;

struct vocab_trie {
    trie_node *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *next_token;
    char *bytes;
    uint32_t *off;
    int32_t n_vocab;
    int32_t max_len;
};

static int32_t trie_child(vocab_trie *t, int32_t parent, uint8_t b) {
    for (int32_t c = t->nodes[parent].first_child; c >= 0; c = t->nodes[c].next_sibling)
        if (t->nodes[c].byte == b) return c;
    if (t->n_nodes == t->cap_nodes) {
        int32_t cap = t->cap_nodes * 2;
        trie_node *v = realloc(t->nodes, (size_t)cap * sizeof *v);
        if (!v) return -1;
        t->nodes = v;
        t->cap_nodes = cap;
    }
    int32_t id = t->n_nodes++;
    t->nodes[id] = (trie_node){.first_child = -1, .next_sibling = t->nodes[parent].first_child,
                               .first_token = -1, .byte = b};
    t->nodes[parent].first_child = id;
    return id;
}

vocab_trie *vocab_trie_new(const char *bytes, const uint32_t *off, int32_t n_vocab) {
    vocab_trie *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->n_vocab = n_vocab;
    t->cap_nodes = 1024;
    t->nodes = malloc((size_t)t->cap_nodes * sizeof *t->nodes);
    t->next_token = malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof *t->next_token);
    t->off = malloc(((size_t)n_vocab + 1) * sizeof *t->off);
    t->bytes = malloc(off[n_vocab] ? off[n_vocab] : 1);
    if (!t->nodes || !t->next_token || !t->off || !t->bytes) goto fail;
    memcpy(t->off, off, ((size_t)n_vocab + 1) * sizeof *t->off);
    memcpy(t->bytes, bytes, off[n_vocab]);
    t->nodes[0] = (trie_node){.first_child = -1, .next_sibling = -1, .first_token = -1};
    t->n_nodes = 1;
    for (int32_t id = 0; id < n_vocab; id++) {
        t->next_token[id] = -1;
        uint32_t len = off[id + 1] - off[id];
        if (!len) continue;
        if ((int32_t)len > t->max_len) t->max_len = (int32_t)len;
        int32_t node = 0;
        for (uint32_t i = 0; i < len && node >= 0; i++) node = trie_child(t, node, (uint8_t)bytes[off[id] + i]);
        if (node < 0) goto fail;
        t->next_token[id] = t->nodes[node].first_token;
        t->nodes[node].first_token = id;
    }
    return t;
fail:
    vocab_trie_free(t);
    return NULL;
}

void vocab_trie_free(vocab_trie *t) {
    if (!t) return;
    free(t->nodes);
    free(t->next_token);
    free(t->off);
    free(t->bytes);
    free(t);
}

const char *vocab_trie_piece(const vocab_trie *t, int32_t id, size_t *n) {
    if (id < 0 || id >= t->n_vocab) return *n = 0, "";
    *n = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

int64_t vocab_trie_split(const vocab_trie *t, const char *bytes, size_t n, int32_t *ids, int64_t cap) {
    int64_t k = 0;
    for (size_t at = 0; at < n;) {
        int32_t node = 0, best = -1;
        size_t best_len = 0;
        for (size_t i = at; i < n; i++) {
            int32_t c = t->nodes[node].first_child;
            while (c >= 0 && t->nodes[c].byte != (uint8_t)bytes[i]) c = t->nodes[c].next_sibling;
            if (c < 0) break;
            node = c;
            if (t->nodes[node].first_token >= 0) best = t->nodes[node].first_token, best_len = i + 1 - at;
        }
        if (best < 0 || k >= cap) return -1;
        ids[k++] = best;
        at += best_len;
    }
    return k;
}

/* Copies the live part of a state (the frames in use). */
static void copy_state(grammar_state *dst, const grammar_state *src) {
    dst->depth = src->depth;
    dst->ws = src->ws;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof *src->f);
}

typedef struct walk_ctx {
    const grammar *g;
    const vocab_trie *t;
    uint8_t *allowed;
    uint32_t budget;       /* most bytes the state after a token may still need */
    int64_t n_allowed;
    grammar_state *states; /* one per depth of the trie */
} walk_ctx;

static void walk(walk_ctx *w, int32_t node, int depth) {
    const trie_node *nodes = w->t->nodes;
    for (int32_t c = nodes[node].first_child; c >= 0; c = nodes[c].next_sibling) {
        grammar_state *st = &w->states[depth + 1];
        copy_state(st, &w->states[depth]);
        /* the copy grows to the frames a byte may push */
        if (!feed_byte(w->g, st, nodes[c].byte)) continue;
        if (nodes[c].first_token >= 0 && (w->budget == UINT32_MAX || grammar_cost(w->g, st) <= w->budget))
            for (int32_t tok = nodes[c].first_token; tok >= 0; tok = w->t->next_token[tok]) {
                w->allowed[tok] = 1;
                w->n_allowed++;
            }
        if (nodes[c].first_child >= 0) walk(w, c, depth + 1);
    }
}

int64_t grammar_mask(const grammar *g, const grammar_state *st, const vocab_trie *t, uint32_t budget,
                     uint8_t *allowed) {
    memset(allowed, 0, (size_t)t->n_vocab);
    grammar_state *states = malloc(((size_t)t->max_len + 1) * sizeof *states);
    if (!states) return 0; /* nothing allowed: the caller fails the sequence */
    copy_state(&states[0], st);
    walk_ctx w = {.g = g, .t = t, .allowed = allowed, .budget = budget, .states = states};
    walk(&w, 0, 0);
    free(states);
    return w.n_allowed;
}
