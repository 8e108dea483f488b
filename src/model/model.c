/* Model loading: the architecture's descriptor (arch.c) says which tensors to expect, the
 * hyperparameters come from its metadata, and every weight is checked against them at load, so the
 * forward passes can index without checks. */
#include "base/error.h"
#include "model/model.h"
#include "model/forward.h"
#include "model/recurrent.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds far above any real model; they keep absurd metadata from driving allocations. */
#define MAX_DIM (1 << 20)
#define MAX_LAYERS 4096

static quill_status mamba_dims(const quill_gguf *g, quill_hparams *hp, quill_error *err);
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

/* "<arch>.<suffix>": every architecture keeps its hyperparameters under its own name. */
static const char *akey(const quill_hparams *hp, const char *suffix, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", hp->arch, suffix);
    return buf;
}

/* RoPE scaling. Linear scaling (rope.scaling.type "linear", or the older rope.scale_linear key)
 * divides every position by the factor; YaRN (gpt-oss) scales only the low frequencies (model
 * rope.c's quill_rope_angle). Without them a model tuned that way would run and print fluent
 * nonsense, so any other scaling type is refused rather than ignored. */
static quill_status rope_scaling(const quill_gguf *g, quill_hparams *hp, quill_error *err) {
    char key[96];
    const char *type = NULL;
    size_t type_len = 0;
    quill_status s = quill_gguf_get_str(g, akey(hp, "rope.scaling.type", key, sizeof key), &type, &type_len, err);
    if (s == QUILL_E_NOT_FOUND) type = NULL;
    else if (s) return s;
    double factor = 1;
    if (type && type_len == 4 && !memcmp(type, "none", 4)) {
        /* no scaling, whatever factor the file names besides */
    } else if (type && !(type_len == 6 && !memcmp(type, "linear", 6)) && !(type_len == 4 && !memcmp(type, "yarn", 4))) {
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: unsupported RoPE scaling '%.*s' (%s): quill implements linear and yarn scaling",
                          quill_gguf_path(g), (int)(type_len > 64 ? 64 : type_len), type, key);
    } else {
        /* linear or yarn (the file's type, or linear when it names none, as the reference reads
         * it): the factor, else the older key's, else 1 */
        if ((s = get_real(g, akey(hp, "rope.scaling.factor", key, sizeof key), 0, &factor, err))) return s;
        if (factor == 0 && (s = get_real(g, akey(hp, "rope.scale_linear", key, sizeof key), 1, &factor, err)))
            return s;
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
    const quill_arch *a = quill_arch_find(arch, arch_len);
    if (!a)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: unsupported model architecture '%.*s': quill runs %s",
                          quill_gguf_path(g), (int)(arch_len > 64 ? 64 : arch_len), arch, quill_arch_list());
    hp->arch = a->name;
    char key[96];
#define KEY(suffix) akey(hp, suffix, key, sizeof key)
    /* (per-layer arrays: layer 0's value here, as the reference's n_head() reads it; model.c takes each layer's) */
    const bool arrays = a->per_layer_shapes;
    if (a->mamba2 && (s = mamba_dims(g, hp, err))) return s;
    if (a->mamba2) {
        /* (the per-layer values were read by mamba_dims) */
    } else if ((s = quill_model_dim(g, KEY("embedding_length"), -1, &hp->n_embd, err)) ||
        (s = quill_model_dim(g, KEY("block_count"), -1, &hp->n_layer, err)) ||
        (s = quill_layer_dim(g, KEY("attention.head_count"), arrays, hp->n_layer, 0, -1, &hp->n_head, err)) ||
        (s = a->shortconv ? quill_shortconv_kv_heads(g, KEY("attention.head_count_kv"), hp->n_layer, hp->n_head,
                                                     &hp->n_head_kv, err)
                          : quill_layer_dim(g, KEY("attention.head_count_kv"), arrays, hp->n_layer, 0, hp->n_head,
                                            &hp->n_head_kv, err)) ||
        (s = quill_layer_dim(g, KEY("feed_forward_length"), arrays, hp->n_layer, 0,
                             a->ffn == QUILL_FFN_MOE && !a->experts_optional ? 0 : -1, &hp->n_ff, err)) ||
        (s = quill_model_dim(g, KEY("context_length"), 2048, &hp->n_ctx_train, err)))
        return s;
    int64_t experts = 0;
    if (a->ffn == QUILL_FFN_DENSE && quill_gguf_get_i64(g, KEY("expert_count"), &experts, NULL) == QUILL_OK &&
        experts > 1)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: a mixture-of-experts model (%s = %lld); quill runs %s as a dense model only",
                          quill_gguf_path(g), key, (long long)experts, a->name);
    if (a->hybrid || a->mtp_skipped || a->mtp_bound) {
        /* block_count counts the MTP blocks after the main stack (nextn_predict_layers) */
        int64_t mtp = 0;
        s = quill_gguf_get_i64(g, KEY("nextn_predict_layers"), &mtp, err);
        if (s && s != QUILL_E_NOT_FOUND) return s;
        if (mtp < 0 || mtp >= hp->n_layer)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s = %lld leaves no main layers of %lld blocks",
                              quill_gguf_path(g), key, (long long)mtp, (long long)hp->n_layer);
        hp->n_layer -= mtp;
    }
    if (hp->n_layer > MAX_LAYERS)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.block_count = %lld is out of range", quill_gguf_path(g),
                          hp->arch, (long long)hp->n_layer);
    if (hp->n_head % hp->n_head_kv != 0)
        return quill_fail(err, QUILL_E_FORMAT, "%s: head count %lld is not a multiple of the KV head count %lld",
                          quill_gguf_path(g), (long long)hp->n_head, (long long)hp->n_head_kv);
    /* the head size defaults to n_embd / n_head; a file may name another (Mistral Nemo, Gemma) */
    if (hp->n_embd % hp->n_head != 0 && !quill_gguf_find(g, KEY("attention.key_length")))
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: embedding length %lld is not a multiple of the head count %lld and %s is missing",
                          quill_gguf_path(g), (long long)hp->n_embd, (long long)hp->n_head, key);
    if ((s = quill_model_dim(g, KEY("attention.key_length"), hp->n_embd / hp->n_head, &hp->head_dim, err))) return s;
    int64_t value_dim;
    if ((s = quill_model_dim(g, KEY("attention.value_length"), hp->head_dim, &value_dim, err))) return s;
    /* (latent attention: values of the latent's width; mla.c reads the heads' parts) */
    if (value_dim != hp->head_dim && !a->mla)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: keys of %lld and values of %lld dims per head: quill needs them equal",
                          quill_gguf_path(g), (long long)hp->head_dim, (long long)value_dim);
    if ((s = quill_model_dim(g, KEY("rope.dimension_count"), hp->head_dim, &hp->n_rot, err))) return s;
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: %s.rope.dimension_count = %lld must be even and at most the head dimension %lld",
                          quill_gguf_path(g), hp->arch, (long long)hp->n_rot, (long long)hp->head_dim);
    if ((s = get_real(g, KEY("rope.freq_base"), 10000.0, &hp->rope_base, err)) ||
        (s = get_real(g, KEY("attention.layer_norm_rms_epsilon"), 1e-5, &hp->rms_eps, err)) ||
        (s = rope_scaling(g, hp, err)))
        return s;

    /* The vocabulary size is the token list's length; <arch>.vocab_size and the embedding's
     * shape must agree with it when present. */
    const quill_gguf_value *tokens = quill_gguf_find(g, "tokenizer.ggml.tokens");
    const quill_gguf_tensor *embd = quill_gguf_find_tensor(g, "token_embd.weight");
    if (tokens && tokens->type == QUILL_GGUF_ARRAY) hp->n_vocab = (int64_t)tokens->count;
    else if (embd) hp->n_vocab = embd->ne[1];
    else if ((s = quill_model_dim(g, KEY("vocab_size"), -1, &hp->n_vocab, err))) return s;
