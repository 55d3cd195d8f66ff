/* potserve engine: load a GGUF model, tokenize, render chat templates, and
 * generate. The public header of engine/; everything else in engine/ is
 * private to it (the sampling types of sample.h are re-exported here). */
#ifndef POTSERVE_ENGINE_H
#define POTSERVE_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar.h"
#include "engine/sample.h"

typedef struct engine engine;

/* The chat template families (rendered by engine/chat.c), the one list their
 * enum, names and messages derive from: X(ID, "name") per family, SEP between two. */
#define ENGINE_CHAT_FAMILIES(X, SEP)                                                            \
    X(CHATML, "chatml") SEP   /* <|im_start|>role\n...<|im_end|>\n  (SmolLM2, Qwen2) */         \
    X(LLAMA2, "llama2") SEP   /* <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s> */    \
    X(LLAMA3, "llama3") SEP   /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */ \
    X(MISTRAL, "mistral") SEP /* [INST] ... [/INST] without <<SYS>> */                        \
    X(ZEPHYR, "zephyr") SEP   /* <|user|>\n...</s>\n<|assistant|>\n */                         \
    X(GEMMA, "gemma") SEP     /* <start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n */ \
    X(QWEN3, "qwen3") SEP     /* ChatML with <think>...</think> blocks after the last query */ \
    X(PHI3, "phi3")           /* <|user|>\n...<|end|>\n<|assistant|>\n (Phi-3.5-mini) */
#define ENGINE_NAME_STRING_(id, name) name
/* "chatml, llama2, ..." (a string literal) */
#define ENGINE_CHAT_TEMPLATE_LIST ENGINE_CHAT_FAMILIES(ENGINE_NAME_STRING_, ", ")

typedef struct engine_options {
    int n_threads;              /* <= 0: all online CPUs */
    const char *chat_template;  /* family name (ENGINE_CHAT_FAMILIES) overriding the GGUF's
                                   template, or NULL */
    int exact;                  /* 1: f32 activations in every matrix product (see cpu_backend_new)
                                   and f32 KV entries */
    int kv_f32;                 /* 1: f32 KV entries (f16 by default) */
    const char *backend;        /* "cpu" (NULL) or "cuda" (binaries built with make CUDA=1) */
} engine_options;

/* Loads the model at path. NULL + one line in err on any problem (bad file,
 * unsupported architecture or type, missing tokenizer, ...). Caller owns it. */
engine *engine_open(const char *path, const engine_options *opt, char *err, size_t errlen);
void engine_close(engine *e);

typedef struct engine_info {
    const char *arch, *name, *quant, *tokenizer, *chat_family; /* owned by the engine */
    const char *pooling;             /* how engine_embed pools: "mean", "cls", "last" */
    int32_t bos_added;               /* the BOS id tokenizing with add_special puts first, or -1 */
    int32_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
    float rope_base, norm_eps;
    const char *rope_scaling;        /* "none", "linear", "yarn", "llama3" */
    float rope_factor;               /* 1 / freq_scale */
    int32_t sliding_window, n_sliding_layers; /* 0, 0: every layer attends to everything */
    uint64_t n_params;
    int tied_output;
    int n_threads;
} engine_info;
void engine_get_info(const engine *e, engine_info *info);
/* Layer `layer`'s sliding window: it attends to its query and the window - 1
 * positions before it; 0 for a layer that attends to everything (or no such layer). */
int32_t engine_layer_window(const engine *e, int32_t layer);

/* Tokenizes text (see tokenizer_encode): returns the count (may exceed cap),
 * or -1 for invalid UTF-8. */
int64_t engine_tokenize(const engine *e, const char *text, size_t len, int add_special,
                        int parse_special, int32_t *out, int64_t cap);
/* Text of one token (special tokens rendered); returns its length or -1. */
int engine_token_text(const engine *e, int32_t id, char *buf, size_t cap);
int32_t engine_eos(const engine *e);
/* The text of n token ids (special tokens rendered; a character the ids cut
 * short, U+FFFD), malloc'd and NUL-ended,
 * its length in *len; NULL when out of memory, or with *len > limit when the
 * text would be longer than limit bytes. */
char *engine_detokenize(const engine *e, const int32_t *ids, size_t n, size_t limit, size_t *len);

