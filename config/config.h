/* Settings: parsing and validating values from every source. The server's
 * settings are layered defaults < JSON config file (--config FILE) <
 * environment (POTSERVE_<NAME>, upper case, '-' -> '_') < command-line flags
 * (--name VALUE or --name=VALUE). Every invalid value is reported with the
 * setting's name. */
#ifndef POTSERVE_CONFIG_H
#define POTSERVE_CONFIG_H

#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

/* Parses a whole decimal integer in [lo, hi]. 0, or -1 with
 * "NAME: ..." in err. */
int config_parse_int(const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out,
                     char *err, size_t errlen);
/* Parses a finite number in [lo, hi]. */
int config_parse_float(const char *name, const char *text, double lo, double hi, double *out,
                       char *err, size_t errlen);
/* Parses a byte size: an integer with an optional suffix K, M, G (powers of
 * 1024, also KiB/MiB/GiB and KB/MB/GB as the same powers of 1024) in [lo, hi]. */
int config_parse_bytes(const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out,
                       char *err, size_t errlen);

/* The settings of `potserve serve`. Strings are owned by the struct
 * (config_free releases them). */
typedef struct server_config {
    char *host;               /* listen address (127.0.0.1) */
    int64_t port;             /* 8080; 0 picks a free port (printed on startup) */
    char *model;              /* GGUF path (models/SmolLM2-135M-Instruct.Q4_1.gguf) */
    char *data_dir;           /* sessions' logs and snapshots (data) */
    char *backend;            /* cpu | cuda (cpu) */
    int64_t threads;          /* compute threads, 0 = all online CPUs (0) */
    char *chat_template;      /* family overriding the GGUF's template, "" = the model's ("") */
    char *api_key;            /* one accepted key, "" = none ("") */
    char *api_keys_file;      /* file: one key per line, optional name after whitespace,
                                 '#' comments ("") */
    char *durability;         /* fsync | none (fsync) */
    int64_t max_chunk_bytes;  /* largest upload body (256M) -> 413 */
    int64_t upload_buffer_bytes; /* ?wait=false chunks' bytes read ahead of the engine, all uploads (64M) */
    int64_t max_body_bytes;   /* largest JSON request body (16M) -> 413 */
    int64_t max_header_bytes; /* request line + headers (16K) */
    int64_t max_connections;  /* open connections (256) */
    int64_t max_connections_per_ip; /* open connections from one address (64) */
    double rate_limit;        /* requests per second per key, 0 = off (0) */
    int64_t rate_burst;       /* bucket size for rate_limit (20) */
    int64_t max_sessions_per_key; /* (64) */
    int64_t pot_memory_limit; /* bytes of all pots together (1G) -> 429 */
    int page_out_idle;        /* full: idle sessions' pots go to their snapshots, read back when asked (true) */
    int64_t max_answers;      /* answers (sequences) decoded at once; more queue (16: n's largest) */
    int64_t idle_timeout;     /* seconds a connection may be silent (30) */
    int64_t connection_timeout; /* seconds a connection may live at most, 0 = off (3600) */
    int64_t request_timeout;  /* seconds for one generation request (600) */
    int64_t shutdown_grace;   /* seconds a SIGTERM drain waits for open requests (30) */
    int64_t budget_tokens;    /* default pot budget of a new session (2048) */
    char *policy;             /* default policy of a new session (infinipot) */
    char *reread_share;       /* questions sharing a re-read pass: one pot scored by all their
                                 rows ("rows") or one pot each ("pots", the default) (server/reread.c) */
    int64_t reread_share_limit; /* questions one re-read pass takes at most (8) */
    int64_t reread_gather_ms; /* a re-read waits this long for other questions (100) */
    char *recall;             /* default "recall" of sessions: "auto" (when the pot has dropped
                                 some of the document), "true", "false" (server/recall.h) */
    int64_t recall_bytes;     /* passages a recall puts before a question, in bytes (4096;
                                 engine/recall.h, server/recall.c) */
    char *recall_order;       /* how they are laid out: "best-last" (the default) or "document"
                                 (recall_order_named) */
    int64_t snapshot_bytes;   /* snapshot a session's pot after this many new ingested bytes
                                 (4M); always on shutdown */
    int64_t snapshot_seconds; /* or after this much engine time reading since the last (60; 0 = off):
                                 bounds what a restart after a crash reads again */
    int access_log;           /* one JSON line per request on stderr (true) */
    int64_t prompt_cache_entries; /* recent sessionless prompts whose KV is reused (4; 0 = off) */
    int64_t prompt_cache_bytes;   /* their budget, held within pot_memory_limit (64M) */
    int64_t response_store_bytes; /* /v1/responses answers kept for previous_response_id and
                                     GET /v1/responses/{id}: in memory, or with a shared store in
                                     Redis for all replicas (16M; 0 = off; server/responses.c) */
    char *store;              /* session store: "dir" or redis://host:port/db (dir) */
    char *replica_name;       /* this replica's name in leases, "" = hostname:port ("") */
    int64_t lease_ms;         /* a session lease's lifetime in a shared store (3000) */
    char *cors_origins;       /* browser origins allowed by CORS: comma-separated, "*" = any,
                                 "" = CORS off ("") */
    char *allowed_hosts;      /* Host names a server without API keys listening on loopback
                                 answers besides localhost, *.localhost and IP addresses:
                                 comma-separated, "*" = any (""; server/cors.c) */
} server_config;

/* Fills the defaults (strings allocated). Overwrites all of *c without freeing
 * what it held. */
void config_defaults(server_config *c);
/* Frees the strings and sets them to NULL: safe on a zeroed struct and twice. */
void config_free(server_config *c);
/* Layers every source onto c (which holds the defaults): the JSON file named
 * by --config (or POTSERVE_CONFIG), then POTSERVE_* variables from envp, then
 * the flags in argv[1..argc) (argv[0] is the command name). Returns 0, 1 when
 * --help or -h was given (nothing else done), or -1 with one line naming the bad
 * setting and its source in err ("--port: ...", "POTSERVE_PORT: ...",
 * "config file F: port: ..."): an unknown flag, file key or bad value, a
 * missing value, a file that cannot be read or is not a JSON object. On -1, c
 * may be partly updated (the caller still frees it). Unknown POTSERVE_*
 * variables are ignored.
 * Names: the field name is the file key ('-' also accepted); the flag is
 * --field-name (or --field_name); the variable POTSERVE_FIELD_NAME. File values
 * may be JSON strings or, for numbers and booleans, JSON numbers / true / false.
 * A boolean flag alone means true and --no-NAME false. */
int config_load(server_config *c, int argc, char **argv, char *const *envp, char *err,
                size_t errlen);
/* Writes the usage of `potserve serve`: every setting, its flag, variable,
 * default and one line of help. */
void config_print_help(FILE *out);

#endif
