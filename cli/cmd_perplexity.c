/* quill perplexity: perplexity over a text and KL divergence against a base model's saved
 * log-probabilities, by the reference's method (llama-perplexity) and in its formats, so that
 * numbers and base files from the two tools go together. The text is tokenized once (BOS as the
 * model asks), cut into chunks of the context size; each chunk is evaluated from an empty cache
 * with its first token replaced by BOS (when the model adds one), and only its second half is
 * scored, so that every scored token has at least half a context before it.
 *
 * The base file (--kl-divergence-base): "_logits_", u32 n_ctx, i32 n_vocab, i32 n_chunk, the
 * n_chunk·n_ctx token ids (i32), then per chunk one record per scored token: f32 scale, f32
 * min_log_prob, n_vocab u16 codes padded to an even count, where a token's log-probability is
 * scale·code + min_log_prob, over the 16 nats below the most likely token (lower ones get code 0).
 * Records are written and read one at a time: a 150k vocabulary never needs the file in memory. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int perplexity_usage(FILE *f) {
    fprintf(f,
            "usage: quill perplexity -m MODEL -f TEXT [-c 512] [-b N] [--chunks N] [-t N] [-ctk T] [-ctv T] [--exact]\n"
            "                        [--backend cpu|vulkan] [-ngl N] [--device N] [--json]\n"
            "       quill perplexity -m MODEL -f TEXT --kl-divergence-base BASE [--exact] ...   (write a base)\n"
            "       quill perplexity -m MODEL --kl-divergence-base BASE --kl-divergence ...    (compare with it)\n"
            "  Perplexity as the reference's llama-perplexity computes it: the text in chunks of -c tokens,\n"
            "  each scored on its second half; prints the running [1]x,[2]y,... line and the final\n"
            "  estimate (progress on stderr). -b: tokens per evaluation (default min(c, 512); the numbers\n"
            "  do not depend on it). --chunks: at most N chunks.\n"
            "  --kl-divergence-base BASE alone writes the model's log-probabilities over the text to BASE\n"
            "  (the reference's file format: either tool reads the other's). With --kl-divergence, the\n"
            "  model is compared with BASE on BASE's tokens and context size (-f, when given, must\n"
            "  tokenize to them): the reference's KL-divergence, Δp and same-top statistics.\n"
            "  --exact evaluates with the float64 reference path (slow): a base written so measures only\n"
            "  what an engine's arithmetic adds to the same weights.\n"
            "  -ctk/--cache-type-k, -ctv/--cache-type-v: the KV cache's types (f32 default, f16, bf16, q8_0,\n"
            "  q4_0): against an f32 base, --kl-divergence measures what a cache type adds.\n"
            "  --backend vulkan runs the last -ngl N layers (default all, and the output layer) on the GPU\n"
            "  --device N (quill devices; docs/gpu.md); the exact types give the CPU's numbers bit for bit.\n"
            "  --json prints one JSON object instead of the text report.\n");
    return f == stdout ? 0 : 1;
}

typedef struct {
    const char *model, *text, *base;
    long n_ctx, n_batch, max_chunks, threads;
    bool ctx_given, kld, exact, json;
    quill_type type_k, type_v;
    quill_backend backend;
    long n_gpu_layers, device; /* -ngl (-1: all and the output layer), --device */
} ppl_options;

/* ---------------------------------------------------------------- the base file */

static const char BASE_MAGIC[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};

/* u16 entries of one scored token's record: two floats, then the codes padded to even. */
static size_t record_entries(int32_t n_vocab) { return 2 * (((size_t)n_vocab + 1) / 2) + 4; }

typedef struct {
    FILE *f;
    const char *path;
    int32_t n_ctx, n_vocab, n_chunk;
    int32_t *tokens;    /* [n_chunk · n_ctx] */
    uint16_t *record;   /* one record */
} base_file;

static void base_close(base_file *b) {
    if (b->f) fclose(b->f);
    free(b->tokens);
    free(b->record);
    memset(b, 0, sizeof *b);
}

/* Opens BASE for reading and checks it against the model: the header, the vocabulary, the context
 * size (when -c was given), the token ids, and that the file holds every record it announces. */
