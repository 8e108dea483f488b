/* quill run: prompt in, streamed text out. quill tokenize: text to ids and pieces. */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char run_usage[] =
    "usage: quill run -m MODEL (-p PROMPT | --tokens ID,ID,...) [options]\n"
    "  -n N                 tokens to generate (default 128; 0 = only evaluate the prompt)\n"
    "  -c N                 context length (default: the model's, at most 4096)\n"
    "  -t N                 threads (default: all cores)\n"
    "  --temp T             temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K  --top-p P  --min-p P  --repeat-penalty R  --repeat-last-n N\n"
    "  --seed S             random seed (default 0)\n"
    "  --no-bos             do not add the BOS token\n"
    "  --special            parse special-token text such as </s> in the prompt\n"
    "  --tokens 1,2,3       evaluate exactly these ids (no tokenizer, no BOS)\n"
    "  --chat               send the prompt as one user turn through the chat template\n"
    "  --system TEXT        system message (with --chat)\n"
    "  --chat-template FILE use this Jinja template instead of the model's\n"
    "  --chat-format NAME   built-in template for models without one (chatml, llama2, ...)\n"
    "  --reference          float64 reference forward pass (slow; for verification)\n"
    "  --json               print one JSON object instead of streaming text\n"
    "  --logits FILE        write float32 logits of every prompt position\n"
    "  --trace FILE.gguf    write the intermediate tensors of the prompt pass\n";

/* Options shared by run and tokenize. */
typedef struct {
    const char *model, *prompt, *tokens, *logits_path, *trace_path, *system, *template_path, *format;
    long n_predict, n_ctx, n_threads;
    quill_sampler_params sp;
    bool no_bos, special, reference, json, chat;
} run_opts;

static int parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids) return cli_fail("out of memory");
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(*ids);
            return cli_fail("--tokens: '%s' is not a comma-separated list of token ids", s);
        }
        if (*n == cap) {
            int32_t *grown = realloc(*ids, (cap *= 2) * sizeof **ids);
            if (!grown) { free(*ids); return cli_fail("out of memory"); }
            *ids = grown;
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) {
        free(*ids);
        return cli_fail("--tokens: no token ids given");
    }
    return 0;
}

/* Returns 0 and fills opts, or an exit code (2 for --help handled). */
static int parse_run_opts(int argc, char **argv, run_opts *o, const char *usage) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->sp = quill_sampler_defaults();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return -1;
        }
        bool flag = true;
        if (!strcmp(a, "--no-bos")) o->no_bos = true;
        else if (!strcmp(a, "--special")) o->special = true;
        else if (!strcmp(a, "--reference")) o->reference = true;
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--chat")) o->chat = true;
        else flag = false;
        if (flag) continue;
        static const char *const valued[] = {"-m", "--model", "-p", "--prompt", "--tokens", "--logits", "--trace",
                                             "--system", "--chat-template", "--chat-format", "-n", "-c", "-t",
                                             "--top-k", "--repeat-last-n", "--temp", "--top-p", "--min-p",
                                             "--repeat-penalty", "--seed", NULL};
        bool known = false;
        for (const char *const *k = valued; *k; k++) known = known || !strcmp(a, *k);
        if (!known) return cli_fail("unknown option '%s' (see quill %s --help)", a, argv[0]);
        if (i + 1 >= argc) return cli_fail("option %s needs a value (see quill %s --help)", a, argv[0]);
        const char *v = argv[++i];
        long l;
        double d;
#define NUM(opt, lo, hi, dst)                                                                       \
    if (!strcmp(a, opt)) {                                                                          \
        if (!cli_parse_long(v, lo, hi, &l)) return cli_fail("%s: '%s' is not a whole number in %ld..%ld", opt, v, (long)(lo), (long)(hi)); \
        dst = l;                                                                                    \
        continue;                                                                                   \
    }
