/* `quill quantize`: whole files into the reference quantizer's mixes. The file types and their
 * names, the per-tensor choice of type (the reference's mixes, rule for rule), and the file written
 * again: the metadata copied, each tensor converted by src/tensor/'s row quantizers. The room
 * above src/gguf/ (reading and writing files) and src/tensor/ (the types), which call nothing here.
 *
 * Matching the reference's choices means its order of decisions, kept below with its names. */
#include "base/error.h"
#include "gguf/gguf_internal.h"
#include "quill_quantize.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- file types */

typedef struct {
    const char *name;
    quill_ftype ftype;
    uint32_t base;
} ftype_info;

static const ftype_info ftypes[] = {
    {"f32", QUILL_FTYPE_ALL_F32, QUILL_TYPE_F32},
    {"f16", QUILL_FTYPE_MOSTLY_F16, QUILL_TYPE_F16},
    {"bf16", QUILL_FTYPE_MOSTLY_BF16, QUILL_TYPE_BF16},
    {"q8_0", QUILL_FTYPE_MOSTLY_Q8_0, QUILL_TYPE_Q8_0},
    {"q4_0", QUILL_FTYPE_MOSTLY_Q4_0, QUILL_TYPE_Q4_0},
    {"q4_1", QUILL_FTYPE_MOSTLY_Q4_1, QUILL_TYPE_Q4_1},
    {"q5_0", QUILL_FTYPE_MOSTLY_Q5_0, QUILL_TYPE_Q5_0},
    {"q5_1", QUILL_FTYPE_MOSTLY_Q5_1, QUILL_TYPE_Q5_1},
    {"q2_k", QUILL_FTYPE_MOSTLY_Q2_K, QUILL_TYPE_Q2_K},
    {"q3_k_s", QUILL_FTYPE_MOSTLY_Q3_K_S, QUILL_TYPE_Q3_K},
    {"q3_k_m", QUILL_FTYPE_MOSTLY_Q3_K_M, QUILL_TYPE_Q3_K},
    {"q3_k_l", QUILL_FTYPE_MOSTLY_Q3_K_L, QUILL_TYPE_Q3_K},
    {"q4_k_s", QUILL_FTYPE_MOSTLY_Q4_K_S, QUILL_TYPE_Q4_K},
    {"q4_k_m", QUILL_FTYPE_MOSTLY_Q4_K_M, QUILL_TYPE_Q4_K},
    {"q5_k_s", QUILL_FTYPE_MOSTLY_Q5_K_S, QUILL_TYPE_Q5_K},
    {"q5_k_m", QUILL_FTYPE_MOSTLY_Q5_K_M, QUILL_TYPE_Q5_K},
    {"q6_k", QUILL_FTYPE_MOSTLY_Q6_K, QUILL_TYPE_Q6_K},
    {"iq4_nl", QUILL_FTYPE_MOSTLY_IQ4_NL, QUILL_TYPE_IQ4_NL},
    {"iq4_xs", QUILL_FTYPE_MOSTLY_IQ4_XS, QUILL_TYPE_IQ4_XS},
    {"tq1_0", QUILL_FTYPE_MOSTLY_TQ1_0, QUILL_TYPE_TQ1_0},
    {"tq2_0", QUILL_FTYPE_MOSTLY_TQ2_0, QUILL_TYPE_TQ2_0},
    {"mxfp4_moe", QUILL_FTYPE_MOSTLY_MXFP4_MOE, QUILL_TYPE_MXFP4},
    {"q1_0", QUILL_FTYPE_MOSTLY_Q1_0, QUILL_TYPE_Q1_0},
    {"q2_0", QUILL_FTYPE_MOSTLY_Q2_0, QUILL_TYPE_Q2_0},
    {"iq3_s", QUILL_FTYPE_MOSTLY_IQ3_S, QUILL_TYPE_IQ3_S},
    {"iq3_m", QUILL_FTYPE_MOSTLY_IQ3_M, QUILL_TYPE_IQ3_S},
};