static int base_open(base_file *b, const char *path, int32_t model_vocab, const ppl_options *o) {
    memset(b, 0, sizeof *b);
    b->path = path;
    if (!(b->f = fopen(path, "rb"))) return cli_fail("perplexity: cannot open the base file %s: %s", path, strerror(errno));
    char magic[8];
    uint32_t n_ctx;
    int32_t hdr[2];
    if (fread(magic, 1, 8, b->f) != 8 || memcmp(magic, BASE_MAGIC, 8))
        return cli_fail("perplexity: %s is not a base file of log-probabilities (it does not start with \"_logits_\"); "
                        "write one with --kl-divergence-base FILE without --kl-divergence", path);
    if (fread(&n_ctx, 4, 1, b->f) != 1 || fread(hdr, 4, 2, b->f) != 2)
        return cli_fail("perplexity: %s is truncated inside its 20-byte header", path);
    b->n_vocab = hdr[0];
    b->n_chunk = hdr[1];
    if (n_ctx < 4 || n_ctx > (1u << 24))
        return cli_fail("perplexity: %s: its context size %u is out of range (4..%d): the file is damaged", path, n_ctx,
                        1 << 24);
    b->n_ctx = (int32_t)n_ctx;
    if (b->n_vocab != model_vocab)
        return cli_fail("perplexity: %s was computed with a vocabulary of %d tokens, the model has %d: a base file "
                        "compares models that share one tokenizer",
                        path, b->n_vocab, model_vocab);
    if (o->ctx_given && o->n_ctx != b->n_ctx)
        return cli_fail("perplexity: %s was computed with a context of %d tokens, -c %ld was given: KL divergence "
                        "compares the same chunks (use -c %d, or leave -c out)",
                        path, b->n_ctx, o->n_ctx, b->n_ctx);
    if (b->n_chunk < 1) return cli_fail("perplexity: %s announces %d chunks: the file is damaged", path, b->n_chunk);
    const uint64_t scored = (uint64_t)(b->n_ctx - 1 - b->n_ctx / 2);
    const uint64_t expect = 20 + 4 * (uint64_t)b->n_chunk * (uint64_t)b->n_ctx +
                            (uint64_t)b->n_chunk * scored * record_entries(b->n_vocab) * 2;
    struct stat st;
    if (fstat(fileno(b->f), &st)) return cli_fail("perplexity: %s: %s", path, strerror(errno));
    if ((uint64_t)st.st_size != expect)
        return cli_fail("perplexity: %s has %lld bytes, but its header (%d chunks of %d tokens, vocabulary %d) needs "
                        "%llu: the file is %s; write it again",
                        path, (long long)st.st_size, b->n_chunk, b->n_ctx, b->n_vocab, (unsigned long long)expect,
                        (uint64_t)st.st_size < expect ? "truncated" : "longer than its header says (damaged)");
    const size_t n_tok = (size_t)b->n_chunk * (size_t)b->n_ctx;
    if (!(b->tokens = malloc(n_tok * sizeof *b->tokens)) || !(b->record = malloc(record_entries(b->n_vocab) * 2)))
        return cli_fail("perplexity: out of memory for the %zu tokens of %s", n_tok, path);
    if (fread(b->tokens, sizeof *b->tokens, n_tok, b->f) != n_tok)
        return cli_fail("perplexity: %s: cannot read its tokens: %s", path, ferror(b->f) ? strerror(errno) : "truncated");
    for (size_t i = 0; i < n_tok; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= b->n_vocab)
            return cli_fail("perplexity: %s: token %zu is %d, outside the vocabulary (0..%d): the file is damaged", path,
                            i, b->tokens[i], b->n_vocab - 1);
    return 0;
}

/* Writes the header of a new base file. */
static int base_create(base_file *b, const char *path, int32_t n_ctx, int32_t n_vocab, int32_t n_chunk,
                       const int32_t *tokens) {
    memset(b, 0, sizeof *b);
    b->path = path;
    b->n_ctx = n_ctx;
    b->n_vocab = n_vocab;
    b->n_chunk = n_chunk;
    if (!(b->record = calloc(record_entries(n_vocab), 2))) return cli_fail("perplexity: out of memory");
    if (!(b->f = fopen(path, "wb"))) return cli_fail("perplexity: cannot create %s: %s", path, strerror(errno));
    const uint32_t ctx32 = (uint32_t)n_ctx;
    const int32_t hdr[2] = {n_vocab, n_chunk};
    if (fwrite(BASE_MAGIC, 1, 8, b->f) != 8 || fwrite(&ctx32, 4, 1, b->f) != 1 || fwrite(hdr, 4, 2, b->f) != 2 ||
        fwrite(tokens, 4, (size_t)n_chunk * (size_t)n_ctx, b->f) != (size_t)n_chunk * (size_t)n_ctx)
        return cli_fail("perplexity: writing %s: %s", path, strerror(errno));
    return 0;
}

/* ---------------------------------------------------------------- one scored token */

/* The log-softmax of a row, in double: its largest logit (first index on ties) and log Σ exp(l - max). */
typedef struct {
    float max;
    int32_t argmax;
    double log_sum;
} row_norm;

