/* Llama model: hyperparameters from metadata and every weight checked against them at load, so
 * the forward pass can index without checks. */
#include "base/error.h"
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds far above any real model; they keep absurd metadata from driving allocations. */
#define MAX_DIM (1 << 20)
#define MAX_LAYERS 4096

static quill_status get_dim(const quill_gguf *g, const char *key, int64_t fallback, int64_t *out,
                            quill_error *err) {
    int64_t v;
    quill_status s = quill_gguf_get_i64(g, key, &v, err);
    if (s == QUILL_E_NOT_FOUND && fallback >= 0) {
        *out = fallback;
        return QUILL_OK;
    }
    if (s) return s;
    if (v <= 0 || v > MAX_DIM)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = %lld is out of range (1..%d)",
                          quill_gguf_path(g), key, (long long)v, MAX_DIM);
    *out = v;
    return QUILL_OK;
}

static quill_status get_real(const quill_gguf *g, const char *key, double fallback, double *out,
                             quill_error *err) {
    quill_status s = quill_gguf_get_f64(g, key, out, err);
    if (s == QUILL_E_NOT_FOUND) {
        *out = fallback;
        return QUILL_OK;
    }
    if (s) return s;
    if (!(*out > 0) || *out > 1e12)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = %g is out of range",
                          quill_gguf_path(g), key, *out);
    return QUILL_OK;
}

/* RoPE scaling. Linear scaling (rope.scaling.type "linear", or the older rope.scale_linear key)
 * divides every position by the factor; without it a model tuned that way would run and print
 * fluent nonsense, so any other scaling type is refused rather than ignored. */
static quill_status rope_scaling(const quill_gguf *g, quill_hparams *hp, quill_error *err) {
    const char *type = NULL;
    size_t type_len = 0;
    quill_status s = quill_gguf_get_str(g, "llama.rope.scaling.type", &type, &type_len, err);
    if (s == QUILL_E_NOT_FOUND) type = NULL;
    else if (s) return s;
    double factor = 1;
    if (type && type_len == 4 && !memcmp(type, "none", 4)) {
        /* no scaling, whatever factor the file names besides */
    } else if (type && !(type_len == 6 && !memcmp(type, "linear", 6))) {
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: unsupported RoPE scaling '%.*s' (llama.rope.scaling.type): quill implements "
                          "linear scaling only",
                          quill_gguf_path(g), (int)(type_len > 64 ? 64 : type_len), type);
    } else {
        /* linear, also the reference's reading of a file that names no type: the factor, else the
         * older key's, else 1 */
        if ((s = get_real(g, "llama.rope.scaling.factor", 0, &factor, err))) return s;
        if (factor == 0 && (s = get_real(g, "llama.rope.scale_linear", 1, &factor, err))) return s;
    }
    hp->rope_freq_scale = 1.0 / factor;
    return QUILL_OK;
}

