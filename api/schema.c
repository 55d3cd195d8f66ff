/* JSON Schema -> grammar (engine/grammar.h) for response_format and tool
 * arguments. The subset: type (one or a list), properties, required,
 * additionalProperties, patternProperties, propertyNames, minProperties/
 * maxProperties, enum, const, items, prefixItems, minItems/maxItems,
 * uniqueItems (of an enum's values), minLength/maxLength, minimum/maximum/exclusiveMinimum/exclusiveMaximum and
 * a whole multipleOf (numbers then have no exponent), format (each JSON
 * Schema defines, engine/grammar.h; others are annotations), pattern
 * (engine/regex.h), allOf (merged as anyOf's siblings are), anyOf (overlapping
 * alternatives joined, or dropped where another covers them) and oneOf
 * (objects told apart by what fails the others), $ref to any "#/..." pointer
 * (with $defs/definitions; constraints beside it merged with its target as
 * allOf's are; a recursion unrolled MAX_UNROLL levels), not ({} and
 * {"required": [...]}: not_form), and the annotations (title, description, default, examples,
 * $schema, $id, $comment). JSON Schema's other constraining keywords are a 400
 * naming them: a constraint silently dropped would let the output break the
 * schema. Keywords JSON Schema does not define (markdownDescription, x-...) are
 * annotations, as validators treat them. A constraint beside enum or const
 * that they would not honour is a 400 too, and anyOf/oneOf's siblings are
 * merged into each alternative.
 *
 * What is generated is a subset of what the schema allows, always valid:
 * an object with properties gets only those properties (whatever
 * additionalProperties says), in any order. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

/* A recursive $ref is written MAX_UNROLL levels deep (and while the schema's nesting
 * and MAX_UNROLLED_SCHEMAS compiled in all allow), then cut: at the cut no value can
 * be written (NEVER), so an optional property, an array's further items or an anyOf
 * alternative there is left out, and a value that needs one is NEVER itself. */
enum { MAX_REFS = 128, MAX_SCHEMA_DEPTH = 24, MAX_UNROLL = 3, MAX_UNROLLED_SCHEMAS = 4000, NEVER = -3 };

typedef struct ref_entry {
    const char *ref;
    int node;     /* -2 while being compiled */
    int unrolled; /* its target's copies being compiled inside itself (a recursion) */
} ref_entry;

typedef struct compiler {
    grammar *g;
    json_t *root;
    const char *param;
    api_error *e;
    ref_entry refs[MAX_REFS];
    int n_refs;
    int depth;
    json_t *made; /* the schemas merge_parent built: refs[].ref points into them */
    const char *merging[MAX_SCHEMA_DEPTH]; /* the $refs whose targets are being compiled merged with siblings */
    int n_merging;
    int unrolling;     /* recursions being unrolled */
    long n_compiled;   /* schemas compiled while unrolling */
} compiler;

static int compile(compiler *c, json_t *s, const char *where);

static int fail(compiler *c, const char *fmt, const char *a, const char *b) {
    char msg[300];
    snprintf(msg, sizeof msg, fmt, a, b);
    return api_fail(c->e, 400, "invalid_value", c->param, "%s", msg);
}

static int grammar_fail(compiler *c, const char *where, const char *err) {
    return fail(c, "%s: %s", where, err);
}

/* A JSON text of v as the literal the output must spell (compact). */
static char *literal_text(json_t *v) { return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY); }

/* The keywords compiled here: each constrains the value. */
static const char *const compiled_keywords[] = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items", "prefixItems",
    "minItems", "maxItems", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "format", "pattern", "allOf", "anyOf", "oneOf", "$ref", "patternProperties",
    "propertyNames", "minProperties", "maxProperties", "uniqueItems", "not", NULL};

/* JSON Schema's other keywords that constrain a value (drafts 4 to 2020-12): a 400, since
 * an output that ignored one could break the schema. */
static const char *const refused_keywords[] = {
    "if", "then", "else", "contains", "minContains", "maxContains", "dependentRequired", "dependentSchemas",
    "dependencies", "unevaluatedProperties", "unevaluatedItems", "additionalItems", "$dynamicRef",
    "$recursiveRef", NULL};

static int listed(const char *const *list, const char *key) {
    for (const char *const *k = list; *k; k++)
        if (!strcmp(*k, key)) return 1;
    return 0;
}

static int check_keywords(compiler *c, json_t *s, const char *where) {
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        if (listed(refused_keywords, key))
            return fail(c, "%s: the JSON Schema keyword '%s' is not supported", where, key);
    }
    return 0;
}

/* Keywords that describe a schema or hold definitions (title, $defs, ...) and those JSON
 * Schema does not define (markdownDescription, x-...), which validators ignore: beside
 * others they constrain nothing. */
static int is_annotation(const char *key) {
    return !listed(compiled_keywords, key) && !listed(refused_keywords, key);
}

/* The first keyword of s that constrains its value, other than those in
 * allowed (NULL-terminated); NULL when there is none. */
static const char *other_constraint(json_t *s, const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        int ok = is_annotation(key);
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, key);
        if (!ok) return key;
    }
    return NULL;
}