static row_norm normalize_row(const float *l, int32_t n) {
    row_norm r = {l[0], 0, 0};
    for (int32_t i = 1; i < n; i++)
        if (l[i] > r.max) r.max = l[i], r.argmax = i;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp((double)l[i] - r.max);
    r.log_sum = log(sum);
    return r;
}

/* The base record of a row: log-probabilities within 16 nats of the top as 16-bit codes. */
static void encode_record(const float *l, int32_t n, row_norm r, uint16_t *rec) {
    float lo = l[0];
    for (int32_t i = 1; i < n; i++)
        if (l[i] < lo) lo = l[i];
    if (lo < r.max - 16) lo = r.max - 16;
    const float scale = (r.max - lo) / 65535.f, min_log_prob = (float)((double)lo - r.max - r.log_sum);
    memcpy(rec, &scale, 4);
    memcpy(rec + 2, &min_log_prob, 4);
    uint16_t *code = rec + 4;
    for (int32_t i = 0; i < n; i++) {
        if (scale > 0 && l[i] > lo) {
            const float q = rintf((l[i] - lo) / scale);
            code[i] = q >= 65535.f ? 65535 : (uint16_t)q;
        } else {
            code[i] = 0;
        }
    }
}

/* Sums over scored tokens, as the reference keeps them. */
typedef struct {
    double nll, nll2, nll_base, nll_base2, nll_nll_base, kld, kld2, dp, dp2, dp4;
    size_t same_top, count;
} kld_sums;

/* Compares a row with its base record: returns the token's KL divergence (over the base's
 * tokens above -16 nats, the reference's definition) and sets *dp (p - p_base of the right token). */
static double compare_record(const float *l, int32_t n, row_norm r, const uint16_t *rec, int32_t tok, kld_sums *s,
                             float *dp_out) {
    float scale, min_log_prob;
    memcpy(&scale, rec, 4);
    memcpy(&min_log_prob, rec + 2, 4);
    const uint16_t *code = rec + 4;
    const double nll = (double)r.max + r.log_sum - l[tok];
    const double nll_base = -(double)(scale * code[tok] + min_log_prob);
    s->nll += nll;
    s->nll2 += nll * nll;
    s->nll_base += nll_base;
    s->nll_base2 += nll_base * nll_base;
    s->nll_nll_base += nll * nll_base;
    double kld = 0;
    int32_t top_base = 0;
    float top_base_lp = 0;
    const double shift = (double)r.max + r.log_sum;
    for (int32_t i = 0; i < n; i++) {
        const float lp_base = scale * code[i] + min_log_prob;
        if (i == 0 || lp_base > top_base_lp) top_base_lp = lp_base, top_base = i;
        if (lp_base > -16.f) kld += exp((double)lp_base) * ((double)lp_base - ((double)l[i] - shift));
    }
    s->kld += kld;
    s->kld2 += kld * kld;
    s->count++;
    s->same_top += top_base == r.argmax;
    const double dp = exp(-nll) - exp(-nll_base);
    s->dp += dp;
    s->dp2 += dp * dp;
    s->dp4 += dp * dp * dp * dp;
    *dp_out = (float)dp;
    return kld;
}

/* ---------------------------------------------------------------- statistics */

typedef struct {
    double value, error;
} estimate;

/* Mean of the summed values and its standard error (0 with ten values or fewer). */
static estimate mean_error(double sum, double sum2, size_t n) {
    estimate e = {0, 0};
    if (n < 1) return e;
    e.value = sum / (double)n;
    const double var = sum2 / (double)n - e.value * e.value;
    e.error = var > 0 && n > 10 ? sqrt(var / (double)(n - 1)) : 0;
    return e;
}

