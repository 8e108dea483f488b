/* quill quantize: a model GGUF into one of the reference quantizer's types or mixes. */
#include "cli.h"
#include "quill_quantize.h"

#include <errno.h>
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
            "usage: quill quantize IN.gguf OUT.gguf TYPE [-t THREADS] [--pure] [--force]\n"
            "  Quantizes a Llama GGUF with F32, F16 or BF16 weights. Per-tensor types follow the reference\n"
            "  quantizer's mixes (e.g. q4_k_m keeps attn_v and ffn_down of some layers in q6_K, output.weight\n"
            "  in q6_K, norms in f32); all metadata is copied.\n"
            "  TYPE: %s\n"
            "  -t, --threads N   worker threads (default: all CPUs)\n"
            "  --pure            every quantized tensor in TYPE's base type, no mix rules (output.weight\n"
            "                    included); rows the type cannot split still fall back\n"
            "  --force           replace OUT.gguf when it exists\n"
            "  The output is written under a temporary name and renamed when complete, so OUT.gguf is\n"
            "  never a half-written file.\n",
            quill_ftype_names());
    return f == stdout ? 0 : 1;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {NULL, NULL, NULL};
    int n_pos = 0;
    bool pure = false, force = false;
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
        } else if (!strcmp(a, "--force") || !strcmp(a, "-f")) {
            force = true;
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
    quill_error perr;
    if (quill_ftype_parse(pos[2], &params.ftype, &perr) != QUILL_OK) return cli_fail("%s", perr.message);
    if (same_file(pos[0], pos[1]))
        return cli_fail("quantize: the output %s is the input file; choose another name", pos[1]);
    if (!force && access(pos[1], F_OK) == 0)
        return cli_fail("quantize: %s already exists; pass --force to replace it", pos[1]);
    {
        quill_gguf *g;
        quill_error gerr;
        if (quill_gguf_open(pos[0], &g, &gerr) != QUILL_OK) return cli_fail("%s", gerr.message);
        uint64_t n_tensors = quill_gguf_n_tensors(g);
        quill_gguf_close(g);
        if (n_tensors == 0)
            return cli_fail("quantize: %s holds no tensors (a vocabulary-only file?): there is nothing to quantize",
                            pos[0]);
    }
    params.n_threads = (int)threads;
    params.pure = pure;
    quantize_totals totals = {0};
    params.progress = quantize_progress;
    params.user = &totals;

    fprintf(stderr, "quantize: %s -> %s as %s%s (general.file_type %d), %ld threads\n", pos[0], pos[1],
            quill_ftype_name(params.ftype), pure ? " (pure)" : "", (int)params.ftype, threads);
    const double t0 = now_seconds();
    quill_error err;
    /* A temporary name beside the output (same file system, so the rename is atomic). */
    size_t tmp_len = strlen(pos[1]) + 32;
    char *tmp = malloc(tmp_len);
    if (!tmp) return cli_fail("out of memory");
    snprintf(tmp, tmp_len, "%s.partial-%ld", pos[1], (long)getpid());
    if (quill_quantize_file(pos[0], tmp, &params, &err) != QUILL_OK) {
        unlink(tmp);
        free(tmp);
        return cli_fail("%s", err.message);
    }
    if (rename(tmp, pos[1]) != 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return cli_fail("quantize: cannot move the finished file into place as %s: %s", pos[1], strerror(e));
    }
    free(tmp);
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
