/* quill synth: a random-weight model GGUF of any supported architecture and shape, with a real
 * tokenizer and the hyperparameter keys the published files carry, for tests and benchmarks. */
#include "cli.h"
#include "quill_quantize.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* True when both paths name the same existing file (writing would destroy the input). */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* splitmix64: a 64-bit counter through a mixing function; one stream per tensor. */
static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001B3ull;
    return h;
}

/* Uniform in [-1, 1) from the top 24 bits: exact in float, so the weights are the same bits on
 * every platform. */
static float uniform_pm1(uint64_t *state) {
    return (float)(int32_t)(splitmix64(state) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/* The families synth writes: general.architecture and what its published files carry. */
typedef struct {
    const char *name;       /* --arch */
    const char *arch;       /* general.architecture */
    double freq_base, eps;
    int64_t ctx;            /* context_length */
    int head_dim_num, head_dim_den; /* attention.key_length = n_embd / n_head · num / den (0: not written) */
    bool tied;              /* no output.weight */
    bool rope_freqs;        /* Llama 3.1's rope_freqs.weight */
    bool qkv_bias, qk_norm, post_norms, fused, softcap, rope_long_short;
    int64_t window;         /* attention.sliding_window (0: none) */
    double linear_scaling;  /* rope.scaling.type linear with this factor (0: none) */
    int64_t experts, experts_used; /* mixture of experts: expert_count, expert_used_count (0: dense) */
    bool expert_ff_key;     /* expert_feed_forward_length (else the experts are feed_forward_length wide) */
    bool shared_expert;     /* qwen2moe's shared expert, --ff wide (expert_shared_feed_forward_length) */
    bool gpt_oss;           /* gpt-oss's biases (q, k, v, output, router, experts), attention sinks, its
                             * FFN norm named post_attention_norm, YaRN (factor 32 from 4096 positions) */
} synth_arch;

static const synth_arch arches[] = {
    {"llama", "llama", 10000, 1e-5, 2048, 0, 0, false, false, false, false, false, false, false, false, 0, 0, 0, 0, false, false, false},
    /* Llama 3.1/3.2: frequency factors, base 500000, tied embeddings (1B/3B) */
    {"llama3", "llama", 500000, 1e-5, 131072, 0, 0, true, true, false, false, false, false, false, false, 0, 0, 0, 0, false, false, false},
    /* Mistral Nemo: a head size other than n_embd / n_head */
    {"mistral", "llama", 1000000, 1e-5, 131072, 3, 4, false, false, false, false, false, false, false, false, 0, 0, 0, 0, false, false, false},
    {"qwen2", "qwen2", 1000000, 1e-6, 32768, 0, 0, true, false, true, false, false, false, false, false, 0, 0, 0, 0, false, false, false},
    {"qwen3", "qwen3", 1000000, 1e-6, 40960, 2, 1, true, false, false, true, false, false, false, false, 0, 0, 0, 0, false, false, false},
    {"gemma2", "gemma2", 10000, 1e-6, 8192, 1, 1, true, false, false, false, true, false, true, false, 4096, 0, 0, 0, false, false, false},
    {"gemma3", "gemma3", 1000000, 1e-6, 131072, 1, 1, true, false, false, true, true, false, false, false, 1024, 8, 0, 0, false, false, false},
    {"phi3", "phi3", 10000, 1e-5, 131072, 0, 0, false, false, false, false, false, true, false, true, 262144, 0, 0, 0, false, false, false},
    /* Qwen3-30B-A3B: 128 experts, 8 used, each expert_feed_forward_length wide */
    {"qwen3moe", "qwen3moe", 1000000, 1e-6, 40960, 2, 1, false, false, false, true, false, false, false, false, 0, 0,
     128, 8, true, false, false},
    /* Mixtral 8x7B: a llama file with 8 experts, 2 used, feed_forward_length wide */
    {"llama-moe", "llama", 1000000, 1e-5, 32768, 0, 0, false, false, false, false, false, false, false, false, 0, 0, 8,
     2, false, false, false},
    /* gpt-oss-20b: 32 experts, 4 used, a window of 128 on every other layer */
    {"gpt-oss", "gpt-oss", 150000, 1e-5, 131072, 1, 1, false, false, true, false, false, false, false, false, 128, 0,
     32, 4, true, false, true},
    /* Qwen1.5-MoE-A2.7B: 60 experts, 4 used, expert_feed_forward_length wide, a shared expert --ff wide */
    {"qwen2moe", "qwen2moe", 1000000, 1e-6, 8192, 0, 0, false, false, true, false, false, false, false, false, 0, 0, 60,
     4, true, true, false},
    {.name = "qwen35", .arch = "qwen35", .freq_base = 10000000, .eps = 1e-6, .ctx = 262144, .head_dim_num = 2,
     .head_dim_den = 1, .tied = true, .qk_norm = true},
    /* Qwen3.6-35B-A3B: 256 experts, 8 used, a shared expert --ff wide */
    {.name = "qwen35moe", .arch = "qwen35moe", .freq_base = 10000000, .eps = 1e-6, .ctx = 262144, .head_dim_num = 2,
     .head_dim_den = 1, .qk_norm = true, .experts = 256, .experts_used = 8, .expert_ff_key = true,
     .shared_expert = true},
    /* Qwen3-Next-80B-A3B: 512 experts, 10 used, a shared expert --ff wide */
    {.name = "qwen3next", .arch = "qwen3next", .freq_base = 10000000, .eps = 1e-6, .ctx = 262144, .head_dim_num = 2,
     .head_dim_den = 1, .qk_norm = true, .experts = 512, .experts_used = 10, .expert_ff_key = true,
     .shared_expert = true},
    /* SmolLM3-3B: every fourth layer unrotated (the architecture's, not a key) */
    {.name = "smollm3", .arch = "smollm3", .freq_base = 5000000, .eps = 1e-6, .ctx = 65536, .tied = true},
    /* OLMo 2 (OLMo 3 with --window: three sliding layers, then a global one) */
    {.name = "olmo2", .arch = "olmo2", .freq_base = 500000, .eps = 1e-6, .ctx = 4096, .post_norms = true},
    /* Granite 3.x 8B: its multipliers (synth_granite_keys) */
    {.name = "granite", .arch = "granite", .freq_base = 10000000, .eps = 1e-5, .ctx = 131072, .tied = true},
    /* GLM-4-9B-0414: q, k, v biases, half of each head rotated, fused gate+up (synth_is_glm4), post norms */
    {.name = "glm4", .arch = "glm4", .freq_base = 10000, .eps = 1e-5, .ctx = 32768, .qkv_bias = true, .post_norms = true},
    /* EXAONE 4.0 (no input norms, synth_no_input_norms; with 64 layers, its sliding layers) */
    {.name = "exaone4", .arch = "exaone4", .freq_base = 1000000, .eps = 1e-5, .ctx = 131072, .qk_norm = true,
     .post_norms = true},
    /* Seed-OSS-36B: heads of 128 where n_embd / n_head is 64, q, k, v biases, the FFN norm named post_attention_norm (synth_is_seed_oss) */
    {.name = "seed_oss", .arch = "seed_oss", .freq_base = 10000000, .eps = 1e-6, .ctx = 524288, .head_dim_num = 2,
     .head_dim_den = 1, .qkv_bias = true},
    /* Command R7B: LayerNorms, a parallel block, logit_scale 0.25 (synth_is_cohere2), tied */
    {.name = "cohere2", .arch = "cohere2", .freq_base = 50000, .eps = 1e-5, .ctx = 8192, .tied = true},
    /* Ministral 3: heads of 128 where n_embd / n_head is 96, YaRN and the attention temperature
     * (synth_mistral3_keys) */
    {.name = "mistral3", .arch = "mistral3", .freq_base = 1000000, .eps = 1e-5, .ctx = 262144, .head_dim_num = 4,
     .head_dim_den = 3},
    /* Gemma 4 (E2B's kinds of layers, synth_gemma4), tied, window 512 */
    {.name = "gemma4", .arch = "gemma4", .freq_base = 1000000, .eps = 1e-6, .ctx = 131072, .tied = true, .window = 512},
    /* DeepSeek V3: latent attention, 256 experts (8 used) in 8 groups (4 kept), a sigmoid router with a
     * selection bias, one shared expert, leading dense layers (synth_router_family) */
    {.name = "deepseek2", .arch = "deepseek2", .freq_base = 10000, .eps = 1e-6, .ctx = 163840, .experts = 256,
     .experts_used = 8, .expert_ff_key = true},
    /* GLM-4.5-Air: q, k, v biases, half of each head rotated (NeoX), 128 experts (8 used), a sigmoid router
     * with a selection bias, one shared expert, a leading dense layer (synth_router_family) */
    {.name = "glm4moe", .arch = "glm4moe", .freq_base = 1000000, .eps = 1e-5, .ctx = 131072, .qkv_bias = true,
     .experts = 128, .experts_used = 8, .expert_ff_key = true},
    /* Nemotron-H / Nemotron Nano 2: Mamba-2 mixers, attention without RoPE, relu² FFNs, one block per
     * layer in the pattern M-M*- (synth_mamba_*) */
    {.name = "nemotron_h", .arch = "nemotron_h", .freq_base = 10000, .eps = 1e-5, .ctx = 131072},
    /* Granite 4.0-H: Mamba-2 mixers and attention (M*MM*M...), each with a gated FFN, Granite's multipliers;
     * --experts N --experts-used K: Tiny's kind, --ff-wide experts and a shared expert as wide */
    /* Nemotron 3 Nano 30B-A3B: Nemotron-H's layers, its FFN layers 128 experts (6 used, expert_feed_forward_length
     * wide) of relu(up)² with a sigmoid router and a selection bias, weights normalised and scaled by 2.5, a shared
     * expert --ff wide */
    {.name = "nemotron_h_moe", .arch = "nemotron_h_moe", .freq_base = 10000, .eps = 1e-5, .ctx = 262144, .experts = 128,
     .experts_used = 6, .expert_ff_key = true, .shared_expert = true},
    {.name = "granitehybrid", .arch = "granitehybrid", .freq_base = 10000, .eps = 1e-5, .ctx = 131072, .tied = true},
    /* LFM2-350M..2.6B: gated short convolutions, every third layer attention (synth_lfm2), tied */
    {.name = "lfm2", .arch = "lfm2", .freq_base = 1000000, .eps = 1e-5, .ctx = 128000, .tied = true, .qk_norm = true},
    /* LFM2-8B-A1B: the same layers, 32 experts (4 used) after --dense-lead N (2) dense layers, a sigmoid router
     * with a selection bias */
    {.name = "lfm2moe", .arch = "lfm2moe", .freq_base = 1000000, .eps = 1e-5, .ctx = 128000, .tied = true,
     .qk_norm = true, .experts = 32, .experts_used = 4, .expert_ff_key = true},
};

/* DeepSeek 2/3 and GLM-4.5: their layers (leading dense ones, then experts with a shared one and the
 * router's selection bias), their router keys, their MTP blocks (--mtp) */
static bool synth_router_family(const synth_arch *a) { return !strcmp(a->arch, "deepseek2") || !strcmp(a->arch, "glm4moe"); }

/* The families' own sizes: latent attention's ranks and parts (--mla Q,KV,NOPE,ROPE,V: by default from
 * the head size hd, q_lora 6 hd, kv_lora 4 hd, nope 2 hd, rope hd, v 2 hd; q_lora 0: attn_q), the
 * expert groups (--groups G,U), leading dense layers (--dense-lead N, 1), the router's scale. */
typedef struct {
    int64_t q_lora, kv_lora, nope, rope, v_head;
    int64_t groups, groups_used, dense_lead, mtp;
    bool kv_b; /* --kv-b: the older files' attn_kv_b instead of attn_k_b and attn_v_b */
    bool yarn; /* --yarn: DeepSeek V3's YaRN (factor 40 over 4096 positions, mscale_all_dim 1) */
} synth_router;

static bool synth_router_keys(quill_gguf_writer *w, const synth_arch *arch, const synth_router *r, int64_t n_vocab) {
    const char *a = arch->arch;
    const bool ds = !strcmp(a, "deepseek2");
    char key[96];
#define RKEY(suffix) (snprintf(key, sizeof key, "%s.%s", a, suffix), key)
    bool bad = quill_gguf_writer_add_u32(w, RKEY("leading_dense_block_count"), (uint32_t)r->dense_lead) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, RKEY("expert_shared_count"), 1) != QUILL_OK;
    bad |= quill_gguf_writer_add_f32(w, RKEY("expert_weights_scale"), ds ? 2.5f : 1.0f) != QUILL_OK;
    bad |= quill_gguf_writer_add_bool(w, RKEY("expert_weights_norm"), true) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, RKEY("expert_gating_func"), 2) != QUILL_OK;
    if (r->groups) {
        bad |= quill_gguf_writer_add_u32(w, RKEY("expert_group_count"), (uint32_t)r->groups) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, RKEY("expert_group_used_count"), (uint32_t)r->groups_used) != QUILL_OK;
    }
    if (r->mtp) bad |= quill_gguf_writer_add_u32(w, RKEY("nextn_predict_layers"), (uint32_t)r->mtp) != QUILL_OK;
    if (ds) {
        bad |= quill_gguf_writer_add_u32(w, RKEY("vocab_size"), (uint32_t)n_vocab) != QUILL_OK;
        /* (0: attn_q; written, as the reference reads it for all but the Lite shapes) */
        bad |= quill_gguf_writer_add_u32(w, RKEY("attention.q_lora_rank"), (uint32_t)r->q_lora) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, RKEY("attention.kv_lora_rank"), (uint32_t)r->kv_lora) != QUILL_OK;
        /* (the older converter wrote the heads' own sizes and no _mla keys) */
        bad |= quill_gguf_writer_add_u32(w, RKEY("attention.key_length"),
                                         (uint32_t)(r->kv_b ? r->nope + r->rope : r->kv_lora + r->rope)) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, RKEY("attention.value_length"), (uint32_t)(r->kv_b ? r->v_head : r->kv_lora)) !=
               QUILL_OK;
        if (!r->kv_b) {
            bad |= quill_gguf_writer_add_u32(w, RKEY("attention.key_length_mla"), (uint32_t)(r->nope + r->rope)) != QUILL_OK;
            bad |= quill_gguf_writer_add_u32(w, RKEY("attention.value_length_mla"), (uint32_t)r->v_head) != QUILL_OK;
        }
        if (r->yarn) {
            bad |= quill_gguf_writer_add_str(w, RKEY("rope.scaling.type"), "yarn", 4) != QUILL_OK;
            bad |= quill_gguf_writer_add_f32(w, RKEY("rope.scaling.factor"), 40.0f) != QUILL_OK;
            bad |= quill_gguf_writer_add_u32(w, RKEY("rope.scaling.original_context_length"), 4096) != QUILL_OK;
            bad |= quill_gguf_writer_add_f32(w, RKEY("rope.scaling.yarn_log_multiplier"), 0.1f) != QUILL_OK;
        }
    }