static int get_count(compiler *c, json_t *s, const char *key, int32_t def, int32_t *out, const char *where) {
    json_t *v = json_object_get(s, key);
    *out = def;
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
        return fail(c, "%s: %s must be an integer in [0, 1000000]", where, key);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

static int hex_digit(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* Resolves a "#/..." JSON pointer against the root schema. */
static json_t *resolve(compiler *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    json_t *at = c->root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            int hi, lo; /* a URI fragment's %XX (RFC 6901 section 6), then the pointer's ~1 and ~0 */
            if (p[0] == '%' && (hi = hex_digit(p[1])) >= 0 && (lo = hex_digit(p[2])) >= 0)
                tok[n++] = (char)(hi * 16 + lo), p += 3;
            else if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        if (json_is_object(at)) at = json_object_get(at, tok);
        else if (json_is_array(at)) at = json_array_get(at, (size_t)strtoul(tok, NULL, 10));
        else at = NULL;
    }
    return *p ? NULL : at;
}

/* Whether ref's target is being compiled merged with the constraints beside a $ref. */
static int merging(const compiler *c, const char *ref) {
    for (int i = 0; i < c->n_merging; i++)
        if (!strcmp(c->merging[i], ref)) return 1;
    return 0;
}

static int compile_ref(compiler *c, const char *ref) {
    if (merging(c, ref)) return fail(c, "$ref '%s' is recursive, which is not supported%s", ref, "");
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) {
            if (c->refs[i].node != -2) return c->refs[i].node;
            /* a recursion: its target again, a copy nested in the one being compiled */
            if (c->refs[i].unrolled >= MAX_UNROLL || c->n_compiled > MAX_UNROLLED_SCHEMAS) return NEVER;
            c->refs[i].unrolled++, c->unrolling++;
            int node = compile(c, resolve(c, ref), ref);
            c->refs[i].unrolled--, c->unrolling--;
            return node;
        }
    json_t *target = resolve(c, ref);
    if (!target) return fail(c, "$ref '%s' does not point into this schema%s", ref, "");
    if (c->n_refs == MAX_REFS) return fail(c, "too many $ref targets%s%s", "", "");
    int slot = c->n_refs++;
    c->refs[slot] = (ref_entry){ref, -2, 0};
    int node = compile(c, target, ref);
    c->refs[slot].node = node;
    return node;
}

static int value_is_type(json_t *v, const char *type) {
    return (!strcmp(type, "string") && json_is_string(v)) || (!strcmp(type, "integer") && json_is_integer(v)) ||
           (!strcmp(type, "number") && json_is_number(v)) || (!strcmp(type, "boolean") && json_is_boolean(v)) ||
           (!strcmp(type, "null") && json_is_null(v)) || (!strcmp(type, "object") && json_is_object(v)) ||
           (!strcmp(type, "array") && json_is_array(v));
}

/* Whether v is of type (a name or a list of names; NULL: any). */
static int value_fits(json_t *v, json_t *type) {
    if (!type) return 1;
    if (json_is_string(type)) return value_is_type(v, json_string_value(type));
    for (size_t i = 0; i < json_array_size(type); i++)
        if (json_is_string(json_array_get(type, i)) && value_is_type(v, json_string_value(json_array_get(type, i))))
            return 1;
    return 0;
}

/* The values of an enum (or a const) as literals; with a type beside them, only those of that type. */
static int compile_literals(compiler *c, json_t *values, json_t *type, const char *where) {
    size_t n = json_array_size(values);
    char **texts = calloc(n ? n : 1, sizeof *texts);
    if (!texts) return api_fail(c->e, 500, NULL, NULL, "out of memory");
    size_t m = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *v = json_array_get(values, i);
        if (!value_fits(v, type)) continue;
        texts[m] = literal_text(v);
        if (!texts[m]) rc = api_fail(c->e, 500, NULL, NULL, "out of memory");
        else m++;
    }
    char err[200];
    int node = rc ? -1 : grammar_literals(c->g, (const char *const *)texts, m, err, sizeof err);
    if (!rc && node < 0) grammar_fail(c, where, m ? err : "no value of enum or const is of the schema's type");
    for (size_t i = 0; i < m; i++) free(texts[i]);
    free(texts);
    return node;
}

/* A property name as the output spells it: JSON-escaped, without its quotes (malloc'd). */
static char *property_text(const char *key) {
    json_t *js = json_string(key);
    char *quoted = js ? literal_text(js) : NULL;
    json_decref(js);
    if (!quoted) return NULL;
    size_t len = strlen(quoted);
    memmove(quoted, quoted + 1, len - 2);
    quoted[len - 2] = 0;
    return quoted;
}

/* What `not` asks of schema s: 0 nothing (none, or `not: false`); 1 no value at all
 * (`not: {}`, which every value meets, or `not: true`: a property that must be
 * absent); 2 an object without all of the names *names lists (`not: {"required":
 * [...]}`); 3 a string the pattern of *names (its `not`) does not match, or that is
 * none of its enum or const (`not: {"pattern": ...}`, `not: {"enum": [...]}`, or
 * `not: {"anyOf": [...]}` of them: string_taken); as
 * their complements hold every value of other types too, what is written is a
 * string: a part of what they allow); -1 after a 400 for any other form (a complement
 * no automaton here holds). */
/* 1 when schema f holds only strings of a pattern, or only given values (among what
 * a string meets): {"pattern": ...}, {"enum": [...]}, {"const": ...}, with "type": "string" or none. */
static int string_taken(json_t *f) {
    static const char *const forms[] = {"pattern", "enum", "const", "type", NULL};
    json_t *pattern = json_object_get(f, "pattern"), *en = json_object_get(f, "enum"), *type = json_object_get(f, "type");
    return json_is_object(f) && !other_constraint(f, forms) && (pattern || en || json_object_get(f, "const")) &&
           (!pattern || json_is_string(pattern)) && (!en || (json_is_array(en) && json_array_size(en))) &&
           (!type || (json_is_string(type) && !strcmp(json_string_value(type), "string")));
}