typedef struct engine_message {
    const char *role, *content;
} engine_message;
/* The ids of messages rendered with the model's chat template (plus the
 * assistant header; enable_thinking: the template's thinking switch, Qwen3's,
 * others ignore it): only the template's own markers are control tokens, the
 * messages' text is read as text whatever it holds (a message cannot close
 * its turn with "<|im_end|>"). Malloc'd, the count in *n; NULL + err when the
 * template is not recognised (err lists the families and --chat-template
 * NAME) or the text is not valid UTF-8. */
int32_t *engine_chat_prompt(const engine *e, const engine_message *msgs, size_t n, int enable_thinking,
                            size_t *n_ids, char *err, size_t errlen);
/* Tokenizes a plain prompt (special-token text read as text, BOS per the
 * metadata). Returns a malloc'd array and its length in *n, NULL on error. */
int32_t *engine_tokenize_prompt(const engine *e, const char *prompt, size_t *n, char *err, size_t errlen);

/* A fill-in-the-middle prompt, as llama.cpp's infill builds it: BOS (when the
 * model adds one), the prefix marker, prefix's tokens, the suffix marker,
 * suffix's tokens, the middle marker (text never parsed for special tokens).
 * Malloc'd ids and their count in *n; NULL + err when the model has no FIM
 * markers (tokenizer_fim) or the text is not UTF-8. */
int32_t *engine_fim_prompt(const engine *e, const char *prefix, const char *suffix, size_t *n, char *err,
                           size_t errlen);

/* Logits of the last position after a full prefill of tokens, into
 * logits[n_vocab]. 0 or -1 + err. */
int engine_prompt_logits(engine *e, const int32_t *tokens, size_t n, float *logits, char *err,
                         size_t errlen);

/* Embeddings of n token lists (each non-empty, at most the model's window)
 * into out[n][n_embd]: each list's final-normed hidden states pooled as the
 * model says (engine_info.pooling: their mean, or the first or the last
 * token's), scaled to length 1, as llama.cpp computes them. A pot of each
 * list's length is held while they are read. 0 or -1 + err. */
int engine_embed(engine *e, const int32_t *const *inputs, const size_t *lens, size_t n, float *out, char *err,
                 size_t errlen);
/* engine_embed one forward at a time (at most 512 tokens of the inputs), so
 * that other work can run between steps: new (the arrays must outlive it; out
 * zeroed; NULL + err for an empty or too long input), then step until it
 * returns 0 (every embedding written; 1: more to read, *tokens: read by this
 * step; -1 + err), then free. Each input's pot is held from its first piece
 * to its last. */
typedef struct engine_embedder engine_embedder;
/* The most pot bytes an embedder of these inputs holds at once: the inputs of
 * one forward, of which only the first and the last can be longer than it. */
size_t engine_embed_memory(const engine *e, const size_t *lens, size_t n);
engine_embedder *engine_embedder_new(engine *e, const int32_t *const *inputs, const size_t *lens, size_t n,
                                     float *out, char *err, size_t errlen);
int engine_embedder_step(engine_embedder *x, int64_t *tokens, char *err, size_t errlen);
void engine_embedder_free(engine_embedder *x);

/* Each prompt token's log-probability given the tokens before it, and the
 * n_top likeliest tokens there, under the model's own distribution (no
 * sampling settings): out[1..n) (out[0] has token tokens[0] and n_top -1:
 * the first token has none). For echo on /v1/completions. Read in steps on
 * the engine thread, so that a window-long prompt need not hold the engine
 * for its whole prefill: _new (tokens and out are the caller's, kept until
 * _free), then _step until it says 1. NULL / -1 + err. */
typedef struct engine_logprob_reader engine_logprob_reader;
engine_logprob_reader *engine_logprob_reader_new(engine *e, const int32_t *tokens, size_t n, int32_t n_top,
                                                 sample_logprobs *out, char *err, size_t errlen);
/* Reads at least one and about max_tokens more of the prompt (*read says how
 * many): 1 when the prompt has been read whole, 0 when more is left, -1 + err. */
int engine_logprob_reader_step(engine_logprob_reader *r, size_t max_tokens, size_t *read, char *err, size_t errlen);
void engine_logprob_reader_free(engine_logprob_reader *r);