/* The reference's file types whose blocks it only makes with an importance matrix (or, for
 * iq3_xs, whose mix puts some tensors in such a type): quill computes none, so it refuses them. */
static const char *const imatrix_ftypes[] = {"iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq1_s",
                                             "iq1_m",   "iq3_xxs", "iq3_xs", "q2_k_s"};
#define N_FTYPES (sizeof ftypes / sizeof ftypes[0])

/* The reference quantizer's shorthands: a bare k-quant means its _m mix. */
static const struct { const char *alias, *name; } ftype_aliases[] = {
    {"q3_k", "q3_k_m"}, {"q4_k", "q4_k_m"}, {"q5_k", "q5_k_m"},
};

static const ftype_info *ftype_lookup(quill_ftype f) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ftype == f) return &ftypes[i];
    return NULL;
}

bool quill_ftype_from_name(const char *name, quill_ftype *out) {
    char lower[16];
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof lower) return false;
    for (size_t i = 0; i <= n; i++) lower[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] - 'A' + 'a' : name[i]);
    for (size_t i = 0; i < sizeof ftype_aliases / sizeof ftype_aliases[0]; i++)
        if (!strcmp(lower, ftype_aliases[i].alias)) return quill_ftype_from_name(ftype_aliases[i].name, out);
    for (size_t i = 0; i < N_FTYPES; i++) {
        if (!strcmp(lower, ftypes[i].name)) {
            *out = ftypes[i].ftype;
            return true;
        }
    }
    return false;
}

quill_status quill_ftype_parse(const char *name, quill_ftype *out, quill_error *err) {
    if (quill_ftype_from_name(name, out)) return QUILL_OK;
    char lower[16];
    size_t n = strlen(name);
    for (size_t i = 0; i <= n && n < sizeof lower; i++)
        lower[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] - 'A' + 'a' : name[i]);
    for (size_t i = 0; n < sizeof lower && i < sizeof imatrix_ftypes / sizeof imatrix_ftypes[0]; i++)
        if (!strcmp(lower, imatrix_ftypes[i]))
            return quill_fail(err, QUILL_E_UNSUPPORTED,
                              "quantize: %s needs an importance matrix (the reference's llama-imatrix output, "
                              "passed with --imatrix), which quill does not compute; quantize to it with the "
                              "reference's tools, or choose a type that needs none: %s",
                              lower, quill_ftype_names());
    return quill_fail(err, QUILL_E_ARG, "quantize: unknown type '%.32s'; choose one of: %s", name, quill_ftype_names());
}

const char *quill_ftype_name(quill_ftype ftype) {
    const ftype_info *f = ftype_lookup(ftype);
    return f ? f->name : NULL;
}

uint32_t quill_ftype_base_type(quill_ftype ftype) {
    const ftype_info *f = ftype_lookup(ftype);
    return f ? f->base : QUILL_TYPE_COUNT;
}

const char *quill_ftype_names(void) {
    return "q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k iq4_nl iq4_xs "
           "tq1_0 tq2_0 q1_0 q2_0 iq3_s iq3_m mxfp4_moe f16 bf16 f32 (q3_k, q4_k, q5_k = the _m mixes)";
}

/* ---------------------------------------------------------------- per-tensor types */

static bool is_quantized_type(uint32_t t) {
    return t != QUILL_TYPE_F32 && t != QUILL_TYPE_F16 && t != QUILL_TYPE_BF16 && t != QUILL_TYPE_F64 &&
           t != QUILL_TYPE_I8 && t != QUILL_TYPE_I16 && t != QUILL_TYPE_I32 && t != QUILL_TYPE_I64;
}

