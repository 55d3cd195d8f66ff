/* Tool calls (chat): tools, tool_choice and parallel_tool_calls; the
 * conversation's tool definitions, assistant tool calls and tool results
 * written the way the chat template of the model's family writes them; the
 * grammar that forces a call; and the parser that finds calls in the text.
 *
 * Formats:
 *   chatml (Qwen2.5's template): the tools as JSON lines inside <tools></tools>
 *     in the system message; a call is
 *     <tool_call>\n{"name": N, "arguments": A}\n</tool_call>; results go into
 *     a user turn as <tool_response>\n...\n</tool_response>.
 *   llama3 (Llama 3.1's template, tools in the first user message): a call is
 *     {"name": N, "parameters": A}; results are turns of the ipython role.
 * Other families have no tool format: a request with tools is a 400. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"

enum tool_format { FORMAT_NONE, FORMAT_CHATML, FORMAT_LLAMA3 };

static enum tool_format format_of(const char *family) {
    if (family && !strcmp(family, "chatml")) return FORMAT_CHATML;
    if (family && !strcmp(family, "llama3")) return FORMAT_LLAMA3;
    return FORMAT_NONE;
}

static const char *args_key(enum tool_format f) { return f == FORMAT_LLAMA3 ? "parameters" : "arguments"; }

int api_parse_tools(api_gen_request *r, api_error *e) {
    json_t *tools = json_object_get(r->root, "tools");
    json_t *choice = json_object_get(r->root, "tool_choice");
    json_t *parallel = json_object_get(r->root, "parallel_tool_calls");
    r->parallel_tool_calls = 1;
    if (parallel && !json_is_null(parallel)) {
        if (!json_is_boolean(parallel))
            return api_fail(e, 400, "invalid_type", "parallel_tool_calls", "parallel_tool_calls must be a boolean");
        r->parallel_tool_calls = json_is_true(parallel);
    }
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) > 128)
            return api_fail(e, 400, "invalid_type", "tools", "tools must be an array of up to 128 tools");
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t) {
            json_t *fn = json_object_get(t, "function");
            json_t *type = json_object_get(t, "type"), *name = json_object_get(fn, "name");
            json_t *params = json_object_get(fn, "parameters");
            if (!json_is_object(t) || !json_is_string(type) || strcmp(json_string_value(type), "function") ||
                !json_is_object(fn) || !json_is_string(name) || !json_string_length(name))
                return api_fail(e, 400, "invalid_value", "tools",
                                "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
            if (!api_name_is_valid(json_string_value(name)))
                return api_fail(e, 400, "invalid_value", "tools",
                                "tools[%zu].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i);
            if (params && !json_is_null(params) && !json_is_object(params))
                return api_fail(e, 400, "invalid_type", "tools", "tools[%zu].function.parameters must be a JSON Schema", i);
            /* arguments are an object of named values (a call's JSON is {"name": …, "arguments": {…}},
               and the templates' parsers read it so): a schema of another value is refused, as OpenAI does */
            json_t *ptype = json_object_get(params, "type");
            if (json_object_size(params) && !(json_is_string(ptype) && !strcmp(json_string_value(ptype), "object")))
                return api_fail(e, 400, "invalid_value", "tools",
                                "tools[%zu].function.parameters must be a JSON Schema of \"type\": \"object\"", i);
            for (size_t j = 0; j < i; j++)
                if (!strcmp(json_string_value(name),
                            json_string_value(json_object_get(json_object_get(json_array_get(tools, j), "function"), "name"))))
                    return api_fail(e, 400, "invalid_value", "tools", "two tools are named '%s'", json_string_value(name));
        }
        if (json_array_size(tools)) r->tools = tools;
    }
    r->tool_choice = r->tools ? TOOL_CHOICE_AUTO : TOOL_CHOICE_NONE;
    if (!choice || json_is_null(choice)) return 0;
    if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (!strcmp(c, "none")) r->tool_choice = TOOL_CHOICE_NONE;
        else if (!strcmp(c, "auto")) r->tool_choice = r->tools ? TOOL_CHOICE_AUTO : TOOL_CHOICE_NONE;
        else if (!strcmp(c, "required")) r->tool_choice = TOOL_CHOICE_REQUIRED;
        else return api_fail(e, 400, "invalid_value", "tool_choice",
                             "tool_choice must be none, auto, required or {\"type\": \"function\", ...}");
    } else {
        json_t *name = json_object_get(json_object_get(choice, "function"), "name");
        if (!json_is_object(choice) || !json_is_string(name))
            return api_fail(e, 400, "invalid_value", "tool_choice",
                            "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        r->tool_choice = TOOL_CHOICE_NAMED;
        r->tool_name = json_string_value(name);
    }
    if (r->tool_choice != TOOL_CHOICE_NONE && !r->tools)
        return api_fail(e, 400, "invalid_value", "tool_choice", "tool_choice needs tools");
    if (r->tool_choice == TOOL_CHOICE_NAMED) {
        size_t i;
        json_t *t;
        json_array_foreach(r->tools, i, t)
            if (!strcmp(json_string_value(json_object_get(json_object_get(t, "function"), "name")), r->tool_name))
                return 0;
        return api_fail(e, 400, "invalid_value", "tool_choice", "tool_choice names '%s', which is not in tools",
                        r->tool_name);
    }
    return 0;
}

