/* Offline commands: generate, tokenize, recall, info, logits. Flags are described in
 * one table per command, which also produces its --help. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/common.h"
#include "cache/cache.h" /* the policies' and schedules' names */
#include "config/config.h"
#include "engine/engine.h"
#include "engine/recall.h"
#include "server/server.h"

enum { MAX_STOPS = 8, MAX_FLAGS = 32 };

typedef struct flag {
    const char *name;  /* "--temp" */
    const char *alias; /* "-t" or NULL */
    const char *arg;   /* metavariable, NULL for a switch */
    const char *help;
} flag;

/* Parsed command line: value per flag (NULL when absent, "1" for switches),
 * repeated --stop values collected. */
/* Each flag table below is checked against parsed.val's size. */
#define FLAGS_FIT(table) \
    _Static_assert(sizeof(table) / sizeof(table)[0] - 1 <= MAX_FLAGS, #table " has more flags than MAX_FLAGS")

typedef struct parsed {
    const char *val[MAX_FLAGS]; /* indexed by the flag's position in its table */
    const char *stops[MAX_STOPS];
    int n_stops;
} parsed;

static void print_help(const char *cmd, const char *synopsis, const flag *flags, FILE *out) {
    fprintf(out, "usage: potserve %s %s\n\noptions:\n", cmd, synopsis);
    for (int i = 0; flags[i].name; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s %s", flags[i].alias ? flags[i].alias : "",
                 flags[i].alias ? ", " : "", flags[i].name, flags[i].arg ? flags[i].arg : "");
        fprintf(out, "  %-28s %s\n", left, flags[i].help);
    }
    fprintf(out, "  %-28s %s\n", "-h, --help", "show this help");
}

/* Returns 0 to go on, 1 when --help was printed, -1 on a usage error. */
static int parse_flags(int argc, char **argv, const char *synopsis, const flag *flags, parsed *p) {
    memset(p, 0, sizeof *p);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            print_help(argv[0], synopsis, flags, stdout);
            return 1;
        }
        int k = 0;
        while (flags[k].name && strcmp(argv[i], flags[k].name) &&
               !(flags[k].alias && !strcmp(argv[i], flags[k].alias)))
            k++;
        if (!flags[k].name) {
            fprintf(stderr, "potserve %s: unknown option '%s' (see --help)\n", argv[0], argv[i]);
            return -1;
        }
        const char *v = "1";
        if (flags[k].arg) {
            if (i + 1 >= argc) {
                fprintf(stderr, "potserve %s: %s needs a value\n", argv[0], flags[k].name);
                return -1;
            }
            v = argv[++i];
        }
        char err[160];
        int64_t n;
        if (!strcmp(flags[k].name, "--threads") && config_parse_int("--threads", v, 1, 1024, &n, err, sizeof err)) {
            fprintf(stderr, "potserve %s: %s\n", argv[0], err); /* (a usage error of every model command) */
            return -1;
        }
        if (!strcmp(flags[k].name, "--stop")) {
            if (!*v) {
                fprintf(stderr, "potserve %s: --stop needs a non-empty string\n", argv[0]);
                return -1;
            }
            if (p->n_stops == MAX_STOPS) {
                fprintf(stderr, "potserve %s: at most %d --stop strings\n", argv[0], MAX_STOPS);
                return -1;
            }
            p->stops[p->n_stops++] = v;
        }
        p->val[k] = v;
    }
    return 0;
}

static const char *flag_val(const flag *flags, const parsed *p, const char *name) {
    for (int k = 0; flags[k].name; k++)
        if (!strcmp(flags[k].name, name)) return p->val[k];
    return NULL;
}

/* Parses the integer flag `name` into *out when present (else leaves it). */
static int int64_flag(const flag *flags, const parsed *p, const char *name, int64_t lo, int64_t hi,
                      int64_t *out, char *err, size_t errlen) {
    const char *v = flag_val(flags, p, name);
    return v ? config_parse_int(name, v, lo, hi, out, err, errlen) : 0;
}

/* Opens the model named by -m (required) with --threads/--chat-template. */
static engine *open_model(const char *cmd, const flag *flags, const parsed *p) {
    const char *path = flag_val(flags, p, "--model");
    char err[512];
    if (!path) {
        fprintf(stderr, "potserve %s: -m MODEL is required (see --help)\n", cmd);
        return NULL;
    }
    engine_options opt = {0};
    const char *threads = flag_val(flags, p, "--threads");
    if (threads) {
        int64_t v;
        if (config_parse_int("--threads", threads, 1, 1024, &v, err, sizeof err)) {
            fprintf(stderr, "potserve %s: %s\n", cmd, err);
            return NULL;
        }
        opt.n_threads = (int)v;
    }
    opt.backend = flag_val(flags, p, "--backend");
    opt.chat_template = flag_val(flags, p, "--chat-template");
    opt.exact = flag_val(flags, p, "--exact") != NULL;
    opt.kv_f32 = flag_val(flags, p, "--kv-f32") != NULL;
    engine *e = engine_open(path, &opt, err, sizeof err);
    if (!e) fprintf(stderr, "potserve %s: %s\n", cmd, err);
    return e;
}