static bool contains(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Dimensions up to the last one above 1 (a [n, 1] matrix counts as a vector). */
static int effective_dims(const quill_gguf_tensor *t) {
    int n = 1;
    for (int d = 1; d < 4; d++)
        if (t->ne[d] > 1) n = d + 1;
    return n;
}

/* Which tensors the reference quantizes at all: 2-D+ weights except norms, router gates,
 * positional tables and a few small architecture-specific ones. */
static bool wants_quantization(const quill_gguf_tensor *t) {
    const char *name = t->name;
    if (effective_dims(t) < 2 || !ends_with(name, "weight")) return false;
    static const char *const keep[] = {
        "_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight", "shortconv.conv.weight", "time_mix_first.weight",
        "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight", "attn_rel_b.weight", "altup", "laurel", "per_layer_model_proj",
    };
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (contains(name, keep[i])) return false;
    return strcmp(name, "position_embd.weight") != 0 && strcmp(name, "token_types.weight") != 0;
}

typedef struct {
    quill_ftype ftype;
    int n_layer, n_gqa, n_expert;
    bool is_70b, has_output;
    int n_attention_wv, i_attention_wv, i_ffn_down, i_ffn_gate, i_ffn_up;
} mix_state;

/* The reference's "use_more_bits": the first and last eighth of the layers and every third in
 * between. */
static bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

/* Layer index of a per-layer tensor: its position among its kind, or (models with experts) the
 * number in its name. */
static int layer_of(const mix_state *s, int counter, const char *name) {
    if (s->n_expert > 1) {
        int layer;
        if (sscanf(name, "blk.%d.", &layer) == 1) return layer;
    }
    return counter;
}

static int64_t block_size_of(uint32_t type) { return quill_type_traits_of(type)->block_size; }

/* Rows the chosen type cannot split take the reference's fallback: a 32-element block type of
 * about the same size, else f16. QUILL_TYPE_COUNT when there is none (the 32-block types). */
static uint32_t fit_rows(const quill_gguf_tensor *t, uint32_t type, bool *fallback) {
    if (t->ne[0] % block_size_of(type) == 0) return type;
    *fallback = true;
    switch (type) {
    case QUILL_TYPE_IQ3_S:
    case QUILL_TYPE_IQ4_XS: type = QUILL_TYPE_IQ4_NL; break;
    case QUILL_TYPE_Q2_K: /* this reference's choice; early-2025 versions took iq4_nl */
    case QUILL_TYPE_Q3_K:
    case QUILL_TYPE_Q2_0:
    case QUILL_TYPE_TQ1_0:
    case QUILL_TYPE_TQ2_0: type = QUILL_TYPE_Q4_0; break;
    case QUILL_TYPE_Q4_K: type = QUILL_TYPE_Q5_0; break;
    case QUILL_TYPE_Q5_K: type = QUILL_TYPE_Q5_1; break;
    case QUILL_TYPE_Q6_K: type = QUILL_TYPE_Q8_0; break;
    default: return QUILL_TYPE_COUNT;
    }
    return t->ne[0] % block_size_of(type) == 0 ? type : QUILL_TYPE_F16;
}

/* The reference's choice for one tensor of a mix (llama_tensor_get_type, early 2025), for the
 * file types quill produces; `fallback` tells whether the row length forced another type.
 * Returns QUILL_TYPE_COUNT when no type fits the rows. */
static uint32_t mix_type(mix_state *s, const quill_gguf_tensor *t, bool *fallback) {
    const quill_ftype f = s->ftype;
    const char *name = t->name;
    uint32_t type = quill_ftype_base_type(f);
    *fallback = false;

    /* (Gemma 4's per-layer token embeddings count as token embeddings) */
    const bool token_embd = !strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight");
    if (!strcmp(name, "output.weight") || (!s->has_output && token_embd)) {
        if (f == QUILL_FTYPE_MOSTLY_MXFP4_MOE || t->ne[0] % block_size_of(type) != 0) type = QUILL_TYPE_Q8_0;
        else if (type != QUILL_TYPE_Q8_0) type = QUILL_TYPE_Q6_K;
    } else if (f == QUILL_FTYPE_MOSTLY_MXFP4_MOE) {
        /* experts (3-D) in mxfp4, every other matrix in q8_0 */
        type = t->ne[2] > 1 ? QUILL_TYPE_MXFP4 : QUILL_TYPE_Q8_0;
    } else if (token_embd) {
        if (f == QUILL_FTYPE_MOSTLY_TQ1_0 || f == QUILL_FTYPE_MOSTLY_TQ2_0 || f == QUILL_FTYPE_MOSTLY_Q2_0)
            type = QUILL_TYPE_Q4_K;
    } else if (contains(name, "attn_v.weight") || contains(name, "attn_kv_b.weight")) {
        /* (the older DeepSeek files' attn_kv_b holds the values: the reference treats it as attn_v) */
        if (f == QUILL_FTYPE_MOSTLY_Q2_K) type = s->n_gqa >= 4 ? QUILL_TYPE_Q4_K : QUILL_TYPE_Q3_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q3_K_M) type = s->i_attention_wv < 2 ? QUILL_TYPE_Q5_K : QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q3_K_L) type = QUILL_TYPE_Q5_K;
        else if (f == QUILL_FTYPE_MOSTLY_IQ3_S && s->n_gqa >= 4) type = QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_IQ3_M) type = QUILL_TYPE_Q4_K;
        else if ((f == QUILL_FTYPE_MOSTLY_IQ4_NL || f == QUILL_FTYPE_MOSTLY_IQ4_XS) && s->n_gqa >= 4)
            type = QUILL_TYPE_Q5_K;
        else if ((f == QUILL_FTYPE_MOSTLY_Q4_K_M || f == QUILL_FTYPE_MOSTLY_Q5_K_M) &&
                 use_more_bits(s->i_attention_wv, s->n_attention_wv))
            type = QUILL_TYPE_Q6_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q4_K_S && s->i_attention_wv < 4) type = QUILL_TYPE_Q5_K;
        /* 70B: eight heads share each attn_v, which is small; more bits are nearly free */
        if (s->is_70b && (type == QUILL_TYPE_Q3_K || type == QUILL_TYPE_Q4_K)) type = QUILL_TYPE_Q5_K;
        if (s->n_expert == 8) type = QUILL_TYPE_Q8_0;
        s->i_attention_wv++;
    } else if (contains(name, "attn_k.weight")) {
        if (s->n_expert == 8) type = QUILL_TYPE_Q8_0;
    } else if (contains(name, "attn_q.weight")) {
        /* unchanged for these mixes */
    } else if (contains(name, "ffn_down")) {
        const int il = layer_of(s, s->i_ffn_down, name), nl = s->n_layer;
        if (f == QUILL_FTYPE_MOSTLY_Q2_K) type = QUILL_TYPE_Q3_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q3_K_M) type = il < nl / 16 ? QUILL_TYPE_Q5_K : QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_IQ3_M && (il < nl / 8 || (s->n_expert == 8 && use_more_bits(il, nl))))
            type = QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q3_K_L) type = QUILL_TYPE_Q5_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q4_K_M) {
            if (use_more_bits(il, nl)) type = QUILL_TYPE_Q6_K;
        } else if (il < nl / 8 && (f == QUILL_FTYPE_MOSTLY_IQ4_NL || f == QUILL_FTYPE_MOSTLY_IQ4_XS))
            type = QUILL_TYPE_Q5_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q5_K_M && use_more_bits(il, nl)) type = QUILL_TYPE_Q6_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q4_K_S && il < nl / 8) type = QUILL_TYPE_Q5_K;
        s->i_ffn_down++;
    } else if (contains(name, "attn_output.weight")) {
        if (s->n_expert == 8) {
            if (f == QUILL_FTYPE_MOSTLY_Q2_K || f == QUILL_FTYPE_MOSTLY_Q3_K_S || f == QUILL_FTYPE_MOSTLY_Q3_K_M ||
                f == QUILL_FTYPE_MOSTLY_IQ4_NL || f == QUILL_FTYPE_MOSTLY_Q4_K_S || f == QUILL_FTYPE_MOSTLY_Q4_K_M ||
                f == QUILL_FTYPE_MOSTLY_IQ4_XS || f == QUILL_FTYPE_MOSTLY_IQ3_S || f == QUILL_FTYPE_MOSTLY_IQ3_M)
                type = QUILL_TYPE_Q5_K;
        } else {
            if (f == QUILL_FTYPE_MOSTLY_Q2_K) type = QUILL_TYPE_Q3_K;
            else if (f == QUILL_FTYPE_MOSTLY_Q3_K_M) type = QUILL_TYPE_Q4_K;
            else if (f == QUILL_FTYPE_MOSTLY_Q3_K_L) type = QUILL_TYPE_Q5_K;
            else if (f == QUILL_FTYPE_MOSTLY_IQ3_M) type = QUILL_TYPE_Q4_K;
        }
    } else if (contains(name, "attn_qkv.weight")) {
        if (f == QUILL_FTYPE_MOSTLY_Q3_K_M || f == QUILL_FTYPE_MOSTLY_Q3_K_L || f == QUILL_FTYPE_MOSTLY_IQ3_M)
            type = QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q4_K_M) type = QUILL_TYPE_Q5_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q5_K_M) type = QUILL_TYPE_Q6_K;
    } else if (contains(name, "ffn_gate")) {
        s->i_ffn_gate++;
    } else if (contains(name, "ffn_up")) {
        s->i_ffn_up++;
    }

    return fit_rows(t, type, fallback);
}

