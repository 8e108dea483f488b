/* libFuzzer target for the tokenizer: any bytes as text, encoded with the real Llama 2 vocabulary
 * (from ../shared or $QUILL_SHARED) with and without special-token parsing, then decoded through
 * the streaming detokenizer, which must produce valid UTF-8 whatever the ids. */
#include "quill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static quill_gguf *vocab_file;
static quill_tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *shared = getenv("QUILL_SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-llama-spm.gguf", shared && *shared ? shared : "../shared");
    quill_error err;
    if (quill_gguf_open(path, &vocab_file, &err) || quill_tokenizer_load(vocab_file, &tok, &err)) {
        fprintf(stderr, "fuzz_tokenize: %s\n", err.message);
        abort();
    }
    return 0;
}

static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    quill_error err;
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (quill_tokenize(tok, (const char *)data, size, true, special, &ids, &n, &err) != QUILL_OK) continue;
        quill_detokenizer d;
        quill_detokenizer_init(&d, tok, special, true);
        char out[1024];
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= quill_tokenizer_n_vocab(tok)) abort();
            size_t len = quill_detokenizer_push(&d, ids[i], out, sizeof out);
            if (!valid_utf8((unsigned char *)out, len)) abort();
        }
        size_t len = quill_detokenizer_flush(&d, out, sizeof out);
        if (!valid_utf8((unsigned char *)out, len)) abort();
        free(ids);
    }
    /* raw ids from the input bytes: decoding must cope with any id sequence */
    quill_detokenizer d;
    quill_detokenizer_init(&d, tok, false, true);
    char out[1024];
    for (size_t i = 0; i + 2 <= size; i += 2) {
        int32_t id = (int32_t)((data[i] | data[i + 1] << 8) % 32000);
        size_t len = quill_detokenizer_push(&d, id, out, sizeof out);
        if (!valid_utf8((unsigned char *)out, len)) abort();
    }
    return 0;
}
