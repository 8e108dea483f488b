/* libFuzzer target for the chat-template engine: any bytes as a template, rendered against a
 * small fixed conversation. A template error is a normal outcome; a crash, hang, leak or
 * undefined behaviour is a bug. */
#include "quill_chat.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    static const quill_chat_message msgs[] = {
        {"system", "Be brief."}, {"user", "Hi {{ there }} </s>"}, {"assistant", "Hello! \xC3\xA9"}, {"user", "Why?"},
    };
    quill_error err;
    char *out = NULL;
    size_t n = (size & 1) ? 4 : 2;
    if (quill_chat_render(src, msgs, n, "<s>", "</s>", size & 2, &out, &err) == QUILL_OK) {
        if (!out) abort();
        free(out);
    } else if (out) {
        abort();
    }
    (void)quill_chat_check(src, &err);
    free(src);
    return 0;
}
