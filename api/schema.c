/* JSON Schema -> grammar (engine/grammar.h) for response_format and tool
 * arguments. The subset: type (one or a list), properties, required,
 * additionalProperties, enum, const, items, minItems/maxItems,
 * minLength/maxLength, anyOf/oneOf (alternatives that start with different
 * bytes), $ref to any "#/..." pointer (with $defs/definitions), and the
 * annotations (title, description, default, examples, $schema, $id,
 * $comment). Any other keyword is a 400 naming it: a constraint silently
 * dropped would let the output break the schema.
 *
 * What is generated is a subset of what the schema allows, always valid:
 * an object with properties gets only those properties (whatever
 * additionalProperties says), in any order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

enum { MAX_REFS = 128, MAX_SCHEMA_DEPTH = 24 };

typedef struct ref_entry {
    const char *ref;
    int node; /* -2 while being compiled */
} ref_entry;

typedef struct compiler {
    grammar *g;
    json_t *root;
    const char *param;
    api_error *e;
    ref_entry refs[MAX_REFS];
    int n_refs;
    int depth;
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

static const char *const known_keywords[] = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items",
    "minItems", "maxItems", "minLength", "maxLength", "anyOf", "oneOf", "$ref", "$defs",
    "definitions", "title", "description", "default", "examples", "$schema", "$id", "$comment",
    NULL};

static int check_keywords(compiler *c, json_t *s, const char *where) {
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        int known = 0;
        for (const char *const *k = known_keywords; *k && !known; k++) known = !strcmp(*k, key);
        if (!known) return fail(c, "%s: the JSON Schema keyword '%s' is not supported", where, key);
    }
    return 0;
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
            if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
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

static int compile_ref(compiler *c, const char *ref) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) {
            if (c->refs[i].node == -2) return fail(c, "$ref '%s' is recursive, which is not supported%s", ref, "");
            return c->refs[i].node;
        }
    json_t *target = resolve(c, ref);
    if (!target) return fail(c, "$ref '%s' does not point into this schema%s", ref, "");
    if (c->n_refs == MAX_REFS) return fail(c, "too many $ref targets%s%s", "", "");
    int slot = c->n_refs++;
    c->refs[slot] = (ref_entry){ref, -2};
    int node = compile(c, target, ref);
    c->refs[slot].node = node;
    return node;
}

static int compile_literals(compiler *c, json_t *values, const char *type, const char *where) {
    size_t n = json_array_size(values);
    char **texts = calloc(n ? n : 1, sizeof *texts);
    if (!texts) return api_fail(c->e, 500, NULL, NULL, "out of memory");
    size_t m = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *v = json_array_get(values, i);
        /* with a type beside enum, only the values of that type are valid */
        if (type && ((!strcmp(type, "string") && !json_is_string(v)) ||
                     (!strcmp(type, "integer") && !json_is_integer(v)) ||
                     (!strcmp(type, "number") && !json_is_number(v)) ||
                     (!strcmp(type, "boolean") && !json_is_boolean(v)) ||
                     (!strcmp(type, "null") && !json_is_null(v)) ||
                     (!strcmp(type, "object") && !json_is_object(v)) ||
                     (!strcmp(type, "array") && !json_is_array(v))))
            continue;
        texts[m] = literal_text(v);
        if (!texts[m]) rc = api_fail(c->e, 500, NULL, NULL, "out of memory");
        else m++;
    }
    char err[200];
    int node = rc ? -1 : grammar_literals(c->g, (const char *const *)texts, m, err, sizeof err);
    if (!rc && node < 0) grammar_fail(c, where, m ? err : "enum has no value of the schema's type");
    for (size_t i = 0; i < m; i++) free(texts[i]);
    free(texts);
    return node;
}