typedef struct engine_gen_params {
    sample_params sampling;
    int32_t max_tokens;          /* <= 0: until EOS or the context is full */
    const char *const *stop;     /* stop strings (not included in the output); not applied
                                    under a grammar (they would cut the value open) */
    size_t n_stop;
    const char *stop_guard;      /* stop strings apply only before it (stop_matcher_new); NULL: everywhere */
    const char *end_after;       /* the answer ends once it has written this (kept; under 32 bytes): the
                                    close of a tool call when only one is wanted; NULL: none */
    int want_logprobs;
    int32_t *tokens_out;         /* when non-NULL, receives the generated ids (room for max_tokens) */
    /* Recycled attention ("Recycled Attention" paper), off when recycle_stride <= 1: a full
     * attention step every recycle_stride steps picks, per (layer, KV head),
     * the recycle_keep entries the new token attends to most (max over the
     * group's query heads); the steps in between attend only to those plus the
     * tokens generated since. The full step's scores are max-pooled over
     * recycle_pool neighbouring slots before the top-K (odd; 0: 7, the Recycled Attention paper's
     * kernel, its largest quality effect; 1: each slot on its own score). */
    int32_t recycle_stride, recycle_keep, recycle_pool;
    /* Constrained decoding: only tokens the grammar accepts are sampled, and
     * the generation stops when the value is complete (NULL: off). Each
     * generation takes its own reference. */
    grammar *grammar;
} engine_gen_params;

/* The start of a generation's error when its prompt and the document's pot
 * together exceed the model's window (the server answers it as
 * context_length_exceeded). */
#define ENGINE_ERR_PROMPT_TOO_LONG "the question does not fit the model's context"

/* TIMEOUT: the scheduler's deadline (engine_gen_request.deadline_ms) passed, in
 * the queue, during the prefill or while decoding. */
enum engine_finish { ENGINE_FINISH_STOP = 0, ENGINE_FINISH_LENGTH = 1, ENGINE_FINISH_CANCELLED = 2,
                     ENGINE_FINISH_TIMEOUT = 3 };

typedef struct engine_gen_result {
    int64_t n_prompt, n_generated;
    int64_t n_cached;            /* pot entries the prompt was read after (documents) */
    enum engine_finish finish;
    double prefill_ms, decode_ms;
    int64_t n_masked;            /* constrained decoding: steps that built the token mask */
} engine_gen_result;

/* Called with each piece of text that is safe to emit (complete UTF-8, no
 * part of a stop string), in order; `token` is the token whose sampling
 * released it (-1 for what is released at the end) and `lp` is NULL.
 * With want_logprobs, every generated token's log-probabilities also come
 * exactly once, in order, as `lp` (and `token` = lp->token), on the call
 * that releases the first byte of its text (a token whose piece is empty:
 * with the text released after it, or at the end). When one release covers several tokens (a
 * character split over tokens, text held back as a possible stop string),
 * each comes in a call of its own, all but the last with len 0, and the
 * text with the last; text that no pending token's logprobs go with comes
 * with token -1 and lp NULL. Not reported: the end-of-generation token, and
 * tokens whose text a stop string cuts off entirely (the token completing
 * a stop string is reported when some of its text comes before the stop
 * string). Return nonzero to cancel. */
typedef int (*engine_text_cb)(void *user, const char *text, size_t len, int32_t token,
                              const sample_logprobs *lp);

/* Prefills prompt[n_prompt] and generates. Returns 0 (res filled) or -1 + err. */
int engine_generate(engine *e, const int32_t *prompt, size_t n_prompt, const engine_gen_params *p,
                    engine_text_cb cb, void *user, engine_gen_result *res, char *err,
                    size_t errlen);

/* ---- documents read through a memory pot (ingest.c) ---------------------------
 * A document of any length is tokenized as its bytes arrive (the same tokens
 * however it is split), run through the pot in chunks chosen by the schedule,
 * and compressed by the policy whenever the pot fills. Questions are then
 * answered over the pot without changing it. */

typedef struct engine_doc engine_doc;