#undef RKEY
    return !bad;
}



/* OLMo 2: no attn_norm, ffn_norm; attn_{q,k}_norm over the whole projection */
static bool synth_is_olmo2(const synth_arch *a) { return !strcmp(a->arch, "olmo2"); }

/* OLMo 2, EXAONE 4: q, k, v read the residual stream, the FFN ffn_inp */
static bool synth_no_input_norms(const synth_arch *a) { return synth_is_olmo2(a) || !strcmp(a->arch, "exaone4"); }

/* Seed-OSS: the FFN's input norm named post_attention_norm */
static bool synth_is_seed_oss(const synth_arch *a) { return !strcmp(a->arch, "seed_oss"); }

/* Command R7B: LayerNorms (attention.layer_norm_epsilon), no ffn_norm, logit_scale */
static bool synth_is_cohere2(const synth_arch *a) { return !strcmp(a->arch, "cohere2"); }

/* Ministral 3's YaRN (factor 16, yarn_log_multiplier 1) and Llama 4's attention temperature (0.1),
 * over an original context of 8 positions, so that a short prompt crosses into the scaled range */
static bool synth_mistral3_keys(quill_gguf_writer *w, const char *arch) {
    static const char *const keys[] = {"rope.scaling.factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
                                       "rope.scaling.yarn_log_multiplier", "attention.temperature_scale"};
    static const float values[] = {16.0f, 32.0f, 1.0f, 1.0f, 0.1f};
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    bool ok = quill_gguf_writer_add_str(w, key, "yarn", 4) == QUILL_OK;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", arch);
    ok &= quill_gguf_writer_add_u32(w, key, 8) == QUILL_OK;
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, keys[i]);
        ok &= quill_gguf_writer_add_f32(w, key, values[i]) == QUILL_OK;
    }
    return ok;
}

/* GLM-4: fused gate+up with separate q, k, v; half of each head rotated */
static bool synth_is_glm4(const synth_arch *a) { return !strcmp(a->arch, "glm4"); }

/* Granite 3.x's multipliers (attention.scale 1/64 here, where its heads of 128 have 1/128) */
static bool synth_granite_keys(quill_gguf_writer *w, const char *arch) {
    static const char *const keys[] = {"logit_scale", "residual_scale", "embedding_scale", "attention.scale"};
    static const float values[] = {16.0f, 0.22f, 12.0f, 0.015625f};
    bool ok = true;
    char key[96];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, keys[i]);
        ok &= quill_gguf_writer_add_f32(w, key, values[i]) == QUILL_OK;
    }
    return ok;
}

typedef struct {
    const char *name;
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx;
} synth_preset;

static const synth_preset presets[] = {
    {"tinyllama-1.1b", 2048, 22, 32, 4, 5632, 2048},
};

typedef struct {
    char name[96];
    uint32_t n_dims;
    int64_t ne[3];
    uint32_t type;
    float center, spread;   /* values: center + spread * uniform(-1, 1) */
    const float *fixed;     /* or these values */
} synth_tensor;

static void synth_add(synth_tensor *t, int *n, uint32_t type, float center, float spread, int64_t ne0, int64_t ne1,
                      const char *fmt, int layer) {
    synth_tensor *s = &t[(*n)++];
    snprintf(s->name, sizeof s->name, fmt, layer);
    s->n_dims = ne1 > 0 ? 2 : 1;
    s->ne[0] = ne0;
    s->ne[1] = ne1 > 0 ? ne1 : 1;
    s->ne[2] = 1;
    s->type = type;
    s->center = center;
    s->spread = spread;
}

/* A stack of ne2 matrices (experts, heads): synth_add's tensor with a third dimension (none when
 * ne2 is 0). */
static void synth_add_stack(synth_tensor *t, int *n, int64_t ne2, uint32_t type, float center, float spread,
                            int64_t ne0, int64_t ne1, const char *fmt, int layer) {
    synth_add(t, n, type, center, spread, ne0, ne1, fmt, layer);
    if (ne2 > 0) t[*n - 1].n_dims = 3, t[*n - 1].ne[2] = ne2;
}

/* A gated FFN of width ff: blk.L.ffn_gate, _down and _up with `suffix` ("", "_exps", "_shexp"), in
 * that order (the order of the files it imitates, so of the synthesized bytes), stacks of E experts
 * when E > 0; each uniform with the standard deviation 1 / sqrt(its fan-in). */
static void synth_add_ffn(synth_tensor *t, int *n, uint32_t type, int64_t d, int64_t ff, int64_t E, const char *suffix,
                          int layer) {
    const float root3 = 1.7320508f; /* a uniform on [-a, a] has standard deviation a / sqrt(3) */
    char gate[64], down[64], up[64];
    snprintf(gate, sizeof gate, "blk.%%d.ffn_gate%s.weight", suffix);
    snprintf(down, sizeof down, "blk.%%d.ffn_down%s.weight", suffix);
    snprintf(up, sizeof up, "blk.%%d.ffn_up%s.weight", suffix);
    synth_add_stack(t, n, E, type, 0.0f, root3 / sqrtf((float)d), d, ff, gate, layer);
    synth_add_stack(t, n, E, type, 0.0f, root3 / sqrtf((float)ff), ff, d, down, layer);
    synth_add_stack(t, n, E, type, 0.0f, root3 / sqrtf((float)d), d, ff, up, layer);
}

/* Generates one tensor in chunks and streams it to the writer. */
static quill_status synth_stream(quill_gguf_writer *w, const synth_tensor *t, uint64_t seed, float *vals,
                                 uint8_t *bytes, int64_t chunk, quill_error *err) {
    uint64_t state = seed ^ fnv1a(t->name);
    const int64_t total = t->ne[0] * t->ne[1] * t->ne[2];
    for (int64_t done = 0; done < total; done += chunk) {
        const int64_t n = total - done < chunk ? total - done : chunk;
        for (int64_t i = 0; i < n; i++)
            vals[i] = t->fixed ? t->fixed[done + i] : t->center + t->spread * uniform_pm1(&state);
        quill_status s = quill_quantize_rows(t->type, vals, bytes, 1, n, err);
        if (s) return s;
        s = quill_gguf_writer_stream_data(w, bytes, quill_row_size(t->type, n), err);
        if (s) return s;
    }
    return QUILL_OK;
}

/* Llama 3.1's frequency factors (its rope_scaling: factor 8, low 1, high 4, 8192 original
 * positions), as its converter computes them for rope_freqs.weight. */
static void llama3_factors(float *f, int64_t half, int64_t n_rot, double base) {
    const double factor = 8, low = 1, high = 4, orig = 8192, pi = 3.14159265358979323846;
    for (int64_t i = 0; i < half; i++) {
        const double wavelen = 2 * pi / pow(base, -2.0 * (double)i / (double)n_rot);
        if (wavelen < orig / high) f[i] = 1;
        else if (wavelen > orig / low) f[i] = (float)factor;
        else {
            const double smooth = (orig / wavelen - low) / (high - low);
            f[i] = (float)(1 / ((1 - smooth) / factor + smooth));
        }
    }
}