#define MODEL_FLAGS                                                                    \
    {"--model", "-m", "PATH", "GGUF model file (required)"},                           \
    {"--threads", "-t", "N", "worker threads (default: all CPUs)"},                    \
    {"--backend", NULL, "B", "cpu (default) or cuda (binaries built with make CUDA=1)"}, \
    {"--exact", NULL, NULL, "f32 activations and KV (reference numerics, slower)"}, \
    {"--kv-f32", NULL, NULL, "f32 KV entries (f16 by default)"}, \
    {"--chat-template", NULL, "NAME", "override the chat template family: " ENGINE_CHAT_TEMPLATE_LIST}

/* ---- generate ------------------------------------------------------------- */

static const flag generate_flags[] = {
    MODEL_FLAGS,
    {"--prompt", "-p", "TEXT", "the prompt (this or --tokens is required)"},
    {"--tokens", NULL, "IDS", "the prompt as comma-separated token ids"},
    {"--print-ids", NULL, NULL, "print the generated token ids instead of the text"},
    {"--chat", NULL, NULL, "treat the prompt as a user message in the model's chat template"},
    {"--system", NULL, "TEXT", "system message (with --chat)"},
    {"--n-predict", "-n", "N", "tokens to generate (default 128)"},
    {"--temp", NULL, "T", "temperature; 0 = greedy (default 0)"},
    {"--top-k", NULL, "N", "top-k sampling (default 0 = off)"},
    {"--top-p", NULL, "P", "nucleus sampling (default 1 = off)"},
    {"--min-p", NULL, "P", "min-p sampling (default 0 = off)"},
    {"--repeat-penalty", NULL, "X", "repetition penalty (default 1 = off)"},
    {"--presence-penalty", NULL, "X", "presence penalty (default 0)"},
    {"--frequency-penalty", NULL, "X", "frequency penalty (default 0)"},
    {"--seed", NULL, "S", "random seed (default 0)"},
    {"--stop", NULL, "TEXT", "stop string (repeatable)"},
    {"--recycle-stride", NULL, "S", "recycled attention: a full attention step every S steps (off)"},
    {"--recycle-keep", NULL, "K", "recycled attention: entries attended between full steps"},
    {"--recycle-pool", NULL, "W", "recycled attention: max-pool width of the full step's scores (odd, default 7)"},
    {"--verbose", "-v", NULL, "print token counts and speed to stderr"},
    {NULL, NULL, NULL, NULL},
};
FLAGS_FIT(generate_flags);