#define REAL(opt, lo, hi, dst)                                                                      \
    if (!strcmp(a, opt)) {                                                                          \
        if (!cli_parse_double(v, lo, hi, &d)) return cli_fail("%s: '%s' is not a number in %g..%g", opt, v, (double)(lo), (double)(hi)); \
        dst = (float)d;                                                                             \
        continue;                                                                                   \
    }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--tokens")) o->tokens = v;
        else if (!strcmp(a, "--logits")) o->logits_path = v;
        else if (!strcmp(a, "--trace")) o->trace_path = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--chat-template")) o->template_path = v;
        else if (!strcmp(a, "--chat-format")) o->format = v;
        else {
            NUM("-n", 0, 1 << 24, o->n_predict)
            NUM("-c", 1, 1 << 24, o->n_ctx)
            NUM("-t", 1, 1024, o->n_threads)
            NUM("--top-k", 0, 1 << 30, o->sp.top_k)
            NUM("--repeat-last-n", 0, 1 << 24, o->sp.repeat_last_n)
            REAL("--temp", 0, 1e6, o->sp.temperature)
            REAL("--top-p", 0, 1, o->sp.top_p)
            REAL("--min-p", 0, 1, o->sp.min_p)
            REAL("--repeat-penalty", 1e-6, 1e6, o->sp.repeat_penalty)
            if (!strcmp(a, "--seed")) {
                char *end;
                unsigned long long s = strtoull(v, &end, 10);
                if (!*v || *end || *v == '-') return cli_fail("--seed: '%s' is not a non-negative integer", v);
                o->sp.seed = s;
                continue;
            }
            return cli_fail("unknown option '%s' (see quill %s --help)", a, argv[0]);
        }
#undef NUM
#undef REAL
    }
    if (!o->model) return cli_fail("no model given: use -m MODEL.gguf (see quill %s --help)", argv[0]);
    return 0;
}