/* Output order: tensors outside the blocks, then block 0, 1, ... (numerically), by name within
 * each group — the order of the reference's tensor map. */
static int layer_number(const char *name) {
    int layer = -1;
    if (sscanf(name, "blk.%d.", &layer) != 1) layer = -1;
    return layer;
}

/* Merge sort: stable, and needs no global for the comparison's context. */
static void sort_output_order(const quill_gguf *g, uint64_t *order, uint64_t *tmp, uint64_t n) {
    if (n < 2) return;
    const uint64_t half = n / 2;
    sort_output_order(g, order, tmp, half);
    sort_output_order(g, order + half, tmp, n - half);
    uint64_t i = 0, j = half, k = 0;
    while (i < half && j < n) {
        const quill_gguf_tensor *ta = quill_gguf_tensor_at(g, order[i]), *tb = quill_gguf_tensor_at(g, order[j]);
        const int la = layer_number(ta->name), lb = layer_number(tb->name);
        const bool take_right = la != lb ? lb < la : strcmp(tb->name, ta->name) < 0;
        tmp[k++] = take_right ? order[j++] : order[i++];
    }
    while (i < half) tmp[k++] = order[i++];
    while (j < n) tmp[k++] = order[j++];
    memcpy(order, tmp, n * sizeof *order);
}