#undef KEY
    /* (Cohere 2's output is token_embd whatever output.weight the file has, as the reference reads it) */
    hp->tied_output = a->output_tied || quill_gguf_find_tensor(g, "output.weight") == NULL;
    return QUILL_OK;
}

/* A Mamba-2 hybrid's sizes: attention.head_count_kv (0 on its recurrent layers) and
 * feed_forward_length (0 on Nemotron-H's mixer and attention layers) per layer: the model's values
 * are their largest (each layer's own are read with the layers, mamba.c). */
static quill_status mamba_dims(const quill_gguf *g, quill_hparams *hp, quill_error *err) {
    char key[96];
    quill_status s;
    if ((s = quill_model_dim(g, akey(hp, "embedding_length", key, sizeof key), -1, &hp->n_embd, err)) ||
        (s = quill_model_dim(g, akey(hp, "block_count", key, sizeof key), -1, &hp->n_layer, err)) ||
        (s = quill_model_dim(g, akey(hp, "context_length", key, sizeof key), 2048, &hp->n_ctx_train, err)))
        return s;
    if (hp->n_layer > MAX_LAYERS)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.block_count = %lld is out of range", quill_gguf_path(g),
                          hp->arch, (long long)hp->n_layer);
    static const char *const suffixes[] = {"attention.head_count", "attention.head_count_kv", "feed_forward_length"};
    int64_t *outs[] = {&hp->n_head, &hp->n_head_kv, &hp->n_ff};
    for (int i = 0; i < 3; i++) {
        *outs[i] = 0;
        for (int64_t l = 0; l < hp->n_layer; l++) {
            int64_t v;
            if ((s = quill_mamba_layer_value(g, akey(hp, suffixes[i], key, sizeof key), hp->n_layer, l, i == 2 ? 0 : -1,
                                             &v, err)))
                return s;
            if (v > *outs[i]) *outs[i] = v;
        }
    }
    if (!hp->n_head)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.head_count is 0 on every layer", quill_gguf_path(g),
                          hp->arch);
    if (!hp->n_head_kv) hp->n_head_kv = hp->n_head; /* (no attention layer: nothing reads it) */
    return QUILL_OK;
}

static quill_status load_vector(quill_model *m, const char *name, int64_t n, float **out, quill_error *err) {
    return quill_model_floats(m, name, n, 1, out, err);
}

/* A vector the architecture may have: NULL when the file has none. */
static quill_status load_optional(quill_model *m, const char *name, int64_t n, float **out, quill_error *err) {
    *out = NULL;
    return quill_gguf_find_tensor(m->gguf, name) ? load_vector(m, name, n, out, err) : QUILL_OK;
}

/* rows [first, first + rows) of a bound matrix */
static quill_weight row_view(const quill_weight *w, int64_t first, int64_t rows) {
    quill_weight v = *w;
    v.rows = rows;
    v.data = w->data + (size_t)first * w->row_bytes;
    return v;
}

static bool key_real(const quill_gguf *g, const char *arch, const char *suffix, double *out) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return quill_gguf_get_f64(g, key, out, NULL) == QUILL_OK;
}

/* Granite's multipliers as the reference reads them: logit_scale required, the others optional (0:
 * none; attention.scale 0 keeps 1/sqrt(head_dim)); rope.scaling.finetuned false turns RoPE off;
 * deepstack_mapping (Granite Vision's image features fed into layers) is refused. */
static quill_status granite_multipliers(quill_model *m, bool *rope_finetuned, quill_error *err) {
    const char *path = quill_gguf_path(m->gguf), *name = m->arch->name;
    quill_arch_params *ap = &m->ap;
    char key[96];
    static const char *const keys[] = {"logit_scale", "embedding_scale", "residual_scale", "attention.scale"};
    double v[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "%s.%s", name, keys[i]);
        quill_status s = quill_gguf_get_f64(m->gguf, key, &v[i], err);
        if (s == QUILL_E_NOT_FOUND && i == 0 && m->arch->mamba2) {
            s = QUILL_OK; /* (optional in Granite 4.0-H: the logits as they are) */
        } else if (s == QUILL_E_NOT_FOUND && i == 0)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s is missing (a %s model divides its logits by it)", path, key,
                              name);
        if (s && s != QUILL_E_NOT_FOUND) return s;
        if (!(v[i] >= 0) || v[i] > 1e6 || (i == 0 && v[i] == 0 && !m->arch->mamba2))
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s = %g is out of range", path, key, v[i]);
    }
    ap->logit_multiplier = v[0] ? 1.0f / (float)v[0] : 0.0f;
    ap->embd_scale = (float)v[1];
    ap->residual_scale = (float)v[2];
    if (v[3] != 0) ap->attn_scale = (float)v[3];
    snprintf(key, sizeof key, "%s.rope.scaling.finetuned", name);
    quill_status s = quill_gguf_get_bool(m->gguf, key, rope_finetuned, err);
    if (s && s != QUILL_E_NOT_FOUND) return s;
    snprintf(key, sizeof key, "%s.deepstack_mapping", name);
    if (quill_gguf_find(m->gguf, key))
        return quill_fail(err, QUILL_E_UNSUPPORTED, "%s: %s: Granite Vision's deepstack layers are not implemented",
                          path, key);
    return QUILL_OK;
}

