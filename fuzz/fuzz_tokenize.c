/* libFuzzer target for the tokenizers: the first input byte picks a real vocabulary (from
 * ../shared or $QUILL_SHARED: SentencePiece Llama 2, and byte-level BPE ones with different
 * pre-tokenizers), the rest is the text. It is encoded with and without special-token parsing, then
 * decoded through the streaming detokenizer, which must produce valid UTF-8 whatever the ids. For
 * the BPE vocabularies that have a token for every byte, valid UTF-8 text must come back byte for
 * byte. */
#include "quill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const vocab_names[] = {
    "ggml-vocab-llama-spm.gguf", "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
    "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-falcon.gguf",
};
#define N_VOCABS (sizeof vocab_names / sizeof vocab_names[0])

static quill_gguf *files[N_VOCABS];
static quill_tokenizer *toks[N_VOCABS];
static bool all_bytes[N_VOCABS];   /* every byte value has a token of its own (text comes back) */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *shared = getenv("QUILL_SHARED");
    for (size_t v = 0; v < N_VOCABS; v++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer/%s", shared && *shared ? shared : "../shared", vocab_names[v]);
        quill_error err;
        if (quill_gguf_open(path, &files[v], &err) || quill_tokenizer_load(files[v], &toks[v], &err)) {
            fprintf(stderr, "fuzz_tokenize: %s\n", err.message);
            abort();
        }
        bool seen[256] = {0};
        int n_seen = 0;
        for (int32_t id = 0; id < quill_tokenizer_n_vocab(toks[v]); id++) {
            char b[8];
            if (quill_tokenizer_token_type(toks[v], id) == QUILL_TOKEN_NORMAL &&
                quill_token_to_bytes(toks[v], id, true, b, sizeof b) == 1 && !seen[(unsigned char)b[0]]) {
                seen[(unsigned char)b[0]] = true;
                n_seen++;
            }
        }
        all_bytes[v] = n_seen == 256;
    }
    return 0;
}

/* Strict UTF-8: no overlong forms, surrogates or values past U+10FFFF. */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >> 4) == 14 ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!len || i + len > n) return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return false;
        if (len == 3 && ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F))) return false;
        if (len == 4 && ((c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F))) return false;
        i += len;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const size_t v = data[0] % N_VOCABS;
    const quill_tokenizer *tok = toks[v];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const int32_t n_vocab = quill_tokenizer_n_vocab(tok);
    const bool bpe = v != 0 && all_bytes[v], text_valid = valid_utf8((const unsigned char *)text, len);
    quill_error err;
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (quill_tokenize(tok, text, len, true, special, &ids, &n, &err) != QUILL_OK) continue;
        quill_detokenizer d;
        quill_detokenizer_init(&d, tok, true, false);
        size_t cap = 3 * len + 4096, got = 0;
        char *out = malloc(cap);
        char buf[1024];
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= n_vocab) abort();
            size_t k = quill_detokenizer_push(&d, ids[i], buf, sizeof buf);
            if (!valid_utf8((unsigned char *)buf, k)) abort();
            if (got + k <= cap) memcpy(out + got, buf, k);
            got += k;
        }
        size_t k = quill_detokenizer_flush(&d, buf, sizeof buf);
        if (!valid_utf8((unsigned char *)buf, k)) abort();
        if (got + k <= cap) memcpy(out + got, buf, k);
        got += k;
        /* BOS / EOS render as their text; leave them out of the comparison */
        size_t skip = 0, drop = 0;
        if (n && quill_tokenizer_add_bos(tok) && ids[0] == quill_tokenizer_bos(tok))
            skip = (size_t)quill_token_to_bytes(tok, ids[0], true, NULL, 0);
        if (n > 1 && quill_tokenizer_add_eos(tok) && ids[n - 1] == quill_tokenizer_eos(tok))
            drop = (size_t)quill_token_to_bytes(tok, ids[n - 1], true, NULL, 0);
        if (bpe && text_valid && (got != len + skip + drop || memcmp(out + skip, text, len) != 0)) abort();
        free(out);
        free(ids);
    }
    /* raw ids from the input bytes: decoding must cope with any id sequence */
    quill_detokenizer d;
    quill_detokenizer_init(&d, tok, false, true);
    char out[1024];
    for (size_t i = 1; i + 3 <= size; i += 3) {
        int32_t id = (int32_t)((data[i] | data[i + 1] << 8 | (uint32_t)data[i + 2] << 16) % (uint32_t)n_vocab);
        size_t len = quill_detokenizer_push(&d, id, out, sizeof out);
        if (!valid_utf8((unsigned char *)out, len)) abort();
    }
    return 0;
}