quill_status quill_hparams_from_gguf(const quill_gguf *g, quill_hparams *hp, quill_error *err) {
    memset(hp, 0, sizeof *hp);
    const char *arch;
    size_t arch_len;
    quill_status s = quill_gguf_get_str(g, "general.architecture", &arch, &arch_len, err);
    if (s == QUILL_E_NOT_FOUND)
        return quill_fail(err, QUILL_E_FORMAT, "%s: general.architecture is missing; not a model file",
                          quill_gguf_path(g));
    if (s) return s;
    if (arch_len != 5 || memcmp(arch, "llama", 5) != 0)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: unsupported model architecture '%.*s': quill runs Llama-family models "
                          "(general.architecture = llama: Llama 2, TinyLlama, Mistral)",
                          quill_gguf_path(g), (int)(arch_len > 64 ? 64 : arch_len), arch);
    if ((s = get_dim(g, "llama.embedding_length", -1, &hp->n_embd, err)) ||
        (s = get_dim(g, "llama.block_count", -1, &hp->n_layer, err)) ||
        (s = get_dim(g, "llama.attention.head_count", -1, &hp->n_head, err)) ||
        (s = get_dim(g, "llama.attention.head_count_kv", hp->n_head, &hp->n_head_kv, err)) ||
        (s = get_dim(g, "llama.feed_forward_length", -1, &hp->n_ff, err)) ||
        (s = get_dim(g, "llama.context_length", 2048, &hp->n_ctx_train, err)))
        return s;
    int64_t experts = 0;
    if (quill_gguf_get_i64(g, "llama.expert_count", &experts, NULL) == QUILL_OK && experts > 1)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: a mixture-of-experts model (llama.expert_count = %lld, e.g. Mixtral); quill runs "
                          "dense Llama models only",
                          quill_gguf_path(g), (long long)experts);
    if (hp->n_layer > MAX_LAYERS)
        return quill_fail(err, QUILL_E_FORMAT, "%s: llama.block_count = %lld is out of range",
                          quill_gguf_path(g), (long long)hp->n_layer);
    if (hp->n_embd % hp->n_head != 0)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: embedding length %lld is not a multiple of the head count %lld",
                          quill_gguf_path(g), (long long)hp->n_embd, (long long)hp->n_head);
    if (hp->n_head % hp->n_head_kv != 0)
        return quill_fail(err, QUILL_E_FORMAT, "%s: head count %lld is not a multiple of the KV head count %lld",
                          quill_gguf_path(g), (long long)hp->n_head, (long long)hp->n_head_kv);
    if ((s = get_dim(g, "llama.attention.key_length", hp->n_embd / hp->n_head, &hp->head_dim, err))) return s;
    if ((s = get_dim(g, "llama.rope.dimension_count", hp->head_dim, &hp->n_rot, err))) return s;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: llama.rope.dimension_count = %lld must be even and at most the head "
                          "dimension %lld",
                          quill_gguf_path(g), (long long)hp->n_rot, (long long)hp->head_dim);
    if ((s = get_real(g, "llama.rope.freq_base", 10000.0, &hp->rope_base, err)) ||
        (s = get_real(g, "llama.attention.layer_norm_rms_epsilon", 1e-5, &hp->rms_eps, err)) ||
        (s = rope_scaling(g, hp, err)))
        return s;

    /* The vocabulary size is the token list's length; llama.vocab_size and the embedding's
     * shape must agree with it when present. */
    const quill_gguf_value *tokens = quill_gguf_find(g, "tokenizer.ggml.tokens");
    const quill_gguf_tensor *embd = quill_gguf_find_tensor(g, "token_embd.weight");
    if (tokens && tokens->type == QUILL_GGUF_ARRAY) hp->n_vocab = (int64_t)tokens->count;
    else if (embd) hp->n_vocab = embd->ne[1];
    else if ((s = get_dim(g, "llama.vocab_size", -1, &hp->n_vocab, err))) return s;
    hp->tied_output = quill_gguf_find_tensor(g, "output.weight") == NULL;
    return QUILL_OK;
}

static quill_status bind_weight(quill_model *m, const char *name, int64_t cols, int64_t rows,
                                quill_weight *w, quill_error *err) {
    const quill_gguf *g = m->gguf;
    const quill_gguf_tensor *t = quill_gguf_find_tensor(g, name);
    if (!t) return quill_fail(err, QUILL_E_FORMAT, "%s: tensor '%s' is missing", quill_gguf_path(g), name);
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld] "
                          "from the hyperparameters",
                          quill_gguf_path(g), name, (long long)t->ne[0], (long long)t->ne[1],
                          (long long)t->ne[2], (long long)t->ne[3], (long long)cols, (long long)rows);
    const quill_type_traits *tr = quill_type_traits_of(t->type);
    if (!tr || !tr->to_float)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: unsupported tensor type %s in tensor '%s' (quill decodes f32, f16, bf16, "
                          "q4_0, q4_1, q5_0, q5_1, q8_0, q2_K..q6_K, iq4_nl, iq4_xs)",
                          quill_gguf_path(g), quill_type_name(t->type), name);
    w->name = t->name;
    w->type = t->type;
    w->cols = cols;
    w->rows = rows;
    w->row_bytes = quill_row_size(t->type, cols);
    w->data = t->data;
    return QUILL_OK;
}