/* What the architecture's descriptor adds to the hyperparameters, with the reference's defaults. */
static quill_status arch_params(quill_model *m, quill_error *err) {
    const quill_arch *a = m->arch;
    const quill_hparams *hp = &m->hp;
    quill_arch_params *ap = &m->ap;
    const char *path = quill_gguf_path(m->gguf);
    ap->attn_scale = a->unit_attn_scale ? 1.0 : 1.0 / sqrt((double)hp->head_dim);
    ap->n_rope_tables = 1;
    if (!a->per_layer_shapes) ap->n_rot_local = hp->n_rot; /* (Gemma 4's: rope.dimension_count_swa) */
    double orig = (double)hp->n_ctx_train;
    key_real(m->gguf, a->name, "rope.scaling.original_context_length", &orig);
    ap->n_ctx_orig = orig >= 1 && orig < 1e9 ? (int64_t)orig : hp->n_ctx_train;
    /* LongRoPE's magnitude correction (Phi-3.5 carries 1.19): the reference scales the rotation
     * itself, so both q and k, in every architecture */
    ap->rope_attn_factor = 1;
    key_real(m->gguf, a->name, "rope.scaling.attn_factor", &ap->rope_attn_factor);
    if (!(ap->rope_attn_factor > 0) || ap->rope_attn_factor > 1e3)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.rope.scaling.attn_factor = %g is out of range", path, a->name,
                          ap->rope_attn_factor);
    char type_key[96];
    const char *type;
    size_t type_len;
    snprintf(type_key, sizeof type_key, "%s.rope.scaling.type", a->name);
    ap->rope_yarn = quill_gguf_get_str(m->gguf, type_key, &type, &type_len, NULL) == QUILL_OK && type_len == 4 &&
                    !memcmp(type, "yarn", 4);
    ap->yarn_beta_fast = 32;
    ap->yarn_beta_slow = 1;
    double log_mul = 0, temp = 0;
    if (a->yarn_keys) {
        key_real(m->gguf, a->name, "rope.scaling.yarn_beta_fast", &ap->yarn_beta_fast);
        key_real(m->gguf, a->name, "rope.scaling.yarn_beta_slow", &ap->yarn_beta_slow);
        key_real(m->gguf, a->name, "rope.scaling.yarn_log_multiplier", &log_mul);
        key_real(m->gguf, a->name, "attention.temperature_scale", &temp);
        if (!(ap->yarn_beta_fast > 0) || ap->yarn_beta_fast > 1e6 || !(ap->yarn_beta_slow > 0) ||
            ap->yarn_beta_slow > 1e6 || !(log_mul >= 0) || log_mul > 1e3 || !(temp >= 0) || temp > 1e3)
            return quill_fail(err, QUILL_E_FORMAT,
                              "%s: %s.rope.scaling.yarn_beta_fast/yarn_beta_slow/yarn_log_multiplier or "
                              "attention.temperature_scale out of range (%g, %g, %g, %g)",
                              path, a->name, ap->yarn_beta_fast, ap->yarn_beta_slow, log_mul, temp);
        ap->attn_temp_scale = (float)temp;
    }
    if (ap->rope_yarn) {
        /* YaRN's magnitude correction, 1 + 0.1 ln(factor) for a factor above 1: the reference divides
         * its attention factor by it and its rotation multiplies it back; with yarn_log_multiplier m
         * the attention factor is (1 + 0.1 ln(factor)) / (1 + 0.1 m ln(factor)) */
        const double factor = 1.0 / hp->rope_freq_scale;
        if (factor > 1) ap->rope_attn_factor *= (1.0 + 0.1 * log(factor)) / (log_mul != 0 ? 1.0 + 0.1 * log_mul * log(factor) : 1.0);
    }
    ap->rope_attn_factor_local = a->swa_rope_plain ? 1.0 : ap->rope_attn_factor;
    if (a->head_dim_is_rot && hp->n_rot != hp->head_dim)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.rope.dimension_count = %lld must be the head size %lld", path,
                          a->name, (long long)hp->n_rot, (long long)hp->head_dim);
    if (a->gemma_query_scale) {
        /* the reference computes it in float; the 27B shapes (46 or 62 layers) use n_embd / n_head */
        const bool big = hp->n_layer == (strcmp(a->name, "gemma2") ? 62 : 46);
        ap->attn_scale = 1.0f / sqrtf((float)(big ? hp->n_embd / hp->n_head : hp->head_dim));
    }
    if (a->embd_scale) ap->embd_scale = sqrtf((float)hp->n_embd);
    if (a->mrope_refused) {
        char key[96];
        snprintf(key, sizeof key, "%s.rope.dimension_sections", a->name);
        const quill_gguf_value *v = quill_gguf_find(m->gguf, key);
        uint64_t cursor = 0;
        quill_gguf_value e;
        int64_t n = 0;
        while (v && v->type == QUILL_GGUF_ARRAY && quill_gguf_array_next(v, &cursor, &e))
            if (!quill_gguf_value_i64(&e, &n) || n != 0)
                return quill_fail(err, QUILL_E_UNSUPPORTED,
                                  "%s: %s: multi-section RoPE (a vision variant) is not implemented for %s", path, key,
                                  a->name);
    }
    if (a->logit_scale) {
        double v = 0;
        if (!key_real(m->gguf, a->name, "logit_scale", &v))
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.logit_scale is missing", path, a->name);
        if (!(v > 0) || v > 1e6)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.logit_scale = %g is out of range", path, a->name, v);
        ap->logit_multiplier = (float)v;
    }
    if (a->layer_norm) {
        if (!key_real(m->gguf, a->name, "attention.layer_norm_epsilon", &m->hp.rms_eps))
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.layer_norm_epsilon is missing", path, a->name);
        if (!(m->hp.rms_eps >= 0) || m->hp.rms_eps > 1)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.layer_norm_epsilon = %g is out of range", path,
                              a->name, m->hp.rms_eps);
    }
    if (a->parallel_block && hp->n_head * hp->head_dim != hp->n_embd)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s needs heads of n_embd / n_head (%s.attention.key_length = %lld)",
                          path, a->name, a->name, (long long)hp->head_dim);
    bool rope_finetuned = true;
    if (a->multipliers) {
        quill_status s = granite_multipliers(m, &rope_finetuned, err);
        if (s) return s;
    }
    if (a->softcap) {
        double v = 50;
        key_real(m->gguf, a->name, "attn_logit_softcapping", &v);
        ap->attn_softcap = (float)v;
        v = 30;
        key_real(m->gguf, a->name, "final_logit_softcapping", &v);
        ap->final_softcap = (float)v;
        if (!(ap->attn_softcap > 0) || !(ap->final_softcap > 0))
            return quill_fail(err, QUILL_E_FORMAT, "%s: the soft-capping values must be positive", path);
    }
    if (a->final_softcap) {
        double v = 30;
        key_real(m->gguf, a->name, "final_logit_softcapping", &v);
        if (!(v >= 0) || v > 1e6)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.final_logit_softcapping = %g is out of range", path, a->name, v);
        ap->final_softcap = (float)v;
    }
    /* (Gemma 4 names its sliding layers one by one) */
    if (a->per_layer_shapes) return quill_per_layer_rope(m, err);
    /* Sliding windows as the reference reads them: the window (a missing or zero one turns them off
     * where the architecture has no default), which layers (attention.sliding_window_pattern: layer
     * il slides when il % n < n - 1; 0 makes every layer slide; an array is ignored, as there), and
     * the base the sliding layers rotate with (rope.freq_base_swa) */
    double window = a->swa_default;
    int64_t pattern = a->swa_pattern;
    if (a->swa_pattern && (!a->swa_at_layers || hp->n_layer == a->swa_at_layers)) {
        if (!key_real(m->gguf, a->name, "attention.sliding_window", &window) && a->swa_required)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.sliding_window is missing", path, a->name);
        if (window != 0 && (!(window >= 1) || window > 1e9))
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.sliding_window = %g is out of range (1..1e9)",
                              path, a->name, window);
        if (window == 0 && a->swa_default)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.sliding_window = 0 would hide every key", path,
                              a->name);
        char key[96];
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a->name);
        const quill_gguf_value *v = quill_gguf_find(m->gguf, key);
        if (v && v->type != QUILL_GGUF_ARRAY) {
            quill_status s = quill_gguf_get_i64(m->gguf, key, &pattern, err);
            if (s) return s;
            if (pattern < 0 || pattern > UINT32_MAX)
                return quill_fail(err, QUILL_E_FORMAT, "%s: %s = %lld is out of range (0..%u)", path, key,
                                  (long long)pattern, UINT32_MAX);
        }
    }
    const bool swa = a->swa_pattern && window > 0 && (!a->swa_at_layers || hp->n_layer == a->swa_at_layers);
    if (swa && !a->swa_rope_global) {
        ap->n_rope_tables = 2;
        ap->rope_base_local = a->swa_rope_base ? a->swa_rope_base : hp->rope_base;
        ap->rope_scale_local = a->swa_rope_base || a->swa_rope_plain ? 1.0 : hp->rope_freq_scale;
        if (!a->swa_rope_plain) key_real(m->gguf, a->name, "rope.freq_base_swa", &ap->rope_base_local);
        if (!(ap->rope_base_local > 0) || ap->rope_base_local > 1e12)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.rope.freq_base_swa = %g is out of range", path, a->name,
                              ap->rope_base_local);
    }
    for (int64_t l = 0; l < hp->n_layer; l++) {
        quill_layer *L = &m->layers[l];
        const bool sliding = swa && (pattern == 0 || l % pattern < pattern - 1);
        L->window = sliding ? (int64_t)window : 0;
        L->rope_table = sliding && !a->swa_rope_global ? 1 : 0;
        L->no_rope = a->unroped || (a->nope_interval && (l + 1) % a->nope_interval == 0) || !rope_finetuned ||
                     (a->global_unroped && swa && !sliding);
    }
    return QUILL_OK;
}