static double covariance(double a, double b, double ab, size_t n) {
    if (n < 10) return 0;
    return (ab / (double)n - (a / (double)n) * (b / (double)n)) / (double)(n - 1);
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Linear interpolation between the sorted values around fraction·(n-1). */
static double percentile(const float *v, size_t n, double fraction) {
    if (fraction <= 0) return v[0];
    if (fraction >= 1) return v[n - 1];
    const double p = fraction * (double)(n - 1);
    const size_t i = (size_t)p;
    const double t = p - (double)i;
    return (1 - t) * v[i] + t * v[i + 1 < n ? i + 1 : n - 1];
}

static double median(const float *v, size_t n) { return n % 2 ? v[n / 2] : 0.5 * ((double)v[n / 2] + v[n / 2 - 1]); }

/* Everything the report prints, computed once for the text and the JSON forms. */
typedef struct {
    estimate log_ppl, log_ppl_base, kld, dp, dp_mse;
    double ppl, ppl_err, ppl_base, ppl_base_err, cor, ratio_log, ratio_log_err, ratio, ratio_err, diff, diff_err;
    double dp_rms, dp_rms_err, same_top, same_top_err;
} kld_report;

static kld_report kld_summary(const kld_sums *s) {
    kld_report r;
    r.log_ppl = mean_error(s->nll, s->nll2, s->count);
    r.ppl = exp(r.log_ppl.value);
    r.ppl_err = r.ppl * r.log_ppl.error;
    r.log_ppl_base = mean_error(s->nll_base, s->nll_base2, s->count);
    r.ppl_base = exp(r.log_ppl_base.value);
    r.ppl_base_err = r.ppl_base * r.log_ppl_base.error;
    const double cov = covariance(s->nll, s->nll_base, s->nll_nll_base, s->count);
    r.cor = cov / (r.log_ppl.error * r.log_ppl_base.error);
    r.ratio_log = r.log_ppl.value - r.log_ppl_base.value;
    r.ratio_log_err = sqrt(r.log_ppl.error * r.log_ppl.error + r.log_ppl_base.error * r.log_ppl_base.error - 2 * cov);
    r.ratio = exp(r.ratio_log);
    r.ratio_err = r.ratio * r.ratio_log_err;
    r.diff = r.ppl - r.ppl_base;
    r.diff_err = sqrt(r.ppl_err * r.ppl_err + r.ppl_base_err * r.ppl_base_err - 2 * r.ppl * r.ppl_base * cov);
    r.kld = mean_error(s->kld, s->kld2, s->count);
    r.dp = mean_error(s->dp, s->dp2, s->count);
    r.dp_mse = mean_error(s->dp2, s->dp4, s->count);
    r.dp_rms = sqrt(r.dp_mse.value);
    r.dp_rms_err = 0.5 / r.dp_rms * r.dp_mse.error;
    r.same_top = (double)s->same_top / (double)s->count;
    r.same_top_err = s->count > 1 ? sqrt(r.same_top * (1 - r.same_top) / (double)(s->count - 1)) : 0;
    return r;
}

static void print_kld_row(int chunk, const kld_sums *s) {
    const kld_report r = kld_summary(s);
    printf("%4d    %9.4f ± %9.4f    %10.5f ± %10.5f    %10.5f ± %10.5f    %6.3f ± %6.3f %%    %6.3f ± %6.3f %%\n", chunk,
           r.ppl, r.ppl_err, r.ratio_log, r.ratio_log_err, r.kld.value, r.kld.error, 100 * r.dp_rms, 100 * r.dp_rms_err,
           100 * r.same_top, 100 * r.same_top_err);
}

static const struct {
    const char *label, *json;
    double fraction;
} KLD_PERCENTILES[] = {{"99.9%", "p99_9", 0.999}, {"99.0%", "p99", 0.99}, {"95.0%", "p95", 0.95},
                       {"90.0%", "p90", 0.90},    {"10.0%", "p10", 0.10}, {" 5.0%", "p5", 0.05},
                       {" 1.0%", "p1", 0.01},     {" 0.1%", "p0_1", 0.001}},
  DP_PERCENTILES[] = {{"99.9%", "p99_9", 0.999}, {"99.0%", "p99", 0.99}, {"95.0%", "p95", 0.95},
                      {"90.0%", "p90", 0.90},    {"75.0%", "p75", 0.75}, {"25.0%", "p25", 0.25},
                      {"10.0%", "p10", 0.10},    {" 5.0%", "p5", 0.05},  {" 1.0%", "p1", 0.01},
                      {" 0.1%", "p0_1", 0.001}};

/* The reference's three statistics blocks (values sorted). */
static void print_kld_statistics(const kld_sums *s, const float *kld, const float *dp, size_t n) {
    const kld_report r = kld_summary(s);
    printf("====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6f ± %10.6f\n", r.ppl, r.ppl_err);
    printf("Mean PPL(base)                : %10.6f ± %10.6f\n", r.ppl_base, r.ppl_base_err);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n", 100 * r.cor);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f\n", r.ratio_log, r.ratio_log_err);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f\n", r.ratio, r.ratio_err);
    printf("Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f\n", r.diff, r.diff_err);
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %10.6f ± %10.6f\n", r.kld.value, r.kld.error);
    printf("Maximum KLD: %10.6f\n", kld[n - 1]);
    for (size_t i = 0; i < 4; i++)
        printf("%s   KLD: %10.6f\n", KLD_PERCENTILES[i].label, percentile(kld, n, KLD_PERCENTILES[i].fraction));
    printf("Median  KLD: %10.6f\n", median(kld, n));
    for (size_t i = 4; i < 8; i++)
        printf("%s   KLD: %10.6f\n", KLD_PERCENTILES[i].label, percentile(kld, n, KLD_PERCENTILES[i].fraction));
    printf("Minimum KLD: %10.6f\n", kld[0]);
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    Δp: %6.3f ± %5.3f %%\n", 100 * r.dp.value, 100 * r.dp.error);
    printf("Maximum Δp: %6.3f%%\n", 100.0 * dp[n - 1]);
    for (size_t i = 0; i < 5; i++)
        printf("%s   Δp: %6.3f%%\n", DP_PERCENTILES[i].label, 100 * percentile(dp, n, DP_PERCENTILES[i].fraction));
    printf("Median  Δp: %6.3f%%\n", 100 * median(dp, n));
    for (size_t i = 5; i < 10; i++)
        printf("%s   Δp: %6.3f%%\n", DP_PERCENTILES[i].label, 100 * percentile(dp, n, DP_PERCENTILES[i].fraction));
    printf("Minimum Δp: %6.3f%%\n", 100.0 * dp[0]);
    printf("RMS Δp    : %6.3f ± %5.3f %%\n", 100 * r.dp_rms, 100 * r.dp_rms_err);
    printf("Same top p: %6.3f ± %5.3f %%\n", 100 * r.same_top, 100 * r.same_top_err);
}