typedef struct engine_pot_settings {
    const char *policy;       /* a name of cache/cache.h's POT_POLICIES; NULL: infinipot */
    int32_t budget_tokens;    /* |M|: entries the pot holds at most (default 2048) */
    int32_t keep_tokens;      /* |C|: entries kept by a compression (default budget/2) */
    const char *schedule;     /* fixed (NULL) or imdc */
    int32_t chunk_tokens;     /* engine chunk (0: min(512, budget/4)) */
    const char *catalyst;     /* InfiniPot's catalyst prompt (NULL: the paper's general CaP) */
    const char *question;     /* known up front: finch scores every chunk with it */
    const char *system;       /* system message, pinned before the document (chat mode) */
    float nuc_share;          /* InfiniPot's alpha: share of kept entries chosen by surprisal (0.5) */
    int32_t pool_width;       /* max pooling of infinipot's and finch's scores over this many
                                 neighbouring slots, so that kept tokens come as spans (odd; 1: the
                                 papers' per-token choice; 0: the default, 15; snapkv: its mean
                                 pooling, default 5) */
    int score_max;            /* combine the query heads of a KV group by max, not sum */
    int plain;                /* no chat template: the document and question as plain text */
    int32_t finch_keep;       /* two-stage FINCH at answer time: refine the pot to this many
                                 entries with the question's attention (0: off) */
    int record_tokens;        /* keep every token read (tests; memory then grows) */
    /* InfiniPot ablations (the InfiniPot paper's Table 4); both off by default */
    int no_catalyst;          /* score with the chunk's own last rows instead of the catalyst */
    int original_positions;   /* no context reset: entries keep their document positions
                                 (a plain sliding cache) */
    /* question-agnostic selection on non-repetitive text (docs/methods.md) */
    int score_memory;         /* infinipot: an entry's CaP score is the best any compression gave
                                 it, not the latest one */
    int nuc_relative;         /* infinipot: NuC ranks a token's surprisal minus its neighbourhood's
                                 mean (32 tokens each side, within the chunk) */
    int32_t nuc_regions;      /* infinipot: > 1 gives each of this many equal parts of the document
                                 read so far an equal share of NuC's slots (0, 1: off) */
    int reconstruct;          /* infinipot: each chunk is scored when read by the attention of
                                 rows that repeat it ("Repeat the previous context:" + the chunk,
                                 the KVzip paper's query-agnostic score), kept as each entry's best;
                                 these replace the catalyst's scores (reading costs about twice) */
    int shared_selection;     /* infinipot, finch, snapkv: every layer and head keeps the same
                                 entries, chosen by scores summed over them */
    int whole_words;          /* infinipot, finch, snapkv: a word or number is kept or dropped
                                 whole (its tokens ranked by the best of their scores), never cut */
    int key_diff;             /* infinipot: CaP's share is chosen by how little an entry's key
                                 resembles its head's mean key direction (the KeyDiff paper's
                                 -cos(k, mean of k/|k|), pre-RoPE keys) instead of a catalyst's
                                 attention: no scoring rows are run */
    int observe_rows;         /* infinipot: the chunk's last 32 rows (SnapKV's observation
                                 window) score together with the catalyst's rows */
    int row_max;              /* the scoring rows' attention to an entry combined by its max over
                                 the rows, not its sum (with reconstruct and score_max: KVzip's
                                 score, max over the repeating rows and the group's heads) */
} engine_pot_settings;

/* Fills the defaults above. */
engine_pot_settings engine_pot_settings_default(void);

/* The prompt cache of generations without a document (engine_sched): the
 * KV entries of up to `entries` recent prompts, max_bytes in all, reused for
 * the longest shared prefix of a later prompt (its res.n_cached). 0 entries
 * turn it off (the default). Call before the scheduler starts. 0 or -1. */
int engine_set_prompt_cache(engine *e, int entries, size_t max_bytes);

typedef struct engine_doc_stats {
    int64_t bytes_read, tokens_read;  /* document tokens (the pinned prefix not counted) */
    int32_t tokens_in_pot, pinned_tokens, budget_tokens, keep_tokens;
    int64_t compressions, chunks;
    double ingest_ms, compress_ms;    /* compress_ms: selection and compaction */
    size_t pot_bytes;
    int32_t ring_entries;             /* entries each sliding-window layer keeps in its ring
                                         (window - 1 + a chunk with its scoring rows); 0: no ring */
} engine_doc_stats;

/* Bytes the pot of a document with these settings holds (for admission
 * control before opening it). */
size_t engine_doc_memory(const engine *e, const engine_pot_settings *s);
/* Bytes of device memory all pots together may take when the backend keeps
 * pots on a device (cuda); 0 when pots live in host memory. Admission
 * control counts engine_doc_memory against the smaller of this and its own
 * limit. */