/* ---------------------------------------------------------------- gemma4 */

/* Gemma 4's layers: layer l global when l % pattern == pattern - 1 (the others slide), the global
 * ones with heads twice as large, half the KV heads (at least one) and no attn_v (V is K), the last
 * `shared` layers without K and V (they read an earlier layer's cache) and with FFNs twice as wide,
 * per-layer inputs of n_pl, proportional RoPE on the global layers (a quarter of their pairs
 * rotated, rope_freqs 1e30 for the others), a layer output scale, final soft-capping at 30. */
typedef struct {
    int64_t pattern, shared, head_swa, head_full, kv_swa, kv_full, n_pl;
} synth_gemma4;

static bool synth_gemma4_sliding(const synth_gemma4 *g, int64_t l) { return l % g->pattern != g->pattern - 1; }

static bool synth_gemma4_keys(quill_gguf_writer *w, const char *arch, const synth_preset *hp, const synth_gemma4 *g) {
    char key[128];
    int32_t ff[1024], kv[1024];
    uint8_t sliding[1024];
    for (int64_t l = 0; l < hp->n_layer; l++) {
        sliding[l] = synth_gemma4_sliding(g, l);
        kv[l] = (int32_t)(sliding[l] ? g->kv_swa : g->kv_full);
        ff[l] = (int32_t)(l < hp->n_layer - g->shared ? hp->n_ff : 2 * hp->n_ff);
    }
#define GKEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    const uint64_t n = (uint64_t)hp->n_layer;
    bool bad = quill_gguf_writer_add_arr(w, GKEY("feed_forward_length"), QUILL_GGUF_INT32, ff, n) != QUILL_OK;
    bad |= quill_gguf_writer_add_arr(w, GKEY("attention.head_count_kv"), QUILL_GGUF_INT32, kv, n) != QUILL_OK;
    bad |= quill_gguf_writer_add_arr(w, GKEY("attention.sliding_window_pattern"), QUILL_GGUF_BOOL, sliding, n) !=
           QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, GKEY("rope.dimension_count"), (uint32_t)g->head_full) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, GKEY("rope.dimension_count_swa"), (uint32_t)g->head_swa) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, GKEY("attention.key_length"), (uint32_t)g->head_full) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, GKEY("attention.value_length"), (uint32_t)g->head_full) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, GKEY("attention.key_length_swa"), (uint32_t)g->head_swa) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, GKEY("attention.value_length_swa"), (uint32_t)g->head_swa) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, GKEY("attention.shared_kv_layers"), (uint32_t)g->shared) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, GKEY("embedding_length_per_layer_input"), (uint32_t)g->n_pl) != QUILL_OK;
    bad |= quill_gguf_writer_add_f32(w, GKEY("final_logit_softcapping"), 30.0f) != QUILL_OK;
#undef GKEY
    return !bad;
}

static void synth_gemma4_tensors(synth_tensor *ts, int *nt, uint32_t wtype, const synth_preset *hp,
                                 const synth_gemma4 *g, int64_t n_vocab, float *factors) {
    const float root3 = 1.7320508f, norm_spread = 0.01f * root3;
    const int64_t d = hp->n_embd, all = g->n_pl * hp->n_layer, half = g->head_full / 2;
#define SPREAD(fan_in) (root3 / sqrtf((float)(fan_in)))
    for (int64_t i = 0; i < half; i++) factors[i] = i < half / 4 ? 1.0f : 1e30f;
    synth_add(ts, nt, QUILL_TYPE_F32, 0, 0, half, 0, "rope_freqs.weight", 0);
    ts[*nt - 1].fixed = factors;
    if (g->n_pl) {
        synth_add(ts, nt, wtype, 0.0f, 0.2f * root3, all, n_vocab, "per_layer_token_embd.weight", 0);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, all, "per_layer_model_proj.weight", 0);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, g->n_pl, 0, "per_layer_proj_norm.weight", 0);
    }
    for (int l = 0; l < (int)hp->n_layer; l++) {
        const bool sliding = synth_gemma4_sliding(g, l), own_kv = l < hp->n_layer - g->shared;
        const int64_t hd = sliding ? g->head_swa : g->head_full, q_dim = hp->n_head * hd;
        const int64_t kv_dim = (sliding ? g->kv_swa : g->kv_full) * hd, ff = own_kv ? hp->n_ff : 2 * hp->n_ff;
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.attn_norm.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, q_dim, "blk.%d.attn_q.weight", l);
        if (own_kv) synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_k.weight", l);
        if (own_kv && sliding) synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_v.weight", l);
        /* q·k is not scaled: norms of hd^-1/4 keep the scores' spread near a scaled model's */
        const float qk = powf((float)hd, -0.25f);
        synth_add(ts, nt, QUILL_TYPE_F32, qk, qk * norm_spread, hd, 0, "blk.%d.attn_q_norm.weight", l);
        if (own_kv) synth_add(ts, nt, QUILL_TYPE_F32, qk, qk * norm_spread, hd, 0, "blk.%d.attn_k_norm.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(q_dim), q_dim, d, "blk.%d.attn_output.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.post_attention_norm.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.ffn_norm.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, ff, "blk.%d.ffn_gate.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, ff, "blk.%d.ffn_up.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(ff), ff, d, "blk.%d.ffn_down.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.post_ffw_norm.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.6f, 0.2f, 1, 0, "blk.%d.layer_output_scale.weight", l);
        if (g->n_pl) {
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, g->n_pl, "blk.%d.inp_gate.weight", l);
            synth_add(ts, nt, wtype, 0.0f, SPREAD(g->n_pl), g->n_pl, d, "blk.%d.proj.weight", l);
            synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.post_norm.weight", l);
        }
    }
#undef SPREAD
}

/* ---------------------------------------------------------------- Mamba-2 hybrids */

/* The Mamba-2 sizes synth gives: d_inner twice n_embd in --heads heads, 2 groups, a state of 16, four
 * taps (Nemotron-H's and Granite 4.0-H's proportions, smaller). */
typedef struct {
    int64_t inner, heads, groups, state, kernel;
} synth_mamba;

static bool synth_is_granite_hybrid(const synth_arch *a) { return !strcmp(a->arch, "granitehybrid"); }
static bool synth_is_mamba(const synth_arch *a) {
    return !strcmp(a->arch, "nemotron_h") || !strcmp(a->arch, "nemotron_h_moe") || synth_is_granite_hybrid(a);
}

/* Layer l's kind: 'M' a Mamba-2 mixer, '*' attention, '-' an FFN alone (Nemotron-H's pattern M-M*-
 * repeated, so that a few layers hold every kind; Granite 4.0-H's M*M, each layer with its FFN) */
static char synth_mamba_kind(const synth_arch *a, int l) {
    return synth_is_granite_hybrid(a) ? "M*M"[l % 3] : "M-M*-"[l % 5];
}

static bool synth_mamba_keys(quill_gguf_writer *w, const synth_arch *a, const synth_preset *hp, const synth_mamba *m) {
    const char *arch = a->arch;
    char key[128];
#define MKEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    bool bad = quill_gguf_writer_add_u32(w, MKEY("ssm.conv_kernel"), (uint32_t)m->kernel) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, MKEY("ssm.state_size"), (uint32_t)m->state) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, MKEY("ssm.group_count"), (uint32_t)m->groups) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, MKEY("ssm.time_step_rank"), (uint32_t)m->heads) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, MKEY("ssm.inner_size"), (uint32_t)m->inner) != QUILL_OK;
    int32_t kv[1024], ff[1024];
    const int n = (int)hp->n_layer;
    for (int l = 0; l < n; l++) {
        kv[l] = synth_mamba_kind(a, l) == '*' ? (int32_t)hp->n_head_kv : 0;
        ff[l] = synth_mamba_kind(a, l) == '-' ? (int32_t)hp->n_ff : 0;
    }
    bad |= quill_gguf_writer_add_arr(w, MKEY("attention.head_count_kv"), QUILL_GGUF_INT32, kv, n) != QUILL_OK;
    if (synth_is_granite_hybrid(a))
        bad |= quill_gguf_writer_add_u32(w, MKEY("feed_forward_length"), (uint32_t)hp->n_ff) != QUILL_OK;
    else
        bad |= quill_gguf_writer_add_arr(w, MKEY("feed_forward_length"), QUILL_GGUF_INT32, ff, n) != QUILL_OK;
#undef MKEY
    return !bad;
}

/* One Nemotron-H layer's tensors, of its kind */
static void synth_mamba_layer(synth_tensor *ts, int *nt, uint32_t wtype, const synth_arch *a, const synth_preset *hp,
                              int64_t head_dim, const synth_mamba *m, int64_t n_expert, int64_t ff_exp, int l) {
    const float root3 = 1.7320508f, norm_spread = 0.01f * root3;
    const int64_t d = hp->n_embd, q_dim = hp->n_head * head_dim, kv_dim = hp->n_head_kv * head_dim;
    const int64_t conv_dim = m->inner + 2 * m->groups * m->state;
#define SPREAD(fan_in) (root3 / sqrtf((float)(fan_in)))
    synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.attn_norm.weight", l);
    switch (synth_mamba_kind(a, l)) {
    case 'M':
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, 2 * m->inner + 2 * m->groups * m->state + m->heads,
                  "blk.%d.ssm_in.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(m->kernel), m->kernel, conv_dim, "blk.%d.ssm_conv1d.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 0.1f, conv_dim, 0, "blk.%d.ssm_conv1d.bias", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 1.0f, m->heads, 0, "blk.%d.ssm_dt.bias", l);
        /* A = -exp(A_log): negative; ssm_a and ssm_d are [1][heads] */
        synth_add(ts, nt, QUILL_TYPE_F32, -1.0f, 0.5f, 1, m->heads, "blk.%d.ssm_a", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, 0.5f, 1, m->heads, "blk.%d.ssm_d", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, m->inner / m->groups, m->groups, "blk.%d.ssm_norm.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(m->inner), m->inner, d, "blk.%d.ssm_out.weight", l);
        break;
    case '*':
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, q_dim, "blk.%d.attn_q.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_k.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_v.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(q_dim), q_dim, d, "blk.%d.attn_output.weight", l);
        break;
    default:
        if (n_expert) {
            /* Nemotron 3 Nano: the router (f32) and its selection bias, ungated experts, an ungated shared expert */
            const int64_t E = n_expert, sh = hp->n_ff;
            synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(d), d, E, "blk.%d.ffn_gate_inp.weight", l);
            synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 0.1f, E, 0, "blk.%d.exp_probs_b.bias", l);
            synth_add_stack(ts, nt, E, wtype, 0.0f, SPREAD(d), d, ff_exp, "blk.%d.ffn_up_exps.weight", l);
            synth_add_stack(ts, nt, E, wtype, 0.0f, SPREAD(ff_exp), ff_exp, d, "blk.%d.ffn_down_exps.weight", l);
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, sh, "blk.%d.ffn_up_shexp.weight", l);
            synth_add(ts, nt, wtype, 0.0f, SPREAD(sh), sh, d, "blk.%d.ffn_down_shexp.weight", l);
            break;
        }
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, hp->n_ff, "blk.%d.ffn_up.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(hp->n_ff), hp->n_ff, d, "blk.%d.ffn_down.weight", l);
    }
    if (!synth_is_granite_hybrid(a)) return;
    /* Granite 4.0-H: every layer's gated FFN, or its experts and a shared expert */
    const int64_t ff = hp->n_ff, E = n_expert;
    synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.ffn_norm.weight", l);
    if (!E) {
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, ff, "blk.%d.ffn_gate.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, ff, "blk.%d.ffn_up.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(ff), ff, d, "blk.%d.ffn_down.weight", l);
        return;
    }
    synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(d), d, E, "blk.%d.ffn_gate_inp.weight", l);
    synth_add_stack(ts, nt, E, wtype, 0.0f, SPREAD(d), d, ff, "blk.%d.ffn_gate_exps.weight", l);
    synth_add_stack(ts, nt, E, wtype, 0.0f, SPREAD(d), d, ff, "blk.%d.ffn_up_exps.weight", l);
    synth_add_stack(ts, nt, E, wtype, 0.0f, SPREAD(ff), ff, d, "blk.%d.ffn_down_exps.weight", l);
    synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, ff, "blk.%d.ffn_gate_shexp.weight", l);
    synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, ff, "blk.%d.ffn_up_shexp.weight", l);
    synth_add(ts, nt, wtype, 0.0f, SPREAD(ff), ff, d, "blk.%d.ffn_down_shexp.weight", l);
