/* The option table and parser shared by run, chat and tokenize (see options.h). */
#include "options.h"
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum opt_id {
    O_HELP, O_MODEL, O_PROMPT, O_FILE, O_TOKENS, O_N_PREDICT, O_CTX, O_THREADS, O_TEMP, O_TOP_K, O_TOP_P,
    O_MIN_P, O_REPEAT_PENALTY, O_REPEAT_LAST_N, O_SEED, O_STOP, O_NO_BOS, O_SPECIAL, O_REFERENCE, O_JSON,
    O_CHAT, O_SYSTEM, O_TEMPLATE, O_FORMAT, O_LOGITS, O_TRACE, O_VERBOSE, O_NO_DISPLAY_PROMPT, O_NGL,
    O_MLOCK, O_NO_MMAP, O_HIDE_REASONING, O_GRAMMAR, O_GRAMMAR_FILE, O_JSON_SCHEMA, O_JSON_SCHEMA_FILE,
    O_CACHE_TYPE_K, O_CACHE_TYPE_V, O_MODEL_DRAFT, O_DRAFT_MAX, O_DRAFT_MIN, O_DRAFT_P_MIN, O_LOOKUP, O_BACKEND, O_DEVICE,
};

#define GEN (CLI_RUN | CLI_CHAT)
#define ALL (CLI_RUN | CLI_CHAT | CLI_TOKENIZE)

typedef struct {
    enum opt_id id;
    const char *short_name, *long_name, *value, *alias;
    unsigned commands;
    const char *help;
} option;

