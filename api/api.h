/* api/: the HTTP contract's JSON (docs/api.md) with jansson: parsing and
 * validating requests into engine terms, building responses and OpenAI-shaped
 * errors. Knows nothing of sockets; the server calls it with whole bodies. */
#ifndef POTSERVE_API_H
#define POTSERVE_API_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

/* An error as docs/api.md shapes it; type follows from status. */
typedef struct api_error {
    int status;
    const char *code;  /* static string or NULL */
    const char *param; /* static string or NULL */
    char message[320];
} api_error;

/* Fills e (status, code, param, printf-style message); returns -1 so
 * callers can `return api_fail(...)`. */
int api_fail(api_error *e, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error": {...}} for e; the caller owns it. */
json_t *api_error_json(const api_error *e);
/* The error type docs/api.md names for a status. */
const char *api_error_type(int status);
/* A name as OpenAI requires of tools and response formats: 1 to 64 of a-z,
 * A-Z, 0-9, _ and - (a tool's name is written into its calls' markup). */
int api_name_is_valid(const char *name);

/* The OpenAPI document of this API (api/openapi.json, embedded; static, NUL-terminated). */
const char *api_openapi_json(size_t *len);

/* A JSON string of n bytes of document text (new reference; NULL when memory
 * is short): a byte that is not part of a valid UTF-8 sequence becomes U+FFFD,
 * as jansson takes only UTF-8; NUL bytes stay. */
json_t *api_text_json(const char *s, size_t n);
/* The same for a token's piece in logprobs: each byte of an invalid or
 * incomplete sequence (a piece of a character split over tokens) as the 4
 * characters \xNN, lowercase hex, as DeepSeek's API writes them. */
json_t *api_piece_json(const char *s, size_t n);

/* Parses a JSON object body; NULL + e (400) for anything else. */
json_t *api_parse_object(const char *body, size_t n, api_error *e);

/* ---- sessions --------------------------------------------------------------------- */

/* "recall" of a session or a request: true, false, or "auto" (only when the
 * session's pot has dropped some of its document: server/recall.h). */
enum api_recall { API_RECALL_UNSET = -1, API_RECALL_OFF = 0, API_RECALL_ON = 1, API_RECALL_AUTO = 2 };
/* API_RECALL_* of a config or JSON string ("true", "false", "auto"); UNSET for anything else. */
int api_recall_from_name(const char *name);
/* The JSON value of an API_RECALL_* other than UNSET (new reference). */
json_t *api_recall_json(int recall);

/* "whole_words" of a session: true (every pot of the session keeps a word or
 * number whole or drops it whole), false (none does), or "question" (the
 * default: only the pots a question guides do, a re-read's and a finch
 * session's with its question up front; docs/results/longdoc.md measures why). */
enum api_whole_words { API_WHOLE_WORDS_OFF = 0, API_WHOLE_WORDS_ON = 1, API_WHOLE_WORDS_QUESTION = 2 };
/* The JSON value of an API_WHOLE_WORDS_* (new reference). */
json_t *api_whole_words_json(int whole_words);

typedef struct api_session_settings {
    engine_pot_settings pot; /* strings point into `root` */
    json_t *metadata;        /* object (borrowed from root) */
    int64_t ttl_seconds;     /* 0 = never expires */
    int reread;              /* "reread": questions re-read the document from the chunk log
                                through a pot guided by the question (server/reread.c) */
    int recall;              /* "recall" (enum api_recall; UNSET: the server's setting): questions
                                come with the passages of the document that share their words
                                (engine/recall.h, server/recall.c) */
    int whole_words;         /* "whole_words" (enum api_whole_words); pot.whole_words is its
                                session pot's part, server/reread.c reads the re-read's */
    json_t *root;            /* owns everything above */
} api_session_settings;

/* Validates a session-creation body (NULL = every default) against the
 * model's window: 400 for wrong types, 422 naming the field for settings that
 * cannot work. default_budget / default_policy come from the server's config.
 * out keeps a reference to body. */
int api_parse_session_settings(json_t *body, int32_t n_ctx, int32_t default_budget, const char *default_policy,
                               api_session_settings *out, api_error *e);
void api_session_settings_free(api_session_settings *s);

/* Settings as stored in a session's meta file and restored from it. */
json_t *api_session_settings_json(const api_session_settings *s);

/* ---- generation ------------------------------------------------------------------- */

typedef struct api_gen_request {
    int chat;                  /* /v1/chat/completions (else /v1/completions) */
    engine_message *messages;  /* chat: strings borrowed from root */
    size_t n_messages;
    const char *prompt;        /* completions: text, or NULL when tokens are given */
    int32_t *prompt_tokens;    /* completions: token array */
    size_t n_prompt_tokens;
    engine_gen_params params;  /* stop and bias arrays owned here */
    int stream, include_usage, logprobs, top_logprobs;
    int n_returned;            /* answers returned per prompt (n): the likeliest of n_choices when fewer */
    int echo;                  /* completions: the prompt (and its tokens' logprobs) before each answer */
    const char *suffix;        /* completions: the text after the answer (fill-in-the-middle), or NULL */
    const char *session;       /* "session" field or NULL */
    int overflow_error;        /* "overflow": "error" */
    int enable_thinking;       /* chat: "enable_thinking" (or chat_template_kwargs'), default 1 (Qwen3) */
    int reread;                /* "reread": -1 absent (the session's setting), 0 or 1 */
    int recall;                /* "recall": API_RECALL_UNSET absent (the session's setting), or as a session's */
    const char *model;
    json_t *root;
    const char **stops;
    logit_bias *bias;
    json_t *format_schema;     /* response_format's schema, compiled by api_gen_request_compile (owned) */
    grammar *grammar;          /* response_format's or a forced tool call's constraint, once compiled (owned) */
    /* tools (tools.c) */
    json_t *tools;             /* the non-empty "tools" array (borrowed from root) or NULL */
    enum { TOOL_CHOICE_NONE, TOOL_CHOICE_AUTO, TOOL_CHOICE_REQUIRED, TOOL_CHOICE_NAMED } tool_choice;
    const char *tool_name;     /* TOOL_CHOICE_NAMED */
    int parallel_tool_calls;
    const char *tool_format;   /* "chatml" or "llama3" once api_render_tools ran with tools */
    int n_choices;             /* answers made per prompt (1..API_MAX_N): "n", or "best_of" when larger */
    /* completions with a list of prompts: prompt i is batch_texts[i] or
     * batch_tokens[i][0..batch_counts[i]); the first is also prompt /
     * prompt_tokens. n_batch is 1 for one prompt. */
    size_t n_batch;
    const char **batch_texts;
    int32_t **batch_tokens;
    size_t *batch_counts;
} api_gen_request;

enum { API_MAX_N = 16, API_MAX_BATCH = 64 };

/* Validates a chat (chat = 1) or completions request body (parsed with
 * api_parse_object). n_vocab bounds token ids and logit_bias keys. out keeps
 * a reference to body, whose strings it points into, and adds to body the
 * strings it composes (under keys that start with \x01). */
int api_parse_gen_request(json_t *body, int chat, int32_t n_vocab, api_gen_request *out, api_error *e);
void api_gen_request_free(api_gen_request *r);

/* /tokenize and /detokenize bodies (parsed with api_parse_object). tokenize:
 * *root is a new reference to body, which *content points into. */
int api_parse_tokenize(json_t *body, const char **content, int *add_special, json_t **root, api_error *e);
int api_parse_detokenize(json_t *body, int32_t n_vocab, int32_t **tokens, size_t *n_tokens, api_error *e);

/* /v1/embeddings: input is a string, an array of strings, an array of token
 * ids, or an array of such arrays (one kind per request); texts[i] (pointing
 * into root) or tokens[i] (counts[i] ids) for each of the n inputs. */
enum { API_MAX_EMBED_INPUTS = 2048 };
typedef struct api_embed_request {
    json_t *root;
    size_t n;
    const char **texts; /* [n]: NULL for an input of token ids */
    int32_t **tokens;   /* [n]: NULL for a text input */
    size_t *counts;
    int base64;         /* encoding_format "base64": little-endian float32s */
} api_embed_request;
/* 0, or -1 + a 400 naming the field (dimensions other than n_embd: 400
 * unsupported_value). Free q with api_embed_request_free either way. */
int api_parse_embeddings(json_t *body, int32_t n_vocab, int32_t n_embd, api_embed_request *q, api_error *e);
void api_embed_request_free(api_embed_request *q);

/* ---- structured outputs (schema.c) ------------------------------------------------- */

/* Compiles a JSON Schema into a grammar (the subset schema.c lists); NULL +
 * a 400 naming param and the unsupported keyword. Caller owns the grammar. */
grammar *api_schema_grammar(json_t *schema, const char *param, api_error *e);
/* body's response_format checked: *schema = NULL for none or text, else the
 * JSON Schema its output must meet (a new reference; compiled later, by
 * api_schema_grammar). 0, or -1 + a 400 with param "response_format". */
int api_parse_response_format(json_t *body, json_t **schema, api_error *e);

/* Compiles schema into g (its $refs resolve against schema); the node id,
 * or -1 + a 400 naming param. */
int api_schema_node(grammar *g, json_t *schema, const char *param, api_error *e);

/* ---- tool calls (tools.c) ------------------------------------------------------------ */

/* tools, tool_choice and parallel_tool_calls of a chat request. */
int api_parse_tools(api_gen_request *r, api_error *e);
/* Rewrites r->messages for the chat template family: the tool definitions,
 * assistant tool calls and tool results in the family's format. 400 when
 * the family has none and the request has tools or tool turns. */
int api_render_tools(api_gen_request *r, const char *family, api_error *e);
/* The grammar that makes the output one call of a tool (tool_choice
 * required: any tool; named: that one), its arguments valid against the
 * tool's parameters. Caller owns it; NULL + e. */
grammar *api_tool_call_grammar(const api_gen_request *r, api_error *e);
/* The grammar a parsed request's output must follow, compiled into
 * r->grammar and r->params.grammar: response_format's schema, or a forced
 * tool call's (which replaces it). Up to a second of CPU for a costly pattern:
 * off the event loop when api_gen_request_constrained. 0, or -1 + a 400. */
int api_gen_request_compile(api_gen_request *r, api_error *e);
int api_gen_request_constrained(const api_gen_request *r);
/* The tool calls in generated text as OpenAI's message.tool_calls (caller
 * owns), or NULL when there are none; *content: the text around them
 * (malloc'd, NULL when empty). A call max_tokens cut open is not text: it is
 * dropped (the answer's finish_reason says length), and [] comes back when
 * it was the only one. */
json_t *api_find_tool_calls(const api_gen_request *r, const char *text, size_t len, char **content);
/* With tool_choice auto, how many bytes at the start of the text generated so
 * far are surely an answer's text, not the start of a call: what a stream may
 * send as content now (api_find_tool_calls' content, or the whole text when no
 * call comes, begins with them, less any whitespace before them). Whitespace
 * at their end waits, as it would be trimmed before a call. 0 with other choices. */
size_t api_tool_text_ready(const api_gen_request *r, const char *text, size_t len);
/* The answer's first call as far as text has come, to stream as it is written:
 * a forced call (api_forced_call_progress), or with tool_choice auto one the
 * model writes in its template's format once its name is whole and names a
 * tool; the same outputs. NULL before (an auto call written in another shape,
 * arguments first, comes whole at the end). */
const char *api_call_progress(const api_gen_request *r, const char *text, size_t len, size_t *args_at,
                              size_t *args_len, int *whole);
/* The call tool_choice required or named forces, as far as text has come: the
 * tool's name once sure (NULL before, or when no call is forced), where its
 * arguments start (*args_at) and how many bytes of them are written
 * (*args_len: through their closing brace once written, *whole then 1; never
 * the call's end after them). A stream sends the arguments as they come. */
const char *api_forced_call_progress(const api_gen_request *r, const char *text, size_t len, size_t *args_at,
                                     size_t *args_len, int *whole);
/* A call that tool_choice required or named forced and max_tokens cut short
 * (text: the answer as generated): [the call], its arguments as far as they
 * came (a JSON string that need not parse yet), or [] when it was cut before
 * a tool's name was sure; NULL when tool_choice forces no call. */
json_t *api_cut_tool_call(const api_gen_request *r, const char *text, size_t len);
/* prefix + 24 random alphanumerics. */
void api_random_id(char *out, size_t cap, const char *prefix);

/* OpenAI finish_reason of an engine finish. */
const char *api_finish_reason(enum engine_finish f);

#endif