#undef SPREAD
}

/* ---------------------------------------------------------------- lfm2 */

/* LFM2: layer l is a gated short convolution (3 taps), but every third one (2, 5, ...) attention */
static bool synth_is_lfm2(const synth_arch *a) { return !strcmp(a->arch, "lfm2") || !strcmp(a->arch, "lfm2moe"); }
static bool synth_lfm2_conv(int64_t l) { return l % 3 != 2; }
#define SYNTH_LFM2_L_CACHE 3

static bool synth_lfm2_keys(quill_gguf_writer *w, const char *arch, const synth_preset *hp, int64_t n_vocab,
                            int64_t dense_lead, bool moe) {
    char key[128];
    int32_t kv[1024];
    for (int64_t l = 0; l < hp->n_layer; l++) kv[l] = synth_lfm2_conv(l) ? 0 : (int32_t)hp->n_head_kv;
#define LKEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    bool bad = quill_gguf_writer_add_arr(w, LKEY("attention.head_count_kv"), QUILL_GGUF_INT32, kv, (uint64_t)hp->n_layer) !=
               QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, LKEY("vocab_size"), (uint32_t)n_vocab) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, LKEY("shortconv.l_cache"), SYNTH_LFM2_L_CACHE) != QUILL_OK;
    if (moe) {
        bad |= quill_gguf_writer_add_u32(w, LKEY("leading_dense_block_count"), (uint32_t)dense_lead) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, LKEY("expert_gating_func"), 2) != QUILL_OK;
    }
#undef LKEY
    return !bad;
}

/* One LFM2 layer in the converter's order: its norms, its FFN (dense, or after the leading dense layers the
 * router, its selection bias and the experts), then the convolution or the attention. */
static void synth_lfm2_layer(synth_tensor *ts, int *nt, uint32_t wtype, const synth_preset *hp, int64_t head_dim,
                             int64_t n_expert, int64_t ff_exp, int64_t dense_lead, int l) {
    const float root3 = 1.7320508f, norm_spread = 0.01f * root3;
    const int64_t d = hp->n_embd, kv_dim = hp->n_head_kv * head_dim;
#define SPREAD(fan_in) (root3 / sqrtf((float)(fan_in)))
    synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.attn_norm.weight", l);
    synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.ffn_norm.weight", l);
    if (n_expert && l >= dense_lead) {
        /* the router and its selection bias stay f32, as in published files */
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(d), d, n_expert, "blk.%d.ffn_gate_inp.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 0.05f, n_expert, 0, "blk.%d.exp_probs_b.bias", l);
        synth_add_ffn(ts, nt, wtype, d, ff_exp, n_expert, "_exps", l);
    } else {
        synth_add_ffn(ts, nt, wtype, d, hp->n_ff, 0, "", l);
    }
    if (synth_lfm2_conv(l)) {
        /* the taps stay f32 (the reference's quantizer leaves rows of 3) */
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(SYNTH_LFM2_L_CACHE), SYNTH_LFM2_L_CACHE, d,
                  "blk.%d.shortconv.conv.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, 3 * d, "blk.%d.shortconv.in_proj.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, d, "blk.%d.shortconv.out_proj.weight", l);
    } else {
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, head_dim, 0, "blk.%d.attn_q_norm.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, head_dim, 0, "blk.%d.attn_k_norm.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, d, "blk.%d.attn_q.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_k.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_v.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, d, "blk.%d.attn_output.weight", l);
    }
#undef SPREAD
}

/* ---------------------------------------------------------------- qwen35 (hybrid) */

/* The DeltaNet sizes synth gives a hybrid model: a state of half a head, the KV heads' count of key
 * heads, the heads' count of value heads, four taps, a full-attention layer every fourth, a
 * quarter of each head rotated in Qwen 3.5's three sections. */
typedef struct {
    int64_t state, k_heads, v_heads, kernel, interval, n_rot, mtp;
    int32_t sections[4];
    bool grouped;           /* Qwen3-Next: ssm_ba, no rope sections */
    bool fused_qkvz;        /* Qwen3-Next's older files: one ssm_in for q, k, v and z */
    int64_t n_expert, ff_exp, ff_shexp; /* the MoE variants' experts (0: a dense FFN) */
} synth_hybrid;

/* Qwen 3.5's DeltaNet and gated attention layers (synth_hybrid_*) instead of Llama's */
static bool synth_is_hybrid(const synth_arch *a) {
    return !strcmp(a->arch, "qwen35") || !strcmp(a->arch, "qwen35moe") || !strcmp(a->arch, "qwen3next");
}

static synth_hybrid synth_hybrid_sizes(const synth_preset *hp, int64_t head_dim, long mtp) {
    synth_hybrid h = {head_dim / 2 > 2 ? head_dim / 2 : 2, hp->n_head_kv, hp->n_head, 4, 4, head_dim / 4 / 2 * 2, mtp,
                      {0, 0, 0, 0}, false, false, 0, 0, 0};
    if (h.n_rot < 2) h.n_rot = 2;
    const int32_t pairs = (int32_t)(h.n_rot / 2);
    h.sections[0] = (pairs + 2) / 3;
    h.sections[1] = (pairs + 1) / 3;
    h.sections[2] = pairs / 3;
    return h;
}

static bool synth_hybrid_keys(quill_gguf_writer *w, const char *arch, const synth_hybrid *h) {
    char key[128];
#define HKEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    bool bad = quill_gguf_writer_add_u32(w, HKEY("ssm.conv_kernel"), (uint32_t)h->kernel) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, HKEY("ssm.state_size"), (uint32_t)h->state) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, HKEY("ssm.group_count"), (uint32_t)h->k_heads) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, HKEY("ssm.time_step_rank"), (uint32_t)h->v_heads) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, HKEY("ssm.inner_size"), (uint32_t)(h->state * h->v_heads)) != QUILL_OK;
    bad |= quill_gguf_writer_add_u32(w, HKEY("full_attention_interval"), (uint32_t)h->interval) != QUILL_OK;
    if (!h->grouped)
        bad |= quill_gguf_writer_add_arr(w, HKEY("rope.dimension_sections"), QUILL_GGUF_INT32, h->sections, 4) !=
               QUILL_OK;
    if (h->mtp) bad |= quill_gguf_writer_add_u32(w, HKEY("nextn_predict_layers"), (uint32_t)h->mtp) != QUILL_OK;
#undef HKEY
    return !bad;
}

/* One Qwen 3.5 block's tensors: a DeltaNet layer, or a gated full-attention one (MTP blocks are
 * the latter with their nextn.* projection and norms). */
static void synth_hybrid_block(synth_tensor *ts, int *nt, uint32_t wtype, const synth_preset *hp, int64_t head_dim,
                               const synth_hybrid *h, int l, bool recurrent, bool mtp) {
    const float root3 = 1.7320508f, norm_spread = 0.01f * root3;
    const int64_t d = hp->n_embd, q_dim = hp->n_head * head_dim, kv_dim = hp->n_head_kv * head_dim;
    const int64_t key_dim = h->state * h->k_heads, value_dim = h->state * h->v_heads;
#define SPREAD(fan_in) (root3 / sqrtf((float)(fan_in)))
    synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.attn_norm.weight", l);
    synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.post_attention_norm.weight", l);
    if (recurrent) {
        if (h->fused_qkvz) {
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, 2 * key_dim + 2 * value_dim, "blk.%d.ssm_in.weight", l);
        } else {
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, 2 * key_dim + value_dim, "blk.%d.attn_qkv.weight", l);
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, value_dim, "blk.%d.attn_gate.weight", l);
        }
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(h->kernel), h->kernel, 2 * key_dim + value_dim,
                  "blk.%d.ssm_conv1d.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 1.0f, h->v_heads, 0, "blk.%d.ssm_dt.bias", l);
        /* A = -exp(A_log): negative decay rates */
        synth_add(ts, nt, QUILL_TYPE_F32, -1.0f, 0.5f, h->v_heads, 0, "blk.%d.ssm_a", l);
        if (h->grouped) {
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, 2 * h->v_heads, "blk.%d.ssm_ba.weight", l);
        } else {
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, h->v_heads, "blk.%d.ssm_beta.weight", l);
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, h->v_heads, "blk.%d.ssm_alpha.weight", l);
        }
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, h->state, 0, "blk.%d.ssm_norm.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(value_dim), value_dim, d, "blk.%d.ssm_out.weight", l);
    } else {
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, 2 * q_dim, "blk.%d.attn_q.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_k.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_v.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, head_dim, 0, "blk.%d.attn_q_norm.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, head_dim, 0, "blk.%d.attn_k_norm.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(q_dim), q_dim, d, "blk.%d.attn_output.weight", l);
    }
    if (h->n_expert) {
        /* the router (f32, as published), the experts [E][rows][cols], the shared expert and its gate */
        const int64_t E = h->n_expert, ff = h->ff_exp, sh = h->ff_shexp;
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(d), d, E, "blk.%d.ffn_gate_inp.weight", l);
        synth_add_ffn(ts, nt, wtype, d, ff, E, "_exps", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(d), d, 0, "blk.%d.ffn_gate_inp_shexp.weight", l);
        synth_add_ffn(ts, nt, wtype, d, sh, 0, "_shexp", l);
    } else {
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, hp->n_ff, "blk.%d.ffn_gate.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, hp->n_ff, "blk.%d.ffn_up.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(hp->n_ff), hp->n_ff, d, "blk.%d.ffn_down.weight", l);
    }
    if (mtp) {
        synth_add(ts, nt, wtype, 0.0f, SPREAD(2 * d), 2 * d, d, "blk.%d.nextn.eh_proj.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.nextn.enorm.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.nextn.hnorm.weight", l);
    }