static void json_number(const char *key, double v, bool comma) {
    if (isfinite(v)) printf("\"%s\": %.17g%s", key, v, comma ? ", " : "");
    else printf("\"%s\": null%s", key, comma ? ", " : "");
}

static void print_kld_json(const kld_sums *s, const float *kld, const float *dp, size_t n) {
    const kld_report r = kld_summary(s);
    printf("\"ppl_base\": {");
    json_number("value", r.ppl_base, true);
    json_number("error", r.ppl_base_err, false);
    printf("}, \"ln_ppl_ratio\": {");
    json_number("value", r.ratio_log, true);
    json_number("error", r.ratio_log_err, false);
    printf("}, ");
    json_number("ppl_correlation", r.cor, true);
    printf("\"kld\": {");
    json_number("mean", r.kld.value, true);
    json_number("error", r.kld.error, true);
    json_number("max", kld[n - 1], true);
    for (size_t i = 0; i < 8; i++) json_number(KLD_PERCENTILES[i].json, percentile(kld, n, KLD_PERCENTILES[i].fraction), true);
    json_number("median", median(kld, n), true);
    json_number("min", kld[0], false);
    printf("}, \"delta_p\": {");
    json_number("mean", r.dp.value, true);
    json_number("error", r.dp.error, true);
    json_number("rms", r.dp_rms, true);
    json_number("rms_error", r.dp_rms_err, true);
    json_number("max", dp[n - 1], true);
    for (size_t i = 0; i < 10; i++) json_number(DP_PERCENTILES[i].json, percentile(dp, n, DP_PERCENTILES[i].fraction), true);
    json_number("median", median(dp, n), true);
    json_number("min", dp[0], false);
    printf("}, \"same_top_p\": {");
    json_number("value", r.same_top, true);
    json_number("error", r.same_top_err, false);
    printf("}, ");
}

/* ---------------------------------------------------------------- the run */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Chunks done, speed and time left: in place on a terminal, else a line every 10 s. */
static void progress(int done, int total, double started, double *last_line) {
    const double t = now_seconds(), elapsed = t - started;
    const bool tty = isatty(STDERR_FILENO);
    if (!tty && done < total && t - *last_line < 10) return;
    *last_line = t;
    fprintf(stderr, "%sperplexity: chunk %d/%d, %.0f s, %.1f s left%s", tty ? "\r" : "", done, total, elapsed,
            done ? elapsed / done * (total - done) : 0.0, tty && done < total ? "   " : "\n");
    fflush(stderr);
}