static int print_text(void *user, const char *text, size_t len, int32_t token,
                      const sample_logprobs *lp) {
    (void)user;
    (void)token;
    (void)lp;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* Reads the sampling flags into gp; -1 after printing the bad flag. */
/* A flag that only modifies another one is an error without it, not silently
 * ignored: writes "FLAG needs OTHER" to err and returns 1 when so. */
static int needs_flag(const flag *flags, const parsed *p, const char *name, const char *other, char *err,
                      size_t errlen) {
    if (!flag_val(flags, p, name) || flag_val(flags, p, other)) return 0;
    snprintf(err, errlen, "%s needs %s", name, other);
    return 1;
}

static int sampling_from_flags(const parsed *p, engine_gen_params *gp) {
    static const struct {
        const char *name;
        double lo, hi;
    } floats[] = {{"--temp", 0, 100},          {"--top-p", 0, 1},
                  {"--min-p", 0, 1},           {"--repeat-penalty", 0, 100},
                  {"--presence-penalty", -2, 2}, {"--frequency-penalty", -2, 2}};
    char err[256];
    double f[6];
    int64_t n = 128, k = 0, seed = 0;
    gp->sampling = sample_params_default();
    f[0] = 0;
    f[1] = gp->sampling.top_p;
    f[2] = gp->sampling.min_p;
    f[3] = gp->sampling.repeat_penalty;
    f[4] = gp->sampling.presence_penalty;
    f[5] = gp->sampling.frequency_penalty;
    for (int i = 0; i < 6; i++) {
        const char *v = flag_val(generate_flags, p, floats[i].name);
        if (v && config_parse_float(floats[i].name, v, floats[i].lo, floats[i].hi, &f[i], err, sizeof err))
            goto bad;
    }
    const flag *gf = generate_flags;
    int64_t rs = 0, rk = 0, rw = 0; /* rw 0: the engine's default width */
    if (int64_flag(gf, p, "--n-predict", 1, 1 << 24, &n, err, sizeof err) ||
        int64_flag(gf, p, "--top-k", 0, 1 << 24, &k, err, sizeof err) ||
        int64_flag(gf, p, "--seed", 0, INT64_MAX, &seed, err, sizeof err) ||
        int64_flag(gf, p, "--recycle-stride", 1, 1 << 20, &rs, err, sizeof err) ||
        int64_flag(gf, p, "--recycle-keep", 1, 1 << 24, &rk, err, sizeof err) ||
        int64_flag(gf, p, "--recycle-pool", 1, 1 << 10, &rw, err, sizeof err) ||
        needs_flag(gf, p, "--recycle-keep", "--recycle-stride", err, sizeof err) ||
        needs_flag(gf, p, "--recycle-pool", "--recycle-stride", err, sizeof err) ||
        needs_flag(gf, p, "--system", "--chat", err, sizeof err))
        goto bad;
    gp->sampling.temperature = (float)f[0];
    gp->sampling.top_p = (float)f[1];
    gp->sampling.min_p = (float)f[2];
    gp->sampling.repeat_penalty = (float)f[3];
    gp->sampling.presence_penalty = (float)f[4];
    gp->sampling.frequency_penalty = (float)f[5];
    gp->sampling.top_k = (int32_t)k;
    gp->sampling.seed = (uint64_t)seed;
    gp->max_tokens = (int32_t)n;
    if (rs > 1 && !rk) {
        snprintf(err, sizeof err, "--recycle-stride needs --recycle-keep");
        goto bad;
    }
    if (rw % 2 == 0 && rw) {
        snprintf(err, sizeof err, "--recycle-pool must be odd");
        goto bad;
    }
    gp->recycle_stride = (int32_t)rs;
    gp->recycle_keep = (int32_t)rk;
    gp->recycle_pool = (int32_t)rw;
    gp->stop = p->stops;
    gp->n_stop = (size_t)p->n_stops;
    return 0;
bad:
    fprintf(stderr, "potserve generate: %s\n", err);
    return -1;
}

static int32_t *parse_ids(const char *s, size_t *n);

/* generate and logits take the prompt as text (-p) or as token ids (--tokens), not both. */
static int one_prompt_source(const char *cmd, const char *prompt, const char *toks) {
    if (!prompt != !toks) return 1;
    fprintf(stderr, "potserve %s: give exactly one of -p PROMPT and --tokens IDS\n", cmd);
    return 0;
}

int cli_generate(int argc, char **argv) {
    parsed p;
    int r = parse_flags(argc, argv, "-m MODEL (-p PROMPT | --tokens IDS) [options]", generate_flags, &p);
    if (r) return r > 0 ? 0 : 2;
    const char *prompt = flag_val(generate_flags, &p, "--prompt"),
               *toks = flag_val(generate_flags, &p, "--tokens");
    if (!one_prompt_source("generate", prompt, toks)) return 2;
    engine_gen_params gp = {0};
    if (sampling_from_flags(&p, &gp)) return 2;
    int print_ids = flag_val(generate_flags, &p, "--print-ids") != NULL;
    int32_t *generated = print_ids ? malloc((size_t)gp.max_tokens * sizeof *generated) : NULL;
    engine *e = generated || !print_ids ? open_model("generate", generate_flags, &p) : NULL;
    if (!e) {
        free(generated);
        return 1;
    }
    gp.tokens_out = generated;

    char err[512] = "";
    int chat = flag_val(generate_flags, &p, "--chat") != NULL;
    if (chat && toks) {
        snprintf(err, sizeof err, "--chat needs -p PROMPT, not --tokens");
        goto fail;
    }
    size_t n_ids = 0;
    int32_t *ids;
    if (chat) {
        engine_message msgs[2];
        size_t n = 0;
        const char *system = flag_val(generate_flags, &p, "--system");
        if (system) msgs[n++] = (engine_message){"system", system};
        msgs[n++] = (engine_message){"user", prompt};
        ids = engine_chat_prompt(e, msgs, n, 1, &n_ids, err, sizeof err);
    } else {
        ids = toks ? parse_ids(toks, &n_ids) : engine_tokenize_prompt(e, prompt, &n_ids, err, sizeof err);
    }
    if (!ids) {
        if (!err[0]) snprintf(err, sizeof err, "--tokens: not a list of token ids");
        goto fail;
    }
    engine_gen_result res;
    int rc = engine_generate(e, ids, n_ids, &gp, print_ids ? NULL : print_text, NULL, &res, err,
                             sizeof err);
    free(ids);
    if (rc) goto fail;
    for (int64_t i = 0; print_ids && i < res.n_generated; i++)
        printf(i ? " %d" : "%d", generated[i]);
    printf("\n");
    if (flag_val(generate_flags, &p, "--verbose"))
        fprintf(stderr, "prompt: %lld tokens, %.1f tok/s; generated: %lld tokens, %.1f tok/s\n",
                (long long)res.n_prompt, res.n_prompt / (res.prefill_ms / 1e3 + 1e-9),
                (long long)res.n_generated, res.n_generated / (res.decode_ms / 1e3 + 1e-9));
    free(generated);
    engine_close(e);
    return 0;
fail:
    fprintf(stderr, "potserve generate: %s\n", err);
    free(generated);
    engine_close(e);
    return 1;
}

/* ---- tokenize ------------------------------------------------------------- */

static const flag tokenize_flags[] = {
    MODEL_FLAGS,
    {"--no-special", NULL, NULL, "do not add BOS/EOS even where the model's metadata asks for them"},
    {"--parse-special", NULL, NULL, "turn special-token text (e.g. <|im_end|>) into those tokens"},
    {NULL, NULL, NULL, NULL},
};
FLAGS_FIT(tokenize_flags);

/* Reads all of stdin into a malloc'd buffer; NULL when it cannot be read
 * (closed, a directory): that is not an empty input. */
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0 && ferror(stdin)) {
            free(buf);
            return NULL;
        }
        if (got == 0) break;
        if (n == cap) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    *len = n;
    return buf;
}