size_t engine_pot_device_memory(const engine *e);

struct pot;
struct select_params;
/* Diagnostics: called on the engine thread at each of d's compressions, after
 * the selection and before the compaction, with the pot, the selection's
 * parameters (sp->scores as the policy used them, sp->why filled) and ctx. */
typedef void (*engine_compress_hook)(void *ctx, const struct pot *p, const struct select_params *sp);
/* Sets (hook NULL: clears) d's compression hook; ctx stays the caller's. */
void engine_doc_on_compress(engine_doc *d, engine_compress_hook hook, void *ctx);

/* Starts a document: validates the settings (one line naming the bad one) and
 * ingests the pinned prefix. NULL + err on failure. Caller owns it. */
engine_doc *engine_doc_open(engine *e, const engine_pot_settings *s, char *err, size_t errlen);
/* Whether engine_doc_open would take the settings, without a pot: 0, or -1 + err. */
int engine_doc_check(engine *e, const engine_pot_settings *s, char *err, size_t errlen);
void engine_doc_close(engine_doc *d);
/* Feeds n bytes of the document; final = 1 with the last piece. Runs every
 * engine chunk that is ready. 0, or -1 + err (invalid UTF-8, policy none
 * overflowing, ...); after an error the document is unusable. */
int engine_doc_feed(engine_doc *d, const char *bytes, size_t n, int final, char *err,
                    size_t errlen);
void engine_doc_get_stats(const engine_doc *d, engine_doc_stats *st);
/* Answers a question over the pot (which is not changed). */
int engine_doc_answer(engine_doc *d, const char *question, const engine_gen_params *gp,
                      engine_text_cb cb, void *user, engine_gen_result *res, char *err,
                      size_t errlen);
/* Logits after the question's prompt (for exactness tests), into logits[n_vocab]. */
int engine_doc_answer_logits(engine_doc *d, const char *question, float *logits, char *err,
                             size_t errlen);
/* How much the question's prompt rows attend to each entry of d's pot (the
 * pending tail run into a copy of it first; d's pot is not changed): the
 * softmax probabilities summed over the rows and a KV group's query heads,
 * for every (layer, KV head) and slot j < *n: score[(layer * n_head_kv +
 * head) * cap + j], and the entry's document token index in pos[...] at the
 * same place (negative: the pinned prefix). cap >= the pot's entries plus the
 * pending tail (else an error). For diagnostics (longdoc_bench --attend). */
int engine_doc_question_attention(engine_doc *d, const char *question, int32_t cap, float *score,
                                  int64_t *pos, int32_t *n, char *err, size_t errlen);
/* Every token the pot has read, with record_tokens (else NULL): prefix,
 * document, and the last answer's question prompt after them. */
const int32_t *engine_doc_tokens(const engine_doc *d, size_t *n);
/* For (layer, head), the document token indices (0 = first document token)
 * of the entries in the pot, in slot order; returns the count. A
 * sliding-window layer's are the newest window - 1 (all its next token sees;
 * its ring holds no other entry that is ever read). */
int32_t engine_doc_kept(const engine_doc *d, int32_t layer, int32_t head, int64_t *out,
                        int32_t cap);

/* A document's tokens again from its text, fed in pieces: the ids a
 * document of these bytes reads (engine_doc_push's tokenizer: the same ids
 * however the text is split), so that document token indices (engine_doc_kept)
 * can be mapped back to text. Caller owns it (engine_doc_text_reader_free). */
typedef struct engine_doc_text_reader engine_doc_text_reader;
engine_doc_text_reader *engine_doc_text_reader_new(const engine *e);
void engine_doc_text_reader_free(engine_doc_text_reader *r);
/* Feeds n bytes (final = 1 at the document's end); appends the ids now
 * certain to *ids (realloc'd; caller frees) and *n_ids. 0, or -1 for invalid
 * UTF-8. */
int engine_doc_text_reader_feed(engine_doc_text_reader *r, const char *bytes, size_t n, int final,
                                int32_t **ids, size_t *n_ids);

/* Pushes n bytes of the document into its token queue without running the
 * model (tokenizing only); final = 1 with the last piece. 0 or -1 + err
 * (invalid UTF-8: the document is then unusable). */
