/* Inference context lifetime: the KV cache, scratch buffers and RoPE tables of one conversation. */
#include "model/context.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/recurrent.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Under AddressSanitizer the buffers' mapping is one allocation it does not see: a cache line
 * after each buffer is marked unreadable, so that running off its end is still caught. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QUILL_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define QUILL_ASAN 1
#endif
#ifdef QUILL_ASAN
#include <sanitizer/asan_interface.h>
#define BUFFER_GUARD 64
#else
#define BUFFER_GUARD 0
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

/* The next `bytes` of the buffers' mapping at mem (NULL: counting only), on a cache line. */
static void *carve(uint8_t *mem, size_t *at, size_t bytes) {
    void *p = mem ? mem + *at : NULL;
    *at += (bytes + 63) & ~(size_t)63;
    if (mem) ASAN_POISON_MEMORY_REGION(mem + *at, BUFFER_GUARD);
    *at += BUFFER_GUARD;
    return p;
}

/* Points the context's buffers into mem (NULL: sets them NULL); returns the bytes they take.
 * cache counts the value cache's positions (of every layer, sequence and KV head), key_cache the
 * key cache's (whole blocks). */
static size_t lay_out_buffers(quill_context *c, uint8_t *mem, size_t cache, size_t key_cache, int64_t widest) {
    const quill_hparams *hp = c->hp;
    size_t at = 0;
    if (c->reference) {
        c->ref_k = carve(mem, &at, cache * sizeof(double));
        c->ref_v = carve(mem, &at, cache * sizeof(double));
        return at;
    }
    const size_t ub = (size_t)c->ubatch, f = sizeof(float), d = (size_t)hp->n_embd;
    const size_t q_dim = (size_t)c->model->ap.widest_q, kv_dim = (size_t)c->model->ap.widest_kv;
    const size_t rope = (size_t)c->model->ap.n_rope_tables * (size_t)c->n_ctx * (size_t)quill_rope_stride(c->model) * f;
    c->k_cache = carve(mem, &at, quill_row_size(c->type_k, (int64_t)key_cache));
    c->v_cache = carve(mem, &at, quill_row_size(c->type_v, (int64_t)cache));
    c->rope_cos = carve(mem, &at, rope);
    c->rope_sin = carve(mem, &at, rope);
    c->x = carve(mem, &at, ub * d * f);
    c->xb = carve(mem, &at, ub * d * f);
    c->q = carve(mem, &at, ub * q_dim * f);
    c->att = carve(mem, &at, ub * q_dim * f);
    c->k = carve(mem, &at, ub * kv_dim * f);
    c->v = carve(mem, &at, ub * kv_dim * f);
    const quill_arch_params *ap = &c->model->ap;
    size_t ff = (size_t)(ap->widest_ff > ap->n_ff_exp ? ap->widest_ff : ap->n_ff_exp);
    if ((size_t)ap->n_ff_shexp > ff) ff = (size_t)ap->n_ff_shexp;
    c->ffn_gate = carve(mem, &at, ub * ff * f);
    c->ffn_up = carve(mem, &at, ub * ff * f);
    if (ap->n_expert) {
        const size_t experts = (size_t)ap->n_expert, used = (size_t)ap->n_expert_used;
        c->moe_logits = carve(mem, &at, ub * experts * f);
        c->moe_router = carve(mem, &at, ub * experts * sizeof(double));
        c->moe_weight = carve(mem, &at, ub * used * f);
        c->moe_expert = carve(mem, &at, ub * used * sizeof(int32_t));
        c->moe_pairs = carve(mem, &at, ub * used * sizeof(int32_t));
        c->moe_start = carve(mem, &at, (experts + 1) * sizeof(int32_t));
        c->moe_in = carve(mem, &at, ub * d * f);
        c->moe_out = carve(mem, &at, ub * used * d * f);
        c->moe_shared_gate = carve(mem, &at, ub * f);
        const size_t et = QUILL_EXPERT_TOKENS, ff_exp = (size_t)ap->n_ff_exp, widest_in = d > ff_exp ? d : ff_exp;
        const size_t products = c->kern->matmul_scratch ? c->kern->matmul_scratch((int64_t)widest_in, (int)et) : 0;
        c->expert_scratch_bytes = quill_expert_part(et * d) + 2 * quill_expert_part(et * ff_exp) +
                                  ((products + 63) & ~(size_t)63);
        c->expert_scratch = carve(mem, &at, (size_t)c->n_threads * c->expert_scratch_bytes);
    }
    if (ap->mla_floats) c->mla = carve(mem, &at, ub * (size_t)ap->mla_floats * f);
    if (ap->n_embd_per_layer) {
        const size_t slices = ub * (size_t)hp->n_layer * (size_t)ap->n_embd_per_layer;
        c->ple_inp = carve(mem, &at, slices * f);
        c->ple_proj = carve(mem, &at, slices * f);
        c->ple_gate = carve(mem, &at, ub * (size_t)ap->n_embd_per_layer * f);
    }
    c->thread_scratch = carve(mem, &at, (size_t)c->n_threads * c->thread_scratch_len * f);
    /* the whole-matrix products' scratch (quantized activations), sized for the widest input */
    c->matmul_scratch = c->kern->matmul_scratch ? carve(mem, &at, c->kern->matmul_scratch(widest, (int)ub)) : NULL;
    return at;
}

