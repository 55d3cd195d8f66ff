/* Settings of `potserve serve`: defaults, the layering defaults < JSON file <
 * environment < flags, every spelling of flags and values, every kind of error
 * (each naming the setting and its source), the help, and random garbage fed
 * as a config file and as values. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "config/config.h"
#include "engine/recall.h" /* recall_bytes' default */
#include "test.h"

/* Writes text (n bytes) to a fresh temporary file; its path goes to path[64]. */
static void write_temp(char path[64], const char *text, size_t n) {
    snprintf(path, 64, "/tmp/potserve_cfg_XXXXXX");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK_EQ_INT(write(fd, text, n), (long long)n);
    close(fd);
}

/* Runs config_load over the defaults with argv (NULL-terminated, without
 * argv[0]) and envp (NULL-terminated or NULL). */
static int load(server_config *c, const char *const *args, const char *const *env, char *err,
                size_t errlen) {
    char *argv[64] = {"serve"};
    int argc = 1;
    for (int i = 0; args && args[i] && argc < 63; i++) argv[argc++] = (char *)args[i];
    config_defaults(c);
    return config_load(c, argc, argv, (char *const *)env, err, errlen);
}

static int contains(const char *s, const char *sub) { return s && sub && strstr(s, sub); }

#define CHECK_CONTAINS(s, sub)                                                            \
    do {                                                                                  \
        if (!contains((s), (sub))) {                                                      \
            test_failures++;                                                              \
            fprintf(stderr, "  %s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, \
                    (s), (sub));                                                          \
        }                                                                                 \
    } while (0)

TEST(config_defaults_match_header) {
    server_config c;
    config_defaults(&c);
    CHECK_STR(c.host, "127.0.0.1");
    CHECK_EQ_INT(c.port, 8080);
    CHECK_STR(c.model, "models/SmolLM2-135M-Instruct.Q4_1.gguf");
    CHECK_STR(c.data_dir, "data");
    CHECK_STR(c.backend, "cpu");
    CHECK_EQ_INT(c.threads, 0);
    CHECK_STR(c.chat_template, "");
    CHECK_STR(c.api_key, "");
    CHECK_STR(c.api_keys_file, "");
    CHECK_STR(c.durability, "fsync");
    CHECK_EQ_INT(c.max_chunk_bytes, 256LL << 20);
    CHECK_EQ_INT(c.max_body_bytes, 16LL << 20);
    CHECK_EQ_INT(c.max_header_bytes, 16LL << 10);
    CHECK_EQ_INT(c.max_connections, 256);
    CHECK_EQ_INT(c.max_connections_per_ip, 64);
    CHECK(c.rate_limit == 0);
    CHECK_EQ_INT(c.rate_burst, 20);
    CHECK_EQ_INT(c.max_sessions_per_key, 64);
    CHECK_EQ_INT(c.pot_memory_limit, 1LL << 30);
    CHECK_EQ_INT(c.idle_timeout, 30);
    CHECK_EQ_INT(c.connection_timeout, 3600);
    CHECK_EQ_INT(c.request_timeout, 600);
    CHECK_EQ_INT(c.budget_tokens, 2048);
    CHECK_STR(c.policy, "infinipot");
    CHECK_EQ_INT(c.snapshot_bytes, 4LL << 20);
    CHECK_EQ_INT(c.recall_bytes, RECALL_DEFAULT_BYTES);
    CHECK_STR(c.recall, "auto");
    CHECK_STR(c.recall_order, "best-last");
    CHECK_EQ_INT(recall_order_named(c.recall_order), RECALL_BEST_LAST);
    CHECK_EQ_INT(c.access_log, 1);
    /* No sources at all leave the defaults. */
    char err[256];
    char *argv[] = {"serve", NULL};
    CHECK_EQ_INT(config_load(&c, 1, argv, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(c.port, 8080);
    config_free(&c);
}

TEST(config_free_is_idempotent) {
    server_config c;
    memset(&c, 0, sizeof c);
    config_free(&c);
    config_defaults(&c);
    config_free(&c);
    CHECK(c.host == NULL && c.model == NULL && c.policy == NULL && c.backend == NULL);
    config_free(&c);
}

TEST(config_parse_bytes_suffixes) {
    static const struct {
        const char *text;
        int64_t want;
    } good[] = {
        {"0", 0},          {"1", 1},           {"1K", 1024},       {"1k", 1024},
        {"2KB", 2048},     {"3KiB", 3072},     {"256M", 256 << 20}, {"1mb", 1 << 20},
        {"5MiB", 5 << 20}, {"1G", 1LL << 30},  {"4gib", 4LL << 30}, {"3GB", 3LL << 30},
        {"8191G", 8191LL << 30}, {"9223372036854775807", INT64_MAX},
    };
    char err[256];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t v = -7;
        CHECK_EQ_INT(config_parse_bytes("x", good[i].text, 0, INT64_MAX, &v, err, sizeof err), 0);
        CHECK_EQ_INT(v, good[i].want);
    }
    static const char *const bad[] = {"",     "K",  "1T",  "1.5G", " 1", "1 K", "+1",
                                      "1KK",  "0x10", "1e3", "G1",  "-",   "1Bi", "1iB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = -7;
        CHECK_EQ_INT(config_parse_bytes("size", bad[i], 0, INT64_MAX, &v, err, sizeof err), -1);
        CHECK_EQ_INT(v, -7);
        CHECK_CONTAINS(err, "size: ");
        CHECK_CONTAINS(err, "not a byte size");
    }
    int64_t v = -7;
    static const char *const range[] = {"-1", "9223372036854775807K", "8589934592G",
                                        "99999999999999999999", "2G"};
    for (size_t i = 0; i < sizeof range / sizeof range[0]; i++) {
        CHECK_EQ_INT(config_parse_bytes("size", range[i], 0, 1LL << 30, &v, err, sizeof err), -1);
        CHECK_CONTAINS(err, "out of range [0, 1G]");
    }
    CHECK_EQ_INT(v, -7);
    CHECK_EQ_INT(config_parse_bytes("size", NULL, 0, 10, &v, err, sizeof err), -1);
}

TEST(config_layers_override_in_order) {
    char path[64];
    const char *json = "{\"port\": 1000, \"host\": \"0.0.0.0\", \"threads\": 3,"
                       " \"policy\": \"finch\", \"max_body_bytes\": \"2M\"}";
    write_temp(path, json, strlen(json));
    char cfg_env[96];
    snprintf(cfg_env, sizeof cfg_env, "POTSERVE_CONFIG=%s", path);
    char err[256] = "";
    server_config c;

    /* File only (via POTSERVE_CONFIG). */
    const char *env1[] = {cfg_env, NULL};
    CHECK_EQ_INT(load(&c, NULL, env1, err, sizeof err), 0);
    CHECK_EQ_INT(c.port, 1000);
    CHECK_STR(c.host, "0.0.0.0");
    CHECK_EQ_INT(c.threads, 3);
    CHECK_STR(c.policy, "finch");
    CHECK_EQ_INT(c.max_body_bytes, 2 << 20);
    CHECK_EQ_INT(c.budget_tokens, 2048); /* untouched */
    config_free(&c);

    /* Environment over the file. */
    const char *env2[] = {"PATH=/bin", cfg_env, "POTSERVE_PORT=2000", "POTSERVE_THREADS=4",
                          "POTSERVE_BUDGET_TOKENS=4096", NULL};
    CHECK_EQ_INT(load(&c, NULL, env2, err, sizeof err), 0);
    CHECK_EQ_INT(c.port, 2000);
    CHECK_EQ_INT(c.threads, 4);
    CHECK_EQ_INT(c.budget_tokens, 4096);
    CHECK_STR(c.host, "0.0.0.0");
    CHECK_STR(c.policy, "finch");
    config_free(&c);

    /* Flags over both; --config given as a flag too. */
    const char *args3[] = {"--config", path, "--port", "3000", "--policy=h2o", NULL};
    const char *env3[] = {"POTSERVE_PORT=2000", "POTSERVE_POLICY=snapkv", "POTSERVE_THREADS=4",
                          NULL};
    CHECK_EQ_INT(load(&c, args3, env3, err, sizeof err), 0);
    CHECK_EQ_INT(c.port, 3000);
    CHECK_STR(c.policy, "h2o");
    CHECK_EQ_INT(c.threads, 4);
    CHECK_STR(c.host, "0.0.0.0");
    config_free(&c);

    /* The --config flag wins over POTSERVE_CONFIG; flags override flags (last wins). */
    char other[64];
    const char *json2 = "{\"port\": 1111}";
    write_temp(other, json2, strlen(json2));
    char flag[96];
    snprintf(flag, sizeof flag, "--config=%s", other);
    const char *args4[] = {flag, "--threads", "7", "--threads=8", NULL};
    CHECK_EQ_INT(load(&c, args4, env1, err, sizeof err), 0);
    CHECK_EQ_INT(c.port, 1111);
    CHECK_STR(c.host, "127.0.0.1");
    CHECK_EQ_INT(c.threads, 8);
    config_free(&c);

    /* Unknown POTSERVE_* and other variables are ignored, even with bad values;
     * an empty POTSERVE_CONFIG means none. */
    const char *env5[] = {"POTSERVE_NOPE=1", "POTSERVE_=x", "POTSERVE_port=abc", "PORT=abc",
                          "POTSERVE_CONFIG=", "POTSERVE_PORTS=9", "POTSERVE_PORT", NULL};
    CHECK_EQ_INT(load(&c, NULL, env5, err, sizeof err), 0);
    CHECK_EQ_INT(c.port, 8080);
    config_free(&c);
    unlink(path);
    unlink(other);
}

TEST(config_flag_spellings) {
    char err[256] = "";
    server_config c;
    const char *a1[] = {"--max-chunk-bytes", "1K", "--max_body_bytes=2K", "--data-dir=/x=y",
                        "--api_key", "k-123456", "--chat-template=", "--rate-limit", "2.5",
                        "--max-sessions_per-key=9", NULL};
    CHECK_EQ_INT(load(&c, a1, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(c.max_chunk_bytes, 1024);
    CHECK_EQ_INT(c.max_body_bytes, 2048);
    CHECK_STR(c.data_dir, "/x=y");
    CHECK_STR(c.api_key, "k-123456");
    CHECK_STR(c.chat_template, "");
    CHECK(c.rate_limit == 2.5);
    CHECK_EQ_INT(c.max_sessions_per_key, 9);
    config_free(&c);
    /* A key has 8 characters or more: a shorter one is refused, named like any bad value. */
    const char *a3[] = {"--api-key", "k-1", NULL};
    CHECK_EQ_INT(load(&c, a3, NULL, err, sizeof err), -1);
    CHECK_CONTAINS(err, "--api-key: must be at least 8 characters");
    config_free(&c);
    /* A negative number is a value (then out of range), not a flag. */
    const char *a2[] = {"--port", "-1", NULL};
    CHECK_EQ_INT(load(&c, a2, NULL, err, sizeof err), -1);
    CHECK_CONTAINS(err, "--port: -1 is out of range [0, 65535]");
    config_free(&c);
}

TEST(config_bools) {
    static const struct {
        const char *word;
        int value;
    } words[] = {{"true", 1}, {"false", 0}, {"1", 1},   {"0", 0},     {"yes", 1}, {"no", 0},
                 {"on", 1},   {"off", 0},   {"TRUE", 1}, {"Off", 0}};
    char err[256] = "", flag[64], var[64];
    server_config c;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        snprintf(flag, sizeof flag, "--access-log=%s", words[i].word);
        const char *a1[] = {"--no-access-log", flag, NULL};
        CHECK_EQ_INT(load(&c, a1, NULL, err, sizeof err), 0);
        CHECK_EQ_INT(c.access_log, words[i].value);
        config_free(&c);
        const char *a2[] = {"--access_log", words[i].word, NULL};
        CHECK_EQ_INT(load(&c, a2, NULL, err, sizeof err), 0);
        CHECK_EQ_INT(c.access_log, words[i].value);
        config_free(&c);
        snprintf(var, sizeof var, "POTSERVE_ACCESS_LOG=%s", words[i].word);
        const char *env[] = {var, NULL};
        CHECK_EQ_INT(load(&c, NULL, env, err, sizeof err), 0);
        CHECK_EQ_INT(c.access_log, words[i].value);
        config_free(&c);
    }
    /* Bare flag = true, --no- = false, also before another flag. */
    const char *off[] = {"POTSERVE_ACCESS_LOG=off", NULL};
    const char *a3[] = {"--access-log", "--port", "1", NULL};
    CHECK_EQ_INT(load(&c, a3, off, err, sizeof err), 0);
    CHECK_EQ_INT(c.access_log, 1);
    CHECK_EQ_INT(c.port, 1);
    config_free(&c);
    const char *a4[] = {"--access-log", NULL};
    CHECK_EQ_INT(load(&c, a4, off, err, sizeof err), 0);
    CHECK_EQ_INT(c.access_log, 1);
    config_free(&c);
    const char *a5[] = {"--no-access-log", NULL};
    CHECK_EQ_INT(load(&c, a5, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(c.access_log, 0);
    config_free(&c);
    const char *a6[] = {"--no_access_log", "--port", "5", NULL};
    CHECK_EQ_INT(load(&c, a6, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(c.access_log, 0);
    config_free(&c);
    /* JSON booleans and strings. */
    char path[64];
    const char *j1 = "{\"access_log\": false}", *j2 = "{\"access-log\": \"on\"}";
    write_temp(path, j1, strlen(j1));
    const char *a7[] = {"--config", path, NULL};
    CHECK_EQ_INT(load(&c, a7, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(c.access_log, 0);
    config_free(&c);
    unlink(path);
    write_temp(path, j2, strlen(j2));
    CHECK_EQ_INT(load(&c, a7, off, err, sizeof err), 0);
    CHECK_EQ_INT(c.access_log, 0); /* the environment beats the file */
    config_free(&c);
    CHECK_EQ_INT(load(&c, a7, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(c.access_log, 1);
    config_free(&c);
    unlink(path);
}

TEST(config_json_values) {
    char path[64], err[256] = "";
    const char *json =
        "{\"max_chunk_bytes\": \"64K\", \"max-header-bytes\": 4096, \"snapshot_bytes\": 0,"
        " \"rate_limit\": 12.5, \"rate_burst\": \"30\", \"idle_timeout\": 5.0,"
        " \"pot_memory_limit\": \"2GiB\", \"backend\": \"cuda\", \"durability\": \"none\","
        " \"model\": \"m.gguf\", \"api_keys_file\": \"k.txt\", \"access_log\": 0,"
        " \"connection_timeout\": \"0\", \"request_timeout\": 86400, \"budget_tokens\": 16,"
        " \"max_connections\": 100000, \"chat_template\": \"chatml\", \"data_dir\": \"d\","
        " \"recall_bytes\": 1048576, \"recall\": false}";
    write_temp(path, json, strlen(json));
    const char *args[] = {"--config", path, NULL};
    server_config c;
    CHECK_EQ_INT(load(&c, args, NULL, err, sizeof err), 0);
    CHECK_EQ_INT(c.max_chunk_bytes, 64 << 10);
    CHECK_EQ_INT(c.max_header_bytes, 4096);
    CHECK_EQ_INT(c.snapshot_bytes, 0);
    CHECK(c.rate_limit == 12.5);
    CHECK_EQ_INT(c.rate_burst, 30);
    CHECK_EQ_INT(c.idle_timeout, 5);
    CHECK_EQ_INT(c.pot_memory_limit, 2LL << 30);
    CHECK_STR(c.backend, "cuda");
    CHECK_STR(c.durability, "none");
    CHECK_STR(c.model, "m.gguf");
    CHECK_STR(c.api_keys_file, "k.txt");
    CHECK_EQ_INT(c.access_log, 0);
    CHECK_EQ_INT(c.connection_timeout, 0);
    CHECK_EQ_INT(c.request_timeout, 86400);
    CHECK_EQ_INT(c.budget_tokens, 16);
    CHECK_EQ_INT(c.max_connections, 100000);
    CHECK_STR(c.chat_template, "chatml");
    CHECK_STR(c.data_dir, "d");
    CHECK_EQ_INT(c.recall_bytes, 1048576);
    CHECK_STR(c.recall, "false"); /* a JSON boolean for a name that is one */
    config_free(&c);
    unlink(path);
    /* Every policy name cache/ knows is accepted. */
    for (int i = 0; i < POLICY_COUNT_; i++) {
        char var[64];
        snprintf(var, sizeof var, "POTSERVE_POLICY=%s", pot_policy_name((enum pot_policy)i));
        const char *env[] = {var, NULL};
        CHECK_EQ_INT(load(&c, NULL, env, err, sizeof err), 0);
        CHECK_STR(c.policy, pot_policy_name((enum pot_policy)i));
        config_free(&c);
    }
}

/* One case of config_load expected to fail: `file` (when not NULL) is written
 * to a temp file passed with --config (its path replaces "@" in the expected
 * texts), and err must contain every one of want[]. */
typedef struct {
    const char *file;
    const char *args[6];
    const char *env[4];
    const char *want[3];
} error_case;

TEST(config_errors_name_setting_and_source) {
    static const error_case cases[] = {
        /* the file */
        {"{\"port\": 80,", {0}, {0}, {"config file @", "line 1"}},
        {"[1, 2]", {0}, {0}, {"config file @", "expected a JSON object, got an array"}},
        {"", {0}, {0}, {"config file @"}},
        {"{\"port\": 1, \"port\": 2}", {0}, {0}, {"config file @", "duplicate"}},
        {"{\"budget_tokens\": 100, \"budget-tokens\": 200}", {0}, {0}, {"budget_tokens is given twice"}},
        {"{\"budget_tokens\": \" 32\"}", {0}, {0}, {"budget_tokens: ' 32' is not an integer"}},
        {"{\"rate_limit\": \"0x10\"}", {0}, {0}, {"rate_limit: '0x10' is not a number"}},
        {"{\"port\": true}", {0}, {0}, {"config file @: port: expected a number or a string, got a boolean"}},
        {"{\"host\": 5}", {0}, {0}, {"config file @: host: expected a string, got a number"}},
        {"{\"policy\": null}", {0}, {0}, {"config file @: policy: expected a string, got null"}},
        {"{\"threads\": [1]}", {0}, {0}, {"config file @: threads:", "got an array"}},
        {"{\"access_log\": {}}", {0}, {0}, {"config file @: access_log: expected true, false or a string"}},
        {"{\"bogus\": 1}", {0}, {0}, {"config file @: bogus: unknown setting"}},
        {"{\"config\": \"x\"}", {0}, {0}, {"config file @: config: unknown setting"}},
        {"{\"port\": 70000}", {0}, {0}, {"config file @: port: 70000 is out of range [0, 65535]"}},
        {"{\"port\": 80.5}", {0}, {0}, {"config file @: port: '80.5' is not an integer"}},
        {"{\"recall_bytes\": \"4K\"}", {0}, {0}, {"config file @: recall_bytes: '4K' is not an integer"}},
        {"{\"recall\": \"sometimes\"}", {0}, {0}, {"config file @: recall: 'sometimes' is not one of auto, true, false"}},
        {"{\"recall_order\": \"best\"}", {0}, {0},
         {"config file @: recall_order: 'best' is not one of best-last, document"}},
        {"{\"backend\": true}", {0}, {0}, {"config file @: backend: 'true' is not one of cpu, cuda"}},
        {"{\"recall\": 1}", {0}, {0}, {"config file @: recall: expected a string, got"}},
        {"{\"max_body_bytes\": \"0\"}", {0}, {0}, {"config file @: max_body_bytes: '0' is out of range [1, "}},
        {"{\"pot-memory-limit\": \"1023K\"}", {0}, {0}, {"config file @: pot-memory-limit: '1023K' is out of range [1M, "}},
        {"{\"backend\": \"tpu\"}", {0}, {0}, {"config file @: backend: 'tpu' is not one of cpu, cuda"}},
        {"{\"rate_limit\": \"fast\"}", {0}, {0}, {"config file @: rate_limit: 'fast' is not a number"}},
        {"{\"rate_limit\": 2e6}", {0}, {0}, {"config file @: rate_limit: 2e+06 is out of range [0, 1e+06]"}},
        /* the environment */
        {NULL, {0}, {"POTSERVE_POLICY=foo"}, {"POTSERVE_POLICY: 'foo' is not one of infinipot, finch, snapkv, streaming, h2o, cascade, truncate, none"}},
        {NULL, {0}, {"POTSERVE_PORT=abc"}, {"POTSERVE_PORT: 'abc' is not an integer"}},
        {NULL, {0}, {"POTSERVE_PORT="}, {"POTSERVE_PORT: '' is not an integer"}},
        {NULL, {0}, {"POTSERVE_IDLE_TIMEOUT=0"}, {"POTSERVE_IDLE_TIMEOUT: 0 is out of range [1, 86400]"}},
        {NULL, {0}, {"POTSERVE_RECALL_BYTES=1048577"}, {"POTSERVE_RECALL_BYTES: 1048577 is out of range [1, 1048576]"}},
        {NULL, {0}, {"POTSERVE_ACCESS_LOG=maybe"}, {"POTSERVE_ACCESS_LOG: 'maybe' is not a boolean"}},
        {NULL, {0}, {"POTSERVE_DURABILITY=FSYNC"}, {"POTSERVE_DURABILITY: 'FSYNC' is not one of fsync, none"}},
        {NULL, {0}, {"POTSERVE_CONFIG=/nonexistent/potserve.json"}, {"config file /nonexistent/potserve.json: cannot open"}},
        /* the flags */
        {NULL, {"--port", "abc"}, {0}, {"--port: 'abc' is not an integer"}},
        {NULL, {"--port=70000"}, {0}, {"--port: 70000 is out of range [0, 65535]"}},
        {NULL, {"--threads", "1025"}, {0}, {"--threads: 1025 is out of range [0, 1024]"}},
        {NULL, {"--recall-bytes", "0"}, {0}, {"--recall-bytes: 0 is out of range [1, 1048576]"}},
        {NULL, {"--max_connections=0"}, {0}, {"--max_connections: 0 is out of range [1, 100000]"}},
        {NULL, {"--budget-tokens", "15"}, {0}, {"--budget-tokens: 15 is out of range [16, 1048576]"}},
        {NULL, {"--rate-burst", "0"}, {0}, {"--rate-burst: 0 is out of range [1, 1000000]"}},
        {NULL, {"--request-timeout", "86401"}, {0}, {"--request-timeout: 86401 is out of range [0, 86400]"}},
        {NULL, {"--max-chunk-bytes", "1T"}, {0}, {"--max-chunk-bytes: '1T' is not a byte size"}},
        {NULL, {"--snapshot-bytes=-1"}, {0}, {"--snapshot-bytes: '-1' is out of range [0, "}},
        {NULL, {"--policy", "lru"}, {0}, {"--policy: 'lru' is not one of infinipot"}},
        {NULL, {"--bogus", "1"}, {0}, {"--bogus: unknown flag"}},
        {NULL, {"--no-port"}, {0}, {"--no-port: unknown flag"}},
        {NULL, {"--no-access-log=1"}, {0}, {"--no-access-log: takes no value"}},
        {NULL, {"--access-log=maybe"}, {0}, {"--access-log: 'maybe' is not a boolean"}},
        {NULL, {"--access-log", "maybe"}, {0}, {"--access-log: 'maybe' is not a boolean"}},
        {NULL, {"--port"}, {0}, {"--port: missing value"}},
        {NULL, {"--host", "--port", "1"}, {0}, {"--host: missing value"}},
        {NULL, {"--config"}, {0}, {"--config: missing value"}},
        {NULL, {"--config="}, {0}, {"--config: missing file name"}},
        {NULL, {"--config", "/nonexistent/x.json"}, {0}, {"config file /nonexistent/x.json: cannot open"}},
        {NULL, {"8080"}, {0}, {"'8080': unexpected argument"}},
        {NULL, {"-p", "1"}, {0}, {"'-p': unexpected argument"}},
        {NULL, {"--"}, {0}, {"'--': unexpected argument"}},
        {NULL, {"--help=1"}, {0}, {"--help: takes no value"}},
        /* a bad flag is reported even when the file and environment are fine */
        {"{\"port\": 1}", {"--port", "x"}, {"POTSERVE_PORT=2"}, {"--port: 'x' is not an integer"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const error_case *k = &cases[i];
        char path[64] = "", err[512] = "";
        const char *args[10] = {0};
        int n = 0;
        if (k->file) {
            write_temp(path, k->file, strlen(k->file));
            args[n++] = "--config";
            args[n++] = path;
        }
        for (int j = 0; j < 6 && k->args[j]; j++) args[n++] = k->args[j];
        server_config c;
        int rc = load(&c, args, k->env, err, sizeof err);
        config_free(&c);
        if (k->file) unlink(path);
        if (rc != -1) {
            test_failures++;
            fprintf(stderr, "  error case %zu: rc %d\n", i, rc);
        }
        CHECK(!strchr(err, '\n'));
        for (int j = 0; j < 3 && k->want[j]; j++) {
            char want[256];
            const char *at = strchr(k->want[j], '@');
            if (at)
                snprintf(want, sizeof want, "%.*s%s%s", (int)(at - k->want[j]), k->want[j], path,
                         at + 1);
            else
                snprintf(want, sizeof want, "%s", k->want[j]);
            if (!strstr(err, want)) {
                test_failures++;
                fprintf(stderr, "  error case %zu: \"%s\" does not contain \"%s\"\n", i, err,
                        want);
            }
        }
    }
}

TEST(config_help) {
    char err[256] = "";
    server_config c;
    const char *h1[] = {"--help", NULL}, *h2[] = {"--port", "1", "-h", "--bogus", NULL};
    CHECK_EQ_INT(load(&c, h1, NULL, err, sizeof err), 1);
    config_free(&c);
    /* --help wins even over a bad value; nothing is applied. */
    const char *h3[] = {"--port", "abc", "--help", NULL};
    const char *bad_env[] = {"POTSERVE_PORT=abc", "POTSERVE_CONFIG=/nonexistent", NULL};
    CHECK_EQ_INT(load(&c, h3, bad_env, err, sizeof err), 1);
    CHECK_EQ_INT(c.port, 8080);
    config_free(&c);
    CHECK_EQ_INT(load(&c, h2, NULL, err, sizeof err), 1);
    CHECK_EQ_INT(c.port, 8080);
    config_free(&c);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    if (!f) return;
    config_print_help(f);
    fclose(f);
    CHECK(!strncmp(text, "usage: potserve serve [options]\n", 32));
    static const struct {
        const char *flag, *env, *def;
    } rows[] = {
        {"--host TEXT", "POTSERVE_HOST", "[127.0.0.1]"},
        {"--port N", "POTSERVE_PORT", "[8080]"},
        {"--model TEXT", "POTSERVE_MODEL", "[models/SmolLM2-135M-Instruct.Q4_1.gguf]"},
        {"--data-dir TEXT", "POTSERVE_DATA_DIR", "[data]"},
        {"--backend NAME", "POTSERVE_BACKEND", "[cpu]"},
        {"--threads N", "POTSERVE_THREADS", "[0]"},
        {"--chat-template TEXT", "POTSERVE_CHAT_TEMPLATE", "[\"\"]"},
        {"--api-key TEXT", "POTSERVE_API_KEY", "[\"\"]"},
        {"--api-keys-file TEXT", "POTSERVE_API_KEYS_FILE", "[\"\"]"},
        {"--durability NAME", "POTSERVE_DURABILITY", "[fsync]"},
        {"--max-chunk-bytes BYTES", "POTSERVE_MAX_CHUNK_BYTES", "[256M]"},
        {"--max-body-bytes BYTES", "POTSERVE_MAX_BODY_BYTES", "[16M]"},
        {"--max-header-bytes BYTES", "POTSERVE_MAX_HEADER_BYTES", "[16K]"},
        {"--max-connections N", "POTSERVE_MAX_CONNECTIONS", "[256]"},
        {"--rate-limit X", "POTSERVE_RATE_LIMIT", "[0]"},
        {"--rate-burst N", "POTSERVE_RATE_BURST", "[20]"},
        {"--max-sessions-per-key N", "POTSERVE_MAX_SESSIONS_PER_KEY", "[64]"},
        {"--pot-memory-limit BYTES", "POTSERVE_POT_MEMORY_LIMIT", "[1G]"},
        {"--idle-timeout N", "POTSERVE_IDLE_TIMEOUT", "[30]"},
        {"--connection-timeout N", "POTSERVE_CONNECTION_TIMEOUT", "[3600]"},
        {"--request-timeout N", "POTSERVE_REQUEST_TIMEOUT", "[600]"},
        {"--budget-tokens N", "POTSERVE_BUDGET_TOKENS", "[2048]"},
        {"--policy NAME", "POTSERVE_POLICY", "[infinipot]"},
        {"--reread-share NAME", "POTSERVE_REREAD_SHARE", "[pots]"},
        {"--reread-share-limit N", "POTSERVE_REREAD_SHARE_LIMIT", "[8]"},
        {"--reread-gather-ms N", "POTSERVE_REREAD_GATHER_MS", "[100]"},
        {"--recall NAME", "POTSERVE_RECALL", "[auto]"},
        {"--recall-bytes N", "POTSERVE_RECALL_BYTES", "[4096]"},
        {"--snapshot-bytes BYTES", "POTSERVE_SNAPSHOT_BYTES", "[4M]"},
        {"--access-log [BOOL]", "POTSERVE_ACCESS_LOG", "[true]"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        /* One line holds the flag, the variable and the default. */
        const char *line = strstr(text, rows[i].flag);
        CHECK(line != NULL);
        if (!line) continue;
        const char *eol = strchr(line, '\n');
        const char *env = strstr(line, rows[i].env), *def = strstr(line, rows[i].def);
        if (!env || !def || !eol || env > eol || def > eol) {
            test_failures++;
            fprintf(stderr, "  help line of %s lacks %s or %s\n", rows[i].flag, rows[i].env,
                    rows[i].def);
        }
    }
    CHECK_CONTAINS(text, "--config FILE");
    CHECK_CONTAINS(text, "POTSERVE_CONFIG");
    CHECK_CONTAINS(text, "infinipot|finch|snapkv|streaming|h2o|cascade|truncate|none");
    /* Readable: no line is absurdly long. */
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        CHECK(n <= 160);
        p += n + (e != NULL);
    }
    free(text);
}

/* Deterministic generator for the garbage tests. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* After a successful load, every value lies in its documented range. */
static void check_sane(const server_config *c) {
    CHECK(c->host && c->model && c->data_dir && c->chat_template && c->api_key &&
          c->api_keys_file);
    CHECK(c->backend && (!strcmp(c->backend, "cpu") || !strcmp(c->backend, "cuda")));
    CHECK(c->durability && (!strcmp(c->durability, "fsync") || !strcmp(c->durability, "none")));
    CHECK(c->policy != NULL);
    CHECK(c->port >= 0 && c->port <= 65535);
    CHECK(c->threads >= 0 && c->threads <= 1024);
    CHECK(c->max_connections >= 1 && c->max_connections <= 100000);
    CHECK(c->rate_limit >= 0 && c->rate_limit <= 1e6);
    CHECK(c->rate_burst >= 1 && c->rate_burst <= 1000000);
    CHECK(c->max_sessions_per_key >= 1 && c->max_sessions_per_key <= 1000000);
    CHECK(c->idle_timeout >= 1 && c->idle_timeout <= 86400);
    CHECK(c->connection_timeout >= 0 && c->connection_timeout <= 86400);
    CHECK(c->request_timeout >= 0 && c->request_timeout <= 86400);
    CHECK(c->budget_tokens >= 16 && c->budget_tokens <= 1048576);
    CHECK(c->max_chunk_bytes >= 1 && c->max_body_bytes >= 1 && c->max_header_bytes >= 1);
    CHECK(c->pot_memory_limit >= (1 << 20) && c->snapshot_bytes >= 0);
    CHECK(c->access_log == 0 || c->access_log == 1);
}

static const char *const fuzz_names[] = {
    "host", "port", "model", "data_dir", "backend", "threads", "chat_template", "api_key",
    "api_keys_file", "durability", "max_chunk_bytes", "max_body_bytes", "max_header_bytes",
    "max_connections", "rate_limit", "rate_burst", "max_sessions_per_key", "pot_memory_limit",
    "idle_timeout", "connection_timeout", "request_timeout", "budget_tokens", "policy",
    "snapshot_bytes", "access_log", "bogus", "config"};
enum { N_FUZZ_NAMES = sizeof fuzz_names / sizeof fuzz_names[0] };

/* Fills buf (cap > 1) with garbage: random bytes, or JSON-ish tokens and setting names
 * so that some inputs get past the parser. Returns the length (no NUL inside when
 * no_nul). */
static size_t garbage(uint64_t *s, char *buf, size_t cap, int no_nul) {
    static const char *const tokens[] = {"{", "}", "[", "]", ":", ",", "\"", "\"256M\"", "1",
                                         "-1", "0", "1e9", "true", "false", "null", "\"yes\"",
                                         "\"cuda\"", "\"\\u0000\"", "\"\\ud800\"", " ",
                                         "99999999999999999999", "1.5", "\"1G\"", "\"\""};
    size_t n = 0, want = rng_next(s) % (cap - 1);
    int mode = (int)(rng_next(s) % 3);
    while (n < want) {
        if (mode == 0) {
            char ch = (char)(rng_next(s) & 0xff);
            if (no_nul && !ch) ch = 'x';
            buf[n++] = ch;
        } else {
            uint64_t r = rng_next(s) % 4;
            const char *t;
            char q[40];
            if (r == 0) {
                snprintf(q, sizeof q, "\"%s\"", fuzz_names[rng_next(s) % N_FUZZ_NAMES]);
                t = q;
            } else {
                t = tokens[rng_next(s) % (sizeof tokens / sizeof tokens[0])];
            }
            size_t k = strlen(t);
            if (n + k > want) break;
            memcpy(buf + n, t, k);
            n += k;
            if (mode == 2 && n < want && rng_next(s) % 8 == 0) buf[n++] = (char)(rng_next(s) & 0xff);
        }
    }
    if (mode != 0 && rng_next(s) % 2 && n + 2 < cap) { /* often an object */
        memmove(buf + 1, buf, n);
        buf[0] = '{';
        buf[++n] = '}';
        n++;
    }
    buf[n] = '\0';
    if (no_nul)
        for (size_t i = 0; i < n; i++)
            if (!buf[i]) buf[i] = 'z';
    return n;
}

/* A well-formed JSON object of up to 4 members: setting names (sometimes
 * dashed or unknown) with values from a small pool, or random bytes escaped as
 * a JSON string. Returns the length. */
static size_t garbage_object(uint64_t *s, char *buf, size_t cap) {
    static const char *const values[] = {"0", "1", "-1", "16", "65535", "65536", "1e6", "1.5",
                                         "true", "false", "null", "[]", "{}", "\"\"",
                                         "\"cpu\"", "\"none\"", "\"finch\"", "\"1M\"",
                                         "\"16K\"", "\"on\"", "9223372036854775807",
                                         "-9223372036854775808", "1e400", "\"\\u00e9\""};
    size_t n = (size_t)snprintf(buf, cap, "{");
    int members = (int)(rng_next(s) % 5);
    for (int m = 0; m < members && n + 80 < cap; m++) {
        char key[40];
        snprintf(key, sizeof key, "%s", fuzz_names[rng_next(s) % N_FUZZ_NAMES]);
        if (rng_next(s) % 4 == 0)
            for (char *p = key; *p; p++)
                if (*p == '_') *p = '-';
        n += (size_t)snprintf(buf + n, cap - n, "%s\"%s\": ", m ? ", " : "", key);
        if (rng_next(s) % 3) {
            n += (size_t)snprintf(buf + n, cap - n, "%s",
                                  values[rng_next(s) % (sizeof values / sizeof values[0])]);
        } else { /* a string of random printable ASCII */
            buf[n++] = '"';
            for (int k = (int)(rng_next(s) % 12); k > 0; k--) {
                char ch = (char)(' ' + rng_next(s) % 95);
                if (ch == '"' || ch == '\\') ch = 'q';
                buf[n++] = ch;
            }
            buf[n++] = '"';
        }
    }
    n += (size_t)snprintf(buf + n, cap - n, "}");
    return n;
}

TEST(config_garbage_json_file) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    char path[64], buf[512], err[256];
    write_temp(path, "", 0);
    int ok = 0, failed = 0;
    for (int i = 0; i < 1000; i++) {
        size_t n = i % 2 ? garbage_object(&s, buf, sizeof buf) : garbage(&s, buf, sizeof buf, 0);
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (!f) break;
        fwrite(buf, 1, n, f);
        fclose(f);
        const char *args[] = {"--config", path, NULL};
        server_config c;
        err[0] = '\0';
        int rc = load(&c, args, NULL, err, sizeof err);
        CHECK(rc == 0 || rc == -1);
        if (rc == 0) {
            check_sane(&c);
            ok++;
        } else {
            CHECK(err[0] && !strchr(err, '\n'));
            CHECK(contains(err, "config file "));
            failed++;
        }
        config_free(&c);
    }
    unlink(path);
    CHECK(ok > 0 && failed > 0);
}

TEST(config_garbage_values) {
    uint64_t s = 0x2545f4914f6cdd1dull;
    char buf[256], flag[320], var[320], err[256];
    int ok = 0, failed = 0;
    for (int i = 0; i < 1000; i++) {
        const char *name = fuzz_names[rng_next(&s) % (N_FUZZ_NAMES - 1)]; /* not "config" */
        garbage(&s, buf, sizeof buf, 1);
        int form = (int)(rng_next(&s) % 3);
        const char *args[4] = {0};
        const char *env[2] = {0};
        if (form == 0) {
            snprintf(flag, sizeof flag, "--%s", name);
            args[0] = flag;
            args[1] = buf;
        } else if (form == 1) {
            snprintf(flag, sizeof flag, "--%s=%s", name, buf);
            args[0] = flag;
        } else {
            snprintf(var, sizeof var, "POTSERVE_%s=%s", name, buf);
            for (char *p = var + 9; *p && *p != '='; p++)
                if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
            env[0] = var;
        }
        server_config c;
        err[0] = '\0';
        int rc = load(&c, args, env, err, sizeof err);
        /* "--access-log -h": a value starting with '-' is not a boolean's, so -h is help. */
        int help = form == 0 && (!strcmp(buf, "-h") || !strcmp(buf, "--help"));
        CHECK(rc == 0 || rc == -1 || (rc == 1 && help));
        if (rc == 0) {
            check_sane(&c);
            ok++;
        } else if (rc == -1) {
            CHECK(err[0] && !strchr(err, '\n'));
            failed++;
        }
        config_free(&c);
    }
    CHECK(ok > 0 && failed > 0);
}