static const option options[] = {
    {O_MODEL, "-m", "--model", "FILE", NULL, ALL, "the GGUF model"},
    {O_PROMPT, "-p", "--prompt", "TEXT", NULL, CLI_RUN | CLI_TOKENIZE, "the prompt ('-' reads it from stdin)"},
    {O_FILE, "-f", "--file", "FILE", NULL, CLI_RUN | CLI_TOKENIZE, "read the prompt from a file"},
    {O_TOKENS, NULL, "--tokens", "ID,ID", NULL, CLI_RUN, "evaluate exactly these ids (no tokenizer, no BOS)"},
    {O_N_PREDICT, "-n", "--n-predict", "N", NULL, GEN,
     "tokens to generate (run: default 128, 0 = only evaluate the prompt; chat: per reply, default 512)"},
    {O_CTX, "-c", "--ctx-size", "N", NULL, GEN, "context length (default: the model's, at most 4096)"},
    {O_THREADS, "-t", "--threads", "N", NULL, GEN, "threads (default: all online CPUs)"},
    {O_CACHE_TYPE_K, "-ctk", "--cache-type-k", "TYPE", NULL, GEN,
     "KV cache type for keys: f32 (default, exact), f16, bf16, q8_0, q4_0"},
    {O_CACHE_TYPE_V, "-ctv", "--cache-type-v", "TYPE", NULL, GEN, "KV cache type for values (the same types)"},
    {O_TEMP, NULL, "--temp", "T", "--temperature", GEN, "temperature (default 0.8; 0 = greedy)"},
    {O_TOP_K, NULL, "--top-k", "K", NULL, GEN, "keep the K best tokens (default 40; 0 = off)"},
    {O_TOP_P, NULL, "--top-p", "P", NULL, GEN, "nucleus sampling, in (0, 1] (default 0.95; 1 = off)"},
    {O_MIN_P, NULL, "--min-p", "P", NULL, GEN, "drop tokens below P x the best one's probability (default 0.05)"},
    {O_REPEAT_PENALTY, NULL, "--repeat-penalty", "R", NULL, GEN, "repetition penalty (default 1 = off)"},
    {O_REPEAT_LAST_N, NULL, "--repeat-last-n", "N", NULL, GEN, "tokens the penalty looks back at (default 64)"},
    {O_SEED, "-s", "--seed", "S", NULL, GEN, "random seed (default and -1: random, shown with --verbose/--json)"},
    {O_STOP, "-r", "--reverse-prompt", "TEXT", "--stop", GEN,
     "stop when the text contains TEXT (not printed; may be repeated)"},
    {O_GRAMMAR, NULL, "--grammar", "GBNF", NULL, GEN, "constrain the output to a GBNF grammar (llama.cpp's format)"},
    {O_GRAMMAR_FILE, NULL, "--grammar-file", "FILE", NULL, GEN, "the same, from a .gbnf file"},
    {O_JSON_SCHEMA, "-j", "--json-schema", "SCHEMA", NULL, GEN, "constrain the output to JSON matching a JSON Schema"},
    {O_JSON_SCHEMA_FILE, "-jf", "--json-schema-file", "FILE", NULL, GEN, "the same, from a file"},
    {O_MODEL_DRAFT, "-md", "--model-draft", "FILE", NULL, GEN,
     "speculative decoding with this draft model (same vocabulary; the output does not change)"},
    {O_LOOKUP, NULL, "--lookup", NULL, NULL, GEN,
     "speculative decoding by n-gram lookup in the prompt and text so far (no model; the output does not change)"},
    {O_DRAFT_MAX, NULL, "--draft-max", "N", "--spec-draft-n-max", GEN, "tokens drafted at most per step (default 16)"},
    {O_DRAFT_MIN, NULL, "--draft-min", "N", "--spec-draft-n-min", GEN, "shorter drafts are not used (default 0)"},
    {O_DRAFT_P_MIN, NULL, "--draft-p-min", "P", "--spec-draft-p-min", GEN,
     "the draft model stops at a token it gives less probability (default 0 = off)"},
    {O_NO_BOS, NULL, "--no-bos", NULL, NULL, CLI_RUN | CLI_TOKENIZE, "do not add the BOS token"},
    {O_SPECIAL, NULL, "--special", NULL, NULL, CLI_RUN | CLI_TOKENIZE,
     "parse special-token text such as </s> in the prompt"},
    {O_CHAT, NULL, "--chat", NULL, NULL, CLI_RUN, "send the prompt as one user turn through the chat template"},
    {O_SYSTEM, NULL, "--system", "TEXT", NULL, GEN, "system message (run: with --chat)"},
    {O_TEMPLATE, NULL, "--chat-template", "FILE", NULL, GEN, "use this Jinja template instead of the model's"},
    {O_FORMAT, NULL, "--chat-format", "NAME", NULL, GEN, "built-in template for a model without one (chatml, llama2, ...)"},
    {O_NO_DISPLAY_PROMPT, NULL, "--no-display-prompt", NULL, NULL, CLI_RUN, "print only the continuation"},
    {O_REFERENCE, NULL, "--reference", NULL, NULL, CLI_RUN, "float64 reference forward pass (slow; for verification)"},
    {O_JSON, NULL, "--json", NULL, NULL, CLI_RUN | CLI_TOKENIZE, "print one JSON object instead of text"},
    {O_LOGITS, NULL, "--logits", "FILE", NULL, CLI_RUN, "write float32 logits of every prompt position"},
    {O_TRACE, NULL, "--trace", "FILE.gguf", NULL, CLI_RUN, "write the intermediate tensors of the prompt pass"},
    {O_VERBOSE, "-v", "--verbose", NULL, NULL, GEN, "say more: seed, kernels, per-turn evaluation counts"},
    {O_HIDE_REASONING, NULL, "--hide-reasoning", NULL, NULL, CLI_CHAT | CLI_RUN,
     "do not show a reply's reasoning (<think>, gpt-oss's analysis channel); shown dimmed otherwise"},
    {O_BACKEND, NULL, "--backend", "NAME", NULL, GEN,
     "cpu (default) or vulkan: -ngl layers on a GPU (docs/gpu.md; quill devices)"},
    {O_NGL, "-ngl", "--n-gpu-layers", "N", "--gpu-layers", GEN,
     "with --backend vulkan: the last N layers on the GPU (dense llama-like layers whole, their KV cache "
     "there; others their weight products), N > layers: the output too (default all)"},
    {O_DEVICE, NULL, "--device", "N", NULL, GEN, "with --backend vulkan: the device (quill devices; default 0)"},
    {O_MLOCK, NULL, "--mlock", NULL, NULL, GEN, "accepted for llama-cli habits (the mapping is used as is)"},
    {O_NO_MMAP, NULL, "--no-mmap", NULL, NULL, GEN, "accepted for llama-cli habits (the file is always mapped)"},
    {O_HELP, "-h", "--help", NULL, NULL, ALL, "this help"},
};