static int compile_object(compiler *c, json_t *s, const char *where) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *extra = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, "%s: properties must be an object%s", where, "");
    if (req && !json_is_array(req)) return fail(c, "%s: required must be an array%s", where, "");
    size_t n = props ? json_object_size(props) : 0, i = 0;
    if (n > GRAMMAR_MAX_PROPS) return fail(c, "%s: more properties than the %s supported", where, "64");
    for (size_t k = 0; req && k < json_array_size(req); k++) {
        json_t *name = json_array_get(req, k);
        if (!json_is_string(name)) return fail(c, "%s: required must list strings%s", where, "");
        if (!props || !json_object_get(props, json_string_value(name)))
            return fail(c, "%s: required property '%s' is not in properties", where, json_string_value(name));
    }
    if (n == 0) {
        int values;
        if (!extra || json_is_true(extra)) values = grammar_any(c->g);
        else if (json_is_false(extra)) values = -1;
        else if ((values = compile(c, extra, where)) < 0) return -1;
        char err[200];
        int node = grammar_object(c->g, NULL, NULL, NULL, 0, values, err, sizeof err);
        return node < 0 ? grammar_fail(c, where, err) : node;
    }
    if (extra && !json_is_boolean(extra) && !json_is_object(extra))
        return fail(c, "%s: additionalProperties must be a boolean or a schema%s", where, "");
    char *names[GRAMMAR_MAX_PROPS];
    int nodes[GRAMMAR_MAX_PROPS], required[GRAMMAR_MAX_PROPS], rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s.properties.%s", where, key);
        json_t *js = json_string(key);
        char *quoted = js ? literal_text(js) : NULL;
        json_decref(js);
        if (!quoted) {
            rc = api_fail(c->e, 500, NULL, NULL, "out of memory");
            break;
        }
        size_t len = strlen(quoted);
        memmove(quoted, quoted + 1, len - 2); /* without its quotes */
        quoted[len - 2] = 0;
        names[i] = quoted;
        required[i] = 0;
        for (size_t k = 0; req && k < json_array_size(req); k++)
            required[i] |= !strcmp(json_string_value(json_array_get(req, k)), key);
        i++;
        if ((nodes[i - 1] = compile(c, v, sub)) < 0) {
            rc = -1;
            break;
        }
    }
    int node = -1;
    if (!rc) {
        char err[200];
        node = grammar_object(c->g, (const char *const *)names, nodes, required, n, -1, err, sizeof err);
        if (node < 0) grammar_fail(c, where, err);
    }
    for (size_t k = 0; k < i; k++) free(names[k]);
    return node;
}

static int compile_type(compiler *c, json_t *s, const char *type, const char *where) {
    json_t *en = json_object_get(s, "enum");
    if (en) {
        if (!json_is_array(en) || !json_array_size(en)) return fail(c, "%s: enum must be a non-empty array%s", where, "");
        return compile_literals(c, en, type, where);
    }
    char err[200];
    int node;
    if (!type) return grammar_any(c->g);
    if (!strcmp(type, "object")) return compile_object(c, s, where);
    if (!strcmp(type, "array")) {
        json_t *items = json_object_get(s, "items");
        int32_t lo, hi;
        if (get_count(c, s, "minItems", 0, &lo, where) || get_count(c, s, "maxItems", -1, &hi, where)) return -1;
        if (items && !json_is_object(items) && !json_is_true(items))
            return fail(c, "%s: items must be a schema%s", where, "");
        int item = items && json_is_object(items) ? compile(c, items, where) : grammar_any(c->g);
        if (item < 0) return -1;
        node = grammar_array(c->g, item, lo, hi, err, sizeof err);
        return node < 0 ? grammar_fail(c, where, err) : node;
    }
    if (!strcmp(type, "string")) {
        int32_t lo, hi;
        if (get_count(c, s, "minLength", 0, &lo, where) || get_count(c, s, "maxLength", -1, &hi, where)) return -1;
        if (hi >= 0 && lo > hi) return fail(c, "%s: minLength exceeds maxLength%s", where, "");
        node = grammar_string(c->g, lo, hi);
    } else if (!strcmp(type, "number") || !strcmp(type, "integer")) {
        node = grammar_number(c->g, !strcmp(type, "integer"));
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
        json_object_get(s, "additionalProperties"))
        return "object";
    if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
        return "array";
    if (json_object_get(s, "minLength") || json_object_get(s, "maxLength")) return "string";
    return NULL;
}

