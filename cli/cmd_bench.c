/* quill bench: prompt-processing and generation speed, like llama-bench, next to the machine's
 * memory read bandwidth — the limit of token generation, which must stream every weight once per
 * token. */
#include "cli.h"
#include "model/recurrent.h"
#include "plain_read.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const char bench_usage[] =
    "usage: quill bench -m MODEL [options]\n"
    "  -p N     prompt processing: evaluate N tokens as one batch (default 512; 0 = skip)\n"
    "  -n N     text generation: N single-token evaluations after a short prompt (default 128; 0 = skip)\n"
    "  -r N     timed repetitions of each test, after one untimed warm-up (default 3)\n"
    "  -t N     threads, for the model and the bandwidth test (default: all online CPUs)\n"
    "  -d N     depth: both tests run after N tokens already in the context (evaluated once,\n"
    "           untimed), as llama-bench's -d: attention then reads N more cached positions\n"
    "  -ctk, --cache-type-k TYPE, -ctv, --cache-type-v TYPE\n"
    "           the KV cache's key and value types: f32 (default), f16, bf16, q8_0, q4_0\n"
    "  --backend cpu|vulkan, -ngl N, --device N\n"
    "           as quill run's: the last N layers (default all) on Vulkan\n"
    "           device N (docs/gpu.md)\n"
    "  --json   print one JSON object instead of the table\n"
    "  --bw-mib N  size of the bandwidth test's buffer in MiB (default 1024, at most a quarter of\n"
    "           the available memory); small buffers partly fit in the caches and read too fast\n"
    "Token ids are deterministic pseudo-random ordinary tokens. Speeds are tokens/s, mean ± sample\n"
    "standard deviation over the repetitions. The bandwidth is the best of 4 multi-threaded passes\n"
    "reading a ~1 GiB buffer; tg's share of it is bytes_per_token × tg t/s / bandwidth. The paired\n"
    "share takes each tg run against the mean of 2 passes just before and 2 just after it (the\n"
    "bandwidth of a shared machine moves within minutes) and gives the median over the runs.\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---------------------------------------------------------------- memory read bandwidth */

typedef struct {
    const uint64_t *words;  /* this thread's slice */
    size_t n_words;
    pthread_barrier_t *start, *done;
    const bool *stop;
    uint64_t sum;
    bool avx2;
} bw_worker;

/* Each pass: wait at `start`, read the slice (or leave when *stop), wait at `done`. */
static void *bw_thread(void *arg) {
    bw_worker *w = arg;
    /* First touch here, so that the pages come from this thread's node and the faults run in parallel. */
    uint64_t *words = (uint64_t *)w->words;
    for (size_t i = 0; i < w->n_words; i++) words[i] = i * 0x9E3779B97F4A7C15ull;
    for (;;) {
        pthread_barrier_wait(w->start);
        if (*w->stop) return NULL;
#ifdef PLAIN_READ_HAVE_AVX2
        if (w->avx2) w->sum += plain_read_avx2(w->words, w->n_words);
        else
#endif
            w->sum += plain_read_scalar(w->words, w->n_words);
        pthread_barrier_wait(w->done);
    }
}

/* Size of the buffer: `want` bytes, or a quarter of the available memory when that is less. */
static size_t bw_buffer_size(size_t want) {
    size_t size = want;
    unsigned long long avail_kb = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &avail_kb) == 1) break;
        fclose(f);
    }
    if (!avail_kb) {
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0) avail_kb = (unsigned long long)pages * (unsigned long long)page / 1024;
    }
    if (avail_kb && avail_kb * 1024 / 4 < size) size = (size_t)(avail_kb * 1024 / 4);
    if (size < ((size_t)16 << 20)) size = want < ((size_t)16 << 20) ? want : (size_t)16 << 20;
    return size;
}

static volatile uint64_t bw_sink;

/* n_threads threads that read their slices of one buffer, a pass whenever asked: the bandwidth
 * can then be read between the generation runs too, in the same seconds as each of them. */
typedef struct {
    int n_threads, started;
    size_t bytes;
    void *buf;
    bw_worker *w;
    pthread_t *tid;
    pthread_barrier_t start, done;
    bool barriers, stop;
} bw_meter;

static void bw_close(bw_meter *b) {
    if (b->started) {
        b->stop = true;
        pthread_barrier_wait(&b->start);
        for (int i = 0; i < b->started; i++) {
            pthread_join(b->tid[i], NULL);
            bw_sink += b->w[i].sum;
        }
    }
    if (b->barriers) {
        pthread_barrier_destroy(&b->start);
        pthread_barrier_destroy(&b->done);
    }
    free(b->w);
    free(b->tid);
    free(b->buf);
    memset(b, 0, sizeof *b);
}