#undef SPREAD
}

/* One layer (or MTP block) of these families, in the converter's order. */
static void synth_router_layer(synth_tensor *ts, int *nt, uint32_t wtype, const synth_arch *arch, const synth_preset *hp,
                               const synth_router *r, int64_t head_dim, int64_t n_expert, int64_t ff_exp, int l,
                               bool mtp) {
    const int64_t d = hp->n_embd, H = hp->n_head, qk = r->nope + r->rope;
    const int64_t q_dim = H * head_dim, kv_dim = hp->n_head_kv * head_dim;
    const float root3 = 1.7320508f, norm_spread = 0.01f * root3;
#define SPREAD(fan_in) (root3 / sqrtf((float)(fan_in)))
    const bool ds = !strcmp(arch->arch, "deepseek2");
    synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.attn_norm.weight", l);
    if (ds) {
        if (r->q_lora) {
            synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, r->q_lora, 0, "blk.%d.attn_q_a_norm.weight", l);
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, r->q_lora, "blk.%d.attn_q_a.weight", l);
            synth_add(ts, nt, wtype, 0.0f, SPREAD(r->q_lora), r->q_lora, H * qk, "blk.%d.attn_q_b.weight", l);
        } else {
            synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, H * qk, "blk.%d.attn_q.weight", l);
        }
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, r->kv_lora, 0, "blk.%d.attn_kv_a_norm.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, r->kv_lora + r->rope, "blk.%d.attn_kv_a_mqa.weight", l);
        if (r->kv_b) {
            synth_add(ts, nt, wtype, 0.0f, SPREAD(r->kv_lora), r->kv_lora, H * (r->nope + r->v_head),
                      "blk.%d.attn_kv_b.weight", l);
        } else {
            synth_add_stack(ts, nt, H, wtype, 0.0f, SPREAD(r->kv_lora), r->nope, r->kv_lora, "blk.%d.attn_k_b.weight", l);
            synth_add_stack(ts, nt, H, wtype, 0.0f, SPREAD(r->kv_lora), r->kv_lora, r->v_head, "blk.%d.attn_v_b.weight", l);
        }
        synth_add(ts, nt, wtype, 0.0f, SPREAD(H * r->v_head), H * r->v_head, d, "blk.%d.attn_output.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.ffn_norm.weight", l);
    } else {
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, q_dim, "blk.%d.attn_q.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_k.weight", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(d), d, kv_dim, "blk.%d.attn_v.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 0.1f, q_dim, 0, "blk.%d.attn_q.bias", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 0.1f, kv_dim, 0, "blk.%d.attn_k.bias", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 0.1f, kv_dim, 0, "blk.%d.attn_v.bias", l);
        synth_add(ts, nt, wtype, 0.0f, SPREAD(q_dim), q_dim, d, "blk.%d.attn_output.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.post_attention_norm.weight", l);
    }
    if (l < r->dense_lead && !mtp) {
        synth_add_ffn(ts, nt, wtype, d, hp->n_ff, 0, "", l);
    } else {
        /* the router and its selection bias stay f32, as in published files */
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, SPREAD(d), d, n_expert, "blk.%d.ffn_gate_inp.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 0.0f, 0.05f, n_expert, 0, "blk.%d.exp_probs_b.bias", l);
        synth_add_ffn(ts, nt, wtype, d, ff_exp, n_expert, "_exps", l);
        synth_add_ffn(ts, nt, wtype, d, ff_exp, 0, "_shexp", l);
    }
    if (mtp) {
        synth_add(ts, nt, wtype, 0.0f, SPREAD(2 * d), 2 * d, d, "blk.%d.nextn.eh_proj.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.nextn.enorm.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.nextn.hnorm.weight", l);
        synth_add(ts, nt, QUILL_TYPE_F32, 1.0f, norm_spread, d, 0, "blk.%d.nextn.shared_head_norm.weight", l);
    }
#undef SPREAD
}

static int synth_usage(FILE *f) {
    fprintf(f,
            "usage: quill synth [--arch NAME] (--like tinyllama-1.1b | --embd N --layers N --heads N --kv-heads N --ff N)\n"
            "                   --vocab VOCAB.gguf [--head-dim N] [--window N] [--swa-pattern N] [--rope-base-swa B]\n"
            "                   [--softcap ATTN,FINAL] [--experts N --experts-used K [--expert-ff N]] [--mtp N]\n"
            "                   [--ssm-in] [--ssm-heads K,V] [--shared-kv N] [--per-layer-input N] [--seed S]\n"
            "                   [--type f16|f32|bf16] [--ctx N] [--name NAME] -o OUT.gguf\n"
            "  Writes a model GGUF with random weights (deterministic for a seed) and the tokenizer of\n"
            "  VOCAB.gguf (every tokenizer.* key, chat template included). --arch: llama (default),\n"
            "  llama3 (rope_freqs, base 500000, tied), mistral (head size 3/4 of n_embd/n_head), qwen2,\n"
            "  qwen3, gemma2, gemma3, phi3, qwen3moe (128 experts, 8 used, expert_feed_forward_length\n"
            "  --expert-ff, by default --ff / used), llama-moe (Mixtral: 8 experts, 2 used, --ff wide),\n"
            "  qwen2moe (60 experts, 4 used, --expert-ff wide, a shared expert --ff wide),\n"
            "  gpt-oss (32 experts, 4 used, --expert-ff wide, biases, attention sinks, window 128 on\n"
            "  every other layer, YaRN), qwen35 (Gated DeltaNet layers, every fourth a gated attention\n"
            "  layer; --mtp N adds N MTP blocks), qwen35moe (its experts: 256, 8 used, and a shared one)\n"
            "  and qwen3next (512 experts, 10 used, a shared one; ssm_ba, plain RoPE; --ssm-in: the older\n"
            "  files' fused ssm_in instead of attn_qkv and attn_gate; --ssm-heads K,V: DeltaNet key and\n"
            "  value heads, by default --kv-heads and --heads), smollm3 (every\n"
            "  fourth layer unrotated), olmo2 (no input norms, q/k norms over the projections, post\n"
            "  norms; --window: OLMo 3's sliding layers), granite (multipliers), glm4 (biases, partial RoPE,\n"
            "  fused gate+up, post norms), exaone4 (no input norms, post norms; with 64 layers sliding\n"
            "  layers and unrotated global ones), seed_oss (biases, head size 2 n_embd/n_head), cohere2\n"
            "  (LayerNorms, a parallel block, logit_scale; --window needed), mistral3 (YaRN, attention\n"
            "  temperature), gemma4 (sliding layers, global ones every --swa-pattern-th (5) with heads twice as\n"
            "  large, half the KV heads and V = K; --shared-kv N: the last N layers read earlier caches and\n"
            "  have FFNs twice as wide; --per-layer-input N (16): per-layer inputs; proportional RoPE),\n"
            "  deepseek2 (latent attention, --mla Q_LORA,KV_LORA,NOPE,ROPE,V, by default from the head size;\n"
            "  --kv-b: the older attn_kv_b; --yarn: V3's YaRN; 256 experts, 8 used, --groups G,U (8,4), a\n"
            "  sigmoid router with a selection bias, a shared expert, --dense-lead N (1) dense layers, --mtp N),\n"
            "  glm4moe (biases, half the head rotated, 128 experts, 8 used, sigmoid router, shared expert,\n"
            "  --dense-lead, --mtp), nemotron_h (Mamba-2 mixers of 2 --embd in --heads heads, 2 groups, state 16,\n"
            "  attention without RoPE and relu² FFNs, one kind per layer in the pattern M-M*-), nemotron_h_moe\n"
            "  (those layers, the FFN ones 128 experts, 6 used, of relu(up)², a sigmoid router with a selection\n"
            "  bias, a shared expert --ff wide), granitehybrid\n"
            "  (Granite 4.0-H: those mixers and attention, M*M repeated, each layer with its FFN, Granite's\n"
            "  multipliers; --experts N --experts-used K: experts as wide as --ff and a shared expert),\n"
            "  lfm2 (gated short convolutions, every third layer attention with q/k norms),\n"
            "  lfm2moe (those layers, 32 experts, 4 used, a sigmoid router, --dense-lead N (2) dense layers),\n"
            "  each with the hyperparameter keys its published files carry.\n"
            "  Matrices are uniform with the standard deviation 1/sqrt(fan_in) (token embeddings 0.02),\n"
            "  norms 1 +- 0.01, biases +- 0.1. --head-dim sets attention.key_length, --window the sliding\n"
            "  window, --swa-pattern its attention.sliding_window_pattern, --rope-base-swa the sliding layers'\n"
            "  rope.freq_base_swa, --softcap gemma2's soft-capping values (50,30). Explicit sizes override\n"
            "  those of --like.\n");
    return f == stdout ? 0 : 1;
}