int cli_tokenize(int argc, char **argv) {
    parsed p;
    int r = parse_flags(argc, argv, "-m MODEL < TEXT", tokenize_flags, &p);
    if (r) return r > 0 ? 0 : 2;
    engine *e = open_model("tokenize", tokenize_flags, &p);
    if (!e) return 1;
    size_t len;
    char *text = read_stdin(&len);
    int add_special = !flag_val(tokenize_flags, &p, "--no-special");
    int parse_special = flag_val(tokenize_flags, &p, "--parse-special") != NULL;
    int64_t n = text ? engine_tokenize(e, text, len, add_special, parse_special, NULL, 0) : -1;
    int32_t *ids = n >= 0 ? malloc((size_t)(n ? n : 1) * sizeof *ids) : NULL;
    if (!ids) {
        fprintf(stderr, "potserve tokenize: %s\n", !text ? "cannot read stdin" :
                n < 0 ? "input is not valid UTF-8" : "out of memory");
        free(text);
        engine_close(e);
        return 1;
    }
    engine_tokenize(e, text, len, add_special, parse_special, ids, n);
    for (int64_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(text);
    engine_close(e);
    return 0;
}

/* ---- recall ------------------------------------------------------------------ */

static const flag recall_flags[] = {
    {"--question", "-q", "TEXT", "the question whose words the passages share (required)"},
    {"--bytes", NULL, "N", "the passages' budget in bytes (default 4096, the server's recall_bytes)"},
    {"--order", NULL, "ORDER", "best-last (default) or document: the server's recall_order"},
    {"--scores", NULL, NULL, "print every passage's start, length, words and BM25 score as JSON lines"},
    {NULL, NULL, NULL, NULL},
};
FLAGS_FIT(recall_flags);

/* What a session's "recall" would put before a question (engine/recall.h):
 * the question as the model would be asked it, or every passage's score. */
int cli_recall(int argc, char **argv) {
    parsed p;
    int r = parse_flags(argc, argv, "-q QUESTION [--bytes N] [--order ORDER] [--scores] < TEXT", recall_flags, &p);
    if (r) return r > 0 ? 0 : 2;
    const char *question = flag_val(recall_flags, &p, "--question"), *bytes = flag_val(recall_flags, &p, "--bytes");
    char *end = NULL;
    errno = 0;
    long long budget = bytes ? strtoll(bytes, &end, 10) : RECALL_DEFAULT_BYTES;
    const char *order_name = flag_val(recall_flags, &p, "--order");
    int order = recall_order_named(order_name ? order_name : "best-last");
    if (!question || (bytes && (*end || end == bytes || errno || budget < 1 || budget > RECALL_MAX_BYTES)) || order < 0) {
        fprintf(stderr, "potserve recall: %s\n", !question ? "--question is required"
                                                 : order < 0 ? "--order is best-last or document"
                                                             : "--bytes needs a count of bytes in [1, 1048576]");
        return 2;
    }
    size_t len;
    char *text = read_stdin(&len);
    if (!text) return fprintf(stderr, "potserve recall: cannot read stdin\n"), 1;
    int rc = 1;
    if (flag_val(recall_flags, &p, "--scores")) {
        recall_passage *ps = NULL;
        int n = 0;
        if (!recall_rank(text, len, question, &ps, &n)) {
            for (int i = 0; i < n; i++)
                printf("{\"start\": %zu, \"len\": %zu, \"words\": %d, \"score\": %.17g}\n", ps[i].start, ps[i].len,
                       ps[i].words, ps[i].score);
            rc = 0;
        }
        free(ps);
    } else {
        recall_result rr;
        char *q = NULL;
        if (!recall_passages(text, len, question, (size_t)budget, (recall_order)order, &rr) &&
            (q = recall_question(&rr, question))) {
            fwrite(q, 1, strlen(q), stdout);
            printf("\n");
            size_t bytes = 0; /* the passages' own, as the server's "bytes" (separators not counted) */
            for (int i = 0; i < rr.passages; i++) bytes += rr.chosen[i].len;
            fprintf(stderr, "potserve recall: %d of %d passages, %zu bytes\n", rr.passages, rr.candidates, bytes);
            rc = 0;
        }
        free(q);
        recall_result_free(&rr);
    }
    if (rc) fprintf(stderr, "potserve recall: out of memory\n");
    free(text);
    return rc;
}

/* ---- info ------------------------------------------------------------------- */

static const flag info_flags[] = {MODEL_FLAGS, {NULL, NULL, NULL, NULL}};
FLAGS_FIT(info_flags);

int cli_info(int argc, char **argv) {
    parsed p;
    int r = parse_flags(argc, argv, "-m MODEL", info_flags, &p);
    if (r) return r > 0 ? 0 : 2;
    engine *e = open_model("info", info_flags, &p);
    if (!e) return 1;
    engine_info in;
    engine_get_info(e, &in);
    printf("name:            %s\n", in.name);
    printf("architecture:    %s\n", in.arch);
    printf("parameters:      %llu (%.1fM)\n", (unsigned long long)in.n_params, in.n_params / 1e6);
    printf("quantization:    %s\n", in.quant);
    printf("context length:  %d\n", in.n_ctx_train);
    printf("layers:          %d\n", in.n_layer);
    printf("embedding:       %d\n", in.n_embd);
    printf("feed-forward:    %d\n", in.n_ff);
    printf("heads:           %d (kv %d, dim %d)\n", in.n_head, in.n_head_kv, in.head_dim);
    printf("vocabulary:      %d (%s)\n", in.n_vocab, in.tokenizer);
    printf("rope base:       %g\n", in.rope_base);
    printf("rope scaling:    %s", in.rope_scaling);
    if (!strcmp(in.rope_scaling, "linear") || !strcmp(in.rope_scaling, "yarn")) printf(" (factor %g)", in.rope_factor);
    printf("\n");
    if (in.n_sliding_layers)
        printf("sliding window:  %d tokens on %d of %d layers\n", in.sliding_window, in.n_sliding_layers, in.n_layer);
    printf("rms epsilon:     %g\n", in.norm_eps);
    printf("output:          %s\n", in.tied_output ? "tied to token embeddings" : "separate");
    printf("chat template:   %s\n", in.chat_family);
    engine_close(e);
    return 0;
}

/* ---- logits ------------------------------------------------------------------ */

static const flag logits_flags[] = {
    MODEL_FLAGS,
    {"--prompt", "-p", "TEXT", "prompt text (tokenized with BOS per the metadata)"},
    {"--tokens", NULL, "IDS", "comma-separated token ids instead of a prompt"},
    {"--out", "-o", "FILE", "write the raw float32 logits to FILE instead of stdout text"},
    {NULL, NULL, NULL, NULL},
};
FLAGS_FIT(logits_flags);

static int32_t *parse_ids(const char *s, size_t *n) {
    size_t cap = 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    *n = 0;
    while (ids && *s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || (*end && (*end != ',' || !end[1]))) { /* (no trailing ',') */
            free(ids);
            return NULL;
        }
        if (*n == cap) {
            int32_t *nb = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!nb) {
                free(ids);
                return NULL;
            }
            ids = nb;
        }
        ids[(*n)++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    return ids;
}

int cli_logits(int argc, char **argv) {
    parsed p;
    int r = parse_flags(argc, argv, "-m MODEL (-p PROMPT | --tokens IDS) [-o FILE]", logits_flags, &p);
    if (r) return r > 0 ? 0 : 2;
    const char *prompt = flag_val(logits_flags, &p, "--prompt"),
               *toks = flag_val(logits_flags, &p, "--tokens"), *out = flag_val(logits_flags, &p, "--out");
    if (!one_prompt_source("logits", prompt, toks)) return 2;
    engine *e = open_model("logits", logits_flags, &p);
    if (!e) return 1;
    char err[512] = "";
    size_t n = 0;
    int32_t *ids = toks ? parse_ids(toks, &n) : engine_tokenize_prompt(e, prompt, &n, err, sizeof err);
    engine_info in;
    engine_get_info(e, &in);
    float *logits = malloc((size_t)in.n_vocab * sizeof(float));
    int rc = 1;
    if (!ids || !logits) {
        if (!err[0]) snprintf(err, sizeof err, toks ? "--tokens: not a list of token ids" : "out of memory");
    } else if (!engine_prompt_logits(e, ids, n, logits, err, sizeof err)) {
        if (out) {
            FILE *f = fopen(out, "wb");
            int ok = f && fwrite(logits, sizeof(float), (size_t)in.n_vocab, f) == (size_t)in.n_vocab;
            if (f && fclose(f) != 0) ok = 0;
            if (ok) rc = 0;
            else snprintf(err, sizeof err, "cannot write %s: %s", out, strerror(errno));
        } else {
            for (int32_t i = 0; i < in.n_vocab; i++) printf("%.6g\n", logits[i]);
            rc = 0;
        }
    }
    if (rc) fprintf(stderr, "potserve logits: %s\n", err);
    free(ids);
    free(logits);
    engine_close(e);
    return rc;
}

/* ---- ingest -------------------------------------------------------------------- */

static const flag ingest_flags[] = {
    MODEL_FLAGS,
    {"--budget", NULL, "N", "pot budget |M| in entries (default 2048)"},
    {"--keep", NULL, "N", "entries kept by a compression |C| (default budget/2)"},
    {"--policy", NULL, "P", POT_POLICY_LIST " (default: infinipot)"},
    {"--schedule", NULL, "S", "engine chunk schedule: " SCHEDULE_KIND_LIST " (default: fixed)"},
    {"--chunk", NULL, "N", "engine chunk in tokens (default min(512, budget/4))"},
    {"--question", NULL, "TEXT", "question answered after the document (finch: guides compression)"},
    {"--late-question", NULL, NULL, "finch: the question is not known while reading (two-stage)"},
    {"--finch-keep", NULL, "N", "two-stage finch: entries kept by the question pass (default --keep)"},
    {"--catalyst", NULL, "TEXT", "InfiniPot catalyst prompt (default: the paper's general one)"},
    {"--nuc-share", NULL, "A", "share of kept entries chosen by surprisal (default 0.5)"},
    {"--pool-width", NULL, "N", "max-pool infinipot/finch scores over N slots (odd; 1: per token; default 15)"},
    {"--no-catalyst", NULL, NULL, "infinipot ablation: the chunk's last rows score, not the catalyst"},
    {"--no-reset-positions", NULL, NULL, "ablation: entries keep their document positions"},
    {"--score-max", NULL, NULL, "combine a KV group's query heads by max (default sum)"},
    {"--whole-words", NULL, NULL, "keep a word or number whole or drop it whole, never a part"},
    {"--system", NULL, "TEXT", "system message pinned before the document"},
    {"--plain", NULL, NULL, "no chat template: plain text document and question"},
    {"--n-predict", "-n", "N", "answer tokens (default 64, greedy; 0: until the answer ends)"},
    {"--track", NULL, "A:B", "report how much of document tokens [A, B) the pot keeps"},
    {"--json", NULL, NULL, "print the answer and the measurements as one JSON object"},
    {"--progress", NULL, "N", "every N tokens read, a JSON line on stderr: tokens, seconds, RSS"},
    {NULL, NULL, NULL, NULL},
};
FLAGS_FIT(ingest_flags);

/* The process's resident set now (not its peak), in bytes; -1 if unknown. */
static long long current_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long long pages, resident;
    int ok = f && fscanf(f, "%lld %lld", &pages, &resident) == 2;
    if (f) fclose(f);
    return ok ? resident * sysconf(_SC_PAGESIZE) : -1;
}