static int not_form(compiler *c, json_t *s, const char *where, json_t **names) {
    static const char *const nothing[] = {NULL}, *const only_required[] = {"required", NULL};
    json_t *no = json_object_get(s, "not"), *req = json_is_object(no) ? json_object_get(no, "required") : NULL;
    *names = NULL;
    if (!no || json_is_false(no)) return 0;
    if (json_is_true(no) || (json_is_object(no) && !other_constraint(no, nothing))) return 1;
    int strings = json_is_array(req) && json_array_size(req) > 0;
    for (size_t i = 0; strings && i < json_array_size(req); i++) strings = json_is_string(json_array_get(req, i));
    if (strings && !other_constraint(no, only_required)) return *names = req, 2;
    json_t *alts = json_object_get(no, "anyOf");
    int taken = json_is_object(no) && (alts ? json_is_array(alts) && json_array_size(alts) &&
                                                  json_array_size(alts) <= 64 && json_object_size(no) == 1
                                            : string_taken(no));
    for (size_t i = 0; taken && alts && i < json_array_size(alts); i++) taken = string_taken(json_array_get(alts, i));
    if (taken) return *names = no, 3;
    return fail(c, "%s: 'not' is supported as {} (no value: the property is absent), as {\"required\": [...]} and "
                   "as a string's {\"pattern\": ...}, {\"enum\": [...]} or {\"const\": ...}%s", where, "");
}

static int listed_in(json_t *names, const char *key) {
    for (size_t i = 0; i < json_array_size(names); i++)
        if (!strcmp(json_string_value(json_array_get(names, i)), key)) return 1;
    return 0;
}

/* Whether property name `key` is a whole value of string node `node` (a pattern
 * matches it, propertyNames takes it). */
static int name_fits(compiler *c, int node, const char *key) {
    json_t *js = json_string(key);
    char *quoted = js ? literal_text(js) : NULL;
    int fits = quoted && grammar_node_accepts(c->g, node, quoted, strlen(quoted));
    json_decref(js);
    free(quoted);
    return fits;
}

/* The schema property `key` must meet: its own (from properties; NULL: none there) with
 * every patternProperties schema whose pattern matches it, or, matching none and not
 * listed, additionalProperties' (`extra`; NULL: any value). patterns[i] is the node of
 * the i-th pattern. A new allOf schema (kept in c->made) when several hold; NULL after
 * a 400. */
static json_t *property_schema(compiler *c, json_t *own, json_t *pattern_props, const int *patterns, json_t *extra,
                               const char *key) {
    json_t *all = json_array();
    if (!all || json_array_append_new(c->made, all)) return api_fail(c->e, 500, NULL, NULL, "out of memory"), NULL;
    if (own && json_array_append(all, own)) return api_fail(c->e, 500, NULL, NULL, "out of memory"), NULL;
    const char *pattern;
    json_t *ps;
    size_t i = 0;
    json_object_foreach(pattern_props, pattern, ps) {
        if (name_fits(c, patterns[i++], key) && json_array_append(all, ps))
            return api_fail(c->e, 500, NULL, NULL, "out of memory"), NULL;
    }
    if (!json_array_size(all)) return extra ? extra : json_true();
    if (json_array_size(all) == 1) return json_array_get(all, 0);
    json_t *both = json_pack("{s:O}", "allOf", all);
    if (!both || json_array_append_new(c->made, both)) return api_fail(c->e, 500, NULL, NULL, "out of memory"), NULL;
    return both;
}