static int parse_options(int argc, char **argv, ppl_options *o) {
    *o = (ppl_options){.n_ctx = 512, .max_chunks = -1, .n_gpu_layers = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return perplexity_usage(stdout) ? 1 : -1;
        if (!strcmp(a, "--kl-divergence")) o->kld = true;
        else if (!strcmp(a, "--exact")) o->exact = true;
        else if (!strcmp(a, "--json")) o->json = true;
        else {
            if (i + 1 >= argc) return cli_fail("perplexity: %s needs a value (see quill perplexity --help)", a);
            const char *v = argv[++i];
            if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
            else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->text = v;
            else if (!strcmp(a, "--kl-divergence-base") || !strcmp(a, "--save-all-logits")) o->base = v;
            else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k")) {
                if (!cli_parse_cache_type("perplexity", a, v, &o->type_k)) return 1;
            } else if (!strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) {
                if (!cli_parse_cache_type("perplexity", a, v, &o->type_v)) return 1;
            }
            else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
                if (!cli_parse_long(v, 4, 1 << 20, &o->n_ctx)) return cli_fail("perplexity: %s needs a number from 4 to %d", a, 1 << 20);
                o->ctx_given = true;
            } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
                if (!cli_parse_long(v, 1, 1 << 20, &o->n_batch)) return cli_fail("perplexity: %s needs a number from 1 to %d", a, 1 << 20);
            } else if (!strcmp(a, "--chunks")) {
                if (!cli_parse_long(v, -1, INT32_MAX, &o->max_chunks) || o->max_chunks == 0)
                    return cli_fail("perplexity: --chunks needs a positive number (or -1: all)");
            } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
                if (!cli_parse_long(v, 1, 1024, &o->threads)) return cli_fail("perplexity: %s needs a number from 1 to 1024", a);
            } else if (!strcmp(a, "--backend")) {
                if (!cli_parse_backend("perplexity", v, &o->backend)) return 1;
            } else if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "--gpu-layers")) {
                if (!cli_parse_long(v, -1, 1 << 20, &o->n_gpu_layers))
                    return cli_fail("perplexity: %s needs a whole number of layers (-1: all and the output layer)", a);
            } else if (!strcmp(a, "--device")) {
                if (!cli_parse_long(v, 0, 64, &o->device)) return cli_fail("perplexity: --device needs a device number (quill devices)");
            } else {
                return cli_fail("perplexity: unknown option '%s' (see quill perplexity --help)", a);
            }
        }
    }
    if (!o->model) return cli_fail("perplexity: -m MODEL is required");
    if (o->n_gpu_layers > 0 && o->backend == QUILL_BACKEND_CPU)
        fprintf(stderr, "quill: note: -ngl %ld ignored: quill runs on the CPU (--backend vulkan runs layers on a GPU)\n",
                o->n_gpu_layers);
    if (o->kld && !o->base)
        return cli_fail("perplexity: --kl-divergence compares with a base file: give it with --kl-divergence-base FILE");
    if (!o->kld && !o->text) return cli_fail("perplexity: -f TEXT is required (the text to score)");
    return 0;
}

/* The text's tokens as the reference makes them: a trailing newline dropped, BOS as the model asks. */
static int tokenize_text(const char *path, const quill_tokenizer *tok, int32_t **ids, size_t *n) {
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) return cli_fail("perplexity: cannot read %s: %s", path, strerror(errno));
    if (len && text[len - 1] == '\n') text[--len] = 0;
    quill_error err;
    const bool failed = quill_tokenize(tok, text, len, true, false, ids, n, &err) != QUILL_OK;
    free(text);
    return failed ? cli_fail("perplexity: %s", err.message) : 0;
}

