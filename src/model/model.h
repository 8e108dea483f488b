/* Internal view of a loaded model, shared by the forward passes. */
#ifndef QUILL_MODEL_INTERNAL_H
#define QUILL_MODEL_INTERNAL_H

#include "quill.h"

/* A weight matrix as stored: `rows` rows of `cols` elements of `type`, row-major, in the mapping. */
typedef struct {
    const char *name;
    uint32_t type;
    int64_t cols, rows;
    size_t row_bytes;
    const uint8_t *data;
} quill_weight;

typedef struct {
    float *attn_norm, *ffn_norm;   /* [n_embd], dequantized at load (tiny) */
    quill_weight wq, wk, wv, wo, w_gate, w_up, w_down;
} quill_layer;

struct quill_model {
    quill_gguf *gguf;
    quill_tokenizer *tokenizer;
    quill_hparams hp;
    quill_weight token_embd, output;   /* output aliases token_embd when tied */
    float *output_norm;
    quill_layer *layers;
};

#endif