static int compile_object(compiler *c, json_t *s, const char *where) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *extra = json_object_get(s, "additionalProperties"), *pattern_props = json_object_get(s, "patternProperties");
    json_t *names_schema = json_object_get(s, "propertyNames");
    int32_t min_props, max_props;
    if (props && !json_is_object(props)) return fail(c, "%s: properties must be an object%s", where, "");
    if (req && !json_is_array(req)) return fail(c, "%s: required must be an array%s", where, "");
    if (extra && !json_is_boolean(extra) && !json_is_object(extra))
        return fail(c, "%s: additionalProperties must be a boolean or a schema%s", where, "");
    if (pattern_props && (!json_is_object(pattern_props) || json_object_size(pattern_props) > 16))
        return fail(c, "%s: patternProperties must be an object of at most %s patterns", where, "16");
    if (get_count(c, s, "minProperties", 0, &min_props, where) || get_count(c, s, "maxProperties", -1, &max_props, where))
        return -1;
    /* not: {"required": [...]}: those that are not required are left out; all required: no object */
    json_t *forbidden;
    if (not_form(c, s, where, &forbidden) == 2) {
        int all_required = 1;
        for (size_t i = 0; i < json_array_size(forbidden); i++)
            all_required &= listed_in(req, json_string_value(json_array_get(forbidden, i)));
        if (all_required) return NEVER;
        if (!props) return fail(c, "%s: 'not' with required needs the properties listed%s", where, "");
    }
    char err[200];
    /* the patterns of patternProperties, and propertyNames, as nodes that names are checked
       against (or, in an object without listed properties, its keys are written as) */
    int patterns[16], names = -1;
    const char *key;
    json_t *v;
    size_t n_patterns = 0;
    if (pattern_props) json_object_foreach(pattern_props, key, v) {
        if ((patterns[n_patterns++] = grammar_pattern(c->g, key, 0, -1, err, sizeof err)) < 0)
            return fail(c, "%s: patternProperties: %s", where, err);
    }
    if (names_schema && (names = compile(c, names_schema, where)) < 0)
        return names == NEVER ? fail(c, "%s: propertyNames: a recursion that never ends%s", where, "") : -1;
    /* the properties generated: those listed, then the required ones not listed (their
       values as patternProperties or additionalProperties say); a listed one whose name
       propertyNames refuses is left out */
    const char *keys[GRAMMAR_MAX_PROPS];
    json_t *schemas[GRAMMAR_MAX_PROPS];
    size_t n = 0;
    if (props) json_object_foreach(props, key, v) {
        if (names >= 0 && !name_fits(c, names, key)) continue;
        if (forbidden && listed_in(forbidden, key) && !listed_in(req, key)) continue;
        if (n == GRAMMAR_MAX_PROPS) return fail(c, "%s: more properties than the %s supported", where, "64");
        keys[n] = key;
        if (!(schemas[n++] = property_schema(c, v, pattern_props, patterns, NULL, key))) return -1;
    }
    for (size_t k = 0; req && k < json_array_size(req); k++) {
        json_t *name = json_array_get(req, k);
        if (!json_is_string(name)) return fail(c, "%s: required must list strings%s", where, "");
        const char *rn = json_string_value(name);
        int listed = 0;
        for (size_t i = 0; i < n && !listed; i++) listed = !strcmp(keys[i], rn);
        if (listed) continue;
        if (names >= 0 && !name_fits(c, names, rn))
            return fail(c, "%s: required property '%s' is not a name propertyNames allows", where, rn);
        json_t *ps = property_schema(c, NULL, pattern_props, patterns, extra, rn);
        if (!ps) return -1;
        if (json_is_false(ps))
            return fail(c, "%s: required property '%s' is not in properties, and additionalProperties is false", where,
                        rn);
        if (n == GRAMMAR_MAX_PROPS) return fail(c, "%s: more properties than the %s supported", where, "64");
        keys[n] = rn;
        schemas[n++] = ps;
    }
    int node = -1;
    if (n == 0) {
        /* no property listed: any keys (of the one pattern, or as propertyNames says), each
           value of that pattern's schema or of additionalProperties */
        int values, key_node = names;
        if (props && json_object_size(props)) values = -1; /* every listed name refused: only {} */
        else if (n_patterns > 1)
            return fail(c, "%s: patternProperties with more than one pattern needs the properties listed%s", where, "");
        else if (n_patterns == 1 && names >= 0)
            return fail(c, "%s: patternProperties beside propertyNames needs the properties listed%s", where, "");
        else if (n_patterns == 1) {
            json_t *ps = json_object_iter_value(json_object_iter(pattern_props));
            key_node = patterns[0];
            if ((values = json_is_false(ps) ? -1 : compile(c, ps, where)) == -1 && !json_is_false(ps)) return -1;
        } else if (!extra || json_is_true(extra)) values = grammar_any(c->g);
        else if (json_is_false(extra)) values = -1;
        else if ((values = compile(c, extra, where)) == -1) return -1;
        if (values == NEVER) values = -1; /* a recursion cut there: no property */
        node = grammar_object(c->g, NULL, NULL, NULL, 0, values, err, sizeof err);
        if (node >= 0 && grammar_object_limits(c->g, node, min_props, max_props, values >= 0 ? key_node : -1, err,
                                               sizeof err))
            node = -1;
        return node < 0 ? grammar_fail(c, where, err) : node;
    }
    char *prop_names[GRAMMAR_MAX_PROPS];
    int nodes[GRAMMAR_MAX_PROPS], required[GRAMMAR_MAX_PROPS], rc = 0;
    size_t i = 0, kept = 0; /* a property whose value a recursion cut is left out, or cuts the object */
    for (; i < n && !rc; i++) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s.properties.%s", where, keys[i]);
        required[kept] = 0;
        for (size_t k = 0; req && k < json_array_size(req); k++)
            required[kept] |= !strcmp(json_string_value(json_array_get(req, k)), keys[i]);
        if ((nodes[kept] = compile(c, schemas[i], sub)) == NEVER) {
            if (required[kept]) rc = NEVER;
            continue;
        }
        if (nodes[kept] < 0) rc = -1;
        else if (!(prop_names[kept++] = property_text(keys[i]))) rc = api_fail(c->e, 500, NULL, NULL, "out of memory");
    }
    if (!rc) {
        /* with every property cut (kept 0), only {} */
        node = grammar_object(c->g, (const char *const *)prop_names, nodes, required, kept, -1, err, sizeof err);
        if (node >= 0 && grammar_object_limits(c->g, node, min_props, max_props, -1, err, sizeof err)) node = -1;
        if (node < 0) grammar_fail(c, where, err);
    }
    for (size_t k = 0; k < kept; k++) free(prop_names[k]);
    return rc == NEVER ? NEVER : node;
}