int engine_doc_push(engine_doc *d, const char *bytes, size_t n, int final, char *err,
                    size_t errlen);
/* From any thread: d fails at its next push or chunk (the chunk under way
 * finishes), so the queued ingests of a document that is about to be
 * replaced end at once instead of running. d stays its owner's to close. */
void engine_doc_cancel(engine_doc *d);
/* Engine thread: d is cancelled, as by engine_doc_cancel, once *flag is
 * nonzero (one flag set by another thread for many documents: the server
 * abandons the replays under way when it stops); NULL: no longer. */
void engine_doc_abandon_when(engine_doc *d, const atomic_int *flag);
/* Engine thread: the same, once every one of the n flags is nonzero (a pot
 * read for several questions stops when all their clients have left); the
 * array stays the caller's, unchanged but for flags swapped for ones already
 * set, until d is closed or flags is NULL. */
void engine_doc_abandon_when_all(engine_doc *d, const atomic_int *const *flags, int n);
/* Document tokens pushed so far (run or waiting). */
int64_t engine_doc_tokens_pushed(const engine_doc *d);
/* 1 when an engine chunk is ready using only the first `limit` document
 * tokens (a value engine_doc_tokens_pushed gave): the scheduler's test that
 * the bytes of one push have all been run, except what waits for more. */
int engine_doc_ready_within(engine_doc *d, int64_t limit);
/* Runs at most one engine chunk that the queue can fill (engine_doc_feed is
 * push + step until nothing is ready). 1 when a chunk ran, 0 when none is
 * ready, -1 + err. */
int engine_doc_step(engine_doc *d, char *err, size_t errlen);
/* Tokens of a chat continuation over the document: the messages (system
 * messages included as text before the first user message) follow the
 * document inside its user turn, then the assistant header. plain sessions
 * and raw = 1 take `text` as it is (legacy completions). Malloc'd array, its
 * length in *n; NULL + err. */
int32_t *engine_doc_prompt(engine_doc *d, const engine_message *msgs, size_t n_msgs,
                           const char *raw, size_t *n, char *err, size_t errlen);

/* Saves everything needed to continue d exactly as if it had never stopped:
 * the pot, the tokens read but not yet run, the bytes the tokenizer holds
 * back, the schedule's state, the statistics, NuC's pending surprisal, the
 * recorded tokens (record_tokens) and the caller's log_offset; the cascade's
 * state is rebuilt from the pot when loading. One file, written atomically
 * (temporary file, fsync, rename, fsync of the directory); d stays the
 * caller's and unchanged, and must not be fed meanwhile (on the engine thread:
 * engine_sched_doc_task). 0, or -1 + err (a failed document, out of memory, an
 * I/O error: the old file at path, if any, is then untouched). Layout:
 * ingest.c and cache/snapshot.c. */
int engine_doc_save(const engine_doc *d, const char *path, uint64_t log_offset, char *err,
                    size_t errlen);
/* A second document in d's exact state (pot, tokens waiting, the bytes the
 * tokenizer holds back, schedule, statistics): fed the same bytes, both read
 * the same. s: the settings d was opened with. d is not changed; on the
 * engine thread (engine_sched_doc_task). The caller owns the copy; NULL + err
 * (a failed document, other settings, out of memory). */
engine_doc *engine_doc_copy(const engine_doc *d, const engine_pot_settings *s, char *err, size_t errlen);
/* Opens a document with settings s from a file engine_doc_save wrote, the
 * caller's to close; *log_offset := the stored offset (the caller feeds the
 * log from there). NULL + one line in err when the file is missing,
 * truncated, damaged (checksum), from another format version, from another
 * model (fingerprint) or KV type, or saved with different settings
 * (record_tokens aside, but it needs the file to hold recorded tokens): the
 * caller then opens the document afresh and re-reads from 0. */
engine_doc *engine_doc_load(engine *e, const engine_pot_settings *s, const char *path,
                            uint64_t *log_offset, char *err, size_t errlen);

/* ---- the engine thread (sched.c) ---------------------------------------------------
 * One thread owns the engine, every document and every generation. Work
 * comes through a queue; the thread batches one decode step of every active
 * generation into one forward (new prompts join it in pieces of up to 256
 * tokens) and runs one ingest chunk between steps, so generations stay
 * responsive while documents stream in. Every callback below runs on the
 * engine thread and must not block; it may submit more work. */

