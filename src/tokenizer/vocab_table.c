/* The token table both tokenizers read: texts hashed into open-addressed slots, looked up by
 * text, and the growing id arrays they write. The lowest floor of src/tokenizer/: vocab.c (loading
 * and the partition), spm.c and bpe.c call it; it calls none of them. */
#include "tokenizer/vocab.h"

#include <stdlib.h>
#include <string.h>

uint32_t vocab_hash_more(uint32_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

/* FNV-1a: keys are short, and it spreads 32k-256k token texts (and BPE merges) well enough. */
uint32_t vocab_hash(const char *s, size_t n) { return vocab_hash_more(2166136261u, s, n); }

int32_t vocab_lookup(const quill_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = vocab_hash(s, n) & t->slot_mask;; i = (i + 1) & t->slot_mask) {
        int32_t id = t->slots[i];
        if (id < 0) return -1;
        if (t->text_len[id] == n && memcmp(vocab_text(t, id), s, n) == 0) return id;
    }
}

bool ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}