/* multipleOf, minimum, maximum, exclusiveMinimum, exclusiveMaximum on number node `node`. */
static int compile_limits(compiler *c, json_t *s, int node, int integer, const char *where) {
    json_t *multiple = json_object_get(s, "multipleOf");
    if (multiple) {
        /* whole numbers only: validators divide by a fractional multipleOf in floating point
           (Python's jsonschema finds 0.3 no multiple of 0.1) */
        char err[200];
        if (!json_is_integer(multiple) || json_integer_value(multiple) < 1)
            return fail(c, "%s: multipleOf must be a whole number above 0 (a fraction is not supported)%s", where, "");
        if (grammar_number_multiple(c->g, node, json_integer_value(multiple), err, sizeof err))
            return fail(c, "%s: %s", where, err);
    }
    static const char *const keys[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        json_t *v = json_object_get(s, keys[k]);
        if (!v) continue;
        if (!json_is_number(v))
            return fail(c, "%s: %s must be a number (the boolean form of draft 4 is not supported)", where, keys[k]);
        int upper = k & 1, exclusive = k >= 2;
        char text[1600]; /* a double's exact decimal expansion: up to 309 integer and 1,074 fraction digits */
        if (exclusive && !integer) {
            /* A fraction written to 16 digits is read back by most JSON readers as the nearest
               double: that keeps <= and >= against a double, but 9.9999999999999999 reads as 10.0,
               onto an exclusive limit of 10. So a number's exclusive limit is the next double
               inside it, inclusive. */
            double d = nextafter(json_number_value(v), upper ? -INFINITY : INFINITY);
            snprintf(text, sizeof text, "%.1100f", d);
            exclusive = 0;
        } else if (json_is_integer(v)) {
            snprintf(text, sizeof text, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        } else {
            snprintf(text, sizeof text, "%.1100f", json_real_value(v));
        }
        char err[200];
        if (grammar_number_limit(c->g, node, text, upper, exclusive, err, sizeof err))
            return fail(c, "%s: %s", where, err);
    }
    return node;
}

/* A string of lo to hi characters that pattern matches (NULL: any) and that `no`,
 * a string form of `not` (not_form 3), does not take. */
static int compile_string_except(compiler *c, json_t *pattern, json_t *no, int32_t lo, int32_t hi, const char *where) {
    json_t *alts = json_object_get(no, "anyOf"), *one = json_pack("[O]", no);
    json_t *forms = alts ? alts : one, *taken = json_array(), *f;
    const char *patterns[64];
    size_t n_patterns = 0, i;
    int oom = !one || !taken || json_array_size(forms) > 64;
    json_array_foreach(forms, i, f) {
        json_t *p = json_object_get(f, "pattern"), *en = json_object_get(f, "enum"), *cst = json_object_get(f, "const");
        if (p && n_patterns < 64) patterns[n_patterns++] = json_string_value(p);
        if ((en && json_array_extend(taken, en)) || (cst && json_array_append(taken, cst))) oom = 1;
    }
    size_t n = json_array_size(taken);
    char **texts = calloc(n ? n : 1, sizeof *texts), err[200];
    int node = -1;
    oom |= !texts;
    for (i = 0; !oom && i < n; i++) oom = !(texts[i] = literal_text(json_array_get(taken, i)));
    if (oom) {
        api_fail(c->e, 500, NULL, NULL, "out of memory");
    } else {
        node = grammar_pattern_except(c->g, pattern ? json_string_value(pattern) : NULL, patterns, n_patterns,
                                      (const char *const *)texts, n, lo, hi, err, sizeof err);
        if (node < 0) fail(c, "%s: pattern and 'not': %s", where, err);
    }
    json_decref(one);
    for (size_t i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
    json_decref(taken);
    return node;
}

static int compile_type(compiler *c, json_t *s, const char *type, const char *where) {
    char err[200];
    int node;
    if (!type) return grammar_any(c->g);
    if (!strcmp(type, "object")) return compile_object(c, s, where);
    if (!strcmp(type, "array")) {
        json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
        int32_t lo, hi;
        if (get_count(c, s, "minItems", 0, &lo, where) || get_count(c, s, "maxItems", -1, &hi, where)) return -1;
        if (items && !json_is_object(items) && !json_is_boolean(items))
            return fail(c, "%s: items must be a schema%s", where, "");
        if (prefix && (!json_is_array(prefix) || json_array_size(prefix) > GRAMMAR_MAX_PROPS))
            return fail(c, "%s: prefixItems must be a list of at most %s schemas", where, "64");
        size_t n_prefix = json_array_size(prefix);
        if (json_is_false(items) && (hi < 0 || hi > (int32_t)n_prefix)) hi = (int32_t)n_prefix; /* none after them */
        int item = items && json_is_object(items) ? compile(c, items, where) : grammar_any(c->g);
        if (item == -1) return -1;
        int first[GRAMMAR_MAX_PROPS];
        for (size_t i = 0; i < n_prefix; i++) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s.prefixItems[%zu]", where, i);
            json_t *one = json_array_get(prefix, i);
            if ((first[i] = json_is_true(one) ? grammar_any(c->g) : compile(c, one, sub)) == -1) return -1;
            if (first[i] == NEVER) { /* a recursion cut: no item from here on */
                if ((int32_t)i < lo) return NEVER;
                n_prefix = i, hi = (int32_t)i, item = grammar_any(c->g);
            }
        }
        if (item == NEVER) { /* a recursion cut: no items after the prefix */
            if (lo > (int32_t)n_prefix) return NEVER;
            if (hi < 0 || hi > (int32_t)n_prefix) hi = (int32_t)n_prefix;
            item = grammar_any(c->g);
        }
        json_t *unique = json_object_get(s, "uniqueItems");
        if (unique && !json_is_boolean(unique)) return fail(c, "%s: uniqueItems must be a boolean%s", where, "");
        node = grammar_array(c->g, item, lo, hi, err, sizeof err);
        if (node >= 0 && n_prefix && grammar_array_prefix(c->g, node, first, n_prefix, err, sizeof err)) node = -1;
        if (node >= 0 && json_is_true(unique) && grammar_array_unique(c->g, node, err, sizeof err)) node = -1;
        return node < 0 ? grammar_fail(c, where, err) : node;
    }
    if (!strcmp(type, "string")) {
        int32_t lo, hi;
        json_t *pattern = json_object_get(s, "pattern"), *format = json_object_get(s, "format");
        if (get_count(c, s, "minLength", 0, &lo, where) || get_count(c, s, "maxLength", -1, &hi, where)) return -1;
        if (hi >= 0 && lo > hi) return fail(c, "%s: minLength exceeds maxLength%s", where, "");
        if (pattern && !json_is_string(pattern)) return fail(c, "%s: pattern must be a string%s", where, "");
        if (format && !json_is_string(format)) return fail(c, "%s: format must be a string%s", where, "");
        if (format && !grammar_has_format(json_string_value(format)))
            format = NULL; /* a format JSON Schema does not define is an annotation, as validators read it */
        if (pattern && format) return fail(c, "%s: format beside pattern is not supported%s", where, "");
        json_t *no;
        if (not_form(c, s, where, &no) != 3) no = NULL; /* (another form was refused or handled by compile) */
        if (no && format) return fail(c, "%s: format beside 'not' is not supported%s", where, "");
        if (no) return compile_string_except(c, pattern, no, lo, hi, where);
        if (pattern) {
            node = grammar_pattern(c->g, json_string_value(pattern), lo, hi, err, sizeof err);
            return node < 0 ? fail(c, "%s: pattern: %s", where, err) : node;
        }
        if (format) {
            node = grammar_format(c->g, json_string_value(format), lo, hi, err, sizeof err);
            return node < 0 ? grammar_fail(c, where, err) : node;
        }
        node = grammar_string(c->g, lo, hi);
    } else if (!strcmp(type, "number") || !strcmp(type, "integer")) {
        int integer = !strcmp(type, "integer");
        node = grammar_number(c->g, integer);
        if (node >= 0) return compile_limits(c, s, node, integer, where);
    } else if (!strcmp(type, "boolean") || !strcmp(type, "null")) {
        static const char *const tf[] = {"true", "false"}, *const nul[] = {"null"};
        int b = !strcmp(type, "boolean");
        node = grammar_literals(c->g, b ? tf : nul, b ? 2 : 1, err, sizeof err);
    } else {
        return fail(c, "%s: type '%s' is not a JSON Schema type", where, type);
    }
    return node < 0 ? api_fail(c->e, 500, NULL, NULL, "out of memory") : node;
}

/* The type a schema without "type" has by its keywords (NULL: any value). */
static const char *implied_type(json_t *s) {
    if (json_object_get(s, "properties") || json_object_get(s, "required") ||
        json_object_get(s, "additionalProperties") || json_object_get(s, "patternProperties") ||
        json_object_get(s, "propertyNames") || json_object_get(s, "minProperties") ||
        json_object_get(s, "maxProperties"))
        return "object";
    if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems") ||
        json_object_get(s, "prefixItems") || json_object_get(s, "uniqueItems"))
        return "array";
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") || json_object_get(s, "format") ||
        json_object_get(s, "pattern"))
        return "string";
    if (json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
        json_object_get(s, "exclusiveMaximum") || json_object_get(s, "multipleOf"))
        return "number";
    return NULL;
}