/* Builds the prompt's token ids from the options. */
static int prompt_tokens(const run_opts *o, const quill_model *m, int32_t **ids, size_t *n) {
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    quill_error err;
    if (o->tokens) {
        if (o->prompt) return cli_fail("give either -p or --tokens, not both");
        return parse_ids(o->tokens, ids, n);
    }
    if (!o->prompt) return cli_fail("no prompt given: use -p TEXT or --tokens IDS");
    if (o->chat) {
        char *override = NULL, *tmpl = NULL;
        if (o->template_path && !(override = cli_read_file(o->template_path, NULL)))
            return cli_fail("%s: cannot read the chat template: %s", o->template_path, strerror(errno));
        quill_status s = quill_chat_template_for(m, override, o->format, &tmpl, &err);
        free(override);
        if (s) return cli_fail("%s", err.message);
        quill_chat_message msgs[2];
        size_t n_msgs = 0;
        if (o->system) msgs[n_msgs++] = (quill_chat_message){"system", o->system};
        msgs[n_msgs++] = (quill_chat_message){"user", o->prompt};
        s = quill_chat_tokenize(m, tmpl, msgs, n_msgs, true, ids, n, NULL, &err);
        free(tmpl);
        if (s) return cli_fail("%s", err.message);
        return 0;
    }
    if (quill_tokenize(tok, o->prompt, strlen(o->prompt), !o->no_bos, o->special, ids, n, &err))
        return cli_fail("%s", err.message);
    return 0;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse_run_opts(argc, argv, &o, run_usage);
    if (rc) return rc < 0 ? 0 : rc;
    quill_error err;
    quill_model *m;
    double t_load = now_ms();
    if (quill_model_load(o.model, &m, &err)) return cli_fail("%s", err.message);
    t_load = now_ms() - t_load;
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    const int64_t n_vocab = quill_model_hparams(m)->n_vocab;

    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    quill_context *c = NULL;
    quill_sampler *smp = NULL;
    float *logits = NULL;
    int32_t *gen = NULL;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    quill_trace_recorder *tf = NULL;
    rc = 1;
    if (prompt_tokens(&o, m, &prompt, &n_prompt)) goto done;
    if (n_prompt == 0) {
        cli_fail("the prompt is empty after tokenization (nothing to evaluate)");
        goto done;
    }
    quill_context_params cp = {.n_ctx = (int)o.n_ctx, .n_threads = (int)o.n_threads, .reference = o.reference};
    if (quill_context_new(m, &cp, &c, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    if ((long)n_prompt > quill_context_n_ctx(c)) {
        cli_fail("the prompt has %zu tokens but the context holds %d; use a larger context (-c %zu) or a "
                 "shorter prompt",
                 n_prompt, quill_context_n_ctx(c), n_prompt);
        goto done;
    }
    if (quill_sampler_new(&o.sp, (int32_t)n_vocab, &smp, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    bool all = o.logits_path != NULL;
    logits = malloc((all ? n_prompt : 1) * (size_t)n_vocab * sizeof *logits);
    gen = malloc(((size_t)o.n_predict + 1) * sizeof *gen);
    if (!logits || !gen) {
        cli_fail("out of memory for %zu x %lld logits", all ? n_prompt : 1, (long long)n_vocab);
        goto done;
    }
    if (o.trace_path) {
        if (!(tf = quill_trace_recorder_new())) { cli_fail("out of memory"); goto done; }
        quill_context_set_trace(c, quill_trace_record, tf);
    }

    double t0 = now_ms();
    if (quill_eval(c, prompt, (int)n_prompt, logits, all, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    double t_prompt = now_ms() - t0;
    quill_context_set_trace(c, NULL, NULL);
    if (tf && quill_trace_recorder_write(tf, o.trace_path, &err)) {
        cli_fail("%s", err.message);
        goto done;
    }
    if (o.logits_path) {
        FILE *f = fopen(o.logits_path, "wb");
        size_t count = n_prompt * (size_t)n_vocab;
        bool written = f && fwrite(logits, sizeof *logits, count, f) == count;
        if (f && fclose(f) != 0) written = false;
        if (!written) {
            cli_fail("%s: cannot write the logits: %s", o.logits_path, strerror(errno));
            goto done;
        }
    }
    for (size_t i = 0; i < n_prompt; i++) quill_sampler_accept(smp, prompt[i]);

    /* Generation: sample, stream, feed back. */
    quill_detokenizer dt;
    /* The continuation follows the prompt: it is not the start of the text, so its leading
     * space is real and stays. */
    quill_detokenizer_init(&dt, tok, false, false);
    float *last = all ? logits + (n_prompt - 1) * (size_t)n_vocab : logits; /* the sampler may modify it */
    size_t n_gen = 0;
    bool context_full = false;
    double t1 = now_ms();
    char piece[512];
    while ((long)n_gen < o.n_predict) {
        int32_t next = quill_sampler_sample(smp, last);
        if (quill_tokenizer_is_eog(tok, next)) break;
        gen[n_gen++] = next;
        quill_sampler_accept(smp, next);
        size_t len = quill_detokenizer_push(&dt, next, piece, sizeof piece);
        if (o.json) {
            if (text_len + len + 1 > text_cap) {
                text_cap = (text_len + len + 1) * 2;
                char *g = realloc(text, text_cap);
                if (!g) { cli_fail("out of memory"); goto done; }
                text = g;
            }
            memcpy(text + text_len, piece, len);
            text_len += len;
        } else {
            fwrite(piece, 1, len, stdout);
            fflush(stdout);
        }
        if ((long)n_gen == o.n_predict) break;
        if (quill_context_pos(c) >= quill_context_n_ctx(c)) {
            context_full = true;
            break;
        }
        if (quill_eval(c, &next, 1, logits, false, &err)) {
            cli_fail("%s", err.message);
            goto done;
        }
        last = logits;
    }
    size_t len = quill_detokenizer_flush(&dt, piece, sizeof piece);
    double t_gen = now_ms() - t1;
    if (o.json) {
        if (text_len + len + 1 > text_cap) {
            char *g = realloc(text, text_len + len + 1);
            if (!g) { cli_fail("out of memory"); goto done; }
            text = g;
        }
        if (len) memcpy(text + text_len, piece, len);
        text_len += len;
        printf("{\"prompt_tokens\": [");
        for (size_t i = 0; i < n_prompt; i++) printf("%s%d", i ? ", " : "", prompt[i]);
        printf("], \"generated_tokens\": [");
        for (size_t i = 0; i < n_gen; i++) printf("%s%d", i ? ", " : "", gen[i]);
        printf("], \"text\": ");
        cli_json_string(stdout, text ? text : "", text_len);
        printf(", \"timings\": {\"load_ms\": %.3f, \"prompt_ms\": %.3f, \"prompt_tokens_per_s\": %.3f, "
               "\"generation_ms\": %.3f, \"generation_tokens_per_s\": %.3f}",
               t_load, t_prompt, n_prompt / (t_prompt / 1e3), t_gen, n_gen ? n_gen / (t_gen / 1e3) : 0.0);
        printf(", \"context_full\": %s}\n", context_full ? "true" : "false");
    } else {
        fwrite(piece, 1, len, stdout);
        if (n_gen) fputc('\n', stdout);
        fflush(stdout);
        if (context_full)
            fprintf(stderr, "quill: stopped: the context of %d tokens is full (use -c to enlarge it)\n",
                    quill_context_n_ctx(c));
    }
    fprintf(stderr, "prompt: %zu tokens, %.1f ms, %.2f tok/s | generation: %zu tokens, %.1f ms, %.2f tok/s\n",
            n_prompt, t_prompt, n_prompt / (t_prompt / 1e3), n_gen, t_gen, n_gen ? n_gen / (t_gen / 1e3) : 0.0);
    rc = 0;
done:
    quill_trace_recorder_free(tf);
    free(text);
    free(gen);
    free(logits);
    quill_sampler_free(smp);
    quill_context_free(c);
    free(prompt);
    quill_model_free(m);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    static const char usage[] =
        "usage: quill tokenize -m MODEL -p TEXT [--no-bos] [--special] [--json]\n"
        "works on vocabulary-only GGUF files too\n";
    const char *model = NULL, *text = NULL;
    bool no_bos = false, special = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { fputs(usage, stdout); return 0; }
        else if (!strcmp(a, "--no-bos")) no_bos = true;
        else if (!strcmp(a, "--special")) special = true;
        else if (!strcmp(a, "--json")) json = true;
        else if ((!strcmp(a, "-m") || !strcmp(a, "-p")) && i + 1 < argc) {
            if (a[1] == 'm') model = argv[++i];
            else text = argv[++i];
        } else return cli_fail("tokenize: unknown option or missing value '%s'\n%s", a, usage);
    }
    if (!model || !text) return cli_fail("tokenize: need -m MODEL and -p TEXT\n%s", usage);
    quill_gguf *g;
    quill_tokenizer *tok;
    quill_error err;
    if (quill_gguf_open(model, &g, &err)) return cli_fail("%s", err.message);
    if (quill_tokenizer_load(g, &tok, &err)) {
        quill_gguf_close(g);
        return cli_fail("%s", err.message);
    }
    int32_t *ids;
    size_t n;
    int rc = 0;
    if (quill_tokenize(tok, text, strlen(text), !no_bos, special, &ids, &n, &err)) {
        rc = cli_fail("%s", err.message);
    } else {
        if (json) {
            printf("{\"tokens\": [");
            for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
            printf("], \"pieces\": [");
            for (size_t i = 0; i < n; i++) {
                const char *p = quill_tokenizer_piece(tok, ids[i]);
                if (i) printf(", ");
                cli_json_string(stdout, p, strlen(p));
            }
            printf("]}\n");
        } else {
            for (size_t i = 0; i < n; i++) {
                const char *p = quill_tokenizer_piece(tok, ids[i]);
                printf("%6d  ", ids[i]);
                cli_json_string(stdout, p, strlen(p));
                putchar('\n');
            }
        }
        free(ids);
    }
    quill_tokenizer_free(tok);
    quill_gguf_close(g);
    return rc;
}