/* A failed bw_open: what it holds is released; the buffer's size stays for the message. */
static bool bw_open_failed(bw_meter *b) {
    const size_t bytes = b->bytes;
    bw_close(b);
    b->bytes = bytes;
    return false;
}

/* Starts the threads over a buffer of about `want` bytes (b->bytes: how many); false on failure,
 * with nothing left to close. */
static bool bw_open(bw_meter *b, int n_threads, size_t want) {
    memset(b, 0, sizeof *b);
    size_t size = bw_buffer_size(want);
    const size_t piece = 64 * (size_t)n_threads; /* every slice a multiple of 64 bytes */
    size -= size % piece;
    b->n_threads = n_threads;
    b->bytes = size;
    if (posix_memalign(&b->buf, (size_t)2 << 20, size)) {
        b->buf = NULL;
        return bw_open_failed(b);
    }
#ifdef MADV_HUGEPAGE
    madvise(b->buf, size, MADV_HUGEPAGE); /* fewer TLB misses; a hint, failure is fine */
#endif
    b->w = calloc((size_t)n_threads, sizeof *b->w);
    b->tid = calloc((size_t)n_threads, sizeof *b->tid);
    if (!b->w || !b->tid || pthread_barrier_init(&b->start, NULL, (unsigned)n_threads + 1)) return bw_open_failed(b);
    if (pthread_barrier_init(&b->done, NULL, (unsigned)n_threads + 1)) {
        pthread_barrier_destroy(&b->start);
        return bw_open_failed(b);
    }
    b->barriers = true;
    bool avx2 = false;
#ifdef PLAIN_READ_HAVE_AVX2
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
#endif
    const size_t slice = size / (size_t)n_threads / sizeof(uint64_t);
    for (int i = 0; i < n_threads; i++) {
        b->w[i] = (bw_worker){(const uint64_t *)b->buf + (size_t)i * slice, slice, &b->start, &b->done, &b->stop, 0, avx2};
        if (pthread_create(&b->tid[i], NULL, bw_thread, &b->w[i])) break;
        b->started++;
    }
    if (b->started < n_threads) {
        /* the others would wait at the first barrier forever: a thread could not start */
        fprintf(stderr, "quill: could not start %d bandwidth threads\n", n_threads);
        exit(1);
    }
    return true;
}

/* One pass over the whole buffer by all the threads, in GB/s (1e9 bytes). */
static double bw_pass(bw_meter *b) {
    pthread_barrier_wait(&b->start);
    const double t0 = now_s();
    pthread_barrier_wait(&b->done);
    const double dt = now_s() - t0;
    return dt > 0 ? (double)b->bytes / dt / 1e9 : 0;
}

/* Best of `passes` streaming reads of the buffer by n_threads threads, in GB/s; 0 on failure. */
static double measure_bandwidth(int n_threads, int passes, size_t want, size_t *buffer_bytes) {
    bw_meter b;
    double best = 0;
    const bool open = bw_open(&b, n_threads, want);
    for (int pass = 0; open && pass < passes; pass++) {
        const double gbs = bw_pass(&b);
        if (gbs > best) best = gbs;
    }
    *buffer_bytes = b.bytes;
    if (open) bw_close(&b);
    return best;
}

/* ---------------------------------------------------------------- model facts */

/* Bytes one generated token reads: every tensor except the embedding table, of which one row is
 * read — unless the output projection reuses it, which reads it whole (counted once) — and of a 3-D
 * expert tensor (*_exps) the share of the experts a token uses (n_used of its ne[2]). */
static uint64_t bytes_per_token(const quill_gguf *g, bool tied, int64_t n_used) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        /* (latent attention's attn_k_b / attn_v_b are 3-D too: one matrix a head, all read) */
        if (t->ne[2] > 1 && n_used > 0 && n_used < t->ne[2] && strstr(t->name, "_exps"))
            total += t->nbytes / (uint64_t)t->ne[2] * (uint64_t)n_used;
        else if (strcmp(t->name, "token_embd.weight") != 0) total += t->nbytes;
        else if (tied) total += t->nbytes;
        else {
            int64_t rows = t->n_elements / (t->ne[0] > 0 ? t->ne[0] : 1);
            total += rows > 0 ? t->nbytes / (uint64_t)rows : t->nbytes;
        }
    }
    return total;
}

typedef struct {
    uint32_t type;
    int count;
    uint64_t bytes;
} type_count;

