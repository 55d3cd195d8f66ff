/* Value parsers shared by every place settings come from, and the settings of
 * `potserve serve`: one table describes every setting, and the defaults, the
 * JSON file's keys, the POTSERVE_* variables, the flags and the help are all
 * derived from it. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h" /* the policies' names */
#include "engine/recall.h" /* recall_bytes' default */

/* Whether text is written the plain decimal way: an optional sign, then a
 * digit or a point (strtoll and strtod also take leading whitespace, and
 * strtod hexadecimal, "0x10"). */
static int plain_decimal(const char *text) {
    const char *t = text + (*text == '-' || *text == '+');
    return isdigit((unsigned char)t[0]) || (t[0] == '.' && isdigit((unsigned char)t[1]));
}

int config_parse_int(const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out,
                     char *err, size_t errlen) {
    char *end;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || !plain_decimal(text)) {
        snprintf(err, errlen, "%s: '%s' is not an integer", name, text ? text : "");
        return -1;
    }
    if (v < lo || v > hi) {
        snprintf(err, errlen, "%s: %lld is out of range [%lld, %lld]", name, v, (long long)lo,
                 (long long)hi);
        return -1;
    }
    *out = v;
    return 0;
}

int config_parse_float(const char *name, const char *text, double lo, double hi, double *out,
                       char *err, size_t errlen) {
    char *end;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || *end || errno || !isfinite(v) || !plain_decimal(text) || strpbrk(text, "xX")) {
        snprintf(err, errlen, "%s: '%s' is not a number", name, text ? text : "");
        return -1;
    }
    if (v < lo || v > hi) {
        snprintf(err, errlen, "%s: %g is out of range [%g, %g]", name, v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

#define KIB ((int64_t)1 << 10)
#define MIB ((int64_t)1 << 20)
#define GIB ((int64_t)1 << 30)

/* Writes a byte count as the largest exact suffix: 1048576 -> "1M". */
static void format_bytes(int64_t v, char *buf, size_t len) {
    if (v != 0 && v % GIB == 0)
        snprintf(buf, len, "%" PRId64 "G", v / GIB);
    else if (v != 0 && v % MIB == 0)
        snprintf(buf, len, "%" PRId64 "M", v / MIB);
    else if (v != 0 && v % KIB == 0)
        snprintf(buf, len, "%" PRId64 "K", v / KIB);
    else
        snprintf(buf, len, "%" PRId64, v);
}

int config_parse_bytes(const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out,
                       char *err, size_t errlen) {
    static const struct {
        const char *suffix;
        int64_t mult;
    } suffixes[] = {{"", 1},       {"k", KIB},   {"kb", KIB}, {"kib", KIB}, {"m", MIB},
                    {"mb", MIB},   {"mib", MIB}, {"g", GIB},  {"gb", GIB},  {"gib", GIB}};
    const char *t = text ? text : "";
    /* Only digits with an optional '-' (so "-1" is reported as out of range). */
    if (!(isdigit((unsigned char)t[0]) || (t[0] == '-' && isdigit((unsigned char)t[1])))) {
        snprintf(err, errlen,
                 "%s: '%s' is not a byte size (an integer with an optional K, M or G suffix)", name,
                 t);
        return -1;
    }
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    int64_t mult = 0;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (!strcasecmp(end, suffixes[i].suffix)) mult = suffixes[i].mult;
    if (!mult) {
        snprintf(err, errlen,
                 "%s: '%s' is not a byte size (an integer with an optional K, M or G suffix)", name,
                 t);
        return -1;
    }
    int overflow = errno == ERANGE || (v > 0 && v > INT64_MAX / mult) ||
                   (v < 0 && v < INT64_MIN / mult);
    if (overflow || v * mult < lo || v * mult > hi) {
        char los[32], his[32];
        format_bytes(lo, los, sizeof los);
        format_bytes(hi, his, sizeof his);
        snprintf(err, errlen, "%s: '%s' is out of range [%s, %s]", name, t, los, his);
        return -1;
    }
    *out = v * mult;
    return 0;
}

/* --- the settings table ------------------------------------------------------ */

typedef enum { T_STRING, T_INT, T_FLOAT, T_BOOL, T_BYTES, T_ENUM } setting_type;

typedef struct {
    const char *name;            /* the struct field; the file key, flag and variable derive */
    setting_type type;
    size_t offset;               /* offsetof(server_config, name) */
    const char *def;             /* the default, as text any source could give */
    int64_t lo, hi;              /* T_INT, T_BYTES; T_STRING: lo, a least length when not "" */
    double flo, fhi;             /* T_FLOAT */
    const char *const *allowed;  /* T_ENUM: NULL-terminated */
    const char *help;
} setting;

/* offsetof(server_config, f), failing to compile when the field is not of type T
 * (comparing distinct pointer types is diagnosed, an error under -Werror). */
#define FIELD(f, T) (offsetof(server_config, f) + 0 * sizeof(&((server_config *)0)->f == (T *)0))

#define S_STRING(f, def, help) {#f, T_STRING, FIELD(f, char *), def, 0, 0, 0, 0, NULL, help}
#define S_INT(f, def, lo, hi, help) {#f, T_INT, FIELD(f, int64_t), def, lo, hi, 0, 0, NULL, help}
#define S_BYTES(f, def, lo, hi, help) \
    {#f, T_BYTES, FIELD(f, int64_t), def, lo, hi, 0, 0, NULL, help}
#define S_FLOAT(f, def, lo, hi, help) {#f, T_FLOAT, FIELD(f, double), def, 0, 0, lo, hi, NULL, help}
#define S_BOOL(f, def, help) {#f, T_BOOL, FIELD(f, int), def, 0, 0, 0, 0, NULL, help}
#define S_ENUM(f, def, values, help) {#f, T_ENUM, FIELD(f, char *), def, 0, 0, 0, 0, values, help}

static const char *const backend_values[] = {"cpu", "cuda", NULL};
static const char *const durability_values[] = {"fsync", "none", NULL};
static const char *const reread_share_values[] = {"rows", "pots", NULL};
static const char *const recall_values[] = {"auto", "true", "false", NULL}; /* api_recall_from_name */
static const char *const recall_order_values[] = {"best-last", "document", NULL}; /* recall_order_named */
static const char *const policy_values[] = {POT_POLICIES(POT_NAME_ENTRY_, ) NULL}; /* cache/'s list */

static const setting settings[] = {
    S_STRING(host, "127.0.0.1", "listen address"),
    S_INT(port, "8080", 0, 65535, "listen port, 0 = any free port (printed)"),
    S_STRING(model, "models/SmolLM2-135M-Instruct.Q4_1.gguf", "GGUF model file"),
    S_STRING(data_dir, "data", "directory of the sessions' logs and snapshots"),
    S_ENUM(backend, "cpu", backend_values, "compute backend"),
    S_INT(threads, "0", 0, 1024, "compute threads, 0 = all online CPUs"),
    S_STRING(chat_template, "", "chat template family, \"\" = the model's"),
    {"api_key", T_STRING, FIELD(api_key, char *), "", 8, 0, 0, 0, NULL,
     "one accepted API key (8 characters or more), \"\" = none"},
    S_STRING(api_keys_file, "", "file of keys: one a line, then optional name; # comments"),
    S_ENUM(durability, "fsync", durability_values, "fsync logs before answering, or not"),
    S_BYTES(max_chunk_bytes, "256M", 1, INT64_MAX, "largest upload body (else 413)"),
    S_BYTES(upload_buffer_bytes, "64M", 0, INT64_MAX,
            "bytes all uploads read ahead of the engine (a wait=false 202 once durable)"),
    S_BYTES(max_body_bytes, "16M", 1, INT64_MAX, "largest JSON request body (else 413)"),
    /* libmicrohttpd gives every connection this much memory: a cap keeps it sane */
    S_BYTES(max_header_bytes, "16K", 1, MIB, "largest request line + headers (at most 1M)"),
    S_INT(max_connections, "256", 1, 100000, "open connections at most"),
    S_INT(max_connections_per_ip, "64", 1, 100000, "open connections from one address at most"),
    S_FLOAT(rate_limit, "0", 0, 1e6, "requests per second per key, 0 = off"),
    S_INT(rate_burst, "20", 1, 1000000, "bucket size of rate_limit"),
    S_INT(max_sessions_per_key, "64", 1, 1000000, "sessions one key may hold"),
    S_BYTES(pot_memory_limit, "1G", MIB, INT64_MAX, "bytes of all pots together (else 429)"),
    S_BOOL(page_out_idle, "true", "at pot_memory_limit, idle sessions' pots go to their snapshots (read back when asked)"),
    /* each answer decodes in its own copy of up to a model window: this bounds their memory */
    S_INT(max_answers, "16", 1, 1024, "answers generated at once (each choice one); more wait their turn"),
    S_INT(idle_timeout, "30", 1, 86400, "seconds a connection may be silent"),
    S_INT(connection_timeout, "3600", 0, 86400, "seconds a connection may live (closed between requests), 0 = no limit"),
    S_INT(request_timeout, "600", 0, 86400, "seconds one generation request may take, 0 = no limit"),
    S_INT(shutdown_grace, "30", 0, 3600, "seconds a SIGTERM drain waits for open requests"),
    S_INT(budget_tokens, "2048", 16, 1048576, "pot budget of new sessions"),
    S_ENUM(policy, "infinipot", policy_values, "policy of new sessions"),
    S_ENUM(reread_share, "pots", reread_share_values, "questions sharing a re-read: one pot (rows) or one each"),
    S_INT(reread_share_limit, "8", 1, 32, "questions one re-read pass takes at most"),
    S_INT(reread_gather_ms, "100", 0, 60000, "ms a re-read waits for other questions to share it"),
    S_ENUM(recall, "auto", recall_values,
           "passages before questions: auto = once a session's pot dropped text"),
    S_INT(recall_bytes, "4096", 1, 1048576, /* RECALL_DEFAULT_BYTES and RECALL_MAX_BYTES, checked below */
          "bytes of passages a recall puts before a question"),
    S_ENUM(recall_order, "best-last", recall_order_values,
           "recalled passages: the best last, or in document order"),
    S_BYTES(snapshot_bytes, "4M", 0, INT64_MAX, "snapshot a pot after this many new bytes"),
    S_INT(snapshot_seconds, "60", 0, 86400, "or after this many seconds of reading since the last, 0 = off"),
    S_BOOL(access_log, "true", "one JSON line per request on stderr"),
    S_INT(prompt_cache_entries, "4", 0, 64, "recent sessionless prompts whose KV is reused, 0 = off"),
    S_BYTES(prompt_cache_bytes, "64M", 0, INT64_MAX, "prompt cache budget, part of pot_memory_limit"),
    S_BYTES(response_store_bytes, "16M", 0, INT64_MAX, "kept /v1/responses answers (a Redis store shares them), 0 = off"),
    S_STRING(store, "dir", "session store: dir, or redis://host:port/db shared by replicas"),
    S_STRING(replica_name, "", "this replica's name in a shared store's leases, \"\" = hostname:port"),
    S_INT(lease_ms, "3000", 300, 600000, "ms a shared store's session lease lasts unrenewed"),
    S_STRING(cors_origins, "", "CORS: allowed origins, comma-separated, * = any, \"\" = off"),
    S_STRING(allowed_hosts, "", "Host names a keyless server on loopback answers besides localhost and IPs (, * = any)"),
};
enum { N_SETTINGS = sizeof settings / sizeof settings[0] };
_Static_assert(RECALL_DEFAULT_BYTES == 4096 && RECALL_MAX_BYTES == 1048576,
               "recall_bytes' default and range above are engine/recall.h's");

#define FIELD_PTR(c, s, T) ((T *)(void *)((char *)(c) + (s)->offset))

/* Does `key` (n bytes, '-' taken as '_') spell the setting's name? */
static int name_matches(const setting *s, const char *key, size_t n) {
    if (strlen(s->name) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if ((key[i] == '-' ? '_' : key[i]) != s->name[i]) return 0;
    return 1;
}

static const setting *find_setting(const char *key, size_t n) {
    for (int i = 0; i < N_SETTINGS; i++)
        if (name_matches(&settings[i], key, n)) return &settings[i];
    return NULL;
}

/* Does `var` (n bytes, after "POTSERVE_") spell the setting's name in upper case? */
static int env_matches(const setting *s, const char *var, size_t n) {
    if (strlen(s->name) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (var[i] != toupper((unsigned char)s->name[i])) return 0;
    return 1;
}

static void env_name(const setting *s, char *buf, size_t len) {
    size_t n = snprintf(buf, len, "POTSERVE_%s", s->name);
    for (size_t i = 0; i < n && i < len; i++) buf[i] = (char)toupper((unsigned char)buf[i]);
}

static void flag_name(const setting *s, char *buf, size_t len) {
    size_t n = snprintf(buf, len, "--%s", s->name);
    for (size_t i = 0; i < n && i < len; i++)
        if (buf[i] == '_') buf[i] = '-';
}

static int parse_bool(const char *text, int *out) {
    static const char *const yes[] = {"true", "1", "yes", "on"}, *const no[] = {"false", "0", "no",
                                                                                "off"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (!strcasecmp(text, yes[i])) return *out = 1, 0;
        if (!strcasecmp(text, no[i])) return *out = 0, 0;
    }
    return -1;
}

/* Sets setting s of c from text; `label` names the setting and its source. */
static int set_value(server_config *c, const setting *s, const char *text, const char *label,
                     char *err, size_t errlen) {
    switch (s->type) {
    case T_STRING:
    case T_ENUM: {
        if (s->type == T_ENUM) {
            int ok = 0;
            for (int i = 0; s->allowed[i]; i++) ok |= !strcmp(text, s->allowed[i]);
            if (!ok) {
                char list[256] = "";
                size_t n = 0;
                for (int i = 0; s->allowed[i] && n < sizeof list; i++)
                    n += snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                                  s->allowed[i]);
                snprintf(err, errlen, "%s: '%s' is not one of %s", label, text, list);
                return -1;
            }
        }
        if (s->type == T_STRING && s->lo && *text && strlen(text) < (size_t)s->lo) { /* (lo: a least length) */
            snprintf(err, errlen, "%s: must be at least %lld characters, or \"\" for none", label, (long long)s->lo);
            return -1;
        }
        char *copy = strdup(text);
        if (!copy) {
            snprintf(err, errlen, "%s: out of memory", label);
            return -1;
        }
        char **field = FIELD_PTR(c, s, char *);
        free(*field);
        *field = copy;
        return 0;
    }
    case T_INT:
        return config_parse_int(label, text, s->lo, s->hi, FIELD_PTR(c, s, int64_t), err, errlen);
    case T_BYTES:
        return config_parse_bytes(label, text, s->lo, s->hi, FIELD_PTR(c, s, int64_t), err,
                                  errlen);
    case T_FLOAT:
        return config_parse_float(label, text, s->flo, s->fhi, FIELD_PTR(c, s, double), err,
                                  errlen);
    case T_BOOL:
        if (parse_bool(text, FIELD_PTR(c, s, int))) {
            snprintf(err, errlen,
                     "%s: '%s' is not a boolean (true, false, 1, 0, yes, no, on, off)", label,
                     text);
            return -1;
        }
        return 0;
    }
    snprintf(err, errlen, "%s: unknown setting type", label);
    return -1;
}

void config_defaults(server_config *c) {
    memset(c, 0, sizeof *c);
    char err[256];
    for (int i = 0; i < N_SETTINGS; i++) {
        if (set_value(c, &settings[i], settings[i].def, settings[i].name, err, sizeof err)) {
            /* Only a broken table entry or a failed strdup gets here. */
            fprintf(stderr, "config_defaults: %s\n", err);
            abort();
        }
    }
}

void config_free(server_config *c) {
    for (int i = 0; i < N_SETTINGS; i++) {
        if (settings[i].type != T_STRING && settings[i].type != T_ENUM) continue;
        char **field = FIELD_PTR(c, &settings[i], char *);
        free(*field);
        *field = NULL;
    }
}

/* --- sources ---------------------------------------------------------------- */

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Sets setting s from a JSON value: a string is parsed as any source's text;
 * numbers are accepted where the setting is not a string, and true/false for
 * booleans and names (`recall`: auto, true, false), formatted as text and
 * parsed the same way. */
static int set_json(server_config *c, const setting *s, json_t *v, const char *label, char *err,
                    size_t errlen) {
    int textual = s->type == T_STRING || s->type == T_ENUM;
    char buf[64];
    if (json_is_string(v)) return set_value(c, s, json_string_value(v), label, err, errlen);
    if (!textual && json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return set_value(c, s, buf, label, err, errlen);
    }
    if (!textual && json_is_real(v)) {
        snprintf(buf, sizeof buf, "%.17g", json_real_value(v));
        return set_value(c, s, buf, label, err, errlen);
    }
    if ((s->type == T_BOOL || s->type == T_ENUM) && json_is_boolean(v))
        return set_value(c, s, json_is_true(v) ? "true" : "false", label, err, errlen);
    snprintf(err, errlen, "%s: expected %s, got %s", label,
             textual ? "a string"
             : s->type == T_BOOL ? "true, false or a string"
                                 : "a number or a string",
             json_type_name(v));
    return -1;
}

static int load_file(server_config *c, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "config file %s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    /* read whole (at most 1 MiB: a settings file is small, /dev/zero is not) and parsed with its length, so
       that a NUL byte does not end the text early; a directory opens, its read says why not */
    enum { CONFIG_MAX_BYTES = 1 << 20 };
    char *text = malloc(CONFIG_MAX_BYTES + 1);
    size_t n = text ? fread(text, 1, CONFIG_MAX_BYTES + 1, f) : 0;
    int read_errno = ferror(f) ? errno : 0;
    fclose(f);
    if (!text || read_errno || n > CONFIG_MAX_BYTES) {
        snprintf(err, errlen, "config file %s: %s", path,
                 !text ? "out of memory" : read_errno ? strerror(read_errno) : "larger than 1 MiB");
        free(text);
        return -1;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) {
        snprintf(err, errlen, "config file %s: line %d column %d: %s", path, jerr.line,
                 jerr.column, jerr.text);
        return -1;
    }
    int rc = 0;
    if (!json_is_object(root)) {
        snprintf(err, errlen, "config file %s: expected a JSON object, got %s", path,
                 json_type_name(root));
        rc = -1;
    }
    const char *key;
    json_t *v;
    unsigned char seen[N_SETTINGS] = {0}; /* "budget_tokens" and "budget-tokens" are one setting */
    json_object_foreach(root, key, v) {
        if (rc) break;
        char label[512];
        snprintf(label, sizeof label, "config file %s: %s", path, key);
        const setting *s = find_setting(key, strlen(key));
        if (!s) {
            snprintf(err, errlen, "%s: unknown setting", label);
            rc = -1;
        } else if (seen[s - settings]++) {
            snprintf(err, errlen, "%s: %s is given twice", label, s->name);
            rc = -1;
        } else {
            rc = set_json(c, s, v, label, err, errlen);
        }
    }
    json_decref(root);
    return rc;
}

/* The value of "POTSERVE_CONFIG" in envp (the last one), or NULL. */
static const char *env_config(char *const *envp) {
    const char *path = NULL;
    for (int i = 0; envp && envp[i]; i++)
        if (!strncmp(envp[i], "POTSERVE_CONFIG=", 16)) path = envp[i] + 16;
    return path;
}

static int load_env(server_config *c, char *const *envp, char *err, size_t errlen) {
    for (int i = 0; envp && envp[i]; i++) {
        const char *var = envp[i], *eq = strchr(var, '=');
        if (!eq || strncmp(var, "POTSERVE_", 9)) continue;
        const char *name = var + 9;
        size_t n = (size_t)(eq - name);
        for (int k = 0; k < N_SETTINGS; k++) {
            if (!env_matches(&settings[k], name, n)) continue;
            char label[128];
            snprintf(label, sizeof label, "%.*s", (int)(eq - var), var);
            if (set_value(c, &settings[k], eq + 1, label, err, errlen)) return -1;
        }
    }
    return 0;
}

enum { FLAG_SETTING, FLAG_CONFIG, FLAG_HELP };

typedef struct {
    int kind;
    const setting *s;  /* FLAG_SETTING */
    const char *value; /* FLAG_SETTING, FLAG_CONFIG */
    char label[128];   /* the flag as given, without "=VALUE" */
} flag_token;

/* Reads the flag at argv[*i] into t and moves *i past it and its value. */
static int next_flag(int argc, char **argv, int *i, flag_token *t, char *err, size_t errlen) {
    const char *arg = argv[*i];
    (*i)++;
    memset(t, 0, sizeof *t);
    if (!strcmp(arg, "-h")) {
        t->kind = FLAG_HELP;
        return 0;
    }
    /* the short spellings every other potserve command knows */
    static const struct { const char *shrt, *name; } aliases[] = {{"-m", "model"}, {"-t", "threads"}};
    for (size_t a = 0; a < sizeof aliases / sizeof *aliases; a++)
        if (!strcmp(arg, aliases[a].shrt)) {
            t->kind = FLAG_SETTING;
            t->s = find_setting(aliases[a].name, strlen(aliases[a].name));
            snprintf(t->label, sizeof t->label, "%s", arg);
            if (*i >= argc) {
                snprintf(err, errlen, "%s: missing value", arg);
                return -1;
            }
            t->value = argv[(*i)++];
            return 0;
        }
    if (strncmp(arg, "--", 2) || !arg[2]) {
        snprintf(err, errlen, "'%s': unexpected argument (settings are given as --name VALUE)",
                 arg);
        return -1;
    }
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    snprintf(t->label, sizeof t->label, "--%.*s", (int)(n < 100 ? n : 100), name);
    int negated = 0;
    if (n == 4 && !strncmp(name, "help", 4)) {
        t->kind = FLAG_HELP;
    } else if (n == 6 && !strncmp(name, "config", 6)) {
        t->kind = FLAG_CONFIG;
    } else if ((t->s = find_setting(name, n))) {
        t->kind = FLAG_SETTING;
    } else if (n > 3 && (!strncmp(name, "no-", 3) || !strncmp(name, "no_", 3)) &&
               (t->s = find_setting(name + 3, n - 3)) && t->s->type == T_BOOL) {
        t->kind = FLAG_SETTING;
        negated = 1;
    } else {
        snprintf(err, errlen, "%s: unknown flag (see --help)", t->label);
        return -1;
    }
    if (t->kind == FLAG_HELP || negated) {
        if (eq) {
            snprintf(err, errlen, "%s: takes no value", t->label);
            return -1;
        }
        t->value = negated ? "false" : NULL;
        return 0;
    }
    if (eq) {
        t->value = eq + 1;
    } else if (t->kind == FLAG_SETTING && t->s->type == T_BOOL) {
        /* A bare boolean flag means true; a following word not starting with '-' is its value. */
        t->value = *i < argc && argv[*i][0] != '-' ? argv[(*i)++] : "true";
    } else if (*i < argc && strncmp(argv[*i], "--", 2)) {
        t->value = argv[(*i)++];
    } else {
        snprintf(err, errlen, "%s: missing value", t->label);
        return -1;
    }
    if (t->kind == FLAG_CONFIG && !*t->value) {
        snprintf(err, errlen, "%s: missing file name", t->label);
        return -1;
    }
    return 0;
}

static int load(server_config *c, int argc, char **argv, char *const *envp, char *err,
                size_t errlen) {
    flag_token t;
    /* First pass: the flags' shape, --help and --config; nothing is set yet. */
    const char *config = NULL;
    char config_label[128] = "";
    for (int i = 1; i < argc;) {
        if (next_flag(argc, argv, &i, &t, err, errlen)) return -1;
        if (t.kind == FLAG_HELP) return 1;
        if (t.kind == FLAG_CONFIG) {
            config = t.value;
            snprintf(config_label, sizeof config_label, "%s", t.label);
        }
    }
    if (!config) {
        config = env_config(envp);
        if (config && !*config) config = NULL;
    }
    if (config && load_file(c, config, err, errlen)) return -1;
    if (load_env(c, envp, err, errlen)) return -1;
    for (int i = 1; i < argc;) {
        if (next_flag(argc, argv, &i, &t, err, errlen)) return -1;
        if (t.kind == FLAG_SETTING && set_value(c, t.s, t.value, t.label, err, errlen)) return -1;
    }
    return 0;
}

int config_load(server_config *c, int argc, char **argv, char *const *envp, char *err,
                size_t errlen) {
    if (err && errlen) err[0] = '\0';
    int rc = load(c, argc, argv, envp, err, errlen);
    /* One line whatever the input held: control characters become '?'. */
    for (size_t i = 0; rc < 0 && err && i < errlen && err[i]; i++)
        if ((unsigned char)err[i] < 0x20 || err[i] == 0x7f) err[i] = '?';
    return rc;
}

/* --- help -------------------------------------------------------------------- */

static const char *metavar(const setting *s) {
    switch (s->type) {
    case T_STRING: return "TEXT";
    case T_INT: return "N";
    case T_FLOAT: return "X";
    case T_BYTES: return "BYTES";
    case T_BOOL: return "[BOOL]";
    case T_ENUM: return "NAME";
    }
    return "?";
}

/* The help line's note on the allowed values: "(0..65535)", "(cpu|cuda)". */
static void allowed_note(const setting *s, char *buf, size_t len) {
    char lo[32], hi[32];
    buf[0] = '\0';
    switch (s->type) {
    case T_INT:
        snprintf(buf, len, " (%" PRId64 "..%" PRId64 ")", s->lo, s->hi);
        break;
    case T_FLOAT:
        snprintf(buf, len, " (%g..%g)", s->flo, s->fhi);
        break;
    case T_BYTES:
        format_bytes(s->lo, lo, sizeof lo);
        format_bytes(s->hi, hi, sizeof hi);
        if (s->hi == INT64_MAX)
            snprintf(buf, len, " (>= %s)", lo);
        else
            snprintf(buf, len, " (%s..%s)", lo, hi);
        break;
    case T_ENUM: {
        size_t n = snprintf(buf, len, " (");
        for (int i = 0; s->allowed[i] && n < len; i++)
            n += snprintf(buf + n, len - n, "%s%s", i ? "|" : "", s->allowed[i]);
        if (n < len) snprintf(buf + n, len - n, ")");
        break;
    }
    default:
        break;
    }
}

void config_print_help(FILE *out) {
    char flag[80], env[80], flagarg[100], note[160];
    int wflag = (int)strlen("--config FILE"), wenv = (int)strlen("POTSERVE_CONFIG");
    for (int i = 0; i < N_SETTINGS; i++) {
        flag_name(&settings[i], flag, sizeof flag);
        env_name(&settings[i], env, sizeof env);
        int fl = (int)(strlen(flag) + 1 + strlen(metavar(&settings[i]))), el = (int)strlen(env);
        if (fl > wflag) wflag = fl;
        if (el > wenv) wenv = el;
    }
    fprintf(out, "usage: potserve serve [options]\n\n");
    fprintf(out,
            "Each setting is taken from, later winning: its default [shown in brackets], the\n"
            "JSON file named by --config FILE (or POTSERVE_CONFIG), the environment variable,\n"
            "the flag. Flags: --name VALUE or --name=VALUE ('-' or '_'); file keys are the\n"
            "names in snake_case. Byte sizes take K, M, G suffixes (or KB, KiB; powers of\n"
            "1024); booleans are true/false/1/0/yes/no/on/off, --name alone means true,\n"
            "--no-name false.\n\n");
    fprintf(out, "  %-*s  %-*s  %s\n", wflag, "--config FILE", wenv, "POTSERVE_CONFIG",
            "JSON object of settings");
    fprintf(out, "  %-*s  %-*s  %s\n", wflag, "--help, -h", wenv, "", "print this help");
    fprintf(out, "  %-*s  %-*s  %s\n", wflag, "-m PATH, -t N", wenv, "", "short for --model, --threads");
    for (int i = 0; i < N_SETTINGS; i++) {
        const setting *s = &settings[i];
        flag_name(s, flag, sizeof flag);
        snprintf(flagarg, sizeof flagarg, "%s %s", flag, metavar(s));
        env_name(s, env, sizeof env);
        allowed_note(s, note, sizeof note);
        fprintf(out, "  %-*s  %-*s  %s%s [%s]\n", wflag, flagarg, wenv, env, s->help, note,
                *s->def ? s->def : "\"\"");
    }
}