static int64_t get_int(const quill_gguf *g, const char *arch, size_t arch_len, const char *suffix, int64_t fallback) {
    char key[160];
    snprintf(key, sizeof key, "%.*s.%s", (int)arch_len, arch, suffix);
    int64_t v;
    /* (a per-layer array, Gemma 4's: layer 0's value, as the reference's hparams give it) */
    const quill_gguf_value *arr = quill_gguf_find(g, key);
    uint64_t cursor = 0;
    quill_gguf_value first;
    if (arr && arr->type == QUILL_GGUF_ARRAY)
        return quill_gguf_array_next(arr, &cursor, &first) && quill_gguf_value_i64(&first, &v) ? v : fallback;
    if (quill_gguf_get_i64(g, key, &v, NULL) != QUILL_OK) return fallback;
    return v;
}

quill_status quill_quantize_plan(const quill_gguf *in, quill_ftype ftype, bool pure, quill_quant_choice *choices,
                                 quill_error *err) {
    const ftype_info *fi = ftype_lookup(ftype);
    if (!fi) return quill_fail(err, QUILL_E_ARG, "quantize: unsupported file type %d", (int)ftype);
    const uint64_t n = quill_gguf_n_tensors(in);

    mix_state s;
    memset(&s, 0, sizeof s);
    s.ftype = ftype;
    const char *arch = "llama";
    size_t arch_len = 5;
    if (quill_gguf_get_str(in, "general.architecture", &arch, &arch_len, NULL) != QUILL_OK) {
        arch = "llama";
        arch_len = 5;
    }
    s.n_layer = (int)get_int(in, arch, arch_len, "block_count", 0);
    const int64_t n_head = get_int(in, arch, arch_len, "attention.head_count", 0);
    const int64_t n_head_kv = get_int(in, arch, arch_len, "attention.head_count_kv", n_head);
    s.n_gqa = n_head_kv > 0 ? (int)(n_head / n_head_kv) : 0;
    s.n_expert = (int)get_int(in, arch, arch_len, "expert_count", 0);
    s.is_70b = arch_len == 5 && !memcmp(arch, "llama", 5) && s.n_layer == 80 && n_head != n_head_kv;

    for (uint64_t i = 0; i < n; i++) {
        const char *name = quill_gguf_tensor_at(in, i)->name;
        if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight"))
            s.n_attention_wv++;
        else if (!strcmp(name, "output.weight"))
            s.has_output = true;
    }

    uint64_t *order = malloc((n ? n : 1) * sizeof *order), *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!order || !tmp) {
        free(order);
        free(tmp);
        return quill_fail(err, QUILL_E_NOMEM, "quantize: out of memory");
    }
    for (uint64_t i = 0; i < n; i++) order[i] = i;
    sort_output_order(in, order, tmp, n);
    free(tmp);

    const bool mix = is_quantized_type(fi->base);
    quill_status st = QUILL_OK;
    for (uint64_t k = 0; k < n && st == QUILL_OK; k++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(in, order[k]);
        quill_quant_choice *c = &choices[k];
        c->src_index = order[k];
        c->type = t->type;
        c->quantized = false;
        c->fallback = false;
        if (!wants_quantization(t)) continue;
        uint32_t type = fi->base;
        if (mix) {
            type = pure ? fit_rows(t, type, &c->fallback) : mix_type(&s, t, &c->fallback);
            if (type == QUILL_TYPE_COUNT) {
                st = quill_fail(err, QUILL_E_UNSUPPORTED,
                                "quantize: tensor '%s' has rows of %lld elements, which %s blocks of %lld do not "
                                "divide and no fallback type fits",
                                t->name, (long long)t->ne[0], quill_type_name(fi->base),
                                (long long)block_size_of(fi->base));
                break;
            }
        } else if (t->ne[0] % block_size_of(type) != 0) {
            st = quill_fail(err, QUILL_E_UNSUPPORTED, "quantize: tensor '%s': rows of %lld do not fit %s",
                            t->name, (long long)t->ne[0], quill_type_name(type));
            break;
        }
        if (type == t->type) continue;
        if (t->type != QUILL_TYPE_F32 && t->type != QUILL_TYPE_F16 && t->type != QUILL_TYPE_BF16) {
            st = quill_fail(err, QUILL_E_UNSUPPORTED,
                            "quantize: tensor '%s' is %s; requantizing is not supported (start from an F32, "
                            "F16 or BF16 model)",
                            t->name, quill_type_name(t->type));
            break;
        }
        c->type = type;
        c->quantized = true;
    }
    free(order);
    return st;
}