/* A count key of the experts, 0 when missing; an absurd or negative value is an error naming it. */
static quill_status expert_key(const quill_model *m, const char *suffix, int64_t *out, quill_error *err) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    *out = 0;
    quill_status s = quill_gguf_get_i64(m->gguf, key, out, err);
    if (s == QUILL_E_NOT_FOUND) return QUILL_OK;
    if (s) return s;
    if (*out < 0 || *out > MAX_DIM)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = %lld is out of range", quill_gguf_path(m->gguf), key,
                          (long long)*out);
    return QUILL_OK;
}

/* The router's keys (router_keys architectures), as the reference reads them: the gating function
 * (1 softmax, 2 sigmoid; missing: the architecture's), whether the chosen weights are normalised, their
 * scale, the expert groups (n_group_used of n_group kept by the sum of each one's two best) and the leading
 * dense layers. Anything the reference would assert on is an error naming the key. */
static quill_status router_keys(quill_model *m, int64_t n_expert, int64_t n_used, int64_t groups, int64_t groups_used,
                                quill_error *err) {
    const char *path = quill_gguf_path(m->gguf), *name = m->arch->name;
    quill_arch_params *ap = &m->ap;
    char key[96];
    int64_t func = 0, lead = 0;
    quill_status s;
    if ((s = expert_key(m, "expert_gating_func", &func, err)) || (s = expert_key(m, "leading_dense_block_count", &lead, err)))
        return s;
    if (func == 0 && m->arch->router_norm_only)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_gating_func is missing (a %s model names its router's function)",
                          path, name, name);
    if (func == 1) ap->gating = QUILL_GATING_SOFTMAX;
    else if (func == 2) ap->gating = QUILL_GATING_SIGMOID;
    else if (func != 0)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: %s.expert_gating_func = %lld: quill implements 1 (softmax) and 2 (sigmoid)", path, name,
                          (long long)func);
    if (m->arch->mamba2) ap->gating = QUILL_GATING_SIGMOID; /* (Nemotron's router, whatever the key says) */
    if (lead > m->hp.n_layer)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.leading_dense_block_count = %lld is more than the %lld layers", path,
                          name, (long long)lead, (long long)m->hp.n_layer);
    ap->n_dense_lead = lead;
    snprintf(key, sizeof key, "%s.expert_weights_norm", name);
    bool norm = false;
    if ((s = quill_gguf_get_bool(m->gguf, key, &norm, err)) && s != QUILL_E_NOT_FOUND) return s;
    ap->norm_w = norm;
    snprintf(key, sizeof key, "%s.expert_weights_scale", name);
    double scale = 0;
    if ((s = quill_gguf_get_f64(m->gguf, key, &scale, err)) && s != QUILL_E_NOT_FOUND) return s;
    if (!(scale >= 0) || scale > 1e6)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s = %g is out of range", path, key, scale);
    ap->w_scale = (float)scale;
    if (m->arch->router_norm_only) {
        /* (the reference reads neither key for it: normalised, unscaled) */
        ap->norm_w = true;
        ap->w_scale = 0;
    }
    if (groups > 1) {
        if (n_expert % groups || n_expert / groups < 2 || groups_used < 1 || groups_used > groups ||
            n_used > groups_used * (n_expert / groups))
            return quill_fail(err, QUILL_E_FORMAT,
                              "%s: %s.expert_group_count = %lld and expert_group_used_count = %lld do not fit %lld experts "
                              "(%lld used): groups of at least 2 experts, enough kept groups for the used experts",
                              path, name, (long long)groups, (long long)groups_used, (long long)n_expert, (long long)n_used);
        ap->n_group = groups;
        ap->n_group_used = groups_used;
    }
    return QUILL_OK;
}