/* --progress: one line per N tokens read, so a long run can be followed
 * (and its memory curve drawn) while it goes. */
static void report_progress(engine_doc *d, long long every, long long *next, double t0) {
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    if (every <= 0 || st.tokens_read < *next) return;
    *next = (st.tokens_read / every + 1) * every;
    fprintf(stderr,
            "{\"tokens_read\": %lld, \"seconds\": %.1f, \"rss_bytes\": %lld, \"compressions\": %lld, "
            "\"tokens_in_pot\": %d}\n",
            (long long)st.tokens_read, (monotonic_ms() - t0) / 1e3, current_rss_bytes(),
            (long long)st.compressions, st.tokens_in_pot);
}

typedef struct answer_buf {
    char *text;
    size_t len, cap;
    int stream; /* print as it comes */
} answer_buf;

static int collect_answer(void *user, const char *text, size_t len, int32_t token,
                          const sample_logprobs *lp) {
    (void)token;
    (void)lp;
    answer_buf *a = user;
    if (a->stream) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (a->len + len + 1 > a->cap) {
        size_t cap = (a->len + len + 1) * 2;
        char *nt = realloc(a->text, cap);
        if (!nt) return 1;
        a->text = nt;
        a->cap = cap;
    }
    memcpy(a->text + a->len, text, len);
    a->len += len;
    a->text[a->len] = 0;
    return 0;
}