static const char *command_name(unsigned command) {
    return command == CLI_RUN ? "run" : command == CLI_CHAT ? "chat" : "tokenize";
}

void cli_opts_usage(unsigned command, FILE *f) {
    if (command == CLI_RUN)
        fputs("usage: quill run -m MODEL (-p PROMPT | -f FILE | --tokens ID,ID,...) [options]\n"
              "The prompt is printed, then its continuation.\n", f);
    else if (command == CLI_CHAT)
        fputs("usage: quill chat -m MODEL [options]\n"
              "In the chat: /help, /reset, /system TEXT, /raw, /tokens, /bye; \"\"\" opens a multi-line message;\n"
              "Ctrl-C stops a reply or clears the line, twice (or Ctrl-D) exits.\n", f);
    else
        fputs("usage: quill tokenize -m MODEL (-p TEXT | -f FILE) [options]\n", f);
    fputs("options:\n", f);
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        const option *o = &options[i];
        if (!(o->commands & command)) continue;
        char names[96];
        snprintf(names, sizeof names, "%s%s%s%s%s%s", o->short_name ? o->short_name : "", o->short_name ? ", " : "",
                 o->long_name, o->alias ? ", " : "", o->alias ? o->alias : "", "");
        char left[128];
        snprintf(left, sizeof left, "%s%s%s", names, o->value ? " " : "", o->value ? o->value : "");
        fprintf(f, "  %-34s %s\n", left, o->help);
    }
}

/* The option an argument names, accepting "--name=value" for long names. */
static const option *find_option(const char *arg, const char **inline_value) {
    *inline_value = NULL;
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        const option *o = &options[i];
        const char *names[3] = {o->short_name, o->long_name, o->alias};
        for (int k = 0; k < 3; k++) {
            const char *n = names[k];
            if (!n) continue;
            size_t len = strlen(n);
            if (!strncmp(arg, n, len)) {
                if (!arg[len]) return o;
                if (arg[len] == '=' && n[1] == '-' && o->value) {
                    *inline_value = arg + len + 1;
                    return o;
                }
            }
        }
    }
    return NULL;
}