/* One zeroed mapping for all of a context's buffers, in 2 MiB pages where the system gives them.
 * A token streams hundreds of MB of weights past the caches, which evicts the page tables of 4 KiB
 * pages: each store of the token's key and value into the cache, and the reads of the
 * activations, then waited for a page walk from memory. TinyLlama q4_0, 2 threads: RoPE with the
 * cache stores 355 -> 122 us per token, attention 570 -> 480 us. NULL when out of memory. */
static uint8_t *map_buffers(size_t bytes) {
    void *mem = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return NULL;
    (void)madvise(mem, bytes, MADV_HUGEPAGE);
    return mem;
}

static const struct {
    const char *name;
    quill_type type;
} cache_types[] = {{"f32", QUILL_TYPE_F32}, {"f16", QUILL_TYPE_F16}, {"bf16", QUILL_TYPE_BF16},
                   {"q8_0", QUILL_TYPE_Q8_0}, {"q4_0", QUILL_TYPE_Q4_0}};

const char *quill_cache_type_names(void) { return "f32, f16, bf16, q8_0, q4_0"; }

quill_status quill_cache_type_parse(const char *name, quill_type *out, quill_error *err) {
    for (size_t i = 0; name && i < sizeof cache_types / sizeof cache_types[0]; i++)
        if (!strcmp(name, cache_types[i].name)) {
            *out = cache_types[i].type;
            return QUILL_OK;
        }
    return quill_fail(err, QUILL_E_ARG, "unknown KV cache type '%.32s': the types are %s", name ? name : "(null)",
                      quill_cache_type_names());
}

/* The KV cache's bytes in double (an absurd context, 2^24 positions x 4096 sequences of a deep
 * model, would wrap a size_t around): keys in whole blocks of KEY_BLOCK positions; a type's bytes
 * per element are its block's bytes over its elements (head sizes are multiples of its block). */
static double kv_cache_bytes(const quill_model *m, int n_ctx, int n_seq, uint32_t type_k, uint32_t type_v,
                             bool reference) {
    const double elements = (double)m->ap.kv_width * n_seq; /* per position */
    if (reference) return 2.0 * elements * n_ctx * sizeof(double);
    const quill_type_traits *k = quill_type_traits_of(type_k), *v = quill_type_traits_of(type_v);
    return elements * ((double)quill_key_positions(n_ctx) * (double)k->type_size / (double)k->block_size +
                       (double)n_ctx * (double)v->type_size / (double)v->block_size);
}