/* The experts' hyperparameters, checked as the reference checks them (its assertions are errors
 * naming the key here), and each layer's FFN kind. */
static quill_status moe_params(quill_model *m, quill_error *err) {
    const quill_arch *a = m->arch;
    quill_arch_params *ap = &m->ap;
    const char *path = quill_gguf_path(m->gguf), *name = a->name;
    int64_t n_expert, n_used, groups, groups_used, ff_exp;
    quill_status s;
    if ((s = expert_key(m, "expert_count", &n_expert, err)) || (s = expert_key(m, "expert_used_count", &n_used, err)) ||
        (s = expert_key(m, "expert_group_count", &groups, err)) ||
        (s = expert_key(m, "expert_group_used_count", &groups_used, err)) ||
        (s = expert_key(m, "expert_feed_forward_length", &ff_exp, err)) ||
        (s = expert_key(m, "expert_shared_feed_forward_length", &ap->n_ff_shexp, err)))
        return s;
    /* (Granite 4.0-H: a shared expert, ungated, where the file names its width) */
    if (!a->shared_expert && !a->mamba2) ap->n_ff_shexp = 0;
    ap->gating = a->gating;
    ap->norm_w = a->norm_expert_weights;
    if (a->ffn == QUILL_FFN_DENSE) return QUILL_OK;
    if (a->router_keys && (s = router_keys(m, n_expert, n_used, groups, groups_used, err))) return s;
    if (n_expert > QUILL_MAX_EXPERTS)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_count = %lld is more than %d experts", path, name,
                          (long long)n_expert, QUILL_MAX_EXPERTS);
    if (n_expert == 0 && !a->experts_optional)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_count is missing or 0: a %s model has experts", path, name,
                          name);
    if (n_used > n_expert)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_used_count = %lld is more than %s.expert_count = %lld",
                          path, name, (long long)n_used, name, (long long)n_expert);
    if (n_expert == 0) {
        if (groups)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_group_count = %lld without experts", path, name,
                              (long long)groups);
        ap->n_ff_shexp = 0;
        return QUILL_OK; /* a dense model of this family (n_used is 0: not more than the count) */
    }
    if (n_used == 0)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_used_count is missing or 0: each token needs an expert",
                          path, name);
    if (groups > 1 && !a->router_keys)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: %s.expert_group_count = %lld: experts chosen by groups are not implemented", path, name,
                          (long long)groups);
    (void)groups_used; /* (read by router_keys) */
    /* the experts' width: their own key (qwen3moe), else the FFN's, split among the used experts
     * (qwen3moe) or whole (llama) */
    if (!a->expert_ff_key || !ff_exp) ff_exp = a->expert_ff_key ? m->hp.n_ff / n_used : m->hp.n_ff;
    if (ff_exp <= 0)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_feed_forward_length and %s.feed_forward_length are missing",
                          path, name, name);
    ap->n_expert = n_expert;
    ap->n_expert_used = n_used;
    ap->n_ff_exp = ff_exp;
    if (a->router_keys && a->mamba2) {
        /* (Nemotron 3 Nano: the shared expert is expert_shared_feed_forward_length wide) */
        if (ap->n_ff_shexp <= 0)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_shared_feed_forward_length is missing", path, name);
    } else if (a->router_keys && !a->router_norm_only) {
        int64_t shared = 0;
        if ((s = expert_key(m, "expert_shared_count", &shared, err))) return s;
        if (shared > 64)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s.expert_shared_count = %lld is out of range (0..64)", path, name,
                              (long long)shared);
        ap->n_ff_shexp = shared * ff_exp;
    }
    if (a->shared_expert && !ap->n_ff_shexp) ap->n_ff_shexp = m->hp.n_ff;
    if (a->shared_expert && ap->n_ff_shexp <= 0)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: %s.expert_shared_feed_forward_length and %s.feed_forward_length are missing", path, name,
                          name);
    return QUILL_OK;
}

/* Nemotron-H's layer l, one block after attn_norm: a Mamba-2 mixer, attention (q, k, v, output, their
 * optional biases; no RoPE) or an ungated FFN (ffn_up, ffn_down, their optional biases). */
