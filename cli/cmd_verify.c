/* quill verify: evaluates a prompt on the fast path and on the float64 reference path, traces
 * both, and prints each layer's error and the first tensor beyond tolerance — or "ok" with the
 * logits' error against float64. One command that shows a model file runs right on this machine. */
#include "cli.h"
#include "options.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int verify_usage(FILE *f) {
    fprintf(f,
            "usage: quill verify -m MODEL [-p PROMPT | --tokens 1,2,3] [-t N] [--tol T] [--no-bos]\n"
            "  Evaluates the prompt with the fast kernels and with the float64 reference path (plain\n"
            "  loops: slow on big models, keep the prompt short), compares every intermediate tensor,\n"
            "  and prints each layer's largest error (max |fast - float64| / max |float64| of its\n"
            "  worst tensor). Exit status 0 with \"ok\" when every tensor and the logits are within\n"
            "  --tol (default 0.01: quantized products move tensors by up to ~6e-3, a wrong weight or\n"
            "  kernel by their own size), 1 naming the first tensor beyond it.\n");
    return f == stdout ? 0 : 1;
}

/* The layer a trace name belongs to ("ffn_out-3" → 3), or -1 for the input and output. */
static long layer_of(const char *name) {
    const char *dash = strrchr(name, '-');
    if (!dash || !dash[1]) return -1;
    char *end;
    long l = strtol(dash + 1, &end, 10);
    return *end || l < 0 ? -1 : l;
}

typedef struct {
    quill_context *c;
    quill_trace_recorder *r;
    float *logits;
} pass;

static int run_pass(quill_model *m, bool reference, long threads, const int32_t *ids, size_t n, pass *p) {
    quill_error err;
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    quill_context_params cp = {.n_ctx = (int)n, .n_threads = (int)threads, .reference = reference};
    if (quill_context_new(m, &cp, &p->c, &err)) return cli_fail("%s", err.message);
    if (!(p->r = quill_trace_recorder_new()) || !(p->logits = malloc(n * (size_t)nv * sizeof(float))))
        return cli_fail("out of memory");
    quill_context_set_trace(p->c, quill_trace_record, p->r);
    if (quill_eval(p->c, ids, (int)n, p->logits, true, &err)) return cli_fail("%s", err.message);
    return 0;
}

int cmd_verify(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *tokens = NULL;
    long threads = 0;
    double tol = 1e-2;
    bool no_bos = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return verify_usage(stdout);
        if (!strcmp(a, "--no-bos")) {
            no_bos = true;
            continue;
        }
        if (i + 1 >= argc) return cli_fail("verify: %s needs a value (see quill verify --help)", a);
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_parse_long(v, 1, 1024, &threads)) return cli_fail("verify: %s needs a number from 1 to 1024", a);
        } else if (!strcmp(a, "--tol")) {
            if (!cli_parse_double(v, 0, 1e6, &tol)) return cli_fail("verify: --tol needs a number from 0 to 1e6");
        } else {
            return cli_fail("verify: unknown option '%s' (see quill verify --help)", a);
        }
    }
    if (!model) return cli_fail("verify: -m MODEL is required");
    if (prompt && tokens) return cli_fail("verify: give -p or --tokens, not both");

    quill_error err;
    quill_model *m = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    pass fast = {0}, ref = {0};
    quill_trace_diff *d = NULL;
    int rc = 1;
    if (tokens) {
        if (cli_parse_token_list(tokens, &ids, &n)) return 1;
    }
    if (quill_model_load(model, &m, &err)) {
        rc = cli_fail("%s", err.message);
        goto done;
    }
    if (!tokens) {
        const char *text = prompt ? prompt : "The quick brown fox jumps over the lazy dog.";
        if (quill_tokenize(quill_model_tokenizer(m), text, strlen(text), !no_bos, false, &ids, &n, &err)) {
            rc = cli_fail("%s", err.message);
            goto done;
        }
    }
    if (n == 0) {
        rc = cli_fail("verify: the prompt has no tokens");
        goto done;
    }
    const quill_hparams *hp = quill_model_hparams(m);
    if (run_pass(m, false, threads, ids, n, &fast) || run_pass(m, true, threads, ids, n, &ref)) goto done;
    printf("verify: %s: %s, %lld layers, %zu prompt tokens; kernels %s against the float64 path, tolerance %g\n",
           model, hp->arch, (long long)hp->n_layer, n, quill_context_kernels(fast.c), tol);

    size_t nd;
    int64_t bad;
    if (quill_trace_compare_recorded(fast.r, ref.r, tol, &d, &nd, &bad, &err)) {
        rc = cli_fail("%s", err.message);
        goto done;
    }
    /* each layer's worst tensor, in forward order (the diffs are sorted that way) */
    printf("%-8s %12s  %s\n", "layer", "max rel err", "worst tensor");
    for (size_t i = 0; i < nd;) {
        const long layer = layer_of(d[i].name);
        size_t worst = i, j = i;
        for (; j < nd && layer_of(d[j].name) == layer; j++)
            if (!(d[j].rel <= d[worst].rel)) worst = j;
        char label[32];
        if (layer >= 0) snprintf(label, sizeof label, "%ld", layer);
        else snprintf(label, sizeof label, "%s", i == 0 ? "input" : "output");
        printf("%-8s %12.3g  %s\n", label, d[worst].rel, d[worst].name);
        i = j;
    }
    const size_t count = n * (size_t)hp->n_vocab;
    double max_ref = 0, max_diff = 0, se = 0, sr = 0;
    for (size_t k = 0; k < count; k++) {
        const double diff = fabs((double)fast.logits[k] - ref.logits[k]);
        if (fabs(ref.logits[k]) > max_ref) max_ref = fabs(ref.logits[k]);
        if (!(diff <= max_diff)) max_diff = diff;
        se += diff * diff;
        sr += (double)ref.logits[k] * ref.logits[k];
    }
    const double logits_rel = max_ref > 0 ? max_diff / max_ref : max_diff, logits_rms = sr > 0 ? sqrt(se / sr) : 0;
    printf("%-8s %12.3g  (rms %.3g)\n", "logits", logits_rel, logits_rms);
    if (bad >= 0) {
        const long layer = layer_of(d[bad].name);
        printf("FAIL: %s (layer %ld) is the first tensor beyond %g: max rel error %.3g (max abs %.3g of %.3g)\n",
               d[bad].name, layer, tol, d[bad].rel, d[bad].max_abs, d[bad].max_ref);
    } else if (!(logits_rel <= tol)) {
        printf("FAIL: the logits are %.3g from float64 (tolerance %g)\n", logits_rel, tol);
    } else {
        printf("ok: %zu tensors within %g; logits within %.3g of float64 (relative to the largest, rms %.3g)\n", nd, tol,
               logits_rel, logits_rms);
        rc = 0;
    }
done:
    free(d);
    free(ids);
    pass *passes[2] = {&fast, &ref};
    for (int i = 0; i < 2; i++) {
        quill_context_free(passes[i]->c);
        quill_trace_recorder_free(passes[i]->r);
        free(passes[i]->logits);
    }
    quill_model_free(m);
    return rc;
}
