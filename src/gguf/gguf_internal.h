/* What the engine knows of a GGUF file beyond the public API. */
#ifndef QUILL_GGUF_INTERNAL_H
#define QUILL_GGUF_INTERNAL_H

#include "quill.h"

/* Whether the file's bytes are a read-only mapping of the file (quill_gguf_open), whose pages can
 * be dropped and read again from the page cache, rather than memory the caller owns. */
bool quill_gguf_is_mapped(const quill_gguf *g);

/* Bytes of one value of a scalar metadata type; 0 for strings, arrays and unknown types. */
size_t quill_gguf_scalar_size(uint32_t type);

#endif