int cmd_synth(int argc, char **argv) {
    synth_preset hp = {NULL, 0, 0, 0, 0, 0, 0};
    const synth_arch *arch = &arches[0];
    const char *vocab_path = NULL, *out_path = NULL, *name = NULL;
    long seed = 0, head_dim_opt = 0, window_opt = -1, swa_pattern = -1, mtp = 0, ssm_in = 0, experts_opt = 0, used_opt = 0, expert_ff = 0;
    long shared_kv = -1, per_layer = 16, ssm_k_heads = 0, ssm_v_heads = 0;
    long mla_opt[5] = {-1, 0, 0, 0, 0}, groups_opt[2] = {-1, 0}, dense_lead = 1, kv_b = 0, yarn = 0;
    bool dense_lead_set = false;
    double swa_base = 0;
    double attn_cap = 50, final_cap = 30;
    uint32_t wtype = QUILL_TYPE_F16;
    struct { const char *flag; int64_t *dst; long max; } dims[] = {
        {"--embd", &hp.n_embd, 1 << 16}, {"--layers", &hp.n_layer, 1024}, {"--heads", &hp.n_head, 1024},
        {"--kv-heads", &hp.n_head_kv, 1024}, {"--ff", &hp.n_ff, 1 << 18}, {"--ctx", &hp.n_ctx, 1 << 24},
    };
    int64_t explicit_dims[6] = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return synth_usage(stdout);
        bool matched = false;
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            if (strcmp(a, dims[d].flag)) continue;
            long v;
            if (++i >= argc || !cli_parse_long(argv[i], 1, dims[d].max, &v))
                return cli_fail("synth: %s needs a number from 1 to %ld", a, dims[d].max);
            explicit_dims[d] = v;
            matched = true;
        }
        if (matched) continue;
        if (!strcmp(a, "--like")) {
            if (++i >= argc) return cli_fail("synth: --like needs a model name (tinyllama-1.1b)");
            const synth_preset *p = NULL;
            for (size_t k = 0; k < sizeof presets / sizeof presets[0]; k++)
                if (!strcmp(argv[i], presets[k].name)) p = &presets[k];
            if (!p) return cli_fail("synth: unknown --like '%s' (known: tinyllama-1.1b)", argv[i]);
            hp = *p;
        } else if (!strcmp(a, "--arch")) {
            if (++i >= argc) return cli_fail("synth: --arch needs a name");
            arch = NULL;
            for (size_t k = 0; k < sizeof arches / sizeof arches[0]; k++)
                if (!strcmp(argv[i], arches[k].name)) arch = &arches[k];
            if (!arch)
                return cli_fail("synth: unknown --arch '%s' (known: llama, llama3, mistral, qwen2, qwen3, gemma2, "
                                "gemma3, phi3, qwen3moe, qwen2moe, llama-moe, gpt-oss, qwen35, qwen35moe, qwen3next, "
                                "smollm3, olmo2, granite, glm4, exaone4, seed_oss, cohere2, mistral3, gemma4, deepseek2, glm4moe, nemotron_h, nemotron_h_moe, granitehybrid, lfm2, lfm2moe)",
                                argv[i]);
        } else if (!strcmp(a, "--head-dim")) {
            if (++i >= argc || !cli_parse_long(argv[i], 2, 4096, &head_dim_opt) || head_dim_opt % 2)
                return cli_fail("synth: --head-dim needs an even number from 2 to 4096");
        } else if (!strcmp(a, "--window")) {
            if (++i >= argc || !cli_parse_long(argv[i], 1, 1L << 30, &window_opt))
                return cli_fail("synth: --window needs a number of positions from 1 to %ld", 1L << 30);
        } else if (!strcmp(a, "--experts")) {
            if (++i >= argc || !cli_parse_long(argv[i], 1, 512, &experts_opt))
                return cli_fail("synth: --experts needs a number of experts from 1 to 512");
        } else if (!strcmp(a, "--experts-used")) {
            if (++i >= argc || !cli_parse_long(argv[i], 1, 512, &used_opt))
                return cli_fail("synth: --experts-used needs a number of experts from 1 to 512");
        } else if (!strcmp(a, "--expert-ff")) {
            if (++i >= argc || !cli_parse_long(argv[i], 1, 1 << 18, &expert_ff))
                return cli_fail("synth: --expert-ff needs a width from 1 to %d", 1 << 18);
        } else if (!strcmp(a, "--swa-pattern")) {
            if (++i >= argc || !cli_parse_long(argv[i], 0, 1 << 20, &swa_pattern))
                return cli_fail("synth: --swa-pattern needs a number of layers from 0 to %d", 1 << 20);
        } else if (!strcmp(a, "--rope-base-swa")) {
            if (++i >= argc || !cli_parse_double(argv[i], 1, 1e12, &swa_base))
                return cli_fail("synth: --rope-base-swa needs a RoPE base from 1 to 1e12");
        } else if (!strcmp(a, "--softcap")) {
            char *comma = ++i < argc ? strchr(argv[i], ',') : NULL;
            if (comma) *comma = 0;
            bool ok = comma && cli_parse_double(argv[i], 0.01, 1e6, &attn_cap) &&
                      cli_parse_double(comma + 1, 0.01, 1e6, &final_cap);
            if (comma) *comma = ',';
            if (!ok) return cli_fail("synth: --softcap needs ATTN,FINAL (two numbers from 0.01 to 1e6)");
        } else if (!strcmp(a, "--shared-kv")) {
            if (++i >= argc || !cli_parse_long(argv[i], 0, 1024, &shared_kv))
                return cli_fail("synth: --shared-kv needs a number of layers from 0 to 1024 (gemma4)");
        } else if (!strcmp(a, "--per-layer-input")) {
            if (++i >= argc || !cli_parse_long(argv[i], 0, 4096, &per_layer))
                return cli_fail("synth: --per-layer-input needs a width from 0 to 4096 (gemma4)");
        } else if (!strcmp(a, "--ssm-in")) {
            ssm_in = 1;
        } else if (!strcmp(a, "--ssm-heads")) {
            char *comma = ++i < argc ? strchr(argv[i], ',') : NULL;
            if (comma) *comma = 0;
            bool ok = comma && cli_parse_long(argv[i], 1, 1024, &ssm_k_heads) &&
                      cli_parse_long(comma + 1, 1, 1024, &ssm_v_heads) && ssm_v_heads % ssm_k_heads == 0;
            if (comma) *comma = ',';
            if (!ok)
                return cli_fail("synth: --ssm-heads needs KEY,VALUE DeltaNet head counts from 1 to 1024, the value "
                                "heads a multiple of the key heads");
        } else if (!strcmp(a, "--mla")) {
            if (++i >= argc || sscanf(argv[i], "%ld,%ld,%ld,%ld,%ld", &mla_opt[0], &mla_opt[1], &mla_opt[2], &mla_opt[3],
                                      &mla_opt[4]) != 5 ||
                mla_opt[0] < 0 || mla_opt[1] < 1 || mla_opt[2] < 1 || mla_opt[3] < 2 || mla_opt[3] % 2 || mla_opt[4] < 1 ||
                mla_opt[0] > 65536 || mla_opt[1] > 65536 || mla_opt[2] > 4096 || mla_opt[3] > 4096 || mla_opt[4] > 4096)
                return cli_fail("synth: --mla needs Q_LORA,KV_LORA,NOPE,ROPE,V (q_lora 0: attn_q; ROPE even)");
        } else if (!strcmp(a, "--groups")) {
            if (++i >= argc || sscanf(argv[i], "%ld,%ld", &groups_opt[0], &groups_opt[1]) != 2 || groups_opt[0] < 0 ||
                groups_opt[1] < 0 || groups_opt[1] > groups_opt[0] || groups_opt[0] > 512)
                return cli_fail("synth: --groups needs GROUPS,USED (0,0: none)");
        } else if (!strcmp(a, "--dense-lead")) {
            if (++i >= argc || !cli_parse_long(argv[i], 0, 1024, &dense_lead))
                return cli_fail("synth: --dense-lead needs a number of layers from 0 to 1024");
            dense_lead_set = true;
        } else if (!strcmp(a, "--kv-b")) {
            kv_b = 1;
        } else if (!strcmp(a, "--yarn")) {
            yarn = 1;
        } else if (!strcmp(a, "--mtp")) {
            if (++i >= argc || !cli_parse_long(argv[i], 0, 16, &mtp))
                return cli_fail("synth: --mtp needs a number of MTP blocks from 0 to 16 (qwen35)");
        } else if (!strcmp(a, "--vocab")) {
            if (++i >= argc) return cli_fail("synth: --vocab needs a GGUF file with tokenizer metadata");
            vocab_path = argv[i];
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (++i >= argc) return cli_fail("synth: %s needs a file name", a);
            out_path = argv[i];
        } else if (!strcmp(a, "--seed")) {
            if (++i >= argc || !cli_parse_long(argv[i], 0, 0x7FFFFFFFL, &seed))
                return cli_fail("synth: --seed needs a number from 0 to 2147483647");
        } else if (!strcmp(a, "--name")) {
            if (++i >= argc) return cli_fail("synth: --name needs a value");
            name = argv[i];
        } else if (!strcmp(a, "--type")) {
            if (++i >= argc) return cli_fail("synth: --type needs f16, f32 or bf16");
            if (!strcmp(argv[i], "f16")) wtype = QUILL_TYPE_F16;
            else if (!strcmp(argv[i], "f32")) wtype = QUILL_TYPE_F32;
            else if (!strcmp(argv[i], "bf16")) wtype = QUILL_TYPE_BF16;
            else return cli_fail("synth: --type must be f16, f32 or bf16, not '%s'", argv[i]);
        } else {
            return cli_fail("synth: unknown argument '%s' (see quill synth --help)", a);
        }
    }
    for (size_t d = 0; d < 6; d++)
        if (explicit_dims[d]) *dims[d].dst = explicit_dims[d];
    if (!hp.n_embd || !hp.n_layer || !hp.n_head || !hp.n_ff)
        return cli_fail("synth: give --like tinyllama-1.1b or all of --embd --layers --heads --ff (and --kv-heads)");
    if (!hp.n_head_kv) hp.n_head_kv = hp.n_head;
    if (!hp.n_ctx) hp.n_ctx = arch->ctx;
    if (!vocab_path) return cli_fail("synth: --vocab VOCAB.gguf is required (the tokenizer to copy)");
    if (!out_path) return cli_fail("synth: -o OUT.gguf is required");
    if (hp.n_embd % hp.n_head != 0)
        return cli_fail("synth: --embd %" PRId64 " is not a multiple of --heads %" PRId64, hp.n_embd, hp.n_head);
    if (hp.n_head % hp.n_head_kv != 0)
        return cli_fail("synth: --heads %" PRId64 " is not a multiple of --kv-heads %" PRId64, hp.n_head, hp.n_head_kv);
    int64_t head_dim = hp.n_embd / hp.n_head;
    if (arch->head_dim_num) head_dim = head_dim * arch->head_dim_num / arch->head_dim_den / 2 * 2;
    if (head_dim_opt) head_dim = head_dim_opt;
    if (head_dim < 2 || head_dim % 2 != 0)
        return cli_fail("synth: the head dimension %" PRId64 " must be even (RoPE)", head_dim);
    const bool write_head_dim = arch->head_dim_num || head_dim_opt;
    const int64_t window = window_opt > 0 ? window_opt : arch->window;
    const bool is_hybrid = synth_is_hybrid(arch), is_mamba = synth_is_mamba(arch);
    const synth_mamba mamba = {2 * hp.n_embd, hp.n_head, 2, 16, 4};
    if (is_mamba && (mamba.inner % (mamba.heads * mamba.groups) || mamba.heads % mamba.groups))
        return cli_fail("synth: --heads %" PRId64 " must be even and divide 2 x --embd (the Mamba-2 heads and groups)",
                        hp.n_head);
    synth_hybrid hybrid = synth_hybrid_sizes(&hp, head_dim, is_hybrid ? mtp : 0);
    const int64_t n_expert = experts_opt ? experts_opt : arch->experts;
    const int64_t n_used = used_opt ? used_opt : arch->experts_used;
    if (synth_is_granite_hybrid(arch) && (expert_ff || !experts_opt != !used_opt))
        return cli_fail("synth: granitehybrid's experts are --ff wide: give --experts and --experts-used");
    if ((experts_opt || used_opt || expert_ff) && !arch->experts && !synth_is_granite_hybrid(arch))
        return cli_fail("synth: --experts, --experts-used and --expert-ff are for qwen3moe, qwen2moe, llama-moe, gpt-oss, "
                        "qwen35moe and qwen3next");
    if (n_used > n_expert)
        return cli_fail("synth: --experts-used %" PRId64 " is more than --experts %" PRId64, n_used, n_expert);
    /* the experts' width: qwen3moe's own key, feed_forward_length / used by default */
    const int64_t ff_exp = !n_expert                                ? 0
                           : expert_ff                              ? expert_ff
                           : !arch->expert_ff_key || arch->gpt_oss ? hp.n_ff
                                                                    : hp.n_ff / n_used;
    if (n_expert && ff_exp < 1) return cli_fail("synth: --ff is narrower than the experts used");
    hybrid.grouped = !strcmp(arch->arch, "qwen3next");
    if (ssm_k_heads && !is_hybrid) return cli_fail("synth: --ssm-heads is for qwen35, qwen35moe and qwen3next");
    if (ssm_k_heads) {
        hybrid.k_heads = ssm_k_heads;
        hybrid.v_heads = ssm_v_heads;
    }
    if (ssm_in && !hybrid.grouped) return cli_fail("synth: --ssm-in (the older fused q/k/v/z matrix) is for qwen3next");
    hybrid.fused_qkvz = ssm_in;
    hybrid.n_expert = n_expert;
    hybrid.ff_exp = ff_exp;
    hybrid.ff_shexp = hp.n_ff;
    const bool router_family = synth_router_family(arch), ds = !strcmp(arch->arch, "deepseek2");
    if (!router_family && (mla_opt[0] >= 0 || groups_opt[0] >= 0 || kv_b || yarn))
        return cli_fail("synth: --mla, --groups, --kv-b and --yarn are for deepseek2 (--groups also glm4moe)");
    if (!ds && (mla_opt[0] >= 0 || kv_b || yarn)) return cli_fail("synth: --mla, --kv-b and --yarn are for deepseek2");
    synth_router router = {0};
    if (router_family) {
        router.q_lora = mla_opt[0] >= 0 ? mla_opt[0] : 6 * head_dim;
        router.kv_lora = mla_opt[0] >= 0 ? mla_opt[1] : 4 * head_dim;
        router.nope = mla_opt[0] >= 0 ? mla_opt[2] : 2 * head_dim;
        router.rope = mla_opt[0] >= 0 ? mla_opt[3] : head_dim;
        router.v_head = mla_opt[0] >= 0 ? mla_opt[4] : 2 * head_dim;
        /* DeepSeek V3's 8 groups, 4 kept, where the experts allow it */
        router.groups = groups_opt[0] >= 0 ? groups_opt[0] : ds && n_expert % 8 == 0 && n_expert >= 16 ? 8 : 0;
        router.groups_used = groups_opt[0] >= 0 ? groups_opt[1] : router.groups ? 4 : 0;
        if (router.groups && (n_expert % router.groups || n_expert / router.groups < 2 || !router.groups_used ||
                              n_used > router.groups_used * (n_expert / router.groups)))
            return cli_fail("synth: --groups %" PRId64 ",%" PRId64 " does not fit %" PRId64 " experts, %" PRId64 " used",
                            router.groups, router.groups_used, n_expert, n_used);
        router.dense_lead = dense_lead < hp.n_layer ? dense_lead : hp.n_layer;
        router.mtp = mtp;
        router.kv_b = kv_b;
        router.yarn = yarn;
    }
    const bool lfm2 = synth_is_lfm2(arch);
    if (lfm2) {
        if (head_dim * hp.n_head != hp.n_embd) return cli_fail("synth: lfm2's heads span --embd (no --head-dim)");
        if (hp.n_layer > 1024) return cli_fail("synth: lfm2 takes at most 1024 layers");
        router.dense_lead = dense_lead_set ? (dense_lead < hp.n_layer ? dense_lead : hp.n_layer) : 2;
    }
    if (expert_ff && !arch->expert_ff_key) return cli_fail("synth: llama-moe's experts are --ff wide");
    if (same_file(vocab_path, out_path)) return cli_fail("synth: the output %s is the vocabulary file", out_path);
    const bool g4 = !strcmp(arch->arch, "gemma4");
    if (!g4 && shared_kv >= 0) return cli_fail("synth: --shared-kv is for gemma4");
    /* Gemma 4: its sliding heads are --head-dim (or n_embd / n_head), the global ones twice that */
    const synth_gemma4 gemma4 = {swa_pattern > 0 ? swa_pattern : 5, shared_kv > 0 ? shared_kv : 0, head_dim, 2 * head_dim,
                                 hp.n_head_kv, hp.n_head_kv / 2 > 0 ? hp.n_head_kv / 2 : 1, per_layer};

    quill_error err;
    quill_gguf *vocab;
    if (quill_gguf_open(vocab_path, &vocab, &err) != QUILL_OK) return cli_fail("%s", err.message);
    quill_gguf_value tokens;
    if (quill_gguf_get_arr(vocab, "tokenizer.ggml.tokens", &tokens, &err) != QUILL_OK || tokens.count == 0 ||
        tokens.count > (1u << 24)) {
        quill_gguf_close(vocab);
        return cli_fail("synth: %s has no tokenizer.ggml.tokens array: not a vocabulary", vocab_path);
    }
    const int64_t n_vocab = (int64_t)tokens.count;

    /* metadata, in the order a converted model has it */
    char default_name[128];
    snprintf(default_name, sizeof default_name, "synth-%s%s%s", arch->name, hp.name ? "-" : "", hp.name ? hp.name : "");
    if (!name) name = default_name;
    const uint32_t file_type = wtype == QUILL_TYPE_F32 ? 0 : wtype == QUILL_TYPE_F16 ? 1 : 32;
    quill_gguf_writer *w = quill_gguf_writer_new();
    int bad = !w;
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch->arch, suffix), key)
    if (w) {
        bad |= quill_gguf_writer_add_str(w, "general.architecture", arch->arch, strlen(arch->arch)) != QUILL_OK;
        bad |= quill_gguf_writer_add_str(w, "general.name", name, strlen(name)) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "general.file_type", file_type) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)hp.n_ctx) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)hp.n_embd) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)(hp.n_layer + hybrid.mtp + router.mtp)) != QUILL_OK;
        if (g4) bad |= !synth_gemma4_keys(w, arch->arch, &hp, &gemma4);
        if (is_mamba) bad |= !synth_mamba_keys(w, arch, &hp, &mamba);
        if (!strcmp(arch->arch, "nemotron_h_moe")) {
            bad |= quill_gguf_writer_add_u32(w, KEY("expert_shared_count"), 1) != QUILL_OK;
            bad |= quill_gguf_writer_add_bool(w, KEY("expert_weights_norm"), true) != QUILL_OK;
            bad |= quill_gguf_writer_add_f32(w, KEY("expert_weights_scale"), 2.5f) != QUILL_OK;
            bad |= quill_gguf_writer_add_u32(w, KEY("expert_gating_func"), 2) != QUILL_OK;
        }
        if (!g4 && !is_mamba) bad |= quill_gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)hp.n_ff) != QUILL_OK;
        if (!g4)
            bad |= quill_gguf_writer_add_u32(w, KEY("rope.dimension_count"),
                                             (uint32_t)(is_hybrid ? hybrid.n_rot
                                                        : synth_is_glm4(arch) || !strcmp(arch->arch, "glm4moe") ? head_dim / 2
                                                        : ds ? router.rope
                                                             : head_dim)) != QUILL_OK;
        if (is_hybrid) bad |= !synth_hybrid_keys(w, arch->arch, &hybrid);
        bad |= quill_gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)hp.n_head) != QUILL_OK;
        if (lfm2) bad |= !synth_lfm2_keys(w, arch->arch, &hp, n_vocab, router.dense_lead, n_expert > 0);
        if (!g4 && !is_mamba && !lfm2) bad |= quill_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)(ds && !router.kv_b ? 1 : ds ? hp.n_head : hp.n_head_kv)) != QUILL_OK;
        if (router_family) bad |= !synth_router_keys(w, arch, &router, n_vocab);
        if (write_head_dim && !g4 && !ds) {
            bad |= quill_gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)head_dim) != QUILL_OK;
            bad |= quill_gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)head_dim) != QUILL_OK;
        }
        bad |= quill_gguf_writer_add_f32(w, KEY(synth_is_cohere2(arch) ? "attention.layer_norm_epsilon"
                                                                        : "attention.layer_norm_rms_epsilon"),
                                         (float)arch->eps) != QUILL_OK;
        if (synth_is_cohere2(arch)) bad |= quill_gguf_writer_add_f32(w, KEY("logit_scale"), 0.25f) != QUILL_OK;
        bad |= quill_gguf_writer_add_f32(w, KEY("rope.freq_base"), (float)arch->freq_base) != QUILL_OK;
        if (n_expert) {
            if (arch->shared_expert || synth_is_granite_hybrid(arch))
                bad |= quill_gguf_writer_add_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)hp.n_ff) !=
                       QUILL_OK;
            bad |= quill_gguf_writer_add_u32(w, KEY("expert_count"), (uint32_t)n_expert) != QUILL_OK;
            bad |= quill_gguf_writer_add_u32(w, KEY("expert_used_count"), (uint32_t)n_used) != QUILL_OK;
            if (arch->expert_ff_key)
                bad |= quill_gguf_writer_add_u32(w, KEY("expert_feed_forward_length"), (uint32_t)ff_exp) != QUILL_OK;
        }
        if (window) bad |= quill_gguf_writer_add_u32(w, KEY("attention.sliding_window"), (uint32_t)window) != QUILL_OK;
        if (swa_pattern >= 0 && !g4)
            bad |= quill_gguf_writer_add_u32(w, KEY("attention.sliding_window_pattern"), (uint32_t)swa_pattern) != QUILL_OK;
        if (swa_base > 0 || g4)
            bad |= quill_gguf_writer_add_f32(w, KEY("rope.freq_base_swa"), (float)(swa_base > 0 ? swa_base : 10000)) != QUILL_OK;
        if (arch->softcap) {
            bad |= quill_gguf_writer_add_f32(w, KEY("attn_logit_softcapping"), (float)attn_cap) != QUILL_OK;
            bad |= quill_gguf_writer_add_f32(w, KEY("final_logit_softcapping"), (float)final_cap) != QUILL_OK;
        }
        if (arch->linear_scaling) {
            bad |= quill_gguf_writer_add_str(w, KEY("rope.scaling.type"), "linear", 6) != QUILL_OK;
            bad |= quill_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), (float)arch->linear_scaling) != QUILL_OK;
        }
        if (arch->gpt_oss) {
            bad |= quill_gguf_writer_add_str(w, KEY("rope.scaling.type"), "yarn", 4) != QUILL_OK;
            bad |= quill_gguf_writer_add_f32(w, KEY("rope.scaling.factor"), 32.0f) != QUILL_OK;
            bad |= quill_gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), 4096) != QUILL_OK;
        }
        if (arch->rope_long_short) {
            /* Phi-3.5-mini's LongRoPE keys */
            bad |= quill_gguf_writer_add_u32(w, KEY("rope.scaling.original_context_length"), 4096) != QUILL_OK;
            bad |= quill_gguf_writer_add_f32(w, KEY("rope.scaling.attn_factor"), 1.1902381f) != QUILL_OK;
        }
        if (!strcmp(arch->arch, "llama"))
            bad |= quill_gguf_writer_add_u32(w, KEY("vocab_size"), (uint32_t)n_vocab) != QUILL_OK;
        if (!strcmp(arch->arch, "granite") || synth_is_granite_hybrid(arch)) bad |= !synth_granite_keys(w, arch->arch);
        if (!strcmp(arch->arch, "mistral3")) bad |= !synth_mistral3_keys(w, arch->arch);
        for (uint64_t i = 0; i < quill_gguf_n_kv(vocab) && !bad; i++) {
            const quill_gguf_kv *kv = quill_gguf_kv_at(vocab, i);
            if (!strncmp(kv->key, "tokenizer.", 10))
                bad |= quill_gguf_writer_add_value(w, kv->key, &kv->value) != QUILL_OK;
        }
    }