/* int_flag for the ingest settings, which are 32-bit. */
static int int_flag(const flag *flags, const parsed *p, const char *name, int64_t lo, int64_t hi,
                    int32_t *out, char *err, size_t errlen) {
    int64_t x = *out;
    if (int64_flag(flags, p, name, lo, hi, &x, err, errlen)) return -1;
    *out = (int32_t)x;
    return 0;
}

static int ingest_settings(const parsed *p, engine_pot_settings *s, int32_t *n_predict,
                           int64_t track[2], char *err, size_t errlen) {
    const flag *f = ingest_flags;
    *s = engine_pot_settings_default();
    if (int_flag(f, p, "--budget", 1, 1 << 24, &s->budget_tokens, err, errlen) ||
        int_flag(f, p, "--keep", 1, 1 << 24, &s->keep_tokens, err, errlen) ||
        int_flag(f, p, "--chunk", 1, 1 << 24, &s->chunk_tokens, err, errlen) ||
        int_flag(f, p, "--finch-keep", 1, 1 << 24, &s->finch_keep, err, errlen) ||
        int_flag(f, p, "--pool-width", 1, 1 << 24, &s->pool_width, err, errlen) ||
        int_flag(f, p, "--n-predict", 0, 1 << 20, n_predict, err, errlen) ||
        needs_flag(f, p, "--n-predict", "--question", err, errlen) ||
        needs_flag(f, p, "--late-question", "--question", err, errlen))
        return -1;
    const char *v = flag_val(f, p, "--nuc-share");
    double share;
    if (v) {
        if (config_parse_float("--nuc-share", v, 0, 1, &share, err, errlen)) return -1;
        s->nuc_share = (float)share;
    }
    s->policy = flag_val(f, p, "--policy");
    if (flag_val(f, p, "--late-question") && (!s->policy || strcmp(s->policy, "finch"))) {
        snprintf(err, errlen, "--late-question is a stage of --policy finch");
        return -1;
    }
    s->schedule = flag_val(f, p, "--schedule");
    s->catalyst = flag_val(f, p, "--catalyst");
    s->system = flag_val(f, p, "--system");
    s->plain = flag_val(f, p, "--plain") != NULL;
    s->score_max = flag_val(f, p, "--score-max") != NULL;
    s->whole_words = flag_val(f, p, "--whole-words") != NULL;
    s->no_catalyst = flag_val(f, p, "--no-catalyst") != NULL;
    s->original_positions = flag_val(f, p, "--no-reset-positions") != NULL;
    if (!flag_val(f, p, "--late-question")) s->question = flag_val(f, p, "--question");
    track[0] = track[1] = -1;
    if ((v = flag_val(f, p, "--track"))) {
        long long a, b;
        char tail;
        if (sscanf(v, "%lld:%lld%c", &a, &b, &tail) != 2 || a < 0 || b <= a) {
            snprintf(err, errlen, "--track: '%s' is not A:B with 0 <= A < B", v);
            return -1;
        }
        track[0] = a;
        track[1] = b;
    }
    return 0;
}