/* Tensor count per type, largest share of bytes first; returns how many types. */
static int type_mix(const quill_gguf *g, type_count *out, int cap) {
    int n = 0;
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        int k = 0;
        while (k < n && out[k].type != t->type) k++;
        if (k == n) {
            if (n == cap) continue;
            out[n++] = (type_count){t->type, 0, 0};
        }
        out[k].count++;
        out[k].bytes += t->nbytes;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && out[j].bytes > out[j - 1].bytes; j--) {
            type_count tmp = out[j];
            out[j] = out[j - 1];
            out[j - 1] = tmp;
        }
    return n;
}

/* VmRSS and VmHWM from /proc/self/status in kB; -1 when unavailable. */
static void read_memory(long long *rss_kb, long long *hwm_kb) {
    *rss_kb = *hwm_kb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        long long v;
        if (sscanf(line, "VmRSS: %lld kB", &v) == 1) *rss_kb = v;
        else if (sscanf(line, "VmHWM: %lld kB", &v) == 1) *hwm_kb = v;
    }
    fclose(f);
}

/* How much of the model file's mapping is resident in 2 MiB pages (FilePmdMapped / Rss of its
 * mappings in /proc/self/smaps): generation streams every weight once per token, and with 4 KiB
 * pages it takes a TLB miss every 4 KiB. The kernel maps 2 MiB pages only where the page cache
 * holds the file in 2 MiB folios (files written in large pieces, as `quill quantize` writes them,
 * or read in cold, on file systems with large folios), so the same file can measure differently
 * after being copied. -1 when unavailable. */
static double weights_2m_share(const char *model_path, const void *packed, size_t packed_bytes) {
    char *want = realpath(model_path, NULL);
    FILE *f = want ? fopen("/proc/self/smaps", "r") : NULL;
    if (!f) {
        free(want);
        return -1;
    }
    /* the packed copy of the weights, where the context reads one, is anonymous memory: its 2 MiB
     * pages are AnonHugePages */
    const unsigned long long p0 = (uintptr_t)packed, p1 = p0 + packed_bytes;
    long long rss = 0, pmd = 0;
    bool in_model = false, in_packed = false;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        unsigned long long from, to;
        long long v;
        if (sscanf(line, "%llx-%llx ", &from, &to) == 2) { /* a mapping's header: its path follows */
            const char *path = strchr(line, '/');
            size_t len = path ? strcspn(path, "\n") : 0;
            in_model = path && len == strlen(want) && !strncmp(path, want, len);
            in_packed = packed && from < p1 && to > p0;
        } else if ((in_model || in_packed) && sscanf(line, "Rss: %lld kB", &v) == 1) {
            rss += v;
        } else if (in_model && sscanf(line, "FilePmdMapped: %lld kB", &v) == 1) {
            pmd += v;
        } else if (in_packed && sscanf(line, "AnonHugePages: %lld kB", &v) == 1) {
            pmd += v;
        }
    }
    fclose(f);
    free(want);
    return rss > 0 ? (double)pmd / (double)rss : -1;
}

/* ---------------------------------------------------------------- timed tests */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* n deterministic pseudo-random ordinary (non-special) token ids; ids of other types are taken
 * only if the vocabulary seems to have no ordinary ones. The first is BOS when `bos` and the
 * model has one. */
static void make_tokens(const quill_tokenizer *tok, int32_t n_vocab, uint64_t seed, bool bos, int32_t *out, int n) {
    int i = 0;
    if (bos && n > 0 && quill_tokenizer_bos(tok) >= 0) out[i++] = quill_tokenizer_bos(tok);
    for (; i < n; i++) {
        int32_t id = 0;
        for (int tries = 0; tries < 1000; tries++) {
            id = (int32_t)(splitmix64(&seed) % (uint64_t)n_vocab);
            if (quill_tokenizer_token_type(tok, id) == QUILL_TOKEN_NORMAL) break;
        }
        out[i] = id;
    }
}

typedef struct {
    int n;          /* tokens per run (0 = skipped) */
    int runs;
    double *tps;    /* tokens/s of each timed run */
    double mean, sd;
    double *bw;     /* tg: the bandwidth read around each timed run, GB/s (see run_tg) */
} bench_result;

static void summarize(bench_result *r) {
    double s = 0, ss = 0;
    for (int i = 0; i < r->runs; i++) s += r->tps[i];
    r->mean = r->runs ? s / r->runs : 0;
    for (int i = 0; i < r->runs; i++) ss += (r->tps[i] - r->mean) * (r->tps[i] - r->mean);
    r->sd = r->runs > 1 ? sqrt(ss / (r->runs - 1)) : 0;
}