/* ---------------------------------------------------------------- whole files */

typedef struct {
    const uint8_t *src;     /* rows of the source tensor */
    uint32_t src_type;
    size_t src_row_bytes;
    float *f32;             /* scratch: n_threads * n_per_row floats */
    uint8_t *dst;
    size_t dst_row_bytes;
    uint32_t dst_type;
    int64_t n_per_row;
} quant_job;

static void to_f32_row(uint32_t type, const uint8_t *src, float *dst, int64_t n) {
    if (type == QUILL_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else {
        const int bf = type == QUILL_TYPE_BF16;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = bf ? quill_bfloat_to_float(h) : quill_half_to_float(h);
        }
    }
}

typedef struct {
    const quant_job *job;
    int64_t begin, end;
    float *row;
} quant_slice;

static void *quant_slice_run(void *arg) {
    const quant_slice *s = arg;
    const quant_job *j = s->job;
    for (int64_t r = s->begin; r < s->end; r++) {
        to_f32_row(j->src_type, j->src + (size_t)r * j->src_row_bytes, s->row, j->n_per_row);
        /* the plan chose a type quill makes, whose blocks divide the rows: this cannot fail */
        (void)quill_quantize_rows(j->dst_type, s->row, j->dst + (size_t)r * j->dst_row_bytes, 1, j->n_per_row, NULL);
    }
    return NULL;
}

