/* Embeddings: a text's final hidden states (after the output norm, before the vocabulary
 * projection) pooled into one vector, as the reference's embedding mode computes them for decoder
 * models such as Qwen3-Embedding. The forward pass reports those states as "result_norm" through
 * the context's trace hook, so embeddings need no path of their own through the layers; the
 * projection to logits is skipped. */
#include "base/error.h"
#include "quill_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

quill_pooling quill_model_pooling(const quill_model *m) {
    const quill_hparams *hp = quill_model_hparams(m);
    char key[96];
    snprintf(key, sizeof key, "%s.pooling_type", hp->arch);
    uint64_t v;
    if (quill_gguf_get_u64(quill_model_gguf(m), key, &v, NULL) == QUILL_OK && v >= QUILL_POOLING_MEAN &&
        v <= QUILL_POOLING_LAST)
        return (quill_pooling)v;
    /* decoder models without the key: the last token has seen the whole text */
    return QUILL_POOLING_LAST;
}

typedef struct pool_state {
    quill_pooling pooling;
    int64_t d;
    int seen;           /* tokens reported so far (micro-batches arrive in order) */
    int n;
    double *acc;
} pool_state;

static void collect(const char *name, const float *data, int n_dims, const int64_t *ne, void *user) {
    pool_state *p = user;
    if (strcmp(name, "result_norm") != 0 || n_dims < 2 || ne[0] != p->d) return;
    for (int64_t t = 0; t < ne[1]; t++, p->seen++) {
        const float *row = data + t * p->d;
        bool take = p->pooling == QUILL_POOLING_MEAN || (p->pooling == QUILL_POOLING_CLS && p->seen == 0) ||
                    (p->pooling == QUILL_POOLING_LAST && p->seen == p->n - 1);
        if (!take) continue;
        for (int64_t i = 0; i < p->d; i++) p->acc[i] += row[i];
    }
}

quill_status quill_embed(quill_context *c, const quill_model *m, const int32_t *tokens, int n, quill_pooling pooling,
                         bool normalize, float *out, quill_error *err) {
    if (!c || !m || !tokens || !out || n <= 0) return quill_fail(err, QUILL_E_ARG, "quill_embed: no tokens or no output");
    if (pooling < QUILL_POOLING_MEAN || pooling > QUILL_POOLING_LAST)
        return quill_fail(err, QUILL_E_ARG, "quill_embed: pooling %d is not mean (1), cls (2) or last (3)", (int)pooling);
    const int64_t d = quill_model_hparams(m)->n_embd;
    pool_state p = {pooling, d, 0, n, calloc((size_t)d, sizeof(double))};
    if (!p.acc) return quill_fail(err, QUILL_E_NOMEM, "out of memory for an embedding of %lld values", (long long)d);
    quill_context_truncate(c, 0);
    quill_context_set_trace(c, collect, &p);
    quill_status st = quill_eval(c, tokens, n, NULL, false, err);
    quill_context_set_trace(c, NULL, NULL);
    quill_context_truncate(c, 0);
    if (st == QUILL_OK) {
        double scale = pooling == QUILL_POOLING_MEAN ? 1.0 / n : 1.0, norm = 0;
        for (int64_t i = 0; i < d; i++) norm += p.acc[i] * scale * (p.acc[i] * scale);
        /* the reference's L2 normalisation; a zero vector stays zero */
        double inv = normalize ? (norm > 0 ? 1.0 / sqrt(norm) : 0.0) : 1.0;
        for (int64_t i = 0; i < d; i++) out[i] = (float)(p.acc[i] * scale * inv);
    }
    free(p.acc);
    return st;
}