/* Share of document tokens [a, b) present in the pot, over all (layer, head),
 * and per layer into per_layer (n_layer entries). */
static double tracked_share(const engine_doc *d, const engine_info *in, int64_t a, int64_t b,
                            double *per_layer) {
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    int64_t *idx = malloc((size_t)(st.tokens_in_pot ? st.tokens_in_pot : 1) * sizeof *idx);
    double total = 0;
    for (int32_t l = 0; l < in->n_layer; l++) {
        double layer = 0;
        for (int32_t h = 0; h < in->n_head_kv && idx; h++) {
            int32_t n = engine_doc_kept(d, l, h, idx, st.tokens_in_pot), hit = 0;
            for (int32_t i = 0; i < n; i++) hit += idx[i] >= a && idx[i] < b;
            layer += (double)hit / (double)(b - a);
        }
        per_layer[l] = layer / in->n_head_kv;
        total += per_layer[l];
    }
    free(idx);
    return total / in->n_layer;
}

int cli_ingest(int argc, char **argv) {
    /* the document is the one argument that is not a flag or a flag's value */
    const char *file = NULL;
    char *args[256];
    int n_args = 0;
    for (int i = 0; i < argc && n_args < 256; i++) {
        int is_value = 0;
        if (i > 0 && (argv[i][0] != '-' || !strcmp(argv[i], "-"))) {
            for (int k = 0; ingest_flags[k].name; k++)
                if (ingest_flags[k].arg && (!strcmp(argv[i - 1], ingest_flags[k].name) ||
                                            (ingest_flags[k].alias && !strcmp(argv[i - 1], ingest_flags[k].alias))))
                    is_value = 1;
            if (!is_value && !file) {
                file = argv[i];
                continue;
            }
        }
        args[n_args++] = argv[i];
    }
    parsed p;
    int r = parse_flags(n_args, args, "-m MODEL FILE [options]", ingest_flags, &p);
    if (r) return r > 0 ? 0 : 2;
    char err[512];
    engine_pot_settings set;
    int32_t n_predict = 64;
    int64_t track[2];
    if (!file) {
        fprintf(stderr, "potserve ingest: FILE is required (see --help)\n");
        return 2;
    }
    if (ingest_settings(&p, &set, &n_predict, track, err, sizeof err)) {
        fprintf(stderr, "potserve ingest: %s\n", err);
        return 2;
    }
    int json = flag_val(ingest_flags, &p, "--json") != NULL;
    const char *question = flag_val(ingest_flags, &p, "--question");
    const char *pv = flag_val(ingest_flags, &p, "--progress");
    char *pv_end = NULL;
    long long every = pv ? strtoll(pv, &pv_end, 10) : 0, next_report = every;
    if (pv && (every <= 0 || *pv_end)) {
        fprintf(stderr, "potserve ingest: --progress: '%s' is not a positive token count\n", pv);
        return 2;
    }
    FILE *in = strcmp(file, "-") ? fopen(file, "rb") : stdin;
    if (!in) {
        fprintf(stderr, "potserve ingest: cannot open %s: %s\n", file, strerror(errno));
        return 1;
    }
    engine *e = open_model("ingest", ingest_flags, &p);
    engine_doc *d = e ? engine_doc_open(e, &set, err, sizeof err) : NULL;
    int rc = 1;
    answer_buf ans = {.stream = !json};
    engine_gen_result res = {0};
    double answer_ms = 0;
    if (!d) {
        if (e) fprintf(stderr, "potserve ingest: %s\n", err);
        goto out;
    }
    double t_start = monotonic_ms();
    static char buf[1 << 16];
    for (;;) {
        size_t got = fread(buf, 1, sizeof buf, in);
        int final = got < sizeof buf && (feof(in) || ferror(in));
        if (ferror(in)) {
            fprintf(stderr, "potserve ingest: reading %s failed: %s\n", file, strerror(errno));
            goto out;
        }
        if (engine_doc_feed(d, buf, got, final, err, sizeof err)) {
            fprintf(stderr, "potserve ingest: %s\n", err);
            goto out;
        }
        report_progress(d, every, &next_report, t_start);
        if (final) break;
    }
    if (question) {
        engine_gen_params gp = {.sampling = sample_params_default(), .max_tokens = n_predict};
        gp.sampling.temperature = 0;
        double t0 = monotonic_ms();
        if (engine_doc_answer(d, question, &gp, collect_answer, &ans, &res, err, sizeof err)) {
            fprintf(stderr, "potserve ingest: %s\n", err);
            goto out;
        }
        answer_ms = monotonic_ms() - t0;
        if (!json) printf("\n");
    }
    engine_doc_stats st;
    engine_doc_get_stats(d, &st);
    engine_info info;
    engine_get_info(e, &info);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double tps = st.tokens_read / (st.ingest_ms / 1e3 + 1e-9);
    double *per_layer = calloc((size_t)info.n_layer, sizeof *per_layer);
    double share = track[0] >= 0 && per_layer ? tracked_share(d, &info, track[0], track[1], per_layer) : -1;
    if (json) {
        json_t *o = json_object(), *layers = json_array();
        json_object_set_new(o, "answer", json_string(ans.text ? ans.text : ""));
        json_object_set_new(o, "policy", json_string(set.policy ? set.policy : "infinipot"));
        json_object_set_new(o, "schedule", json_string(set.schedule ? set.schedule : "fixed"));
        json_object_set_new(o, "budget_tokens", json_integer(st.budget_tokens));
        json_object_set_new(o, "keep_tokens", json_integer(st.keep_tokens));
        json_object_set_new(o, "bytes_read", json_integer(st.bytes_read));
        json_object_set_new(o, "tokens_read", json_integer(st.tokens_read));
        json_object_set_new(o, "tokens_in_pot", json_integer(st.tokens_in_pot));
        json_object_set_new(o, "pinned_tokens", json_integer(st.pinned_tokens));
        json_object_set_new(o, "chunks", json_integer(st.chunks));
        json_object_set_new(o, "compressions", json_integer(st.compressions));
        json_object_set_new(o, "ingest_ms", json_real(st.ingest_ms));
        json_object_set_new(o, "compress_ms", json_real(st.compress_ms));
        json_object_set_new(o, "compress_share", json_real(st.compress_ms / (st.ingest_ms + 1e-9)));
        json_object_set_new(o, "ingest_tokens_per_s", json_real(tps));
        json_object_set_new(o, "answer_ms", json_real(answer_ms));
        json_object_set_new(o, "answer_tokens", json_integer(res.n_generated));
        json_object_set_new(o, "peak_rss_bytes", json_integer((json_int_t)ru.ru_maxrss * 1024));
        json_object_set_new(o, "pot_bytes", json_integer((json_int_t)st.pot_bytes));
        if (st.ring_entries) json_object_set_new(o, "ring_entries", json_integer(st.ring_entries));
        if (share >= 0) {
            for (int32_t l = 0; l < info.n_layer; l++) json_array_append_new(layers, json_real(per_layer[l]));
            json_object_set_new(o, "tracked_kept_share", json_real(share));
            json_object_set_new(o, "tracked_kept_share_by_layer", layers);
        } else {
            json_decref(layers);
        }
        char *txt = json_dumps(o, JSON_COMPACT);
        if (txt) puts(txt);
        free(txt);
        json_decref(o);
    } else {
        fprintf(stderr,
                "read %lld tokens (%lld bytes) in %lld chunks at %.1f tokens/s; %lld compressions "
                "(%.1f%% of ingest time); pot %d/%d entries, %.1f MB; peak RSS %.1f MB\n",
                (long long)st.tokens_read, (long long)st.bytes_read, (long long)st.chunks, tps,
                (long long)st.compressions, 100 * st.compress_ms / (st.ingest_ms + 1e-9),
                st.tokens_in_pot, st.budget_tokens, st.pot_bytes / 1e6, ru.ru_maxrss / 1024.0);
        if (share >= 0)
            fprintf(stderr, "tokens %lld..%lld: %.1f%% kept across layers and heads\n",
                    (long long)track[0], (long long)track[1], 100 * share);
    }
    free(per_layer);
    rc = 0;
out:
    free(ans.text);
    engine_doc_close(d);
    engine_close(e);
    if (in != stdin) fclose(in);
    return rc;
}