#define MAX_THREADS 256

/* Quantizes rows [0, n_rows) of the job, split into contiguous slices over up to n_threads
 * threads (the caller takes the first). Chunks are millions of elements, so starting threads per
 * chunk costs nothing measurable; every row's bytes are independent of the split. */
static void quant_rows_parallel(const quant_job *job, int64_t n_rows, int n_threads) {
    int64_t min_rows = 65536 / job->n_per_row;
    if (min_rows < 1) min_rows = 1;
    int n = n_threads;
    if (n > MAX_THREADS) n = MAX_THREADS;
    if ((int64_t)n > n_rows / min_rows) n = (int)(n_rows / min_rows);
    if (n < 1) n = 1;
    quant_slice slices[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int t = 0; t < n; t++) {
        slices[t] = (quant_slice){job, n_rows * t / n, n_rows * (t + 1) / n, job->f32 + (size_t)t * (size_t)job->n_per_row};
        if (t > 0) started[t] = pthread_create(&threads[t], NULL, quant_slice_run, &slices[t]) == 0;
    }
    quant_slice_run(&slices[0]);
    for (int t = 1; t < n; t++) {
        if (started[t]) pthread_join(threads[t], NULL);
        else quant_slice_run(&slices[t]); /* could not start a thread: do its share here */
    }
}

static bool skip_key(const char *key) {
    return !strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version") ||
           !strcmp(key, "split.no") || !strcmp(key, "split.count") || !strcmp(key, "split.tensors.count");
}

