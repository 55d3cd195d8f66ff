/* libFuzzer target: arbitrary bytes through the default model's tokenizer.
 * Valid UTF-8 must tokenize, and streaming the same text in pieces (split
 * points taken from the input) must give exactly the same ids; a difference
 * aborts, which the fuzzer reports. Model: $POTSERVE_MODEL or the default. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

static tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("POTSERVE_MODEL");
    char err[512];
    gguf_file *f = gguf_open(path ? path : "models/SmolLM2-135M-Instruct.Q4_1.gguf", err, sizeof err);
    if (!f || !(tok = tokenizer_load(f, err, sizeof err))) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        abort();
    }
    gguf_close(f);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int parse_special = data[0] & 1;
    size_t step = 1 + (data[0] >> 1) % 7; /* piece size for the streamed run */
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int64_t n = tokenizer_encode(tok, text, len, 0, parse_special, NULL, 0);
    if (n < 0) return 0; /* invalid UTF-8 is refused, which is fine */
    int32_t *whole = malloc((size_t)(n ? n : 1) * sizeof *whole);
    tokenizer_encode(tok, text, len, 0, parse_special, whole, n);

    tok_stream *s = tok_stream_new(tok, 0, parse_special);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    for (size_t off = 0; off < len; off += step) {
        size_t piece = len - off < step ? len - off : step;
        if (tok_stream_feed(s, text + off, piece, 0, &ids, &n_ids)) abort();
    }
    if (tok_stream_feed(s, NULL, 0, 1, &ids, &n_ids)) abort();
    if (n_ids != (size_t)n || (n && memcmp(ids, whole, (size_t)n * sizeof *ids))) abort();
    tok_stream_free(s);
    free(ids);
    free(whole);
    return 0;
}
