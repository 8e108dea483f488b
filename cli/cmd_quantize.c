/* quill quantize: a Llama GGUF into one of the reference quantizer's types or mixes.
 * quill synth: a random-weight Llama GGUF of any shape, with a real tokenizer, for tests and
 * benchmarks. */
#include "cli.h"
#include "quill_quantize.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void human_size(double bytes, char *buf, size_t cap) {
    if (bytes >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else if (bytes >= 1024.0 * 1024) snprintf(buf, cap, "%.2f MiB", bytes / (1024.0 * 1024));
    else snprintf(buf, cap, "%.1f KiB", bytes / 1024.0);
}

static void shape_string(uint32_t n_dims, const int64_t *ne, char *buf, size_t cap) {
    size_t n = 0;
    for (uint32_t d = 0; d < n_dims && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, d ? " x " : "", ne[d]);
}

/* True when both paths name the same existing file (writing would destroy the input). */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* ---------------------------------------------------------------- quantize */

typedef struct {
    uint64_t n_tensors, src_bytes, dst_bytes, elements, n_quantized, n_fallback;
} quantize_totals;

static void quantize_progress(const quill_quantize_progress *p, void *user) {
    quantize_totals *t = user;
    char shape[64], before[32], after[32];
    shape_string(p->n_dims, p->ne, shape, sizeof shape);
    human_size((double)p->src_bytes, before, sizeof before);
    human_size((double)p->dst_bytes, after, sizeof after);
    int width = 1;
    for (uint64_t c = p->count; c >= 10; c /= 10) width++;
    if (p->quantized)
        fprintf(stderr, "[%*" PRIu64 "/%" PRIu64 "] %-32s %-16s %6s -> %-6s %11s -> %11s%s\n", width, p->index + 1,
                p->count, p->name, shape, quill_type_name(p->src_type), quill_type_name(p->dst_type), before, after,
                p->fallback ? "  (fallback: rows do not fit the mix's type)" : "");
    else
        fprintf(stderr, "[%*" PRIu64 "/%" PRIu64 "] %-32s %-16s %6s    (kept)  %11s\n", width, p->index + 1, p->count,
                p->name, shape, quill_type_name(p->src_type), before);
    int64_t n = 1;
    for (uint32_t d = 0; d < p->n_dims; d++) n *= p->ne[d];
    t->n_tensors++;
    t->elements += (uint64_t)n;
    t->src_bytes += p->src_bytes;
    t->dst_bytes += p->dst_bytes;
    t->n_quantized += p->quantized;
    t->n_fallback += p->fallback;
}

static int quantize_usage(FILE *f) {
    fprintf(f,
            "usage: quill quantize IN.gguf OUT.gguf TYPE [-t THREADS] [--pure]\n"
            "  Quantizes a Llama GGUF with F32, F16 or BF16 weights. Per-tensor types follow the reference\n"
            "  quantizer's mixes (e.g. q4_k_m keeps attn_v and ffn_down of some layers in q6_K, output.weight\n"
            "  in q6_K, norms in f32); all metadata is copied.\n"
            "  TYPE: %s\n"
            "  -t, --threads N   worker threads (default: all CPUs)\n"
            "  --pure            every quantized tensor in TYPE's base type, no mix rules (output.weight\n"
            "                    included); rows the type cannot split still fall back\n",
            quill_ftype_names());
    return f == stdout ? 0 : 1;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {NULL, NULL, NULL};
    int n_pos = 0;
    bool pure = false;
    long threads = sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return quantize_usage(stdout);
        if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (++i >= argc || !cli_parse_long(argv[i], 1, 1024, &threads))
                return cli_fail("quantize: %s needs a thread count from 1 to 1024", a);
        } else if (!strcmp(a, "--pure")) {
            pure = true;
        } else if (a[0] == '-' && a[1]) {
            return cli_fail("quantize: unknown option '%s' (see quill quantize --help)", a);
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            return cli_fail("quantize: too many arguments ('%s'); usage: quill quantize IN.gguf OUT.gguf TYPE", a);
        }
    }
    if (n_pos < 3) {
        quantize_usage(stderr);
        return cli_fail("quantize: expected IN.gguf OUT.gguf TYPE");
    }
    quill_quantize_params params = {0};
    if (!quill_ftype_from_name(pos[2], &params.ftype))
        return cli_fail("quantize: unknown type '%s'; choose one of: %s", pos[2], quill_ftype_names());
    if (same_file(pos[0], pos[1]))
        return cli_fail("quantize: the output %s is the input file; choose another name", pos[1]);
    params.n_threads = (int)threads;
    params.pure = pure;
    quantize_totals totals = {0};
    params.progress = quantize_progress;
    params.user = &totals;

    fprintf(stderr, "quantize: %s -> %s as %s%s (general.file_type %d), %ld threads\n", pos[0], pos[1],
            quill_ftype_name(params.ftype), pure ? " (pure)" : "", (int)params.ftype, threads);
    const double t0 = now_seconds();
    quill_error err;
    if (quill_quantize_file(pos[0], pos[1], &params, &err) != QUILL_OK) return cli_fail("%s", err.message);
    const double secs = now_seconds() - t0;

    char before[32], after[32];
    human_size((double)totals.src_bytes, before, sizeof before);
    human_size((double)totals.dst_bytes, after, sizeof after);
    fprintf(stderr,
            "quantize: %" PRIu64 " tensors (%" PRIu64 " quantized, %" PRIu64 " with fallback types), "
            "%s -> %s (%.1f%%, %.2f bits per weight) in %.1f s\n",
            totals.n_tensors,
            totals.n_quantized, totals.n_fallback, before, after,
            totals.src_bytes ? 100.0 * (double)totals.dst_bytes / (double)totals.src_bytes : 0.0,
            totals.elements ? 8.0 * (double)totals.dst_bytes / (double)totals.elements : 0.0, secs);
    return 0;
}