/* Whether type (a name or a list of names) lets a value of type `name` through; an integer
 * is a number too. */
static int type_allows(json_t *type, const char *name) {
    size_t n = json_is_array(type) ? json_array_size(type) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_is_array(type) ? json_array_get(type, i) : type;
        const char *tn = json_is_string(t) ? json_string_value(t) : "";
        if (!strcmp(tn, name) || (!strcmp(name, "integer") && !strcmp(tn, "number"))) return 1;
    }
    return 0;
}

/* The types both a and b (a name or a list of names each) allow: a new list, maybe empty. */
static json_t *type_intersection(json_t *a, json_t *b) {
    static const char *const names[] = {"string", "integer", "number", "boolean", "null", "object", "array"};
    json_t *both = json_array();
    for (size_t i = 0; both && i < sizeof names / sizeof *names; i++)
        if (type_allows(a, names[i]) && type_allows(b, names[i]) &&
            json_array_append_new(both, json_string(names[i]))) {
            json_decref(both);
            both = NULL;
        }
    return both;
}

/* The schema an alternative of parent's anyOf/oneOf (list_key) must satisfy: alt with
 * parent's other constraints, which hold for every alternative too. The two may say the
 * same, join their required lists and (while neither bounds additionalProperties) their
 * properties, and meet in the types both allow (none: *never is set, the alternative can
 * match nothing); anything else both say is a 400. A new schema (kept in c->made), or
 * alt itself when parent adds nothing; NULL after a 400 or with *never. */