static quill_status single_block_layer(quill_model *m, int64_t l, quill_error *err) {
    quill_layer *L = &m->layers[l];
    const int64_t d = m->hp.n_embd, q_dim = L->n_head * L->head_dim, kv_dim = L->n_head_kv * L->head_dim;
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
    quill_status s;
    if ((s = load_vector(m, NAME("attn_norm.weight"), d, &L->attn_norm, err))) return s;
    if (L->recurrent) return quill_mamba_bind_layer(m, l, err);
    if (L->ffn_only && m->ap.n_expert) {
        /* Nemotron 3 Nano: a sigmoid router with a selection bias over experts of relu(up)², and an ungated
         * shared expert of the same kind */
        const int64_t E = m->ap.n_expert, ff = m->ap.n_ff_exp, sh = m->ap.n_ff_shexp;
        L->ffn = QUILL_FFN_MOE_SHARED;
        if ((s = quill_model_bind(m, NAME("ffn_gate_inp.weight"), d, E, &L->w_router, err)) ||
            (s = load_vector(m, NAME("exp_probs_b.bias"), E, &L->probs_bias, err)) ||
            (s = quill_model_bind_experts(m, NAME("ffn_up_exps.weight"), d, ff, E, &L->w_up, err)) ||
            (s = quill_model_bind_experts(m, NAME("ffn_down_exps.weight"), ff, d, E, &L->w_down, err)) ||
            (s = quill_model_bind(m, NAME("ffn_up_shexp.weight"), d, sh, &L->w_up_shexp, err)) ||
            (s = quill_model_bind(m, NAME("ffn_down_shexp.weight"), sh, d, &L->w_down_shexp, err)))
            return s;
        return QUILL_OK;
    }
    if (L->ffn_only) {
        if ((s = quill_model_bind(m, NAME("ffn_up.weight"), d, L->n_ff, &L->w_up, err)) ||
            (s = quill_model_bind(m, NAME("ffn_down.weight"), L->n_ff, d, &L->w_down, err)) ||
            (s = load_optional(m, NAME("ffn_up.bias"), L->n_ff, &L->b_up, err)) ||
            (s = load_optional(m, NAME("ffn_down.bias"), d, &L->b_down, err)))
            return s;
        return QUILL_OK;
    }
    if ((s = quill_model_bind(m, NAME("attn_q.weight"), d, q_dim, &L->wq, err)) ||
        (s = quill_model_bind(m, NAME("attn_k.weight"), d, kv_dim, &L->wk, err)) ||
        (s = quill_model_bind(m, NAME("attn_v.weight"), d, kv_dim, &L->wv, err)) ||
        (s = quill_model_bind(m, NAME("attn_output.weight"), q_dim, d, &L->wo, err)) ||
        (s = load_optional(m, NAME("attn_q.bias"), q_dim, &L->bq, err)) ||
        (s = load_optional(m, NAME("attn_k.bias"), kv_dim, &L->bk, err)) ||
        (s = load_optional(m, NAME("attn_v.bias"), kv_dim, &L->bv, err)) ||
        (s = load_optional(m, NAME("attn_output.bias"), d, &L->bo, err)))
        return s;
#undef NAME
    return QUILL_OK;
}