/* ---------------------------------------------------------------- synth */

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
    int64_t ne[2];
    uint32_t type;
    float center, spread;   /* values: center + spread * uniform(-1, 1) */
} synth_tensor;

static void synth_add(synth_tensor *t, int *n, uint32_t type, float center, float spread, int64_t ne0, int64_t ne1,
                      const char *fmt, int layer) {
    synth_tensor *s = &t[(*n)++];
    snprintf(s->name, sizeof s->name, fmt, layer);
    s->n_dims = ne1 > 0 ? 2 : 1;
    s->ne[0] = ne0;
    s->ne[1] = ne1 > 0 ? ne1 : 1;
    s->type = type;
    s->center = center;
    s->spread = spread;
}

/* Generates one tensor in chunks and streams it to the writer. */
static quill_status synth_stream(quill_gguf_writer *w, const synth_tensor *t, uint64_t seed, float *vals,
                                 uint8_t *bytes, int64_t chunk, quill_error *err) {
    uint64_t state = seed ^ fnv1a(t->name);
    const int64_t total = t->ne[0] * t->ne[1];
    for (int64_t done = 0; done < total; done += chunk) {
        const int64_t n = total - done < chunk ? total - done : chunk;
        for (int64_t i = 0; i < n; i++) vals[i] = t->center + t->spread * uniform_pm1(&state);
        quill_status s = quill_quantize_rows(t->type, vals, bytes, 1, n, err);
        if (s) return s;
        s = quill_gguf_writer_stream_data(w, bytes, quill_row_size(t->type, n), err);
        if (s) return s;
    }
    return QUILL_OK;
}

static int synth_usage(FILE *f) {
    fprintf(f,
            "usage: quill synth (--like tinyllama-1.1b | --embd N --layers N --heads N --kv-heads N --ff N)\n"
            "                   --vocab VOCAB.gguf [--seed S] [--type f16|f32|bf16] [--ctx N] [--name NAME] -o OUT.gguf\n"
            "  Writes a Llama GGUF with random weights (deterministic for a seed) and the tokenizer of\n"
            "  VOCAB.gguf (every tokenizer.* key, chat template included). Matrices are uniform with the\n"
            "  standard deviation 1/sqrt(fan_in) (token embeddings 0.02), norms 1 +- 0.01, output.weight\n"
            "  separate from token_embd. Explicit sizes override those of --like.\n");
    return f == stdout ? 0 : 1;
}