/* The largest head size of the layers with a KV cache (0 when none has one). */
static int64_t widest_head_dim(const quill_model *m) {
    int64_t widest = 0;
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        if (!m->layers[l].recurrent && m->layers[l].head_dim > widest) widest = m->layers[l].head_dim;
    return widest;
}

/* The head size of a layer with a KV cache that type's blocks do not divide, or 0. */
static int64_t undivided_head_dim(const quill_model *m, uint32_t type) {
    const int64_t block = quill_type_traits_of(type)->block_size;
    for (int64_t l = 0; l < m->hp.n_layer; l++)
        if (!m->layers[l].recurrent && m->layers[l].head_dim % block) return m->layers[l].head_dim;
    return 0;
}

/* The context length and sequence count that parameters give (0: the defaults). */
static int default_n_ctx(const quill_hparams *hp, const quill_context_params *p) {
    /* By default the training context, capped so that a 32k-context model does not reserve
     * gigabytes of KV cache that a short session never uses. */
    return p && p->n_ctx > 0 ? p->n_ctx : (int)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
}

double quill_context_kv_bytes(const quill_model *m, const quill_context_params *p) {
    const quill_hparams *hp = quill_model_hparams(m);
    const int n_seq = p && p->n_seq > 0 ? p->n_seq : 1;
    const uint32_t tk = p ? (uint32_t)p->type_k : 0, tv = p ? (uint32_t)p->type_v : 0;
    if (!quill_kv_type_ok(tk) || !quill_kv_type_ok(tv)) return 0;
    return kv_cache_bytes(m, default_n_ctx(hp, p), n_seq, tk, tv, p && p->reference);
}

/* Whether a cache type can hold this model's heads; else the reason, in err. */
static quill_status check_cache_type(const quill_model *m, uint32_t type, const char *which, const char *flag,
                                     quill_error *err) {
    if (!quill_kv_type_ok(type))
        return quill_fail(err, QUILL_E_ARG, "%s cache type %s (id %u) is not a KV cache type: the types are %s (%s)",
                          which, quill_type_name(type), type, quill_cache_type_names(), flag);
    const int64_t head_dim = undivided_head_dim(m, type);
    if (head_dim)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s cache type %s stores blocks of %lld, which do not divide this model's head size %lld; "
                          "use f32, f16 or bf16 (%s)",
                          which, quill_type_name(type), (long long)quill_type_traits_of(type)->block_size,
                          (long long)head_dim, flag);
    return QUILL_OK;
}