typedef struct engine_sched engine_sched;

/* Starts the engine thread; the engine must outlive it. NULL + err. */
engine_sched *engine_sched_new(engine *e, char *err, size_t errlen);
/* Cancels every generation (finish CANCELLED, rc 0; queued ones too), fails
 * pending and queued ingests (rc -1, "shutting down"), runs the queued tasks
 * in order, joins the thread and frees. Documents stay the caller's. Not
 * from a callback (they run on the thread this joins). */
void engine_sched_free(engine_sched *s);

/* Runs fn(e, user) on the engine thread, in submission order with the other
 * tasks and ingests (doc open/close/snapshot): after every earlier ingest has
 * completed and every earlier generation has its pot, before anything later
 * starts (generations without a document may pass it). 0, or -1 when stopping. */
typedef void (*engine_task_fn)(engine *e, void *user);
int engine_sched_task(engine_sched *s, engine_task_fn fn, void *user);
/* Like engine_sched_task, ordered only with d's items: after d's earlier
 * ingests completed and its earlier generations have their pots, before d's
 * later items; other documents' ingests do not hold it up. d NULL: ordered
 * with nothing (opening a document, reading stats). 0, or -1 when stopping. */
int engine_sched_doc_task(engine_sched *s, engine_doc *d, engine_task_fn fn, void *user);

/* Pushes a copy of bytes into d (see engine_doc_push), then runs d's ready
 * chunks interleaved with decode steps; calls done(user, rc, err) once no
 * chunk of d is ready (rc 0) or on the first error (rc -1; every pending
 * ingest of d then fails with it). Ingests of one document push and report
 * in submission order. 0, or -1 when stopping or out of memory. */
typedef void (*engine_ingest_done_fn)(void *user, int rc, const char *err);
int engine_sched_ingest(engine_sched *s, engine_doc *d, const char *bytes, size_t n, int final,
                        engine_ingest_done_fn done, void *user);

/* A generation: prompt tokens after the document's pot (a private copy: the
 * document is not changed) or after nothing. Over a document it starts once
 * the document's earlier ingests have completed, so it sees all their text. */
typedef struct engine_gen_request {
    engine_doc *doc;           /* or NULL */
    const int32_t *prompt;     /* copied at submission */
    size_t n_prompt;
    engine_gen_params params;  /* stop strings and logit_bias copied at submission;
                                  tokens_out ignored */
    engine_text_cb on_text;    /* text pieces and logprobs (see engine_text_cb); nonzero return cancels */
    /* Called once at the end (also on error, with rc -1 and err). */
    void (*on_done)(void *user, int rc, const engine_gen_result *res, const char *err);
    void *user;
    /* n > 1: n sequences from ONE prefill of the prompt (OpenAI's n): sequence
     * i samples with seed params.sampling.seed + i and reports through
     * on_text / on_done with users[i] (user is then unused). */
    int n;
    void *const *users;
    /* CLOCK_MONOTONIC time in ms by which it must end (0: none): once past, a
     * generation still queued, prefilling or decoding ends with finish
     * TIMEOUT (rc 0; n_generated says how far it got). Checked between
     * engine steps, so behind a document's ingest it ends within one chunk. */
    double deadline_ms;
    /* A flag another thread sets (the client left), or NULL: once nonzero, a
     * generation prefilling or decoding ends with finish CANCELLED at the next
     * engine step (on_text's return is seen only when text comes, and a long
     * prompt's prefill makes none for seconds). */
    const atomic_int *cancel;
} engine_gen_request;
/* Queues a generation; 0, or -1 + err (stopping, out of memory, invalid
 * sampling parameters: those are checked here), and on_done is then never
 * called. Errors found later (the prompt does not fit, a token outside the
 * vocabulary, a failed document) come through on_done. */
int engine_sched_generate(engine_sched *s, const engine_gen_request *r, char *err, size_t errlen);

typedef struct engine_sched_stats {
    int active_generations;
    int queued_tasks;          /* submitted items (tasks, ingests, generations) not started yet */
    int64_t decode_steps, decoded_tokens, ingest_chunks;
} engine_sched_stats;
void engine_sched_get_stats(engine_sched *s, engine_sched_stats *st);

#endif
