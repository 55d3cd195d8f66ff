/* libFuzzer target: any byte string through the GGUF reader, and what it
 * accepts through the tokenizer loader and a short tokenization. */
#include <stddef.h>
#include <stdint.h>

#include "engine/gguf.h"
#include "engine/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    gguf_file *f = gguf_parse(data, size, err, sizeof err);
    if (!f) return 0;
    tokenizer *t = tokenizer_load(f, err, sizeof err);
    if (t) {
        int32_t ids[64];
        static const char text[] = "Hello world 123 <|im_end|> \xc3\xa9\xe4\xb8\xad";
        tokenizer_encode(t, text, sizeof text - 1, 1, 1, ids, 64);
        tokenizer_free(t);
    }
    gguf_close(f);
    return 0;
}