static void progress(const char *what, int n, int run, int runs) {
    if (!isatty(STDERR_FILENO)) return;
    if (run == 0) fprintf(stderr, "\rquill bench: %s%d warm-up   ", what, n);
    else fprintf(stderr, "\rquill bench: %s%d run %d/%d   ", what, n, run, runs);
    fflush(stderr);
}

static void progress_done(void) {
    if (isatty(STDERR_FILENO)) fputs("\r                                        \r", stderr);
}

/* pp: the whole prompt as one batch after the `depth` tokens of the context. Run 0 is the warm-up. */
static quill_status run_pp(quill_context *c, int depth, const int32_t *toks, bench_result *r, float *logits,
                           quill_error *err) {
    for (int run = 0; run <= r->runs; run++) {
        progress("pp", r->n, run, r->runs);
        quill_context_truncate(c, depth);
        double t0 = now_s();
        quill_status s = quill_eval(c, toks, r->n, logits, false, err);
        double dt = now_s() - t0;
        if (s) return s;
        if (run > 0) r->tps[run - 1] = r->n / dt;
    }
    return QUILL_OK;
}

#define TG_PROMPT 4   /* BOS and three tokens, evaluated untimed before each generation run */
#define TG_WARMUP 16  /* the warm-up generates at most this many tokens; pages are hot after pp */

/* Bandwidth passes right before and right after each timed generation run (see run_tg). */
#define TG_BW_PASSES 2

/* The sum of TG_BW_PASSES passes, after the pool's threads have gone to sleep: they spin a
 * fraction of a millisecond after each evaluation, and would share the cores with the meter's. */
static double settled_passes(bw_meter *meter) {
    nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
    double sum = 0;
    for (int i = 0; i < TG_BW_PASSES; i++) sum += bw_pass(meter);
    return sum;
}

/* tg: n single-token evaluations after the `depth` tokens of the context, or after a short
 * untimed prompt when the depth is 0. With a meter, each timed run is framed by TG_BW_PASSES
 * bandwidth passes on either side, untimed, and r->bw gets their mean: a share of the bandwidth
 * from figures taken seconds apart, where these machines' bandwidth moves by 2x in minutes. */
static quill_status run_tg(quill_context *c, int depth, const int32_t *prompt, const int32_t *toks, bench_result *r,
                           float *logits, bw_meter *meter, quill_error *err) {
    for (int run = 0; run <= r->runs; run++) {
        progress("tg", r->n, run, r->runs);
        quill_context_truncate(c, depth);
        quill_status s = depth ? QUILL_OK : quill_eval(c, prompt, TG_PROMPT, logits, false, err);
        if (s) return s;
        int n = run == 0 && r->n > TG_WARMUP ? TG_WARMUP : r->n;
        double around = 0;
        const bool metered = run > 0 && meter;
        if (metered) around += settled_passes(meter);
        double t0 = now_s();
        for (int i = 0; i < n; i++)
            if ((s = quill_eval(c, &toks[i], 1, logits, false, err))) return s;
        double dt = now_s() - t0;
        if (metered) around += settled_passes(meter);
        if (run > 0) r->tps[run - 1] = n / dt;
        if (run > 0 && meter) r->bw[run - 1] = around / (2 * TG_BW_PASSES);
    }
    return QUILL_OK;
}

/* The median of each run's share of the bandwidth read around it; 0 without those figures. */
static double paired_share(const bench_result *r, uint64_t bytes_per_token) {
    if (!r->bw || !r->runs) return 0;
    double share[1000]; /* -r is at most 1000 */
    int n = 0;
    for (int i = 0; i < r->runs && n < 1000; i++) {
        if (r->bw[i] <= 0) return 0;
        const double v = (double)bytes_per_token * r->tps[i] / (r->bw[i] * 1e9);
        int j = n++;
        for (; j > 0 && share[j - 1] > v; j--) share[j] = share[j - 1];
        share[j] = v;
    }
    return n % 2 ? share[n / 2] : (share[n / 2 - 1] + share[n / 2]) / 2;
}

/* ---------------------------------------------------------------- output */