#undef KEY
    quill_gguf_close(vocab);
    if (bad) {
        quill_gguf_writer_free(w);
        return cli_fail("synth: cannot build the metadata (out of memory?)");
    }

    /* tensors, in the order of a converted model */
    const int64_t q_dim = hp.n_head * head_dim, kv_dim = hp.n_head_kv * head_dim, half = head_dim / 2;
    const int n_tensors = 6 + 24 * (int)(hp.n_layer + hybrid.mtp + router.mtp);
    synth_tensor *ts = calloc((size_t)n_tensors, sizeof *ts);
    float *factors = calloc((size_t)(2 * half), sizeof *factors);
    if (!ts || !factors) {
        free(ts);
        free(factors);
        quill_gguf_writer_free(w);
        return cli_fail("synth: out of memory");
    }
    int nt = 0;
    const float root3 = 1.7320508f; /* a uniform on [-a, a] has standard deviation a / sqrt(3) */
    const float norm_spread = 0.01f * root3;
#define SPREAD(fan_in) (root3 / sqrtf((float)(fan_in)))
    synth_add(ts, &nt, wtype, 0.0f, 0.02f * root3, hp.n_embd, n_vocab, "token_embd.weight", 0);
    if (arch->rope_freqs) {
        llama3_factors(factors, half, head_dim, arch->freq_base);
        synth_add(ts, &nt, QUILL_TYPE_F32, 0, 0, half, 0, "rope_freqs.weight", 0);
        ts[nt - 1].fixed = factors;
    }
    if (arch->rope_long_short) {
        /* LongRoPE-like: short factors near 1, long ones growing to ~20 in the low frequencies */
        for (int64_t i = 0; i < half; i++) {
            const float x = (float)i / (float)half;
            factors[i] = 1.0f + 19.0f * x * x;
            factors[half + i] = 1.0f + 0.1f * x;
        }
        synth_add(ts, &nt, QUILL_TYPE_F32, 0, 0, half, 0, "rope_factors_long.weight", 0);
        ts[nt - 1].fixed = factors;
        synth_add(ts, &nt, QUILL_TYPE_F32, 0, 0, half, 0, "rope_factors_short.weight", 0);
        ts[nt - 1].fixed = factors + half;
    }
    synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, hp.n_embd, 0, lfm2 ? "token_embd_norm.weight" : "output_norm.weight", 0);
    if (!arch->tied) synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, n_vocab, "output.weight", 0);
    for (int l = 0; is_hybrid && l < (int)(hp.n_layer + hybrid.mtp); l++)
        synth_hybrid_block(ts, &nt, wtype, &hp, head_dim, &hybrid, l, l < hp.n_layer && (l + 1) % hybrid.interval != 0,
                           l >= hp.n_layer);
    if (g4) synth_gemma4_tensors(ts, &nt, wtype, &hp, &gemma4, n_vocab, factors);
    for (int l = 0; router_family && l < (int)(hp.n_layer + router.mtp); l++)
        synth_router_layer(ts, &nt, wtype, arch, &hp, &router, head_dim, n_expert, ff_exp, l, l >= hp.n_layer);
    for (int l = 0; is_mamba && l < (int)hp.n_layer; l++)
        synth_mamba_layer(ts, &nt, wtype, arch, &hp, head_dim, &mamba, n_expert, ff_exp, l);
    for (int l = 0; lfm2 && l < (int)hp.n_layer; l++)
        synth_lfm2_layer(ts, &nt, wtype, &hp, head_dim, n_expert, ff_exp, router.dense_lead, l);
    for (int l = 0; !is_hybrid && !g4 && !router_family && !is_mamba && !lfm2 && l < (int)hp.n_layer; l++) {
        if (!synth_no_input_norms(arch))
            synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, hp.n_embd, 0, "blk.%d.attn_norm.weight", l);
        if (arch->fused) {
            synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, q_dim + 2 * kv_dim, "blk.%d.attn_qkv.weight", l);
        } else {
            synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, q_dim, "blk.%d.attn_q.weight", l);
            synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, kv_dim, "blk.%d.attn_k.weight", l);
            synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, kv_dim, "blk.%d.attn_v.weight", l);
        }
        if (arch->qkv_bias) {
            synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 0.1f, q_dim, 0, "blk.%d.attn_q.bias", l);
            synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 0.1f, kv_dim, 0, "blk.%d.attn_k.bias", l);
            synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 0.1f, kv_dim, 0, "blk.%d.attn_v.bias", l);
        }
        if (synth_is_olmo2(arch)) {
            synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, q_dim, 0, "blk.%d.attn_q_norm.weight", l);
            synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, kv_dim, 0, "blk.%d.attn_k_norm.weight", l);
        }
        if (arch->qk_norm) {
            synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, head_dim, 0, "blk.%d.attn_q_norm.weight", l);
            synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, head_dim, 0, "blk.%d.attn_k_norm.weight", l);
        }
        synth_add(ts, &nt, wtype, 0.0f, SPREAD(q_dim), q_dim, hp.n_embd, "blk.%d.attn_output.weight", l);
        if (arch->gpt_oss) {
            synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 0.1f, hp.n_embd, 0, "blk.%d.attn_output.bias", l);
            synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 1.0f, hp.n_head, 0, "blk.%d.attn_sinks.weight", l);
        }
        if (arch->post_norms || arch->gpt_oss || synth_is_seed_oss(arch))
            synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, hp.n_embd, 0, "blk.%d.post_attention_norm.weight", l);
        if (!arch->gpt_oss && !synth_no_input_norms(arch) && !synth_is_seed_oss(arch) && !synth_is_cohere2(arch))
            synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, hp.n_embd, 0, "blk.%d.ffn_norm.weight", l);
        if (n_expert) {
            /* the router stays f32 in published files (the reference's quantizer leaves it) */
            synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, SPREAD(hp.n_embd), hp.n_embd, n_expert, "blk.%d.ffn_gate_inp.weight", l);
            synth_add_ffn(ts, &nt, wtype, hp.n_embd, ff_exp, n_expert, "_exps", l);
            if (arch->shared_expert) {
                synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, SPREAD(hp.n_embd), hp.n_embd, 0, "blk.%d.ffn_gate_inp_shexp.weight", l);
                synth_add_ffn(ts, &nt, wtype, hp.n_embd, hp.n_ff, 0, "_shexp", l);
            }
            if (arch->gpt_oss) {
                synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 0.1f, n_expert, 0, "blk.%d.ffn_gate_inp.bias", l);
                synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 0.1f, ff_exp, n_expert, "blk.%d.ffn_gate_exps.bias", l);
                synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 0.1f, hp.n_embd, n_expert, "blk.%d.ffn_down_exps.bias", l);
                synth_add(ts, &nt, QUILL_TYPE_F32, 0.0f, 0.1f, ff_exp, n_expert, "blk.%d.ffn_up_exps.bias", l);
            }
        } else if (arch->fused || synth_is_glm4(arch)) {
            synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, 2 * hp.n_ff, "blk.%d.ffn_up.weight", l);
        } else {
            synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, hp.n_ff, "blk.%d.ffn_gate.weight", l);
            synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, hp.n_ff, "blk.%d.ffn_up.weight", l);
        }
        if (!n_expert) synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_ff), hp.n_ff, hp.n_embd, "blk.%d.ffn_down.weight", l);
        if (arch->post_norms)
            synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, norm_spread, hp.n_embd, 0, "blk.%d.post_ffw_norm.weight", l);
    }
