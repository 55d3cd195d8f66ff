/* Tokenizer built from a GGUF's tokenizer.ggml.* metadata (private to engine/):
 * byte-level BPE (`gpt2`, pre-tokenizer chosen by tokenizer.ggml.pre, PCRE2
 * regexes) and SentencePiece-style BPE (`llama`, byte fallback). Results must
 * equal llama.cpp's llama_tokenize / llama_token_to_piece. */
#ifndef POTSERVE_TOKENIZER_H
#define POTSERVE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tokenizer tokenizer;

/* Builds the tokenizer from f's metadata (copies what it needs: f may be
 * closed afterwards). NULL + one-line err on missing/invalid metadata. */
tokenizer *tokenizer_load(const gguf_file *f, char *err, size_t errlen);
void tokenizer_free(tokenizer *t);

int32_t tokenizer_n_vocab(const tokenizer *t);
/* At least how many tokens a text of `bytes` bytes becomes (no token stands
 * for more bytes than the longest piece): a text that cannot fit a window is
 * refused without being tokenized. */
size_t tokenizer_min_tokens(const tokenizer *t, size_t bytes);
int32_t tokenizer_bos(const tokenizer *t);   /* -1 when none */
int tokenizer_adds_bos(const tokenizer *t);  /* 1: add_special puts BOS first */
int32_t tokenizer_eos(const tokenizer *t);   /* -1 when none */
/* 1 if generation should stop at this token (EOS, EOT, <|im_end|>, ... as the
 * metadata and token types say). */
int tokenizer_is_eog(const tokenizer *t, int32_t id);
/* Fill-in-the-middle's prefix, suffix and middle markers, from the metadata
 * (fim_pre/suf/mid_token_id) or their texts as llama.cpp detects them
 * ("<|fim_prefix|>", "<fim_prefix>", "<PRE>", ...): 1 when the model has all three. */
int tokenizer_fim(const tokenizer *t, int32_t *pre, int32_t *suf, int32_t *mid);
/* Token id of an exact token text (e.g. "<|im_end|>"), or -1. */
int32_t tokenizer_find(const tokenizer *t, const char *text, size_t len);
/* "gpt2" or "llama" */
const char *tokenizer_model_name(const tokenizer *t);

/* Tokenizes len bytes of text (must be valid UTF-8; invalid input returns -1).
 * add_special: BOS/EOS as the metadata's add_bos_token/add_eos_token say
 * (llama.cpp's add_special). parse_special: text of special/control tokens
 * becomes those tokens (llama.cpp's parse_special).
 * Writes up to cap ids into out and returns the total count (which may exceed
 * cap: call again with a larger buffer), or -1 on error. */
int64_t tokenizer_encode(const tokenizer *t, const char *text, size_t len, int add_special,
                         int parse_special, int32_t *out, int64_t cap);
/* A rendered chat prompt's ids: as tokenizer_encode with parse_special (and
 * no add_special), except that control-token text lying in the messages' own
 * text, the byte spans [plain[2k], plain[2k+1]) in order, is read as plain
 * text: only the template's markers are control tokens. Identical ids when no
 * message holds such text. */
int64_t tokenizer_encode_chat(const tokenizer *t, const char *text, size_t len, const size_t *plain,
                              size_t n_plain, int32_t *out, int64_t cap);

/* Bytes of token id as llama_token_to_piece(special=render_special) gives them
 * (byte tokens and the gpt2 byte mapping decoded; SPM's U+2581 becomes a space;
 * special tokens render as their text only when render_special).
 * Writes up to cap bytes and returns the full length, or -1 for a bad id. */
int tokenizer_piece(const tokenizer *t, int32_t id, int render_special, char *buf, size_t cap);

/* Incremental detokenizer: feed ids, get only complete UTF-8 sequences out.
 * Zero-initialise before use. */
typedef struct detok_state {
    char pending[8];
    int n_pending;
    int leading_space_done; /* SPM: strip the first piece's leading space like llama.cpp's detokenize */
} detok_state;
/* Appends the text of id to out (cap bytes), holding back an incomplete UTF-8
 * tail in st. Returns bytes written. Invalid sequences become U+FFFD. */
size_t detok_push(const tokenizer *t, detok_state *st, int32_t id, int render_special, char *out,
                  size_t cap);
/* Flushes what is held back (as U+FFFD if incomplete). */
size_t detok_flush(detok_state *st, char *out, size_t cap);
/* in[0, n) as valid UTF-8 into out (cap >= 3 * n): each maximal invalid
 * subpart, a character cut short at the end included, becomes U+FFFD, as
 * detok_push and detok_flush write them. Returns the bytes written. */
size_t tokenizer_utf8_clean(const char *in, size_t n, char *out, size_t cap);

/* Text is cut where a run of characters of one class (letters and marks,
 * digits, white space, the rest) reaches TOK_RUN_CUT bytes: each part is
 * tokenized on its own, the next as the continuation of a raw fragment. No
 * pre-token of real text is that long (words, numbers and spaces of prose
 * and code are far shorter, and their tokens are llama.cpp's), while a
 * pathological one (megabytes of one letter, of spaces) would otherwise be
 * held back whole by a stream and merged in time growing with its length.
 * The run's class and length where a stream's held text starts is part of
 * its saved state (tok_resume). */
enum { TOK_RUN_CUT = 4096 };
typedef struct tok_run {
    int cls;        /* the run's class, -1 before any character */
    uint32_t bytes; /* its bytes since it began or was last cut */
} tok_run;

/* Streaming (splittable) tokenizer: the same ids as tokenizer_encode on the
 * whole text, however the text is split into pieces. It holds back an
 * incomplete UTF-8 sequence and the last pre-token(s) until more bytes or the
 * end. add_special/parse_special as for tokenizer_encode. */
typedef struct tok_stream tok_stream;
tok_stream *tok_stream_new(const tokenizer *t, int add_special, int parse_special);
void tok_stream_free(tok_stream *s);
/* Feeds n bytes (final=1 for the last piece, n may be 0). Appends the ids that
 * are now certain to *ids (realloc'd; caller frees) and *n_ids.
 * Returns 0, or -1 on invalid UTF-8 (the stream is then unusable). */
int tok_stream_feed(tok_stream *s, const char *bytes, size_t n, int final, int32_t **ids,
                    size_t *n_ids);
/* Where a saved stream resumes: whether its held text continues a raw
 * fragment that was cut (SPM then adds no prefix space), and the run of one
 * class its held text continues. */
typedef struct tok_resume {
    int cont;
    tok_run run;
} tok_resume;
/* What s holds back until more bytes (or the end) arrive, to save a stream:
 * returns how many bytes that is (text not yet tokenized, then a cut-short
 * UTF-8 sequence) and copies them into buf when they fit in cap (buf may be
 * NULL to ask the size), with where they resume in *at. They always start
 * where s last cut, a boundary no later byte can move, so
 * tok_stream_resume(t, same flags, *at) fed these bytes, then the rest, gives
 * the ids s would have given. */
size_t tok_stream_held(const tok_stream *s, char *buf, size_t cap, tok_resume *at);
/* A stream continuing one saved with tok_stream_held: already started (no
 * second BOS). Caller owns it. */
tok_stream *tok_stream_resume(const tokenizer *t, int add_special, int parse_special, const tok_resume *at);

#endif