static void json_result(FILE *f, const char *key, const bench_result *r) {
    fprintf(f, "  \"%s\": ", key);
    if (!r->n) {
        fputs("null,\n", f);
        return;
    }
    fprintf(f, "{\"n\": %d, \"mean\": %.4f, \"sd\": %.4f, \"runs\": [", r->n, r->mean, r->sd);
    for (int i = 0; i < r->runs; i++) fprintf(f, "%s%.4f", i ? ", " : "", r->tps[i]);
    fputs("]},\n", f);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

/* Characters, not bytes, of a UTF-8 string ("±" is one). */
static int text_width(const char *s) {
    int w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

/* A Markdown table, as llama-bench prints: the first three columns left-aligned, the rest right. */
static void print_table(const char *rows[][6], int n_rows) {
    int width[6] = {0};
    for (int r = 0; r < n_rows; r++)
        for (int c = 0; c < 6; c++)
            if (text_width(rows[r][c]) > width[c]) width[c] = text_width(rows[r][c]);
    for (int r = 0; r < n_rows; r++) {
        for (int c = 0; c < 6; c++) {
            int pad = width[c] - text_width(rows[r][c]);
            printf("| %*s%s%*s ", c < 3 ? 0 : pad, "", rows[r][c], c < 3 ? pad : 0, "");
        }
        puts("|");
        if (r == 0) {
            for (int c = 0; c < 6; c++) {
                printf("| ");
                for (int i = 0; i < width[c] - (c >= 3); i++) putchar('-');
                printf("%s ", c >= 3 ? ":" : "");
            }
            puts("|");
        }
    }
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    long p = 512, n = 128, reps = 3, threads = 0, bw_mib = 1024, depth = 0;
    bool json = false;
    quill_type type_k = QUILL_TYPE_F32, type_v = QUILL_TYPE_F32;
    quill_backend backend = QUILL_BACKEND_CPU;
    long ngl = -1, device = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(bench_usage, stdout);
            return 0;
        }
        const bool cache_k = !strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k");
        if (cache_k || !strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) {
            if (i + 1 >= argc) return cli_fail("option %s needs a value (see quill bench --help)", a);
            if (!cli_parse_cache_type("bench", a, argv[++i], cache_k ? &type_k : &type_v)) return 1;
            continue;
        }
        if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        if (!strcmp(a, "--backend")) {
            if (i + 1 >= argc) return cli_fail("option %s needs a value (see quill bench --help)", a);
            if (!cli_parse_backend("bench", argv[++i], &backend)) return 1;
            continue;
        }
        if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "--device")) {
            const bool is_ngl = strcmp(a, "--device") != 0;
            if (i + 1 >= argc || !cli_parse_long(argv[++i], is_ngl ? -1 : 0, is_ngl ? 1 << 20 : 64, is_ngl ? &ngl : &device))
                return cli_fail("bench: %s needs a whole number (-ngl: -1 for all; --device: quill devices)", a);
            continue;
        }
        bool is_model = !strcmp(a, "-m") || !strcmp(a, "--model");
        if (!is_model && strcmp(a, "-p") && strcmp(a, "-n") && strcmp(a, "-r") && strcmp(a, "-t") &&
            strcmp(a, "-d") && strcmp(a, "--bw-mib")) {
            if (a[0] == '-') return cli_fail("unknown option '%s' (see quill bench --help)", a);
            return cli_fail("unexpected argument '%s': give the model with -m (see quill bench --help)", a);
        }
        if (i + 1 >= argc) return cli_fail("option %s needs a value (see quill bench --help)", a);
        const char *v = argv[++i];
        if (is_model) {
            model = v;
            continue;
        }
        long lo = 0, hi = 1 << 20, *dst = &p;
        if (!strcmp(a, "-n")) dst = &n;
        else if (!strcmp(a, "-r")) lo = 1, hi = 1000, dst = &reps;
        else if (!strcmp(a, "-t")) lo = 1, hi = 1024, dst = &threads;
        else if (!strcmp(a, "-d")) dst = &depth;
        else if (!strcmp(a, "--bw-mib")) lo = 1, hi = 1 << 20, dst = &bw_mib;
        if (!cli_parse_long(v, lo, hi, dst))
            return cli_fail("%s: '%s' is not a whole number in %ld..%ld", a, v, lo, hi);
    }
    if (!model) return cli_fail("no model given: use -m MODEL.gguf (see quill bench --help)");
    if (p == 0 && n == 0) return cli_fail("-p 0 and -n 0: nothing to measure");
    if (threads == 0) {
        threads = sysconf(_SC_NPROCESSORS_ONLN);
        if (threads < 1) threads = 1;
        if (threads > 1024) threads = 1024;
    }

    quill_error err = {0};
    quill_model *m = NULL;
    quill_context *c = NULL;
    int32_t *pp_toks = NULL, *tg_toks = NULL, *depth_toks = NULL;
    float *logits = NULL;
    bench_result pp = {(int)p, (int)reps, NULL, 0, 0, NULL}, tg = {(int)n, (int)reps, NULL, 0, 0, NULL};
    int rc = 1;

    double t0 = now_s();
    if (quill_model_load(model, &m, &err)) return cli_fail("%s", err.message);
    double load_ms = (now_s() - t0) * 1e3;

    const quill_hparams *hp = quill_model_hparams(m);
    const quill_gguf *g = quill_model_gguf(m);
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    const int32_t n_vocab = quill_tokenizer_n_vocab(tok);
    const int n_ctx = (int)depth + (int)(p > n + TG_PROMPT ? p : n + TG_PROMPT) + 16;
    const uint64_t file_bytes = quill_gguf_file_size(g);
    /* (the layers with a KV cache: a hybrid's DeltaNet layers have none) */
    quill_context_params cp = {.n_ctx = n_ctx, .n_threads = (int)threads, .type_k = type_k, .type_v = type_v,
                               .backend = backend, .n_gpu_layers = (int)ngl, .device = (int)device};
    const uint64_t kv_bytes = (uint64_t)quill_context_kv_bytes(m, &cp);
    /* the hybrids' recurrent state and its checkpoints (0 for the others) */
    const uint64_t state_bytes = (uint64_t)quill_recurrent_bytes(m, 1, n_ctx, false);
    char used_key[96];
    int64_t n_used = 0;
    snprintf(used_key, sizeof used_key, "%s.expert_used_count", hp->arch);
    if (quill_gguf_get_i64(g, used_key, &n_used, NULL) != QUILL_OK) n_used = 0;
    const uint64_t bpt = bytes_per_token(g, hp->tied_output, n_used);
    type_count types[QUILL_TYPE_COUNT];
    const int n_types = type_mix(g, types, QUILL_TYPE_COUNT);

    t0 = now_s();
    if (quill_context_new(m, &cp, &c, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    /* the first context of a model may copy its weights into its kernels' layout (a MoE model's
     * experts by a thread of their own, which the runs below must not overlap) */
    const double context_ms = (now_s() - t0) * 1e3;
    quill_context_wait_layout(c);
    const double layout_ms = (now_s() - t0) * 1e3;
    const void *packed = NULL;
    size_t packed_bytes = 0;
    const char *layout = quill_context_weight_layout(c, &packed, &packed_bytes);
    pp_toks = malloc(((size_t)p + 1) * sizeof *pp_toks);
    tg_toks = malloc(((size_t)n + TG_PROMPT) * sizeof *tg_toks);
    depth_toks = malloc(((size_t)depth + 1) * sizeof *depth_toks);
    logits = malloc((size_t)n_vocab * sizeof *logits);
    pp.tps = calloc((size_t)reps, sizeof *pp.tps);
    tg.tps = calloc((size_t)reps, sizeof *tg.tps);
    if (!pp_toks || !tg_toks || !depth_toks || !logits || !pp.tps || !tg.tps) {
        cli_fail("out of memory");
        goto done;
    }
    /* BOS opens the context: the depth's first token, or else each test's */
    make_tokens(tok, n_vocab, 3, true, depth_toks, (int)depth);
    make_tokens(tok, n_vocab, 1, depth == 0, pp_toks, (int)p);
    make_tokens(tok, n_vocab, 2, depth == 0, tg_toks, (int)n + TG_PROMPT);

    /* The depth is evaluated once, in batches of at most 512 tokens as a long prompt would be;
     * each run then truncates the context back to it. */
    for (long at = 0; at < depth; at += 512) {
        if (isatty(STDERR_FILENO)) fprintf(stderr, "\rquill bench: depth %ld/%ld   ", at, depth);
        const int len = depth - at < 512 ? (int)(depth - at) : 512;
        if (quill_eval(c, depth_toks + at, len, logits, false, &err)) {
            progress_done();
            cli_fail("evaluating the depth: %s", err.message);
            goto done;
        }
    }
    if (pp.n && run_pp(c, (int)depth, pp_toks, &pp, logits, &err)) {
        progress_done();
        cli_fail("prompt processing: %s", err.message);
        goto done;
    }
    /* the engine's peak (load, packing, prompts): read before the generation runs' bandwidth meter
     * allocates its buffer (1 GiB by default), which is not the engine's memory */
    long long rss_kb, hwm_kb, after_hwm_kb;
    read_memory(&rss_kb, &hwm_kb);
    if (tg.n) {
        /* the meter's buffer and threads exist only around the generation runs */
        bw_meter meter;
        const bool metered = (tg.bw = calloc((size_t)reps, sizeof *tg.bw)) && bw_open(&meter, (int)threads, (size_t)bw_mib << 20);
        const quill_status s = run_tg(c, (int)depth, tg_toks, tg_toks + TG_PROMPT, &tg, logits, metered ? &meter : NULL, &err);
        if (metered) {
            bw_close(&meter);
        } else {
            free(tg.bw);
            tg.bw = NULL;
        }
        if (s) {
            progress_done();
            cli_fail("text generation: %s", err.message);
            goto done;
        }
    }
    summarize(&pp);
    summarize(&tg);
    read_memory(&rss_kb, &after_hwm_kb);   /* after_hwm_kb includes the meter's buffer */
    if (rss_kb > hwm_kb) hwm_kb = rss_kb;
    const double pages_2m = weights_2m_share(model, packed, packed_bytes);
    const char *kernels = quill_context_kernels(c); /* a static name: outlives the context */
    const char *gpu_name;
    int gpu_layers;
    const char *backend_name = quill_context_backend(c, &gpu_name, &gpu_layers); /* (static too) */
    const int gpu_whole_layers = quill_context_gpu_whole_layers(c);
    char device_name[256] = "";
    if (gpu_name) snprintf(device_name, sizeof device_name, "%s", gpu_name);
    /* Free the context (and its worker threads) first: nothing may compete with the bandwidth test. */
    quill_context_free(c);
    c = NULL;

    if (isatty(STDERR_FILENO)) fputs("\rquill bench: memory bandwidth          ", stderr);
    size_t bw_bytes = 0;
    double bw = measure_bandwidth((int)threads, 4, (size_t)bw_mib << 20, &bw_bytes);
    progress_done();
    if (bw <= 0) {
        cli_fail("could not measure the memory bandwidth (%.0f MiB buffer)", mib((double)bw_bytes));
        goto done;
    }
    const double share = tg.n ? (double)bpt * tg.mean / (bw * 1e9) : 0;
    const double share_paired = paired_share(&tg, bpt);

    if (json) {
        printf("{\n  \"model\": ");
        cli_json_string(stdout, model, strlen(model));
        printf(",\n  \"file_bytes\": %llu,\n  \"types\": {", (unsigned long long)file_bytes);
        for (int i = 0; i < n_types; i++) printf("%s\"%s\": %d", i ? ", " : "", quill_type_name(types[i].type), types[i].count);
        printf("},\n  \"threads\": %ld,\n  \"depth\": %ld,\n  \"n_ctx\": %d,\n", threads, depth, n_ctx);
        json_result(stdout, "pp", &pp);
        json_result(stdout, "tg", &tg);
        printf("  \"bandwidth_gbs\": %.4f,\n  \"bandwidth_buffer_bytes\": %zu,\n", bw, bw_bytes);
        printf("  \"bytes_per_token\": %llu,\n", (unsigned long long)bpt);
        if (tg.n) printf("  \"tg_roofline_share\": %.6f,\n", share);
        else printf("  \"tg_roofline_share\": null,\n");
        if (share_paired > 0) {
            printf("  \"tg_paired_share\": %.6f,\n  \"tg_bandwidth_around_gbs\": [", share_paired);
            for (int i = 0; i < tg.runs; i++) printf("%s%.4f", i ? ", " : "", tg.bw[i]);
            printf("],\n");
        } else {
            printf("  \"tg_paired_share\": null,\n  \"tg_bandwidth_around_gbs\": null,\n");
        }
        printf("  \"kernels\": \"%s\",\n", kernels);
        printf("  \"backend\": \"%s\",\n", backend_name);
        if (device_name[0]) {
            printf("  \"device\": ");
            cli_json_string(stdout, device_name, strlen(device_name));
            printf(",\n  \"gpu_layers\": %d,\n  \"gpu_whole_layers\": %d,\n", gpu_layers, gpu_whole_layers);
        }
        if (pages_2m >= 0) printf("  \"weights_2m_share\": %.4f,\n", pages_2m);
        else printf("  \"weights_2m_share\": null,\n");
        printf("  \"load_ms\": %.3f,\n", load_ms);
        printf("  \"context_ms\": %.3f,\n", context_ms);
        printf("  \"layout_complete_ms\": %.3f,\n", layout_ms);
        if (layout) printf("  \"weight_layout\": \"%s\",\n", layout);
        else printf("  \"weight_layout\": null,\n");
        if (rss_kb >= 0) printf("  \"rss_mb\": %.2f,\n", rss_kb / 1024.0);
        else printf("  \"rss_mb\": null,\n");
        if (hwm_kb >= 0) printf("  \"hwm_mb\": %.2f,\n", hwm_kb / 1024.0);
        else printf("  \"hwm_mb\": null,\n");
        if (state_bytes) printf("  \"recurrent_state_bytes\": %llu,\n", (unsigned long long)state_bytes);
        printf("  \"cache_type_k\": \"%s\",\n  \"cache_type_v\": \"%s\",\n", quill_type_name(type_k),
               quill_type_name(type_v));
        printf("  \"kv_bytes\": %llu\n}\n", (unsigned long long)kv_bytes);
    } else {
        char mix[512];
        size_t len = 0;
        mix[0] = 0;
        for (int i = 0; i < n_types && len < sizeof mix; i++)
            len += (size_t)snprintf(mix + len, sizeof mix - len, "%s%s %d", i ? ", " : "", quill_type_name(types[i].type),
                                    types[i].count);
        char size[32], thr[16], test[2][32], tps[2][48];
        snprintf(size, sizeof size, "%.2f MiB", mib((double)file_bytes));
        snprintf(thr, sizeof thr, "%ld", threads);
        const bench_result *rs[2] = {&pp, &tg};
        const char *rows[3][6] = {{"model", "size", "types", "threads", "test", "t/s"}};
        int n_rows = 1;
        for (int k = 0; k < 2; k++) {
            if (!rs[k]->n) continue;
            if (depth) snprintf(test[k], sizeof test[k], "%s%d @ d%ld", k ? "tg" : "pp", rs[k]->n, depth);
            else snprintf(test[k], sizeof test[k], "%s%d", k ? "tg" : "pp", rs[k]->n);
            snprintf(tps[k], sizeof tps[k], "%.2f ± %.2f", rs[k]->mean, rs[k]->sd);
            const char *row[6] = {base_name(model), size, mix, thr, test[k], tps[k]};
            memcpy(rows[n_rows++], row, sizeof row);
        }
        print_table(rows, n_rows);
        printf("\nmemory bandwidth  %.2f GB/s  (read, %ld threads, %.0f MiB buffer, best of 4)\n", bw, threads,
               mib((double)bw_bytes));
        printf("bytes per token   %.2f MB  (all weights but one row of token_embd%s%s)\n", bpt / 1e6,
               hp->tied_output ? "; it is the output too, read in full" : "",
               n_used > 0 ? "; of the experts, the share a token uses" : "");
        if (tg.n)
            printf("tg roofline       %.1f %% of the bandwidth limit (%.2f t/s at %.2f GB/s)\n", share * 100,
                   bw * 1e9 / (double)bpt, bw);
        if (share_paired > 0)
            printf("tg paired share   %.1f %%  (median over the runs of each run's share of the bandwidth read\n"
                   "                  just around it: %d passes before and %d after)\n",
                   share_paired * 100, TG_BW_PASSES, TG_BW_PASSES);
        printf("kernels           %s\n", kernels);
        if (pages_2m >= 0)
            printf("2 MiB pages       %.1f %% of the weights read (the rest in 4 KiB pages)\n", pages_2m * 100);
        printf("model load        %.1f ms\n", load_ms);
        if (layout)
            printf("context           %.1f ms, the copy complete after %.1f ms  (the weights copied into the %s "
                   "layout: %.1f MiB)\n",
                   context_ms, layout_ms, layout, mib((double)packed_bytes));
        else
            printf("context           %.1f ms  (the weights read in the file's layout)\n", context_ms);
        if (rss_kb >= 0 && state_bytes)
            printf("resident memory   %.1f MiB now, %.1f MiB peak  (file %.1f MiB + KV cache %.1f MiB (%s/%s) + "
                   "recurrent state and checkpoints %.1f MiB = %.1f MiB)\n",
                   rss_kb / 1024.0, hwm_kb / 1024.0, mib((double)file_bytes), mib((double)kv_bytes),
                   quill_type_name(type_k), quill_type_name(type_v),
                   mib((double)state_bytes), mib((double)(file_bytes + kv_bytes + state_bytes)));
        else if (rss_kb >= 0)
            printf("resident memory   %.1f MiB now, %.1f MiB peak  (file %.1f MiB + KV cache %.1f MiB (%s/%s) = %.1f "
                   "MiB)\n",
                   rss_kb / 1024.0, hwm_kb / 1024.0, mib((double)file_bytes), mib((double)kv_bytes),
                   quill_type_name(type_k), quill_type_name(type_v),
                   mib((double)(file_bytes + kv_bytes)));
    }
    rc = 0;

done:
    quill_context_free(c);
    quill_model_free(m);
    free(pp_toks);
    free(tg_toks);
    free(depth_toks);
    free(logits);
    free(pp.tps);
    free(tg.tps);
    free(tg.bw);
    return rc;
}