int cmd_synth(int argc, char **argv) {
    synth_preset hp = {NULL, 0, 0, 0, 0, 0, 2048};
    const char *vocab_path = NULL, *out_path = NULL, *name = NULL;
    long seed = 0;
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
    if (!vocab_path) return cli_fail("synth: --vocab VOCAB.gguf is required (the tokenizer to copy)");
    if (!out_path) return cli_fail("synth: -o OUT.gguf is required");
    if (hp.n_embd % hp.n_head != 0)
        return cli_fail("synth: --embd %" PRId64 " is not a multiple of --heads %" PRId64, hp.n_embd, hp.n_head);
    if (hp.n_head % hp.n_head_kv != 0)
        return cli_fail("synth: --heads %" PRId64 " is not a multiple of --kv-heads %" PRId64, hp.n_head, hp.n_head_kv);
    const int64_t head_dim = hp.n_embd / hp.n_head;
    if (head_dim % 2 != 0) return cli_fail("synth: the head dimension %" PRId64 " must be even (RoPE)", head_dim);
    if (same_file(vocab_path, out_path)) return cli_fail("synth: the output %s is the vocabulary file", out_path);

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

    /* metadata, in the order a converted Llama has it */
    char default_name[128];
    snprintf(default_name, sizeof default_name, "synth%s%s", hp.name ? "-" : "", hp.name ? hp.name : "");
    if (!name) name = default_name;
    const uint32_t file_type = wtype == QUILL_TYPE_F32 ? 0 : wtype == QUILL_TYPE_F16 ? 1 : 32;
    quill_gguf_writer *w = quill_gguf_writer_new();
    int bad = !w;
    if (w) {
        bad |= quill_gguf_writer_add_str(w, "general.architecture", "llama", 5) != QUILL_OK;
        bad |= quill_gguf_writer_add_str(w, "general.name", name, strlen(name)) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "general.file_type", file_type) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "llama.context_length", (uint32_t)hp.n_ctx) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "llama.embedding_length", (uint32_t)hp.n_embd) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "llama.block_count", (uint32_t)hp.n_layer) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "llama.feed_forward_length", (uint32_t)hp.n_ff) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "llama.rope.dimension_count", (uint32_t)head_dim) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "llama.attention.head_count", (uint32_t)hp.n_head) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "llama.attention.head_count_kv", (uint32_t)hp.n_head_kv) != QUILL_OK;
        bad |= quill_gguf_writer_add_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f) != QUILL_OK;
        bad |= quill_gguf_writer_add_f32(w, "llama.rope.freq_base", 10000.0f) != QUILL_OK;
        bad |= quill_gguf_writer_add_u32(w, "llama.vocab_size", (uint32_t)n_vocab) != QUILL_OK;
        for (uint64_t i = 0; i < quill_gguf_n_kv(vocab) && !bad; i++) {
            const quill_gguf_kv *kv = quill_gguf_kv_at(vocab, i);
            if (!strncmp(kv->key, "tokenizer.", 10))
                bad |= quill_gguf_writer_add_value(w, kv->key, &kv->value) != QUILL_OK;
        }
    }
    quill_gguf_close(vocab);
    if (bad) {
        quill_gguf_writer_free(w);
        return cli_fail("synth: cannot build the metadata (out of memory?)");
    }

    /* tensors, in the order of a converted Llama */
    const int64_t n_kv_dim = hp.n_head_kv * head_dim;
    const int n_tensors = 3 + 9 * (int)hp.n_layer;
    synth_tensor *ts = calloc((size_t)n_tensors, sizeof *ts);
    if (!ts) {
        quill_gguf_writer_free(w);
        return cli_fail("synth: out of memory");
    }
    int nt = 0;
    const float root3 = 1.7320508f; /* a uniform on [-a, a] has standard deviation a / sqrt(3) */
#define SPREAD(fan_in) (root3 / sqrtf((float)(fan_in)))
    synth_add(ts, &nt, wtype, 0.0f, 0.02f * root3, hp.n_embd, n_vocab, "token_embd.weight", 0);
    synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, 0.01f * root3, hp.n_embd, 0, "output_norm.weight", 0);
    synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, n_vocab, "output.weight", 0);
    for (int l = 0; l < (int)hp.n_layer; l++) {
        synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, 0.01f * root3, hp.n_embd, 0, "blk.%d.attn_norm.weight", l);
        synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, hp.n_embd, "blk.%d.attn_q.weight", l);
        synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, n_kv_dim, "blk.%d.attn_k.weight", l);
        synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, n_kv_dim, "blk.%d.attn_v.weight", l);
        synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, hp.n_embd, "blk.%d.attn_output.weight", l);
        synth_add(ts, &nt, QUILL_TYPE_F32, 1.0f, 0.01f * root3, hp.n_embd, 0, "blk.%d.ffn_norm.weight", l);
        synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, hp.n_ff, "blk.%d.ffn_gate.weight", l);
        synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_embd), hp.n_embd, hp.n_ff, "blk.%d.ffn_up.weight", l);
        synth_add(ts, &nt, wtype, 0.0f, SPREAD(hp.n_ff), hp.n_ff, hp.n_embd, "blk.%d.ffn_down.weight", l);
    }
#undef SPREAD
    uint64_t total_bytes = 0, total_params = 0;
    for (int i = 0; i < nt && !bad; i++) {
        bad |= quill_gguf_writer_add_tensor_info(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne) != QUILL_OK;
        total_params += (uint64_t)(ts[i].ne[0] * ts[i].ne[1]);
        total_bytes += quill_row_size(ts[i].type, ts[i].ne[0]) * (uint64_t)ts[i].ne[1];
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
    if (rc == 0) {
        char size[32];
        human_size((double)total_bytes, size, sizeof size);
        fprintf(stderr,
                "synth: wrote %s: llama n_embd %" PRId64 ", %" PRId64 " layers, %" PRId64 " heads (%" PRId64
                " KV), n_ff %" PRId64 ", vocab %" PRId64 ", ctx %" PRId64 ", %d tensors, %" PRIu64
                " parameters, %s of %s weights, seed %ld, %.1f s\n",
                out_path, hp.n_embd, hp.n_layer, hp.n_head, hp.n_head_kv, hp.n_ff, n_vocab, hp.n_ctx, nt,
                total_params, size, quill_type_name(wtype), seed, now_seconds() - t0);
    }
    free(vals);
    free(bytes);
    free(ts);
    quill_gguf_writer_free(w);
    return rc;
}
