/* Batched decoding speed, measured as the reference's llama-batched-bench measures it, for
 * bench/vs_ref.sh: npl sequences each get a prompt of npp tokens (all in one batch, as the
 * reference's n_batch 512 holds them), then ntg steps each decode one token of every sequence in
 * one quill_decode batch, with logits for each (what a server does per step). Prints one JSON line
 * with the reference's jsonl keys: pp, tg, pl, t_pp, speed_pp, t_tg, speed_tg (tokens of all
 * sequences per second), and cpu_tg, the process's CPU seconds over the steps.
 *
 *   build/quill_batched -m MODEL [-t THREADS] [-npp N] [-ntg N] [-npl N]
 */
#include "quill.h"
#include "quill_model.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now(void) { return clock_s(CLOCK_MONOTONIC); }
/* CPU time of the whole process: on a shared machine, one thread's work apart from the waits for a
 * core (with more threads it counts their spinning too). */
static double cpu_now(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

/* Deterministic ordinary token ids (past the first 100, where control and byte tokens live). */
static int32_t token_at(int seq, int pos, int64_t n_vocab) {
    return (int32_t)(100 + ((uint64_t)seq * 104729u + (uint64_t)pos * 7919u) % (uint64_t)(n_vocab - 100));
}

int main(int argc, char **argv) {
    const char *model = NULL;
    int threads = 2, npp = 128, ntg = 128, npl = 4;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) goto usage;
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "-npp")) npp = atoi(v);
        else if (!strcmp(a, "-ntg")) ntg = atoi(v);
        else if (!strcmp(a, "-npl")) npl = atoi(v);
        else goto usage;
    }
    if (!model || threads < 1 || npp < 1 || ntg < 1 || npl < 1 || npl > 4096) goto usage;

    quill_error err;
    quill_model *m;
    quill_context *c;
    if (quill_model_load(model, &m, &err) != QUILL_OK) {
        fprintf(stderr, "quill_batched: %s\n", err.message);
        return 1;
    }
    const int64_t n_vocab = quill_model_hparams(m)->n_vocab;
    quill_context_params p = {.n_ctx = npp + ntg + 1, .n_threads = threads, .n_seq = npl};
    if (quill_context_new(m, &p, &c, &err) != QUILL_OK) {
        fprintf(stderr, "quill_batched: %s\n", err.message);
        quill_model_free(m);
        return 1;
    }
    const int max_n = npl * npp > npl ? npl * npp : npl;
    int32_t *tok = malloc((size_t)max_n * sizeof *tok), *seq = malloc((size_t)max_n * sizeof *seq),
            *pos = malloc((size_t)max_n * sizeof *pos);
    bool *want = malloc((size_t)max_n * sizeof *want);
    float *logits = malloc((size_t)npl * (size_t)n_vocab * sizeof *logits);
    int rc = 1;
    if (!tok || !seq || !pos || !want || !logits) {
        fprintf(stderr, "quill_batched: out of memory\n");
        goto done;
    }
    /* the prompts: each sequence's last token asks for logits */
    for (int s = 0; s < npl; s++)
        for (int i = 0; i < npp; i++) {
            const int k = s * npp + i;
            tok[k] = token_at(s, i, n_vocab), seq[k] = s, pos[k] = i, want[k] = i == npp - 1;
        }
    double t0 = now();
    quill_batch b = {npl * npp, tok, seq, pos, want};
    if (quill_decode(c, &b, logits, &err) != QUILL_OK) goto failed;
    const double t_pp = now() - t0;
    t0 = now();
    const double c0 = cpu_now();
    for (int step = 0; step < ntg; step++) {
        for (int s = 0; s < npl; s++) tok[s] = token_at(s, npp + step, n_vocab), seq[s] = s, pos[s] = npp + step, want[s] = true;
        b = (quill_batch){npl, tok, seq, pos, want};
        if (quill_decode(c, &b, logits, &err) != QUILL_OK) goto failed;
    }
    const double t_tg = now() - t0, cpu_tg = cpu_now() - c0;
    printf("{\"pp\": %d, \"tg\": %d, \"pl\": %d, \"n_threads\": %d, \"kernels\": \"%s\", \"t_pp\": %.6f, "
           "\"speed_pp\": %.3f, \"t_tg\": %.6f, \"speed_tg\": %.3f, \"cpu_tg\": %.6f}\n",
           npp, ntg, npl, threads, quill_context_kernels(c), t_pp, npl * npp / t_pp, t_tg, (double)npl * ntg / t_tg, cpu_tg);
    rc = 0;
    goto done;
failed:
    fprintf(stderr, "quill_batched: %s\n", err.message);
done:
    free(tok), free(seq), free(pos), free(want), free(logits);
    quill_context_free(c);
    quill_model_free(m);
    return rc;
usage:
    fprintf(stderr, "usage: quill_batched -m MODEL [-t THREADS] [-npp N] [-ntg N] [-npl N (1..4096)]\n");
    return 2;
}