quill_status quill_context_new(quill_model *m, const quill_context_params *p, quill_context **out,
                               quill_error *err) {
    *out = NULL;
    const quill_hparams *hp = quill_model_hparams(m);
    int n_ctx = default_n_ctx(hp, p);
    int n_threads = p && p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    if (p && (p->n_ctx < 0 || p->n_ctx > (1 << 24)))
        return quill_fail(err, QUILL_E_ARG, "context length %d is out of range (1..%d)", p->n_ctx, 1 << 24);
    if (p && (p->n_threads < 0 || p->n_threads > 1024))
        return quill_fail(err, QUILL_E_ARG, "thread count %d is out of range (1..1024)", p->n_threads);
    const int n_seq = p && p->n_seq > 0 ? p->n_seq : 1;
    if (p && (p->n_seq < 0 || p->n_seq > 4096))
        return quill_fail(err, QUILL_E_ARG, "sequence count %d is out of range (1..4096)", p->n_seq);
    if (p && p->reference && n_seq > 1)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "the float64 reference path evaluates one sequence (n_seq 1, not %d)", n_seq);
    const uint32_t type_k = p ? (uint32_t)p->type_k : QUILL_TYPE_F32, type_v = p ? (uint32_t)p->type_v : QUILL_TYPE_F32;
    quill_status st = check_cache_type(m, type_k, "K", "-ctk", err);
    if (st == QUILL_OK) st = check_cache_type(m, type_v, "V", "-ctv", err);
    if (st != QUILL_OK) return st;
    const quill_kernels *kern;
    st = quill_kernels_choose(&kern, err);
    if (st != QUILL_OK) return st;
    quill_context *c = calloc(1, sizeof *c);
    if (!c) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    c->model = m;
    c->hp = hp;
    c->n_ctx = n_ctx;
    c->n_threads = n_threads;
    c->n_seq = n_seq;
    c->reference = p && p->reference;
    c->ubatch = quill_model_ubatch(m);
    c->kern = kern;
    c->type_k = type_k;
    c->type_v = type_v;
    /* Phi-3's LongRoPE: the long factors once the context exceeds the trained one, as the
     * reference chooses them per context */
    c->rope_factors = m->ap.rope_factors_long && n_ctx > m->ap.n_ctx_orig ? m->ap.rope_factors_long
                                                                          : m->ap.rope_factors;
    const int64_t d = hp->n_embd, q_dim = m->ap.widest_q, kv_width = m->ap.kv_width;
    /* (the layers with a KV cache: a hybrid's DeltaNet layers keep a recurrent state instead) */
    const size_t cache = (size_t)kv_width * (size_t)n_seq * (size_t)n_ctx;
    const size_t key_cache = (size_t)kv_width * (size_t)n_seq * (size_t)quill_key_positions(n_ctx);
    int64_t widest = d > q_dim ? d : q_dim;
    if (m->ap.widest_ff > widest) widest = m->ap.widest_ff;
    if (m->ap.n_ff_exp > widest) widest = m->ap.n_ff_exp;
    if (m->ap.n_ff_shexp > widest) widest = m->ap.n_ff_shexp;
    if (m->ap.ssm_state > widest) widest = m->ap.ssm_state;
    if (m->ap.ssm_inner > widest) widest = m->ap.ssm_inner; /* (Mamba-2's ssm_out rows) */
    /* a dequantized row, or the scores of one attention item (see attention_items) */
    const size_t scores = (size_t)quill_score_stride(n_ctx) * (size_t)m->ap.widest_group * ATT_TOKENS;
    /* and, after the scores, a decoded key block or KEY_BLOCK value rows (a cache in f32 is read
     * in place) */
    c->tile_at = (scores + 15) / 16 * 16;
    const size_t attention = type_k || type_v ? c->tile_at + (size_t)KEY_BLOCK * (size_t)widest_head_dim(m) : scores;
    c->thread_scratch_len = ((size_t)widest > attention ? (size_t)widest : attention) + 64;
    bool ok = (c->pool = quill_pool_new(n_threads)) != NULL && (c->seq_len = calloc((size_t)n_seq, sizeof(int))) &&
              (c->seq_next = calloc((size_t)n_seq, sizeof(int))) &&
              (c->run_start = malloc(((size_t)c->ubatch + 1) * sizeof(int)));
    const double kv_bytes = kv_cache_bytes(m, n_ctx, n_seq, type_k, type_v, c->reference);
    const bool fits = kv_bytes < (double)(SIZE_MAX / 4);
    const size_t bytes = fits ? lay_out_buffers(c, NULL, cache, key_cache, widest) : 0;
    uint8_t *mem = ok && fits ? map_buffers(bytes) : NULL;
    if (mem) {
        c->buffers = mem;
        c->buffers_bytes = bytes;
        lay_out_buffers(c, mem, cache, key_cache, widest);
    }
    ok = ok && mem;
    const double rec_bytes = quill_recurrent_bytes(m, n_seq, n_ctx, c->reference);
    if (ok && quill_arch_stateful(m->arch)) ok = quill_recurrent_new(c);
    if (ok && !c->reference) {
        /* the angles in double, rounded once; the rotation scaled by rope.scaling.attn_factor */
        const size_t stride = (size_t)quill_rope_stride(m), tables = (size_t)m->ap.n_rope_tables;
        for (size_t t = 0; t < tables; t++)
            for (int pos = 0; pos < n_ctx; pos++)
                for (size_t i = 0; i < (size_t)quill_rope_dims(m, (int)t) / 2; i++) {
                    const double mscale = t ? m->ap.rope_attn_factor_local : m->ap.rope_attn_factor;
                    double theta = quill_rope_angle(c, (int)t, pos, (int64_t)i);
                    c->rope_cos[(t * (size_t)n_ctx + (size_t)pos) * stride + i] = (float)(cos(theta) * mscale);
                    c->rope_sin[(t * (size_t)n_ctx + (size_t)pos) * stride + i] = (float)(sin(theta) * mscale);
                }
    }
    /* (the reference path reads the file's layout) */
    if (ok && !c->reference) c->packed = quill_model_pack(m, kern, c->pool);
    if (!ok) {
        /* the message reads the context's settings, so it is written before the context is freed */
        char state[96] = "", types[320] = "";
        if (rec_bytes > 0)
            snprintf(state, sizeof state, ", recurrent state with its checkpoints %.1f MB", rec_bytes / 1e6);
        if (!c->reference) {
            /* what each cache type would take, both keys and values in it */
            snprintf(types, sizeof types, " with -ctk %s -ctv %s; both in", quill_type_name(type_k),
                     quill_type_name(type_v));
            for (size_t i = 0; i < sizeof cache_types / sizeof cache_types[0]; i++) {
                const uint32_t t = cache_types[i].type;
                if (undivided_head_dim(m, t)) continue;
                const size_t used = strlen(types);
                snprintf(types + used, sizeof types - used, "%s %s %.1f MB", i ? "," : "", cache_types[i].name,
                         kv_cache_bytes(m, n_ctx, n_seq, t, t, false) / 1e6);
            }
        }
        quill_fail(err, QUILL_E_NOMEM,
                   "out of memory creating a context of %d tokens x %d sequences (KV cache %.1f MB%s%s); use a smaller "
                   "context (-c)%s%s",
                   n_ctx, n_seq, kv_bytes / 1e6, types, state, rec_bytes > 0 ? " or fewer sequences" : "",
                   c->reference ? "" : " or a smaller cache type (-ctk/-ctv)");
        quill_context_free(c);
        return QUILL_E_NOMEM;
    }
    if (p && p->backend == QUILL_BACKEND_VULKAN) {
        const quill_status gs = quill_gpu_offload(c, p, err);
        if (gs) {
            quill_context_free(c);
            return gs;
        }
    } else if (p && p->backend != QUILL_BACKEND_CPU) {
        quill_context_free(c);
        return quill_fail(err, QUILL_E_ARG, "backend %d is not one of cpu (0) and vulkan (1)", (int)p->backend);
    }
    *out = c;
    return QUILL_OK;
}