quill_status quill_quantize_file(const char *in_path, const char *out_path, const quill_quantize_params *params,
                                 quill_error *err) {
    if (!params || !quill_ftype_name(params->ftype))
        return quill_fail(err, QUILL_E_ARG, "quantize: unsupported file type %d", params ? (int)params->ftype : -1);
    struct stat sa, sb;
    if (stat(in_path, &sa) == 0 && stat(out_path, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
        return quill_fail(err, QUILL_E_ARG, "quantize: the output %s is the input file", out_path);
    quill_gguf *in;
    quill_status st = quill_gguf_open(in_path, &in, err);
    if (st) return st;
    const uint64_t n = quill_gguf_n_tensors(in);
    quill_quant_choice *plan = calloc(n ? n : 1, sizeof *plan);
    quill_gguf_writer *w = quill_gguf_writer_new();
    float *f32 = NULL;
    uint8_t *out = NULL;
    bool streaming = false;
    if (!plan || !w) {
        st = quill_fail(err, QUILL_E_NOMEM, "quantize: out of memory");
        goto done;
    }
    if ((st = quill_quantize_plan(in, params->ftype, params->pure, plan, err))) goto done;

    /* metadata: everything but the keys the reference resets, then those two, last */
    for (uint64_t i = 0; i < quill_gguf_n_kv(in) && !st; i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(in, i);
        if (skip_key(kv->key)) continue;
        if (quill_gguf_writer_add_value(w, kv->key, &kv->value))
            st = quill_fail(err, QUILL_E_FORMAT, "%s: cannot copy metadata key '%s'", in_path, kv->key);
    }
    if (st) goto done;
    if (quill_gguf_writer_add_u32(w, "general.quantization_version", 2) ||
        quill_gguf_writer_add_u32(w, "general.file_type", (uint32_t)params->ftype)) {
        st = quill_fail(err, QUILL_E_NOMEM, "quantize: out of memory");
        goto done;
    }

    /* the directory, then the data tensor by tensor */
    int64_t max_row = 1;
    size_t max_out_chunk = 1;
    const int64_t chunk_elems = (int64_t)1 << 22;
    for (uint64_t k = 0; k < n; k++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(in, plan[k].src_index);
        if (quill_gguf_writer_add_tensor_info(w, t->name, plan[k].type, t->n_dims, t->ne)) {
            st = quill_fail(err, QUILL_E_FORMAT, "%s: tensor '%s' cannot be written as %s", in_path, t->name,
                            quill_type_name(plan[k].type));
            goto done;
        }
        if (plan[k].quantized) {
            if (t->ne[0] > max_row) max_row = t->ne[0];
            int64_t rows = chunk_elems / t->ne[0];
            if (rows < 1) rows = 1;
            const size_t bytes = quill_row_size(plan[k].type, t->ne[0]) * (size_t)rows;
            if (bytes > max_out_chunk) max_out_chunk = bytes;
        }
    }
    const int n_threads = params->n_threads > 1 ? (params->n_threads < MAX_THREADS ? params->n_threads : MAX_THREADS) : 1;
    f32 = malloc((size_t)max_row * (size_t)n_threads * sizeof *f32);
    out = malloc(max_out_chunk);
    if (!f32 || !out) {
        st = quill_fail(err, QUILL_E_NOMEM, "quantize: out of memory");
        goto done;
    }
    if ((st = quill_gguf_writer_begin_stream(w, out_path, err))) goto done;
    streaming = true;

    for (uint64_t k = 0; k < n; k++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(in, plan[k].src_index);
        uint64_t out_bytes = t->nbytes;
        if (!plan[k].quantized) {
            if ((st = quill_gguf_writer_stream_data(w, t->data, t->nbytes, err))) goto done;
        } else {
            const int64_t n_rows = t->n_elements / t->ne[0];
            int64_t chunk_rows = chunk_elems / t->ne[0];
            if (chunk_rows < 1) chunk_rows = 1;
            quant_job job = {
                .src_type = t->type,
                .src_row_bytes = quill_row_size(t->type, t->ne[0]),
                .f32 = f32,
                .dst = out,
                .dst_row_bytes = quill_row_size(plan[k].type, t->ne[0]),
                .dst_type = plan[k].type,
                .n_per_row = t->ne[0],
            };
            out_bytes = 0;
            for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
                const int64_t rows = n_rows - r0 < chunk_rows ? n_rows - r0 : chunk_rows;
                job.src = (const uint8_t *)t->data + (size_t)r0 * job.src_row_bytes;
                quant_rows_parallel(&job, rows, n_threads);
                const size_t bytes = (size_t)rows * job.dst_row_bytes;
                if ((st = quill_gguf_writer_stream_data(w, out, bytes, err))) goto done;
                out_bytes += bytes;
            }
        }
        if (params->progress) {
            quill_quantize_progress p = {
                .index = k,
                .count = n,
                .name = t->name,
                .n_dims = t->n_dims,
                .ne = t->ne,
                .src_type = t->type,
                .dst_type = plan[k].type,
                .quantized = plan[k].quantized,
                .fallback = plan[k].fallback,
                .src_bytes = t->nbytes,
                .dst_bytes = out_bytes,
            };
            params->progress(&p, params->user);
        }
    }
    streaming = false;
    st = quill_gguf_writer_finish_stream(w, err);
    if (st) remove(out_path);

done:
    if (streaming) {
        quill_gguf_writer_finish_stream(w, NULL);
        remove(out_path);
    }
    free(f32);
    free(out);
    quill_gguf_writer_free(w);
    free(plan);
    quill_gguf_close(in);
    return st;
}