const quill_ffn_impl *quill_ffn_of(quill_ffn_kind kind) {
    return kind == QUILL_FFN_MOE ? &quill_ffn_moe : kind == QUILL_FFN_MOE_SHARED ? &quill_ffn_moe_shared : &quill_ffn_dense;
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
    const quill_arch *a = m->arch = quill_arch_find(hp->arch, strlen(hp->arch));
    if (quill_tokenizer_n_vocab(m->tokenizer) != hp->n_vocab) {
        s = quill_fail(err, QUILL_E_FORMAT, "%s: the tokenizer has %d tokens but the model %lld", path,
                       quill_tokenizer_n_vocab(m->tokenizer), (long long)hp->n_vocab);
        goto fail;
    }
    if ((s = moe_params(m, err))) goto fail;
    if ((a->mtp_bound || a->mamba2 || a->shortconv) && !(m->claimed = calloc(quill_gguf_n_tensors(m->gguf) + 1, 1))) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory");
        goto fail;
    }
    if (a->mla && (s = quill_mla_dims(m, err))) goto fail;
    const int64_t n_expert = m->ap.n_expert, ff_exp = m->ap.n_ff_exp;
    if ((s = quill_model_bind(m, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->token_embd, err))) goto fail;
    if (hp->tied_output && a->output_required) {
        s = quill_fail(err, QUILL_E_FORMAT, "%s: tensor 'output.weight' is missing (%s does not tie it to the embeddings)",
                       path, a->name);
        goto fail;
    }
    if (hp->tied_output) m->output = m->token_embd;
    else if ((s = quill_model_bind(m, "output.weight", hp->n_embd, hp->n_vocab, &m->output, err))) goto fail;
    /* (LFM2's final norm is token_embd_norm, as the reference names it) */
    if ((s = load_vector(m, a->shortconv ? "token_embd_norm.weight" : "output_norm.weight", hp->n_embd, &m->output_norm,
                         err)))
        goto fail;
    if (a->rope_freqs && (s = load_optional(m, "rope_freqs.weight", hp->n_rot / 2, &m->ap.rope_factors, err)))
        goto fail;
    if (a->rope_long_short &&
        ((s = load_optional(m, "rope_factors_short.weight", hp->n_rot / 2, &m->ap.rope_factors, err)) ||
         (s = load_optional(m, "rope_factors_long.weight", hp->n_rot / 2, &m->ap.rope_factors_long, err))))
        goto fail;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory");
        goto fail;
    }
    if (a->hybrid && (s = quill_hybrid_params(m, err))) goto fail;
    if (a->mamba2 && (s = quill_mamba_params(m, err))) goto fail;
    if (a->shortconv && (s = quill_shortconv_params(m, err))) goto fail;
    if (a->per_layer_shapes && (s = quill_per_layer_shapes(m, err))) goto fail;
    if (a->per_layer_inputs && (s = quill_per_layer_inputs_bind(m, err))) goto fail;
    for (int64_t l = 0; l < hp->n_layer; l++) {
        quill_layer *L = &m->layers[l];
        char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
#define BIND(field, suffix, cols, rows) \
    if ((s = quill_model_bind(m, NAME(suffix), cols, rows, &L->field, err))) goto fail;
#define VECTOR(field, suffix, n) \
    if ((s = load_vector(m, NAME(suffix), n, &L->field, err))) goto fail;
#define FLOATS(field, suffix, cols, rows) \
    if ((s = quill_model_floats(m, NAME(suffix), cols, rows, &L->field, err))) goto fail;
#define OPTIONAL(field, suffix, n) \
    if ((s = load_optional(m, NAME(suffix), n, &L->field, err))) goto fail;
        if (!a->per_layer_shapes && !a->mamba2) L->n_head = hp->n_head, L->n_head_kv = hp->n_head_kv, L->head_dim = hp->head_dim, L->n_ff = hp->n_ff;
        const int64_t q_dim = L->n_head * L->head_dim, kv_dim = L->n_head_kv * L->head_dim;
        bool fused_qkv = false;
        if (L->kv_shared) {
            L->kv_offset = m->layers[L->kv_source].kv_offset;
        } else if (!L->recurrent) {
            L->kv_offset = (size_t)m->ap.kv_width;
            m->ap.kv_width += kv_dim;
        }
        if (q_dim > m->ap.widest_q) m->ap.widest_q = q_dim;
        if (kv_dim > m->ap.widest_kv) m->ap.widest_kv = kv_dim;
        if (L->n_head_kv && L->n_head / L->n_head_kv > m->ap.widest_group) m->ap.widest_group = L->n_head / L->n_head_kv;
        if (L->n_ff > m->ap.widest_ff) m->ap.widest_ff = L->n_ff;
        if (a->single_block) {
            if ((s = single_block_layer(m, l, err))) goto fail;
            continue;
        }
        if (L->shortconv) {
            if ((s = quill_shortconv_bind_layer(m, l, err))) goto fail;
        } else if (L->recurrent) {
            if ((s = a->mamba2 ? quill_mamba_bind_layer(m, l, err) : quill_hybrid_bind_layer(m, l, err))) goto fail;
        } else if (a->mla) {
            if ((s = quill_mla_bind_layer(m, l, err))) goto fail;
        } else if (a->hybrid) {
            /* each head's query, then its output gate */
            L->attn_gated = true;
            BIND(wq, "attn_q.weight", hp->n_embd, 2 * q_dim)
            BIND(wk, "attn_k.weight", hp->n_embd, kv_dim)
            BIND(wv, "attn_v.weight", hp->n_embd, kv_dim)
        } else if (!a->per_layer_shapes && quill_gguf_find_tensor(m->gguf, NAME("attn_qkv.weight"))) {
            /* one matrix of q, k and v rows (and one bias), which the reference accepts in place of
             * the three in every architecture of this kind */
            quill_weight qkv;
            BIND(wq, "attn_qkv.weight", hp->n_embd, q_dim + 2 * kv_dim)
            qkv = L->wq;
            L->wq = row_view(&qkv, 0, q_dim);
            L->wk = row_view(&qkv, q_dim, kv_dim);
            L->wv = row_view(&qkv, q_dim + kv_dim, kv_dim);
            OPTIONAL(bq, "attn_qkv.bias", q_dim + 2 * kv_dim)
            if (L->bq) {   /* each its own copy, as the three apart would be */
                L->bk = malloc((size_t)kv_dim * sizeof *L->bk);
                L->bv = malloc((size_t)kv_dim * sizeof *L->bv);
                if (!L->bk || !L->bv) {
                    s = quill_fail(err, QUILL_E_NOMEM, "%s: out of memory for blk.%lld.attn_qkv.bias", path, (long long)l);
                    goto fail;
                }
                memcpy(L->bk, L->bq + q_dim, (size_t)kv_dim * sizeof *L->bk);
                memcpy(L->bv, L->bq + q_dim + kv_dim, (size_t)kv_dim * sizeof *L->bv);
            }
            fused_qkv = true;
        } else {
            BIND(wq, "attn_q.weight", hp->n_embd, q_dim)
            if (!L->kv_shared) BIND(wk, "attn_k.weight", hp->n_embd, kv_dim)
            L->v_from_k = a->v_norm && !quill_gguf_find_tensor(m->gguf, NAME("attn_v.weight"));
            if (!L->kv_shared && !L->v_from_k) BIND(wv, "attn_v.weight", hp->n_embd, kv_dim)
        }
        if (!L->recurrent && !a->mla) BIND(wo, "attn_output.weight", q_dim, hp->n_embd)
        /* (router_keys: the first leading_dense_block_count layers are dense) */
        const bool moe = n_expert && l >= m->ap.n_dense_lead;
        L->ffn = !moe ? QUILL_FFN_DENSE : m->ap.n_ff_shexp ? QUILL_FFN_MOE_SHARED : QUILL_FFN_MOE;
#define EXPERTS(field, suffix, cols, rows) \
    if ((s = quill_model_bind_experts(m, NAME(suffix), cols, rows, n_expert, &L->field, err))) goto fail;
        if (moe) {
            BIND(w_router, "ffn_gate_inp.weight", hp->n_embd, n_expert)
            EXPERTS(w_gate, "ffn_gate_exps.weight", hp->n_embd, ff_exp)
            EXPERTS(w_up, "ffn_up_exps.weight", hp->n_embd, ff_exp)
            EXPERTS(w_down, "ffn_down_exps.weight", ff_exp, hp->n_embd)
            if (m->ap.n_ff_shexp) {
                const int64_t ff_sh = m->ap.n_ff_shexp;
                BIND(w_gate_shexp, "ffn_gate_shexp.weight", hp->n_embd, ff_sh)
                BIND(w_up_shexp, "ffn_up_shexp.weight", hp->n_embd, ff_sh)
                BIND(w_down_shexp, "ffn_down_shexp.weight", ff_sh, hp->n_embd)
                /* (router_keys: the shared experts are not gated) */
                if (a->shared_expert) VECTOR(shexp_gate, "ffn_gate_inp_shexp.weight", hp->n_embd)
            }
            if (a->probs_bias == 2) VECTOR(probs_bias, "exp_probs_b.bias", n_expert)
            if (a->probs_bias == 1) OPTIONAL(probs_bias, "exp_probs_b.bias", n_expert)
        } else if (a->fused_gate_up) {
            quill_weight gate_up;
            BIND(w_up, "ffn_up.weight", hp->n_embd, 2 * hp->n_ff)
            gate_up = L->w_up;
            L->w_gate = row_view(&gate_up, 0, hp->n_ff);
            L->w_up = row_view(&gate_up, hp->n_ff, hp->n_ff);
        } else {
            BIND(w_gate, "ffn_gate.weight", hp->n_embd, L->n_ff)
            BIND(w_up, "ffn_up.weight", hp->n_embd, L->n_ff)
        }
        if (!moe) BIND(w_down, "ffn_down.weight", L->n_ff, hp->n_embd)
        if (!a->no_input_norms) VECTOR(attn_norm, "attn_norm.weight", hp->n_embd)
        if (a->no_input_norms || a->parallel_block) {
            /* q, k, v read the residual stream, the FFN ffn_inp; or (parallel) attn_norm's output */
        } else if (a->ffn_norm_post_attention) {
            VECTOR(ffn_norm, "post_attention_norm.weight", hp->n_embd)
        } else {
            VECTOR(ffn_norm, "ffn_norm.weight", hp->n_embd)
        }
        if (a->post_norms) {
            VECTOR(attn_post_norm, "post_attention_norm.weight", hp->n_embd)
            VECTOR(ffn_post_norm, "post_ffw_norm.weight", hp->n_embd)
        }
        if (a->qk_norm_full) {
            VECTOR(q_norm, "attn_q_norm.weight", q_dim)
            VECTOR(k_norm, "attn_k_norm.weight", kv_dim)
        }
        if (a->qk_norm_optional) {
            OPTIONAL(q_norm, "attn_q_norm.weight", L->head_dim)
            OPTIONAL(k_norm, "attn_k_norm.weight", L->head_dim)
            if (!L->q_norm != !L->k_norm) {
                s = quill_fail(err, QUILL_E_FORMAT, "%s: blk.%lld has one of attn_q_norm and attn_k_norm, not both", path,
                               (long long)l);
                goto fail;
            }
        }
        if (a->qk_norm && !L->recurrent) {
            VECTOR(q_norm, "attn_q_norm.weight", L->head_dim)
            if (!L->kv_shared) VECTOR(k_norm, "attn_k_norm.weight", L->head_dim)
        }
        if (fused_qkv) {
            /* its bias, when it has one, was read with it */
        } else if (a->qkv_bias) {
            VECTOR(bq, "attn_q.bias", q_dim)
            VECTOR(bk, "attn_k.bias", kv_dim)
            VECTOR(bv, "attn_v.bias", kv_dim)
        } else if (!a->per_layer_shapes && !a->mla) {
            /* optional in every architecture, as the reference loads them (not Gemma 4's) */
            OPTIONAL(bq, "attn_q.bias", q_dim)
            OPTIONAL(bk, "attn_k.bias", kv_dim)
            OPTIONAL(bv, "attn_v.bias", kv_dim)
        }
        if (a->attn_out_bias) VECTOR(bo, "attn_output.bias", hp->n_embd)
        if (a->multipliers) OPTIONAL(bo, "attn_output.bias", hp->n_embd)
        if (a->multipliers && !moe) {
            /* the reference adds them when present (no published Granite file has them) */
            OPTIONAL(b_gate, "ffn_gate.bias", L->n_ff)
            OPTIONAL(b_up, "ffn_up.bias", L->n_ff)
            OPTIONAL(b_down, "ffn_down.bias", hp->n_embd)
        }
        if (a->attn_sinks) VECTOR(sinks, "attn_sinks.weight", L->n_head)
        if (a->layer_out_scale) OPTIONAL(out_scale, "layer_output_scale.weight", 1)
        if (a->per_layer_inputs && m->ap.n_embd_per_layer && (s = quill_per_layer_inputs_bind_layer(m, l, err))) goto fail;
        if (moe && a->expert_biases) {
            VECTOR(router_bias, "ffn_gate_inp.bias", n_expert)
            FLOATS(gate_exps_bias, "ffn_gate_exps.bias", ff_exp, n_expert)
            FLOATS(up_exps_bias, "ffn_up_exps.bias", ff_exp, n_expert)
            FLOATS(down_exps_bias, "ffn_down_exps.bias", hp->n_embd, n_expert)
        }
#undef VECTOR
#undef OPTIONAL
#undef FLOATS
#undef EXPERTS
#undef BIND
#undef NAME
    }
    if (a->hybrid && (s = quill_hybrid_bind_mtp(m, err))) goto fail;
    if (a->mtp_bound && (s = quill_mtp_check(m, err))) goto fail;
    if ((s = arch_params(m, err))) goto fail;
    if (a->mla && (s = quill_mla_params(m, err))) goto fail;
    if (m->claimed && (s = quill_model_all_claimed(m, err))) goto fail;
    for (int64_t l = 0; l < m->hp.n_layer; l++) m->layers[l].ffn_impl = quill_ffn_of(m->layers[l].ffn);
    *out = m;
    return QUILL_OK;