static json_t *merge_parent(compiler *c, json_t *parent, const char *list_key, json_t *alt, const char *where,
                            int *never) {
    static const char *const none[] = {NULL};
    json_t *rest = json_deep_copy(parent);
    if (!rest) return api_fail(c->e, 500, NULL, NULL, "out of memory"), NULL;
    json_object_del(rest, list_key);
    if (!other_constraint(rest, none)) {
        json_decref(rest);
        return alt;
    }
    json_t *target = alt;
    for (int hops = 0; json_is_object(target) && json_object_get(target, "$ref") && hops < 8; hops++) {
        json_t *ref = json_object_get(target, "$ref");
        static const char *const only_ref[] = {"$ref", NULL};
        if (!json_is_string(ref) || other_constraint(target, only_ref)) break; /* refused by compile */
        json_t *to = resolve(c, json_string_value(ref));
        if (!to) break;
        target = to;
    }
    json_t *merged = json_is_true(target) ? json_object() : json_is_object(target) ? json_deep_copy(target) : NULL;
    if (!merged || json_array_append_new(c->made, merged)) {
        json_decref(rest);
        if (!json_is_object(target) && !json_is_true(target)) return fail(c, "%s: a schema must be an object%s", where, ""), NULL;
        return api_fail(c->e, 500, NULL, NULL, "out of memory"), NULL;
    }
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(rest, key, v) {
        json_t *mine = json_object_get(merged, key);
        if (rc || is_annotation(key)) continue;
        if (!mine) {
            rc = json_object_set(merged, key, v);
        } else if (json_equal(mine, v)) {
        } else if (!strcmp(key, "type")) {
            json_t *both = type_intersection(mine, v);
            if (!both) rc = -1;
            else if (!json_array_size(both)) *never = 1, rc = -3;
            else rc = json_object_set(merged, key, both);
            json_decref(both);
        } else if (!strcmp(key, "required") && json_is_array(mine) && json_is_array(v)) {
            rc = json_array_extend(mine, v);
        } else if (!strcmp(key, "properties") && json_is_object(mine) && json_is_object(v) &&
                   !json_object_get(merged, "additionalProperties") && !json_object_get(rest, "additionalProperties")) {
            const char *name;
            json_t *ps;
            json_object_foreach(v, name, ps) {
                json_t *had = json_object_get(mine, name);
                if (had && !json_equal(had, ps)) {
                    fail(c, "%s: property '%s' has one schema inside anyOf/oneOf/allOf/$ref and another beside it", where,
                         name);
                    rc = -2;
                    break;
                }
                if (!had && json_object_set(mine, name, ps)) rc = -1;
            }
        } else {
            fail(c, "%s: '%s' both beside anyOf/oneOf/allOf/$ref and in a schema it names, with different values, is "
                    "not supported", where, key);
            rc = -2;
        }
    }
    json_decref(rest);
    if (rc == -1) api_fail(c->e, 500, NULL, NULL, "out of memory");
    return rc ? NULL : merged;
}

static int compile(compiler *c, json_t *s, const char *where) {
    if (json_is_true(s)) return grammar_any(c->g);
    if (json_is_false(s)) return NEVER; /* no value: a property there is absent */
    if (!json_is_object(s)) return fail(c, "%s: a schema must be an object%s", where, "");
    c->n_compiled += c->unrolling > 0;
    if (++c->depth > MAX_SCHEMA_DEPTH) {
        c->depth--;
        return c->unrolling ? NEVER : fail(c, "%s: the schema nests too deeply%s", where, "");
    }
    static const char *const with_ref[] = {"$ref", NULL}, *const with_const[] = {"const", "type", NULL},
                             *const with_enum[] = {"enum", "type", NULL};
    int node = -1;
    json_t *ref = json_object_get(s, "$ref"), *cst = json_object_get(s, "const");
    const char *list_key = json_object_get(s, "anyOf") ? "anyOf" : json_object_get(s, "oneOf") ? "oneOf" : NULL;
    json_t *any_of = list_key ? json_object_get(s, list_key) : NULL, *en = json_object_get(s, "enum");
    json_t *type = json_object_get(s, "type");
    const char *other;
    if (check_keywords(c, s, where)) goto out;
    json_t *forbidden;
    int no = not_form(c, s, where, &forbidden);
    if (no) {
        node = no == 1 ? NEVER : no < 0 ? -1 : node;
        if (no != 2 && no != 3) goto out;
    }
    if (no == 3) { /* a string that `not` does not take (compile_type's string) */
        if (ref || cst || en || list_key || json_object_get(s, "allOf"))
            fail(c, "%s: 'not' of a string beside $ref, enum, const, anyOf, oneOf or allOf is not supported%s", where, "");
        else if (type && !type_allows(type, "string"))
            fail(c, "%s: 'not' with a pattern, enum or const writes strings here, and type allows none%s", where, "");
        else
            node = compile_type(c, s, "string", where);
        goto out;
    }
    json_t *all_of = json_object_get(s, "allOf");
    if (all_of) { /* every schema of the list holds: each merged into the rest, as anyOf's siblings are */
        if (!json_is_array(all_of) || !json_array_size(all_of) || json_array_size(all_of) > 16) {
            fail(c, "%s: allOf needs 1 to 16 entries%s", where, "");
            goto out;
        }
        json_t *acc = s;
        for (size_t i = 0; i < json_array_size(all_of) && acc; i++) {
            static const char *const only_ref[] = {"$ref", NULL};
            json_t *ref = json_object_get(acc, "$ref");
            for (int hops = 0; i && json_is_string(ref) && !other_constraint(acc, only_ref) && hops < 8; hops++) {
                json_t *to = resolve(c, json_string_value(ref)); /* what the schemas so far came to is a $ref */
                if (!to) break;
                acc = to;
                ref = json_is_object(acc) ? json_object_get(acc, "$ref") : NULL;
            }
            int never = 0;
            acc = merge_parent(c, acc, "allOf", json_array_get(all_of, i), where, &never);
            if (never) {
                fail(c, "%s: the schemas of allOf allow no type in common%s", where, "");
                goto out;
            }
        }
        if (acc) node = compile(c, acc, where);
        goto out;
    }
    if (type && !json_is_string(type) && !json_is_array(type)) {
        fail(c, "%s: type must be a string or a list of strings%s", where, "");
        goto out;
    }
    /* a keyword beside $ref, const or enum would be ignored by what they compile to, and the
       output could break it: refused (anyOf and oneOf take theirs into each alternative) */
    if (ref) {
        if (!json_is_string(ref)) {
            fail(c, "%s: $ref must be a string%s", where, "");
        } else if (other_constraint(s, with_ref)) {
            /* constraints beside $ref hold too (drafts 2019-09 on; earlier drafts ignore them, so
               what meets both is valid either way): the target merged with them, as allOf's are */
            json_t *alone = NULL, *merged = NULL;
            int never = 0;
            if (!resolve(c, json_string_value(ref)))
                fail(c, "$ref '%s' does not point into this schema%s", json_string_value(ref), "");
            else if (merging(c, json_string_value(ref)))
                fail(c, "$ref '%s' is recursive, which is not supported%s", json_string_value(ref), "");
            else if (!(alone = json_pack("{s:O}", "$ref", ref)) || json_array_append_new(c->made, alone))
                api_fail(c->e, 500, NULL, NULL, "out of memory");
            else if (!(merged = merge_parent(c, s, "$ref", alone, where, &never)) && never)
                fail(c, "%s: the schema $ref points to and the type beside it have no type in common%s", where, "");
            if (merged) {
                c->merging[c->n_merging++] = json_string_value(ref); /* depth <= MAX_SCHEMA_DEPTH: room */
                node = compile(c, merged, where);
                c->n_merging--;
            }
        } else {
            node = compile_ref(c, json_string_value(ref));
        }
    } else if (cst || (en && !any_of)) {
        json_t *one = cst ? json_pack("[O]", cst) : json_incref(en);
        if ((other = other_constraint(s, cst ? with_const : with_enum)))
            fail(c, "%s: '%s' beside enum or const is not supported (list only the values it allows)", where, other);
        else if (!one)
            api_fail(c->e, 500, NULL, NULL, "out of memory");
        else if (!json_is_array(one) || !json_array_size(one))
            fail(c, "%s: enum must be a non-empty array%s", where, "");
        else
            node = compile_literals(c, one, type, where);
        json_decref(one);
    } else if (any_of || json_is_array(type)) {
        json_t *list = any_of ? any_of : type;
        size_t n = json_array_size(list);
        if (!json_is_array(list) || !n || n > 64) {
            fail(c, "%s: anyOf, oneOf and a type list need 1 to 64 entries%s", where, "");
            goto out;
        }
        int alts[64], cut = 0;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            json_t *alt = json_array_get(list, i);
            if (!any_of && !json_is_string(alt)) {
                fail(c, "%s: type must list type names%s", where, "");
                goto out;
            }
            int never = 0;
            if (any_of) {
                json_t *full = merge_parent(c, s, list_key, alt, where, &never);
                if (never) continue; /* of a type the schema beside it does not allow */
                alts[m] = full ? compile(c, full, where) : -1;
            } else {
                alts[m] = compile_type(c, s, json_string_value(alt), where);
            }
            if (alts[m] == NEVER) { /* a recursion cut: not this alternative */
                cut = 1;
                continue;
            }
            if (alts[m++] < 0) goto out;
        }
        if (!m && cut) {
            node = NEVER;
            goto out;
        }
        if (!m) {
            fail(c, "%s: no alternative of %s is of the type beside it", where, list_key);
            goto out;
        }
        char err[200];
        /* a value valid for two alternatives breaks oneOf, not anyOf nor a type list */
        if (list_key && !strcmp(list_key, "oneOf")) node = grammar_one_of(c->g, alts, m, err, sizeof err);
        else node = grammar_any_of_overlapping(c->g, alts, m, err, sizeof err);
        if (node < 0) grammar_fail(c, where, err);
    } else {
        node = compile_type(c, s, type ? json_string_value(type) : implied_type(s), where);
    }