int cmd_perplexity(int argc, char **argv) {
    ppl_options o;
    int rc = parse_options(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    rc = 1;

    quill_error err;
    quill_model *m = NULL;
    quill_context *c = NULL;
    int32_t *text_ids = NULL, *chunk = NULL;
    size_t n_text = 0;
    float *logits = NULL, *kld_values = NULL, *dp_values = NULL;
    double *chunk_ppl = NULL;
    base_file base = {0};
    bool writing = o.base && !o.kld;

    if (quill_model_load(o.model, &m, &err)) {
        rc = cli_fail("%s", err.message);
        goto done;
    }
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    const int32_t n_vocab = quill_tokenizer_n_vocab(tok);
    if (quill_tokenizer_add_eos(tok)) {
        rc = cli_fail("perplexity: %s appends EOS to every text (add_eos_token): its chunks would not be plain text, "
                      "and the reference refuses such models too", o.model);
        goto done;
    }
    if (o.text && tokenize_text(o.text, tok, &text_ids, &n_text)) goto done;

    const int32_t *tokens;
    int32_t n_ctx, n_chunk;
    if (o.kld) {
        if (base_open(&base, o.base, n_vocab, &o)) goto done;
        n_ctx = base.n_ctx;
        n_chunk = base.n_chunk;
        tokens = base.tokens;
        const size_t n_base = (size_t)n_chunk * (size_t)n_ctx;
        if (o.text && (n_text < n_base || memcmp(text_ids, tokens, n_base * sizeof *tokens))) {
            rc = cli_fail("perplexity: %s does not tokenize to the tokens of %s (another text, or another tokenizer): "
                          "leave -f out to use the base file's tokens",
                          o.text, o.base);
            goto done;
        }
    } else {
        n_ctx = (int32_t)o.n_ctx;
        if (n_text < 2 * (size_t)n_ctx) {
            rc = cli_fail("perplexity: %s tokenizes to %zu tokens, but a context of %d needs at least %d (two chunks, each "
                          "scored on its second half): give a longer text or a smaller -c",
                          o.text, n_text, n_ctx, 2 * n_ctx);
            goto done;
        }
        n_chunk = (int32_t)(n_text / (size_t)n_ctx);
        tokens = text_ids;
    }
    if (o.max_chunks > 0 && o.max_chunks < n_chunk) n_chunk = (int32_t)o.max_chunks;
    if (writing && base_create(&base, o.base, n_ctx, n_vocab, n_chunk, tokens)) goto done;

    quill_context_params cp = {.n_ctx = n_ctx, .n_threads = (int)o.threads, .reference = o.exact,
                               .type_k = o.type_k, .type_v = o.type_v, .backend = o.backend,
                               .n_gpu_layers = (int)o.n_gpu_layers, .device = (int)o.device};
    if (quill_context_new(m, &cp, &c, &err)) {
        rc = cli_fail("%s", err.message);
        goto done;
    }
    const int32_t first = n_ctx / 2, scored = n_ctx - 1 - first;
    const int32_t n_batch = (int32_t)(o.n_batch ? o.n_batch : (n_ctx < 512 ? n_ctx : 512));
    const int32_t bos = quill_tokenizer_add_bos(tok) ? quill_tokenizer_bos(tok) : -1;
    const size_t n_scored = (size_t)n_chunk * (size_t)scored;
    const int32_t out_rows = n_batch < n_ctx - first ? n_batch : n_ctx - first;
    int32_t *pos = malloc((size_t)n_batch * sizeof *pos), *seq = calloc((size_t)n_batch, sizeof *seq);
    bool *want = malloc((size_t)n_batch * sizeof *want);
    chunk = malloc((size_t)n_ctx * sizeof *chunk);
    logits = malloc((size_t)out_rows * (size_t)n_vocab * sizeof *logits);
    chunk_ppl = malloc((size_t)n_chunk * sizeof *chunk_ppl);
    if (o.kld) {
        kld_values = malloc(n_scored * sizeof *kld_values);
        dp_values = malloc(n_scored * sizeof *dp_values);
    }
    if (!pos || !seq || !want || !chunk || !logits || !chunk_ppl || (o.kld && (!kld_values || !dp_values))) {
        free(pos), free(seq), free(want);
        rc = cli_fail("perplexity: out of memory (%d rows of %d logits)", out_rows, n_vocab);
        goto done;
    }

    const char *gpu_name = NULL;
    int gpu_layers = 0;
    const char *backend_name = quill_context_backend(c, &gpu_name, &gpu_layers);
    fprintf(stderr, "perplexity: %s: %d chunks of %d tokens (the last %d of each scored), kernels %s, KV cache %s/%s%s%s\n",
            o.model, n_chunk, n_ctx, scored, quill_context_kernels(c), quill_type_name(o.type_k),
            quill_type_name(o.type_v), writing ? ", writing " : o.kld ? ", base " : "", o.base ? o.base : "");
    const int gpu_whole_layers = quill_context_gpu_whole_layers(c);
    if (gpu_name)
        fprintf(stderr, "perplexity: %s backend on %s, %d layers there (%s)\n", backend_name, gpu_name, gpu_layers,
                gpu_whole_layers ? "whole" : "their weight products; the rest on the CPU");
    if (!o.json && o.kld)
        printf("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS"
               "            Same top p\n");
    double nll = 0, nll2 = 0;
    size_t count = 0;
    kld_sums sums = {0};
    const double started = now_seconds();
    double last_line = started;
    bool failed = false;
    for (int32_t ci = 0; ci < n_chunk && !failed; ci++) {
        memcpy(chunk, tokens + (size_t)ci * (size_t)n_ctx, (size_t)n_ctx * sizeof *chunk);
        if (bos >= 0) chunk[0] = bos;
        quill_context_truncate(c, 0);
        for (int32_t at = 0; at < n_ctx && !failed; at += n_batch) {
            const int32_t n = n_ctx - at < n_batch ? n_ctx - at : n_batch;
            int32_t n_out = 0;
            for (int32_t k = 0; k < n; k++) {
                pos[k] = at + k;
                want[k] = at + k >= first;
                n_out += want[k];
            }
            quill_batch b = {.n = n, .token = chunk + at, .seq = seq, .pos = pos, .logits = want};
            if (n_out == 0) want[n - 1] = true;  /* (an empty logits request means "the last": ask and ignore) */
            if (quill_decode(c, &b, logits, &err)) {
                failed = true;
                rc = cli_fail("%s", err.message);
                break;
            }
            for (int32_t r = 0; r < n_out; r++) {
                const int32_t p = at + (n - n_out) + r;  /* the outputs are the piece's last n_out positions */
                if (p >= n_ctx - 1) continue;          /* the chunk's last token predicts nothing scored */
                const float *row = logits + (size_t)r * (size_t)n_vocab;
                const int32_t next = tokens[(size_t)ci * (size_t)n_ctx + (size_t)p + 1];
                const row_norm rn = normalize_row(row, n_vocab);
                const double v = (double)rn.max + rn.log_sum - row[next];
                nll += v;
                nll2 += v * v;
                if (writing) {
                    encode_record(row, n_vocab, rn, base.record);
                    if (fwrite(base.record, 2, record_entries(n_vocab), base.f) != record_entries(n_vocab)) {
                        failed = true;
                        rc = cli_fail("perplexity: writing %s: %s", o.base, strerror(errno));
                        break;
                    }
                } else if (o.kld) {
                    if (fread(base.record, 2, record_entries(n_vocab), base.f) != record_entries(n_vocab)) {
                        failed = true;
                        rc = cli_fail("perplexity: %s: cannot read the record of chunk %d, position %d: %s", o.base,
                                      ci + 1, p, ferror(base.f) ? strerror(errno) : "truncated");
                        break;
                    }
                    float scale, min_lp;
                    memcpy(&scale, base.record, 4);
                    memcpy(&min_lp, base.record + 2, 4);
                    if (!isfinite(scale) || !isfinite(min_lp) || scale < 0) {
                        failed = true;
                        rc = cli_fail("perplexity: %s: the record of chunk %d, position %d has scale %g and minimum %g: "
                                      "the file is damaged",
                                      o.base, ci + 1, p, scale, min_lp);
                        break;
                    }
                    kld_values[count] = (float)compare_record(row, n_vocab, rn, base.record, next, &sums, &dp_values[count]);
                }
                count++;
            }
        }
        if (failed) break;
        chunk_ppl[ci] = exp(nll / (double)count);
        if (!o.json) {
            if (o.kld) print_kld_row(ci + 1, &sums);
            else printf("[%d]%.4f,", ci + 1, chunk_ppl[ci]);
            fflush(stdout);
        }
        progress(ci + 1, n_chunk, started, &last_line);
    }
    free(pos), free(seq), free(want);
    if (failed) goto done;
    if (writing && fclose(base.f)) {
        base.f = NULL;
        rc = cli_fail("perplexity: writing %s: %s", o.base, strerror(errno));
        goto done;
    }
    if (writing) base.f = NULL;
    const double seconds = now_seconds() - started;

    const double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
    const double ppl = exp(mean), ppl_err = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) * ppl : 0;
    fprintf(stderr, "perplexity: %zu tokens scored in %.2f s (%.1f tokens/s evaluated)\n", count, seconds,
            (double)n_chunk * n_ctx / seconds);
    if (o.kld) {
        qsort(kld_values, count, sizeof *kld_values, cmp_float);
        qsort(dp_values, count, sizeof *dp_values, cmp_float);
    }
    if (o.json) {
        printf("{\"model\": ");
        cli_json_string(stdout, o.model, strlen(o.model));
        printf(", \"kernels\": \"%s\", \"cache_type_k\": \"%s\", \"cache_type_v\": \"%s\", \"n_ctx\": %d, \"n_chunks\": %d, "
               "\"n_scored\": %zu, ",
               quill_context_kernels(c), quill_type_name(o.type_k), quill_type_name(o.type_v), n_ctx, n_chunk, count);
        printf("\"backend\": \"%s\", ", backend_name);
        if (gpu_name) {
            printf("\"device\": ");
            cli_json_string(stdout, gpu_name, strlen(gpu_name));
            printf(", \"gpu_layers\": %d, \"gpu_whole_layers\": %d, ", gpu_layers, gpu_whole_layers);
        }
        json_number("ppl", ppl, true);
        json_number("ppl_error", ppl_err, true);
        printf("\"chunk_ppl\": [");
        for (int32_t i = 0; i < n_chunk; i++) printf("%s%.17g", i ? ", " : "", chunk_ppl[i]);
        printf("], ");
        if (o.kld) print_kld_json(&sums, kld_values, dp_values, count);
        json_number("seconds", seconds, false);
        printf("}\n");
    } else if (o.kld) {
        printf("\n");
        if (count < 100) fprintf(stderr, "perplexity: %zu scored tokens: too few for statistics (100 or more)\n", count);
        else print_kld_statistics(&sums, kld_values, dp_values, count);
    } else {
        printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, ppl_err);
    }
    rc = 0;
done:
    if (writing && rc && base.f) {
        fclose(base.f);
        base.f = NULL;
        remove(o.base);  /* never leave a half-written base file behind */
    }
    base_close(&base);
    free(text_ids);
    free(chunk);
    free(logits);
    free(kld_values);
    free(dp_values);
    free(chunk_ppl);
    quill_context_free(c);
    quill_model_free(m);
    return rc;
}