static int compile(compiler *c, json_t *s, const char *where) {
    if (json_is_true(s)) return grammar_any(c->g);
    if (!json_is_object(s)) return fail(c, "%s: a schema must be an object%s", where, "");
    if (++c->depth > MAX_SCHEMA_DEPTH) return fail(c, "%s: the schema nests too deeply%s", where, "");
    int node = -1;
    json_t *ref = json_object_get(s, "$ref"), *cst = json_object_get(s, "const");
    json_t *any_of = json_object_get(s, "anyOf");
    if (!any_of) any_of = json_object_get(s, "oneOf");
    json_t *type = json_object_get(s, "type");
    if (check_keywords(c, s, where)) goto out;
    if (ref) {
        if (!json_is_string(ref)) fail(c, "%s: $ref must be a string%s", where, "");
        else node = compile_ref(c, json_string_value(ref));
    } else if (cst) {
        json_t *one = json_pack("[O]", cst);
        node = one ? compile_literals(c, one, NULL, where) : api_fail(c->e, 500, NULL, NULL, "out of memory");
        json_decref(one);
    } else if (any_of || json_is_array(type)) {
        json_t *list = any_of ? any_of : type;
        size_t n = json_array_size(list);
        if (!json_is_array(list) || !n || n > 16) {
            fail(c, "%s: anyOf, oneOf and a type list need 1 to 16 entries%s", where, "");
            goto out;
        }
        int alts[16];
        for (size_t i = 0; i < n; i++) {
            json_t *alt = json_array_get(list, i);
            if (!any_of && !json_is_string(alt)) {
                fail(c, "%s: type must list type names%s", where, "");
                goto out;
            }
            alts[i] = any_of ? compile(c, alt, where) : compile_type(c, s, json_string_value(alt), where);
            if (alts[i] < 0) goto out;
        }
        char err[200];
        node = grammar_any_of(c->g, alts, n, err, sizeof err);
        if (node < 0) grammar_fail(c, where, err);
    } else if (type && !json_is_string(type)) {
        fail(c, "%s: type must be a string or a list of strings%s", where, "");
    } else {
        node = compile_type(c, s, type ? json_string_value(type) : implied_type(s), where);
    }
out:
    c->depth--;
    return node;
}

int api_schema_node(grammar *g, json_t *schema, const char *param, api_error *e) {
    compiler c = {.g = g, .root = schema, .param = param, .e = e};
    return compile(&c, schema, "schema");
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

int api_parse_response_format(json_t *body, grammar **out, api_error *e) {
    *out = NULL;
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
        json_t *any_object = json_pack("{s:s}", "type", "object");
        *out = any_object ? api_schema_grammar(any_object, P, e) : NULL;
        json_decref(any_object);
        return *out ? 0 : -1;
    }
    if (strcmp(t, "json_schema"))
        return api_fail(e, 400, "invalid_value", P,
                        "response_format.type '%s' is not one of text, json_object, json_schema", t);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return api_fail(e, 400, "invalid_value", P, "response_format.json_schema must be an object");
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    json_t *schema = json_object_get(js, "schema");
    if (name && !json_is_string(name))
        return api_fail(e, 400, "invalid_type", P, "response_format.json_schema.name must be a string");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return api_fail(e, 400, "invalid_type", P, "response_format.json_schema.strict must be a boolean");
    if (!json_is_object(schema))
        return api_fail(e, 400, "invalid_value", P, "response_format.json_schema.schema must be a JSON Schema object");
    *out = api_schema_grammar(schema, P, e);
    return *out ? 0 : -1;
}