void quill_context_free(quill_context *c) {
    if (!c) return;
    quill_gpu_offload_free(c);
    quill_pool_free(c->pool);
    quill_recurrent_free(c);
    if (c->buffers) {
        ASAN_UNPOISON_MEMORY_REGION(c->buffers, c->buffers_bytes); /* the addresses may serve others next */
        munmap(c->buffers, c->buffers_bytes);
    }
    free(c->seq_len);
    free(c->seq_next);
    free(c->run_start);
    free(c);
}

int quill_context_pos(const quill_context *c) { return c->seq_len[0]; }
int quill_context_n_ctx(const quill_context *c) { return c->n_ctx; }

const char *quill_context_kernels(const quill_context *c) { return c->reference ? "reference" : c->kern->isa; }

void quill_context_wait_layout(quill_context *c) {
    if (c && c->packed) quill_model_finish_packing(c->model, false);
}

const char *quill_context_weight_layout(const quill_context *c, const void **start, size_t *bytes) {
    if (start) *start = c->packed ? c->model->packed_mem : NULL;
    if (bytes) *bytes = c->packed ? c->model->packed_size : 0;
    return c->packed ? c->model->packed_layout : NULL;
}


void quill_context_set_trace(quill_context *c, quill_trace_fn fn, void *user) {
    c->trace = fn;
    c->trace_user = user;
}