#undef SPREAD
    uint64_t total_bytes = 0, total_params = 0;
    for (int i = 0; i < nt && !bad; i++) {
        bad |= quill_gguf_writer_add_tensor_info(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne) != QUILL_OK;
        total_params += (uint64_t)(ts[i].ne[0] * ts[i].ne[1] * ts[i].ne[2]);
        total_bytes += quill_row_size(ts[i].type, ts[i].ne[0]) * (uint64_t)(ts[i].ne[1] * ts[i].ne[2]);
    }
    const int64_t chunk = (int64_t)1 << 20;
    float *vals = malloc((size_t)chunk * sizeof *vals);
    uint8_t *bytes = malloc((size_t)chunk * sizeof(float));
    int rc = 0;
    const double t0 = now_seconds();
    if (bad || !vals || !bytes) {
        rc = cli_fail("synth: out of memory");
    } else if (quill_gguf_writer_begin_stream(w, out_path, &err) != QUILL_OK) {
        rc = cli_fail("%s", err.message);
    } else {
        quill_status s = QUILL_OK;
        for (int i = 0; i < nt && s == QUILL_OK; i++)
            s = synth_stream(w, &ts[i], (uint64_t)seed * 0x9E3779B97F4A7C15ull, vals, bytes, chunk, &err);
        quill_error ferr;
        quill_status fs = quill_gguf_writer_finish_stream(w, &ferr);
        if (s == QUILL_OK && fs != QUILL_OK) {
            s = fs;
            err = ferr;
        }
        if (s != QUILL_OK) {
            remove(out_path);
            rc = cli_fail("%s", err.message);
        }
    }
    if (rc == 0)
        fprintf(stderr,
                "synth: wrote %s: %s (%s) n_embd %" PRId64 ", %" PRId64 " layers, %" PRId64 " heads (%" PRId64
                " KV) of %" PRId64 ", n_ff %" PRId64 ", vocab %" PRId64 ", ctx %" PRId64 ", %d tensors, %" PRIu64
                " parameters, %.1f MiB of %s weights, seed %ld, %.1f s\n",
                out_path, arch->arch, arch->name, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, head_dim, hp.n_ff,
                n_vocab, hp.n_ctx, nt, total_params, (double)total_bytes / (1024.0 * 1024.0), quill_type_name(wtype),
                seed, now_seconds() - t0);
    free(vals);
    free(bytes);
    free(ts);
    free(factors);
    quill_gguf_writer_free(w);
    return rc;
}