fail:
    quill_model_free(m);
    return s;
}

void quill_model_free(quill_model *m) {
    if (!m) return;
    quill_model_unpack(m); /* first: the experts' copier reads the layers */
    if (m->layers)
        for (int64_t l = 0; l < m->hp.n_layer; l++) {
            quill_layer *L = &m->layers[l];
            float *owned[] = {L->attn_norm, L->ffn_norm, L->attn_post_norm, L->ffn_post_norm, L->q_norm,
                              L->k_norm, L->bq, L->bk, L->bv, L->bo, L->sinks, L->router_bias,
                              L->gate_exps_bias, L->up_exps_bias, L->down_exps_bias, L->shexp_gate,
                              L->out_scale, L->ple_norm, L->b_gate, L->b_up, L->b_down, L->probs_bias,
                              L->q_a_norm, L->kv_a_norm, L->k_b_owned};
            for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
            quill_hybrid_free_layer(L);
        }
    free(m->layers);
    free(m->claimed);
    free(m->output_norm);
    free(m->ple_proj_norm);
    free(m->ap.rope_factors);
    free(m->ap.rope_factors_long);
    quill_tokenizer_free(m->tokenizer);
    quill_gguf_close(m->gguf);
    free(m);
}

const quill_hparams *quill_model_hparams(const quill_model *m) { return &m->hp; }
const quill_tokenizer *quill_model_tokenizer(const quill_model *m) { return m->tokenizer; }
const quill_gguf *quill_model_gguf(const quill_model *m) { return m->gguf; }
