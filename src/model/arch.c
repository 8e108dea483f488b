/* The architectures quill runs: one row each. A new dense decoder whose layer is Llama's with some
 * of these differences is one row here (and its tensor names in model.c if they are new). */
#include "model/model.h"

#include <string.h>

static const quill_arch archs[] = {
    /* Llama 1-3, TinyLlama, Mistral (dense), Mistral Nemo's head size, Llama 3's frequency factors */
    {.name = "llama", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .rope_freqs = true},
};

const quill_arch *quill_arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strlen(archs[i].name) == len && !memcmp(archs[i].name, name, len)) return &archs[i];
    return NULL;
}

const char *quill_arch_list(void) { return "llama (Llama 2/3, TinyLlama, Mistral)"; }