int cli_parse_token_list(const char *s, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16, count = 0;
    int32_t *list = malloc(cap * sizeof *list);
    if (!list) return cli_fail("out of memory");
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = (*p >= '0' && *p <= '9') ? strtol(p, &end, 10) : -1;
        if (v < 0 || errno || v > INT32_MAX || (*end && *end != ',') || (*end == ',' && !end[1])) {
            free(list);
            return cli_fail("--tokens: '%s' is not a comma-separated list of token ids (whole numbers >= 0, "
                            "e.g. 1,403,407)", s);
        }
        if (count == cap) {
            int32_t *grown = realloc(list, (cap *= 2) * sizeof *list);
            if (!grown) {
                free(list);
                return cli_fail("out of memory");
            }
            list = grown;
        }
        list[count++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (count == 0) {
        free(list);
        return cli_fail("--tokens: no token ids given (e.g. --tokens 1,403,407)");
    }
    *ids = list;
    *n = count;
    return 0;
}

static int parse_count(const char *opt, const char *v, long lo, long hi, const char *note, long *dst) {
    long l;
    if (!cli_parse_long(v, lo, hi, &l))
        return cli_fail("%s: '%s' is not a whole number in %ld..%ld%s", opt, v, lo, hi, note);
    *dst = l;
    return 0;
}

/* As llama-cli does for -f: the newline that ends a file or an echo is not part of the prompt. */
static void drop_final_newline(char *s) {
    size_t n = strlen(s);
    if (n && s[n - 1] == '\n') s[--n] = 0;
    if (n && s[n - 1] == '\r') s[--n] = 0;
}

static int parse_options(int argc, char **argv, unsigned command, cli_opts *o, FILE *diag);

/* A failure frees whatever the parse had already allocated (the prompt read before a grammar that
 * does not compile, say): the caller frees the options only after a success. */
int cli_opts_parse(int argc, char **argv, unsigned command, cli_opts *o, FILE *diag) {
    const int rc = parse_options(argc, argv, command, o, diag);
    if (rc) cli_opts_free(o);
    return rc;
}

static int parse_options(int argc, char **argv, unsigned command, cli_opts *o, FILE *diag) {
    memset(o, 0, sizeof *o);
    o->command = command;
    o->n_predict = command == CLI_CHAT ? 512 : 128;
    o->sp = quill_sampler_defaults();
    const char *cmd = command_name(command);
    quill_error err;
    long ngl = -1;
    bool seed_random = true;
    const char *grammar_value = NULL;
    enum opt_id grammar_kind = O_HELP;
    const char *draft_option = NULL;    /* a draft setting given, for the check that speculation is on */
    o->draft_max = quill_draft_defaults().n_max;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        const option *opt = find_option(a, &v);
        if (!opt || !(opt->commands & command)) {
            if (opt) return cli_fail("%s: option %s does not apply to quill %s (see quill %s --help)", cmd, a, cmd, cmd);
            return cli_fail("%s: unknown option '%s' (see quill %s --help)", cmd, a, cmd);
        }
        if (opt->id == O_HELP) {
            cli_opts_usage(command, stdout);
            return -1;
        }
        if (opt->value && !v) {
            if (i + 1 >= argc)
                return cli_fail("%s: option %s needs a value %s (see quill %s --help)", cmd, a, opt->value, cmd);
            v = argv[++i];
        } else if (!opt->value && v) {
            return cli_fail("%s: option %s takes no value", cmd, opt->long_name);
        }
        const char *name = opt->long_name;
        switch (opt->id) {
        case O_MODEL: o->model = v; break;
        case O_PROMPT: o->prompt_arg = v; break;
        case O_FILE: o->prompt_file = v; break;
        case O_TOKENS: o->tokens = v; break;
        case O_LOGITS: o->logits_path = v; break;
        case O_TRACE: o->trace_path = v; break;
        case O_SYSTEM: o->system = v; break;
        case O_TEMPLATE: o->template_path = v; break;
        case O_FORMAT: o->format = v; break;
        case O_N_PREDICT:
            if (command == CLI_CHAT) {
                if (parse_count(name, v, -1, 1 << 24, " (-1 = until the context is full)", &o->n_predict)) return 1;
                if (o->n_predict == 0) return cli_fail("%s: a reply of 0 tokens would say nothing; use 1..%d or -1", name, 1 << 24);
            } else if (parse_count(name, v, -1, 1 << 24, " (0 = only evaluate the prompt; -1 = until the context is full)",
                                   &o->n_predict)) {
                return 1;
            }
            break;
        case O_CTX:
            if (parse_count(name, v, 0, 1 << 24, " (0 = the model's)", &o->n_ctx)) return 1;
            break;
        case O_THREADS:
            if (parse_count(name, v, 1, 1024, "", &o->n_threads)) return 1;
            break;
        case O_CACHE_TYPE_K:
            if (!cli_parse_cache_type(cmd, name, v, &o->type_k)) return 1;
            break;
        case O_CACHE_TYPE_V:
            if (!cli_parse_cache_type(cmd, name, v, &o->type_v)) return 1;
            break;
        case O_NGL:
            if (parse_count(name, v, -1, 1 << 20, "", &ngl)) return 1;
            break;
        case O_BACKEND:
            if (!strcmp(v, "cpu")) o->backend = QUILL_BACKEND_CPU;
            else if (!strcmp(v, "vulkan")) o->backend = QUILL_BACKEND_VULKAN;
            else return cli_fail("%s: --backend %s: the backends are cpu and vulkan", cmd, v);
            break;
        case O_DEVICE:
            if (parse_count(name, v, 0, 64, "", &o->device)) return 1;
            break;
        case O_TEMP: case O_TOP_K: case O_TOP_P: case O_MIN_P: case O_REPEAT_PENALTY: case O_REPEAT_LAST_N:
        case O_SEED:
            if (quill_sampler_params_set(&o->sp, name, v, &err)) return cli_fail("%s", err.message);
            if (opt->id == O_SEED) {
                o->seed_given = true;
                seed_random = !strcmp(v, "-1");
            }
            break;
        case O_STOP:
            if (!*v) return cli_fail("%s: the stop string is empty", name);
            if (o->n_stop == CLI_MAX_STOP) return cli_fail("%s: at most %d stop strings", name, CLI_MAX_STOP);
            o->stop[o->n_stop++] = v;
            break;
        case O_NO_BOS: o->no_bos = true; break;
        case O_SPECIAL: o->special = true; break;
        case O_REFERENCE: o->reference = true; break;
        case O_JSON: o->json = true; break;
        case O_CHAT: o->chat = true; break;
        case O_VERBOSE: o->verbose = true; break;
        case O_HIDE_REASONING: o->hide_reasoning = true; break;
        case O_NO_DISPLAY_PROMPT: o->no_display_prompt = true; break;
        case O_GRAMMAR: case O_GRAMMAR_FILE: case O_JSON_SCHEMA: case O_JSON_SCHEMA_FILE:
            if (grammar_value)
                return cli_fail("%s: give one of --grammar, --grammar-file, --json-schema and --json-schema-file",
                                cmd);
            grammar_value = v;
            grammar_kind = opt->id;
            o->grammar_from = name;
            break;
        case O_MODEL_DRAFT: o->model_draft = v; break;
        case O_LOOKUP: o->lookup = true; break;
        case O_DRAFT_MAX:
            if (parse_count(name, v, 1, QUILL_DRAFT_MAX, "", &o->draft_max)) return 1;
            draft_option = name;
            break;
        case O_DRAFT_MIN:
            if (parse_count(name, v, 0, QUILL_DRAFT_MAX, "", &o->draft_min)) return 1;
            draft_option = name;
            break;
        case O_DRAFT_P_MIN:
            if (!cli_parse_double(v, 0, 1, &o->draft_p_min))
                return cli_fail("%s: '%s' is not a probability in [0, 1] (0 = off)", name, v);
            draft_option = name;
            break;
        case O_MLOCK: case O_NO_MMAP: case O_HELP: break;
        }
    }
    if (seed_random) o->sp.seed = quill_random_seed();
    if (!o->model) return cli_fail("%s: no model given: use -m MODEL.gguf (see quill %s --help)", cmd, cmd);
    if (command == CLI_RUN && !o->chat) {
        const char *stray = o->system ? "--system" : o->template_path ? "--chat-template" : o->format ? "--chat-format" : NULL;
        if (stray) return cli_fail("run: %s applies only with --chat (the prompt is sent as plain text otherwise)", stray);
    }
    if (o->model_draft && o->lookup)
        return cli_fail("%s: give one of -md/--model-draft and --lookup (two ways of drafting)", cmd);
    if (draft_option && !o->model_draft && !o->lookup)
        return cli_fail("%s: %s applies to speculative decoding: add -md DRAFT.gguf or --lookup", cmd, draft_option);
    if (o->draft_min > o->draft_max)
        return cli_fail("%s: --draft-min %ld is more than --draft-max %ld", cmd, o->draft_min, o->draft_max);
    if (o->lookup && o->draft_p_min > 0)
        return cli_fail("%s: --draft-p-min applies to a draft model (-md), not to --lookup", cmd);
    int sources = (o->prompt_arg != NULL) + (o->prompt_file != NULL) + (o->tokens != NULL);
    if (sources > 1) return cli_fail("%s: give one of -p, -f and --tokens, not several", cmd);
    if (command != CLI_CHAT && sources == 0)
        return cli_fail("%s: no prompt given: use -p TEXT, -p - (stdin), -f FILE%s", cmd,
                        command == CLI_RUN ? " or --tokens IDS" : "");
    if (o->tokens && o->chat) return cli_fail("run: --tokens cannot be combined with --chat");
    if (o->prompt_arg && !strcmp(o->prompt_arg, "-")) {
        if (!(o->prompt = cli_read_stream(stdin, NULL))) return cli_fail("%s: cannot read the prompt from stdin", cmd);
    } else if (o->prompt_file) {
        if (!(o->prompt = cli_read_file(o->prompt_file, NULL)))
            return cli_fail("%s: cannot read the prompt: %s", o->prompt_file, strerror(errno));
    } else if (o->prompt_arg && !(o->prompt = strdup(o->prompt_arg))) {
        return cli_fail("out of memory");
    }
    if (o->prompt && (!o->prompt_arg || !strcmp(o->prompt_arg, "-"))) drop_final_newline(o->prompt);
    if (grammar_value) {
        /* the text now; a GBNF grammar is parsed once the vocabulary is loaded (<|token|> needs it) */
        bool from_file = grammar_kind == O_GRAMMAR_FILE || grammar_kind == O_JSON_SCHEMA_FILE;
        char *text = from_file ? cli_read_file(grammar_value, NULL) : strdup(grammar_value);
        if (!text)
            return from_file ? cli_fail("%s %s: cannot read it: %s", o->grammar_from, grammar_value, strerror(errno))
                             : cli_fail("out of memory");
        if (grammar_kind == O_JSON_SCHEMA || grammar_kind == O_JSON_SCHEMA_FILE) {
            quill_status st = quill_json_schema_to_grammar(text, strlen(text), &o->grammar, &err);
            free(text);
            if (st) return cli_fail("%s: %s", o->grammar_from, err.message);
        } else {
            o->grammar = text;
        }
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (diag && o->n_threads > 0 && cpus > 0 && o->n_threads > cpus)
        fprintf(diag, "quill: warning: -t %ld is more threads than the %ld online CPUs; the extra threads "
                      "share cores and usually slow generation down\n", o->n_threads, cpus);
    o->n_gpu_layers = ngl;
    if (diag && ngl > 0 && o->backend == QUILL_BACKEND_CPU)
        fprintf(diag, "quill: note: -ngl %ld ignored: quill runs on the CPU (--backend vulkan runs layers on a GPU)\n", ngl);
    return 0;
}

void cli_opts_free(cli_opts *o) {
    free(o->prompt);
    o->prompt = NULL;
    free(o->grammar);
    o->grammar = NULL;
}

int cli_drafter_new(const cli_opts *o, const quill_model *target, const quill_context *c, quill_model **draft_model,
                    quill_drafter **out) {
    *out = NULL;
    *draft_model = NULL;
    if (!o->model_draft && !o->lookup) return 0;
    quill_draft_params dp = quill_draft_defaults();
    dp.n_max = (int)o->draft_max;
    dp.n_min = (int)o->draft_min;
    dp.p_min = (float)o->draft_p_min;
    dp.n_ctx = quill_context_n_ctx(c);
    dp.n_threads = (int)o->n_threads;
    quill_error err;
    if (o->lookup) return quill_drafter_new_lookup(&dp, out, &err) ? cli_fail("--lookup: %s", err.message) : 0;
    if (quill_model_load(o->model_draft, draft_model, &err)) return cli_fail("-md: %s", err.message);
    if (quill_drafter_new_model(*draft_model, target, &dp, out, &err)) {
        quill_model_free(*draft_model);
        *draft_model = NULL;
        return cli_fail("-md %s: %s", o->model_draft, err.message);
    }
    return 0;
}

void cli_draft_summary(char *buf, size_t cap, const quill_generate_result *r, bool speculative) {
    if (!speculative) {
        if (cap) buf[0] = 0;
        return;
    }
    snprintf(buf, cap, " | draft: %d drafted, %d accepted (%.1f %%)", r->n_drafted, r->n_accepted,
             r->n_drafted ? 100.0 * r->n_accepted / r->n_drafted : 0.0);
}