/* ---- rendering the conversation --------------------------------------------------- */

typedef struct textbuf {
    char *p;
    size_t n, cap;
    int oom;
} textbuf;

static void put(textbuf *t, const char *s, size_t n) {
    if (t->oom) return;
    if (t->n + n + 1 > t->cap) {
        size_t cap = (t->n + n + 1) * 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = 1;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

static void puts_(textbuf *t, const char *s) { put(t, s, strlen(s)); }

static void put_json(textbuf *t, json_t *v, size_t flags) {
    char *s = json_dumps(v, flags | JSON_ENCODE_ANY);
    if (!s) {
        t->oom = 1;
        return;
    }
    puts_(t, s);
    free(s);
}

/* Keeps s alive in root and returns it. */
static const char *keep(json_t *root, size_t idx, textbuf *t) {
    char key[48];
    snprintf(key, sizeof key, "\x01tools%zu", idx);
    json_t *v = json_stringn_nocheck(t->p ? t->p : "", t->n);
    free(t->p);
    memset(t, 0, sizeof *t);
    if (!v) return NULL;
    json_object_set_new(root, key, v);
    return json_string_value(v);
}

/* A call's arguments as JSON: OpenAI sends them as a string of JSON. */
static json_t *call_arguments(json_t *fn) {
    json_t *a = json_object_get(fn, "arguments");
    if (json_is_string(a)) {
        json_t *v = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL);
        return v ? v : json_object();
    }
    return a ? json_incref(a) : json_object();
}

static void put_call(textbuf *t, enum tool_format f, json_t *call) {
    json_t *fn = json_object_get(call, "function");
    json_t *args = call_arguments(fn);
    json_t *obj = json_pack("{s:O?, s:o}", "name", json_object_get(fn, "name"), args_key(f), args);
    if (!obj) {
        t->oom = 1;
        return;
    }
    if (f == FORMAT_CHATML) puts_(t, "<tool_call>\n");
    put_json(t, obj, 0); /* ", " and ": " separators, as the templates' tojson writes them */
    json_decref(obj);
    if (f == FORMAT_CHATML) puts_(t, "\n</tool_call>");
}

static void put_tools(textbuf *t, json_t *tools, enum tool_format f) {
    size_t i;
    json_t *tool;
    if (f == FORMAT_CHATML) {
        puts_(t, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        json_array_foreach(tools, i, tool) {
            puts_(t, "\n");
            put_json(t, tool, 0);
        }
        puts_(t, "\n</tools>\n\nFor each function call, return a json object with function name and "
                 "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                 "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
    } else {
        puts_(t, "Given the following functions, please respond with a JSON for a function call with "
                 "its proper arguments that best answers the given prompt.\n\nRespond in the format "
                 "{\"name\": function name, \"parameters\": dictionary of argument name and its value}."
                 "Do not use variables.\n\n");
        json_array_foreach(tools, i, tool) {
            put_json(t, tool, JSON_INDENT(4));
            puts_(t, "\n\n");
        }
    }
}

/* OpenAI's rule for tool turns: each call of an assistant message is answered by
 * one of the tool messages right after it, by its id, and a tool message answers
 * a call of that message (a result given to no call, or a call left without one,
 * is a client's mistake the template would render silently). 400 naming messages. */
static int check_tool_turns(const api_gen_request *r, json_t *msgs, api_error *e) {
    json_t *calls = NULL; /* the calls of the assistant message before the tool messages being read */
    json_t *answered = json_object();
    int rc = 0;
    for (size_t i = 0; i <= r->n_messages && !rc; i++) {
        json_t *m = json_array_get(msgs, i); /* NULL past the end: the last calls are checked there */
        int is_tool = i < r->n_messages && !strcmp(r->messages[i].role, "tool");
        if (is_tool) {
            const char *id = json_string_value(json_object_get(m, "tool_call_id"));
            int known = 0;
            size_t j;
            json_t *call;
            json_array_foreach(calls, j, call) {
                const char *call_id = json_string_value(json_object_get(call, "id"));
                known |= id && call_id && !strcmp(id, call_id);
            }
            if (!id)
                rc = api_fail(e, 400, "invalid_value", "messages", "messages[%zu] (role tool) needs a tool_call_id", i);
            else if (!known)
                rc = api_fail(e, 400, "invalid_value", "messages",
                              "No tool call found for the tool output answering '%s': a tool message (a "
                              "function_call_output) answers a call of the assistant message just before it", id);
            else
                json_object_set_new(answered, id, json_true());
            continue;
        }
        size_t j;
        json_t *call;
        json_array_foreach(calls, j, call) {
            const char *id = json_string_value(json_object_get(call, "id"));
            if (!rc && (!id || !json_object_get(answered, id)))
                rc = api_fail(e, 400, "invalid_value", "messages",
                              "No tool output found for tool call %s%s%s: each call is answered by a tool message "
                              "(a function_call_output) right after the assistant message that made it",
                              id ? "'" : "", id ? id : "without an id", id ? "'" : "");
        }
        json_object_clear(answered);
        calls = i < r->n_messages && !strcmp(r->messages[i].role, "assistant") ? json_object_get(m, "tool_calls") : NULL;
        if (!json_is_array(calls)) calls = NULL;
    }
    json_decref(answered);
    return rc;
}

int api_render_tools(api_gen_request *r, const char *family, api_error *e) {
    json_t *msgs = json_object_get(r->root, "messages");
    int has_tool_turns = 0;
    for (size_t i = 0; i < r->n_messages; i++) {
        json_t *m = json_array_get(msgs, i);
        if (!strcmp(r->messages[i].role, "tool") || json_array_size(json_object_get(m, "tool_calls")))
            has_tool_turns = 1;
    }
    if (!r->tools && !has_tool_turns) return 0;
    if (check_tool_turns(r, msgs, e)) return -1;
    enum tool_format f = format_of(family);
    if (f == FORMAT_NONE)
        return api_fail(e, 400, "unsupported_value", r->tools ? "tools" : "messages",
                        "the model's chat template (%s) has no tool-call format; tools work with the "
                        "chatml (Qwen) and llama3 templates", family ? family : "unknown");
    r->tool_format = f == FORMAT_CHATML ? "chatml" : "llama3";
    /* a call the model writes itself is not cut open by a stop string (a forced one is under a grammar) */
    if (r->tools && r->tool_choice == TOOL_CHOICE_AUTO) r->params.stop_guard = f == FORMAT_CHATML ? "<tool_call>" : "{\"name\"";
    /* one call wanted: the answer ends with the first call's close (the model went on to write more,
       which were dropped, and could end cut by max_tokens: finish_reason "length") */
    if (r->tools && r->tool_choice == TOOL_CHOICE_AUTO && !r->parallel_tool_calls && f == FORMAT_CHATML)
        r->params.end_after = "</tool_call>";
    /* the rewritten list: at most one more message (a system message for the tools) */
    engine_message *out = calloc(r->n_messages + 1, sizeof *out);
    if (!out) return api_fail(e, 500, NULL, NULL, "out of memory");
    size_t n = 0, k = 0, start = 0;
    textbuf t = {0};
    int tools_placed = !r->tools || r->tool_choice == TOOL_CHOICE_NONE;
    if (!tools_placed && f == FORMAT_CHATML) {
        const char *sys = r->n_messages && !strcmp(r->messages[0].role, "system") ? r->messages[0].content : NULL;
        if (sys) {
            puts_(&t, sys);
            puts_(&t, "\n\n");
        }
        put_tools(&t, r->tools, f);
        out[n++] = (engine_message){"system", keep(r->root, k++, &t)};
        if (sys) start = 1; /* the original system message is in it */
        tools_placed = 1;
    }
    for (size_t i = start; i < r->n_messages; i++) {
        json_t *m = json_array_get(msgs, i);
        const char *role = r->messages[i].role, *content = r->messages[i].content;
        json_t *calls = json_object_get(m, "tool_calls");
        if (!strcmp(role, "assistant") && json_array_size(calls)) {
            puts_(&t, content);
            size_t j;
            json_t *call;
            json_array_foreach(calls, j, call) {
                if (t.n) puts_(&t, "\n");
                put_call(&t, f, call);
            }
            out[n++] = (engine_message){"assistant", keep(r->root, 100 + i, &t)};
        } else if (!strcmp(role, "tool")) {
            if (f == FORMAT_CHATML) {
                /* consecutive results share one user turn */
                int joins = n && i && !strcmp(r->messages[i - 1].role, "tool");
                if (joins) puts_(&t, out[--n].content), puts_(&t, "\n");
                puts_(&t, "<tool_response>\n");
                puts_(&t, content);
                puts_(&t, "\n</tool_response>");
                out[n++] = (engine_message){"user", keep(r->root, 100 + i, &t)};
            } else {
                out[n++] = (engine_message){"ipython", content};
            }
        } else if (!tools_placed && !strcmp(role, "user")) {
            put_tools(&t, r->tools, f); /* llama3: in the first user message */
            puts_(&t, content);
            out[n++] = (engine_message){"user", keep(r->root, 100 + i, &t)};
            tools_placed = 1;
        } else {
            out[n++] = r->messages[i];
        }
        if (t.oom || (n && !out[n - 1].content)) {
            free(out);
            free(t.p);
            return api_fail(e, 500, NULL, NULL, "out of memory");
        }
    }
    free(r->messages);
    r->messages = out;
    r->n_messages = n;
    return 0;
}

/* ---- forcing and finding calls ------------------------------------------------------ */

/* `"name"` as JSON (quoted, escaped); caller frees. */
static char *quoted_name(const char *name) {
    json_t *s = json_string(name);
    char *q = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    json_decref(s);
    return q;
}

/* What a call of `name` starts with in format f, up to its arguments; caller frees. */
static char *call_prefix(enum tool_format f, const char *name) {
    char *q = quoted_name(name);
    size_t len = (q ? strlen(q) : 0) + 64;
    char *p = q ? malloc(len) : NULL;
    if (p) snprintf(p, len, "%s{\"name\": %s, \"%s\": ", f == FORMAT_CHATML ? "<tool_call>\n" : "", q, args_key(f));
    free(q);
    return p;
}

/* What a call ends with after its arguments. */
static const char *call_suffix(enum tool_format f) { return f == FORMAT_CHATML ? "}\n</tool_call>" : "}"; }

/* The name of tool i, or NULL when r's tool_choice does not let it be called. */
static const char *tool_name_at(const api_gen_request *r, size_t i) {
    const char *name = json_string_value(json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name"));
    return r->tool_choice == TOOL_CHOICE_NAMED && strcmp(name, r->tool_name) ? NULL : name;
}

grammar *api_tool_call_grammar(const api_gen_request *r, api_error *e) {
    enum tool_format f = format_of(r->tool_format);
    grammar *g = grammar_new();
    if (!g) return api_fail(e, 500, NULL, NULL, "out of memory"), NULL;
    char *prefixes[GRAMMAR_MAX_LITERALS] = {0};
    int nodes[GRAMMAR_MAX_LITERALS];
    size_t n = 0, i;
    json_t *tool;
    int rc = 0;
    json_array_foreach(r->tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        const char *name = tool_name_at(r, i);
        if (!name) continue;
        if (n == GRAMMAR_MAX_LITERALS) {
            rc = api_fail(e, 400, "invalid_value", "tools", "tool_choice required works with up to %d tools",
                          GRAMMAR_MAX_LITERALS);
            break;
        }
        json_t *params = json_object_get(fn, "parameters");
        json_t *empty = json_pack("{s:s}", "type", "object");
        /* the arguments' schema compiles into this grammar */
        nodes[n] = api_schema_node(g, json_object_size(params) ? params : empty, "tools", e);
        json_decref(empty);
        prefixes[n] = call_prefix(f, name);
        n++;
        if (nodes[n - 1] < 0) {
            rc = -1;
            break;
        }
        if (!prefixes[n - 1]) {
            rc = api_fail(e, 500, NULL, NULL, "out of memory");
            break;
        }
    }
    if (!rc) {
        char err[200];
        int root = grammar_tagged(g, (const char *const *)prefixes, nodes, n, call_suffix(f), err, sizeof err);
        if (root < 0) rc = api_fail(e, 400, "invalid_value", "tools", "%s", err);
        else grammar_set_root(g, root);
    }
    for (size_t k = 0; k < n; k++) free(prefixes[k]);
    if (rc) {
        grammar_unref(g);
        return NULL;
    }
    return g;
}

/* A call as OpenAI's message.tool_calls holds it; arguments is a JSON string. */
static json_t *call_json(const char *name, const char *args, size_t n_args) {
    char id[40];
    api_random_id(id, sizeof id, "call_");
    json_t *a = json_stringn(args, n_args);
    if (!a) a = json_string(""); /* cut inside a character */
    return json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name", name, "arguments", a);
}

/* The bytes of a JSON value written at the start of s (n bytes): through its
 * end once written (a string, object or array closed; a bare number or word
 * ends at the first byte that cannot be its), else all of s; *whole says which. */
static size_t json_value_extent(const char *s, size_t n, int *whole) {
    size_t i = 0;
    int depth = 0, in_string = 0, started = 0;
    *whole = 0;
    while (i < n && !started && strchr(" \t\r\n", s[i])) i++;
    for (; i < n; i++) {
        char ch = s[i];
        if (in_string) {
            if (ch == '\\') i++;
            else if (ch == '"') in_string = 0;
            else continue;
            if (!in_string && depth == 0) return *whole = 1, i + 1;
            continue;
        }
        if (ch == '"') in_string = 1;
        else if (ch == '{' || ch == '[') depth++;
        else if (ch == '}' || ch == ']') {
            if (--depth == 0) return *whole = 1, i + 1;
        } else if (depth == 0 && started && strchr(" \t\r\n,}]", ch)) {
            return *whole = 1, i;
        }
        started = 1;
    }
    return n;
}

/* Whether s (n bytes) has lit at *i, which then passes it. */
static int lit_at(const char *s, size_t n, size_t *i, const char *lit) {
    size_t k = strlen(lit);
    if (*i + k > n || memcmp(s + *i, lit, k)) return 0;
    *i += k;
    return 1;
}

/* A call as the model writes one, {"name": "<tool>", "arguments": {...}} (or
 * "parameters"), as far as s (n bytes) has come: the tool (one of r's) once its
 * name is written whole, and where the arguments' object starts (*args_at);
 * NULL before that, or when the call is written otherwise (another key order:
 * it is then read whole at the end). */
static const char *call_head(const api_gen_request *r, const char *s, size_t n, size_t *args_at) {
    size_t i = 0;
#define SKIP_WS() while (i < n && strchr(" \t\r\n", s[i])) i++
    SKIP_WS();
    if (!lit_at(s, n, &i, "{")) return NULL;
    SKIP_WS();
    if (!lit_at(s, n, &i, "\"name\"")) return NULL;
    SKIP_WS();
    if (!lit_at(s, n, &i, ":")) return NULL;
    SKIP_WS();
    if (!lit_at(s, n, &i, "\"")) return NULL;
    size_t name_at = i;
    while (i < n && s[i] != '"' && s[i] != '\\') i++;
    if (i >= n || s[i] != '"') return NULL;
    size_t name_len = i++ - name_at;
    const char *tool = NULL;
    for (size_t t = 0; t < json_array_size(r->tools) && !tool; t++) {
        const char *name = tool_name_at(r, t);
        if (name && strlen(name) == name_len && !memcmp(name, s + name_at, name_len)) tool = name;
    }
    if (!tool) return NULL;
    SKIP_WS();
    if (!lit_at(s, n, &i, ",")) return NULL;
    SKIP_WS();
    if (!lit_at(s, n, &i, "\"arguments\"") && !lit_at(s, n, &i, "\"parameters\"")) return NULL;
    SKIP_WS();
    if (!lit_at(s, n, &i, ":")) return NULL;
    SKIP_WS();
#undef SKIP_WS
    if (i >= n || s[i] != '{') return NULL;
    *args_at = i;
    return tool;
}

/* The call in one JSON text, or NULL when it is not one of the tools. Its
 * arguments are the text the model wrote (what a stream sent as it came), or,
 * written in another shape, the object as parsed. */
static json_t *one_call(const api_gen_request *r, const char *s, size_t n) {
    json_t *v = json_loadb(s, n, 0, NULL);
    json_t *name = json_object_get(v, "name"), *args = json_object_get(v, "arguments");
    if (!args) args = json_object_get(v, "parameters");
    json_t *call = NULL;
    size_t i;
    json_t *tool;
    if (json_is_string(name) && json_is_object(args))
        json_array_foreach(r->tools, i, tool)
            if (!strcmp(json_string_value(json_object_get(json_object_get(tool, "function"), "name")),
                        json_string_value(name))) {
                size_t at = 0, len = 0;
                int whole = 0;
                const char *head = call_head(r, s, n, &at);
                if (head && !strcmp(head, json_string_value(name))) len = json_value_extent(s + at, n - at, &whole);
                json_t *raw = whole ? json_loadb(s + at, len, 0, NULL) : NULL;
                if (raw && json_equal(raw, args)) {
                    call = call_json(head, s + at, len);
                } else {
                    char *a = json_dumps(args, JSON_COMPACT);
                    call = a ? call_json(json_string_value(name), a, strlen(a)) : NULL;
                    free(a);
                }
                json_decref(raw);
                break;
            }
    json_decref(v);
    return call;
}

const char *api_forced_call_progress(const api_gen_request *r, const char *text, size_t len, size_t *args_at,
                                     size_t *args_len, int *whole) {
    if (!r->tools || (r->tool_choice != TOOL_CHOICE_REQUIRED && r->tool_choice != TOOL_CHOICE_NAMED)) return NULL;
    enum tool_format f = format_of(r->tool_format);
    for (size_t i = 0; i < json_array_size(r->tools); i++) {
        const char *name = tool_name_at(r, i);
        char *prefix = name ? call_prefix(f, name) : NULL;
        if (!prefix) continue;
        size_t np = strlen(prefix);
        int sure = len >= np && !memcmp(text, prefix, np);
        free(prefix);
        if (!sure) continue;
        *args_at = np;
        *args_len = json_value_extent(text + np, len - np, whole);
        return name;
    }
    return NULL;
}

const char *api_call_progress(const api_gen_request *r, const char *text, size_t len, size_t *args_at,
                              size_t *args_len, int *whole) {
    const char *forced = api_forced_call_progress(r, text, len, args_at, args_len, whole);
    if (forced || !r->tools || r->tool_choice != TOOL_CHOICE_AUTO) return forced;
    size_t from = 0; /* chatml: the first <tool_call>; llama3: the answer is the call */
    if (format_of(r->tool_format) == FORMAT_CHATML) {
        static const char OPEN[] = "<tool_call>";
        const char *a = memmem(text, len, OPEN, sizeof OPEN - 1);
        if (!a) return NULL;
        from = (size_t)(a - text) + sizeof OPEN - 1;
    }
    size_t at;
    const char *name = call_head(r, text + from, len - from, &at);
    if (!name) return NULL;
    *args_at = from + at;
    *args_len = json_value_extent(text + *args_at, len - *args_at, whole);
    return name;
}

json_t *api_find_tool_calls(const api_gen_request *r, const char *text, size_t len, char **content) {
    *content = NULL;
    if (!r->tools || r->tool_choice == TOOL_CHOICE_NONE) return NULL;
    size_t at, n;
    int whole;
    const char *forced = api_forced_call_progress(r, text, len, &at, &n, &whole);
    if (forced && whole) { /* its arguments as written (what a stream sent as it came) */
        json_t *calls = json_array();
        json_array_append_new(calls, call_json(forced, text + at, n));
        return calls;
    }
    json_t *calls = json_array();
    textbuf rest = {0};
    int cut_off = 0;
    if (format_of(r->tool_format) == FORMAT_CHATML) {
        static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";
        const char *p = text, *end = text + len;
        while (p < end) {
            const char *a = strstr(p, OPEN);
            if (!a || a >= end) {
                put(&rest, p, (size_t)(end - p));
                break;
            }
            put(&rest, p, (size_t)(a - p));
            const char *body = a + sizeof OPEN - 1, *b = strstr(body, CLOSE);
            int closed = b && b <= end;
            if (!closed) b = end, cut_off = 1; /* max_tokens ended the answer inside the call */
            json_t *call = one_call(r, body, (size_t)(b - body));
            if (call) json_array_append_new(calls, call);
            else if (closed) put(&rest, a, (size_t)(b - a)); /* not a call after all: it stays text */
            p = closed ? b + sizeof CLOSE - 1 : end; /* (a call cut open is no one's text) */
        }
    } else {
        json_t *call = one_call(r, text, len);
        if (call) json_array_append_new(calls, call);
        else put(&rest, text, len);
    }
    if (!json_array_size(calls) && !(cut_off && r->tool_choice == TOOL_CHOICE_AUTO)) { /* (a forced one: api_cut_tool_call) */
        free(rest.p);
        json_decref(calls);
        return NULL;
    }
    while (json_array_size(calls) > 1 && !r->parallel_tool_calls) json_array_remove(calls, json_array_size(calls) - 1);
    /* what is left around the calls, without surrounding whitespace, nor the start of a
       further call's tag that max_tokens cut ("<tool") */
    size_t a = 0, b = rest.n;
    if (format_of(r->tool_format) == FORMAT_CHATML)
        for (size_t k = sizeof "<tool_call>" - 2; k > 0; k--)
            if (b >= k && !memcmp(rest.p + b - k, "<tool_call>", k)) {
                b -= k;
                break;
            }
    while (a < b && strchr(" \t\r\n", rest.p[a])) a++;
    while (b > a && strchr(" \t\r\n", rest.p[b - 1])) b--;
    if (b > a) *content = strndup(rest.p + a, b - a);
    free(rest.p);
    return calls;
}

size_t api_tool_text_ready(const api_gen_request *r, const char *text, size_t len) {
    if (!r->tools || r->tool_choice != TOOL_CHOICE_AUTO) return 0;
    size_t lead = 0, ready = len;
    while (lead < len && strchr(" \t\r\n", text[lead])) lead++;
    if (format_of(r->tool_format) == FORMAT_CHATML) {
        static const char OPEN[] = "<tool_call>";
        const char *a = memmem(text, len, OPEN, sizeof OPEN - 1);
        if (a) {
            ready = (size_t)(a - text);
        } else { /* the end may be the start of the tag */
            for (size_t k = sizeof OPEN - 2; k > 0; k--)
                if (len >= k && !memcmp(text + len - k, OPEN, k)) {
                    ready = len - k;
                    break;
                }
        }
    } else if (lead == len || text[lead] == '{') { /* llama3: a call is the whole answer, a JSON object */
        return 0;
    }
    while (ready > lead && strchr(" \t\r\n", text[ready - 1])) ready--; /* a call after it would trim it */
    return ready > lead ? ready : 0;
}

json_t *api_cut_tool_call(const api_gen_request *r, const char *text, size_t len) {
    if (!r->tools || (r->tool_choice != TOOL_CHOICE_REQUIRED && r->tool_choice != TOOL_CHOICE_NAMED)) return NULL;
    json_t *calls = json_array();
    size_t at, n;
    int whole;
    const char *sure = api_forced_call_progress(r, text, len, &at, &n, &whole);
    if (sure) { /* the arguments as far as they came */
        json_array_append_new(calls, call_json(sure, text + at, n));
        return calls;
    }
    enum tool_format f = format_of(r->tool_format);
    const char *only = NULL;
    int callable = 0; /* cut before the arguments: the tools whose call starts so */
    for (size_t i = 0; i < json_array_size(r->tools); i++) {
        const char *name = tool_name_at(r, i);
        char *prefix = name ? call_prefix(f, name) : NULL;
        if (prefix && !memcmp(text, prefix, len < strlen(prefix) ? len : strlen(prefix))) {
            callable++;
            only = name;
        }
        free(prefix);
    }
    if (callable == 1) json_array_append_new(calls, call_json(only, "", 0));
    return calls;
}