static quill_status load_vector(quill_model *m, const char *name, int64_t n, float **out, quill_error *err) {
    quill_weight w;
    quill_status s = bind_weight(m, name, n, 1, &w, err);
    if (s) return s;
    *out = malloc((size_t)n * sizeof **out);
    if (!*out) return quill_fail(err, QUILL_E_NOMEM, "out of memory loading '%s'", name);
    return quill_dequantize(w.type, w.data, *out, n, err);
}

quill_status quill_model_load(const char *path, quill_model **out, quill_error *err) {
    *out = NULL;
    quill_model *m = calloc(1, sizeof *m);
    if (!m) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    quill_status s = quill_gguf_open(path, &m->gguf, err);
    if (!s) s = quill_hparams_from_gguf(m->gguf, &m->hp, err);
    if (!s) s = quill_tokenizer_load(m->gguf, &m->tokenizer, err);
    if (s) goto fail;
    const quill_hparams *hp = &m->hp;
    if (quill_tokenizer_n_vocab(m->tokenizer) != hp->n_vocab) {
        s = quill_fail(err, QUILL_E_FORMAT, "%s: the tokenizer has %d tokens but the model %lld", path,
                       quill_tokenizer_n_vocab(m->tokenizer), (long long)hp->n_vocab);
        goto fail;
    }
    int64_t q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    if ((s = bind_weight(m, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->token_embd, err))) goto fail;
    if (hp->tied_output) m->output = m->token_embd;
    else if ((s = bind_weight(m, "output.weight", hp->n_embd, hp->n_vocab, &m->output, err))) goto fail;
    if ((s = load_vector(m, "output_norm.weight", hp->n_embd, &m->output_norm, err))) goto fail;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory");
        goto fail;
    }
    for (int64_t l = 0; l < hp->n_layer; l++) {
        quill_layer *L = &m->layers[l];
        char name[96];
#define BIND(field, suffix, cols, rows)                                                   \
    snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l);                        \
    if ((s = bind_weight(m, name, cols, rows, &L->field, err))) goto fail;
        BIND(wq, "attn_q.weight", hp->n_embd, q_dim)
        BIND(wk, "attn_k.weight", hp->n_embd, kv_dim)
        BIND(wv, "attn_v.weight", hp->n_embd, kv_dim)
        BIND(wo, "attn_output.weight", q_dim, hp->n_embd)
        BIND(w_gate, "ffn_gate.weight", hp->n_embd, hp->n_ff)
        BIND(w_up, "ffn_up.weight", hp->n_embd, hp->n_ff)
        BIND(w_down, "ffn_down.weight", hp->n_ff, hp->n_embd)
#undef BIND
        snprintf(name, sizeof name, "blk.%lld.attn_norm.weight", (long long)l);
        if ((s = load_vector(m, name, hp->n_embd, &L->attn_norm, err))) goto fail;
        snprintf(name, sizeof name, "blk.%lld.ffn_norm.weight", (long long)l);
        if ((s = load_vector(m, name, hp->n_embd, &L->ffn_norm, err))) goto fail;
    }
    *out = m;
    return QUILL_OK;
fail:
    quill_model_free(m);
    return s;
}

void quill_model_free(quill_model *m) {
    if (!m) return;
    if (m->layers)
        for (int64_t l = 0; l < m->hp.n_layer; l++) {
            free(m->layers[l].attn_norm);
            free(m->layers[l].ffn_norm);
        }
    free(m->layers);
    free(m->output_norm);
    quill_tokenizer_free(m->tokenizer);
    quill_gguf_close(m->gguf);
    free(m);
}

const quill_hparams *quill_model_hparams(const quill_model *m) { return &m->hp; }
const quill_tokenizer *quill_model_tokenizer(const quill_model *m) { return m->tokenizer; }
const quill_gguf *quill_model_gguf(const quill_model *m) { return m->gguf; }