out:
    c->depth--;
    return node;
}

int api_schema_node(grammar *g, json_t *schema, const char *param, api_error *e) {
    compiler c = {.g = g, .root = schema, .param = param, .e = e, .made = json_array()};
    if (!c.made) return api_fail(e, 500, NULL, NULL, "out of memory");
    int node = compile(&c, schema, "schema");
    if (node == NEVER)
        node = fail(&c, "schema: no value meets it (false, 'not': {}, or a recursion that never ends: each value "
                        "needs another inside it)%s%s", "", "");
    json_decref(c.made);
    return node;
}

grammar *api_schema_grammar(json_t *schema, const char *param, api_error *e) {
    grammar *g = grammar_new();
    if (!g) {
        api_fail(e, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    int root = api_schema_node(g, schema, param, e);
    if (root < 0) {
        grammar_unref(g);
        return NULL;
    }
    grammar_set_root(g, root);
    return g;
}

int api_parse_response_format(json_t *body, json_t **schema_out, api_error *e) {
    *schema_out = NULL;
    const char *P = "response_format";
    json_t *rf = json_object_get(body, P);
    if (!rf || json_is_null(rf)) return 0;
    if (!json_is_object(rf)) return api_fail(e, 400, "invalid_type", P, "response_format must be an object");
    json_t *type = json_object_get(rf, "type");
    if (!json_is_string(type))
        return api_fail(e, 400, "invalid_value", P, "response_format.type must be text, json_object or json_schema");
    const char *t = json_string_value(type);
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        *schema_out = json_pack("{s:s}", "type", "object");
        return *schema_out ? 0 : api_fail(e, 500, NULL, NULL, "out of memory");
    }
    if (strcmp(t, "json_schema"))
        return api_fail(e, 400, "invalid_value", P,
                        "response_format.type '%s' is not one of text, json_object, json_schema", t);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return api_fail(e, 400, "invalid_value", P, "response_format.json_schema must be an object");
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    json_t *schema = json_object_get(js, "schema");
    if (!name || json_is_null(name))
        return api_fail(e, 400, "missing_field", P, "response_format.json_schema.name is required");
    if (!json_is_string(name) || !api_name_is_valid(json_string_value(name)))
        return api_fail(e, 400, "invalid_value", P,
                        "response_format.json_schema.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return api_fail(e, 400, "invalid_type", P, "response_format.json_schema.strict must be a boolean");
    if (!json_is_object(schema))
        return api_fail(e, 400, "invalid_value", P, "response_format.json_schema.schema must be a JSON Schema object");
    *schema_out = json_incref(schema);
    return 0;
}
